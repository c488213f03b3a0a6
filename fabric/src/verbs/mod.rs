//! The `verbs` backend (rdma-sys): device discovery, protection domain and
//! memory registration.
//!
//! Discovery failing (`ibv_get_device_list` returning NULL with `ENOSYS`,
//! i.e. a kernel without RDMA, or an empty device list) is reported as
//! [`FabricError::Unavailable`] so callers can pick the `tcp` backend.

use std::ffi::CStr;
use std::fmt;
use std::ptr::NonNull;

use rdma_sys::*;

pub(crate) mod conn;
pub mod dc;
#[cfg(feature = "dc")]
pub mod dc_session;
pub mod policy;
pub(crate) mod qp;
pub mod rc;
pub mod sysfs;

use policy::{GidEntry, GidType};

use crate::access::Access;
use crate::backend::{Registrar, Registration};
use crate::error::{FabricError, Result};
use crate::memory::Memory;

/// What [`discover`] found: the names of the RDMA devices.
pub fn discover() -> Result<Vec<String>> {
    let mut n: i32 = 0;
    // SAFETY: ibv_get_device_list writes the count into `n` and returns a
    // NULL-terminated array (or NULL with errno set); we free it below.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        let err = std::io::Error::last_os_error();
        return Err(unavailable_from_errno(err));
    }
    let mut names = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: `list` has `n` valid entries.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a valid device; its name is a NUL-terminated string
        // owned by the list.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { ibv_free_device_list(list) };
    if names.is_empty() {
        return Err(FabricError::Unavailable {
            reason: "no RDMA devices found".into(),
        });
    }
    Ok(names)
}

fn unavailable_from_errno(err: std::io::Error) -> FabricError {
    let reason = match err.raw_os_error() {
        Some(libc::ENOSYS) => {
            "the kernel has no RDMA support (ibv_get_device_list: ENOSYS)".to_string()
        }
        Some(0) | None => "no RDMA devices found".to_string(),
        _ => format!("cannot list RDMA devices: {err}"),
    };
    FabricError::Unavailable { reason }
}

