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
//! One test, three phases: a 64 MiB PUT and GET over both rails (both
//! carried bytes each way, every byte exact); two 64 MiB GETs and two
//! PUTs at once with rail 1 cut mid-way (none fails, every object exact,
//! `s3dma_agent_rail_up` of rail 1 is 0 and its redone counter moved);
//! rail 1 back up and carrying GET bytes again (the seconds printed).
//!
//! Verbs only (`S3DMA_TEST_FABRIC=verbs`, run by `.ci/verbs-tests.sh`);
//! the tcp rails: `rails` (namespaces) and `shim::rails` (loopback).

use std::process::Command;
use std::time::{Duration, Instant};

use crate::rail_metrics::{failed_requests, rail_bytes, rail_sample, rail_up};
use crate::rails::{get_all, put_all};
use crate::shim::common::{HANG_GUARD, Shim, ShimOpts};
use s3dma_client::{Buffer, Client};
use s3dma_launcher::harness::{
    self as agent, ALICE, Agent, AgentSpec, Target, TargetOpts, data, sha256,
};

/// Each object of the test.
const LEN: usize = 64 << 20;
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
struct Cut(&'static str);

impl Cut {
    fn new(netdev: &'static str) -> Cut {
        ip_link(netdev, "down");
        Cut(netdev)
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "set", self.0, "up"])
            .status();
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_devices_stripe_and_a_cut_device_fails_no_request() {
    if !two_devices() {
        return;
    }
    let mut target = Target::start_opts(TargetOpts::new(true));
    target.reconfigure(|c| {
        c.rdma.rails = RAILS
            .iter()
            .map(|(dev, _, _)| fabric::rail::DeviceRail::new(*dev))
            .collect();
    });
    target.create_bucket("alice-data").await;
    let mut spec = AgentSpec::one(&target);
    // Many chunks and parts per object, so both rails get some of each.
    spec.transfer = "chunk_size: 2MiB\nmax_chunks_in_flight: 4\nmultipart_threshold: 5MiB\n\
                     part_size: 8MiB\n"
        .into();
    let agent = Agent::start(spec);
    let mut fabric_yaml = String::from("listen: null\nrails:\n");
    for (dev, _, ip) in RAILS {
        fabric_yaml.push_str(&format!("  - listen: {ip}:0\n    device: {dev}\n"));
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

    // 1. One object each way over both devices.
    let (_, bufs) = put_all(&c, "both", filled(&c, 1, 10).await).await;
    let (_, bufs) = get_all(&c, "both", bufs).await;
    exact("both", &bufs, 10);
    let stored = target.s3(ALICE);
    assert_eq!(
        sha256(&agent::sdk_get(&stored, "alice-data", "both/0").await),
        sha256(&data(LEN, 10)),
        "the stored object is what was sent"
    );
    let m = agent.metrics_text().await;
    let rails: Vec<String> = RAILS.iter().map(|(_, _, ip)| label(&m, ip)).collect();
    for rail in &rails {
        for op in ["get", "put"] {
            assert!(
                rail_bytes(&m, rail, op) > 0.0,
                "{rail} carried no {op}:\n{m}"
            );
        }
        assert_eq!(rail_up(&m, rail), Some(1.0), "{rail}");
    }
    let total: f64 = rails.iter().map(|r| rail_bytes(&m, r, "get")).sum();
    assert_eq!(total, LEN as f64, "every GET byte counted on one rail");
    println!(
        "64 MiB over rxe0 and rxe1: GET bytes {:.0} / {:.0}, PUT bytes {:.0} / {:.0}",
        rail_bytes(&m, &rails[0], "get"),
        rail_bytes(&m, &rails[1], "get"),
        rail_bytes(&m, &rails[0], "put"),
        rail_bytes(&m, &rails[1], "put"),
    );

    // 2. Two GETs and two PUTs at once; rxe1 cut once it carried 32 MiB
    // of them.
    const N: usize = 2;
    let (_, gets) = put_all(&c, "cut/get", filled(&c, N, 1000).await).await;
    let puts = filled(&c, N, 2000).await;
    let m = agent.metrics_text().await;
    let moved = |m: &str| rail_bytes(m, &rails[1], "get") + rail_bytes(m, &rails[1], "put");
    let before = moved(&m);
    let (c1, c2) = (c.clone(), c.clone());
    let get_task = tokio::spawn(async move { get_all(&c1, "cut/get", gets).await.1 });
    let put_task = tokio::spawn(async move { put_all(&c2, "cut/put", puts).await.1 });
    let started = Instant::now();
    while moved(&agent.metrics_text().await) < before + f64::from(32u32 << 20) {
        assert!(
            started.elapsed() < HANG_GUARD,
            "rail 1 never carried the transfers"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, netdev, _) = RAILS[1];
    let cut = Cut::new(netdev);
    let cut_at = Instant::now();
    assert!(
        !get_task.is_finished() && !put_task.is_finished(),
        "the cut came after the transfers"
    );
    let gets = get_task.await.unwrap();
    let _puts = put_task.await.unwrap();
    println!(
        "rxe1 cut {:.2} s into {N} GETs and {N} PUTs of 64 MiB at once; all done {:.2} s later",
        (cut_at - started).as_secs_f64(),
        cut_at.elapsed().as_secs_f64(),
    );
    exact("cut/get", &gets, 1000);
    for i in 0..N {
        assert_eq!(
            sha256(&agent::sdk_get(&stored, "alice-data", &format!("cut/put/{i}")).await),
            sha256(&data(LEN, 2000 + i as u64)),
            "cut/put/{i}: the stored object is not what was sent"
        );
    }
    let m = agent.metrics_text().await;
    assert_eq!(failed_requests(&m), 0.0, "{m}");
    assert_eq!(rail_up(&m, &rails[1]), Some(0.0), "{}:\n{m}", rails[1]);
    assert!(
        rail_sample(&m, "s3dma_agent_rail_redone_total", &rails[1]) >= 1.0,
        "the cut hit no transfer on {}:\n{m}",
        rails[1]
    );
    assert_eq!(rail_up(&m, &rails[0]), Some(1.0));
    assert_eq!(shim.metric("s3dma_shim_windows_open"), 0.0);

    // 3. Back: a failback trial finds rxe1 working and it carries bytes.
    drop(cut);
    let restored = Instant::now();
    let bytes0 = rail_bytes(&m, &rails[1], "get");
    let mut bufs = gets;
    bufs.truncate(1);
    let back = loop {
        bufs = get_all(&c, "cut/get", bufs).await.1;
        exact("cut/get after the restore", &bufs, 1000);
        let m = agent.metrics_text().await;
        if rail_up(&m, &rails[1]) == Some(1.0) && rail_bytes(&m, &rails[1], "get") > bytes0 {
            break restored.elapsed();
        }
        assert!(
            restored.elapsed() < HANG_GUARD,
            "{} never came back:\n{m}",
            rails[1]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "rxe1 up again and carrying bytes {:.2} s after the restore",
        back.as_secs_f64()
    );
    assert_eq!(failed_requests(&agent.metrics_text().await), 0.0);
    drop(c);
    drop(shim);
}
