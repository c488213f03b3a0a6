//! The storage-target as an RDMA gateway (`store: s3`) in front of an
//! existing S3 cluster: Ceph's radosgw from Debian's packages (one cluster
//! for this test binary, users made with `radosgw-admin`). The agent sends
//! its RDMA requests to the gateway; the gateway re-signs them upstream as
//! the same user and serves reads from its registered-memory cache.
//! Not run in the Soft-RoCE VM (the cluster is HTTP only; the gateway's
//! RDMA side is the target's, covered there).

use std::sync::Arc;
use std::time::Duration;

use super::common::*;
use fabric::Access;
use pb::byte_range::Kind;
use s3dma_launcher::harness::{CacheConfig, TargetOpts};
use s3dma_proto::agent::v1 as pb;

const SPEC_TRANSFER: &str = "chunk_size: 4MiB\nmultipart_threshold: 8MiB\npart_size: 5MiB\n";

/// The cluster with alice, bob and admin as S3 users (the same keys the
/// gateway's configuration has).
fn ceph() -> &'static Ceph {
    let c = Ceph::shared();
    c.user("alice", ALICE);
    c.user("bob", BOB);
    c.user("admin", ADMIN);
    c
}

fn cache(size_mib: u64, revalidate_after: f64) -> CacheConfig {
    CacheConfig {
        size: s3dma_config::ByteSize(size_mib << 20),
        chunk_size: s3dma_config::ByteSize(1 << 20),
        revalidate_after,
        ..CacheConfig::default()
    }
}

/// A gateway in front of `upstream`, and an agent routing `buckets` to it
/// over RDMA.
fn stack(upstream: &str, cache: CacheConfig, buckets: Vec<&'static str>) -> (Target, Agent) {
    let gw = Target::start_opts(TargetOpts::gateway(upstream, cache));
    let mut spec = AgentSpec::new(vec![TargetSpec {
        name: "gateway",
        endpoint: gw.endpoint.clone(),
        buckets,
        rdma: true,
    }]);
    spec.transfer = SPEC_TRANSFER.into();
    spec.extra_buckets = buckets_of(&spec)
        .into_iter()
        .flat_map(|b| [("alice", b), ("bob", b)])
        .collect();
    let agent = Agent::start(spec);
    (gw, agent)
}

fn buckets_of(spec: &AgentSpec) -> Vec<&'static str> {
    spec.targets
        .iter()
        .flat_map(|t| t.buckets.clone())
        .collect()
}

async fn metric(t: &Target, name: &str) -> f64 {
    metric_value(&t.metrics_text().await, name)
}

async fn upstream_in(t: &Target) -> f64 {
    metric_value(
        &t.metrics_text().await,
        r#"s3dma_storage_target_upstream_bytes_total{direction="in"}"#,
    )
}

/// A SigV4-signed (as alice) hipobj-rc-v2 PREPARE to `endpoint`: its status
/// and `x-amz-rdma-protocol-status`.
async fn signed_hipobj_prepare(endpoint: &str) -> (u16, Option<String>) {
    let url = format!("{endpoint}/.hipobj-rc/prepare");
    let headers = sign_v4_as(
        ALICE,
        "POST",
        &url,
        &[("x-amz-rdma-protocol", "hipobj-rc-v2")],
        aws_sigv4::http_request::SignableBody::UnsignedPayload,
        std::time::SystemTime::now(),
    );
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(k, _)| k != "host")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let r = s3dma_testkit::raw("POST", &url, &headers, bytes::Bytes::new()).await;
    (
        r.status,
        r.header("x-amz-rdma-protocol-status").map(str::to_owned),
    )
}

/// `n` gateways (`gw-0`, …) in front of the cluster without prefetch (it
/// would fetch the chunks the other gateways own), with `cache_mib` of
/// cache each, as one target group for `bucket`; an agent (alice may use
/// `bucket`) with `transfer` routing to them.
fn gateway_group(
    ceph: &Ceph,
    bucket: &'static str,
    n: usize,
    cache_mib: u64,
    transfer: &str,
) -> (Vec<Target>, Agent) {
    const NAMES: [&str; 4] = ["gw-0", "gw-1", "gw-2", "gw-3"];
    let cache = CacheConfig {
        prefetch_chunks: 0,
        ..cache(cache_mib, 0.0)
    };
    let gws: Vec<Target> = (0..n)
        .map(|_| Target::start_opts(TargetOpts::gateway(&ceph.endpoint, cache.clone())))
        .collect();
    let mut spec = AgentSpec::new(
        gws.iter()
            .zip(NAMES)
            .map(|(g, name)| TargetSpec {
                name,
                endpoint: g.endpoint.clone(),
                buckets: vec![bucket],
                rdma: true,
            })
            .collect(),
    );
    spec.transfer = transfer.into();
    spec.extra_buckets = vec![("alice", bucket)];
    (gws, Agent::start(spec))
}

