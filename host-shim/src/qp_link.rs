//! The shim's RDMA device as the agent drives it: the `QueuePairs` stream
//! ([`run`]) and the queue pairs of hipobj-rc-v2 transfers ([`QpHost`]).
//!
//! In that dialect each transfer has its own RC queue pair, connected to
//! the server's QP named in HTTP headers the agent exchanges. The QP must
//! live on the device where the tenant's memory is registered: here. So
//! the agent sends commands (open, connect, write, await the receive,
//! close) and the shim answers each.
//!
//! What a command can reach: only the bytes of a window this shim minted
//! for a call still in progress ([`QpHost::track`] while the call runs),
//! with that window's access (a GET's QP accepts the peer's writes, a
//! PUT's QP gives the peer no access at all); a queue pair ends with its
//! window, whatever the agent does. At most `max_queue_pairs` exist.
//!
//! For the cuObject dialect the shim mints standard tokens for exactly a
//! window slice, naming its DC target ([`DcHost`], mlx5 with DC only); a
//! window so named is fenced if its call fails ([`Tracked::dc_fence`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fabric::verbs::rc::{RcQp, RcRemote, RecvCompletion, check_recv};
use fabric::{Access, Domain, LocalSlice, OpStatus, RdmaToken, Window};
use s3dma_proto::agent::v1 as pb;
use tokio::sync::{mpsc, oneshot};

use crate::agent_link::AgentLink;

/// Queue pairs at most, by default.
pub const DEFAULT_MAX_QUEUE_PAIRS: usize = 256;

/// Which window a token names: its key on the endpoint (rail) it names.
/// Each rail's device hands out its own keys, so two rails' windows may
/// share an rkey; the endpoint (GID, port, responder) tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct WindowKey {
    gid: [u8; 16],
    port: u16,
    responder: u32,
    rkey: u32,
}

impl WindowKey {
    fn of(token: &RdmaToken) -> WindowKey {
        WindowKey {
            gid: token.gid,
            port: token.lid,
            responder: token.dctn,
            rkey: token.rkey,
        }
    }
}

/// A live window a command may name.
struct LiveWindow {
    addr: u64,
    len: u64,
    access: Access,
    region: fabric::Region,
    /// A standard token named it: DC writes may be in flight after its
    /// call fails (see [`Tracked::dc_exposed`]).
    dc_exposed: Arc<std::sync::atomic::AtomicBool>,
}

/// This host's DC target (the cuObject dialect) and the retry budget a
/// DC write still in flight may take to give up.
pub struct DcHost {
    target: s3dma_wire::dc::DcTarget,
    budget: Duration,
    /// Keeps the DCT alive (its number is in the tokens minted).
    _dct: Box<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for DcHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DcHost")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// Why the shim has no DC target (cuObject-dialect targets are then
/// reached over HTTP through the agent).
#[derive(Debug, thiserror::Error)]
pub enum NoDcTarget {
    /// `fabric.dc.enabled: false`.
    #[error("fabric.dc.enabled is false")]
    Disabled,
    /// The fabric backend is tcp: DC needs verbs.
    #[error("the fabric backend is tcp")]
    Tcp,
    /// A build without the `dc` feature.
    #[error("this host-shim was built without the dc feature")]
    NotBuilt,
    /// The device has no DC (`fabric::verbs::dc::probe`).
    #[error("{0}")]
    Probe(fabric::FabricError),
    /// The device refused the DC target.
    #[error("creating the DC target: {0}")]
    Dct(fabric::FabricError),
    /// The DC retry settings give no bounded budget.
    #[error("{0}")]
    Budget(s3dma_wire::dc::RetryBudgetError),
}

impl DcHost {
    /// The DC target of `domain`'s port (`dc` feature, an mlx5 device with
    /// DC), or why there is none.
    ///
    /// # Errors
    /// The reason ([`NoDcTarget`]): no DC build, no DC on the device, a
    /// refused DCT.
    pub fn create(domain: &Domain, cfg: &crate::config::DcConfig) -> Result<DcHost, NoDcTarget> {
        #[cfg(feature = "dc")]
        {
            use fabric::verbs::dc::{Dct, probe};
            // IBV_ACCESS_LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ: what a
            // window's own registration allows decides, per window.
            const ACCESS: u32 = 1 | 2 | 4;
            probe(domain).map_err(NoDcTarget::Probe)?;
            let dct = Dct::create(
                domain,
                cfg.dc_key,
                ACCESS,
                fabric::verbs::policy::GidChoice {
                    index: cfg.gid_index,
                    allow_link_local: cfg.allow_link_local_gid,
                },
                Some(cfg.traffic_class),
                cfg.hop_limit,
            )
            .map_err(NoDcTarget::Dct)?;
            let budget = s3dma_wire::dc::RetrySettings::default()
                .budget()
                .map_err(NoDcTarget::Budget)?;
            Ok(DcHost {
                target: dct.target(),
                budget,
                _dct: Box::new(dct),
            })
        }
        #[cfg(not(feature = "dc"))]
        {
            let _ = (domain, cfg);
            Err(NoDcTarget::NotBuilt)
        }
    }

