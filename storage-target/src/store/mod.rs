//! The filesystem object store.
//!
//! Layout under the data directory:
//!
//! ```text
//! .tmp/<uuid>                       files being written; emptied at start-up
//! .uploads/<upload-id>/upload.json  an in-progress multipart upload
//! .uploads/<upload-id>/part-NNNNN   its parts (object file format)
//! .parts/<id>/part-NNNNN            a completed multipart object's data:
//!                                   hard links of its parts (see below)
//! buckets/<bucket>/bucket.json      bucket metadata (creation time, owner)
//! buckets/<bucket>/objects/<xx>/<sha256(key)>   one file per object
//! buckets/<bucket>/objects/<xx>/<sha256(key)>.acl  an ACL set by PutObjectAcl
//! ```
//!
//! An object's owner and ACL as written travel in its header; PutObjectAcl
//! writes a small `.acl` file beside it, stamped with the object's instance
//! ([`ObjectMeta::instance`]), so a later write of the key (a new instance)
//! never inherits it and no object data is rewritten.
//!
//! Keys never become paths: an object lives under the SHA-256 of its key, so
//! `a` and `a/b` coexist, 1024-byte keys fit, and `..` cannot escape. Each
//! object is ONE file (data + header, see [`mod@format`]), written under `.tmp`,
//! fsynced, renamed into place and its directory fsynced: readers see the old
//! or the new object, never a partial one, also after a crash. An in-memory
//! ordered index per bucket, rebuilt at start-up, serves listings.
//!
//! CompleteMultipartUpload copies no data: it hard-links the chosen part
//! files into a new `.parts/<id>/`, fsyncs it, then publishes an object
//! file whose header is a [`Manifest`] of them (one rename, as for any
//! object). A crash before the rename leaves an unreferenced `.parts`
//! directory, removed at start-up, and the upload intact. When an object
//! with a manifest is replaced or deleted its part files go too, once no
//! open [`ObjectReader`] still uses them.
//!
//! The data path is transport-neutral: [`Store::put_object`] and
//! [`Store::upload_part`] take any stream of [`Bytes`], and an
//! [`ObjectReader`] serves any byte range with [`ObjectReader::read_at`] (into
//! any buffer, e.g. RDMA staging memory) or [`ObjectReader::stream`].

pub mod conditions;
pub mod etag;
pub mod format;
pub mod listing;
#[cfg(test)]
mod manifest_tests;
mod multipart;

use std::collections::BTreeMap;
use std::fs::File;
use std::future::Future as _;
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt as _};
use s3s::crypto::{Checksum as _, Md5};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use tokio::io::AsyncWriteExt as _;
use tracing::{info, warn};

pub use self::format::{FormatError, Manifest, ObjectAttrs, ObjectMeta, PartMeta};
use crate::acl::Acl;

/// Suffix of the file PutObjectAcl writes beside an object.
const ACL_SUFFIX: &str = ".acl";
pub use self::multipart::{PartInfo, UploadInfo, UploadsPage};
pub use crate::config::bucket_name;
pub use crate::config::multipart::{MIN_PART_SIZE, MultipartConfig};

/// A boxed error from a body stream.
pub type BodyError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Largest object accepted by a single PutObject (and largest part): 5 GiB.
pub const MAX_PUT_SIZE: u64 = 5 << 30;
/// Read/write buffer size of the streaming paths.
pub const IO_CHUNK: usize = 1 << 20;

/// Store errors; mapped to S3 error codes in one place (`s3::store_error`).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The bucket does not exist.
    #[error("The specified bucket does not exist")]
    NoSuchBucket,
    /// The key does not exist.
    #[error("The specified key does not exist.")]
    NoSuchKey,
    /// CreateBucket of a bucket the caller already owns.
    #[error("Your previous request to create the named bucket succeeded and you already own it.")]
    BucketAlreadyOwnedByYou,
    /// CreateBucket of a bucket someone else owns.
    #[error("The requested bucket name is not available.")]
    BucketAlreadyExists,
    /// DeleteBucket of a bucket that still holds objects.
    #[error("The bucket you tried to delete is not empty")]
    BucketNotEmpty,
    /// The bucket name breaks the naming rules.
    #[error("The specified bucket is not valid.")]
    InvalidBucketName,
    /// The multipart upload does not exist (or was completed or aborted).
    #[error(
        "The specified upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed."
    )]
    NoSuchUpload,
    /// The body's MD5 differs from Content-MD5.
    #[error("The Content-MD5 you specified did not match what we received.")]
    BadDigest,
    /// Content-MD5 is not base64 of 16 bytes.
    #[error("The Content-MD5 you specified is not valid.")]
    InvalidDigest,
    /// An `x-amz-checksum-*` value differs from the body's.
    #[error("{0}")]
    ChecksumMismatch(String),
    /// CompleteMultipartUpload names a missing part or a wrong ETag.
    #[error("{0}")]
    InvalidPart(String),
    /// CompleteMultipartUpload lists parts out of order.
    #[error("The list of parts was not in ascending order. Parts must be ordered by part number.")]
    InvalidPartOrder,
    /// A part other than the last is smaller than 5 MiB.
    #[error(
        "Your proposed upload is smaller than the minimum allowed object size (part {part} has {size} bytes)."
    )]
    EntityTooSmall {
        /// The part number.
        part: u32,
        /// Its size.
        size: u64,
    },
    /// The body exceeds [`MAX_PUT_SIZE`].
    #[error("Your proposed upload exceeds the maximum allowed object size.")]
    EntityTooLarge,
    /// Another invalid argument.
    #[error("{0}")]
    InvalidArgument(String),
    /// A per-user cap on multipart uploads is reached (403 `QuotaExceeded`).
    #[error("{0}")]
    QuotaExceeded(String),
    /// A request S3 refuses as `InvalidRequest` (checksum rules).
    #[error("{0}")]
    InvalidRequest(String),
    /// The body ended short of (or ran past) what the request declared, or
    /// lacked a trailer it announced.
    #[error("{0}")]
    IncompleteBody(String),
    /// Reading the request body failed (client error, signature or hash mismatch).
    #[error("reading the request body failed: {0}")]
    Body(BodyError),
    /// A filesystem error.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// The data directory is not ours alone (another user's, a symlink, or
    /// it cannot be made private).
    #[error(transparent)]
    NotPrivate(#[from] s3dma_service::private::PrivateError),
    /// An object file is damaged.
    #[error("corrupt object file {path}: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: FormatError,
    },
}

