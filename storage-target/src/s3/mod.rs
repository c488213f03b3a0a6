//! The [`s3s::S3`] implementation of the filesystem store: translates S3
//! operations (s3s DTOs) into [`Store`] calls, and [`StoreError`]s into S3
//! errors ([`store_error`], the one place where that mapping lives).
//!
//! [`S3Api`]'s `impl S3` only delegates, one call per operation, to the
//! module of its concern:
//! - `bucket`: CreateBucket, HeadBucket, DeleteBucket, ListBuckets,
//!   GetBucketLocation.
//! - `object`: PutObject, GetObject, HeadObject, GetObjectAttributes,
//!   DeleteObject(s), CopyObject, and the HTTP/RDMA data path.
//! - `list`: ListObjectsV2, ListObjects, ListObjectVersions.
//! - `multipart`: the multipart upload calls, and who may act on an upload.
//! - `acl`: owners, ACL checks and documents, the ACL calls.
//! - `conditions`: conditional headers, ranges and parts a read selects.
//! - `dto`: conversions between s3s DTOs and the store's types.
//! - `error`: store, body and ACL errors as S3 errors.
//!
//! [`StoreError`]: crate::store::StoreError

/// The `x-amz-grant-*` headers of an s3s input (object writes carry no
/// `x-amz-grant-write`; buckets and the ACL calls do: `grant_write`).
macro_rules! grant_headers {
    ($input:expr) => {
        $crate::acl::GrantHeaders {
            read: $input.grant_read.as_deref(),
            write: None,
            read_acp: $input.grant_read_acp.as_deref(),
            write_acp: $input.grant_write_acp.as_deref(),
            full_control: $input.grant_full_control.as_deref(),
        }
    };
    ($input:expr, grant_write) => {
        $crate::acl::GrantHeaders {
            write: $input.grant_write.as_deref(),
            ..grant_headers!($input)
        }
    };
}

/// The attributes a PutObject or CreateMultipartUpload input gives the
/// object it writes (its headers and metadata, moved out of it), stamped
/// with the owner and ACL ([`S3Api::stamp`]); `?` on the bucket or ACL
/// errors.
macro_rules! stamped_attrs {
    ($s3:expr, $checked:expr, $caller:expr, $input:expr) => {{
        let mut attrs = $crate::s3::dto::make_attrs(
            $input.content_type,
            $input.content_encoding,
            $input.content_disposition,
            $input.content_language,
            $input.cache_control,
            $input.expires,
            $input.metadata,
        );
        $s3.stamp(
            &mut attrs,
            $caller,
            &*$s3.bucket_info($checked, &$input.bucket)?,
            $input.acl.as_ref().map(s3s::dto::ObjectCannedACL::as_str),
            &grant_headers!($input),
        )?;
        attrs
    }};
}

/// Opens the object a request on one object names (`$req.input`'s bucket,
/// key and version id, which must be none or `null`) if its caller holds
/// `$need` on it ([`S3Api::open_for`]), binding the caller, the input
/// (moved out of the request) and the reader; `?` on the errors.
macro_rules! open_input {
    ($s3:ident, $req:ident, $need:expr => $caller:ident, $input:ident, $reader:ident) => {
        let $caller = $s3.caller(&$req);
        let $input = $req.input;
        let $reader = $s3
            .open_for(
                &$req.extensions,
                $caller,
                (&$input.bucket, &$input.key, $input.version_id.as_deref()),
                $need,
            )
            .await?;
    };
}

/// The `x-amz-copy-source-if-*` conditions of a CopyObject or
/// UploadPartCopy input, moved out of it.
macro_rules! copy_source_conditions {
    ($input:expr) => {
        $crate::store::conditions::Conditions {
            if_match: $input.copy_source_if_match.map($crate::s3::dto::etag_cond),
            if_none_match: $input
                .copy_source_if_none_match
                .map($crate::s3::dto::etag_cond),
            if_modified_since: $input
                .copy_source_if_modified_since
                .map($crate::s3::dto::ts_secs),
            if_unmodified_since: $input
                .copy_source_if_unmodified_since
                .map($crate::s3::dto::ts_secs),
        }
    };
}

