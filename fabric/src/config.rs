//! Configuration building blocks shared by the programs that use the fabric
//! (storage-target, dpu-agent), so that their configuration files read
//! sizes, fabric keys and backend names the same way.
//!
//! * [`ByteSize`]: a size written as a number of bytes or as `4MiB`,
//!   `512KiB`, `1GiB`, `2TiB` (serde and [`std::str::FromStr`]);
//!   [`parse_size`] is the parser, strict about units (binary only,
//!   case-sensitive) and clear about what it rejects.
//! * [`parse_fabric_key`] / [`read_fabric_key_file`]: the pre-shared fabric
//!   key file (hexadecimal). Error messages never contain the key.
//! * [`ConfigError`]: `<file>: <field path>: <what is wrong>` errors of a
//!   configuration file.
//! * [`Backend`] implements `serde::Deserialize` from the lower-case names
//!   `tcp` and `verbs` (the same names as its `FromStr`), so a configuration
//!   struct holds a [`Backend`] directly; there is no separate name type.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::de::{self, Deserialize, Deserializer, Visitor};

use crate::{Backend, FabricKey};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// The units [`parse_size`] accepts after the number, and their sizes.
const UNITS: [(&str, u64); 5] = [
    ("B", 1),
    ("KiB", KIB),
    ("MiB", MIB),
    ("GiB", GIB),
    ("TiB", TIB),
];

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
/// A message quoting the input and saying what is wrong and what to write
/// instead.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let usage = "write a whole number of bytes, optionally followed by B, KiB, MiB, GiB or TiB \
                 (e.g. 4MiB)";
    if t.starts_with('-') {
        return Err(format!(
            "{s:?} is not a size: sizes cannot be negative; {usage}"
        ));
    }
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    let (num, unit) = t.split_at(digits);
    if num.is_empty() {
        return Err(format!("{s:?} is not a size: {usage}"));
    }
    let unit = unit.trim_start();
    if unit.starts_with(['.', ',']) {
        return Err(format!(
            "{s:?}: fractions are not supported; use a smaller unit \
             (e.g. 1536MiB instead of 1.5GiB)"
        ));
    }
    let mult = if unit.is_empty() {
        1
    } else if let Some(&(_, m)) = UNITS.iter().find(|(name, _)| *name == unit) {
        m
    } else {
        let lower = unit.to_ascii_lowercase();
        return Err(
            if let Some((name, _)) = UNITS
                .iter()
                .find(|(name, _)| name.to_ascii_lowercase() == lower)
            {
                format!(
                    "{s:?}: unknown unit {unit:?}; units are case-sensitive: did you mean {name}?"
                )
            } else if matches!(
                lower.as_str(),
                "k" | "kb" | "m" | "mb" | "g" | "gb" | "t" | "tb"
            ) {
                format!(
                    "{s:?}: unit {unit:?} is ambiguous; use the binary units KiB, MiB, GiB \
                     or TiB (powers of 1024)"
                )
            } else {
                format!(
                    "{s:?}: unknown unit {unit:?}; use B, KiB, MiB, GiB or TiB \
                     (case-sensitive)"
                )
            },
        );
    };
    let too_large = || format!("{s:?} is too large a size (it must fit in 64 bits)");
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
/// `0B`); every form it writes parses back to the same size.
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
        for &(name, unit) in UNITS[1..].iter().rev() {
            if n != 0 && n.is_multiple_of(unit) {
                return write!(f, "{}{name}", n / unit);
            }
        }
        write!(f, "{n}B")
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

