//! The hipobj-rc-v2 server against the real binary, driven by a protocol
//! client written from the dialect's wire description (hipObject's
//! `v2-wire`/`v2-client`, versitygw's `rcroutes`, elbencho's
//! `HipObjV2Server`), not by s3dma's own codec: its token bytes are laid
//! out here by hand, its requests are raw signed HTTP, its queue pair is a
//! bare RC QP ([`fabric::verbs::rc::RcQp`]).
//!
//! The data-path tests need a verbs device: the Soft-RoCE VM runs this
//! suite with `S3DMA_TEST_FABRIC=verbs` (`.ci/verbs-tests.sh`), where none
//! may skip; on a host without one they print `SKIPPED` and return. The
//! unsupported path runs everywhere.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use fabric::verbs::policy::GidKind;
use fabric::verbs::rc::{RcQp, RcRemote};
use fabric::{Access, Backend, Domain, Region};
use sha2::Digest as _;

use crate::common::{self, ADMIN, OTHER, Raw, Server, data, raw, sdk_get, sdk_put, send_signed};

use crate::support::{fabric_server, rdma_dialect_server};

fn backend() -> Backend {
    std::env::var("S3DMA_TEST_FABRIC").map_or(Backend::Tcp, |v| v.parse().unwrap())
}

/// A server with RDMA on `backend` and `extra` lines under `rdma.hipobj:`,
/// sending to GIDs on loopback and 10.0.0.0/8 (the VM's rxe0 is 10.77.0.1).
fn server(backend: Backend, hipobj: &str) -> Server {
    server_for(backend, "[127.0.0.0/8, 10.0.0.0/8]", hipobj)
}

fn server_for(backend: Backend, networks: &str, hipobj: &str) -> Server {
    let section = format!("  hipobj:\n    enabled: true\n{hipobj}");
    rdma_dialect_server(backend, networks, section)
}

/// The verbs domain of the VM's device, or `None` (printed as skipped)
/// where the suite runs on tcp.
fn verbs() -> Option<Domain> {
    if backend() != Backend::Verbs {
        println!("SKIPPED: hipobj-rc-v2 needs a verbs device (the Soft-RoCE VM runs this)");
        return None;
    }
    Some(Domain::open(Backend::Verbs).expect("a verbs device in the VM"))
}

/// A signed control request (every header in `h` signed, as the dialect
/// requires), from `user`, signed as hipObject's v2 client signs it
/// ([`send_as_hipobject`]).
async fn control(
    s: &Server,
    user: (&str, &str),
    what: &str,
    h: &[(&str, &str)],
    unsigned: &[(&str, &str)],
) -> Raw {
    let url = s.url(&format!("/.hipobj-rc/{what}"));
    send_as_hipobject(user, &url, h, unsigned, "hipobj", SystemTime::now()).await
}

/// A control request signed as hipObject's v2 client signs it (its
/// `v2_sigv4` signer): SigV4 with the credential scope's service
/// `service` (`hipobj` as published), every header it sends signed
/// (`host`, `x-amz-date` and `h`), the payload hash that of the empty body,
/// and no `x-amz-content-sha256` header; `unsigned` added after signing.
async fn send_as_hipobject(
    user: (&str, &str),
    url: &str,
    h: &[(&str, &str)],
    unsigned: &[(&str, &str)],
    service: &str,
    at: SystemTime,
) -> Raw {
    let mut all = hipobject_headers(user, url, h, service, at);
    all.extend(
        unsigned
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    send_headers(url, &all, Bytes::new()).await
}

/// The headers of [`send_as_hipobject`]'s request, `host` among them.
fn hipobject_headers(
    (ak, sk): (&str, &str),
    url: &str,
    h: &[(&str, &str)],
    service: &str,
    at: SystemTime,
) -> Vec<(String, String)> {
    use aws_sigv4::http_request::{
        PayloadChecksumKind, SignableBody, SignableRequest, SigningSettings, sign,
    };
    let identity = aws_credential_types::Credentials::new(ak, sk, None, None, "t").into();
    let mut settings = SigningSettings::default();
    settings.payload_checksum_kind = PayloadChecksumKind::NoHeader;
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name(service)
        .time(at)
        .settings(settings)
        .build()
        .unwrap()
        .into();
    let host = url.split('/').nth(2).unwrap().to_owned();
    let mut all: Vec<(String, String)> = vec![("host".into(), host)];
    all.extend(h.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    let req = SignableRequest::new(
        "POST",
        url,
        all.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        SignableBody::Bytes(&[]),
    )
    .unwrap();
    let (instr, _) = sign(req, &params).unwrap().into_parts();
    let (signing, _) = instr.into_parts();
    all.extend(
        signing
            .into_iter()
            .map(|x| (x.name().to_owned(), x.value().to_owned())),
    );
    assert!(
        all.iter().all(|(k, _)| k != "x-amz-content-sha256"),
        "hipObject sends no payload hash"
    );
    all
}

/// Sends `headers` (but `host`, which the client sets) and `body`.
async fn send_headers(url: &str, headers: &[(String, String)], body: Bytes) -> Raw {
    let hs: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(k, _)| k != "host")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    raw("POST", url, &hs, body).await
}

/// The 44-byte token, laid out as the wire description says: transport
/// 0x01 (RC), the QP number (4 bytes little-endian), the GID (16 raw), rkey
/// (4), addr (8), length (8) all zero, the port (1), the LID (2 LE).
fn token_hex(qpn: u32, gid: [u8; 16], port: u8) -> String {
    let mut b = vec![0x01];
    b.extend(qpn.to_le_bytes());
    b.extend(gid);
    b.extend([0u8; 4 + 8 + 8]);
    b.push(port);
    b.extend([0u8; 2]);
    assert_eq!(b.len(), 44);
    hex::encode(b)
}

/// The server's QP number and GID from `x-amz-rdma-reply: 200:<token>`.
fn reply_token(r: &Raw) -> (u32, [u8; 16]) {
    let v = r.header("x-amz-rdma-reply").expect("x-amz-rdma-reply");
    let hex = v.strip_prefix("200:").unwrap_or_else(|| panic!("{v}"));
    let b = hex::decode(hex).unwrap();
    assert_eq!(b.len(), 44, "{v}");
    assert_eq!(b[0], 0x01, "an RC token");
    let qpn = u32::from_le_bytes(b[1..5].try_into().unwrap());
    let gid: [u8; 16] = b[5..21].try_into().unwrap();
    assert_ne!(gid, [0; 16]);
    assert_eq!(
        r.header("x-amz-rdma-qpn"),
        Some(format!("{qpn:x}").as_str()),
        "the QP number header agrees with the token"
    );
    (qpn, gid)
}

fn hex_header(r: &Raw, name: &str) -> u64 {
    u64::from_str_radix(r.header(name).unwrap_or_else(|| panic!("{name}")), 16).unwrap()
}

fn sha(b: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(b))
}

