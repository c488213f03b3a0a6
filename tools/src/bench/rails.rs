//! `s3dma-tools bench --rails` (root): the fabric rails of issue 46
//! measured on this machine, with network namespaces standing in for a
//! dual-port host ([`s3dma_testkit::netns`]).
//!
//! storage-target and dpu-agent run in a storage namespace, host-shim in a
//! host namespace; two rail veths (`10.<n>.1.0/24`, `10.<n>.2.0/24`) each
//! limited to `--rail-rate` MB/s each way with a `tc` token bucket on both
//! ends, and an unlimited control veth for the shim's gRPC to the agent
//! and the agent's S3 to the target (rails carry fabric traffic only). The
//! bench itself stays in the root namespace and talks to the shim over its
//! Unix socket.
//!
//! 1. GET and PUT of 4 objects at once through a shim on one rail, then
//!    through one on both rails: MB/s side by side and their ratio (the
//!    rails, not the CPUs, should set the pace: with a limit well below
//!    what this host moves the ratio is near 2);
//! 2. 16 GETs and 16 PUTs at once on the two-rail shim, rail 1 cut (`ip
//!    link set … down` on both ends) once it carried an eighth of the
//!    bytes: the requests that failed (0 expected: the agent redoes a cut
//!    rail's chunks and parts on the other), every GET compared and every
//!    PUT read back from the target;
//! 3. rail 1 restored: the seconds until the agent's failback trial marks
//!    it up again (`s3dma_agent_rail_up`) and it carries bytes again.
//!
//! The store lives on /dev/shm; memory: 18 copies of the object (17
//! buffers, one in the bench) and 20 stored objects
//! of the object size (256 MiB; 64 MiB with `--quick`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use s3dma_client::{Buffer, Client, GetOptions, PutOptions};
use s3dma_launcher::{Layout, Secrets, configs};
use s3dma_testkit::Process;
use s3dma_testkit::netns::{self, RailNet, Side};
use sha2::Digest as _;

use crate::options::{BUCKET, Options, progress, write_json};
use crate::primitives::{ensure_bucket, fill_random};
use crate::report::human_size;

/// Each rail's default limit, MB/s each way.
pub(crate) const DEFAULT_RATE_MB: u64 = 200;
/// Requests at once in the throughput phase.
const STREAMS: usize = 4;
/// GETs (and as many PUTs) at once around the cut.
const CUT_REQUESTS: usize = 16;
/// The shim's rails' ports (in its own namespace, always free).
const PORTS: [u16; 2] = [7001, 7002];
/// How long the failback may take before the bench gives up.
const FAILBACK_LIMIT: Duration = Duration::from_secs(60);

/// Runs the rails bench: prints the table, writes the JSON.
///
/// # Errors
/// Not root (or no `ip netns`/`tc`), a service that does not start, a
/// mismatch in the bytes, a rail that never comes back.
pub(crate) async fn run(opts: &Options) -> anyhow::Result<()> {
    netns::available().map_err(|why| {
        anyhow!("--rails {why}: run it as root on a host with iproute2 (ip netns, tc)")
    })?;
    ensure!(
        opts.fabric == s3dma_launcher::Backend::Tcp,
        "--rails needs --fabric tcp (a verbs host-shim serves one rail in this release)"
    );
    let rate_mb = opts.rail_rate_mb.unwrap_or(DEFAULT_RATE_MB);
    ensure!(
        (1..=100_000).contains(&rate_mb),
        "--rail-rate must be 1 to 100000 MB/s"
    );
    let object = if opts.quick { 64 << 20 } else { 256 << 20 };
    let rate = rate_mb * 1_000_000;
    progress(&format!(
        "rails: 2 veth rails limited to {rate_mb} MB/s each way, {} objects",
        human_size(object as u64)
    ));
    let mut s = RailStack::start(opts, rate).await?;
    let r = measure(&mut s, object).await;
    s.stop();
    let r = r?;
    print!("{}", r.table(opts, rate_mb, object));
    write_json(opts, r.json(rate_mb))?;
    Ok(())
}

/// What the bench measured.
struct Figures {
    /// MB/s through 1 and 2 rails: (GET, PUT).
    one: (f64, f64),
    two: (f64, f64),
    /// Seconds from the start of the cut phase to the cut, and from the
    /// cut to the last request's end.
    cut_after: f64,
    cut_done: f64,
    failed: usize,
    /// Whether the agent had rail 1 down after the cut.
    marked_down: bool,
    failback: f64,
}

