//! Multipart uploads: parts live under `.uploads/<upload-id>/` (surviving
//! restarts); Complete hard-links the chosen parts into a new `.parts/<id>/`
//! and publishes an object file that is a manifest of them, atomically,
//! without copying any data.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::Stream;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::format::{ObjectAttrs, ObjectMeta};
use super::listing;
use super::{
    BodyCheck, BodyError, MAX_PUT_SIZE, Store, StoreError, StoreResult, TmpGuard, blocking,
    fsync_dir, lock, now_ms, read_meta,
};
use crate::checksum::{StoredChecksum, UploadChecksum};

mod complete;

#[cfg(test)]
use {super::MIN_PART_SIZE, complete::select_parts};

/// Highest part number S3 allows.
pub(super) const MAX_PART_NUMBER: u32 = 10_000;

/// An in-progress multipart upload, stored in `upload.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadInfo {
    /// Upload id: 32 lowercase hex digits.
    pub upload_id: String,
    /// Target bucket.
    pub bucket: String,
    /// Target key.
    pub key: String,
    /// Initiation time, Unix milliseconds.
    pub initiated_ms: i64,
    /// Access key id of the initiator (empty: anonymous).
    pub initiator: String,
    /// Canonical id of the initiator (absent in uploads created before it
    /// was recorded: then the user with access key `initiator`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initiator_id: Option<String>,
    /// Attributes the completed object will carry.
    pub attrs: ObjectAttrs,
    /// The checksum algorithm and type chosen at creation (every part must
    /// carry a checksum of that algorithm); none for uploads without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<UploadChecksum>,
}

/// One uploaded part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartInfo {
    /// Part number (1..=10000).
    pub part_number: u32,
    /// Size in bytes.
    pub size: u64,
    /// ETag (hex MD5) without quotes.
    pub etag: String,
    /// Upload time, Unix milliseconds.
    pub last_modified_ms: i64,
    /// The part's checksum (FULL_OBJECT over the part), when it carried one.
    pub checksum: Option<StoredChecksum>,
}

#[derive(Debug)]
pub(super) struct Upload {
    pub(super) info: UploadInfo,
    /// `true` once completed or aborted; held while parts are published and
    /// while Complete assembles, so neither races the other.
    gone: tokio::sync::Mutex<bool>,
    /// The size of each stored part, by number (what the upload counts
    /// against its initiator's caps); changed under the store's uploads
    /// lock.
    sizes: Mutex<BTreeMap<u32, u64>>,
}

impl Upload {
    fn new(info: UploadInfo, sizes: BTreeMap<u32, u64>) -> Arc<Upload> {
        Arc::new(Upload {
            info,
            gone: tokio::sync::Mutex::new(false),
            sizes: Mutex::new(sizes),
        })
    }
}

/// What one user's in-progress uploads hold, reservations of parts being
/// written included.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Usage {
    uploads: usize,
    parts: usize,
    bytes: u64,
}

/// The in-progress uploads: by id, in ListMultipartUploads order, and
/// what each user's hold.
#[derive(Debug, Default)]
pub(super) struct Uploads {
    pub(super) by_id: BTreeMap<String, Arc<Upload>>,
    /// (bucket, key, initiation time, id) of every upload.
    ordered: BTreeSet<(String, String, i64, String)>,
    usage: HashMap<String, Usage>,
    /// UploadPartCopy budgets, by access key (empty: every anonymous
    /// caller together).
    copies: HashMap<String, CopyBudget>,
}

/// A token bucket of bytes: holds at most one minute's budget and refills
/// at `per_minute` bytes a minute; a take that does not fit what is left
/// takes nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct CopyBudget {
    /// Bytes left at `at`.
    left: f64,
    at: std::time::Instant,
}

impl CopyBudget {
    /// A full bucket of `per_minute` bytes at `now`.
    pub(super) fn full(per_minute: u64, now: std::time::Instant) -> CopyBudget {
        #[allow(clippy::cast_precision_loss)]
        CopyBudget {
            left: per_minute as f64,
            at: now,
        }
    }

