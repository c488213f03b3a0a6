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
//! Not passed through yet: versioning (`versionId`), SSE-C keys on RDMA
//! requests, `partNumber` on RDMA GETs, lifecycle and bucket configuration
//! calls, ACL calls.

pub mod cache;
pub mod policy;
pub mod upstream;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use aws_sdk_s3::primitives::ByteStream;
use futures::{StreamExt as _, TryStreamExt as _};
use http::HeaderMap;
use s3s::access::{S3Access, S3AccessContext};
use s3s::dto::*;
use s3s::path::S3Path;
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};
use tracing::warn;

use crate::acl::Permission;
use crate::auth::{Need, Users, grants_give, need_of};
pub use crate::config::gateway::{CacheConfig, StoreKind, UpstreamConfig};
use crate::rdma::plan::{check_fits, reply_headers};
use crate::rdma::{Decision, RdmaService, transfer};
use crate::server::OpSlot;
use cache::{Chunk, ChunkCache, ChunkKey, Identity, Source};
use fabric::pool::StagingBuf;
pub use upstream::{Upstream, UpstreamError};

/// What the upstream confirmed about an object for one user: its version
/// and the headers a GET answers with.
#[derive(Debug, Clone)]
struct Head {
    id: Arc<Identity>,
    /// The answer's `Date` (the upstream's clock, whole seconds).
    date: Option<i64>,
    /// When the answer came.
    received: Instant,
    last_modified: Option<Timestamp>,
    content_type: Option<String>,
    metadata: Option<Metadata>,
    cache_control: Option<String>,
    content_disposition: Option<String>,
    content_encoding: Option<String>,
    content_language: Option<String>,
}

impl Head {
    fn from_upstream(
        out: &aws_sdk_s3::operation::head_object::HeadObjectOutput,
        date: Option<i64>,
    ) -> S3Result<Head> {
        let etag = out.e_tag().filter(|e| !e.is_empty()).ok_or_else(|| {
            s3_error!(
                InternalError,
                "the upstream S3 endpoint answered HeadObject without an ETag"
            )
        })?;
        let size = out
            .content_length()
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| {
                s3_error!(
                    InternalError,
                    "the upstream S3 endpoint answered HeadObject without a Content-Length"
                )
            })?;
        let checksums = checksums([
            ("crc32", out.checksum_crc32()),
            ("crc32c", out.checksum_crc32_c()),
            ("crc64nvme", out.checksum_crc64_nvme()),
            ("sha1", out.checksum_sha1()),
            ("sha256", out.checksum_sha256()),
        ]);
        Ok(Head {
            id: Arc::new(Identity {
                etag: etag.to_owned(),
                size,
                last_modified: out
                    .last_modified()
                    .map(aws_sdk_s3::primitives::DateTime::secs),
                version_id: version_id(out.version_id()),
                checksums,
            }),
            date,
            received: Instant::now(),
            last_modified: out.last_modified().and_then(|t| {
                time::OffsetDateTime::from_unix_timestamp_nanos(
                    i128::from(t.secs()) * 1_000_000_000 + i128::from(t.subsec_nanos()),
                )
                .ok()
                .map(Timestamp::from)
            }),
            content_type: out.content_type().map(str::to_owned),
            metadata: out.metadata().cloned(),
            cache_control: out.cache_control().map(str::to_owned),
            content_disposition: out.content_disposition().map(str::to_owned),
            content_encoding: out.content_encoding().map(str::to_owned),
            content_language: out.content_language().map(str::to_owned),
        })
    }

    fn etag_dto(&self) -> Option<ETag> {
        ETag::parse_http_header(self.id.etag.as_bytes()).ok()
    }

    /// How chunks of this version settle for a read confirmed by this
    /// answer: whether the read may be served only settled chunks, and how
    /// long after the answer came its fetches wait so that what they read
    /// is settled (`None`: they do not wait, and their chunks are not).
    ///
    /// A write that gives a version the same identity (an MD5-colliding
    /// body of the same size) must happen within its Last-Modified second
    /// `s`. Bytes read once the upstream's clock reached `s + 1 +
    /// settle_after` (`settle_after` covers the differences between its
    /// endpoints' clocks) are therefore the version's last word: settled.
    /// The answer was made at `Date` `d` or later, so that point is at
    /// most `s + 1 + settle_after - d` seconds after it arrived; a fetch
    /// waits that long (at most `2 + settle_after` s; a longer wait, from
    /// clocks further apart, is not made and leaves the chunk unsettled).
    /// A read confirmed before that point may take unsettled chunks too (it
    /// races the writer, as a read straight from the cluster would); later
    /// reads need settled ones. Without a `Date` or Last-Modified nothing
    /// settles by time. (A version id pins a chunk however early it was
    /// read when the ranged read's answer names the same version:
    /// `fetch_chunk`.)
    fn settling(&self, settle_after: u64) -> (bool, Option<Duration>) {
        // `CacheConfig::check` allows no more.
        let settle_after = settle_after.min(3600);
        let settle = i64::try_from(settle_after).unwrap_or(i64::MAX);
        let (Some(d), Some(s)) = (self.date, self.id.last_modified) else {
            return (true, None);
        };
        let at = s.saturating_add(1).saturating_add(settle);
        if d >= at {
            return (true, Some(Duration::ZERO));
        }
        let wait = u64::try_from(at - d).unwrap_or(u64::MAX);
        if wait <= settle_after.saturating_add(2) {
            (false, Some(Duration::from_secs(wait)))
        } else {
            (false, None)
        }
    }
}