impl Figures {
    fn table(&self, opts: &Options, rate_mb: u64, object: usize) -> String {
        let mut t = format!(
            "s3dma-tools bench --rails{}: {} fabric over two veth rails between network namespaces, each limited to {rate_mb} MB/s each way (tc tbf), {} CPUs, store on /dev/shm\n",
            if opts.quick { " --quick" } else { "" },
            opts.fabric,
            std::thread::available_parallelism().map_or(0, usize::from),
        );
        t += &format!(
            "{:<34}{:>12}{:>12}{:>10}\n",
            format!("{STREAMS} × {} at once", human_size(object as u64)),
            "1 rail",
            "2 rails",
            "2 vs 1"
        );
        for (name, one, two) in [
            ("GET MB/s", self.one.0, self.two.0),
            ("PUT MB/s", self.one.1, self.two.1),
        ] {
            t += &format!("{name:<34}{one:>12.0}{two:>12.0}{:>9.2}x\n", two / one);
        }
        t += &format!(
            "rail 1 cut {:.1} s into {CUT_REQUESTS} GETs + {CUT_REQUESTS} PUTs of {}: {} failed, all done {:.1} s after the cut, rail 1 marked down: {}\n",
            self.cut_after,
            human_size(object as u64),
            self.failed,
            self.cut_done,
            if self.marked_down { "yes" } else { "no" },
        );
        t += &format!(
            "rail 1 restored: up and carrying bytes again after {:.2} s\n",
            self.failback
        );
        t
    }

    fn json(&self, rate_mb: u64) -> serde_json::Value {
        serde_json::json!({
            "rails_rate_mbps": rate_mb,
            "rails_1_get_mbps": self.one.0,
            "rails_2_get_mbps": self.two.0,
            "rails_1_put_mbps": self.one.1,
            "rails_2_put_mbps": self.two.1,
            "rails_2_vs_1_get": self.two.0 / self.one.0,
            "rails_2_vs_1_put": self.two.1 / self.one.1,
            "rails_cut_failed_requests": self.failed,
            "rails_cut_done_secs": self.cut_done,
            "rails_failback_secs": self.failback,
        })
    }
}

