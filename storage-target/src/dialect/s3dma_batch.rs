//! s3dma batch requests (`POST /?s3dma-batch`, the format is
//! [`s3dma_wire::batch`]'s): many small HEADs, GETs and PUTs of one user as
//! ONE signed request, each GET or PUT item with its own window.
//!
//! The request is an s3s custom route ([`Routes`] puts it beside the
//! hipobj-rc-v2 route): s3s verifies its SigV4 signature once, over the
//! body (only a real `x-amz-content-sha256` is taken: the hash s3s checks
//! the body against as it is read, so every key and token is signed; not
//! `UNSIGNED-PAYLOAD`, not streaming, not a presigned URL). Then, in this
//! order, each refusal answering the whole batch (with
//! `x-amz-rdma-batch: s3dma-v1`) before any item runs:
//! 1. the body's length against `rdma.batch.max_body_bytes` (before a
//!    byte is read), its JSON, `rdma.batch.max_items`;
//! 2. every item checked on its own ([`s3dma_wire::batch::Item::check`]: a
//!    bad item fails alone), and the windows of the good ones added up
//!    against `rdma.batch.max_bytes`;
//! 3. one access check per (bucket, operation) the batch names (the
//!    rule s3s's hook applies to a single request; a bucket the user may
//!    not use fails its items only).
//!
//! Each item then runs (a GET or PUT as a task of its own, so that one
//! batch uses every worker thread) through the same handler as the single request
//! (`rdma.batch.item_concurrency` at a time): the index lookup and the
//! object's own ACL, then the bytes over RDMA into or out of its window
//! ([`crate::rdma`]'s data path, exactly as for a tokened GetObject or
//! PutObject): a PUT is stored only whole, with the window's size, or not
//! at all. The reply lists every item's outcome in request order.
//!
//! A server that cannot serve batches (the gateway, `rdma.batch.enabled:
//! false`) answers `501 NotImplemented` with
//! `x-amz-rdma-protocol-status: unsupported`, like a server that does not
//! know the request, and the client sends the items as single requests.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::Either;
use futures::{FutureExt as _, StreamExt as _};
use http::{Extensions, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use s3dma_wire::batch::{
    self, BatchError, BatchReply, BatchRequest, Checked, Item, ItemReply, Limits, Op,
};
use s3dma_wire::headers::{RDMA_BYTES, RDMA_PROTOCOL, RDMA_TOKEN, S3DMA_PROTOCOL};
use s3s::dto::{
    ETag, ETagCondition, GetObjectInput, HeadObjectInput, PutObjectInput, Range, Timestamp,
};
use s3s::route::S3Route;
use s3s::{Body, S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use tokio_util::task::AbortOnDropHandle;
use tracing::info;

use crate::auth::AccessCheck;
use crate::config::batch::BatchConfig;
use crate::metrics::Metrics;
use crate::precheck::AuthClaim;
use crate::s3::S3Api;

/// Whether a request is a batch request (`POST /?s3dma-batch`).
#[must_use]
pub fn is_batch_request(method: &Method, uri: &Uri) -> bool {
    *method == Method::POST
        && uri.path() == "/"
        && uri.query().is_some_and(|q| {
            q.split('&')
                .any(|p| p == batch::QUERY || p.strip_prefix(batch::QUERY) == Some("="))
        })
}

/// The route of batch requests: served over the filesystem store, or
/// declined (`501`).
#[derive(Debug, Clone)]
pub struct BatchRoute(Serve);

#[derive(Debug, Clone)]
enum Serve {
    Declined(&'static str),
    Store(Arc<BatchService>),
}

/// What serving a batch needs.
#[derive(Debug)]
struct BatchService {
    s3: S3Api,
    access: AccessCheck,
    cfg: BatchConfig,
    /// Whether the fabric is up (GET and PUT items need it).
    rdma: bool,
    metrics: Arc<Metrics>,
}

impl BatchRoute {
    /// Batches served over the filesystem store `s3`, checked by `access`
    /// (the service's hook), within `cfg`; `rdma`: whether tokens are
    /// served (else GET and PUT items fail `501`, HEADs still run).
    #[must_use]
    pub fn store(
        s3: S3Api,
        access: AccessCheck,
        cfg: BatchConfig,
        rdma: bool,
        metrics: Arc<Metrics>,
    ) -> BatchRoute {
        if !cfg.enabled {
            return BatchRoute::declined("rdma.batch.enabled is false");
        }
        BatchRoute(Serve::Store(Arc::new(BatchService {
            s3,
            access,
            cfg,
            rdma,
            metrics,
        })))
    }

    /// Every batch declined (`501`), saying `why`.
    #[must_use]
    pub fn declined(why: &'static str) -> BatchRoute {
        BatchRoute(Serve::Declined(why))
    }
}

/// The custom routes of this server: batch requests, then `R` (the
/// hipobj-rc-v2 control path).
#[derive(Debug, Clone)]
pub struct Routes<R> {
    batch: BatchRoute,
    other: R,
}

impl<R> Routes<R> {
    /// `batch` beside `other`.
    pub fn new(batch: BatchRoute, other: R) -> Routes<R> {
        Routes { batch, other }
    }
}

#[async_trait::async_trait]
impl<R: S3Route> S3Route for Routes<R> {
    fn is_match(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        extensions: &mut Extensions,
    ) -> bool {
        is_batch_request(method, uri) || self.other.is_match(method, uri, headers, extensions)
    }

    async fn check_access(&self, req: &mut S3Request<Body>) -> S3Result<()> {
        if is_batch_request(&req.method, &req.uri) {
            self.batch.check_access(req)
        } else {
            self.other.check_access(req).await
        }
    }

    async fn call(&self, req: S3Request<Body>) -> S3Result<S3Response<Body>> {
        if is_batch_request(&req.method, &req.uri) {
            self.batch.call(req).await
        } else {
            self.other.call(req).await
        }
    }
}

/// A refusal of the whole batch, marked as coming from a batch server.
fn refused(status: u16, code: &str, message: impl Into<String>) -> S3Error {
    let code = S3ErrorCode::from_bytes(code.as_bytes())
        .unwrap_or_else(|| S3ErrorCode::Custom(code.to_owned().into()));
    let mut e = S3Error::with_message(code, message.into());
    e.set_status_code(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST));
    let mut h = HeaderMap::new();
    h.insert(
        batch::REPLY_HEADER,
        HeaderValue::from_static(batch::REPLY_VALUE),
    );
    e.set_headers(h);
    e
}

fn batch_error(e: &BatchError) -> S3Error {
    refused(e.http_status(), e.s3_code(), e.to_string())
}

/// The whole batch's signature requirements, beyond s3s's check: a SigV4
/// `Authorization` header (not a presigned URL) whose payload hash is the
/// body's, and the signed dialect marker.
fn check_signed(req: &S3Request<Body>) -> Result<(), &'static str> {
    if req.credentials.is_none() {
        return Err("a batch request must be signed (SigV4) by a user of this server");
    }
    if !matches!(
        req.extensions.get::<AuthClaim>(),
        Some(AuthClaim::V4Header(_))
    ) {
        return Err("a batch request must be signed with SigV4 in the Authorization header");
    }
    let hash = req
        .headers
        .get("x-amz-content-sha256")
        .map(HeaderValue::as_bytes)
        .unwrap_or_default();
    if hash.len() != 64 || !hash.iter().all(u8::is_ascii_hexdigit) {
        return Err(
            "a batch request's body must be signed: x-amz-content-sha256 must be its SHA-256 (not UNSIGNED-PAYLOAD or a streaming payload)",
        );
    }
    let marker = req
        .headers
        .get_all(RDMA_PROTOCOL)
        .iter()
        .collect::<Vec<_>>();
    if marker.len() != 1 || marker[0].as_bytes() != S3DMA_PROTOCOL.as_bytes() {
        return Err("a batch request must carry x-amz-rdma-protocol: s3dma-v1 (signed)");
    }
    Ok(())
}

impl BatchRoute {
    fn check_access(&self, req: &S3Request<Body>) -> S3Result<()> {
        if let Serve::Store(svc) = &self.0
            && let Err(why) = check_signed(req)
        {
            svc.metrics.batch_request("refused");
            return Err(refused(403, "AccessDenied", why));
        }
        // A server that declines answers every signed request 501 (an
        // unsigned one was refused by s3s's default rule: credentials).
        if req.credentials.is_none() {
            return Err(S3Error::with_message(
                S3ErrorCode::AccessDenied,
                "a batch request must be signed (SigV4) by a user of this server",
            ));
        }
        Ok(())
    }

    async fn call(&self, req: S3Request<Body>) -> S3Result<S3Response<Body>> {
        let svc = match &self.0 {
            Serve::Declined(why) => {
                let mut e = S3Error::with_message(
                    S3ErrorCode::NotImplemented,
                    format!("s3dma batch requests are not served here: {why}"),
                );
                e.set_status_code(StatusCode::NOT_IMPLEMENTED);
                let mut h = HeaderMap::new();
                h.insert(
                    s3dma_wire::headers::RDMA_PROTOCOL_STATUS,
                    HeaderValue::from_static("unsupported"),
                );
                e.set_headers(h);
                return Err(e);
            }
            Serve::Store(svc) => svc,
        };
        let r = svc.serve(req).await;
        svc.metrics
            .batch_request(if r.is_ok() { "served" } else { "refused" });
        r
    }
}

/// One (bucket, operation)'s access check: the extensions the handler
/// reads (the bucket's metadata), or the refusal its items get.
type Checked1 = Result<Extensions, Box<ItemReply>>;

/// An item's own check: what it asks for, or its refusal.
type ItemCheck = Result<Checked, Box<ItemReply>>;

impl BatchService {
    async fn serve(self: &Arc<Self>, mut req: S3Request<Body>) -> S3Result<S3Response<Body>> {
        let max_body = usize::try_from(self.cfg.max_body_bytes.0).unwrap_or(batch::MAX_BODY);
        let limits = Limits {
            max_items: self.cfg.max_items,
            max_body,
        };
        let declared = req
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let Some(declared) = declared else {
            return Err(refused(
                411,
                "MissingContentLength",
                "a batch request needs a Content-Length",
            ));
        };
        if declared > max_body as u64 {
            return Err(batch_error(&BatchError::TooLarge {
                len: usize::try_from(declared).unwrap_or(usize::MAX),
                max: max_body,
            }));
        }
        // s3s checks the bytes against x-amz-content-sha256 as they are
        // read: a body other than the signed one fails here.
        let body = req.input.store_all_limited(max_body).await.map_err(|_| {
            refused(
                400,
                "XAmzContentSHA256Mismatch",
                "the batch body could not be read whole, or its SHA-256 is not x-amz-content-sha256",
            )
        })?;
        let parsed = BatchRequest::parse(&body, limits).map_err(|e| batch_error(&e))?;
        let user = req
            .credentials
            .clone()
            .ok_or_else(|| refused(403, "AccessDenied", "a batch request must be signed"))?;
        let checked: Vec<ItemCheck> = parsed
            .items
            .iter()
            .map(|i| {
                i.check()
                    .map_err(|e| Box::new(ItemReply::error(400, e.s3_code(), e.to_string())))
            })
            .collect();
        let window_bytes: u64 = parsed
            .items
            .iter()
            .zip(&checked)
            .filter(|(_, c)| c.is_ok())
            .map(|(i, _)| i.window_bytes())
            .fold(0, u64::saturating_add);
        if window_bytes > self.cfg.max_bytes.0 {
            return Err(refused(
                413,
                "EntityTooLarge",
                format!(
                    "the batch's windows add up to {window_bytes} bytes; at most {} (rdma.batch.max_bytes) are moved by one batch",
                    self.cfg.max_bytes.0
                ),
            ));
        }
        // One access check per (bucket, operation).
        let mut access: HashMap<(&str, Op), Checked1> = HashMap::new();
        for (item, c) in parsed.items.iter().zip(&checked) {
            if c.is_err() {
                continue;
            }
            access
                .entry((item.bucket.as_str(), item.op))
                .or_insert_with(|| {
                    let mut ext = Extensions::new();
                    match self.access.authorize(
                        Some(&user.access_key),
                        item.op.s3_name(),
                        &item.bucket,
                    ) {
                        Ok(info) => {
                            if let Some(info) = info {
                                ext.insert(info);
                            }
                            Ok(ext)
                        }
                        Err(e) => Err(Box::new(item_error(&e))),
                    }
                });
        }
        let jobs: Vec<(ItemCheck, Option<Checked1>)> = parsed
            .items
            .iter()
            .zip(checked)
            .map(|(item, c)| {
                let allowed = c
                    .is_ok()
                    .then(|| access.get(&(item.bucket.as_str(), item.op)).cloned())
                    .flatten();
                (c, allowed)
            })
            .collect();
        drop(access);
        // Each GET and PUT item is a task of its own, so that one batch's
        // transfers use every worker thread (one task would serve them on
        // one core); a HEAD item (an index lookup) runs in place, cheaper
        // than a task. `item_concurrency` run at a time, replies in request
        // order; a batch that is dropped (its caller went away) aborts its
        // items.
        let (svc, user) = (Arc::clone(self), Arc::new(user));
        let runs = parsed
            .items
            .into_iter()
            .zip(jobs)
            .map(move |(item, (c, allowed))| {
                let in_place = item.op == Op::Head;
                let run = Arc::clone(&svc).one(item, c, allowed, Arc::clone(&user));
                if in_place {
                    Either::Left(run)
                } else {
                    Either::Right(AbortOnDropHandle::new(tokio::spawn(run)).map(|r| {
                        r.unwrap_or_else(|e| {
                            ItemReply::error(
                                500,
                                "InternalError",
                                format!("the item did not finish: {e}"),
                            )
                        })
                    }))
                }
            });
        let replies: Vec<ItemReply> = futures::stream::iter(runs)
            .buffered(self.cfg.item_concurrency.max(1))
            .collect()
            .await;
        let failed = replies.iter().filter(|r| !r.ok()).count();
        info!(
            items = replies.len(),
            failed, window_bytes, "s3dma batch served"
        );
        let out = BatchReply::new(replies)
            .encode()
            .map_err(|e| refused(500, "InternalError", e.to_string()))?;
        let mut resp = S3Response::with_status(Body::from(out), StatusCode::OK);
        resp.headers.insert(
            batch::REPLY_HEADER,
            HeaderValue::from_static(batch::REPLY_VALUE),
        );
        resp.headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(batch::CONTENT_TYPE),
        );
        Ok(resp)
    }

    /// One item: its check's refusal, its bucket's (`allowed`: the
    /// extensions of its (bucket, operation)'s access check), or what it
    /// came to.
    async fn one(
        self: Arc<Self>,
        item: Item,
        c: ItemCheck,
        allowed: Option<Checked1>,
        user: Arc<s3s::auth::Credentials>,
    ) -> ItemReply {
        let reply = match (c, allowed) {
            (Err(r), _) => *r,
            (Ok(_), Some(Ok(ext))) if item.op == Op::Head => self.head(&item, &ext, &user).await,
            (Ok(c), Some(Ok(ext))) => self.item(&item, c, ext, &user).await,
            (Ok(_), Some(Err(r))) => *r,
            (Ok(_), None) => ItemReply::error(500, "InternalError", "no access check"),
        };
        self.metrics
            .batch_item(item.op.s3_name(), if reply.ok() { "ok" } else { "error" });
        reply
    }

    /// One item through the single request's handler.
    async fn item(
        &self,
        item: &Item,
        c: Checked,
        ext: Extensions,
        user: &s3s::auth::Credentials,
    ) -> ItemReply {
        if item.op != Op::Head && !self.rdma {
            return ItemReply::error(
                501,
                "RDMANotSupported",
                "RDMA is disabled or unavailable on this server; nothing was moved",
            );
        }
        let run = |c: Checked, ext: Extensions| async move {
            match item.op {
                Op::Head => Ok(self.head(item, &ext, user).await),
                Op::Get => self.get(item, c, ext, user).await,
                Op::Put => self.put(item, ext, user).await,
            }
        };
        // A transfer that failed with its session (flushed, stalled, a
        // reconnect), not for anything of its own, runs again on a fresh
        // session: on RC, another item's access error moves the shared
        // queue pair to the error state and flushes the items beside it,
        // so a batch with k bad items can take k + 1 rounds. A GET
        // rewrites its window and a PUT is stored only whole, so a rerun
        // doubles nothing.
        let mut attempts = 1;
        loop {
            match run(c.clone(), ext.clone()).await {
                Err(e) if is_session_failure(&e) && attempts < SESSION_FAILURE_ATTEMPTS => {
                    attempts += 1;
                }
                r => return r.unwrap_or_else(|e| item_error(&e)),
            }
        }
    }

    /// A HEAD item: from the bucket's index (no file opened, nothing
    /// copied per item but the reply), else, when the object's ACL
    /// decides, through the single request's handler.
    async fn head(
        &self,
        item: &Item,
        ext: &Extensions,
        user: &s3s::auth::Credentials,
    ) -> ItemReply {
        let if_match = match if_match(item) {
            Ok(c) => c,
            Err(e) => return item_error(&e),
        };
        let indexed =
            self.s3
                .head_from_index(ext, &user.access_key, (&item.bucket, &item.key), if_match);
        match indexed {
            Some(Ok(h)) => ItemReply {
                status: 200,
                size: Some(h.size),
                etag: Some(format!("\"{}\"", h.etag)),
                last_modified_ms: Some(h.last_modified_ms),
                content_type: Some(h.content_type),
                metadata: h.metadata,
                ..ItemReply::default()
            },
            Some(Err(e)) => item_error(&e),
            None => self
                .head_by_handler(item, ext.clone(), user)
                .await
                .unwrap_or_else(|e| item_error(&e)),
        }
    }

    async fn head_by_handler(
        &self,
        item: &Item,
        ext: Extensions,
        user: &s3s::auth::Credentials,
    ) -> S3Result<ItemReply> {
        let input = HeadObjectInput::builder()
            .bucket(item.bucket.clone())
            .key(item.key.clone())
            .if_match(if_match(item)?)
            .build()
            .map_err(|e| s3s::s3_error!(InvalidRequest, "{e}"))?;
        let out = self
            .s3
            .head_object(as_user(input, Method::HEAD, HeaderMap::new(), ext, user))
            .await?
            .output;
        Ok(ItemReply {
            status: 200,
            size: out.content_length.and_then(|n| u64::try_from(n).ok()),
            etag: out.e_tag.as_ref().map(quoted),
            last_modified_ms: out.last_modified.map(unix_ms),
            content_type: out.content_type,
            metadata: out.metadata.unwrap_or_default().into_iter().collect(),
            ..ItemReply::default()
        })
    }

    async fn get(
        &self,
        item: &Item,
        c: Checked,
        ext: Extensions,
        user: &s3s::auth::Credentials,
    ) -> S3Result<ItemReply> {
        let range = c
            .range
            .map(|r| Range::parse(&r.header_value()))
            .transpose()
            .map_err(|_| s3s::s3_error!(InvalidRange, "the item's range is invalid"))?;
        let input = GetObjectInput::builder()
            .bucket(item.bucket.clone())
            .key(item.key.clone())
            .range(range)
            .if_match(if_match(item)?)
            .build()
            .map_err(|e| s3s::s3_error!(InvalidRequest, "{e}"))?;
        let resp = self
            .s3
            .get_object(as_user(input, Method::GET, token_headers(item), ext, user))
            .await?;
        let out = resp.output;
        let placed = resp
            .headers
            .get(RDMA_BYTES)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let Some(placed) = placed else {
            // Not served over RDMA: the bytes are not in the window.
            return Err(s3s::s3_error!(
                NotImplemented,
                "the item was not served over RDMA; nothing was placed"
            ));
        };
        let (status, size) = match out
            .content_range
            .as_deref()
            .and_then(s3dma_wire::range::parse_content_range)
        {
            Some((_, _, total)) => (206, total),
            None => (200, placed),
        };
        Ok(ItemReply {
            status,
            size: Some(size),
            etag: out.e_tag.as_ref().map(quoted),
            last_modified_ms: out.last_modified.map(unix_ms),
            content_type: out.content_type,
            metadata: out.metadata.unwrap_or_default().into_iter().collect(),
            bytes: Some(placed),
            ..ItemReply::default()
        })
    }

    async fn put(
        &self,
        item: &Item,
        ext: Extensions,
        user: &s3s::auth::Credentials,
    ) -> S3Result<ItemReply> {
        let metadata = (!item.metadata.is_empty())
            .then(|| item.metadata.clone().into_iter().collect::<HashMap<_, _>>());
        let input = PutObjectInput::builder()
            .bucket(item.bucket.clone())
            .key(item.key.clone())
            .content_type(item.content_type.clone())
            .metadata(metadata)
            .build()
            .map_err(|e| s3s::s3_error!(InvalidRequest, "{e}"))?;
        let resp = self
            .s3
            .put_object(as_user(input, Method::PUT, token_headers(item), ext, user))
            .await?;
        // The handler stores exactly the window's bytes or nothing, and
        // says how many it read.
        let stored = resp
            .headers
            .get(RDMA_BYTES)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let Some(stored) = stored else {
            return Err(s3s::s3_error!(
                InternalError,
                "the item was not stored over RDMA"
            ));
        };
        Ok(ItemReply {
            status: 200,
            size: Some(stored),
            etag: resp.output.e_tag.as_ref().map(quoted),
            bytes: Some(stored),
            ..ItemReply::default()
        })
    }
}

