//! The target's verbs rails (`rdma.rails`): one domain, staging pool and
//! session pool per local RDMA device port, and which of them serves a
//! client's endpoint ([`fabric::rail::pick_local_rail`] over each rail's
//! GID address, so a shim rail on 10.0.2.0/24 is reached from the local
//! port on 10.0.2.0/24). Without `rdma.rails` there is one rail: the
//! first device's port 1 (verbs), or the tcp stack.
//!
//! The pools report to the target's one set of gauges through
//! [`RailObserver`], which sums the rails' values.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use fabric::Domain;
use fabric::pool::{PoolObserver, SessionPool, StagingPool};

use crate::metrics::Metrics;

/// One local rail: its device's domain, the staging buffers registered
/// there, the sessions its queue pairs form and, when its device does DC,
/// the sessions of its DC initiators (standard tokens naming a DC target
/// this rail faces).
#[derive(Debug)]
pub(crate) struct Rail {
    pub(crate) domain: Domain,
    pub(crate) pool: Arc<StagingPool>,
    pub(crate) sessions: Arc<SessionPool>,
    pub(crate) dc: Option<Arc<SessionPool>>,
}

/// The rails of a target, the first one the default.
#[derive(Debug)]
pub(crate) struct Rails {
    rails: Vec<Rail>,
    /// Each rail's own address (its GID's), for the choice.
    addrs: Vec<Option<IpAddr>>,
}

impl Rails {
    /// Rails in configuration order; at least one.
    pub(crate) fn new(rails: Vec<Rail>) -> Rails {
        let addrs = rails.iter().map(|r| r.domain.gid_address()).collect();
        Rails { rails, addrs }
    }

    /// The first rail (a gateway's cache lives there).
    pub(crate) fn first(&self) -> &Rail {
        &self.rails[0]
    }

    /// Every rail, in configuration order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Rail> {
        self.rails.iter()
    }

    /// The rail that serves a client endpoint at `peer`.
    pub(crate) fn serving(&self, peer: IpAddr) -> &Rail {
        let i = fabric::rail::pick_local_rail(peer, &self.addrs);
        self.rails.get(i).unwrap_or(&self.rails[0])
    }

    /// The rail whose DC initiators serve a standard token naming a DC
    /// target at `peer`: the facing rail when its device does DC, else the
    /// first rail that does (a device without DC beside one with it);
    /// `None` when no rail does DC.
    pub(crate) fn dc_serving(&self, peer: IpAddr) -> Option<&Rail> {
        Some(self.serving(peer))
            .filter(|r| r.dc.is_some())
            .or_else(|| self.rails.iter().find(|r| r.dc.is_some()))
    }

    /// Whether any rail does DC.
    pub(crate) fn any_dc(&self) -> bool {
        self.rails.iter().any(|r| r.dc.is_some())
    }
}

/// The pool gauges of every rail, summed.
#[derive(Debug)]
pub(crate) struct RailSums {
    total: Vec<AtomicUsize>,
    in_use: Vec<AtomicUsize>,
    sessions: Vec<AtomicUsize>,
}

impl RailSums {
    /// Room for `rails` rails.
    pub(crate) fn new(rails: usize) -> Arc<RailSums> {
        let zeros = || (0..rails).map(|_| AtomicUsize::new(0)).collect();
        Arc::new(RailSums {
            total: zeros(),
            in_use: zeros(),
            sessions: zeros(),
        })
    }
}

/// One rail's pools' observer: records the rail's value and sets the
/// target's gauge to the sum over the rails (a gauge per rail would set
/// the one gauge to whichever rail spoke last).
#[derive(Debug)]
pub(crate) struct RailObserver {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) rail: usize,
    pub(crate) sums: Arc<RailSums>,
}

impl RailObserver {
    fn sum(&self, of: &[AtomicUsize], n: usize) -> usize {
        if let Some(slot) = of.get(self.rail) {
            slot.store(n, Ordering::Relaxed);
        }
        of.iter().map(|v| v.load(Ordering::Relaxed)).sum()
    }
}

impl PoolObserver for RailObserver {
    fn staging_total(&self, n: usize) {
        PoolObserver::staging_total(&*self.metrics, self.sum(&self.sums.total, n));
    }

    fn staging_in_use(&self, n: usize) {
        PoolObserver::staging_in_use(&*self.metrics, self.sum(&self.sums.in_use, n));
    }

    fn sessions(&self, n: usize) {
        PoolObserver::sessions(&*self.metrics, self.sum(&self.sums.sessions, n));
    }

    fn connect(&self, outcome: &'static str) {
        PoolObserver::connect(&*self.metrics, outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gauges_are_the_sum_of_the_rails() {
        let metrics = Arc::new(Metrics::new());
        let sums = RailSums::new(2);
        let rail = |rail| RailObserver {
            metrics: Arc::clone(&metrics),
            rail,
            sums: Arc::clone(&sums),
        };
        let (a, b) = (rail(0), rail(1));
        a.staging_total(32);
        b.staging_total(32);
        a.staging_in_use(3);
        b.staging_in_use(5);
        a.staging_in_use(1);
        PoolObserver::sessions(&b, 2);
        let text = metrics.render();
        for want in [
            "s3dma_storage_target_rdma_staging_buffers 64",
            "s3dma_storage_target_rdma_staging_buffers_in_use 6",
            "s3dma_storage_target_rdma_sessions 2",
        ] {
            assert!(text.contains(want), "{want} missing:\n{text}");
        }
    }
}
