//! A stored object is what was sent, or the call fails: the agent against
//! a hipobj-rc-v2 server of ours (written here) that behaves as elbencho's
//! `s3rdma-server` does with parts: it ignores the query of the part
//! target (`x-amz-rdma-target: /bucket/key?uploadId=…&partNumber=N`) and
//! stores each part sent by RDMA as the whole object, then answers
//! CompleteMultipartUpload with 200 and an empty object (it got no parts
//! for the upload). Its HTTP parts and its single PUTs work.
//!
//! The test plays the shim's RDMA device (the agent's `QueuePairs` link, as
//! in `qp_link`): a WRITE of a slice to the server's staging region is the
//! test copying the tenant's bytes into the server's memory — the
//! hardware is what is missing here, the dialect's requests are real.
//!
//! The first multipart PUT fails with an error naming the server's
//! behaviour, and the wrong object is gone; the next goes over HTTP and
//! stores the bytes exactly; an agent configured `multipart_parts: http`
//! never tries.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::common::*;
use fabric::Access;
use s3dma_proto::agent::v1 as pb;
use tokio::sync::mpsc;

/// What the server holds.
#[derive(Default)]
struct Store {
    /// Objects by `/bucket/key`.
    objects: HashMap<String, Vec<u8>>,
    /// Bytes the test's shim wrote into staging regions, by address.
    staged: HashMap<u64, Vec<u8>>,
    /// Prepared PUT sessions: (target as sent, size, staging address).
    sessions: HashMap<String, (String, u64, u64)>,
    /// HTTP parts of open uploads.
    uploads: HashMap<String, BTreeMap<u32, Vec<u8>>>,
    /// Counter for session ids, staging addresses and upload ids.
    next: u64,
    /// Parts sent by RDMA (READY of a target with a query).
    rdma_parts: u32,
    /// Parts sent over HTTP.
    http_parts: u32,
}

type Shared = Arc<Mutex<Store>>;

/// A 32-hex-digit digest of `b` (the server's ETags).
fn digest(b: &[u8]) -> String {
    use md5::Digest as _;
    hex::encode(md5::Md5::digest(b))
}

/// The server's RC token (as in `qp_link`: QP 0xabcd on ::ffff:127.0.0.2).
fn server_token() -> String {
    let mut b = vec![0x01];
    b.extend(0x0000_abcd_u32.to_le_bytes());
    b.extend(std::net::Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0x7f00, 2]).octets());
    b.extend([0u8; 20]);
    b.push(1);
    b.extend([0u8; 2]);
    hex::encode(b)
}

fn query_value(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name).then(|| percent_decode(v))
    })
}