async fn measure(s: &mut RailStack, object: usize) -> anyhow::Result<Figures> {
    let mut src = Vec::new();
    let mut one = (0.0, 0.0);
    let mut two = (0.0, 0.0);
    let mut shim = None;
    for rails in [1, 2] {
        // A fresh shim each time: the old one's buffers go with it.
        drop(shim.take());
        let c = s.shim(rails).await?;
        let mut put_src = c.alloc(object).await?;
        if src.is_empty() {
            src = vec![0u8; object];
            fill_random(&mut src, 46);
        }
        put_src.as_mut_slice().copy_from_slice(&src);
        let bufs = alloc(&c, STREAMS, object).await?;
        let (put, put_src) = put_all(&c, "rails/stream", put_src, STREAMS).await?;
        ensure!(put.failed == 0, "{} PUTs failed", put.failed);
        let (get, bufs) = get_all(&c, "rails/stream/0", bufs).await?;
        ensure!(get.failed == 0, "{} GETs failed", get.failed);
        check_gets(&bufs, &src)?;
        let mbps = |secs: f64| (STREAMS * object) as f64 / secs / 1e6;
        let figures = (mbps(get.secs), mbps(put.secs));
        progress(&format!(
            "{rails} rail(s): GET {:.0} MB/s, PUT {:.0} MB/s",
            figures.0, figures.1
        ));
        if rails == 1 {
            one = figures;
        } else {
            two = figures;
        }
        shim = Some((c, put_src, bufs));
    }
    let Some((c, put_src, mut bufs)) = shim else {
        bail!("no shim");
    };
    bufs.extend(alloc(&c, CUT_REQUESTS - STREAMS, object).await?);

    // The cut.
    let before = s.net.rail_bytes(1);
    let start = Instant::now();
    let get = tokio::spawn({
        let c = c.clone();
        async move { get_all(&c, "rails/stream/0", bufs).await }
    });
    let put = tokio::spawn({
        let c = c.clone();
        async move { put_all(&c, "rails/cut", put_src, CUT_REQUESTS).await }
    });
    // Both directions over both rails: rail 1 carries about half.
    let share = (2 * CUT_REQUESTS * object / 2 / 4) as u64;
    loop {
        let now = s.net.rail_bytes(1);
        if (now.rx - before.rx) + (now.tx - before.tx) >= share {
            break;
        }
        if get.is_finished() || put.is_finished() {
            bail!("the transfers ended before rail 1 carried an eighth of them");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.net.cut(1);
    let cut = Instant::now();
    progress(&format!(
        "rail 1 cut {:.1} s into {CUT_REQUESTS} GETs and {CUT_REQUESTS} PUTs",
        start.elapsed().as_secs_f64()
    ));
    let (got, bufs) = get.await.context("the GETs' task")??;
    let (put, _put_src) = put.await.context("the PUTs' task")??;
    let cut_done = cut.elapsed().as_secs_f64();
    let cut_after = (start.elapsed() - cut.elapsed()).as_secs_f64();
    check_gets(&bufs, &src)?;
    let sha = hex::encode(sha2::Sha256::digest(&src));
    s.check_stored("rails/cut", CUT_REQUESTS, object, &sha)
        .await?;
    let m = s.agent_metrics();
    let rail = s.label(1);
    let marked_down = rail_up(&m, &rail) == Some(0.0);

    // Back.
    s.net.restore(1);
    let restored = Instant::now();
    let bytes0 = rail_get_bytes(&m, &rail);
    let mut one_buf = bufs.into_iter().take(1).collect::<Vec<_>>();
    let failback = loop {
        let (r, b) = get_all(&c, "rails/stream/0", one_buf).await?;
        one_buf = b;
        ensure!(r.failed == 0, "a GET after the restore failed");
        check_gets(&one_buf, &src)?;
        let m = s.agent_metrics();
        if rail_up(&m, &rail) == Some(1.0) && rail_get_bytes(&m, &rail) > bytes0 {
            break restored.elapsed().as_secs_f64();
        }
        if restored.elapsed() > FAILBACK_LIMIT {
            bail!(
                "rail 1 ({rail}) was not back {} s after the restore",
                FAILBACK_LIMIT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    progress(&format!("rail 1 back {failback:.2} s after the restore"));
    Ok(Figures {
        one,
        two,
        cut_after,
        cut_done,
        failed: got.failed + put.failed,
        marked_down,
        failback,
    })
}

/// How a batch of requests went.
struct Batch {
    secs: f64,
    failed: usize,
}

async fn alloc(c: &Client, n: usize, len: usize) -> anyhow::Result<Vec<Buffer>> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(c.alloc(len).await.context("allocating a buffer")?);
    }
    Ok(v)
}

/// `n` PUTs of all of `src` to `{prefix}/{i}` at once.
async fn put_all(
    c: &Client,
    prefix: &str,
    src: Buffer,
    n: usize,
) -> anyhow::Result<(Batch, Buffer)> {
    let src = std::sync::Arc::new(src);
    let t = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (c, src, key) = (c.clone(), src.clone(), format!("{prefix}/{i}"));
            tokio::spawn(async move {
                c.put_object_from(BUCKET, &key, &src, 0..src.len(), PutOptions::default())
                    .await
                    .map(|p| p.size == src.len() as u64)
            })
        })
        .collect();
    let mut failed = 0;
    for t in tasks {
        match t.await.context("a PUT's task")? {
            Ok(true) => {}
            Ok(false) => bail!("a PUT stored another size"),
            Err(e) => {
                progress(&format!("a PUT failed: {e}"));
                failed += 1;
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let src =
        std::sync::Arc::try_unwrap(src).map_err(|_| anyhow!("the PUT buffer is still shared"))?;
    Ok((Batch { secs, failed }, src))
}

/// `key` GET into every buffer of `bufs` at once.
async fn get_all(c: &Client, key: &str, bufs: Vec<Buffer>) -> anyhow::Result<(Batch, Vec<Buffer>)> {
    let t = Instant::now();
    let tasks: Vec<_> = bufs
        .into_iter()
        .map(|mut b| {
            b.as_mut_slice().fill(0xEE);
            let (c, key) = (c.clone(), key.to_owned());
            tokio::spawn(async move {
                let r = c
                    .get_object_into(BUCKET, &key, &mut b, 0, GetOptions::default())
                    .await
                    .map(|g| g.bytes_placed == b.len() as u64);
                (r, b)
            })
        })
        .collect();
    let mut failed = 0;
    let mut out = Vec::new();
    for t in tasks {
        let (r, b) = t.await.context("a GET's task")?;
        match r {
            Ok(true) => {}
            Ok(false) => bail!("a GET placed another size"),
            Err(e) => {
                progress(&format!("a GET failed: {e}"));
                failed += 1;
            }
        }
        out.push(b);
    }
    Ok((
        Batch {
            secs: t.elapsed().as_secs_f64(),
            failed,
        },
        out,
    ))
}

fn check_gets(bufs: &[Buffer], src: &[u8]) -> anyhow::Result<()> {
    for (i, b) in bufs.iter().enumerate() {
        ensure!(
            b.as_slice() == src,
            "GET {i}: the buffer does not hold the object"
        );
    }
    Ok(())
}

/// `s3dma_agent_rail_up{rail="RAIL"}`.
fn rail_up(m: &str, rail: &str) -> Option<f64> {
    let want = format!("s3dma_agent_rail_up{{rail=\"{rail}\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&want))
        .and_then(|v| v.trim().parse().ok())
}

/// `s3dma_agent_rail_bytes_total{op="get",rail="RAIL"}`.
fn rail_get_bytes(m: &str, rail: &str) -> f64 {
    let want = format!("s3dma_agent_rail_bytes_total{{op=\"get\",rail=\"{rail}\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&want))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The namespaces and the services in them (the bench's own, in a
/// temporary directory). Dropped in this order: the shim, the agent, the
/// target, then the namespaces.
struct RailStack {
    shim: Option<Process>,
    agent: Option<Process>,
    target: Option<Process>,
    net: RailNet,
    layout: Layout,
    secrets: Secrets,
    bins: PathBuf,
    agent_addr: String,
    agent_metrics: String,
    target_url: String,
    _store: tempfile::TempDir,
    _dir: tempfile::TempDir,
}

impl RailStack {
    async fn start(opts: &Options, rate: u64) -> anyhow::Result<RailStack> {
        let bins = std::env::current_exe()
            .context("finding this program")?
            .parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| anyhow!("this program has no directory"))?;
        for b in ["storage-target", "dpu-agent", "host-shim"] {
            ensure!(
                bins.join(b).is_file(),
                "{b} is not next to s3dma-tools in {}",
                bins.display()
            );
        }
        let dir = crate::own_stack::temp_dir("s3dma-bench-rails-")?;
        let store = match &opts.data_dir {
            Some(_) => bail!("--data-dir is not for --rails (its store is on /dev/shm)"),
            None => tempfile::Builder::new()
                .prefix("s3dma-bench-rails-")
                .tempdir_in("/dev/shm")
                .context("a directory in /dev/shm")?,
        };
        let mut layout = Layout::new(dir.path());
        layout.data_dir = store.path().to_path_buf();
        std::fs::create_dir_all(&layout.logs_dir).context("the logs directory")?;
        let secrets = layout.prepare_secrets()?;
        let net = RailNet::create(2, Some(rate));
        let ctl = net.control_ip(Side::Storage);

        let mut t = configs::storage_target(&layout, &secrets.access_key_id, true, None);
        t.listen = SocketAddr::new(ctl, 0);
        for i in 0..net.rails() {
            t.rdma.allowed_client_networks.push(
                net.rail_net(i)
                    .parse()
                    .map_err(|e| anyhow!("rail {i}'s network: {e}"))?,
            );
        }
        configs::write(&layout.target_config, &t)?;
        let (target, lines) = start(
            &net,
            Side::Storage,
            &bins.join("storage-target"),
            &layout.target_config,
            &layout.log("storage-target"),
            &["storage-target listening on ", "metrics on "],
        );
        let target_url = lines[0].clone();
        let (url, key, secret) = (
            target_url.clone(),
            secrets.access_key_id.clone(),
            secrets.secret_access_key.clone(),
        );
        netns::run_in(&net.storage, move || async move {
            ensure_bucket(
                &crate::workers::s3_client(&url, None, &key, &secret),
                BUCKET,
            )
            .await
        })
        .await?;

        let mut a = configs::dpu_agent(&layout, &secrets.access_key_id, &[&target_url], true);
        a.listen.address = SocketAddr::new(ctl, 0);
        configs::write(&layout.agent_config, &a)?;
        let (agent, lines) = start(
            &net,
            Side::Storage,
            &bins.join("dpu-agent"),
            &layout.agent_config,
            &layout.log("dpu-agent"),
            &["dpu-agent listening on ", "metrics on "],
        );
        Ok(RailStack {
            shim: None,
            agent: Some(agent),
            target: Some(target),
            agent_addr: lines[0].clone(),
            agent_metrics: lines[1].clone(),
            target_url,
            net,
            layout,
            secrets,
            bins,
            _store: store,
            _dir: dir,
        })
    }

    /// (Re)starts the shim on the first `rails` rails; a client of it.
    async fn shim(&mut self, rails: usize) -> anyhow::Result<Client> {
        drop(self.shim.take());
        let socket = self.layout.dir.join("shim.sock");
        let _ = std::fs::remove_file(&socket);
        let mut c = configs::host_shim(
            &self.layout,
            &socket,
            &self.agent_addr,
            s3dma_service::private::current_uid(),
            false,
        );
        c.fabric.listen = None;
        c.fabric.rails = (0..rails)
            .map(|i| {
                fabric::rail::RailConfig::new(
                    SocketAddr::new(self.net.rail_ip(i, Side::Host), PORTS[i]),
                    None,
                )
            })
            .collect();
        configs::write(&self.layout.shim_config, &c)?;
        let (shim, _) = start(
            &self.net,
            Side::Host,
            &self.bins.join("host-shim"),
            &self.layout.shim_config,
            &self.layout.log("host-shim"),
            &["host-shim listening on "],
        );
        self.shim = Some(shim);
        let t = Instant::now();
        while !socket.exists() {
            ensure!(
                t.elapsed() < Duration::from_secs(30),
                "the host-shim made no socket at {}",
                socket.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Client::connect_with(&socket, crate::own_shim())
            .await
            .context("connecting to the host-shim")
    }

    /// The agent's metric label of rail `i` (the shim's endpoint there).
    fn label(&self, i: usize) -> String {
        format!("{}:{}", self.net.rail_ip(i, Side::Host), PORTS[i])
    }

    fn agent_metrics(&self) -> String {
        netns::scrape_in(&self.net.storage, &self.agent_metrics)
    }

    /// Reads `{prefix}/{i}` back from the target (from the storage
    /// namespace, over HTTP) and compares each with `sha` (SHA-256, hex).
    async fn check_stored(
        &self,
        prefix: &str,
        n: usize,
        len: usize,
        sha: &str,
    ) -> anyhow::Result<()> {
        let (url, key, secret) = (
            self.target_url.clone(),
            self.secrets.access_key_id.clone(),
            self.secrets.secret_access_key.clone(),
        );
        let (prefix, sha) = (prefix.to_owned(), sha.to_owned());
        netns::run_in(&self.net.storage, move || async move {
            let s3 = crate::workers::s3_client(&url, None, &key, &secret);
            let mut buf = vec![0u8; len + 1];
            for i in 0..n {
                let k = format!("{prefix}/{i}");
                let got = crate::primitives::http_get_into_from(&s3, BUCKET, &k, &mut buf).await?;
                ensure!(got == len, "{k}: {got} bytes stored, {len} sent");
                ensure!(
                    hex::encode(sha2::Sha256::digest(&buf[..len])) == sha,
                    "{k}: the stored object is not what was sent"
                );
            }
            Ok(())
        })
        .await
    }

    /// Stops the services (SIGTERM, then SIGKILL), then the namespaces go.
    fn stop(&mut self) {
        for p in [&mut self.shim, &mut self.agent, &mut self.target] {
            if let Some(mut p) = p.take() {
                let _ = p.terminate(Duration::from_secs(5));
            }
        }
    }
}

/// Starts `bin --config CONFIG` in `side`'s namespace; the rest of its
/// ready lines.
fn start(
    net: &RailNet,
    side: Side,
    bin: &Path,
    config: &Path,
    log: &Path,
    ready: &[&str],
) -> (Process, Vec<String>) {
    let config = config.display().to_string();
    net.start(side, bin, &["--config", &config], log, ready)
}