    /// Refills to `now`, then takes `bytes` if they fit; whether they did.
    pub(super) fn take(&mut self, per_minute: u64, bytes: u64, now: std::time::Instant) -> bool {
        #[allow(clippy::cast_precision_loss)]
        let (cap, bytes) = (per_minute as f64, bytes as f64);
        let secs = now.saturating_duration_since(self.at).as_secs_f64();
        self.left = (self.left + cap * secs / 60.0).min(cap);
        self.at = now.max(self.at);
        if bytes <= self.left {
            self.left -= bytes;
            true
        } else {
            false
        }
    }

    /// Whether the bucket is full again at `now` (the same as a new one:
    /// it may be forgotten).
    fn is_full(&self, per_minute: u64, now: std::time::Instant) -> bool {
        let mut b = *self;
        b.take(per_minute, 0, now);
        #[allow(clippy::cast_precision_loss)]
        let cap = per_minute as f64;
        b.left >= cap
    }
}

fn order_key(i: &UploadInfo) -> (String, String, i64, String) {
    (
        i.bucket.clone(),
        i.key.clone(),
        i.initiated_ms,
        i.upload_id.clone(),
    )
}

impl Uploads {
    fn insert(&mut self, u: Arc<Upload>) {
        let sizes = lock(&u.sizes);
        let usage = self.usage.entry(u.info.initiator.clone()).or_default();
        usage.uploads += 1;
        usage.parts += sizes.len();
        usage.bytes += sizes.values().sum::<u64>();
        drop(sizes);
        self.ordered.insert(order_key(&u.info));
        self.by_id.insert(u.info.upload_id.clone(), u);
    }

    /// Removes an upload, releasing what it counted against its initiator.
    pub(super) fn remove(&mut self, id: &str) -> Option<Arc<Upload>> {
        let u = self.by_id.remove(id)?;
        self.ordered.remove(&order_key(&u.info));
        let sizes = lock(&u.sizes);
        if let Some(usage) = self.usage.get_mut(&u.info.initiator) {
            usage.uploads = usage.uploads.saturating_sub(1);
            usage.parts = usage.parts.saturating_sub(sizes.len());
            usage.bytes = usage.bytes.saturating_sub(sizes.values().sum::<u64>());
            if *usage == Usage::default() {
                self.usage.remove(&u.info.initiator);
            }
        }
        drop(sizes);
        Some(u)
    }
}

/// A part being written: its declared bytes (and a part slot, for a new
/// part number) held against the initiator's caps until the part is
/// stored or fails.
#[derive(Debug)]
struct Reservation<'a> {
    uploads: &'a Mutex<Uploads>,
    user: String,
    bytes: u64,
    parts: usize,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut ups = lock(self.uploads);
        if let Some(u) = ups.usage.get_mut(&self.user) {
            u.bytes = u.bytes.saturating_sub(self.bytes);
            u.parts = u.parts.saturating_sub(self.parts);
        }
    }
}

/// One page of ListMultipartUploads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UploadsPage {
    /// Uploads in (key, initiation time) order.
    pub uploads: Vec<UploadInfo>,
    /// Common prefixes, in order.
    pub common_prefixes: Vec<String>,
    /// Whether more follow.
    pub is_truncated: bool,
    /// Where the next page starts: key and upload id (none after a common
    /// prefix).
    pub next: Option<(String, Option<String>)>,
    /// Uploads the listing read (at most `max + 1`).
    pub visited: usize,
}

fn valid_upload_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

pub(super) fn part_file_name(n: u32) -> String {
    format!("part-{n:05}")
}

/// The file size of each `part-NNNNN` in `dir` (what an upload whose part
/// headers cannot be read counts).
fn part_file_sizes(dir: &std::path::Path) -> BTreeMap<u32, u64> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let n = e
                .file_name()
                .to_str()?
                .strip_prefix("part-")?
                .parse::<u32>()
                .ok()?;
            Some((n, e.metadata().ok()?.len()))
        })
        .collect()
}

