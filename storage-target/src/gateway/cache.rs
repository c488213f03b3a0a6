//! The gateway's read cache: object chunks in fabric-registered memory, so
//! that a hit is one RDMA WRITE from the cache straight into the tenant's
//! window, with no copy.
//!
//! * Keyed by bucket, key, the version's [`Identity`] (ETag, size,
//!   Last-Modified, version id, the checksums the upstream keeps) and chunk
//!   index: a new version of an object is new entries, and a read never
//!   mixes versions (its upstream fetches carry `If-Match` and their
//!   answers must show the same identity).
//! * The ETag alone is no identity: a single-part ETag is an MD5, and a
//!   writer with a colliding pair can store a second body under the same
//!   ETag and size. A chunk is therefore [`Chunk::settled`] only when its
//!   bytes are bound to the identity beyond doubt (a version id pins them,
//!   the upstream keeps the SHA-256 the gateway computed over them, or they
//!   were read after the end of the version's Last-Modified second, so no
//!   later write can have the same identity); an unsettled chunk serves
//!   only reads that ask for no settled chunks (reads confirmed before that
//!   second's end plus `cache.settle_after`), and a read that needs a
//!   settled chunk fetches it again, replacing it.
//! * A write-allocated chunk ([`Chunk::write_allocated`]) holds the bytes
//!   a tenant sent, not bytes the upstream served: unless a version id or
//!   the kept SHA-256 settles it, a colliding body written in the same
//!   second may be what the upstream holds under the same identity, and
//!   no later HEAD tells them apart. Such a chunk is provisional: it is
//!   served to no read at all (each one goes upstream, and the chunk it
//!   fetches replaces the provisional one).
//! * Bounded: one slot per chunk in one registered region (`cache.size`);
//!   a miss takes a free slot or evicts by the [`super::policy`] (S3-FIFO
//!   by default).
//! * Single flight: concurrent misses of the same chunk make one upstream
//!   request; the others wait for it (`single_flight_waits`). A fetch that
//!   fails is not shared: each waiter then fetches with its own
//!   credentials.
//! * A chunk is shared (`Arc`) by the cache and the RDMA WRITEs sending it:
//!   an evicted chunk's slot goes back to the region only when the last
//!   WRITE from it completed.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use fabric::LocalSlice;
use fabric::pool::{StagingBuf, StagingPool};
use tokio::sync::{Notify, OnceCell};

use super::policy::{Policy, PolicyKind};
pub use crate::metrics::CacheSource as Source;
use crate::metrics::Metrics;

/// What the upstream says identifies one version of an object: every
/// field a HEAD answers with that a different body under the same ETag
/// could change.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The ETag (as the upstream sent it, quotes included).
    pub etag: String,
    /// Size in bytes.
    pub size: u64,
    /// Last-Modified, in whole seconds since the epoch (HTTP dates carry
    /// no more); `None` when the upstream sent none.
    pub last_modified: Option<i64>,
    /// The version id, in a versioned bucket (`null` counts as none).
    pub version_id: Option<String>,
    /// The checksums the upstream keeps for the object, as
    /// `algorithm=value`, sorted; empty when it keeps none (Ceph before
    /// Squid, for one).
    pub checksums: Vec<String>,
}

impl Identity {
    /// Whether the identity names one write and no other: a version id is
    /// never given to two writes, so chunks under it are settled whenever
    /// they were read.
    #[must_use]
    pub fn pinned(&self) -> bool {
        self.version_id.is_some()
    }

    /// The checksum of `algorithm` (`sha256`, `crc32`, ...), if kept.
    #[must_use]
    pub fn checksum(&self, algorithm: &str) -> Option<&str> {
        self.checksums.iter().find_map(|c| {
            c.strip_prefix(algorithm)
                .and_then(|rest| rest.strip_prefix('='))
        })
    }
}

/// Which chunk of which object version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChunkKey {
    /// Bucket.
    pub bucket: Arc<str>,
    /// Object key.
    pub key: Arc<str>,
    /// The version.
    pub id: Arc<Identity>,
    /// Chunk index (byte offset / chunk size).
    pub index: u64,
}

