//! Starts the real `storage-target` binary for integration tests, as a
//! `s3dma_testkit::Service` (the one wrapper of a service process, which
//! the end-to-end harness's `Target` uses too), on a config built from the
//! real config types, and builds clients for it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use aws_sdk_s3::Client;
use bytes::Bytes;
use s3dma_testkit::{Service, ServiceSpec};
use storage_target::config::Config;

pub(crate) use s3dma_testkit::{data, files_under, get_as};

/// Users in every test config.
pub(crate) const ADMIN: (&str, &str) = ("admin", "admin-secret");
/// Another user with read-write on every bucket (for ownership checks).
pub(crate) const OTHER: (&str, &str) = ("other", "other-secret");
/// A user with read-only access to bucket `shared` and nothing else.
pub(crate) const READER: (&str, &str) = ("reader", "reader-secret");
/// Two users with no operator grants who may create buckets: what they
/// reach, they reach as owners or through ACLs.
pub(crate) const OWNER_A: (&str, &str) = ("owner-a", "owner-a-secret");
/// See [`OWNER_A`].
pub(crate) const OWNER_B: (&str, &str) = ("owner-b", "owner-b-secret");

/// The S3 error code and HTTP status of a failed SDK call.
pub(crate) use s3dma_testkit::sdk_error as err;

/// Writes a secret file mode 0600 (the storage-target refuses secret files
/// group or others can read).
pub(crate) use s3dma_testkit::write_private;

/// How to launch the process beyond its config.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Launch {
    /// Run the binary under this umask (through `sh -c 'umask ..; exec ..'`).
    pub umask: Option<u32>,
}

/// A running storage-target process.
pub(crate) struct Server {
    svc: Service,
    /// `http://IP:PORT`.
    pub endpoint: String,
    /// `http://IP:PORT/metrics`.
    pub metrics: String,
    /// The data directory.
    pub data_dir: PathBuf,
    _tmp: tempfile::TempDir,
}

/// The config every test server starts from, built from the real config
/// types: the users above, loopback, a fresh data directory.
fn base_config(dir: &Path, data_dir: &Path) -> Config {
    use storage_target::config::{Access, BucketGrant, UserConfig};
    let secret_file = dir.join("other.key");
    write_private(&secret_file, format!("{}\n", OTHER.1));
    let user = |(ak, sk): (&str, &str), buckets: Vec<BucketGrant>| UserConfig {
        access_key_id: ak.into(),
        secret: Some(sk.into()),
        secret_file: None,
        buckets,
        canonical_id: None,
        display_name: None,
        create_buckets: false,
    };
    let all = |access| {
        vec![BucketGrant {
            name: "*".into(),
            access,
        }]
    };
    let mut cfg = Config::new(data_dir.to_path_buf());
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.region = "us-east-1".into();
    cfg.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    cfg.max_clock_skew_secs = 900;
    cfg.users = vec![
        user(ADMIN, all(Access::ReadWrite)),
        UserConfig {
            secret: None,
            secret_file: Some(secret_file),
            ..user(OTHER, all(Access::ReadWrite))
        },
        user(
            READER,
            vec![BucketGrant {
                name: "shared".into(),
                access: Access::Read,
            }],
        ),
        UserConfig {
            display_name: Some("Owner A".into()),
            create_buckets: true,
            ..user(OWNER_A, Vec::new())
        },
        UserConfig {
            create_buckets: true,
            ..user(OWNER_B, Vec::new())
        },
    ];
    cfg
}

impl Server {
    /// Starts a server on a fresh temporary data directory.
    pub(crate) fn start() -> Server {
        Server::start_with(|_| String::new())
    }

    /// Starts a server whose config is the standard one plus the YAML that
    /// `extra` returns (it may write files into the temporary directory it
    /// is given, e.g. a fabric key).
    pub(crate) fn start_with(extra: impl FnOnce(&Path) -> String) -> Server {
        Server::launch(extra, Launch::default())
    }

