//! SigV4 signing, one [`Signer`] per tenant.
//!
//! Every header the agent puts on a request is signed, so an
//! `x-amz-rdma-token` is always among the SignedHeaders (the target refuses
//! RDMA requests whose token is not). Payloads are `UNSIGNED-PAYLOAD`: RDMA
//! requests have none, and fallback bodies come from the tenant's window,
//! which the agent would otherwise have to hash on its slow cores.
//!
//! Two ways to the same signature:
//! - requests without a query string (GetObject, HeadObject, PutObject,
//!   DeleteObject: every request of the data path) are canonicalised here,
//!   and signed with a signing key derived once per day and region
//!   ([`aws_sigv4::sign::v4::generate_signing_key`], cached) and
//!   [`aws_sigv4::sign::v4::calculate_signature`]: aws-sigv4's `sign`
//!   derives the key (four HMACs) and builds a canonical header map on every
//!   call, about a tenth of the agent's CPU per small request;
//! - requests with a query string (listings, multipart calls) go through
//!   aws-sigv4's `sign` whole, which decodes and re-encodes the parameters.
//!
//! The tests hold the first way to the second: for any request both produce
//! the same `authorization` header.
//!
//! A request whose body must be signed (an s3dma batch request, whose body
//! lists keys and tokens) carries the body's SHA-256 in
//! `x-amz-content-sha256` when it is signed: that hash, not
//! `UNSIGNED-PAYLOAD`, is then the payload hash of its signature (the
//! second way).

use std::fmt;
use std::sync::Mutex;
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode, sign,
};
use aws_smithy_runtime_api::client::identity::Identity;
use http::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest as _, Sha256};

/// What every data-path request sends as its payload hash.
const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

/// Headers aws-sigv4 leaves unsigned by default (they may change in
/// transit); the fast path leaves out the same.
const UNSIGNED_HEADERS: [&str; 4] = [
    "authorization",
    "user-agent",
    "x-amzn-trace-id",
    "transfer-encoding",
];

/// Signs requests with one tenant's credentials.
pub struct Signer {
    identity: Identity,
    credentials: Credentials,
    access_key_id: String,
    /// The signing key of the last (day, region) used.
    key: Mutex<Option<SigningKey>>,
}

/// A derived SigV4 signing key and the scope it is for.
struct SigningKey {
    /// `YYYYMMDD`.
    date: String,
    region: String,
    key: [u8; 32],
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret, nor the key derived from it.
        f.debug_struct("Signer")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// Why a request could not be signed.
#[derive(Debug, thiserror::Error)]
#[error("cannot sign the request: {0}")]
pub struct SignError(String);

impl Signer {
    /// A signer for `access_key_id` / `secret`.
    #[must_use]
    pub fn new(access_key_id: &str, secret: &str) -> Signer {
        let credentials = Credentials::new(access_key_id, secret, None, None, "dpu-agent-config");
        Signer {
            identity: credentials.clone().into(),
            credentials,
            access_key_id: access_key_id.to_owned(),
            key: Mutex::new(None),
        }
    }

    /// The access key id (not secret).
    #[must_use]
    pub fn access_key_id(&self) -> &str {
        &self.access_key_id
    }

