//! Tenant processes for the bench: `s3dma-tools bench-worker` (hidden) and
//! the runner that starts N of them, lets them go at once and times them.
//!
//! A worker connects (to the shim, or builds an aws-sdk-s3 client), allocates
//! and touches its buffer (and for a PUT fills it with its seed's bytes),
//! prints `ready`, waits for a line on stdin, does its `rounds` GETs or PUTs
//! of one object, then prints `done SECONDS CRC32` (the CRC of the bytes it
//! read or wrote) and exits. Each is its own process with its own lease, as
//! one process per GPU would be.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use s3dma_client::{Client, GetOptions, PutOptions};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::Instant;

use crate::stats::gbps;

/// How long a worker may take to get ready, and a run to end.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// GET or PUT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum WorkerOp {
    /// Read the object into the buffer.
    Get,
    /// Write the buffer as the object.
    Put,
}

/// What one `s3dma-tools bench-worker` does.
#[derive(Debug, Clone)]
pub(crate) struct WorkerOptions {
    pub op: WorkerOp,
    pub bucket: String,
    pub key: String,
    pub bytes: u64,
    pub rounds: u32,
    /// The seed of a PUT's bytes.
    pub seed: u64,
    /// Through the shim at this socket...
    pub socket: Option<PathBuf>,
    /// ...or straight to this S3 endpoint (key and region from the AWS
    /// variables; GET only).
    pub http: Option<String>,
    /// The uid the shim must run as (`None`: the client's default).
    pub shim_uid: Option<u32>,
}

pub(crate) fn s3_client(
    endpoint: &str,
    region: Option<&str>,
    key: &str,
    secret: &str,
) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(s3dma_launcher::https_client())
        .region(Region::new(
            region.unwrap_or(s3dma_launcher::REGION).to_owned(),
        ))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(key, secret, None, None, "s3dma-bench"))
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// The worker process's body.
///
/// # Errors
/// Any failure to connect, allocate, read or write; a short read.
pub(crate) async fn worker(o: WorkerOptions) -> anyhow::Result<()> {
    let len = usize::try_from(o.bytes)?;
    if len == 0 || o.rounds == 0 {
        bail!("a worker needs --bytes and --rounds above 0");
    }
    let mut go = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    let (secs, crc) = match (&o.socket, &o.http) {
        (Some(socket), None) => {
            let client = Client::connect_with(socket, crate::client_options(o.shim_uid))
                .await
                .context("connecting to the host-shim")?;
            let mut buf = client
                .alloc_labeled(len, "bench-worker")
                .await
                .context("allocating the buffer")?;
            // Touch the pages now, not while timed.
            match o.op {
                WorkerOp::Get => buf.as_mut_slice().fill(0),
                WorkerOp::Put => crate::primitives::fill_random(buf.as_mut_slice(), o.seed),
            }
            ready(&mut out, &mut go).await?;
            let t = Instant::now();
            for _ in 0..o.rounds {
                match o.op {
                    WorkerOp::Get => {
                        let got = client
                            .get_object_into(
                                &o.bucket,
                                &o.key,
                                &mut buf,
                                0,
                                GetOptions {
                                    length: Some(o.bytes),
                                    ..GetOptions::default()
                                },
                            )
                            .await
                            .context("s3dma GET")?;
                        if got.bytes_placed != o.bytes {
                            bail!("s3dma GET placed {} bytes", got.bytes_placed);
                        }
                    }
                    WorkerOp::Put => {
                        let put = client
                            .put_object_from(&o.bucket, &o.key, &buf, 0..len, PutOptions::default())
                            .await
                            .context("s3dma PUT")?;
                        if put.size != o.bytes {
                            bail!("s3dma PUT stored {} bytes", put.size);
                        }
                    }
                }
            }
            let secs = t.elapsed().as_secs_f64();
            let crc = crc32fast::hash(buf.as_slice());
            buf.release().await.context("releasing the buffer")?;
            (secs, crc)
        }
        (None, Some(endpoint)) => {
            if o.op != WorkerOp::Get {
                bail!("an HTTP worker only GETs");
            }
            let var = |n: &str| std::env::var(n).with_context(|| format!("${n} is not set"));
            let s3 = s3_client(
                endpoint,
                Some(&var("AWS_REGION")?),
                &var("AWS_ACCESS_KEY_ID")?,
                &var("AWS_SECRET_ACCESS_KEY")?,
            );
            let mut dst = vec![0u8; len];
            ready(&mut out, &mut go).await?;
            let t = Instant::now();
            for _ in 0..o.rounds {
                let got = crate::primitives::http_get_into_from(&s3, &o.bucket, &o.key, &mut dst)
                    .await
                    .context("HTTP GET")?;
                if got != len {
                    bail!("HTTP GET read {got} bytes");
                }
            }
            (t.elapsed().as_secs_f64(), crc32fast::hash(&dst))
        }
        _ => bail!("a worker needs exactly one of --socket and --http"),
    };
    out.write_all(format!("done {secs} {crc}\n").as_bytes())
        .await?;
    out.flush().await?;
    Ok(())
}

