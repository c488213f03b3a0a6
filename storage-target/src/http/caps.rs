//! The connection caps (`max_connections`, `connections:`): at most
//! `max_connections` connections are open, shared as `connections:` says.
//! At the cap, the evictable connection idle longest is closed to make
//! room, and a new connection that finds none evictable is closed at once;
//! a connection is evictable while no request is in progress on it, or
//! while its request moves less than `min_transfer_rate` over a whole
//! window. One client address holds at most `per_address` connections and
//! one S3 user at most `per_user` requests in progress; the agents'
//! networks hold reserved slots and are exempt from both shares.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::config::connections::ConnectionsConfig;
use crate::metrics::Metrics;

/// Who the request in progress on a connection is, for the per-user share.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Caller {
    /// Not (yet) authenticated.
    Unknown,
    /// An unsigned request: anonymous callers together are one user.
    Anonymous,
    /// A signed request, by access key.
    User(String),
}

/// One open connection, for the cap: its client's address (and whether
/// that is an agent's), whether a request is in progress on it and by
/// whom, since when it has been idle, the bytes it moved, whether its
/// request trickles, and how to close it.
#[derive(Debug)]
pub(crate) struct Conn {
    ip: IpAddr,
    /// From `agent_networks`: exempt from the shares, may use the reserve.
    agent: bool,
    busy: AtomicUsize,
    idle_since: Mutex<Instant>,
    close: CancellationToken,
    /// The caller of the request in progress (or of the last one).
    caller: Mutex<Caller>,
    /// Bytes moved (read and written) since the sampler last looked.
    moved: AtomicU64,
    /// Requests started on the connection so far.
    requests: AtomicU64,
    /// The sampler's view at its last look: requests started, and whether
    /// one was in progress.
    seen_requests: AtomicU64,
    seen_busy: AtomicBool,
    /// `requests` when the sampler found the request in progress trickling
    /// (moved less than the least rate over a whole window); 0 when not.
    /// Only the same request stays trickling: a new one starts afresh.
    slow_request: AtomicU64,
}

impl Conn {
    fn new(ip: IpAddr, agent: bool) -> Conn {
        Conn {
            ip,
            agent,
            busy: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            close: CancellationToken::new(),
            caller: Mutex::new(Caller::Unknown),
            moved: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            seen_requests: AtomicU64::new(0),
            seen_busy: AtomicBool::new(false),
            slow_request: AtomicU64::new(0),
        }
    }

