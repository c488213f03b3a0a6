//! The three services' configurations, built as their own config structs
//! and written with `serde_yaml`: no YAML text is put together by hand, so
//! every path, key and URL is quoted by the serializer, and a field the
//! services rename or drop breaks this crate's build rather than a start.
//!
//! Everything listens on loopback, on free ports (port 0; each service
//! prints the address it bound), and the fabric is the layout's (`tcp`
//! unless `--fabric verbs`).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use crate::{LaunchError, Layout, REGION, TENANT};

/// `127.0.0.1:0`: loopback, a free port.
#[must_use]
pub fn loopback_any_port() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

/// The storage-target's configuration: loopback, a free port, RDMA over the
/// layout's fabric, one user (the tenant's key, `access_key_id`) with read-write
/// on every bucket; with `metrics`, Prometheus metrics on another free
/// loopback port; with `upstream`, a gateway in front of it (a 256 MiB
/// cache) instead of the filesystem store.
#[must_use]
pub fn storage_target(
    l: &Layout,
    access_key_id: &str,
    metrics: bool,
    upstream: Option<&crate::upstream::Upstream>,
) -> storage_target::config::Config {
    use storage_target::config::{Access, BucketGrant, Config, UserConfig};
    let mut c = Config::new(l.data_dir.clone());
    c.listen = loopback_any_port();
    c.region = REGION.to_owned();
    c.users = vec![UserConfig {
        access_key_id: access_key_id.to_owned(),
        secret: None,
        secret_file: Some(l.secret_key_file.clone()),
        buckets: vec![BucketGrant {
            name: "*".to_owned(),
            access: Access::ReadWrite,
        }],
        canonical_id: None,
        display_name: None,
        create_buckets: false,
    }];
    c.rdma.mode = storage_target::rdma::RdmaMode::Enabled;
    c.rdma.backend = l.fabric;
    c.rdma.fabric_key_file = Some(l.fabric_key_file.clone());
    if l.fabric == fabric::Backend::Verbs {
        // A hipobj-rc-v2 or cuObject client on this machine (the agent's
        // shim, or a hipObject client) sends from a GID of one of its
        // addresses: the target may write to those, and to nothing else.
        c.rdma
            .allowed_client_networks
            .extend(own_address_networks());
    }
    if metrics {
        c.metrics.address = Some(loopback_any_port());
    }
    if let Some(u) = upstream {
        let mut up = storage_target::gateway::UpstreamConfig::new(u.endpoint.clone());
        up.region.clone_from(&u.region);
        c.store = storage_target::gateway::StoreKind::S3;
        c.upstream = Some(up);
        c.data_dir = std::path::PathBuf::new();
        c.cache.size.0 = u.cache_bytes;
        if u.gateways > 1 {
            // The agent spreads an object's chunks over the gateways: the
            // chunks after one read mostly belong to another gateway, and
            // fetching them ahead here would read them upstream twice.
            c.cache.prefetch_chunks = 0;
        }
    }
    c
}

/// This machine's interface addresses, each as a one-address network.
#[must_use]
pub fn own_address_networks() -> Vec<storage_target::config::networks::Cidr> {
    own_addresses()
        .into_iter()
        .filter_map(|ip| {
            let bits = if ip.is_ipv4() { 32 } else { 128 };
            format!("{ip}/{bits}").parse().ok()
        })
        .collect()
}

/// This machine's interface addresses (none when they cannot be listed),
/// but multicast and unspecified ones.
fn own_addresses() -> Vec<std::net::IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out: Vec<std::net::IpAddr> = addrs
        .filter_map(|a| {
            let s = a.address?;
            if let Some(v4) = s.as_sockaddr_in() {
                Some(std::net::IpAddr::V4(v4.ip()))
            } else {
                s.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip()))
            }
        })
        .filter(|ip| !ip.is_multicast() && !ip.is_unspecified())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The dpu-agent's configuration: loopback, a free port, one shim (bearer
/// token), tenant [`TENANT`] with read and write on every bucket, the targets
/// at `target_urls` serving every bucket over RDMA (several: one group, each
/// object's chunks spread over them); with `metrics`, Prometheus metrics on
/// another free loopback port.
#[must_use]
pub fn dpu_agent(
    l: &Layout,
    access_key_id: &str,
    target_urls: &[&str],
    metrics: bool,
) -> dpu_agent::config::Config {
    use dpu_agent::config::{
        Config, FabricConfig, Grant, ListenConfig, MetricsConfig, Quotas, ShimConfig, TargetConfig,
        TenantConfig, TransferConfig,
    };
    let targets = target_urls
        .iter()
        .enumerate()
        .map(|(i, url)| {
            let name = if i == 0 {
                "local".to_owned()
            } else {
                format!("local-{i}")
            };
            let mut target = TargetConfig::new(&name, *url, vec!["*".to_owned()]);
            target.region = REGION.to_owned();
            target.rdma = true;
            target.protocol = l.protocol;
            target
        })
        .collect();
    let mut fabric = FabricConfig::new(l.fabric_key_file.clone());
    fabric.backend = l.fabric;
    Config {
        listen: ListenConfig::new(loopback_any_port()),
        shims: vec![ShimConfig {
            name: "local".to_owned(),
            token_file: Some(l.shim_token_file.clone()),
            tls_name: None,
            tenants: vec![TENANT.to_owned()],
        }],
        tenants: vec![TenantConfig {
            name: TENANT.to_owned(),
            access_key_id: access_key_id.to_owned(),
            secret_access_key_file: l.secret_key_file.clone(),
            allow: vec![Grant {
                bucket: "*".to_owned(),
                prefix: String::new(),
                read: true,
                write: true,
            }],
            quotas: Quotas::default(),
        }],
        targets,
        fabric,
        transfer: TransferConfig::default(),
        metrics: MetricsConfig {
            address: metrics.then(loopback_any_port),
            ..MetricsConfig::default()
        },
        runtime: relay_runtime(),
    }
}

