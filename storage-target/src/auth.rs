//! Who may do what: users (SigV4 secrets, for s3s's verification), the
//! bucket and object permission rule, and the [`s3s::access::S3Access`] check
//! run before every operation.
//!
//! A caller gets a permission on a bucket when it owns the bucket, when the
//! bucket's ACL grants it (see [`crate::acl`]), or when the operator's bucket
//! grants in the configuration do (an extra permission, for operators: a
//! read grant gives READ and READ_ACP, a write grant WRITE, both together
//! FULL_CONTROL, on the bucket and on every object in it). Objects follow the
//! same rule with the object's owner (its writer) and ACL. Anonymous callers
//! get exactly what `AllUsers` grants say.
//!
//! Bucket-level permissions are checked here, before the handler runs and
//! before any body is read; object-level ones (GetObject, HeadObject,
//! GetObjectAttributes, the object ACL calls, the source of a copy) need the
//! object's owner and ACL, so the handlers in [`crate::s3`] check them with
//! [`Users::object_allows`] when they open the object.
//!
//! Some operations are the owner's alone, whatever the ACL grants (as in
//! AWS): DeleteBucket needs the bucket's owner (or an operator read-write
//! grant), and an in-progress multipart upload is used (UploadPart,
//! UploadPartCopy, Complete, Abort, ListParts) only by its initiator or the
//! bucket's owner, which the handlers check beyond the WRITE (or READ)
//! checked here.

use std::collections::HashMap;
use std::sync::Arc;

use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::dto::{CopyObjectInput, PostObjectInput, UploadPartCopyInput};
use s3s::path::S3Path;
use s3s::{S3Request, S3Result, s3_error};

use crate::acl::{Acl, Caller, Permission};
use crate::config::{BucketGrant, User, default_canonical_id};
use crate::http::OpSlot;
use crate::store::{BucketInfo, Store, StoreError};

/// What an operation needs before its handler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing bucket-specific (ListBuckets: a signed request).
    Nothing,
    /// Creating a bucket (a write grant covering the name, or
    /// `create_buckets`).
    Create,
    /// A permission on the bucket.
    Bucket(Permission),
    /// Checked by the handler against the object (the bucket must exist).
    Object,
    /// The bucket's owner (or an operator read-write grant on it): no ACL
    /// grant suffices, not even FULL_CONTROL (as AWS: only the owner may
    /// delete a bucket).
    Owner,
}

/// Classifies an S3 operation (by s3s operation name).
#[must_use]
pub fn need_of(op: &str) -> Need {
    match op {
        "ListBuckets" => Need::Nothing,
        "CreateBucket" => Need::Create,
        "ListObjects"
        | "ListObjectsV2"
        | "ListObjectVersions"
        | "HeadBucket"
        | "GetBucketLocation"
        | "ListParts"
        | "ListMultipartUploads" => Need::Bucket(Permission::Read),
        "PutObject"
        | "DeleteObject"
        | "DeleteObjects"
        | "CreateMultipartUpload"
        | "UploadPart"
        | "CompleteMultipartUpload"
        | "AbortMultipartUpload"
        | "CopyObject"
        | "UploadPartCopy" => Need::Bucket(Permission::Write),
        "GetBucketAcl" => Need::Bucket(Permission::ReadAcp),
        "PutBucketAcl" => Need::Bucket(Permission::WriteAcp),
        "GetObject" | "HeadObject" | "GetObjectAttributes" | "GetObjectAcl" | "PutObjectAcl" => {
            Need::Object
        }
        "DeleteBucket" => Need::Owner,
        // Everything else (bucket configuration we do not
        // implement): the owner, or an operator read-write grant.
        _ => Need::Bucket(Permission::FullControl),
    }
}

/// The configured users.
#[derive(Debug, Clone)]
pub struct Users {
    by_key: Arc<HashMap<String, User>>,
    by_id: Arc<HashMap<String, String>>,
}