    fn caller(&self) -> std::sync::MutexGuard<'_, Caller> {
        self.caller
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn idle_since(&self) -> Instant {
        *self
            .idle_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn is_busy(&self) -> bool {
        self.busy.load(Ordering::SeqCst) > 0
    }

    /// Whether the request in progress trickles.
    fn is_slow(&self) -> bool {
        let slow = self.slow_request.load(Ordering::SeqCst);
        slow != 0 && slow == self.requests.load(Ordering::SeqCst)
    }

    /// Counts `n` bytes moved (either way), for the transfer rate.
    pub(crate) fn moved(&self, n: usize) {
        self.moved.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Cancelled when the connection is closed to make room.
    pub(crate) fn closed(&self) -> &CancellationToken {
        &self.close
    }

    /// Open and not being closed.
    fn is_live(&self) -> bool {
        !self.close.is_cancelled()
    }

    /// Whether the connection may be closed to make room: no request in
    /// progress, or one that trickles.
    fn evictable(&self) -> bool {
        self.is_live() && (!self.is_busy() || self.is_slow())
    }
}

/// A request in progress on a connection (it is not idle meanwhile).
#[derive(Debug)]
pub(crate) struct Busy(Arc<Conn>);

impl Busy {
    /// Marks `c` busy with a new request until dropped.
    pub(crate) fn new(c: Arc<Conn>) -> Busy {
        *c.caller() = Caller::Unknown;
        c.requests.fetch_add(1, Ordering::SeqCst);
        c.busy.fetch_add(1, Ordering::SeqCst);
        Busy(c)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self
            .0
            .idle_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The connection a request arrived on, in the request extensions: the
/// access checks name the request's caller here once it is authenticated
/// ([`claim_connection`]), for the per-user share.
#[derive(Debug, Clone)]
pub struct ConnShare {
    conn: Arc<Conn>,
    conns: Arc<Conns>,
}

impl ConnShare {
    /// The connection.
    pub(crate) fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// Records `access_key` (`None`: anonymous) as the caller of the request
    /// in progress; `false`, recording nothing, when that user already has
    /// `per_user` requests in progress on other connections (an agent's
    /// connection is not counted, and always gets `true`).
    #[must_use]
    pub fn claim(&self, access_key: Option<&str>) -> bool {
        let caller = access_key.map_or(Caller::Anonymous, |k| Caller::User(k.to_owned()));
        if self.conn.agent {
            *self.conn.caller() = caller;
            return true;
        }
        // Counted and recorded under the map's lock, so two requests of one
        // user claiming at once see each other.
        let open = self.conns.lock();
        let others = open
            .values()
            .filter(|c| {
                !Arc::ptr_eq(c, &self.conn)
                    && !c.agent
                    && c.is_live()
                    && c.is_busy()
                    && *c.caller() == caller
            })
            .count();
        if others >= self.conns.per_user {
            return false;
        }
        *self.conn.caller() = caller;
        true
    }
}

/// For the access checks, once s3s has authenticated a request: claims
/// its connection for its caller (the per-user share of `connections:`).
///
/// # Errors
/// `503 SlowDown` when the caller already has `connections.per_user`
/// requests in progress.
pub fn claim_connection(cx: &mut s3s::access::S3AccessContext<'_>) -> s3s::S3Result<()> {
    let key = cx.credentials().map(|c| c.access_key.clone());
    if let Some(share) = cx.extensions_mut().get::<ConnShare>()
        && !share.claim(key.as_deref())
    {
        debug!(
            per_user = share.conns.per_user,
            "request refused: its user has connections.per_user requests in progress"
        );
        return Err(s3s::s3_error!(
            SlowDown,
            "Please reduce your request rate: too many requests of this user in progress (connections.per_user)."
        ));
    }
    Ok(())
}

/// Which open connections a new one may close to make room for itself.
#[derive(Debug, Clone, Copy)]
enum Scope {
    /// Its own address's (the address is at `per_address`).
    Address(IpAddr),
    /// Any but the agents' (other clients hold all the unreserved slots).
    Clients,
    /// Any.
    Any,
}

/// The open connections and the slots they hold.
#[derive(Debug)]
pub(crate) struct Conns {
    max: usize,
    /// Slots only agents may hold.
    reserved: usize,
    per_address: usize,
    per_user: usize,
    slots: Arc<tokio::sync::Semaphore>,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
}

impl Conns {
    /// The caps of `max_connections` (at least 1) connections, shared as
    /// `shares` says.
    pub(crate) fn new(max_connections: usize, shares: &ConnectionsConfig) -> Arc<Conns> {
        let max = max_connections.max(1);
        Arc::new(Conns {
            max,
            reserved: shares.reserved().min(max - 1),
            per_address: shares.per_address.max(1),
            per_user: shares.per_user.max(1),
            slots: Arc::new(tokio::sync::Semaphore::new(max)),
            open: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        })
    }

    /// The cap on open connections.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Starts the transfer-rate sampler (`connections.min_transfer_rate`;
    /// none when it is 0), until `shutdown`.
    pub(crate) fn spawn_sampler(
        self: &Arc<Self>,
        shares: &ConnectionsConfig,
        shutdown: CancellationToken,
    ) {
        let rate = shares.min_transfer_rate.0;
        if rate == 0 {
            return;
        }
        let window = shares.window();
        // The bytes a request must move over a whole window.
        let least = u64::try_from(u128::from(rate) * window.as_millis() / 1000).unwrap_or(u64::MAX);
        let conns = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(window);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    _ = tick.tick() => conns.sample(least),
                }
            }
        });
    }

