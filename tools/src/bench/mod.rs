//! `s3dma-tools bench`: the full stack against plain S3 over HTTP, in one run.
//!
//! It starts storage-target, dpu-agent and host-shim (the [`Stack`] of
//! `s3dma local`) in a temporary directory, with the store on `/dev/shm`
//! when it has room (so PUTs measure the transport, not the disk), and
//! measures, printing one progress line per phase on stderr:
//!
//! 1. raw loopback TCP: one tokio `TcpStream`, 4 MiB writes for ~2 s
//!    (1 s with `--quick`): the machine's limit for one stream;
//! 2. large objects (64 MiB and 1 GiB; 8 MiB and 64 MiB with `--quick`):
//!    PUT then GET through s3dma-client (shim → agent → target → fabric,
//!    straight into or out of shared-memory buffers allocated once), then the
//!    same object with aws-sdk-s3 straight against the storage-target over
//!    HTTP (the body collected into a buffer allocated once / sent from
//!    memory). Each is timed over several rounds and the median is kept; the
//!    bytes are verified (CRC-32) once per size and path, untimed;
//! 3. small objects (4 KiB, 64 KiB): GET and PUT with 1, 16 and 64 requests
//!    in flight for a fixed time per cell (after a short warm-up), through
//!    s3dma and over HTTP: ops/s and p50/p99 latency (HdrHistogram);
//! 4. batched calls (`GetObjects`, `PutObjects`, `HeadObjects`) of small
//!    objects in batches of 1, 16 and 64 beside HTTP at the same
//!    concurrency, and one HEAD of 1,000 keys ([`batch`]);
//! 5. CPU: utime+stime of dpu-agent, host-shim, storage-target and this
//!    process, read from `/proc/PID/stat` before and after each measured
//!    phase, per GB moved (large) and per request (small).
//!
//! Then the table goes to stdout (see [`crate::report`]) and, with `--json`,
//! the flat JSON object to a file.

mod batch;
mod large;
mod rails;
mod small;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use s3dma_client::{Client, ClientOptions, PutOptions};
use s3dma_launcher::{REGION, Stack};
use tokio::time::Instant;

use crate::options::{BUCKET, Options, Phase, progress, write_json};
use crate::own_stack::OwnStack;
use crate::primitives::{ensure_bucket, fill_random, raw_tcp};
use crate::procfs;
use crate::report::{CpuSecs, Layers, Op, ProcsRow, Report, Size, human_size};
use crate::stats::{gbps, median, ticks_to_secs};
use crate::workers::{WorkerOp, WorkerOptions};
use small::small_key;

/// Small-object sizes.
const SMALL: [Size; 2] = [
    Size {
        bytes: 4 << 10,
        key: "4k",
    },
    Size {
        bytes: 64 << 10,
        key: "64k",
    },
];

/// Requests in flight per small-object cell.
const IN_FLIGHT: [usize; 3] = [1, 16, 64];

/// Tenant processes per row of the processes phase.
const PROCS: [usize; 4] = [1, 2, 4, 8];

const PROCS_MAX: usize = 8;
/// Runs of [`raw_tcp`] the bench keeps the best of.
const RAW_TCP_TRIES: usize = 3;

/// Sizes and durations derived from the options.
#[derive(Debug, Clone)]
struct Plan {
    quick: bool,
    /// The phases to run (`--only`; empty: all).
    only: Vec<Phase>,
    rounds: usize,
    cell: Duration,
    warmup: Duration,
    raw_tcp: Duration,
    /// Medium then large.
    sizes: [Size; 2],
    /// Each tenant process's object in the processes phase.
    procs_bytes: u64,
    /// Rounds of each tenant process.
    procs_rounds: u32,
    /// Bytes per limit measurement (memcpy, MD5, write+fsync).
    limit_bytes: usize,
}

