//! The TCP listener both backends' endpoints stand on (the tcp responder's
//! data connections, the verbs endpoint's out-of-band exchange): accepts
//! connections, serves each in its own task, and on shutdown stops
//! accepting and ends every connection.
//!
//! Connections are capped in all and per peer IP address: one past either
//! cap is closed as soon as it is accepted, before anything is read or
//! allocated for it, so no peer can take all of the process's descriptors.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// How many connections a listener holds at most.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caps {
    /// In all.
    pub(crate) total: usize,
    /// From one peer IP address.
    pub(crate) per_ip: usize,
}

/// Connections held, in all and per peer IP.
#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

/// One held connection's place in the [`Counts`]; given back on drop.
struct Held {
    counts: Arc<Mutex<Counts>>,
    ip: IpAddr,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.per_ip.remove(&self.ip);
            }
        }
    }
}

/// Takes a place for a connection from `ip`, or says which cap is full.
fn admit(
    counts: &Arc<Mutex<Counts>>,
    caps: Caps,
    ip: IpAddr,
) -> std::result::Result<Held, &'static str> {
    let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
    if c.total >= caps.total {
        return Err("the endpoint's connection cap");
    }
    let n = c.per_ip.entry(ip).or_insert(0);
    if *n >= caps.per_ip {
        if *n == 0 {
            c.per_ip.remove(&ip);
        }
        return Err("the per-address connection cap");
    }
    *n += 1;
    c.total += 1;
    Ok(Held {
        counts: Arc::clone(counts),
        ip,
    })
}

/// A peer's address for the per-address cap (IPv4-mapped IPv6 as IPv4).
fn peer_ip(peer: SocketAddr) -> IpAddr {
    match peer.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

impl Listener {
    /// Binds `bind` and serves every accepted connection, up to `caps`,
    /// with the server `make` returns for the bound address. `what` names
    /// the endpoint in errors and logs.
    pub(crate) async fn bind<M, S, F>(
        bind: SocketAddr,
        what: &'static str,
        caps: Caps,
        make: M,
    ) -> Result<Listener>
    where
        M: FnOnce(SocketAddr) -> S,
        S: Fn(TcpStream, SocketAddr) -> F + Send + Sync + 'static,
        F: Future<Output = Result<()>> + Send + 'static,
    {
        if caps.total == 0 || caps.per_ip == 0 {
            return Err(FabricError::InvalidArgument(format!(
                "the {what}'s connection caps must be at least 1 (max_connections {}, per address {})",
                caps.total, caps.per_ip
            )));
        }
        let listener = TcpListener::bind(bind)
            .await
            .map_err(|e| FabricError::io(format!("bind {what} on {bind}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| FabricError::io(format!("local address of the {what}"), e))?;
        let serve = make(local);
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, what, caps, serve, stop_rx));
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
    caps: Caps,
    serve: S,
    mut stop: watch::Receiver<bool>,
) where
    S: Fn(TcpStream, SocketAddr) -> F,
    F: Future<Output = Result<()>> + Send + 'static,
{
    let mut conns = JoinSet::new();
    let counts = Arc::new(Mutex::new(Counts::default()));
    let mut last_warned: Option<Instant> = None;
    let mut refused = 0u64;
    loop {
        tokio::select! {
            _ = io::cancelled(&mut stop) => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    let held = match admit(&counts, caps, peer_ip(peer)) {
                        Ok(h) => h,
                        Err(cap) => {
                            // Closed at once: nothing read, nothing allocated.
                            drop(stream);
                            refused += 1;
                            if last_warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                                warn!(%peer, endpoint = what, cap, max_connections = caps.total, max_connections_per_address = caps.per_ip, refused, "connection refused: at a connection cap");
                                last_warned = Some(Instant::now());
                                refused = 0;
                            }
                            continue;
                        }
                    };
                    let conn = serve(stream, peer);
                    conns.spawn(async move {
                        let _held = held;
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