    /// How long a DC write may keep retrying after its request ended.
    #[must_use]
    pub fn budget(&self) -> Duration {
        self.budget
    }
}

/// One transfer's queue pair.
struct Entry {
    qp: RcQp,
    window: WindowKey,
    psn: u32,
    /// PUT: the bytes to write.
    slice: LocalSlice,
    receive: bool,
    /// GET: the posted receive's completion (taken once).
    recv: Mutex<Option<oneshot::Receiver<Result<RecvCompletion, OpStatus>>>>,
}

#[derive(Default)]
struct Tables {
    windows: HashMap<WindowKey, LiveWindow>,
    qps: HashMap<u64, Arc<Entry>>,
}

/// The queue pairs of the agent's transfers, on the shim's verbs domain.
pub struct QpHost {
    max_queue_pairs: usize,
    /// `fabric.path_mtu`: the transfer QPs use the lower of it and the
    /// port's active MTU.
    path_mtu: Option<fabric::config::PathMtu>,
    tables: Mutex<Tables>,
    /// Each tenant's DC target by the tenant's protection domain, or why
    /// there are none.
    dc: Result<Vec<(Domain, DcHost)>, NoDcTarget>,
}

impl std::fmt::Debug for QpHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpHost")
            .field("max_queue_pairs", &self.max_queue_pairs)
            .finish_non_exhaustive()
    }
}

/// Keeps a window nameable by commands until dropped; then its queue
/// pairs are destroyed (their operations flushed).
#[derive(Debug)]
pub struct Tracked {
    host: Arc<QpHost>,
    key: WindowKey,
    dc_exposed: Arc<std::sync::atomic::AtomicBool>,
}

impl Tracked {
    /// When a standard token named the window: how long after its call
    /// failed a DC write may still be retrying (the window's key is gone
    /// once it is revoked; its memory goes back to the tenant only after
    /// this).
    #[must_use]
    pub fn dc_fence(&self) -> Option<Duration> {
        self.dc_exposed
            .load(std::sync::atomic::Ordering::Acquire)
            .then(|| {
                self.host
                    .dc
                    .as_ref()
                    .ok()
                    .and_then(|d| d.first())
                    .map(|(_, d)| d.budget())
            })
            .flatten()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let gone: Vec<Arc<Entry>> = {
            let mut t = self.host.lock();
            t.windows.remove(&self.key);
            let ids: Vec<u64> = t
                .qps
                .iter()
                .filter(|(_, e)| e.window == self.key)
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| t.qps.remove(id)).collect()
        };
        for e in &gone {
            e.qp.fail();
        }
    }
}

/// The DC target serving `domain` (a tenant's), among `targets`.
fn dc_target_for<'a, T>(targets: &'a [(Domain, T)], domain: &Domain) -> Option<&'a T> {
    targets.iter().find(|(d, _)| d.same(domain)).map(|(_, t)| t)
}

fn failed(message: impl Into<String>) -> pb::qp_event::Event {
    pb::qp_event::Event::Failed(pb::QpFailed {
        message: message.into(),
    })
}

fn done() -> pb::qp_event::Event {
    pb::qp_event::Event::Done(pb::QpDone {})
}

