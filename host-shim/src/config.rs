//! The host-shim's configuration file (YAML, unknown fields rejected).
//!
//! Every field is documented here and in `host-shim.example.yaml`; defaults
//! live in `default_*` functions. [`load`] parses, validates and reads the
//! secret files; errors read `file: field.path: what is wrong` and never
//! contain a secret.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use fabric::{Backend, FabricKey};
pub use s3dma_config::{ByteSize, ConfigError, Secret};
use s3dma_config::{GIB, MIB, Validator};
use serde::Deserialize;

/// The whole file.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The Unix socket tenant applications connect to.
    pub socket: SocketConfig,
    /// The link to this host's dpu-agent.
    pub agent: AgentConfig,
    /// The fabric endpoint that serves tenant memory to the agent and targets.
    pub fabric: FabricConfig,
    /// Tenants, identified by the uid/gid of the connecting process.
    pub tenants: Vec<TenantConfig>,
    /// Lease (fd passing) limits; optional.
    #[serde(default)]
    pub leases: LeaseConfig,
    /// CUDA device memory from tenants (feature `cuda`); optional.
    #[serde(default)]
    pub cuda: CudaConfig,
    /// Prometheus metrics; optional (off when absent).
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// The async runtime: `worker_threads` (optional; default one per CPU).
    #[serde(default)]
    pub runtime: s3dma_config::RuntimeConfig,
}

/// `socket:`
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SocketConfig {
    /// Path of the socket. Its directory must exist. A stale socket file
    /// left by a previous run is replaced; a live one (another shim answers)
    /// is an error.
    pub path: PathBuf,
    /// Permission bits of the socket file, octal (default `"0660"`). Only
    /// processes that can open the socket can be tenants at all; the uid
    /// mapping below decides which tenant they are.
    #[serde(default = "default_socket_mode")]
    pub mode: String,
    /// Group owning the socket (name or numeric gid); absent = the shim's.
    #[serde(default)]
    pub group: Option<String>,
    /// Seconds a tenant's gRPC connection may stay open with no call in
    /// progress before the shim closes it (default 300; clients reconnect
    /// on their next call). Lease connections live as long as their process.
    #[serde(default = "default_idle_timeout_secs")]
    pub idle_timeout_secs: u64,
    /// Concurrent calls (HTTP/2 streams) on one gRPC connection (default 64).
    #[serde(default = "default_max_streams_per_connection")]
    pub max_streams_per_connection: u32,
}

/// `agent:`
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The agent's gRPC address, `http://host:port` or `https://host:port`.
    pub endpoint: String,
    /// File holding this shim's bearer token (the agent lists its SHA-256
    /// digest). Needed unless the agent knows this shim by its client
    /// certificate.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// TLS towards an `https://` endpoint.
    #[serde(default)]
    pub tls: Option<AgentTlsConfig>,
    /// Time to open the connection to the agent, milliseconds (default 2000).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Longest a call to the agent may take, seconds (default 300). A
    /// tenant's own gRPC deadline applies when shorter.
    #[serde(default = "default_request_timeout_secs")]
    pub request_timeout_secs: u64,
    /// Reconnect delay after the agent became unreachable: starts here and
    /// doubles up to `backoff_max_ms` (defaults 100 and 5000). While it is
    /// down, calls fail at once with UNAVAILABLE.
    #[serde(default = "default_backoff_initial_ms")]
    pub backoff_initial_ms: u64,
    /// See `backoff_initial_ms`.
    #[serde(default = "default_backoff_max_ms")]
    pub backoff_max_ms: u64,
}

