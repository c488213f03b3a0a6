//! The gateway's write path: PutObject and UploadPart over RDMA stream the
//! tenant's memory (RDMA READ) through to the upstream as the body; an RDMA
//! PutObject small enough is also kept in the read cache (write-allocate),
//! under the identity the upstream confirms for it.

use std::sync::{Arc, Mutex, PoisonError};

use aws_sdk_s3::primitives::ByteStream;
use futures::TryStreamExt as _;
use http::HeaderMap;
use s3s::dto::*;
use s3s::{S3, S3ErrorCode, S3Request, S3Response, S3Result};

use super::cache::{Chunk, ChunkCache, ChunkKey, Identity};
use super::forward::access_key;
use super::read::{Head, version_id};
use super::{Gateway, upstream};
use crate::rdma::DataPath;
use fabric::pool::StagingBuf;

/// A PutObject or UploadPart request builder `$b` given the Content-MD5
/// and the flexible checksums of the s3s input `$i`, as the client sent them.
macro_rules! with_checksums {
    ($b:expr, $i:expr) => {
        $b.set_content_md5($i.content_md5.clone())
            .set_checksum_crc32($i.checksum_crc32.clone())
            .set_checksum_crc32_c($i.checksum_crc32c.clone())
            .set_checksum_sha1($i.checksum_sha1.clone())
            .set_checksum_sha256($i.checksum_sha256.clone())
            .set_checksum_crc64_nvme($i.checksum_crc64nvme.clone())
    };
}

impl Gateway {
    /// PutObject: an RDMA body streamed through to the upstream (and
    /// write-allocated into the cache when small enough), or forwarded as
    /// it is.
    pub(super) async fn put(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let path = self.rdma.data_path(&req)?;
        let alloc = self.write_allocation(&path);
        let Some((body, len)) = self.rdma_body(&req, &path, alloc.as_ref()).await? else {
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
                    .set_content_language(i.content_language.clone());
                let b = with_checksums!(b, i)
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
        let reply = self.put_reply(&path, "PutObject", len);
        let o = PutObjectOutput {
            e_tag: out
                .e_tag()
                .and_then(|e| ETag::parse_http_header(e.as_bytes()).ok()),
            ..Default::default()
        };
        Ok(S3Response::with_headers(o, reply))
    }

    /// UploadPart: an RDMA body streamed through to the upstream, or
    /// forwarded as it is.
    pub(super) async fn put_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let path = self.rdma.data_path(&req)?;
        let Some((body, len)) = self.rdma_body(&req, &path, None).await? else {
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
                let b = c
                    .upload_part()
                    .bucket(&i.bucket)
                    .key(&i.key)
                    .upload_id(&i.upload_id)
                    .part_number(i.part_number)
                    .content_length(len)
                    .body(body);
                with_checksums!(b, i)
                    .customize()
                    .disable_payload_signing()
                    .send()
            })
            .await?;
        let reply = self.put_reply(&path, "UploadPart", len);
        let o = UploadPartOutput {
            e_tag: out
                .e_tag()
                .and_then(|e| ETag::parse_http_header(e.as_bytes()).ok()),
            ..Default::default()
        };
        Ok(S3Response::with_headers(o, reply))
    }

    /// The body of a PutObject/UploadPart over RDMA: the token's memory,
    /// read by RDMA, exactly the token's size; `None` for a plain HTTP
    /// request (forwarded as it is). A token RDMA must decline answers
    /// `x-amz-rdma-reply: 501` and stores nothing.
    async fn rdma_body<T>(
        &self,
        req: &S3Request<T>,
        path: &DataPath<'_>,
        tap: Option<&Arc<Mutex<WriteAllocation>>>,
    ) -> S3Result<Option<(ByteStream, i64)>> {
        let Some((body, size)) = path.put_body(&req.headers).await? else {
            return Ok(None);
        };
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
            i64::try_from(size).unwrap_or(i64::MAX),
        )))
    }

    /// A write allocation for an RDMA PutObject when `write_allocate_max`
    /// allows its size (from the token; the body is exactly that long).
    fn write_allocation(&self, path: &DataPath<'_>) -> Option<Arc<Mutex<WriteAllocation>>> {
        let cache = self.cache.as_ref()?;
        if self.write_allocate_max == 0 {
            return None;
        }
        let token = path.token()?;
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
    /// PUT's answer has no Last-Modified), and served only when a version
    /// id or the kept SHA-256 of exactly these bytes settles it (a
    /// colliding body written in the same second would otherwise have the
    /// same identity: unsettled, the chunks are provisional and serve no
    /// read, see [`Chunk::write_allocated`]); the metric's outcome.
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

    fn put_reply(&self, path: &DataPath<'_>, op: &str, len: i64) -> HeaderMap {
        let n = u64::try_from(len).unwrap_or(0);
        let reply = path.rdma_put_done(op, n).unwrap_or_default();
        self.upstream.metrics().upstream_bytes("out", n);
        reply
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
                Chunk::write_allocated(buf, n, settled),
            );
        }
        cache.forget_other_versions(&bucket, &key, id);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_conditions_render() {
        assert_eq!(etag_condition(&ETagCondition::Any), "*");
        assert_eq!(
            etag_condition(&ETagCondition::ETag(ETag::Strong("abc".into()))),
            "\"abc\""
        );
    }
}
