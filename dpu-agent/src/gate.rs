//! The front door of the gRPC API: who may hold a connection, and what a
//! caller must show before the agent reads a byte of its request body.
//!
//! - **Connections** ([`GatedStream`]): at most `listen.max_connections`
//!   are open at once (further ones are closed at accept). A connection
//!   that has not carried one authenticated call within
//!   `listen.unauthenticated_timeout_secs` of opening is closed, whatever it
//!   sends, and an authenticated one with no call running for
//!   `listen.idle_timeout_secs` is closed too (the shim reconnects).
//! - **Calls** ([`Gate`]): the shim is authenticated from the request
//!   headers (bearer token) and the connection's TLS client certificate
//!   *before* the body is decoded: a caller without valid credentials gets
//!   `UNAUTHENTICATED` at once and its request body is dropped unread, so
//!   it holds at most the HTTP/2 flow-control window of its connection.
//!   An authenticated call's body is bounded per method
//!   ([`MethodLimits`]): single-object calls are small; a GetObjects batch
//!   is bounded by `transfer.max_batch_items`.
//!
//! HTTP/2 stream and header limits are set on the server in
//! [`crate::app`].

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use s3dma_service::grpc::MethodLimits;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Sleep;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::server::NamedService;
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};

use crate::auth::{Shim, ShimAuth};
use crate::metrics::Metrics;

/// Largest request message of a single-object call (GetObject, PutObject,
/// HeadObject, ListObjects, DeleteObject): names, a token and a little
/// metadata. 64 KiB is far above any valid request.
pub const UNARY_MESSAGE_LIMIT: usize = 64 << 10;

/// Bytes one batch item (GetObjects, HeadObjects, PutObjects with up to
/// 2 KiB of metadata, DeleteObjects) may take in a request (a 1 KiB key, a bucket
/// name, a range and a token fit in well under this).
pub const BATCH_ITEM_LIMIT: usize = 4 << 10;

/// Request body bounds per gRPC method for batches of at most
/// `max_batch_items` items: [`UNARY_MESSAGE_LIMIT`] for any method but
/// the batches (GetObjects, HeadObjects, PutObjects, DeleteObjects), which
/// may add [`BATCH_ITEM_LIMIT`] per item; a shim's
/// `QueuePairs` stream (answers of a few dozen bytes, for as long as the
/// shim is connected) bounds each message, not the stream.
#[must_use]
pub fn method_limits(max_batch_items: usize) -> MethodLimits {
    MethodLimits::new(UNARY_MESSAGE_LIMIT)
        .with(
            MethodLimits::batch(UNARY_MESSAGE_LIMIT, BATCH_ITEM_LIMIT, max_batch_items),
            &["GetObjects", "HeadObjects", "PutObjects", "DeleteObjects"],
        )
        .streaming(&["QueuePairs"])
}

// ---------------------------------------------------------------------------
// Connections
// ---------------------------------------------------------------------------

/// What the gate knows of one connection, shared between its stream and
/// the calls on it.
#[derive(Debug)]
pub struct ConnState {
    opened: Instant,
    authenticated: AtomicBool,
    /// Authenticated calls running.
    active: AtomicUsize,
    /// When the last authenticated call ended, in ms since `opened`.
    last_done_ms: AtomicU64,
}

impl ConnState {
    fn new() -> ConnState {
        ConnState {
            opened: Instant::now(),
            authenticated: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            last_done_ms: AtomicU64::new(0),
        }
    }

    fn since_opened(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// Connection info the gate adds to every request (tonic puts it in the
/// request's extensions, under a `TlsConnectInfo` with TLS).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Addresses of the TCP connection.
    pub tcp: TcpConnectInfo,
    state: Arc<ConnState>,
}

/// Connection timeouts.
#[derive(Debug, Clone, Copy)]
pub struct ConnTimeouts {
    /// A connection without an authenticated call is closed this long after
    /// it opened.
    pub unauthenticated: Duration,
    /// An authenticated connection with no call running is closed after
    /// this long.
    pub idle: Duration,
}

/// An accepted TCP connection that counts against `listen.max_connections`
/// (until dropped) and closes itself by the rules of [`ConnTimeouts`]: its
/// reads fail once the connection is due to close, which ends tonic's
/// connection task.
#[derive(Debug)]
pub struct GatedStream {
    inner: TcpStream,
    state: Arc<ConnState>,
    timeouts: ConnTimeouts,
    timer: Pin<Box<Sleep>>,
    metrics: Arc<Metrics>,
    _slot: ConnSlot,
}

/// Holds a connection's place under the cap and its gauge.
#[derive(Debug)]
struct ConnSlot {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.metrics.connections(-1);
    }
}

