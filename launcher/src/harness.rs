//! The end-to-end test harness (feature `harness`): real processes for the
//! agent's and the shim's integration tests and the agent's bench:
//! storage-targets and dpu-agents (the workspace's binaries, found in the
//! target directory above the test binary), a moto S3 server (third-party
//! S3, from the test virtualenv), a one-node Ceph cluster (an existing S3
//! cluster: radosgw from Debian's packages), and a test "shim" that holds tcp-fabric
//! memory and calls the agent's gRPC API.
//!
//! dpu-agent's tests (`dpu-agent/tests/common`) and host-shim's
//! (`host-shim/tests/common`, which adds the host-shim process) use it as a
//! dev-dependency instead of including each other's files. Everything here
//! panics on failure: it is for tests.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aws_sdk_s3::Client as S3Client;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region as AwsRegion};
use fabric::{Access, Domain, Endpoint, EndpointConfig, FabricKey, Region, Window};
use s3dma_proto::agent::v1 as pb;
use s3dma_proto::agent::v1::agent_client::AgentClient;
use sha2::Digest as _;
use tonic::transport::Channel;

/// The gateway's cache section, for [`TargetOpts::gateway`].
pub use storage_target::gateway::CacheConfig;

/// Fabric key shared by tenant memory, agent and targets.
pub const FABRIC_KEY_HEX: &str = "8899aabbccddeeff00112233445566778899aabbccddeeff0011223344556677";
/// Tenant credentials (S3 users on the target).
pub const ALICE: (&str, &str) = ("AKIAALICE", "alice-secret-Zq8v1X");
/// Another tenant.
pub const BOB: (&str, &str) = ("AKIABOB", "bob-secret-Hh3k9P");
/// Target admin (creates buckets).
pub const ADMIN: (&str, &str) = ("admin", "admin-secret-Lm2");
/// The shim's bearer token.
pub const SHIM_TOKEN: &str = "shim-token-0123456789abcdef";

/// Writes a secret file (token, key) as the services require: mode 0600
/// (also when it existed with another mode).
pub fn write_private(path: &Path, content: impl AsRef<[u8]>) {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .unwrap();
    f.write_all(content.as_ref()).unwrap();
}

/// The size of the suites' "large object" cases: 1 GiB, or
/// `$S3DMA_TEST_LARGE_OBJECT` bytes (the Soft-RoCE VM, whose emulated CPUs
/// are slow, uses 256 MiB: still many chunks and a multipart upload).
///
/// # Panics
/// On a value that is not a number of bytes.
#[must_use]
pub fn large_object_len() -> usize {
    std::env::var("S3DMA_TEST_LARGE_OBJECT").map_or(1 << 30, |v| {
        v.parse()
            .unwrap_or_else(|e| panic!("S3DMA_TEST_LARGE_OBJECT={v:?}: {e}"))
    })
}

/// [`FABRIC_KEY_HEX`] as a key.
pub fn fabric_key() -> FabricKey {
    fabric::config::parse_fabric_key(FABRIC_KEY_HEX).unwrap()
}

/// The fabric every service and test tenant of the harness uses:
/// `$S3DMA_TEST_FABRIC` (`tcp` when unset). `.ci/rdma-vm.sh` runs the
/// end-to-end suites again with `verbs` on Soft-RoCE.
///
/// # Panics
/// On a value other than `tcp` or `verbs`.
#[must_use]
pub fn backend() -> fabric::Backend {
    match std::env::var("S3DMA_TEST_FABRIC") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("S3DMA_TEST_FABRIC: {e}")),
        Err(_) => fabric::Backend::Tcp,
    }
}

/// `target/<profile>/` of this test binary (where workspace binaries are).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Reads lines from a child's stdout until `prefix` is found; returns the rest.
fn wait_line(out: &mut impl BufRead, prefix: &str, what: &str, log: &Path) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).unwrap();
        if n == 0 {
            panic!(
                "{what} exited before printing {prefix:?}; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if let Some(rest) = line.trim().strip_prefix(prefix) {
            return rest.to_owned();
        }
    }
}

fn kill(child: &mut Option<Child>, sig: nix::sys::signal::Signal) {
    if let Some(c) = child.as_mut() {
        let pid = nix::unistd::Pid::from_raw(c.id() as i32);
        let _ = nix::sys::signal::kill(pid, sig);
        let _ = c.wait();
    }
    *child = None;
}

