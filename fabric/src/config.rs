//! Configuration building blocks shared by the programs that use the fabric
//! (storage-target, dpu-agent), so that their configuration files read
//! sizes, fabric keys and backend names the same way.
//!
//! * [`ByteSize`]: a size written as a number of bytes or as `4MiB`,
//!   `512KiB`, `1GiB` (serde and [`std::str::FromStr`]); [`parse_size`] is
//!   the parser.
//! * [`parse_fabric_key`] / [`read_fabric_key_file`]: the pre-shared fabric
//!   key file (hexadecimal). Error messages never contain the key.
//! * [`Backend`] implements `serde::Deserialize` from the lower-case names
//!   `tcp` and `verbs` (the same names as its `FromStr`), so a configuration
//!   struct holds a [`Backend`] directly; there is no separate name type.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::de::{self, Deserialize, Deserializer, Visitor};

use crate::{Backend, FabricKey};

/// Parses a size such as `4194304`, `4MiB`, `512KiB`, `1GiB` (binary units;
/// `B` optional; a space may separate number and unit).
///
/// # Errors
/// A message describing the accepted forms (also on overflow).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (num, unit) = s.split_at(digits);
    let bad = || format!("{s:?} is not a size (use bytes, or a number with KiB, MiB or GiB)");
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).ok_or_else(bad)
}

/// A size in bytes, written as a number of bytes or as `4MiB`, `512KiB`, `1GiB`.
///
/// Deserialises from a non-negative integer or a string accepted by
/// [`parse_size`]; parses from a string the same way ([`FromStr`], e.g. for
/// command-line flags). [`fmt::Display`] writes the largest exact binary
/// unit (`4MiB`, `4097`), which parses back to the same size.
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
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_size(s).map(ByteSize)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
            if n != 0 && n.trailing_zeros() >= shift {
                return write!(f, "{}{unit}", n >> shift);
            }
        }
        write!(f, "{n}")
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: a number of bytes, or a string such as 4MiB, 512KiB, 1GiB")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                parse_size(v).map(ByteSize).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// Parses a fabric key file's text: hexadecimal, at least
/// [`FabricKey::MIN_LEN`] bytes (32 hex digits), surrounding whitespace
/// ignored. `openssl rand -hex 32` makes a good one.
///
/// # Errors
/// A message saying what is wrong (never the key itself).
pub fn parse_fabric_key(text: &str) -> Result<FabricKey, String> {
    let t = text.trim();
    let bytes = hex::decode(t).map_err(|e| format!("not hexadecimal ({e})"))?;
    if bytes.len() < FabricKey::MIN_LEN {
        return Err(format!(
            "the key is {} bytes; at least {} bytes ({} hex digits) are required",
            bytes.len(),
            FabricKey::MIN_LEN,
            FabricKey::MIN_LEN * 2
        ));
    }
    FabricKey::new(bytes).map_err(|e| e.to_string())
}

/// Reads and parses a fabric key file ([`parse_fabric_key`]).
///
/// # Errors
/// A message naming the file: `cannot read <path>: <io error>` or
/// `<path>: <what is wrong>` (never the key itself).
pub fn read_fabric_key_file(path: impl AsRef<Path>) -> Result<FabricKey, String> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse_fabric_key(&text).map_err(|m| format!("{}: {m}", path.display()))
}

const BACKENDS: &[&str] = &["tcp", "verbs"];

/// From the lower-case names `tcp` and `verbs`; anything else is serde's
/// usual "unknown variant" error listing both.
impl<'de> Deserialize<'de> for Backend {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Backend;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a fabric backend: `tcp` or `verbs`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Backend, E> {
                match v {
                    "tcp" => Ok(Backend::Tcp),
                    "verbs" => Ok(Backend::Verbs),
                    _ => Err(E::unknown_variant(v, BACKENDS)),
                }
            }
        }
        d.deserialize_str(V)
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
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("512 KiB"), Ok(512 << 10));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size(" 7B "), Ok(7));
        assert!(parse_size("4MB").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999GiB").is_err());
    }

    #[test]
    fn byte_size_serde_fromstr_display() {
        assert_eq!(size_from(4096u64), Ok(ByteSize(4096)));
        assert_eq!(size_from(4096i64), Ok(ByteSize(4096)));
        assert_eq!(size_from("4MiB"), Ok(ByteSize(4 << 20)));
        assert_eq!(size_from(String::from("1GiB")), Ok(ByteSize(1 << 30)));
        let e = size_from("4MB").unwrap_err();
        assert!(e.contains("KiB"), "{e}");
        assert!(size_from(-1i64).is_err());
        assert!(size_from(true).is_err());
        assert_eq!("512KiB".parse::<ByteSize>(), Ok(ByteSize(512 << 10)));
        for (n, s) in [
            (0, "0"),
            (4097, "4097"),
            (4 << 20, "4MiB"),
            (3 << 30, "3GiB"),
            (1536 << 10, "1536KiB"),
        ] {
            assert_eq!(ByteSize(n).to_string(), s);
            assert_eq!(s.parse::<ByteSize>(), Ok(ByteSize(n)));
        }
        assert_eq!(ByteSize(7).bytes(), 7);
    }

    #[test]
    fn fabric_keys() {
        let hex = "ab".repeat(32);
        assert!(parse_fabric_key(&format!("  {hex}\n")).is_ok());
        let e = parse_fabric_key("abcd").unwrap_err();
        assert!(e.contains("at least 16 bytes"), "{e}");
        let e = parse_fabric_key(&"zz".repeat(32)).unwrap_err();
        assert!(e.contains("hexadecimal"), "{e}");
        assert!(parse_fabric_key("abc").is_err());
        // Messages never echo the key.
        let secret = "0123456789abcdef0123456789abcde";
        assert!(!parse_fabric_key(secret).unwrap_err().contains(secret));
        let short = "0123456789abcdef";
        assert!(!parse_fabric_key(short).unwrap_err().contains(short));
    }

    #[test]
    fn fabric_key_files_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fabric.key");
        let e = read_fabric_key_file(&p).unwrap_err();
        assert!(
            e.starts_with("cannot read ") && e.contains("fabric.key"),
            "{e}"
        );
        std::fs::write(&p, format!("{}\n", "ab".repeat(32))).unwrap();
        assert!(read_fabric_key_file(&p).is_ok());
        std::fs::write(&p, "abcd").unwrap();
        let e = read_fabric_key_file(&p).unwrap_err();
        let name = p.display().to_string();
        assert!(e.starts_with(&name), "{e}");
        assert!(e.contains("at least 16 bytes"), "{e}");
        assert!(!e[name.len()..].contains("abcd"), "{e}");
    }

    #[test]
    fn backend_names() {
        let b = |s: &str| {
            Backend::deserialize(s.into_deserializer()).map_err(|e: DeError| e.to_string())
        };
        assert_eq!(b("tcp"), Ok(Backend::Tcp));
        assert_eq!(b("verbs"), Ok(Backend::Verbs));
        let e = b("Verbs").unwrap_err();
        assert!(
            e.contains("unknown variant `Verbs`") && e.contains("`tcp`"),
            "{e}"
        );
    }
}
