//! One keep-alive HTTP client per storage target (hyper, rustls for https).
//!
//! [`TargetClient::send`] builds the path-style URL, signs the request with
//! the tenant's [`Signer`] and sends it; it does not retry (retries are the
//! transfer layer's decision, per chunk). Reply helpers turn S3 error
//! bodies into [`S3Error`]s.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Empty, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::sign::Signer;
use super::xml;
use crate::config::TargetConfig;
use crate::error::S3Error;

/// Error type of request bodies.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;
/// Request body: empty, in memory, or streamed from the tenant's window.
pub type RequestBody = UnsyncBoxBody<Bytes, BodyError>;
/// A reply as received.
pub type Reply = Response<Incoming>;

/// Header carrying the agent's request id to targets (for their logs).
pub const REQUEST_ID_HEADER: &str = "x-s3dma-request-id";

/// Characters S3 wants encoded in paths: all but unreserved ones and `/`.
const PATH: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');
/// Query strings: all but unreserved ones.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// One S3 request, before signing.
#[derive(Debug)]
pub struct S3Call {
    /// HTTP method.
    pub method: Method,
    /// Bucket (path-style).
    pub bucket: String,
    /// Object key, or `None` for bucket-level requests.
    pub key: Option<String>,
    /// Query parameters (names and values unencoded); a value of `None` is
    /// a bare flag such as `?uploads`.
    pub query: Vec<(&'static str, Option<String>)>,
    /// Headers to send and sign (besides host, date, auth, payload hash).
    pub headers: HeaderMap,
    /// Body and its exact length.
    pub body: Option<(RequestBody, u64)>,
}

impl S3Call {
    /// A call without query, headers or body.
    #[must_use]
    pub fn new(method: Method, bucket: &str, key: Option<&str>) -> S3Call {
        S3Call {
            method,
            bucket: bucket.to_owned(),
            key: key.map(str::to_owned),
            query: Vec::new(),
            headers: HeaderMap::new(),
            body: None,
        }
    }

