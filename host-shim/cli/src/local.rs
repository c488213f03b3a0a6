//! `s3dma local`: storage-target, dpu-agent and host-shim on this machine.
//!
//! Everything is loopback-only over the `tcp` fabric:
//!
//! 1. `DIR` (default `$XDG_DATA_HOME/s3dma/local`, else
//!    `~/.local/share/s3dma/local`) holds `data/` (the storage-target's
//!    store), `secrets/` (the tenant's access key id and secret, the shim's
//!    bearer token and the fabric key; created on the first run and reused
//!    afterwards, so the data stays readable), the three generated
//!    configuration files (rewritten on every run: the ports change) and
//!    `logs/` (each child's stderr and stdout). Everything is private:
//!    `DIR` and its directories are made 0700 (an existing `DIR` that is
//!    more open, say 0755, is tightened; one owned by another user, or a
//!    symlink, is refused) and every file written there is 0600.
//! 2. storage-target starts on `127.0.0.1:0`; its stdout line
//!    `storage-target listening on http://ADDR` gives the address. The bucket
//!    (default `data`) is created with a SigV4-signed S3 CreateBucket (an
//!    existing one is kept).
//! 3. dpu-agent starts on `127.0.0.1:0` with that target and one tenant,
//!    `local`, allowed to read and write every bucket; its stdout line
//!    `dpu-agent listening on ADDR` gives the address.
//! 4. host-shim starts on the socket (mode 0600), mapping the invoking uid to
//!    tenant `local`; it is up once the socket accepts connections. The
//!    socket's directory (`$XDG_RUNTIME_DIR/s3dma/` or `/tmp/s3dma-<uid>/`
//!    by default) is made 0700; when it already exists it must be ours and
//!    not a symlink, else local mode refuses to start (another user who
//!    created `/tmp/s3dma-<uid>/` first could replace the socket). A
//!    `--socket` elsewhere needs a directory that is ours (or root's) and
//!    that neither group nor others may write to (not `/tmp` itself).
//! 5. The line `s3dma local ready: socket=<absolute path>` goes to stdout,
//!    then help for humans.
//!
//! The children run in their own process group, so a terminal's Ctrl-C
//! reaches only `s3dma local`, which then stops them in reverse order
//! (SIGTERM, then SIGKILL after [`STOP_TIMEOUT`]), removes the socket and
//! exits 0. When a child dies on its own the others are stopped and the
//! error carries the tail of its log. A `kill -9` of `s3dma local` leaves
//! the children running (their pids are printed).
//!
//! [`Stack`] does the starting and stopping, so `s3dma bench` and
//! `s3dma soak` start the same stack in a temporary directory (with metrics
//! endpoints on free loopback ports).
//!
//! The configuration text comes from pure functions
//! ([`storage_target_yaml`], [`dpu_agent_yaml`], [`host_shim_yaml`]) whose
//! output the unit tests parse with the services' own parsers.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, anyhow, bail};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use s3dma_service::private;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep, timeout};

/// How long storage-target may take to print its address (it rebuilds its
/// listing index from the data directory first).
pub const TARGET_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long dpu-agent may take to print its address.
pub const AGENT_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long host-shim may take until its socket accepts connections.
pub const SHIM_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a child may take to exit after SIGTERM before it gets SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The SigV4 region the local storage-target uses.
pub const REGION: &str = "us-east-1";
/// The tenant's name in the generated configurations.
pub const TENANT: &str = "local";

/// What `s3dma local` was asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// State directory (`None` = [`default_dir`]).
    pub dir: Option<PathBuf>,
    /// Shim socket (`None` = [`default_socket`]).
    pub socket: Option<PathBuf>,
    /// Bucket created at start-up if missing.
    pub bucket: String,
}

/// `$XDG_DATA_HOME/s3dma/local`, else `$HOME/.local/share/s3dma/local`
/// (relative or empty values are ignored, as the XDG spec says).
#[must_use]
pub fn default_dir(xdg_data_home: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    let abs = |v: Option<OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(d) = abs(xdg_data_home) {
        return Some(d.join("s3dma").join("local"));
    }
    abs(home).map(|h| h.join(".local/share/s3dma/local"))
}

/// `$XDG_RUNTIME_DIR/s3dma/shim.sock`, else `/tmp/s3dma-<uid>/shim.sock`.
#[must_use]
pub fn default_socket(xdg_runtime_dir: Option<OsString>, uid: u32) -> PathBuf {
    match xdg_runtime_dir
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
    {
        Some(d) => d.join("s3dma").join("shim.sock"),
        None => PathBuf::from(format!("/tmp/s3dma-{uid}/shim.sock")),
    }
}

/// Where things live under the state directory.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The state directory itself.
    pub dir: PathBuf,
    /// The storage-target's data directory.
    pub data_dir: PathBuf,
    /// One log file per child.
    pub logs_dir: PathBuf,
    /// The secret files (0700 directory, 0600 files).
    pub secrets_dir: PathBuf,
    /// The tenant's S3 access key id.
    pub access_key_file: PathBuf,
    /// The tenant's S3 secret access key.
    pub secret_key_file: PathBuf,
    /// The shim's bearer token towards the agent.
    pub shim_token_file: PathBuf,
    /// The pre-shared fabric key (64 hex digits).
    pub fabric_key_file: PathBuf,
    /// Generated storage-target configuration.
    pub target_config: PathBuf,
    /// Generated dpu-agent configuration.
    pub agent_config: PathBuf,
    /// Generated host-shim configuration.
    pub shim_config: PathBuf,
}

