//! The end-to-end test harness (feature `harness`): real processes for the
//! agent's and the shim's integration tests and the agent's bench:
//! storage-targets and dpu-agents (the workspace's binaries, found in the
//! target directory above the test binary), a moto S3 server (third-party
//! S3, from the test virtualenv), a one-node Ceph cluster (an existing S3
//! cluster: radosgw from Debian's packages), and a test "shim" that holds tcp-fabric
//! memory and calls the agent's gRPC API.
//!
//! dpu-agent's tests (`dpu-agent/tests/common`) and host-shim's
//! (`host-shim/tests/common`, which adds the host-shim process) use it as a
//! dev-dependency instead of including each other's files. Everything here
//! panics on failure: it is for tests.
//!
//! By part: [`process`] starts, waits for and stops service processes
//! (any, e.g. host-shim's tests start the shim with it); `target` the
//! storage-target, `agent` the dpu-agent, `tenant` the test shim and tenant
//! memory, `third_party` moto and Ceph. Everything is re-exported here.

mod agent;
pub mod process;
mod target;
mod tenant;
mod third_party;

use std::path::{Path, PathBuf};
use std::process::Command;

use aws_sdk_s3::Client as S3Client;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region as AwsRegion};
use fabric::FabricKey;
use sha2::Digest as _;

pub use agent::{Agent, AgentSpec, TargetSpec};
pub use process::{read_log, spawn_service, stop_service};
pub use target::{Target, TargetOpts};
pub use tenant::{Memory, Shim};
pub use third_party::{Ceph, Moto};

/// The gateway's cache section, for [`TargetOpts::gateway`].
pub use storage_target::gateway::CacheConfig;

/// Fabric key shared by tenant memory, agent and targets.
pub const FABRIC_KEY_HEX: &str = "8899aabbccddeeff00112233445566778899aabbccddeeff0011223344556677";
/// Tenant credentials (S3 users on the target).
pub const ALICE: (&str, &str) = ("AKIAALICE", "alice-secret-Zq8v1X");
/// Another tenant.
pub const BOB: (&str, &str) = ("AKIABOB", "bob-secret-Hh3k9P");
/// Target admin (creates buckets).
pub const ADMIN: (&str, &str) = ("admin", "admin-secret-Lm2");
/// The shim's bearer token.
pub const SHIM_TOKEN: &str = "shim-token-0123456789abcdef";

/// Writes a secret file (token, key) as the services require: mode 0600
/// (also when it existed with another mode).
pub fn write_private(path: &Path, content: impl AsRef<[u8]>) {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .unwrap();
    f.write_all(content.as_ref()).unwrap();
}

/// The size of the suites' "large object" cases: 1 GiB, or
/// `$S3DMA_TEST_LARGE_OBJECT` bytes (the Soft-RoCE VM, whose emulated CPUs
/// are slow, uses 256 MiB: still many chunks and a multipart upload).
///
/// # Panics
/// On a value that is not a number of bytes.
#[must_use]
pub fn large_object_len() -> usize {
    std::env::var("S3DMA_TEST_LARGE_OBJECT").map_or(1 << 30, |v| {
        v.parse()
            .unwrap_or_else(|e| panic!("S3DMA_TEST_LARGE_OBJECT={v:?}: {e}"))
    })
}

/// [`FABRIC_KEY_HEX`] as a key.
pub fn fabric_key() -> FabricKey {
    fabric::config::parse_fabric_key(FABRIC_KEY_HEX).unwrap()
}

/// The fabric every service and test tenant of the harness uses:
/// `$S3DMA_TEST_FABRIC` (`tcp` when unset). `.ci/rdma-vm.sh` runs the
/// end-to-end suites again with `verbs` on Soft-RoCE.
///
/// # Panics
/// On a value other than `tcp` or `verbs`.
#[must_use]
pub fn backend() -> fabric::Backend {
    match std::env::var("S3DMA_TEST_FABRIC") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("S3DMA_TEST_FABRIC: {e}")),
        Err(_) => fabric::Backend::Tcp,
    }
}

/// `target/<profile>/` of this test binary (where workspace binaries are).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `GET` of a `http://IP:PORT/metrics` URL, the whole response.
pub async fn scrape(url: &str) -> String {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        let addr = url
            .trim_start_matches("http://")
            .trim_end_matches("/metrics")
            .to_owned();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        use std::io::{Read as _, Write as _};
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap()
}

/// `bin` as a command, run through `wrap` (e.g. `ip netns exec NS`) when
/// it is not empty.
pub fn wrapped(wrap: &[String], bin: &Path) -> Command {
    match wrap.split_first() {
        None => Command::new(bin),
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin);
            c
        }
    }
}

/// An aws-sdk-s3 client for `endpoint` (path-style, `us-east-1`).
pub fn s3_client(endpoint: &str, ak: &str, sk: &str) -> S3Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(crate::https_client())
        .region(AwsRegion::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(ak, sk, None, None, "test"))
        .force_path_style(true)
        .build();
    S3Client::from_conf(conf)
}

/// A free TCP port on loopback (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `base` with the keys of the YAML mapping `yaml` (a test's snippet, e.g.
/// `chunk_size: 1MiB`) set over it; the result is read back into `T`, so an
/// unknown key fails here.
///
/// # Panics
/// `yaml` is not a mapping, or the result is not a valid `T`.
pub fn overlay<T: serde::Serialize + serde::de::DeserializeOwned>(base: &T, yaml: &str) -> T {
    let mut v = serde_yaml::to_value(base).unwrap();
    if !yaml.trim().is_empty() {
        let extra: serde_yaml::Mapping = serde_yaml::from_str(yaml)
            .unwrap_or_else(|e| panic!("{yaml:?} is not a YAML mapping: {e}"));
        let map = v.as_mapping_mut().unwrap();
        for (k, x) in extra {
            map.insert(k, x);
        }
    }
    serde_yaml::from_value(v).unwrap_or_else(|e| panic!("{yaml:?}: {e}"))
}

/// Deterministic pseudo-random bytes.
pub fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// SHA-256 of `b`, lowercase hex.
pub fn sha256(b: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(b))
}

/// The value of metric `name` (summed over its label sets; `name` may
/// carry labels, e.g. `m{tenant="alice"}`) in Prometheus text.
pub fn metric_value(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Open file descriptors of process `pid`.
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(Iterator::count)
        .unwrap_or(0)
}

/// Anonymous resident memory of process `pid` in KiB (`RssAnon`: what the
/// process allocated itself; shared tenant memory it maps is not counted).
pub fn rss_anon_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The S3 error code in an agent status.
pub fn s3_code(st: &tonic::Status) -> String {
    use tonic_types::StatusExt as _;
    st.get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

/// Reads an object straight from the target with aws-sdk-s3.
pub async fn sdk_get(c: &S3Client, bucket: &str, key: &str) -> Vec<u8> {
    c.get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .into_bytes()
        .to_vec()
}
