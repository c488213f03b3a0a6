//! S3 flexible checksums: CRC32, CRC32C, CRC64NVME, SHA1 and SHA256.
//!
//! * [`Algorithm`], [`ChecksumType`], [`Hasher`] and the value codec
//!   (base64 of the big-endian digest, checked for its length).
//! * [`StoredChecksum`]: what an object (or a part) keeps in its header.
//! * [`RequestChecksum`]: the [`BodyCheck`](crate::store::BodyCheck) of a
//!   PutObject/UploadPart. It reads the request's `x-amz-checksum-<alg>` header or the trailer named
//!   by `x-amz-trailer` (aws-chunked; s3s decodes the trailer), hashes the
//!   body bytes as the store writes them (the bytes of the HTTP body, or the
//!   bytes RDMA READ from the client's memory), and refuses the write with
//!   `BadDigest` on a mismatch, so nothing is stored. A PutObject without a
//!   checksum gets a CRC64NVME computed, as AWS S3 does.
//! * Multipart: [`UploadChecksum`] (the algorithm and type chosen at
//!   CreateMultipartUpload), [`complete`] (the object checksum at Complete:
//!   COMPOSITE = the checksum of the concatenated raw part checksums, with
//!   `-N`; FULL_OBJECT = the part CRCs combined, without re-reading data).
//!
//! Pure logic except [`RequestChecksum`] (module `request`), which reads
//! request headers and s3s's decoded trailers and is the store's
//! [`BodyCheck`](crate::store::BodyCheck).

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use s3s::dto::{self as s3dto, ChecksumAlgorithm, ChecksumMode};
use s3s::{S3Error, S3ErrorCode, S3Result};
use serde::{Deserialize, Serialize};
use sha1::Digest as _;

mod request;

pub use request::{Declared, RequestChecksum};

/// Why CompleteMultipartUpload's checksums are refused (the store maps
/// these to its errors: `InvalidPart`, `InvalidRequest`, `BadDigest`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChecksumError {
    /// A listed part checksum differs from the stored one (or the part has none).
    #[error("{0}")]
    InvalidPart(String),
    /// The request breaks a checksum rule of the upload.
    #[error("{0}")]
    InvalidRequest(String),
    /// The whole-object value differs from the computed one.
    #[error("{0}")]
    Mismatch(String),
}

/// A checksum algorithm S3 supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Algorithm {
    /// CRC-32/ISO-HDLC (the zlib CRC), 4 bytes.
    Crc32,
    /// CRC-32C (Castagnoli, iSCSI), 4 bytes.
    Crc32c,
    /// CRC-64/NVME, 8 bytes.
    Crc64Nvme,
    /// SHA-1, 20 bytes.
    Sha1,
    /// SHA-256, 32 bytes.
    Sha256,
}

/// Every algorithm, in S3's order.
pub const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::Crc32,
    Algorithm::Crc32c,
    Algorithm::Crc64Nvme,
    Algorithm::Sha1,
    Algorithm::Sha256,
];

