//! A (target, bucket) group of HEADs, GETs or PUTs as s3dma batch requests
//! (`POST /?s3dma-batch`, [`s3dma_wire::batch`]) to a target that speaks
//! s3dma's dialect: one signed request per up to [`MAX_ITEMS`] items
//! instead of one per item.
//!
//! [`batched`] is what `run_group` (in `batch.rs`) tries first. It takes
//! the items it can send batched (a target with `protocol: s3dma`, RDMA on
//! and the standard token header; HEADs; PUTs no larger than a single PUT,
//! by their own window; GETs whose window is at most one chunk, which
//! GetObjects picks, `get_source` in `batch.rs`) and leaves the rest to
//! the group's parallel single requests. A GET item that fails with
//! anything but `403`, `404` or `412` (a range the object cannot satisfy,
//! an object larger than its window, bytes not placed over RDMA), or whose
//! placed bytes are not what its range resolves to, goes again as a single
//! request, which answers it exactly as a GetObject would. A target that declines batches (`501`, or a `400`/`404`/`405`
//! without `x-amz-rdma-batch`: the gateway, a plain S3 server) is
//! remembered as such for the life of the agent, and its items go as
//! single requests, now and later. A batch that fails otherwise (a refusal
//! of the whole batch, retries spent, a reply that does not read) is sent
//! as single requests this time; a PUT batch sent twice stores the same
//! bytes twice, which is harmless.
//!
//! The body is signed: its SHA-256 is the request's payload hash
//! ([`crate::s3::Signer`]), so the keys and tokens it carries are covered
//! by the tenant's signature as a single request's headers are.
//!
//! Quotas: a batched request takes one of the batch's running places and
//! one of the tenant's concurrency slots, and its GET and PUT windows'
//! bytes from the tenant's bytes in flight, while it runs.
//!
//! Every batched request is counted by operation and outcome
//! (`s3dma_agent_target_batch_requests_total`, [`crate::metrics`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use bytes::Bytes;
use fabric::RdmaToken;
use http::{Method, StatusCode};
use s3dma_proto::agent::v1 as pb;
use s3dma_wire::batch::{self, BatchReply, BatchRequest, ItemReply};
use sha2::{Digest as _, Sha256};
use tracing::{debug, info};

use super::batch_items::{Batch, Group, Item, ItemResult, Op, Outcome};
use super::exchange::{Attempt, Exchange, read_body};
use super::put::PutResult;
use super::rails::{RailBook, RailSet};
use crate::config::RdmaProtocol;
use crate::error::{AgentError, BadReply};
use crate::s3::TargetClient;
use crate::s3::client::{S3Call, full_body, header};

/// Most items one batched request carries (the storage-target's default
/// `rdma.batch.max_items`).
pub const MAX_ITEMS: usize = 1000;
/// Most items the agent puts in one batched request, well under
/// [`MAX_ITEMS`]: a target serves one request's items on one task, so a
/// large batch goes as several requests at once, which the target's cores
/// serve side by side.
pub const ITEMS_PER_REQUEST: usize = 250;
/// Largest body one batched request has (under the storage-target's
/// default `rdma.batch.max_body_bytes`, 2 MiB).
pub const MAX_BODY: usize = 1536 << 10;
/// Most PUT window bytes one batched request moves (the storage-target's
/// default `rdma.batch.max_bytes`).
pub const MAX_BYTES: u64 = 256 << 20;

/// The targets (name and endpoint) that declined a batch: their groups go
/// as single requests.
static DECLINED: LazyLock<Mutex<HashSet<(String, String)>>> =
    LazyLock::new(|| Mutex::new(HashSet::new()));

fn key_of(t: &TargetClient) -> (String, String) {
    (t.name.clone(), t.url(&S3Call::new(Method::GET, "", None)))
}

fn declined(t: &TargetClient) -> bool {
    DECLINED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(&key_of(t))
}

fn remember_declined(t: &TargetClient) {
    let new = DECLINED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(key_of(t));
    if new {
        info!(target = %t.name, "the target declines s3dma batch requests: its batches go as single requests");
    }
}

/// Whether `target` may be sent batches at all.
fn speaks_batches(target: &TargetClient) -> bool {
    target.protocol == RdmaProtocol::S3dma
        && target.rdma
        && target
            .token_header
            .eq_ignore_ascii_case(s3dma_wire::headers::RDMA_TOKEN)
        && !declined(target)
}

