//! Secrets and the files a configuration names.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Why a file a configuration names cannot be used. Every message names the
/// path and never the file's content.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// It cannot be opened or read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A secret file others (or a foreign group) may access.
    #[error(
        "{} has mode {mode:04o}: a secret file must not be accessible to others, nor to a group this service is not in (chmod 600 {})",
        path.display(),
        path.display()
    )]
    NotPrivate {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A secret file holding only whitespace.
    #[error("{} is empty; write the secret into it", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// A directory, a device, a socket...
    #[error("{} is not a regular file", path.display())]
    NotARegularFile {
        /// The path.
        path: PathBuf,
    },
}

fn read_err(path: &Path) -> impl FnOnce(io::Error) -> FileError + '_ {
    move |source| FileError::Read {
        path: path.to_owned(),
        source,
    }
}

/// A secret string read from a file: a tenant's secret access key, a shim's
/// bearer token, the text of a fabric key file.
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
        let mut bytes = std::mem::take(&mut self.0).into_bytes();
        let cap = bytes.capacity();
        bytes.clear();
        bytes.resize(cap, 0);
        std::hint::black_box(&mut bytes);
    }
}

/// Reads a private file ([`check_private_file`]) whole, as a [`Secret`]
/// (wiped when dropped), for a caller that parses it (a fabric key file).
///
/// # Errors
/// [`FileError::NotPrivate`] or [`FileError::Read`].
pub fn read_private_file(path: &Path) -> Result<Secret, FileError> {
    check_private_file(path)?;
    std::fs::read_to_string(path)
        .map(Secret::new)
        .map_err(read_err(path))
}

/// Reads a secret file: its content without surrounding whitespace. It must
/// be private ([`check_private_file`]). The error names the path (never the
/// content).
///
/// # Errors
/// The file is not private, cannot be read or holds only whitespace.
pub fn read_secret_file(path: &Path) -> Result<Secret, FileError> {
    let raw = read_private_file(path)?;
    let value = raw.expose().trim();
    if value.is_empty() {
        return Err(FileError::Empty {
            path: path.to_owned(),
        });
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
/// `PATH has mode 0644: ...` with the `chmod` that fixes it
/// ([`FileError::NotPrivate`]), or `cannot read PATH: ...`.
pub fn check_private_file(path: &Path) -> Result<(), FileError> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).map_err(read_err(path))?;
    let mode = meta.mode() & 0o7777;
    let own_group = || {
        let gid = nix::unistd::Gid::from_raw(meta.gid());
        gid == nix::unistd::getegid()
            || nix::unistd::getgroups().is_ok_and(|groups| groups.contains(&gid))
    };
    let others = mode & 0o007 != 0;
    let group = mode & 0o070 != 0 && (mode & 0o020 != 0 || !own_group());
    if others || group {
        return Err(FileError::NotPrivate {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

/// Checks that a file a configuration names can be opened for reading and
/// is a regular file (its content is not read). The message names the path.
///
/// # Errors
/// `cannot read PATH: ...` or `PATH is not a regular file`.
pub fn check_readable_file(path: &Path) -> Result<(), FileError> {
    let f = std::fs::File::open(path).map_err(read_err(path))?;
    if !f.metadata().map_err(read_err(path))?.is_file() {
        return Err(FileError::NotARegularFile {
            path: path.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn secret_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        let e = read_secret_file(&p).unwrap_err().to_string();
        assert!(e.starts_with("cannot read ") && e.contains("token"), "{e}");
        std::fs::write(&p, "  s3cr3t\n").unwrap();
        chmod(&p, 0o644);
        let e = read_secret_file(&p).unwrap_err().to_string();
        assert!(
            e.contains("token has mode 0644") && e.contains("chmod 600") && !e.contains("s3cr3t"),
            "{e}"
        );
        for refused in [0o604, 0o660, 0o606] {
            chmod(&p, refused);
            assert!(check_private_file(&p).is_err(), "{refused:o}");
        }
        // Group-readable is fine when the group is ours (Kubernetes' fsGroup).
        chmod(&p, 0o440);
        assert_eq!(read_secret_file(&p).unwrap().expose(), "s3cr3t");
        chmod(&p, 0o600);
        let s = read_secret_file(&p).unwrap();
        assert_eq!(s.expose(), "s3cr3t");
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(read_private_file(&p).unwrap().expose(), "  s3cr3t\n");
        std::fs::write(&p, " \n").unwrap();
        let e = read_secret_file(&p).unwrap_err().to_string();
        assert!(e.contains("token is empty"), "{e}");
    }

    #[test]
    fn readable_files() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_readable_file(dir.path()).unwrap_err().to_string();
        assert!(e.ends_with("is not a regular file"), "{e}");
        let e = check_readable_file(&dir.path().join("nope"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("cannot read ") && e.contains("nope"), "{e}");
        let p = dir.path().join("ca.pem");
        std::fs::write(&p, "x").unwrap();
        check_readable_file(&p).unwrap();
    }
}
