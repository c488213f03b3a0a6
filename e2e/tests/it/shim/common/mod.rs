//! Real processes for the shim's end-to-end tests: a storage-target and a
//! dpu-agent (through the shared harness, `s3dma_launcher::harness`), and
//! the host-shim binary with tenants mapped to uids.

#![allow(dead_code)]

pub(crate) use s3dma_launcher::harness as agent;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub(crate) use agent::{ALICE, Agent, AgentSpec, Target, create_bucket, data, put_as, sha256};

/// A uid no tenant has.
pub(crate) const STRANGER_UID: u32 = 4242;
/// The uid bob's processes run as (Debian's `nobody`).
pub(crate) const BOB_UID: u32 = 65534;

/// Turns a hang into a failure; not a performance threshold.
pub(crate) const HANG_GUARD: Duration = Duration::from_secs(120);

/// A host-shim process.
pub(crate) struct Shim {
    svc: agent::Service,
    pub socket: PathBuf,
    pub metrics: String,
    pub config: PathBuf,
    /// The network namespace it runs in (its metrics are read from there).
    netns: Option<String>,
}

/// How [`Shim::start_opts`] starts a shim; the default is what
/// [`Shim::start`] does.
#[derive(Default)]
pub(crate) struct ShimOpts {
    /// The IP its fabric endpoint listens on (targets connect to it);
    /// default 127.0.0.1.
    pub fabric_ip: Option<String>,
    /// A network namespace to run in (`ip netns exec NAME`).
    pub netns: Option<String>,
    /// Extra YAML under `agent:` (keys given here replace the defaults).
    pub agent_yaml: String,
    /// Extra YAML lines under `socket:`.
    pub socket_yaml: String,
    /// Extra YAML lines under alice's tenant entry.
    pub alice_yaml: String,
    /// Extra YAML lines under `metrics:`.
    pub metrics_yaml: String,
    /// Extra YAML lines under `fabric:`.
    pub fabric_yaml: String,
    /// Extra YAML lines under `cuda:`.
    pub cuda_yaml: String,
    /// Extra environment variables of the shim process.
    pub env: Vec<(String, String)>,
}

impl Shim {
    /// A shim in `dir` (made world-traversable so other uids reach the
    /// socket) for `agent`: alice = this process's uid, bob = [`BOB_UID`].
    pub(crate) fn start(dir: &Path, agent: &Agent) -> Shim {
        Shim::start_opts(dir, agent, ShimOpts::default())
    }

    /// A shim as [`Shim::start`] with `opts`.
    pub(crate) fn start_opts(dir: &Path, agent: &Agent, opts: ShimOpts) -> Shim {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        agent::write_private(&dir.join("fabric.key"), agent::FABRIC_KEY_HEX);
        agent::write_private(&dir.join("shim.token"), agent::SHIM_TOKEN);
        let me = nix::unistd::getuid().as_raw();
        let cfg = shim_config(dir, agent, &opts, me);
        let config = dir.join("shim.yaml");
        s3dma_launcher::configs::write(&config, &cfg).unwrap();
        let mut spec = agent::ServiceSpec::new(
            "host-shim",
            agent::bin_dir().join("host-shim"),
            config.clone(),
            dir.join("shim.log"),
            &["host-shim listening on ", "metrics on "],
        )
        .env("RUST_LOG", "info");
        spec.env.extend(opts.env);
        spec.wrap = opts
            .netns
            .iter()
            .flat_map(|n| ["ip".into(), "netns".into(), "exec".into(), n.clone()])
            .collect();
        let svc = agent::Service::start(spec);
        Shim {
            metrics: svc.line(1).to_owned(),
            svc,
            socket: dir.join("shim.sock"),
            config,
            netns: opts.netns,
        }
    }

    pub(crate) fn log(&self) -> String {
        self.svc.log()
    }

    /// The process id (None once killed).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.svc.pid()
    }

    pub(crate) fn kill9(&mut self) {
        self.svc.kill9();
    }

    /// One metric's value (summed over its label sets), from `/metrics`.
    pub(crate) fn metric(&self, name: &str) -> f64 {
        agent::metric_value(&scrape(self.netns.as_deref(), &self.metrics), name)
    }
}