/// The checksums an upstream answer carries, as `algorithm=value`, sorted.
fn checksums<'a>(all: impl IntoIterator<Item = (&'a str, Option<&'a str>)>) -> Vec<String> {
    let mut v: Vec<String> = all
        .into_iter()
        .filter_map(|(a, c)| c.filter(|c| !c.is_empty()).map(|c| format!("{a}={c}")))
        .collect();
    v.sort();
    v
}

/// A version id as an identity holds it: `null` (an unversioned write in a
/// versioned bucket, reused by the next one) is none.
fn version_id(v: Option<&str>) -> Option<String> {
    v.filter(|v| !v.is_empty() && *v != "null")
        .map(str::to_owned)
}

/// Who read what: (user, bucket, key).
type Reader = (String, String, String);

/// The gateway: the [`s3s::S3`] implementation of `store: s3`.
#[derive(Debug)]
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
    confirmed: Mutex<HashMap<Reader, (Instant, Head)>>,
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
            confirmed: Mutex::new(HashMap::new()),
        })
    }

    /// The upstream.
    #[must_use]
    pub fn upstream(&self) -> &Arc<Upstream> {
        &self.upstream
    }

    /// Forwards an operation as it is, as the caller, to the first endpoint
    /// that answers.
    async fn forward<T, O, F, Fut>(&self, req: S3Request<T>, op: F) -> S3Result<S3Response<O>>
    where
        T: Clone,
        F: Fn(s3s_aws::Proxy, S3Request<T>) -> Fut,
        Fut: std::future::Future<Output = S3Result<S3Response<O>>>,
    {
        let proxies = self.upstream.proxies(&access_key(&req))?;
        let n = proxies.len();
        let mut last = None;
        for (i, p) in proxies.into_iter().enumerate() {
            match op(p, req.clone()).await {
                Ok(r) => return Ok(r),
                // s3s-aws leaves the status unset when no answer came back.
                Err(e) if e.status_code().is_none() && i + 1 < n => last = Some(e),
                Err(e) => return Err(unreachable_if_unanswered(e)),
            }
        }
        Err(unreachable_if_unanswered(last.unwrap_or_else(|| {
            S3Error::new(S3ErrorCode::InternalError)
        })))
    }

    /// Forwards an operation whose body can be sent only once: one endpoint.
    async fn forward_once<T, O, F, Fut>(&self, req: S3Request<T>, op: F) -> S3Result<S3Response<O>>
    where
        F: FnOnce(s3s_aws::Proxy, S3Request<T>) -> Fut,
        Fut: std::future::Future<Output = S3Result<S3Response<O>>>,
    {
        let p = self
            .upstream
            .proxies(&access_key(&req))?
            .into_iter()
            .next()
            .ok_or_else(|| S3Error::new(S3ErrorCode::InternalError))?;
        op(p, req).await.map_err(unreachable_if_unanswered)
    }

    /// The upstream's confirmation that `user` may read `bucket`/`key`, and
    /// of its version: a HEAD as the user with the request's conditions, or
    /// a recent one (within `revalidate_after`, for unconditional reads).
    async fn confirm(
        &self,
        user: &str,
        bucket: &str,
        key: &str,
        headers: &HeaderMap,
    ) -> S3Result<Head> {
        let cond = |name: http::HeaderName| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let if_match = cond(http::header::IF_MATCH);
        let if_none_match = cond(http::header::IF_NONE_MATCH);
        let if_modified_since = cond(http::header::IF_MODIFIED_SINCE);
        let if_unmodified_since = cond(http::header::IF_UNMODIFIED_SINCE);
        let conditional = if_match.is_some()
            || if_none_match.is_some()
            || if_modified_since.is_some()
            || if_unmodified_since.is_some();
        let id = (user.to_owned(), bucket.to_owned(), key.to_owned());
        if !self.revalidate_after.is_zero() && !conditional {
            let recent = self
                .confirmed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&id)
                .filter(|(at, _)| at.elapsed() < self.revalidate_after)
                .map(|(_, h)| h.clone());
            if let Some(h) = recent {
                self.upstream.metrics().revalidation("recent");
                return Ok(h);
            }
        }
        let date = |v: Option<String>| {
            v.and_then(|s| {
                aws_sdk_s3::primitives::DateTime::from_str(
                    &s,
                    aws_sdk_s3::primitives::DateTimeFormat::HttpDate,
                )
                .ok()
            })
        };
        let (ims, ius) = (date(if_modified_since), date(if_unmodified_since));
        let asked = Instant::now();
        let date = upstream::DateOfAnswer::default();
        let out = self
            .upstream
            .call(user, "HeadObject", |c| {
                c.head_object()
                    .bucket(bucket)
                    .key(key)
                    .set_if_match(if_match.clone())
                    .set_if_none_match(if_none_match.clone())
                    .set_if_modified_since(ims)
                    .set_if_unmodified_since(ius)
                    .checksum_mode(aws_sdk_s3::types::ChecksumMode::Enabled)
                    .customize()
                    .interceptor(date.clone())
                    .send()
            })
            .await?;
        self.upstream.metrics().revalidation("upstream");
        let head = Head::from_upstream(&out, date.get())?;
        if !self.revalidate_after.is_zero() {
            let mut m = self
                .confirmed
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            m.retain(|_, (at, _)| at.elapsed() < self.revalidate_after);
            m.insert(id, (asked, head.clone()));
        }
        Ok(head)
    }

    /// GetObject over RDMA: confirm upstream, then each chunk of the range
    /// from the cache (or the upstream, into the cache) by one RDMA WRITE.
    async fn rdma_get(
        &self,
        req: S3Request<GetObjectInput>,
        token: &fabric::RdmaToken,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let cache = self
            .cache
            .as_ref()
            .ok_or_else(|| internal("RDMA is on but the gateway has no cache"))?;
        let user = access_key(&req);
        let input = &req.input;
        if input.version_id.is_some() {
            return Err(s3_error!(
                NotImplemented,
                "the gateway does not pass versionId through yet"
            ));
        }
        if input.part_number.is_some() {
            return Err(s3_error!(
                NotImplemented,
                "partNumber is not supported on RDMA reads through the gateway; use a Range"
            ));
        }
        if input.sse_customer_key.is_some() {
            return Err(s3_error!(
                NotImplemented,
                "SSE-C is not supported on RDMA reads through the gateway"
            ));
        }
        let (bucket, key) = (input.bucket.as_str(), input.key.as_str());
        let head = self.confirm(&user, bucket, key, &req.headers).await?;
        let size = head.id.size;
        let (range, content_range) = match input.range {
            None => (0..size, None),
            Some(r) => {
                let r = crate::s3::byte_range(r).resolve(size).map_err(|_| {
                    s3_error!(InvalidRange, "The requested range is not satisfiable")
                })?;
                let cr = s3dma_wire::range::content_range(&r, size);
                (r, Some(cr))
            }
        };
        let len = range.end - range.start;
        check_fits(len, u64::from(token.size))
            .map_err(|e| crate::rdma::RdmaError::from(e).to_s3())?;
        if len > 0 {
            let ctx = self.rdma.ctx(token, &user).await.map_err(|e| e.to_s3())?;
            let cs = cache.chunk_size() as u64;
            let (first, last) = (range.start / cs, (range.end - 1) / cs);
            let (need_settled, wait) = head.settling(self.settle_after);
            let obj = ObjectVersion {
                bucket: bucket.into(),
                key: key.into(),
                id: Arc::clone(&head.id),
                need_settled,
                settled_at: wait.and_then(|w| head.received.checked_add(w)),
            };
            let remote = token.remote();
            let depth = ctx.depth.max(1);
            futures::stream::iter(first..=last)
                .map(|i| {
                    let (obj, ctx, range) = (&obj, &ctx, range.clone());
                    let user = user.as_str();
                    async move {
                        let (chunk, source) = self.chunk(cache, obj, i, user).await?;
                        let c_start = i * cs;
                        let from = range.start.max(c_start);
                        let to = range.end.min(c_start + chunk.len() as u64);
                        let n = to - from;
                        let local = chunk
                            .slice(to_usize(from - c_start), to_usize(n))
                            .map_err(|e| internal(&format!("cache slice: {e}")))?;
                        let done = transfer::write_slice(
                            ctx,
                            local,
                            Arc::clone(&chunk),
                            remote,
                            from - range.start,
                        )
                        .await;
                        done.await
                            .map_err(|e| internal(&format!("RDMA WRITE task failed: {e}")))?
                            .map_err(|e| e.to_s3())?;
                        self.upstream.metrics().cache_served(source, n);
                        Ok::<u64, S3Error>(n)
                    }
                })
                .buffer_unordered(depth)
                .try_fold(0u64, |acc, n| async move { Ok(acc + n) })
                .await?;
            self.prefetch_after(cache, &obj, last, &user);
        }
        let m = self.rdma.metrics();
        m.path_request("GetObject", "rdma");
        m.path_bytes("rdma", "out", len);
        let out = GetObjectOutput {
            e_tag: head.etag_dto(),
            last_modified: head.last_modified.clone(),
            content_type: head.content_type.clone(),
            metadata: head.metadata.clone(),
            cache_control: head.cache_control.clone(),
            content_disposition: head.content_disposition.clone(),
            content_encoding: head.content_encoding.clone(),
            content_language: head.content_language.clone(),
            content_length: Some(0),
            content_range: content_range.clone(),
            accept_ranges: Some("bytes".into()),
            ..Default::default()
        };
        let reply = reply_headers(if content_range.is_some() { 206 } else { 200 }, Some(len));
        let mut resp = S3Response::with_headers(out, reply);
        if content_range.is_some() {
            resp.status = Some(http::StatusCode::PARTIAL_CONTENT);
        }
        Ok(resp)
    }

    /// Chunk `i` of `obj` from the cache, or from the upstream as `user`
    /// (conditional on the confirmed identity, and checked against it).
    async fn chunk(
        &self,
        cache: &ChunkCache,
        obj: &ObjectVersion,
        i: u64,
        user: &str,
    ) -> S3Result<(Arc<Chunk>, Source)> {
        let cs = cache.chunk_size() as u64;
        let start = i * cs;
        let len = cs.min(obj.id.size - start);
        let upstream = &self.upstream;
        cache
            .get(obj.chunk_key(i), obj.need_settled, |buf| {
                fetch_chunk(upstream, user, obj, start, len, buf)
            })
            .await
    }

    /// Fetches the `prefetch_chunks` chunks after `last` into the cache in
    /// the background (a sequential reader's next read then hits).
    fn prefetch_after(&self, cache: &Arc<ChunkCache>, obj: &ObjectVersion, last: u64, user: &str) {
        let cs = cache.chunk_size() as u64;
        let chunks = obj.id.size.div_ceil(cs);
        let end = (last + 1 + self.prefetch).min(chunks);
        if last + 1 >= end {
            return;
        }
        let (cache, upstream, obj, user) = (
            Arc::clone(cache),
            Arc::clone(&self.upstream),
            obj.clone(),
            user.to_owned(),
        );
        tokio::spawn(async move {
            for i in last + 1..end {
                let start = i * cs;
                let len = cs.min(obj.id.size - start);
                let r = cache
                    .get(obj.chunk_key(i), obj.need_settled, |buf| {
                        fetch_chunk(&upstream, &user, &obj, start, len, buf)
                    })
                    .await;
                if r.is_err() {
                    break; // overwritten or unreachable: the next read will say
                }
            }
        });
    }

    /// The body of a PutObject/UploadPart over RDMA: the token's memory,
    /// read by RDMA, exactly the token's size; `None` for a plain HTTP
    /// request (forwarded as it is). A token RDMA must decline answers
    /// `x-amz-rdma-reply: 501` and stores nothing.
    async fn rdma_body<T>(
        &self,
        req: &S3Request<T>,
        tap: Option<&Arc<Mutex<WriteAllocation>>>,
    ) -> S3Result<Option<(ByteStream, i64)>> {
        let token = match self.rdma.decide(req).map_err(|e| e.to_s3())? {
            Decision::Http => return Ok(None),
            Decision::Decline => return Err(self.rdma.declined_put()),
            Decision::Rdma(t) => t,
        };
        let body = self
            .rdma
            .put_body(&token, &req.headers, &access_key(req))
            .await
            .map_err(|e| e.to_s3())?;
        let tap = tap.cloned();
        let frames = body.map_ok(move |b| {
            if let Some(t) = &tap {
                t.lock().unwrap_or_else(PoisonError::into_inner).push(&b);
            }
            http_body::Frame::data(b)
        });
        let body = http_body_util::StreamBody::new(frames);
        Ok(Some((
            ByteStream::from_body_1_x(body),
            i64::from(token.size),
        )))
    }

    /// A write allocation for an RDMA PutObject when `write_allocate_max`
    /// allows its size (from the token; the body is exactly that long).
    fn write_allocation<T>(&self, req: &S3Request<T>) -> Option<Arc<Mutex<WriteAllocation>>> {
        let cache = self.cache.as_ref()?;
        if self.write_allocate_max == 0 {
            return None;
        }
        let Ok(Decision::Rdma(token)) = self.rdma.decide(req) else {
            return None;
        };
        if u64::from(token.size) > self.write_allocate_max {
            self.rdma.metrics().cache_write_allocation("too_large");
            return None;
        }
        Some(Arc::new(Mutex::new(WriteAllocation::new(Arc::clone(
            cache,
        )))))
    }

    /// Publishes a write allocation of an acknowledged PUT: only under the
    /// identity a HEAD after the PUT confirms for what was acknowledged (the
    /// PUT's answer has no Last-Modified), and settled only when a version
    /// id or the kept SHA-256 of exactly these bytes pins it (a colliding
    /// body written in the same second would otherwise have the same
    /// identity); the metric's outcome.
    async fn publish(
        &self,
        a: WriteAllocation,
        cache: &ChunkCache,
        acked: &Acked<'_>,
    ) -> &'static str {
        if a.gave_up {
            return "no_slot";
        }
        if u64::try_from(acked.len).ok() != Some(a.total) {
            return "failed";
        }
        let out = match self
            .upstream
            .call(acked.user, "HeadObject", |c| {
                c.head_object()
                    .bucket(acked.bucket)
                    .key(acked.key)
                    .if_match(acked.etag)
                    .checksum_mode(aws_sdk_s3::types::ChecksumMode::Enabled)
                    .send()
            })
            .await
        {
            Ok(out) => out,
            Err(e) if *e.code() == S3ErrorCode::PreconditionFailed => return "superseded",
            Err(_) => return "failed",
        };
        let Ok(head) = Head::from_upstream(&out, None) else {
            return "failed";
        };
        let id = &head.id;
        let later = matches!((id.last_modified, acked.date), (Some(s), Some(d)) if s > d);
        if id.etag != acked.etag
            || Some(id.size) != u64::try_from(acked.len).ok()
            || (acked.version_id.is_some() && id.version_id != acked.version_id)
            || later
        {
            return "superseded";
        }
        let sha256 = a.sha256();
        if id.checksum("sha256").is_some_and(|c| c != sha256) {
            return "superseded";
        }
        let settled = (id.pinned() && acked.version_id.is_some())
            || id.checksum("sha256") == Some(sha256.as_str());
        a.publish(cache, acked.bucket, acked.key, &head.id, settled);
        "kept"
    }

    fn put_reply(&self, op: &str, len: i64) -> HeaderMap {
        let m = self.rdma.metrics();
        m.path_request(op, "rdma");
        let n = u64::try_from(len).unwrap_or(0);
        m.path_bytes("rdma", "in", n);
        self.upstream.metrics().upstream_bytes("out", n);
        reply_headers(200, None)
    }
}