    /// Admits a new connection from `ip` (an agent's when `agent`): takes
    /// a slot ([`Conns::slot`]) and records the connection; what it holds
    /// (dropping it gives the slot back) and its share.
    ///
    /// # Errors
    /// Why the connection is refused (no slot).
    pub(crate) async fn admit(
        self: &Arc<Self>,
        ip: IpAddr,
        agent: bool,
        metrics: &Arc<Metrics>,
    ) -> Result<(Open, ConnShare), &'static str> {
        let slot = self.slot(ip, agent).await?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new(ip, agent));
        self.lock().insert(id, Arc::clone(&conn));
        metrics.connection(true);
        let open = Open {
            id,
            conns: Arc::clone(self),
            metrics: Arc::clone(metrics),
            _slot: slot,
        };
        Ok((
            open,
            ConnShare {
                conn,
                conns: Arc::clone(self),
            },
        ))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Where a new connection from `ip` must make room, if it must: its
    /// address at its share, the clients' slots all held, or all slots.
    fn scope(&self, open: &HashMap<u64, Arc<Conn>>, ip: IpAddr, agent: bool) -> Option<Scope> {
        let (mut total, mut clients, mut here) = (0, 0, 0);
        for c in open.values().filter(|c| c.is_live()) {
            total += 1;
            if !c.agent {
                clients += 1;
                here += usize::from(c.ip == ip);
            }
        }
        if !agent && here >= self.per_address {
            Some(Scope::Address(ip))
        } else if !agent && clients >= self.max - self.reserved {
            Some(Scope::Clients)
        } else if total >= self.max {
            Some(Scope::Any)
        } else {
            None
        }
    }

    /// A slot for a new connection from `ip`: a free one, or the slot of
    /// the evictable connection idle longest (idle ones first, then
    /// trickling ones) among those it may close, closed for it; `Err` (why)
    /// when there is none.
    async fn slot(
        &self,
        ip: IpAddr,
        agent: bool,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, &'static str> {
        {
            let open = self.lock();
            if let Some(scope) = self.scope(&open, ip, agent) {
                let victim = open
                    .values()
                    .filter(|c| c.evictable())
                    .filter(|c| match scope {
                        Scope::Address(a) => !c.agent && c.ip == a,
                        Scope::Clients => !c.agent,
                        Scope::Any => true,
                    })
                    .min_by_key(|c| (c.is_busy(), c.idle_since()))
                    .cloned();
                let Some(victim) = victim else {
                    return Err(match scope {
                        Scope::Address(_) => {
                            "its address holds connections.per_address connections, none evictable"
                        }
                        Scope::Clients => {
                            "clients hold every slot not reserved for agents, none evictable"
                        }
                        Scope::Any => "max_connections are open, none evictable",
                    });
                };
                debug!(peer = %victim.ip, trickling = victim.is_busy(), "closing a connection to make room (max_connections)");
                victim.close.cancel();
            }
        }
        // A free slot, or the one a closed connection gives back: its task
        // ends at once.
        tokio::time::timeout(
            Duration::from_secs(1),
            Arc::clone(&self.slots).acquire_owned(),
        )
        .await
        .map_err(|_| "no slot came free")?
        .map_err(|_| "the server is stopping")
    }

    /// One look of the transfer-rate sampler: a request in progress since
    /// the last look (the same one) that moved fewer than `least` bytes
    /// since then trickles.
    fn sample(&self, least: u64) {
        for c in self.lock().values() {
            let moved = c.moved.swap(0, Ordering::SeqCst);
            let requests = c.requests.load(Ordering::SeqCst);
            let busy = c.is_busy();
            let same = busy
                && c.seen_busy.load(Ordering::SeqCst)
                && c.seen_requests.load(Ordering::SeqCst) == requests;
            c.slow_request.store(
                if same && moved < least { requests } else { 0 },
                Ordering::SeqCst,
            );
            c.seen_busy.store(busy, Ordering::SeqCst);
            c.seen_requests.store(requests, Ordering::SeqCst);
        }
    }
}

/// What an open connection holds; dropping it gives the slot back.
pub(crate) struct Open {
    id: u64,
    conns: Arc<Conns>,
    metrics: Arc<Metrics>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.conns.lock().remove(&self.id);
        self.metrics.connection(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conns(max: usize, reserved: usize, per_address: usize, per_user: usize) -> Arc<Conns> {
        Arc::new(Conns {
            max,
            reserved,
            per_address,
            per_user,
            slots: Arc::new(tokio::sync::Semaphore::new(max)),
            open: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        })
    }

    /// Opens a connection from `ip` as [`serve`] does, with a task that
    /// gives its slot back once it is closed.
    async fn open(conns: &Arc<Conns>, ip: &str, agent: bool) -> Result<Arc<Conn>, &'static str> {
        let ip: IpAddr = ip.parse().unwrap();
        let slot = conns.slot(ip, agent).await?;
        let conn = Arc::new(Conn::new(ip, agent));
        let id = conns.next.fetch_add(1, Ordering::Relaxed);
        conns.lock().insert(id, Arc::clone(&conn));
        let (cs, c) = (Arc::clone(conns), Arc::clone(&conn));
        tokio::spawn(async move {
            c.close.cancelled().await;
            cs.lock().remove(&id);
            drop(slot);
        });
        Ok(conn)
    }

