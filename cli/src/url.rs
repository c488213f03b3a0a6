//! `s3://bucket/key` URLs and the byte-range arithmetic of `s3dma get`
//! (pure, no I/O).

use std::fmt;

use s3dma_client::ByteRange;

/// A parsed `s3://bucket[/key]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct S3Url {
    /// The bucket (never empty).
    pub bucket: String,
    /// Everything after the first `/` following the bucket; may be empty
    /// (a bucket, or a listing prefix).
    pub key: String,
}

/// Why a string is not a usable `s3://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UrlError {
    /// The URL as given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid URL {:?}: {}", self.input, self.reason)
    }
}

impl std::error::Error for UrlError {}

impl S3Url {
    /// Parses `s3://bucket`, `s3://bucket/` or `s3://bucket/key...`.
    ///
    /// # Errors
    /// Not `s3://`, an empty bucket, a bucket with characters S3 never
    /// allows, or control characters in the key.
    pub(crate) fn parse(input: &str) -> Result<S3Url, UrlError> {
        let err = |reason| UrlError {
            input: input.to_owned(),
            reason,
        };
        let rest = input
            .strip_prefix("s3://")
            .ok_or_else(|| err("must start with s3:// (s3://bucket/key)"))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(err("the bucket is empty (s3://bucket/key)"));
        }
        if !bucket
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
        {
            return Err(err(
                "a bucket name has only letters, digits, '.', '-' and '_'",
            ));
        }
        if key.chars().any(char::is_control) {
            return Err(err("the key contains control characters"));
        }
        Ok(S3Url {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        })
    }

    /// Parses a URL that must name an object (a non-empty key).
    ///
    /// # Errors
    /// As [`S3Url::parse`], and a missing key.
    pub(crate) fn parse_object(input: &str) -> Result<S3Url, UrlError> {
        let u = S3Url::parse(input)?;
        if u.key.is_empty() {
            return Err(UrlError {
                input: input.to_owned(),
                reason: "names a bucket, not an object (s3://bucket/key)",
            });
        }
        Ok(u)
    }

    /// The last `/`-separated part of the key (empty when the key ends in `/`).
    #[must_use]
    pub(crate) fn basename(&self) -> &str {
        self.key.rsplit('/').next().unwrap_or("")
    }
}

impl fmt::Display for S3Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

/// The absolute bytes `start..start + len` that `range` names in an object
/// of `size` bytes (`None` = the whole object), or `None` when S3 would
/// answer 416 (a start at or past the end, an empty suffix, any range of an
/// empty object).
#[must_use]
pub(crate) fn resolve_range(range: Option<ByteRange>, size: u64) -> Option<(u64, u64)> {
    match range {
        None => Some((0, size)),
        Some(ByteRange::Bounded { first, last }) => {
            (first <= last && first < size).then(|| (first, last.min(size - 1) - first + 1))
        }
        Some(ByteRange::From(first)) => (first < size).then(|| (first, size - first)),
        Some(ByteRange::Suffix(n)) => (n > 0 && size > 0).then(|| {
            let n = n.min(size);
            (size - n, n)
        }),
    }
}

/// Splits `start..start + len` into chunks of at most `chunk` bytes:
/// `(first byte, length)` each.
#[must_use]
pub(crate) fn chunks(start: u64, len: u64, chunk: u64) -> Vec<(u64, u64)> {
    let chunk = chunk.max(1);
    let mut out = Vec::new();
    let mut off = 0;
    while off < len {
        let n = chunk.min(len - off);
        out.push((start + off, n));
        off += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let u = S3Url::parse("s3://data/a/b.txt").unwrap();
        assert_eq!(u.bucket, "data");
        assert_eq!(u.key, "a/b.txt");
        assert_eq!(u.basename(), "b.txt");
        assert_eq!(u.to_string(), "s3://data/a/b.txt");
        assert_eq!(S3Url::parse("s3://data").unwrap().key, "");
        assert_eq!(S3Url::parse("s3://data/").unwrap().key, "");
        assert_eq!(S3Url::parse("s3://data/dir/").unwrap().basename(), "");
        assert_eq!(S3Url::parse("s3://data//x").unwrap().key, "/x");
        assert_eq!(
            S3Url::parse_object("s3://b/k with spaces").unwrap().key,
            "k with spaces"
        );
    }

    #[test]
    fn rejects_bad_urls() {
        let cases = [
            ("data/key", "must start with s3://"),
            ("http://data/key", "must start with s3://"),
            ("S3://data/key", "must start with s3://"),
            ("s3://", "the bucket is empty"),
            ("s3:///key", "the bucket is empty"),
            ("s3://da ta/key", "a bucket name has only"),
            ("s3://data/k\ney", "control characters"),
        ];
        for (input, want) in cases {
            let e = S3Url::parse(input).unwrap_err().to_string();
            assert!(e.contains(want), "{input:?}: {e}");
            assert!(e.contains(&format!("{input:?}")), "{e}");
        }
        for input in ["s3://data", "s3://data/"] {
            let e = S3Url::parse_object(input).unwrap_err().to_string();
            assert!(e.contains("names a bucket, not an object"), "{e}");
        }
    }

    #[test]
    fn ranges_resolve_like_s3() {
        let b = |first, last| Some(ByteRange::Bounded { first, last });
        assert_eq!(resolve_range(None, 0), Some((0, 0)));
        assert_eq!(resolve_range(None, 10), Some((0, 10)));
        assert_eq!(resolve_range(b(0, 0), 10), Some((0, 1)));
        assert_eq!(resolve_range(b(2, 5), 10), Some((2, 4)));
        assert_eq!(resolve_range(b(2, 500), 10), Some((2, 8)));
        assert_eq!(resolve_range(b(10, 12), 10), None);
        assert_eq!(resolve_range(b(0, 0), 0), None);
        assert_eq!(resolve_range(Some(ByteRange::From(3)), 10), Some((3, 7)));
        assert_eq!(resolve_range(Some(ByteRange::From(10)), 10), None);
        assert_eq!(resolve_range(Some(ByteRange::Suffix(3)), 10), Some((7, 3)));
        assert_eq!(
            resolve_range(Some(ByteRange::Suffix(30)), 10),
            Some((0, 10))
        );
        assert_eq!(resolve_range(Some(ByteRange::Suffix(0)), 10), None);
        assert_eq!(resolve_range(Some(ByteRange::Suffix(5)), 0), None);
    }

    #[test]
    fn chunking() {
        assert_eq!(chunks(0, 0, 4), vec![]);
        assert_eq!(chunks(5, 3, 4), vec![(5, 3)]);
        assert_eq!(chunks(5, 8, 4), vec![(5, 4), (9, 4)]);
        assert_eq!(chunks(0, 9, 4), vec![(0, 4), (4, 4), (8, 1)]);
        let big = chunks(0, (1 << 30) + 1, 64 << 20);
        assert_eq!(big.len(), 17);
        assert_eq!(big.iter().map(|c| c.1).sum::<u64>(), (1 << 30) + 1);
    }
}