    /// [`Server::start_with`], launched as `launch` says.
    pub(crate) fn launch(extra: impl FnOnce(&Path) -> String, launch: Launch) -> Server {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let base = base_config(tmp.path(), &data);
        // The test's YAML replaces whole top-level sections of the base.
        let cfg = s3dma_testkit::overlay(&base, &extra(tmp.path()));
        let config = tmp.path().join("storage-target.yaml");
        s3dma_testkit::write_yaml(&config, &cfg);
        let mut spec = ServiceSpec::new(
            "storage-target",
            env!("CARGO_BIN_EXE_storage-target").into(),
            config,
            tmp.path().join("stderr.log"),
            &["storage-target listening on ", "metrics on "],
        )
        .env("RUST_LOG", "info,s3s=warn");
        if let Some(m) = launch.umask {
            spec.wrap = vec![
                "sh".into(),
                "-c".into(),
                format!("umask {m:03o}; exec \"$0\" \"$@\""),
            ];
        }
        let mut s = Server {
            svc: Service::start(spec),
            endpoint: String::new(),
            metrics: String::new(),
            data_dir: data,
            _tmp: tmp,
        };
        s.started();
        s
    }

    fn started(&mut self) {
        self.endpoint = self.svc.line(0).to_owned();
        // "metrics on http://IP:PORT/metrics[ and unix:PATH]"
        self.metrics = self
            .svc
            .line(1)
            .split(" and ")
            .next()
            .unwrap_or_default()
            .to_owned();
    }

    /// SIGKILLs the process and waits for it.
    pub(crate) fn kill9(&mut self) {
        self.svc.kill9();
    }

    /// Sends SIGTERM and waits for a clean exit; returns whether it exited 0.
    pub(crate) fn terminate(&mut self) -> bool {
        self.svc.terminate(Duration::from_secs(120))
    }

    /// Starts the binary again on the same config and data directory.
    pub(crate) fn restart(&mut self) {
        self.svc.restart();
        self.started();
    }

    /// The process id (0 while it is not running).
    pub(crate) fn pid(&self) -> u32 {
        self.svc.pid().unwrap_or(0)
    }

    /// The server's log so far.
    pub(crate) fn log(&self) -> String {
        self.svc.log()
    }

    /// An SDK client (path style, static credentials).
    pub(crate) fn client(&self, (ak, sk): (&str, &str)) -> Client {
        client_for(&self.endpoint, ak, sk)
    }

    /// The admin client.
    pub(crate) fn admin(&self) -> Client {
        self.client(ADMIN)
    }

    /// `http://IP:PORT/<path>`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.endpoint)
    }
}

/// An SDK client for `endpoint`.
pub(crate) use s3dma_testkit::s3_client as client_for;

/// A raw HTTP response, and sending a raw (unsigned unless the URL is
/// presigned or the headers carry a signature) HTTP request.
pub(crate) use s3dma_testkit::{Raw, raw};

/// A body-less request signed as `user` with SigV4 (UNSIGNED-PAYLOAD) over
/// the `signed` headers, with the `unsigned` ones added after signing.
pub(crate) async fn send_signed(
    user: (&str, &str),
    method: &str,
    url: &str,
    signed: &[(&str, &str)],
    unsigned: &[(&str, &str)],
) -> Raw {
    let mut headers = sign_v4_as(
        user,
        method,
        url,
        signed,
        aws_sigv4::http_request::SignableBody::UnsignedPayload,
        SystemTime::now(),
    );
    headers.extend(
        unsigned
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let hs: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(k, _)| k != "host")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    raw(method, url, &hs, Bytes::new()).await
}

/// Creates bucket `b` as the admin.
pub(crate) async fn create_bucket(s: &Server, b: &str) {
    s3dma_testkit::create_bucket(&s.admin(), b).await;
}

/// Stores `d` at `b/k` as the admin, through the SDK (plain HTTP).
pub(crate) async fn sdk_put(s: &Server, b: &str, k: &str, d: Vec<u8>) {
    s3dma_testkit::put_as(&s.admin(), b, k, d).await;
}

/// The bytes at `b/k` through the SDK, `None` when there is no object.
pub(crate) async fn sdk_get(s: &Server, b: &str, k: &str) -> Option<Vec<u8>> {
    get_as(&s.admin(), b, k).await
}

/// Hex MD5.
pub(crate) fn md5_hex(b: &[u8]) -> String {
    use s3s::crypto::Checksum as _;
    hex::encode(s3s::crypto::Md5::checksum(b))
}

/// Signs a raw request as a given user with SigV4 in the Authorization
/// header (region us-east-1): the signing headers, ready to send.
pub(crate) use s3dma_testkit::sign_v4_as;
