//! RC queue-pair state transitions (attribute builders are pure and tested)
//! and the queue pair / completion queue objects.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use rdma_sys::*;
use s3dma_wire::qp::QpInfo;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use super::policy;
use crate::error::{FabricError, OpError, OpStatus, Result};
use crate::region::{Domain, LocalSlice};

/// Send-queue depth of a session's QP; more operations wait in a backlog.
pub(super) const MAX_SEND_WR: u32 = 512;
/// Outstanding RDMA READs a QP may issue / accept.
pub(super) const MAX_RD_ATOMIC: u8 = 16;

pub(super) fn mask(bits: &[ibv_qp_attr_mask]) -> i32 {
    bits.iter().fold(0u32, |m, b| m | b.0) as i32
}

/// RESET → INIT: port, pkey and the remote access the QP accepts.
pub(super) fn init_attr(port: u8, access: u32) -> (ibv_qp_attr, i32) {
    // SAFETY: ibv_qp_attr is a plain C struct for which all-zero is valid.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = ibv_qp_state::IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = port;
    a.qp_access_flags = access;
    (
        a,
        mask(&[
            ibv_qp_attr_mask::IBV_QP_STATE,
            ibv_qp_attr_mask::IBV_QP_PKEY_INDEX,
            ibv_qp_attr_mask::IBV_QP_PORT,
            ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS,
        ]),
    )
}

/// Any state → ERR: the device stops the QP and completes every
/// outstanding work request with a flush error.
pub(super) fn err_attr() -> (ibv_qp_attr, i32) {
    // SAFETY: as in `init_attr`.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = ibv_qp_state::IBV_QPS_ERR;
    (a, mask(&[ibv_qp_attr_mask::IBV_QP_STATE]))
}

/// INIT → RTR: the remote QP, its GID (RoCE v2 needs a GRH), the path MTU.
pub(super) fn rtr_attr(port: u8, sgid_index: u8, mtu: u8, remote: &QpInfo) -> (ibv_qp_attr, i32) {
    // SAFETY: as in `init_attr`.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = ibv_qp_state::IBV_QPS_RTR;
    a.path_mtu = mtu as u32;
    a.dest_qp_num = remote.qpn;
    a.rq_psn = remote.psn;
    a.max_dest_rd_atomic = MAX_RD_ATOMIC;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = remote.lid;
    a.ah_attr.sl = 0;
    a.ah_attr.src_path_bits = 0;
    a.ah_attr.port_num = port;
    if remote.gid != [0; 16] {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
        a.ah_attr.grh.sgid_index = sgid_index;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.grh.traffic_class = 0;
        a.ah_attr.grh.flow_label = 0;
    }
    (
        a,
        mask(&[
            ibv_qp_attr_mask::IBV_QP_STATE,
            ibv_qp_attr_mask::IBV_QP_AV,
            ibv_qp_attr_mask::IBV_QP_PATH_MTU,
            ibv_qp_attr_mask::IBV_QP_DEST_QPN,
            ibv_qp_attr_mask::IBV_QP_RQ_PSN,
            ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC,
            ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER,
        ]),
    )
}

/// Transport retries before an operation fails with "retry exceeded". Not 7:
/// Soft-RoCE (rdma_rxe) treats a retry count of 7 as "retry forever", so an
/// operation to a dead peer would never complete (found in the Soft-RoCE VM).
pub(super) const RETRY_COUNT: u8 = 6;

/// RTR → RTS: our PSN, retry budget (timeout 14 ≈ 67 ms × [`RETRY_COUNT`]
/// retries before "retry exceeded"), READs in flight.
pub(super) fn rts_attr(local_psn: u32) -> (ibv_qp_attr, i32) {
    rts_attr_with(local_psn, 14, RETRY_COUNT, 7)
}

/// RTR → RTS with the given PSN and retry settings (local ACK timeout
/// exponent, transport retries, RNR retries), READs in flight.
pub(super) fn rts_attr_with(
    local_psn: u32,
    timeout: u8,
    retry_count: u8,
    rnr_retry: u8,
) -> (ibv_qp_attr, i32) {
    // SAFETY: as in `init_attr`.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = ibv_qp_state::IBV_QPS_RTS;
    a.sq_psn = local_psn;
    a.timeout = timeout;
    a.retry_cnt = retry_count;
    a.rnr_retry = rnr_retry;
    a.max_rd_atomic = MAX_RD_ATOMIC;
    (
        a,
        mask(&[
            ibv_qp_attr_mask::IBV_QP_STATE,
            ibv_qp_attr_mask::IBV_QP_TIMEOUT,
            ibv_qp_attr_mask::IBV_QP_RETRY_CNT,
            ibv_qp_attr_mask::IBV_QP_RNR_RETRY,
            ibv_qp_attr_mask::IBV_QP_SQ_PSN,
            ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC,
        ]),
    )
}

