//! The request side: [`RequestChecksum`], the [`BodyCheck`] of a
//! PutObject or UploadPart, and [`Declared`], what a request's headers say
//! it will prove.

use std::fmt;

use http::HeaderMap;
use s3s::{S3Result, TrailingHeaders};
use tracing::debug;

use super::{
    ALGORITHMS, Algorithm, Hasher, StoredChecksum, UploadChecksum, decode, invalid_request,
};
use crate::store::{BodyCheck, StoreError, StoreResult};

/// What the request says it will prove.
#[derive(Debug)]
enum Expected {
    /// An `x-amz-checksum-<alg>` header, decoded.
    Header(Vec<u8>),
    /// A trailer announced by `x-amz-trailer` (the decoded trailers, none
    /// when the body carried no trailer section).
    Trailer(Option<TrailingHeaders>),
}

/// The [`BodyCheck`] of a PutObject or UploadPart: verifies the declared
/// checksum (header or trailer) and the declared lengths, and yields the
/// checksum to store.
pub struct RequestChecksum {
    hasher: Option<Hasher>,
    expected: Option<Expected>,
    declared_len: Option<u64>,
    /// The exact length the body must have (an RDMA body: the token's size).
    exact_len: Option<u64>,
    seen_len: u64,
    result: Option<StoredChecksum>,
}

impl fmt::Debug for RequestChecksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestChecksum")
            .field("hasher", &self.hasher)
            .field("expected", &self.expected.is_some())
            .field("declared_len", &self.declared_len)
            .field("exact_len", &self.exact_len)
            .field("seen_len", &self.seen_len)
            .finish_non_exhaustive()
    }
}

/// The checksum a request declares, from its headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    /// The algorithm of the header or trailer (or, with neither, of
    /// `x-amz-sdk-checksum-algorithm`).
    pub algorithm: Option<Algorithm>,
    /// The header's decoded value (`None` for a trailer or nothing).
    pub header: Option<Vec<u8>>,
    /// Whether the value comes as a trailer.
    pub trailer: bool,
}

impl Declared {
    /// Reads `x-amz-checksum-<alg>` (at most one), `x-amz-trailer` and
    /// `x-amz-sdk-checksum-algorithm` (empty means none).
    ///
    /// # Errors
    /// `InvalidRequest` as AWS S3 answers: a value that is not base64 of the
    /// digest's length, two checksum headers, a header and a checksum
    /// trailer, an unknown SDK algorithm or one that differs from the value's.
    pub fn parse(headers: &HeaderMap) -> S3Result<Declared> {
        let mut found: Option<(Algorithm, Vec<u8>)> = None;
        for a in ALGORITHMS {
            let mut values = headers.get_all(a.header()).iter();
            let Some(v) = values.next() else { continue };
            if found.is_some() || values.next().is_some() {
                return Err(invalid_request(
                    "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed.",
                ));
            }
            let raw = v.to_str().ok().and_then(|v| decode(a, v)).ok_or_else(|| {
                invalid_request(format!("Value for {} header is invalid.", a.header()))
            })?;
            found = Some((a, raw));
        }
        let mut trailer = None;
        if let Some(t) = headers.get("x-amz-trailer").and_then(|v| v.to_str().ok()) {
            // One trailer is all S3 accepts; a non-checksum trailer is not ours.
            if let Some(a) = t.split(',').find_map(Algorithm::from_header) {
                trailer = Some(a);
            }
        }
        let sdk = match headers
            .get("x-amz-sdk-checksum-algorithm")
            .map(|v| v.to_str().unwrap_or("?").trim())
        {
            None | Some("") => None,
            Some(s) => Some(Algorithm::from_name(s).ok_or_else(|| {
                invalid_request("Value for x-amz-sdk-checksum-algorithm header is invalid.")
            })?),
        };
        let (algorithm, header, is_trailer) = match (found, trailer) {
            (Some(_), Some(_)) => {
                return Err(invalid_request(
                    "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed.",
                ));
            }
            (Some((a, raw)), None) => (Some(a), Some(raw), false),
            (None, Some(a)) => (Some(a), None, true),
            (None, None) => (sdk, None, false),
        };
        if let (Some(s), Some(a)) = (sdk, algorithm)
            && s != a
        {
            return Err(invalid_request(format!(
                "Value for x-amz-sdk-checksum-algorithm header is invalid: the request carries a {a} checksum, not {s}."
            )));
        }
        Ok(Declared {
            algorithm,
            header,
            trailer: is_trailer,
        })
    }

    /// Whether the request carries a value (header or trailer), not just a
    /// name.
    #[must_use]
    pub fn has_value(&self) -> bool {
        self.header.is_some() || self.trailer
    }
}

