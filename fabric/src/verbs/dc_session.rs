//! DC initiators behind the [`Session`](crate::Session) API (`dc`
//! feature): how a server writes (GET) and reads (PUT) the memory a
//! standard (cuObject) token names, behind the client's DC target.
//!
//! A [`DcInitiator`] holds a few DCIs (`initiators`, each `depth` work
//! requests deep) in RTS with cuObject's retry settings, the DC key, and a
//! bounded cache of address handles (least recently used evicted; an
//! evicted handle lives on in the operations still using it). A
//! [`Session`](crate::Session) to a token's endpoint
//! ([`Session::connect_dc`](crate::Session::connect_dc)) needs no
//! handshake: it is the address handle of the target's port plus the DCT
//! number; its operations go round robin over the DCIs. An operation owns
//! its local slice and address handle until its completion is polled.
//!
//! Completions are polled by one thread per initiator, which sleeps on a
//! condition variable while nothing is in flight and polls every 20 µs
//! while something is (the DCIs' completion queues have no event channel).
//! DC operations cannot be cancelled: a failed or abandoned one keeps
//! retrying until its retry budget runs out (about 2 s with cuObject's
//! settings, `s3dma_wire::dc::RetrySettings::budget`), and only its
//! completion gives the memory back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use s3dma_wire::EndpointAddr;
use s3dma_wire::dc::{AhCache, AhKey, DcTarget};
use s3dma_wire::frame::OpKind;
use tokio::sync::oneshot;

use super::dc::{AddressHandle, DcDest, DcOp, Dci, DciConfig, LocalSge};
use crate::completion::{Completion, OpResult};
use crate::error::{FabricError, OpError, OpStatus, Result};
use crate::region::{Domain, LocalSlice};

/// How a [`DcInitiator`] is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DcInitiatorConfig {
    /// DCIs (operations go round robin over them). At least 1.
    pub initiators: usize,
    /// Each DCI's settings (depth, retry).
    pub dci: DciConfig,
    /// The DC key targets were created with (cuObject: 0xffeeddcc).
    pub dc_key: u64,
    /// Traffic class of the address handles (cuObject: 96).
    pub traffic_class: u8,
    /// Hop limit of the address handles.
    pub hop_limit: u8,
    /// Address handles kept (one per remote port).
    pub max_address_handles: usize,
}

impl Default for DcInitiatorConfig {
    fn default() -> Self {
        DcInitiatorConfig {
            initiators: 4,
            dci: DciConfig::default(),
            dc_key: s3dma_wire::dc::DEFAULT_DC_KEY,
            traffic_class: s3dma_wire::dc::DEFAULT_TRAFFIC_CLASS,
            hop_limit: 64,
            max_address_handles: 1024,
        }
    }
}

/// An operation in flight: what the device uses until its completion.
struct Pending {
    tx: oneshot::Sender<OpResult>,
    info: OpError,
    _local: LocalSlice,
    _ah: Arc<AddressHandle>,
}

/// One DCI and its operations in flight. `dci` drops first: once its QP
/// is destroyed the device no longer touches the memory `pending` keeps.
struct Slot {
    dci: Dci,
    pending: HashMap<u64, Pending>,
    free: usize,
}

/// DC initiators, their address handles and the thread polling them.
pub struct DcInitiator {
    domain: Domain,
    cfg: DcInitiatorConfig,
    slots: Vec<Mutex<Slot>>,
    next_slot: AtomicUsize,
    next_id: AtomicU64,
    in_flight: AtomicUsize,
    ahs: Mutex<AhCache<AhKey, Arc<AddressHandle>>>,
    wake: (Mutex<bool>, Condvar),
}

