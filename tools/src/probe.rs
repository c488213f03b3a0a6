//! `s3dma-tools probe --endpoint URL`: what an S3 server answers to each
//! S3-over-RDMA dialect, checked from a host or a DPU before a target is
//! configured for it.
//!
//! With the S3 user's key (`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`)
//! and a bucket it may write, the probe:
//! 1. PUTs a test object over HTTP and GETs it back, bytes compared;
//! 2. HEADs it with a token (the reply rules: the object's real length,
//!    never 0);
//! 3. sends a cuObject (DC) token naming a DC target that does not exist
//!    (192.0.2.1, a documentation address): on a GET a server that does
//!    not serve it must answer `x-amz-rdma-reply: 501` with the object in
//!    the body; on a PUT it must store nothing;
//! 4. sends a hipobj-rc-v2 PREPARE: `501` with
//!    `x-amz-rdma-protocol-status: unsupported` means the server does not
//!    speak it; otherwise, with `--fabric verbs` and a device here, one GET
//!    and one PUT transfer of the test object run on a queue pair of this
//!    host's, bytes compared, with each reply's headers printed;
//! 5. deletes what it wrote.
//!
//! Every request has a deadline (`--timeout`, 30 s by default: connect,
//! send and the whole reply) and every reply body a bound: a GET of the
//! test object may bring its size plus [`BODY_MARGIN`], any other reply
//! [`CONTROL_BODY_MAX`]; a reply that announces or sends more ends the
//! probe with an error saying so, after reading no more than the bound.
//! The probe exists to meet unknown servers, so it never waits on one
//! forever nor buffers what one chooses to send.
//!
//! Each line says what was sent, what came back and what it means; the
//! exit status is 1 when a server broke a rule a client relies on (a
//! tokened reply without `x-amz-rdma-reply` taken for a success, an empty
//! object stored for a declined PUT, a HEAD of length 0, bytes that differ).
//! Where a reply differs from the draft "RDMA for S3" in a way a known peer
//! does, a `peer` line names that peer's rule (`peer_rule`: e.g. "declines
//! GET with an empty 501, as elbencho's s3rdma-server does"), so a report
//! says which server's behaviour it met, not only which rule broke.

use std::time::{Duration, SystemTime};

use anyhow::{Context as _, anyhow, bail};
use bytes::Bytes;
use http_body_util::BodyExt as _;
use s3dma_launcher::Backend;
use sha2::Digest as _;

/// What `probe` was asked for.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// The server's S3 endpoint (`http(s)://host:port`).
    pub endpoint: String,
    /// A bucket the key may write (created when missing).
    pub bucket: String,
    /// SigV4 region.
    pub region: String,
    /// Bytes of the test object.
    pub size: usize,
    /// `verbs`: run real hipobj-rc-v2 transfers on this host's device.
    pub fabric: Backend,
    /// The deadline of each request (connect, send, the whole reply).
    pub timeout: Duration,
    /// `--path-mtu`: the queue pairs' path MTU is the lower of it and the
    /// port's active MTU (`None`: the active MTU).
    pub path_mtu: Option<fabric::config::PathMtu>,
    /// The S3 key.
    pub access_key_id: String,
    /// Its secret.
    pub secret_access_key: String,
}

/// The most a reply other than a GET of the test object may carry (S3
/// error documents, control replies): 1 MiB.
pub(crate) const CONTROL_BODY_MAX: usize = 1 << 20;
/// What a GET of the test object may carry beyond the object's size.
pub(crate) const BODY_MARGIN: usize = 64 << 10;

/// The body bound of a request: the test object's size plus a margin for a
/// GET, [`CONTROL_BODY_MAX`] for anything else.
fn body_limit(method: &str, object_size: usize) -> usize {
    if method == "GET" {
        object_size
            .saturating_add(BODY_MARGIN)
            .max(CONTROL_BODY_MAX)
    } else {
        CONTROL_BODY_MAX
    }
}

