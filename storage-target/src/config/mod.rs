//! The storage-target YAML configuration file.
//!
//! Every field is documented here and in `storage-target.example.yaml`; unknown
//! fields are rejected. [`Config::load`] parses and validates a file and reports
//! errors as `<file>: <field path>: <what is wrong>`.
//!
//! A leaf of the crate: the sections of other concerns live in submodules
//! here ([`gateway`], [`rdma`] with [`networks`], [`multipart`]), with the
//! naming rules they check ([`bucket_name`]), and the modules that use
//! them re-export them.

pub mod batch;
pub mod bucket_name;
pub mod connections;
pub mod dc;
pub mod gateway;
pub mod hipobj;
pub mod multipart;
pub mod networks;
pub mod rdma;

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use s3dma_config::ConfigError;

/// A bad value in one section of the file: the field, named within its
/// section (the caller prefixes the section), and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct FieldError {
    /// The field, e.g. `per_address` or `endpoints[1]`.
    pub field: String,
    /// What is wrong with its value.
    pub problem: String,
}

impl FieldError {
    /// The `problem` of `field`.
    #[must_use]
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// S3 HTTP listen address; port 0 picks a free port (the bound address is
    /// printed on stdout as `storage-target listening on http://IP:PORT`).
    /// Default `127.0.0.1:9000`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Most S3 connections open at a time on `listen`. At the cap, the
    /// connection idle longest (no request in progress) is closed to make
    /// room for a new one; when every one has a request in progress, the
    /// new connection is closed at once. Counted in the file-descriptor
    /// budget checked against `RLIMIT_NOFILE` at start. Default 1024;
    /// between 1 and 1000000.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// How the `max_connections` slots are shared: per client address, per
    /// S3 user, the least transfer rate of a request in progress, and the
    /// slots reserved for the dpu-agents. Default: the section's defaults
    /// (256 per address, 256 requests per user, `16KiB`/s over 10 s, no
    /// agent networks).
    #[serde(default)]
    pub connections: connections::ConnectionsConfig,
    /// Largest chunk an aws-chunked request body (`x-amz-content-sha256:
    /// STREAMING-...`) may declare; a larger one is refused with `400
    /// InvalidRequest` before its bytes are read (the whole chunk is held in
    /// memory to check its signature). Real clients send 64 KiB (AWS SDKs
    /// for Rust and Go, minio-go) to 1 MiB (botocore, the aws CLI). Default
    /// `8MiB`; between 64KiB and 256MiB.
    #[serde(default = "default_max_aws_chunk_size")]
    pub max_aws_chunk_size: s3dma_config::ByteSize,
    /// Region used for SigV4 verification and returned by GetBucketLocation.
    /// Default `us-east-1`; must not be empty.
    #[serde(default = "default_region")]
    pub region: String,
    /// Directory that holds all buckets, objects and multipart uploads
    /// (`store: filesystem`). Required there (no default); created 0700
    /// when missing. Not used by `store: s3` (leave it out).
    #[serde(default, skip_serializing_if = "path_is_empty")]
    pub data_dir: PathBuf,
    /// Where the objects live: `filesystem` (the default: files under
    /// `data_dir`) or `s3`: a gateway in front of an existing S3 endpoint
    /// (`upstream`) with a read cache in registered memory (`cache`).
    #[serde(default)]
    pub store: gateway::StoreKind,
    /// The S3 endpoint behind the gateway: required with `store: s3`,
    /// refused otherwise. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<gateway::UpstreamConfig>,
    /// The gateway's read cache (`store: s3`). Default: the section's
    /// defaults (1 GiB of 4 MiB chunks, S3-FIFO, every read confirmed
    /// upstream).
    #[serde(default)]
    pub cache: gateway::CacheConfig,
    /// Listen address of the Prometheus endpoint (`GET /metrics`); omit to
    /// disable. The older spelling of `metrics.address` (set one or the
    /// other, not both); kept working. Default: none.
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    /// Where and how `/metrics` is served: a TCP address, a Unix socket only
    /// this user (or root) can open, and/or a bearer token. Omitted (and no
    /// `metrics_listen`): no metrics are served.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Largest accepted difference between a request's signing time and the
    /// server clock, in seconds. Default 900 (15 minutes, as S3).
    #[serde(default = "default_max_clock_skew_secs")]
    pub max_clock_skew_secs: u32,
    /// Accept AWS Signature Version 2 (`Authorization: AWS key:signature`,
    /// presigned `AWSAccessKeyId`/`Signature`/`Expires`, SigV2 POST forms)
    /// besides SigV4. Default false: SigV2 requests are refused with
    /// `400 InvalidRequest`. When enabled they are held to SigV4's limits
    /// (a presigned `Expires` at most a week ahead, a signed `Date` or
    /// `x-amz-date` within `max_clock_skew_secs`), but SigV2 never signs
    /// the payload: whoever captures a SigV2 PUT can replay it with another
    /// body until its date leaves the skew window. Never used for RDMA
    /// (`x-amz-rdma-token` must be among SigV4 signed headers).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_sigv2: bool,
    /// The users allowed to access the server. At least one is required
    /// (anonymous access is not supported); no default.
    #[serde(default)]
    pub users: Vec<UserConfig>,
    /// Serving GET/PUT/UploadPart over RDMA (`x-amz-rdma-token`). Default:
    /// the section's defaults, i.e. `mode: disabled`.
    #[serde(default)]
    pub rdma: rdma::RdmaConfig,
    /// Per-user caps on in-progress multipart uploads and the sweep of
    /// those never completed (`store: filesystem`). Default: the section's
    /// defaults (1000 uploads, 100000 parts and 1TiB per user; uploads
    /// aborted 7 days after initiation).
    #[serde(default)]
    pub multipart: multipart::MultipartConfig,
    /// The async runtime: `worker_threads` (optional; default one per CPU).
    #[serde(default)]
    pub runtime: s3dma_config::RuntimeConfig,
}