impl Plan {
    fn new(o: &Options) -> anyhow::Result<Plan> {
        let rounds = o.rounds.unwrap_or(if o.quick { 3 } else { 5 });
        if !(1..=1000).contains(&rounds) {
            bail!("--rounds must be 1 to 1000");
        }
        let cell_secs = o.cell_secs.unwrap_or(if o.quick { 0.6 } else { 4.0 });
        let cell = Duration::try_from_secs_f64(cell_secs)
            .ok()
            .filter(|d| *d >= Duration::from_millis(50) && *d <= Duration::from_secs(600))
            .ok_or_else(|| anyhow!("--cell-secs must be 0.05 to 600"))?;
        let sizes = if o.quick {
            [
                Size {
                    bytes: 8 << 20,
                    key: "64m",
                },
                Size {
                    bytes: 64 << 20,
                    key: "1g",
                },
            ]
        } else {
            [
                Size {
                    bytes: 64 << 20,
                    key: "64m",
                },
                Size {
                    bytes: 1 << 30,
                    key: "1g",
                },
            ]
        };
        Ok(Plan {
            quick: o.quick,
            only: o.only.clone(),
            rounds,
            cell,
            warmup: (cell / 5).min(Duration::from_millis(500)),
            raw_tcp: if o.quick {
                Duration::from_secs(1)
            } else {
                Duration::from_secs(2)
            },
            sizes,
            procs_bytes: if o.quick { 8 << 20 } else { 256 << 20 },
            procs_rounds: if o.quick { 1 } else { 3 },
            limit_bytes: if o.quick { 64 << 20 } else { 256 << 20 },
        })
    }

    /// Whether `phase` runs.
    fn runs(&self, phase: Phase) -> bool {
        self.only.is_empty() || self.only.contains(&phase)
    }

    fn large_bytes(&self) -> usize {
        usize::try_from(self.sizes[1].bytes).unwrap_or(usize::MAX)
    }
}

/// Runs the bench: starts a stack, measures, stops it, prints the table.
///
/// # Errors
/// The stack does not start or dies, a request fails, data does not match,
/// the JSON file cannot be written.
pub(crate) async fn run(opts: Options) -> anyhow::Result<()> {
    if opts.fanout {
        return crate::fanout::run(&opts).await;
    }
    if opts.rails {
        return rails::run(&opts).await;
    }
    let plan = Plan::new(&opts)?;
    if opts.ml {
        return crate::ml::run(&opts, plan.raw_tcp).await;
    }
    if opts.dirs {
        return crate::dirs::run(&opts, plan.raw_tcp).await;
    }
    let report = match &opts.endpoint {
        Some(endpoint) => attached(&opts, &plan, endpoint).await?,
        None => own_stack(&opts, &plan).await?,
    };
    print!("{}", report.table());
    write_json(&opts, report.json())?;
    Ok(())
}

/// Measures an existing stack: the shim at `--socket`, the target at
/// `endpoint`, CPU of the services found by name in /proc (when exactly one
/// of each runs).
async fn attached(opts: &Options, plan: &Plan, endpoint: &str) -> anyhow::Result<Report> {
    if opts.data_dir.is_some() {
        bail!("--data-dir is for the stack the bench starts; it cannot be used with --endpoint");
    }
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| anyhow!("--endpoint needs the tenant's S3 key in ${name}"))
    };
    let (key_id, secret) = (var("AWS_ACCESS_KEY_ID")?, var("AWS_SECRET_ACCESS_KEY")?);
    let socket = opts.socket.clone().unwrap_or_else(Client::default_socket);
    let pids = find_services();
    if pids.is_none() {
        progress(
            "not exactly one dpu-agent, host-shim and storage-target process here: \
             no CPU figures for them",
        );
    }
    let ctx = Ctx::connect(
        &socket,
        endpoint,
        &key_id,
        &secret,
        pids,
        format!("the stack at {endpoint}"),
        crate::client_options(opts.shim_uid),
    )
    .await?;
    let ctx = Ctx {
        shim_uid: opts.shim_uid,
        ..ctx
    };
    ensure_bucket(&ctx.s3, BUCKET).await?;
    let report = measure(&ctx, plan).await;
    // Leave the stack as it was (but for the bucket).
    let mut keys: Vec<String> = plan
        .sizes
        .iter()
        .map(|s| format!("large/{}", s.key))
        .collect();
    for size in SMALL {
        keys.extend((0..IN_FLIGHT[IN_FLIGHT.len() - 1]).map(|i| small_key(size, i)));
    }
    keys.extend((0..PROCS_MAX).map(|i| format!("procs/{i}")));
    for size in SMALL {
        keys.extend(
            (0..batch::BATCHES[batch::BATCHES.len() - 1]).map(|i| batch::batch_key(size, i)),
        );
    }
    keys.extend((0..batch::HEAD_KEYS).map(batch::head_key));
    for key in keys {
        if let Err(e) = ctx.s3.delete_object().bucket(BUCKET).key(&key).send().await {
            progress(&format!(
                "deleting {BUCKET}/{key}: {}",
                aws_sdk_s3::error::DisplayErrorContext(e)
            ));
        }
    }
    report
}