impl GatedStream {
    /// Wraps `inner`, holding `permit` (its place under the connection cap)
    /// until the connection closes.
    #[must_use]
    pub fn new(
        inner: TcpStream,
        permit: OwnedSemaphorePermit,
        timeouts: ConnTimeouts,
        metrics: Arc<Metrics>,
    ) -> GatedStream {
        metrics.connections(1);
        let state = Arc::new(ConnState::new());
        GatedStream {
            inner,
            timer: Box::pin(tokio::time::sleep_until(
                (state.opened + timeouts.unauthenticated).into(),
            )),
            state,
            timeouts,
            _slot: ConnSlot {
                _permit: permit,
                metrics: Arc::clone(&metrics),
            },
            metrics,
        }
    }

    /// The TCP connection.
    #[must_use]
    pub fn tcp(&self) -> &TcpStream {
        &self.inner
    }

    /// When the connection is due to close as things stand now (`None`: a
    /// call is running, check again when the idle time could next run out).
    fn due(&self) -> Result<Instant, &'static str> {
        let s = &self.state;
        if !s.authenticated.load(Ordering::Acquire) {
            let at = s.opened + self.timeouts.unauthenticated;
            return if Instant::now() >= at {
                Err("unauthenticated")
            } else {
                Ok(at)
            };
        }
        if s.active.load(Ordering::Acquire) > 0 {
            return Ok(Instant::now() + self.timeouts.idle);
        }
        let at = s.opened
            + Duration::from_millis(s.last_done_ms.load(Ordering::Acquire))
            + self.timeouts.idle;
        if Instant::now() >= at {
            Err("idle")
        } else {
            Ok(at)
        }
    }
}

impl Connected for GatedStream {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        ConnInfo {
            tcp: self.inner.connect_info(),
            state: Arc::clone(&self.state),
        }
    }
}

impl AsyncRead for GatedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Poll::Ready(r) = Pin::new(&mut self.inner).poll_read(cx, buf) {
            return Poll::Ready(r);
        }
        // Nothing to read: is it time to close? (The timer wakes this task.)
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            match self.due() {
                Ok(at) => self.timer.as_mut().reset(at.into()),
                Err(why) => {
                    self.metrics.connection_closed(why);
                    tracing::debug!(
                        peer = ?self.inner.peer_addr().ok(),
                        reason = why,
                        "closing a gRPC connection"
                    );
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("connection closed: {why}"),
                    )));
                }
            }
        }
    }
}

impl AsyncWrite for GatedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

// ---------------------------------------------------------------------------
// Calls
// ---------------------------------------------------------------------------

/// The shim a call was authenticated as (in the request's extensions).
#[derive(Debug, Clone)]
pub struct AuthenticatedShim(pub Arc<Shim>);

/// The gRPC service behind the gate: authenticates every call from its
/// headers and TLS certificate before the body is read, and bounds the
/// body per method.
#[derive(Debug, Clone)]
pub struct Gate<S> {
    inner: S,
    auth: Arc<ShimAuth>,
    metrics: Arc<Metrics>,
    limits: Arc<MethodLimits>,
}

impl<S> Gate<S> {
    /// `inner` behind the gate.
    pub fn new(inner: S, auth: Arc<ShimAuth>, metrics: Arc<Metrics>, limits: MethodLimits) -> Self {
        Gate {
            inner,
            auth,
            metrics,
            limits: Arc::new(limits),
        }
    }
}

impl<S: NamedService> NamedService for Gate<S> {
    const NAME: &'static str = S::NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<http::Request<Body>> for Gate<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        let conn = req.extensions().get::<ConnInfo>().cloned();
        let certs = req
            .extensions()
            .get::<TlsConnectInfo<ConnInfo>>()
            .and_then(TlsConnectInfo::peer_certs);
        let shim = match self
            .auth
            .authenticate(req.headers(), certs.as_deref().map(Vec::as_slice))
        {
            Ok(s) => s,
            Err(e) => {
                self.metrics.auth_failure(e.label());
                // `req` (and its body, unread) is dropped here.
                let status = Status::unauthenticated(e.to_string());
                return Box::pin(async move { Ok(status.into_http()) });
            }
        };
        let guard = conn.map(|c| {
            c.state.authenticated.store(true, Ordering::Release);
            c.state.active.fetch_add(1, Ordering::AcqRel);
            ActiveCall(c.state)
        });
        let limit = self.limits.for_path(req.uri().path());
        let req_method = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        req.extensions_mut().insert(AuthenticatedShim(shim));
        let req = req.map(|b| {
            Body::new(s3dma_service::grpc::LimitedBody::new(
                b,
                limit,
                req_method.clone(),
            ))
        });
        // The clone that was made ready serves this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let resp = inner.call(req).await?;
            Ok(resp.map(|b| Body::new(s3dma_service::grpc::HoldingBody::new(b, guard))))
        })
    }
}

/// An authenticated call running on a connection (ends when dropped).
#[derive(Debug)]
struct ActiveCall(Arc<ConnState>);

impl Drop for ActiveCall {
    fn drop(&mut self) {
        self.0
            .last_done_ms
            .fetch_max(self.0.since_opened(), Ordering::AcqRel);
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}