/// Maps fabric access flags to verbs access flags.
pub fn access_flags(a: Access) -> u32 {
    let mut f = 0u32;
    if a.contains(Access::LOCAL_WRITE) {
        f |= ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if a.contains(Access::REMOTE_READ) {
        f |= ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    if a.contains(Access::REMOTE_WRITE) {
        // Verbs requires LOCAL_WRITE together with REMOTE_WRITE.
        f |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            | ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    f
}

/// An open device context, shared by every protection domain allocated on
/// it ([`VerbsDomain::isolated`]); closed when the last one goes.
struct DeviceContext(NonNull<ibv_context>);

// SAFETY: a verbs context is a thread-safe object in libibverbs.
unsafe impl Send for DeviceContext {}
// SAFETY: see Send; verbs calls on it are internally synchronised.
unsafe impl Sync for DeviceContext {}

impl Drop for DeviceContext {
    fn drop(&mut self) {
        // SAFETY: every PD on the context holds this Arc, so none is left;
        // the context is closed once.
        unsafe {
            ibv_close_device(self.0.as_ptr());
        }
    }
}

/// An open verbs device with its protection domain.
pub(crate) struct VerbsDomain {
    ctx: std::sync::Arc<DeviceContext>,
    pd: NonNull<ibv_pd>,
    pub(crate) port: PortInfo,
    /// The port's whole GID table, for a QP that must use a GID of a
    /// peer's kind ([`policy::select_gid_of_kind`]).
    pub(crate) gids: Vec<GidEntry>,
    /// Whether the port is Ethernet (RoCE).
    pub(crate) ethernet: bool,
}

/// The port a domain uses and what peers need to know about it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PortInfo {
    pub(crate) port: u8,
    pub(crate) lid: u16,
    pub(crate) active_mtu: u8,
    pub(crate) gid: GidEntry,
}

/// `IBV_LINK_LAYER_ETHERNET`.
const LINK_LAYER_ETHERNET: u8 = 2;

/// The port, its GID table and whether it is Ethernet.
/// `gid_index`: the GID entry to use; `None` for the policy's choice.
fn query_port(
    ctx: *mut ibv_context,
    port: u8,
    gid_index: Option<u8>,
) -> Result<(PortInfo, Vec<GidEntry>, bool)> {
    // SAFETY: all-zero is a valid ibv_port_attr to be filled in.
    let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: `ctx` is an open context and `attr` is writable.
    let rc = unsafe { ___ibv_query_port(ctx, port, &mut attr) };
    if rc != 0 {
        return Err(FabricError::Verbs {
            what: format!("ibv_query_port({port})"),
            source: std::io::Error::from_raw_os_error(rc.abs()),
        });
    }
    // SAFETY: `ctx` is open; its device and name outlive this call.
    let dev = unsafe { CStr::from_ptr(ibv_get_device_name((*ctx).device)) }
        .to_string_lossy()
        .into_owned();
    let ethernet = attr.link_layer == LINK_LAYER_ETHERNET;
    let mut gids = Vec::new();
    for i in 0..attr.gid_tbl_len.clamp(0, 256) {
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: valid context, port and index; `gid` is writable.
        if unsafe { ibv_query_gid(ctx, port, i, &mut gid) } != 0 {
            continue;
        }
        let ty = u16::try_from(i)
            .ok()
            .and_then(|i| sysfs::gid_type(std::path::Path::new(sysfs::ROOT), &dev, port, i))
            .unwrap_or(if ethernet {
                GidType::RoceV1
            } else {
                GidType::Ib
            });
        gids.push(GidEntry {
            index: i as u8,
            // SAFETY: `raw` covers the whole union.
            gid: unsafe { gid.raw },
            ty,
        });
    }
    let gid = match gid_index {
        Some(index) => gids
            .iter()
            .find(|g| g.index == index)
            .copied()
            .ok_or_else(|| FabricError::Unavailable {
                reason: format!("{dev} port {port} has no GID at index {index}"),
            })?,
        None => policy::select_gid(&gids, ethernet).ok_or_else(|| FabricError::Unavailable {
            reason: format!("{dev} port {port} has no usable GID (no RoCE v2 address configured?)"),
        })?,
    };
    Ok((
        PortInfo {
            port,
            lid: attr.lid,
            active_mtu: attr.active_mtu as u8,
            gid,
        },
        gids,
        ethernet,
    ))
}

// SAFETY: verbs contexts and PDs are thread-safe objects in libibverbs.
unsafe impl Send for VerbsDomain {}
// SAFETY: see Send; all verbs calls on them are internally synchronised.
unsafe impl Sync for VerbsDomain {}

impl fmt::Debug for VerbsDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsDomain").finish_non_exhaustive()
    }
}