/// What the upstream acknowledged for an RDMA PutObject.
#[derive(Debug)]
struct Acked<'a> {
    user: &'a str,
    bucket: &'a str,
    key: &'a str,
    etag: &'a str,
    version_id: Option<String>,
    /// The answer's `Date`: the write's Last-Modified is no later.
    date: Option<i64>,
    len: i64,
}

/// The bytes of an RDMA PutObject copied into cache slots as they stream
/// to the upstream, with their SHA-256; published under the identity
/// confirmed after the PUT, dropped (the slots return to the pool) on any
/// failure.
#[derive(Debug, Default)]
struct WriteAllocation {
    cache: Option<Arc<ChunkCache>>,
    /// Filled slots and how many bytes of each are the object's.
    chunks: Vec<(StagingBuf, usize)>,
    total: u64,
    sha256: sha2::Sha256,
    /// No slot was free without waiting: the PUT goes on uncached.
    gave_up: bool,
}

impl WriteAllocation {
    fn new(cache: Arc<ChunkCache>) -> Self {
        WriteAllocation {
            cache: Some(cache),
            ..WriteAllocation::default()
        }
    }

    /// Copies the next body bytes in.
    fn push(&mut self, mut data: &[u8]) {
        let Some(cache) = self.cache.clone() else {
            return;
        };
        let size = cache.chunk_size();
        while !data.is_empty() && !self.gave_up {
            if self.chunks.last().is_none_or(|(_, n)| *n == size) {
                match cache.try_slot() {
                    Some(b) => self.chunks.push((b, 0)),
                    None => {
                        self.gave_up = true;
                        self.chunks.clear();
                        return;
                    }
                }
            }
            let Some((buf, filled)) = self.chunks.last_mut() else {
                return;
            };
            let n = (size - *filled).min(data.len());
            if buf.copy_in(*filled, &data[..n]).is_err() {
                self.gave_up = true;
                self.chunks.clear();
                return;
            }
            *filled += n;
            self.total += n as u64;
            sha2::Digest::update(&mut self.sha256, &data[..n]);
            data = &data[n..];
        }
    }

