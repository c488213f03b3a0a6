//! GetObject: probe (first chunk or HEAD) for size and ETag, then the rest
//! in parallel ranged GETs, each with `If-Match: <etag>` and a token for
//! its slice of the window. With a group of targets, each chunk goes to its
//! rendezvous choice ([`s3dma_wire::rendezvous`]), skipping targets that
//! are cooling down.

use std::sync::Arc;

use fabric::RdmaToken;
use futures::StreamExt as _;
use http::{Method, StatusCode};
use s3dma_proto::agent::v1::{ObjectInfo, TransferPath};

use s3dma_wire::headers::{RDMA_REPLY, RdmaReply, bytes_transferred_of};
use s3dma_wire::range::{ByteRange, parse_content_range};

use super::ctx::Ctx;
use super::dialect::Transfer;
use super::exchange::{Attempt, set_if_match};
use super::rails::RailSet;
use super::{fallback, meta, object_info};
use crate::error::{AgentError, BadReply, BadRequest};
use crate::plan::{self, Chunk, Probe, ProbeOutcome};
use crate::s3::client::{S3Call, error_of, header, read_small};

/// A GetObject request after validation.
#[derive(Debug, Clone)]
pub struct GetRequest {
    /// Bucket.
    pub bucket: String,
    /// Key.
    pub key: String,
    /// Which bytes.
    pub range: Option<ByteRange>,
    /// The destination window.
    pub dest: RdmaToken,
    /// Required ETag, if any.
    pub if_match: Option<String>,
    /// The window on the shim's other rails (`dest` is rail 0), if any.
    pub rails: Option<Arc<RailSet>>,
}

/// What a GET did.
#[derive(Debug, Clone)]
pub struct GetResult {
    /// The object.
    pub info: ObjectInfo,
    /// Bytes placed at the start of the window.
    pub placed: u64,
    /// Object offset of the first placed byte.
    pub start: u64,
    /// How the bytes moved.
    pub path: TransferPath,
}

/// What one ranged GET placed.
#[derive(Debug, Clone)]
struct RangeReply {
    info: ObjectInfo,
    /// (first, len, total size).
    first: u64,
    len: u64,
    total: u64,
    fallback: bool,
}

/// One ranged GET placing at most `slot.size` bytes into `slot`.
async fn get_range(
    at: &Ctx,
    req: &GetRequest,
    range: ByteRange,
    slot: RdmaToken,
    if_match: Option<&str>,
) -> Result<RangeReply, Attempt> {
    let mut call = S3Call::new(Method::GET, &req.bucket, Some(&req.key));
    call.header("range", &range.header_value()).map_err(|e| {
        AgentError::InvalidArgument(BadRequest::Unsendable {
            reason: e.to_string(),
        })
    })?;
    if let Some(m) = if_match {
        set_if_match(&mut call, m)?;
    }
    // A token in the target's dialect: s3dma's with its marker, or a
    // standard one the shim minted (a hipobj-rc-v2 target that declined,
    // or whose shim has no device, gets none).
    let sent = at.dialect.token(&at.ex, &slot).await?;
    let tokened = sent.is_some();
    if let Some(t) = &sent {
        t.apply(&mut call);
    }
    let reply = at.ex.send(call).await?;
    let status = reply.status();
    if status == StatusCode::PRECONDITION_FAILED {
        let e = error_of(reply).await;
        return Err(Attempt::Fatal(match if_match {
            Some(etag) if req.if_match.as_deref() != Some(etag) => AgentError::ObjectChanged {
                etag: etag.to_owned(),
            },
            _ => AgentError::S3(e),
        }));
    }
    if !(status == StatusCode::OK || status == StatusCode::PARTIAL_CONTENT) {
        return Err(at.ex.failure(reply).await);
    }
    // The headers taken out of the reply (no copy), which stays whole for
    // its body.
    let (mut parts, body) = reply.into_parts();
    let headers = std::mem::take(&mut parts.headers);
    let reply = http::Response::from_parts(parts, body);
    let (first, len, total) = match header(&headers, "content-range") {
        Some(cr) => parse_content_range(&cr)
            .ok_or_else(|| AgentError::Protocol(BadReply::BadContentRange { value: cr.clone() }))?,
        None => {
            let n = header(&headers, "content-length")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            // A 200 without Content-Range is the whole object (RDMA
            // replies carry the size as bytes transferred).
            let n = if status == StatusCode::OK && tokened {
                bytes_transferred_of(|h| headers.get(h).and_then(|v| v.to_str().ok())).unwrap_or(n)
            } else {
                n
            };
            (0, n, n)
        }
    };
    if len > u64::from(slot.size) {
        return Err(Attempt::Fatal(AgentError::Protocol(
            BadReply::SlotOverrun {
                len,
                slot: slot.size,
            },
        )));
    }
    let info = object_info(&headers, total);
    let rdma_reply = RdmaReply::parse(header(&headers, RDMA_REPLY).as_deref());
    if let (true, RdmaReply::Ignored(other)) = (tokened, &rdma_reply) {
        return Err(Attempt::Fatal(AgentError::Protocol(
            BadReply::NoRdmaReply {
                reply: other.clone(),
            },
        )));
    }
    let by_rdma = tokened && rdma_reply == RdmaReply::Placed;
    if by_rdma {
        let moved = bytes_transferred_of(|h| headers.get(h).and_then(|v| v.to_str().ok()));
        if moved != Some(len) {
            return Err(Attempt::Fatal(AgentError::Protocol(
                BadReply::BytesTransferred { moved, len },
            )));
        }
        // Drain the (empty) body so the connection is reused.
        let _ = read_small(reply, 1 << 10).await;
    } else {
        let slice = slot
            .slice(0, len)
            .map_err(|e| AgentError::internal_from("a slice of the tenant's window", e))?;
        fallback::body_into_window(&at.ex.core, &at.ex.tenant, reply.into_body(), slice, len)
            .await?;
    }
    Ok(RangeReply {
        info,
        first,
        len,
        total,
        fallback: !by_rdma,
    })
}