impl Users {
    /// Builds the user table.
    #[must_use]
    pub fn new(users: Vec<User>) -> Self {
        let by_id = users
            .iter()
            .map(|u| (u.canonical_id.clone(), u.access_key_id.clone()))
            .collect();
        Users {
            by_key: Arc::new(
                users
                    .into_iter()
                    .map(|u| (u.access_key_id.clone(), u))
                    .collect(),
            ),
            by_id: Arc::new(by_id),
        }
    }

    /// The user with this access key id.
    #[must_use]
    pub fn get(&self, access_key: &str) -> Option<&User> {
        self.by_key.get(access_key)
    }

    /// The user with this canonical id.
    #[must_use]
    pub fn by_canonical_id(&self, id: &str) -> Option<&User> {
        self.by_id.get(id).and_then(|k| self.by_key.get(k))
    }

    /// Whether a configured user has this canonical id.
    #[must_use]
    pub fn known_id(&self, id: &str) -> bool {
        self.by_id.contains_key(id)
    }

    /// The display name shown for a canonical id (the id itself when no
    /// configured user has it any more).
    #[must_use]
    pub fn display_name(&self, id: &str) -> String {
        self.by_canonical_id(id)
            .map_or_else(|| id.to_owned(), |u| u.display_name.clone())
    }

    /// The canonical id of a bucket's owner.
    #[must_use]
    pub fn bucket_owner(&self, info: &BucketInfo) -> String {
        match &info.owner_id {
            Some(id) => id.clone(),
            None => self.get(&info.owner).map_or_else(
                || default_canonical_id(&info.owner),
                |u| u.canonical_id.clone(),
            ),
        }
    }

    /// Whether `caller` (`None`: anonymous) has `need` on the bucket.
    #[must_use]
    pub fn bucket_allows(
        &self,
        caller: Option<&User>,
        info: &BucketInfo,
        need: Permission,
    ) -> bool {
        if let Some(u) = caller
            && grants_give(&u.buckets, &info.name, need)
        {
            return true;
        }
        info.acl
            .allows(&self.bucket_owner(info), caller_of(caller), need)
    }

    /// Whether `caller` has `need` on an object of the bucket `info`, owned by
    /// `object_owner` (`None`: written before owners existed, so the bucket
    /// owner's) with the ACL `acl`.
    #[must_use]
    pub fn object_allows(
        &self,
        caller: Option<&User>,
        info: &BucketInfo,
        object_owner: Option<&str>,
        acl: &Acl,
        need: Permission,
    ) -> bool {
        if let Some(u) = caller
            && grants_give(&u.buckets, &info.name, need)
        {
            return true;
        }
        let owner = object_owner.map_or_else(|| self.bucket_owner(info), str::to_owned);
        acl.allows(&owner, caller_of(caller), need)
    }

    /// Whether `caller` may create the bucket `name`.
    #[must_use]
    pub fn may_create(&self, caller: &User, name: &str) -> bool {
        caller.create_buckets
            || caller
                .buckets
                .iter()
                .any(|g| grant_matches(&g.name, name) && g.access.can_write())
    }
}

/// The ACL view of a caller.
#[must_use]
pub fn caller_of(user: Option<&User>) -> Caller<'_> {
    user.map_or(Caller::Anonymous, |u| Caller::User(&u.canonical_id))
}

/// Whether a grant name matches `bucket`: `"*"` matches every bucket,
/// `"prefix*"` every bucket starting with `prefix`, anything else exactly.
#[must_use]
pub fn grant_matches(grant: &str, bucket: &str) -> bool {
    match grant.strip_suffix('*') {
        Some(prefix) => bucket.starts_with(prefix),
        None => grant == bucket,
    }
}

/// Whether the operator's `grants` give `need` on `bucket` (and its
/// objects): read gives READ and READ_ACP, write gives WRITE, both give
/// everything.
#[must_use]
pub fn grants_give(grants: &[BucketGrant], bucket: &str, need: Permission) -> bool {
    let matching = || grants.iter().filter(|g| grant_matches(&g.name, bucket));
    let read = matching().any(|g| g.access.can_read());
    let write = matching().any(|g| g.access.can_write());
    match need {
        Permission::Read | Permission::ReadAcp => read,
        Permission::Write => write,
        Permission::WriteAcp | Permission::FullControl => read && write,
    }
}