    /// Adds `x-amz-date`, `x-amz-content-sha256: UNSIGNED-PAYLOAD` and
    /// `authorization` to `headers` (which must already hold `host` and
    /// everything else to sign) for `method` on `url` in `region`.
    ///
    /// # Errors
    /// A header value that is not valid for signing, or a URL without a
    /// path.
    pub fn sign(
        &self,
        method: &str,
        url: &str,
        region: &str,
        headers: &mut HeaderMap,
        now: SystemTime,
    ) -> Result<(), SignError> {
        if url.contains('?')
            || !headers.contains_key(http::header::HOST)
            || headers.contains_key("x-amz-content-sha256")
        {
            return self.sign_with_aws_sigv4(method, url, region, headers, now);
        }
        let path = url_path(url)?;
        let date_time = format_date_time(now)?;
        let date = &date_time[..8];
        headers.insert(
            "x-amz-content-sha256",
            HeaderValue::from_static(UNSIGNED_PAYLOAD),
        );
        headers.insert(
            "x-amz-date",
            HeaderValue::from_str(&date_time).map_err(|e| SignError(e.to_string()))?,
        );
        let (canonical, signed_headers) = canonical_request(method, path, headers)?;
        let scope = format!("{date}/{region}/s3/aws4_request");
        let string_to_sign = format!(
            "AWS4-HMAC-SHA256\n{date_time}\n{scope}\n{}",
            hex::encode(Sha256::digest(canonical.as_bytes()))
        );
        let signature = {
            let mut cached = self.key.lock().unwrap_or_else(|p| p.into_inner());
            let key = match cached.as_ref() {
                Some(k) if k.date == date && k.region == region => &k.key,
                _ => {
                    let derived = aws_sigv4::sign::v4::generate_signing_key(
                        self.credentials.secret_access_key(),
                        now,
                        region,
                        "s3",
                    );
                    let mut key = [0u8; 32];
                    key.copy_from_slice(derived.as_ref());
                    &cached
                        .insert(SigningKey {
                            date: date.to_owned(),
                            region: region.to_owned(),
                            key,
                        })
                        .key
                }
            };
            aws_sigv4::sign::v4::calculate_signature(key, string_to_sign.as_bytes())
        };
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
            self.access_key_id
        );
        let mut value =
            HeaderValue::from_str(&authorization).map_err(|e| SignError(e.to_string()))?;
        value.set_sensitive(true);
        headers.insert(http::header::AUTHORIZATION, value);
        Ok(())
    }

    /// [`Signer::sign`] by aws-sigv4's `sign`, whole.
    fn sign_with_aws_sigv4(
        &self,
        method: &str,
        url: &str,
        region: &str,
        headers: &mut HeaderMap,
        now: SystemTime,
    ) -> Result<(), SignError> {
        // A body hash the caller set is the payload hash (aws-sigv4 puts
        // the header back).
        let payload = headers
            .remove("x-amz-content-sha256")
            .map(|v| {
                v.to_str()
                    .map(str::to_owned)
                    .map_err(|_| SignError("x-amz-content-sha256 is not text".into()))
            })
            .transpose()?;
        let mut settings = SigningSettings::default();
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        // S3 signs the path as sent: encoded once, not normalised.
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&self.identity)
            .region(region)
            .name("s3")
            .time(now)
            .settings(settings)
            .build()
            .map_err(|e| SignError(e.to_string()))?
            .into();
        let pairs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| {
                v.to_str()
                    .map(|v| (k.as_str(), v))
                    .map_err(|_| SignError(format!("header {k} is not visible ASCII")))
            })
            .collect::<Result<_, _>>()?;
        let signable = SignableRequest::new(
            method,
            url,
            pairs.into_iter(),
            payload
                .as_deref()
                .map_or(SignableBody::UnsignedPayload, |h| {
                    SignableBody::Precomputed(h.to_owned())
                }),
        )
        .map_err(|e| SignError(e.to_string()))?;
        let (instructions, _signature) = sign(signable, &params)
            .map_err(|e| SignError(e.to_string()))?
            .into_parts();
        let (new_headers, _params) = instructions.into_parts();
        for h in new_headers {
            let name = HeaderName::from_bytes(h.name().as_bytes())
                .map_err(|e| SignError(e.to_string()))?;
            let value = HeaderValue::from_str(h.value()).map_err(|e| SignError(e.to_string()))?;
            headers.insert(name, value);
        }
        Ok(())
    }
}

/// The path of an absolute `scheme://authority/path` URL, as sent.
fn url_path(url: &str) -> Result<&str, SignError> {
    let rest = url
        .split_once("://")
        .map(|(_, rest)| rest)
        .ok_or_else(|| SignError(format!("{url:?} is not an absolute URL")))?;
    Ok(rest.find('/').map_or("/", |i| &rest[i..]))
}

/// `YYYYMMDDTHHMMSSZ` in UTC.
fn format_date_time(now: SystemTime) -> Result<String, SignError> {
    let t = time::OffsetDateTime::from(now);
    t.format(time::macros::format_description!(
        "[year][month][day]T[hour][minute][second]Z"
    ))
    .map_err(|e| SignError(format!("the clock: {e}")))
}