/// `agent.tls:`
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentTlsConfig {
    /// PEM CA that signed the agent's certificate.
    pub ca_file: PathBuf,
    /// Name to verify in the agent's certificate (default: the endpoint's host).
    #[serde(default)]
    pub server_name: Option<String>,
    /// PEM client certificate for mTLS (with `key_file`).
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

/// `fabric:`
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FabricConfig {
    /// `tcp` (default) or `verbs`.
    #[serde(default = "default_backend")]
    pub backend: Backend,
    /// Where the endpoint serving tenant memory listens (one rail); the
    /// agent and the storage targets connect here to place and take bytes.
    /// Port 0 picks one. Exactly one of `listen` and `rails`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Address written into tokens when `listen` is 0.0.0.0 or :: (with
    /// `rails`, each rail has its own `advertise`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise: Option<IpAddr>,
    /// The fabric rails (NIC ports, each its own IP address) tenant memory
    /// is served on, instead of `listen`: one endpoint per rail, every GET
    /// and PUT slice minted as one window per rail, so that the agent
    /// spreads a transfer's chunks and parts over the rails and redoes the
    /// work of a rail that failed on another. Each rail's `listen` must be
    /// an address of this host (checked at start). On verbs each rail also
    /// names its RDMA `device` (and `port`, `gid_index`): a protection
    /// domain per device and tenant, every buffer registered on each
    /// rail's device; cuObject DC and hipobj-rc-v2 queue pairs use the
    /// first rail. 1 to 8 rails. Default: none (`listen` is the one rail).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rails: Vec<fabric::rail::RailConfig>,
    /// Pre-shared fabric key file (hex), the same as the agent's and targets'.
    pub fabric_key_file: PathBuf,
    /// Most connections the fabric endpoint holds at once (authenticated or
    /// not); one more is closed as soon as it is accepted. Counted in the
    /// shim's descriptor budget. Default 1024; 1 to 1048576.
    #[serde(default = "default_fabric_max_connections")]
    pub max_connections: u32,
    /// Most fabric connections held at once from one IP address (each
    /// storage target and agent holds a few per session). Default 256; 1 to
    /// `max_connections`.
    #[serde(default = "default_fabric_max_connections_per_address")]
    pub max_connections_per_address: u32,
    /// Seconds a fabric connection has to complete the authenticated
    /// handshake. Default 10; 1 to 600.
    #[serde(default = "default_fabric_handshake_timeout_secs")]
    pub handshake_timeout_secs: u64,
    /// An authenticated tcp fabric connection whose session sent no request
    /// for this many seconds is closed (keep it above the agent's and the
    /// targets' `idle_session_secs`, default 60, so they close idle sessions
    /// first). Default 300; 1 to 86400.
    #[serde(default = "default_fabric_idle_timeout_secs")]
    pub idle_timeout_secs: u64,
    /// With `backend: verbs`: most queue pairs the agent may have open on
    /// this host's device for hipobj-rc-v2 transfers (one per transfer in
    /// flight; each ends with its window anyway). Default 256; 1 to 65536.
    #[serde(default = "default_fabric_max_queue_pairs")]
    pub max_queue_pairs: u32,
    /// With `backend: verbs`: the path MTU of the hipobj-rc-v2 transfer
    /// queue pairs, in bytes (256, 512, 1024, 2048 or 4096); they use the
    /// lower of it and the port's active MTU. Default: none (the port's
    /// active MTU). That dialect's peers do not tell each other their MTU,
    /// and a WRITE of more than one packet between two different MTUs
    /// fails: against a server on an emulated NIC (Soft-RoCE and others
    /// often report 1024) set it to the server's.
    #[serde(
        default = "default_fabric_path_mtu",
        skip_serializing_if = "Option::is_none"
    )]
    pub path_mtu: Option<fabric::config::PathMtu>,
    /// With `backend: verbs` on an mlx5 device with DC (ConnectX-5 or
    /// newer, BlueField) and a build with the `dc` feature: the DC target
    /// standard (cuObject) tokens name, for targets the agent reaches with
    /// `protocol: cuobject-dc`.
    #[serde(default)]
    pub dc: DcConfig,
}

/// `fabric.dc:` — this host's DC target for the cuObject dialect.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct DcConfig {
    /// Whether to create it when the device can do DC. Default `true`.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// The DC key (the servers' DCIs must use the same). Default
    /// `0xffeeddcc`, the field's one value: no secret; what protects tenant
    /// memory is that each token grants only one request's window, for that
    /// request's lifetime, and a failed request's window is fenced.
    #[serde(default = "default_dc_key")]
    pub dc_key: u64,
    /// Traffic class of its replies. Default 96, cuObject's.
    #[serde(default = "default_dc_traffic_class")]
    pub traffic_class: u8,
    /// Hop limit of its replies. Default 64.
    #[serde(default = "default_dc_hop_limit")]
    pub hop_limit: u8,
    /// The GID table index (`show_gids`) the DC target answers on, which
    /// every token names. Default: chosen as the peers do, the port's
    /// routable RoCE v2 GID, IPv4-mapped first.
    #[serde(default)]
    pub gid_index: Option<u8>,
    /// Whether a link-local (`fe80::`) GID may be chosen when the port has
    /// no routable one. Default `false`: such a token reaches only servers
    /// on the same link.
    #[serde(default)]
    pub allow_link_local_gid: bool,
}

impl Default for DcConfig {
    fn default() -> Self {
        DcConfig {
            enabled: true,
            dc_key: default_dc_key(),
            traffic_class: default_dc_traffic_class(),
            hop_limit: default_dc_hop_limit(),
            gid_index: None,
            allow_link_local_gid: false,
        }
    }
}

fn default_true() -> bool {
    true
}

fn default_dc_key() -> u64 {
    s3dma_wire::dc::DEFAULT_DC_KEY
}

fn default_dc_traffic_class() -> u8 {
    s3dma_wire::dc::DEFAULT_TRAFFIC_CLASS
}

fn default_dc_hop_limit() -> u8 {
    64
}

impl FabricConfig {
    /// The tcp backend on `listen` with the key in `fabric_key_file`, no
    /// advertised address, and the default caps and timeouts.
    #[must_use]
    pub fn new(listen: SocketAddr, fabric_key_file: PathBuf) -> FabricConfig {
        FabricConfig {
            backend: default_backend(),
            listen: Some(listen),
            advertise: None,
            rails: Vec::new(),
            fabric_key_file,
            max_connections: default_fabric_max_connections(),
            max_connections_per_address: default_fabric_max_connections_per_address(),
            handshake_timeout_secs: default_fabric_handshake_timeout_secs(),
            idle_timeout_secs: default_fabric_idle_timeout_secs(),
            max_queue_pairs: default_fabric_max_queue_pairs(),
            path_mtu: default_fabric_path_mtu(),
            dc: DcConfig::default(),
        }
    }

    /// The rails this configuration serves on: `rails`, or the one rail
    /// `listen` and `advertise` describe. Empty only for a configuration
    /// that validation at load refuses.
    #[must_use]
    pub fn rail_list(&self) -> Vec<fabric::rail::RailConfig> {
        match self.listen {
            Some(listen) if self.rails.is_empty() => {
                vec![fabric::rail::RailConfig::new(listen, self.advertise)]
            }
            _ => self.rails.clone(),
        }
    }
}

