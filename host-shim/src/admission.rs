//! Admission ahead of the gRPC codec: a tower layer that runs before tonic
//! reads a call's message.
//!
//! Each call on a tenant connection takes one of its tenant's request
//! permits (`max_concurrent_requests`) first; without one it is answered
//! RESOURCE_EXHAUSTED and its body is never read. An admitted call's body
//! is read through a per-method size limit (a registration is a few hundred
//! bytes, a batch at most `max_batch_items` items), so what one
//! tenant can make the shim buffer is bounded by its permits times these
//! limits. The call also counts as activity on its connection for the
//! idle timeout until its response ends.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use s3dma_service::grpc::MethodLimits;
use tokio::sync::OwnedSemaphorePermit;
use tonic::body::Body;

use crate::error::ShimError;
use crate::metrics::Metrics;
use crate::socket::ConnInfo;

/// The gRPC service path prefix of the tenant API.
const SERVICE_PREFIX: &str = "/s3dma.tenant.v1.Tenant/";

/// Bytes an encoded GetObjects item may take: a 1 KiB key, a bucket name,
/// a range and a buffer slice, with protobuf framing.
pub const BATCH_ITEM_BYTES: usize = 1280;

/// Bytes an encoded PutObjects item may take: a [`BATCH_ITEM_BYTES`] item
/// plus a content type and user metadata up to 2 KiB, as PutObject takes.
pub const PUT_ITEM_BYTES: usize = BATCH_ITEM_BYTES + 2816;

/// The largest request message (with its 5-byte gRPC prefix) each method
/// of the tenant API may send, for tenants whose largest batch is
/// `max_batch_items`: a registration is a few hundred bytes; single-object
/// calls carry a key (1 KiB), a bucket, a range, a slice and user metadata
/// up to 2 KiB; a GetObjects, HeadObjects or DeleteObjects batch up to
/// [`BATCH_ITEM_BYTES`] per item, a PutObjects batch [`PUT_ITEM_BYTES`].
#[must_use]
pub fn method_limits(max_batch_items: u32) -> MethodLimits {
    MethodLimits::new(1024)
        .with(4096, &["RegisterBuffer"])
        .with(
            16 << 10,
            &[
                "GetObject",
                "PutObject",
                "HeadObject",
                "DeleteObject",
                "ListObjects",
            ],
        )
        .with(
            MethodLimits::batch(1024, BATCH_ITEM_BYTES, max_batch_items as usize),
            &["GetObjects", "HeadObjects", "DeleteObjects"],
        )
        .with(
            MethodLimits::batch(1024, PUT_ITEM_BYTES, max_batch_items as usize),
            &["PutObjects"],
        )
}

/// The call's request permit, for the handler to take (and, for a batch,
/// to hand to the task that streams its replies).
#[derive(Debug, Clone)]
pub struct Admitted(Arc<Mutex<Option<OwnedSemaphorePermit>>>);

impl Admitted {
    /// A permit taken outside the layer (a ring entry: the same permit
    /// a gRPC call takes, for the same handler).
    pub(crate) fn new(permit: OwnedSemaphorePermit) -> Admitted {
        Admitted(Arc::new(Mutex::new(Some(permit))))
    }

    /// Takes the permit (once).
    pub fn take(&self) -> Option<OwnedSemaphorePermit> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// The layer.
#[derive(Debug, Clone)]
pub struct AdmissionLayer {
    metrics: Arc<Metrics>,
    limits: Arc<MethodLimits>,
}

impl AdmissionLayer {
    /// Builds the layer.
    #[must_use]
    pub fn new(metrics: Arc<Metrics>, limits: MethodLimits) -> AdmissionLayer {
        AdmissionLayer {
            metrics,
            limits: Arc::new(limits),
        }
    }
}

impl<S> tower::Layer<S> for AdmissionLayer {
    type Service = Admission<S>;
    fn layer(&self, inner: S) -> Admission<S> {
        Admission {
            inner,
            metrics: Arc::clone(&self.metrics),
            limits: Arc::clone(&self.limits),
        }
    }
}

/// The service the layer makes.
#[derive(Debug, Clone)]
pub struct Admission<S> {
    inner: S,
    metrics: Arc<Metrics>,
    limits: Arc<MethodLimits>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower::Service<http::Request<Body>> for Admission<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        let method = req
            .uri()
            .path()
            .strip_prefix(SERVICE_PREFIX)
            .unwrap_or("other")
            .to_owned();
        let Some(info) = req.extensions().get::<ConnInfo>().cloned() else {
            let status = ShimError::Internal("no peer credentials on this connection".into())
                .into_status("");
            return Box::pin(async move { Ok(status.into_http()) });
        };
        let Ok(permit) = Arc::clone(&info.tenant.requests).try_acquire_owned() else {
            let e = ShimError::TooManyRequests(format!(
                "tenant {} has {} requests in the shim already (max_concurrent_requests); retry later",
                info.tenant.name, info.tenant.max_concurrent_requests
            ));
            let op = known_op(&method);
            self.metrics
                .requests
                .with_label_values(&[&info.tenant.name, op, "RESOURCE_EXHAUSTED"])
                .inc();
            let status = e.into_status("");
            return Box::pin(async move { Ok(status.into_http()) });
        };
        let active = info.activity.begin();
        req.extensions_mut()
            .insert(Admitted(Arc::new(Mutex::new(Some(permit)))));
        let limit = self.limits.of(&method);
        let req = req.map(|b| {
            Body::new(s3dma_service::grpc::LimitedBody::new(
                b,
                limit,
                known_op(&method),
            ))
        });
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|b| Body::new(s3dma_service::grpc::HoldingBody::new(b, active))))
        })
    }
}

/// The metrics label of a method (only the API's own names, so a client
/// cannot mint label values).
fn known_op(method: &str) -> &'static str {
    const OPS: &[&str] = &[
        "Info",
        "RegisterBuffer",
        "ReleaseBuffer",
        "ListBuffers",
        "GetObject",
        "GetObjects",
        "PutObject",
        "HeadObject",
        "ListObjects",
        "DeleteObject",
    ];
    OPS.iter()
        .find(|o| **o == method)
        .copied()
        .unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_per_method() {
        let l = method_limits(1024);
        assert_eq!(l.of("RegisterBuffer"), 4096);
        assert_eq!(l.of("Info"), 1024);
        assert_eq!(l.of("GetObject"), 16 << 10);
        assert_eq!(l.of("GetObjects"), 1024 + 1024 * BATCH_ITEM_BYTES);
        assert_eq!(l.of("Nope"), 1024);
        assert!(l.largest() >= l.of("GetObjects"));
        assert_eq!(known_op("GetObjects"), "GetObjects");
        assert_eq!(known_op("x\ny"), "other");
    }
}
