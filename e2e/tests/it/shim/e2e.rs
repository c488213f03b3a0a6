//! End to end: storage-target + dpu-agent + host-shim as real processes,
//! driven by the Rust client (and raw gRPC where a test must send what the
//! safe client never would). Bytes are checked by SHA-256, and what the
//! target stored is checked with aws-sdk-s3.
//!
//! Needs the workspace's binaries (`cargo test --workspace` builds them).

use std::collections::HashMap;
use std::time::Duration;

use crate::shim::common::*;
use s3dma_client::{ByteRange, Client, ErrorKind, GetOptions, PutOptions};
use s3dma_proto::tenant::v1 as api;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

async fn guard<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(HANG_GUARD, f)
        .await
        .expect("hung past the hang guard")
}

async fn sdk_bytes(stack: &Stack, bucket: &str, key: &str) -> Vec<u8> {
    agent::sdk_get(&stack.target.s3(ALICE), bucket, key).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_client_put_get_list_delete_from_empty_to_one_gib() {
    let stack = Stack::start().await;
    let c = stack.client().await;
    let info = c.info().await.unwrap();
    assert_eq!(info.tenant, "alice");
    assert!(info.agent_connected);

    for (i, len) in [0usize, 1, 4096, (5 << 20) + 1].into_iter().enumerate() {
        let key = format!("sizes/{i}-{len}");
        let payload = data(len, i as u64);
        let mut src = c.alloc(len.max(1)).await.unwrap();
        src.as_mut_slice()[..len].copy_from_slice(&payload);
        let mut meta = HashMap::new();
        meta.insert("origin".to_string(), "e2e".to_string());
        let put = guard(c.put_object_from(
            "alice-data",
            &key,
            &src,
            0..len,
            PutOptions {
                content_type: Some("application/x-test".into()),
                metadata: meta,
            },
        ))
        .await
        .unwrap();
        assert_eq!(put.size, len as u64);
        // What the target stored, read by a plain S3 client.
        assert_eq!(
            sha256(&sdk_bytes(&stack, "alice-data", &key).await),
            sha256(&payload)
        );

        // Into a fresh buffer, at an offset, with sentinels around it.
        let mut dst = c.alloc(len + 8192).await.unwrap();
        dst.as_mut_slice().fill(0xEE);
        let got = guard(c.get_object_into(
            "alice-data",
            &key,
            &mut dst,
            4096,
            GetOptions {
                length: Some(len as u64),
                ..Default::default()
            },
        ))
        .await
        .unwrap();
        assert_eq!(got.bytes_placed, len as u64);
        assert_eq!(got.object.size, len as u64);
        assert_eq!(got.object.content_type, "application/x-test");
        assert_eq!(got.object.metadata["origin"], "e2e");
        let b = dst.as_slice();
        assert_eq!(sha256(&b[4096..4096 + len]), sha256(&payload), "{key}");
        assert!(
            b[..4096].iter().all(|&x| x == 0xEE),
            "bytes before the slice"
        );
        assert!(
            b[4096 + len..].iter().all(|&x| x == 0xEE),
            "bytes after the slice"
        );

        let head = c.head("alice-data", &key).await.unwrap();
        assert_eq!(head.size, len as u64);
        assert_eq!(head.etag, put.etag);
    }

    // Ranges.
    let payload = data(100_000, 9);
    let mut buf = c.alloc(100_000).await.unwrap();
    buf.as_mut_slice().copy_from_slice(&payload);
    c.put_object_from(
        "alice-data",
        "ranged",
        &buf,
        0..100_000,
        PutOptions::default(),
    )
    .await
    .unwrap();
    for (range, want) in [
        (
            ByteRange::Bounded {
                first: 10,
                last: 19,
            },
            &payload[10..20],
        ),
        (ByteRange::From(99_990), &payload[99_990..]),
        (ByteRange::Suffix(7), &payload[100_000 - 7..]),
    ] {
        let mut dst = c.alloc(4096).await.unwrap();
        let got = c
            .get_object_into(
                "alice-data",
                "ranged",
                &mut dst,
                0,
                GetOptions {
                    range: Some(range),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(
            &dst.as_slice()[..got.bytes_placed as usize],
            want,
            "{range:?}"
        );
    }
    // Too small a destination is a clear error; nothing lands outside the
    // slice the tenant named (the first chunk may land inside it).
    let mut small = c.alloc(4096).await.unwrap();
    small.as_mut_slice().fill(1);
    let e = c
        .get_object_into(
            "alice-data",
            "ranged",
            &mut small,
            1000,
            GetOptions {
                length: Some(100),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "DestinationTooSmall", "{e}");
    assert!(small.as_slice()[..1000].iter().all(|&x| x == 1));
    assert!(small.as_slice()[1100..].iter().all(|&x| x == 1));

    // 1 GiB (less in the Soft-RoCE VM): one buffer, filled, PUT (multipart
    // over RDMA), cleared, GET back.
    let len = agent::large_object_len();
    let mut big = c.alloc(len).await.unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for chunk in big.as_mut_slice().chunks_mut(8) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        chunk.copy_from_slice(&seed.to_le_bytes()[..chunk.len()]);
    }
    let want = sha256(big.as_slice());
    let put = guard(c.put_object_from(
        "alice-data",
        "big/1gib",
        &big,
        0..len,
        PutOptions::default(),
    ))
    .await
    .unwrap();
    assert_eq!(put.size, len as u64);
    assert!(put.parts > 1, "{len} B goes as multipart");
    big.as_mut_slice().fill(0);
    let got =
        guard(c.get_object_into("alice-data", "big/1gib", &mut big, 0, GetOptions::default()))
            .await
            .unwrap();
    assert_eq!(got.bytes_placed, len as u64);
    assert_eq!(sha256(big.as_slice()), want);
    big.release().await.unwrap();

    // Listing and deletion.
    let keys: Vec<String> = c
        .list_all("alice-data", "sizes/")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(keys.len(), 4, "{keys:?}");
    for k in &keys {
        c.delete("alice-data", k).await.unwrap();
    }
    assert!(c.list_all("alice-data", "sizes/").await.unwrap().is_empty());
    let e = c.head("alice-data", &keys[0]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let mut dst = c.alloc(16).await.unwrap();
    let e = c
        .get_object_into("alice-data", &keys[0], &mut dst, 0, GetOptions::default())
        .await
        .unwrap_err();
    assert_eq!(
        (e.kind(), e.code()),
        (ErrorKind::NotFound, "NoSuchKey"),
        "{e}"
    );

    // Every window minted was revoked.
    assert_eq!(stack.shim.metric("s3dma_shim_windows_open"), 0.0);
}

/// Run as bob's uid by `two_tenants_are_isolated`: alice's buffer, lease and
/// bucket are invisible from here.
#[tokio::test]
#[ignore = "run as another uid by two_tenants_are_isolated"]
async fn child_as_bob() {
    let socket = std::env::var("E2E_SOCKET").unwrap();
    let alice_buffer: u64 = std::env::var("E2E_ALICE_BUFFER").unwrap().parse().unwrap();
    let alice_lease = hex_decode(&std::env::var("E2E_ALICE_LEASE").unwrap());

    let c = Client::connect(&socket).await.unwrap();
    assert_eq!(c.info().await.unwrap().tenant, "bob");
    let mut raw = raw_tenant_client(socket.as_ref()).await;

    // Alice's buffer id is simply not found, for every use.
    let dest = api::BufferSlice {
        buffer_id: alice_buffer,
        offset: 0,
        length: None,
    };
    let st = raw
        .get_object(api::GetObjectRequest {
            bucket: "bob-data".into(),
            key: "mine".into(),
            destination: Some(dest),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        reason(&st),
        (tonic::Code::NotFound, "NoSuchBuffer".into()),
        "{st:?}"
    );
    let st = raw
        .put_object(api::PutObjectRequest {
            bucket: "bob-data".into(),
            key: "stolen".into(),
            source: Some(api::BufferSlice {
                length: Some(16),
                ..dest
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&st), (tonic::Code::NotFound, "NoSuchBuffer".into()));
    let st = raw
        .release_buffer(api::ReleaseBufferRequest {
            buffer_id: alice_buffer,
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&st), (tonic::Code::NotFound, "NoSuchBuffer".into()));
    let listed = raw
        .list_buffers(api::ListBuffersRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(listed.buffers.iter().all(|b| b.buffer_id != alice_buffer));
    // Nor can bob register memory under alice's lease.
    let st = raw
        .register_buffer(api::RegisterBufferRequest {
            lease: alice_lease,
            memory: Some(api::register_buffer_request::Memory::Host(
                api::HostMemory {
                    fd_handle: vec![0; 16],
                    size: 4096,
                },
            )),
            label: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&st), (tonic::Code::NotFound, "NoSuchLease".into()));

    // Alice's bucket is denied by the agent's policy; bob's works.
    let mut buf = c.alloc(4096).await.unwrap();
    let e = c
        .get_object_into("alice-data", "secret", &mut buf, 0, GetOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AccessDenied, "{e}");
    let e = c
        .put_object_from("alice-data", "secret", &buf, 0..16, PutOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AccessDenied, "{e}");
    buf.as_mut_slice()[..3].copy_from_slice(b"bob");
    c.put_object_from("bob-data", "mine", &buf, 0..3, PutOptions::default())
        .await
        .unwrap();
    // Bob's limits are his own (4 buffers; one is held).
    let mut held = Vec::new();
    let e = loop {
        match c.alloc(4096).await {
            Ok(b) => held.push(b),
            Err(e) => break e,
        }
    };
    assert_eq!(
        (e.kind(), e.code()),
        (ErrorKind::SlowDown, "BufferLimit"),
        "{e}"
    );
    assert_eq!(held.len(), 3);
}

/// Run as a uid that no tenant has.
#[tokio::test]
#[ignore = "run as another uid by two_tenants_are_isolated"]
async fn child_as_stranger() {
    let socket = std::env::var("E2E_SOCKET").unwrap();
    // The shim closes a stranger's connection at accept: it reads nothing
    // (a 16 MiB message finds the socket closed) and sends nothing.
    let mut s = tokio::net::UnixStream::connect(&socket).await.unwrap();
    let mut first = [0u8; 1];
    let n = tokio::time::timeout(HANG_GUARD, s.read(&mut first))
        .await
        .expect("the shim kept a stranger's connection open")
        .unwrap_or(0);
    assert_eq!(n, 0, "the shim sent bytes to a stranger");
    let big = vec![0u8; 16 << 20];
    assert!(
        s.write_all(&big).await.is_err(),
        "the shim took 16 MiB from a stranger"
    );
    // gRPC fails without a tenant reply.
    let mut raw = tokio::time::timeout(
        HANG_GUARD,
        try_raw_tenant_client(std::path::Path::new(&socket)),
    )
    .await
    .unwrap();
    if let Ok(c) = raw.as_mut() {
        // The closed socket surfaces as Unavailable, as Unknown "transport
        // error" when the write of the request hits the closed socket first
        // (broken pipe), or as Cancelled when hyper sees the connection
        // close while the request waits for it: in every case a transport
        // failure, no reply.
        let st = c.info(api::InfoRequest {}).await.unwrap_err();
        let transport_failure = st.code() == tonic::Code::Unavailable
            || (st.code() == tonic::Code::Unknown && st.message().contains("transport error"))
            || (st.code() == tonic::Code::Cancelled && std::error::Error::source(&st).is_some());
        assert!(transport_failure, "{st:?}");
    }
    // The client says why, naming the uid.
    let e = Client::connect(&socket).await.unwrap_err();
    assert!(e.to_string().contains("uid 4242"), "{e}");
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_are_isolated() {
    let stack = Stack::start().await;
    let c = stack.client().await;
    let mut buf = c.alloc(4096).await.unwrap();
    buf.as_mut_slice()[..6].copy_from_slice(b"secret");
    c.put_object_from("alice-data", "secret", &buf, 0..6, PutOptions::default())
        .await
        .unwrap();
    buf.as_mut_slice().fill(0xAA);
    // Alice's lease id, to see that bob cannot use it.
    let lease = {
        let mut s = tokio::net::UnixStream::connect(&stack.shim.socket)
            .await
            .unwrap();
        s.write_all(&s3dma_proto::lease::MAGIC).await.unwrap();
        let mut h = [0u8; 24];
        s.read_exact(&mut h).await.unwrap();
        // Keep it open in the background for the child's checks.
        let id: String = h[8..24].iter().map(|b| format!("{b:02x}")).collect();
        std::mem::forget(s);
        id
    };
    let env = [
        ("E2E_SOCKET", stack.shim.socket.display().to_string()),
        ("E2E_ALICE_BUFFER", buf.id().to_string()),
        ("E2E_ALICE_LEASE", lease),
    ];
    let dir = stack.dir.path().to_owned();
    let d = dir.clone();
    let e = env.clone();
    tokio::task::spawn_blocking(move || run_test_as(&d, BOB_UID, "shim::e2e::child_as_bob", &e))
        .await
        .unwrap();
    let refused_before = stack.shim.metric("s3dma_shim_connections_refused_total");
    tokio::task::spawn_blocking(move || {
        run_test_as(&dir, STRANGER_UID, "shim::e2e::child_as_stranger", &env)
    })
    .await
    .unwrap();
    // Every connection the stranger made was refused at accept.
    assert!(
        stack.shim.metric("s3dma_shim_connections_refused_total") >= refused_before + 3.0,
        "{}",
        stack.shim.log()
    );

    // Alice's buffer and object are untouched; bob's object exists.
    assert!(buf.as_slice().iter().all(|&x| x == 0xAA));
    c.get_object_into("alice-data", "secret", &mut buf, 0, GetOptions::default())
        .await
        .unwrap();
    assert_eq!(&buf.as_slice()[..6], b"secret");
    assert_eq!(sdk_bytes(&stack, "bob-data", "mine").await, b"bob");
    // bob's process exited: its lease closed and its buffers are gone.
    guard(async {
        while stack.shim.metric("s3dma_shim_buffers{tenant=\"bob\"}") != 0.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// Run by `a_dead_process_releases_its_buffers`: registers buffers, then
/// exits without releasing anything (no destructors run).
#[tokio::test]
#[ignore = "run in a child process by a_dead_process_releases_its_buffers"]
async fn child_allocates_and_exits() {
    let c = Client::connect(std::env::var("E2E_SOCKET").unwrap())
        .await
        .unwrap();
    let a = c.alloc(1 << 20).await.unwrap();
    let b = c.alloc(1 << 20).await.unwrap();
    println!("ALLOCATED {} {}", a.id(), b.id());
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    std::process::exit(0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_process_releases_its_buffers() {
    let stack = Stack::start().await;
    let watcher = stack.client().await;
    let before = watcher.info().await.unwrap().buffers;
    let socket = stack.shim.socket.display().to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "shim::e2e::child_allocates_and_exits",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env("E2E_SOCKET", socket)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ALLOCATED"), "{text}");
    // The process is gone, so is its lease; the shim releases its buffers.
    guard(async {
        while watcher.info().await.unwrap().buffers != before {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(
        stack.shim.metric("s3dma_shim_leases"),
        1.0,
        "only the watcher's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_restart_and_outage() {
    let mut stack = Stack::start().await;
    let c = stack.client().await;
    let mut buf = c.alloc(4096).await.unwrap();
    buf.as_mut_slice()[..5].copy_from_slice(b"hello");
    c.put_object_from("alice-data", "k", &buf, 0..5, PutOptions::default())
        .await
        .unwrap();

    // Restarted while idle: the very next request works.
    stack.agent.restart();
    let got = guard(c.get_object_into("alice-data", "k", &mut buf, 0, GetOptions::default()))
        .await
        .unwrap();
    assert_eq!(got.bytes_placed, 5);

    // Down: calls fail (fast: well inside the shim's 120 s request timeout)
    // with UNAVAILABLE and the shim's AgentUnavailable reason.
    stack.agent.kill9();
    for _ in 0..3 {
        let e = guard(c.head("alice-data", "k")).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert_eq!(e.code(), "AgentUnavailable", "{e}");
    }
    assert_eq!(stack.shim.metric("s3dma_shim_agent_connected"), 0.0);

    // Back: the shim reconnects in the background and requests work again.
    stack.agent.restart();
    guard(async {
        loop {
            match c.head("alice-data", "k").await {
                Ok(h) => break assert_eq!(h.size, 5),
                Err(e) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(stack.shim.metric("s3dma_shim_agent_connected"), 1.0);
    assert!(stack.shim.metric("s3dma_shim_agent_reconnects_total") >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_shim_is_a_clean_error() {
    let mut stack = Stack::start().await;
    let c = stack.client().await;
    let mut buf = c.alloc(4096).await.unwrap();
    stack.shim.kill9();
    let e = guard(c.get_object_into("alice-data", "k", &mut buf, 0, GetOptions::default()))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let e = guard(Client::connect(&stack.shim.socket))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("shim.sock"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_get_revokes_its_window() {
    // A slow GET (alice limited to 4 MiB/s) that the tenant abandons.
    let stack = Stack::start_with(|spec| {
        spec.alice_quotas = "max_bytes_per_second: 4MiB".into();
        spec.transfer = "chunk_size: 1MiB\nmax_chunks_in_flight: 2".into();
    })
    .await;
    let c = stack.client().await;
    // Stored straight at the target (the quota would slow a PUT as well).
    let len = 32 << 20;
    put_as(
        &stack.target.s3(ALICE),
        "alice-data",
        "slow",
        vec![7u8; len],
    )
    .await;
    let mut buf = c.alloc(len).await.unwrap();
    let get = c.get_object_into("alice-data", "slow", &mut buf, 0, GetOptions::default());
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), get)
            .await
            .is_err(),
        "the bandwidth-limited GET should still be running"
    );
    // The tenant's cancel reaches the shim, which revokes the window.
    guard(async {
        while stack.shim.metric("s3dma_shim_windows_open") != 0.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // Nothing lands after that: the contents stop changing.
    let snapshot = sha256(buf.as_slice());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sha256(buf.as_slice()), snapshot);
    assert!(buf.as_slice().contains(&0), "the GET did not finish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_lease_frames_and_bad_memory_are_refused() {
    let stack = Stack::start().await;
    let sock = &stack.shim.socket;
    // Garbage after the magic: an error reply, the lease closes.
    let mut s = tokio::net::UnixStream::connect(sock).await.unwrap();
    s.write_all(b"S3DMALS1").await.unwrap();
    let mut h = [0u8; 24];
    s.read_exact(&mut h).await.unwrap();
    assert_eq!(h[0], 0, "lease opened");
    s.write_all(b"XXXXXXXX").await.unwrap();
    s.read_exact(&mut h).await.unwrap();
    assert_eq!(h[0], 1, "error reply");
    let mut msg = vec![0u8; usize::from(u16::from_le_bytes([h[2], h[3]]))];
    s.read_exact(&mut msg).await.unwrap();
    assert!(String::from_utf8_lossy(&msg).contains("unknown lease request"));
    assert_eq!(s.read(&mut h).await.unwrap(), 0, "closed");

    // An FD frame without an fd.
    let mut s = tokio::net::UnixStream::connect(sock).await.unwrap();
    s.write_all(b"S3DMALS1").await.unwrap();
    s.read_exact(&mut h).await.unwrap();
    s.write_all(&s3dma_proto::lease::FdRequest { seq: 5 }.encode())
        .await
        .unwrap();
    s.read_exact(&mut h).await.unwrap();
    assert_eq!((h[0], u32::from_le_bytes([h[4], h[5], h[6], h[7]])), (1, 5));

    // Random bytes and a silent client: the shim keeps serving.
    let mut s = tokio::net::UnixStream::connect(sock).await.unwrap();
    s.write_all(&data(4096, 3)).await.unwrap();
    drop(s);
    let _silent = tokio::net::UnixStream::connect(sock).await.unwrap();

    // A buffer id nobody has; slices outside a buffer.
    let c = stack.client().await;
    let mut raw = raw_tenant_client(sock).await;
    let st = raw
        .get_object(api::GetObjectRequest {
            bucket: "alice-data".into(),
            key: "x".into(),
            destination: Some(api::BufferSlice {
                buffer_id: 12345,
                offset: 0,
                length: None,
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&st), (tonic::Code::NotFound, "NoSuchBuffer".into()));
    let buf = c.alloc(4096).await.unwrap();
    for (offset, length) in [
        (4097, None),
        (0, Some(4097)),
        (4000, Some(97)),
        (u64::MAX, Some(2)),
    ] {
        let st = raw
            .put_object(api::PutObjectRequest {
                bucket: "alice-data".into(),
                key: "x".into(),
                source: Some(api::BufferSlice {
                    buffer_id: buf.id(),
                    offset,
                    length: length.or(Some(0)),
                }),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(
            reason(&st),
            (tonic::Code::InvalidArgument, "OutOfBounds".into()),
            "{offset} {length:?}"
        );
    }
    let st = raw
        .put_object(api::PutObjectRequest {
            bucket: "alice-data".into(),
            key: "x".into(),
            source: Some(api::BufferSlice {
                buffer_id: buf.id(),
                offset: 0,
                length: None,
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        reason(&st),
        (tonic::Code::InvalidArgument, "InvalidArgument".into())
    );
    // CUDA memory needs the `cuda` feature (`cuda.rs` has the GPU test).
    if cfg!(not(feature = "cuda")) {
        let mut lease = tokio::net::UnixStream::connect(sock).await.unwrap();
        lease.write_all(&s3dma_proto::lease::MAGIC).await.unwrap();
        lease.read_exact(&mut h).await.unwrap();
        let st = raw
            .register_buffer(api::RegisterBufferRequest {
                lease: h[8..24].to_vec(),
                memory: Some(api::register_buffer_request::Memory::Cuda(
                    api::CudaMemory {
                        ipc_handle: vec![0; 64],
                        device: 0,
                        size: 4096,
                        ..Default::default()
                    },
                )),
                label: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(
            reason(&st),
            (tonic::Code::Unimplemented, "Unsupported".into())
        );
        assert!(st.message().contains("`cuda` feature"), "{st:?}");
    }
    assert!(c.info().await.unwrap().agent_connected);
    assert_eq!(stack.shim.metric("s3dma_shim_windows_open"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_fills_one_buffer_item_by_item() {
    let stack = Stack::start().await;
    let c = stack.client().await;
    let mut src = c.alloc(64 << 10).await.unwrap();
    let mut want = Vec::new();
    for i in 0..8u64 {
        let payload = data(4096 + i as usize * 100, i);
        src.as_mut_slice()[..payload.len()].copy_from_slice(&payload);
        c.put_object_from(
            "alice-data",
            &format!("batch/{i}"),
            &src,
            0..payload.len(),
            PutOptions::default(),
        )
        .await
        .unwrap();
        want.push(payload);
    }
    let slot = 8192usize;
    let mut items: Vec<s3dma_client::GetItem> = (0..8)
        .map(|i| s3dma_client::GetItem {
            bucket: "alice-data".into(),
            key: format!("batch/{i}"),
            offset: i * slot,
            length: Some(slot as u64),
            ..Default::default()
        })
        .collect();
    items.push(s3dma_client::GetItem {
        bucket: "alice-data".into(),
        key: "batch/missing".into(),
        offset: 8 * slot,
        length: Some(slot as u64),
        ..Default::default()
    });
    let mut dst = c.alloc(9 * slot).await.unwrap();
    dst.as_mut_slice().fill(0xEE);
    let results = guard(c.get_objects(&mut dst, &items, 4)).await.unwrap();
    assert_eq!(results.len(), 9);
    for (i, payload) in want.iter().enumerate() {
        let got = results[i].as_ref().unwrap();
        assert_eq!(got.bytes_placed, payload.len() as u64);
        let at = &dst.as_slice()[i * slot..(i + 1) * slot];
        assert_eq!(&at[..payload.len()], &payload[..], "item {i}");
        assert!(
            at[payload.len()..].iter().all(|&x| x == 0xEE),
            "item {i} tail"
        );
    }
    let e = results[8].as_ref().unwrap_err();
    assert_eq!(
        (e.kind(), e.code()),
        (ErrorKind::NotFound, "NoSuchKey"),
        "{e}"
    );
    assert!(dst.as_slice()[8 * slot..].iter().all(|&x| x == 0xEE));

    // Items pinned to a version: the right ETag reads, another one is
    // PreconditionFailed for that item alone and places nothing.
    let etag = results[0].as_ref().unwrap().object.etag.clone();
    dst.as_mut_slice().fill(0xEE);
    let pinned = [
        Some(etag),
        Some("\"0123456789abcdef0123456789abcdef\"".to_owned()),
    ];
    let items: Vec<s3dma_client::GetItem> = pinned
        .into_iter()
        .enumerate()
        .map(|(i, if_match)| s3dma_client::GetItem {
            bucket: "alice-data".into(),
            key: "batch/0".into(),
            offset: i * slot,
            length: Some(slot as u64),
            if_match,
            ..Default::default()
        })
        .collect();
    let results = guard(c.get_objects(&mut dst, &items, 2)).await.unwrap();
    let got = results[0].as_ref().unwrap();
    assert_eq!(&dst.as_slice()[..want[0].len()], &want[0][..]);
    assert_eq!(got.bytes_placed, want[0].len() as u64);
    let e = results[1].as_ref().unwrap_err();
    assert_eq!(e.code(), "PreconditionFailed", "{e}");
    assert!(dst.as_slice()[slot..2 * slot].iter().all(|&x| x == 0xEE));
    assert_eq!(stack.shim.metric("s3dma_shim_windows_open"), 0.0);
}

/// A stack whose target speaks hipobj-rc-v2 to the agent (`protocol:
/// hipobj-rc-v2`), with 1 MiB GET chunks and 5 MiB parts above 8 MiB, so a
/// 64 MiB object is many transfers each way.
async fn hipobj_stack() -> Stack {
    Stack::start_with(|s| {
        s.target_yaml = "protocol: hipobj-rc-v2\n".into();
        s.transfer =
            "chunk_size: 1MiB\nmultipart_threshold: 8MiB\npart_size: 5MiB\nmax_chunks_in_flight: 4\n"
                .into();
    })
    .await
}

/// The path a hipobj-rc-v2 target's bytes take: RDMA through the shim's
/// queue pairs on a verbs device; over HTTP through the agent on tcp (the
/// shim has no device, so it opens no queue-pair link).
fn hipobj_path() -> s3dma_client::TransferPath {
    if agent::backend() == fabric::Backend::Verbs {
        s3dma_client::TransferPath::Rdma
    } else {
        s3dma_client::TransferPath::Fallback
    }
}

/// GET and PUT of 1 B, 4 KiB, 1 MiB + 3 and 64 MiB (many transfers: 64
/// GET chunks, 13 parts) and ranges, against a hipobj-rc-v2 target: bytes
/// by SHA-256 (what the target stored read back with aws-sdk-s3), the
/// bytes around the slice untouched, the path each took, and on verbs the
/// server's sessions all ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hipobj_rc_v2_moves_objects_through_the_shims_queue_pairs() {
    let stack = hipobj_stack().await;
    let c = stack.client().await;
    let large = std::env::var("S3DMA_TEST_LARGE_OBJECT")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(64 << 20, |l| l.min(64 << 20));
    for (i, len) in [1usize, 4096, (1 << 20) + 3, large].into_iter().enumerate() {
        let key = format!("hipobj/{i}-{len}");
        let payload = data(len, 70 + i as u64);
        let mut src = c.alloc(len).await.unwrap();
        src.as_mut_slice().copy_from_slice(&payload);
        let put = guard(c.put_object_from("alice-data", &key, &src, 0..len, PutOptions::default()))
            .await
            .unwrap();
        assert_eq!(put.size, len as u64);
        assert_eq!(put.path, hipobj_path(), "{key}");
        assert_eq!(
            sha256(&sdk_bytes(&stack, "alice-data", &key).await),
            sha256(&payload),
            "{key} as stored"
        );
        let mut dst = c.alloc(len + 8192).await.unwrap();
        dst.as_mut_slice().fill(0xEE);
        let got = guard(c.get_object_into(
            "alice-data",
            &key,
            &mut dst,
            4096,
            GetOptions {
                length: Some(len as u64),
                ..Default::default()
            },
        ))
        .await
        .unwrap();
        assert_eq!(got.bytes_placed, len as u64);
        assert_eq!(got.path, hipobj_path(), "{key}");
        assert_eq!(got.object.etag, put.etag);
        let b = dst.as_slice();
        assert_eq!(sha256(&b[4096..4096 + len]), sha256(&payload), "{key}");
        assert!(b[..4096].iter().all(|&x| x == 0xEE), "{key}: bytes before");
        assert!(
            b[4096 + len..].iter().all(|&x| x == 0xEE),
            "{key}: bytes after"
        );
    }

    // Ranges: offsets into the object, across a chunk boundary.
    let key = "hipobj/ranged";
    let payload = data(3 << 20, 99);
    let mut src = c.alloc(payload.len()).await.unwrap();
    src.as_mut_slice().copy_from_slice(&payload);
    c.put_object_from(
        "alice-data",
        key,
        &src,
        0..payload.len(),
        PutOptions::default(),
    )
    .await
    .unwrap();
    let n = payload.len() as u64;
    for (range, want) in [
        (
            ByteRange::Bounded {
                first: (1 << 20) - 5,
                last: (1 << 20) + 10,
            },
            &payload[(1 << 20) - 5..(1 << 20) + 11],
        ),
        (ByteRange::From(n - 100), &payload[payload.len() - 100..]),
        (ByteRange::Suffix(7), &payload[payload.len() - 7..]),
        (
            ByteRange::Bounded {
                first: 0,
                last: n - 1,
            },
            &payload[..],
        ),
    ] {
        let mut dst = c.alloc(payload.len()).await.unwrap();
        let got = guard(c.get_object_into(
            "alice-data",
            key,
            &mut dst,
            0,
            GetOptions {
                range: Some(range),
                ..Default::default()
            },
        ))
        .await
        .unwrap();
        assert_eq!(got.bytes_placed, want.len() as u64, "{range:?}");
        assert_eq!(
            sha256(&dst.as_slice()[..want.len()]),
            sha256(want),
            "{range:?}"
        );
    }

    // A range past the end is the tenant's error, not a transfer.
    let mut dst = c.alloc(4096).await.unwrap();
    let err = c
        .get_object_into(
            "alice-data",
            key,
            &mut dst,
            0,
            GetOptions {
                range: Some(ByteRange::From(n + 10)),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRange, "{err}");

    if agent::backend() == fabric::Backend::Verbs {
        let text = stack.target.metrics_text().await;
        assert!(
            agent::metric_value(&text, "s3dma_storage_target_hipobj_bytes_total") > 0.0,
            "the target served no hipobj-rc-v2 bytes:\n{text}"
        );
        // Every session ended (none left to the reaper).
        assert_eq!(
            agent::metric_value(&text, "s3dma_storage_target_hipobj_sessions"),
            0.0
        );
    }
}

/// A target that does not serve hipobj-rc-v2 (`rdma.hipobj.enabled:
/// false`: every control request is `501` with
/// `x-amz-rdma-protocol-status: unsupported`): the agent sends the bytes
/// over HTTP instead, both ways, and nothing else is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hipobj_rc_v2_declined_by_the_target_goes_over_http() {
    let mut stack = Stack::start_with(|s| {
        s.target_yaml = "protocol: hipobj-rc-v2\n".into();
    })
    .await;
    // The target restarted with the dialect off: its answers are 501.
    stack.target.set_hipobj(false);
    let c = stack.client().await;
    let payload = data((2 << 20) + 1, 5);
    let mut src = c.alloc(payload.len()).await.unwrap();
    src.as_mut_slice().copy_from_slice(&payload);
    let put = guard(c.put_object_from(
        "alice-data",
        "declined",
        &src,
        0..payload.len(),
        PutOptions::default(),
    ))
    .await
    .unwrap();
    assert_eq!(put.path, s3dma_client::TransferPath::Fallback);
    let mut dst = c.alloc(payload.len()).await.unwrap();
    let got =
        guard(c.get_object_into("alice-data", "declined", &mut dst, 0, GetOptions::default()))
            .await
            .unwrap();
    assert_eq!(got.path, s3dma_client::TransferPath::Fallback);
    assert_eq!(sha256(dst.as_slice()), sha256(&payload));
    // One object, exactly the bytes sent (the declined PREPARE stored nothing).
    assert_eq!(
        sha256(&sdk_bytes(&stack, "alice-data", "declined").await),
        sha256(&payload)
    );
    let listed = c.list_all("alice-data", "").await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
}

/// A tenant's shim killed in the middle of a hipobj-rc-v2 PUT: the
/// server's sessions end by their deadlines (the data phase's 408, the
/// reaper for prepared ones), the agent aborts the multipart upload, and
/// no object appears. Needs the shim on a verbs device (the Soft-RoCE VM).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hipobj_rc_v2_a_shim_killed_mid_transfer_stores_nothing() {
    if agent::backend() != fabric::Backend::Verbs {
        println!(
            "SKIPPED: the shim's queue pairs need a verbs device (the Soft-RoCE VM runs this)"
        );
        return;
    }
    let mut stack = hipobj_stack().await;
    stack.target.reconfigure(|c| {
        c.rdma.hipobj.transfer_timeout_secs = 3;
        c.rdma.hipobj.prepared_timeout_secs = 3;
    });
    let c = stack.client().await;
    // Large enough that the kill comes mid-PUT, also under the VM's
    // emulated CPUs.
    let len = 256 << 20;
    let mut src = c.alloc(len).await.unwrap();
    src.as_mut_slice().fill(0x5A);
    let put = async {
        c.put_object_from("alice-data", "killed", &src, 0..len, PutOptions::default())
            .await
    };
    let kill = async {
        // As soon as the server holds a session of ours, the shim dies.
        let deadline = std::time::Instant::now() + HANG_GUARD;
        loop {
            let text = stack.target.metrics_text().await;
            if agent::metric_value(&text, "s3dma_storage_target_hipobj_sessions") > 0.0 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no session began");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(stack.shim.pid().unwrap() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    };
    let (r, ()) = guard(async { tokio::join!(put, kill) }).await;
    assert!(r.is_err(), "the PUT finished before the shim died: {r:?}");
    // Every session ends by its deadline; the upload is aborted.
    let s3 = stack.target.s3(ALICE);
    let deadline = std::time::Instant::now() + HANG_GUARD;
    loop {
        let text = stack.target.metrics_text().await;
        let open = agent::metric_value(&text, "s3dma_storage_target_hipobj_sessions");
        let uploads = s3
            .list_multipart_uploads()
            .bucket("alice-data")
            .send()
            .await
            .unwrap()
            .uploads
            .unwrap_or_default()
            .len();
        if open == 0.0 && uploads == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{open} sessions and {uploads} uploads left"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let head = s3
        .head_object()
        .bucket("alice-data")
        .key("killed")
        .send()
        .await;
    assert!(head.is_err(), "an object appeared: {head:?}");
}

/// A `cuobject-dc` target where this host has no DC target (tcp; rxe0 in
/// the VM is not an mlx5 device): the shim mints no standard token, the
/// agent sends none, and the bytes go over HTTP through the agent, both
/// ways, exactly. On an mlx5 host the same stack moves them by DC:
/// `cuobject_dc_through_the_stack_on_mlx5`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuobject_dc_without_dc_on_this_host_goes_over_http() {
    let stack = Stack::start_with(|s| {
        s.target_yaml = "protocol: cuobject-dc\n".into();
    })
    .await;
    let c = stack.client().await;
    let payload = data((3 << 20) + 5, 12);
    let mut src = c.alloc(payload.len()).await.unwrap();
    src.as_mut_slice().copy_from_slice(&payload);
    let put = guard(c.put_object_from(
        "alice-data",
        "dc-less",
        &src,
        0..payload.len(),
        PutOptions::default(),
    ))
    .await
    .unwrap();
    assert_eq!(put.path, s3dma_client::TransferPath::Fallback);
    let mut dst = c.alloc(payload.len()).await.unwrap();
    let got = guard(c.get_object_into("alice-data", "dc-less", &mut dst, 0, GetOptions::default()))
        .await
        .unwrap();
    assert_eq!(got.path, s3dma_client::TransferPath::Fallback);
    assert_eq!(sha256(dst.as_slice()), sha256(&payload));
    if agent::backend() == fabric::Backend::Verbs {
        assert!(
            stack.shim.log().contains("no DC target"),
            "{}",
            stack.shim.log()
        );
    }
}

/// The whole stack on a host whose NIC does DC: the shim's DC target, the
/// agent's `cuobject-dc` target (a storage-target built with `dc`), GET
/// and PUT by the target's DC initiators straight into and out of the
/// tenant's buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an mlx5 device with DC (ConnectX-5 or newer, BlueField): S3DMA_TEST_FABRIC=verbs cargo test -p s3dma-e2e --all-features --test it shim::e2e::cuobject_dc_through_the_stack_on_mlx5 -- --ignored"]
async fn cuobject_dc_through_the_stack_on_mlx5() {
    assert_eq!(
        agent::backend(),
        fabric::Backend::Verbs,
        "S3DMA_TEST_FABRIC=verbs"
    );
    let stack = Stack::start_with(|s| {
        s.target_yaml = "protocol: cuobject-dc\n".into();
    })
    .await;
    let c = stack.client().await;
    for len in [1usize, 4096, (1 << 20) + 3, 64 << 20] {
        let key = format!("dc/{len}");
        let payload = data(len, len as u64);
        let mut src = c.alloc(len).await.unwrap();
        src.as_mut_slice().copy_from_slice(&payload);
        let put = guard(c.put_object_from("alice-data", &key, &src, 0..len, PutOptions::default()))
            .await
            .unwrap();
        assert_eq!(put.path, s3dma_client::TransferPath::Rdma, "{key}");
        assert_eq!(
            sha256(&sdk_bytes(&stack, "alice-data", &key).await),
            sha256(&payload)
        );
        let mut dst = c.alloc(len).await.unwrap();
        let got = guard(c.get_object_into("alice-data", &key, &mut dst, 0, GetOptions::default()))
            .await
            .unwrap();
        assert_eq!(got.path, s3dma_client::TransferPath::Rdma, "{key}");
        assert_eq!(sha256(dst.as_slice()), sha256(&payload), "{key}");
    }
}