/// One entry of `tenants:`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant's name, as the dpu-agent knows it.
    pub name: String,
    /// Processes running as these uids are this tenant.
    #[serde(default)]
    pub uids: Vec<u32>,
    /// Processes whose primary gid is one of these are this tenant (a uid
    /// match wins over a gid match).
    #[serde(default)]
    pub gids: Vec<u32>,
    /// Buffers the tenant may hold at once (default 256); also how many
    /// passed fds it may have waiting for RegisterBuffer over all its leases.
    #[serde(default = "default_max_buffers")]
    pub max_buffers: u32,
    /// Total bytes of registered buffers (default 64GiB).
    #[serde(default = "default_max_buffer_bytes")]
    pub max_buffer_bytes: ByteSize,
    /// Requests the tenant may have in the shim at once (default 256);
    /// more get RESOURCE_EXHAUSTED at once, before their message is read.
    /// Each running item of a GetObjects batch counts as one request. The
    /// agent's quotas apply too.
    #[serde(default = "default_max_concurrent_requests")]
    pub max_concurrent_requests: u32,
    /// Connections (gRPC and lease) the tenant's processes may hold open at
    /// once (default 256); more are closed at accept, before a byte is read.
    /// Every connection is a file descriptor of the shim: together with
    /// `max_buffers` this bounds what one tenant can take of the shim's fd
    /// limit, checked at start-up against `RLIMIT_NOFILE`.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// Windows (remote-accessible slices of the tenant's buffers) live at
    /// once (default 1024); a request that would exceed it gets
    /// RESOURCE_EXHAUSTED.
    #[serde(default = "default_max_windows")]
    pub max_windows: u32,
    /// Items in one batch (GetObjects, HeadObjects, PutObjects,
    /// DeleteObjects; default 1024); a larger batch is INVALID_ARGUMENT.
    /// GetObjects mints its windows as items start; PutObjects mints one
    /// per item up front, so its items in flight are also bounded by
    /// `max_windows`. 1..=100000.
    #[serde(default = "default_max_batch_items")]
    pub max_batch_items: u32,
    /// Bytes one GetObjects or PutObjects batch may name (the sum of its
    /// slices; default 4GiB); a larger batch is INVALID_ARGUMENT before any
    /// item runs. 1MiB..=1TiB.
    #[serde(default = "default_max_batch_bytes")]
    pub max_batch_bytes: ByteSize,
}

/// `leases:`
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseConfig {
    /// Seconds an fd handle waits for its RegisterBuffer (default 60).
    #[serde(default = "default_fd_handle_ttl_secs")]
    pub fd_handle_ttl_secs: u64,
    /// Fd handles a lease may hold unused at once (default 64).
    #[serde(default = "default_max_pending_fds")]
    pub max_pending_fds: usize,
    /// Leases one tenant may hold at once (default 1024).
    #[serde(default = "default_max_leases_per_tenant")]
    pub max_leases_per_tenant: usize,
    /// Submission rings (`RG` lease frames) one lease may open (default 1;
    /// 0 refuses rings, so tenants use gRPC only). 0..=16.
    #[serde(default = "default_max_rings_per_lease")]
    pub max_rings_per_lease: usize,
    /// Rings one tenant may hold open over all its leases (default 16):
    /// each is a mapping and a thread of the shim. 1..=1024.
    #[serde(default = "default_max_rings_per_tenant")]
    pub max_rings_per_tenant: usize,
    /// The most entries per queue a ring may have (default 256; its memfd
    /// is 4 KiB + 1408 bytes per entry). A power of two, 1..=4096.
    #[serde(default = "default_ring_max_entries")]
    pub ring_max_entries: u32,
    /// Entries of one ring the shim runs at once (default 64); the rest
    /// wait in the ring. Each running entry also takes one of the tenant's
    /// `max_concurrent_requests` permits (none free: that entry completes
    /// RESOURCE_EXHAUSTED). 1..=4096.
    #[serde(default = "default_ring_max_in_flight")]
    pub ring_max_in_flight: u32,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            fd_handle_ttl_secs: default_fd_handle_ttl_secs(),
            max_pending_fds: default_max_pending_fds(),
            max_leases_per_tenant: default_max_leases_per_tenant(),
            max_rings_per_lease: default_max_rings_per_lease(),
            max_rings_per_tenant: default_max_rings_per_tenant(),
            ring_max_entries: default_ring_max_entries(),
            ring_max_in_flight: default_ring_max_in_flight(),
        }
    }
}

/// `cuda:`
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct CudaConfig {
    /// Whether RegisterBuffer takes legacy CUDA IPC handles
    /// (`cuIpcGetMemHandle`, `CudaMemory.ipc_handle`; default false). Such
    /// a handle is 64 bytes that open the memory for whoever presents them:
    /// nothing ties it to the tenant's own processes, so with this on, a
    /// tenant that learns another's handle registers (reads and writes) the
    /// other's GPU memory. Turn it on only where every tenant of the shim
    /// trusts the others. The supported way, always on, is a POSIX fd from
    /// `cuMemExportToShareableHandle` passed over the tenant's own lease.
    #[serde(default = "default_allow_legacy_ipc_handles")]
    pub allow_legacy_ipc_handles: bool,
}

fn default_allow_legacy_ipc_handles() -> bool {
    false
}