/// A raw reply.
struct Reply {
    status: u16,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The `x-amz-rdma-*` headers, for the report.
    fn rdma_headers(&self) -> String {
        let mut v: Vec<String> = self
            .headers
            .iter()
            .filter(|(k, _)| k.as_str().starts_with("x-amz-rdma-"))
            .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or("?")))
            .collect();
        v.sort();
        if v.is_empty() {
            "no x-amz-rdma-* header".to_owned()
        } else {
            v.join(", ")
        }
    }

    /// The S3 error code in the body, if any.
    fn code(&self) -> Option<String> {
        let t = String::from_utf8_lossy(&self.body);
        let a = t.find("<Code>")? + 6;
        let b = t[a..].find("</Code>")? + a;
        Some(t[a..b].to_owned())
    }
}

/// SigV4-signed raw requests: every header given is signed.
struct Signer<'a> {
    opts: &'a Options,
    http: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<Bytes>,
    >,
}

impl Signer<'_> {
    async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> anyhow::Result<Reply> {
        use aws_sigv4::http_request::{
            PayloadChecksumKind, SignableBody, SignableRequest, SigningSettings, sign,
        };
        let url = format!("{}{path}", self.opts.endpoint.trim_end_matches('/'));
        let identity = aws_credential_types::Credentials::new(
            &self.opts.access_key_id,
            &self.opts.secret_access_key,
            None,
            None,
            "s3dma-probe",
        )
        .into();
        // hipobj-rc-v2's control requests are signed as hipObject's v2
        // client signs them (service `hipobj`, no `x-amz-content-sha256`),
        // so the probe checks that a server takes the peer as published.
        let control = path
            .strip_prefix('/')
            .and_then(|p| p.strip_prefix(s3dma_wire::hipobj::CONTROL_BUCKET))
            .is_some_and(|rest| rest.starts_with('/'));
        let mut settings = SigningSettings::default();
        settings.payload_checksum_kind = if control {
            PayloadChecksumKind::NoHeader
        } else {
            PayloadChecksumKind::XAmzSha256
        };
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.opts.region)
            .name(if control { "hipobj" } else { "s3" })
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .context("signing parameters")?
            .into();
        let host = url
            .split('/')
            .nth(2)
            .ok_or_else(|| anyhow!("{url} has no host"))?
            .to_owned();
        let mut all: Vec<(String, String)> = vec![("host".into(), host)];
        all.extend(
            headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let signable = SignableRequest::new(
            method,
            &url,
            all.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            SignableBody::Bytes(&body),
        )
        .context("a signable request")?;
        let (instructions, _) = sign(signable, &params).context("signing")?.into_parts();
        let (extra, _) = instructions.into_parts();
        let mut req = http::Request::builder().method(method).uri(&url);
        for (k, v) in all.iter().filter(|(k, _)| k != "host") {
            req = req.header(k, v);
        }
        for h in extra {
            req = req.header(h.name(), h.value());
        }
        let req = req.body(http_body_util::Full::new(body))?;
        let limit = body_limit(method, self.opts.size);
        // A HEAD's Content-Length is the object's, with no body behind it.
        let announced_counts = method != "HEAD";
        let timeout = self.opts.timeout;
        match tokio::time::timeout(timeout, self.exchange(req, limit, announced_counts)).await {
            Ok(r) => r.with_context(|| format!("{method} {url}")),
            Err(_) => bail!(
                "{method} {url}: no complete reply within {} (--timeout)",
                humantime::format_duration(timeout)
            ),
        }
    }

    /// Sends `req` and reads its reply, refusing a body over `limit` bytes
    /// (sent, or announced by Content-Length where `announced_counts`: not
    /// for a HEAD, whose Content-Length is the object's).
    async fn exchange(
        &self,
        req: http::Request<http_body_util::Full<Bytes>>,
        limit: usize,
        announced_counts: bool,
    ) -> anyhow::Result<Reply> {
        let resp = self.http.request(req).await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let announced = headers
            .get(http::header::CONTENT_LENGTH)
            .filter(|_| announced_counts)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(n) = announced
            && n > limit as u64
        {
            bail!(
                "HTTP {status}: the reply announces a {n}-byte body, over the probe's bound of {limit} bytes for this request"
            );
        }
        let body = http_body_util::Limited::new(resp.into_body(), limit)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    anyhow!(
                        "HTTP {status}: the reply body went over the probe's bound of {limit} bytes for this request"
                    )
                } else {
                    anyhow!("reading the reply body: {e}")
                }
            })?
            .to_bytes();
        Ok(Reply {
            status,
            headers,
            body,
        })
    }
}

