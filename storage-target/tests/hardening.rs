//! Hostile-review regressions against the real binary: private local state,
//! private secret files, fair sharing of the RDMA staging pool, log lines a
//! client cannot forge, and metrics behind a bearer token or on a Unix
//! socket. The filesystem store's listings, multipart caps and ownership
//! rules: `hardening/store.rs`.

mod common;
#[path = "hardening/store.rs"]
mod store;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;
use common::{ADMIN, Launch, OTHER, READER, Raw, Server, data, raw, sign_v4_as, write_private};
use fabric::{
    Access, Domain, Endpoint, EndpointAddr, EndpointConfig, FabricKey, RdmaToken, Region,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const KEY_HEX: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

fn key() -> FabricKey {
    fabric::config::parse_fabric_key(KEY_HEX).unwrap()
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// Every directory and file under `dir` (not `dir` itself).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        out.push(p.clone());
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&p));
        }
    }
    out
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

// ---- 1. local state -------------------------------------------------------

#[tokio::test]
async fn data_directory_and_every_stored_file_are_private() {
    // A pre-existing data directory of mode 0755 and a umask of 022: what an
    // operator's `mkdir -p` leaves behind.
    let s = Server::launch(
        |dir: &Path| {
            let d = dir.join("data");
            std::fs::create_dir(&d).unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
            String::new()
        },
        Launch { umask: Some(0o022) },
    );
    let c = s.admin();
    c.create_bucket().bucket("priv").send().await.unwrap();
    c.put_object()
        .bucket("priv")
        .key("single")
        .body(ByteStream::from(data(10_000, 1)))
        .send()
        .await
        .unwrap();
    // A completed multipart upload, and one left in progress with a part
    // on disk.
    let part = data((5 << 20) + 1, 2);
    for (key, complete) in [("mp-done", true), ("mp-open", false)] {
        let up = c
            .create_multipart_upload()
            .bucket("priv")
            .key(key)
            .send()
            .await
            .unwrap();
        let id = up.upload_id().unwrap();
        let p = c
            .upload_part()
            .bucket("priv")
            .key(key)
            .upload_id(id)
            .part_number(1)
            .body(ByteStream::from(part.clone()))
            .send()
            .await
            .unwrap();
        if complete {
            c.complete_multipart_upload()
                .bucket("priv")
                .key(key)
                .upload_id(id)
                .multipart_upload(
                    CompletedMultipartUpload::builder()
                        .parts(
                            CompletedPart::builder()
                                .part_number(1)
                                .e_tag(p.e_tag().unwrap())
                                .build(),
                        )
                        .build(),
                )
                .send()
                .await
                .unwrap();
        }
    }
    assert_eq!(
        mode(&s.data_dir),
        0o700,
        "the data directory was not tightened"
    );
    let all = walk(&s.data_dir);
    let files: Vec<_> = all.iter().filter(|p| p.is_file()).collect();
    // bucket.json, two objects, upload.json, one part at least.
    assert!(files.len() >= 5, "{all:?}");
    for p in &all {
        let want = if p.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode(p), want, "{} has mode {:04o}", p.display(), mode(p));
    }
}

/// Runs the binary to completion on `config` (`--check` when `check`).
fn run_binary(config: &Path, check: bool) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_storage-target"));
    cmd.arg("--config").arg(config);
    if check {
        cmd.arg("--check");
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn minimal_config(dir: &Path, data: &Path, users: &str) -> PathBuf {
    let p = dir.join("st.yaml");
    std::fs::write(
        &p,
        format!(
            "listen: 127.0.0.1:0\ndata_dir: {}\nusers:\n{users}",
            data.display()
        ),
    )
    .unwrap();
    p
}

#[test]
fn a_data_directory_of_another_user_or_a_symlink_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let users = "  - {access_key_id: a, secret: s}\n";
    // A symlink where the data directory belongs.
    let real = t.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let link = t.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let (ok, out) = run_binary(&minimal_config(t.path(), &link, users), false);
    assert!(!ok, "{out}");
    assert!(
        out.contains(&link.display().to_string()) && out.contains("symbolic link"),
        "{out}"
    );
    if !is_root() {
        eprintln!("not root: the other-owner case needs chown; skipped");
        return;
    }
    let theirs = t.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).unwrap();
    nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
    let (ok, out) = run_binary(&minimal_config(t.path(), &theirs, users), false);
    assert!(!ok, "{out}");
    assert!(
        out.contains(&theirs.display().to_string()) && out.contains("owned by uid 65534"),
        "{out}"
    );
    // Untouched: neither tightened nor written into.
    assert_eq!(mode(&theirs), 0o755);
    assert!(std::fs::read_dir(&theirs).unwrap().next().is_none());
}