impl Algorithm {
    /// The name S3 uses (`CRC32`, `CRC64NVME`, ...).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "CRC32",
            Algorithm::Crc32c => "CRC32C",
            Algorithm::Crc64Nvme => "CRC64NVME",
            Algorithm::Sha1 => "SHA1",
            Algorithm::Sha256 => "SHA256",
        }
    }

    /// The header (or trailer) carrying a value: `x-amz-checksum-<alg>`.
    #[must_use]
    pub fn header(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "x-amz-checksum-crc32",
            Algorithm::Crc32c => "x-amz-checksum-crc32c",
            Algorithm::Crc64Nvme => "x-amz-checksum-crc64nvme",
            Algorithm::Sha1 => "x-amz-checksum-sha1",
            Algorithm::Sha256 => "x-amz-checksum-sha256",
        }
    }

    /// Parses a name, case-insensitively (`crc32`, `CRC64NVME`).
    #[must_use]
    pub fn from_name(s: &str) -> Option<Algorithm> {
        ALGORITHMS
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(s.trim()))
    }

    /// The algorithm of an `x-amz-checksum-<alg>` header name.
    #[must_use]
    pub fn from_header(h: &str) -> Option<Algorithm> {
        ALGORITHMS
            .into_iter()
            .find(|a| a.header().eq_ignore_ascii_case(h.trim()))
    }

    /// Length of the raw digest in bytes.
    #[must_use]
    pub fn digest_len(self) -> usize {
        match self {
            Algorithm::Crc32 | Algorithm::Crc32c => 4,
            Algorithm::Crc64Nvme => 8,
            Algorithm::Sha1 => 20,
            Algorithm::Sha256 => 32,
        }
    }

    fn crc(self) -> Option<crc_fast::CrcAlgorithm> {
        match self {
            Algorithm::Crc32 => Some(crc_fast::CrcAlgorithm::Crc32IsoHdlc),
            Algorithm::Crc32c => Some(crc_fast::CrcAlgorithm::Crc32Iscsi),
            Algorithm::Crc64Nvme => Some(crc_fast::CrcAlgorithm::Crc64Nvme),
            Algorithm::Sha1 | Algorithm::Sha256 => None,
        }
    }

    /// Whether a multipart upload may use `t` with this algorithm: CRC64NVME
    /// is FULL_OBJECT only, SHA1/SHA256 are COMPOSITE only, the CRC32s both.
    #[must_use]
    pub fn supports(self, t: ChecksumType) -> bool {
        match t {
            ChecksumType::FullObject => self.crc().is_some(),
            ChecksumType::Composite => self != Algorithm::Crc64Nvme,
        }
    }

    /// The multipart checksum type used when CreateMultipartUpload names
    /// none: FULL_OBJECT for CRC64NVME, COMPOSITE for the others.
    #[must_use]
    pub fn default_multipart_type(self) -> ChecksumType {
        if self == Algorithm::Crc64Nvme {
            ChecksumType::FullObject
        } else {
            ChecksumType::Composite
        }
    }

    /// As an s3s DTO.
    #[must_use]
    pub fn to_dto(self) -> ChecksumAlgorithm {
        ChecksumAlgorithm::from_static(self.name())
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How an object's checksum covers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ChecksumType {
    /// The checksum of the object's bytes (every single-part object; a
    /// multipart object whose part CRCs were combined).
    FullObject,
    /// The checksum of the parts' checksums (`<base64>-<N>`).
    Composite,
}

impl ChecksumType {
    /// The name S3 uses.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            ChecksumType::FullObject => "FULL_OBJECT",
            ChecksumType::Composite => "COMPOSITE",
        }
    }

    /// Parses a name, case-insensitively.
    #[must_use]
    pub fn from_name(s: &str) -> Option<ChecksumType> {
        [ChecksumType::FullObject, ChecksumType::Composite]
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s.trim()))
    }

    /// As an s3s DTO.
    #[must_use]
    pub fn to_dto(self) -> s3dto::ChecksumType {
        s3dto::ChecksumType::from_static(self.name())
    }
}

/// One running checksum.
#[derive(Clone)]
pub enum Hasher {
    /// A CRC (crc-fast, SIMD).
    Crc(Algorithm, crc_fast::Digest),
    /// SHA-1.
    Sha1(sha1::Sha1),
    /// SHA-256.
    Sha256(sha2::Sha256),
}

impl fmt::Debug for Hasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hasher({})", self.algorithm())
    }
}

impl Hasher {
    /// A fresh hasher.
    #[must_use]
    pub fn new(a: Algorithm) -> Hasher {
        match a.crc() {
            Some(c) => Hasher::Crc(a, crc_fast::Digest::new(c)),
            None if a == Algorithm::Sha1 => Hasher::Sha1(sha1::Sha1::new()),
            None => Hasher::Sha256(sha2::Sha256::new()),
        }
    }

