//! Running tenant requests against targets: the executor.
//!
//! [`Core`] holds what every request shares (target clients, tenants,
//! staging memory, fabric sessions to tenant endpoints, settings, metrics).
//! A [`Ctx`] is one tenant request bound to one target; it sends attempts
//! with per-attempt timeouts and retries retryable failures (5xx, throttling,
//! connection errors, timeouts, bodies cut short) with jittered backoff,
//! never 4xx. The operations live in [`get`], [`put`] and [`meta`]; moving
//! bytes through the agent when a target speaks plain HTTP is [`fallback`].
//!
//! Cancellation: dropping a request's future drops its in-flight HTTP
//! exchanges; fabric operations already posted keep their staging buffers
//! until they complete, and the shim revokes the window, which fences any
//! late placement by a target.

pub mod fallback;
pub mod get;
pub mod hipobj;
pub mod meta;
pub mod put;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fabric::RdmaToken;
use fabric::pool::{SessionPool, StagingPool};
use http::HeaderMap;
use tracing::debug;

use crate::error::{AgentError, BadRequest};
use crate::metrics::Metrics;
use crate::plan::PutPolicy;
use crate::policy::TenantPolicy;
use crate::quota::TenantQuota;
use crate::retry::{RetryPolicy, retryable_status};
use crate::s3::client::{S3Call, SendError, error_of, header};
use crate::s3::{Reply, Signer, TargetClient};

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
    /// Default GetObjects concurrency.
    pub batch_concurrency: usize,
    /// Most items in one GetObjects batch.
    pub max_batch_items: usize,
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

/// How one attempt failed.
#[derive(Debug)]
pub enum Attempt {
    /// Worth another attempt (reason is a metric label).
    Retry(AgentError, &'static str),
    /// Final.
    Fatal(AgentError),
}

impl From<AgentError> for Attempt {
    fn from(e: AgentError) -> Self {
        Attempt::Fatal(e)
    }
}

/// One tenant request bound to one target.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// Shared state.
    pub core: Arc<Core>,
    /// The tenant.
    pub tenant: Arc<Tenant>,
    /// The target (for a group: the one of the object's first chunk).
    pub target: Arc<TargetClient>,
    /// The targets serving the bucket (`target` among them).
    pub group: Arc<[Arc<TargetClient>]>,
    /// The agent's request id.
    pub request_id: String,
    /// The calling shim's RDMA device, when it opened its `QueuePairs`
    /// stream (hipobj-rc-v2 transfers need it; without it such a target's
    /// bytes go over HTTP through the agent).
    pub qp_link: Option<Arc<crate::qp_link::QpLink>>,
}

impl Ctx {
    /// This request bound to the target of chunk `index` of `bucket`/`key`
    /// in its group (itself when that is its target).
    #[must_use]
    pub fn for_chunk(self: &Arc<Self>, bucket: &str, key: &str, index: u64) -> Arc<Ctx> {
        let t = self.core.pick(&self.group, bucket, key, index);
        if Arc::ptr_eq(&t, &self.target) {
            return Arc::clone(self);
        }
        Arc::new(Ctx {
            target: t,
            ..(**self).clone()
        })
    }

    /// Sends one attempt of `call`; a transport failure is retryable.
    pub async fn send(&self, call: S3Call) -> Result<Reply, Attempt> {
        let method = call.method.clone();
        match self
            .target
            .send(&self.tenant.signer, call, &self.request_id)
            .await
        {
            Ok(r) => {
                self.core.metrics.target_request(
                    &self.target.name,
                    method.as_str(),
                    r.status().as_str(),
                );
                if self.target.health.answered() {
                    self.core.metrics.target_up(&self.target.name, true);
                }
                Ok(r)
            }
            Err(SendError::Build(m)) => Err(Attempt::Fatal(AgentError::InvalidArgument(
                BadRequest::Unsendable { reason: m },
            ))),
            Err(SendError::Transport(m)) => {
                self.core
                    .metrics
                    .target_request(&self.target.name, method.as_str(), "error");
                if self.target.health.failed(COOL_DOWN) {
                    self.core.metrics.target_up(&self.target.name, false);
                }
                Err(Attempt::Retry(AgentError::unavailable(m), "connection"))
            }
        }
    }