/// The headers a single tokened request of the item would have carried:
/// its token and the dialect marker (both covered by the batch's
/// signature, as the body is).
fn token_headers(item: &Item) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(t) = item
        .token
        .as_deref()
        .and_then(|t| HeaderValue::from_str(t).ok())
    {
        h.insert(RDMA_TOKEN, t);
    }
    h.insert(RDMA_PROTOCOL, HeaderValue::from_static(S3DMA_PROTOCOL));
    h
}

/// An S3 request of one item, as `user`: what the access check left
/// (`ext`) and the record that its token and marker were signed (the
/// batch's body, which carries them, is).
fn as_user<T>(
    input: T,
    method: Method,
    headers: HeaderMap,
    mut ext: Extensions,
    user: &s3s::auth::Credentials,
) -> S3Request<T> {
    ext.insert(AuthClaim::V4Header(vec![
        RDMA_TOKEN.to_owned(),
        RDMA_PROTOCOL.to_owned(),
    ]));
    S3Request {
        input,
        method,
        uri: Uri::from_static("/"),
        headers,
        extensions: ext,
        credentials: Some(user.clone()),
        region: None,
        service: None,
        trailing_headers: None,
    }
}

fn if_match(item: &Item) -> S3Result<Option<ETagCondition>> {
    item.if_match
        .as_deref()
        .map(|v| {
            ETagCondition::parse_http_header(v.as_bytes())
                .map_err(|_| s3s::s3_error!(InvalidArgument, "the item's if_match is not an ETag"))
        })
        .transpose()
}