/// The host-shim's configuration: the socket (0600), the agent at
/// `agent_addr` (`IP:PORT`) with the shim's bearer token, a loopback fabric
/// endpoint, and `uid` as tenant [`TENANT`]; with `metrics`, Prometheus
/// metrics on a free loopback port.
#[must_use]
pub fn host_shim(
    l: &Layout,
    socket: &Path,
    agent_addr: &str,
    uid: u32,
    metrics: bool,
) -> host_shim::config::Config {
    use host_shim::config::{
        AgentConfig, Config, CudaConfig, FabricConfig, LeaseConfig, MetricsConfig, SocketConfig,
        TenantConfig,
    };
    let mut sock = SocketConfig::new(socket.to_path_buf());
    sock.mode = "0600".to_owned();
    let mut agent = AgentConfig::new(format!("http://{agent_addr}"));
    agent.token_file = Some(l.shim_token_file.clone());
    let mut tenant = TenantConfig::new(TENANT);
    tenant.uids = vec![uid];
    Config {
        socket: sock,
        agent,
        fabric: FabricConfig {
            backend: l.fabric,
            ..FabricConfig::new(loopback_any_port(), l.fabric_key_file.clone())
        },
        tenants: vec![tenant],
        leases: LeaseConfig::default(),
        cuda: CudaConfig::default(),
        metrics: MetricsConfig {
            address: metrics.then(loopback_any_port),
            ..MetricsConfig::default()
        },
        runtime: relay_runtime(),
    }
}

/// The runtime of a local stack's dpu-agent and host-shim, the two services
/// that relay requests rather than move bytes: a quarter of this host's
/// CPUs (at least one; one worker is tokio's single-threaded scheduler),
/// since all three services and the tenants share them. With one worker
/// per CPU each, every small request pays cross-thread wake-ups: on a
/// 2-CPU host one thread cut the agent's and the shim's CPU per small
/// request by about a fifth (`s3dma-tools bench`). The storage-target
/// keeps one worker per CPU: it sends the bytes, and on one thread its
/// 1 GiB GETs fell from 2.3 to 1.4 GB/s.
pub fn relay_runtime() -> s3dma_config::RuntimeConfig {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    s3dma_config::RuntimeConfig {
        worker_threads: Some((cpus / 4).max(1)),
    }
}

/// The first line of every file the launcher writes.
pub const HEADER: &str = "# Generated by s3dma-launcher (`s3dma local`, `s3dma-tools`, the tests) on every start; edits are overwritten.\n";

