//! `rdma.hipobj:`, the hipobj-rc-v2 server's limits.

use s3dma_config::{ByteSize, ConfigError};
use serde::Deserialize;

/// `rdma.hipobj:` — AMD's hipobj-rc-v2 dialect (`POST /.hipobj-rc/…`),
/// served with `rdma.mode: enabled` on the `verbs` backend with a device;
/// otherwise its requests answer `501` with
/// `x-amz-rdma-protocol-status: unsupported`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct HipobjConfig {
    /// Whether the control requests are served (when RDMA can be). Default
    /// `true`.
    #[serde(default = "default_enabled")]
    pub enabled: bool,
    /// Most sessions prepared or running at once (each holds a queue pair
    /// and its staging memory); past it PREPARE answers `501` with
    /// `x-amz-rdma-protocol-status: unsupported`, so that clients move the
    /// bytes over HTTP instead. Default 64; 1 to 4096.
    #[serde(default = "default_max_sessions")]
    pub max_sessions: usize,
    /// Most sessions one S3 user holds at once; past it `503` (retry
    /// later: the user's own sessions hold the slots). Default 16; at
    /// least 1, at most `max_sessions`.
    #[serde(default = "default_max_sessions_per_user")]
    pub max_sessions_per_user: usize,
    /// Most sessions all users not listed in `rdma.tenant_users` hold
    /// together (the shared class, as in the s3dma staging pool), so that
    /// the rest of `max_sessions` stays for the tenants' users; past it a
    /// shared-class user's PREPARE answers `501` with
    /// `x-amz-rdma-protocol-status: unsupported` (the client falls back to
    /// HTTP). Default: half of `max_sessions`, rounded down, at least 1
    /// (32 with the defaults); at least 1, at most `max_sessions` (equal:
    /// no reserve).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_shared_sessions: Option<usize>,
    /// Registered staging memory all sessions hold together (each holds
    /// its transfer's size, at most 2^31 - 1 bytes); past it `501` with
    /// the unsupported marker (HTTP fallback). Default `4GiB`; between
    /// `1MiB` and `64GiB`.
    #[serde(default = "default_max_staging_bytes")]
    pub max_staging_bytes: ByteSize,
    /// Registered staging memory one S3 user's sessions hold together;
    /// past it `503`. Default `2GiB`; at least `1MiB`, at most
    /// `max_staging_bytes`.
    #[serde(default = "default_max_staging_bytes_per_user")]
    pub max_staging_bytes_per_user: ByteSize,
    /// Registered staging memory the sessions of all users not listed in
    /// `rdma.tenant_users` hold together (the shared class); past it `501`
    /// with the unsupported marker (HTTP fallback). Default: half of
    /// `max_staging_bytes`, at least `1MiB` (`2GiB` with the defaults); at
    /// least `1MiB`, at most `max_staging_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_shared_staging_bytes: Option<ByteSize>,
    /// Seconds a prepared session waits for its READY before it is reaped
    /// (its queue pair destroyed, its memory freed). Default 10; 1 to 600.
    #[serde(default = "default_prepared_timeout_secs")]
    pub prepared_timeout_secs: u64,
    /// Seconds a READY's data phase may take: a PUT's WRITE that has not
    /// arrived, or a GET's WRITE not completed, by then answers `408`.
    /// Default 60; 1 to 3600.
    #[serde(default = "default_transfer_timeout_secs")]
    pub transfer_timeout_secs: u64,
    /// The path MTU of the sessions' queue pairs, in bytes (256, 512,
    /// 1024, 2048 or 4096): they use the lower of it and the port's active
    /// MTU. Default: none (the port's active MTU). The dialect's peers do
    /// not tell each other their MTU, and a WRITE of more than one packet
    /// between two different MTUs fails: for clients on emulated NICs
    /// (Soft-RoCE and others often report 1024) set it to theirs, or set
    /// theirs to this server's.
    #[serde(default = "default_path_mtu", skip_serializing_if = "Option::is_none")]
    pub path_mtu: Option<fabric::config::PathMtu>,
    /// `rdma.tenant_users`, copied here by [`HipobjConfig::with_tenants`]
    /// when the server is built (not a field of this section).
    #[serde(skip)]
    pub tenant_users: Vec<String>,
}

impl Default for HipobjConfig {
    fn default() -> Self {
        HipobjConfig {
            enabled: default_enabled(),
            max_sessions: default_max_sessions(),
            max_sessions_per_user: default_max_sessions_per_user(),
            max_shared_sessions: None,
            max_staging_bytes: default_max_staging_bytes(),
            max_staging_bytes_per_user: default_max_staging_bytes_per_user(),
            max_shared_staging_bytes: None,
            prepared_timeout_secs: default_prepared_timeout_secs(),
            transfer_timeout_secs: default_transfer_timeout_secs(),
            path_mtu: default_path_mtu(),
            tenant_users: Vec::new(),
        }
    }
}

