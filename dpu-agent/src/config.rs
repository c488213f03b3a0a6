//! The dpu-agent YAML configuration file (`dpu-agent --config <file.yaml>`).
//!
//! The structs below are the operator reference: every field is documented
//! with its unit, default and bounds, and `dpu-agent.example.yaml` is a
//! complete, tested example. Unknown fields are rejected everywhere.
//!
//! * [`parse`] parses and validates the text without touching any other file
//!   (used by tests and by `load`).
//! * [`load`] reads the file, parses and validates it, reads the secret files
//!   (tenant secret access keys, shim bearer tokens, the fabric key) and checks
//!   that the TLS and CA files it names can be opened.
//!
//! Errors read `<file>: <field path>: <what is wrong>`, e.g.
//! `/etc/s3dma/agent.yaml: tenants[1].quotas.max_concurrent_requests: must be at least 1`;
//! YAML syntax, type and unknown-field errors read `<file>: <serde_yaml message>`
//! (which names the field, the line and the column).
//!
//! Secrets are held in [`Secret`] (tenant secret access keys, shim tokens)
//! and [`fabric::FabricKey`] (the fabric key), whose `Debug` never shows them;
//! no error message ever contains a secret. Sizes are [`ByteSize`]s and the
//! fabric key file is read by [`fabric::config`], as storage-target does, so
//! both programs accept the same forms ([`s3dma_config`] holds the shared
//! pieces). Relative paths in the file are
//! relative to the agent's working directory.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use fabric::{Backend, FabricKey};
/// Sizes in the file (`4MiB`, `512KiB`, `65536`): see [`s3dma_config::parse_size`].
pub use s3dma_config::ByteSize;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

// ---------------------------------------------------------------------------
// Secrets
// ---------------------------------------------------------------------------

/// A secret read from a file (tenant secret keys, shim tokens): see
/// [`s3dma_config::Secret`].
pub use s3dma_config::Secret;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

pub use s3dma_config::ConfigError;

// ---------------------------------------------------------------------------
// The file, as parsed
// ---------------------------------------------------------------------------

/// The whole configuration file, as parsed.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where host-shims reach the agent's gRPC API, and how it is secured.
    pub listen: ListenConfig,
    /// The host-shims allowed to connect, how each authenticates, and which
    /// tenants each may act for. At least one.
    pub shims: Vec<ShimConfig>,
    /// The tenants: S3 credentials, grants and quotas. At least one.
    pub tenants: Vec<TenantConfig>,
    /// The S3 endpoints (storage targets) and the buckets each serves. At least one.
    pub targets: Vec<TargetConfig>,
    /// The RDMA fabric: backend, key and staging memory.
    pub fabric: FabricConfig,
    /// How requests are split into chunks and parts, retried and timed out.
    /// Optional; every field has a default.
    #[serde(default)]
    pub transfer: TransferConfig,
    /// The Prometheus endpoint. Optional; off by default.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// The async runtime: `worker_threads` (optional; default one per CPU).
    #[serde(default)]
    pub runtime: s3dma_config::RuntimeConfig,
}

/// `listen:` — the gRPC endpoint host-shims connect to.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListenConfig {
    /// Address and port of the gRPC API for host-shims, e.g. `0.0.0.0:7000`
    /// (port 0 picks a free port). Required.
    pub address: SocketAddr,
    /// TLS for the gRPC API. Omit for plaintext (then shims can only
    /// authenticate with bearer tokens). With TLS configured, a shim that
    /// has a `tls_name` must present a client certificate signed by
    /// `client_ca_file` (mTLS); shims with only a `token_file` send their
    /// token over the encrypted connection without a certificate.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Most gRPC connections open at once (all shims together); a
    /// connection beyond it is closed as soon as it is accepted. Default
    /// 256; 1..=65536.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Most HTTP/2 streams (calls) open at once on one connection; a shim
    /// waits for a free stream beyond it. Default 1024; 1..=65536.
    #[serde(default = "default_max_concurrent_streams")]
    pub max_concurrent_streams: u32,
    /// Largest HTTP/2 header list (all request headers of one call,
    /// decoded) the agent accepts. Default `16KiB`; 1KiB..=1MiB.
    #[serde(default = "default_max_header_list_size")]
    pub max_header_list_size: ByteSize,
    /// A connection that has not carried one authenticated call this many
    /// seconds after it opened is closed, whatever it sends (calls without
    /// valid credentials are answered `UNAUTHENTICATED` at once, their
    /// request bodies unread). Default 10; at least 1.
    #[serde(default = "default_unauthenticated_timeout_secs")]
    pub unauthenticated_timeout_secs: u64,
    /// An authenticated connection with no call running for this many
    /// seconds is closed (the shim reconnects when it next calls). Default
    /// 300; at least 1.
    #[serde(default = "default_idle_timeout_secs")]
    pub idle_timeout_secs: u64,
}

/// `listen.tls:` — server certificate and the CA for shim client certificates.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain of the agent (leaf first).
    pub cert_file: PathBuf,
    /// PEM private key of the agent's certificate.
    pub key_file: PathBuf,
    /// PEM CA certificate(s) that sign shim client certificates; a
    /// certificate from another CA fails the TLS handshake.
    pub client_ca_file: PathBuf,
}

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
    #[serde(default = "default_true")]
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
    #[serde(default = "default_true")]
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

/// `transfer:` — how requests are split, pipelined, retried and timed out.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TransferConfig {
    /// Size of one chunk: one ranged GET, or one RDMA token's slice. Default
    /// `8MiB`; 64KiB..=1GiB (a token's size field is 32 bits).
    #[serde(default = "default_chunk_size")]
    pub chunk_size: ByteSize,
    /// Chunks of one request in flight at once. Default 8; at least 1.
    #[serde(default = "default_max_chunks_in_flight")]
    pub max_chunks_in_flight: usize,
    /// Objects at least this large are written with a multipart upload.
    /// Default `64MiB`; 5MiB..=5GiB.
    #[serde(default = "default_multipart_threshold")]
    pub multipart_threshold: ByteSize,
    /// Size of each part of a multipart upload (the last may be smaller).
    /// Default `16MiB`; 5MiB..=5GiB (S3's limits).
    #[serde(default = "default_part_size")]
    pub part_size: ByteSize,
    /// Retries of one chunk or part after a 5xx reply, a connection error or a
    /// timeout (4xx replies are not retried). Default 4; 0 = no retries.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// First retry delay in milliseconds; doubles on every retry (with
    /// jitter) up to `backoff_max_ms`. Default 50; at least 1.
    #[serde(default = "default_backoff_initial_ms")]
    pub backoff_initial_ms: u64,
    /// Longest retry delay in milliseconds. Default 2000; at least
    /// `backoff_initial_ms`.
    #[serde(default = "default_backoff_max_ms")]
    pub backoff_max_ms: u64,
    /// Deadline for a whole request (all chunks and retries), in seconds.
    /// Default 300; at least 1.
    #[serde(default = "default_request_timeout_secs")]
    pub request_timeout_secs: u64,
    /// Deadline for one HTTP attempt, in seconds. Default 60; at least 1.
    #[serde(default = "default_attempt_timeout_secs")]
    pub attempt_timeout_secs: u64,
    /// Time allowed for the TCP (and TLS) connection to a target, in
    /// milliseconds. Default 3000; at least 1.
    #[serde(default = "default_target_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Items of one GetObjects batch fetched at once. Default 16; at least 1.
    /// Each item is one request of the tenant's: it takes one of the
    /// tenant's `quotas.max_concurrent_requests` slots (or waits in its
    /// queue, or is refused with `SlowDown`) while it runs, and its chunks
    /// count against `quotas.max_bytes_in_flight`.
    #[serde(default = "default_batch_concurrency")]
    pub batch_concurrency: usize,
    /// Most items in one GetObjects batch; a larger batch is refused with
    /// `INVALID_ARGUMENT`. It also bounds the batch's request message
    /// (4KiB per item). Default 1024; 1..=65536.
    #[serde(default = "default_max_batch_items")]
    pub max_batch_items: usize,
}

/// `metrics:` — the Prometheus endpoint (`GET /metrics`). Its labels name
/// tenants, shims and targets and show their traffic: keep it to the
/// operator with a loopback address, `unix_socket` or `bearer_token_file`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// TCP listen address of the endpoint, e.g. `127.0.0.1:9102` (port 0
    /// picks a free port). Omit (default) for no TCP endpoint. Must differ
    /// from `listen.address`.
    #[serde(default)]
    pub address: Option<SocketAddr>,
    /// Unix socket to serve the endpoint on as well (or instead), created
    /// mode 0600; only a client running as the agent's user or as root is
    /// served (checked with `SO_PEERCRED`). A stale socket file there is
    /// replaced; any other file is an error. Omit (default) for none.
    #[serde(default)]
    pub unix_socket: Option<PathBuf>,
    /// File holding a bearer token (mode 0600 or stricter; surrounding
    /// whitespace trimmed; at least 16 printable ASCII characters): every
    /// scrape, on TCP and on the socket, must then send
    /// `Authorization: Bearer <token>`, anything else gets 401. Omit
    /// (default) for no token. Requires `address` or `unix_socket`.
    #[serde(default)]
    pub bearer_token_file: Option<PathBuf>,
}