/// One side of a transfer: a QP and registered memory.
struct Client {
    qp: RcQp,
    mem: Region,
    psn: u32,
    cookie: u32,
}

impl Client {
    fn new(domain: &Domain, len: usize) -> Client {
        Client::with_gid(domain, len, None)
    }

    /// A client whose QP sends from a GID of `kind` (`None`: the port's
    /// preferred one, IPv4-mapped on rxe0).
    fn with_gid(domain: &Domain, len: usize, kind: Option<GidKind>) -> Client {
        let qp = RcQp::create_with_gid(domain, Access::REMOTE_WRITE, kind)
            .unwrap_or_else(|e| panic!("a QP on a {kind:?} GID: {e}"));
        let mem = domain.alloc(len.max(1), Access::ALL).unwrap();
        let psn = rand::random_range(1..=0x00ff_ffff);
        let cookie = rand::random_range(1..=u32::MAX);
        Client {
            qp,
            mem,
            psn,
            cookie,
        }
    }

    fn prepare_headers(
        &self,
        op: &str,
        target: &str,
        size: u64,
        offset: u64,
    ) -> Vec<(String, String)> {
        let l = self.qp.local();
        let mut h = vec![
            ("x-amz-rdma-protocol".to_owned(), "hipobj-rc-v2".to_owned()),
            (
                "x-amz-rdma-token".to_owned(),
                token_hex(l.qpn, l.gid, l.port),
            ),
            ("x-amz-rdma-psn".to_owned(), format!("{:06x}", self.psn)),
            (
                "x-amz-rdma-cookie".to_owned(),
                format!("{:08x}", self.cookie),
            ),
            ("x-amz-rdma-op".to_owned(), op.to_owned()),
            ("x-amz-rdma-target".to_owned(), target.to_owned()),
            ("x-amz-rdma-size".to_owned(), size.to_string()),
        ];
        if offset != 0 {
            h.push(("x-amz-rdma-offset".to_owned(), offset.to_string()));
        }
        h
    }

    async fn prepare(
        &self,
        s: &Server,
        user: (&str, &str),
        op: &str,
        target: &str,
        size: u64,
        offset: u64,
    ) -> Raw {
        let h = self.prepare_headers(op, target, size, offset);
        let hs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        control(s, user, "prepare", &hs, &[]).await
    }

    /// Connects the QP to the server's from a 200 PREPARE reply; the
    /// session id.
    fn connect(&self, r: &Raw) -> String {
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-amz-rdma-protocol"), Some("hipobj-rc-v2"));
        assert_eq!(r.header("content-length"), Some("0"));
        let (qpn, gid) = reply_token(r);
        let psn = u32::from_str_radix(r.header("x-amz-rdma-psn").unwrap(), 16).unwrap();
        assert!((1..=0x00ff_ffff).contains(&psn));
        let session = r.header("x-amz-rdma-session").unwrap().to_owned();
        assert_eq!(session.len(), 32);
        self.qp
            .connect(
                &RcRemote {
                    qpn,
                    gid,
                    lid: 0,
                    psn,
                },
                self.psn,
            )
            .unwrap();
        session
    }

    fn ready_headers(&self, session: &str, with_mr: bool) -> Vec<(String, String)> {
        let mut h = vec![
            ("x-amz-rdma-protocol".to_owned(), "hipobj-rc-v2".to_owned()),
            ("x-amz-rdma-session".to_owned(), session.to_owned()),
            (
                "x-amz-rdma-cookie".to_owned(),
                format!("{:08x}", self.cookie),
            ),
            (
                "x-amz-rdma-qpn".to_owned(),
                format!("{:x}", self.qp.local().qpn),
            ),
        ];
        if with_mr {
            h.push((
                "x-amz-rdma-mr-addr".to_owned(),
                format!("{:x}", self.mem.addr()),
            ));
            h.push((
                "x-amz-rdma-mr-rkey".to_owned(),
                format!("{:08x}", self.mem.rkey()),
            ));
        }
        h
    }

    async fn ready(&self, s: &Server, user: (&str, &str), session: &str) -> Raw {
        let h = self.ready_headers(session, true);
        let hs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        control(s, user, "ready", &hs, &[]).await
    }

    /// A whole GET of `size` bytes at `offset` into the start of `mem`:
    /// the receive posted before READY, the final reply and the completion
    /// checked as the description says.
    async fn get(&self, s: &Server, target: &str, size: u64, offset: u64) -> Raw {
        let r = self.prepare(s, ADMIN, "GET", target, size, offset).await;
        let session = self.connect(&r);
        let recv = self.qp.post_recv().unwrap();
        let fin = self.ready(s, ADMIN, &session).await;
        assert_eq!(fin.status, 200, "{}", fin.text());
        let got = tokio::time::timeout(Duration::from_secs(30), recv)
            .await
            .expect("the WRITE_WITH_IMM arrives")
            .expect("a successful receive");
        assert!(got.rdma_write_with_imm);
        assert_eq!(got.imm, Some(self.cookie), "immediate = cookie");
        assert_eq!(u64::from(got.byte_len), size);
        check_final(&fin, self.cookie, size);
        fin
    }