/// Sends what it can of `group` as batched requests: the results of the
/// items it sent, and the group of those left for single requests.
pub async fn batched(b: &Batch<'_>, op: Op, group: Group) -> (Vec<ItemResult>, Group) {
    if op == Op::Delete || !speaks_batches(&group.target) {
        return (Vec::new(), group);
    }
    let Group {
        target,
        bucket,
        items,
    } = group;
    let threshold = b.core.settings.put.multipart_threshold;
    let chunk = b.core.settings.chunk_size;
    let (send, mut rest): (Vec<Item>, Vec<Item>) = items.into_iter().partition(|i| match op {
        Op::Head => true,
        Op::Put => i
            .put
            .as_ref()
            .is_some_and(|p| u64::from(p.src.size) <= threshold.min(MAX_BYTES)),
        Op::Get => i
            .get
            .as_ref()
            .is_some_and(|g| u64::from(g.dest.size) <= chunk.min(MAX_BYTES)),
        Op::Delete => false,
    });
    let ex = Exchange {
        core: Arc::clone(b.core),
        tenant: Arc::clone(b.tenant),
        target: Arc::clone(&target),
        request_id: b.request_id.to_owned(),
    };
    let chunks = split(send, &bucket);
    let ran = futures::future::join_all(
        chunks
            .into_iter()
            .map(|c| one_request(b, &ex, op, &bucket, c)),
    )
    .await;
    let mut done = Vec::new();
    for r in ran {
        match r {
            Ok((results, again)) => {
                done.extend(results);
                rest.extend(again);
            }
            Err(items) => rest.extend(items),
        }
    }
    rest.sort_by_key(|i| i.index);
    (
        done,
        Group {
            target,
            bucket,
            items: rest,
        },
    )
}

/// The token of a window for a batched request: with rails, the first
/// that is up (a batched item is not redone rail by rail: one that fails
/// goes as a single request, which is).
fn on_rail(rails: &RailBook, first: &RdmaToken, set: Option<&RailSet>) -> String {
    set.map_or(*first, |s| rails.first_up(s)).format()
}

/// The wire item of a group's item.
fn wire_item(rails: &RailBook, bucket: &str, item: &Item) -> batch::Item {
    if let Some(g) = &item.get {
        let token = on_rail(rails, &g.dest, g.rails.as_deref());
        let mut w = batch::Item::get(bucket, &item.key, &token);
        w.range = g.range.map(|r| {
            let v = r.header_value();
            v.strip_prefix("bytes=").map_or(v.clone(), str::to_owned)
        });
        w.if_match.clone_from(&g.if_match);
        return w;
    }
    match &item.put {
        None => batch::Item::head(bucket, &item.key),
        Some(p) => {
            let token = on_rail(rails, &p.src, p.rails.as_deref());
            let mut w = batch::Item::put(bucket, &item.key, &token);
            w.content_type.clone_from(&p.content_type);
            w.metadata = p
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            w
        }
    }
}

/// The items cut into requests within [`ITEMS_PER_REQUEST`], [`MAX_BODY`] (by an
/// estimate of each item's encoded size) and [`MAX_BYTES`].
fn split(items: Vec<Item>, bucket: &str) -> Vec<Vec<Item>> {
    let mut out: Vec<Vec<Item>> = Vec::new();
    let (mut body, mut bytes) = (0usize, 0u64);
    for item in items {
        let size = 160
            + bucket.len()
            + item.key.len() * 6
            + item.put.as_ref().map_or(0, |p| {
                p.metadata
                    .iter()
                    .map(|(k, v)| 8 + (k.len() + v.len()) * 6)
                    .sum::<usize>()
                    + p.content_type.as_ref().map_or(0, |c| c.len() * 6)
            });
        let window = window_of(&item);
        let full = out.last().is_none_or(|c| {
            c.len() >= ITEMS_PER_REQUEST || body + size > MAX_BODY || bytes + window > MAX_BYTES
        });
        if full {
            out.push(Vec::new());
            (body, bytes) = (0, 0);
        }
        body += size;
        bytes += window;
        if let Some(c) = out.last_mut() {
            c.push(item);
        }
    }
    out
}

/// The window bytes an item moves (GET, PUT).
fn window_of(item: &Item) -> u64 {
    item.put.as_ref().map_or(0, |p| u64::from(p.src.size))
        + item.get.as_ref().map_or(0, |g| u64::from(g.dest.size))
}

/// What one batched request came to.
enum Sent {
    /// The target's reply, one item per item sent.
    Reply(BatchReply),
    /// The target declined batches.
    Declined,
}

