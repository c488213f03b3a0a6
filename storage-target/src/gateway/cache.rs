//! The gateway's read cache: object chunks in fabric-registered memory, so
//! that a hit is one RDMA WRITE from the cache straight into the tenant's
//! window, with no copy.
//!
//! * Keyed by bucket, key, ETag and chunk index: a new version of an object
//!   has a new ETag, so its chunks are new entries and a read never mixes
//!   versions (its upstream fetches carry `If-Match` with the ETag).
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
use crate::metrics::Metrics;

/// Which chunk of which object version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChunkKey {
    /// Bucket.
    pub bucket: Arc<str>,
    /// Object key.
    pub key: Arc<str>,
    /// The version's ETag (as the upstream sent it, quotes included).
    pub etag: Arc<str>,
    /// Chunk index (byte offset / chunk size).
    pub index: u64,
}

/// One cached chunk: a slot of the registered region and how many of its
/// bytes are the object's (the last chunk of an object is shorter).
#[derive(Debug)]
pub struct Chunk {
    buf: StagingBuf,
    len: usize,
}

impl Chunk {
    /// A slot filled with `len` bytes.
    #[must_use]
    pub fn new(buf: StagingBuf, len: usize) -> Self {
        Chunk { buf, len }
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

/// Where a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Already cached.
    Cache,
    /// This request fetched it from the upstream.
    Upstream,
    /// Another request was fetching it; this one waited for that fetch.
    SingleFlight,
}

impl Source {
    /// The metric label.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Source::Cache => "cache",
            Source::Upstream => "upstream",
            Source::SingleFlight => "single_flight",
        }
    }
}

type Flight = Arc<OnceCell<Arc<Chunk>>>;

#[derive(Debug)]
struct State {
    chunks: HashMap<ChunkKey, Arc<Chunk>>,
    policy: Policy<ChunkKey>,
    flights: HashMap<ChunkKey, Flight>,
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
    /// whose result is then cached).
    ///
    /// # Errors
    /// `fetch`'s error (the chunk is then not cached).
    pub async fn get<F, Fut, E>(&self, key: ChunkKey, fetch: F) -> Result<(Arc<Chunk>, Source), E>
    where
        F: FnOnce(StagingBuf) -> Fut,
        Fut: Future<Output = Result<Chunk, E>>,
    {
        let flight = {
            let mut st = self.lock();
            if let Some(c) = st.chunks.get(&key).cloned() {
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
                async {
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
                && !st.chunks.contains_key(&key)
            {
                st.chunks.insert(key.clone(), Arc::clone(c));
                st.policy.insert(key);
                let n = st.chunks.len();
                drop(st);
                self.metrics.cache_resident(n);
                self.inserted.notify_waiters();
            }
        }
        if r.is_ok() {
            self.metrics.cache_lookup(source);
        }
        r.map(|c| (c, source))
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

    /// Puts `chunk` in the cache as `key` unless it is there already (a
    /// write allocation: the bytes a tenant just wrote, under the ETag the
    /// upstream gave them).
    pub fn insert(&self, key: ChunkKey, chunk: Chunk) {
        let mut st = self.lock();
        if st.chunks.contains_key(&key) {
            return;
        }
        st.chunks.insert(key.clone(), Arc::new(chunk));
        st.policy.insert(key);
        let n = st.chunks.len();
        drop(st);
        self.metrics.cache_resident(n);
        self.inserted.notify_waiters();
    }

    /// Drops every cached chunk of `bucket`/`key` whose ETag is not `etag`
    /// (a newer version was seen): they can never be served again.
    pub fn forget_other_versions(&self, bucket: &str, key: &str, etag: &str) {
        let mut st = self.lock();
        let stale: Vec<ChunkKey> = st
            .chunks
            .keys()
            .filter(|k| &*k.bucket == bucket && &*k.key == key && &*k.etag != etag)
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

    fn key(index: u64) -> ChunkKey {
        ChunkKey {
            bucket: "b".into(),
            key: "k".into(),
            etag: "\"e1\"".into(),
            index,
        }
    }

    async fn fill(buf: StagingBuf, byte: u8) -> Result<Chunk, String> {
        buf.copy_in(0, &[byte; 100]).unwrap();
        Ok(Chunk::new(buf, 100))
    }

    #[tokio::test]
    async fn hit_after_miss_and_bytes_are_kept() {
        let c = cache(4, PolicyKind::S3fifo);
        let (a, s) = c.get(key(0), |b| fill(b, 7)).await.unwrap();
        assert_eq!(s, Source::Upstream);
        assert_eq!(a.len(), 100);
        let (b, s) = c
            .get(key(0), |_| async {
                Err::<Chunk, String>("not called".into())
            })
            .await
            .unwrap();
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
        c.insert(key(0), Chunk::new(a, 100));
        drop(b);
        let (got, s) = c
            .get(key(0), |_| async {
                Err::<Chunk, String>("not called".into())
            })
            .await
            .unwrap();
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
            .get(key(0), |_| async {
                Err::<Chunk, String>("upstream down".into())
            })
            .await
            .unwrap_err();
        assert_eq!(e, "upstream down");
        assert!(c.is_empty());
        let (_, s) = c.get(key(0), |b| fill(b, 1)).await.unwrap();
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
                c.get(key(3), |b| async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    fill(b, 3).await
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
        let (held, _) = c.get(key(0), |b| fill(b, 10)).await.unwrap();
        c.get(key(1), |b| fill(b, 11)).await.unwrap();
        // A third chunk evicts the least recent (key 0), which a "WRITE"
        // still holds: its slot is not reused until it is dropped.
        let c2 = Arc::clone(&c);
        let t = tokio::spawn(async move { c2.get(key(2), |b| fill(b, 12)).await.map(|(x, _)| x) });
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
        c.get(key(0), |b| fill(b, 1)).await.unwrap();
        let mut k2 = key(0);
        k2.etag = "\"e2\"".into();
        c.get(k2.clone(), |b| fill(b, 2)).await.unwrap();
        assert_eq!(c.len(), 2);
        c.forget_other_versions("b", "k", "\"e2\"");
        assert_eq!(c.len(), 1);
        let (_, s) = c.get(k2, |b| fill(b, 3)).await.unwrap();
        assert_eq!(s, Source::Cache);
    }
}
