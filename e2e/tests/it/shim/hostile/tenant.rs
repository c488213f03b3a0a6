//! Another tenant of the shim: alice names bob's buffer (registered by a
//! child process under bob's uid) with spoofed metadata, and random buffer
//! ids (phase 5); one tenant passes fds on many leases without registering
//! them.

use super::*;

/// Phase 5: another tenant's buffer, named with spoofed metadata: not
/// found.
pub(super) async fn another_tenants_buffer(w: &mut World, raw: &mut RawTenant) {
    let mut child = tokio::process::Command::from(s3dma_testkit::self_test_command(
        w.stack.dir.path(),
        Some(BOB_UID),
        "shim::hostile::child_bob_holds_a_buffer",
    ))
    .env("HOSTILE_SOCKET", &w.stack.shim.socket)
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .kill_on_drop(true)
    .spawn()
    .unwrap();
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    let bob_buffer: u64 = guard("bob's buffer id", async {
        use tokio::io::AsyncBufReadExt as _;
        loop {
            let mut line = String::new();
            if out.read_line(&mut line).await.unwrap() == 0 {
                let mut err = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut err).await;
                panic!("bob's child exited early:\n{seen}\n{err}");
            }
            seen.push_str(&line);
            // (libtest may print "test NAME ... " on the same line first.)
            if let Some((_, id)) = line.trim().split_once("BOB_BUFFER ") {
                break id.parse().unwrap();
            }
        }
    })
    .await;
    let spoof = |r: &mut tonic::metadata::MetadataMap| {
        for (k, v) in [
            ("x-s3dma-tenant", "bob"),
            ("tenant", "bob"),
            ("x-tenant-uid", "65534"),
            ("x-forwarded-user", "bob"),
            ("authorization", "Bearer shim-token-0123456789abcdef"),
        ] {
            r.insert(k, v.parse().unwrap());
        }
    };
    macro_rules! spoofed {
        ($msg:expr) => {{
            let mut r = tonic::Request::new($msg);
            spoof(r.metadata_mut());
            r
        }};
    }
    let slice = |id: u64| {
        Some(api::BufferSlice {
            buffer_id: id,
            offset: 0,
            length: Some(4096),
        })
    };
    let not_found = |st: &tonic::Status, what: &str| {
        assert_eq!(
            reason(st),
            (tonic::Code::NotFound, "NoSuchBuffer".into()),
            "{what}: {st:?}"
        );
    };
    let info = raw
        .info(spoofed!(api::InfoRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.tenant, "alice");
    let st = raw
        .get_object(spoofed!(api::GetObjectRequest {
            bucket: "alice-data".into(),
            key: "obj4k".into(),
            destination: slice(bob_buffer),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    not_found(&st, "GET into bob's buffer");
    let st = raw
        .put_object(spoofed!(api::PutObjectRequest {
            bucket: "alice-data".into(),
            key: "from-bob".into(),
            source: slice(bob_buffer),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    not_found(&st, "PUT from bob's buffer");
    let st = raw
        .release_buffer(spoofed!(api::ReleaseBufferRequest {
            buffer_id: bob_buffer
        }))
        .await
        .unwrap_err();
    not_found(&st, "releasing bob's buffer");
    match raw
        .get_objects(spoofed!(api::GetObjectsRequest {
            items: vec![api::GetObjectsItem {
                bucket: "alice-data".into(),
                key: "obj4k".into(),
                destination: slice(bob_buffer),
                ..Default::default()
            }],
            concurrency: 0,
        }))
        .await
    {
        Err(st) => not_found(&st, "a batch into bob's buffer"),
        Ok(stream) => {
            let mut stream = stream.into_inner();
            let mut n = 0;
            while let Some(item) = stream.message().await.unwrap_or_default() {
                n += 1;
                match item.result {
                    Some(agent_pb::get_objects_reply::Result::Error(e)) => {
                        assert_eq!(e.s3_code, "NoSuchBuffer", "{e:?}")
                    }
                    other => panic!("a batch into bob's buffer: {other:?}"),
                }
            }
            assert_eq!(n, 1);
        }
    }
    // A PutObjects item from bob's buffer: refused alone, with the same
    // answer as an unknown id.
    let r = raw
        .put_objects(spoofed!(api::PutObjectsRequest {
            items: vec![api::PutObjectsItem {
                bucket: "alice-data".into(),
                key: "batch-from-bob".into(),
                source: slice(bob_buffer),
                ..Default::default()
            }],
            concurrency: 0,
        }))
        .await
        .unwrap()
        .into_inner();
    match &r.results[..] {
        [
            agent_pb::PutObjectsResult {
                result: Some(agent_pb::put_objects_result::Result::Error(e)),
            },
        ] => assert_eq!(e.s3_code, "NoSuchBuffer", "{e:?}"),
        other => panic!("a PutObjects item from bob's buffer: {other:?}"),
    }
    let listed = raw
        .list_buffers(spoofed!(api::ListBuffersRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert!(listed.buffers.iter().all(|b| b.buffer_id != bob_buffer));
    // Random ids are nobody's.
    for _ in 0..100 {
        let id: u64 = w.rng.random();
        let st = raw
            .get_object(api::GetObjectRequest {
                bucket: "alice-data".into(),
                key: "obj4k".into(),
                destination: slice(id),
                ..Default::default()
            })
            .await
            .unwrap_err();
        not_found(&st, "a random buffer id");
    }
    drop(child.stdin.take());
    let status = guard("bob's child", child.wait()).await.unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).await.unwrap();
    assert!(
        status.success() && rest.contains("BOB_OK"),
        "bob's child:\n{seen}{rest}"
    );
}

/// One tenant passing fds on many leases (and never registering them)
/// cannot make the shim hold more than the buffers it may have: the shim's
/// descriptor table is shared by every tenant.
pub(super) async fn fd_flood(w: &World) {
    let shim = w.procs[2];
    let before = shim.fds().len();
    let memfd = fabric::Memory::memfd("hostile-flood", 4096).unwrap();
    let raw_fd = {
        use std::os::fd::AsRawFd as _;
        memfd.fd().unwrap().as_raw_fd()
    };
    let socket = w.stack.shim.socket.clone();
    let (accepted, refusal, leases) = guard(
        "passing fds",
        tokio::task::spawn_blocking(move || lease_fd_flood(&socket, raw_fd, 40, 64)),
    )
    .await
    .unwrap();
    let held = shim.fds().len().saturating_sub(before);
    println!(
        "hostile: fd flood: {accepted} passes accepted, shim holds {held} more fds; last refusal: {refusal}"
    );
    let max_buffers = w.c.info().await.unwrap().max_buffers as usize;
    assert!(
        accepted <= max_buffers,
        "one tenant made the shim hold {accepted} passed fds (it may register {max_buffers} buffers)"
    );
    assert!(
        held <= leases.len() + max_buffers,
        "{held} fds for {} leases",
        leases.len()
    );
    drop(leases);
    drop(memfd);
}

/// Opens `leases` lease connections (blocking) and passes the same fd
/// `per_lease` times on each. Returns how many passes the shim accepted,
/// its last refusal, and the leases, still open.
pub(super) fn lease_fd_flood(
    socket: &Path,
    fd: std::os::fd::RawFd,
    leases: usize,
    per_lease: u32,
) -> (usize, String, Vec<std::os::unix::net::UnixStream>) {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    use std::io::{Read as _, Write as _};
    use std::os::fd::AsRawFd as _;
    fn reply(s: &mut std::os::unix::net::UnixStream) -> (u8, String) {
        let mut h = [0u8; s3dma_proto::lease::REPLY_HEADER_LEN];
        s.read_exact(&mut h).unwrap();
        let mut msg = vec![0u8; usize::from(u16::from_le_bytes([h[2], h[3]]))];
        s.read_exact(&mut msg).unwrap();
        (h[0], String::from_utf8_lossy(&msg).into_owned())
    }
    let (mut accepted, mut refusal, mut open) = (0, String::new(), Vec::new());
    for _ in 0..leases {
        let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
        s.set_read_timeout(Some(HANG_GUARD)).unwrap();
        s.write_all(&s3dma_proto::lease::MAGIC).unwrap();
        let (status, msg) = reply(&mut s);
        if status != 0 {
            refusal = msg;
            break;
        }
        for seq in 1..=per_lease {
            let frame = s3dma_proto::lease::FdRequest { seq }.encode();
            sendmsg::<()>(
                s.as_raw_fd(),
                &[std::io::IoSlice::new(&frame)],
                &[ControlMessage::ScmRights(&[fd])],
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .unwrap();
            match reply(&mut s) {
                (0, _) => accepted += 1,
                (_, msg) => refusal = msg,
            }
        }
        open.push(s);
    }
    (accepted, refusal, open)
}
