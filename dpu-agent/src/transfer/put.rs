//! PutObject: one PUT for small objects, a multipart upload (parts in
//! parallel, each with a token for its slice of the window) for large ones.
//! A declined token (`x-amz-rdma-reply: 501`) or a plain-S3 target sends the
//! bytes as an HTTP body read from the window instead. A failed multipart
//! upload is aborted — also when the request is cancelled — so no partial
//! object ever becomes visible.

use std::collections::HashMap;
use std::sync::Arc;

use fabric::RdmaToken;
use futures::StreamExt as _;
use http::{Method, StatusCode};
use s3dma_proto::agent::v1::TransferPath;
use tracing::{debug, warn};

use s3dma_wire::headers::{RDMA_REPLY, RdmaReply, bytes_transferred_of};

use super::ctx::Ctx;
use super::dialect::{SentToken, Transfer};
use super::exchange::{Attempt, Exchange, parse_xml, read_body};
use super::fallback;
use crate::error::{AgentError, BadReply, BadRequest};
use crate::plan::{self, Part, PutPlan};
use crate::s3::client::{S3Call, full_body, header, read_small};
use crate::s3::xml;

/// A PutObject request after validation.
#[derive(Debug, Clone)]
pub struct PutRequest {
    /// Bucket.
    pub bucket: String,
    /// Key.
    pub key: String,
    /// The source window (the object is exactly its bytes).
    pub src: RdmaToken,
    /// Content-Type to store.
    pub content_type: Option<String>,
    /// User metadata.
    pub metadata: HashMap<String, String>,
}

/// What a PUT did.
#[derive(Debug, Clone)]
pub struct PutResult {
    /// The stored object's ETag.
    pub etag: String,
    /// Its size.
    pub size: u64,
    /// Parts (0 = single PUT).
    pub parts: u32,
    /// How the bytes moved.
    pub path: TransferPath,
}

/// Aborts an unfinished multipart upload when dropped (error or cancel).
struct AbortGuard {
    ctx: Option<Arc<Exchange>>,
    bucket: String,
    key: String,
    upload_id: String,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        let Some(ctx) = self.ctx.take() else {
            return;
        };
        let (bucket, key, upload_id) = (
            std::mem::take(&mut self.bucket),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.upload_id),
        );
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                // The upload failed most likely because the target is down
                // or unreachable, so one round of retries is often too
                // short: keep trying (past the request, which has ended)
                // for as long as a request may run, or the parts stay on
                // the target's disk.
                let s = &ctx.core.settings;
                let give_up = tokio::time::Instant::now() + s.request_timeout;
                let r = loop {
                    let r = ctx
                        .retrying("AbortMultipartUpload", || async {
                            let mut call = S3Call::new(Method::DELETE, &bucket, Some(&key));
                            call.query.push(("uploadId", Some(upload_id.clone())));
                            let reply = ctx.send(call).await?;
                            match reply.status() {
                                StatusCode::NO_CONTENT
                                | StatusCode::OK
                                | StatusCode::NOT_FOUND => Ok(()),
                                _ => Err(ctx.failure(reply).await),
                            }
                        })
                        .await;
                    let transient = match &r {
                        Err(AgentError::Unavailable { .. }) => true,
                        Err(AgentError::S3(e)) => crate::retry::retryable_status(e.http_status),
                        _ => false,
                    };
                    if !transient || tokio::time::Instant::now() + s.retry.max >= give_up {
                        break r;
                    }
                    tokio::time::sleep(s.retry.max).await;
                };
                match r {
                    Ok(()) => debug!(bucket = %s3dma_service::Escaped(&bucket), "aborted multipart upload"),
                    Err(e) => warn!(id = %ctx.request_id, tenant = %ctx.tenant.name, bucket = %s3dma_service::Escaped(&bucket), error = %s3dma_service::Escaped(&e.to_string()), "aborting a multipart upload failed; its parts stay on the target until it is aborted there"),
                }
            });
        }
    }
}

fn put_headers(call: &mut S3Call, req: &PutRequest) -> Result<(), AgentError> {
    if let Some(ct) = &req.content_type {
        call.header("content-type", ct).map_err(|e| {
            AgentError::InvalidArgument(BadRequest::Header {
                field: "content_type",
                reason: e.to_string(),
            })
        })?;
    }
    for (k, v) in &req.metadata {
        let name = format!("x-amz-meta-{}", k.to_ascii_lowercase());
        let name = http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            AgentError::InvalidArgument(BadRequest::MetadataName { name: k.clone() })
        })?;
        let value = http::HeaderValue::from_str(v).map_err(|_| {
            AgentError::InvalidArgument(BadRequest::MetadataValue { name: k.clone() })
        })?;
        call.headers.insert(name, value);
    }
    Ok(())
}

