//! Pure helpers of the RDMA path over HTTP types: the signed-header
//! check, request validation, size checks and reply headers. No I/O. The
//! header names and the chunk plan are `s3dma-wire`'s.

use http::{HeaderMap, HeaderValue};

pub use s3dma_wire::headers::{
    RDMA_BYTES, RDMA_BYTES_SHORT, RDMA_PROTOCOL, RDMA_PROTOCOL_STATUS, RDMA_REPLY, RDMA_TOKEN,
};
pub use s3dma_wire::plan::rdma_chunks as chunks;

/// SHA-256 of the empty string (the payload hash of an empty signed body).
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Whether `x-amz-rdma-token` is among `signed`: the SigV4 signed headers
/// of a request whose signature s3s verified
/// ([`crate::precheck::verified_signed_headers`]; empty for anonymous and
/// SigV2 requests, which never sign it), so that nobody can swap the token
/// of a captured request, nor send one without signing at all. The name
/// must be listed in lower case: s3s looks listed names up as written, so
/// only then does the signature bind the header's value.
#[must_use]
pub fn token_is_signed(signed: &[String]) -> bool {
    signed.iter().any(|h| h == RDMA_TOKEN)
}

/// Why a request cannot be served over RDMA as sent (a client error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// More than one `x-amz-rdma-token` header.
    #[error("x-amz-rdma-token must appear once, found {0} values")]
    DuplicateToken(usize),
    /// The token header is not valid ASCII.
    #[error("x-amz-rdma-token is not valid ASCII")]
    TokenNotAscii,
    /// `x-amz-rdma-protocol` appears more than once or is not ASCII.
    #[error("x-amz-rdma-protocol must appear once, as ASCII text")]
    BadProtocolHeader,
    /// A PUT/UploadPart over RDMA carried a body or a streaming payload.
    #[error("{0}")]
    BadPut(String),
    /// The object (range) does not fit the token's memory.
    #[error(
        "the requested object data is {need} bytes but the x-amz-rdma-token grants only {have} bytes of memory; nothing was transferred"
    )]
    TooSmall {
        /// Bytes to transfer.
        need: u64,
        /// Bytes the token grants.
        have: u64,
    },
}

/// The single `x-amz-rdma-token` value, if any.
///
/// # Errors
/// [`RequestError::DuplicateToken`] or [`RequestError::TokenNotAscii`].
pub fn token_header(headers: &HeaderMap) -> Result<Option<&str>, RequestError> {
    let mut values = headers.get_all(RDMA_TOKEN).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    let extra = values.count();
    if extra > 0 {
        return Err(RequestError::DuplicateToken(extra + 1));
    }
    first
        .to_str()
        .map(|s| Some(s.trim()))
        .map_err(|_| RequestError::TokenNotAscii)
}

/// Checks the shape of a PutObject/UploadPart over RDMA: an empty body
/// (`Content-Length: 0` or none, no chunked transfer) and a payload hash of
/// `UNSIGNED-PAYLOAD` (or the hash of the empty body). The object length is
/// the token's size.
///
/// # Errors
/// [`RequestError::BadPut`] naming what is wrong.
pub fn check_put_request(headers: &HeaderMap) -> Result<(), RequestError> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    match get("content-length").map(str::trim) {
        None | Some("0") => {}
        Some(v) => {
            return Err(RequestError::BadPut(format!(
                "a PUT with x-amz-rdma-token must have Content-Length: 0 (the object length is the token's size), got {v}"
            )));
        }
    }
    if headers.contains_key(http::header::TRANSFER_ENCODING)
        || headers.contains_key("x-amz-decoded-content-length")
    {
        return Err(RequestError::BadPut(
            "a PUT with x-amz-rdma-token must have an empty body, not a chunked or aws-chunked one"
                .into(),
        ));
    }
    match get("x-amz-content-sha256") {
        Some("UNSIGNED-PAYLOAD" | EMPTY_SHA256) => Ok(()),
        Some(v) => Err(RequestError::BadPut(format!(
            "a PUT with x-amz-rdma-token must be signed with x-amz-content-sha256: UNSIGNED-PAYLOAD, got {v}"
        ))),
        // Presigned URLs carry no payload hash (UNSIGNED-PAYLOAD implied).
        None => Ok(()),
    }
}