impl From<crate::checksum::ChecksumError> for StoreError {
    fn from(e: crate::checksum::ChecksumError) -> Self {
        use crate::checksum::ChecksumError as E;
        match e {
            E::InvalidPart(m) => StoreError::InvalidPart(m),
            E::InvalidRequest(m) => StoreError::InvalidRequest(m),
            E::Mismatch(m) => StoreError::ChecksumMismatch(m),
        }
    }
}

/// Result alias for store operations.
pub type StoreResult<T> = Result<T, StoreError>;

/// Observes the body bytes of a write and may veto the write at the end
/// (checksums, trailers). [`NoCheck`] accepts everything.
pub trait BodyCheck: Send {
    /// Called with every chunk, in order.
    fn update(&mut self, data: &[u8]);
    /// Called after the last chunk, before anything is published.
    ///
    /// # Errors
    /// Any [`StoreError`] aborts the write.
    fn finish(&mut self) -> StoreResult<()>;
    /// After a successful [`BodyCheck::finish`]: the checksum to store with
    /// the data (none by default).
    fn checksum(&self) -> Option<crate::checksum::StoredChecksum> {
        None
    }
}

/// A [`BodyCheck`] that accepts everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoCheck;

impl BodyCheck for NoCheck {
    fn update(&mut self, _data: &[u8]) {}
    fn finish(&mut self) -> StoreResult<()> {
        Ok(())
    }
}

/// Listing entry of the in-memory index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    /// Object size.
    pub size: u64,
    /// ETag without quotes.
    pub etag: String,
    /// Last-Modified, Unix milliseconds.
    pub last_modified_ms: i64,
    /// Canonical id of the object's owner, when recorded.
    pub owner: Option<String>,
    /// The algorithm and type of the object's checksum, if it has one
    /// (listings show them).
    pub checksum: Option<(crate::checksum::Algorithm, crate::checksum::ChecksumType)>,
    /// The `.parts` directory holding the data, for an object made by
    /// CompleteMultipartUpload.
    pub manifest: Option<String>,
}

impl From<&ObjectMeta> for IndexEntry {
    fn from(m: &ObjectMeta) -> Self {
        IndexEntry {
            manifest: m.manifest.as_ref().map(|m| m.dir.clone()),
            size: m.size,
            etag: m.etag.clone(),
            last_modified_ms: m.last_modified_ms,
            owner: m.attrs.owner.clone(),
            checksum: m.checksum.as_ref().map(|c| (c.algorithm, c.checksum_type)),
        }
    }
}

/// Bucket metadata, stored in `bucket.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketInfo {
    /// Bucket name.
    pub name: String,
    /// Creation time, Unix milliseconds.
    pub created_ms: i64,
    /// Access key id of the creator.
    pub owner: String,
    /// Canonical id of the owner (absent in buckets created before owners
    /// had canonical ids: then the user with access key `owner` owns it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_id: Option<String>,
    /// The bucket's ACL (grants beyond the owner's full control).
    #[serde(default, skip_serializing_if = "crate::store::acl_is_private")]
    pub acl: Acl,
}

/// Whether an ACL grants nothing beyond the owner (serialization helper).
#[must_use]
pub fn acl_is_private(acl: &Acl) -> bool {
    acl.grants.is_empty()
}

/// The `.acl` file PutObjectAcl writes beside an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct AclOverride {
    /// The object instance it applies to.
    instance: String,
    /// The ACL.
    acl: Acl,
}

#[derive(Debug)]
struct Bucket {
    info: RwLock<BucketInfo>,
    dir: PathBuf,
    state: RwLock<BucketState>,
}

#[derive(Debug, Default)]
struct BucketState {
    deleted: bool,
    index: BTreeMap<String, IndexEntry>,
}

impl Bucket {
    fn objects_dir(&self) -> PathBuf {
        self.dir.join("objects")
    }

    fn object_path(&self, key: &str) -> PathBuf {
        let h = hex::encode(sha2::Sha256::digest(key.as_bytes()));
        self.objects_dir().join(&h[..2]).join(h)
    }

    fn acl_path(&self, key: &str) -> PathBuf {
        let mut p = self.object_path(key).into_os_string();
        p.push(ACL_SUFFIX);
        PathBuf::from(p)
    }
}

/// The object store. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    tmp_dir: PathBuf,
    buckets_dir: PathBuf,
    uploads_dir: PathBuf,
    buckets: RwLock<BTreeMap<String, Arc<Bucket>>>,
    uploads: Mutex<multipart::Uploads>,
    /// Caps on in-progress uploads.
    multipart: MultipartConfig,
    bucket_ops: Mutex<()>,
    /// `.parts`: the data of completed multipart objects.
    parts: Arc<PartsRegistry>,
}

/// The `.parts` directory and the pins open readers hold on its entries.
#[derive(Debug)]
struct PartsRegistry {
    dir: PathBuf,
    pins: Mutex<std::collections::HashMap<String, Weak<PartsPin>>>,
}

