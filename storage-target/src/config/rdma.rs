//! The `rdma:` section: serving GetObject/PutObject/UploadPart over RDMA
//! (`x-amz-rdma-token`), its staging pool, sessions and limits.

use std::path::PathBuf;

use fabric::{Backend, FabricKey};
use s3dma_config::{ByteSize, ConfigError};
use serde::Deserialize;

use super::networks;

/// Whether the target serves requests that carry `x-amz-rdma-token` over RDMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RdmaMode {
    /// Serve over the fabric.
    Enabled,
    /// Decline with `x-amz-rdma-reply: 501` (the default).
    #[default]
    Disabled,
}

/// The `rdma:` section of the configuration.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaConfig {
    /// `enabled` or `disabled` (default): whether requests carrying
    /// `x-amz-rdma-token` are served over the fabric or declined with
    /// `x-amz-rdma-reply: 501`.
    #[serde(default)]
    pub mode: RdmaMode,
    /// Fabric backend: `tcp` (default; software RDMA over authenticated
    /// TCP, works everywhere) or `verbs` (when no RDMA device exists the
    /// target logs a warning and declines RDMA requests with 501).
    #[serde(default = "default_backend")]
    pub backend: Backend,
    /// verbs only: the RDMA device ports (rails) this server's queue pairs
    /// use, each with its own protection domain, staging buffers
    /// (`staging_buffers` per rail) and sessions. A request is served from
    /// the rail whose device's address shares the longest prefix with the
    /// address of the endpoint its token names (one subnet per rail: a
    /// client rail on 10.0.2.0/24 is reached from the local rail on
    /// 10.0.2.0/24). cuObject DC, hipobj-rc-v2 and a gateway's cache use
    /// the first rail. Each device, port and GID index must exist
    /// (checked at start); 1 to 8. Default: none (the first device's port
    /// 1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rails: Vec<fabric::rail::DeviceRail>,
    /// File holding the pre-shared fabric key: hexadecimal, at least 32 hex
    /// digits (16 bytes), 64 (32 bytes) recommended; surrounding whitespace
    /// is ignored; mode 0600 or stricter. Required when `mode: enabled`
    /// (no default). Generate one with `openssl rand -hex 32`.
    #[serde(default)]
    pub fabric_key_file: Option<PathBuf>,
    /// Number of registered staging buffers (bounds memory and in-flight
    /// data). Default 32; between 1 and 4096.
    #[serde(default = "default_staging_buffers")]
    pub staging_buffers: usize,
    /// Size of each staging buffer, i.e. the RDMA chunk size (bytes, or e.g.
    /// `4MiB`); between 4KiB and 256MiB. Default `4MiB`.
    #[serde(default = "default_staging_buffer_size")]
    pub staging_buffer_size: ByteSize,
    /// Most RDMA operations in flight on one session (one per client
    /// endpoint). Default 16; at least 1.
    #[serde(default = "default_max_ops_per_session")]
    pub max_ops_per_session: usize,
    /// Most RDMA operations in flight in total. Default 256; at least 1.
    #[serde(default = "default_max_ops_total")]
    pub max_ops_total: usize,
    /// Time allowed to connect (and authenticate) to a client's endpoint, in
    /// milliseconds; past it the request fails with `RDMATransferFailed`.
    /// Default 2000; at least 1.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Sessions idle this many seconds (nothing in flight) are closed.
    /// Default 60; at least 1.
    #[serde(default = "default_idle_session_secs")]
    pub idle_session_secs: u64,
    /// Largest share of the staging buffers that one client endpoint (all
    /// its sessions) and, separately, one S3 user may hold at a time, as a
    /// fraction in (0, 1]: `staging_buffers x max_staging_share` buffers,
    /// rounded down, which must be at least one. Default 0.5, so one slow
    /// or stalled client always leaves half the pool to others; 1 disables
    /// the caps.
    #[serde(default = "default_max_staging_share")]
    pub max_staging_share: f64,
    /// The S3 users (access key ids) that serve tenants: the dpu-agents'
    /// users. Every other user, and an anonymous caller, is in the shared
    /// class, which holds at most `max_shared_staging_share` of the pool in
    /// total, so no number of such users can take the buffers the tenants'
    /// requests need. Each entry must be one of `users[].access_key_id`.
    /// Default: none (every user is in the shared class).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenant_users: Vec<String>,
    /// Largest share of the staging buffers that all users not listed in
    /// `tenant_users` (and anonymous callers) may hold together, as a
    /// fraction in (0, 1] (rounded down, at least one buffer). Default 0.5;
    /// 1 lets the shared class take the whole pool (the per-user cap still
    /// applies).
    #[serde(default = "default_max_shared_staging_share")]
    pub max_shared_staging_share: f64,
    /// Seconds an RDMA operation may stay in flight: one that has not
    /// completed by then means the client's endpoint stalled, and the
    /// target fails that fabric session (every operation on it completes
    /// with an error and its staging buffers come back once the transport
    /// no longer touches them); the request fails with
    /// `RDMATransferFailed`. Default 30; at least 1.
    #[serde(default = "default_progress_timeout_secs")]
    pub progress_timeout_secs: u64,
    /// TCP streams per fabric session to a client's endpoint (`backend:
    /// tcp`; verbs ignores it): a transfer's WRITEs and READs are striped
    /// over them in 4 MiB units of the client's memory, so sending and the
    /// kernel's loopback or NIC work spread over several cores. 1 to 16;
    /// default 2 (on the 2-CPU development machine a 1 GiB GET went from
    /// 2.35 to 3.27 GB/s with 2).
    #[serde(default = "default_tcp_streams")]
    pub tcp_streams: usize,
    /// The networks (CIDR, e.g. `10.0.0.0/8`, `fd00::/8`, or single
    /// addresses) of the client fabric endpoints this target may connect
    /// to. A token naming an address outside them is refused with `403
    /// AccessDenied` before any connection is tried, so that a signed
    /// request cannot make the target connect anywhere else (a port scan
    /// from the storage network). The unspecified address and multicast
    /// are never allowed. Default: loopback only (`127.0.0.0/8`,
    /// `::1/128`), which suits the local stack; a deployment lists its
    /// fabric networks.
    #[serde(default = "networks::default_allowed")]
    pub allowed_client_networks: Vec<networks::Cidr>,
    /// The hipobj-rc-v2 server (`POST /.hipobj-rc/…`, verbs only): its
    /// session and staging caps and deadlines.
    #[serde(default)]
    pub hipobj: super::hipobj::HipobjConfig,
    /// Standard (cuObject) tokens served over DC (`dc` feature, mlx5
    /// devices): initiators, the DC key, traffic class.
    #[serde(default)]
    pub dc: super::dc::DcConfig,
    /// s3dma batch requests (`POST /?s3dma-batch`): items, body and
    /// window bytes per batch.
    #[serde(default)]
    pub batch: super::batch::BatchConfig,
}

