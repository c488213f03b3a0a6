//! Hostile-review regressions against the real binary: private local state,
//! private secret files, fair sharing of the RDMA staging pool, log lines a
//! client cannot forge, and metrics behind a bearer token or on a Unix
//! socket. The filesystem store's listings, multipart caps and ownership
//! rules: `hardening/store.rs`.

mod store;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use crate::common::{
    ADMIN, Launch, OTHER, READER, Raw, Server, data, get_as, raw, sdk_get, send_signed, sign_v4_as,
    write_private,
};
use crate::support::{
    assert_s3_error, assert_status, complete, completed, metrics_text, mkbucket, put, start_upload,
    stored,
};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use fabric::{Access, Domain, Endpoint, EndpointAddr, FabricKey, RdmaToken, Region};
use s3dma_wire::frame::{Auth, Challenge, Hello, VERSION, Verdict};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::support::{FABRIC_KEY_HEX as KEY_HEX, fabric_server, served_memory};

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
    mkbucket(&c, "priv").await.unwrap();
    put(&c, "priv", "single", &data(10_000, 1)).await;
    // A completed multipart upload, and one left in progress with a part
    // on disk.
    let part = data((5 << 20) + 1, 2);
    for (key, done) in [("mp-done", true), ("mp-open", false)] {
        let id = start_upload(&c, "priv", key).await;
        let p = c.upload_part().bucket("priv").key(key).upload_id(&id);
        let p = p.part_number(1).body(ByteStream::from(part.clone())).send();
        let etag = p.await.unwrap().e_tag.unwrap();
        if done {
            let parts = completed(&[(1, etag)]);
            complete(&c, "priv", key, &id, parts).await.unwrap();
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
    outcome(&mut cmd)
}

/// Runs `cmd` to completion: whether it succeeded, and its stdout and
/// stderr together.
fn outcome(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (&out.stdout, &out.stderr);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(stdout),
        String::from_utf8_lossy(stderr)
    );
    (out.status.success(), text)
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
        let (endpoint, mem) = served_memory(&domain, len, key()).await;
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

/// A proxy in front of a tenant's endpoint that can hold back what the
/// endpoint answers (its completions), so the target's operations on that
/// session stay in flight, their staging buffers held: a stalled client.
/// The fabric handshake names the endpoint dialled, so the proxy holds the
/// fabric key and is an endpoint of its own: it answers the target's
/// handshake as itself and makes its own to the tenant's endpoint, then
/// passes the operation frames through.
struct Proxy {
    addr: std::net::SocketAddr,
    hold: watch::Sender<bool>,
}

/// The proxy's side of the handshake with the target, as the endpoint
/// `me`; returns the target's hello.
async fn proxy_accept(s: &mut TcpStream, me: EndpointAddr) -> Option<Hello> {
    let mut b = [0u8; Hello::LEN];
    s.read_exact(&mut b).await.ok()?;
    let hello = Hello::decode(&b).ok()?;
    let nonce: [u8; 32] = rand::random();
    let c = Challenge {
        version: VERSION,
        nonce,
        mac: key().responder_proof(&hello, &me, VERSION, &nonce),
    };
    s.write_all(&c.encode()).await.ok()?;
    let mut a = [0u8; Auth::LEN];
    s.read_exact(&mut a).await.ok()?;
    let v = key().verdict(&hello, &c, &me, &Auth::decode(&a).ok()?.mac);
    s.write_all(&v.encode()).await.ok()?;
    (v == Verdict::Accepted).then_some(hello)
}

/// The proxy's own handshake with the tenant's endpoint `to`.
async fn proxy_connect(to: EndpointAddr, like: &Hello) -> Option<TcpStream> {
    let mut s = TcpStream::connect(to.addr).await.ok()?;
    let hello = Hello {
        target: to,
        nonce: rand::random(),
        ..*like
    };
    s.write_all(&hello.encode()).await.ok()?;
    let mut b = [0u8; Challenge::LEN];
    s.read_exact(&mut b).await.ok()?;
    let c = Challenge::decode(&b).ok()?;
    if !key().verify_responder(&hello, &c) {
        return None;
    }
    let mac = key().requester_proof(&hello, &c);
    s.write_all(&Auth { mac }.encode()).await.ok()?;
    let mut v = [0u8; Verdict::LEN];
    s.read_exact(&mut v).await.ok()?;
    (Verdict::decode(&v) == Ok(Verdict::Accepted)).then_some(s)
}

impl Proxy {
    async fn start(to: EndpointAddr) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let me = EndpointAddr {
            addr,
            responder: to.responder,
        };
        let (hold, held) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut a, _)) = l.accept().await {
                let held = held.clone();
                tokio::spawn(async move {
                    let Some(hello) = proxy_accept(&mut a, me).await else {
                        return;
                    };
                    let Some(b) = proxy_connect(to, &hello).await else {
                        return;
                    };
                    let (ar, aw) = a.into_split();
                    let (br, bw) = b.into_split();
                    tokio::spawn(pipe(ar, bw, None));
                    tokio::spawn(pipe(br, aw, Some(held)));
                });
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
    let signed = [
        ("x-amz-rdma-token", token),
        ("x-amz-rdma-protocol", "s3dma-v1"),
    ];
    send_signed(user, "GET", &url, &signed, &[]).await
}

