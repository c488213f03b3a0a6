//! Phase 3, a compromised storage-side peer: it has the fabric key and
//! sees real tokens (the agent routes the bucket `shared` to a fake target
//! in this test). It writes and reads what a live window allows, then tries
//! the bytes around it, thousands of sequential and random rkeys and random
//! addresses, the wrong access, and the token after revocation.

use super::*;

/// The GET window: `dst[WIN_OFF, +WIN)`.
pub(super) const WIN_OFF: usize = 256 << 10;
pub(super) const WIN: usize = 64 << 10;

// ---------------------------------------------------------------------------
// A fake S3 target the agent routes the bucket `shared` to: it hands each
// request (and so each token the shim minted) to the test, which answers
// when it is done with it.

pub(super) struct Captured {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) head: String,
    pub(super) reply: oneshot::Sender<Vec<u8>>,
}

impl Captured {
    pub(super) fn header(&self, name: &str) -> Option<String> {
        header_of(&self.head, name)
    }

    pub(super) fn token(&self) -> RdmaToken {
        self.header("x-amz-rdma-token")
            .unwrap_or_else(|| panic!("no token in {}", self.head))
            .parse()
            .unwrap()
    }
}

pub(super) fn s3_error(status: u16, code: &str) -> Vec<u8> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>from the fake target</Message><RequestId>EVIL</RequestId></Error>"
    );
    format!(
        "HTTP/1.1 {status} Error\r\ncontent-type: application/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

pub(super) struct FakeTarget {
    pub(super) endpoint: String,
    pub(super) rx: mpsc::Receiver<Captured>,
    pub(super) _task: tokio::task::JoinHandle<()>,
}

impl FakeTarget {
    pub(super) async fn start() -> FakeTarget {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", l.local_addr().unwrap());
        let (tx, rx) = mpsc::channel(16);
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let end = loop {
                        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break p;
                        }
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    let mut words = head.split_whitespace();
                    let method = words.next().unwrap_or("").to_owned();
                    let path = words.next().unwrap_or("").to_owned();
                    let (reply, answer) = oneshot::channel();
                    let c = Captured {
                        method,
                        path,
                        head,
                        reply,
                    };
                    let bytes = if tx.send(c).await.is_ok() {
                        answer.await.unwrap_or_else(|_| s3_error(404, "NoSuchKey"))
                    } else {
                        s3_error(404, "NoSuchKey")
                    };
                    let _ = s.write_all(&bytes).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        FakeTarget {
            endpoint,
            rx,
            _task: task,
        }
    }

    pub(super) async fn next(&mut self) -> Captured {
        guard("waiting for the agent's request", self.rx.recv())
            .await
            .expect("fake target stopped")
    }
}

/// Phase 3, with [`super::s3_caller::with_a_live_window`] while the GET
/// window is live. Returns the GET window's token (revoked by then).
pub(super) async fn compromised_storage_peer(
    w: &mut World,
    fake: &mut FakeTarget,
    raw: &RawTenant,
) -> RdmaToken {
    let (s3_addr, fabric_addr) = (w.s3_addr, w.fabric_addr);
    // A GET into dst[256 KiB, +64 KiB): the fake target holds the request.
    let get = {
        let mut raw = raw.clone();
        let id = w.dst.buf.id();
        tokio::spawn(async move {
            raw.get_object(api::GetObjectRequest {
                bucket: "shared".into(),
                key: "evil-get".into(),
                destination: Some(api::BufferSlice {
                    buffer_id: id,
                    offset: WIN_OFF as u64,
                    length: Some(WIN as u64),
                }),
                ..Default::default()
            })
            .await
        })
    };
    let held_get = fake.next().await;
    assert_eq!(
        (held_get.method.as_str(), held_get.path.as_str()),
        ("GET", "/shared/evil-get")
    );
    let tok = held_get.token();
    assert_eq!(tok.size as usize, WIN);
    let ep = tok.endpoint().unwrap();
    assert_eq!(ep.addr, fabric_addr);
    assert_eq!(w.stack.shim.metric("s3dma_shim_windows_open"), 1.0);
    let (a, l, k) = (tok.addr, u64::from(tok.size), tok.rkey);

    // What the window allows, as a control: both ends of it.
    let ops = [Op::write(k, a, 16), Op::write(k, a + l - 16, 16)];
    let got = run_ops(fabric_session(fabric_addr, 1).await, &ops, 0xC0).await;
    assert_eq!(
        got,
        vec![Outcome::Done(None, vec![]); 2],
        "writes inside a live window"
    );
    w.dst.wrote(WIN_OFF, &[0xC0; 16]);
    w.dst.wrote(WIN_OFF + WIN - 16, &[0xC0; 16]);
    w.check("after writes inside the window");

    // Everything around it: reads of a write-only window, bytes just
    // outside, straddling, wrapping, far away.
    let mut ops = vec![
        Op::read(k, a, 16),
        Op::read(k, a, l),
        Op::write(k, a - 1, 1),
        Op::write(k, a - 1, 0),
        Op::write(k, a - 4096, 4096),
        Op::write(k, a + l, 1),
        Op::write(k, a + l - 8, 16),
        Op::write(k, a, l + 1),
        Op::write(k, a - 1, l + 2),
        Op::write(k, a - WIN_OFF as u64, 64),
        Op::write(k, u64::MAX - 7, 8),
        Op::write(k, 0, 16),
    ];
    // Sequential rkeys around the window's and random ones, at the window,
    // at the start of its buffer, and reads; random addresses with the
    // right rkey.
    for d in 1..=1500u32 {
        ops.push(Op::write(k.wrapping_add(d), a, 8));
        ops.push(Op::write(k.wrapping_sub(d), a - WIN_OFF as u64, 8));
    }
    for _ in 0..4000 {
        let r: u32 = w.rng.random();
        if r == k {
            continue;
        }
        ops.push(if w.rng.random() {
            Op::write(r, a + w.rng.random_range(0..l), 8.min(l))
        } else {
            Op::read(r, a + w.rng.random_range(0..l - 8), 8)
        });
    }
    for _ in 0..1500 {
        let addr: u64 = w.rng.random();
        if addr >= a - 64 && addr <= a + l {
            continue;
        }
        ops.push(if w.rng.random() {
            Op::write(k, addr, 8)
        } else {
            Op::read(k, addr, 8)
        });
    }
    let got = run_ops(fabric_session(fabric_addr, 1).await, &ops, 0xBA).await;
    assert_all_refused("guessing around a live GET window", &ops, &got);
    w.check("after guessing around a live GET window");
    // An oversized operation closes the connection.
    let big = [Op::write(k, a, (1 << 30) + 1), Op::write(k, a, 16)];
    let got = run_ops(fabric_session(fabric_addr, 1).await, &big[..1], 0xBA).await;
    assert_eq!(
        got[0],
        Outcome::Done(Some(OpStatus::RemoteInvalidRequest), vec![])
    );

    s3_caller::with_a_live_window(w, tok).await;

    // The request ends: the shim revokes the window.
    held_get.reply.send(s3_error(404, "NoSuchKey")).unwrap();
    let st = guard("the held GET", get).await.unwrap().unwrap_err();
    assert_eq!(reason(&st), (tonic::Code::NotFound, "NoSuchKey".into()));
    assert_eq!(w.stack.shim.metric("s3dma_shim_windows_open"), 0.0);
    let ops = [
        Op::write(k, a, 16),
        Op::read(k, a, 16),
        Op::write(k, a + l - 1, 1),
    ];
    let got = run_ops(fabric_session(fabric_addr, 1).await, &ops, 0xDD).await;
    assert_all_refused("the GET token after revocation", &ops, &got);
    w.get_with(tok.to_string(), "obj4k").await.expect(
        400,
        "RDMATransferFailed",
        "a GET into the revoked window",
    );
    w.check("after the GET window was revoked");

    // A PUT from src[128 KiB, +64 KiB): a read-only window.
    const SRC_OFF: usize = 128 << 10;
    let put = {
        let mut raw = raw.clone();
        let id = w.src.buf.id();
        tokio::spawn(async move {
            raw.put_object(api::PutObjectRequest {
                bucket: "shared".into(),
                key: "evil-put".into(),
                source: Some(api::BufferSlice {
                    buffer_id: id,
                    offset: SRC_OFF as u64,
                    length: Some(WIN as u64),
                }),
                ..Default::default()
            })
            .await
        })
    };
    let held_put = fake.next().await;
    assert_eq!(
        (held_put.method.as_str(), held_put.path.as_str()),
        ("PUT", "/shared/evil-put")
    );
    let ptok = held_put.token();
    let (pa, pl, pk) = (ptok.addr, u64::from(ptok.size), ptok.rkey);
    assert_eq!(pl as usize, WIN);
    // Reading the window is what it is for (control).
    let got = run_ops(
        fabric_session(fabric_addr, 1).await,
        &[Op::read(pk, pa, pl)],
        0,
    )
    .await;
    assert_eq!(
        got,
        vec![Outcome::Done(
            None,
            w.src.want[SRC_OFF..SRC_OFF + WIN].to_vec()
        )]
    );
    let mut ops = vec![
        Op::write(pk, pa, 16),
        Op::write(pk, pa, 0),
        Op::read(pk, pa - 1, 2),
        Op::read(pk, pa + pl, 1),
        Op::read(pk, pa, pl + 1),
        Op::read(pk, pa - SRC_OFF as u64, 4096),
        Op::read(pk, u64::MAX - 7, 8),
    ];
    for _ in 0..2000 {
        let r: u32 = w.rng.random();
        if r != pk {
            ops.push(Op::read(
                r,
                pa - SRC_OFF as u64 + w.rng.random_range(0..1 << 20),
                8,
            ));
        }
    }
    let got = run_ops(fabric_session(fabric_addr, 1).await, &ops, 0xEE).await;
    assert_all_refused("guessing around a live PUT window", &ops, &got);
    // The target asked to write into a read-only window.
    w.get_with(ptok.to_string(), "obj4k").await.expect(
        400,
        "RDMATransferFailed",
        "a GET into a PUT window",
    );
    held_put.reply.send(s3_error(403, "AccessDenied")).unwrap();
    let st = guard("the held PUT", put).await.unwrap().unwrap_err();
    assert_eq!(st.code(), tonic::Code::PermissionDenied, "{st:?}");
    let got = run_ops(
        fabric_session(fabric_addr, 1).await,
        &[Op::read(pk, pa, 16)],
        0,
    )
    .await;
    assert_all_refused(
        "the PUT token after revocation",
        &[Op::read(pk, pa, 16)],
        &got,
    );
    let r = http(
        s3_addr,
        &w.signer
            .sign(&Req::new("PUT", "/alice-data/after-revoke").token(ptok.to_string())),
    )
    .await;
    r.expect(400, "RDMATransferFailed", "a PUT from the revoked window");
    w.check("after the PUT window");
    tok
}