mod acl;
mod bucket;
mod conditions;
mod dto;
mod error;
mod list;
mod multipart;
mod object;

use std::sync::Arc;

use s3s::dto::*;
use s3s::{S3, S3Request, S3Response, S3Result};

use crate::auth::Users;
use crate::config::User;
use crate::rdma::RdmaService;
use crate::store::{BucketInfo, Store};
pub(crate) use dto::byte_range;
pub use error::store_error;
pub use object::IndexedHead;

/// Content type returned for objects stored without one (as S3 does).
pub const DEFAULT_CONTENT_TYPE: &str = "binary/octet-stream";

/// The S3 front end of a [`Store`].
#[derive(Debug, Clone)]
pub struct S3Api {
    store: Arc<Store>,
    region: String,
    users: Users,
    rdma: Arc<RdmaService>,
}

impl S3Api {
    /// Creates the front end; `rdma` serves (or declines) requests that
    /// carry `x-amz-rdma-token`.
    #[must_use]
    pub fn new(store: Arc<Store>, region: String, users: Users, rdma: Arc<RdmaService>) -> Self {
        S3Api {
            store,
            region,
            users,
            rdma,
        }
    }
}

/// What every handler asks: who signed, and the bucket's metadata.
impl S3Api {
    /// Whether `access_key` is one of the configured users.
    #[must_use]
    pub fn knows(&self, access_key: &str) -> bool {
        self.users.get(access_key).is_some()
    }

    /// The configured user who signed the request (`None`: anonymous).
    fn caller<T>(&self, req: &S3Request<T>) -> Option<&User> {
        req.credentials
            .as_ref()
            .and_then(|c| self.users.get(&c.access_key))
    }

    /// The metadata of `bucket`: the copy the access check read for this
    /// request (request extensions), or the store's.
    fn bucket_info(&self, checked: &http::Extensions, bucket: &str) -> S3Result<Arc<BucketInfo>> {
        match checked.get::<Arc<BucketInfo>>() {
            Some(info) if info.name == bucket => Ok(Arc::clone(info)),
            _ => self
                .store
                .head_bucket(bucket)
                .map(Arc::new)
                .map_err(store_error),
        }
    }
}

#[async_trait::async_trait]
impl S3 for S3Api {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        bucket::create_bucket(self, req).await
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        bucket::head_bucket(self, req).await
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        bucket::delete_bucket(self, req).await
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        bucket::list_buckets(self, req).await
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        bucket::get_bucket_location(self, req).await
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        object::put_object(self, req).await
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        object::get_object(self, req).await
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        object::head_object(self, req).await
    }

    async fn get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        object::get_object_attributes(self, req).await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        object::delete_object(self, req).await
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        object::delete_objects(self, req).await
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        object::copy_object(self, req).await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        list::list_objects_v2(self, req).await
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        list::list_objects(self, req).await
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        list::list_object_versions(self, req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        multipart::create_multipart_upload(self, req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        multipart::upload_part(self, req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        multipart::complete_multipart_upload(self, req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        multipart::abort_multipart_upload(self, req).await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        multipart::list_parts(self, req).await
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        multipart::list_multipart_uploads(self, req).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        multipart::upload_part_copy(self, req).await
    }

    async fn get_bucket_acl(
        &self,
        req: S3Request<GetBucketAclInput>,
    ) -> S3Result<S3Response<GetBucketAclOutput>> {
        acl::get_bucket_acl(self, req).await
    }

    async fn put_bucket_acl(
        &self,
        req: S3Request<PutBucketAclInput>,
    ) -> S3Result<S3Response<PutBucketAclOutput>> {
        acl::put_bucket_acl(self, req).await
    }

    async fn get_object_acl(
        &self,
        req: S3Request<GetObjectAclInput>,
    ) -> S3Result<S3Response<GetObjectAclOutput>> {
        acl::get_object_acl(self, req).await
    }

    async fn put_object_acl(
        &self,
        req: S3Request<PutObjectAclInput>,
    ) -> S3Result<S3Response<PutObjectAclOutput>> {
        acl::put_object_acl(self, req).await
    }
}
