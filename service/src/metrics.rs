//! The one `/metrics` server every service runs.
//!
//! Prometheus text is served at `GET /metrics` on any of:
//! - a TCP address (`metrics.address`; the services default to loopback),
//! - a Unix socket (`metrics.unix_socket`) created mode 0600, on which only
//!   a peer running as the service's own user or as root is served (checked
//!   with `SO_PEERCRED` at accept, so the moment between bind and chmod
//!   lets nobody in),
//!
//! and, with `metrics.bearer_token_file`, only to requests carrying
//! `Authorization: Bearer <token>` (compared in constant time; anything else
//! gets 401 and no metric). Metric labels name tenants and their traffic,
//! which other local users should not read: the Unix socket or the token
//! keep them to the operator.
//!
//! Each listener serves at most [`MAX_CONNECTIONS`] connections at a time;
//! beyond that a new connection is closed at accept (each service counts
//! them in its file-descriptor budget, [`crate::fds`]). A connection that
//! sends no complete request head within [`REQUEST_HEAD_TIMEOUT`] (a new
//! one, or a kept-alive one between scrapes) is closed, so that silent
//! connections hold no slot for long.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use s3dma_config::Secret;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

/// Most connections open at a time on each metrics listener (TCP, Unix
/// socket): scrapers need one or two.
pub const MAX_CONNECTIONS: usize = 32;

/// How long a connection may go without sending a complete request head
/// (from accept, or from the end of its last reply) before it is closed.
/// A scrape's request is one small write: a few seconds are plenty.
pub const REQUEST_HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Renders the service's metrics in Prometheus text format.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Where and how to serve `/metrics`.
#[derive(Debug, Default)]
pub struct MetricsOptions {
    /// TCP listen address (port 0 picks a free port).
    pub address: Option<SocketAddr>,
    /// Unix socket path (mode 0600; a stale socket file is replaced).
    pub unix_socket: Option<PathBuf>,
    /// When set, every scrape must carry `Authorization: Bearer <token>`.
    pub bearer_token: Option<Secret>,
}

/// Why the metrics server could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The TCP address could not be bound.
    #[error("metrics.address {addr}: cannot listen: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The Unix socket could not be made.
    #[error("metrics.unix_socket {}: {what}: {source}", path.display())]
    UnixSocket {
        /// The path.
        path: PathBuf,
        /// Which step failed.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Something other than a socket is at the Unix socket's path.
    #[error("metrics.unix_socket {}: exists and is not a socket; refusing to replace it", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
}

/// A running metrics server; dropping it stops serving (and removes the Unix
/// socket file).
#[derive(Debug)]
pub struct MetricsServer {
    /// The bound TCP address, if any.
    pub address: Option<SocketAddr>,
    /// The Unix socket, if any.
    pub unix_socket: Option<PathBuf>,
    tasks: Vec<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds what `opts` names and serves `render` there. With neither an
    /// address nor a socket, nothing is served (and nothing fails).
    ///
    /// # Errors
    /// [`MetricsError`]: a bind failed or the socket path is taken.
    pub async fn start(
        opts: MetricsOptions,
        render: Render,
    ) -> Result<MetricsServer, MetricsError> {
        let token = opts.bearer_token.map(Arc::new);
        let mut tasks = Vec::new();
        let mut address = None;
        if let Some(addr) = opts.address {
            let l = TcpListener::bind(addr)
                .await
                .map_err(|source| MetricsError::Bind { addr, source })?;
            address = Some(
                l.local_addr()
                    .map_err(|source| MetricsError::Bind { addr, source })?,
            );
            let (render, token) = (Arc::clone(&render), token.clone());
            let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
            tasks.push(tokio::spawn(async move {
                loop {
                    match l.accept().await {
                        Ok((s, _)) => {
                            let Some(slot) = slot(&slots) else { continue };
                            let _ = s.set_nodelay(true);
                            spawn_conn(s, Arc::clone(&render), token.clone(), slot);
                        }
                        Err(e) => backoff(&e).await,
                    }
                }
            }));
        }
        let mut unix_socket = None;
        if let Some(path) = opts.unix_socket {
            let l = bind_unix(&path)?;
            let me = nix::unistd::geteuid().as_raw();
            let (render, token) = (Arc::clone(&render), token.clone());
            let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
            tasks.push(tokio::spawn(async move {
                loop {
                    match l.accept().await {
                        Ok((s, _)) => {
                            let Some(slot) = slot(&slots) else { continue };
                            let uid = nix::sys::socket::getsockopt(
                                &s.as_fd(),
                                nix::sys::socket::sockopt::PeerCredentials,
                            )
                            .map(|c| c.uid());
                            match uid {
                                Ok(uid) if uid == me || uid == 0 => {
                                    spawn_conn(s, Arc::clone(&render), token.clone(), slot);
                                }
                                Ok(uid) => tracing::debug!(uid, "metrics socket: peer refused"),
                                Err(e) => tracing::debug!(error = %e, "metrics socket: no peer credentials"),
                            }
                        }
                        Err(e) => backoff(&e).await,
                    }
                }
            }));
            unix_socket = Some(path);
        }
        Ok(MetricsServer {
            address,
            unix_socket,
            tasks,
        })
    }