/// One cached chunk: a slot of the registered region and how many of its
/// bytes are the object's (the last chunk of an object is shorter).
#[derive(Debug)]
pub struct Chunk {
    buf: StagingBuf,
    len: usize,
    settled: bool,
    /// Write-allocated and not settled: served to no read.
    provisional: bool,
}

impl Chunk {
    /// A slot filled with `len` bytes; `settled` when the bytes are bound
    /// to their key's identity beyond doubt (see the module documentation).
    #[must_use]
    pub fn new(buf: StagingBuf, len: usize, settled: bool) -> Self {
        Chunk {
            buf,
            len,
            settled,
            provisional: false,
        }
    }

    /// A slot filled by a write allocation with `len` bytes the tenant
    /// wrote; `settled` when a version id or the upstream's kept SHA-256 of
    /// exactly these bytes binds them to the identity. An unsettled one is
    /// provisional: kept, but served to no read (see the module
    /// documentation).
    #[must_use]
    pub fn write_allocated(buf: StagingBuf, len: usize, settled: bool) -> Self {
        Chunk {
            buf,
            len,
            settled,
            provisional: !settled,
        }
    }

    /// Whether the chunk may serve a read (that needs settled chunks when
    /// `need_settled`).
    #[must_use]
    pub fn servable(&self, need_settled: bool) -> bool {
        !self.provisional && (self.settled || !need_settled)
    }

    /// Whether the bytes are bound to the identity beyond doubt: only such
    /// chunks are served to reads that need them settled.
    #[must_use]
    pub fn settled(&self) -> bool {
        self.settled
    }

    /// The object bytes in the chunk.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the chunk holds no bytes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `[off, off+len)` of the chunk as the local side of an RDMA WRITE.
    ///
    /// # Errors
    /// A range beyond the chunk's bytes.
    pub fn slice(&self, off: usize, len: usize) -> fabric::Result<LocalSlice> {
        self.buf.slice(self.len)?.slice(off, len)
    }
}

type Flight = Arc<OnceCell<Arc<Chunk>>>;

#[derive(Debug)]
struct State {
    chunks: HashMap<ChunkKey, Arc<Chunk>>,
    policy: Policy<ChunkKey>,
    /// Fetches in flight.
    flights: HashMap<ChunkKey, Flight>,
}

impl State {
    /// Puts `chunk` in as `key` unless a chunk at least as good is there (a
    /// settled chunk replaces an unsettled one, a fetched chunk a
    /// provisional one); whether it went in.
    fn put(&mut self, key: ChunkKey, chunk: Arc<Chunk>) -> bool {
        if let Some(old) = self.chunks.get(&key) {
            let better = (old.provisional && !chunk.provisional) || (!old.settled && chunk.settled);
            if !better {
                return false;
            }
            self.policy.remove(&key);
        }
        self.chunks.insert(key.clone(), chunk);
        self.policy.insert(key);
        true
    }
}

/// The cache.
#[derive(Debug)]
pub struct ChunkCache {
    pool: Arc<StagingPool>,
    state: Mutex<State>,
    /// Signalled whenever a chunk enters the cache: a miss waiting for a slot
    /// may then evict it.
    inserted: Notify,
    metrics: Arc<Metrics>,
}

impl ChunkCache {
    /// A cache over `pool`'s slots (each one chunk).
    #[must_use]
    pub fn new(pool: Arc<StagingPool>, policy: PolicyKind, metrics: Arc<Metrics>) -> Self {
        let capacity = pool.count();
        metrics.cache_capacity(capacity, pool.buf_size());
        ChunkCache {
            pool,
            state: Mutex::new(State {
                chunks: HashMap::new(),
                policy: Policy::new(policy, capacity),
                flights: HashMap::new(),
            }),
            inserted: Notify::new(),
            metrics,
        }
    }

    /// The chunk size.
    #[must_use]
    pub fn chunk_size(&self) -> usize {
        self.pool.buf_size()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Chunks cached now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().chunks.len()
    }

