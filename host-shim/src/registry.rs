//! Tenants, their leases and their buffers.
//!
//! A tenant is found from the peer's uid/gid (never from a request). Each
//! lease (one client process's fd-passing connection) holds passed fds
//! waiting for RegisterBuffer and owns the buffers registered through it;
//! closing the lease releases them. Buffer ids are random and looked up in
//! the caller's tenant only, so another tenant's id is simply "not found".
//!
//! A buffer's memory is registered with [`fabric::Domain::register_windows_only`]:
//! peers can reach it only through the per-request windows the service mints.
//!
//! Memory comes only as something the kernel vouches the tenant holds: a
//! file descriptor passed over the tenant's own lease (`SCM_RIGHTS`), a
//! sealed memfd for host memory or a CUDA shareable handle (a POSIX fd from
//! `cuMemExportToShareableHandle`) for device memory. Legacy CUDA IPC
//! handles, 64 bytes that open the memory for whoever presents them, are
//! refused unless `cuda.allow_legacy_ipc_handles` is set.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fabric::{Access, Domain, Memory, Region};
use s3dma_proto::lease::Id;
use tokio::sync::Semaphore;

use crate::config::{Config, CudaConfig, LeaseConfig};
use crate::error::ShimError;
use crate::metrics::Metrics;

/// Longest buffer label kept.
const MAX_LABEL: usize = 64;

/// What the kernel says about the connecting process (SO_PEERCRED).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Effective uid.
    pub uid: u32,
    /// Effective gid.
    pub gid: u32,
    /// Pid (0 when it is not visible in the shim's pid namespace).
    pub pid: i32,
}

/// A configured tenant and what it holds.
#[derive(Debug)]
pub struct Tenant {
    /// The name the agent knows.
    pub name: String,
    /// Buffers at once.
    pub max_buffers: u32,
    /// Total registered bytes.
    pub max_buffer_bytes: u64,
    /// Requests in the shim at once.
    pub requests: Arc<Semaphore>,
    /// The configured request limit.
    pub max_concurrent_requests: u32,
    /// Connections (gRPC and lease) open at once.
    pub connections: Arc<Semaphore>,
    /// The configured connection limit.
    pub max_connections: u32,
    /// Items in one batch.
    pub max_batch_items: u32,
    /// Bytes one GetObjects or PutObjects batch may name.
    pub max_batch_bytes: u64,
    /// The configured live-window limit.
    pub max_windows: u32,
    /// The protection domain its buffers (and so its windows) are
    /// registered in, with only the queue pairs that serve it: another
    /// tenant's peers cannot reach them even with a real key (on verbs;
    /// on tcp the shim's one domain, where keys are 32 random bits behind
    /// the fabric key).
    pub domain: Domain,
    /// Its protection domains on the other rails' devices (rails 1.., on
    /// verbs with several rails; empty otherwise): every buffer is
    /// registered in each, so each rail's window reaches it.
    pub rail_domains: Vec<Domain>,
    windows: AtomicUsize,
    /// Fds received in lease frames that have not completed yet.
    in_frame_fds: AtomicUsize,
    state: Mutex<TenantState>,
}

/// One live window of a tenant, counted until dropped.
#[derive(Debug)]
pub struct WindowSlot(Arc<Tenant>);

impl Drop for WindowSlot {
    fn drop(&mut self) {
        self.0.windows.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An fd received in a lease frame that has not completed, counted against
/// the tenant's fd budget until the frame is handled or dropped.
#[derive(Debug)]
pub struct InFrameFd(Arc<Tenant>);

impl Drop for InFrameFd {
    fn drop(&mut self) {
        self.0.in_frame_fds.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Tenant {
    /// Counts one more live window, unless the tenant is at `max_windows`.
    ///
    /// # Errors
    /// [`ShimError::TooManyRequests`].
    pub fn window_slot(self: &Arc<Self>) -> Result<WindowSlot, ShimError> {
        let max = self.max_windows as usize;
        self.windows
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|n| {
                ShimError::TooManyRequests(format!(
                    "tenant {} has {n} windows open (max_windows {max}); retry when requests end",
                    self.name
                ))
            })?;
        Ok(WindowSlot(Arc::clone(self)))
    }

    /// Windows open now.
    pub fn windows_open(&self) -> usize {
        self.windows.load(Ordering::Acquire)
    }
}

#[derive(Debug, Default)]
struct TenantState {
    buffers: HashMap<u64, Arc<Buffer>>,
    buffer_bytes: u64,
    /// Registrations between `reserve` and `insert`/`unreserve`.
    reserved: u64,
    leases: HashMap<Id, Arc<Lease>>,
}

/// A tenant's memory as registered on every rail.
#[derive(Debug)]
struct Registered {
    region: Region,
    rails: Vec<Region>,
}

impl Tenant {
    /// Registers `mem` in the tenant's domain (windows only: a peer names
    /// live windows, never the buffer) and in its domain on every other
    /// rail.
    fn register(&self, mem: Memory) -> Result<Registered, fabric::FabricError> {
        let region = self.domain.register_windows_only(mem, Access::ALL)?;
        let rails = self
            .rail_domains
            .iter()
            .map(|d| region.register_in(d))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Registered { region, rails })
    }
}

/// A registered buffer.
#[derive(Debug)]
pub struct Buffer {
    /// The tenant-scoped id.
    pub id: u64,
    /// The registered memory (on the first rail's device).
    pub region: Region,
    /// The same memory registered on the other rails' devices (rails 1..,
    /// in [`Tenant::rail_domains`]; empty where every rail shares one
    /// domain).
    pub rail_regions: Vec<Region>,
    /// Its tenant's label.
    pub label: String,
    /// The lease it lives under.
    pub lease: Id,
    /// Requests using it now.
    pub in_use: AtomicU32,
}

impl Buffer {
    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.region.len() as u64
    }

    /// The registration windows on rail `rail` are minted from: the
    /// rail's own where it has a domain of its own, else the first's.
    pub fn region_on(&self, rail: usize) -> &Region {
        rail.checked_sub(1)
            .and_then(|i| self.rail_regions.get(i))
            .unwrap_or(&self.region)
    }

    /// `host` or `cuda`.
    pub fn kind(&self) -> &'static str {
        match self.region.kind() {
            fabric::MemoryKind::Host => "host",
            fabric::MemoryKind::Cuda => "cuda",
        }
    }
}