async fn head_probe(ctx: &Ctx, req: &GetRequest) -> Result<ObjectInfo, AgentError> {
    meta::head_object(&ctx.ex, &req.bucket, &req.key, req.if_match.as_deref()).await
}

/// Runs a GetObject.
///
/// # Errors
/// Any [`AgentError`]; bytes may have been placed in the window even
/// then (the window belongs to this request only).
pub async fn get_object(ctx: &Arc<Ctx>, req: &GetRequest) -> Result<GetResult, AgentError> {
    let s = &ctx.ex.core.settings;
    let window = u64::from(req.dest.size);
    let probe = plan::probe(req.range, window, s.chunk_size)?;
    // A hipobj-rc-v2 transfer names its offset and size: the object's
    // size comes first, from a HEAD.
    let probe = if ctx.dialect.size_first() {
        Probe::Head
    } else {
        probe
    };
    let mut fell_back = false;
    let mut rdma_used = false;
    let (info, outcome) = match probe {
        Probe::Get { range, max_len } => {
            let attempt = |slot: RdmaToken, fast: bool| async move {
                let r =
                    ctx.ex
                        .retrying_on_rail("GET", fast, || {
                            // Each attempt asks again: a target of a group
                            // that gave no answer is cooling down.
                            let at = ctx.for_chunk(&req.bucket, &req.key, 0);
                            async move {
                                get_range(&at, req, range, slot, req.if_match.as_deref()).await
                            }
                        })
                        .await?;
                let n = r.len;
                Ok((r, n))
            };
            let first = match rails_of(ctx, req) {
                Some(set) => {
                    let core = &ctx.ex.core;
                    let late = ctx.dialect.late_writes();
                    core.rails
                        .run(core, set, "get", (0, max_len), late, attempt)
                        .await
                }
                None => {
                    let slot = req.dest.slice(0, max_len).map_err(|e| {
                        AgentError::internal_from("a slice of the tenant's window", e)
                    })?;
                    attempt(slot, false).await
                }
            }
            .map(|(r, _)| r);
            match first {
                Ok(r) => {
                    fell_back |= r.fallback;
                    rdma_used |= !r.fallback;
                    let outcome = ProbeOutcome {
                        total_size: r.total,
                        placed: Some((r.first, r.len)),
                    };
                    (r.info, outcome)
                }
                Err(AgentError::S3(e))
                    if e.http_status == 416 && plan::retry_unsatisfiable_with_head(req.range) =>
                {
                    let info = head_probe(ctx, req).await?;
                    let outcome = ProbeOutcome {
                        total_size: info.size,
                        placed: None,
                    };
                    (info, outcome)
                }
                Err(AgentError::S3(e)) if e.http_status == 416 => {
                    return Err(AgentError::RangeNotSatisfiable { message: e.message });
                }
                Err(e) => return Err(e),
            }
        }
        Probe::Head => {
            let info = head_probe(ctx, req).await?;
            let outcome = ProbeOutcome {
                total_size: info.size,
                placed: None,
            };
            (info, outcome)
        }
    };
    let plan = plan::plan_get(req.range, window, s.chunk_size, &outcome)?;
    let etag = info.etag.clone();
    if !plan.chunks.is_empty() && etag.is_empty() {
        return Err(AgentError::Protocol(BadReply::NoEtag));
    }
    let mut results = futures::stream::iter(plan.chunks.iter().copied())
        .map(|c| get_chunk(ctx, req, c, &etag, outcome.total_size))
        .buffer_unordered(s.max_chunks_in_flight.max(1));
    while let Some(r) = results.next().await {
        let fb = r?;
        fell_back |= fb;
        rdma_used |= !fb;
    }
    let path = super::path_of(rdma_used, fell_back);
    Ok(GetResult {
        info,
        placed: plan.len,
        start: plan.start,
        path,
    })
}