pub(super) fn verbs_err(what: &str) -> FabricError {
    FabricError::Verbs {
        what: what.into(),
        source: std::io::Error::last_os_error(),
    }
}

pub(super) fn check(rc: i32, what: &str) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(FabricError::Verbs {
            what: what.into(),
            source: std::io::Error::from_raw_os_error(rc.abs()),
        })
    }
}

struct Fd(RawFd);
impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// An RC queue pair with its completion queue and (for requesters) a
/// completion channel. Destroyed on drop, QP first.
pub(crate) struct QueuePair {
    pub(crate) qp: NonNull<ibv_qp>,
    cq: NonNull<ibv_cq>,
    channel: Option<NonNull<ibv_comp_channel>>,
}

// SAFETY: verbs objects may be used from any thread; libibverbs serialises
// posting and polling internally per QP / CQ.
unsafe impl Send for QueuePair {}
// SAFETY: see Send.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// Creates an RC QP on `pd`; `with_channel` adds a completion channel.
    pub(crate) fn create(
        ctx: *mut ibv_context,
        pd: *mut ibv_pd,
        with_channel: bool,
    ) -> Result<QueuePair> {
        let channel = if with_channel {
            // SAFETY: `ctx` is an open device context.
            let ch = unsafe { ibv_create_comp_channel(ctx) };
            Some(NonNull::new(ch).ok_or_else(|| verbs_err("ibv_create_comp_channel"))?)
        } else {
            None
        };
        let ch_ptr = channel.map_or(std::ptr::null_mut(), |c| c.as_ptr());
        // SAFETY: `ctx` is open; the channel (if any) belongs to it.
        let cq = unsafe {
            ibv_create_cq(
                ctx,
                (MAX_SEND_WR * 2) as i32,
                std::ptr::null_mut(),
                ch_ptr,
                0,
            )
        };
        let Some(cq) = NonNull::new(cq) else {
            let e = verbs_err("ibv_create_cq");
            if let Some(c) = channel {
                // SAFETY: created above, unused.
                unsafe { ibv_destroy_comp_channel(c.as_ptr()) };
            }
            return Err(e);
        };
        // SAFETY: an all-zero init attr is valid; we fill what matters.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.as_ptr();
        init.recv_cq = cq.as_ptr();
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        init.cap.max_send_wr = MAX_SEND_WR;
        init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        // SAFETY: `pd` and `cq` are live; `init` is fully initialised.
        let qp = unsafe { ibv_create_qp(pd, &mut init) };
        let Some(qp) = NonNull::new(qp) else {
            let e = verbs_err("ibv_create_qp");
            // SAFETY: created above, unused.
            unsafe {
                ibv_destroy_cq(cq.as_ptr());
                if let Some(c) = channel {
                    ibv_destroy_comp_channel(c.as_ptr());
                }
            }
            return Err(e);
        };
        Ok(QueuePair { qp, cq, channel })
    }

    pub(crate) fn qpn(&self) -> u32 {
        // SAFETY: the QP is live.
        unsafe { self.qp.as_ref().qp_num }
    }

    pub(crate) fn modify(&self, (mut attr, mask): (ibv_qp_attr, i32), what: &str) -> Result<()> {
        // SAFETY: the QP is live and `attr`/`mask` are consistent.
        check(
            unsafe { ibv_modify_qp(self.qp.as_ptr(), &mut attr, mask) },
            what,
        )
    }

    /// The path MTU the device holds for this QP (`ibv_mtu` code; 0
    /// before RTR).
    pub(crate) fn path_mtu(&self) -> Result<u8> {
        // SAFETY: plain C structs, all-zero is a valid initial state; the
        // device fills them.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        check(
            // SAFETY: the QP is live; `attr` and `init` are valid for
            // writes for the duration of the call.
            unsafe {
                ibv_query_qp(
                    self.qp.as_ptr(),
                    &mut attr,
                    mask(&[ibv_qp_attr_mask::IBV_QP_PATH_MTU]),
                    &mut init,
                )
            },
            "ibv_query_qp",
        )?;
        Ok(u8::try_from(attr.path_mtu).unwrap_or(0))
    }

    /// Brings the QP from RESET through INIT and RTR to RTS.
    pub(crate) fn connect(
        &self,
        port: u8,
        sgid_index: u8,
        mtu: u8,
        local_psn: u32,
        remote: &QpInfo,
        access: u32,
    ) -> Result<()> {
        self.modify(init_attr(port, access), "ibv_modify_qp(INIT)")?;
        self.modify(
            rtr_attr(port, sgid_index, mtu, remote),
            "ibv_modify_qp(RTR)",
        )?;
        self.modify(rts_attr(local_psn), "ibv_modify_qp(RTS)")
    }

    /// Requests a completion event for the next completion.
    fn arm(&self) -> Result<()> {
        // SAFETY: the CQ is live.
        check(
            unsafe { ibv_req_notify_cq(self.cq.as_ptr(), 0) },
            "ibv_req_notify_cq",
        )
    }

    /// Polls up to `wcs.len()` completions.
    fn poll(&self, wcs: &mut [ibv_wc]) -> Result<usize> {
        // SAFETY: the CQ is live and `wcs` has room for `len` entries.
        let n = unsafe { ibv_poll_cq(self.cq.as_ptr(), wcs.len() as i32, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(verbs_err("ibv_poll_cq"));
        }
        Ok(n as usize)
    }

    /// Consumes one completion-channel event (non-blocking).
    fn take_event(&self) -> std::io::Result<()> {
        let ch = self.channel.expect("requester QPs have a channel");
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: the channel is live and non-blocking; out-pointers are valid.
        let rc = unsafe { ibv_get_cq_event(ch.as_ptr(), &mut cq, &mut ctx) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: acknowledging the one event we just took on our CQ.
        unsafe { ibv_ack_cq_events(cq, 1) };
        Ok(())
    }

    fn channel_fd(&self) -> Option<RawFd> {
        // SAFETY: the channel is live; `fd` is a plain field.
        self.channel.map(|c| unsafe { c.as_ref().fd })
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: destroyed once, in dependency order (QP, CQ, channel).
        // After ibv_destroy_qp returns the device no longer touches any
        // buffer of this QP's work requests.
        unsafe {
            ibv_destroy_qp(self.qp.as_ptr());
            ibv_destroy_cq(self.cq.as_ptr());
            if let Some(c) = self.channel {
                ibv_destroy_comp_channel(c.as_ptr());
            }
        }
    }
}

/// The `wr_id` of a transfer QP's one posted receive ([`Requester::post_recv`]).
pub(crate) const RECV_WR_ID: u64 = u64::MAX;

/// A receive's completion: its status, opcode, immediate (host order, when
/// the completion carries one) and byte count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecvDone {
    pub(crate) status: std::result::Result<(), OpStatus>,
    pub(crate) opcode: u32,
    pub(crate) imm: Option<u32>,
    pub(crate) byte_len: u32,
}

