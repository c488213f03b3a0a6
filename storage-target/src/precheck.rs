//! Request rules applied before s3s sees a request: the parts of S3's
//! behaviour that s3s leaves out or applies more strictly than AWS does.
//!
//! Pure functions over the request head, no I/O, unit-tested here:
//! - headers a server must ignore when they are invalid (RFC 7233 §3.1 for
//!   `Range`, RFC 7232 §3.3/§3.4 for the `If-*-Since` dates) are dropped
//!   instead of failing the request, as AWS S3 and MinIO do — but only when
//!   they are not among the SigV4 signed headers: the signature covers them
//!   and s3s verifies it on the headers as sent, so a signed invalid header
//!   still fails with s3s's `InvalidArgument` (a known deviation);
//! - one auth mechanism per request, in the exact form s3s verifies (see
//!   [`AuthClaim`]): a SigV4 `Authorization` header, or a presigned URL with
//!   all six `X-Amz-*` parameters, or SigV2 when the operator allows it, or
//!   none (anonymous); anything in between is refused here, so that what
//!   the handlers later read as "signed" is exactly what s3s verified;
//! - every `x-amz-*` header of a SigV4 request is among its signed headers
//!   (AWS: 403 "There were headers present in the request which were not
//!   signed"), so the holder of a presigned URL cannot add a copy source, an
//!   ACL or an RDMA token to it; see [`UNSIGNED_AMZ_HEADERS_ALLOWED`];
//! - the SigV4 credential scope must name this server's region; presigned
//!   URLs are valid for at most a week;
//! - SigV2 is refused unless `allow_sigv2` is set, and then held to the
//!   SigV4 limits (presigned `Expires` at most a week ahead, a signed
//!   `Date`/`x-amz-date` within the clock skew);
//! - `x-amz-metadata-directive` is COPY or REPLACE; user metadata ≤ 2 KiB.

use std::time::{SystemTime, UNIX_EPOCH};

use http::HeaderValue;
use http::request::Parts;
use percent_encoding::percent_decode_str;
use s3s::{S3Error, S3ErrorCode};

/// Longest presigned-URL validity AWS accepts (`X-Amz-Expires`), in seconds.
pub const MAX_PRESIGN_EXPIRES_SECS: i64 = 604_800;

/// Largest total size of user metadata (`x-amz-meta-*` names without the
/// prefix plus values, in bytes) S3 accepts.
pub const MAX_USER_METADATA_BYTES: usize = 2048;

/// The `x-amz-*` headers a SigV4 request may carry without signing them:
/// `x-amz-content-sha256` (its value is the payload hash of the canonical
/// request, so the signature binds it anyway; on a presigned URL s3s checks
/// the body against it and refuses the streaming forms), and, on presigned
/// URLs only, the two headers AWS's own signer (`aws-sigv4`) leaves out of
/// presigned signatures: `x-amz-user-agent` (telemetry) and
/// `x-amz-checksum-mode` (asks for the stored checksum in a GET reply).
/// None of them changes what the request does to a resource.
pub const UNSIGNED_AMZ_HEADERS_ALLOWED: [&str; 3] = [
    "x-amz-content-sha256",
    "x-amz-user-agent",
    "x-amz-checksum-mode",
];

/// The presigned-URL query parameters of SigV4: all six or none.
const V4_QUERY_PARAMS: [&str; 6] = [
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
];

/// The operator's choices the rules depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthOptions {
    /// Accept SigV2 (header `Authorization: AWS key:sig`, query
    /// `AWSAccessKeyId`/`Signature`/`Expires`, POST forms). Default false.
    pub allow_sigv2: bool,
    /// Largest accepted distance between a SigV2 request's signed date and
    /// the server clock, in seconds (SigV4 requests: s3s checks it).
    pub max_clock_skew_secs: u32,
}

impl Default for AuthOptions {
    fn default() -> Self {
        AuthOptions {
            allow_sigv2: false,
            max_clock_skew_secs: 900,
        }
    }
}

/// How a request says it is authenticated: the mechanism s3s will verify
/// (s3s picks SigV2 when the query has `Signature` or the `Authorization`
/// header parses as SigV2, then SigV4 when the query has `X-Amz-Signature`
/// or there is an `Authorization` header; precheck refuses every other
/// shape, so both agree). Stored in the request's extensions; it is only
/// a claim until s3s has verified it: read it with [`verified_signed_headers`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthClaim {
    /// No signature in the head: anonymous, unless it is a POST form upload
    /// (signed in its body; s3s verifies that).
    Unsigned {
        /// Whether SigV2 POST forms are accepted (`allow_sigv2`).
        allow_sigv2: bool,
    },
    /// `Authorization: AWS4-HMAC-SHA256 ...`, with its `SignedHeaders`.
    V4Header(Vec<String>),
    /// A SigV4 presigned URL, with its `X-Amz-SignedHeaders`.
    V4Query(Vec<String>),
    /// `Authorization: AWS key:signature` (only with `allow_sigv2`).
    V2Header,
    /// A SigV2 presigned URL (only with `allow_sigv2`).
    V2Query,
}

