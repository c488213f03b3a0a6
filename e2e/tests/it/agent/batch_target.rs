//! Tenant batches (PutObjects, HeadObjects) through the agent to two
//! targets: a storage-target, which gets each (target, bucket) group as ONE
//! s3dma batch request (counted by its metrics), and a gateway in front of
//! it (`store: s3`), which declines batches (`501`), so the agent sends
//! that group's items as single requests and remembers the decline.

use super::common::*;
use fabric::Access;
use s3dma_launcher::harness::{CacheConfig, TargetOpts};
use s3dma_proto::agent::v1 as pb;

fn served(text: &str) -> f64 {
    metric_value(
        text,
        r#"s3dma_storage_target_batch_requests_total{outcome="served"}"#,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_go_batched_to_the_target_and_single_to_a_gateway() {
    let target = Target::start(true);
    target.create_bucket("alice-data").await;
    target.create_bucket("gw-data").await;
    let gw = Target::start_opts(TargetOpts::gateway(
        &target.endpoint,
        CacheConfig {
            size: s3dma_config::ByteSize(8 << 20),
            chunk_size: s3dma_config::ByteSize(1 << 20),
            ..CacheConfig::default()
        },
    ));
    let mut spec = AgentSpec::new(vec![
        TargetSpec {
            name: "local",
            endpoint: target.endpoint.clone(),
            buckets: vec!["alice-data"],
            rdma: true,
        },
        TargetSpec {
            name: "gateway",
            endpoint: gw.endpoint.clone(),
            buckets: vec!["gw-data"],
            rdma: true,
        },
    ]);
    spec.extra_buckets = vec![("alice", "gw-data")];
    let agent = Agent::start(spec);
    let shim = agent.client().await;
    let mem = Memory::new(1 << 20).await;
    let payload = data(3 * 4096, 9);
    mem.fill(0, &payload);
    let windows: Vec<_> = (0..3)
        .map(|i| mem.window(i * 4096, 4096, Access::REMOTE_READ))
        .collect();

    for round in 0..2 {
        let items: Vec<pb::PutObjectsItem> = ["alice-data", "gw-data"]
            .iter()
            .flat_map(|b| {
                windows
                    .iter()
                    .enumerate()
                    .map(move |(i, (_, token))| pb::PutObjectsItem {
                        bucket: (*b).into(),
                        key: format!("k{i}"),
                        source: token.clone(),
                        content_type: "text/plain".into(),
                        metadata: [("n".to_owned(), i.to_string())].into(),
                    })
            })
            .collect();
        let r = shim
            .inner
            .clone()
            .put_objects(shim.req(pb::PutObjectsRequest {
                tenant: "alice".into(),
                items,
                concurrency: 0,
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.results.len(), 6);
        for (i, res) in r.results.iter().enumerate() {
            match &res.result {
                Some(pb::put_objects_result::Result::Ok(ok)) => {
                    assert_eq!(ok.size, 4096, "round {round} item {i}");
                }
                other => panic!("round {round} item {i}: {other:?}"),
            }
        }
        let keys: Vec<pb::ObjectKey> = ["alice-data", "gw-data"]
            .iter()
            .flat_map(|b| {
                ["k0", "k2", "none"].map(|k| pb::ObjectKey {
                    bucket: (*b).into(),
                    key: k.into(),
                })
            })
            .collect();
        let r = shim
            .inner
            .clone()
            .head_objects(shim.req(pb::HeadObjectsRequest {
                tenant: "alice".into(),
                items: keys,
                concurrency: 0,
            }))
            .await
            .unwrap()
            .into_inner();
        for (i, res) in r.results.iter().enumerate() {
            match (&res.result, i % 3) {
                (Some(pb::head_objects_result::Result::Object(o)), 0 | 1) => {
                    assert_eq!(o.size, 4096, "item {i}");
                    assert_eq!(o.content_type, "text/plain", "item {i}");
                    assert_eq!(
                        o.metadata.get("n").map(String::as_str),
                        Some(["0", "2"][i % 3])
                    );
                }
                (Some(pb::head_objects_result::Result::Missing(_)), 2) => {}
                other => panic!("round {round} item {i}: {other:?}"),
            }
        }
        // One batched request per group at the storage-target (a PUT and
        // a HEAD per round); the gateway's groups went as singles.
        assert_eq!(
            served(&target.metrics_text().await),
            f64::from(2 * (round + 1))
        );
        assert_eq!(served(&gw.metrics_text().await), 0.0);
    }
    let s3 = target.s3(ALICE);
    for b in ["alice-data", "gw-data"] {
        for i in 0..3 {
            let got = sdk_get(&s3, b, &format!("k{i}")).await;
            assert_eq!(got, payload[i * 4096..(i + 1) * 4096], "{b}/k{i}");
        }
    }
    let m = target.metrics_text().await;
    assert_eq!(
        metric_value(
            &m,
            r#"s3dma_storage_target_batch_items_total{op="PutObject",outcome="ok"}"#
        ),
        6.0
    );
    // The decline was remembered: one 501 from the gateway, not one per round.
    assert!(agent.output().contains("declines s3dma batch requests"));
    assert_eq!(
        agent
            .output()
            .matches("declines s3dma batch requests")
            .count(),
        1
    );
}