/// The pids of dpu-agent, host-shim and storage-target on this machine,
/// when exactly one of each runs.
fn find_services() -> Option<[u32; 3]> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) {
            found.push((pid, comm.trim().to_owned()));
        }
    }
    procfs::unique_pids(&found, ["dpu-agent", "host-shim", "storage-target"])
}

/// Starts a stack in a temporary directory, measures it, stops it.
async fn own_stack(opts: &Options, plan: &Plan) -> anyhow::Result<Report> {
    // Room for three large objects and the tenant processes' objects.
    let room = 3 * plan.sizes[1].bytes + PROCS_MAX as u64 * plan.procs_bytes + (512 << 20);
    let mut started = OwnStack::start(opts, room).await?;
    let ctx = Ctx::new(&started.stack, &started.data_dir).await;
    let result = match ctx {
        Ok(ctx) => {
            tokio::select! {
                r = measure(&ctx, plan) => r,
                e = started.stack.any_exit() => Err(e.into()),
            }
        }
        Err(e) => Err(e),
    };
    started.stop().await;
    let mut report = result?;
    report.fabric = opts.fabric.to_string();
    if plan.runs(Phase::Disk) {
        disk_put(opts, plan, &mut report).await?;
    }
    Ok(report)
}

/// PUT of the large object to a store on disk (a second stack with its data
/// directory under `$TMPDIR`), s3dma and HTTP, beside that directory's
/// write+fsync bandwidth (the main phases run on /dev/shm when it has room).
async fn disk_put(opts: &Options, plan: &Plan, report: &mut Report) -> anyhow::Result<()> {
    let disk = tempfile::Builder::new()
        .prefix("s3dma-bench-disk-")
        .tempdir()
        .context("creating a data directory on disk")?;
    let size = plan.sizes[1];
    let label = human_size(size.bytes);
    let on_disk = Options {
        data_dir: Some(disk.path().to_path_buf()),
        ..opts.clone()
    };
    let mut started = OwnStack::start(&on_disk, 0).await?;
    let ctx = match Ctx::new(&started.stack, disk.path()).await {
        Ok(c) => c,
        Err(e) => {
            started.stop().await;
            return Err(e);
        }
    };
    let result = async {
        progress(&format!(
            "PUT {label} to a store on disk ({}): write+fsync limit first",
            disk.path().display()
        ));
        report.disk.write_fsync_gbps =
            crate::limits::write_fsync_gbps(disk.path(), plan.limit_bytes)?;
        let n = usize::try_from(size.bytes)?;
        let mut src = ctx
            .client
            .alloc_labeled(n, "bench-disk")
            .await
            .context("allocating the source buffer")?;
        fill_random(src.as_mut_slice(), 3);
        let body = Bytes::copy_from_slice(src.as_slice());
        let key = "large/disk";
        let mut s3dma = Vec::new();
        let mut http = Vec::new();
        for _ in 0..plan.rounds {
            let t = Instant::now();
            ctx.client
                .put_object_from(BUCKET, key, &src, 0..n, PutOptions::default())
                .await
                .with_context(|| format!("s3dma PUT {label} to disk"))?;
            s3dma.extend(gbps(size.bytes, t.elapsed()));
            let t = Instant::now();
            ctx.s3
                .put_object()
                .bucket(BUCKET)
                .key(key)
                .content_length(i64::try_from(n)?)
                .body(ByteStream::from(body.clone()))
                .send()
                .await
                .map_err(|e| {
                    anyhow!(
                        "HTTP PUT {label} to disk: {}",
                        aws_sdk_s3::error::DisplayErrorContext(e)
                    )
                })?;
            http.extend(gbps(size.bytes, t.elapsed()));
        }
        src.release().await.context("releasing a buffer")?;
        report.disk.put_gbps = median(&s3dma);
        report.disk.http_put_gbps = median(&http);
        report.disk.object_bytes = size.bytes;
        progress(&format!(
            "PUT {label} to disk: s3dma {} GB/s, HTTP {} GB/s, write+fsync {} GB/s",
            crate::report::fmt_num(report.disk.put_gbps),
            crate::report::fmt_num(report.disk.http_put_gbps),
            crate::report::fmt_num(report.disk.write_fsync_gbps),
        ));
        anyhow::Ok(())
    };
    let r = tokio::select! {
        r = result => r,
        e = started.stack.any_exit() => Err(e.into()),
    };
    started.stop().await;
    r
}