/// One client process's lease.
#[derive(Debug)]
pub struct Lease {
    /// The lease id the client names in RegisterBuffer.
    pub id: Id,
    /// The process that opened it.
    pub peer: Peer,
    pending: Mutex<HashMap<Id, PendingFd>>,
}

#[derive(Debug)]
struct PendingFd {
    fd: OwnedFd,
    kind: FdKind,
    expires: Instant,
}

/// What a passed fd was sent as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FdKind {
    /// A sealed memfd of this many bytes (an `FD` frame).
    Host { size: u64 },
    /// A CUDA shareable handle (a `CU` frame), imported at RegisterBuffer.
    Cuda,
}

/// Everything the service and the lease handler share.
#[derive(Debug)]
pub struct Registry {
    tenants: Vec<Arc<Tenant>>,
    by_uid: HashMap<u32, usize>,
    by_gid: HashMap<u32, usize>,
    domain: Domain,
    leases: LeaseConfig,
    cuda: CudaConfig,
    metrics: Arc<Metrics>,
}

impl Registry {
    /// Builds the tenants from the configuration, each with a protection
    /// domain of its own on `domain`'s device ([`Domain::isolated`]) and
    /// on each of `rail_domains`' (the other rails' devices, verbs).
    ///
    /// # Errors
    /// The device has no protection domain left for a tenant.
    pub fn new(
        config: &Config,
        domain: Domain,
        rail_domains: &[Domain],
        metrics: Arc<Metrics>,
    ) -> Result<Registry, fabric::FabricError> {
        let mut by_uid = HashMap::new();
        let mut by_gid = HashMap::new();
        let tenants = config
            .tenants
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let tenant_domain = domain.isolated()?;
                let tenant_rails = rail_domains
                    .iter()
                    .map(Domain::isolated)
                    .collect::<Result<Vec<_>, _>>()?;
                for u in &t.uids {
                    by_uid.insert(*u, i);
                }
                for g in &t.gids {
                    by_gid.insert(*g, i);
                }
                Ok(Arc::new(Tenant {
                    name: t.name.clone(),
                    max_buffers: t.max_buffers,
                    max_buffer_bytes: t.max_buffer_bytes.0,
                    requests: Arc::new(Semaphore::new(t.max_concurrent_requests as usize)),
                    max_concurrent_requests: t.max_concurrent_requests,
                    connections: Arc::new(Semaphore::new(t.max_connections as usize)),
                    max_connections: t.max_connections,
                    max_batch_items: t.max_batch_items,
                    max_batch_bytes: t.max_batch_bytes.0,
                    max_windows: t.max_windows,
                    domain: tenant_domain,
                    rail_domains: tenant_rails,
                    windows: AtomicUsize::new(0),
                    in_frame_fds: AtomicUsize::new(0),
                    state: Mutex::default(),
                }))
            })
            .collect::<Result<Vec<_>, fabric::FabricError>>()?;
        Ok(Registry {
            tenants,
            by_uid,
            by_gid,
            domain,
            leases: config.leases.clone(),
            cuda: config.cuda.clone(),
            metrics,
        })
    }

    /// The shim's fabric domain (each tenant's is [`Tenant::domain`], on
    /// its device).
    pub fn domain(&self) -> &Domain {
        &self.domain
    }

    /// Every tenant, in configuration order.
    pub fn tenants(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }

    /// The tenant a peer is: by uid, else by primary gid.
    ///
    /// # Errors
    /// [`ShimError::UnknownTenant`].
    pub fn tenant_of(&self, peer: Peer) -> Result<Arc<Tenant>, ShimError> {
        self.by_uid
            .get(&peer.uid)
            .or_else(|| self.by_gid.get(&peer.gid))
            .map(|&i| Arc::clone(&self.tenants[i]))
            .ok_or(ShimError::UnknownTenant {
                uid: peer.uid,
                gid: peer.gid,
            })
    }

    /// Opens a lease for `peer`'s tenant.
    ///
    /// # Errors
    /// Unknown tenant, or the tenant holds too many leases.
    pub fn open_lease(&self, peer: Peer) -> Result<(Arc<Tenant>, Arc<Lease>), ShimError> {
        let tenant = self.tenant_of(peer)?;
        let lease = Arc::new(Lease {
            id: Id(rand::random()),
            peer,
            pending: Mutex::default(),
        });
        {
            let mut st = lock(&tenant.state);
            if st.leases.len() >= self.leases.max_leases_per_tenant {
                return Err(ShimError::BufferLimit(format!(
                    "tenant {} already holds {} leases (one per client process; leases.max_leases_per_tenant)",
                    tenant.name,
                    st.leases.len()
                )));
            }
            st.leases.insert(lease.id, Arc::clone(&lease));
            self.metrics
                .leases
                .with_label_values(&[&tenant.name])
                .set(st.leases.len() as i64);
        }
        Ok((tenant, lease))
    }

    /// Closes a lease: its pending fds are closed and its buffers released.
    pub fn close_lease(&self, tenant: &Tenant, lease: &Lease) {
        let released: Vec<Arc<Buffer>> = {
            let mut st = lock(&tenant.state);
            st.leases.remove(&lease.id);
            let ids: Vec<u64> = st
                .buffers
                .values()
                .filter(|b| b.lease == lease.id)
                .map(|b| b.id)
                .collect();
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                if let Some(b) = st.buffers.remove(&id) {
                    st.buffer_bytes -= b.size();
                    out.push(b);
                }
            }
            self.metrics
                .leases
                .with_label_values(&[&tenant.name])
                .set(st.leases.len() as i64);
            self.publish(tenant, &st);
            out
        };
        lock(&lease.pending).clear();
        if !released.is_empty() {
            tracing::info!(
                tenant = %tenant.name,
                pid = lease.peer.pid,
                buffers = released.len(),
                "lease closed; its buffers are released"
            );
        }
    }

    /// Takes a passed fd (host memory, an `FD` frame) into `tenant`'s
    /// `lease` and returns its handle.
    ///
    /// A waiting fd is a descriptor of this process, whose table all tenants
    /// share: a lease may hold `leases.max_pending_fds` of them, and a tenant,
    /// over all its leases, no more than its `max_buffers` (more could never
    /// all be registered), so one tenant's many leases cannot exhaust it.
    ///
    /// # Errors
    /// The fd is not sealed shared memory, or the lease or the tenant holds
    /// too many.
    pub fn add_fd(&self, tenant: &Tenant, lease: &Lease, fd: OwnedFd) -> Result<Id, ShimError> {
        let size = check_shared_memory_fd(&fd)?;
        self.add_pending(tenant, lease, fd, FdKind::Host { size })
    }

    /// Takes a passed CUDA shareable handle (a POSIX fd from
    /// `cuMemExportToShareableHandle`, a `CU` frame) into `tenant`'s `lease`
    /// and returns its handle, counted as [`Registry::add_fd`] counts fds.
    /// The driver judges the fd when RegisterBuffer imports it.
    ///
    /// # Errors
    /// This shim cannot use CUDA (built without the `cuda` feature, or no
    /// usable driver), or the lease or the tenant holds too many fds.
    pub fn add_cuda_fd(
        &self,
        tenant: &Tenant,
        lease: &Lease,
        fd: OwnedFd,
    ) -> Result<Id, ShimError> {
        cuda_usable()?;
        self.add_pending(tenant, lease, fd, FdKind::Cuda)
    }

    fn add_pending(
        &self,
        tenant: &Tenant,
        lease: &Lease,
        fd: OwnedFd,
        kind: FdKind,
    ) -> Result<Id, ShimError> {
        let now = Instant::now();
        // Lock order: the tenant's state, then pending maps.
        let st = lock(&tenant.state);
        let mut elsewhere = 0;
        for other in st.leases.values().filter(|l| l.id != lease.id) {
            let mut p = lock(&other.pending);
            p.retain(|_, p| p.expires > now);
            elsewhere += p.len();
        }
        let mut pending = lock(&lease.pending);
        pending.retain(|_, p| p.expires > now);
        if pending.len() >= self.leases.max_pending_fds {
            return Err(ShimError::BufferLimit(format!(
                "{} passed fds are waiting for RegisterBuffer on this lease (leases.max_pending_fds)",
                pending.len()
            )));
        }
        // Fds in other leases' unfinished frames (the caller has released
        // this one's count before adding it).
        let in_frames = tenant.in_frame_fds.load(Ordering::Acquire);
        let waiting = elsewhere + pending.len() + in_frames;
        if waiting >= tenant.max_buffers as usize {
            return Err(ShimError::BufferLimit(format!(
                "tenant {} has {waiting} passed fds waiting for RegisterBuffer on its leases (at most max_buffers, {})",
                tenant.name, tenant.max_buffers
            )));
        }
        let handle = Id(rand::random());
        pending.insert(
            handle,
            PendingFd {
                fd,
                kind,
                expires: now + Duration::from_secs(self.leases.fd_handle_ttl_secs),
            },
        );
        Ok(handle)
    }

    /// Counts an fd that arrived in a lease frame not yet complete against
    /// the tenant's fd budget (`max_buffers` over fds waiting for
    /// RegisterBuffer and fds in frames), so fds sent without finishing
    /// their frame cannot pile up in the shim.
    ///
    /// # Errors
    /// [`ShimError::BufferLimit`] when the budget is used up.
    pub fn hold_in_frame_fd(&self, tenant: &Arc<Tenant>) -> Result<InFrameFd, ShimError> {
        let now = Instant::now();
        let waiting: usize = {
            let st = lock(&tenant.state);
            st.leases
                .values()
                .map(|l| {
                    let mut p = lock(&l.pending);
                    p.retain(|_, p| p.expires > now);
                    p.len()
                })
                .sum()
        };
        let max = tenant.max_buffers as usize;
        tenant
            .in_frame_fds
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (waiting + n < max).then_some(n + 1)
            })
            .map_err(|n| {
                ShimError::BufferLimit(format!(
                    "tenant {} has {} passed fds waiting (in lease frames or for RegisterBuffer; at most max_buffers, {max})",
                    tenant.name,
                    waiting + n
                ))
            })?;
        Ok(InFrameFd(Arc::clone(tenant)))
    }

    fn lease(&self, tenant: &Tenant, lease: &[u8]) -> Result<Arc<Lease>, ShimError> {
        let id = Id::from_slice(lease).ok_or_else(|| {
            ShimError::InvalidArgument(format!(
                "lease must be the 16-byte id the lease connection returned, not {} bytes",
                lease.len()
            ))
        })?;
        lock(&tenant.state).leases.get(&id).cloned().ok_or_else(|| {
            ShimError::NoSuchLease(
                "no such lease for this tenant (its connection closed, or it is not yours)".into(),
            )
        })
    }

    /// Removes the fd `fd_handle` names from `lease` (single use).
    fn take_pending(&self, lease: &Lease, fd_handle: &[u8]) -> Result<PendingFd, ShimError> {
        let handle = Id::from_slice(fd_handle).ok_or_else(|| {
            ShimError::InvalidArgument(format!(
                "fd_handle must be the 16 bytes the lease returned, not {} bytes",
                fd_handle.len()
            ))
        })?;
        let pending = lock(&lease.pending).remove(&handle).ok_or_else(|| {
            ShimError::NoSuchLease(
                "no such fd handle on this lease (already used, expired, or never passed)".into(),
            )
        })?;
        if pending.expires <= Instant::now() {
            return Err(ShimError::NoSuchLease(format!(
                "the fd handle expired (it is valid for {} s after the fd is passed)",
                self.leases.fd_handle_ttl_secs
            )));
        }
        Ok(pending)
    }

    /// Registers a passed memfd as a buffer.
    ///
    /// # Errors
    /// Unknown lease or handle, a size outside the file, or the tenant's limits.
    pub fn register_host(
        &self,
        tenant: &Tenant,
        lease: &[u8],
        fd_handle: &[u8],
        size: u64,
        label: &str,
    ) -> Result<Arc<Buffer>, ShimError> {
        let lease = self.lease(tenant, lease)?;
        if size == 0 {
            return Err(ShimError::InvalidArgument(
                "a buffer needs at least one byte".into(),
            ));
        }
        let pending = self.take_pending(&lease, fd_handle)?;
        let FdKind::Host { size: file_size } = pending.kind else {
            return Err(ShimError::InvalidArgument(
                "this fd handle names a CUDA shareable handle (passed in a CU frame): register it as cuda memory (CudaMemory.fd_handle)".into(),
            ));
        };
        if size > file_size {
            return Err(ShimError::OutOfBounds(format!(
                "size {size} is larger than the {file_size} bytes of the passed memfd"
            )));
        }
        let len = usize::try_from(size)
            .map_err(|_| ShimError::OutOfBounds(format!("size {size} does not fit in memory")))?;
        self.reserve(tenant, size)?;
        let registered = Memory::from_fd(pending.fd, len).and_then(|m| tenant.register(m));
        match registered {
            Ok(registered) => self.insert(tenant, registered, lease.id, label),
            Err(e) => {
                self.unreserve(tenant, size);
                Err(ShimError::BadBuffer(format!(
                    "cannot map and register the memfd: {e}"
                )))
            }
        }
    }

    /// Registers CUDA device memory: the CUDA shareable handle (POSIX fd)
    /// passed on `lease` that `memory`'s fd handle names, imported with
    /// `cuMemImportFromShareableHandle` and mapped; or, only where
    /// `cuda.allow_legacy_ipc_handles` is set, a legacy IPC handle opened
    /// with `cuIpcOpenMemHandle`.
    ///
    /// # Errors
    /// Unsupported without the `cuda` feature or a usable CUDA driver, and
    /// for legacy handles unless allowed; neither or both of the handles
    /// set is `InvalidArgument`; an fd or handle that does not open (not a
    /// CUDA allocation, its memory freed) or a size past its allocation is
    /// `BadBuffer`; else as [`Registry::register_host`].
    pub fn register_cuda(
        &self,
        tenant: &Tenant,
        lease: &[u8],
        memory: CudaHandle<'_>,
        device: i32,
        size: u64,
        label: &str,
    ) -> Result<Arc<Buffer>, ShimError> {
        let lease = self.lease(tenant, lease)?;
        if size == 0 {
            return Err(ShimError::InvalidArgument(
                "a buffer needs at least one byte".into(),
            ));
        }
        let len = usize::try_from(size)
            .map_err(|_| ShimError::OutOfBounds(format!("size {size} does not fit in memory")))?;
        match memory {
            CudaHandle::Fd(fd_handle) => {
                let pending = self.take_pending(&lease, fd_handle)?;
                if pending.kind != FdKind::Cuda {
                    return Err(ShimError::InvalidArgument(
                        "this fd handle names host memory (a memfd passed in an FD frame): register it as host memory, or pass the CUDA fd in a CU frame".into(),
                    ));
                }
                // A shim that cannot use CUDA at all says so: no fd would do.
                cuda_usable()?;
                self.reserve(tenant, size)?;
                #[cfg(feature = "cuda")]
                let registered = {
                    use std::os::fd::AsFd as _;
                    Memory::cuda_fd(device, pending.fd.as_fd(), len)
                        .and_then(|m| tenant.register(m))
                };
                #[cfg(not(feature = "cuda"))]
                let registered: Result<Registered, fabric::FabricError> = {
                    let _ = (pending, len);
                    Err(fabric::FabricError::Cuda("no `cuda` feature".into()))
                };
                match registered {
                    Ok(registered) => self.insert(tenant, registered, lease.id, label),
                    Err(e) => {
                        self.unreserve(tenant, size);
                        Err(ShimError::BadBuffer(format!(
                            "cannot import and register the CUDA fd on device {device} (it must come from cuMemExportToShareableHandle with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, of an allocation of at least {size} bytes on that device): {e}"
                        )))
                    }
                }
            }
            CudaHandle::LegacyIpc(ipc_handle) => {
                cuda_usable()?;
                if !self.cuda.allow_legacy_ipc_handles {
                    return Err(ShimError::Unsupported(
                        "legacy CUDA IPC handles (CudaMemory.ipc_handle) are refused: their 64 bytes open the memory for whoever presents them, so they cannot show the memory is yours (cuda.allow_legacy_ipc_handles is false). Allocate with cuMemCreate requesting CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, export it with cuMemExportToShareableHandle, pass the fd over your lease in a CU frame and register its fd handle as CudaMemory.fd_handle (Python: Client.alloc_cuda or Client.register_cuda_fd)".into(),
                    ));
                }
                let handle: [u8; 64] = ipc_handle.try_into().map_err(|_| {
                    ShimError::InvalidArgument(format!(
                        "ipc_handle must be the 64-byte CUipcMemHandle, not {} bytes",
                        ipc_handle.len()
                    ))
                })?;
                self.reserve(tenant, size)?;
                #[cfg(feature = "cuda")]
                let registered = Memory::cuda_ipc(device, fabric::cuda::IpcMemHandle(handle), len)
                    .and_then(|m| tenant.register(m));
                #[cfg(not(feature = "cuda"))]
                let registered: Result<Registered, fabric::FabricError> = {
                    let _ = handle;
                    Err(fabric::FabricError::Cuda("no `cuda` feature".into()))
                };
                match registered {
                    Ok(registered) => self.insert(tenant, registered, lease.id, label),
                    Err(e) => {
                        self.unreserve(tenant, size);
                        Err(ShimError::BadBuffer(format!(
                            "cannot open and register the CUDA IPC handle on device {device}: {e}"
                        )))
                    }
                }
            }
        }
    }

    fn reserve(&self, tenant: &Tenant, size: u64) -> Result<(), ShimError> {
        let mut st = lock(&tenant.state);
        // Count reservations as placeholders so concurrent registrations
        // cannot overshoot the limits together.
        if st.buffers.len() as u64 + st.reserved + 1 > u64::from(tenant.max_buffers) {
            return Err(ShimError::BufferLimit(format!(
                "tenant {} already holds {} buffers (max_buffers {})",
                tenant.name,
                st.buffers.len(),
                tenant.max_buffers
            )));
        }
        if st.buffer_bytes + size > tenant.max_buffer_bytes {
            return Err(ShimError::BufferLimit(format!(
                "{size} more bytes would take tenant {} past its {} registered bytes (holds {})",
                tenant.name, tenant.max_buffer_bytes, st.buffer_bytes
            )));
        }
        st.buffer_bytes += size;
        st.reserved += 1;
        Ok(())
    }

    fn unreserve(&self, tenant: &Tenant, size: u64) {
        let mut st = lock(&tenant.state);
        st.buffer_bytes -= size;
        st.reserved -= 1;
    }

    fn insert(
        &self,
        tenant: &Tenant,
        Registered { region, rails }: Registered,
        lease: Id,
        label: &str,
    ) -> Result<Arc<Buffer>, ShimError> {
        let mut st = lock(&tenant.state);
        st.reserved -= 1;
        if !st.leases.contains_key(&lease) {
            // The lease closed while the memory was being registered.
            st.buffer_bytes -= region.len() as u64;
            return Err(ShimError::NoSuchLease(
                "the lease closed during the registration".into(),
            ));
        }
        let mut id: u64 = rand::random();
        while id == 0 || st.buffers.contains_key(&id) {
            id = rand::random();
        }
        let mut label = label.to_owned();
        if label.len() > MAX_LABEL {
            let mut end = MAX_LABEL;
            while !label.is_char_boundary(end) {
                end -= 1;
            }
            label.truncate(end);
        }
        let buffer = Arc::new(Buffer {
            id,
            region,
            rail_regions: rails,
            label,
            lease,
            in_use: AtomicU32::new(0),
        });
        st.buffers.insert(id, Arc::clone(&buffer));
        self.publish(tenant, &st);
        Ok(buffer)
    }

    /// The caller's buffer `id`.
    ///
    /// # Errors
    /// [`ShimError::NoSuchBuffer`] (also for another tenant's id).
    pub fn buffer(&self, tenant: &Tenant, id: u64) -> Result<Arc<Buffer>, ShimError> {
        lock(&tenant.state)
            .buffers
            .get(&id)
            .cloned()
            .ok_or(ShimError::NoSuchBuffer(id))
    }

    /// Releases a buffer; requests using it keep its memory until they end.
    ///
    /// # Errors
    /// [`ShimError::NoSuchBuffer`].
    pub fn release(&self, tenant: &Tenant, id: u64) -> Result<(), ShimError> {
        let mut st = lock(&tenant.state);
        let b = st.buffers.remove(&id).ok_or(ShimError::NoSuchBuffer(id))?;
        st.buffer_bytes -= b.size();
        self.publish(tenant, &st);
        Ok(())
    }

    /// The tenant's buffers, and their count and bytes.
    pub fn buffers(&self, tenant: &Tenant) -> (Vec<Arc<Buffer>>, u64) {
        let st = lock(&tenant.state);
        let mut v: Vec<_> = st.buffers.values().cloned().collect();
        v.sort_by_key(|b| b.id);
        (v, st.buffer_bytes)
    }

    fn publish(&self, tenant: &Tenant, st: &TenantState) {
        let m = &self.metrics;
        m.buffers
            .with_label_values(&[&tenant.name])
            .set(st.buffers.len() as i64);
        m.buffer_bytes
            .with_label_values(&[&tenant.name])
            .set(i64::try_from(st.buffer_bytes).unwrap_or(i64::MAX));
    }
}

