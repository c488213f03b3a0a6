//! What the socket fuzz ([`super::socket_fuzz`]) starts from: real client
//! byte streams for every listener (recorded through a proxy, signed, or
//! written by hand), and connections that stall at the very start.

use super::*;

/// Every listener of the stack with the transcripts to cut and mutate.
pub(super) async fn listeners(w: &World) -> Vec<Listener> {
    let s3_transcript = {
        let body = b"fuzzed body";
        let mut put = Req::new("PUT", "/alice-data/fuzz/valid");
        put.body = body;
        put.unsigned_payload = false;
        put.keep_alive = true;
        let mut t = w.signer.sign(&put);
        let mut get = Req::new("GET", "/alice-data/obj4k");
        get.keep_alive = true;
        t.extend(w.signer.sign(&get));
        t
    };
    let agent_transcript = record(
        Dest::Tcp(w.agent_addr),
        w.stack.dir.path(),
        |d| async move {
            let Dest::Tcp(a) = d else { unreachable!() };
            let ch = tonic::transport::Channel::from_shared(format!("http://{a}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            let shim = agent::Shim {
                inner: s3dma_proto::agent::v1::agent_client::AgentClient::new(ch),
                token: agent::SHIM_TOKEN.into(),
            };
            shim.inner
                .clone()
                .head_object(shim.req(agent_pb::HeadObjectRequest {
                    tenant: "alice".into(),
                    bucket: "alice-data".into(),
                    key: "obj4k".into(),
                }))
                .await
                .unwrap();
        },
    )
    .await;
    let shim_transcript = record(
        Dest::Unix(w.stack.shim.socket.clone()),
        w.stack.dir.path(),
        |d| async move {
            let Dest::Unix(p) = d else { unreachable!() };
            let mut raw = raw_tenant_client(&p).await;
            raw.info(api::InfoRequest {}).await.unwrap();
            raw.head_object(api::HeadObjectRequest {
                bucket: "alice-data".into(),
                key: "obj4k".into(),
            })
            .await
            .unwrap();
        },
    )
    .await;
    let lease_transcript: Vec<u8> = [
        &s3dma_proto::lease::MAGIC[..],
        &s3dma_proto::lease::FdRequest { seq: 1 }.encode(),
        &s3dma_proto::lease::FdRequest { seq: 2 }.encode(),
    ]
    .concat();
    let fabric_transcript: Vec<u8> = {
        let mut t = Hello {
            version_min: VERSION,
            version_max: VERSION,
            target: fabric::EndpointAddr {
                addr: w.fabric_addr,
                responder: 1,
            },
            session: 7,
            stream: 0,
            streams: 1,
            nonce: [9; 32],
        }
        .encode()
        .to_vec();
        t.extend_from_slice(&[0u8; Auth::LEN]);
        t.extend_from_slice(
            &RequestHeader::whole(OpKind::Write, 0x1234_5678, 1, 0x7f00_0000_0000, 16).encode(),
        );
        t.extend_from_slice(&[0xEE; 16]);
        t
    };
    let metrics_transcript =
        b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\nGET /nothing HTTP/1.1\r\nhost: x\r\n\r\n"
            .to_vec();
    let with_bomb = |t: Vec<u8>| {
        let mut v = vec![t.clone()];
        v.extend(grpc_length_bomb(&t));
        v
    };
    let mut targets: Vec<Listener> = w
        .listeners
        .iter()
        .map(|(who, a, proto)| Listener {
            name: format!("{who} {proto:?} {a}"),
            dest: Dest::Tcp(*a),
            proto: *proto,
            transcripts: match proto {
                Proto::S3 => vec![s3_transcript.clone()],
                Proto::Metrics => vec![metrics_transcript.clone()],
                Proto::AgentGrpc => with_bomb(agent_transcript.clone()),
                Proto::Fabric => vec![fabric_transcript.clone()],
                Proto::ShimSocket => unreachable!(),
            },
        })
        .collect();
    let mut shim_transcripts = with_bomb(shim_transcript.clone());
    shim_transcripts.push(lease_transcript);
    targets.push(Listener {
        name: format!("host-shim socket {}", w.stack.shim.socket.display()),
        dest: Dest::Unix(w.stack.shim.socket.clone()),
        proto: Proto::ShimSocket,
        transcripts: shim_transcripts,
    });
    for t in &targets {
        if matches!(t.proto, Proto::AgentGrpc | Proto::ShimSocket) {
            assert!(
                t.transcripts.len() >= 2,
                "{}: no gRPC DATA frame recorded",
                t.name
            );
        }
    }
    targets
}

/// Records the bytes a real client sends to `upstream` through a proxy.
pub(super) async fn record<F, Fut>(upstream: Dest, dir: &Path, client: F) -> Vec<u8>
where
    F: FnOnce(Dest) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let rec = Arc::new(Mutex::new(Vec::new()));
    let (proxy, task) = match &upstream {
        Dest::Tcp(_) => {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let at = Dest::Tcp(l.local_addr().unwrap());
            let rec = Arc::clone(&rec);
            let up = upstream.clone();
            let task = tokio::spawn(async move {
                let (c, _) = l.accept().await.unwrap();
                let Dest::Tcp(u) = up else { unreachable!() };
                let u = TcpStream::connect(u).await.unwrap();
                pump(c, u, rec).await;
            });
            (at, task)
        }
        Dest::Unix(p) => {
            let path = dir.join(format!("record-{}.sock", rand::random::<u32>()));
            let l = UnixListener::bind(&path).unwrap();
            let rec = Arc::clone(&rec);
            let up = p.clone();
            let task = tokio::spawn(async move {
                let (c, _) = l.accept().await.unwrap();
                let u = UnixStream::connect(up).await.unwrap();
                pump(c, u, rec).await;
            });
            (Dest::Unix(path), task)
        }
    };
    guard("recording a transcript", client(proxy)).await;
    task.abort();
    let v = rec.lock().unwrap().clone();
    assert!(!v.is_empty(), "nothing recorded");
    v
}

