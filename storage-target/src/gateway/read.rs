//! The gateway's read path: GetObject over RDMA through the read cache.
//! Every read is first confirmed upstream as the caller ([`Head`]); chunks
//! of that version come from the cache or the upstream (single flight,
//! checked against the confirmed identity) and go to the tenant's memory by
//! RDMA WRITE; the next chunks are prefetched.

use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use http::HeaderMap;
use s3s::dto::*;
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};

use super::cache::{Chunk, ChunkCache, ChunkKey, Identity, Source};
use super::forward::{access_key, internal, to_usize, unreachable};
use super::{Gateway, upstream, upstream::Upstream};
use crate::rdma::headers::check_fits;
use crate::rdma::path::DataPath;
use crate::rdma::transfer;

/// What the upstream confirmed about an object for one user: its version
/// and the headers a GET answers with.
#[derive(Debug, Clone)]
pub(super) struct Head {
    pub(super) id: Arc<Identity>,
    /// The answer's `Date` (the upstream's clock, whole seconds).
    pub(super) date: Option<i64>,
    /// When the answer came.
    pub(super) received: Instant,
    pub(super) last_modified: Option<Timestamp>,
    pub(super) content_type: Option<String>,
    pub(super) metadata: Option<Metadata>,
    pub(super) cache_control: Option<String>,
    pub(super) content_disposition: Option<String>,
    pub(super) content_encoding: Option<String>,
    pub(super) content_language: Option<String>,
}

impl Head {
    pub(super) fn from_upstream(
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
pub(super) fn checksums<'a>(
    all: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> Vec<String> {
    let mut v: Vec<String> = all
        .into_iter()
        .filter_map(|(a, c)| c.filter(|c| !c.is_empty()).map(|c| format!("{a}={c}")))
        .collect();
    v.sort();
    v
}

/// A version id as an identity holds it: `null` (an unversioned write in a
/// versioned bucket, reused by the next one) is none.
pub(super) fn version_id(v: Option<&str>) -> Option<String> {
    v.filter(|v| !v.is_empty() && *v != "null")
        .map(str::to_owned)
}

impl Gateway {
    /// GetObject: over RDMA through the cache, or forwarded as it is (a
    /// declined RDMA request gets the object in the HTTP body and
    /// `x-amz-rdma-reply: 501`).
    pub(super) async fn get(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let path = self.rdma.data_path(&req)?;
        if let Some(token) = path.token() {
            return self.rdma_get(req, &path, token).await;
        }
        let mut r = self
            .forward(req, |p, r| async move { p.get_object(r).await })
            .await?;
        let m = self.rdma.metrics();
        m.path_request("GetObject", "http");
        // `x-amz-rdma-reply: 501` when declined.
        r.headers.extend(path.get_reply(false, 0));
        Ok(r)
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
        path: &DataPath<'_>,
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
            let ctx = self
                .rdma
                .ctx(token, &user, path.dialect())
                .await
                .map_err(|e| e.to_s3())?;
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
        let reply = path.get_reply(content_range.is_some(), len);
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
}
