//! The recursive commands: `get --recursive`, `put --recursive` and `sync`
//! (either direction), over one client connection (one lease) with a pool
//! of registered buffers.
//!
//! Downloads are cut by [`crate::tree::plan_fetches`]: large objects as ranged
//! GETs (each with `If-Match` on the listed ETag, so a file is never two
//! versions) landing at their offsets in a temporary file, small ones
//! batched into one buffer per `GetObjects` call. A file appears under its
//! name only whole (written as `.NAME.s3dma-<nonce>.tmp`, renamed on
//! success, its mtime set to the object's LastModified); a failed or
//! interrupted transfer leaves no partial file. Uploads read each file into
//! a buffer (a pool slot, or a buffer of its own when larger than a chunk)
//! and PutObject it: the agent switches to multipart by itself. Each file
//! is opened without following a symlink (`O_NOFOLLOW`) and checked by
//! `fstat` to be the regular file the walk saw (same device and inode), so
//! a file swapped for a link (or another file) after the walk is refused,
//! never read.
//!
//! `--delete` runs only when every copy succeeded, and then deletes what is
//! safe even when some names could not cross: a key that cannot be a local
//! name (see `tree::key_place`: `..`, `//`, control characters, ...) is
//! never written and never deleted, a local name that is not UTF-8 never
//! uploaded; each such name is printed on stderr, listed again after the
//! deletions, and makes the run exit 1 (a partial failure) once every safe
//! deletion is done.
//!
//! What is decided without I/O (paths, filters, sync rules, the plan) is in
//! `tree.rs`.

//!
//! `download.rs` is the S3-to-local direction, `upload.rs` the other,
//! `local.rs` the local tree both read (the walk, the checked opens).

mod download;
mod local;
mod upload;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{BinaryBytes, ProgressBar};
use s3dma_client::{Buffer, Client, ErrorKind};
use tokio::sync::Semaphore;

use crate::commands::{Failure, Global};
use crate::tree::Filters;

pub(crate) use download::download;
pub(crate) use upload::upload;

/// Objects at most this large are batched (several per `GetObjects`).
const BATCH_MAX_OBJECT: u64 = 4 << 20;
/// Objects per `GetObjects` batch at most.
const BATCH_ITEMS: usize = 64;

/// How a recursive command runs (the shared flags).
#[derive(Debug, Clone)]
pub(crate) struct TreeOptions {
    /// `--include` / `--exclude`.
    pub filters: Filters,
    /// Transfers in flight.
    pub concurrency: usize,
    /// Registered memory the transfers may use, at most.
    pub memory: u64,
    /// Bytes per ranged GET (and the size of a pool buffer).
    pub chunk: u64,
    /// `sync`: copy only what is missing, of another size or older.
    pub sync: bool,
    /// `sync --delete`: remove what the source does not have.
    pub delete: bool,
}

/// What a recursive command did.
#[derive(Debug, Default)]
struct Tally {
    files: usize,
    bytes: u64,
    skipped: usize,
    up_to_date: usize,
    deleted: usize,
    failures: Vec<Failure>,
    /// Names that cannot cross (unsafe keys, local names that are not
    /// UTF-8): failures that do not hold up `--delete`. The name (escaped,
    /// for the summary) and the failure.
    refused: Vec<(String, Failure)>,
}

/// State shared by a run's tasks.
struct Run {
    client: Client,
    bucket: String,
    pb: ProgressBar,
    tally: Mutex<Tally>,
}

impl Run {
    /// A run of `verb` over `total` bytes in `bucket` (its progress bar).
    fn start(
        g: &Global,
        client: &Client,
        bucket: &str,
        total: u64,
        verb: &str,
        tally: Tally,
    ) -> Arc<Run> {
        Arc::new(Run {
            client: client.clone(),
            bucket: bucket.to_owned(),
            pb: g.progress(total, verb),
            tally: Mutex::new(tally),
        })
    }

    /// Records a file's failure and prints it (even with --quiet).
    fn fail(&self, f: Failure) {
        self.pb.suspend(|| eprintln!("s3dma: {f}"));
        lock(&self.tally).failures.push(f);
    }

    /// Whether `--delete` may run: every copy succeeded (names refused
    /// before the copies do not count).
    fn copies_clean(&self) -> bool {
        lock(&self.tally).failures.is_empty()
    }

    /// After `--delete`: names again what it left because it could not
    /// cross.
    fn say_refused(&self, verb: &str) {
        let t = lock(&self.tally);
        if !t.refused.is_empty() {
            let names: Vec<&str> = t.refused.iter().map(|(n, _)| n.as_str()).collect();
            self.pb.suspend(|| {
                eprintln!(
                    "s3dma: {verb} --delete: deleted what is safe; {} name(s) could not cross and were skipped: {}",
                    names.len(),
                    names.join(", ")
                );
            });
        }
    }