impl PartsRegistry {
    /// Pins `.parts/<name>` for a reader (called under the bucket's index
    /// lock, with the object that refers to it just opened).
    fn pin(&self, name: &str) -> Arc<PartsPin> {
        let mut pins = lock(&self.pins);
        if let Some(p) = pins.get(name).and_then(Weak::upgrade) {
            return p;
        }
        pins.retain(|_, w| w.strong_count() > 0);
        let p = Arc::new(PartsPin {
            dir: self.dir.join(name),
            orphaned: AtomicBool::new(false),
        });
        pins.insert(name.to_owned(), Arc::downgrade(&p));
        p
    }

    /// The object that referred to `.parts/<name>` is gone (called under the
    /// bucket's index lock): returns the directory to remove now, or `None`
    /// when readers still use it (the last one removes it).
    fn release(&self, name: &str) -> Option<PathBuf> {
        if !Manifest::valid_dir(name) {
            return None;
        }
        let pin = lock(&self.pins).get(name).and_then(Weak::upgrade);
        match pin {
            Some(p) => {
                p.orphaned.store(true, Ordering::Release);
                None
            }
            None => Some(self.dir.join(name)),
        }
    }
}

/// Keeps a `.parts` directory on disk while readers use it: releasing the
/// object that owns it then only marks the pin, and the last reader's drop
/// removes the directory.
#[derive(Debug)]
struct PartsPin {
    dir: PathBuf,
    orphaned: AtomicBool,
}

impl Drop for PartsPin {
    fn drop(&mut self) {
        if self.orphaned.load(Ordering::Acquire) {
            let dir = std::mem::take(&mut self.dir);
            // Off the caller's thread: it may be an async worker.
            std::thread::spawn(move || remove_parts_dir(&dir));
        }
    }
}

fn remove_parts_dir(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != io::ErrorKind::NotFound
    {
        warn!(dir = %dir.display(), error = %e, "removing the parts of a replaced object failed");
    }
}

