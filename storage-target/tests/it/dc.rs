//! Standard (cuObject) tokens: the client's memory behind its DC target,
//! written (GET) and read (PUT) by the server's DC initiators.
//!
//! Everywhere a device cannot do DC (tcp, Soft-RoCE's rxe0 in the VM, a
//! build without the `dc` feature) a standard token is declined by the
//! reply rules: `x-amz-rdma-reply: 501`, a GET served in the body, a PUT
//! storing nothing, and the server says why at start. The transfers need
//! an mlx5 device with DC (ConnectX-5 or newer, BlueField; DC loopback on
//! one port works): they are `#[ignore]`d here and run there with
//!
//! ```sh
//! S3DMA_TEST_FABRIC=verbs cargo test -p storage-target --all-features --test it dc:: -- --ignored --test-threads 1
//! ```
//!
//! The client side is written from the dialect's description (NVIDIA's
//! `gpu_direct_rdma_access` sample, versitygw's `rdma_host_client_wrapper`):
//! a DCT with the DC key over registered memory, the 81-character token
//! `addr:size:rkey:lid:dctn:gidflag:gid` laid out by hand, a raw SigV4
//! request with the token signed and no `x-amz-rdma-protocol`.

use fabric::Backend;
use sha2::Digest as _;

use crate::common::{ADMIN, Raw, Server, create_bucket, data, sdk_get, sdk_put, send_signed};

use crate::support::{fabric_server, rdma_dialect_server};

fn backend() -> Backend {
    std::env::var("S3DMA_TEST_FABRIC").map_or(Backend::Tcp, |v| v.parse().unwrap())
}

/// A server with RDMA on `backend`, sending to `networks`, `dc` lines under
/// `rdma.dc:`.
fn server(backend: Backend, networks: &str, dc: &str) -> Server {
    let section = format!("  dc:\n    enabled: true\n{dc}");
    rdma_dialect_server(backend, networks, section)
}

/// The token laid out by hand: `addr(16):size(8):rkey(8):lid(4):dctn(6):gidflag(1):gid(32)`.
fn standard_token(addr: u64, size: u32, rkey: u32, lid: u16, dctn: u32, gid: [u8; 16]) -> String {
    format!(
        "{addr:016x}:{size:08x}:{rkey:08x}:{lid:04x}:{dctn:06x}:1:{}",
        hex::encode(gid)
    )
}

fn sha(b: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(b))
}

/// A well-formed standard token (naming a DCT at 10.77.0.1) for `size`
/// bytes: parsed, never served where there is no DC.
fn foreign_token(size: u32) -> String {
    let gid = std::net::Ipv4Addr::new(10, 77, 0, 1)
        .to_ipv6_mapped()
        .octets();
    standard_token(0x7f00_0000_1000, size, 0x1234, 0, 0x2a, gid)
}

/// A GET of `url` signed as the admin, the standard `token` and the
/// `extra` headers signed (no `x-amz-rdma-protocol`: the cuObject dialect).
async fn token_get(url: &str, token: &str, extra: &[(&str, &str)]) -> Raw {
    let mut h = vec![("x-amz-rdma-token", token)];
    h.extend_from_slice(extra);
    send_signed(ADMIN, "GET", url, &h, &[]).await
}

/// A body-less PUT of `url` signed as the admin with the standard `token`.
async fn token_put(url: &str, token: &str) -> Raw {
    let h = [("x-amz-rdma-token", token), ("content-length", "0")];
    send_signed(ADMIN, "PUT", url, &h, &[]).await
}