impl VerbsDomain {
    /// Opens `rail`'s device (the first device's port 1 when `None`) and
    /// allocates a PD on it.
    pub(crate) fn open(rail: Option<&crate::rail::DeviceRail>) -> Result<VerbsDomain> {
        let mut n: i32 = 0;
        // SAFETY: as in `discover`.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(unavailable_from_errno(std::io::Error::last_os_error()));
        }
        let mut dev = std::ptr::null_mut();
        let mut names = Vec::new();
        for i in 0..n.max(0) as usize {
            // SAFETY: a non-NULL list has `n` valid entries.
            let d = unsafe { *list.add(i) };
            if d.is_null() {
                break;
            }
            // SAFETY: `d` is a valid device; its name is owned by the list.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(d)) }.to_string_lossy();
            let wanted = rail.is_none_or(|r| r.device == name);
            names.push(name.into_owned());
            if wanted {
                dev = d;
                break;
            }
        }
        let ctx = if dev.is_null() {
            std::ptr::null_mut()
        } else {
            // SAFETY: `dev` is a valid device from the list.
            unsafe { ibv_open_device(dev) }
        };
        let open_err = std::io::Error::last_os_error();
        // SAFETY: freed once; an opened context stays valid after freeing the list.
        unsafe { ibv_free_device_list(list) };
        if dev.is_null() {
            return Err(FabricError::Unavailable {
                reason: match rail {
                    None => "no RDMA devices found".into(),
                    Some(r) => format!(
                        "no RDMA device `{}` (present: {})",
                        s3dma_config::Escaped(&r.device),
                        s3dma_config::Escaped(&names.join(", "))
                    ),
                },
            });
        }
        let ctx = NonNull::new(ctx).ok_or_else(|| FabricError::Verbs {
            what: "ibv_open_device".into(),
            source: open_err,
        })?;
        // SAFETY: `ctx` is an open context.
        let pd = unsafe { ibv_alloc_pd(ctx.as_ptr()) };
        let Some(pd) = NonNull::new(pd) else {
            let e = std::io::Error::last_os_error();
            // SAFETY: closing the context we opened.
            unsafe { ibv_close_device(ctx.as_ptr()) };
            return Err(FabricError::Verbs {
                what: "ibv_alloc_pd".into(),
                source: e,
            });
        };
        let port_num = rail.map_or(1, |r| r.port);
        let gid_index = rail.and_then(|r| r.gid_index);
        let (port, gids, ethernet) = match query_port(ctx.as_ptr(), port_num, gid_index) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: releasing what we allocated, once.
                unsafe {
                    ibv_dealloc_pd(pd.as_ptr());
                    ibv_close_device(ctx.as_ptr());
                }
                return Err(e);
            }
        };
        Ok(VerbsDomain {
            ctx: std::sync::Arc::new(DeviceContext(ctx)),
            pd,
            port,
            gids,
            ethernet,
        })
    }

    /// A protection domain of its own on the same device context (port and
    /// GIDs as this one's): memory registered in it is reachable only from
    /// queue pairs created in it.
    pub(crate) fn isolated(&self) -> Result<VerbsDomain> {
        // SAFETY: the context is open while `self.ctx` lives.
        let pd = unsafe { ibv_alloc_pd(self.ctx.0.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| FabricError::Verbs {
            what: "ibv_alloc_pd".into(),
            source: std::io::Error::last_os_error(),
        })?;
        Ok(VerbsDomain {
            ctx: self.ctx.clone(),
            pd,
            port: self.port,
            gids: self.gids.clone(),
            ethernet: self.ethernet,
        })
    }

    /// Registers `[offset, offset+len)` of `mem` with `access` (host memory
    /// with `ibv_reg_mr`; CUDA memory with `ibv_reg_dmabuf_mr`).
    pub(crate) fn register(
        &self,
        mem: &Memory,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Mr> {
        let flags = access_flags(access | Access::LOCAL_WRITE);
        #[cfg(feature = "cuda")]
        if let Some(dm) = mem.cuda_memory() {
            let (fd, base_off) = dm.dmabuf()?;
            // GPU memory sits behind PCIe peer-to-peer, where relaxed
            // ordering is what lets the NIC reach full speed (NCCL does the
            // same); an optional flag, ignored where unsupported.
            let flags = flags | ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0;
            // SAFETY: the PD is live; the dma-buf fd exports the device
            // allocation, which `mem` keeps alive as long as the region.
            let mr = unsafe {
                ibv_reg_dmabuf_mr(
                    self.pd.as_ptr(),
                    base_off + offset as u64,
                    len,
                    mem.addr() + offset as u64,
                    std::os::fd::AsRawFd::as_raw_fd(&fd),
                    flags as i32,
                )
            };
            return Mr::new(mr, "ibv_reg_dmabuf_mr");
        }
        // SAFETY: the range lies inside `mem`, which the region keeps mapped
        // for at least as long as the MR (the MR is dropped at revocation).
        let mr = unsafe {
            ibv_reg_mr(
                self.pd.as_ptr(),
                mem.as_ptr().add(offset).cast(),
                len,
                flags as i32,
            )
        };
        Mr::new(mr, "ibv_reg_mr")
    }

    /// The address the domain's GID carries (RoCE: the interface's IP
    /// address, IPv4 as such), `None` for a GID that is no IP address.
    pub(crate) fn gid_address(&self) -> Option<std::net::IpAddr> {
        let v6 = std::net::Ipv6Addr::from(self.port.gid.gid);
        match v6.to_ipv4_mapped() {
            Some(v4) => Some(v4.into()),
            None if self.ethernet => Some(v6.into()),
            None => None,
        }
    }

    pub(crate) fn context(&self) -> *mut ibv_context {
        self.ctx.0.as_ptr()
    }

    /// Whether the domain's port is ACTIVE now (its link up), asked of the
    /// device: a port whose link went down cannot route to any peer.
    ///
    /// # Errors
    /// The query failed.
    pub(crate) fn port_active(&self) -> Result<bool> {
        // SAFETY: all-zero is a valid ibv_port_attr to be filled in.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open while `self` lives; `attr` is
        // writable.
        let rc = unsafe { ___ibv_query_port(self.context(), self.port.port, &mut attr) };
        if rc != 0 {
            return Err(FabricError::Verbs {
                what: format!("ibv_query_port({})", self.port.port),
                source: std::io::Error::from_raw_os_error(rc.abs()),
            });
        }
        Ok(attr.state == ibv_port_state::IBV_PORT_ACTIVE)
    }

    pub(crate) fn pd(&self) -> *mut ibv_pd {
        self.pd.as_ptr()
    }
}

impl Registrar for VerbsDomain {
    fn register(
        &self,
        mem: &Memory,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn Registration>> {
        Ok(Box::new(VerbsDomain::register(
            self, mem, offset, len, access,
        )?))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for VerbsDomain {
    fn drop(&mut self) {
        // SAFETY: every MR and QP holds the domain alive (via its region or
        // requester), so none is left when the domain drops; the PD is
        // released once (the context with the last domain on it).
        unsafe {
            ibv_dealloc_pd(self.pd.as_ptr());
        }
    }
}

/// A verbs memory registration; deregistered on drop.
pub(crate) struct Mr(NonNull<ibv_mr>);

// SAFETY: an MR handle may be used and deregistered from any thread.
unsafe impl Send for Mr {}
// SAFETY: only lkey/rkey are read through `&Mr`.
unsafe impl Sync for Mr {}

impl Mr {
    fn new(mr: *mut ibv_mr, what: &str) -> Result<Mr> {
        NonNull::new(mr).map(Mr).ok_or_else(|| FabricError::Verbs {
            what: what.into(),
            source: std::io::Error::last_os_error(),
        })
    }

    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: the MR is valid until drop.
        unsafe { self.0.as_ref().rkey }
    }

    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: the MR is valid until drop.
        unsafe { self.0.as_ref().lkey }
    }
}

impl Registration for Mr {
    fn rkey(&self) -> u32 {
        Mr::rkey(self)
    }

    fn lkey(&self) -> u32 {
        Mr::lkey(self)
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by us, deregistered once. ibv_dereg_mr returns
        // after the device stops using the MR.
        unsafe {
            ibv_dereg_mr(self.0.as_ptr());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_without_hardware_is_a_typed_unavailable_error() {
        match discover() {
            Ok(devs) => assert!(!devs.is_empty()),
            Err(FabricError::Unavailable { reason }) => assert!(!reason.is_empty()),
            Err(e) => panic!("discovery must fail with Unavailable, got {e}"),
        }
    }

    #[test]
    fn opening_a_verbs_domain_without_hardware_is_unavailable() {
        match crate::Domain::open(crate::Backend::Verbs) {
            Ok(d) => assert_eq!(d.backend(), crate::Backend::Verbs),
            Err(FabricError::Unavailable { reason }) => assert!(!reason.is_empty()),
            Err(e) => panic!("expected Unavailable, got {e}"),
        }
    }

    /// A verbs domain for test `case`, or `None` (with a SKIPPED line) where
    /// there is no RDMA device; inside the Soft-RoCE VM one must open.
    pub(crate) fn device_or_skip(case: &str) -> Option<crate::Domain> {
        match crate::Domain::open(crate::Backend::Verbs) {
            Ok(d) => Some(d),
            Err(e) if std::env::var_os("S3DMA_RDMA_VM").is_none() => {
                eprintln!("SKIPPED verbs::{case}: no RDMA device ({e})");
                None
            }
            Err(e) => panic!("the Soft-RoCE VM has no usable RDMA device: {e}"),
        }
    }

    #[test]
    fn open_device_register_and_window() {
        let Some(d) = device_or_skip("open_device_register_and_window") else {
            return;
        };
        let r = d.alloc(1 << 20, Access::ALL).unwrap();
        assert_ne!(r.rkey(), 0);
        assert_ne!(r.inner.lkey(), 0);
        let w = r.window(4096, 4096, Access::REMOTE_WRITE, None).unwrap();
        assert_ne!(w.rkey(), r.rkey());
        w.revoke();
    }

    #[test]
    fn access_mapping() {
        let f = access_flags(Access::REMOTE_WRITE);
        assert_ne!(f & ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0, 0);
        assert_ne!(f & ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0, 0);
        assert_eq!(f & ibv_access_flags::IBV_ACCESS_REMOTE_READ.0, 0);
        assert_eq!(access_flags(Access::NONE), 0);
    }
}