/// `GET /metrics` at `url` (from network namespace `ns` when given).
pub(crate) fn scrape(ns: Option<&str>, url: &str) -> String {
    s3dma_testkit::netns::scrape(ns, url)
}

/// Runs the host-shim binary on `config` (under `wrap`, e.g. `ip netns
/// exec NS`, when not empty) and expects it to refuse to start: its
/// stderr.
pub(crate) async fn refused_start(wrap: &[String], config: &Path) -> String {
    let mut cmd =
        tokio::process::Command::from(agent::wrapped(wrap, &agent::bin_dir().join("host-shim")));
    let out = cmd
        .arg("--config")
        .arg(config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(HANG_GUARD, out)
        .await
        .expect("hung past the hang guard")
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{err}");
    err
}

/// storage-target + dpu-agent (fixed port, so it can restart) + host-shim.
pub(crate) struct Stack {
    pub target: Target,
    pub agent: Agent,
    pub shim: Shim,
    pub dir: tempfile::TempDir,
}

impl Stack {
    pub(crate) async fn start() -> Stack {
        Stack::start_with(|_| {}).await
    }

    pub(crate) async fn start_with(tweak: impl FnOnce(&mut AgentSpec)) -> Stack {
        Stack::start_opts(tweak, ShimOpts::default()).await
    }

    /// A stack whose shim starts with `opts`.
    pub(crate) async fn start_opts(tweak: impl FnOnce(&mut AgentSpec), opts: ShimOpts) -> Stack {
        let target = Target::start(true);
        for b in ["alice-data", "bob-data", "shared"] {
            target.create_bucket(b).await;
        }
        let mut spec = AgentSpec::one(&target);
        spec.listen = format!("127.0.0.1:{}", agent::free_port());
        tweak(&mut spec);
        let agent = Agent::start(spec);
        let dir = tempfile::tempdir().unwrap();
        let shim = Shim::start_opts(dir.path(), &agent, opts);
        Stack {
            target,
            agent,
            shim,
            dir,
        }
    }

    pub(crate) async fn client(&self) -> s3dma_client::Client {
        s3dma_client::Client::connect(&self.shim.socket)
            .await
            .unwrap()
    }
}

/// `text`'s lines indented by `n` spaces, each ending in a newline.
/// The shim's configuration in `dir` for `agent`: the socket (mode 0666,
/// then `opts.socket_yaml`), the agent with the shim's token and the test
/// timeouts (connect 1000 ms, request 120 s, backoff 50..500 ms, then
/// `opts.agent_yaml`), a tcp fabric endpoint on `opts.fabric_ip`, alice
/// (`me`; 64 buffers, 4GiB, then `opts.alice_yaml`) and bob ([`BOB_UID`];
/// 4 buffers, 64MiB), metrics on loopback (then `opts.metrics_yaml`).
fn shim_config(dir: &Path, agent: &Agent, opts: &ShimOpts, me: u32) -> host_shim::config::Config {
    use host_shim::config::{
        AgentConfig, ByteSize, Config, CudaConfig, FabricConfig, LeaseConfig, MetricsConfig,
        SocketConfig, TenantConfig,
    };
    use s3dma_launcher::harness::overlay;
    let mut socket = SocketConfig::new(dir.join("shim.sock"));
    socket.mode = "0666".into();
    let mut agent_cfg = AgentConfig::new(format!("http://{}", agent.addr));
    agent_cfg.token_file = Some(dir.join("shim.token"));
    agent_cfg.connect_timeout_ms = 1000;
    agent_cfg.request_timeout_secs = 120;
    agent_cfg.backoff_initial_ms = 50;
    agent_cfg.backoff_max_ms = 500;
    let mut alice = TenantConfig::new("alice");
    alice.uids = vec![me];
    alice.max_buffers = 64;
    alice.max_buffer_bytes = ByteSize(4 << 30);
    let mut bob = TenantConfig::new("bob");
    bob.uids = vec![BOB_UID];
    bob.max_buffers = 4;
    bob.max_buffer_bytes = ByteSize(64 << 20);
    let fabric_ip: std::net::IpAddr = opts
        .fabric_ip
        .as_deref()
        .unwrap_or("127.0.0.1")
        .parse()
        .unwrap();
    Config {
        socket: overlay(&socket, &opts.socket_yaml),
        agent: overlay(&agent_cfg, &opts.agent_yaml),
        fabric: overlay(
            &FabricConfig {
                backend: agent::backend(),
                ..FabricConfig::new(
                    std::net::SocketAddr::new(fabric_ip, 0),
                    dir.join("fabric.key"),
                )
            },
            &opts.fabric_yaml,
        ),
        tenants: vec![overlay(&alice, &opts.alice_yaml), bob],
        leases: LeaseConfig::default(),
        cuda: overlay(&CudaConfig::default(), &opts.cuda_yaml),
        metrics: overlay(
            &MetricsConfig {
                address: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
                ..MetricsConfig::default()
            },
            &opts.metrics_yaml,
        ),
        // The single-threaded runtime, as a local stack on a small host runs
        // it (the agent's suites cover the multi-threaded one).
        runtime: s3dma_config::RuntimeConfig {
            worker_threads: Some(1),
        },
    }
}

/// Runs this test binary's `#[ignore]`d test `name` as `uid`, with `env`;
/// returns its combined output, panicking (with it) when the child failed.
/// The binary is copied next to the socket so any uid can execute it.
pub(crate) fn run_test_as(dir: &Path, uid: u32, name: &str, env: &[(&str, String)]) -> String {
    let mut cmd = s3dma_testkit::self_test_command(dir, Some(uid), name);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = s3dma_testkit::spawn_retrying(&mut cmd)
        .wait_with_output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child test {name} as uid {uid} failed:\n{text}"
    );
    assert!(
        text.contains("1 passed"),
        "child test {name} did not run:\n{text}"
    );
    text
}

