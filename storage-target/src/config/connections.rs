//! The `connections:` section: how the `max_connections` slots of the S3
//! port are shared, so that no one client (one address, one S3 user, or
//! requests that trickle) holds the port closed to everyone else, and the
//! dpu-agents keep slots of their own.

use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::networks::Cidr;

use super::FieldError;

/// The `connections:` section: shares of the S3 port's `max_connections`.
///
/// A connection is *evictable* (closed, longest idle first, when a new
/// connection needs its slot) while no request is in progress on it, or
/// while its request trickles: fewer than `min_transfer_rate` bytes a
/// second moved over the connection, in either direction, during a whole
/// `transfer_rate_window`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionsConfig {
    /// Most connections open at a time from one client IP address (the
    /// agents' addresses, `agent_networks`, excepted). At the share, a new
    /// connection from that address closes the address's own evictable
    /// connection idle longest, or is closed at once when there is none.
    /// Default 256; at least 1.
    #[serde(default = "default_per_address")]
    pub per_address: usize,
    /// Most requests in progress at a time for one S3 user (counted once
    /// the request is authenticated, by access key; anonymous callers
    /// together are one user; requests from `agent_networks` are not
    /// counted). A request beyond the share is answered `503 SlowDown` and
    /// its connection closed. Default 256; at least 1.
    #[serde(default = "default_per_user")]
    pub per_user: usize,
    /// Least transfer rate of a request in progress (bytes a second, or
    /// e.g. `16KiB`): a request that moves less over its connection, both
    /// directions together, during a whole `transfer_rate_window` counts as
    /// idle (its connection is evictable) until it moves more. `0` turns
    /// the check off. Default `16KiB`.
    #[serde(default = "default_min_transfer_rate")]
    pub min_transfer_rate: s3dma_config::ByteSize,
    /// The window, in seconds, over which `min_transfer_rate` is measured.
    /// Default 10; between 0.1 and 3600.
    #[serde(default = "default_transfer_rate_window")]
    pub transfer_rate_window: f64,
    /// The dpu-agents' addresses or networks (CIDR, e.g. `10.0.0.0/24` or
    /// `192.0.2.7`): connections from them hold the `agent_reserved`
    /// slots, which no other client may take, and are exempt from
    /// `per_address` and `per_user` (an agent pools many connections from
    /// one address and signs for many tenants). Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_networks: Vec<Cidr>,
    /// Slots of `max_connections` only connections from `agent_networks`
    /// may hold (they may hold the others too): other clients together
    /// hold at most `max_connections - agent_reserved`. Used only when
    /// `agent_networks` is set; then less than `max_connections`. Default
    /// 64.
    #[serde(default = "default_agent_reserved")]
    pub agent_reserved: usize,
}

fn default_per_address() -> usize {
    256
}

fn default_per_user() -> usize {
    256
}

fn default_min_transfer_rate() -> s3dma_config::ByteSize {
    s3dma_config::ByteSize(16 << 10)
}

fn default_transfer_rate_window() -> f64 {
    10.0
}

fn default_agent_reserved() -> usize {
    64
}

impl Default for ConnectionsConfig {
    fn default() -> Self {
        ConnectionsConfig {
            per_address: default_per_address(),
            per_user: default_per_user(),
            min_transfer_rate: default_min_transfer_rate(),
            transfer_rate_window: default_transfer_rate_window(),
            agent_networks: Vec::new(),
            agent_reserved: default_agent_reserved(),
        }
    }
}

impl ConnectionsConfig {
    /// Checks the values against `max_connections`; `Err(FieldError::new(field,
    /// message))` names the first bad one (relative to the section).
    ///
    /// # Errors
    /// A share of 0, a window out of range, a reserve not below
    /// `max_connections` while `agent_networks` is set.
    pub fn check(&self, max_connections: usize) -> Result<(), FieldError> {
        if self.per_address == 0 {
            return Err(FieldError::new("per_address", "must be at least 1"));
        }
        if self.per_user == 0 {
            return Err(FieldError::new("per_user", "must be at least 1"));
        }
        if !(0.1..=3600.0).contains(&self.transfer_rate_window) {
            return Err(FieldError::new(
                "transfer_rate_window",
                format!(
                    "must be between 0.1 and 3600 seconds, got {}",
                    self.transfer_rate_window
                ),
            ));
        }
        if !self.agent_networks.is_empty() && self.agent_reserved >= max_connections {
            return Err(FieldError::new(
                "agent_reserved",
                format!(
                    "must be less than max_connections ({max_connections}) when agent_networks is set, got {}",
                    self.agent_reserved
                ),
            ));
        }
        Ok(())
    }

    /// The window of `min_transfer_rate`.
    #[must_use]
    pub fn window(&self) -> Duration {
        Duration::try_from_secs_f64(self.transfer_rate_window)
            .unwrap_or(Duration::from_secs(10))
            .max(Duration::from_millis(100))
    }

    /// Whether `ip` is an agent's (inside one of `agent_networks`).
    #[must_use]
    pub fn is_agent(&self, ip: IpAddr) -> bool {
        self.agent_networks.iter().any(|n| n.contains(ip))
    }

    /// The reserved slots in effect: `agent_reserved` when
    /// `agent_networks` is set, else 0.
    #[must_use]
    pub fn reserved(&self) -> usize {
        if self.agent_networks.is_empty() {
            0
        } else {
            self.agent_reserved
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_checks() {
        let d = ConnectionsConfig::default();
        assert!(d.check(1024).is_ok());
        assert_eq!(d.window(), Duration::from_secs(10));
        assert_eq!(d.reserved(), 0, "no agents, no reserve");
        assert!(d.check(16).is_ok(), "the reserve is unused without agents");
        let agents = ConnectionsConfig {
            agent_networks: vec!["10.0.0.0/24".parse().unwrap()],
            ..ConnectionsConfig::default()
        };
        assert_eq!(agents.reserved(), 64);
        assert!(agents.is_agent("10.0.0.7".parse().unwrap()));
        assert!(agents.is_agent("::ffff:10.0.0.7".parse().unwrap()));
        assert!(!agents.is_agent("10.0.1.7".parse().unwrap()));
        assert_eq!(agents.check(64).unwrap_err().field, "agent_reserved");
        for (bad, field) in [
            (
                ConnectionsConfig {
                    per_address: 0,
                    ..ConnectionsConfig::default()
                },
                "per_address",
            ),
            (
                ConnectionsConfig {
                    per_user: 0,
                    ..ConnectionsConfig::default()
                },
                "per_user",
            ),
            (
                ConnectionsConfig {
                    transfer_rate_window: 0.0,
                    ..ConnectionsConfig::default()
                },
                "transfer_rate_window",
            ),
            (
                ConnectionsConfig {
                    transfer_rate_window: f64::NAN,
                    ..ConnectionsConfig::default()
                },
                "transfer_rate_window",
            ),
        ] {
            assert_eq!(bad.check(1024).unwrap_err().field, field, "{bad:?}");
        }
        let y: ConnectionsConfig = serde_yaml::from_str(
            "{per_address: 4, min_transfer_rate: 1KiB, agent_networks: [127.0.0.9]}",
        )
        .unwrap();
        assert_eq!(
            (y.per_address, y.min_transfer_rate.0, y.per_user),
            (4, 1024, 256)
        );
    }
}