impl Store {
    fn upload_dir(&self, id: &str) -> PathBuf {
        self.uploads_dir.join(id)
    }

    pub(super) fn load_uploads(&self) -> StoreResult<usize> {
        let mut map = BTreeMap::new();
        for e in std::fs::read_dir(&self.uploads_dir)? {
            let dir = e?.path();
            // Unreadable or malformed: the directory is removed below.
            let info: Option<UploadInfo> = std::fs::read(dir.join("upload.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            match info {
                Some(info) if valid_upload_id(&info.upload_id) => {
                    // What the upload counts against its initiator's caps.
                    let sizes = match Self::read_parts(&dir) {
                        Ok(parts) => parts.into_iter().map(|(n, p)| (n, p.size)).collect(),
                        Err(e) => {
                            warn!(dir = %dir.display(), error = %e, "reading the parts of a multipart upload failed; counting their file sizes");
                            part_file_sizes(&dir)
                        }
                    };
                    map.insert(info.upload_id.clone(), Upload::new(info, sizes));
                }
                Some(_) | None => {
                    warn!(dir = %dir.display(), "removing malformed multipart upload directory");
                    let _ = std::fs::remove_dir_all(&dir);
                }
            }
        }
        let n = map.len();
        let mut ups = Uploads::default();
        for u in map.into_values() {
            ups.insert(u);
        }
        *lock(&self.uploads) = ups;
        Ok(n)
    }

    fn upload(&self, bucket: &str, key: &str, id: &str) -> StoreResult<Arc<Upload>> {
        if !valid_upload_id(id) {
            return Err(StoreError::NoSuchUpload);
        }
        self.bucket(bucket)?;
        let u = lock(&self.uploads)
            .by_id
            .get(id)
            .cloned()
            .ok_or(StoreError::NoSuchUpload)?;
        if u.info.bucket != bucket || u.info.key != key {
            return Err(StoreError::NoSuchUpload);
        }
        Ok(u)
    }

    /// An in-progress upload's metadata (its checksum algorithm, for
    /// UploadPart to check a part before its body is read).
    ///
    /// # Errors
    /// `NoSuchBucket`, `NoSuchUpload`.
    pub fn upload_info(&self, bucket: &str, key: &str, upload_id: &str) -> StoreResult<UploadInfo> {
        Ok(self.upload(bucket, key, upload_id)?.info.clone())
    }

    /// Starts a multipart upload for the user with access key `initiator`
    /// and canonical id `initiator_id`; returns its id.
    ///
    /// # Errors
    /// `NoSuchBucket`, `QuotaExceeded` (the initiator has
    /// `max_open_uploads_per_user` uploads in progress), I/O.
    pub async fn create_upload(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
        attrs: ObjectAttrs,
        (initiator, initiator_id): (&str, Option<&str>),
        checksum: Option<UploadChecksum>,
    ) -> StoreResult<UploadInfo> {
        self.bucket(bucket)?;
        let info = UploadInfo {
            upload_id: uuid::Uuid::new_v4().simple().to_string(),
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            initiated_ms: now_ms(),
            initiator: initiator.to_owned(),
            initiator_id: initiator_id.map(str::to_owned),
            attrs,
            checksum,
        };
        // Counted at once (a slot held while the upload is made), so that
        // concurrent creations cannot pass the cap together.
        let max = self.multipart.max_open_uploads_per_user;
        {
            let mut ups = lock(&self.uploads);
            let usage = ups.usage.entry(info.initiator.clone()).or_default();
            if usage.uploads >= max {
                return Err(StoreError::QuotaExceeded(format!(
                    "You have {} multipart uploads in progress, the most this server allows one user (multipart.max_open_uploads_per_user); complete or abort some first.",
                    usage.uploads
                )));
            }
            usage.uploads += 1;
        }
        let slot = UploadSlot {
            uploads: &self.uploads,
            user: info.initiator.clone(),
        };
        let this = Arc::clone(self);
        let made = blocking(move || {
            let tmp = this.tmp_path();
            super::create_private_dir(tmp.path())?;
            let mut f = super::create_private_file(&tmp.path().join("upload.json"))?;
            io::Write::write_all(&mut f, &serde_json::to_vec(&info).unwrap_or_default())?;
            f.sync_all()?;
            fsync_dir(tmp.path())?;
            std::fs::rename(tmp.path(), this.upload_dir(&info.upload_id))?;
            let mut tmp = tmp;
            tmp.disarm();
            fsync_dir(&this.uploads_dir)?;
            // Here, not after the await: an upload made by a request that
            // was cancelled meanwhile is known (and counted) all the same.
            lock(&this.uploads).insert(Upload::new(info.clone(), BTreeMap::new()));
            Ok(info)
        })
        .await;
        // The upload counts itself now (or was not made).
        drop(slot);
        made
    }

    /// Stores one part from any byte source (replacing an earlier upload of
    /// the same part number). `declared` is the body's size as the request
    /// states it, if it does: it is held against the initiator's byte cap
    /// before the body is read; the stored size is checked again at the end.
    ///
    /// # Errors
    /// `NoSuchUpload`, `InvalidArgument` (part number), `QuotaExceeded`,
    /// `EntityTooLarge`, `BadDigest`, `Body`, I/O.
    #[allow(clippy::too_many_arguments)]
    pub async fn upload_part<S>(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part_number: u32,
        declared: Option<u64>,
        body: S,
        content_md5_hex: Option<&str>,
        check: &mut dyn BodyCheck,
    ) -> StoreResult<PartInfo>
    where
        S: Stream<Item = Result<Bytes, BodyError>> + Send + Unpin,
    {
        if !(1..=MAX_PART_NUMBER).contains(&part_number) {
            return Err(StoreError::InvalidArgument(format!(
                "Part number must be an integer between 1 and {MAX_PART_NUMBER}, inclusive"
            )));
        }
        if declared.is_some_and(|n| n > MAX_PUT_SIZE) {
            return Err(StoreError::EntityTooLarge);
        }
        let u = self.upload(bucket, key, upload_id)?;
        let reservation = self.reserve_part(&u, part_number, declared.unwrap_or(0))?;
        let tmp = self.tmp_path();
        let (file, written) = self
            .write_body_md5(&tmp, body, check, content_md5_hex)
            .await?;
        let meta = ObjectMeta {
            key: String::new(),
            size: written.size,
            etag: written.md5_hex,
            last_modified_ms: now_ms(),
            parts_count: None,
            part_number: Some(part_number),
            attrs: ObjectAttrs::default(),
            checksum: check.checksum(),
            parts: Vec::new(),
            manifest: None,
        };
        Self::seal(file, &meta).await?;
        let gone = u.gone.lock().await;
        if *gone {
            return Err(StoreError::NoSuchUpload);
        }
        self.check_part_fits(&u, &reservation, part_number, meta.size)?;
        let dir = self.upload_dir(upload_id);
        let src = tmp.path().to_owned();
        let mut tmp = tmp;
        tmp.disarm();
        let mut guard = TmpGuard::new(src.clone());
        let this = Arc::clone(self);
        let upload = Arc::clone(&u);
        let size = meta.size;
        blocking(move || {
            std::fs::rename(&src, dir.join(part_file_name(part_number)))?;
            guard.disarm();
            // The part counts as stored from here, also when the request
            // is cancelled meanwhile; unless the upload went (aborted while
            // a cancelled request's rename was still running).
            let mut ups = lock(&this.uploads);
            let u = upload;
            if ups
                .by_id
                .get(&u.info.upload_id)
                .is_some_and(|x| Arc::ptr_eq(x, &u))
            {
                let old = lock(&u.sizes).insert(part_number, size);
                let usage = ups.usage.entry(u.info.initiator.clone()).or_default();
                usage.bytes = (usage.bytes + size).saturating_sub(old.unwrap_or(0));
                if old.is_none() {
                    usage.parts += 1;
                }
            }
            drop(ups);
            fsync_dir(&dir)?;
            Ok(())
        })
        .await?;
        // The stored part replaces its reservation.
        drop(reservation);
        drop(gone);
        Ok(PartInfo {
            part_number,
            size: meta.size,
            etag: meta.etag,
            last_modified_ms: meta.last_modified_ms,
            checksum: meta.checksum,
        })
    }

    fn read_parts(dir: &std::path::Path) -> StoreResult<BTreeMap<u32, PartInfo>> {
        let mut parts = BTreeMap::new();
        for e in std::fs::read_dir(dir)? {
            let p = e?.path();
            let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(n) = name
                .strip_prefix("part-")
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let f = File::open(&p)?;
            let m = read_meta(&f, &p)?;
            parts.insert(
                n,
                PartInfo {
                    part_number: n,
                    size: m.size,
                    etag: m.etag,
                    last_modified_ms: m.last_modified_ms,
                    checksum: m.checksum,
                },
            );
        }
        Ok(parts)
    }

    /// The upload and its parts, by part number.
    ///
    /// # Errors
    /// `NoSuchBucket`, `NoSuchUpload`, I/O.
    pub async fn list_parts(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> StoreResult<(UploadInfo, Vec<PartInfo>)> {
        let u = self.upload(bucket, key, upload_id)?;
        let dir = self.upload_dir(upload_id);
        let parts = blocking(move || Self::read_parts(&dir)).await?;
        Ok((u.info.clone(), parts.into_values().collect()))
    }

    /// One page of a bucket's in-progress uploads, ordered by key then
    /// initiation time (ListMultipartUploads): those under `prefix`, after
    /// `key_marker` (and, for that key, after `id_marker`), with keys rolled
    /// up at `delimiter` into common prefixes. Like an object listing, the
    /// walk seeks past a common prefix, reading at most `max + 1` uploads.
    ///
    /// # Errors
    /// `NoSuchBucket`.
    pub fn list_uploads(
        &self,
        bucket: &str,
        prefix: &str,
        delimiter: Option<&str>,
        (key_marker, id_marker): (&str, Option<&str>),
        max: usize,
    ) -> StoreResult<UploadsPage> {
        use std::ops::Bound;
        self.bucket(bucket)?;
        let delimiter = delimiter.filter(|d| !d.is_empty());
        let mut page = UploadsPage::default();
        if max == 0 {
            return Ok(page);
        }
        let at = |key: String| (bucket.to_owned(), key, i64::MIN, String::new());
        // Where the walk starts: at the prefix, or after the marker key
        // (or after the marker's upload of that key; an unknown id starts
        // after the key).
        let mut from: Bound<(String, String, i64, String)> = Bound::Included(at(prefix.to_owned()));
        if !key_marker.is_empty() && key_marker >= prefix {
            let group = delimiter
                .and_then(|d| listing::common_prefix_of(key_marker, prefix, d))
                .filter(|cp| *cp == key_marker);
            from = match group {
                // A marker that is a common prefix (a page ended there):
                // after every key under it.
                Some(cp) => match listing::prefix_successor(cp) {
                    Some(next) => Bound::Included(at(next)),
                    None => return Ok(page),
                },
                // The smallest key after the marker.
                None => Bound::Included(at(format!("{key_marker}\0"))),
            };
            if let Some(id) = id_marker
                && group.is_none()
            {
                let ups = lock(&self.uploads);
                if let Some(u) = ups
                    .by_id
                    .get(id)
                    .filter(|u| u.info.bucket == bucket && u.info.key == key_marker)
                {
                    from = Bound::Excluded(order_key(&u.info));
                }
            }
        }
        let ups = lock(&self.uploads);
        'seek: loop {
            let range = ups.ordered.range((from.clone(), Bound::Unbounded));
            for (b, key, _, id) in range {
                page.visited += 1;
                if b != bucket || !key.starts_with(prefix) {
                    break 'seek;
                }
                if page.uploads.len() + page.common_prefixes.len() == max {
                    page.is_truncated = true;
                    break 'seek;
                }
                match delimiter.and_then(|d| listing::common_prefix_of(key, prefix, d)) {
                    Some(cp) => {
                        page.common_prefixes.push(cp.to_owned());
                        page.next = Some((cp.to_owned(), None));
                        match listing::prefix_successor(cp) {
                            Some(next) => {
                                from = Bound::Included(at(next));
                                continue 'seek;
                            }
                            None => break 'seek,
                        }
                    }
                    None => {
                        if let Some(u) = ups.by_id.get(id) {
                            page.next = Some((key.clone(), Some(id.clone())));
                            page.uploads.push(u.info.clone());
                        }
                    }
                }
            }
            break;
        }
        if !page.is_truncated {
            page.next = None;
        }
        Ok(page)
    }

    /// Aborts the uploads initiated before `cutoff_ms` (Unix milliseconds),
    /// deleting their parts; returns how many went.
    pub async fn sweep_uploads(&self, cutoff_ms: i64) -> usize {
        let old: Vec<String> = lock(&self.uploads)
            .by_id
            .values()
            .filter(|u| u.info.initiated_ms < cutoff_ms)
            .map(|u| u.info.upload_id.clone())
            .collect();
        let mut n = 0;
        for id in old {
            match self.remove_upload(&id).await {
                Ok(()) => {
                    info!(upload_id = %id, "aborted an incomplete multipart upload past multipart.abort_incomplete_after");
                    n += 1;
                }
                // Completed or aborted meanwhile.
                Err(StoreError::NoSuchUpload) => {}
                Err(e) => {
                    warn!(upload_id = %id, error = %e, "aborting an expired multipart upload failed")
                }
            }
        }
        n
    }

    /// Takes `bytes` from the UploadPartCopy budget of `access_key` (empty:
    /// the anonymous class): `multipart.copy_bytes_per_minute_per_user`, or
    /// `multipart.anonymous_copy_bytes_per_minute` for all anonymous
    /// callers together. `Err` with the budget per minute when the copy
    /// does not fit what is left (nothing taken).
    ///
    /// # Errors
    /// The class's budget per minute, when exhausted.
    pub fn take_copy_budget(&self, access_key: &str, bytes: u64) -> Result<(), u64> {
        let per_minute = self.multipart.copy_budget(access_key);
        let now = std::time::Instant::now();
        let mut ups = lock(&self.uploads);
        // Forget the buckets that are full again (as good as new ones).
        if ups.copies.len() >= 1024 {
            let cfg = self.multipart;
            ups.copies
                .retain(|user, b| !b.is_full(cfg.copy_budget(user), now));
        }
        let taken = ups
            .copies
            .entry(access_key.to_owned())
            .or_insert_with(|| CopyBudget::full(per_minute, now))
            .take(per_minute, bytes, now);
        if taken { Ok(()) } else { Err(per_minute) }
    }

    /// Holds a part's declared bytes (beyond those of the part it replaces)
    /// and, for a new part number, a part slot against the upload's
    /// initiator's caps.
    fn reserve_part(
        &self,
        u: &Upload,
        part_number: u32,
        bytes: u64,
    ) -> StoreResult<Reservation<'_>> {
        let cfg = &self.multipart;
        let mut ups = lock(&self.uploads);
        let old = lock(&u.sizes).get(&part_number).copied();
        let new_part = old.is_none();
        // A part replacing one of the same number needs only what it adds.
        let bytes = bytes.saturating_sub(old.unwrap_or(0));
        let usage = ups.usage.entry(u.info.initiator.clone()).or_default();
        if new_part && usage.parts >= cfg.max_parts_per_user {
            return Err(StoreError::QuotaExceeded(format!(
                "The initiator of this upload has {} parts in multipart uploads in progress, the most this server allows one user (multipart.max_parts_per_user); complete or abort some uploads first.",
                usage.parts
            )));
        }
        if usage.bytes.saturating_add(bytes) > cfg.max_bytes_per_user.0 {
            return Err(bytes_quota(usage.bytes, bytes, cfg.max_bytes_per_user.0));
        }
        usage.bytes += bytes;
        usage.parts += usize::from(new_part);
        Ok(Reservation {
            uploads: &self.uploads,
            user: u.info.initiator.clone(),
            bytes,
            parts: usize::from(new_part),
        })
    }

