//! Starting and stopping the three services.

use fabric::Backend;
use std::fs::{self, File};
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use nix::fcntl::{Flock, FlockArg};
use s3dma_service::child::{ChildError, ChildProcess, Stopped};
use s3dma_service::private;
use tokio::process::Command;
use tokio::time::{sleep, timeout};

use crate::layout::{Secrets, private_dir};
use crate::remote::RemoteTarget;
use crate::upstream::Upstream;
use crate::{
    AGENT_START_TIMEOUT, BUCKET_TIMEOUT, LaunchError, Layout, REGION, SHIM_START_TIMEOUT,
    STOP_TIMEOUT, TARGET_START_TIMEOUT, configs, parse_agent_line, parse_metrics_line,
    parse_target_line,
};

/// The service binaries, in start order.
const BINARIES: [&str; 3] = ["storage-target", "dpu-agent", "host-shim"];

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
    /// Every storage-target, in start order (the first is `target_url`):
    /// one, or [`Upstream::gateways`] gateways in front of an upstream; for
    /// a stack pointed at a [`RemoteTarget`], that server alone.
    pub targets: Vec<TargetEndpoint>,
}

/// Where one storage-target listens.
#[derive(Debug, Clone, Default)]
pub struct TargetEndpoint {
    /// Its S3 endpoint, `http://IP:PORT`.
    pub url: String,
    /// `IP:PORT` of its `/metrics` (with [`StackOptions::metrics`]).
    pub metrics: Option<String>,
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
    /// The directory holding the `storage-target`, `dpu-agent` and
    /// `host-shim` binaries. `None`: the running program's directory (cargo
    /// puts every workspace binary in one target directory; for a test
    /// binary in `target/<profile>/deps`, its parent), then `PATH`.
    pub bin_dir: Option<PathBuf>,
    /// The fabric all three services use (`tcp`, or `verbs` where an RDMA
    /// device exists).
    pub fabric: Backend,
    /// Run the storage-target as a gateway in front of this S3 endpoint,
    /// as the tenant's identity there (`s3dma local --upstream`), instead of
    /// the filesystem store. Default: none.
    pub upstream: Option<Upstream>,
    /// The dialect the agent speaks to the storage-target (`s3dma`, or
    /// `hipobj-rc-v2` on verbs).
    pub protocol: dpu_agent::config::RdmaProtocol,
}

impl StackOptions {
    /// Options for a stack under `dir` with its socket at `socket`, both
    /// belonging to the launcher; bucket `data`, no metrics, binaries found
    /// next to the running program.
    #[must_use]
    pub fn new(dir: PathBuf, socket: PathBuf, who: &'static str) -> StackOptions {
        StackOptions {
            dir,
            data_dir: None,
            socket,
            own_socket_dir: true,
            bucket: "data".to_owned(),
            metrics: false,
            who,
            bin_dir: None,
            fabric: Backend::Tcp,
            upstream: None,
            protocol: dpu_agent::config::RdmaProtocol::S3dma,
        }
    }
}

/// A started service, as [`Stack::services`] shows it.
#[derive(Debug, Clone)]
pub struct Service {
    /// `storage-target`, `dpu-agent` or `host-shim`.
    pub name: &'static str,
    /// Its process id.
    pub pid: u32,
    /// Its log file (stderr and the rest of stdout).
    pub log: PathBuf,
}

/// A started child: [`s3dma_service::child`]'s process (the one
/// implementation, which the test kit uses too), named.
#[derive(Debug)]
struct Proc {
    name: &'static str,
    child: ChildProcess,
}

impl Proc {
    /// `e` as the launcher's error, naming this service.
    fn err(&self, e: ChildError) -> LaunchError {
        LaunchError::Service {
            name: self.name,
            message: e.to_string(),
        }
    }
}

/// storage-target, dpu-agent and host-shim started from their binaries,
/// configured by [`configs`]. [`Stack::stop`] stops them in reverse order;
/// dropping a `Stack` kills them.
#[derive(Debug)]
pub struct Stack {
    who: &'static str,
    layout: Layout,
    secrets: Secrets,
    socket: PathBuf,
    bucket: String,
    metrics: bool,
    bins: [PathBuf; 3],
    upstream: Option<Upstream>,
    remote: Option<RemoteTarget>,
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
    pub fn prepare(opts: StackOptions) -> Result<Stack, LaunchError> {
        Stack::prepare_with(opts, None)
    }