/// A cuObject token naming a DC target nobody has: addr 0x1000, `size`
/// bytes, rkey 1, LID 0, DCT 1, an IPv4-mapped GID of 192.0.2.1.
fn dc_token(size: usize) -> String {
    format!(
        "{:016x}:{:08x}:{:08x}:{:04x}:{:06x}:1:{}",
        0x1000u64, size, 1u32, 0u16, 1u32, "00000000000000000000ffffc0000201"
    )
}

fn sha(b: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(b))
}

/// What the probe found; `broken` lists the rules the server broke.
#[derive(Debug, Default)]
struct Findings {
    broken: Vec<String>,
}

impl Findings {
    fn ok(&self, what: &str, detail: &str) {
        println!("ok      {what}: {detail}");
    }

    fn info(&self, what: &str, detail: &str) {
        println!("info    {what}: {detail}");
    }

    fn broken(&mut self, what: &str, detail: &str) {
        println!("BROKEN  {what}: {detail}");
        self.broken.push(what.to_owned());
    }

    /// The peer rule `r` follows at `step`, if it differs from the draft
    /// in a way a known peer does.
    fn peer(&self, what: &str, step: Step, r: &Reply, stored: Option<u64>) {
        if let Some(rule) = peer_rule(step, r, stored) {
            println!("peer    {what}: {rule}");
        }
    }
}

/// Where in the probe a reply came back, for [`peer_rule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// A GET carrying a cuObject token for a DC target nobody has.
    DcGet,
    /// A PUT carrying that token.
    DcPut,
    /// A hipobj-rc-v2 PREPARE.
    Prepare,
}

/// The rule of a known peer that a reply at `step` follows where it
/// differs from the draft "RDMA for S3" (`stored`: the size of what a
/// tokened PUT left, if anything). The draft: a declined GET carries the
/// object in its body (200/206 with `x-amz-rdma-reply: 501`), a declined
/// PUT stores nothing, a dialect not spoken answers 501 with
/// `x-amz-rdma-protocol-status: unsupported`, PREPARE's reply token is
/// `200:<token>`. `None`: the draft's rule, or no peer known to differ so.
fn peer_rule(step: Step, r: &Reply, stored: Option<u64>) -> Option<&'static str> {
    let reply = r.header("x-amz-rdma-reply");
    match step {
        Step::DcGet if reply == Some("501") && r.body.is_empty() => {
            Some("declines GET with an empty 501, as elbencho's s3rdma-server does")
        }
        Step::DcGet if reply.is_none() && r.status == 200 => Some(
            "ignores x-amz-rdma-token and serves the body, as a plain S3 server does \
             (moto; Ceph RGW and MinIO without their RDMA builds)",
        ),
        Step::DcPut if reply.is_none() && stored == Some(0) => Some(
            "ignores x-amz-rdma-token and stores the empty body, as a plain S3 server does \
             (moto; Ceph RGW and MinIO without their RDMA builds)",
        ),
        Step::Prepare
            if r.status == 501
                && r.header(s3dma_wire::hipobj::header::PROTOCOL_STATUS)
                    .is_none() =>
        {
            Some(
                "answers an unknown control route with a bare 501 (no \
                 x-amz-rdma-protocol-status), as a plain S3 server does: a hipobj-rc-v2 \
                 client neither transfers nor falls back",
            )
        }
        Step::Prepare
            if r.status == 200
                && r.header("x-amz-rdma-reply")
                    .is_some_and(|v| v.starts_with("200 ")) =>
        {
            Some(
                "answers PREPARE with the older `200 <token>` spelling of the reply \
                 (hipObject's first v2 servers), which clients accept beside `200:<token>`",
            )
        }
        _ => None,
    }
}