fn default_enabled() -> bool {
    true
}
fn default_max_sessions() -> usize {
    64
}
fn default_max_sessions_per_user() -> usize {
    16
}
fn default_max_staging_bytes() -> ByteSize {
    ByteSize(4 << 30)
}
fn default_max_staging_bytes_per_user() -> ByteSize {
    ByteSize(2 << 30)
}
fn default_prepared_timeout_secs() -> u64 {
    10
}
fn default_transfer_timeout_secs() -> u64 {
    60
}
fn default_path_mtu() -> Option<fabric::config::PathMtu> {
    None
}

impl HipobjConfig {
    /// This section with `rdma.tenant_users` (the users outside the shared
    /// class).
    #[must_use]
    pub fn with_tenants(&self, tenant_users: &[String]) -> HipobjConfig {
        HipobjConfig {
            tenant_users: tenant_users.to_vec(),
            ..self.clone()
        }
    }

    /// The shared class's session cap (`max_shared_sessions` or its
    /// default, half of `max_sessions`).
    #[must_use]
    pub fn shared_sessions(&self) -> usize {
        self.max_shared_sessions
            .unwrap_or((self.max_sessions / 2).max(1))
    }

    /// The shared class's staging cap in bytes (`max_shared_staging_bytes`
    /// or its default, half of `max_staging_bytes`, at least 1 MiB).
    #[must_use]
    pub fn shared_staging_bytes(&self) -> u64 {
        self.max_shared_staging_bytes
            .map_or((self.max_staging_bytes.0 / 2).max(1 << 20), |b| b.0)
    }

    /// Checks the ranges above.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the field.
    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let bad = |f: &str, m: &str| {
            Err(ConfigError::invalid(
                file,
                format!("rdma.hipobj.{f}"),
                m.to_owned(),
            ))
        };
        if !(1..=4096).contains(&self.max_sessions) {
            return bad("max_sessions", "must be between 1 and 4096");
        }
        if self.max_sessions_per_user == 0 || self.max_sessions_per_user > self.max_sessions {
            return bad(
                "max_sessions_per_user",
                "must be at least 1 and at most max_sessions",
            );
        }
        if self.shared_sessions() == 0 || self.shared_sessions() > self.max_sessions {
            return bad(
                "max_shared_sessions",
                "must be at least 1 and at most max_sessions",
            );
        }
        if !(1 << 20..=64 << 30).contains(&self.max_staging_bytes.0) {
            return bad("max_staging_bytes", "must be between 1MiB and 64GiB");
        }
        if self.shared_staging_bytes() < 1 << 20
            || self.shared_staging_bytes() > self.max_staging_bytes.0
        {
            return bad(
                "max_shared_staging_bytes",
                "must be at least 1MiB and at most max_staging_bytes",
            );
        }
        if self.max_staging_bytes_per_user.0 < 1 << 20
            || self.max_staging_bytes_per_user.0 > self.max_staging_bytes.0
        {
            return bad(
                "max_staging_bytes_per_user",
                "must be at least 1MiB and at most max_staging_bytes",
            );
        }
        if !(1..=600).contains(&self.prepared_timeout_secs) {
            return bad("prepared_timeout_secs", "must be between 1 and 600");
        }
        if !(1..=3600).contains(&self.transfer_timeout_secs) {
            return bad("transfer_timeout_secs", "must be between 1 and 3600");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_ranges() {
        let c = HipobjConfig::default();
        assert!(c.validate("t").is_ok());
        assert_eq!(c.shared_sessions(), 32);
        assert_eq!(c.shared_staging_bytes(), 2 << 30);
        let c: HipobjConfig =
            serde_yaml::from_str("max_sessions: 1\nmax_sessions_per_user: 1\n").unwrap();
        assert_eq!(c.shared_sessions(), 1);
        assert!(c.validate("t").is_ok());
        let c: HipobjConfig =
            serde_yaml::from_str("max_staging_bytes: 1GiB\nmax_staging_bytes_per_user: 2GiB\n")
                .unwrap();
        let e = c.validate("t").unwrap_err().to_string();
        assert!(e.contains("rdma.hipobj.max_staging_bytes_per_user"), "{e}");
        for bad in [
            "max_sessions: 0",
            "max_sessions_per_user: 100",
            "prepared_timeout_secs: 0",
            "transfer_timeout_secs: 4000",
            "max_staging_bytes: 1KiB",
            "max_shared_sessions: 0",
            "max_shared_sessions: 65",
            "max_shared_staging_bytes: 5GiB",
        ] {
            let c: HipobjConfig = serde_yaml::from_str(bad).unwrap();
            assert!(c.validate("t").is_err(), "{bad}");
        }
        assert!(serde_yaml::from_str::<HipobjConfig>("bogus: 1").is_err());
    }

    #[test]
    fn path_mtu() {
        assert_eq!(HipobjConfig::default().path_mtu, None);
        let c: HipobjConfig = serde_yaml::from_str("path_mtu: 1024").unwrap();
        assert_eq!(c.path_mtu.map(fabric::config::PathMtu::bytes), Some(1024));
        for bad in ["path_mtu: 1500", "path_mtu: 0", "path_mtu: 1KiB"] {
            let e = serde_yaml::from_str::<HipobjConfig>(bad).unwrap_err();
            assert!(e.to_string().contains("path_mtu"), "{bad}: {e}");
        }
    }
}
