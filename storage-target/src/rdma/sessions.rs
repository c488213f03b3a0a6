//! Fabric sessions, pooled per endpoint and reused.
//!
//! One session per endpoint carries all of that endpoint's operations (a
//! session multiplexes many outstanding operations), with at most
//! `max_ops_per_session` in flight. Connecting is bounded by a timeout; a
//! failed connect fails only the request that asked for it and is not
//! cached, and a session that died is replaced by the next request. A reaper
//! closes sessions idle for longer than `idle` with nothing in flight.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use fabric::{Domain, EndpointAddr, FabricKey, Session, SessionConfig};
use tokio::sync::Semaphore;
use tracing::{debug, info};

use crate::metrics::Metrics;

/// A pooled session and its in-flight bound.
pub struct SessionEntry {
    /// The fabric session.
    pub session: Session,
    /// Permits for operations in flight on this session.
    pub ops: Arc<Semaphore>,
    max_ops: usize,
    last_used: Mutex<Instant>,
}

impl fmt::Debug for SessionEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionEntry")
            .field("peer", &self.session.peer())
            .field("alive", &self.session.is_alive())
            .field("in_flight", &(self.max_ops - self.ops.available_permits()))
            .finish()
    }
}

impl SessionEntry {
    fn touch(&self) {
        *self
            .last_used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .elapsed()
    }

    fn in_flight(&self) -> usize {
        self.max_ops - self.ops.available_permits()
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<Arc<SessionEntry>>>>;

/// Why a session could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The connect (and handshake) did not finish in time.
    #[error("connecting to fabric endpoint {peer} timed out after {after:?}")]
    Timeout {
        /// The endpoint.
        peer: EndpointAddr,
        /// The timeout.
        after: Duration,
    },
    /// The connect or handshake failed.
    #[error("connecting to fabric endpoint {peer} failed: {source}")]
    Failed {
        /// The endpoint.
        peer: EndpointAddr,
        /// The fabric's error.
        source: fabric::FabricError,
    },
}

/// The session pool.
pub struct SessionPool {
    domain: Domain,
    key: FabricKey,
    connect_timeout: Duration,
    max_ops: usize,
    slots: Mutex<HashMap<EndpointAddr, Slot>>,
    metrics: Arc<Metrics>,
}

impl fmt::Debug for SessionPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionPool")
            .field("endpoints", &self.lock().len())
            .field("max_ops", &self.max_ops)
            .finish_non_exhaustive()
    }
}

impl SessionPool {
    /// A pool connecting on `domain` with `key`.
    #[must_use]
    pub fn new(
        domain: Domain,
        key: FabricKey,
        connect_timeout: Duration,
        max_ops: usize,
        metrics: Arc<Metrics>,
    ) -> Arc<SessionPool> {
        Arc::new(SessionPool {
            domain,
            key,
            connect_timeout,
            max_ops: max_ops.max(1),
            slots: Mutex::new(HashMap::new()),
            metrics,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<EndpointAddr, Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A live session to `peer`: the pooled one, or a new connection.
    ///
    /// # Errors
    /// [`ConnectError`] when the endpoint cannot be reached in time.
    pub async fn get(&self, peer: EndpointAddr) -> Result<Arc<SessionEntry>, ConnectError> {
        let slot = Arc::clone(self.lock().entry(peer).or_default());
        let mut guard = slot.lock().await;
        if let Some(e) = guard.as_ref() {
            if e.session.is_alive() {
                e.touch();
                return Ok(Arc::clone(e));
            }
            debug!(%peer, "replacing a dead fabric session");
            *guard = None;
            self.update_gauge();
        }
        let mut cfg = SessionConfig::new(self.key.clone());
        cfg.connect_timeout = self.connect_timeout;
        let started = Instant::now();
        let res = tokio::time::timeout(
            self.connect_timeout,
            Session::connect(&self.domain, peer, cfg),
        )
        .await;
        let session = match res {
            Err(_) => {
                self.metrics.rdma_connect("timeout");
                return Err(ConnectError::Timeout {
                    peer,
                    after: self.connect_timeout,
                });
            }
            Ok(Err(source)) => {
                self.metrics.rdma_connect("error");
                return Err(ConnectError::Failed { peer, source });
            }
            Ok(Ok(s)) => s,
        };
        self.metrics.rdma_connect("ok");
        debug!(%peer, elapsed = ?started.elapsed(), "fabric session connected");
        let entry = Arc::new(SessionEntry {
            session,
            ops: Arc::new(Semaphore::new(self.max_ops)),
            max_ops: self.max_ops,
            last_used: Mutex::new(Instant::now()),
        });
        *guard = Some(Arc::clone(&entry));
        drop(guard);
        self.update_gauge();
        Ok(entry)
    }

    /// Number of pooled sessions.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock()
            .values()
            .filter(|s| s.try_lock().map(|g| g.is_some()).unwrap_or(true))
            .count()
    }

    /// Whether no session is pooled.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn update_gauge(&self) {
        self.metrics.rdma_sessions(self.len());
    }

    /// Closes sessions that are dead, or idle for `idle` with nothing in
    /// flight and no request holding them; returns how many were closed.
    pub fn reap(&self, idle: Duration) -> usize {
        let mut closed = 0;
        let mut map = self.lock();
        map.retain(|peer, slot| {
            let Ok(mut g) = slot.try_lock() else {
                return true; // a request is connecting or using the slot
            };
            let drop_it = match g.as_ref() {
                None => true,
                Some(e) => {
                    !e.session.is_alive()
                        || (Arc::strong_count(e) == 1 && e.in_flight() == 0 && e.idle_for() >= idle)
                }
            };
            if drop_it {
                if g.take().is_some() {
                    info!(%peer, "closing idle or dead fabric session");
                    closed += 1;
                }
                return Arc::strong_count(slot) > 1;
            }
            true
        });
        drop(map);
        self.update_gauge();
        closed
    }

    /// Runs [`SessionPool::reap`] periodically until the pool is dropped.
    pub fn spawn_reaper(self: &Arc<Self>, idle: Duration) {
        let weak: Weak<SessionPool> = Arc::downgrade(self);
        let period = (idle / 2).clamp(Duration::from_millis(100), Duration::from_secs(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(pool) = weak.upgrade() else {
                    return;
                };
                pool.reap(idle);
            }
        });
    }
}