    /// The SHA-256 of the bytes, base64 (as `x-amz-checksum-sha256`).
    fn sha256(&self) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .encode(sha2::Digest::finalize(self.sha256.clone()))
    }

    /// Puts the chunks in the cache as `bucket`/`key` at `id`.
    fn publish(
        self,
        cache: &ChunkCache,
        bucket: &str,
        key: &str,
        id: &Arc<Identity>,
        settled: bool,
    ) {
        let (bucket, key): (Arc<str>, Arc<str>) = (bucket.into(), key.into());
        for (index, (buf, n)) in (0u64..).zip(self.chunks) {
            cache.insert(
                ChunkKey {
                    bucket: Arc::clone(&bucket),
                    key: Arc::clone(&key),
                    id: Arc::clone(id),
                    index,
                },
                Chunk::new(buf, n, settled),
            );
        }
        cache.forget_other_versions(&bucket, &key, id);
    }
}

/// The object version a read serves, and how its chunks settle
/// ([`Head::settling`]).
#[derive(Debug, Clone)]
struct ObjectVersion {
    bucket: Arc<str>,
    key: Arc<str>,
    id: Arc<Identity>,
    /// Only settled chunks may be served.
    need_settled: bool,
    /// When this read's fetches may start so that their chunks are
    /// settled; `None`: they start at once and their chunks are not.
    settled_at: Option<Instant>,
}