/// PUT (single and multipart) and GET through the agent and the gateway:
/// the bytes land in Ceph (read back straight from radosgw), come back
/// over RDMA, and the second read of each object is served from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_and_gets_through_the_gateway() {
    let ceph = ceph();
    let (gw, agent) = stack(&ceph.endpoint, cache(64, 0.0), vec!["gw-round-trips"]);
    // Buckets are made through the gateway too (forwarded as alice).
    create_bucket(&gw.s3(ALICE), "gw-round-trips").await;
    let direct = s3_client(&ceph.endpoint, ALICE.0, ALICE.1);
    // hipobj-rc-v2 clients get the dialect's fallback signal from a
    // gateway (501 + x-amz-rdma-protocol-status), not a bucket-name error.
    let (status, marker) = signed_hipobj_prepare(&gw.endpoint).await;
    assert_eq!((status, marker.as_deref()), (501, Some("unsupported")));
    let shim = agent.client().await;
    let sizes = [0usize, 1, (3 << 20) + 7, 13 << 20];
    let mem = Memory::new(13 << 20).await;
    for (i, &len) in sizes.iter().enumerate() {
        let key = format!("obj/{len}");
        let body = data(len, 300 + i as u64);
        mem.fill(0, &body);
        let (w, tok) = mem.window(0, len, Access::REMOTE_READ);
        let put = shim
            .put("alice", "gw-round-trips", &key, &tok)
            .await
            .unwrap();
        drop(w);
        assert_eq!(put.size, len as u64);
        assert_eq!(put.path, pb::TransferPath::Rdma as i32, "PUT {len}");
        assert_eq!(
            sha256(&sdk_get(&direct, "gw-round-trips", &key).await),
            sha256(&body)
        );
        for round in 0..2 {
            mem.clear(0x5A);
            let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
            let got = shim
                .get("alice", "gw-round-trips", &key, None, &tok)
                .await
                .unwrap();
            drop(w);
            assert_eq!(got.bytes_placed, len as u64, "GET {len} round {round}");
            assert_eq!(mem.sha256(0, len), sha256(&body), "GET {len} round {round}");
        }
    }
    // The 13 MiB object was uploaded in parts, and no upload is left.
    let ups = direct
        .list_multipart_uploads()
        .bucket("gw-round-trips")
        .send()
        .await
        .unwrap();
    assert!(ups.uploads().is_empty(), "{ups:?}");
    let m = gw.metrics_text().await;
    let hits = metric_value(
        &m,
        r#"s3dma_storage_target_cache_lookups_total{source="cache"}"#,
    );
    let fetched = metric_value(
        &m,
        r#"s3dma_storage_target_cache_lookups_total{source="upstream"}"#,
    );
    // 1 + 4 + 13 chunks of 1 MiB were fetched once (the prefetcher may
    // have fetched some before the first read asked) and hit the second time.
    assert!(hits >= 18.0, "{m}");
    assert!(fetched <= 18.0, "{m}");
    let total: usize = sizes.iter().sum();
    assert_eq!(
        upstream_in(&gw).await,
        total as f64,
        "each byte was read from Ceph once"
    );
    // Ranges come from the cache too.
    let len = 13 << 20;
    let body = data(len, 303);
    let (w, tok) = mem.window(0, 3 << 20, Access::REMOTE_WRITE);
    let got = shim
        .get(
            "alice",
            "gw-round-trips",
            &format!("obj/{len}"),
            Some(Kind::Bounded(pb::byte_range::Bounded {
                first: (5 << 20) + 11,
                last: (8 << 20) + 10,
            })),
            &tok,
        )
        .await
        .unwrap();
    drop(w);
    assert_eq!(got.bytes_placed, 3 << 20);
    assert_eq!(mem.read(0, 3 << 20), body[(5 << 20) + 11..(8 << 20) + 11]);
    assert_eq!(upstream_in(&gw).await, total as f64);
    // Listing is forwarded.
    let listed = gw
        .s3(ALICE)
        .list_objects_v2()
        .bucket("gw-round-trips")
        .send()
        .await
        .unwrap();
    assert_eq!(listed.contents().len(), sizes.len());
}

/// After an upstream overwrite, the next read returns the new object
/// (`revalidate_after: 0`): the cached chunks of the old version are never
/// served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_overwrite_is_seen_by_the_next_read() {
    let ceph = ceph();
    let (gw, agent) = stack(&ceph.endpoint, cache(16, 0.0), vec!["gw-overwrite"]);
    let direct = s3_client(&ceph.endpoint, ALICE.0, ALICE.1);
    create_bucket(&direct, "gw-overwrite").await;
    let shim = agent.client().await;
    let len = (2 << 20) + 5;
    let mem = Memory::new(len).await;
    for (round, seed) in [(0, 1u64), (1, 2)] {
        let body = data(len, seed);
        put_as(&direct, "gw-overwrite", "k", body.clone()).await;
        for _ in 0..2 {
            let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
            shim.get("alice", "gw-overwrite", "k", None, &tok)
                .await
                .unwrap();
            drop(w);
            assert_eq!(mem.sha256(0, len), sha256(&body), "version {round}");
        }
    }
    assert_eq!(
        metric(
            &gw,
            r#"s3dma_storage_target_revalidations_total{how="upstream"}"#
        )
        .await,
        4.0
    );
}

