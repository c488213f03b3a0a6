//! `s3dma-tools soak`: mixed, verified load from many clients against a local
//! stack, watching the services' memory and file descriptors.
//!
//! It starts storage-target, dpu-agent and host-shim (the [`Stack`] of
//! `s3dma local`, with their metrics endpoints) in a temporary directory,
//! then runs `--clients` workers for `--duration`. Each worker has its own
//! [`Client`] (lease and gRPC connection) and buffer, owns the keys
//! `soak/wNN/k0..k7`, and keeps a model of them (size, ETag, the seed of the
//! random bytes and their CRC-32), so that every reply is checked: PUT
//! (sizes from 0 bytes to 16 MiB, and on worker 0 now and then a 72 MiB
//! multipart upload), GET of the whole object (CRC-32) or of a random range
//! (bytes compared with the regenerated content), HEAD (size, ETag,
//! metadata), LIST of the worker's prefix (keys, sizes, ETags), DELETE, and
//! `NoSuchKey` for objects the model says are gone. The mix and the rules of
//! the verdict are in [`crate::soak_check`].
//!
//! Every sample interval (about 40 per run, 1 s to 60 s) it prints one
//! `soak sample` line with each service's `VmRSS`, `RssShmem` and open fds
//! (`/proc/PID/status`, `/proc/PID/fd`). At the end it stops the load,
//! releases the clients, waits for the services' gauges to return to 0,
//! and prints exactly one `soak: PASS ...` or `soak: FAIL <reasons>` line
//! on stdout; details of failures go to stderr as `soak error: ...`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use rand::rngs::SmallRng;
use rand::{Rng as _, RngCore as _, SeedableRng as _};
use s3dma_client::{ByteRange, Client, ErrorKind, GetOptions, PutOptions};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::{Instant, sleep, timeout};

use crate::procfs;
use crate::soak_check::{
    END_GAUGES, MAX_SIZE, MULTIPART_SIZE, ProcSample, Sample, SoakOp, Totals, growth,
    growth_problems, growth_summary, metric_sum, pick_op, pick_range, pick_size, sample_interval,
    sample_line, verdict,
};
use s3dma_launcher::Stack;

use crate::own_stack::{start_stack, temp_dir};

/// The bucket the soak creates and uses.
const BUCKET: &str = "soak";
/// Keys per worker.
const KEYS: usize = 8;
/// The services, in the order samples list them.
const NAMES: [&str; 3] = ["storage-target", "dpu-agent", "host-shim"];
/// Failure messages printed (the count goes on).
const MAX_PRINTED_FAILURES: u64 = 20;
/// How long workers may take to finish their last operation.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the end gauges may take to reach 0.
const GAUGE_TIMEOUT: Duration = Duration::from_secs(15);

/// What `s3dma-tools soak` was asked for.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// How long the load runs.
    pub duration: Duration,
    /// Concurrent clients.
    pub clients: usize,
    /// Time between samples (default: [`sample_interval`]).
    pub sample_every: Option<Duration>,
    /// Seed of the workers' random choices (default: random, printed).
    pub seed: Option<u64>,
}

/// Runs the soak and prints the closing line; whether it passed.
pub(crate) async fn main(opts: Options) -> bool {
    let (passed, line) = match run(opts).await {
        Ok(v) => v,
        Err(e) => {
            let reason = format!("{e:#}")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            (false, format!("soak: FAIL {reason}"))
        }
    };
    println!("{line}");
    passed
}

/// What the workers share.
#[derive(Debug, Default)]
struct Shared {
    ops: [AtomicU64; 6],
    bytes: AtomicU64,
    failures: AtomicU64,
    stop: AtomicBool,
}

impl Shared {
    fn fail(&self, worker: usize, msg: &str) {
        let n = self.failures.fetch_add(1, Ordering::Relaxed);
        if n < MAX_PRINTED_FAILURES {
            eprintln!("soak error: worker {worker}: {msg}");
        } else if n == MAX_PRINTED_FAILURES {
            eprintln!("soak error: (further failures are only counted)");
        }
    }

