//! Pipelined transfers between the store and a client's memory.
//!
//! * GET ([`write_range`]): on tcp, a range of 1 MiB or more is sent from
//!   the object file itself (`sendfile`, no staging copy), chunk `i+1`
//!   loaded into the page cache while chunk `i` is in flight; on verbs, and
//!   for smaller ranges, chunk `i+1` is read from disk into a staging
//!   buffer while the RDMA WRITE of chunk `i` is in flight.
//! * PUT ([`read_stream`]): RDMA READs of the next chunks are in flight
//!   while the store writes (and hashes) the previous chunk to disk.
//!
//! Every posted operation is awaited by its own task that owns the staging
//! buffer and the in-flight permits, so a buffer goes back to the pool only
//! after its operation completed, even if the request is abandoned, and as
//! soon as it completed (a READ's bytes are copied out first): a request
//! never holds an idle buffer while waiting for another, so requests cannot
//! deadlock on the pool. Memory is bounded by the staging pool plus, for
//! PUT, the chunks between a completed READ and the store's write: one
//! `put_budget` permit each (as many as staging buffers, for all requests).
//! A PUT blocks on the budget only when it holds no undelivered chunk, and
//! the store releases a chunk's permit when it asks for the next one, so
//! the budget cannot deadlock either. A buffer is taken within the
//! request's shares of the pool ([`super::share`]), in the same order
//! everywhere (user, endpoint, shared class, pool, then operation permits),
//! and all of them are given back with the buffer.
//!
//! An operation still in flight after `rdma.progress_timeout_secs` means
//! the client's endpoint stopped completing operations (a stalled or
//! hostile client): the task fails the whole session
//! ([`fabric::Session::fail`]), which completes every operation on it once
//! the transport no longer touches their memory, and only then gives the
//! buffer back; the request fails with [`RdmaError::Stalled`].

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fabric::RemoteBuf;
use fabric::pool::{SessionEntry, StagingPool};
use futures::Stream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinHandle;

use super::RdmaError;
use super::headers::chunks;
use super::share::{RequestShares, SharedBuf};
use crate::metrics::Metrics;
use crate::store::{BodyError, ObjectReader};

/// What a transfer needs.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// Staging buffers.
    pub pool: Arc<StagingPool>,
    /// The session to the client's endpoint.
    pub session: Arc<SessionEntry>,
    /// Bound on operations in flight across all sessions.
    pub total_ops: Arc<Semaphore>,
    /// Chunks read by RDMA and not yet written by the store, across all
    /// PUTs (one permit per chunk; as many as staging buffers).
    pub put_budget: Arc<Semaphore>,
    /// Operations in flight per request.
    pub depth: usize,
    /// The caps of this request's user, class and endpoint on staging
    /// buffers.
    pub shares: RequestShares,
    /// How long one operation may stay in flight before the session is
    /// failed (`rdma.progress_timeout_secs`).
    pub progress: Duration,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}

async fn permits(ctx: &Ctx) -> (OwnedSemaphorePermit, OwnedSemaphorePermit) {
    let s = Arc::clone(&ctx.session.ops)
        .acquire_owned()
        .await
        .expect("never closed");
    let t = Arc::clone(&ctx.total_ops)
        .acquire_owned()
        .await
        .expect("never closed");
    (s, t)
}

/// Awaits the completion of an operation posted on `session`. Past
/// `progress`, fails the session and still awaits the completion (which
/// the failure brings promptly), so that the caller frees the operation's
/// memory only once the transport is done with it.
async fn complete(
    mut c: fabric::Completion,
    session: &SessionEntry,
    progress: Duration,
    metrics: &Metrics,
) -> Result<(), RdmaError> {
    let peer = session.session.peer();
    match tokio::time::timeout(progress, &mut c).await {
        // An operation flushed because another one stalled fails for that
        // reason, whichever of them the request awaits first.
        Ok(Err(_)) if session.failed_stalled() => Err(RdmaError::Stalled {
            peer,
            after: progress,
        }),
        Ok(r) => r.map_err(|e| RdmaError::Op { peer, source: e }),
        Err(_) => {
            if session.session.is_alive() {
                tracing::warn!(%peer, after = ?progress, "RDMA operation stalled: failing the fabric session");
                metrics.rdma_session_stalled();
            }
            session.fail_stalled();
            let _ = c.await;
            Err(RdmaError::Stalled {
                peer,
                after: progress,
            })
        }
    }
}

