//! PutObject: one PUT for small objects, a multipart upload (parts in
//! parallel, each with a token for its slice of the window) for large ones.
//! A declined token (`x-amz-rdma-reply: 501`) or a plain-S3 target sends the
//! bytes as an HTTP body read from the window instead. A failed multipart
//! upload is aborted — also when the request is cancelled — so no partial
//! object ever becomes visible.
//!
//! A stored object is what was sent, or the call fails: after every
//! CompleteMultipartUpload (every dialect, and HTTP) the agent HEADs the
//! object and checks its size, and the part count where its ETag has the
//! `"…-N"` form (an opaque ETag by size alone); a single PUT moved by RDMA
//! is checked by the byte count its reply reports, or by a HEAD when the
//! reply reports none (`verify_stored`). On a mismatch the call fails
//! with [`BadReply::StoredMismatch`], naming what the server does, and the
//! wrong object is deleted (`If-Match` its ETag, so a concurrent writer's
//! object stays): it holds bytes no caller sent, and a reader is better
//! served by `NoSuchKey` than by them. A target found storing short an
//! upload whose parts went by RDMA ignores the part target (it stores each
//! part as the whole object, as elbencho's `s3rdma-server` does): it is
//! remembered ([`TargetClient::parts_over_http`], also set up front by
//! `multipart_parts: http`) and its later multipart PUTs send their parts
//! over HTTP.
//!
//! [`TargetClient::parts_over_http`]: crate::s3::TargetClient::parts_over_http

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

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
    /// The window on the shim's other rails (`src` is rail 0), if any.
    pub rails: Option<Arc<super::rails::RailSet>>,
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

/// How one PUT or part went.
struct Sent {
    /// The ETag the target answered.
    etag: String,
    /// Whether its bytes went over HTTP (the fallback path).
    fallback: bool,
    /// Whether the target reported the bytes it stored (an HTTP body's
    /// length, a dialect's byte count); `false`: placed by RDMA with no
    /// count in the reply, so only a HEAD can tell.
    counted: bool,
}

/// Sends the `len` bytes at `offset` of the source window as one PUT (or
/// UploadPart when `part` is given), over HTTP alone when `http_only`:
/// over one of the request's rails (redone on another when its rail
/// fails, [`super::rails`]) when it has several and the target's dialect
/// moves parts over any, else from the one window.
async fn put_range(
    ctx: &Ctx,
    req: &PutRequest,
    offset: u64,
    len: u64,
    part: Option<(u32, &str)>,
    http_only: bool,
) -> Result<Sent, AgentError> {
    let attempt = |slot: RdmaToken, fast: bool| async move {
        put_bytes(ctx, req, slot, part, http_only, fast)
            .await
            .map(|sent| (sent, len))
    };
    let sent = match req.rails.as_deref().filter(|_| ctx.dialect.rails()) {
        Some(set) => {
            let core = &ctx.ex.core;
            core.rails
                // A failed part's target only read the window: nothing
                // lands late, the redo need not wait.
                .run(core, set, "put", (offset, len), None, attempt)
                .await?
        }
        None => {
            let slot = req
                .src
                .slice(offset, len)
                .map_err(|e| AgentError::internal_from("a part of the tenant's window", e))?;
            attempt(slot, false).await?
        }
    };
    Ok(sent.0)
}