    /// Where it serves, for the "listening on" line.
    #[must_use]
    pub fn describe(&self) -> Option<String> {
        match (&self.address, &self.unix_socket) {
            (Some(a), Some(p)) => Some(format!("http://{a}/metrics and unix:{}", p.display())),
            (Some(a), None) => Some(format!("http://{a}/metrics")),
            (None, Some(p)) => Some(format!("unix:{}", p.display())),
            (None, None) => None,
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(p) = &self.unix_socket {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A connection slot of a listener, or `None` (the connection, dropped by
/// the caller, is closed) when [`MAX_CONNECTIONS`] are open.
fn slot(slots: &Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
    let s = Arc::clone(slots).try_acquire_owned().ok();
    if s.is_none() {
        tracing::debug!(
            max = MAX_CONNECTIONS,
            "metrics: closing a connection, the listener's connections are all open"
        );
    }
    s
}

async fn backoff(e: &std::io::Error) {
    // EMFILE and friends: back off instead of spinning.
    tracing::warn!(error = %e, "metrics accept failed");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn bind_unix(path: &Path) -> Result<UnixListener, MetricsError> {
    use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
    let err = |what, source| MetricsError::UnixSocket {
        path: path.to_owned(),
        what,
        source,
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(MetricsError::NotASocket {
                path: path.to_owned(),
            });
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(err(
                "in use",
                std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another process answers there",
                ),
            ));
        }
        std::fs::remove_file(path).map_err(|e| err("cannot remove the stale socket", e))?;
    }
    let l = UnixListener::bind(path).map_err(|e| err("cannot bind", e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| err("cannot chmod 600", e))?;
    Ok(l)
}

fn spawn_conn<S>(stream: S, render: Render, token: Option<Arc<Secret>>, slot: OwnedSemaphorePermit)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let _slot = slot;
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let resp = respond(&req, &render, token.as_deref());
            async move { Ok::<_, Infallible>(resp) }
        });
        // The timer makes hyper enforce the request-head timeout (from the
        // accept, and again after each reply), so that a silent or stalled
        // peer holds its slot only briefly.
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(REQUEST_HEAD_TIMEOUT)
            .serve_connection(TokioIo::new(stream), svc)
            .await;
    });
}

/// Whether `req` carries the bearer token (constant-time comparison).
fn authorized(req: &Request<Incoming>, token: &Secret) -> bool {
    use subtle::ConstantTimeEq as _;
    let Some(given) = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
    else {
        return false;
    };
    given.ct_eq(token.expose().as_bytes()).into()
}

