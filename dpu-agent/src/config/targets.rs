//! `targets:`, the S3 endpoints (storage targets) and the buckets each serves.

use std::path::PathBuf;

use serde::Deserialize;

/// `targets[]:` — one S3 endpoint and the buckets it serves.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// Unique target name (logs and metrics).
    pub name: String,
    /// Base URL: `http://host:port` or `https://host:port` (the port is
    /// required, e.g. `https://s3.example.com:443`; an IPv6 address in
    /// brackets); no path other than `/`, no query, no user info.
    /// Path-style requests (`/bucket/key`) are sent to it.
    pub endpoint: String,
    /// SigV4 signing region. Default `us-east-1`; must not be empty.
    #[serde(default = "default_region")]
    pub region: String,
    /// Bucket names served by this target, or `"*"` for every bucket no
    /// target lists by name. At least one; each once per target. A name
    /// (or `"*"`) listed by several targets makes them a group: the chunks
    /// of an object are spread over the group by rendezvous hashing on
    /// (bucket, key, chunk), so each caches a distinct share, and a target
    /// that gives no answer is skipped for the next of the ranking for a
    /// few seconds. The targets of a group must serve the same data (e.g.
    /// storage-target gateways in front of one S3 cluster).
    pub buckets: Vec<String>,
    /// Whether requests carry `x-amz-rdma-token` so the target moves the bytes
    /// by RDMA. `false` = plain S3: always the HTTP fallback path through the
    /// agent's staging buffers. Default `true`.
    #[serde(default = "default_rdma")]
    pub rdma: bool,
    /// PEM CA bundle to trust for an `https://` endpoint with a private CA
    /// (in addition to the system roots). Only with `https://`.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Idle keep-alive HTTP connections kept per target. Default 64; 0
    /// disables keep-alive.
    #[serde(default = "default_max_idle_connections")]
    pub max_idle_connections: usize,
}

impl TargetConfig {
    /// Target `name` at `endpoint` serving `buckets` over RDMA, in the
    /// default region, with the default keep-alive pool and no private CA.
    #[must_use]
    pub fn new(
        name: impl Into<String>,
        endpoint: impl Into<String>,
        buckets: Vec<String>,
    ) -> TargetConfig {
        TargetConfig {
            name: name.into(),
            endpoint: endpoint.into(),
            region: default_region(),
            buckets,
            rdma: default_rdma(),
            ca_file: None,
            max_idle_connections: default_max_idle_connections(),
        }
    }
}

fn default_region() -> String {
    "us-east-1".to_owned()
}

fn default_rdma() -> bool {
    true
}

fn default_max_idle_connections() -> usize {
    64
}
