//! Fabric rails through the real dpu-agent and storage-target processes:
//! tenant memory on one tcp-fabric domain served by two endpoints (the
//! shim's rails) on 127.0.0.1 and 127.0.0.2; GETs and PUTs name both
//! rails' tokens (`destination_rails`, `source_rails`). Both rails carry
//! bytes; a rail whose endpoint refuses connections has its work redone on
//! the other (0 failed requests, `s3dma_agent_rail_up` 0); rail tokens
//! that do not fit the request are refused naming the field, nothing
//! moved. (Cutting a rail's link mid-transfer, with network namespaces:
//! the top-level `rails` suite.)

use super::common::*;
use crate::rail_metrics::{failed_requests, rail_bytes, rail_up, sum};
use fabric::{Access, Domain, Endpoint, EndpointConfig, Region, Window};
use s3dma_proto::agent::v1 as pb;

/// Tenant memory on one domain, served by one endpoint per rail.
struct RailMemory {
    domain: Domain,
    region: Region,
    rails: Vec<Option<Endpoint>>,
}

impl RailMemory {
    /// `len` bytes served on each of `ips` (one rail each).
    async fn new(len: usize, ips: &[&str]) -> RailMemory {
        let domain = Domain::open(backend()).unwrap();
        let region = domain.alloc(len, Access::ALL).unwrap();
        let mut rails = Vec::new();
        for ip in ips {
            let cfg = EndpointConfig::new(format!("{ip}:0").parse().unwrap(), fabric_key());
            rails.push(Some(Endpoint::listen(&domain, cfg).await.unwrap()));
        }
        RailMemory {
            domain,
            region,
            rails,
        }
    }

    /// `ip:port` of rail `i` (the metrics' rail label).
    fn label(&self, i: usize) -> String {
        self.rails[i].as_ref().unwrap().addr().addr.to_string()
    }

    /// One window per rail over `[off, off+len)` and its token on that
    /// rail (rail 0 first), as the shim mints them.
    fn windows(&self, off: usize, len: usize, access: Access) -> (Vec<Window>, Vec<String>) {
        let mut ws = Vec::new();
        let mut ts = Vec::new();
        for ep in self.rails.iter().flatten() {
            let w = self.region.window(off, len, access, None).unwrap();
            ts.push(ep.token(&w).unwrap().to_string());
            ws.push(w);
        }
        (ws, ts)
    }

    /// Shuts rail `i`'s endpoint down: its port refuses connections.
    async fn cut(&mut self, i: usize) {
        self.rails[i].take().unwrap().shutdown().await;
    }

    /// Serves rail `i` again on `addr` (its old address): a new endpoint,
    /// so windows need minting again.
    async fn restore(&mut self, i: usize, addr: &str) {
        let cfg = EndpointConfig::new(addr.parse().unwrap(), fabric_key());
        self.rails[i] = Some(Endpoint::listen(&self.domain, cfg).await.unwrap());
    }

    /// A window over `[off, off+len)` and its token on rail `i`.
    fn window_on(&self, i: usize, off: usize, len: usize, access: Access) -> (Window, String) {
        let w = self.region.window(off, len, access, None).unwrap();
        let t = self.rails[i]
            .as_ref()
            .unwrap()
            .token(&w)
            .unwrap()
            .to_string();
        (w, t)
    }

    fn fill(&self, data: &[u8]) {
        for (i, c) in data.chunks(16 << 20).enumerate() {
            self.region.write_at(i * (16 << 20), c).unwrap();
        }
    }

    fn read(&self, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        for (i, c) in v.chunks_mut(16 << 20).enumerate() {
            self.region.read_at(i * (16 << 20), c).unwrap();
        }
        v
    }

    fn clear(&self, len: usize, byte: u8) {
        self.fill(&vec![byte; len]);
    }
}

async fn get(
    shim: &Shim,
    key: &str,
    tokens: &[String],
) -> Result<pb::GetObjectResponse, tonic::Status> {
    let msg = pb::GetObjectRequest {
        tenant: "alice".into(),
        bucket: "alice-data".into(),
        key: key.into(),
        range: None,
        destination: tokens[0].clone(),
        destination_rails: tokens[1..].to_vec(),
        if_match: String::new(),
    };
    shim.inner
        .clone()
        .get_object(shim.req(msg))
        .await
        .map(tonic::Response::into_inner)
}

