//! ETag computation: MD5 hex for single-part objects, MD5 of the part MD5s
//! with a `-N` suffix for multipart objects.

use s3s::crypto::{Checksum as _, Md5};

/// Hex MD5 of `data` (the ETag of a single-part object).
#[must_use]
pub fn md5_hex(data: &[u8]) -> String {
    hex::encode(Md5::checksum(data))
}

/// The ETag of a multipart object from its parts' ETags (hex MD5s), in order.
///
/// Returns `None` if a part ETag is not a 32-digit hex MD5.
#[must_use]
pub fn multipart_etag<'a>(part_etags: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut h = Md5::new();
    let mut n = 0usize;
    for e in part_etags {
        let raw = hex::decode(e).ok()?;
        if raw.len() != 16 {
            return None;
        }
        h.update(&raw);
        n += 1;
    }
    Some(format!("{}-{n}", hex::encode(h.finalize())))
}

/// Decodes a `Content-MD5` header (base64 of the 16-byte digest) into hex.
///
/// Returns `None` when the value is not base64 of exactly 16 bytes.
#[must_use]
pub fn content_md5_to_hex(value: &str) -> Option<String> {
    use base64::Engine as _;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .ok()?;
    (raw.len() == 16).then(|| hex::encode(raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_of_empty() {
        assert_eq!(md5_hex(b""), "d41d8cd98f00b204e9800998ecf8427e");
    }

    #[test]
    fn multipart() {
        // Two parts "a" and "b": md5(md5("a") || md5("b")) + "-2".
        let a = md5_hex(b"a");
        let b = md5_hex(b"b");
        let mut cat = hex::decode(&a).unwrap();
        cat.extend(hex::decode(&b).unwrap());
        let expect = format!("{}-2", md5_hex(&cat));
        assert_eq!(multipart_etag([a.as_str(), b.as_str()]).unwrap(), expect);
        assert_eq!(multipart_etag(["zz"]), None);
    }

    #[test]
    fn content_md5() {
        // base64 of md5("") = 1B2M2Y8AsgTpgAmY7PhCfg==
        assert_eq!(
            content_md5_to_hex("1B2M2Y8AsgTpgAmY7PhCfg==").as_deref(),
            Some("d41d8cd98f00b204e9800998ecf8427e")
        );
        assert_eq!(content_md5_to_hex("not base64!"), None);
        assert_eq!(content_md5_to_hex("YWJj"), None);
    }
}
