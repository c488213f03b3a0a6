//! Fabric rails across network namespaces (root only; CI runs as root):
//! storage-target and dpu-agent in a storage namespace, host-shim with two
//! rails (`10.<n>.1.1` and `10.<n>.2.1`) in a host namespace, joined by two
//! rail veths rate-limited with `tc` tbf on both ends and one unlimited
//! control veth (the shim's gRPC to the agent, the agent's S3 to the
//! target): [`s3dma_testkit::netns`]. The test stays in the root namespace
//! and drives the shim over its Unix socket with the Rust client.
//!
//! - two rails against one: concurrent GETs and PUTs through a one-rail
//!   shim, then a two-rail one, their MB/s and ratio printed (no timing
//!   threshold), every byte checked, both rails' veths and the agent's
//!   per-rail byte counters moved; a rail naming an address that is not on
//!   the host (the storage end of a rail veth) is refused at start, naming
//!   the rail;
//! - one rail cut (link down on both ends) in the middle of 16 concurrent
//!   GETs and 16 PUTs: none fails, every object exact (GETs compared, PUTs
//!   read back from the target), `s3dma_agent_rail_up` of the rail 0; after
//!   the restore it goes back to 1 and the rail carries bytes again (the
//!   seconds printed).
//!
//! (The same over loopback addresses without root: `shim::rails`,
//! `agent::rails`; the figures at the bench's sizes: `s3dma-tools bench
//! --rails`.)

use std::time::{Duration, Instant};

use crate::shim::common::{HANG_GUARD, Shim, ShimOpts, refused_start};
use s3dma_client::{Buffer, Client, GetOptions, PutOptions};
use s3dma_launcher::harness::{
    self as agent, ADMIN, ALICE, Agent, AgentSpec, Target, TargetOpts, data, sha256,
};
use s3dma_testkit::netns::{self, RailNet, Side};

use crate::rail_metrics::{failed_requests, rail_bytes, rail_sample, rail_up};

/// Each rail's limit, each way: well below what the (debug) stack moves
/// on 2 cores, so the rails, not the CPUs, set the pace.
const RATE: u64 = 64 << 20;
/// The shim's rails' ports (in its own namespace, always free).
const PORTS: [u16; 2] = [7001, 7002];
/// Each object of the tests.
const LEN: usize = 16 << 20;

/// The two namespaces and the services in them; dropped in this order
/// (the shims first, the namespaces last).
struct RailStack {
    agent: Agent,
    target: Target,
    /// The shims' directories.
    dirs: Vec<tempfile::TempDir>,
    /// The target's store (on /dev/shm: PUTs measure the rails, not a
    /// disk).
    _store: tempfile::TempDir,
    net: RailNet,
}

impl RailStack {
    /// Two rails limited to [`RATE`]; the target and the agent in the
    /// storage namespace on the control veth, the buckets made.
    async fn start() -> RailStack {
        let net = RailNet::create(2, Some(RATE));
        let store = tempfile::tempdir_in("/dev/shm").unwrap();
        let mut o = TargetOpts::new(true);
        o.listen_ip = net.control_ip(Side::Storage).to_string();
        o.wrap = net.wrap(Side::Storage);
        o.data_dir = Some(store.path().to_path_buf());
        let mut target = Target::start_opts(o);
        // The target places and takes bytes on the shim's rails.
        target.reconfigure(|c| {
            for i in 0..net.rails() {
                c.rdma
                    .allowed_client_networks
                    .push(net.rail_net(i).parse().unwrap());
            }
        });
        let endpoint = target.endpoint.clone();
        netns::run_in(&net.storage, move || async move {
            let s3 = agent::s3_client(&endpoint, ADMIN.0, ADMIN.1);
            agent::create_bucket(&s3, "alice-data").await;
        })
        .await;
        let mut spec = AgentSpec::one(&target);
        spec.listen = format!("{}:0", net.control_ip(Side::Storage));
        spec.wrap = net.wrap(Side::Storage);
        // Many transfers per object, so both rails get some of each.
        spec.transfer = "chunk_size: 2MiB\nmax_chunks_in_flight: 4\nmultipart_threshold: 5MiB\n\
                         part_size: 5MiB\n"
            .into();
        let agent = Agent::start(spec);
        RailStack {
            agent,
            target,
            dirs: Vec::new(),
            _store: store,
            net,
        }
    }

