//! The gateway's sections (`store: s3`): `store`, `upstream:` and
//! `cache:` (with the cache's eviction `policy`).

use std::path::PathBuf;

use s3dma_config::ByteSize;
use serde::{Deserialize, Serialize};

use super::FieldError;

/// Where a storage-target keeps its objects (`store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// Files under `data_dir` (the default).
    #[default]
    Filesystem,
    /// An existing S3 endpoint (`upstream`), with a read cache (`cache`).
    S3,
}

/// The eviction policy of the chunk cache (`cache.policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// S3-FIFO: scan-resistant (the default).
    #[default]
    S3fifo,
    /// Least recently used.
    Lru,
}

/// The `cache:` section (`store: s3`): the read cache in registered memory.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// Memory of the cache, registered with the fabric (bytes, or e.g.
    /// `8GiB`); at least 4 chunks. Default `1GiB`. Allocated when RDMA is
    /// enabled (the cache serves RDMA reads).
    #[serde(default = "default_cache_size")]
    pub size: ByteSize,
    /// Size of one cached chunk, which is also the unit of the gateway's
    /// ranged reads from the upstream; between `64KiB` and `256MiB`.
    /// Default `4MiB`.
    #[serde(default = "default_chunk_size")]
    pub chunk_size: ByteSize,
    /// Which chunk to evict: `s3fifo` (default; keeps chunks that are read
    /// again, such as a checkpoint being fanned out, while one-pass scans
    /// stream through) or `lru`.
    #[serde(default)]
    pub policy: PolicyKind,
    /// For how long, in seconds, the upstream's confirmation that a user may
    /// read an object, and of its current version, is reused for that
    /// user's next reads of it. Default 0: every read is confirmed upstream
    /// (one HEAD). A read that starts more than this after an upstream
    /// overwrite returns the new object.
    #[serde(default)]
    pub revalidate_after: f64,
    /// Chunks after the end of a read fetched ahead into the cache (the
    /// next read of a sequential reader then hits). Default 2; 0 turns it
    /// off. Set 0 on gateways that share a bucket in a dpu-agent target
    /// group: the agent sends the next chunks of an object to the other
    /// gateways, so fetching them here reads them upstream twice.
    #[serde(default = "default_prefetch_chunks")]
    pub prefetch_chunks: u32,
    /// Write-allocate: an RDMA PutObject of at most this many bytes is also
    /// kept in the cache, under the ETag the upstream acknowledged it with,
    /// so the first reads of a checkpoint written once and read by many hit
    /// (every read is still confirmed upstream for its user). Default 0
    /// (off); at most half of `size`. Slots are taken only when free or
    /// evictable at once; otherwise the PUT goes through uncached. Multipart
    /// uploads are not allocated.
    #[serde(default)]
    pub write_allocate_max: ByteSize,
    /// Seconds, on the upstream's clock (its `Date` header), after the end
    /// of an object version's Last-Modified second before which nothing
    /// read of it is cached for later reads. A single-part ETag is an MD5:
    /// a writer with a colliding pair can store a second body with the same
    /// ETag and size in the same second, which no HEAD tells apart. Reads
    /// of a version younger than that wait for it before fetching (at most
    /// `settle_after` + 2 s); write-allocated chunks serve no read at all
    /// unless a version id or a kept SHA-256 pins them (the first read
    /// fetches the chunk from upstream and replaces them). Covers clock differences between the upstream's
    /// endpoints. Default 1; at most 3600.
    #[serde(default = "default_settle_after")]
    pub settle_after: u64,
}

fn default_cache_size() -> ByteSize {
    ByteSize(1 << 30)
}

fn default_chunk_size() -> ByteSize {
    ByteSize(4 << 20)
}

fn default_prefetch_chunks() -> u32 {
    2
}

fn default_settle_after() -> u64 {
    1
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            size: default_cache_size(),
            chunk_size: default_chunk_size(),
            policy: PolicyKind::default(),
            revalidate_after: 0.0,
            prefetch_chunks: default_prefetch_chunks(),
            write_allocate_max: ByteSize(0),
            settle_after: default_settle_after(),
        }
    }
}

impl CacheConfig {
    /// Checks the values; `Err(FieldError::new(field, message))` names the first bad one
    /// (relative to the section).
    ///
    /// # Errors
    /// Sizes out of range, a negative or non-finite `revalidate_after`.
    pub fn check(&self) -> Result<(), FieldError> {
        let chunk = self.chunk_size.0;
        if !(64 << 10..=256 << 20).contains(&chunk) {
            return Err(FieldError::new(
                "chunk_size",
                "must be between 64KiB and 256MiB",
            ));
        }
        if self.size.0 < chunk.saturating_mul(4) {
            return Err(FieldError::new(
                "size",
                format!("must hold at least 4 chunks ({} bytes)", chunk * 4),
            ));
        }
        if !self.revalidate_after.is_finite() || self.revalidate_after < 0.0 {
            return Err(FieldError::new(
                "revalidate_after",
                "must be a number of seconds, 0 or more",
            ));
        }
        if self.prefetch_chunks > 64 {
            return Err(FieldError::new("prefetch_chunks", "must be at most 64"));
        }
        if self.settle_after > 3600 {
            return Err(FieldError::new("settle_after", "must be at most 3600"));
        }
        if self.write_allocate_max.0 > self.size.0 / 2 {
            return Err(FieldError::new(
                "write_allocate_max",
                format!("must be at most half of size ({} bytes)", self.size.0 / 2),
            ));
        }
        Ok(())
    }