    /// [`Stack::prepare`] for a stack of dpu-agent and host-shim only,
    /// pointed at `remote` (its endpoint, dialect and region, as the
    /// tenant's identity there): no storage-target is started and nothing
    /// is created on the remote server (`opts.bucket` must exist there;
    /// `opts.upstream` and `opts.protocol` are not used). The credentials
    /// are written to the secrets directory as `--upstream`'s are.
    ///
    /// # Errors
    /// As [`Stack::prepare`]; an endpoint that breaks the endpoint-URL rule.
    pub fn prepare_remote(opts: StackOptions, remote: RemoteTarget) -> Result<Stack, LaunchError> {
        s3dma_config::check_endpoint_url(&remote.endpoint)
            .map_err(|e| LaunchError::Unusable(format!("the target's URL {e}")))?;
        let opts = StackOptions {
            upstream: None,
            protocol: remote.protocol,
            ..opts
        };
        Stack::prepare_with(opts, Some(remote))
    }

    fn prepare_with(
        opts: StackOptions,
        remote: Option<RemoteTarget>,
    ) -> Result<Stack, LaunchError> {
        let uid = private::current_uid();
        let bins = find_binaries(opts.bin_dir.as_deref())?;
        let mut l = Layout::new(&opts.dir);
        if let Some(d) = opts.data_dir {
            l.data_dir = d;
        }
        l.fabric = opts.fabric;
        l.protocol = opts.protocol;
        private_dir(&l.dir)?;
        if l.dir.to_str().is_none() {
            return Err(LaunchError::Unusable(format!(
                "{} is not valid UTF-8; pick another --dir",
                l.dir.display()
            )));
        }
        let lock_path = l.dir.join("lock");
        let lock_file = private::create_private_file(&lock_path)
            .map_err(|error| LaunchError::Private { error, hint: "" })?;
        let lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|_| {
            LaunchError::Unusable(format!(
                "another s3dma local is using {}; stop it or pick another --dir",
                l.dir.display()
            ))
        })?;
        private_dir(&l.logs_dir)?;
        private_dir(&l.data_dir)?;
        let secrets = match (&remote, &opts.upstream) {
            (Some(r), _) => {
                let s = l.prepare_upstream_secrets(&r.access_key_id, &r.secret_access_key)?;
                if let Some(k) = &r.fabric_key {
                    crate::layout::write_private(&l.fabric_key_file, k)?;
                }
                s
            }
            (None, None) => l.prepare_secrets()?,
            (None, Some(u)) => {
                l.prepare_upstream_secrets(&u.access_key_id, &u.secret_access_key)?
            }
        };
        prepare_socket(&opts.socket, opts.own_socket_dir)?;
        Ok(Stack {
            who: opts.who,
            layout: l,
            secrets,
            socket: opts.socket.clone(),
            bucket: opts.bucket,
            metrics: opts.metrics,
            bins,
            upstream: opts.upstream,
            remote,
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
    /// A configuration that cannot be written, a child that does not start
    /// in time or exits, a bucket that cannot be created.
    pub async fn start(&mut self) -> Result<&Endpoints, LaunchError> {
        let l = &self.layout;
        let metrics = self.metrics;

        let key = &self.secrets.access_key_id;
        // A remote target: no storage-target of the stack's own.
        let count = match (&self.remote, &self.upstream) {
            (Some(_), _) => 0,
            (None, u) => u.as_ref().map_or(1, |u| u.gateways),
        };
        let mut targets = Vec::with_capacity(count.max(1));
        for i in 0..count {
            // The first keeps the single-target names; more gateways get -1, -2...
            let (config, log) = if i == 0 {
                (l.target_config.clone(), l.log(BINARIES[0]))
            } else {
                (
                    l.dir.join(format!("{}-{i}.yaml", BINARIES[0])),
                    l.log(&format!("{}-{i}", BINARIES[0])),
                )
            };
            configs::write(
                &config,
                &configs::storage_target(l, key, metrics, self.upstream.as_ref()),
            )?;
            let p = spawn(self.who, BINARIES[0], &self.bins[0], &config, log)?;
            self.procs.push(p);
            let p = self.procs.last_mut().ok_or_else(no_process)?;
            let url = wait_for_line(p, TARGET_START_TIMEOUT, parse_target_line).await?;
            let metrics = wait_metrics(metrics, p).await?;
            p.child.drain();
            targets.push(TargetEndpoint { url, metrics });
        }
        if let Some(r) = &self.remote {
            targets.push(TargetEndpoint {
                url: r.endpoint.clone(),
                metrics: None,
            });
        }
        let target_url = targets[0].url.clone();
        let target_metrics = targets[0].metrics.clone();
        if self.remote.is_none() {
            create_bucket(&target_url, &self.secrets, &self.bucket).await?;
        }

        let target_urls: Vec<&str> = targets.iter().map(|t| t.url.as_str()).collect();
        let mut agent = configs::dpu_agent(l, key, &target_urls, metrics);
        if let Some(r) = &self.remote {
            agent.targets[0].name = "remote".to_owned();
            if let Some(region) = &r.region {
                agent.targets[0].region.clone_from(region);
            }
        }
        configs::write(&l.agent_config, &agent)?;
        let p = spawn(
            self.who,
            BINARIES[1],
            &self.bins[1],
            &l.agent_config,
            l.log(BINARIES[1]),
        )?;
        self.procs.push(p);
        let p = self.procs.last_mut().ok_or_else(no_process)?;
        let agent_addr = wait_for_line(p, AGENT_START_TIMEOUT, parse_agent_line).await?;
        let agent_metrics = wait_metrics(metrics, p).await?;
        p.child.drain();

        configs::write(
            &l.shim_config,
            &configs::host_shim(l, &self.socket, &agent_addr, self.uid, metrics),
        )?;
        let p = spawn(
            self.who,
            BINARIES[2],
            &self.bins[2],
            &l.shim_config,
            l.log(BINARIES[2]),
        )?;
        self.procs.push(p);
        let p = self.procs.last_mut().ok_or_else(no_process)?;
        let shim_metrics = wait_metrics(metrics, p).await?;
        p.child.drain();
        if let Err(e) = p
            .child
            .wait_for_socket(&self.socket, SHIM_START_TIMEOUT)
            .await
        {
            return Err(p.err(e));
        }
        self.endpoints = Endpoints {
            target_url,
            agent_addr,
            socket: self.socket.clone(),
            target_metrics,
            agent_metrics,
            shim_metrics,
            targets,
        };
        Ok(&self.endpoints)
    }

    /// Where the services listen (filled in by [`Stack::start`]).
    #[must_use]
    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    /// Where things live under the state directory.
    #[must_use]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The shim's socket.
    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The remote target the stack is pointed at ([`Stack::prepare_remote`]).
    #[must_use]
    pub fn remote(&self) -> Option<&RemoteTarget> {
        self.remote.as_ref()
    }

    /// The bucket created at start-up.
    #[must_use]
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The tenant's S3 access key id and secret (what the dpu-agent signs
    /// with; for talking to the storage-target directly).
    #[must_use]
    pub fn credentials(&self) -> (&str, &str) {
        (&self.secrets.access_key_id, &self.secrets.secret_access_key)
    }

    /// The services started so far, in start order.
    #[must_use]
    pub fn services(&self) -> Vec<Service> {
        self.procs
            .iter()
            .map(|p| Service {
                name: p.name,
                pid: p.child.pid(),
                log: p.child.log().to_path_buf(),
            })
            .collect()
    }

    /// The pid of the service called `name` (the first, for the gateways).
    #[must_use]
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.procs
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.child.pid())
    }

