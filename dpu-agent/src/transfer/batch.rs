//! Batched HeadObjects, PutObjects and DeleteObjects: the per-item work;
//! and the grouping of GetObjects' small items ([`get_source`],
//! [`group_gets`]) for [`super::target_batch`].
//!
//! A batch arrives validated as a whole (item count, bytes: the service,
//! the service); here every item is checked like the single call
//! (bucket name, key length, token, the tenant's policy) and an item that
//! fails any check gets its own error while the others run. The items are
//! then grouped by (target, bucket): the target is the one of the key's
//! first chunk in the bucket's group of targets (`Core::pick`), as for a
//! single request. Each group runs through [`run_group`], the one place
//! that decides how a group travels to its target.
//!
//! Quotas: every item is one request of the tenant's, as in GetObjects: it
//! takes one of the tenant's concurrency slots (or waits in its queue, or is
//! refused with `SlowDown` as that item's error) while it runs, and a PUT's
//! bytes count against the tenant's bytes in flight. At most `concurrency`
//! items of a batch run at once (one semaphore per batch, over all its
//! groups).
//!
//! Cost per item: the item's strings move from the request into the group
//! (no copies), one [`Exchange`] per group (not per item), results land in
//! a vector indexed by the item's place in the request; logging and the
//! request metrics are one record per batch (the service's envelope), plus
//! one outcome counter per item ([`crate::metrics::Metrics::batch_item`]).

use std::collections::HashMap;
use std::sync::Arc;

use fabric::RdmaToken;
use futures::StreamExt as _;
use s3dma_proto::agent::v1 as pb;

use super::ctx::Ctx;
use super::exchange::Exchange;
use super::put::{self, PutRequest};
use super::rails::RailSet;
use super::{Tenant, meta};
use crate::error::{AgentError, BadRequest};
use crate::s3::TargetClient;
use s3dma_wire::range::ByteRange;

pub use super::batch_items::{Batch, GetSource, Group, Item, ItemResult, Op, Outcome, PutSource};

/// An item's error as the API carries it.
#[must_use]
pub fn item_error(e: &AgentError, request_id: &str) -> pb::ItemError {
    pb::ItemError {
        grpc_code: e.grpc_code() as i32,
        s3_code: e.s3_code().to_owned(),
        message: e.report(),
        request_id: request_id.to_owned(),
    }
}

/// Checks one item like the single call does (bucket name, key length,
/// the tenant's policy); a PUT's token is parsed by the caller.
fn check(tenant: &Tenant, op: Op, bucket: &str, key: &str) -> Result<(), AgentError> {
    crate::names::check_bucket(bucket)?;
    crate::names::check_key(key)?;
    let (access, verb) = op.access();
    if tenant.policy.allows(bucket, key, access) {
        Ok(())
    } else {
        Err(AgentError::AccessDenied {
            tenant: tenant.name.clone(),
            verb: verb.to_owned(),
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        })
    }
}