/// [`rdma_get_as`] of `/shared/big` on `s` into the window of `token`.
async fn get_big(s: &Server, user: (&str, &str), token: &str) -> Raw {
    rdma_get_as(user, &s.endpoint, "/shared/big", token).await
}

/// [`get_big`], on a task of its own (to stall).
fn spawn_get_big(s: &Server, user: (&'static str, &'static str), token: String) -> JoinHandle<Raw> {
    let ep = s.endpoint.clone();
    tokio::spawn(async move { rdma_get_as(user, &ep, "/shared/big", &token).await })
}

/// Awaits stalled GETs once their endpoints answer again: each served in
/// full into `tenant` at `len * (first + i)`.
async fn served(gets: [JoinHandle<Raw>; 2], tenant: &Tenant, len: usize, first: usize, obj: &[u8]) {
    for (i, g) in gets.into_iter().enumerate() {
        let r = g.await.unwrap();
        assert_status(&r, 200);
        let got = tenant.bytes(len * (first + i), len);
        assert!(got == obj, "stalled GET {i} differs");
    }
}

/// Scrapes until the staging pool has `in_use` buffers taken and a wait
/// on the share `limit` was counted.
async fn wait_share_wait(s: &Server, what: &str, in_use: i64, limit: &str) {
    let waits = format!("s3dma_storage_target_rdma_staging_share_waits_total{{limit=\"{limit}\"}}");
    wait_metrics(s, what, |m| {
        metric(m, IN_USE) == in_use && metric(m, &waits) >= 1
    })
    .await;
}

/// Scrapes until every staging buffer is back.
async fn wait_all_back(s: &Server) {
    wait_metrics(s, "every buffer back", |m| metric(m, IN_USE) == 0).await;
}

fn metric(text: &str, name_and_labels: &str) -> i64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap_or(0.0) as i64)
}

async fn scrape(s: &Server) -> String {
    metrics_text(s).await
}

