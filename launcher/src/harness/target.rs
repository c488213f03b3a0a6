//! storage-target processes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::*;

/// A storage-target process.
#[derive(Debug)]
pub struct Target {
    svc: Service,
    /// `http://IP:PORT`.
    pub endpoint: String,
    /// `http://IP:PORT/metrics` (a new port after each restart).
    pub metrics: String,
    /// Its temporary directory: config, fabric key, log and (by default) data.
    pub dir: tempfile::TempDir,
    config: PathBuf,
    /// What `config` holds.
    cfg: storage_target::config::Config,
}

/// How [`Target::start_opts`] starts a target; [`TargetOpts::new`] gives
/// what [`Target::start`] does.
#[derive(Debug)]
pub struct TargetOpts {
    /// RDMA enabled (`true`) or disabled.
    pub rdma: bool,
    /// The IP to listen on (S3 and metrics).
    pub listen_ip: String,
    /// A command prefix to run the binary under, e.g.
    /// `["ip", "netns", "exec", "NAME"]` (it must exec the binary, so the
    /// child's pid is the target's).
    pub wrap: Vec<String>,
    /// The data directory (default: `data` in the target's temporary
    /// directory), e.g. a small tmpfs mounted by the test.
    pub data_dir: Option<PathBuf>,
    /// Run as a gateway (`store: s3`) in front of this upstream instead of
    /// the filesystem store.
    pub upstream: Option<storage_target::gateway::UpstreamConfig>,
    /// The gateway's cache section (default: the section's defaults).
    pub cache: Option<storage_target::gateway::CacheConfig>,
}

impl TargetOpts {
    /// What [`Target::start`] does: loopback, no wrapper, data in the temporary directory.
    pub fn new(rdma: bool) -> TargetOpts {
        TargetOpts {
            rdma,
            listen_ip: "127.0.0.1".into(),
            wrap: Vec::new(),
            data_dir: None,
            upstream: None,
            cache: None,
        }
    }

    /// A gateway (RDMA enabled) in front of `upstream`.
    pub fn gateway(upstream: &str, cache: storage_target::gateway::CacheConfig) -> TargetOpts {
        TargetOpts {
            upstream: Some(storage_target::gateway::UpstreamConfig::new(upstream)),
            cache: Some(cache),
            ..TargetOpts::new(true)
        }
    }
}

impl Target {
    /// A target with RDMA enabled (`true`) or disabled, on a fresh directory.
    pub fn start(rdma: bool) -> Target {
        Target::start_opts(TargetOpts::new(rdma))
    }

