//! Tenant isolation by bucket and prefix policy; a tenant's batches bounded
//! by its quotas and its share of the staging pool.

use super::*;

// ---------------------------------------------------------------------------
// 1. Tenant isolation
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_isolated_by_bucket_and_prefix_policy() {
    let target = Target::start(true);
    for b in ["alice-data", "shared", "bob-data"] {
        target.create_bucket(b).await;
    }
    let agent = Agent::start(AgentSpec::one(&target));
    let shim = agent.client().await;
    let mem = Memory::new(4 << 20).await;
    let sdk = target.s3(ALICE);
    const DST: usize = 2 << 20;

    // Alice stores a private object.
    let body = data(100_000, 11);
    mem.fill(0, &body);
    let (w, src) = mem.window(0, body.len(), Access::REMOTE_READ);
    let put = shim
        .put("alice", "alice-data", "private/report.bin", &src)
        .await
        .unwrap();
    drop(w);
    assert_eq!(put.size, body.len() as u64);

    // Bob, through the same shim (host1 may act for both), may do nothing
    // with alice-data: not even learn whether a key exists.
    mem.clear(0xEE);
    let (_dst_w, dst) = mem.window(DST, 1 << 20, Access::REMOTE_WRITE);
    let evil = data(1000, 99);
    mem.fill(0, &evil);
    let (_evil_w, evil_src) = mem.window(0, evil.len(), Access::REMOTE_READ);
    for key in ["private/report.bin", "private/missing.bin"] {
        assert_denied(
            shim.get("bob", "alice-data", key, None, &dst).await,
            &format!("bob GET alice-data/{key}"),
        );
        assert_denied(
            head(&shim, "bob", "alice-data", key).await,
            &format!("bob HEAD alice-data/{key}"),
        );
        assert_denied(
            delete(&shim, "bob", "alice-data", key).await,
            &format!("bob DELETE alice-data/{key}"),
        );
        assert_denied(
            shim.put("bob", "alice-data", key, &evil_src).await,
            &format!("bob PUT alice-data/{key}"),
        );
    }
    for prefix in ["", "private/", "p"] {
        assert_denied(
            list(&shim, "bob", "alice-data", prefix).await,
            &format!("bob LIST alice-data/{prefix}"),
        );
    }
    // Bucket names are case-sensitive: "ALICE-DATA" is not bob's either,
    // and "SHARED" is not "shared".
    assert_denied(
        head(&shim, "bob", "ALICE-DATA", "private/report.bin").await,
        "bob HEAD ALICE-DATA",
    );
    assert_denied(
        head(&shim, "bob", "SHARED", "datasets/x").await,
        "bob HEAD SHARED/datasets/x",
    );
    // Nothing was placed in bob's destination window.
    assert_eq!(mem.read(DST, 1 << 20), vec![0xEE; 1 << 20]);

    // Alice's object is unchanged, and bob created nothing (checked with a
    // plain S3 client as alice, straight against the target).
    assert_eq!(
        sha256(&sdk_get(&sdk, "alice-data", "private/report.bin").await),
        sha256(&body)
    );
    let h = sdk
        .head_object()
        .bucket("alice-data")
        .key("private/report.bin")
        .send()
        .await
        .unwrap();
    assert_eq!(h.e_tag().unwrap(), put.etag);
    assert_eq!(h.content_length(), Some(body.len() as i64));
    assert_eq!(
        sdk_keys(&sdk, "alice-data").await,
        vec!["private/report.bin".to_owned()]
    );

    // `shared`: alice may write anywhere, bob may only read under datasets/.
    let ds = data(5000, 21);
    let other = data(3000, 22);
    for (key, bytes) in [("datasets/x", &ds), ("other", &other)] {
        mem.fill(0, bytes);
        let (w, src) = mem.window(0, bytes.len(), Access::REMOTE_READ);
        shim.put("alice", "shared", key, &src).await.unwrap();
        drop(w);
    }
    mem.clear(0);
    let (w, dst2) = mem.window(DST, 1 << 20, Access::REMOTE_WRITE);
    let got = shim
        .get("bob", "shared", "datasets/x", None, &dst2)
        .await
        .unwrap();
    drop(w);
    assert_eq!(got.bytes_placed, ds.len() as u64);
    assert_eq!(mem.sha256(DST, ds.len()), sha256(&ds));
    let h = head(&shim, "bob", "shared", "datasets/x").await.unwrap();
    assert_eq!(h.object.unwrap().size, ds.len() as u64);

    let (_w, dst3) = mem.window(DST, 1 << 20, Access::REMOTE_WRITE);
    assert_denied(
        shim.get("bob", "shared", "other", None, &dst3).await,
        "bob GET shared/other",
    );
    assert_denied(
        head(&shim, "bob", "shared", "other").await,
        "bob HEAD shared/other",
    );
    assert_denied(
        shim.get("bob", "shared", "datasets", None, &dst3).await,
        "bob GET shared/datasets (no slash)",
    );
    // Read-only grant: no writes or deletes even under datasets/.
    assert_denied(
        shim.put("bob", "shared", "datasets/new", &evil_src).await,
        "bob PUT shared/datasets/new",
    );
    assert_denied(
        delete(&shim, "bob", "shared", "datasets/x").await,
        "bob DELETE shared/datasets/x",
    );
    // Listing: only under a prefix the grant covers.
    for prefix in ["", "data", "datasets", "other"] {
        assert_denied(
            list(&shim, "bob", "shared", prefix).await,
            &format!("bob LIST shared/{prefix:?}"),
        );
    }
    let l = list(&shim, "bob", "shared", "datasets/").await.unwrap();
    let keys: Vec<&str> = l.objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys, ["datasets/x"]);
    // Alice sees both.
    let l = list(&shim, "alice", "shared", "").await.unwrap();
    let keys: Vec<&str> = l.objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys, ["datasets/x", "other"]);

    // Keys with `.` / `..` segments are denied for everyone, even where a
    // grant covers every key.
    let (_w, dst4) = mem.window(DST, 1 << 20, Access::REMOTE_WRITE);
    for key in [
        "datasets/../other",
        "datasets/./x",
        "datasets/sub/../../other",
    ] {
        assert_denied(
            shim.get("bob", "shared", key, None, &dst4).await,
            &format!("bob GET shared/{key}"),
        );
        assert_denied(
            head(&shim, "bob", "shared", key).await,
            &format!("bob HEAD shared/{key}"),
        );
    }
    // S3 prefixes are literal (a query parameter, never normalised): a
    // `..` in a listing prefix may be refused or match nothing, but must
    // not reveal keys outside datasets/.
    match list(&shim, "bob", "shared", "datasets/../").await {
        Ok(l) => assert!(
            l.objects.is_empty() && l.common_prefixes.is_empty(),
            "bob LIST shared/datasets/../: {l:?}"
        ),
        Err(e) => {
            assert_denied::<()>(Err(e), "bob LIST shared/datasets/../");
        }
    }
    for key in [
        "private/../private/report.bin",
        "./private/report.bin",
        "..",
    ] {
        assert_denied(
            shim.get("alice", "alice-data", key, None, &dst4).await,
            &format!("alice GET alice-data/{key}"),
        );
        assert_denied(
            shim.put("alice", "alice-data", key, &evil_src).await,
            &format!("alice PUT alice-data/{key}"),
        );
        assert_denied(
            delete(&shim, "alice", "alice-data", key).await,
            &format!("alice DELETE alice-data/{key}"),
        );
    }
    assert_denied(
        delete(&shim, "alice", "shared", "../alice-data/private/report.bin").await,
        "alice DELETE shared/../alice-data/...",
    );

    // Still exactly what alice wrote.
    assert_eq!(
        sdk_keys(&sdk, "alice-data").await,
        vec!["private/report.bin".to_owned()]
    );
    assert_eq!(
        sha256(&sdk_get(&sdk, "alice-data", "private/report.bin").await),
        sha256(&body)
    );
    assert_eq!(sdk_keys(&sdk, "shared").await, vec!["datasets/x", "other"]);
    assert_eq!(
        sha256(&sdk_get(&sdk, "shared", "other").await),
        sha256(&other)
    );

    // Denials are counted per tenant with outcome "denied".
    let m = agent.metrics_text().await;
    assert!(
        m.lines()
            .any(|l| l.starts_with("s3dma_agent_requests_total{")
                && l.contains("tenant=\"bob\"")
                && l.contains("outcome=\"denied\"")),
        "{m}"
    );
}

