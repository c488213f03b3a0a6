//! The fabric's own configuration pieces: the pre-shared fabric key file
//! and the backend name. The pieces every s3dma program shares (sizes,
//! secrets, `file: field: problem` errors) live in the `s3dma-config` crate.
//!
//! * [`parse_fabric_key`] / [`read_fabric_key_file`]: the pre-shared fabric
//!   key file (hexadecimal, private). Error messages never contain the key.
//! * [`Backend`] implements `serde::Deserialize` through its
//!   [`std::str::FromStr`] (`tcp`, `verbs`): backend names are parsed in one
//!   place, and a configuration struct holds a [`Backend`] directly.
//! * [`PathMtu`]: the `path_mtu` knob of the RC queue pairs whose peer
//!   does not say its MTU (the hipobj-rc-v2 dialect): 256 to 4096 bytes.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserialize, Deserializer, Visitor};

use crate::{Backend, FabricKey};

/// Why a fabric key's text was refused. Never contains any part of the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FabricKeyError {
    /// Only whitespace.
    #[error("the key file is empty; generate a key with `openssl rand -hex 32`")]
    Empty,
    /// A character that is not a hex digit (its position, not its value).
    #[error(
        "the key is not hexadecimal (a non-hex character at position {position}); generate one with `openssl rand -hex 32`"
    )]
    NotHex {
        /// Byte offset of the first offending character in the trimmed text.
        position: usize,
    },
    /// An odd number of hex digits.
    #[error("the key has an odd number of hex digits ({digits}); each byte takes two")]
    OddDigits {
        /// How many.
        digits: usize,
    },
    /// Shorter than [`FabricKey::MIN_LEN`].
    #[error(
        "the key is {} bytes ({digits} hex digits); at least {} bytes ({} hex digits) are required (32 bytes recommended: `openssl rand -hex 32`)",
        digits / 2,
        FabricKey::MIN_LEN,
        FabricKey::MIN_LEN * 2
    )]
    TooShort {
        /// How many hex digits.
        digits: usize,
    },
}

/// Why [`read_fabric_key_file`] failed. The message names the file and
/// never contains the key.
#[derive(Debug, thiserror::Error)]
pub enum FabricKeyFileError {
    /// The file cannot be read, or others may read it.
    #[error(transparent)]
    File(#[from] s3dma_config::FileError),
    /// The file's text is not a valid key.
    #[error("{}: {source}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: FabricKeyError,
    },
}

/// Parses a fabric key file's text: hexadecimal (either case), at least
/// [`FabricKey::MIN_LEN`] bytes (32 hex digits), surrounding whitespace
/// ignored. `openssl rand -hex 32` makes a good one (64 hex digits).
///
/// # Errors
/// A [`FabricKeyError`] saying what is wrong: the text is empty, the
/// position (not the value) of the first non-hex character, an odd number
/// of digits, or too short a key. It never contains any part of the key.
pub fn parse_fabric_key(text: &str) -> Result<FabricKey, FabricKeyError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(FabricKeyError::Empty);
    }
    if let Some(position) = t.bytes().position(|b| !b.is_ascii_hexdigit()) {
        return Err(FabricKeyError::NotHex { position });
    }
    if !t.len().is_multiple_of(2) {
        return Err(FabricKeyError::OddDigits { digits: t.len() });
    }
    if t.len() < FabricKey::MIN_LEN * 2 {
        return Err(FabricKeyError::TooShort { digits: t.len() });
    }
    // Checked above: even length, hex digits only, long enough. Neither
    // error may echo the text.
    let bytes = hex::decode(t).map_err(|_| FabricKeyError::NotHex { position: 0 })?;
    FabricKey::new(bytes).map_err(|_| FabricKeyError::TooShort { digits: t.len() })
}

/// Reads and parses a fabric key file ([`parse_fabric_key`]). Others must
/// not be able to read it ([`s3dma_config::check_private_file`]). The text
/// read is overwritten with zeros afterwards (best effort).
///
/// # Errors
/// [`FabricKeyFileError`] naming the file: `cannot read <path>: <io error>`,
/// `<path> has mode 0644: ...` or `<path>: <what is wrong>` (never the key
/// itself).
pub fn read_fabric_key_file(path: impl AsRef<Path>) -> Result<FabricKey, FabricKeyFileError> {
    let path = path.as_ref();
    let text = s3dma_config::read_private_file(path)?;
    parse_fabric_key(text.expose()).map_err(|source| FabricKeyFileError::Invalid {
        path: path.to_owned(),
        source,
    })
}

const BACKENDS: &[&str] = &["tcp", "verbs"];

/// Through [`Backend`]'s `FromStr` (`tcp`, `verbs`); anything else is
/// serde's usual "unknown variant" error listing both.
impl<'de> Deserialize<'de> for Backend {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Backend;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a fabric backend: `tcp` or `verbs`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Backend, E> {
                v.parse().map_err(|_| E::unknown_variant(v, BACKENDS))
            }
        }
        d.deserialize_str(V)
    }
}

/// Writes the name its `Deserialize` reads (`tcp`, `verbs`), so a
/// configuration struct holding a [`Backend`] round-trips (the launcher
/// writes the services' configurations by serializing them).
impl serde::Serialize for Backend {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            Backend::Tcp => BACKENDS[0],
            Backend::Verbs => BACKENDS[1],
        })
    }
}