    fn done(&self, op: SoakOp, bytes: usize) {
        self.ops[op.index()].fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn totals(&self) -> Totals {
        let mut ops = [0u64; 6];
        for (o, a) in ops.iter_mut().zip(&self.ops) {
            *o = a.load(Ordering::Relaxed);
        }
        Totals {
            ops,
            bytes: self.bytes.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
        }
    }
}

async fn run(opts: Options) -> anyhow::Result<(bool, String)> {
    if opts.clients == 0 || opts.clients > 1024 {
        anyhow::bail!("--clients must be 1 to 1024");
    }
    if opts.duration.is_zero() {
        anyhow::bail!("--duration must be more than 0");
    }
    let seed = opts.seed.unwrap_or_else(rand::random);
    let every = opts
        .sample_every
        .unwrap_or_else(|| sample_interval(opts.duration))
        .max(Duration::from_millis(100));
    let tmp = temp_dir("s3dma-soak-")?;
    let mut stack = start_stack(tmp.path(), "s3dma-tools soak", |o| {
        o.bucket = BUCKET.into();
    })
    .await?;
    eprintln!(
        "s3dma-tools soak: {} clients for {}, a sample every {}, seed {seed}",
        opts.clients,
        humantime::format_duration(opts.duration),
        humantime::format_duration(every)
    );
    let result = soak(&mut stack, &opts, seed, every).await;
    stack.stop().await;
    result
}

fn pids(stack: &Stack) -> anyhow::Result<Vec<u32>> {
    NAMES
        .iter()
        .map(|n| stack.pid(n).ok_or_else(|| anyhow!("{n} is not running")))
        .collect()
}

/// RSS and fds of each process; an error when one is gone.
fn sample_procs(pids: &[u32]) -> anyhow::Result<Vec<ProcSample>> {
    pids.iter()
        .zip(NAMES)
        .map(|(pid, name)| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .with_context(|| format!("{name} (pid {pid}) is gone"))?;
            let mem = procfs::Memory::parse(&status)
                .ok_or_else(|| anyhow!("cannot read VmRSS of {name} (pid {pid})"))?;
            let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .with_context(|| format!("listing the fds of {name} (pid {pid})"))?
                .count() as u64;
            Ok(ProcSample {
                rss_kib: mem.rss_kib,
                shmem_kib: mem.shmem_kib,
                fds,
            })
        })
        .collect()
}