/// Reads the CPU time of the agent, the shim, the target and this process.
#[derive(Debug, Clone)]
struct CpuProbe {
    /// agent, shim, target (unknown for an attached stack); self.
    pids: [Option<u32>; 4],
    hz: u64,
}

impl CpuProbe {
    fn now(&self) -> anyhow::Result<[u64; 4]> {
        let mut out = [0u64; 4];
        for (slot, pid) in out.iter_mut().zip(self.pids) {
            let Some(pid) = pid else { continue };
            let path = format!("/proc/{pid}/stat");
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
            *slot = procfs::cpu_ticks(&text).ok_or_else(|| anyhow!("cannot parse {path}"))?;
        }
        Ok(out)
    }

    fn since(&self, before: [u64; 4]) -> anyhow::Result<CpuSecs> {
        let after = self.now()?;
        let d = |i: usize| ticks_to_secs(after[i].saturating_sub(before[i]), self.hz);
        Ok(CpuSecs {
            agent: d(0),
            shim: d(1),
            target: d(2),
            client: d(3),
        })
    }
}

/// The clients and what the phases share.
#[derive(Debug)]
struct Ctx {
    client: Client,
    s3: aws_sdk_s3::Client,
    cpu: CpuProbe,
    data_dir: String,
    /// The store's data directory when the bench started the stack.
    data_path: Option<PathBuf>,
    /// The shim's socket (for the tenant processes).
    socket: PathBuf,
    /// The uid the shim runs as (for the tenant processes).
    shim_uid: Option<u32>,
    /// `/metrics` of host-shim, dpu-agent and storage-target (a stack the
    /// bench started).
    metrics: Option<[String; 3]>,
}

/// The latency histograms read for [`Layers`]: each service's metric, by
/// its `op` label.
const LAYER_METRICS: [&str; 3] = [
    "s3dma_shim_request_seconds",
    "s3dma_agent_request_seconds",
    "s3dma_storage_target_request_duration_seconds",
];

/// `_sum` and `_count` of each of [`LAYER_METRICS`] for `op`.
async fn layer_totals(addrs: &[String; 3], op: Op) -> anyhow::Result<[(f64, f64); 3]> {
    let label = match op {
        Op::Get => "GetObject",
        Op::Put => "PutObject",
    };
    let mut out = [(0.0, 0.0); 3];
    for ((addr, metric), slot) in addrs.iter().zip(LAYER_METRICS).zip(&mut out) {
        let text = crate::fanout::scrape(addr).await?;
        let want = Some(("op", label));
        *slot = (
            crate::fanout::sample_sum(&text, &format!("{metric}_sum"), want),
            crate::fanout::sample_sum(&text, &format!("{metric}_count"), want),
        );
    }
    Ok(out)
}