/// Checks that `need` bytes fit the token's `have` bytes.
///
/// # Errors
/// [`RequestError::TooSmall`].
pub fn check_fits(need: u64, have: u64) -> Result<(), RequestError> {
    if need > have {
        return Err(RequestError::TooSmall { need, have });
    }
    Ok(())
}

/// The RDMA reply headers: `x-amz-rdma-reply: <reply>` and, when given,
/// `x-amz-rdma-bytes-transferred: <bytes>`.
#[must_use]
pub fn reply_headers(reply: u16, bytes: Option<u64>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(RDMA_REPLY, HeaderValue::from(reply));
    if reply == 501 {
        // The hipobj-rc-v2 peers' fallback signal, beside the reply code.
        h.insert(
            RDMA_PROTOCOL_STATUS,
            HeaderValue::from_static("unsupported"),
        );
    }
    if let Some(n) = bytes {
        h.insert(RDMA_BYTES, HeaderValue::from(n));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdrs(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn list(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn signed_header_check() {
        assert!(token_is_signed(&list(&["host", "x-amz-rdma-token"])));
        assert!(!token_is_signed(&list(&["host", "x-amz-date"])));
        // Not verified (anonymous, SigV2): nothing is signed.
        assert!(!token_is_signed(&[]));
        // An upper-case entry does not bind the header's value in s3s.
        assert!(!token_is_signed(&list(&["host", "X-Amz-Rdma-Token"])));
    }

    #[test]
    fn token_header_values() {
        assert_eq!(token_header(&HeaderMap::new()), Ok(None));
        assert_eq!(
            token_header(&hdrs(&[(RDMA_TOKEN, " abc ")])),
            Ok(Some("abc"))
        );
        assert_eq!(
            token_header(&hdrs(&[(RDMA_TOKEN, "a"), (RDMA_TOKEN, "b")])),
            Err(RequestError::DuplicateToken(2))
        );
    }

    #[test]
    fn put_shape() {
        assert!(
            check_put_request(&hdrs(&[
                ("content-length", "0"),
                ("x-amz-content-sha256", "UNSIGNED-PAYLOAD")
            ]))
            .is_ok()
        );
        assert!(check_put_request(&hdrs(&[("x-amz-content-sha256", EMPTY_SHA256)])).is_ok());
        let e = check_put_request(&hdrs(&[("content-length", "5")])).unwrap_err();
        assert!(e.to_string().contains("Content-Length: 0"), "{e}");
        assert!(
            check_put_request(&hdrs(&[(
                "x-amz-content-sha256",
                "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
            )]))
            .is_err()
        );
        assert!(check_put_request(&hdrs(&[("transfer-encoding", "chunked")])).is_err());
    }

    #[test]
    fn sizes_and_chunks() {
        assert!(check_fits(10, 10).is_ok());
        assert_eq!(
            check_fits(11, 10),
            Err(RequestError::TooSmall { need: 11, have: 10 })
        );
        assert_eq!(chunks(0, 4).count(), 0);
        assert_eq!(
            chunks(10, 4).collect::<Vec<_>>(),
            vec![(0, 4), (4, 4), (8, 2)]
        );
        assert_eq!(chunks(8, 4).collect::<Vec<_>>(), vec![(0, 4), (4, 4)]);
        assert_eq!(chunks(3, 0).count(), 3);
        let total: u64 = chunks((5 << 20) + 1, 1 << 20).map(|c| c.1).sum();
        assert_eq!(total, (5 << 20) + 1);
    }

    #[test]
    fn reply() {
        let h = reply_headers(206, Some(42));
        assert_eq!(h[RDMA_REPLY], "206");
        assert_eq!(h[RDMA_BYTES], "42");
        assert!(!reply_headers(501, None).contains_key(RDMA_BYTES));
    }
}
