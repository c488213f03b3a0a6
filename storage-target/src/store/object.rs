//! Object operations besides writes: open, delete, the ACL override,
//! listing.

use std::fs::File;
use std::io;
use std::sync::Arc;

use super::{
    AclOverride, Data, IndexEntry, ObjectMeta, ObjectReader, PartFiles, Store, StoreError,
    StoreResult, blocking, create_private_file, fsync_dir, listing, read, read_meta,
    remove_parts_dir, write,
};
use crate::acl::Acl;

/// Opening, deleting and listing objects; object ACLs.
impl Store {
    /// Opens an object for reading. The reader keeps reading the version it
    /// opened even if the object is replaced or deleted meanwhile.
    ///
    /// # Errors
    /// `NoSuchBucket`, `NoSuchKey`, `Corrupt`, I/O.
    pub async fn open_object(&self, bucket: &str, key: &str) -> StoreResult<ObjectReader> {
        let b = self.bucket(bucket)?;
        // On the runtime's thread, not the blocking pool: an open, an fstat
        // and two preads of the file's ends (its trailer and header) cost
        // less than the pool's hop, which was the larger part of a small
        // GET's CPU ([`super::INLINE_READ_MAX`] says the same of reads).
        let path = b.object_path(key);
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
            Some(m) => Data::Parts(Arc::new(PartFiles::new(&meta, m, &self.parts))),
        };
        Ok(ObjectReader { meta, data })
    }

    /// The index entry of `key`: what a listing shows of it and what a
    /// HEAD answers, read under the index lock with no file opened (a
    /// batched HEAD's cost is this lookup).
    ///
    /// # Errors
    /// `NoSuchBucket`, `NoSuchKey`.
    pub fn index_entry(&self, bucket: &str, key: &str) -> StoreResult<IndexEntry> {
        let b = self.bucket(bucket)?;
        let st = read(&b.state);
        st.index.get(key).cloned().ok_or(StoreError::NoSuchKey)
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
