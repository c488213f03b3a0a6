//! GetObject, PutObject and UploadPart over RDMA against the real binary:
//! a tenant holds memory on the tcp fabric, mints a window per request and
//! signs requests (SigV4, token among the signed headers) with aws-sigv4.

use crate::common;
use std::time::Duration;

use crate::common::{Raw, Server, create_bucket, data, md5_hex, raw};
use crate::support::{
    assert_code, assert_s3_error, assert_status, complete, completed, list_parts, metrics_text,
    raw_get, start_upload, stored,
};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::ChecksumMode;
use base64::Engine as _;
use bytes::Bytes;
use fabric::{Access, Backend, Domain, Endpoint, FabricKey, Region, Window};
use s3s::crypto::Checksum as _;
use sha2::Digest as _;

use crate::support::{FABRIC_KEY_HEX as KEY_HEX, fabric_server, served_memory};

fn key() -> FabricKey {
    fabric::config::parse_fabric_key(KEY_HEX).unwrap()
}

/// The fabric of the server and the test tenants: `$S3DMA_TEST_FABRIC`
/// (`tcp` when unset; `.ci/rdma-vm.sh` runs this suite again with `verbs`).
fn backend() -> Backend {
    std::env::var("S3DMA_TEST_FABRIC").map_or(Backend::Tcp, |v| v.parse().unwrap())
}

/// A server with RDMA enabled on the test fabric ([`backend`]); `extra`
/// adds `rdma:` fields (a `backend:` there wins).
pub(crate) fn rdma_server(extra: &str) -> Server {
    let extra = if extra.contains("backend:") {
        extra.to_owned()
    } else {
        format!("{extra}  backend: {}\n", backend())
    };
    // Soft-RoCE under the VM's emulated CPUs, beside another suite, took
    // more than a second for one of four concurrent connects (a PUT failed
    // with RDMATransferFailed): the tests' timeout is a bound on a hang,
    // not a speed claim.
    let connect_timeout_ms = if backend() == Backend::Verbs {
        5000
    } else {
        1000
    };
    fabric_server(move |key_file| {
        format!(
            "rdma:\n  mode: enabled\n  fabric_key_file: {key_file}\n  connect_timeout_ms: {connect_timeout_ms}\n{extra}"
        )
    })
}

/// The tenant side: registered memory served by a fabric endpoint.
pub(crate) struct Tenant {
    endpoint: Endpoint,
    mem: Region,
}

impl Tenant {
    pub(crate) async fn new(len: usize) -> Tenant {
        Tenant::with_key(len, key()).await
    }

    async fn with_key(len: usize, key: FabricKey) -> Tenant {
        let domain = Domain::open(backend()).unwrap();
        let (endpoint, mem) = served_memory(&domain, len, key).await;
        Tenant { endpoint, mem }
    }

    pub(crate) fn window(&self, off: usize, len: usize, access: Access) -> Window {
        self.mem.window(off, len, access, None).unwrap()
    }

    pub(crate) fn token(&self, w: &Window) -> String {
        self.endpoint.token(w).unwrap().to_string()
    }

    /// Fills `[off, off+len)` with deterministic data; returns its SHA-256 and MD5.
    pub(crate) fn fill(&self, off: usize, len: usize, seed: u64) -> (String, String) {
        let d = data(len, seed);
        self.mem.write_at(off, &d).unwrap();
        (hex::encode(sha2::Sha256::digest(&d)), md5_hex(&d))
    }

    fn clear(&self, byte: u8) {
        let chunk = vec![byte; 1 << 20];
        let mut off = 0;
        while off < self.mem.len() {
            let n = chunk.len().min(self.mem.len() - off);
            self.mem.write_at(off, &chunk[..n]).unwrap();
            off += n;
        }
    }

    pub(crate) fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read_at(off, &mut v).unwrap();
        v
    }

    fn sha256(&self, off: usize, len: usize) -> String {
        let mut h = sha2::Sha256::new();
        let mut buf = vec![0; 1 << 20];
        let mut pos = 0;
        while pos < len {
            let n = buf.len().min(len - pos);
            self.mem.read_at(off + pos, &mut buf[..n]).unwrap();
            h.update(&buf[..n]);
            pos += n;
        }
        hex::encode(h.finalize())
    }
}

/// s3dma's exchange: signed with SigV4 (UNSIGNED-PAYLOAD) over `extra`,
/// where a signed `x-amz-rdma-token` goes with the signed dialect marker
/// `x-amz-rdma-protocol: s3dma-v1`, as the dpu-agent sends it.
async fn send_to(endpoint: &str, method: &str, path: &str, extra: &[(&str, &str)]) -> Raw {
    let mut extra = extra.to_vec();
    if extra.iter().any(|(k, _)| *k == "x-amz-rdma-token")
        && !extra.iter().any(|(k, _)| *k == "x-amz-rdma-protocol")
    {
        extra.push(("x-amz-rdma-protocol", "s3dma-v1"));
    }
    send_exact(&format!("{endpoint}{path}"), method, &extra, &[]).await
}

/// A request signed as the admin over `signed`, with the unsigned `after`
/// headers, exactly as given.
async fn send_exact(
    url: &str,
    method: &str,
    signed: &[(&str, &str)],
    after: &[(&str, &str)],
) -> Raw {
    common::send_signed(common::ADMIN, method, url, signed, after).await
}

/// [`send_to`] `s` with `token` and the `extra` headers signed.
async fn rdma(s: &Server, method: &str, path: &str, token: &str, extra: &[(&str, &str)]) -> Raw {
    let mut h = vec![("x-amz-rdma-token", token)];
    h.extend_from_slice(extra);
    send_to(&s.endpoint, method, path, &h).await
}

async fn rdma_get(s: &Server, path: &str, token: &str, extra: &[(&str, &str)]) -> Raw {
    rdma(s, "GET", path, token, extra).await
}

async fn rdma_put(s: &Server, path: &str, token: &str, extra: &[(&str, &str)]) -> Raw {
    rdma(s, "PUT", path, token, extra).await
}

fn etag(r: &Raw) -> String {
    r.header("etag")
        .unwrap_or_default()
        .trim_matches('"')
        .to_owned()
}

/// The object at `b/k` read through the SDK as the admin.
async fn sdk_get(s: &Server, b: &str, k: &str) -> Vec<u8> {
    common::sdk_get(s, b, k).await.expect("object stored")
}

