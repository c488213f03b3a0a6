//! Reading objects: [`ObjectReader`] serves any byte range of an opened
//! version (single file or multipart parts) into any buffer, or as a
//! [`RangeStream`].

use std::fs::File;
use std::future::Future as _;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use futures::Stream;

use super::{IO_CHUNK, Manifest, ObjectMeta, PartsPin, PartsRegistry, multipart};

/// Reads of at most this many bytes run on the runtime's thread rather than
/// on the blocking pool: a few microseconds of `pread` from the page cache
/// cost less than the pool's hop (a wake-up of a pool thread and one back,
/// two context switches, measured as the larger part of a small GET's CPU
/// in the storage-target).
pub const INLINE_READ_MAX: usize = 64 << 10;

/// An open object: its metadata and a handle on the exact version opened.
#[derive(Debug, Clone)]
pub struct ObjectReader {
    /// Metadata of the opened version.
    pub meta: ObjectMeta,
    pub(super) data: Data,
}

/// Where an open object's bytes are.
#[derive(Debug, Clone)]
pub(super) enum Data {
    /// Bytes `0..size` of the object file.
    File(Arc<File>),
    /// The part files of a completed multipart upload.
    Parts(Arc<PartFiles>),
}

/// A multipart object's part files, opened on first use (an object may
/// have 10,000), kept on disk by the pin while the reader lives.
#[derive(Debug)]
pub(super) struct PartFiles {
    pub(super) dir: PathBuf,
    pub(super) numbers: Vec<u32>,
    /// End offset of each part in the object.
    pub(super) ends: Vec<u64>,
    pub(super) files: Vec<OnceLock<Arc<File>>>,
    pub(super) _pin: Arc<PartsPin>,
}

impl PartFiles {
    pub(super) fn new(meta: &ObjectMeta, m: &Manifest, parts: &PartsRegistry) -> PartFiles {
        let mut end = 0u64;
        PartFiles {
            dir: parts.dir.join(&m.dir),
            numbers: m.part_numbers.clone(),
            ends: meta
                .parts
                .iter()
                .map(|p| {
                    end += p.size;
                    end
                })
                .collect(),
            files: m.part_numbers.iter().map(|_| OnceLock::new()).collect(),
            _pin: parts.pin(&m.dir),
        }
    }

    /// The part holding object byte `offset`: its index and start offset.
    pub(super) fn locate(&self, offset: u64) -> (usize, u64) {
        let i = self.ends.partition_point(|&e| e <= offset);
        (i, if i == 0 { 0 } else { self.ends[i - 1] })
    }

    pub(super) fn file(&self, i: usize) -> io::Result<&Arc<File>> {
        if let Some(f) = self.files[i].get() {
            return Ok(f);
        }
        let f = File::open(self.dir.join(multipart::part_file_name(self.numbers[i])))?;
        let _ = self.files[i].set(Arc::new(f));
        Ok(self.files[i].get().expect("just set"))
    }
}

/// [`io::Read`] over an [`ObjectReader`] from a position.
pub(super) struct ReadCursor {
    pub(super) reader: ObjectReader,
    pub(super) pos: u64,
}

impl io::Read for ReadCursor {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.reader.read_at(self.pos, buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl ObjectReader {
    /// Reads object bytes at `offset` into `buf` (blocking `pread`); returns
    /// the number of bytes read, 0 at the end of the data (fewer than asked
    /// at a part boundary of a multipart object). Suited to filling
    /// registered (RDMA) staging buffers.
    ///
    /// # Errors
    /// I/O errors.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        if offset >= self.meta.size {
            return Ok(0);
        }
        let max = usize::try_from(self.meta.size - offset).unwrap_or(usize::MAX);
        let n = buf.len().min(max);
        match &self.data {
            Data::File(f) => f.read_at(&mut buf[..n], offset),
            Data::Parts(p) => {
                let (i, start) = p.locate(offset);
                let in_part = usize::try_from(p.ends[i] - offset).unwrap_or(usize::MAX);
                p.file(i)?
                    .read_at(&mut buf[..n.min(in_part)], offset - start)
            }
        }
    }

