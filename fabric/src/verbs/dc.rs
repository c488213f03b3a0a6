//! The DC transport of the cuObject dialect (mlx5 devices only).
//!
//! A DC target (DCT) is a passive queue pair in front of registered memory,
//! reachable by anyone who knows its number, the port's address and the DC
//! key; a DC initiator (DCI) writes or reads any DCT with no connection
//! set-up, naming the target per work request (address handle, DCT number,
//! DC key). The attribute builders below are pure and compiled with
//! `verbs`; the queue pairs themselves need rdma-core's mlx5 direct verbs
//! and are compiled with the `dc` feature.
//!
//! `probe` (with `dc`) tells whether a domain's device can do DC: anything but an mlx5
//! device (Soft-RoCE's rxe0, other vendors) and an mlx5 device or firmware
//! that refuses a DCI are [`FabricError::Unavailable`](crate::FabricError::Unavailable) with the reason,
//! never a crash. What the device side must still do around these objects
//! (the fence of an abandoned window, the address-handle cache, tokens
//! for exactly a window) is `s3dma_wire::dc`.

use rdma_sys::*;
use s3dma_wire::dc::RetrySettings;

use super::qp::{mask, rts_attr_with};

/// Where a DCT answers from and how its replies are routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DctPath {
    /// Port number.
    pub port: u8,
    /// Index of the GID it answers on (RoCE v2: an IPv4-mapped one first).
    pub sgid_index: u8,
    /// Path MTU (verbs enum: 1 = 256 … 5 = 4096).
    pub mtu: u8,
    /// Traffic class (cuObject: 96).
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Whether the port is Ethernet (RoCE needs a GRH).
    pub global: bool,
}

/// DCI: RESET → INIT (port and pkey only: a DCI accepts nothing).
pub fn dci_init_attr(port: u8) -> (ibv_qp_attr, i32) {
    // SAFETY: ibv_qp_attr is a plain C struct for which all-zero is valid.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = ibv_qp_state::IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = port;
    (
        a,
        mask(&[
            ibv_qp_attr_mask::IBV_QP_STATE,
            ibv_qp_attr_mask::IBV_QP_PKEY_INDEX,
            ibv_qp_attr_mask::IBV_QP_PORT,
        ]),
    )
}

/// DCI: INIT → RTR (no peer: the destination comes with each work request).
pub fn dci_rtr_attr(port: u8, mtu: u8, global: bool) -> (ibv_qp_attr, i32) {
    // SAFETY: as in `dci_init_attr`.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = ibv_qp_state::IBV_QPS_RTR;
    a.path_mtu = u32::from(mtu);
    a.ah_attr.port_num = port;
    a.ah_attr.is_global = u8::from(global);
    (
        a,
        mask(&[
            ibv_qp_attr_mask::IBV_QP_STATE,
            ibv_qp_attr_mask::IBV_QP_PATH_MTU,
            ibv_qp_attr_mask::IBV_QP_AV,
        ]),
    )
}

/// DCI: RTR → RTS with cuObject servers' retry settings (timeout 16,
/// retry 7, RNR retry 7 by default): how long a posted write may still land
/// is [`RetrySettings::budget`].
pub fn dci_rts_attr(retry: RetrySettings, rnr_retry: u8) -> (ibv_qp_attr, i32) {
    rts_attr_with(0, retry.timeout, retry.retry_count, rnr_retry)
}

/// DCT: RESET → INIT with the remote access it grants (`access`: verbs
/// flags, REMOTE_WRITE for GETs, REMOTE_READ for PUTs).
pub fn dct_init_attr(port: u8, access: u32) -> (ibv_qp_attr, i32) {
    let (mut a, m) = dci_init_attr(port);
    a.qp_access_flags = access;
    (a, m | mask(&[ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS]))
}

