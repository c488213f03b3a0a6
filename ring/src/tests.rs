use std::os::fd::AsFd as _;
use std::sync::Arc;

use super::*;

fn get(user_data: u64, key: &str) -> Submission {
    Submission {
        user_data,
        op: Op::Get,
        bucket: "b".into(),
        key: key.into(),
        buffer_id: 7,
        offset: 16,
        length: Some(4096),
        range: Some(Range::Bounded {
            first: 0,
            last: 4095,
        }),
    }
}

/// A tenant ring and the shim's view of the same memfd.
fn pair(entries: u32) -> (Arc<Ring>, Arc<Ring>) {
    let (tenant, fd) = Ring::create(entries).unwrap();
    let shim = Ring::attach(fd.as_fd(), MAX_ENTRIES).unwrap();
    (Arc::new(tenant), Arc::new(shim))
}

#[test]
fn entries_round_trip_and_wrap_around() {
    let (tenant, shim) = pair(4);
    let (mut sq, mut taker) = (tenant.submitter(), shim.submissions());
    let (mut done, mut cq) = (shim.completer(), tenant.completions());
    // 10 laps of a 4-entry ring, batches of 3: every counter wraps slots.
    let mut next = 0u64;
    for _ in 0..10 {
        for _ in 0..3 {
            sq.push(&get(next, &format!("k{next}")).encode().unwrap())
                .unwrap();
            next += 1;
        }
        assert_eq!(sq.submit(), 3);
        for i in 0..3 {
            let t = taker.take().unwrap().unwrap();
            let want = next - 3 + i;
            assert_eq!(t.user_data, want);
            assert_eq!(t.request, Ok(get(want, &format!("k{want}"))));
            done.push(&Completion {
                user_data: want,
                size: want * 10,
                etag: "\"abc\"".into(),
                ..Completion::default()
            })
            .unwrap();
        }
        assert!(taker.take().unwrap().is_none());
        assert_eq!(done.publish(), 3);
        for i in 0..3 {
            let c = cq.take().unwrap().unwrap();
            assert_eq!(c.user_data, next - 3 + i);
            assert_eq!(c.size, (next - 3 + i) * 10);
            assert_eq!(c.etag, "\"abc\"");
        }
        assert!(cq.take().unwrap().is_none());
    }
}

#[test]
fn counters_wrap_past_u32_max() {
    let (tenant, shim) = pair(2);
    // Both ends start where the counters are about to wrap.
    for off in [offsets::SQ_HEAD, offsets::SQ_TAIL] {
        tenant.poke_u64(off, u64::from(u32::MAX - 1));
    }
    let mut sq = tenant.submitter();
    let mut taker = Submissions {
        ring: Arc::clone(&shim),
        head: u32::MAX - 1,
    };
    for round in 0..5u64 {
        sq.push(&get(round, "k").encode().unwrap()).unwrap();
        sq.push(&get(round + 100, "k").encode().unwrap()).unwrap();
        assert!(matches!(
            sq.push(&get(0, "k").encode().unwrap()),
            Err(RingError::Full)
        ));
        sq.submit();
        assert_eq!(taker.take().unwrap().unwrap().user_data, round);
        assert_eq!(taker.take().unwrap().unwrap().user_data, round + 100);
        assert!(taker.take().unwrap().is_none());
    }
}

#[test]
fn a_full_ring_refuses_until_consumed() {
    let (tenant, shim) = pair(8);
    let mut sq = tenant.submitter();
    let e = get(1, "k").encode().unwrap();
    for _ in 0..8 {
        sq.push(&e).unwrap();
    }
    assert!(matches!(sq.push(&e), Err(RingError::Full)));
    sq.submit();
    let mut taker = shim.submissions();
    taker.take().unwrap().unwrap();
    assert_eq!(sq.room(), 1);
    sq.push(&e).unwrap();
    // The shim's completions are bounded the same way.
    let mut done = shim.completer();
    for _ in 0..8 {
        done.push(&Completion::default()).unwrap();
    }
    assert!(matches!(
        done.push(&Completion::default()),
        Err(RingError::Full)
    ));
}

