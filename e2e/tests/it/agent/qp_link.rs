//! The `QueuePairs` link against the real agent, with the test as the shim
//! (the stream spoken from `agent.proto`, not with the host-shim's code):
//! only an authenticated shim opens one; the agent sends a call's commands
//! only to the shim that made the call; a target that declines
//! hipobj-rc-v2 (a storage-target on tcp answers `501` with
//! `x-amz-rdma-protocol-status: unsupported`) gets the bytes over HTTP,
//! after the agent closed the queue pair it had asked for; a shim that
//! cannot make the queue pair fails the call, and nothing is stored.

use std::time::Duration;

use super::common::*;
use fabric::Access;
use s3dma_proto::agent::v1 as pb;
use tokio::sync::mpsc;
use tonic::Code;

/// A test shim's open `QueuePairs` stream: the commands it got, and a way
/// to answer.
struct Link {
    commands: tonic::Streaming<pb::QpCommand>,
    answers: mpsc::Sender<pb::QpEvent>,
}

async fn open_link(shim: &Shim) -> Result<Link, tonic::Status> {
    let (answers, mut rx) = mpsc::channel::<pb::QpEvent>(16);
    let outbound = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let commands = shim
        .inner
        .clone()
        .queue_pairs(shim.req(outbound))
        .await?
        .into_inner();
    Ok(Link { commands, answers })
}

impl Link {
    /// The next command, if one comes within `wait`.
    async fn next(&mut self, wait: Duration) -> Option<pb::QpCommand> {
        tokio::time::timeout(wait, self.commands.message())
            .await
            .ok()
            .and_then(|m| m.ok().flatten())
    }
}

impl Link {
    /// Answers command `id` with `event`.
    async fn answer(&self, id: u64, event: pb::qp_event::Event) {
        let event = Some(event);
        self.answers.send(pb::QpEvent { id, event }).await.unwrap();
    }
}

/// The answer to an `Open` whose receive slot is `slot`: queue pair 0x123
/// at `::ffff:127.0.0.1`, port 1.
fn opened(slot: &fabric::RdmaToken) -> pb::qp_event::Event {
    pb::qp_event::Event::Opened(pb::QpOpened {
        qpn: 0x123,
        gid: std::net::Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0x7f00, 1])
            .octets()
            .to_vec(),
        port: 1,
        lid: 0,
        addr: slot.addr,
        rkey: slot.rkey,
        length: slot.size,
    })
}

/// The answer that a command failed, saying `message`.
fn failed(message: &str) -> pb::qp_event::Event {
    let message = message.into();
    pb::qp_event::Event::Failed(pb::QpFailed { message })
}

/// What `pick` takes from the first command it picks among `commands`.
fn first<T>(commands: &[pb::QpCommand], pick: impl Fn(&pb::qp_command::Command) -> Option<T>) -> T {
    commands
        .iter()
        .find_map(|c| c.command.as_ref().and_then(&pick))
        .expect("no such command")
}

/// An agent whose one target, `name`, is a [`wire_server`] speaking
/// `target_yaml` (transfers not retried): what the server saw, the agent,
/// a shim client and its open queue-pair stream.
async fn wire_agent(name: &'static str, target_yaml: &str) -> (Shared, Agent, Shim, Link) {
    let seen: Shared = std::sync::Arc::default();
    let url = wire_server(seen.clone()).await;
    let mut spec = AgentSpec::new(vec![TargetSpec {
        name,
        endpoint: url,
        buckets: vec!["*"],
        rdma: true,
    }]);
    spec.target_yaml = target_yaml.into();
    spec.transfer = "retries: 0\n".into();
    let agent = Agent::start(spec);
    let shim = agent.client().await;
    let link = open_link(&shim).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    (seen, agent, shim, link)
}

