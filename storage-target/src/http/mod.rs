//! HTTP/1.1 serving around the s3s service: [`Handler`], a hyper service
//! that runs every request in its envelope ([`s3dma_service::request`]),
//! and what a connection is held to.
//!
//! [`Handler`] runs a request in these steps, in this order (each a
//! function of its own, in the manner of axum's middleware layers, outer to
//! inner and back):
//! 1. `envelope`: the request's envelope: this server's request id, the
//!    client's id (escaped, bounded, in its own field), an `info` span
//!    naming the method and the path (decoded, so a key reads as written,
//!    and escaped, so it cannot forge a log line).
//! 2. `extensions`: what the inner layers read from the request: its id,
//!    the slot the access check names the S3 operation in, the
//!    connection's share (the per-user cap).
//! 3. `counted_body`: the body wrapped: bytes counted, failed when the
//!    client stalls, aws-chunked framing checked ([`chunked`]).
//! 4. `call`: the pre-check ([`crate::precheck`]), for a hipobj-rc-v2
//!    control request its own SigV4 verification
//!    ([`crate::dialect::hipobj::ControlAuth`]: these are not S3
//!    operations, and their peers sign them as service `hipobj`), and,
//!    when they pass, the s3s call; a failed call is answered
//!    `500 InternalError`.
//! 5. `fix_status`: the status a handler set where s3s drops it
//!    ([`StatusOverride`]), and a `304` without a body.
//! 6. `fix_error_body`: the request id in an XML error body (with a
//!    message for errors s3s raises without one), no body for `HEAD`.
//! 7. `id_headers`: `x-amz-request-id`, `x-amz-id-2`, `Server`.
//! 8. `close_if_unread`: `Connection: close` for a request answered
//!    before its body was read.
//! 9. `log`: one line per request.
//! 10. [`ResponseBody`]: the response body, counting its bytes and
//!     recording the request's metrics once it ends or is dropped.
//!
//! Modules:
//! - [`ids`]: request ids, the operation slot, error-body fix-ups.
//! - [`body`]: the counting request and response bodies, the body deadline.
//! - [`chunked`]: the aws-chunked check (`max_aws_chunk_size`).
//! - [`caps`]: the connection caps (`max_connections`, `connections:`).
//! - [`deadline`]: the request-head timeout and the write deadline.

pub mod body;
pub mod caps;
pub mod chunked;
pub mod deadline;
pub mod ids;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use base64::Engine as _;
use bytes::Bytes;
use futures::future::BoxFuture;
use http::request::Parts;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use s3s::service::S3Service;
use tracing::{Instrument as _, error, info};

use crate::metrics::Metrics;
use s3dma_service::Escaped;
use s3dma_service::request::Envelope;

pub use body::ResponseBody;
pub(crate) use body::{BODY_IDLE_MESSAGE, CountingBody};
use caps::Busy;
pub(crate) use caps::Conns;
pub use caps::{ConnShare, claim_connection};
pub(crate) use chunked::AWS_CHUNK_REFUSED;
use chunked::ChunkCheck;
pub use chunked::DEFAULT_MAX_AWS_CHUNK;
use ids::{CLIENT_REQUEST_ID_HEADERS, STYLE, payload_mode};
pub use ids::{OpSlot, RequestId, StatusOverride, new_request_id, set_error_request_id};

/// The hyper service: request ids and metrics around the s3s service.
#[derive(Clone)]
pub struct Handler {
    s3: S3Service,
    metrics: Arc<Metrics>,
    /// This server's region: SigV4 credential scopes must name it.
    region: Arc<str>,
    /// Largest aws-chunked chunk accepted (bytes).
    max_aws_chunk: u64,
    /// The connection this handler serves (set per connection by
    /// [`crate::server::serve`]).
    conn: Option<ConnShare>,
    /// The operator's authentication choices (SigV2, clock skew).
    auth: crate::precheck::AuthOptions,
    /// The control requests' verification (ahead of s3s); `None`: s3s
    /// verifies them like S3 requests.
    control: Option<Arc<crate::dialect::hipobj::ControlAuth>>,
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler").finish_non_exhaustive()
    }
}

impl Handler {
    /// Wraps an s3s service of a server in `region`, authenticating
    /// requests as `auth` says.
    #[must_use]
    pub fn new(
        s3: S3Service,
        metrics: Arc<Metrics>,
        region: &str,
        auth: crate::precheck::AuthOptions,
    ) -> Self {
        Handler {
            s3,
            metrics,
            region: region.into(),
            max_aws_chunk: DEFAULT_MAX_AWS_CHUNK,
            conn: None,
            auth,
            control: None,
        }
    }

