//! The request and response bodies around the s3s service: the request
//! body counts its bytes, fails once the client stalls for `IDLE_TIMEOUT`
//! and runs the aws-chunked check; the response body counts its bytes and
//! records the request's metrics once it ends or is dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use tracing::{debug, warn};

use s3dma_service::request::Envelope;

use super::caps::Busy;
use super::chunked::ChunkCheck;
use super::ids::OpSlot;
use crate::metrics::Metrics;

/// How long a client may keep the server waiting for request body bytes it
/// owes, or leave response bytes untaken, before the connection is failed
/// (S3's `RequestTimeout`): a client that stalls mid-body or stops reading
/// would otherwise hold its connection, and the object it writes or reads,
/// for ever.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The display text of a request body that timed out (see [`IDLE_TIMEOUT`]).
pub(crate) const BODY_IDLE_MESSAGE: &str = "the client sent no request body bytes";
/// Counts the bytes of a request body, and fails it once the client has
/// sent none for [`IDLE_TIMEOUT`] while the server waits for them, or when
/// its aws-chunked framing declares too large a chunk ([`ChunkCheck`]).
pub(crate) struct CountingBody {
    inner: Incoming,
    metrics: Arc<Metrics>,
    idle: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Set once the body has been read to its end.
    ended: Arc<AtomicBool>,
    /// The aws-chunked check, for a streaming (`STREAMING-...`) body.
    chunks: Option<ChunkCheck>,
}

impl CountingBody {
    /// Wraps `inner`; `chunks` checks an aws-chunked body's framing. The
    /// flag it returns is set once the body has been read to its end.
    pub(crate) fn new(
        inner: Incoming,
        metrics: Arc<Metrics>,
        chunks: Option<ChunkCheck>,
    ) -> (CountingBody, Arc<AtomicBool>) {
        let ended = Arc::new(AtomicBool::new(http_body::Body::is_end_stream(&inner)));
        let body = CountingBody {
            inner,
            metrics,
            idle: None,
            ended: Arc::clone(&ended),
            chunks,
        };
        (body, ended)
    }
}

impl http_body::Body for CountingBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if r.is_pending() {
            let idle = self
                .idle
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(IDLE_TIMEOUT)));
            if idle.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("{BODY_IDLE_MESSAGE} for {} s", IDLE_TIMEOUT.as_secs()),
                ))));
            }
            return Poll::Pending;
        }
        self.idle = None;
        if let Poll::Ready(Some(Ok(f))) = &r
            && let Some(d) = f.data_ref()
        {
            self.metrics.add_bytes_in(d.len() as u64);
            let checked = self.chunks.as_mut().map(|c| c.feed(d));
            if let Some(Err(why)) = checked {
                let why = why.to_string();
                self.metrics.aws_chunk_refused();
                debug!(error = %why, "request body refused");
                return Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    why,
                ))));
            }
        }
        if matches!(r, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.ended.store(true, Ordering::Relaxed);
        }
        r.map(|o| o.map(|r| r.map_err(std::io::Error::other)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The response body: counts bytes and records the request's metrics when
/// the body ends or is dropped (client gone).
pub struct ResponseBody {
    inner: s3s::Body,
    metrics: Arc<Metrics>,
    op: OpSlot,
    status: u16,
    /// The request's envelope (its id, span and start).
    env: Envelope,
    recorded: bool,
    /// Marks the connection busy until the response is sent or dropped.
    _busy: Option<Busy>,
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl ResponseBody {
    /// The body `inner` of a response of `status` to the request of `env`
    /// (operation `op`), holding its connection `busy` until it is done.
    pub(crate) fn new(
        inner: s3s::Body,
        metrics: Arc<Metrics>,
        op: OpSlot,
        status: u16,
        env: Envelope,
        busy: Option<Busy>,
    ) -> ResponseBody {
        ResponseBody {
            inner,
            metrics,
            op,
            status,
            env,
            recorded: false,
            _busy: busy,
        }
    }

    fn record(&mut self) {
        if !self.recorded {
            self.recorded = true;
            self.env
                .observe(&*self.metrics, "", &self.op.get(), &self.status.to_string());
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        self.record();
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = s3s::StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    self.metrics.add_bytes_out(d.len() as u64);
                }
            }
            Poll::Ready(Some(Err(e))) => {
                warn!(error = %e, "response body failed");
                self.record();
            }
            Poll::Ready(None) => self.record(),
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