/// DCT: INIT → RTR on `path` (its number is valid from here on).
pub fn dct_rtr_attr(path: &DctPath) -> (ibv_qp_attr, i32) {
    // SAFETY: as in `dci_init_attr`.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = ibv_qp_state::IBV_QPS_RTR;
    a.path_mtu = u32::from(path.mtu);
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = path.port;
    if path.global {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.sgid_index = path.sgid_index;
        a.ah_attr.grh.hop_limit = path.hop_limit;
        a.ah_attr.grh.traffic_class = path.traffic_class;
    }
    (
        a,
        mask(&[
            ibv_qp_attr_mask::IBV_QP_STATE,
            ibv_qp_attr_mask::IBV_QP_PATH_MTU,
            ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER,
            ibv_qp_attr_mask::IBV_QP_AV,
        ]),
    )
}

#[cfg(feature = "dc")]
pub use device::*;

#[cfg(feature = "dc")]
mod device {
    use std::ffi::CStr;
    use std::ptr::NonNull;

    use rdma_sys::*;
    use s3dma_wire::dc::{DEFAULT_RNR_RETRY, DEFAULT_TRAFFIC_CLASS, RetrySettings};

    use super::super::conn::verbs_of;
    use super::super::policy;
    use super::super::policy::{GidChoice, GidKind, select_gid_of_kind, select_target_gid};
    use super::super::qp::{check, verbs_err};
    use super::{DctPath, dci_init_attr, dci_rtr_attr, dci_rts_attr, dct_init_attr, dct_rtr_attr};
    use crate::error::{FabricError, OpStatus, Result};
    use crate::region::Domain;

