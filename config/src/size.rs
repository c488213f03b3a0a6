//! Sizes in configuration files and on command lines.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// A kibibyte, 1024 bytes.
pub const KIB: u64 = 1 << 10;
/// A mebibyte, 1024 KiB.
pub const MIB: u64 = 1 << 20;
/// A gibibyte, 1024 MiB.
pub const GIB: u64 = 1 << 30;
/// A tebibyte, 1024 GiB.
pub const TIB: u64 = 1 << 40;

/// The units [`parse_size`] accepts after the number, and their sizes.
const UNITS: [(&str, u64); 5] = [
    ("B", 1),
    ("KiB", KIB),
    ("MiB", MIB),
    ("GiB", GIB),
    ("TiB", TIB),
];

const USAGE: &str =
    "write a whole number of bytes, optionally followed by B, KiB, MiB, GiB or TiB (e.g. 4MiB)";

/// Why [`parse_size`] refused a text. Every message starts with the text
/// (quoted) and says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// A minus sign.
    #[error("{input:?} is not a size: sizes cannot be negative; {USAGE}")]
    Negative {
        /// The text.
        input: String,
    },
    /// No digits first.
    #[error("{input:?} is not a size: {USAGE}")]
    NotANumber {
        /// The text.
        input: String,
    },
    /// `1.5GiB`.
    #[error(
        "{input:?}: fractions are not supported; use a smaller unit (e.g. 1536MiB instead of 1.5GiB)"
    )]
    Fraction {
        /// The text.
        input: String,
    },
    /// A unit in the wrong case (`4mib`).
    #[error("{input:?}: unknown unit {unit:?}; units are case-sensitive: did you mean {suggest}?")]
    WrongCase {
        /// The text.
        input: String,
        /// The unit written.
        unit: String,
        /// The unit meant.
        suggest: &'static str,
    },
    /// A decimal or one-letter unit (`4MB`, `4k`).
    #[error(
        "{input:?}: unit {unit:?} is ambiguous; use the binary units KiB, MiB, GiB or TiB (powers of 1024)"
    )]
    Ambiguous {
        /// The text.
        input: String,
        /// The unit written.
        unit: String,
    },
    /// Anything else after the number.
    #[error("{input:?}: unknown unit {unit:?}; use B, KiB, MiB, GiB or TiB (case-sensitive)")]
    UnknownUnit {
        /// The text.
        input: String,
        /// The unit written.
        unit: String,
    },
    /// More than 64 bits.
    #[error("{input:?} is too large a size (it must fit in 64 bits); use at most 16777215TiB")]
    TooLarge {
        /// The text.
        input: String,
    },
}

/// Parses a size: a whole number of bytes (`4194304`, `4096B`) or a whole
/// number with a binary unit `KiB`, `MiB`, `GiB` or `TiB` (powers of 1024,
/// case-sensitive), with or without a space: `4MiB`, `512KiB`, `64 MiB`.
/// Surrounding whitespace is ignored.
///
/// Decimal or bare units (`KB`, `MB`, `GB`, `TB`, `k`, `M`, ...) are rejected
/// as ambiguous rather than guessed, as are fractions (`1.5GiB`), negative
/// numbers, wrongly-cased units (`4mib`) and sizes that overflow a `u64`.
///
/// # Errors
/// A [`SizeError`] quoting the input and saying what is wrong and what to
/// write instead.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let input = || s.to_owned();
    let t = s.trim();
    if t.starts_with('-') {
        return Err(SizeError::Negative { input: input() });
    }
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    let (num, unit) = t.split_at(digits);
    if num.is_empty() {
        return Err(SizeError::NotANumber { input: input() });
    }
    let unit = unit.trim_start();
    if unit.starts_with(['.', ',']) {
        return Err(SizeError::Fraction { input: input() });
    }
    let mult = if unit.is_empty() {
        1
    } else if let Some(&(_, m)) = UNITS.iter().find(|(name, _)| *name == unit) {
        m
    } else {
        let lower = unit.to_ascii_lowercase();
        let unit = unit.to_owned();
        return Err(
            if let Some(&(suggest, _)) = UNITS
                .iter()
                .find(|(name, _)| name.to_ascii_lowercase() == lower)
            {
                SizeError::WrongCase {
                    input: input(),
                    unit,
                    suggest,
                }
            } else if matches!(
                lower.as_str(),
                "k" | "kb" | "m" | "mb" | "g" | "gb" | "t" | "tb"
            ) {
                SizeError::Ambiguous {
                    input: input(),
                    unit,
                }
            } else {
                SizeError::UnknownUnit {
                    input: input(),
                    unit,
                }
            },
        );
    };
    let too_large = || SizeError::TooLarge { input: input() };
    let n: u64 = num.parse().map_err(|_| too_large())?;
    n.checked_mul(mult).ok_or_else(too_large)
}

