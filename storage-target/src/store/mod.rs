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
//! [`Store::upload_part`] take any stream of [`Bytes`](bytes::Bytes), and an
//! [`ObjectReader`] serves any byte range with [`ObjectReader::read_at`] (into
//! any buffer, e.g. RDMA staging memory) or [`ObjectReader::stream`].
//!
//! Modules: [`format`](mod@format) (the object file), [`listing`], [`conditions`],
//! [`etag`] (pure helpers); privately, `write` (the write pipeline,
//! PutObject, CopyObject), `reader` ([`ObjectReader`], [`RangeStream`]),
//! `object` (open, delete, object ACLs, listing), `bucket`, `multipart`,
//! `index` (buckets in memory), `parts` (`.parts` and its pins), `fsio`
//! (private files, fsyncs, temporary files) and `error` ([`StoreError`]).

mod bucket;
pub mod conditions;
mod error;
pub mod etag;
pub mod format;
mod fsio;
mod index;
pub mod listing;
#[cfg(test)]
mod manifest_tests;
mod multipart;
mod object;
mod parts;
mod reader;
mod write;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use tracing::{info, warn};

pub use self::error::{BodyError, StoreError, StoreResult};
pub use self::format::{FormatError, Manifest, ObjectAttrs, ObjectMeta, PartMeta};
pub use self::fsio::now_ms;
use self::fsio::{TmpGuard, blocking, ensure_dir, fsync_dir, lock, read, read_meta, write};
pub(crate) use self::fsio::{create_private_dir, create_private_file};
use self::index::{AclOverride, Bucket};
pub use self::index::{BucketInfo, HeadAttrs, IndexEntry, acl_is_private};
pub use self::multipart::{PartInfo, UploadInfo, UploadsPage};
use self::parts::{PartsPin, PartsRegistry, remove_parts_dir};
use self::reader::{Data, PartFiles, ReadCursor};
pub use self::reader::{INLINE_READ_MAX, ObjectReader, RangeStream};
pub use self::write::{BodyCheck, NoCheck};
pub use crate::config::bucket_name;
pub use crate::config::multipart::{MIN_PART_SIZE, MultipartConfig};

/// Suffix of the file PutObjectAcl writes beside an object.
const ACL_SUFFIX: &str = ".acl";

/// Largest object accepted by a single PutObject (and largest part): 5 GiB.
pub const MAX_PUT_SIZE: u64 = 5 << 30;

/// Read/write buffer size of the streaming paths.
pub const IO_CHUNK: usize = 1 << 20;

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
}