    /// Whether nothing is cached.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The chunk `key`: from the cache, from another request's fetch of it,
    /// or from `fetch`, which fills a free slot and returns the chunk (and
    /// whose result is then cached). With `need_settled`, a cached chunk
    /// that is not [`Chunk::settled`] counts as a miss (the fetch's chunk
    /// then replaces it); a provisional (write-allocated, unsettled) chunk
    /// always does.
    ///
    /// # Errors
    /// `fetch`'s error (the chunk is then not cached).
    pub async fn get<F, Fut, E>(
        &self,
        key: ChunkKey,
        need_settled: bool,
        fetch: F,
    ) -> Result<(Arc<Chunk>, Source), E>
    where
        F: FnMut(StagingBuf) -> Fut,
        Fut: Future<Output = Result<Chunk, E>>,
    {
        let mut fetch = fetch;
        loop {
            let flight = {
                let mut st = self.lock();
                if let Some(c) = st.chunks.get(&key).cloned()
                    && c.servable(need_settled)
                {
                    st.policy.hit(&key);
                    drop(st);
                    self.metrics.cache_lookup(Source::Cache);
                    return Ok((c, Source::Cache));
                }
                match st.flights.get(&key) {
                    Some(f) => Arc::clone(f),
                    None => {
                        let f: Flight = Arc::new(OnceCell::new());
                        st.flights.insert(key.clone(), Arc::clone(&f));
                        f
                    }
                }
            };
            let mut fetched = false;
            let r = flight
                .get_or_try_init(|| {
                    fetched = true;
                    let fetch = &mut fetch;
                    async move {
                        let buf = self.slot().await;
                        fetch(buf).await.map(Arc::new)
                    }
                })
                .await
                .cloned();
            // Whoever runs the fetch is the one that fetched: usually the
            // request that opened the flight, but one that joined it may get
            // there first (then the opener waits for it).
            let source = if fetched {
                Source::Upstream
            } else {
                Source::SingleFlight
            };
            if fetched {
                let mut st = self.lock();
                if st
                    .flights
                    .get(&key)
                    .is_some_and(|f| Arc::ptr_eq(f, &flight))
                {
                    st.flights.remove(&key);
                }
                if let Ok(c) = &r
                    && st.put(key.clone(), Arc::clone(c))
                {
                    let n = st.chunks.len();
                    drop(st);
                    self.metrics.cache_resident(n);
                    self.inserted.notify_waiters();
                }
            }
            // A read that needs a settled chunk and joined a fetch that
            // brought an unsettled one fetches its own (then it fetched:
            // what it fetches itself is what the upstream gave it now).
            if let Ok(c) = &r
                && !fetched
                && !c.servable(need_settled)
            {
                continue;
            }
            if r.is_ok() {
                self.metrics.cache_lookup(source);
            }
            return r.map(|c| (c, source));
        }
    }

    /// A free slot: a free one, else one freed by evicting a chunk, else
    /// (every slot is being fetched into or sent from) the first to come
    /// back or to become evictable.
    async fn slot(&self) -> StagingBuf {
        loop {
            let inserted = self.inserted.notified();
            tokio::pin!(inserted);
            inserted.as_mut().enable();
            if let Some(b) = self.pool.try_acquire() {
                return b;
            }
            let victim = {
                let mut st = self.lock();
                st.policy.evict().map(|k| {
                    let c = st.chunks.remove(&k);
                    (c, st.chunks.len())
                })
            };
            if let Some((chunk, n)) = victim {
                // The slot is free once no WRITE holds the chunk any more.
                drop(chunk);
                self.metrics.cache_evicted(n);
                continue;
            }
            tokio::select! {
                b = self.pool.acquire() => return b,
                () = &mut inserted => {}
            }
        }
    }

    /// A free slot without waiting: a free one, else one freed by evicting
    /// a chunk that no WRITE holds; `None` when neither exists now (a write
    /// allocation then gives up instead of holding a PUT up).
    pub fn try_slot(&self) -> Option<StagingBuf> {
        // An evicted chunk that a WRITE still sends from frees its slot only
        // later: a few evictions, not the whole cache.
        for _ in 0..8 {
            if let Some(b) = self.pool.try_acquire() {
                return Some(b);
            }
            let (chunk, n) = {
                let mut st = self.lock();
                let k = st.policy.evict()?;
                let c = st.chunks.remove(&k);
                (c, st.chunks.len())
            };
            drop(chunk);
            self.metrics.cache_evicted(n);
        }
        self.pool.try_acquire()
    }