    /// Whether a part of `size` bytes, now written, still fits its
    /// initiator's byte cap (its declared size was reserved; a body of
    /// undeclared size is counted here).
    fn check_part_fits(
        &self,
        u: &Upload,
        reservation: &Reservation<'_>,
        part_number: u32,
        size: u64,
    ) -> StoreResult<()> {
        let ups = lock(&self.uploads);
        let old = lock(&u.sizes).get(&part_number).copied().unwrap_or(0);
        let held = ups
            .usage
            .get(&u.info.initiator)
            .map_or(0, |x| x.bytes)
            .saturating_sub(reservation.bytes)
            .saturating_sub(old);
        let cap = self.multipart.max_bytes_per_user.0;
        if held.saturating_add(size) > cap {
            return Err(bytes_quota(held, size, cap));
        }
        Ok(())
    }

    /// Aborts an upload and deletes its parts.
    ///
    /// # Errors
    /// `NoSuchBucket`, `NoSuchUpload`, I/O.
    pub async fn abort_upload(&self, bucket: &str, key: &str, upload_id: &str) -> StoreResult<()> {
        self.upload(bucket, key, upload_id)?;
        self.remove_upload(upload_id).await
    }

    pub(super) async fn remove_upload(&self, upload_id: &str) -> StoreResult<()> {
        let Some(u) = lock(&self.uploads).by_id.get(upload_id).cloned() else {
            return Err(StoreError::NoSuchUpload);
        };
        let mut gone = u.gone.lock().await;
        if *gone {
            return Err(StoreError::NoSuchUpload);
        }
        *gone = true;
        lock(&self.uploads).remove(upload_id);
        self.remove_upload_dir(upload_id).await?;
        info!(upload_id, "multipart upload removed");
        Ok(())
    }

