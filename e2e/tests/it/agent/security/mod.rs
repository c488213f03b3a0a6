//! Trust and tenancy against real dpu-agent and storage-target processes,
//! one module per attack: [`policy`] (a tenant reaching past its policy or
//! its quotas), [`shim_auth`] (a caller that is not the shim it claims:
//! bearer tokens, mTLS), [`secrets`] (secrets in logs, metrics, errors,
//! replies and configuration errors), [`unauthenticated`] (callers without
//! credentials holding memory or connections), [`logs`] (forged log lines,
//! chosen request ids) and [`metrics`] (metrics without the token). The
//! helpers they share are here.

mod logs;
mod metrics;
mod policy;
mod secrets;
mod shim_auth;
mod unauthenticated;

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

/// A fresh directory with the secret files of [`write_secrets`], and the
/// one shim `host1` (for alice and bob, with `shim.token`) as YAML under
/// `shims:`.
fn secrets_dir() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    write_secrets(dir.path());
    let shims = format!(
        "  - name: host1\n    token_file: {}/shim.token\n    tenants: [alice, bob]\n",
        dir.path().display()
    );
    (dir, shims)
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

    /// Writes `yaml` to `dir/NAME.yaml` (private) and starts an agent on
    /// it, logging to `dir/NAME.log`.
    fn start_from(dir: &Path, name: &str, yaml: &str) -> OwnAgent {
        let config = dir.join(format!("{name}.yaml"));
        write_private(&config, yaml);
        OwnAgent::start(&config, dir.join(format!("{name}.log")))
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

/// Turns a hang into a failure; not a performance threshold.
const HANG_GUARD: Duration = Duration::from_secs(120);

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
