//! Verbs endpoints and sessions: RC queue pairs connected by an out-of-band
//! exchange over an authenticated TCP connection (the same handshake as the
//! tcp fabric, then [`QpInfo`] both ways). The TCP connection stays open as
//! the pair's liveness signal; the responder destroys its QP when it closes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tracing::debug;

use s3dma_wire::frame::OpKind;
use s3dma_wire::qp::QpInfo;
use s3dma_wire::{EndpointAddr, FabricKey};

use super::qp::{QueuePair, Requester};
use super::{VerbsDomain, access_flags, policy};
use crate::access::Access;
use crate::completion::Completion;
use crate::error::{FabricError, OpStatus, Result};
use crate::handshake::{accept_handshake_as, connect_handshake};
use crate::listener::Listener;
use crate::options::EndpointConfig;
use crate::region::{Domain, LocalSlice};
use crate::sock as io;

pub(crate) fn verbs_of(domain: &Domain) -> Result<&VerbsDomain> {
    domain
        .registrar()
        .and_then(|r| r.as_any().downcast_ref::<VerbsDomain>())
        .ok_or_else(|| FabricError::BackendMismatch("not a verbs domain".into()))
}

async fn exchange(stream: &TcpStream, local: &QpInfo, peer: &str) -> Result<QpInfo> {
    let ioerr = |e| FabricError::io(format!("queue-pair exchange with {peer}"), e);
    io::send_buf(stream, &local.encode()).await.map_err(ioerr)?;
    let mut b = [0u8; QpInfo::LEN];
    if !io::recv_exact(stream, &mut b).await.map_err(ioerr)? {
        return Err(FabricError::Handshake {
            peer: peer.into(),
            reason: "closed during the queue-pair exchange".into(),
        });
    }
    QpInfo::decode(&b).map_err(|e| FabricError::Protocol {
        peer: peer.into(),
        source: e,
    })
}

fn local_info(v: &VerbsDomain, qp: &QueuePair, psn: u32) -> QpInfo {
    QpInfo {
        qpn: qp.qpn(),
        psn,
        lid: v.port.lid,
        mtu: v.port.active_mtu,
        gid: v.port.gid.gid,
    }
}

/// A verbs endpoint: accepts out-of-band connections and brings up one
/// responder QP per session. The NIC serves the one-sided operations.
pub(crate) struct VerbsEndpoint {
    listener: Listener,
    identity: EndpointAddr,
}

impl std::fmt::Debug for VerbsEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsEndpoint")
            .field("local", &self.listener.local_addr())
            .field("identity", &self.identity)
            .finish()
    }
}

impl VerbsEndpoint {
    pub(crate) async fn listen(domain: Domain, config: &EndpointConfig) -> Result<VerbsEndpoint> {
        verbs_of(&domain)?;
        let key = config.fabric_key.clone();
        let timing = Timing {
            tuning: io::Tuning {
                socket_buffer: None,
                dead_peer_timeout: config.dead_peer_timeout,
            },
            handshake_timeout: config.handshake_timeout,
        };
        let isolated: Arc<[(u32, Domain)]> = config.isolated_responders.clone().into();
        let mut identity = None;
        let listener = Listener::bind(config.bind, "verbs endpoint", config.caps(), |local| {
            let me = config.identity(local);
            identity = Some(me);
            move |stream, peer| {
                serve(
                    stream,
                    timing,
                    peer,
                    domain.clone(),
                    isolated.clone(),
                    key.clone(),
                    me,
                )
            }
        })
        .await?;
        let identity = identity.expect("the listener made its server");
        Ok(VerbsEndpoint { listener, identity })
    }

    /// What tokens carry (the bound address, or the advertised one).
    pub(crate) fn identity(&self) -> EndpointAddr {
        self.identity
    }

    pub(crate) async fn shutdown(self) {
        self.listener.shutdown().await;
    }
}

/// The out-of-band connection's socket options and handshake deadline.
#[derive(Debug, Clone, Copy)]
struct Timing {
    tuning: io::Tuning,
    handshake_timeout: Duration,
}

