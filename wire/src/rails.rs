//! Which rail a chunk or part goes over: the dpu-agent's rail selector,
//! with no I/O and no clock reads (callers pass [`Instant`]s), so every
//! decision is a function of what it was told.
//!
//! A *rail* is one fabric path to the tenant's memory, keyed by the
//! endpoint its token names (ip:port). A request names its rails (the
//! same window minted on each); for every chunk or part the caller asks
//! [`Rails::pick`] among them and gets a [`Ticket`], and reports how the
//! transfer went with [`Rails::succeeded`], [`Rails::failed`] (the rail
//! failed it: marks the rail down) or [`Rails::released`] (it ended for a
//! reason that says nothing about the rail).
//!
//! Per rail it keeps: up or down (since when, when the next failback
//! trial is due and the backoff that set it), the bytes in flight, and an
//! EWMA of the bytes per second its transfers measured.
//!
//! [`Rails::pick`]:
//! 1. a down rail whose trial is due (and has no trial in flight) gets the
//!    transfer as its failback trial: its success brings the rail back up,
//!    its failure doubles the backoff (1 s, 2 s, 4 s, then 4 s);
//! 2. else the up rail with the least `(in flight + bytes) / rate` (an
//!    unmeasured rail counts at the best measured rate, so it gets work
//!    and a measurement; with no rate measured it is least in flight;
//!    ties: the first candidate);
//! 3. else (every candidate down, no trial due) the down rail whose trial
//!    is due first: a request never fails only because its rails were
//!    marked down, while one of them may work.
//!
//! `exclude` names rails the transfer already failed on: a redo goes to
//! another rail, and `None` comes back when every candidate was tried.
//!
//! The state is bounded: at most [`MAX_TRACKED`] rails are kept; past that
//! the least recently used rail with nothing in flight is forgotten (its
//! key is returned by [`Rails::take_forgotten`] so that per-rail metrics
//! can drop it too).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Most rails one request may name (its first rail included).
pub const MAX_RAILS: usize = 8;

/// Most rails the selector keeps state for.
pub const MAX_TRACKED: usize = 1024;

/// The wait before the first failback trial of a rail that went down.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// The longest wait between failback trials.
pub const MAX_BACKOFF: Duration = Duration::from_secs(4);

/// Weight of a new sample in the bytes-per-second EWMA.
const EWMA_WEIGHT: f64 = 0.3;

/// Whether a rail carries work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RailState {
    /// Carries work.
    Up,
    /// Failed a transfer at `since`; gets a failback trial at `next_trial`.
    Down {
        /// When it went down.
        since: Instant,
        /// When its next failback trial is due.
        next_trial: Instant,
        /// The wait that set `next_trial` (doubled by a failed trial, up
        /// to [`MAX_BACKOFF`]).
        backoff: Duration,
        /// Whether a trial is in flight (one at a time).
        trial: bool,
    },
}

/// One rail's state.
#[derive(Debug, Clone)]
struct Rail {
    state: RailState,
    in_flight: u64,
    /// EWMA of measured bytes per second (`None`: nothing measured yet).
    rate: Option<f64>,
    last_used: Instant,
}

/// A transfer handed to a rail by [`Rails::pick`]; give it back to
/// [`Rails::succeeded`], [`Rails::failed`] or [`Rails::released`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket<K> {
    /// The rail.
    pub rail: K,
    /// Its index among the candidates of the pick.
    pub index: usize,
    /// The bytes the transfer moves.
    pub bytes: u64,
    /// When it was picked.
    pub started: Instant,
    /// Whether it is the rail's failback trial.
    pub trial: bool,
}

/// How a report changed a rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// No change of state.
    None,
    /// The rail went down.
    WentDown,
    /// The rail came back up.
    CameUp,
}

/// The rail selector: state per rail, keyed by `K` (the endpoint a token
/// names).
#[derive(Debug, Clone)]
pub struct Rails<K> {
    rails: HashMap<K, Rail>,
    forgotten: Vec<K>,
    cap: usize,
}