    /// Verifies the hipobj-rc-v2 control requests with `control`, ahead
    /// of s3s.
    #[must_use]
    pub fn with_control_auth(mut self, control: crate::dialect::hipobj::ControlAuth) -> Self {
        self.control = Some(Arc::new(control));
        self
    }

    /// Sets the largest aws-chunked chunk a request body may declare
    /// (`max_aws_chunk_size`; default [`DEFAULT_MAX_AWS_CHUNK`]).
    #[must_use]
    pub fn with_max_aws_chunk_size(mut self, bytes: u64) -> Self {
        self.max_aws_chunk = bytes;
        self
    }

    /// The handler of one connection (its share of the caps).
    pub(crate) fn for_connection(&self, share: ConnShare) -> Handler {
        Handler {
            conn: Some(share),
            ..self.clone()
        }
    }

    /// The metrics.
    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Runs one request through the steps of the module's list, in order.
    async fn handle(self, req: Request<Incoming>) -> Response<ResponseBody> {
        let busy = self.conn.as_ref().map(|c| Busy::new(Arc::clone(c.conn())));
        let op = OpSlot::default();
        let method = req.method().clone();
        let env = envelope(&req);
        let span = env.span().clone();
        async move {
            let (mut parts, body) = req.into_parts();
            let payload = payload_mode(&parts.headers);
            extensions(&mut parts, &env, &op, self.conn.as_ref());
            let (body, ended) = counted_body(&parts, body, &self.metrics, self.max_aws_chunk);
            let resp = call(&self, parts, body, &env).await;
            let (mut parts, body) = resp.into_parts();
            let body = fix_status(&mut parts, body);
            let body = fix_error_body(&mut parts, body, &method, env.id());
            id_headers(&mut parts, env.id());
            close_if_unread(&mut parts, &ended);
            log(&op, parts.status, &payload);
            let status = parts.status.as_u16();
            Response::from_parts(
                parts,
                ResponseBody::new(body, Arc::clone(&self.metrics), op, status, env, busy),
            )
        }
        .instrument(span)
        .await
    }
}

/// Step 1: the request's envelope. A request id the client chose (a
/// dpu-agent names its own in `x-s3dma-request-id`, so one tenant request
/// can be followed from shim to agent to target; other clients may send
/// `x-request-id`) is kept, escaped and cut to a bounded length, in its own
/// field marked client-supplied: it never replaces this server's `id`.
fn envelope<B>(req: &Request<B>) -> Envelope {
    // The path decoded, so that a key reads as the client wrote it, and
    // escaped: a key with a newline or an ANSI escape cannot forge a log
    // line or drive the reader's terminal.
    let path = percent_encoding::percent_decode_str(req.uri().path())
        .decode_utf8_lossy()
        .into_owned();
    let client = CLIENT_REQUEST_ID_HEADERS
        .iter()
        .find_map(|h| req.headers().get(*h))
        .map(HeaderValue::as_bytes);
    let env = Envelope::new(
        STYLE,
        new_request_id(),
        s3dma_service::request::client_request_id(client),
    );
    env.record("method", req.method())
        .record("path", Escaped(&path));
    if client.is_some() {
        env.record_client_id();
    }
    env
}

/// Step 2: the request id, the operation slot and the connection's share,
/// in the request's extensions.
fn extensions(parts: &mut Parts, env: &Envelope, op: &OpSlot, conn: Option<&ConnShare>) {
    parts.extensions.insert(RequestId(env.id().to_owned()));
    parts.extensions.insert(op.clone());
    if let Some(share) = conn {
        parts.extensions.insert(share.clone());
    }
}

/// Step 3: the body counted, with the aws-chunked check for a streaming
/// (`STREAMING-...`) one; the flag is set once it has been read to its end.
fn counted_body(
    parts: &Parts,
    body: Incoming,
    metrics: &Arc<Metrics>,
    max_aws_chunk: u64,
) -> (s3s::Body, Arc<AtomicBool>) {
    let streaming = parts
        .headers
        .get("x-amz-content-sha256")
        .is_some_and(|v| v.as_bytes().starts_with(b"STREAMING-"));
    let (body, ended) = CountingBody::new(
        body,
        Arc::clone(metrics),
        streaming.then(|| ChunkCheck::new(max_aws_chunk)),
    );
    (s3s::Body::http_body_unsync(body), ended)
}