    /// A whole PUT of the first `size` bytes of `mem`: READY sent, then the
    /// WRITE_WITH_IMM into the advertised staging region (after the 100 ms
    /// the description's clients wait), then the final reply.
    async fn put(&self, s: &Server, target: &str, size: u64) -> Raw {
        let r = self.prepare(s, ADMIN, "PUT", target, size, 0).await;
        let session = self.connect(&r);
        let addr = hex_header(&r, "x-amz-rdma-mr-addr");
        let rkey = u32::try_from(hex_header(&r, "x-amz-rdma-mr-rkey")).unwrap();
        assert_ne!(addr, 0);
        let h = self.ready_headers(&session, true);
        let url = s.url("/.hipobj-rc/ready");
        let ready = tokio::spawn(async move {
            let hs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            send_as_hipobject(ADMIN, &url, &hs, &[], "hipobj", SystemTime::now()).await
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.qp
            .write_with_imm(
                self.mem.slice(0, usize::try_from(size).unwrap()).unwrap(),
                addr,
                rkey,
                self.cookie,
            )
            .await
            .expect("the WRITE_WITH_IMM completes");
        let fin = ready.await.unwrap();
        assert_eq!(fin.status, 200, "{}", fin.text());
        check_final(&fin, self.cookie, size);
        fin
    }
}

/// The final reply: protocol echo, the cookie, the byte count, an empty body.
fn check_final(fin: &Raw, cookie: u32, size: u64) {
    assert_eq!(fin.header("x-amz-rdma-protocol"), Some("hipobj-rc-v2"));
    assert_eq!(
        fin.header("x-amz-rdma-cookie").map(str::to_lowercase),
        Some(format!("{cookie:08x}"))
    );
    assert_eq!(
        fin.header("x-amz-rdma-bytes-transferred"),
        Some(size.to_string().as_str())
    );
    assert!(fin.body.is_empty());
    let crc = fin.header("x-amz-rdma-checksum").expect("a checksum");
    assert!(crc.starts_with("CRC64NVME ") && crc.len() == 22, "{crc}");
}

/// Where RDMA is off or the backend is tcp, every control request is
/// answered `501` with `x-amz-rdma-protocol-status: unsupported` (the
/// dialect's one fallback signal); unsigned requests are refused first; the
/// control path can never become a bucket.
#[tokio::test]
async fn hipobj_without_verbs_answers_unsupported() {
    let s = server(Backend::Tcp, "");
    crate::support::mkbucket(&s.admin(), "hipobj-b")
        .await
        .unwrap();
    let gid = std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets();
    let prepare = [
        ("x-amz-rdma-protocol", "hipobj-rc-v2"),
        ("x-amz-rdma-psn", "000001"),
        ("x-amz-rdma-cookie", "00000001"),
        ("x-amz-rdma-op", "GET"),
        ("x-amz-rdma-target", "/hipobj-b/k"),
        ("x-amz-rdma-size", "1"),
    ];
    let tok = token_hex(7, gid, 1);
    let mut h = prepare.to_vec();
    h.push(("x-amz-rdma-token", &tok));
    for what in ["prepare", "ready", "cancel", "other"] {
        let r = control(&s, ADMIN, what, &h, &[]).await;
        assert_eq!(r.status, 501, "{what}: {}", r.text());
        assert_eq!(r.header("x-amz-rdma-protocol-status"), Some("unsupported"));
    }
    // Unsigned: refused before anything.
    let r = raw("POST", &s.url("/.hipobj-rc/prepare"), &h, Bytes::new()).await;
    assert_eq!(r.status, 403, "{}", r.text());
    // An x-amz-rdma-* header outside the signature: refused.
    let r = control(
        &s,
        ADMIN,
        "prepare",
        &prepare,
        &[("x-amz-rdma-token", &tok)],
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    // No bucket may take the control path's name.
    let r = s.admin().create_bucket().bucket(".hipobj-rc").send().await;
    assert!(r.is_err(), "created a bucket named .hipobj-rc");
}

/// The control requests take the peers as they are: signed with the
/// credential scope's service `hipobj` or `s3`, with no
/// `x-amz-content-sha256`, they pass the signature check (and get this
/// build's `501` unsupported from the route); every auth failure is a `403`
/// with the S3 error, never a `501`: a wrong signature, an unknown user, a
/// skewed clock, an `x-amz-*` header outside the signature, another
/// service, a presigned URL. A body is refused (`400`).
#[tokio::test]
async fn hipobj_control_auth_takes_the_peers_as_they_are() {
    let s = server(Backend::Tcp, "");
    let url = s.url("/.hipobj-rc/prepare");
    let gid = std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets();
    let tok = token_hex(7, gid, 1);
    let h = [
        ("x-amz-rdma-protocol", "hipobj-rc-v2"),
        ("x-amz-rdma-token", tok.as_str()),
        ("x-amz-rdma-psn", "000001"),
        ("x-amz-rdma-cookie", "00000001"),
        ("x-amz-rdma-op", "GET"),
        ("x-amz-rdma-target", "/b/k"),
        ("x-amz-rdma-size", "1"),
    ];
    let now = SystemTime::now();
    // Verified: the route answers (unsupported without verbs).
    for service in ["hipobj", "s3"] {
        let r = send_as_hipobject(ADMIN, &url, &h, &[], service, now).await;
        assert_eq!(r.status, 501, "{service}: {}", r.text());
        assert_eq!(r.header("x-amz-rdma-protocol-status"), Some("unsupported"));
    }
    let refused = |r: &Raw, status: u16, code: &str, what: &str| {
        assert_eq!(r.status, status, "{what}: {}", r.text());
        assert_eq!(r.xml("Code").as_deref(), Some(code), "{what}: {}", r.text());
        assert!(
            r.header("x-amz-rdma-protocol-status").is_none(),
            "{what}: an auth failure is not the fallback signal"
        );
    };
    let r = send_as_hipobject((ADMIN.0, "not-the-secret"), &url, &h, &[], "hipobj", now).await;
    refused(&r, 403, "SignatureDoesNotMatch", "wrong secret");
    let r = send_as_hipobject(("NOSUCHUSER", "x"), &url, &h, &[], "hipobj", now).await;
    refused(&r, 403, "InvalidAccessKeyId", "unknown user");
    let skewed = now - Duration::from_secs(3600);
    let r = send_as_hipobject(ADMIN, &url, &h, &[], "hipobj", skewed).await;
    refused(&r, 403, "RequestTimeTooSkewed", "an hour behind");
    let ahead = now + Duration::from_secs(3600);
    let r = send_as_hipobject(ADMIN, &url, &h, &[], "hipobj", ahead).await;
    refused(&r, 403, "RequestTimeTooSkewed", "an hour ahead");
    let r = send_as_hipobject(
        ADMIN,
        &url,
        &h[..6],
        &[("x-amz-rdma-size", "1")],
        "hipobj",
        now,
    )
    .await;
    refused(&r, 403, "AccessDenied", "an x-amz-* header not signed");
    let r = send_as_hipobject(ADMIN, &url, &h, &[], "iam", now).await;
    refused(&r, 403, "AccessDenied", "another service");
    // A header changed after signing.
    let mut changed = hipobject_headers(ADMIN, &url, &h, "hipobj", now);
    for (k, v) in &mut changed {
        if k == "x-amz-rdma-target" {
            *v = "/b/other".into();
        }
    }
    let r = send_headers(&url, &changed, Bytes::new()).await;
    refused(
        &r,
        403,
        "SignatureDoesNotMatch",
        "a header changed after signing",
    );
    // Unsigned: refused before anything.
    let r = raw("POST", &url, &h, Bytes::new()).await;
    refused(&r, 403, "AccessDenied", "unsigned");
    // Another user's signature over the same headers verifies as that user.
    let r = send_as_hipobject(OTHER, &url, &h, &[], "hipobj", now).await;
    assert_eq!(r.status, 501, "{}", r.text());
    // A body: refused, whatever the signature.
    let signed = hipobject_headers(ADMIN, &url, &h, "hipobj", now);
    let r = send_headers(&url, &signed, Bytes::from_static(b"x")).await;
    refused(&r, 400, "InvalidRequest", "a body");
    // A presigned URL is no control request's signature.
    let presigned = format!(
        "{url}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={}%2F20260101%2Fus-east-1%2Fhipobj%2Faws4_request&X-Amz-Date=20260101T000000Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Signature={}",
        ADMIN.0,
        "0".repeat(64)
    );
    let r = raw("POST", &presigned, &[], Bytes::new()).await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.header("x-amz-rdma-protocol-status").is_none());
}

/// GET and PUT of 1 B, 4 KiB, 1 MiB + 3 and 64 MiB, a GET at an offset, an
/// UploadPart, and an object larger than one transfer read in several
/// transfers: bytes compared by SHA-256 with what plain S3 stores.
#[tokio::test]
async fn hipobj_transfers_on_verbs() {
    let Some(domain) = verbs() else { return };
    let s = server(Backend::Verbs, "");
    crate::support::mkbucket(&s.admin(), "hipobj-v")
        .await
        .unwrap();
    let big = 64 << 20;
    for (i, len) in [1usize, 4096, (1 << 20) + 3, big].into_iter().enumerate() {
        let d = data(len, 100 + i as u64);
        // PUT over hipobj, read back over S3.
        let key = format!("put/{len} bytes ü");
        let target = format!(
            "/hipobj-v/{}",
            key.replace(' ', "%20").replace('ü', "%C3%BC")
        );
        let pc = Client::new(&domain, len);
        pc.mem.write_at(0, &d).unwrap();
        let r = pc.put(&s, &target, len as u64).await;
        let stored = sdk_get(&s, "hipobj-v", &key).await.expect("stored");
        assert_eq!(sha(&stored), sha(&d), "PUT of {len} bytes");
        let etag = r.header("x-amz-rdma-etag").expect("an ETag");
        assert_eq!(etag.trim_matches('"'), common::md5_hex(&d));
        // GET over hipobj of an object written over S3.
        let gkey = format!("get-{len}");
        sdk_put(&s, "hipobj-v", &gkey, d.clone()).await;
        let gc = Client::new(&domain, len);
        gc.get(&s, &format!("/hipobj-v/{gkey}"), len as u64, 0)
            .await;
        assert_eq!(
            sha(&gc.mem.as_slice().to_vec().unwrap()[..len]),
            sha(&d),
            "GET of {len} bytes"
        );
    }
    // A range by offset, and an object read as three transfers.
    let d = data(3 * (1 << 20) + 17, 9);
    sdk_put(&s, "hipobj-v", "multi", d.clone()).await;
    let gc = Client::new(&domain, 4096);
    gc.get(&s, "/hipobj-v/multi", 4096, 12_345).await;
    assert_eq!(
        gc.mem.as_slice().to_vec().unwrap(),
        &d[12_345..12_345 + 4096]
    );
    let mut whole = Vec::new();
    let step = (1 << 20) + 7;
    let mut off = 0;
    while off < d.len() {
        let n = step.min(d.len() - off);
        let c = Client::new(&domain, n);
        c.get(&s, "/hipobj-v/multi", n as u64, off as u64).await;
        whole.extend(c.mem.as_slice().to_vec().unwrap());
        off += n;
    }
    assert_eq!(sha(&whole), sha(&d), "several transfers make the object");
    // UploadPart through the target's query.
    let up = s
        .admin()
        .create_multipart_upload()
        .bucket("hipobj-v")
        .key("mpu")
        .send()
        .await
        .unwrap();
    let id = up.upload_id().unwrap().to_owned();
    let part = data(5 << 20, 77);
    let pc = Client::new(&domain, part.len());
    pc.mem.write_at(0, &part).unwrap();
    let r = pc
        .put(
            &s,
            &format!("/hipobj-v/mpu?uploadId={id}&partNumber=1"),
            part.len() as u64,
        )
        .await;
    let etag = r.header("x-amz-rdma-etag").unwrap().to_owned();
    let done = aws_sdk_s3::types::CompletedMultipartUpload::builder()
        .parts(
            aws_sdk_s3::types::CompletedPart::builder()
                .part_number(1)
                .e_tag(etag)
                .build(),
        )
        .build();
    s.admin()
        .complete_multipart_upload()
        .bucket("hipobj-v")
        .key("mpu")
        .upload_id(&id)
        .multipart_upload(done)
        .send()
        .await
        .unwrap();
    assert_eq!(sdk_get(&s, "hipobj-v", "mpu").await.unwrap(), part);
}

/// The refusals, with the statuses the dialect's peers use.
#[tokio::test]
async fn hipobj_refusals_on_verbs() {
    let Some(domain) = verbs() else { return };
    let s = server(
        Backend::Verbs,
        "    max_sessions_per_user: 2\n    prepared_timeout_secs: 2\n    transfer_timeout_secs: 3\n",
    );
    crate::support::mkbucket(&s.admin(), "hipobj-r")
        .await
        .unwrap();
    sdk_put(&s, "hipobj-r", "k", data(10_000, 1)).await;
    let c = Client::new(&domain, 10_000);

    // No protocol header: 501 with the marker; a size over 2^31 - 1: 413;
    // past the object's end: 416; a missing object: 404.
    let mut h = c.prepare_headers("GET", "/hipobj-r/k", 10, 0);
    h.retain(|(k, _)| k != "x-amz-rdma-protocol");
    let hs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = control(&s, ADMIN, "prepare", &hs, &[]).await;
    assert_eq!(
        (r.status, r.header("x-amz-rdma-protocol-status")),
        (501, Some("unsupported"))
    );
    let r = Client::new(&domain, 1)
        .prepare(&s, ADMIN, "GET", "/hipobj-r/k", 1 << 31, 0)
        .await;
    assert_eq!(r.status, 413, "{}", r.text());
    let r = Client::new(&domain, 1)
        .prepare(&s, ADMIN, "GET", "/hipobj-r/k", 10, 9_995)
        .await;
    assert_eq!(r.status, 416, "{}", r.text());
    let r = Client::new(&domain, 1)
        .prepare(&s, ADMIN, "GET", "/hipobj-r/none", 10, 0)
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
    // A user without read access to the bucket: the store's 403.
    let r = Client::new(&domain, 1)
        .prepare(&s, common::READER, "GET", "/hipobj-r/k", 10, 0)
        .await;
    assert_eq!(r.status, 403, "{}", r.text());
    // Another S3 user of this server without WRITE on the bucket cannot
    // write into it through the dialect (the bucket rule s3s's hook runs
    // for an HTTP PUT), as a PUT or an UploadPart: 403 at PREPARE, before
    // any queue pair or staging memory.
    let sessions_before = hipobj_sessions(&s).await;
    for target in ["/hipobj-r/intruder", "/hipobj-r/k?partNumber=1&uploadId=x"] {
        let r = Client::new(&domain, 1)
            .prepare(&s, common::READER, "PUT", target, 10, 0)
            .await;
        assert_eq!(r.status, 403, "{target}: {}", r.text());
    }
    assert_eq!(hipobj_sessions(&s).await, sessions_before);
    assert!(sdk_get(&s, "hipobj-r", "intruder").await.is_none());
    // A target whose allowed networks do not hold the client's GID sends
    // nothing there: 403 before any queue pair is made.
    let narrow = server_for(Backend::Verbs, "[192.0.2.0/24]", "");
    crate::support::mkbucket(&narrow.admin(), "hipobj-n")
        .await
        .unwrap();
    sdk_put(&narrow, "hipobj-n", "k", data(100, 2)).await;
    let r = Client::new(&domain, 1)
        .prepare(&narrow, ADMIN, "GET", "/hipobj-n/k", 10, 0)
        .await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("allowed_client_networks"), "{}", r.text());
    // The same client QP and PSN twice: 409.
    let a = Client::new(&domain, 10);
    let r = a.prepare(&s, ADMIN, "GET", "/hipobj-r/k", 10, 0).await;
    let sa = a.connect(&r);
    let r = a.prepare(&s, ADMIN, "GET", "/hipobj-r/k", 10, 0).await;
    assert_eq!(r.status, 409, "{}", r.text());

    // Another user's session: 403, and it is still there for its owner.
    let r = a.ready(&s, OTHER, &sa).await;
    assert_eq!(r.status, 403, "{}", r.text());
    // A CANCEL by another user: 204 and nothing happens.
    let cancel = |session: String, user| {
        let s = &s;
        async move {
            control(
                s,
                user,
                "cancel",
                &[
                    ("x-amz-rdma-protocol", "hipobj-rc-v2"),
                    ("x-amz-rdma-session", &session),
                ],
                &[],
            )
            .await
        }
    };
    assert_eq!(cancel(sa.clone(), OTHER).await.status, 204);
    // A wrong cookie: 403, and the session is gone (409 after).
    let wrong = Client {
        cookie: a.cookie ^ 1,
        ..Client::new(&domain, 10)
    };
    let mut h = wrong.ready_headers(&sa, true);
    h.retain(|(k, _)| k != "x-amz-rdma-qpn");
    h.push(("x-amz-rdma-qpn".into(), format!("{:x}", a.qp.local().qpn)));
    let hs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = control(&s, ADMIN, "ready", &hs, &[]).await;
    assert_eq!(r.status, 403, "{}", r.text());
    let r = a.ready(&s, ADMIN, &sa).await;
    assert_eq!(r.status, 409, "{}", r.text());
    // Unknown sessions: READY 409, CANCEL 204.
    let unknown = "0".repeat(32);
    assert_eq!(a.ready(&s, ADMIN, &unknown).await.status, 409);
    assert_eq!(cancel(unknown.clone(), ADMIN).await.status, 204);
    assert_eq!(cancel("not-hex".into(), ADMIN).await.status, 204);

    // The per-user cap: two sessions held, the third is 503; a cancel
    // frees one.
    let x = Client::new(&domain, 10);
    let sx = x.connect(&x.prepare(&s, ADMIN, "GET", "/hipobj-r/k", 10, 0).await);
    let y = Client::new(&domain, 10);
    let sy = y.connect(&y.prepare(&s, ADMIN, "GET", "/hipobj-r/k", 10, 0).await);
    let z = Client::new(&domain, 10);
    let r = z.prepare(&s, ADMIN, "GET", "/hipobj-r/k", 10, 0).await;
    assert_eq!(r.status, 503, "{}", r.text());
    // Another user is not held back by this one's sessions.
    let o = Client::new(&domain, 10);
    let r = o.prepare(&s, OTHER, "GET", "/hipobj-r/k", 10, 0).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(cancel(sx, ADMIN).await.status, 204);
    let z2 = Client::new(&domain, 10);
    let r = z2.prepare(&s, ADMIN, "GET", "/hipobj-r/k", 10, 0).await;
    let sz = z2.connect(&r);

    // A duplicate READY while one runs: the first wins, the second is 409.
    let recv = y.qp.post_recv().unwrap();
    let (r1, r2) = tokio::join!(y.ready(&s, ADMIN, &sy), y.ready(&s, ADMIN, &sy));
    let mut statuses = [r1.status, r2.status];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 409], "{} / {}", r1.text(), r2.text());
    recv.await.unwrap();

    // A prepared session nobody readies is reaped after its deadline.
    drop(z2);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(a.ready(&s, ADMIN, &sz).await.status, 409, "reaped");

    // A PUT whose client dies before writing: READY times out (408),
    // nothing is stored.
    let p = Client::new(&domain, 1000);
    let r = p
        .prepare(&s, ADMIN, "PUT", "/hipobj-r/never", 1000, 0)
        .await;
    let sp = p.connect(&r);
    let r = p.ready(&s, ADMIN, &sp).await;
    assert_eq!(r.status, 408, "{}", r.text());
    assert!(
        sdk_get(&s, "hipobj-r", "never").await.is_none(),
        "nothing stored"
    );
    // A PUT whose WRITE is shorter than announced: refused, nothing stored.
    let short = Client::new(&domain, 1000);
    let r = short
        .prepare(&s, ADMIN, "PUT", "/hipobj-r/short", 1000, 0)
        .await;
    let ss = short.connect(&r);
    let addr = hex_header(&r, "x-amz-rdma-mr-addr");
    let rkey = u32::try_from(hex_header(&r, "x-amz-rdma-mr-rkey")).unwrap();
    let (fin, wrote) = tokio::join!(short.ready(&s, ADMIN, &ss), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        short
            .qp
            .write_with_imm(short.mem.slice(0, 999).unwrap(), addr, rkey, short.cookie)
            .await
    });
    wrote.unwrap();
    assert_eq!(fin.status, 400, "{}", fin.text());
    assert!(
        sdk_get(&s, "hipobj-r", "short").await.is_none(),
        "a short WRITE stores nothing"
    );
    let metrics = reqwest_text(&s.metrics).await;
    for outcome in ["ok", "refused", "expired", "timeout", "cancelled"] {
        assert!(
            metrics.contains(&format!("outcome=\"{outcome}\"")),
            "no {outcome} session counted:\n{metrics}"
        );
    }
}

