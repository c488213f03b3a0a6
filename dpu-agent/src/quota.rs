//! Per-tenant quotas: concurrent requests (with a bounded queue, then
//! SlowDown), bytes in flight, bytes per second, and the tenant's share of
//! the agent's staging pool (fallback path; [`staging_share`]).
//!
//! The token bucket is pure ([`TokenBucket::take`] answers how long to wait
//! at a given instant) so it is tested without sleeping.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Quotas;

/// Bytes-in-flight accounting unit: permits are KiB so a u32 permit count
/// covers chunks up to 4 TiB.
const UNIT: u64 = 1024;

/// One tenant's limits and their live state.
#[derive(Debug)]
pub struct TenantQuota {
    concurrent: Arc<Semaphore>,
    max_concurrent: usize,
    max_queued: usize,
    queued: AtomicUsize,
    bytes: Arc<Semaphore>,
    bytes_units: u32,
    rate: Option<Mutex<TokenBucket>>,
    staging: Arc<Semaphore>,
    staging_cap: usize,
}

/// How many staging buffers one tenant may hold at once: `percent` of the
/// pool's `pool_buffers` (rounded down, at least 1), and no more than its
/// `max_bytes_in_flight` in buffers of `buffer_size` (rounded up) — so a
/// byte quota larger than the pool never lets one tenant hold all of it.
#[must_use]
pub fn staging_share(
    pool_buffers: usize,
    buffer_size: u64,
    percent: u32,
    max_bytes_in_flight: u64,
) -> usize {
    let by_share = (pool_buffers as u128 * u128::from(percent.min(100)) / 100) as usize;
    let by_bytes =
        usize::try_from(max_bytes_in_flight.div_ceil(buffer_size.max(1))).unwrap_or(usize::MAX);
    by_share.min(by_bytes).clamp(1, pool_buffers.max(1))
}

/// A staging buffer's place in the tenant's share of the pool (released on
/// drop).
#[derive(Debug)]
pub struct StagingPermit {
    _permit: OwnedSemaphorePermit,
}

/// A request counted against the tenant's concurrency (released on drop).
#[derive(Debug)]
pub struct RequestPermit {
    _permit: OwnedSemaphorePermit,
}

/// Bytes counted against the tenant's in-flight budget (released on drop).
#[derive(Debug)]
pub struct BytesPermit {
    _permit: OwnedSemaphorePermit,
}

/// Too many requests are queued.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "{running} requests are running and {queued} are queued, the tenant's limit (quotas.max_concurrent_requests / max_queued_requests); slow down and retry"
)]
pub struct QueueFull {
    /// Requests running.
    pub running: usize,
    /// Requests waiting.
    pub queued: usize,
}

struct QueueSlot<'a>(&'a AtomicUsize);

impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl TenantQuota {
    /// Live state for `q`, holding at most `staging_cap` staging buffers at
    /// once (see [`staging_share`]).
    #[must_use]
    pub fn new(q: &Quotas, staging_cap: usize) -> TenantQuota {
        let staging_cap = staging_cap.clamp(1, Semaphore::MAX_PERMITS);
        let units = u32::try_from(q.max_bytes_in_flight.0.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .clamp(1, Semaphore::MAX_PERMITS as u32);
        TenantQuota {
            concurrent: Arc::new(Semaphore::new(q.max_concurrent_requests.max(1))),
            max_concurrent: q.max_concurrent_requests.max(1),
            max_queued: q.max_queued_requests,
            queued: AtomicUsize::new(0),
            bytes: Arc::new(Semaphore::new(units as usize)),
            bytes_units: units,
            rate: q
                .max_bytes_per_second
                .map(|r| Mutex::new(TokenBucket::new(r.0.max(1), Instant::now()))),
            staging: Arc::new(Semaphore::new(staging_cap)),
            staging_cap,
        }
    }

    /// Staging buffers the tenant may hold at once.
    #[must_use]
    pub fn staging_cap(&self) -> usize {
        self.staging_cap
    }

    /// Waits for a place in the tenant's share of the staging pool (taken
    /// before a buffer of the pool itself).
    pub async fn reserve_staging(&self) -> StagingPermit {
        // The semaphore is never closed.
        match Arc::clone(&self.staging).acquire_owned().await {
            Ok(p) => StagingPermit { _permit: p },
            Err(_) => unreachable_closed(),
        }
    }

    /// Requests waiting for a slot.
    #[must_use]
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Admits a request: runs at once when a slot is free, waits in the
    /// queue when the queue has room, and fails with [`QueueFull`] otherwise.
    /// Dropping the future leaves the queue.
    ///
    /// # Errors
    /// [`QueueFull`].
    pub async fn admit(&self) -> Result<RequestPermit, QueueFull> {
        if let Ok(p) = Arc::clone(&self.concurrent).try_acquire_owned() {
            return Ok(RequestPermit { _permit: p });
        }
        let before = self.queued.fetch_add(1, Ordering::AcqRel);
        let slot = QueueSlot(&self.queued);
        if before >= self.max_queued {
            drop(slot);
            return Err(QueueFull {
                running: self.running(),
                queued: before,
            });
        }
        let permit = Arc::clone(&self.concurrent)
            .acquire_owned()
            .await
            .map_err(|_| QueueFull {
                running: self.running(),
                queued: before,
            })?;
        drop(slot);
        Ok(RequestPermit { _permit: permit })
    }

    fn running(&self) -> usize {
        self.max_concurrent
            .saturating_sub(self.concurrent.available_permits())
    }

    /// Waits until `len` bytes fit in the tenant's in-flight budget (a
    /// chunk larger than the whole budget takes all of it).
    pub async fn reserve_bytes(&self, len: u64) -> BytesPermit {
        let units = u32::try_from(len.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .clamp(1, self.bytes_units);
        // The semaphore is never closed.
        match Arc::clone(&self.bytes).acquire_many_owned(units).await {
            Ok(p) => BytesPermit { _permit: p },
            Err(_) => unreachable_closed(),
        }
    }

    /// What a chunk or part of `len` bytes waits for before it moves: its
    /// place in the bytes in flight ([`TenantQuota::reserve_bytes`], held
    /// while the permit lives), then the bandwidth limit
    /// ([`TenantQuota::throttle`]).
    pub async fn admit_bytes(&self, len: u64) -> BytesPermit {
        let permit = self.reserve_bytes(len).await;
        self.throttle(len).await;
        permit
    }

    /// Waits as long as the bandwidth limit asks before moving `len` bytes.
    pub async fn throttle(&self, len: u64) {
        let Some(rate) = &self.rate else {
            return;
        };
        let wait = rate
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take(Instant::now(), len);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

fn unreachable_closed() -> ! {
    panic!("the tenant semaphores are never closed")
}

/// A token bucket that may go into debt: a request for more bytes than are
/// available is granted at once, and the caller waits for the debt to be
/// paid back at `rate` bytes/s. The burst is one second of traffic.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: u64,
    /// Available bytes (negative = debt).
    level: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    #[must_use]
    pub fn new(rate: u64, now: Instant) -> TokenBucket {
        TokenBucket {
            rate: rate.max(1),
            level: rate.max(1) as f64,
            last: now,
        }
    }

    /// Takes `len` bytes at `now`; returns how long the caller must wait
    /// before sending them.
    pub fn take(&mut self, now: Instant, len: u64) -> Duration {
        let rate = self.rate as f64;
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.level = (self.level + elapsed * rate).min(rate);
        self.level -= len as f64;
        if self.level >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.level / rate)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ByteSize;

    fn quotas(concurrent: usize, queued: usize) -> Quotas {
        Quotas {
            max_concurrent_requests: concurrent,
            max_queued_requests: queued,
            max_bytes_in_flight: ByteSize(1 << 20),
            max_bytes_per_second: None,
        }
    }

    #[tokio::test]
    async fn queue_then_slow_down() {
        let q = TenantQuota::new(&quotas(1, 1), 4);
        let first = q.admit().await.unwrap();
        let q = Arc::new(q);
        let waiter = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.admit().await.map(|_| ()) }
        });
        while q.queued() == 0 {
            tokio::task::yield_now().await;
        }
        let err = q.admit().await.unwrap_err();
        assert_eq!(err.queued, 1);
        assert!(err.to_string().contains("slow down"));
        drop(first);
        waiter.await.unwrap().unwrap();
        assert_eq!(q.queued(), 0);
    }

    #[tokio::test]
    async fn cancelled_waiter_leaves_the_queue() {
        let q = TenantQuota::new(&quotas(1, 4), 4);
        let _p = q.admit().await.unwrap();
        let fut = q.admit();
        let r = tokio::time::timeout(Duration::from_millis(20), fut).await;
        assert!(r.is_err());
        assert_eq!(q.queued(), 0);
    }

    #[tokio::test]
    async fn bytes_budget_blocks_and_clamps() {
        let q = TenantQuota::new(&quotas(4, 4), 4);
        let a = q.reserve_bytes(768 << 10).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(20), q.reserve_bytes(512 << 10))
                .await
                .is_err()
        );
        drop(a);
        // Larger than the budget: takes all of it instead of waiting forever.
        let _all = q.reserve_bytes(10 << 20).await;
    }

    #[test]
    fn staging_share_table() {
        const M: u64 = 1 << 20;
        // 50% of 16 buffers.
        assert_eq!(staging_share(16, M, 50, 1 << 30), 8);
        // A byte quota smaller than the share: 3 MiB in 1 MiB buffers.
        assert_eq!(staging_share(16, M, 50, 3 * M), 3);
        assert_eq!(staging_share(16, M, 50, 3 * M + 1), 4);
        // Never nothing, never more than the pool.
        assert_eq!(staging_share(1, M, 50, 1 << 30), 1);
        assert_eq!(staging_share(16, M, 1, 1 << 30), 1);
        assert_eq!(staging_share(16, M, 100, 1 << 40), 16);
        assert_eq!(staging_share(16, M, 500, 1 << 40), 16);
    }

    #[tokio::test]
    async fn staging_share_blocks_beyond_the_cap() {
        let q = TenantQuota::new(&quotas(4, 4), 2);
        let a = q.reserve_staging().await;
        let _b = q.reserve_staging().await;
        assert!(
            tokio::time::timeout(Duration::from_millis(20), q.reserve_staging())
                .await
                .is_err()
        );
        drop(a);
        let _c = q.reserve_staging().await;
    }

    #[test]
    fn token_bucket_table() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1000, t0);
        assert_eq!(b.take(t0, 1000), Duration::ZERO); // burst
        assert_eq!(b.take(t0, 500), Duration::from_millis(500)); // debt
        // 1.5 s later: debt paid, 1000 back, capped at the burst.
        let t = t0 + Duration::from_millis(2000);
        assert_eq!(b.take(t, 1000), Duration::ZERO);
        assert_eq!(b.take(t, 2000), Duration::from_secs(2));
        // Time going backwards adds nothing.
        assert_eq!(b.take(t0, 0), Duration::from_secs(2));
    }
}