/// The access check s3s runs before every operation: users and the store
/// (for bucket owners and ACLs).
#[derive(Debug, Clone)]
pub struct AccessCheck {
    users: Users,
    store: Arc<Store>,
}

impl AccessCheck {
    /// Creates the check.
    #[must_use]
    pub fn new(users: Users, store: Arc<Store>) -> Self {
        AccessCheck { users, store }
    }

    /// The check of operation `op` (an s3s operation name) on `bucket` by
    /// the user with `access_key` (`None`: anonymous), for callers outside
    /// s3s's access hook (the hipobj-rc-v2 server, which calls the handlers
    /// itself). Returns the bucket's metadata for the handler.
    ///
    /// # Errors
    /// `AccessDenied`, `NoSuchBucket`, `InternalError`: what the hook
    /// answers.
    pub fn authorize(
        &self,
        access_key: Option<&str>,
        op: &str,
        bucket: &str,
    ) -> S3Result<Option<Arc<BucketInfo>>> {
        let caller = match access_key {
            Some(k) => Some(self.users.get(k).ok_or_else(denied)?),
            None => None,
        };
        self.decide(caller, op, bucket, None)
    }

    /// The bucket-level rule for `op` on `bucket` (not the root); the
    /// bucket's metadata when it was read.
    fn decide(
        &self,
        caller: Option<&User>,
        op: &str,
        bucket: &str,
        expected_owner: Option<&str>,
    ) -> S3Result<Option<Arc<BucketInfo>>> {
        let need = need_of(op);
        if need == Need::Create {
            let Some(caller) = caller else {
                return Err(denied());
            };
            // An existing bucket answers 409 (owned by you or by another)
            // from the handler, whoever asks.
            if self.users.may_create(caller, bucket) || self.store.head_bucket(bucket).is_ok() {
                return Ok(None);
            }
            return Err(denied());
        }
        // A bucket that does not exist is 404 for everyone, as AWS answers.
        let info = self.store.head_bucket(bucket).map_err(|e| match e {
            StoreError::NoSuchBucket => {
                s3_error!(NoSuchBucket, "The specified bucket does not exist")
            }
            e => {
                tracing::error!(error = %e, "reading bucket metadata failed");
                s3_error!(
                    InternalError,
                    "We encountered an internal error. Please try again."
                )
            }
        })?;
        check_expected_owner(expected_owner, &self.users.bucket_owner(&info))?;
        let allowed = match need {
            Need::Nothing | Need::Create => false,
            Need::Object => true,
            Need::Bucket(p) => self.users.bucket_allows(caller, &info, p),
            Need::Owner => caller.is_some_and(|u| {
                u.canonical_id == self.users.bucket_owner(&info)
                    || grants_give(&u.buckets, &info.name, Permission::FullControl)
            }),
        };
        if !allowed {
            return Err(denied());
        }
        Ok(Some(Arc::new(info)))
    }
}

fn denied() -> s3s::S3Error {
    s3_error!(AccessDenied, "Access Denied")
}

/// `x-amz-expected-bucket-owner` (and `x-amz-source-expected-bucket-owner`
/// for a copy's source): when the caller names the owner it expects, a
/// bucket owned by anyone else answers 403 AccessDenied, as AWS does. AWS
/// compares account ids; s3dma has no accounts, so the value is compared
/// with the bucket owner's canonical id (64 hex digits, as ACLs and
/// ListBuckets show it).
///
/// # Errors
/// `AccessDenied` when `expected` is given and is not `owner`.
pub fn check_expected_owner(expected: Option<&str>, owner: &str) -> S3Result<()> {
    match expected {
        Some(e) if e.trim() != owner => Err(denied()),
        _ => Ok(()),
    }
}

#[async_trait::async_trait]
impl S3Auth for Users {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.by_key.get(access_key) {
            Some(u) => Ok(SecretKey::from(u.secret.as_str())),
            None => Err(s3_error!(
                InvalidAccessKeyId,
                "The AWS Access Key Id you provided does not exist in our records."
            )),
        }
    }
}