fn hipobj_agent(target: &Target) -> Agent {
    let mut spec = AgentSpec::one(target);
    spec.target_yaml = "protocol: hipobj-rc-v2\n".into();
    Agent::start(spec)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_pair_commands_reach_only_the_calling_shim_and_a_decline_goes_over_http() {
    let target = Target::start(true);
    target.create_bucket("alice-data").await;
    let agent = hipobj_agent(&target);

    // No credentials: no link.
    let stranger = Agent::shim_for(&agent.addr, "").await;
    let err = open_link(&stranger).await.err().expect("refused");
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let wrong = Agent::shim_for(&agent.addr, "not-a-shim-token").await;
    let err = open_link(&wrong).await.err().expect("refused");
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");

    // host2 (bob's shim) holds a link; alice's calls come from host1.
    let host2 = Agent::shim_for(&agent.addr, "other-shim-token-abcdef0123").await;
    let mut other = open_link(&host2).await.unwrap();
    let host1 = agent.client().await;
    let payload = data(300_000, 3);
    let mem = Memory::new(1 << 20).await;
    mem.fill(0, &payload);
    let (_w, src) = mem.window(0, payload.len(), Access::REMOTE_READ);
    let put = host1.put("alice", "alice-data", "k", &src).await.unwrap();
    // host1 has no link: over HTTP through the agent.
    assert_eq!(put.path, pb::TransferPath::Fallback as i32);
    assert!(
        other.next(Duration::from_millis(300)).await.is_none(),
        "another shim's link got a command"
    );

    // Now host1 opens one: a GET asks it for a queue pair over the
    // window's slice (a receive for the peer's write), then the target
    // declines the dialect and the agent closes the queue pair and reads
    // the bytes over HTTP.
    let mut mine = open_link(&host1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (_w2, dest) = mem.window(512 << 10, 512 << 10, Access::REMOTE_WRITE);
    let get = {
        let host1 = host1.clone();
        let dest = dest.clone();
        tokio::spawn(async move { host1.get("alice", "alice-data", "k", None, &dest).await })
    };
    let open = mine.next(Duration::from_secs(30)).await.expect("an open");
    let Some(pb::qp_command::Command::Open(o)) = open.command else {
        panic!("expected an open, got {open:?}");
    };
    assert!(o.receive, "a GET's queue pair receives the peer's write");
    assert!((1..=0xff_ffff).contains(&o.psn));
    let slot: fabric::RdmaToken = o.window.parse().unwrap();
    let window: fabric::RdmaToken = dest.parse().unwrap();
    assert_eq!(slot.rkey, window.rkey);
    assert_eq!(slot.addr, window.addr);
    assert_eq!(u64::from(slot.size), payload.len() as u64);
    mine.answer(open.id, opened(&slot)).await;
    let close = mine.next(Duration::from_secs(30)).await.expect("a close");
    assert!(
        matches!(close.command, Some(pb::qp_command::Command::Close(pb::QpClose { qp })) if qp == open.id),
        "{close:?}"
    );
    let got = get.await.unwrap().unwrap();
    assert_eq!(got.path, pb::TransferPath::Fallback as i32);
    assert_eq!(got.bytes_placed, payload.len() as u64);
    assert_eq!(
        mem.sha256(512 << 10, payload.len()),
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&payload))
    );
    assert!(
        other.next(Duration::from_millis(200)).await.is_none(),
        "another shim's link got a command"
    );

    // A shim that cannot make the queue pair fails the call: nothing moves
    // and nothing is stored.
    let (_w3, src3) = mem.window(0, 100_000, Access::REMOTE_READ);
    let put = {
        let host1 = host1.clone();
        tokio::spawn(async move { host1.put("alice", "alice-data", "never", &src3).await })
    };
    let open = mine.next(Duration::from_secs(30)).await.expect("an open");
    assert!(matches!(
        open.command,
        Some(pb::qp_command::Command::Open(pb::QpOpen {
            receive: false,
            ..
        }))
    ));
    mine.answer(open.id, failed("100 queue pairs are open already"))
        .await;
    let err = put.await.unwrap().unwrap_err();
    assert!(
        err.message().contains("queue pairs are open already"),
        "{err:?}"
    );
    let s3 = target.s3(ALICE);
    assert!(
        s3.head_object()
            .bucket("alice-data")
            .key("never")
            .send()
            .await
            .is_err(),
        "a failed PUT stored an object"
    );
}

/// What the wire-description server saw and how it answers: the answer to
/// a transfer depends on its object key.
#[derive(Default)]
struct Seen {
    /// ("METHOD path", headers) of every request, in order.
    requests: Vec<(String, http::HeaderMap)>,
}

