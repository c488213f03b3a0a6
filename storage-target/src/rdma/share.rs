//! Fair sharing of the staging pool.
//!
//! The staging pool is small (it is registered memory) and shared by every
//! RDMA request. Without a bound, one client whose transfers are slow (or
//! stalled on purpose: its endpoint simply does not complete operations)
//! could hold every buffer, and every other client's RDMA request would
//! wait behind it. So a buffer is taken only within two caps, each
//! `rdma.max_staging_share` of the pool (rounded down, at least one buffer):
//!
//! * per client session: one fabric session per client endpoint
//!   ([`fabric::EndpointAddr`]), whatever S3 users sign its requests;
//! * per S3 user (access key id), whatever endpoints its requests name.
//!
//! A request waits for its user's share first, then its session's, then
//! the pool; it never holds a share permit while waiting for something an
//! operation in flight needs, so the caps add no deadlock (see
//! [`super::transfer`]).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, Weak};

use fabric::EndpointAddr;
use fabric::pool::{StagingBuf, StagingPool};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Metrics;

/// The caps: one semaphore of `cap` permits per session and per user,
/// alive while a request uses it.
#[derive(Debug)]
pub struct Shares {
    cap: usize,
    sessions: Mutex<HashMap<EndpointAddr, Weak<Semaphore>>>,
    users: Mutex<HashMap<String, Weak<Semaphore>>>,
}

/// Number of buffers one session or one user may hold: `share` of `count`,
/// rounded down; `None` when that is no buffer at all.
#[must_use]
pub fn cap(count: usize, share: f64) -> Option<usize> {
    let n = (count as f64 * share).floor() as usize;
    (n >= 1).then_some(n.min(count))
}

fn entry<K: Eq + Hash>(
    map: &Mutex<HashMap<K, Weak<Semaphore>>>,
    key: K,
    cap: usize,
) -> Arc<Semaphore> {
    let mut m = map
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(s) = m.get(&key).and_then(Weak::upgrade) {
        return s;
    }
    // Forget the entries of clients no request uses any more.
    if m.len() >= 64 {
        m.retain(|_, w| w.strong_count() > 0);
    }
    let s = Arc::new(Semaphore::new(cap));
    m.insert(key, Arc::downgrade(&s));
    s
}

impl Shares {
    /// Caps of `cap` buffers each.
    #[must_use]
    pub fn new(cap: usize) -> Shares {
        Shares {
            cap,
            sessions: Mutex::default(),
            users: Mutex::default(),
        }
    }

    /// Buffers one session or one user may hold.
    #[must_use]
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The shares of a request from `user` to `endpoint`.
    #[must_use]
    pub fn for_request(&self, endpoint: EndpointAddr, user: &str) -> RequestShares {
        RequestShares {
            user: entry(&self.users, user.to_owned(), self.cap),
            session: entry(&self.sessions, endpoint, self.cap),
        }
    }
}

/// The two caps that apply to one request.
#[derive(Debug, Clone)]
pub struct RequestShares {
    user: Arc<Semaphore>,
    session: Arc<Semaphore>,
}

/// A staging buffer taken within the request's shares; dropping it gives
/// the buffer and both share permits back.
#[derive(Debug)]
pub struct SharedBuf {
    /// The buffer.
    pub buf: StagingBuf,
    _user: OwnedSemaphorePermit,
    _session: OwnedSemaphorePermit,
}

async fn take(sem: &Arc<Semaphore>, metrics: &Metrics, limit: &str) -> OwnedSemaphorePermit {
    if let Ok(p) = Arc::clone(sem).try_acquire_owned() {
        return p;
    }
    metrics.staging_share_wait(limit);
    Arc::clone(sem)
        .acquire_owned()
        .await
        .expect("share semaphores are never closed")
}

impl RequestShares {
    /// Waits for the user's share, the session's share, then a buffer.
    pub async fn acquire(&self, pool: &Arc<StagingPool>, metrics: &Metrics) -> SharedBuf {
        let user = take(&self.user, metrics, "user").await;
        let session = take(&self.session, metrics, "session").await;
        SharedBuf {
            buf: pool.acquire().await,
            _user: user,
            _session: session,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps() {
        assert_eq!(cap(32, 0.5), Some(16));
        assert_eq!(cap(2, 0.5), Some(1));
        assert_eq!(cap(1, 0.5), None);
        assert_eq!(cap(1, 1.0), Some(1));
        assert_eq!(cap(5, 0.5), Some(2));
        assert_eq!(cap(4, 0.1), None);
    }

    #[test]
    fn entries_are_shared_while_used_and_forgotten_after() {
        let s = Shares::new(2);
        let ep = EndpointAddr {
            addr: "127.0.0.1:1".parse().unwrap(),
            responder: 1,
        };
        let a = s.for_request(ep, "alice");
        let b = s.for_request(ep, "bob");
        assert!(Arc::ptr_eq(&a.session, &b.session));
        assert!(!Arc::ptr_eq(&a.user, &b.user));
        let p = Arc::clone(&a.session).try_acquire_many_owned(2).unwrap();
        assert!(Arc::clone(&b.session).try_acquire_owned().is_err());
        drop(p);
        drop((a, b));
        assert!(s.for_request(ep, "alice").session.available_permits() == 2);
    }
}