/// A user the cluster denies is denied through a warm cache, although the
/// gateway's own grants let it through; nothing lands in its memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_denied_upstream_is_denied_through_a_warm_cache() {
    let ceph = ceph();
    let (gw, agent) = stack(&ceph.endpoint, cache(16, 0.0), vec!["gw-private"]);
    let direct = s3_client(&ceph.endpoint, ALICE.0, ALICE.1);
    create_bucket(&direct, "gw-private").await;
    let body = data(1 << 20, 9);
    put_as(&direct, "gw-private", "secret", body.clone()).await;
    let shim = agent.client().await;
    let mem = Memory::new(1 << 20).await;
    let (w, tok) = mem.window(0, 1 << 20, Access::REMOTE_WRITE);
    shim.get("alice", "gw-private", "secret", None, &tok)
        .await
        .unwrap();
    drop(w);
    assert_eq!(mem.sha256(0, 1 << 20), sha256(&body));
    // The chunk is cached now; bob may not read alice's bucket in Ceph.
    mem.clear(0xEE);
    let (w, tok) = mem.window(0, 1 << 20, Access::REMOTE_WRITE);
    let e = shim
        .get("bob", "gw-private", "secret", None, &tok)
        .await
        .unwrap_err();
    drop(w);
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert_eq!(mem.read(0, 1 << 20), vec![0xEE; 1 << 20]);
    let m = gw.metrics_text().await;
    assert_eq!(
        metric_value(
            &m,
            r#"s3dma_storage_target_cache_lookups_total{source="cache"}"#
        ),
        0.0,
        "{m}"
    );
}

/// Eight tenants read the same object at once: the cluster serves about
/// one copy (single flight and the cache), every tenant gets every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_reads_the_upstream_about_once() {
    let ceph = ceph();
    let len = (large_object_len() / 4).max(16 << 20);
    let mib = (len as u64 >> 20) + 8;
    let (gw, agent) = stack(&ceph.endpoint, cache(mib, 0.0), vec!["gw-fanout"]);
    let direct = s3_client(&ceph.endpoint, ALICE.0, ALICE.1);
    create_bucket(&direct, "gw-fanout").await;
    let body = data(len, 77);
    let want = sha256(&body);
    put_as(&direct, "gw-fanout", "ckpt", body).await;
    let shim = Arc::new(agent.client().await);
    let mut readers = Vec::new();
    for r in 0..8 {
        let shim = Arc::clone(&shim);
        let want = want.clone();
        readers.push(tokio::spawn(async move {
            let mem = Memory::new(len).await;
            let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
            let got = shim.get("alice", "gw-fanout", "ckpt", None, &tok).await;
            drop(w);
            let got = got.unwrap_or_else(|e| panic!("reader {r}: {e:?}"));
            assert_eq!(got.bytes_placed, len as u64);
            assert_eq!(mem.sha256(0, len), want, "reader {r}");
        }));
    }
    for r in readers {
        tokio::time::timeout(Duration::from_secs(600), r)
            .await
            .expect("fan-out hung")
            .unwrap();
    }
    let ratio = upstream_in(&gw).await / len as f64;
    println!("fan-out of 8 readers: upstream read {ratio:.3} copies of the object");
    assert!(ratio <= 1.2, "upstream read {ratio} copies");
    assert!(ratio >= 1.0);
}

async fn enable_versioning(direct: &aws_sdk_s3::Client, bucket: &str) {
    direct
        .put_bucket_versioning()
        .bucket(bucket)
        .versioning_configuration(
            aws_sdk_s3::types::VersioningConfiguration::builder()
                .status(aws_sdk_s3::types::BucketVersioningStatus::Enabled)
                .build(),
        )
        .send()
        .await
        .unwrap();
}

/// A TCP relay the test can cut: the upstream "goes down".
struct Relay {
    addr: String,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(to: &str) -> Relay {
        let to = to.trim_start_matches("http://").to_owned();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", l.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((mut a, _)) = l.accept().await else {
                    return;
                };
                let to = to.clone();
                conns.spawn(async move {
                    if let Ok(mut b) = tokio::net::TcpStream::connect(&to).await {
                        let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                    }
                });
            }
        });
        Relay { addr, task }
    }

    /// Stops accepting and drops every relayed connection.
    fn cut(&self) {
        self.task.abort();
    }
}