impl<K: Clone + Eq + Hash> Default for Rails<K> {
    fn default() -> Self {
        Rails::new()
    }
}

impl<K: Clone + Eq + Hash> Rails<K> {
    /// A selector keeping at most [`MAX_TRACKED`] rails.
    #[must_use]
    pub fn new() -> Rails<K> {
        Rails::with_cap(MAX_TRACKED)
    }

    /// A selector keeping at most `cap` rails (at least 1).
    #[must_use]
    pub fn with_cap(cap: usize) -> Rails<K> {
        Rails {
            rails: HashMap::new(),
            forgotten: Vec::new(),
            cap: cap.max(1),
        }
    }

    /// The state of `rail` (`Up` for a rail never seen).
    #[must_use]
    pub fn state(&self, rail: &K) -> RailState {
        self.rails.get(rail).map_or(RailState::Up, |r| r.state)
    }

    /// Bytes in flight on `rail`.
    #[must_use]
    pub fn in_flight(&self, rail: &K) -> u64 {
        self.rails.get(rail).map_or(0, |r| r.in_flight)
    }

    /// The measured bytes per second of `rail`, if any.
    #[must_use]
    pub fn rate(&self, rail: &K) -> Option<f64> {
        self.rails.get(rail).and_then(|r| r.rate)
    }

    /// Whether `rail` is up (never seen: up).
    #[must_use]
    pub fn is_up(&self, rail: &K) -> bool {
        self.state(rail) == RailState::Up
    }

    /// Keys forgotten to keep the state bounded since the last call.
    pub fn take_forgotten(&mut self) -> Vec<K> {
        std::mem::take(&mut self.forgotten)
    }

    /// Chooses a rail of `candidates` (none of `exclude`) for a transfer
    /// of `bytes` at `now` (see the module's rules); `None` when every
    /// candidate is excluded.
    pub fn pick(
        &mut self,
        candidates: &[K],
        exclude: &[K],
        bytes: u64,
        now: Instant,
    ) -> Option<Ticket<K>> {
        for c in candidates {
            self.track(c, now);
        }
        let open: Vec<(usize, &K)> = candidates
            .iter()
            .enumerate()
            .filter(|(i, k)| !exclude.contains(k) && !candidates[..*i].contains(k))
            .collect();
        // 1. A due failback trial.
        let trial = open.iter().find(|(_, k)| {
            matches!(
                self.rails.get(*k).map(|r| r.state),
                Some(RailState::Down { next_trial, trial: false, .. }) if next_trial <= now
            )
        });
        let (index, trial) = if let Some(&(i, _)) = trial {
            (i, true)
        } else {
            let best_rate = open
                .iter()
                .filter_map(|(_, k)| self.rails.get(*k).and_then(|r| r.rate))
                .fold(None::<f64>, |m, r| Some(m.map_or(r, |m| m.max(r))));
            // 2. The least loaded up rail.
            let up = open
                .iter()
                .filter_map(|&(i, k)| {
                    let r = self.rails.get(k)?;
                    (r.state == RailState::Up).then(|| {
                        let load = (r.in_flight.saturating_add(bytes)) as f64;
                        let rate = r.rate.or(best_rate).unwrap_or(1.0).max(1.0);
                        (i, load / rate)
                    })
                })
                .fold(None::<(usize, f64)>, |best, (i, s)| match best {
                    Some((_, b)) if b <= s => best,
                    _ => Some((i, s)),
                });
            match up {
                Some((i, _)) => (i, false),
                None => {
                    // 3. Every open rail is down: the one due first.
                    let (i, _) = open.iter().min_by_key(|(_, k)| match self.state(k) {
                        RailState::Down { next_trial, .. } => next_trial,
                        RailState::Up => now,
                    })?;
                    (*i, false)
                }
            }
        };
        let key = candidates[index].clone();
        let r = self.rails.get_mut(&key)?;
        r.in_flight = r.in_flight.saturating_add(bytes);
        r.last_used = now;
        if trial && let RailState::Down { trial: t, .. } = &mut r.state {
            *t = true;
        }
        Some(Ticket {
            rail: key,
            index,
            bytes,
            started: now,
            trial,
        })
    }