impl AuthClaim {
    /// The SigV4 signed header names (as listed), empty for other mechanisms.
    #[must_use]
    pub fn v4_signed_headers(&self) -> &[String] {
        match self {
            AuthClaim::V4Header(h) | AuthClaim::V4Query(h) => h,
            _ => &[],
        }
    }
}

/// The SigV4 signed headers of a request s3s has verified: `credentials`
/// is `Some` only for a request whose signature s3s checked, and the claim
/// precheck stored names the mechanism it checked. Empty for anonymous,
/// SigV2 and POST-form requests.
#[must_use]
pub fn verified_signed_headers<'a>(
    credentials: Option<&s3s::auth::Credentials>,
    extensions: &'a http::Extensions,
) -> &'a [String] {
    match (credentials, extensions.get::<AuthClaim>()) {
        (Some(_), Some(claim)) => claim.v4_signed_headers(),
        _ => &[],
    }
}

/// Refuses a POST form upload signed with SigV2 when `allow_sigv2` is off
/// (the head of a POST form carries no signature, so precheck cannot see
/// it; s3s reports no region for SigV2 and the credential scope's region
/// for SigV4). For the `post_object` access hooks.
///
/// # Errors
/// [`sigv2_refused`].
pub fn check_post_form<T>(req: &s3s::S3Request<T>) -> Result<(), S3Error> {
    if let Some(AuthClaim::Unsigned { allow_sigv2: false }) = req.extensions.get::<AuthClaim>()
        && req.credentials.is_some()
        && req.region.is_none()
    {
        return Err(sigv2_refused());
    }
    Ok(())
}

/// The error answering a SigV2 request when `allow_sigv2` is off (AWS's
/// answer in regions without SigV2).
#[must_use]
pub fn sigv2_refused() -> S3Error {
    error(
        S3ErrorCode::InvalidRequest,
        "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256. \
         (Signature Version 2 is disabled on this server; its operator may enable it with allow_sigv2.)"
            .to_owned(),
    )
}

/// Applies the rules above to a request head at the current time.
/// Invalid ignorable headers are removed from `parts`, and the request's
/// [`AuthClaim`] is stored in its extensions; a rule violation is returned
/// as the S3 error to send.
///
/// # Errors
/// `AuthorizationHeaderMalformed`, `AuthorizationQueryParametersError`,
/// `AccessDenied`, `InvalidRequest`, `InvalidArgument`,
/// `RequestTimeTooSkewed` or `MetadataTooLarge`, with AWS's messages.
pub fn precheck(parts: &mut Parts, region: &str, opts: AuthOptions) -> Result<(), S3Error> {
    precheck_at(parts, region, opts, SystemTime::now())
}

/// [`precheck`] at time `now`.
///
/// # Errors
/// As [`precheck`].
pub fn precheck_at(
    parts: &mut Parts,
    region: &str,
    opts: AuthOptions,
    now: SystemTime,
) -> Result<(), S3Error> {
    let query = parse_query(parts.uri.query().unwrap_or(""));
    let claim = auth_claim(&parts.headers, &query, region, opts, now)?;
    let allowed: Option<&[&str]> = match &claim {
        AuthClaim::V4Header(_) => Some(&UNSIGNED_AMZ_HEADERS_ALLOWED[..1]),
        AuthClaim::V4Query(_) => Some(&UNSIGNED_AMZ_HEADERS_ALLOWED),
        _ => None,
    };
    if let Some(allowed) = allowed {
        check_amz_headers_signed(&parts.headers, claim.v4_signed_headers(), allowed)?;
    }
    let signed: Vec<String> = claim
        .v4_signed_headers()
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    sanitize_ignorable_headers(&mut parts.headers, &signed);
    check_metadata_directive(&parts.headers)?;
    check_user_metadata_size(&parts.headers)?;
    parts.extensions.insert(claim);
    Ok(())
}

fn error(code: S3ErrorCode, message: String) -> S3Error {
    S3Error::with_message(code, message)
}

/// The parts of a SigV4 `Authorization` header, parsed exactly as s3s
/// parses it (`AWS4-HMAC-SHA256 Credential=AK/date/region/service/aws4_request,
/// SignedHeaders=a;b, Signature=hex`), so that the signed headers read here
/// are the ones s3s verifies.
#[derive(Debug, PartialEq, Eq)]
struct V4Authorization<'a> {
    region: &'a str,
    signed_headers: Vec<String>,
}

fn parse_v4_authorization(value: &str) -> Option<V4Authorization<'_>> {
    let is_space = |c: char| matches!(c, ' ' | '\t' | '\r' | '\n');
    let rest = value.strip_prefix("AWS4-HMAC-SHA256")?;
    let trimmed = rest.trim_start_matches(is_space);
    if trimmed.len() == rest.len() {
        return None;
    }
    let rest = trimmed.strip_prefix("Credential=")?;
    // Access key id, date, region, service: each up to the next '/'.
    let (_ak, rest) = rest.split_once('/')?;
    let (date, rest) = rest.split_once('/')?;
    if date.len() != 8 || !date.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (region, rest) = rest.split_once('/')?;
    let (service, rest) = rest.split_once('/')?;
    if service.is_empty() {
        return None;
    }
    let rest = rest.strip_prefix("aws4_request,")?;
    let rest = rest
        .trim_start_matches(is_space)
        .strip_prefix("SignedHeaders=")?;
    let (list, rest) = rest.split_once(',')?;
    let rest = rest
        .trim_start_matches(is_space)
        .strip_prefix("Signature=")?;
    let end = rest.find(is_space).unwrap_or(rest.len());
    if !rest[end..].chars().all(is_space) {
        return None;
    }
    Some(V4Authorization {
        region,
        signed_headers: list.split(';').map(str::to_owned).collect(),
    })
}