impl Layout {
    /// The layout under `dir` (which should be absolute).
    #[must_use]
    pub fn new(dir: &Path) -> Layout {
        let secrets = dir.join("secrets");
        Layout {
            dir: dir.to_path_buf(),
            data_dir: dir.join("data"),
            logs_dir: dir.join("logs"),
            access_key_file: secrets.join("tenant.access-key-id"),
            secret_key_file: secrets.join("tenant.secret"),
            shim_token_file: secrets.join("shim.token"),
            fabric_key_file: secrets.join("fabric.key"),
            secrets_dir: secrets,
            target_config: dir.join("storage-target.yaml"),
            agent_config: dir.join("dpu-agent.yaml"),
            shim_config: dir.join("host-shim.yaml"),
        }
    }

    fn log(&self, name: &str) -> PathBuf {
        self.logs_dir.join(format!("{name}.log"))
    }
}

/// A YAML double-quoted scalar holding `s` (paths may hold spaces, `#`, `:`).
fn q(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn qp(p: &Path) -> String {
    q(&p.to_string_lossy())
}

/// The storage-target's configuration: loopback, a free port, RDMA over the
/// tcp fabric, one user (the tenant's key) with read-write on every bucket;
/// with `metrics`, Prometheus metrics on another free loopback port.
#[must_use]
pub fn storage_target_yaml(l: &Layout, access_key_id: &str, metrics: bool) -> String {
    let mut text = format!(
        "# Generated by `s3dma local` on every start; edits are overwritten.
listen: 127.0.0.1:0
region: {region}
data_dir: {data}
users:
  - access_key_id: {key}
    secret_file: {secret}
    buckets:
      - name: \"*\"
        access: read-write
rdma:
  mode: enabled
  backend: tcp
  fabric_key_file: {fabric}
",
        region = REGION,
        data = qp(&l.data_dir),
        key = q(access_key_id),
        secret = qp(&l.secret_key_file),
        fabric = qp(&l.fabric_key_file),
    );
    if metrics {
        text.push_str("metrics_listen: 127.0.0.1:0\n");
    }
    text
}

/// The dpu-agent's configuration: loopback, a free port, one shim (bearer
/// token), tenant [`TENANT`] with read and write on every bucket, one target;
/// with `metrics`, Prometheus metrics on another free loopback port.
#[must_use]
pub fn dpu_agent_yaml(l: &Layout, access_key_id: &str, target_url: &str, metrics: bool) -> String {
    let mut text = format!(
        "# Generated by `s3dma local` on every start; edits are overwritten.
listen:
  address: 127.0.0.1:0
shims:
  - name: local
    token_file: {token}
    tenants: [{tenant}]
tenants:
  - name: {tenant}
    access_key_id: {key}
    secret_access_key_file: {secret}
    allow:
      - bucket: \"*\"
        read: true
        write: true
targets:
  - name: local
    endpoint: {target}
    region: {region}
    buckets: [\"*\"]
    rdma: true
fabric:
  backend: tcp
  fabric_key_file: {fabric}
",
        token = qp(&l.shim_token_file),
        tenant = TENANT,
        key = q(access_key_id),
        secret = qp(&l.secret_key_file),
        target = q(target_url),
        region = REGION,
        fabric = qp(&l.fabric_key_file),
    );
    if metrics {
        text.push_str(METRICS_SECTION);
    }
    text
}

/// The `metrics:` section of the agent's and the shim's configurations.
const METRICS_SECTION: &str = "metrics:\n  address: 127.0.0.1:0\n";

/// The host-shim's configuration: the socket (0600), the agent at
/// `agent_addr` (`IP:PORT`), a loopback fabric endpoint, and `uid` as
/// tenant [`TENANT`]; with `metrics`, Prometheus metrics on a free loopback
/// port.
#[must_use]
pub fn host_shim_yaml(
    l: &Layout,
    socket: &Path,
    agent_addr: &str,
    uid: u32,
    metrics: bool,
) -> String {
    let mut text = format!(
        "# Generated by `s3dma local` on every start; edits are overwritten.
socket:
  path: {socket}
  mode: \"0600\"
agent:
  endpoint: {endpoint}
  token_file: {token}
fabric:
  backend: tcp
  listen: 127.0.0.1:0
  fabric_key_file: {fabric}
tenants:
  - name: {tenant}
    uids: [{uid}]
",
        socket = qp(socket),
        endpoint = q(&format!("http://{agent_addr}")),
        token = qp(&l.shim_token_file),
        fabric = qp(&l.fabric_key_file),
        tenant = TENANT,
    );
    if metrics {
        text.push_str(METRICS_SECTION);
    }
    text
}

/// `storage-target listening on http://127.0.0.1:1234` → the URL.
#[must_use]
pub fn parse_target_line(line: &str) -> Option<&str> {
    let url = line.trim().strip_prefix("storage-target listening on ")?;
    url.starts_with("http://").then_some(url)
}

/// `dpu-agent listening on 127.0.0.1:1234` → `127.0.0.1:1234` (an
/// `http://` prefix is tolerated).
#[must_use]
pub fn parse_agent_line(line: &str) -> Option<&str> {
    let addr = line.trim().strip_prefix("dpu-agent listening on ")?;
    let addr = addr.strip_prefix("http://").unwrap_or(addr);
    (!addr.is_empty()).then_some(addr)
}

/// `metrics on http://127.0.0.1:1234/metrics` (printed by all three
/// services) → `127.0.0.1:1234`.
#[must_use]
pub fn parse_metrics_line(line: &str) -> Option<&str> {
    let addr = line
        .trim()
        .strip_prefix("metrics on http://")?
        .strip_suffix("/metrics")?;
    (!addr.is_empty()).then_some(addr)
}

/// The last `n` lines of `text`.
#[must_use]
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::fill(&mut buf[..]);
    hex::encode(buf)
}

/// Reads the secret in `path`, or creates it (0600) with `make()`.
fn ensure_secret(path: &Path, make: impl FnOnce() -> String) -> anyhow::Result<String> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut f) => {
            let value = make();
            f.write_all(value.as_bytes())
                .and_then(|()| f.sync_all())
                .with_context(|| format!("writing {}", path.display()))?;
            Ok(value)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
            if meta.permissions().mode() & 0o077 != 0 {
                fs::set_permissions(path, fs::Permissions::from_mode(0o600))
                    .with_context(|| format!("making {} private (0600)", path.display()))?;
            }
            let value = fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?
                .trim()
                .to_owned();
            if value.is_empty() {
                bail!(
                    "{} is empty; delete it to have a new one generated",
                    path.display()
                );
            }
            Ok(value)
        }
        Err(e) => Err(e).with_context(|| format!("creating {}", path.display())),
    }
}

