//! HTTP/1.1 serving: a hyper service around the s3s service that runs every
//! request in its envelope ([`s3dma_service::request`]): the target's own
//! request id (`x-amz-request-id`, `x-amz-id-2`, and the `<RequestId>` of
//! XML error bodies, including errors s3s raises itself), the client's id
//! escaped, an `info` span, the requests counter and duration histogram;
//! it counts bytes and logs one line per request; plus graceful shutdown.
//!
//! Caps, whatever clients do: at most `max_connections` connections are
//! open, shared as `connections:` says (at the cap, the evictable
//! connection idle longest is closed to make room, and a new connection
//! that finds none evictable is closed at once; a connection is evictable
//! while no request is in progress on it, or while its request moves less
//! than `min_transfer_rate` over a whole window; one client address holds
//! at most `per_address` connections and one S3 user at most `per_user`
//! requests in progress, and the agents' networks hold reserved slots and
//! are exempt from both shares), and an aws-chunked request body
//! (`x-amz-content-sha256: STREAMING-...`) whose chunk header declares more
//! than `max_aws_chunk_size` bytes is refused before a byte of that chunk is
//! read (s3s buffers a whole chunk to check its signature, so the chunk
//! size the client declares would otherwise be memory the server holds).

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use s3s::service::S3Service;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument as _, Level, debug, error, info, warn};

use crate::config::connections::ConnectionsConfig;
use crate::metrics::Metrics;
use s3dma_service::Escaped;
use s3dma_service::request::{Envelope, Style};

/// The request id of the current request, in the request extensions.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// Slot in the request extensions where the access check records the S3
/// operation name (s3s resolves it; the wrapper labels metrics with it).
#[derive(Debug, Clone, Default)]
pub struct OpSlot(Arc<Mutex<Option<String>>>);

impl OpSlot {
    /// Records the operation name.
    pub fn set(&self, op: &str) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(op.to_owned());
    }

    /// The recorded operation name, or `"unknown"` (e.g. failed authentication).
    #[must_use]
    pub fn get(&self) -> String {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "unknown".to_owned())
    }
}

/// Headers whose value a client may send as its own request id, logged as
/// `client_request_id` (first one present wins).
const CLIENT_REQUEST_ID_HEADERS: [&str; 2] = ["x-s3dma-request-id", "x-request-id"];

/// The target's envelopes: an `info` span per request (its line is the
/// access log).
const STYLE: Style = Style {
    span: Level::INFO,
    client_failure: Level::INFO,
    ok: "200",
};

/// A status a handler sets on its response where s3s would drop it
/// (s3s ignores `S3Response::status` for some operations, e.g. HeadObject).
#[derive(Debug, Clone, Copy)]
pub struct StatusOverride(pub StatusCode);

/// Generates an AWS-style request id: 16 upper-case hex digits.
#[must_use]
pub fn new_request_id() -> String {
    format!("{:016X}", rand::random::<u64>())
}

/// Inserts or replaces `<RequestId>` in an S3 XML error body. Returns `None`
/// if the body is not an `<Error>` document.
#[must_use]
pub fn set_error_request_id(body: &[u8], request_id: &str) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(body).ok()?;
    if !text.contains("<Error>") || !text.contains("</Error>") {
        return None;
    }
    let owned;
    let text = if text.contains("<Message>") {
        text
    } else {
        let code_end = text.find("</Code>")?;
        let code_start = text.find("<Code>")? + "<Code>".len();
        let code = text.get(code_start..code_end)?;
        owned = format!(
            "{}</Code><Message>{}</Message>{}",
            &text[..code_end],
            default_message(code),
            &text[code_end + "</Code>".len()..]
        );
        owned.as_str()
    };
    let end = text.rfind("</Error>")?;
    let mut out = String::with_capacity(text.len() + 48);
    if let (Some(a), Some(b)) = (text.find("<RequestId>"), text.find("</RequestId>"))
        && a < b
    {
        out.push_str(&text[..a + "<RequestId>".len()]);
        out.push_str(request_id);
        out.push_str(&text[b..]);
        return Some(out.into_bytes());
    }
    out.push_str(&text[..end]);
    out.push_str("<RequestId>");
    out.push_str(request_id);
    out.push_str("</RequestId>");
    out.push_str(&text[end..]);
    Some(out.into_bytes())
}

/// The payload mode of a request for logs: the `x-amz-content-sha256` value,
/// or `signed` for a literal hash, or `-` when absent.
fn payload_mode(h: &http::HeaderMap) -> String {
    match h.get("x-amz-content-sha256").and_then(|v| v.to_str().ok()) {
        None => "-".to_owned(),
        Some(v) if v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()) => "signed".to_owned(),
        Some(v) => v
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(64)
            .collect(),
    }
}