    /// `fabric:` for the shim's rails `rails` (indices), `listen` replaced.
    fn rails_yaml(&self, rails: &[usize]) -> String {
        let mut y = String::from("listen: null\nrails:\n");
        for &i in rails {
            let ip = self.net.rail_ip(i, Side::Host);
            y.push_str(&format!("  - listen: {ip}:{}\n", PORTS[i]));
        }
        y
    }

    /// A shim in the host namespace serving rails `rails`.
    fn shim(&mut self, rails: &[usize]) -> Shim {
        let dir = tempfile::tempdir().unwrap();
        let shim = Shim::start_opts(
            dir.path(),
            &self.agent,
            ShimOpts {
                netns: Some(self.net.host.clone()),
                fabric_yaml: self.rails_yaml(rails),
                ..ShimOpts::default()
            },
        );
        self.dirs.push(dir);
        shim
    }

    /// The agent's metric label of rail `i` (the shim's endpoint there).
    fn label(&self, i: usize) -> String {
        format!("{}:{}", self.net.rail_ip(i, Side::Host), PORTS[i])
    }

    fn agent_metrics(&self) -> String {
        netns::scrape_in(&self.net.storage, &self.agent.metrics)
    }

    /// The object `key` as the target stored it (read from the storage
    /// namespace).
    async fn stored(&self, key: &str) -> Vec<u8> {
        let (endpoint, key) = (self.target.endpoint.clone(), key.to_owned());
        netns::run_in(&self.net.storage, move || async move {
            let s3 = agent::s3_client(&endpoint, ALICE.0, ALICE.1);
            agent::get_as(&s3, "alice-data", &key).await
        })
        .await
        .unwrap_or_else(|| panic!("no object stored"))
    }
}

/// A spawned call on one buffer: its key, its result, the buffer back.
type Transfer<R, E> = tokio::task::JoinHandle<(String, Result<R, E>, Buffer)>;

/// Awaits each `(key, result, buffer)` task under the hang guard,
/// checks its result with `check` (a failed call panics naming the key)
/// and gives the buffers back in order.
async fn joined<R, E: std::fmt::Display>(
    tasks: Vec<Transfer<R, E>>,
    check: impl Fn(&str, R, &Buffer),
) -> Vec<Buffer> {
    let mut out = Vec::new();
    for t in tasks {
        let (key, r, b) = tokio::time::timeout(HANG_GUARD, t)
            .await
            .expect("hung past the hang guard")
            .unwrap();
        check(&key, r.unwrap_or_else(|e| panic!("{key}: {e}")), &b);
        out.push(b);
    }
    out
}

/// `bufs[i]` PUT to `{prefix}/{i}`, all at once; the seconds it took.
/// Each buffer comes back.
pub(crate) async fn put_all(c: &Client, prefix: &str, bufs: Vec<Buffer>) -> (f64, Vec<Buffer>) {
    let t = Instant::now();
    let tasks: Vec<_> = bufs
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            let (c, key) = (c.clone(), format!("{prefix}/{i}"));
            tokio::spawn(async move {
                let r = c
                    .put_object_from("alice-data", &key, &b, 0..b.len(), PutOptions::default())
                    .await;
                (key, r, b)
            })
        })
        .collect();
    let out = joined(tasks, |key, put: s3dma_client::PutOutput, b| {
        assert_eq!(put.size, b.len() as u64, "PUT {key}");
    })
    .await;
    (t.elapsed().as_secs_f64(), out)
}

/// `{prefix}/{i}` GET into `bufs[i]` (first filled with 0xEE), all at once;
/// the seconds it took. Each buffer comes back.
pub(crate) async fn get_all(c: &Client, prefix: &str, bufs: Vec<Buffer>) -> (f64, Vec<Buffer>) {
    let t = Instant::now();
    let tasks: Vec<_> = bufs
        .into_iter()
        .enumerate()
        .map(|(i, mut b)| {
            b.as_mut_slice().fill(0xEE);
            let (c, key) = (c.clone(), format!("{prefix}/{i}"));
            tokio::spawn(async move {
                let r = c
                    .get_object_into("alice-data", &key, &mut b, 0, GetOptions::default())
                    .await;
                (key, r, b)
            })
        })
        .collect();
    let out = joined(tasks, |key, got: s3dma_client::GetOutput, b| {
        assert_eq!(got.bytes_placed, b.len() as u64, "GET {key}");
    })
    .await;
    (t.elapsed().as_secs_f64(), out)
}

/// `n` buffers of [`LEN`], buffer `i` holding `data(LEN, seed + i)`.
async fn filled(c: &Client, n: usize, seed: u64) -> Vec<Buffer> {
    let mut v = Vec::new();
    for i in 0..n {
        let mut b = c.alloc(LEN).await.unwrap();
        b.as_mut_slice()
            .copy_from_slice(&data(LEN, seed + i as u64));
        v.push(b);
    }
    v
}

