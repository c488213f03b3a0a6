//! GET and PUT through the real dpu-agent and storage-target processes: a
//! tenant holds tcp-fabric memory and calls the agent's gRPC API.

use super::common::*;
use fabric::Access;
use pb::byte_range::{Bounded, Kind};
use s3dma_proto::agent::v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_objects_and_ranges_over_rdma() {
    let target = Target::start(true);
    target.create_bucket("alice-data").await;
    let agent = Agent::start(AgentSpec::one(&target));
    let shim = agent.client().await;
    let mem = Memory::new(16 << 20).await;
    let sdk = target.s3(ALICE);

    for (i, len) in [0usize, 1, 4096, (5 << 20) + 1].into_iter().enumerate() {
        let key = format!("obj-{len}");
        let body = data(len, i as u64 + 1);
        mem.fill(0, &body);
        let (w, tok) = mem.window(0, len, Access::REMOTE_READ);
        let put = shim.put("alice", "alice-data", &key, &tok).await.unwrap();
        drop(w);
        assert_eq!(put.size, len as u64);
        assert_eq!(put.path, pb::TransferPath::Rdma as i32, "{len}");
        assert_eq!(put.parts, 0);
        // What the target stored, read with a real S3 client.
        assert_eq!(
            sha256(&sdk_get(&sdk, "alice-data", &key).await),
            sha256(&body),
            "{len}"
        );
        let head = sdk
            .head_object()
            .bucket("alice-data")
            .key(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(head.e_tag().unwrap(), put.etag);
        assert_eq!(head.metadata().unwrap()["origin"], "s3dma-test");

        // Whole GET into a fresh window.
        mem.clear(0xEE);
        let (w, tok) = mem.window(0, 16 << 20, Access::REMOTE_WRITE);
        let got = shim
            .get("alice", "alice-data", &key, None, &tok)
            .await
            .unwrap();
        drop(w);
        assert_eq!(got.bytes_placed, len as u64);
        assert_eq!(got.object.as_ref().unwrap().size, len as u64);
        assert_eq!(got.object.as_ref().unwrap().etag, put.etag);
        assert_eq!(
            got.object.as_ref().unwrap().metadata["origin"],
            "s3dma-test"
        );
        assert_eq!(mem.sha256(0, len), sha256(&body), "{len}");
        if len > 0 {
            assert_eq!(got.path, pb::TransferPath::Rdma as i32);
            // Nothing past the object was touched.
            assert_eq!(mem.read(len, 1), vec![0xEE]);
        }
    }

    // Ranges of the 5 MiB + 1 object.
    let len = (5usize << 20) + 1;
    let body = data(len, 4);
    let cases: Vec<(Kind, usize, usize)> = vec![
        (
            Kind::Bounded(Bounded {
                first: 10,
                last: 19,
            }),
            10,
            10,
        ),
        (
            Kind::Bounded(Bounded {
                first: 5 << 20,
                last: u64::MAX,
            }),
            5 << 20,
            1,
        ),
        (Kind::From(1 << 20), 1 << 20, len - (1 << 20)),
        (Kind::Suffix(100), len - 100, 100),
        (Kind::Suffix(1 << 30), 0, len),
    ];
    for (kind, start, n) in cases {
        mem.clear(0);
        let (w, tok) = mem.window(0, 16 << 20, Access::REMOTE_WRITE);
        let got = shim
            .get("alice", "alice-data", "obj-5242881", Some(kind), &tok)
            .await
            .unwrap();
        drop(w);
        assert_eq!(
            (got.range_start as usize, got.bytes_placed as usize),
            (start, n),
            "{kind:?}"
        );
        assert_eq!(mem.read(0, n), body[start..start + n], "{kind:?}");
    }
    // Past the end, and a window too small.
    let (_w, tok) = mem.window(0, 16 << 20, Access::REMOTE_WRITE);
    let e = shim
        .get(
            "alice",
            "alice-data",
            "obj-5242881",
            Some(Kind::From(len as u64)),
            &tok,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e:?}");
    let (_w, small) = mem.window(0, 4096, Access::REMOTE_WRITE);
    let e = shim
        .get("alice", "alice-data", "obj-5242881", None, &small)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert_eq!(s3_code(&e), "DestinationTooSmall");
    // Missing key.
    let e = shim
        .get("alice", "alice-data", "nope", None, &tok)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert_eq!(s3_code(&e), "NoSuchKey");
    assert!(!e.message().contains("NoSuchKey: NoSuchKey"), "{e:?}");
    // Missing bucket ("shared" is granted to alice but never created): a
    // GET and a HEAD both say NoSuchBucket, though a HEAD reply has no body.
    let e = shim
        .get("alice", "shared", "nope", None, &tok)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert_eq!(s3_code(&e), "NoSuchBucket", "{e:?}");
    let e = shim
        .inner
        .clone()
        .head_object(shim.req(pb::HeadObjectRequest {
            tenant: "alice".into(),
            bucket: "shared".into(),
            key: "nope".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert_eq!(s3_code(&e), "NoSuchBucket", "{e:?}");
    // The message does not repeat its code.
    assert_eq!(e.message().matches("NoSuchBucket").count(), 1, "{e:?}");
}

/// A 1 GiB object: multipart PUT over RDMA (parts read in parallel from the
/// window), then a GET in parallel chunks, checked by SHA-256.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_multipart_put_and_chunked_get() {
    let (target, agent, shim) = alice_stack(|spec| {
        spec.transfer = "chunk_size: 16MiB\nmax_chunks_in_flight: 8\npart_size: 64MiB\n".into();
    })
    .await;
    let len = large_object_len();
    let parts = len.div_ceil(64 << 20);
    let mem = Memory::new(len).await;
    let body = data(len, 77);
    let want = sha256(&body);
    mem.fill(0, &body);
    drop(body);

    let (w, tok) = mem.window(0, len, Access::REMOTE_READ);
    let put = shim.put("alice", "alice-data", "big", &tok).await.unwrap();
    drop(w);
    assert_eq!(put.parts as usize, parts);
    assert_eq!(put.path, pb::TransferPath::Rdma as i32);
    assert!(put.etag.ends_with(&format!("-{parts}\"")), "{}", put.etag);
    let head = target
        .s3(ALICE)
        .head_object()
        .bucket("alice-data")
        .key("big")
        .send()
        .await
        .unwrap();
    assert_eq!(head.content_length(), Some(len as i64));
    assert_eq!(head.e_tag(), Some(put.etag.as_str()));

    mem.clear(0);
    let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
    let started = std::time::Instant::now();
    let got = shim
        .get("alice", "alice-data", "big", None, &tok)
        .await
        .unwrap();
    let secs = started.elapsed().as_secs_f64();
    drop(w);
    assert_eq!(got.bytes_placed, len as u64);
    assert_eq!(got.path, pb::TransferPath::Rdma as i32);
    assert_eq!(mem.sha256(0, len), want);
    println!("{len} B chunked GET: {:.2} GB/s", len as f64 / secs / 1e9);
    // 16 MiB chunks went to the target, each its own signed GET.
    let m = agent.metrics_text().await;
    assert!(
        m.contains(&format!(
            r#"s3dma_agent_bytes_total{{op="GetObject",path="rdma",tenant="alice"}} {len}"#
        )),
        "{m}"
    );
}

/// An overwrite during a chunked GET: the GET fails with a precondition
/// error (If-Match on every chunk), never returns a mix of versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwrite_during_chunked_get_is_detected() {
    let (target, _agent, shim) = alice_stack(|spec| {
        // Small chunks, one at a time, 2 MiB/s (after a one-second burst): a
        // 16 MiB GET takes ~7 s, far longer than the overwrite needs (a 64 KiB
        // object: it lands in time even on the VM's emulated CPUs with other
        // suites running beside this one).
        spec.transfer = "chunk_size: 1MiB\nmax_chunks_in_flight: 1\n".into();
        spec.alice_quotas = "max_bytes_per_second: 2MiB".into();
    })
    .await;
    let len = 16usize << 20;
    let sdk = target.s3(ALICE);
    let v1 = data(len, 1);
    let v2 = data(64 << 10, 2);
    put_as(&sdk, "alice-data", "k", v1.clone()).await;
    let mem = Memory::new(len).await;
    let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
    let get = tokio::spawn({
        let shim = shim.clone();
        async move { shim.get("alice", "alice-data", "k", None, &tok).await }
    });
    // Overwrite once the first chunk of v1 has landed: the GET is under way
    // (however slowly the VM's emulated CPUs got it there).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while mem.read(0, 4096) != v1[..4096] {
        assert!(
            !get.is_finished() && std::time::Instant::now() < deadline,
            "the GET never placed its first chunk"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    put_as(&sdk, "alice-data", "k", v2.clone()).await;
    let res = get.await.unwrap();
    drop(w);
    let e = res.expect_err("the object changed mid-GET: the GET must fail");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert_eq!(s3_code(&e), "PreconditionFailed");
    assert!(e.message().contains("changed during the transfer"), "{e:?}");

    // Afterwards a GET returns exactly one version.
    let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
    let ok = shim
        .get("alice", "alice-data", "k", None, &tok)
        .await
        .unwrap();
    drop(w);
    assert_eq!(ok.bytes_placed, v2.len() as u64);
    assert_eq!(mem.sha256(0, v2.len()), sha256(&v2));
}

/// List (paging, delimiter), head, delete, and a GetObjects batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_head_delete_and_batch() {
    let target = Target::start(true);
    target.create_bucket("alice-data").await;
    let agent = Agent::start(AgentSpec::one(&target));
    let shim = agent.client().await;
    let mem = Memory::new(1 << 20).await;
    let sdk = target.s3(ALICE);
    let keys = ["a/1", "a/2", "b/1", "c", "d e+f/ü"];
    for (i, k) in keys.iter().enumerate() {
        put_as(&sdk, "alice-data", k, data(1000 + i, i as u64)).await;
    }
    let mut c = shim.inner.clone();
    // Paging through everything, 2 per page.
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let r = c
            .list_objects(shim.req(pb::ListObjectsRequest {
                tenant: "alice".into(),
                bucket: "alice-data".into(),
                max_keys: 2,
                continuation_token: token.clone(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        seen.extend(r.objects.iter().map(|o| (o.key.clone(), o.size)));
        if !r.is_truncated {
            break;
        }
        token = r.next_continuation_token;
    }
    assert_eq!(
        seen,
        vec![
            ("a/1".to_owned(), 1000),
            ("a/2".to_owned(), 1001),
            ("b/1".to_owned(), 1002),
            ("c".to_owned(), 1003),
            ("d e+f/ü".to_owned(), 1004)
        ]
    );
    let r = c
        .list_objects(shim.req(pb::ListObjectsRequest {
            tenant: "alice".into(),
            bucket: "alice-data".into(),
            delimiter: "/".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.common_prefixes, vec!["a/", "b/", "d e+f/"]);
    assert_eq!(r.objects.len(), 1);

    let h = c
        .head_object(shim.req(pb::HeadObjectRequest {
            tenant: "alice".into(),
            bucket: "alice-data".into(),
            key: "d e+f/ü".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(h.object.unwrap().size, 1004);

    // Batch: three objects into three windows plus one missing key.
    let wins: Vec<_> = (0..4)
        .map(|i| mem.window(i * 4096, 4096, Access::REMOTE_WRITE))
        .collect();
    let items = ["a/1", "a/2", "missing", "c"]
        .iter()
        .zip(&wins)
        .map(|(k, (_, t))| pb::GetObjectsItem {
            destination_rails: Vec::new(),
            bucket: "alice-data".into(),
            key: (*k).into(),
            range: None,
            destination: t.clone(),
            if_match: String::new(),
        })
        .collect();
    let mut stream = c
        .get_objects(shim.req(pb::GetObjectsRequest {
            tenant: "alice".into(),
            items,
            concurrency: 4,
        }))
        .await
        .unwrap()
        .into_inner();
    let mut replies = Vec::new();
    while let Some(r) = stream.message().await.unwrap() {
        replies.push(r);
    }
    replies.sort_by_key(|r| r.index);
    assert_eq!(replies.len(), 4);
    for (i, want) in [(0usize, 1000usize), (1, 1001), (3, 1003)] {
        match &replies[i].result {
            Some(pb::get_objects_reply::Result::Ok(ok)) => {
                assert_eq!(ok.bytes_placed, want as u64)
            }
            other => panic!("item {i}: {other:?}"),
        }
        assert_eq!(mem.read(i * 4096, want), data(want, [0, 1, 9, 3][i]));
    }
    match &replies[2].result {
        Some(pb::get_objects_reply::Result::Error(e)) => {
            assert_eq!(e.s3_code, "NoSuchKey");
            assert_eq!(e.grpc_code, tonic::Code::NotFound as i32);
        }
        other => panic!("missing key: {other:?}"),
    }
    drop(wins);

    // Delete, then it is gone (and deleting again succeeds, as in S3).
    for _ in 0..2 {
        c.delete_object(shim.req(pb::DeleteObjectRequest {
            tenant: "alice".into(),
            bucket: "alice-data".into(),
            key: "c".into(),
        }))
        .await
        .unwrap();
    }
    assert!(
        sdk.head_object()
            .bucket("alice-data")
            .key("c")
            .send()
            .await
            .is_err()
    );
}

/// Past the concurrency limit and the queue, requests get SlowDown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_exceeded_is_slow_down() {
    let (target, agent, shim) = alice_stack(|spec| {
        spec.transfer = "chunk_size: 1MiB\nmax_chunks_in_flight: 1\n".into();
        spec.alice_quotas =
            "max_concurrent_requests: 1\nmax_queued_requests: 1\nmax_bytes_per_second: 8MiB".into();
    })
    .await;
    let len = 16usize << 20;
    put_as(&target.s3(ALICE), "alice-data", "k", data(len, 5)).await;
    let mem = Memory::new(3 * len).await;
    let mut running = Vec::new();
    for i in 0..2 {
        let (w, tok) = mem.window(i * len, len, Access::REMOTE_WRITE);
        let shim = shim.clone();
        running.push((
            w,
            tokio::spawn(async move { shim.get("alice", "alice-data", "k", None, &tok).await }),
        ));
        // Let the first one start (and the second one queue): wait until
        // the agent counts it, however slow the machine (the VM's
        // emulated CPUs took longer than a fixed pause).
        let want = if i == 0 {
            r#"s3dma_agent_requests_in_flight{tenant="alice"} 1"#
        } else {
            r#"s3dma_agent_requests_queued{tenant="alice"} 1"#
        };
        let mut tries = 0;
        while !agent.metrics_text().await.contains(want) {
            tries += 1;
            assert!(tries < 600, "the agent never showed {want}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    let (_w, tok) = mem.window(2 * len, len, Access::REMOTE_WRITE);
    let e = shim
        .get("alice", "alice-data", "k", None, &tok)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert_eq!(s3_code(&e), "SlowDown");
    // The running and the queued one both finish correctly.
    for (i, (w, h)) in running.into_iter().enumerate() {
        let r = h.await.unwrap().unwrap();
        drop(w);
        assert_eq!(r.bytes_placed, len as u64);
        assert_eq!(mem.read(i * len, len), data(len, 5));
    }
    let m = agent.metrics_text().await;
    assert!(
        m.contains(
            r#"s3dma_agent_requests_total{op="GetObject",outcome="slow_down",tenant="alice"} 1"#
        ),
        "{m}"
    );
    // Bob is not limited by alice's quota.
    let e = shim
        .get("bob", "bob-data", "k", None, &tok)
        .await
        .unwrap_err();
    assert_ne!(e.code(), tonic::Code::ResourceExhausted);
}

/// The target dies in the middle of a chunked GET: the tenant gets an
/// error (after retries), never success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_killed_mid_get_is_an_error() {
    let mut target = Target::start(true);
    target.create_bucket("alice-data").await;
    let mut spec = AgentSpec::one(&target);
    spec.transfer =
        "chunk_size: 1MiB\nmax_chunks_in_flight: 2\nretries: 2\nattempt_timeout_secs: 5\n".into();
    spec.alice_quotas = "max_bytes_per_second: 4MiB".into();
    let agent = Agent::start(spec);
    let shim = agent.client().await;
    let len = 32usize << 20;
    put_as(&target.s3(ALICE), "alice-data", "k", data(len, 6)).await;
    let mem = Memory::new(len).await;
    let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
    let started = std::time::Instant::now();
    let get = tokio::spawn({
        let shim = shim.clone();
        async move { shim.get("alice", "alice-data", "k", None, &tok).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    target.kill9();
    let e = get
        .await
        .unwrap()
        .expect_err("the target died: the GET cannot succeed");
    drop(w);
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    // The agent is still healthy: with the target back, the next GET works.
    target.restart();
    let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
    let ok = shim
        .get("alice", "alice-data", "k", None, &tok)
        .await
        .unwrap();
    drop(w);
    assert_eq!(ok.bytes_placed, len as u64);
    assert_eq!(mem.sha256(0, len), sha256(&data(len, 6)));
}

/// The shim cancels a GET mid-transfer and revokes its window: the agent
/// abandons the request (in-flight gauge back to 0), nothing lands in the
/// revoked window afterwards, and the next request works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_get_is_abandoned_safely() {
    let (target, agent, shim) = alice_stack(|spec| {
        spec.transfer = "chunk_size: 1MiB\nmax_chunks_in_flight: 2\n".into();
        spec.alice_quotas = "max_bytes_per_second: 4MiB".into();
    })
    .await;
    let len = 32usize << 20;
    put_as(&target.s3(ALICE), "alice-data", "k", data(len, 8)).await;
    let mem = Memory::new(len).await;
    let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
    let r = tokio::time::timeout(
        std::time::Duration::from_millis(500),
        shim.get("alice", "alice-data", "k", None, &tok),
    )
    .await;
    assert!(r.is_err(), "the GET should still be running when cancelled");
    // What a shim does when its request ends: revoke the window.
    w.revoke();
    drop(w);
    mem.clear(0);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(
        mem.read(0, len).iter().all(|b| *b == 0),
        "bytes landed after revocation"
    );
    let m = agent.metrics_text().await;
    assert!(
        m.contains(r#"s3dma_agent_requests_in_flight{tenant="alice"} 0"#),
        "{m}"
    );
    // The agent and the target still serve.
    let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
    let ok = shim
        .get(
            "alice",
            "alice-data",
            "k",
            Some(pb::byte_range::Kind::Suffix(1 << 20)),
            &tok,
        )
        .await
        .unwrap();
    drop(w);
    assert_eq!(ok.bytes_placed, 1 << 20);
    assert_eq!(mem.read(0, 1 << 20), data(len, 8)[len - (1 << 20)..]);
}

/// The target restarts during a chunked GET: the failed chunks are retried
/// (with backoff) against the restarted target and the GET succeeds with
/// exactly the object's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_are_retried_across_a_target_restart() {
    let mut target = Target::start(true);
    target.create_bucket("alice-data").await;
    let mut spec = AgentSpec::one(&target);
    // Retries for about 40 s (backoff capped at 1 s): a liveness budget
    // for the restart, which under the Soft-RoCE VM's emulated CPUs (staging
    // memory registered on rxe) took longer than the 12 retries before.
    spec.transfer = "chunk_size: 1MiB\nmax_chunks_in_flight: 2\nretries: 40\nbackoff_initial_ms: 200\nbackoff_max_ms: 1000\nattempt_timeout_secs: 5\n".into();
    spec.alice_quotas = "max_bytes_per_second: 8MiB".into();
    let agent = Agent::start(spec);
    let shim = agent.client().await;
    let len = 48usize << 20;
    let body = data(len, 12);
    put_as(&target.s3(ALICE), "alice-data", "k", body.clone()).await;
    let mem = Memory::new(len).await;
    let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
    let get = tokio::spawn({
        let shim = shim.clone();
        async move { shim.get("alice", "alice-data", "k", None, &tok).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    // Down long enough for chunks to fail (connection refused) and back off.
    tokio::task::block_in_place(|| target.restart_after(std::time::Duration::from_millis(700)));
    let r = get.await.unwrap().expect("retried chunks should succeed");
    drop(w);
    assert_eq!(r.bytes_placed, len as u64);
    assert_eq!(mem.sha256(0, len), sha256(&body));
    let m = agent.metrics_text().await;
    assert!(
        m.contains("s3dma_agent_retries_total{"),
        "no retry was counted:\n{m}"
    );
}