/// How RegisterBuffer names CUDA memory.
#[derive(Debug, Clone, Copy)]
pub enum CudaHandle<'a> {
    /// The fd handle of a CUDA shareable handle passed on the lease.
    Fd(&'a [u8]),
    /// A legacy `CUipcMemHandle` (refused unless
    /// `cuda.allow_legacy_ipc_handles`).
    LegacyIpc(&'a [u8]),
}

/// Whether this shim can use CUDA at all.
///
/// # Errors
/// [`ShimError::Unsupported`] naming why: no `cuda` feature, or the driver
/// does not load or initialise.
fn cuda_usable() -> Result<(), ShimError> {
    #[cfg(feature = "cuda")]
    {
        fabric::cuda::init().map_err(|e| {
            ShimError::Unsupported(format!(
                "this host-shim cannot use CUDA ({e}); register host memory instead"
            ))
        })
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(ShimError::Unsupported(
            "this host-shim was built without the `cuda` feature; register host memory instead"
                .into(),
        ))
    }
}

/// Marks a buffer used by one request for as long as it lives.
#[derive(Debug)]
pub struct InUse(Arc<Buffer>);

impl InUse {
    /// Counts a request on `buffer`.
    pub fn new(buffer: Arc<Buffer>) -> InUse {
        buffer.in_use.fetch_add(1, Ordering::Relaxed);
        InUse(buffer)
    }

    /// The buffer.
    pub fn buffer(&self) -> &Buffer {
        &self.0
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.in_use.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Checks that a passed fd is shared memory the shim can map safely and
/// returns its size: a regular file (memfd) sealed with `F_SEAL_SHRINK` (it
/// can never shrink under the shim's mapping, which would fault), and not
/// write-sealed (the shim maps it writable).
///
/// # Errors
/// [`ShimError::BadBuffer`] with what to do instead.
pub fn check_shared_memory_fd(fd: &OwnedFd) -> Result<u64, ShimError> {
    use rustix::fs::{FileType, SealFlags};
    let st = rustix::fs::fstat(fd)
        .map_err(|e| ShimError::BadBuffer(format!("cannot fstat the passed fd: {e}")))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(ShimError::BadBuffer(
            "the passed fd is not shared memory; pass a memfd (memfd_create with MFD_ALLOW_SEALING, sealed with F_SEAL_SHRINK)".into(),
        ));
    }
    let seals = rustix::fs::fcntl_get_seals(fd).map_err(|_| {
        ShimError::BadBuffer(
            "the passed fd does not support seals; pass a memfd created with MFD_ALLOW_SEALING and sealed with F_SEAL_SHRINK".into(),
        )
    })?;
    if !seals.contains(SealFlags::SHRINK) {
        return Err(ShimError::BadBuffer(
            "the passed memfd is not sealed with F_SEAL_SHRINK (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK)); the shim maps only memory that cannot shrink under it".into(),
        ));
    }
    if seals.intersects(SealFlags::WRITE | SealFlags::FUTURE_WRITE) {
        return Err(ShimError::BadBuffer(
            "the passed memfd is sealed against writes; objects could not be placed in it".into(),
        ));
    }
    u64::try_from(st.st_size)
        .map_err(|_| ShimError::BadBuffer("the passed memfd has a negative size".into()))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd as _;

    fn registry(yaml_extra: &str) -> Registry {
        let text = format!(
            r#"
socket: {{ path: /tmp/x.sock }}
agent: {{ endpoint: "http://127.0.0.1:1", token_file: /x }}
fabric: {{ listen: "127.0.0.1:0", fabric_key_file: /x }}
tenants:
  - name: alice
    uids: [1000]
    max_buffers: 2
    max_buffer_bytes: 1MiB
  - name: bob
    gids: [2000]
{yaml_extra}"#
        );
        let config = crate::config::parse(std::path::Path::new("t.yaml"), &text).unwrap();
        Registry::new(&config, Domain::tcp(), &[], Arc::new(Metrics::new())).unwrap()
    }

    fn memfd(len: usize) -> OwnedFd {
        let m = Memory::memfd("t", len).unwrap();
        m.fd().unwrap().try_clone_to_owned().unwrap()
    }

    const ALICE: Peer = Peer {
        uid: 1000,
        gid: 1000,
        pid: 1,
    };
    const BOB: Peer = Peer {
        uid: 5,
        gid: 2000,
        pid: 2,
    };

    #[test]
    fn tenants_come_from_uid_then_gid() {
        let r = registry("");
        assert_eq!(r.tenant_of(ALICE).unwrap().name, "alice");
        assert_eq!(r.tenant_of(BOB).unwrap().name, "bob");
        // uid wins over gid.
        let both = Peer {
            uid: 1000,
            gid: 2000,
            pid: 3,
        };
        assert_eq!(r.tenant_of(both).unwrap().name, "alice");
        let e = r
            .tenant_of(Peer {
                uid: 9,
                gid: 9,
                pid: 0,
            })
            .unwrap_err();
        assert_eq!(e, ShimError::UnknownTenant { uid: 9, gid: 9 });
    }

    #[test]
    fn buffers_are_scoped_limited_and_released_with_their_lease() {
        let r = registry("");
        let (alice, lease) = r.open_lease(ALICE).unwrap();
        let h = r.add_fd(&alice, &lease, memfd(4096)).unwrap();
        let b = r
            .register_host(&alice, &lease.id.0, &h.0, 4096, "first")
            .unwrap();
        assert_eq!(r.buffer(&alice, b.id).unwrap().size(), 4096);
        // The handle is single use.
        assert_eq!(
            r.register_host(&alice, &lease.id.0, &h.0, 4096, "")
                .unwrap_err()
                .reason(),
            "NoSuchLease"
        );
        // Bob can neither see alice's buffer nor use her lease.
        let (bob, bob_lease) = r.open_lease(BOB).unwrap();
        assert_eq!(
            r.buffer(&bob, b.id).unwrap_err(),
            ShimError::NoSuchBuffer(b.id)
        );
        assert_eq!(
            r.release(&bob, b.id).unwrap_err(),
            ShimError::NoSuchBuffer(b.id)
        );
        let h_bob = r.add_fd(&bob, &bob_lease, memfd(4096)).unwrap();
        assert_eq!(
            r.register_host(&bob, &lease.id.0, &h_bob.0, 4096, "")
                .unwrap_err()
                .reason(),
            "NoSuchLease"
        );
        // Limits: size beyond the file, total bytes, count.
        let h = r.add_fd(&alice, &lease, memfd(4096)).unwrap();
        assert_eq!(
            r.register_host(&alice, &lease.id.0, &h.0, 8192, "")
                .unwrap_err()
                .reason(),
            "OutOfBounds"
        );
        let h = r.add_fd(&alice, &lease, memfd(2 << 20)).unwrap();
        assert_eq!(
            r.register_host(&alice, &lease.id.0, &h.0, 2 << 20, "")
                .unwrap_err()
                .reason(),
            "BufferLimit"
        );
        let h = r.add_fd(&alice, &lease, memfd(4096)).unwrap();
        r.register_host(&alice, &lease.id.0, &h.0, 4096, "second")
            .unwrap();
        let h = r.add_fd(&alice, &lease, memfd(4096)).unwrap();
        let e = r
            .register_host(&alice, &lease.id.0, &h.0, 4096, "")
            .unwrap_err();
        assert_eq!(e.reason(), "BufferLimit");
        assert!(e.to_string().contains("max_buffers 2"), "{e}");
        assert_eq!(r.buffers(&alice).0.len(), 2);
        // Closing the lease releases everything under it.
        r.close_lease(&alice, &lease);
        let (left, bytes) = r.buffers(&alice);
        assert!(left.is_empty());
        assert_eq!(bytes, 0);
        assert_eq!(
            r.buffer(&alice, b.id).unwrap_err(),
            ShimError::NoSuchBuffer(b.id)
        );
    }

    #[test]
    fn only_sealed_memfds_are_accepted() {
        // A plain file, an unsealed memfd, a pipe.
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(dir.path().join("f")).unwrap();
        f.set_len(4096).unwrap();
        let e = check_shared_memory_fd(&OwnedFd::from(f)).unwrap_err();
        assert!(e.to_string().contains("does not support seals"), "{e}");

        let unsealed =
            rustix::fs::memfd_create("u", rustix::fs::MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&unsealed, 4096).unwrap();
        let e = check_shared_memory_fd(&unsealed).unwrap_err();
        assert!(e.to_string().contains("F_SEAL_SHRINK"), "{e}");

        rustix::fs::fcntl_add_seals(
            &unsealed,
            rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::WRITE,
        )
        .unwrap();
        let e = check_shared_memory_fd(&unsealed).unwrap_err();
        assert!(e.to_string().contains("sealed against writes"), "{e}");

        let (rd, _wr) = std::io::pipe().unwrap();
        let e = check_shared_memory_fd(&OwnedFd::from(rd)).unwrap_err();
        assert!(e.to_string().contains("not shared memory"), "{e}");

        let good = memfd(8192);
        assert_eq!(check_shared_memory_fd(&good).unwrap(), 8192);
        let _ = good.as_fd();
    }

    #[test]
    fn pending_fds_are_bounded_per_lease() {
        let r = registry("leases:\n  max_pending_fds: 2\n");
        let (alice, lease) = r.open_lease(ALICE).unwrap();
        r.add_fd(&alice, &lease, memfd(4096)).unwrap();
        r.add_fd(&alice, &lease, memfd(4096)).unwrap();
        let e = r.add_fd(&alice, &lease, memfd(4096)).unwrap_err();
        assert_eq!(e.reason(), "BufferLimit");
    }

    #[test]
    fn pending_fds_are_bounded_per_tenant_over_its_leases() {
        // alice may have 2 buffers: two fds waiting on two leases are all
        // she may make the shim hold; bob is not affected.
        let r = registry("");
        let (alice, a) = r.open_lease(ALICE).unwrap();
        let (_, b) = r.open_lease(ALICE).unwrap();
        r.add_fd(&alice, &a, memfd(4096)).unwrap();
        let h = r.add_fd(&alice, &b, memfd(4096)).unwrap();
        for lease in [&a, &b] {
            let e = r.add_fd(&alice, lease, memfd(4096)).unwrap_err();
            assert_eq!(e.reason(), "BufferLimit");
            assert!(e.to_string().contains("max_buffers"), "{e}");
        }
        let (bob, bob_lease) = r.open_lease(BOB).unwrap();
        r.add_fd(&bob, &bob_lease, memfd(4096)).unwrap();
        // Registering one makes room; so does closing a lease.
        r.register_host(&alice, &b.id.0, &h.0, 4096, "").unwrap();
        r.add_fd(&alice, &b, memfd(4096)).unwrap();
        r.add_fd(&alice, &b, memfd(4096)).unwrap_err();
        r.close_lease(&alice, &a);
        r.add_fd(&alice, &b, memfd(4096)).unwrap();
        let (_, c) = r.open_lease(ALICE).unwrap();
        assert_eq!(
            r.add_fd(&alice, &c, memfd(4096)).unwrap_err().reason(),
            "BufferLimit"
        );
    }
}