/// The mean µs per request in each layer between two [`layer_totals`].
fn layers_between(before: [(f64, f64); 3], after: [(f64, f64); 3]) -> Layers {
    let mean = |i: usize| {
        let n = after[i].1 - before[i].1;
        (n > 0.0).then(|| (after[i].0 - before[i].0) / n * 1e6)
    };
    Layers {
        shim_us: mean(0),
        agent_us: mean(1),
        target_us: mean(2),
    }
}

impl Ctx {
    async fn new(stack: &Stack, data_path: &Path) -> anyhow::Result<Ctx> {
        let ep = stack.endpoints();
        let (key_id, secret) = stack.credentials();
        let pid = |name: &str| {
            stack
                .pid(name)
                .ok_or_else(|| anyhow!("{name} is not running"))
        };
        let pids = [pid("dpu-agent")?, pid("host-shim")?, pid("storage-target")?];
        let mut ctx = Ctx::connect(
            &ep.socket,
            &ep.target_url,
            key_id,
            secret,
            Some(pids),
            data_path.display().to_string(),
            crate::own_shim(),
        )
        .await?;
        ctx.data_path = Some(data_path.to_path_buf());
        ctx.shim_uid = Some(s3dma_service::private::current_uid());
        ctx.metrics = match (&ep.shim_metrics, &ep.agent_metrics, &ep.target_metrics) {
            (Some(s), Some(a), Some(t)) => Some([s.clone(), a.clone(), t.clone()]),
            _ => None,
        };
        Ok(ctx)
    }

    async fn connect(
        socket: &Path,
        target_url: &str,
        key_id: &str,
        secret: &str,
        pids: Option<[u32; 3]>,
        data_dir: String,
        client_options: ClientOptions,
    ) -> anyhow::Result<Ctx> {
        let client = Client::connect_with(socket, client_options)
            .await
            .context("connecting to the host-shim")?;
        let conf = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .http_client(s3dma_launcher::https_client())
            .region(Region::new(REGION))
            .endpoint_url(target_url)
            .credentials_provider(Credentials::new(key_id, secret, None, None, "s3dma-bench"))
            .force_path_style(true)
            .build();
        let [a, s, t] = pids.map_or([None; 3], |p| p.map(Some));
        Ok(Ctx {
            client,
            s3: aws_sdk_s3::Client::from_conf(conf),
            cpu: CpuProbe {
                pids: [a, s, t, Some(std::process::id())],
                hz: crate::stats::ticks_per_sec(),
            },
            data_dir,
            data_path: None,
            socket: socket.to_path_buf(),
            shim_uid: None,
            metrics: None,
        })
    }
}

