//! SigV4 verification of the control requests, ahead of s3s.
//!
//! The control requests are not S3 operations, and the peers sign them as
//! their own service: hipObject's v2 client signs with the credential
//! scope's service `hipobj` (`<date>/<region>/hipobj/aws4_request`), every
//! header it sends among the signed ones, the payload hash that of the
//! empty body, and sends no `x-amz-content-sha256`. s3s's verifier takes
//! only the services `s3` and `sts` and requires that header, so it would
//! answer such a client `501` or `400`; [`ControlAuth`] verifies these
//! requests itself instead, before s3s sees them, over the same users and
//! the same rules:
//! - the signature in the `Authorization` header (SigV4 only; a presigned
//!   URL or SigV2 is refused), the scope's service `s3` or `hipobj`, its
//!   region this server's (the pre-check has refused other regions), its
//!   date that of `x-amz-date`, which is within `max_clock_skew_secs`;
//! - `host` and `x-amz-date` signed, every signed header present, and
//!   (the pre-check's rule, run before this) every `x-amz-*` header signed;
//! - no body; `x-amz-content-sha256` absent (the empty payload's hash),
//!   `UNSIGNED-PAYLOAD` or the empty payload's hash;
//! - the signature recomputed by `aws-sigv4` over exactly the signed
//!   headers, compared in constant time.
//!
//! Every refusal is a `403` with the S3 error (`AccessDenied`,
//! `InvalidAccessKeyId`, `SignatureDoesNotMatch`, `RequestTimeTooSkewed`),
//! except a body (`400 InvalidRequest`). A verified request carries its
//! user as [`ControlCaller`] (the routes act as that user), claims its
//! connection for that user (the per-user share of `connections:`, as the
//! access hook does for S3 operations: `503 SlowDown` past it), and loses
//! its `Authorization` header, so that s3s passes it to the route without
//! verifying it again.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode, sign,
};
use http::request::Parts;
use s3s::{S3Error, S3ErrorCode};
use subtle::ConstantTimeEq as _;

use super::control::is_control_request;

/// The credential-scope services a control request may be signed for:
/// S3's, and the one hipObject's client uses.
pub const CONTROL_SERVICES: [&str; 2] = ["s3", "hipobj"];

/// SHA-256 of the empty payload: what a control request without
/// `x-amz-content-sha256` is signed over.
const EMPTY_PAYLOAD_SHA256: &str =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// The user a control request was verified for (in its extensions).
#[derive(Debug, Clone)]
pub struct ControlCaller(pub s3s::auth::Credentials);

/// Verifies the control requests' signatures (see the module).
#[derive(Debug, Clone)]
pub struct ControlAuth {
    users: crate::auth::Users,
    region: String,
    max_clock_skew_secs: u32,
}

/// A SigV4 `Authorization` header's parts.
struct V4Header<'a> {
    access_key: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    signed: Vec<&'a str>,
    signature: &'a str,
}

fn denied(code: S3ErrorCode, message: impl Into<String>) -> S3Error {
    S3Error::with_message(code, message.into())
}

fn access_denied(message: &str) -> S3Error {
    denied(S3ErrorCode::AccessDenied, message)
}

fn mismatch(message: &str) -> S3Error {
    denied(S3ErrorCode::SignatureDoesNotMatch, message)
}

/// `AWS4-HMAC-SHA256 Credential=AK/date/region/service/aws4_request,
/// SignedHeaders=a;b, Signature=hex` (spaces after the algorithm and the
/// commas, as SigV4 clients write them).
fn parse_v4(value: &str) -> Option<V4Header<'_>> {
    let rest = value.strip_prefix("AWS4-HMAC-SHA256")?;
    let rest = rest.trim_start_matches([' ', '\t']);
    let rest = rest.strip_prefix("Credential=")?;
    let (credential, rest) = rest.split_once(',')?;
    let mut scope = credential.split('/');
    let (access_key, date, region, service) =
        (scope.next()?, scope.next()?, scope.next()?, scope.next()?);
    if scope.next()? != "aws4_request" || scope.next().is_some() {
        return None;
    }
    let rest = rest.trim_start_matches([' ', '\t']);
    let rest = rest.strip_prefix("SignedHeaders=")?;
    let (list, rest) = rest.split_once(',')?;
    let signature = rest
        .trim_start_matches([' ', '\t'])
        .strip_prefix("Signature=")?
        .trim_end_matches([' ', '\t']);
    let hex64 = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    if access_key.is_empty()
        || date.len() != 8
        || !date.bytes().all(|b| b.is_ascii_digit())
        || !hex64(signature)
    {
        return None;
    }
    Some(V4Header {
        access_key,
        date,
        region,
        service,
        signed: list.split(';').collect(),
        signature,
    })
}