/// What [`AuthClaim`] a request makes, refusing mixed, partial and
/// unsupported shapes, SigV2 unless allowed, and the region, expiry and
/// date rules.
fn auth_claim(
    headers: &http::HeaderMap,
    query: &[(String, String)],
    region: &str,
    opts: AuthOptions,
    now: SystemTime,
) -> Result<AuthClaim, S3Error> {
    let mut auth_values = headers.get_all(http::header::AUTHORIZATION).iter();
    let header_auth = auth_values.next();
    if auth_values.next().is_some() {
        return Err(error(
            S3ErrorCode::InvalidArgument,
            "Only one Authorization header is allowed".to_owned(),
        ));
    }
    let v4_query = V4_QUERY_PARAMS
        .iter()
        .filter(|n| **n != "X-Amz-Date" && **n != "X-Amz-Expires")
        .any(|n| query_get(query, n).is_some());
    let v2_query = ["Signature", "AWSAccessKeyId"]
        .iter()
        .any(|n| query_get(query, n).is_some());
    if [header_auth.is_some(), v4_query, v2_query]
        .iter()
        .filter(|b| **b)
        .count()
        > 1
    {
        return Err(error(
            S3ErrorCode::InvalidArgument,
            "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, \
             Signature query string parameter or the Authorization header should be specified"
                .to_owned(),
        ));
    }
    if let Some(value) = header_auth {
        let value = value.to_str().unwrap_or("");
        if value.starts_with("AWS ") {
            if !opts.allow_sigv2 {
                return Err(sigv2_refused());
            }
            check_v2_date(headers, opts, now)?;
            return Ok(AuthClaim::V2Header);
        }
        if !value.starts_with("AWS4-HMAC-SHA256") {
            return Err(error(
                S3ErrorCode::InvalidArgument,
                "Unsupported Authorization Type".to_owned(),
            ));
        }
        let Some(auth) = parse_v4_authorization(value) else {
            return Err(error(
                S3ErrorCode::AuthorizationHeaderMalformed,
                "The authorization header is malformed; it must be \
                 AWS4-HMAC-SHA256 Credential=<key>/<date>/<region>/s3/aws4_request, SignedHeaders=<list>, Signature=<hex>"
                    .to_owned(),
            ));
        };
        if auth.region != region {
            return Err(error(
                S3ErrorCode::AuthorizationHeaderMalformed,
                format!(
                    "The authorization header is malformed; the region '{}' is wrong; expecting '{region}'",
                    auth.region
                ),
            ));
        }
        return Ok(AuthClaim::V4Header(auth.signed_headers));
    }
    if v2_query {
        if !opts.allow_sigv2 {
            return Err(sigv2_refused());
        }
        check_v2_expires(query, now)?;
        return Ok(AuthClaim::V2Query);
    }
    if v4_query {
        return v4_query_claim(query, region);
    }
    Ok(AuthClaim::Unsigned {
        allow_sigv2: opts.allow_sigv2,
    })
}

fn v4_query_claim(query: &[(String, String)], region: &str) -> Result<AuthClaim, S3Error> {
    let params_error = |m: String| error(S3ErrorCode::AuthorizationQueryParametersError, m);
    for name in V4_QUERY_PARAMS {
        if query.iter().filter(|(k, _)| k == name).count() != 1 {
            return Err(params_error(
                "Query-string authentication version 4 requires the X-Amz-Algorithm, \
                 X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, \
                 and X-Amz-Expires parameters (each exactly once)."
                    .to_owned(),
            ));
        }
    }
    let get = |n: &str| query_get(query, n).unwrap_or("");
    if get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256" {
        return Err(params_error(
            "X-Amz-Algorithm only supports \"AWS4-HMAC-SHA256\"".to_owned(),
        ));
    }
    if let Some(got) = credential_region(get("X-Amz-Credential"))
        && got != region
    {
        return Err(params_error(format!(
            "Error parsing the X-Amz-Credential parameter; the region '{got}' is wrong; expecting '{region}'"
        )));
    }
    // A validity outside 1 s to 7 days is refused like an expired URL:
    // 403 AccessDenied, with AWS's messages.
    match get("X-Amz-Expires").parse::<i64>() {
        Ok(secs) if (1..=MAX_PRESIGN_EXPIRES_SECS).contains(&secs) => {}
        Ok(secs) if secs < 1 => {
            return Err(error(
                S3ErrorCode::AccessDenied,
                "X-Amz-Expires must be non-negative".to_owned(),
            ));
        }
        Ok(_) => {
            return Err(error(
                S3ErrorCode::AccessDenied,
                format!(
                    "X-Amz-Expires must be less than a week (in seconds); that is, the given X-Amz-Expires must be less than {MAX_PRESIGN_EXPIRES_SECS} seconds"
                ),
            ));
        }
        Err(_) => {
            return Err(params_error("X-Amz-Expires should be a number".to_owned()));
        }
    }
    Ok(AuthClaim::V4Query(
        get("X-Amz-SignedHeaders")
            .split(';')
            .map(str::to_owned)
            .collect(),
    ))
}

fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// A SigV2 presigned URL: `Expires` (seconds since the epoch) at most a
/// week ahead, as SigV4 allows (s3s refuses one in the past).
fn check_v2_expires(query: &[(String, String)], now: SystemTime) -> Result<(), S3Error> {
    let expires = query_get(query, "Expires").and_then(|e| e.parse::<i64>().ok());
    let (Some(expires), Some(_), Some(_)) = (
        expires,
        query_get(query, "Signature"),
        query_get(query, "AWSAccessKeyId"),
    ) else {
        return Err(error(
            S3ErrorCode::AccessDenied,
            "Query-string authentication requires the Signature, Expires and AWSAccessKeyId parameters"
                .to_owned(),
        ));
    };
    if expires.saturating_sub(unix_secs(now)) > MAX_PRESIGN_EXPIRES_SECS {
        return Err(error(
            S3ErrorCode::AccessDenied,
            format!(
                "Expires must be at most {MAX_PRESIGN_EXPIRES_SECS} seconds (a week) from now, as for X-Amz-Expires"
            ),
        ));
    }
    Ok(())
}

/// A header-signed SigV2 request: its signed date (`x-amz-date` when
/// present, which SigV2 then signs instead of `Date`) within the clock skew.
fn check_v2_date(
    headers: &http::HeaderMap,
    opts: AuthOptions,
    now: SystemTime,
) -> Result<(), S3Error> {
    let value = headers
        .get("x-amz-date")
        .or_else(|| headers.get(http::header::DATE));
    let Some(t) = value
        .and_then(|v| v.to_str().ok())
        .and_then(|s| httpdate::parse_http_date(s.trim()).ok())
    else {
        return Err(error(
            S3ErrorCode::AccessDenied,
            "AWS authentication requires a valid Date or x-amz-date header".to_owned(),
        ));
    };
    if (unix_secs(now) - unix_secs(t)).abs() > i64::from(opts.max_clock_skew_secs) {
        return Err(error(
            S3ErrorCode::RequestTimeTooSkewed,
            "The difference between the request time and the current time is too large.".to_owned(),
        ));
    }
    Ok(())
}

/// Every `x-amz-*` header is among `signed` (names compared exactly: s3s
/// looks the listed names up as written, so only a lower-case entry binds
/// a header), except the names in `allowed`.
fn check_amz_headers_signed(
    headers: &http::HeaderMap,
    signed: &[String],
    allowed: &[&str],
) -> Result<(), S3Error> {
    let mut unsigned: Vec<&str> = headers
        .keys()
        .map(http::HeaderName::as_str)
        .filter(|n| n.starts_with("x-amz-"))
        .filter(|n| !allowed.contains(n) && !signed.iter().any(|s| s == n))
        .collect();
    if unsigned.is_empty() {
        return Ok(());
    }
    unsigned.sort_unstable();
    unsigned.dedup();
    Err(error(
        S3ErrorCode::AccessDenied,
        format!(
            "There were headers present in the request which were not signed: {}",
            unsigned.join(", ")
        ),
    ))
}

/// The lower-case names of the SigV4 signed headers a request claims:
/// `SignedHeaders=` of its `AWS4-HMAC-SHA256` `Authorization` header, or
/// the `X-Amz-SignedHeaders` of a presigned URL carrying `X-Amz-Signature`.
/// Empty for anything else. Only a claim: s3s verifies the signature later.
#[must_use]
pub fn signed_headers(headers: &http::HeaderMap, query: &[(String, String)]) -> Vec<String> {
    let list = match headers.get(http::header::AUTHORIZATION) {
        Some(auth) => auth
            .to_str()
            .ok()
            .and_then(parse_v4_authorization)
            .map(|a| a.signed_headers),
        None if query_get(query, "X-Amz-Signature").is_some() => {
            query_get(query, "X-Amz-SignedHeaders")
                .map(|l| l.split(';').map(str::to_owned).collect())
        }
        None => None,
    };
    list.unwrap_or_default()
        .into_iter()
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .collect()
}

/// Drops an unsigned `Range` that is not one valid byte range, and unsigned
/// `If-Modified-Since` / `If-Unmodified-Since` values that are not HTTP
/// dates (valid ones in the obsolete RFC 850 / asctime forms are rewritten
/// to IMF-fixdate, the one form s3s parses).
fn sanitize_ignorable_headers(headers: &mut http::HeaderMap, signed: &[String]) {
    let unsigned = |name: &http::HeaderName| !signed.iter().any(|s| s == name.as_str());
    if unsigned(&http::header::RANGE)
        && let Some(v) = headers.get(http::header::RANGE)
        && !v.to_str().is_ok_and(is_single_byte_range)
    {
        headers.remove(http::header::RANGE);
    }
    for name in [
        http::header::IF_MODIFIED_SINCE,
        http::header::IF_UNMODIFIED_SINCE,
    ] {
        if !unsigned(&name) {
            continue;
        }
        let Some(v) = headers.get(&name) else {
            continue;
        };
        match v
            .to_str()
            .ok()
            .and_then(|s| httpdate::parse_http_date(s.trim()).ok())
        {
            Some(t) => {
                let canonical = httpdate::fmt_http_date(t);
                if v.as_bytes() != canonical.as_bytes()
                    && let Ok(nv) = HeaderValue::from_str(&canonical)
                {
                    headers.insert(name, nv);
                }
            }
            None => {
                headers.remove(name);
            }
        }
    }
}