type Shared = std::sync::Arc<std::sync::Mutex<Seen>>;

/// The server's RC token: QP 0x00abcd on ::ffff:127.0.0.2, port 1 — laid
/// out by hand from the wire description (transport 0x01, QPN 4 bytes
/// little-endian, GID 16, rkey 4, addr 8, length 8, port 1, LID 2).
fn server_token() -> String {
    let mut b = vec![0x01];
    b.extend(0x0000_abcd_u32.to_le_bytes());
    b.extend(std::net::Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0x7f00, 2]).octets());
    b.extend([0u8; 20]);
    b.push(1);
    b.extend([0u8; 2]);
    hex::encode(b)
}

/// A hipobj-rc-v2 server written from the dialect's wire description
/// (hipObject's `v2-wire`, versitygw's `rcroutes`), answering by key:
/// `ok` (the older `200 <token>` spelling), `no-reply` (a 200 PREPARE
/// without `x-amz-rdma-reply`), `short` (a final reply one byte short),
/// `bare-501` (501 without `x-amz-rdma-protocol-status`), `declined`
/// (501, unsupported: then the object over HTTP).
async fn wire_server(seen: Shared) -> String {
    use http_body_util::Full;
    use hyper::body::Bytes;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let seen = seen.clone();
                        async move {
                            let path = req.uri().path().to_owned();
                            let h = req.headers().clone();
                            seen.lock()
                                .unwrap()
                                .requests
                                .push((format!("{} {path}", req.method()), h.clone()));
                            let get = |n: &str| {
                                h.get(n)
                                    .and_then(|v| v.to_str().ok())
                                    .unwrap_or_default()
                                    .to_owned()
                            };
                            let target = get("x-amz-rdma-target");
                            let mut r =
                                hyper::Response::builder().header("x-amz-request-id", "wire");
                            let body = match path.as_str() {
                                "/.hipobj-rc/prepare" => {
                                    r = r.header("x-amz-rdma-protocol", "hipobj-rc-v2");
                                    if target.ends_with("/declined") {
                                        r = r
                                            .status(501)
                                            .header("x-amz-rdma-protocol-status", "unsupported");
                                    } else if target.ends_with("/bare-501") {
                                        r = r.status(501);
                                    } else {
                                        r = r
                                            .status(200)
                                            .header(
                                                "x-amz-rdma-session",
                                                "00112233445566778899aabbccddeeff",
                                            )
                                            .header("x-amz-rdma-psn", "0a0b0c")
                                            .header("x-amz-rdma-qpn", "abcd");
                                        if !target.ends_with("/no-reply") {
                                            r = r.header(
                                                "x-amz-rdma-reply",
                                                format!("200 {}", server_token()),
                                            );
                                        }
                                        if get("x-amz-rdma-op") == "PUT" {
                                            r = r
                                                .header("x-amz-rdma-mr-addr", "7f0000100000")
                                                .header("x-amz-rdma-mr-rkey", "00beef01");
                                        }
                                    }
                                    Bytes::new()
                                }
                                "/.hipobj-rc/ready" => {
                                    // The transfer's size, from the PREPARE of
                                    // this session.
                                    let size: u64 = {
                                        let s = seen.lock().unwrap();
                                        let prep = s
                                            .requests
                                            .iter()
                                            .rev()
                                            .find(|(p, _)| p == "POST /.hipobj-rc/prepare")
                                            .unwrap();
                                        prep.1["x-amz-rdma-size"].to_str().unwrap().parse().unwrap()
                                    };
                                    let short = seen
                                        .lock()
                                        .unwrap()
                                        .requests
                                        .iter()
                                        .rev()
                                        .find(|(p, _)| p == "POST /.hipobj-rc/prepare")
                                        .is_some_and(|(_, ph)| {
                                            ph["x-amz-rdma-target"]
                                                .to_str()
                                                .unwrap()
                                                .ends_with("/short")
                                        });
                                    let bytes = if short { size - 1 } else { size };
                                    r = r
                                        .status(200)
                                        .header("x-amz-rdma-protocol", "hipobj-rc-v2")
                                        .header("x-amz-rdma-cookie", get("x-amz-rdma-cookie"))
                                        .header("x-amz-rdma-bytes-transferred", bytes.to_string())
                                        .header("x-amz-rdma-etag", "\"e1\"");
                                    Bytes::new()
                                }
                                "/.hipobj-rc/cancel" => {
                                    r = r.status(204);
                                    Bytes::new()
                                }
                                _ => {
                                    // HEAD and GET of any object: 3000 bytes;
                                    // a token (of any name) on an object
                                    // request is declined by the reply rules.
                                    r = r
                                        .status(200)
                                        .header("etag", "\"e1\"")
                                        .header("last-modified", "Sun, 29 Nov 2026 00:00:00 GMT");
                                    if h.contains_key("x-amz-rdma-token")
                                        || h.contains_key("x-scal-rdma")
                                    {
                                        r = r
                                            .header("x-amz-rdma-reply", "501")
                                            .header("x-amz-rdma-protocol-status", "unsupported");
                                    }
                                    if req.method() == http::Method::HEAD {
                                        r = r.header("content-length", "3000");
                                        Bytes::new()
                                    } else {
                                        Bytes::from(vec![7u8; 3000])
                                    }
                                }
                            };
                            Ok::<_, std::convert::Infallible>(r.body(Full::new(body)).unwrap())
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

/// Plays the shim: answers every command (open: a made-up QP; the rest:
/// done) and keeps them.
fn answer_everything(mut link: Link) -> tokio::task::JoinHandle<Vec<pb::QpCommand>> {
    tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some(cmd) = link.next(Duration::from_secs(5)).await {
            let event = match &cmd.command {
                Some(pb::qp_command::Command::Open(o)) => Some(opened(&o.window.parse().unwrap())),
                Some(pb::qp_command::Command::Close(_)) | None => None,
                Some(_) => Some(pb::qp_event::Event::Done(pb::QpDone {})),
            };
            if let Some(event) = event {
                let _ = link
                    .answers
                    .send(pb::QpEvent {
                        id: cmd.id,
                        event: Some(event),
                    })
                    .await;
            }
            got.push(cmd);
        }
        got
    })
}