/// A posted (or waiting) operation; owns its local slice until completion.
pub(crate) struct Posted {
    pub(crate) local: LocalSlice,
    pub(crate) opcode: u32,
    /// The immediate of a `*_WITH_IMM` operation (host order).
    pub(crate) imm: Option<u32>,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) tx: oneshot::Sender<std::result::Result<(), OpError>>,
    pub(crate) info: OpError,
}

#[derive(Default)]
struct SendState {
    next_id: u64,
    inflight: HashMap<u64, Posted>,
    backlog: VecDeque<Posted>,
    dead: bool,
    /// Local buffers of operations failed by `fail_all` while the QP may
    /// still hold their work requests: kept (mapped and registered) until
    /// the QP is destroyed, which happens before `state` drops.
    retired: Vec<LocalSlice>,
}

/// A requester's QP plus the bookkeeping that ties completions to operations.
pub(crate) struct Requester {
    pub(crate) qp: QueuePair,
    state: Mutex<SendState>,
    /// Who waits for the one posted receive (transfer QPs only).
    recv: Mutex<Option<oneshot::Sender<RecvDone>>>,
    /// Keeps the device context and PD open until the QP and CQ (fields
    /// above, dropped first) are destroyed: the completion task holds the
    /// last `Arc<Requester>` after the session is gone, so without this the
    /// domain could close the device under a live QP.
    _domain: Domain,
}

impl Requester {
    pub(crate) fn new(qp: QueuePair, domain: Domain) -> Arc<Requester> {
        Arc::new(Requester {
            qp,
            state: Mutex::new(SendState::default()),
            recv: Mutex::new(None),
            _domain: domain,
        })
    }

