//! Multipart uploads: parts live under `.uploads/<upload-id>/` (surviving
//! restarts); Complete hard-links the chosen parts into a new `.parts/<id>/`
//! and publishes an object file that is a manifest of them, atomically,
//! without copying any data.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futures::Stream;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::format::{Manifest, ObjectAttrs, ObjectMeta, PartMeta};
use super::{
    BodyCheck, BodyError, MIN_PART_SIZE, Store, StoreError, StoreResult, TmpGuard, blocking, etag,
    fsync_dir, lock, now_ms, read_meta,
};
use crate::checksum::{self, CompleteRequest, PartSum, StoredChecksum, UploadChecksum};

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
    /// Access key id of the initiator.
    pub initiator: String,
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

impl Store {
    fn upload_dir(&self, id: &str) -> PathBuf {
        self.uploads_dir.join(id)
    }

    pub(super) fn load_uploads(&self) -> StoreResult<usize> {
        let mut map = BTreeMap::new();
        for e in std::fs::read_dir(&self.uploads_dir)? {
            let dir = e?.path();
            let info: Result<UploadInfo, String> = std::fs::read(dir.join("upload.json"))
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
            match info {
                Ok(info) if valid_upload_id(&info.upload_id) => {
                    map.insert(
                        info.upload_id.clone(),
                        Arc::new(Upload {
                            info,
                            gone: tokio::sync::Mutex::new(false),
                        }),
                    );
                }
                Ok(_) | Err(_) => {
                    warn!(dir = %dir.display(), "removing malformed multipart upload directory");
                    let _ = std::fs::remove_dir_all(&dir);
                }
            }
        }
        let n = map.len();
        *lock(&self.uploads) = map;
        Ok(n)
    }

