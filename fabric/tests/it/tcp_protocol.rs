//! tcp-backend specifics: the wire protocol against hand-made peers.

use std::time::Duration;

use fabric::{
    Access, Domain, Endpoint, EndpointConfig, FabricKey, OpStatus, Session, SessionConfig,
};
use s3dma_testkit::fabric_peer::{self, GUARD, Relay, assert_closed, read_response};
use s3dma_wire::frame::{Challenge, Hello, OpKind, RequestHeader, ResponseKind, VERSION, Verdict};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn endpoint(key: &FabricKey) -> (Domain, Endpoint) {
    endpoint_with(key, |_| {}).await
}

async fn endpoint_with(
    key: &FabricKey,
    tweak: impl FnOnce(&mut EndpointConfig),
) -> (Domain, Endpoint) {
    let d = Domain::tcp();
    let mut cfg = EndpointConfig::new("127.0.0.1:0".parse().unwrap(), key.clone());
    tweak(&mut cfg);
    let ep = Endpoint::listen(&d, cfg).await.unwrap();
    (d, ep)
}

/// A hand-rolled authenticated connection, ready for operation frames.
async fn raw_connect(ep: &Endpoint, key: &FabricKey) -> TcpStream {
    fabric_peer::connect(ep.addr(), key).await
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
    let mut frame = RequestHeader::whole(OpKind::Read, 1, 1, 0, 0).encode();
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
    let h = RequestHeader::whole(OpKind::Write, r.rkey(), 5, r.addr(), u64::MAX);
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
    let bad = RequestHeader::whole(OpKind::Write, r.rkey() ^ 1, 1, r.addr(), 100);
    s.write_all(&bad.encode()).await.unwrap();
    s.write_all(&[0xcc; 100]).await.unwrap();
    let good = RequestHeader::whole(OpKind::Write, r.rkey(), 2, r.addr() + 10, 3);
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
    let rd = RequestHeader::whole(OpKind::Read, r.rkey(), 3, r.addr() + 10, 3);
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
    let write = |wr_id: u64, off: u64, len: u64, rkey: u32| {
        RequestHeader::whole(OpKind::Write, rkey, wr_id, r.addr() + off, len)
    };
    let mut batch = Vec::new();
    for i in 0..40u64 {
        batch.extend_from_slice(&write(i, i * 8, 8, r.rkey()).encode());
        batch.extend_from_slice(&[i as u8; 8]);
    }
    batch.extend_from_slice(
        &RequestHeader::whole(OpKind::Read, r.rkey(), 40, r.addr(), 16).encode(),
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

/// The endpoint process of [`helper_endpoint_process`]; killed on drop.
struct Helper(std::process::Child);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts [`helper_endpoint_process`] with `key_hex` and a region of `size`
/// bytes; returns it, its endpoint, and the region's address and rkey.
async fn start_helper(key_hex: &str, size: usize) -> (Helper, fabric::EndpointAddr, u64, u32) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tcp_protocol::helper_endpoint_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FABRIC_HELPER_KEY", key_hex)
        .env("FABRIC_HELPER_SIZE", size.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let child = Helper(child);
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
    (child, target, f[3].parse().unwrap(), f[4].parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_process_killed_mid_transfer() {
    // 4 GiB of traffic through one 16 MiB remote slot: far more than can be
    // in flight when the peer dies right after the first completion.
    const OPS: usize = 256;
    const SZ: usize = 16 << 20;
    let key_bytes: [u8; 32] = rand::random();
    let key_hex: String = key_bytes.iter().map(|b| format!("{b:02x}")).collect();
    let (mut child, target, raddr, rkey) = start_helper(&key_hex, SZ).await;

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

// ---------------------------------------------------------------------------
// Issue 30: relays, idle connections and connection caps.

/// Issue 30 finding 3: a peer without the key gets a requester with the key
/// to dial it and relays the handshake to another endpoint, to keep the
/// authenticated connection and send its own operations. The requester
/// refuses the endpoint's proof (it was made by an endpoint other than the
/// one dialled), the endpoint never accepts the relayed connection, and a
/// requester proof made for the relay's address is refused by the endpoint.
#[tokio::test]
async fn a_relayed_handshake_fails_on_both_ends() {
    let key = FabricKey::random();
    let (d, ep) = endpoint(&key).await;
    let r = d.alloc(8, Access::REMOTE_READ).unwrap();
    r.write_at(0, b"secret!!").unwrap();
    // A peer without the key that requesters dial (its address is in
    // their tokens).
    let relay = Relay::start(ep.addr().addr).await;
    let relay_ep = fabric::EndpointAddr {
        addr: relay.addr,
        responder: 1,
    };
    // The real requester, dialling the relay (as a token naming it says).
    let c = Domain::tcp();
    let l = c.alloc(8, Access::LOCAL_WRITE).unwrap();
    match Session::connect(&c, relay_ep, SessionConfig::new(key.clone())).await {
        Err(e) => assert!(e.to_string().contains("relayed"), "{e}"),
        Ok(s) => {
            // (The unbound handshake: the relay now holds an authenticated
            // connection to the endpoint.)
            let read = s.read(l.as_slice(), r.addr(), r.rkey()).await;
            panic!("a relayed handshake was accepted (read through it: {read:?})");
        }
    }
    assert!(
        !relay.upstream_accepted(),
        "the endpoint accepted a relayed handshake"
    );
    // A requester proof made for the relay's address, sent on by the relay
    // (a requester that went ahead): refused as made for another endpoint.
    let (mut s, hello, ch, v) =
        fabric_peer::handshake(relay_ep, fabric_peer::Proof::Key(&key), (VERSION, VERSION)).await;
    assert!(!key.verify_responder(&hello, &ch));
    assert_eq!(v, Verdict::WrongResponder);
    assert_closed(&mut s).await;
    assert!(!relay.upstream_accepted());
    // Dialled directly, the endpoint serves as before.
    still_serves(&d, &ep, &key).await;
}

/// Issue 30 finding 3: an authenticated connection that sends nothing is
/// closed after the idle timeout (it held a scratch buffer and a descriptor
/// for ever), while a session's stream that carries no operations is kept
/// as long as a sibling stream of its session works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_authenticated_connections_are_closed() {
    let key = FabricKey::random();
    let (d, ep) = endpoint_with(&key, |c| c.idle_timeout = Some(Duration::from_secs(1))).await;
    let r = d
        .alloc(8 << 20, Access::REMOTE_READ | Access::REMOTE_WRITE)
        .unwrap();
    // A lone authenticated connection that used its scratch buffer (a
    // refused WRITE is drained through it), then went quiet.
    let mut s = raw_connect(&ep, &key).await;
    let bad = RequestHeader::whole(OpKind::Write, r.rkey() ^ 1, 1, r.addr(), 100);
    s.write_all(&bad.encode()).await.unwrap();
    s.write_all(&[0; 100]).await.unwrap();
    assert_eq!(
        read_response(&mut s).await.status,
        Some(OpStatus::RemoteAccess)
    );
    assert_closed(&mut s).await;
    // A two-stream session whose operations all go to stream 0 (the first
    // 4 MiB stripe) for three idle timeouts: stream 1 is not closed.
    let c = Domain::tcp();
    let l = c.alloc(4096, Access::LOCAL_WRITE).unwrap();
    let mut cfg = SessionConfig::new(key.clone());
    cfg.streams = 2;
    let sess = Session::connect(&c, ep.addr(), cfg).await.unwrap();
    let busy = tokio::time::Instant::now();
    while busy.elapsed() < Duration::from_secs(3) {
        tokio::time::timeout(GUARD, sess.write(l.as_slice(), r.addr(), r.rkey()))
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(sess.is_alive(), "a busy session lost its quiet stream");
    tokio::time::timeout(
        GUARD,
        sess.write(l.as_slice(), r.addr() + (4 << 20), r.rkey()),
    )
    .await
    .unwrap()
    .unwrap();
}

/// Asserts that the endpoint closed `s` without a word: a hello on it gets
/// no challenge.
async fn assert_refused_at_accept(s: &mut TcpStream, ep: &Endpoint) {
    let hello = Hello {
        version_min: VERSION,
        version_max: VERSION,
        target: ep.addr(),
        session: 1,
        stream: 0,
        streams: 1,
        nonce: [7; 32],
    };
    let _ = s.write_all(&hello.encode()).await;
    let mut b = [0u8; Challenge::LEN];
    let n = tokio::time::timeout(GUARD, s.read(&mut b))
        .await
        .expect("connection left open");
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "a connection past the cap was served: {n:?}"
    );
}

/// Issue 30 finding 6: connections past the endpoint's caps (per peer
/// address, and in all) are closed as soon as they are accepted, while the
/// ones held are served; a place freed is taken again.
#[tokio::test]
async fn connections_past_the_caps_are_closed_at_once() {
    let key = FabricKey::random();
    let (d, ep) = endpoint_with(&key, |c| {
        c.max_connections_per_address = 3;
        c.max_connections = 5;
    })
    .await;
    let from = |ip: &str| {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(format!("{ip}:0").parse().unwrap()).unwrap();
        sock
    };
    // Three authenticated connections from 127.0.0.1 fill its share.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(raw_connect(&ep, &key).await);
    }
    let mut over = from("127.0.0.1").connect(ep.addr().addr).await.unwrap();
    assert_refused_at_accept(&mut over, &ep).await;
    // Two from 127.0.0.2 fill the endpoint; a third address gets nothing.
    let mut other = Vec::new();
    for _ in 0..2 {
        let s = from("127.0.0.2").connect(ep.addr().addr).await.unwrap();
        other.push(s);
    }
    let mut over = from("127.0.0.3").connect(ep.addr().addr).await.unwrap();
    assert_refused_at_accept(&mut over, &ep).await;
    // The held connections are served.
    let mut s = held.pop().unwrap();
    let rd = RequestHeader::whole(OpKind::Read, 1, 9, 0, 1);
    s.write_all(&rd.encode()).await.unwrap();
    assert_eq!(read_response(&mut s).await.wr_id, 9);
    // One closed: its place is taken again, by a real session.
    drop(s);
    drop(other.pop());
    let c = Domain::tcp();
    let mut ok = None;
    for _ in 0..600 {
        // (The endpoint notices the close asynchronously.)
        match Session::connect(&c, ep.addr(), SessionConfig::new(key.clone())).await {
            Ok(s) => {
                ok = Some(s);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert!(ok.is_some(), "a freed place was not given again");
    drop(d);
}

/// Issue 30 finding 3: connections that have not completed the handshake
/// cost no scratch buffer (it is allocated after authentication, when an
/// operation needs it): many half-open ones grow the endpoint's process by
/// far less than a 256 KiB scratch buffer each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_connections_allocate_no_scratch() {
    // (Within the default cap of 256 connections per address.)
    const N: usize = 120;
    const SCRATCH: u64 = 256 << 10;
    let key_bytes: [u8; 32] = rand::random();
    let key_hex: String = key_bytes.iter().map(|b| format!("{b:02x}")).collect();
    let key = FabricKey::new(key_bytes.to_vec()).unwrap();
    let (helper, target, _, _) = start_helper(&key_hex, 4096).await;
    let rss = || {
        let s = std::fs::read_to_string(format!("/proc/{}/status", helper.0.id())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap()
            * 1024
    };
    // (One session first, so the endpoint's own start-up is behind us.)
    let c = Domain::tcp();
    drop(
        Session::connect(&c, target, SessionConfig::new(key.clone()))
            .await
            .unwrap(),
    );
    let before = rss();
    let mut conns = Vec::new();
    for i in 0..N {
        let mut s = TcpStream::connect(target.addr).await.unwrap();
        // Half a hello (or nothing), then silence.
        if i % 2 == 0 {
            s.write_all(&[b'S'; 20]).await.unwrap();
        }
        conns.push(s);
    }
    // The endpoint has taken them all in: a session after them still gets
    // through.
    drop(
        Session::connect(&c, target, SessionConfig::new(key))
            .await
            .unwrap(),
    );
    let grown = rss().saturating_sub(before);
    assert!(
        grown < N as u64 * SCRATCH / 4,
        "{N} unauthenticated connections grew the endpoint by {grown} bytes"
    );
    drop(conns);
}

/// A responder by hand that accepts one connection, completes the
/// handshake as `me` with `key`, and then never reads again (a peer that
/// stopped answering: its receive window closes and stays closed). Its
/// receive buffer is small, so the requester's writes back up at once.
/// Returns its identity and the task, which hands back the stream when
/// `read` fires so the test can look at how the connection ended.
async fn mute_responder(
    key: &FabricKey,
) -> (
    s3dma_wire::EndpointAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<TcpStream>,
) {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let l = sock.listen(1).unwrap();
    let me = s3dma_wire::EndpointAddr {
        addr: l.local_addr().unwrap(),
        responder: 1,
    };
    let key = key.clone();
    let (read, mute) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut b = [0u8; Hello::LEN];
        s.read_exact(&mut b).await.unwrap();
        let hello = Hello::decode(&b).unwrap();
        let nonce = s3dma_wire::handshake::nonce();
        let challenge = Challenge {
            version: VERSION,
            nonce,
            mac: key.responder_proof(&hello, &me, VERSION, &nonce),
        };
        s.write_all(&challenge.encode()).await.unwrap();
        let mut a = [0u8; s3dma_wire::frame::Auth::LEN];
        s.read_exact(&mut a).await.unwrap();
        let auth = s3dma_wire::frame::Auth::decode(&a).unwrap();
        let verdict = key.verdict(&hello, &challenge, &me, &auth.mac);
        assert_eq!(verdict, Verdict::Accepted);
        s.write_all(&verdict.encode()).await.unwrap();
        // Mute until told to look.
        let _ = mute.await;
        s
    });
    (me, read, task)
}

/// Reads everything the requester sends until the connection ends; the
/// error that ended it (`None`: an orderly end of stream).
async fn read_to_end(s: &mut TcpStream) -> Option<std::io::ErrorKind> {
    let mut b = vec![0u8; 1 << 20];
    loop {
        match tokio::time::timeout(GUARD, s.read(&mut b))
            .await
            .expect("the requester left its connection open")
        {
            Ok(0) => return None,
            Ok(_) => {}
            Err(e) => return Some(e.kind()),
        }
    }
}

/// A session whose endpoint stops answering (it no longer reads: the
/// window stays closed and nothing sent is acknowledged) fails within the
/// dead-peer timeout instead of waiting for ever: the operation the peer
/// was working on completes "retry exceeded", later ones "flushed", and
/// the session says it is dead so pools replace it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_to_an_endpoint_that_stopped_answering_fails_within_the_dead_peer_timeout() {
    let key = FabricKey::random();
    let (me, _read, _peer) = mute_responder(&key).await;
    let c = Domain::tcp();
    let l = c.alloc(16 << 20, Access::LOCAL_WRITE).unwrap();
    let mut cfg = SessionConfig::new(key.clone());
    cfg.socket_buffer = Some(64 << 10);
    cfg.dead_peer_timeout = Duration::from_secs(1);
    let s = Session::connect(&c, me, cfg).await.unwrap();
    let first = s.write(l.as_slice(), 0x1000, 7);
    let second = s.write(l.as_slice(), 0x1000, 7);
    let e = tokio::time::timeout(GUARD, first)
        .await
        .expect("the session waited on a dead peer")
        .unwrap_err();
    assert_eq!(e.status, OpStatus::RetryExceeded, "{e}");
    let e = tokio::time::timeout(GUARD, second)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.status, OpStatus::Flushed, "{e}");
    assert!(!s.is_alive());
}

/// A session that fails while a WRITE is queued in its socket (here: the
/// pool's stall detection failing it) closes with a reset: the endpoint
/// never receives the rest of the queued bytes, nor an orderly end of
/// stream after them, so a failed GET chunk is never placed late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_session_resets_its_streams() {
    let key = FabricKey::random();
    let (me, read, peer) = mute_responder(&key).await;
    let c = Domain::tcp();
    let l = c.alloc(16 << 20, Access::LOCAL_WRITE).unwrap();
    let mut cfg = SessionConfig::new(key.clone());
    cfg.socket_buffer = Some(64 << 10);
    let s = Session::connect(&c, me, cfg).await.unwrap();
    let op = s.write(l.as_slice(), 0x1000, 7);
    s.fail();
    let e = tokio::time::timeout(GUARD, op).await.unwrap().unwrap_err();
    assert_eq!(e.status, OpStatus::Flushed, "{e}");
    read.send(()).unwrap();
    let mut stream = peer.await.unwrap();
    assert_eq!(
        read_to_end(&mut stream).await,
        Some(std::io::ErrorKind::ConnectionReset)
    );
}

/// A requester that stops reading the READ data it asked for is dropped
/// by the endpoint within the dead-peer timeout, freeing its connection
/// slot: with a cap of one connection, a new session gets in once the
/// stuck one is gone (before, the endpoint waited on the closed window for
/// ever and refused everyone else).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_drops_a_requester_that_stopped_reading() {
    let key = FabricKey::random();
    let (d, ep) = endpoint_with(&key, |c| {
        c.max_connections = 1;
        c.socket_buffer = Some(64 << 10);
        c.dead_peer_timeout = Duration::from_secs(1);
    })
    .await;
    let r = d.alloc(1 << 20, Access::REMOTE_READ).unwrap();
    let mut stuck = raw_connect(&ep, &key).await;
    socket2::SockRef::from(&stuck)
        .set_recv_buffer_size(4096)
        .unwrap();
    let mut wire = Vec::new();
    for i in 0..16u64 {
        wire.extend_from_slice(
            &RequestHeader::whole(OpKind::Read, r.rkey(), i, r.addr(), 1 << 20).encode(),
        );
    }
    stuck.write_all(&wire).await.unwrap();
    // Never read: the endpoint's READ data backs up. Someone else gets in
    // once the endpoint has given up on `stuck`.
    let c = Domain::tcp();
    let local = c.alloc(8, Access::LOCAL_WRITE).unwrap();
    let s = tokio::time::timeout(GUARD, async {
        loop {
            if let Ok(s) = Session::connect(&c, ep.addr(), SessionConfig::new(key.clone())).await
                && s.read(local.as_slice(), r.addr(), r.rkey()).await.is_ok()
            {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the endpoint kept serving a requester that stopped reading");
    assert!(s.is_alive());
    drop(stuck);
}

#[tokio::test]
async fn dead_peer_timeouts_out_of_range_are_refused() {
    let key = FabricKey::random();
    let c = Domain::tcp();
    for bad in [
        Duration::ZERO,
        Duration::from_millis(500),
        Duration::from_secs(7200),
    ] {
        let mut cfg = EndpointConfig::new("127.0.0.1:0".parse().unwrap(), key.clone());
        cfg.dead_peer_timeout = bad;
        let e = Endpoint::listen(&c, cfg).await.unwrap_err().to_string();
        assert!(e.contains("dead_peer_timeout"), "{e}");
        let mut cfg = SessionConfig::new(key.clone());
        cfg.dead_peer_timeout = bad;
        let target = s3dma_wire::EndpointAddr {
            addr: "127.0.0.1:9".parse().unwrap(),
            responder: 1,
        };
        let e = Session::connect(&c, target, cfg)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("dead_peer_timeout"), "{e}");
    }
}