/// The agent as a hipobj-rc-v2 client against a server written from the
/// wire description (the test plays the shim's device): every
/// `x-amz-rdma-*` header signed, the RC token laid out as the peers lay it
/// out, the older `200 <token>` spelling accepted, the server's QP, GID and
/// PSN handed to the shim, the receive checked for the cookie and length,
/// a PUT's write aimed at the staging region; a 200 PREPARE without
/// `x-amz-rdma-reply`, a short final reply and a bare 501 each fail the
/// call (never over HTTP); only 501 with `unsupported` goes over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_speaks_hipobj_rc_v2_as_its_wire_description_says() {
    let (seen, _agent, shim, link) = wire_agent("wire", "protocol: hipobj-rc-v2\n").await;
    let played = answer_everything(link);
    let mem = Memory::new(1 << 20).await;
    let (_w, dest) = mem.window(0, 4096, Access::REMOTE_WRITE);

    let ok = shim
        .get("alice", "alice-data", "dir/ok", None, &dest)
        .await
        .unwrap();
    assert_eq!(ok.path, pb::TransferPath::Rdma as i32);
    assert_eq!(ok.bytes_placed, 3000);
    for key in ["no-reply", "short", "bare-501"] {
        let err = shim
            .get("alice", "alice-data", key, None, &dest)
            .await
            .expect_err(key);
        assert_ne!(err.code(), Code::Ok, "{key}");
    }
    let declined = shim
        .get("alice", "alice-data", "declined", None, &dest)
        .await
        .unwrap();
    assert_eq!(declined.path, pb::TransferPath::Fallback as i32);
    assert_eq!(mem.read(0, 3000), vec![7u8; 3000]);
    let (_ws, src) = mem.window(8192, 5000, Access::REMOTE_READ);
    let put = shim
        .put("alice", "alice-data", "up/ok", &src)
        .await
        .unwrap();
    assert_eq!(put.etag, "\"e1\"");
    assert_eq!(put.path, pb::TransferPath::Rdma as i32);

    let seen = std::mem::take(&mut seen.lock().unwrap().requests);
    let commands = played.await.unwrap();
    // Every control request: the dialect, every x-amz-rdma-* header signed.
    let prepares: Vec<&http::HeaderMap> = seen
        .iter()
        .filter(|(p, _)| p == "POST /.hipobj-rc/prepare")
        .map(|(_, h)| h)
        .collect();
    for (path, h) in seen
        .iter()
        .filter(|(p, _)| p.starts_with("POST /.hipobj-rc/"))
    {
        assert_eq!(h["x-amz-rdma-protocol"], "hipobj-rc-v2", "{path}");
        let auth = h["authorization"].to_str().unwrap();
        let signed = auth
            .split("SignedHeaders=")
            .nth(1)
            .unwrap()
            .split(',')
            .next()
            .unwrap();
        let signed: Vec<&str> = signed.split(';').collect();
        for name in h.keys().filter(|n| n.as_str().starts_with("x-amz-rdma-")) {
            assert!(
                signed.contains(&name.as_str()),
                "{path}: {name} is not signed ({auth})"
            );
        }
    }
    // The first PREPARE: the GET of dir/ok, the RC token laid out by hand.
    let p = prepares[0];
    assert_eq!(p["x-amz-rdma-op"], "GET");
    assert_eq!(p["x-amz-rdma-target"], "/alice-data/dir/ok");
    assert_eq!(p["x-amz-rdma-size"], "3000");
    assert_eq!(p["x-amz-rdma-offset"], "0");
    let token = hex::decode(p["x-amz-rdma-token"].to_str().unwrap()).unwrap();
    assert_eq!(token.len(), 44);
    assert_eq!(token[0], 0x01, "transport RC");
    assert_eq!(u32::from_le_bytes(token[1..5].try_into().unwrap()), 0x123);
    assert_eq!(
        &token[5..21],
        &std::net::Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0x7f00, 1]).octets()
    );
    assert_eq!(token[41], 1, "port");
    let psn = p["x-amz-rdma-psn"].to_str().unwrap();
    assert!(
        psn.len() <= 6 && u32::from_str_radix(psn, 16).unwrap() != 0,
        "{psn}"
    );
    let cookie = u32::from_str_radix(p["x-amz-rdma-cookie"].to_str().unwrap(), 16).unwrap();
    // Its READY names the session, our QP and the window's slice.
    let ready = &seen
        .iter()
        .find(|(p, _)| p == "POST /.hipobj-rc/ready")
        .unwrap()
        .1;
    assert_eq!(
        ready["x-amz-rdma-session"],
        "00112233445566778899aabbccddeeff"
    );
    assert_eq!(ready["x-amz-rdma-qpn"], "123");
    let window: fabric::RdmaToken = dest.parse().unwrap();
    assert_eq!(
        ready["x-amz-rdma-mr-addr"].to_str().unwrap(),
        format!("{:x}", window.addr)
    );
    assert_eq!(
        ready["x-amz-rdma-mr-rkey"].to_str().unwrap(),
        format!("{:x}", window.rkey)
    );
    // The shim was told the server's QP, GID and PSN, then to check the
    // receive for the cookie and the length.
    let connect = commands
        .iter()
        .find_map(|c| match &c.command {
            Some(pb::qp_command::Command::Connect(c)) => Some(c.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(connect.remote_qpn, 0xabcd);
    assert_eq!(connect.remote_psn, 0x0a0b0c);
    assert_eq!(
        connect.remote_gid,
        std::net::Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0x7f00, 2])
            .octets()
            .to_vec()
    );
    let awaited = first(&commands, |c| match c {
        pb::qp_command::Command::AwaitReceive(a) => Some(*a),
        _ => None,
    });
    assert_eq!((awaited.imm, awaited.length), (cookie, 3000));
    // The PUT wrote its slice into the staging region, immediate = cookie.
    let put_prepare = prepares
        .iter()
        .find(|h| h["x-amz-rdma-op"] == "PUT")
        .unwrap();
    assert_eq!(put_prepare["x-amz-rdma-size"], "5000");
    assert!(put_prepare.get("x-amz-rdma-offset").is_none());
    let put_cookie =
        u32::from_str_radix(put_prepare["x-amz-rdma-cookie"].to_str().unwrap(), 16).unwrap();
    let write = first(&commands, |c| match c {
        pb::qp_command::Command::Write(w) => Some(*w),
        _ => None,
    });
    assert_eq!(
        (write.remote_addr, write.remote_rkey, write.imm),
        (0x7f00_0010_0000, 0x00be_ef01, put_cookie)
    );
    // Only the declined key was read over HTTP: a broken reply is never
    // redone over HTTP. None of them was cancelled: two had no session,
    // the short one had reached its data phase.
    let read_over_http: Vec<&str> = seen
        .iter()
        .filter(|(p, _)| p.starts_with("GET /"))
        .map(|(p, _)| p.as_str())
        .collect();
    assert_eq!(read_over_http, ["GET /alice-data/declined"]);
    assert!(!seen.iter().any(|(p, _)| p.ends_with("/.hipobj-rc/cancel")));
}

