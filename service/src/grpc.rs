//! Bodies the services' admission layers (the dpu-agent's gate, the
//! host-shim's admission) put around a gRPC call ahead of tonic's codec.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tonic::Status;
use tonic::body::Body;

/// A request body that fails with `RESOURCE_EXHAUSTED` once more than
/// `limit` bytes arrive, so tonic never buffers a larger message; tonic
/// passes the status to the client as it is.
#[derive(Debug)]
pub struct LimitedBody {
    inner: Body,
    left: usize,
    limit: usize,
    method: String,
}

impl LimitedBody {
    /// `inner` cut off past `limit` bytes (gRPC prefixes included) of a
    /// call to `method` (named in the error).
    #[must_use]
    pub fn new(inner: Body, limit: usize, method: impl Into<String>) -> LimitedBody {
        LimitedBody {
            inner,
            left: limit,
            limit,
            method: method.into(),
        }
    }
}

impl http_body::Body for LimitedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &r
            && let Some(d) = f.data_ref()
        {
            match self.left.checked_sub(d.len()) {
                Some(left) => self.left = left,
                None => {
                    return Poll::Ready(Some(Err(Status::resource_exhausted(format!(
                        "a {} request may be at most {} bytes (with its 5-byte gRPC prefix); this one is larger",
                        self.method, self.limit
                    )))));
                }
            }
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

/// A response body that holds `G` (a "call in progress" mark) until the
/// body ends or is dropped.
#[derive(Debug)]
pub struct HoldingBody<G> {
    inner: Body,
    _held: G,
}

impl<G> HoldingBody<G> {
    /// `inner`, holding `held` while it lives.
    pub fn new(inner: Body, held: G) -> HoldingBody<G> {
        HoldingBody { inner, _held: held }
    }
}

impl<G: Unpin> http_body::Body for HoldingBody<G> {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
