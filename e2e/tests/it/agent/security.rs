//! Trust and tenancy against real dpu-agent and storage-target processes:
//! tenant isolation by policy, shim authentication (bearer tokens and mTLS
//! client certificates), secrets that never leave the agent (logs, metrics,
//! errors, replies), and configuration errors that name the file and the
//! field but never a secret.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::common::*;
use fabric::Access;
use futures::StreamExt as _;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use s3dma_proto::agent::v1 as pb;
use s3dma_proto::agent::v1::agent_client::AgentClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Status};
use tonic_types::StatusExt as _;

const OTHER_SHIM_TOKEN: &str = "other-shim-token-abcdef0123";

// ---------------------------------------------------------------------------
// Local helpers
// ---------------------------------------------------------------------------

async fn head(
    shim: &Shim,
    tenant: &str,
    bucket: &str,
    key: &str,
) -> Result<pb::HeadObjectResponse, Status> {
    let msg = pb::HeadObjectRequest {
        tenant: tenant.into(),
        bucket: bucket.into(),
        key: key.into(),
    };
    shim.inner
        .clone()
        .head_object(shim.req(msg))
        .await
        .map(tonic::Response::into_inner)
}

async fn list(
    shim: &Shim,
    tenant: &str,
    bucket: &str,
    prefix: &str,
) -> Result<pb::ListObjectsResponse, Status> {
    let msg = pb::ListObjectsRequest {
        tenant: tenant.into(),
        bucket: bucket.into(),
        prefix: prefix.into(),
        ..Default::default()
    };
    shim.inner
        .clone()
        .list_objects(shim.req(msg))
        .await
        .map(tonic::Response::into_inner)
}

async fn delete(
    shim: &Shim,
    tenant: &str,
    bucket: &str,
    key: &str,
) -> Result<pb::DeleteObjectResponse, Status> {
    let msg = pb::DeleteObjectRequest {
        tenant: tenant.into(),
        bucket: bucket.into(),
        key: key.into(),
    };
    shim.inner
        .clone()
        .delete_object(shim.req(msg))
        .await
        .map(tonic::Response::into_inner)
}

/// Asserts PERMISSION_DENIED with `ErrorInfo.reason = AccessDenied`.
#[track_caller]
fn assert_denied<T: std::fmt::Debug>(r: Result<T, Status>, what: &str) -> Status {
    let e = match r {
        Ok(v) => panic!("{what}: allowed, expected AccessDenied: {v:?}"),
        Err(e) => e,
    };
    assert_eq!(e.code(), Code::PermissionDenied, "{what}: {e:?}");
    assert_eq!(s3_code(&e), "AccessDenied", "{what}: {e:?}");
    e
}

/// Asserts UNAUTHENTICATED.
#[track_caller]
fn assert_unauthenticated<T: std::fmt::Debug>(r: Result<T, Status>, what: &str) -> Status {
    let e = match r {
        Ok(v) => panic!("{what}: allowed, expected UNAUTHENTICATED: {v:?}"),
        Err(e) => e,
    };
    assert_eq!(e.code(), Code::Unauthenticated, "{what}: {e:?}");
    e
}

/// Asserts NOT_FOUND / NoSuchKey: the caller got through authentication and
/// policy and the target answered.
#[track_caller]
fn assert_no_such_key<T: std::fmt::Debug>(r: Result<T, Status>, what: &str) -> Status {
    let e = match r {
        Ok(v) => panic!("{what}: succeeded, expected NoSuchKey: {v:?}"),
        Err(e) => e,
    };
    assert_eq!(e.code(), Code::NotFound, "{what}: {e:?}");
    assert_eq!(s3_code(&e), "NoSuchKey", "{what}: {e:?}");
    e
}

/// Everything a client can see of a status: message, metadata, raw details
/// and the decoded ErrorInfo.
fn status_dump(st: &Status) -> String {
    format!(
        "{st:?}\n{}\n{:?}\n{}\n{:?}\n",
        st.message(),
        st.metadata(),
        String::from_utf8_lossy(st.details()),
        st.get_details_error_info()
    )
}

/// `s` without ANSI escape sequences (`ESC [ ... letter`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The value of a Prometheus sample `name{labels}` (labels as written,
/// e.g. `reason="missing"`).
fn metric_value(text: &str, name: &str, labels: &str) -> Option<f64> {
    let want = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&want))
        .map(|v| v.trim().parse().unwrap())
}

/// Keys of the object listing of `bucket`, read as alice straight from the
/// target.
async fn sdk_keys(c: &aws_sdk_s3::Client, bucket: &str) -> Vec<String> {
    let out = c.list_objects_v2().bucket(bucket).send().await.unwrap();
    out.contents()
        .iter()
        .map(|o| o.key().unwrap().to_owned())
        .collect()
}

/// Writes the secret files of an agent configuration into `d`.
fn write_secrets(d: &Path) {
    write_private(&d.join("fabric.key"), FABRIC_KEY_HEX);
    write_private(&d.join("alice.secret"), format!("{}\n", ALICE.1));
    write_private(&d.join("bob.secret"), BOB.1);
    write_private(&d.join("shim.token"), SHIM_TOKEN);
    write_private(&d.join("other-shim.token"), OTHER_SHIM_TOKEN);
}

/// A valid agent configuration over the files of [`write_secrets`]: `tls`
/// is YAML under `listen:` (indented two spaces), `shims` the list under
/// `shims:`.
fn agent_yaml(d: &Path, tls: &str, shims: &str, target: &str) -> String {
    let d = d.display();
    format!(
        r#"listen:
  address: 127.0.0.1:0
{tls}shims:
{shims}tenants:
  - name: alice
    access_key_id: {aak}
    secret_access_key_file: {d}/alice.secret
    allow:
      - bucket: alice-data
        read: true
        write: true
    quotas:
      max_concurrent_requests: 8
  - name: bob
    access_key_id: {bak}
    secret_access_key_file: {d}/bob.secret
    allow:
      - bucket: bob-data
        read: true
        write: true
targets:
  - name: local
    endpoint: {target}
    buckets: ["*"]
    rdma: true
fabric:
  backend: tcp
  fabric_key_file: {d}/fabric.key
  staging_buffers: 4
  staging_buffer_size: 1MiB
transfer:
  retries: 1
  backoff_initial_ms: 10
  backoff_max_ms: 50
metrics:
  address: 127.0.0.1:0
"#,
        aak = ALICE.0,
        bak = BOB.0,
    )
}

/// Runs the agent binary to completion (at most 30 s): exit status, stdout,
/// stderr.
fn run_agent_bin(args: &[&std::ffi::OsStr]) -> (ExitStatus, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = Command::new(bin_dir().join("dpu-agent"))
        .args(args)
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "dpu-agent {args:?} did not exit within 30 s; stdout:\n{}\nstderr:\n{}",
                std::fs::read_to_string(&out).unwrap_or_default(),
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status,
        std::fs::read_to_string(&out).unwrap(),
        std::fs::read_to_string(&err).unwrap(),
    )
}

/// A dpu-agent started from a configuration this file wrote.
struct OwnAgent {
    child: Option<Child>,
    addr: String,
    /// The "metrics on" line's rest.
    metrics: String,
    log: PathBuf,
}

impl OwnAgent {
    fn start(config: &Path, log: PathBuf) -> OwnAgent {
        OwnAgent::start_with(config, log, "info")
    }

