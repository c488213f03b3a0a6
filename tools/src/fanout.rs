//! `s3dma-tools bench --fanout`: N tenant processes load the same object
//! through s3dma gateways in front of an existing S3 cluster, against the
//! same N processes reading it with aws-sdk-s3 straight from the cluster, in
//! one run.
//!
//! 1. The upstream: `--upstream URL` (the tenant's key in the usual AWS
//!    variables), or a throw-away one-node Ceph cluster (radosgw on a
//!    memstore OSD) started with the repository's `tests/ceph/cluster.sh`
//!    from Debian's packages, with a user made for the run.
//! 2. The stack: [`Stack`](s3dma_launcher::Stack) with `--gateways K` storage-targets as gateways
//!    in front of it (each with a read cache in registered memory, sized to
//!    hold its share of the object), one dpu-agent spreading each object's
//!    chunks over them, one host-shim.
//! 3. Raw loopback TCP for ~2 s: the machine's limit for one stream.
//! 4. Each round writes a new version of the object straight to the
//!    upstream (so the gateways' caches are cold for it), then starts N
//!    reader processes (`s3dma-tools bench-worker`, each its own tenant
//!    process with its own lease and buffer) that connect, allocate and
//!    wait; all are released at once and the wall time to the last reader's
//!    finish is the round's figure (N × size / wall). Then the same with N
//!    readers using aws-sdk-s3 against the upstream. Every reader checks the
//!    CRC-32 of what it read.
//! 5. From the gateways' metrics, before and after each s3dma round: bytes
//!    read from the upstream (`fanout_upstream_read_ratio` = those bytes /
//!    object size, over all rounds) and the chunk reads that made no
//!    upstream request of their own (`gateway_hit_ratio`: cache hits and
//!    single-flight waits over all chunk reads).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use rand::Rng as _;
use s3dma_launcher::{REGION, Upstream};
use tokio::process::Command;
use tokio::time::Instant;

use crate::options::{Options, progress, write_json};
use crate::own_stack::{start_stack, temp_dir};
use crate::primitives::ensure_bucket;
use crate::stats::median;
use crate::workers::{self, WorkerOp, WorkerOptions};

/// The bucket the fan-out reads from.
const BUCKET: &str = "fanout";
/// The object's key.
const KEY: &str = "checkpoint.bin";

/// What the fan-out measures, from the options.
#[derive(Debug, Clone)]
struct Plan {
    readers: usize,
    gateways: usize,
    object_bytes: u64,
    rounds: usize,
    raw_tcp: Duration,
}

impl Plan {
    fn new(o: &Options) -> anyhow::Result<Plan> {
        let readers = o.readers.unwrap_or(8);
        if !(1..=64).contains(&readers) {
            bail!("--readers must be 1 to 64");
        }
        let gateways = o.gateways.unwrap_or(2);
        if !(1..=Upstream::MAX_GATEWAYS).contains(&gateways) {
            bail!("--gateways must be 1 to {}", Upstream::MAX_GATEWAYS);
        }
        let mib = o.object_mib.unwrap_or(if o.quick { 64 } else { 1024 });
        if !(1..=16384).contains(&mib) {
            bail!("--object-mib must be 1 to 16384");
        }
        let rounds = o.rounds.unwrap_or(if o.quick { 1 } else { 3 });
        if !(1..=100).contains(&rounds) {
            bail!("--rounds must be 1 to 100 with --fanout");
        }
        Ok(Plan {
            readers,
            gateways,
            object_bytes: mib << 20,
            rounds,
            raw_tcp: if o.quick {
                Duration::from_secs(1)
            } else {
                Duration::from_secs(2)
            },
        })
    }

    /// Each gateway's cache: its rendezvous share of the object with room
    /// to spare (shares are uneven), plus room for the previous round's
    /// chunks on their way out; at least 256 MiB.
    fn cache_bytes(&self) -> u64 {
        let share = self.object_bytes.div_ceil(self.gateways as u64);
        (share * 2 + (64 << 20)).max(256 << 20)
    }
}

