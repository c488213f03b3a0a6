//! The cuObject dialect's DC rules that need no device (pure, no I/O): the
//! settings cuObject servers use, how long a DC initiator may keep writing
//! after its request ended, the fence a window goes through before its
//! memory is reused, the standard token minted for exactly one request's
//! window, and a bounded cache of address handles.
//!
//! In the cuObject dialect the client's memory sits behind a passive DC
//! target (DCT); the server's DC initiator (DCI) writes (GET) or reads (PUT)
//! it with no connection set-up, and the token names the DCT
//! (`lid`, `dctn`, `gid`). A DC write cannot be cancelled: once posted, the
//! initiator retries it until its retry budget runs out, so a window whose
//! request failed, timed out or was cancelled must be fenced (its key
//! invalidated, then the budget waited out) before its memory is reused or
//! given back. The DC key is one shared value across the field, so the
//! token is the only thing that limits what a server may touch: it must
//! grant exactly the request's bytes, for the request's lifetime.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use crate::token::{MAX_DCTN, RdmaToken, TokenError};

/// The DC access key cuObject servers and NVIDIA's sample use.
pub const DEFAULT_DC_KEY: u64 = 0xffee_ddcc;
/// The traffic class cuObject servers set on their address handles.
pub const DEFAULT_TRAFFIC_CLASS: u8 = 96;
/// Local ACK timeout exponent cuObject servers use (4.096 µs × 2^16).
pub const DEFAULT_TIMEOUT: u8 = 16;
/// Transport retries cuObject servers allow.
pub const DEFAULT_RETRY_COUNT: u8 = 7;
/// RNR retries cuObject servers allow (7 = retry forever; RDMA WRITE and
/// READ consume no receive, so they never see an RNR NAK).
pub const DEFAULT_RNR_RETRY: u8 = 7;

/// The settings of a DC initiator that bound how long it retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySettings {
    /// Local ACK timeout exponent (IBA: 4.096 µs × 2^timeout; 0 = none).
    pub timeout: u8,
    /// Transport retries after the first attempt (0 to 7).
    pub retry_count: u8,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            timeout: DEFAULT_TIMEOUT,
            retry_count: DEFAULT_RETRY_COUNT,
        }
    }
}

/// Why a retry budget cannot be known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetryBudgetError {
    /// A timeout of 0 means the initiator waits for an ACK forever.
    #[error(
        "a local ACK timeout of 0 never expires, so a posted DC write could land at any time; configure a timeout of 1 to 31"
    )]
    Unbounded,
    /// The exponent or the count is outside what the verbs accept.
    #[error(
        "DC retry settings out of range: timeout {timeout} (1 to 31), retry count {retry_count} (0 to 7)"
    )]
    OutOfRange {
        /// Local ACK timeout exponent.
        timeout: u8,
        /// Transport retries.
        retry_count: u8,
    },
}

impl RetrySettings {
    /// The longest a DC initiator with these settings may keep a posted
    /// operation alive after its target stops answering: every attempt
    /// (the first and `retry_count` retries) waits one local ACK timeout.
    /// With cuObject's defaults (16, 7) that is 8 × 268.4 ms ≈ 2.15 s.
    ///
    /// # Errors
    /// A timeout of 0 (no timeout: unbounded) or settings out of range.
    pub fn budget(&self) -> Result<Duration, RetryBudgetError> {
        if self.timeout == 0 {
            return Err(RetryBudgetError::Unbounded);
        }
        if self.timeout > 31 || self.retry_count > 7 {
            return Err(RetryBudgetError::OutOfRange {
                timeout: self.timeout,
                retry_count: self.retry_count,
            });
        }
        // 4.096 µs = 4096 ns; at most 4096 << 31 ns ≈ 8796 s per attempt.
        let per_attempt = Duration::from_nanos(4096u64 << self.timeout);
        Ok(per_attempt * (u32::from(self.retry_count) + 1))
    }
}

/// Where a window stands between requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowState {
    /// A token for it is out: a server may write or read it.
    Live,
    /// Its request did not end cleanly: its key must be invalidated and
    /// the retry budget waited out before the memory is reused.
    Fencing {
        /// Whether the key (registration or memory window) is invalidated.
        key_invalidated: bool,
        /// When the last write a server may still have posted has expired.
        until: Instant,
    },
    /// Nothing may reach it any more: its memory may be reused or given back.
    Quiet,
}