/// The server answers from a GID of the client's kind (the only kind the
/// client's GID can reach): a link-local client (rxe0's fe80:: GID) gets a
/// link-local server GID and its bytes, an IPv4-mapped one an IPv4-mapped
/// GID; a link-local GID outside `allowed_client_networks` is refused.
#[tokio::test]
async fn hipobj_answers_from_a_gid_of_the_clients_kind() {
    let Some(domain) = verbs() else { return };
    let s = server_for(Backend::Verbs, "[127.0.0.0/8, 10.0.0.0/8, 'fe80::/10']", "");
    crate::support::mkbucket(&s.admin(), "hipobj-k")
        .await
        .unwrap();
    let d = data(70_000, 5);
    sdk_put(&s, "hipobj-k", "k", d.clone()).await;
    for kind in [GidKind::LinkLocal, GidKind::Ipv4Mapped] {
        let c = Client::with_gid(&domain, d.len(), Some(kind));
        assert_eq!(GidKind::of(&c.qp.local().gid), kind);
        let r = c
            .prepare(&s, ADMIN, "GET", "/hipobj-k/k", d.len() as u64, 0)
            .await;
        assert_eq!(r.status, 200, "{kind:?}: {}", r.text());
        let (_, server_gid) = reply_token(&r);
        assert_eq!(GidKind::of(&server_gid), kind, "the server's GID kind");
        let session = c.connect(&r);
        let recv = c.qp.post_recv().unwrap();
        let fin = c.ready(&s, ADMIN, &session).await;
        assert_eq!(fin.status, 200, "{kind:?}: {}", fin.text());
        let got = tokio::time::timeout(Duration::from_secs(30), recv)
            .await
            .expect("the WRITE_WITH_IMM arrives")
            .expect("a successful receive");
        assert_eq!(got.imm, Some(c.cookie));
        check_final(&fin, c.cookie, d.len() as u64);
        assert_eq!(
            sha(&c.mem.as_slice().to_vec().unwrap()),
            sha(&d),
            "{kind:?}"
        );
    }
    // The default networks (loopback, 10/8) do not hold fe80::/10.
    let narrow = server(Backend::Verbs, "");
    let r = Client::with_gid(&domain, 1, Some(GidKind::LinkLocal))
        .prepare(&narrow, ADMIN, "GET", "/hipobj-k/k", 1, 0)
        .await;
    assert_eq!(r.status, 403, "{}", r.text());
}