    /// The transfer of `t` completed at `now`: its rate is measured, and a
    /// down rail comes back up when this was its trial or it started after
    /// the rail went down.
    pub fn succeeded(&mut self, t: &Ticket<K>, now: Instant) -> Change {
        let Some(r) = self.rails.get_mut(&t.rail) else {
            return Change::None;
        };
        r.in_flight = r.in_flight.saturating_sub(t.bytes);
        r.last_used = now;
        let secs = now.saturating_duration_since(t.started).as_secs_f64();
        if t.bytes > 0 && secs > 0.0 {
            let sample = t.bytes as f64 / secs;
            r.rate = Some(match r.rate {
                Some(old) => old + EWMA_WEIGHT * (sample - old),
                None => sample,
            });
        }
        match r.state {
            RailState::Down { since, .. } if t.trial || t.started > since => {
                r.state = RailState::Up;
                Change::CameUp
            }
            _ => Change::None,
        }
    }

    /// The rail of `t` failed its transfer at `now`: it goes down (first
    /// trial after [`FIRST_BACKOFF`]); a failed trial doubles the backoff
    /// (up to [`MAX_BACKOFF`]); another failure of a rail already down
    /// (work started before it went down) changes nothing.
    pub fn failed(&mut self, t: &Ticket<K>, now: Instant) -> Change {
        let Some(r) = self.rails.get_mut(&t.rail) else {
            return Change::None;
        };
        r.in_flight = r.in_flight.saturating_sub(t.bytes);
        r.last_used = now;
        match r.state {
            RailState::Up => {
                r.state = RailState::Down {
                    since: now,
                    next_trial: now + FIRST_BACKOFF,
                    backoff: FIRST_BACKOFF,
                    trial: false,
                };
                Change::WentDown
            }
            RailState::Down { since, backoff, .. } if t.trial => {
                let backoff = (backoff * 2).min(MAX_BACKOFF);
                r.state = RailState::Down {
                    since,
                    next_trial: now + backoff,
                    backoff,
                    trial: false,
                };
                Change::None
            }
            RailState::Down { .. } => Change::None,
        }
    }

    /// The transfer of `t` ended for a reason that says nothing about its
    /// rail (an S3 error, a cancelled request): its bytes leave the rail
    /// and a trial may be made again.
    pub fn released(&mut self, t: &Ticket<K>, now: Instant) {
        let Some(r) = self.rails.get_mut(&t.rail) else {
            return;
        };
        r.in_flight = r.in_flight.saturating_sub(t.bytes);
        r.last_used = now;
        if t.trial
            && let RailState::Down { trial, .. } = &mut r.state
        {
            *trial = false;
        }
    }