async fn serve(
    stream: TcpStream,
    timing: Timing,
    peer: SocketAddr,
    domain: Domain,
    isolated: Arc<[(u32, Domain)]>,
    key: FabricKey,
    me: EndpointAddr,
) -> Result<()> {
    let Timing {
        tuning,
        handshake_timeout,
    } = timing;
    // Keepalive on the out-of-band connection: a requester that went away
    // without closing it (a host gone, a cut link) frees its queue pair
    // within the dead-peer timeout.
    io::tune(&stream, tuning).map_err(|e| FabricError::io("tune verbs out-of-band socket", e))?;
    let also: Vec<u32> = isolated.iter().map(|(r, _)| *r).collect();
    let hello = tokio::time::timeout(
        handshake_timeout,
        accept_handshake_as(&stream, peer, &key, &me, &also),
    )
    .await
    .map_err(|_| FabricError::Handshake {
        peer: peer.to_string(),
        reason: "timed out".into(),
    })??;
    // The responder the requester proved it dialled decides the protection
    // domain its queue pair lives in: it reaches only that domain's memory.
    let domain = isolated
        .iter()
        .find(|(r, _)| *r == hello.target.responder)
        .map_or(domain, |(_, d)| d.clone());
    let v = verbs_of(&domain)?;
    let qp = QueuePair::create(v.context(), v.pd(), false)?;
    let psn = rand::random::<u32>() & 0x00ff_ffff;
    let remote = tokio::time::timeout(
        handshake_timeout,
        exchange(&stream, &local_info(v, &qp, psn), &peer.to_string()),
    )
    .await
    .map_err(|_| FabricError::Handshake {
        peer: peer.to_string(),
        reason: "timed out in the queue-pair exchange".into(),
    })??;
    qp.connect(
        v.port.port,
        v.port.gid.index,
        policy::path_mtu(v.port.active_mtu, remote.mtu),
        psn,
        &remote,
        access_flags(Access::REMOTE_READ | Access::REMOTE_WRITE),
    )?;
    // Keep the QP until the requester goes away.
    let mut b = [0u8; 1];
    let _ = io::recv_exact(&stream, &mut b).await;
    drop(qp);
    Ok(())
}

/// A verbs session: one RC QP to the endpoint, completions driven by a
/// tokio task on the completion channel.
pub(crate) struct VerbsSession {
    req: Arc<Requester>,
    peer: EndpointAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for VerbsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsSession")
            .field("peer", &self.peer)
            .finish()
    }
}

impl VerbsSession {
    pub(crate) async fn connect(
        domain: &Domain,
        target: EndpointAddr,
        key: &FabricKey,
        dead_peer_timeout: Duration,
    ) -> Result<VerbsSession> {
        let v = verbs_of(domain)?;
        io::check_dead_peer_timeout(dead_peer_timeout)?;
        let stream = TcpStream::connect(target.addr)
            .await
            .map_err(|e| FabricError::io(format!("connect to verbs endpoint {target}"), e))?;
        let tuning = io::Tuning {
            socket_buffer: None,
            dead_peer_timeout,
        };
        io::tune(&stream, tuning)
            .map_err(|e| FabricError::io("tune verbs out-of-band socket", e))?;
        connect_handshake(&stream, target, key, rand::random(), 0, 1).await?;
        let qp = QueuePair::create(v.context(), v.pd(), true)?;
        let psn = rand::random::<u32>() & 0x00ff_ffff;
        let remote = exchange(&stream, &local_info(v, &qp, psn), &target.to_string()).await?;
        qp.connect(
            v.port.port,
            v.port.gid.index,
            policy::path_mtu(v.port.active_mtu, remote.mtu),
            psn,
            &remote,
            access_flags(Access::LOCAL_WRITE),
        )?;
        let req = Requester::new(qp, domain.clone());
        let cq_task = {
            let req = req.clone();
            tokio::spawn(async move {
                if let Err(e) = req.clone().run_completions().await {
                    debug!(error = %e, "verbs completion loop failed");
                    req.fail_all(OpStatus::Flushed);
                }
            })
        };
        // The out-of-band connection is the liveness signal of the pair.
        let oob_task = tokio::spawn(async move {
            let mut b = [0u8; 1];
            let _ = io::recv_exact(&stream, &mut b).await;
        });
        Ok(VerbsSession {
            req,
            peer: target,
            tasks: vec![cq_task, oob_task],
        })
    }

    pub(crate) fn post(
        &self,
        kind: OpKind,
        local: LocalSlice,
        remote_addr: u64,
        rkey: u32,
    ) -> Completion {
        let opcode = match kind {
            OpKind::Write => rdma_sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            OpKind::Read => rdma_sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
        };
        self.req
            .post(kind.name(), opcode, None, local, remote_addr, rkey)
    }

    pub(crate) fn is_alive(&self) -> bool {
        !self.req.is_dead()
    }

    /// Moves the QP to ERR: the device flushes every outstanding work
    /// request, and each completes (with a flush error) through the
    /// completion loop once the device no longer touches its buffer.
    pub(crate) fn fail(&self) {
        if let Err(e) = self
            .req
            .qp
            .modify(super::qp::err_attr(), "ibv_modify_qp(ERR)")
        {
            debug!(peer = %self.peer, error = %e, "failing a verbs session");
        }
    }

    pub(crate) fn peer(&self) -> EndpointAddr {
        self.peer
    }
}

impl Drop for VerbsSession {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
