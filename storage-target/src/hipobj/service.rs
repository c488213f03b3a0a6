//! The hipobj-rc-v2 server's state: sessions, caps, the recent-pairs
//! rings, the reaper (built with the `verbs` feature).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use fabric::Domain;
use s3dma_wire::hipobj::SessionId;

use crate::config::hipobj::HipobjConfig;
use crate::config::networks::{self, Cidr};
use crate::metrics::Metrics;

use super::front::HipobjFront;
use super::session::Session;

/// Server pairs (QP number, PSN) remembered against reuse.
const RECENT_PAIRS: usize = 4096;

/// The hipobj-rc-v2 server: its verbs domain (none: the dialect is answered
/// as unsupported), the S3 handler it reads and writes objects with, its
/// sessions and caps.
#[derive(Debug)]
pub struct HipobjService {
    pub(super) domain: Option<Domain>,
    /// Why the dialect is not served (when `domain` is `None`), for the log.
    pub(super) unsupported: &'static str,
    pub(super) s3: Arc<dyn HipobjFront>,
    pub(super) cfg: HipobjConfig,
    /// `rdma.allowed_client_networks`: the GIDs (as IP addresses) a
    /// client's QP may have.
    pub(super) allowed: Vec<Cidr>,
    pub(super) metrics: Arc<Metrics>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    sessions: HashMap<SessionId, Arc<Session>>,
    /// Sessions admitted (being prepared, prepared or running).
    admitted: usize,
    /// Per user: sessions held and staging bytes held.
    users: HashMap<String, (usize, u64)>,
    staging_bytes: u64,
    /// The server's recent (qpn, psn) pairs.
    recent_pairs: Recent<(u32, u32)>,
    /// Clients' (gid, qpn, psn) of sessions prepared recently.
    recent_clients: Recent<([u8; 16], u32, u32)>,
}

/// The last [`RECENT_PAIRS`] values seen, to refuse a repeat.
#[derive(Debug)]
struct Recent<T> {
    order: VecDeque<T>,
    set: HashSet<T>,
}

impl<T> Default for Recent<T> {
    fn default() -> Self {
        Recent {
            order: VecDeque::new(),
            set: HashSet::new(),
        }
    }
}

impl<T: Copy + Eq + std::hash::Hash> Recent<T> {
    /// Whether `v` is new (and remembers it, forgetting the oldest).
    pub(super) fn insert(&mut self, v: T) -> bool {
        if !self.set.insert(v) {
            return false;
        }
        self.order.push_back(v);
        if self.order.len() > RECENT_PAIRS
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        true
    }
}

/// Why a session could not be admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    Sessions,
    UserSessions,
    Staging,
    UserStaging,
}

impl HipobjService {
    /// The server over `s3` on `domain` (a verbs domain with a device;
    /// `None` answers every control request as unsupported).
    #[must_use]
    pub fn new(
        domain: Option<Domain>,
        unsupported: &'static str,
        s3: Arc<dyn HipobjFront>,
        cfg: HipobjConfig,
        allowed: Vec<Cidr>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new(HipobjService {
            domain,
            unsupported,
            s3,
            cfg,
            allowed,
            metrics,
            state: Mutex::new(State::default()),
        })
    }

    /// Starts the reaper of expired prepared sessions (a tokio task that
    /// ends with the last reference to the service).
    pub fn spawn_reaper(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                let Some(svc) = weak.upgrade() else {
                    return;
                };
                svc.reap(Instant::now());
            }
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn prepared_timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.prepared_timeout_secs)
    }

    pub(super) fn transfer_timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.transfer_timeout_secs)
    }

    /// Takes the caps for a session of `user` staging `bytes`.
    pub(super) fn admit(&self, user: &str, bytes: u64) -> Result<(), Refusal> {
        let mut st = self.lock();
        let (n, held) = st.users.get(user).copied().unwrap_or((0, 0));
        if st.admitted >= self.cfg.max_sessions {
            return Err(Refusal::Sessions);
        }
        if n >= self.cfg.max_sessions_per_user {
            return Err(Refusal::UserSessions);
        }
        if st.staging_bytes + bytes > self.cfg.max_staging_bytes.0 {
            return Err(Refusal::Staging);
        }
        if held + bytes > self.cfg.max_staging_bytes_per_user.0 {
            return Err(Refusal::UserStaging);
        }
        st.users.insert(user.to_owned(), (n + 1, held + bytes));
        st.staging_bytes += bytes;
        st.admitted += 1;
        Ok(())
    }

    /// Gives back what [`HipobjService::admit`] took.
    pub(super) fn release(&self, user: &str, bytes: u64) {
        let mut st = self.lock();
        if let Some((n, held)) = st.users.get_mut(user) {
            *n = n.saturating_sub(1);
            *held = held.saturating_sub(bytes);
            if *n == 0 {
                st.users.remove(user);
            }
        }
        st.staging_bytes = st.staging_bytes.saturating_sub(bytes);
        st.admitted = st.admitted.saturating_sub(1);
        let (sessions, staging) = (st.sessions.len(), st.staging_bytes);
        drop(st);
        self.metrics.hipobj_held(sessions, staging);
    }

    /// Whether a server pair is new (and remembers it).
    pub(super) fn fresh_pair(&self, qpn: u32, psn: u32) -> bool {
        self.lock().recent_pairs.insert((qpn, psn))
    }

    /// Whether a client's (gid, qpn, psn) is new (and remembers it).
    pub(super) fn fresh_client(&self, gid: [u8; 16], qpn: u32, psn: u32) -> bool {
        self.lock().recent_clients.insert((gid, qpn, psn))
    }

    pub(super) fn insert(&self, id: SessionId, s: Arc<Session>) {
        let mut st = self.lock();
        st.sessions.insert(id, s);
        let (sessions, staging) = (st.sessions.len(), st.staging_bytes);
        drop(st);
        self.metrics.hipobj_held(sessions, staging);
    }

    pub(super) fn get(&self, id: &SessionId) -> Option<Arc<Session>> {
        self.lock().sessions.get(id).cloned()
    }

    /// Removes a session and gives back its caps (once).
    pub(super) fn remove(&self, id: &SessionId) -> Option<Arc<Session>> {
        let s = self.lock().sessions.remove(id)?;
        self.release(&s.owner, u64::from(s.size));
        Some(s)
    }

    /// Ends the prepared sessions whose READY did not come in time.
    pub(super) fn reap(&self, now: Instant) {
        let expired: Vec<SessionId> = self
            .lock()
            .sessions
            .iter()
            .filter(|(_, s)| s.expired(now))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(s) = self.remove(&id) {
                s.qp.fail();
                self.metrics.hipobj_session(s.op_name(), "expired");
            }
        }
    }

    /// Whether a client GID (an IP address on RoCE v2) is on a network
    /// this server may send to.
    pub(super) fn allowed_gid(&self, gid: [u8; 16]) -> bool {
        networks::allowed(
            &self.allowed,
            std::net::IpAddr::V6(std::net::Ipv6Addr::from(gid)),
        )
    }

    /// Sessions held (for tests and the log).
    #[must_use]
    pub fn sessions(&self) -> usize {
        self.lock().sessions.len()
    }
}
