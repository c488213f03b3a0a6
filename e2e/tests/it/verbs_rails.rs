//! Verbs rails on two RDMA devices: in the Soft-RoCE VM of
//! `.ci/rdma-vm.sh`, rxe0 (dummy0, 10.77.0.1) and rxe1 (dummy1,
//! 10.77.1.1). The shim serves tenant memory on both (`fabric.rails`, each
//! rail naming its device: a protection domain per tenant on each device,
//! every buffer registered on each), the storage-target serves on both
//! (`rdma.rails`: a domain, staging pool and session pool per device, each
//! request from the device facing its token's endpoint), and the agent
//! stripes each transfer's chunks and parts over them.
//!
//! Soft-RoCE moves bytes between queue pairs of one device only, so rail
//! i is device i at both ends, as two ports cabled to one switch plane
//! each would be. A cut is `ip link set dummy1 down`: rxe1's port goes
//! DOWN and its queue pairs' work fails, as a pulled cable does; the
//! assertions read the agent's metrics (the rail went down, its work was
//! redone), since a same-host link may not notice every cut.
//!
//! The s3dma dialect, three phases: a 64 MiB PUT and GET over both rails
//! (both carried bytes each way, every byte exact); two 64 MiB GETs and
//! two PUTs at once with rail 1 cut mid-way (none fails, every object
//! exact, `s3dma_agent_rail_up` of rail 1 is 0 and its redone counter
//! moved); rail 1 back up and carrying GET bytes again (the seconds
//! printed). hipobj-rc-v2 (a transfer's queue pair on the device of the
//! rail's window at the shim, the server's on its device facing that GID),
//! the first two phases with one GET and one PUT across the cut, and no
//! byte over HTTP. The two tests take turns (each cuts rxe1). cuObject DC
//! the same way over two mlx5 ports (`#[ignore]`d: DC needs a ConnectX-5
//! or newer, or a BlueField; its command is in the attribute).
//!
//! Verbs only (`S3DMA_TEST_FABRIC=verbs`, run by `.ci/verbs-tests.sh`);
//! the tcp rails: `rails` (namespaces) and `shim::rails` (loopback).

use std::process::Command;
use std::time::{Duration, Instant};

use crate::rail_metrics::{failed_requests, rail_bytes, rail_sample, rail_up, sum};
use crate::rails::{get_all, put_all};
use crate::shim::common::{HANG_GUARD, Shim, ShimOpts};
use s3dma_client::{Buffer, Client};
use s3dma_launcher::harness::{
    self as agent, ALICE, Agent, AgentSpec, Target, TargetOpts, data, sha256,
};

/// Each object of the test.
const LEN: usize = 64 << 20;
/// The tests take turns: each cuts rxe1 in its second phase.
static DEVICES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// The rails: (device, its netdev, its address).
const RAILS: [(&str, &str, &str); 2] = [
    ("rxe0", "dummy0", "10.77.0.1"),
    ("rxe1", "dummy1", "10.77.1.1"),
];

/// Whether this run has the two devices; outside verbs it returns false
/// (the tcp suites cover rails there), in the VM a missing rxe1 fails.
fn two_devices() -> bool {
    if agent::backend() != fabric::Backend::Verbs {
        eprintln!("verbs rails: the verbs fabric only (the tcp rails: `rails`, `shim::rails`)");
        return false;
    }
    let present = std::path::Path::new("/sys/class/infiniband/rxe1").exists();
    assert!(
        present || std::env::var_os("S3DMA_RDMA_VM").is_none(),
        "the RDMA VM has no rxe1 (.ci/rdma-vm.sh makes it)"
    );
    if !present {
        eprintln!("verbs rails: needs rxe0 and rxe1 (the VM of .ci/rdma-vm.sh)");
    }
    present
}

fn ip_link(dev: &str, state: &str) {
    let out = Command::new("ip")
        .args(["link", "set", dev, state])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip link set {dev} {state}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Takes a netdev down; up again when dropped (a failed test leaves
/// the VM's other suites their devices).
struct Cut(String);

impl Cut {
    fn new(netdev: &str) -> Cut {
        ip_link(netdev, "down");
        Cut(netdev.to_owned())
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "set", &self.0, "up"])
            .status();
    }
}

/// A rail as the tests drive it: its device at both ends, the netdev a
/// cut takes down, the address the shim's rail listens on.
#[derive(Debug, Clone)]
struct DeviceRail {
    device: String,
    netdev: String,
    ip: String,
}