    /// Puts `chunk` in the cache as `key` unless a chunk at least as good
    /// is there already (a write allocation, [`Chunk::write_allocated`]:
    /// the bytes a tenant just wrote, under the identity the upstream
    /// confirmed for them).
    pub fn insert(&self, key: ChunkKey, chunk: Chunk) {
        let mut st = self.lock();
        if !st.put(key, Arc::new(chunk)) {
            return;
        }
        let n = st.chunks.len();
        drop(st);
        self.metrics.cache_resident(n);
        self.inserted.notify_waiters();
    }

    /// Drops every cached chunk of `bucket`/`key` whose identity is not
    /// `id` (a newer version was seen): they can never be served again.
    pub fn forget_other_versions(&self, bucket: &str, key: &str, id: &Identity) {
        let mut st = self.lock();
        let stale: Vec<ChunkKey> = st
            .chunks
            .keys()
            .filter(|k| &*k.bucket == bucket && &*k.key == key && *k.id != *id)
            .cloned()
            .collect();
        if stale.is_empty() {
            return;
        }
        for k in &stale {
            st.chunks.remove(k);
            st.policy.remove(k);
        }
        let n = st.chunks.len();
        drop(st);
        self.metrics.cache_dropped_stale(stale.len(), n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fabric::{Backend, Domain};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn cache(slots: usize, policy: PolicyKind) -> Arc<ChunkCache> {
        let domain = Domain::open(Backend::Tcp).unwrap();
        let pool =
            StagingPool::new(&domain, slots, 4096, fabric::pool::NoopObserver::shared()).unwrap();
        Arc::new(ChunkCache::new(pool, policy, Arc::new(Metrics::new())))
    }

    fn id(etag: &str, last_modified: i64) -> Arc<Identity> {
        Arc::new(Identity {
            etag: etag.into(),
            size: 100,
            last_modified: Some(last_modified),
            version_id: None,
            checksums: Vec::new(),
        })
    }

    fn key(index: u64) -> ChunkKey {
        ChunkKey {
            bucket: "b".into(),
            key: "k".into(),
            id: id("\"e1\"", 1000),
            index,
        }
    }

    async fn fill_as(buf: StagingBuf, byte: u8, settled: bool) -> Result<Chunk, String> {
        buf.copy_in(0, &[byte; 100]).unwrap();
        Ok(Chunk::new(buf, 100, settled))
    }

    async fn fill(buf: StagingBuf, byte: u8) -> Result<Chunk, String> {
        fill_as(buf, byte, true).await
    }

    async fn not_called(_: StagingBuf) -> Result<Chunk, String> {
        Err("not called".into())
    }

    #[tokio::test]
    async fn hit_after_miss_and_bytes_are_kept() {
        let c = cache(4, PolicyKind::S3fifo);
        let (a, s) = c.get(key(0), true, |b| fill(b, 7)).await.unwrap();
        assert_eq!(s, Source::Upstream);
        assert_eq!(a.len(), 100);
        let (b, s) = c.get(key(0), true, not_called).await.unwrap();
        assert_eq!(s, Source::Cache);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(b.slice(0, 100).unwrap().to_vec().unwrap(), vec![7; 100]);
        assert!(b.slice(50, 51).is_err(), "beyond the chunk's bytes");
    }

    #[tokio::test]
    async fn inserted_chunks_hit_and_try_slot_never_waits() {
        let c = cache(2, PolicyKind::S3fifo);
        // Two slots: both taken for a write allocation, none left.
        let (a, b) = (c.try_slot().unwrap(), c.try_slot().unwrap());
        assert!(c.try_slot().is_none(), "no slot free and nothing to evict");
        a.copy_in(0, &[9; 100]).unwrap();
        c.insert(key(0), Chunk::new(a, 100, true));
        drop(b);
        let (got, s) = c.get(key(0), true, not_called).await.unwrap();
        assert_eq!(s, Source::Cache);
        assert_eq!(got.slice(0, 100).unwrap().to_vec().unwrap(), vec![9; 100]);
        drop(got);
        // Both slots again: the free one, then the inserted chunk evicted.
        let (_x, _y) = (c.try_slot().unwrap(), c.try_slot().unwrap());
        assert!(c.is_empty());
    }

    #[tokio::test]
    async fn failed_fetch_is_not_cached() {
        let c = cache(2, PolicyKind::S3fifo);
        let e = c
            .get(key(0), true, |_| async {
                Err::<Chunk, String>("upstream down".into())
            })
            .await
            .unwrap_err();
        assert_eq!(e, "upstream down");
        assert!(c.is_empty());
        let (_, s) = c.get(key(0), true, |b| fill(b, 1)).await.unwrap();
        assert_eq!(s, Source::Upstream);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_misses_fetch_once() {
        let c = cache(4, PolicyKind::S3fifo);
        let calls = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (c, calls) = (Arc::clone(&c), Arc::clone(&calls));
            tasks.push(tokio::spawn(async move {
                c.get(key(3), true, |b| {
                    let calls = Arc::clone(&calls);
                    async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        fill(b, 3).await
                    }
                })
                .await
                .map(|(_, s)| s)
            }));
        }
        let mut sources = Vec::new();
        for t in tasks {
            sources.push(t.await.unwrap().unwrap());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{sources:?}");
        assert_eq!(
            sources.iter().filter(|s| **s == Source::Upstream).count(),
            1
        );
    }

    #[tokio::test]
    async fn full_cache_evicts_and_held_chunks_stay_valid() {
        let c = cache(2, PolicyKind::Lru);
        let (held, _) = c.get(key(0), true, |b| fill(b, 10)).await.unwrap();
        c.get(key(1), true, |b| fill(b, 11)).await.unwrap();
        // A third chunk evicts the least recent (key 0), which a "WRITE"
        // still holds: its slot is not reused until it is dropped.
        let c2 = Arc::clone(&c);
        let t = tokio::spawn(
            async move { c2.get(key(2), true, |b| fill(b, 12)).await.map(|(x, _)| x) },
        );
        let third = tokio::time::timeout(std::time::Duration::from_secs(5), t)
            .await
            .expect("evicting key 1 frees a slot")
            .unwrap()
            .unwrap();
        assert_eq!(held.slice(0, 100).unwrap().to_vec().unwrap(), vec![10; 100]);
        assert_eq!(
            third.slice(0, 100).unwrap().to_vec().unwrap(),
            vec![12; 100]
        );
        // Both older chunks went: key 0's slot was still held.
        assert_eq!(c.len(), 1);
    }

    #[tokio::test]
    async fn stale_versions_are_dropped() {
        let c = cache(4, PolicyKind::S3fifo);
        c.get(key(0), true, |b| fill(b, 1)).await.unwrap();
        let mut k2 = key(0);
        k2.id = id("\"e2\"", 1000);
        c.get(k2.clone(), true, |b| fill(b, 2)).await.unwrap();
        assert_eq!(c.len(), 2);
        c.forget_other_versions("b", "k", &k2.id);
        assert_eq!(c.len(), 1);
        let (_, s) = c.get(k2, true, |b| fill(b, 3)).await.unwrap();
        assert_eq!(s, Source::Cache);
    }

    /// Issue 30 finding 8: the same ETag with another Last-Modified (an
    /// MD5-colliding body written later) is another version: a miss.
    #[tokio::test]
    async fn the_same_etag_at_another_time_is_another_version() {
        let c = cache(4, PolicyKind::S3fifo);
        c.get(key(0), true, |b| fill(b, 1)).await.unwrap();
        let mut later = key(0);
        later.id = id("\"e1\"", 1001);
        let (got, s) = c.get(later, true, |b| fill(b, 2)).await.unwrap();
        assert_eq!(s, Source::Upstream);
        assert_eq!(got.slice(0, 100).unwrap().to_vec().unwrap(), vec![2; 100]);
    }

    /// Issue 30 finding 8: an unsettled chunk serves reads that accept one,
    /// and a read that needs a settled chunk fetches it again; the settled
    /// chunk replaces it, and an unsettled fetch never replaces a settled
    /// chunk.
    #[tokio::test]
    async fn unsettled_chunks_are_replaced_when_a_read_needs_them_settled() {
        let c = cache(4, PolicyKind::S3fifo);
        let (_, s) = c
            .get(key(0), false, |b| fill_as(b, 1, false))
            .await
            .unwrap();
        assert_eq!(s, Source::Upstream);
        let (got, s) = c.get(key(0), false, not_called).await.unwrap();
        assert_eq!((s, got.settled()), (Source::Cache, false));
        drop(got);
        let (got, s) = c.get(key(0), true, |b| fill(b, 2)).await.unwrap();
        assert_eq!((s, got.settled()), (Source::Upstream, true));
        assert_eq!(got.slice(0, 100).unwrap().to_vec().unwrap(), vec![2; 100]);
        assert_eq!(c.len(), 1);
        let (got, s) = c.get(key(0), true, not_called).await.unwrap();
        assert_eq!(s, Source::Cache);
        assert_eq!(got.slice(0, 100).unwrap().to_vec().unwrap(), vec![2; 100]);
        // An unsettled insert leaves the settled chunk.
        let b = c.try_slot().unwrap();
        b.copy_in(0, &[3; 100]).unwrap();
        c.insert(key(0), Chunk::new(b, 100, false));
        let (got, _) = c.get(key(0), false, not_called).await.unwrap();
        assert_eq!(got.slice(0, 100).unwrap().to_vec().unwrap(), vec![2; 100]);
    }

    /// A slot filled by a write allocation with `byte`.
    fn allocated(c: &ChunkCache, byte: u8, settled: bool) -> Chunk {
        let b = c.try_slot().unwrap();
        b.copy_in(0, &[byte; 100]).unwrap();
        Chunk::write_allocated(b, 100, settled)
    }

    /// Issue 42 finding 6c: a write-allocated chunk that nothing settles
    /// (no version id, no kept SHA-256) served every read inside the
    /// settle window, although the upstream may hold an MD5-colliding body
    /// under the same identity. Now it serves no read, whether or not the
    /// read needs settled chunks: each one goes upstream, and what it
    /// fetches replaces the provisional chunk. A settled write allocation
    /// hits at once.
    #[tokio::test]
    async fn unsettled_write_allocations_are_never_served() {
        let c = cache(4, PolicyKind::S3fifo);
        c.insert(key(0), allocated(&c, 1, false));
        assert_eq!(c.len(), 1, "kept");
        for need_settled in [false, true] {
            let (got, s) = c
                .get(key(0), need_settled, |b| fill_as(b, 2, false))
                .await
                .unwrap();
            assert_eq!(s, Source::Upstream, "need_settled {need_settled}");
            assert_eq!(got.slice(0, 100).unwrap().to_vec().unwrap(), vec![2; 100]);
        }
        // The fetched chunk replaced the provisional one, and serves
        // reads that accept unsettled chunks.
        assert_eq!(c.len(), 1);
        let (got, s) = c.get(key(0), false, not_called).await.unwrap();
        assert_eq!(s, Source::Cache);
        assert_eq!(got.slice(0, 100).unwrap().to_vec().unwrap(), vec![2; 100]);
        drop(got);
        // A provisional chunk never replaces a fetched one.
        c.insert(key(0), allocated(&c, 3, false));
        let (got, _) = c.get(key(0), false, not_called).await.unwrap();
        assert_eq!(got.slice(0, 100).unwrap().to_vec().unwrap(), vec![2; 100]);
        drop(got);
        // A settled write allocation (a version id or the kept SHA-256 pins
        // it) is served at once.
        c.insert(key(1), allocated(&c, 4, true));
        let (got, s) = c.get(key(1), true, not_called).await.unwrap();
        assert_eq!(s, Source::Cache);
        assert_eq!(got.slice(0, 100).unwrap().to_vec().unwrap(), vec![4; 100]);
    }
}