    /// The generated mlx5dv bindings (`build.rs`).
    #[allow(
        non_camel_case_types,
        non_snake_case,
        non_upper_case_globals,
        dead_code,
        missing_debug_implementations,
        unreachable_pub,
        unsafe_op_in_unsafe_fn,
        rust_2018_idioms,
        clippy::all,
        clippy::undocumented_unsafe_blocks
    )]
    mod sys {
        use rdma_sys::*;
        include!(concat!(env!("OUT_DIR"), "/mlx5dv.rs"));
    }

    /// What [`probe`] found: a device that can do DC.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct DcProbe {
        /// The device's name (e.g. `mlx5_0`).
        pub device: String,
        /// The port the domain uses.
        pub port: u8,
    }

    fn device_name(ctx: *mut ibv_context) -> String {
        // SAFETY: `ctx` is an open context; its device and name outlive it.
        unsafe { CStr::from_ptr(ibv_get_device_name((*ctx).device)) }
            .to_string_lossy()
            .into_owned()
    }

    /// Whether `domain`'s device can do DC: it must be an mlx5 device and
    /// accept a DC initiator (ConnectX-4 and firmware without DC refuse
    /// one).
    ///
    /// # Errors
    /// [`FabricError::Unavailable`] with the reason (not a verbs domain,
    /// not an mlx5 device, no DC on it).
    pub fn probe(domain: &Domain) -> Result<DcProbe> {
        let v = verbs_of(domain).map_err(|e| FabricError::Unavailable {
            reason: format!("DC needs the verbs backend ({e})"),
        })?;
        let name = device_name(v.context());
        // SAFETY: the context is open; mlx5dv_is_supported only reads its
        // device's provider.
        let mlx5 = unsafe { sys::mlx5dv_is_supported((*v.context()).device.cast()) };
        if !mlx5 {
            return Err(FabricError::Unavailable {
                reason: format!(
                    "{name} is not an mlx5 device: DC needs a ConnectX-5 or newer, or a BlueField"
                ),
            });
        }
        Dci::create(domain, &DciConfig::default()).map_err(|e| FabricError::Unavailable {
            reason: format!(
                "{name} refused a DC initiator ({e}): its device or firmware has no DC"
            ),
        })?;
        Ok(DcProbe {
            device: name,
            port: v.port.port,
        })
    }

    /// A DC initiator's settings.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct DciConfig {
        /// Work requests in flight (send queue and completion queue depth).
        pub depth: u32,
        /// Retry settings (cuObject's: timeout 16, retry 7).
        pub retry: RetrySettings,
        /// RNR retries (cuObject's: 7).
        pub rnr_retry: u8,
    }

    impl Default for DciConfig {
        fn default() -> Self {
            DciConfig {
                depth: 256,
                retry: RetrySettings::default(),
                rnr_retry: DEFAULT_RNR_RETRY,
            }
        }
    }

    /// Which one-sided operation a DCI posts.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum DcOp {
        /// RDMA WRITE into the target's memory (a GET's bytes).
        Write,
        /// RDMA READ from the target's memory (a PUT's bytes).
        Read,
    }

    /// Where a DC work request goes: the handle of the target's port, its
    /// DCT number and the DC key.
    #[derive(Debug, Clone, Copy)]
    pub struct DcDest<'a> {
        /// The target port's address handle.
        pub ah: &'a AddressHandle,
        /// The DCT number (24 bits).
        pub dctn: u32,
        /// The DC key the DCT was created with.
        pub dc_key: u64,
    }

    /// The local memory of a DC work request: address, length and lkey of
    /// registered memory.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct LocalSge {
        /// Address.
        pub addr: u64,
        /// Length in bytes.
        pub len: u32,
        /// The registration's local key.
        pub lkey: u32,
    }

    /// A DC initiator: a DCI queue pair in RTS with its completion queue.
    /// Completions are polled ([`Dci::poll`]).
    pub struct Dci {
        qp: NonNull<ibv_qp>,
        qpx: NonNull<ibv_qp_ex>,
        mqpx: NonNull<sys::mlx5dv_qp_ex>,
        cq: NonNull<ibv_cq>,
        // Keeps the context and PD alive while the QP exists.
        _domain: Domain,
    }

    impl std::fmt::Debug for Dci {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            // SAFETY: the QP is live.
            let qpn = unsafe { self.qp.as_ref().qp_num };
            f.debug_struct("Dci").field("qpn", &qpn).finish()
        }
    }

    // SAFETY: verbs objects are thread-safe in libibverbs; `Dci` posts and
    // polls through `&self` only where the caller serialises (`&mut self`).
    unsafe impl Send for Dci {}

    impl Dci {
        /// Creates a DCI on `domain`'s device and brings it to RTS.
        ///
        /// # Errors
        /// Not a verbs domain; the device refused the QP or a transition.
        pub fn create(domain: &Domain, cfg: &DciConfig) -> Result<Dci> {
            let v = verbs_of(domain)?;
            let ctx = v.context();
            let depth = cfg.depth.max(1);
            // SAFETY: `ctx` is an open device context.
            let cq = unsafe {
                ibv_create_cq(
                    ctx,
                    depth as i32,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0,
                )
            };
            let cq = NonNull::new(cq).ok_or_else(|| verbs_err("ibv_create_cq (DCI)"))?;
            // SAFETY: all-zero is a valid init attr; we fill what DC needs.
            let mut attr: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
            attr.qp_type = ibv_qp_type::IBV_QPT_DRIVER;
            attr.send_cq = cq.as_ptr();
            attr.recv_cq = cq.as_ptr();
            attr.cap.max_send_wr = depth;
            attr.cap.max_send_sge = 1;
            attr.pd = v.pd();
            attr.comp_mask = ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0
                | ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0;
            attr.send_ops_flags = u64::from(
                ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE.0
                    | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_READ.0,
            );
            // SAFETY: all-zero is valid for the mlx5 attributes.
            let mut dv: sys::mlx5dv_qp_init_attr = unsafe { std::mem::zeroed() };
            dv.comp_mask = u64::from(sys::MLX5DV_QP_INIT_ATTR_MASK_DC);
            dv.dc_init_attr.dc_type = sys::MLX5DV_DCTYPE_DCI;
            // SAFETY: `ctx`, the PD and the CQ are live; both attribute
            // structs are initialised.
            let qp = unsafe { sys::mlx5dv_create_qp(ctx.cast(), (&raw mut attr).cast(), &mut dv) };
            let Some(qp) = NonNull::new(qp.cast::<ibv_qp>()) else {
                let e = verbs_err("mlx5dv_create_qp (DCI)");
                // SAFETY: created above, unused.
                unsafe { ibv_destroy_cq(cq.as_ptr()) };
                return Err(e);
            };
            let destroy = |e: FabricError| {
                // SAFETY: created above; nothing was posted.
                unsafe {
                    ibv_destroy_qp(qp.as_ptr());
                    ibv_destroy_cq(cq.as_ptr());
                }
                e
            };
            let port = v.port.port;
            for ((mut a, m), what) in [
                (dci_init_attr(port), "ibv_modify_qp(DCI INIT)"),
                (
                    dci_rtr_attr(port, v.port.active_mtu, v.ethernet),
                    "ibv_modify_qp(DCI RTR)",
                ),
                (
                    dci_rts_attr(cfg.retry, cfg.rnr_retry),
                    "ibv_modify_qp(DCI RTS)",
                ),
            ] {
                // SAFETY: the QP is live; `a`/`m` come from the builders.
                check(unsafe { ibv_modify_qp(qp.as_ptr(), &mut a, m) }, what).map_err(destroy)?;
            }
            // SAFETY: the QP was created with send_ops_flags, so it has an
            // extended QP and an mlx5 one.
            let qpx = unsafe { ibv_qp_to_qp_ex(qp.as_ptr()) };
            let qpx = NonNull::new(qpx).ok_or_else(|| destroy(verbs_err("ibv_qp_to_qp_ex")))?;
            // SAFETY: as above.
            let mqpx = unsafe { sys::mlx5dv_qp_ex_from_ibv_qp_ex(qpx.as_ptr().cast()) };
            let mqpx = NonNull::new(mqpx)
                .ok_or_else(|| destroy(verbs_err("mlx5dv_qp_ex_from_ibv_qp_ex")))?;
            Ok(Dci {
                qp,
                qpx,
                mqpx,
                cq,
                _domain: domain.clone(),
            })
        }

        /// Posts one signaled WRITE or READ of `local` to `remote_addr`
        /// under `rkey` at `dest`; its completion comes from [`Dci::poll`]
        /// with `wr_id`.
        ///
        /// # Safety
        /// `local` must be registered memory of this domain that stays
        /// valid (and, for a READ, unread by anyone else) until the
        /// operation's completion has been polled: the device reads or
        /// writes it until then.
        ///
        /// # Errors
        /// The device refused the work request (send queue full).
        pub unsafe fn post(
            &mut self,
            op: DcOp,
            wr_id: u64,
            local: LocalSge,
            remote_addr: u64,
            rkey: u32,
            dest: DcDest<'_>,
        ) -> Result<()> {
            let qpx = self.qpx.as_ptr();
            let mqpx = self.mqpx.as_ptr();
            // SAFETY: the QP is live and in RTS; `&mut self` serialises the
            // ibv_wr_* sequence; the caller keeps `local` valid.
            unsafe {
                ibv_wr_start(qpx);
                (*qpx).wr_id = wr_id;
                (*qpx).wr_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
                match op {
                    DcOp::Write => ibv_wr_rdma_write(qpx, rkey, remote_addr),
                    DcOp::Read => ibv_wr_rdma_read(qpx, rkey, remote_addr),
                }
                // mlx5dv_wr_set_dc_addr is a static inline over this pointer.
                let Some(set_dc_addr) = (*mqpx).wr_set_dc_addr else {
                    ibv_wr_abort(qpx);
                    return Err(FabricError::Unavailable {
                        reason: "libmlx5 gives this QP no wr_set_dc_addr".into(),
                    });
                };
                set_dc_addr(mqpx, dest.ah.ah.as_ptr().cast(), dest.dctn, dest.dc_key);
                ibv_wr_set_sge(qpx, local.lkey, local.addr, local.len);
                check(ibv_wr_complete(qpx), "ibv_wr_complete (DCI)")
            }
        }

        /// Polls up to `max` completions: `(wr_id, result)` each.
        ///
        /// # Errors
        /// `ibv_poll_cq` failed.
        pub fn poll(
            &mut self,
            max: usize,
        ) -> Result<Vec<(u64, std::result::Result<(), OpStatus>)>> {
            // SAFETY: ibv_wc is a plain C struct; all-zero is valid.
            let mut wcs: Vec<ibv_wc> = (0..max.clamp(1, 64))
                .map(|_| unsafe { std::mem::zeroed() })
                .collect();
            // SAFETY: the CQ is live; `wcs` has room for `len` entries.
            let n = unsafe { ibv_poll_cq(self.cq.as_ptr(), wcs.len() as i32, wcs.as_mut_ptr()) };
            if n < 0 {
                return Err(verbs_err("ibv_poll_cq (DCI)"));
            }
            Ok(wcs[..n as usize]
                .iter()
                .map(|wc| (wc.wr_id, policy::wc_status(wc.status)))
                .collect())
        }
    }

    impl Drop for Dci {
        fn drop(&mut self) {
            // SAFETY: created by `create`, destroyed once; posted operations
            // end with the QP (their memory is the caller's to keep until
            // then, see `post`).
            unsafe {
                ibv_destroy_qp(self.qp.as_ptr());
                ibv_destroy_cq(self.cq.as_ptr());
            }
        }
    }

    /// An address handle: how a DCI reaches one target port.
    pub struct AddressHandle {
        ah: NonNull<ibv_ah>,
        _domain: Domain,
    }

    impl std::fmt::Debug for AddressHandle {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("AddressHandle").finish_non_exhaustive()
        }
    }

    // SAFETY: an address handle is immutable after creation and only read
    // by the device; libibverbs objects are thread-safe.
    unsafe impl Send for AddressHandle {}
    // SAFETY: see Send.
    unsafe impl Sync for AddressHandle {}

    impl AddressHandle {
        /// The handle to the port at `gid` (RoCE; `None`: LID-routed) and
        /// `lid`, sent from `domain`'s port and GID with `traffic_class`
        /// (cuObject: 96) and `hop_limit`.
        ///
        /// # Errors
        /// Not a verbs domain; the device refused the handle (no route).
        pub fn create(
            domain: &Domain,
            gid: Option<[u8; 16]>,
            lid: u16,
            traffic_class: u8,
            hop_limit: u8,
        ) -> Result<AddressHandle> {
            let v = verbs_of(domain)?;
            // SAFETY: all-zero is a valid ibv_ah_attr.
            let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
            attr.port_num = v.port.port;
            attr.dlid = lid;
            if let Some(gid) = gid {
                attr.is_global = 1;
                attr.grh.dgid = ibv_gid { raw: gid };
                // From a local GID of the target's kind (IPv4-mapped to
                // IPv4-mapped), else the port's own.
                attr.grh.sgid_index = select_gid_of_kind(&v.gids, v.ethernet, GidKind::of(&gid))
                    .map_or(v.port.gid.index, |e| e.index);
                attr.grh.hop_limit = hop_limit;
                attr.grh.traffic_class = traffic_class;
            }
            // SAFETY: the PD is live; `attr` is initialised.
            let ah = unsafe { ibv_create_ah(v.pd(), &mut attr) };
            let ah = NonNull::new(ah).ok_or_else(|| verbs_err("ibv_create_ah"))?;
            Ok(AddressHandle {
                ah,
                _domain: domain.clone(),
            })
        }
    }

    impl Drop for AddressHandle {
        fn drop(&mut self) {
            // SAFETY: created by `create`, destroyed once, after every DCI
            // work request that named it (callers hold it until then).
            unsafe { ibv_destroy_ah(self.ah.as_ptr()) };
        }
    }

    /// A DC target: a DCT with its SRQ and completion queue, in RTR, in
    /// front of this domain's registered memory.
    pub struct Dct {
        qp: NonNull<ibv_qp>,
        srq: NonNull<ibv_srq>,
        cq: NonNull<ibv_cq>,
        /// The port's GID it answers on (`None`: InfiniBand, LID-routed).
        gid: Option<[u8; 16]>,
        lid: u16,
        _domain: Domain,
    }

    impl std::fmt::Debug for Dct {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Dct").field("dctn", &self.number()).finish()
        }
    }

    // SAFETY: the DCT is passive (nothing is posted on it) and libibverbs
    // objects are thread-safe.
    unsafe impl Send for Dct {}
    // SAFETY: see Send.
    unsafe impl Sync for Dct {}

    impl Dct {
        /// Creates a DCT on `domain`'s port with `dc_key`, granting `access`
        /// (verbs flags), in RTR on the GID `gid` chooses (a routable RoCE
        /// v2 one by default) with `traffic_class` and `hop_limit`.
        ///
        /// # Errors
        /// Not a verbs domain; no GID fits `gid`; the device refused an
        /// object or a transition.
        pub fn create(
            domain: &Domain,
            dc_key: u64,
            access: u32,
            gid: GidChoice,
            traffic_class: Option<u8>,
            hop_limit: u8,
        ) -> Result<Dct> {
            let v = verbs_of(domain)?;
            let sgid = select_target_gid(&v.gids, v.ethernet, gid).map_err(|e| {
                FabricError::Unavailable {
                    reason: e.to_string(),
                }
            })?;
            let ctx = v.context();
            // SAFETY: `ctx` is open.
            let cq =
                unsafe { ibv_create_cq(ctx, 16, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
            let cq = NonNull::new(cq).ok_or_else(|| verbs_err("ibv_create_cq (DCT)"))?;
            // SAFETY: all-zero is valid; one receive is all a DCT needs (RDMA
            // WRITE and READ consume none).
            let mut sattr: ibv_srq_init_attr = unsafe { std::mem::zeroed() };
            sattr.attr.max_wr = 1;
            sattr.attr.max_sge = 1;
            // SAFETY: the PD is live; `sattr` is initialised.
            let srq = unsafe { ibv_create_srq(v.pd(), &mut sattr) };
            let Some(srq) = NonNull::new(srq) else {
                let e = verbs_err("ibv_create_srq (DCT)");
                // SAFETY: created above, unused.
                unsafe { ibv_destroy_cq(cq.as_ptr()) };
                return Err(e);
            };
            // SAFETY: all-zero is a valid init attr.
            let mut attr: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
            attr.qp_type = ibv_qp_type::IBV_QPT_DRIVER;
            attr.send_cq = cq.as_ptr();
            attr.recv_cq = cq.as_ptr();
            attr.srq = srq.as_ptr();
            attr.pd = v.pd();
            attr.comp_mask = ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0;
            // SAFETY: all-zero is valid for the mlx5 attributes.
            let mut dv: sys::mlx5dv_qp_init_attr = unsafe { std::mem::zeroed() };
            dv.comp_mask = u64::from(sys::MLX5DV_QP_INIT_ATTR_MASK_DC);
            dv.dc_init_attr.dc_type = sys::MLX5DV_DCTYPE_DCT;
            dv.dc_init_attr.__bindgen_anon_1.dct_access_key = dc_key;
            // SAFETY: context, PD, CQ and SRQ are live; attributes are set.
            let qp = unsafe { sys::mlx5dv_create_qp(ctx.cast(), (&raw mut attr).cast(), &mut dv) };
            let release = || {
                // SAFETY: created above, destroyed once.
                unsafe {
                    ibv_destroy_srq(srq.as_ptr());
                    ibv_destroy_cq(cq.as_ptr());
                }
            };
            let Some(qp) = NonNull::new(qp.cast::<ibv_qp>()) else {
                let e = verbs_err("mlx5dv_create_qp (DCT)");
                release();
                return Err(e);
            };
            let dct = Dct {
                qp,
                srq,
                cq,
                gid: v.ethernet.then_some(sgid.gid),
                lid: v.port.lid,
                _domain: domain.clone(),
            };
            let path = DctPath {
                port: v.port.port,
                sgid_index: sgid.index,
                mtu: v.port.active_mtu,
                traffic_class: traffic_class.unwrap_or(DEFAULT_TRAFFIC_CLASS),
                hop_limit,
                global: v.ethernet,
            };
            for ((mut a, m), what) in [
                (dct_init_attr(path.port, access), "ibv_modify_qp(DCT INIT)"),
                (dct_rtr_attr(&path), "ibv_modify_qp(DCT RTR)"),
            ] {
                // SAFETY: the QP is live; `a`/`m` come from the builders.
                // On an error `dct` drops and destroys what was created.
                check(unsafe { ibv_modify_qp(dct.qp.as_ptr(), &mut a, m) }, what)?;
            }
            Ok(dct)
        }

        /// The DCT number a token names (valid from RTR on).
        pub fn number(&self) -> u32 {
            // SAFETY: the QP is live.
            unsafe { self.qp.as_ref().qp_num }
        }

        /// What a standard token names to reach this DCT: the port's GID
        /// (RoCE) and LID, and its number.
        pub fn target(&self) -> s3dma_wire::dc::DcTarget {
            s3dma_wire::dc::DcTarget {
                lid: self.lid,
                dctn: self.number(),
                gid: self.gid,
            }
        }
    }

    impl Drop for Dct {
        fn drop(&mut self) {
            // SAFETY: created by `create`, destroyed once, QP before its SRQ
            // and CQ.
            unsafe {
                ibv_destroy_qp(self.qp.as_ptr());
                ibv_destroy_srq(self.srq.as_ptr());
                ibv_destroy_cq(self.cq.as_ptr());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has(m: i32, bit: ibv_qp_attr_mask) -> bool {
        m as u32 & bit.0 != 0
    }

    #[test]
    fn dc_transitions_set_what_a_dci_and_a_dct_need() {
        let (a, m) = dci_init_attr(1);
        assert_eq!((a.qp_state, a.port_num), (ibv_qp_state::IBV_QPS_INIT, 1));
        assert!(
            !has(m, ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS),
            "a DCI accepts nothing"
        );

        let (a, m) = dci_rtr_attr(1, 5, true);
        assert_eq!(a.qp_state, ibv_qp_state::IBV_QPS_RTR);
        assert_eq!((a.path_mtu, a.ah_attr.is_global), (5, 1));
        assert!(has(m, ibv_qp_attr_mask::IBV_QP_AV) && has(m, ibv_qp_attr_mask::IBV_QP_PATH_MTU));
        assert!(
            !has(m, ibv_qp_attr_mask::IBV_QP_DEST_QPN),
            "a DCI has no fixed peer"
        );

        let (a, m) = dci_rts_attr(RetrySettings::default(), 7);
        assert_eq!(a.qp_state, ibv_qp_state::IBV_QPS_RTS);
        assert_eq!((a.timeout, a.retry_cnt, a.rnr_retry), (16, 7, 7));
        for bit in [
            ibv_qp_attr_mask::IBV_QP_TIMEOUT,
            ibv_qp_attr_mask::IBV_QP_RETRY_CNT,
            ibv_qp_attr_mask::IBV_QP_RNR_RETRY,
            ibv_qp_attr_mask::IBV_QP_SQ_PSN,
            ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC,
        ] {
            assert!(has(m, bit));
        }

        let write = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        let (a, m) = dct_init_attr(2, write);
        assert_eq!((a.qp_access_flags, a.port_num), (write, 2));
        assert!(has(m, ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS));

        let path = DctPath {
            port: 1,
            sgid_index: 3,
            mtu: 5,
            traffic_class: 96,
            hop_limit: 64,
            global: true,
        };
        let (a, m) = dct_rtr_attr(&path);
        assert_eq!(a.ah_attr.is_global, 1, "RoCE v2 needs a GRH");
        assert_eq!(
            (
                a.ah_attr.grh.sgid_index,
                a.ah_attr.grh.traffic_class,
                a.ah_attr.grh.hop_limit
            ),
            (3, 96, 64)
        );
        assert!(has(m, ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER));
        let (a, _) = dct_rtr_attr(&DctPath {
            global: false,
            ..path
        });
        assert_eq!((a.ah_attr.is_global, a.ah_attr.grh.sgid_index), (0, 0));
    }

    /// Soft-RoCE has no DC: the probe says why instead of failing
    /// elsewhere. Runs where a verbs device exists; the Soft-RoCE VM must
    /// have one.
    #[cfg(feature = "dc")]
    #[test]
    fn dc_is_unavailable_with_the_reason_on_a_device_without_it() {
        let Some(d) = super::super::tests::device_or_skip("dc") else {
            return;
        };
        match probe(&d) {
            Ok(p) => assert!(p.device.starts_with("mlx5"), "DC on {p:?}"),
            Err(crate::FabricError::Unavailable { reason }) => {
                println!("DC unavailable: {reason}");
                if std::env::var_os("S3DMA_RDMA_VM").is_some() {
                    assert!(reason.contains("rxe0 is not an mlx5 device"), "{reason}");
                }
            }
            Err(e) => panic!("the probe must fail with Unavailable, got {e}"),
        }
        // A tcp domain has no DC either.
        let tcp = crate::Domain::tcp();
        assert!(matches!(
            probe(&tcp),
            Err(crate::FabricError::Unavailable { .. })
        ));
    }

    /// DC loopback on one mlx5 port: a DCT in front of a region, a DCI
    /// writing into it and reading it back, the wrong DC key and a wrong
    /// rkey refused with nothing written.
    #[cfg(feature = "dc")]
    #[test]
    #[ignore = "needs an mlx5 device with DC (ConnectX-5 or newer, BlueField): \
                cargo test -p fabric --features dc --lib verbs::dc::tests::dc_loopback -- --ignored"]
    fn dc_loopback_write_read_and_refusals() {
        use crate::access::Access;
        let d = crate::Domain::open(crate::Backend::Verbs).expect("a verbs device");
        probe(&d).expect("DC on this device");
        const LEN: usize = 1 << 20;
        const KEY: u64 = s3dma_wire::dc::DEFAULT_DC_KEY;
        let remote = d.alloc(LEN, Access::ALL).unwrap();
        let local = d.alloc(LEN, Access::ALL).unwrap();
        let back = d.alloc(LEN, Access::ALL).unwrap();
        let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
        local.write_at(0, &pattern).unwrap();
        let flags = super::super::access_flags(Access::REMOTE_READ | Access::REMOTE_WRITE);
        let dct = Dct::create(&d, KEY, flags, Default::default(), None, 64).unwrap();
        let v = super::super::conn::verbs_of(&d).unwrap();
        let gid = v.ethernet.then_some(v.port.gid.gid);
        let ah = AddressHandle::create(&d, gid, v.port.lid, 96, 64).unwrap();
        let mut dci = Dci::create(&d, &DciConfig::default()).unwrap();
        let sge = |r: &crate::region::Region| LocalSge {
            addr: r.addr(),
            len: LEN as u32,
            lkey: r.inner.lkey(),
        };
        let run = |dci: &mut Dci, op, wr_id, l: LocalSge, rkey, key| {
            let dest = DcDest {
                ah: &ah,
                dctn: dct.number(),
                dc_key: key,
            };
            // SAFETY: the regions live until the completion is polled below.
            unsafe { dci.post(op, wr_id, l, remote.addr(), rkey, dest) }.unwrap();
            let started = std::time::Instant::now();
            loop {
                if let Some(c) = dci.poll(1).unwrap().pop() {
                    assert_eq!(c.0, wr_id);
                    return c.1;
                }
                assert!(started.elapsed() < std::time::Duration::from_secs(30));
            }
        };
        // The wrong DC key and a wrong rkey: refused, nothing lands.
        assert!(
            run(
                &mut dci,
                DcOp::Write,
                1,
                sge(&local),
                remote.rkey(),
                KEY ^ 1
            )
            .is_err()
        );
        let mut dci = Dci::create(&d, &DciConfig::default()).unwrap();
        assert!(
            run(
                &mut dci,
                DcOp::Write,
                2,
                sge(&local),
                remote.rkey() ^ 0x100,
                KEY
            )
            .is_err()
        );
        let mut got = vec![0u8; LEN];
        remote.read_at(0, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == 0), "a refused DC write landed");
        // Write, then read back.
        let mut dci = Dci::create(&d, &DciConfig::default()).unwrap();
        run(&mut dci, DcOp::Write, 3, sge(&local), remote.rkey(), KEY).unwrap();
        remote.read_at(0, &mut got).unwrap();
        assert!(got == pattern);
        run(&mut dci, DcOp::Read, 4, sge(&back), remote.rkey(), KEY).unwrap();
        back.read_at(0, &mut got).unwrap();
        assert!(got == pattern);
    }
}
