//! Prometheus metrics; [`Metrics::render`] is what the shared
//! [`s3dma_service::metrics::MetricsServer`] serves at `/metrics`.

use std::time::Duration;

use prometheus::{
    Encoder as _, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};
use tracing::warn;

/// The storage-target's metrics.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    duration: HistogramVec,
    bytes: IntCounterVec,
    path_requests: IntCounterVec,
    path_bytes: IntCounterVec,
    rdma_ops: HistogramVec,
    rdma_staging_total: IntGauge,
    rdma_staging_in_use: IntGauge,
    rdma_sessions: IntGauge,
    rdma_connects: IntCounterVec,
    rdma_share_cap: IntGauge,
    rdma_share_waits: IntCounterVec,
    listing_visited: IntCounterVec,
    gateway: GatewayMetrics,
    limits: LimitMetrics,
    hipobj: HipobjMetrics,
    batch: BatchMetrics,
}

/// s3dma batch requests (`POST /?s3dma-batch`) and their items.
#[derive(Debug, Clone)]
struct BatchMetrics {
    requests: IntCounterVec,
    items: IntCounterVec,
}

impl BatchMetrics {
    fn new() -> Self {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        BatchMetrics {
            requests: counter(
                "s3dma_storage_target_batch_requests_total",
                "s3dma batch requests by outcome (served: items ran; refused: the whole batch was refused)",
                &["outcome"],
            ),
            items: counter(
                "s3dma_storage_target_batch_items_total",
                "Items of s3dma batch requests by operation (HeadObject, GetObject, PutObject) and outcome (ok | error)",
                &["op", "outcome"],
            ),
        }
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.requests.clone()),
            Box::new(self.items.clone()),
        ]
    }
}

/// The hipobj-rc-v2 server's sessions.
#[derive(Debug, Clone)]
struct HipobjMetrics {
    sessions: IntCounterVec,
    active: IntGauge,
    staging_bytes: IntGauge,
    bytes: IntCounterVec,
}

impl HipobjMetrics {
    fn new() -> Self {
        HipobjMetrics {
            sessions: IntCounterVec::new(
                Opts::new(
                    "s3dma_storage_target_hipobj_sessions_total",
                    "hipobj-rc-v2 sessions by operation (GET, PUT) and how they ended (ok, refused, failed, timeout, cancelled, expired)",
                ),
                &["op", "outcome"],
            )
            .expect("valid metric"),
            active: IntGauge::new(
                "s3dma_storage_target_hipobj_sessions",
                "hipobj-rc-v2 sessions prepared or running",
            )
            .expect("valid metric"),
            staging_bytes: IntGauge::new(
                "s3dma_storage_target_hipobj_staging_bytes",
                "Registered staging bytes the hipobj-rc-v2 sessions hold",
            )
            .expect("valid metric"),
            bytes: IntCounterVec::new(
                Opts::new(
                    "s3dma_storage_target_hipobj_bytes_total",
                    "Object bytes moved by hipobj-rc-v2, by operation",
                ),
                &["op"],
            )
            .expect("valid metric"),
        }
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.sessions.clone()),
            Box::new(self.active.clone()),
            Box::new(self.staging_bytes.clone()),
            Box::new(self.bytes.clone()),
        ]
    }
}

/// The caps on connections, request bodies and the RDMA shared class.
#[derive(Debug, Clone)]
struct LimitMetrics {
    connections: IntGauge,
    connections_refused: IntCounter,
    chunks_refused: IntCounter,
    shared_class_cap: IntGauge,
    stalled_sessions: IntCounter,
}

impl LimitMetrics {
    fn new() -> Self {
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("valid metric");
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("valid metric");
        LimitMetrics {
            connections: gauge(
                "s3dma_storage_target_connections",
                "Open S3 (HTTP) connections",
            ),
            connections_refused: counter(
                "s3dma_storage_target_connections_refused_total",
                "S3 connections closed at accept because max_connections were open",
            ),
            chunks_refused: counter(
                "s3dma_storage_target_aws_chunks_refused_total",
                "aws-chunked request bodies refused because a chunk declared more than max_aws_chunk_size bytes (or a malformed chunk header)",
            ),
            shared_class_cap: gauge(
                "s3dma_storage_target_rdma_staging_shared_class_buffers",
                "Most staging buffers all users not in rdma.tenant_users may hold together (rdma.max_shared_staging_share of the pool)",
            ),
            stalled_sessions: counter(
                "s3dma_storage_target_rdma_stalled_sessions_total",
                "Fabric sessions failed because an operation did not complete within rdma.progress_timeout_secs",
            ),
        }
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.connections.clone()),
            Box::new(self.connections_refused.clone()),
            Box::new(self.chunks_refused.clone()),
            Box::new(self.shared_class_cap.clone()),
            Box::new(self.stalled_sessions.clone()),
        ]
    }
}

