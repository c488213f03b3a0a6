//! A tenant of the storage-target signing requests to it itself (with
//! [`super::s3_http`]): while a window is live, tokens bent outside it,
//! pointed at other sockets, with the signature tampered with, or replayed
//! with an old signature or an expired presigned URL (phase 3); malformed
//! `x-amz-rdma-token` headers (random, truncated, wrong shape or "version",
//! non-ASCII, duplicated) and an expired window: clear S3 errors, nothing
//! written or stored (phase 4).

use super::*;

/// The real storage-target, asked by a signed tenant request to write
/// where the live GET window `tok` does not reach, or to use it wrongly.
pub(super) async fn with_a_live_window(w: &mut World, tok: RdmaToken) {
    let (s3_addr, fabric_addr) = (w.s3_addr, w.fabric_addr);
    let l = u64::from(tok.size);
    let obj4k = data(4096, 11);
    let bent = |f: &dyn Fn(&mut RdmaToken)| {
        let mut t = tok;
        f(&mut t);
        t.to_string()
    };
    let r = w.get_with(tok.to_string(), "obj4k").await;
    assert_eq!(
        r.status,
        200,
        "the window itself, as a control: {}",
        r.text()
    );
    assert_eq!(
        r.header("x-amz-rdma-bytes-transferred").as_deref(),
        Some("4096")
    );
    w.dst.wrote(WIN_OFF, &obj4k);
    w.check("after a GET into the window");
    // A PUT would read the destination buffer: the window is write-only.
    let put = w
        .signer
        .sign(&Req::new("PUT", "/alice-data/stolen").token(tok.to_string()));
    http(s3_addr, &put)
        .await
        .expect(400, "RDMATransferFailed", "PUT from a GET window");
    for (what, t, key, status, code) in [
        (
            "before the window",
            bent(&|t| {
                t.addr -= 4096;
                t.size = 8192
            }),
            "obj4k",
            400,
            "RDMATransferFailed",
        ),
        (
            "straddling its end",
            bent(&|t| t.addr += l - 100),
            "obj4k",
            400,
            "RDMATransferFailed",
        ),
        (
            "longer than it",
            bent(&|t| t.size += 4096),
            "obj68k",
            400,
            "RDMATransferFailed",
        ),
        (
            "an object bigger than it",
            tok.to_string(),
            "obj68k",
            400,
            "InvalidRequest",
        ),
        (
            "the next rkey",
            bent(&|t| t.rkey = t.rkey.wrapping_add(1)),
            "obj4k",
            400,
            "RDMATransferFailed",
        ),
    ] {
        let r = w.get_with(t, key).await;
        r.expect(status, code, what);
    }
    // Tokens naming other sockets of the stack, one that never answers and
    // one nobody listens on: clean failures, no hang.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut elsewhere: Vec<SocketAddr> = w
        .listeners
        .iter()
        .map(|l| l.1)
        .filter(|a| *a != fabric_addr)
        .collect();
    elsewhere.push(silent.local_addr().unwrap());
    elsewhere.push(closed);
    for at in elsewhere {
        let t = bent(&|t| t.lid = at.port());
        w.get_with(t, "obj4k").await.expect(
            500,
            "RDMATransferFailed",
            &format!("a token naming {at}"),
        );
    }
    drop(silent);
    // Shape-valid tokens with random addresses and rkeys at the shim.
    for _ in 0..30 {
        let (ra, rk): (u64, u32) = (w.rng.random(), w.rng.random());
        let t = bent(&|t| {
            t.addr = ra >> 1;
            t.rkey = rk;
        });
        let r = w.get_with(t, "obj4k").await;
        assert!(
            matches!(
                r.code().as_deref(),
                Some("RDMATransferFailed" | "InvalidRDMAToken")
            ),
            "{}",
            r.text()
        );
    }
    // Signature tampering: the token is among the signed headers.
    let mut tampered = w
        .signer
        .sign(&Req::new("GET", "/alice-data/obj4k").token(tok.to_string()));
    let at = tampered
        .windows(81)
        .position(|w| w == tok.to_string().as_bytes())
        .unwrap();
    tampered[at + 15] = if tampered[at + 15] == b'0' {
        b'1'
    } else {
        b'0'
    };
    http(s3_addr, &tampered).await.expect(
        403,
        "SignatureDoesNotMatch",
        "a token changed after signing",
    );
    // Replays: signed 20 minutes ago; a presigned URL past its expiry.
    let mut old = Req::new("GET", "/alice-data/replayed").token(tok.to_string());
    old.when = SystemTime::now() - Duration::from_secs(1200);
    http(s3_addr, &w.signer.sign(&old)).await.expect(
        403,
        "RequestTimeTooSkewed",
        "an old signature",
    );
    let mut expired = Req::new("GET", "/alice-data/replayed").token(tok.to_string());
    expired.when = SystemTime::now() - Duration::from_secs(120);
    http(s3_addr, &w.signer.presign(&expired, 60)).await.expect(
        403,
        "AccessDenied",
        "an expired presigned URL",
    );
    w.check("after the bent tokens and replays");
    // A fresh presigned URL with the token, as a control.
    let fresh = Req::new("GET", "/alice-data/obj4k-b").token(tok.to_string());
    let r = http(s3_addr, &w.signer.presign(&fresh, 60)).await;
    assert_eq!(r.status, 200, "a fresh presigned RDMA GET: {}", r.text());
    w.dst.wrote(WIN_OFF, &data(4096, 12));
    w.check("after a presigned GET into the window");
    // Last, another responder: a refused handshake, after which this
    // user's requests naming the shim's address back off (not dialled).
    for attempt in ["another responder", "another responder, again"] {
        w.get_with(bent(&|t| t.dctn = 2), "obj4k")
            .await
            .expect(500, "RDMATransferFailed", attempt);
    }
    // The backoff ends (1 s after one refusal): the window's own token is
    // served again. (A deadline for the wait, not a timing check.)
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = w.get_with(tok.to_string(), "obj4k").await;
        if r.status == 200 {
            break;
        }
        r.expect(500, "RDMATransferFailed", "backing off after the refusal");
        assert!(
            std::time::Instant::now() < deadline,
            "the backoff never ended"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    w.dst.wrote(WIN_OFF, &obj4k);
    w.check("after another responder and the backoff");
}

/// Phase 4: malformed tokens (`tok` is a well-formed one, revoked).
pub(super) async fn malformed_tokens(w: &mut World, tok: &RdmaToken) {
    let s3_addr = w.s3_addr;
    let good = tok.to_string();
    let mut bad: Vec<(String, Vec<u8>)> = Vec::new();
    for n in (0..good.len()).step_by(3) {
        bad.push((format!("truncated to {n}"), good.as_bytes()[..n].to_vec()));
    }
    bad.push(("one more digit".into(), format!("{good}0").into_bytes()));
    bad.push(("an eighth field".into(), format!("{good}:00").into_bytes()));
    bad.push((
        "a version field in front".into(),
        format!("02:{good}").into_bytes(),
    ));
    bad.push(("upper case".into(), good.to_uppercase().into_bytes()));
    let fields: Vec<&str> = good.split(':').collect();
    bad.push((
        "gid flag 0 (no address)".into(),
        format!(
            "{}:{}:{}:{}:{}:0:{}",
            fields[0], fields[1], fields[2], fields[3], fields[4], fields[6]
        )
        .into_bytes(),
    ));
    bad.push((
        "gid flag 2".into(),
        format!(
            "{}:{}:{}:{}:{}:2:{}",
            fields[0], fields[1], fields[2], fields[3], fields[4], fields[6]
        )
        .into_bytes(),
    ));
    bad.push((
        "fields swapped".into(),
        [fields[1], fields[0]]
            .iter()
            .chain(&fields[2..])
            .copied()
            .collect::<Vec<_>>()
            .join(":")
            .into_bytes(),
    ));
    bad.push(("dashes".into(), good.replace(':', "-").into_bytes()));
    let mut non_ascii = good.clone().into_bytes();
    non_ascii[20] = 0xE9;
    bad.push(("a non-ASCII byte".into(), non_ascii));
    for i in 0..60 {
        let n = w.rng.random_range(0..200);
        let s: Vec<u8> = (0..n)
            .map(|_| match w.rng.random_range(0..10) {
                0 => b':',
                1..=5 => b"0123456789abcdef"[w.rng.random_range(0..16)],
                _ => w.rng.random_range(0x21..0x7f),
            })
            .collect();
        bad.push((format!("random {i}"), s));
    }
    let started = std::time::Instant::now();
    for (i, (what, t)) in bad.iter().enumerate() {
        if t.as_slice() == good.as_bytes() || t.trim_ascii().is_empty() && !t.is_empty() {
            continue;
        }
        let r = http(
            s3_addr,
            &w.signer
                .sign(&Req::new("GET", "/alice-data/obj4k").token(t.clone())),
        )
        .await;
        let want = if t.is_ascii() { "InvalidRDMAToken" } else { "" };
        if want.is_empty() {
            // (s3s may refuse the header's bytes in the signature first.)
            assert!(
                matches!(r.status, 400 | 403) && r.code().is_some(),
                "{what}: {}",
                r.text()
            );
            assert!(
                r.header("x-amz-rdma-reply").is_none(),
                "{what}: {}",
                r.text()
            );
        } else {
            r.expect(
                400,
                want,
                &format!("GET with {what} ({:?})", String::from_utf8_lossy(t)),
            );
        }
        let path = format!("/alice-data/bad-token/{i}");
        let r = http(
            s3_addr,
            &w.signer.sign(&Req::new("PUT", &path).token(t.clone())),
        )
        .await;
        assert!(
            r.status >= 400 && r.code().is_some(),
            "PUT with {what}: {}",
            r.text()
        );
    }
    // Two token headers.
    let mut dup = Req::new("GET", "/alice-data/obj4k").token(good.clone());
    dup.headers
        .push(("x-amz-rdma-token", good.clone().into_bytes()));
    http(s3_addr, &w.signer.sign(&dup))
        .await
        .expect(400, "InvalidRDMAToken", "two token headers");
    println!(
        "hostile: {} malformed tokens in {:?}",
        bad.len(),
        started.elapsed()
    );
    let stored =
        w.s3.list_objects_v2()
            .bucket("alice-data")
            .prefix("bad-token/")
            .send()
            .await
            .unwrap();
    assert_eq!(
        stored.key_count(),
        Some(0),
        "PUTs with bad tokens stored {stored:?}"
    );
    for k in ["stolen", "after-revoke"] {
        assert!(
            w.s3.head_object()
                .bucket("alice-data")
                .key(k)
                .send()
                .await
                .is_err(),
            "{k} was stored"
        );
    }
    // An expired window (tenant memory of the test's own, same fabric key).
    let mem = agent::Memory::new(1 << 20).await;
    let mem_want = data(1 << 20, 5);
    mem.fill(0, &mem_want);
    let win = mem
        .region
        .window(
            0,
            WIN,
            fabric::Access::REMOTE_WRITE | fabric::Access::REMOTE_READ,
            Some(Duration::from_millis(1)),
        )
        .unwrap();
    let etok = mem.endpoint.token(&win).unwrap().to_string();
    while win
        .expires_at()
        .is_some_and(|t| t > std::time::Instant::now())
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    w.get_with(etok.clone(), "obj4k").await.expect(
        400,
        "RDMATransferFailed",
        "a GET into an expired window",
    );
    http(
        s3_addr,
        &w.signer
            .sign(&Req::new("PUT", "/alice-data/expired").token(etok)),
    )
    .await
    .expect(400, "RDMATransferFailed", "a PUT from an expired window");
    assert!(
        mem.read(0, 1 << 20) == mem_want,
        "an expired window was written"
    );
    assert!(
        w.s3.head_object()
            .bucket("alice-data")
            .key("expired")
            .send()
            .await
            .is_err()
    );
    drop(win);
    mem.endpoint.shutdown().await;
    w.check("after the malformed tokens");
}