    fn start_with(config: &Path, log: PathBuf, rust_log: &str) -> OwnAgent {
        let mut child = Command::new(bin_dir().join("dpu-agent"))
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let mut next = |out: &mut BufReader<_>, prefix: &str| {
            line.clear();
            if out.read_line(&mut line).unwrap() == 0 {
                panic!(
                    "dpu-agent exited before printing {prefix:?}; stderr:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            line.trim()
                .strip_prefix(prefix)
                .unwrap_or_else(|| panic!("expected {prefix:?}, got {line:?}"))
                .to_owned()
        };
        let addr = next(&mut out, "dpu-agent listening on ");
        let metrics = next(&mut out, "metrics on ");
        assert!(metrics.starts_with("http://127.0.0.1:"), "{metrics}");
        std::thread::spawn(move || for _ in out.lines() {});
        OwnAgent {
            child: Some(child),
            addr,
            metrics,
            log,
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for OwnAgent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A CA (certificate PEM and issuer).
fn new_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A leaf certificate signed by `ca` for `sans` with common name `cn`:
/// (certificate PEM, key PEM).
fn new_leaf(
    ca: &CertifiedIssuer<'static, KeyPair>,
    sans: &[&str],
    cn: &str,
    eku: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let mut params =
        CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![eku];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A shim over TLS to `addr`, trusting `ca_pem`, with an optional client
/// identity and bearer token.
async fn tls_shim(
    addr: &str,
    ca_pem: &str,
    identity: Option<&(String, String)>,
    token: &str,
) -> Result<Shim, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(Certificate::from_pem(ca_pem));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let ch = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await?;
    Ok(Shim {
        inner: AgentClient::new(ch),
        token: token.to_owned(),
    })
}

/// Connects and calls HeadObject, folding connection errors into a string:
/// a TLS handshake the server refuses may fail at connect or at the first
/// call, depending on timing.
async fn tls_head(
    addr: &str,
    ca_pem: &str,
    identity: Option<&(String, String)>,
    token: &str,
    tenant: &str,
    key: &str,
) -> Result<Result<pb::HeadObjectResponse, Status>, String> {
    let fut = async {
        match tls_shim(addr, ca_pem, identity, token).await {
            Ok(shim) => Ok(head(&shim, tenant, "alice-data", key).await),
            Err(e) => Err(format!("connect: {e:?}")),
        }
    };
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .expect("TLS call hung")
}

// ---------------------------------------------------------------------------
// 1. Tenant isolation
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_isolated_by_bucket_and_prefix_policy() {
    let target = Target::start(true);
    for b in ["alice-data", "shared", "bob-data"] {
        target.create_bucket(b).await;
    }
    let agent = Agent::start(AgentSpec::one(&target));
    let shim = agent.client().await;
    let mem = Memory::new(4 << 20).await;
    let sdk = target.s3(ALICE);
    const DST: usize = 2 << 20;

    // Alice stores a private object.
    let body = data(100_000, 11);
    mem.fill(0, &body);
    let (w, src) = mem.window(0, body.len(), Access::REMOTE_READ);
    let put = shim
        .put("alice", "alice-data", "private/report.bin", &src)
        .await
        .unwrap();
    drop(w);
    assert_eq!(put.size, body.len() as u64);

    // Bob, through the same shim (host1 may act for both), may do nothing
    // with alice-data: not even learn whether a key exists.
    mem.clear(0xEE);
    let (_dst_w, dst) = mem.window(DST, 1 << 20, Access::REMOTE_WRITE);
    let evil = data(1000, 99);
    mem.fill(0, &evil);
    let (_evil_w, evil_src) = mem.window(0, evil.len(), Access::REMOTE_READ);
    for key in ["private/report.bin", "private/missing.bin"] {
        assert_denied(
            shim.get("bob", "alice-data", key, None, &dst).await,
            &format!("bob GET alice-data/{key}"),
        );
        assert_denied(
            head(&shim, "bob", "alice-data", key).await,
            &format!("bob HEAD alice-data/{key}"),
        );
        assert_denied(
            delete(&shim, "bob", "alice-data", key).await,
            &format!("bob DELETE alice-data/{key}"),
        );
        assert_denied(
            shim.put("bob", "alice-data", key, &evil_src).await,
            &format!("bob PUT alice-data/{key}"),
        );
    }
    for prefix in ["", "private/", "p"] {
        assert_denied(
            list(&shim, "bob", "alice-data", prefix).await,
            &format!("bob LIST alice-data/{prefix}"),
        );
    }
    // Bucket names are case-sensitive: "ALICE-DATA" is not bob's either,
    // and "SHARED" is not "shared".
    assert_denied(
        head(&shim, "bob", "ALICE-DATA", "private/report.bin").await,
        "bob HEAD ALICE-DATA",
    );
    assert_denied(
        head(&shim, "bob", "SHARED", "datasets/x").await,
        "bob HEAD SHARED/datasets/x",
    );
    // Nothing was placed in bob's destination window.
    assert_eq!(mem.read(DST, 1 << 20), vec![0xEE; 1 << 20]);

    // Alice's object is unchanged, and bob created nothing (checked with a
    // plain S3 client as alice, straight against the target).
    assert_eq!(
        sha256(&sdk_get(&sdk, "alice-data", "private/report.bin").await),
        sha256(&body)
    );
    let h = sdk
        .head_object()
        .bucket("alice-data")
        .key("private/report.bin")
        .send()
        .await
        .unwrap();
    assert_eq!(h.e_tag().unwrap(), put.etag);
    assert_eq!(h.content_length(), Some(body.len() as i64));
    assert_eq!(
        sdk_keys(&sdk, "alice-data").await,
        vec!["private/report.bin".to_owned()]
    );

    // `shared`: alice may write anywhere, bob may only read under datasets/.
    let ds = data(5000, 21);
    let other = data(3000, 22);
    for (key, bytes) in [("datasets/x", &ds), ("other", &other)] {
        mem.fill(0, bytes);
        let (w, src) = mem.window(0, bytes.len(), Access::REMOTE_READ);
        shim.put("alice", "shared", key, &src).await.unwrap();
        drop(w);
    }
    mem.clear(0);
    let (w, dst2) = mem.window(DST, 1 << 20, Access::REMOTE_WRITE);
    let got = shim
        .get("bob", "shared", "datasets/x", None, &dst2)
        .await
        .unwrap();
    drop(w);
    assert_eq!(got.bytes_placed, ds.len() as u64);
    assert_eq!(mem.sha256(DST, ds.len()), sha256(&ds));
    let h = head(&shim, "bob", "shared", "datasets/x").await.unwrap();
    assert_eq!(h.object.unwrap().size, ds.len() as u64);

    let (_w, dst3) = mem.window(DST, 1 << 20, Access::REMOTE_WRITE);
    assert_denied(
        shim.get("bob", "shared", "other", None, &dst3).await,
        "bob GET shared/other",
    );
    assert_denied(
        head(&shim, "bob", "shared", "other").await,
        "bob HEAD shared/other",
    );
    assert_denied(
        shim.get("bob", "shared", "datasets", None, &dst3).await,
        "bob GET shared/datasets (no slash)",
    );
    // Read-only grant: no writes or deletes even under datasets/.
    assert_denied(
        shim.put("bob", "shared", "datasets/new", &evil_src).await,
        "bob PUT shared/datasets/new",
    );
    assert_denied(
        delete(&shim, "bob", "shared", "datasets/x").await,
        "bob DELETE shared/datasets/x",
    );
    // Listing: only under a prefix the grant covers.
    for prefix in ["", "data", "datasets", "other"] {
        assert_denied(
            list(&shim, "bob", "shared", prefix).await,
            &format!("bob LIST shared/{prefix:?}"),
        );
    }
    let l = list(&shim, "bob", "shared", "datasets/").await.unwrap();
    let keys: Vec<&str> = l.objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys, ["datasets/x"]);
    // Alice sees both.
    let l = list(&shim, "alice", "shared", "").await.unwrap();
    let keys: Vec<&str> = l.objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys, ["datasets/x", "other"]);

    // Keys with `.` / `..` segments are denied for everyone, even where a
    // grant covers every key.
    let (_w, dst4) = mem.window(DST, 1 << 20, Access::REMOTE_WRITE);
    for key in [
        "datasets/../other",
        "datasets/./x",
        "datasets/sub/../../other",
    ] {
        assert_denied(
            shim.get("bob", "shared", key, None, &dst4).await,
            &format!("bob GET shared/{key}"),
        );
        assert_denied(
            head(&shim, "bob", "shared", key).await,
            &format!("bob HEAD shared/{key}"),
        );
    }
    // S3 prefixes are literal (a query parameter, never normalised): a
    // `..` in a listing prefix may be refused or match nothing, but must
    // not reveal keys outside datasets/.
    match list(&shim, "bob", "shared", "datasets/../").await {
        Ok(l) => assert!(
            l.objects.is_empty() && l.common_prefixes.is_empty(),
            "bob LIST shared/datasets/../: {l:?}"
        ),
        Err(e) => {
            assert_denied::<()>(Err(e), "bob LIST shared/datasets/../");
        }
    }
    for key in [
        "private/../private/report.bin",
        "./private/report.bin",
        "..",
    ] {
        assert_denied(
            shim.get("alice", "alice-data", key, None, &dst4).await,
            &format!("alice GET alice-data/{key}"),
        );
        assert_denied(
            shim.put("alice", "alice-data", key, &evil_src).await,
            &format!("alice PUT alice-data/{key}"),
        );
        assert_denied(
            delete(&shim, "alice", "alice-data", key).await,
            &format!("alice DELETE alice-data/{key}"),
        );
    }
    assert_denied(
        delete(&shim, "alice", "shared", "../alice-data/private/report.bin").await,
        "alice DELETE shared/../alice-data/...",
    );

    // Still exactly what alice wrote.
    assert_eq!(
        sdk_keys(&sdk, "alice-data").await,
        vec!["private/report.bin".to_owned()]
    );
    assert_eq!(
        sha256(&sdk_get(&sdk, "alice-data", "private/report.bin").await),
        sha256(&body)
    );
    assert_eq!(sdk_keys(&sdk, "shared").await, vec!["datasets/x", "other"]);
    assert_eq!(
        sha256(&sdk_get(&sdk, "shared", "other").await),
        sha256(&other)
    );

    // Denials are counted per tenant with status "denied".
    let m = agent.metrics_text().await;
    assert!(
        m.lines()
            .any(|l| l.starts_with("s3dma_agent_requests_total{")
                && l.contains("tenant=\"bob\"")
                && l.contains("status=\"denied\"")),
        "{m}"
    );
}

// ---------------------------------------------------------------------------
// 2. Shim authentication (bearer tokens)
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shims_authenticate_with_bearer_tokens_and_act_only_for_their_tenants() {
    let target = Target::start(true);
    for b in ["alice-data", "bob-data"] {
        target.create_bucket(b).await;
    }
    let agent = Agent::start(AgentSpec::one(&target));
    let mem = Memory::new(2 << 20).await;
    let body = data(4096, 5);
    mem.fill(0, &body);
    let (_src_w, src) = mem.window(0, body.len(), Access::REMOTE_READ);
    let (_dst_w, dst) = mem.window(1 << 20, 1 << 20, Access::REMOTE_WRITE);

    // No credentials at all: every RPC is refused.
    let anon = agent.client_with("").await;
    assert_unauthenticated(head(&anon, "alice", "alice-data", "k").await, "anon HEAD");
    assert_unauthenticated(
        anon.get("alice", "alice-data", "k", None, &dst).await,
        "anon GET",
    );
    assert_unauthenticated(
        anon.put("alice", "alice-data", "anon-put", &src).await,
        "anon PUT",
    );
    assert_unauthenticated(list(&anon, "alice", "alice-data", "").await, "anon LIST");
    assert_unauthenticated(
        delete(&anon, "alice", "alice-data", "k").await,
        "anon DELETE",
    );
    let batch = pb::GetObjectsRequest {
        tenant: "alice".into(),
        items: vec![pb::GetObjectsItem {
            bucket: "alice-data".into(),
            key: "k".into(),
            range: None,
            destination: dst.clone(),
        }],
        concurrency: 0,
    };
    let r = anon
        .inner
        .clone()
        .get_objects(anon.req(batch.clone()))
        .await
        .map(|_| ());
    assert_unauthenticated(r, "anon GetObjects");
    // A non-bearer scheme carrying the real token is not a credential.
    let mut req = tonic::Request::new(pb::HeadObjectRequest {
        tenant: "alice".into(),
        bucket: "alice-data".into(),
        key: "k".into(),
    });
    req.metadata_mut().insert(
        "authorization",
        format!("Basic {SHIM_TOKEN}").parse().unwrap(),
    );
    assert_unauthenticated(anon.inner.clone().head_object(req).await, "Basic <token>");
    let missing = 7.0;

    // Wrong bearer tokens, including near misses of the real one.
    let wrong_tokens = [
        "wrong-token-0123456789abcdef".to_owned(),
        format!("{SHIM_TOKEN}x"),
        SHIM_TOKEN[..SHIM_TOKEN.len() - 1].to_owned(),
        SHIM_TOKEN.to_uppercase(),
    ];
    for t in &wrong_tokens {
        let c = agent.client_with(t).await;
        let e = assert_unauthenticated(head(&c, "alice", "alice-data", "k").await, t);
        assert!(!status_dump(&e).contains(t.as_str()), "{e:?}");
        assert_unauthenticated(c.put("bob", "bob-data", "wrong-token-put", &src).await, t);
    }
    let invalid = 2.0 * wrong_tokens.len() as f64;
    // Refused PUTs never reached the target.
    let sdk = target.s3(ALICE);
    assert!(sdk_keys(&sdk, "alice-data").await.is_empty());
    assert!(sdk_keys(&sdk, "bob-data").await.is_empty());

    // host2 (valid token) is assigned bob only.
    let host2 = agent.client_with(OTHER_SHIM_TOKEN).await;
    let e = assert_denied(
        head(&host2, "alice", "alice-data", "k").await,
        "host2 HEAD for alice",
    );
    assert!(e.message().contains("alice"), "{e:?}");
    assert_denied(
        host2.put("alice", "alice-data", "host2-put", &src).await,
        "host2 PUT for alice",
    );
    assert_denied(
        host2.get("alice", "alice-data", "k", None, &dst).await,
        "host2 GET for alice",
    );
    assert_denied(
        list(&host2, "alice", "alice-data", "").await,
        "host2 LIST for alice",
    );
    // ... and works for bob.
    let put = host2
        .put("bob", "bob-data", "from-host2", &src)
        .await
        .unwrap();
    assert_eq!(put.size, body.len() as u64);
    let got = host2
        .get("bob", "bob-data", "from-host2", None, &dst)
        .await
        .unwrap();
    assert_eq!(got.bytes_placed, body.len() as u64);
    assert_eq!(mem.sha256(1 << 20, body.len()), sha256(&body));
    assert_no_such_key(
        head(&host2, "bob", "bob-data", "nope").await,
        "host2 HEAD bob-data/nope",
    );

    // Tenants nobody assigned, or that do not exist: denied, not unknown.
    let host1 = agent.client().await;
    for t in ["carol", "", "Alice", "alice ", "*"] {
        assert_denied(
            head(&host1, t, "alice-data", "k").await,
            &format!("host1 for tenant {t:?}"),
        );
    }
    let not_assigned = 4.0 + 5.0;
    // host1 works for both of its tenants.
    assert_no_such_key(
        head(&host1, "alice", "alice-data", "k").await,
        "host1 alice",
    );
    assert_no_such_key(head(&host1, "bob", "bob-data", "k").await, "host1 bob");
    // Only the one object host2 wrote for bob exists.
    assert!(sdk_keys(&sdk, "alice-data").await.is_empty());
    assert_eq!(sdk_keys(&sdk, "bob-data").await, vec!["from-host2"]);

    let m = agent.metrics_text().await;
    assert!(m.contains("s3dma_agent_auth_failures_total"), "{m}");
    let v = |reason: &str| {
        metric_value(
            &m,
            "s3dma_agent_auth_failures_total",
            &format!("reason=\"{reason}\""),
        )
    };
    assert_eq!(v("missing"), Some(missing), "{m}");
    assert_eq!(v("invalid"), Some(invalid), "{m}");
    assert_eq!(v("tenant_not_assigned"), Some(not_assigned), "{m}");
    for t in [SHIM_TOKEN, OTHER_SHIM_TOKEN] {
        assert!(!m.contains(t));
        assert!(!agent.output().contains(t));
    }
}

// ---------------------------------------------------------------------------
// 3. mTLS
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_client_certificates_identify_shims() {
    let target = Target::start(true);
    for b in ["alice-data", "bob-data"] {
        target.create_bucket(b).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_secrets(d);

    let ca = new_ca("s3dma test shim CA");
    let ca_pem = ca.pem();
    let server = new_leaf(
        &ca,
        &["localhost", "127.0.0.1"],
        "dpu-agent",
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let client = |name: &str| new_leaf(&ca, &[name], name, ExtendedKeyUsagePurpose::ClientAuth);
    let host3 = client("host3.test");
    let host5 = client("host5.test");
    let stranger = client("host9.test");
    // The right name, but from a CA the agent does not trust.
    let rogue_ca = new_ca("rogue CA");
    let rogue = new_leaf(
        &rogue_ca,
        &["host3.test"],
        "host3.test",
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    std::fs::write(d.join("server.crt"), &server.0).unwrap();
    std::fs::write(d.join("server.key"), &server.1).unwrap();
    std::fs::write(d.join("ca.pem"), &ca_pem).unwrap();

    let dd = d.display();
    let tls = format!(
        "  tls:\n    cert_file: {dd}/server.crt\n    key_file: {dd}/server.key\n    client_ca_file: {dd}/ca.pem\n"
    );
    // host3: certificate only, for alice. host5: certificate and token, for bob.
    let shims = format!(
        "  - name: host3\n    tls_name: host3.test\n    tenants: [alice]\n  \
         - name: host5\n    tls_name: host5.test\n    token_file: {dd}/other-shim.token\n    tenants: [bob]\n"
    );
    let config = d.join("agent.yaml");
    std::fs::write(&config, agent_yaml(d, &tls, &shims, &target.endpoint)).unwrap();
    let agent = OwnAgent::start(&config, d.join("agent.log"));
    let addr = agent.addr.clone();

    // host3's certificate authenticates it: HEAD of a missing key reaches
    // the target.
    let r = tls_head(&addr, &ca_pem, Some(&host3), "", "alice", "nope")
        .await
        .unwrap();
    assert_no_such_key(r, "host3 HEAD");
    // A whole round trip over RDMA through the TLS API.
    let shim3 = tls_shim(&addr, &ca_pem, Some(&host3), "").await.unwrap();
    let mem = Memory::new(2 << 20).await;
    let body = data(70_000, 3);
    mem.fill(0, &body);
    let (_w, src) = mem.window(0, body.len(), Access::REMOTE_READ);
    shim3
        .put("alice", "alice-data", "tls-obj", &src)
        .await
        .unwrap();
    let (_w2, dst) = mem.window(1 << 20, 1 << 20, Access::REMOTE_WRITE);
    let got = shim3
        .get("alice", "alice-data", "tls-obj", None, &dst)
        .await
        .unwrap();
    assert_eq!(got.bytes_placed, body.len() as u64);
    assert_eq!(mem.sha256(1 << 20, body.len()), sha256(&body));
    // host3 is assigned alice only.
    assert_denied(
        head(&shim3, "bob", "bob-data", "nope").await,
        "host3 for bob",
    );

    // A certificate from the trusted CA with another name.
    let r = tls_head(&addr, &ca_pem, Some(&stranger), "", "alice", "nope")
        .await
        .unwrap();
    assert_unauthenticated(r, "host9.test certificate");
    // ... even with a valid token of a shim that needs a certificate too.
    let r = tls_head(
        &addr,
        &ca_pem,
        Some(&stranger),
        OTHER_SHIM_TOKEN,
        "bob",
        "nope",
    )
    .await
    .unwrap();
    assert_unauthenticated(r, "host9.test certificate + host5 token");

    // No certificate and no token.
    let r = tls_head(&addr, &ca_pem, None, "", "alice", "nope")
        .await
        .unwrap();
    assert_unauthenticated(r, "no certificate, no token");

    // host5 needs both its certificate and its token.
    let r = tls_head(&addr, &ca_pem, None, OTHER_SHIM_TOKEN, "bob", "nope")
        .await
        .unwrap();
    assert_unauthenticated(r, "host5 token without certificate");
    let r = tls_head(&addr, &ca_pem, Some(&host5), "", "bob", "nope")
        .await
        .unwrap();
    assert_unauthenticated(r, "host5 certificate without token");
    let r = tls_head(
        &addr,
        &ca_pem,
        Some(&host5),
        "wrong-token-0123456789",
        "bob",
        "nope",
    )
    .await
    .unwrap();
    assert_unauthenticated(r, "host5 certificate with a wrong token");
    let shim5 = tls_shim(&addr, &ca_pem, Some(&host5), OTHER_SHIM_TOKEN)
        .await
        .unwrap();
    let e = assert_no_such_key(
        head(&shim5, "bob", "bob-data", "nope").await,
        "host5 certificate + token",
    );
    assert!(!status_dump(&e).contains(OTHER_SHIM_TOKEN));
    assert_denied(
        head(&shim5, "alice", "alice-data", "nope").await,
        "host5 for alice",
    );

    // A certificate with host3's name from an untrusted CA fails the TLS
    // handshake (at connect or at the first call).
    match tls_head(&addr, &ca_pem, Some(&rogue), "", "alice", "nope").await {
        Err(_) => {}
        Ok(Err(st)) => assert!(
            matches!(
                st.code(),
                Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled
            ) && st.get_details_error_info().is_none(),
            "rogue certificate: {st:?}"
        ),
        Ok(Ok(v)) => panic!("a certificate from an untrusted CA was accepted: {v:?}"),
    }

    // A plaintext HTTP/2 client cannot talk to the TLS port: an error, not a
    // hang.
    let plain = async {
        let ch = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        let shim = Shim {
            inner: AgentClient::new(ch),
            token: String::new(),
        };
        head(&shim, "alice", "alice-data", "nope")
            .await
            .map_err(|e| format!("call: {e:?}"))
    };
    let r = tokio::time::timeout(Duration::from_secs(20), plain)
        .await
        .expect("a plaintext client hung on the TLS port");
    assert!(r.is_err(), "plaintext call succeeded: {r:?}");

    // The agent is still serving authenticated shims.
    assert_no_such_key(
        head(&shim3, "alice", "alice-data", "nope").await,
        "host3 again",
    );
    let log = agent.log();
    assert!(!log.contains(OTHER_SHIM_TOKEN), "{log}");
    assert!(!log.contains(ALICE.1) && !log.contains(BOB.1), "{log}");
}

// ---------------------------------------------------------------------------
// 4. Secrets never leak
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_appear_in_logs_metrics_errors_or_replies() {
    let mut target = Target::start(true);
    for b in ["alice-data", "bob-data"] {
        target.create_bucket(b).await;
    }
    let mut spec = AgentSpec::one(&target);
    spec.rust_log = "debug,h2=debug,hyper=debug,tonic=debug";
    let agent = Agent::start(spec);
    let shim = agent.client().await;
    let mem = Memory::new(8 << 20).await;
    // Everything a client saw.
    let mut seen: Vec<String> = Vec::new();

    // PUT and GET over RDMA.
    let body = data((2 << 20) + 17, 42);
    mem.fill(0, &body);
    let (w, src) = mem.window(0, body.len(), Access::REMOTE_READ);
    let put = shim
        .put("alice", "alice-data", "leak/obj", &src)
        .await
        .unwrap();
    drop(w);
    assert_eq!(put.path, pb::TransferPath::Rdma as i32);
    seen.push(format!("{put:?}"));
    let (w, dst) = mem.window(4 << 20, 4 << 20, Access::REMOTE_WRITE);
    let got = shim
        .get("alice", "alice-data", "leak/obj", None, &dst)
        .await
        .unwrap();
    assert_eq!(got.path, pb::TransferPath::Rdma as i32);
    assert_eq!(mem.sha256(4 << 20, body.len()), sha256(&body));
    seen.push(format!("{got:?}"));
    let h = head(&shim, "alice", "alice-data", "leak/obj")
        .await
        .unwrap();
    seen.push(format!("{h:?}"));
    let l = list(&shim, "alice", "alice-data", "").await.unwrap();
    seen.push(format!("{l:?}"));

    // A missing key (the target's S3 error text travels back).
    let e = assert_no_such_key(
        shim.get("alice", "alice-data", "leak/missing", None, &dst)
            .await,
        "missing key",
    );
    seen.push(status_dump(&e));
    // A batch with a good, a missing and a denied item.
    let batch = pb::GetObjectsRequest {
        tenant: "alice".into(),
        items: [
            ("alice-data", "leak/obj"),
            ("alice-data", "leak/missing"),
            ("bob-data", "x"),
        ]
        .into_iter()
        .map(|(b, k)| pb::GetObjectsItem {
            bucket: b.into(),
            key: k.into(),
            range: Some(pb::ByteRange {
                kind: Some(pb::byte_range::Kind::Suffix(10)),
            }),
            destination: dst.clone(),
        })
        .collect(),
        concurrency: 1,
    };
    let mut stream = shim
        .inner
        .clone()
        .get_objects(shim.req(batch))
        .await
        .unwrap()
        .into_inner();
    let mut codes = Vec::new();
    while let Some(item) = stream.next().await {
        let item = item.unwrap();
        seen.push(format!("{item:?}"));
        codes.push(match item.result.unwrap() {
            pb::get_objects_reply::Result::Ok(_) => "ok".to_owned(),
            pb::get_objects_reply::Result::Error(e) => e.s3_code,
        });
    }
    codes.sort();
    assert_eq!(codes, ["AccessDenied", "NoSuchKey", "ok"]);
    // A denied request and a host that may not act for the tenant.
    let e = assert_denied(
        head(&shim, "bob", "alice-data", "leak/obj").await,
        "bob HEAD alice-data",
    );
    seen.push(status_dump(&e));
    let host2 = agent.client_with(OTHER_SHIM_TOKEN).await;
    let e = assert_denied(
        head(&host2, "alice", "alice-data", "leak/obj").await,
        "host2 for alice",
    );
    seen.push(status_dump(&e));
    // Wrong and missing tokens.
    let near_miss = "shim-token-0123456789abcdeX";
    let bad = agent.client_with(near_miss).await;
    let e = assert_unauthenticated(head(&bad, "alice", "alice-data", "leak/obj").await, "bad");
    seen.push(status_dump(&e));
    let anon = agent.client_with("").await;
    let e = assert_unauthenticated(head(&anon, "alice", "alice-data", "leak/obj").await, "anon");
    seen.push(status_dump(&e));
    // A request the agent rejects as malformed.
    let e = shim
        .get("alice", "alice-data", "leak/obj", None, "not-a-token")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(s3_code(&e), "InvalidArgument");
    seen.push(status_dump(&e));

    // The target dies: connection errors, retries, warnings with target text.
    target.kill9();
    let e = shim
        .get("alice", "alice-data", "leak/obj", None, &dst)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert_eq!(s3_code(&e), "ServiceUnavailable", "{e:?}");
    seen.push(status_dump(&e));
    let e = shim
        .put("alice", "alice-data", "leak/obj2", &src)
        .await
        .unwrap_err();
    seen.push(status_dump(&e));
    drop(w);

    // The log may be coloured: search it without ANSI escapes too, so a
    // secret split by colour codes is still found.
    let raw_output = agent.output();
    let output = strip_ansi(&raw_output);
    let metrics = agent.metrics_text().await;
    // The test can fail: the agent logged at debug level, with request spans.
    assert!(output.contains("DEBUG"), "{output}");
    assert!(output.contains("request{"), "{output}");
    assert!(output.contains(&put.request_id), "{output}");
    assert!(output.contains("WARN"), "{output}");
    assert!(metrics.contains("s3dma_agent_requests_total"), "{metrics}");
    assert!(
        metrics.contains("s3dma_agent_auth_failures_total"),
        "{metrics}"
    );

    let secrets = [
        ("alice's secret access key", ALICE.1.to_owned()),
        ("bob's secret access key", BOB.1.to_owned()),
        ("host1's token", SHIM_TOKEN.to_owned()),
        ("host2's token", OTHER_SHIM_TOKEN.to_owned()),
        ("a presented (wrong) token", near_miss.to_owned()),
        ("the fabric key", FABRIC_KEY_HEX.to_owned()),
        ("the fabric key", FABRIC_KEY_HEX.to_uppercase()),
        (
            "the fabric key's first half",
            FABRIC_KEY_HEX[..32].to_owned(),
        ),
        (
            "the fabric key's second half",
            FABRIC_KEY_HEX[32..].to_owned(),
        ),
    ];
    let places = [
        ("the agent's output", raw_output.as_str()),
        ("the agent's output", output.as_str()),
        ("the agent's metrics", metrics.as_str()),
        ("what clients received", &seen.join("\n")),
    ];
    for (what, secret) in &secrets {
        for (place, text) in &places {
            assert!(
                !text.contains(secret.as_str()),
                "{what} appears in {place}:\n{text}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// 5. Configuration errors
// ---------------------------------------------------------------------------

#[test]
fn configuration_errors_name_file_and_field_never_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_secrets(d);
    let dd = d.display().to_string();
    let shims = format!(
        "  - name: host1\n    token_file: {dd}/shim.token\n    tenants: [alice, bob]\n  \
         - name: host2\n    token_file: {dd}/other-shim.token\n    tenants: [bob]\n"
    );
    let valid = agent_yaml(d, "", &shims, "http://127.0.0.1:9");
    let no_secret = |text: &str| {
        for s in [ALICE.1, BOB.1, SHIM_TOKEN, OTHER_SHIM_TOKEN, FABRIC_KEY_HEX] {
            assert!(!text.contains(s), "a secret appears in:\n{text}");
        }
    };
    let write = |name: &str, text: &str| {
        let p = d.join(name);
        write_private(&p, text);
        p
    };
    let run = |config: &Path, check: bool| {
        let mut args: Vec<&std::ffi::OsStr> = vec!["--config".as_ref(), config.as_os_str()];
        if check {
            args.push("--check".as_ref());
        }
        run_agent_bin(&args)
    };

    // (d) A valid configuration: --check reads everything and exits 0.
    let ok = write("valid.yaml", &valid);
    let (st, out, err) = run(&ok, true);
    assert!(st.success(), "{st:?}\nstdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("configuration is valid"), "{out}");
    assert!(out.contains(&ok.display().to_string()), "{out}");
    no_secret(&out);
    no_secret(&err);

    // Each broken file fails with or without --check, naming the file and
    // the field.
    let cases: Vec<(&str, String, Vec<String>)> = vec![
        (
            "(a) unknown field",
            valid.replace(
                "      max_concurrent_requests: 8",
                "      max_concurent_requests: 8",
            ),
            vec![
                "tenants[0].quotas".into(),
                "unknown field `max_concurent_requests`".into(),
            ],
        ),
        (
            "(a) unknown top-level field",
            valid.clone() + "secrets: {}\n",
            vec!["unknown field `secrets`".into()],
        ),
        (
            "(b) zero concurrency",
            valid.replace(
                "      max_concurrent_requests: 8",
                "      max_concurrent_requests: 0",
            ),
            vec![
                "tenants[0].quotas.max_concurrent_requests".into(),
                "at least 1".into(),
            ],
        ),
        (
            "(c) missing secret file",
            valid.replace(
                &format!("{dd}/bob.secret"),
                &format!("{dd}/missing/bob.secret"),
            ),
            vec![
                "tenants[1].secret_access_key_file".into(),
                format!("{dd}/missing/bob.secret"),
            ],
        ),
        (
            "(c) missing token file",
            valid.replace(
                &format!("{dd}/other-shim.token"),
                &format!("{dd}/nope.token"),
            ),
            vec!["shims[1].token_file".into(), format!("{dd}/nope.token")],
        ),
        (
            "(c) two shims with the same token",
            valid.replace(
                &format!("{dd}/other-shim.token"),
                &format!("{dd}/shim.token"),
            ),
            vec!["shims[1].token_file".into(), "host1".into()],
        ),
        (
            "(c) missing fabric key file",
            valid.replace(&format!("{dd}/fabric.key"), &format!("{dd}/nope.key")),
            vec!["fabric.fabric_key_file".into(), format!("{dd}/nope.key")],
        ),
        (
            "tls_name without listen.tls",
            valid.replace(
                "    tenants: [bob]\n",
                "    tenants: [bob]\n    tls_name: host2.test\n",
            ),
            vec!["shims[1].tls_name".into(), "listen.tls".into()],
        ),
    ];
    for (what, text, wants) in &cases {
        assert_ne!(text, &valid, "{what}: the mutation did not apply");
        let path = write("broken.yaml", text);
        for check in [false, true] {
            let (st, out, err) = run(&path, check);
            assert!(
                !st.success(),
                "{what} (--check {check}): exit {st:?}\nstdout:\n{out}\nstderr:\n{err}"
            );
            assert!(
                err.contains(&path.display().to_string()),
                "{what}: stderr does not name {}:\n{err}",
                path.display()
            );
            for w in wants {
                assert!(
                    err.contains(w.as_str()),
                    "{what}: stderr lacks {w:?}:\n{err}"
                );
            }
            assert!(!out.contains("listening"), "{what}: started:\n{out}");
            no_secret(&out);
            no_secret(&err);
        }
    }

    // Secret files with bad content: the error names the file, never what
    // is in it.
    let bad_tokens = [
        ("short", "short-tok-ABC12"),
        ("with a space", "has a space inside-0123456789"),
    ];
    for (what, content) in bad_tokens {
        let tok = write("bad.token", content);
        let text = valid.replace(
            &format!("{dd}/other-shim.token"),
            &tok.display().to_string(),
        );
        let path = write("badtoken.yaml", &text);
        let (st, out, err) = run(&path, true);
        assert!(!st.success(), "{what}: {out}{err}");
        assert!(err.contains("shims[1].token_file"), "{what}: {err}");
        assert!(err.contains(&tok.display().to_string()), "{what}: {err}");
        assert!(
            !err.contains(content) && !out.contains(content),
            "{what}: {err}"
        );
        no_secret(&err);
    }
    let key = write("bad.key", "zz-not-hex-but-secret-0123456789abcdef0123");
    let text = valid.replace(&format!("{dd}/fabric.key"), &key.display().to_string());
    let path = write("badkey.yaml", &text);
    let (st, out, err) = run(&path, true);
    assert!(!st.success(), "{out}{err}");
    assert!(err.contains("fabric.fabric_key_file"), "{err}");
    assert!(!err.contains("zz-not-hex-but-secret"), "{err}");
    no_secret(&err);
}

// ---------------------------------------------------------------------------
// 6. Callers are identified before they cost anything
// ---------------------------------------------------------------------------

/// `VmHWM` (peak resident set) of `pid`, KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Opens a raw TCP connection to `addr` and sends the HTTP/2 client preface
/// and an empty SETTINGS frame: an HTTP/2 connection that then says nothing.
fn silent_h2(addr: &str) -> std::net::TcpStream {
    use std::io::Write as _;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    s
}

/// An HTTP/2 HEADERS frame (END_STREAM | END_HEADERS) on `stream_id`:
/// a gRPC HeadObject call without credentials (literal HPACK fields).
fn headers_frame(stream_id: u32) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/s3dma.agent.v1.Agent/HeadObject"),
        (":authority", "agent"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        block.push(0x00); // literal without indexing, new name
        block.push(u8::try_from(name.len()).unwrap());
        block.extend_from_slice(name.as_bytes());
        block.push(u8::try_from(value.len()).unwrap());
        block.extend_from_slice(value.as_bytes());
    }
    let len = u32::try_from(block.len()).unwrap();
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.push(0x01); // HEADERS
    f.push(0x05); // END_STREAM | END_HEADERS
    f.extend_from_slice(&stream_id.to_be_bytes());
    f.extend_from_slice(&block);
    f
}

/// Reads until the peer closes (`true`) or `HANG_GUARD` passes (`false`).
fn closed_by_peer(mut s: std::net::TcpStream) -> bool {
    use std::io::Read as _;
    s.set_read_timeout(Some(HANG_GUARD)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// Turns a hang into a failure; not a performance threshold.
const HANG_GUARD: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_callers_pin_no_memory_and_lose_their_connections() {
    let target = Target::start(true);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_secrets(d);
    let dd = d.display().to_string();
    let shims =
        format!("  - name: host1\n    token_file: {dd}/shim.token\n    tenants: [alice, bob]\n");
    // (a) A long unauthenticated timeout: only the gate is at work.
    let yaml = agent_yaml(
        d,
        "  unauthenticated_timeout_secs: 3600\n",
        &shims,
        &target.endpoint,
    );
    write_private(&d.join("a.yaml"), &yaml);
    let agent = OwnAgent::start(&d.join("a.yaml"), d.join("a.log"));
    let pid = agent.pid();
    // One authenticated call first, so the agent's steady state is reached.
    let ok = Agent::shim_for(&agent.addr, SHIM_TOKEN).await;
    let r = head(&ok, "alice", "alice-data", "nothing").await;
    assert!(r.is_err(), "nothing was stored");
    let before = peak_rss_kib(pid);
    assert!(before > 0);

    // Without a token: 4 connections x 8 streams x 2 rounds of PutObject
    // requests just under 4 MiB each (the largest message any method
    // takes); before the gate, each was decoded whole before the token was
    // looked at.
    let big = "k".repeat((4 << 20) - (8 << 10));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let anon = Agent::shim_for(&agent.addr, "").await;
        for _ in 0..8 {
            let (anon, big) = (anon.clone(), big.clone());
            tasks.push(tokio::spawn(async move {
                let mut codes = Vec::new();
                for _ in 0..2 {
                    let r = anon.put("alice", "alice-data", &big, "not-a-token").await;
                    codes.push(r.map(|_| ()).map_err(|s| s.code()));
                }
                codes
            }));
        }
    }
    let mut n = 0;
    for t in tasks {
        for c in t.await.unwrap() {
            assert_eq!(
                c,
                Err(Code::Unauthenticated),
                "every call is refused as such"
            );
            n += 1;
        }
    }
    assert_eq!(n, 4 * 8 * 2);
    let after = peak_rss_kib(pid);
    // 64 x 4 MiB were sent; the agent may hold at most its HTTP/2 windows
    // (1 MiB per connection) at once. Memory, not time: no timing involved.
    assert!(
        after.saturating_sub(before) < 48 << 10,
        "peak RSS grew from {before} KiB to {after} KiB"
    );
    // The authenticated shim is still served (this target has no bucket:
    // a HEAD of a missing bucket is NoSuchBucket, once NoSuchKey).
    let r = head(&ok, "alice", "alice-data", "nothing").await;
    assert_eq!(s3_code(&r.unwrap_err()), "NoSuchBucket");
    drop(agent);

    // (b) A 1-second unauthenticated timeout and room for 3 connections.
    let yaml = agent_yaml(
        d,
        "  unauthenticated_timeout_secs: 1\n  max_connections: 3\n",
        &shims,
        &target.endpoint,
    );
    write_private(&d.join("b.yaml"), &yaml);
    let agent = OwnAgent::start(&d.join("b.yaml"), d.join("b.log"));
    let addr = agent.addr.clone();
    // An HTTP/2 connection that never authenticates is closed by the agent
    // (this one sends nothing after its SETTINGS).
    let idle = silent_h2(&addr);
    let (a, b) = (silent_h2(&addr), silent_h2(&addr));
    // The fourth is over the cap: closed at once.
    let over = silent_h2(&addr);
    let results = tokio::task::spawn_blocking(move || [idle, a, b, over].map(closed_by_peer))
        .await
        .unwrap();
    assert_eq!(
        results, [true; 4],
        "every silent connection is closed by the agent"
    );
    // A connection that keeps calling without credentials is closed too:
    // a raw HTTP/2 client sends a HeadObject without a token every 100 ms
    // until the agent closes the connection.
    let chatty = silent_h2(&addr);
    let reader = chatty.try_clone().unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let done = std::sync::Arc::clone(&done);
        std::thread::spawn(move || {
            use std::io::Write as _;
            let mut s = chatty;
            let mut stream_id = 1u32;
            while !done.load(std::sync::atomic::Ordering::Acquire) && stream_id < 20_000 {
                if s.write_all(&headers_frame(stream_id)).is_err() {
                    break;
                }
                stream_id += 2;
                std::thread::sleep(Duration::from_millis(100));
            }
            stream_id / 2
        })
    };
    let closed = tokio::task::spawn_blocking(move || closed_by_peer(reader))
        .await
        .unwrap();
    done.store(true, std::sync::atomic::Ordering::Release);
    let calls = writer.join().unwrap();
    assert!(
        closed,
        "a connection calling without credentials stays open"
    );
    assert!(calls >= 1);
    // And a shim with its token is served once the strangers are gone.
    let ok = Agent::shim_for(&addr, SHIM_TOKEN).await;
    // (No bucket on this target: NoSuchBucket, once NoSuchKey.)
    let r = head(&ok, "alice", "alice-data", "nothing").await;
    assert_eq!(s3_code(&r.unwrap_err()), "NoSuchBucket");
    let metrics = scrape(&agent.metrics, None).1;
    let closed = |reason: &str| {
        metric_value(
            &metrics,
            "s3dma_agent_grpc_connections_closed_total",
            &format!("reason=\"{reason}\""),
        )
        .unwrap_or(0.0)
    };
    assert!(closed("refused") >= 1.0, "{metrics}");
    assert!(closed("unauthenticated") >= 4.0, "{metrics}");
    let refused = metric_value(
        &metrics,
        "s3dma_agent_auth_failures_total",
        "reason=\"missing\"",
    )
    .unwrap_or(0.0);
    assert!(refused >= 1.0, "{metrics}");
}

/// `GET /metrics` on `metrics` (`http://A/metrics`, or `unix:PATH`) with an
/// optional bearer token: (status code, body).
fn scrape(metrics: &str, token: Option<&str>) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n");
    let mut out = String::new();
    if let Some(path) = metrics.strip_prefix("unix:") {
        let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        s.read_to_string(&mut out).unwrap();
    } else {
        let addr = metrics
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        s.read_to_string(&mut out).unwrap();
    }
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (code, body)
}

// ---------------------------------------------------------------------------
// 7. Batches obey the tenant's quotas
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_objects_items_each_take_a_quota_slot_and_batches_are_bounded() {
    let target = Target::start(true);
    target.create_bucket("alice-data").await;
    let s3 = target.s3(ALICE);
    for i in 0..8 {
        s3.put_object()
            .bucket("alice-data")
            .key(format!("b/{i}"))
            .body(data(64 << 10, i).into())
            .send()
            .await
            .unwrap();
    }
    let mut spec = AgentSpec::one(&target);
    // One request at a time and no queue: a second request at once is
    // SlowDown.
    spec.alice_quotas = "max_concurrent_requests: 1\nmax_queued_requests: 0".into();
    spec.transfer = "max_batch_items: 8".into();
    let agent = Agent::start(spec);
    let shim = agent.client().await;
    let mem = Memory::new(8 << 20).await;
    let windows: Vec<_> = (0..8)
        .map(|i| mem.window(i * (1 << 20), 1 << 20, Access::ALL))
        .collect();
    let items: Vec<pb::GetObjectsItem> = windows
        .iter()
        .enumerate()
        .map(|(i, (_, token))| pb::GetObjectsItem {
            bucket: "alice-data".into(),
            key: format!("b/{i}"),
            range: None,
            destination: token.clone(),
        })
        .collect();
    let run = |items: Vec<pb::GetObjectsItem>, concurrency: u32| {
        let shim = shim.clone();
        async move {
            let mut stream = shim
                .inner
                .clone()
                .get_objects(shim.req(pb::GetObjectsRequest {
                    tenant: "alice".into(),
                    items,
                    concurrency,
                }))
                .await?
                .into_inner();
            let mut out = Vec::new();
            while let Some(r) = stream.next().await {
                out.push(match r?.result.unwrap() {
                    pb::get_objects_reply::Result::Ok(_) => "ok".to_owned(),
                    pb::get_objects_reply::Result::Error(e) => e.s3_code,
                });
            }
            Ok::<_, Status>(out)
        }
    };
    // One item at a time: each takes the tenant's only slot and gives it
    // back when it ends, so all succeed.
    let seq = run(items.clone(), 1).await.unwrap();
    assert_eq!(seq, vec!["ok"; 8]);
    // Eight at once: the batch is not one request; its items beyond the
    // tenant's one slot are refused like any other request would be.
    let par = run(items.clone(), 8).await.unwrap();
    assert_eq!(par.len(), 8);
    assert!(par.iter().any(|c| c == "ok"), "{par:?}");
    assert!(par.iter().any(|c| c == "SlowDown"), "{par:?}");
    assert!(par.iter().all(|c| c == "ok" || c == "SlowDown"), "{par:?}");
    // Every item was counted as a request of the tenant's.
    let m = agent.metrics_text().await;
    let counted: f64 = m
        .lines()
        .filter(|l| {
            l.starts_with("s3dma_agent_requests_total{")
                && l.contains("tenant=\"alice\"")
                && l.contains("op=\"GetObjects\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(counted, 16.0, "{m}");
    // A batch over transfer.max_batch_items is refused, saying so.
    let mut nine = items.clone();
    nine.push(items[0].clone());
    let e = run(nine, 1).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("at most 8 items"), "{e:?}");
    assert!(e.message().contains("transfer.max_batch_items"), "{e:?}");
}

// ---------------------------------------------------------------------------
// 8. No tenant holds the whole staging pool
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holds_at_most_its_share_of_the_staging_pool() {
    // A target without RDMA: every byte goes through the staging pool.
    let target = Target::start(false);
    target.create_bucket("alice-data").await;
    target.create_bucket("bob-data").await;
    let object = data(6 << 20, 7);
    for (bucket, who) in [("alice-data", ALICE), ("bob-data", BOB)] {
        target
            .s3(who)
            .put_object()
            .bucket(bucket)
            .key("big")
            .body(object.clone().into())
            .send()
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_secrets(d);
    let dd = d.display().to_string();
    let shims =
        format!("  - name: host1\n    token_file: {dd}/shim.token\n    tenants: [alice, bob]\n");
    // A pool of 4 x 1 MiB; alice's byte quota (the default 1 GiB) is far
    // larger than the pool, bob's is 1 MiB; the share is 50%.
    let yaml = agent_yaml(d, "", &shims, &target.endpoint)
        .replace("    rdma: true\n", "    rdma: false\n")
        .replace(
            "  - name: bob\n    access_key_id",
            "  - name: bob\n    quotas:\n      max_bytes_in_flight: 1MiB\n    access_key_id",
        )
        .replace("transfer:\n", "transfer:\n  chunk_size: 1MiB\n");
    write_private(&d.join("agent.yaml"), &yaml);
    let agent = OwnAgent::start(&d.join("agent.yaml"), d.join("agent.log"));
    // The start-up log states each tenant's effective share: alice's quota
    // is clamped to half the pool, bob's to his byte quota.
    let log = strip_ansi(&agent.log());
    let share = |tenant: &str| {
        log.lines()
            .find(|l| {
                l.contains("share of the staging pool") && l.contains(&format!("tenant={tenant}"))
            })
            .unwrap_or_else(|| panic!("no share line for {tenant}:\n{log}"))
            .to_owned()
    };
    assert!(
        share("alice").contains("staging_buffers=2 of=4"),
        "{}",
        share("alice")
    );
    assert!(
        share("bob").contains("staging_buffers=1 of=4"),
        "{}",
        share("bob")
    );

    // Both tenants' fallback GETs, several at once, complete and place the
    // right bytes: a tenant waits for its own share instead of taking the
    // pool, and a transfer never waits on buffers only it could free.
    let shim = Agent::shim_for(&agent.addr, SHIM_TOKEN).await;
    let mem = Memory::new(4 * (6 << 20)).await;
    let mut tasks = Vec::new();
    for (i, (tenant, bucket)) in [
        ("alice", "alice-data"),
        ("alice", "alice-data"),
        ("bob", "bob-data"),
        ("bob", "bob-data"),
    ]
    .into_iter()
    .enumerate()
    {
        let (w, tok) = mem.window(i * (6 << 20), 6 << 20, Access::ALL);
        let shim = shim.clone();
        tasks.push(tokio::spawn(async move {
            let r = shim.get(tenant, bucket, "big", None, &tok).await;
            drop(w);
            r
        }));
    }
    for t in tasks {
        let r = tokio::time::timeout(HANG_GUARD, t)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(r.bytes_placed, 6 << 20);
        assert_eq!(r.path, pb::TransferPath::Fallback as i32);
    }
    for i in 0..4 {
        assert_eq!(
            mem.sha256(i * (6 << 20), 6 << 20),
            sha256(&object),
            "window {i}"
        );
    }
}

// ---------------------------------------------------------------------------
// 9. Logs cannot be forged; the agent's request ids are its own
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_client_request_ids_are_logged_escaped_and_never_reused() {
    let target = Target::start(true);
    target.create_bucket("alice-data").await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_secrets(d);
    let dd = d.display().to_string();
    let shims =
        format!("  - name: host1\n    token_file: {dd}/shim.token\n    tenants: [alice, bob]\n");
    write_private(
        &d.join("agent.yaml"),
        agent_yaml(d, "", &shims, &target.endpoint),
    );
    let agent = OwnAgent::start_with(
        &d.join("agent.yaml"),
        d.join("agent.log"),
        "debug,h2=info,hyper=info,tower=info",
    );
    let shim = Agent::shim_for(&agent.addr, SHIM_TOKEN).await;
    let mem = Memory::new(1 << 20).await;
    mem.fill(0, b"hello");
    let (_w, src) = mem.window(0, 5, Access::ALL);

    let evil =
        "k\n2030-01-01T00:00:00Z  INFO request{id=FORGED tenant=bob}: done\x1b[31mred\u{202e}";
    // A request id with a tab and a byte that is not UTF-8 (C1 CSI): what
    // an HTTP/2 header value can carry.
    let evil_rid: &[u8] = b"rid\tFORGED\x9b31m";
    let with_rid = |msg: pb::PutObjectRequest, rid: &[u8]| {
        let mut r = shim.req(msg);
        let mut h = std::mem::take(r.metadata_mut()).into_headers();
        h.insert("x-request-id", http::HeaderValue::from_bytes(rid).unwrap());
        *r.metadata_mut() = tonic::metadata::MetadataMap::from_headers(h);
        r
    };
    let put = |key: &str| pb::PutObjectRequest {
        tenant: "alice".into(),
        bucket: "alice-data".into(),
        key: key.into(),
        source: src.clone(),
        content_type: String::new(),
        metadata: [("origin".to_owned(), "v".to_owned())].into(),
    };
    let ok = shim
        .inner
        .clone()
        .put_object(with_rid(put(evil), evil_rid))
        .await
        .unwrap()
        .into_inner();
    // A sane client id is not reused either.
    let ok2 = shim
        .inner
        .clone()
        .put_object(with_rid(put("plain"), b"shim-chosen-id-42"))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(ok2.request_id, "shim-chosen-id-42");
    assert_eq!(ok2.request_id.len(), 32, "{}", ok2.request_id);
    // A denied request quotes the key in its error (logged at debug).
    let denied = shim
        .inner
        .clone()
        .put_object(with_rid(
            pb::PutObjectRequest {
                bucket: "bob-data".into(),
                ..put(evil)
            },
            evil_rid,
        ))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    // So is a metadata name that is no header name.
    let bad_name = shim
        .inner
        .clone()
        .put_object(with_rid(
            pb::PutObjectRequest {
                metadata: [("n\x1b[2Jame\nX".to_owned(), "v".to_owned())].into(),
                ..put("plain")
            },
            evil_rid,
        ))
        .await
        .unwrap_err();
    assert_eq!(bad_name.code(), Code::InvalidArgument, "{bad_name:?}");
    let info = denied.get_details_error_info().unwrap();
    let denied_rid = info.metadata["request_id"].clone();
    assert_eq!(denied_rid.len(), 32, "{denied_rid}");

    let raw = agent.log();
    let log = strip_ansi(&raw);
    // Logged, escaped: no control character but the line ends.
    assert!(log.contains("k\\n2030-01-01T00:00:00Z"), "{log}");
    assert!(log.contains("\\u{1b}[31mred\\u{202e}"), "{log}");
    for (i, c) in log.chars().enumerate() {
        assert!(
            c == '\n' || !(c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c)),
            "raw {c:?} at {i} in the agent log:\n{log}"
        );
    }
    assert!(
        !log.lines().any(|l| l.starts_with("2030-01-01")),
        "a forged line:\n{log}"
    );
    // The client's id is a separate, escaped field; the agent's own id is
    // the span's id and what the reply carries.
    assert!(
        log.contains("client_request_id=rid\\x09FORGED\\x9b31m"),
        "{log}"
    );
    assert!(log.contains("client_request_id=shim-chosen-id-42"), "{log}");
    for rid in [&ok.request_id, &ok2.request_id, &denied_rid] {
        assert!(
            log.contains(&format!("request{{id={rid} ")),
            "{rid}:\n{log}"
        );
    }
    assert!(!log.contains("request{id=shim-chosen-id-42"), "{log}");
    // The target saw the agent's id, never the client's.
    let tlog = strip_ansi(&target.log());
    assert!(!tlog.contains("shim-chosen-id-42"), "{tlog}");
}

// ---------------------------------------------------------------------------
// 10. Metrics behind a token and on a Unix socket
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_the_token_and_are_served_on_the_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_secrets(d);
    let token = "metrics-token-0123456789abcdef";
    write_private(&d.join("metrics.token"), format!("{token}\n"));
    let dd = d.display().to_string();
    let shims =
        format!("  - name: host1\n    token_file: {dd}/shim.token\n    tenants: [alice, bob]\n");
    let sock = d.join("metrics.sock");
    let yaml = agent_yaml(d, "", &shims, "http://127.0.0.1:9")
        + &format!(
            "  unix_socket: {}\n  bearer_token_file: {dd}/metrics.token\n",
            sock.display()
        );
    write_private(&d.join("agent.yaml"), &yaml);
    let agent = OwnAgent::start(&d.join("agent.yaml"), d.join("agent.log"));
    assert!(
        agent.metrics.contains(&format!("unix:{}", sock.display())),
        "{}",
        agent.metrics
    );
    let tcp = agent.metrics.split(' ').next().unwrap().to_owned();
    let unix = format!("unix:{}", sock.display());
    // A failed call, so there is a tenant-free metric to see.
    let anon = Agent::shim_for(&agent.addr, "").await;
    let _ = head(&anon, "alice", "alice-data", "k").await;
    for at in [&tcp, &unix] {
        let (code, body) = scrape(at, None);
        assert_eq!(code, 401, "{at}: {body}");
        assert!(!body.contains("s3dma_agent"), "{body}");
        let (code, _) = scrape(at, Some("wrong-token-0123456789abcdef"));
        assert_eq!(code, 401, "{at}");
        let (code, body) = scrape(at, Some(token));
        assert_eq!(code, 200, "{at}: {body}");
        assert!(
            body.contains("s3dma_agent_auth_failures_total"),
            "{at}: {body}"
        );
    }
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(!agent.log().contains(token));
}
