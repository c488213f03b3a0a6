//! Backing off from an (S3 user, fabric endpoint) pair whose connect was
//! refused (issue 42, finding 6d).
//!
//! A signed user may name any endpoint in `rdma.allowed_client_networks`,
//! and each request used to dial it afresh: naming a tenant host's endpoint
//! with made-up keys in many parallel requests made that host (and this
//! server) run a handshake per request. Now a failed connect or handshake
//! puts the pair in backoff: for a period that starts at
//! [`INITIAL`] and doubles with every further refusal (up to [`MAX`]), that
//! user's requests naming that endpoint are answered at once with the
//! error of a failed connect, without dialing. Once the period ends one
//! request may dial again; a success forgets the pair. Other users, and
//! the same user's other endpoints, are not affected.
//!
//! [`Backoff`] is the pure bookkeeping (the caller passes the time, so it
//! is tested without sleeping); [`Gate`] adds the per-pair turn that makes
//! concurrent requests of one pair dial one at a time, so that the
//! requests queued behind a refused dial see its backoff instead of
//! dialing too.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::dialect::Dialect;

/// The first backoff period after a refusal.
pub const INITIAL: Duration = Duration::from_secs(1);
/// The longest backoff period.
pub const MAX: Duration = Duration::from_secs(60);
/// The most pairs remembered at once (the oldest give way).
pub const MAX_ENTRIES: usize = 4096;

/// An (S3 user, transport, endpoint address) pair. The address is the
/// socket address alone (not the responder id), so that a user cannot
/// dodge the backoff by varying the token's other fields.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    user: String,
    via: Dialect,
    addr: SocketAddr,
}

impl Key {
    /// The pair of `user` and `addr` over `via`.
    #[must_use]
    pub fn new(user: &str, via: Dialect, addr: SocketAddr) -> Key {
        Key {
            user: user.to_owned(),
            via,
            addr,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The current period.
    period: Duration,
    /// No dial before this.
    until: Instant,
}

/// The backoff state of every pair whose last connect was refused.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    cap: usize,
    entries: HashMap<Key, Entry>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(INITIAL, MAX, MAX_ENTRIES)
    }
}

impl Backoff {
    /// Periods from `initial` doubling to `max`; at most `cap` pairs.
    #[must_use]
    pub fn new(initial: Duration, max: Duration, cap: usize) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            cap: cap.max(1),
            entries: HashMap::new(),
        }
    }

    /// `Ok` when `key` may dial at `now`; otherwise how long it still
    /// backs off.
    ///
    /// # Errors
    /// The time left while `key` backs off.
    pub fn check(&self, key: &Key, now: Instant) -> Result<(), Duration> {
        match self.entries.get(key) {
            Some(e) if now < e.until => Err(e.until - now),
            _ => Ok(()),
        }
    }

    /// Records a refused connect of `key` at `now`; returns the backoff
    /// period that starts. A refusal after a backoff ended doubles the
    /// period; one long after (more than [`MAX`] past its end) starts over.
    pub fn refused(&mut self, key: &Key, now: Instant) -> Duration {
        let period = match self.entries.get(key) {
            // A dial that was already in flight: the running period stands.
            Some(e) if now < e.until => return e.period,
            Some(e) if now < e.until + self.max => (e.period * 2).min(self.max),
            _ => self.initial,
        };
        if !self.entries.contains_key(key) && self.entries.len() >= self.cap {
            self.make_room(now);
        }
        self.entries.insert(
            key.clone(),
            Entry {
                period,
                until: now + period,
            },
        );
        period
    }

    /// Records a successful connect of `key`: it is forgotten.
    pub fn connected(&mut self, key: &Key) {
        self.entries.remove(key);
    }

    /// Number of pairs remembered.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no pair is remembered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Drops the stale pairs, and if none is stale the one whose backoff
    /// ends first.
    fn make_room(&mut self, now: Instant) {
        let max = self.max;
        self.entries.retain(|_, e| now < e.until + max);
        if self.entries.len() >= self.cap
            && let Some(k) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.until)
                .map(|(k, _)| k.clone())
        {
            self.entries.remove(&k);
        }
    }
}

type Turns = HashMap<Key, Arc<tokio::sync::Mutex<()>>>;

/// [`Backoff`] with a turn per pair: one dial of a pair at a time.
#[derive(Debug, Default)]
pub struct Gate {
    backoff: Mutex<Backoff>,
    turns: Mutex<Turns>,
}

/// A pair's turn to dial ([`Gate::turn`]); ends when dropped.
#[derive(Debug)]
pub struct Turn<'a> {
    gate: &'a Gate,
    key: Key,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Gate {
    /// A gate over `backoff`.
    #[must_use]
    pub fn new(backoff: Backoff) -> Gate {
        Gate {
            backoff: Mutex::new(backoff),
            turns: Mutex::new(HashMap::new()),
        }
    }

    fn backoff(&self) -> MutexGuard<'_, Backoff> {
        self.backoff
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn turns(&self) -> MutexGuard<'_, Turns> {
        self.turns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for `key`'s turn (the other requests of the pair that are
    /// connecting go first).
    pub async fn turn(&self, key: Key) -> Turn<'_> {
        let lock = {
            let mut turns = self.turns();
            if turns.len() >= MAX_ENTRIES {
                // Turns left behind by cancelled requests.
                turns.retain(|_, l| Arc::strong_count(l) > 1);
            }
            Arc::clone(turns.entry(key.clone()).or_default())
        };
        // Declared before the wait, so that a cancelled wait drops its
        // handle on the lock first and the turn's drop can forget it.
        let mut turn = Turn {
            gate: self,
            key,
            guard: None,
        };
        let wait = lock.lock_owned();
        turn.guard = Some(wait.await);
        turn
    }

    /// [`Backoff::check`] now.
    ///
    /// # Errors
    /// The time left while `key` backs off.
    pub fn check(&self, key: &Key) -> Result<(), Duration> {
        self.backoff().check(key, Instant::now())
    }

    /// [`Backoff::refused`] now.
    pub fn refused(&self, key: &Key) -> Duration {
        self.backoff().refused(key, Instant::now())
    }

    /// [`Backoff::connected`].
    pub fn connected(&self, key: &Key) {
        self.backoff().connected(key);
    }
}

