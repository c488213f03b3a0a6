//! `fabric:`, the RDMA fabric: backend, key and staging memory.

use std::path::PathBuf;

use fabric::Backend;
use s3dma_config::{ByteSize, MIB};
use serde::Deserialize;

/// `fabric:` — the RDMA fabric the agent uses to expose tenants' memory and
/// its staging buffers to storage targets.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FabricConfig {
    /// Fabric backend: `tcp` (software RDMA over authenticated TCP, works
    /// everywhere; default) or `verbs` (RDMA verbs on an RDMA NIC).
    #[serde(default = "default_backend")]
    pub backend: Backend,
    /// File holding the pre-shared fabric key as hex: at least 32 hex digits
    /// (16 bytes), 64 recommended (`openssl rand -hex 32`); surrounding
    /// whitespace is ignored. Storage targets must hold the same key.
    /// Required.
    pub fabric_key_file: PathBuf,
    /// Number of registered staging buffers used by the HTTP fallback path.
    /// Default 32; 1..=4096. Memory used: `staging_buffers` x
    /// `staging_buffer_size`, at most 16GiB.
    #[serde(default = "default_staging_buffers")]
    pub staging_buffers: usize,
    /// Size of each staging buffer. Default `4MiB`; 4KiB..=256MiB.
    #[serde(default = "default_staging_buffer_size")]
    pub staging_buffer_size: ByteSize,
    /// Time allowed to connect (and authenticate) to a fabric endpoint, in
    /// milliseconds. Default 2000; at least 1.
    #[serde(default = "default_fabric_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Most RDMA operations in flight on one fabric session. Default 64; at
    /// least 1.
    #[serde(default = "default_max_ops_per_session")]
    pub max_ops_per_session: usize,
    /// Fabric sessions idle this many seconds (nothing in flight) are closed.
    /// Default 60; at least 1.
    #[serde(default = "default_idle_session_secs")]
    pub idle_session_secs: u64,
    /// Most of the staging pool one tenant may hold at once, in percent of
    /// `staging_buffers` (rounded down, at least one buffer): a tenant whose
    /// transfers all take the fallback path waits for its own buffers
    /// instead of holding the whole pool. A tenant's share is further
    /// limited to its `quotas.max_bytes_in_flight` (in buffers, rounded
    /// up); the agent logs each tenant's effective share at start-up.
    /// Default 50; 1..=100 (100 = no per-tenant limit).
    #[serde(default = "default_tenant_staging_share_percent")]
    pub tenant_staging_share_percent: u32,
}

impl FabricConfig {
    /// The default backend and staging pool, with the fabric key in
    /// `fabric_key_file`.
    #[must_use]
    pub fn new(fabric_key_file: PathBuf) -> FabricConfig {
        FabricConfig {
            backend: default_backend(),
            fabric_key_file,
            staging_buffers: default_staging_buffers(),
            staging_buffer_size: default_staging_buffer_size(),
            connect_timeout_ms: default_fabric_connect_timeout_ms(),
            max_ops_per_session: default_max_ops_per_session(),
            idle_session_secs: default_idle_session_secs(),
            tenant_staging_share_percent: default_tenant_staging_share_percent(),
        }
    }
}

fn default_backend() -> Backend {
    Backend::Tcp
}

pub(super) fn default_staging_buffers() -> usize {
    32
}

pub(super) fn default_staging_buffer_size() -> ByteSize {
    ByteSize(4 * MIB)
}

fn default_fabric_connect_timeout_ms() -> u64 {
    2000
}

fn default_max_ops_per_session() -> usize {
    64
}

fn default_idle_session_secs() -> u64 {
    60
}

fn default_tenant_staging_share_percent() -> u32 {
    50
}