    fn upload(&self, bucket: &str, key: &str, id: &str) -> StoreResult<Arc<Upload>> {
        if !valid_upload_id(id) {
            return Err(StoreError::NoSuchUpload);
        }
        self.bucket(bucket)?;
        let u = lock(&self.uploads)
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

    /// Starts a multipart upload; returns its id.
    ///
    /// # Errors
    /// `NoSuchBucket`, I/O.
    pub async fn create_upload(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
        attrs: ObjectAttrs,
        initiator: &str,
        checksum: Option<UploadChecksum>,
    ) -> StoreResult<UploadInfo> {
        self.bucket(bucket)?;
        let info = UploadInfo {
            upload_id: uuid::Uuid::new_v4().simple().to_string(),
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            initiated_ms: now_ms(),
            initiator: initiator.to_owned(),
            attrs,
            checksum,
        };
        let this = Arc::clone(self);
        blocking(move || {
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
            lock(&this.uploads).insert(
                info.upload_id.clone(),
                Arc::new(Upload {
                    info: info.clone(),
                    gone: tokio::sync::Mutex::new(false),
                }),
            );
            Ok(info)
        })
        .await
    }

    /// Stores one part from any byte source (replacing an earlier upload of
    /// the same part number).
    ///
    /// # Errors
    /// `NoSuchUpload`, `InvalidArgument` (part number), `BadDigest`, `Body`, I/O.
    #[allow(clippy::too_many_arguments)]
    pub async fn upload_part<S>(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part_number: u32,
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
        let u = self.upload(bucket, key, upload_id)?;
        let tmp = self.tmp_path();
        let (file, written) = self.write_body(&tmp, body, check).await?;
        if let Some(expect) = content_md5_hex
            && expect != written.md5_hex
        {
            return Err(StoreError::BadDigest);
        }
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
        let dir = self.upload_dir(upload_id);
        let src = tmp.path().to_owned();
        let mut tmp = tmp;
        tmp.disarm();
        let mut guard = TmpGuard::new(src.clone());
        blocking(move || {
            std::fs::rename(&src, dir.join(part_file_name(part_number)))?;
            guard.disarm();
            fsync_dir(&dir)?;
            Ok(())
        })
        .await?;
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

    /// In-progress uploads of a bucket, ordered by key then initiation time.
    ///
    /// # Errors
    /// `NoSuchBucket`.
    pub fn list_uploads(&self, bucket: &str) -> StoreResult<Vec<UploadInfo>> {
        self.bucket(bucket)?;
        let mut v: Vec<UploadInfo> = lock(&self.uploads)
            .values()
            .filter(|u| u.info.bucket == bucket)
            .map(|u| u.info.clone())
            .collect();
        v.sort_by(|a, b| {
            (a.key.as_str(), a.initiated_ms, a.upload_id.as_str()).cmp(&(
                b.key.as_str(),
                b.initiated_ms,
                b.upload_id.as_str(),
            ))
        });
        Ok(v)
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
        let Some(u) = lock(&self.uploads).get(upload_id).cloned() else {
            return Err(StoreError::NoSuchUpload);
        };
        let mut gone = u.gone.lock().await;
        if *gone {
            return Err(StoreError::NoSuchUpload);
        }
        *gone = true;
        lock(&self.uploads).remove(upload_id);
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
        .await?;
        info!(upload_id, "multipart upload removed");
        Ok(())
    }

    /// Completes an upload from the listed `(part number, ETag)` pairs.
    /// Parts must be ascending (`InvalidPartOrder`), exist with that ETag
    /// (`InvalidPart`), and all but the last be ≥ 5 MiB (`EntityTooSmall`).
    /// The checksums the request lists are checked and the object's
    /// checksum computed by [`checksum::complete`].
    ///
    /// # Errors
    /// As above, plus checksum errors, `NoSuchUpload`, `NoSuchBucket`, I/O.
    pub async fn complete_upload(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        requested: &[(u32, String)],
        sums: &CompleteRequest,
    ) -> StoreResult<ObjectMeta> {
        let stamp = completion_stamp(upload_id, requested);
        let u = match self.upload(bucket, key, upload_id) {
            Ok(u) => u,
            // A retried Complete (its reply was lost) of an upload that
            // already made the current object: the same result again.
            Err(StoreError::NoSuchUpload) => {
                return match self.open_object(bucket, key).await {
                    Ok(r) if r.meta.attrs.completed_upload.as_deref() == Some(stamp.as_str()) => {
                        Ok(r.meta)
                    }
                    _ => Err(StoreError::NoSuchUpload),
                };
            }
            Err(e) => return Err(e),
        };
        let b = self.bucket(bucket)?;
        let mut gone = u.gone.lock().await;
        if *gone {
            return Err(StoreError::NoSuchUpload);
        }
        if requested.is_empty() {
            return Err(StoreError::InvalidArgument(
                "You must specify at least one part".into(),
            ));
        }
        let dir = self.upload_dir(upload_id);
        let dir2 = dir.clone();
        let parts = blocking(move || Self::read_parts(&dir2)).await?;
        let chosen = select_parts(&parts, requested)?;
        let etag = etag::multipart_etag(chosen.iter().map(|p| p.etag.as_str()))
            .ok_or_else(|| StoreError::InvalidPart("a part has a malformed ETag".into()))?;
        let size: u64 = chosen.iter().map(|p| p.size).sum();
        let part_sums: Vec<PartSum<'_>> = chosen
            .iter()
            .map(|p| PartSum {
                number: p.part_number,
                size: p.size,
                checksum: p.checksum.as_ref(),
            })
            .collect();
        let object_sum = checksum::complete(u.info.checksum, &part_sums, sums)?;
        let parts = chosen
            .iter()
            .map(|p| PartMeta {
                size: p.size,
                checksum: object_sum.as_ref().and_then(|o| {
                    p.checksum
                        .as_ref()
                        .filter(|c| c.algorithm == o.algorithm)
                        .map(|c| c.value.clone())
                }),
            })
            .collect();
        let meta = ObjectMeta {
            key: key.to_owned(),
            size,
            etag,
            last_modified_ms: now_ms(),
            parts_count: Some(u32::try_from(chosen.len()).unwrap_or(u32::MAX)),
            part_number: None,
            attrs: ObjectAttrs {
                completed_upload: Some(stamp),
                ..u.info.attrs.clone()
            },
            checksum: object_sum,
            parts,
            manifest: Some(Manifest {
                dir: uuid::Uuid::new_v4().simple().to_string(),
                part_numbers: chosen.iter().map(|p| p.part_number).collect(),
            }),
        };
        // The data stays where the parts were written: hard links of the
        // chosen part files in a directory of the object's own, made
        // durable before the manifest is published. Until then nothing
        // refers to that directory, and start-up removes it after a crash.
        let tmp = self.tmp_path();
        let to = tmp.creator();
        let trailer = super::format::encode_trailer(&meta);
        let numbers: Vec<(u32, u64)> = chosen.iter().map(|p| (p.part_number, p.size)).collect();
        let parts_root = self.parts.dir.clone();
        let linked = parts_root.join(meta.manifest.as_ref().map_or("", |m| m.dir.as_str()));
        let mut linked_guard = PartsDirGuard(Some(linked.clone()));
        blocking(move || {
            super::create_private_dir(&linked)?;
            for (n, size) in numbers {
                let from = dir.join(part_file_name(n));
                let have = std::fs::metadata(&from)?.len();
                if have < size {
                    return Err(StoreError::Io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("part {n} is shorter than recorded"),
                    )));
                }
                std::fs::hard_link(&from, linked.join(part_file_name(n)))?;
            }
            fsync_dir(&linked)?;
            fsync_dir(&parts_root)?;
            let mut out = to.create()?;
            io::Write::write_all(&mut out, &trailer)?;
            out.sync_all()?;
            Ok(())
        })
        .await?;
        self.publish(b, tmp, &meta).await?;
        linked_guard.0 = None;
        *gone = true;
        drop(gone);
        lock(&self.uploads).remove(upload_id);
        let dir = self.upload_dir(upload_id);
        let tmp = self.tmp_path();
        let uploads_dir = self.uploads_dir.clone();
        let cleanup = blocking(move || {
            std::fs::rename(&dir, tmp.path())?;
            fsync_dir(&uploads_dir)?;
            std::fs::remove_dir_all(tmp.path())?;
            let mut tmp = tmp;
            tmp.disarm();
            Ok(())
        })
        .await;
        if let Err(e) = cleanup {
            warn!(upload_id, error = %e, "cleaning up completed upload failed");
        }
        Ok(meta)
    }
}

