//! [`Upstream`]: the S3 endpoint a local stack's gateways stand in front
//! of (a leaf: the stack and the configuration writers both use it).

/// An existing S3 endpoint for the local stack to stand in front of, and
/// who the tenant is there. `Debug` does not show the secret.
#[derive(Clone)]
pub struct Upstream {
    /// The S3 endpoint URL, `http(s)://HOST:PORT`.
    pub endpoint: String,
    /// Its region (default: the stack's, `us-east-1`).
    pub region: Option<String>,
    /// The tenant's access key id there.
    pub access_key_id: String,
    /// The tenant's secret access key there.
    pub secret_access_key: String,
    /// How many gateways (storage-targets) stand in front of it; the agent
    /// spreads each object's chunks over them by rendezvous hashing, so
    /// each caches a distinct share. At least 1.
    pub gateways: usize,
    /// Each gateway's read cache, in bytes (registered memory).
    pub cache_bytes: u64,
}

impl Upstream {
    /// Gateways per stack by default.
    pub const DEFAULT_GATEWAYS: usize = 1;
    /// Cache per gateway by default: 256 MiB.
    pub const DEFAULT_CACHE_BYTES: u64 = 256 << 20;
    /// The most gateways a local stack starts.
    pub const MAX_GATEWAYS: usize = 16;
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("gateways", &self.gateways)
            .field("cache_bytes", &self.cache_bytes)
            .finish_non_exhaustive()
    }
}