impl Turn<'_> {
    /// The pair.
    #[must_use]
    pub fn key(&self) -> &Key {
        &self.key
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut turns = self.gate.turns();
        if turns
            .get(&self.key)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            turns.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(user: &str, port: u16) -> Key {
        Key::new(
            user,
            Dialect::S3dma,
            SocketAddr::from(([127, 0, 0, 1], port)),
        )
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_refused_pair_backs_off_doubling_to_the_cap() {
        let t0 = Instant::now();
        let mut b = Backoff::new(S, 8 * S, 16);
        let k = key("mallory", 7000);
        assert_eq!(b.check(&k, t0), Ok(()));
        assert_eq!(b.refused(&k, t0), S);
        assert_eq!(b.check(&k, t0), Err(S));
        assert!(b.check(&k, t0 + S / 2).is_err());
        // The period over: one dial may go; refused again, the period doubles.
        let mut now = t0 + S;
        assert_eq!(b.check(&k, now), Ok(()));
        let mut expect = 2 * S;
        for _ in 0..5 {
            assert_eq!(b.refused(&k, now), expect);
            assert_eq!(b.check(&k, now + expect - S / 2), Err(S / 2));
            now += expect;
            assert_eq!(b.check(&k, now), Ok(()));
            expect = (expect * 2).min(8 * S);
        }
        assert_eq!(b.refused(&k, now), 8 * S);
        // A refusal of a dial that was in flight does not double it.
        assert_eq!(b.refused(&k, now + S), 8 * S);
        assert_eq!(b.check(&k, now + 8 * S), Ok(()));
        // A success forgets the pair.
        b.connected(&k);
        assert!(b.is_empty());
        assert_eq!(b.refused(&k, now + 9 * S), S);
    }

    #[test]
    fn other_users_and_endpoints_are_not_affected() {
        let t0 = Instant::now();
        let mut b = Backoff::default();
        let k = key("mallory", 7000);
        b.refused(&k, t0);
        assert!(b.check(&k, t0).is_err());
        assert_eq!(b.check(&key("tenant", 7000), t0), Ok(()));
        assert_eq!(b.check(&key("mallory", 7001), t0), Ok(()));
        let dc = Key::new(
            "mallory",
            Dialect::CuobjectDc,
            SocketAddr::from(([127, 0, 0, 1], 7000)),
        );
        assert_eq!(b.check(&dc, t0), Ok(()));
    }

    #[test]
    fn a_refusal_long_after_starts_over() {
        let t0 = Instant::now();
        let mut b = Backoff::new(S, 8 * S, 16);
        let k = key("u", 1);
        b.refused(&k, t0);
        assert_eq!(b.refused(&k, t0 + S), 2 * S);
        // Ended at t0 + 3 s; more than MAX (8 s) after that: from the start.
        assert_eq!(b.refused(&k, t0 + 12 * S), S);
    }

    #[test]
    fn the_map_is_bounded() {
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        let mut b = Backoff::new(S, 8 * S, 4);
        for p in 0..4 {
            b.refused(&key("u", p), t0 + ms * u32::from(p));
        }
        assert_eq!(b.len(), 4);
        // Full: the pair whose backoff ends first gives way.
        let now = t0 + 10 * ms;
        b.refused(&key("u", 10), now);
        assert_eq!(b.len(), 4);
        assert_eq!(b.check(&key("u", 0), now), Ok(()));
        for p in [1, 2, 3, 10] {
            assert!(b.check(&key("u", p), now).is_err(), "{p}");
        }
        // Stale pairs go first, all of them.
        b.refused(&key("u", 11), t0 + 100 * S);
        assert_eq!(b.len(), 1);
    }

    #[tokio::test]
    async fn turns_are_one_at_a_time_and_forgotten() {
        let gate = Gate::default();
        let k = key("u", 1);
        let first = gate.turn(k.clone()).await;
        let second = gate.turn(k.clone());
        tokio::pin!(second);
        // The second waits for the first.
        assert!(futures::poll!(&mut second).is_pending());
        // Another pair does not wait.
        let other = gate.turn(key("v", 1)).await;
        drop(other);
        drop(first);
        let second = second.await;
        assert_eq!(second.key(), &k);
        drop(second);
        assert!(gate.turns().is_empty());
        // A cancelled wait leaves nothing behind either.
        let held = gate.turn(k.clone()).await;
        {
            let waiting = gate.turn(k.clone());
            tokio::pin!(waiting);
            assert!(futures::poll!(&mut waiting).is_pending());
        }
        drop(held);
        assert!(gate.turns().is_empty());
    }
}