/// The shim's tenant API over its socket without the client crate (to send
/// what the safe client never would, such as another tenant's buffer id).
pub(crate) async fn raw_tenant_client(
    socket: &Path,
) -> s3dma_proto::tenant::v1::tenant_client::TenantClient<tonic::transport::Channel> {
    try_raw_tenant_client(socket).await.unwrap()
}

/// [`raw_tenant_client`], or the connection's error.
pub(crate) async fn try_raw_tenant_client(
    socket: &Path,
) -> Result<
    s3dma_proto::tenant::v1::tenant_client::TenantClient<tonic::transport::Channel>,
    tonic::transport::Error,
> {
    let path = socket.to_owned();
    tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .map(s3dma_proto::tenant::v1::tenant_client::TenantClient::new)
}

/// `(grpc code, ErrorInfo reason)` of a status.
pub(crate) fn reason(st: &tonic::Status) -> (tonic::Code, String) {
    use tonic_types::StatusExt as _;
    (
        st.code(),
        st.get_details_error_info()
            .map(|i| i.reason)
            .unwrap_or_default(),
    )
}

/// Network namespaces for fault tests (root only): a "host" namespace
/// (dpu-agent, host-shim) and a "storage" namespace (storage-target) joined
/// by a veth pair that a test can take down, delete and bring back.
pub(crate) mod netns {
    use std::process::Command;