#[test]
fn corrupt_indexes_are_refused_not_followed() {
    let (tenant, shim) = pair(4);
    let mut taker = shim.submissions();
    // A tail more than a ring ahead, far ahead, or "behind" the head.
    for tail in [5u64, 1 << 31, u64::from(u32::MAX)] {
        tenant.poke_u64(offsets::SQ_TAIL, tail);
        assert!(matches!(taker.take(), Err(RingError::Corrupt(_))), "{tail}");
    }
    // Exactly a ring ahead is four (garbage) entries, each refused alone.
    tenant.poke_u64(offsets::SQ_TAIL, 4);
    for _ in 0..4 {
        let t = taker.take().unwrap().unwrap();
        assert_eq!(t.request, Err(EntryError::UnknownOp(0)));
    }
    assert!(taker.take().unwrap().is_none());
    // A completion head ahead of the shim's tail.
    let mut done = shim.completer();
    tenant.poke_u64(offsets::CQ_HEAD, 3);
    assert!(matches!(
        done.push(&Completion::default()),
        Err(RingError::Corrupt(_))
    ));
    // The bits above the 32-bit word (the neighbouring padding) are ignored.
    tenant.poke_u64(offsets::CQ_HEAD, 0xffff_ffff_0000_0000);
    done.push(&Completion::default()).unwrap();
    // A broken ring refuses the tenant's pushes.
    shim.mark_broken();
    assert!(matches!(
        tenant.submitter().push(&get(1, "k").encode().unwrap()),
        Err(RingError::Broken)
    ));
}

#[test]
fn hostile_entries_are_refused_one_by_one() {
    let good = get(9, "key").encode().unwrap();
    let mut cases: Vec<([u8; SQE_LEN], EntryError)> = Vec::new();
    let mut e = good;
    e[0] = 9;
    cases.push((e, EntryError::UnknownOp(9)));
    let mut e = good;
    e[1] |= 0x80;
    cases.push((e, EntryError::Reserved));
    let mut e = good;
    e[60] = 1;
    cases.push((e, EntryError::Reserved));
    let mut e = good;
    e[2] = 64;
    cases.push((e, EntryError::BucketTooLong(64)));
    let mut e = good;
    e[4..6].copy_from_slice(&1025u16.to_le_bytes());
    cases.push((e, EntryError::KeyTooLong(1025)));
    let mut e = good;
    e[4..6].copy_from_slice(&u16::MAX.to_le_bytes());
    cases.push((e, EntryError::KeyTooLong(65535)));
    let mut e = good;
    e[128] = 0xff;
    cases.push((e, EntryError::NotUtf8("key")));
    let mut e = good;
    e[1] |= 4; // bounded and from at once
    cases.push((e, EntryError::BadRange));
    let mut e = good;
    e[40..48].copy_from_slice(&10u64.to_le_bytes()); // first 10, last 3
    e[48..56].copy_from_slice(&3u64.to_le_bytes());
    cases.push((e, EntryError::BadRange));
    let mut head = get(9, "key");
    head.op = Op::Head;
    head.range = None;
    cases.push((head.encode().unwrap(), EntryError::HeadWithBuffer));
    let mut put = get(9, "key");
    put.op = Op::Put;
    cases.push((put.encode().unwrap(), EntryError::BadRange));

    let (tenant, shim) = pair(32);
    let mut sq = tenant.submitter();
    for (e, _) in &cases {
        sq.push(e).unwrap();
        sq.push(&good).unwrap();
    }
    sq.submit();
    let mut taker = shim.submissions();
    for (_, want) in &cases {
        let bad = taker.take().unwrap().unwrap();
        assert_eq!(bad.user_data, 9);
        assert_eq!(bad.request.as_ref(), Err(want));
        // The good entry after each bad one is served.
        assert_eq!(taker.take().unwrap().unwrap().request, Ok(get(9, "key")));
    }
    // Too long to encode at all.
    let mut long = get(1, &"k".repeat(MAX_KEY_LEN + 1));
    assert_eq!(long.encode(), Err(EntryError::KeyTooLong(MAX_KEY_LEN + 1)));
    long.key = "k".into();
    long.bucket = "b".repeat(MAX_BUCKET_LEN + 1);
    assert_eq!(
        long.encode(),
        Err(EntryError::BucketTooLong(MAX_BUCKET_LEN + 1))
    );
}

#[test]
fn an_entry_rewritten_while_read_is_checked_as_copied() {
    // One thread flips every word of slot 0 between two valid entries and
    // garbage while the shim's end takes it again and again: each take is
    // one consistent copy, parsed or refused as a whole, never a panic.
    let (tenant, shim) = pair(1);
    let a = get(1, "aaaa").encode().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let (tenant, stop) = (Arc::clone(&tenant), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut x = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for w in 0..SQE_LEN / 8 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    tenant.poke_u64(tenant.sqe_offset(0) + w * 8, x);
                }
            }
        })
    };
    let mut sq = tenant.submitter();
    let mut taker = shim.submissions();
    for _ in 0..2000 {
        sq.push(&a).unwrap();
        sq.submit();
        let t = taker.take().unwrap().unwrap();
        if let Ok(s) = t.request {
            assert!(s.bucket.len() <= MAX_BUCKET_LEN && s.key.len() <= MAX_KEY_LEN);
            // The copy is one consistent entry: a parsed one's lengths are
            // what its own bytes said, re-encoding it gives a valid entry.
            assert_eq!(Submission::decode(&s.encode().unwrap()), Ok(s));
        }
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
}

