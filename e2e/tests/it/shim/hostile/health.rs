//! What every phase must leave intact: the tenant's buffers full of
//! sentinels hold what they must, and every service still does its job;
//! and the closing checks.

use super::*;

// ---------------------------------------------------------------------------
// Tenant buffers full of sentinels, and what they must hold.

pub(super) struct Watched {
    pub(super) name: &'static str,
    pub(super) buf: s3dma_client::Buffer,
    pub(super) want: Vec<u8>,
}

impl Watched {
    pub(super) async fn new(c: &Client, name: &'static str, len: usize, seed: u64) -> Watched {
        let mut buf = c.alloc(len).await.unwrap();
        let want = data(len, seed);
        buf.as_mut_slice().copy_from_slice(&want);
        Watched { name, buf, want }
    }

    /// A legitimate write at `off`.
    pub(super) fn wrote(&mut self, off: usize, bytes: &[u8]) {
        self.want[off..off + bytes.len()].copy_from_slice(bytes);
    }

    #[track_caller]
    pub(super) fn check(&self, when: &str) {
        let got = self.buf.as_slice();
        if let Some(i) = got.iter().zip(&self.want).position(|(a, b)| a != b) {
            let n = got[i..]
                .iter()
                .zip(&self.want[i..])
                .take_while(|(a, b)| a != b)
                .count();
            panic!(
                "{when}: buffer {} changed at offset {i} ({n}+ bytes differ; got {:02x?}, want {:02x?})",
                self.name,
                &got[i..(i + 16).min(got.len())],
                &self.want[i..(i + 16).min(got.len())]
            );
        }
    }
}

pub(super) fn check_all(bufs: &[&Watched], when: &str) {
    for b in bufs {
        b.check(when);
    }
}

// ---------------------------------------------------------------------------
// Health: every service still does its job.

pub(super) struct Health {
    pub(super) fabric: SocketAddr,
    pub(super) metrics: Vec<SocketAddr>,
}

pub(super) async fn still_serving(stack: &Stack, c: &Client, h: &Health, round: &str) {
    guard("health check", async {
        // A GET and a PUT through the shim, bytes checked by SHA-256.
        let len = (1 << 20) + 13;
        let payload = data(len, 77);
        let mut src = c.alloc(len).await.unwrap();
        src.as_mut_slice().copy_from_slice(&payload);
        let key = format!("health/{round}");
        c.put_object_from("alice-data", &key, &src, 0..len, PutOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{round}: PUT through the shim: {e}"));
        let mut dst = c.alloc(len).await.unwrap();
        c.get_object_into("alice-data", &key, &mut dst, 0, GetOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{round}: GET through the shim: {e}"));
        assert_eq!(sha256(dst.as_slice()), sha256(&payload), "{round}");
        src.release().await.unwrap();
        dst.release().await.unwrap();
        // Straight to the target.
        let s3 = stack.target.s3(ALICE);
        s3.put_object()
            .bucket("alice-data")
            .key(format!("health/direct-{round}"))
            .body(payload[..4096].to_vec().into())
            .send()
            .await
            .unwrap_or_else(|e| panic!("{round}: direct PUT: {e:?}"));
        let got = agent::sdk_get(&s3, "alice-data", &format!("health/direct-{round}")).await;
        assert_eq!(got, payload[..4096]);
        // The agent's gRPC port, straight.
        let shim = stack.agent.client().await;
        let r = shim
            .inner
            .clone()
            .head_object(shim.req(agent_pb::HeadObjectRequest {
                tenant: "alice".into(),
                bucket: "alice-data".into(),
                key,
            }))
            .await
            .unwrap_or_else(|e| panic!("{round}: agent HeadObject: {e:?}"));
        assert_eq!(r.into_inner().object.unwrap().size, len as u64);
        // The shim's fabric endpoint authenticates a peer with the key.
        drop(fabric_session(h.fabric, 1).await);
        // Every metrics port answers.
        for m in &h.metrics {
            let r = http(
                *m,
                b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
            )
            .await;
            assert_eq!(r.status, 200, "{round}: metrics on {m}: {}", r.text());
        }
    })
    .await;
}

/// The end: the stalls from the start were closed by the servers
/// themselves; everything still serves, nothing moved that should not have,
/// nothing died, panicked or leaked.
pub(super) async fn the_end(w: World, stalls: tokio::task::JoinSet<(String, bool)>) {
    let mut kept = Vec::new();
    let mut stalls = stalls;
    while let Some(r) = stalls.join_next().await {
        let (name, closed) = r.unwrap();
        if !closed {
            kept.push(name);
        }
    }
    assert!(
        kept.is_empty(),
        "stalled connections the servers never closed: {kept:#?}"
    );
    assert!(
        w.s3.head_object()
            .bucket("alice-data")
            .key("stalled-put")
            .send()
            .await
            .is_err(),
        "a PUT whose body stalled was stored"
    );

    // ---- The end: everything still serves, nothing moved that should not
    // have, nothing died, panicked or leaked.
    still_serving(&w.stack, &w.c, &w.health, "after everything").await;
    w.check("at the end");
    for p in &w.procs {
        assert!(p.alive(), "{} ({}) died", p.name, p.pid);
    }
    for (name, log) in [
        ("storage-target", w.stack.target.log()),
        ("dpu-agent", w.stack.agent.output()),
        ("host-shim", w.stack.shim.log()),
    ] {
        assert!(
            !log.contains("panicked"),
            "{name} panicked:\n{}",
            log.lines()
                .filter(|l| l.contains("panicked"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    drop(w.c);
    // Descriptors come back to about the baseline (closes are asynchronous:
    // wait for them, up to the hang guard).
    const SLACK: usize = 16;
    let settled = tokio::time::timeout(HANG_GUARD, async {
        loop {
            if w.procs
                .iter()
                .zip(&w.baseline)
                .all(|(p, (fds, _))| p.fds().len() <= fds + SLACK)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let now: Vec<(usize, u64)> = w
        .procs
        .iter()
        .map(|p| (p.fds().len(), p.rss_kib()))
        .collect();
    println!("hostile: at the end (fds, rss KiB): {now:?}");
    if settled.is_err() {
        for ((p, before), (fds, _)) in w.procs.iter().zip(&w.baseline_fds).zip(&now) {
            let after = p.fds();
            let new: Vec<&String> = after.iter().filter(|f| !before.contains(f)).collect();
            eprintln!(
                "{}: {} fds, baseline {}; new: {new:?}",
                p.name,
                fds,
                before.len()
            );
        }
        panic!(
            "descriptors did not come back to the baseline: {:?} -> {now:?}",
            w.baseline
        );
    }
    for ((p, (_, rss0)), (_, rss1)) in w.procs.iter().zip(&w.baseline).zip(&now) {
        assert!(
            rss1.saturating_sub(*rss0) < 512 << 10,
            "{} grew from {rss0} KiB to {rss1} KiB",
            p.name
        );
    }
}
