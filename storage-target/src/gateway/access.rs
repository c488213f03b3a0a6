//! The gateway's access check ([`GatewayAccess`]): the operator's bucket
//! grants may only narrow what the upstream allows.

use s3s::access::{S3Access, S3AccessContext};
use s3s::dto::*;
use s3s::path::S3Path;
use s3s::{S3Request, S3Result, s3_error};

use crate::acl::Permission;
use crate::auth::{Need, Users, grants_give, need_of};
use crate::http::OpSlot;

/// The gateway's access check, before every operation: a signed request
/// from a configured user whose bucket grants in this server's
/// configuration allow the operation (they can only narrow what the
/// upstream allows; the upstream decides the rest). Anonymous requests are
/// refused: the gateway has no identity to re-sign them with.
#[derive(Debug, Clone)]
pub struct GatewayAccess {
    users: Users,
}

impl GatewayAccess {
    /// The check for these users.
    #[must_use]
    pub fn new(users: Users) -> Self {
        GatewayAccess { users }
    }

    /// The check of operation `op` (an s3s operation name) on `bucket` by
    /// `user`, for callers outside s3s's access hook (the hipobj-rc-v2
    /// server, which calls the gateway's handlers itself).
    ///
    /// # Errors
    /// `AccessDenied`, as the hook answers.
    pub fn authorize(&self, user: &str, op: &str, bucket: &str) -> S3Result<()> {
        if bucket.is_empty() || !self.allows(user, bucket, need_of(op)) {
            return Err(s3_error!(AccessDenied, "Access Denied"));
        }
        Ok(())
    }

    fn allows(&self, user: &str, bucket: &str, need: Need) -> bool {
        let Some(u) = self.users.get(user) else {
            return false;
        };
        match need {
            Need::Nothing => true,
            Need::Create => u.create_buckets || grants_give(&u.buckets, bucket, Permission::Write),
            Need::Bucket(p) => grants_give(&u.buckets, bucket, p),
            // The gateway knows no bucket owners: an operator read-write grant.
            Need::Owner => grants_give(&u.buckets, bucket, Permission::FullControl),
            Need::Object => grants_give(&u.buckets, bucket, Permission::Read),
        }
    }
}

#[async_trait::async_trait]
impl S3Access for GatewayAccess {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let op = cx.s3_op().name().to_owned();
        if let Some(slot) = cx.extensions_mut().get::<OpSlot>() {
            slot.set(&op);
        }
        crate::http::claim_connection(cx)?;
        let Some(user) = cx.credentials().map(|c| c.access_key.clone()) else {
            return Err(s3_error!(
                AccessDenied,
                "Access Denied (the gateway serves signed requests only)"
            ));
        };
        let mut need = need_of(&op);
        if op == "PutObjectAcl" {
            need = Need::Bucket(Permission::WriteAcp);
        }
        let bucket = match cx.s3_path() {
            S3Path::Root => String::new(),
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => bucket.to_string(),
        };
        if (bucket.is_empty() && need != Need::Nothing) || !self.allows(&user, &bucket, need) {
            return Err(s3_error!(AccessDenied, "Access Denied"));
        }
        Ok(())
    }

    // The source of a copy is read: a read grant on its bucket.
    async fn copy_object(&self, req: &mut S3Request<CopyObjectInput>) -> S3Result<()> {
        self.copy_source(req.credentials.as_ref(), &req.input.copy_source)
    }

    async fn upload_part_copy(&self, req: &mut S3Request<UploadPartCopyInput>) -> S3Result<()> {
        self.copy_source(req.credentials.as_ref(), &req.input.copy_source)
    }

    // A POST form is signed in its body: refuse SigV2 there too.
    async fn post_object(&self, req: &mut S3Request<s3s::dto::PostObjectInput>) -> S3Result<()> {
        crate::precheck::check_post_form(req)
    }
}

impl GatewayAccess {
    fn copy_source(&self, who: Option<&s3s::auth::Credentials>, src: &CopySource) -> S3Result<()> {
        let CopySource::Bucket { bucket, .. } = src else {
            return Err(s3_error!(
                NotImplemented,
                "access point copy sources are not supported"
            ));
        };
        match who {
            Some(c) if self.allows(&c.access_key, bucket, Need::Object) => Ok(()),
            _ => Err(s3_error!(AccessDenied, "Access Denied")),
        }
    }
}
