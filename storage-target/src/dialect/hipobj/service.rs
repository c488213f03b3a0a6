//! The hipobj-rc-v2 server's state: sessions, caps, the recent-pairs
//! rings, the reaper (built with the `verbs` feature).

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use fabric::Domain;
use s3dma_wire::hipobj::SessionId;

use crate::config::hipobj::HipobjConfig;
use crate::dialect::ClientNetworks;
use crate::metrics::Metrics;

use super::front::HipobjFront;
use super::session::Session;

/// Server pairs (QP number, PSN) remembered against reuse.
const RECENT_PAIRS: usize = 4096;

/// The hipobj-rc-v2 server: its verbs domains, one per rail (none: the
/// dialect is answered as unsupported), the S3 handler it reads and writes
/// objects with, its sessions and caps.
#[derive(Debug)]
pub struct HipobjService {
    pub(super) rails: Vec<Domain>,
    /// Each rail's own address (its GID's): a client's QP is served from
    /// the rail facing its GID ([`fabric::rail::pick_local_rail`]).
    rail_addrs: Vec<Option<IpAddr>>,
    /// Why the dialect is not served (when `rails` is empty), for the log.
    pub(super) unsupported: &'static str,
    pub(super) s3: Arc<dyn HipobjFront>,
    pub(super) cfg: HipobjConfig,
    /// `rdma.allowed_client_networks`: the GIDs (as IP addresses) a
    /// client's QP may have.
    pub(super) allowed: ClientNetworks,
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
    /// What the shared class (users not in `rdma.tenant_users`) holds:
    /// sessions and staging bytes.
    shared: (usize, u64),
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
    /// `max_sessions` held: `501`, fall back to HTTP.
    Sessions,
    /// The user's own `max_sessions_per_user`: `503`.
    UserSessions,
    /// The shared class's `max_shared_sessions`: `501`.
    SharedSessions,
    /// `max_staging_bytes` held: `501`.
    Staging,
    /// The user's own `max_staging_bytes_per_user`: `503`.
    UserStaging,
    /// The shared class's `max_shared_staging_bytes`: `501`.
    SharedStaging,
}

impl Refusal {
    /// Whether the refusal is the user's own cap (`503`, retry later);
    /// otherwise a pool is out of slots (`501` with the unsupported
    /// marker: the client moves the bytes over HTTP).
    pub(super) fn own_cap(self) -> bool {
        matches!(self, Refusal::UserSessions | Refusal::UserStaging)
    }
}

/// Sessions and staging bytes held.
pub(super) type Held = (usize, u64);

/// The admission rule, as the s3dma staging pool's classes: the user's own
/// caps first (`max_sessions_per_user`, `max_staging_bytes_per_user`),
/// then, for a user not in `rdma.tenant_users` (`shared_class`), the
/// shared class's (`max_shared_sessions`, `max_shared_staging_bytes`), then
/// the server's (`max_sessions`, `max_staging_bytes`). `user`, `shared`
/// and `total` are what is held now; `bytes` is the new session's staging.
pub(super) fn admission(
    cfg: &HipobjConfig,
    shared_class: bool,
    user: Held,
    shared: Held,
    total: Held,
    bytes: u64,
) -> Result<(), Refusal> {
    if user.0 >= cfg.max_sessions_per_user {
        return Err(Refusal::UserSessions);
    }
    if user.1 + bytes > cfg.max_staging_bytes_per_user.0 {
        return Err(Refusal::UserStaging);
    }
    if shared_class {
        if shared.0 >= cfg.shared_sessions() {
            return Err(Refusal::SharedSessions);
        }
        if shared.1 + bytes > cfg.shared_staging_bytes() {
            return Err(Refusal::SharedStaging);
        }
    }
    if total.0 >= cfg.max_sessions {
        return Err(Refusal::Sessions);
    }
    if total.1 + bytes > cfg.max_staging_bytes.0 {
        return Err(Refusal::Staging);
    }
    Ok(())
}