impl ObjectVersion {
    fn chunk_key(&self, index: u64) -> ChunkKey {
        ChunkKey {
            bucket: Arc::clone(&self.bucket),
            key: Arc::clone(&self.key),
            id: Arc::clone(&self.id),
            index,
        }
    }
}

/// Fetches `[start, start+len)` of `obj` from the upstream as `user` into
/// `buf`: conditional on the identity as far as S3 allows (`If-Match` on
/// the ETag, `If-Unmodified-Since` on Last-Modified), and the answer's own
/// ETag, Last-Modified, total size, version id and checksums (when it
/// sends them) must be the identity's, so a newer version fails the read
/// instead of mixing in or being cached under the old identity.
async fn fetch_chunk(
    upstream: &Upstream,
    user: &str,
    obj: &ObjectVersion,
    start: u64,
    len: u64,
    buf: fabric::pool::StagingBuf,
) -> S3Result<Chunk> {
    let range = format!("bytes={}-{}", start, start + len - 1);
    let id = &obj.id;
    if let Some(at) = obj.settled_at {
        tokio::time::sleep_until(at.into()).await;
    }
    let unmodified_since = id
        .last_modified
        .map(aws_sdk_s3::primitives::DateTime::from_secs);
    let out = upstream
        .call(user, "GetObject", |c| {
            c.get_object()
                .bucket(&*obj.bucket)
                .key(&*obj.key)
                .range(&range)
                .if_match(&id.etag)
                .set_if_unmodified_since(unmodified_since)
                .send()
        })
        .await
        .map_err(|e| {
            if *e.code() == S3ErrorCode::PreconditionFailed {
                overwritten("its ETag or Last-Modified changed")
            } else {
                e
            }
        })?;
    let total = out
        .content_range()
        .and_then(|r| r.rsplit_once('/'))
        .and_then(|(_, t)| t.parse::<u64>().ok());
    // A version id that the answer names too pins the bytes; an answer that
    // names none (radosgw names it only when asked for a version) leaves
    // them to settle by time.
    let answered_version = version_id(out.version_id());
    let pinned = id.pinned() && answered_version == id.version_id;
    let answered = checksums([
        ("crc32", out.checksum_crc32()),
        ("crc32c", out.checksum_crc32_c()),
        ("crc64nvme", out.checksum_crc64_nvme()),
        ("sha1", out.checksum_sha1()),
        ("sha256", out.checksum_sha256()),
    ]);
    if out.e_tag() != Some(id.etag.as_str())
        || out
            .last_modified()
            .map(aws_sdk_s3::primitives::DateTime::secs)
            != id.last_modified
        || total != Some(id.size)
        || (answered_version.is_some() && answered_version != id.version_id)
        || (!answered.is_empty() && answered != id.checksums)
    {
        return Err(overwritten(
            "the ranged read answered another version than the HEAD",
        ));
    }
    let mut body = out.body;
    let mut filled = 0usize;
    let want = to_usize(len);
    while let Some(bytes) = body
        .try_next()
        .await
        .map_err(|e| unreachable(&format!("reading a chunk from the upstream failed: {e}")))?
    {
        if filled + bytes.len() > want {
            return Err(internal(
                "the upstream sent more bytes than the range asked for",
            ));
        }
        buf.copy_in(filled, &bytes)
            .map_err(|e| internal(&format!("cache copy: {e}")))?;
        filled += bytes.len();
    }
    if filled != want {
        return Err(unreachable(&format!(
            "the upstream sent {filled} of the {want} bytes of a chunk"
        )));
    }
    upstream.metrics().upstream_bytes("in", len);
    Ok(Chunk::new(buf, want, obj.settled_at.is_some() || pinned))
}

