//! Pools shared by everything that moves bytes over the fabric on behalf of
//! requests (the storage-target's RDMA serving, the dpu-agent):
//!
//! * [`StagingPool`]: a bounded set of equally sized buffers carved out of
//!   ONE registered fabric region (registered once, at start-up).
//! * [`SessionPool`]: fabric sessions, pooled per endpoint and reused.
//!
//! Neither pool knows about a metrics system: each reports its gauges and
//! connect outcomes to a [`PoolObserver`] (the storage-target implements it
//! for its Prometheus metrics; [`NoopObserver`] ignores everything).
//!
//! # Staging buffers
//!
//! A [`StagingBuf`] is the only way to use a buffer; it goes back to the pool
//! when dropped. Callers keep it alive until every operation posted on it
//! has completed (move it into the task that awaits the completion), so a
//! buffer is never reused while the NIC (or the tcp requester) may still
//! read or write it. Bytes go in and out through checked copies
//! ([`StagingBuf::fill_with`], [`StagingBuf::copy_in`],
//! [`StagingBuf::read_out`], [`StagingBuf::to_vec`]); no caller needs unsafe
//! code.
//!
//! # Sessions
//!
//! One session per endpoint and owner carries all of that pair's operations
//! (a session multiplexes many outstanding operations). The owner is a name
//! the caller chooses ([`SessionPool::get_for`]; the storage-target passes
//! the S3 user, so requests signed by one user never share a session, its
//! queue and its streams, with another user's; [`SessionPool::get`] is the
//! owner `""`), with at most
//! `max_ops_per_session` in flight ([`SessionEntry::ops`]). Connecting is
//! bounded by a timeout; a failed connect fails only the request that asked
//! for it and is not cached, and a session that died is replaced by the next
//! request. A reaper closes sessions idle for longer than `idle` with nothing
//! in flight.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info};

use s3dma_wire::{EndpointAddr, FabricKey};

use crate::access::Access;
use crate::error::{FabricError, Result};
use crate::options::SessionConfig;
use crate::region::{Domain, LocalSlice, Region};
use crate::session::Session;

/// [`crate::EndpointConfig::DEFAULT_DEAD_PEER_TIMEOUT`] in milliseconds.
#[allow(clippy::cast_possible_truncation)] // 5 000
const DEFAULT_DEAD_PEER_TIMEOUT_MS: u64 =
    crate::EndpointConfig::DEFAULT_DEAD_PEER_TIMEOUT.as_millis() as u64;

/// What the pools report, for metrics. Every method has a no-op default, so
/// an implementation overrides only what it records.
pub trait PoolObserver: Send + Sync + fmt::Debug {
    /// A staging pool registered `n` buffers.
    fn staging_total(&self, _n: usize) {}
    /// `n` staging buffers are now in use.
    fn staging_in_use(&self, _n: usize) {}
    /// `n` sessions are now pooled.
    fn sessions(&self, _n: usize) {}
    /// A session connect attempt finished: `"ok"`, `"timeout"` or `"error"`.
    fn connect(&self, _outcome: &'static str) {}
}

/// A [`PoolObserver`] that records nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopObserver;

impl PoolObserver for NoopObserver {}

impl NoopObserver {
    /// A shared no-op observer, ready to pass to a pool.
    #[must_use]
    pub fn shared() -> Arc<dyn PoolObserver> {
        Arc::new(NoopObserver)
    }
}

/// The staging pool.
pub struct StagingPool {
    region: Region,
    buf_size: usize,
    count: usize,
    free: Mutex<Vec<usize>>,
    sem: Arc<Semaphore>,
    observer: Arc<dyn PoolObserver>,
}

impl fmt::Debug for StagingPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingPool")
            .field("buf_size", &self.buf_size)
            .field("count", &self.count)
            .field("available", &self.sem.available_permits())
            .finish()
    }
}