/// One batched request of `items`: their results and the items to send
/// again as single requests, or all the items back for single requests.
async fn one_request(
    b: &Batch<'_>,
    ex: &Exchange,
    op: Op,
    bucket: &str,
    items: Vec<Item>,
) -> Result<(Vec<ItemResult>, Vec<Item>), Vec<Item>> {
    let metrics = &b.core.metrics;
    let body = match BatchRequest::new(
        items
            .iter()
            .map(|i| wire_item(&b.core.rails, bucket, i))
            .collect(),
    )
    .encode()
    {
        Ok(body) if body.len() <= MAX_BODY || items.len() == 1 => Bytes::from(body),
        _ => {
            metrics.batch_request(op.name(), "failed");
            return Err(items);
        }
    };
    let Ok(_running) = b.limit.acquire().await else {
        return Err(items);
    };
    let _slot = match b.tenant.quota.admit().await {
        Ok(s) => s,
        Err(e) => {
            metrics.batch_request(op.name(), "refused");
            let e = AgentError::SlowDown(e);
            return Ok((
                items
                    .into_iter()
                    .map(|i| (i.index, Err(e.clone())))
                    .collect(),
                Vec::new(),
            ));
        }
    };
    let window: u64 = items.iter().map(window_of).sum();
    let _bytes = if window > 0 {
        Some(b.tenant.quota.admit_bytes(window).await)
    } else {
        None
    };
    let hash = hex::encode(Sha256::digest(&body));
    let n = items.len();
    let sent = ex
        .retrying("batch", || {
            let (body, hash) = (body.clone(), hash.clone());
            async move { send(ex, body, &hash, n).await }
        })
        .await;
    match sent {
        Ok(Sent::Reply(reply)) => {
            metrics.batch_request(op.name(), "ok");
            let mut done = Vec::with_capacity(items.len());
            let mut again = Vec::new();
            for (item, r) in items.into_iter().zip(reply.items) {
                match outcome(op, bucket, &item, r, &ex.request_id) {
                    Some(r) => done.push((item.index, r)),
                    None => again.push(item),
                }
            }
            Ok((done, again))
        }
        Ok(Sent::Declined) => {
            metrics.batch_request(op.name(), "declined");
            remember_declined(&ex.target);
            Err(items)
        }
        Err(e) => {
            metrics.batch_request(op.name(), "failed");
            debug!(target = %ex.target.name, error = %e, "a batch request failed: its items go as single requests");
            Err(items)
        }
    }
}

/// One attempt of a batched request.
async fn send(ex: &Exchange, body: Bytes, hash: &str, n: usize) -> Result<Sent, Attempt> {
    let mut call = S3Call::new(Method::POST, "", None);
    call.query.push((batch::QUERY, None));
    let bad =
        |e: crate::s3::client::InvalidHeader| Attempt::Fatal(AgentError::internal(e.to_string()));
    call.header(
        s3dma_wire::headers::RDMA_PROTOCOL,
        s3dma_wire::headers::S3DMA_PROTOCOL,
    )
    .map_err(bad)?;
    call.header("content-type", batch::CONTENT_TYPE)
        .map_err(bad)?;
    call.header("x-amz-content-sha256", hash).map_err(bad)?;
    call.body = Some(full_body(body));
    let reply = ex.send(call).await?;
    let marked =
        header(reply.headers(), batch::REPLY_HEADER).as_deref() == Some(batch::REPLY_VALUE);
    let status = reply.status();
    if status == StatusCode::NOT_IMPLEMENTED
        || (!marked
            && matches!(
                status,
                StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
            ))
    {
        let _ = read_body(reply, 64 << 10).await;
        return Ok(Sent::Declined);
    }
    if status != StatusCode::OK || !marked {
        return Err(ex.failure(reply).await);
    }
    let (_, bytes) = read_body(reply, batch::MAX_REPLY_BODY).await?;
    BatchReply::parse(&bytes, n).map(Sent::Reply).map_err(|e| {
        Attempt::Fatal(AgentError::Protocol(BadReply::Unparsable {
            reply: "s3dma batch",
            reason: e.to_string(),
        }))
    })
}

/// An item's reply as what the item came to; `None`: a GET item to send
/// again as a single request.
fn outcome(
    op: Op,
    bucket: &str,
    item: &Item,
    r: ItemReply,
    request_id: &str,
) -> Option<Result<Outcome, AgentError>> {
    if op == Op::Get {
        return got(item, r, request_id);
    }
    Some(item_outcome(op, bucket, item, r, request_id))
}

