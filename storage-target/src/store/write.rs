//! The write pipeline: a body streamed to a temporary file (hashed and
//! checked as it is written), sealed, fsynced and published by one rename;
//! PutObject and CopyObject.

use std::fs::File;
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::path::Path;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt as _};
use s3s::crypto::{Checksum as _, Md5};

use super::{
    BodyError, Bucket, Data, IO_CHUNK, IndexEntry, MAX_PUT_SIZE, ObjectAttrs, ObjectMeta,
    ObjectReader, ReadCursor, Store, StoreError, StoreResult, TmpGuard, blocking, ensure_dir,
    format, fsync_dir, now_ms, remove_parts_dir, write,
};

/// Observes the body bytes of a write and may veto the write at the end
/// (checksums, trailers). [`NoCheck`] accepts everything.
pub trait BodyCheck: Send {
    /// Called with every chunk, in order.
    fn update(&mut self, data: &[u8]);
    /// Called after the last chunk, before anything is published.
    ///
    /// # Errors
    /// Any [`StoreError`] aborts the write.
    fn finish(&mut self) -> StoreResult<()>;
    /// After a successful [`BodyCheck::finish`]: the checksum to store with
    /// the data (none by default).
    fn checksum(&self) -> Option<crate::checksum::StoredChecksum> {
        None
    }
}

/// A [`BodyCheck`] that accepts everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoCheck;

impl BodyCheck for NoCheck {
    fn update(&mut self, _data: &[u8]) {}
    fn finish(&mut self) -> StoreResult<()> {
        Ok(())
    }
}

/// Result of streaming a body into a temporary file.
#[derive(Debug)]
pub(super) struct Written {
    pub(super) size: u64,
    pub(super) md5_hex: String,
}

/// Writing objects.
impl Store {
    // ----- objects -----------------------------------------------------------

    /// [`Store::write_body`], then the body's MD5 checked against
    /// `content_md5_hex` (Content-MD5, hex), if given (`BadDigest`).
    ///
    /// # Errors
    /// As [`Store::write_body`], and `BadDigest`.
    pub(super) async fn write_body_md5<S>(
        &self,
        tmp: &TmpGuard,
        body: S,
        check: &mut dyn BodyCheck,
        content_md5_hex: Option<&str>,
    ) -> StoreResult<(tokio::fs::File, Written)>
    where
        S: Stream<Item = Result<Bytes, BodyError>> + Send + Unpin,
    {
        let (file, written) = self.write_body(tmp, body, check).await?;
        if let Some(expect) = content_md5_hex
            && expect != written.md5_hex
        {
            return Err(StoreError::BadDigest);
        }
        Ok((file, written))
    }

