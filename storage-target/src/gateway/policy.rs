//! Which cached chunk to evict: S3-FIFO (the default) and LRU, with no I/O,
//! tested and compared deterministically ([`simulate`]).
//!
//! A gateway's cache sees two patterns at once: a checkpoint fanned out to
//! many readers (every chunk read again soon after its first read) and
//! one-pass scans (every chunk read once). LRU lets a scan flush the
//! checkpoint: each scanned chunk becomes the most recent. S3-FIFO (Yang et
//! al., "FIFO queues are all you need for cache eviction", SOSP 2023) puts
//! new chunks in a small FIFO (a tenth of the capacity); only chunks read
//! again while there move to the main FIFO, so a scan passes through the
//! small queue and the checkpoint stays in the main one. A ghost FIFO
//! remembers recently evicted keys: a chunk read again soon after its
//! eviction goes straight to the main queue.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;

pub use crate::config::gateway::PolicyKind;

/// Bookkeeping of which keys are cached and which to evict next. The cache
/// holds the values; the policy only sees keys.
#[derive(Debug)]
pub enum Policy<K> {
    /// See [`S3Fifo`].
    S3fifo(S3Fifo<K>),
    /// See [`Lru`].
    Lru(Lru<K>),
}

impl<K: Clone + Eq + Hash> Policy<K> {
    /// An empty policy for `capacity` entries.
    #[must_use]
    pub fn new(kind: PolicyKind, capacity: usize) -> Self {
        match kind {
            PolicyKind::S3fifo => Policy::S3fifo(S3Fifo::new(capacity)),
            PolicyKind::Lru => Policy::Lru(Lru::new()),
        }
    }

    /// A cached key was read.
    pub fn hit(&mut self, k: &K) {
        match self {
            Policy::S3fifo(p) => p.hit(k),
            Policy::Lru(p) => p.hit(k),
        }
    }

    /// A key entered the cache (it was not cached).
    pub fn insert(&mut self, k: K) {
        match self {
            Policy::S3fifo(p) => p.insert(k),
            Policy::Lru(p) => p.insert(k),
        }
    }

    /// Picks and forgets the key to evict; `None` when empty.
    pub fn evict(&mut self) -> Option<K> {
        match self {
            Policy::S3fifo(p) => p.evict(),
            Policy::Lru(p) => p.evict(),
        }
    }

    /// Forgets a key the cache dropped for another reason (a stale version).
    pub fn remove(&mut self, k: &K) {
        match self {
            Policy::S3fifo(p) => p.remove(k),
            Policy::Lru(p) => p.remove(k),
        }
    }

    /// Keys cached.
    #[must_use]
    pub fn len(&self) -> usize {
        match self {
            Policy::S3fifo(p) => p.freq.len(),
            Policy::Lru(p) => p.stamp.len(),
        }
    }

    /// Whether nothing is cached.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// S3-FIFO: a small and a main FIFO of cached keys with a 2-bit read count
/// each, and a ghost FIFO of evicted keys.
#[derive(Debug)]
pub struct S3Fifo<K> {
    small: VecDeque<K>,
    main: VecDeque<K>,
    /// Read count (0..=3) of every cached key; the queues may hold stale
    /// entries of removed keys, skipped when popped.
    freq: HashMap<K, u8>,
    /// Which queue a cached key is in (`true`: main).
    in_main: HashMap<K, bool>,
    /// Cached keys in the small queue (the rest are in the main one).
    small_count: usize,
    ghost: VecDeque<K>,
    ghost_set: HashSet<K>,
    small_target: usize,
    ghost_cap: usize,
}

impl<K: Clone + Eq + Hash> S3Fifo<K> {
    /// An empty S3-FIFO for `capacity` entries (the small queue's share is
    /// a tenth, at least one).
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        S3Fifo {
            small: VecDeque::new(),
            main: VecDeque::new(),
            freq: HashMap::new(),
            in_main: HashMap::new(),
            small_count: 0,
            ghost: VecDeque::new(),
            ghost_set: HashSet::new(),
            small_target: (capacity / 10).max(1),
            ghost_cap: capacity.max(1),
        }
    }

    fn hit(&mut self, k: &K) {
        if let Some(f) = self.freq.get_mut(k) {
            *f = (*f + 1).min(3);
        }
    }

    fn insert(&mut self, k: K) {
        if self.freq.contains_key(&k) {
            return;
        }
        let main = self.ghost_set.remove(&k);
        if main {
            self.ghost.retain(|g| g != &k);
            self.main.push_back(k.clone());
        } else {
            self.small.push_back(k.clone());
            self.small_count += 1;
        }
        self.in_main.insert(k.clone(), main);
        self.freq.insert(k, 0);
    }