/// Groups the checked items by (target, bucket); items that fail a check
/// (or whose bucket has no target) are returned as results at once.
///
/// `items` yields each item's bucket, key and (PUT) source, in request
/// order.
pub fn group<I>(b: &Batch<'_>, op: Op, items: I) -> (Vec<Group>, Vec<ItemResult>)
where
    I: IntoIterator<Item = (String, String, Option<Result<PutSource, AgentError>>)>,
{
    let mut groups: Vec<Group> = Vec::new();
    let mut refused = Vec::new();
    // Most batches name one bucket served by one target: the last group
    // used is tried first.
    let mut last: Option<usize> = None;
    let mut routed: Option<(String, Arc<[Arc<TargetClient>]>)> = None;
    for (index, (bucket, key, put)) in items.into_iter().enumerate() {
        if let Err(e) = check(b.tenant, op, &bucket, &key) {
            refused.push((index, Err(e)));
            continue;
        }
        let put = match put {
            Some(Ok(p)) => Some(p),
            Some(Err(e)) => {
                refused.push((index, Err(e)));
                continue;
            }
            None => None,
        };
        // The bucket's targets, looked up once per run of items naming it.
        let targets = match &routed {
            Some((name, t)) if *name == bucket => Arc::clone(t),
            _ => match b.core.group_for(&bucket) {
                Ok(t) => {
                    routed = Some((bucket.clone(), Arc::clone(&t)));
                    t
                }
                Err(e) => {
                    refused.push((index, Err(e)));
                    continue;
                }
            },
        };
        let target = b.core.pick(&targets, &bucket, &key, 0);
        let same = |g: &Group| Arc::ptr_eq(&g.target, &target) && g.bucket == bucket;
        let at = match last.filter(|&i| same(&groups[i])) {
            Some(i) => i,
            None => match groups.iter().position(same) {
                Some(i) => i,
                None => {
                    groups.push(Group {
                        target,
                        bucket,
                        items: Vec::new(),
                    });
                    groups.len() - 1
                }
            },
        };
        last = Some(at);
        groups[at].items.push(Item {
            index,
            key,
            put,
            get: None,
        });
    }
    (groups, refused)
}

/// A GetObjects item that a batched request may carry: it passes the
/// single call's checks (bucket, key, range, token, policy) and its window
/// is at most `max_window` bytes (one chunk: it bounds what the GET
/// places). `None`: the item goes as a single request, which reports any
/// failed check as today.
#[must_use]
pub fn get_source(
    tenant: &Tenant,
    item: &pb::GetObjectsItem,
    max_window: u64,
) -> Option<GetSource> {
    check(tenant, Op::Get, &item.bucket, &item.key).ok()?;
    let dest = item.destination.parse::<RdmaToken>().ok()?;
    if dest.size == 0 || u64::from(dest.size) > max_window {
        return None;
    }
    let rails = RailSet::parse(
        "destination",
        &dest,
        "destination_rails",
        &item.destination_rails,
    )
    .ok()?;
    Some(GetSource {
        dest,
        range: item.range.and_then(|r| ByteRange::try_from(r).ok()),
        if_match: (!item.if_match.is_empty()).then(|| item.if_match.clone()),
        rails,
        sent: (
            item.range,
            item.destination.clone(),
            item.destination_rails.clone(),
        ),
    })
}

/// The single request a GET item falls back to.
#[must_use]
pub fn get_item(bucket: String, item: Item) -> Option<(usize, pb::GetObjectsItem)> {
    let g = item.get?;
    Some((
        item.index,
        pb::GetObjectsItem {
            bucket,
            key: item.key,
            range: g.sent.0,
            destination: g.sent.1,
            if_match: g.if_match.unwrap_or_default(),
            destination_rails: g.sent.2,
        },
    ))
}

/// Groups checked GET items (each with its bucket) by (target, bucket) as
/// [`group`] does; items whose bucket has no target come back as they
/// are (their single request reports it).
#[must_use]
pub fn group_gets(b: &Batch<'_>, items: Vec<(String, Item)>) -> (Vec<Group>, Vec<(String, Item)>) {
    let mut groups: Vec<Group> = Vec::new();
    let mut left = Vec::new();
    let mut routed: Option<(String, Arc<[Arc<TargetClient>]>)> = None;
    for (bucket, item) in items {
        let targets = match &routed {
            Some((name, t)) if *name == bucket => Arc::clone(t),
            _ => match b.core.group_for(&bucket) {
                Ok(t) => {
                    routed = Some((bucket.clone(), Arc::clone(&t)));
                    t
                }
                Err(_) => {
                    left.push((bucket, item));
                    continue;
                }
            },
        };
        let target = b.core.pick(&targets, &bucket, &item.key, 0);
        let same = |g: &Group| Arc::ptr_eq(&g.target, &target) && g.bucket == bucket;
        match groups.iter_mut().rev().find(|g| same(g)) {
            Some(g) => g.items.push(item),
            None => groups.push(Group {
                target,
                bucket,
                items: vec![item],
            }),
        }
    }
    (groups, left)
}

/// Runs one (target, bucket) group of `op`: the one place that decides how
/// a group travels to its target.
///
/// Today: the group's items as parallel single S3 requests over one
/// [`Exchange`] (HEAD, DELETE) or one [`Ctx`] (PUT, whose multipart parts
/// may go to other targets of the bucket's group), each item under the
/// batch's concurrency limit and one of the tenant's concurrency slots.
/// A target that takes a whole group as one signed request can be served
/// here instead, falling back to this path when it declines.
///
/// Returns one result per item of the group (any order).
pub async fn run_group(b: &Batch<'_>, op: Op, group: Group) -> Vec<ItemResult> {
    // A target that speaks s3dma's dialect takes the group as batched
    // requests; what it does not take runs below.
    let (batched, group) = super::target_batch::batched(b, op, group).await;
    if group.items.is_empty() {
        return batched;
    }
    let Group {
        target,
        bucket,
        items,
    } = group;
    let ex = Exchange {
        core: Arc::clone(b.core),
        tenant: Arc::clone(b.tenant),
        target,
        request_id: b.request_id.to_owned(),
    };
    // PUT: one Ctx for the group (its first target is the group's, since
    // every item's first chunk picked it).
    let ctx = match (op, items.first()) {
        (Op::Put, Some(first)) => {
            match Ctx::new(
                b.core,
                b.tenant,
                &bucket,
                &first.key,
                b.request_id,
                b.qp_link.as_ref(),
            ) {
                Ok(c) => Some(Arc::new(c)),
                Err(e) => {
                    return items
                        .into_iter()
                        .map(|it| (it.index, Err(e.clone())))
                        .collect();
                }
            }
        }
        _ => None,
    };
    let (ex, bucket, ctx) = (&ex, bucket.as_str(), ctx.as_ref());
    let mut results: Vec<ItemResult> = futures::stream::iter(items)
        .map(|item| async move {
            let index = item.index;
            (index, one(b, op, ex, ctx, bucket, item).await)
        })
        .buffer_unordered(b.concurrency.max(1))
        .collect()
        .await;
    // HEAD: a 404 cannot tell a missing key from a missing bucket; one
    // HeadBucket per group (not per item) tells.
    if op == Op::Head
        && results
            .iter()
            .any(|(_, r)| matches!(r, Ok(Outcome::Missing)))
        && !meta::bucket_exists(ex, bucket).await
    {
        for (_, r) in &mut results {
            if matches!(r, Ok(Outcome::Missing)) {
                *r = Err(no_such_bucket(bucket));
            }
        }
    }
    results.extend(batched);
    results
}

/// One item of a group as a single request, under the batch's limit and
/// one of the tenant's concurrency slots.
async fn one(
    b: &Batch<'_>,
    op: Op,
    ex: &Exchange,
    ctx: Option<&Arc<Ctx>>,
    bucket: &str,
    item: Item,
) -> Result<Outcome, AgentError> {
    let _running = b
        .limit
        .acquire()
        .await
        .map_err(|_| AgentError::internal("the batch's limit closed"))?;
    let _slot = b.tenant.quota.admit().await.map_err(AgentError::SlowDown)?;
    match op {
        Op::Head => Ok(meta::head_object_or_missing(ex, bucket, &item.key)
            .await?
            .map_or(Outcome::Missing, Outcome::Found)),
        Op::Delete => {
            meta::delete_object(ex, bucket, &item.key).await?;
            Ok(Outcome::Deleted)
        }
        // GetObjects runs its single requests itself (the service).
        Op::Get => Err(AgentError::internal(
            "a GET item outside GetObjects' own path",
        )),
        Op::Put => {
            let (Some(ctx), Some(p)) = (ctx, item.put) else {
                return Err(AgentError::internal("a PUT item without its source"));
            };
            let req = PutRequest {
                bucket: bucket.to_owned(),
                key: item.key,
                src: p.src,
                content_type: p.content_type,
                metadata: p.metadata,
                rails: p.rails,
            };
            let out = put::put_object(ctx, &req).await?;
            Ok(Outcome::Stored(out))
        }
    }
}

fn no_such_bucket(bucket: &str) -> AgentError {
    AgentError::S3(crate::error::S3Error {
        code: "NoSuchBucket".to_owned(),
        message: format!(
            "The specified bucket does not exist ({})",
            s3dma_service::Escaped(bucket)
        ),
        request_id: String::new(),
        http_status: 404,
    })
}

/// Runs a whole batch: every group through [`run_group`] at once (the
/// batch's limit bounds the items running), then the results in request
/// order, `refused` among them.
pub async fn run(
    b: &Batch<'_>,
    op: Op,
    groups: Vec<Group>,
    refused: Vec<ItemResult>,
    total: usize,
) -> Vec<Option<Result<Outcome, AgentError>>> {
    let mut out: Vec<Option<Result<Outcome, AgentError>>> = Vec::with_capacity(total);
    out.resize_with(total, || None);
    for (i, r) in refused {
        out[i] = Some(r);
    }
    let done = futures::future::join_all(groups.into_iter().map(|g| run_group(b, op, g))).await;
    for (i, r) in done.into_iter().flatten() {
        if let Some(slot) = out.get_mut(i) {
            *slot = Some(r);
        }
    }
    out
}

/// A PUT item's source token and its other rails' tokens, parsed and
/// checked (fields named `items[i].source`, `items[i].source_rails[j]`).
///
/// # Errors
/// [`AgentError::InvalidArgument`].
pub fn put_source(
    index: usize,
    source: &str,
    source_rails: &[String],
    content_type: String,
    metadata: HashMap<String, String>,
) -> Result<PutSource, AgentError> {
    let field = format!("items[{index}].source");
    let src = source.parse::<RdmaToken>().map_err(|e| {
        AgentError::InvalidArgument(BadRequest::Token {
            field: field.clone(),
            reason: e.to_string(),
        })
    })?;
    let rails = RailSet::parse(
        &field,
        &src,
        &format!("items[{index}].source_rails"),
        source_rails,
    )?;
    Ok(PutSource {
        src,
        rails,
        content_type: (!content_type.is_empty()).then_some(content_type),
        metadata,
    })
}