fn respond(
    req: &Request<Incoming>,
    render: &Render,
    token: Option<&Secret>,
) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: &'static [u8]| {
        let mut r = Response::new(Full::new(Bytes::from_static(body)));
        *r.status_mut() = status;
        r
    };
    if req.uri().path() != "/metrics" {
        return reply(StatusCode::NOT_FOUND, b"see /metrics\n");
    }
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, b"GET /metrics\n");
    }
    if let Some(token) = token
        && !authorized(req, token)
    {
        let mut r = reply(StatusCode::UNAUTHORIZED, b"a bearer token is required\n");
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer"),
        );
        return r;
    }
    let mut r = Response::new(Full::new(Bytes::from(render())));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;

    /// One `GET /metrics` on a fresh connection: the reply, or `None` when
    /// the connection was closed without one.
    async fn scrape(addr: SocketAddr) -> Option<String> {
        let mut c = TcpStream::connect(addr).await.ok()?;
        c.write_all(b"GET /metrics HTTP/1.1\r\nhost: m\r\nconnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.ok()?;
        let text = String::from_utf8(out).ok()?;
        text.starts_with("HTTP/1.1 200").then_some(text)
    }

    /// Waits (up to `within`) for `closed` to reach `n`.
    async fn until_closed(closed: &AtomicUsize, n: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while closed.load(Ordering::SeqCst) < n {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// Issue 42 finding 6a: idle connections held every slot of the
    /// metrics listener (hyper's 30 s head timeout let them stay), and
    /// every scrape was reset while they were held. Now the server closes
    /// them after [`REQUEST_HEAD_TIMEOUT`] and the scrape gets through.
    #[tokio::test]
    async fn silent_connections_are_closed_and_scrapes_get_through() {
        const EXTRA: usize = 8;
        let server = MetricsServer::start(
            MetricsOptions {
                address: Some("127.0.0.1:0".parse().unwrap()),
                ..MetricsOptions::default()
            },
            Arc::new(|| "up 1\n".to_owned()),
        )
        .await
        .unwrap();
        let addr = server.address.unwrap();
        assert!(scrape(addr).await.is_some_and(|t| t.contains("up 1")));

        // The cap and more in silent connections, each watched until the
        // server closes it.
        let closed = Arc::new(AtomicUsize::new(0));
        for _ in 0..MAX_CONNECTIONS + EXTRA {
            let mut c = TcpStream::connect(addr).await.unwrap();
            let closed = Arc::clone(&closed);
            tokio::spawn(async move {
                let mut b = [0u8; 64];
                while matches!(c.read(&mut b).await, Ok(n) if n > 0) {}
                closed.fetch_add(1, Ordering::SeqCst);
            });
        }
        // Those beyond the cap are closed at accept: the cap is held...
        assert!(
            until_closed(&closed, EXTRA, Duration::from_secs(20)).await,
            "the connections beyond the cap were not closed"
        );
        assert!(
            closed.load(Ordering::SeqCst) < MAX_CONNECTIONS + EXTRA,
            "all silent connections closed at once"
        );
        assert!(
            scrape(addr).await.is_none(),
            "a scrape got in while the cap was held"
        );
        // ...until the server closes the silent ones (a generous wait: the
        // head timeout is 5 s; hyper's default, 30 s, let them stay).
        assert!(
            until_closed(&closed, MAX_CONNECTIONS + EXTRA, Duration::from_secs(25)).await,
            "{} of {} silent connections still open",
            MAX_CONNECTIONS + EXTRA - closed.load(Ordering::SeqCst),
            MAX_CONNECTIONS + EXTRA
        );
        // The slots are free once their tasks end.
        let mut got = None;
        for _ in 0..100 {
            got = scrape(addr).await;
            if got.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            got.is_some_and(|t| t.contains("up 1")),
            "no scrape got through"
        );
    }
}