fn overwritten(why: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::ServiceUnavailable,
        format!(
            "the object was overwritten upstream during the read ({why}); nothing of the new version was mixed in; retry"
        ),
    )
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn internal(msg: &str) -> S3Error {
    warn!(error = msg, "gateway internal error");
    S3Error::with_message(S3ErrorCode::InternalError, msg.to_owned())
}

fn unreachable(msg: &str) -> S3Error {
    let mut e = S3Error::with_message(S3ErrorCode::ServiceUnavailable, msg.to_owned());
    e.set_status_code(http::StatusCode::SERVICE_UNAVAILABLE);
    e
}

/// s3s-aws answers `InternalError` without a status when the upstream
/// never answered: say so.
fn unreachable_if_unanswered(e: S3Error) -> S3Error {
    if e.status_code().is_none() && *e.code() == S3ErrorCode::InternalError {
        unreachable("the upstream S3 endpoint could not be reached; retry later")
    } else {
        e
    }
}

fn access_key<T>(req: &S3Request<T>) -> String {
    req.credentials
        .as_ref()
        .map(|c| c.access_key.clone())
        .unwrap_or_default()
}

/// Operations forwarded as they are. `#[async_trait]` does not see into
/// macros, so this writes the signature it would.
macro_rules! forward {
    ($($op:ident: $input:ident -> $output:ident;)*) => {
        $(
            fn $op<'life0, 'async_trait>(
                &'life0 self,
                req: S3Request<$input>,
            ) -> std::pin::Pin<
                Box<dyn std::future::Future<Output = S3Result<S3Response<$output>>> + Send + 'async_trait>,
            >
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async move { self.forward(req, |p, r| async move { p.$op(r).await }).await })
            }
        )*
    };
}