    /// Posts one receive with no scatter list: it is consumed by the peer's
    /// RDMA WRITE_WITH_IMM (whose bytes go where the WRITE names) and
    /// completes with the immediate. One at a time.
    pub(crate) fn post_recv(&self) -> Result<oneshot::Receiver<RecvDone>> {
        let mut slot = self.recv.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return Err(FabricError::Verbs {
                what: "ibv_post_recv: a receive is already posted".into(),
                source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            });
        }
        // SAFETY: an all-zero receive WR is valid; no scatter entries.
        let mut wr: ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = RECV_WR_ID;
        wr.num_sge = 0;
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; `wr` outlives the call and names no memory.
        let rc = unsafe { ibv_post_recv(self.qp.qp.as_ptr(), &mut wr, &mut bad) };
        check(rc, "ibv_post_recv")?;
        let (tx, rx) = oneshot::channel();
        *slot = Some(tx);
        Ok(rx)
    }

    fn complete_recv(&self, wc: &ibv_wc) {
        let with_imm = wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
        let done = RecvDone {
            status: policy::wc_status(wc.status),
            opcode: wc.opcode,
            // SAFETY: with IBV_WC_WITH_IMM set the union holds the immediate.
            imm: with_imm
                .then(|| u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })),
            byte_len: wc.byte_len,
        };
        if done.status.is_err() {
            self.state.lock().unwrap_or_else(|e| e.into_inner()).dead = true;
        }
        if let Some(tx) = self.recv.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = tx.send(done);
        }
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).dead
    }

    /// One one-sided operation (`op` names it in errors) of `local` against
    /// the peer's `remote_addr`/`rkey`: its completion. The operation owns
    /// `local` until it completes.
    pub(crate) fn post(
        &self,
        op: &'static str,
        opcode: u32,
        imm: Option<u32>,
        local: LocalSlice,
        remote_addr: u64,
        rkey: u32,
    ) -> crate::completion::Completion {
        use crate::completion::Completion;
        let (tx, rx) = oneshot::channel();
        let info = OpError {
            status: OpStatus::Flushed,
            op,
            remote_addr,
            rkey,
            len: local.len() as u64,
        };
        if u32::try_from(local.len()).is_err() {
            return Completion::failed(OpError {
                status: OpStatus::LocalError,
                ..info
            });
        }
        self.submit(Posted {
            local,
            opcode,
            imm,
            remote_addr,
            rkey,
            tx,
            info: info.clone(),
        });
        Completion::new(rx, info)
    }

    /// Posts now if the send queue has room, else queues.
    pub(crate) fn submit(&self, op: Posted) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.dead {
            let mut info = op.info.clone();
            info.status = OpStatus::Flushed;
            let _ = op.tx.send(Err(info));
            return;
        }
        if st.inflight.len() < MAX_SEND_WR as usize && st.backlog.is_empty() {
            self.post_locked(&mut st, op);
        } else {
            st.backlog.push_back(op);
        }
    }

    fn post_locked(&self, st: &mut SendState, op: Posted) {
        st.next_id += 1;
        let id = st.next_id;
        let mut sge = ibv_sge {
            addr: op.local.ptr() as u64,
            length: op.local.len() as u32,
            lkey: op.local.region().inner.lkey(),
        };
        // SAFETY: an all-zero send WR is valid; we fill what matters.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = id;
        wr.sg_list = &mut sge;
        wr.num_sge = if op.local.is_empty() { 0 } else { 1 };
        wr.opcode = op.opcode;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.rdma = rdma_t {
            remote_addr: op.remote_addr,
            rkey: op.rkey,
        };
        if let Some(imm) = op.imm {
            wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; `wr` and `sge` outlive the call; the SGE
        // names memory of `op.local`, which stays registered and mapped
        // because `op` (owning the slice) is kept in `inflight` until its
        // completion is polled.
        let rc = unsafe { ibv_post_send(self.qp.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            let mut info = op.info.clone();
            info.status = OpStatus::LocalError;
            let _ = op.tx.send(Err(info));
            return;
        }
        st.inflight.insert(id, op);
    }

    fn complete(&self, wr_id: u64, status: u32) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(op) = st.inflight.remove(&wr_id) {
            let r = policy::wc_status(status).map_err(|s| {
                let mut info = op.info.clone();
                info.status = s;
                info
            });
            if r.is_err() {
                // An RC QP in error flushes everything after: so do we.
                st.dead = true;
            }
            let _ = op.tx.send(r);
        }
        if st.dead {
            for op in std::mem::take(&mut st.backlog) {
                let mut info = op.info.clone();
                info.status = OpStatus::Flushed;
                let _ = op.tx.send(Err(info));
            }
        }
        while st.inflight.len() < MAX_SEND_WR as usize {
            let Some(op) = st.backlog.pop_front() else {
                break;
            };
            self.post_locked(&mut st, op);
        }
    }

    /// Fails everything still outstanding. The QP may still be alive (the
    /// completion loop failed), so the device may still use the posted
    /// buffers: their slices are kept until the QP is destroyed.
    pub(crate) fn fail_all(&self, status: OpStatus) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.dead = true;
        let inflight: Vec<Posted> = st.inflight.drain().map(|(_, p)| p).collect();
        let backlog: Vec<Posted> = st.backlog.drain(..).collect();
        for op in inflight.into_iter().chain(backlog) {
            let mut info = op.info.clone();
            info.status = status;
            let _ = op.tx.send(Err(info));
            st.retired.push(op.local);
        }
    }

    /// Drives completions: waits on the completion channel with tokio's
    /// `AsyncFd`, then get_cq_event / ack / req_notify / poll until empty.
    pub(crate) async fn run_completions(self: Arc<Self>) -> Result<()> {
        let fd = self.qp.channel_fd().expect("requester QPs have a channel");
        // SAFETY: fcntl on the channel's fd, which stays open while `self` lives.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(FabricError::io(
                "make the completion channel non-blocking",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: the channel fd stays open and the same while `self` (which
        // owns the channel and is held by this future) lives, which outlasts
        // `afd`, a local of this function.
        let afd = unsafe { AsyncFd::register(Fd(fd)) }
            .map_err(|e| FabricError::io("register the completion channel", e.into()))?;
        self.qp.arm()?;
        // SAFETY: ibv_wc is a plain C struct; zeroed entries are overwritten by poll.
        let mut wcs: Vec<ibv_wc> = (0..32).map(|_| unsafe { std::mem::zeroed() }).collect();
        loop {
            // Drain first: completions may predate the arm.
            loop {
                let n = self.qp.poll(&mut wcs)?;
                for wc in &wcs[..n] {
                    if wc.wr_id == RECV_WR_ID {
                        self.complete_recv(wc);
                    } else {
                        self.complete(wc.wr_id, wc.status);
                    }
                }
                if n < wcs.len() {
                    break;
                }
            }
            let mut guard = afd
                .readable()
                .await
                .map_err(|e| FabricError::io("wait for completions", e))?;
            match self.qp.take_event() {
                Ok(()) => self.qp.arm()?,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => guard.clear_ready(),
                Err(e) => return Err(FabricError::io("ibv_get_cq_event", e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_set_the_required_masks() {
        let (a, m) = init_attr(1, 7);
        assert_eq!(a.qp_state, ibv_qp_state::IBV_QPS_INIT);
        assert_eq!(a.port_num, 1);
        assert_ne!(m as u32 & ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0, 0);

        let remote = QpInfo {
            qpn: 0x42,
            psn: 0x100,
            lid: 0,
            mtu: 5,
            gid: std::net::Ipv4Addr::new(10, 0, 0, 2)
                .to_ipv6_mapped()
                .octets(),
        };
        let (a, m) = rtr_attr(1, 3, 3, &remote);
        assert_eq!(a.qp_state, ibv_qp_state::IBV_QPS_RTR);
        assert_eq!(a.dest_qp_num, 0x42);
        assert_eq!(a.rq_psn, 0x100);
        assert_eq!(a.path_mtu, 3);
        assert_eq!(a.ah_attr.is_global, 1, "RoCE v2 needs a GRH");
        assert_eq!(a.ah_attr.grh.sgid_index, 3);
        // SAFETY: `raw` is the union member we wrote.
        assert_eq!(unsafe { a.ah_attr.grh.dgid.raw }, remote.gid);
        for bit in [
            ibv_qp_attr_mask::IBV_QP_AV,
            ibv_qp_attr_mask::IBV_QP_DEST_QPN,
            ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC,
        ] {
            assert_ne!(m as u32 & bit.0, 0);
        }
        let ib = QpInfo {
            gid: [0; 16],
            lid: 9,
            ..remote
        };
        let (a, _) = rtr_attr(1, 0, 5, &ib);
        assert_eq!((a.ah_attr.is_global, a.ah_attr.dlid), (0, 9));

        let (a, m) = rts_attr(0x77);
        assert_eq!(a.qp_state, ibv_qp_state::IBV_QPS_RTS);
        assert_eq!(a.sq_psn, 0x77);
        assert_ne!(m as u32 & ibv_qp_attr_mask::IBV_QP_SQ_PSN.0, 0);
        assert!(a.retry_cnt < 7, "7 means retry forever on some providers");
        assert_ne!(m as u32 & ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC.0, 0);
    }
}