/// What the server's metrics say its hipobj-rc-v2 sessions hold now:
/// (sessions, staging bytes).
async fn hipobj_sessions(s: &Server) -> (u64, u64) {
    let text = reqwest_text(&s.metrics).await;
    let gauge = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .expect("the gauge is exported") as u64
    };
    (
        gauge("s3dma_storage_target_hipobj_sessions"),
        gauge("s3dma_storage_target_hipobj_staging_bytes"),
    )
}

/// A gateway (`store: s3`, with its RDMA cache) in front of a filesystem
/// target serves hipobj-rc-v2 too: a GET reads through the gateway from
/// the upstream, a PUT lands upstream, and the gateway's own access rule
/// (the operator's bucket grants) refuses what HTTP would.
#[tokio::test]
async fn hipobj_through_a_gateway_on_verbs() {
    let Some(domain) = verbs() else { return };
    let upstream = Server::start();
    crate::support::mkbucket(&upstream.admin(), "hipobj-g")
        .await
        .unwrap();
    let d = data((1 << 20) + 3, 41);
    sdk_put(&upstream, "hipobj-g", "read-me", d.clone()).await;
    let up = upstream.endpoint.clone();
    let gw = fabric_server(move |key_file| {
        format!(
            "store: s3\ndata_dir: ''\nupstream:\n  endpoints: [{up}]\ncache:\n  size: 32MiB\n  chunk_size: 1MiB\nrdma:\n  mode: enabled\n  backend: verbs\n  fabric_key_file: {}\n  allowed_client_networks: [127.0.0.0/8, 10.0.0.0/8]\n  hipobj:\n    enabled: true\n",
            key_file
        )
    });
    // GET through the gateway: the whole object, then a range.
    let gc = Client::new(&domain, d.len());
    gc.get(&gw, "/hipobj-g/read-me", d.len() as u64, 0).await;
    assert_eq!(sha(&gc.mem.as_slice().to_vec().unwrap()), sha(&d));
    let gc = Client::new(&domain, 4096);
    gc.get(&gw, "/hipobj-g/read-me", 4096, 1000).await;
    assert_eq!(gc.mem.as_slice().to_vec().unwrap(), &d[1000..1000 + 4096]);
    // PUT through the gateway: stored upstream.
    let w = data(300_001, 42);
    let pc = Client::new(&domain, w.len());
    pc.mem.write_at(0, &w).unwrap();
    let r = pc.put(&gw, "/hipobj-g/written", w.len() as u64).await;
    let stored = sdk_get(&upstream, "hipobj-g", "written")
        .await
        .expect("stored upstream");
    assert_eq!(sha(&stored), sha(&w));
    let etag = r.header("x-amz-rdma-etag").expect("an ETag");
    assert_eq!(etag.trim_matches('"'), common::md5_hex(&w));
    // A user the gateway's grants give no WRITE (nor READ) on the bucket.
    for op in ["GET", "PUT"] {
        let r = Client::new(&domain, 1)
            .prepare(&gw, common::READER, op, "/hipobj-g/read-me", 10, 0)
            .await;
        assert_eq!(r.status, 403, "{op}: {}", r.text());
    }
    // A missing object: the upstream's 404 through the gateway.
    let r = Client::new(&domain, 1)
        .prepare(&gw, ADMIN, "GET", "/hipobj-g/none", 10, 0)
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
}

