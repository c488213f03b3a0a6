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
    /// Which S3-over-RDMA dialect the target speaks when `rdma` is true:
    /// `s3dma` (default: storage-targets and gateways, s3dma's own exchange
    /// marked by the signed `x-amz-rdma-protocol: s3dma-v1`) or
    /// `hipobj-rc-v2` (AMD's RC dialect: `/.hipobj-rc/{prepare,ready}`, a
    /// queue pair per transfer on the shim's RDMA device; a shim without
    /// one, or a target that answers 501, gets the bytes over HTTP through
    /// the agent) or `cuobject-dc` (NVIDIA's DC dialect: MinIO AIStor,
    /// Cloudian, Dell, NooBaa, a storage-target built with `dc`; each
    /// request carries a standard token the calling shim minted for exactly
    /// its window, naming the shim's DC target; a shim without DC (no mlx5
    /// device) gets the bytes over HTTP through the agent).
    #[serde(default)]
    pub protocol: RdmaProtocol,
    /// The request header carrying the token (lowercase, `x-` first).
    /// Default `x-amz-rdma-token`; servers that read another name (Dell
    /// `x-amz-meta-rdma-token`, Scality `x-scal-rdma`) need it set. Must be
    /// the default with `protocol: s3dma`.
    #[serde(default = "default_token_header")]
    pub token_header: String,
    /// How the parts of a multipart PUT (above `transfer.multipart_threshold`)
    /// move when `rdma` is true: `rdma` (default: each part in the target's
    /// dialect, like a single PUT) or `http` (each part as an HTTP body
    /// through the agent's staging memory; GETs and single PUTs still move
    /// by RDMA). `http` is for servers whose RDMA path ignores the part
    /// target and stores each part as the whole object (elbencho's
    /// `s3rdma-server`): the agent finds that out itself after the first
    /// such upload (it checks every completed upload's stored size, fails
    /// that call and sends the target's later parts over HTTP), and this
    /// setting saves that first failed call. No effect with `rdma: false`.
    #[serde(default = "default_multipart_parts")]
    pub multipart_parts: MultipartParts,
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
            protocol: RdmaProtocol::default(),
            token_header: default_token_header(),
            multipart_parts: default_multipart_parts(),
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

fn default_token_header() -> String {
    s3dma_wire::headers::RDMA_TOKEN.to_owned()
}

fn default_multipart_parts() -> MultipartParts {
    MultipartParts::Rdma
}

/// `targets[].multipart_parts`: how a multipart PUT's parts move.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MultipartParts {
    /// In the target's dialect, like a single PUT.
    #[default]
    Rdma,
    /// As HTTP bodies through the agent.
    Http,
}

/// `targets[].protocol`: the S3-over-RDMA dialect of a target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RdmaProtocol {
    /// s3dma's own exchange (storage-target, gateways).
    #[default]
    S3dma,
    /// AMD's hipobj-rc-v2 (RC queue pairs).
    HipobjRcV2,
    /// The cuObject dialect (the shims' DC targets; mlx5 only).
    CuobjectDc,
}

/// A `protocol` that names no dialect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a dialect: s3dma, hipobj-rc-v2 or cuobject-dc")]
pub struct UnknownProtocol(pub String);

impl std::str::FromStr for RdmaProtocol {
    type Err = UnknownProtocol;

    fn from_str(s: &str) -> Result<RdmaProtocol, UnknownProtocol> {
        match s {
            "s3dma" => Ok(RdmaProtocol::S3dma),
            "hipobj-rc-v2" => Ok(RdmaProtocol::HipobjRcV2),
            "cuobject-dc" => Ok(RdmaProtocol::CuobjectDc),
            other => Err(UnknownProtocol(other.to_owned())),
        }
    }
}

impl std::fmt::Display for RdmaProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl RdmaProtocol {
    /// The name, as configured.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            RdmaProtocol::S3dma => "s3dma",
            RdmaProtocol::HipobjRcV2 => "hipobj-rc-v2",
            RdmaProtocol::CuobjectDc => "cuobject-dc",
        }
    }

    /// Whether the target opens fabric sessions to the shim that it
    /// authenticates with a fabric key (s3dma's own dialect); the standard
    /// dialects reach the shim's memory without one.
    #[must_use]
    pub fn authenticates_fabric_sessions(self) -> bool {
        matches!(self, RdmaProtocol::S3dma)
    }
}

fn default_max_idle_connections() -> usize {
    64
}