/// Locks a std mutex, ignoring poisoning (the data stays consistent because
/// every critical section is a few infallible map updates plus a rename).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}
fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Current time in Unix milliseconds.
#[must_use]
pub fn now_ms() -> i64 {
    let now = time::OffsetDateTime::now_utc();
    i64::try_from(now.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

/// fsyncs a directory so that renames and creations in it are durable.
fn fsync_dir(dir: &Path) -> io::Result<()> {
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
fn ensure_dir(dir: &Path) -> io::Result<()> {
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
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> StoreResult<T> + Send + 'static,
) -> StoreResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Io(io::Error::other(e)))?
}

/// Reads the metadata of an object file through an open handle.
fn read_meta(file: &File, path: &Path) -> StoreResult<ObjectMeta> {
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
struct TmpGuard {
    path: Option<PathBuf>,
    /// Set when the guard removed the file: a creator that comes later
    /// removes what it made.
    removed: Arc<AtomicBool>,
}

impl TmpGuard {
    fn new(path: PathBuf) -> TmpGuard {
        TmpGuard {
            path: Some(path),
            removed: Arc::new(AtomicBool::new(false)),
        }
    }
    fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(""))
    }
    fn disarm(&mut self) {
        self.path = None;
    }
    /// What a blocking task uses to create the file.
    fn creator(&self) -> TmpCreator {
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
struct TmpCreator {
    path: PathBuf,
    removed: Arc<AtomicBool>,
}

impl TmpCreator {
    /// [`create_private_file`], undone when the guard is already gone.
    fn create(&self) -> io::Result<File> {
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

/// Result of streaming a body into a temporary file.
#[derive(Debug)]
struct Written {
    size: u64,
    md5_hex: String,
}

impl Store {
    /// Opens (creating if needed) the store under `root`: deletes leftovers in
    /// `.tmp`, loads buckets, rebuilds the indexes and loads multipart uploads.
    /// Blocking; call before serving.
    ///
    /// # Errors
    /// I/O errors on the data directory.
    pub fn open(root: &Path) -> StoreResult<Store> {
        Self::open_with(root, MultipartConfig::default())
    }

    /// [`Store::open`] with the given caps on multipart uploads.
    ///
    /// # Errors
    /// I/O errors on the data directory.
    pub fn open_with(root: &Path, multipart: MultipartConfig) -> StoreResult<Store> {
        // Stored objects are nobody else's business: the data directory is
        // made 0700 (created so, or tightened when it is ours), refused when
        // another user owns it or it is a symlink.
        s3dma_service::private::ensure_private_dir(root)?;
        let store = Store {
            root: root.to_owned(),
            tmp_dir: root.join(".tmp"),
            buckets_dir: root.join("buckets"),
            uploads_dir: root.join(".uploads"),
            buckets: RwLock::default(),
            uploads: Mutex::default(),
            multipart,
            bucket_ops: Mutex::default(),
            parts: Arc::new(PartsRegistry {
                dir: root.join(".parts"),
                pins: Mutex::default(),
            }),
        };
        let mut removed = 0usize;
        if store.tmp_dir.exists() {
            for e in std::fs::read_dir(&store.tmp_dir)? {
                let p = e?.path();
                if p.is_dir() {
                    std::fs::remove_dir_all(&p)?;
                } else {
                    std::fs::remove_file(&p)?;
                }
                removed += 1;
            }
        }
        ensure_dir(&store.tmp_dir)?;
        ensure_dir(&store.buckets_dir)?;
        ensure_dir(&store.uploads_dir)?;
        ensure_dir(&store.parts.dir)?;
        fsync_dir(&store.tmp_dir)?;
        if removed > 0 {
            info!(removed, "removed leftovers of interrupted writes");
        }
        let mut objects = 0usize;
        let mut buckets = BTreeMap::new();
        for e in std::fs::read_dir(&store.buckets_dir)? {
            let dir = e?.path();
            let info: BucketInfo = match std::fs::read(dir.join("bucket.json"))
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            {
                Ok(i) => i,
                Err(e) => {
                    warn!(dir = %dir.display(), error = %e, "skipping directory without valid bucket.json");
                    continue;
                }
            };
            let bucket = Bucket {
                info: RwLock::new(info),
                dir,
                state: RwLock::default(),
            };
            let index = Self::scan_objects(&bucket.objects_dir())?;
            objects += index.len();
            write(&bucket.state).index = index;
            let name = read(&bucket.info).name.clone();
            buckets.insert(name, Arc::new(bucket));
        }
        let nbuckets = buckets.len();
        let referenced: std::collections::HashSet<String> = buckets
            .values()
            .flat_map(|b| {
                read(&b.state)
                    .index
                    .values()
                    .filter_map(|e| e.manifest.clone())
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut unreferenced = 0usize;
        for e in std::fs::read_dir(&store.parts.dir)? {
            let e = e?;
            let name = e.file_name();
            if !name.to_str().is_some_and(|n| referenced.contains(n)) {
                let p = e.path();
                if p.is_dir() {
                    std::fs::remove_dir_all(&p)?;
                } else {
                    std::fs::remove_file(&p)?;
                }
                unreferenced += 1;
            }
        }
        if unreferenced > 0 {
            info!(
                unreferenced,
                "removed part files no object refers to (interrupted completions)"
            );
        }
        *write(&store.buckets) = buckets;
        let nuploads = store.load_uploads()?;
        info!(root = %root.display(), buckets = nbuckets, objects, uploads = nuploads, "store opened");
        Ok(store)
    }

    fn scan_objects(dir: &Path) -> StoreResult<BTreeMap<String, IndexEntry>> {
        let mut index = BTreeMap::new();
        let Ok(fans) = std::fs::read_dir(dir) else {
            return Ok(index);
        };
        for fan in fans {
            let fan = fan?.path();
            if !fan.is_dir() {
                continue;
            }
            for e in std::fs::read_dir(&fan)? {
                let p = e?.path();
                if p.as_os_str()
                    .as_encoded_bytes()
                    .ends_with(ACL_SUFFIX.as_bytes())
                {
                    continue;
                }
                let meta = File::open(&p)
                    .map_err(StoreError::from)
                    .and_then(|f| read_meta(&f, &p));
                match meta {
                    Ok(m) => {
                        index.insert(m.key.clone(), IndexEntry::from(&m));
                    }
                    Err(e) => {
                        warn!(path = %p.display(), error = %e, "skipping unreadable object file")
                    }
                }
            }
        }
        Ok(index)
    }

    /// The data directory.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn tmp_path(&self) -> TmpGuard {
        TmpGuard::new(self.tmp_dir.join(uuid::Uuid::new_v4().simple().to_string()))
    }

    fn bucket(&self, name: &str) -> StoreResult<Arc<Bucket>> {
        read(&self.buckets)
            .get(name)
            .cloned()
            .ok_or(StoreError::NoSuchBucket)
    }

    // ----- buckets -----------------------------------------------------------

    /// Creates a bucket owned by `owner`.
    ///
    /// # Errors
    /// `InvalidBucketName`, `BucketAlreadyOwnedByYou`, `BucketAlreadyExists`, I/O.
    pub async fn create_bucket(
        self: &Arc<Self>,
        name: &str,
        owner: &str,
        owner_id: &str,
        acl: Acl,
    ) -> StoreResult<BucketInfo> {
        if !bucket_name::is_valid_bucket_name(name) {
            return Err(StoreError::InvalidBucketName);
        }
        let this = Arc::clone(self);
        let info = BucketInfo {
            name: name.to_owned(),
            created_ms: now_ms(),
            owner: owner.to_owned(),
            owner_id: Some(owner_id.to_owned()),
            acl,
        };
        blocking(move || {
            let _g = lock(&this.bucket_ops);
            if let Some(b) = read(&this.buckets).get(&info.name) {
                let existing = read(&b.info);
                let same_owner = match &existing.owner_id {
                    Some(id) => Some(id) == info.owner_id.as_ref(),
                    None => existing.owner == info.owner,
                };
                return Err(if same_owner {
                    StoreError::BucketAlreadyOwnedByYou
                } else {
                    StoreError::BucketAlreadyExists
                });
            }
            let tmp = this.tmp_path();
            create_private_dir(tmp.path())?;
            let meta = tmp.path().join("bucket.json");
            let mut f = create_private_file(&meta)?;
            std::io::Write::write_all(&mut f, &serde_json::to_vec(&info).unwrap_or_default())?;
            f.sync_all()?;
            create_private_dir(&tmp.path().join("objects"))?;
            fsync_dir(tmp.path())?;
            let dir = this.buckets_dir.join(&info.name);
            std::fs::rename(tmp.path(), &dir)?;
            let mut tmp = tmp;
            tmp.disarm();
            fsync_dir(&this.buckets_dir)?;
            let bucket = Arc::new(Bucket {
                info: RwLock::new(info.clone()),
                dir,
                state: RwLock::default(),
            });
            write(&this.buckets).insert(info.name.clone(), bucket);
            info!(bucket = %s3dma_service::Escaped(&info.name), "bucket created");
            Ok(info)
        })
        .await
    }

    /// Returns a bucket's metadata.
    ///
    /// # Errors
    /// `NoSuchBucket`.
    pub fn head_bucket(&self, name: &str) -> StoreResult<BucketInfo> {
        Ok(read(&self.bucket(name)?.info).clone())
    }

    /// Replaces a bucket's ACL (`bucket.json` rewritten atomically).
    ///
    /// # Errors
    /// `NoSuchBucket`, I/O.
    pub async fn set_bucket_acl(self: &Arc<Self>, name: &str, acl: Acl) -> StoreResult<()> {
        let this = Arc::clone(self);
        let name = name.to_owned();
        blocking(move || {
            let _g = lock(&this.bucket_ops);
            let b = this.bucket(&name)?;
            let mut info = read(&b.info).clone();
            info.acl = acl;
            let tmp = this.tmp_path();
            let mut f = create_private_file(tmp.path())?;
            std::io::Write::write_all(&mut f, &serde_json::to_vec(&info).unwrap_or_default())?;
            f.sync_all()?;
            std::fs::rename(tmp.path(), b.dir.join("bucket.json"))?;
            let mut tmp = tmp;
            tmp.disarm();
            fsync_dir(&b.dir)?;
            *write(&b.info) = info;
            Ok(())
        })
        .await
    }

    /// All buckets, by name.
    #[must_use]
    pub fn list_buckets(&self) -> Vec<BucketInfo> {
        read(&self.buckets)
            .values()
            .map(|b| read(&b.info).clone())
            .collect()
    }

    /// Deletes an empty bucket and any in-progress multipart uploads in it.
    ///
    /// # Errors
    /// `NoSuchBucket`, `BucketNotEmpty`, I/O.
    pub async fn delete_bucket(self: &Arc<Self>, name: &str) -> StoreResult<()> {
        let this = Arc::clone(self);
        let name = name.to_owned();
        let uploads: Vec<String> = blocking(move || {
            let _g = lock(&this.bucket_ops);
            let b = this.bucket(&name)?;
            {
                let mut st = write(&b.state);
                if !st.index.is_empty() {
                    return Err(StoreError::BucketNotEmpty);
                }
                st.deleted = true;
            }
            write(&this.buckets).remove(&name);
            let tmp = this.tmp_path();
            std::fs::rename(&b.dir, tmp.path())?;
            fsync_dir(&this.buckets_dir)?;
            std::fs::remove_dir_all(tmp.path())?;
            info!(bucket = %s3dma_service::Escaped(&name), "bucket deleted");
            Ok(lock(&this.uploads)
                .by_id
                .values()
                .filter(|u| u.info.bucket == name)
                .map(|u| u.info.upload_id.clone())
                .collect())
        })
        .await?;
        for id in uploads {
            if let Err(e) = self.remove_upload(&id).await {
                warn!(upload_id = %id, error = %e, "removing upload of deleted bucket failed");
            }
        }
        Ok(())
    }

    // ----- objects -----------------------------------------------------------

    /// Streams `body` into a new temporary file, hashing it; returns the open
    /// file (positioned at the end of the data).
    ///
    /// Bodies up to [`IO_CHUNK`] are hashed and written in one blocking
    /// call; larger ones in two pipelined stages (below). The request's own
    /// checksums are checked here as the bytes pass.
    async fn write_body<S>(
        &self,
        tmp: &TmpGuard,
        mut body: S,
        check: &mut dyn BodyCheck,
    ) -> StoreResult<(tokio::fs::File, Written)>
    where
        S: Stream<Item = Result<Bytes, BodyError>> + Send + Unpin,
    {
        /// Chunks waiting for each stage: enough to cover a slow write.
        const QUEUE: usize = 8;
        // A small body (most requests) is gathered first, then hashed and
        // written in one blocking call: starting two stages would cost more
        // than it saves.
        let mut head: Vec<Bytes> = Vec::new();
        let mut size = 0u64;
        let mut ended = false;
        while size < IO_CHUNK as u64 {
            let Some(chunk) = body.next().await else {
                ended = true;
                break;
            };
            let chunk = chunk.map_err(StoreError::Body)?;
            size += chunk.len() as u64;
            if size > MAX_PUT_SIZE {
                return Err(StoreError::EntityTooLarge);
            }
            check.update(&chunk);
            head.push(chunk);
        }
        let creator = tmp.creator();
        if ended {
            let (file, md5_hex) = blocking(move || {
                use std::io::Write as _;
                let mut f = creator.create()?;
                let mut md5 = Md5::new();
                for chunk in &head {
                    md5.update(chunk);
                }
                if let [one] = head.as_slice() {
                    f.write_all(one)?;
                } else {
                    // One write for many small frames.
                    let mut all = BytesMut::with_capacity(usize::try_from(size).unwrap_or(0));
                    for chunk in &head {
                        all.extend_from_slice(chunk);
                    }
                    f.write_all(&all)?;
                }
                Ok((f, hex::encode(md5.finalize())))
            })
            .await?;
            check.finish()?;
            return Ok((tokio::fs::File::from_std(file), Written { size, md5_hex }));
        }
        // A large body: hashing and writing are two stages of their own, fed
        // through short queues, so the next chunk is received while the last
        // is hashed and written, and the write never waits for MD5 (the
        // slowest step of a PUT).
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(QUEUE);
        let (htx, mut hrx) = tokio::sync::mpsc::channel::<Bytes>(QUEUE);
        let hasher = tokio::task::spawn_blocking(move || {
            let mut md5 = Md5::new();
            while let Some(chunk) = hrx.blocking_recv() {
                md5.update(&chunk);
            }
            hex::encode(md5.finalize())
        });
        let writer = tokio::task::spawn_blocking(move || -> io::Result<File> {
            use std::io::Write as _;
            let mut w = std::io::BufWriter::with_capacity(IO_CHUNK, creator.create()?);
            while let Some(chunk) = rx.blocking_recv() {
                w.write_all(&chunk)?;
            }
            w.into_inner().map_err(std::io::IntoInnerError::into_error)
        });
        let fed = async {
            let mut pending = head.into_iter();
            loop {
                let chunk = match pending.next() {
                    Some(c) => c,
                    None => match body.next().await {
                        None => break,
                        Some(chunk) => {
                            let chunk = chunk.map_err(StoreError::Body)?;
                            size += chunk.len() as u64;
                            if size > MAX_PUT_SIZE {
                                return Err(StoreError::EntityTooLarge);
                            }
                            check.update(&chunk);
                            chunk
                        }
                    },
                };
                if htx.send(chunk.clone()).await.is_err() || tx.send(chunk).await.is_err() {
                    // The writer stopped: its error says why.
                    break;
                }
            }
            Ok(())
        }
        .await;
        drop((tx, htx));
        let written = writer.await.map_err(io::Error::other);
        let md5_hex = hasher.await.map_err(io::Error::other)?;
        fed?;
        let file = written??;
        check.finish()?;
        Ok((tokio::fs::File::from_std(file), Written { size, md5_hex }))
    }

    /// Appends the header to a data file and makes it durable.
    async fn seal(mut file: tokio::fs::File, meta: &ObjectMeta) -> StoreResult<()> {
        file.write_all(&format::encode_trailer(meta)).await?;
        file.flush().await?;
        file.sync_all().await?;
        Ok(())
    }

    /// Atomically publishes a sealed temporary file as `key` in bucket `b`.
    async fn publish(
        &self,
        b: Arc<Bucket>,
        mut tmp: TmpGuard,
        meta: &ObjectMeta,
    ) -> StoreResult<()> {
        let key = meta.key.clone();
        let entry = IndexEntry::from(meta);
        let src = tmp.path().to_owned();
        tmp.disarm();
        let mut guard = TmpGuard::new(src.clone());
        let this = Arc::clone(&self.parts);
        blocking(move || {
            let path = b.object_path(&key);
            let dir = path.parent().unwrap_or(Path::new("/")).to_owned();
            ensure_dir(&dir)?;
            let released = {
                let mut st = write(&b.state);
                if st.deleted {
                    return Err(StoreError::NoSuchBucket);
                }
                std::fs::rename(&src, &path)?;
                guard.disarm();
                st.index
                    .insert(key, entry)
                    .and_then(|old| old.manifest)
                    .and_then(|m| this.release(&m))
            };
            fsync_dir(&dir)?;
            if let Some(p) = released {
                remove_parts_dir(&p);
            }
            Ok(())
        })
        .await
    }

    /// Stores an object from any byte source. `content_md5_hex`, if given, must
    /// equal the MD5 of the body (`BadDigest`). Nothing is visible until the
    /// whole body has been received, checked and made durable.
    ///
    /// # Errors
    /// `NoSuchBucket`, `BadDigest`, `EntityTooLarge`, `Body`, check errors, I/O.
    pub async fn put_object<S>(
        &self,
        bucket: &str,
        key: &str,
        attrs: ObjectAttrs,
        body: S,
        content_md5_hex: Option<&str>,
        check: &mut dyn BodyCheck,
    ) -> StoreResult<ObjectMeta>
    where
        S: Stream<Item = Result<Bytes, BodyError>> + Send + Unpin,
    {
        let b = self.bucket(bucket)?;
        let tmp = self.tmp_path();
        let (file, written) = self.write_body(&tmp, body, check).await?;
        if let Some(expect) = content_md5_hex
            && expect != written.md5_hex
        {
            return Err(StoreError::BadDigest);
        }
        let meta = ObjectMeta {
            key: key.to_owned(),
            size: written.size,
            etag: written.md5_hex,
            last_modified_ms: now_ms(),
            parts_count: None,
            part_number: None,
            attrs,
            checksum: check.checksum(),
            parts: Vec::new(),
            manifest: None,
        };
        Self::seal(file, &meta).await?;
        self.publish(b, tmp, &meta).await?;
        Ok(meta)
    }

    /// Opens an object for reading. The reader keeps reading the version it
    /// opened even if the object is replaced or deleted meanwhile.
    ///
    /// # Errors
    /// `NoSuchBucket`, `NoSuchKey`, `Corrupt`, I/O.
    pub async fn open_object(&self, bucket: &str, key: &str) -> StoreResult<ObjectReader> {
        let b = self.bucket(bucket)?;
        let key = key.to_owned();
        let parts = Arc::clone(&self.parts);
        blocking(move || {
            let path = b.object_path(&key);
            // Opened and pinned under the index lock, so that a delete or
            // overwrite cannot remove the part files in between.
            let _st = read(&b.state);
            let file = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(StoreError::NoSuchKey),
                Err(e) => return Err(e.into()),
            };
            let meta = read_meta(&file, &path)?;
            if meta.key != key {
                return Err(StoreError::NoSuchKey);
            }
            let data = match &meta.manifest {
                None => Data::File(Arc::new(file)),
                Some(m) => Data::Parts(Arc::new(PartFiles::new(&meta, m, &parts))),
            };
            Ok(ObjectReader { meta, data })
        })
        .await
    }

    /// Deletes an object; deleting a missing key succeeds (as in S3).
    ///
    /// # Errors
    /// `NoSuchBucket`, I/O.
    pub async fn delete_object(&self, bucket: &str, key: &str) -> StoreResult<()> {
        let b = self.bucket(bucket)?;
        let key = key.to_owned();
        let parts = Arc::clone(&self.parts);
        blocking(move || {
            let path = b.object_path(&key);
            let released = {
                let mut st = write(&b.state);
                let Some(old) = st.index.remove(&key) else {
                    return Ok(());
                };
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e.into()),
                }
                match std::fs::remove_file(b.acl_path(&key)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e.into()),
                }
                old.manifest.and_then(|m| parts.release(&m))
            };
            if let Some(dir) = path.parent() {
                fsync_dir(dir)?;
            }
            if let Some(p) = released {
                remove_parts_dir(&p);
            }
            Ok(())
        })
        .await
    }

    /// Copies an object (server side). `attrs` = `None` keeps the source's
    /// attributes (metadata directive COPY); the ETag and part count are kept.
    /// The source's checksum (and parts) are kept, unless `compute` names an
    /// algorithm: then the data is read, that full-object checksum computed
    /// over it and stored instead (the parts keep their sizes only).
    ///
    /// # Errors
    /// `NoSuchBucket`, `NoSuchKey`, I/O.
    pub async fn copy_object(
        &self,
        src: &ObjectReader,
        dst_bucket: &str,
        dst_key: &str,
        attrs: Option<ObjectAttrs>,
        compute: Option<crate::checksum::Algorithm>,
    ) -> StoreResult<ObjectMeta> {
        let b = self.bucket(dst_bucket)?;
        let tmp = self.tmp_path();
        let mut meta = ObjectMeta {
            key: dst_key.to_owned(),
            size: src.meta.size,
            etag: src.meta.etag.clone(),
            last_modified_ms: now_ms(),
            parts_count: src.meta.parts_count,
            part_number: None,
            attrs: attrs.unwrap_or_else(|| src.meta.attrs.clone()),
            checksum: src.meta.checksum.clone(),
            parts: src.meta.parts.clone(),
            manifest: None,
        };
        let from = src.clone();
        let to = tmp.creator();
        let size = src.meta.size;
        let computed = blocking(move || {
            let mut out = to.create()?;
            let mut input: Box<dyn io::Read> = match &from.data {
                // std::io::copy uses copy_file_range between files.
                Data::File(f) => {
                    let mut f = f.try_clone()?;
                    f.seek(SeekFrom::Start(0))?;
                    Box::new(f.take(size))
                }
                Data::Parts(_) => Box::new(ReadCursor {
                    reader: from.clone(),
                    pos: 0,
                }),
            };
            let (n, sum) = match compute {
                None => (io::copy(&mut input, &mut out)?, None),
                Some(a) => {
                    let mut h = crate::checksum::Hasher::new(a);
                    let mut buf = vec![0u8; IO_CHUNK];
                    let mut n = 0u64;
                    loop {
                        let k = input.read(&mut buf)?;
                        if k == 0 {
                            break;
                        }
                        h.update(&buf[..k]);
                        std::io::Write::write_all(&mut out, &buf[..k])?;
                        n += k as u64;
                    }
                    (
                        n,
                        Some(crate::checksum::StoredChecksum::full(a, &h.finalize())),
                    )
                }
            };
            if n != size {
                return Err(StoreError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "source object shrank while copying",
                )));
            }
            Ok((out, sum))
        })
        .await?;
        let (mut out, sum) = computed;
        if let Some(sum) = sum {
            meta.checksum = Some(sum);
            for p in &mut meta.parts {
                p.checksum = None;
            }
        }
        let trailer = format::encode_trailer(&meta);
        blocking(move || {
            std::io::Write::write_all(&mut out, &trailer)?;
            out.sync_all()?;
            Ok(())
        })
        .await?;
        self.publish(b, tmp, &meta).await?;
        Ok(meta)
    }

    /// The ACL PutObjectAcl set on the object instance `meta` describes, if
    /// any (otherwise the ACL in its header applies).
    ///
    /// # Errors
    /// `NoSuchBucket`, I/O.
    pub async fn object_acl_override(
        &self,
        bucket: &str,
        meta: &ObjectMeta,
    ) -> StoreResult<Option<Acl>> {
        let b = self.bucket(bucket)?;
        let key = meta.key.clone();
        let instance = meta.instance();
        blocking(move || {
            let bytes = match std::fs::read(b.acl_path(&key)) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            Ok(serde_json::from_slice::<AclOverride>(&bytes)
                .ok()
                .filter(|o| o.instance == instance)
                .map(|o| o.acl))
        })
        .await
    }

    /// Sets the ACL of the object instance `meta` describes (a later write of
    /// the key does not inherit it).
    ///
    /// # Errors
    /// `NoSuchBucket`, I/O.
    pub async fn set_object_acl(
        &self,
        bucket: &str,
        meta: &ObjectMeta,
        acl: Acl,
    ) -> StoreResult<()> {
        let b = self.bucket(bucket)?;
        let key = meta.key.clone();
        let body = serde_json::to_vec(&AclOverride {
            instance: meta.instance(),
            acl,
        })
        .unwrap_or_default();
        let tmp = self.tmp_path();
        blocking(move || {
            let mut f = create_private_file(tmp.path())?;
            std::io::Write::write_all(&mut f, &body)?;
            f.sync_all()?;
            let path = b.acl_path(&key);
            if read(&b.state).deleted {
                return Err(StoreError::NoSuchBucket);
            }
            std::fs::rename(tmp.path(), &path)?;
            let mut tmp = tmp;
            tmp.disarm();
            if let Some(dir) = path.parent() {
                fsync_dir(dir)?;
            }
            Ok(())
        })
        .await
    }

    /// One page of a bucket listing. The index lock is held for one page's
    /// work: at most `max_keys + 1` entries read, each one ordered-map step
    /// or seek (see [`listing::list`]), however many keys the bucket holds.
    ///
    /// # Errors
    /// `NoSuchBucket`.
    pub fn list_objects(
        &self,
        bucket: &str,
        params: &listing::ListParams<'_>,
    ) -> StoreResult<listing::ListPage<IndexEntry>> {
        let b = self.bucket(bucket)?;
        let st = read(&b.state);
        Ok(listing::list(&st.index, params))
    }
}