#[async_trait::async_trait]
impl S3 for Gateway {
    forward! {
        head_object: HeadObjectInput -> HeadObjectOutput;
        list_objects: ListObjectsInput -> ListObjectsOutput;
        list_objects_v2: ListObjectsV2Input -> ListObjectsV2Output;
        list_buckets: ListBucketsInput -> ListBucketsOutput;
        head_bucket: HeadBucketInput -> HeadBucketOutput;
        create_bucket: CreateBucketInput -> CreateBucketOutput;
        delete_bucket: DeleteBucketInput -> DeleteBucketOutput;
        get_bucket_location: GetBucketLocationInput -> GetBucketLocationOutput;
        delete_object: DeleteObjectInput -> DeleteObjectOutput;
        delete_objects: DeleteObjectsInput -> DeleteObjectsOutput;
        copy_object: CopyObjectInput -> CopyObjectOutput;
        create_multipart_upload: CreateMultipartUploadInput -> CreateMultipartUploadOutput;
        complete_multipart_upload: CompleteMultipartUploadInput -> CompleteMultipartUploadOutput;
        abort_multipart_upload: AbortMultipartUploadInput -> AbortMultipartUploadOutput;
        list_parts: ListPartsInput -> ListPartsOutput;
        list_multipart_uploads: ListMultipartUploadsInput -> ListMultipartUploadsOutput;
        upload_part_copy: UploadPartCopyInput -> UploadPartCopyOutput;
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let decision = self.rdma.decide(&req).map_err(|e| e.to_s3())?;
        match decision {
            Decision::Rdma(token) => self.rdma_get(req, &token).await,
            Decision::Http | Decision::Decline => {
                let declined = matches!(decision, Decision::Decline);
                let mut r = self
                    .forward(req, |p, r| async move { p.get_object(r).await })
                    .await?;
                let m = self.rdma.metrics();
                m.path_request("GetObject", "http");
                if declined {
                    r.headers.extend(reply_headers(501, None));
                }
                Ok(r)
            }
        }
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let alloc = self.write_allocation(&req);
        let Some((body, len)) = self.rdma_body(&req, alloc.as_ref()).await? else {
            let r = self
                .forward_once(req, |p, r| async move { p.put_object(r).await })
                .await?;
            self.rdma.metrics().path_request("PutObject", "http");
            return Ok(r);
        };
        let user = access_key(&req);
        let i = req.input;
        let put_date = upstream::DateOfAnswer::default();
        let out = self
            .upstream
            .call_once(&user, "PutObject", |c| {
                let b = c
                    .put_object()
                    .bucket(&i.bucket)
                    .key(&i.key)
                    .content_length(len)
                    .body(body)
                    .set_content_type(i.content_type.clone())
                    .set_metadata(i.metadata.clone())
                    .set_cache_control(i.cache_control.clone())
                    .set_content_disposition(i.content_disposition.clone())
                    .set_content_encoding(i.content_encoding.clone())
                    .set_content_language(i.content_language.clone())
                    .set_content_md5(i.content_md5.clone())
                    .set_checksum_crc32(i.checksum_crc32.clone())
                    .set_checksum_crc32_c(i.checksum_crc32c.clone())
                    .set_checksum_sha1(i.checksum_sha1.clone())
                    .set_checksum_sha256(i.checksum_sha256.clone())
                    .set_checksum_crc64_nvme(i.checksum_crc64nvme.clone())
                    .set_if_match(i.if_match.as_ref().map(etag_condition))
                    .set_if_none_match(i.if_none_match.as_ref().map(etag_condition));
                b.customize()
                    .disable_payload_signing()
                    .interceptor(put_date.clone())
                    .send()
            })
            .await?;
        if let (Some(alloc), Some(cache), Some(etag)) = (alloc, &self.cache, out.e_tag()) {
            let a = std::mem::take(&mut *alloc.lock().unwrap_or_else(PoisonError::into_inner));
            let acked = Acked {
                user: &user,
                bucket: &i.bucket,
                key: &i.key,
                etag,
                version_id: version_id(out.version_id()),
                date: put_date.get(),
                len,
            };
            let outcome = self.publish(a, cache, &acked).await;
            self.rdma.metrics().cache_write_allocation(outcome);
        }
        let reply = self.put_reply("PutObject", len);
        let o = PutObjectOutput {
            e_tag: out
                .e_tag()
                .and_then(|e| ETag::parse_http_header(e.as_bytes()).ok()),
            ..Default::default()
        };
        Ok(S3Response::with_headers(o, reply))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let Some((body, len)) = self.rdma_body(&req, None).await? else {
            let r = self
                .forward_once(req, |p, r| async move { p.upload_part(r).await })
                .await?;
            self.rdma.metrics().path_request("UploadPart", "http");
            return Ok(r);
        };
        let user = access_key(&req);
        let i = req.input;
        let out = self
            .upstream
            .call_once(&user, "UploadPart", |c| {
                c.upload_part()
                    .bucket(&i.bucket)
                    .key(&i.key)
                    .upload_id(&i.upload_id)
                    .part_number(i.part_number)
                    .content_length(len)
                    .body(body)
                    .set_content_md5(i.content_md5.clone())
                    .set_checksum_crc32(i.checksum_crc32.clone())
                    .set_checksum_crc32_c(i.checksum_crc32c.clone())
                    .set_checksum_sha1(i.checksum_sha1.clone())
                    .set_checksum_sha256(i.checksum_sha256.clone())
                    .set_checksum_crc64_nvme(i.checksum_crc64nvme.clone())
                    .customize()
                    .disable_payload_signing()
                    .send()
            })
            .await?;
        let reply = self.put_reply("UploadPart", len);
        let o = UploadPartOutput {
            e_tag: out
                .e_tag()
                .and_then(|e| ETag::parse_http_header(e.as_bytes()).ok()),
            ..Default::default()
        };
        Ok(S3Response::with_headers(o, reply))
    }
}

