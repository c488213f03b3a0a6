//! The on-disk object file format.
//!
//! An object (or a multipart part) is ONE file, so that a single `rename`
//! publishes data and metadata together:
//!
//! ```text
//! [ data: size bytes ][ header: JSON ][ header length: u64 LE ][ magic: "S3DMAOB1" ]
//! ```
//!
//! Data starts at offset 0 (page aligned, ready for direct I/O or RDMA
//! staging); the header follows the data because the ETag is only known once
//! the data has been streamed.
//!
//! An object made by CompleteMultipartUpload holds no data of its own: its
//! header carries a [`Manifest`] naming the part files (hard links of the
//! uploaded parts under `.parts/<id>/`, each in this same format) whose data,
//! in order, is the object's. Completing an upload so writes no object byte
//! a second time, and the object file is still published with one rename.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::checksum::StoredChecksum;

/// Magic bytes at the very end of every object file.
pub const MAGIC: &[u8; 8] = b"S3DMAOB1";
/// Length of the fixed trailer (header length + magic).
pub const TRAILER_LEN: u64 = 16;
/// Largest accepted header; keys are ≤ 1 KiB and metadata ≤ 2 KiB in S3.
pub const MAX_HEADER_LEN: u64 = 1 << 20;

/// Client-supplied attributes stored with an object and returned on reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectAttrs {
    /// `Content-Type`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// `Content-Encoding`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    /// `Content-Disposition`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
    /// `Content-Language`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_language: Option<String>,
    /// `Cache-Control`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    /// `Expires`, Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<i64>,
    /// `x-amz-meta-*` user metadata (names lower-case, without the prefix).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub user_metadata: BTreeMap<String, String>,
    /// Canonical id of the user who wrote the object (absent in objects
    /// written before owners existed: the bucket owner owns those).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The ACL given when the object was written (absent: private).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acl: Option<crate::acl::Acl>,
    /// A random id of this write of the key, so that an ACL set later by
    /// PutObjectAcl applies to this instance only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// For an object made by CompleteMultipartUpload: its upload id and a
    /// digest of the part list, so that a retried Complete gets the same
    /// answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_upload: Option<String>,
}

/// A new random instance id (128 bits, hex).
#[must_use]
pub fn new_instance() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Everything known about a stored object (or part).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// The object key (empty for multipart parts).
    pub key: String,
    /// Data length in bytes.
    pub size: u64,
    /// ETag without quotes: hex MD5, or `<hex>-<N>` for multipart objects.
    pub etag: String,
    /// Last-Modified, Unix milliseconds.
    pub last_modified_ms: i64,
    /// Number of parts for a multipart object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts_count: Option<u32>,
    /// Part number, for a multipart part file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part_number: Option<u32>,
    /// Client attributes.
    #[serde(flatten)]
    pub attrs: ObjectAttrs,
    /// The object's (or part's) flexible checksum, when it has one (files
    /// written before checksums were stored have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<StoredChecksum>,
    /// A multipart object's parts, in order (part `i + 1` is `parts[i]`);
    /// empty for other objects and for files written before parts were kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<PartMeta>,
    /// Where the data is when it is not in this file: the part files of a
    /// completed multipart upload. `None`: the data precedes the header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<Manifest>,
}

/// The part files holding a completed multipart object's data.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The directory under `.parts/` (32 lowercase hex digits, unique per
    /// completion).
    pub dir: String,
    /// The part numbers of the files `part-NNNNN` in it, in object order;
    /// their sizes are [`ObjectMeta::parts`]' (same length, same order).
    pub part_numbers: Vec<u32>,
}

impl Manifest {
    /// Whether `dir` is a well-formed manifest directory name (it becomes a
    /// path component, so nothing else is accepted).
    #[must_use]
    pub fn valid_dir(dir: &str) -> bool {
        dir.len() == 32
            && dir
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    }
}

/// One part of a completed multipart object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartMeta {
    /// The part's size in bytes.
    pub size: u64,
    /// The part's checksum (wire value, base64) of the object's algorithm,
    /// when the object has a checksum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
}

