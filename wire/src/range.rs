//! Byte ranges of objects: the one set of range types that the client, the
//! host-shim, the dpu-agent and the storage-target share (`Range:
//! bytes=...`, `Content-Range: bytes a-b/len`).

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

/// A range of an object's bytes.
///
/// Parses from (and displays as) HTTP range syntax without the `bytes=`
/// prefix: `"FIRST-LAST"`, `"FIRST-"` or `"-SUFFIX"`;
/// [`ByteRange::header_value`] adds the prefix.
///
/// ```
/// use s3dma_wire::range::ByteRange;
/// assert_eq!("0-99".parse::<ByteRange>().unwrap(), ByteRange::Bounded { first: 0, last: 99 });
/// assert_eq!("100-".parse::<ByteRange>().unwrap(), ByteRange::From(100));
/// assert_eq!("-10".parse::<ByteRange>().unwrap(), ByteRange::Suffix(10));
/// assert!("9-1".parse::<ByteRange>().is_err());
/// assert_eq!(ByteRange::Suffix(5).resolve(10), Ok(5..10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ByteRange {
    /// Bytes `first..=last` (a `last` past the end is clamped to the object's
    /// last byte).
    Bounded {
        /// Offset of the first byte.
        first: u64,
        /// Offset of the last byte (inclusive).
        last: u64,
    },
    /// From this offset to the end of the object.
    From(u64),
    /// The last this-many bytes of the object (the whole object if it is
    /// shorter).
    Suffix(u64),
}

/// The range selects no byte of an object of the given length (HTTP 416).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the requested range is not satisfiable")]
pub struct Unsatisfiable;

impl ByteRange {
    /// The number of bytes the range names, when known without the object's
    /// size (before clamping).
    pub fn max_len(&self) -> Option<u64> {
        match *self {
            ByteRange::Bounded { first, last } => {
                last.checked_sub(first).map(|d| d.saturating_add(1))
            }
            ByteRange::From(_) => None,
            ByteRange::Suffix(n) => Some(n),
        }
    }

    /// Resolves the range against an object of `len` bytes into a half-open
    /// byte range. A `last` beyond the end is clamped; a start at or beyond
    /// the end, or an empty suffix, is unsatisfiable.
    ///
    /// # Errors
    /// [`Unsatisfiable`] when no byte of the object is selected.
    pub fn resolve(self, len: u64) -> Result<Range<u64>, Unsatisfiable> {
        match self {
            ByteRange::Bounded { first, .. } | ByteRange::From(first) if first >= len => {
                Err(Unsatisfiable)
            }
            ByteRange::Bounded { first, last } if last < first => Err(Unsatisfiable),
            ByteRange::Bounded { first, last } => Ok(first..last.min(len - 1) + 1),
            ByteRange::From(first) => Ok(first..len),
            ByteRange::Suffix(n) => {
                if n == 0 || len == 0 {
                    return Err(Unsatisfiable);
                }
                Ok(len - n.min(len)..len)
            }
        }
    }

    /// The value of an HTTP `Range` header, e.g. `bytes=0-99` or `bytes=-5`.
    pub fn header_value(&self) -> String {
        format!("bytes={self}")
    }
}

impl fmt::Display for ByteRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ByteRange::Bounded { first, last } => write!(f, "{first}-{last}"),
            ByteRange::From(first) => write!(f, "{first}-"),
            ByteRange::Suffix(n) => write!(f, "-{n}"),
        }
    }
}

/// A string that is not a byte range (see [`ByteRange`]'s syntax).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid byte range {input:?}: {reason} (expected FIRST-LAST, FIRST- or -SUFFIX, e.g. 0-1023)"
)]
pub struct ParseRangeError {
    input: String,
    reason: &'static str,
}

impl ParseRangeError {
    /// An error for `input` (e.g. a range message without a kind).
    pub fn new(input: impl Into<String>, reason: &'static str) -> ParseRangeError {
        ParseRangeError {
            input: input.into(),
            reason,
        }
    }
}

impl FromStr for ByteRange {
    type Err = ParseRangeError;

    fn from_str(s: &str) -> Result<ByteRange, ParseRangeError> {
        let err = |reason| ParseRangeError::new(s, reason);
        let t = s.trim();
        // Tolerate the HTTP prefix, since people paste it.
        let t = t.strip_prefix("bytes=").unwrap_or(t);
        let Some((a, b)) = t.split_once('-') else {
            return Err(err("no '-'"));
        };
        let num = |x: &str| -> Result<u64, ParseRangeError> {
            if x.is_empty() || !x.bytes().all(|c| c.is_ascii_digit()) {
                return Err(err("offsets must be decimal numbers"));
            }
            x.parse().map_err(|_| err("offset too large"))
        };
        match (a.is_empty(), b.is_empty()) {
            (true, true) => Err(err("no offsets")),
            (true, false) => match num(b)? {
                0 => Err(err("a suffix range needs at least one byte")),
                n => Ok(ByteRange::Suffix(n)),
            },
            (false, true) => Ok(ByteRange::From(num(a)?)),
            (false, false) => {
                let (first, last) = (num(a)?, num(b)?);
                if last < first {
                    return Err(err("the last byte comes before the first"));
                }
                Ok(ByteRange::Bounded { first, last })
            }
        }
    }
}