/// The `metrics:` section: where `GET /metrics` is served (a TCP address,
/// a Unix socket, a bearer token), the section every service shares. Metric
/// labels name operations and traffic, which other local users need not
/// read: keep the TCP address on loopback, or use the Unix socket (mode
/// 0600, peers of another uid refused), or require a bearer token. The TCP
/// address's bound port is printed on stdout as
/// `metrics on http://IP:PORT/metrics`; `unix_socket` must be absolute.
pub use s3dma_config::MetricsConfig;

/// One user: credentials and bucket grants.
#[derive(Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// The SigV4 access key id. Required; printable ASCII, unique.
    pub access_key_id: String,
    /// The secret access key, inline. Exactly one of `secret` and `secret_file`.
    #[serde(default)]
    pub secret: Option<String>,
    /// A file holding the secret access key (surrounding whitespace, e.g. a
    /// trailing newline, is trimmed). It must be private: a file group or
    /// others may access (mode beyond 0600) is refused, naming the file and
    /// its mode.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// Buckets this user may access and how. Default: none (the user can
    /// authenticate but reach no bucket).
    #[serde(default)]
    pub buckets: Vec<BucketGrant>,
    /// The user's S3 canonical id (owner of the buckets and objects it
    /// creates, the `ID` in ACLs): 64 lowercase hex digits. Default: derived
    /// from the access key id (see [`default_canonical_id`]), so it is stable
    /// as long as the key is; set it explicitly before rotating keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canonical_id: Option<String>,
    /// The display name shown with the canonical id (ListBuckets owner,
    /// object owners in listings, ACLs), to whoever may read those,
    /// anonymous readers of public buckets included. Default: the
    /// canonical id (the access key id is never shown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// Whether the user may create buckets whose name none of its write
    /// grants covers (as any AWS user may). Default: false, so the
    /// operator's grants keep deciding the bucket namespace.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub create_buckets: bool,
}

/// The canonical id of a user configured without one: the SHA-256 of
/// `s3dma-user:<access key id>`, in lowercase hex.
#[must_use]
pub fn default_canonical_id(access_key_id: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(
        format!("s3dma-user:{access_key_id}").as_bytes(),
    ))
}

/// Whether `id` is a valid canonical id: 64 lowercase hex digits.
#[must_use]
pub fn valid_canonical_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl fmt::Debug for UserConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserConfig")
            .field("access_key_id", &self.access_key_id)
            .field("secret", &self.secret.as_ref().map(|_| "[redacted]"))
            .field("secret_file", &self.secret_file)
            .field("buckets", &self.buckets)
            .field("canonical_id", &self.canonical_id)
            .field("display_name", &self.display_name)
            .field("create_buckets", &self.create_buckets)
            .finish()
    }
}

/// A grant of access to one bucket (or every bucket with `"*"`).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct BucketGrant {
    /// Bucket name; or `"*"` for every bucket, or `"prefix*"` for every bucket
    /// whose name starts with `prefix` (a write grant on a pattern also allows
    /// CreateBucket of matching names).
    pub name: String,
    /// What the user may do in the bucket.
    pub access: Access,
}

/// Access level of a [`BucketGrant`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Read objects, list, head.
    Read,
    /// Write and delete objects, create and delete the bucket, multipart uploads.
    Write,
    /// Both.
    ReadWrite,
}

impl Access {
    /// Whether this level allows reading.
    #[must_use]
    pub fn can_read(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }

    /// Whether this level allows writing.
    #[must_use]
    pub fn can_write(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

/// A grant name is `"*"`, `"<prefix>*"` (prefix of bucket-name characters,
/// starting with a letter or digit), or a valid bucket name.
fn valid_grant_name(name: &str) -> bool {
    match name.strip_suffix('*') {
        Some("") => true,
        Some(prefix) => {
            prefix.len() < 63
                && prefix
                    .bytes()
                    .next()
                    .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && prefix
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
        }
        None => bucket_name::is_valid_bucket_name(name),
    }
}

/// Default of `max_aws_chunk_size`: well above what real clients send per
/// chunk (aws-sdk-rust, aws-sdk-go-v2 and minio-go 64 KiB, aws-sdk-java v2
/// 128 KiB, botocore and the aws CLI 1 MiB).
pub const DEFAULT_MAX_AWS_CHUNK: u64 = 8 << 20;

fn path_is_empty(p: &Path) -> bool {
    p.as_os_str().is_empty()
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9000))
}