/// `metrics:` — Prometheus metrics, the section every service shares
/// (optional; off when absent).
///
/// Metric labels carry tenant names and their traffic: anyone who can reach
/// the TCP address can read them. Keep it on loopback, or use `unix_socket`
/// (only the shim's user and root can connect) and/or `bearer_token_file`.
pub use s3dma_config::MetricsConfig;

impl SocketConfig {
    /// The socket at `path` with every other field at its default.
    #[must_use]
    pub fn new(path: PathBuf) -> SocketConfig {
        SocketConfig {
            path,
            mode: default_socket_mode(),
            group: None,
            idle_timeout_secs: default_idle_timeout_secs(),
            max_streams_per_connection: default_max_streams_per_connection(),
        }
    }
}

impl AgentConfig {
    /// The agent at `endpoint` (`http(s)://host:port`), no credentials,
    /// default timeouts.
    #[must_use]
    pub fn new(endpoint: impl Into<String>) -> AgentConfig {
        AgentConfig {
            endpoint: endpoint.into(),
            token_file: None,
            tls: None,
            connect_timeout_ms: default_connect_timeout_ms(),
            request_timeout_secs: default_request_timeout_secs(),
            backoff_initial_ms: default_backoff_initial_ms(),
            backoff_max_ms: default_backoff_max_ms(),
        }
    }
}

impl TenantConfig {
    /// Tenant `name` with no uids or gids and the default limits.
    #[must_use]
    pub fn new(name: impl Into<String>) -> TenantConfig {
        TenantConfig {
            name: name.into(),
            uids: Vec::new(),
            gids: Vec::new(),
            max_buffers: default_max_buffers(),
            max_buffer_bytes: default_max_buffer_bytes(),
            max_concurrent_requests: default_max_concurrent_requests(),
            max_connections: default_max_connections(),
            max_windows: default_max_windows(),
            max_batch_items: default_max_batch_items(),
            max_batch_bytes: default_max_batch_bytes(),
        }
    }
}

fn default_socket_mode() -> String {
    "0660".into()
}
fn default_idle_timeout_secs() -> u64 {
    300
}
fn default_max_streams_per_connection() -> u32 {
    64
}
fn default_max_connections() -> u32 {
    256
}
fn default_max_windows() -> u32 {
    1024
}
fn default_max_batch_items() -> u32 {
    1024
}
fn default_max_batch_bytes() -> ByteSize {
    ByteSize(4 << 30)
}
fn default_connect_timeout_ms() -> u64 {
    2000
}
fn default_request_timeout_secs() -> u64 {
    300
}
fn default_backoff_initial_ms() -> u64 {
    100
}
fn default_backoff_max_ms() -> u64 {
    5000
}
fn default_backend() -> Backend {
    Backend::Tcp
}
fn default_fabric_max_queue_pairs() -> u32 {
    256
}
fn default_fabric_path_mtu() -> Option<fabric::config::PathMtu> {
    None
}

fn default_fabric_max_connections() -> u32 {
    1024
}
fn default_fabric_max_connections_per_address() -> u32 {
    256
}
fn default_fabric_handshake_timeout_secs() -> u64 {
    10
}
fn default_fabric_idle_timeout_secs() -> u64 {
    300
}
fn default_max_buffers() -> u32 {
    256
}
fn default_max_buffer_bytes() -> ByteSize {
    ByteSize(64 * GIB)
}
fn default_max_concurrent_requests() -> u32 {
    256
}
fn default_fd_handle_ttl_secs() -> u64 {
    60
}
fn default_max_pending_fds() -> usize {
    64
}
fn default_max_leases_per_tenant() -> usize {
    1024
}
fn default_max_rings_per_lease() -> usize {
    1
}
fn default_max_rings_per_tenant() -> usize {
    16
}
fn default_ring_max_entries() -> u32 {
    256
}
fn default_ring_max_in_flight() -> u32 {
    64
}

/// A validated configuration with its secrets read.
#[derive(Debug)]
pub struct LoadedConfig {
    /// The file as written.
    pub config: Config,
    /// The socket mode, parsed.
    pub socket_mode: u32,
    /// The socket's group, resolved to a gid.
    pub socket_gid: Option<u32>,
    /// The bearer token for the agent.
    pub agent_token: Option<Secret>,
    /// The fabric key.
    pub fabric_key: FabricKey,
    /// The metrics bearer token.
    pub metrics_token: Option<Secret>,
}

/// Reads, parses and validates `path`, and reads the files it names.
///
/// # Errors
/// [`ConfigError`], naming the file and the field.
pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let (file, text) = s3dma_service::skeleton::read_config(path)?;
    let config = parse(path, &text)?;
    let v = Validator::new(file);
    let socket_mode = parse_mode(&config.socket.mode).map_err(|m| v.err("socket.mode", m))?;
    let socket_gid = match &config.socket.group {
        None => None,
        Some(g) => Some(resolve_group(g).map_err(|m| v.err("socket.group", m))?),
    };
    let agent_token = match &config.agent.token_file {
        None => None,
        Some(p) => {
            Some(s3dma_config::read_secret_file(p).map_err(|m| v.err("agent.token_file", m))?)
        }
    };
    if let Some(tls) = &config.agent.tls {
        v.readable("agent.tls.ca_file", &tls.ca_file)?;
        if let Some(c) = &tls.cert_file {
            v.readable("agent.tls.cert_file", c)?;
        }
        if let Some(k) = &tls.key_file {
            v.readable("agent.tls.key_file", k)?;
        }
    }
    let fabric_key = fabric::config::read_fabric_key_file(&config.fabric.fabric_key_file)
        .map_err(|m| v.err("fabric.fabric_key_file", m))?;
    let metrics_token = match &config.metrics.bearer_token_file {
        None => None,
        Some(p) => Some(
            s3dma_config::read_secret_file(p).map_err(|m| v.err("metrics.bearer_token_file", m))?,
        ),
    };
    check_socket_dir(&config.socket.path).map_err(|m| v.err("socket.path", m))?;
    Ok(LoadedConfig {
        config,
        socket_mode,
        socket_gid,
        agent_token,
        fabric_key,
        metrics_token,
    })
}