/// A message for errors s3s raises without one.
fn default_message(code: &str) -> &'static str {
    match code {
        "AccessDenied" => "Access Denied",
        "InvalidBucketName" => "The specified bucket is not valid.",
        "SignatureDoesNotMatch" => {
            "The request signature we calculated does not match the signature you provided. Check your key and signing method."
        }
        "InvalidAccessKeyId" => "The AWS Access Key Id you provided does not exist in our records.",
        "RequestTimeTooSkewed" => {
            "The difference between the request time and the current time is too large."
        }
        "KeyTooLongError" => "Your key is too long",
        "MissingContentLength" => "You must provide the Content-Length HTTP header.",
        "MalformedXML" => {
            "The XML you provided was not well-formed or did not validate against our published schema."
        }
        "InvalidURI" => "Couldn't parse the specified URI.",
        "MethodNotAllowed" => "The specified method is not allowed against this resource.",
        "NotImplemented" => {
            "A header or operation you provided implies functionality that is not implemented."
        }
        _ => "The request failed.",
    }
}

/// How long a client may keep the server waiting for request body bytes it
/// owes, or leave response bytes untaken, before the connection is failed
/// (S3's `RequestTimeout`): a client that stalls mid-body or stops reading
/// would otherwise hold its connection, and the object it writes or reads,
/// for ever.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The display text of a request body that timed out (see [`IDLE_TIMEOUT`]).
pub(crate) const BODY_IDLE_MESSAGE: &str = "the client sent no request body bytes";

/// The start of the message of a request body refused for its aws-chunked
/// framing (mapped to `400 InvalidRequest` by the S3 front ends).
pub(crate) const AWS_CHUNK_REFUSED: &str = "aws-chunked body refused";

pub use crate::config::DEFAULT_MAX_AWS_CHUNK;

/// Longest aws-chunked chunk header line (size, `;chunk-signature=` and 64
/// hex digits, CRLF) the check follows; s3s refuses longer ones as well.
const MAX_CHUNK_HEADER: usize = 1024;

/// Follows the framing of an aws-chunked body (`hex-size[;ext]\r\n`,
/// `size` bytes, `\r\n`, ..., a 0-size chunk, trailers) as its bytes pass,
/// and refuses a chunk header that declares more than `max` bytes (or is
/// malformed) as soon as its size digits show it.
#[derive(Debug)]
pub(crate) struct ChunkCheck {
    max: u64,
    state: Framing,
}

#[derive(Debug, Clone, Copy)]
enum Framing {
    /// In a chunk header line: the size so far, its hex digits, whether
    /// the size field is still being read, the line's length so far.
    Header {
        size: u64,
        digits: u8,
        in_size: bool,
        len: usize,
    },
    /// In a chunk's data and the CRLF after it: bytes left.
    Data(u64),
    /// After the final 0-size chunk: trailers (which s3s bounds).
    Trailer,
}

const HEADER_START: Framing = Framing::Header {
    size: 0,
    digits: 0,
    in_size: true,
    len: 0,
};

impl ChunkCheck {
    /// A check refusing chunks larger than `max` bytes.
    pub(crate) fn new(max: u64) -> ChunkCheck {
        ChunkCheck {
            max,
            state: HEADER_START,
        }
    }

    /// Follows `b`, the next bytes of the body.
    ///
    /// # Errors
    /// Why the body is refused (the message starts with [`AWS_CHUNK_REFUSED`]).
    pub(crate) fn feed(&mut self, mut b: &[u8]) -> Result<(), String> {
        let refuse = |why: String| Err(format!("{AWS_CHUNK_REFUSED}: {why}"));
        while let Some((&c, rest)) = b.split_first() {
            match self.state {
                Framing::Trailer => return Ok(()),
                Framing::Data(left) => {
                    let n = left.min(b.len() as u64);
                    b = &b[usize::try_from(n).unwrap_or(b.len())..];
                    self.state = if left == n {
                        HEADER_START
                    } else {
                        Framing::Data(left - n)
                    };
                }
                Framing::Header {
                    size,
                    digits,
                    in_size,
                    len,
                } => {
                    b = rest;
                    let len = len + 1;
                    if len > MAX_CHUNK_HEADER {
                        return refuse(format!(
                            "a chunk header is longer than {MAX_CHUNK_HEADER} bytes"
                        ));
                    }
                    if in_size {
                        if c == b';' || c == b'\r' {
                            if digits == 0 {
                                return refuse("a chunk header has no size".into());
                            }
                            self.state = Framing::Header {
                                size,
                                digits,
                                in_size: false,
                                len,
                            };
                            continue;
                        }
                        let Some(d) = char::from(c).to_digit(16) else {
                            return refuse("a chunk size is not hexadecimal".into());
                        };
                        if digits >= 8 {
                            return refuse("a chunk size has more than 8 hex digits".into());
                        }
                        let size = size * 16 + u64::from(d);
                        if size > self.max {
                            return refuse(format!(
                                "a chunk declares at least {size} bytes, more than this server's limit of {} bytes per chunk (max_aws_chunk_size); send smaller chunks",
                                self.max
                            ));
                        }
                        self.state = Framing::Header {
                            size,
                            digits: digits + 1,
                            in_size,
                            len,
                        };
                    } else if c == b'\n' {
                        // The data, then its CRLF.
                        self.state = if size == 0 {
                            Framing::Trailer
                        } else {
                            Framing::Data(size + 2)
                        };
                    } else {
                        self.state = Framing::Header {
                            size,
                            digits,
                            in_size,
                            len,
                        };
                    }
                }
            }
        }
        Ok(())
    }
}

