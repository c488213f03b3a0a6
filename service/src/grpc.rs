//! What the services' admission layers (the dpu-agent's gate, the
//! host-shim's admission) put around a gRPC call ahead of tonic's codec:
//! the request body bound per method ([`MethodLimits`], [`LimitedBody`])
//! and the response body that holds a mark ([`HoldingBody`]); and the
//! gRPC code names the services' metrics use ([`code_name`]).

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

/// The largest request message (with its 5-byte gRPC prefix) each method
/// of a gRPC service accepts: a default, and bounds of named methods (the
/// last segment of the call's path, e.g. `GetObjects`).
#[derive(Debug, Clone)]
pub struct MethodLimits {
    default: usize,
    methods: Vec<(&'static str, usize)>,
    streams: Vec<&'static str>,
}

impl MethodLimits {
    /// Every method bounded to `default` bytes.
    #[must_use]
    pub fn new(default: usize) -> MethodLimits {
        MethodLimits {
            default,
            methods: Vec::new(),
            streams: Vec::new(),
        }
    }

    /// `methods` are long-lived streams of small messages (a shim's
    /// `QueuePairs`): their body has no total bound, each message still
    /// has tonic's ([`MethodLimits::largest`]).
    #[must_use]
    pub fn streaming(mut self, methods: &[&'static str]) -> MethodLimits {
        self.streams.extend_from_slice(methods);
        self
    }

    /// `methods` bounded to `limit` bytes instead (a later bound of the
    /// same method replaces an earlier one).
    #[must_use]
    pub fn with(mut self, limit: usize, methods: &[&'static str]) -> MethodLimits {
        for &m in methods {
            self.methods.retain(|(n, _)| *n != m);
            self.methods.push((m, limit));
        }
        self
    }

    /// The bound of a batch method: `base` bytes plus `item` bytes for each
    /// of at most `max_items` items (saturating).
    #[must_use]
    pub fn batch(base: usize, item: usize, max_items: usize) -> usize {
        max_items.saturating_mul(item).saturating_add(base)
    }

    /// The bound of `method` (the last segment of the path).
    #[must_use]
    pub fn of(&self, method: &str) -> usize {
        if self.streams.contains(&method) {
            return usize::MAX;
        }
        self.methods
            .iter()
            .find(|(n, _)| *n == method)
            .map_or(self.default, |&(_, l)| l)
    }

    /// The bound of the call to `path` (`/package.Service/Method`).
    #[must_use]
    pub fn for_path(&self, path: &str) -> usize {
        path.rsplit_once('/')
            .map_or(self.default, |(_, method)| self.of(method))
    }

    /// The largest bound of all (tonic's own decoding limit).
    #[must_use]
    pub fn largest(&self) -> usize {
        self.methods
            .iter()
            .map(|&(_, l)| l)
            .fold(self.default, usize::max)
    }
}

/// The name of a gRPC code as the protocol spells it (`NOT_FOUND`): the
/// `status` label of a gRPC service's requests.
#[must_use]
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code as C;
    match code {
        C::Ok => "OK",
        C::Cancelled => "CANCELLED",
        C::Unknown => "UNKNOWN",
        C::InvalidArgument => "INVALID_ARGUMENT",
        C::DeadlineExceeded => "DEADLINE_EXCEEDED",
        C::NotFound => "NOT_FOUND",
        C::AlreadyExists => "ALREADY_EXISTS",
        C::PermissionDenied => "PERMISSION_DENIED",
        C::ResourceExhausted => "RESOURCE_EXHAUSTED",
        C::FailedPrecondition => "FAILED_PRECONDITION",
        C::Aborted => "ABORTED",
        C::OutOfRange => "OUT_OF_RANGE",
        C::Unimplemented => "UNIMPLEMENTED",
        C::Internal => "INTERNAL",
        C::Unavailable => "UNAVAILABLE",
        C::DataLoss => "DATA_LOSS",
        C::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_limits() {
        let l = MethodLimits::new(1024)
            .with(4096, &["RegisterBuffer"])
            .with(MethodLimits::batch(1024, 1280, 8), &["GetObjects"]);
        assert_eq!(l.of("RegisterBuffer"), 4096);
        assert_eq!(l.of("Info"), 1024);
        assert_eq!(l.of("GetObjects"), 1024 + 8 * 1280);
        assert_eq!(
            l.for_path("/s3dma.tenant.v1.Tenant/GetObjects"),
            1024 + 8 * 1280
        );
        assert_eq!(l.for_path("GetObjects"), 1024);
        assert_eq!(l.largest(), 1024 + 8 * 1280);
        assert_eq!(MethodLimits::batch(1, usize::MAX, 2), usize::MAX);
        assert_eq!(code_name(tonic::Code::NotFound), "NOT_FOUND");
    }
}