    #[tokio::test]
    async fn shares_choose_whom_to_close() {
        // 4 slots, 1 reserved for agents, 2 per address.
        let c = conns(4, 1, 2, 8);
        let a1 = open(&c, "10.0.0.1", false).await.unwrap();
        let a2 = open(&c, "10.0.0.1", false).await.unwrap();
        let busy_a2 = Busy::new(Arc::clone(&a2));
        let busy_a1 = Busy::new(Arc::clone(&a1));
        // The address at its share, both busy: refused.
        let e = open(&c, "10.0.0.1", false).await.unwrap_err();
        assert!(e.contains("per_address"), "{e}");
        // One idle: the address's own idle one makes room.
        drop(busy_a1);
        let a3 = open(&c, "10.0.0.1", false).await.unwrap();
        assert!(a1.close.is_cancelled() && !a2.close.is_cancelled());
        let _busy_a3 = Busy::new(Arc::clone(&a3));
        let b1 = open(&c, "10.0.0.2", false).await.unwrap();
        let _busy_b1 = Busy::new(Arc::clone(&b1));
        // Clients hold the 3 unreserved slots, all busy; the agent's is free.
        let e = open(&c, "10.0.0.3", false).await.unwrap_err();
        assert!(e.contains("reserved"), "{e}");
        let g1 = open(&c, "10.9.0.1", true).await.unwrap();
        // Full: another agent connection closes the idle agent one.
        let g2 = open(&c, "10.9.0.1", true).await.unwrap();
        assert!(g1.close.is_cancelled() && !g2.close.is_cancelled());
        drop(busy_a2);
        // An idle client connection may go for a client, not the agent's.
        let _d = open(&c, "10.0.0.4", false).await.unwrap();
        assert!(a2.close.is_cancelled() && !g2.close.is_cancelled());
    }

    #[tokio::test]
    async fn a_request_below_the_rate_for_a_whole_window_is_evictable() {
        let c = conns(1, 0, 8, 8);
        let a = open(&c, "10.0.0.1", false).await.unwrap();
        let busy = Busy::new(Arc::clone(&a));
        assert!(!a.evictable());
        // The first look sees the request start; a window of enough bytes
        // keeps it busy; a whole window of too few makes it trickle.
        c.sample(100);
        assert!(!a.evictable());
        a.moved.fetch_add(100, Ordering::SeqCst);
        c.sample(100);
        assert!(!a.evictable());
        a.moved.fetch_add(99, Ordering::SeqCst);
        c.sample(100);
        assert!(a.evictable());
        // A new request on the connection starts afresh.
        drop(busy);
        let _busy = Busy::new(Arc::clone(&a));
        assert!(!a.evictable());
        c.sample(100);
        assert!(!a.evictable());
        let _b = open(&c, "10.0.0.2", false).await.unwrap_err();
        c.sample(100);
        let _b = open(&c, "10.0.0.2", false).await.unwrap();
        assert!(a.close.is_cancelled());
    }

    #[tokio::test]
    async fn one_user_holds_its_share_of_requests() {
        let c = conns(8, 0, 8, 2);
        let mut shares = Vec::new();
        for ip in ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.9.0.1"] {
            let conn = open(&c, ip, ip.starts_with("10.9")).await.unwrap();
            shares.push((
                Busy::new(Arc::clone(&conn)),
                ConnShare {
                    conn,
                    conns: Arc::clone(&c),
                },
            ));
        }
        assert!(shares[0].1.claim(Some("u")));
        assert!(shares[1].1.claim(Some("u")));
        assert!(!shares[2].1.claim(Some("u")), "a third request of u");
        assert!(shares[2].1.claim(Some("v")));
        assert!(shares[2].1.claim(None), "anonymous is a user of its own");
        assert!(shares[3].1.claim(Some("u")), "an agent's is not counted");
        // A finished request is not counted.
        let (busy, _) = shares.remove(0);
        drop(busy);
        assert!(shares[1].1.claim(Some("u")));
    }
}
