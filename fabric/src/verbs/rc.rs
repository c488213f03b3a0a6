//! A queue pair for one transfer of the hipobj-rc-v2 dialect: unlike
//! s3dma's sessions (connected by s3dma's own out-of-band exchange), its
//! peer's QP number, GID and PSN arrive in HTTP headers, and the bytes move
//! by RDMA WRITE_WITH_IMM whose immediate is the transfer's cookie.
//!
//! The QP is created in INIT (so a receive can be posted before the peer
//! is ready), brought to RTR/RTS against the peer with [`RcQp::connect`],
//! and destroyed when the [`RcQp`] and its in-flight operations are gone.

use std::sync::Arc;

use rdma_sys::{ibv_wc_opcode, ibv_wr_opcode};
use s3dma_wire::qp::QpInfo;
use tokio::sync::oneshot;
use tracing::debug;

use super::conn::verbs_of;
use super::qp::{self, QueuePair, Requester};
use super::{access_flags, policy};
use crate::access::Access;
use crate::completion::Completion;
use crate::error::{OpStatus, Result};
use crate::region::{Domain, LocalSlice};

/// This side of the QP, as a token or header advertises it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcLocal {
    /// The QP number.
    pub qpn: u32,
    /// The port's GID (RoCE v2, IPv4-mapped when the port has one).
    pub gid: [u8; 16],
    /// The port number.
    pub port: u8,
    /// The port's LID (0 on RoCE).
    pub lid: u16,
    /// The port's active MTU (verbs enum: 1 = 256 … 5 = 4096).
    pub active_mtu: u8,
}

/// The peer's QP, from its token and headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcRemote {
    /// Its QP number.
    pub qpn: u32,
    /// Its GID.
    pub gid: [u8; 16],
    /// Its LID (0 on RoCE).
    pub lid: u16,
    /// Its send PSN: our receive PSN.
    pub psn: u32,
}

/// What a receive consumed by the peer's WRITE_WITH_IMM reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvCompletion {
    /// Whether the completion is `IBV_WC_RECV_RDMA_WITH_IMM`.
    pub rdma_write_with_imm: bool,
    /// The immediate, in host order (`None`: the completion had none).
    pub imm: Option<u32>,
    /// The bytes the WRITE placed.
    pub byte_len: u32,
}

/// One transfer's RC queue pair, its completion queue and completion task.
pub struct RcQp {
    req: Arc<Requester>,
    local: RcLocal,
    sgid_index: u8,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for RcQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcQp").field("local", &self.local).finish()
    }
}

impl RcQp {
    /// Creates a QP on `domain`'s device in INIT, accepting `remote`
    /// operations on this side's memory (`REMOTE_WRITE` for a side that
    /// receives by the peer's WRITE), and starts its completion task. Must
    /// run in a tokio runtime.
    ///
    /// # Errors
    /// Not a verbs domain; a verbs call failed.
    pub fn create(domain: &Domain, remote: Access) -> Result<RcQp> {
        RcQp::create_with_gid(domain, remote, None)
    }

    /// [`RcQp::create`] sending from a GID of `kind` (a server takes the
    /// kind of the client's GID, which can only reach a GID of its own
    /// kind); `None`: the port's preferred GID (RoCE v2, IPv4-mapped
    /// first).
    ///
    /// # Errors
    /// Not a verbs domain; the port has no GID of that kind
    /// ([`FabricError::Unavailable`](crate::FabricError::Unavailable)); a
    /// verbs call failed.
    pub fn create_with_gid(
        domain: &Domain,
        remote: Access,
        kind: Option<policy::GidKind>,
    ) -> Result<RcQp> {
        let v = verbs_of(domain)?;
        let gid = match kind {
            None => v.port.gid,
            Some(k) => policy::select_gid_of_kind(&v.gids, v.ethernet, k).ok_or_else(|| {
                crate::FabricError::Unavailable {
                    reason: format!(
                        "port {} has no {k:?} GID (a peer with such a GID cannot be reached from it)",
                        v.port.port
                    ),
                }
            })?,
        };
        let qp = QueuePair::create(v.context(), v.pd(), true)?;
        qp.modify(
            qp::init_attr(v.port.port, access_flags(remote | Access::LOCAL_WRITE)),
            "ibv_modify_qp(INIT)",
        )?;
        let local = RcLocal {
            qpn: qp.qpn(),
            gid: gid.gid,
            port: v.port.port,
            lid: v.port.lid,
            active_mtu: v.port.active_mtu,
        };
        let sgid_index = gid.index;
        let req = Requester::new(qp, domain.clone());
        let task = {
            let req = req.clone();
            tokio::spawn(async move {
                if let Err(e) = req.clone().run_completions().await {
                    debug!(error = %e, "transfer QP completion loop failed");
                    req.fail_all(OpStatus::Flushed);
                }
            })
        };
        Ok(RcQp {
            req,
            local,
            sgid_index,
            task,
        })
    }

    /// This side.
    #[must_use]
    pub fn local(&self) -> RcLocal {
        self.local
    }

    /// Brings the QP to RTR and RTS against `remote`, sending from
    /// `local_psn`, at the port's active MTU (the peers' choice: neither
    /// side tells the other its MTU); [`RcQp::connect_with_mtu`] with no
    /// `path_mtu` knob.
    ///
    /// # Errors
    /// A verbs call failed (a GID the port cannot route to, a bad QPN).
    pub fn connect(&self, remote: &RcRemote, local_psn: u32) -> Result<()> {
        self.connect_with_mtu(remote, local_psn, None)
    }

