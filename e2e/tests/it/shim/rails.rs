//! The shim's fabric rails (`fabric.rails`) through real storage-target,
//! dpu-agent and host-shim processes on loopback: two rails on 127.0.0.1
//! and 127.0.0.2, every GET and PUT slice minted once per rail, and the
//! agent spreading a transfer's chunks and parts over both (its
//! `s3dma_agent_rail_bytes_total` per rail address). A rail whose address
//! is not on this host is refused at start, naming the rail. (A rail cut
//! mid-transfer, with network namespaces and rate limits: the top-level
//! `rails` suite.)

use crate::rail_metrics::rail_bytes;
use crate::shim::common::*;
use s3dma_client::{GetItem, GetOptions, PutItem, PutOptions};

/// The two loopback rails, replacing `fabric.listen`.
const TWO_RAILS: &str = "listen: null\nrails:\n  - listen: 127.0.0.1:0\n  - listen: 127.0.0.2:0\n";

/// 1 MiB chunks and 5 MiB parts, so a 24 MiB object is many transfers.
fn small_chunks(spec: &mut AgentSpec) {
    spec.transfer = "chunk_size: 1MiB\nmax_chunks_in_flight: 4\nmultipart_threshold: 5MiB\n\
                     part_size: 5MiB\n"
        .into();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rails_carry_single_and_batched_gets_and_puts() {
    if agent::backend() != fabric::Backend::Tcp {
        eprintln!("rails on loopback addresses: tcp fabric only (verbs serves one rail)");
        return;
    }
    let stack = Stack::start_opts(
        small_chunks,
        ShimOpts {
            fabric_yaml: TWO_RAILS.into(),
            ..ShimOpts::default()
        },
    )
    .await;
    let c = stack.client().await;
    const LEN: usize = 24 << 20;
    let body = data(LEN, 46);
    let mut src = c.alloc(LEN).await.unwrap();
    src.as_mut_slice().copy_from_slice(&body);
    let put = c
        .put_object_from("alice-data", "railed", &src, 0..LEN, PutOptions::default())
        .await
        .unwrap();
    assert_eq!(put.size, LEN as u64);
    assert_eq!(
        sdk_sha(&stack, "railed").await,
        sha256(&body),
        "the stored object is what was sent"
    );
    let mut dst = c.alloc(LEN).await.unwrap();
    dst.as_mut_slice().fill(0xEE);
    let got = c
        .get_object_into("alice-data", "railed", &mut dst, 0, GetOptions::default())
        .await
        .unwrap();
    assert_eq!(got.bytes_placed, LEN as u64);
    assert!(dst.as_slice() == &body[..], "the GET placed every byte");
    let m = stack.agent.metrics_text().await;
    for ip in ["127.0.0.1", "127.0.0.2"] {
        for op in ["get", "put"] {
            assert!(
                rail_bytes(&m, &format!("{ip}:"), op) > 0.0,
                "rail {ip} carried no {op}:\n{m}"
            );
        }
    }
    let total: f64 = ["127.0.0.1", "127.0.0.2"]
        .iter()
        .map(|ip| rail_bytes(&m, &format!("{ip}:"), "get"))
        .sum();
    assert_eq!(total, LEN as f64, "every GET byte counted on one rail");

    // Batches: each item's slice is minted on both rails too.
    let items: Vec<PutItem> = (0..16)
        .map(|i| PutItem {
            bucket: "alice-data".into(),
            key: format!("small/{i}"),
            offset: i * 4096,
            length: 4096,
            opts: PutOptions::default(),
        })
        .collect();
    let results = c.put_objects(&src, &items, 8).await.unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let items: Vec<GetItem> = (0..16)
        .map(|i| GetItem {
            bucket: "alice-data".into(),
            key: format!("small/{i}"),
            offset: i * 4096,
            length: Some(4096),
            ..Default::default()
        })
        .collect();
    dst.as_mut_slice().fill(0xEE);
    let results = c.get_objects(&mut dst, &items, 8).await.unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert!(dst.as_slice()[..16 * 4096] == body[..16 * 4096]);
    assert_eq!(stack.shim.metric("s3dma_shim_windows_open"), 0.0);

    // A rail whose address is not on this host: the shim does not start,
    // and says which rail.
    let text = std::fs::read_to_string(&stack.shim.config).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = text
        .replace(
            &format!("path: {}/shim.sock", stack.dir.path().display()),
            &format!("path: {}/shim.sock", dir.path().display()),
        )
        // TEST-NET-1: never an address of this host.
        .replace("127.0.0.2:0", "192.0.2.1:0");
    assert!(cfg.contains("192.0.2.1:0"), "{cfg}");
    let file = dir.path().join("shim.yaml");
    std::fs::write(&file, cfg).unwrap();
    let err = refused_start(&[], &file).await;
    assert!(err.contains("fabric.rails[1].listen"), "{err}");
}

async fn sdk_sha(stack: &Stack, key: &str) -> String {
    sha256(&agent::sdk_get(&stack.target.s3(ALICE), "alice-data", key).await)
}
