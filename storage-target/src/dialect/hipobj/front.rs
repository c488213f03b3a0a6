//! What the hipobj-rc-v2 server reads and writes objects through: the
//! store this server fronts (the filesystem store, or the gateway's
//! upstream), with the same access check an HTTP request gets.
//!
//! s3s runs a service's access hook before it calls a handler; the control
//! requests call the handlers themselves, so [`HipobjFront::authorize`]
//! runs that hook's rule for the operation first (a PUT then needs WRITE on
//! the bucket, as over HTTP: a signed user of this server may not write
//! into another user's bucket through the dialect).

use std::sync::Arc;

use http::Extensions;
use s3s::dto::{
    GetObjectInput, GetObjectOutput, PutObjectInput, PutObjectOutput, UploadPartInput,
    UploadPartOutput,
};
use s3s::{S3, S3Request, S3Response, S3Result};

use crate::auth::AccessCheck;
use crate::gateway::{Gateway, GatewayAccess};
use crate::s3::S3Api;

/// A store the hipobj-rc-v2 server serves.
#[async_trait::async_trait]
pub trait HipobjFront: Send + Sync + std::fmt::Debug + 'static {
    /// Whether `access_key` is one of this server's users.
    fn knows(&self, access_key: &str) -> bool;

    /// The access hook's rule for `op` (`GetObject`, `PutObject`,
    /// `UploadPart`) on `bucket` by `access_key`: what the handler's
    /// request carries in its extensions when it is allowed.
    async fn authorize(&self, access_key: &str, op: &str, bucket: &str) -> S3Result<Extensions>;

    /// UploadPart's initiator rule for `access_key` on the in-progress
    /// upload `upload_id` of `bucket`/`key` (`checked`: what
    /// [`HipobjFront::authorize`] left): only its initiator or the bucket's
    /// owner may put parts into it, checked at PREPARE. The default (the
    /// gateway) leaves it to the store's UploadPart handler.
    async fn may_upload_part(
        &self,
        access_key: &str,
        bucket: &str,
        key: &str,
        upload_id: &str,
        checked: &Extensions,
    ) -> S3Result<()> {
        let _ = (access_key, bucket, key, upload_id, checked);
        Ok(())
    }

    /// The store's S3 handlers.
    fn handlers(&self) -> &dyn S3;

    /// The store's GetObject handler.
    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        self.handlers().get_object(req).await
    }

    /// The store's PutObject handler.
    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        self.handlers().put_object(req).await
    }

    /// The store's UploadPart handler.
    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.handlers().upload_part(req).await
    }
}

/// The filesystem store and its access check.
#[derive(Debug, Clone)]
pub struct StoreFront {
    s3: S3Api,
    access: AccessCheck,
}

impl StoreFront {
    /// The store `s3`, checked by `access` (the service's hook).
    #[must_use]
    pub fn shared(s3: S3Api, access: AccessCheck) -> Arc<dyn HipobjFront> {
        Arc::new(StoreFront { s3, access })
    }
}

#[async_trait::async_trait]
impl HipobjFront for StoreFront {
    fn knows(&self, access_key: &str) -> bool {
        self.s3.knows(access_key)
    }

    async fn authorize(&self, access_key: &str, op: &str, bucket: &str) -> S3Result<Extensions> {
        let mut ext = Extensions::new();
        // The bucket's metadata, read once, as the hook leaves it.
        if let Some(info) = self.access.authorize(Some(access_key), op, bucket)? {
            ext.insert(info);
        }
        Ok(ext)
    }

    async fn may_upload_part(
        &self,
        access_key: &str,
        bucket: &str,
        key: &str,
        upload_id: &str,
        checked: &Extensions,
    ) -> S3Result<()> {
        self.s3
            .may_upload_part(checked, access_key, bucket, key, upload_id)
    }

    fn handlers(&self) -> &dyn S3 {
        &self.s3
    }
}

/// The gateway (`store: s3`) and its access check: the operator's bucket
/// grants here, then the upstream's own answer as the same user.
#[derive(Debug, Clone)]
pub struct GatewayFront {
    gateway: Gateway,
    access: GatewayAccess,
    users: crate::auth::Users,
}

impl GatewayFront {
    /// The gateway, checked by `access` (the service's hook) for `users`.
    #[must_use]
    pub fn shared(
        gateway: Gateway,
        access: GatewayAccess,
        users: crate::auth::Users,
    ) -> Arc<dyn HipobjFront> {
        Arc::new(GatewayFront {
            gateway,
            access,
            users,
        })
    }
}

#[async_trait::async_trait]
impl HipobjFront for GatewayFront {
    fn knows(&self, access_key: &str) -> bool {
        self.users.get(access_key).is_some()
    }

    async fn authorize(&self, access_key: &str, op: &str, bucket: &str) -> S3Result<Extensions> {
        self.access.authorize(access_key, op, bucket)?;
        Ok(Extensions::new())
    }

    fn handlers(&self) -> &dyn S3 {
        &self.gateway
    }
}
