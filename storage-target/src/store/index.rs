//! Buckets in memory: their metadata ([`BucketInfo`]) and the ordered
//! index of their objects ([`IndexEntry`]) that serves listings.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::{ACL_SUFFIX, ObjectMeta};
use crate::acl::Acl;

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
    /// The content type and user metadata, when the object has either:
    /// with them a HEAD is answered from the index, no file opened
    /// ([`super::Store::index_entry`]). Shared, so that a listing's copy of
    /// an entry does not copy them.
    pub head: Option<Arc<HeadAttrs>>,
}

/// What a HEAD answers of an object besides its size, ETag and time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadAttrs {
    /// `Content-Type`, when the writer set one.
    pub content_type: Option<String>,
    /// `x-amz-meta-*` user metadata (names lower-case, without the prefix).
    pub user_metadata: BTreeMap<String, String>,
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
            head: (m.attrs.content_type.is_some() || !m.attrs.user_metadata.is_empty()).then(
                || {
                    Arc::new(HeadAttrs {
                        content_type: m.attrs.content_type.clone(),
                        user_metadata: m.attrs.user_metadata.clone(),
                    })
                },
            ),
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
pub(super) struct AclOverride {
    /// The object instance it applies to.
    pub(super) instance: String,
    /// The ACL.
    pub(super) acl: Acl,
}

#[derive(Debug)]
pub(super) struct Bucket {
    pub(super) info: RwLock<BucketInfo>,
    pub(super) dir: PathBuf,
    pub(super) state: RwLock<BucketState>,
}

#[derive(Debug, Default)]
pub(super) struct BucketState {
    pub(super) deleted: bool,
    pub(super) index: BTreeMap<String, IndexEntry>,
}

impl Bucket {
    pub(super) fn objects_dir(&self) -> PathBuf {
        self.dir.join("objects")
    }

    pub(super) fn object_path(&self, key: &str) -> PathBuf {
        let h = hex::encode(sha2::Sha256::digest(key.as_bytes()));
        self.objects_dir().join(&h[..2]).join(h)
    }

    pub(super) fn acl_path(&self, key: &str) -> PathBuf {
        let mut p = self.object_path(key).into_os_string();
        p.push(ACL_SUFFIX);
        PathBuf::from(p)
    }
}