    /// Starts tracking `rail` (up), forgetting the least recently used
    /// idle rail when full.
    fn track(&mut self, rail: &K, now: Instant) {
        if self.rails.contains_key(rail) {
            return;
        }
        if self.rails.len() >= self.cap {
            let idle = self
                .rails
                .iter()
                .filter(|(_, r)| r.in_flight == 0)
                .min_by_key(|(_, r)| r.last_used)
                .map(|(k, _)| k.clone());
            if let Some(k) = idle {
                self.rails.remove(&k);
                self.forgotten.push(k);
            }
        }
        self.rails.insert(
            rail.clone(),
            Rail {
                state: RailState::Up,
                in_flight: 0,
                rate: None,
                last_used: now,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "10.0.1.1:7000";
    const B: &str = "10.0.2.1:7000";
    const C: &str = "10.0.3.1:7000";

    fn ms(t0: Instant, n: u64) -> Instant {
        t0 + Duration::from_millis(n)
    }

    #[test]
    fn least_in_flight_without_rates_first_candidate_on_ties() {
        let mut r = Rails::new();
        let t0 = Instant::now();
        let cands = [A, B];
        let a = r.pick(&cands, &[], 100, t0).unwrap();
        assert_eq!((a.rail, a.index, a.trial), (A, 0, false));
        let b = r.pick(&cands, &[], 100, t0).unwrap();
        assert_eq!(b.rail, B);
        let c = r.pick(&cands, &[], 100, t0).unwrap();
        assert_eq!(c.rail, A);
        assert_eq!(r.in_flight(&A), 200);
        r.released(&a, t0);
        r.released(&c, t0);
        assert_eq!(r.in_flight(&A), 0);
        assert_eq!(r.pick(&cands, &[], 100, t0).unwrap().rail, A);
    }

    #[test]
    fn rates_weight_the_choice() {
        let mut r = Rails::new();
        let t0 = Instant::now();
        let cands = [A, B];
        // A measures 1000 B/s, B 4000 B/s.
        let a = r.pick(&cands, &[], 1000, t0).unwrap();
        let b = r.pick(&cands, &[], 1000, t0).unwrap();
        assert_eq!((a.rail, b.rail), (A, B));
        r.succeeded(&a, ms(t0, 1000));
        r.succeeded(&b, ms(t0, 250));
        assert_eq!(r.rate(&A), Some(1000.0));
        assert_eq!(r.rate(&B), Some(4000.0));
        // B takes work until its load over rate reaches A's (a tie goes
        // to the first candidate).
        let now = ms(t0, 2000);
        let picks: Vec<&str> = (0..5)
            .map(|_| r.pick(&cands, &[], 1000, now).unwrap().rail)
            .collect();
        assert_eq!(picks, [B, B, B, A, B]);
        // EWMA: a slower sample moves the rate part of the way.
        let t = r.pick(&[A], &[], 1000, now).unwrap();
        r.succeeded(&t, ms(t0, 4000));
        assert_eq!(r.rate(&A), Some(1000.0 + 0.3 * (500.0 - 1000.0)));
    }

    #[test]
    fn an_unmeasured_rail_counts_at_the_best_rate() {
        let mut r = Rails::new();
        let t0 = Instant::now();
        let a = r.pick(&[A], &[], 1000, t0).unwrap();
        r.succeeded(&a, ms(t0, 1));
        // C is new: it gets the next transfer (nothing in flight on it,
        // nothing on A either, A first on ties: so put work on A).
        let busy = r.pick(&[A], &[], 1000, t0).unwrap();
        assert_eq!(r.pick(&[A, C], &[], 1000, t0).unwrap().rail, C);
        r.released(&busy, t0);
    }

    #[test]
    fn failure_marks_down_and_the_redo_goes_elsewhere() {
        let mut r = Rails::new();
        let t0 = Instant::now();
        let cands = [A, B];
        let a = r.pick(&cands, &[], 10, t0).unwrap();
        let a2 = r.pick(&cands, &[], 10, t0).unwrap();
        assert_eq!(a2.rail, B);
        assert_eq!(r.failed(&a, ms(t0, 5)), Change::WentDown);
        assert!(!r.is_up(&A));
        // The redo excludes A.
        let redo = r.pick(&cands, &[A], 10, ms(t0, 5)).unwrap();
        assert_eq!(redo.rail, B);
        // New work avoids A while it is down and no trial is due.
        assert_eq!(r.pick(&cands, &[], 10, ms(t0, 500)).unwrap().rail, B);
        // Every candidate excluded: none.
        assert_eq!(r.pick(&cands, &[A, B], 10, ms(t0, 5)), None);
        // A second failure of work started before: no change.
        let old = Ticket {
            rail: A,
            index: 0,
            bytes: 0,
            started: t0,
            trial: false,
        };
        assert_eq!(r.failed(&old, ms(t0, 6)), Change::None);
        // Work started before the failure succeeding does not bring A up.
        assert_eq!(r.succeeded(&old, ms(t0, 7)), Change::None);
        assert!(!r.is_up(&A));
    }

    #[test]
    fn failback_trials_one_at_a_time_with_doubling_backoff() {
        let mut r = Rails::new();
        let t0 = Instant::now();
        let cands = [A, B];
        let a = r.pick(&cands, &[], 10, t0).unwrap();
        r.failed(&a, t0);
        // Not due before 1 s.
        assert_eq!(r.pick(&cands, &[], 10, ms(t0, 999)).unwrap().rail, B);
        // Due at 1 s: one trial, then the others go to B.
        let trial = r.pick(&cands, &[], 10, ms(t0, 1000)).unwrap();
        assert_eq!((trial.rail, trial.trial), (A, true));
        assert_eq!(r.pick(&cands, &[], 10, ms(t0, 1001)).unwrap().rail, B);
        // The trial fails: next one 2 s later, then 4 s, then 4 s.
        r.failed(&trial, ms(t0, 1100));
        let mut at = 1100;
        for wait in [2000, 4000, 4000] {
            assert_eq!(
                r.pick(&cands, &[], 10, ms(t0, at + wait - 1)).unwrap().rail,
                B
            );
            let t = r.pick(&cands, &[], 10, ms(t0, at + wait)).unwrap();
            assert!(t.trial, "{wait}");
            at += wait;
            r.failed(&t, ms(t0, at));
        }
        // A released trial (no verdict) allows another trial.
        let t = r.pick(&cands, &[], 10, ms(t0, at + 4000)).unwrap();
        assert!(t.trial);
        r.released(&t, ms(t0, at + 4000));
        let t = r.pick(&cands, &[], 10, ms(t0, at + 4000)).unwrap();
        assert!(t.trial);
        // A successful trial brings A back up with the first backoff next time.
        assert_eq!(r.succeeded(&t, ms(t0, at + 4100)), Change::CameUp);
        assert!(r.is_up(&A));
        let again = r.pick(&[A], &[], 10, ms(t0, at + 5000)).unwrap();
        r.failed(&again, ms(t0, at + 5000));
        assert!(matches!(
            r.state(&A),
            RailState::Down { backoff, .. } if backoff == FIRST_BACKOFF
        ));
    }

    #[test]
    fn every_rail_down_still_picks_the_one_due_first() {
        let mut r = Rails::new();
        let t0 = Instant::now();
        let cands = [A, B];
        let a = r.pick(&cands, &[], 1, t0).unwrap();
        let b = r.pick(&cands, &[], 1, t0).unwrap();
        r.failed(&b, t0);
        r.failed(&a, ms(t0, 10));
        let t = r.pick(&cands, &[], 1, ms(t0, 20)).unwrap();
        assert_eq!((t.rail, t.trial), (B, false));
        // The one rail a request has is always picked.
        assert_eq!(r.pick(&[A], &[], 1, ms(t0, 20)).unwrap().rail, A);
    }

    #[test]
    fn a_candidate_named_twice_counts_once() {
        let mut r = Rails::new();
        let t0 = Instant::now();
        let t = r.pick(&[A, A], &[A], 1, t0);
        assert_eq!(t, None);
        let t = r.pick(&[A, A, B], &[], 1, t0).unwrap();
        assert_eq!(t.index, 0);
    }

    #[test]
    fn state_is_bounded() {
        let mut r = Rails::with_cap(2);
        let t0 = Instant::now();
        let a = r.pick(&[A], &[], 1, t0).unwrap();
        let b = r.pick(&[B], &[], 1, ms(t0, 1)).unwrap();
        r.released(&b, ms(t0, 2));
        // C replaces B (idle), not A (work in flight).
        r.pick(&[C], &[], 1, ms(t0, 3)).unwrap();
        assert_eq!(r.take_forgotten(), vec![B]);
        assert_eq!(r.in_flight(&A), 1);
        r.released(&a, ms(t0, 4));
        assert!(r.take_forgotten().is_empty());
    }
}