fn default_tcp_streams() -> usize {
    2
}

fn default_backend() -> Backend {
    Backend::Tcp
}
fn default_staging_buffers() -> usize {
    32
}
fn default_staging_buffer_size() -> ByteSize {
    ByteSize(4 << 20)
}
fn default_max_ops_per_session() -> usize {
    16
}
fn default_max_ops_total() -> usize {
    256
}
fn default_connect_timeout_ms() -> u64 {
    2000
}
fn default_idle_session_secs() -> u64 {
    60
}
fn default_max_staging_share() -> f64 {
    0.5
}
fn default_max_shared_staging_share() -> f64 {
    0.5
}
fn default_progress_timeout_secs() -> u64 {
    30
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            mode: RdmaMode::Disabled,
            backend: default_backend(),
            rails: Vec::new(),
            fabric_key_file: None,
            staging_buffers: default_staging_buffers(),
            staging_buffer_size: default_staging_buffer_size(),
            max_ops_per_session: default_max_ops_per_session(),
            max_ops_total: default_max_ops_total(),
            connect_timeout_ms: default_connect_timeout_ms(),
            idle_session_secs: default_idle_session_secs(),
            max_staging_share: default_max_staging_share(),
            tenant_users: Vec::new(),
            max_shared_staging_share: default_max_shared_staging_share(),
            progress_timeout_secs: default_progress_timeout_secs(),
            tcp_streams: default_tcp_streams(),
            allowed_client_networks: networks::default_allowed(),
            hipobj: super::hipobj::HipobjConfig::default(),
            dc: super::dc::DcConfig::default(),
            batch: super::batch::BatchConfig::default(),
        }
    }
}