// ---- 2. secret files ------------------------------------------------------

#[test]
fn secret_files_others_can_read_are_refused_at_check_and_start() {
    let t = tempfile::tempdir().unwrap();
    let secret = t.path().join("user.secret");
    std::fs::write(&secret, "very-secret-value\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cfg = minimal_config(
        t.path(),
        &t.path().join("data"),
        &format!(
            "  - {{access_key_id: a, secret: s}}\n  - {{access_key_id: b, secret_file: {}}}\n",
            secret.display()
        ),
    );
    for check in [true, false] {
        let (ok, out) = run_binary(&cfg, check);
        assert!(!ok, "check={check}: {out}");
        assert!(out.contains("users[1].secret_file"), "{out}");
        assert!(
            out.contains(&format!("{} has mode 0644", secret.display())),
            "{out}"
        );
        assert!(out.contains("chmod 600"), "{out}");
        assert!(!out.contains("very-secret-value"), "{out}");
    }
    // Nothing was created at start.
    assert!(!t.path().join("data").exists());
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (ok, out) = run_binary(&cfg, true);
    assert!(ok, "{out}");
    // The metrics token file is held to the same rule.
    let token = t.path().join("metrics.token");
    std::fs::write(&token, "tok\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "metrics:\n  address: 127.0.0.1:0\n  bearer_token_file: {}\n",
        token.display()
    ));
    std::fs::write(&cfg, text).unwrap();
    let (ok, out) = run_binary(&cfg, true);
    assert!(!ok, "{out}");
    assert!(
        out.contains("metrics.bearer_token_file")
            && out.contains(&format!("{} has mode 0644", token.display())),
        "{out}"
    );
}

// ---- 3. fair sharing of the staging pool ------------------------------------

/// Tenant memory served by a fabric endpoint.
struct Tenant {
    endpoint: Endpoint,
    mem: Region,
}

impl Tenant {
    async fn new(len: usize) -> Tenant {
        let domain = Domain::tcp();
        let mem = domain.alloc(len, Access::ALL).unwrap();
        let endpoint = Endpoint::listen(
            &domain,
            EndpointConfig::new("127.0.0.1:0".parse().unwrap(), key()),
        )
        .await
        .unwrap();
        Tenant { endpoint, mem }
    }

    /// A token for `[off, off+len)`, naming `via` as the endpoint's address
    /// when given (a proxy in front of the endpoint).
    fn token(&self, off: usize, len: usize, via: Option<&Proxy>) -> String {
        let w = self
            .mem
            .window(off, len, Access::REMOTE_WRITE, None)
            .unwrap();
        let t = self.endpoint.token(&w).unwrap();
        std::mem::forget(w); // keep the window valid for the test's life
        match via {
            None => t.to_string(),
            Some(p) => {
                let ep = t.endpoint().unwrap();
                RdmaToken::new(
                    EndpointAddr {
                        addr: p.addr,
                        responder: ep.responder,
                    },
                    t.remote(),
                )
                .unwrap()
                .to_string()
            }
        }
    }

    fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read_at(off, &mut v).unwrap();
        v
    }
}

/// A TCP proxy in front of a tenant's endpoint that can hold back what the
/// endpoint answers (its completions), so the target's operations on that
/// session stay in flight, their staging buffers held: a stalled client.
struct Proxy {
    addr: std::net::SocketAddr,
    hold: watch::Sender<bool>,
}

