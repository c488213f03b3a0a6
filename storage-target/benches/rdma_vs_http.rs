//! GET and PUT throughput of one storage-target process: over RDMA (tcp
//! fabric, client memory registered, `x-amz-rdma-token`) versus over HTTP
//! with aws-sdk-s3 (GET body drained into memory, PUT from memory), for
//! 64 MiB and 1 GiB objects, measured in one run.
//!
//! `cargo bench -p storage-target --bench rdma_vs_http` (add `-- --quick`
//! for one repetition each). Prints a table and, as the last line, JSON.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use fabric::{Access, Domain, Endpoint, EndpointConfig};
use http_body_util::BodyExt as _;
use s3dma_testkit::{Service, ServiceSpec};

const KEY_HEX: &str = "8f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
/// The one user (read-write on every bucket).
const ADMIN: (&str, &str) = ("admin", "admin-secret");

/// The storage-target binary on loopback with RDMA on the tcp fabric, its
/// files in `dir`; returns it and its S3 endpoint.
fn start_target(dir: &Path) -> (Service, String) {
    use storage_target::config::{Access, BucketGrant, Config, UserConfig};
    let kf = dir.join("fabric.key");
    s3dma_testkit::write_private(&kf, KEY_HEX);
    let mut cfg = Config::new(dir.join("data"));
    cfg.listen = "127.0.0.1:0".parse().expect("addr");
    cfg.region = "us-east-1".into();
    cfg.users = vec![UserConfig {
        access_key_id: ADMIN.0.into(),
        secret: Some(ADMIN.1.into()),
        secret_file: None,
        buckets: vec![BucketGrant {
            name: "*".into(),
            access: Access::ReadWrite,
        }],
        canonical_id: None,
        display_name: None,
        create_buckets: false,
    }];
    cfg.rdma.mode = storage_target::rdma::RdmaMode::Enabled;
    cfg.rdma.backend = fabric::Backend::Tcp;
    cfg.rdma.fabric_key_file = Some(kf);
    let config = dir.join("storage-target.yaml");
    s3dma_testkit::write_yaml(&config, &cfg);
    let svc = Service::start(
        ServiceSpec::new(
            "storage-target",
            env!("CARGO_BIN_EXE_storage-target").into(),
            config,
            dir.join("stderr.log"),
            &["storage-target listening on "],
        )
        .env("RUST_LOG", "warn"),
    );
    let endpoint = svc.line(0).to_owned();
    (svc, endpoint)
}

type Http = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<Bytes>,
>;

/// The headers of an RDMA request: the token, inside the SigV4 signature.
fn sign(method: &str, url: &str, token: &str) -> Vec<(String, String)> {
    let mut headers = s3dma_testkit::sign_v4_as(
        ADMIN,
        method,
        url,
        &[
            ("x-amz-rdma-token", token),
            ("x-amz-rdma-protocol", "s3dma-v1"),
        ],
        aws_sigv4::http_request::SignableBody::UnsignedPayload,
        SystemTime::now(),
    );
    headers.retain(|(k, _)| k != "host");
    headers
}

async fn rdma_req(http: &Http, method: &str, url: &str, token: &str) {
    let mut b = http::Request::builder().method(method).uri(url);
    for (k, v) in sign(method, url, token) {
        b = b.header(k, v);
    }
    let resp = http
        .request(
            b.body(http_body_util::Full::new(Bytes::new()))
                .expect("request"),
        )
        .await
        .expect("send");
    let status = resp.status();
    let reply = resp
        .headers()
        .get("x-amz-rdma-reply")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert!(
        status.is_success() && reply.as_deref() == Some("200"),
        "{method} {url}: {status} {reply:?} {}",
        String::from_utf8_lossy(&body)
    );
}

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