    /// Streams `body` into a new temporary file, hashing it; returns the open
    /// file (positioned at the end of the data).
    ///
    /// Bodies up to [`IO_CHUNK`] are hashed and written in one blocking
    /// call; larger ones in two pipelined stages (below). The request's own
    /// checksums are checked here as the bytes pass.
    pub(super) async fn write_body<S>(
        &self,
        tmp: &TmpGuard,
        mut body: S,
        check: &mut dyn BodyCheck,
    ) -> StoreResult<(tokio::fs::File, Written)>
    where
        S: Stream<Item = Result<Bytes, BodyError>> + Send + Unpin,
    {
        /// Chunks waiting for each stage: enough to cover a slow write.
        const QUEUE: usize = 8;
        // A small body (most requests) is gathered first, then hashed and
        // written in one blocking call: starting two stages would cost more
        // than it saves.
        let mut head: Vec<Bytes> = Vec::new();
        let mut size = 0u64;
        let mut ended = false;
        while size < IO_CHUNK as u64 {
            let Some(chunk) = body.next().await else {
                ended = true;
                break;
            };
            let chunk = chunk.map_err(StoreError::Body)?;
            size += chunk.len() as u64;
            if size > MAX_PUT_SIZE {
                return Err(StoreError::EntityTooLarge);
            }
            check.update(&chunk);
            head.push(chunk);
        }
        let creator = tmp.creator();
        if ended {
            let (file, md5_hex) = blocking(move || {
                use std::io::Write as _;
                let mut f = creator.create()?;
                let mut md5 = Md5::new();
                for chunk in &head {
                    md5.update(chunk);
                }
                if let [one] = head.as_slice() {
                    f.write_all(one)?;
                } else {
                    // One write for many small frames.
                    let mut all = BytesMut::with_capacity(usize::try_from(size).unwrap_or(0));
                    for chunk in &head {
                        all.extend_from_slice(chunk);
                    }
                    f.write_all(&all)?;
                }
                Ok((f, hex::encode(md5.finalize())))
            })
            .await?;
            check.finish()?;
            return Ok((tokio::fs::File::from_std(file), Written { size, md5_hex }));
        }
        // A large body: hashing and writing are two stages of their own, fed
        // through short queues, so the next chunk is received while the last
        // is hashed and written, and the write never waits for MD5 (the
        // slowest step of a PUT).
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(QUEUE);
        let (htx, mut hrx) = tokio::sync::mpsc::channel::<Bytes>(QUEUE);
        let hasher = tokio::task::spawn_blocking(move || {
            let mut md5 = Md5::new();
            while let Some(chunk) = hrx.blocking_recv() {
                md5.update(&chunk);
            }
            hex::encode(md5.finalize())
        });
        let writer = tokio::task::spawn_blocking(move || -> io::Result<File> {
            use std::io::Write as _;
            let mut w = std::io::BufWriter::with_capacity(IO_CHUNK, creator.create()?);
            while let Some(chunk) = rx.blocking_recv() {
                w.write_all(&chunk)?;
            }
            w.into_inner().map_err(std::io::IntoInnerError::into_error)
        });
        let fed = async {
            let mut pending = head.into_iter();
            loop {
                let chunk = match pending.next() {
                    Some(c) => c,
                    None => match body.next().await {
                        None => break,
                        Some(chunk) => {
                            let chunk = chunk.map_err(StoreError::Body)?;
                            size += chunk.len() as u64;
                            if size > MAX_PUT_SIZE {
                                return Err(StoreError::EntityTooLarge);
                            }
                            check.update(&chunk);
                            chunk
                        }
                    },
                };
                if htx.send(chunk.clone()).await.is_err() || tx.send(chunk).await.is_err() {
                    // The writer stopped: its error says why.
                    break;
                }
            }
            Ok(())
        }
        .await;
        drop((tx, htx));
        let written = writer.await.map_err(io::Error::other);
        let md5_hex = hasher.await.map_err(io::Error::other)?;
        fed?;
        let file = written??;
        check.finish()?;
        Ok((tokio::fs::File::from_std(file), Written { size, md5_hex }))
    }

    /// Appends the header to a data file and makes it durable, in one
    /// blocking call (not one for the write, the flush and the sync: a
    /// hop to the blocking pool each costs about what a small write does).
    pub(super) async fn seal(file: tokio::fs::File, meta: &ObjectMeta) -> StoreResult<()> {
        let trailer = format::encode_trailer(meta);
        let mut file = file.into_std().await;
        blocking(move || {
            use std::io::Write as _;
            file.write_all(&trailer)?;
            file.sync_all()?;
            Ok(())
        })
        .await
    }

    /// Atomically publishes a sealed temporary file as `key` in bucket `b`;
    /// `unsealed`: the temporary file's data, to be sealed first (in the
    /// same blocking call).
    pub(super) async fn publish(
        &self,
        b: Arc<Bucket>,
        mut tmp: TmpGuard,
        meta: &ObjectMeta,
        unsealed: Option<tokio::fs::File>,
    ) -> StoreResult<()> {
        let key = meta.key.clone();
        let entry = IndexEntry::from(meta);
        let src = tmp.path().to_owned();
        tmp.disarm();
        let mut guard = TmpGuard::new(src.clone());
        let this = Arc::clone(&self.parts);
        let unsealed = match unsealed {
            Some(f) => Some((f.into_std().await, format::encode_trailer(meta))),
            None => None,
        };
        blocking(move || {
            if let Some((mut file, trailer)) = unsealed {
                use std::io::Write as _;
                file.write_all(&trailer)?;
                file.sync_all()?;
            }
            let path = b.object_path(&key);
            let dir = path.parent().unwrap_or(Path::new("/")).to_owned();
            ensure_dir(&dir)?;
            let released = {
                let mut st = write(&b.state);
                if st.deleted {
                    return Err(StoreError::NoSuchBucket);
                }
                std::fs::rename(&src, &path)?;
                guard.disarm();
                st.index
                    .insert(key, entry)
                    .and_then(|old| old.manifest)
                    .and_then(|m| this.release(&m))
            };
            fsync_dir(&dir)?;
            if let Some(p) = released {
                remove_parts_dir(&p);
            }
            Ok(())
        })
        .await
    }

