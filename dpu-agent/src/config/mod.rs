//! The dpu-agent YAML configuration file (`dpu-agent --config <file.yaml>`).
//!
//! The structs below are the operator reference: every field is documented
//! with its unit, default and bounds, and `dpu-agent.example.yaml` is a
//! complete, tested example. Unknown fields are rejected everywhere.
//!
//! * [`parse`] parses and validates the text without touching any other file
//!   (used by tests and by `load`).
//! * [`load`] reads the file, parses and validates it, reads the secret files
//!   (tenant secret access keys, shim bearer tokens, the fabric key) and checks
//!   that the TLS and CA files it names can be opened.
//!
//! Errors read `<file>: <field path>: <what is wrong>`, e.g.
//! `/etc/s3dma/agent.yaml: tenants[1].quotas.max_concurrent_requests: must be at least 1`;
//! YAML syntax, type and unknown-field errors read `<file>: <serde_yaml message>`
//! (which names the field, the line and the column).
//!
//! Secrets are held in [`Secret`] (tenant secret access keys, shim tokens)
//! and [`fabric::FabricKey`] (the fabric key), whose `Debug` never shows them;
//! no error message ever contains a secret. Sizes are [`ByteSize`]s and the
//! fabric key file is read by [`fabric::config`], as storage-target does, so
//! both programs accept the same forms ([`s3dma_config`] holds the shared
//! pieces: sizes, secrets, the `metrics:` and `runtime:` sections and the
//! field checks). Relative paths in the file are relative to the agent's
//! working directory.
//!
//! One module per section of the file: `listen` ([`ListenConfig`],
//! [`TlsConfig`]), `tenants` ([`ShimConfig`], [`TenantConfig`], [`Grant`],
//! [`Quotas`]), `targets` ([`TargetConfig`]), `fabric_section` ([`FabricConfig`]),
//! `transfer` ([`TransferConfig`]); `validate` holds the rules
//! ([`Config::validate`]) and `load` the loaded form ([`LoadedConfig`]).

use std::path::Path;

use serde::Deserialize;

/// Sizes in the file (`4MiB`, `512KiB`, `65536`): see [`s3dma_config::parse_size`].
pub use s3dma_config::ByteSize;
pub use s3dma_config::ConfigError;
/// `metrics:` — the Prometheus endpoint (`GET /metrics`), shared with the
/// other services. Its labels name tenants, shims and targets and show
/// their traffic: keep it to the operator with a loopback address,
/// `unix_socket` or `bearer_token_file`. The agent also requires `address`
/// to differ from `listen.address`, and a bearer token of at least 16
/// printable ASCII characters that protects a listener.
pub use s3dma_config::MetricsConfig;
/// A secret read from a file (tenant secret keys, shim tokens): see
/// [`s3dma_config::Secret`].
pub use s3dma_config::Secret;

mod fabric_section;
mod listen;
mod load;
mod targets;
mod tenants;
mod transfer;
mod validate;

#[cfg(test)]
mod fixtures;

pub use fabric_section::FabricConfig;
pub use listen::{ListenConfig, TlsConfig};
pub use load::{LoadedConfig, LoadedShim, LoadedTenant, load};
pub use targets::{MultipartParts, RdmaProtocol, TargetConfig, UnknownProtocol};
pub use tenants::{Grant, Quotas, ShimConfig, TenantConfig};
pub use transfer::TransferConfig;

/// The whole configuration file, as parsed.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where host-shims reach the agent's gRPC API, and how it is secured.
    pub listen: ListenConfig,
    /// The host-shims allowed to connect, how each authenticates, and which
    /// tenants each may act for. At least one.
    pub shims: Vec<ShimConfig>,
    /// The tenants: S3 credentials, grants and quotas. At least one.
    pub tenants: Vec<TenantConfig>,
    /// The S3 endpoints (storage targets) and the buckets each serves. At least one.
    pub targets: Vec<TargetConfig>,
    /// The RDMA fabric: backend, key and staging memory.
    pub fabric: FabricConfig,
    /// How requests are split into chunks and parts, retried and timed out.
    /// Optional; every field has a default.
    #[serde(default)]
    pub transfer: TransferConfig,
    /// The Prometheus endpoint. Optional; off by default.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// The async runtime: `worker_threads` (optional; default one per CPU).
    #[serde(default)]
    pub runtime: s3dma_config::RuntimeConfig,
}