/// Parses and validates the text of a configuration file (no file access).
///
/// # Errors
/// [`ConfigError`].
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let config: Config = serde_yaml::from_str(text).map_err(|e| ConfigError::Parse {
        file: path.display().to_string(),
        message: e.to_string(),
    })?;
    config.validate(&Validator::for_path(path))?;
    Ok(config)
}

impl Config {
    fn validate(&self, v: &Validator) -> Result<(), ConfigError> {
        if self.socket.path.as_os_str().is_empty() {
            return Err(v.err("socket.path", "must not be empty"));
        }
        // sun_path holds 108 bytes including the NUL.
        if self.socket.path.as_os_str().len() > 107 {
            return Err(v.err(
                "socket.path",
                "is longer than the 107 bytes a Unix socket path may have",
            ));
        }
        parse_mode(&self.socket.mode).map_err(|m| v.err("socket.mode", m))?;
        self.runtime
            .check()
            .map_err(|m| v.err("runtime.worker_threads", m))?;

        let a = &self.agent;
        let https = s3dma_config::check_endpoint_url(&a.endpoint)
            .map_err(|m| v.err("agent.endpoint", m))?
            .https;
        if a.tls.is_some() && !https {
            return Err(v.err("agent.tls", "is set but agent.endpoint is not https://"));
        }
        if let Some(tls) = &a.tls
            && tls.cert_file.is_some() != tls.key_file.is_some()
        {
            return Err(v.err(
                "agent.tls",
                "cert_file and key_file go together (both or neither)",
            ));
        }
        let has_cert = a.tls.as_ref().is_some_and(|t| t.cert_file.is_some());
        if a.token_file.is_none() && !has_cert {
            return Err(v.err(
                "agent.token_file",
                "is required unless agent.tls has a client certificate (cert_file)",
            ));
        }
        v.between("agent.connect_timeout_ms", a.connect_timeout_ms, 1, 600_000)?;
        v.between(
            "agent.request_timeout_secs",
            a.request_timeout_secs,
            1,
            86_400,
        )?;
        v.between("agent.backoff_initial_ms", a.backoff_initial_ms, 1, 60_000)?;
        v.between(
            "agent.backoff_max_ms",
            a.backoff_max_ms,
            a.backoff_initial_ms,
            600_000,
        )?;

        let fab = &self.fabric;
        match (fab.listen, fab.rails.is_empty()) {
            (Some(listen), true) => {
                if listen.ip().is_unspecified() && fab.advertise.is_none() {
                    return Err(v.err(
                        "fabric.advertise",
                        "is required when fabric.listen is 0.0.0.0 or :: (the address the agent and targets reach this host on)",
                    ));
                }
            }
            (Some(_), false) => {
                return Err(v.err(
                    "fabric.rails",
                    "and fabric.listen both name where the fabric listens; keep one (rails lists every rail, listen is the single-rail form)",
                ));
            }
            (None, true) => {
                return Err(v.err(
                    "fabric.listen",
                    "is required (or fabric.rails): where the fabric endpoint serving tenant memory listens",
                ));
            }
            (None, false) => {
                if fab.advertise.is_some() {
                    return Err(v.err(
                        "fabric.advertise",
                        "goes with fabric.listen; with fabric.rails each rail has its own advertise",
                    ));
                }
                fabric::rail::validate_rails(fab.backend, &fab.rails)
                    .map_err(|e| v.err(format!("fabric.{}", e.field()), e.problem.to_string()))?;
            }
        }
        v.between(
            "fabric.max_connections",
            u64::from(fab.max_connections),
            1,
            1 << 20,
        )?;
        v.between(
            "fabric.max_connections_per_address",
            u64::from(fab.max_connections_per_address),
            1,
            u64::from(fab.max_connections),
        )?;
        v.between(
            "fabric.handshake_timeout_secs",
            fab.handshake_timeout_secs,
            1,
            600,
        )?;
        v.between("fabric.idle_timeout_secs", fab.idle_timeout_secs, 1, 86_400)?;
        v.between(
            "fabric.max_queue_pairs",
            u64::from(fab.max_queue_pairs),
            1,
            65_536,
        )?;
        v.between("fabric.dc.hop_limit", u64::from(fab.dc.hop_limit), 1, 255)?;

        if self.tenants.is_empty() {
            return Err(v.err("tenants", "at least one tenant is required"));
        }
        let mut names = HashMap::new();
        let mut uids: HashMap<u32, usize> = HashMap::new();
        let mut gids: HashMap<u32, usize> = HashMap::new();
        for (i, t) in self.tenants.iter().enumerate() {
            let f = |x: &str| format!("tenants[{i}].{x}");
            if !valid_name(&t.name) {
                return Err(v.err(f("name"), "must be 1-64 characters of A-Z a-z 0-9 . _ -"));
            }
            if let Some(j) = names.insert(t.name.as_str(), i) {
                return Err(v.err(f("name"), format!("{:?} is also tenants[{j}].name", t.name)));
            }
            if t.uids.is_empty() && t.gids.is_empty() {
                return Err(v.err(f("uids"), "a tenant needs at least one uid or gid"));
            }
            for u in &t.uids {
                if let Some(j) = uids.insert(*u, i) {
                    return Err(v.err(f("uids"), format!("uid {u} is also in tenants[{j}].uids")));
                }
            }
            for g in &t.gids {
                if let Some(j) = gids.insert(*g, i) {
                    return Err(v.err(f("gids"), format!("gid {g} is also in tenants[{j}].gids")));
                }
            }
            v.between(&f("max_buffers"), u64::from(t.max_buffers), 1, 1 << 20)?;
            v.between(&f("max_buffer_bytes"), t.max_buffer_bytes.0, MIB, 1 << 50)?;
            v.between(
                &f("max_concurrent_requests"),
                u64::from(t.max_concurrent_requests),
                1,
                1 << 20,
            )?;
            v.between(
                &f("max_connections"),
                u64::from(t.max_connections),
                1,
                1 << 20,
            )?;
            v.between(&f("max_windows"), u64::from(t.max_windows), 1, 1 << 24)?;
            v.between(
                &f("max_batch_items"),
                u64::from(t.max_batch_items),
                1,
                100_000,
            )?;
            v.between(&f("max_batch_bytes"), t.max_batch_bytes.0, MIB, 1 << 40)?;
        }
        v.between(
            "socket.idle_timeout_secs",
            self.socket.idle_timeout_secs,
            1,
            86_400,
        )?;
        v.between(
            "socket.max_streams_per_connection",
            u64::from(self.socket.max_streams_per_connection),
            1,
            1024,
        )?;
        let l = &self.leases;
        v.between("leases.fd_handle_ttl_secs", l.fd_handle_ttl_secs, 1, 3600)?;
        v.between("leases.max_pending_fds", l.max_pending_fds as u64, 1, 4096)?;
        v.between(
            "leases.max_leases_per_tenant",
            l.max_leases_per_tenant as u64,
            1,
            1 << 20,
        )?;
        v.between(
            "leases.max_rings_per_lease",
            l.max_rings_per_lease as u64,
            0,
            16,
        )?;
        v.between(
            "leases.max_rings_per_tenant",
            l.max_rings_per_tenant as u64,
            1,
            1024,
        )?;
        v.between(
            "leases.ring_max_entries",
            u64::from(l.ring_max_entries),
            1,
            4096,
        )?;
        if !l.ring_max_entries.is_power_of_two() {
            return Err(v.err("leases.ring_max_entries", "must be a power of two"));
        }
        v.between(
            "leases.ring_max_in_flight",
            u64::from(l.ring_max_in_flight),
            1,
            4096,
        )?;
        Ok(())
    }
}