/// An open object: its metadata and a handle on the exact version opened.
#[derive(Debug, Clone)]
pub struct ObjectReader {
    /// Metadata of the opened version.
    pub meta: ObjectMeta,
    data: Data,
}

/// Where an open object's bytes are.
#[derive(Debug, Clone)]
enum Data {
    /// Bytes `0..size` of the object file.
    File(Arc<File>),
    /// The part files of a completed multipart upload.
    Parts(Arc<PartFiles>),
}

/// A multipart object's part files, opened on first use (an object may
/// have 10,000), kept on disk by the pin while the reader lives.
#[derive(Debug)]
struct PartFiles {
    dir: PathBuf,
    numbers: Vec<u32>,
    /// End offset of each part in the object.
    ends: Vec<u64>,
    files: Vec<OnceLock<Arc<File>>>,
    _pin: Arc<PartsPin>,
}

impl PartFiles {
    fn new(meta: &ObjectMeta, m: &Manifest, parts: &PartsRegistry) -> PartFiles {
        let mut end = 0u64;
        PartFiles {
            dir: parts.dir.join(&m.dir),
            numbers: m.part_numbers.clone(),
            ends: meta
                .parts
                .iter()
                .map(|p| {
                    end += p.size;
                    end
                })
                .collect(),
            files: m.part_numbers.iter().map(|_| OnceLock::new()).collect(),
            _pin: parts.pin(&m.dir),
        }
    }

