//! Directories and files that belong to the service's user alone.
//!
//! A directory someone else could write to lets them replace what the
//! service puts there (a socket, a data file); one others can read leaks
//! stored objects. These helpers never follow a symlink at the path they
//! check, and name the path, its owner and its mode in every error.

use std::fs::File;
use std::io;
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::{Path, PathBuf};

/// Why a directory or file is not private.
#[derive(Debug, thiserror::Error)]
pub enum PrivateError {
    /// It could not be created or inspected.
    #[error("{}: {what}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// Which step failed.
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A symlink where a directory belongs.
    #[error("{} is a symbolic link; refusing to follow it (remove it, or name the real directory)", path.display())]
    Symlink {
        /// The path.
        path: PathBuf,
    },
    /// Not a directory.
    #[error("{} exists and is not a directory", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// Owned by another user.
    #[error("{} is owned by uid {owner}, not by uid {expected} who runs this; another user may have created it (remove it, or choose another directory)", path.display())]
    WrongOwner {
        /// The path.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Who should own it.
        expected: u32,
    },
    /// Group or others may write there.
    #[error("{} has mode {mode:04o}: group or others may write there (chmod go-w {})", path.display(), path.display())]
    Writable {
        /// The path.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

fn io_err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> PrivateError + 'a {
    move |source| PrivateError::Io {
        path: path.to_owned(),
        what,
        source,
    }
}

/// Makes `path` a directory only the current user can enter: created mode
/// 0700 (parents as needed) when missing; an existing one must be a real
/// directory (not a symlink) owned by the current user, and is tightened to
/// 0700 if it is more open.
///
/// # Errors
/// [`PrivateError`] naming the path and what is wrong with it.
pub fn ensure_private_dir(path: &Path) -> Result<(), PrivateError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io_err(parent, "cannot create"))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err(path, "cannot create")(e)),
    }
    let meta = owned_dir(path, &[current_uid()])?;
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
            .map_err(io_err(path, "cannot chmod 700"))?;
    }
    Ok(())
}

/// Checks the directory a socket lives in: a real directory owned by one of
/// `owners` (the user the server should run as, root) that neither group nor
/// others may write to, so nobody else can replace the socket.
///
/// # Errors
/// [`PrivateError`].
pub fn check_socket_dir(path: &Path, owners: &[u32]) -> Result<(), PrivateError> {
    let meta = owned_dir(path, owners)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(PrivateError::Writable {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

fn owned_dir(path: &Path, owners: &[u32]) -> Result<std::fs::Metadata, PrivateError> {
    let meta = std::fs::symlink_metadata(path).map_err(io_err(path, "cannot inspect"))?;
    if meta.file_type().is_symlink() {
        return Err(PrivateError::Symlink {
            path: path.to_owned(),
        });
    }
    if !meta.is_dir() {
        return Err(PrivateError::NotADirectory {
            path: path.to_owned(),
        });
    }
    if !owners.contains(&meta.uid()) {
        return Err(PrivateError::WrongOwner {
            path: path.to_owned(),
            owner: meta.uid(),
            expected: owners.first().copied().unwrap_or_else(current_uid),
        });
    }
    Ok(meta)
}

/// Creates (or truncates) a file only its owner can read and write (mode
/// 0600 whatever the umask; an existing file is tightened), never following
/// a symlink at `path`.
///
/// # Errors
/// [`PrivateError::Io`].
pub fn create_private_file(path: &Path) -> Result<File, PrivateError> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_err(path, "cannot create"))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(io_err(path, "cannot chmod 600"))?;
    Ok(f)
}

/// Writes `contents` to a new private file ([`create_private_file`]).
///
/// # Errors
/// [`PrivateError::Io`].
pub fn write_private_file(path: &Path, contents: &[u8]) -> Result<(), PrivateError> {
    use std::io::Write as _;
    create_private_file(path)?
        .write_all(contents)
        .map_err(io_err(path, "cannot write"))
}

/// The effective uid of this process.
#[must_use]
pub fn current_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn private_dirs_are_created_or_tightened() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/b");
        ensure_private_dir(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        ensure_private_dir(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
    }

    #[test]
    fn symlinks_and_files_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(matches!(
            ensure_private_dir(&link),
            Err(PrivateError::Symlink { .. })
        ));
        assert!(matches!(
            check_socket_dir(&link, &[current_uid()]),
            Err(PrivateError::Symlink { .. })
        ));
        let file = t.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(
            ensure_private_dir(&file),
            Err(PrivateError::NotADirectory { .. })
        ));
    }

    #[test]
    fn socket_dirs_must_not_be_writable_by_others_or_owned_by_them() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("s");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        check_socket_dir(&d, &[current_uid()]).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_socket_dir(&d, &[current_uid()]).unwrap_err();
        assert!(e.to_string().contains("mode 0777"), "{e}");
        let e = check_socket_dir(&d, &[current_uid().wrapping_add(1)]).unwrap_err();
        assert!(matches!(e, PrivateError::WrongOwner { .. }), "{e}");
    }

    #[test]
    fn private_files_are_0600_and_never_follow_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("f");
        write_private_file(&f, b"x").unwrap();
        assert_eq!(mode(&f), 0o600);
        let target = t.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(write_private_file(&link, b"x").is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    }
}