/// Counts the bytes of a request body, and fails it once the client has
/// sent none for [`IDLE_TIMEOUT`] while the server waits for them, or when
/// its aws-chunked framing declares too large a chunk ([`ChunkCheck`]).
struct CountingBody {
    inner: Incoming,
    metrics: Arc<Metrics>,
    idle: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Set once the body has been read to its end.
    ended: Arc<AtomicBool>,
    /// The aws-chunked check, for a streaming (`STREAMING-...`) body.
    chunks: Option<ChunkCheck>,
}

impl http_body::Body for CountingBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if r.is_pending() {
            let idle = self
                .idle
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(IDLE_TIMEOUT)));
            if idle.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("{BODY_IDLE_MESSAGE} for {} s", IDLE_TIMEOUT.as_secs()),
                ))));
            }
            return Poll::Pending;
        }
        self.idle = None;
        if let Poll::Ready(Some(Ok(f))) = &r
            && let Some(d) = f.data_ref()
        {
            self.metrics.add_bytes_in(d.len() as u64);
            let checked = self.chunks.as_mut().map(|c| c.feed(d));
            if let Some(Err(why)) = checked {
                self.metrics.aws_chunk_refused();
                debug!(error = %why, "request body refused");
                return Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    why,
                ))));
            }
        }
        if matches!(r, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.ended.store(true, Ordering::Relaxed);
        }
        r.map(|o| o.map(|r| r.map_err(std::io::Error::other)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The response body: counts bytes and records the request's metrics when
/// the body ends or is dropped (client gone).
pub struct ResponseBody {
    inner: s3s::Body,
    metrics: Arc<Metrics>,
    op: OpSlot,
    status: u16,
    /// The request's envelope (its id, span and start).
    env: Envelope,
    recorded: bool,
    /// Marks the connection busy until the response is sent or dropped.
    _busy: Option<Busy>,
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl ResponseBody {
    fn record(&mut self) {
        if !self.recorded {
            self.recorded = true;
            self.env
                .observe(&*self.metrics, "", &self.op.get(), &self.status.to_string());
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        self.record();
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = s3s::StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    self.metrics.add_bytes_out(d.len() as u64);
                }
            }
            Poll::Ready(Some(Err(e))) => {
                warn!(error = %e, "response body failed");
                self.record();
            }
            Poll::Ready(None) => self.record(),
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The hyper service: request ids and metrics around the s3s service.
#[derive(Clone)]
pub struct Handler {
    s3: S3Service,
    metrics: Arc<Metrics>,
    /// This server's region: SigV4 credential scopes must name it.
    region: Arc<str>,
    /// Largest aws-chunked chunk accepted (bytes).
    max_aws_chunk: u64,
    /// The connection this handler serves (set per connection by [`serve`]).
    conn: Option<ConnShare>,
    /// The operator's authentication choices (SigV2, clock skew).
    auth: crate::precheck::AuthOptions,
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler").finish_non_exhaustive()
    }
}

impl Handler {
    /// Wraps an s3s service of a server in `region`, authenticating
    /// requests as `auth` says.
    #[must_use]
    pub fn new(
        s3: S3Service,
        metrics: Arc<Metrics>,
        region: &str,
        auth: crate::precheck::AuthOptions,
    ) -> Self {
        Handler {
            s3,
            metrics,
            region: region.into(),
            max_aws_chunk: DEFAULT_MAX_AWS_CHUNK,
            conn: None,
            auth,
        }
    }

    /// Sets the largest aws-chunked chunk a request body may declare
    /// (`max_aws_chunk_size`; default [`DEFAULT_MAX_AWS_CHUNK`]).
    #[must_use]
    pub fn with_max_aws_chunk_size(mut self, bytes: u64) -> Self {
        self.max_aws_chunk = bytes;
        self
    }

    async fn handle(self, req: Request<Incoming>) -> Response<ResponseBody> {
        let busy = self.conn.as_ref().map(|c| Busy::new(Arc::clone(&c.conn)));
        let op = OpSlot::default();
        let method = req.method().clone();
        // The path decoded, so that a key reads as the client wrote it, and
        // escaped: a key with a newline or an ANSI escape cannot forge a
        // log line or drive the reader's terminal.
        let path = percent_encoding::percent_decode_str(req.uri().path())
            .decode_utf8_lossy()
            .into_owned();
        // A request id the client chose (a dpu-agent names its own in
        // `x-s3dma-request-id`, so one tenant request can be followed from
        // shim to agent to target; other clients may send `x-request-id`)
        // is kept, escaped and cut to a bounded length, in its own field
        // marked client-supplied: it never replaces this server's `id`.
        let client = CLIENT_REQUEST_ID_HEADERS
            .iter()
            .find_map(|h| req.headers().get(*h))
            .map(HeaderValue::as_bytes);
        let env = Envelope::new(
            STYLE,
            new_request_id(),
            s3dma_service::request::client_request_id(client),
        );
        env.record("method", &method).record("path", Escaped(&path));
        if client.is_some() {
            env.record_client_id();
        }
        let span = env.span().clone();
        async move {
            let (mut parts, body) = req.into_parts();
            let payload = payload_mode(&parts.headers);
            parts.extensions.insert(RequestId(env.id().to_owned()));
            parts.extensions.insert(op.clone());
            if let Some(share) = &self.conn {
                parts.extensions.insert(share.clone());
            }
            let ended = Arc::new(AtomicBool::new(http_body::Body::is_end_stream(&body)));
            let streaming = parts
                .headers
                .get("x-amz-content-sha256")
                .is_some_and(|v| v.as_bytes().starts_with(b"STREAMING-"));
            let body = s3s::Body::http_body_unsync(CountingBody {
                inner: body,
                metrics: Arc::clone(&self.metrics),
                idle: None,
                ended: Arc::clone(&ended),
                chunks: streaming.then(|| ChunkCheck::new(self.max_aws_chunk)),
            });
            let outcome = match crate::precheck::precheck(&mut parts, &self.region, self.auth) {
                Ok(()) => self.s3.call(Request::from_parts(parts, body)).await,
                Err(mut e) => {
                    e.set_request_id(env.id().to_owned());
                    e.to_http_response()
                        .map_err(|e| s3s::HttpError::new(Box::new(e)))
                }
            };
            let resp = match outcome {
                Ok(r) => r,
                Err(e) => {
                    error!(error = ?e, "s3 service failed");
                    let mut err = s3s::S3Error::with_message(
                        s3s::S3ErrorCode::InternalError,
                        "We encountered an internal error. Please try again.",
                    );
                    err.set_request_id(env.id().to_owned());
                    err.to_http_response().unwrap_or_else(|_| {
                        let mut r = Response::new(s3s::Body::empty());
                        *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                        r
                    })
                }
            };
            let (mut parts, mut body) = resp.into_parts();
            if let Some(StatusOverride(status)) = parts.extensions.remove::<StatusOverride>() {
                parts.status = status;
            }
            let status = parts.status;
            if status == StatusCode::NOT_MODIFIED {
                body = s3s::Body::empty();
                parts.headers.remove(http::header::CONTENT_LENGTH);
                parts.headers.remove(http::header::CONTENT_TYPE);
            } else if (status.is_client_error() || status.is_server_error())
                && let Some(bytes) = body.bytes()
                && let Some(new) = set_error_request_id(&bytes, env.id())
            {
                parts
                    .headers
                    .insert(http::header::CONTENT_LENGTH, HeaderValue::from(new.len()));
                if method == Method::HEAD {
                    body = s3s::Body::empty();
                } else {
                    body = s3s::Body::from(Bytes::from(new));
                }
            }
            if let Ok(v) = HeaderValue::from_str(env.id()) {
                parts.headers.insert("x-amz-request-id", v);
            }
            let id2 = base64::engine::general_purpose::STANDARD
                .encode(format!("{}{:016x}", env.id(), rand::random::<u64>()));
            if let Ok(v) = HeaderValue::from_str(&id2) {
                parts.headers.insert("x-amz-id-2", v);
            }
            parts.headers.insert(
                http::header::SERVER,
                HeaderValue::from_static("s3dma-storage-target"),
            );
            // A request answered before its body was read (denied before a
            // byte of it, say) ends the connection. Kept alive, hyper would
            // skip the body's length of what follows, but a client that sent
            // `Expect: 100-continue` and saw no 100 never sends that body:
            // the skipped bytes would be the start of its next request.
            if !ended.load(Ordering::Relaxed) {
                parts
                    .headers
                    .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
            }
            let op_name = op.get();
            if status.is_server_error() {
                error!(op = %op_name, status = status.as_u16(), payload = %payload, "request failed");
            } else {
                info!(op = %op_name, status = status.as_u16(), payload = %payload, "request");
            }
            Response::from_parts(
                parts,
                ResponseBody {
                    inner: body,
                    metrics: Arc::clone(&self.metrics),
                    op,
                    status: status.as_u16(),
                    env,
                    recorded: false,
                    _busy: busy,
                },
            )
        }
        .instrument(span)
        .await
    }
}

impl hyper::service::Service<Request<Incoming>> for Handler {
    type Response = Response<ResponseBody>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.handle(req).await) })
    }
}