async fn ready(
    out: &mut tokio::io::Stdout,
    go: &mut tokio::io::Lines<BufReader<tokio::io::Stdin>>,
) -> anyhow::Result<()> {
    out.write_all(b"ready\n").await?;
    out.flush().await?;
    go.next_line()
        .await?
        .ok_or_else(|| anyhow!("the bench went away"))?;
    Ok(())
}

/// One worker to start: its options, and for an HTTP worker the key.
pub(crate) struct Spec {
    pub opts: WorkerOptions,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION` (never on
    /// a command line).
    pub env: Vec<(&'static str, String)>,
}

/// What a run of workers did.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    /// All workers' bytes over the wall time from the go to the last done.
    pub gbps: f64,
    pub fastest_s: f64,
    pub slowest_s: f64,
    /// Each worker's CRC-32, in order.
    pub crcs: Vec<u32>,
}

struct Proc {
    child: Child,
    stdin: ChildStdin,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Proc {
    async fn line(&mut self, limit: Duration, what: &str) -> anyhow::Result<String> {
        match tokio::time::timeout(limit, self.lines.next_line()).await {
            Err(_) => bail!("a worker did not {what} within {} s", limit.as_secs()),
            Ok(Ok(Some(l))) => Ok(l),
            Ok(Ok(None)) => {
                let status = self.child.wait().await?;
                bail!("a worker exited ({status}) before it could {what}")
            }
            Ok(Err(e)) => Err(e).context("reading a worker's output"),
        }
    }
}

/// Starts the workers, waits until each is ready, lets them go at once and
/// times them to the last one's finish.
///
/// # Errors
/// A worker that fails, hangs or prints something unexpected.
pub(crate) async fn run(specs: Vec<Spec>) -> anyhow::Result<Run> {
    let exe = std::env::current_exe().context("finding s3dma-tools itself")?;
    let mut procs = Vec::with_capacity(specs.len());
    let mut total = 0u64;
    for s in &specs {
        let o = &s.opts;
        total += o.bytes * u64::from(o.rounds);
        let mut cmd = Command::new(&exe);
        cmd.arg("bench-worker")
            .args(["--op", if o.op == WorkerOp::Get { "get" } else { "put" }])
            .args(["--bucket", &o.bucket, "--key", &o.key])
            .args(["--bytes", &o.bytes.to_string()])
            .args(["--rounds", &o.rounds.to_string()])
            .args(["--seed", &o.seed.to_string()])
            .envs(s.env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(socket) = &o.socket {
            cmd.arg("--socket").arg(socket);
        }
        if let Some(http) = &o.http {
            cmd.args(["--http", http]);
        }
        if let Some(uid) = o.shim_uid {
            cmd.args(["--shim-uid", &uid.to_string()]);
        }
        let mut child = cmd.spawn().context("starting a worker process")?;
        let stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin pipe"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("no stdout pipe"))?;
        procs.push(Proc {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        });
    }
    for p in &mut procs {
        let l = p.line(READY_TIMEOUT, "get ready").await?;
        if l != "ready" {
            bail!("a worker said {l:?} instead of ready");
        }
    }
    let start = Instant::now();
    for p in &mut procs {
        p.stdin.write_all(b"go\n").await?;
        p.stdin.flush().await?;
    }
    let mut times = Vec::with_capacity(procs.len());
    let mut crcs = Vec::with_capacity(procs.len());
    for p in &mut procs {
        let l = p.line(RUN_TIMEOUT, "finish").await?;
        let mut words = l.split_whitespace();
        let (Some("done"), Some(secs), Some(crc)) = (words.next(), words.next(), words.next())
        else {
            bail!("a worker said {l:?}");
        };
        crcs.push(crc.parse().context("a worker's CRC")?);
        times.push(secs.parse::<f64>().context("a worker's time")?);
    }
    let wall = start.elapsed();
    for mut p in procs {
        drop(p.stdin);
        let status = p.child.wait().await?;
        if !status.success() {
            bail!("a worker exited with {status}");
        }
    }
    Ok(Run {
        gbps: gbps(total, wall).ok_or_else(|| anyhow!("no time passed"))?,
        fastest_s: times.iter().copied().fold(f64::INFINITY, f64::min),
        slowest_s: times.iter().copied().fold(0.0, f64::max),
        crcs,
    })
}