    /// The algorithm.
    #[must_use]
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Hasher::Crc(a, _) => *a,
            Hasher::Sha1(_) => Algorithm::Sha1,
            Hasher::Sha256(_) => Algorithm::Sha256,
        }
    }

    /// Feeds bytes.
    pub fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Crc(_, d) => d.update(data),
            Hasher::Sha1(h) => h.update(data),
            Hasher::Sha256(h) => h.update(data),
        }
    }

    /// The raw digest (big-endian for the CRCs, as S3 encodes them).
    #[must_use]
    pub fn finalize(self) -> Vec<u8> {
        match self {
            Hasher::Crc(a, d) => crc_bytes(a, d.finalize()),
            Hasher::Sha1(h) => h.finalize().to_vec(),
            Hasher::Sha256(h) => h.finalize().to_vec(),
        }
    }
}

/// The checksum of `data` in one call.
#[must_use]
pub fn digest(a: Algorithm, data: &[u8]) -> Vec<u8> {
    let mut h = Hasher::new(a);
    h.update(data);
    h.finalize()
}

fn crc_bytes(a: Algorithm, v: u64) -> Vec<u8> {
    if a == Algorithm::Crc64Nvme {
        v.to_be_bytes().to_vec()
    } else {
        u32::try_from(v & 0xffff_ffff)
            .unwrap_or_default()
            .to_be_bytes()
            .to_vec()
    }
}

fn crc_value(raw: &[u8]) -> u64 {
    raw.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// Base64 (standard, padded) of a raw digest: the S3 wire form.
#[must_use]
pub fn encode(raw: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(raw)
}

/// Decodes a wire value: standard base64 of exactly the algorithm's digest
/// length; `None` when it is not.
#[must_use]
pub fn decode(a: Algorithm, value: &str) -> Option<Vec<u8>> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .ok()?;
    (raw.len() == a.digest_len()).then_some(raw)
}

/// A checksum kept with an object or a part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredChecksum {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// FULL_OBJECT or COMPOSITE.
    #[serde(rename = "type")]
    pub checksum_type: ChecksumType,
    /// The wire value: base64, with `-<N>` for a composite multipart checksum.
    pub value: String,
}

impl StoredChecksum {
    /// A full-object checksum from a raw digest.
    #[must_use]
    pub fn full(algorithm: Algorithm, raw: &[u8]) -> StoredChecksum {
        StoredChecksum {
            algorithm,
            checksum_type: ChecksumType::FullObject,
            value: encode(raw),
        }
    }

    /// As an s3s `Checksum` (one algorithm field and the type set).
    #[must_use]
    pub fn to_dto(&self) -> s3dto::Checksum {
        let mut c = s3dto::Checksum {
            checksum_type: Some(self.checksum_type.to_dto()),
            ..Default::default()
        };
        let v = Some(self.value.clone());
        match self.algorithm {
            Algorithm::Crc32 => c.checksum_crc32 = v,
            Algorithm::Crc32c => c.checksum_crc32c = v,
            Algorithm::Crc64Nvme => c.checksum_crc64nvme = v,
            Algorithm::Sha1 => c.checksum_sha1 = v,
            Algorithm::Sha256 => c.checksum_sha256 = v,
        }
        c
    }
}

/// Copies the fields of a [`s3dto::Checksum`] (from
/// [`StoredChecksum::to_dto`]) into an output struct with the same field
/// names; `with_type` also sets `checksum_type`.
macro_rules! set_checksum {
    ($out:expr, $dto:expr) => {{
        let d: s3s::dto::Checksum = $dto;
        $out.checksum_crc32 = d.checksum_crc32;
        $out.checksum_crc32c = d.checksum_crc32c;
        $out.checksum_crc64nvme = d.checksum_crc64nvme;
        $out.checksum_sha1 = d.checksum_sha1;
        $out.checksum_sha256 = d.checksum_sha256;
    }};
    ($out:expr, $dto:expr, with_type) => {{
        let d: s3s::dto::Checksum = $dto;
        $out.checksum_type = d.checksum_type.clone();
        $crate::checksum::set_checksum!($out, d);
    }};
}
pub(crate) use set_checksum;

/// Whether a GetObject/HeadObject asked for checksums
/// (`x-amz-checksum-mode: ENABLED`).
#[must_use]
pub fn mode_enabled(m: Option<&ChecksumMode>) -> bool {
    m.is_some_and(|m| m.as_str().eq_ignore_ascii_case(ChecksumMode::ENABLED))
}