impl StagingPool {
    /// Allocates and registers `count` buffers of `buf_size` bytes on
    /// `domain`, as one region with local write access (RDMA READ lands in
    /// it; RDMA WRITE sends from it).
    ///
    /// # Errors
    /// A size that overflows, or allocation or registration failures of the
    /// fabric.
    pub fn new(
        domain: &Domain,
        count: usize,
        buf_size: usize,
        observer: Arc<dyn PoolObserver>,
    ) -> Result<Arc<StagingPool>> {
        let total = count
            .checked_mul(buf_size)
            .ok_or_else(|| FabricError::InvalidArgument("staging pool size overflows".into()))?;
        // Local write: RDMA READ lands in it; the tcp backend needs nothing more.
        let region = domain.alloc(total, Access::LOCAL_WRITE)?;
        observer.staging_total(count);
        Ok(Arc::new(StagingPool {
            region,
            buf_size,
            count,
            free: Mutex::new((0..count).rev().collect()),
            sem: Arc::new(Semaphore::new(count)),
            observer,
        }))
    }

    /// Size of each buffer.
    #[must_use]
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// Number of buffers.
    #[must_use]
    pub fn count(&self) -> usize {
        self.count
    }

    /// Buffers not in use.
    #[must_use]
    pub fn available(&self) -> usize {
        self.sem.available_permits()
    }

    /// The one registered region all buffers are carved from.
    #[must_use]
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// A free buffer now, or `None` when all are in use.
    #[must_use]
    pub fn try_acquire(self: &Arc<Self>) -> Option<StagingBuf> {
        let permit = Arc::clone(&self.sem).try_acquire_owned().ok()?;
        Some(self.take(permit))
    }

    /// Waits for a free buffer.
    ///
    /// # Panics
    /// Never: the semaphore is never closed and a permit guarantees a free index.
    #[allow(clippy::expect_used)]
    pub async fn acquire(self: &Arc<Self>) -> StagingBuf {
        let permit = Arc::clone(&self.sem)
            .acquire_owned()
            .await
            .expect("the staging semaphore is never closed");
        self.take(permit)
    }

    /// The buffer a permit stands for.
    #[allow(clippy::expect_used)]
    fn take(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> StagingBuf {
        let index = self
            .free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop()
            .expect("a permit guarantees a free buffer");
        self.observer
            .staging_in_use(self.count - self.sem.available_permits());
        StagingBuf {
            pool: Arc::clone(self),
            index,
            scratch: Vec::new(),
            _permit: Some(permit),
        }
    }
}

/// One staging buffer, back in the pool when dropped.
pub struct StagingBuf {
    pool: Arc<StagingPool>,
    index: usize,
    /// Host bounce buffer for [`StagingBuf::fill_with`] (callers have no
    /// unsafe access to region memory, so bytes are copied in with
    /// [`LocalSlice::copy_from`]).
    scratch: Vec<u8>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl fmt::Debug for StagingBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingBuf")
            .field("index", &self.index)
            .finish()
    }
}

impl StagingBuf {
    /// Size of the buffer (the pool's buffer size).
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.pool.buf_size
    }

    /// Offset of the buffer in the pool's region.
    fn base(&self) -> usize {
        self.index * self.pool.buf_size
    }

    /// Checks that `[offset, offset+len)` lies inside the buffer.
    fn check(&self, what: &str, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.pool.buf_size => Ok(()),
            _ => Err(FabricError::InvalidArgument(format!(
                "{what}: {len} bytes at offset {offset} exceed the {}-byte staging buffer",
                self.pool.buf_size
            ))),
        }
    }

    /// The first `len` bytes of the buffer as the local side of an operation.
    ///
    /// # Errors
    /// `len` larger than the buffer.
    pub fn slice(&self, len: usize) -> Result<LocalSlice> {
        self.pool
            .region
            .slice(self.base(), len.min(self.pool.buf_size))
            .and_then(|s| {
                if len > self.pool.buf_size {
                    Err(FabricError::InvalidArgument(format!(
                        "{len} bytes exceed the {}-byte staging buffer",
                        self.pool.buf_size
                    )))
                } else {
                    Ok(s)
                }
            })
    }

    /// Fills the first `len` bytes from `read` (called with the bounce
    /// buffer; returns an I/O error or the bytes it produced).
    ///
    /// # Errors
    /// The reader's error, or the fabric's copy error as I/O error.
    pub fn fill_with(
        &mut self,
        len: usize,
        read: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if self.scratch.len() < len {
            self.scratch.resize(len, 0);
        }
        read(&mut self.scratch[..len])?;
        let s = self.slice(len).map_err(std::io::Error::other)?;
        s.copy_from(&self.scratch[..len])
            .map_err(std::io::Error::other)
    }

    /// Copies `src` into the buffer at `offset` (e.g. bytes received over
    /// HTTP, before an RDMA WRITE sends them on).
    ///
    /// # Errors
    /// [`FabricError::InvalidArgument`] when `offset + src.len()` exceeds the
    /// buffer; nothing is copied then.
    pub fn copy_in(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check("copy_in", offset, src.len())?;
        self.pool.region.write_at(self.base() + offset, src)
    }

    /// Copies buffer bytes at `offset` into `dst` (e.g. bytes an RDMA READ
    /// placed, to send over HTTP).
    ///
    /// # Errors
    /// [`FabricError::InvalidArgument`] when `offset + dst.len()` exceeds the
    /// buffer; `dst` is untouched then.
    pub fn read_out(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check("read_out", offset, dst.len())?;
        self.pool.region.read_at(self.base() + offset, dst)
    }

    /// The first `len` bytes of the buffer, copied into a new vector
    /// (`bytes::Bytes::from` takes it without copying again).
    ///
    /// # Errors
    /// `len` larger than the buffer.
    pub fn to_vec(&self, len: usize) -> Result<Vec<u8>> {
        self.check("to_vec", 0, len)?;
        self.slice(len)?.to_vec()
    }
}