impl ObjectMeta {
    /// Last-Modified truncated to whole seconds (the resolution of HTTP dates).
    #[must_use]
    pub fn last_modified_secs(&self) -> i64 {
        self.last_modified_ms.div_euclid(1000)
    }

    /// Part `n`'s checksum of a multipart object (the object's algorithm
    /// and checksum type, the part's value), when the object has a
    /// checksum and kept its parts' (what GetObject and HeadObject with
    /// `partNumber` return with `x-amz-checksum-mode: ENABLED`).
    #[must_use]
    pub fn part_checksum(&self, n: u32) -> Option<crate::checksum::StoredChecksum> {
        let c = self.checksum.as_ref()?;
        let i = usize::try_from(n.checked_sub(1)?).ok()?;
        let value = self.parts.get(i)?.checksum.clone()?;
        Some(crate::checksum::StoredChecksum {
            algorithm: c.algorithm,
            checksum_type: c.checksum_type,
            value,
        })
    }

    /// The id of this instance of the key: its instance id, or for objects
    /// written without one, its ETag and modification time.
    #[must_use]
    pub fn instance(&self) -> String {
        match &self.attrs.instance {
            Some(i) => i.clone(),
            None => format!("{}@{}", self.etag, self.last_modified_ms),
        }
    }
}

/// Errors decoding a trailer/header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The file does not end with the magic bytes.
    #[error("bad magic (not an object file or truncated)")]
    BadMagic,
    /// Header length out of range.
    #[error("bad header length {0}")]
    BadLength(u64),
    /// The header is not valid JSON for [`ObjectMeta`].
    #[error("bad header: {0}")]
    BadHeader(String),
    /// The data length in the header disagrees with the file length.
    #[error("size mismatch: header says {header}, file holds {file}")]
    SizeMismatch {
        /// Size recorded in the header.
        header: u64,
        /// Size implied by the file length.
        file: u64,
    },
}

/// Encodes the header and trailer that follow the data.
#[must_use]
pub fn encode_trailer(meta: &ObjectMeta) -> Vec<u8> {
    let mut out = serde_json::to_vec(meta).unwrap_or_default();
    let len = out.len() as u64;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(MAGIC);
    out
}

/// Parses the fixed 16-byte trailer; returns the header length.
///
/// # Errors
/// [`FormatError`] when the magic or the length is wrong.
pub fn parse_trailer(trailer: &[u8; 16], file_len: u64) -> Result<u64, FormatError> {
    if &trailer[8..] != MAGIC {
        return Err(FormatError::BadMagic);
    }
    let mut lenb = [0u8; 8];
    lenb.copy_from_slice(&trailer[..8]);
    let len = u64::from_le_bytes(lenb);
    if len > MAX_HEADER_LEN || len + TRAILER_LEN > file_len {
        return Err(FormatError::BadLength(len));
    }
    Ok(len)
}