async fn soak(
    stack: &mut Stack,
    opts: &Options,
    seed: u64,
    every: Duration,
) -> anyhow::Result<(bool, String)> {
    let pids = pids(stack)?;
    let ep = stack.endpoints().clone();
    let shared = Arc::new(Shared::default());
    let mut problems: Vec<String> = Vec::new();

    let start = Instant::now();
    let end = start + opts.duration;
    let mut workers = Vec::with_capacity(opts.clients);
    for i in 0..opts.clients {
        let shared = Arc::clone(&shared);
        let socket = ep.socket.clone();
        let wseed = seed
            .wrapping_add(i as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        workers.push(tokio::spawn(async move {
            worker(i, &socket, wseed, end, &shared).await;
        }));
    }

    // Sample until the end, checking the services every second.
    let mut samples: Vec<Sample> = Vec::new();
    let mut next_sample = start + every;
    while Instant::now() < end {
        let wake = next_sample
            .min(end)
            .min(Instant::now() + Duration::from_secs(1));
        tokio::time::sleep_until(wake).await;
        if let Some(e) = stack.dead() {
            problems.push(format!("{e:#}"));
            shared.stop.store(true, Ordering::Relaxed);
            break;
        }
        if Instant::now() >= next_sample && Instant::now() < end {
            let procs = match sample_procs(&pids) {
                Ok(p) => p,
                Err(e) => {
                    problems.push(format!("{e:#}"));
                    shared.stop.store(true, Ordering::Relaxed);
                    break;
                }
            };
            let s = Sample {
                at: start.elapsed(),
                ops: shared.totals().ops.iter().sum(),
                procs,
            };
            println!("{}", sample_line(&s, &NAMES));
            samples.push(s);
            next_sample += every;
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed();

    // Let the workers finish their last operation and release their clients.
    let drain = Instant::now() + DRAIN_TIMEOUT;
    for (i, w) in workers.into_iter().enumerate() {
        let left = drain.saturating_duration_since(Instant::now());
        match timeout(left, w).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => problems.push(format!("worker {i} failed: {e}")),
            Err(_) => problems.push(format!(
                "worker {i} did not finish within {} s of the end",
                DRAIN_TIMEOUT.as_secs()
            )),
        }
    }
    if problems.is_empty()
        && let Some(e) = stack.dead()
    {
        problems.push(format!("{e:#}"));
    }
    if problems.is_empty() {
        problems.extend(growth_problems(
            &samples,
            &NAMES,
            opts.duration,
            opts.clients,
        ));
        problems.extend(end_gauges(&ep).await);
        match sample_procs(&pids) {
            Ok(procs) => {
                let s = Sample {
                    at: start.elapsed(),
                    ops: shared.totals().ops.iter().sum(),
                    procs,
                };
                println!("{} (after the load)", sample_line(&s, &NAMES));
            }
            Err(e) => problems.push(format!("{e:#}")),
        }
    }
    let summary = growth(&samples, NAMES.len(), opts.duration)
        .map(|g| growth_summary(&g, &NAMES))
        .unwrap_or_default();
    Ok(verdict(&shared.totals(), elapsed, &problems, &summary))
}

/// Waits for every [`END_GAUGES`] metric to read 0; the ones that do not.
async fn end_gauges(ep: &s3dma_launcher::Endpoints) -> Vec<String> {
    let addr = |name: &str| match name {
        "host-shim" => ep.shim_metrics.clone(),
        "dpu-agent" => ep.agent_metrics.clone(),
        _ => ep.target_metrics.clone(),
    };
    let deadline = Instant::now() + GAUGE_TIMEOUT;
    loop {
        let mut bad = Vec::new();
        let mut texts: HashMap<&str, String> = HashMap::new();
        for (service, metric) in END_GAUGES {
            if !texts.contains_key(service) {
                let text = match addr(service) {
                    Some(a) => fetch_metrics(&a)
                        .await
                        .with_context(|| format!("reading {service}'s metrics at {a}")),
                    None => Err(anyhow!("{service} has no metrics endpoint")),
                };
                match text {
                    Ok(t) => {
                        texts.insert(service, t);
                    }
                    Err(e) => {
                        bad.push(format!("{e:#}"));
                        continue;
                    }
                }
            }
            let text = texts.get(service).map_or("", String::as_str);
            match metric_sum(text, metric) {
                Some(0.0) => {}
                // A labelled gauge with no series yet (no tenant used it).
                None if metric != "s3dma_shim_windows_open" => {}
                Some(v) => bad.push(format!("{metric} is {v} at the end, not 0")),
                None => bad.push(format!("{service} does not report {metric}")),
            }
        }
        if bad.is_empty() || Instant::now() >= deadline {
            return bad;
        }
        sleep(Duration::from_millis(250)).await;
    }
}

/// `GET /metrics` from `addr` (`IP:PORT`): the body.
async fn fetch_metrics(addr: &str) -> anyhow::Result<String> {
    let io = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET /metrics HTTP/1.0\r\nhost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).await?;
        Ok::<_, std::io::Error>(resp)
    };
    let resp = timeout(Duration::from_secs(10), io)
        .await
        .map_err(|_| anyhow!("no answer within 10 s"))??;
    let text = String::from_utf8_lossy(&resp);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("malformed HTTP reply"))?;
    let status = head.split_whitespace().nth(1).unwrap_or("?");
    if status != "200" {
        anyhow::bail!("HTTP {status}");
    }
    Ok(body.to_owned())
}

/// What a worker believes one of its keys holds.
#[derive(Debug, Clone)]
struct Obj {
    len: usize,
    seed: u64,
    crc: u32,
    etag: String,
}

