//! Regressions of the hostile review of issue #20, one test per finding,
//! each against real processes (as another uid where identity matters):
//!
//! 1. a fake shim: the clients' side, in `client/tests`,
//!    `e2e/tests/it/cli` and `tests/python`; here, the shim refuses a
//!    socket directory others could write to;
//! 2. memory before identification: strangers are closed at accept
//!    (`e2e.rs::two_tenants_are_isolated`), a tenant's messages are bounded
//!    per method before they are decoded;
//! 3. descriptors: connections per tenant are capped (the other tenant
//!    still gets in), a lease frame must complete and may carry one fd,
//!    idle gRPC connections are closed;
//! 4. batches: items run as single requests holding the tenant's permits
//!    and windows, minted when each starts; batches have a maximum size;
//! 5. local state: the launcher's directories (`e2e/tests/it/cli`);
//! 6. log forging: names a client chooses are logged escaped, and its
//!    request id never replaces the shim's;
//! 7. metrics behind a bearer token and on an owner-only Unix socket.

use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::process::Command;
use std::time::Duration;

use super::*;

/// The shim's open descriptors.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// The shim's resident memory, KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Waits until the peer closes `s` (a read returns 0 or fails).
async fn closed_by_peer(what: &str, s: &mut UnixStream) {
    let mut b = [0u8; 256];
    guard(what, async {
        loop {
            match s.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
}

/// Opens a lease by hand; returns the stream after the shim's reply.
async fn open_lease(socket: &Path) -> UnixStream {
    let mut s = UnixStream::connect(socket).await.unwrap();
    s.write_all(&s3dma_proto::lease::MAGIC).await.unwrap();
    let mut reply = [0u8; s3dma_proto::lease::REPLY_HEADER_LEN];
    s.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[0], 0, "lease refused: {reply:?}");
    s
}

/// Sends `bytes` with `fds` attached (SCM_RIGHTS).
fn send_with_fds(s: &UnixStream, bytes: &[u8], fds: &[i32]) {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let iov = [std::io::IoSlice::new(bytes)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    sendmsg::<()>(s.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None).unwrap();
}

fn memfd() -> std::os::fd::OwnedFd {
    let m = fabric::Memory::memfd("isolation", 4096).unwrap();
    m.fd().unwrap().try_clone_to_owned().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_directory_others_can_write_is_refused() {
    let stack = Stack::start().await;
    let text = std::fs::read_to_string(&stack.shim.config).unwrap();
    let check = |dir: &Path| {
        let cfg = text.replace(
            &format!("path: {}/shim.sock", stack.dir.path().display()),
            &format!("path: {}/shim.sock", dir.display()),
        );
        let file = dir.parent().unwrap().join(format!(
            "{}.yaml",
            dir.file_name().unwrap().to_string_lossy()
        ));
        std::fs::write(&file, cfg).unwrap();
        let out = Command::new(agent::bin_dir().join("host-shim"))
            .arg("--config")
            .arg(&file)
            .arg("--check")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let base = tempfile::tempdir().unwrap();
    // Writable by everyone (as a /tmp directory made by someone else would be).
    let open = base.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (ok, err) = check(&open);
    assert!(
        !ok && err.contains("socket.path") && err.contains("mode 0777"),
        "{err}"
    );
    // Owned by another user.
    let theirs = base.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(BOB_UID), Some(BOB_UID)).unwrap();
    let (ok, err) = check(&theirs);
    assert!(
        !ok && err.contains(&format!("owned by uid {BOB_UID}")),
        "{err}"
    );
    // A symlink to a good directory.
    let good = base.path().join("good");
    std::fs::create_dir(&good).unwrap();
    let link = base.path().join("link");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    let (ok, err) = check(&link);
    assert!(!ok && err.contains("symbolic link"), "{err}");
    let (ok, err) = check(&good);
    assert!(ok, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_bounded_per_method_before_decoding() {
    let stack = Stack::start().await;
    let pid = stack.shim.pid().unwrap();
    let mut raw = raw_tenant_client(&stack.shim.socket).await;
    // A registration is small: a 1 MiB label is refused unread.
    let st = raw
        .register_buffer(api::RegisterBufferRequest {
            label: "x".repeat(1 << 20),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::ResourceExhausted, "{st:?}");
    assert!(st.message().contains("at most 4096 bytes"), "{st:?}");
    // Many large messages on many streams: each refused, memory flat.
    let before = rss_kib(pid);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..64 {
        let mut c = raw.clone();
        calls.spawn(async move {
            c.get_object(api::GetObjectRequest {
                bucket: "alice-data".into(),
                key: format!("{i}-{}", "k".repeat(8 << 20)),
                ..Default::default()
            })
            .await
        });
    }
    while let Some(r) = calls.join_next().await {
        let st = r.unwrap().unwrap_err();
        assert!(
            matches!(
                st.code(),
                tonic::Code::ResourceExhausted | tonic::Code::OutOfRange
            ),
            "{st:?}"
        );
    }
    let grown = rss_kib(pid).saturating_sub(before);
    println!(
        "isolation: 64 oversized GetObject messages (8 MiB each) grew the shim by {grown} KiB"
    );
    // 64 × 8 MiB were sent; tonic buffering them would be 512 MiB.
    assert!(grown < 64 << 10, "the shim grew by {grown} KiB");
    // The tenant is served as before.
    raw.info(api::InfoRequest {}).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_capped_per_tenant_and_the_other_tenant_gets_in() {
    let stack = Stack::start_opts(
        |_| {},
        ShimOpts {
            alice_yaml: "max_connections: 8".into(),
            ..Default::default()
        },
    )
    .await;
    let pid = stack.shim.pid().unwrap();
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(open_lease(&stack.shim.socket).await);
    }
    let fds = fd_count(pid);
    // The ninth is closed at once, unread.
    let mut ninth = UnixStream::connect(&stack.shim.socket).await.unwrap();
    closed_by_peer("alice's ninth connection", &mut ninth).await;
    assert!(stack.shim.metric("s3dma_shim_connections_refused_total") >= 1.0);
    // Many more cost the shim nothing.
    for _ in 0..200 {
        let mut s = UnixStream::connect(&stack.shim.socket).await.unwrap();
        closed_by_peer("a capped connection", &mut s).await;
    }
    assert!(fd_count(pid) <= fds, "{} > {fds}", fd_count(pid));
    // Bob, another tenant, opens a lease and registers memory meanwhile.
    let dir = stack.dir.path().to_owned();
    let env = [("E2E_SOCKET", stack.shim.socket.display().to_string())];
    tokio::task::spawn_blocking(move || {
        run_test_as(
            &dir,
            BOB_UID,
            "shim::hostile::isolation::child_bob_registers",
            &env,
        )
    })
    .await
    .unwrap();
    // Alice gets in again once she closes some.
    held.truncate(4);
    guard("the shim to see four leases close", async {
        while stack.shim.metric("s3dma_shim_leases") > 4.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let c = stack.client().await;
    c.alloc(4096).await.unwrap();
}

#[tokio::test]
#[ignore = "run as bob by connections_are_capped_per_tenant_and_the_other_tenant_gets_in"]
async fn child_bob_registers() {
    let socket = std::env::var("E2E_SOCKET").unwrap();
    let c = Client::connect(&socket).await.unwrap();
    c.alloc(4096).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_frames_must_complete_and_carry_one_fd() {
    let stack = Stack::start().await;
    let pid = stack.shim.pid().unwrap();
    let baseline = fd_count(pid);
    // Half a frame with an fd: counted while it waits, then the lease is
    // closed and the fd with it.
    let mut s = open_lease(&stack.shim.socket).await;
    let fd = memfd();
    send_with_fds(&s, b"FD\0", &[fd.as_raw_fd()]);
    closed_by_peer("a lease stopping mid-frame", &mut s).await;
    drop(s);
    // Two fds in one frame: the lease ends at once, both closed.
    let mut s = open_lease(&stack.shim.socket).await;
    let (a, b) = (memfd(), memfd());
    let frame = s3dma_proto::lease::FdRequest { seq: 1 }.encode();
    send_with_fds(&s, &frame, &[a.as_raw_fd(), b.as_raw_fd()]);
    closed_by_peer("a lease frame with two fds", &mut s).await;
    drop(s);
    guard("the shim's descriptors to settle", async {
        while fd_count(pid) > baseline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // An honest lease still works.
    let c = stack.client().await;
    c.alloc(4096).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_grpc_connections_are_closed() {
    let stack = Stack::start_opts(
        |_| {},
        ShimOpts {
            socket_yaml: "idle_timeout_secs: 1".into(),
            ..Default::default()
        },
    )
    .await;
    let s = UnixStream::connect(&stack.shim.socket).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(s),
    )
    .await
    .unwrap();
    let ended = tokio::spawn(conn);
    // One call, then nothing: the shim closes the connection.
    let req = http::Request::post("http://localhost/s3dma.tenant.v1.Tenant/Info")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(&[
            0, 0, 0, 0, 0,
        ])))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    drop(resp);
    guard("the idle connection to close", ended)
        .await
        .unwrap()
        .ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_holds_one_permit_and_a_window_per_item_while_it_runs() {
    let mut fake = FakeTarget::start().await;
    let fake_endpoint = fake.endpoint.clone();
    let stack = Stack::start_opts(
        move |spec| {
            spec.targets.push(agent::TargetSpec {
                name: "fake",
                endpoint: fake_endpoint,
                buckets: vec!["shared"],
                rdma: true,
            });
        },
        ShimOpts {
            alice_yaml: "max_concurrent_requests: 2\nmax_batch_items: 4".into(),
            ..Default::default()
        },
    )
    .await;
    let c = stack.client().await;
    let buf = c.alloc(4096).await.unwrap();
    let mut raw = raw_tenant_client(&stack.shim.socket).await;
    let item = |i: u64| api::GetObjectsItem {
        bucket: "shared".into(),
        key: format!("k{i}"),
        range: None,
        destination: Some(api::BufferSlice {
            buffer_id: buf.id(),
            offset: i * 100,
            length: Some(100),
        }),
        if_match: String::new(),
    };
    // Over the maximum: refused whole.
    let st = raw
        .get_objects(api::GetObjectsRequest {
            items: (0..5).map(item).collect(),
            concurrency: 8,
        })
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::InvalidArgument, "{st:?}");
    assert!(st.message().contains("max_batch_items"), "{st:?}");
    // Three items in one call: the batch holds one of the tenant's two
    // permits (not one per item) and a window per item, minted up front.
    let batch_raw = raw.clone();
    let batch = |keys: std::ops::Range<u64>| {
        let mut raw = batch_raw.clone();
        let items: Vec<_> = keys.map(item).collect();
        tokio::spawn(async move {
            let mut s = raw
                .get_objects(api::GetObjectsRequest {
                    items,
                    concurrency: 3,
                })
                .await
                .unwrap()
                .into_inner();
            let mut replies = Vec::new();
            while let Some(r) = s.message().await.unwrap() {
                replies.push(r);
            }
            replies
        })
    };
    let running = batch(0..3);
    // The agent offers the items to this target as one s3dma batch
    // request; the fake answers as a foreign server does (an unmarked
    // 404), so the agent remembers the decline and sends single GETs.
    let offer = fake.next().await;
    assert_eq!(
        (offer.method.as_str(), offer.path.as_str()),
        ("POST", "/?s3dma-batch")
    );
    offer.reply.send(s3_error(404, "NoSuchKey")).unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(fake.next().await);
    }
    // Each item has its own window (distinct tokens); all three are open
    // while the items run, and the tenant's second permit is free.
    let mut rkeys: Vec<_> = held.iter().map(|c| c.token().rkey).collect();
    rkeys.sort_unstable();
    rkeys.dedup();
    assert_eq!(rkeys.len(), 3, "{rkeys:?}");
    assert_eq!(stack.shim.metric("s3dma_shim_windows_open"), 3.0);
    raw.info(api::InfoRequest {}).await.unwrap();
    // A second batch takes that permit: the tenant has none left.
    let second = batch(3..4);
    let fourth = fake.next().await;
    assert_eq!(fourth.path, "/shared/k3");
    let st = raw.info(api::InfoRequest {}).await.unwrap_err();
    assert_eq!(st.code(), tonic::Code::ResourceExhausted, "{st:?}");
    assert_eq!(stack.shim.metric("s3dma_shim_windows_open"), 4.0);
    for c in held.into_iter().chain([fourth]) {
        c.reply.send(s3_error(404, "NoSuchKey")).unwrap();
    }
    let mut replies = guard("the batch", running).await.unwrap();
    assert_eq!(replies.len(), 3);
    replies.extend(guard("the second batch", second).await.unwrap());
    for r in replies {
        match r.result {
            Some(agent_pb::get_objects_reply::Result::Error(e)) => {
                assert_eq!(e.s3_code, "NoSuchKey", "{e:?}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(stack.shim.metric("s3dma_shim_windows_open"), 0.0);
    raw.info(api::InfoRequest {}).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_chosen_names_and_ids_cannot_forge_log_lines() {
    let stack = Stack::start().await;
    let c = stack.client().await;
    let mut buf = c.alloc(4096).await.unwrap();
    let key = "evil\n2026-01-01T00:00:00.000000Z  INFO forged: tenant=bob\u{1b}[31mred";
    let e = c
        .get_object_into("alice-data", key, &mut buf, 0, GetOptions::default())
        .await
        .unwrap_err();
    // The shim's own id, not one the client chose.
    let mut raw = raw_tenant_client(&stack.shim.socket).await;
    let mut req = tonic::Request::new(api::HeadObjectRequest {
        bucket: "alice-data".into(),
        key: key.into(),
    });
    req.metadata_mut()
        .insert("x-request-id", "CLIENT-CHOSEN-ID".parse().unwrap());
    let st = raw.head_object(req).await.unwrap_err();
    use tonic_types::StatusExt as _;
    let rid = st
        .get_details_error_info()
        .and_then(|i| i.metadata.get("request_id").cloned())
        .unwrap_or_default();
    assert_ne!(rid, "CLIENT-CHOSEN-ID", "{st:?}");
    for (who, log) in [("shim", stack.shim.log()), ("agent", stack.agent.output())] {
        assert!(
            !log.contains('\u{1b}'),
            "{who} log has an escape character:\n{log}"
        );
        assert!(
            !log.lines()
                .any(|l| l.contains("INFO forged") && !l.contains("evil")),
            "{who} log has a forged line:\n{log}"
        );
    }
    assert!(
        e.to_string().contains("NoSuchKey") || e.kind() == s3dma_client::ErrorKind::NotFound,
        "{e}"
    );
    // The key did reach a log, escaped on one line.
    let logs = stack.shim.log() + &stack.agent.output();
    assert!(
        logs.contains("evil\\n2026"),
        "the key is in no log:\n{logs}"
    );
    // The client's id is kept, marked as the client's, beside the shim's.
    assert!(
        logs.lines()
            .any(|l| l.contains("client_request_id=CLIENT-CHOSEN-ID")
                && l.contains(" request_id=shim-")),
        "{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_require_a_token_and_live_on_an_owner_only_socket() {
    let extra = tempfile::tempdir().unwrap();
    let token = extra.path().join("metrics.token");
    agent::write_private(&token, "scrape-secret-123");
    let sock = extra.path().join("metrics.sock");
    let stack = Stack::start_opts(
        |_| {},
        ShimOpts {
            metrics_yaml: format!(
                "unix_socket: {}\nbearer_token_file: {}",
                sock.display(),
                token.display()
            ),
            ..Default::default()
        },
    )
    .await;
    let addr = stack
        .shim
        .metrics
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .to_owned();
    let get = |auth: Option<&str>| {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        let auth = auth
            .map(|a| format!("Authorization: Bearer {a}\r\n"))
            .unwrap_or_default();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    };
    let denied = get(None);
    assert!(denied.starts_with("HTTP/1.1 401"), "{denied}");
    assert!(!denied.contains("s3dma_shim_"), "{denied}");
    let wrong = get(Some("scrape-secret-124"));
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    let ok = get(Some("scrape-secret-123"));
    assert!(
        ok.starts_with("HTTP/1.1 200") && ok.contains("s3dma_shim_"),
        "{ok}"
    );
    // The Unix socket: owner-only, and served (with the token too).
    let meta = std::fs::symlink_metadata(&sock).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600);
    use std::io::{Read as _, Write as _};
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer scrape-secret-123\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(
        text.starts_with("HTTP/1.1 200") && text.contains("s3dma_shim_"),
        "{text}"
    );
    // The token never shows in the shim's log.
    assert!(!stack.shim.log().contains("scrape-secret-123"));
}