    /// Adds a header (values that are not valid header text are refused).
    ///
    /// # Errors
    /// [`InvalidHeader`]: the value is not a valid header value.
    pub fn header(&mut self, name: &'static str, value: &str) -> Result<(), InvalidHeader> {
        let v = HeaderValue::from_str(value).map_err(|_| InvalidHeader { name })?;
        self.headers.insert(HeaderName::from_static(name), v);
        Ok(())
    }
}

/// A value that cannot be sent in an HTTP header.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the {name} value is not valid in an HTTP header")]
pub struct InvalidHeader {
    /// The header.
    pub name: &'static str,
}

/// Why a target's client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TargetClientError {
    /// The endpoint has no `scheme://` (the configuration check refuses
    /// this first).
    #[error("target {target}: the endpoint has no scheme")]
    NoScheme {
        /// The target's name.
        target: String,
    },
    /// The endpoint's host cannot be a `Host` header.
    #[error("target {target}: the endpoint's host is not valid in a Host header")]
    Host {
        /// The target's name.
        target: String,
    },
    /// The CA file cannot be read or holds an unusable certificate.
    #[error("target {target}: ca_file {}", path.display())]
    CaFile {
        /// The target's name.
        target: String,
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// rustls refused its protocol versions.
    #[error("target {target}: TLS set-up")]
    Tls {
        /// The target's name.
        target: String,
        /// Why.
        #[source]
        source: rustls::Error,
    },
}

/// A reply body that could not be read whole.
#[derive(Debug, thiserror::Error)]
#[error("reading the reply body failed")]
pub struct ReadBodyError(#[source] BodyError);

/// Why a request got no reply.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The request could not be built or signed.
    #[error("{0}")]
    Build(String),
    /// Connecting or the exchange failed (retryable).
    #[error("{0}")]
    Transport(String),
}

/// The client for one target.
pub struct TargetClient {
    /// Configured name.
    pub name: String,
    /// `scheme://authority` without a trailing slash.
    base: String,
    host: HeaderValue,
    /// SigV4 region.
    pub region: String,
    /// Whether to send `x-amz-rdma-token`s to this target.
    pub rdma: bool,
    /// Its dialect (when `rdma`).
    pub protocol: crate::config::RdmaProtocol,
    /// The header carrying the token.
    pub token_header: String,
    /// Whether it answers (groups skip a target that does not, for a while).
    pub health: Health,
    /// Whether its multipart PUTs send their parts over HTTP: configured
    /// (`multipart_parts: http`), or set once an upload whose parts went by
    /// RDMA was found stored short (the server ignores the part target).
    pub parts_over_http: std::sync::atomic::AtomicBool,
    http: Client<hyper_rustls::HttpsConnector<HttpConnector>, RequestBody>,
}

/// A target's health as its group sees it: after a request got no answer
/// (connection refused or reset, timeout), the target cools down for a
/// while, during which its group sends chunks to the next target of their
/// ranking; the first answer ends it.
#[derive(Debug, Default)]
pub struct Health {
    down_until: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Health {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<std::time::Instant>> {
        self.down_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the target is not cooling down.
    #[must_use]
    pub fn is_up(&self) -> bool {
        self.lock()
            .is_none_or(|until| std::time::Instant::now() >= until)
    }

    /// A request got no answer: cool down for `for_`. Returns whether the
    /// target was up before.
    pub fn failed(&self, for_: Duration) -> bool {
        let was_up = self.is_up();
        *self.lock() = Some(std::time::Instant::now() + for_);
        was_up
    }

    /// An answer came: up again. Returns whether it was down.
    pub fn answered(&self) -> bool {
        self.lock().take().is_some()
    }
}

impl fmt::Debug for TargetClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TargetClient")
            .field("name", &self.name)
            .field("base", &self.base)
            .field("rdma", &self.rdma)
            .field("protocol", &self.protocol)
            .finish_non_exhaustive()
    }
}

impl TargetClient {
    /// Builds the client (TLS roots: webpki's plus `ca_file`).
    ///
    /// # Errors
    /// [`TargetClientError`]: an unreadable CA file or a malformed endpoint.
    pub fn new(
        cfg: &TargetConfig,
        connect_timeout: Duration,
    ) -> Result<Arc<TargetClient>, TargetClientError> {
        let target = || cfg.name.clone();
        let base = cfg.endpoint.trim_end_matches('/').to_owned();
        let authority = base
            .split_once("://")
            .map(|(_, a)| a)
            .ok_or_else(|| TargetClientError::NoScheme { target: target() })?;
        let host = HeaderValue::from_str(authority)
            .map_err(|_| TargetClientError::Host { target: target() })?;
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(ca) = &cfg.ca_file {
            use rustls_pki_types::pem::PemObject as _;
            let ca_err = |e: Box<dyn std::error::Error + Send + Sync>| TargetClientError::CaFile {
                target: target(),
                path: ca.clone(),
                source: e,
            };
            let certs = rustls_pki_types::CertificateDer::pem_file_iter(ca)
                .map_err(|e| ca_err(Box::new(e)))?;
            for c in certs {
                let c = c.map_err(|e| ca_err(Box::new(e)))?;
                roots.add(c).map_err(|e| ca_err(Box::new(e)))?;
            }
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|source| TargetClientError::Tls {
            target: target(),
            source,
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(cfg.max_idle_connections)
            // Below the idle limits of S3 servers (our storage-target drops
            // a connection that sends no request head for 30 s), so a pooled
            // connection is rarely picked just as the server closes it.
            .pool_idle_timeout(Duration::from_secs(20))
            .pool_timer(TokioTimer::new())
            .build(connector);
        Ok(Arc::new(TargetClient {
            name: cfg.name.clone(),
            base,
            host,
            region: cfg.region.clone(),
            rdma: cfg.rdma,
            protocol: cfg.protocol,
            token_header: cfg.token_header.clone(),
            health: Health::default(),
            parts_over_http: std::sync::atomic::AtomicBool::new(
                cfg.multipart_parts == crate::config::MultipartParts::Http,
            ),
            http: client,
        }))
    }

    /// The URL of `call` (path-style, encoded once).
    #[must_use]
    pub fn url(&self, call: &S3Call) -> String {
        let mut url = format!("{}/{}", self.base, utf8_percent_encode(&call.bucket, PATH));
        if let Some(k) = &call.key {
            url.push('/');
            url.extend(utf8_percent_encode(k, PATH));
        }
        for (i, (name, value)) in call.query.iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(name);
            if let Some(v) = value {
                url.push('=');
                url.extend(utf8_percent_encode(v, QUERY));
            }
        }
        url
    }

    /// Signs and sends `call` once.
    ///
    /// # Errors
    /// [`SendError::Build`] for requests that cannot be formed (never
    /// retryable), [`SendError::Transport`] when no reply came.
    pub async fn send(
        &self,
        signer: &Signer,
        call: S3Call,
        request_id: &str,
    ) -> Result<Reply, SendError> {
        let url = self.url(&call);
        let mut headers = call.headers;
        headers.insert(http::header::HOST, self.host.clone());
        let (body, len) = call
            .body
            .unwrap_or_else(|| (Empty::new().map_err(|e| match e {}).boxed_unsync(), 0));
        if len > 0 || call.method == Method::PUT || call.method == Method::POST {
            headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(len));
        }
        signer
            .sign(
                call.method.as_str(),
                &url,
                &self.region,
                &mut headers,
                SystemTime::now(),
            )
            .map_err(|e| SendError::Build(e.to_string()))?;
        // Not signed: only for the target's logs.
        if let Ok(v) = HeaderValue::from_str(request_id) {
            headers.insert(REQUEST_ID_HEADER, v);
        }
        headers.insert(
            http::header::USER_AGENT,
            HeaderValue::from_static(concat!("s3dma-dpu-agent/", env!("CARGO_PKG_VERSION"))),
        );
        let mut req = http::Request::builder()
            .method(call.method)
            .uri(&url)
            .body(body)
            .map_err(|e| SendError::Build(format!("invalid request for {url}: {e}")))?;
        *req.headers_mut() = headers;
        self.http.request(req).await.map_err(|e| {
            let mut msg = format!("target {} ({}): {e}", self.name, self.base);
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(": ");
                msg.push_str(&s.to_string());
                src = s.source();
            }
            SendError::Transport(msg)
        })
    }
}