    /// The part holding object byte `offset`: its index and start offset.
    fn locate(&self, offset: u64) -> (usize, u64) {
        let i = self.ends.partition_point(|&e| e <= offset);
        (i, if i == 0 { 0 } else { self.ends[i - 1] })
    }

    fn file(&self, i: usize) -> io::Result<&Arc<File>> {
        if let Some(f) = self.files[i].get() {
            return Ok(f);
        }
        let f = File::open(self.dir.join(multipart::part_file_name(self.numbers[i])))?;
        let _ = self.files[i].set(Arc::new(f));
        Ok(self.files[i].get().expect("just set"))
    }
}

/// [`io::Read`] over an [`ObjectReader`] from a position.
struct ReadCursor {
    reader: ObjectReader,
    pos: u64,
}

impl io::Read for ReadCursor {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.reader.read_at(self.pos, buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl ObjectReader {
    /// Reads object bytes at `offset` into `buf` (blocking `pread`); returns
    /// the number of bytes read, 0 at the end of the data (fewer than asked
    /// at a part boundary of a multipart object). Suited to filling
    /// registered (RDMA) staging buffers.
    ///
    /// # Errors
    /// I/O errors.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        if offset >= self.meta.size {
            return Ok(0);
        }
        let max = usize::try_from(self.meta.size - offset).unwrap_or(usize::MAX);
        let n = buf.len().min(max);
        match &self.data {
            Data::File(f) => f.read_at(&mut buf[..n], offset),
            Data::Parts(p) => {
                let (i, start) = p.locate(offset);
                let in_part = usize::try_from(p.ends[i] - offset).unwrap_or(usize::MAX);
                p.file(i)?
                    .read_at(&mut buf[..n.min(in_part)], offset - start)
            }
        }
    }