/// The figures of a fan-out run (flat JSON keys, see [`Report::json`]).
#[derive(Debug, Clone, Default)]
struct Report {
    readers: usize,
    gateways: usize,
    object_bytes: u64,
    rounds: usize,
    upstream: String,
    raw_tcp_gbps: f64,
    s3dma_rounds: Vec<f64>,
    http_rounds: Vec<f64>,
    upstream_bytes: f64,
    chunk_reads: f64,
    chunk_hits: f64,
    slowest_reader_s: f64,
    fastest_reader_s: f64,
}

impl Report {
    fn fanout_gbps(&self) -> Option<f64> {
        median(&self.s3dma_rounds)
    }
    fn http_gbps(&self) -> Option<f64> {
        median(&self.http_rounds)
    }
    fn upstream_ratio(&self) -> f64 {
        self.upstream_bytes / (self.object_bytes as f64 * self.rounds as f64)
    }
    fn hit_ratio(&self) -> Option<f64> {
        (self.chunk_reads > 0.0).then(|| self.chunk_hits / self.chunk_reads)
    }

    fn json(&self) -> serde_json::Value {
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        serde_json::json!({
            "fanout_readers": self.readers,
            "fanout_gateways": self.gateways,
            "fanout_object_bytes": self.object_bytes,
            "fanout_rounds": self.rounds,
            "fanout_gbps": self.fanout_gbps(),
            "fanout_http_gbps": self.http_gbps(),
            "fanout_vs_http": ratio(self.fanout_gbps(), self.http_gbps()),
            "fanout_vs_raw_tcp": ratio(self.fanout_gbps(), Some(self.raw_tcp_gbps)),
            "fanout_upstream_read_ratio": self.upstream_ratio(),
            "gateway_hit_ratio": self.hit_ratio(),
            "raw_tcp_gbps": self.raw_tcp_gbps,
            "fanout_gbps_rounds": self.s3dma_rounds,
            "fanout_http_gbps_rounds": self.http_rounds,
        })
    }

    fn table(&self) -> String {
        let f = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
        let vs = match (self.fanout_gbps(), self.http_gbps()) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        format!(
            "fan-out: {readers} tenant processes load one {size} object; upstream {up}\n\
             machine: {cpus} CPUs; raw loopback TCP {raw:.2} GB/s (one stream)\n\
             \n\
             path                                   aggregate GB/s   rounds\n\
             s3dma, {gw} gateway(s) in front         {s3:>14}   {s3r}\n\
             aws-sdk-s3 straight from the upstream  {http:>14}   {httpr}\n\
             \n\
             s3dma / HTTP: {vs}; s3dma / raw TCP: {raw_ratio}\n\
             upstream read: {ur:.3} copies of the object per round (gateway metrics)\n\
             gateway chunk reads with no upstream request of their own: {hit}\n\
             s3dma readers: fastest {fast:.2} s, slowest {slow:.2} s (last round)\n",
            readers = self.readers,
            size = crate::report::human_size(self.object_bytes),
            up = self.upstream,
            cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            raw = self.raw_tcp_gbps,
            gw = self.gateways,
            s3 = f(self.fanout_gbps()),
            s3r = rounds_text(&self.s3dma_rounds),
            http = f(self.http_gbps()),
            httpr = rounds_text(&self.http_rounds),
            raw_ratio = self
                .fanout_gbps()
                .map_or("-".into(), |g| format!("{:.2}x", g / self.raw_tcp_gbps)),
            ur = self.upstream_ratio(),
            hit = self
                .hit_ratio()
                .map_or("-".into(), |h| format!("{:.1}%", h * 100.0)),
            fast = self.fastest_reader_s,
            slow = self.slowest_reader_s,
        )
    }
}