/// The VM's two rails ([`RAILS`]).
fn vm_rails() -> Vec<DeviceRail> {
    RAILS
        .iter()
        .map(|(device, netdev, ip)| DeviceRail {
            device: (*device).into(),
            netdev: (*netdev).into(),
            ip: (*ip).into(),
        })
        .collect()
}

/// The agent's label of the rail at `ip` (`ip:port`, the shim's endpoint).
fn label(m: &str, ip: &str) -> String {
    let start = format!("rail=\"{ip}:");
    m.lines()
        .find_map(|l| {
            let rest = &l[l.find(&start)? + 6..];
            Some(rest[..rest.find('"')?].to_owned())
        })
        .unwrap_or_else(|| panic!("no rail {ip} in the agent's metrics:\n{m}"))
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

/// Every buffer holds `data(LEN, seed + i)`.
fn exact(what: &str, bufs: &[Buffer], seed: u64) {
    for (i, b) in bufs.iter().enumerate() {
        assert!(
            b.as_slice() == &data(LEN, seed + i as u64)[..],
            "{what}/{i}: other bytes than were sent"
        );
    }
}

/// A target serving on both devices, an agent with many chunks and parts
/// per object (`target_yaml`: the target's dialect), a shim with a rail on
/// each device, its client and the agent's label of each rail.
struct TwoRails {
    devices: Vec<DeviceRail>,
    target: Target,
    agent: Agent,
    shim: Shim,
    c: Client,
    rails: Vec<String>,
    /// When the last phase ended (each phase prints its seconds: where a
    /// slow VM run spends them).
    phase: Instant,
    _dir: tempfile::TempDir,
}

impl TwoRails {
    async fn start(target_yaml: &str, devices: Vec<DeviceRail>) -> TwoRails {
        let phase = Instant::now();
        let mut target = Target::start_opts(TargetOpts::new(true));
        target.reconfigure(|c| {
            c.rdma.rails = devices
                .iter()
                .map(|d| fabric::rail::DeviceRail::new(&d.device))
                .collect();
        });
        target.create_bucket("alice-data").await;
        let mut spec = AgentSpec::one(&target);
        spec.target_yaml = target_yaml.into();
        // Many chunks and parts per object, so both rails get some of each.
        spec.transfer = "chunk_size: 2MiB\nmax_chunks_in_flight: 4\nmultipart_threshold: 5MiB\n\
                         part_size: 8MiB\n"
            .into();
        let agent = Agent::start(spec);
        let mut fabric_yaml = String::from("listen: null\nrails:\n");
        for d in &devices {
            fabric_yaml.push_str(&format!(
                "  - listen: {}:0\n    device: {}\n",
                d.ip, d.device
            ));
        }
        let dir = tempfile::tempdir().unwrap();
        let shim = Shim::start_opts(
            dir.path(),
            &agent,
            ShimOpts {
                fabric_yaml,
                ..ShimOpts::default()
            },
        );
        let c = Client::connect(&shim.socket).await.unwrap();
        TwoRails {
            devices,
            target,
            agent,
            shim,
            c,
            rails: Vec::new(),
            phase,
            _dir: dir,
        }
    }

    /// Prints how long the phase `what` took.
    fn phase_done(&mut self, what: &str) {
        println!("{what}: {:.1} s", self.phase.elapsed().as_secs_f64());
        self.phase = Instant::now();
    }

    /// The stored `key`'s SHA-256, read back with aws-sdk-s3.
    async fn stored(&self, key: &str) -> String {
        sha256(&agent::sdk_get(&self.target.s3(ALICE), "alice-data", key).await)
    }

    /// Phase 1: one object each way over both devices; both rails carried
    /// bytes each way, every GET byte is counted on one rail.
    async fn stripe(&mut self) {
        let c = &self.c;
        let (_, bufs) = put_all(c, "both", filled(c, 1, 10).await).await;
        let (_, bufs) = get_all(c, "both", bufs).await;
        exact("both", &bufs, 10);
        assert_eq!(
            self.stored("both/0").await,
            sha256(&data(LEN, 10)),
            "the stored object is what was sent"
        );
        let m = self.agent.metrics_text().await;
        self.rails = self.devices.iter().map(|d| label(&m, &d.ip)).collect();
        for rail in &self.rails {
            for op in ["get", "put"] {
                assert!(
                    rail_bytes(&m, rail, op) > 0.0,
                    "{rail} carried no {op}:\n{m}"
                );
            }
            assert_eq!(rail_up(&m, rail), Some(1.0), "{rail}");
        }
        let total: f64 = self.rails.iter().map(|r| rail_bytes(&m, r, "get")).sum();
        assert_eq!(total, LEN as f64, "every GET byte counted on one rail");
        println!(
            "64 MiB over rxe0 and rxe1: GET bytes {:.0} / {:.0}, PUT bytes {:.0} / {:.0}",
            rail_bytes(&m, &self.rails[0], "get"),
            rail_bytes(&m, &self.rails[1], "get"),
            rail_bytes(&m, &self.rails[0], "put"),
            rail_bytes(&m, &self.rails[1], "put"),
        );
    }

    /// Every byte the agent moved went by RDMA, none over HTTP (`hint`
    /// added to the failure).
    async fn no_byte_over_http(&self, hint: &str) {
        let m = self.agent.metrics_text().await;
        assert_eq!(
            sum(&m, "s3dma_agent_bytes_total", &["path=\"fallback\""]),
            0.0,
            "bytes went over HTTP{hint}:\n{m}"
        );
        assert!(sum(&m, "s3dma_agent_bytes_total", &["path=\"rdma\""]) > 0.0);
    }

    /// Phase 2: `n` GETs and `n` PUTs at once; rxe1 cut once it carried an
    /// eighth of their bytes. None fails, every object is exact, rail 1 is down and
    /// its work was redone. The cut, still in force, and the GET buffers.
    async fn cut(&self, n: usize) -> (Cut, Vec<Buffer>) {
        let (c, rails) = (&self.c, &self.rails);
        let (_, gets) = put_all(c, "cut/get", filled(c, n, 1000).await).await;
        let puts = filled(c, n, 2000).await;
        let m = self.agent.metrics_text().await;
        let moved = |m: &str| rail_bytes(m, &rails[1], "get") + rail_bytes(m, &rails[1], "put");
        let before = moved(&m);
        let (c1, c2) = (c.clone(), c.clone());
        let get_task = tokio::spawn(async move { get_all(&c1, "cut/get", gets).await.1 });
        let put_task = tokio::spawn(async move { put_all(&c2, "cut/put", puts).await.1 });
        let started = Instant::now();
        // An eighth of all the bytes over rail 1: every transfer is still
        // in flight then.
        let eighth = (n * LEN / 8) as f64;
        while moved(&self.agent.metrics_text().await) < before + eighth {
            assert!(
                started.elapsed() < HANG_GUARD,
                "rail 1 never carried the transfers"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let cut = Cut::new(&self.devices[1].netdev);
        let cut_at = Instant::now();
        // Some of the transfers are still running (under load one side may
        // be done already); that the cut hit work in flight is asserted
        // below by rail 1's redone counter.
        assert!(
            !get_task.is_finished() || !put_task.is_finished(),
            "the cut came after the transfers"
        );
        let gets = get_task.await.unwrap();
        let _puts = put_task.await.unwrap();
        println!(
            "rxe1 cut {:.2} s into {n} GETs and {n} PUTs of 64 MiB at once; all done {:.2} s later",
            (cut_at - started).as_secs_f64(),
            cut_at.elapsed().as_secs_f64(),
        );
        exact("cut/get", &gets, 1000);
        for i in 0..n {
            assert_eq!(
                self.stored(&format!("cut/put/{i}")).await,
                sha256(&data(LEN, 2000 + i as u64)),
                "cut/put/{i}: the stored object is not what was sent"
            );
        }
        let m = self.agent.metrics_text().await;
        assert_eq!(failed_requests(&m), 0.0, "{m}");
        assert_eq!(rail_up(&m, &rails[1]), Some(0.0), "{}:\n{m}", rails[1]);
        assert!(
            rail_sample(&m, "s3dma_agent_rail_redone_total", &rails[1]) >= 1.0,
            "the cut hit no transfer on {}:\n{m}",
            rails[1]
        );
        assert_eq!(rail_up(&m, &rails[0]), Some(1.0));
        assert_eq!(self.shim.metric("s3dma_shim_windows_open"), 0.0);
        (cut, gets)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_devices_stripe_and_a_cut_device_fails_no_request() {
    if !two_devices() {
        return;
    }
    let _turn = DEVICES.lock().await;
    let mut s = TwoRails::start("", vm_rails()).await;
    s.phase_done("set-up");
    s.stripe().await;
    s.phase_done("stripe");
    let (cut, gets) = s.cut(2).await;
    s.phase_done("cut");

    // 3. Back: a failback trial finds rxe1 working and it carries bytes.
    let bytes0 = rail_bytes(&s.agent.metrics_text().await, &s.rails[1], "get");
    drop(cut);
    let restored = Instant::now();
    let mut bufs = gets;
    bufs.truncate(1);
    // Made once: a GET a round, each checked against it.
    let want = data(LEN, 1000);
    let back = loop {
        bufs = get_all(&s.c, "cut/get", bufs).await.1;
        assert!(
            bufs[0].as_slice() == &want[..],
            "cut/get/0 after the restore: other bytes than were sent"
        );
        let m = s.agent.metrics_text().await;
        if rail_up(&m, &s.rails[1]) == Some(1.0) && rail_bytes(&m, &s.rails[1], "get") > bytes0 {
            break restored.elapsed();
        }
        assert!(
            restored.elapsed() < HANG_GUARD,
            "{} never came back:\n{m}",
            s.rails[1]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "rxe1 up again and carrying bytes {:.2} s after the restore",
        back.as_secs_f64()
    );
    assert_eq!(failed_requests(&s.agent.metrics_text().await), 0.0);
    s.phase_done("failback");
}

/// hipobj-rc-v2 over both devices: each chunk's and part's queue pair on
/// the device of its rail's window (the shim tracks every rail's window),
/// the server's QP on its device facing that GID (on Soft-RoCE a QP pair
/// spanning two devices would move nothing); across the cut a transfer on
/// rxe1 is redone as a new transfer on rxe0. No byte goes over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hipobj_rc_v2_transfers_stripe_and_a_cut_device_fails_no_request() {
    if !two_devices() {
        return;
    }
    let _turn = DEVICES.lock().await;
    let mut s = TwoRails::start("protocol: hipobj-rc-v2\n", vm_rails()).await;
    s.phase_done("set-up");
    s.stripe().await;
    s.phase_done("stripe");
    let (_cut, _) = s.cut(1).await;
    s.phase_done("cut");
    s.no_byte_over_http("").await;
    // Every session ends: done, or (on rxe1 at the cut) failed or
    // cancelled by the agent; none is left to the reaper.
    let started = Instant::now();
    loop {
        let t = s.target.metrics_text().await;
        if agent::metric_value(&t, "s3dma_storage_target_hipobj_sessions") == 0.0 {
            let ended = |outcome: &str| {
                let label = format!("outcome=\"{outcome}\"");
                // + 0.0: an empty sum is -0.
                sum(&t, "s3dma_storage_target_hipobj_sessions_total", &[&label]) + 0.0
            };
            println!(
                "hipobj-rc-v2 sessions: {} ok, {} failed, {} cancelled",
                ended("ok"),
                ended("failed"),
                ended("cancelled")
            );
            break;
        }
        assert!(
            started.elapsed() < HANG_GUARD,
            "a hipobj-rc-v2 session outlived its transfer:\n{t}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// cuObject DC over two mlx5 ports as two rails: each chunk's and part's
/// standard token names the tenant's DC target on its rail's device, the
/// target's DC initiators on its rail facing that GID; across a cut of
/// rail 1 no request fails (GET chunks redone after the DC retry budget).
/// `S3DMA_DC_RAILS`: `device:netdev:ip,device:netdev:ip`, the two ports
/// (each its own subnet), both ends on this host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs two mlx5 ports with DC (ConnectX-5 or newer, BlueField): S3DMA_DC_RAILS=mlx5_0:ens1f0np0:10.0.1.1,mlx5_1:ens1f1np1:10.0.2.1 S3DMA_TEST_FABRIC=verbs cargo test -p s3dma-e2e --all-features --test it verbs_rails::cuobject_dc -- --ignored"]
async fn cuobject_dc_stripes_over_two_mlx5_ports_and_a_cut_port_fails_no_request() {
    assert_eq!(
        agent::backend(),
        fabric::Backend::Verbs,
        "S3DMA_TEST_FABRIC=verbs"
    );
    let spec = std::env::var("S3DMA_DC_RAILS")
        .expect("S3DMA_DC_RAILS=device:netdev:ip,device:netdev:ip (two mlx5 ports)");
    let devices: Vec<DeviceRail> = spec
        .split(',')
        .map(|r| {
            let f: Vec<&str> = r.split(':').collect();
            assert_eq!(f.len(), 3, "S3DMA_DC_RAILS: {r} is not device:netdev:ip");
            DeviceRail {
                device: f[0].into(),
                netdev: f[1].into(),
                ip: f[2].into(),
            }
        })
        .collect();
    assert_eq!(devices.len(), 2, "S3DMA_DC_RAILS names two rails");
    let _turn = DEVICES.lock().await;
    let mut s = TwoRails::start("protocol: cuobject-dc\n", devices).await;
    s.phase_done("set-up");
    s.stripe().await;
    s.phase_done("stripe");
    let (_cut, _) = s.cut(1).await;
    s.phase_done("cut");
    s.no_byte_over_http(" (a rail without a DC target?)").await;
}