/// `x-amz-date` (`YYYYMMDDTHHMMSSZ`) as a time.
fn parse_amz_date(v: &str) -> Option<SystemTime> {
    let b = v.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let s = v.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())
            .flatten()
    };
    let year = i32::try_from(num(0..4)?).ok()?;
    let month = time::Month::try_from(u8::try_from(num(4..6)?).ok()?).ok()?;
    let day = u8::try_from(num(6..8)?).ok()?;
    let (h, m, s) = (
        u8::try_from(num(9..11)?).ok()?,
        u8::try_from(num(11..13)?).ok()?,
        u8::try_from(num(13..15)?).ok()?,
    );
    let t = time::Date::from_calendar_date(year, month, day)
        .ok()?
        .with_hms(h, m, s)
        .ok()?
        .assume_utc()
        .unix_timestamp();
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(t).ok()?))
}

impl ControlAuth {
    /// Verifies control requests for `users`, in `region`, with a request
    /// time at most `max_clock_skew_secs` from the server's.
    #[must_use]
    pub fn new(users: crate::auth::Users, region: &str, max_clock_skew_secs: u32) -> Self {
        ControlAuth {
            users,
            region: region.to_owned(),
            max_clock_skew_secs,
        }
    }

    /// Whether the request is a control request (verified here).
    #[must_use]
    pub fn applies(parts: &Parts) -> bool {
        is_control_request(&parts.method, &parts.uri)
    }

    /// Verifies a control request at the current time (see the module).
    ///
    /// # Errors
    /// The S3 error to answer (`403`, `400` for a body, `503 SlowDown`
    /// past the user's share).
    pub fn verify(&self, parts: &mut Parts) -> Result<(), S3Error> {
        self.verify_at(parts, SystemTime::now())
    }

    /// [`ControlAuth::verify`] at time `now`.
    ///
    /// # Errors
    /// As [`ControlAuth::verify`].
    pub fn verify_at(&self, parts: &mut Parts, now: SystemTime) -> Result<(), S3Error> {
        let caller = self.caller(parts, now)?;
        if let Some(share) = parts.extensions.get::<crate::http::ConnShare>()
            && !share.claim(Some(&caller.access_key))
        {
            return Err(denied(
                S3ErrorCode::SlowDown,
                "Please reduce your request rate: too many requests of this user in progress (connections.per_user).",
            ));
        }
        parts.headers.remove(http::header::AUTHORIZATION);
        parts.extensions.insert(ControlCaller(caller));
        Ok(())
    }

    fn caller(&self, parts: &Parts, now: SystemTime) -> Result<s3s::auth::Credentials, S3Error> {
        let Some(value) = parts.headers.get(http::header::AUTHORIZATION) else {
            return Err(access_denied(
                if parts
                    .uri
                    .query()
                    .is_some_and(|q| q.contains("X-Amz-Signature") || q.contains("Signature="))
                {
                    "the hipobj-rc-v2 control requests must carry their SigV4 signature in the Authorization header, not in the URL"
                } else {
                    "the hipobj-rc-v2 control requests must be signed (SigV4) by a user of this server"
                },
            ));
        };
        let Some(a) = value.to_str().ok().and_then(parse_v4) else {
            return Err(access_denied(
                "the hipobj-rc-v2 control requests must be signed with SigV4 (AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...)",
            ));
        };
        if !CONTROL_SERVICES.contains(&a.service) {
            return Err(access_denied(
                "the credential scope of a hipobj-rc-v2 control request must name the service s3 or hipobj",
            ));
        }
        if a.region != self.region {
            return Err(access_denied(
                "the credential scope of the request names another region than this server's",
            ));
        }
        let mut names: Vec<String> = Vec::with_capacity(a.signed.len());
        for n in &a.signed {
            if n.is_empty()
                || n.bytes().any(|b| b.is_ascii_uppercase())
                || *n == "authorization"
                || names.iter().any(|m| m == n)
            {
                return Err(mismatch(
                    "SignedHeaders must list distinct lowercase header names, without authorization",
                ));
            }
            if !parts.headers.contains_key(*n) {
                return Err(mismatch(
                    "a header among SignedHeaders is not in the request",
                ));
            }
            names.push((*n).to_owned());
        }
        if !names.iter().any(|n| n == "host") || !names.iter().any(|n| n == "x-amz-date") {
            return Err(mismatch("host and x-amz-date must be among SignedHeaders"));
        }
        let date = {
            let mut all = parts.headers.get_all("x-amz-date").iter();
            match (all.next().and_then(|v| v.to_str().ok()), all.next()) {
                (Some(v), None) => v,
                _ => {
                    return Err(access_denied(
                        "the request needs one valid x-amz-date header",
                    ));
                }
            }
        };
        let Some(at) = parse_amz_date(date) else {
            return Err(access_denied(
                "the request needs one valid x-amz-date header",
            ));
        };
        if !date.starts_with(a.date) {
            return Err(mismatch("the credential scope's date is not x-amz-date's"));
        }
        let skew = match now.duration_since(at) {
            Ok(d) => d,
            Err(e) => e.duration(),
        };
        if skew > Duration::from_secs(u64::from(self.max_clock_skew_secs)) {
            return Err(denied(
                S3ErrorCode::RequestTimeTooSkewed,
                "The difference between the request time and the server's time is too large.",
            ));
        }
        let has_body = parts.headers.contains_key(http::header::TRANSFER_ENCODING)
            || parts
                .headers
                .get(http::header::CONTENT_LENGTH)
                .is_some_and(|v| v.as_bytes() != b"0");
        if has_body {
            return Err(denied(
                S3ErrorCode::InvalidRequest,
                "the hipobj-rc-v2 control requests have no body",
            ));
        }
        let payload = match parts
            .headers
            .get("x-amz-content-sha256")
            .map(http::HeaderValue::as_bytes)
        {
            None => SignableBody::Precomputed(EMPTY_PAYLOAD_SHA256.to_owned()),
            Some(b"UNSIGNED-PAYLOAD") => SignableBody::UnsignedPayload,
            Some(h) if h == EMPTY_PAYLOAD_SHA256.as_bytes() => {
                SignableBody::Precomputed(EMPTY_PAYLOAD_SHA256.to_owned())
            }
            Some(_) => {
                return Err(denied(
                    S3ErrorCode::InvalidRequest,
                    "x-amz-content-sha256 of a hipobj-rc-v2 control request must be the empty payload's hash or UNSIGNED-PAYLOAD (or absent)",
                ));
            }
        };
        let Some(user) = self.users.get(a.access_key) else {
            return Err(denied(
                S3ErrorCode::InvalidAccessKeyId,
                "The AWS Access Key Id you provided does not exist in our records.",
            ));
        };
        let expected = self.signature(parts, &a, &names, payload, at, &user.secret)?;
        if !bool::from(expected.as_bytes().ct_eq(a.signature.as_bytes())) {
            return Err(mismatch(
                "The request signature we calculated does not match the signature you provided. Check your key and signing method.",
            ));
        }
        Ok(s3s::auth::Credentials {
            access_key: user.access_key_id.clone(),
            secret_key: s3s::auth::SecretKey::from(user.secret.clone()),
        })
    }