/// Parses the JSON header and checks it against the file length.
///
/// # Errors
/// [`FormatError`] when the header is malformed or inconsistent.
pub fn parse_header(header: &[u8], file_len: u64) -> Result<ObjectMeta, FormatError> {
    let meta: ObjectMeta =
        serde_json::from_slice(header).map_err(|e| FormatError::BadHeader(e.to_string()))?;
    let data_len = file_len - TRAILER_LEN - header.len() as u64;
    if let Some(m) = &meta.manifest {
        let parts_len = meta
            .parts
            .iter()
            .try_fold(0u64, |n, p| n.checked_add(p.size));
        if !Manifest::valid_dir(&m.dir)
            || m.part_numbers.len() != meta.parts.len()
            || data_len != 0
            || parts_len != Some(meta.size)
        {
            return Err(FormatError::BadHeader(
                "manifest inconsistent with the object's parts and size".into(),
            ));
        }
        return Ok(meta);
    }
    if meta.size != data_len {
        return Err(FormatError::SizeMismatch {
            header: meta.size,
            file: data_len,
        });
    }
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut meta = ObjectMeta {
            key: "a/b/é".into(),
            size: 5,
            etag: "abc".into(),
            last_modified_ms: 1_700_000_000_123,
            ..Default::default()
        };
        meta.attrs.user_metadata.insert("k".into(), "v".into());
        meta.attrs.content_type = Some("text/plain".into());
        let mut file = b"hello".to_vec();
        file.extend(encode_trailer(&meta));
        let len = file.len() as u64;
        let trailer: [u8; 16] = file[file.len() - 16..].try_into().unwrap();
        let hlen = parse_trailer(&trailer, len).unwrap();
        let start = (len - 16 - hlen) as usize;
        let got = parse_header(&file[start..file.len() - 16], len).unwrap();
        assert_eq!(got, meta);
        assert_eq!(got.last_modified_secs(), 1_700_000_000);
    }

    #[test]
    fn old_headers_load_and_checksums_round_trip() {
        // A header written before checksums and parts were stored.
        let old = br#"{"key":"k","size":0,"etag":"e","last_modified_ms":1,"content_type":"a/b"}"#;
        let len = old.len() as u64 + TRAILER_LEN;
        let m = parse_header(old, len).unwrap();
        assert_eq!(m.checksum, None);
        assert!(m.parts.is_empty());
        assert_eq!(m.attrs.content_type.as_deref(), Some("a/b"));
        let meta = ObjectMeta {
            key: "k".into(),
            size: 0,
            etag: "e-2".into(),
            parts_count: Some(2),
            checksum: Some(StoredChecksum {
                algorithm: crate::checksum::Algorithm::Crc32,
                checksum_type: crate::checksum::ChecksumType::Composite,
                value: "AAAAAA==-2".into(),
            }),
            parts: vec![
                PartMeta {
                    size: 5,
                    checksum: Some("AAAAAA==".into()),
                },
                PartMeta {
                    size: 0,
                    checksum: None,
                },
            ],
            ..Default::default()
        };
        let t = encode_trailer(&meta);
        let h = &t[..t.len() - 16];
        assert_eq!(parse_header(h, t.len() as u64).unwrap(), meta);
    }

    #[test]
    fn manifests_round_trip_and_must_add_up() {
        let meta = ObjectMeta {
            key: "k".into(),
            size: 7,
            etag: "e-2".into(),
            parts_count: Some(2),
            parts: vec![
                PartMeta {
                    size: 5,
                    checksum: None,
                },
                PartMeta {
                    size: 2,
                    checksum: None,
                },
            ],
            manifest: Some(Manifest {
                dir: "0123456789abcdef0123456789abcdef".into(),
                part_numbers: vec![1, 3],
            }),
            ..Default::default()
        };
        let t = encode_trailer(&meta);
        let h = &t[..t.len() - 16];
        assert_eq!(parse_header(h, t.len() as u64).unwrap(), meta);
        // Data in the file, sizes that do not add up, a path in the name,
        // a part list of another length: all refused.
        assert!(parse_header(h, t.len() as u64 + 1).is_err());
        for bad in [
            ObjectMeta {
                size: 8,
                ..meta.clone()
            },
            ObjectMeta {
                manifest: Some(Manifest {
                    dir: "../../../../etc/passwd0123456789a".into(),
                    part_numbers: vec![1, 3],
                }),
                ..meta.clone()
            },
            ObjectMeta {
                manifest: Some(Manifest {
                    dir: "0123456789abcdef0123456789abcdef".into(),
                    part_numbers: vec![1],
                }),
                ..meta.clone()
            },
        ] {
            let t = encode_trailer(&bad);
            let h = &t[..t.len() - 16];
            assert!(parse_header(h, t.len() as u64).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse_trailer(&[0u8; 16], 100), Err(FormatError::BadMagic));
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&1000u64.to_le_bytes());
        t[8..].copy_from_slice(MAGIC);
        assert_eq!(parse_trailer(&t, 100), Err(FormatError::BadLength(1000)));
        assert!(matches!(
            parse_header(b"{", 100),
            Err(FormatError::BadHeader(_))
        ));
    }
}