/// How a window's request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The server replied after its transfer's completion: nothing of it is
    /// still in flight.
    Completed,
    /// The request failed, timed out, or was cancelled: the server may
    /// still have operations posted against the window.
    Abandoned,
}

/// The fence of one window (state machine; the caller owns the clock and
/// the key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    state: WindowState,
    budget: Duration,
}

impl Fence {
    /// A live window whose servers retry for at most `budget`.
    pub fn live(budget: Duration) -> Fence {
        Fence {
            state: WindowState::Live,
            budget,
        }
    }

    /// The window's state.
    pub fn state(&self) -> WindowState {
        self.state
    }

    /// The request ended at `now`. A completed request leaves the window
    /// quiet at once; an abandoned one starts the fence. Ending a window
    /// that is not live changes nothing (the first ending decides).
    pub fn end(&mut self, how: Ending, now: Instant) {
        if self.state != WindowState::Live {
            return;
        }
        self.state = match how {
            Ending::Completed => WindowState::Quiet,
            Ending::Abandoned => WindowState::Fencing {
                key_invalidated: false,
                until: now + self.budget,
            },
        };
    }

    /// Whether the caller must invalidate the key now.
    pub fn needs_invalidation(&self) -> bool {
        matches!(
            self.state,
            WindowState::Fencing {
                key_invalidated: false,
                ..
            }
        )
    }

    /// The caller invalidated the window's key.
    pub fn key_invalidated(&mut self) {
        if let WindowState::Fencing { until, .. } = self.state {
            self.state = WindowState::Fencing {
                key_invalidated: true,
                until,
            };
        }
    }

    /// Advances the fence to `now`; returns whether the window is quiet
    /// (its memory may be reused). A fenced window becomes quiet only once
    /// its key is invalidated *and* the budget has run out.
    pub fn poll(&mut self, now: Instant) -> bool {
        if let WindowState::Fencing {
            key_invalidated: true,
            until,
        } = self.state
            && now >= until
        {
            self.state = WindowState::Quiet;
        }
        self.state == WindowState::Quiet
    }

    /// How long from `now` until the fence can end (zero once quiet or
    /// due; `None` while live or while the key is still valid).
    pub fn remaining(&self, now: Instant) -> Option<Duration> {
        match self.state {
            WindowState::Quiet => Some(Duration::ZERO),
            WindowState::Fencing {
                key_invalidated: true,
                until,
            } => Some(until.saturating_duration_since(now)),
            _ => None,
        }
    }
}

/// The DC target a standard token names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DcTarget {
    /// The port's LID (0 on RoCE).
    pub lid: u16,
    /// The DCT number (24 bits), read after the DCT reached RTR.
    pub dctn: u32,
    /// The GID (RoCE v2: the port's IP address as a GID); `None` on
    /// InfiniBand without a global route.
    pub gid: Option<[u8; 16]>,
}

/// The standard (cuObject) token for exactly `[addr, addr + len)` of a
/// request's window under `rkey`, at DC target `target`.
///
/// # Errors
/// A length over the token's 32 bits (slice the request), a range that
/// wraps, a DCT number over 24 bits.
pub fn mint_token(
    target: DcTarget,
    addr: u64,
    len: u64,
    rkey: u32,
) -> Result<RdmaToken, TokenError> {
    if target.dctn > MAX_DCTN {
        return Err(TokenError::Unrepresentable(format!(
            "DCT number {:#x} exceeds 24 bits",
            target.dctn
        )));
    }
    let size = u32::try_from(len).map_err(|_| {
        TokenError::Unrepresentable(format!(
            "{len} bytes exceed the token's 32-bit size; split the request"
        ))
    })?;
    if addr.checked_add(len).is_none() {
        return Err(TokenError::AddressWraps { addr, size });
    }
    Ok(RdmaToken {
        addr,
        size,
        rkey,
        lid: target.lid,
        dctn: target.dctn,
        gid_valid: target.gid.is_some(),
        gid: target.gid.unwrap_or([0; 16]),
    })
}

/// The DC target a standard token names.
pub fn target_of(token: &RdmaToken) -> DcTarget {
    DcTarget {
        lid: token.lid,
        dctn: token.dctn,
        gid: token.gid_valid.then_some(token.gid),
    }
}