/// Time a connection has to send a whole request head, counted from the
/// connection's start or the end of its previous request (so idle
/// keep-alive connections close too). hyper enforces it only with a timer;
/// without one, a peer that sends half a head, or nothing, holds its
/// connection for ever.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection whose writes fail once the client has taken no bytes for
/// [`IDLE_TIMEOUT`] (the time counts only while a write waits on it), and
/// that counts the bytes it moves, both ways, for the transfer rate
/// ([`Conn::moved`]).
struct WriteDeadline {
    io: tokio::net::TcpStream,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
    conn: Arc<Conn>,
}

impl WriteDeadline {
    fn new(io: tokio::net::TcpStream, conn: Arc<Conn>) -> Self {
        WriteDeadline {
            io,
            stalled: None,
            conn,
        }
    }

    /// Counts `n` bytes moved.
    fn moved(&self, n: usize) {
        self.conn.moved.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Passes a ready result through (and stops the clock); on pending,
    /// starts the clock or fails once it has run out.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if r.is_ready() {
            self.stalled = None;
            return r;
        }
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(IDLE_TIMEOUT)));
        if stalled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the client took no response bytes for {} s",
                    IDLE_TIMEOUT.as_secs()
                ),
            )));
        }
        Poll::Pending
    }
}

impl tokio::io::AsyncRead for WriteDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            self.moved(buf.filled().len().saturating_sub(before));
        }
        r
    }
}