fn default_max_connections() -> usize {
    1024
}

fn default_max_aws_chunk_size() -> s3dma_config::ByteSize {
    s3dma_config::ByteSize(DEFAULT_MAX_AWS_CHUNK)
}

fn default_region() -> String {
    "us-east-1".to_owned()
}

fn default_max_clock_skew_secs() -> u32 {
    900
}

impl Config {
    /// A configuration with every default and no users, serving
    /// `data_dir` (for programs that write configuration files, such as the
    /// launcher; [`Config::validate`] wants at least one user).
    #[must_use]
    pub fn new(data_dir: PathBuf) -> Config {
        Config {
            listen: default_listen(),
            max_connections: default_max_connections(),
            connections: connections::ConnectionsConfig::default(),
            max_aws_chunk_size: default_max_aws_chunk_size(),
            region: default_region(),
            data_dir,
            store: gateway::StoreKind::Filesystem,
            upstream: None,
            cache: gateway::CacheConfig::default(),
            metrics_listen: None,
            metrics: MetricsConfig::default(),
            max_clock_skew_secs: default_max_clock_skew_secs(),
            allow_sigv2: false,
            users: Vec::new(),
            rdma: rdma::RdmaConfig::default(),
            multipart: multipart::MultipartConfig::default(),
            runtime: s3dma_config::RuntimeConfig::default(),
        }
    }
}

/// Where the objects live, validated ([`Config::backend`]): each backend
/// with its own sections.
#[derive(Debug, Clone, Copy)]
pub enum StoreBackend<'a> {
    /// `store: filesystem`: files under `data_dir`.
    Filesystem {
        /// The data directory.
        data_dir: &'a Path,
        /// The multipart caps and sweep.
        multipart: &'a multipart::MultipartConfig,
    },
    /// `store: s3`: the gateway in front of `upstream`.
    S3 {
        /// The upstream endpoint(s).
        upstream: &'a gateway::UpstreamConfig,
        /// The read cache.
        cache: &'a gateway::CacheConfig,
    },
}

/// A user after validation, with the secret resolved.
#[derive(Clone)]
pub struct User {
    /// The access key id.
    pub access_key_id: String,
    /// The secret access key.
    pub secret: String,
    /// Grants, in configuration order.
    pub buckets: Vec<BucketGrant>,
    /// The canonical id (configured or derived).
    pub canonical_id: String,
    /// The display name (configured, or the canonical id).
    pub display_name: String,
    /// May create buckets beyond its write grants.
    pub create_buckets: bool,
}

impl fmt::Debug for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("User")
            .field("access_key_id", &self.access_key_id)
            .field("secret", &"[redacted]")
            .field("buckets", &self.buckets)
            .field("canonical_id", &self.canonical_id)
            .field("display_name", &self.display_name)
            .field("create_buckets", &self.create_buckets)
            .finish()
    }
}

