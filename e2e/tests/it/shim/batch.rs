//! HeadObjects, PutObjects and DeleteObjects end to end (storage-target,
//! dpu-agent, host-shim as real processes): per-item results in request
//! order (a missing key is a result), items refused one by one (a bad
//! slice, a buffer the caller does not hold, a key the policy denies, a bad
//! bucket name) while the others run, and the caps of the shim
//! (`max_batch_items`, `max_batch_bytes` per tenant) and of the agent
//! (`transfer.max_batch_items`, `transfer.max_batch_bytes`) refusing a
//! whole batch with an error naming the cap (GetObjects too, whose items
//! reach the agent as single calls: the shim's byte cap). After every
//! refusal the shim keeps serving and holds no window.

use crate::shim::common::*;
use s3dma_client::{ErrorKind, GetItem, ObjectKey, PutItem};
use s3dma_proto::agent::v1 as agent_pb;
use s3dma_proto::tenant::v1 as api;

async fn guard<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(HANG_GUARD, f)
        .await
        .expect("hung past the hang guard")
}

fn key(bucket: &str, key: &str) -> ObjectKey {
    ObjectKey {
        bucket: bucket.into(),
        key: key.into(),
    }
}

/// The shim allows alice 32 items and 2 MiB per batch; the agent 16 items
/// and 1 MiB: each cap is reached through the other. Alice may use the
/// bucket `ghost`, which the target lacks.
fn stack_opts() -> (impl FnOnce(&mut AgentSpec), ShimOpts) {
    (
        |spec: &mut AgentSpec| {
            spec.transfer = "max_batch_items: 16\nmax_batch_bytes: 1MiB".into();
            // A bucket alice may use that the target does not have.
            spec.extra_buckets.push(("alice", "ghost"));
        },
        ShimOpts {
            alice_yaml: "max_batch_items: 32\nmax_batch_bytes: 2MiB".into(),
            ..Default::default()
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_answer_item_by_item_in_request_order() {
    let (tweak, opts) = stack_opts();
    let stack = Stack::start_opts(tweak, opts).await;
    let c = stack.client().await;
    let payload = data(64 << 10, 44);
    let mut buf = c.alloc(64 << 10).await.unwrap();
    buf.as_mut_slice().copy_from_slice(&payload);

    // PutObjects: four objects (one empty) from one buffer.
    let spans = [(0usize, 4096usize), (4096, 0), (8192, 1), (10_000, 50_000)];
    let puts: Vec<PutItem> = spans
        .iter()
        .enumerate()
        .map(|(i, &(offset, length))| PutItem {
            bucket: "alice-data".into(),
            key: format!("batch/{i}"),
            offset,
            length,
            ..Default::default()
        })
        .collect();
    let stored = guard(c.put_objects(&buf, &puts, 0)).await.unwrap();
    assert_eq!(stored.len(), 4);
    for (i, (r, &(offset, length))) in stored.iter().zip(&spans).enumerate() {
        let r = r.as_ref().unwrap_or_else(|e| panic!("item {i}: {e}"));
        assert_eq!(r.size, length as u64, "item {i}");
        let got =
            agent::sdk_get(&stack.target.s3(ALICE), "alice-data", &format!("batch/{i}")).await;
        assert_eq!(
            sha256(&got),
            sha256(&payload[offset..offset + length]),
            "item {i}"
        );
    }
    assert_eq!(stack.shim.metric("s3dma_shim_windows_open"), 0.0);

    // HeadObjects: found, missing, found, denied by the policy, a bucket
    // the target lacks (told from a missing key by one HeadBucket).
    let heads = guard(c.head_objects(
        &[
            key("alice-data", "batch/0"),
            key("alice-data", "batch/none"),
            key("alice-data", "batch/3"),
            key("bob-data", "anything"),
            key("ghost", "k"),
        ],
        0,
    ))
    .await
    .unwrap();
    assert_eq!(heads.len(), 5);
    let found = heads[0].as_ref().unwrap().as_ref().unwrap();
    assert_eq!(found.size, 4096);
    assert_eq!(found.etag, stored[0].as_ref().unwrap().etag);
    assert!(heads[1].as_ref().unwrap().is_none(), "{:?}", heads[1]);
    assert_eq!(heads[2].as_ref().unwrap().as_ref().unwrap().size, 50_000);
    let denied = heads[3].as_ref().unwrap_err();
    assert_eq!(denied.kind(), ErrorKind::AccessDenied, "{denied}");
    assert_eq!(denied.code(), "AccessDenied");
    let e = heads[4].as_ref().unwrap_err();
    assert_eq!(e.code(), "NoSuchBucket", "{e}");

    // DeleteObjects: deleted, already missing (succeeds, as in S3), denied.
    let dels = guard(c.delete_objects(&[
        key("alice-data", "batch/0"),
        key("alice-data", "batch/none"),
        key("bob-data", "anything"),
        key("alice-data", "batch/2"),
    ]))
    .await
    .unwrap();
    assert!(
        dels[0].is_ok() && dels[1].is_ok() && dels[3].is_ok(),
        "{dels:?}"
    );
    assert_eq!(dels[2].as_ref().unwrap_err().code(), "AccessDenied");
    let heads = c
        .head_objects(
            &[
                key("alice-data", "batch/0"),
                key("alice-data", "batch/1"),
                key("alice-data", "batch/2"),
            ],
            0,
        )
        .await
        .unwrap();
    assert!(heads[0].as_ref().unwrap().is_none());
    assert_eq!(heads[1].as_ref().unwrap().as_ref().unwrap().size, 0);
    assert!(heads[2].as_ref().unwrap().is_none());

    // The agent counted the items by outcome.
    let m = stack.agent.metrics_text().await;
    assert!(
        m.lines()
            .any(|l| l.starts_with("s3dma_agent_batch_items_total")
                && l.contains("op=\"HeadObjects\"")
                && l.contains("outcome=\"missing\"")),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_batch_items_are_refused_one_by_one_and_caps_whole() {
    let (tweak, opts) = stack_opts();
    let stack = Stack::start_opts(tweak, opts).await;
    let c = stack.client().await;
    let mut buf = c.alloc(4 << 20).await.unwrap();
    buf.as_mut_slice()[..100].copy_from_slice(&data(100, 7));
    let size = buf.len() as u64;
    let mut raw = raw_tenant_client(&stack.shim.socket).await;
    let item = |key: &str, buffer_id: u64, offset: u64, length: Option<u64>| api::PutObjectsItem {
        bucket: "alice-data".into(),
        key: key.into(),
        source: Some(api::BufferSlice {
            buffer_id,
            offset,
            length,
        }),
        content_type: String::new(),
        metadata: Default::default(),
    };
    let id = buf.id();
    let items = vec![
        item("hostile/good", id, 0, Some(100)),
        // A buffer id the caller does not hold (unknown, or another
        // tenant's: the registry answers both alike).
        item("hostile/unknown-buffer", id + 1000, 0, Some(1)),
        item("hostile/offset-past", id, size + 1, Some(0)),
        item("hostile/length-past", id, size - 10, Some(11)),
        item("hostile/huge", id, u64::MAX, Some(u64::MAX)),
        item("hostile/no-length", id, 0, None),
        api::PutObjectsItem {
            source: None,
            ..item("hostile/no-source", id, 0, Some(1))
        },
        api::PutObjectsItem {
            bucket: "bob-data".into(),
            ..item("denied", id, 0, Some(1))
        },
        api::PutObjectsItem {
            bucket: "Bad/Bucket".into(),
            ..item("bad-bucket", id, 0, Some(1))
        },
        item("", id, 0, Some(1)),
        item("hostile/good2", id, 50, Some(50)),
    ];
    let r = guard(raw.put_objects(api::PutObjectsRequest {
        items,
        concurrency: 0,
    }))
    .await
    .unwrap()
    .into_inner();
    assert_eq!(r.results.len(), 11);
    let code = |i: usize| match &r.results[i].result {
        Some(agent_pb::put_objects_result::Result::Error(e)) => {
            assert!(!e.message.is_empty() && !e.request_id.is_empty(), "{e:?}");
            (tonic::Code::from_i32(e.grpc_code), e.s3_code.clone())
        }
        other => panic!("item {i}: {other:?}"),
    };
    use tonic::Code;
    for (i, want) in [
        (1, (Code::NotFound, "NoSuchBuffer")),
        (2, (Code::InvalidArgument, "OutOfBounds")),
        (3, (Code::InvalidArgument, "OutOfBounds")),
        (4, (Code::InvalidArgument, "OutOfBounds")),
        (5, (Code::InvalidArgument, "InvalidArgument")),
        (6, (Code::InvalidArgument, "InvalidArgument")),
        (7, (Code::PermissionDenied, "AccessDenied")),
        (8, (Code::InvalidArgument, "InvalidArgument")),
        (9, (Code::InvalidArgument, "InvalidArgument")),
    ] {
        assert_eq!(code(i), (want.0, want.1.to_owned()), "item {i}");
    }
    for (i, len) in [(0usize, 100u64), (10, 50)] {
        match &r.results[i].result {
            Some(agent_pb::put_objects_result::Result::Ok(ok)) => assert_eq!(ok.size, len),
            other => panic!("item {i}: {other:?}"),
        }
    }
    let src = &buf.as_slice()[..100];
    let s3 = stack.target.s3(ALICE);
    assert_eq!(agent::sdk_get(&s3, "alice-data", "hostile/good").await, src);
    assert_eq!(
        agent::sdk_get(&s3, "alice-data", "hostile/good2").await,
        &src[50..]
    );
    for k in [
        "hostile/unknown-buffer",
        "hostile/length-past",
        "hostile/no-length",
    ] {
        assert!(
            s3dma_testkit::get_as(&s3, "alice-data", k).await.is_none(),
            "{k} was stored"
        );
    }
    assert_eq!(stack.shim.metric("s3dma_shim_windows_open"), 0.0);

    // Caps refuse the whole batch with an error naming them.
    let keys = |n: usize| {
        (0..n)
            .map(|i| key("alice-data", &format!("k{i}")))
            .collect::<Vec<_>>()
    };
    let cap = |e: s3dma_client::Error, name: &str| {
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.message().contains(name), "{name}: {e}");
    };
    // The shim's (33 > 32) and the agent's (17 > 16), for each call.
    let shim_items = "this tenant's max_batch_items";
    cap(c.head_objects(&keys(33), 0).await.unwrap_err(), shim_items);
    cap(c.delete_objects(&keys(33)).await.unwrap_err(), shim_items);
    cap(
        c.head_objects(&keys(17), 0).await.unwrap_err(),
        "transfer.max_batch_items",
    );
    cap(
        c.delete_objects(&keys(17)).await.unwrap_err(),
        "transfer.max_batch_items",
    );
    let st = raw
        .head_objects(api::HeadObjectsRequest {
            items: vec![],
            concurrency: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument, "{st:?}");
    let put = |n: usize, len: usize| {
        (0..n)
            .map(|i| PutItem {
                bucket: "alice-data".into(),
                key: format!("big/{i}"),
                offset: 0,
                length: len,
                ..Default::default()
            })
            .collect::<Vec<_>>()
    };
    cap(
        c.put_objects(&buf, &put(33, 1), 0).await.unwrap_err(),
        shim_items,
    );
    cap(
        c.put_objects(&buf, &put(17, 1), 0).await.unwrap_err(),
        "transfer.max_batch_items",
    );
    // 3 MiB: past the shim's 2 MiB; 1.5 MiB: past the agent's 1 MiB.
    cap(
        c.put_objects(&buf, &put(3, 1 << 20), 0).await.unwrap_err(),
        "this tenant's max_batch_bytes",
    );
    cap(
        c.put_objects(&buf, &put(3, 512 << 10), 0)
            .await
            .unwrap_err(),
        "transfer.max_batch_bytes",
    );
    // GetObjects names 3 MiB of destinations: past the shim's 2 MiB.
    let gets: Vec<GetItem> = (0..3)
        .map(|i| GetItem {
            bucket: "alice-data".into(),
            key: "hostile/good".into(),
            offset: i << 20,
            length: Some(1 << 20),
            ..Default::default()
        })
        .collect();
    cap(
        c.get_objects(&mut buf, &gets, 0).await.unwrap_err(),
        "this tenant's max_batch_bytes",
    );
    assert!(
        s3dma_testkit::get_as(&s3, "alice-data", "big/0")
            .await
            .is_none(),
        "a refused batch stored an item"
    );
    assert_eq!(stack.shim.metric("s3dma_shim_windows_open"), 0.0);

    // The shim keeps serving.
    assert!(c.info().await.unwrap().agent_connected);
    let heads = c
        .head_objects(&[key("alice-data", "hostile/good")], 0)
        .await
        .unwrap();
    assert_eq!(heads[0].as_ref().unwrap().as_ref().unwrap().size, 100);
}
