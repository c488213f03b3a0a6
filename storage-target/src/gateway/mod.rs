//! `store: s3`: the storage-target as an RDMA gateway in front of an
//! existing S3 cluster (Ceph RGW, MinIO, an appliance) that speaks no RDMA.
//!
//! The gateway serves the same S3 API as the filesystem store, over HTTP
//! and over `x-amz-rdma-token`:
//! * Identity passes through: s3s verifies the caller's SigV4 with that
//!   user's secret (as for the filesystem store), and the gateway re-signs
//!   its upstream requests as the same user ([`upstream`]), so the cluster's
//!   policies decide. The user's bucket grants in this server's
//!   configuration may only narrow them ([`GatewayAccess`]).
//! * Reads over RDMA go through a read cache in fabric-registered memory
//!   ([`cache`]): a hit is one RDMA WRITE from the cache into the tenant's
//!   window. Every read first confirms upstream, as the user, that the user
//!   may read the object and which version (ETag) is current (a HEAD), or
//!   takes that confirmation from the last `cache.revalidate_after` seconds
//!   (default 0: every read asks). Chunks are cached per version identity
//!   (ETag, size, Last-Modified, version id, kept checksums; an MD5 ETag
//!   alone can be forged with a colliding body) and fetched with `If-Match`
//!   and `If-Unmodified-Since`, their answers checked against that
//!   identity, so a read never mixes versions, and bytes a user could not
//!   read upstream are never served to that user.
//! * Writes over RDMA stream through to the upstream (PutObject,
//!   UploadPart): the tenant's bytes are RDMA READ and sent on as the body;
//!   the request succeeds only when the upstream acknowledged it, and a
//!   failed stream leaves no object (the upstream sees a short body).
//! * Everything else (HTTP GET/PUT, listings, multipart bookkeeping,
//!   deletes, copies, buckets) is forwarded as is with `s3s-aws`.
//!
//! Modules: [`upstream`] (the endpoints and their clients), [`cache`] and
//! [`policy`] (the read cache and its eviction); privately, `read` (GetObject
//! over RDMA: confirmation, chunks, prefetch), `write` (PutObject and
//! UploadPart over RDMA, write-allocate), `forward` (everything passed on as
//! it is, and the errors of an unanswered upstream) and `access`
//! ([`GatewayAccess`]). The configuration sections are
//! [`crate::config::gateway`]'s.
//!
//! Not passed through yet: versioning (`versionId`), SSE-C keys on RDMA
//! requests, `partNumber` on RDMA GETs, lifecycle and bucket configuration
//! calls, ACL calls.

mod access;
pub mod cache;
mod forward;
pub mod policy;
mod read;
pub mod upstream;
mod write;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use s3s::dto::*;
use s3s::{S3, S3Request, S3Response, S3Result};

pub use crate::config::gateway::{CacheConfig, StoreKind, UpstreamConfig};
use crate::rdma::RdmaService;
pub use access::GatewayAccess;
use cache::ChunkCache;
use read::Head;
pub use upstream::{Upstream, UpstreamError, https_client};

/// Who read what: (user, bucket, key).
type Reader = (String, String, String);

/// The gateway: the [`s3s::S3`] implementation of `store: s3`. Clones
/// share everything (the hipobj-rc-v2 server holds one).
#[derive(Debug, Clone)]
pub struct Gateway {
    upstream: Arc<Upstream>,
    cache: Option<Arc<ChunkCache>>,
    rdma: Arc<RdmaService>,
    revalidate_after: Duration,
    settle_after: u64,
    prefetch: u64,
    write_allocate_max: u64,
    /// Recent upstream confirmations, by (user, bucket, key), when
    /// `revalidate_after` > 0.
    confirmed: Arc<Mutex<HashMap<Reader, (Instant, Head)>>>,
}

/// The gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The upstream clients could not be built.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The cache memory could not be registered.
    #[error("registering the {bytes}-byte read cache with the fabric failed: {source}")]
    Cache {
        /// Its size.
        bytes: u64,
        /// The fabric's error.
        source: fabric::FabricError,
    },
}

impl Gateway {
    /// Builds the gateway: upstream clients for every user, and the cache
    /// registered on the RDMA service's fabric (none when RDMA is off).
    ///
    /// # Errors
    /// [`GatewayError`].
    pub fn new(
        upstream: &UpstreamConfig,
        cache: &CacheConfig,
        region: &str,
        users: &[crate::config::User],
        rdma: Arc<RdmaService>,
    ) -> Result<Self, GatewayError> {
        let metrics = Arc::clone(rdma.metrics());
        let upstream = Arc::new(Upstream::new(
            upstream,
            region,
            users,
            Arc::clone(&metrics),
        )?);
        let chunk = usize::try_from(cache.chunk_size.0).unwrap_or(usize::MAX);
        let pool =
            rdma.register_pool(cache.slots(), chunk)
                .map_err(|source| GatewayError::Cache {
                    bytes: cache.size.0,
                    source,
                })?;
        let cache_ = pool.map(|p| Arc::new(ChunkCache::new(p, cache.policy, metrics)));
        Ok(Gateway {
            upstream,
            cache: cache_,
            rdma,
            revalidate_after: Duration::from_secs_f64(cache.revalidate_after),
            settle_after: cache.settle_after,
            prefetch: u64::from(cache.prefetch_chunks),
            write_allocate_max: cache.write_allocate_max.0,
            confirmed: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    /// The upstream.
    #[must_use]
    pub fn upstream(&self) -> &Arc<Upstream> {
        &self.upstream
    }
}

/// Operations the gateway serves itself (reads and writes, which may be
/// RDMA ones) call into its read and write paths; every other one is
/// forwarded as it is.
#[async_trait::async_trait]
impl S3 for Gateway {
    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        self.get(req).await
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        self.put(req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.put_part(req).await
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        self.forward(req, |p, r| async move { p.head_object(r).await })
            .await
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        self.forward(req, |p, r| async move { p.list_objects(r).await })
            .await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        self.forward(req, |p, r| async move { p.list_objects_v2(r).await })
            .await
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        self.forward(req, |p, r| async move { p.list_buckets(r).await })
            .await
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.forward(req, |p, r| async move { p.head_bucket(r).await })
            .await
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        self.forward(req, |p, r| async move { p.create_bucket(r).await })
            .await
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        self.forward(req, |p, r| async move { p.delete_bucket(r).await })
            .await
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.forward(req, |p, r| async move { p.get_bucket_location(r).await })
            .await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        self.forward(req, |p, r| async move { p.delete_object(r).await })
            .await
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        self.forward(req, |p, r| async move { p.delete_objects(r).await })
            .await
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        self.forward(req, |p, r| async move { p.copy_object(r).await })
            .await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.forward(
            req,
            |p, r| async move { p.create_multipart_upload(r).await },
        )
        .await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        self.forward(
            req,
            |p, r| async move { p.complete_multipart_upload(r).await },
        )
        .await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.forward(req, |p, r| async move { p.abort_multipart_upload(r).await })
            .await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        self.forward(req, |p, r| async move { p.list_parts(r).await })
            .await
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        self.forward(req, |p, r| async move { p.list_multipart_uploads(r).await })
            .await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        self.forward(req, |p, r| async move { p.upload_part_copy(r).await })
            .await
    }
}