async fn reqwest_text(url: &str) -> String {
    raw("GET", url, &[], Bytes::new()).await.text()
}

/// Finding 1 of the third hardening round, as an attack: another S3 user
/// prepares a small PUT of her own, connects her QP and writes, with the
/// victim's real staging address and key (and a guessed neighbour key), at
/// the victim's live PUT. Each session's QP and staging share a protection
/// domain of their own, so the write is a remote access error, nothing
/// lands, and the victim's object holds the victim's bytes. (With one
/// shared PD the write was accepted and the victim stored the attacker's.)
#[tokio::test]
async fn hipobj_a_session_cannot_write_into_another_users_put() {
    let Some(domain) = verbs() else { return };
    let s = server(Backend::Verbs, "");
    common::create_bucket(&s, "victim-b").await;
    s.client(OTHER)
        .create_bucket()
        .bucket("attacker-b")
        .send()
        .await
        .unwrap();
    let len = 64 << 10;
    let victim_bytes = data(len, 1);
    let attacker_bytes = vec![0xa5u8; len];

    // The victim's live PUT: prepared, its staging advertised.
    let victim = Client::new(&domain, len);
    victim.mem.write_at(0, &victim_bytes).unwrap();
    let vr = victim
        .prepare(&s, ADMIN, "PUT", "/victim-b/obj", len as u64, 0)
        .await;
    let vsession = victim.connect(&vr);
    let vaddr = hex_header(&vr, "x-amz-rdma-mr-addr");
    let vrkey = u32::try_from(hex_header(&vr, "x-amz-rdma-mr-rkey")).unwrap();

    // The attacker's own session, on her own QP, and the write at the
    // victim's region: with the real key, then with guessed neighbours.
    for rkey in [vrkey, vrkey.wrapping_add(1), vrkey.wrapping_sub(1)] {
        let attacker = Client::new(&domain, len);
        attacker.mem.write_at(0, &attacker_bytes).unwrap();
        let ar = attacker
            .prepare(&s, OTHER, "PUT", "/attacker-b/mine", len as u64, 0)
            .await;
        let _asession = attacker.connect(&ar);
        let wrote = attacker
            .qp
            .write_with_imm(
                attacker.mem.slice(0, len).unwrap(),
                vaddr,
                rkey,
                victim.cookie,
            )
            .await;
        assert!(
            wrote.is_err(),
            "the attacker's QP wrote into the victim's staging (rkey {rkey:#x})"
        );
    }

    // The victim's own write and READY: her bytes, and only hers, stored.
    let h = victim.ready_headers(&vsession, true);
    let url = s.url("/.hipobj-rc/ready");
    let ready = tokio::spawn(async move {
        let hs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        send_signed(ADMIN, "POST", &url, &hs, &[]).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    victim
        .qp
        .write_with_imm(
            victim.mem.slice(0, len).unwrap(),
            vaddr,
            vrkey,
            victim.cookie,
        )
        .await
        .expect("the victim's own write completes");
    let fin = ready.await.unwrap();
    assert_eq!(fin.status, 200, "{}", fin.text());
    let stored = sdk_get(&s, "victim-b", "obj").await.expect("stored");
    assert_eq!(sha(&stored), sha(&victim_bytes), "the victim's bytes");
}

/// A server on the VM's device with `rdma.tenant_users: [admin]` and
/// `hipobj` lines under `rdma.hipobj:`; buckets `attacker-0..2` of
/// [`OWNER_A`](common::OWNER_A), [`OWNER_B`](common::OWNER_B) and
/// [`OTHER`], and `tenant-b` of [`ADMIN`].
async fn tenant_server(hipobj: &str) -> Server {
    let hipobj = hipobj.to_owned();
    let s = fabric_server(move |key_file| {
        format!(
            "rdma:\n  mode: enabled\n  backend: verbs\n  fabric_key_file: {}\n  allowed_client_networks: [127.0.0.0/8, 10.0.0.0/8]\n  tenant_users: [{}]\n  hipobj:\n    enabled: true\n{hipobj}",
            key_file, ADMIN.0
        )
    });
    for (i, u) in ATTACKERS.iter().enumerate() {
        s.client(*u)
            .create_bucket()
            .bucket(format!("attacker-{i}"))
            .send()
            .await
            .unwrap();
    }
    common::create_bucket(&s, "tenant-b").await;
    s
}

/// Users that are not tenants.
const ATTACKERS: [(&str, &str); 3] = [common::OWNER_A, common::OWNER_B, OTHER];

/// A PUT PREPARE of `size` bytes at `target` by `user` from a fresh QP
/// (kept alive with the reply).
async fn put_prepare(
    domain: &Domain,
    s: &Server,
    user: (&str, &str),
    target: &str,
    size: u64,
) -> (Client, Raw) {
    let c = Client::new(domain, 1);
    let r = c.prepare(s, user, "PUT", target, size, 0).await;
    (c, r)
}

fn assert_unsupported(r: &Raw) {
    assert_eq!(
        (r.status, r.header("x-amz-rdma-protocol-status")),
        (501, Some("unsupported")),
        "{}",
        r.text()
    );
}

/// Finding 4 of the third hardening round, as an attack: users that are
/// not tenants hold idle sessions and big PUT staging up to the server's
/// caps, and the tenant's user got 503 (the agent falls back to HTTP only
/// on 501). Now the users outside `rdma.tenant_users` are one class capped
/// at `max_shared_sessions` / `max_shared_staging_bytes`: past it they get
/// 501 with the unsupported marker (HTTP fallback), the tenant's user
/// still gets sessions, and a user at its own cap still gets 503. (Before,
/// the third attacker's sessions were admitted until `max_sessions`, and
/// the tenant's user was refused with 503.)
#[tokio::test]
async fn hipobj_sessions_and_staging_keep_a_reserve_for_tenants() {
    let Some(domain) = verbs() else { return };
    // The shared class's caps are left at their defaults (half of each
    // pool): only `tenant_users` and the pools are configured.
    let s = tenant_server("    max_sessions: 8\n    max_sessions_per_user: 2\n").await;
    // Two attackers fill the shared class's 4 sessions (2 each, idle).
    let mut held = Vec::new();
    for (i, user) in ATTACKERS.iter().enumerate().take(2) {
        for k in 0..2 {
            let target = format!("/attacker-{i}/k{k}");
            let (c, r) = put_prepare(&domain, &s, *user, &target, 10).await;
            assert_eq!(r.status, 200, "{}", r.text());
            held.push(c);
        }
    }
    // The first attacker is at its own cap: 503, retry later.
    let (_c, r) = put_prepare(&domain, &s, ATTACKERS[0], "/attacker-0/k9", 10).await;
    assert_eq!(r.status, 503, "{}", r.text());
    // The third attacker: the class is out of slots, 501 with the marker,
    // every time.
    for k in 0..3 {
        let target = format!("/attacker-2/k{k}");
        let (_c, r) = put_prepare(&domain, &s, ATTACKERS[2], &target, 10).await;
        assert_unsupported(&r);
    }
    // The tenant's user gets the reserve.
    for k in 0..2 {
        let target = format!("/tenant-b/k{k}");
        let (c, r) = put_prepare(&domain, &s, ADMIN, &target, 10).await;
        assert_eq!(r.status, 200, "tenant session {k}: {}", r.text());
        held.push(c);
    }

    // Staging (the class's default cap: half of 4 MiB): one attacker's two
    // 1 MiB PUTs fill it; its third is past its own 2 MiB (503), another
    // attacker's 1 MiB gets 501, the tenant's 2 MiB are prepared.
    let s2 =
        tenant_server("    max_staging_bytes: 4MiB\n    max_staging_bytes_per_user: 2MiB\n").await;
    let mib = 1 << 20;
    for k in 0..2 {
        let target = format!("/attacker-0/big{k}");
        let (c, r) = put_prepare(&domain, &s2, ATTACKERS[0], &target, mib).await;
        assert_eq!(r.status, 200, "{}", r.text());
        held.push(c);
    }
    let (_c, r) = put_prepare(&domain, &s2, ATTACKERS[0], "/attacker-0/more", mib).await;
    assert_eq!(r.status, 503, "{}", r.text());
    let (_c, r) = put_prepare(&domain, &s2, ATTACKERS[1], "/attacker-1/big", mib).await;
    assert_unsupported(&r);
    let (_c, r) = put_prepare(&domain, &s2, ADMIN, "/tenant-b/big", 2 * mib).await;
    assert_eq!(r.status, 200, "the tenant's PUT: {}", r.text());
}

/// Finding 6e of the third hardening round, as an attack: another writer
/// of a bucket prepares an UploadPart into the owner's upload. UploadPart's
/// initiator rule (its initiator or the bucket's owner) now runs at
/// PREPARE: 403 before any queue pair, staging or cap is held (the
/// sessions gauge does not move) and before any byte moves; the
/// initiator's own PREPARE is served. (Before, the PREPARE was admitted
/// and refused only at READY, after the WRITE.)
#[tokio::test]
async fn hipobj_upload_part_into_another_users_upload_is_refused_at_prepare() {
    let Some(domain) = verbs() else { return };
    use storage_target::config::default_canonical_id;
    let s = server(Backend::Verbs, "");
    // A bucket of OWNER_A where OWNER_B may write (bucket ACL), and
    // OWNER_A's upload in it.
    let (a, b) = (common::OWNER_A, common::OWNER_B);
    let owner = s.client(a);
    crate::support::mkbucket(&owner, "hipobj-mpu")
        .await
        .unwrap();
    owner
        .put_bucket_acl()
        .bucket("hipobj-mpu")
        .grant_full_control(format!("id=\"{}\"", default_canonical_id(a.0)))
        .grant_write(format!("id=\"{}\"", default_canonical_id(b.0)))
        .send()
        .await
        .unwrap();
    let id = crate::support::start_upload(&owner, "hipobj-mpu", "obj").await;
    let target = format!("/hipobj-mpu/obj?partNumber=1&uploadId={id}");
    let before = hipobj_sessions(&s).await;
    let intruder = Client::new(&domain, 1000);
    let r = intruder.prepare(&s, b, "PUT", &target, 1000, 0).await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.header("x-amz-rdma-session").is_none());
    assert_eq!(hipobj_sessions(&s).await, before, "nothing was held");
    // An upload that does not exist: 404 at PREPARE too.
    let r = Client::new(&domain, 1)
        .prepare(
            &s,
            a,
            "PUT",
            "/hipobj-mpu/obj?partNumber=1&uploadId=0123",
            10,
            0,
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
    // The initiator's own part is prepared.
    let own = Client::new(&domain, 1000);
    let r = own.prepare(&s, a, "PUT", &target, 1000, 0).await;
    assert_eq!(r.status, 200, "{}", r.text());
}
