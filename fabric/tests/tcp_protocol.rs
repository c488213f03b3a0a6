//! tcp-backend specifics: the wire protocol against hand-made peers.

use std::time::Duration;

use fabric::{
    Access, Domain, Endpoint, EndpointConfig, FabricKey, OpStatus, Session, SessionConfig,
};
use s3dma_wire::frame::{
    Auth, Challenge, Hello, OpKind, RequestHeader, ResponseHeader, ResponseKind, VERSION, Verdict,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const GUARD: Duration = Duration::from_secs(60);

async fn endpoint(key: &FabricKey) -> (Domain, Endpoint) {
    let d = Domain::tcp();
    let ep = Endpoint::listen(
        &d,
        EndpointConfig::new("127.0.0.1:0".parse().unwrap(), key.clone()),
    )
    .await
    .unwrap();
    (d, ep)
}

/// A hand-rolled authenticated connection, ready for operation frames.
async fn raw_connect(ep: &Endpoint, key: &FabricKey) -> TcpStream {
    let mut s = TcpStream::connect(ep.addr().addr).await.unwrap();
    let hello = Hello {
        version_min: VERSION,
        version_max: VERSION,
        responder: ep.addr().responder,
        session: 1,
        stream: 0,
        streams: 1,
        nonce: [7; 32],
    };
    s.write_all(&hello.encode()).await.unwrap();
    let mut b = [0u8; Challenge::LEN];
    s.read_exact(&mut b).await.unwrap();
    let c = Challenge::decode(&b).unwrap();
    assert!(key.verify_responder(&hello, &c));
    s.write_all(
        &Auth {
            mac: key.requester_proof(&hello, &c),
        }
        .encode(),
    )
    .await
    .unwrap();
    let mut v = [0u8; Verdict::LEN];
    s.read_exact(&mut v).await.unwrap();
    assert_eq!(Verdict::decode(&v).unwrap(), Verdict::Accepted);
    s
}

async fn read_response(s: &mut TcpStream) -> ResponseHeader {
    let mut b = [0u8; ResponseHeader::LEN];
    s.read_exact(&mut b).await.unwrap();
    ResponseHeader::decode(&b).unwrap()
}

async fn assert_closed(s: &mut TcpStream) {
    let mut b = [0u8; 64];
    let n = tokio::time::timeout(GUARD, s.read(&mut b))
        .await
        .expect("connection left open");
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "expected the responder to close, got {n:?}"
    );
}

