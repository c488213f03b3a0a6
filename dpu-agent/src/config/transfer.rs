//! `transfer:`, how requests are split into chunks and parts, retried and
//! timed out.

use s3dma_config::{ByteSize, MIB};
use serde::Deserialize;

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
    /// Most bytes one batch moves: the sum of its windows' sizes (GetObjects:
    /// destinations, PutObjects: sources); a larger batch is refused with
    /// `INVALID_ARGUMENT` before any item runs. Default 4GiB; 1MiB..=1TiB.
    #[serde(default = "default_max_batch_bytes")]
    pub max_batch_bytes: ByteSize,
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
            max_batch_bytes: default_max_batch_bytes(),
        }
    }
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

fn default_max_batch_bytes() -> ByteSize {
    ByteSize(4 * 1024 * MIB)
}

fn default_max_batch_items() -> usize {
    1024
}