impl Drop for StagingBuf {
    fn drop(&mut self) {
        self.pool
            .free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(self.index);
        drop(self._permit.take());
        self.pool
            .observer
            .staging_in_use(self.pool.count - self.pool.sem.available_permits());
    }
}

/// A pooled session and its in-flight bound.
pub struct SessionEntry {
    /// The fabric session.
    pub session: Session,
    /// Permits for operations in flight on this session.
    pub ops: Arc<Semaphore>,
    max_ops: usize,
    last_used: Mutex<Instant>,
    /// Failed by its owner because an operation made no progress
    /// ([`SessionEntry::fail_stalled`]).
    stalled: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for SessionEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionEntry")
            .field("peer", &self.session.peer())
            .field("alive", &self.session.is_alive())
            .field("in_flight", &(self.max_ops - self.ops.available_permits()))
            .finish()
    }
}

impl SessionEntry {
    fn touch(&self) {
        *self
            .last_used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .elapsed()
    }

    /// Operations in flight on this session (permits of [`SessionEntry::ops`] taken).
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.max_ops - self.ops.available_permits()
    }

    /// Fails the session ([`Session::fail`]) because an operation on it
    /// made no progress, and remembers that this was why: the other
    /// operations it flushes then fail for the same reason
    /// ([`SessionEntry::failed_stalled`]).
    pub fn fail_stalled(&self) {
        self.stalled
            .store(true, std::sync::atomic::Ordering::Release);
        self.session.fail();
    }

    /// Whether [`SessionEntry::fail_stalled`] failed this session.
    #[must_use]
    pub fn failed_stalled(&self) -> bool {
        self.stalled.load(std::sync::atomic::Ordering::Acquire)
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<Arc<SessionEntry>>>>;

/// Why a session could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The connect (and handshake) did not finish in time.
    #[error("connecting to fabric endpoint {peer} timed out after {after:?}")]
    Timeout {
        /// The endpoint.
        peer: EndpointAddr,
        /// The timeout.
        after: Duration,
    },
    /// The connect or handshake failed.
    #[error("connecting to fabric endpoint {peer} failed: {source}")]
    Failed {
        /// The endpoint.
        peer: EndpointAddr,
        /// The fabric's error.
        source: FabricError,
    },
}

/// The session pool.
pub struct SessionPool {
    domain: Domain,
    key: FabricKey,
    connect_timeout: Duration,
    max_ops: usize,
    tcp_streams: usize,
    /// [`SessionConfig::dead_peer_timeout`] of new sessions, in
    /// milliseconds ([`SessionPool::set_dead_peer_timeout`]).
    dead_peer_timeout_ms: std::sync::atomic::AtomicU64,
    slots: Mutex<HashMap<SessionKey, Slot>>,
    observer: Arc<dyn PoolObserver>,
    /// Sessions are DC targets reached through these initiators (standard
    /// tokens) instead of connected endpoints.
    #[cfg(feature = "dc")]
    dc: Option<Arc<crate::verbs::dc_session::DcInitiator>>,
}

/// What a pooled session is for: an endpoint and an owner.
type SessionKey = (EndpointAddr, Box<str>);

impl fmt::Debug for SessionPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionPool")
            .field("endpoints", &self.lock().len())
            .field("max_ops", &self.max_ops)
            .finish_non_exhaustive()
    }
}

