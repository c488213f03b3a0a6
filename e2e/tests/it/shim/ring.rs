//! The submission ring (`s3dma-ring`, the shim's `ring` module) against
//! real storage-target, dpu-agent and host-shim processes: the Rust
//! client's GET, PUT and HEAD through its ring, byte-exact; then a hostile
//! tenant writing the ring by hand (bad ops, lengths, offsets, buffer ids,
//! keys, an entry rewritten while the shim reads it, indexes out of range),
//! each entry refused on its own, nothing outside a window touched, and
//! the shim serving another tenant (bob, through his own ring) after it.

use std::collections::HashMap;
use std::os::fd::{AsFd as _, AsRawFd as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::shim::common::*;
use s3dma_client::{Client, ClientOptions, ErrorKind, GetOptions, PutOptions};
use s3dma_ring::{Completion, Completions, Op, Range, Ring, SQE_LEN, Submission, offsets};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;

const GUARD: u8 = 0xAA;

async fn ring_client(socket: &std::path::Path) -> Client {
    let c = Client::connect_with(socket, ClientOptions::new().with_ring(true))
        .await
        .unwrap();
    assert!(c.has_ring(), "the shim refused the client's ring");
    c
}

/// GET, PUT, HEAD through a client's ring, byte-exact against the target.
async fn round_trip(c: &Client, stack_bucket: &str, seed: u64) -> Vec<u8> {
    let body = data(300_000, seed);
    let mut buf = c.alloc(1 << 20).await.unwrap();
    buf.as_mut_slice()[4096..4096 + body.len()].copy_from_slice(&body);
    let put = c
        .put_object_from(
            stack_bucket,
            "ring/obj",
            &buf,
            4096..4096 + body.len(),
            PutOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(put.size, body.len() as u64);
    let head = c.head(stack_bucket, "ring/obj").await.unwrap();
    assert_eq!((head.size, &head.etag), (body.len() as u64, &put.etag));
    buf.as_mut_slice().fill(GUARD);
    let got = c
        .get_object_into(
            stack_bucket,
            "ring/obj",
            &mut buf,
            100,
            GetOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(got.bytes_placed, body.len() as u64);
    assert_eq!(got.object.etag, put.etag);
    let b = buf.as_slice();
    assert_eq!(&b[100..100 + body.len()], &body[..]);
    assert!(
        b[..100]
            .iter()
            .chain(&b[100 + body.len()..])
            .all(|&x| x == GUARD)
    );
    // A ranged GET, and a missing key as the same error gRPC gives.
    let opts = GetOptions {
        range: Some("1000-1999".parse().unwrap()),
        ..GetOptions::default()
    };
    let got = c
        .get_object_into(stack_bucket, "ring/obj", &mut buf, 0, opts)
        .await
        .unwrap();
    assert_eq!((got.bytes_placed, got.range_start), (1000, 1000));
    assert_eq!(&buf.as_slice()[..1000], &body[1000..2000]);
    let missing = c.head(stack_bucket, "ring/none").await.unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_moves_objects_and_refuses_a_hostile_ring_item_by_item() {
    let stack = Stack::start().await;
    let c = ring_client(&stack.shim.socket).await;
    let body = round_trip(&c, "alice-data", 1).await;
    assert_eq!(
        agent::sdk_get(&stack.target.s3(ALICE), "alice-data", "ring/obj").await,
        body
    );

    // Alice's buffer, guard-filled; a hostile ring on a lease of hers.
    let mut buf = c.alloc(64 << 10).await.unwrap();
    buf.as_mut_slice().fill(GUARD);
    let (id, size) = (buf.id(), buf.len() as u64);
    let mut lease = open_lease(&stack.shim.socket).await;
    let (ring, fd) = Ring::create(64).unwrap();
    assert_eq!(pass_ring(&mut lease, fd.as_fd()).await, 0, "ring refused");
    let ring = Arc::new(ring);
    let mut sq = ring.submitter();
    let mut cq = ring.completions();

    let get = |user_data, offset, length| Submission {
        user_data,
        op: Op::Get,
        bucket: "alice-data".into(),
        key: "ring/obj".into(),
        buffer_id: id,
        offset,
        length,
        range: Some(Range::Bounded {
            first: 0,
            last: 999,
        }),
    };
    // The one window: 1000 bytes at 8192.
    let good = get(1, 8192, Some(1000)).encode().unwrap();
    let mut hostile: Vec<(u64, [u8; SQE_LEN], &str)> = Vec::new();
    let mut add = |tag, e: [u8; SQE_LEN], code| hostile.push((tag, e, code));
    add(
        10,
        get(10, 0, None).with_buffer(id ^ 0x5a5a),
        "NoSuchBuffer",
    );
    add(11, get(11, size + 1, None).encode().unwrap(), "OutOfBounds");
    add(
        12,
        get(12, size - 10, Some(u64::MAX)).encode().unwrap(),
        "OutOfBounds",
    );
    add(
        13,
        get(13, u64::MAX, Some(2)).encode().unwrap(),
        "OutOfBounds",
    );
    let mut put = get(14, 0, Some(size + 1));
    put.op = Op::Put;
    put.range = None;
    add(14, put.encode().unwrap(), "OutOfBounds");
    let mut e = good;
    e[0] = 77; // unknown op
    e[8..16].copy_from_slice(&15u64.to_le_bytes());
    add(15, e, "InvalidArgument");
    let mut e = good;
    e[4..6].copy_from_slice(&4000u16.to_le_bytes()); // key length past its field
    e[8..16].copy_from_slice(&16u64.to_le_bytes());
    add(16, e, "InvalidArgument");
    let mut e = good;
    e[1] = 0xff; // unknown flags
    e[8..16].copy_from_slice(&17u64.to_le_bytes());
    add(17, e, "InvalidArgument");
    let mut e = get(18, 0, None);
    e.range = Some(Range::Bounded { first: 5, last: 5 });
    let mut e = e.encode().unwrap();
    e[48..56].copy_from_slice(&1u64.to_le_bytes()); // last before first
    add(18, e, "InvalidArgument");
    let mut e = good;
    e[128] = 0xc3; // a key that is not UTF-8
    e[8..16].copy_from_slice(&19u64.to_le_bytes());
    add(19, e, "InvalidArgument");
    // One batch: every hostile entry, the good one last; one wake.
    for (_, e, _) in &hostile {
        sq.push(e).unwrap();
    }
    sq.push(&good).unwrap();
    assert_eq!(sq.submit() as usize, hostile.len() + 1);
    let done = drain(&mut cq, hostile.len() + 1).await;
    for (tag, _, reason) in &hostile {
        let c = &done[tag];
        assert_ne!(c.status, 0, "entry {tag}: {c:?}");
        assert_eq!(c.reason, *reason, "entry {tag}: {c:?}");
        assert!(c.request_id.starts_with("shim-"), "entry {tag}: {c:?}");
    }
    let ok = &done[&1];
    assert_eq!((ok.status, ok.bytes_placed), (0, 1000), "{ok:?}");
    let b = buf.as_slice();
    assert_eq!(&b[8192..9192], &body[..1000]);
    assert!(
        b[..8192].iter().chain(&b[9192..]).all(|&x| x == GUARD),
        "bytes outside the one window changed"
    );

    // An entry rewritten while the shim reads it: a thread flips the op,
    // flags, name lengths and key words of every slot (never the tag,
    // buffer, offset or length words) while 200 entries go in: each is
    // served or refused as one copy, and none reaches past its window.
    buf.as_mut_slice().fill(GUARD);
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (ring, stop) = (Arc::clone(&ring), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            while !stop.load(Ordering::Relaxed) {
                for slot in 0..ring.entries() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let at = ring.sqe_offset(slot);
                    // Op (GET half the time), flags (the length always
                    // set: the entry's length bounds its window), bucket
                    // and key lengths; then one word of the key.
                    let op = if x & 1 == 0 { 1 } else { (x >> 8) as u8 };
                    let flags = (x >> 16) as u8 | 1;
                    let first = (x & !0xffff) | u64::from(flags) << 8 | u64::from(op);
                    ring.poke_u64(at, first);
                    ring.poke_u64(at + 128 + ((x >> 40) as usize % 128) * 8, x);
                }
            }
        })
    };
    // Completions are reaped while entries go in (the shim runs at most
    // its in-flight cap and stops taking while answers wait for room).
    let mut tags = Vec::new();
    let mut done = HashMap::new();
    tokio::time::timeout(HANG_GUARD, async {
        for i in 0..200u64 {
            let tag = 1000 + i;
            let e = get(tag, 8192, Some(1000)).encode().unwrap();
            while sq.push(&e).is_err() {
                sq.submit();
                reap(&mut cq, &mut done);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            tags.push(tag);
            if i % 16 == 15 {
                sq.submit();
            }
        }
        sq.submit();
        // Every entry completes, once, with its own tag, whatever it read.
        while done.len() < tags.len() {
            reap(&mut cq, &mut done);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the flipped ring hung past the hang guard");
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    assert!(tags.iter().all(|t| done.contains_key(t)));
    let b = buf.as_slice();
    assert!(
        b[..8192].iter().chain(&b[9192..]).all(|&x| x == GUARD),
        "bytes outside the entries' window changed"
    );

    // Indexes out of range: the ring is marked broken, only this one.
    ring.poke_u64(offsets::SQ_TAIL, u64::from(u32::MAX / 2));
    sq.submit();
    ring.kick_submissions();
    let r = Arc::clone(&ring);
    tokio::time::timeout(
        HANG_GUARD,
        tokio::task::spawn_blocking(move || {
            while !r.is_broken() {
                std::thread::sleep(Duration::from_millis(5));
            }
        }),
    )
    .await
    .unwrap()
    .unwrap();
    // A second ring on the same lease is over the per-lease cap.
    let (_, fd2) = Ring::create(4).unwrap();
    assert_ne!(pass_ring(&mut lease, fd2.as_fd()).await, 0);

    // The shim keeps serving: alice over gRPC and her ring client, bob
    // (another tenant) through his own ring in his own process.
    let mut buf2 = c.alloc(4096).await.unwrap();
    let got = c
        .get_object_into(
            "alice-data",
            "ring/obj",
            &mut buf2,
            0,
            GetOptions {
                length: Some(4096),
                range: Some("0-4095".parse().unwrap()),
                ..GetOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(got.bytes_placed, 4096);
    assert_eq!(buf2.as_slice(), &body[..4096]);
    let env = [("E2E_SOCKET", stack.shim.socket.display().to_string())];
    let dir = stack.dir.path().to_owned();
    tokio::task::spawn_blocking(move || {
        run_test_as(&dir, BOB_UID, "shim::ring::child_bob_uses_his_ring", &env)
    })
    .await
    .unwrap();
    assert_eq!(
        agent::sdk_get(&stack.target.s3(ALICE), "bob-data", "ring/obj").await,
        data(300_000, 2)
    );
    drop(lease);
}

/// Run by `ring_moves_objects_and_refuses_a_hostile_ring_item_by_item` as
/// bob: his own ring, after alice's was broken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run in a child process by ring_moves_objects_and_refuses_a_hostile_ring_item_by_item"]
async fn child_bob_uses_his_ring() {
    let c = ring_client(std::path::Path::new(&std::env::var("E2E_SOCKET").unwrap())).await;
    round_trip(&c, "bob-data", 2).await;
}

trait WithBuffer {
    fn with_buffer(self, id: u64) -> [u8; SQE_LEN];
}

impl WithBuffer for Submission {
    /// The entry naming buffer `id` (one the tenant does not hold).
    fn with_buffer(mut self, id: u64) -> [u8; SQE_LEN] {
        self.buffer_id = id;
        self.encode().unwrap()
    }
}

/// Moves every completion waiting into `got` (a tag seen twice fails).
fn reap(cq: &mut Completions, got: &mut HashMap<u64, Completion>) {
    while let Some(c) = cq.take().unwrap() {
        assert!(
            got.insert(c.user_data, c).is_none(),
            "a tag completed twice"
        );
    }
}

/// Collects `n` completions by tag.
async fn drain(cq: &mut Completions, n: usize) -> HashMap<u64, Completion> {
    let mut got = HashMap::new();
    tokio::time::timeout(HANG_GUARD, async {
        while got.len() < n {
            reap(cq, &mut got);
            if got.len() < n {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    })
    .await
    .expect("completions hung past the hang guard");
    got
}

/// Opens a lease by hand; returns the stream after the shim's reply.
async fn open_lease(socket: &std::path::Path) -> UnixStream {
    let mut s = UnixStream::connect(socket).await.unwrap();
    s.write_all(&s3dma_proto::lease::MAGIC).await.unwrap();
    let mut reply = [0u8; s3dma_proto::lease::REPLY_HEADER_LEN];
    s.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[0], 0, "lease refused: {reply:?}");
    s
}

/// Sends an `RG` frame with `fd`; returns the reply's status (0 = taken).
async fn pass_ring(s: &mut UnixStream, fd: std::os::fd::BorrowedFd<'_>) -> u8 {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let frame = s3dma_proto::lease::RingRequest { seq: 7 }.encode();
    let iov = [std::io::IoSlice::new(&frame)];
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    sendmsg::<()>(s.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None).unwrap();
    let mut h = [0u8; s3dma_proto::lease::REPLY_HEADER_LEN];
    s.read_exact(&mut h).await.unwrap();
    let len = usize::from(u16::from_le_bytes([h[2], h[3]]));
    let mut msg = vec![0u8; len];
    s.read_exact(&mut msg).await.unwrap();
    h[0]
}