/// A posted operation: the task awaiting its completion. It owns the
/// staging buffer and the permits and releases them as soon as the
/// operation completes; a READ's bytes are copied out first.
type OpTask = JoinHandle<Result<Option<Bytes>, RdmaError>>;

fn post(
    ctx: &Ctx,
    write: bool,
    buf: SharedBuf,
    permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    len: usize,
    remote: RemoteBuf,
    off: u64,
) -> Result<OpTask, RdmaError> {
    let local = buf
        .buf
        .slice(len)
        .map_err(|e| RdmaError::Internal(e.to_string()))?;
    // Cannot overflow: `RdmaToken::parse` refuses tokens whose memory range
    // wraps, and the plan keeps `off + len` within the token.
    let addr = remote.addr + off;
    let c = if write {
        ctx.session.session.write(local.clone(), addr, remote.rkey)
    } else {
        ctx.session.session.read(local.clone(), addr, remote.rkey)
    };
    let metrics = Arc::clone(&ctx.metrics);
    let session = Arc::clone(&ctx.session);
    let progress = ctx.progress;
    Ok(tokio::spawn(async move {
        let started = Instant::now();
        let r = complete(c, &session, progress, &metrics).await;
        metrics.rdma_op(if write { "write" } else { "read" }, started.elapsed());
        drop(permits);
        r?;
        let out = if write {
            None
        } else {
            Some(Bytes::from(
                local
                    .to_vec()
                    .map_err(|e| RdmaError::Internal(e.to_string()))?,
            ))
        };
        drop(buf);
        Ok(out)
    }))
}

async fn join(t: OpTask) -> Result<Option<Bytes>, RdmaError> {
    t.await
        .map_err(|e| RdmaError::Internal(format!("transfer task failed: {e}")))?
}

/// RDMA WRITEs `local` to `remote` at `off` once the session and total
/// operation permits are free; the returned task completes with the
/// operation and holds `keep` (what owns `local`'s memory, e.g. a cached
/// chunk) until then, even if the caller goes away.
///
/// # Errors
/// The task's: the operation failed.
pub async fn write_slice<T: Send + 'static>(
    ctx: &Ctx,
    local: fabric::LocalSlice,
    keep: T,
    remote: RemoteBuf,
    off: u64,
) -> JoinHandle<Result<(), RdmaError>> {
    let permits = permits(ctx).await;
    // Cannot overflow: callers keep `off + len` within the token, whose
    // memory range `RdmaToken::parse` checked.
    let c = ctx
        .session
        .session
        .write(local, remote.addr + off, remote.rkey);
    await_write(ctx, c, permits, keep)
}

/// A task that awaits the posted WRITE `c`, records its time, and holds
/// `permits` and `keep` (what owns its source) until it completes.
fn await_write<T: Send + 'static>(
    ctx: &Ctx,
    c: fabric::Completion,
    permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    keep: T,
) -> JoinHandle<Result<(), RdmaError>> {
    let metrics = Arc::clone(&ctx.metrics);
    let session = Arc::clone(&ctx.session);
    let progress = ctx.progress;
    tokio::spawn(async move {
        let started = Instant::now();
        let r = complete(c, &session, progress, &metrics).await;
        metrics.rdma_op("write", started.elapsed());
        drop(permits);
        drop(keep);
        r
    })
}