impl HipobjService {
    /// The server over `s3` on `rails` (verbs domains with a device, one
    /// per rail, rail 0 first; none answers every control request as
    /// unsupported).
    #[must_use]
    pub fn new(
        rails: Vec<Domain>,
        unsupported: &'static str,
        s3: Arc<dyn HipobjFront>,
        cfg: HipobjConfig,
        allowed: ClientNetworks,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let rail_addrs = rails.iter().map(Domain::gid_address).collect();
        Arc::new(HipobjService {
            rails,
            rail_addrs,
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

    /// Whether `user` is in the shared class (not one of
    /// `rdma.tenant_users`).
    fn shared_class(&self, user: &str) -> bool {
        !self.cfg.tenant_users.iter().any(|t| t == user)
    }

    /// Takes the caps for a session of `user` staging `bytes`
    /// ([`admission`]).
    pub(super) fn admit(&self, user: &str, bytes: u64) -> Result<(), Refusal> {
        let shared_class = self.shared_class(user);
        let mut st = self.lock();
        let (n, held) = st.users.get(user).copied().unwrap_or((0, 0));
        admission(
            &self.cfg,
            shared_class,
            (n, held),
            st.shared,
            (st.admitted, st.staging_bytes),
            bytes,
        )?;
        st.users.insert(user.to_owned(), (n + 1, held + bytes));
        st.staging_bytes += bytes;
        st.admitted += 1;
        if shared_class {
            st.shared.0 += 1;
            st.shared.1 += bytes;
        }
        Ok(())
    }

    /// Gives back what [`HipobjService::admit`] took.
    pub(super) fn release(&self, user: &str, bytes: u64) {
        let shared_class = self.shared_class(user);
        let mut st = self.lock();
        if shared_class {
            st.shared.0 = st.shared.0.saturating_sub(1);
            st.shared.1 = st.shared.1.saturating_sub(bytes);
        }
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
        self.allowed.allows_gid(gid)
    }

    /// The domain of the rail facing a client QP's `gid` (longest common
    /// address prefix; rail 0 on a tie). `None`: the dialect is not served.
    pub(super) fn rail_for(&self, gid: [u8; 16]) -> Option<&Domain> {
        let peer = IpAddr::V6(Ipv6Addr::from(gid));
        let i = fabric::rail::pick_local_rail(peer, &self.rail_addrs);
        self.rails.get(i).or_else(|| self.rails.first())
    }

    /// Sessions held (for tests and the log).
    #[must_use]
    pub fn sessions(&self) -> usize {
        self.lock().sessions.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use s3dma_config::ByteSize;

    fn cfg() -> HipobjConfig {
        HipobjConfig {
            max_sessions: 8,
            max_sessions_per_user: 2,
            max_shared_sessions: Some(4),
            max_staging_bytes: ByteSize(4 << 20),
            max_staging_bytes_per_user: ByteSize(2 << 20),
            max_shared_staging_bytes: Some(ByteSize(2 << 20)),
            ..HipobjConfig::default()
        }
        .with_tenants(&["agent".to_owned()])
    }

    #[test]
    fn the_shared_class_leaves_the_rest_to_tenants() {
        let c = cfg();
        // Within every cap.
        assert_eq!(admission(&c, true, (1, 0), (3, 0), (3, 0), 1), Ok(()));
        // The shared class is out of sessions: a pool refusal (501), the
        // tenant is not held back by it.
        let r = admission(&c, true, (0, 0), (4, 0), (4, 0), 1);
        assert_eq!(r, Err(Refusal::SharedSessions));
        assert!(!r.unwrap_err().own_cap());
        assert_eq!(admission(&c, false, (0, 0), (4, 0), (4, 0), 1), Ok(()));
        // Staging: two shared users of 1 MiB each fill the class's 2 MiB.
        let mib = 1 << 20;
        assert_eq!(
            admission(&c, true, (0, 0), (2, 2 * mib), (2, 2 * mib), 1),
            Err(Refusal::SharedStaging)
        );
        assert_eq!(
            admission(&c, false, (0, 0), (2, 2 * mib), (2, 2 * mib), 2 * mib),
            Ok(())
        );
        // The server's own caps: a pool refusal for everyone.
        assert_eq!(
            admission(&c, false, (0, 0), (0, 0), (8, 0), 1),
            Err(Refusal::Sessions)
        );
        assert_eq!(
            admission(&c, false, (0, 0), (0, 0), (1, 4 * mib), 1),
            Err(Refusal::Staging)
        );
    }

    #[test]
    fn a_user_at_its_own_cap_is_told_so_first() {
        let c = cfg();
        for class in [true, false] {
            let r = admission(&c, class, (2, 0), (4, 0), (8, 0), 1);
            assert_eq!(r, Err(Refusal::UserSessions));
            assert!(r.unwrap_err().own_cap());
            let r = admission(&c, class, (1, 2 << 20), (4, 0), (8, 0), 1);
            assert_eq!(r, Err(Refusal::UserStaging));
            assert!(r.unwrap_err().own_cap());
        }
    }

    #[test]
    fn tenants_come_from_rdma_tenant_users() {
        let c = cfg();
        assert_eq!(c.tenant_users, ["agent"]);
        let d = HipobjConfig::default();
        assert!(d.tenant_users.is_empty());
        // Defaults: everyone is shared, half of each pool.
        assert_eq!(d.shared_sessions(), 32);
        assert_eq!(d.shared_staging_bytes(), 2 << 30);
    }
}
