//! The fallback path: targets that decline RDMA (storage-target with RDMA
//! disabled answers `x-amz-rdma-reply: 501`) or never heard of it (moto, a
//! third-party S3 server, and Ceph's radosgw, an existing S3 cluster,
//! both configured `rdma: false`). The agent moves the
//! bytes between HTTP bodies and the tenant's window through its own
//! registered staging memory; the tenant sees the same API.

use super::common::*;
use fabric::Access;
use pb::byte_range::Kind;
use s3dma_proto::agent::v1 as pb;

/// PUT (single and multipart) and GET of `sizes` through the agent, checked
/// against what `sdk` reads straight from the target.
async fn round_trips(shim: &Shim, sdk: &aws_sdk_s3::Client, bucket: &str, sizes: &[usize]) {
    let max = *sizes.iter().max().unwrap();
    let mem = Memory::new(max).await;
    for (i, &len) in sizes.iter().enumerate() {
        let key = format!("fb/{len}");
        let body = data(len, 100 + i as u64);
        mem.fill(0, &body);
        let (w, tok) = mem.window(0, len, Access::REMOTE_READ);
        let put = shim.put("alice", bucket, &key, &tok).await.unwrap();
        drop(w);
        assert_eq!(put.path, pb::TransferPath::Fallback as i32, "PUT {len}");
        assert_eq!(put.size, len as u64);
        let stored = sdk_get(sdk, bucket, &key).await;
        assert_eq!(stored.len(), len);
        assert_eq!(sha256(&stored), sha256(&body), "PUT {len}");

        mem.clear(0x5A);
        let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
        let got = shim.get("alice", bucket, &key, None, &tok).await.unwrap();
        drop(w);
        assert_eq!(got.bytes_placed, len as u64, "GET {len}");
        if len > 0 {
            assert_eq!(got.path, pb::TransferPath::Fallback as i32, "GET {len}");
        }
        assert_eq!(mem.sha256(0, len), sha256(&body), "GET {len}");
    }
    // A range, over HTTP too.
    let len = sizes[sizes.len() - 1];
    let body = data(len, 100 + sizes.len() as u64 - 1);
    mem.clear(0);
    let (w, tok) = mem.window(0, 1000, Access::REMOTE_WRITE);
    let got = shim
        .get(
            "alice",
            bucket,
            &format!("fb/{len}"),
            Some(Kind::Suffix(1000)),
            &tok,
        )
        .await
        .unwrap();
    drop(w);
    assert_eq!(got.range_start as usize, len - 1000);
    assert_eq!(mem.read(0, 1000), body[len - 1000..]);
}

const SPEC_TRANSFER: &str = "chunk_size: 4MiB\nmultipart_threshold: 8MiB\npart_size: 5MiB\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_target_with_rdma_disabled() {
    let target = Target::start(false);
    target.create_bucket("alice-data").await;
    let mut spec = AgentSpec::one(&target);
    spec.transfer = SPEC_TRANSFER.into();
    let agent = Agent::start(spec);
    let shim = agent.client().await;
    // 0 B, 1 B, a few chunks, and a 3-part multipart upload.
    round_trips(
        &shim,
        &target.s3(ALICE),
        "alice-data",
        &[0, 1, (9 << 20) + 7, 13 << 20],
    )
    .await;
    let m = agent.metrics_text().await;
    assert!(
        m.contains(r#"s3dma_agent_bytes_total{op="GetObject",path="fallback",tenant="alice"}"#),
        "{m}"
    );
    assert!(m.contains("s3dma_agent_staging_buffers 16"), "{m}");
    // Nothing went over RDMA, and the target declined each token with 501.
    assert!(!m.contains(r#"path="rdma""#), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_party_s3_server_moto() {
    let moto = Moto::start();
    let sdk = s3_client(&moto.endpoint, ALICE.0, ALICE.1);
    foreign_server("moto", &moto.endpoint, &sdk, "alice-data").await;
}

/// An existing S3 cluster: Ceph's radosgw (Debian's packages), the user
/// made with `radosgw-admin`. Not run in the Soft-RoCE VM (HTTP only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_cluster_ceph_radosgw() {
    let ceph = Ceph::shared();
    let sdk = ceph.user("alice", ALICE);
    foreign_server("ceph", &ceph.endpoint, &sdk, "alice-fallback").await;
}

/// The agent in front of an S3 server that never heard of RDMA
/// (`rdma: false`): round trips, listing, errors, no upload left behind.
async fn foreign_server(
    name: &'static str,
    endpoint: &str,
    sdk: &aws_sdk_s3::Client,
    bucket: &'static str,
) {
    create_bucket(sdk, bucket).await;
    let mut spec = AgentSpec::new(vec![TargetSpec {
        name,
        endpoint: endpoint.to_string(),
        buckets: vec![bucket],
        rdma: false,
    }]);
    spec.transfer = SPEC_TRANSFER.into();
    spec.extra_buckets = vec![("alice", bucket)];
    let agent = Agent::start(spec);
    let shim = agent.client().await;
    round_trips(&shim, sdk, bucket, &[0, 1, (9 << 20) + 7, 13 << 20]).await;

    // Listing and errors come through from a foreign server too.
    let r = shim
        .inner
        .clone()
        .list_objects(shim.req(pb::ListObjectsRequest {
            tenant: "alice".into(),
            bucket: bucket.into(),
            prefix: "fb/".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.objects.len(), 4);
    let mem = Memory::new(4096).await;
    let (_w, tok) = mem.window(0, 4096, Access::REMOTE_WRITE);
    let e = shim
        .get("alice", bucket, "missing", None, &tok)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert_eq!(s3_code(&e), "NoSuchKey");
    // The multipart upload was completed, none left behind.
    let ups = sdk
        .list_multipart_uploads()
        .bucket(bucket)
        .send()
        .await
        .unwrap();
    assert!(ups.uploads().is_empty(), "{ups:?}");
}

/// A server that ignores the token (moto, misconfigured `rdma: true`): a
/// tokened GET answered without `x-amz-rdma-reply` is a failure, never a
/// success that leaves the window as it was; a tokened PUT that it may
/// have stored as an empty object is rewritten over HTTP, so the object
/// is always the tenant's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_party_server_ignoring_the_token_is_never_a_success() {
    let moto = Moto::start();
    let sdk = s3_client(&moto.endpoint, ALICE.0, ALICE.1);
    let bucket = "alice-ignorer";
    create_bucket(&sdk, bucket).await;
    let mut spec = AgentSpec::new(vec![TargetSpec {
        name: "ignorer",
        endpoint: moto.endpoint.clone(),
        buckets: vec![bucket],
        rdma: true,
    }]);
    spec.transfer = SPEC_TRANSFER.into();
    spec.extra_buckets = vec![("alice", bucket)];
    let agent = Agent::start(spec);
    let shim = agent.client().await;
    let len = 70_000;
    let body = data(len, 32);
    let mem = Memory::new(len).await;
    mem.fill(0, &body);
    let (w, tok) = mem.window(0, len, Access::REMOTE_READ);
    let put = shim.put("alice", bucket, "k", &tok).await.unwrap();
    drop(w);
    assert_eq!(put.path, pb::TransferPath::Fallback as i32);
    assert_eq!(sha256(&sdk_get(&sdk, bucket, "k").await), sha256(&body));

    mem.clear(0x5A);
    let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
    let e = shim
        .get("alice", bucket, "k", None, &tok)
        .await
        .unwrap_err();
    drop(w);
    assert!(e.message().contains("without x-amz-rdma-reply"), "{e:?}");
    assert!(mem.read(0, len).iter().all(|&b| b == 0x5A));
}