/// A storage-target process.
#[derive(Debug)]
pub struct Target {
    child: Option<Child>,
    /// `http://IP:PORT`.
    pub endpoint: String,
    /// `http://IP:PORT/metrics` (a new port after each restart).
    pub metrics: String,
    /// Its temporary directory: config, fabric key, log and (by default) data.
    pub dir: tempfile::TempDir,
    config: PathBuf,
    log: PathBuf,
    /// Command prefix the binary runs under (e.g. `ip netns exec NAME`).
    wrap: Vec<String>,
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
        let log = dir.path().join("target.log");
        let mut t = Target {
            child: None,
            endpoint: String::new(),
            metrics: String::new(),
            dir,
            config,
            log,
            wrap,
            cfg,
        };
        t.spawn(None);
        t
    }

    fn spawn(&mut self, port: Option<u16>) {
        let bin = bin_dir().join("storage-target");
        assert!(
            bin.exists(),
            "{} is missing: build it first (`cargo build -p storage-target`; `cargo test --workspace` does)",
            bin.display()
        );
        if let Some(p) = port {
            // Restart on the same port so the agent's config stays valid
            // (the metrics address keeps port 0).
            self.cfg.listen.set_port(p);
            crate::configs::write(&self.config, &self.cfg).unwrap();
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut child = wrapped(&self.wrap, &bin)
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "info,s3s=warn")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let ep = wait_line(
            &mut out,
            "storage-target listening on ",
            "storage-target",
            &self.log,
        );
        let metrics = wait_line(&mut out, "metrics on ", "storage-target", &self.log);
        std::thread::spawn(move || for _ in out.lines() {});
        self.endpoint = ep;
        self.metrics = metrics;
        self.child = Some(child);
    }

    /// The S3 port.
    pub fn port(&self) -> u16 {
        self.endpoint.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// The process id (None while killed).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILLs the target (and reaps it).
    pub fn kill9(&mut self) {
        kill(&mut self.child, nix::sys::signal::Signal::SIGKILL);
    }

    /// Restarts on the same port (same data).
    pub fn restart(&mut self) {
        self.restart_after(Duration::ZERO);
    }

    /// Kills the target, waits `down`, and starts it again on the same port.
    pub fn restart_after(&mut self, down: Duration) {
        let port = self.port();
        self.kill9();
        std::thread::sleep(down);
        self.spawn(Some(port));
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
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        scrape(&self.metrics).await
    }
}

/// `GET` of a `http://IP:PORT/metrics` URL, the whole response.
pub async fn scrape(url: &str) -> String {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        let addr = url
            .trim_start_matches("http://")
            .trim_end_matches("/metrics")
            .to_owned();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        use std::io::{Read as _, Write as _};
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap()
}

impl Drop for Target {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `bin` as a command, run under the prefix `wrap` when it is not empty.
/// `bin` as a command, run through `wrap` (e.g. `ip netns exec NS`) when
/// it is not empty.
pub fn wrapped(wrap: &[String], bin: &Path) -> Command {
    match wrap.split_first() {
        None => Command::new(bin),
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin);
            c
        }
    }
}

/// An aws-sdk-s3 client for `endpoint` (path-style, `us-east-1`).
pub fn s3_client(endpoint: &str, ak: &str, sk: &str) -> S3Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(AwsRegion::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(ak, sk, None, None, "test"))
        .force_path_style(true)
        .build();
    S3Client::from_conf(conf)
}

/// A moto S3 server (third-party S3 without RDMA) from the test virtualenv.
#[derive(Debug)]
pub struct Moto {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

impl Moto {
    /// Starts moto on a free port and waits until it accepts connections.
    pub fn start() -> Moto {
        let venv = workspace_root().join(".venv/bin/moto_server");
        assert!(
            venv.exists(),
            "{} is missing: run `bash .ci/setup.sh` (it installs moto from tests/requirements.txt)",
            venv.display()
        );
        let port = free_port();
        let mut child = Command::new(venv)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let endpoint = format!("http://127.0.0.1:{port}");
        // Generous: in the Soft-RoCE VM (emulated CPUs) importing moto alone
        // took over 30 s once. A moto that exits fails at once.
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("moto exited before it listened: {status}");
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("moto did not start in 180 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Moto {
            child: Some(child),
            endpoint,
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        kill(&mut self.child, nix::sys::signal::Signal::SIGKILL);
    }
}

/// A throw-away one-node Ceph cluster (one monitor, one memstore OSD,
/// radosgw on loopback, cephx off) from Debian's packages, started by
/// `tests/ceph/cluster.sh`: the existing S3 cluster the gateway and fallback
/// suites run against. One per test binary ([`Ceph::shared`]): it starts in
/// about 15 s, and the script's watcher stops it and deletes its directory
/// when the test process exits, however it exits.
#[derive(Debug)]
pub struct Ceph {
    dir: PathBuf,
    /// radosgw's S3 endpoint, `http://127.0.0.1:PORT`.
    pub endpoint: String,
    users: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Ceph {
    /// The test binary's cluster, started on first use.
    ///
    /// # Panics
    /// When the Ceph packages are missing (`bash .ci/setup.sh` installs
    /// them) or the cluster does not come up (the message has the script's
    /// error, which names the daemon's log).
    pub fn shared() -> &'static Ceph {
        static CEPH: std::sync::OnceLock<Ceph> = std::sync::OnceLock::new();
        CEPH.get_or_init(Ceph::start)
    }