/// `bytes=a-b` (a ≤ b), `bytes=a-` or `bytes=-n`: exactly one range of
/// decimal positions. (`bytes=-0` is valid syntax but unsatisfiable: kept,
/// so that it answers 416 as AWS does.)
fn is_single_byte_range(value: &str) -> bool {
    let Some(spec) = value.trim().strip_prefix("bytes=") else {
        return false;
    };
    let Some((first, last)) = spec.split_once('-') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    match (first.is_empty(), last.is_empty()) {
        (true, true) => false,
        (true, false) => digits(last),
        (false, true) => digits(first),
        (false, false) => {
            digits(first)
                && digits(last)
                && matches!((first.parse::<u64>(), last.parse::<u64>()), (Ok(a), Ok(b)) if a <= b)
        }
    }
}

/// Decoded `name=value` pairs of a query string.
#[must_use]
pub fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let decode = |s: &str| {
                percent_decode_str(&s.replace('+', " "))
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (decode(k), decode(v))
        })
        .collect()
}

fn query_get<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The region of a SigV4 credential `AKID/yyyymmdd/region/s3/aws4_request`.
fn credential_region(credential: &str) -> Option<&str> {
    let mut fields = credential.trim().rsplitn(5, '/');
    let _terminator = fields.next()?;
    let _service = fields.next()?;
    let region = fields.next()?;
    let _date = fields.next()?;
    fields.next()?; // the access key id
    Some(region)
}

fn check_metadata_directive(headers: &http::HeaderMap) -> Result<(), S3Error> {
    match headers
        .get("x-amz-metadata-directive")
        .map(HeaderValue::as_bytes)
    {
        None | Some(b"COPY" | b"REPLACE") => Ok(()),
        Some(_) => Err(error(
            S3ErrorCode::InvalidArgument,
            "Unknown metadata directive.".to_owned(),
        )),
    }
}