impl Proxy {
    async fn start(to: std::net::SocketAddr) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (hold, held) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((a, _)) = l.accept().await {
                let Ok(b) = TcpStream::connect(to).await else {
                    continue;
                };
                let (ar, aw) = a.into_split();
                let (br, bw) = b.into_split();
                tokio::spawn(pipe(ar, bw, None));
                tokio::spawn(pipe(br, aw, Some(held.clone())));
            }
        });
        Proxy { addr, hold }
    }

    fn stall(&self, on: bool) {
        self.hold.send_replace(on);
    }
}

async fn pipe(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    mut held: Option<watch::Receiver<bool>>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(h) = held.as_mut()
            && h.wait_for(|on| !*on).await.is_err()
        {
            return;
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A signed RDMA GET of `path` as `user`.
async fn rdma_get_as(user: (&str, &str), endpoint: &str, path: &str, token: &str) -> Raw {
    let url = format!("{endpoint}{path}");
    let headers = sign_v4_as(
        user,
        "GET",
        &url,
        &[("x-amz-rdma-token", token)],
        aws_sigv4::http_request::SignableBody::UnsignedPayload,
        SystemTime::now(),
    );
    let hs: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(k, _)| k != "host")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    raw("GET", &url, &hs, Bytes::new()).await
}

fn metric(text: &str, name_and_labels: &str) -> i64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap_or(0.0) as i64)
}

async fn scrape(s: &Server) -> String {
    raw("GET", &s.metrics, &[], Bytes::new()).await.text()
}