    /// The pids of every service called `name`, in start order.
    #[must_use]
    pub fn pids(&self, name: &str) -> Vec<u32> {
        self.procs
            .iter()
            .filter(|p| p.name == name)
            .map(|p| p.child.pid())
            .collect()
    }

    /// An error for the first service that has exited, with its log's tail.
    pub fn dead(&mut self) -> Option<LaunchError> {
        self.procs.iter_mut().find_map(|p| match p.child.exited() {
            Ok(Some(status)) => Some(p.err(p.child.died(status, "exited unexpectedly"))),
            _ => None,
        })
    }

    /// Resolves when a service exits, with an error naming it.
    pub async fn any_exit(&mut self) -> LaunchError {
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
            if p.child.stop(STOP_TIMEOUT).await == Stopped::Killed {
                eprintln!(
                    "{}: {} (pid {}) did not stop within {} s; killed it",
                    self.who,
                    p.name,
                    p.child.pid(),
                    STOP_TIMEOUT.as_secs()
                );
            }
        }
        let _ = fs::remove_file(&self.socket);
    }
}

fn no_process() -> LaunchError {
    LaunchError::Unusable("internal error: no process".into())
}

/// The directories a binary is looked for in when no `bin_dir` is given:
/// the running program's, and for a test binary in `deps/` its parent.
fn exe_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        dirs.push(dir.to_path_buf());
        if dir.file_name().is_some_and(|n| n == "deps")
            && let Some(up) = dir.parent()
        {
            dirs.push(up.to_path_buf());
        }
    }
    dirs
}