    /// The signature of the request over exactly `names`, computed by
    /// `aws-sigv4` with the S3 canonicalisation (the path as sent, no
    /// normalisation).
    fn signature(
        &self,
        parts: &Parts,
        a: &V4Header<'_>,
        names: &[String],
        payload: SignableBody<'_>,
        at: SystemTime,
        secret: &str,
    ) -> Result<String, S3Error> {
        let unsignable = || mismatch("a signed header's value cannot be canonicalised");
        let mut headers: Vec<(&str, &str)> = Vec::new();
        for n in names.iter().filter(|n| *n != "x-amz-date") {
            for v in parts.headers.get_all(n.as_str()) {
                headers.push((n.as_str(), v.to_str().map_err(|_| unsignable())?));
            }
        }
        let identity =
            aws_credential_types::Credentials::new(a.access_key, secret, None, None, "control")
                .into();
        let mut settings = SigningSettings::default();
        settings.payload_checksum_kind = PayloadChecksumKind::NoHeader;
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        // Exactly the client's list: nothing of it left out.
        settings.excluded_headers = Some(Vec::new());
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(a.service)
            .time(at)
            .settings(settings)
            .build()
            .map_err(|_| unsignable())?
            .into();
        let uri = parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        let req = SignableRequest::new(parts.method.as_str(), uri, headers.into_iter(), payload)
            .map_err(|_| unsignable())?;
        let out = sign(req, &params).map_err(|_| unsignable())?;
        Ok(out.signature().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_authorization_and_the_date() {
        let sig = "0".repeat(64);
        let h = format!(
            "AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/hipobj/aws4_request, SignedHeaders=host;x-amz-date, Signature={sig}"
        );
        let a = parse_v4(&h).expect("parses");
        assert_eq!(
            (a.access_key, a.date, a.region, a.service),
            ("AK", "20260101", "us-east-1", "hipobj")
        );
        assert_eq!(a.signed, ["host", "x-amz-date"]);
        for bad in [
            h.replace("aws4_request", "aws5_request"),
            h.replace("/hipobj/", "/hipobj/x/"),
            h.replace(&sig, "zz"),
            h.replace("AWS4-HMAC-SHA256", "AWS4-ECDSA-P256-SHA256"),
            h.replace("20260101", "2026011"),
        ] {
            assert!(parse_v4(&bad).is_none(), "{bad}");
        }
        assert_eq!(
            parse_amz_date("20260101T000001Z"),
            Some(UNIX_EPOCH + Duration::from_secs(1_767_225_601))
        );
        for bad in [
            "20261301T000000Z",
            "20260101T000000",
            "2026-1-1T000000Z",
            "",
        ] {
            assert!(parse_amz_date(bad).is_none(), "{bad}");
        }
    }
}