#[async_trait::async_trait]
impl S3Access for AccessCheck {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let op = cx.s3_op().name().to_owned();
        if let Some(slot) = cx.extensions_mut().get::<OpSlot>() {
            slot.set(&op);
        }
        // The connection's per-user share (`connections.per_user`).
        crate::http::claim_connection(cx)?;
        // s3s verified the signature with this user's secret.
        let caller = match cx.credentials() {
            Some(c) => Some(self.users.get(&c.access_key).ok_or_else(denied)?),
            None => None,
        };
        let need = need_of(&op);
        let bucket = match cx.s3_path() {
            S3Path::Root => {
                return if need == Need::Nothing && caller.is_some() {
                    Ok(())
                } else {
                    Err(denied())
                };
            }
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => bucket.to_string(),
        };
        let expected = cx
            .headers()
            .get("x-amz-expected-bucket-owner")
            .map(|v| v.to_str().unwrap_or("").to_owned());
        if let Some(info) = self.decide(caller, &op, &bucket, expected.as_deref())? {
            // The handler checks objects against the same owner and ACL
            // without reading the bucket again.
            cx.extensions_mut().insert(info);
        }
        Ok(())
    }

    // The source of a copy is an object: its handler checks READ on it.
    async fn copy_object(&self, _req: &mut S3Request<CopyObjectInput>) -> S3Result<()> {
        Ok(())
    }

    async fn upload_part_copy(&self, _req: &mut S3Request<UploadPartCopyInput>) -> S3Result<()> {
        Ok(())
    }

    // A POST form is signed in its body: refuse SigV2 there too.
    async fn post_object(&self, req: &mut S3Request<PostObjectInput>) -> S3Result<()> {
        crate::precheck::check_post_form(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Access;

    fn g(name: &str, access: Access) -> BucketGrant {
        BucketGrant {
            name: name.into(),
            access,
        }
    }

    #[test]
    fn grants() {
        let gs = [g("ro", Access::Read), g("wo", Access::Write)];
        assert!(grants_give(&gs, "ro", Permission::Read));
        assert!(grants_give(&gs, "ro", Permission::ReadAcp));
        assert!(!grants_give(&gs, "ro", Permission::Write));
        assert!(grants_give(&gs, "wo", Permission::Write));
        assert!(!grants_give(&gs, "wo", Permission::Read));
        assert!(!grants_give(&gs, "wo", Permission::WriteAcp));
        assert!(!grants_give(&gs, "other", Permission::Read));
        let pre = [g("bob-*", Access::ReadWrite)];
        assert!(grants_give(&pre, "bob-1", Permission::FullControl));
        assert!(!grants_give(&pre, "alice-1", Permission::Read));
        assert!(!grants_give(&pre, "bob", Permission::Read));
        let split = [g("b", Access::Read), g("b", Access::Write)];
        assert!(grants_give(&split, "b", Permission::WriteAcp));
        let all = [g("*", Access::ReadWrite)];
        assert!(grants_give(&all, "anything", Permission::Write));
        assert!(grants_give(&all, "anything", Permission::Read));
    }

    #[test]
    fn classification() {
        assert_eq!(need_of("GetObject"), Need::Object);
        assert_eq!(need_of("ListObjectsV2"), Need::Bucket(Permission::Read));
        assert_eq!(need_of("PutObject"), Need::Bucket(Permission::Write));
        assert_eq!(need_of("UploadPartCopy"), Need::Bucket(Permission::Write));
        assert_eq!(need_of("CreateBucket"), Need::Create);
        assert_eq!(need_of("PutBucketAcl"), Need::Bucket(Permission::WriteAcp));
        assert_eq!(
            need_of("PutBucketPolicy"),
            Need::Bucket(Permission::FullControl)
        );
        assert_eq!(need_of("DeleteBucket"), Need::Owner);
        assert_eq!(need_of("ListBuckets"), Need::Nothing);
    }
}