    /// The failure of a non-success reply: retryable for 5xx/429/408.
    pub async fn failure(&self, reply: Reply) -> Attempt {
        let status = reply.status().as_u16();
        let err = error_of(reply).await;
        if retryable_status(status) {
            Attempt::Retry(AgentError::S3(err), "status")
        } else {
            Attempt::Fatal(AgentError::S3(err))
        }
    }

    /// Runs `attempt` until it succeeds, fails finally, or retries run out.
    /// Each try is bounded by the attempt timeout.
    ///
    /// # Errors
    /// The last failure.
    pub async fn retrying<T, F, Fut>(&self, what: &str, mut attempt: F) -> Result<T, AgentError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Attempt>>,
    {
        let s = &self.core.settings;
        let mut retry = 0u32;
        loop {
            let res = match tokio::time::timeout(s.attempt_timeout, attempt()).await {
                Ok(r) => r,
                Err(_) => Err(Attempt::Retry(
                    AgentError::unavailable(format!(
                        "{what}: target {} did not answer within {:?}",
                        self.target.name, s.attempt_timeout
                    )),
                    "timeout",
                )),
            };
            match res {
                Ok(v) => return Ok(v),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry(e, reason)) => {
                    if retry >= s.retry.retries {
                        return Err(match e {
                            AgentError::Unavailable { message, source } => {
                                AgentError::Unavailable {
                                    message: format!(
                                        "{message} (gave up after {} attempts)",
                                        retry + 1
                                    ),
                                    source,
                                }
                            }
                            other => other,
                        });
                    }
                    retry += 1;
                    self.core.metrics.retry(&self.target.name, reason);
                    let wait = s.retry.backoff(retry, rand::random::<f64>());
                    debug!(%what, retry, ?wait, error = %e, "retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

/// The token an object request carries to its target, in the target's
/// dialect: s3dma's (the window slice's own token, with the signed
/// `x-amz-rdma-protocol: s3dma-v1`), or a standard (cuObject) token the
/// calling shim minted for exactly the slice, naming its DC target (no
/// marker, under the target's `token_header`).
#[derive(Debug, Clone)]
pub struct SentToken {
    header: http::HeaderName,
    value: http::HeaderValue,
    marker: bool,
}

impl SentToken {
    /// Adds the token (and the marker, for s3dma's dialect) to `call`.
    pub fn apply(&self, call: &mut S3Call) {
        call.headers.insert(self.header.clone(), self.value.clone());
        if self.marker {
            call.headers.insert(
                http::HeaderName::from_static(s3dma_wire::headers::RDMA_PROTOCOL),
                http::HeaderValue::from_static(s3dma_wire::headers::S3DMA_PROTOCOL),
            );
        }
    }
}

impl Ctx {
    /// The token for `slot` in this target's dialect; `None`: plain HTTP
    /// (`rdma: false`, hipobj-rc-v2 targets, whose requests carry none, and
    /// a cuObject target when the shim has no DC: no link, or a device
    /// without DC).
    ///
    /// # Errors
    /// A header the target's configuration made unsendable.
    pub async fn token_for(&self, slot: &RdmaToken) -> Result<Option<SentToken>, AgentError> {
        use crate::config::RdmaProtocol;
        if !self.target.rdma {
            return Ok(None);
        }
        let (text, marker) = match self.target.protocol {
            RdmaProtocol::S3dma => (slot.to_string(), true),
            RdmaProtocol::HipobjRcV2 => return Ok(None),
            RdmaProtocol::CuobjectDc => {
                let Some(link) = &self.qp_link else {
                    return Ok(None);
                };
                match link
                    .mint_dc_token(slot, self.core.settings.attempt_timeout)
                    .await
                {
                    Ok(t) => (t, false),
                    Err(e) => {
                        debug!(target = %self.target.name, error = %e, "no DC token from the shim: over HTTP");
                        return Ok(None);
                    }
                }
            }
        };
        let header = http::HeaderName::from_bytes(self.target.token_header.as_bytes())
            .map_err(|e| AgentError::internal_from("the token header name", e))?;
        let value = http::HeaderValue::from_str(&text)
            .map_err(|e| AgentError::internal_from("the RDMA token", e))?;
        Ok(Some(SentToken {
            header,
            value,
            marker,
        }))
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