impl RequestChecksum {
    fn build(
        declared: Declared,
        compute: Option<Algorithm>,
        headers: &HeaderMap,
        trailers: Option<TrailingHeaders>,
    ) -> RequestChecksum {
        let expected = match (declared.header, declared.trailer) {
            (Some(raw), _) => Some(Expected::Header(raw)),
            (None, true) => Some(Expected::Trailer(trailers)),
            (None, false) => None,
        };
        RequestChecksum {
            hasher: compute.map(Hasher::new),
            expected,
            declared_len: headers
                .get("x-amz-decoded-content-length")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok()),
            exact_len: None,
            seen_len: 0,
            result: None,
        }
    }

    /// The check of a PutObject: the declared checksum is verified and
    /// stored; without one, a CRC64NVME is computed and stored (AWS S3's
    /// default since 2025).
    ///
    /// # Errors
    /// See [`Declared::parse`].
    pub fn for_put(headers: &HeaderMap, trailers: Option<TrailingHeaders>) -> S3Result<Self> {
        let d = Declared::parse(headers)?;
        let compute = d.algorithm.or(Some(Algorithm::Crc64Nvme));
        Ok(Self::build(d, compute, headers, trailers))
    }

    /// The check of an UploadPart of an upload created with `upload`: such
    /// a part must carry a value of the upload's algorithm (as AWS S3
    /// requires); a part of an upload without one keeps whatever checksum
    /// it carries.
    ///
    /// # Errors
    /// See [`Declared::parse`]; `InvalidRequest` for a missing or
    /// different algorithm.
    pub fn for_part(
        headers: &HeaderMap,
        trailers: Option<TrailingHeaders>,
        upload: Option<UploadChecksum>,
    ) -> S3Result<Self> {
        let d = Declared::parse(headers)?;
        if let Some(u) = upload
            && (d.algorithm != Some(u.algorithm) || !d.has_value())
        {
            return Err(invalid_request(format!(
                "Checksum Type mismatch occurred, expected checksum Type: {}, actual checksum Type: {}",
                u.algorithm.name().to_ascii_lowercase(),
                d.algorithm
                    .filter(|_| d.has_value())
                    .map_or_else(|| "null".to_owned(), |a| a.name().to_ascii_lowercase())
            )));
        }
        let compute = d.algorithm;
        Ok(Self::build(d, compute, headers, trailers))
    }

    /// A check that verifies nothing and computes `algorithm` (if any) over
    /// bytes the server copies itself (UploadPartCopy into an upload with a
    /// checksum algorithm: the part gets its checksum, as from AWS S3).
    #[must_use]
    pub fn computing(algorithm: Option<Algorithm>) -> Self {
        let none = Declared {
            algorithm: None,
            header: None,
            trailer: false,
        };
        Self::build(none, algorithm, &HeaderMap::new(), None)
    }

    /// The body must be exactly `len` bytes (an RDMA body: what the
    /// token names); fewer or more fail the write (`BadDigest` when a
    /// checksum was declared, else `IncompleteBody`).
    pub fn expect_exact_len(&mut self, len: u64) {
        self.exact_len = Some(len);
    }

    /// The algorithm being computed, if any.
    #[must_use]
    pub fn algorithm(&self) -> Option<Algorithm> {
        self.hasher.as_ref().map(Hasher::algorithm)
    }

    fn trailer_value(
        &self,
        a: Algorithm,
        trailers: Option<&TrailingHeaders>,
    ) -> StoreResult<Vec<u8>> {
        let value = trailers.and_then(|t| {
            t.read(|h| {
                h.get(a.header())
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            })
            .flatten()
        });
        let Some(v) = value else {
            return Err(StoreError::IncompleteBody(format!(
                "The request announced the trailer {} (x-amz-trailer) but the body did not carry it.",
                a.header()
            )));
        };
        decode(a, &v).ok_or_else(|| {
            StoreError::InvalidRequest(format!(
                "Value for {} trailing header is invalid.",
                a.header()
            ))
        })
    }
}

impl BodyCheck for RequestChecksum {
    fn update(&mut self, data: &[u8]) {
        self.seen_len += data.len() as u64;
        if let Some(h) = &mut self.hasher {
            h.update(data);
        }
    }

    fn finish(&mut self) -> StoreResult<()> {
        if let Some(exact) = self.exact_len
            && exact != self.seen_len
        {
            let msg = format!(
                "Read {} bytes of the {exact} the request names; nothing was stored.",
                self.seen_len
            );
            return Err(if self.expected.is_some() {
                StoreError::ChecksumMismatch(msg)
            } else {
                StoreError::IncompleteBody(msg)
            });
        }
        if let Some(declared) = self.declared_len
            && declared != self.seen_len
        {
            return Err(StoreError::IncompleteBody(format!(
                "The request body has {} bytes but x-amz-decoded-content-length declares {declared}.",
                self.seen_len
            )));
        }
        let Some(h) = self.hasher.take() else {
            return Ok(());
        };
        let a = h.algorithm();
        let got = h.finalize();
        let want = match &self.expected {
            None => None,
            Some(Expected::Header(raw)) => Some(raw.clone()),
            Some(Expected::Trailer(t)) => Some(self.trailer_value(a, t.as_ref())?),
        };
        if let Some(want) = want
            && want != got
        {
            debug!(algorithm = a.name(), "checksum mismatch: nothing stored");
            return Err(StoreError::ChecksumMismatch(format!(
                "The {} you specified did not match the calculated checksum.",
                a.name()
            )));
        }
        self.result = Some(StoredChecksum::full(a, &got));
        Ok(())
    }