/// Makes `dir` private: created 0700 (parents as needed) when missing,
/// tightened to 0700 when more open; refused when it is a symlink or belongs
/// to someone else.
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    private::ensure_private_dir(dir)
        .map_err(|e| anyhow!("{e}; pick another directory with --dir or --socket"))
}

/// Client options for a stack started here: its shim runs as us.
#[must_use]
pub fn own_shim() -> s3dma_client::ClientOptions {
    s3dma_client::ClientOptions::new().with_shim_uid(private::current_uid())
}

/// The tenant's S3 credentials, read from (or created in) the secrets dir.
#[derive(Clone)]
struct Secrets {
    access_key_id: String,
    secret_access_key: String,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

fn prepare_secrets(l: &Layout) -> anyhow::Result<Secrets> {
    private_dir(&l.secrets_dir)?;
    let access_key_id = ensure_secret(&l.access_key_file, || {
        format!("S3DMALOCAL{}", random_hex(5).to_uppercase())
    })?;
    let secret_access_key = ensure_secret(&l.secret_key_file, || random_hex(20))?;
    ensure_secret(&l.shim_token_file, || random_hex(32))?;
    ensure_secret(&l.fabric_key_file, || random_hex(32))?;
    Ok(Secrets {
        access_key_id,
        secret_access_key,
    })
}

/// Writes a 0600 file (an existing one is tightened; a symlink is not
/// followed).
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    private::write_private_file(path, text.as_bytes()).map_err(|e| anyhow!("{e}"))
}

/// Finds `name` next to the running `s3dma` (cargo puts every workspace
/// binary in one target directory), then on `PATH`.
fn find_binary(name: &str) -> Option<PathBuf> {
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        let p = dir.join(name);
        if p.is_file() {
            return Some(p);
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn find_binaries() -> anyhow::Result<[PathBuf; 3]> {
    let names = ["storage-target", "dpu-agent", "host-shim"];
    let found: Vec<Option<PathBuf>> = names.iter().map(|n| find_binary(n)).collect();
    let missing: Vec<&str> = names
        .iter()
        .zip(&found)
        .filter(|(_, f)| f.is_none())
        .map(|(n, _)| *n)
        .collect();
    if !missing.is_empty() {
        let here = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.display().to_string()))
            .unwrap_or_else(|| "this program's directory".into());
        bail!(
            "cannot find {} in {here} or on PATH; build them with `cargo build --release --bins` \
             (then run target/release/s3dma local)",
            missing.join(", ")
        );
    }
    let mut it = found.into_iter().flatten();
    match (it.next(), it.next(), it.next()) {
        (Some(a), Some(b), Some(c)) => Ok([a, b, c]),
        _ => Err(anyhow!("internal error: binaries vanished")),
    }
}

/// A started child.
#[derive(Debug)]
struct Proc {
    name: &'static str,
    child: Child,
    pid: u32,
    log: PathBuf,
}

impl Proc {
    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        let t = tail(&text, 20);
        if t.is_empty() {
            format!("(its log {} is empty)", self.log.display())
        } else {
            format!("last lines of {}:\n{t}", self.log.display())
        }
    }

    fn died(&self, status: ExitStatus, when: &str) -> anyhow::Error {
        anyhow!("{} {when} ({status}); {}", self.name, self.log_tail())
    }
}

fn append_line(path: &Path, line: &str) {
    if let Ok(mut f) = OpenOptions::new().append(true).open(path) {
        let _ = writeln!(f, "{line}");
    }
}

/// Copies the rest of a child's stdout into its log.
fn drain<R: AsyncRead + Unpin + Send + 'static>(mut lines: Lines<BufReader<R>>, log: PathBuf) {
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            append_line(&log, &line);
        }
    });
}