/// Sends the bytes of `slot` as one PUT (or UploadPart when `part` is
/// given); returns the ETag and whether the fallback path was used.
async fn put_bytes(
    ctx: &Ctx,
    req: &PutRequest,
    slot: RdmaToken,
    part: Option<(u32, &str)>,
) -> Result<(String, bool), AgentError> {
    let build = |token: Option<&SentToken>| -> Result<S3Call, AgentError> {
        let mut call = S3Call::new(Method::PUT, &req.bucket, Some(&req.key));
        match part {
            Some((n, upload_id)) => {
                call.query.push(("partNumber", Some(n.to_string())));
                call.query.push(("uploadId", Some(upload_id.to_owned())));
            }
            None => put_headers(&mut call, req)?,
        }
        if let Some(t) = token {
            t.apply(&mut call);
        }
        Ok(call)
    };
    let len = u64::from(slot.size);
    let ex = &ctx.ex;
    // The dialect's own way first (a hipobj-rc-v2 transfer).
    let t = Transfer {
        bucket: &req.bucket,
        key: &req.key,
        part,
        offset: 0,
        slot,
    };
    if let Some(etag) = ctx.dialect.put(ex, &t).await? {
        return Ok((etag, false));
    }
    // A token in the target's dialect (s3dma's, or a standard one the
    // shim minted); none for hipobj-rc-v2 (done above) or plain HTTP.
    if let Some(token) = ctx.dialect.token(ex, &slot).await? {
        let outcome = ex
            .retrying("PUT", || async {
                let mut call = build(Some(&token))?;
                call.body = Some(full_body(bytes::Bytes::new()));
                let reply = ex.send(call).await?;
                if reply.status() != StatusCode::OK {
                    return Err(ex.failure(reply).await);
                }
                let rdma_reply = RdmaReply::parse(header(reply.headers(), RDMA_REPLY).as_deref());
                // A server that moved fewer bytes than the token holds
                // must not have stored them; one that says so anyway is
                // not believed.
                let moved =
                    bytes_transferred_of(|h| reply.headers().get(h).and_then(|v| v.to_str().ok()));
                if rdma_reply == RdmaReply::Placed && moved.is_some_and(|m| m != len) {
                    return Err(Attempt::Fatal(AgentError::Protocol(
                        BadReply::BytesTransferred { moved, len },
                    )));
                }
                let etag = header(reply.headers(), "etag").unwrap_or_default();
                let _ = read_small(reply, 64 << 10).await;
                Ok((rdma_reply, etag))
            })
            .await?;
        match outcome {
            (RdmaReply::Placed, etag) => return Ok((etag, false)),
            (RdmaReply::Declined, _) => {
                debug!(target = %ex.target.name, "target declined RDMA for PUT; sending over HTTP");
            }
            (RdmaReply::Ignored(other), _) => {
                warn!(id = %ex.request_id, tenant = %ex.tenant.name, target = %ex.target.name, reply = ?other, "target ignored x-amz-rdma-token on PUT (it may have stored an empty object); rewriting over HTTP — configure it with rdma: false");
            }
        }
    }
    let etag = ex
        .retrying("PUT (HTTP body)", || async {
            let mut call = build(None)?;
            let (body, failure) = fallback::window_body(&ex.core, &ex.tenant, slot, len);
            call.body = Some(body);
            let sent = ex.send(call).await;
            let taken = failure
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(e) = taken {
                // Reading the tenant's window failed: retrying cannot help.
                return Err(Attempt::Fatal(e));
            }
            let reply = sent?;
            if reply.status() != StatusCode::OK {
                return Err(ex.failure(reply).await);
            }
            let etag = header(reply.headers(), "etag").unwrap_or_default();
            let _ = read_small(reply, 64 << 10).await;
            Ok(etag)
        })
        .await?;
    Ok((etag, true))
}