fn rounds_text(v: &[f64]) -> String {
    v.iter()
        .map(|g| format!("{g:.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The upstream the gateways stand in front of, and the user there.
struct UpstreamSite {
    endpoint: String,
    region: Option<String>,
    access_key_id: String,
    secret_access_key: String,
    /// A cluster started here, stopped at the end.
    ceph: Option<CephCluster>,
}

/// A throw-away Ceph cluster started with `tests/ceph/cluster.sh`.
struct CephCluster {
    script: PathBuf,
    dir: tempfile::TempDir,
}

impl CephCluster {
    async fn stop(self) {
        let _ = Command::new("bash")
            .arg(&self.script)
            .arg("stop")
            .arg(self.dir.path().join("cluster"))
            .stdin(Stdio::null())
            .output()
            .await;
    }
}

/// `tests/ceph/cluster.sh`: `$S3DMA_CEPH_SCRIPT`, else found above the
/// current directory or this program (a build in `target/<profile>/`).
fn ceph_script() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("S3DMA_CEPH_SCRIPT") {
        return Ok(PathBuf::from(p));
    }
    let mut starts = Vec::new();
    if let Ok(d) = std::env::current_dir() {
        starts.push(d);
    }
    if let Ok(exe) = std::env::current_exe() {
        starts.push(exe);
    }
    starts
        .iter()
        .flat_map(|s| s.ancestors())
        .map(|d| d.join("tests/ceph/cluster.sh"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow!(
                "--fanout without --upstream starts a throw-away Ceph cluster with the \
                 repository's tests/ceph/cluster.sh, which is not above this directory or \
                 this program: run it from the source tree, set $S3DMA_CEPH_SCRIPT, or give \
                 --upstream URL"
            )
        })
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn random_token(len: usize, alphabet: &[u8]) -> String {
    let mut rng = rand::rng();
    (0..len)
        .map(|_| char::from(alphabet[rng.random_range(0..alphabet.len())]))
        .collect()
}

impl UpstreamSite {
    async fn open(o: &Options) -> anyhow::Result<UpstreamSite> {
        if let Some(endpoint) = &o.upstream {
            let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
            let (Some(access_key_id), Some(secret_access_key)) =
                (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY"))
            else {
                bail!(
                    "--upstream needs your key on that endpoint in AWS_ACCESS_KEY_ID and \
                     AWS_SECRET_ACCESS_KEY"
                );
            };
            return Ok(UpstreamSite {
                endpoint: endpoint.clone(),
                region: var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")),
                access_key_id,
                secret_access_key,
                ceph: None,
            });
        }
        let script = ceph_script()?;
        let dir = tempfile::Builder::new()
            .prefix("s3dma-fanout-ceph-")
            .tempdir()
            .context("creating the Ceph cluster's directory")?;
        let cluster = dir.path().join("cluster");
        let (mon, rgw) = (free_port()?, free_port()?);
        progress(&format!(
            "starting a throw-away Ceph cluster ({})",
            script.display()
        ));
        let t = Instant::now();
        let out = Command::new("bash")
            .arg(&script)
            .arg("start")
            .arg(&cluster)
            .args([mon.to_string(), rgw.to_string()])
            .arg(std::process::id().to_string())
            .stdin(Stdio::null())
            .output()
            .await
            .context("running the Ceph cluster script")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "the Ceph cluster did not start: {}{}",
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let endpoint = stdout
            .lines()
            .find_map(|l| l.strip_prefix("endpoint "))
            .ok_or_else(|| anyhow!("the Ceph cluster script printed no endpoint"))?
            .to_owned();
        let ceph = CephCluster { script, dir };
        let access_key_id = format!(
            "FANOUT{}",
            random_token(14, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        );
        let secret_access_key = random_token(
            40,
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
        );
        let out = Command::new("bash")
            .arg(&ceph.script)
            .arg("user")
            .arg(&cluster)
            .args(["fanout-bench", &access_key_id, &secret_access_key])
            .stdin(Stdio::null())
            .output()
            .await
            .context("running radosgw-admin")?;
        if !out.status.success() {
            ceph.stop().await;
            bail!(
                "creating the Ceph user: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        progress(&format!(
            "Ceph's radosgw is at {endpoint} ({:.0} s)",
            t.elapsed().as_secs_f64()
        ));
        Ok(UpstreamSite {
            endpoint,
            region: None,
            access_key_id,
            secret_access_key,
            ceph: Some(ceph),
        })
    }

    fn describe(&self) -> String {
        match &self.ceph {
            Some(_) => format!(
                "a one-node Ceph cluster (radosgw on a memstore OSD) at {}",
                self.endpoint
            ),
            None => self.endpoint.clone(),
        }
    }

    fn s3(&self) -> aws_sdk_s3::Client {
        workers::s3_client(
            &self.endpoint,
            self.region.as_deref(),
            &self.access_key_id,
            &self.secret_access_key,
        )
    }
}

/// Runs the fan-out bench: prints the table, writes the JSON.
///
/// # Errors
/// The upstream or the stack does not start, a reader fails or reads wrong
/// bytes, the JSON file cannot be written.
pub(crate) async fn run(opts: &Options) -> anyhow::Result<()> {
    let plan = Plan::new(opts)?;
    if opts.endpoint.is_some() || opts.ml || opts.data_dir.is_some() {
        bail!("--fanout starts its own gateways; --endpoint, --ml and --data-dir do not apply");
    }
    let mut site = UpstreamSite::open(opts).await?;
    let result = with_upstream(opts, &plan, &site).await;
    if let Some(ceph) = site.ceph.take() {
        ceph.stop().await;
    }
    let report = result?;
    print!("{}", report.table());
    write_json(opts, report.json())?;
    Ok(())
}

async fn with_upstream(opts: &Options, plan: &Plan, site: &UpstreamSite) -> anyhow::Result<Report> {
    let s3 = site.s3();
    ensure_bucket(&s3, BUCKET).await.context("upstream")?;
    let tmp = temp_dir("s3dma-fanout-")?;
    let upstream = Upstream {
        endpoint: site.endpoint.clone(),
        region: site.region.clone(),
        access_key_id: site.access_key_id.clone(),
        secret_access_key: site.secret_access_key.clone(),
        gateways: plan.gateways,
        cache_bytes: plan.cache_bytes(),
    };
    let mut stack = start_stack(tmp.path(), "s3dma-tools bench", |o| {
        o.bucket = BUCKET.into();
        o.fabric = opts.fabric;
        o.upstream = Some(upstream);
    })
    .await?;
    let gateways = Gateways {
        socket: stack.socket().to_path_buf(),
        targets: stack.endpoints().targets.clone(),
    };
    let result = tokio::select! {
        r = measure(plan, site, &s3, &gateways) => r,
        e = stack.any_exit() => Err(e.into()),
    };
    stack.stop().await;
    if let Err(e) = s3.delete_object().bucket(BUCKET).key(KEY).send().await {
        progress(&format!(
            "deleting {BUCKET}/{KEY} upstream: {}",
            aws_sdk_s3::error::DisplayErrorContext(e)
        ));
    }
    result
}

/// The gateways' counters that the ratios come from.
#[derive(Debug, Clone, Copy, Default)]
struct GatewayCounters {
    upstream_in: f64,
    lookups: f64,
    upstream_lookups: f64,
}

/// What the readers and the counters need of the started stack.
struct Gateways {
    socket: PathBuf,
    targets: Vec<s3dma_launcher::TargetEndpoint>,
}

async fn gateway_counters(g: &Gateways) -> anyhow::Result<GatewayCounters> {
    let mut c = GatewayCounters::default();
    for t in &g.targets {
        let addr = t
            .metrics
            .as_deref()
            .ok_or_else(|| anyhow!("a gateway serves no metrics"))?;
        let text = scrape(addr).await?;
        c.upstream_in += sample_sum(
            &text,
            "s3dma_storage_target_upstream_bytes_total",
            Some(("direction", "in")),
        );
        c.lookups += sample_sum(&text, "s3dma_storage_target_cache_lookups_total", None);
        c.upstream_lookups += sample_sum(
            &text,
            "s3dma_storage_target_cache_lookups_total",
            Some(("source", "upstream")),
        );
    }
    Ok(c)
}

/// `GET /metrics` of the service at `addr` (`IP:PORT`).
pub(crate) async fn scrape(addr: &str) -> anyhow::Result<String> {
    use http_body_util::BodyExt as _;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<Bytes>>();
    let uri: hyper::Uri = format!("http://{addr}/metrics")
        .parse()
        .with_context(|| format!("a metrics address: {addr}"))?;
    let resp = tokio::time::timeout(Duration::from_secs(10), client.get(uri))
        .await
        .map_err(|_| anyhow!("{addr}/metrics did not answer within 10 s"))?
        .with_context(|| format!("scraping {addr}/metrics"))?;
    if !resp.status().is_success() {
        bail!("{addr}/metrics answered {}", resp.status());
    }
    let body = resp
        .into_body()
        .collect()
        .await
        .with_context(|| format!("reading {addr}/metrics"))?
        .to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The sum of the samples of `name` in Prometheus text, only those with
/// label `want` when given.
pub(crate) fn sample_sum(text: &str, name: &str, want: Option<(&str, &str)>) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let (labels, value) = r.split_once('}')?;
                    (labels, value)
                }
                None if rest.starts_with(' ') => ("", rest),
                None => return None,
            };
            if let Some((k, v)) = want
                && !labels
                    .split(',')
                    .any(|kv| kv.trim() == format!("{k}=\"{v}\""))
            {
                return None;
            }
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        .sum()
}

async fn measure(
    plan: &Plan,
    site: &UpstreamSite,
    s3: &aws_sdk_s3::Client,
    stack: &Gateways,
) -> anyhow::Result<Report> {
    let mut report = Report {
        readers: plan.readers,
        gateways: plan.gateways,
        object_bytes: plan.object_bytes,
        rounds: plan.rounds,
        upstream: site.describe(),
        ..Report::default()
    };
    progress(&format!(
        "raw loopback TCP for {} s",
        plan.raw_tcp.as_secs_f64()
    ));
    report.raw_tcp_gbps = crate::primitives::raw_tcp(plan.raw_tcp)
        .await
        .context("raw TCP")?;
    progress(&format!(
        "raw loopback TCP: {:.2} GB/s",
        report.raw_tcp_gbps
    ));

    let len = usize::try_from(plan.object_bytes)?;
    let mut body = vec![0u8; len];
    for round in 0..plan.rounds {
        // A new version: the gateways have never seen it.
        crate::primitives::fill_random(&mut body, 1000 + round as u64);
        let crc = crc32fast::hash(&body);
        let bytes = Bytes::copy_from_slice(&body);
        progress(&format!(
            "round {}/{}: writing a new {} version upstream",
            round + 1,
            plan.rounds,
            crate::report::human_size(plan.object_bytes)
        ));
        put_upstream(s3, bytes).await?;

        let before = gateway_counters(stack).await?;
        let s3dma = fan_out(plan, Reader::S3dma { stack }, crc).await?;
        let after = gateway_counters(stack).await?;
        report.upstream_bytes += after.upstream_in - before.upstream_in;
        let lookups = after.lookups - before.lookups;
        report.chunk_reads += lookups;
        report.chunk_hits += lookups - (after.upstream_lookups - before.upstream_lookups);
        report.s3dma_rounds.push(s3dma.gbps);
        report.fastest_reader_s = s3dma.fastest_s;
        report.slowest_reader_s = s3dma.slowest_s;
        progress(&format!(
            "round {}: s3dma {:.2} GB/s aggregate (readers {:.2}-{:.2} s), upstream read {:.3} copies",
            round + 1,
            s3dma.gbps,
            s3dma.fastest_s,
            s3dma.slowest_s,
            (after.upstream_in - before.upstream_in) / plan.object_bytes as f64
        ));
        let http = fan_out(plan, Reader::Http { site }, crc).await?;
        report.http_rounds.push(http.gbps);
        progress(&format!(
            "round {}: aws-sdk-s3 straight from the upstream {:.2} GB/s aggregate (readers {:.2}-{:.2} s)",
            round + 1,
            http.gbps,
            http.fastest_s,
            http.slowest_s
        ));
    }
    Ok(report)
}

/// PUTs the object upstream in 64 MiB parts (one PUT when smaller).
async fn put_upstream(s3: &aws_sdk_s3::Client, body: Bytes) -> anyhow::Result<()> {
    const PART: usize = 64 << 20;
    let err = |what: &str, e: String| anyhow!("{what} {BUCKET}/{KEY} upstream: {e}");
    if body.len() <= PART {
        s3.put_object()
            .bucket(BUCKET)
            .key(KEY)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| err("PUT", aws_sdk_s3::error::DisplayErrorContext(e).to_string()))?;
        return Ok(());
    }
    let up = s3
        .create_multipart_upload()
        .bucket(BUCKET)
        .key(KEY)
        .send()
        .await
        .map_err(|e| {
            err(
                "starting an upload of",
                aws_sdk_s3::error::DisplayErrorContext(e).to_string(),
            )
        })?;
    let id = up
        .upload_id()
        .ok_or_else(|| anyhow!("the upstream gave no upload id"))?
        .to_owned();
    let mut parts = Vec::new();
    let result = async {
        for (i, start) in (0..body.len()).step_by(PART).enumerate() {
            let n = i32::try_from(i + 1)?;
            let out = s3
                .upload_part()
                .bucket(BUCKET)
                .key(KEY)
                .upload_id(&id)
                .part_number(n)
                .body(ByteStream::from(
                    body.slice(start..(start + PART).min(body.len())),
                ))
                .send()
                .await
                .map_err(|e| {
                    err(
                        "uploading a part of",
                        aws_sdk_s3::error::DisplayErrorContext(e).to_string(),
                    )
                })?;
            parts.push(
                aws_sdk_s3::types::CompletedPart::builder()
                    .part_number(n)
                    .set_e_tag(out.e_tag().map(str::to_owned))
                    .build(),
            );
        }
        s3.complete_multipart_upload()
            .bucket(BUCKET)
            .key(KEY)
            .upload_id(&id)
            .multipart_upload(
                aws_sdk_s3::types::CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| {
                err(
                    "completing the upload of",
                    aws_sdk_s3::error::DisplayErrorContext(e).to_string(),
                )
            })?;
        anyhow::Ok(())
    }
    .await;
    if result.is_err() {
        let _ = s3
            .abort_multipart_upload()
            .bucket(BUCKET)
            .key(KEY)
            .upload_id(&id)
            .send()
            .await;
    }
    result
}

/// How the readers of a fan-out read.
#[derive(Clone, Copy)]
enum Reader<'a> {
    /// Through the stack's shim.
    S3dma { stack: &'a Gateways },
    /// aws-sdk-s3 straight from the upstream.
    Http { site: &'a UpstreamSite },
}

/// Starts `plan.readers` reader processes, lets them go at once and times
/// them to the last one's finish; every one must have read the object.
async fn fan_out(plan: &Plan, how: Reader<'_>, want_crc: u32) -> anyhow::Result<workers::Run> {
    let specs = (0..plan.readers)
        .map(|_| {
            let mut opts = WorkerOptions {
                op: WorkerOp::Get,
                bucket: BUCKET.into(),
                key: KEY.into(),
                bytes: plan.object_bytes,
                rounds: 1,
                seed: 0,
                socket: None,
                http: None,
                shim_uid: Some(s3dma_service::private::current_uid()),
            };
            let mut env = Vec::new();
            match how {
                Reader::S3dma { stack } => opts.socket = Some(stack.socket.clone()),
                Reader::Http { site } => {
                    opts.http = Some(site.endpoint.clone());
                    env = vec![
                        ("AWS_ACCESS_KEY_ID", site.access_key_id.clone()),
                        ("AWS_SECRET_ACCESS_KEY", site.secret_access_key.clone()),
                        (
                            "AWS_REGION",
                            site.region.clone().unwrap_or_else(|| REGION.to_owned()),
                        ),
                    ];
                }
            }
            workers::Spec { opts, env }
        })
        .collect();
    let run = workers::run(specs).await?;
    if let Some(crc) = run.crcs.iter().find(|c| **c != want_crc) {
        bail!(
            "a reader read bytes that differ from the object's (CRC-32 {crc:08x}, want {want_crc:08x})"
        );
    }
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# HELP s3dma_storage_target_cache_lookups_total Chunk reads
# TYPE s3dma_storage_target_cache_lookups_total counter
s3dma_storage_target_cache_lookups_total{source=\"cache\"} 10
s3dma_storage_target_cache_lookups_total{source=\"upstream\"} 3
s3dma_storage_target_cache_lookups_total{source=\"single_flight\"} 5
s3dma_storage_target_upstream_bytes_total{direction=\"in\"} 1048576
s3dma_storage_target_upstream_bytes_total{direction=\"out\"} 7
s3dma_storage_target_cache_lookups_total_extra 99
";

    #[test]
    fn samples_are_summed_by_name_and_label() {
        let lookups = "s3dma_storage_target_cache_lookups_total";
        assert_eq!(sample_sum(TEXT, lookups, None), 18.0);
        assert_eq!(sample_sum(TEXT, lookups, Some(("source", "upstream"))), 3.0);
        assert_eq!(
            sample_sum(
                TEXT,
                "s3dma_storage_target_upstream_bytes_total",
                Some(("direction", "in"))
            ),
            1_048_576.0
        );
        assert_eq!(sample_sum(TEXT, "absent", None), 0.0);
    }

    #[test]
    fn the_cache_holds_a_share_with_room() {
        let o = Options {
            fanout: true,
            gateways: Some(3),
            ..Options::default()
        };
        let p = Plan::new(&o).unwrap();
        assert_eq!(p.object_bytes, 1 << 30);
        assert!(p.cache_bytes() >= 2 * (1 << 30) / 3);
        assert!(
            Plan::new(&Options {
                gateways: Some(0),
                ..o.clone()
            })
            .is_err()
        );
        assert!(
            Plan::new(&Options {
                readers: Some(65),
                ..o
            })
            .is_err()
        );
    }

    #[test]
    fn ratios_come_out_of_the_counters() {
        let r = Report {
            object_bytes: 100,
            rounds: 2,
            upstream_bytes: 220.0,
            chunk_reads: 16.0,
            chunk_hits: 14.0,
            s3dma_rounds: vec![3.0, 1.0, 2.0],
            http_rounds: vec![1.0],
            raw_tcp_gbps: 4.0,
            ..Report::default()
        };
        let j = r.json();
        assert_eq!(j["fanout_upstream_read_ratio"], 1.1);
        assert_eq!(j["gateway_hit_ratio"], 0.875);
        assert_eq!(j["fanout_gbps"], 2.0);
        assert_eq!(j["fanout_vs_http"], 2.0);
        assert_eq!(j["fanout_vs_raw_tcp"], 0.5);
    }
}