fn spawn(
    who: &str,
    name: &'static str,
    bin: &Path,
    config: &Path,
    log: PathBuf,
) -> anyhow::Result<(Proc, Lines<BufReader<ChildStdout>>)> {
    let stderr = private::create_private_file(&log).map_err(|e| anyhow!("{e}"))?;
    let mut child = Command::new(bin)
        .arg("--config")
        .arg(config)
        .stdin(Stdio::null())
        // Logs go to files: no colour codes in them.
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        // Our own Ctrl-C handling stops the children, in order.
        .process_group(0)
        // If s3dma panics, the children do not outlive it.
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let pid = child.id().unwrap_or(0);
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("{name}: no stdout pipe"))?;
    eprintln!("{who}: started {name} (pid {pid}), log {}", log.display());
    Ok((
        Proc {
            name,
            child,
            pid,
            log,
        },
        BufReader::new(stdout).lines(),
    ))
}

/// Reads `p`'s stdout until `parse` accepts a line; other lines go to its log.
async fn wait_for_line(
    p: &mut Proc,
    lines: &mut Lines<BufReader<ChildStdout>>,
    limit: Duration,
    parse: impl Fn(&str) -> Option<&str>,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + limit;
    loop {
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(line)) => {
                    append_line(&p.log, &line);
                    if let Some(v) = parse(&line) {
                        return Ok(v.to_owned());
                    }
                }
                Ok(None) | Err(_) => {
                    // Stdout closed: it is exiting.
                    let status = timeout(Duration::from_secs(5), p.child.wait()).await;
                    return Err(match status {
                        Ok(Ok(s)) => p.died(s, "exited during start-up"),
                        _ => anyhow!("{} closed its stdout during start-up; {}", p.name, p.log_tail()),
                    });
                }
            },
            status = p.child.wait() => {
                let status = status.with_context(|| format!("waiting for {}", p.name))?;
                return Err(p.died(status, "exited during start-up"));
            }
            () = tokio::time::sleep_until(deadline) => {
                bail!("{} did not start within {} s; {}", p.name, limit.as_secs(), p.log_tail());
            }
        }
    }
}

/// With `metrics`, reads `p`'s stdout until its `metrics on` line.
async fn wait_metrics(
    metrics: bool,
    p: &mut Proc,
    lines: &mut Lines<BufReader<ChildStdout>>,
) -> anyhow::Result<Option<String>> {
    if !metrics {
        return Ok(None);
    }
    wait_for_line(p, lines, AGENT_START_TIMEOUT, parse_metrics_line)
        .await
        .map(Some)
}

/// Polls until something accepts connections on `socket`.
async fn wait_for_socket(p: &mut Proc, socket: &Path, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = p.child.try_wait()? {
            return Err(p.died(status, "exited during start-up"));
        }
        if tokio::net::UnixStream::connect(socket).await.is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "{} did not open {} within {} s; {}",
                p.name,
                socket.display(),
                limit.as_secs(),
                p.log_tail()
            );
        }
        sleep(Duration::from_millis(50)).await;
    }
}

/// Creates `bucket` on the target with a SigV4-signed S3 CreateBucket; a
/// bucket the tenant already owns is fine.
async fn create_bucket(target_url: &str, secrets: &Secrets, bucket: &str) -> anyhow::Result<()> {
    let authority = target_url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("unexpected storage-target address {target_url}"))?
        .trim_end_matches('/');
    let url = format!("http://{authority}/{bucket}");
    let mut headers = vec![
        ("host".to_owned(), authority.to_owned()),
        ("content-length".to_owned(), "0".to_owned()),
    ];
    sign(&mut headers, "PUT", &url, secrets)?;
    let mut req = format!("PUT /{bucket} HTTP/1.1\r\n");
    for (k, v) in &headers {
        let _ = write!(req, "{k}: {v}\r\n");
    }
    req.push_str("connection: close\r\n\r\n");

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let io = async {
        let mut s = tokio::net::TcpStream::connect(authority).await?;
        s.write_all(req.as_bytes()).await?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).await?;
        Ok::<_, std::io::Error>(resp)
    };
    let resp = timeout(Duration::from_secs(30), io)
        .await
        .map_err(|_| {
            anyhow!("creating bucket {bucket}: storage-target did not answer within 30 s")
        })?
        .with_context(|| format!("creating bucket {bucket} at {target_url}"))?;
    let text = String::from_utf8_lossy(&resp);
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("creating bucket {bucket}: malformed reply from storage-target"))?;
    if status == 200 || text.contains("<Code>BucketAlreadyOwnedByYou</Code>") {
        return Ok(());
    }
    let code = between(&text, "<Code>", "</Code>").unwrap_or("?");
    let message = between(&text, "<Message>", "</Message>").unwrap_or("");
    bail!("creating bucket {bucket:?}: HTTP {status} {code}: {message}")
}

fn between<'a>(s: &'a str, a: &str, b: &str) -> Option<&'a str> {
    let start = s.find(a)? + a.len();
    let len = s[start..].find(b)?;
    Some(&s[start..start + len])
}