/// One chunk after the probe: quota, bandwidth, retries.
async fn get_chunk(
    ctx: &Arc<Ctx>,
    req: &GetRequest,
    c: Chunk,
    etag: &str,
    total: u64,
) -> Result<bool, AgentError> {
    let _bytes = ctx.ex.tenant.quota.admit_bytes(c.len).await;
    // A group spreads an object's chunks over its targets (each caches
    // its share); every attempt asks again which target is first.
    let index = c.object_first / ctx.ex.core.settings.chunk_size.max(1);
    let attempt = |slot: RdmaToken, fast: bool| async move {
        let r = ctx
            .ex
            .retrying_on_rail("GET chunk", fast, || {
                let at = ctx.for_chunk(&req.bucket, &req.key, index);
                async move {
                    // The dialect's own way first (a hipobj-rc-v2
                    // transfer), else a ranged GET with its token.
                    let t = Transfer {
                        bucket: &req.bucket,
                        key: &req.key,
                        part: None,
                        offset: c.object_first,
                        slot,
                        fast,
                    };
                    if at.dialect.get_chunk(&at.ex, &t, etag).await? {
                        return Ok(RangeReply {
                            info: ObjectInfo::default(),
                            first: c.object_first,
                            len: c.len,
                            total,
                            fallback: false,
                        });
                    }
                    get_range(&at, req, c.http_range(), slot, Some(etag)).await
                }
            })
            .await?;
        let n = r.len;
        Ok((r, n))
    };
    // Over one of the request's rails (redone on another when its rail
    // fails), or the one window.
    let (r, _) = match rails_of(ctx, req) {
        Some(set) => {
            let core = &ctx.ex.core;
            core.rails
                .run(
                    core,
                    set,
                    "get",
                    (c.window_offset, c.len),
                    ctx.dialect.late_writes(),
                    attempt,
                )
                .await?
        }
        None => {
            let slot = req
                .dest
                .slice(c.window_offset, c.len)
                .map_err(|e| AgentError::internal_from("a slice of the tenant's window", e))?;
            attempt(slot, false).await?
        }
    };
    if r.first != c.object_first || r.len != c.len || r.total != total {
        return Err(AgentError::Protocol(BadReply::RangeMismatch {
            first: c.object_first,
            len: c.len,
            total,
            got_first: r.first,
            got_len: r.len,
            got_total: r.total,
        }));
    }
    Ok(r.fallback)
}

/// The request's rails when its target's dialect moves chunks over any of
/// them ([`super::dialect::ChunkMover::rails`]).
fn rails_of<'a>(ctx: &Ctx, req: &'a GetRequest) -> Option<&'a RailSet> {
    req.rails.as_deref().filter(|_| ctx.dialect.rails())
}