impl Config {
    /// Reads, parses and validates a configuration file; returns the config and
    /// the users with their secrets resolved.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file and the field.
    pub fn load(path: &Path) -> Result<(Config, Vec<User>), ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        let config = Self::parse(&file, &text)?;
        let users = config.validate(&file)?;
        Ok((config, users))
    }

    /// Parses YAML text; `file` is used in error messages only.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] for malformed YAML, unknown fields or wrong types.
    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
        serde_yaml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.to_owned(),
            message: e.to_string(),
        })
    }

    /// Validates values and resolves secrets.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first offending field.
    pub fn validate(&self, file: &str) -> Result<Vec<User>, ConfigError> {
        let v = s3dma_config::Validator::new(file);
        let invalid = |field: String, message: String| v.err(field, message);
        if self.region.is_empty() {
            return Err(invalid("region".into(), "must not be empty".into()));
        }
        self.runtime
            .check()
            .map_err(|m| invalid("runtime.worker_threads".into(), m.to_string()))?;
        self.backend(file)?;
        if !(1..=1_000_000).contains(&self.max_connections) {
            return Err(invalid(
                "max_connections".into(),
                format!(
                    "must be between 1 and 1000000, got {}",
                    self.max_connections
                ),
            ));
        }
        self.connections
            .check(self.max_connections)
            .map_err(|e| invalid(format!("connections.{}", e.field), e.problem))?;
        let chunk = self.max_aws_chunk_size.0;
        if !(64 << 10..=256 << 20).contains(&chunk) {
            return Err(invalid(
                "max_aws_chunk_size".into(),
                format!("must be between 64KiB and 256MiB, got {chunk} bytes"),
            ));
        }
        self.rdma.validate(file)?;
        if self.rdma.rails.len() > 1 && self.store == gateway::StoreKind::S3 {
            return Err(invalid(
                "rdma.rails".into(),
                "a gateway (store: s3) serves one rail in this release: its read cache is registered on the first device only; keep one rail".into(),
            ));
        }
        self.multipart
            .check()
            .map_err(|e| invalid(format!("multipart.{}", e.field), e.problem))?;
        self.metrics_options(file)?;
        if self.users.is_empty() {
            return Err(invalid(
                "users".into(),
                "at least one user is required (anonymous access is not supported)".into(),
            ));
        }
        let mut seen = HashSet::new();
        let mut seen_ids = HashSet::new();
        let mut users = Vec::with_capacity(self.users.len());
        for (i, u) in self.users.iter().enumerate() {
            let at = |f: &str| format!("users[{i}].{f}");
            if u.access_key_id.is_empty() {
                return Err(invalid(at("access_key_id"), "must not be empty".into()));
            }
            if !u.access_key_id.chars().all(|c| c.is_ascii_graphic()) {
                return Err(invalid(
                    at("access_key_id"),
                    "must be printable ASCII without spaces".into(),
                ));
            }
            if !seen.insert(u.access_key_id.clone()) {
                return Err(invalid(
                    at("access_key_id"),
                    format!("duplicate access key id {:?}", u.access_key_id),
                ));
            }
            let secret = match (&u.secret, &u.secret_file) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        at("secret"),
                        "set exactly one of secret and secret_file, not both".into(),
                    ));
                }
                (None, None) => {
                    return Err(invalid(
                        at("secret"),
                        "one of secret and secret_file is required".into(),
                    ));
                }
                (Some(s), None) => s.clone(),
                (None, Some(p)) => s3dma_config::read_secret_file(p)
                    .map_err(|e| invalid(at("secret_file"), e.to_string()))?
                    .expose()
                    .to_owned(),
            };
            if secret.is_empty() {
                return Err(invalid(at("secret"), "the secret is empty".into()));
            }
            for (j, g) in u.buckets.iter().enumerate() {
                if !valid_grant_name(&g.name) {
                    return Err(invalid(
                        at(&format!("buckets[{j}].name")),
                        format!(
                            "{:?} is neither \"*\", a prefix pattern like \"team-*\", nor a valid bucket name",
                            g.name
                        ),
                    ));
                }
            }
            let canonical_id = match &u.canonical_id {
                Some(id) if !valid_canonical_id(id) => {
                    return Err(invalid(
                        at("canonical_id"),
                        "must be 64 lowercase hex digits".into(),
                    ));
                }
                Some(id) => id.clone(),
                None => default_canonical_id(&u.access_key_id),
            };
            if !seen_ids.insert(canonical_id.clone()) {
                return Err(invalid(
                    at("canonical_id"),
                    format!("canonical id {canonical_id} is already another user's"),
                ));
            }
            let display_name = u
                .display_name
                .clone()
                .unwrap_or_else(|| canonical_id.clone());
            if display_name.is_empty() || display_name.chars().any(char::is_control) {
                return Err(invalid(
                    at("display_name"),
                    "must be non-empty text without control characters".into(),
                ));
            }
            users.push(User {
                access_key_id: u.access_key_id.clone(),
                secret,
                buckets: u.buckets.clone(),
                canonical_id,
                display_name,
                create_buckets: u.create_buckets,
            });
        }
        for (i, t) in self.rdma.tenant_users.iter().enumerate() {
            if !users.iter().any(|u| &u.access_key_id == t) {
                return Err(invalid(
                    format!("rdma.tenant_users[{i}]"),
                    format!("{t:?} is not one of users[].access_key_id"),
                ));
            }
        }
        Ok(users)
    }

    /// The validated store backend: `store:` with the sections it needs
    /// (`data_dir` for `filesystem`; `upstream:` and `cache:` for `s3`),
    /// and none that belong to the other one. (`store:` takes no other
    /// value: an unknown one fails [`Config::parse`], naming the field.)
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the missing or misplaced field.
    pub fn backend(&self, file: &str) -> Result<StoreBackend<'_>, ConfigError> {
        let invalid = |field: String, message: String| ConfigError::Invalid {
            file: file.to_owned(),
            field,
            message,
        };
        match (self.store, &self.upstream) {
            (gateway::StoreKind::Filesystem, None) => {
                if self.data_dir.as_os_str().is_empty() {
                    return Err(invalid(
                        "data_dir".into(),
                        "required (the directory of the filesystem store)".into(),
                    ));
                }
                Ok(StoreBackend::Filesystem {
                    data_dir: &self.data_dir,
                    multipart: &self.multipart,
                })
            }
            (gateway::StoreKind::Filesystem, Some(_)) => Err(invalid(
                "upstream".into(),
                "only for `store: s3` (the gateway); add `store: s3` or remove the section".into(),
            )),
            (gateway::StoreKind::S3, None) => Err(invalid(
                "upstream".into(),
                "required with `store: s3`: the S3 endpoint(s) the gateway stands in front of"
                    .into(),
            )),
            (gateway::StoreKind::S3, Some(up)) => {
                if !self.data_dir.as_os_str().is_empty() {
                    return Err(invalid(
                        "data_dir".into(),
                        "not used by `store: s3` (the gateway keeps nothing on disk); remove it"
                            .into(),
                    ));
                }
                up.check()
                    .map_err(|e| invalid(format!("upstream.{}", e.field), e.problem))?;
                self.cache
                    .check()
                    .map_err(|e| invalid(format!("cache.{}", e.field), e.problem))?;
                Ok(StoreBackend::S3 {
                    upstream: up,
                    cache: &self.cache,
                })
            }
        }
    }

    /// File descriptors this configuration may need at its caps: each S3
    /// connection and what its request opens (an object file, or an
    /// upstream connection), each metrics connection, plus
    /// [`FD_RESERVE`].
    #[must_use]
    pub fn fd_budget(&self) -> u64 {
        let metrics_listeners = u64::from(self.metrics.address.or(self.metrics_listen).is_some())
            + u64::from(self.metrics.unix_socket.is_some());
        2 * self.max_connections as u64
            + metrics_listeners * s3dma_service::metrics::MAX_CONNECTIONS as u64
            + FD_RESERVE
    }
}

