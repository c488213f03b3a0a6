//! Users and their bucket rights: [`s3s::auth::S3Auth`] (secret lookup for
//! SigV4 verification, done by s3s) and [`s3s::access::S3Access`]
//! (per-operation read/write checks).

use std::collections::HashMap;
use std::sync::Arc;

use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::dto::{CopyObjectInput, CopySource};
use s3s::path::S3Path;
use s3s::{S3Request, S3Result, s3_error};

use crate::config::{BucketGrant, User};
use crate::server::OpSlot;

/// What an operation needs on its bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing bucket-specific (ListBuckets).
    Nothing,
    /// Read access.
    Read,
    /// Write access.
    Write,
}

/// Classifies an S3 operation (by s3s operation name).
#[must_use]
pub fn need_of(op: &str) -> Need {
    match op {
        "ListBuckets" => Need::Nothing,
        "GetObject"
        | "HeadObject"
        | "ListObjects"
        | "ListObjectsV2"
        | "HeadBucket"
        | "GetBucketLocation"
        | "ListParts"
        | "ListMultipartUploads" => Need::Read,
        // Everything else, including operations we do not implement, needs write.
        _ => Need::Write,
    }
}

/// The configured users.
#[derive(Debug, Clone)]
pub struct Users {
    by_key: Arc<HashMap<String, User>>,
}

impl Users {
    /// Builds the user table.
    #[must_use]
    pub fn new(users: Vec<User>) -> Self {
        Users {
            by_key: Arc::new(
                users
                    .into_iter()
                    .map(|u| (u.access_key_id.clone(), u))
                    .collect(),
            ),
        }
    }

    /// Whether `access_key` may do `need` on `bucket`.
    #[must_use]
    pub fn allowed(&self, access_key: &str, bucket: &str, need: Need) -> bool {
        let Some(u) = self.by_key.get(access_key) else {
            return false;
        };
        grants_allow(&u.buckets, bucket, need)
    }
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

/// Whether `grants` allow `need` on `bucket` (see [`grant_matches`]).
#[must_use]
pub fn grants_allow(grants: &[BucketGrant], bucket: &str, need: Need) -> bool {
    match need {
        Need::Nothing => true,
        Need::Read => grants
            .iter()
            .any(|g| grant_matches(&g.name, bucket) && g.access.can_read()),
        Need::Write => grants
            .iter()
            .any(|g| grant_matches(&g.name, bucket) && g.access.can_write()),
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
impl S3Access for Users {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let op = cx.s3_op().name().to_owned();
        if let Some(slot) = cx.extensions_mut().get::<OpSlot>() {
            slot.set(&op);
        }
        let Some(cred) = cx.credentials() else {
            return Err(s3_error!(AccessDenied, "Anonymous access is not allowed"));
        };
        let need = need_of(&op);
        let allowed = match cx.s3_path() {
            S3Path::Root => need == Need::Nothing,
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => {
                self.allowed(&cred.access_key, bucket, need)
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(s3_error!(AccessDenied, "Access Denied"))
        }
    }

    async fn copy_object(&self, req: &mut S3Request<CopyObjectInput>) -> S3Result<()> {
        let Some(cred) = &req.credentials else {
            return Err(s3_error!(AccessDenied, "Anonymous access is not allowed"));
        };
        match &req.input.copy_source {
            CopySource::Bucket { bucket, .. } => {
                if self.allowed(&cred.access_key, bucket, Need::Read) {
                    Ok(())
                } else {
                    Err(s3_error!(AccessDenied, "Access Denied"))
                }
            }
            _ => Err(s3_error!(
                NotImplemented,
                "Only bucket copy sources are supported"
            )),
        }
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
        assert!(grants_allow(&gs, "ro", Need::Read));
        assert!(!grants_allow(&gs, "ro", Need::Write));
        assert!(grants_allow(&gs, "wo", Need::Write));
        assert!(!grants_allow(&gs, "wo", Need::Read));
        assert!(!grants_allow(&gs, "other", Need::Read));
        assert!(grants_allow(&gs, "other", Need::Nothing));
        let pre = [g("bob-*", Access::ReadWrite)];
        assert!(grants_allow(&pre, "bob-1", Need::Write));
        assert!(!grants_allow(&pre, "alice-1", Need::Read));
        assert!(!grants_allow(&pre, "bob", Need::Read));
        let all = [g("*", Access::ReadWrite)];
        assert!(grants_allow(&all, "anything", Need::Write));
        assert!(grants_allow(&all, "anything", Need::Read));
    }

    #[test]
    fn classification() {
        assert_eq!(need_of("GetObject"), Need::Read);
        assert_eq!(need_of("ListObjectsV2"), Need::Read);
        assert_eq!(need_of("PutObject"), Need::Write);
        assert_eq!(need_of("CreateBucket"), Need::Write);
        assert_eq!(need_of("PutBucketPolicy"), Need::Write);
        assert_eq!(need_of("ListBuckets"), Need::Nothing);
    }
}
