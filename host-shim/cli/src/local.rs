//! `s3dma local`: storage-target, dpu-agent and host-shim on this machine,
//! started by the launcher (`s3dma-launcher`, which documents the state
//! directory, the generated configurations, the secrets and the socket
//! rules), until Ctrl-C.
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

use anyhow::{Context as _, anyhow};
use s3dma_launcher::{REGION, Stack, StackOptions, absolute, default_dir, default_socket};
use tokio::signal::unix::{SignalKind, signal};

/// What `s3dma local` was asked for.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// State directory (`None` = [`default_dir`]).
    pub dir: Option<PathBuf>,
    /// Shim socket (`None` = [`default_socket`]).
    pub socket: Option<PathBuf>,
    /// Bucket created at start-up if missing.
    pub bucket: String,
    /// The fabric between the services.
    pub fabric: s3dma_launcher::Backend,
    /// An existing S3 endpoint to stand in front of (`--upstream`).
    pub upstream: Option<String>,
    /// Gateways in front of it (`--gateways`).
    pub gateways: usize,
    /// Each gateway's cache in MiB (`--cache-mib`).
    pub cache_mib: u64,
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
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (Some(access_key_id), Some(secret_access_key)) =
        (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY"))
    else {
        return Err(anyhow!(
            "--upstream needs your credentials on that endpoint in AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY"
        ));
    };
    if var("AWS_SESSION_TOKEN").is_some() {
        return Err(anyhow!(
            "--upstream: temporary credentials (AWS_SESSION_TOKEN) are not supported; use a \
             user's access key"
        ));
    }
    Ok(Some(s3dma_launcher::Upstream {
        endpoint,
        region: var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")),
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
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "s3dma".into());
    let s = socket.display();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\ns3dma local is running: storage-target, dpu-agent and host-shim on this machine\n\
         ({} fabric, loopback only). State, data and configs: {}",
        l.fabric,
        l.dir.display()
    );
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

Ctrl-C stops all three.
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
pub(crate) async fn run(opts: Options) -> anyhow::Result<()> {
    let uid = s3dma_service::private::current_uid();
    // A malformed URL stops the storage-target's start with the field named.
    let upstream = upstream(&opts)?;
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
        bin_dir: None,
        fabric: opts.fabric,
        upstream,
        protocol: s3dma_launcher::RdmaProtocol::S3dma,
    })?;

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