fn valid_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Why `socket.mode` is refused ([`parse_mode`]).
#[derive(Debug, thiserror::Error)]
enum ModeError {
    #[error("{0:?} is not an octal mode such as \"0660\"")]
    NotOctal(String),
    #[error("{0:?} has bits beyond 0777 (setuid, setgid and sticky make no sense on a socket)")]
    SpecialBits(String),
    #[error("{0:?} must let the owner read and write (0600 at least)")]
    OwnerCannotReadWrite(String),
}

/// `"0660"` → `0o660`: octal permission bits, no setuid/setgid/sticky.
fn parse_mode(s: &str) -> Result<u32, ModeError> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    let mode = u32::from_str_radix(digits, 8).map_err(|_| ModeError::NotOctal(s.to_owned()))?;
    if mode > 0o777 {
        return Err(ModeError::SpecialBits(s.to_owned()));
    }
    if mode & 0o600 != 0o600 {
        return Err(ModeError::OwnerCannotReadWrite(s.to_owned()));
    }
    Ok(mode)
}

/// The socket's directory must exist, be a real directory (no symlink)
/// owned by the shim's user or root, and be writable by nobody else:
/// otherwise another local user could replace the socket with their own and
/// receive tenants' memory.
pub(crate) fn check_socket_dir(socket: &Path) -> Result<(), s3dma_service::private::PrivateError> {
    let dir = match socket.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let me = s3dma_service::private::current_uid();
    match s3dma_service::private::check_socket_dir(dir, &[me, 0]) {
        // `--check` on a machine other than the host (CI, a chart render):
        // the directory is checked again when the shim binds.
        Err(s3dma_service::private::PrivateError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(())
        }
        r => r,
    }
}

/// Why `socket.group` names no group ([`resolve_group`]).
#[derive(Debug, thiserror::Error)]
enum GroupError {
    #[error("no group named {0:?} on this host")]
    Unknown(String),
    #[error("cannot look up group {name:?}: {source}")]
    Lookup { name: String, source: nix::Error },
}

