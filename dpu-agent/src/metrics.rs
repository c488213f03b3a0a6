//! Prometheus metrics of the agent, served at `/metrics` by
//! [`s3dma_service::metrics::MetricsServer`] (`metrics.address`,
//! `metrics.unix_socket`, `metrics.bearer_token_file`). Labels carry
//! tenant, operation, path and target names, never keys, tokens or
//! credentials.

use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    Encoder as _, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use tracing::warn;

/// The agent's metrics.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    bytes: IntCounterVec,
    batch_items: IntCounterVec,
    batch_requests: IntCounterVec,
    in_flight: IntGaugeVec,
    queued: IntGaugeVec,
    target_requests: IntCounterVec,
    target_up: IntGaugeVec,
    target_skips: IntCounterVec,
    retries: IntCounterVec,
    auth_failures: IntCounterVec,
    staging_total: IntGauge,
    staging_in_use: IntGauge,
    sessions: IntGauge,
    connects: IntCounterVec,
    connections: IntGauge,
    connections_closed: IntCounterVec,
    stored_mismatches: IntCounterVec,
    parts_over_http: IntGaugeVec,
    rail_bytes: IntCounterVec,
    rail_operations: IntCounterVec,
    rail_up: IntGaugeVec,
    rail_redone: IntCounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every metric on a fresh registry.
    #[must_use]
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let r = &registry;
        let latency = registered(
            r,
            HistogramVec::new(
                HistogramOpts::new(
                    "s3dma_agent_request_seconds",
                    "Tenant request latency in seconds",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0,
                ]),
                &["tenant", "op"],
            ),
        );
        Metrics {
            requests: counters(
                r,
                "s3dma_agent_requests_total",
                "Tenant requests by operation and outcome",
                &["tenant", "op", "outcome"],
            ),
            latency,
            bytes: counters(
                r,
                "s3dma_agent_bytes_total",
                "Object bytes moved for tenants, by path (rdma | fallback)",
                &["tenant", "op", "path"],
            ),
            batch_items: counters(
                r,
                "s3dma_agent_batch_items_total",
                "Items of HeadObjects, PutObjects and DeleteObjects batches, and GetObjects items served by batched target requests, by outcome (ok | missing | the error's status label)",
                &["tenant", "op", "outcome"],
            ),
            batch_requests: counters(
                r,
                "s3dma_agent_target_batch_requests_total",
                "s3dma batch requests sent to targets (HEAD, GET, PUT items as one signed request), by outcome (ok | declined | failed | refused: the tenant's quota)",
                &["op", "outcome"],
            ),
            in_flight: gauges(
                r,
                "s3dma_agent_requests_in_flight",
                "Tenant requests running",
                &["tenant"],
            ),
            queued: gauges(
                r,
                "s3dma_agent_requests_queued",
                "Tenant requests waiting for a concurrency slot",
                &["tenant"],
            ),
            target_requests: counters(
                r,
                "s3dma_agent_target_requests_total",
                "S3 requests sent to targets, by HTTP status (or `error` when no reply came)",
                &["target", "method", "outcome"],
            ),
            target_up: gauges(
                r,
                "s3dma_agent_target_up",
                "1 while a target is healthy, 0 during the cool-down after a request got no answer from it (a group then skips it)",
                &["target"],
            ),
            target_skips: counters(
                r,
                "s3dma_agent_target_skips_total",
                "Chunks sent to another target of a group because their first choice was cooling down",
                &["target"],
            ),
            retries: counters(
                r,
                "s3dma_agent_retries_total",
                "Retried S3 attempts by target and reason",
                &["target", "reason"],
            ),
            auth_failures: counters(
                r,
                "s3dma_agent_auth_failures_total",
                "Calls refused before reaching a tenant (bad shim credentials or tenant not assigned)",
                &["reason"],
            ),
            staging_total: gauge(
                r,
                "s3dma_agent_staging_buffers",
                "Registered staging buffers (fallback path)",
            ),
            staging_in_use: gauge(
                r,
                "s3dma_agent_staging_buffers_in_use",
                "Staging buffers in use",
            ),
            sessions: gauge(
                r,
                "s3dma_agent_fabric_sessions",
                "Open fabric sessions to tenant endpoints (fallback path)",
            ),
            connects: counters(
                r,
                "s3dma_agent_fabric_connects_total",
                "Fabric session connects by outcome (ok | error | timeout)",
                &["outcome"],
            ),
            connections: gauge(
                r,
                "s3dma_agent_grpc_connections",
                "Open gRPC connections (authenticated or not)",
            ),
            connections_closed: counters(
                r,
                "s3dma_agent_grpc_connections_closed_total",
                "gRPC connections the agent closed: over listen.max_connections (refused), \
                 never authenticated (unauthenticated) or idle",
                &["reason"],
            ),
            stored_mismatches: counters(
                r,
                "s3dma_agent_stored_mismatches_total",
                "PUTs failed because the object the target stored is not the one sent \
                 (kind: size, parts, bytes_transferred), by target",
                &["target", "kind"],
            ),
            parts_over_http: gauges(
                r,
                "s3dma_agent_target_parts_over_http",
                "1 when a target's multipart PUTs send their parts over HTTP \
                 (multipart_parts: http, or found to ignore the part target)",
                &["target"],
            ),
            rail_bytes: counters(
                r,
                "s3dma_agent_rail_bytes_total",
                "Bytes of GET chunks and PUT parts moved over each fabric rail (rail: the ip:port \
                 of the tenant endpoint the rail's token names; requests with several rails only)",
                &["rail", "op"],
            ),
            rail_operations: counters(
                r,
                "s3dma_agent_rail_operations_total",
                "GET chunks and PUT parts run over each fabric rail, by outcome (ok | failed: the \
                 rail failed it, it is redone on another rail | error: it failed for another reason)",
                &["rail", "op", "outcome"],
            ),
            rail_up: gauges(
                r,
                "s3dma_agent_rail_up",
                "1 while a fabric rail carries work, 0 after it failed a transfer (until a \
                 failback trial succeeds: 1 s after, then 2 s, then every 4 s)",
                &["rail"],
            ),
            rail_redone: counters(
                r,
                "s3dma_agent_rail_redone_total",
                "GET chunks and PUT parts that failed on this rail and were redone on another",
                &["rail", "op"],
            ),
            registry,
        }
    }

    /// `n` bytes of `op` (`get`, `put`) moved over `rail`.
    pub fn rail_bytes(&self, rail: &str, op: &str, n: u64) {
        self.rail_bytes.with_label_values(&[rail, op]).inc_by(n);
    }

    /// A chunk or part of `op` over `rail` ended with `outcome` (`ok`,
    /// `failed`, `error`).
    pub fn rail_operation(&self, rail: &str, op: &str, outcome: &str) {
        self.rail_operations
            .with_label_values(&[rail, op, outcome])
            .inc();
    }

    /// Sets whether `rail` carries work.
    pub fn rail_up(&self, rail: &str, up: bool) {
        self.rail_up.with_label_values(&[rail]).set(i64::from(up));
    }

    /// A chunk or part of `op` that failed on `rail` is redone on another.
    pub fn rail_redone(&self, rail: &str, op: &str) {
        self.rail_redone.with_label_values(&[rail, op]).inc();
    }

    /// Drops the series of a rail the selector no longer tracks.
    pub fn forget_rail(&self, rail: &str) {
        let _ = self.rail_up.remove_label_values(&[rail]);
        for op in ["get", "put"] {
            let _ = self.rail_bytes.remove_label_values(&[rail, op]);
            let _ = self.rail_redone.remove_label_values(&[rail, op]);
            for outcome in ["ok", "failed", "error"] {
                let _ = self
                    .rail_operations
                    .remove_label_values(&[rail, op, outcome]);
            }
        }
    }

    /// Open gRPC connections changed by `delta`.
    pub fn connections(&self, delta: i64) {
        self.connections.add(delta);
    }

    /// The agent closed a gRPC connection (`refused`, `unauthenticated`,
    /// `idle`).
    pub fn connection_closed(&self, reason: &str) {
        self.connections_closed.with_label_values(&[reason]).inc();
    }

    /// A finished tenant request.
    pub fn request(&self, tenant: &str, op: &str, outcome: &str, elapsed: Duration) {
        self.requests
            .with_label_values(&[tenant, op, outcome])
            .inc();
        self.latency
            .with_label_values(&[tenant, op])
            .observe(elapsed.as_secs_f64());
    }

    /// Object bytes moved.
    pub fn bytes(&self, tenant: &str, op: &str, path: &str, n: u64) {
        if n == 0 {
            return; // an empty object moved nothing on either path
        }
        self.bytes.with_label_values(&[tenant, op, path]).inc_by(n);
    }

    /// Items of one batch of `op` that ended with `outcome`.
    pub fn batch_item(&self, tenant: &str, op: &str, outcome: &str, n: u64) {
        if n > 0 {
            self.batch_items
                .with_label_values(&[tenant, op, outcome])
                .inc_by(n);
        }
    }

    /// One s3dma batch request of `op` to a target ended with `outcome`.
    pub fn batch_request(&self, op: &str, outcome: &str) {
        self.batch_requests.with_label_values(&[op, outcome]).inc();
    }

    /// Requests running for `tenant` changed by `delta`.
    pub fn in_flight(&self, tenant: &str, delta: i64) {
        self.in_flight.with_label_values(&[tenant]).add(delta);
    }

    /// Requests queued for `tenant`.
    pub fn queued(&self, tenant: &str, n: usize) {
        self.queued
            .with_label_values(&[tenant])
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// An S3 request to a target ended with `outcome` (its HTTP status
    /// code, or `error` when no reply came).
    pub fn target_request(&self, target: &str, method: &str, outcome: &str) {
        self.target_requests
            .with_label_values(&[target, method, outcome])
            .inc();
    }

    /// Sets whether `target` is healthy.
    pub fn target_up(&self, target: &str, up: bool) {
        self.target_up
            .with_label_values(&[target])
            .set(i64::from(up));
    }

    /// A chunk went past `target` (cooling down) to the next of its group.
    pub fn target_skip(&self, target: &str) {
        self.target_skips.with_label_values(&[target]).inc();
    }

    /// An attempt is retried.
    pub fn retry(&self, target: &str, reason: &str) {
        self.retries.with_label_values(&[target, reason]).inc();
    }

    /// A PUT to `target` found its stored object other than what was sent
    /// (`kind`: `size`, `parts`, `bytes_transferred`).
    pub fn stored_mismatch(&self, target: &str, kind: &str) {
        self.stored_mismatches
            .with_label_values(&[target, kind])
            .inc();
    }

    /// Sets whether `target`'s multipart PUTs send their parts over HTTP.
    pub fn parts_over_http(&self, target: &str, yes: bool) {
        self.parts_over_http
            .with_label_values(&[target])
            .set(i64::from(yes));
    }

    /// A call refused before reaching a tenant.
    pub fn auth_failure(&self, reason: &str) {
        self.auth_failures.with_label_values(&[reason]).inc();
    }

    /// Prometheus text exposition.
    #[must_use]
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            warn!(error = %e, "encoding metrics failed");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// `metric` (names are static and unique: never an error), registered.
fn registered<C: Collector + Clone + 'static>(
    registry: &Registry,
    metric: prometheus::Result<C>,
) -> C {
    let metric = metric.expect("metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("unique metric");
    metric
}

/// A registered counter family.
fn counters(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    registered(registry, IntCounterVec::new(Opts::new(name, help), labels))
}

/// A registered gauge family.
fn gauges(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    registered(registry, IntGaugeVec::new(Opts::new(name, help), labels))
}

/// A registered gauge.
fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    registered(registry, IntGauge::new(name, help))
}

impl fabric::pool::PoolObserver for Metrics {
    fn staging_total(&self, n: usize) {
        self.staging_total.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    fn staging_in_use(&self, n: usize) {
        self.staging_in_use
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    fn sessions(&self, n: usize) {
        self.sessions.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    fn connect(&self, result: &'static str) {
        self.connects.with_label_values(&[result]).inc();
    }
}