/// Parses a fabric key file's text: hexadecimal (either case), at least
/// [`FabricKey::MIN_LEN`] bytes (32 hex digits), surrounding whitespace
/// ignored. `openssl rand -hex 32` makes a good one (64 hex digits).
///
/// # Errors
/// A message saying what is wrong: the text is empty, the position (not the
/// value) of the first non-hex character, an odd number of digits, or too
/// short a key. It never contains any part of the key.
pub fn parse_fabric_key(text: &str) -> Result<FabricKey, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("the key file is empty; generate a key with `openssl rand -hex 32`".to_owned());
    }
    if let Some(pos) = t.bytes().position(|b| !b.is_ascii_hexdigit()) {
        return Err(format!(
            "the key is not hexadecimal (a non-hex character at position {pos}); \
             generate one with `openssl rand -hex 32`"
        ));
    }
    if !t.len().is_multiple_of(2) {
        return Err(format!(
            "the key has an odd number of hex digits ({}); each byte takes two",
            t.len()
        ));
    }
    if t.len() < FabricKey::MIN_LEN * 2 {
        return Err(format!(
            "the key is {} bytes ({} hex digits); at least {} bytes ({} hex digits) are \
             required (32 bytes recommended: `openssl rand -hex 32`)",
            t.len() / 2,
            t.len(),
            FabricKey::MIN_LEN,
            FabricKey::MIN_LEN * 2
        ));
    }
    // Checked above: even length, hex digits only. Neither error may echo the
    // text.
    let bytes = hex::decode(t).map_err(|_| "the key is not valid hexadecimal".to_owned())?;
    FabricKey::new(bytes).map_err(|e| e.to_string())
}

/// Reads and parses a fabric key file ([`parse_fabric_key`]). The text read
/// is overwritten with zeros afterwards (best effort).
///
/// # Errors
/// A message naming the file: `cannot read <path>: <io error>` or
/// `<path>: <what is wrong>` (never the key itself).
pub fn read_fabric_key_file(path: impl AsRef<Path>) -> Result<FabricKey, String> {
    let path = path.as_ref();
    check_private_file(path)?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let key = parse_fabric_key(&text).map_err(|m| format!("{}: {m}", path.display()));
    wipe(text.into_bytes());
    key
}

/// Overwrites the whole allocation of `bytes` with zeros before freeing it.
fn wipe(mut bytes: Vec<u8>) {
    let cap = bytes.capacity();
    bytes.clear();
    bytes.resize(cap, 0);
    std::hint::black_box(&mut bytes);
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

/// A secret string read from a file: a tenant's secret access key, a shim's
/// bearer token.
///
/// `Debug` prints `<redacted>`; there is deliberately no `Display`,
/// `Serialize` or `PartialEq` (compare tokens in constant time on
/// [`Secret::expose`], e.g. with `subtle`). The memory is overwritten with
/// zeros when the value is dropped (best effort: copies made through
/// [`Secret::expose`] are not covered).
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    #[must_use]
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    /// The secret itself. Never log it or put it in an error or a reply.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        wipe(std::mem::take(&mut self.0).into_bytes());
    }
}

/// Reads a secret file: its content without surrounding whitespace. The
/// error names the path (never the content).
///
/// # Errors
/// The file cannot be read or holds only whitespace.
pub fn read_secret_file(path: &Path) -> Result<Secret, String> {
    check_private_file(path)?;
    let raw = Secret::new(
        std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
    );
    let value = raw.expose().trim();
    if value.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(Secret::new(value.to_owned()))
}

/// Checks that a secret file is private: others have no access at all, and
/// the group none either unless the file's group is one of this process's
/// own groups (Kubernetes mounts secrets `root:<fsGroup>` mode 0440 for a
/// non-root container; on a host, give the service a group of its own) and
/// the group cannot write it. A key that others can read is no longer a
/// secret, so every service refuses to start with one rather than warn. The
/// file's own mode counts (a symlink, as Kubernetes mounts secrets, is
/// followed to it).
///
/// # Errors
/// `PATH has mode 0644: ...` with the `chmod` that fixes it, or
/// `cannot read PATH: ...`.
pub fn check_private_file(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt as _;
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mode = meta.mode() & 0o7777;
    let own_group = || {
        let gid = nix::unistd::Gid::from_raw(meta.gid());
        gid == nix::unistd::getegid()
            || nix::unistd::getgroups().is_ok_and(|groups| groups.contains(&gid))
    };
    let others = mode & 0o007 != 0;
    let group = mode & 0o070 != 0 && (mode & 0o020 != 0 || !own_group());
    if others || group {
        return Err(format!(
            "{} has mode {mode:04o}: a secret file must not be accessible to others, nor to a group this service is not in (chmod 600 {})",
            path.display(),
            path.display()
        ));
    }
    Ok(())
}