/// File descriptors the target needs besides its connections' (listeners,
/// the fabric's sessions to client endpoints, logs, the store's own files).
pub const FD_RESERVE: u64 = 512;

impl Config {
    /// Where to serve `/metrics` (`metrics:` and the older `metrics_listen`),
    /// with the bearer token read from its file.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`]: both `metrics_listen` and `metrics.address`,
    /// a socket path that is not absolute, an unreadable, empty or
    /// non-private token file.
    pub fn metrics_options(
        &self,
        file: &str,
    ) -> Result<s3dma_service::metrics::MetricsOptions, ConfigError> {
        let v = s3dma_config::Validator::new(file);
        let invalid = |field: &str, message: String| v.err(field, message);
        if self.metrics_listen.is_some() && self.metrics.address.is_some() {
            return Err(invalid(
                "metrics_listen",
                "set either metrics_listen or metrics.address (the same thing), not both".into(),
            ));
        }
        if let Some(p) = &self.metrics.unix_socket
            && !p.is_absolute()
        {
            return Err(invalid(
                "metrics.unix_socket",
                format!("must be an absolute path, got {}", p.display()),
            ));
        }
        let bearer_token = match &self.metrics.bearer_token_file {
            Some(p) => Some(
                s3dma_config::read_secret_file(p)
                    .map_err(|e| invalid("metrics.bearer_token_file", e.to_string()))?,
            ),
            None => None,
        };
        Ok(s3dma_service::metrics::MetricsOptions {
            address: self.metrics.address.or(self.metrics_listen),
            unix_socket: self.metrics.unix_socket.clone(),
            bearer_token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Why the file `yaml` (`t.yaml`) parses but does not validate.
    fn invalid(yaml: &str) -> String {
        Config::parse("t.yaml", yaml)
            .unwrap()
            .validate("t.yaml")
            .unwrap_err()
            .to_string()
    }

    const EXAMPLE: &str = include_str!("../../storage-target.example.yaml");

    #[test]
    fn rdma_rails_name_devices_that_exist_and_are_verbs_only() {
        let base = "data_dir: /x\nusers: [{access_key_id: a, secret: s}]\n";
        let e = invalid(&format!("{base}rdma: {{rails: [{{device: rxe0}}]}}\n"));
        assert!(
            e.contains("rdma.rails") && e.contains("verbs backend only"),
            "{e}"
        );
        // A device this machine lacks: refused at start, naming the rail.
        let e = invalid(&format!(
            "{base}rdma: {{backend: verbs, rails: [{{device: no_such_dev0}}]}}\n"
        ));
        assert!(
            e.contains("rdma.rails[0].device") && e.contains("no RDMA device `no_such_dev0`"),
            "{e}"
        );
        let e = invalid(&format!("{base}rdma: {{backend: verbs, rails: []}}\n").replace(
            "rails: []",
            "rails: [{device: a}, {device: b}, {device: c}, {device: d}, {device: e}, {device: f}, {device: g}, {device: h}, {device: i}]",
        ));
        assert!(e.contains("at most 8 rails"), "{e}");
        assert!(
            Config::parse(
                "t.yaml",
                &format!("{base}rdma: {{rails: [{{devcie: rxe0}}]}}\n")
            )
            .is_err()
        );
    }

    #[test]
    fn gateway_store_rules() {
        let base = "users: [{access_key_id: a, secret: s}]\n";
        let field = |text: String| match Config::parse("t.yaml", &text)
            .unwrap()
            .validate("t.yaml")
            .unwrap_err()
        {
            ConfigError::Invalid { field, .. } => field,
            e => panic!("{e}"),
        };
        let up = "upstream: {endpoints: ['http://h:1']}\n";
        assert_eq!(field(base.to_owned()), "data_dir");
        assert_eq!(field(format!("data_dir: /x\n{up}{base}")), "upstream");
        assert_eq!(field(format!("store: s3\n{base}")), "upstream");
        assert_eq!(
            field(format!("store: s3\ndata_dir: /x\n{up}{base}")),
            "data_dir"
        );
        assert_eq!(
            field(format!(
                "store: s3\nupstream: {{endpoints: ['h:1']}}\n{base}"
            )),
            "upstream.endpoints[0]"
        );
        assert_eq!(
            field(format!("store: s3\n{up}cache: {{size: 1MiB}}\n{base}")),
            "cache.size"
        );
        let c = Config::parse("t.yaml", &format!("store: s3\n{up}{base}")).unwrap();
        c.validate("t.yaml").unwrap();
        // What the launcher writes: no data_dir, and it parses back.
        let text = serde_yaml::to_string(&c).unwrap();
        assert!(!text.contains("data_dir"), "{text}");
        Config::parse("t.yaml", &text)
            .unwrap()
            .validate("t.yaml")
            .unwrap();
    }

    #[test]
    fn store_backend_is_validated() {
        let base = "users: [{access_key_id: a, secret: s}]\n";
        let e = Config::parse("t.yaml", &format!("store: ceph\ndata_dir: /x\n{base}")).unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("t.yaml: "), "{msg}");
        assert!(msg.contains("store") && msg.contains("ceph"), "{msg}");
        assert!(msg.contains("filesystem") && msg.contains("s3"), "{msg}");
        let c = Config::parse("t.yaml", &format!("data_dir: /x\n{base}")).unwrap();
        assert!(matches!(
            c.backend("t.yaml").unwrap(),
            StoreBackend::Filesystem { data_dir, .. } if data_dir == Path::new("/x")
        ));
        let up = "upstream: {endpoints: ['http://h:1']}\n";
        let c = Config::parse("t.yaml", &format!("store: s3\n{up}{base}")).unwrap();
        assert!(matches!(
            c.backend("t.yaml").unwrap(),
            StoreBackend::S3 { upstream, .. } if upstream.endpoints == ["http://h:1"]
        ));
    }

    #[test]
    fn example_parses_and_validates() {
        let c = Config::parse("storage-target.example.yaml", EXAMPLE).unwrap();
        assert_eq!(c.region, "us-east-1");
        assert_eq!(c.max_clock_skew_secs, 900);
        assert!(!c.allow_sigv2);
        assert!(c.metrics_listen.is_some());
        let m = c.metrics_options("storage-target.example.yaml").unwrap();
        assert_eq!(m.address, Some("127.0.0.1:9100".parse().unwrap()));
        assert!(m.unix_socket.is_none() && m.bearer_token.is_none());
        assert_eq!(c.rdma.max_staging_share, 0.5);
        let users = c.validate("storage-target.example.yaml").unwrap();
        assert_eq!(users[0].access_key_id, "s3dma-local");
        assert_eq!(users[0].buckets[0].access, Access::ReadWrite);
        assert_eq!(c.rdma.mode, rdma::RdmaMode::Disabled);
        assert_eq!(c.rdma.staging_buffer_size, s3dma_config::ByteSize(4 << 20));
        assert_eq!(c.rdma.connect_timeout_ms, 2000);
        assert_eq!(c.multipart, multipart::MultipartConfig::default());
    }

    #[test]
    fn multipart_errors_name_the_field() {
        let c = Config::parse(
            "t.yaml",
            "data_dir: /x\nusers: [{access_key_id: a, secret: s}]\nmultipart: {max_open_uploads_per_user: 0}\n",
        )
        .unwrap();
        let e = c.validate("t.yaml").unwrap_err().to_string();
        assert!(
            e.contains("t.yaml") && e.contains("multipart.max_open_uploads_per_user"),
            "{e}"
        );
        let unknown = Config::parse(
            "t.yaml",
            "data_dir: /x\nusers: [{access_key_id: a, secret: s}]\nmultipart: {max_uploads: 1}\n",
        );
        assert!(unknown.is_err());
    }

    #[test]
    fn rdma_errors_name_the_field() {
        let msg = invalid(
            "data_dir: /x\nusers: [{access_key_id: a, secret: s}]\nrdma: {mode: enabled}\n",
        );
        assert!(msg.starts_with("t.yaml: rdma.fabric_key_file:"), "{msg}");
        let e = Config::parse("t.yaml", "data_dir: /x\nrdma: {bogus: 1}\n").unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
    }

    #[test]
    fn connection_chunk_and_tenant_user_limits() {
        let base =
            "data_dir: /x\nusers: [{access_key_id: a, secret: s}, {access_key_id: b, secret: t}]\n";
        let c = Config::parse("t.yaml", base).unwrap();
        assert_eq!(c.max_connections, 1024);
        assert_eq!(c.max_aws_chunk_size, s3dma_config::ByteSize(8 << 20));
        assert_eq!(c.fd_budget(), 2 * 1024 + FD_RESERVE);
        c.validate("t.yaml").unwrap();
        for (extra, want) in [
            (
                "max_connections: 0\n",
                "t.yaml: max_connections: must be between 1 and 1000000",
            ),
            (
                "max_aws_chunk_size: 1KiB\n",
                "t.yaml: max_aws_chunk_size: must be between 64KiB and 256MiB",
            ),
            (
                "rdma: {tenant_users: [a, zed]}\n",
                "t.yaml: rdma.tenant_users[1]: \"zed\" is not one of users[].access_key_id",
            ),
        ] {
            let c = Config::parse("t.yaml", &format!("{base}{extra}")).unwrap();
            let msg = c.validate("t.yaml").unwrap_err().to_string();
            assert!(msg.starts_with(want), "{extra}: {msg}");
        }
        let c = Config::parse(
            "t.yaml",
            &format!("{base}metrics: {{address: 127.0.0.1:0, unix_socket: /run/m.sock}}\nrdma: {{tenant_users: [b]}}\nmax_connections: 10\n"),
        )
        .unwrap();
        c.validate("t.yaml").unwrap();
        assert_eq!(
            c.fd_budget(),
            20 + 2 * s3dma_service::metrics::MAX_CONNECTIONS as u64 + FD_RESERVE
        );
    }

    #[test]
    fn defaults_apply() {
        let c = Config::parse(
            "t.yaml",
            "data_dir: /tmp/x\nusers: [{access_key_id: a, secret: b}]\n",
        )
        .unwrap();
        assert_eq!(c.listen, default_listen());
        assert_eq!(c.max_clock_skew_secs, 900);
        assert!(c.metrics_listen.is_none());
    }

    #[test]
    fn unknown_field_is_named() {
        let e = Config::parse("t.yaml", "data_dir: /x\nbogus: 1\n").unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("t.yaml: "), "{msg}");
        assert!(msg.contains("bogus"), "{msg}");
    }

    #[test]
    fn worker_threads_are_checked() {
        let msg = invalid(
            "data_dir: /x\nusers: [{access_key_id: a, secret: b}]\nruntime: {worker_threads: 0}\n",
        );
        assert!(
            msg.starts_with("t.yaml: runtime.worker_threads: 0 worker threads: must be 1 to"),
            "{msg}"
        );
        let c = Config::parse(
            "t.yaml",
            "data_dir: /x\nusers: [{access_key_id: a, secret: b}]\nruntime: {worker_threads: 1}\n",
        )
        .unwrap();
        assert_eq!(c.runtime.worker_threads, Some(1));
        c.validate("t.yaml").unwrap();
    }

    #[test]
    fn missing_secret_file_names_field() {
        let c = Config::parse(
            "storage-target.yaml",
            "data_dir: /x\nusers:\n - {access_key_id: a, secret: s}\n - {access_key_id: b, secret_file: /nonexistent/x}\n",
        )
        .unwrap();
        let msg = c.validate("storage-target.yaml").unwrap_err().to_string();
        assert!(
            msg.starts_with(
                "storage-target.yaml: users[1].secret_file: cannot read /nonexistent/x:"
            ),
            "{msg}"
        );
    }

    #[test]
    fn secret_file_is_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("key");
        std::fs::write(&p, "abc\n").unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let c = Config::parse(
            "t.yaml",
            &format!(
                "data_dir: /x\nusers: [{{access_key_id: a, secret_file: {}}}]\n",
                p.display()
            ),
        )
        .unwrap();
        assert_eq!(c.validate("t.yaml").unwrap()[0].secret, "abc");
    }