/// Step 4: the pre-check, then the s3s call; what fails is answered as S3
/// errors naming the request id (`500 InternalError` for a failed call).
async fn call(
    h: &Handler,
    mut parts: Parts,
    body: s3s::Body,
    env: &Envelope,
) -> Response<s3s::Body> {
    let checked =
        crate::precheck::precheck(&mut parts, &h.region, h.auth).and_then(|()| match &h.control {
            Some(c) if crate::dialect::hipobj::ControlAuth::applies(&parts) => c.verify(&mut parts),
            _ => Ok(()),
        });
    let outcome = match checked {
        Ok(()) => h.s3.call(Request::from_parts(parts, body)).await,
        Err(mut e) => {
            e.set_request_id(env.id().to_owned());
            e.to_http_response()
                .map_err(|e| s3s::HttpError::new(Box::new(e)))
        }
    };
    outcome.unwrap_or_else(|e| {
        error!(error = ?e, "s3 service failed");
        let mut err = s3s::S3Error::with_message(
            s3s::S3ErrorCode::InternalError,
            "We encountered an internal error. Please try again.",
        );
        err.set_request_id(env.id().to_owned());
        err.to_http_response().unwrap_or_else(|_| {
            let mut r = Response::new(s3s::Body::empty());
            *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            r
        })
    })
}

/// Step 5: the status a handler set ([`StatusOverride`]); a `304` has no
/// body, length or type.
fn fix_status(parts: &mut http::response::Parts, body: s3s::Body) -> s3s::Body {
    if let Some(StatusOverride(status)) = parts.extensions.remove::<StatusOverride>() {
        parts.status = status;
    }
    if parts.status != StatusCode::NOT_MODIFIED {
        return body;
    }
    parts.headers.remove(http::header::CONTENT_LENGTH);
    parts.headers.remove(http::header::CONTENT_TYPE);
    s3s::Body::empty()
}

/// Step 6: an XML error body names the request id (and its length
/// follows); a `HEAD` answer keeps the length but sends no body.
fn fix_error_body(
    parts: &mut http::response::Parts,
    body: s3s::Body,
    method: &Method,
    id: &str,
) -> s3s::Body {
    let status = parts.status;
    if !(status.is_client_error() || status.is_server_error()) {
        return body;
    }
    let Some(new) = body.bytes().and_then(|b| set_error_request_id(&b, id)) else {
        return body;
    };
    parts
        .headers
        .insert(http::header::CONTENT_LENGTH, HeaderValue::from(new.len()));
    if *method == Method::HEAD {
        s3s::Body::empty()
    } else {
        s3s::Body::from(Bytes::from(new))
    }
}

/// Step 7: `x-amz-request-id`, `x-amz-id-2` and `Server`.
fn id_headers(parts: &mut http::response::Parts, id: &str) {
    if let Ok(v) = HeaderValue::from_str(id) {
        parts.headers.insert("x-amz-request-id", v);
    }
    let id2 = base64::engine::general_purpose::STANDARD
        .encode(format!("{id}{:016x}", rand::random::<u64>()));
    if let Ok(v) = HeaderValue::from_str(&id2) {
        parts.headers.insert("x-amz-id-2", v);
    }
    parts.headers.insert(
        http::header::SERVER,
        HeaderValue::from_static("s3dma-storage-target"),
    );
}

/// Step 8: a request answered before its body was read (denied before a
/// byte of it, say) ends the connection. Kept alive, hyper would skip the
/// body's length of what follows, but a client that sent `Expect:
/// 100-continue` and saw no 100 never sends that body: the skipped bytes
/// would be the start of its next request.
fn close_if_unread(parts: &mut http::response::Parts, ended: &AtomicBool) {
    if !ended.load(Ordering::Relaxed) {
        parts
            .headers
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
}

/// Step 9: the request's line (an error for a server error).
fn log(op: &OpSlot, status: StatusCode, payload: &str) {
    let op_name = op.get();
    if status.is_server_error() {
        error!(op = %op_name, status = status.as_u16(), payload = %payload, "request failed");
    } else {
        info!(op = %op_name, status = status.as_u16(), payload = %payload, "request");
    }
}

impl hyper::service::Service<Request<Incoming>> for Handler {
    type Response = Response<ResponseBody>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.handle(req).await) })
    }
}