fn resolve_group(g: &str) -> Result<u32, GroupError> {
    if let Ok(gid) = g.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(g) {
        Ok(Some(group)) => Ok(group.gid.as_raw()),
        Ok(None) => Err(GroupError::Unknown(g.to_owned())),
        Err(source) => Err(GroupError::Lookup {
            name: g.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
socket:
  path: /run/s3dma/shim.sock
agent:
  endpoint: http://127.0.0.1:7000
  token_file: /etc/s3dma/shim.token
fabric:
  listen: 127.0.0.1:0
  fabric_key_file: /etc/s3dma/fabric.key
tenants:
  - name: alice
    uids: [1000]
"#;

    fn err_of(text: &str) -> String {
        parse(Path::new("shim.yaml"), text).unwrap_err().to_string()
    }

    #[test]
    fn defaults_fill_in() {
        let c = parse(Path::new("shim.yaml"), BASE).unwrap();
        assert_eq!(c.socket.mode, "0660");
        assert_eq!(c.agent.connect_timeout_ms, 2000);
        assert_eq!(c.tenants[0].max_buffers, 256);
        assert_eq!(c.tenants[0].max_buffer_bytes, ByteSize(64 * GIB));
        assert_eq!(c.leases.fd_handle_ttl_secs, 60);
        assert_eq!(
            (c.leases.max_rings_per_lease, c.leases.ring_max_entries),
            (1, 256)
        );
        assert!(c.metrics.address.is_none());
        assert_eq!(c.fabric.backend, Backend::Tcp);
        assert_eq!(c.fabric.max_connections, 1024);
        assert_eq!(c.fabric.max_connections_per_address, 256);
        assert_eq!(c.fabric.handshake_timeout_secs, 10);
        assert_eq!(c.fabric.idle_timeout_secs, 300);
    }

    #[test]
    fn rails_replace_listen() {
        let two = BASE.replace(
            "  listen: 127.0.0.1:0\n",
            "  rails:\n    - listen: 127.0.0.1:0\n    - listen: 0.0.0.0:7001\n      advertise: 127.0.0.2\n",
        );
        let c = parse(Path::new("shim.yaml"), &two).unwrap();
        let rails = c.fabric.rail_list();
        assert_eq!(rails.len(), 2);
        assert_eq!(rails[1].advertise, Some("127.0.0.2".parse().unwrap()));
        // The single-rail form is rail 0 of the list.
        let one = parse(Path::new("shim.yaml"), BASE)
            .unwrap()
            .fabric
            .rail_list();
        assert_eq!(
            one,
            vec![fabric::rail::RailConfig::new(
                "127.0.0.1:0".parse().unwrap(),
                None
            )]
        );
        let rails_yaml = "  rails:\n    - listen: 127.0.0.1:0\n    - listen: 127.0.0.2:0\n";
        let cases = [
            (
                BASE.replace(
                    "  listen: 127.0.0.1:0\n",
                    &format!("  listen: 127.0.0.1:0\n{rails_yaml}"),
                ),
                "fabric.rails: and fabric.listen both name",
            ),
            (
                BASE.replace("  listen: 127.0.0.1:0\n", ""),
                "fabric.listen: is required (or fabric.rails)",
            ),
            (
                BASE.replace(
                    "  listen: 127.0.0.1:0\n",
                    &format!("{rails_yaml}  advertise: 127.0.0.1\n"),
                ),
                "fabric.advertise: goes with fabric.listen",
            ),
            (
                BASE.replace(
                    "  listen: 127.0.0.1:0\n",
                    &format!("{rails_yaml}  backend: verbs\n"),
                ),
                "fabric.rails[0].device: with several verbs rails each names its RDMA device",
            ),
            (
                BASE.replace(
                    "  listen: 127.0.0.1:0\n",
                    "  rails:\n    - listen: 127.0.0.1:7000\n    - listen: 127.0.0.1:7000\n",
                ),
                "fabric.rails[1].listen: 127.0.0.1:7000 is also rails[0]'s",
            ),
            (
                BASE.replace(
                    "  listen: 127.0.0.1:0\n",
                    "  rails:\n    - listen: 0.0.0.0:7000\n",
                ),
                "fabric.rails[0].advertise: is required",
            ),
            (
                BASE.replace(
                    "  listen: 127.0.0.1:0\n",
                    "  rails:\n    - listen: 127.0.0.1:0\n      device: mlx5_0\n",
                ),
                "fabric.rails[0].device: applies to the verbs backend only",
            ),
            (
                BASE.replace(
                    "  listen: 127.0.0.1:0\n",
                    "  rails:\n    - listen: 127.0.0.1:0\n      bogus: 1\n",
                ),
                "unknown field `bogus`",
            ),
            (
                BASE.replace(
                    "  listen: 127.0.0.1:0\n",
                    &format!(
                        "  rails:\n{}",
                        (1..=9)
                            .map(|i| format!("    - listen: 127.0.0.{i}:0\n"))
                            .collect::<String>()
                    ),
                ),
                "fabric.rails: at most 8 rails",
            ),
        ];
        for (text, want) in cases {
            let e = err_of(&text);
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
    }

    #[test]
    fn the_example_file_parses() {
        let text = include_str!("../host-shim.example.yaml");
        parse(Path::new("host-shim.example.yaml"), text).unwrap();
    }

    #[test]
    fn errors_name_file_and_field() {
        let cases = [
            (
                BASE.replace("  fabric_key_file", "  bogus: 1\n  fabric_key_file"),
                "unknown field `bogus`",
            ),
            (
                BASE.replace("http://127.0.0.1:7000", "ftp://x:1"),
                "shim.yaml: agent.endpoint: must start with http://",
            ),
            (
                BASE.replace("http://127.0.0.1:7000", "http://x"),
                "agent.endpoint: needs an explicit port",
            ),
            (
                BASE.replace("http://127.0.0.1:7000", "http://x:1/path"),
                "agent.endpoint: must be http(s)://host:port",
            ),
            (
                BASE.replace("  token_file: /etc/s3dma/shim.token\n", ""),
                "agent.token_file: is required",
            ),
            (
                BASE.replace("127.0.0.1:0", "0.0.0.0:0"),
                "fabric.advertise: is required",
            ),
            (
                BASE.replace(
                    "  fabric_key_file",
                    "  max_connections: 0\n  fabric_key_file",
                ),
                "fabric.max_connections: must be between 1",
            ),
            (
                BASE.replace(
                    "  fabric_key_file",
                    "  max_connections: 10\n  max_connections_per_address: 11\n  fabric_key_file",
                ),
                "fabric.max_connections_per_address: must be between 1 and 10",
            ),
            (
                BASE.replace(
                    "  fabric_key_file",
                    "  idle_timeout_secs: 0\n  fabric_key_file",
                ),
                "fabric.idle_timeout_secs: must be between 1",
            ),
            (
                BASE.replace(
                    "  fabric_key_file",
                    "  handshake_timeout_secs: 601\n  fabric_key_file",
                ),
                "fabric.handshake_timeout_secs: must be between 1 and 600",
            ),
            (
                BASE.replace("uids: [1000]", "uids: []"),
                "tenants[0].uids: a tenant needs",
            ),
            (
                BASE.replace("name: alice", "name: a/b"),
                "tenants[0].name: must be",
            ),
            (
                format!("leases:\n  ring_max_entries: 96\n{BASE}"),
                "leases.ring_max_entries: must be a power of two",
            ),
            (
                format!("leases:\n  ring_max_in_flight: 0\n{BASE}"),
                "leases.ring_max_in_flight: must be between 1",
            ),
            (
                format!("runtime:\n  worker_threads: 0\n{BASE}"),
                "shim.yaml: runtime.worker_threads: 0 worker threads: must be 1 to 1024",
            ),
            (
                format!("{BASE}  - name: bob\n    uids: [1000]\n"),
                "tenants[1].uids: uid 1000 is also in tenants[0].uids",
            ),
            (
                format!("{BASE}  - name: alice\n    uids: [1]\n"),
                "tenants[1].name: \"alice\" is also tenants[0].name",
            ),
            (
                BASE.replace("shim.sock", "shim.sock\n  mode: \"4777\""),
                "socket.mode: \"4777\" has bits beyond 0777",
            ),
            (
                BASE.replace("shim.sock", "shim.sock\n  mode: \"0066\""),
                "must let the owner read and write",
            ),
            (
                BASE.replace("shim.sock", "shim.sock\n  mode: rw"),
                "is not an octal mode",
            ),
            (
                BASE.replace("uids: [1000]", "uids: [1000]\n    max_buffers: 0"),
                "tenants[0].max_buffers: must be between 1",
            ),
            (
                BASE.replace("uids: [1000]", "uids: [1000]\n    max_buffer_bytes: 10GB"),
                "binary units",
            ),
            (
                BASE.replace(
                    "tenants:\n  - name: alice\n    uids: [1000]\n",
                    "tenants: []\n",
                ),
                "tenants: at least one tenant",
            ),
            (
                BASE.replace("  token_file", "  tls:\n    ca_file: /x\n  token_file"),
                "agent.tls: is set but agent.endpoint is not https://",
            ),
        ];
        for (text, want) in cases {
            let e = err_of(&text);
            assert!(e.contains(want), "{e:?} should contain {want:?}");
            assert!(e.starts_with("shim.yaml: "), "{e:?}");
        }
    }

    #[test]
    fn load_reads_secrets_and_never_shows_them() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("shim.token");
        std::fs::write(&token, "  s3cr3t-token-0123456789  \n").unwrap();
        let key = dir.path().join("fabric.key");
        std::fs::write(
            &key,
            "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
        )
        .unwrap();
        let text = BASE
            .replace("/etc/s3dma/shim.token", token.to_str().unwrap())
            .replace("/etc/s3dma/fabric.key", key.to_str().unwrap());
        let cfg_path = dir.path().join("shim.yaml");
        std::fs::write(&cfg_path, &text).unwrap();
        // Secret files others can read are refused, naming file and mode.
        let e = load(&cfg_path).unwrap_err().to_string();
        assert!(
            e.contains("agent.token_file") && e.contains("shim.token has mode 0644"),
            "{e}"
        );
        use std::os::unix::fs::PermissionsExt as _;
        for f in [&token, &key] {
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let loaded = load(&cfg_path).unwrap();
        assert_eq!(
            loaded.agent_token.as_ref().unwrap().expose(),
            "s3cr3t-token-0123456789"
        );
        assert_eq!(loaded.socket_mode, 0o660);
        assert!(!format!("{loaded:?}").contains("s3cr3t"));

        std::fs::write(&key, "not hex").unwrap();
        let e = load(&cfg_path).unwrap_err().to_string();
        assert!(e.contains("fabric.fabric_key_file"), "{e}");
        std::fs::remove_file(&token).unwrap();
        let e = load(&cfg_path).unwrap_err().to_string();
        assert!(e.contains("agent.token_file: cannot read"), "{e}");
    }
}