    /// The files and file ranges that hold object bytes `range`, in order:
    /// `(file, offset in the file, length)`. Published object and part files
    /// never change, so the kernel may send straight from them
    /// (`sendfile`). Blocking (opens part files on first use).
    ///
    /// # Errors
    /// Opening a part file failed.
    pub fn file_ranges(
        &self,
        range: std::ops::Range<u64>,
    ) -> io::Result<Vec<(Arc<File>, u64, u64)>> {
        let end = range.end.min(self.meta.size);
        let mut pos = range.start.min(end);
        let mut out = Vec::new();
        match &self.data {
            Data::File(f) => {
                if end > pos {
                    out.push((Arc::clone(f), pos, end - pos));
                }
            }
            Data::Parts(p) => {
                while pos < end {
                    let (i, start) = p.locate(pos);
                    let n = p.ends[i].min(end) - pos;
                    out.push((Arc::clone(p.file(i)?), pos - start, n));
                    pos += n;
                }
            }
        }
        Ok(out)
    }

    /// Streams the bytes in `range` with a bounded buffer (one [`IO_CHUNK`]
    /// read ahead at a time).
    #[must_use]
    pub fn stream(&self, range: std::ops::Range<u64>) -> RangeStream {
        let end = range.end.min(self.meta.size);
        RangeStream {
            reader: self.clone(),
            pos: range.start.min(end),
            end,
            pending: None,
        }
    }
}

/// A stream of an object's byte range; see [`ObjectReader::stream`].
#[derive(Debug)]
pub struct RangeStream {
    pub(super) reader: ObjectReader,
    pub(super) pos: u64,
    pub(super) end: u64,
    pub(super) pending: Option<tokio::task::JoinHandle<io::Result<Bytes>>>,
}

impl RangeStream {
    /// Bytes not yet yielded.
    #[must_use]
    pub fn remaining(&self) -> u64 {
        self.end - self.pos
    }
}

/// Reads at most `n` bytes at `pos` (fewer only at the end of the file).
fn read_chunk(reader: &ObjectReader, pos: u64, n: usize) -> io::Result<Bytes> {
    let mut buf = BytesMut::zeroed(n);
    let mut filled = 0;
    while filled < n {
        let k = reader.read_at(pos + filled as u64, &mut buf[filled..])?;
        if k == 0 {
            break;
        }
        filled += k;
    }
    buf.truncate(filled);
    Ok(buf.freeze())
}

impl RangeStream {
    /// The stream's item for one read's result: its bytes (and the position
    /// past them), or the error (and the stream's end).
    fn step(&mut self, res: io::Result<Bytes>) -> io::Result<Bytes> {
        match res {
            Ok(b) if b.is_empty() => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "object file shorter than its header says",
            )),
            Ok(b) => {
                self.pos += b.len() as u64;
                Ok(b)
            }
            Err(e) => {
                self.pos = self.end;
                Err(e)
            }
        }
    }
}

impl Stream for RangeStream {
    type Item = io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(h) = this.pending.as_mut() {
                let res = ready!(Pin::new(h).poll(cx));
                this.pending = None;
                let res = res.map_err(io::Error::other).and_then(|r| r);
                return Poll::Ready(Some(this.step(res)));
            }
            if this.pos >= this.end {
                return Poll::Ready(None);
            }
            let n = usize::try_from(this.end - this.pos)
                .unwrap_or(IO_CHUNK)
                .min(IO_CHUNK);
            let pos = this.pos;
            if n <= INLINE_READ_MAX {
                // A small read costs less than the blocking pool's hop.
                let res = read_chunk(&this.reader, pos, n);
                return Poll::Ready(Some(this.step(res)));
            }
            let reader = this.reader.clone();
            this.pending = Some(tokio::task::spawn_blocking(move || {
                read_chunk(&reader, pos, n)
            }));
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, None)
    }
}