/// A path MTU of the verbs queue pairs, in bytes (256, 512, 1024, 2048 or
/// 4096): the `path_mtu` knob. A queue pair connected with it uses the
/// lower of it and the port's active MTU ([`PathMtu::cap`]). The peers of
/// the hipobj-rc-v2 dialect do not tell each other their MTU, so both
/// sides must use the same one: emulated NICs (Soft-RoCE, some VMs) often
/// report 1024 while hardware reports 4096, and a WRITE larger than one
/// packet between two different MTUs fails. Set the same `path_mtu` on
/// both sides (the lower of the two ports') for such a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PathMtu(u8);

/// Why a path MTU was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("path_mtu must be 256, 512, 1024, 2048 or 4096 (bytes), not {0}")]
pub struct PathMtuError(pub String);

impl PathMtu {
    /// The MTU of `bytes` (256, 512, 1024, 2048 or 4096).
    ///
    /// # Errors
    /// Any other number of bytes.
    pub fn from_bytes(bytes: u32) -> Result<PathMtu, PathMtuError> {
        match bytes {
            256 => Ok(PathMtu(1)),
            512 => Ok(PathMtu(2)),
            1024 => Ok(PathMtu(3)),
            2048 => Ok(PathMtu(4)),
            4096 => Ok(PathMtu(5)),
            other => Err(PathMtuError(other.to_string())),
        }
    }

    /// In bytes.
    #[must_use]
    pub fn bytes(self) -> u32 {
        128u32 << self.0
    }

    /// The verbs `ibv_mtu` code (1 = 256 ... 5 = 4096).
    #[must_use]
    pub fn code(self) -> u8 {
        self.0
    }

    /// The MTU code a queue pair on a port whose active MTU code is
    /// `active` uses with the knob `cap` (`None`: the active MTU): the
    /// lower of the two, at least 1 (256 bytes).
    #[must_use]
    pub fn cap(cap: Option<PathMtu>, active: u8) -> u8 {
        cap.map_or(active, |c| active.min(c.0)).max(1)
    }
}

impl std::str::FromStr for PathMtu {
    type Err = PathMtuError;
    fn from_str(s: &str) -> Result<PathMtu, PathMtuError> {
        s.trim()
            .parse::<u32>()
            .map_err(|_| PathMtuError(s.to_owned()))
            .and_then(PathMtu::from_bytes)
    }
}

impl fmt::Display for PathMtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

/// From a number of bytes (YAML `path_mtu: 1024`).
impl<'de> Deserialize<'de> for PathMtu {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes = u32::deserialize(d)?;
        PathMtu::from_bytes(bytes).map_err(de::Error::custom)
    }
}

/// As the number of bytes its `Deserialize` reads.
impl serde::Serialize for PathMtu {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::IntoDeserializer;
    use serde::de::value::Error as DeError;

    #[test]
    fn path_mtus() {
        for (bytes, code) in [(256, 1), (512, 2), (1024, 3), (2048, 4), (4096, 5)] {
            let m = PathMtu::from_bytes(bytes).unwrap();
            assert_eq!((m.bytes(), m.code()), (bytes, code));
            assert_eq!(bytes.to_string().parse::<PathMtu>(), Ok(m));
            let d: Result<PathMtu, DeError> = PathMtu::deserialize(bytes.into_deserializer());
            assert_eq!(d, Ok(m));
        }
        for bad in [0, 1000, 1500, 8192, 9000] {
            assert!(PathMtu::from_bytes(bad).is_err(), "{bad}");
            let d: Result<PathMtu, DeError> = PathMtu::deserialize(bad.into_deserializer());
            assert!(d.unwrap_err().to_string().contains("256, 512"), "{bad}");
        }
        assert!("1k".parse::<PathMtu>().is_err());
        let k1 = PathMtu::from_bytes(1024).ok();
        // The lower of the knob and the port's active MTU.
        assert_eq!(PathMtu::cap(None, 5), 5);
        assert_eq!(PathMtu::cap(k1, 5), 3);
        assert_eq!(PathMtu::cap(k1, 2), 2);
        assert_eq!(PathMtu::cap(None, 0), 1);
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
            parse_fabric_key(min).unwrap(),
            FabricKey::new(vec![
                0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
                0xee, 0xff
            ])
            .unwrap()
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
            let e = parse_fabric_key(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: want {want:?} in {e}");
        }
        // Messages never echo the key, nor its offending character.
        for secret in [
            "0123456789abcdef0123456789abcde",
            "0123456789abcdef",
            "0123456789abcdefq123456789abcdef",
            "0123456789abcdef0123456789abcdeq",
        ] {
            let e = parse_fabric_key(secret).unwrap_err().to_string();
            assert!(!e.contains(secret), "{e}");
            assert!(!e.contains("0123") && !e.contains("'q'"), "{e}");
        }
    }

    #[test]
    fn fabric_key_files_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fabric.key");
        let e = read_fabric_key_file(&p).unwrap_err().to_string();
        assert!(
            e.starts_with("cannot read ") && e.contains("fabric.key"),
            "{e}"
        );
        std::fs::write(&p, format!("{}\n", "ab".repeat(32))).unwrap();
        // Readable by others: refused, naming the file and its mode.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_fabric_key_file(&p).unwrap_err().to_string();
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
        let e = read_fabric_key_file(&p).unwrap_err().to_string();
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