/// Runs the probe; an error is a probe that could not run (no server, no
/// access), a broken rule is reported and makes the result an error too.
pub(crate) async fn run(opts: Options) -> anyhow::Result<()> {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_connect_timeout(Some(opts.timeout));
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(connector);
    let s = Signer { opts: &opts, http };
    let mut f = Findings::default();
    let bucket = &opts.bucket;
    let key = format!("s3dma-probe/{:016x}", rand::random::<u64>());
    let payload: Vec<u8> = (0..opts.size).map(|_| rand::random::<u8>()).collect();
    println!(
        "probe   {}: bucket {bucket}, test object {key} ({} bytes)",
        opts.endpoint, opts.size
    );

    // 1. Plain HTTP.
    let r = s
        .send("PUT", &format!("/{bucket}"), &[], Bytes::new())
        .await?;
    if !matches!(r.status, 200 | 409) {
        bail!(
            "creating bucket {bucket}: HTTP {} {}",
            r.status,
            r.code().unwrap_or_default()
        );
    }
    let path = format!("/{bucket}/{key}");
    let r = s
        .send("PUT", &path, &[], Bytes::from(payload.clone()))
        .await?;
    if r.status != 200 {
        bail!(
            "PUT over HTTP: HTTP {} {}",
            r.status,
            r.code().unwrap_or_default()
        );
    }
    let r = s.send("GET", &path, &[], Bytes::new()).await?;
    if r.status == 200 && sha(&r.body) == sha(&payload) {
        f.ok("HTTP", "PUT and GET of the test object, bytes compared");
    } else {
        f.broken(
            "HTTP",
            &format!("GET answered {} with other bytes", r.status),
        );
    }

    let token = dc_token(opts.size);
    // 2. A HEAD carrying a token reports the object's length.
    let r = s
        .send("HEAD", &path, &[("x-amz-rdma-token", &token)], Bytes::new())
        .await?;
    match r.header("content-length") {
        Some(n) if n == opts.size.to_string() => f.ok(
            "HEAD with a token",
            &format!("Content-Length {n}, the object's length"),
        ),
        other => f.broken(
            "HEAD with a token",
            &format!(
                "HTTP {}, Content-Length {other:?} for a {}-byte object (a client would size its buffer from it)",
                r.status, opts.size
            ),
        ),
    }

    // 3. cuObject (DC): a token naming a DC target that does not exist.
    let r = s
        .send("GET", &path, &[("x-amz-rdma-token", &token)], Bytes::new())
        .await?;
    f.peer("cuObject (DC) GET", Step::DcGet, &r, None);
    let reply = r.header("x-amz-rdma-reply").map(str::to_owned);
    match (r.status, reply.as_deref()) {
        (200, Some("501")) if sha(&r.body) == sha(&payload) => f.ok(
            "cuObject (DC) GET",
            &format!("declined ({}), the object in the body", r.rdma_headers()),
        ),
        (_, Some("501")) => f.broken(
            "cuObject (DC) GET",
            &format!("declined, but HTTP {} without the object's bytes", r.status),
        ),
        (_, Some("200" | "206")) => f.broken(
            "cuObject (DC) GET",
            "claims to have written into a DC target that does not exist",
        ),
        (_, None) if r.status == 200 => f.info(
            "cuObject (DC) GET",
            "the token is ignored (no x-amz-rdma-reply): a plain S3 server; a client must treat this as a failure, never as placed bytes",
        ),
        (status, _) => f.info(
            "cuObject (DC) GET",
            &format!(
                "HTTP {status} {}: the server tried the DC target (it speaks the dialect); a real transfer needs an mlx5 device (ConnectX-5 or newer, BlueField) on this host",
                r.code().unwrap_or_default()
            ),
        ),
    }
    let put_key = format!("{path}-dc-put");
    let r = s
        .send(
            "PUT",
            &put_key,
            &[("x-amz-rdma-token", &token), ("content-length", "0")],
            Bytes::new(),
        )
        .await?;
    let head = s.send("HEAD", &put_key, &[], Bytes::new()).await?;
    let stored = head.status == 200;
    let stored_len = head
        .header("content-length")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|_| stored);
    f.peer("cuObject (DC) PUT", Step::DcPut, &r, stored_len);
    match (r.header("x-amz-rdma-reply"), stored) {
        (Some("501"), false) => f.ok(
            "cuObject (DC) PUT",
            &format!("declined ({}), nothing stored", r.rdma_headers()),
        ),
        (_, true) => {
            f.broken(
                "cuObject (DC) PUT",
                &format!(
                    "HTTP {} ({}) and an object was stored: a declined or failed RDMA PUT must store nothing",
                    r.status,
                    r.rdma_headers()
                ),
            );
            let _ = s.send("DELETE", &put_key, &[], Bytes::new()).await;
        }
        (_, false) => f.info(
            "cuObject (DC) PUT",
            &format!(
                "HTTP {} {} ({}), nothing stored",
                r.status,
                r.code().unwrap_or_default(),
                r.rdma_headers()
            ),
        ),
    }

    // 4. hipobj-rc-v2.
    hipobj(&s, &mut f, &opts, &path, &payload).await?;

    // 5. Clean up.
    let _ = s.send("DELETE", &path, &[], Bytes::new()).await;
    if f.broken.is_empty() {
        println!("probe   done: no rule broken");
        Ok(())
    } else {
        bail!(
            "the server broke {} rule(s): {}",
            f.broken.len(),
            f.broken.join(", ")
        )
    }
}