fn mbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e6
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rate_limited_rails_carry_gets_and_puts_beside_one() {
    if agent::backend() != fabric::Backend::Tcp {
        eprintln!("rails in namespaces: tcp fabric only (verbs serves one rail)");
        return;
    }
    if !netns::available_or_skip("rails::two_rate_limited_rails_carry_gets_and_puts_beside_one") {
        return;
    }
    const N: usize = 4;
    let mut s = RailStack::start().await;
    let mut figures = Vec::new();
    for rails in [&[0][..], &[0, 1][..]] {
        let shim = s.shim(rails);
        let c = Client::connect(&shim.socket).await.unwrap();
        let seed = 100 * rails.len() as u64;
        let before: Vec<_> = (0..2).map(|i| s.net.rail_bytes(i)).collect();
        let prefix = format!("rails{}", rails.len());
        let (put_secs, bufs) = put_all(&c, &prefix, filled(&c, N, seed).await).await;
        let (get_secs, bufs) = get_all(&c, &prefix, bufs).await;
        for (i, b) in bufs.iter().enumerate() {
            assert!(
                b.as_slice() == &data(LEN, seed + i as u64)[..],
                "{prefix}/{i}: the GET placed other bytes"
            );
        }
        assert_eq!(
            sha256(&s.stored(&format!("{prefix}/0")).await),
            sha256(&data(LEN, seed)),
            "the stored object is what was sent"
        );
        let moved: Vec<_> = (0..2)
            .map(|i| {
                let (b, a) = (before[i], s.net.rail_bytes(i));
                (a.rx - b.rx, a.tx - b.tx)
            })
            .collect();
        println!(
            "{} rail(s), each limited to {} MB/s: PUT {:.0} MB/s, GET {:.0} MB/s \
             ({N} × {} MiB at once); veth bytes rx/tx rail 0 {:?}, rail 1 {:?}",
            rails.len(),
            RATE / 1_000_000,
            mbps(N * LEN, put_secs),
            mbps(N * LEN, get_secs),
            LEN >> 20,
            moved[0],
            moved[1],
        );
        figures.push((mbps(N * LEN, put_secs), mbps(N * LEN, get_secs)));
        // Every rail the shim serves carried both ways (GET: into the host,
        // PUT: out of it), a rail it does not serve nothing of the bytes.
        for (i, &(rx, tx)) in moved.iter().enumerate() {
            if rails.contains(&i) {
                assert!(rx >= (1 << 20) && tx >= (1 << 20), "rail {i}: {moved:?}");
            } else {
                assert!(rx < (1 << 20) && tx < (1 << 20), "rail {i}: {moved:?}");
            }
        }
        drop(c);
        drop(shim);
    }
    println!(
        "two rails against one: PUT {:.2}x, GET {:.2}x",
        figures[1].0 / figures[0].0,
        figures[1].1 / figures[0].1
    );
    let m = s.agent_metrics();
    for i in 0..2 {
        let rail = s.label(i);
        for op in ["get", "put"] {
            assert!(rail_bytes(&m, &rail, op) > 0.0, "{rail} {op}:\n{m}");
        }
        assert_eq!(rail_up(&m, &rail), Some(1.0), "{rail}");
    }
    // Every byte of the two-rail shim counted once over the rails (a
    // request of the one-rail shim names no rails: no rail counts it).
    for op in ["get", "put"] {
        let total: f64 = (0..2).map(|i| rail_bytes(&m, &s.label(i), op)).sum();
        assert_eq!(total, (N * LEN) as f64, "{op}:\n{m}");
    }
    assert_eq!(failed_requests(&m), 0.0, "{m}");

    // A rail whose address is on the storage side of its veth, not on this
    // host: the shim does not start, and names the rail.
    let shim = s.shim(&[0, 1]);
    let text = std::fs::read_to_string(&shim.config).unwrap();
    let socket = shim.socket.clone();
    drop(shim);
    let dir = tempfile::tempdir().unwrap();
    let (good, bad) = (
        s.label(1),
        format!("{}:{}", s.net.rail_ip(1, Side::Storage), PORTS[1]),
    );
    let cfg = text
        .replace(
            &socket.display().to_string(),
            &dir.path().join("shim.sock").display().to_string(),
        )
        .replace(&good, &bad);
    assert!(cfg.contains(&bad), "{cfg}");
    let file = dir.path().join("shim.yaml");
    std::fs::write(&file, cfg).unwrap();
    let err = refused_start(&s.net.wrap(Side::Host), &file).await;
    assert!(err.contains("fabric.rails[1].listen"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rail_cut_mid_transfer_fails_no_request_and_comes_back() {
    if agent::backend() != fabric::Backend::Tcp {
        eprintln!("rails in namespaces: tcp fabric only (verbs serves one rail)");
        return;
    }
    if !netns::available_or_skip("rails::a_rail_cut_mid_transfer_fails_no_request_and_comes_back") {
        return;
    }
    const N: usize = 16;
    let mut s = RailStack::start().await;
    let shim = s.shim(&[0, 1]);
    let c = Client::connect(&shim.socket).await.unwrap();
    // The GETs' objects, PUT before the cut.
    let (_, gets) = put_all(&c, "cut/get", filled(&c, N, 1000).await).await;
    let puts = filled(&c, N, 2000).await;
    let rail = s.label(1);
    let before = s.net.rail_bytes(1);

    // 16 GETs and 16 PUTs at once; rail 1 is cut once it carried an eighth
    // of their bytes (a quarter of its share).
    let (c1, c2) = (c.clone(), c.clone());
    let get_task = tokio::spawn(async move { get_all(&c1, "cut/get", gets).await });
    let put_task = tokio::spawn(async move { put_all(&c2, "cut/put", puts).await });
    let started = Instant::now();
    loop {
        let now = s.net.rail_bytes(1);
        if (now.rx - before.rx) + (now.tx - before.tx) >= 64 << 20 {
            break;
        }
        assert!(
            started.elapsed() < HANG_GUARD,
            "rail 1 never carried the transfers"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.net.cut(1);
    let cut_at = Instant::now();
    assert!(
        !get_task.is_finished() && !put_task.is_finished(),
        "the cut came after the transfers"
    );
    let (_, gets) = get_task.await.unwrap();
    let (_, _puts) = put_task.await.unwrap();
    println!(
        "rail 1 cut after {:.2} s of {N} GETs and {N} PUTs of {} MiB at once; all done {:.2} s later",
        started.elapsed().as_secs_f64() - cut_at.elapsed().as_secs_f64(),
        LEN >> 20,
        cut_at.elapsed().as_secs_f64(),
    );
    for (i, b) in gets.iter().enumerate() {
        assert!(
            b.as_slice() == &data(LEN, 1000 + i as u64)[..],
            "cut/get/{i}: the GET placed other bytes"
        );
    }
    for i in 0..N {
        assert_eq!(
            sha256(&s.stored(&format!("cut/put/{i}")).await),
            sha256(&data(LEN, 2000 + i as u64)),
            "cut/put/{i}: the stored object is not what was sent"
        );
    }
    let m = s.agent_metrics();
    assert_eq!(failed_requests(&m), 0.0, "{m}");
    assert_eq!(rail_up(&m, &rail), Some(0.0), "{rail}:\n{m}");
    assert!(
        rail_sample(&m, "s3dma_agent_rail_redone_total", &rail) >= 1.0,
        "the cut hit no transfer on {rail}:\n{m}"
    );
    assert_eq!(rail_up(&m, &s.label(0)), Some(1.0));
    // Every window the cut requests minted (one per rail per slice) is
    // revoked.
    assert_eq!(shim.metric("s3dma_shim_windows_open"), 0.0);

    // Back: a failback trial finds it working, and it carries bytes again.
    s.net.restore(1);
    let restored = Instant::now();
    let (bytes0, veth0) = (rail_bytes(&m, &rail, "get"), s.net.rail_bytes(1));
    let mut bufs = gets;
    bufs.truncate(1);
    let back = loop {
        let (_, b) = get_all(&c, "cut/get", bufs).await;
        bufs = b;
        assert!(
            bufs[0].as_slice() == &data(LEN, 1000)[..],
            "cut/get/0 after the restore"
        );
        let m = s.agent_metrics();
        if rail_up(&m, &rail) == Some(1.0) && rail_bytes(&m, &rail, "get") > bytes0 {
            break restored.elapsed();
        }
        assert!(
            restored.elapsed() < HANG_GUARD,
            "{rail} never came back:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "rail 1 up again and carrying bytes {:.2} s after the restore",
        back.as_secs_f64()
    );
    assert!(s.net.rail_bytes(1).rx - veth0.rx >= 1 << 20);
    assert_eq!(failed_requests(&s.agent_metrics()), 0.0);
    drop(c);
    drop(shim);
}
