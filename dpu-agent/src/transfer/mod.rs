//! Running tenant requests against targets: the executor.
//!
//! [`Core`] holds what every request shares (target clients, tenants,
//! staging memory, fabric sessions to tenant endpoints, settings, metrics).
//! A [`Ctx`] ([`ctx`]) is one tenant request on one bucket; at each target
//! it is an [`Exchange`] ([`exchange`]), which sends attempts with
//! per-attempt timeouts and retries retryable failures (5xx, throttling,
//! connection errors, timeouts, bodies cut short) with jittered backoff,
//! never 4xx. How a chunk or a part moves in a target's dialect is the
//! target's [`dialect::ChunkMover`] ([`dialect`]), chosen once per target
//! when the request starts. The operations live in [`get`], [`put`] and
//! [`meta`], the batched HeadObjects, PutObjects and DeleteObjects in
//! [`batch`]; moving bytes through the agent when a target speaks plain
//! HTTP is [`fallback`]. A request naming several fabric rails runs each
//! chunk and part over one of them, redone on another when its rail
//! fails ([`rails`]).
//!
//! Cancellation: dropping a request's future drops its in-flight HTTP
//! exchanges; fabric operations already posted keep their staging buffers
//! until they complete, and the shim revokes the window, which fences any
//! late placement by a target.

pub mod batch;
pub mod batch_items;
pub mod ctx;
pub mod dialect;
pub mod exchange;
pub mod fallback;
pub mod get;
pub mod meta;
pub mod put;
pub mod rails;
pub mod target_batch;

pub use ctx::Ctx;
pub use exchange::{Attempt, Exchange};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fabric::pool::{SessionPool, StagingPool};
use http::HeaderMap;

use crate::error::AgentError;
use crate::metrics::Metrics;
use crate::plan::PutPolicy;
use crate::policy::TenantPolicy;
use crate::quota::TenantQuota;
use crate::retry::RetryPolicy;
use crate::s3::client::header;
use crate::s3::{Signer, TargetClient};

/// Transfer settings (from `transfer:`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// GET chunk size.
    pub chunk_size: u64,
    /// Chunks (or parts) in flight per request.
    pub max_chunks_in_flight: usize,
    /// Multipart thresholds.
    pub put: PutPolicy,
    /// Retries and backoff.
    pub retry: RetryPolicy,
    /// Deadline of a whole request.
    pub request_timeout: Duration,
    /// Deadline of one HTTP attempt.
    pub attempt_timeout: Duration,
    /// Default concurrency of a batch (GetObjects, HeadObjects,
    /// PutObjects, DeleteObjects).
    pub batch_concurrency: usize,
    /// Most items in one batch.
    pub max_batch_items: usize,
    /// Most bytes one batch moves (GetObjects: the destinations' sizes,
    /// PutObjects: the sources' sizes).
    pub max_batch_bytes: u64,
}

/// A tenant as the executor sees it.
#[derive(Debug)]
pub struct Tenant {
    /// Name (metrics, logs).
    pub name: String,
    /// Signs with the tenant's S3 credentials.
    pub signer: Signer,
    /// Bucket/prefix allowlist.
    pub policy: TenantPolicy,
    /// Quotas.
    pub quota: TenantQuota,
}

/// What all requests share.
#[derive(Debug)]
pub struct Core {
    /// Targets in config order.
    pub targets: Vec<Arc<TargetClient>>,
    /// Bucket name -> indices into `targets`: one target, or a group
    /// (`*` under the key "*").
    pub routes: HashMap<String, Vec<usize>>,
    /// Tenants by name.
    pub tenants: HashMap<String, Arc<Tenant>>,
    /// Settings.
    pub settings: Settings,
    /// Registered staging memory for the fallback path.
    pub staging: Arc<StagingPool>,
    /// Fabric sessions to tenant endpoints (fallback path).
    pub sessions: Arc<SessionPool>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The shims' `QueuePairs` streams (hipobj-rc-v2 transfers).
    pub qp_links: Arc<crate::qp_link::QpLinks>,
    /// The state of the fabric rails requests name ([`rails`]).
    pub rails: Arc<rails::RailBook>,
}

/// How long a target that gave no answer is skipped by its group.
pub const COOL_DOWN: Duration = Duration::from_secs(5);

impl Core {
    /// The targets serving `bucket`: one, or the group listing it.
    ///
    /// # Errors
    /// [`AgentError::NoTarget`].
    pub fn group_for(&self, bucket: &str) -> Result<Arc<[Arc<TargetClient>]>, AgentError> {
        let group: Vec<Arc<TargetClient>> = self
            .routes
            .get(bucket)
            .or_else(|| self.routes.get("*"))
            .map(|ids| {
                ids.iter()
                    .filter_map(|i| self.targets.get(*i))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if group.is_empty() {
            return Err(AgentError::NoTarget {
                bucket: bucket.to_owned(),
            });
        }
        Ok(group.into())
    }

    /// The target of `group` for chunk `index` of `bucket`/`key`: the first
    /// of the rendezvous ranking that is not cooling down (the first of all
    /// when every one is).
    #[must_use]
    pub fn pick(
        &self,
        group: &[Arc<TargetClient>],
        bucket: &str,
        key: &str,
        index: u64,
    ) -> Arc<TargetClient> {
        if let [only] = group {
            return Arc::clone(only);
        }
        let names: Vec<&str> = group.iter().map(|t| t.name.as_str()).collect();
        let order = s3dma_wire::rendezvous::rank(&names, bucket, key, index);
        let first = &group[order[0]];
        match order.iter().map(|&i| &group[i]).find(|t| t.health.is_up()) {
            Some(t) => {
                if !Arc::ptr_eq(t, first) {
                    self.metrics.target_skip(&first.name);
                }
                Arc::clone(t)
            }
            None => Arc::clone(first),
        }
    }
}

/// How a request's bytes moved, from whether any piece went by RDMA and
/// whether any went through the fallback (nothing moved counts as RDMA).
#[must_use]
pub fn path_of(rdma: bool, fallback: bool) -> s3dma_proto::agent::v1::TransferPath {
    use s3dma_proto::agent::v1::TransferPath;
    match (rdma, fallback) {
        (true, true) => TransferPath::Mixed,
        (false, true) => TransferPath::Fallback,
        _ => TransferPath::Rdma,
    }
}

/// The object facts in reply headers.
#[must_use]
pub fn object_info(headers: &HeaderMap, size: u64) -> s3dma_proto::agent::v1::ObjectInfo {
    let metadata = headers
        .iter()
        .filter_map(|(k, v)| {
            let name = k.as_str().strip_prefix("x-amz-meta-")?;
            Some((name.to_owned(), v.to_str().ok()?.to_owned()))
        })
        .collect();
    let last_modified_unix_ms = header(headers, "last-modified")
        .and_then(|v| httpdate::parse_http_date(&v).ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    s3dma_proto::agent::v1::ObjectInfo {
        size,
        etag: header(headers, "etag").unwrap_or_default(),
        content_type: header(headers, "content-type").unwrap_or_default(),
        metadata,
        last_modified_unix_ms,
    }
}
