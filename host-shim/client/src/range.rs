//! Byte ranges of objects, as in HTTP `Range: bytes=...`.

use std::fmt;
use std::str::FromStr;

use s3dma_proto::agent::v1 as agent;

/// A range of an object's bytes.
///
/// Parses from (and displays as) HTTP range syntax without the `bytes=`
/// prefix: `"FIRST-LAST"`, `"FIRST-"` or `"-SUFFIX"`.
///
/// ```
/// use s3dma_client::ByteRange;
/// assert_eq!("0-99".parse::<ByteRange>().unwrap(), ByteRange::Bounded { first: 0, last: 99 });
/// assert_eq!("100-".parse::<ByteRange>().unwrap(), ByteRange::From(100));
/// assert_eq!("-10".parse::<ByteRange>().unwrap(), ByteRange::Suffix(10));
/// assert!("9-1".parse::<ByteRange>().is_err());
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
    /// The last this-many bytes of the object.
    Suffix(u64),
}

impl ByteRange {
    /// The number of bytes the range names, when known without the object's
    /// size (only for [`ByteRange::Bounded`], before clamping).
    pub fn max_len(&self) -> Option<u64> {
        match *self {
            ByteRange::Bounded { first, last } => {
                last.checked_sub(first).map(|d| d.saturating_add(1))
            }
            ByteRange::From(_) => None,
            ByteRange::Suffix(n) => Some(n),
        }
    }
}

impl From<ByteRange> for agent::ByteRange {
    fn from(r: ByteRange) -> agent::ByteRange {
        use agent::byte_range::{Bounded, Kind};
        agent::ByteRange {
            kind: Some(match r {
                ByteRange::Bounded { first, last } => Kind::Bounded(Bounded { first, last }),
                ByteRange::From(first) => Kind::From(first),
                ByteRange::Suffix(n) => Kind::Suffix(n),
            }),
        }
    }
}

impl TryFrom<agent::ByteRange> for ByteRange {
    type Error = ParseRangeError;

    fn try_from(r: agent::ByteRange) -> Result<ByteRange, ParseRangeError> {
        use agent::byte_range::Kind;
        match r.kind {
            Some(Kind::Bounded(b)) => Ok(ByteRange::Bounded {
                first: b.first,
                last: b.last,
            }),
            Some(Kind::From(first)) => Ok(ByteRange::From(first)),
            Some(Kind::Suffix(n)) => Ok(ByteRange::Suffix(n)),
            None => Err(ParseRangeError {
                input: String::new(),
                reason: "the range has no kind",
            }),
        }
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

impl From<ParseRangeError> for crate::Error {
    fn from(e: ParseRangeError) -> crate::Error {
        crate::Error::new(
            crate::ErrorKind::InvalidArgument,
            "InvalidRange",
            e.to_string(),
        )
    }
}

impl FromStr for ByteRange {
    type Err = ParseRangeError;

    fn from_str(s: &str) -> Result<ByteRange, ParseRangeError> {
        let err = |reason| ParseRangeError {
            input: s.to_owned(),
            reason,
        };
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
    }

    #[test]
    fn maps_to_the_proto_oneof_and_back() {
        for r in [
            ByteRange::Bounded { first: 3, last: 9 },
            ByteRange::From(4),
            ByteRange::Suffix(5),
        ] {
            let p = agent::ByteRange::from(r);
            assert!(p.kind.is_some());
            assert_eq!(ByteRange::try_from(p), Ok(r));
        }
        assert!(ByteRange::try_from(agent::ByteRange { kind: None }).is_err());
        assert_eq!(ByteRange::Bounded { first: 3, last: 9 }.max_len(), Some(7));
        assert_eq!(ByteRange::From(3).max_len(), None);
    }
}