impl RdmaConfig {
    /// Validates values; returns the fabric key when RDMA is enabled.
    /// `file` names the configuration file in errors.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first offending field (under
    /// `rdma.`).
    pub fn validate(&self, file: &str) -> Result<Option<FabricKey>, ConfigError> {
        let bad = |f: &str, m: String| Err(ConfigError::invalid(file, format!("rdma.{f}"), m));
        if self.staging_buffers == 0 || self.staging_buffers > 4096 {
            return bad("staging_buffers", "must be between 1 and 4096".into());
        }
        let sz = self.staging_buffer_size.0;
        if !(4 << 10..=256 << 20).contains(&sz) {
            return bad(
                "staging_buffer_size",
                format!("must be between 4KiB and 256MiB, got {sz} bytes"),
            );
        }
        if self.staging_buffers as u64 * sz > 16 << 30 {
            return bad(
                "staging_buffer_size",
                "staging_buffers x staging_buffer_size must not exceed 16GiB".into(),
            );
        }
        if self.max_ops_per_session == 0 {
            return bad("max_ops_per_session", "must be at least 1".into());
        }
        if self.max_ops_total == 0 {
            return bad("max_ops_total", "must be at least 1".into());
        }
        if self.connect_timeout_ms == 0 {
            return bad("connect_timeout_ms", "must be at least 1".into());
        }
        if self.idle_session_secs == 0 {
            return bad("idle_session_secs", "must be at least 1".into());
        }
        if !self.rails.is_empty() {
            if self.backend != Backend::Verbs {
                return bad(
                    "rails",
                    "applies to the verbs backend only (over tcp the kernel's routing picks each connection's interface); remove it".into(),
                );
            }
            fabric::rail::validate_device_rails(&self.rails).map_err(|e| {
                ConfigError::invalid(file, format!("rdma.{}", e.field()), e.problem.to_string())
            })?;
        }
        self.hipobj.validate(file)?;
        self.dc.validate(file)?;
        self.batch.validate(file)?;
        let share = self.max_staging_share;
        if !(share > 0.0 && share <= 1.0) {
            return bad(
                "max_staging_share",
                format!("must be a fraction greater than 0 and at most 1, got {share}"),
            );
        }
        if cap(self.staging_buffers, share).is_none() {
            return bad(
                "max_staging_share",
                format!(
                    "{share} of {} staging buffers is less than one buffer: raise staging_buffers or max_staging_share",
                    self.staging_buffers
                ),
            );
        }
        let shared = self.max_shared_staging_share;
        if !(shared > 0.0 && shared <= 1.0) {
            return bad(
                "max_shared_staging_share",
                format!("must be a fraction greater than 0 and at most 1, got {shared}"),
            );
        }
        if self.progress_timeout_secs == 0 {
            return bad("progress_timeout_secs", "must be at least 1".into());
        }
        if !(1..=16).contains(&self.tcp_streams) {
            return bad(
                "tcp_streams",
                format!("must be between 1 and 16, got {}", self.tcp_streams),
            );
        }
        if self.mode == RdmaMode::Disabled {
            return Ok(None);
        }
        let Some(path) = &self.fabric_key_file else {
            return bad(
                "fabric_key_file",
                "required when rdma.mode is enabled".into(),
            );
        };
        fabric::config::read_fabric_key_file(path)
            .map(Some)
            .map_err(|e| ConfigError::invalid(file, "rdma.fabric_key_file", e))
    }
}

/// Number of buffers one session or one user may hold: `share` of `count`,
/// rounded down; `None` when that is no buffer at all.
#[must_use]
pub fn cap(count: usize, share: f64) -> Option<usize> {
    let n = (count as f64 * share).floor() as usize;
    (n >= 1).then_some(n.min(count))
}