    /// How many chunks the cache holds.
    pub(crate) fn slots(&self) -> usize {
        usize::try_from(self.size.0 / self.chunk_size.0).unwrap_or(usize::MAX)
    }
}

/// The `upstream:` section (`store: s3`): the S3 endpoint the gateway
/// stands in front of.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// The upstream's S3 endpoint URLs (`http://HOST:PORT` or
    /// `https://HOST:PORT`, e.g. the radosgw instances of one Ceph cluster).
    /// At least one; all must serve the same data.
    pub endpoints: Vec<String>,
    /// The region the upstream verifies signatures for. Default: this
    /// server's `region`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// A PEM file with the CA certificate(s) that sign the upstream's TLS
    /// certificate, for `https` endpoints with a private CA. Default: the
    /// web PKI roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Connect timeout per upstream connection, in milliseconds. Default
    /// 3000.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Longest wait for any read from the upstream (response head or the
    /// next body bytes), in milliseconds. Default 30000.
    #[serde(default = "default_read_timeout_ms")]
    pub read_timeout_ms: u64,
    /// Attempts per request for errors the SDK retries (throttling, 5xx,
    /// dropped connections), per endpoint. Default 3; at least 1.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
}

fn default_connect_timeout_ms() -> u64 {
    3000
}

fn default_read_timeout_ms() -> u64 {
    30_000
}

fn default_max_attempts() -> u32 {
    3
}

impl UpstreamConfig {
    /// A section with one endpoint and every default.
    #[must_use]
    pub fn new(endpoint: impl Into<String>) -> Self {
        UpstreamConfig {
            endpoints: vec![endpoint.into()],
            region: None,
            ca_file: None,
            connect_timeout_ms: default_connect_timeout_ms(),
            read_timeout_ms: default_read_timeout_ms(),
            max_attempts: default_max_attempts(),
        }
    }

    /// Checks the values; `Err(FieldError::new(field, message))` names the first bad one
    /// (relative to the section).
    ///
    /// # Errors
    /// No endpoint, a malformed endpoint URL, a zero timeout or attempt count.
    pub fn check(&self) -> Result<(), FieldError> {
        if self.endpoints.is_empty() {
            return Err(FieldError::new(
                "endpoints",
                "at least one endpoint is required",
            ));
        }
        for (i, e) in self.endpoints.iter().enumerate() {
            s3dma_config::check_endpoint_url(e)
                .map_err(|m| FieldError::new(format!("endpoints[{i}]"), m.to_string()))?;
        }
        if self.region.as_deref() == Some("") {
            return Err(FieldError::new("region", "must not be empty"));
        }
        if self.connect_timeout_ms == 0 {
            return Err(FieldError::new("connect_timeout_ms", "must be at least 1"));
        }
        if self.read_timeout_ms == 0 {
            return Err(FieldError::new("read_timeout_ms", "must be at least 1"));
        }
        if self.max_attempts == 0 {
            return Err(FieldError::new("max_attempts", "must be at least 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_config_checks() {
        let ok = CacheConfig::default();
        assert!(ok.check().is_ok());
        assert_eq!(ok.slots(), 256);
        let mut c = ok.clone();
        c.chunk_size = ByteSize(1024);
        assert_eq!(c.check().unwrap_err().field, "chunk_size");
        let mut c = ok.clone();
        c.size = ByteSize(3 * (4 << 20));
        assert_eq!(c.check().unwrap_err().field, "size");
        let mut c = ok.clone();
        c.revalidate_after = -1.0;
        assert_eq!(c.check().unwrap_err().field, "revalidate_after");
        c.revalidate_after = f64::NAN;
        assert_eq!(c.check().unwrap_err().field, "revalidate_after");
        let mut c = ok.clone();
        c.prefetch_chunks = 65;
        assert_eq!(c.check().unwrap_err().field, "prefetch_chunks");
        let mut c = ok.clone();
        assert_eq!(c.settle_after, 1);
        c.settle_after = 3601;
        assert_eq!(c.check().unwrap_err().field, "settle_after");
        let mut c = ok;
        c.write_allocate_max = ByteSize(c.size.0 / 2);
        assert!(c.check().is_ok());
        c.write_allocate_max = ByteSize(c.size.0 / 2 + 1);
        assert_eq!(c.check().unwrap_err().field, "write_allocate_max");
    }

    #[test]
    fn upstream_config_checks() {
        let ok = UpstreamConfig::new("http://127.0.0.1:7480");
        assert!(ok.check().is_ok());
        let mut c = ok.clone();
        c.endpoints.clear();
        assert_eq!(c.check().unwrap_err().field, "endpoints");
        let mut c = ok.clone();
        c.endpoints.push("ftp://x:1".into());
        assert_eq!(c.check().unwrap_err().field, "endpoints[1]");
        let mut c = ok.clone();
        c.read_timeout_ms = 0;
        assert_eq!(c.check().unwrap_err().field, "read_timeout_ms");
        let mut c = ok;
        c.region = Some(String::new());
        assert_eq!(c.check().unwrap_err().field, "region");
    }
}