fn etag_condition(c: &ETagCondition) -> String {
    match c {
        ETagCondition::Any => "*".to_owned(),
        ETagCondition::ETag(e) => e
            .to_http_header()
            .ok()
            .and_then(|v| v.to_str().ok().map(str::to_owned))
            .unwrap_or_default(),
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn head(date: Option<i64>, last_modified: Option<i64>, version: Option<&str>) -> Head {
        Head {
            id: Arc::new(Identity {
                etag: "\"e\"".into(),
                size: 1,
                last_modified,
                version_id: version_id(version),
                checksums: Vec::new(),
            }),
            date,
            received: Instant::now(),
            last_modified: None,
            content_type: None,
            metadata: None,
            cache_control: None,
            content_disposition: None,
            content_encoding: None,
            content_language: None,
        }
    }

    /// Issue 30 finding 8: chunks settle only once no write can have the
    /// version's identity any more (after its Last-Modified second plus
    /// `settle_after`, on the upstream's clock), or when a version id pins
    /// them; without the clocks, never by time.
    #[test]
    fn chunks_settle_after_the_last_modified_second() {
        let lm = Some(1000);
        let secs = |n| Some(Duration::from_secs(n));
        // (need_settled, wait before fetching for a settled chunk)
        assert_eq!(head(Some(1000), lm, None).settling(1), (false, secs(2)));
        assert_eq!(head(Some(1001), lm, None).settling(1), (false, secs(1)));
        assert_eq!(head(Some(1002), lm, None).settling(1), (true, secs(0)));
        assert_eq!(head(Some(1001), lm, None).settling(0), (true, secs(0)));
        assert_eq!(head(Some(1000), lm, None).settling(0), (false, secs(1)));
        // An answer dated before the version (clocks apart): a wait of
        // more than settle_after + 2 s is not made.
        assert_eq!(head(Some(999), lm, None).settling(1), (false, secs(3)));
        assert_eq!(head(Some(998), lm, None).settling(1), (false, None));
        assert_eq!(
            head(Some(1000), lm, Some("v1")).settling(1),
            (false, secs(2))
        );
        assert_eq!(head(None, lm, None).settling(1), (true, None));
        assert_eq!(head(Some(5000), None, None).settling(1), (true, None));
        assert_eq!(
            head(Some(0), Some(i64::MAX), None).settling(u64::MAX),
            (false, None)
        );
    }

    #[test]
    fn identities_hold_the_kept_checksums() {
        let c = checksums([
            ("sha256", Some("abc=")),
            ("crc32", Some("x")),
            ("sha1", None),
            ("crc32c", Some("")),
        ]);
        assert_eq!(c, vec!["crc32=x".to_owned(), "sha256=abc=".to_owned()]);
        let id = Identity {
            etag: "\"e\"".into(),
            size: 1,
            last_modified: None,
            version_id: None,
            checksums: c,
        };
        assert_eq!(id.checksum("sha256"), Some("abc="));
        assert_eq!(id.checksum("crc32"), Some("x"));
        assert_eq!(id.checksum("crc32c"), None);
        assert_eq!(id.checksum("sha1"), None);
        assert_eq!(version_id(Some("null")), None);
        assert_eq!(version_id(Some("")), None);
        assert_eq!(version_id(Some("v")), Some("v".into()));
    }

    #[test]
    fn etag_conditions_render() {
        assert_eq!(etag_condition(&ETagCondition::Any), "*");
        assert_eq!(
            etag_condition(&ETagCondition::ETag(ETag::Strong("abc".into()))),
            "\"abc\""
        );
    }
}
