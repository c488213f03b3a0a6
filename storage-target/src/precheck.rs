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
//! - the SigV4 credential scope must name this server's region;
//! - one auth mechanism per request, presigned URLs valid for at most a week;
//! - `x-amz-metadata-directive` is COPY or REPLACE; user metadata ≤ 2 KiB.

use http::HeaderValue;
use http::request::Parts;
use percent_encoding::percent_decode_str;
use s3s::{S3Error, S3ErrorCode};

/// Longest presigned-URL validity AWS accepts (`X-Amz-Expires`), in seconds.
pub const MAX_PRESIGN_EXPIRES_SECS: i64 = 604_800;

/// Largest total size of user metadata (`x-amz-meta-*` names without the
/// prefix plus values, in bytes) S3 accepts.
pub const MAX_USER_METADATA_BYTES: usize = 2048;

/// Applies the rules above to a request head. Invalid ignorable headers are
/// removed from `parts`; a rule violation is returned as the S3 error to send.
///
/// # Errors
/// `AuthorizationHeaderMalformed`, `AuthorizationQueryParametersError`,
/// `InvalidArgument` or `MetadataTooLarge`, with AWS's messages.
pub fn precheck(parts: &mut Parts, region: &str) -> Result<(), S3Error> {
    let query = parse_query(parts.uri.query().unwrap_or(""));
    let signed = signed_headers(&parts.headers, &query);
    sanitize_ignorable_headers(&mut parts.headers, &signed);
    check_auth_mechanism(&parts.headers, &query, region)?;
    check_metadata_directive(&parts.headers)?;
    check_user_metadata_size(&parts.headers)?;
    Ok(())
}

fn error(code: S3ErrorCode, message: String) -> S3Error {
    S3Error::with_message(code, message)
}

/// The lower-case names of the SigV4 signed headers: `SignedHeaders=` of an
/// `AWS4-HMAC-SHA256` `Authorization` header, or the `X-Amz-SignedHeaders`
/// query parameter of a presigned URL. Empty for anything else.
#[must_use]
pub fn signed_headers(headers: &http::HeaderMap, query: &[(String, String)]) -> Vec<String> {
    let list = match headers.get(http::header::AUTHORIZATION) {
        Some(auth) => auth
            .to_str()
            .ok()
            .and_then(|a| a.trim_start().strip_prefix("AWS4-HMAC-SHA256 "))
            .and_then(|rest| {
                rest.split(',')
                    .find_map(|p| p.trim().strip_prefix("SignedHeaders="))
            })
            .map(str::to_owned),
        None if query_get(query, "X-Amz-Algorithm") == Some("AWS4-HMAC-SHA256") => {
            query_get(query, "X-Amz-SignedHeaders").map(str::to_owned)
        }
        None => None,
    };
    list.map(|l| {
        l.split(';')
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty())
            .collect()
    })
    .unwrap_or_default()
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

fn check_auth_mechanism(
    headers: &http::HeaderMap,
    query: &[(String, String)],
    region: &str,
) -> Result<(), S3Error> {
    let header_auth = headers.get(http::header::AUTHORIZATION);
    let query_auth = [
        "X-Amz-Algorithm",
        "X-Amz-Signature",
        "Signature",
        "AWSAccessKeyId",
    ]
    .iter()
    .any(|n| query_get(query, n).is_some());
    if header_auth.is_some() && query_auth {
        return Err(error(
            S3ErrorCode::InvalidArgument,
            "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, \
             Signature query string parameter or the Authorization header should be specified"
                .to_owned(),
        ));
    }
    if let Some(auth) = header_auth.and_then(|v| v.to_str().ok())
        && let Some(rest) = auth.trim_start().strip_prefix("AWS4-HMAC-SHA256")
        && let Some(credential) = rest
            .split(',')
            .find_map(|f| f.trim().strip_prefix("Credential="))
        && let Some(got) = credential_region(credential)
        && got != region
    {
        return Err(error(
            S3ErrorCode::AuthorizationHeaderMalformed,
            format!(
                "The authorization header is malformed; the region '{got}' is wrong; expecting '{region}'"
            ),
        ));
    }
    if query_get(query, "X-Amz-Algorithm").is_some() {
        if let Some(credential) = query_get(query, "X-Amz-Credential")
            && let Some(got) = credential_region(credential)
            && got != region
        {
            return Err(error(
                S3ErrorCode::AuthorizationQueryParametersError,
                format!(
                    "Error parsing the X-Amz-Credential parameter; the region '{got}' is wrong; expecting '{region}'"
                ),
            ));
        }
        if let Some(expires) = query_get(query, "X-Amz-Expires") {
            // A validity outside 1 s to 7 days is refused like an expired
            // URL: 403 AccessDenied, with AWS's messages.
            match expires.parse::<i64>() {
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
                    return Err(error(
                        S3ErrorCode::AuthorizationQueryParametersError,
                        "X-Amz-Expires should be a number".to_owned(),
                    ));
                }
            }
        }
    }
    Ok(())
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
            "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-SignedHeaders=host%3Bx-amz-rdma-token",
        );
        assert_eq!(
            signed_headers(&http::HeaderMap::new(), &q),
            ["host", "x-amz-rdma-token"]
        );
        let q = parse_query("X-Amz-SignedHeaders=host");
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
        let presigned = "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AK%2F20260101%2Feu-west-1%2Fs3%2Faws4_request&X-Amz-Expires=60";
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
        let url = |exp: &str| {
            format!(
                "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AK%2F20260101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Expires={exp}"
            )
        };
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
}