fn default_true() -> bool {
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
fn default_region() -> String {
    "us-east-1".to_owned()
}
fn default_max_idle_connections() -> usize {
    64
}
fn default_staging_buffers() -> usize {
    32
}
fn default_backend() -> Backend {
    Backend::Tcp
}
fn default_staging_buffer_size() -> ByteSize {
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
fn default_chunk_size() -> ByteSize {
    ByteSize(8 * MIB)
}
fn default_max_chunks_in_flight() -> usize {
    8
}
fn default_multipart_threshold() -> ByteSize {
    ByteSize(64 * MIB)
}
fn default_part_size() -> ByteSize {
    ByteSize(16 * MIB)
}
fn default_retries() -> u32 {
    4
}
fn default_backoff_initial_ms() -> u64 {
    50
}
fn default_backoff_max_ms() -> u64 {
    2000
}
fn default_request_timeout_secs() -> u64 {
    300
}
fn default_attempt_timeout_secs() -> u64 {
    60
}
fn default_target_connect_timeout_ms() -> u64 {
    3000
}
fn default_batch_concurrency() -> usize {
    16
}
fn default_max_batch_items() -> usize {
    1024
}
fn default_max_connections() -> usize {
    256
}
fn default_max_concurrent_streams() -> u32 {
    1024
}
fn default_max_header_list_size() -> ByteSize {
    ByteSize(16 * KIB)
}
fn default_unauthenticated_timeout_secs() -> u64 {
    10
}
fn default_idle_timeout_secs() -> u64 {
    300
}
fn default_tenant_staging_share_percent() -> u32 {
    50
}

impl ListenConfig {
    /// Plaintext gRPC on `address`, every limit at its default.
    #[must_use]
    pub fn new(address: SocketAddr) -> ListenConfig {
        ListenConfig {
            address,
            tls: None,
            max_connections: default_max_connections(),
            max_concurrent_streams: default_max_concurrent_streams(),
            max_header_list_size: default_max_header_list_size(),
            unauthenticated_timeout_secs: default_unauthenticated_timeout_secs(),
            idle_timeout_secs: default_idle_timeout_secs(),
        }
    }
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
            rdma: default_true(),
            ca_file: None,
            max_idle_connections: default_max_idle_connections(),
        }
    }
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

impl Default for TransferConfig {
    fn default() -> TransferConfig {
        TransferConfig {
            chunk_size: default_chunk_size(),
            max_chunks_in_flight: default_max_chunks_in_flight(),
            multipart_threshold: default_multipart_threshold(),
            part_size: default_part_size(),
            retries: default_retries(),
            backoff_initial_ms: default_backoff_initial_ms(),
            backoff_max_ms: default_backoff_max_ms(),
            request_timeout_secs: default_request_timeout_secs(),
            attempt_timeout_secs: default_attempt_timeout_secs(),
            connect_timeout_ms: default_target_connect_timeout_ms(),
            batch_concurrency: default_batch_concurrency(),
            max_batch_items: default_max_batch_items(),
        }
    }
}

impl Config {
    /// The first target serving `bucket` (see [`Config::targets_for`]).
    #[must_use]
    pub fn target_for(&self, bucket: &str) -> Option<&TargetConfig> {
        self.targets_for(bucket).into_iter().next()
    }

    /// The targets serving `bucket`: those that list the name exactly,
    /// otherwise those listing `"*"` (one target, or a group), in
    /// configuration order.
    #[must_use]
    pub fn targets_for(&self, bucket: &str) -> Vec<&TargetConfig> {
        let listing = |name: &str| -> Vec<&TargetConfig> {
            self.targets
                .iter()
                .filter(|t| t.buckets.iter().any(|b| b == name))
                .collect()
        };
        let exact = listing(bucket);
        if exact.is_empty() {
            listing("*")
        } else {
            exact
        }
    }

    /// Checks every rule that needs no file access (see the field docs);
    /// `file` names the configuration file in errors.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first offending field.
    pub fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        let v = Validator {
            file: file.display().to_string(),
        };
        v.listen(self)?;
        v.transfer(&self.transfer)?;
        v.fabric(&self.fabric)?;
        v.tenants(self)?;
        v.shims(self)?;
        v.targets(&self.targets)?;
        v.metrics(self)?;
        self.runtime
            .check()
            .map_err(|m| v.err("runtime.worker_threads", m))?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The loaded form
// ---------------------------------------------------------------------------

/// A validated configuration with its secrets read. `Debug` never shows a
/// secret.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The configuration file it was loaded from.
    pub path: PathBuf,
    /// The file as parsed (holds secret file paths, not secrets).
    pub config: Config,
    /// The tenants with their secrets, in the order of `config.tenants`.
    pub tenants: Vec<LoadedTenant>,
    /// The shims with their tokens, in the order of `config.shims`.
    pub shims: Vec<LoadedShim>,
    /// The decoded fabric key (at least 16 bytes; `Debug` shows only its
    /// length).
    pub fabric_key: FabricKey,
    /// The metrics bearer token (`metrics.bearer_token_file`), if any.
    pub metrics_token: Option<Secret>,
}

impl LoadedConfig {
    /// The tenant named `name`.
    #[must_use]
    pub fn tenant(&self, name: &str) -> Option<&LoadedTenant> {
        self.tenants.iter().find(|t| t.name == name)
    }

    /// The shim named `name`.
    #[must_use]
    pub fn shim(&self, name: &str) -> Option<&LoadedShim> {
        self.shims.iter().find(|s| s.name == name)
    }
}

/// A tenant with its secret access key read.
#[derive(Debug, Clone)]
pub struct LoadedTenant {
    /// Tenant name.
    pub name: String,
    /// S3 access key id.
    pub access_key_id: String,
    /// S3 secret access key (trimmed, non-empty).
    pub secret_access_key: Secret,
    /// The tenant's grants, in configuration order.
    pub allow: Vec<Grant>,
    /// The tenant's quotas.
    pub quotas: Quotas,
}

/// A shim with its bearer token read.
#[derive(Debug, Clone)]
pub struct LoadedShim {
    /// Shim name.
    pub name: String,
    /// Bearer token (trimmed, at least 16 printable ASCII characters), when
    /// `token_file` is set.
    pub token: Option<Secret>,
    /// Name its client certificate must carry, when set.
    pub tls_name: Option<String>,
    /// Tenants it may act for.
    pub tenants: Vec<String>,
}

/// Reads, parses and validates the configuration file at `path`, reads the
/// secret files it names and checks that its TLS/CA files can be opened.
///
/// # Errors
/// A [`ConfigError`] naming the file, the field and what is wrong.
pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: file.clone(),
        source,
    })?;
    let config = parse(path, &text)?;
    let v = Validator { file };

    if let Some(tls) = &config.listen.tls {
        v.readable("listen.tls.cert_file", &tls.cert_file)?;
        v.readable("listen.tls.key_file", &tls.key_file)?;
        v.readable("listen.tls.client_ca_file", &tls.client_ca_file)?;
    }
    for (i, t) in config.targets.iter().enumerate() {
        if let Some(ca) = &t.ca_file {
            v.readable(&format!("targets[{i}].ca_file"), ca)?;
        }
    }

    let mut tenants = Vec::with_capacity(config.tenants.len());
    for (i, t) in config.tenants.iter().enumerate() {
        let field = format!("tenants[{i}].secret_access_key_file");
        let secret = v.read_secret(&field, &t.secret_access_key_file)?;
        tenants.push(LoadedTenant {
            name: t.name.clone(),
            access_key_id: t.access_key_id.clone(),
            secret_access_key: secret,
            allow: t.allow.clone(),
            quotas: t.quotas.clone(),
        });
    }

    let mut shims: Vec<LoadedShim> = Vec::with_capacity(config.shims.len());
    for (i, s) in config.shims.iter().enumerate() {
        let token = match &s.token_file {
            None => None,
            Some(p) => {
                let field = format!("shims[{i}].token_file");
                let token = v.read_secret(&field, p)?;
                let t = token.expose();
                if !t.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(v.err(
                        field,
                        format!(
                            "the token in {} must be printable ASCII without spaces",
                            p.display()
                        ),
                    ));
                }
                if t.len() < 16 {
                    return Err(v.err(
                        field,
                        format!(
                            "the token in {} is {} characters long; at least 16 are required \
                             (e.g. `openssl rand -hex 32`)",
                            p.display(),
                            t.len()
                        ),
                    ));
                }
                if let Some((j, other)) = shims.iter().enumerate().find(|(_, o)| {
                    o.token
                        .as_ref()
                        .is_some_and(|o| o.expose().as_bytes() == t.as_bytes())
                }) {
                    return Err(v.err(
                        field,
                        format!(
                            "the token in {} is the same as shims[{j}]'s ({:?}); every shim \
                             needs its own token",
                            p.display(),
                            other.name
                        ),
                    ));
                }
                Some(token)
            }
        };
        shims.push(LoadedShim {
            name: s.name.clone(),
            token,
            tls_name: s.tls_name.clone(),
            tenants: s.tenants.clone(),
        });
    }

    // `cannot read <path>: ...` or `<path>: <what is wrong>`, never the key.
    let fabric_key = fabric::config::read_fabric_key_file(&config.fabric.fabric_key_file)
        .map_err(|m| v.err("fabric.fabric_key_file", m))?;

    let metrics_token = match &config.metrics.bearer_token_file {
        None => None,
        Some(p) => {
            let field = "metrics.bearer_token_file";
            let token = v.read_secret(field, p)?;
            let t = token.expose();
            if t.len() < 16 || !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(v.err(
                    field,
                    format!(
                        "the token in {} must be at least 16 printable ASCII characters \
                         without spaces (e.g. `openssl rand -hex 32`)",
                        p.display()
                    ),
                ));
            }
            Some(token)
        }
    };

    Ok(LoadedConfig {
        path: path.to_path_buf(),
        config,
        tenants,
        shims,
        fabric_key,
        metrics_token,
    })
}