/// The checksum algorithm and type of a multipart upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadChecksum {
    /// The algorithm every part carries.
    pub algorithm: Algorithm,
    /// How the object checksum is made at Complete.
    #[serde(rename = "type")]
    pub checksum_type: ChecksumType,
}

pub(crate) fn invalid_request(msg: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidRequest, msg.into())
}

impl UploadChecksum {
    /// From CreateMultipartUpload's `x-amz-checksum-algorithm` and
    /// `x-amz-checksum-type` (as AWS S3: a type needs an algorithm,
    /// CRC64NVME is FULL_OBJECT only, SHA1/SHA256 COMPOSITE only).
    ///
    /// # Errors
    /// `InvalidRequest` for an unknown algorithm or type, or a pair S3 refuses.
    pub fn from_create(
        algorithm: Option<&ChecksumAlgorithm>,
        checksum_type: Option<&s3dto::ChecksumType>,
    ) -> S3Result<Option<UploadChecksum>> {
        let algorithm = match algorithm.map(ChecksumAlgorithm::as_str) {
            None | Some("") => None,
            Some(s) => Some(Algorithm::from_name(s).ok_or_else(|| {
                invalid_request("Value for x-amz-checksum-algorithm header is invalid.")
            })?),
        };
        let checksum_type = match checksum_type.map(s3dto::ChecksumType::as_str) {
            None | Some("") => None,
            Some(s) => Some(ChecksumType::from_name(s).ok_or_else(|| {
                invalid_request("Value for x-amz-checksum-type header is invalid.")
            })?),
        };
        match (algorithm, checksum_type) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(invalid_request(
                "The x-amz-checksum-type header can only be used with the x-amz-checksum-algorithm header.",
            )),
            (Some(a), t) => {
                let t = t.unwrap_or_else(|| a.default_multipart_type());
                if !a.supports(t) {
                    return Err(invalid_request(format!(
                        "The {} checksum type cannot be used with the {} checksum algorithm.",
                        t.name(),
                        a.name().to_ascii_lowercase()
                    )));
                }
                Ok(Some(UploadChecksum {
                    algorithm: a,
                    checksum_type: t,
                }))
            }
        }
    }
}

/// A part as Complete sees it: its number, size and stored checksum.
#[derive(Debug, Clone, Copy)]
pub struct PartSum<'a> {
    /// The part number.
    pub number: u32,
    /// Its size.
    pub size: u64,
    /// Its checksum, when it carried one.
    pub checksum: Option<&'a StoredChecksum>,
}

/// The checksums a CompleteMultipartUpload request lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompleteRequest {
    /// Per part number: the algorithm and wire value the client listed.
    pub parts: BTreeMap<u32, (Algorithm, String)>,
    /// A full-object (or composite) `x-amz-checksum-<alg>` header.
    pub whole: Option<(Algorithm, String)>,
    /// `x-amz-checksum-type`, when sent.
    pub checksum_type: Option<ChecksumType>,
}

impl CompleteRequest {
    /// Reads the request's headers and parts.
    ///
    /// # Errors
    /// `InvalidRequest` for several values on one part or on the request,
    /// or an unknown `x-amz-checksum-type`.
    pub fn parse(
        input: &s3dto::CompleteMultipartUploadInput,
        parts: &[s3dto::CompletedPart],
    ) -> S3Result<CompleteRequest> {
        let mut out = CompleteRequest::default();
        let whole = one_value(&[
            (Algorithm::Crc32, input.checksum_crc32.as_ref()),
            (Algorithm::Crc32c, input.checksum_crc32c.as_ref()),
            (Algorithm::Crc64Nvme, input.checksum_crc64nvme.as_ref()),
            (Algorithm::Sha1, input.checksum_sha1.as_ref()),
            (Algorithm::Sha256, input.checksum_sha256.as_ref()),
        ])?;
        out.whole = whole;
        out.checksum_type = match input
            .checksum_type
            .as_ref()
            .map(s3dto::ChecksumType::as_str)
        {
            None | Some("") => None,
            Some(s) => Some(ChecksumType::from_name(s).ok_or_else(|| {
                invalid_request("Value for x-amz-checksum-type header is invalid.")
            })?),
        };
        for p in parts {
            let v = one_value(&[
                (Algorithm::Crc32, p.checksum_crc32.as_ref()),
                (Algorithm::Crc32c, p.checksum_crc32c.as_ref()),
                (Algorithm::Crc64Nvme, p.checksum_crc64nvme.as_ref()),
                (Algorithm::Sha1, p.checksum_sha1.as_ref()),
                (Algorithm::Sha256, p.checksum_sha256.as_ref()),
            ])?;
            if let (Some(n), Some(v)) = (p.part_number.and_then(|n| u32::try_from(n).ok()), v) {
                out.parts.insert(n, v);
            }
        }
        Ok(out)
    }
}