/// With the upstream down, reads fail with a clear error and no hang;
/// within `revalidate_after` of a confirmation, cached chunks are still
/// served, and after it they are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down() {
    let ceph = ceph();
    let direct = s3_client(&ceph.endpoint, ALICE.0, ALICE.1);
    create_bucket(&direct, "gw-down").await;
    let body = data((1 << 20) + 3, 5);
    put_as(&direct, "gw-down", "k", body.clone()).await;
    let len = body.len();
    for revalidate_after in [0.0, 600.0] {
        let relay = Relay::start(&ceph.endpoint).await;
        let (gw, agent) = stack(&relay.addr, cache(16, revalidate_after), vec!["gw-down"]);
        let shim = agent.client().await;
        let mem = Memory::new(len).await;
        let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
        shim.get("alice", "gw-down", "k", None, &tok).await.unwrap();
        drop(w);
        relay.cut();
        mem.clear(0);
        let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
        let r = tokio::time::timeout(
            Duration::from_secs(120),
            shim.get("alice", "gw-down", "k", None, &tok),
        )
        .await
        .expect("a read with the upstream down hung");
        drop(w);
        if revalidate_after == 0.0 {
            let e = r.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
            assert!(e.message().contains("upstream"), "{e:?}");
        } else {
            r.unwrap();
            assert_eq!(mem.sha256(0, len), sha256(&body));
        }
        let m = gw.metrics_text().await;
        assert!(
            revalidate_after == 0.0
                || metric_value(
                    &m,
                    r#"s3dma_storage_target_revalidations_total{how="recent"}"#
                ) == 1.0,
            "{m}"
        );
        drop(agent);
        drop(gw);
    }
}