    /// Removes the directory of an upload no longer in the map: renamed
    /// into `.tmp/` first (and that fsynced), so a crash leaves none
    /// half-removed.
    async fn remove_upload_dir(&self, upload_id: &str) -> StoreResult<()> {
        let dir = self.upload_dir(upload_id);
        let tmp = self.tmp_path();
        let uploads_dir = self.uploads_dir.clone();
        blocking(move || {
            std::fs::rename(&dir, tmp.path())?;
            fsync_dir(&uploads_dir)?;
            std::fs::remove_dir_all(tmp.path())?;
            let mut tmp = tmp;
            tmp.disarm();
            Ok(())
        })
        .await
    }
}

/// The open-upload count [`Store::create_upload`] takes before the upload
/// exists, given back when dropped (the upload, once made, counts itself).
#[derive(Debug)]
struct UploadSlot<'a> {
    uploads: &'a Mutex<Uploads>,
    user: String,
}

impl Drop for UploadSlot<'_> {
    fn drop(&mut self) {
        let mut ups = lock(self.uploads);
        if let Some(u) = ups.usage.get_mut(&self.user) {
            u.uploads = u.uploads.saturating_sub(1);
        }
    }
}

fn bytes_quota(held: u64, more: u64, cap: u64) -> StoreError {
    StoreError::QuotaExceeded(format!(
        "The initiator of this upload holds {held} bytes in multipart uploads in progress; {more} more would pass {cap}, the most this server allows one user (multipart.max_bytes_per_user). Complete or abort some uploads first."
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(n: u32, size: u64, etag: &str) -> PartInfo {
        PartInfo {
            part_number: n,
            size,
            etag: etag.into(),
            last_modified_ms: 0,
            checksum: None,
        }
    }

    fn uploaded() -> BTreeMap<u32, PartInfo> {
        [
            part(1, MIN_PART_SIZE, "e1"),
            part(2, MIN_PART_SIZE, "e2"),
            part(3, 10, "e3"),
        ]
        .into_iter()
        .map(|p| (p.part_number, p))
        .collect()
    }

    fn req(v: &[(u32, &str)]) -> Vec<(u32, String)> {
        v.iter().map(|(n, e)| (*n, (*e).to_owned())).collect()
    }

    #[test]
    fn copy_budget_is_a_token_bucket() {
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let mib = 1 << 20;
        let mut b = CopyBudget::full(64 * mib, t0);
        // A minute's budget at once, then nothing until it refills.
        for _ in 0..8 {
            assert!(b.take(64 * mib, 8 * mib, t0));
        }
        assert!(!b.take(64 * mib, 1, t0));
        // A refused take takes nothing; 7.5 s refill one eighth.
        let t1 = t0 + Duration::from_millis(7500);
        assert!(!b.take(64 * mib, 8 * mib + 1, t1));
        assert!(b.take(64 * mib, 8 * mib, t1));
        assert!(!b.is_full(64 * mib, t1));
        // Never more than a minute's worth, however long it waits.
        let t2 = t1 + Duration::from_secs(3600);
        assert!(b.is_full(64 * mib, t2));
        assert!(!b.take(64 * mib, 64 * mib + 1, t2));
        assert!(b.take(64 * mib, 64 * mib, t2));
        // A budget of 0 refuses every copy but an empty one.
        let mut none = CopyBudget::full(0, t0);
        assert!(!none.take(0, 1, t2));
        assert!(none.take(0, 0, t2));
    }

    #[test]
    fn accepts_valid_lists() {
        let got = select_parts(&uploaded(), &req(&[(1, "e1"), (2, "\"e2\""), (3, "e3")])).unwrap();
        assert_eq!(got.len(), 3);
        // A subset is fine, as long as the small part is last.
        let got = select_parts(&uploaded(), &req(&[(2, "e2"), (3, "e3")])).unwrap();
        assert_eq!(got[0].part_number, 2);
    }

    #[test]
    fn rejects_bad_lists() {
        assert!(matches!(
            select_parts(&uploaded(), &req(&[(2, "e2"), (1, "e1")])),
            Err(StoreError::InvalidPartOrder)
        ));
        assert!(matches!(
            select_parts(&uploaded(), &req(&[(1, "e1"), (1, "e1")])),
            Err(StoreError::InvalidPartOrder)
        ));
        assert!(matches!(
            select_parts(&uploaded(), &req(&[(1, "e1"), (4, "e4")])),
            Err(StoreError::InvalidPart(_))
        ));
        assert!(matches!(
            select_parts(&uploaded(), &req(&[(1, "bad")])),
            Err(StoreError::InvalidPart(_))
        ));
        assert!(matches!(
            select_parts(&uploaded(), &req(&[(3, "e3"), (4, "x")])),
            Err(StoreError::InvalidPart(_))
        ));
        let mut up = uploaded();
        up.insert(4, part(4, 1, "e4"));
        assert!(matches!(
            select_parts(&up, &req(&[(3, "e3"), (4, "e4")])),
            Err(StoreError::EntityTooSmall { part: 3, .. })
        ));
    }

    /// `upload.json` files written before the initiator's canonical id was
    /// recorded still load (without it), and the field round-trips.
    #[test]
    fn older_upload_files_stay_readable() {
        let old = r#"{"upload_id":"0123456789abcdef0123456789abcdef","bucket":"b","key":"k","initiated_ms":1,"initiator":"alice","attrs":{}}"#;
        let info: UploadInfo = serde_json::from_str(old).unwrap();
        assert_eq!(info.initiator, "alice");
        assert_eq!(info.initiator_id, None);
        let with_id = UploadInfo {
            initiator_id: Some("c0ffee".into()),
            ..info
        };
        let back: UploadInfo =
            serde_json::from_slice(&serde_json::to_vec(&with_id).unwrap()).unwrap();
        assert_eq!(back, with_id);
    }

    #[test]
    fn upload_ids() {
        assert!(valid_upload_id(&uuid::Uuid::new_v4().simple().to_string()));
        assert!(!valid_upload_id("../../etc"));
        assert!(!valid_upload_id(&"A".repeat(32)));
    }
}