/// `%XX` decoded (the ids this server hands out are ASCII).
fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(u8::from_str_radix(&v[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// One request to the server.
async fn serve(
    store: Shared,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>> {
    use http_body_util::BodyExt as _;
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or_default().to_owned();
    let h = req.headers().clone();
    let get = |n: &str| {
        h.get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let body = req.into_body().collect().await.unwrap().to_bytes();
    if path == "/.hipobj-rc/ready" {
        // The server's receive completes when the shim's WRITE has landed
        // (the shim writes while READY is in flight).
        let session = get("x-amz-rdma-session");
        let addr = store.lock().unwrap().sessions.get(&session).map(|p| p.2);
        if let Some(addr) = addr {
            let landed = || store.lock().unwrap().staged.contains_key(&addr);
            let wait = async {
                while !landed() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(60), wait)
                .await
                .expect("the shim's WRITE never landed");
        }
    }
    let mut r = hyper::Response::builder().header("x-amz-request-id", "short");
    let mut out = Vec::new();
    let mut s = store.lock().unwrap();
    match (method.as_str(), path.as_str()) {
        ("POST", "/.hipobj-rc/prepare") => {
            assert_eq!(get("x-amz-rdma-op"), "PUT", "this server is for PUTs");
            s.next += 1;
            let n = s.next;
            let session = format!("{n:032x}");
            let addr = 0x7f00_0000_0000 + (n << 32);
            let size: u64 = get("x-amz-rdma-size").parse().unwrap();
            s.sessions
                .insert(session.clone(), (get("x-amz-rdma-target"), size, addr));
            r = r
                .status(200)
                .header("x-amz-rdma-protocol", "hipobj-rc-v2")
                .header("x-amz-rdma-session", session)
                .header("x-amz-rdma-psn", "0a0b0c")
                .header("x-amz-rdma-qpn", "abcd")
                .header("x-amz-rdma-reply", format!("200:{}", server_token()))
                .header("x-amz-rdma-mr-addr", format!("{addr:x}"))
                .header("x-amz-rdma-mr-rkey", "00beef01");
        }
        ("POST", "/.hipobj-rc/ready") => {
            let (target, size, addr) = s.sessions.remove(&get("x-amz-rdma-session")).unwrap();
            let bytes = s.staged.remove(&addr).unwrap_or_default();
            assert_eq!(bytes.len() as u64, size, "the shim wrote the whole slice");
            // elbencho's rule: the target's query is ignored, every part
            // is stored as the whole object.
            let (object, q) = target.split_once('?').unwrap_or((&target, ""));
            if !q.is_empty() {
                s.rdma_parts += 1;
            }
            let etag = format!("\"{}\"", digest(&bytes));
            s.objects.insert(object.to_owned(), bytes);
            r = r
                .status(200)
                .header("x-amz-rdma-protocol", "hipobj-rc-v2")
                .header("x-amz-rdma-cookie", get("x-amz-rdma-cookie"))
                .header("x-amz-rdma-bytes-transferred", size.to_string())
                .header("x-amz-rdma-etag", etag);
        }
        ("POST", "/.hipobj-rc/cancel") => r = r.status(204),
        ("HEAD", _) => match s.objects.get(&path) {
            Some(o) => {
                r = r
                    .status(200)
                    .header("content-length", o.len().to_string())
                    .header("etag", format!("\"{}\"", digest(o)))
                    .header("last-modified", "Sun, 29 Nov 2026 00:00:00 GMT");
            }
            // A HEAD of the bucket (the agent asks which is missing).
            None if path.matches('/').count() == 1 => r = r.status(200),
            None => r = r.status(404),
        },
        ("PUT", _) => {
            if let Some(upload) = query_value(&query, "uploadId") {
                let n: u32 = query_value(&query, "partNumber").unwrap().parse().unwrap();
                s.http_parts += 1;
                r = r.header("etag", format!("\"{}\"", digest(&body)));
                s.uploads
                    .entry(upload)
                    .or_default()
                    .insert(n, body.to_vec());
            } else {
                r = r.header("etag", format!("\"{}\"", digest(&body)));
                s.objects.insert(path, body.to_vec());
            }
            r = r.status(200);
        }
        ("POST", _)
            if query
                .split('&')
                .any(|kv| kv == "uploads" || kv == "uploads=") =>
        {
            s.next += 1;
            let id = format!("upload-{}", s.next);
            s.uploads.insert(id.clone(), BTreeMap::new());
            r = r.status(200);
            out = format!(
                "<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key>\
                 <UploadId>{id}</UploadId></InitiateMultipartUploadResult>"
            )
            .into_bytes();
        }
        ("POST", _) => {
            // CompleteMultipartUpload: the parts this upload got over HTTP
            // (none when they went by RDMA: an empty object), answered 200.
            let id = query_value(&query, "uploadId").unwrap();
            let parts = s.uploads.remove(&id).unwrap_or_default();
            let object: Vec<u8> = parts.values().flatten().copied().collect();
            let etag = if parts.is_empty() {
                format!("\"{}\"", digest(&object))
            } else {
                format!("\"{}-{}\"", digest(&object), parts.len())
            };
            s.objects.insert(path, object);
            r = r.status(200);
            out = format!(
                "<CompleteMultipartUploadResult><ETag>{}</ETag></CompleteMultipartUploadResult>",
                etag.replace('"', "&quot;")
            )
            .into_bytes();
        }
        ("DELETE", _) => {
            if query_value(&query, "uploadId").is_none() {
                s.objects.remove(&path);
            }
            r = r.status(204);
        }
        _ => r = r.status(501),
    }
    r.body(http_body_util::Full::new(out.into())).unwrap()
}

/// Starts the server; its URL.
async fn short_server(store: Shared) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let store = store.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let store = store.clone();
                    async move { Ok::<_, std::convert::Infallible>(serve(store, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

/// Plays the shim's RDMA device over the agent's `QueuePairs` link: a
/// queue pair is the slice it was opened over; a WRITE copies the slice's
/// bytes from `mem` (its window starts at `base`) into the server's
/// staging region.
async fn play_shim(shim: &Shim, mem: Arc<Memory>, base: u64, store: Shared) {
    let (answers, mut rx) = mpsc::channel::<pb::QpEvent>(16);
    let outbound = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let mut commands = shim
        .inner
        .clone()
        .queue_pairs(shim.req(outbound))
        .await
        .unwrap()
        .into_inner();
    tokio::spawn(async move {
        let mut qps: HashMap<u64, fabric::RdmaToken> = HashMap::new();
        while let Ok(Some(cmd)) = commands.message().await {
            let event = match &cmd.command {
                Some(pb::qp_command::Command::Open(o)) => {
                    let t: fabric::RdmaToken = o.window.parse().unwrap();
                    qps.insert(cmd.id, t);
                    Some(pb::qp_event::Event::Opened(pb::QpOpened {
                        qpn: 0x123,
                        gid: std::net::Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0x7f00, 1])
                            .octets()
                            .to_vec(),
                        port: 1,
                        lid: 0,
                        addr: t.addr,
                        rkey: t.rkey,
                        length: t.size,
                    }))
                }
                Some(pb::qp_command::Command::Write(w)) => {
                    let t = qps[&w.qp];
                    let off = usize::try_from(t.addr - base).unwrap();
                    let bytes = mem.read(off, t.size as usize);
                    store.lock().unwrap().staged.insert(w.remote_addr, bytes);
                    Some(pb::qp_event::Event::Done(pb::QpDone {}))
                }
                Some(pb::qp_command::Command::Close(c)) => {
                    qps.remove(&c.qp);
                    None
                }
                None => None,
                Some(_) => Some(pb::qp_event::Event::Done(pb::QpDone {})),
            };
            if let Some(event) = event {
                let _ = answers
                    .send(pb::QpEvent {
                        id: cmd.id,
                        event: Some(event),
                    })
                    .await;
            }
        }
    });
    // The link is open once the agent has it; the first command waits for
    // nothing else.
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// 12 MiB above an 8 MiB threshold: three 5 MiB parts (the last 2 MiB).
const TRANSFER: &str = "retries: 0\nmultipart_threshold: 8MiB\npart_size: 5MiB\n";
const LEN: usize = 12 << 20;

fn agent_for(url: &str, target_yaml: &str) -> Agent {
    let mut spec = AgentSpec::new(vec![TargetSpec {
        name: "elbencho-like",
        endpoint: url.to_owned(),
        buckets: vec!["*"],
        rdma: true,
    }]);
    spec.target_yaml = target_yaml.into();
    spec.transfer = TRANSFER.into();
    Agent::start(spec)
}

/// A multipart PUT to a server that ignores the part target never reports
/// a wrong object stored: the first fails naming the server's behaviour
/// (and the wrong object is deleted), the target is remembered and the
/// next PUT's parts go over HTTP, byte-exact; single PUTs still move by
/// RDMA; `multipart_parts: http` skips the failed first call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ignores_the_part_target_never_gets_a_wrong_object_reported_stored() {
    let store: Shared = Arc::default();
    let url = short_server(store.clone()).await;
    let agent = agent_for(&url, "protocol: hipobj-rc-v2\n");
    let shim = agent.client().await;
    let mem = Arc::new(Memory::new(LEN).await);
    let payload = data(LEN, 45);
    mem.fill(0, &payload);
    let (_w, src) = mem.window(0, LEN, Access::REMOTE_READ);
    let base = src.parse::<fabric::RdmaToken>().unwrap().addr;
    play_shim(&shim, mem.clone(), base, store.clone()).await;

    // The first: every part by RDMA, stored as the whole object, then an
    // empty object after Complete's 200: the call fails.
    let err = shim
        .put("alice", "alice-data", "big", &src)
        .await
        .expect_err("a wrong object reported stored");
    let msg = err.message();
    assert!(
        msg.contains(&format!("stored 0 bytes of {LEN}"))
            && msg.contains("ignores the part target"),
        "{msg}"
    );
    assert!(msg.contains("the wrong object was deleted"), "{msg}");
    {
        let s = store.lock().unwrap();
        assert_eq!(s.rdma_parts, 3);
        assert!(
            !s.objects.contains_key("/alice-data/big"),
            "the wrong object stayed"
        );
    }
    let metrics = agent.metrics_text().await;
    assert_eq!(
        metric_value(&metrics, "s3dma_agent_stored_mismatches_total"),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "s3dma_agent_target_parts_over_http"),
        1.0,
        "{metrics}"
    );

    // Remembered: the next multipart PUT sends its parts over HTTP.
    let put = shim.put("alice", "alice-data", "big", &src).await.unwrap();
    assert_eq!(put.path, pb::TransferPath::Fallback as i32);
    {
        let s = store.lock().unwrap();
        assert_eq!((s.rdma_parts, s.http_parts), (3, 3));
        assert!(s.objects["/alice-data/big"] == payload, "not byte-exact");
    }

    // A single PUT still moves by RDMA, and is stored whole.
    let (_ws, small) = mem.window(0, 3 << 20, Access::REMOTE_READ);
    let put = shim
        .put("alice", "alice-data", "small", &small)
        .await
        .unwrap();
    assert_eq!(put.path, pb::TransferPath::Rdma as i32);
    assert!(store.lock().unwrap().objects["/alice-data/small"] == payload[..3 << 20]);

    // Configured up front: the first multipart PUT's parts go over HTTP.
    let configured = agent_for(&url, "protocol: hipobj-rc-v2\nmultipart_parts: http\n");
    let shim2 = configured.client().await;
    play_shim(&shim2, mem.clone(), base, store.clone()).await;
    let put = shim2
        .put("alice", "alice-data", "big2", &src)
        .await
        .unwrap();
    assert_eq!(put.path, pb::TransferPath::Fallback as i32);
    let s = store.lock().unwrap();
    assert_eq!(s.rdma_parts, 3, "a part went by RDMA");
    assert!(s.objects["/alice-data/big2"] == payload, "not byte-exact");
}