/// Runs a PutObject.
///
/// # Errors
/// Any [`AgentError`]; a failed upload leaves the previous object (if
/// any) in place.
pub async fn put_object(ctx: &Ctx, req: &PutRequest) -> Result<PutResult, AgentError> {
    let size = u64::from(req.src.size);
    let plan = plan::plan_put(size, ctx.ex.core.settings.put)?;
    match plan {
        PutPlan::Single => {
            let _bytes = ctx.ex.tenant.quota.admit_bytes(size).await;
            let (etag, fb) = put_bytes(ctx, req, req.src, None).await?;
            Ok(PutResult {
                etag,
                size,
                parts: 0,
                path: super::path_of(!fb, fb),
            })
        }
        PutPlan::Multipart { parts, .. } => put_multipart(ctx, req, &parts).await,
    }
}

async fn put_multipart(
    ctx: &Ctx,
    req: &PutRequest,
    parts: &[Part],
) -> Result<PutResult, AgentError> {
    let ex = &ctx.ex;
    let upload_id = ex
        .retrying("CreateMultipartUpload", || async {
            let mut call = S3Call::new(Method::POST, &req.bucket, Some(&req.key));
            call.query.push(("uploads", None));
            put_headers(&mut call, req)?;
            let reply = ex.send(call).await?;
            if reply.status() != StatusCode::OK {
                return Err(ex.failure(reply).await);
            }
            let (_, body) = read_body(reply, 64 << 10).await?;
            let r: xml::InitiateMultipartUploadResult = parse_xml(&body, "CreateMultipartUpload")?;
            if r.upload_id.is_empty() {
                return Err(Attempt::Fatal(AgentError::Protocol(BadReply::NoUploadId)));
            }
            Ok(r.upload_id)
        })
        .await?;
    let mut guard = AbortGuard {
        ctx: Some(Arc::clone(ex)),
        bucket: req.bucket.clone(),
        key: req.key.clone(),
        upload_id: upload_id.clone(),
    };
    let mut etags: Vec<(u32, String)> = Vec::with_capacity(parts.len());
    let mut any_fallback = false;
    let mut any_rdma = false;
    {
        let upload_id = upload_id.as_str();
        let mut results = futures::stream::iter(parts.iter().copied())
            .map(|p| async move {
                let _bytes = ex.tenant.quota.admit_bytes(p.len).await;
                let slot = req
                    .src
                    .slice(p.offset, p.len)
                    .map_err(|e| AgentError::internal_from("a part of the tenant's window", e))?;
                let (etag, fb) = put_bytes(ctx, req, slot, Some((p.number, upload_id))).await?;
                if etag.is_empty() {
                    return Err(AgentError::Protocol(BadReply::PartWithoutEtag {
                        part: p.number,
                    }));
                }
                Ok::<_, AgentError>((p.number, etag, fb))
            })
            .buffer_unordered(ex.core.settings.max_chunks_in_flight.max(1));
        while let Some(r) = results.next().await {
            let (n, etag, fb) = r?;
            any_fallback |= fb;
            any_rdma |= !fb;
            etags.push((n, etag));
        }
    }
    etags.sort_unstable_by_key(|(n, _)| *n);
    let body = xml::complete_body(
        etags
            .into_iter()
            .map(|(part_number, etag)| xml::CompletedPart { part_number, etag })
            .collect(),
    )
    .map_err(|e| AgentError::internal_from("the CompleteMultipartUpload body", e))?;
    let body = bytes::Bytes::from(body);
    let etag = ex
        .retrying("CompleteMultipartUpload", || async {
            let mut call = S3Call::new(Method::POST, &req.bucket, Some(&req.key));
            call.query.push(("uploadId", Some(upload_id.clone())));
            call.body = Some(full_body(body.clone()));
            let reply = ex.send(call).await?;
            if reply.status() != StatusCode::OK {
                return Err(ex.failure(reply).await);
            }
            let (parts, body) = read_body(reply, 1 << 20).await?;
            // S3 may answer 200 and report the failure in the body.
            if xml::root_name(&body).as_deref() == Some("Error") {
                let e = crate::s3::client::error_from_parts(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &header(&parts.headers, "x-amz-request-id").unwrap_or_default(),
                    &body,
                );
                return Err(Attempt::Retry(AgentError::S3(e), "status"));
            }
            let r: xml::CompleteMultipartUploadResult =
                parse_xml(&body, "CompleteMultipartUpload")?;
            Ok(r.etag)
        })
        .await?;
    guard.ctx = None; // completed: nothing to abort
    Ok(PutResult {
        etag,
        size: u64::from(req.src.size),
        parts: u32::try_from(parts.len()).unwrap_or(u32::MAX),
        path: super::path_of(any_rdma, any_fallback),
    })
}