/// Asserts `r` is a transfer answered `status` with the RDMA reply `reply`.
#[track_caller]
fn assert_reply(r: &Raw, status: u16, reply: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(r.header("x-amz-rdma-reply"), Some(reply), "{}", r.text());
}

/// Asserts `r` reports `len` bytes moved over the fabric.
#[track_caller]
fn assert_moved(r: &Raw, len: usize) {
    let moved = r.header("x-amz-rdma-bytes-transferred");
    assert_eq!(moved, Some(len.to_string().as_str()), "{}", r.text());
}

/// [`send_to`] `endpoint` with `token` signed, and nothing else.
async fn with_token(endpoint: &str, method: &str, path: &str, token: &str) -> Raw {
    send_to(endpoint, method, path, &[("x-amz-rdma-token", token)]).await
}

/// [`send_exact`] to `s` with `token` signed, and nothing else (no marker).
async fn bare_token(s: &Server, method: &str, path: &str, token: &str) -> Raw {
    let token = [("x-amz-rdma-token", token)];
    send_exact(&s.url(path), method, &token, &[]).await
}

#[tokio::test]
async fn put_and_get_sizes_with_mixed_clients() {
    let s = rdma_server("");
    create_bucket(&s, "rdsz").await;
    // 256 MiB, 64 MiB under the Soft-RoCE VM's emulated CPUs.
    let big = s3dma_testkit::large_object_len() / 4;
    let t = Tenant::new(big).await;
    for (i, &len) in [0usize, 1, 4096, (5 << 20) + 1, big].iter().enumerate() {
        let key = format!("obj-{len}");
        let path = format!("/rdsz/{key}");
        t.clear(0);
        let (sha, md5) = t.fill(0, len, i as u64 + 1);
        // PUT over RDMA: the object length is the token's size.
        let w = t.window(0, len, Access::REMOTE_READ);
        let r = rdma_put(&s, &path, &t.token(&w), &[]).await;
        assert_eq!(r.status, 200, "PUT {len}: {}", r.text());
        assert_eq!(r.header("x-amz-rdma-reply"), Some("200"));
        assert_eq!(etag(&r), md5, "PUT {len}");
        assert!(r.body.is_empty());
        drop(w);

        // GET over RDMA into a clean window.
        t.clear(0xee);
        let w = t.window(0, len.max(1), Access::REMOTE_WRITE);
        let r = rdma_get(&s, &path, &t.token(&w), &[]).await;
        assert_eq!(r.status, 200, "GET {len}: {}", r.text());
        assert_eq!(r.header("x-amz-rdma-reply"), Some("200"));
        assert_moved(&r, len);
        assert_eq!(r.header("content-length"), Some("0"));
        assert!(r.body.is_empty());
        assert_eq!(etag(&r), md5);
        assert!(r.header("last-modified").is_some());
        assert_eq!(t.sha256(0, len), sha, "GET {len} bytes differ");
        drop(w);

        // The same object over HTTP (aws-sdk-s3).
        if len <= 8 << 20 {
            let got = sdk_get(&s, "rdsz", &key).await;
            assert_eq!(hex::encode(sha2::Sha256::digest(&got)), sha);
        }
    }

    // An object PUT over HTTP, read over RDMA; metadata comes along.
    let d = data(100_000, 77);
    s.admin()
        .put_object()
        .bucket("rdsz")
        .key("http-put")
        .metadata("color", "blue")
        .body(ByteStream::from(d.clone()))
        .send()
        .await
        .unwrap();
    t.clear(0);
    let w = t.window(4096, 200_000, Access::REMOTE_WRITE);
    let r = rdma_get(&s, "/rdsz/http-put", &t.token(&w), &[]).await;
    assert_status(&r, 200);
    assert_eq!(r.header("x-amz-meta-color"), Some("blue"));
    assert_eq!(r.header("x-amz-rdma-bytes-transferred"), Some("100000"));
    assert_eq!(t.bytes(4096, d.len()), d);
    // A smaller object leaves the rest of the window alone.
    assert!(t.bytes(4096 + d.len(), 1000).iter().all(|&b| b == 0));
}

#[tokio::test]
async fn ranged_and_conditional_gets() {
    let s = rdma_server("");
    create_bucket(&s, "rng").await;
    let d = data((3 << 20) + 17, 5);
    let et = crate::support::put(&s.admin(), "rng", "k", &d).await;
    let t = Tenant::new(4 << 20).await;
    let total = d.len();
    let cases: Vec<(String, usize, usize)> = vec![
        ("bytes=0-0".into(), 0, 1),
        ("bytes=100-4195".into(), 100, 4096),
        (format!("bytes={}-", total - 1000), total - 1000, 1000),
        ("bytes=-10".into(), total - 10, 10),
        ("bytes=1048570-3145740".into(), 1_048_570, 2_097_171),
    ];
    for (range, start, len) in cases {
        t.clear(0);
        let w = t.window(0, len, Access::REMOTE_WRITE);
        let r = rdma_get(&s, "/rng/k", &t.token(&w), &[("range", &range)]).await;
        assert_eq!(r.status, 206, "{range}: {}", r.text());
        assert_eq!(r.header("x-amz-rdma-reply"), Some("206"));
        assert_moved(&r, len);
        assert_eq!(
            r.header("content-range"),
            Some(format!("bytes {start}-{}/{total}", start + len - 1).as_str())
        );
        assert_eq!(t.bytes(0, len), &d[start..start + len], "{range}");
    }

    // Conditionals as over HTTP; nothing is written when they fail.
    t.clear(0);
    let w = t.window(0, total, Access::REMOTE_WRITE);
    let tok = t.token(&w);
    let r = rdma_get(&s, "/rng/k", &tok, &[("if-match", "\"0000\"")]).await;
    assert_eq!(r.status, 412, "{}", r.text());
    assert!(r.header("x-amz-rdma-reply").is_none());
    let r = rdma_get(&s, "/rng/k", &tok, &[("if-none-match", &et)]).await;
    assert_eq!(r.status, 304);
    assert!(t.bytes(0, 4096).iter().all(|&b| b == 0));
    let r = rdma_get(&s, "/rng/k", &tok, &[("if-match", &et)]).await;
    assert_status(&r, 200);
    assert_eq!(t.bytes(0, total), d);
    let r = rdma_get(&s, "/rng/k", &tok, &[("range", "bytes=99999999-")]).await;
    assert_eq!(r.status, 416);
}