    /// [`RcQp::connect`] at the lower of the port's active MTU and
    /// `path_mtu` (`None`: the active MTU): the knob for a peer whose port
    /// reports a lower MTU than this one (emulated NICs often report 1024),
    /// which this dialect cannot learn from the peer.
    ///
    /// # Errors
    /// A verbs call failed (a GID the port cannot route to, a bad QPN).
    pub fn connect_with_mtu(
        &self,
        remote: &RcRemote,
        local_psn: u32,
        path_mtu: Option<crate::config::PathMtu>,
    ) -> Result<()> {
        let mtu = crate::config::PathMtu::cap(path_mtu, self.local.active_mtu);
        let info = QpInfo {
            qpn: remote.qpn,
            psn: remote.psn & 0x00ff_ffff,
            lid: remote.lid,
            mtu,
            gid: remote.gid,
        };
        self.req.qp.modify(
            qp::rtr_attr(
                self.local.port,
                self.sgid_index,
                policy::path_mtu(mtu, mtu),
                &info,
            ),
            "ibv_modify_qp(RTR)",
        )?;
        self.req
            .qp
            .modify(qp::rts_attr(local_psn & 0x00ff_ffff), "ibv_modify_qp(RTS)")
    }

    /// The path MTU the device holds for this QP (`ibv_mtu` code, 1 = 256
    /// ... 5 = 4096; 0 before it is connected).
    ///
    /// # Errors
    /// The verbs query failed.
    pub fn path_mtu(&self) -> Result<u8> {
        self.req.qp.path_mtu()
    }

    /// Posts the one receive the peer's WRITE_WITH_IMM consumes; the
    /// returned future resolves with its completion.
    ///
    /// # Errors
    /// A receive is already posted; the verbs call failed.
    pub fn post_recv(
        &self,
    ) -> Result<impl Future<Output = std::result::Result<RecvCompletion, OpStatus>> + use<>> {
        let rx: oneshot::Receiver<qp::RecvDone> = self.req.post_recv()?;
        Ok(async move {
            let done = rx.await.map_err(|_| OpStatus::Flushed)?;
            done.status?;
            Ok(RecvCompletion {
                rdma_write_with_imm: done.opcode == ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM,
                imm: done.imm,
                byte_len: done.byte_len,
            })
        })
    }

    /// RDMA WRITE_WITH_IMM of `local` to the peer's `remote_addr`/`rkey`,
    /// immediate `imm` (sent in network order). The operation owns `local`
    /// until it completes.
    pub fn write_with_imm(
        &self,
        local: LocalSlice,
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    ) -> Completion {
        self.req.post(
            "RDMA WRITE_WITH_IMM",
            ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
            Some(imm),
            local,
            remote_addr,
            rkey,
        )
    }

    /// Moves the QP to ERR: every outstanding operation and the posted
    /// receive complete with a flush error (a cancelled or expired transfer).
    pub fn fail(&self) {
        if let Err(e) = self.req.qp.modify(qp::err_attr(), "ibv_modify_qp(ERR)") {
            debug!(qpn = self.local.qpn, error = %e, "failing a transfer QP");
        }
    }
}

impl Drop for RcQp {
    fn drop(&mut self) {
        // The completion task holds the requester (and so the QP and its
        // in-flight buffers) until it ends: flush, then stop it.
        self.fail();
        self.task.abort();
    }
}

/// Checks what a receive reported against what the transfer expects: a
/// WRITE_WITH_IMM carrying `cookie` and exactly `len` bytes.
///
/// # Errors
/// What does not match, in words.
pub fn check_recv(
    got: &RecvCompletion,
    cookie: u32,
    len: u32,
) -> std::result::Result<(), &'static str> {
    if !got.rdma_write_with_imm {
        return Err("the completion is not an RDMA WRITE with immediate");
    }
    if got.imm != Some(cookie) {
        return Err("the immediate is not the transfer's cookie");
    }
    if got.byte_len != len {
        return Err("the byte count is not the transfer's size");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receives_are_checked_for_opcode_cookie_and_length() {
        let ok = RecvCompletion {
            rdma_write_with_imm: true,
            imm: Some(0xdead_beef),
            byte_len: 4096,
        };
        assert_eq!(check_recv(&ok, 0xdead_beef, 4096), Ok(()));
        assert!(check_recv(&ok, 0xdead_beee, 4096).is_err());
        assert!(check_recv(&ok, 0xdead_beef, 4095).is_err());
        let send = RecvCompletion {
            rdma_write_with_imm: false,
            ..ok
        };
        assert!(check_recv(&send, 0xdead_beef, 4096).is_err());
        let no_imm = RecvCompletion { imm: None, ..ok };
        assert!(check_recv(&no_imm, 0xdead_beef, 4096).is_err());
    }

    #[test]
    fn without_a_device_creating_a_transfer_qp_is_an_error() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // The tcp domain is not a verbs domain; on a host without a
            // device a verbs domain does not open at all.
            assert!(RcQp::create(&Domain::tcp(), Access::REMOTE_WRITE).is_err());
        });
    }
}