/// The value of the metric `name_and_labels` on `s` now.
async fn metric_now(s: &Server, name_and_labels: &str) -> (i64, String) {
    let m = scrape(s).await;
    (metric(&m, name_and_labels), m)
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
    // endpoint and each S3 user two of them. The shared class (no user here
    // is a tenant user) may take the whole pool: this case is about the
    // per-endpoint and per-user caps. Operations stall here on purpose, for
    // longer than the default progress timeout on a loaded machine.
    let s = rdma_server("  max_shared_staging_share: 1\n  progress_timeout_secs: 600\n");
    let obj = shared_object(&s, len).await;
    let (share, m) = metric_now(&s, "s3dma_storage_target_rdma_staging_share_buffers").await;
    assert_eq!(share, 2, "{m}");

    let stalled = Tenant::new(len * 8).await;
    let other = Tenant::new(len * 4).await;
    let p1 = Proxy::start(stalled.endpoint.addr()).await;
    let p2 = Proxy::start(stalled.endpoint.addr()).await;
    // Open the proxied sessions (one per user and endpoint) while they
    // still answer.
    for (user, at, p) in [(ADMIN, 0, &p1), (ADMIN, 1, &p2), (OTHER, 6, &p1)] {
        let r = get_big(&s, user, &stalled.token(len * at, len, Some(p))).await;
        assert_status(&r, 200);
    }

    // (a) One endpoint: two GETs signed by two users through the same
    // stalled endpoint hold the endpoint's share (2), not the pool (4).
    p1.stall(true);
    let g1 = spawn_get_big(&s, ADMIN, stalled.token(len * 2, len, Some(&p1)));
    let g2 = spawn_get_big(&s, OTHER, stalled.token(len * 3, len, Some(&p1)));
    let what = "the stalled session holds its share and waits";
    wait_share_wait(&s, what, 2, "session").await;
    // Another client, another user: served while the stalled one waits.
    let r = unblocked(get_big(&s, READER, &other.token(0, len, None))).await;
    assert_status(&r, 200);
    assert!(other.bytes(0, len) == obj, "the other client's GET differs");
    assert!(!g1.is_finished() && !g2.is_finished());
    assert_eq!(metric(&scrape(&s).await, IN_USE), 2);
    p1.stall(false);
    served([g1, g2], &stalled, len, 2, &obj).await;
    wait_all_back(&s).await;

    // (b) One user: GETs through two stalled sessions hold the user's share.
    p1.stall(true);
    p2.stall(true);
    let g1 = spawn_get_big(&s, ADMIN, stalled.token(len * 4, len, Some(&p1)));
    let g2 = spawn_get_big(&s, ADMIN, stalled.token(len * 5, len, Some(&p2)));
    let what = "the stalled user holds its share and waits";
    wait_share_wait(&s, what, 2, "user").await;
    let r = unblocked(get_big(&s, OTHER, &other.token(len, len, None))).await;
    assert_status(&r, 200);
    assert!(other.bytes(len, len) == obj, "the other user's GET differs");
    assert!(!g1.is_finished() && !g2.is_finished());
    p1.stall(false);
    p2.stall(false);
    served([g1, g2], &stalled, len, 4, &obj).await;
    wait_all_back(&s).await;
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
    mkbucket(&c, "early").await.unwrap();
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
    put(&c, "early", "ok", b"x").await;
}