#[tokio::test]
async fn multipart_with_rdma_and_http_parts_and_checksums() {
    let s = rdma_server("");
    create_bucket(&s, "mpu").await;
    let c = s.admin();
    let id = start_upload(&c, "mpu", "big").await;
    let p1 = data(5 << 20, 11);
    let p2 = data(5 << 20, 12);
    let p3 = data(1_000_003, 13);
    let t = Tenant::new(16 << 20).await;
    t.mem.write_at(0, &p1).unwrap();
    t.mem.write_at(5 << 20, &p3).unwrap();
    // Part 1 over RDMA, with a CRC-free SHA-256 checksum checked over the RDMA bytes.
    let w1 = t.window(0, p1.len(), Access::REMOTE_READ);
    let sum = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(&p1));
    let r = rdma_put(
        &s,
        &format!("/mpu/big?partNumber=1&uploadId={id}"),
        &t.token(&w1),
        &[("x-amz-checksum-sha256", &sum)],
    )
    .await;
    assert_reply(&r, 200, "200");
    assert_eq!(etag(&r), md5_hex(&p1));
    let e1 = etag(&r);
    // Part 2 over HTTP.
    let r2 = c.upload_part().bucket("mpu").key("big").upload_id(&id);
    let r2 = r2.part_number(2).body(ByteStream::from(p2.clone())).send();
    let r2 = r2.await.unwrap();
    // Part 3 over RDMA with a wrong checksum: refused, then right.
    let w3 = t.window(5 << 20, p3.len(), Access::REMOTE_READ);
    let path3 = format!("/mpu/big?partNumber=3&uploadId={id}");
    let r = rdma_put(
        &s,
        &path3,
        &t.token(&w3),
        &[("x-amz-checksum-sha256", &sum)],
    )
    .await;
    assert_s3_error(&r, 400, "BadDigest");
    let md5 = base64::engine::general_purpose::STANDARD.encode(s3s::crypto::Md5::checksum(&p3));
    let r = rdma_put(&s, &path3, &t.token(&w3), &[("content-md5", &md5)]).await;
    assert_status(&r, 200);
    let e3 = etag(&r);
    let parts = [(1, e1), (2, r2.e_tag().unwrap().to_owned()), (3, e3)];
    complete(&c, "mpu", "big", &id, completed(&parts))
        .await
        .unwrap();
    let got = sdk_get(&s, "mpu", "big").await;
    let want: Vec<u8> = [p1, p2, p3].concat();
    assert_eq!(got.len(), want.len());
    assert!(got == want, "multipart content differs");
    // And back over RDMA in one GET.
    t.clear(0);
    let w = t.window(0, want.len(), Access::REMOTE_WRITE);
    let r = rdma_get(&s, "/mpu/big", &t.token(&w), &[]).await;
    assert_status(&r, 200);
    assert!(t.bytes(0, want.len()) == want);

    // A whole-object PUT with a wrong checksum stores nothing.
    let r = rdma_put(
        &s,
        "/mpu/bad-sum",
        &t.token(&w1),
        &[(
            "x-amz-checksum-sha256",
            &base64::engine::general_purpose::STANDARD.encode([0u8; 32]),
        )],
    )
    .await;
    assert_code(&r, "BadDigest");
    assert!(!stored(&s, "mpu", "bad-sum").await);

    let text = reqwest_metrics(&s).await;
    assert!(
        text.contains(
            "s3dma_storage_target_path_requests_total{op=\"UploadPart\",path=\"rdma\"} 2"
        ),
        "{text}"
    );
    assert!(
        text.contains("s3dma_storage_target_rdma_sessions 1"),
        "{text}"
    );
    assert!(text.contains("s3dma_storage_target_rdma_op_seconds_count{op=\"read\"}"));
}

/// Base64 of the CRC64NVME of `d` (computed here with crc-fast).
fn crc64nvme(d: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD
        .encode(crc_fast::checksum(crc_fast::CrcAlgorithm::Crc64Nvme, d).to_be_bytes())
}