/// What an address handle is made from: the remote port's address and the
/// local settings it is used with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhKey {
    /// Remote GID (`None`: LID-routed, InfiniBand).
    pub gid: Option<[u8; 16]>,
    /// Remote LID.
    pub lid: u16,
    /// Local port number.
    pub port: u8,
    /// Local GID index the handle sends from.
    pub sgid_index: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
}

/// A bounded cache of address handles (least recently used evicted). The
/// values are the caller's (a handle kept alive by the operations that use
/// it); an evicted one is handed back for the caller to drop.
#[derive(Debug)]
pub struct AhCache<K, V> {
    capacity: usize,
    tick: u64,
    entries: HashMap<K, (V, u64)>,
}

impl<K: Eq + Hash + Clone, V: Clone> AhCache<K, V> {
    /// A cache of at most `capacity` handles (at least one).
    pub fn new(capacity: usize) -> AhCache<K, V> {
        AhCache {
            capacity: capacity.max(1),
            tick: 0,
            entries: HashMap::new(),
        }
    }

    /// Handles held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no handle is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The handle for `key`, made by `make` on a miss. Returns it and, when
    /// the cache was full, the least recently used handle it evicted.
    ///
    /// # Errors
    /// `make`'s (nothing is cached then).
    pub fn get_or_make<E>(
        &mut self,
        key: &K,
        make: impl FnOnce(&K) -> Result<V, E>,
    ) -> Result<(V, Option<V>), E> {
        self.tick += 1;
        let tick = self.tick;
        if let Some((v, used)) = self.entries.get_mut(key) {
            *used = tick;
            return Ok((v.clone(), None));
        }
        let v = make(key)?;
        let evicted = if self.entries.len() >= self.capacity {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            oldest.and_then(|k| self.entries.remove(&k)).map(|(v, _)| v)
        } else {
            None
        };
        self.entries.insert(key.clone(), (v.clone(), tick));
        Ok((v, evicted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_budget_of_cuobjects_defaults_is_about_two_seconds() {
        let b = RetrySettings::default().budget().unwrap();
        assert_eq!(b, Duration::from_nanos(8 * (4096u64 << 16)));
        assert!(b > Duration::from_millis(2100) && b < Duration::from_millis(2200));
        assert_eq!(
            RetrySettings {
                timeout: 14,
                retry_count: 0
            }
            .budget(),
            Ok(Duration::from_nanos(4096 << 14))
        );
        assert_eq!(
            RetrySettings {
                timeout: 0,
                retry_count: 7
            }
            .budget(),
            Err(RetryBudgetError::Unbounded)
        );
        for (timeout, retry_count) in [(32, 7), (16, 8)] {
            assert!(matches!(
                RetrySettings {
                    timeout,
                    retry_count
                }
                .budget(),
                Err(RetryBudgetError::OutOfRange { .. })
            ));
        }
        // The largest settings do not overflow.
        assert!(
            RetrySettings {
                timeout: 31,
                retry_count: 7
            }
            .budget()
            .is_ok()
        );
    }

    #[test]
    fn a_completed_request_leaves_its_window_quiet_at_once() {
        let t0 = Instant::now();
        let mut f = Fence::live(Duration::from_secs(2));
        assert!(!f.poll(t0));
        assert_eq!(f.remaining(t0), None);
        f.end(Ending::Completed, t0);
        assert!(!f.needs_invalidation());
        assert!(f.poll(t0));
        // A later abandonment changes nothing: the first ending decides.
        f.end(Ending::Abandoned, t0);
        assert_eq!(f.state(), WindowState::Quiet);
    }

    #[test]
    fn an_abandoned_window_is_quiet_only_after_invalidation_and_the_budget() {
        let t0 = Instant::now();
        let budget = Duration::from_millis(2147);
        let mut f = Fence::live(budget);
        f.end(Ending::Abandoned, t0);
        assert!(f.needs_invalidation());
        // The budget alone is not enough: the key is still valid.
        assert!(!f.poll(t0 + budget * 10));
        assert_eq!(f.remaining(t0 + budget * 10), None);
        f.key_invalidated();
        assert!(!f.needs_invalidation());
        // Invalidated, but a write posted before it may still be retrying.
        assert!(!f.poll(t0 + budget - Duration::from_millis(1)));
        assert_eq!(
            f.remaining(t0 + Duration::from_millis(147)),
            Some(Duration::from_secs(2))
        );
        assert!(f.poll(t0 + budget));
        assert_eq!(f.state(), WindowState::Quiet);
        // A completion reported late changes nothing.
        f.end(Ending::Completed, t0 + budget);
        assert_eq!(f.state(), WindowState::Quiet);
        // The budget runs from the ending, not from the invalidation.
        let mut g = Fence::live(budget);
        g.end(Ending::Abandoned, t0);
        g.key_invalidated();
        g.key_invalidated();
        assert!(g.poll(t0 + budget));
    }

    #[test]
    fn minted_tokens_grant_exactly_the_window_and_parse_back() {
        let target = DcTarget {
            lid: 0,
            dctn: 0x00ab_cdef,
            gid: Some(
                "::ffff:10.1.2.3"
                    .parse::<std::net::Ipv6Addr>()
                    .unwrap()
                    .octets(),
            ),
        };
        let t = mint_token(target, 0x7f00_1234_0000, 4 << 20, 0x1234_5678).unwrap();
        let s = t.to_string();
        assert_eq!(
            s,
            "00007f0012340000:00400000:12345678:0000:abcdef:1:00000000000000000000ffff0a010203"
        );
        let back = RdmaToken::parse(&s).unwrap();
        assert_eq!(back, t);
        assert_eq!(target_of(&back), target);
        assert_eq!(back.remote().len, 4 << 20);
        // LID-routed (InfiniBand): no GID, flag 0.
        let ib = DcTarget {
            lid: 7,
            dctn: 1,
            gid: None,
        };
        let t = mint_token(ib, 4096, 1, 9).unwrap();
        assert!(t.to_string().contains(":0007:000001:0:"));
        assert_eq!(target_of(&RdmaToken::parse(&t.to_string()).unwrap()), ib);
    }

    #[test]
    fn tokens_that_cannot_be_represented_are_refused() {
        let target = DcTarget {
            lid: 0,
            dctn: 1,
            gid: None,
        };
        assert!(mint_token(target, 0, 1 << 32, 1).is_err());
        assert!(matches!(
            mint_token(target, u64::MAX - 1, 4, 1),
            Err(TokenError::AddressWraps { .. })
        ));
        assert!(
            mint_token(
                DcTarget {
                    dctn: MAX_DCTN + 1,
                    ..target
                },
                0,
                1,
                1
            )
            .is_err()
        );
    }

    #[test]
    fn the_address_handle_cache_is_bounded_and_evicts_the_least_recently_used() {
        let key = |lid: u16| AhKey {
            gid: None,
            lid,
            port: 1,
            sgid_index: 3,
            traffic_class: DEFAULT_TRAFFIC_CLASS,
            hop_limit: 64,
        };
        let mut made = 0;
        let mut c: AhCache<AhKey, u16> = AhCache::new(2);
        let mut get = |c: &mut AhCache<AhKey, u16>, lid| {
            c.get_or_make(&key(lid), |k| {
                made += 1;
                Ok::<_, ()>(k.lid)
            })
            .unwrap()
        };
        assert_eq!(get(&mut c, 1), (1, None));
        assert_eq!(get(&mut c, 2), (2, None));
        assert_eq!(get(&mut c, 1), (1, None)); // a hit: 2 is now the oldest
        assert_eq!(get(&mut c, 3), (3, Some(2)));
        assert_eq!(c.len(), 2);
        assert_eq!(get(&mut c, 1), (1, None));
        assert_eq!(made, 3);
        // A failed make caches nothing and evicts nothing.
        let r: Result<_, &str> = c.get_or_make(&key(9), |_| Err("no route"));
        assert_eq!(r, Err("no route"));
        assert_eq!(c.len(), 2);
        // Settings are part of the key.
        let other_tc = AhKey {
            traffic_class: 0,
            ..key(1)
        };
        assert_eq!(
            c.get_or_make(&other_tc, |_| Ok::<_, ()>(100)).unwrap(),
            (100, Some(3))
        );
        let zero: AhCache<AhKey, u8> = AhCache::new(0);
        assert!(zero.is_empty());
    }
}
