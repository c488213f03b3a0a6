//! The shim's Prometheus metrics and the `/metrics` endpoint.

use prometheus::{
    Encoder as _, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry as PromRegistry, TextEncoder,
};

/// Every metric the shim exports (names start with `s3dma_shim_`).
#[derive(Debug)]
pub struct Metrics {
    registry: PromRegistry,
    /// Tenant calls by tenant, operation and gRPC code.
    pub requests: IntCounterVec,
    /// Call latency by operation, seconds.
    pub latency: HistogramVec,
    /// Object bytes placed into / taken from tenant buffers, by tenant and
    /// direction (`get`, `put`).
    pub bytes: IntCounterVec,
    /// Registered buffers per tenant.
    pub buffers: IntGaugeVec,
    /// Registered bytes per tenant.
    pub buffer_bytes: IntGaugeVec,
    /// Open leases (client processes) per tenant.
    pub leases: IntGaugeVec,
    /// Windows minted and not yet revoked.
    pub windows_open: IntGauge,
    /// Connections refused before any tenant call, by reason.
    pub refused: IntCounterVec,
    /// 1 while the link to the dpu-agent is up.
    pub agent_connected: IntGauge,
    /// Reconnects to the dpu-agent.
    pub agent_reconnects: IntCounter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    ///
    /// # Panics
    /// Never in practice: names are static and unique.
    #[must_use]
    pub fn new() -> Metrics {
        let registry = PromRegistry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "s3dma_shim_requests_total",
                "Tenant calls by tenant, op and outcome (the gRPC code name)",
            ),
            &["tenant", "op", "outcome"],
        )
        .expect("metric");
        let latency = HistogramVec::new(
            HistogramOpts::new("s3dma_shim_request_seconds", "Tenant call latency by op").buckets(
                vec![
                    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 120.0,
                ],
            ),
            &["op"],
        )
        .expect("metric");
        let bytes = IntCounterVec::new(
            Opts::new(
                "s3dma_shim_bytes_total",
                "Object bytes placed into (op GetObject) or taken from (op PutObject) tenant buffers",
            ),
            &["tenant", "op"],
        )
        .expect("metric");
        let buffers = IntGaugeVec::new(
            Opts::new("s3dma_shim_buffers", "Registered buffers per tenant"),
            &["tenant"],
        )
        .expect("metric");
        let buffer_bytes = IntGaugeVec::new(
            Opts::new("s3dma_shim_buffer_bytes", "Registered bytes per tenant"),
            &["tenant"],
        )
        .expect("metric");
        let leases = IntGaugeVec::new(
            Opts::new(
                "s3dma_shim_leases",
                "Open leases (client processes) per tenant",
            ),
            &["tenant"],
        )
        .expect("metric");
        let windows_open = IntGauge::new(
            "s3dma_shim_windows_open",
            "Windows minted and not yet revoked",
        )
        .expect("metric");
        let refused = IntCounterVec::new(
            Opts::new(
                "s3dma_shim_connections_refused_total",
                "Socket connections refused before any call, by reason",
            ),
            &["reason"],
        )
        .expect("metric");
        let agent_connected = IntGauge::new(
            "s3dma_shim_agent_connected",
            "1 while the link to the dpu-agent is up",
        )
        .expect("metric");
        let agent_reconnects = IntCounter::new(
            "s3dma_shim_agent_reconnects_total",
            "Reconnects to the dpu-agent",
        )
        .expect("metric");
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(latency.clone()),
            Box::new(bytes.clone()),
            Box::new(buffers.clone()),
            Box::new(buffer_bytes.clone()),
            Box::new(leases.clone()),
            Box::new(windows_open.clone()),
            Box::new(refused.clone()),
            Box::new(agent_connected.clone()),
            Box::new(agent_reconnects.clone()),
        ] {
            registry.register(c).expect("unique metric");
        }
        Metrics {
            registry,
            requests,
            latency,
            bytes,
            buffers,
            buffer_bytes,
            leases,
            windows_open,
            refused,
            agent_connected,
            agent_reconnects,
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}