    /// Stores an object from any byte source. `content_md5_hex`, if given, must
    /// equal the MD5 of the body (`BadDigest`). Nothing is visible until the
    /// whole body has been received, checked and made durable.
    ///
    /// # Errors
    /// `NoSuchBucket`, `BadDigest`, `EntityTooLarge`, `Body`, check errors, I/O.
    pub async fn put_object<S>(
        &self,
        bucket: &str,
        key: &str,
        attrs: ObjectAttrs,
        body: S,
        content_md5_hex: Option<&str>,
        check: &mut dyn BodyCheck,
    ) -> StoreResult<ObjectMeta>
    where
        S: Stream<Item = Result<Bytes, BodyError>> + Send + Unpin,
    {
        let b = self.bucket(bucket)?;
        let tmp = self.tmp_path();
        let (file, written) = self
            .write_body_md5(&tmp, body, check, content_md5_hex)
            .await?;
        let meta = ObjectMeta {
            key: key.to_owned(),
            size: written.size,
            etag: written.md5_hex,
            last_modified_ms: now_ms(),
            parts_count: None,
            part_number: None,
            attrs,
            checksum: check.checksum(),
            parts: Vec::new(),
            manifest: None,
        };
        self.publish(b, tmp, &meta, Some(file)).await?;
        Ok(meta)
    }

    /// Copies an object (server side). `attrs` = `None` keeps the source's
    /// attributes (metadata directive COPY); the ETag and part count are kept.
    /// The source's checksum (and parts) are kept, unless `compute` names an
    /// algorithm: then the data is read, that full-object checksum computed
    /// over it and stored instead (the parts keep their sizes only).
    ///
    /// # Errors
    /// `NoSuchBucket`, `NoSuchKey`, I/O.
    pub async fn copy_object(
        &self,
        src: &ObjectReader,
        dst_bucket: &str,
        dst_key: &str,
        attrs: Option<ObjectAttrs>,
        compute: Option<crate::checksum::Algorithm>,
    ) -> StoreResult<ObjectMeta> {
        let b = self.bucket(dst_bucket)?;
        let tmp = self.tmp_path();
        let mut meta = ObjectMeta {
            key: dst_key.to_owned(),
            size: src.meta.size,
            etag: src.meta.etag.clone(),
            last_modified_ms: now_ms(),
            parts_count: src.meta.parts_count,
            part_number: None,
            attrs: attrs.unwrap_or_else(|| src.meta.attrs.clone()),
            checksum: src.meta.checksum.clone(),
            parts: src.meta.parts.clone(),
            manifest: None,
        };
        let from = src.clone();
        let to = tmp.creator();
        let size = src.meta.size;
        let computed = blocking(move || {
            let mut out = to.create()?;
            let mut input: Box<dyn io::Read> = match &from.data {
                // std::io::copy uses copy_file_range between files.
                Data::File(f) => {
                    let mut f = f.try_clone()?;
                    f.seek(SeekFrom::Start(0))?;
                    Box::new(f.take(size))
                }
                Data::Parts(_) => Box::new(ReadCursor {
                    reader: from.clone(),
                    pos: 0,
                }),
            };
            let (n, sum) = match compute {
                None => (io::copy(&mut input, &mut out)?, None),
                Some(a) => {
                    let mut h = crate::checksum::Hasher::new(a);
                    let mut buf = vec![0u8; IO_CHUNK];
                    let mut n = 0u64;
                    loop {
                        let k = input.read(&mut buf)?;
                        if k == 0 {
                            break;
                        }
                        h.update(&buf[..k]);
                        std::io::Write::write_all(&mut out, &buf[..k])?;
                        n += k as u64;
                    }
                    (
                        n,
                        Some(crate::checksum::StoredChecksum::full(a, &h.finalize())),
                    )
                }
            };
            if n != size {
                return Err(StoreError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "source object shrank while copying",
                )));
            }
            Ok((out, sum))
        })
        .await?;
        let (mut out, sum) = computed;
        if let Some(sum) = sum {
            meta.checksum = Some(sum);
            for p in &mut meta.parts {
                p.checksum = None;
            }
        }
        let trailer = format::encode_trailer(&meta);
        blocking(move || {
            std::io::Write::write_all(&mut out, &trailer)?;
            out.sync_all()?;
            Ok(())
        })
        .await?;
        self.publish(b, tmp, &meta, None).await?;
        Ok(meta)
    }
}
