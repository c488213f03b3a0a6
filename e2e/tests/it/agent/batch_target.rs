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

/// A storage-target (bucket `alice-data`) and a gateway in front of it
/// (`gw-data`, an 8 MiB cache of 1 MiB chunks), both `rdma` targets of
/// one agent, and a test shim on it.
async fn two_targets() -> (Target, Target, Agent, Shim) {
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
    (target, gw, agent, shim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_go_batched_to_the_target_and_single_to_a_gateway() {
    let (target, gw, agent, shim) = two_targets().await;
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
                        source_rails: Vec::new(),
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

/// GetObjects: small items to the storage-target travel as one batched
/// request (a missing key and an `if_match` that does not match fail
/// alone, a ranged item places its range); the gateway's items, declined,
/// go as single requests. Every destination is byte-exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_objects_go_batched_to_the_target_and_single_to_a_gateway() {
    let (target, gw, agent, shim) = two_targets().await;
    let s3 = target.s3(ALICE);
    let mut etags = Vec::new();
    for (b, n) in [("alice-data", 8), ("gw-data", 2)] {
        for i in 0..n {
            let put = s3
                .put_object()
                .bucket(b)
                .key(format!("k{i}"))
                .body(data(1000 + i, i as u64).into())
                .send()
                .await
                .unwrap();
            etags.push(put.e_tag().unwrap().to_owned());
        }
    }
    let mem = Memory::new(1 << 20).await;
    let windows: Vec<_> = (0..13)
        .map(|i| mem.window(i * 4096, 4096, Access::REMOTE_WRITE))
        .collect();
    let item = |i: usize, bucket: &str, key: &str| pb::GetObjectsItem {
        destination_rails: Vec::new(),
        bucket: bucket.into(),
        key: key.into(),
        range: None,
        destination: windows[i].1.clone(),
        if_match: String::new(),
    };
    let mut items: Vec<pb::GetObjectsItem> = (0..8)
        .map(|i| item(i, "alice-data", &format!("k{i}")))
        .collect();
    items.push(item(8, "alice-data", "missing"));
    items.push(pb::GetObjectsItem {
        if_match: "\"0123456789abcdef0123456789abcdef\"".into(),
        ..item(9, "alice-data", "k1")
    });
    items.push(pb::GetObjectsItem {
        range: Some(pb::ByteRange {
            kind: Some(pb::byte_range::Kind::Bounded(pb::byte_range::Bounded {
                first: 10,
                last: 109,
            })),
        }),
        if_match: etags[2].clone(),
        ..item(10, "alice-data", "k2")
    });
    items.push(item(11, "gw-data", "k0"));
    items.push(item(12, "gw-data", "k1"));
    let mut stream = shim
        .inner
        .clone()
        .get_objects(shim.req(pb::GetObjectsRequest {
            tenant: "alice".into(),
            items,
            concurrency: 0,
        }))
        .await
        .unwrap()
        .into_inner();
    let mut replies = Vec::new();
    while let Some(r) = stream.message().await.unwrap() {
        replies.push(r);
    }
    replies.sort_by_key(|r| r.index);
    assert_eq!(
        replies.iter().map(|r| r.index).collect::<Vec<_>>(),
        (0..13).collect::<Vec<u32>>()
    );
    let ok = |i: usize| match &replies[i].result {
        Some(pb::get_objects_reply::Result::Ok(ok)) => ok.clone(),
        other => panic!("item {i}: {other:?}"),
    };
    for (i, etag) in etags.iter().enumerate().take(8) {
        let r = ok(i);
        assert_eq!(r.bytes_placed, 1000 + i as u64, "item {i}");
        assert_eq!(r.range_start, 0);
        assert_eq!(r.path, pb::TransferPath::Rdma as i32, "item {i}");
        let info = r.object.unwrap();
        assert_eq!(
            (info.size, info.etag.as_str()),
            (1000 + i as u64, etag.as_str())
        );
        assert_eq!(
            mem.read(i * 4096, 1000 + i),
            data(1000 + i, i as u64),
            "item {i}"
        );
    }
    let fail = |i: usize| match &replies[i].result {
        Some(pb::get_objects_reply::Result::Error(e)) => e.clone(),
        other => panic!("item {i}: {other:?}"),
    };
    let e = fail(8);
    assert_eq!(e.s3_code, "NoSuchKey");
    assert_eq!(e.grpc_code, tonic::Code::NotFound as i32);
    assert_eq!(fail(9).s3_code, "PreconditionFailed");
    let r = ok(10);
    assert_eq!((r.bytes_placed, r.range_start), (100, 10));
    assert_eq!(r.object.unwrap().size, 1002);
    assert_eq!(mem.read(10 * 4096, 100), data(1002, 2)[10..110]);
    for (i, k) in [(11usize, 0usize), (12, 1)] {
        let r = ok(i);
        assert_eq!(r.bytes_placed, 1000 + k as u64, "item {i}");
        assert_eq!(
            mem.read(i * 4096, 1000 + k),
            data(1000 + k, k as u64),
            "item {i}"
        );
    }
    // The target's eleven items came as ONE batched request; the
    // gateway's two as single requests after its decline.
    let m = target.metrics_text().await;
    assert_eq!(served(&m), 1.0);
    let items_of = |outcome: &str| {
        metric_value(
            &m,
            &format!(
                r#"s3dma_storage_target_batch_items_total{{op="GetObject",outcome="{outcome}"}}"#
            ),
        )
    };
    assert_eq!((items_of("ok"), items_of("error")), (9.0, 2.0));
    assert_eq!(served(&gw.metrics_text().await), 0.0);
    let a = agent.metrics_text().await;
    let sent = |outcome: &str| {
        metric_value(
            &a,
            &format!(
                r#"s3dma_agent_target_batch_requests_total{{op="GetObjects",outcome="{outcome}"}}"#
            ),
        )
    };
    assert_eq!((sent("ok"), sent("declined")), (1.0, 1.0));
    assert!(agent.output().contains("declines s3dma batch requests"));
}
