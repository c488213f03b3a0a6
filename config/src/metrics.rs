//! `metrics:`, where a service serves its Prometheus endpoint.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `metrics:` — where and how `GET /metrics` is served, the same section in
/// every service's file. Omitted: no metrics are served.
///
/// Metric labels name tenants, users, shims or targets and show their
/// traffic, which other local users need not read: keep the TCP address on
/// loopback, or use the Unix socket (mode 0600, peers of another uid
/// refused), and/or require a bearer token.
///
/// Each service adds its own rules when it validates the section (the
/// dpu-agent: `address` differs from `listen.address`, a token needs a
/// listener and is at least 16 characters; storage-target: `unix_socket`
/// is absolute, `address` excludes the older `metrics_listen`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// TCP listen address of the endpoint, e.g. `127.0.0.1:9102` (port 0
    /// picks a free port). Default: none (no TCP listener). Keep it on
    /// loopback unless a bearer token is required.
    #[serde(default = "default_address")]
    pub address: Option<SocketAddr>,
    /// Unix socket to serve the endpoint on as well (or instead), created
    /// mode 0600 in a directory the service's user owns (a stale socket
    /// file there is replaced; any other file is an error); only peers
    /// running as the service's user or as root are served (checked with
    /// `SO_PEERCRED`). Default: none.
    #[serde(default = "default_unix_socket")]
    pub unix_socket: Option<PathBuf>,
    /// File holding a bearer token (mode 0600 or stricter; surrounding
    /// whitespace trimmed): every scrape, on TCP and on the socket, must
    /// then send `Authorization: Bearer <token>`; anything else gets 401
    /// and no metric. Default: none (no token required).
    #[serde(default = "default_bearer_token_file")]
    pub bearer_token_file: Option<PathBuf>,
}

fn default_address() -> Option<SocketAddr> {
    None
}

fn default_unix_socket() -> Option<PathBuf> {
    None
}

fn default_bearer_token_file() -> Option<PathBuf> {
    None
}

impl MetricsConfig {
    /// Whether the section serves anything (a TCP address or a Unix socket).
    #[must_use]
    pub fn serves(&self) -> bool {
        self.address.is_some() || self.unix_socket.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_fields_default_to_none() {
        let m: MetricsConfig = serde_yaml::from_str("{}").unwrap();
        assert_eq!(m, MetricsConfig::default());
        assert_eq!(m.address, None);
        assert_eq!(m.unix_socket, None);
        assert_eq!(m.bearer_token_file, None);
        assert!(!m.serves());
    }

    #[test]
    fn every_key_parses_and_unknown_keys_are_refused() {
        let m: MetricsConfig = serde_yaml::from_str(
            "address: 127.0.0.1:9102\nunix_socket: /run/m.sock\nbearer_token_file: /etc/t\n",
        )
        .unwrap();
        assert_eq!(m.address, Some("127.0.0.1:9102".parse().unwrap()));
        assert_eq!(m.unix_socket, Some(PathBuf::from("/run/m.sock")));
        assert_eq!(m.bearer_token_file, Some(PathBuf::from("/etc/t")));
        assert!(m.serves());
        assert!(serde_yaml::from_str::<MetricsConfig>("listen: 127.0.0.1:1").is_err());
    }
}