    fn evict(&mut self) -> Option<K> {
        loop {
            if self.freq.is_empty() {
                return None;
            }
            let from_small =
                self.small_count >= self.small_target || self.small_count == self.freq.len();
            if from_small {
                let Some(k) = self.small.pop_front() else {
                    continue;
                };
                match (self.freq.get(&k).copied(), self.in_main.get(&k).copied()) {
                    (Some(f), Some(false)) if f >= 1 => {
                        // Read again while new: worth keeping.
                        self.freq.insert(k.clone(), 0);
                        self.in_main.insert(k.clone(), true);
                        self.small_count -= 1;
                        self.main.push_back(k);
                    }
                    (Some(_), Some(false)) => {
                        self.forget(&k);
                        self.remember_ghost(k.clone());
                        return Some(k);
                    }
                    _ => {} // stale entry
                }
            } else {
                let Some(k) = self.main.pop_front() else {
                    continue;
                };
                match (self.freq.get(&k).copied(), self.in_main.get(&k).copied()) {
                    (Some(f), Some(true)) if f > 0 => {
                        self.freq.insert(k.clone(), f - 1);
                        self.main.push_back(k);
                    }
                    (Some(_), Some(true)) => {
                        self.forget(&k);
                        return Some(k);
                    }
                    _ => {}
                }
            }
        }
    }

    fn forget(&mut self, k: &K) {
        self.freq.remove(k);
        if self.in_main.remove(k) == Some(false) {
            self.small_count -= 1;
        }
    }

    fn remember_ghost(&mut self, k: K) {
        if self.ghost_set.insert(k.clone()) {
            self.ghost.push_back(k);
        }
        while self.ghost.len() > self.ghost_cap {
            if let Some(old) = self.ghost.pop_front() {
                self.ghost_set.remove(&old);
            }
        }
    }

    fn remove(&mut self, k: &K) {
        self.forget(k);
        // Its queue entry goes when popped.
    }
}

/// Least recently used, by a logical clock.
#[derive(Debug)]
pub struct Lru<K> {
    clock: u64,
    stamp: HashMap<K, u64>,
    order: std::collections::BTreeMap<u64, K>,
}

impl<K: Clone + Eq + Hash> Lru<K> {
    /// An empty LRU.
    #[must_use]
    pub fn new() -> Self {
        Lru {
            clock: 0,
            stamp: HashMap::new(),
            order: std::collections::BTreeMap::new(),
        }
    }

    fn touch(&mut self, k: K) {
        self.clock += 1;
        if let Some(old) = self.stamp.insert(k.clone(), self.clock) {
            self.order.remove(&old);
        }
        self.order.insert(self.clock, k);
    }

    fn hit(&mut self, k: &K) {
        if self.stamp.contains_key(k) {
            self.touch(k.clone());
        }
    }

    fn insert(&mut self, k: K) {
        self.touch(k);
    }

    fn evict(&mut self) -> Option<K> {
        let (_, k) = self.order.pop_first()?;
        self.stamp.remove(&k);
        Some(k)
    }

    fn remove(&mut self, k: &K) {
        if let Some(s) = self.stamp.remove(k) {
            self.order.remove(&s);
        }
    }
}

impl<K: Clone + Eq + Hash> Default for Lru<K> {
    fn default() -> Self {
        Self::new()
    }
}

/// Hits and misses of a policy on a trace of key reads, for a cache of
/// `capacity` entries.
#[must_use]
pub fn simulate<K: Clone + Eq + Hash>(
    kind: PolicyKind,
    capacity: usize,
    trace: &[K],
) -> (u64, u64) {
    let mut p = Policy::new(kind, capacity);
    let mut cached: HashSet<K> = HashSet::new();
    let (mut hits, mut misses) = (0, 0);
    for k in trace {
        if cached.contains(k) {
            hits += 1;
            p.hit(k);
            continue;
        }
        misses += 1;
        while cached.len() >= capacity {
            match p.evict() {
                Some(e) => {
                    cached.remove(&e);
                }
                None => break,
            }
        }
        cached.insert(k.clone());
        p.insert(k.clone());
    }
    (hits, misses)
}