// ---------------------------------------------------------------------------
// 7. Batches obey the tenant's quotas
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_objects_items_each_take_a_quota_slot_and_batches_are_bounded() {
    let target = Target::start(true);
    target.create_bucket("alice-data").await;
    let s3 = target.s3(ALICE);
    for i in 0..8 {
        s3.put_object()
            .bucket("alice-data")
            .key(format!("b/{i}"))
            .body(data(64 << 10, i).into())
            .send()
            .await
            .unwrap();
    }
    let mut spec = AgentSpec::one(&target);
    // One request at a time and no queue: a second request at once is
    // SlowDown.
    spec.alice_quotas = "max_concurrent_requests: 1\nmax_queued_requests: 0".into();
    // Windows (1 MiB) larger than a chunk: every item is its own single
    // request (small items to an s3dma target would go as one batched
    // request, which takes one slot: agent::batch_target).
    spec.transfer = "max_batch_items: 8\nchunk_size: 512KiB".into();
    let agent = Agent::start(spec);
    let shim = agent.client().await;
    let mem = Memory::new(8 << 20).await;
    let windows: Vec<_> = (0..8)
        .map(|i| mem.window(i * (1 << 20), 1 << 20, Access::ALL))
        .collect();
    let items: Vec<pb::GetObjectsItem> = windows
        .iter()
        .enumerate()
        .map(|(i, (_, token))| pb::GetObjectsItem {
            destination_rails: Vec::new(),
            bucket: "alice-data".into(),
            key: format!("b/{i}"),
            range: None,
            destination: token.clone(),
            if_match: String::new(),
        })
        .collect();
    let run = |items: Vec<pb::GetObjectsItem>, concurrency: u32| {
        let shim = shim.clone();
        async move {
            let mut stream = shim
                .inner
                .clone()
                .get_objects(shim.req(pb::GetObjectsRequest {
                    tenant: "alice".into(),
                    items,
                    concurrency,
                }))
                .await?
                .into_inner();
            let mut out = Vec::new();
            while let Some(r) = stream.next().await {
                out.push(match r?.result.unwrap() {
                    pb::get_objects_reply::Result::Ok(_) => "ok".to_owned(),
                    pb::get_objects_reply::Result::Error(e) => e.s3_code,
                });
            }
            Ok::<_, Status>(out)
        }
    };
    // One item at a time: each takes the tenant's only slot and gives it
    // back when it ends, so all succeed.
    let seq = run(items.clone(), 1).await.unwrap();
    assert_eq!(seq, vec!["ok"; 8]);
    // Eight at once: the batch is not one request; its items beyond the
    // tenant's one slot are refused like any other request would be.
    let par = run(items.clone(), 8).await.unwrap();
    assert_eq!(par.len(), 8);
    assert!(par.iter().any(|c| c == "ok"), "{par:?}");
    assert!(par.iter().any(|c| c == "SlowDown"), "{par:?}");
    assert!(par.iter().all(|c| c == "ok" || c == "SlowDown"), "{par:?}");
    // Every item was counted as a request of the tenant's.
    let m = agent.metrics_text().await;
    let counted: f64 = m
        .lines()
        .filter(|l| {
            l.starts_with("s3dma_agent_requests_total{")
                && l.contains("tenant=\"alice\"")
                && l.contains("op=\"GetObjects\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(counted, 16.0, "{m}");
    // A batch over transfer.max_batch_items is refused, saying so.
    let mut nine = items.clone();
    nine.push(items[0].clone());
    let e = run(nine, 1).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("at most 8 items"), "{e:?}");
    assert!(e.message().contains("transfer.max_batch_items"), "{e:?}");
}

// ---------------------------------------------------------------------------
// 8. No tenant holds the whole staging pool
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holds_at_most_its_share_of_the_staging_pool() {
    // A target without RDMA: every byte goes through the staging pool.
    let target = Target::start(false);
    target.create_bucket("alice-data").await;
    target.create_bucket("bob-data").await;
    let object = data(6 << 20, 7);
    for (bucket, who) in [("alice-data", ALICE), ("bob-data", BOB)] {
        put_as(&target.s3(who), bucket, "big", object.clone()).await;
    }
    let (dir, shims) = secrets_dir();
    let d = dir.path();
    // A pool of 4 x 1 MiB; alice's byte quota (the default 1 GiB) is far
    // larger than the pool, bob's is 1 MiB; the share is 50%.
    let yaml = agent_yaml(d, "", &shims, &target.endpoint)
        .replace("    rdma: true\n", "    rdma: false\n")
        .replace(
            "  - name: bob\n    access_key_id",
            "  - name: bob\n    quotas:\n      max_bytes_in_flight: 1MiB\n    access_key_id",
        )
        .replace("transfer:\n", "transfer:\n  chunk_size: 1MiB\n");
    write_private(&d.join("agent.yaml"), &yaml);
    let agent = OwnAgent::start(&d.join("agent.yaml"), d.join("agent.log"));
    // The start-up log states each tenant's effective share: alice's quota
    // is clamped to half the pool, bob's to his byte quota.
    let log = strip_ansi(&agent.log());
    let share = |tenant: &str| {
        log.lines()
            .find(|l| {
                l.contains("share of the staging pool") && l.contains(&format!("tenant={tenant}"))
            })
            .unwrap_or_else(|| panic!("no share line for {tenant}:\n{log}"))
            .to_owned()
    };
    assert!(
        share("alice").contains("staging_buffers=2 of=4"),
        "{}",
        share("alice")
    );
    assert!(
        share("bob").contains("staging_buffers=1 of=4"),
        "{}",
        share("bob")
    );

    // Both tenants' fallback GETs, several at once, complete and place the
    // right bytes: a tenant waits for its own share instead of taking the
    // pool, and a transfer never waits on buffers only it could free.
    let shim = Agent::shim_for(&agent.addr, SHIM_TOKEN).await;
    let mem = Memory::new(4 * (6 << 20)).await;
    let mut tasks = Vec::new();
    for (i, (tenant, bucket)) in [
        ("alice", "alice-data"),
        ("alice", "alice-data"),
        ("bob", "bob-data"),
        ("bob", "bob-data"),
    ]
    .into_iter()
    .enumerate()
    {
        let (w, tok) = mem.window(i * (6 << 20), 6 << 20, Access::ALL);
        let shim = shim.clone();
        tasks.push(tokio::spawn(async move {
            let r = shim.get(tenant, bucket, "big", None, &tok).await;
            drop(w);
            r
        }));
    }
    for t in tasks {
        let r = tokio::time::timeout(HANG_GUARD, t)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(r.bytes_placed, 6 << 20);
        assert_eq!(r.path, pb::TransferPath::Fallback as i32);
    }
    for i in 0..4 {
        assert_eq!(
            mem.sha256(i * (6 << 20), 6 << 20),
            sha256(&object),
            "window {i}"
        );
    }
}