#[tokio::test]
async fn keys_and_client_request_ids_cannot_forge_log_lines() {
    let s = Server::start();
    let c = s.admin();
    mkbucket(&c, "logs").await.unwrap();
    let evil = "k\n2030-01-01T00:00:00Z  INFO request{id=FORGED}: tenant=bob\x1b[31mred\u{202e}";
    put(&c, "logs", evil, b"x").await;
    assert_eq!(get_as(&c, "logs", evil).await.unwrap(), b"x");
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
    mkbucket(&s.admin(), "metrics-b").await.unwrap();
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
    assert_status(&r, 200);
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

// ---- 6. issue 30: staging classes, stalled sessions, bodies, connections ----

/// A target serving RDMA from four 4 KiB staging buffers, with `extra`
/// lines added to its `rdma:` section.
fn rdma_server(extra: &str) -> Server {
    let extra = extra.to_owned();
    fabric_server(move |key_file| {
        format!(
            "rdma:\n  mode: enabled\n  fabric_key_file: {}\n  connect_timeout_ms: 5000\n  staging_buffers: 4\n  staging_buffer_size: 4KiB\n{extra}",
            key_file
        )
    })
}

/// Bucket `shared` with object `big` of `len` bytes; returns the bytes.
async fn shared_object(s: &Server, len: usize) -> Vec<u8> {
    let admin = s.admin();
    mkbucket(&admin, "shared").await.unwrap();
    let obj = data(len, 11);
    put(&admin, "shared", "big", &obj).await;
    obj
}

/// Issue 30 finding 4: users that are no tenant users (here `other` and
/// `reader`, each within its own per-user cap, through two stalled
/// endpoints) together hold only the shared class's share of the staging
/// pool, so a tenant user's GET is still served. Before, each took its own
/// half and together they held every buffer: the tenant's GET waited.
#[tokio::test]
async fn issue30_non_tenant_users_with_stalled_sessions_cannot_starve_a_tenant_user() {
    let len = 64 << 10; // 16 chunks of 4 KiB
    let s = rdma_server("  tenant_users: [admin]\n  progress_timeout_secs: 600\n");
    let obj = shared_object(&s, len).await;
    let shared = "s3dma_storage_target_rdma_staging_shared_class_buffers";
    let (class, m) = metric_now(&s, shared).await;
    assert_eq!(class, 2, "{m}");
    let stalled = Tenant::new(len * 4).await;
    let tenant = Tenant::new(len).await;
    let p1 = Proxy::start(stalled.endpoint.addr()).await;
    let p2 = Proxy::start(stalled.endpoint.addr()).await;
    // Each user's session through its proxy, opened while it answers.
    for (user, at, p) in [(OTHER, 0, &p1), (READER, 1, &p2)] {
        let r = get_big(&s, user, &stalled.token(len * at, len, Some(p))).await;
        assert_status(&r, 200);
    }
    p1.stall(true);
    p2.stall(true);
    let g1 = spawn_get_big(&s, OTHER, stalled.token(len * 2, len, Some(&p1)));
    let g2 = spawn_get_big(&s, READER, stalled.token(len * 3, len, Some(&p2)));
    let what = "the shared class holds its share and waits";
    wait_share_wait(&s, what, 2, "shared").await;
    // The tenant user is served from the half the shared class cannot take.
    let r = unblocked(get_big(&s, ADMIN, &tenant.token(0, len, None))).await;
    assert_status(&r, 200);
    assert!(tenant.bytes(0, len) == obj, "the tenant user's GET differs");
    assert!(!g1.is_finished() && !g2.is_finished());
    p1.stall(false);
    p2.stall(false);
    served([g1, g2], &stalled, len, 2, &obj).await;
    wait_all_back(&s).await;
}

/// Issue 30 finding 4: an RDMA operation that does not complete within
/// `rdma.progress_timeout_secs` (the client's endpoint stalled) fails its
/// transfer with `RDMATransferFailed` and gives its staging buffers back
/// while the endpoint still stalls (the session is failed, which completes
/// its operations). Before, the request and its buffers waited for ever.
#[tokio::test]
async fn issue30_a_stalled_transfer_fails_and_frees_its_staging_buffers() {
    let len = 64 << 10;
    let s = rdma_server("  progress_timeout_secs: 5\n");
    let obj = shared_object(&s, len).await;
    let stalled = Tenant::new(len * 3).await;
    let p = Proxy::start(stalled.endpoint.addr()).await;
    let r = get_big(&s, ADMIN, &stalled.token(0, len, Some(&p))).await;
    assert_status(&r, 200);
    p.stall(true);
    let r = unblocked(get_big(&s, ADMIN, &stalled.token(len, len, Some(&p)))).await;
    assert_s3_error(&r, 500, "RDMATransferFailed");
    assert!(
        r.text().contains("completed no operation within"),
        "{}",
        r.text()
    );
    // Still stalled, and every buffer is back.
    wait_metrics(&s, "the stalled session's buffers back", |m| {
        metric(m, IN_USE) == 0 && metric(m, "s3dma_storage_target_rdma_stalled_sessions_total") >= 1
    })
    .await;
    // Once the endpoint answers again, a new session serves.
    p.stall(false);
    let r = get_big(&s, ADMIN, &stalled.token(len * 2, len, Some(&p))).await;
    assert_status(&r, 200);
    assert!(stalled.bytes(len * 2, len) == obj);
}

/// Issue 30 finding 11: two S3 users whose tokens name the same client
/// endpoint get a fabric session each, so one user's operations (made-up
/// rkeys, bulk data) never queue on, or fail, the session of the other.
/// Before, every user naming an endpoint shared one session to it.
#[tokio::test]
async fn issue30_two_users_naming_one_endpoint_get_separate_sessions() {
    let len = 16 << 10;
    let s = rdma_server("");
    let obj = shared_object(&s, len).await;
    let host = Tenant::new(len * 3).await;
    for (user, at) in [(ADMIN, 0), (OTHER, 1), (ADMIN, 2)] {
        let r = get_big(&s, user, &host.token(len * at, len, None)).await;
        assert_status(&r, 200);
        assert!(host.bytes(len * at, len) == obj);
    }
    let m = scrape(&s).await;
    assert_eq!(
        metric(
            &m,
            "s3dma_storage_target_rdma_session_connects_total{outcome=\"ok\"}"
        ),
        2,
        "{m}"
    );
    assert_eq!(metric(&m, "s3dma_storage_target_rdma_sessions"), 2, "{m}");
}

/// `VmRSS` of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb << 10
}