fn one_value(v: &[(Algorithm, Option<&String>)]) -> S3Result<Option<(Algorithm, String)>> {
    let mut it = v
        .iter()
        .filter_map(|(a, s)| s.map(|s| (*a, s.trim().to_owned())));
    let first = it.next();
    if it.next().is_some() {
        return Err(invalid_request(
            "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed.",
        ));
    }
    Ok(first)
}

/// The object checksum at CompleteMultipartUpload, after the listed part
/// checksums were checked against the stored ones.
///
/// * Every listed part checksum must equal the part's stored one
///   (`InvalidPart`). An upload with a COMPOSITE checksum must list one for
///   every part (`InvalidRequest`, as AWS S3).
/// * `x-amz-checksum-type`, when sent, must equal the upload's
///   (`InvalidRequest`).
/// * COMPOSITE: the checksum of the concatenated raw part checksums,
///   base64, `-<number of parts>`. FULL_OBJECT: the part CRCs combined into
///   the CRC of the whole object.
/// * A whole-object value sent with Complete must match (`BadDigest`).
///
/// An upload without a checksum algorithm yields none.
///
/// # Errors
/// As above.
pub fn complete(
    upload: Option<UploadChecksum>,
    parts: &[PartSum<'_>],
    req: &CompleteRequest,
) -> Result<Option<StoredChecksum>, ChecksumError> {
    for p in parts {
        if let Some((a, v)) = req.parts.get(&p.number) {
            let same = p
                .checksum
                .is_some_and(|c| c.algorithm == *a && c.value == *v);
            if !same {
                return Err(ChecksumError::InvalidPart(format!(
                    "One or more of the specified parts could not be found. The part may not have been uploaded, or the specified entity tag may not match the part's entity tag: the {} of part {} does not match.",
                    a.name(),
                    p.number
                )));
            }
        }
    }
    let Some(u) = upload else {
        if let Some(t) = req.checksum_type {
            return Err(ChecksumError::InvalidRequest(format!(
                "The upload was created without a checksum algorithm; the complete request must not name the {} checksum type.",
                t.name()
            )));
        }
        if let Some((a, _)) = &req.whole {
            return Err(ChecksumError::InvalidRequest(format!(
                "The upload was created without a checksum algorithm; the complete request cannot carry a {} checksum.",
                a.name()
            )));
        }
        return Ok(None);
    };
    let lower = u.algorithm.name().to_ascii_lowercase();
    if let Some(t) = req.checksum_type
        && t != u.checksum_type
    {
        return Err(ChecksumError::InvalidRequest(format!(
            "The upload was created using the {} checksum mode. The complete request must use the same checksum mode.",
            u.checksum_type.name()
        )));
    }
    let mut raws = Vec::with_capacity(parts.len());
    for p in parts {
        let c = p.checksum.filter(|c| c.algorithm == u.algorithm);
        if u.checksum_type == ChecksumType::Composite && !req.parts.contains_key(&p.number) {
            return Err(ChecksumError::InvalidRequest(format!(
                "The upload was created using a {lower} checksum. The complete request must include the checksum for each part. It was missing for part {} in the request.",
                p.number
            )));
        }
        let raw = c
            .and_then(|c| decode(u.algorithm, &c.value))
            .ok_or_else(|| {
                ChecksumError::InvalidPart(format!(
                    "Part {} was uploaded without a {lower} checksum.",
                    p.number
                ))
            })?;
        raws.push((raw, p.size));
    }
    let stored = match u.checksum_type {
        ChecksumType::Composite => StoredChecksum {
            algorithm: u.algorithm,
            checksum_type: ChecksumType::Composite,
            value: composite(u.algorithm, raws.iter().map(|(r, _)| r.as_slice())),
        },
        ChecksumType::FullObject => {
            let raw = combine(u.algorithm, &raws).ok_or_else(|| {
                ChecksumError::InvalidRequest(format!(
                    "The {} checksum algorithm has no full-object multipart checksum.",
                    u.algorithm
                ))
            })?;
            StoredChecksum::full(u.algorithm, &raw)
        }
    };
    if let Some((a, v)) = &req.whole {
        if *a != u.algorithm {
            return Err(ChecksumError::InvalidRequest(format!(
                "The upload was created using a {lower} checksum; the complete request carries a {} checksum.",
                a.name()
            )));
        }
        // The composite value may be sent with or without its "-N".
        let base = stored.value.split('-').next().unwrap_or_default();
        if *v != stored.value && v != base {
            return Err(ChecksumError::Mismatch(format!(
                "The {} you specified did not match the calculated checksum.",
                a.name()
            )));
        }
    }
    Ok(Some(stored))
}

/// A COMPOSITE multipart checksum: the checksum of the concatenated raw part
/// checksums, base64, then `-<number of parts>`.
#[must_use]
pub fn composite<'a>(a: Algorithm, parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut h = Hasher::new(a);
    let mut n = 0usize;
    for p in parts {
        h.update(p);
        n += 1;
    }
    format!("{}-{n}", encode(&h.finalize()))
}