    /// A target as `opts` says.
    pub fn start_opts(opts: TargetOpts) -> Target {
        let TargetOpts {
            rdma,
            listen_ip,
            wrap,
            data_dir,
            upstream,
            cache,
        } = opts;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("fabric.key");
        write_private(&key, FABRIC_KEY_HEX);
        let ip: std::net::IpAddr = listen_ip.parse().unwrap();
        let mut cfg = storage_target::config::Config::new(
            data_dir.unwrap_or_else(|| dir.path().join("data")),
        );
        cfg.listen = SocketAddr::new(ip, 0);
        cfg.region = "us-east-1".into();
        cfg.metrics_listen = Some(SocketAddr::new(ip, 0));
        cfg.users = [ALICE, BOB, ADMIN]
            .into_iter()
            .map(|(ak, sk)| storage_target::config::UserConfig {
                access_key_id: ak.into(),
                secret: Some(sk.into()),
                secret_file: None,
                buckets: vec![storage_target::config::BucketGrant {
                    name: "*".into(),
                    access: storage_target::config::Access::ReadWrite,
                }],
                canonical_id: None,
                display_name: None,
                create_buckets: false,
            })
            .collect();
        cfg.rdma.mode = if rdma {
            storage_target::rdma::RdmaMode::Enabled
        } else {
            storage_target::rdma::RdmaMode::Disabled
        };
        cfg.rdma.fabric_key_file = Some(key);
        cfg.rdma.backend = backend();
        cfg.rdma.connect_timeout_ms = 2000;
        // On verbs a hipobj-rc-v2 or cuObject client (the test's shim) sends
        // from a GID of one of this machine's addresses (in the Soft-RoCE
        // VM, rxe0's 10.77.0.1: .ci/rdma-vm.sh).
        if backend() == fabric::Backend::Verbs {
            cfg.rdma
                .allowed_client_networks
                .extend(crate::configs::own_address_networks());
        }
        // A target in a test's own network namespace serves clients on its
        // /24 (the veth pair): let it connect there as well as loopback.
        if let std::net::IpAddr::V4(v4) = ip
            && !v4.is_loopback()
        {
            let [a, b, c, _] = v4.octets();
            if let Ok(net) = format!("{a}.{b}.{c}.0/24").parse() {
                cfg.rdma.allowed_client_networks.push(net);
            }
        }
        if let Some(up) = upstream {
            cfg.store = storage_target::gateway::StoreKind::S3;
            cfg.upstream = Some(up);
            cfg.data_dir = PathBuf::new();
        }
        if let Some(c) = cache {
            cfg.cache = c;
        }
        let config = dir.path().join("target.yaml");
        crate::configs::write(&config, &cfg).unwrap();
        let mut spec = ServiceSpec::new(
            "storage-target",
            bin_dir().join("storage-target"),
            config.clone(),
            dir.path().join("target.log"),
            &["storage-target listening on ", "metrics on "],
        )
        .env("RUST_LOG", "info,s3s=warn");
        spec.wrap = wrap;
        let mut t = Target {
            svc: Service::start(spec),
            endpoint: String::new(),
            metrics: String::new(),
            dir,
            config,
            cfg,
        };
        t.started();
        t
    }

    fn started(&mut self) {
        self.endpoint = self.svc.line(0).to_owned();
        self.metrics = self.svc.line(1).to_owned();
    }

    /// The S3 port.
    pub fn port(&self) -> u16 {
        self.endpoint.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// The process id (None while killed).
    pub fn pid(&self) -> Option<u32> {
        self.svc.pid()
    }

    /// SIGKILLs the target (and reaps it).
    pub fn kill9(&mut self) {
        self.svc.kill9();
    }

    /// Restarts on the same port (same data).
    pub fn restart(&mut self) {
        self.restart_after(Duration::ZERO);
    }

    /// Restarts on the same port with the hipobj-rc-v2 server on or off
    /// (`rdma.hipobj.enabled`; off, its control requests answer `501`).
    pub fn set_hipobj(&mut self, enabled: bool) {
        self.reconfigure(|c| c.rdma.hipobj.enabled = enabled);
    }

    /// Restarts on the same port (same data) with `change` applied to its
    /// configuration.
    pub fn reconfigure(&mut self, change: impl FnOnce(&mut storage_target::config::Config)) {
        change(&mut self.cfg);
        self.restart();
    }

    /// Kills the target, waits `down`, and starts it again on the same port.
    pub fn restart_after(&mut self, down: Duration) {
        let port = self.port();
        self.kill9();
        std::thread::sleep(down);
        // Restart on the same port so the agent's config stays valid (the
        // metrics address keeps port 0).
        self.cfg.listen.set_port(port);
        crate::configs::write(&self.config, &self.cfg).unwrap();
        self.svc.spawn();
        self.started();
    }

    /// An aws-sdk-s3 client for this target with the credentials `(ak, sk)`.
    pub fn s3(&self, (ak, sk): (&str, &str)) -> S3Client {
        s3_client(&self.endpoint, ak, sk)
    }

    /// Creates bucket `name` as [`ADMIN`].
    pub async fn create_bucket(&self, name: &str) {
        self.s3(ADMIN)
            .create_bucket()
            .bucket(name)
            .send()
            .await
            .unwrap();
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        self.svc.log()
    }

    /// The `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        scrape(&self.metrics).await
    }
}