impl SessionPool {
    /// A pool connecting on `domain` with `key`, each connect bounded by
    /// `connect_timeout`, at most `max_ops` (at least 1) operations in
    /// flight per session, and `tcp_streams` (at least 1) TCP streams per
    /// session on the tcp backend (operations striped over them; verbs
    /// ignores it).
    #[must_use]
    pub fn new(
        domain: Domain,
        key: FabricKey,
        connect_timeout: Duration,
        max_ops: usize,
        tcp_streams: usize,
        observer: Arc<dyn PoolObserver>,
    ) -> Arc<SessionPool> {
        Arc::new(SessionPool {
            domain,
            key,
            connect_timeout,
            max_ops: max_ops.max(1),
            tcp_streams: tcp_streams.max(1),
            dead_peer_timeout_ms: std::sync::atomic::AtomicU64::new(DEFAULT_DEAD_PEER_TIMEOUT_MS),
            slots: Mutex::new(HashMap::new()),
            observer,
            #[cfg(feature = "dc")]
            dc: None,
        })
    }

    /// A pool of DC "sessions" (`dc` feature): each is the DC target a
    /// standard token's endpoint names, reached through `initiator`'s DCIs
    /// (no handshake, so no key), at most `max_ops` operations in flight
    /// per target and owner.
    #[cfg(feature = "dc")]
    #[must_use]
    pub fn dc(
        initiator: Arc<crate::verbs::dc_session::DcInitiator>,
        key: FabricKey,
        max_ops: usize,
        observer: Arc<dyn PoolObserver>,
    ) -> Arc<SessionPool> {
        Arc::new(SessionPool {
            domain: initiator.domain().clone(),
            key,
            connect_timeout: Duration::from_secs(5),
            max_ops: max_ops.max(1),
            tcp_streams: 1,
            dead_peer_timeout_ms: std::sync::atomic::AtomicU64::new(DEFAULT_DEAD_PEER_TIMEOUT_MS),
            slots: Mutex::new(HashMap::new()),
            observer,
            dc: Some(initiator),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionKey, Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The most operations in flight per session.
    #[must_use]
    pub fn max_ops(&self) -> usize {
        self.max_ops
    }

    /// Sets the [`SessionConfig::dead_peer_timeout`] of the sessions this
    /// pool connects from now on (default 5 s): a session whose endpoint
    /// stops answering fails within about this long, and the pool replaces
    /// it. Call it before the first [`SessionPool::get`].
    ///
    /// # Errors
    /// [`FabricError::InvalidArgument`] outside 1 s to 1 h.
    pub fn set_dead_peer_timeout(&self, timeout: Duration) -> Result<()> {
        crate::sock::check_dead_peer_timeout(timeout)?;
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self.dead_peer_timeout_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// The dead-peer timeout of new sessions.
    #[must_use]
    pub fn dead_peer_timeout(&self) -> Duration {
        Duration::from_millis(
            self.dead_peer_timeout_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// A live session to `peer` (owner `""`): the pooled one, or a new
    /// connection.
    ///
    /// # Errors
    /// [`ConnectError`] when the endpoint cannot be reached in time.
    pub async fn get(
        &self,
        peer: EndpointAddr,
    ) -> std::result::Result<Arc<SessionEntry>, ConnectError> {
        self.get_for(peer, "").await
    }

    /// A live session to `peer` for `owner`: the one pooled for that pair,
    /// or a new connection. Two owners never share a session.
    ///
    /// # Errors
    /// [`ConnectError`] when the endpoint cannot be reached in time.
    pub async fn get_for(
        &self,
        peer: EndpointAddr,
        owner: &str,
    ) -> std::result::Result<Arc<SessionEntry>, ConnectError> {
        let slot = Arc::clone(self.lock().entry((peer, owner.into())).or_default());
        let mut guard = slot.lock().await;
        if let Some(e) = guard.as_ref() {
            if e.session.is_alive() {
                e.touch();
                return Ok(Arc::clone(e));
            }
            debug!(%peer, "replacing a dead fabric session");
            *guard = None;
            self.update_gauge();
        }
        let mut cfg = SessionConfig::new(self.key.clone());
        cfg.connect_timeout = self.connect_timeout;
        cfg.streams = self.tcp_streams;
        cfg.dead_peer_timeout = self.dead_peer_timeout();
        let started = Instant::now();
        let connect = async {
            #[cfg(feature = "dc")]
            if let Some(init) = &self.dc {
                return Session::connect_dc(init, peer);
            }
            Session::connect(&self.domain, peer, cfg).await
        };
        let res = tokio::time::timeout(self.connect_timeout, connect).await;
        let session = match res {
            Err(_) => {
                self.observer.connect("timeout");
                return Err(ConnectError::Timeout {
                    peer,
                    after: self.connect_timeout,
                });
            }
            Ok(Err(source)) => {
                self.observer.connect("error");
                return Err(ConnectError::Failed { peer, source });
            }
            Ok(Ok(s)) => s,
        };
        self.observer.connect("ok");
        debug!(%peer, elapsed = ?started.elapsed(), "fabric session connected");
        let entry = Arc::new(SessionEntry {
            session,
            ops: Arc::new(Semaphore::new(self.max_ops)),
            max_ops: self.max_ops,
            last_used: Mutex::new(Instant::now()),
            stalled: std::sync::atomic::AtomicBool::new(false),
        });
        *guard = Some(Arc::clone(&entry));
        drop(guard);
        self.update_gauge();
        Ok(entry)
    }

    /// Number of pooled sessions.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock()
            .values()
            .filter(|s| s.try_lock().map(|g| g.is_some()).unwrap_or(true))
            .count()
    }

    /// Whether no session is pooled.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn update_gauge(&self) {
        self.observer.sessions(self.len());
    }

    /// Closes sessions that are dead, or idle for `idle` with nothing in
    /// flight and no request holding them; returns how many were closed.
    pub fn reap(&self, idle: Duration) -> usize {
        let mut closed = 0;
        let mut map = self.lock();
        map.retain(|(peer, _), slot| {
            let Ok(mut g) = slot.try_lock() else {
                return true; // a request is connecting or using the slot
            };
            let drop_it = match g.as_ref() {
                None => true,
                Some(e) => {
                    !e.session.is_alive()
                        || (Arc::strong_count(e) == 1 && e.in_flight() == 0 && e.idle_for() >= idle)
                }
            };
            if drop_it {
                if g.take().is_some() {
                    info!(%peer, "closing idle or dead fabric session");
                    closed += 1;
                }
                return Arc::strong_count(slot) > 1;
            }
            true
        });
        drop(map);
        self.update_gauge();
        closed
    }

    /// Runs [`SessionPool::reap`] periodically until the pool is dropped.
    /// Must run inside a tokio runtime.
    pub fn spawn_reaper(self: &Arc<Self>, idle: Duration) {
        let weak: Weak<SessionPool> = Arc::downgrade(self);
        let period = (idle / 2).clamp(Duration::from_millis(100), Duration::from_secs(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(pool) = weak.upgrade() else {
                    return;
                };
                pool.reap(idle);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Endpoint, EndpointConfig};

    /// Records what the pools report.
    #[derive(Debug, Default)]
    struct Recorder {
        total: Mutex<Vec<usize>>,
        in_use: Mutex<Vec<usize>>,
        sessions: Mutex<Vec<usize>>,
        connects: Mutex<Vec<&'static str>>,
    }

    impl PoolObserver for Recorder {
        fn staging_total(&self, n: usize) {
            self.total.lock().unwrap().push(n);
        }
        fn staging_in_use(&self, n: usize) {
            self.in_use.lock().unwrap().push(n);
        }
        fn sessions(&self, n: usize) {
            self.sessions.lock().unwrap().push(n);
        }
        fn connect(&self, outcome: &'static str) {
            self.connects.lock().unwrap().push(outcome);
        }
    }

    #[tokio::test]
    async fn bounded_and_reused() {
        let d = Domain::tcp();
        let rec = Arc::new(Recorder::default());
        let p = StagingPool::new(&d, 2, 4096, Arc::clone(&rec) as Arc<dyn PoolObserver>).unwrap();
        assert_eq!(*rec.total.lock().unwrap(), [2]);
        let mut a = p.acquire().await;
        let b = p.acquire().await;
        assert_eq!(p.available(), 0);
        assert!(a.slice(4097).is_err());
        a.fill_with(3, |b| {
            b.copy_from_slice(b"xyz");
            Ok(())
        })
        .unwrap();
        assert_eq!(a.slice(3).unwrap().to_vec().unwrap(), b"xyz");
        let ia = a.index;
        let waiter = tokio::spawn({
            let p = Arc::clone(&p);
            async move { p.acquire().await.index }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(a);
        assert_eq!(waiter.await.unwrap(), ia);
        assert_ne!(b.index, ia);
        drop(b);
        assert_eq!(p.available(), 2);
        assert_eq!(rec.in_use.lock().unwrap().last(), Some(&0));
        assert_eq!(rec.in_use.lock().unwrap().iter().max(), Some(&2));
    }

    #[tokio::test]
    async fn copy_in_and_read_out_are_bounded() {
        let d = Domain::tcp();
        let p = StagingPool::new(&d, 2, 4096, NoopObserver::shared()).unwrap();
        let a = p.acquire().await;
        let b = p.acquire().await;
        assert_eq!(a.capacity(), 4096);
        a.copy_in(0, b"head").unwrap();
        a.copy_in(4090, b"tail!!").unwrap();
        b.copy_in(0, &[7u8; 4096]).unwrap();
        // Out of bounds: refused, nothing written.
        assert!(a.copy_in(4091, b"tail!!").is_err());
        assert!(a.copy_in(usize::MAX, b"x").is_err());
        assert!(a.copy_in(0, &[0u8; 4097]).is_err());
        let mut out = [0u8; 6];
        a.read_out(4090, &mut out).unwrap();
        assert_eq!(&out, b"tail!!");
        assert!(a.read_out(4091, &mut out).is_err());
        assert!(a.read_out(usize::MAX, &mut out).is_err());
        assert_eq!(&out, b"tail!!", "a refused read_out leaves dst untouched");
        assert_eq!(a.to_vec(4).unwrap(), b"head");
        assert!(a.to_vec(4097).is_err());
        // The buffers are disjoint parts of one region.
        assert_eq!(b.to_vec(4096).unwrap(), vec![7u8; 4096]);
        let mut empty = [0u8; 0];
        a.read_out(4096, &mut empty).unwrap();
        a.copy_in(4096, &[]).unwrap();
        assert_eq!(p.region().len(), 8192);
    }

    #[tokio::test]
    async fn sessions_are_reused_replaced_and_reaped() {
        let key = FabricKey::random();
        let target = Domain::tcp();
        let ep = Endpoint::listen(
            &target,
            EndpointConfig::new("127.0.0.1:0".parse().unwrap(), key.clone()),
        )
        .await
        .unwrap();
        let rec = Arc::new(Recorder::default());
        let pool = SessionPool::new(
            Domain::tcp(),
            key,
            Duration::from_secs(5),
            0,
            2,
            Arc::clone(&rec) as Arc<dyn PoolObserver>,
        );
        assert_eq!(pool.max_ops(), 1);
        let a = pool.get(ep.addr()).await.unwrap();
        let b = pool.get(ep.addr()).await.unwrap();
        assert!(Arc::ptr_eq(&a, &b), "one session per endpoint");
        assert_eq!(pool.len(), 1);
        assert_eq!(*rec.connects.lock().unwrap(), ["ok"]);
        assert_eq!(a.in_flight(), 0);
        // Another owner of the same endpoint gets a session of its own.
        let c = pool.get_for(ep.addr(), "bob").await.unwrap();
        let d = pool.get_for(ep.addr(), "bob").await.unwrap();
        assert!(!Arc::ptr_eq(&a, &c), "one session per endpoint and owner");
        assert!(Arc::ptr_eq(&c, &d));
        assert_eq!(pool.len(), 2);
        assert_eq!(*rec.connects.lock().unwrap(), ["ok", "ok"]);
        drop((c, d));
        // Held by a request: not reaped.
        assert_eq!(pool.reap(Duration::ZERO), 1);
        drop((a, b));
        assert_eq!(pool.reap(Duration::ZERO), 1);
        assert!(pool.is_empty());
        assert_eq!(rec.sessions.lock().unwrap().last(), Some(&0));

        // An endpoint nobody listens on: the connect fails and is not cached.
        ep.shutdown().await;
        let dead = EndpointAddr {
            addr: "127.0.0.1:1".parse().unwrap(),
            responder: 1,
        };
        assert!(matches!(
            pool.get(dead).await,
            Err(ConnectError::Failed { .. })
        ));
        assert!(pool.is_empty());
        assert_eq!(rec.connects.lock().unwrap().last(), Some(&"error"));
    }
}