/// The hipobj-rc-v2 part: is the dialect spoken, and with a device here,
/// one GET and one PUT transfer.
async fn hipobj(
    s: &Signer<'_>,
    f: &mut Findings,
    opts: &Options,
    path: &str,
    payload: &[u8],
) -> anyhow::Result<()> {
    use s3dma_wire::hipobj::{self as h, RcToken};
    const WHAT: &str = "hipobj-rc-v2";
    let size = opts.size.to_string();
    let target = path.to_owned();
    if opts.fabric != Backend::Verbs {
        // Whether the dialect is spoken: a PREPARE from a GID nobody has.
        let mut token = RcToken::rc(
            1,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1],
            1,
        );
        token.lid = 0;
        let r = prepare(s, &token.encode(), 1, 0x5eed, "GET", &target, &size).await?;
        f.peer(WHAT, Step::Prepare, &r, None);
        let unsupported = r.status == 501
            && r.header(h::header::PROTOCOL_STATUS)
                .is_some_and(|v| v.eq_ignore_ascii_case("unsupported"));
        if unsupported {
            f.info(
                WHAT,
                "not spoken (501, x-amz-rdma-protocol-status: unsupported)",
            );
        } else if r.status == 200 {
            let session = r.header(h::header::SESSION).unwrap_or_default().to_owned();
            let c = cancel(s, &session).await?;
            f.info(
                WHAT,
                &format!(
                    "spoken (PREPARE 200: {}; the session cancelled: {}); run with --fabric verbs on a host with an RDMA device for a transfer",
                    r.rdma_headers(),
                    c.status
                ),
            );
        } else if r.header(h::header::PROTOCOL).is_some() {
            f.info(
                WHAT,
                &format!(
                    "spoken (PREPARE from a made-up GID answered HTTP {} {}); run with --fabric verbs for a transfer",
                    r.status,
                    r.code().unwrap_or_default()
                ),
            );
        } else {
            f.info(
                WHAT,
                &format!(
                    "not spoken (HTTP {} {}, no dialect headers)",
                    r.status,
                    r.code().unwrap_or_default()
                ),
            );
        }
        return Ok(());
    }
    verbs_transfers(s, f, path, payload).await
}