/// `config` as YAML, after [`HEADER`]; `path` names the file in errors.
///
/// # Errors
/// [`LaunchError::Config`] when the value cannot be serialized (a path that
/// is not UTF-8).
pub fn to_yaml<T: serde::Serialize>(path: &Path, config: &T) -> Result<String, LaunchError> {
    let body = serde_yaml::to_string(config).map_err(|source| LaunchError::Config {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(format!("{HEADER}{body}"))
}

/// Writes `config` to `path` as YAML (0600; an existing file is replaced,
/// a symlink is not followed).
///
/// # Errors
/// [`LaunchError::Config`] or [`LaunchError::Private`].
pub fn write<T: serde::Serialize>(path: &Path, config: &T) -> Result<(), LaunchError> {
    crate::layout::write_private(path, &to_yaml(path, config)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layout in a fresh directory with real secret files, so the
    /// services' loaders (which read them) accept it.
    fn prepared() -> (tempfile::TempDir, Layout, String) {
        let d = tempfile::tempdir().unwrap();
        // Spaces, '#', ':' and quotes: the serializer must quote them.
        let dir = d.path().join("local dir #1: \"x\"");
        std::fs::create_dir(&dir).unwrap();
        let l = Layout::new(&dir);
        crate::layout::private_dir(&l.dir).unwrap();
        std::fs::create_dir(&l.data_dir).unwrap();
        let s = l.prepare_secrets().unwrap();
        (d, l, s.access_key_id)
    }

    #[test]
    fn gateway_config_loads() {
        let (_d, mut l, _) = prepared();
        let s = l
            .prepare_upstream_secrets("AKUPSTREAM", "up-secret")
            .unwrap();
        let u = crate::upstream::Upstream {
            endpoint: "http://127.0.0.1:7480".into(),
            region: Some("eu-1".into()),
            access_key_id: s.access_key_id.clone(),
            secret_access_key: s.secret_access_key.clone(),
            gateways: 2,
            cache_bytes: 64 << 20,
        };
        assert!(!format!("{u:?}").contains("up-secret"));
        write(
            &l.target_config,
            &storage_target(&l, &s.access_key_id, false, Some(&u)),
        )
        .unwrap();
        let (c, users) = storage_target::config::Config::load(&l.target_config).unwrap();
        assert_eq!(c.store, storage_target::gateway::StoreKind::S3);
        let up = c.upstream.unwrap();
        assert_eq!(up.endpoints, ["http://127.0.0.1:7480"]);
        assert_eq!(up.region.as_deref(), Some("eu-1"));
        assert_eq!(users[0].access_key_id, "AKUPSTREAM");
        assert_eq!(users[0].secret, "up-secret");
        assert_eq!(c.cache.size.0, 64 << 20);
        assert_eq!(c.cache.prefetch_chunks, 0, "no prefetch in a group");
    }

    #[test]
    fn storage_target_config_loads() {
        let (_d, l, key) = prepared();
        for metrics in [false, true] {
            write(&l.target_config, &storage_target(&l, &key, metrics, None)).unwrap();
            let (c, users) = storage_target::config::Config::load(&l.target_config).unwrap();
            assert_eq!(c.data_dir, l.data_dir);
            assert_eq!(c.listen.to_string(), "127.0.0.1:0");
            assert_eq!(c.region, REGION);
            assert_eq!(users[0].access_key_id, key);
            assert_eq!(c.rdma.mode, storage_target::rdma::RdmaMode::Enabled);
            assert_eq!(
                c.rdma.fabric_key_file.as_deref(),
                Some(l.fabric_key_file.as_path())
            );
            let m = c.metrics_options("st.yaml").unwrap();
            assert_eq!(m.address.is_some(), metrics);
        }
    }

    #[test]
    fn dpu_agent_config_loads() {
        let (_d, l, key) = prepared();
        for metrics in [false, true] {
            write(
                &l.agent_config,
                &dpu_agent(&l, &key, &["http://127.0.0.1:4567"], metrics),
            )
            .unwrap();
            let loaded = dpu_agent::config::load(&l.agent_config).unwrap();
            let c = &loaded.config;
            assert_eq!(c.tenants[0].name, TENANT);
            assert_eq!(c.tenants[0].access_key_id, key);
            assert_eq!(c.tenants[0].secret_access_key_file, l.secret_key_file);
            assert!(c.tenants[0].allow[0].write);
            assert_eq!(c.targets[0].endpoint, "http://127.0.0.1:4567");
            assert_eq!(c.shims[0].tenants, vec![TENANT.to_owned()]);
            assert_eq!(c.listen.address.ip().to_string(), "127.0.0.1");
            assert_eq!(c.metrics.address.is_some(), metrics);
            assert!(loaded.shim("local").is_some_and(|s| s.token.is_some()));
        }
    }

    #[test]
    fn several_gateways_are_one_group() {
        let (_d, l, key) = prepared();
        let urls = [
            "http://127.0.0.1:4567",
            "http://127.0.0.1:4568",
            "http://127.0.0.1:4569",
        ];
        write(&l.agent_config, &dpu_agent(&l, &key, &urls, false)).unwrap();
        let loaded = dpu_agent::config::load(&l.agent_config).unwrap();
        let group: Vec<&str> = loaded
            .config
            .targets_for("any-bucket")
            .iter()
            .map(|t| t.endpoint.as_str())
            .collect();
        assert_eq!(group, urls);
    }

    #[test]
    fn host_shim_config_loads() {
        let (d, l, _) = prepared();
        let sock = d.path().join("shim \"x\".sock");
        for metrics in [false, true] {
            write(
                &l.shim_config,
                &host_shim(&l, &sock, "127.0.0.1:7000", 1000, metrics),
            )
            .unwrap();
            let loaded = host_shim::config::load(&l.shim_config).unwrap();
            let c = &loaded.config;
            assert_eq!(c.socket.path, sock);
            assert_eq!(c.socket.mode, "0600");
            assert_eq!(c.agent.endpoint, "http://127.0.0.1:7000");
            assert_eq!(c.tenants[0].uids, vec![1000]);
            assert_eq!(c.fabric.fabric_key_file, l.fabric_key_file);
            assert!(c.fabric.listen.is_some_and(|l| l.ip().is_loopback()));
            assert_eq!(c.metrics.address.is_some(), metrics);
        }
    }

    #[test]
    fn written_files_are_private_and_say_so() {
        let (_d, l, key) = prepared();
        write(&l.target_config, &storage_target(&l, &key, false, None)).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        let meta = std::fs::metadata(&l.target_config).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&l.target_config).unwrap();
        assert!(text.starts_with(HEADER), "{text}");
    }
}