/// Finds `name` in `bin_dir`, or next to the running program, then on `PATH`.
fn find_binary(name: &str, bin_dir: Option<&Path>) -> Option<PathBuf> {
    if let Some(d) = bin_dir {
        let p = d.join(name);
        return p.is_file().then_some(p);
    }
    if let Some(p) = exe_dirs()
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
    {
        return Some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn find_binaries(bin_dir: Option<&Path>) -> Result<[PathBuf; 3], LaunchError> {
    let found: Vec<Option<PathBuf>> = BINARIES.iter().map(|n| find_binary(n, bin_dir)).collect();
    let missing: Vec<&'static str> = BINARIES
        .iter()
        .zip(&found)
        .filter(|(_, f)| f.is_none())
        .map(|(n, _)| *n)
        .collect();
    if !missing.is_empty() {
        let where_ = match bin_dir {
            Some(d) => d.display().to_string(),
            None => exe_dirs()
                .first()
                .map(|d| d.display().to_string())
                .unwrap_or_else(|| "this program's directory".into()),
        };
        return Err(LaunchError::MissingBinaries { missing, where_ });
    }
    let mut it = found.into_iter().flatten();
    match (it.next(), it.next(), it.next()) {
        (Some(a), Some(b), Some(c)) => Ok([a, b, c]),
        _ => Err(LaunchError::Unusable(
            "internal error: binaries vanished".into(),
        )),
    }
}

/// Starts `bin --config CONFIG` with stderr and stdout in `log` (0600).
fn spawn(
    who: &str,
    name: &'static str,
    bin: &Path,
    config: &Path,
    log: PathBuf,
) -> Result<Proc, LaunchError> {
    // Created private (0600, emptied), then used in append mode: the
    // child's stderr and the stdout lines copied after its ready line share
    // the file, and neither may overwrite the other.
    private::create_private_file(&log).map_err(|error| LaunchError::Private { error, hint: "" })?;
    let stderr = std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .map_err(LaunchError::io(format!("opening {}", log.display())))?;
    let mut cmd = Command::new(bin);
    cmd.arg("--config")
        .arg(config)
        // Logs go to files: no colour codes in them.
        .env("NO_COLOR", "1")
        // Our own Ctrl-C handling stops the children, in order.
        .process_group(0)
        // If the launching program panics, the children do not outlive it.
        .kill_on_drop(true);
    let child =
        ChildProcess::spawn(cmd, name, log.clone(), stderr, Some(log.clone())).map_err(|e| {
            LaunchError::Service {
                name,
                message: e.to_string(),
            }
        })?;
    eprintln!(
        "{who}: started {name} (pid {}), log {}",
        child.pid(),
        log.display()
    );
    Ok(Proc { name, child })
}

/// Reads `p`'s stdout until `parse` accepts a line; other lines go to its log.
async fn wait_for_line(
    p: &mut Proc,
    limit: Duration,
    parse: impl Fn(&str) -> Option<&str>,
) -> Result<String, LaunchError> {
    match p
        .child
        .wait_for_line(limit, |l| parse(l).map(str::to_owned))
        .await
    {
        Ok(v) => Ok(v),
        Err(e) => Err(p.err(e)),
    }
}

/// With `metrics`, reads `p`'s stdout until its `metrics on` line.
async fn wait_metrics(metrics: bool, p: &mut Proc) -> Result<Option<String>, LaunchError> {
    if !metrics {
        return Ok(None);
    }
    wait_for_line(p, AGENT_START_TIMEOUT, parse_metrics_line)
        .await
        .map(Some)
}

/// Creates `bucket` on the target with aws-sdk-s3 (path-style, the
/// tenant's key); a bucket the tenant already owns is fine.
async fn create_bucket(
    target_url: &str,
    secrets: &Secrets,
    bucket: &str,
) -> Result<(), LaunchError> {
    let fail = |message: String| LaunchError::Bucket {
        bucket: bucket.to_owned(),
        message,
    };
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(crate::https_client())
        .region(Region::new(REGION))
        .endpoint_url(target_url)
        .credentials_provider(Credentials::new(
            &secrets.access_key_id,
            &secrets.secret_access_key,
            None,
            None,
            "s3dma-launcher",
        ))
        .force_path_style(true)
        .build();
    let s3 = aws_sdk_s3::Client::from_conf(conf);
    match timeout(BUCKET_TIMEOUT, s3.create_bucket().bucket(bucket).send()).await {
        Err(_) => Err(fail(format!(
            "storage-target at {target_url} did not answer within {} s",
            BUCKET_TIMEOUT.as_secs()
        ))),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e))
            if e.as_service_error()
                .is_some_and(|s| s.is_bucket_already_owned_by_you()) =>
        {
            Ok(())
        }
        Ok(Err(e)) => Err(fail(format!(
            "{}",
            aws_sdk_s3::error::DisplayErrorContext(e)
        ))),
    }
}