/// Open file descriptors of process `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Issue 30 finding 5: a signed aws-chunked PUT whose chunk header declares
/// 1 GiB is refused with `400 InvalidRequest` as soon as the header
/// arrives, and the target does not buffer what the client goes on sending
/// (its RSS grows by far less than what was sent). Before, s3s buffered the
/// whole declared chunk to check its signature: memory grew by what the
/// client sent, and the answer came only when the body stalled.
#[tokio::test]
async fn issue30_an_aws_chunk_declared_huge_is_refused_before_it_is_read() {
    const DECLARED: u64 = 1 << 30;
    const SEND: usize = 256 << 20;
    let s = Server::start();
    mkbucket(&s.admin(), "chunky").await.unwrap();
    let url = s.url("/chunky/huge");
    let sig = format!(";chunk-signature={}\r\n", "0".repeat(64));
    let head_line = format!("{DECLARED:x}{sig}");
    let content_length = head_line.len() as u64 + DECLARED + 2 + format!("0{sig}\r\n").len() as u64;
    let (cl, dl) = (content_length.to_string(), DECLARED.to_string());
    let headers = sign_v4_as(
        ADMIN,
        "PUT",
        &url,
        &[
            ("content-encoding", "aws-chunked"),
            ("content-length", &cl),
            ("x-amz-decoded-content-length", &dl),
        ],
        aws_sigv4::http_request::SignableBody::Precomputed(
            "STREAMING-AWS4-HMAC-SHA256-PAYLOAD".into(),
        ),
        SystemTime::now(),
    );
    let mut head = "PUT /chunky/huge HTTP/1.1\r\n".to_owned();
    for (k, v) in &headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(&head_line);
    let before = rss(s.pid());
    let conn = TcpStream::connect(s.endpoint.strip_prefix("http://").unwrap())
        .await
        .unwrap();
    let (mut rd, mut wr) = conn.into_split();
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let answered = std::sync::Arc::clone(&answered);
        tokio::spawn(async move {
            wr.write_all(head.as_bytes()).await.unwrap();
            let zeros = vec![0u8; 64 << 10];
            let mut sent = 0;
            while sent < SEND && !answered.load(std::sync::atomic::Ordering::SeqCst) {
                if wr.write_all(&zeros).await.is_err() {
                    break; // the target closed the connection
                }
                sent += zeros.len();
            }
            (sent, wr)
        })
    };
    let reader = {
        let answered = std::sync::Arc::clone(&answered);
        tokio::spawn(async move {
            let mut out = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => out.extend_from_slice(&buf[..n]),
                }
                if String::from_utf8_lossy(&out).contains("</Error>") {
                    break;
                }
            }
            answered.store(true, std::sync::atomic::Ordering::SeqCst);
            String::from_utf8_lossy(&out).into_owned()
        })
    };
    // What the target holds once the client has sent what it would.
    let (sent, _wr) = tokio::time::timeout(Duration::from_secs(120), writer)
        .await
        .expect("the client could not send")
        .unwrap();
    let after = rss(s.pid());
    let reply = tokio::time::timeout(Duration::from_secs(120), reader)
        .await
        .expect("no answer to the PUT")
        .unwrap();
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert!(reply.contains("<Code>InvalidRequest</Code>"), "{reply}");
    assert!(reply.contains("max_aws_chunk_size"), "{reply}");
    let grown = after.saturating_sub(before);
    assert!(
        grown < 64 << 20,
        "the target grew by {grown} bytes while the client sent {sent} of a declared {DECLARED}-byte chunk"
    );
    let (refused, m) = metric_now(&s, "s3dma_storage_target_aws_chunks_refused_total").await;
    assert!(refused >= 1, "{m}");
    // Nothing was stored, and a normal PUT still works.
    assert!(!stored(&s, "chunky", "huge").await);
    put(&s.admin(), "chunky", "small", &data(300 << 10, 3)).await;
}

