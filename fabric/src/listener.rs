//! The TCP listener both backends' endpoints stand on (the tcp responder's
//! data connections, the verbs endpoint's out-of-band exchange): accepts
//! connections, serves each in its own task, and on shutdown stops
//! accepting and ends every connection.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, warn};

use crate::error::{FabricError, Result};
use crate::sock as io;

/// A listening socket and its accept loop.
pub(crate) struct Listener {
    local: SocketAddr,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("local", &self.local)
            .finish()
    }
}

impl Listener {
    /// Binds `bind` and serves every accepted connection with `serve`.
    /// `what` names the endpoint in errors and logs.
    pub(crate) async fn bind<S, F>(
        bind: SocketAddr,
        what: &'static str,
        serve: S,
    ) -> Result<Listener>
    where
        S: Fn(TcpStream, SocketAddr) -> F + Send + Sync + 'static,
        F: Future<Output = Result<()>> + Send + 'static,
    {
        let listener = TcpListener::bind(bind)
            .await
            .map_err(|e| FabricError::io(format!("bind {what} on {bind}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| FabricError::io(format!("local address of the {what}"), e))?;
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, what, serve, stop_rx));
        Ok(Listener {
            local,
            stop,
            task: Some(task),
        })
    }

    /// The bound address.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Stops accepting and drops every connection at once (outstanding
    /// operations of their sessions fail), then waits for the tasks to end.
    pub(crate) async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

async fn accept_loop<S, F>(
    listener: TcpListener,
    what: &'static str,
    serve: S,
    mut stop: watch::Receiver<bool>,
) where
    S: Fn(TcpStream, SocketAddr) -> F,
    F: Future<Output = Result<()>> + Send + 'static,
{
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = io::cancelled(&mut stop) => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    let conn = serve(stream, peer);
                    conns.spawn(async move {
                        if let Err(e) = conn.await {
                            debug!(%peer, error = %e, endpoint = what, "connection closed");
                        }
                    });
                }
                Err(e) => {
                    // E.g. EMFILE: back off instead of spinning.
                    warn!(error = %e, endpoint = what, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}