impl std::fmt::Debug for DcInitiator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DcInitiator")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl DcInitiator {
    /// Creates the DCIs on `domain`'s device (which [`super::dc::probe`]
    /// found able to do DC) and starts the polling thread, which ends when
    /// the initiator is dropped.
    ///
    /// # Errors
    /// Not a verbs domain; the device refused a DCI.
    pub fn new(domain: &Domain, cfg: DcInitiatorConfig) -> Result<Arc<DcInitiator>> {
        let slots = (0..cfg.initiators.max(1))
            .map(|_| {
                Dci::create(domain, &cfg.dci).map(|dci| {
                    Mutex::new(Slot {
                        dci,
                        pending: HashMap::new(),
                        free: cfg.dci.depth.max(1) as usize,
                    })
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let init = Arc::new(DcInitiator {
            domain: domain.clone(),
            cfg,
            slots,
            next_slot: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            in_flight: AtomicUsize::new(0),
            ahs: Mutex::new(AhCache::new(cfg.max_address_handles)),
            wake: (Mutex::new(false), Condvar::new()),
        });
        let weak = Arc::downgrade(&init);
        std::thread::Builder::new()
            .name("s3dma-dc-poll".into())
            .spawn(move || poll_loop(&weak))
            .map_err(|e| FabricError::Unavailable {
                reason: format!("cannot start the DC polling thread: {e}"),
            })?;
        Ok(init)
    }

    /// The domain the DCIs live on.
    #[must_use]
    pub fn domain(&self) -> &Domain {
        &self.domain
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> DcInitiatorConfig {
        self.cfg
    }

    /// The address handle of `target`'s port (cached).
    ///
    /// # Errors
    /// The device refused the handle (no route to the GID).
    pub fn address_handle(&self, target: &DcTarget) -> Result<Arc<AddressHandle>> {
        let key = AhKey {
            gid: target.gid,
            lid: target.lid,
            port: 0,
            sgid_index: 0,
            traffic_class: self.cfg.traffic_class,
            hop_limit: self.cfg.hop_limit,
        };
        let (ah, _evicted) = lock(&self.ahs).get_or_make(&key, |k| {
            AddressHandle::create(&self.domain, k.gid, k.lid, k.traffic_class, k.hop_limit)
                .map(Arc::new)
        })?;
        Ok(ah)
    }

    /// Posts one WRITE or READ of `local` at `remote_addr` under `rkey` in
    /// `target`'s memory behind DCT `dctn`, through `ah`.
    fn post(
        &self,
        kind: OpKind,
        local: LocalSlice,
        ah: &Arc<AddressHandle>,
        dctn: u32,
        remote_addr: u64,
        rkey: u32,
    ) -> Completion {
        let info = OpError {
            status: OpStatus::LocalError,
            op: kind.name(),
            remote_addr,
            rkey,
            len: local.len() as u64,
        };
        let fail = |status| {
            Completion::failed(OpError {
                status,
                ..info.clone()
            })
        };
        let Ok(len) = u32::try_from(local.len()) else {
            return fail(OpStatus::LocalError);
        };
        let sge = LocalSge {
            addr: local.ptr() as u64,
            len,
            lkey: local.region().inner.lkey(),
        };
        let op = match kind {
            OpKind::Write => DcOp::Write,
            OpKind::Read => DcOp::Read,
        };
        let (tx, rx) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let n = self.slots.len();
        let first = self.next_slot.fetch_add(1, Ordering::Relaxed);
        // The first DCI with room, starting round robin.
        for i in 0..n {
            let mut slot = lock(&self.slots[(first + i) % n]);
            if slot.free == 0 {
                continue;
            }
            let dest = DcDest {
                ah,
                dctn,
                dc_key: self.cfg.dc_key,
            };
            // SAFETY: `local` is registered memory of this domain (its lkey
            // above), kept alive in `pending` (with the address handle)
            // until the poller took this operation's completion; the DCI is
            // destroyed before `pending` drops.
            let posted = unsafe { slot.dci.post(op, id, sge, remote_addr, rkey, dest) };
            if posted.is_err() {
                return fail(OpStatus::LocalError);
            }
            slot.free -= 1;
            slot.pending.insert(
                id,
                Pending {
                    tx,
                    info: info.clone(),
                    _local: local,
                    _ah: Arc::clone(ah),
                },
            );
            drop(slot);
            self.in_flight.fetch_add(1, Ordering::AcqRel);
            let (flag, cv) = &self.wake;
            *lock(flag) = true;
            cv.notify_one();
            return Completion::new(rx, info);
        }
        // Every DCI is full: callers bound their operations below the
        // total depth, so this is their error.
        fail(OpStatus::LocalError)
    }

    /// Polls every DCI once; returns whether anything is still in flight.
    fn poll_once(&self) -> bool {
        for slot in &self.slots {
            let mut slot = lock(slot);
            if slot.pending.is_empty() {
                continue;
            }
            let Ok(done) = slot.dci.poll(64) else {
                continue;
            };
            for (id, result) in done {
                if let Some(p) = slot.pending.remove(&id) {
                    slot.free += 1;
                    self.in_flight.fetch_sub(1, Ordering::AcqRel);
                    let r = result.map_err(|status| OpError {
                        status,
                        ..p.info.clone()
                    });
                    let _ = p.tx.send(r);
                }
            }
        }
        self.in_flight.load(Ordering::Acquire) > 0
    }
}

/// The polling thread: sleeps while nothing is in flight, polls every
/// 20 µs while something is, ends with the initiator.
fn poll_loop(weak: &Weak<DcInitiator>) {
    loop {
        let Some(init) = weak.upgrade() else {
            return;
        };
        if init.poll_once() {
            drop(init);
            std::thread::sleep(Duration::from_micros(20));
            continue;
        }
        let (flag, cv) = &init.wake;
        let mut woken = lock(flag);
        if !*woken {
            // Wakes on a post, or after a while to notice the initiator gone.
            woken = cv
                .wait_timeout(woken, Duration::from_millis(200))
                .map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
        *woken = false;
    }
}

/// A "session" to one DC target: its address handle and DCT number.
pub(crate) struct DcSession {
    init: Arc<DcInitiator>,
    ah: Arc<AddressHandle>,
    target: DcTarget,
    peer: EndpointAddr,
    alive: AtomicBool,
}

impl std::fmt::Debug for DcSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DcSession")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

/// The DC target a standard token's endpoint names: GID from its IP (an
/// IPv4 address as an IPv4-mapped GID), LID from its port, DCT number
/// from its responder.
#[must_use]
pub fn target_of_endpoint(peer: EndpointAddr) -> DcTarget {
    let gid = match peer.addr.ip() {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(v6) => v6.octets(),
    };
    DcTarget {
        lid: peer.addr.port(),
        dctn: peer.responder,
        gid: Some(gid),
    }
}

impl DcSession {
    pub(crate) fn connect(init: &Arc<DcInitiator>, peer: EndpointAddr) -> Result<DcSession> {
        let target = target_of_endpoint(peer);
        let ah = init.address_handle(&target)?;
        Ok(DcSession {
            init: Arc::clone(init),
            ah,
            target,
            peer,
            alive: AtomicBool::new(true),
        })
    }

    pub(crate) fn post(
        &self,
        kind: OpKind,
        local: LocalSlice,
        remote_addr: u64,
        rkey: u32,
    ) -> Completion {
        self.init
            .post(kind, local, &self.ah, self.target.dctn, remote_addr, rkey)
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// No new operations are wanted on it (posted ones cannot be
    /// cancelled: they finish within their retry budget).
    pub(crate) fn fail(&self) {
        self.alive.store(false, Ordering::Release);
    }

    pub(crate) fn peer(&self) -> EndpointAddr {
        self.peer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_names_its_dc_target() {
        let peer = EndpointAddr {
            addr: "10.0.0.7:0".parse().unwrap(),
            responder: 0x12_3456,
        };
        let t = target_of_endpoint(peer);
        assert_eq!(t.dctn, 0x12_3456);
        assert_eq!(t.lid, 0);
        assert_eq!(
            t.gid,
            Some([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7])
        );
        let v6 = EndpointAddr {
            addr: "[fe80::1]:3".parse().unwrap(),
            responder: 1,
        };
        assert_eq!(target_of_endpoint(v6).lid, 3);
    }
}