/// Scrapes until `ok` holds (a liveness deadline, not a timing assertion).
async fn wait_metrics(s: &Server, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let m = scrape(s).await;
        if ok(&m) {
            return m;
        }
        assert!(std::time::Instant::now() < deadline, "never: {what}\n{m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Awaits a request that must not be stuck behind the stalled client: a
/// liveness deadline (a regression fails here instead of hanging), not a
/// timing assertion.
async fn unblocked(f: impl std::future::Future<Output = Raw>) -> Raw {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("the other client's GET waited behind the stalled client")
}

const IN_USE: &str = "s3dma_storage_target_rdma_staging_buffers_in_use";

/// GETs of 64 KiB go through staging buffers; GETs of 1 MiB or more are sent
/// from the object file but hold a buffer's share slot per chunk in flight,
/// so the same caps apply to both.
#[tokio::test]
async fn a_stalled_client_cannot_take_the_whole_staging_pool() {
    stalled_client_case(64 << 10).await; // 16 chunks, staged
}

#[tokio::test]
async fn a_stalled_client_cannot_take_the_whole_staging_pool_with_file_sends() {
    stalled_client_case(2 << 20).await; // 512 chunks, sent from the file
}

async fn stalled_client_case(len: usize) {
    // Four 4 KiB buffers; the default share (one half) leaves each client
    // session and each S3 user two of them.
    let s = Server::start_with(|dir: &Path| {
        let kf = dir.join("fabric.key");
        write_private(&kf, format!("{KEY_HEX}\n"));
        format!(
            "rdma:\n  mode: enabled\n  fabric_key_file: {}\n  connect_timeout_ms: 5000\n  staging_buffers: 4\n  staging_buffer_size: 4KiB\n",
            kf.display()
        )
    });
    let admin = s.admin();
    admin.create_bucket().bucket("shared").send().await.unwrap();
    let obj = data(len, 7);
    admin
        .put_object()
        .bucket("shared")
        .key("big")
        .body(ByteStream::from(obj.clone()))
        .send()
        .await
        .unwrap();
    let m = scrape(&s).await;
    assert_eq!(
        metric(&m, "s3dma_storage_target_rdma_staging_share_buffers"),
        2,
        "{m}"
    );

    let stalled = Tenant::new(len * 8).await;
    let other = Tenant::new(len * 4).await;
    let p1 = Proxy::start(stalled.endpoint.addr().addr).await;
    let p2 = Proxy::start(stalled.endpoint.addr().addr).await;
    // Open both proxied sessions while they still answer.
    for (i, p) in [&p1, &p2].into_iter().enumerate() {
        let r = rdma_get_as(
            ADMIN,
            &s.endpoint,
            "/shared/big",
            &stalled.token(len * i, len, Some(p)),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }

    // (a) One session: two GETs signed by two users through the same stalled
    // endpoint hold the session's share (2), not the pool (4).
    p1.stall(true);
    let g1 = {
        let (ep, tok) = (s.endpoint.clone(), stalled.token(len * 2, len, Some(&p1)));
        tokio::spawn(async move { rdma_get_as(ADMIN, &ep, "/shared/big", &tok).await })
    };
    let g2 = {
        let (ep, tok) = (s.endpoint.clone(), stalled.token(len * 3, len, Some(&p1)));
        tokio::spawn(async move { rdma_get_as(OTHER, &ep, "/shared/big", &tok).await })
    };
    wait_metrics(&s, "the stalled session holds its share and waits", |m| {
        metric(m, IN_USE) == 2
            && metric(
                m,
                "s3dma_storage_target_rdma_staging_share_waits_total{limit=\"session\"}",
            ) >= 1
    })
    .await;
    // Another client, another user: served while the stalled one waits.
    let r = unblocked(rdma_get_as(
        READER,
        &s.endpoint,
        "/shared/big",
        &other.token(0, len, None),
    ))
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(other.bytes(0, len) == obj, "the other client's GET differs");
    assert!(!g1.is_finished() && !g2.is_finished());
    assert_eq!(metric(&scrape(&s).await, IN_USE), 2);
    p1.stall(false);
    for (i, g) in [g1, g2].into_iter().enumerate() {
        let r = g.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(
            stalled.bytes(len * (2 + i), len) == obj,
            "stalled GET {i} differs"
        );
    }
    wait_metrics(&s, "every buffer back", |m| metric(m, IN_USE) == 0).await;

    // (b) One user: GETs through two stalled sessions hold the user's share.
    p1.stall(true);
    p2.stall(true);
    let g1 = {
        let (ep, tok) = (s.endpoint.clone(), stalled.token(len * 4, len, Some(&p1)));
        tokio::spawn(async move { rdma_get_as(ADMIN, &ep, "/shared/big", &tok).await })
    };
    let g2 = {
        let (ep, tok) = (s.endpoint.clone(), stalled.token(len * 5, len, Some(&p2)));
        tokio::spawn(async move { rdma_get_as(ADMIN, &ep, "/shared/big", &tok).await })
    };
    wait_metrics(&s, "the stalled user holds its share and waits", |m| {
        metric(m, IN_USE) == 2
            && metric(
                m,
                "s3dma_storage_target_rdma_staging_share_waits_total{limit=\"user\"}",
            ) >= 1
    })
    .await;
    let r = unblocked(rdma_get_as(
        OTHER,
        &s.endpoint,
        "/shared/big",
        &other.token(len, len, None),
    ))
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(other.bytes(len, len) == obj, "the other user's GET differs");
    assert!(!g1.is_finished() && !g2.is_finished());
    p1.stall(false);
    p2.stall(false);
    for (i, g) in [g1, g2].into_iter().enumerate() {
        let r = g.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(
            stalled.bytes(len * (4 + i), len) == obj,
            "stalled GET {i} differs"
        );
    }
    wait_metrics(&s, "every buffer back", |m| metric(m, IN_USE) == 0).await;
}

#[test]
fn a_share_below_one_buffer_is_refused_at_check() {
    let t = tempfile::tempdir().unwrap();
    let kf = t.path().join("fabric.key");
    write_private(&kf, KEY_HEX);
    let cfg = minimal_config(
        t.path(),
        &t.path().join("data"),
        &format!(
            "  - {{access_key_id: a, secret: s}}\nrdma:\n  mode: enabled\n  fabric_key_file: {}\n  staging_buffers: 3\n  max_staging_share: 0.25\n",
            kf.display()
        ),
    );
    let (ok, out) = run_binary(&cfg, true);
    assert!(!ok, "{out}");
    assert!(
        out.contains("rdma.max_staging_share") && out.contains("less than one buffer"),
        "{out}"
    );
}

// ---- 4. logs ----------------------------------------------------------------

/// Sends one raw HTTP/1.1 request with arbitrary header bytes; returns the
/// status line.
async fn send_raw_bytes(endpoint: &str, head: &[u8]) -> String {
    let addr = endpoint.strip_prefix("http://").unwrap();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(head).await.unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A PUT answered before its body is read (anonymous, so AccessDenied
/// before a byte of it) ends its connection. Kept alive, the server would
/// skip the body's length of whatever came next, and a client that sent
/// `Expect: 100-continue` and saw no 100 never sends that body: its next
/// request on the connection would lose its first bytes (seen with boto3:
/// a DELETE read as `ELETE`).
#[tokio::test]
async fn a_request_answered_before_its_body_ends_the_connection() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("early").send().await.unwrap();
    let addr = s.endpoint.strip_prefix("http://").unwrap();
    for (what, body) in [
        ("expect 100-continue, body never sent", ""),
        ("body sent", "x"),
    ] {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "PUT /early/k HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 1\r\n{}\r\n{body}",
            if body.is_empty() {
                "expect: 100-continue\r\n"
            } else {
                ""
            }
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        // The whole reply, then the end of the connection: no wait for a
        // body byte that is not coming.
        tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut out))
            .await
            .unwrap_or_else(|_| panic!("{what}: the connection stayed open after the reply"))
            .unwrap();
        let text = String::from_utf8_lossy(&out).to_ascii_lowercase();
        assert!(text.starts_with("http/1.1 403"), "{what}: {text}");
        assert!(text.contains("\r\nconnection: close\r\n"), "{what}: {text}");
        assert_eq!(text.matches("http/1.1 ").count(), 1, "{what}: {text}");
    }
    // A PUT whose body was read keeps its connection (no needless closes).
    c.put_object()
        .bucket("early")
        .key("ok")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn keys_and_client_request_ids_cannot_forge_log_lines() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("logs").send().await.unwrap();
    let evil = "k\n2030-01-01T00:00:00Z  INFO request{id=FORGED}: tenant=bob\x1b[31mred\u{202e}";
    c.put_object()
        .bucket("logs")
        .key(evil)
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap();
    let got = c
        .get_object()
        .bucket("logs")
        .key(evil)
        .send()
        .await
        .unwrap();
    assert_eq!(
        got.body.collect().await.unwrap().into_bytes().as_ref(),
        b"x"
    );
    // Client-chosen request ids: printable, with a tab, with ESC or DEL
    // (hyper refuses those requests with 400 before any handler runs, so
    // they cannot reach the log; if one ever got through, it must be logged
    // escaped), not UTF-8.
    let host = s.endpoint.strip_prefix("http://").unwrap().to_owned();
    let ids: [(&[u8], &str); 5] = [
        (b"agent-req-42", "agent-req-42"),
        (b"abc\tFORGED", "abc\\tFORGED"),
        (b"abc\x1b[31mred", "abc\\u{1b}[31mred"),
        (b"del\x7fdel", "del\\u{7f}del"),
        (b"id\xff\x9b31m", "id\\xff\\x9b31m"),
    ];
    let mut expect = Vec::new();
    for (id, escaped) in ids {
        for header in ["x-s3dma-request-id", "x-request-id"] {
            let mut head =
                format!("GET /logs HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n{header}: ")
                    .into_bytes();
            head.extend_from_slice(id);
            head.extend_from_slice(b"\r\n\r\n");
            let status = send_raw_bytes(&s.endpoint, &head).await;
            assert!(status.starts_with("HTTP/1.1 "), "{status:?}");
            if !status.starts_with("HTTP/1.1 400") {
                expect.push(format!("client_request_id={escaped}"));
            }
        }
    }
    assert!(expect.len() >= 6, "{expect:?}");
    // Let the log lines of the last requests land.
    let log = {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let log = s.log();
            if expect.iter().all(|e| log.contains(e.as_str())) {
                break log;
            }
            assert!(std::time::Instant::now() < deadline, "{log}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    for (i, b) in log.bytes().enumerate() {
        assert!(
            b == b'\n' || (b >= 0x20 && b != 0x7f),
            "raw control byte {b:#04x} at {i} in the log:\n{log}"
        );
    }
    assert!(
        !log.contains('\u{202e}') && !log.contains('\u{9b}'),
        "{log}"
    );
    for line in log.lines() {
        assert!(
            !line.starts_with("2030-01-01"),
            "a forged line: {line}\n{log}"
        );
    }
    // The key is there, escaped; the ids are there, marked client-supplied,
    // next to the target's own.
    assert!(log.contains("k\\n2030-01-01T00:00:00Z"), "{log}");
    assert!(log.contains("\\u{1b}[31mred\\u{202e}"), "{log}");
    for line in log.lines().filter(|l| l.contains("client_request_id=")) {
        let id = line.split("request{id=").nth(1).unwrap_or_default();
        let id: String = id.chars().take_while(char::is_ascii_hexdigit).collect();
        assert_eq!(id.len(), 16, "the target's own id is kept: {line}");
    }
}

// ---- 5. metrics ---------------------------------------------------------------

async fn unix_get(path: &Path, auth: Option<&str>) -> String {
    let mut s = tokio::net::UnixStream::connect(path).await.unwrap();
    let mut req = "GET /metrics HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n".to_owned();
    if let Some(a) = auth {
        req.push_str(&format!("authorization: Bearer {a}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn metrics_behind_a_bearer_token_and_on_a_private_unix_socket() {
    const TOKEN: &str = "metrics-token-3f9a";
    let sock = std::sync::Arc::new(std::sync::Mutex::new(PathBuf::new()));
    let sock2 = std::sync::Arc::clone(&sock);
    // The harness's `metrics_listen` gives the TCP address; the `metrics:`
    // section adds the socket and the token.
    let s = Server::start_with(move |dir: &Path| {
        let tf = dir.join("metrics.token");
        write_private(&tf, format!("{TOKEN}\n"));
        let sp = dir.join("metrics.sock");
        *sock2.lock().unwrap() = sp.clone();
        format!(
            "metrics:\n  unix_socket: {}\n  bearer_token_file: {}\n",
            sp.display(),
            tf.display()
        )
    });
    let sock = sock.lock().unwrap().clone();
    s.admin()
        .create_bucket()
        .bucket("metrics-b")
        .send()
        .await
        .unwrap();
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Basic YWRtaW46YWRtaW4="),
        Some("Bearer "),
    ] {
        let h: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", *a)).collect();
        let r = raw("GET", &s.metrics, &h, Bytes::new()).await;
        assert_eq!(r.status, 401, "{auth:?}: {}", r.text());
        assert!(!r.text().contains("s3dma_"), "{}", r.text());
    }
    let good = format!("Bearer {TOKEN}");
    let r = raw("GET", &s.metrics, &[("authorization", &good)], Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text().contains("s3dma_storage_target_requests_total"),
        "{}",
        r.text()
    );

    assert!(std::os::unix::fs::FileTypeExt::is_socket(
        &std::fs::symlink_metadata(&sock).unwrap().file_type()
    ));
    assert_eq!(mode(&sock), 0o600);
    let out = unix_get(&sock, None).await;
    assert!(out.starts_with("HTTP/1.1 401"), "{out}");
    assert!(!out.contains("s3dma_"), "{out}");
    let out = unix_get(&sock, Some(TOKEN)).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("s3dma_storage_target_requests_total"), "{out}");
    // The token never reaches the log.
    assert!(!s.log().contains(TOKEN));
}
