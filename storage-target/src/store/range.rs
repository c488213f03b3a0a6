//! Byte-range arithmetic for GetObject (`Range: bytes=a-b | a- | -n`).

use std::ops::Range;

/// A parsed single byte-range request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeSpec {
    /// `bytes=first-last` (`last` inclusive) or `bytes=first-` (`last` = None).
    FromTo {
        /// First byte offset.
        first: u64,
        /// Last byte offset, inclusive; `None` means to the end.
        last: Option<u64>,
    },
    /// `bytes=-n`: the last `n` bytes.
    Suffix(u64),
}

/// The range cannot be satisfied for an object of the given length (HTTP 416).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the requested range is not satisfiable")]
pub struct Unsatisfiable;

impl RangeSpec {
    /// Resolves the range against an object of `len` bytes into a half-open
    /// byte range. A `last` beyond the end is clamped; a start at or beyond the
    /// end, or an empty suffix, is unsatisfiable.
    ///
    /// # Errors
    /// [`Unsatisfiable`] when no byte of the object is selected.
    pub fn resolve(self, len: u64) -> Result<Range<u64>, Unsatisfiable> {
        match self {
            RangeSpec::FromTo { first, last } => {
                if first >= len {
                    return Err(Unsatisfiable);
                }
                let end = match last {
                    Some(last) if last < first => return Err(Unsatisfiable),
                    Some(last) => last.min(len - 1) + 1,
                    None => len,
                };
                Ok(first..end)
            }
            RangeSpec::Suffix(n) => {
                if n == 0 || len == 0 {
                    return Err(Unsatisfiable);
                }
                Ok(len - n.min(len)..len)
            }
        }
    }
}

/// The `Content-Range` value for a resolved range: `bytes a-b/len`.
#[must_use]
pub fn content_range(r: &Range<u64>, len: u64) -> String {
    format!("bytes {}-{}/{}", r.start, r.end - 1, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ft(first: u64, last: Option<u64>) -> RangeSpec {
        RangeSpec::FromTo { first, last }
    }

    #[test]
    fn from_to() {
        assert_eq!(ft(0, Some(0)).resolve(10), Ok(0..1));
        assert_eq!(ft(2, Some(5)).resolve(10), Ok(2..6));
        assert_eq!(ft(2, Some(100)).resolve(10), Ok(2..10));
        assert_eq!(ft(9, Some(9)).resolve(10), Ok(9..10));
        assert_eq!(ft(10, Some(12)).resolve(10), Err(Unsatisfiable));
        assert_eq!(ft(5, Some(4)).resolve(10), Err(Unsatisfiable));
    }

    #[test]
    fn open_ended() {
        assert_eq!(ft(3, None).resolve(10), Ok(3..10));
        assert_eq!(ft(10, None).resolve(10), Err(Unsatisfiable));
        assert_eq!(ft(0, None).resolve(0), Err(Unsatisfiable));
    }

    #[test]
    fn suffix() {
        assert_eq!(RangeSpec::Suffix(3).resolve(10), Ok(7..10));
        assert_eq!(RangeSpec::Suffix(30).resolve(10), Ok(0..10));
        assert_eq!(RangeSpec::Suffix(0).resolve(10), Err(Unsatisfiable));
        assert_eq!(RangeSpec::Suffix(5).resolve(0), Err(Unsatisfiable));
    }

    #[test]
    fn content_range_format() {
        assert_eq!(content_range(&(2..6), 10), "bytes 2-5/10");
        assert_eq!(content_range(&(0..1), 1), "bytes 0-0/1");
    }
}