    fn start() -> Ceph {
        let dir = std::env::temp_dir().join(format!(
            "s3dma-ceph-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        ));
        let (mon, rgw) = (free_port(), free_port());
        let out = Command::new("bash")
            .arg(workspace_root().join("tests/ceph/cluster.sh"))
            .args(["start", dir.to_str().unwrap()])
            .args([mon.to_string(), rgw.to_string()])
            .arg(std::process::id().to_string())
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "the Ceph cluster did not start: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
        let endpoint = stdout
            .lines()
            .find_map(|l| l.strip_prefix("endpoint "))
            .unwrap_or_else(|| panic!("cluster.sh printed no endpoint: {stdout}"))
            .to_string();
        Ceph {
            dir,
            endpoint,
            users: Default::default(),
        }
    }

    /// Makes `uid` an S3 user of the cluster with these keys (once per
    /// uid); returns an aws-sdk-s3 client for it.
    ///
    /// # Panics
    /// When `radosgw-admin` fails.
    pub fn user(&self, uid: &str, (ak, sk): (&str, &str)) -> S3Client {
        let mut users = self.users.lock().unwrap();
        if users.insert(uid.to_string()) {
            let out = Command::new("bash")
                .arg(workspace_root().join("tests/ceph/cluster.sh"))
                .args(["user", self.dir.to_str().unwrap(), uid, ak, sk])
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "radosgw-admin: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        s3_client(&self.endpoint, ak, sk)
    }

    /// `radosgw-admin` with this cluster's configuration; returns stdout.
    ///
    /// # Panics
    /// When it fails.
    pub fn admin(&self, args: &[&str]) -> String {
        let out = Command::new("radosgw-admin")
            .arg("-c")
            .arg(self.dir.join("ceph.conf"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "radosgw-admin {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// A free TCP port on loopback (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A target entry of the agent's config.
#[derive(Debug)]
pub struct TargetSpec {
    /// The target's name.
    pub name: &'static str,
    /// Its S3 endpoint.
    pub endpoint: String,
    /// The buckets it serves (`"*"` for every other bucket).
    pub buckets: Vec<&'static str>,
    /// Whether requests to it carry RDMA tokens.
    pub rdma: bool,
}

/// Knobs of a test agent.
#[derive(Debug)]
pub struct AgentSpec {
    /// The targets.
    pub targets: Vec<TargetSpec>,
    /// Extra YAML under `transfer:`.
    pub transfer: String,
    /// Extra YAML under alice's `quotas:`.
    pub alice_quotas: String,
    /// `RUST_LOG` of the agent.
    pub rust_log: &'static str,
    /// `listen.address` (a fixed port survives restarts).
    pub listen: String,
    /// Command prefix the binary runs under (e.g. `ip netns exec NAME`;
    /// it must exec the binary). Default: none.
    pub wrap: Vec<String>,
    /// More buckets a tenant (`alice` or `bob`) may read and write, beyond
    /// `alice-data`, `shared` and `bob-data`.
    pub extra_buckets: Vec<(&'static str, &'static str)>,
}

impl AgentSpec {
    /// An agent for `targets` with the test defaults.
    pub fn new(targets: Vec<TargetSpec>) -> AgentSpec {
        AgentSpec {
            targets,
            transfer: String::new(),
            alice_quotas: String::new(),
            rust_log: "info",
            listen: "127.0.0.1:0".into(),
            wrap: Vec::new(),
            extra_buckets: Vec::new(),
        }
    }

    /// An agent for the one target `t`, serving every bucket over RDMA.
    pub fn one(t: &Target) -> AgentSpec {
        AgentSpec::new(vec![TargetSpec {
            name: "local",
            endpoint: t.endpoint.clone(),
            buckets: vec!["*"],
            rdma: true,
        }])
    }
}

/// `base` with the keys of the YAML mapping `yaml` (a test's snippet, e.g.
/// `chunk_size: 1MiB`) set over it; the result is read back into `T`, so an
/// unknown key fails here.
///
/// # Panics
/// `yaml` is not a mapping, or the result is not a valid `T`.
pub fn overlay<T: serde::Serialize + serde::de::DeserializeOwned>(base: &T, yaml: &str) -> T {
    let mut v = serde_yaml::to_value(base).unwrap();
    if !yaml.trim().is_empty() {
        let extra: serde_yaml::Mapping = serde_yaml::from_str(yaml)
            .unwrap_or_else(|e| panic!("{yaml:?} is not a YAML mapping: {e}"));
        let map = v.as_mapping_mut().unwrap();
        for (k, x) in extra {
            map.insert(k, x);
        }
    }
    serde_yaml::from_value(v).unwrap_or_else(|e| panic!("{yaml:?}: {e}"))
}

/// The agent's configuration for `spec`, with its secret files in `d`:
/// shims `host1` (alice and bob) and `host2` (bob), tenants alice
/// (read-write `alice-data` and `shared`) and bob (read-write `bob-data`,
/// read `shared/datasets/`), a small staging pool, the test transfer
/// defaults (`request_timeout_secs: 120`, `backoff_initial_ms: 20`,
/// `backoff_max_ms: 200`) under `spec.transfer`, metrics on loopback.
fn agent_config(spec: &AgentSpec, d: &Path) -> dpu_agent::config::Config {
    use dpu_agent::config::{
        ByteSize, Config, FabricConfig, Grant, ListenConfig, MetricsConfig, Quotas, ShimConfig,
        TargetConfig, TenantConfig, TransferConfig,
    };
    let grant = |bucket: &str, prefix: &str, write: bool| Grant {
        bucket: bucket.into(),
        prefix: prefix.into(),
        read: true,
        write,
    };
    let extra = |tenant: &str| {
        spec.extra_buckets
            .iter()
            .filter(|(t, _)| *t == tenant)
            .map(|(_, b)| grant(b, "", true))
            .collect::<Vec<_>>()
    };
    let shim = |name: &str, token: &str, tenants: &[&str]| ShimConfig {
        name: name.into(),
        token_file: Some(d.join(token)),
        tls_name: None,
        tenants: tenants.iter().map(|t| (*t).to_owned()).collect(),
    };
    let transfer = TransferConfig {
        request_timeout_secs: 120,
        backoff_initial_ms: 20,
        backoff_max_ms: 200,
        ..TransferConfig::default()
    };
    let mut fabric = FabricConfig::new(d.join("fabric.key"));
    fabric.backend = backend();
    fabric.staging_buffers = 16;
    fabric.staging_buffer_size = ByteSize(1 << 20);
    Config {
        listen: ListenConfig::new(spec.listen.parse().unwrap()),
        shims: vec![
            shim("host1", "shim.token", &["alice", "bob"]),
            shim("host2", "other-shim.token", &["bob"]),
        ],
        tenants: vec![
            TenantConfig {
                name: "alice".into(),
                access_key_id: ALICE.0.into(),
                secret_access_key_file: d.join("alice.secret"),
                allow: [grant("alice-data", "", true), grant("shared", "", true)]
                    .into_iter()
                    .chain(extra("alice"))
                    .collect(),
                quotas: overlay(&Quotas::default(), &spec.alice_quotas),
            },
            TenantConfig {
                name: "bob".into(),
                access_key_id: BOB.0.into(),
                secret_access_key_file: d.join("bob.secret"),
                allow: [
                    grant("bob-data", "", true),
                    grant("shared", "datasets/", false),
                ]
                .into_iter()
                .chain(extra("bob"))
                .collect(),
                quotas: Quotas::default(),
            },
        ],
        targets: spec
            .targets
            .iter()
            .map(|t| {
                let mut c = TargetConfig::new(
                    t.name,
                    t.endpoint.clone(),
                    t.buckets.iter().map(|b| (*b).to_owned()).collect(),
                );
                c.rdma = t.rdma;
                c
            })
            .collect(),
        fabric,
        transfer: overlay(&transfer, &spec.transfer),
        metrics: MetricsConfig {
            address: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            ..MetricsConfig::default()
        },
        runtime: s3dma_config::RuntimeConfig::default(),
    }
}

/// A dpu-agent process.
#[derive(Debug)]
pub struct Agent {
    child: Option<Child>,
    /// The gRPC address, `IP:PORT`.
    pub addr: String,
    /// `http://IP:PORT/metrics`.
    pub metrics: String,
    /// Its temporary directory: config, secrets, logs.
    pub dir: tempfile::TempDir,
    /// Its configuration file.
    pub config: PathBuf,
    log: PathBuf,
    stdout_log: PathBuf,
    rust_log: &'static str,
    wrap: Vec<String>,
}

impl Agent {
    /// Writes the config and secrets for `spec` and starts the agent.
    pub fn start(spec: AgentSpec) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        write_private(&p.join("fabric.key"), FABRIC_KEY_HEX);
        write_private(&p.join("alice.secret"), ALICE.1);
        write_private(&p.join("bob.secret"), BOB.1);
        write_private(&p.join("shim.token"), SHIM_TOKEN);
        write_private(&p.join("other-shim.token"), "other-shim-token-abcdef0123");
        let cfg = agent_config(&spec, p);
        let config = p.join("agent.yaml");
        crate::configs::write(&config, &cfg).unwrap();
        let mut a = Agent {
            child: None,
            addr: String::new(),
            metrics: String::new(),
            log: p.join("agent.log"),
            stdout_log: p.join("agent.stdout"),
            dir,
            config,
            rust_log: spec.rust_log,
            wrap: spec.wrap,
        };
        a.spawn();
        a
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        // By path rather than CARGO_BIN_EXE_*, so host-shim's tests can
        // start agents with this same harness.
        let mut child = wrapped(&self.wrap, &bin_dir().join("dpu-agent"))
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", self.rust_log)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let addr = wait_line(&mut out, "dpu-agent listening on ", "dpu-agent", &self.log);
        let metrics = wait_line(&mut out, "metrics on ", "dpu-agent", &self.log);
        let stdout_log = self.stdout_log.clone();
        std::thread::spawn(move || {
            use std::io::Write as _;
            let mut f = std::fs::File::create(stdout_log).unwrap();
            for l in out.lines().map_while(Result::ok) {
                let _ = writeln!(f, "{l}");
            }
        });
        self.addr = addr;
        self.metrics = metrics;
        self.child = Some(child);
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// stderr and stdout so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
            + &std::fs::read_to_string(&self.stdout_log).unwrap_or_default()
    }

    /// The `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        scrape(&self.metrics).await
    }

    /// A test shim with the right token (`host1`).
    pub async fn client(&self) -> Shim {
        self.client_with(SHIM_TOKEN).await
    }

    /// A test shim sending `token`.
    pub async fn client_with(&self, token: &str) -> Shim {
        Agent::shim_for(&self.addr, token).await
    }

    /// A shim on its own connection to the agent at `addr` (`IP:PORT`)
    /// with bearer `token` (none when empty).
    pub async fn shim_for(addr: &str, token: &str) -> Shim {
        let ch = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Shim {
            inner: AgentClient::new(ch).max_decoding_message_size(64 << 20),
            token: token.to_owned(),
        }
    }

    /// SIGKILLs the agent (and reaps it).
    pub fn kill9(&mut self) {
        kill(&mut self.child, nix::sys::signal::Signal::SIGKILL);
    }

    /// SIGKILL, then the same configuration again (the same address when
    /// `listen` was a fixed port).
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The test's stand-in for a host-shim: a gRPC client with a bearer token.
#[derive(Clone, Debug)]
pub struct Shim {
    /// The gRPC client.
    pub inner: AgentClient<Channel>,
    /// The bearer token sent (none when empty).
    pub token: String,
}

impl Shim {
    /// `msg` as a request carrying the bearer token.
    pub fn req<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if !self.token.is_empty() {
            r.metadata_mut().insert(
                "authorization",
                format!("Bearer {}", self.token).parse().unwrap(),
            );
        }
        r
    }

    /// A GetObject for `tenant` into `token`'s memory.
    pub async fn get(
        &self,
        tenant: &str,
        bucket: &str,
        key: &str,
        range: Option<pb::byte_range::Kind>,
        dest: &str,
    ) -> Result<pb::GetObjectResponse, tonic::Status> {
        let msg = pb::GetObjectRequest {
            tenant: tenant.into(),
            bucket: bucket.into(),
            key: key.into(),
            range: range.map(|k| pb::ByteRange { kind: Some(k) }),
            destination: dest.into(),
            if_match: String::new(),
        };
        self.inner
            .clone()
            .get_object(self.req(msg))
            .await
            .map(tonic::Response::into_inner)
    }

    /// A PutObject for `tenant` from `token`'s memory.
    pub async fn put(
        &self,
        tenant: &str,
        bucket: &str,
        key: &str,
        src: &str,
    ) -> Result<pb::PutObjectResponse, tonic::Status> {
        let msg = pb::PutObjectRequest {
            tenant: tenant.into(),
            bucket: bucket.into(),
            key: key.into(),
            source: src.into(),
            content_type: "application/octet-stream".into(),
            metadata: [("origin".to_owned(), "s3dma-test".to_owned())].into(),
        };
        self.inner
            .clone()
            .put_object(self.req(msg))
            .await
            .map(tonic::Response::into_inner)
    }
}

/// Tenant memory on the harness's fabric ([`backend`]), served by its own
/// endpoint.
#[derive(Debug)]
pub struct Memory {
    /// The endpoint serving the region.
    pub endpoint: Endpoint,
    /// The registered memory.
    pub region: Region,
}

impl Memory {
    /// `len` bytes of registered memory on a fresh domain, served on loopback.
    pub async fn new(len: usize) -> Memory {
        let domain = Domain::open(backend()).expect("open the test fabric");
        let region = domain.alloc(len, Access::ALL).unwrap();
        let endpoint = Endpoint::listen(
            &domain,
            EndpointConfig::new("127.0.0.1:0".parse().unwrap(), fabric_key()),
        )
        .await
        .unwrap();
        Memory { endpoint, region }
    }

    /// A window over `[off, off+len)` and its token.
    pub fn window(&self, off: usize, len: usize, access: Access) -> (Window, String) {
        let w = self.region.window(off, len, access, None).unwrap();
        let t = self.endpoint.token(&w).unwrap().to_string();
        (w, t)
    }

    /// Writes `data` at `off`.
    pub fn fill(&self, off: usize, data: &[u8]) {
        for (i, c) in data.chunks(16 << 20).enumerate() {
            self.region.write_at(off + i * (16 << 20), c).unwrap();
        }
    }

    /// Reads `len` bytes at `off`.
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        for (i, c) in v.chunks_mut(16 << 20).enumerate() {
            self.region.read_at(off + i * (16 << 20), c).unwrap();
        }
        v
    }

    /// SHA-256 (hex) of `len` bytes at `off`.
    pub fn sha256(&self, off: usize, len: usize) -> String {
        let mut h = sha2::Sha256::new();
        let mut buf = vec![0; (16 << 20).min(len.max(1))];
        let mut done = 0;
        while done < len {
            let n = buf.len().min(len - done);
            self.region.read_at(off + done, &mut buf[..n]).unwrap();
            h.update(&buf[..n]);
            done += n;
        }
        hex::encode(h.finalize())
    }

    /// Fills the region with `byte`.
    pub fn clear(&self, byte: u8) {
        let chunk = vec![byte; 16 << 20];
        let mut off = 0;
        while off < self.region.len() {
            let n = chunk.len().min(self.region.len() - off);
            self.region.write_at(off, &chunk[..n]).unwrap();
            off += n;
        }
    }
}

/// Deterministic pseudo-random bytes.
pub fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// SHA-256 of `b`, lowercase hex.
pub fn sha256(b: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(b))
}

/// The value of metric `name` (summed over its label sets; `name` may
/// carry labels, e.g. `m{tenant="alice"}`) in Prometheus text.
pub fn metric_value(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Open file descriptors of process `pid`.
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(Iterator::count)
        .unwrap_or(0)
}

/// Anonymous resident memory of process `pid` in KiB (`RssAnon`: what the
/// process allocated itself; shared tenant memory it maps is not counted).
pub fn rss_anon_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The S3 error code in an agent status.
pub fn s3_code(st: &tonic::Status) -> String {
    use tonic_types::StatusExt as _;
    st.get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

/// Reads an object straight from the target with aws-sdk-s3.
pub async fn sdk_get(c: &S3Client, bucket: &str, key: &str) -> Vec<u8> {
    c.get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .into_bytes()
        .to_vec()
}