fn fill(buf: &mut [u8], seed: u64) {
    SmallRng::seed_from_u64(seed).fill_bytes(buf);
}

async fn worker(i: usize, socket: &Path, seed: u64, end: Instant, shared: &Shared) {
    let client = match Client::connect_with(socket, crate::own_shim()).await {
        Ok(c) => c,
        Err(e) => return shared.fail(i, &format!("connecting: {e}")),
    };
    let cap = if i == 0 { MULTIPART_SIZE } else { MAX_SIZE };
    let mut buf = match client.alloc_labeled(cap, "soak").await {
        Ok(b) => b,
        Err(e) => return shared.fail(i, &format!("allocating {cap} bytes: {e}")),
    };
    let mut scratch = vec![0u8; cap];
    let mut model: Vec<Option<Obj>> = vec![None; KEYS];
    let mut rng = SmallRng::seed_from_u64(seed);
    let prefix = format!("soak/w{i:03}/");
    while Instant::now() < end && !shared.stop.load(Ordering::Relaxed) {
        let k = rng.random_range(0..KEYS);
        let key = format!("{prefix}k{k}");
        let op = pick_op(rng.random());
        let r: anyhow::Result<usize> = match op {
            SoakOp::Put => {
                let len = if i == 0 && rng.random_ratio(1, 40) {
                    MULTIPART_SIZE
                } else {
                    pick_size(rng.random())
                };
                let s: u64 = rng.random();
                fill(&mut buf.as_mut_slice()[..len], s);
                let crc = crc32fast::hash(&buf.as_slice()[..len]);
                let opts = PutOptions {
                    content_type: Some("application/x-s3dma-soak".into()),
                    metadata: HashMap::from([("seed".to_owned(), format!("{s:016x}"))]),
                };
                match client
                    .put_object_from(BUCKET, &key, &buf, 0..len, opts)
                    .await
                {
                    Ok(out) if out.size == len as u64 => {
                        model[k] = Some(Obj {
                            len,
                            seed: s,
                            crc,
                            etag: out.etag,
                        });
                        Ok(len)
                    }
                    Ok(out) => {
                        // The object's state is unknown now.
                        model[k] = None;
                        let _ = client.delete(BUCKET, &key).await;
                        Err(anyhow!("PUT {key}: {len} bytes stored as {}", out.size))
                    }
                    Err(e) => {
                        model[k] = None;
                        let _ = client.delete(BUCKET, &key).await;
                        Err(anyhow!("PUT {key} ({len} bytes): {e}"))
                    }
                }
            }
            SoakOp::Get => match &model[k] {
                None => expect_missing(
                    client
                        .get_object_into(BUCKET, &key, &mut buf, 0, GetOptions::default())
                        .await
                        .map(|_| ()),
                    &key,
                ),
                Some(o) => {
                    match client
                        .get_object_into(BUCKET, &key, &mut buf, 0, GetOptions::default())
                        .await
                    {
                        Err(e) => Err(anyhow!("GET {key}: {e}")),
                        Ok(got)
                            if got.bytes_placed != o.len as u64 || got.object.etag != o.etag =>
                        {
                            Err(anyhow!(
                                "GET {key}: {} bytes, ETag {}; expected {} bytes, ETag {}",
                                got.bytes_placed,
                                got.object.etag,
                                o.len,
                                o.etag
                            ))
                        }
                        Ok(_) if crc32fast::hash(&buf.as_slice()[..o.len]) != o.crc => {
                            Err(anyhow!("GET {key}: the {} bytes differ (CRC-32)", o.len))
                        }
                        Ok(_) => Ok(o.len),
                    }
                }
            },
            SoakOp::GetRange => match &model[k] {
                None => expect_missing(
                    client
                        .get_object_into(
                            BUCKET,
                            &key,
                            &mut buf,
                            0,
                            GetOptions {
                                range: Some(ByteRange::From(0)),
                                ..GetOptions::default()
                            },
                        )
                        .await
                        .map(|_| ()),
                    &key,
                ),
                Some(o) => match pick_range(o.len as u64, rng.random(), rng.random()) {
                    // An empty object has no range to read: HEAD it instead.
                    None => check_head(&client, &key, o).await.map(|()| 0),
                    Some((first, last)) => {
                        let opts = GetOptions {
                            range: Some(ByteRange::Bounded { first, last }),
                            ..GetOptions::default()
                        };
                        let want = (last - first + 1) as usize;
                        let at = rng.random_range(0..=cap - want);
                        match client
                            .get_object_into(BUCKET, &key, &mut buf, at, opts)
                            .await
                        {
                            Err(e) => Err(anyhow!("GET {key} bytes {first}-{last}: {e}")),
                            Ok(got)
                                if got.bytes_placed != want as u64 || got.range_start != first =>
                            {
                                Err(anyhow!(
                                    "GET {key} bytes {first}-{last}: {} bytes from {}",
                                    got.bytes_placed,
                                    got.range_start
                                ))
                            }
                            Ok(_) => {
                                fill(&mut scratch[..o.len], o.seed);
                                let (f, l) = (first as usize, last as usize);
                                if buf.as_slice()[at..at + want] == scratch[f..=l] {
                                    Ok(want)
                                } else {
                                    Err(anyhow!("GET {key} bytes {first}-{last}: the bytes differ"))
                                }
                            }
                        }
                    }
                },
            },
            SoakOp::Head => match &model[k] {
                None => expect_missing(client.head(BUCKET, &key).await.map(|_| ()), &key),
                Some(o) => check_head(&client, &key, o).await.map(|()| 0),
            },
            SoakOp::List => match client.list_all(BUCKET, &prefix).await {
                Err(e) => Err(anyhow!("LIST {prefix}: {e}")),
                Ok(listed) => {
                    let mut got: Vec<(String, u64, String)> = listed
                        .into_iter()
                        .map(|o| (o.key, o.size, o.etag))
                        .collect();
                    got.sort();
                    let mut want: Vec<(String, u64, String)> = model
                        .iter()
                        .enumerate()
                        .filter_map(|(k, o)| {
                            o.as_ref()
                                .map(|o| (format!("{prefix}k{k}"), o.len as u64, o.etag.clone()))
                        })
                        .collect();
                    want.sort();
                    if got == want {
                        Ok(0)
                    } else {
                        Err(anyhow!("LIST {prefix}: got {got:?}, expected {want:?}"))
                    }
                }
            },
            SoakOp::Delete => {
                let r = client.delete(BUCKET, &key).await;
                model[k] = None;
                r.map(|()| 0).map_err(|e| anyhow!("DELETE {key}: {e}"))
            }
        };
        match r {
            Ok(bytes) => shared.done(op, bytes),
            Err(msg) => shared.fail(i, &msg.to_string()),
        }
    }
    if let Err(e) = buf.release().await {
        shared.fail(i, &format!("releasing the buffer: {e}"));
    }
}

/// A missing object must be `NotFound`.
fn expect_missing(r: Result<(), s3dma_client::Error>, key: &str) -> anyhow::Result<usize> {
    match r {
        Err(e) if e.kind == ErrorKind::NotFound => Ok(0),
        Err(e) => Err(anyhow!("{key} should be missing: {e}")),
        Ok(()) => Err(anyhow!("{key} should be missing but was read")),
    }
}

async fn check_head(client: &Client, key: &str, o: &Obj) -> anyhow::Result<()> {
    let info = client
        .head(BUCKET, key)
        .await
        .map_err(|e| anyhow!("HEAD {key}: {e}"))?;
    let seed = info.metadata.get("seed").cloned().unwrap_or_default();
    if info.size != o.len as u64
        || info.etag != o.etag
        || seed != format!("{:016x}", o.seed)
        || info.content_type != "application/x-s3dma-soak"
    {
        return Err(anyhow!(
            "HEAD {key}: size {} ETag {} seed {seed:?} type {:?}; expected {} {} {:016x}",
            info.size,
            info.etag,
            info.content_type,
            o.len,
            o.etag,
            o.seed
        ));
    }
    Ok(())
}