#[test]
fn attach_refuses_what_is_not_a_ring() {
    // Wrong magic and a header that lies about the count.
    let (tenant, fd) = Ring::create(4).unwrap();
    tenant.poke_u64(offsets::MAGIC, 0);
    assert!(matches!(
        Ring::attach(fd.as_fd(), 64),
        Err(RingError::NotARing(_))
    ));
    tenant.poke_u64(offsets::MAGIC, u64::from_le_bytes(MAGIC));
    tenant.poke_u64(offsets::ENTRIES, 8);
    assert!(matches!(
        Ring::attach(fd.as_fd(), 64),
        Err(RingError::NotARing(_))
    ));
    tenant.poke_u64(offsets::ENTRIES, 4);
    Ring::attach(fd.as_fd(), 64).unwrap();
    // More entries than the tenant may have.
    assert!(matches!(
        Ring::attach(fd.as_fd(), 2),
        Err(RingError::NotARing(_))
    ));
    // Not a memfd; an unsealed memfd; a memfd of no ring's size.
    let file = tempfile::tempfile().unwrap();
    file.set_len(ring_len(4) as u64).unwrap();
    assert!(matches!(
        Ring::attach(file.as_fd(), 64),
        Err(RingError::NotARing(_))
    ));
    let odd = shm::sealed_memfd(ring_len(4) + 8).unwrap();
    assert!(matches!(
        Ring::attach(odd.as_fd(), 64),
        Err(RingError::NotARing(_))
    ));
    let three = shm::sealed_memfd(ring_len(3)).unwrap();
    assert!(matches!(
        Ring::attach(three.as_fd(), 64),
        Err(RingError::NotARing(_))
    ));
    for n in [0, 3, MAX_ENTRIES * 2] {
        assert!(matches!(Ring::create(n), Err(RingError::Entries(_))));
    }
}

#[test]
fn one_wake_for_a_batch_and_the_consumer_drains_before_sleeping() {
    let (tenant, shim) = pair(64);
    let taker_ring = Arc::clone(&shim);
    let consumer = std::thread::spawn(move || {
        let mut taker = taker_ring.submissions();
        let mut got = Vec::new();
        while got.len() < 64 {
            while let Some(t) = taker.take().unwrap() {
                got.push(t.user_data);
            }
            if got.len() < 64 {
                taker.wait(Duration::from_secs(30));
            }
        }
        got
    });
    let mut sq = tenant.submitter();
    for batch in 0..4u64 {
        for i in 0..16 {
            sq.push(&get(batch * 16 + i, "k").encode().unwrap())
                .unwrap();
        }
        assert_eq!(sq.submit(), 16);
    }
    let got = consumer.join().unwrap();
    assert_eq!(got, (0..64).collect::<Vec<_>>());
    // Nobody sleeps now, so publishing wakes nobody.
    let mut done = shim.completer();
    done.push(&Completion::default()).unwrap();
    done.publish();
    assert_eq!(tenant.peek_u64(offsets::CQ_WAKE).unwrap() & 0xffff_ffff, 0);
}

#[test]
fn completions_round_trip_and_long_text_is_cut_or_dropped() {
    let c = Completion {
        user_data: 5,
        status: 5,
        size: 1,
        bytes_placed: 2,
        range_start: 3,
        last_modified_ms: -4,
        parts: 6,
        path: 2,
        etag: "\"e\"".into(),
        reason: "NoSuchKey".into(),
        request_id: "r".repeat(100),
        message: "é".repeat(200),
    };
    let d = Completion::decode(&c.encode()).unwrap();
    assert_eq!(d.message, "é".repeat(MAX_MESSAGE_LEN / 2));
    assert_eq!(d.request_id, "r".repeat(MAX_REQUEST_ID_LEN));
    assert_eq!(
        Completion {
            message: c.message.clone(),
            request_id: c.request_id.clone(),
            ..d
        },
        c
    );
    let long = Completion {
        etag: "x".repeat(MAX_ETAG_LEN + 1),
        ..Completion::default()
    };
    assert_eq!(Completion::decode(&long.encode()).unwrap().etag, "");
    for (at, v) in [(12, 65u8), (13, 33), (15, 2), (53, 65)] {
        let mut bad = c.encode();
        bad[at] = v;
        assert_eq!(
            Completion::decode(&bad),
            Err(EntryError::CompletionLengths),
            "{at}"
        );
    }
    let mut bad = c.encode();
    bad[128] = 0xff;
    assert_eq!(Completion::decode(&bad), Err(EntryError::NotUtf8("reason")));
}