/// A GET item's reply: its bytes placed, its final error (`403`, `404`,
/// `412`), or `None` for anything else.
fn got(item: &Item, r: ItemReply, request_id: &str) -> Option<Result<Outcome, AgentError>> {
    let g = item.get.as_ref()?;
    if !r.ok() {
        if !matches!(r.status, 403 | 404 | 412) {
            return None;
        }
        return Some(Err(AgentError::S3(crate::error::S3Error {
            code: r.code.unwrap_or_default(),
            message: r.message.unwrap_or_default(),
            request_id: request_id.to_owned(),
            http_status: r.status,
        })));
    }
    let total = r.size?;
    let span = match g.range {
        None => 0..total,
        Some(range) => range.resolve(total).ok()?,
    };
    let len = span.end.checked_sub(span.start)?;
    // Exactly the bytes the range resolves to, inside the window.
    if r.bytes != Some(len) || len > u64::from(g.dest.size) {
        return None;
    }
    Some(Ok(Outcome::Got(super::get::GetResult {
        info: pb::ObjectInfo {
            size: total,
            etag: r.etag.unwrap_or_default(),
            content_type: r.content_type.unwrap_or_default(),
            metadata: r.metadata.into_iter().collect::<HashMap<_, _>>(),
            last_modified_unix_ms: r.last_modified_ms.unwrap_or(0),
        },
        placed: len,
        start: span.start,
        // An empty object placed nothing, as a single GET reports it.
        path: super::path_of(len > 0, false),
    })))
}