/// The `Content-Range` value for a resolved range of an object of `len`
/// bytes: `bytes a-b/len`.
pub fn content_range(r: &Range<u64>, len: u64) -> String {
    format!("bytes {}-{}/{}", r.start, r.end - 1, len)
}

/// Parses `Content-Range: bytes a-b/total` into `(first, len, total)`;
/// `None` unless `a <= b < total`.
pub fn parse_content_range(v: &str) -> Option<(u64, u64, u64)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    let (a, b, total) = (
        a.parse::<u64>().ok()?,
        b.parse::<u64>().ok()?,
        total.parse::<u64>().ok()?,
    );
    (a <= b && b < total).then(|| (a, b - a + 1, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_displays_http_syntax() {
        for (s, r) in [
            ("0-0", ByteRange::Bounded { first: 0, last: 0 }),
            (
                "5-1023",
                ByteRange::Bounded {
                    first: 5,
                    last: 1023,
                },
            ),
            ("100-", ByteRange::From(100)),
            ("-7", ByteRange::Suffix(7)),
        ] {
            assert_eq!(s.parse::<ByteRange>(), Ok(r));
            assert_eq!(r.to_string(), s);
            assert_eq!(r.header_value(), format!("bytes={s}"));
        }
        assert_eq!(
            " bytes=1-2 ".parse(),
            Ok(ByteRange::Bounded { first: 1, last: 2 })
        );
        assert_eq!(
            "18446744073709551615-".parse(),
            Ok(ByteRange::From(u64::MAX))
        );
    }

    #[test]
    fn refuses_garbage_with_clear_errors() {
        for (s, why) in [
            ("", "no '-'"),
            ("12", "no '-'"),
            ("-", "no offsets"),
            ("-0", "at least one byte"),
            ("9-1", "before the first"),
            ("a-b", "decimal"),
            ("+1-2", "decimal"),
            ("1-2-3", "decimal"),
            ("1 - 2", "decimal"),
            ("18446744073709551616-", "too large"),
        ] {
            let e = s.parse::<ByteRange>().unwrap_err().to_string();
            assert!(e.contains(why), "{s:?}: {e}");
            assert!(e.contains("FIRST-LAST"), "{e}");
        }
        assert_eq!(ByteRange::Bounded { first: 3, last: 9 }.max_len(), Some(7));
        assert_eq!(ByteRange::From(3).max_len(), None);
    }

    fn b(first: u64, last: u64) -> ByteRange {
        ByteRange::Bounded { first, last }
    }

    #[test]
    fn resolves_bounded_open_and_suffix_ranges() {
        assert_eq!(b(0, 0).resolve(10), Ok(0..1));
        assert_eq!(b(2, 5).resolve(10), Ok(2..6));
        assert_eq!(b(2, 100).resolve(10), Ok(2..10));
        assert_eq!(b(9, 9).resolve(10), Ok(9..10));
        assert_eq!(b(10, 12).resolve(10), Err(Unsatisfiable));
        assert_eq!(b(5, 4).resolve(10), Err(Unsatisfiable));
        assert_eq!(ByteRange::From(3).resolve(10), Ok(3..10));
        assert_eq!(ByteRange::From(10).resolve(10), Err(Unsatisfiable));
        assert_eq!(ByteRange::From(0).resolve(0), Err(Unsatisfiable));
        assert_eq!(ByteRange::Suffix(3).resolve(10), Ok(7..10));
        assert_eq!(ByteRange::Suffix(30).resolve(10), Ok(0..10));
        assert_eq!(ByteRange::Suffix(0).resolve(10), Err(Unsatisfiable));
        assert_eq!(ByteRange::Suffix(5).resolve(0), Err(Unsatisfiable));
        assert_eq!(
            b(0, u64::MAX).resolve(u64::MAX),
            Ok(0..u64::MAX),
            "no overflow at the top"
        );
    }

    #[test]
    fn content_range_both_ways() {
        assert_eq!(content_range(&(2..6), 10), "bytes 2-5/10");
        assert_eq!(content_range(&(0..1), 1), "bytes 0-0/1");
        assert_eq!(parse_content_range("bytes 0-9/10"), Some((0, 10, 10)));
        assert_eq!(parse_content_range("bytes 5-5/6"), Some((5, 1, 6)));
        assert_eq!(parse_content_range("bytes 5-4/6"), None);
        assert_eq!(parse_content_range("bytes 0-10/10"), None);
        assert_eq!(parse_content_range("bytes */10"), None);
        assert_eq!(parse_content_range("items 0-1/2"), None);
        assert_eq!(
            parse_content_range("bytes 0-18446744073709551615/18446744073709551615"),
            None
        );
    }
}
