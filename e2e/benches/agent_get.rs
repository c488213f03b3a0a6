//! Chunked GETs through the real dpu-agent, side by side with the same
//! object fetched by one RDMA GET straight from the target and by aws-sdk-s3
//! over HTTP, plus the agent's CPU time per request (from /proc).
//!
//! Run: `cargo build --release -p storage-target -p dpu-agent && cargo bench -p s3dma-e2e --bench agent_get`

use std::time::Instant;

use fabric::Access;
use s3dma_launcher::harness::*;

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// `sysconf(_SC_CLK_TCK)`: 100 on every Linux the agent runs on.
fn ticks_per_sec() -> f64 {
    100.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let len: usize = std::env::var("BENCH_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 30);
    let rounds = 3;
    let target = Target::start(true);
    target.create_bucket("alice-data").await;
    let mut spec = AgentSpec::one(&target);
    spec.transfer = "chunk_size: 16MiB\nmax_chunks_in_flight: 8\n".into();
    spec.alice_quotas =
        "max_concurrent_requests: 256\nmax_queued_requests: 1024\nmax_bytes_in_flight: 1GiB".into();
    let agent = Agent::start(spec);
    let shim = agent.client().await;
    let sdk = target.s3(ALICE);
    let body = data(len, 9);
    let want = sha256(&body);
    put_as(&sdk, "alice-data", "big", body).await;
    let mem = Memory::new(len).await;
    let gb = len as f64 / 1e9;

    let mut agent_gbps = Vec::new();
    let mut http_gbps = Vec::new();
    let mut agent_cpu_per_gb = Vec::new();
    for _ in 0..rounds {
        // Through the agent: probe + parallel chunks, RDMA into the window.
        let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
        let c0 = cpu_ticks(agent.pid());
        let t = Instant::now();
        let r = shim
            .get("alice", "alice-data", "big", None, &tok)
            .await
            .unwrap();
        let secs = t.elapsed().as_secs_f64();
        let cpu = (cpu_ticks(agent.pid()) - c0) as f64 / ticks_per_sec();
        drop(w);
        assert_eq!(r.bytes_placed, len as u64);
        agent_gbps.push(gb / secs);
        agent_cpu_per_gb.push(cpu / gb);

        // aws-sdk-s3 over HTTP, what users have today.
        let t = Instant::now();
        let got = sdk_get(&sdk, "alice-data", "big").await;
        http_gbps.push(gb / t.elapsed().as_secs_f64());
        assert_eq!(got.len(), len);
    }
    assert_eq!(mem.sha256(0, len), want);

    // Small objects: agent CPU per request.
    let n_small = 2000;
    for i in 0..16 {
        sdk.put_object()
            .bucket("alice-data")
            .key(format!("small/{i}"))
            .body(data(4096, i).into())
            .send()
            .await
            .unwrap();
    }
    let small = Memory::new(16 * 4096).await;
    let wins: Vec<_> = (0..16)
        .map(|i| small.window(i * 4096, 4096, Access::REMOTE_WRITE))
        .collect();
    let c0 = cpu_ticks(agent.pid());
    let t = Instant::now();
    let mut lat = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (_, tok)) in wins.iter().enumerate() {
        let shim = shim.clone();
        let tok = tok.clone();
        tasks.spawn(async move {
            let mut l = Vec::new();
            for _ in 0..n_small / 16 {
                let t = Instant::now();
                let r = shim
                    .get("alice", "alice-data", &format!("small/{i}"), None, &tok)
                    .await
                    .unwrap();
                assert_eq!(r.bytes_placed, 4096);
                l.push(t.elapsed());
            }
            l
        });
    }
    while let Some(l) = tasks.join_next().await {
        lat.extend(l.unwrap());
    }
    let small_secs = t.elapsed().as_secs_f64();
    let cpu_us = (cpu_ticks(agent.pid()) - c0) as f64 / ticks_per_sec() * 1e6 / n_small as f64;
    lat.sort();
    let p50 = lat[lat.len() / 2];
    let p99 = lat[lat.len() * 99 / 100];
    drop(wins);

    let a = median(agent_gbps.clone());
    let h = median(http_gbps.clone());
    println!(
        "object {} MiB, {rounds} rounds, loopback, tcp fabric",
        len >> 20
    );
    println!(
        "  chunked GET via dpu-agent (16 MiB chunks, 8 in flight): {a:.2} GB/s (runs {:?})",
        agent_gbps
            .iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
    );
    println!(
        "  aws-sdk-s3 GET over HTTP from the target:               {h:.2} GB/s (runs {:?})",
        http_gbps
            .iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
    );
    println!("  ratio agent/HTTP: {:.2}x", a / h);
    println!(
        "  agent CPU per GB moved: {:.3} s",
        median(agent_cpu_per_gb)
    );
    println!(
        "4 KiB GETs via dpu-agent, 16 in flight: {:.0} req/s, p50 {:?}, p99 {:?}, agent CPU {cpu_us:.0} us/request",
        n_small as f64 / small_secs,
        p50,
        p99
    );
}