/// Asks `s` to GET `bucket/k` (holding `body`) and PUT `bucket/put` with
/// `token`, and checks the declines of the reply rules: the GET served in
/// the body with `x-amz-rdma-reply: 501`, the PUT `RDMANotSupported`.
async fn assert_declined(s: &Server, bucket: &str, token: &str, body: &[u8]) {
    let r = token_get(&s.url(&format!("/{bucket}/k")), token, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-amz-rdma-reply"), Some("501"));
    assert_eq!(sha(&r.body), sha(body));
    let r = token_put(&s.url(&format!("/{bucket}/put")), token).await;
    assert_eq!(r.header("x-amz-rdma-reply"), Some("501"), "{}", r.text());
    assert!(r.text().contains("RDMANotSupported"), "{}", r.text());
}

/// Where no DC transport exists (tcp here; rxe0 in the VM; no `dc` build),
/// a well-formed standard token is declined by the reply rules: the GET
/// in the body with `x-amz-rdma-reply: 501`, the PUT storing nothing, and
/// the server said why at start (on verbs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dc_unavailable_declines_standard_tokens_with_501() {
    let b = backend();
    let s = server(b, "[127.0.0.0/8, 10.0.0.0/8]", "");
    create_bucket(&s, "dc-b").await;
    let body = data(100_000, 3);
    sdk_put(&s, "dc-b", "k", body.clone()).await;
    let token = foreign_token(100_000);
    assert_eq!(token.len(), 81);
    assert_declined(&s, "dc-b", &token, &body).await;
    assert!(
        sdk_get(&s, "dc-b", "put").await.is_none(),
        "a declined PUT stored an object"
    );
    if b == Backend::Verbs {
        let log = s.log();
        assert!(
            log.contains("no DC: standard (cuObject) tokens are declined with 501")
                || !cfg!(feature = "dc"),
            "{log}"
        );
    }
}

/// A gateway (`store: s3`) in front of `upstream`, with RDMA on `backend`
/// sending to `networks`.
fn gateway(upstream: &Server, backend: Backend, networks: &str) -> Server {
    let up = upstream.endpoint.clone();
    let networks = networks.to_owned();
    fabric_server(move |key_file| {
        format!(
            "store: s3\ndata_dir: ''\nupstream:\n  endpoints: [{up}]\ncache:\n  size: 32MiB\n  chunk_size: 1MiB\nrdma:\n  mode: enabled\n  backend: {backend}\n  fabric_key_file: {}\n  allowed_client_networks: {networks}\n  dc:\n    enabled: true\n",
            key_file
        )
    })
}

/// A gateway without DC declines a standard token by the same rules: the
/// GET served through its cache in the body with `x-amz-rdma-reply: 501`,
/// the PUT refused with nothing stored upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dc_unavailable_a_gateway_declines_standard_tokens_with_501() {
    let upstream = Server::start();
    create_bucket(&upstream, "dc-g").await;
    let body = data(300_001, 7);
    sdk_put(&upstream, "dc-g", "k", body.clone()).await;
    let gw = gateway(&upstream, backend(), "[127.0.0.0/8, 10.0.0.0/8]");
    assert_declined(&gw, "dc-g", &foreign_token(300_001), &body).await;
    assert!(
        sdk_get(&upstream, "dc-g", "put").await.is_none(),
        "a declined PUT stored an object upstream"
    );
}

#[cfg(feature = "dc")]
mod mlx5 {
    //! The DC transfers themselves (mlx5 with DC only).

    use super::*;
    use fabric::verbs::dc::{Dct, probe};
    use fabric::verbs::rc::RcQp;
    use fabric::{Access, Domain, Region};

    /// IBV_ACCESS_LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ.
    const DCT_ACCESS: u32 = 1 | 2 | 4;

    struct Client {
        domain: Domain,
        dct: Dct,
        gid: [u8; 16],
        lid: u16,
    }

    /// The DC target side (what a cuObject client holds): the device's
    /// domain, a DCT with `dc_key`, the port's GID (read from a queue pair
    /// made on the same port) and LID.
    fn client(dc_key: u64) -> Client {
        let domain = Domain::open(Backend::Verbs).expect("an RDMA device");
        probe(&domain).expect("DC on this device (mlx5, ConnectX-5 or newer, or a BlueField)");
        let dct =
            Dct::create(&domain, dc_key, DCT_ACCESS, Default::default(), None, 64).expect("a DCT");
        let local = RcQp::create(&domain, Access::NONE).unwrap().local();
        Client {
            domain,
            // The GID the DCT answers on (a routable RoCE v2 one); the
            // port's own on InfiniBand.
            gid: dct.target().gid.unwrap_or(local.gid),
            dct,
            lid: local.lid,
        }
    }

    /// The allowed-networks list naming `gid` alone.
    fn only(gid: [u8; 16]) -> String {
        let ip = std::net::Ipv6Addr::from(gid);
        match ip.to_ipv4_mapped() {
            Some(v4) => format!("[{v4}/32]"),
            None => format!("[{ip}/128]"),
        }
    }