fn sign(
    headers: &mut Vec<(String, String)>,
    method: &str,
    url: &str,
    secrets: &Secrets,
) -> anyhow::Result<()> {
    use aws_sigv4::http_request::{
        PayloadChecksumKind, SignableBody, SignableRequest, SigningSettings,
    };
    let creds = aws_credential_types::Credentials::new(
        &secrets.access_key_id,
        &secrets.secret_access_key,
        None,
        None,
        "s3dma-local",
    );
    let identity: aws_smithy_runtime_api::client::identity::Identity = creds.into();
    let mut settings = SigningSettings::default();
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(REGION)
        .name("s3")
        .time(SystemTime::now())
        .settings(settings)
        .build()
        .map_err(|e| anyhow!("signing CreateBucket: {e}"))?
        .into();
    let signable = SignableRequest::new(
        method,
        url,
        headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        SignableBody::Bytes(&[]),
    )
    .map_err(|e| anyhow!("signing CreateBucket: {e}"))?;
    let (instructions, _) = aws_sigv4::http_request::sign(signable, &params)
        .map_err(|e| anyhow!("signing CreateBucket: {e}"))?
        .into_parts();
    let (new_headers, _) = instructions.into_parts();
    for h in new_headers {
        headers.push((h.name().to_owned(), h.value().to_owned()));
    }
    Ok(())
}

/// Makes `p` absolute against the current directory.
fn absolute(p: PathBuf) -> anyhow::Result<PathBuf> {
    if p.is_absolute() {
        Ok(p)
    } else {
        Ok(std::env::current_dir()
            .context("reading the current directory")?
            .join(p))
    }
}

/// Checks the socket path and its directory; removes a stale socket.
///
/// With `own_dir` (the default socket, or a directory made for it) the
/// directory is made private ([`private_dir`]); otherwise a missing one is
/// created private and an existing one must belong to us or root and be
/// writable by nobody else.
fn prepare_socket(socket: &Path, own_dir: bool) -> anyhow::Result<()> {
    if socket.as_os_str().len() > 107 {
        bail!(
            "socket path {} is longer than the 107 bytes a Unix socket path may have; pick a shorter one with --socket",
            socket.display()
        );
    }
    if socket.to_str().is_none() {
        bail!("socket path {} is not valid UTF-8", socket.display());
    }
    let parent = socket
        .parent()
        .ok_or_else(|| anyhow!("socket path {} has no directory", socket.display()))?;
    let exists = match fs::symlink_metadata(parent) {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => {
            return Err(e).with_context(|| format!("inspecting {}", parent.display()));
        }
    };
    if own_dir || !exists {
        private_dir(parent)?;
    } else {
        private::check_socket_dir(parent, &[private::current_uid(), 0]).map_err(|e| {
            anyhow!(
                "{e}; the socket's directory must be yours (or root's) and writable by nobody \
                 else, so that nobody can replace the socket: pick another --socket"
            )
        })?;
    }
    match fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                bail!(
                    "something already listens on {} (another s3dma local or host-shim?); stop it or pick another --socket",
                    socket.display()
                );
            }
            fs::remove_file(socket)
                .with_context(|| format!("removing the stale socket {}", socket.display()))?;
        }
        Ok(_) => bail!(
            "{} exists and is not a socket; pick another --socket",
            socket.display()
        ),
        Err(_) => {}
    }
    Ok(())
}

/// What start-up found out: where each service listens.
#[derive(Debug, Clone, Default)]
pub struct Endpoints {
    /// The storage-target's S3 endpoint, `http://IP:PORT`.
    pub target_url: String,
    /// The dpu-agent's gRPC address, `IP:PORT`.
    pub agent_addr: String,
    /// The host-shim's socket (absolute).
    pub socket: PathBuf,
    /// `IP:PORT` of each service's `/metrics` (with [`StackOptions::metrics`]).
    pub target_metrics: Option<String>,
    /// See `target_metrics`.
    pub agent_metrics: Option<String>,
    /// See `target_metrics`.
    pub shim_metrics: Option<String>,
}

/// What [`Stack::prepare`] sets up.
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// State directory (absolute): secrets, configs, logs, and the data
    /// unless `data_dir` is given.
    pub dir: PathBuf,
    /// The storage-target's data directory (default `DIR/data`).
    pub data_dir: Option<PathBuf>,
    /// The shim's socket (absolute).
    pub socket: PathBuf,
    /// The socket's directory belongs to the launcher (the default socket
    /// directory, or a temporary one): make it 0700. Otherwise (`--socket`)
    /// an existing directory is only checked.
    pub own_socket_dir: bool,
    /// Bucket created at start-up if missing.
    pub bucket: String,
    /// Serve Prometheus metrics from all three on free loopback ports.
    pub metrics: bool,
    /// Prefix of the progress lines on stderr, e.g. `s3dma local`.
    pub who: &'static str,
}

/// storage-target, dpu-agent and host-shim started from the binaries next to
/// this program, configured by the pure functions above. [`Stack::stop`]
/// stops them in reverse order; dropping a `Stack` kills them.
#[derive(Debug)]
pub struct Stack {
    who: &'static str,
    layout: Layout,
    secrets: Secrets,
    socket: PathBuf,
    bucket: String,
    metrics: bool,
    bins: [PathBuf; 3],
    uid: u32,
    procs: Vec<Proc>,
    endpoints: Endpoints,
    _lock: Flock<File>,
}