async fn prepare(
    s: &Signer<'_>,
    token: &str,
    psn: u32,
    cookie: u32,
    op: &str,
    target: &str,
    size: &str,
) -> anyhow::Result<Reply> {
    use s3dma_wire::hipobj::{self as h, header as hh};
    let psn = h::format_psn(psn);
    let cookie = h::format_cookie(cookie);
    let mut headers = vec![
        (hh::PROTOCOL, h::PROTOCOL),
        (hh::TOKEN, token),
        (hh::PSN, psn.as_str()),
        (hh::COOKIE, cookie.as_str()),
        (hh::OP, op),
        (hh::TARGET, target),
        (hh::SIZE, size),
    ];
    if op == "GET" {
        headers.push((hh::OFFSET, "0"));
    }
    s.send("POST", h::Control::Prepare.path(), &headers, Bytes::new())
        .await
}

async fn cancel(s: &Signer<'_>, session: &str) -> anyhow::Result<Reply> {
    use s3dma_wire::hipobj::{self as h, header as hh};
    s.send(
        "POST",
        h::Control::Cancel.path(),
        &[(hh::PROTOCOL, h::PROTOCOL), (hh::SESSION, session)],
        Bytes::new(),
    )
    .await
}

/// One GET transfer into a region of this host's and one PUT transfer out
/// of it, on RC queue pairs of this host's device.
#[cfg(feature = "verbs")]
async fn verbs_transfers(
    s: &Signer<'_>,
    f: &mut Findings,
    path: &str,
    payload: &[u8],
) -> anyhow::Result<()> {
    use fabric::verbs::rc::{RcQp, RcRemote, check_recv};
    use fabric::{Access, Domain};
    use s3dma_wire::hipobj::{self as h, FinalReply, PrepareReply, RcToken, header as hh};
    const WHAT: &str = "hipobj-rc-v2";
    let opts_timeout = s.opts.timeout;
    let domain = Domain::open(Backend::Verbs).context("opening this host's RDMA device")?;
    let region = domain
        .alloc(payload.len(), Access::REMOTE_WRITE | Access::REMOTE_READ)
        .context("registering the probe's memory")?;
    let size = payload.len().to_string();
    let len = u32::try_from(payload.len()).context("the test object is too large")?;
    let headers_of = |r: &Reply| -> Vec<(String, String)> {
        r.headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    v.to_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    for op in ["GET", "PUT"] {
        let get = op == "GET";
        let qp = RcQp::create(
            &domain,
            if get {
                Access::REMOTE_WRITE
            } else {
                Access::NONE
            },
        )
        .context("creating a queue pair")?;
        let recv = if get { Some(qp.post_recv()?) } else { None };
        let local = qp.local();
        let mut token = RcToken::rc(local.qpn, local.gid, local.port);
        token.lid = local.lid;
        let psn = h::random_psn();
        let cookie = rand::random::<u32>() | 1;
        let target = if get {
            path.to_owned()
        } else {
            format!("{path}-rc-put")
        };
        let r = prepare(s, &token.encode(), psn, cookie, op, &target, &size).await?;
        f.peer(WHAT, Step::Prepare, &r, None);
        if r.status == 501 {
            f.info(WHAT, &format!("{op}: not spoken ({})", r.rdma_headers()));
            return Ok(());
        }
        if r.status != 200 {
            f.info(
                WHAT,
                &format!(
                    "{op}: PREPARE answered HTTP {} {} ({})",
                    r.status,
                    r.code().unwrap_or_default(),
                    r.rdma_headers()
                ),
            );
            return Ok(());
        }
        let hs = headers_of(&r);
        let pairs: Vec<(&str, &str)> = hs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let prepared = match PrepareReply::parse(pairs.as_slice()) {
            Ok(p) => p,
            Err(e) => {
                f.broken(
                    WHAT,
                    &format!("{op}: a 200 PREPARE that breaks the dialect: {e}"),
                );
                return Ok(());
            }
        };
        qp.connect_with_mtu(
            &RcRemote {
                qpn: prepared.token.qpn,
                gid: prepared.token.gid,
                lid: prepared.token.lid,
                psn: prepared.server_psn,
            },
            psn,
            s.opts.path_mtu,
        )?;
        if !get {
            region.write_at(0, payload)?;
        }
        let ready_headers = [
            (hh::PROTOCOL, h::PROTOCOL.to_owned()),
            (hh::SESSION, prepared.session.to_string()),
            (hh::COOKIE, h::format_cookie(cookie)),
            (hh::QPN, format!("{:x}", local.qpn)),
            (hh::MR_ADDR, format!("{:x}", region.addr())),
            (hh::MR_RKEY, format!("{:x}", region.rkey())),
        ];
        let rh: Vec<(&str, &str)> = ready_headers
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect();
        let ready = s.send("POST", h::Control::Ready.path(), &rh, Bytes::new());
        let write = async {
            match (get, prepared.staging) {
                (false, Some((addr, rkey))) => tokio::time::timeout(
                    opts_timeout,
                    qp.write_with_imm(region.as_slice(), addr, rkey, cookie),
                )
                .await
                .map_err(|_| anyhow!("the WRITE_WITH_IMM did not complete within the --timeout"))?
                .map_err(|e| anyhow!("the WRITE_WITH_IMM failed: {e}")),
                (false, None) => Err(anyhow!("the PUT's PREPARE reply named no staging region")),
                _ => Ok(()),
            }
        };
        let (r, written) = tokio::join!(ready, write);
        let r = r?;
        let hs = headers_of(&r);
        let pairs: Vec<(&str, &str)> = hs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let fin = if r.status == 200 {
            FinalReply::parse(pairs.as_slice(), cookie).map_err(|e| e.to_string())
        } else {
            Err(format!(
                "HTTP {} {}",
                r.status,
                r.code().unwrap_or_default()
            ))
        };
        let fin = match (fin, written) {
            (Ok(fin), Ok(())) => fin,
            (Err(e), _) => {
                f.broken(WHAT, &format!("{op}: READY: {e} ({})", r.rdma_headers()));
                return Ok(());
            }
            (Ok(_), Err(e)) => {
                f.broken(WHAT, &format!("{op}: {e}"));
                return Ok(());
            }
        };
        if fin.bytes != u64::from(len) {
            f.broken(
                WHAT,
                &format!("{op}: {} bytes transferred of {len}", fin.bytes),
            );
            return Ok(());
        }
        let same = if get {
            let got = tokio::time::timeout(opts_timeout, recv.expect("posted for a GET"))
                .await
                .map_err(|_| {
                    anyhow!("GET: the server's write did not arrive within the --timeout")
                })?
                .map_err(|st| anyhow!("the receive failed: {st:?}"))?;
            if let Err(why) = check_recv(&got, cookie, len) {
                f.broken(WHAT, &format!("GET: the server's write: {why}"));
                return Ok(());
            }
            let mut back = vec![0u8; payload.len()];
            region.read_at(0, &mut back)?;
            sha(&back) == sha(payload)
        } else {
            let back = s.send("GET", &target, &[], Bytes::new()).await?;
            let _ = s.send("DELETE", &target, &[], Bytes::new()).await;
            back.status == 200 && sha(&back.body) == sha(payload)
        };
        if same {
            f.ok(
                WHAT,
                &format!("{op} of {len} bytes by RDMA on a queue pair of this host's, bytes compared ({})", r.rdma_headers()),
            );
        } else {
            f.broken(WHAT, &format!("{op}: the bytes differ"));
        }
    }
    Ok(())
}

#[cfg(not(feature = "verbs"))]
async fn verbs_transfers(
    _s: &Signer<'_>,
    _f: &mut Findings,
    _path: &str,
    _payload: &[u8],
) -> anyhow::Result<()> {
    bail!("this s3dma-tools was built without the verbs feature")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_bodies_are_bounded_by_what_the_request_expects() {
        // A GET may bring the test object plus a margin, never less than
        // a control reply's bound; anything else a control reply's bound.
        assert_eq!(body_limit("GET", 10 << 20), (10 << 20) + BODY_MARGIN);
        assert_eq!(body_limit("GET", 3), CONTROL_BODY_MAX);
        assert_eq!(body_limit("GET", usize::MAX), usize::MAX);
        for m in ["PUT", "HEAD", "POST", "DELETE"] {
            assert_eq!(body_limit(m, 10 << 20), CONTROL_BODY_MAX, "{m}");
        }
    }

    fn reply(status: u16, headers: &[(&'static str, &str)], body: &'static [u8]) -> Reply {
        let mut h = http::HeaderMap::new();
        for (k, v) in headers {
            h.insert(*k, v.parse().unwrap());
        }
        Reply {
            status,
            headers: h,
            body: Bytes::from_static(body),
        }
    }

    #[test]
    fn peer_rules_are_named_only_where_a_reply_leaves_the_draft() {
        let empty_501 = reply(501, &[("x-amz-rdma-reply", "501")], b"");
        assert!(
            peer_rule(Step::DcGet, &empty_501, None)
                .is_some_and(|r| r.contains("as elbencho's s3rdma-server does"))
        );
        // The draft's decline: the object in the body.
        let served = reply(200, &[("x-amz-rdma-reply", "501")], b"object");
        assert_eq!(peer_rule(Step::DcGet, &served, None), None);
        let ignored = reply(200, &[], b"object");
        assert!(peer_rule(Step::DcGet, &ignored, None).is_some_and(|r| r.contains("plain S3")));
        // A PUT: only an empty object left behind by an ignored token.
        let put = reply(200, &[], b"");
        assert!(peer_rule(Step::DcPut, &put, Some(0)).is_some());
        assert_eq!(peer_rule(Step::DcPut, &put, None), None);
        let declined = reply(200, &[("x-amz-rdma-reply", "501")], b"");
        assert_eq!(peer_rule(Step::DcPut, &declined, None), None);
        // PREPARE: a bare 501, the older spelling; the draft's 501 and
        // `200:<token>` get none.
        assert!(peer_rule(Step::Prepare, &reply(501, &[], b""), None).is_some());
        let draft = reply(501, &[("x-amz-rdma-protocol-status", "unsupported")], b"");
        assert_eq!(peer_rule(Step::Prepare, &draft, None), None);
        let older = reply(200, &[("x-amz-rdma-reply", "200 abcd")], b"");
        assert!(peer_rule(Step::Prepare, &older, None).is_some_and(|r| r.contains("older")));
        let current = reply(200, &[("x-amz-rdma-reply", "200:abcd")], b"");
        assert_eq!(peer_rule(Step::Prepare, &current, None), None);
    }

    #[test]
    fn the_dc_token_has_the_cuobject_layout() {
        let t = dc_token(1 << 20);
        assert_eq!(t.len(), 81, "{t}");
        let parsed: s3dma_wire::RdmaToken = t.parse().unwrap();
        assert_eq!(parsed.size, 1 << 20);
    }
}
