//! `s3dma-local`, the program behind `s3dma local` (the tenant CLI runs it
//! from beside itself, else from `PATH`, with the arguments it was given):
//! storage-target, dpu-agent and host-shim on this machine, started by the
//! launcher (this crate's library, which documents the state directory, the
//! generated configurations, the secrets and the socket rules), until
//! Ctrl-C. It lives here, not in the CLI, so that the tenant CLI builds
//! without the servers.
//!
//! 1. `DIR` (default [`s3dma_launcher::default_dir`]) holds the data, the
//!    secrets (reused across runs), the generated configurations and the
//!    logs; everything there is private (0700 directories, 0600 files).
//! 2. The socket (default [`s3dma_launcher::default_socket`]) is where the
//!    other `s3dma` commands find the shim without being told: when neither
//!    `--socket` nor `$S3DMA_SOCKET` is given and `/run/s3dma/shim.sock`
//!    does not exist, they try it.
//! 3. Once the three are up, the line `s3dma local ready: socket=<absolute
//!    path>` goes to stdout, then help for humans.
//!
//! The children run in their own process group, so a terminal's Ctrl-C
//! reaches only `s3dma local`, which then stops them in reverse order
//! (SIGTERM, then SIGKILL after [`s3dma_launcher::STOP_TIMEOUT`]), removes
//! the socket and exits 0. When a child dies on its own the others are
//! stopped and the error carries the tail of its log. A `kill -9` of
//! `s3dma local` leaves the children running (their pids are printed).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use std::process::ExitCode;

use anyhow::{Context as _, anyhow};
use clap::Parser;
use s3dma_launcher::{REGION, Stack, StackOptions, absolute, default_dir, default_socket};
use tokio::signal::unix::{SignalKind, signal};

/// Run storage-target, dpu-agent and host-shim on this machine
/// (loopback only; the tcp fabric unless --fabric verbs) until Ctrl-C. Prints
/// `s3dma local ready: socket=PATH` when they are up.
///
/// The socket's default directory (`$XDG_RUNTIME_DIR/s3dma`, else
/// `/tmp/s3dma-<uid>`) is made 0700 and refused when another user owns it
/// or it is a symlink; a --socket elsewhere needs a directory of yours
/// (or root's) that neither group nor others may write to. The other
/// commands find the default socket by themselves (no --socket or
/// $S3DMA_SOCKET needed) unless /run/s3dma/shim.sock exists.
// The doc comments are the `--help` text: `<uid>` there is not HTML.
#[allow(rustdoc::invalid_html_tags)]
#[derive(Debug, Clone, Parser)]
#[command(name = "s3dma local", bin_name = "s3dma local", version)]
struct Options {
    /// The host-shim's socket [default: $XDG_RUNTIME_DIR/s3dma/shim.sock,
    /// else /tmp/s3dma-<uid>/shim.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// State directory: data, generated configs, secrets, logs.
    #[arg(
        long,
        value_name = "DIR",
        help = "State directory: data, generated configs, secrets, logs; made 0700 \
                (an existing one owned by another user, or a symlink, is refused), \
                files 0600 [default: $XDG_DATA_HOME/s3dma/local, else \
                ~/.local/share/s3dma/local]"
    )]
    dir: Option<PathBuf>,
    /// Bucket created at start-up if missing.
    #[arg(long, default_value = "data", value_name = "NAME")]
    bucket: String,
    /// The fabric between the three services: `tcp` (works everywhere)
    /// or `verbs` (needs an RDMA device, e.g. Soft-RoCE's rxe0).
    #[arg(long, default_value = "tcp", value_name = "BACKEND")]
    fabric: s3dma_launcher::Backend,
    /// Stand in front of an existing S3 endpoint (`http(s)://HOST:PORT`,
    /// e.g. your Ceph RGW or MinIO) instead of a local store: the
    /// storage-target runs as a gateway with a read cache, as you
    /// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION from the
    /// environment).
    #[arg(long, value_name = "URL")]
    upstream: Option<String>,
    /// With --upstream: how many gateways to start (1 to 16); the agent
    /// spreads each object's chunks over them, each caching its share.
    #[arg(long, value_name = "N", default_value_t = s3dma_launcher::Upstream::DEFAULT_GATEWAYS, requires = "upstream")]
    gateways: usize,
    /// With --upstream: each gateway's read cache in MiB (registered
    /// memory).
    #[arg(long, value_name = "MIB", default_value_t = s3dma_launcher::Upstream::DEFAULT_CACHE_BYTES >> 20, requires = "upstream")]
    cache_mib: u64,
    /// Point the dpu-agent and host-shim at an S3-over-RDMA server
    /// (`http(s)://HOST:PORT`: another stack's storage-target, AIStor,
    /// versitygw, elbencho's s3rdma-server...) instead of starting a
    /// storage-target, as you (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// AWS_REGION from the environment). The bucket must exist there.
    #[arg(long, value_name = "URL", conflicts_with = "upstream")]
    target: Option<String>,
    /// With --target: the dialect it speaks: `s3dma`, `hipobj-rc-v2`
    /// (needs --fabric verbs) or `cuobject-dc` (needs an mlx5 device with
    /// DC; without one the bytes go over HTTP).
    #[arg(
        long,
        value_name = "DIALECT",
        default_value = "s3dma",
        requires = "target"
    )]
    protocol: s3dma_launcher::RdmaProtocol,
    /// With --target --protocol s3dma: the server's fabric key file (its
    /// storage-target's `fabric.key_file`; for another `s3dma local`,
    /// DIR/secrets/fabric.key), with which it authenticates the fabric
    /// sessions it opens to this host-shim.
    #[arg(long, value_name = "FILE", requires = "target")]
    fabric_key: Option<PathBuf>,
}