    /// Runs `ip ARGS`, panicking with its output when it fails.
    pub(crate) fn ip(args: &[&str]) {
        let out = Command::new("ip")
            .args(args)
            .output()
            .expect("the `ip` command (iproute2)");
        assert!(
            out.status.success(),
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Two namespaces and the veth between them; both are deleted on drop
    /// (also when the test panics). Names carry this process's id, so
    /// concurrent runs never collide, and namespaces left behind by a
    /// killed run are swept by the next one.
    pub(crate) struct NetnsPair {
        /// The host side (agent, shim, and the tenant through the socket).
        pub host: String,
        /// The storage side (storage-target).
        pub storage: String,
        /// The host side's veth (`host_ip`).
        pub host_if: String,
        storage_if: String,
        /// Addresses on the veth.
        pub host_ip: String,
        pub storage_ip: String,
    }

    const PREFIX: &str = "s3dma-fault-";

    impl NetnsPair {
        pub(crate) fn create() -> NetnsPair {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            sweep_stale();
            let pid = std::process::id();
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let pair = NetnsPair {
                host: format!("{PREFIX}{pid}-{n}-host"),
                storage: format!("{PREFIX}{pid}-{n}-storage"),
                // Interface names are at most 15 bytes.
                host_if: format!("s3f{}{n}h", pid % 10_000_000),
                storage_if: format!("s3f{}{n}s", pid % 10_000_000),
                host_ip: "10.203.0.1".into(),
                storage_ip: "10.203.0.2".into(),
            };
            // From here on, drop cleans up whatever was made.
            ip(&["netns", "add", &pair.host]);
            ip(&["netns", "add", &pair.storage]);
            for ns in [&pair.host, &pair.storage] {
                ip(&["-n", ns, "link", "set", "lo", "up"]);
            }
            pair.link_create();
            pair
        }

        /// Creates the veth pair (again, after [`NetnsPair::link_delete`]).
        pub(crate) fn link_create(&self) {
            ip(&[
                "-n",
                &self.host,
                "link",
                "add",
                &self.host_if,
                "type",
                "veth",
                "peer",
                "name",
                &self.storage_if,
                "netns",
                &self.storage,
            ]);
            for (ns, dev, addr) in [
                (&self.host, &self.host_if, &self.host_ip),
                (&self.storage, &self.storage_if, &self.storage_ip),
            ] {
                ip(&["-n", ns, "addr", "add", &format!("{addr}/30"), "dev", dev]);
                ip(&["-n", ns, "link", "set", dev, "up"]);
            }
        }

        /// Takes the host side's end down: packets stop, connections stall.
        pub(crate) fn link_down(&self) {
            ip(&["-n", &self.host, "link", "set", &self.host_if, "down"]);
        }

        /// Brings it back up (the kernel restores the subnet route).
        pub(crate) fn link_up(&self) {
            ip(&["-n", &self.host, "link", "set", &self.host_if, "up"]);
        }

        /// Deletes the veth pair (both ends, their addresses and routes).
        pub(crate) fn link_delete(&self) {
            ip(&["-n", &self.host, "link", "del", &self.host_if]);
        }

        /// `ip netns exec NAME` as a command prefix.
        pub(crate) fn wrap(ns: &str) -> Vec<String> {
            ["ip", "netns", "exec", ns]
                .into_iter()
                .map(str::to_owned)
                .collect()
        }
    }

    impl Drop for NetnsPair {
        fn drop(&mut self) {
            // Deleting a namespace deletes the veth end inside it (and so
            // the pair). Processes still inside keep it alive until they exit.
            for ns in [&self.host, &self.storage] {
                let _ = Command::new("ip").args(["netns", "del", ns]).output();
            }
        }
    }

    /// Deletes this suite's namespaces whose process is gone.
    fn sweep_stale() {
        let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
            return;
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or_default();
            let Some(pid) = name
                .strip_prefix(PREFIX)
                .and_then(|r| r.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = Command::new("ip").args(["netns", "del", name]).output();
            }
        }
    }

    /// Sockets opened from inside a namespace: the kit's.
    pub(crate) use s3dma_testkit::netns::run_in;
}

/// Whether this process may create namespaces and mounts. When it may not,
/// a root-only test skips (returns `false`) unless `CI` is set, where it
/// fails: CI runs as root and must run every test.
pub(crate) fn root_or_skip(test: &str) -> bool {
    s3dma_testkit::root_or_skip(test, "network namespaces, tmpfs mounts")
}

/// A tmpfs of `size` bytes mounted on a fresh directory; unmounted on drop.
pub(crate) struct Tmpfs {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    pub(crate) fn mount(size: u64) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fs");
        std::fs::create_dir(&path).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output()
            .expect("the `mount` command (util-linux)");
        assert!(
            out.status.success(),
            "mount tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { path, _dir: dir }
    }

    /// Free bytes (statvfs).
    pub(crate) fn free(&self) -> u64 {
        let st = nix::sys::statvfs::statvfs(&self.path).unwrap();
        st.blocks_available() * st.fragment_size()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a process still holding a file there cannot keep it mounted.
        let _ = Command::new("umount").arg("-l").arg(&self.path).output();
    }
}
