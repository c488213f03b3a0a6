//! Bucket operations: create, head, ACL, list, delete.

use std::sync::{Arc, RwLock};

use tracing::{info, warn};

use super::{
    Bucket, BucketInfo, Store, StoreError, StoreResult, blocking, bucket_name, create_private_dir,
    create_private_file, fsync_dir, lock, now_ms, read, write,
};
use crate::acl::Acl;

/// Buckets.
impl Store {
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
}
