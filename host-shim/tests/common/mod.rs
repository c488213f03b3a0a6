//! Real processes for the shim's end-to-end tests: a storage-target and a
//! dpu-agent (through the agent's own test harness), and the host-shim
//! binary with tenants mapped to uids.

#![allow(dead_code)]

#[path = "../../../dpu-agent/tests/common/mod.rs"]
pub mod agent;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub use agent::{ALICE, Agent, AgentSpec, Target, data, sha256};

/// A uid no tenant has.
pub const STRANGER_UID: u32 = 4242;
/// The uid bob's processes run as (Debian's `nobody`).
pub const BOB_UID: u32 = 65534;

/// Turns a hang into a failure; not a performance threshold.
pub const HANG_GUARD: Duration = Duration::from_secs(120);

/// A host-shim process.
pub struct Shim {
    child: Option<Child>,
    pub socket: PathBuf,
    pub metrics: String,
    pub config: PathBuf,
    log: PathBuf,
}

impl Shim {
    /// A shim in `dir` (made world-traversable so other uids reach the
    /// socket) for `agent`: alice = this process's uid, bob = [`BOB_UID`].
    pub fn start(dir: &Path, agent: &Agent) -> Shim {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.join("fabric.key"), agent::FABRIC_KEY_HEX).unwrap();
        std::fs::write(dir.join("shim.token"), agent::SHIM_TOKEN).unwrap();
        let me = nix::unistd::getuid().as_raw();
        let cfg = format!(
            r#"socket:
  path: {d}/shim.sock
  mode: "0666"
agent:
  endpoint: http://{agent}
  token_file: {d}/shim.token
  connect_timeout_ms: 1000
  request_timeout_secs: 120
  backoff_initial_ms: 50
  backoff_max_ms: 500
fabric:
  backend: tcp
  listen: 127.0.0.1:0
  fabric_key_file: {d}/fabric.key
tenants:
  - name: alice
    uids: [{me}]
    max_buffers: 64
    max_buffer_bytes: 4GiB
  - name: bob
    uids: [{bob}]
    max_buffers: 4
    max_buffer_bytes: 64MiB
metrics:
  address: 127.0.0.1:0
"#,
            d = dir.display(),
            agent = agent.addr,
            bob = BOB_UID,
        );
        let config = dir.join("shim.yaml");
        std::fs::write(&config, cfg).unwrap();
        let mut s = Shim {
            child: None,
            socket: dir.join("shim.sock"),
            metrics: String::new(),
            config,
            log: dir.join("shim.log"),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut child = Command::new(agent::bin_dir().join("host-shim"))
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("host-shim binary (cargo build -p host-shim)");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let mut metrics = None;
        let mut listening = false;
        while metrics.is_none() || !listening {
            line.clear();
            if out.read_line(&mut line).unwrap() == 0 {
                panic!("host-shim exited early; its log:\n{}", self.log());
            }
            if line.starts_with("host-shim listening on ") {
                listening = true;
            }
            if let Some(m) = line.trim().strip_prefix("metrics on ") {
                metrics = Some(m.to_owned());
            }
        }
        std::thread::spawn(move || for _ in out.lines() {});
        self.metrics = metrics.unwrap();
        self.child = Some(child);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// One metric's value (summed over its label sets), from `/metrics`.
    pub fn metric(&self, name: &str) -> f64 {
        let addr = self
            .metrics
            .trim_start_matches("http://")
            .trim_end_matches("/metrics");
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        use std::io::{Read as _, Write as _};
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text.lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// storage-target + dpu-agent (fixed port, so it can restart) + host-shim.
pub struct Stack {
    pub target: Target,
    pub agent: Agent,
    pub shim: Shim,
    pub dir: tempfile::TempDir,
}

impl Stack {
    pub async fn start() -> Stack {
        Stack::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut AgentSpec)) -> Stack {
        let target = Target::start(true);
        for b in ["alice-data", "bob-data", "shared"] {
            target.create_bucket(b).await;
        }
        let mut spec = AgentSpec::one(&target);
        spec.listen = format!("127.0.0.1:{}", agent::free_port());
        tweak(&mut spec);
        let agent = Agent::start(spec);
        let dir = tempfile::tempdir().unwrap();
        let shim = Shim::start(dir.path(), &agent);
        Stack {
            target,
            agent,
            shim,
            dir,
        }
    }

    pub async fn client(&self) -> s3dma_client::Client {
        s3dma_client::Client::connect(&self.shim.socket)
            .await
            .unwrap()
    }
}

/// Runs this test binary's `#[ignore]`d test `name` as `uid`, with `env`;
/// returns its combined output, panicking (with it) when the child failed.
/// The binary is copied next to the socket so any uid can execute it.
pub fn run_test_as(dir: &Path, uid: u32, name: &str, env: &[(&str, String)]) -> String {
    let exe = std::env::current_exe().unwrap();
    let copy = dir.join(format!("test-bin-{uid}"));
    if !copy.exists() {
        std::fs::copy(&exe, &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut cmd = Command::new(&copy);
    cmd.args([
        name,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .uid(uid)
    .gid(uid)
    .current_dir(dir)
    .env("HOME", dir);
    use std::os::unix::process::CommandExt as _;
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
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
pub async fn raw_tenant_client(
    socket: &Path,
) -> s3dma_proto::tenant::v1::tenant_client::TenantClient<tonic::transport::Channel> {
    let path = socket.to_owned();
    let ch = tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .unwrap();
    s3dma_proto::tenant::v1::tenant_client::TenantClient::new(ch)
}

/// `(grpc code, ErrorInfo reason)` of a status.
pub fn reason(st: &tonic::Status) -> (tonic::Code, String) {
    use tonic_types::StatusExt as _;
    (
        st.code(),
        st.get_details_error_info()
            .map(|i| i.reason)
            .unwrap_or_default(),
    )
}