    /// The files and file ranges that hold object bytes `range`, in order:
    /// `(file, offset in the file, length)`. Published object and part files
    /// never change, so the kernel may send straight from them
    /// (`sendfile`). Blocking (opens part files on first use).
    ///
    /// # Errors
    /// Opening a part file failed.
    pub fn file_ranges(
        &self,
        range: std::ops::Range<u64>,
    ) -> io::Result<Vec<(Arc<File>, u64, u64)>> {
        let end = range.end.min(self.meta.size);
        let mut pos = range.start.min(end);
        let mut out = Vec::new();
        match &self.data {
            Data::File(f) => {
                if end > pos {
                    out.push((Arc::clone(f), pos, end - pos));
                }
            }
            Data::Parts(p) => {
                while pos < end {
                    let (i, start) = p.locate(pos);
                    let n = p.ends[i].min(end) - pos;
                    out.push((Arc::clone(p.file(i)?), pos - start, n));
                    pos += n;
                }
            }
        }
        Ok(out)
    }

    /// Streams the bytes in `range` with a bounded buffer (one [`IO_CHUNK`]
    /// read ahead at a time).
    #[must_use]
    pub fn stream(&self, range: std::ops::Range<u64>) -> RangeStream {
        let end = range.end.min(self.meta.size);
        RangeStream {
            reader: self.clone(),
            pos: range.start.min(end),
            end,
            pending: None,
        }
    }
}