    #[test]
    fn secret_files_others_can_read_are_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("key");
        std::fs::write(&p, "abc\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let c = Config::parse(
            "t.yaml",
            &format!(
                "data_dir: /x\nusers: [{{access_key_id: a, secret_file: {}}}]\n",
                p.display()
            ),
        )
        .unwrap();
        let msg = c.validate("t.yaml").unwrap_err().to_string();
        assert!(msg.starts_with("t.yaml: users[0].secret_file: "), "{msg}");
        assert!(
            msg.contains(&format!("{} has mode 0644", p.display())),
            "{msg}"
        );
        assert!(!msg.contains("abc"), "{msg}");
    }

    #[test]
    fn metrics_section_and_old_field() {
        let c = Config::parse(
            "t.yaml",
            "data_dir: /x\nmetrics_listen: 127.0.0.1:0\nusers: [{access_key_id: a, secret: b}]\n",
        )
        .unwrap();
        let o = c.metrics_options("t.yaml").unwrap();
        assert_eq!(o.address, Some("127.0.0.1:0".parse().unwrap()));
        assert!(o.unix_socket.is_none() && o.bearer_token.is_none());
        let c = Config::parse(
            "t.yaml",
            "data_dir: /x\nmetrics: {address: 127.0.0.1:1, unix_socket: /run/m.sock}\nusers: [{access_key_id: a, secret: b}]\n",
        )
        .unwrap();
        let o = c.metrics_options("t.yaml").unwrap();
        assert_eq!(o.address, Some("127.0.0.1:1".parse().unwrap()));
        assert_eq!(o.unix_socket.as_deref(), Some(Path::new("/run/m.sock")));
        let msg = invalid(
            "data_dir: /x\nmetrics_listen: 127.0.0.1:0\nmetrics: {address: 127.0.0.1:1}\nusers: [{access_key_id: a, secret: b}]\n",
        );
        assert!(msg.starts_with("t.yaml: metrics_listen: "), "{msg}");
        let msg = invalid(
            "data_dir: /x\nmetrics: {unix_socket: rel.sock}\nusers: [{access_key_id: a, secret: b}]\n",
        );
        assert!(msg.contains("metrics.unix_socket"), "{msg}");
        let msg = invalid(
            "data_dir: /x\nmetrics: {bearer_token_file: /nonexistent/t}\nusers: [{access_key_id: a, secret: b}]\n",
        );
        assert!(
            msg.contains("metrics.bearer_token_file: cannot read /nonexistent/t"),
            "{msg}"
        );
        assert!(Config::parse("t.yaml", "data_dir: /x\nmetrics: {bogus: 1}\n").is_err());
    }

    #[test]
    fn both_secrets_rejected() {
        let msg =
            invalid("data_dir: /x\nusers: [{access_key_id: a, secret: s, secret_file: /f}]\n");
        assert!(msg.contains("users[0].secret:"), "{msg}");
    }

    #[test]
    fn bad_grant_and_duplicate_rejected() {
        let msg = invalid(
            "data_dir: /x\nusers: [{access_key_id: a, secret: s, buckets: [{name: Bad_Name, access: read}]}]\n",
        );
        assert!(msg.contains("users[0].buckets[0].name:"), "{msg}");
        let msg = invalid(
            "data_dir: /x\nusers: [{access_key_id: a, secret: s}, {access_key_id: a, secret: t}]\n",
        );
        assert!(msg.contains("users[1].access_key_id: duplicate"), "{msg}");
    }

    #[test]
    fn canonical_ids_and_display_names() {
        let id = "ab".repeat(32);
        let c = Config::parse(
            "t.yaml",
            &format!(
                "data_dir: /x\nusers: [{{access_key_id: a, secret: s, canonical_id: {id}, display_name: Ann, create_buckets: true}}, {{access_key_id: b, secret: t}}]\n"
            ),
        )
        .unwrap();
        let users = c.validate("t.yaml").unwrap();
        assert_eq!(
            (
                users[0].canonical_id.as_str(),
                users[0].display_name.as_str()
            ),
            (id.as_str(), "Ann")
        );
        assert!(users[0].create_buckets && !users[1].create_buckets);
        assert_eq!(users[1].canonical_id, default_canonical_id("b"));
        assert!(valid_canonical_id(&users[1].canonical_id));
        // Issue 30 finding 12: the default display name is the canonical
        // id, never the access key id (shown to anonymous readers too).
        assert_eq!(users[1].display_name, users[1].canonical_id);
        for (yaml, field) in [
            (
                "users: [{access_key_id: a, secret: s, canonical_id: ABC}]".to_owned(),
                "users[0].canonical_id: must be 64",
            ),
            (
                format!(
                    "users: [{{access_key_id: a, secret: s, canonical_id: {id}}}, {{access_key_id: b, secret: t, canonical_id: {id}}}]"
                ),
                "users[1].canonical_id: canonical id",
            ),
            (
                format!(
                    "users: [{{access_key_id: a, secret: s, canonical_id: {}}}, {{access_key_id: b, secret: t}}]",
                    default_canonical_id("b")
                ),
                "users[1].canonical_id: canonical id",
            ),
            (
                "users: [{access_key_id: a, secret: s, display_name: \"\"}]".to_owned(),
                "users[0].display_name:",
            ),
        ] {
            let c = Config::parse("t.yaml", &format!("data_dir: /x\n{yaml}\n")).unwrap();
            let msg = c.validate("t.yaml").unwrap_err().to_string();
            assert!(msg.contains(field), "{yaml}: {msg}");
        }
    }

    #[test]
    fn bad_access_value_rejected() {
        let e = Config::parse(
            "t.yaml",
            "data_dir: /x\nusers: [{access_key_id: a, secret: s, buckets: [{name: b, access: all}]}]\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("users[0].buckets[0].access"), "{e}");
    }

    #[test]
    fn grant_names() {
        for ok in ["*", "bob-*", "b*", "my-bucket", "a.b*"] {
            assert!(valid_grant_name(ok), "{ok}");
        }
        for bad in ["**", "-x*", "Bob-*", "a*b", "ab", "x_y*"] {
            assert!(!valid_grant_name(bad), "{bad}");
        }
    }

    #[test]
    fn no_users_rejected() {
        let c = Config::parse("t.yaml", "data_dir: /x\n").unwrap();
        assert!(
            c.validate("t.yaml")
                .unwrap_err()
                .to_string()
                .contains("t.yaml: users:")
        );
    }
}