/// A FULL_OBJECT multipart checksum: the raw CRCs of consecutive parts
/// (with their lengths) combined into the CRC of their concatenation.
/// `None` for SHA1/SHA256, which cannot be combined.
#[must_use]
pub fn combine(a: Algorithm, parts: &[(Vec<u8>, u64)]) -> Option<Vec<u8>> {
    let c = a.crc()?;
    let mut acc = crc_fast::checksum(c, b"");
    for (raw, len) in parts {
        if *len > 0 {
            acc = crc_fast::checksum_combine(c, acc, crc_value(raw), *len);
        }
    }
    Some(crc_bytes(a, acc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngCore as _;

    fn random(len: usize, seed: u64) -> Vec<u8> {
        use rand::SeedableRng as _;
        let mut v = vec![0u8; len];
        rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
        v
    }

    #[test]
    fn known_vectors() {
        // The standard check values of "123456789".
        let d = b"123456789";
        assert_eq!(digest(Algorithm::Crc32, d), 0xcbf4_3926u32.to_be_bytes());
        assert_eq!(digest(Algorithm::Crc32c, d), 0xe306_9283u32.to_be_bytes());
        assert_eq!(
            digest(Algorithm::Crc64Nvme, d),
            0xae8b_1486_0a79_9888u64.to_be_bytes()
        );
        // CRC32 of "hello" as S3 shows it.
        assert_eq!(encode(&digest(Algorithm::Crc32, b"hello")), "NhCmhg==");
        assert_eq!(
            hex::encode(digest(Algorithm::Sha1, b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(
            hex::encode(digest(Algorithm::Sha256, b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        for a in ALGORITHMS {
            assert_eq!(digest(a, b"x").len(), a.digest_len(), "{a}");
        }
    }

    #[test]
    fn names_and_values() {
        assert_eq!(
            Algorithm::from_name("crc64nvme"),
            Some(Algorithm::Crc64Nvme)
        );
        assert_eq!(Algorithm::from_name("MD5"), None);
        assert_eq!(
            Algorithm::from_header("X-Amz-Checksum-Sha256"),
            Some(Algorithm::Sha256)
        );
        assert_eq!(Algorithm::from_header("x-amz-checksum-mode"), None);
        assert!(decode(Algorithm::Crc32, "NhCmhg==").is_some());
        // Wrong length, bad base64, unpadded.
        assert!(decode(Algorithm::Crc64Nvme, "NhCmhg==").is_none());
        assert!(decode(Algorithm::Crc32, "!!!!").is_none());
        assert!(decode(Algorithm::Crc32, "NhCmhg").is_none());
        let s = StoredChecksum::full(Algorithm::Crc64Nvme, &[0; 8]);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            r#"{"algorithm":"CRC64NVME","type":"FULL_OBJECT","value":"AAAAAAAAAAA="}"#
        );
        assert_eq!(serde_json::from_str::<StoredChecksum>(&json).unwrap(), s);
        let d = s.to_dto();
        assert_eq!(d.checksum_crc64nvme.as_deref(), Some("AAAAAAAAAAA="));
        assert_eq!(d.checksum_type.unwrap().as_str(), "FULL_OBJECT");
        assert!(d.checksum_crc32.is_none());
    }

    #[test]
    fn full_object_combines_parts() {
        let data = random(3 << 20, 7);
        let cuts = [0usize, 1, 1_000_003, 1_000_003, 2_500_000, data.len()];
        for a in [Algorithm::Crc32, Algorithm::Crc32c, Algorithm::Crc64Nvme] {
            let parts: Vec<(Vec<u8>, u64)> = cuts
                .windows(2)
                .map(|w| (digest(a, &data[w[0]..w[1]]), (w[1] - w[0]) as u64))
                .collect();
            assert_eq!(combine(a, &parts).unwrap(), digest(a, &data), "{a}");
            // One part is the part's own CRC.
            assert_eq!(
                combine(a, &[(digest(a, &data), data.len() as u64)]).unwrap(),
                digest(a, &data)
            );
            assert_eq!(combine(a, &[]).unwrap(), digest(a, b""));
        }
        assert!(combine(Algorithm::Sha256, &[]).is_none());
    }

    #[test]
    fn composite_is_checksum_of_checksums() {
        let parts = [random(100, 1), random(200, 2), random(3, 3)];
        for a in ALGORITHMS {
            let raws: Vec<Vec<u8>> = parts.iter().map(|p| digest(a, p)).collect();
            let got = composite(a, raws.iter().map(Vec::as_slice));
            let want = format!("{}-3", encode(&digest(a, &raws.concat())));
            assert_eq!(got, want, "{a}");
        }
        // A known value: SHA256 composite of the SHA256s of "a" and "b".
        let raws = [
            digest(Algorithm::Sha256, b"a"),
            digest(Algorithm::Sha256, b"b"),
        ];
        let mut h = sha2::Sha256::new();
        h.update(&raws[0]);
        h.update(&raws[1]);
        assert_eq!(
            composite(Algorithm::Sha256, raws.iter().map(Vec::as_slice)),
            format!("{}-2", encode(&h.finalize()))
        );
    }

    #[test]
    fn create_rules() {
        let a = |s: &'static str| ChecksumAlgorithm::from_static(s);
        let t = |s: &'static str| s3dto::ChecksumType::from_static(s);
        let ok = |al: Option<&ChecksumAlgorithm>, ty: Option<&s3dto::ChecksumType>| {
            UploadChecksum::from_create(al, ty).unwrap()
        };
        assert_eq!(ok(None, None), None);
        assert_eq!(
            ok(Some(&a("CRC64NVME")), None).unwrap().checksum_type,
            ChecksumType::FullObject
        );
        assert_eq!(
            ok(Some(&a("CRC32")), None).unwrap().checksum_type,
            ChecksumType::Composite
        );
        assert_eq!(
            ok(Some(&a("CRC32C")), Some(&t("FULL_OBJECT")))
                .unwrap()
                .checksum_type,
            ChecksumType::FullObject
        );
        assert_eq!(
            ok(Some(&a("SHA1")), Some(&t("COMPOSITE")))
                .unwrap()
                .algorithm,
            Algorithm::Sha1
        );
        for (al, ty) in [
            (None, Some(t("COMPOSITE"))),
            (Some(a("CRC64NVME")), Some(t("COMPOSITE"))),
            (Some(a("SHA256")), Some(t("FULL_OBJECT"))),
            (Some(a("MD5")), None),
            (Some(a("CRC32")), Some(t("PARTIAL"))),
        ] {
            let e = UploadChecksum::from_create(al.as_ref(), ty.as_ref()).unwrap_err();
            assert_eq!(e.code(), &S3ErrorCode::InvalidRequest, "{al:?} {ty:?}");
        }
    }

    #[test]
    fn complete_rules() {
        let data = random(2 << 20, 9);
        let (a, b) = data.split_at(1 << 20);
        let up = |alg, ty| {
            Some(UploadChecksum {
                algorithm: alg,
                checksum_type: ty,
            })
        };
        for alg in [Algorithm::Crc32, Algorithm::Crc64Nvme] {
            let stored: Vec<StoredChecksum> = [a, b]
                .iter()
                .map(|p| StoredChecksum::full(alg, &digest(alg, p)))
                .collect();
            let parts: Vec<PartSum<'_>> = stored
                .iter()
                .zip([a, b])
                .enumerate()
                .map(|(i, (c, p))| PartSum {
                    number: u32::try_from(i).unwrap() + 1,
                    size: p.len() as u64,
                    checksum: Some(c),
                })
                .collect();
            let mut req = CompleteRequest::default();
            let got = complete(up(alg, ChecksumType::FullObject), &parts, &req)
                .unwrap()
                .unwrap();
            assert_eq!(got.value, encode(&digest(alg, &data)));
            assert_eq!(got.checksum_type, ChecksumType::FullObject);
            // The client's whole-object value: right, then wrong.
            req.whole = Some((alg, got.value.clone()));
            assert!(complete(up(alg, ChecksumType::FullObject), &parts, &req).is_ok());
            req.whole = Some((alg, encode(&digest(alg, b"other"))));
            assert!(matches!(
                complete(up(alg, ChecksumType::FullObject), &parts, &req),
                Err(ChecksumError::Mismatch(_))
            ));
            // A listed part checksum that differs.
            let mut req = CompleteRequest::default();
            req.parts.insert(2, (alg, stored[0].value.clone()));
            assert!(matches!(
                complete(up(alg, ChecksumType::FullObject), &parts, &req),
                Err(ChecksumError::InvalidPart(_))
            ));
            if alg == Algorithm::Crc32 {
                // COMPOSITE needs every part listed.
                let mut req = CompleteRequest::default();
                req.parts.insert(1, (alg, stored[0].value.clone()));
                assert!(matches!(
                    complete(up(alg, ChecksumType::Composite), &parts, &req),
                    Err(ChecksumError::InvalidRequest(_))
                ));
                req.parts.insert(2, (alg, stored[1].value.clone()));
                let got = complete(up(alg, ChecksumType::Composite), &parts, &req)
                    .unwrap()
                    .unwrap();
                let raws = [digest(alg, a), digest(alg, b)];
                assert_eq!(
                    got.value,
                    format!("{}-2", encode(&digest(alg, &raws.concat())))
                );
                // The type named on Complete must be the upload's.
                req.checksum_type = Some(ChecksumType::FullObject);
                assert!(matches!(
                    complete(up(alg, ChecksumType::Composite), &parts, &req),
                    Err(ChecksumError::InvalidRequest(_))
                ));
            }
        }
        // No algorithm: no checksum, but listed part values still checked.
        let c = StoredChecksum::full(Algorithm::Crc32, &digest(Algorithm::Crc32, a));
        let parts = [PartSum {
            number: 1,
            size: a.len() as u64,
            checksum: Some(&c),
        }];
        let mut req = CompleteRequest::default();
        assert_eq!(complete(None, &parts, &req).unwrap(), None);
        req.parts.insert(1, (Algorithm::Crc32, c.value.clone()));
        assert_eq!(complete(None, &parts, &req).unwrap(), None);
        req.parts.insert(1, (Algorithm::Crc32c, c.value.clone()));
        assert!(complete(None, &parts, &req).is_err());
    }
}
