//! Filesystem helpers of the store: private directories and files,
//! fsyncs, blocking work off the runtime, reading an object file's header,
//! and [`TmpGuard`]: a file under `.tmp` never outlives its request.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::{FormatError, ObjectMeta, StoreError, StoreResult, format};

/// Locks a std mutex, ignoring poisoning (the data stays consistent because
/// every critical section is a few infallible map updates plus a rename).
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(super) fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(super) fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Current time in Unix milliseconds.
#[must_use]
pub fn now_ms() -> i64 {
    let now = time::OffsetDateTime::now_utc();
    i64::try_from(now.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

/// fsyncs a directory so that renames and creations in it are durable.
pub(super) fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates a directory only this user may enter (mode 0700, whatever the
/// umask). Every directory of the store is made with it.
pub(crate) fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new().mode(0o700).create(dir)
}

/// Creates (or truncates) a file only this user may read and write: mode
/// 0600 whatever the umask and the parent directory's mode, never following
/// a symlink. Every file of the store (object data, temporary files,
/// multipart parts, bucket and upload metadata) is made with it.
pub(crate) fn create_private_file(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    // The umask can only remove bits, but make the mode exact anyway.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(f)
}

/// Creates `dir` (mode 0700) if missing, making the creation durable.
pub(super) fn ensure_dir(dir: &Path) -> io::Result<()> {
    match create_private_dir(dir) {
        Ok(()) => {
            if let Some(parent) = dir.parent() {
                fsync_dir(parent)?;
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Runs blocking filesystem work off the async runtime.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> StoreResult<T> + Send + 'static,
) -> StoreResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Io(io::Error::other(e)))?
}

/// Reads the metadata of an object file through an open handle.
pub(super) fn read_meta(file: &File, path: &Path) -> StoreResult<ObjectMeta> {
    let corrupt = |source| StoreError::Corrupt {
        path: path.to_owned(),
        source,
    };
    let len = file.metadata()?.len();
    if len < format::TRAILER_LEN {
        return Err(corrupt(FormatError::BadMagic));
    }
    let mut trailer = [0u8; 16];
    file.read_exact_at(&mut trailer, len - format::TRAILER_LEN)?;
    let hlen = format::parse_trailer(&trailer, len).map_err(corrupt)?;
    let mut header = vec![0u8; usize::try_from(hlen).unwrap_or(0)];
    file.read_exact_at(&mut header, len - format::TRAILER_LEN - hlen)?;
    format::parse_header(&header, len).map_err(corrupt)
}

/// Removes a temporary file when dropped unless disarmed (also when the
/// request future is cancelled mid-write). A blocking task that creates the
/// file does so through [`TmpGuard::creator`], since it may run after a
/// cancelled request dropped the guard.
#[derive(Debug)]
pub(super) struct TmpGuard {
    pub(super) path: Option<PathBuf>,
    /// Set when the guard removed the file: a creator that comes later
    /// removes what it made.
    pub(super) removed: Arc<AtomicBool>,
}

impl TmpGuard {
    pub(super) fn new(path: PathBuf) -> TmpGuard {
        TmpGuard {
            path: Some(path),
            removed: Arc::new(AtomicBool::new(false)),
        }
    }
    pub(super) fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(""))
    }
    pub(super) fn disarm(&mut self) {
        self.path = None;
    }
    /// What a blocking task uses to create the file.
    pub(super) fn creator(&self) -> TmpCreator {
        TmpCreator {
            path: self.path().to_owned(),
            removed: Arc::clone(&self.removed),
        }
    }
}

impl Drop for TmpGuard {
    fn drop(&mut self) {
        if let Some(p) = self.path.take() {
            self.removed.store(true, Ordering::SeqCst);
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Creates a [`TmpGuard`]'s file from a blocking task. The spawned task
/// outlives a cancelled request: when the guard has already removed the
/// file (or removes it later), the file does not stay behind either way.
#[derive(Debug)]
pub(super) struct TmpCreator {
    pub(super) path: PathBuf,
    pub(super) removed: Arc<AtomicBool>,
}

impl TmpCreator {
    /// [`create_private_file`], undone when the guard is already gone.
    pub(super) fn create(&self) -> io::Result<File> {
        let f = create_private_file(&self.path)?;
        // The guard sets the flag before removing: if it is not set yet,
        // the guard's removal comes after this file exists.
        if self.removed.load(Ordering::SeqCst) {
            let _ = std::fs::remove_file(&self.path);
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "the request was cancelled before its temporary file was made",
            ));
        }
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blocking task may create a request's temporary file before or
    /// after the request is cancelled (its guard dropped): either way no
    /// file stays; a disarmed guard keeps it.
    #[test]
    fn a_temporary_file_never_outlives_its_cancelled_request() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("t");

        // Created after the guard is gone: undone at once.
        let guard = TmpGuard::new(path.clone());
        let late = guard.creator();
        drop(guard);
        let e = late.create().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Interrupted);
        assert!(!path.exists());

        // Created first, then the guard goes (the file still open).
        let guard = TmpGuard::new(path.clone());
        let f = guard.creator().create().unwrap();
        assert!(path.exists());
        drop(guard);
        assert!(!path.exists());
        drop(f);

        // Disarmed (published): kept.
        let mut guard = TmpGuard::new(path.clone());
        drop(guard.creator().create().unwrap());
        guard.disarm();
        drop(guard);
        assert!(path.exists());
    }
}