/// A stream of an object's byte range; see [`ObjectReader::stream`].
#[derive(Debug)]
pub struct RangeStream {
    reader: ObjectReader,
    pos: u64,
    end: u64,
    pending: Option<tokio::task::JoinHandle<io::Result<Bytes>>>,
}

impl RangeStream {
    /// Bytes not yet yielded.
    #[must_use]
    pub fn remaining(&self) -> u64 {
        self.end - self.pos
    }
}

impl Stream for RangeStream {
    type Item = io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(h) = this.pending.as_mut() {
                let res = ready!(Pin::new(h).poll(cx));
                this.pending = None;
                let res = res.map_err(io::Error::other).and_then(|r| r);
                return Poll::Ready(Some(match res {
                    Ok(b) if b.is_empty() => Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "object file shorter than its header says",
                    )),
                    Ok(b) => {
                        this.pos += b.len() as u64;
                        Ok(b)
                    }
                    Err(e) => {
                        this.pos = this.end;
                        Err(e)
                    }
                }));
            }
            if this.pos >= this.end {
                return Poll::Ready(None);
            }
            let n = usize::try_from(this.end - this.pos)
                .unwrap_or(IO_CHUNK)
                .min(IO_CHUNK);
            let reader = this.reader.clone();
            let pos = this.pos;
            this.pending = Some(tokio::task::spawn_blocking(move || {
                let mut buf = BytesMut::zeroed(n);
                let mut filled = 0;
                while filled < n {
                    let k = reader.read_at(pos + filled as u64, &mut buf[filled..])?;
                    if k == 0 {
                        break;
                    }
                    filled += k;
                }
                buf.truncate(filled);
                Ok(buf.freeze())
            }));
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, None)
    }
}

#[cfg(test)]
mod tmp_guard_tests {
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