/// An in-memory request body.
#[must_use]
pub fn full_body(bytes: Bytes) -> (RequestBody, u64) {
    let len = bytes.len() as u64;
    (Full::new(bytes).map_err(|e| match e {}).boxed_unsync(), len)
}

/// Reads a (small) reply body, refusing more than `limit` bytes.
///
/// # Errors
/// [`ReadBodyError`]: the transport failed or the body is larger than `limit`.
pub async fn read_small(
    reply: Reply,
    limit: usize,
) -> Result<(http::response::Parts, Bytes), ReadBodyError> {
    let (parts, body) = reply.into_parts();
    let bytes = Limited::new(body, limit)
        .collect()
        .await
        .map_err(ReadBodyError)?
        .to_bytes();
    Ok((parts, bytes))
}

/// The S3 error of a non-success reply (its XML body, or the status alone
/// for bodiless replies such as HEAD).
pub async fn error_of(reply: Reply) -> S3Error {
    let status = reply.status();
    let header_id = header(reply.headers(), "x-amz-request-id").unwrap_or_default();
    let body = read_small(reply, 64 << 10)
        .await
        .map(|(_, b)| b)
        .unwrap_or_default();
    error_from_parts(status, &header_id, &body)
}

/// The S3 error for `status` with `body` (pure; used by [`error_of`]).
#[must_use]
pub fn error_from_parts(status: StatusCode, header_request_id: &str, body: &[u8]) -> S3Error {
    let parsed: Option<xml::ErrorBody> = if body.is_empty() {
        None
    } else {
        xml::parse(body).ok()
    };
    let (code, message, rid) = match parsed {
        Some(e) if !e.code.is_empty() => (e.code, e.message, e.request_id),
        _ => (
            default_code(status).to_owned(),
            default_message(status).to_owned(),
            String::new(),
        ),
    };
    S3Error {
        code,
        message,
        request_id: if rid.is_empty() {
            header_request_id.to_owned()
        } else {
            rid
        },
        http_status: status.as_u16(),
    }
}

fn default_code(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "BadRequest",
        403 => "AccessDenied",
        404 => "NoSuchKey",
        409 => "Conflict",
        412 => "PreconditionFailed",
        416 => "InvalidRange",
        500 => "InternalError",
        501 => "NotImplemented",
        503 => "ServiceUnavailable",
        _ => "UnknownError",
    }
}

/// The message of a reply without an S3 error body (a HEAD's): S3's own
/// wording where the status says enough, else the HTTP reason.
fn default_message(status: StatusCode) -> &'static str {
    match status.as_u16() {
        403 => "Access Denied",
        404 => "The specified key does not exist.",
        412 => "At least one of the pre-conditions you specified did not hold",
        416 => "The requested range is not satisfiable",
        _ => status.canonical_reason().unwrap_or("error"),
    }
}

/// A header as text (`None` when absent or not text).
#[must_use]
pub fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get(name)?.to_str().ok().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_from_xml_or_status() {
        let e = error_from_parts(
            StatusCode::NOT_FOUND,
            "H",
            b"<Error><Code>NoSuchBucket</Code><Message>m</Message></Error>",
        );
        assert_eq!(
            (e.code.as_str(), e.request_id.as_str(), e.http_status),
            ("NoSuchBucket", "H", 404)
        );
        let e = error_from_parts(StatusCode::PRECONDITION_FAILED, "", b"");
        assert_eq!(e.code, "PreconditionFailed");
        let e = error_from_parts(StatusCode::BAD_GATEWAY, "", b"<html>proxy</html>");
        assert_eq!((e.code.as_str(), e.http_status), ("UnknownError", 502));
    }
}