    fn done(&self, bytes: u64) {
        let mut t = lock(&self.tally);
        t.files += 1;
        t.bytes += bytes;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A pool of equal registered buffers, at most `slots` of them, allocated
/// on first use.
struct Pool {
    slots: Arc<Semaphore>,
    free: Mutex<Vec<Buffer>>,
    size: usize,
    label: &'static str,
}

impl Pool {
    /// `slots` buffers of `chunk` bytes, made as they are first needed.
    fn new(slots: usize, chunk: u64, label: &'static str) -> Arc<Pool> {
        Arc::new(Pool {
            slots: Arc::new(Semaphore::new(slots.max(1))),
            free: Mutex::new(Vec::new()),
            size: usize::try_from(chunk).unwrap_or(usize::MAX).max(1),
            label,
        })
    }

    /// A buffer of the pool (waiting for one to come back when all are
    /// out); return it with [`Pool::give_back`].
    async fn take(
        &self,
        client: &Client,
    ) -> Result<(tokio::sync::OwnedSemaphorePermit, Buffer), s3dma_client::Error> {
        let permit = Arc::clone(&self.slots).acquire_owned().await.map_err(|_| {
            s3dma_client::Error::new(ErrorKind::Other, "Internal", "buffer pool closed")
        })?;
        let ready = lock(&self.free).pop();
        let buf = match ready {
            Some(b) => b,
            None => client.alloc_labeled(self.size, self.label).await?,
        };
        Ok((permit, buf))
    }

    fn give_back(&self, buf: Buffer) {
        lock(&self.free).push(buf);
    }

    async fn release_all(&self) {
        let bufs: Vec<Buffer> = std::mem::take(&mut *lock(&self.free));
        for b in bufs {
            let _ = b.release().await;
        }
    }
}

/// How many pool buffers of `chunk` bytes fit: the tenant's room (what
/// the shim still lets it register, count and bytes), `memory`, and no
/// more than transfers in flight. Returns `(slots, buffer size)`; the
/// buffer size shrinks to what the tenant may hold when that is less than
/// a chunk.
async fn pool_shape(
    client: &Client,
    opts: &TreeOptions,
    largest: u64,
) -> Result<(usize, u64), s3dma_client::Error> {
    let info = client.info().await?;
    let mut room_bytes = opts.memory;
    let mut room_count = opts.concurrency.max(1);
    if info.max_buffer_bytes > 0 {
        room_bytes = room_bytes.min(info.max_buffer_bytes.saturating_sub(info.buffer_bytes));
    }
    if info.max_buffers > 0 {
        room_count = room_count.min(info.max_buffers.saturating_sub(info.buffers) as usize);
    }
    let size = opts.chunk.min(largest.max(1)).min(room_bytes.max(1));
    let slots = usize::try_from(room_bytes / size)
        .unwrap_or(usize::MAX)
        .clamp(1, room_count.max(1));
    Ok((slots, size))
}

fn client_failure(what: String) -> impl FnOnce(s3dma_client::Error) -> Failure {
    move |error| Failure::Client { what, error }
}

/// Runs `work` until it ends or Ctrl-C / SIGTERM arrives (exit 130; the
/// dropped transfers remove their temporary files).
async fn interruptible<T>(work: impl Future<Output = Result<T, Failure>>) -> Result<T, Failure> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Failure::Other(format!("installing a signal handler: {e}")))?;
    tokio::select! {
        r = work => r,
        _ = tokio::signal::ctrl_c() => Err(Failure::Interrupted),
        _ = term.recv() => Err(Failure::Interrupted),
    }
}

/// `s3dma get --recursive URL DIR` and `s3dma sync URL DIR`.
/// Prints the summary and picks the result: the first failure's exit code.
fn finish(g: &Global, verb: &str, mut tally: Tally, took: Duration) -> Result<(), Failure> {
    let later = std::mem::take(&mut tally.failures);
    tally.failures = std::mem::take(&mut tally.refused)
        .into_iter()
        .map(|(_, f)| f)
        .chain(later)
        .collect();
    let secs = took.as_secs_f64().max(1e-9);
    let mut line = format!(
        "{verb}: {} files, {} in {:.1} s ({:.2} GB/s); {} failed, {} skipped",
        tally.files,
        BinaryBytes(tally.bytes),
        secs,
        tally.bytes as f64 / secs / 1e9,
        tally.failures.len(),
        tally.skipped,
    );
    if verb == "sync" {
        line.push_str(&format!(
            ", {} up to date, {} deleted",
            tally.up_to_date, tally.deleted
        ));
    }
    g.say(&line);
    if tally.failures.is_empty() {
        Ok(())
    } else {
        let n = tally.failures.len();
        let first = tally.failures.swap_remove(0);
        Err(Failure::Partial {
            failed: n,
            first: Box::new(first),
        })
    }
}
