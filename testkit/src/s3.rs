//! aws-sdk-s3 clients for a test user, the get/put helpers, the error code
//! of a failed call, and SigV4 signing of hand-made requests.

use std::time::SystemTime;

use aws_sdk_s3::Client;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};

/// An HTTPS-capable client for aws-sdk-s3: aws-smithy's hyper client with
/// rustls on ring (as the workspace's own clients; aws-sdk-s3 is built
/// without its default client).
#[must_use]
pub fn https_client() -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    use aws_smithy_http_client::tls;
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

/// An aws-sdk-s3 client for `endpoint` (path-style, `us-east-1`) as the
/// user `ak`/`sk`.
#[must_use]
pub fn s3_client(endpoint: &str, ak: &str, sk: &str) -> Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(https_client())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(ak, sk, None, None, "test"))
        .force_path_style(true)
        .build();
    Client::from_conf(conf)
}

/// Creates bucket `b` as `client`'s user.
///
/// # Panics
/// When the call fails.
pub async fn create_bucket(client: &Client, b: &str) {
    let r = client.create_bucket().bucket(b).send().await;
    or_panic(r, || format!("CreateBucket {b}"));
}

/// Reads `b/k` as `client`'s user; `None` when the call fails (no such
/// object, access denied, …).
///
/// # Panics
/// When the body breaks off.
pub async fn get_as(client: &Client, b: &str, k: &str) -> Option<Vec<u8>> {
    let r = client.get_object().bucket(b).key(k).send().await.ok()?;
    Some(r.body.collect().await.unwrap().to_vec())
}

/// Stores `d` at `b/k` as `client`'s user.
///
/// # Panics
/// When the call fails.
pub async fn put_as(client: &Client, b: &str, k: &str, d: Vec<u8>) {
    let put = client.put_object().bucket(b).key(k);
    let r = put
        .body(aws_sdk_s3::primitives::ByteStream::from(d))
        .send()
        .await;
    or_panic(r, || format!("PutObject {b}/{k}"));
}

/// The value of an SDK call's result; a panic naming `what` and the
/// error with its sources when it failed.
fn or_panic<T, E: std::error::Error>(r: Result<T, E>, what: impl FnOnce() -> String) -> T {
    r.unwrap_or_else(|e| panic!("{}: {}", what(), aws_sdk_s3::error::DisplayErrorContext(e)))
}

/// The S3 error code and HTTP status of a failed SDK call (`<…>` around
/// the error's kind when it is not a service error).
pub fn sdk_error<E>(
    e: aws_sdk_s3::error::SdkError<E, aws_smithy_runtime_api::http::Response>,
) -> (String, u16)
where
    E: aws_sdk_s3::error::ProvideErrorMetadata + std::fmt::Debug,
{
    use aws_sdk_s3::error::SdkError;
    let status = e.raw_response().map_or(0, |r| r.status().as_u16());
    let code = match &e {
        SdkError::ServiceError(s) => s.err().code().unwrap_or("<none>").to_owned(),
        other => format!("<{other:?}>"),
    };
    (code, status)
}

/// Signs a raw request as `(ak, sk)` with SigV4 in the Authorization
/// header (region `us-east-1`, service `s3`, `x-amz-content-sha256` from
/// `body`) at `time`. Returns `host`, the `extra` headers (all signed) and
/// the signing headers, ready to send.
///
/// # Panics
/// When `url` has no host or cannot be signed.
pub fn sign_v4_as(
    (ak, sk): (&str, &str),
    method: &str,
    url: &str,
    extra: &[(&str, &str)],
    body: aws_sigv4::http_request::SignableBody<'_>,
    time: SystemTime,
) -> Vec<(String, String)> {
    use aws_sigv4::http_request::{PayloadChecksumKind, SignableRequest, SigningSettings, sign};
    let identity = aws_credential_types::Credentials::new(ak, sk, None, None, "t").into();
    let mut settings = SigningSettings::default();
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("s3")
        .time(time)
        .settings(settings)
        .build()
        .expect("signing params")
        .into();
    let host = url.split('/').nth(2).expect("url has a host").to_owned();
    let extra = extra.iter().map(|&(k, v)| (k.to_owned(), v.to_owned()));
    let mut headers: Vec<(String, String)> = std::iter::once(("host".to_owned(), host))
        .chain(extra)
        .collect();
    let req = SignableRequest::new(
        method,
        url,
        headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        body,
    )
    .expect("signable request");
    let (instr, _) = sign(req, &params).expect("sign").into_parts();
    let (hs, _) = instr.into_parts();
    headers.extend(
        hs.into_iter()
            .map(|h| (h.name().to_owned(), h.value().to_owned())),
    );
    headers
}

/// A raw HTTP response ([`raw`]).
#[derive(Debug)]
pub struct Raw {
    /// The status code.
    pub status: u16,
    /// The headers.
    pub headers: http::HeaderMap,
    /// The whole body.
    pub body: bytes::Bytes,
}

impl Raw {
    /// The body as text (lossy).
    #[must_use]
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Header `name`, when present and text.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The text of the first `<tag>` in the body.
    #[must_use]
    pub fn xml(&self, tag: &str) -> Option<String> {
        let t = self.text();
        let open = format!("<{tag}>");
        let a = t.find(&open)? + open.len();
        let b = t[a..].find(&format!("</{tag}>"))? + a;
        Some(t[a..b].to_owned())
    }
}

/// Sends a raw HTTP/1 request (unsigned unless `headers` carry a
/// signature, e.g. from [`sign_v4_as`], or the URL is presigned) and reads
/// the whole response.
///
/// # Panics
/// When the request cannot be sent or the response read.
pub async fn raw(method: &str, url: &str, headers: &[(&str, &str)], body: bytes::Bytes) -> Raw {
    use http_body_util::BodyExt as _;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let mut req = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(http_body_util::Full::new(body)).unwrap())
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Raw {
        status,
        headers,
        body,
    }
}