/// RDMA WRITEs `range` of the object into `remote` (which must be at least
/// as long); returns the bytes transferred. On a session that sends files
/// (tcp) the chunks go from the object file to the socket without a
/// staging copy; otherwise each is read into a registered staging buffer.
///
/// # Errors
/// Disk errors ([`RdmaError::Internal`]) or failed operations.
pub async fn write_range(
    ctx: &Ctx,
    reader: &ObjectReader,
    range: std::ops::Range<u64>,
    remote: RemoteBuf,
) -> Result<u64, RdmaError> {
    if ctx.session.session.sends_files() && range.end - range.start >= FILE_SEND_MIN {
        return write_range_from_file(ctx, reader, range, remote).await;
    }
    let total = range.end - range.start;
    let chunk = ctx.pool.buf_size() as u64;
    let mut inflight: VecDeque<OpTask> = VecDeque::new();
    for (off, len) in chunks(total, chunk) {
        while inflight.len() >= ctx.depth {
            if let Some(t) = inflight.pop_front() {
                drop(join(t).await?);
            }
        }
        let mut buf = ctx.shares.acquire(&ctx.pool, &ctx.metrics).await;
        let reader = reader.clone();
        let start = range.start + off;
        let n = usize::try_from(len).unwrap_or(usize::MAX);
        let fill = move || {
            buf.buf
                .fill_with(n, |dst| {
                    let mut filled = 0;
                    while filled < dst.len() {
                        let k = reader.read_at(start + filled as u64, &mut dst[filled..])?;
                        if k == 0 {
                            return Err(std::io::Error::new(
                                std::io::ErrorKind::UnexpectedEof,
                                "object file shorter than its header says",
                            ));
                        }
                        filled += k;
                    }
                    Ok(())
                })
                .map(|()| buf)
        };
        // A small read here: it costs less than the blocking pool's hop.
        let filled = if n <= crate::store::INLINE_READ_MAX {
            fill()
        } else {
            tokio::task::spawn_blocking(fill)
                .await
                .map_err(|e| RdmaError::Internal(format!("disk read task failed: {e}")))?
        };
        let buf =
            filled.map_err(|e| RdmaError::Internal(format!("reading the object failed: {e}")))?;
        let p = permits(ctx).await;
        inflight.push_back(post(ctx, true, buf, p, n, remote, off)?);
    }
    while let Some(t) = inflight.pop_front() {
        drop(join(t).await?);
    }
    Ok(total)
}

/// The smallest GET sent straight from the file: below it, copying the
/// bytes into a staging buffer costs less than the page-cache check (a
/// mapping, `mincore(2)`, and loading the range when it is cold) and a
/// second system call.
const FILE_SEND_MIN: u64 = 1 << 20;

/// [`write_range`] without staging: each chunk is brought into the page
/// cache on a blocking thread (so the send never waits on the disk inside
/// the runtime), then posted as a WRITE from the file range. The next chunk
/// is loaded while earlier ones are in flight; operations in flight are
/// bounded by the same per-request depth, shares and permits as staged
/// ones.
async fn write_range_from_file(
    ctx: &Ctx,
    reader: &ObjectReader,
    range: std::ops::Range<u64>,
    remote: RemoteBuf,
) -> Result<u64, RdmaError> {
    let total = range.end - range.start;
    let chunk = ctx.pool.buf_size() as u64;
    let mut inflight: VecDeque<JoinHandle<Result<(), RdmaError>>> = VecDeque::new();
    for (off, len) in chunks(total, chunk) {
        while inflight.len() >= ctx.depth {
            if let Some(t) = inflight.pop_front() {
                join_write(t).await?;
            }
        }
        // The chunk's bytes come from the file, but it still holds a
        // staging buffer while in flight: the pool's user and session shares
        // are what keep one stalled client from taking every operation slot.
        let slot = Arc::new(ctx.shares.acquire(&ctx.pool, &ctx.metrics).await);
        let ranges = {
            let reader = reader.clone();
            let start = range.start + off;
            tokio::task::spawn_blocking(move || {
                let mut out = Vec::new();
                for (file, at, n) in reader.file_ranges(start..start + len)? {
                    let r = fabric::FileRange::new(file, at, n).map_err(std::io::Error::other)?;
                    r.prefetch()?;
                    out.push(r);
                }
                Ok::<_, std::io::Error>(out)
            })
            .await
            .map_err(|e| RdmaError::Internal(format!("disk read task failed: {e}")))?
            .map_err(|e| RdmaError::Internal(format!("reading the object failed: {e}")))?
        };
        if ranges.iter().map(fabric::FileRange::len).sum::<u64>() != len {
            return Err(RdmaError::Internal(
                "object shorter than its header says".into(),
            ));
        }
        // A chunk is one WRITE, or one per part file it spans.
        let mut at = off;
        for src in ranges {
            let permits = permits(ctx).await;
            let n = src.len();
            // Cannot overflow: `RdmaToken::parse` refuses tokens whose memory
            // range wraps, and the plan keeps `off + len` within the token.
            let c = ctx
                .session
                .session
                .write_file(src, remote.addr + at, remote.rkey);
            at += n;
            inflight.push_back(await_write(ctx, c, permits, Arc::clone(&slot)));
        }
    }
    while let Some(t) = inflight.pop_front() {
        join_write(t).await?;
    }
    Ok(total)
}