/// Sends the bytes of `slot` as one PUT (or UploadPart when `part` is
/// given), over HTTP alone when `http_only`; `fast`: on one of several
/// rails ([`Exchange::retrying_on_rail`]).
async fn put_bytes(
    ctx: &Ctx,
    req: &PutRequest,
    slot: RdmaToken,
    part: Option<(u32, &str)>,
    http_only: bool,
    fast: bool,
) -> Result<Sent, AgentError> {
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
        fast,
    };
    if !http_only && let Some(etag) = ctx.dialect.put(ex, &t).await? {
        // The dialect checked the byte count of its final reply.
        return Ok(Sent {
            etag,
            fallback: false,
            counted: true,
        });
    }
    // A token in the target's dialect (s3dma's, or a standard one the
    // shim minted); none for hipobj-rc-v2 (done above) or plain HTTP.
    let token = if http_only {
        None
    } else {
        ctx.dialect.token(ex, &slot).await?
    };
    if let Some(token) = token {
        let outcome = ex
            .retrying_on_rail("PUT", fast, || async {
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
                    ex.core
                        .metrics
                        .stored_mismatch(&ex.target.name, "bytes_transferred");
                    return Err(Attempt::Fatal(AgentError::Protocol(
                        BadReply::BytesTransferred { moved, len },
                    )));
                }
                let etag = header(reply.headers(), "etag").unwrap_or_default();
                let _ = read_small(reply, 64 << 10).await;
                Ok((rdma_reply, etag, moved.is_some()))
            })
            .await?;
        match outcome {
            (RdmaReply::Placed, etag, counted) => {
                return Ok(Sent {
                    etag,
                    fallback: false,
                    counted,
                });
            }
            (RdmaReply::Declined, _, _) => {
                debug!(target = %ex.target.name, "target declined RDMA for PUT; sending over HTTP");
            }
            (RdmaReply::Ignored(other), _, _) => {
                warn!(id = %ex.request_id, tenant = %ex.tenant.name, target = %ex.target.name, reply = ?other, "target ignored x-amz-rdma-token on PUT (it may have stored an empty object); rewriting over HTTP — configure it with rdma: false");
            }
        }
    }
    let etag = ex
        .retrying_on_rail("PUT (HTTP body)", fast, || async {
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
    Ok(Sent {
        etag,
        fallback: true,
        counted: true,
    })
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
            let sent = put_range(ctx, req, 0, size, None, false).await?;
            if !sent.counted {
                verify_stored(ctx, req, 0, false).await?;
            }
            let fb = sent.fallback;
            Ok(PutResult {
                etag: sent.etag,
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
    // A target known to ignore the part target (or configured so) gets
    // its parts over HTTP.
    let http_only = ex.target.parts_over_http.load(Ordering::Relaxed);
    {
        let upload_id = upload_id.as_str();
        let mut results = futures::stream::iter(parts.iter().copied())
            .map(|p| async move {
                let _bytes = ex.tenant.quota.admit_bytes(p.len).await;
                let sent = put_range(
                    ctx,
                    req,
                    p.offset,
                    p.len,
                    Some((p.number, upload_id)),
                    http_only,
                )
                .await?;
                let (etag, fb) = (sent.etag, sent.fallback);
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
    let count = u32::try_from(parts.len()).unwrap_or(u32::MAX);
    verify_stored(ctx, req, count, any_rdma).await?;
    Ok(PutResult {
        etag,
        size: u64::from(req.src.size),
        parts: count,
        path: super::path_of(any_rdma, any_fallback),
    })
}

/// The part count an ETag of the `"<32 hex>-N"` form names (S3's
/// multipart ETag); `None` for any other (opaque) ETag.
fn etag_part_count(etag: &str) -> Option<u64> {
    let e = etag.trim().trim_matches('"');
    let (digest, n) = e.rsplit_once('-')?;
    if digest.len() != 32 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// Checks, by a HEAD, that the object `req` wrote holds what was sent: its
/// size, and for an upload of `parts` parts (0: a single PUT) the part
/// count its ETag names when it has the `-N` form. On a mismatch the
/// wrong object is deleted (`If-Match` its ETag) and the call fails; when
/// the parts went by RDMA (`rdma_parts`) the target is remembered as
/// ignoring the part target.
async fn verify_stored(
    ctx: &Ctx,
    req: &PutRequest,
    parts: u32,
    rdma_parts: bool,
) -> Result<(), AgentError> {
    let ex = &ctx.ex;
    let sent = u64::from(req.src.size);
    let (stored, etag) = match super::meta::head_object(ex, &req.bucket, &req.key, None).await {
        Ok(info) => (Some(info.size), info.etag),
        // Answered 200, yet nothing is there.
        Err(AgentError::S3(e)) if e.code == "NoSuchKey" => (None, String::new()),
        Err(e) => return Err(e),
    };
    let etag_parts = if parts > 0 {
        etag_part_count(&etag)
    } else {
        None
    };
    let size_ok = stored == Some(sent);
    let parts_ok = etag_parts.is_none_or(|n| n == u64::from(parts));
    if size_ok && parts_ok {
        return Ok(());
    }
    let target = &ex.target;
    ex.core
        .metrics
        .stored_mismatch(&target.name, if size_ok { "parts" } else { "size" });
    let behaviour = if parts == 0 {
        "it answered the RDMA PUT with success but did not store the bytes it was sent"
    } else if rdma_parts {
        let first = !target.parts_over_http.swap(true, Ordering::Relaxed);
        if first {
            ex.core.metrics.parts_over_http(&target.name, true);
            warn!(id = %ex.request_id, tenant = %ex.tenant.name, target = %target.name, stored = ?stored, sent, parts, "the target stored a multipart upload short: it ignores the part target of parts sent by RDMA; its later multipart PUTs send their parts over HTTP (configure it with multipart_parts: http)");
        }
        "it ignores the part target of parts sent by RDMA and stores each part as the whole \
         object (as elbencho's s3rdma-server does); its later multipart PUTs send their parts \
         over HTTP (configure multipart_parts: http to skip this failure), so retry the PUT"
    } else {
        "it did not assemble the parts it was sent over HTTP into the object"
    };
    let left = if stored.is_none() {
        "no object is there"
    } else if delete_wrong(ex, &req.bucket, &req.key, &etag).await {
        "the wrong object was deleted"
    } else {
        "deleting the wrong object failed: delete it at the target"
    };
    Err(AgentError::Protocol(BadReply::StoredMismatch {
        stored: stored.unwrap_or(0),
        sent,
        etag_parts,
        parts,
        behaviour,
        left,
    }))
}

/// Deletes the wrong object `etag` names (`If-Match`: a server that
/// honours it keeps a concurrent writer's object); whether it went.
async fn delete_wrong(ex: &Exchange, bucket: &str, key: &str, etag: &str) -> bool {
    let r = ex
        .retrying("DELETE (wrong object)", || async {
            let mut call = S3Call::new(Method::DELETE, bucket, Some(key));
            if !etag.is_empty() {
                super::exchange::set_if_match(&mut call, etag)?;
            }
            let reply = ex.send(call).await?;
            match reply.status() {
                StatusCode::NO_CONTENT | StatusCode::OK => {
                    let _ = read_small(reply, 64 << 10).await;
                    Ok(())
                }
                _ => Err(ex.failure(reply).await),
            }
        })
        .await;
    if let Err(e) = &r {
        warn!(id = %ex.request_id, target = %ex.target.name, bucket = %s3dma_service::Escaped(bucket), error = %s3dma_service::Escaped(&e.to_string()), "deleting an object stored short failed; it stays at the target");
    }
    r.is_ok()
}

#[cfg(test)]
mod tests {
    use super::etag_part_count;

    #[test]
    fn only_s3_multipart_etags_name_a_part_count() {
        assert_eq!(
            etag_part_count("\"9b2cf535f27731c974343645a3985328-3\""),
            Some(3)
        );
        assert_eq!(
            etag_part_count("9b2cf535f27731c974343645a3985328-12"),
            Some(12)
        );
        // Opaque ETags: checked by size alone.
        for e in [
            "\"9b2cf535f27731c974343645a3985328\"",
            "\"abc-3\"",
            "\"9b2cf535f27731c974343645a3985328-\"",
            "\"9b2cf535f27731c974343645a398532z-3\"",
            "\"9b2cf535f27731c974343645a3985328-3a\"",
            "",
        ] {
            assert_eq!(etag_part_count(e), None, "{e}");
        }
    }
}