/// The gateway's metrics (`store: s3`): its chunk cache and its upstream.
#[derive(Debug, Clone)]
struct GatewayMetrics {
    cache_lookups: IntCounterVec,
    cache_bytes: IntCounterVec,
    cache_evictions: IntCounterVec,
    cache_chunks: IntGauge,
    cache_capacity: IntGauge,
    cache_chunk_size: IntGauge,
    cache_write_allocated: IntCounterVec,
    revalidations: IntCounterVec,
    upstream: HistogramVec,
    upstream_errors: IntCounterVec,
    upstream_bytes: IntCounterVec,
}

impl GatewayMetrics {
    fn new() -> Self {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("valid metric");
        GatewayMetrics {
            cache_lookups: counter(
                "s3dma_storage_target_cache_lookups_total",
                "Chunk reads of the gateway by where the chunk came from: cache (a hit), upstream (this request fetched it), single_flight (waited for another request's fetch of it)",
                &["source"],
            ),
            cache_bytes: counter(
                "s3dma_storage_target_cache_served_bytes_total",
                "Object bytes the gateway sent to tenants, by where their chunk came from (cache | upstream | single_flight)",
                &["source"],
            ),
            cache_evictions: counter(
                "s3dma_storage_target_cache_evictions_total",
                "Chunks dropped from the cache: evicted for space, or stale (an older version of an object)",
                &["reason"],
            ),
            cache_chunks: gauge(
                "s3dma_storage_target_cache_chunks",
                "Chunks in the gateway's cache",
            ),
            cache_capacity: gauge(
                "s3dma_storage_target_cache_capacity_chunks",
                "Chunk slots of the gateway's cache (cache.size / cache.chunk_size)",
            ),
            cache_chunk_size: gauge(
                "s3dma_storage_target_cache_chunk_bytes",
                "Size of one cache chunk (cache.chunk_size)",
            ),
            cache_write_allocated: counter(
                "s3dma_storage_target_cache_write_allocated_total",
                "RDMA PutObjects whose bytes the gateway kept in its cache (cache.write_allocate_max): kept, or skipped (larger than the limit, or no slot free without waiting)",
                &["outcome"],
            ),
            revalidations: counter(
                "s3dma_storage_target_revalidations_total",
                "Reads of the gateway whose authorization and version were confirmed upstream (upstream) or taken from a confirmation younger than cache.revalidate_after (recent)",
                &["how"],
            ),
            upstream: HistogramVec::new(
                HistogramOpts::new(
                    "s3dma_storage_target_upstream_seconds",
                    "Latency of the gateway's requests to its upstream S3, by operation",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0,
                ]),
                &["op"],
            )
            .expect("valid metric"),
            upstream_errors: counter(
                "s3dma_storage_target_upstream_errors_total",
                "Failed upstream requests by operation and kind (an S3 error code, or transport | timeout)",
                &["op", "kind"],
            ),
            upstream_bytes: counter(
                "s3dma_storage_target_upstream_bytes_total",
                "Object bytes the gateway read from (in) and wrote to (out) its upstream",
                &["direction"],
            ),
        }
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.cache_lookups.clone()),
            Box::new(self.cache_bytes.clone()),
            Box::new(self.cache_evictions.clone()),
            Box::new(self.cache_chunks.clone()),
            Box::new(self.cache_capacity.clone()),
            Box::new(self.cache_chunk_size.clone()),
            Box::new(self.cache_write_allocated.clone()),
            Box::new(self.revalidations.clone()),
            Box::new(self.upstream.clone()),
            Box::new(self.upstream_errors.clone()),
            Box::new(self.upstream_bytes.clone()),
        ]
    }
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers the metrics.
    ///
    /// # Panics
    /// Never in practice: the metric definitions are static and valid.
    #[must_use]
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "s3dma_storage_target_requests_total",
                "S3 requests by operation and outcome (the HTTP status)",
            ),
            &["op", "outcome"],
        )
        .expect("valid metric");
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "s3dma_storage_target_request_duration_seconds",
                "S3 request duration, from request head to the end of the response body",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0,
            ]),
            &["op"],
        )
        .expect("valid metric");
        let bytes = IntCounterVec::new(
            Opts::new(
                "s3dma_storage_target_bytes_total",
                "HTTP body bytes received (in) and sent (out)",
            ),
            &["direction"],
        )
        .expect("valid metric");
        let path_requests = IntCounterVec::new(
            Opts::new(
                "s3dma_storage_target_path_requests_total",
                "Successful GetObject/PutObject/UploadPart requests by data path (rdma | http)",
            ),
            &["op", "path"],
        )
        .expect("valid metric");
        let path_bytes = IntCounterVec::new(
            Opts::new(
                "s3dma_storage_target_path_bytes_total",
                "Object bytes moved by data path (rdma | http) and direction (in | out)",
            ),
            &["path", "direction"],
        )
        .expect("valid metric");
        let rdma_ops = HistogramVec::new(
            HistogramOpts::new(
                "s3dma_storage_target_rdma_op_seconds",
                "Latency of one-sided RDMA operations (write | read), post to completion",
            )
            .buckets(vec![
                0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                0.25, 0.5, 1.0, 5.0,
            ]),
            &["op"],
        )
        .expect("valid metric");
        let rdma_staging_total = IntGauge::new(
            "s3dma_storage_target_rdma_staging_buffers",
            "Registered RDMA staging buffers",
        )
        .expect("valid metric");
        let rdma_staging_in_use = IntGauge::new(
            "s3dma_storage_target_rdma_staging_buffers_in_use",
            "RDMA staging buffers in use",
        )
        .expect("valid metric");
        let rdma_sessions = IntGauge::new(
            "s3dma_storage_target_rdma_sessions",
            "Pooled fabric sessions to client endpoints",
        )
        .expect("valid metric");
        let rdma_connects = IntCounterVec::new(
            Opts::new(
                "s3dma_storage_target_rdma_session_connects_total",
                "Fabric session connects by outcome (ok | error | timeout)",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let rdma_share_cap = IntGauge::new(
            "s3dma_storage_target_rdma_staging_share_buffers",
            "Most staging buffers one client session, and one S3 user, may hold (rdma.max_staging_share of the pool)",
        )
        .expect("valid metric");
        let rdma_share_waits = IntCounterVec::new(
            Opts::new(
                "s3dma_storage_target_rdma_staging_share_waits_total",
                "Staging buffer requests that waited because their client session or S3 user held its whole share (limit = session | user)",
            ),
            &["limit"],
        )
        .expect("valid metric");
        let listing_visited = IntCounterVec::new(
            Opts::new(
                "s3dma_storage_target_listing_entries_visited_total",
                "Index entries (keys, or uploads) that listings read, by operation: at most max-keys + 1 per request, however many keys a bucket or a common prefix holds",
            ),
            &["op"],
        )
        .expect("valid metric");
        let gateway = GatewayMetrics::new();
        let limits = LimitMetrics::new();
        let hipobj = HipobjMetrics::new();
        let batch = BatchMetrics::new();
        for m in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(duration.clone()),
            Box::new(bytes.clone()),
            Box::new(path_requests.clone()),
            Box::new(path_bytes.clone()),
            Box::new(rdma_ops.clone()),
            Box::new(rdma_staging_total.clone()),
            Box::new(rdma_staging_in_use.clone()),
            Box::new(rdma_sessions.clone()),
            Box::new(rdma_connects.clone()),
            Box::new(rdma_share_cap.clone()),
            Box::new(rdma_share_waits.clone()),
            Box::new(listing_visited.clone()),
        ]
        .into_iter()
        .chain(gateway.collectors())
        .chain(limits.collectors())
        .chain(hipobj.collectors())
        .chain(batch.collectors())
        {
            registry.register(m).expect("unique metric");
        }
        Metrics {
            registry,
            requests,
            duration,
            bytes,
            path_requests,
            path_bytes,
            rdma_ops,
            rdma_staging_total,
            rdma_staging_in_use,
            rdma_sessions,
            rdma_connects,
            rdma_share_cap,
            rdma_share_waits,
            listing_visited,
            gateway,
            limits,
            hipobj,
            batch,
        }
    }

    /// Counts a batch request that ended with `outcome`.
    pub fn batch_request(&self, outcome: &str) {
        self.batch.requests.with_label_values(&[outcome]).inc();
    }

    /// Counts a batch item of `op` that ended with `outcome`.
    pub fn batch_item(&self, op: &str, outcome: &str) {
        self.batch.items.with_label_values(&[op, outcome]).inc();
    }

    /// Counts a hipobj-rc-v2 session of `op` that ended with `outcome`.
    pub fn hipobj_session(&self, op: &str, outcome: &str) {
        self.hipobj.sessions.with_label_values(&[op, outcome]).inc();
    }

    /// Sets the hipobj-rc-v2 sessions held and their staging bytes.
    pub fn hipobj_held(&self, sessions: usize, staging_bytes: u64) {
        self.hipobj.active.set(gauge_value(sessions));
        self.hipobj
            .staging_bytes
            .set(i64::try_from(staging_bytes).unwrap_or(i64::MAX));
    }

    /// Counts object bytes a hipobj-rc-v2 `op` moved.
    pub fn hipobj_bytes(&self, op: &str, n: u64) {
        self.hipobj.bytes.with_label_values(&[op]).inc_by(n);
    }

    /// Counts the index entries one listing read.
    pub fn listing_visited(&self, op: &str, n: usize) {
        self.listing_visited
            .with_label_values(&[op])
            .inc_by(n as u64);
    }

    /// Sets the cache's size: slots and bytes per slot.
    pub fn cache_capacity(&self, slots: usize, chunk_size: usize) {
        self.gateway.cache_capacity.set(gauge_value(slots));
        self.gateway.cache_chunk_size.set(gauge_value(chunk_size));
    }

    /// Counts a chunk read by where the chunk came from.
    pub fn cache_lookup(&self, source: CacheSource) {
        self.gateway
            .cache_lookups
            .with_label_values(&[source.label()])
            .inc();
    }

    /// Counts object bytes sent to a tenant from a chunk of `source`.
    pub fn cache_served(&self, source: CacheSource, n: u64) {
        self.gateway
            .cache_bytes
            .with_label_values(&[source.label()])
            .inc_by(n);
    }

    /// Sets the number of cached chunks.
    pub fn cache_resident(&self, n: usize) {
        self.gateway.cache_chunks.set(gauge_value(n));
    }

    /// Counts an RDMA PutObject's write-allocation by outcome (`kept`,
    /// `too_large`, `no_slot`, `failed`).
    pub fn cache_write_allocation(&self, outcome: &str) {
        self.gateway
            .cache_write_allocated
            .with_label_values(&[outcome])
            .inc();
    }

    /// Counts an eviction for space; `n` chunks remain.
    pub fn cache_evicted(&self, n: usize) {
        self.gateway
            .cache_evictions
            .with_label_values(&["space"])
            .inc();
        self.cache_resident(n);
    }

    /// Counts `dropped` chunks of older versions; `n` chunks remain.
    pub fn cache_dropped_stale(&self, dropped: usize, n: usize) {
        self.gateway
            .cache_evictions
            .with_label_values(&["stale"])
            .inc_by(dropped as u64);
        self.cache_resident(n);
    }

    /// Counts a read's authorization: confirmed `upstream` or `recent`.
    pub fn revalidation(&self, how: &str) {
        self.gateway.revalidations.with_label_values(&[how]).inc();
    }

    /// Records one upstream request: its latency, and its error kind when
    /// it failed.
    pub fn upstream(&self, op: &str, elapsed: Duration, error: Option<&str>) {
        self.gateway
            .upstream
            .with_label_values(&[op])
            .observe(elapsed.as_secs_f64());
        if let Some(kind) = error {
            self.gateway
                .upstream_errors
                .with_label_values(&[op, kind])
                .inc();
        }
    }

    /// Counts object bytes read from (`in`) or written to (`out`) the upstream.
    pub fn upstream_bytes(&self, direction: &str, n: u64) {
        self.gateway
            .upstream_bytes
            .with_label_values(&[direction])
            .inc_by(n);
    }

    /// Sets how many staging buffers one session or one user may hold.
    pub fn staging_share_cap(&self, n: usize) {
        self.rdma_share_cap
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Sets how many staging buffers the shared class may hold.
    pub fn staging_shared_class_cap(&self, n: usize) {
        self.limits.shared_class_cap.set(gauge_value(n));
    }

    /// Counts a fabric session failed for want of progress.
    pub fn rdma_session_stalled(&self) {
        self.limits.stalled_sessions.inc();
    }

    /// Counts an S3 connection opened (`true`) or closed (`false`).
    pub fn connection(&self, open: bool) {
        if open {
            self.limits.connections.inc();
        } else {
            self.limits.connections.dec();
        }
    }

    /// Counts an S3 connection closed at accept (`max_connections`).
    pub fn connection_refused(&self) {
        self.limits.connections_refused.inc();
    }

    /// Counts an aws-chunked body refused for its chunk header.
    pub fn aws_chunk_refused(&self) {
        self.limits.chunks_refused.inc();
    }

    /// Counts a staging buffer request that waited for its `limit`'s share
    /// (`session` (the endpoint) | `user` | `shared` (the shared class)).
    pub fn staging_share_wait(&self, limit: &str) {
        self.rdma_share_waits.with_label_values(&[limit]).inc();
    }

    /// Counts a successful data request on `path` (`rdma` | `http`).
    pub fn path_request(&self, op: &str, path: &str) {
        self.path_requests.with_label_values(&[op, path]).inc();
    }

    /// Counts object bytes moved on `path` in `direction` (`in` | `out`).
    pub fn path_bytes(&self, path: &str, direction: &str, n: u64) {
        self.path_bytes
            .with_label_values(&[path, direction])
            .inc_by(n);
    }

    /// Records one RDMA operation's latency.
    pub fn rdma_op(&self, op: &str, elapsed: Duration) {
        self.rdma_ops
            .with_label_values(&[op])
            .observe(elapsed.as_secs_f64());
    }

    /// Records one finished request.
    pub fn observe(&self, op: &str, status: u16, elapsed: Duration) {
        s3dma_service::request::RequestMetrics::request(self, "", op, &status.to_string(), elapsed);
    }

    /// Counts body bytes received.
    pub fn add_bytes_in(&self, n: u64) {
        self.bytes.with_label_values(&["in"]).inc_by(n);
    }

    /// Counts body bytes sent.
    pub fn add_bytes_out(&self, n: u64) {
        self.bytes.with_label_values(&["out"]).inc_by(n);
    }

    /// The metrics in Prometheus text format.
    #[must_use]
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let enc = prometheus::TextEncoder::new();
        if let Err(e) = enc.encode(&self.registry.gather(), &mut buf) {
            warn!(error = %e, "encoding metrics failed");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// The fabric pools' gauges and connect counter (the staging and session
/// pools live in [`fabric::pool`]).
impl fabric::pool::PoolObserver for Metrics {
    /// Sets the number of registered staging buffers.
    fn staging_total(&self, n: usize) {
        self.rdma_staging_total
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Sets the number of staging buffers in use.
    fn staging_in_use(&self, n: usize) {
        self.rdma_staging_in_use
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Sets the number of pooled sessions.
    fn sessions(&self, n: usize) {
        self.rdma_sessions.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Counts a session connect attempt by result (`ok`, `timeout`, `error`).
    fn connect(&self, result: &'static str) {
        self.rdma_connects.with_label_values(&[result]).inc();
    }
}

/// The requests counter (by op and HTTP status) and the duration
/// histogram (by op) behind the request envelope; the target has no
/// tenants.
impl s3dma_service::request::RequestMetrics for Metrics {
    fn request(&self, _tenant: &str, op: &str, status: &str, elapsed: Duration) {
        self.requests.with_label_values(&[op, status]).inc();
        self.duration
            .with_label_values(&[op])
            .observe(elapsed.as_secs_f64());
    }
}

/// Where a chunk of the gateway's read cache came from (the `source`
/// label of the cache metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheSource {
    /// Already cached.
    Cache,
    /// This request fetched it from the upstream.
    Upstream,
    /// Another request was fetching it; this one waited for that fetch.
    SingleFlight,
}

impl CacheSource {
    /// The metric label.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            CacheSource::Cache => "cache",
            CacheSource::Upstream => "upstream",
            CacheSource::SingleFlight => "single_flight",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_names() {
        let m = Metrics::new();
        m.observe("GetObject", 200, Duration::from_millis(3));
        m.add_bytes_in(10);
        m.add_bytes_out(20);
        let text = m.render();
        assert!(
            text.contains(
                "s3dma_storage_target_requests_total{op=\"GetObject\",outcome=\"200\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("s3dma_storage_target_request_duration_seconds_bucket{op=\"GetObject\"")
        );
        assert!(text.contains("s3dma_storage_target_bytes_total{direction=\"in\"} 10"));
        assert!(text.contains("s3dma_storage_target_bytes_total{direction=\"out\"} 20"));
    }
}