/// The two patterns of a gateway's cache, interleaved: `readers` readers
/// load the same `checkpoint` chunks (each starting `stagger` chunk reads
/// after the previous), while a scan reads `scan` distinct chunks once,
/// one scan read after every checkpoint read. Keys: `(0, chunk)` for the
/// checkpoint, `(1, chunk)` for the scan.
#[must_use]
pub fn fanout_with_scan(checkpoint: u64, readers: u64, stagger: u64, scan: u64) -> Vec<(u8, u64)> {
    let mut trace = Vec::new();
    let mut scan_next = 0;
    let end = (readers - 1) * stagger + checkpoint;
    for t in 0..end {
        for r in 0..readers {
            let start = r * stagger;
            if t >= start && t < start + checkpoint {
                trace.push((0, t - start));
                if scan_next < scan {
                    trace.push((1, scan_next));
                    scan_next += 1;
                }
            }
        }
    }
    trace.extend((scan_next..scan).map(|c| (1, c)));
    trace
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ratio((h, m): (u64, u64)) -> f64 {
        h as f64 / (h + m) as f64
    }

    #[test]
    fn both_evict_everything_and_keep_counts() {
        for kind in [PolicyKind::S3fifo, PolicyKind::Lru] {
            let mut p = Policy::new(kind, 4);
            for k in 0..4 {
                p.insert(k);
            }
            p.hit(&2);
            assert_eq!(p.len(), 4);
            p.remove(&3);
            assert_eq!(p.len(), 3);
            let mut out = Vec::new();
            while let Some(k) = p.evict() {
                out.push(k);
            }
            out.sort_unstable();
            assert_eq!(out, vec![0, 1, 2], "{kind:?}");
            assert!(p.is_empty());
            // Inserting twice is one entry.
            p.insert(7);
            p.insert(7);
            assert_eq!(p.len(), 1);
        }
    }

    #[test]
    fn lru_evicts_least_recent() {
        let mut p = Policy::new(PolicyKind::Lru, 3);
        for k in 0..3 {
            p.insert(k);
        }
        p.hit(&0);
        assert_eq!(p.evict(), Some(1));
        assert_eq!(p.evict(), Some(2));
        assert_eq!(p.evict(), Some(0));
    }

    #[test]
    fn s3fifo_keeps_what_was_read_again_through_a_scan() {
        let mut p = Policy::new(PolicyKind::S3fifo, 10);
        let mut cached = HashSet::new();
        // A "checkpoint" of 5 chunks, each read twice.
        for k in 0..5 {
            p.insert(k);
            cached.insert(k);
            p.hit(&k);
        }
        // A scan of 100 chunks read once, through a full cache.
        for k in 100..200 {
            while cached.len() >= 10 {
                let e = p.evict().unwrap();
                assert!(cached.remove(&e));
            }
            p.insert(k);
            cached.insert(k);
        }
        for k in 0..5 {
            assert!(
                cached.contains(&k),
                "checkpoint chunk {k} was evicted by the scan"
            );
        }
    }

    #[test]
    fn ghost_hits_go_to_main() {
        let mut p = S3Fifo::new(10);
        p.insert(1);
        for k in 2..20 {
            p.insert(k);
            if p.freq.len() > 10 {
                p.evict();
            }
        }
        assert!(!p.freq.contains_key(&1));
        assert!(p.ghost_set.contains(&1));
        p.insert(1);
        assert_eq!(p.in_main.get(&1), Some(&true));
    }

    /// The comparison the cache's default rests on (printed with
    /// `--nocapture`): a 256-chunk cache, a 200-chunk checkpoint read by 8
    /// readers 40 chunks apart, with and without a 4,000-chunk scan
    /// interleaved. Alone both serve 87.5 % of reads from the cache; with
    /// the scan, S3-FIFO 23 % and LRU 5 % (the scan's own reads all miss):
    /// S3-FIFO serves 92 % of the checkpoint's re-reads, LRU 21 %.
    #[test]
    fn s3fifo_against_lru() {
        let cap = 256;
        let cases = [
            ("fan-out alone", fanout_with_scan(200, 8, 40, 0)),
            ("fan-out with a scan", fanout_with_scan(200, 8, 40, 4000)),
            ("scan alone", fanout_with_scan(1, 1, 1, 4000)),
        ];
        for (name, trace) in &cases {
            let s = simulate(PolicyKind::S3fifo, cap, trace);
            let l = simulate(PolicyKind::Lru, cap, trace);
            println!(
                "{name}: {} reads; hit ratio S3-FIFO {:.3}, LRU {:.3}",
                trace.len(),
                ratio(s),
                ratio(l)
            );
        }
        let alone = &cases[0].1;
        assert_eq!(
            simulate(PolicyKind::S3fifo, cap, alone),
            simulate(PolicyKind::Lru, cap, alone)
        );
        // Checkpoint reads that hit, with the scan running.
        let trace = &cases[1].1;
        let ckpt_hits = |kind| {
            let mut p = Policy::new(kind, cap);
            let mut cached = HashSet::new();
            let mut hits = 0u64;
            for k in trace {
                if cached.contains(k) {
                    p.hit(k);
                    hits += u64::from(k.0 == 0);
                    continue;
                }
                while cached.len() >= cap {
                    cached.remove(&p.evict().unwrap());
                }
                cached.insert(*k);
                p.insert(*k);
            }
            hits
        };
        let (s, l) = (ckpt_hits(PolicyKind::S3fifo), ckpt_hits(PolicyKind::Lru));
        println!(
            "checkpoint chunks served from cache during the scan: S3-FIFO {s}, LRU {l} of {}",
            200 * 7
        );
        // Deterministic: 1288 and 288 of the 1400 re-reads. The second
        // reader's first re-reads miss under S3-FIFO too (the chunks left
        // the small queue before it came); from then on the checkpoint stays.
        assert!(s > 4 * l, "S3-FIFO {s} vs LRU {l}");
        assert!(
            s * 10 >= 200 * 7 * 9,
            "S3-FIFO served only {s} of 1400 re-reads"
        );
    }
}