async fn put(
    shim: &Shim,
    key: &str,
    tokens: &[String],
) -> Result<pb::PutObjectResponse, tonic::Status> {
    let msg = pb::PutObjectRequest {
        tenant: "alice".into(),
        bucket: "alice-data".into(),
        key: key.into(),
        source: tokens[0].clone(),
        source_rails: tokens[1..].to_vec(),
        content_type: "application/octet-stream".into(),
        metadata: Default::default(),
    };
    shim.inner
        .clone()
        .put_object(shim.req(msg))
        .await
        .map(tonic::Response::into_inner)
}

/// Chunks and parts small enough that a 24 MiB object spreads over both
/// rails.
fn spec(target: &Target) -> AgentSpec {
    let mut spec = AgentSpec::one(target);
    spec.transfer = "chunk_size: 1MiB\nmax_chunks_in_flight: 4\nmultipart_threshold: 5MiB\n\
                     part_size: 5MiB\n"
        .into();
    spec
}

const LEN: usize = 24 << 20;

/// A storage-target with alice's bucket, on tcp (rails on loopback
/// addresses); `None`, said why, on verbs.
async fn rail_target() -> Option<Target> {
    if backend() != fabric::Backend::Tcp {
        eprintln!("rails on loopback addresses: tcp fabric only");
        return None;
    }
    let target = Target::start(true);
    target.create_bucket("alice-data").await;
    Some(target)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rails_carry_gets_and_puts() {
    let Some(target) = rail_target().await else {
        return;
    };
    let agent = Agent::start(spec(&target));
    let shim = agent.client().await;
    let mem = RailMemory::new(LEN, &["127.0.0.1", "127.0.0.2"]).await;
    let body = data(LEN, 46);
    mem.fill(&body);

    let (ws, tokens) = mem.windows(0, LEN, Access::REMOTE_READ);
    let p = put(&shim, "railed", &tokens).await.unwrap();
    drop(ws);
    assert_eq!(p.size, LEN as u64);
    assert_eq!(p.parts, 5);
    assert_eq!(p.path, pb::TransferPath::Rdma as i32);
    assert_eq!(
        sha256(&sdk_get(&target.s3(ALICE), "alice-data", "railed").await),
        sha256(&body)
    );

    mem.clear(LEN, 0xEE);
    let (ws, tokens) = mem.windows(0, LEN, Access::REMOTE_WRITE);
    let g = get(&shim, "railed", &tokens).await.unwrap();
    drop(ws);
    assert_eq!(g.bytes_placed, LEN as u64);
    assert_eq!(g.path, pb::TransferPath::Rdma as i32);
    assert_eq!(sha256(&mem.read(LEN)), sha256(&body));

    let m = agent.metrics_text().await;
    for i in 0..2 {
        let rail = mem.label(i);
        for op in ["get", "put"] {
            assert!(rail_bytes(&m, &rail, op) > 0.0, "{rail} {op}:\n{m}");
        }
        assert_eq!(rail_up(&m, &rail), Some(1.0), "{rail}");
    }
    // Every byte counted once over the rails.
    for op in ["get", "put"] {
        let total: f64 = (0..2).map(|i| rail_bytes(&m, &mem.label(i), op)).sum();
        assert_eq!(total, LEN as f64, "{op}");
    }
    assert_eq!(failed_requests(&m), 0.0, "{m}");
}

/// A rail whose endpoint refuses connections: every chunk and part the
/// agent put on it fails there (the target's 500 RDMATransferFailed; the
/// agent's own fallback connect) and is redone on the other rail; no
/// request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_rail_has_its_work_redone_on_the_other() {
    let Some(target) = rail_target().await else {
        return;
    };
    // A second target entry over plain HTTP: the agent moves those bytes
    // itself (fallback), over the rails too.
    let mut s = spec(&target);
    s.targets = vec![
        TargetSpec {
            name: "local",
            endpoint: target.endpoint.clone(),
            buckets: vec!["alice-data"],
            rdma: true,
        },
        TargetSpec {
            name: "plain",
            endpoint: target.endpoint.clone(),
            buckets: vec!["shared"],
            rdma: false,
        },
    ];
    let agent = Agent::start(s);
    target.create_bucket("shared").await;
    let shim = agent.client().await;
    let sdk = target.s3(ALICE);
    // Rails 1, 2 and 3 each die before the request that meets them first
    // (a fresh rail is up, so it gets work at once).
    let mut mem = RailMemory::new(LEN, &["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]).await;
    let body = data(LEN, 47);
    mem.fill(&body);
    let (_ws, all) = mem.windows(0, LEN, Access::REMOTE_READ | Access::REMOTE_WRITE);
    let labels: Vec<String> = (0..4).map(|i| mem.label(i)).collect();
    for i in 1..4 {
        mem.cut(i).await;
    }

    // PUT over rails 0 and 1 (1 dead): stored whole.
    let p = put(&shim, "redone", &[all[0].clone(), all[1].clone()])
        .await
        .unwrap();
    assert_eq!((p.size, p.parts), (LEN as u64, 5));
    assert_eq!(
        sha256(&sdk_get(&sdk, "alice-data", "redone").await),
        sha256(&body)
    );

    // GET over rails 0 and 2 (2 dead): placed whole.
    mem.clear(LEN, 0xEE);
    let g = get(&shim, "redone", &[all[0].clone(), all[2].clone()])
        .await
        .unwrap();
    assert_eq!(g.bytes_placed, LEN as u64);
    assert_eq!(sha256(&mem.read(LEN)), sha256(&body));

    // GET through the agent's own fallback over rails 0 and 3 (3 dead).
    let small = data(3 << 20, 48);
    sdk.put_object()
        .bucket("shared")
        .key("plain")
        .body(small.clone().into())
        .send()
        .await
        .unwrap();
    mem.clear(LEN, 0xEE);
    let msg = pb::GetObjectRequest {
        tenant: "alice".into(),
        bucket: "shared".into(),
        key: "plain".into(),
        range: None,
        destination: all[0].clone(),
        destination_rails: vec![all[3].clone()],
        if_match: String::new(),
    };
    let g = shim
        .inner
        .clone()
        .get_object(shim.req(msg))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(g.bytes_placed, small.len() as u64);
    assert_eq!(g.path, pb::TransferPath::Fallback as i32);
    assert_eq!(mem.read(small.len()), small);

    let m = agent.metrics_text().await;
    assert_eq!(failed_requests(&m), 0.0, "{m}");
    for (i, op) in [(1, "put"), (2, "get"), (3, "get")] {
        let rail = &labels[i];
        assert_eq!(rail_up(&m, rail), Some(0.0), "{rail}:\n{m}");
        let redone = sum(
            &m,
            "s3dma_agent_rail_redone_total",
            &[&format!("op=\"{op}\""), &format!("rail=\"{rail}\"")],
        );
        assert!(redone >= 1.0, "{rail} {op}:\n{m}");
        assert_eq!(rail_bytes(&m, rail, op), 0.0, "{rail}");
    }
    // Rail 0 carried every byte.
    assert_eq!(rail_bytes(&m, &labels[0], "put"), LEN as f64);
    assert_eq!(
        rail_bytes(&m, &labels[0], "get"),
        (LEN + small.len()) as f64
    );
    assert_eq!(rail_up(&m, &labels[0]), Some(1.0));

    // Rail 1 serves again: a failback trial (1 s after it went down, then
    // 2 s, 4 s) brings it back up and it carries bytes again. Each GET is
    // whole meanwhile.
    mem.restore(1, &labels[1]).await;
    let (_w0, t0) = mem.window_on(0, 0, LEN, Access::REMOTE_WRITE);
    let (_w1, t1) = mem.window_on(1, 0, LEN, Access::REMOTE_WRITE);
    let mut back = false;
    for _ in 0..60 {
        let g = get(&shim, "redone", &[t0.clone(), t1.clone()])
            .await
            .unwrap();
        assert_eq!(g.bytes_placed, LEN as u64);
        let m = agent.metrics_text().await;
        if rail_up(&m, &labels[1]) == Some(1.0) {
            assert!(rail_bytes(&m, &labels[1], "get") > 0.0, "{m}");
            back = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert!(back, "rail 1 never came back up");
    assert_eq!(sha256(&mem.read(LEN)), sha256(&body));
    assert_eq!(failed_requests(&agent.metrics_text().await), 0.0);
}

/// Rail tokens that do not fit the request: each refused with
/// InvalidArgument naming the field, before anything moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rail_tokens_that_do_not_fit_are_refused() {
    let Some(target) = rail_target().await else {
        return;
    };
    let agent = Agent::start(spec(&target));
    let shim = agent.client().await;
    let ips: Vec<String> = (1..=9).map(|i| format!("127.0.0.{i}")).collect();
    let ip_refs: Vec<&str> = ips.iter().map(String::as_str).collect();
    let mem = RailMemory::new(1 << 20, &ip_refs).await;
    let body = data(4096, 49);
    mem.fill(&body);
    sdk_put(&target, "there", &body).await;
    let (_ws, t) = mem.windows(0, 4096, Access::REMOTE_READ | Access::REMOTE_WRITE);
    let (_w2, other_size) = mem.windows(0, 8192, Access::REMOTE_READ | Access::REMOTE_WRITE);
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "size",
            vec![other_size[1].clone()],
            "rails[0]: a window of 8192 bytes",
        ),
        (
            "duplicate",
            vec![t[1].clone(), t[1].clone()],
            "rails[1]: names the endpoint",
        ),
        (
            "rail 0 again",
            vec![t[0].clone()],
            "rails[0]: names the endpoint",
        ),
        ("9 rails", t[1..].to_vec(), "rails: 9 rails"),
        (
            "malformed",
            vec!["0000:zz".into()],
            "rails[0] is not a valid x-amz-rdma-token",
        ),
    ];
    for (what, rails, says) in cases {
        mem.clear(4096, 0xEE);
        let mut tokens = vec![t[0].clone()];
        tokens.extend(rails);
        let e = get(&shim, "there", &tokens).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{what}: {e:?}");
        assert!(
            e.message().contains(&format!("destination_{says}")),
            "{what}: {e:?}"
        );
        assert_eq!(mem.read(4096), vec![0xEE; 4096], "{what}: nothing placed");

        let e = put(&shim, "never", &tokens).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{what}: {e:?}");
        assert!(
            e.message().contains(&format!("source_{says}")),
            "{what}: {e:?}"
        );

        // The same in a batch: that item's error, naming the item.
        let msg = pb::PutObjectsRequest {
            tenant: "alice".into(),
            items: vec![pb::PutObjectsItem {
                bucket: "alice-data".into(),
                key: "never".into(),
                source: tokens[0].clone(),
                source_rails: tokens[1..].to_vec(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let r = shim
            .inner
            .clone()
            .put_objects(shim.req(msg))
            .await
            .unwrap()
            .into_inner();
        match &r.results[0].result {
            Some(pb::put_objects_result::Result::Error(e)) => {
                assert_eq!(e.grpc_code, tonic::Code::InvalidArgument as i32, "{what}");
                assert!(
                    e.message.contains(&format!("items[0].source_{says}")),
                    "{what}: {e:?}"
                );
            }
            other => panic!("{what}: {other:?}"),
        }
        let msg = pb::GetObjectsRequest {
            tenant: "alice".into(),
            items: vec![pb::GetObjectsItem {
                bucket: "alice-data".into(),
                key: "there".into(),
                destination: tokens[0].clone(),
                destination_rails: tokens[1..].to_vec(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut stream = shim
            .inner
            .clone()
            .get_objects(shim.req(msg))
            .await
            .unwrap()
            .into_inner();
        let reply = stream.message().await.unwrap().unwrap();
        match reply.result {
            Some(pb::get_objects_reply::Result::Error(e)) => {
                assert_eq!(e.grpc_code, tonic::Code::InvalidArgument as i32, "{what}");
                assert!(
                    e.message.contains(&format!("destination_{says}")),
                    "{what}: {e:?}"
                );
            }
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(mem.read(4096), vec![0xEE; 4096], "{what}: nothing placed");
    }
    // Nothing was stored.
    let e = target
        .s3(ALICE)
        .head_object()
        .bucket("alice-data")
        .key("never")
        .send()
        .await;
    assert!(e.is_err(), "{e:?}");
    // And the rails fit, the same GET goes.
    let g = get(&shim, "there", &t[..2]).await.unwrap();
    assert_eq!(g.bytes_placed, 4096);
}

async fn sdk_put(target: &Target, key: &str, body: &[u8]) {
    target
        .s3(ALICE)
        .put_object()
        .bucket("alice-data")
        .key(key)
        .body(body.to_vec().into())
        .send()
        .await
        .unwrap();
}