async fn still_serves(d: &Domain, ep: &Endpoint, key: &FabricKey) {
    let r = d.alloc(8, Access::REMOTE_READ).unwrap();
    r.write_at(0, b"still ok").unwrap();
    let c = Domain::tcp();
    let l = c.alloc(8, Access::LOCAL_WRITE).unwrap();
    let s = Session::connect(&c, ep.addr(), SessionConfig::new(key.clone()))
        .await
        .unwrap();
    tokio::time::timeout(GUARD, s.read(l.as_slice(), r.addr(), r.rkey()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(l.as_slice().to_vec().unwrap(), b"still ok");
}

#[tokio::test]
async fn garbage_instead_of_hello_is_dropped_and_others_are_served() {
    let key = FabricKey::random();
    let (d, ep) = endpoint(&key).await;
    let mut s = TcpStream::connect(ep.addr().addr).await.unwrap();
    s.write_all(&[0xffu8; 200]).await.unwrap();
    assert_closed(&mut s).await;
    still_serves(&d, &ep, &key).await;
}

#[tokio::test]
async fn bad_frame_after_handshake_closes_the_connection() {
    let key = FabricKey::random();
    let (d, ep) = endpoint(&key).await;
    let mut s = raw_connect(&ep, &key).await;
    let mut frame = RequestHeader {
        op: OpKind::Read,
        rkey: 1,
        wr_id: 1,
        addr: 0,
        len: 0,
    }
    .encode();
    frame[0] = 77; // unknown opcode
    s.write_all(&frame).await.unwrap();
    assert_closed(&mut s).await;
    still_serves(&d, &ep, &key).await;
}

#[tokio::test]
async fn oversized_request_is_refused_as_invalid_and_closed() {
    let key = FabricKey::random();
    let (d, ep) = endpoint(&key).await;
    let r = d.alloc(4096, Access::REMOTE_WRITE).unwrap();
    let mut s = raw_connect(&ep, &key).await;
    let h = RequestHeader {
        op: OpKind::Write,
        rkey: r.rkey(),
        wr_id: 5,
        addr: r.addr(),
        len: u64::MAX,
    };
    s.write_all(&h.encode()).await.unwrap();
    let resp = read_response(&mut s).await;
    assert_eq!(resp.kind, ResponseKind::Completion);
    assert_eq!(resp.status, Some(OpStatus::RemoteInvalidRequest));
    assert_eq!(resp.wr_id, 5);
    assert_closed(&mut s).await;
    still_serves(&d, &ep, &key).await;
}

#[tokio::test]
async fn refused_write_payload_is_drained_and_the_connection_survives() {
    let key = FabricKey::random();
    let (d, ep) = endpoint(&key).await;
    let r = d
        .alloc(4096, Access::REMOTE_READ | Access::REMOTE_WRITE)
        .unwrap();
    let mut s = raw_connect(&ep, &key).await;
    // Wrong rkey with a payload: refused, payload skipped, stream stays in sync.
    let bad = RequestHeader {
        op: OpKind::Write,
        rkey: r.rkey() ^ 1,
        wr_id: 1,
        addr: r.addr(),
        len: 100,
    };
    s.write_all(&bad.encode()).await.unwrap();
    s.write_all(&[0xcc; 100]).await.unwrap();
    let good = RequestHeader {
        op: OpKind::Write,
        rkey: r.rkey(),
        wr_id: 2,
        addr: r.addr() + 10,
        len: 3,
    };
    s.write_all(&good.encode()).await.unwrap();
    s.write_all(b"abc").await.unwrap();
    let a = read_response(&mut s).await;
    assert_eq!((a.wr_id, a.status), (1, Some(OpStatus::RemoteAccess)));
    let b = read_response(&mut s).await;
    assert_eq!((b.wr_id, b.status), (2, None));
    let mut got = [0u8; 13];
    r.read_at(0, &mut got).unwrap();
    assert_eq!(&got[..10], &[0; 10]);
    assert_eq!(&got[10..], b"abc");
    // READ answers with data then the completion.
    let rd = RequestHeader {
        op: OpKind::Read,
        rkey: r.rkey(),
        wr_id: 3,
        addr: r.addr() + 10,
        len: 3,
    };
    s.write_all(&rd.encode()).await.unwrap();
    let h = read_response(&mut s).await;
    assert_eq!((h.kind, h.len), (ResponseKind::ReadData, 3));
    let mut data = [0u8; 3];
    s.read_exact(&mut data).await.unwrap();
    assert_eq!(&data, b"abc");
    let c = read_response(&mut s).await;
    assert_eq!(
        (c.kind, c.wr_id, c.status),
        (ResponseKind::Completion, 3, None)
    );
}

/// Small operations sent back to back: the responder may hold their
/// completions back while the next request is readable, but every answer
/// comes, in posting order, a READ's data after the completions before it;
/// and a lone operation is answered without anything following it.
#[tokio::test]
async fn pipelined_small_operations_are_answered_in_order() {
    let key = FabricKey::random();
    let (d, ep) = endpoint(&key).await;
    let r = d
        .alloc(1 << 20, Access::REMOTE_READ | Access::REMOTE_WRITE)
        .unwrap();
    let mut s = raw_connect(&ep, &key).await;
    // 40 WRITEs (more than the responder holds back at once), one READ of
    // the first WRITE's bytes, a refused WRITE, a large WRITE and 3 more
    // small WRITEs, all in one send.
    let write = |wr_id: u64, off: u64, len: u64, rkey: u32| RequestHeader {
        op: OpKind::Write,
        rkey,
        wr_id,
        addr: r.addr() + off,
        len,
    };
    let mut batch = Vec::new();
    for i in 0..40u64 {
        batch.extend_from_slice(&write(i, i * 8, 8, r.rkey()).encode());
        batch.extend_from_slice(&[i as u8; 8]);
    }
    batch.extend_from_slice(
        &RequestHeader {
            op: OpKind::Read,
            rkey: r.rkey(),
            wr_id: 40,
            addr: r.addr(),
            len: 16,
        }
        .encode(),
    );
    batch.extend_from_slice(&write(41, 0, 8, r.rkey() ^ 1).encode());
    batch.extend_from_slice(&[0xee; 8]);
    batch.extend_from_slice(&write(42, 4096, 200 << 10, r.rkey()).encode());
    batch.extend(std::iter::repeat_n(0x42u8, 200 << 10));
    for i in 43..46u64 {
        batch.extend_from_slice(&write(i, 1000 + i, 1, r.rkey()).encode());
        batch.push(i as u8);
    }
    s.write_all(&batch).await.unwrap();
    let answers = async {
        for i in 0..40u64 {
            let c = read_response(&mut s).await;
            assert_eq!(
                (c.kind, c.wr_id, c.status, c.len),
                (ResponseKind::Completion, i, None, 8)
            );
        }
        let h = read_response(&mut s).await;
        assert_eq!((h.kind, h.wr_id, h.len), (ResponseKind::ReadData, 40, 16));
        let mut data = [0u8; 16];
        s.read_exact(&mut data).await.unwrap();
        assert_eq!(&data, &[0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]);
        let c = read_response(&mut s).await;
        assert_eq!(
            (c.kind, c.wr_id, c.status),
            (ResponseKind::Completion, 40, None)
        );
        let c = read_response(&mut s).await;
        assert_eq!((c.wr_id, c.status), (41, Some(OpStatus::RemoteAccess)));
        for i in 42..46u64 {
            let c = read_response(&mut s).await;
            assert_eq!(
                (c.kind, c.wr_id, c.status),
                (ResponseKind::Completion, i, None)
            );
        }
    };
    tokio::time::timeout(GUARD, answers)
        .await
        .expect("an answer never came");
    let mut big = vec![0u8; 200 << 10];
    r.read_at(4096, &mut big).unwrap();
    assert!(big.iter().all(|b| *b == 0x42));
    // One more lone WRITE, nothing after it: answered all the same.
    s.write_all(&write(46, 0, 1, r.rkey()).encode())
        .await
        .unwrap();
    s.write_all(b"z").await.unwrap();
    let c = tokio::time::timeout(GUARD, read_response(&mut s))
        .await
        .expect("a lone WRITE was never answered");
    assert_eq!((c.wr_id, c.status), (46, None));
}

#[tokio::test]
async fn an_impostor_endpoint_without_the_key_is_refused_by_the_requester() {
    let key = FabricKey::random();
    let (_d, ep) = endpoint(&key).await;
    let c = Domain::tcp();
    // The endpoint has `key`; a requester with another key must not trust it
    // (and is refused by it).
    let err = Session::connect(&c, ep.addr(), SessionConfig::new(FabricKey::random()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("key"), "{err}");
}

#[tokio::test]
async fn truncated_handshake_times_out_or_closes_without_hurting_others() {
    let key = FabricKey::random();
    let (d, ep) = endpoint(&key).await;
    // Half a hello, then keep the socket open: others are still served.
    let mut s = TcpStream::connect(ep.addr().addr).await.unwrap();
    s.write_all(&[b'S'; 10]).await.unwrap();
    still_serves(&d, &ep, &key).await;
    drop(s);
}

#[tokio::test]
async fn local_slice_from_another_domain_is_a_local_error() {
    let key = FabricKey::random();
    let (d, ep) = endpoint(&key).await;
    let r = d.alloc(16, Access::REMOTE_WRITE).unwrap();
    let c = Domain::tcp();
    let other = Domain::tcp().alloc(16, Access::LOCAL_WRITE).unwrap();
    let s = Session::connect(&c, ep.addr(), SessionConfig::new(key))
        .await
        .unwrap();
    let e = s
        .write(other.as_slice(), r.addr(), r.rkey())
        .await
        .unwrap_err();
    assert_eq!(e.status, OpStatus::LocalError);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_during_a_large_write_stops_placement() {
    let key = FabricKey::random();
    let (d, ep) = endpoint(&key).await;
    const SZ: usize = 256 << 20;
    let r = d.alloc(SZ, Access::REMOTE_WRITE).unwrap();
    let w = r.window(0, SZ, Access::REMOTE_WRITE, None).unwrap();
    let c = Domain::tcp();
    let l = c.alloc(SZ, Access::LOCAL_WRITE).unwrap();
    l.write_at(0, &[1]).unwrap();
    l.write_at(SZ - 1, &[1]).unwrap();
    let s = Session::connect(&c, ep.addr(), SessionConfig::new(key))
        .await
        .unwrap();
    let op = s.write(l.as_slice(), w.addr(), w.rkey());
    // Wait for the first byte to land, then revoke.
    loop {
        let mut b = [0u8; 1];
        r.read_at(0, &mut b).unwrap();
        if b[0] == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    w.revoke();
    // Snapshot right after revoke() returned: nothing may change afterwards.
    let mut after = vec![0u8; SZ];
    r.read_at(0, &mut after).unwrap();
    let res = tokio::time::timeout(GUARD, op).await.unwrap();
    let mut later = vec![0u8; SZ];
    r.read_at(0, &mut later).unwrap();
    assert!(after == later, "bytes landed after revoke() returned");
    if let Err(e) = res {
        assert_eq!(e.status, OpStatus::RemoteAccess);
    }
    // The session survives a refused operation on tcp.
    assert!(s.is_alive());
}

/// Runs an endpoint in a child process (this test binary re-executed) so that
/// a peer can be killed for real with SIGKILL.
#[test]
#[ignore = "helper process for peer_process_killed_mid_transfer; does nothing when run directly"]
fn helper_endpoint_process() {
    let (Ok(key_hex), Ok(size)) = (
        std::env::var("FABRIC_HELPER_KEY"),
        std::env::var("FABRIC_HELPER_SIZE"),
    ) else {
        return;
    };
    let key: Vec<u8> = (0..key_hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&key_hex[i..i + 2], 16).unwrap())
        .collect();
    let size: usize = size.parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let d = Domain::tcp();
        let r = d.alloc(size, Access::REMOTE_WRITE).unwrap();
        let ep = Endpoint::listen(
            &d,
            EndpointConfig::new("127.0.0.1:0".parse().unwrap(), FabricKey::new(key).unwrap()),
        )
        .await
        .unwrap();
        println!(
            "ENDPOINT {} {} {} {}",
            ep.addr().addr,
            ep.addr().responder,
            r.addr(),
            r.rkey()
        );
        use std::io::Write;
        std::io::stdout().flush().unwrap();
        // Serve until killed.
        std::future::pending::<()>().await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_process_killed_mid_transfer() {
    use std::io::BufRead;
    // 4 GiB of traffic through one 16 MiB remote slot: far more than can be
    // in flight when the peer dies right after the first completion.
    const OPS: usize = 256;
    const SZ: usize = 16 << 20;
    let key_bytes: [u8; 32] = rand::random();
    let key_hex: String = key_bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_endpoint_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FABRIC_HELPER_KEY", &key_hex)
        .env("FABRIC_HELPER_SIZE", SZ.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Kill the helper even if an assertion below fails.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().unwrap();
    let mut child = KillOnDrop(child);
    let line = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map(|l| l.unwrap())
            .find_map(|l| l.find("ENDPOINT ").map(|i| l[i..].to_string()))
            .expect("helper printed its endpoint")
    })
    .await
    .unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    let target = fabric::EndpointAddr {
        addr: f[1].parse().unwrap(),
        responder: f[2].parse().unwrap(),
    };
    let (raddr, rkey): (u64, u32) = (f[3].parse().unwrap(), f[4].parse().unwrap());

    let c = Domain::tcp();
    let l = c.alloc(SZ, Access::LOCAL_WRITE).unwrap();
    let s = Session::connect(
        &c,
        target,
        SessionConfig::new(FabricKey::new(key_bytes.to_vec()).unwrap()),
    )
    .await
    .unwrap();
    let mut ops: Vec<_> = (0..OPS)
        .map(|_| s.write(l.as_slice(), raddr, rkey))
        .collect();
    // The first write completing proves the peer is serving; kill it now.
    let first = ops.remove(0);
    tokio::time::timeout(GUARD, first).await.unwrap().unwrap();
    child.0.kill().unwrap();
    let _ = child.0.wait();
    let results = tokio::time::timeout(GUARD, futures::future::join_all(ops))
        .await
        .expect("operations hung");
    let first_fail = results
        .iter()
        .position(|r| r.is_err())
        .expect("a killed peer must fail operations");
    let summary: Vec<String> = results
        .iter()
        .map(|r| match r {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("{:?}", e.status),
        })
        .collect();
    for r in &results[first_fail..] {
        let e = r
            .as_ref()
            .expect_err("completions after a failure must fail too");
        assert!(
            matches!(e.status, OpStatus::RetryExceeded | OpStatus::Flushed),
            "{e}; all: {summary:?}"
        );
    }
    assert!(!s.is_alive());
}
