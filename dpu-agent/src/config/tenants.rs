//! `shims:` and `tenants:`: who may connect, and the tenants they act for
//! with their grants and quotas.

use std::path::PathBuf;

use s3dma_config::{ByteSize, GIB};
use serde::Deserialize;

/// `shims[]:` — one host-shim (one host) allowed to connect.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ShimConfig {
    /// Unique name of the shim (used in logs and metrics), e.g. the host name.
    pub name: String,
    /// File holding the shim's bearer token; the shim sends
    /// `authorization: Bearer <token>`. The token is the file's content with
    /// surrounding whitespace trimmed: at least 16 printable ASCII characters
    /// without spaces, distinct for every shim (e.g. `openssl rand -hex 32`).
    /// At least one of `token_file` and `tls_name` is required.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Name the shim's client certificate must carry: one of its DNS subject
    /// alternative names, or its common name when it has no DNS SANs. Requires `listen.tls`; distinct
    /// for every shim.
    #[serde(default)]
    pub tls_name: Option<String>,
    /// Names of the tenants this shim may act for (at least one; each must be
    /// in `tenants`).
    pub tenants: Vec<String>,
}

/// `tenants[]:` — one tenant: S3 credentials, what it may access, its quotas.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Unique tenant name, used by shims and in logs and metrics.
    pub name: String,
    /// The S3 access key id the agent signs this tenant's requests with
    /// (SigV4). Printable ASCII without spaces; unique among tenants.
    pub access_key_id: String,
    /// File holding the S3 secret access key (surrounding whitespace is
    /// trimmed; must not be empty). Read by the agent only; it never leaves
    /// the DPU.
    pub secret_access_key_file: PathBuf,
    /// What the tenant may read and write. Everything not granted is denied;
    /// an empty list denies everything.
    pub allow: Vec<Grant>,
    /// Limits on the tenant's concurrent work and bandwidth. Optional.
    #[serde(default)]
    pub quotas: Quotas,
}

/// `tenants[].allow[]:` — a grant of access to keys under a prefix of a bucket.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// Bucket name, or `"*"` for every bucket. No `/`; `*` only alone
    /// (patterns such as `team-*` are not supported).
    pub bucket: String,
    /// Key prefix the grant covers; `""` (default) covers every key. Listing
    /// is allowed only under a prefix that starts with this one.
    #[serde(default)]
    pub prefix: String,
    /// Whether the grant allows reading (GetObject, HeadObject, listing).
    /// Default `true`.
    #[serde(default = "default_grant_read")]
    pub read: bool,
    /// Whether the grant allows writing (PutObject, multipart uploads).
    /// Default `false`. At least one of `read` and `write` must be `true`.
    #[serde(default)]
    pub write: bool,
}

/// `tenants[].quotas:` — per-tenant limits enforced by the agent.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Quotas {
    /// Requests of this tenant served at the same time. Default 64; at least 1.
    #[serde(default = "default_max_concurrent_requests")]
    pub max_concurrent_requests: usize,
    /// Requests waiting for a slot beyond the concurrent ones; further
    /// requests are refused at once with `SlowDown`. Default 256; 0 = no queue.
    #[serde(default = "default_max_queued_requests")]
    pub max_queued_requests: usize,
    /// Bytes of this tenant's chunks in flight at once, over all its requests.
    /// Default `1GiB`; at least `transfer.chunk_size` (otherwise no chunk
    /// could ever start).
    #[serde(default = "default_max_bytes_in_flight")]
    pub max_bytes_in_flight: ByteSize,
    /// Bandwidth cap for the tenant, bytes per second (e.g. `2GiB`). Omit for
    /// unlimited (default); at least 1 when set.
    #[serde(default)]
    pub max_bytes_per_second: Option<ByteSize>,
}

impl Default for Quotas {
    fn default() -> Quotas {
        Quotas {
            max_concurrent_requests: default_max_concurrent_requests(),
            max_queued_requests: default_max_queued_requests(),
            max_bytes_in_flight: default_max_bytes_in_flight(),
            max_bytes_per_second: None,
        }
    }
}

fn default_grant_read() -> bool {
    true
}

fn default_max_concurrent_requests() -> usize {
    64
}

fn default_max_queued_requests() -> usize {
    256
}

fn default_max_bytes_in_flight() -> ByteSize {
    ByteSize(GIB)
}
