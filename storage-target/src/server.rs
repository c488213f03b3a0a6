//! The accept loop: serves HTTP/1.1 connections with [`Handler`] under
//! the connection caps ([`crate::http::caps`]) and the connection's
//! deadlines ([`crate::http::deadline`]), until shutdown, then lets
//! in-flight requests finish (graceful shutdown).

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::config::connections::ConnectionsConfig;
use crate::http::deadline::{HEADER_READ_TIMEOUT, WriteDeadline};
use crate::http::{Conns, Handler};

/// Why a connection stops before its client ends it.
enum Stop {
    /// Closed to make room (`max_connections`).
    Close,
    /// The server shuts down.
    Shutdown,
}

/// Aborts the task when dropped (the connection's watcher ends with it).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Serves HTTP/1.1 (keep-alive) on `listener` until `shutdown` is cancelled,
/// then lets in-flight requests finish (up to `grace`). At most
/// `max_connections` (at least 1) connections are open, shared as `shares`
/// says: at the cap (or the new connection's address at its share, or
/// clients at the slots not reserved for agents), the evictable connection
/// idle longest (no request in progress, or one that trickles) is closed
/// to make room, or, when none is evictable, the new connection is closed
/// at once.
pub async fn serve(
    listener: TcpListener,
    handler: Handler,
    shutdown: CancellationToken,
    grace: Duration,
    max_connections: usize,
    shares: ConnectionsConfig,
) {
    let tracker = TaskTracker::new();
    let conns = Conns::new(max_connections, &shares);
    conns.spawn_sampler(&shares, shutdown.clone());
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let ip = peer.ip();
        let agent = shares.is_agent(ip);
        let (open, share) = match conns.admit(ip, agent, handler.metrics()).await {
            Ok(x) => x,
            Err(why) => {
                handler.metrics().connection_refused();
                debug!(%peer, max = conns.max(), why, "closing a new connection at once");
                drop(stream);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let conn = Arc::clone(share.conn());
        let handler = handler.for_connection(share);
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            let _open = open;
            let conn_io = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(
                    TokioIo::new(WriteDeadline::new(stream, Arc::clone(&conn))),
                    handler,
                );
            tokio::pin!(conn_io);
            // The two cancellations are awaited by a task of their own:
            // polled beside the connection, each wake-up of the connection
            // (several per request) would poll both, each poll a lock of
            // the token's tree; a join handle's poll is an atomic load.
            let closed = conn.closed().clone();
            let stop = shutdown.clone();
            let mut watch = AbortOnDrop(tokio::spawn(async move {
                tokio::select! {
                    () = closed.cancelled() => Stop::Close,
                    () = stop.cancelled() => Stop::Shutdown,
                }
            }));
            let res = tokio::select! {
                r = conn_io.as_mut() => r,
                why = &mut watch.0 => match why {
                    Ok(Stop::Close) => {
                        debug!(%peer, "closing a connection to make room (max_connections)");
                        return;
                    }
                    // Shutdown (or the watcher gone, which only a runtime
                    // shutting down does).
                    _ => {
                        conn_io.as_mut().graceful_shutdown();
                        conn_io.await
                    }
                },
            };
            if let Err(e) = res {
                debug!(%peer, error = %e, "connection ended with error");
            }
        });
    }
    tracker.close();
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        warn!("in-flight requests did not finish within the grace period");
    }
}