/// Checks that a file a configuration names can be opened for reading and
/// is a regular file (its content is not read). The message names the path.
///
/// # Errors
/// `cannot read PATH: ...` or `PATH is not a regular file`.
pub fn check_readable_file(path: &Path) -> Result<(), String> {
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    let f = std::fs::File::open(path).map_err(cannot)?;
    if !f.metadata().map_err(cannot)?.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    Ok(())
}

/// Why a program's configuration file could not be loaded (storage-target,
/// dpu-agent). The message always starts with the file's path and never
/// contains a secret.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file itself could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The configuration file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Malformed YAML, an unknown field, a missing field or a value of the
    /// wrong type.
    #[error("{file}: {message}")]
    Parse {
        /// The configuration file.
        file: String,
        /// serde_yaml's message, which names the field, the line and the column.
        message: String,
    },
    /// A field has an invalid value, or a file it names cannot be used.
    #[error("{file}: {field}: {message}")]
    Invalid {
        /// The configuration file.
        file: String,
        /// Path of the offending field, e.g. `targets[0].endpoint`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl ConfigError {
    /// The offending field's path, for [`ConfigError::Invalid`].
    #[must_use]
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            ConfigError::Read { .. } | ConfigError::Parse { .. } => None,
        }
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
            let e = parse_size(s).unwrap_err();
            assert!(e.contains(want), "{s}: want {want:?} in {e}");
            assert!(e.starts_with(&format!("{s:?}")), "{s}: {e}");
        }
        // Every rejection says what to write instead.
        for s in ["4MB", "-4", "", "4 PiB", "1.5GiB"] {
            let e = parse_size(s).unwrap_err();
            assert!(e.contains("KiB") || e.contains("MiB"), "{s}: {e}");
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

    #[test]
    fn fabric_keys() {
        let hex = "ab".repeat(32);
        let key = parse_fabric_key(&format!("  {hex}\n")).unwrap();
        assert_eq!(key, FabricKey::new(vec![0xab; 32]).unwrap());
        // Either case; 32 digits is the minimum.
        let min = "00112233445566778899AABBCCDDEEFF";
        assert_eq!(
            parse_fabric_key(min).unwrap(),
            parse_fabric_key(&min.to_ascii_lowercase()).unwrap()
        );
        assert_eq!(
            format!("{:?}", parse_fabric_key(min).unwrap()),
            "FabricKey(<16 bytes redacted>)"
        );
        let cases = [
            ("", "empty"),
            (" \n\t", "empty"),
            ("abcd", "at least 16 bytes"),
            ("abcd", "2 bytes (4 hex digits)"),
            ("00112233445566778899aabbccddee", "30 hex digits"),
            ("00112233445566778899aabbccddee", "openssl rand -hex 32"),
            ("abc", "odd number of hex digits (3)"),
            ("00112233445566778899aabbccddeeff0", "odd"),
            (&"zz".repeat(32), "not hexadecimal"),
            (&"zz".repeat(32), "position 0"),
            ("0011223344556677889g", "position 19"),
            ("00112233 44556677", "position 8"),
        ];
        for (text, want) in cases {
            let e = parse_fabric_key(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: want {want:?} in {e}");
        }
        // Messages never echo the key, nor its offending character.
        for secret in [
            "0123456789abcdef0123456789abcde",
            "0123456789abcdef",
            "0123456789abcdefq123456789abcdef",
            "0123456789abcdef0123456789abcdeq",
        ] {
            let e = parse_fabric_key(secret).unwrap_err();
            assert!(!e.contains(secret), "{e}");
            assert!(!e.contains("0123") && !e.contains("'q'"), "{e}");
        }
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
        // Readable by others: refused, naming the file and its mode.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_fabric_key_file(&p).unwrap_err();
        assert!(
            e.contains("fabric.key has mode 0644") && e.contains("chmod 600"),
            "{e}"
        );
        for refused in [0o604, 0o660, 0o606] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(refused)).unwrap();
            assert!(read_fabric_key_file(&p).is_err(), "{refused:o}");
        }
        // Group-readable is fine when the group is ours (Kubernetes' fsGroup).
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o440)).unwrap();
        assert!(read_fabric_key_file(&p).is_ok());
        assert!(!e.contains("abab"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read_fabric_key_file(&p).is_ok());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(read_fabric_key_file(&p).is_ok());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
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