fn main() -> ExitCode {
    let opts = Options::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("s3dma: local: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(run(opts));
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("s3dma: local: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The tenant's identity on another S3 endpoint (for `flag`), from the
/// usual AWS environment variables: access key id, secret and region.
fn aws_identity(flag: &str) -> anyhow::Result<(String, String, Option<String>)> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (Some(access_key_id), Some(secret_access_key)) =
        (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY"))
    else {
        return Err(anyhow!(
            "{flag} needs your credentials on that endpoint in AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY"
        ));
    };
    if var("AWS_SESSION_TOKEN").is_some() {
        return Err(anyhow!(
            "{flag}: temporary credentials (AWS_SESSION_TOKEN) are not supported; use a \
             user's access key"
        ));
    }
    let region = var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION"));
    Ok((access_key_id, secret_access_key, region))
}

/// `--target URL --protocol P`: the server, and the tenant's identity
/// there from the usual AWS environment variables.
fn remote(o: &Options) -> anyhow::Result<Option<s3dma_launcher::RemoteTarget>> {
    let Some(endpoint) = o.target.clone() else {
        return Ok(None);
    };
    if o.protocol == s3dma_launcher::RdmaProtocol::HipobjRcV2
        && o.fabric != s3dma_launcher::Backend::Verbs
    {
        return Err(anyhow!(
            "--protocol hipobj-rc-v2 needs --fabric verbs (its queue pairs live on the \
             shim's RDMA device)"
        ));
    }
    let keyed = o.protocol.authenticates_fabric_sessions();
    let fabric_key = match &o.fabric_key {
        Some(f) if keyed => {
            let k = std::fs::read_to_string(f)
                .with_context(|| format!("reading --fabric-key {}", f.display()))?;
            let k = k.trim().to_owned();
            if k.is_empty() {
                return Err(anyhow!("--fabric-key {} is empty", f.display()));
            }
            Some(k)
        }
        Some(_) => {
            return Err(anyhow!(
                "--fabric-key is for --protocol s3dma; {} authenticates no fabric sessions",
                o.protocol
            ));
        }
        None if keyed => {
            return Err(anyhow!(
                "--protocol s3dma needs the server's fabric key: --fabric-key FILE (its \
                 storage-target's fabric.key_file; DIR/secrets/fabric.key of another s3dma local)"
            ));
        }
        None => None,
    };
    let (access_key_id, secret_access_key, region) = aws_identity("--target")?;
    Ok(Some(s3dma_launcher::RemoteTarget {
        endpoint,
        protocol: o.protocol,
        region,
        access_key_id,
        secret_access_key,
        fabric_key,
    }))
}

/// `--upstream URL`: the endpoint, and the tenant's identity there from the
/// usual AWS environment variables.
fn upstream(o: &Options) -> anyhow::Result<Option<s3dma_launcher::Upstream>> {
    let Some(endpoint) = o.upstream.clone() else {
        return Ok(None);
    };
    if !(1..=s3dma_launcher::Upstream::MAX_GATEWAYS).contains(&o.gateways) {
        return Err(anyhow!(
            "--gateways must be 1 to {}",
            s3dma_launcher::Upstream::MAX_GATEWAYS
        ));
    }
    // A cache smaller than a few chunks cannot hold a read in flight.
    if !(64..=1 << 20).contains(&o.cache_mib) {
        return Err(anyhow!("--cache-mib must be 64 to 1048576"));
    }
    let (access_key_id, secret_access_key, region) = aws_identity("--upstream")?;
    Ok(Some(s3dma_launcher::Upstream {
        endpoint,
        region,
        access_key_id,
        secret_access_key,
        gateways: o.gateways,
        cache_bytes: o.cache_mib << 20,
    }))
}

fn help_text(stack: &Stack, default_socket_used: bool) -> String {
    let socket = stack.socket();
    let l = stack.layout();
    let started = stack.endpoints();
    let (key, _) = stack.credentials();
    let bucket = stack.bucket();
    // The tenant's `s3dma` (installed beside this binary, which it runs
    // for `s3dma local`), else the bare name.
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("s3dma")))
        .filter(|p| p.is_file())
        .map_or_else(|| "s3dma".into(), |p| p.display().to_string());
    let s = socket.display();
    let mut out = String::new();
    match stack.remote() {
        None => {
            let _ = writeln!(
                out,
                "\ns3dma local is running: storage-target, dpu-agent and host-shim on this \
                 machine\n({} fabric, loopback only). State, data and configs: {}",
                l.fabric,
                l.dir.display()
            );
        }
        Some(r) => {
            let _ = writeln!(
                out,
                "\ns3dma local is running: dpu-agent and host-shim on this machine ({} fabric),\n\
                 pointed at {} ({}), as {}. State and configs: {}",
                l.fabric,
                r.endpoint,
                r.protocol,
                r.access_key_id,
                l.dir.display()
            );
        }
    }
    let mut target_urls = started.targets.iter().map(|t| t.url.clone());
    for p in stack.services() {
        let at = match p.name {
            "storage-target" => target_urls.next().unwrap_or_default(),
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
    if default_socket_used {
        let _ = write!(
            out,
            "
From another shell (s3dma finds this socket by itself unless $S3DMA_SOCKET
is set or /run/s3dma/shim.sock exists; then add --socket {s}):
  {exe} put README.md s3://{bucket}/README.md
  {exe} get s3://{bucket}/README.md -
  {exe} ls s3://{bucket}/
  {exe} info
"
        );
    } else {
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
"
        );
    }
    let _ = write!(
        out,
        "
The same objects over plain S3 (HTTP to the storage-target, no RDMA), e.g. with the aws CLI:
  export AWS_ACCESS_KEY_ID={key} AWS_SECRET_ACCESS_KEY=$(cat {secret}) AWS_DEFAULT_REGION={REGION}
  aws --endpoint-url {url} s3 ls s3://{bucket}/

Ctrl-C stops them.
",
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
async fn run(opts: Options) -> anyhow::Result<()> {
    let uid = nix::unistd::geteuid().as_raw();
    // A malformed URL stops the storage-target's start with the field named.
    let upstream = upstream(&opts)?;
    let remote = remote(&opts)?;
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
    let opts = StackOptions {
        dir,
        data_dir: None,
        socket,
        own_socket_dir,
        bucket: opts.bucket,
        metrics: false,
        who: "s3dma local",
        bin_dir: None,
        fabric: opts.fabric,
        upstream,
        protocol: s3dma_launcher::RdmaProtocol::S3dma,
    };
    let mut stack = match remote {
        Some(r) => Stack::prepare_remote(opts, r)?,
        None => Stack::prepare(opts)?,
    };

    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;

    let started = tokio::select! {
        r = stack.start() => r.map(|_| ()).map_err(anyhow::Error::from),
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
        let _ = writeln!(
            out,
            "s3dma local ready: socket={}",
            stack.socket().display()
        );
        let _ = out.write_all(help_text(&stack, own_socket_dir).as_bytes());
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
        Some(e) => Err(e.into()),
    };
    stack.stop().await;
    if result.is_ok() {
        eprintln!("s3dma local: stopped");
    }
    result
}