/// Removes a completion's `.parts` directory unless disarmed (Complete
/// failed or was cancelled before publishing).
struct PartsDirGuard(Option<PathBuf>);

impl Drop for PartsDirGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// What an object made by CompleteMultipartUpload records of its request:
/// the upload id and a digest of the part list, so a retry of the same
/// request can be recognised after the upload is gone.
fn completion_stamp(upload_id: &str, requested: &[(u32, String)]) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for (n, etag) in requested {
        h.update(n.to_le_bytes());
        h.update(etag.trim_matches('"').as_bytes());
        h.update([0]);
    }
    format!("{upload_id} {}", hex::encode(h.finalize()))
}

/// Validates a CompleteMultipartUpload part list against the uploaded parts
/// and returns the chosen parts in order.
///
/// # Errors
/// `InvalidPartOrder`, `InvalidPart`, `EntityTooSmall`.
pub(super) fn select_parts(
    uploaded: &BTreeMap<u32, PartInfo>,
    requested: &[(u32, String)],
) -> StoreResult<Vec<PartInfo>> {
    let mut out: Vec<PartInfo> = Vec::with_capacity(requested.len());
    let mut prev = 0u32;
    for (n, etag) in requested {
        if *n <= prev {
            return Err(StoreError::InvalidPartOrder);
        }
        prev = *n;
        let p = uploaded.get(n).ok_or_else(|| {
            StoreError::InvalidPart(format!(
                "One or more of the specified parts could not be found: part {n} was not uploaded."
            ))
        })?;
        let want = etag.trim_matches('"');
        if p.etag != want {
            return Err(StoreError::InvalidPart(format!(
                "One or more of the specified parts could not be found: part {n} has ETag {} not {want}.",
                p.etag
            )));
        }
        out.push(p.clone());
    }
    if let Some((_, init)) = out.split_last()
        && let Some(small) = init.iter().find(|p| p.size < MIN_PART_SIZE)
    {
        return Err(StoreError::EntityTooSmall {
            part: small.part_number,
            size: small.size,
        });
    }
    Ok(out)
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

    #[test]
    fn upload_ids() {
        assert!(valid_upload_id(&uuid::Uuid::new_v4().simple().to_string()));
        assert!(!valid_upload_id("../../etc"));
        assert!(!valid_upload_id(&"A".repeat(32)));
    }
}