async fn measure(ctx: &Ctx, plan: &Plan) -> anyhow::Result<Report> {
    let mut report = Report {
        quick: plan.quick,
        rounds: plan.rounds,
        cell_secs: plan.cell.as_secs_f64(),
        cpus: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        data_dir: ctx.data_dir.clone(),
        services_cpu: ctx.cpu.pids[..3].iter().all(Option::is_some),
        sizes: plan.sizes.to_vec(),
        ..Report::default()
    };

    progress(&format!(
        "raw loopback TCP: {RAW_TCP_TRIES} runs of {} s",
        plan.raw_tcp.as_secs_f64()
    ));
    // The best of a few runs: a limit is what the machine can do, and one
    // run on a shared machine can land on a busy second (1 s runs measured
    // 2.5 and 5.1 GB/s in two runs of one day).
    let mut runs = Vec::with_capacity(RAW_TCP_TRIES);
    for _ in 0..RAW_TCP_TRIES {
        runs.push(raw_tcp(plan.raw_tcp).await.context("raw TCP")?);
    }
    report.raw_tcp_gbps = runs.iter().copied().reduce(f64::max);
    progress(&format!(
        "raw loopback TCP: {:.2} GB/s (best of {})",
        report.raw_tcp_gbps.unwrap_or(0.0),
        runs.iter()
            .map(|g| format!("{g:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    ));

    progress("machine limits: memcpy, MD5, write+fsync in the data directory");
    let dur = plan.raw_tcp / 2;
    report.limits.memcpy_gbps = crate::limits::memcpy_gbps(plan.limit_bytes, dur);
    report.limits.md5_gbps = crate::limits::md5_gbps(plan.limit_bytes, dur);
    if let Some(dir) = &ctx.data_path {
        report.limits.write_fsync_gbps = crate::limits::write_fsync_gbps(dir, plan.limit_bytes)?;
    }
    progress(&format!(
        "limits: memcpy {} GB/s, MD5 {} GB/s, write+fsync {} GB/s",
        crate::report::fmt_num(report.limits.memcpy_gbps),
        crate::report::fmt_num(report.limits.md5_gbps),
        crate::report::fmt_num(report.limits.write_fsync_gbps),
    ));

    let big = plan.large_bytes();
    let mut src = ctx
        .client
        .alloc_labeled(big, "bench-src")
        .await
        .context("allocating the source buffer")?;
    fill_random(src.as_mut_slice(), 1);
    let mut dst = ctx
        .client
        .alloc_labeled(big, "bench-dst")
        .await
        .context("allocating the destination buffer")?;
    dst.as_mut_slice().fill(0);
    let src_bytes = Bytes::copy_from_slice(src.as_slice());
    let mut http_dst = vec![0u8; big];

    for size in plan.sizes.into_iter().filter(|_| plan.runs(Phase::Large)) {
        large::large(
            ctx,
            plan,
            size,
            &src,
            &mut dst,
            &src_bytes,
            &mut http_dst,
            &mut report,
        )
        .await?;
    }
    drop(http_dst);
    // Release the large buffers before the small phase.
    dst.release().await.context("releasing a buffer")?;
    drop(src_bytes);

    if plan.runs(Phase::Procs) {
        processes(ctx, plan, &mut report).await?;
    }
    if plan.runs(Phase::Small) {
        small::small(ctx, plan, &src, &mut report).await?;
    }
    if plan.runs(Phase::Batch) {
        batch::batch(ctx, plan, &src, &mut report).await?;
    }
    src.release().await.context("releasing a buffer")?;
    Ok(report)
}

/// Aggregate PUT then GET throughput of 1, 2, 4 and 8 tenant processes
/// (`bench-worker`), each with its own lease, buffer and object; every GET
/// must read back what its process PUT (CRC-32).
async fn processes(ctx: &Ctx, plan: &Plan, report: &mut Report) -> anyhow::Result<()> {
    report.procs_object_bytes = plan.procs_bytes;
    for n in PROCS {
        let spec = |op: WorkerOp, i: usize| crate::workers::Spec {
            opts: WorkerOptions {
                op,
                bucket: BUCKET.into(),
                key: format!("procs/{i}"),
                bytes: plan.procs_bytes,
                rounds: plan.procs_rounds,
                seed: 100 + i as u64,
                socket: Some(ctx.socket.clone()),
                http: None,
                shim_uid: ctx.shim_uid,
            },
            env: Vec::new(),
        };
        progress(&format!(
            "{n} tenant process(es): PUT then GET {} each, {} round(s)",
            human_size(plan.procs_bytes),
            plan.procs_rounds
        ));
        let put = crate::workers::run((0..n).map(|i| spec(WorkerOp::Put, i)).collect())
            .await
            .with_context(|| format!("{n} tenant processes PUT"))?;
        let get = crate::workers::run((0..n).map(|i| spec(WorkerOp::Get, i)).collect())
            .await
            .with_context(|| format!("{n} tenant processes GET"))?;
        if get.crcs != put.crcs {
            bail!("{n} tenant processes: a GET read other bytes than its process PUT");
        }
        progress(&format!(
            "{n} tenant process(es): PUT {:.2} GB/s, GET {:.2} GB/s aggregate",
            put.gbps, get.gbps
        ));
        report.procs.push(ProcsRow {
            processes: n,
            get_gbps: Some(get.gbps),
            put_gbps: Some(put.gbps),
        });
    }
    Ok(())
}