/// Issue 30 finding 6: connections beyond `max_connections` on the S3 port,
/// and beyond the metrics listener's cap, leave the target's descriptors
/// bounded, and a legitimate client is still served (the idle connections
/// make room for it). Before, every held connection was a descriptor of
/// the target, up to `RLIMIT_NOFILE`, after which it answered 500s.
#[tokio::test]
async fn issue30_held_connections_beyond_the_caps_keep_fds_bounded_and_serve() {
    const CAP: usize = 16;
    const HELD: usize = 200;
    let s = Server::start_with(|_| format!("max_connections: {CAP}\n"));
    mkbucket(&s.admin(), "conns").await.unwrap();
    let pid = s.pid();
    let base = fds(pid);
    let addr = s.endpoint.strip_prefix("http://").unwrap().to_owned();
    let mut held = Vec::new();
    for _ in 0..HELD {
        held.push(TcpStream::connect(&addr).await.unwrap());
    }
    // A legitimate client is served; connections are accepted in order,
    // so by its answer every held one has been accepted.
    put(&s.admin(), "conns", "k", b"still serving").await;
    let got = sdk_get(&s, "conns", "k").await.unwrap();
    assert_eq!(&got[..], b"still serving");
    let open = fds(pid);
    assert!(
        open <= base + CAP + 8,
        "the target holds {open} descriptors (was {base}) with {HELD} S3 connections held"
    );
    let (conns, m) = metric_now(&s, "s3dma_storage_target_connections").await;
    assert!(conns <= CAP as i64, "{m}");

    // The metrics listener: held connections beyond its cap are closed.
    let maddr = s
        .metrics
        .strip_prefix("http://")
        .unwrap()
        .trim_end_matches("/metrics")
        .to_owned();
    let mut mheld = Vec::new();
    for _ in 0..HELD {
        mheld.push(TcpStream::connect(&maddr).await.unwrap());
    }
    // One more: closed at accept once the earlier ones are accepted.
    let mut probe = TcpStream::connect(&maddr).await.unwrap();
    let mut b = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(60), probe.read(&mut b))
        .await
        .expect("the connection beyond the metrics cap was not closed");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    let open = fds(pid);
    assert!(
        open <= base + CAP + s3dma_service::metrics::MAX_CONNECTIONS + 8,
        "the target holds {open} descriptors (was {base}) with {HELD} S3 and {HELD} metrics connections held"
    );
    drop((held, mheld));
}

/// Issue 30 finding 6: a configuration whose connection caps need more
/// descriptors than `RLIMIT_NOFILE` allows (here under `ulimit -n 1024`)
/// refuses to start and says what to change.
#[test]
fn issue30_caps_beyond_the_fd_limit_refuse_to_start() {
    let t = tempfile::tempdir().unwrap();
    let cfg = minimal_config(
        t.path(),
        &t.path().join("data"),
        "  - {access_key_id: a, secret: s}\nmax_connections: 4096\n",
    );
    let (ok, text) = outcome(
        Command::new("sh")
            .arg("-c")
            .arg("ulimit -n 1024 && exec \"$0\" --config \"$1\"")
            .arg(env!("CARGO_BIN_EXE_storage-target"))
            .arg(&cfg),
    );
    assert!(!ok, "{text}");
    assert!(
        text.contains("RLIMIT_NOFILE is 1024") && text.contains("max_connections"),
        "{text}"
    );
}