/// Parses and validates configuration text without reading any other file;
/// `path` names the file in errors.
///
/// # Errors
/// [`ConfigError::Parse`] for malformed YAML, unknown fields or wrong types;
/// [`ConfigError::Invalid`] for the first invalid field.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let config: Config = serde_yaml::from_str(text).map_err(|e| ConfigError::Parse {
        file: path.display().to_string(),
        message: e.to_string(),
    })?;
    config.validate(path)?;
    Ok(config)
}

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

/// Builds errors for one file and holds the validation rules.
struct Validator {
    file: String,
}

type Check = Result<(), ConfigError>;

impl Validator {
    fn err(&self, field: impl Into<String>, problem: impl std::fmt::Display) -> ConfigError {
        ConfigError::invalid(self.file.clone(), field, problem)
    }

    fn at_least(&self, field: &str, value: u64, min: u64) -> Check {
        if value < min {
            return Err(self.err(field, format!("must be at least {min}, got {value}")));
        }
        Ok(())
    }

    fn size_between(&self, field: &str, value: ByteSize, min: u64, max: u64) -> Check {
        if !(min..=max).contains(&value.0) {
            return Err(self.err(
                field,
                format!(
                    "must be between {} and {}, got {} ({} bytes)",
                    ByteSize(min),
                    ByteSize(max),
                    value,
                    value.0
                ),
            ));
        }
        Ok(())
    }

    fn non_empty_path(&self, field: &str, p: &Path) -> Check {
        if p.as_os_str().is_empty() {
            return Err(self.err(field, "must not be empty"));
        }
        Ok(())
    }

    /// A name: non-empty, no surrounding whitespace, no control characters.
    fn name(&self, field: &str, name: &str) -> Check {
        if name.trim().is_empty() {
            return Err(self.err(field, "must not be empty"));
        }
        if name.trim() != name || name.chars().any(char::is_control) {
            return Err(self.err(
                field,
                format!("{name:?} must not have surrounding spaces or control characters"),
            ));
        }
        Ok(())
    }