impl Config {
    /// The first target serving `bucket` (see [`Config::targets_for`]).
    #[must_use]
    pub fn target_for(&self, bucket: &str) -> Option<&TargetConfig> {
        self.targets_for(bucket).into_iter().next()
    }

    /// The targets serving `bucket`: those that list the name exactly,
    /// otherwise those listing `"*"` (one target, or a group), in
    /// configuration order.
    #[must_use]
    pub fn targets_for(&self, bucket: &str) -> Vec<&TargetConfig> {
        let listing = |name: &str| -> Vec<&TargetConfig> {
            self.targets
                .iter()
                .filter(|t| t.buckets.iter().any(|b| b == name))
                .collect()
        };
        let exact = listing(bucket);
        if exact.is_empty() {
            listing("*")
        } else {
            exact
        }
    }
}

/// Parses and validates configuration text without reading any other file;
/// `path` names the file in errors.
///
/// # Errors
/// [`ConfigError::Parse`] for malformed YAML, unknown fields or wrong types;
/// [`ConfigError::Invalid`] for the first invalid field.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let config: Config = serde_yaml::from_str(text).map_err(|e| ConfigError::Parse {
        file: path.display().to_string(),
        message: e.to_string(),
    })?;
    config.validate(path)?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use fabric::Backend;

    use super::fabric_section::{default_staging_buffer_size, default_staging_buffers};
    use super::fixtures::{BASE, base, p, parse_err};
    use super::*;

    const EXAMPLE: &str = include_str!("../../dpu-agent.example.yaml");

    #[test]
    fn example_parses_and_validates() {
        let c = parse(Path::new("dpu-agent.example.yaml"), EXAMPLE).unwrap();
        assert_eq!(c.listen.address, "127.0.0.1:7000".parse().unwrap());
        assert!(c.listen.tls.is_none());
        assert_eq!(c.shims.len(), 1);
        assert_eq!(c.shims[0].tenants, ["alice", "bob"]);
        assert_eq!(c.tenants.len(), 2);
        let alice = &c.tenants[0];
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.allow[0].bucket, "alice-data");
        assert!(alice.allow[0].read && alice.allow[0].write);
        let bob = &c.tenants[1];
        assert_eq!(bob.allow[0].bucket, "shared");
        assert_eq!(bob.allow[0].prefix, "datasets/");
        assert!(bob.allow[0].read && !bob.allow[0].write);
        assert_eq!(c.targets.len(), 1);
        assert_eq!(c.targets[0].endpoint, "http://127.0.0.1:9000");
        assert!(c.targets[0].rdma);
        assert_eq!(c.target_for("anything").unwrap().name, c.targets[0].name);
        assert_eq!(c.fabric.backend, Backend::Tcp);
        // The transfer section spells out the defaults.
        assert_eq!(c.transfer, TransferConfig::default());
        assert_eq!(c.fabric.staging_buffers, default_staging_buffers());
        assert_eq!(c.fabric.staging_buffer_size, default_staging_buffer_size());
        assert_eq!(c.metrics.address, Some("127.0.0.1:9102".parse().unwrap()));
    }

    /// Uncomments the example's optional settings: lines whose `#` is directly
    /// followed by YAML (`#tls:`, `#  cert_file: ...`, `#- name: ...`), as
    /// opposed to prose (`# text`, exactly one space after `#`).
    fn uncomment(text: &str) -> String {
        let mut out = String::new();
        for line in text.lines() {
            let trimmed = line.trim_start();
            let indent = &line[..line.len() - trimmed.len()];
            match trimmed.strip_prefix('#') {
                Some(rest)
                    if !rest.trim().is_empty()
                        && !rest.starts_with('#')
                        && (!rest.starts_with(' ') || rest.starts_with("  ")) =>
                {
                    out.push_str(indent);
                    out.push_str(rest);
                }
                _ => out.push_str(line),
            }
            out.push('\n');
        }
        out
    }

    #[test]
    fn example_optional_blocks_also_validate() {
        // Enabling the commented TLS block, the mTLS shim, the hipobj-rc-v2
        // target and the plain-S3 target must give a valid file too.
        let text = uncomment(EXAMPLE);
        let c = parse(Path::new("uncommented.yaml"), &text).unwrap();
        let tls = c.listen.tls.as_ref().unwrap();
        assert_eq!(tls.client_ca_file, Path::new("/etc/s3dma/shim-ca.pem"));
        assert_eq!(c.shims.len(), 2);
        assert_eq!(
            c.shims[1].tls_name.as_deref(),
            Some("host2.example.internal")
        );
        assert_eq!(c.targets.len(), 3);
        let hipobj = &c.targets[1];
        assert_eq!(hipobj.protocol, RdmaProtocol::HipobjRcV2);
        assert_eq!(c.target_for("models").unwrap().name, hipobj.name);
        assert!(!c.targets[2].rdma);
        assert_eq!(c.target_for("archive").unwrap().name, c.targets[2].name);
        assert_eq!(c.target_for("other").unwrap().name, c.targets[0].name);
    }

    #[test]
    fn defaults() {
        let c = base();
        assert_eq!(c.transfer, TransferConfig::default());
        assert_eq!(c.transfer.chunk_size, ByteSize(8 << 20));
        assert_eq!(c.transfer.max_chunks_in_flight, 8);
        assert_eq!(c.transfer.multipart_threshold, ByteSize(64 << 20));
        assert_eq!(c.transfer.part_size, ByteSize(16 << 20));
        assert_eq!(c.transfer.retries, 4);
        assert_eq!(c.transfer.backoff_initial_ms, 50);
        assert_eq!(c.transfer.backoff_max_ms, 2000);
        assert_eq!(c.transfer.request_timeout_secs, 300);
        assert_eq!(c.transfer.attempt_timeout_secs, 60);
        assert_eq!(c.transfer.connect_timeout_ms, 3000);
        assert_eq!(c.transfer.batch_concurrency, 16);
        assert_eq!(c.metrics, MetricsConfig::default());
        assert_eq!(c.metrics.address, None);
        let q = &c.tenants[0].quotas;
        assert_eq!(*q, Quotas::default());
        assert_eq!(q.max_concurrent_requests, 64);
        assert_eq!(q.max_queued_requests, 256);
        assert_eq!(q.max_bytes_in_flight, ByteSize(1 << 30));
        assert_eq!(q.max_bytes_per_second, None);
        let g = &c.tenants[0].allow[0];
        assert_eq!(g.prefix, "");
        assert!(g.read);
        let t = &c.targets[0];
        assert_eq!(t.region, "us-east-1");
        assert!(t.rdma);
        assert_eq!(t.ca_file, None);
        assert_eq!(t.max_idle_connections, 64);
        let f = &c.fabric;
        assert_eq!(f.backend, Backend::Tcp);
        assert_eq!(f.staging_buffers, 32);
        assert_eq!(f.staging_buffer_size, ByteSize(4 << 20));
        assert_eq!(f.connect_timeout_ms, 2000);
        assert_eq!(f.max_ops_per_session, 64);
        assert_eq!(f.idle_session_secs, 60);
        assert_eq!(f.tenant_staging_share_percent, 50);
        assert_eq!(c.transfer.max_batch_items, 1024);
        let l = &c.listen;
        assert_eq!(l.max_connections, 256);
        assert_eq!(l.max_concurrent_streams, 1024);
        assert_eq!(l.max_header_list_size, ByteSize(16 << 10));
        assert_eq!(l.unauthenticated_timeout_secs, 10);
        assert_eq!(l.idle_timeout_secs, 300);
        assert_eq!(c.metrics.unix_socket, None);
        assert_eq!(c.metrics.bearer_token_file, None);
    }

    #[test]
    fn byte_sizes_in_yaml() {
        let with = |v: &str| BASE.to_owned() + &format!("transfer:\n  chunk_size: {v}\n");
        assert_eq!(
            parse(p(), &with("65536")).unwrap().transfer.chunk_size,
            ByteSize(65536)
        );
        assert_eq!(
            parse(p(), &with("\"16 MiB\"")).unwrap().transfer.chunk_size,
            ByteSize(16 << 20)
        );
        assert_eq!(
            parse(p(), &with("16MiB")).unwrap().transfer.chunk_size,
            ByteSize(16 << 20)
        );
        let e = parse_err(&with("16MB"));
        assert!(
            e.contains("transfer.chunk_size") && e.contains("ambiguous"),
            "{e}"
        );
        let e = parse_err(&with("-5"));
        assert!(
            e.contains("transfer.chunk_size") && e.contains("negative"),
            "{e}"
        );
        let e = parse_err(&with("1.5"));
        assert!(
            e.contains("transfer.chunk_size") && e.contains("floating point"),
            "{e}"
        );
    }

    #[test]
    fn unknown_fields_are_rejected_naming_the_field() {
        let cases = [
            (
                BASE.replace("listen:\n", "listen:\n  adress: 1.2.3.4:5\n"),
                "adress",
            ),
            (BASE.to_owned() + "extra: 1\n", "extra"),
            (
                BASE.replace(
                    "        write: true",
                    "        write: true\n        delete: true",
                ),
                "delete",
            ),
            (
                BASE.replace(
                    "    buckets: [\"*\"]",
                    "    buckets: [\"*\"]\n    path_style: true",
                ),
                "path_style",
            ),
            (
                BASE.to_owned() + "transfer:\n  chunksize: 1MiB\n",
                "chunksize",
            ),
            (
                BASE.to_owned() + "metrics:\n  listen: 1.2.3.4:5\n",
                "listen",
            ),
            (
                BASE.replace(
                    "    tenants: [alice]",
                    "    tenants: [alice]\n    token: abc",
                ),
                "token",
            ),
            (
                BASE.replace(
                    "        write: true",
                    "        write: true\n    quotas:\n      max_requests: 3",
                ),
                "max_requests",
            ),
        ];
        for (text, field) in cases {
            let e = parse(p(), &text).unwrap_err();
            assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
            let m = e.to_string();
            assert!(m.starts_with("/etc/s3dma/agent.yaml: "), "{m}");
            assert!(m.contains(&format!("unknown field `{field}`")), "{m}");
            assert!(m.contains("line"), "{m}");
        }
    }

    #[test]
    fn syntax_and_type_errors_name_the_file_and_position() {
        let e = parse_err("listen: [\n");
        assert!(e.starts_with("/etc/s3dma/agent.yaml: "), "{e}");
        let e = parse_err(&BASE.replace("127.0.0.1:7000", "not-an-address"));
        assert!(e.contains("listen.address") && e.contains("line 2"), "{e}");
        let e = parse_err(&BASE.replace("fabric:\n  fabric_key_file: /etc/s3dma/fabric.key\n", ""));
        assert!(e.contains("missing field `fabric`"), "{e}");
        let e = parse_err(
            &(BASE
                .to_owned()
                .replace("fabric:\n", "fabric:\n  backend: ib\n")),
        );
        assert!(
            e.contains("fabric.backend") && e.contains("unknown variant"),
            "{e}"
        );
        let c = parse(
            p(),
            &BASE.replace("fabric:\n", "fabric:\n  backend: verbs\n"),
        )
        .unwrap();
        assert_eq!(c.fabric.backend, Backend::Verbs);
    }
    #[test]
    fn target_for_prefers_exact_names() {
        let mut c = base();
        let mut t = c.targets[0].clone();
        t.name = "archive".into();
        t.buckets = vec!["cold".into(), "older".into()];
        c.targets.insert(0, t);
        c.validate(p()).unwrap();
        assert_eq!(c.target_for("cold").unwrap().name, "archive");
        assert_eq!(c.target_for("older").unwrap().name, "archive");
        assert_eq!(c.target_for("hot").unwrap().name, "local");
        c.targets.pop();
        assert!(c.target_for("hot").is_none());
        assert_eq!(c.target_for("cold").unwrap().name, "archive");
    }

    #[test]
    fn targets_listing_a_bucket_form_a_group() {
        let mut c = base();
        for name in ["gw-a", "gw-b"] {
            let mut t = c.targets[0].clone();
            t.name = name.into();
            t.buckets = vec!["ckpt".into()];
            c.targets.push(t);
        }
        // And "*" twice: the default is a group too.
        let mut t = c.targets[0].clone();
        t.name = "local-2".into();
        c.targets.push(t);
        c.validate(p()).unwrap();
        let names =
            |b: &str| -> Vec<String> { c.targets_for(b).iter().map(|t| t.name.clone()).collect() };
        assert_eq!(names("ckpt"), ["gw-a", "gw-b"]);
        assert_eq!(names("other"), ["local", "local-2"]);
    }
}