/// A HEAD or PUT item's reply as what the item came to.
fn item_outcome(
    op: Op,
    bucket: &str,
    item: &Item,
    r: ItemReply,
    request_id: &str,
) -> Result<Outcome, AgentError> {
    if !r.ok() {
        let code = r.code.unwrap_or_default();
        if op == Op::Head && r.status == 404 && code != "NoSuchBucket" {
            return Ok(Outcome::Missing);
        }
        return Err(AgentError::S3(crate::error::S3Error {
            code,
            message: r.message.unwrap_or_default(),
            request_id: request_id.to_owned(),
            http_status: r.status,
        }));
    }
    let bad = |reason: String| {
        AgentError::Protocol(BadReply::Unparsable {
            reply: "s3dma batch",
            reason,
        })
    };
    match (op, &item.put) {
        (Op::Head, _) => Ok(Outcome::Found(pb::ObjectInfo {
            size: r
                .size
                .ok_or_else(|| bad("a HEAD item without its size".into()))?,
            etag: r.etag.unwrap_or_default(),
            content_type: r.content_type.unwrap_or_default(),
            metadata: r.metadata.into_iter().collect::<HashMap<_, _>>(),
            last_modified_unix_ms: r.last_modified_ms.unwrap_or(0),
        })),
        (Op::Put, Some(p)) => {
            // Never report an object stored unless its stored size is what
            // was sent.
            let size = u64::from(p.src.size);
            if r.bytes != Some(size) || r.size.is_some_and(|s| s != size) {
                return Err(bad(format!(
                    "the target stored {:?} bytes of a {size}-byte object in {bucket}",
                    r.bytes
                )));
            }
            Ok(Outcome::Stored(PutResult {
                etag: r.etag.unwrap_or_default(),
                size,
                parts: 0,
                path: super::path_of(true, false),
            }))
        }
        _ => Err(AgentError::internal("a batched item without its operation")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fabric::RdmaToken;
    use s3dma_wire::range::ByteRange;

    fn item(index: usize, key: &str, size: Option<u32>) -> Item {
        let put = size.map(|s| {
            let mut src: RdmaToken =
                "00007f0000001000:00001000:00000001:0000:000001:1:00000000000000000000ffff7f000001"
                    .parse()
                    .unwrap();
            src.size = s;
            super::super::batch_items::PutSource {
                src,
                content_type: None,
                metadata: HashMap::new(),
                rails: None,
            }
        });
        Item {
            index,
            key: key.to_owned(),
            put,
            get: None,
        }
    }

    #[test]
    fn groups_split_by_items_body_and_bytes() {
        let heads: Vec<Item> = (0..2500).map(|i| item(i, "k", None)).collect();
        let chunks = split(heads, "b");
        assert_eq!(chunks.iter().map(Vec::len).collect::<Vec<_>>(), [250; 10]);
        // Long keys: by the body estimate.
        let long = "k".repeat(1024);
        let heads: Vec<Item> = (0..600).map(|i| item(i, &long, None)).collect();
        let chunks = split(heads, "b");
        assert!(chunks.len() > 1);
        for c in &chunks {
            let rails = RailBook::default();
            let body = BatchRequest::new(c.iter().map(|i| wire_item(&rails, "b", i)).collect())
                .encode()
                .unwrap();
            assert!(body.len() <= MAX_BODY, "{}", body.len());
        }
        // Window bytes.
        let puts: Vec<Item> = (0..5).map(|i| item(i, "k", Some(100 << 20))).collect();
        let chunks = split(puts, "b");
        assert_eq!(chunks.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
    }

    #[test]
    fn get_replies_place_their_range_or_go_single() {
        let get = |range: Option<ByteRange>| {
            let mut it = item(0, "k", None);
            let dest: RdmaToken =
                "00007f0000001000:00001000:00000001:0000:000001:1:00000000000000000000ffff7f000001"
                    .parse()
                    .unwrap();
            it.get = Some(super::super::batch_items::GetSource {
                dest,
                range,
                if_match: None,
                rails: None,
                sent: (None, String::new(), Vec::new()),
            });
            it
        };
        let placed = |size: u64, bytes: u64| ItemReply {
            status: 200,
            size: Some(size),
            bytes: Some(bytes),
            etag: Some("\"e\"".into()),
            ..ItemReply::default()
        };
        let whole = get(None);
        match got(&whole, placed(100, 100), "r") {
            Some(Ok(Outcome::Got(g))) => {
                assert_eq!((g.placed, g.start, g.info.size), (100, 0, 100));
            }
            other => panic!("{other:?}"),
        }
        // Fewer bytes than the object: sent again as a single request.
        assert!(got(&whole, placed(100, 99), "r").is_none());
        let suffix = get(Some(ByteRange::Suffix(10)));
        match got(&suffix, placed(100, 10), "r") {
            Some(Ok(Outcome::Got(g))) => assert_eq!((g.placed, g.start), (10, 90)),
            other => panic!("{other:?}"),
        }
        // A range past the end, an object larger than the window, bytes
        // not placed over RDMA: single requests answer them.
        let past = get(Some(ByteRange::From(200)));
        assert!(got(&past, placed(100, 0), "r").is_none());
        assert!(got(&whole, placed(8192, 8192), "r").is_none());
        for (status, code) in [
            (416, "InvalidRange"),
            (501, "NotImplemented"),
            (500, "InternalError"),
        ] {
            assert!(got(&whole, ItemReply::error(status, code, "no"), "r").is_none());
        }
        for (status, code) in [
            (404, "NoSuchKey"),
            (412, "PreconditionFailed"),
            (403, "AccessDenied"),
        ] {
            match got(&whole, ItemReply::error(status, code, "no"), "r") {
                Some(Err(e)) => assert_eq!(e.s3_code(), code),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn item_replies_become_outcomes() {
        let head = item(0, "k", None);
        let miss = ItemReply::error(404, "NoSuchKey", "no");
        assert!(matches!(
            item_outcome(Op::Head, "b", &head, miss, "r"),
            Ok(Outcome::Missing)
        ));
        let nb = ItemReply::error(404, "NoSuchBucket", "no");
        let e = item_outcome(Op::Head, "b", &head, nb, "r").unwrap_err();
        assert_eq!(e.s3_code(), "NoSuchBucket");
        let found = ItemReply {
            status: 200,
            size: Some(5),
            etag: Some("\"e\"".into()),
            ..ItemReply::default()
        };
        match item_outcome(Op::Head, "b", &head, found, "r") {
            Ok(Outcome::Found(info)) => assert_eq!((info.size, info.etag.as_str()), (5, "\"e\"")),
            other => panic!("{other:?}"),
        }
        let put = item(1, "k", Some(10));
        let short = ItemReply {
            status: 200,
            bytes: Some(9),
            ..ItemReply::default()
        };
        assert!(item_outcome(Op::Put, "b", &put, short, "r").is_err());
        let whole = ItemReply {
            status: 200,
            bytes: Some(10),
            size: Some(10),
            etag: Some("\"e\"".into()),
            ..ItemReply::default()
        };
        assert!(matches!(
            item_outcome(Op::Put, "b", &put, whole, "r"),
            Ok(Outcome::Stored(PutResult { size: 10, .. }))
        ));
        let denied = ItemReply::error(403, "AccessDenied", "no");
        let e = item_outcome(Op::Put, "b", &put, denied, "r").unwrap_err();
        assert_eq!(e.s3_code(), "AccessDenied");
    }
}