#[tokio::test]
async fn checksums_over_rdma() {
    // Small staging buffers: the checksum spans many RDMA READs.
    let s = rdma_server("  staging_buffers: 8\n  staging_buffer_size: 64KiB\n");
    create_bucket(&s, "rck").await;
    let c = s.admin();
    let len = 1_000_003;
    let t = Tenant::new(2 * len).await;
    let (_, md5) = t.fill(0, len, 51);
    let d = t.bytes(0, len);
    let good = crc64nvme(&d);
    let w = t.window(0, len, Access::REMOTE_READ);
    let tok = t.token(&w);
    // PUT with the right CRC64NVME: verified over the bytes READ from the
    // tenant's memory, stored, returned.
    let r = rdma_put(&s, "/rck/k", &tok, &[("x-amz-checksum-crc64nvme", &good)]).await;
    assert_reply(&r, 200, "200");
    assert_eq!(r.header("x-amz-checksum-crc64nvme"), Some(good.as_str()));
    assert_eq!(r.header("x-amz-checksum-type"), Some("FULL_OBJECT"));
    assert_eq!(etag(&r), md5);
    let head = c.head_object().bucket("rck").key("k");
    let head = head.checksum_mode(ChecksumMode::Enabled).send();
    let head = head.await.unwrap();
    assert_eq!(head.checksum_crc64_nvme(), Some(good.as_str()));
    // An RDMA GET with checksum mode returns it too.
    let wg = t.window(len, len, Access::REMOTE_WRITE);
    let r = rdma_get(
        &s,
        "/rck/k",
        &t.token(&wg),
        &[("x-amz-checksum-mode", "ENABLED")],
    )
    .await;
    assert_status(&r, 200);
    assert_eq!(r.header("x-amz-checksum-crc64nvme"), Some(good.as_str()));
    assert!(t.bytes(len, len) == d);
    drop(wg);

    // The tenant's memory changes after the client computed its checksum
    // (the case the checksum guards): BadDigest, nothing stored, the
    // previous version intact.
    t.mem.write_at(len / 2, &[d[len / 2] ^ 0xff]).unwrap();
    let r = rdma_put(&s, "/rck/k", &tok, &[("x-amz-checksum-crc64nvme", &good)]).await;
    assert_s3_error(&r, 400, "BadDigest");
    assert!(r.header("etag").is_none());
    assert!(sdk_get(&s, "rck", "k").await == d);
    let r = rdma_put(&s, "/rck/new", &tok, &[("x-amz-checksum-crc64nvme", &good)]).await;
    assert_code(&r, "BadDigest");
    assert!(!stored(&s, "rck", "new").await);
    // A malformed value is refused before anything is read.
    let r = rdma_put(
        &s,
        "/rck/new",
        &tok,
        &[("x-amz-checksum-crc64nvme", "AAAA")],
    )
    .await;
    assert_s3_error(&r, 400, "InvalidRequest");
    assert!(!stored(&s, "rck", "new").await);
    t.mem.write_at(len / 2, &[d[len / 2]]).unwrap();

    // UploadPart over RDMA in a CRC64NVME (FULL_OBJECT) upload.
    let up = c
        .create_multipart_upload()
        .bucket("rck")
        .key("mp")
        .checksum_algorithm(aws_sdk_s3::types::ChecksumAlgorithm::Crc64Nvme)
        .send()
        .await
        .unwrap();
    let id = up.upload_id().unwrap().to_owned();
    let path = format!("/rck/mp?partNumber=1&uploadId={id}");
    // Without the checksum the upload was created with: refused.
    let r = rdma_put(&s, &path, &tok, &[]).await;
    assert_s3_error(&r, 400, "InvalidRequest");
    // A wrong one: BadDigest and no part.
    let r = rdma_put(
        &s,
        &path,
        &tok,
        &[("x-amz-checksum-crc64nvme", &crc64nvme(b"x"))],
    )
    .await;
    assert_code(&r, "BadDigest");
    let parts = list_parts(&c, "rck", "mp", &id).await;
    assert!(parts.parts().is_empty());
    // The right one: stored and listed.
    let r = rdma_put(&s, &path, &tok, &[("x-amz-checksum-crc64nvme", &good)]).await;
    assert_status(&r, 200);
    assert_eq!(r.header("x-amz-checksum-crc64nvme"), Some(good.as_str()));
    let e1 = etag(&r);
    let parts = list_parts(&c, "rck", "mp", &id).await;
    assert_eq!(parts.parts()[0].checksum_crc64_nvme(), Some(good.as_str()));
    let out = complete(&c, "rck", "mp", &id, completed(&[(1, e1)])).await;
    let out = out.unwrap();
    // One part: the object's full CRC64NVME is the part's.
    assert_eq!(out.checksum_crc64_nvme(), Some(good.as_str()));
    let got = c.get_object().bucket("rck").key("mp");
    let got = got.checksum_mode(ChecksumMode::Enabled).send();
    let got = got.await.unwrap();
    assert_eq!(got.checksum_crc64_nvme(), Some(good.as_str()));
    assert!(got.body.collect().await.unwrap().into_bytes() == d);
}

async fn reqwest_metrics(s: &Server) -> String {
    metrics_text(s).await
}

#[tokio::test]
async fn refusals_and_failures() {
    // Small staging buffers: many operations per request.
    let s = rdma_server("  staging_buffers: 4\n  staging_buffer_size: 64KiB\n");
    create_bucket(&s, "neg").await;
    let d = data(1 << 20, 9);
    common::sdk_put(&s, "neg", "k", d.clone()).await;
    let t = Tenant::new(32 << 20).await;
    t.clear(0);
    let w = t.window(0, 2 << 20, Access::REMOTE_WRITE | Access::REMOTE_READ);
    let tok = t.token(&w);

    // Unsigned token header: AccessDenied, nothing moved or stored.
    let r = send_exact(&s.url("/neg/k"), "GET", &[], &[("x-amz-rdma-token", &tok)]).await;
    assert_s3_error(&r, 403, "AccessDenied");
    assert!(r.text().contains("signed"), "{}", r.text());
    assert!(t.bytes(0, 4096).iter().all(|&b| b == 0));
    let unsigned = [("x-amz-rdma-token", tok.as_str())];
    let r = send_exact(&s.url("/neg/unsigned"), "PUT", &[], &unsigned).await;
    assert_eq!(r.status, 403);
    assert!(!stored(&s, "neg", "unsigned").await);

    // Malformed token.
    let r = rdma_get(&s, "/neg/k", "not-a-token", &[]).await;
    assert_s3_error(&r, 400, "InvalidRDMAToken");
    assert!(r.header("x-amz-rdma-reply").is_none());
    let r = rdma_put(&s, "/neg/bad", &tok.to_uppercase(), &[]).await;
    assert_code(&r, "InvalidRDMAToken");
    assert!(!stored(&s, "neg", "bad").await);

    // A PUT with a body besides the token is refused.
    let r = rdma_put(&s, "/neg/body", &tok, &[("content-length", "5")]).await;
    assert!(r.status >= 400, "{}", r.text());
    assert!(!stored(&s, "neg", "body").await);

    // Window too small: clear error, nothing written anywhere.
    let small = t.window(0, 1000, Access::REMOTE_WRITE);
    let r = rdma_get(&s, "/neg/k", &t.token(&small), &[]).await;
    assert_s3_error(&r, 400, "InvalidRequest");
    assert!(r.text().contains("grants only 1000 bytes"), "{}", r.text());
    assert!(t.bytes(0, 1 << 20).iter().all(|&b| b == 0));

    // Wrong rkey: GET fails, PUT stores nothing.
    let mut bad: fabric::RdmaToken = tok.parse().unwrap();
    bad.rkey ^= 0x5a5a_5a5a;
    let r = rdma_get(&s, "/neg/k", &bad.to_string(), &[]).await;
    assert_s3_error(&r, 400, "RDMATransferFailed");
    assert!(r.text().contains("remote access"), "{}", r.text());
    let r = rdma_put(&s, "/neg/wrong-rkey", &bad.to_string(), &[]).await;
    assert_code(&r, "RDMATransferFailed");
    assert!(!stored(&s, "neg", "wrong-rkey").await);
    // Write-only window used for a PUT (needs remote read): refused by the tenant.
    let wo = t.window(0, 1000, Access::REMOTE_WRITE);
    let r = rdma_put(&s, "/neg/write-only", &t.token(&wo), &[]).await;
    assert_code(&r, "RDMATransferFailed");
    assert!(!stored(&s, "neg", "write-only").await);

    // A token naming an endpoint nobody listens on fails quickly and cleanly...
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut gone: fabric::RdmaToken = tok.parse().unwrap();
    gone.lid = dead;
    let started = std::time::Instant::now();
    let r = rdma_get(&s, "/neg/k", &gone.to_string(), &[]).await;
    assert_s3_error(&r, 500, "RDMATransferFailed");
    assert!(r.text().contains("connect"), "{}", r.text());
    assert!(started.elapsed() < Duration::from_secs(30));
    let r = rdma_put(&s, "/neg/dead", &gone.to_string(), &[]).await;
    assert_eq!(r.xml("Code").as_deref(), Some("RDMATransferFailed"));
    assert!(!stored(&s, "neg", "dead").await);
    // ...as does an endpoint with another fabric key...
    let stranger = Tenant::with_key(1 << 20, FabricKey::random()).await;
    let sw = stranger.window(0, 1 << 20, Access::REMOTE_WRITE);
    let r = rdma_get(&s, "/neg/k", &stranger.token(&sw), &[]).await;
    assert_code(&r, "RDMATransferFailed");
    // ...and later requests to a good endpoint are not poisoned.
    let r = rdma_get(&s, "/neg/k", &tok, &[]).await;
    assert_status(&r, 200);
    assert_eq!(t.bytes(0, d.len()), d);

    // A dead tenant endpoint: its pooled session is replaced by a fresh one.
    let t2 = Tenant::new(2 << 20).await;
    let w2 = t2.window(0, 2 << 20, Access::REMOTE_WRITE);
    let r = rdma_get(&s, "/neg/k", &t2.token(&w2), &[]).await;
    assert_eq!(r.status, 200);
    let tok2 = t2.token(&w2);
    drop(w2);
    let Tenant { endpoint, .. } = t2;
    endpoint.shutdown().await;
    let r = rdma_get(&s, "/neg/k", &tok2, &[]).await;
    assert_code(&r, "RDMATransferFailed");

    // Window revoked mid-request: the GET fails, no byte lands afterwards.
    let big = data(24 << 20, 21);
    common::sdk_put(&s, "neg", "big", big.clone()).await;
    // (Retried in the unlikely case the whole GET finished before the revoke.)
    let mut r = None;
    for _ in 0..5 {
        t.clear(0);
        let w = t.window(0, big.len(), Access::REMOTE_WRITE);
        let tok = t.token(&w);
        let req = tokio::spawn({
            let endpoint = s.endpoint.clone();
            async move { with_token(&endpoint, "GET", "/neg/big", &tok).await }
        });
        // Revoke once the first chunk has landed.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while t.bytes(0, 16) != big[..16] {
            assert!(std::time::Instant::now() < deadline, "no byte arrived");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        w.revoke();
        let got = req.await.unwrap();
        if got.status != 200 {
            r = Some(got);
            break;
        }
    }
    let r = r.expect("the GET always finished before the window was revoked");
    assert_s3_error(&r, 400, "RDMATransferFailed");
    let tail = t.sha256(0, big.len());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        t.sha256(0, big.len()),
        tail,
        "bytes landed after revocation"
    );
    assert!(t.bytes(big.len() - 65536, 65536) != big[big.len() - 65536..]);
}