fn check_user_metadata_size(headers: &http::HeaderMap) -> Result<(), S3Error> {
    let size: usize = headers
        .iter()
        .filter_map(|(name, value)| {
            name.as_str()
                .strip_prefix("x-amz-meta-")
                .map(|n| n.len() + value.len())
        })
        .sum();
    if size > MAX_USER_METADATA_BYTES {
        return Err(error(
            S3ErrorCode::MetadataTooLarge,
            format!(
                "Your metadata headers exceed the maximum allowed metadata size ({size} > {MAX_USER_METADATA_BYTES} bytes)."
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder().method("GET").uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn code(r: Result<(), S3Error>) -> Option<String> {
        r.err().map(|e| e.code().as_str().to_owned())
    }

    fn precheck(p: &mut Parts, region: &str) -> Result<(), S3Error> {
        super::precheck(p, region, AuthOptions::default())
    }

    /// A presigned URL's query with all six parameters (region `region`,
    /// validity `expires`, signed headers `signed`, `;`-separated).
    fn presigned(region: &str, expires: &str, signed: &str) -> String {
        format!(
            "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AK%2F20260101%2F{region}%2Fs3%2Faws4_request&X-Amz-Date=20260101T000000Z&X-Amz-Expires={expires}&X-Amz-SignedHeaders={}&X-Amz-Signature=00",
            signed.replace(';', "%3B")
        )
    }

    #[test]
    fn ranges() {
        for ok in [
            "bytes=0-0",
            "bytes=5-",
            "bytes=-1",
            "bytes=-0",
            "bytes=3-10",
        ] {
            assert!(is_single_byte_range(ok), "{ok}");
        }
        for bad in [
            "bytes=abc",
            "items=0-1",
            "bytes=5-2",
            "bytes=0-1,4-5",
            "bytes=-",
            "bytes=",
            "bytes=1",
            "bytes=+1-2",
            "bytes=99999999999999999999999-",
        ] {
            assert!(!is_single_byte_range(bad), "{bad}");
        }
        let mut p = parts("/b/k", &[("range", "bytes=0-1,4-5")]);
        precheck(&mut p, "us-east-1").unwrap();
        assert!(p.headers.get("range").is_none());
        let mut p = parts("/b/k", &[("range", "bytes=0-1")]);
        precheck(&mut p, "us-east-1").unwrap();
        assert_eq!(p.headers["range"], "bytes=0-1");
        // A signed header is left alone: changing it would break the signature.
        let auth = "AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/s3/aws4_request, SignedHeaders=host;range, Signature=00";
        let mut p = parts("/b/k", &[("range", "bytes=abc"), ("authorization", auth)]);
        precheck(&mut p, "us-east-1").unwrap();
        assert_eq!(p.headers["range"], "bytes=abc");
    }

    #[test]
    fn signed_header_lists() {
        let auth = "AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/s3/aws4_request, SignedHeaders=host;Range;x-amz-date, Signature=00";
        let h = parts("/b/k", &[("authorization", auth)]).headers;
        assert_eq!(signed_headers(&h, &[]), ["host", "range", "x-amz-date"]);
        let q = parse_query(
            "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-SignedHeaders=host%3Bx-amz-rdma-token&X-Amz-Signature=00",
        );
        assert_eq!(
            signed_headers(&http::HeaderMap::new(), &q),
            ["host", "x-amz-rdma-token"]
        );
        let q = parse_query("X-Amz-SignedHeaders=host");
        assert!(signed_headers(&http::HeaderMap::new(), &q).is_empty());
        // Issue 30 finding 2: without a signature there is nothing signed.
        let q = parse_query(
            "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-SignedHeaders=host%3Bx-amz-rdma-token",
        );
        assert!(signed_headers(&http::HeaderMap::new(), &q).is_empty());
        let h = parts("/b/k", &[("authorization", "AWS AK:sig")]).headers;
        assert!(signed_headers(&h, &[]).is_empty());
    }

    #[test]
    fn dates() {
        let mut p = parts("/b/k", &[("if-modified-since", "not a date")]);
        precheck(&mut p, "us-east-1").unwrap();
        assert!(p.headers.get("if-modified-since").is_none());
        let mut p = parts(
            "/b/k",
            &[("if-unmodified-since", "Sunday, 06-Nov-94 08:49:37 GMT")],
        );
        precheck(&mut p, "us-east-1").unwrap();
        assert_eq!(
            p.headers["if-unmodified-since"],
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
        let mut p = parts(
            "/b/k",
            &[("if-modified-since", "Sun, 06 Nov 1994 08:49:37 GMT")],
        );
        precheck(&mut p, "us-east-1").unwrap();
        assert_eq!(
            p.headers["if-modified-since"],
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
    }

    #[test]
    fn region_in_header_and_query() {
        let auth = "AWS4-HMAC-SHA256 Credential=AK/20260101/us-west-2/s3/aws4_request, SignedHeaders=host, Signature=00";
        let mut p = parts("/b/k", &[("authorization", auth)]);
        assert_eq!(
            code(precheck(&mut p, "us-east-1")).as_deref(),
            Some("AuthorizationHeaderMalformed")
        );
        let mut p = parts("/b/k", &[("authorization", auth)]);
        assert!(precheck(&mut p, "us-west-2").is_ok());
        let presigned = presigned("eu-west-1", "60", "host");
        let presigned = presigned.as_str();
        let mut p = parts(presigned, &[]);
        assert_eq!(
            code(precheck(&mut p, "us-east-1")).as_deref(),
            Some("AuthorizationQueryParametersError")
        );
        let mut p = parts(presigned, &[]);
        assert!(precheck(&mut p, "eu-west-1").is_ok());
        assert_eq!(credential_region("a/b/c/d"), None);
        assert_eq!(credential_region("AK/2026/r/s3/aws4_request"), Some("r"));
        // Access key ids with '/' are not valid, but must not confuse the parse.
        assert_eq!(credential_region("A/K/2026/r/s3/aws4_request"), Some("r"));
    }

    #[test]
    fn presign_expiry_and_double_auth() {
        let url = |exp: &str| presigned("us-east-1", exp, "host");
        assert!(precheck(&mut parts(&url("604800"), &[]), "us-east-1").is_ok());
        assert!(precheck(&mut parts(&url("1"), &[]), "us-east-1").is_ok());
        for bad in ["604801", "-1", "0"] {
            assert_eq!(
                code(precheck(&mut parts(&url(bad), &[]), "us-east-1")).as_deref(),
                Some("AccessDenied"),
                "{bad}"
            );
        }
        assert_eq!(
            code(precheck(&mut parts(&url("x"), &[]), "us-east-1")).as_deref(),
            Some("AuthorizationQueryParametersError")
        );
        let mut p = parts(
            &url("60"),
            &[(
                "authorization",
                "AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00",
            )],
        );
        assert_eq!(
            code(precheck(&mut p, "us-east-1")).as_deref(),
            Some("InvalidArgument")
        );
    }

    #[test]
    fn metadata_rules() {
        let mut p = parts("/b/k", &[("x-amz-metadata-directive", "MOVE")]);
        assert_eq!(
            code(precheck(&mut p, "r")).as_deref(),
            Some("InvalidArgument")
        );
        for ok in ["COPY", "REPLACE"] {
            assert!(precheck(&mut parts("/b/k", &[("x-amz-metadata-directive", ok)]), "r").is_ok());
        }
        let at_limit = "v".repeat(MAX_USER_METADATA_BYTES - 1);
        assert!(precheck(&mut parts("/b/k", &[("x-amz-meta-a", &at_limit)]), "r").is_ok());
        let over = "v".repeat(MAX_USER_METADATA_BYTES);
        assert_eq!(
            code(precheck(
                &mut parts("/b/k", &[("x-amz-meta-a", &over)]),
                "r"
            ))
            .as_deref(),
            Some("MetadataTooLarge")
        );
    }

    const V4: &str = "AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=00";

    #[test]
    fn unsigned_amz_headers_are_refused() {
        // Issue 30 finding 1: a presigned PUT cannot be widened.
        for h in [
            "x-amz-copy-source",
            "x-amz-acl",
            "x-amz-grant-read",
            "x-amz-rdma-token",
        ] {
            let mut p = parts(&presigned("us-east-1", "60", "host"), &[(h, "v")]);
            let e = precheck(&mut p, "us-east-1").unwrap_err();
            assert_eq!(e.code(), &S3ErrorCode::AccessDenied, "{h}");
            let m = e.message().unwrap_or_default();
            assert!(m.contains("not signed") && m.contains(h), "{m}");
            let mut p = parts("/b/k", &[("authorization", V4), (h, "v")]);
            assert_eq!(
                code(precheck(&mut p, "us-east-1")).as_deref(),
                Some("AccessDenied")
            );
        }
        // Signed ones pass; listed upper case does not count.
        let mut p = parts(
            &presigned("us-east-1", "60", "host;x-amz-acl"),
            &[("x-amz-acl", "private")],
        );
        assert!(precheck(&mut p, "us-east-1").is_ok());
        let mut p = parts(
            &presigned("us-east-1", "60", "host;X-Amz-Acl"),
            &[("x-amz-acl", "private")],
        );
        assert_eq!(
            code(precheck(&mut p, "us-east-1")).as_deref(),
            Some("AccessDenied")
        );
        // The exceptions: the payload hash everywhere; on presigned URLs
        // the two headers aws-sigv4 leaves unsigned there.
        let mut p = parts(
            &presigned("us-east-1", "60", "host"),
            &[
                ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
                ("x-amz-user-agent", "sdk"),
                ("x-amz-checksum-mode", "ENABLED"),
            ],
        );
        assert!(precheck(&mut p, "us-east-1").is_ok());
        let auth = V4.replace("host;x-amz-content-sha256;", "host;");
        let mut p = parts(
            "/b/k",
            &[
                ("authorization", &auth),
                ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
                ("x-amz-date", "x"),
            ],
        );
        // The payload hash is the canonical request's last line: bound anyway.
        assert!(precheck(&mut p, "us-east-1").is_ok());
        let mut p = parts(
            "/b/k",
            &[
                ("authorization", V4),
                ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
                ("x-amz-date", "x"),
            ],
        );
        assert!(precheck(&mut p, "us-east-1").is_ok());
        let mut p = parts(
            "/b/k",
            &[("authorization", V4), ("x-amz-user-agent", "sdk")],
        );
        assert_eq!(
            code(precheck(&mut p, "us-east-1")).as_deref(),
            Some("AccessDenied")
        );
        // x-amzn-* is not x-amz-*.
        let mut p = parts("/b/k", &[("authorization", V4), ("x-amzn-trace-id", "t")]);
        assert!(precheck(&mut p, "us-east-1").is_ok());
    }

    #[test]
    fn partial_presigned_urls_are_refused() {
        // Issue 30 finding 2: X-Amz-Algorithm without a signature is not
        // an anonymous request with signed headers.
        for uri in [
            "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-SignedHeaders=host%3Bx-amz-rdma-token",
            "/b/k?X-Amz-SignedHeaders=host",
            "/b/k?X-Amz-Signature=00",
            "/b/k?X-Amz-Credential=AK%2F20260101%2Fus-east-1%2Fs3%2Faws4_request",
        ] {
            assert_eq!(
                code(precheck(&mut parts(uri, &[]), "us-east-1")).as_deref(),
                Some("AuthorizationQueryParametersError"),
                "{uri}"
            );
        }
        let dup = format!(
            "{}&X-Amz-Signature=11",
            presigned("us-east-1", "60", "host")
        );
        assert_eq!(
            code(precheck(&mut parts(&dup, &[]), "us-east-1")).as_deref(),
            Some("AuthorizationQueryParametersError")
        );
        let other = presigned("us-east-1", "60", "host")
            .replace("AWS4-HMAC-SHA256", "AWS4-ECDSA-P256-SHA256");
        assert_eq!(
            code(precheck(&mut parts(&other, &[]), "us-east-1")).as_deref(),
            Some("AuthorizationQueryParametersError")
        );
        // X-Amz-Date / X-Amz-Expires alone are no auth at all.
        let mut p = parts("/b/k?X-Amz-Date=1", &[]);
        precheck(&mut p, "us-east-1").unwrap();
        assert_eq!(
            p.extensions.get::<AuthClaim>(),
            Some(&AuthClaim::Unsigned { allow_sigv2: false })
        );
    }

    #[test]
    fn authorization_header_shapes() {
        for bad in [
            "Bearer x",
            "AWS4-HMAC-SHA256X Credential=a",
            "FOO Credential=AK/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00",
        ] {
            let e = code(precheck(
                &mut parts("/b/k", &[("authorization", bad)]),
                "us-east-1",
            ));
            assert!(
                matches!(
                    e.as_deref(),
                    Some("InvalidArgument" | "AuthorizationHeaderMalformed")
                ),
                "{bad}: {e:?}"
            );
        }
        assert_eq!(
            code(precheck(
                &mut parts(
                    "/b/k",
                    &[(
                        "authorization",
                        "AWS4-HMAC-SHA256 SignedHeaders=host, Signature=00"
                    )]
                ),
                "us-east-1"
            ))
            .as_deref(),
            Some("AuthorizationHeaderMalformed")
        );
        // The signed headers are read where s3s reads them, not from a
        // look-alike inside the credential.
        let tricky = "AWS4-HMAC-SHA256 Credential=a, SignedHeaders=host;x-amz-acl, x/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00";
        let mut p = parts(
            "/b/k",
            &[("authorization", tricky), ("x-amz-acl", "public-read")],
        );
        assert_eq!(
            code(precheck(&mut p, "us-east-1")).as_deref(),
            Some("AccessDenied")
        );
        let mut p = parts("/b/k", &[("authorization", V4)]);
        precheck(&mut p, "us-east-1").unwrap();
        assert_eq!(
            p.extensions
                .get::<AuthClaim>()
                .map(AuthClaim::v4_signed_headers),
            Some(
                &[
                    "host".to_owned(),
                    "x-amz-content-sha256".to_owned(),
                    "x-amz-date".to_owned()
                ][..]
            )
        );
        let two = http::Request::builder()
            .uri("/b/k")
            .header("authorization", V4)
            .header("authorization", V4)
            .body(())
            .unwrap();
        let mut p = two.into_parts().0;
        assert_eq!(
            code(precheck(&mut p, "us-east-1")).as_deref(),
            Some("InvalidArgument")
        );
    }

    #[test]
    fn verified_means_s3s_verified() {
        let mut ext = http::Extensions::new();
        ext.insert(AuthClaim::V4Query(vec![
            "host".into(),
            "x-amz-rdma-token".into(),
        ]));
        let cred = s3s::auth::Credentials {
            access_key: "AK".into(),
            secret_key: "s".into(),
        };
        assert_eq!(verified_signed_headers(Some(&cred), &ext).len(), 2);
        assert!(verified_signed_headers(None, &ext).is_empty());
        assert!(verified_signed_headers(Some(&cred), &http::Extensions::new()).is_empty());
        let mut v2 = http::Extensions::new();
        v2.insert(AuthClaim::V2Header);
        assert!(verified_signed_headers(Some(&cred), &v2).is_empty());
    }

    #[test]
    fn sigv2_off_by_default_and_limited_when_on() {
        // Issue 30 finding 9.
        let now = SystemTime::now();
        let secs = unix_secs(now);
        let date = httpdate::fmt_http_date(now);
        let v2h = [("authorization", "AWS AK:c2ln"), ("date", date.as_str())];
        let v2q = |exp: i64| format!("/b/k?AWSAccessKeyId=AK&Expires={exp}&Signature=c2ln");
        let off = AuthOptions::default();
        let on = AuthOptions {
            allow_sigv2: true,
            ..off
        };
        let run = |uri: &str, h: &[(&str, &str)], o: AuthOptions| {
            code(super::precheck_at(&mut parts(uri, h), "us-east-1", o, now))
        };
        assert_eq!(run("/b/k", &v2h, off).as_deref(), Some("InvalidRequest"));
        assert_eq!(
            run(&v2q(secs + 60), &[], off).as_deref(),
            Some("InvalidRequest")
        );
        let e = sigv2_refused();
        assert!(e.message().unwrap_or_default().contains("AWS4-HMAC-SHA256"));
        // Allowed: within the SigV4 limits only.
        assert_eq!(run("/b/k", &v2h, on), None);
        assert_eq!(run(&v2q(secs + 60), &[], on), None);
        assert_eq!(run(&v2q(secs + 604_800), &[], on), None);
        let century = secs + 100 * 365 * 86_400;
        assert_eq!(run(&v2q(century), &[], on).as_deref(), Some("AccessDenied"));
        assert_eq!(
            run("/b/k?AWSAccessKeyId=AK&Signature=c2ln", &[], on).as_deref(),
            Some("AccessDenied")
        );
        let old = httpdate::fmt_http_date(now - std::time::Duration::from_secs(3600));
        let skewed = [("authorization", "AWS AK:c2ln"), ("date", old.as_str())];
        assert_eq!(
            run("/b/k", &skewed, on).as_deref(),
            Some("RequestTimeTooSkewed")
        );
        // x-amz-date, when present, is the signed date.
        let both = [
            ("authorization", "AWS AK:c2ln"),
            ("date", date.as_str()),
            ("x-amz-date", old.as_str()),
        ];
        assert_eq!(
            run("/b/k", &both, on).as_deref(),
            Some("RequestTimeTooSkewed")
        );
        assert_eq!(
            run("/b/k", &[("authorization", "AWS AK:c2ln")], on).as_deref(),
            Some("AccessDenied")
        );
        // Mixed SigV2 and SigV4 query parameters.
        let mixed = format!("{}&Signature=x", presigned("us-east-1", "60", "host"));
        assert_eq!(run(&mixed, &[], on).as_deref(), Some("InvalidArgument"));
    }
}