impl Stack {
    /// Finds the binaries, creates the state directory (0700) and locks it,
    /// reads or creates the secrets, and checks the socket path. Starts
    /// nothing.
    ///
    /// # Errors
    /// Missing binaries, an unusable or locked directory, a bad socket path.
    pub fn prepare(opts: StackOptions) -> anyhow::Result<Stack> {
        let uid = nix::unistd::getuid().as_raw();
        let bins = find_binaries()?;
        let mut l = Layout::new(&opts.dir);
        if let Some(d) = opts.data_dir {
            l.data_dir = d;
        }
        private_dir(&l.dir)?;
        if l.dir.to_str().is_none() {
            bail!("{} is not valid UTF-8; pick another --dir", l.dir.display());
        }
        let lock_path = l.dir.join("lock");
        let lock_file = private::create_private_file(&lock_path).map_err(|e| anyhow!("{e}"))?;
        let lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|_| {
            anyhow!(
                "another s3dma local is using {}; stop it or pick another --dir",
                l.dir.display()
            )
        })?;
        private_dir(&l.logs_dir)?;
        private_dir(&l.data_dir)?;
        let secrets = prepare_secrets(&l)?;
        prepare_socket(&opts.socket, opts.own_socket_dir)?;
        Ok(Stack {
            who: opts.who,
            layout: l,
            secrets,
            socket: opts.socket.clone(),
            bucket: opts.bucket,
            metrics: opts.metrics,
            bins,
            uid,
            procs: Vec::new(),
            endpoints: Endpoints {
                socket: opts.socket,
                ..Endpoints::default()
            },
            _lock: lock,
        })
    }

    /// Starts the three services, each once the previous one is up, and
    /// creates the bucket. On error, [`Stack::stop`] stops what started.
    ///
    /// # Errors
    /// A child that does not start in time or exits.
    pub async fn start(&mut self) -> anyhow::Result<&Endpoints> {
        let l = &self.layout;
        let metrics = self.metrics;

        write_private(
            &l.target_config,
            &storage_target_yaml(l, &self.secrets.access_key_id, metrics),
        )?;
        let (p, mut lines) = spawn(
            self.who,
            "storage-target",
            &self.bins[0],
            &l.target_config,
            l.log("storage-target"),
        )?;
        self.procs.push(p);
        let p = self.procs.last_mut().ok_or_else(|| anyhow!("no process"))?;
        let target_url =
            wait_for_line(p, &mut lines, TARGET_START_TIMEOUT, parse_target_line).await?;
        let target_metrics = wait_metrics(metrics, p, &mut lines).await?;
        drain(lines, p.log.clone());
        create_bucket(&target_url, &self.secrets, &self.bucket).await?;

        write_private(
            &l.agent_config,
            &dpu_agent_yaml(l, &self.secrets.access_key_id, &target_url, metrics),
        )?;
        let (p, mut lines) = spawn(
            self.who,
            "dpu-agent",
            &self.bins[1],
            &l.agent_config,
            l.log("dpu-agent"),
        )?;
        self.procs.push(p);
        let p = self.procs.last_mut().ok_or_else(|| anyhow!("no process"))?;
        let agent_addr =
            wait_for_line(p, &mut lines, AGENT_START_TIMEOUT, parse_agent_line).await?;
        let agent_metrics = wait_metrics(metrics, p, &mut lines).await?;
        drain(lines, p.log.clone());

        write_private(
            &l.shim_config,
            &host_shim_yaml(l, &self.socket, &agent_addr, self.uid, metrics),
        )?;
        let (p, mut lines) = spawn(
            self.who,
            "host-shim",
            &self.bins[2],
            &l.shim_config,
            l.log("host-shim"),
        )?;
        self.procs.push(p);
        let p = self.procs.last_mut().ok_or_else(|| anyhow!("no process"))?;
        let shim_metrics = wait_metrics(metrics, p, &mut lines).await?;
        drain(lines, p.log.clone());
        wait_for_socket(p, &self.socket, SHIM_START_TIMEOUT).await?;
        self.endpoints = Endpoints {
            target_url,
            agent_addr,
            socket: self.socket.clone(),
            target_metrics,
            agent_metrics,
            shim_metrics,
        };
        Ok(&self.endpoints)
    }

    /// Where the services listen (filled in by [`Stack::start`]).
    #[must_use]
    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    /// The tenant's S3 access key id and secret (what the dpu-agent signs
    /// with; for talking to the storage-target directly).
    #[must_use]
    pub fn credentials(&self) -> (&str, &str) {
        (&self.secrets.access_key_id, &self.secrets.secret_access_key)
    }

    /// The pid of the service called `name`.
    #[must_use]
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.procs.iter().find(|p| p.name == name).map(|p| p.pid)
    }

    /// An error for the first service that has exited, with its log's tail.
    pub fn dead(&mut self) -> Option<anyhow::Error> {
        self.procs
            .iter_mut()
            .find_map(|p| match p.child.try_wait() {
                Ok(Some(status)) => Some(p.died(status, "exited unexpectedly")),
                _ => None,
            })
    }

    /// Resolves when a service exits, with an error naming it.
    pub async fn any_exit(&mut self) -> anyhow::Error {
        loop {
            if let Some(e) = self.dead() {
                return e;
            }
            sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the services in reverse start order (SIGTERM, then SIGKILL
    /// after [`STOP_TIMEOUT`]) and removes the socket.
    pub async fn stop(&mut self) {
        for p in self.procs.iter_mut().rev() {
            if matches!(p.child.try_wait(), Ok(Some(_))) {
                continue;
            }
            if let Ok(pid) = i32::try_from(p.pid) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
            if timeout(STOP_TIMEOUT, p.child.wait()).await.is_err() {
                eprintln!(
                    "{}: {} (pid {}) did not stop within {} s; killing it",
                    self.who,
                    p.name,
                    p.pid,
                    STOP_TIMEOUT.as_secs()
                );
                let _ = p.child.kill().await;
            }
        }
        let _ = fs::remove_file(&self.socket);
    }
}

fn help_text(stack: &Stack) -> String {
    let socket = &stack.socket;
    let l = &stack.layout;
    let started = &stack.endpoints;
    let secrets = &stack.secrets;
    let bucket = &stack.bucket;
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "s3dma".into());
    let s = socket.display();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\ns3dma local is running: storage-target, dpu-agent and host-shim on this machine\n\
         (tcp fabric, loopback only). State, data and configs: {}",
        l.dir.display()
    );
    for p in &stack.procs {
        let at = match p.name {
            "storage-target" => started.target_url.clone(),
            "dpu-agent" => started.agent_addr.clone(),
            _ => s.to_string(),
        };
        let _ = writeln!(
            out,
            "  {:<15} pid {:<8} {at}  (log {})",
            p.name,
            p.pid,
            p.log.display()
        );
    }
    let _ = write!(
        out,
        "
From another shell:
  export S3DMA_SOCKET={s}
  {exe} put README.md s3://{bucket}/README.md
  {exe} get s3://{bucket}/README.md -
  {exe} ls s3://{bucket}/
  {exe} info

or in one line:
  S3DMA_SOCKET={s} {exe} put README.md s3://{bucket}/README.md
  S3DMA_SOCKET={s} {exe} get s3://{bucket}/README.md -

The same objects over plain S3 (HTTP to the storage-target, no RDMA), e.g. with the aws CLI:
  export AWS_ACCESS_KEY_ID={key} AWS_SECRET_ACCESS_KEY=$(cat {secret}) AWS_DEFAULT_REGION={REGION}
  aws --endpoint-url {url} s3 ls s3://{bucket}/

Ctrl-C stops all three.
",
        key = secrets.access_key_id,
        secret = l.secret_key_file.display(),
        url = started.target_url,
    );
    out
}

