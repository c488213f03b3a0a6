//! Fair sharing of the staging pool.
//!
//! The staging pool is small (it is registered memory) and shared by every
//! RDMA request. Without a bound, one client whose transfers are slow (or
//! stalled on purpose: its endpoint simply does not complete operations)
//! could hold every buffer, and every other client's RDMA request would
//! wait behind it. So a buffer is taken only within these caps, each a
//! share of the pool (rounded down, at least one buffer):
//!
//! * per S3 user (access key id), whatever endpoints its requests name:
//!   `rdma.max_staging_share`;
//! * per shared class: every user not listed in `rdma.tenant_users` (the
//!   users that serve tenants, i.e. the dpu-agents'), and anonymous
//!   callers, together: `rdma.max_shared_staging_share`. So any number of
//!   such users, each within its own cap, cannot take the buffers the
//!   tenants' requests need;
//! * per client endpoint ([`fabric::EndpointAddr`]; the key the metric
//!   label calls `session`), whatever S3 users sign its requests (each user
//!   has its own fabric session to it): `rdma.max_staging_share`.
//!
//! A request waits for its user's share first, then its endpoint's, then
//! its class's (shared class only: a request waiting for a stalled
//! endpoint's share holds none of the class's), then the pool; it never
//! holds a share permit while waiting for something an operation in flight
//! needs, so the caps add no deadlock (see [`super::transfer`]).

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex, Weak};

use fabric::EndpointAddr;
use fabric::pool::{StagingBuf, StagingPool};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Metrics;

/// The caps: one semaphore of `cap` permits per endpoint and per user,
/// alive while a request uses it, and one of `shared_cap` permits for the
/// shared class.
#[derive(Debug)]
pub struct Shares {
    cap: usize,
    sessions: Mutex<HashMap<EndpointAddr, Weak<Semaphore>>>,
    users: Mutex<HashMap<String, Weak<Semaphore>>>,
    tenants: HashSet<String>,
    shared: Arc<Semaphore>,
}

pub use crate::config::rdma::cap;

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
    /// Caps of `cap` buffers per user and per endpoint, and `shared_cap`
    /// for all users but `tenants` together.
    #[must_use]
    pub fn new(cap: usize, shared_cap: usize, tenants: impl IntoIterator<Item = String>) -> Shares {
        Shares {
            cap,
            sessions: Mutex::default(),
            users: Mutex::default(),
            tenants: tenants.into_iter().collect(),
            shared: Arc::new(Semaphore::new(shared_cap)),
        }
    }

    /// Buffers one session or one user may hold.
    #[must_use]
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Whether `user` (an access key id; empty for anonymous) is in the
    /// shared class.
    #[must_use]
    pub fn is_shared_class(&self, user: &str) -> bool {
        !self.tenants.contains(user)
    }

    /// The shares of a request from `user` to `endpoint`.
    #[must_use]
    pub fn for_request(&self, endpoint: EndpointAddr, user: &str) -> RequestShares {
        RequestShares {
            user: entry(&self.users, user.to_owned(), self.cap),
            class: self.is_shared_class(user).then(|| Arc::clone(&self.shared)),
            session: entry(&self.sessions, endpoint, self.cap),
        }
    }
}

/// The caps that apply to one request.
#[derive(Debug, Clone)]
pub struct RequestShares {
    user: Arc<Semaphore>,
    /// The shared class's cap; `None` for a tenant user.
    class: Option<Arc<Semaphore>>,
    session: Arc<Semaphore>,
}

/// A staging buffer taken within the request's shares; dropping it gives
/// the buffer and every share permit back.
#[derive(Debug)]
pub struct SharedBuf {
    /// The buffer.
    pub buf: StagingBuf,
    _user: OwnedSemaphorePermit,
    _class: Option<OwnedSemaphorePermit>,
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
    /// Waits for the user's share, the endpoint's, the shared class's (if
    /// the user is in it), then a buffer.
    pub async fn acquire(&self, pool: &Arc<StagingPool>, metrics: &Metrics) -> SharedBuf {
        let user = take(&self.user, metrics, "user").await;
        let session = take(&self.session, metrics, "session").await;
        let class = match &self.class {
            Some(c) => Some(take(c, metrics, "shared").await),
            None => None,
        };
        SharedBuf {
            buf: pool.acquire().await,
            _user: user,
            _class: class,
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
        let s = Shares::new(2, 2, []);
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

    #[test]
    fn users_not_listed_as_tenants_share_one_class_cap() {
        let s = Shares::new(2, 3, ["agent".to_owned()]);
        let ep = EndpointAddr {
            addr: "127.0.0.1:1".parse().unwrap(),
            responder: 1,
        };
        assert!(!s.is_shared_class("agent"));
        assert!(s.is_shared_class("bob") && s.is_shared_class(""));
        let agent = s.for_request(ep, "agent");
        let bob = s.for_request(ep, "bob");
        let anon = s.for_request(ep, "");
        assert!(agent.class.is_none());
        let (b, a) = (bob.class.unwrap(), anon.class.unwrap());
        assert!(Arc::ptr_eq(&b, &a));
        assert_eq!(b.available_permits(), 3);
    }
}