    fn checksum(&self) -> Option<StoredChecksum> {
        self.result.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::{ChecksumType, digest, encode};
    use s3s::S3ErrorCode;

    fn hm(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn declared_from_headers() {
        let d = Declared::parse(&hm(&[("x-amz-checksum-crc32", "NhCmhg==")])).unwrap();
        assert_eq!(d.algorithm, Some(Algorithm::Crc32));
        assert!(d.has_value());
        let d = Declared::parse(&hm(&[
            ("x-amz-trailer", "x-amz-checksum-crc64nvme"),
            ("x-amz-sdk-checksum-algorithm", "CRC64NVME"),
        ]))
        .unwrap();
        assert_eq!(d.algorithm, Some(Algorithm::Crc64Nvme));
        assert!(d.trailer);
        // An empty SDK algorithm is no algorithm.
        let d = Declared::parse(&hm(&[("x-amz-sdk-checksum-algorithm", "")])).unwrap();
        assert_eq!(d.algorithm, None);
        let d = Declared::parse(&hm(&[("x-amz-sdk-checksum-algorithm", "sha1")])).unwrap();
        assert_eq!(d.algorithm, Some(Algorithm::Sha1));
        assert!(!d.has_value());
        let bad = |h: &[(&str, &str)]| {
            let e = Declared::parse(&hm(h)).unwrap_err();
            assert_eq!(e.code(), &S3ErrorCode::InvalidRequest, "{h:?}");
            e.message().unwrap_or_default().to_owned()
        };
        assert!(bad(&[("x-amz-checksum-crc32", "nope")]).contains("x-amz-checksum-crc32"));
        assert!(bad(&[("x-amz-checksum-crc64nvme", "NhCmhg==")]).contains("invalid"));
        bad(&[
            ("x-amz-checksum-crc32", "NhCmhg=="),
            ("x-amz-checksum-crc32c", "NhCmhg=="),
        ]);
        bad(&[
            ("x-amz-checksum-crc32", "NhCmhg=="),
            ("x-amz-trailer", "x-amz-checksum-crc32"),
        ]);
        bad(&[("x-amz-sdk-checksum-algorithm", "MD5")]);
        bad(&[
            ("x-amz-sdk-checksum-algorithm", "CRC32C"),
            ("x-amz-checksum-crc32", "NhCmhg=="),
        ]);
    }

    #[test]
    fn request_check_verifies_and_yields() {
        let mut c =
            RequestChecksum::for_put(&hm(&[("x-amz-checksum-crc32", "NhCmhg==")]), None).unwrap();
        c.update(b"hel");
        c.update(b"lo");
        c.finish().unwrap();
        assert_eq!(
            c.checksum(),
            Some(StoredChecksum::full(
                Algorithm::Crc32,
                &digest(Algorithm::Crc32, b"hello")
            ))
        );
        let mut c =
            RequestChecksum::for_put(&hm(&[("x-amz-checksum-crc32", "NhCmhg==")]), None).unwrap();
        c.update(b"hellO");
        assert!(matches!(c.finish(), Err(StoreError::ChecksumMismatch(_))));
        assert_eq!(c.checksum(), None);
        // Nothing declared: a CRC64NVME is computed.
        let mut c = RequestChecksum::for_put(&HeaderMap::new(), None).unwrap();
        c.update(b"hello");
        c.finish().unwrap();
        assert_eq!(c.checksum().unwrap().algorithm, Algorithm::Crc64Nvme);
        // A short RDMA body with a checksum is BadDigest.
        let v = encode(&digest(Algorithm::Crc64Nvme, b"hello"));
        let mut c =
            RequestChecksum::for_put(&hm(&[("x-amz-checksum-crc64nvme", &v)]), None).unwrap();
        c.expect_exact_len(6);
        c.update(b"hello");
        assert!(matches!(c.finish(), Err(StoreError::ChecksumMismatch(_))));
        // A trailer that never came.
        let mut c =
            RequestChecksum::for_put(&hm(&[("x-amz-trailer", "x-amz-checksum-crc32")]), None)
                .unwrap();
        c.update(b"hello");
        assert!(matches!(c.finish(), Err(StoreError::IncompleteBody(_))));
        // Parts of an upload with an algorithm must carry it.
        let u = Some(UploadChecksum {
            algorithm: Algorithm::Crc32,
            checksum_type: ChecksumType::Composite,
        });
        assert!(RequestChecksum::for_part(&HeaderMap::new(), None, u).is_err());
        assert!(
            RequestChecksum::for_part(&hm(&[("x-amz-checksum-sha1", &encode(&[0; 20]))]), None, u)
                .is_err()
        );
        assert!(
            RequestChecksum::for_part(&hm(&[("x-amz-checksum-crc32", "NhCmhg==")]), None, u)
                .is_ok()
        );
        // A part of an upload without one computes nothing undeclared.
        let c = RequestChecksum::for_part(&HeaderMap::new(), None, None).unwrap();
        assert_eq!(c.algorithm(), None);
    }
}