#[tokio::test]
async fn disabled_rdma_answers_501() {
    // The standard config has no rdma section: RDMA is disabled.
    let s = Server::start();
    create_bucket(&s, "dis").await;
    let d = data(70_000, 3);
    common::sdk_put(&s, "dis", "k", d.clone()).await;
    let t = Tenant::new(1 << 20).await;
    t.fill(0, 1 << 20, 8);
    let w = t.window(0, 1 << 20, Access::REMOTE_READ | Access::REMOTE_WRITE);
    let tok = t.token(&w);
    // GET: the object comes in the HTTP body.
    let r = rdma_get(&s, "/dis/k", &tok, &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-amz-rdma-reply"), Some("501"));
    assert!(r.header("x-amz-rdma-bytes-transferred").is_none());
    assert_eq!(r.body.as_ref(), d.as_slice());
    let r = rdma_get(&s, "/dis/k", &tok, &[("range", "bytes=10-19")]).await;
    assert_eq!(r.status, 206);
    assert_eq!(r.header("x-amz-rdma-reply"), Some("501"));
    assert_eq!(r.body.as_ref(), &d[10..20]);
    // PUT: declined, nothing stored (never a zero-byte object).
    let r = rdma_put(&s, "/dis/new", &tok, &[]).await;
    assert_reply(&r, 200, "501");
    assert_eq!(r.xml("Code").as_deref(), Some("RDMANotSupported"));
    assert!(r.header("etag").is_none());
    assert!(!stored(&s, "dis", "new").await);
    // Replacing an existing object: it stays as it was.
    let r = rdma_put(&s, "/dis/k", &tok, &[]).await;
    assert_eq!(r.header("x-amz-rdma-reply"), Some("501"));
    assert_eq!(sdk_get(&s, "dis", "k").await, d);
    // UploadPart: declined, no part recorded.
    let id = start_upload(&s.admin(), "dis", "mpu").await;
    let r = rdma_put(
        &s,
        &format!("/dis/mpu?partNumber=1&uploadId={id}"),
        &tok,
        &[],
    )
    .await;
    assert_eq!(r.header("x-amz-rdma-reply"), Some("501"));
    assert_eq!(r.xml("Code").as_deref(), Some("RDMANotSupported"));
    let parts = list_parts(&s.admin(), "dis", "mpu", &id).await;
    assert!(parts.parts().is_empty());
    // The token must still be signed.
    let r = send_exact(&s.url("/dis/k"), "GET", &[], &[("x-amz-rdma-token", &tok)]).await;
    assert_eq!(r.status, 403);
}

#[tokio::test]
async fn verbs_without_a_device_declines() {
    let s = rdma_server("  backend: verbs\n");
    create_bucket(&s, "vrb").await;
    let t = Tenant::new(4096).await;
    let w = t.window(0, 4096, Access::REMOTE_READ);
    let r = rdma_put(&s, "/vrb/x", &t.token(&w), &[]).await;
    // On a machine with an RDMA device this is served; without one it is declined.
    if r.header("x-amz-rdma-reply") == Some("501") {
        assert_eq!(r.xml("Code").as_deref(), Some("RDMANotSupported"));
        assert!(!stored(&s, "vrb", "x").await);
        assert!(s.log().contains("unavailable"), "{}", s.log());
    }
}

#[tokio::test]
async fn concurrent_rdma_and_http_clients_on_the_same_object() {
    let s = rdma_server("  staging_buffers: 8\n  staging_buffer_size: 256KiB\n");
    create_bucket(&s, "mix").await;
    const LEN: usize = 3 << 20;
    let versions: Vec<Vec<u8>> = (0..3).map(|i| data(LEN, 100 + i)).collect();
    let md5s: Vec<String> = versions.iter().map(|v| md5_hex(v)).collect();
    common::sdk_put(&s, "mix", "k", versions[0].clone()).await;
    let readers = 4;
    let t = Tenant::new(LEN * readers + LEN).await;
    // The last slot holds version 2 as the source of RDMA PUTs.
    t.mem.write_at(LEN * readers, &versions[2]).unwrap();
    let src = t.window(LEN * readers, LEN, Access::REMOTE_READ);
    let src_tok = t.token(&src);
    let mut tasks = Vec::new();
    for i in 0..readers {
        let w = t.window(LEN * i, LEN, Access::REMOTE_WRITE);
        let tok = t.token(&w);
        let ep = s.endpoint.clone();
        tasks.push(tokio::spawn(async move {
            let mut etags = Vec::new();
            for _ in 0..3 {
                let r = with_token(&ep, "GET", "/mix/k", &tok).await;
                assert_status(&r, 200);
                etags.push(etag(&r));
            }
            drop(w);
            etags
        }));
    }
    let writer = {
        let c = s.admin();
        let v1 = versions[1].clone();
        let ep = s.endpoint.clone();
        tokio::spawn(async move {
            for _ in 0..2 {
                crate::support::put(&c, "mix", "k", &v1).await;
                let r = with_token(&ep, "PUT", "/mix/k", &src_tok).await;
                assert_status(&r, 200);
            }
        })
    };
    for (i, task) in tasks.into_iter().enumerate() {
        let etags = task.await.unwrap();
        // Every GET delivered one whole version (the one it opened); the last
        // one is still in the reader's slot.
        for e in &etags {
            assert!(md5s.contains(e), "unknown ETag {e}");
        }
        let last = md5s
            .iter()
            .position(|m| m == etags.last().unwrap())
            .unwrap();
        assert!(
            t.bytes(LEN * i, LEN) == versions[last],
            "reader {i} got mixed bytes"
        );
    }
    writer.await.unwrap();
    assert_eq!(sdk_get(&s, "mix", "k").await, versions[2]);

    // Concurrent RDMA PUTs from one window (more buffers wanted than the pool has).
    let puts: Vec<_> = (0..4)
        .map(|i| {
            let ep = s.endpoint.clone();
            let tok = t.token(&src);
            tokio::spawn(async move { with_token(&ep, "PUT", &format!("/mix/p{i}"), &tok).await })
        })
        .collect();
    for p in puts {
        let r = p.await.unwrap();
        assert_status(&r, 200);
        assert_eq!(etag(&r), md5s[2]);
    }
}

#[tokio::test]
async fn idle_sessions_are_closed() {
    let s = rdma_server("  idle_session_secs: 1\n");
    create_bucket(&s, "idle").await;
    let t = Tenant::new(4096).await;
    t.fill(0, 4096, 1);
    let w = t.window(0, 4096, Access::REMOTE_READ);
    let r = rdma_put(&s, "/idle/k", &t.token(&w), &[]).await;
    assert_status(&r, 200);
    let m = metrics_text(&s).await;
    assert!(m.contains("s3dma_storage_target_rdma_sessions 1"), "{m}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let m = metrics_text(&s).await;
        if m.contains("s3dma_storage_target_rdma_sessions 0") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "session never reaped: {m}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A later request reconnects.
    let r = rdma_put(&s, "/idle/k2", &t.token(&w), &[]).await;
    assert_status(&r, 200);
    assert!(s.log().contains("closing idle"), "{}", s.log());
}

#[tokio::test]
async fn tiny_pool_serves_many_concurrent_puts_and_gets() {
    // Two staging buffers for four concurrent PUTs, then four GETs: nothing deadlocks.
    let s = rdma_server(
        "  staging_buffers: 2\n  staging_buffer_size: 64KiB\n  max_ops_per_session: 2\n  max_ops_total: 3\n",
    );
    create_bucket(&s, "tiny").await;
    const LEN: usize = (1 << 20) + 5;
    let t = Tenant::new(LEN * 8).await;
    let (_, md5) = t.fill(0, LEN, 42);
    let src = t.window(0, LEN, Access::REMOTE_READ);
    let mut tasks = Vec::new();
    for i in 0..4 {
        let (ep, tok) = (s.endpoint.clone(), t.token(&src));
        tasks.push(tokio::spawn(async move {
            with_token(&ep, "PUT", &format!("/tiny/k{i}"), &tok).await
        }));
    }
    for task in tasks {
        let r = task.await.unwrap();
        assert_status(&r, 200);
        assert_eq!(etag(&r), md5);
    }
    let mut windows = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..4 {
        let w = t.window(LEN * (i + 1), LEN, Access::REMOTE_WRITE);
        let (ep, tok) = (s.endpoint.clone(), t.token(&w));
        windows.push(w);
        tasks.push(tokio::spawn(async move {
            with_token(&ep, "GET", &format!("/tiny/k{i}"), &tok).await
        }));
    }
    let want = t.bytes(0, LEN);
    for (i, task) in tasks.into_iter().enumerate() {
        let r = task.await.unwrap();
        assert_status(&r, 200);
        assert!(t.bytes(LEN * (i + 1), LEN) == want, "GET {i} differs");
    }
    let m = metrics_text(&s).await;
    assert!(
        m.contains("s3dma_storage_target_rdma_staging_buffers 2"),
        "{m}"
    );
    assert!(
        m.contains("s3dma_storage_target_rdma_staging_buffers_in_use 0"),
        "{m}"
    );
}

/// A TCP listener the test owns: counts the connections it accepts; with
/// `reply`, writes it to each connection and closes it, otherwise holds
/// each one open and silent.
struct Watcher {
    port: u16,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Watcher {
    async fn start(reply: Option<&'static [u8]>) -> Watcher {
        use tokio::io::AsyncWriteExt as _;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = std::sync::Arc::clone(&accepted);
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut c, _)) = l.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                match reply {
                    Some(bytes) => {
                        let _ = c.write_all(bytes).await;
                    }
                    None => held.push(c),
                }
            }
        });
        Watcher { port, accepted }
    }

    fn connections(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// `token` with its endpoint's port replaced by `port` (same address).
fn at_port(token: &str, port: u16) -> String {
    let mut t: fabric::RdmaToken = token.parse().unwrap();
    t.lid = port;
    t.to_string()
}

/// Issue 30 finding 2: a request without `X-Amz-Signature` is anonymous,
/// but the token check read `X-Amz-SignedHeaders` from the query: an
/// unsigned GET of a public-read object (or PUT into a public-read-write
/// bucket) with `X-Amz-Algorithm` and `X-Amz-SignedHeaders` naming the
/// token was served over RDMA, the target connecting wherever the token
/// said. Now refused, and the target never connects.
#[tokio::test]
async fn issue30_anonymous_requests_never_get_rdma() {
    use aws_sdk_s3::types::{BucketCannedAcl, ObjectCannedAcl};
    let s = rdma_server("");
    let c = s.admin();
    c.create_bucket()
        .bucket("pub")
        .acl(BucketCannedAcl::PublicReadWrite)
        .send()
        .await
        .unwrap();
    c.put_object()
        .bucket("pub")
        .key("k")
        .acl(ObjectCannedAcl::PublicRead)
        .body(ByteStream::from(data(4096, 3)))
        .send()
        .await
        .unwrap();
    // Anonymous HTTP reads and writes work: the bucket is public.
    let r = raw_get(&s.url("/pub/k")).await;
    assert_status(&r, 200);

    let t = Tenant::new(1 << 20).await;
    t.clear(0);
    let w = t.window(0, 1 << 20, Access::REMOTE_WRITE | Access::REMOTE_READ);
    let real = t.token(&w);
    let watcher = Watcher::start(None).await;
    let scan = at_port(&real, watcher.port);
    let trick = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-SignedHeaders=host%3Bx-amz-rdma-token";
    for tok in [&real, &scan] {
        for (method, path) in [("GET", "/pub/k"), ("PUT", "/pub/anon-rdma")] {
            for url in [s.url(&format!("{path}?{trick}")), s.url(path)] {
                let r = raw(
                    method,
                    &url,
                    &[
                        ("x-amz-rdma-token", tok.as_str()),
                        ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
                    ],
                    Bytes::new(),
                )
                .await;
                assert!(
                    r.status == 400 || r.status == 403,
                    "{method} {url}: {} {}",
                    r.status,
                    r.text()
                );
                assert!(r.header("x-amz-rdma-reply").is_none(), "{url}");
            }
        }
    }
    assert!(t.bytes(0, 4096).iter().all(|&b| b == 0), "bytes landed");
    assert!(!stored(&s, "pub", "anon-rdma").await);
    assert_eq!(watcher.connections(), 0, "the target connected");
    // A signed request with the same token is served (the path works).
    let r = rdma_get(&s, "/pub/k", &real, &[]).await;
    assert_status(&r, 200);
    assert_eq!(t.bytes(0, 4096), data(4096, 3));
}

/// Issue 30 finding 2: any signed user could make the target connect to
/// any address. It now connects only to endpoints inside
/// `rdma.allowed_client_networks`; a token naming another address is
/// refused before any connection.
#[tokio::test]
async fn issue30_tokens_outside_the_allowed_networks_are_refused() {
    let s = rdma_server("  allowed_client_networks: [192.0.2.0/24]\n");
    create_bucket(&s, "net").await;
    common::sdk_put(&s, "net", "k", data(4096, 5)).await;
    let t = Tenant::new(1 << 20).await;
    t.clear(0);
    let w = t.window(0, 1 << 20, Access::REMOTE_WRITE | Access::REMOTE_READ);
    let real = t.token(&w);
    let watcher = Watcher::start(None).await;
    for tok in [real.clone(), at_port(&real, watcher.port)] {
        let r = rdma_get(&s, "/net/k", &tok, &[]).await;
        assert_s3_error(&r, 403, "AccessDenied");
        assert!(r.text().contains("allowed_client_networks"), "{}", r.text());
        let r = rdma_put(&s, "/net/put", &tok, &[]).await;
        assert_eq!(r.status, 403, "{}", r.text());
    }
    assert!(!stored(&s, "net", "put").await);
    assert!(t.bytes(0, 4096).iter().all(|&b| b == 0));
    assert_eq!(watcher.connections(), 0, "the target connected");
}

/// Issue 30 finding 2: the target's errors told open, closed and non-fabric
/// ports apart (a port scanner). A failed connect now answers the same
/// status, code and message whatever the port did; the cause is only
/// logged.
#[tokio::test]
async fn issue30_connect_errors_do_not_tell_a_ports_state() {
    let s = rdma_server("");
    create_bucket(&s, "scan").await;
    common::sdk_put(&s, "scan", "k", data(4096, 6)).await;
    let t = Tenant::new(1 << 20).await;
    let w = t.window(0, 1 << 20, Access::REMOTE_WRITE);
    let real = t.token(&w);
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let silent = Watcher::start(None).await;
    let http = Watcher::start(Some(
        b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
    ))
    .await;
    let stranger = Tenant::with_key(1 << 20, FabricKey::random()).await;
    let sw = stranger.window(0, 1 << 20, Access::REMOTE_WRITE);
    let mut answers = Vec::new();
    for (what, tok) in [
        ("closed port", at_port(&real, closed)),
        ("silent open port", at_port(&real, silent.port)),
        ("non-fabric port", at_port(&real, http.port)),
        ("fabric endpoint with another key", stranger.token(&sw)),
    ] {
        let r = rdma_get(&s, "/scan/k", &tok, &[]).await;
        answers.push((
            what,
            r.status,
            r.xml("Code").unwrap_or_default(),
            r.xml("Message").unwrap_or_default(),
        ));
    }
    let first = &answers[0];
    assert_eq!(first.2, "RDMATransferFailed", "{answers:?}");
    for a in &answers[1..] {
        assert_eq!(
            (a.1, &a.2, &a.3),
            (first.1, &first.2, &first.3),
            "{answers:?}"
        );
    }
    assert!(silent.connections() > 0 && http.connections() > 0);
    // The causes are in the target's log.
    let log = s.log();
    assert!(
        log.contains("connecting to the client's fabric endpoint failed"),
        "{log}"
    );
}

/// The field's reply rules on raw signed requests, and the dialect marker:
/// s3dma's exchange only with `x-amz-rdma-protocol: s3dma-v1` (signed); a
/// standard token (the cuObject dialect, a DC target this server cannot
/// reach) or another dialect's is declined by `501` alone: a GET with the
/// object in the body, a PUT or UploadPart storing nothing.
#[tokio::test]
async fn issue32_reply_rules_and_dialects() {
    let s = rdma_server("");
    create_bucket(&s, "rules").await;
    let len = 300_001;
    let t = Tenant::new(4 * len).await;
    let (_, md5) = t.fill(0, len, 32);
    let d = t.bytes(0, len);
    let src = t.window(0, len, Access::REMOTE_READ);
    let src_tok = t.token(&src);

    // PUT over RDMA: 200, reply 200, the byte count, an empty body.
    let r = rdma_put(&s, "/rules/k", &src_tok, &[]).await;
    assert_reply(&r, 200, "200");
    assert_moved(&r, len);
    assert!(r.body.is_empty());
    assert_eq!(etag(&r), md5);

    // GET: 200/200 with the count and Content-Length 0; a range 206/206
    // with Content-Range.
    let dst = t.window(len, len, Access::REMOTE_WRITE);
    let r = rdma_get(&s, "/rules/k", &t.token(&dst), &[]).await;
    assert_reply(&r, 200, "200");
    assert_moved(&r, len);
    assert_eq!(r.header("content-length"), Some("0"));
    assert!(r.body.is_empty());
    assert!(t.bytes(len, len) == d);
    let r = rdma_get(
        &s,
        "/rules/k",
        &t.token(&dst),
        &[("range", "bytes=100-1099")],
    )
    .await;
    assert_reply(&r, 206, "206");
    assert_eq!(r.header("x-amz-rdma-bytes-transferred"), Some("1000"));
    assert_eq!(
        r.header("content-range"),
        Some(format!("bytes 100-1099/{len}").as_str())
    );
    assert_eq!(r.header("content-length"), Some("0"));

    // HEAD with a token: the object's real length, not the empty body's.
    let r = rdma(&s, "HEAD", "/rules/k", &t.token(&dst), &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-length"),
        Some(len.to_string().as_str()),
        "a HEAD carrying a token reports the object's length"
    );

    // A standard token (no marker): declined. The token's fields even name
    // our tenant's endpoint, yet nothing is written there.
    t.clear(0xee);
    let standard = t.token(&dst);
    let r = bare_token(&s, "GET", "/rules/k", &standard).await;
    assert_reply(&r, 200, "501");
    assert_eq!(r.header("x-amz-rdma-protocol-status"), Some("unsupported"));
    assert!(r.header("x-amz-rdma-bytes-transferred").is_none());
    assert!(
        r.body.as_ref() == d.as_slice(),
        "a declined GET carries the object"
    );
    assert!(
        t.bytes(len, len).iter().all(|&b| b == 0xee),
        "nothing placed"
    );
    let ranged = [
        ("x-amz-rdma-token", standard.as_str()),
        ("range", "bytes=5-9"),
    ];
    let r = send_exact(&s.url("/rules/k"), "GET", &ranged, &[]).await;
    assert_eq!((r.status, r.header("x-amz-rdma-reply")), (206, Some("501")));
    assert!(r.body.as_ref() == &d[5..10]);

    // PUT and UploadPart with a standard token: 200 + 501 +
    // RDMANotSupported, nothing stored, the old object intact.
    t.fill(0, len, 33);
    let src_tok = t.token(&src);
    for (method, path) in [("PUT", "/rules/k"), ("PUT", "/rules/new")] {
        let r = bare_token(&s, method, path, &src_tok).await;
        assert_reply(&r, 200, "501");
        assert_eq!(r.xml("Code").as_deref(), Some("RDMANotSupported"));
        assert!(r.header("etag").is_none());
    }
    assert!(sdk_get(&s, "rules", "k").await == d);
    assert!(!stored(&s, "rules", "new").await);
    let id = start_upload(&s.admin(), "rules", "mpu").await;
    let r = bare_token(
        &s,
        "PUT",
        &format!("/rules/mpu?partNumber=1&uploadId={id}"),
        &src_tok,
    )
    .await;
    assert_eq!(r.header("x-amz-rdma-reply"), Some("501"));
    let parts = list_parts(&s.admin(), "rules", "mpu", &id).await;
    assert!(
        parts.parts().is_empty(),
        "a declined UploadPart records no part"
    );

    // A raw hipobj-rc-v2 token on an object request, and a marker naming
    // another dialect: declined the same way.
    let rc_token = format!("01{}", "11".repeat(43));
    for (tok, marker) in [
        (rc_token.as_str(), None),
        (src_tok.as_str(), Some("hipobj-rc-v2")),
        (src_tok.as_str(), Some("s3dma-v999")),
    ] {
        let mut h = vec![("x-amz-rdma-token", tok)];
        if let Some(m) = marker {
            h.push(("x-amz-rdma-protocol", m));
        }
        let r = send_exact(&s.url("/rules/k"), "GET", &h, &[]).await;
        assert_eq!(r.status, 200, "{marker:?}: {}", r.text());
        assert_eq!(r.header("x-amz-rdma-reply"), Some("501"), "{marker:?}");
        let r = send_exact(&s.url("/rules/k"), "PUT", &h, &[]).await;
        assert_eq!(r.header("x-amz-rdma-reply"), Some("501"), "{marker:?}");
    }
    assert!(
        sdk_get(&s, "rules", "k").await == d,
        "no declined PUT replaced it"
    );

    // A malformed token: 400 InvalidRDMAToken, no reply header.
    for bad in ["zz", &src_tok[..80], &format!("{src_tok}0")] {
        let r = bare_token(&s, "GET", "/rules/k", bad).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert_eq!(r.xml("Code").as_deref(), Some("InvalidRDMAToken"));
        assert!(r.header("x-amz-rdma-reply").is_none());
    }

    // The marker must be signed: added after signing, the request is
    // refused before anything moves.
    let token = [("x-amz-rdma-token", src_tok.as_str())];
    let after = [("x-amz-rdma-protocol", "s3dma-v1")];
    let r = send_exact(&s.url("/rules/k"), "PUT", &token, &after).await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(sdk_get(&s, "rules", "k").await == d);
    // Twice: refused (400 from the RDMA check, or 403 when the two values
    // already break the signature), nothing moves.
    t.clear(0xee);
    let r = send_exact(
        &s.url("/rules/k"),
        "GET",
        &[
            ("x-amz-rdma-token", &src_tok),
            ("x-amz-rdma-protocol", "s3dma-v1"),
            ("x-amz-rdma-protocol", "s3dma-v1"),
        ],
        &[],
    )
    .await;
    assert!(matches!(r.status, 400 | 403), "{}", r.text());
    assert!(t.bytes(0, len).iter().all(|&b| b == 0xee));
}