/// The canonical request of a request without a query string, and its
/// SignedHeaders: headers by name (names are lower case in a `HeaderMap`),
/// values trimmed of spaces with runs of spaces made one, repeated headers
/// joined with `,` in the order they were added.
fn canonical_request(
    method: &str,
    path: &str,
    headers: &HeaderMap,
) -> Result<(String, String), SignError> {
    let mut names: Vec<&str> = headers
        .keys()
        .map(HeaderName::as_str)
        .filter(|n| !UNSIGNED_HEADERS.contains(n))
        .collect();
    names.sort_unstable();
    let mut out = String::with_capacity(512);
    out.push_str(method);
    out.push('\n');
    out.push_str(path);
    out.push_str("\n\n");
    for name in &names {
        out.push_str(name);
        out.push(':');
        for (i, v) in headers.get_all(*name).iter().enumerate() {
            let v = v
                .to_str()
                .map_err(|_| SignError(format!("header {name} is not visible ASCII")))?;
            if i > 0 {
                out.push(',');
            }
            push_trimmed(&mut out, v);
        }
        out.push('\n');
    }
    out.push('\n');
    let signed = names.join(";");
    out.push_str(&signed);
    out.push('\n');
    out.push_str(UNSIGNED_PAYLOAD);
    Ok((out, signed))
}