    /// `len` bytes of `r` from `off`.
    fn read(r: &Region, off: usize, len: usize) -> Vec<u8> {
        let mut got = vec![0u8; len];
        r.read_at(off, &mut got).unwrap();
        got
    }

    impl Client {
        /// Memory the server may write and read.
        fn alloc(&self, len: usize) -> Region {
            let access = Access::REMOTE_WRITE | Access::REMOTE_READ;
            self.domain.alloc(len, access).unwrap()
        }

        fn token(&self, r: &Region, off: u64, len: u32, rkey: u32) -> String {
            standard_token(
                r.addr() + off,
                len,
                rkey,
                self.lid,
                self.dct.number(),
                self.gid,
            )
        }

        /// The server allowed to send to this client's GID.
        fn server(&self) -> Server {
            server(Backend::Verbs, &only(self.gid), "")
        }
    }

    fn large() -> usize {
        std::env::var("S3DMA_TEST_LARGE_OBJECT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1 << 30)
    }

    /// GET and PUT of 0 B to 1 GiB, and ranges, by DC: the bytes compared
    /// with what the server stores and serves over HTTP.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs an mlx5 device with DC (ConnectX-5 or newer, BlueField): S3DMA_TEST_FABRIC=verbs cargo test -p storage-target --all-features --test it dc:: -- --ignored"]
    async fn dc_get_and_put_from_0_bytes_to_1_gib() {
        let c = client(s3dma_wire::dc::DEFAULT_DC_KEY);
        let s = c.server();
        create_bucket(&s, "dc-b").await;
        for (i, len) in [0usize, 1, 4096, (1 << 20) + 3, 64 << 20, large()]
            .into_iter()
            .enumerate()
        {
            let body = data(len, i as u64 + 1);
            let key = format!("obj-{len}");
            sdk_put(&s, "dc-b", &key, body.clone()).await;
            let region = c.alloc(len.max(1));
            let n = u32::try_from(len).unwrap();
            let token = c.token(&region, 0, n.max(1), region.rkey());
            let r = token_get(&s.url(&format!("/dc-b/{key}")), &token, &[]).await;
            assert_eq!(r.status, 200, "{key}: {}", r.text());
            assert_eq!(r.header("x-amz-rdma-reply"), Some("200"), "{key}");
            assert_eq!(
                r.header("x-amz-rdma-bytes-transferred"),
                Some(len.to_string().as_str())
            );
            assert!(r.body.is_empty());
            let got = read(&region, 0, len);
            assert_eq!(sha(&got), sha(&body), "{key} by DC WRITE");
            // The same bytes back as a PUT by DC READ.
            if len > 0 {
                let put_key = format!("put-{len}");
                let r = token_put(&s.url(&format!("/dc-b/{put_key}")), &token).await;
                assert_eq!(r.status, 200, "{put_key}: {}", r.text());
                assert_eq!(r.header("x-amz-rdma-reply"), Some("200"));
                let stored = sdk_get(&s, "dc-b", &put_key).await.expect("stored");
                assert_eq!(sha(&stored), sha(&body), "{put_key} by DC READ");
            }
        }
        // A range lands at the start of the token's memory: 206.
        let region = c.alloc(4096);
        let token = c.token(&region, 0, 4096, region.rkey());
        let r = token_get(
            &s.url("/dc-b/obj-4096"),
            &token,
            &[("range", "bytes=100-199")],
        )
        .await;
        assert_eq!(r.status, 206, "{}", r.text());
        let got = read(&region, 0, 100);
        assert_eq!(got, data(4096, 3)[100..200]);
    }

    /// A DCT with another DC key, or a token with a wrong rkey, moves
    /// nothing: the GET fails (`RDMATransferFailed`), never falls back to
    /// the body, and the memory is untouched; a PUT stores nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs an mlx5 device with DC (ConnectX-5 or newer, BlueField): S3DMA_TEST_FABRIC=verbs cargo test -p storage-target --all-features --test it dc:: -- --ignored"]
    async fn dc_wrong_key_and_wrong_rkey_move_nothing() {
        let good = client(s3dma_wire::dc::DEFAULT_DC_KEY);
        let other_key = client(0x1234_5678);
        let s = good.server();
        create_bucket(&s, "dc-b").await;
        let body = data(65_536, 9);
        sdk_put(&s, "dc-b", "k", body.clone()).await;
        for (what, c, rkey_delta) in [
            ("a DCT with another DC key", &other_key, 0u32),
            ("a wrong rkey", &good, 1u32),
        ] {
            let region = c.alloc(65_536);
            region.write_at(0, &[0xAB; 65_536]).unwrap();
            let token = c.token(&region, 0, 65_536, region.rkey().wrapping_add(rkey_delta));
            let r = token_get(&s.url("/dc-b/k"), &token, &[]).await;
            assert!(r.status >= 400, "{what}: {} {}", r.status, r.text());
            assert!(
                r.text().contains("RDMATransferFailed"),
                "{what}: {}",
                r.text()
            );
            let got = read(&region, 0, 65_536);
            assert!(got.iter().all(|&b| b == 0xAB), "{what}: memory written");
            let r = token_put(&s.url("/dc-b/never"), &token).await;
            assert!(r.status >= 400, "{what}: PUT {} {}", r.status, r.text());
            assert!(
                sdk_get(&s, "dc-b", "never").await.is_none(),
                "{what}: a failed PUT stored an object"
            );
        }
    }

    /// A fenced window is not written after its fence: its key revoked
    /// (what the host-shim does when a call that a standard token named
    /// fails), a GET naming it moves nothing, then or after the retry
    /// budget, and the rest of the region is never touched.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs an mlx5 device with DC (ConnectX-5 or newer, BlueField): S3DMA_TEST_FABRIC=verbs cargo test -p storage-target --all-features --test it dc:: -- --ignored"]
    async fn dc_a_fenced_window_is_not_written_after_its_fence() {
        use s3dma_wire::dc::{Ending, Fence, RetrySettings};
        let c = client(s3dma_wire::dc::DEFAULT_DC_KEY);
        let s = c.server();
        create_bucket(&s, "dc-b").await;
        let body = data(65_536, 5);
        sdk_put(&s, "dc-b", "k", body.clone()).await;
        let region = c.alloc(3 * 65_536);
        region.write_at(0, &[0xAB; 3 * 65_536]).unwrap();
        let window = region
            .window(65_536, 65_536, Access::REMOTE_WRITE, None)
            .unwrap();
        let token = c.token(&region, 65_536, 65_536, window.rkey());
        // The call fails before the server is asked: the fence runs.
        let mut fence = Fence::live(RetrySettings::default().budget().unwrap());
        fence.end(Ending::Abandoned, std::time::Instant::now());
        assert!(fence.needs_invalidation());
        window.revoke();
        fence.key_invalidated();
        for when in ["during the fence", "after the fence"] {
            if when == "after the fence" {
                let rest = fence.remaining(std::time::Instant::now()).unwrap();
                tokio::time::sleep(rest).await;
                assert!(fence.poll(std::time::Instant::now()));
            }
            let r = token_get(&s.url("/dc-b/k"), &token, &[]).await;
            assert!(r.status >= 400, "{when}: {} {}", r.status, r.text());
            assert!(
                r.text().contains("RDMATransferFailed"),
                "{when}: {}",
                r.text()
            );
            let got = read(&region, 0, 3 * 65_536);
            assert!(got.iter().all(|&b| b == 0xAB), "{when}: memory written");
        }
    }

    /// A late write after a cancel lands nowhere the tenant can see: a
    /// large GET by DC is cancelled while the server's writes are in
    /// flight and its window revoked at once; after the retry budget the
    /// memory no longer changes, nothing outside the window ever changed,
    /// and the server serves the next request.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs an mlx5 device with DC (ConnectX-5 or newer, BlueField): S3DMA_TEST_FABRIC=verbs cargo test -p storage-target --all-features --test it dc:: -- --ignored"]
    async fn dc_a_late_write_after_a_cancel_lands_nowhere_the_tenant_can_see() {
        use s3dma_wire::dc::{Ending, Fence, RetrySettings};
        const LEN: usize = 256 << 20;
        const GUARD: usize = 1 << 20;
        let c = client(s3dma_wire::dc::DEFAULT_DC_KEY);
        let s = c.server();
        create_bucket(&s, "dc-b").await;
        let body = data(LEN, 11);
        sdk_put(&s, "dc-b", "big", body.clone()).await;
        let region = c.alloc(LEN + 2 * GUARD);
        let fill = vec![0xABu8; LEN + 2 * GUARD];
        region.write_at(0, &fill).unwrap();
        let window = region
            .window(GUARD, LEN, Access::REMOTE_WRITE, None)
            .unwrap();
        let n = u32::try_from(LEN).unwrap();
        let token = c.token(&region, GUARD as u64, n, window.rkey());
        let url = s.url("/dc-b/big");
        let headers = [("x-amz-rdma-token", token.as_str())];
        for delay_ms in [20u64, 5, 1] {
            // The tenant gives up while the server is writing.
            let get = send_signed(ADMIN, "GET", &url, &headers, &[]);
            let cancelled = tokio::time::timeout(std::time::Duration::from_millis(delay_ms), get)
                .await
                .is_err();
            if !cancelled {
                // Done before the cancel (a fast NIC): try a shorter delay.
                continue;
            }
            let mut fence = Fence::live(RetrySettings::default().budget().unwrap());
            fence.end(Ending::Abandoned, std::time::Instant::now());
            window.revoke();
            fence.key_invalidated();
            let rest = fence.remaining(std::time::Instant::now()).unwrap();
            tokio::time::sleep(rest).await;
            assert!(fence.poll(std::time::Instant::now()));
            // The memory the tenant gets back now no longer changes.
            let mut first = vec![0u8; LEN + 2 * GUARD];
            region.read_at(0, &mut first).unwrap();
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            let mut later = vec![0u8; LEN + 2 * GUARD];
            region.read_at(0, &mut later).unwrap();
            assert!(first == later, "a write landed after the fence");
            assert!(
                later[..GUARD].iter().all(|&b| b == 0xAB)
                    && later[GUARD + LEN..].iter().all(|&b| b == 0xAB),
                "a write landed outside the window"
            );
            // The server is still serving.
            let other = c.alloc(4096);
            let small = c.token(&other, 0, 4096, other.rkey());
            let r = token_get(&s.url("/dc-b/big"), &small, &[("range", "bytes=0-4095")]).await;
            assert_eq!(r.status, 206, "{}", r.text());
            let got = read(&other, 0, 4096);
            assert_eq!(got, body[..4096]);
            return;
        }
        panic!("every GET of {LEN} bytes finished before its cancel: no cancel was exercised");
    }

    /// Through a gateway: GET (whole and a range) by the gateway's DCIs
    /// from its cache into a DCT's memory, PUT by DC READ stored upstream.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs an mlx5 device with DC (ConnectX-5 or newer, BlueField): S3DMA_TEST_FABRIC=verbs cargo test -p storage-target --all-features --test it dc:: -- --ignored"]
    async fn dc_through_a_gateway() {
        let c = client(s3dma_wire::dc::DEFAULT_DC_KEY);
        let upstream = Server::start();
        create_bucket(&upstream, "dc-g").await;
        let body = data((1 << 20) + 3, 41);
        sdk_put(&upstream, "dc-g", "read-me", body.clone()).await;
        let gw = gateway(&upstream, Backend::Verbs, &only(c.gid));
        let region = c.alloc(body.len());
        let n = u32::try_from(body.len()).unwrap();
        let token = c.token(&region, 0, n, region.rkey());
        let r = token_get(&gw.url("/dc-g/read-me"), &token, &[]).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-amz-rdma-reply"), Some("200"));
        let got = read(&region, 0, body.len());
        assert_eq!(sha(&got), sha(&body), "GET by DC WRITE through the gateway");
        let small = c.alloc(4096);
        let t = c.token(&small, 0, 4096, small.rkey());
        let r = token_get(
            &gw.url("/dc-g/read-me"),
            &t,
            &[("range", "bytes=1000-5095")],
        )
        .await;
        assert_eq!(r.status, 206, "{}", r.text());
        let got = read(&small, 0, 4096);
        assert_eq!(got, body[1000..5096]);
        // PUT: the same bytes back by DC READ, stored upstream.
        let r = token_put(&gw.url("/dc-g/written"), &token).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-amz-rdma-reply"), Some("200"));
        let stored = sdk_get(&upstream, "dc-g", "written")
            .await
            .expect("stored upstream");
        assert_eq!(
            sha(&stored),
            sha(&body),
            "PUT by DC READ through the gateway"
        );
    }
}