fn quoted(e: &ETag) -> String {
    format!("\"{}\"", e.value())
}

fn unix_ms(t: Timestamp) -> i64 {
    let t: time::OffsetDateTime = t.into();
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
}

/// An item's failure as its reply: the status and code the single request
/// would have had.
/// Runs of an item whose transfer failed with its session.
const SESSION_FAILURE_ATTEMPTS: u32 = 3;

/// An RDMA transfer failure of the session rather than of the item (a
/// `500 RDMATransferFailed`; the item's own access errors are `400`).
fn is_session_failure(e: &S3Error) -> bool {
    e.code().as_str() == "RDMATransferFailed" && e.status_code().is_none_or(|s| s.is_server_error())
}

fn item_error(e: &S3Error) -> ItemReply {
    let status = e.status_code().map_or(500, |s| s.as_u16());
    ItemReply::error(
        status,
        e.code().as_str(),
        e.message().unwrap_or_default().to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_requests_are_told_apart() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        assert!(is_batch_request(&Method::POST, &uri("/?s3dma-batch")));
        assert!(is_batch_request(&Method::POST, &uri("/?s3dma-batch=")));
        assert!(is_batch_request(&Method::POST, &uri("/?x=1&s3dma-batch")));
        for (m, u) in [
            (Method::GET, "/?s3dma-batch"),
            (Method::POST, "/b?s3dma-batch"),
            (Method::POST, "/?s3dma-batchx"),
            (Method::POST, "/?s3dma-batch=1"),
            (Method::POST, "/"),
        ] {
            assert!(!is_batch_request(&m, &uri(u)), "{m} {u}");
        }
    }

    #[test]
    fn whole_batch_refusals_are_marked() {
        let e = batch_error(&BatchError::TooManyItems { items: 2, max: 1 });
        assert_eq!(e.status_code(), Some(StatusCode::PAYLOAD_TOO_LARGE));
        assert_eq!(e.code().as_str(), "EntityTooLarge");
        let e = refused(403, "AccessDenied", "no");
        assert_eq!(e.code(), &S3ErrorCode::AccessDenied);
        let r = item_error(&s3s::s3_error!(NoSuchKey));
        assert_eq!((r.status, r.code.as_deref()), (404, Some("NoSuchKey")));
    }
}