    /// A bucket name in a grant or a target: `*` alone, or a name without `/`.
    fn bucket(&self, field: &str, bucket: &str) -> Check {
        if bucket.is_empty() {
            return Err(self.err(field, "must not be empty (use \"*\" for every bucket)"));
        }
        if bucket.contains('/') {
            return Err(self.err(
                field,
                format!(
                    "{bucket:?} must be a bucket name, without '/' (put key prefixes in `prefix`)"
                ),
            ));
        }
        if bucket != "*" && bucket.contains('*') {
            return Err(self.err(
                field,
                format!(
                    "{bucket:?}: '*' is only allowed alone (every bucket); patterns are not supported"
                ),
            ));
        }
        if bucket.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(self.err(field, format!("{bucket:?} must not contain spaces")));
        }
        Ok(())
    }

    fn listen(&self, c: &Config) -> Check {
        let l = &c.listen;
        if let Some(tls) = &l.tls {
            self.non_empty_path("listen.tls.cert_file", &tls.cert_file)?;
            self.non_empty_path("listen.tls.key_file", &tls.key_file)?;
            self.non_empty_path("listen.tls.client_ca_file", &tls.client_ca_file)?;
        }
        self.between("listen.max_connections", l.max_connections as u64, 1, 65536)?;
        self.between(
            "listen.max_concurrent_streams",
            u64::from(l.max_concurrent_streams),
            1,
            65536,
        )?;
        self.size_between(
            "listen.max_header_list_size",
            l.max_header_list_size,
            KIB,
            MIB,
        )?;
        self.at_least(
            "listen.unauthenticated_timeout_secs",
            l.unauthenticated_timeout_secs,
            1,
        )?;
        self.at_least("listen.idle_timeout_secs", l.idle_timeout_secs, 1)?;
        Ok(())
    }

    fn between(&self, field: &str, value: u64, min: u64, max: u64) -> Check {
        if !(min..=max).contains(&value) {
            return Err(self.err(
                field,
                format!("must be between {min} and {max}, got {value}"),
            ));
        }
        Ok(())
    }

    fn transfer(&self, t: &TransferConfig) -> Check {
        // A token's size field is 8 hex digits (32 bits); 1GiB fits.
        self.size_between("transfer.chunk_size", t.chunk_size, 64 * KIB, GIB)?;
        if t.chunk_size.0 > u64::from(u32::MAX) {
            return Err(self.err(
                "transfer.chunk_size",
                "must fit the 32-bit size field of an RDMA token",
            ));
        }
        self.at_least(
            "transfer.max_chunks_in_flight",
            t.max_chunks_in_flight as u64,
            1,
        )?;
        self.size_between(
            "transfer.multipart_threshold",
            t.multipart_threshold,
            5 * MIB,
            5 * GIB,
        )?;
        self.size_between("transfer.part_size", t.part_size, 5 * MIB, 5 * GIB)?;
        self.at_least("transfer.backoff_initial_ms", t.backoff_initial_ms, 1)?;
        if t.backoff_max_ms < t.backoff_initial_ms {
            return Err(self.err(
                "transfer.backoff_max_ms",
                format!(
                    "must be at least transfer.backoff_initial_ms ({}), got {}",
                    t.backoff_initial_ms, t.backoff_max_ms
                ),
            ));
        }
        self.at_least("transfer.request_timeout_secs", t.request_timeout_secs, 1)?;
        self.at_least("transfer.attempt_timeout_secs", t.attempt_timeout_secs, 1)?;
        self.at_least("transfer.connect_timeout_ms", t.connect_timeout_ms, 1)?;
        self.at_least("transfer.batch_concurrency", t.batch_concurrency as u64, 1)?;
        self.between(
            "transfer.max_batch_items",
            t.max_batch_items as u64,
            1,
            65536,
        )?;
        Ok(())
    }

    fn fabric(&self, f: &FabricConfig) -> Check {
        self.non_empty_path("fabric.fabric_key_file", &f.fabric_key_file)?;
        let n = f.staging_buffers as u64;
        if !(1..=4096).contains(&n) {
            return Err(self.err(
                "fabric.staging_buffers",
                format!("must be between 1 and 4096, got {n}"),
            ));
        }
        self.size_between(
            "fabric.staging_buffer_size",
            f.staging_buffer_size,
            4 * KIB,
            256 * MIB,
        )?;
        if n.saturating_mul(f.staging_buffer_size.0) > 16 * GIB {
            return Err(self.err(
                "fabric.staging_buffer_size",
                format!(
                    "fabric.staging_buffers x fabric.staging_buffer_size must not exceed 16GiB \
                     ({n} x {})",
                    f.staging_buffer_size
                ),
            ));
        }
        self.at_least("fabric.connect_timeout_ms", f.connect_timeout_ms, 1)?;
        self.at_least(
            "fabric.max_ops_per_session",
            f.max_ops_per_session as u64,
            1,
        )?;
        self.at_least("fabric.idle_session_secs", f.idle_session_secs, 1)?;
        self.between(
            "fabric.tenant_staging_share_percent",
            u64::from(f.tenant_staging_share_percent),
            1,
            100,
        )?;
        Ok(())
    }

    fn tenants(&self, c: &Config) -> Check {
        if c.tenants.is_empty() {
            return Err(self.err("tenants", "at least one tenant is required"));
        }
        let mut names: HashMap<&str, usize> = HashMap::new();
        let mut keys: HashMap<&str, usize> = HashMap::new();
        for (i, t) in c.tenants.iter().enumerate() {
            let at = |f: &str| format!("tenants[{i}].{f}");
            self.name(&at("name"), &t.name)?;
            if let Some(j) = names.insert(&t.name, i) {
                return Err(self.err(
                    at("name"),
                    format!("duplicate tenant name {:?} (also tenants[{j}])", t.name),
                ));
            }
            if t.access_key_id.is_empty() {
                return Err(self.err(at("access_key_id"), "must not be empty"));
            }
            if !t.access_key_id.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(self.err(
                    at("access_key_id"),
                    "must be printable ASCII without spaces",
                ));
            }
            if let Some(j) = keys.insert(&t.access_key_id, i) {
                return Err(self.err(
                    at("access_key_id"),
                    format!(
                        "duplicate access key id {:?} (also tenants[{j}])",
                        t.access_key_id
                    ),
                ));
            }
            self.non_empty_path(&at("secret_access_key_file"), &t.secret_access_key_file)?;
            for (j, g) in t.allow.iter().enumerate() {
                let ga = |f: &str| format!("tenants[{i}].allow[{j}].{f}");
                self.bucket(&ga("bucket"), &g.bucket)?;
                if !g.read && !g.write {
                    return Err(self.err(
                        format!("tenants[{i}].allow[{j}]"),
                        "grants nothing: set read and/or write to true",
                    ));
                }
            }
            let q = &t.quotas;
            self.at_least(
                &at("quotas.max_concurrent_requests"),
                q.max_concurrent_requests as u64,
                1,
            )?;
            let chunk = c.transfer.chunk_size;
            if q.max_bytes_in_flight < chunk {
                return Err(self.err(
                    at("quotas.max_bytes_in_flight"),
                    format!(
                        "{} is less than transfer.chunk_size ({chunk}): no chunk could ever \
                         start; set it to at least {chunk}",
                        q.max_bytes_in_flight
                    ),
                ));
            }
            if let Some(bps) = q.max_bytes_per_second {
                self.at_least(&at("quotas.max_bytes_per_second"), bps.0, 1)?;
            }
        }
        Ok(())
    }

    fn shims(&self, c: &Config) -> Check {
        if c.shims.is_empty() {
            return Err(self.err("shims", "at least one shim is required"));
        }
        let mut names: HashMap<&str, usize> = HashMap::new();
        let mut tls_names: HashMap<&str, usize> = HashMap::new();
        for (i, s) in c.shims.iter().enumerate() {
            let at = |f: &str| format!("shims[{i}].{f}");
            self.name(&at("name"), &s.name)?;
            if let Some(j) = names.insert(&s.name, i) {
                return Err(self.err(
                    at("name"),
                    format!("duplicate shim name {:?} (also shims[{j}])", s.name),
                ));
            }
            if s.token_file.is_none() && s.tls_name.is_none() {
                return Err(self.err(
                    format!("shims[{i}]"),
                    "needs token_file or tls_name (or both) to authenticate",
                ));
            }
            if let Some(p) = &s.token_file {
                self.non_empty_path(&at("token_file"), p)?;
            }
            if let Some(n) = &s.tls_name {
                self.name(&at("tls_name"), n)?;
                if c.listen.tls.is_none() {
                    return Err(self.err(
                        at("tls_name"),
                        "requires listen.tls (client certificates need TLS)",
                    ));
                }
                if let Some(j) = tls_names.insert(n, i) {
                    return Err(self.err(
                        at("tls_name"),
                        format!("duplicate tls_name {n:?} (also shims[{j}])"),
                    ));
                }
            }
            if s.tenants.is_empty() {
                return Err(self.err(at("tenants"), "must name at least one tenant"));
            }
            for (j, t) in s.tenants.iter().enumerate() {
                if !c.tenants.iter().any(|ct| &ct.name == t) {
                    return Err(self.err(
                        format!("shims[{i}].tenants[{j}]"),
                        format!("unknown tenant {t:?} (not in tenants)"),
                    ));
                }
            }
        }
        Ok(())
    }

    fn targets(&self, targets: &[TargetConfig]) -> Check {
        if targets.is_empty() {
            return Err(self.err("targets", "at least one target is required"));
        }
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (i, t) in targets.iter().enumerate() {
            let mut buckets: HashMap<&str, usize> = HashMap::new();
            let at = |f: &str| format!("targets[{i}].{f}");
            self.name(&at("name"), &t.name)?;
            if let Some(j) = names.insert(&t.name, i) {
                return Err(self.err(
                    at("name"),
                    format!("duplicate target name {:?} (also targets[{j}])", t.name),
                ));
            }
            let https = s3dma_config::check_endpoint_url(&t.endpoint)
                .map_err(|m| self.err(at("endpoint"), m))?
                .https;
            if t.region.trim().is_empty() {
                return Err(self.err(at("region"), "must not be empty"));
            }
            if t.region
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
            {
                return Err(self.err(at("region"), "must not contain spaces"));
            }
            if let Some(ca) = &t.ca_file {
                if !https {
                    return Err(self.err(at("ca_file"), "only allowed with an https:// endpoint"));
                }
                self.non_empty_path(&at("ca_file"), ca)?;
            }
            if t.buckets.is_empty() {
                return Err(self.err(
                    at("buckets"),
                    "must name at least one bucket, or \"*\" for every bucket",
                ));
            }
            for (j, b) in t.buckets.iter().enumerate() {
                let field = format!("targets[{i}].buckets[{j}]");
                self.bucket(&field, b)?;
                if let Some(k) = buckets.insert(b, j) {
                    return Err(self.err(
                        field,
                        format!("{b:?} already listed by targets[{i}].buckets[{k}]"),
                    ));
                }
            }
        }
        Ok(())
    }

    fn metrics(&self, c: &Config) -> Check {
        if let Some(a) = c.metrics.address
            && a.port() != 0
            && a == c.listen.address
        {
            return Err(self.err("metrics.address", "must differ from listen.address"));
        }
        if let Some(p) = &c.metrics.unix_socket {
            self.non_empty_path("metrics.unix_socket", p)?;
        }
        if let Some(p) = &c.metrics.bearer_token_file {
            self.non_empty_path("metrics.bearer_token_file", p)?;
            if c.metrics.address.is_none() && c.metrics.unix_socket.is_none() {
                return Err(self.err(
                    "metrics.bearer_token_file",
                    "protects nothing: set metrics.address and/or metrics.unix_socket",
                ));
            }
        }
        Ok(())
    }

    /// Checks that `path` can be opened for reading (its content is not read).
    fn readable(&self, field: &str, path: &Path) -> Check {
        s3dma_config::check_readable_file(path).map_err(|m| self.err(field, m))
    }

    /// Reads a secret file: its content, trimmed, must not be empty. Errors
    /// name the field and the path, never the content.
    fn read_secret(&self, field: &str, path: &Path) -> Result<Secret, ConfigError> {
        s3dma_config::read_secret_file(path).map_err(|m| self.err(field, m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../dpu-agent.example.yaml");

    /// A minimal valid configuration.
    const BASE: &str = "\
listen:
  address: 127.0.0.1:7000
shims:
  - name: host1
    token_file: /etc/s3dma/host1.token
    tenants: [alice]
tenants:
  - name: alice
    access_key_id: AKALICE
    secret_access_key_file: /etc/s3dma/alice.secret
    allow:
      - bucket: alice-data
        write: true
targets:
  - name: local
    endpoint: http://127.0.0.1:9000
    buckets: [\"*\"]
fabric:
  fabric_key_file: /etc/s3dma/fabric.key
";

    fn p() -> &'static Path {
        Path::new("/etc/s3dma/agent.yaml")
    }

    fn base() -> Config {
        parse(p(), BASE).unwrap()
    }

    fn parse_err(text: &str) -> String {
        parse(p(), text).unwrap_err().to_string()
    }

    #[test]
    fn worker_threads_are_checked() {
        assert_eq!(base().runtime.worker_threads, None);
        let e = parse_err(&format!("{BASE}runtime:\n  worker_threads: 2000\n"));
        assert!(
            e.contains("runtime.worker_threads: 2000 worker threads: must be 1 to 1024"),
            "{e}"
        );
        let c = parse(p(), &format!("{BASE}runtime:\n  worker_threads: 1\n")).unwrap();
        assert_eq!(c.runtime.worker_threads, Some(1));
    }

    #[test]
    fn example_parses_and_validates() {
        let c = parse(Path::new("dpu-agent.example.yaml"), EXAMPLE).unwrap();
        assert_eq!(c.listen.address, "127.0.0.1:7000".parse().unwrap());
        assert!(c.listen.tls.is_none());
        assert_eq!(c.shims.len(), 1);
        assert_eq!(c.shims[0].tenants, ["alice", "bob"]);
        assert_eq!(c.tenants.len(), 2);
        let alice = &c.tenants[0];
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.allow[0].bucket, "alice-data");
        assert!(alice.allow[0].read && alice.allow[0].write);
        let bob = &c.tenants[1];
        assert_eq!(bob.allow[0].bucket, "shared");
        assert_eq!(bob.allow[0].prefix, "datasets/");
        assert!(bob.allow[0].read && !bob.allow[0].write);
        assert_eq!(c.targets.len(), 1);
        assert_eq!(c.targets[0].endpoint, "http://127.0.0.1:9000");
        assert!(c.targets[0].rdma);
        assert_eq!(c.target_for("anything").unwrap().name, c.targets[0].name);
        assert_eq!(c.fabric.backend, Backend::Tcp);
        // The transfer section spells out the defaults.
        assert_eq!(c.transfer, TransferConfig::default());
        assert_eq!(c.fabric.staging_buffers, default_staging_buffers());
        assert_eq!(c.fabric.staging_buffer_size, default_staging_buffer_size());
        assert_eq!(c.metrics.address, Some("127.0.0.1:9102".parse().unwrap()));
    }

    /// Uncomments the example's optional settings: lines whose `#` is directly
    /// followed by YAML (`#tls:`, `#  cert_file: ...`, `#- name: ...`), as
    /// opposed to prose (`# text`, exactly one space after `#`).
    fn uncomment(text: &str) -> String {
        let mut out = String::new();
        for line in text.lines() {
            let trimmed = line.trim_start();
            let indent = &line[..line.len() - trimmed.len()];
            match trimmed.strip_prefix('#') {
                Some(rest)
                    if !rest.trim().is_empty()
                        && !rest.starts_with('#')
                        && (!rest.starts_with(' ') || rest.starts_with("  ")) =>
                {
                    out.push_str(indent);
                    out.push_str(rest);
                }
                _ => out.push_str(line),
            }
            out.push('\n');
        }
        out
    }

    #[test]
    fn example_optional_blocks_also_validate() {
        // Enabling the commented TLS block, the mTLS shim and the plain-S3
        // target must give a valid file too.
        let text = uncomment(EXAMPLE);
        let c = parse(Path::new("uncommented.yaml"), &text).unwrap();
        let tls = c.listen.tls.as_ref().unwrap();
        assert_eq!(tls.client_ca_file, Path::new("/etc/s3dma/shim-ca.pem"));
        assert_eq!(c.shims.len(), 2);
        assert_eq!(
            c.shims[1].tls_name.as_deref(),
            Some("host2.example.internal")
        );
        assert_eq!(c.targets.len(), 2);
        assert!(!c.targets[1].rdma);
        assert_eq!(c.target_for("archive").unwrap().name, c.targets[1].name);
        assert_eq!(c.target_for("other").unwrap().name, c.targets[0].name);
    }

    #[test]
    fn defaults() {
        let c = base();
        assert_eq!(c.transfer, TransferConfig::default());
        assert_eq!(c.transfer.chunk_size, ByteSize(8 << 20));
        assert_eq!(c.transfer.max_chunks_in_flight, 8);
        assert_eq!(c.transfer.multipart_threshold, ByteSize(64 << 20));
        assert_eq!(c.transfer.part_size, ByteSize(16 << 20));
        assert_eq!(c.transfer.retries, 4);
        assert_eq!(c.transfer.backoff_initial_ms, 50);
        assert_eq!(c.transfer.backoff_max_ms, 2000);
        assert_eq!(c.transfer.request_timeout_secs, 300);
        assert_eq!(c.transfer.attempt_timeout_secs, 60);
        assert_eq!(c.transfer.connect_timeout_ms, 3000);
        assert_eq!(c.transfer.batch_concurrency, 16);
        assert_eq!(c.metrics, MetricsConfig::default());
        assert_eq!(c.metrics.address, None);
        let q = &c.tenants[0].quotas;
        assert_eq!(*q, Quotas::default());
        assert_eq!(q.max_concurrent_requests, 64);
        assert_eq!(q.max_queued_requests, 256);
        assert_eq!(q.max_bytes_in_flight, ByteSize(1 << 30));
        assert_eq!(q.max_bytes_per_second, None);
        let g = &c.tenants[0].allow[0];
        assert_eq!(g.prefix, "");
        assert!(g.read);
        let t = &c.targets[0];
        assert_eq!(t.region, "us-east-1");
        assert!(t.rdma);
        assert_eq!(t.ca_file, None);
        assert_eq!(t.max_idle_connections, 64);
        let f = &c.fabric;
        assert_eq!(f.backend, Backend::Tcp);
        assert_eq!(f.staging_buffers, 32);
        assert_eq!(f.staging_buffer_size, ByteSize(4 << 20));
        assert_eq!(f.connect_timeout_ms, 2000);
        assert_eq!(f.max_ops_per_session, 64);
        assert_eq!(f.idle_session_secs, 60);
        assert_eq!(f.tenant_staging_share_percent, 50);
        assert_eq!(c.transfer.max_batch_items, 1024);
        let l = &c.listen;
        assert_eq!(l.max_connections, 256);
        assert_eq!(l.max_concurrent_streams, 1024);
        assert_eq!(l.max_header_list_size, ByteSize(16 << 10));
        assert_eq!(l.unauthenticated_timeout_secs, 10);
        assert_eq!(l.idle_timeout_secs, 300);
        assert_eq!(c.metrics.unix_socket, None);
        assert_eq!(c.metrics.bearer_token_file, None);
    }

    #[test]
    fn gate_batch_share_and_metrics_fields_are_validated() {
        for (from, to, want) in [
            (
                "  address: 127.0.0.1:7000\n",
                "  address: 127.0.0.1:7000\n  max_connections: 0\n",
                "listen.max_connections: must be between 1 and 65536",
            ),
            (
                "  address: 127.0.0.1:7000\n",
                "  address: 127.0.0.1:7000\n  max_concurrent_streams: 0\n",
                "listen.max_concurrent_streams",
            ),
            (
                "  address: 127.0.0.1:7000\n",
                "  address: 127.0.0.1:7000\n  max_header_list_size: 100\n",
                "listen.max_header_list_size",
            ),
            (
                "  address: 127.0.0.1:7000\n",
                "  address: 127.0.0.1:7000\n  unauthenticated_timeout_secs: 0\n",
                "listen.unauthenticated_timeout_secs",
            ),
            (
                "  address: 127.0.0.1:7000\n",
                "  address: 127.0.0.1:7000\n  idle_timeout_secs: 0\n",
                "listen.idle_timeout_secs",
            ),
            (
                "fabric:\n",
                "transfer:\n  max_batch_items: 0\nfabric:\n",
                "transfer.max_batch_items",
            ),
            (
                "fabric:\n",
                "fabric:\n  tenant_staging_share_percent: 101\n",
                "fabric.tenant_staging_share_percent",
            ),
            (
                "fabric:\n",
                "metrics:\n  bearer_token_file: /etc/t\nfabric:\n",
                "metrics.bearer_token_file: protects nothing",
            ),
        ] {
            assert!(BASE.contains(from), "{from}");
            let e = parse_err(&BASE.replacen(from, to, 1));
            assert!(e.contains(want), "{to}: {e}");
        }
    }

    #[test]
    fn byte_sizes_in_yaml() {
        let with = |v: &str| BASE.to_owned() + &format!("transfer:\n  chunk_size: {v}\n");
        assert_eq!(
            parse(p(), &with("65536")).unwrap().transfer.chunk_size,
            ByteSize(65536)
        );
        assert_eq!(
            parse(p(), &with("\"16 MiB\"")).unwrap().transfer.chunk_size,
            ByteSize(16 << 20)
        );
        assert_eq!(
            parse(p(), &with("16MiB")).unwrap().transfer.chunk_size,
            ByteSize(16 << 20)
        );
        let e = parse_err(&with("16MB"));
        assert!(
            e.contains("transfer.chunk_size") && e.contains("ambiguous"),
            "{e}"
        );
        let e = parse_err(&with("-5"));
        assert!(
            e.contains("transfer.chunk_size") && e.contains("negative"),
            "{e}"
        );
        let e = parse_err(&with("1.5"));
        assert!(
            e.contains("transfer.chunk_size") && e.contains("floating point"),
            "{e}"
        );
    }

    #[test]
    fn unknown_fields_are_rejected_naming_the_field() {
        let cases = [
            (
                BASE.replace("listen:\n", "listen:\n  adress: 1.2.3.4:5\n"),
                "adress",
            ),
            (BASE.to_owned() + "extra: 1\n", "extra"),
            (
                BASE.replace(
                    "        write: true",
                    "        write: true\n        delete: true",
                ),
                "delete",
            ),
            (
                BASE.replace(
                    "    buckets: [\"*\"]",
                    "    buckets: [\"*\"]\n    path_style: true",
                ),
                "path_style",
            ),
            (
                BASE.to_owned() + "transfer:\n  chunksize: 1MiB\n",
                "chunksize",
            ),
            (
                BASE.to_owned() + "metrics:\n  listen: 1.2.3.4:5\n",
                "listen",
            ),
            (
                BASE.replace(
                    "    tenants: [alice]",
                    "    tenants: [alice]\n    token: abc",
                ),
                "token",
            ),
            (
                BASE.replace(
                    "        write: true",
                    "        write: true\n    quotas:\n      max_requests: 3",
                ),
                "max_requests",
            ),
        ];
        for (text, field) in cases {
            let e = parse(p(), &text).unwrap_err();
            assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
            let m = e.to_string();
            assert!(m.starts_with("/etc/s3dma/agent.yaml: "), "{m}");
            assert!(m.contains(&format!("unknown field `{field}`")), "{m}");
            assert!(m.contains("line"), "{m}");
        }
    }

    #[test]
    fn syntax_and_type_errors_name_the_file_and_position() {
        let e = parse_err("listen: [\n");
        assert!(e.starts_with("/etc/s3dma/agent.yaml: "), "{e}");
        let e = parse_err(&BASE.replace("127.0.0.1:7000", "not-an-address"));
        assert!(e.contains("listen.address") && e.contains("line 2"), "{e}");
        let e = parse_err(&BASE.replace("fabric:\n  fabric_key_file: /etc/s3dma/fabric.key\n", ""));
        assert!(e.contains("missing field `fabric`"), "{e}");
        let e = parse_err(
            &(BASE
                .to_owned()
                .replace("fabric:\n", "fabric:\n  backend: ib\n")),
        );
        assert!(
            e.contains("fabric.backend") && e.contains("unknown variant"),
            "{e}"
        );
        let c = parse(
            p(),
            &BASE.replace("fabric:\n", "fabric:\n  backend: verbs\n"),
        )
        .unwrap();
        assert_eq!(c.fabric.backend, Backend::Verbs);
    }

    type Mutation = fn(&mut Config);

    /// Every validation rule: (field path expected in the message, a word of
    /// the message, the change that breaks the rule).
    const RULES: &[(&str, &str, Mutation)] = &[
        ("tenants:", "at least one", |c| c.tenants.clear()),
        ("shims:", "at least one", |c| c.shims.clear()),
        ("targets:", "at least one", |c| c.targets.clear()),
        ("tenants[1].name:", "duplicate", |c| {
            let mut t = c.tenants[0].clone();
            t.access_key_id = "OTHER".into();
            c.tenants.push(t);
        }),
        ("tenants[0].name:", "empty", |c| {
            c.tenants[0].name = " ".into()
        }),
        ("tenants[0].name:", "spaces", |c| {
            c.tenants[0].name = "alice ".into()
        }),
        ("tenants[1].access_key_id:", "duplicate", |c| {
            let mut t = c.tenants[0].clone();
            t.name = "bob".into();
            c.tenants.push(t);
        }),
        ("tenants[0].access_key_id:", "empty", |c| {
            c.tenants[0].access_key_id = String::new()
        }),
        ("tenants[0].access_key_id:", "printable", |c| {
            c.tenants[0].access_key_id = "AK ALICE".into()
        }),
        ("tenants[0].secret_access_key_file:", "empty", |c| {
            c.tenants[0].secret_access_key_file = PathBuf::new()
        }),
        ("tenants[0].allow[0].bucket:", "empty", |c| {
            c.tenants[0].allow[0].bucket = String::new()
        }),
        ("tenants[0].allow[0].bucket:", "'/'", |c| {
            c.tenants[0].allow[0].bucket = "alice-data/train".into()
        }),
        ("tenants[0].allow[0].bucket:", "patterns", |c| {
            c.tenants[0].allow[0].bucket = "alice-*".into()
        }),
        ("tenants[0].allow[0]:", "grants nothing", |c| {
            c.tenants[0].allow[0].read = false;
            c.tenants[0].allow[0].write = false;
        }),
        (
            "tenants[0].quotas.max_concurrent_requests:",
            "at least 1",
            |c| c.tenants[0].quotas.max_concurrent_requests = 0,
        ),
        (
            "tenants[0].quotas.max_bytes_in_flight:",
            "no chunk could ever start",
            |c| c.tenants[0].quotas.max_bytes_in_flight = ByteSize(4 << 20),
        ),
        (
            "tenants[0].quotas.max_bytes_per_second:",
            "at least 1",
            |c| c.tenants[0].quotas.max_bytes_per_second = Some(ByteSize(0)),
        ),
        ("shims[1].name:", "duplicate", |c| {
            let s = c.shims[0].clone();
            c.shims.push(s);
        }),
        ("shims[0].name:", "empty", |c| {
            c.shims[0].name = String::new()
        }),
        ("shims[0]:", "token_file or tls_name", |c| {
            c.shims[0].token_file = None
        }),
        ("shims[0].token_file:", "empty", |c| {
            c.shims[0].token_file = Some(PathBuf::new())
        }),
        ("shims[0].tls_name:", "requires listen.tls", |c| {
            c.shims[0].tls_name = Some("host1.example".into())
        }),
        ("shims[1].tls_name:", "duplicate", |c| {
            c.listen.tls = Some(tls());
            c.shims[0].tls_name = Some("host1.example".into());
            let mut s = c.shims[0].clone();
            s.name = "host2".into();
            s.token_file = None;
            c.shims.push(s);
        }),
        ("shims[0].tenants:", "at least one tenant", |c| {
            c.shims[0].tenants.clear()
        }),
        ("shims[0].tenants[1]:", "unknown tenant \"carol\"", |c| {
            c.shims[0].tenants.push("carol".into())
        }),
        ("targets[1].name:", "duplicate", |c| {
            let mut t = c.targets[0].clone();
            t.buckets = vec!["b".into()];
            c.targets.push(t);
        }),
        ("targets[0].endpoint:", "scheme", |c| {
            c.targets[0].endpoint = "127.0.0.1:9000".into()
        }),
        ("targets[0].endpoint:", "scheme", |c| {
            c.targets[0].endpoint = "ftp://127.0.0.1:9000".into()
        }),
        ("targets[0].endpoint:", "no path", |c| {
            c.targets[0].endpoint = "http://127.0.0.1:9000/s3".into()
        }),
        ("targets[0].endpoint:", "no query", |c| {
            c.targets[0].endpoint = "http://127.0.0.1:9000?x=1".into()
        }),
        ("targets[0].endpoint:", "no query", |c| {
            c.targets[0].endpoint = "http://127.0.0.1:9000/?x=1".into()
        }),
        ("targets[0].endpoint:", "no fragment", |c| {
            c.targets[0].endpoint = "http://h#f".into()
        }),
        ("targets[0].endpoint:", "no user info", |c| {
            c.targets[0].endpoint = "http://user:pw@h:9000".into()
        }),
        ("targets[0].endpoint:", "no spaces", |c| {
            c.targets[0].endpoint = "http://h :9000".into()
        }),
        ("targets[0].endpoint:", "host is missing", |c| {
            c.targets[0].endpoint = "http://".into()
        }),
        ("targets[0].endpoint:", "host is missing", |c| {
            c.targets[0].endpoint = "https://:443".into()
        }),
        ("targets[0].endpoint:", "port", |c| {
            c.targets[0].endpoint = "http://h:".into()
        }),
        ("targets[0].endpoint:", "port", |c| {
            c.targets[0].endpoint = "http://h:65536".into()
        }),
        ("targets[0].endpoint:", "port", |c| {
            c.targets[0].endpoint = "http://h:0".into()
        }),
        ("targets[0].endpoint:", "port", |c| {
            c.targets[0].endpoint = "http://h:+80".into()
        }),
        ("targets[0].endpoint:", "brackets", |c| {
            c.targets[0].endpoint = "http://::1:9000".into()
        }),
        ("targets[0].endpoint:", "IPv6", |c| {
            c.targets[0].endpoint = "http://[::g]:9000".into()
        }),
        ("targets[0].endpoint:", "unterminated", |c| {
            c.targets[0].endpoint = "http://[::1:9000".into()
        }),
        ("targets[0].endpoint:", "after ']'", |c| {
            c.targets[0].endpoint = "http://[::1]9000".into()
        }),
        ("targets[0].endpoint:", "host may only", |c| {
            c.targets[0].endpoint = "http://bad!host".into()
        }),
        // The one endpoint rule (shared with the shim's agent.endpoint):
        // the port is required.
        ("targets[0].endpoint:", "needs an explicit port", |c| {
            c.targets[0].endpoint = "https://s3.example.com".into()
        }),
        ("targets[0].endpoint:", "needs an explicit port", |c| {
            c.targets[0].endpoint = "http://[fe80::1]/".into()
        }),
        ("targets[0].region:", "empty", |c| {
            c.targets[0].region = String::new()
        }),
        ("targets[0].region:", "spaces", |c| {
            c.targets[0].region = "us east".into()
        }),
        ("targets[0].ca_file:", "https", |c| {
            c.targets[0].ca_file = Some("/etc/s3dma/ca.pem".into())
        }),
        ("targets[0].buckets:", "at least one", |c| {
            c.targets[0].buckets.clear()
        }),
        ("targets[0].buckets[0]:", "empty", |c| {
            c.targets[0].buckets = vec![String::new()]
        }),
        ("targets[0].buckets[0]:", "'/'", |c| {
            c.targets[0].buckets = vec!["a/b".into()]
        }),
        (
            "targets[0].buckets[1]:",
            "already listed by targets[0].buckets[0]",
            |c| c.targets[0].buckets = vec!["a".into(), "a".into()],
        ),
        ("fabric.fabric_key_file:", "empty", |c| {
            c.fabric.fabric_key_file = PathBuf::new()
        }),
        ("fabric.staging_buffers:", "between 1 and 4096", |c| {
            c.fabric.staging_buffers = 0
        }),
        ("fabric.staging_buffers:", "between 1 and 4096", |c| {
            c.fabric.staging_buffers = 4097
        }),
        (
            "fabric.staging_buffer_size:",
            "between 4KiB and 256MiB",
            |c| c.fabric.staging_buffer_size = ByteSize(4095),
        ),
        (
            "fabric.staging_buffer_size:",
            "between 4KiB and 256MiB",
            |c| c.fabric.staging_buffer_size = ByteSize(256 * MIB + 1),
        ),
        ("fabric.staging_buffer_size:", "16GiB", |c| {
            c.fabric.staging_buffers = 4096;
            c.fabric.staging_buffer_size = ByteSize(256 * MIB);
        }),
        ("fabric.connect_timeout_ms:", "at least 1", |c| {
            c.fabric.connect_timeout_ms = 0
        }),
        ("fabric.max_ops_per_session:", "at least 1", |c| {
            c.fabric.max_ops_per_session = 0
        }),
        ("fabric.idle_session_secs:", "at least 1", |c| {
            c.fabric.idle_session_secs = 0
        }),
        ("transfer.chunk_size:", "between 64KiB and 1GiB", |c| {
            c.transfer.chunk_size = ByteSize(64 * KIB - 1)
        }),
        ("transfer.chunk_size:", "between 64KiB and 1GiB", |c| {
            c.transfer.chunk_size = ByteSize(4 * GIB)
        }),
        ("transfer.max_chunks_in_flight:", "at least 1", |c| {
            c.transfer.max_chunks_in_flight = 0
        }),
        (
            "transfer.multipart_threshold:",
            "between 5MiB and 5GiB",
            |c| c.transfer.multipart_threshold = ByteSize(4 * MIB),
        ),
        (
            "transfer.multipart_threshold:",
            "between 5MiB and 5GiB",
            |c| c.transfer.multipart_threshold = ByteSize(5 * GIB + 1),
        ),
        ("transfer.part_size:", "between 5MiB and 5GiB", |c| {
            c.transfer.part_size = ByteSize(5 * MIB - 1)
        }),
        ("transfer.part_size:", "between 5MiB and 5GiB", |c| {
            c.transfer.part_size = ByteSize(6 * GIB)
        }),
        ("transfer.backoff_initial_ms:", "at least 1", |c| {
            c.transfer.backoff_initial_ms = 0
        }),
        ("transfer.backoff_max_ms:", "backoff_initial_ms", |c| {
            c.transfer.backoff_initial_ms = 100;
            c.transfer.backoff_max_ms = 99;
        }),
        ("transfer.request_timeout_secs:", "at least 1", |c| {
            c.transfer.request_timeout_secs = 0
        }),
        ("transfer.attempt_timeout_secs:", "at least 1", |c| {
            c.transfer.attempt_timeout_secs = 0
        }),
        ("transfer.connect_timeout_ms:", "at least 1", |c| {
            c.transfer.connect_timeout_ms = 0
        }),
        ("transfer.batch_concurrency:", "at least 1", |c| {
            c.transfer.batch_concurrency = 0
        }),
        ("listen.tls.cert_file:", "empty", |c| {
            let mut t = tls();
            t.cert_file = PathBuf::new();
            c.listen.tls = Some(t);
        }),
        ("listen.tls.key_file:", "empty", |c| {
            let mut t = tls();
            t.key_file = PathBuf::new();
            c.listen.tls = Some(t);
        }),
        ("listen.tls.client_ca_file:", "empty", |c| {
            let mut t = tls();
            t.client_ca_file = PathBuf::new();
            c.listen.tls = Some(t);
        }),
        ("metrics.address:", "differ", |c| {
            c.metrics.address = Some(c.listen.address)
        }),
    ];

    fn tls() -> TlsConfig {
        TlsConfig {
            cert_file: "/etc/s3dma/agent.crt".into(),
            key_file: "/etc/s3dma/agent.key".into(),
            client_ca_file: "/etc/s3dma/shim-ca.pem".into(),
        }
    }

    #[test]
    fn every_validation_rule_names_the_field() {
        base().validate(p()).unwrap();
        for (i, (field, word, mutate)) in RULES.iter().enumerate() {
            let mut c = base();
            mutate(&mut c);
            let e = c
                .validate(p())
                .expect_err(&format!("rule #{i} ({field} {word}) accepted"));
            let m = e.to_string();
            assert!(
                m.starts_with(&format!("/etc/s3dma/agent.yaml: {field} ")),
                "rule #{i}: want field {field}, got: {m}"
            );
            assert!(m.contains(word), "rule #{i}: want {word:?} in: {m}");
            assert_eq!(
                e.field(),
                Some(field.trim_end_matches(':')),
                "rule #{i}: {m}"
            );
        }
    }

    #[test]
    fn accepted_edge_values() {
        let ok: &[Mutation] = &[
            |c| c.targets[0].endpoint = "http://127.0.0.1:9000/".into(),
            |c| c.targets[0].endpoint = "https://s3.example.com:443".into(),
            |c| c.targets[0].endpoint = "http://[::1]:9000".into(),
            |c| c.targets[0].endpoint = "http://[fe80::1]:80".into(),
            |c| c.targets[0].endpoint = "http://my_host.local:65535".into(),
            |c| {
                c.targets[0].endpoint = "https://s3.example.com:8443/".into();
                c.targets[0].ca_file = Some("/etc/s3dma/ca.pem".into());
            },
            |c| {
                c.listen.tls = Some(tls());
                c.shims[0].tls_name = Some("host1.example".into());
                c.shims[0].token_file = None;
            },
            |c| c.transfer.chunk_size = ByteSize(64 * KIB),
            |c| {
                c.transfer.chunk_size = ByteSize(GIB);
                c.tenants[0].quotas.max_bytes_in_flight = ByteSize(GIB);
            },
            |c| c.transfer.part_size = ByteSize(5 * GIB),
            |c| c.transfer.multipart_threshold = ByteSize(5 * MIB),
            |c| c.transfer.retries = 0,
            |c| c.transfer.backoff_max_ms = c.transfer.backoff_initial_ms,
            |c| c.tenants[0].quotas.max_queued_requests = 0,
            |c| c.tenants[0].quotas.max_bytes_in_flight = ByteSize(8 * MIB),
            |c| c.tenants[0].quotas.max_bytes_per_second = Some(ByteSize(1)),
            |c| c.tenants[0].allow.clear(),
            |c| {
                c.tenants[0].allow[0].read = false;
                c.tenants[0].allow[0].bucket = "*".into();
            },
            |c| c.targets[0].max_idle_connections = 0,
            |c| {
                c.fabric.staging_buffers = 4096;
                c.fabric.staging_buffer_size = ByteSize(4 * MIB);
            },
            |c| {
                c.listen.address = "127.0.0.1:0".parse().unwrap();
                c.metrics.address = Some("127.0.0.1:0".parse().unwrap());
            },
            |c| c.metrics.address = Some("127.0.0.1:9102".parse().unwrap()),
        ];
        for (i, mutate) in ok.iter().enumerate() {
            let mut c = base();
            mutate(&mut c);
            if let Err(e) = c.validate(p()) {
                panic!("edge case #{i} rejected: {e}");
            }
        }
    }

    #[test]
    fn parse_runs_validation() {
        let e = parse_err(&BASE.replace("tenants: [alice]", "tenants: [carol]"));
        assert_eq!(
            e,
            "/etc/s3dma/agent.yaml: shims[0].tenants[0]: unknown tenant \"carol\" (not in tenants)"
        );
        let e = parse_err(
            &(BASE.to_owned() + "transfer:\n  chunk_size: 16MiB\n").replace(
                "        write: true",
                "        write: true\n    quotas:\n      max_bytes_in_flight: 8MiB",
            ),
        );
        assert!(
            e.starts_with("/etc/s3dma/agent.yaml: tenants[0].quotas.max_bytes_in_flight: 8MiB is less than transfer.chunk_size (16MiB)"),
            "{e}"
        );
    }

    #[test]
    fn target_for_prefers_exact_names() {
        let mut c = base();
        let mut t = c.targets[0].clone();
        t.name = "archive".into();
        t.buckets = vec!["cold".into(), "older".into()];
        c.targets.insert(0, t);
        c.validate(p()).unwrap();
        assert_eq!(c.target_for("cold").unwrap().name, "archive");
        assert_eq!(c.target_for("older").unwrap().name, "archive");
        assert_eq!(c.target_for("hot").unwrap().name, "local");
        c.targets.pop();
        assert!(c.target_for("hot").is_none());
        assert_eq!(c.target_for("cold").unwrap().name, "archive");
    }

    #[test]
    fn targets_listing_a_bucket_form_a_group() {
        let mut c = base();
        for name in ["gw-a", "gw-b"] {
            let mut t = c.targets[0].clone();
            t.name = name.into();
            t.buckets = vec!["ckpt".into()];
            c.targets.push(t);
        }
        // And "*" twice: the default is a group too.
        let mut t = c.targets[0].clone();
        t.name = "local-2".into();
        c.targets.push(t);
        c.validate(p()).unwrap();
        let names =
            |b: &str| -> Vec<String> { c.targets_for(b).iter().map(|t| t.name.clone()).collect() };
        assert_eq!(names("ckpt"), ["gw-a", "gw-b"]);
        assert_eq!(names("other"), ["local", "local-2"]);
    }

    // ---- load ------------------------------------------------------------

    const ALICE_SECRET: &str = "alice-SECRET-wJalrXUtnFEMI";
    const BOB_SECRET: &str = "bob-SECRET-K7MDENGbPxRfiCY";
    const HOST1_TOKEN: &str = "host1-TOKEN-0123456789abcdef";
    const FABRIC_KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    struct Files {
        dir: tempfile::TempDir,
    }

    impl Files {
        fn new() -> Files {
            let f = Files {
                dir: tempfile::tempdir().unwrap(),
            };
            f.write("alice.secret", &format!("{ALICE_SECRET}\n"));
            f.write("bob.secret", &format!("  {BOB_SECRET}\r\n"));
            f.write("host1.token", &format!("{HOST1_TOKEN}\n"));
            f.write("fabric.key", &format!("{FABRIC_KEY}\n"));
            f
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }

        /// Writes `name` mode 0600, as secret files must be.
        fn write(&self, name: &str, content: &str) {
            use std::os::unix::fs::PermissionsExt as _;
            let p = self.path(name);
            std::fs::write(&p, content).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }

        /// Writes the agent config and returns its path.
        fn config(&self, extra_shim: &str) -> PathBuf {
            let d = self.dir.path().display();
            let text = format!(
                "\
listen:
  address: 127.0.0.1:7000
shims:
  - name: host1
    token_file: {d}/host1.token
    tenants: [alice, bob]
{extra_shim}
tenants:
  - name: alice
    access_key_id: AKALICE
    secret_access_key_file: {d}/alice.secret
    allow:
      - bucket: alice-data
        write: true
  - name: bob
    access_key_id: AKBOB
    secret_access_key_file: {d}/bob.secret
    allow:
      - bucket: shared
        prefix: datasets/
targets:
  - name: local
    endpoint: http://127.0.0.1:9000
    buckets: [\"*\"]
fabric:
  fabric_key_file: {d}/fabric.key
"
            );
            self.write("agent.yaml", &text);
            self.path("agent.yaml")
        }
    }

    #[test]
    fn load_reads_secrets() {
        let f = Files::new();
        let path = f.config("");
        let l = load(&path).unwrap();
        assert_eq!(l.path, path);
        assert_eq!(l.tenants.len(), 2);
        assert_eq!(l.tenants[0].name, "alice");
        assert_eq!(l.tenants[0].access_key_id, "AKALICE");
        assert_eq!(l.tenants[0].secret_access_key.expose(), ALICE_SECRET);
        assert_eq!(l.tenants[1].secret_access_key.expose(), BOB_SECRET);
        assert_eq!(l.tenants[1].allow, l.config.tenants[1].allow);
        assert_eq!(l.tenants[1].quotas, Quotas::default());
        assert_eq!(l.shims.len(), 1);
        assert_eq!(l.shims[0].token.as_ref().unwrap().expose(), HOST1_TOKEN);
        assert_eq!(l.shims[0].tenants, ["alice", "bob"]);
        assert_eq!(
            l.fabric_key,
            FabricKey::new(hex::decode(FABRIC_KEY).unwrap()).unwrap()
        );
        assert_eq!(l.tenant("bob").unwrap().access_key_id, "AKBOB");
        assert!(l.tenant("carol").is_none());
        assert_eq!(l.shim("host1").unwrap().name, "host1");
        assert!(l.shim("host2").is_none());
    }

    #[test]
    fn debug_never_shows_secrets() {
        let f = Files::new();
        let l = load(&f.config("")).unwrap();
        let dbg = format!("{l:?}");
        let pretty = format!("{l:#?}");
        for s in [ALICE_SECRET, BOB_SECRET, HOST1_TOKEN, FABRIC_KEY] {
            assert!(!dbg.contains(s), "{s} in {dbg}");
            assert!(!pretty.contains(s), "{s} in {pretty}");
        }
        assert!(!dbg.contains("0, 17, 34, 51"), "fabric key bytes in {dbg}");
        assert!(dbg.contains("<redacted>"));
        assert_eq!(format!("{:?}", Secret::new("x".into())), "<redacted>");
        assert!(dbg.contains("FabricKey(<32 bytes redacted>)"), "{dbg}");
    }

    #[test]
    fn missing_secret_file_names_field_and_path() {
        let f = Files::new();
        let path = f.config("");
        std::fs::remove_file(f.path("bob.secret")).unwrap();
        let e = load(&path).unwrap_err().to_string();
        let want = format!(
            "{}: tenants[1].secret_access_key_file: cannot read {}",
            path.display(),
            f.path("bob.secret").display()
        );
        assert!(e.starts_with(&want), "{e}");
    }

    #[test]
    fn secret_file_problems() {
        let cases: &[(&str, &str, &str, &str)] = &[
            (
                "alice.secret",
                " \n",
                "tenants[0].secret_access_key_file",
                "is empty",
            ),
            ("host1.token", "\n", "shims[0].token_file", "is empty"),
            (
                "host1.token",
                "short-token-15c\n",
                "shims[0].token_file",
                "15 characters",
            ),
            (
                "host1.token",
                "has a space inside the token\n",
                "shims[0].token_file",
                "printable ASCII",
            ),
            ("fabric.key", "", "fabric.fabric_key_file", "empty"),
            (
                "fabric.key",
                "00112233445566778899aabbccddeeff0",
                "fabric.fabric_key_file",
                "odd",
            ),
            (
                "fabric.key",
                "00112233445566778899aabbccddee",
                "fabric.fabric_key_file",
                "30 hex digits",
            ),
            (
                "fabric.key",
                "zz112233445566778899aabbccddeeff",
                "fabric.fabric_key_file",
                "not hexadecimal",
            ),
        ];
        for (file, content, field, word) in cases {
            let f = Files::new();
            let path = f.config("");
            f.write(file, content);
            let e = load(&path).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("{}: {field}: ", path.display())),
                "{file}: {e}"
            );
            assert!(e.contains(word), "{file}: want {word:?} in {e}");
            assert!(e.contains(&f.path(file).display().to_string()), "{e}");
            if !content.trim().is_empty() {
                assert!(!e.contains(content.trim()), "content leaked: {e}");
            }
        }
        // A 32-digit key is the minimum.
        let f = Files::new();
        let path = f.config("");
        f.write("fabric.key", "  00112233445566778899AABBCCDDEEFF  \n");
        assert_eq!(
            load(&path).unwrap().fabric_key,
            FabricKey::new(hex::decode("00112233445566778899aabbccddeeff").unwrap()).unwrap()
        );
    }

    #[test]
    fn shims_need_distinct_tokens() {
        let f = Files::new();
        let d = f.dir.path().display().to_string();
        f.write("host2.token", &format!("{HOST1_TOKEN}\n"));
        let path = f.config(&format!(
            "  - name: host2\n    token_file: {d}/host2.token\n    tenants: [bob]\n"
        ));
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("shims[1].token_file: "), "{e}");
        assert!(e.contains("same as shims[0]'s"), "{e}");
        assert!(!e.contains(HOST1_TOKEN), "{e}");
        f.write("host2.token", "host2-TOKEN-0123456789abcdef");
        let l = load(&path).unwrap();
        assert_eq!(l.shims[1].tenants, ["bob"]);
    }

    #[test]
    fn load_checks_tls_and_ca_files() {
        let f = Files::new();
        let d = f.dir.path().display().to_string();
        let path = f.config("");
        let text = std::fs::read_to_string(&path).unwrap().replace(
            "  address: 127.0.0.1:7000\n",
            &format!(
                "  address: 127.0.0.1:7000\n  tls:\n    cert_file: {d}/agent.crt\n    \
                 key_file: {d}/agent.key\n    client_ca_file: {d}/ca.pem\n"
            ),
        );
        std::fs::write(&path, text).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("listen.tls.cert_file: cannot read"), "{e}");
        assert!(e.contains(&format!("{d}/agent.crt")), "{e}");
        f.write("agent.crt", "pem");
        f.write("agent.key", "pem");
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("listen.tls.client_ca_file: cannot read"), "{e}");
        std::fs::create_dir(f.path("ca.pem")).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(
            e.contains("listen.tls.client_ca_file: ") && e.contains("not a regular file"),
            "{e}"
        );
        std::fs::remove_dir(f.path("ca.pem")).unwrap();
        f.write("ca.pem", "pem");
        load(&path).unwrap();

        let text = std::fs::read_to_string(&path).unwrap().replace(
            "    endpoint: http://127.0.0.1:9000\n",
            &format!("    endpoint: https://s3.local:9443\n    ca_file: {d}/target-ca.pem\n"),
        );
        std::fs::write(&path, text).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("targets[0].ca_file: cannot read"), "{e}");
        f.write("target-ca.pem", "pem");
        load(&path).unwrap();
    }

    #[test]
    fn missing_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.yaml");
        let e = load(&path).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }));
        assert!(
            e.to_string()
                .starts_with(&format!("{}: cannot read: ", path.display()))
        );
    }
}
