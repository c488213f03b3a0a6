//! CompleteMultipartUpload: the chosen parts hard-linked into a new
//! `.parts/<id>/` and an object file that is a manifest of them published
//! atomically, without copying any data; a retry of the same request is
//! recognised by its completion stamp.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;

use tracing::warn;

use super::super::format::{Manifest, ObjectAttrs, ObjectMeta, PartMeta};
use super::super::{
    MIN_PART_SIZE, Store, StoreError, StoreResult, blocking, etag, fsync_dir, lock, now_ms,
};
use super::{PartInfo, part_file_name};
use crate::checksum::{self, CompleteRequest, PartSum};

impl Store {
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
        let trailer = crate::store::format::encode_trailer(&meta);
        let numbers: Vec<(u32, u64)> = chosen.iter().map(|p| (p.part_number, p.size)).collect();
        let parts_root = self.parts.dir.clone();
        let linked = parts_root.join(meta.manifest.as_ref().map_or("", |m| m.dir.as_str()));
        let mut linked_guard = PartsDirGuard(Some(linked.clone()));
        blocking(move || {
            crate::store::create_private_dir(&linked)?;
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
        self.publish(b, tmp, &meta, None).await?;
        linked_guard.0 = None;
        *gone = true;
        drop(gone);
        lock(&self.uploads).remove(upload_id);
        if let Err(e) = self.remove_upload_dir(upload_id).await {
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
pub(in crate::store) fn select_parts(
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