/// Makes `p` absolute against the current directory.
///
/// # Errors
/// The current directory cannot be read.
pub fn absolute(p: PathBuf) -> Result<PathBuf, LaunchError> {
    if p.is_absolute() {
        Ok(p)
    } else {
        Ok(std::env::current_dir()
            .map_err(LaunchError::io("reading the current directory"))?
            .join(p))
    }
}

/// Checks the socket path and its directory; removes a stale socket.
///
/// With `own_dir` (the default socket, or a directory made for it) the
/// directory is made private ([`private_dir`]); otherwise a missing one is
/// created private and an existing one must belong to us or root and be
/// writable by nobody else.
fn prepare_socket(socket: &Path, own_dir: bool) -> Result<(), LaunchError> {
    let unusable = |m: String| Err(LaunchError::Unusable(m));
    if socket.as_os_str().len() > 107 {
        return unusable(format!(
            "socket path {} is longer than the 107 bytes a Unix socket path may have; pick a shorter one with --socket",
            socket.display()
        ));
    }
    if socket.to_str().is_none() {
        return unusable(format!(
            "socket path {} is not valid UTF-8",
            socket.display()
        ));
    }
    let Some(parent) = socket.parent() else {
        return unusable(format!("socket path {} has no directory", socket.display()));
    };
    let exists = match fs::symlink_metadata(parent) {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => {
            return Err(LaunchError::io(format!("inspecting {}", parent.display()))(
                e,
            ));
        }
    };
    if own_dir || !exists {
        private_dir(parent)?;
    } else {
        private::check_socket_dir(parent, &[private::current_uid(), 0]).map_err(|error| {
            LaunchError::Private {
                error,
                hint: "; the socket's directory must be yours (or root's) and writable by nobody \
                       else, so that nobody can replace the socket: pick another --socket",
            }
        })?;
    }
    match fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return unusable(format!(
                    "something already listens on {} (another s3dma local or host-shim?); stop it or pick another --socket",
                    socket.display()
                ));
            }
            fs::remove_file(socket).map_err(LaunchError::io(format!(
                "removing the stale socket {}",
                socket.display()
            )))?;
        }
        Ok(_) => {
            return unusable(format!(
                "{} exists and is not a socket; pick another --socket",
                socket.display()
            ));
        }
        Err(_) => {}
    }
    Ok(())
}