async fn join_write(t: JoinHandle<Result<(), RdmaError>>) -> Result<(), RdmaError> {
    t.await
        .map_err(|e| RdmaError::Internal(format!("transfer task failed: {e}")))?
}

/// A body stream that RDMA READs `len` bytes from `remote`, chunk by chunk,
/// with up to `depth` READs in flight ahead of the consumer.
pub fn read_stream(ctx: Ctx, remote: RemoteBuf, len: u64) -> RdmaBody {
    let (tx, rx) = mpsc::channel::<Item>(2);
    tokio::spawn(async move {
        let chunk = ctx.pool.buf_size() as u64;
        let mut inflight: VecDeque<(OpTask, OwnedSemaphorePermit)> = VecDeque::new();
        let mut plan = chunks(len, chunk).peekable();
        loop {
            // Keep the pipeline full, as far as the budget allows without
            // waiting while we hold undelivered chunks.
            while inflight.len() < ctx.depth && plan.peek().is_some() {
                let budget = if inflight.is_empty() {
                    Arc::clone(&ctx.put_budget)
                        .acquire_owned()
                        .await
                        .expect("never closed")
                } else {
                    match Arc::clone(&ctx.put_budget).try_acquire_owned() {
                        Ok(b) => b,
                        Err(_) => break,
                    }
                };
                let Some((off, n)) = plan.next() else { break };
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                let buf = ctx.shares.acquire(&ctx.pool, &ctx.metrics).await;
                let p = permits(&ctx).await;
                match post(&ctx, false, buf, p, n, remote, off) {
                    Ok(t) => inflight.push_back((t, budget)),
                    Err(e) => {
                        let _ = tx.send((Err(Box::new(e)), None)).await;
                        return;
                    }
                }
            }
            let Some((t, budget)) = inflight.pop_front() else {
                return; // all delivered
            };
            let item = match join(t).await {
                Ok(b) => Ok(b.unwrap_or_default()),
                Err(e) => Err(Box::new(e) as BodyError),
            };
            let failed = item.is_err();
            if tx.send((item, Some(budget))).await.is_err() || failed {
                return; // the store stopped reading, or we failed
            }
        }
    });
    RdmaBody { rx, held: None }
}

type Item = (Result<Bytes, BodyError>, Option<OwnedSemaphorePermit>);

/// The body of a PUT/UploadPart over RDMA (see [`read_stream`]).
#[derive(Debug)]
pub struct RdmaBody {
    rx: mpsc::Receiver<Item>,
    /// The budget permit of the chunk last handed to the store.
    held: Option<OwnedSemaphorePermit>,
}

impl Stream for RdmaBody {
    type Item = Result<Bytes, BodyError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // Asking for the next chunk means the store is done with the last one.
        self.held = None;
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some((item, permit))) => {
                self.held = permit;
                Poll::Ready(Some(item))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