impl tokio::io::AsyncWrite for WriteDeadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.moved(n);
        }
        self.check(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.moved(n);
        }
        self.check(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.check(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_shutdown(cx);
        self.check(cx, r)
    }
}

/// Who the request in progress on a connection is, for the per-user share.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Caller {
    /// Not (yet) authenticated.
    Unknown,
    /// An unsigned request: anonymous callers together are one user.
    Anonymous,
    /// A signed request, by access key.
    User(String),
}

/// One open connection, for the cap: its client's address (and whether
/// that is an agent's), whether a request is in progress on it and by
/// whom, since when it has been idle, the bytes it moved, whether its
/// request trickles, and how to close it.
#[derive(Debug)]
pub(crate) struct Conn {
    ip: IpAddr,
    /// From `agent_networks`: exempt from the shares, may use the reserve.
    agent: bool,
    busy: AtomicUsize,
    idle_since: Mutex<Instant>,
    close: CancellationToken,
    /// The caller of the request in progress (or of the last one).
    caller: Mutex<Caller>,
    /// Bytes moved (read and written) since the sampler last looked.
    moved: AtomicU64,
    /// Requests started on the connection so far.
    requests: AtomicU64,
    /// The sampler's view at its last look: requests started, and whether
    /// one was in progress.
    seen_requests: AtomicU64,
    seen_busy: AtomicBool,
    /// `requests` when the sampler found the request in progress trickling
    /// (moved less than the least rate over a whole window); 0 when not.
    /// Only the same request stays trickling: a new one starts afresh.
    slow_request: AtomicU64,
}

impl Conn {
    fn new(ip: IpAddr, agent: bool) -> Conn {
        Conn {
            ip,
            agent,
            busy: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            close: CancellationToken::new(),
            caller: Mutex::new(Caller::Unknown),
            moved: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            seen_requests: AtomicU64::new(0),
            seen_busy: AtomicBool::new(false),
            slow_request: AtomicU64::new(0),
        }
    }