impl QpHost {
    /// The host over `domain`, when it is a verbs domain (`None`: tcp, no
    /// queue pairs to make).
    #[must_use]
    pub fn new(
        domain: &Domain,
        max_queue_pairs: usize,
        path_mtu: Option<fabric::config::PathMtu>,
        dc: Result<Vec<(Domain, DcHost)>, NoDcTarget>,
    ) -> Option<Arc<QpHost>> {
        (domain.backend() == fabric::Backend::Verbs).then(|| {
            Arc::new(QpHost {
                max_queue_pairs,
                path_mtu,
                tables: Mutex::new(Tables::default()),
                dc,
            })
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue pairs open now.
    #[must_use]
    pub fn queue_pairs(&self) -> usize {
        self.lock().qps.len()
    }

    /// Lets commands name `window` by `token` (the token the shim minted
    /// for it, on its rail's endpoint) until the returned guard drops. A
    /// queue pair opened for it lives in the window's own protection
    /// domain, on the window's (its rail's) device.
    #[must_use]
    pub fn track(self: &Arc<Self>, window: &Window, token: &RdmaToken) -> Tracked {
        let dc_exposed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let key = WindowKey::of(token);
        self.lock().windows.insert(
            key,
            LiveWindow {
                addr: window.addr(),
                len: window.len(),
                access: window.access(),
                region: window.region().clone(),
                dc_exposed: Arc::clone(&dc_exposed),
            },
        );
        Tracked {
            host: Arc::clone(self),
            key,
            dc_exposed,
        }
    }

    /// A standard token for exactly the slice `window` names (a live window
    /// of this shim), naming this host's DC target; the window is marked
    /// so that a failed call fences it.
    fn mint_dc_token(&self, window: &str) -> pb::qp_event::Event {
        let targets = match &self.dc {
            Ok(t) => t,
            Err(why) => return failed(format!("this host has no DC target: {why}")),
        };
        let token: RdmaToken = match window.parse() {
            Ok(t) => t,
            Err(e) => return failed(format!("the window is not a valid token: {e}")),
        };
        let len = u64::from(token.size);
        let target = {
            let t = self.lock();
            let Some(w) = t.windows.get(&WindowKey::of(&token)) else {
                return failed("the token names no live window of this shim");
            };
            let inside = token.addr >= w.addr
                && token
                    .addr
                    .checked_add(len)
                    .is_some_and(|end| end <= w.addr + w.len);
            if !inside {
                return failed("the slice is not inside its window");
            }
            // The DC target in the window's own (its tenant's) domain: the
            // only one through which a DC peer can reach it.
            let Some(dc) = dc_target_for(targets, w.region.domain()) else {
                return failed("the window's tenant has no DC target");
            };
            w.dc_exposed
                .store(true, std::sync::atomic::Ordering::Release);
            dc.target
        };
        match s3dma_wire::dc::mint_token(target, token.addr, len, token.rkey) {
            Ok(t) => pb::qp_event::Event::DcToken(pb::QpDcToken {
                token: t.to_string(),
            }),
            Err(e) => failed(format!("minting the standard token: {e}")),
        }
    }

    /// Answers one command (`None`: a close, not answered).
    pub async fn handle(&self, cmd: pb::QpCommand) -> Option<pb::QpEvent> {
        use pb::qp_command::Command;
        let event = match cmd.command? {
            Command::Open(o) => self.open(cmd.id, &o),
            Command::Connect(c) => self.connect(&c),
            Command::Write(w) => self.write(&w).await,
            Command::AwaitReceive(a) => self.await_receive(&a).await,
            Command::MintDcToken(m) => self.mint_dc_token(&m.window),
            Command::Close(c) => {
                let e = self.lock().qps.remove(&c.qp);
                if let Some(e) = e {
                    e.qp.fail();
                }
                return None;
            }
        };
        Some(pb::QpEvent {
            id: cmd.id,
            event: Some(event),
        })
    }

    fn entry(&self, id: u64) -> Result<Arc<Entry>, pb::qp_event::Event> {
        self.lock()
            .qps
            .get(&id)
            .cloned()
            .ok_or_else(|| failed(format!("no queue pair {id} (closed, or its window ended)")))
    }

    fn open(&self, id: u64, o: &pb::QpOpen) -> pb::qp_event::Event {
        let token: RdmaToken = match o.window.parse() {
            Ok(t) => t,
            Err(e) => return failed(format!("the window is not a valid token: {e}")),
        };
        let len = u64::from(token.size);
        let need = if o.receive {
            Access::REMOTE_WRITE
        } else {
            Access::REMOTE_READ
        };
        // The slice must lie inside a live window of this shim, with the
        // access the transfer needs.
        let (region, offset) = {
            let t = self.lock();
            if t.qps.contains_key(&id) {
                return failed(format!("queue pair {id} exists already"));
            }
            if t.qps.len() >= self.max_queue_pairs {
                return failed(format!(
                    "{} queue pairs are open already (fabric.max_queue_pairs)",
                    self.max_queue_pairs
                ));
            }
            let Some(w) = t.windows.get(&WindowKey::of(&token)) else {
                return failed("the token names no live window of this shim");
            };
            let inside = token.addr >= w.addr
                && token
                    .addr
                    .checked_add(len)
                    .is_some_and(|end| end <= w.addr + w.len);
            if !inside || len == 0 {
                return failed("the slice is not inside its window");
            }
            if !w.access.contains(need) {
                return failed(format!("the window does not allow {need}"));
            }
            (w.region.clone(), token.addr - w.region.addr())
        };
        let (Ok(offset), Ok(n)) = (usize::try_from(offset), usize::try_from(len)) else {
            return failed("the slice does not fit this machine's addresses");
        };
        let slice = match region.slice(offset, n) {
            Ok(s) => s,
            Err(e) => return failed(format!("the slice: {e}")),
        };
        let remote = if o.receive {
            Access::REMOTE_WRITE
        } else {
            Access::NONE
        };
        // In the window's own (its tenant's) protection domain: the peer's
        // writes can reach that tenant's memory only, and of it only what
        // the window's key allows.
        let qp = match RcQp::create(region.domain(), remote) {
            Ok(q) => q,
            Err(e) => return failed(format!("creating the queue pair: {e}")),
        };
        let recv = if o.receive {
            match qp.post_recv() {
                Ok(fut) => {
                    let (tx, rx) = oneshot::channel();
                    tokio::spawn(async move {
                        let _ = tx.send(fut.await);
                    });
                    Some(rx)
                }
                Err(e) => return failed(format!("posting the receive: {e}")),
            }
        } else {
            None
        };
        let local = qp.local();
        let entry = Arc::new(Entry {
            qp,
            window: WindowKey::of(&token),
            psn: o.psn & 0x00ff_ffff,
            slice,
            receive: o.receive,
            recv: Mutex::new(recv),
        });
        {
            let mut t = self.lock();
            // The window may have ended meanwhile: then so does the QP.
            if !t.windows.contains_key(&WindowKey::of(&token)) {
                return failed("the window ended");
            }
            t.qps.insert(id, entry);
        }
        pb::qp_event::Event::Opened(pb::QpOpened {
            qpn: local.qpn,
            gid: local.gid.to_vec(),
            port: u32::from(local.port),
            lid: u32::from(local.lid),
            addr: token.addr,
            rkey: token.rkey,
            length: token.size,
        })
    }

    fn connect(&self, c: &pb::QpConnect) -> pb::qp_event::Event {
        let e = match self.entry(c.qp) {
            Ok(e) => e,
            Err(f) => return f,
        };
        let Ok(gid) = <[u8; 16]>::try_from(c.remote_gid.as_slice()) else {
            return failed("the peer's GID is not 16 bytes");
        };
        if c.remote_qpn == 0 || c.remote_qpn > 0x00ff_ffff {
            return failed("the peer's QP number is not 1..=0xffffff");
        }
        let remote = RcRemote {
            qpn: c.remote_qpn,
            gid,
            lid: u16::try_from(c.remote_lid).unwrap_or(0),
            psn: c.remote_psn,
        };
        match e.qp.connect_with_mtu(&remote, e.psn, self.path_mtu) {
            Ok(()) => done(),
            Err(err) => failed(format!("connecting the queue pair: {err}")),
        }
    }

    async fn write(&self, w: &pb::QpWrite) -> pb::qp_event::Event {
        let e = match self.entry(w.qp) {
            Ok(e) => e,
            Err(f) => return f,
        };
        if e.receive {
            return failed("a GET's queue pair does not write");
        }
        let op =
            e.qp.write_with_imm(e.slice.clone(), w.remote_addr, w.remote_rkey, w.imm);
        drop(e);
        match op.await {
            Ok(()) => done(),
            Err(err) => failed(format!("the RDMA WRITE_WITH_IMM failed: {err}")),
        }
    }

    async fn await_receive(&self, a: &pb::QpAwaitReceive) -> pb::qp_event::Event {
        let e = match self.entry(a.qp) {
            Ok(e) => e,
            Err(f) => return f,
        };
        let rx = e.recv.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(e);
        let Some(rx) = rx else {
            return failed("no receive is posted on this queue pair (or it was awaited)");
        };
        match rx.await {
            Ok(Ok(got)) => match check_recv(&got, a.imm, a.length) {
                Ok(()) => done(),
                Err(why) => failed(format!("the server's write: {why}")),
            },
            Ok(Err(status)) => failed(format!("the receive failed: {status:?}")),
            Err(_) => failed("the queue pair was closed"),
        }
    }
}

/// Keeps the `QueuePairs` stream to the agent open while the shim runs:
/// reopens it (after 0.5–1 s) whenever it ends; answers each command in a
/// task of its own, except a close, done in order.
pub async fn run(agent: AgentLink, host: Arc<QpHost>) {
    loop {
        let (tx, mut rx) = mpsc::channel::<pb::QpEvent>(256);
        let outbound = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        if let Ok((mut client, req)) = agent.authorized(outbound) {
            match client.queue_pairs(req).await {
                Ok(resp) => {
                    tracing::debug!("queue-pair link to the dpu-agent open");
                    let mut commands = resp.into_inner();
                    while let Ok(Some(cmd)) = commands.message().await {
                        // A close is done here, before any later command:
                        // a transfer redone on another rail opens its new
                        // queue pair only after the failed one is gone (it
                        // can no longer be written late).
                        if matches!(cmd.command, Some(pb::qp_command::Command::Close(_))) {
                            let _ = host.handle(cmd).await;
                            continue;
                        }
                        let (host, tx) = (Arc::clone(&host), tx.clone());
                        tokio::spawn(async move {
                            if let Some(ev) = host.handle(cmd).await {
                                let _ = tx.send(ev).await;
                            }
                        });
                    }
                    tracing::debug!("queue-pair link to the dpu-agent ended");
                }
                Err(status) => {
                    tracing::debug!(error = %s3dma_service::Escaped(status.message()), "opening the queue-pair link failed");
                }
            }
        }
        let wait = Duration::from_millis(500 + rand::random_range(0..500));
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each tenant's DC target is found by the tenant's own domain, and a
    /// window of a domain without one gets none (never another tenant's).
    #[test]
    fn a_window_is_named_only_by_its_own_tenants_dc_target() {
        let (a, b, stranger) = (Domain::tcp(), Domain::tcp(), Domain::tcp());
        let targets = vec![(a.clone(), "target-a"), (b.clone(), "target-b")];
        assert_eq!(dc_target_for(&targets, &a), Some(&"target-a"));
        assert_eq!(dc_target_for(&targets, &b.clone()), Some(&"target-b"));
        assert_eq!(dc_target_for(&targets, &stranger), None);
    }

    /// Two rails' devices may hand out the same rkey: a token names its
    /// window by the endpoint too, so rail 1's token never reaches rail
    /// 0's window (nor its device's protection domain).
    #[test]
    fn a_window_is_named_by_its_rails_endpoint_and_key() {
        let rail0: RdmaToken =
            "00007f0000001000:00001000:00000101:0050:000001:1:00000000000000000000ffff0a4d0001"
                .parse()
                .unwrap();
        let rail1: RdmaToken =
            "00007f0000001000:00001000:00000101:0050:000001:1:00000000000000000000ffff0a4d0101"
                .parse()
                .unwrap();
        assert_eq!(rail0.rkey, rail1.rkey);
        assert_ne!(WindowKey::of(&rail0), WindowKey::of(&rail1));
        // A slice of a window names the same window.
        let slice = rail1.slice(0x800, 0x100).unwrap();
        assert_eq!(WindowKey::of(&slice), WindowKey::of(&rail1));
        // Another port or responder on the same address is another endpoint.
        let other_port = RdmaToken { lid: 0x51, ..rail0 };
        assert_ne!(WindowKey::of(&other_port), WindowKey::of(&rail0));
    }
}