/// `value` without leading and trailing spaces, each run of spaces made one
/// (S3 trims only spaces, not other whitespace).
fn push_trimmed(out: &mut String, value: &str) {
    let mut last_space = false;
    for c in value.trim_matches(' ').chars() {
        if c == ' ' {
            if !last_space {
                out.push(' ');
            }
            last_space = true;
        } else {
            out.push(c);
            last_space = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs)
    }

    #[test]
    fn signs_every_header_and_hides_the_secret() {
        let s = Signer::new("AKIDEXAMPLE", "very-secret-value");
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("127.0.0.1:9000"));
        h.insert("x-amz-rdma-token", HeaderValue::from_static("00ff"));
        h.insert("range", HeaderValue::from_static("bytes=0-9"));
        s.sign(
            "GET",
            "http://127.0.0.1:9000/b/a%20key",
            "us-east-1",
            &mut h,
            at(1_700_000_000),
        )
        .unwrap();
        let auth = h["authorization"].to_str().unwrap();
        assert!(auth.starts_with(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20231114/us-east-1/s3/aws4_request"
        ));
        assert!(
            auth.contains(
                "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date;x-amz-rdma-token"
            ),
            "{auth}"
        );
        assert_eq!(h["x-amz-content-sha256"], "UNSIGNED-PAYLOAD");
        assert!(!format!("{s:?}").contains("very-secret"));
        assert!(!auth.contains("very-secret"));
    }

    #[test]
    fn a_body_hash_set_by_the_caller_is_the_payload_hash() {
        let s = Signer::new("AKIDEXAMPLE", "very-secret-value");
        let sign = |hash: Option<&str>| {
            let mut h = HeaderMap::new();
            h.insert("host", HeaderValue::from_static("127.0.0.1:9000"));
            if let Some(v) = hash {
                h.insert("x-amz-content-sha256", HeaderValue::from_str(v).unwrap());
            }
            s.sign(
                "POST",
                "http://127.0.0.1:9000/?s3dma-batch",
                "us-east-1",
                &mut h,
                at(1_700_000_000),
            )
            .unwrap();
            h
        };
        let body = hex::encode(Sha256::digest(b"{}"));
        let hashed = sign(Some(&body));
        assert_eq!(hashed["x-amz-content-sha256"], body.as_str());
        assert_eq!(hashed.get_all("x-amz-content-sha256").iter().count(), 1);
        let unsigned = sign(None);
        assert_eq!(unsigned["x-amz-content-sha256"], "UNSIGNED-PAYLOAD");
        assert_ne!(hashed["authorization"], unsigned["authorization"]);
        // Without a query string too.
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("127.0.0.1:9000"));
        h.insert(
            "x-amz-content-sha256",
            HeaderValue::from_str(&body).unwrap(),
        );
        s.sign(
            "PUT",
            "http://127.0.0.1:9000/b/k",
            "us-east-1",
            &mut h,
            at(1),
        )
        .unwrap();
        assert_eq!(h["x-amz-content-sha256"], body.as_str());
    }

    /// A signer and headers holding only `host`, as the agent's requests start.
    fn signer_and_host() -> (Signer, HeaderMap) {
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("t:1"));
        (Signer::new("AKID", "secret"), h)
    }

    /// Both ways of signing, on copies of the same headers.
    fn both(
        s: &Signer,
        method: &str,
        url: &str,
        region: &str,
        h: &HeaderMap,
        now: SystemTime,
    ) -> (HeaderMap, HeaderMap) {
        let mut fast = h.clone();
        s.sign(method, url, region, &mut fast, now).unwrap();
        let mut reference = h.clone();
        s.sign_with_aws_sigv4(method, url, region, &mut reference, now)
            .unwrap();
        (fast, reference)
    }

    #[test]
    fn the_cached_key_follows_the_day_and_the_region() {
        let (s, h) = signer_and_host();
        // Same day, next day (the cached key must not be reused), back to
        // the first day, another region.
        for (secs, region) in [
            (1_700_000_000, "us-east-1"),
            (1_700_000_100, "us-east-1"),
            (1_700_086_400, "us-east-1"),
            (1_700_000_000, "us-east-1"),
            (1_700_000_000, "eu-west-3"),
        ] {
            let (fast, reference) = both(&s, "GET", "http://t:1/b/k", region, &h, at(secs));
            assert_eq!(
                fast["authorization"], reference["authorization"],
                "{secs} {region}"
            );
            assert_eq!(fast["x-amz-date"], reference["x-amz-date"]);
        }
    }

    #[test]
    fn queries_go_through_aws_sigv4() {
        let (s, h) = signer_and_host();
        let (fast, reference) = both(
            &s,
            "GET",
            "http://t:1/b?list-type=2&prefix=a%20b",
            "us-east-1",
            &h,
            at(1_700_000_000),
        );
        assert_eq!(fast["authorization"], reference["authorization"]);
    }

    #[test]
    fn a_header_that_is_not_visible_ascii_is_refused() {
        let (s, mut h) = signer_and_host();
        h.insert(
            "x-amz-meta-a",
            HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        );
        let e = s
            .sign("PUT", "http://t:1/b/k", "us-east-1", &mut h, at(1))
            .unwrap_err();
        assert!(e.to_string().contains("x-amz-meta-a"), "{e}");
    }

    fn header_value() -> impl Strategy<Value = String> {
        // Printable ASCII with runs of spaces at either end and inside.
        proptest::string::string_regex("[ ]{0,3}[!-~]{0,6}([ ]{1,3}[!-~]{1,6}){0,3}[ ]{0,3}")
            .unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The fast path signs exactly what aws-sigv4 signs.
        #[test]
        fn the_fast_path_signs_what_aws_sigv4_signs(
            method in prop::sample::select(vec!["GET", "HEAD", "PUT", "DELETE", "POST"]),
            path in "(/[a-zA-Z0-9%._~-]{0,12}){1,4}",
            region in "[a-z]{2}-[a-z]{4,9}-[1-9]",
            secs in 0u64..4_102_444_800,
            headers in prop::collection::vec(
                (
                    prop::sample::select(vec![
                        "range", "if-match", "x-amz-rdma-token", "content-length",
                        "content-type", "x-amz-meta-a", "x-amz-meta-zz", "user-agent",
                        "x-request-id", "cache-control",
                    ]),
                    header_value(),
                ),
                0..8,
            ),
        ) {
            let s = Signer::new("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY");
            let mut h = HeaderMap::new();
            h.insert("host", HeaderValue::from_static("127.0.0.1:9000"));
            for (name, value) in &headers {
                h.append(*name, HeaderValue::from_str(value).unwrap());
            }
            let url = format!("http://127.0.0.1:9000{path}");
            let (fast, reference) = both(&s, method, &url, &region, &h, at(secs));
            prop_assert_eq!(&fast["authorization"], &reference["authorization"]);
            prop_assert_eq!(&fast["x-amz-date"], &reference["x-amz-date"]);
            prop_assert_eq!(
                &fast["x-amz-content-sha256"],
                &reference["x-amz-content-sha256"]
            );
        }
    }
}