    fn caller(&self) -> std::sync::MutexGuard<'_, Caller> {
        self.caller
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn idle_since(&self) -> Instant {
        *self
            .idle_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn is_busy(&self) -> bool {
        self.busy.load(Ordering::SeqCst) > 0
    }

    /// Whether the request in progress trickles.
    fn is_slow(&self) -> bool {
        let slow = self.slow_request.load(Ordering::SeqCst);
        slow != 0 && slow == self.requests.load(Ordering::SeqCst)
    }

    /// Open and not being closed.
    fn is_live(&self) -> bool {
        !self.close.is_cancelled()
    }

    /// Whether the connection may be closed to make room: no request in
    /// progress, or one that trickles.
    fn evictable(&self) -> bool {
        self.is_live() && (!self.is_busy() || self.is_slow())
    }
}

/// A request in progress on a connection (it is not idle meanwhile).
#[derive(Debug)]
struct Busy(Arc<Conn>);

impl Busy {
    fn new(c: Arc<Conn>) -> Busy {
        *c.caller() = Caller::Unknown;
        c.requests.fetch_add(1, Ordering::SeqCst);
        c.busy.fetch_add(1, Ordering::SeqCst);
        Busy(c)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self
            .0
            .idle_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The connection a request arrived on, in the request extensions: the
/// access checks name the request's caller here once it is authenticated
/// ([`claim_connection`]), for the per-user share.
#[derive(Debug, Clone)]
pub struct ConnShare {
    conn: Arc<Conn>,
    conns: Arc<Conns>,
}

impl ConnShare {
    /// Records `access_key` (`None`: anonymous) as the caller of the request
    /// in progress; `false`, recording nothing, when that user already has
    /// `per_user` requests in progress on other connections (an agent's
    /// connection is not counted, and always gets `true`).
    #[must_use]
    pub fn claim(&self, access_key: Option<&str>) -> bool {
        let caller = access_key.map_or(Caller::Anonymous, |k| Caller::User(k.to_owned()));
        if self.conn.agent {
            *self.conn.caller() = caller;
            return true;
        }
        // Counted and recorded under the map's lock, so two requests of one
        // user claiming at once see each other.
        let open = self.conns.lock();
        let others = open
            .values()
            .filter(|c| {
                !Arc::ptr_eq(c, &self.conn)
                    && !c.agent
                    && c.is_live()
                    && c.is_busy()
                    && *c.caller() == caller
            })
            .count();
        if others >= self.conns.per_user {
            return false;
        }
        *self.conn.caller() = caller;
        true
    }
}

/// For the access checks, once s3s has authenticated a request: claims
/// its connection for its caller (the per-user share of `connections:`).
///
/// # Errors
/// `503 SlowDown` when the caller already has `connections.per_user`
/// requests in progress.
pub fn claim_connection(cx: &mut s3s::access::S3AccessContext<'_>) -> s3s::S3Result<()> {
    let key = cx.credentials().map(|c| c.access_key.clone());
    if let Some(share) = cx.extensions_mut().get::<ConnShare>()
        && !share.claim(key.as_deref())
    {
        debug!(
            per_user = share.conns.per_user,
            "request refused: its user has connections.per_user requests in progress"
        );
        return Err(s3s::s3_error!(
            SlowDown,
            "Please reduce your request rate: too many requests of this user in progress (connections.per_user)."
        ));
    }
    Ok(())
}

/// Which open connections a new one may close to make room for itself.
#[derive(Debug, Clone, Copy)]
enum Scope {
    /// Its own address's (the address is at `per_address`).
    Address(IpAddr),
    /// Any but the agents' (other clients hold all the unreserved slots).
    Clients,
    /// Any.
    Any,
}

/// The open connections and the slots they hold.
#[derive(Debug)]
pub(crate) struct Conns {
    max: usize,
    /// Slots only agents may hold.
    reserved: usize,
    per_address: usize,
    per_user: usize,
    slots: Arc<tokio::sync::Semaphore>,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
}

impl Conns {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Where a new connection from `ip` must make room, if it must: its
    /// address at its share, the clients' slots all held, or all slots.
    fn scope(&self, open: &HashMap<u64, Arc<Conn>>, ip: IpAddr, agent: bool) -> Option<Scope> {
        let (mut total, mut clients, mut here) = (0, 0, 0);
        for c in open.values().filter(|c| c.is_live()) {
            total += 1;
            if !c.agent {
                clients += 1;
                here += usize::from(c.ip == ip);
            }
        }
        if !agent && here >= self.per_address {
            Some(Scope::Address(ip))
        } else if !agent && clients >= self.max - self.reserved {
            Some(Scope::Clients)
        } else if total >= self.max {
            Some(Scope::Any)
        } else {
            None
        }
    }

    /// A slot for a new connection from `ip`: a free one, or the slot of
    /// the evictable connection idle longest (idle ones first, then
    /// trickling ones) among those it may close, closed for it; `Err` (why)
    /// when there is none.
    async fn slot(
        &self,
        ip: IpAddr,
        agent: bool,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, &'static str> {
        {
            let open = self.lock();
            if let Some(scope) = self.scope(&open, ip, agent) {
                let victim = open
                    .values()
                    .filter(|c| c.evictable())
                    .filter(|c| match scope {
                        Scope::Address(a) => !c.agent && c.ip == a,
                        Scope::Clients => !c.agent,
                        Scope::Any => true,
                    })
                    .min_by_key(|c| (c.is_busy(), c.idle_since()))
                    .cloned();
                let Some(victim) = victim else {
                    return Err(match scope {
                        Scope::Address(_) => {
                            "its address holds connections.per_address connections, none evictable"
                        }
                        Scope::Clients => {
                            "clients hold every slot not reserved for agents, none evictable"
                        }
                        Scope::Any => "max_connections are open, none evictable",
                    });
                };
                debug!(peer = %victim.ip, trickling = victim.is_busy(), "closing a connection to make room (max_connections)");
                victim.close.cancel();
            }
        }
        // A free slot, or the one a closed connection gives back: its task
        // ends at once.
        tokio::time::timeout(
            Duration::from_secs(1),
            Arc::clone(&self.slots).acquire_owned(),
        )
        .await
        .map_err(|_| "no slot came free")?
        .map_err(|_| "the server is stopping")
    }

    /// One look of the transfer-rate sampler: a request in progress since
    /// the last look (the same one) that moved fewer than `least` bytes
    /// since then trickles.
    fn sample(&self, least: u64) {
        for c in self.lock().values() {
            let moved = c.moved.swap(0, Ordering::SeqCst);
            let requests = c.requests.load(Ordering::SeqCst);
            let busy = c.is_busy();
            let same = busy
                && c.seen_busy.load(Ordering::SeqCst)
                && c.seen_requests.load(Ordering::SeqCst) == requests;
            c.slow_request.store(
                if same && moved < least { requests } else { 0 },
                Ordering::SeqCst,
            );
            c.seen_busy.store(busy, Ordering::SeqCst);
            c.seen_requests.store(requests, Ordering::SeqCst);
        }
    }
}

/// What an open connection holds; dropping it gives the slot back.
struct Open {
    id: u64,
    conns: Arc<Conns>,
    metrics: Arc<Metrics>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.conns.lock().remove(&self.id);
        self.metrics.connection(false);
    }
}

/// Serves HTTP/1.1 (keep-alive) on `listener` until `shutdown` is cancelled,
/// then lets in-flight requests finish (up to `grace`). At most
/// `max_connections` (at least 1) connections are open, shared as `shares`
/// says: at the cap (or the new connection's address at its share, or
/// clients at the slots not reserved for agents), the evictable connection
/// idle longest (no request in progress, or one that trickles) is closed
/// to make room, or, when none is evictable, the new connection is closed
/// at once.
pub async fn serve(
    listener: TcpListener,
    handler: Handler,
    shutdown: CancellationToken,
    grace: Duration,
    max_connections: usize,
    shares: ConnectionsConfig,
) {
    let tracker = TaskTracker::new();
    let max = max_connections.max(1);
    let conns = Arc::new(Conns {
        max,
        reserved: shares.reserved().min(max - 1),
        per_address: shares.per_address.max(1),
        per_user: shares.per_user.max(1),
        slots: Arc::new(tokio::sync::Semaphore::new(max)),
        open: Mutex::new(HashMap::new()),
        next: AtomicU64::new(0),
    });
    let rate = shares.min_transfer_rate.0;
    if rate > 0 {
        let window = shares.window();
        // The bytes a request must move over a whole window.
        let least = u64::try_from(u128::from(rate) * window.as_millis() / 1000).unwrap_or(u64::MAX);
        let conns = Arc::clone(&conns);
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(window);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    _ = tick.tick() => conns.sample(least),
                }
            }
        });
    }
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let ip = peer.ip();
        let agent = shares.is_agent(ip);
        let slot = match conns.slot(ip, agent).await {
            Ok(s) => s,
            Err(why) => {
                handler.metrics.connection_refused();
                debug!(%peer, max = conns.max, why, "closing a new connection at once");
                drop(stream);
                continue;
            }
        };
        let id = conns.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new(ip, agent));
        conns.lock().insert(id, Arc::clone(&conn));
        handler.metrics.connection(true);
        let open = Open {
            id,
            conns: Arc::clone(&conns),
            metrics: Arc::clone(&handler.metrics),
            _slot: slot,
        };
        let _ = stream.set_nodelay(true);
        let mut handler = handler.clone();
        handler.conn = Some(ConnShare {
            conn: Arc::clone(&conn),
            conns: Arc::clone(&conns),
        });
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            let _open = open;
            let conn_io = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(
                    TokioIo::new(WriteDeadline::new(stream, Arc::clone(&conn))),
                    handler,
                );
            tokio::pin!(conn_io);
            let res = tokio::select! {
                r = conn_io.as_mut() => r,
                () = conn.close.cancelled() => {
                    debug!(%peer, "closing a connection to make room (max_connections)");
                    return;
                }
                () = shutdown.cancelled() => {
                    conn_io.as_mut().graceful_shutdown();
                    conn_io.await
                }
            };
            if let Err(e) = res {
                debug!(%peer, error = %e, "connection ended with error");
            }
        });
    }
    tracker.close();
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        warn!("in-flight requests did not finish within the grace period");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(max: u64, parts: &[&[u8]]) -> Result<(), String> {
        let mut c = ChunkCheck::new(max);
        parts.iter().try_for_each(|p| c.feed(p))
    }

    #[test]
    fn aws_chunk_framing_is_followed_and_big_chunks_refused() {
        let sig = format!(";chunk-signature={}\r\n", "0".repeat(64));
        let body = format!("10{sig}{}\r\n4{sig}abcd\r\n0{sig}\r\n", "x".repeat(16));
        check(16, &[body.as_bytes()]).unwrap();
        // Byte by byte, as a slow client sends it.
        let bytes: Vec<&[u8]> = body.as_bytes().chunks(1).collect();
        check(16, &bytes).unwrap();
        // Unsigned (trailer) framing, and trailers after the last chunk.
        check(
            16,
            &[b"10\r\n0123456789abcdef\r\n0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n"],
        )
        .unwrap();
        // A chunk one byte over the limit, in its first or a later chunk;
        // refused at its size digits, before its line ends.
        let e = check(16, &[b"11"]).unwrap_err();
        assert!(
            e.starts_with(AWS_CHUNK_REFUSED) && e.contains("max_aws_chunk_size"),
            "{e}"
        );
        let later = format!("10{sig}{}\r\n40000000", "x".repeat(16));
        assert!(check(16, &[later.as_bytes()]).is_err());
        // Data that looks like a header is data.
        let fake = format!("4{sig}ffff\r\n0{sig}");
        check(16, &[fake.as_bytes()]).unwrap();
        // Malformed sizes: not hex, empty, more digits than s3s reads.
        for bad in [&b"zz\r\n"[..], b";chunk-signature=", b"000000001\r\n"] {
            assert!(check(u64::MAX, &[bad]).is_err(), "{bad:?}");
        }
        assert!(check(u64::MAX, &[&[b'1'; 2000]]).is_err());
    }

    fn conns(max: usize, reserved: usize, per_address: usize, per_user: usize) -> Arc<Conns> {
        Arc::new(Conns {
            max,
            reserved,
            per_address,
            per_user,
            slots: Arc::new(tokio::sync::Semaphore::new(max)),
            open: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        })
    }

    /// Opens a connection from `ip` as [`serve`] does, with a task that
    /// gives its slot back once it is closed.
    async fn open(conns: &Arc<Conns>, ip: &str, agent: bool) -> Result<Arc<Conn>, &'static str> {
        let ip: IpAddr = ip.parse().unwrap();
        let slot = conns.slot(ip, agent).await?;
        let conn = Arc::new(Conn::new(ip, agent));
        let id = conns.next.fetch_add(1, Ordering::Relaxed);
        conns.lock().insert(id, Arc::clone(&conn));
        let (cs, c) = (Arc::clone(conns), Arc::clone(&conn));
        tokio::spawn(async move {
            c.close.cancelled().await;
            cs.lock().remove(&id);
            drop(slot);
        });
        Ok(conn)
    }

    #[tokio::test]
    async fn shares_choose_whom_to_close() {
        // 4 slots, 1 reserved for agents, 2 per address.
        let c = conns(4, 1, 2, 8);
        let a1 = open(&c, "10.0.0.1", false).await.unwrap();
        let a2 = open(&c, "10.0.0.1", false).await.unwrap();
        let busy_a2 = Busy::new(Arc::clone(&a2));
        let busy_a1 = Busy::new(Arc::clone(&a1));
        // The address at its share, both busy: refused.
        let e = open(&c, "10.0.0.1", false).await.unwrap_err();
        assert!(e.contains("per_address"), "{e}");
        // One idle: the address's own idle one makes room.
        drop(busy_a1);
        let a3 = open(&c, "10.0.0.1", false).await.unwrap();
        assert!(a1.close.is_cancelled() && !a2.close.is_cancelled());
        let _busy_a3 = Busy::new(Arc::clone(&a3));
        let b1 = open(&c, "10.0.0.2", false).await.unwrap();
        let _busy_b1 = Busy::new(Arc::clone(&b1));
        // Clients hold the 3 unreserved slots, all busy; the agent's is free.
        let e = open(&c, "10.0.0.3", false).await.unwrap_err();
        assert!(e.contains("reserved"), "{e}");
        let g1 = open(&c, "10.9.0.1", true).await.unwrap();
        // Full: another agent connection closes the idle agent one.
        let g2 = open(&c, "10.9.0.1", true).await.unwrap();
        assert!(g1.close.is_cancelled() && !g2.close.is_cancelled());
        drop(busy_a2);
        // An idle client connection may go for a client, not the agent's.
        let _d = open(&c, "10.0.0.4", false).await.unwrap();
        assert!(a2.close.is_cancelled() && !g2.close.is_cancelled());
    }

    #[tokio::test]
    async fn a_request_below_the_rate_for_a_whole_window_is_evictable() {
        let c = conns(1, 0, 8, 8);
        let a = open(&c, "10.0.0.1", false).await.unwrap();
        let busy = Busy::new(Arc::clone(&a));
        assert!(!a.evictable());
        // The first look sees the request start; a window of enough bytes
        // keeps it busy; a whole window of too few makes it trickle.
        c.sample(100);
        assert!(!a.evictable());
        a.moved.fetch_add(100, Ordering::SeqCst);
        c.sample(100);
        assert!(!a.evictable());
        a.moved.fetch_add(99, Ordering::SeqCst);
        c.sample(100);
        assert!(a.evictable());
        // A new request on the connection starts afresh.
        drop(busy);
        let _busy = Busy::new(Arc::clone(&a));
        assert!(!a.evictable());
        c.sample(100);
        assert!(!a.evictable());
        let _b = open(&c, "10.0.0.2", false).await.unwrap_err();
        c.sample(100);
        let _b = open(&c, "10.0.0.2", false).await.unwrap();
        assert!(a.close.is_cancelled());
    }

    #[tokio::test]
    async fn one_user_holds_its_share_of_requests() {
        let c = conns(8, 0, 8, 2);
        let mut shares = Vec::new();
        for ip in ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.9.0.1"] {
            let conn = open(&c, ip, ip.starts_with("10.9")).await.unwrap();
            shares.push((
                Busy::new(Arc::clone(&conn)),
                ConnShare {
                    conn,
                    conns: Arc::clone(&c),
                },
            ));
        }
        assert!(shares[0].1.claim(Some("u")));
        assert!(shares[1].1.claim(Some("u")));
        assert!(!shares[2].1.claim(Some("u")), "a third request of u");
        assert!(shares[2].1.claim(Some("v")));
        assert!(shares[2].1.claim(None), "anonymous is a user of its own");
        assert!(shares[3].1.claim(Some("u")), "an agent's is not counted");
        // A finished request is not counted.
        let (busy, _) = shares.remove(0);
        drop(busy);
        assert!(shares[1].1.claim(Some("u")));
    }

    #[test]
    fn request_id_shape() {
        let id = new_request_id();
        assert_eq!(id.len(), 16);
        assert!(
            id.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_lowercase())
        );
    }

    #[test]
    fn inserts_request_id() {
        let body =
            b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code></Error>";
        let out = set_error_request_id(body, "ABC").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message><RequestId>ABC</RequestId></Error>"
        );
    }

    #[test]
    fn replaces_request_id() {
        let body = b"<Error><Code>X</Code><Message>m</Message><RequestId>old</RequestId></Error>";
        let out = set_error_request_id(body, "NEW").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "<Error><Code>X</Code><Message>m</Message><RequestId>NEW</RequestId></Error>"
        );
        assert!(set_error_request_id(b"<ListBucketResult/>", "x").is_none());
    }
}