/// Runs `f` `reps` times and returns the mean duration.
async fn time<F, Fut>(reps: usize, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut total = Duration::ZERO;
    for _ in 0..reps {
        let t = Instant::now();
        f().await;
        total += t.elapsed();
    }
    total / u32::try_from(reps).unwrap_or(1)
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let dir = tempfile::tempdir().expect("temporary directory");
    let (_target, target_url) = start_target(dir.path());
    let sdk = s3dma_testkit::s3_client(&target_url, ADMIN.0, ADMIN.1);
    sdk.create_bucket()
        .bucket("bench")
        .send()
        .await
        .expect("bucket");
    let http: Http =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();

    const GIB: usize = 1 << 30;
    let domain = Domain::tcp();
    let mem = domain.alloc(GIB, Access::ALL).expect("client memory");
    let key = fabric::config::parse_fabric_key(KEY_HEX).expect("key");
    let endpoint = Endpoint::listen(
        &domain,
        EndpointConfig::new("127.0.0.1:0".parse().expect("addr"), key),
    )
    .await
    .expect("endpoint");
    // Client data, in registered memory (RDMA) and in a Bytes (HTTP).
    let data: Bytes = {
        let mut v = vec![0u8; GIB];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for c in v.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
        }
        Bytes::from(v)
    };
    mem.write_at(0, &data).expect("fill");

    println!(
        "storage-target RDMA (tcp fabric) vs HTTP (aws-sdk-s3), one process each side, loopback"
    );
    println!(
        "{:>8} {:>4} {:>12} {:>12} {:>8}",
        "size", "op", "rdma GB/s", "http GB/s", "ratio"
    );
    let mut json = Vec::new();
    for (name, size, reps) in [("64MiB", 64usize << 20, 5usize), ("1GiB", GIB, 2)] {
        let reps = if quick { 1 } else { reps };
        let url = format!("{target_url}/bench/rdma-{name}");
        let put_w = mem
            .window(0, size, Access::REMOTE_READ, None)
            .expect("window");
        let put_tok = endpoint.token(&put_w).expect("token").to_string();
        let get_w = mem
            .window(0, size, Access::REMOTE_WRITE, None)
            .expect("window");
        let get_tok = endpoint.token(&get_w).expect("token").to_string();
        // Warm-up (session connect, page cache).
        rdma_req(&http, "PUT", &url, &put_tok).await;
        rdma_req(&http, "GET", &url, &get_tok).await;
        let rdma_put = time(reps, || rdma_req(&http, "PUT", &url, &put_tok)).await;
        let rdma_get = time(reps, || rdma_req(&http, "GET", &url, &get_tok)).await;

        let key = format!("http-{name}");
        let body = data.slice(..size);
        let put_once = || {
            let sdk = sdk.clone();
            let body = body.clone();
            let key = key.clone();
            async move {
                sdk.put_object()
                    .bucket("bench")
                    .key(key)
                    .body(ByteStream::from(body))
                    .send()
                    .await
                    .expect("sdk put");
            }
        };
        let get_once = || {
            let sdk = sdk.clone();
            let key = key.clone();
            async move {
                let o = sdk
                    .get_object()
                    .bucket("bench")
                    .key(key)
                    .send()
                    .await
                    .expect("sdk get");
                let got = o.body.collect().await.expect("drain").into_bytes();
                assert_eq!(got.len(), size);
            }
        };
        put_once().await;
        get_once().await;
        let http_put = time(reps, put_once).await;
        let http_get = time(reps, get_once).await;

        for (op, r, h) in [("GET", rdma_get, http_get), ("PUT", rdma_put, http_put)] {
            let (rg, hg) = (gbps(size, r), gbps(size, h));
            println!("{name:>8} {op:>4} {rg:>12.3} {hg:>12.3} {:>7.2}x", rg / hg);
            json.push(serde_json::json!({
                "size": name, "bytes": size, "op": op, "reps": reps,
                "rdma_gbps": (rg * 1000.0).round() / 1000.0,
                "http_gbps": (hg * 1000.0).round() / 1000.0,
                "ratio": ((rg / hg) * 100.0).round() / 100.0,
            }));
        }
        drop((put_w, get_w));
    }
    println!(
        "{}",
        serde_json::json!({"bench": "storage-target rdma_vs_http", "results": json})
    );
}
