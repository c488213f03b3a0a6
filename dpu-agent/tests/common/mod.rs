//! Real processes for the agent's integration tests: storage-targets (the
//! workspace's binary), dpu-agents (this crate's binary), a moto S3 server
//! (third-party S3, from the test virtualenv), and a tenant that holds
//! tcp-fabric memory and calls the agent's gRPC API.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
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

pub fn fabric_key() -> FabricKey {
    fabric::config::parse_fabric_key(FABRIC_KEY_HEX).unwrap()
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
pub struct Target {
    child: Option<Child>,
    /// `http://IP:PORT`.
    pub endpoint: String,
    /// `http://IP:PORT/metrics` (a new port after each restart).
    pub metrics: String,
    pub dir: tempfile::TempDir,
    config: PathBuf,
    log: PathBuf,
    /// Command prefix the binary runs under (e.g. `ip netns exec NAME`).
    wrap: Vec<String>,
    /// The IP of `listen:`.
    listen_ip: String,
}

/// How [`Target::start_opts`] starts a target; [`TargetOpts::new`] gives
/// what [`Target::start`] does.
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
}

impl TargetOpts {
    pub fn new(rdma: bool) -> TargetOpts {
        TargetOpts {
            rdma,
            listen_ip: "127.0.0.1".into(),
            wrap: Vec::new(),
            data_dir: None,
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
        } = opts;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("fabric.key");
        write_private(&key, FABRIC_KEY_HEX);
        let cfg = format!(
            r#"listen: {ip}:0
region: us-east-1
data_dir: {data}
metrics_listen: {ip}:0
users:
  - access_key_id: {aak}
    secret: {ask}
    buckets:
      - name: "*"
        access: read-write
  - access_key_id: {bak}
    secret: {bsk}
    buckets:
      - name: "*"
        access: read-write
  - access_key_id: {mak}
    secret: {msk}
    buckets:
      - name: "*"
        access: read-write
rdma:
  mode: {mode}
  fabric_key_file: {key}
  connect_timeout_ms: 2000
"#,
            ip = listen_ip,
            data = data_dir
                .unwrap_or_else(|| dir.path().join("data"))
                .display(),
            aak = ALICE.0,
            ask = ALICE.1,
            bak = BOB.0,
            bsk = BOB.1,
            mak = ADMIN.0,
            msk = ADMIN.1,
            mode = if rdma { "enabled" } else { "disabled" },
            key = key.display(),
        );
        let config = dir.path().join("target.yaml");
        std::fs::write(&config, cfg).unwrap();
        let log = dir.path().join("target.log");
        let mut t = Target {
            child: None,
            endpoint: String::new(),
            metrics: String::new(),
            dir,
            config,
            log,
            wrap,
            listen_ip,
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
            // Restart on the same port so the agent's config stays valid.
            // Only the `listen:` line (not `metrics_listen:`, which keeps
            // port 0), also on a second restart.
            let text = std::fs::read_to_string(&self.config).unwrap();
            let ip = &self.listen_ip;
            let text: String = text
                .lines()
                .map(|l| {
                    if l.starts_with("listen: ") {
                        format!("listen: {ip}:{p}\n")
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect();
            std::fs::write(&self.config, text).unwrap();
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

    pub fn port(&self) -> u16 {
        self.endpoint.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// The process id (None while killed).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

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

    pub fn s3(&self, (ak, sk): (&str, &str)) -> S3Client {
        s3_client(&self.endpoint, ak, sk)
    }

    pub async fn create_bucket(&self, name: &str) {
        self.s3(ADMIN)
            .create_bucket()
            .bucket(name)
            .send()
            .await
            .unwrap();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `bin` as a command, run under the prefix `wrap` when it is not empty.
fn wrapped(wrap: &[String], bin: &Path) -> Command {
    match wrap.split_first() {
        None => Command::new(bin),
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin);
            c
        }
    }
}

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
pub struct Moto {
    child: Option<Child>,
    pub endpoint: String,
}

impl Moto {
    pub fn start() -> Moto {
        let venv = workspace_root().join(".venv/bin/moto_server");
        assert!(
            venv.exists(),
            "{} is missing: run `bash .ci/setup.sh` (it installs moto from tests/requirements.txt)",
            venv.display()
        );
        let port = free_port();
        let child = Command::new(venv)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let endpoint = format!("http://127.0.0.1:{port}");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "moto did not start");
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

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A target entry of the agent's config.
pub struct TargetSpec {
    pub name: &'static str,
    pub endpoint: String,
    pub buckets: Vec<&'static str>,
    pub rdma: bool,
}

/// Knobs of a test agent.
pub struct AgentSpec {
    pub targets: Vec<TargetSpec>,
    /// Extra YAML under `transfer:`.
    pub transfer: String,
    /// Extra YAML under alice's `quotas:`.
    pub alice_quotas: String,
    pub rust_log: &'static str,
    /// `listen.address` (a fixed port survives restarts).
    pub listen: String,
    /// Command prefix the binary runs under (e.g. `ip netns exec NAME`;
    /// it must exec the binary). Default: none.
    pub wrap: Vec<String>,
}

impl AgentSpec {
    pub fn new(targets: Vec<TargetSpec>) -> AgentSpec {
        AgentSpec {
            targets,
            transfer: String::new(),
            alice_quotas: String::new(),
            rust_log: "info",
            listen: "127.0.0.1:0".into(),
            wrap: Vec::new(),
        }
    }

    pub fn one(t: &Target) -> AgentSpec {
        AgentSpec::new(vec![TargetSpec {
            name: "local",
            endpoint: t.endpoint.clone(),
            buckets: vec!["*"],
            rdma: true,
        }])
    }
}

/// A dpu-agent process.
pub struct Agent {
    child: Option<Child>,
    pub addr: String,
    pub metrics: String,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    log: PathBuf,
    stdout_log: PathBuf,
    rust_log: &'static str,
    wrap: Vec<String>,
}

impl Agent {
    pub fn start(spec: AgentSpec) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        write_private(&p.join("fabric.key"), FABRIC_KEY_HEX);
        write_private(&p.join("alice.secret"), ALICE.1);
        write_private(&p.join("bob.secret"), BOB.1);
        write_private(&p.join("shim.token"), SHIM_TOKEN);
        write_private(&p.join("other-shim.token"), "other-shim-token-abcdef0123");
        let mut targets = String::new();
        for t in &spec.targets {
            targets.push_str(&format!(
                "  - name: {}\n    endpoint: {}\n    buckets: [{}]\n    rdma: {}\n",
                t.name,
                t.endpoint,
                t.buckets
                    .iter()
                    .map(|b| format!("\"{b}\""))
                    .collect::<Vec<_>>()
                    .join(", "),
                t.rdma
            ));
        }
        let cfg = format!(
            r#"listen:
  address: {listen}
shims:
  - name: host1
    token_file: {d}/shim.token
    tenants: [alice, bob]
  - name: host2
    token_file: {d}/other-shim.token
    tenants: [bob]
tenants:
  - name: alice
    access_key_id: {aak}
    secret_access_key_file: {d}/alice.secret
    allow:
      - bucket: alice-data
        read: true
        write: true
      - bucket: shared
        read: true
        write: true
    quotas:{aq}  - name: bob
    access_key_id: {bak}
    secret_access_key_file: {d}/bob.secret
    allow:
      - bucket: bob-data
        read: true
        write: true
      - bucket: shared
        prefix: datasets/
        read: true
targets:
{targets}fabric:
  backend: tcp
  fabric_key_file: {d}/fabric.key
  staging_buffers: 16
  staging_buffer_size: 1MiB
transfer:
{tr}metrics:
  address: 127.0.0.1:0
"#,
            d = p.display(),
            listen = spec.listen,
            aak = ALICE.0,
            bak = BOB.0,
            aq = if spec.alice_quotas.is_empty() {
                " {}\n".to_owned()
            } else {
                spec.alice_quotas
                    .lines()
                    .map(|l| format!("\n      {l}"))
                    .collect::<String>()
                    + "\n"
            },
            tr = {
                // Test defaults, unless the spec sets the same key.
                let mut lines: Vec<String> = spec.transfer.lines().map(str::to_owned).collect();
                for d in [
                    "request_timeout_secs: 120",
                    "backoff_initial_ms: 20",
                    "backoff_max_ms: 200",
                ] {
                    let key = d.split(':').next().unwrap();
                    if !lines.iter().any(|l| l.split(':').next() == Some(key)) {
                        lines.push(d.to_owned());
                    }
                }
                lines.iter().map(|l| format!("  {l}\n")).collect::<String>()
            },
        );
        let config = p.join("agent.yaml");
        std::fs::write(&config, cfg).unwrap();
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

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// stderr and stdout so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
            + &std::fs::read_to_string(&self.stdout_log).unwrap_or_default()
    }

    pub async fn metrics_text(&self) -> String {
        let url = self.metrics.clone();
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

    pub async fn client(&self) -> Shim {
        self.client_with(SHIM_TOKEN).await
    }

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
#[derive(Clone)]
pub struct Shim {
    pub inner: AgentClient<Channel>,
    pub token: String,
}

impl Shim {
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

/// Tenant memory on the tcp fabric, served by its own endpoint.
pub struct Memory {
    pub endpoint: Endpoint,
    pub region: Region,
}

impl Memory {
    pub async fn new(len: usize) -> Memory {
        let domain = Domain::tcp();
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

    pub fn fill(&self, off: usize, data: &[u8]) {
        for (i, c) in data.chunks(16 << 20).enumerate() {
            self.region.write_at(off + i * (16 << 20), c).unwrap();
        }
    }

    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        for (i, c) in v.chunks_mut(16 << 20).enumerate() {
            self.region.read_at(off + i * (16 << 20), c).unwrap();
        }
        v
    }

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