/// A `cuobject-dc` target: each object request carries the standard token
/// the calling shim minted for exactly its slice, under the target's
/// `token_header`, signed, without s3dma's marker; a declining target (501)
/// gets the bytes over HTTP; when the shim has no DC the request carries
/// no token at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuobject_dc_tokens_come_from_the_calling_shim() {
    let (seen, _agent, shim, mut link) =
        wire_agent("dc", "protocol: cuobject-dc\ntoken_header: x-scal-rdma\n").await;
    let mem = Memory::new(1 << 20).await;
    let (_w, dest) = mem.window(0, 4096, Access::REMOTE_WRITE);
    // The shim's DC target, by hand: addr:size:rkey:lid:dctn:gidflag:gid.
    let minted = |slot: &fabric::RdmaToken| {
        format!(
            "{:016x}:{:08x}:{:08x}:0000:00abcd:1:00000000000000000000ffff0a4d0001",
            slot.addr, slot.size, slot.rkey
        )
    };

    let get = {
        let (shim, dest) = (shim.clone(), dest.clone());
        tokio::spawn(async move { shim.get("alice", "alice-data", "dc/one", None, &dest).await })
    };
    let cmd = link.next(Duration::from_secs(30)).await.expect("a mint");
    let Some(pb::qp_command::Command::MintDcToken(m)) = &cmd.command else {
        panic!("expected a mint, got {cmd:?}");
    };
    let slot: fabric::RdmaToken = m.window.parse().unwrap();
    let window: fabric::RdmaToken = dest.parse().unwrap();
    assert_eq!((slot.addr, slot.rkey), (window.addr, window.rkey));
    let token = minted(&slot);
    let event = pb::qp_event::Event::DcToken(pb::QpDcToken {
        token: token.clone(),
    });
    link.answer(cmd.id, event).await;
    let got = get.await.unwrap().unwrap();
    assert_eq!(
        got.path,
        pb::TransferPath::Fallback as i32,
        "declined: over HTTP"
    );
    assert_eq!(mem.read(0, 3000), vec![7u8; 3000]);

    // The shim has no DC: the next request carries no token.
    let get = {
        let (shim, dest) = (shim.clone(), dest.clone());
        tokio::spawn(async move { shim.get("alice", "alice-data", "dc/two", None, &dest).await })
    };
    let cmd = link.next(Duration::from_secs(30)).await.expect("a mint");
    link.answer(
        cmd.id,
        failed("this host has no DC target: rxe0 is not an mlx5 device"),
    )
    .await;
    let got = get.await.unwrap().unwrap();
    assert_eq!(got.path, pb::TransferPath::Fallback as i32);

    let seen = std::mem::take(&mut seen.lock().unwrap().requests);
    let gets: Vec<&(String, http::HeaderMap)> = seen
        .iter()
        .filter(|(p, _)| p.starts_with("GET /"))
        .collect();
    let one = gets.iter().find(|(p, _)| p.ends_with("/dc/one")).unwrap();
    assert_eq!(one.1["x-scal-rdma"], token.as_str());
    assert!(one.1.get("x-amz-rdma-token").is_none());
    assert!(
        one.1.get("x-amz-rdma-protocol").is_none(),
        "no s3dma marker"
    );
    let auth = one.1["authorization"].to_str().unwrap();
    assert!(auth.contains("x-scal-rdma"), "the token is signed: {auth}");
    let two = gets.iter().find(|(p, _)| p.ends_with("/dc/two")).unwrap();
    assert!(two.1.get("x-scal-rdma").is_none(), "no DC: no token");
}