/// Runs local mode until Ctrl-C / SIGTERM (`Ok`) or a failure (`Err`).
///
/// # Errors
/// Missing binaries, unusable directories or socket, a child that does not
/// start or dies.
pub async fn run(opts: Options) -> anyhow::Result<()> {
    let uid = nix::unistd::getuid().as_raw();
    let dir = match opts.dir {
        Some(d) => absolute(d)?,
        None => default_dir(std::env::var_os("XDG_DATA_HOME"), std::env::var_os("HOME"))
            .ok_or_else(|| {
                anyhow!("neither XDG_DATA_HOME nor HOME is set; name a directory with --dir")
            })?,
    };
    let own_socket_dir = opts.socket.is_none();
    let socket = absolute(
        opts.socket
            .unwrap_or_else(|| default_socket(std::env::var_os("XDG_RUNTIME_DIR"), uid)),
    )?;
    let mut stack = Stack::prepare(StackOptions {
        dir,
        data_dir: None,
        socket,
        own_socket_dir,
        bucket: opts.bucket,
        metrics: false,
        who: "s3dma local",
    })?;

    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;

    let started = tokio::select! {
        r = stack.start() => r.map(|_| ()),
        _ = sigint.recv() => Err(anyhow!("interrupted during start-up")),
        _ = sigterm.recv() => Err(anyhow!("terminated during start-up")),
        _ = sighup.recv() => Err(anyhow!("hung up during start-up")),
    };
    if let Err(e) = started {
        stack.stop().await;
        return Err(e);
    }

    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "s3dma local ready: socket={}", stack.socket.display());
        let _ = out.write_all(help_text(&stack).as_bytes());
        let _ = out.flush();
    }

    let died = tokio::select! {
        _ = sigint.recv() => None,
        _ = sigterm.recv() => None,
        _ = sighup.recv() => None,
        e = stack.any_exit() => Some(e),
    };
    let result = match died {
        None => {
            eprintln!("s3dma local: stopping");
            Ok(())
        }
        Some(e) => Err(e),
    };
    stack.stop().await;
    if result.is_ok() {
        eprintln!("s3dma local: stopped");
    }
    result
}