/// A size in bytes, written as a number of bytes or as `4MiB`, `512KiB`,
/// `1GiB` (see [`parse_size`] for the exact forms).
///
/// Deserialises from a non-negative integer or a string accepted by
/// [`parse_size`]; parses from a string the same way ([`FromStr`], e.g. for
/// command-line flags). [`fmt::Display`] writes the largest binary unit that
/// divides the size exactly (`4MiB`, `1536KiB`), or bytes with a `B` (`4097B`,
/// `0B`); every form it writes parses back to the same size, and
/// serialises as that text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The size in bytes.
    #[must_use]
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Self, SizeError> {
        parse_size(s).map(ByteSize)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for &(name, unit) in UNITS[1..].iter().rev() {
            if n != 0 && n.is_multiple_of(unit) {
                return write!(f, "{}{name}", n / unit);
            }
        }
        write!(f, "{n}B")
    }
}

impl serde::Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a size: a number of bytes, or a string such as \"4MiB\" \
                     (units B, KiB, MiB, GiB, TiB)",
                )
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("a size cannot be negative (got {v})")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                parse_size(v).map(ByteSize).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::IntoDeserializer;
    use serde::de::value::Error as DeError;

    fn size_from<'a>(d: impl IntoDeserializer<'a, DeError>) -> Result<ByteSize, String> {
        ByteSize::deserialize(d.into_deserializer()).map_err(|e| e.to_string())
    }

    #[test]
    fn size_parsing() {
        let ok = [
            ("4096", 4096),
            ("0", 0),
            ("4096B", 4096),
            (" 7B ", 7),
            ("512KiB", 512 << 10),
            ("512 KiB", 512 << 10),
            ("4MiB", 4 << 20),
            ("64 MiB", 64 << 20),
            (" 1GiB ", 1 << 30),
            ("2TiB", 2 << 40),
            ("16777215TiB", 16_777_215 << 40),
        ];
        for (s, n) in ok {
            assert_eq!(parse_size(s), Ok(n), "{s}");
        }
        let bad = [
            ("4MB", "ambiguous"),
            ("4 GB", "ambiguous"),
            ("4KB", "ambiguous"),
            ("4k", "ambiguous"),
            ("4T", "ambiguous"),
            ("4mib", "did you mean MiB?"),
            ("4Mib", "case-sensitive"),
            ("4 b", "did you mean B?"),
            ("4 PiB", "unknown unit"),
            ("4 bytes", "unknown unit"),
            ("1.5GiB", "fractions"),
            ("1,5GiB", "fractions"),
            ("MiB", "not a size"),
            ("", "not a size"),
            ("   ", "not a size"),
            ("-4", "negative"),
            ("- 4MiB", "negative"),
            ("+4", "not a size"),
            ("99999999999999999999", "too large"),
            ("16777216TiB", "too large"),
            ("99999999999999GiB", "too large"),
        ];
        for (s, want) in bad {
            let e = parse_size(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: want {want:?} in {e}");
            assert!(e.starts_with(&format!("{s:?}")), "{s}: {e}");
        }
        // Every rejection says what to write instead.
        for s in ["4MB", "-4", "", "4 PiB", "1.5GiB", "16777216TiB"] {
            let e = parse_size(s).unwrap_err().to_string();
            assert!(
                e.contains("KiB") || e.contains("MiB") || e.contains("TiB"),
                "{s}: {e}"
            );
        }
    }

    #[test]
    fn byte_size_serde_fromstr_display() {
        assert_eq!(size_from(4096u64), Ok(ByteSize(4096)));
        assert_eq!(size_from(4096i64), Ok(ByteSize(4096)));
        assert_eq!(size_from("4MiB"), Ok(ByteSize(4 << 20)));
        assert_eq!(size_from(String::from("1GiB")), Ok(ByteSize(1 << 30)));
        assert_eq!(size_from("2TiB"), Ok(ByteSize(2 << 40)));
        let e = size_from("4MB").unwrap_err();
        assert!(e.contains("KiB") && e.contains("ambiguous"), "{e}");
        let e = size_from(-1i64).unwrap_err();
        assert!(e.contains("negative"), "{e}");
        let e = size_from(true).unwrap_err();
        assert!(e.contains("a size"), "{e}");
        assert_eq!("512KiB".parse::<ByteSize>(), Ok(ByteSize(512 << 10)));
        assert_eq!(ByteSize::default(), ByteSize(0));
        for (n, s) in [
            (0, "0B"),
            (100, "100B"),
            (4097, "4097B"),
            (4 << 20, "4MiB"),
            (3 << 30, "3GiB"),
            (1536 << 10, "1536KiB"),
            (5 << 40, "5TiB"),
            ((1 << 40) + (1 << 30), "1025GiB"),
            (u64::MAX, "18446744073709551615B"),
        ] {
            assert_eq!(ByteSize(n).to_string(), s);
            assert_eq!(s.parse::<ByteSize>(), Ok(ByteSize(n)));
        }
        assert_eq!(ByteSize(7).bytes(), 7);
    }
}