/// Three gateways serve one bucket as a group: the agent spreads an
/// object's chunks over them by rendezvous hashing, so each caches its own
/// share and together they read the object from the cluster once; when one
/// is SIGKILLed, reads go on through the others (its chunks move to the
/// next gateway of their ranking).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_share_an_object_and_survive_one_killed() {
    let ceph = ceph();
    let direct = s3_client(&ceph.endpoint, ALICE.0, ALICE.1);
    create_bucket(&direct, "gw-group").await;
    // Agent chunks the size of the gateways' cache chunks.
    let (mut gws, agent) = gateway_group(
        ceph,
        "gw-group",
        3,
        64,
        "chunk_size: 1MiB\nmultipart_threshold: 8MiB\npart_size: 5MiB\n",
    );
    let shim = agent.client().await;
    let len = 24 << 20;
    let body = data(len, 42);
    let mem = Memory::new(len).await;
    mem.fill(0, &body);
    let (w, tok) = mem.window(0, len, Access::REMOTE_READ);
    shim.put("alice", "gw-group", "striped", &tok)
        .await
        .unwrap();
    drop(w);
    assert_eq!(
        sha256(&sdk_get(&direct, "gw-group", "striped").await),
        sha256(&body)
    );

    let read = |round: &'static str| {
        let (shim, mem, want) = (&shim, &mem, sha256(&body));
        async move {
            mem.clear(0);
            let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
            let got = shim
                .get("alice", "gw-group", "striped", None, &tok)
                .await
                .unwrap_or_else(|e| panic!("{round}: {e:?}"));
            drop(w);
            assert_eq!(got.bytes_placed, len as u64, "{round}");
            assert_eq!(mem.sha256(0, len), want, "{round}");
        }
    };
    read("first read").await;
    let mut shares = Vec::new();
    for g in &gws {
        shares.push(upstream_in(g).await);
    }
    println!("upstream bytes per gateway after the first read: {shares:?}");
    assert!(
        shares.iter().all(|s| *s > 0.0),
        "every gateway serves a share: {shares:?}"
    );
    assert_eq!(
        shares.iter().sum::<f64>(),
        len as f64,
        "the cluster served one copy"
    );
    read("second read").await;
    let mut again = Vec::new();
    for g in &gws {
        again.push(upstream_in(g).await);
    }
    assert_eq!(again, shares, "the second read came from the caches");

    gws[1].kill9();
    read("with gw-1 killed").await;
    read("with gw-1 cooling down").await;
    let m = agent.metrics_text().await;
    assert_eq!(
        metric_value(&m, r#"s3dma_agent_target_up{target="gw-1"}"#),
        0.0,
        "{m}"
    );
    assert!(
        metric_value(&m, r#"s3dma_agent_target_skips_total{target="gw-1"}"#) > 0.0,
        "{m}"
    );
    // The survivors fetched gw-1's share from the cluster: one more share.
    let mut after = 0.0;
    for g in [&gws[0], &gws[2]] {
        after += upstream_in(g).await;
    }
    assert!(after > shares[0] + shares[2], "gw-1's chunks moved");
    assert!(after <= len as f64 + shares[0] + shares[2]);
}

/// A gateway SIGKILLed while it serves its share of a cold read: the agent
/// moves that gateway's chunks to the next in their ranking, so the read
/// finishes with the right bytes (and no hang); the survivors' caches then
/// hold the whole object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_mid_read_costs_no_bytes() {
    let ceph = ceph();
    let direct = s3_client(&ceph.endpoint, ALICE.0, ALICE.1);
    create_bucket(&direct, "gw-kill").await;
    let (mut gws, agent) = gateway_group(ceph, "gw-kill", 3, 96, "chunk_size: 1MiB\n");
    let shim = agent.client().await;
    // Written straight to the cluster: every gateway's cache is cold.
    let len = 64 << 20;
    let body = data(len, 77);
    put_as(&direct, "gw-kill", "big", body.clone()).await;

    let mem = Memory::new(len).await;
    mem.clear(0);
    let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
    let read = shim.get("alice", "gw-kill", "big", None, &tok);
    let kill = async {
        // Once gw-1 has fetched part of its share, it dies.
        let started = std::time::Instant::now();
        while upstream_in(&gws[1]).await < f64::from(2 << 20) {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "gw-1 never served"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        gws[1].kill9();
    };
    let (got, ()) = tokio::time::timeout(std::time::Duration::from_secs(120), async {
        tokio::join!(read, kill)
    })
    .await
    .expect("the read hung after a gateway was killed");
    let got = got.expect("the read failed although two gateways were left");
    drop(w);
    assert_eq!(got.bytes_placed, len as u64);
    assert_eq!(
        mem.sha256(0, len),
        sha256(&body),
        "the bytes are the object's"
    );
    let m = agent.metrics_text().await;
    assert_eq!(
        metric_value(&m, r#"s3dma_agent_target_up{target="gw-1"}"#),
        0.0,
        "{m}"
    );
    // The second read fetches only what gw-1 had served before it died
    // (its chunks' next gateways never saw them); the third hits only.
    let mut fetched = Vec::new();
    for _ in 0..2 {
        let before = upstream_in(&gws[0]).await + upstream_in(&gws[2]).await;
        mem.clear(0);
        let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
        shim.get("alice", "gw-kill", "big", None, &tok)
            .await
            .unwrap();
        drop(w);
        assert_eq!(mem.sha256(0, len), sha256(&body));
        fetched.push((upstream_in(&gws[0]).await + upstream_in(&gws[2]).await) - before);
    }
    println!("upstream bytes of the reads after the kill: {fetched:?}");
    assert!(
        fetched[0] < len as f64 / 2.0,
        "the survivors fetched {} bytes again",
        fetched[0]
    );
    assert_eq!(fetched[1], 0.0, "the third read came from the caches");
}

/// `cache.write_allocate_max`: an RDMA PutObject up to the limit is kept in
/// the cache under the version Ceph acknowledged, so the first read of a
/// checkpoint just written hits (after the usual upstream confirmation,
/// which still refuses a user the cluster denies); a larger one is not.
/// The bucket is versioned: the version id pins the kept chunks for good
/// (in an unversioned bucket they serve only until `settle_after` after
/// the write's second, see the MD5-collision tests below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_allocated_object_is_read_from_the_cache() {
    let ceph = ceph();
    let cache = CacheConfig {
        prefetch_chunks: 0,
        write_allocate_max: s3dma_config::ByteSize(6 << 20),
        ..cache(64, 0.0)
    };
    let (gw, agent) = stack(&ceph.endpoint, cache, vec!["gw-write-alloc"]);
    let direct = s3_client(&ceph.endpoint, ALICE.0, ALICE.1);
    create_bucket(&direct, "gw-write-alloc").await;
    enable_versioning(&direct, "gw-write-alloc").await;
    let shim = agent.client().await;
    let mem = Memory::new(7 << 20).await;
    for (len, kept) in [((5 << 20) + 3, true), (7 << 20, false)] {
        let key = format!("ckpt-{len}");
        let body = data(len, len as u64);
        mem.fill(0, &body);
        let (w, tok) = mem.window(0, len, Access::REMOTE_READ);
        shim.put("alice", "gw-write-alloc", &key, &tok)
            .await
            .unwrap();
        drop(w);
        assert_eq!(
            sha256(&sdk_get(&direct, "gw-write-alloc", &key).await),
            sha256(&body),
            "Ceph has the object"
        );
        let before = upstream_in(&gw).await;
        mem.clear(0);
        let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
        let got = shim
            .get("alice", "gw-write-alloc", &key, None, &tok)
            .await
            .unwrap();
        drop(w);
        assert_eq!(got.bytes_placed, len as u64);
        assert_eq!(mem.sha256(0, len), sha256(&body), "{key}");
        let fetched = upstream_in(&gw).await - before;
        if kept {
            assert_eq!(fetched, 0.0, "{key}: the first read hit the cache");
        } else {
            assert_eq!(fetched, len as f64, "{key}: too large to be kept");
        }
    }
    let m = gw.metrics_text().await;
    let outcome = |o: &str| {
        metric_value(
            &m,
            &format!(r#"s3dma_storage_target_cache_write_allocated_total{{outcome="{o}"}}"#),
        )
    };
    assert_eq!((outcome("kept"), outcome("too_large")), (1.0, 1.0), "{m}");
    // bob may not read alice's bucket in Ceph: the warm chunks change nothing.
    let (w, tok) = mem.window(0, 7 << 20, Access::REMOTE_WRITE);
    let denied = shim
        .get(
            "bob",
            "gw-write-alloc",
            &format!("ckpt-{}", (5 << 20) + 3),
            None,
            &tok,
        )
        .await;
    drop(w);
    let e = denied.expect_err("bob read through a write-allocated cache");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
}

/// Ceph's copy is overwritten while a cold read of it runs through the
/// gateway: the read gives either one whole version or a clear error, never
/// a mix (every chunk is fetched with `If-Match` on the version the read
/// started with); the next read returns the new object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overwrite_during_a_read_never_mixes_versions() {
    let ceph = ceph();
    let cache = CacheConfig {
        prefetch_chunks: 0,
        ..cache(128, 0.0)
    };
    let (gw, agent) = stack(&ceph.endpoint, cache, vec!["gw-torn"]);
    let direct = s3_client(&ceph.endpoint, ALICE.0, ALICE.1);
    create_bucket(&direct, "gw-torn").await;
    let shim = agent.client().await;
    let len = 48 << 20;
    // A small new version: its PUT lands while the read is still going.
    let (old, new) = (data(len, 1), data(1 << 20, 2));
    let put = |body: Vec<u8>| {
        direct
            .put_object()
            .bucket("gw-torn")
            .key("ckpt")
            .body(body.into())
            .send()
    };
    put(old.clone()).await.unwrap();
    let mem = Memory::new(len).await;
    mem.clear(0);
    let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
    let read = shim.get("alice", "gw-torn", "ckpt", None, &tok);
    let overwrite = async {
        while upstream_in(&gw).await < f64::from(4 << 20) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        put(new.clone()).await.unwrap();
    };
    let (got, ()) = tokio::time::timeout(Duration::from_secs(120), async {
        tokio::join!(read, overwrite)
    })
    .await
    .expect("the read hung");
    drop(w);
    match got {
        Ok(r) => {
            assert_eq!(r.bytes_placed, len as u64, "the old version's size");
            assert_eq!(mem.sha256(0, len), sha256(&old), "the read mixed versions");
            println!("the read finished with the whole old version");
        }
        Err(e) => {
            // Its chunks are fetched with If-Match: the overwrite fails it.
            assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
            assert!(!e.message().is_empty());
            println!("the read failed cleanly: {:?} {}", e.code(), e.message());
        }
    }
    mem.clear(0);
    let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
    let r = shim
        .get("alice", "gw-torn", "ckpt", None, &tok)
        .await
        .unwrap();
    drop(w);
    assert_eq!(r.bytes_placed, new.len() as u64);
    assert_eq!(
        mem.sha256(0, new.len()),
        sha256(&new),
        "the next read sees the new object"
    );
}

/// Wang and Yu's 2004 MD5 collision: two 128-byte blocks with the same MD5
/// (79054025255fb1a26e4bc422aef54eb4). The same suffix after each keeps the
/// MD5s equal, so two bodies of any size collide, and a single-part PUT of
/// either gets the same ETag.
const MD5_COLLISION: [&str; 2] = [
    "d131dd02c5e6eec4693d9a0698aff95c2fcab58712467eab4004583eb8fb7f89\
     55ad340609f4b30283e488832571415a085125e8f7cdc99fd91dbdf280373c5b\
     d8823e3156348f5bae6dacd436c919c6dd53e2b487da03fd02396306d248cda0\
     e99f33420f577ee8ce54b67080a80d1ec69821bcb6a8839396f9652b6ff72a70",
    "d131dd02c5e6eec4693d9a0698aff95c2fcab50712467eab4004583eb8fb7f89\
     55ad340609f4b30283e4888325f1415a085125e8f7cdc99fd91dbd7280373c5b\
     d8823e3156348f5bae6dacd436c919c6dd53e23487da03fd02396306d248cda0\
     e99f33420f577ee8ce54b67080280d1ec69821bcb6a8839396f965ab6ff72a70",
];

/// Two different bodies of `len` bytes with the same MD5: the collision
/// blocks, then the same bytes. Checked here, so a wrong constant fails
/// the test instead of passing it.
fn colliding_bodies(len: usize) -> (Vec<u8>, Vec<u8>) {
    use md5::Digest as _;
    let suffix = data(len - 128, 30);
    let [a, b] = MD5_COLLISION.map(|h| {
        let mut v: Vec<u8> = (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
            .collect();
        v.extend_from_slice(&suffix);
        v
    });
    assert_ne!(a, b, "the bodies differ");
    assert_eq!(a.len(), b.len());
    assert_eq!(
        md5::Md5::digest(&a),
        md5::Md5::digest(&b),
        "the bodies collide"
    );
    (a, b)
}

/// The cluster's clock: the `Date` of an answer from radosgw, in seconds.
async fn cluster_now(endpoint: &str) -> i64 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let host = endpoint.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
    s.write_all(format!("HEAD / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).await.unwrap();
    let date = reply
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("date").then(|| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no Date in {reply:?}"));
    let t = httpdate::parse_http_date(&date).unwrap();
    i64::try_from(t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()).unwrap()
}

/// Waits until the cluster's clock is at least `at`.
async fn cluster_clock_reaches(endpoint: &str, at: i64) {
    while cluster_now(endpoint).await < at {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for the cluster's next second to begin: what follows soon after
/// most likely happens within one second.
async fn next_cluster_second(endpoint: &str) {
    let now = cluster_now(endpoint).await;
    cluster_clock_reaches(endpoint, now + 1).await;
}

/// An object's ETag, Last-Modified second and version id, as the cluster
/// answers a HEAD.
type VersionSeen = (String, i64, Option<String>);

/// The ETag, Last-Modified second and version id of `key`, straight from
/// the cluster.
async fn identity(direct: &aws_sdk_s3::Client, bucket: &str, key: &str) -> VersionSeen {
    let h = direct
        .head_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap();
    (
        h.e_tag().unwrap().to_owned(),
        h.last_modified().unwrap().secs(),
        h.version_id().map(str::to_owned),
    )
}

/// An MD5-collision overwrite that the identity can tell apart (another
/// Last-Modified second, or another version id) must be seen by the next
/// read; one it cannot (the same second, unversioned) may be missed only
/// until `settle_after` (1 s) after that second: a read then returns the
/// cluster's body. Returns whether the overwrite landed in the same second.
async fn a_collision_is_seen(
    shim: &Shim,
    endpoint: &str,
    bucket: &str,
    key: &str,
    (old, new): (&[u8], &[u8]),
    (first, second): (VersionSeen, VersionSeen),
) -> bool {
    assert_eq!(
        first.0, second.0,
        "the premise: Ceph gave both the same ETag"
    );
    let len = new.len();
    let mem = Memory::new(len).await;
    let read = || async {
        mem.clear(0);
        let (w, tok) = mem.window(0, len, Access::REMOTE_WRITE);
        let r = shim.get("alice", bucket, key, None, &tok).await;
        drop(w);
        r.map(|_| mem.read(0, len))
    };
    let same_second = first.1 == second.1;
    let told_apart = !same_second || second.2.is_some();
    match read().await {
        Ok(got) if got == new => {}
        Ok(got) => {
            assert_eq!(got, old, "neither body");
            assert!(
                !told_apart,
                "{bucket}: the gateway served the colliding old body from its cache after \
                 the cluster took the new one ({first:?} then {second:?})"
            );
        }
        Err(e) => panic!("{bucket}: {e:?}"),
    }
    // After the settle time, every read returns what the cluster holds.
    cluster_clock_reaches(endpoint, second.1 + 2).await;
    for round in 0..2 {
        let got = read().await.unwrap();
        assert!(
            got == new,
            "{bucket}: round {round} after the settle time served the old colliding body \
             ({first:?} then {second:?})"
        );
    }
    same_second
}

/// Issue 30 finding 8: the gateway cache took the ETag as the identity of
/// a version, and a single-part ETag is an MD5. A writer with a colliding
/// pair (here Wang and Yu's) lets readers fill the gateways' caches with
/// one body, then overwrites it straight in the cluster with the other:
/// the same ETag and size, so the gateways served the first body forever
/// while the cluster held the second. Now the identity also has the
/// Last-Modified second, the version id and the kept checksums, and a read
/// caches nothing of a version before its second plus `settle_after` has
/// passed (it waits): an overwrite in a later second, or in a versioned
/// bucket, is seen by the next read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn md5_collision_after_a_read_fill_is_never_served_for_long() {
    let ceph = ceph();
    let cache = CacheConfig {
        size: s3dma_config::ByteSize(4 << 20),
        chunk_size: s3dma_config::ByteSize(64 << 10),
        prefetch_chunks: 0,
        ..CacheConfig::default()
    };
    let buckets = vec!["gw-collide", "gw-collide-versioned"];
    let (_gw, agent) = stack(&ceph.endpoint, cache, buckets.clone());
    let direct = s3_client(&ceph.endpoint, ALICE.0, ALICE.1);
    for b in &buckets {
        create_bucket(&direct, b).await;
    }
    enable_versioning(&direct, "gw-collide-versioned").await;
    let shim = agent.client().await;
    let (c1, c2) = colliding_bodies((100 << 10) + 128);
    let put = |bucket: &'static str, body: &[u8]| {
        direct
            .put_object()
            .bucket(bucket)
            .key("k")
            .body(body.to_vec().into())
            .send()
    };
    for bucket in buckets {
        // A later second first (the Last-Modified tells the bodies apart),
        // then as quickly as possible (a read of a version in its first
        // second waits until it settled before it fetches, so the
        // overwrite lands in a later second anyway).
        for quick in [false, true] {
            if quick {
                next_cluster_second(&ceph.endpoint).await;
            }
            put(bucket, &c1).await.unwrap();
            let first = identity(&direct, bucket, "k").await;
            // Readers fill the gateway's cache with c1.
            let mem = Memory::new(c1.len()).await;
            let (w, tok) = mem.window(0, c1.len(), Access::REMOTE_WRITE);
            shim.get("alice", bucket, "k", None, &tok).await.unwrap();
            drop(w);
            assert_eq!(mem.read(0, c1.len()), c1);
            if !quick {
                cluster_clock_reaches(&ceph.endpoint, first.1 + 1).await;
            }
            // The writer swaps the body behind the gateway's back.
            put(bucket, &c2).await.unwrap();
            let second = identity(&direct, bucket, "k").await;
            assert_eq!(sdk_get(&direct, bucket, "k").await, c2);
            let same = a_collision_is_seen(
                &shim,
                &ceph.endpoint,
                bucket,
                "k",
                (&c1, &c2),
                (first, second),
            )
            .await;
            println!("{bucket}: overwrite in the same second: {same}");
            // Back to c1 for the next round, in a later second.
            cluster_clock_reaches(&ceph.endpoint, cluster_now(&ceph.endpoint).await + 1).await;
        }
    }
}

/// Issue 30 finding 8, through write-allocation: a writer PUTs one body
/// of a colliding pair through the gateway (kept in its cache under the
/// ETag the cluster acknowledged) and then the other straight to the
/// cluster. The gateway served the first body to every reader while the
/// cluster held the second; now write-allocated chunks are published
/// under the identity a HEAD after the PUT confirms (so an overwrite in a
/// later second, or in a versioned bucket, is seen by the next read), and
/// trusted past the version's own second plus `settle_after` only when a
/// version id or kept SHA-256 pins them (so one in the same second is seen
/// by every read after that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn md5_collision_after_a_write_allocation_is_never_served_for_long() {
    let ceph = ceph();
    let cache = CacheConfig {
        size: s3dma_config::ByteSize(4 << 20),
        chunk_size: s3dma_config::ByteSize(64 << 10),
        prefetch_chunks: 0,
        write_allocate_max: s3dma_config::ByteSize(1 << 20),
        ..CacheConfig::default()
    };
    let buckets = vec!["gw-collide-alloc", "gw-collide-alloc-versioned"];
    let (gw, agent) = stack(&ceph.endpoint, cache, buckets.clone());
    let direct = s3_client(&ceph.endpoint, ALICE.0, ALICE.1);
    for b in &buckets {
        create_bucket(&direct, b).await;
    }
    enable_versioning(&direct, "gw-collide-alloc-versioned").await;
    let shim = agent.client().await;
    let (c1, c2) = colliding_bodies((100 << 10) + 128);
    let mem = Memory::new(c1.len()).await;
    let mut kept = 0.0;
    for bucket in buckets {
        // A later second first (the Last-Modified tells the bodies apart),
        // then as quickly as possible, until the overwrite lands in the
        // write's own second (tries at most 5; the chunks are then served
        // only until the settle time, or not at all in the versioned bucket).
        for round in 0..6 {
            let quick = round > 0;
            if quick {
                next_cluster_second(&ceph.endpoint).await;
            }
            mem.fill(0, &c1);
            let (w, tok) = mem.window(0, c1.len(), Access::REMOTE_READ);
            shim.put("alice", bucket, "k", &tok).await.unwrap();
            drop(w);
            kept += 1.0;
            let first = identity(&direct, bucket, "k").await;
            assert_eq!(
                metric(
                    &gw,
                    r#"s3dma_storage_target_cache_write_allocated_total{outcome="kept"}"#
                )
                .await,
                kept,
                "the PUT was write-allocated"
            );
            if !quick {
                cluster_clock_reaches(&ceph.endpoint, first.1 + 1).await;
            }
            put_as(&direct, bucket, "k", c2.clone()).await;
            let second = identity(&direct, bucket, "k").await;
            let same = a_collision_is_seen(
                &shim,
                &ceph.endpoint,
                bucket,
                "k",
                (&c1, &c2),
                (first, second),
            )
            .await;
            println!("{bucket}: overwrite in the same second: {same}");
            cluster_clock_reaches(&ceph.endpoint, cluster_now(&ceph.endpoint).await + 1).await;
            if same {
                break;
            }
        }
    }
}
