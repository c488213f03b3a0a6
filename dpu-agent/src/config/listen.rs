//! `listen:`, the gRPC endpoint host-shims connect to, and its TLS.

use std::net::SocketAddr;
use std::path::PathBuf;

use s3dma_config::{ByteSize, KIB};
use serde::Deserialize;

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