pub(super) async fn pump<A, B>(client: A, upstream: B, rec: Arc<Mutex<Vec<u8>>>)
where
    A: AsyncRead + AsyncWrite + Send + 'static,
    B: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let down = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut ur, &mut cw).await;
    });
    let mut b = [0u8; 16384];
    loop {
        match cr.read(&mut b).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                rec.lock().unwrap().extend_from_slice(&b[..n]);
                if uw.write_all(&b[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    down.abort();
}

/// The transcript with its first gRPC message claiming 4 GiB.
pub(super) fn grpc_length_bomb(t: &[u8]) -> Option<Vec<u8>> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut at = t.starts_with(PREFACE).then_some(PREFACE.len())?;
    while at + 9 <= t.len() {
        let len = u32::from_be_bytes([0, t[at], t[at + 1], t[at + 2]]) as usize;
        let (ty, flags, body) = (t[at + 3], t[at + 4], at + 9);
        if body + len > t.len() {
            return None;
        }
        if ty == 0 && len >= 5 && flags & 0x8 == 0 {
            let mut out = t[..body + len].to_vec();
            out[body + 1..body + 5].copy_from_slice(&u32::MAX.to_be_bytes());
            return Some(out);
        }
        at = body + len;
    }
    None
}

/// Connections that stall at the very start (silent, or a strict prefix of
/// the protocol's opening bytes) and must be closed by the server on its
/// own: the fabric and the shim's socket give the first bytes 10 s, HTTP/1
/// servers the request head hyper's 30 s, gRPC servers the HTTP/2 preface
/// (then their keep-alive pings take over).
pub(super) async fn open_stalls(
    targets: &[Listener],
    signer: &Signer,
    target: Proc,
) -> tokio::task::JoinSet<(String, bool)> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut set = tokio::task::JoinSet::new();
    for t in targets {
        let openings: Vec<(&str, &[u8])> = match t.proto {
            Proto::S3 => vec![(
                "half a request head",
                b"GET /alice-data/obj4k HTTP/1.1\r\nhost: x\r\n",
            )],
            Proto::Metrics => vec![("half a request head", b"GET /metrics HTTP/1.1\r\nhos")],
            Proto::AgentGrpc => vec![("part of the HTTP/2 preface", &PREFACE[..20])],
            Proto::ShimSocket => vec![
                ("part of the lease magic", &s3dma_proto::lease::MAGIC[..4]),
                ("part of the HTTP/2 preface", &PREFACE[..20]),
            ],
            Proto::Fabric => vec![("part of a hello", &t.transcripts[0][..20])],
        };
        for (what, bytes) in std::iter::once(("nothing", &b""[..])).chain(openings) {
            let name = format!("{} after {what}", t.name);
            let mut c = Conn::open(&t.dest).await.unwrap();
            c.send(bytes).await;
            set.spawn(async move {
                let closed = c.closed_by_server().await;
                (name, closed)
            });
        }
        let Dest::Tcp(addr) = t.dest else { continue };
        if t.proto != Proto::S3 {
            continue;
        }
        // A signed PUT whose body stops short: RequestTimeout, then closed.
        let body = vec![7u8; 1000];
        let mut put = Req::new("PUT", "/alice-data/stalled-put");
        put.body = &body;
        let put = signer.sign(&put);
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&put[..put.len() - 900]).await.unwrap();
        set.spawn(async move {
            let mut got = Vec::new();
            let r = tokio::time::timeout(HANG_GUARD, s.read_to_end(&mut got)).await;
            let text = String::from_utf8_lossy(&got);
            assert!(
                r.is_err() || text.contains("<Code>RequestTimeout</Code>"),
                "a stalled PUT body: {text}"
            );
            ("S3 after part of a PUT body".to_owned(), r.is_ok())
        });
        // A GET whose (large) response is never read: the target lets go of
        // the connection (its descriptor) on its own.
        let get = signer.sign(&Req::new("GET", "/alice-data/big"));
        // (A small receive buffer, so the response cannot all fit in the
        // kernel's buffers.)
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(16 << 10).unwrap();
        let mut s = sock.connect(addr).await.unwrap();
        s.write_all(&get).await.unwrap();
        let port = s.local_addr().unwrap().port();
        set.spawn(async move {
            let released = tokio::time::timeout(HANG_GUARD, async {
                while target.serves_port(port) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
            .await
            .is_ok();
            drop(s);
            ("S3 with a GET response nobody reads".to_owned(), released)
        });
    }
    set
}