/// Makes `p` absolute against the current directory (for other commands'
/// options).
///
/// # Errors
/// The current directory cannot be read.
pub fn absolute_path(p: PathBuf) -> anyhow::Result<PathBuf> {
    absolute(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new(Path::new("/home/u/.local/share/s3dma/local dir #1"))
    }

    #[test]
    fn defaults_follow_xdg() {
        assert_eq!(
            default_dir(Some("/x/data".into()), Some("/home/u".into())).unwrap(),
            Path::new("/x/data/s3dma/local")
        );
        assert_eq!(
            default_dir(Some("relative".into()), Some("/home/u".into())).unwrap(),
            Path::new("/home/u/.local/share/s3dma/local")
        );
        assert_eq!(
            default_dir(None, Some("/home/u".into())).unwrap(),
            Path::new("/home/u/.local/share/s3dma/local")
        );
        assert!(default_dir(None, None).is_none());
        assert_eq!(
            default_socket(Some("/run/user/1000".into()), 1000),
            Path::new("/run/user/1000/s3dma/shim.sock")
        );
        assert_eq!(
            default_socket(None, 1000),
            Path::new("/tmp/s3dma-1000/shim.sock")
        );
        assert_eq!(
            default_socket(Some("".into()), 7),
            Path::new("/tmp/s3dma-7/shim.sock")
        );
    }

    #[test]
    fn storage_target_config_parses() {
        let l = layout();
        let text = storage_target_yaml(&l, "S3DMALOCALABC", false);
        let c = storage_target::config::Config::parse("st.yaml", &text).unwrap();
        assert_eq!(c.data_dir, l.data_dir);
        assert_eq!(c.listen.to_string(), "127.0.0.1:0");
    }

    #[test]
    fn dpu_agent_config_parses() {
        let l = layout();
        let text = dpu_agent_yaml(&l, "S3DMALOCALABC", "http://127.0.0.1:4567", false);
        let c = dpu_agent::config::parse(Path::new("agent.yaml"), &text).unwrap();
        assert_eq!(c.tenants[0].name, TENANT);
        assert_eq!(c.tenants[0].access_key_id, "S3DMALOCALABC");
        assert_eq!(c.tenants[0].secret_access_key_file, l.secret_key_file);
        assert!(c.tenants[0].allow[0].write);
        assert_eq!(c.targets[0].endpoint, "http://127.0.0.1:4567");
        assert_eq!(c.shims[0].tenants, vec![TENANT.to_owned()]);
        assert_eq!(c.listen.address.ip().to_string(), "127.0.0.1");
    }

    #[test]
    fn host_shim_config_parses() {
        let l = layout();
        let sock = Path::new("/tmp/s3dma-1000/shim \"x\".sock");
        let text = host_shim_yaml(&l, sock, "127.0.0.1:7000", 1000, false);
        let c = host_shim::config::parse(Path::new("shim.yaml"), &text).unwrap();
        assert_eq!(c.socket.path, sock);
        assert_eq!(c.socket.mode, "0600");
        assert_eq!(c.agent.endpoint, "http://127.0.0.1:7000");
        assert_eq!(c.tenants[0].uids, vec![1000]);
        assert_eq!(c.fabric.fabric_key_file, l.fabric_key_file);
        assert!(c.fabric.listen.ip().is_loopback());
    }

    #[test]
    fn metrics_sections_parse() {
        let l = layout();
        let t = storage_target_yaml(&l, "K", true);
        let c = storage_target::config::Config::parse("st.yaml", &t).unwrap();
        assert_eq!(c.metrics_listen.unwrap().to_string(), "127.0.0.1:0");
        let t = dpu_agent_yaml(&l, "K", "http://127.0.0.1:1", true);
        let c = dpu_agent::config::parse(Path::new("agent.yaml"), &t).unwrap();
        assert_eq!(c.metrics.address.unwrap().to_string(), "127.0.0.1:0");
        let t = host_shim_yaml(&l, Path::new("/tmp/s.sock"), "127.0.0.1:2", 1, true);
        let c = host_shim::config::parse(Path::new("shim.yaml"), &t).unwrap();
        assert_eq!(c.metrics.address.unwrap().to_string(), "127.0.0.1:0");
        let c = host_shim::config::parse(
            Path::new("shim.yaml"),
            &host_shim_yaml(&l, Path::new("/tmp/s.sock"), "127.0.0.1:2", 1, false),
        )
        .unwrap();
        assert!(c.metrics.address.is_none());
    }

    #[test]
    fn ready_lines() {
        assert_eq!(
            parse_metrics_line("metrics on http://127.0.0.1:9/metrics\n"),
            Some("127.0.0.1:9")
        );
        assert_eq!(parse_metrics_line("metrics on http:///metrics"), None);
        assert_eq!(parse_metrics_line("metrics on 127.0.0.1:9"), None);
        assert_eq!(
            parse_target_line("storage-target listening on http://127.0.0.1:40001\n"),
            Some("http://127.0.0.1:40001")
        );
        assert_eq!(parse_target_line("metrics on http://x/metrics"), None);
        assert_eq!(
            parse_agent_line("dpu-agent listening on 127.0.0.1:5"),
            Some("127.0.0.1:5")
        );
        assert_eq!(
            parse_agent_line("dpu-agent listening on http://127.0.0.1:5"),
            Some("127.0.0.1:5")
        );
        assert_eq!(parse_agent_line("dpu-agent listening on "), None);
    }

    #[test]
    fn tails() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
        assert_eq!(tail("", 5), "");
    }

    #[test]
    fn secrets_are_private_and_reused() {
        let d = tempfile::tempdir().unwrap();
        let l = Layout::new(d.path());
        let a = prepare_secrets(&l).unwrap();
        let b = prepare_secrets(&l).unwrap();
        assert_eq!(a.access_key_id, b.access_key_id);
        assert_eq!(a.secret_access_key, b.secret_access_key);
        let key = fs::read_to_string(&l.fabric_key_file).unwrap();
        assert_eq!(key.len(), 64);
        assert!(key.bytes().all(|c| c.is_ascii_hexdigit()));
        for f in [
            &l.access_key_file,
            &l.secret_key_file,
            &l.shim_token_file,
            &l.fabric_key_file,
        ] {
            let mode = fs::metadata(f).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", f.display());
        }
        let mode = fs::metadata(&l.secrets_dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert!(!format!("{a:?}").contains(&a.secret_access_key));
    }

    #[test]
    fn yaml_quoting() {
        assert_eq!(q(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(q("x\ny"), "\"x\\u000ay\"");
    }
}
