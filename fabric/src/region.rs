//! Domains, regions, windows and local slices: the registration side of the
//! fabric, shared by both backends.
//!
//! Every remotely usable key (a region's own rkey and each window's rkey) is a
//! [`KeyEntry`] in its domain's key table. A responder looks the rkey up,
//! checks bounds, access, expiry and revocation ([`KeyEntry::authorize`]) and
//! then touches region memory only while holding a [`PlacementGuard`]; the
//! guard is taken per system call, never across an `await`, and
//! [`Window::revoke`] takes the key's lock for writing, so when `revoke`
//! returns no further byte can land in (or be read from) the window.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, Weak};
use std::time::{Duration, Instant};

use s3dma_wire::RemoteBuf;

use crate::access::Access;
use crate::backend::{Backend, Registrar, Registration};
use crate::error::{FabricError, OpStatus, Result};
use crate::memory::{Memory, MemoryKind};

pub(crate) struct DomainInner {
    backend: Backend,
    keys: Mutex<HashMap<u32, Arc<KeyEntry>>>,
    /// The backend's hardware registration hook (`None`: software keys).
    registrar: Option<Box<dyn Registrar>>,
}

impl fmt::Debug for DomainInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Domain")
            .field("backend", &self.backend)
            .field("keys", &self.keys.lock().map(|k| k.len()).unwrap_or(0))
            .finish()
    }
}

/// A protection domain: owns registrations and their keys.
///
/// Cheap to clone; regions keep their domain alive.
#[derive(Clone, Debug)]
pub struct Domain {
    pub(crate) inner: Arc<DomainInner>,
}

impl Domain {
    /// A domain on `backend` with its registration hook (`open.rs` picks
    /// the hook; `None` for software keys).
    pub(crate) fn with_registrar(
        backend: Backend,
        registrar: Option<Box<dyn Registrar>>,
    ) -> Domain {
        Domain {
            inner: Arc::new(DomainInner {
                backend,
                keys: Mutex::new(HashMap::new()),
                registrar,
            }),
        }
    }

    /// A domain on the software (`tcp`) backend. Never fails.
    pub fn tcp() -> Domain {
        Domain::with_registrar(Backend::Tcp, None)
    }

    /// Whether `other` is this very domain (a clone of it).
    pub fn same(&self, other: &Domain) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The backend of this domain.
    pub fn backend(&self) -> Backend {
        self.inner.backend
    }

    /// The backend's registration hook (for its connection code).
    pub(crate) fn registrar(&self) -> Option<&dyn Registrar> {
        self.inner.registrar.as_deref()
    }

    /// Registers `mem` with `access` and returns the region.
    pub fn register(&self, mem: Memory, access: Access) -> Result<Region> {
        self.register_with_key_access(mem, access, access)
    }

    /// Registers `mem` so that only windows reach it remotely: the region's
    /// own rkey allows local use alone, while [`Region::window`] may still
    /// mint windows with any subset of `access`. For memory owned by someone
    /// else (a tenant's buffer): a peer can never name the whole buffer,
    /// only the bytes of a live window.
    pub fn register_windows_only(&self, mem: Memory, access: Access) -> Result<Region> {
        let local =
            Access::from_bits(access.bits() & Access::LOCAL_WRITE.bits()).unwrap_or(Access::NONE);
        self.register_with_key_access(mem, access, local)
    }

    fn register_with_key_access(
        &self,
        mem: Memory,
        access: Access,
        key_access: Access,
    ) -> Result<Region> {
        self.register_shared(Arc::new(mem), access, key_access)
    }

    fn register_shared(
        &self,
        mem: Arc<Memory>,
        access: Access,
        key_access: Access,
    ) -> Result<Region> {
        let addr = mem.addr();
        let len = mem.len() as u64;
        let registration = self.hardware_registration(&mem, 0, mem.len(), key_access)?;
        let key = self.insert_key(addr, len, key_access, None, None, registration)?;
        let inner = Arc::new(RegionInner {
            domain: self.clone(),
            mem,
            access,
            key,
        });
        *inner.key.region.write().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(&inner);
        Ok(Region { inner })
    }

    /// The backend's registration of `[offset, offset+len)` of `mem`, if it
    /// has one. An empty range gets a software key instead: verbs cannot
    /// register zero bytes (`ibv_reg_mr` answers EFAULT) and a zero-length
    /// RDMA operation never checks its rkey, so nothing is lost.
    fn hardware_registration(
        &self,
        mem: &Memory,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Option<Box<dyn Registration>>> {
        match self.registrar() {
            Some(r) if len > 0 => Ok(Some(r.register(mem, offset, len, access)?)),
            _ => Ok(None),
        }
    }

    /// Allocates `len` bytes of anonymous memory and registers them.
    pub fn alloc(&self, len: usize, access: Access) -> Result<Region> {
        self.register(Memory::anonymous(len)?, access)
    }

    fn insert_key(
        &self,
        addr: u64,
        len: u64,
        access: Access,
        expires: Option<Instant>,
        parent: Option<Arc<KeyEntry>>,
        registration: Option<Box<dyn Registration>>,
    ) -> Result<Arc<KeyEntry>> {
        let mut keys = self.inner.keys.lock().unwrap_or_else(|e| e.into_inner());
        let rkey = match &registration {
            Some(r) => r.rkey(),
            None => loop {
                let k: u32 = rand::random();
                if k != 0 && !keys.contains_key(&k) {
                    break k;
                }
            },
        };
        let region = parent
            .as_ref()
            .map(|p| p.region.read().unwrap_or_else(|e| e.into_inner()).clone())
            .unwrap_or_default();
        let entry = Arc::new(KeyEntry {
            rkey,
            addr,
            len,
            access,
            expires,
            parent,
            region: RwLock::new(region),
            revoked: RwLock::new(false),
            registration: Mutex::new(registration),
        });
        keys.insert(rkey, entry.clone());
        Ok(entry)
    }

    fn remove_key(&self, entry: &KeyEntry) {
        entry.revoke();
        let children: Vec<Arc<KeyEntry>> = {
            let mut keys = self.inner.keys.lock().unwrap_or_else(|e| e.into_inner());
            if keys
                .get(&entry.rkey)
                .is_some_and(|e| std::ptr::eq(&**e, entry))
            {
                keys.remove(&entry.rkey);
            }
            if entry.parent.is_some() {
                Vec::new()
            } else {
                keys.values()
                    .filter(|k| k.parent.as_ref().is_some_and(|p| std::ptr::eq(&**p, entry)))
                    .cloned()
                    .collect()
            }
        };
        // A region's windows die with it. On tcp the parent's flag already
        // refuses them; with hardware registration each window is its own
        // registration (a verbs MR), which the NIC
        // keeps honouring until it is deregistered here.
        for child in children {
            child.revoke();
        }
    }

    /// Looks up a remote key.
    pub(crate) fn lookup(&self, rkey: u32) -> Option<Arc<KeyEntry>> {
        self.inner
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&rkey)
            .cloned()
    }

    /// Number of live keys (regions plus windows).
    pub fn key_count(&self) -> usize {
        self.inner
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

/// A remotely usable key: a region's own rkey or a window's.
pub(crate) struct KeyEntry {
    pub(crate) rkey: u32,
    /// First address covered.
    pub(crate) addr: u64,
    /// Bytes covered.
    pub(crate) len: u64,
    pub(crate) access: Access,
    expires: Option<Instant>,
    /// The region's own key, for a window: revoking the region revokes the window.
    parent: Option<Arc<KeyEntry>>,
    region: RwLock<Weak<RegionInner>>,
    /// Write-locked by revocation; read-locked around every placement.
    revoked: RwLock<bool>,
    /// The hardware registration behind this key, if the backend has one.
    registration: Mutex<Option<Box<dyn Registration>>>,
}

impl fmt::Debug for KeyEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyEntry")
            .field("rkey", &format_args!("{:#010x}", self.rkey))
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("access", &self.access)
            .finish()
    }
}

/// Why a remote request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Denied {
    Revoked,
    Expired,
    Access { need: Access, have: Access },
    Bounds,
    Gone,
}

impl Denied {
    pub(crate) fn status(&self) -> OpStatus {
        OpStatus::RemoteAccess
    }
}

/// Holding this keeps the key (and its region's key) from being revoked; the
/// memory it names stays valid while it is held.
pub(crate) struct PlacementGuard<'a> {
    _own: RwLockReadGuard<'a, bool>,
    _parent: Option<RwLockReadGuard<'a, bool>>,
}

impl KeyEntry {
    fn is_expired(&self, now: Instant) -> bool {
        self.expires.is_some_and(|t| now >= t)
    }

    fn revoke(&self) {
        *self.revoked.write().unwrap_or_else(|e| e.into_inner()) = true;
        // Hardware: deregistering makes the NIC refuse the rkey; it returns
        // once the hardware no longer uses it.
        drop(
            self.registration
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
    }

    fn is_revoked(&self) -> bool {
        *self.revoked.read().unwrap_or_else(|e| e.into_inner())
            || self.parent.as_ref().is_some_and(|p| p.is_revoked())
    }

    /// Checks a remote request for `[addr, addr+len)` needing `need` and
    /// returns the region and the byte offset of `addr` in it.
    pub(crate) fn authorize(
        &self,
        addr: u64,
        len: u64,
        need: Access,
    ) -> std::result::Result<(Arc<RegionInner>, usize), Denied> {
        if self.is_revoked() {
            return Err(Denied::Revoked);
        }
        let now = Instant::now();
        if self.is_expired(now) || self.parent.as_ref().is_some_and(|p| p.is_expired(now)) {
            return Err(Denied::Expired);
        }
        if !self.access.contains(need) {
            return Err(Denied::Access {
                need,
                have: self.access,
            });
        }
        let end = addr.checked_add(len).ok_or(Denied::Bounds)?;
        if addr < self.addr || end > self.addr + self.len {
            return Err(Denied::Bounds);
        }
        let region = self
            .region
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .upgrade()
            .ok_or(Denied::Gone)?;
        let offset = (addr - region.mem.addr()) as usize;
        Ok((region, offset))
    }

    /// Enters a placement: `None` if the key was revoked or has expired.
    pub(crate) fn enter(&self) -> Option<PlacementGuard<'_>> {
        let now = Instant::now();
        let parent = match &self.parent {
            Some(p) => {
                let g = p.revoked.read().unwrap_or_else(|e| e.into_inner());
                if *g || p.is_expired(now) {
                    return None;
                }
                Some(g)
            }
            None => None,
        };
        let own = self.revoked.read().unwrap_or_else(|e| e.into_inner());
        if *own || self.is_expired(now) {
            return None;
        }
        Some(PlacementGuard {
            _own: own,
            _parent: parent,
        })
    }
}

pub(crate) struct RegionInner {
    pub(crate) domain: Domain,
    /// Shared by the registrations of the same memory in other domains
    /// ([`Region::register_in`]): unmapped with the last of them.
    pub(crate) mem: Arc<Memory>,
    access: Access,
    pub(crate) key: Arc<KeyEntry>,
}

impl Drop for RegionInner {
    fn drop(&mut self) {
        self.domain.remove_key(&self.key);
    }
}

impl RegionInner {
    /// The local key of the hardware registration (0 on software keys).
    #[cfg(feature = "verbs")]
    pub(crate) fn lkey(&self) -> u32 {
        self.key
            .registration
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|m| m.lkey())
            .unwrap_or(0)
    }
}

/// Registered memory: an address range with access flags and an rkey.
///
/// Cheap to clone. The memory stays mapped while any clone, window, local
/// slice or in-flight operation refers to it; the rkey stops working at
/// [`Region::deregister`] or when the last handle goes.
#[derive(Clone)]
pub struct Region {
    pub(crate) inner: Arc<RegionInner>,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("rkey", &format_args!("{:#010x}", self.rkey()))
            .field("access", &self.access())
            .field("kind", &self.kind())
            .finish()
    }
}

fn check_range(what: &str, offset: usize, len: usize, total: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(FabricError::InvalidArgument(format!(
            "{what}: range {offset}+{len} is outside the {total} bytes available"
        ))),
    }
}

impl Region {
    /// Start address (what the peer uses as the remote address).
    pub fn addr(&self) -> u64 {
        self.inner.mem.addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.mem.len()
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The region's remote key (full range, full access).
    pub fn rkey(&self) -> u32 {
        self.inner.key.rkey
    }

    /// Access flags given at registration.
    pub fn access(&self) -> Access {
        self.inner.access
    }

    /// Host or CUDA memory.
    pub fn kind(&self) -> MemoryKind {
        self.inner.mem.kind()
    }

    /// The domain the region belongs to.
    pub fn domain(&self) -> &Domain {
        &self.inner.domain
    }

    /// The shared-memory fd of memfd / shm regions.
    pub fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.mem.fd()
    }

    /// The remote description of the whole region.
    pub fn remote(&self) -> RemoteBuf {
        RemoteBuf {
            addr: self.addr(),
            len: self.len() as u64,
            rkey: self.rkey(),
        }
    }

    /// Stops remote access through the region's rkey and all its windows.
    /// Returns after any placement in progress has finished: no byte lands
    /// in (or is read from) the region remotely afterwards.
    pub fn deregister(&self) {
        self.inner.domain.remove_key(&self.inner.key);
    }

    /// The same memory registered in `domain` too (another rail's device,
    /// or another protection domain), with this region's access and the
    /// same reach for its own key (windows only, when this region is
    /// [`Domain::register_windows_only`]'s). The memory stays mapped while
    /// either region lives; each region's windows are its own.
    ///
    /// # Errors
    /// The region was deregistered; `domain`'s backend differs; the
    /// registration fails.
    pub fn register_in(&self, domain: &Domain) -> Result<Region> {
        if self.inner.key.is_revoked() {
            return Err(FabricError::InvalidArgument(
                "the region has been deregistered".into(),
            ));
        }
        if domain.backend() != self.inner.domain.backend() {
            return Err(FabricError::BackendMismatch(format!(
                "a {:?} region cannot be registered in a {:?} domain",
                self.inner.domain.backend(),
                domain.backend()
            )));
        }
        domain.register_shared(
            Arc::clone(&self.inner.mem),
            self.inner.access,
            self.inner.key.access,
        )
    }

    /// Mints a window over `[offset, offset+len)` of the region with `access`
    /// (a subset of the region's remote access) and an optional time to live.
    pub fn window(
        &self,
        offset: usize,
        len: usize,
        access: Access,
        ttl: Option<Duration>,
    ) -> Result<Window> {
        check_range("window", offset, len, self.len())?;
        if !self.access().contains(access) {
            return Err(FabricError::InvalidArgument(format!(
                "window access {access} is not a subset of the region's {}",
                self.access()
            )));
        }
        if self.inner.key.is_revoked() {
            return Err(FabricError::InvalidArgument(
                "the region has been deregistered".into(),
            ));
        }
        let registration =
            self.inner
                .domain
                .hardware_registration(&self.inner.mem, offset, len, access)?;
        let key = self.inner.domain.insert_key(
            self.addr() + offset as u64,
            len as u64,
            access,
            // A ttl too large for an `Instant` means "never expires" (no panic).
            ttl.and_then(|t| Instant::now().checked_add(t)),
            Some(self.inner.key.clone()),
            registration,
        )?;
        if self.inner.key.is_revoked() {
            // Deregistered while we minted it (after the check above): its
            // scan of the windows may have missed this one.
            self.inner.domain.remove_key(&key);
            return Err(FabricError::InvalidArgument(
                "the region has been deregistered".into(),
            ));
        }
        if let (Some(ttl), Some(_), Some(_)) = (ttl, key.expires, self.inner.domain.registrar()) {
            // Hardware knows nothing of expiry: deregister the window when it expires.
            schedule_expiry(self.inner.domain.clone(), Arc::downgrade(&key), ttl);
        }
        Ok(Window {
            region: self.clone(),
            key,
        })
    }

    /// A local slice `[offset, offset+len)` to use as the local side of an
    /// operation.
    pub fn slice(&self, offset: usize, len: usize) -> Result<LocalSlice> {
        check_range("local slice", offset, len, self.len())?;
        Ok(LocalSlice {
            region: self.clone(),
            offset,
            len,
        })
    }

    /// The whole region as a local slice.
    pub fn as_slice(&self) -> LocalSlice {
        LocalSlice {
            region: self.clone(),
            offset: 0,
            len: self.len(),
        }
    }

    /// Copies `src` into the region at `offset` (host memory only; CUDA
    /// regions copy with the driver).
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range("write_at", offset, src.len(), self.len())?;
        match self.kind() {
            // SAFETY: the range was checked to lie inside the mapping, which
            // `self` keeps alive; `src` cannot overlap region memory that we
            // never lend out as a Rust reference. Concurrent remote access to
            // the same bytes is the application's business (RDMA semantics).
            MemoryKind::Host => unsafe {
                std::ptr::copy_nonoverlapping(
                    src.as_ptr(),
                    self.inner.mem.as_ptr().add(offset),
                    src.len(),
                );
            },
            MemoryKind::Cuda => cuda_copy_in(&self.inner.mem, offset, src)?,
        }
        Ok(())
    }

    /// Copies region bytes at `offset` into `dst`.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range("read_at", offset, dst.len(), self.len())?;
        match self.kind() {
            // SAFETY: as in `write_at`; `dst` is a distinct Rust buffer.
            MemoryKind::Host => unsafe {
                std::ptr::copy_nonoverlapping(
                    self.inner.mem.as_ptr().add(offset),
                    dst.as_mut_ptr(),
                    dst.len(),
                );
            },
            MemoryKind::Cuda => cuda_copy_out(&self.inner.mem, offset, dst)?,
        }
        Ok(())
    }

    /// Raw pointer to the first byte. Writing through it races with remote
    /// access exactly as on real RDMA; the caller must keep the region alive.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.mem.as_ptr()
    }
}

fn schedule_expiry(domain: Domain, key: Weak<KeyEntry>, ttl: Duration) {
    let expire = move || {
        if let Some(k) = key.upgrade() {
            domain.remove_key(&k);
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(h) => {
            h.spawn(async move {
                tokio::time::sleep(ttl).await;
                expire();
            });
        }
        Err(_) => {
            std::thread::spawn(move || {
                std::thread::sleep(ttl);
                expire();
            });
        }
    }
}

#[cfg(feature = "cuda")]
pub(crate) fn cuda_copy_in(mem: &Memory, offset: usize, src: &[u8]) -> Result<()> {
    let dm = mem
        .cuda_memory()
        .ok_or_else(|| FabricError::Cuda("not CUDA memory".into()))?;
    dm.copy_from_host(offset, src)
}

#[cfg(feature = "cuda")]
pub(crate) fn cuda_copy_out(mem: &Memory, offset: usize, dst: &mut [u8]) -> Result<()> {
    let dm = mem
        .cuda_memory()
        .ok_or_else(|| FabricError::Cuda("not CUDA memory".into()))?;
    dm.copy_to_host(offset, dst)
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn cuda_copy_in(_mem: &Memory, _offset: usize, _src: &[u8]) -> Result<()> {
    Err(FabricError::Cuda("built without the `cuda` feature".into()))
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn cuda_copy_out(_mem: &Memory, _offset: usize, _dst: &mut [u8]) -> Result<()> {
    Err(FabricError::Cuda("built without the `cuda` feature".into()))
}

/// A narrower, revocable remote key over part of a region, with an access
/// subset and an optional expiry. Dropping the window revokes it.
pub struct Window {
    region: Region,
    key: Arc<KeyEntry>,
}

impl fmt::Debug for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Window")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("rkey", &format_args!("{:#010x}", self.rkey()))
            .field("access", &self.access())
            .field("revoked", &self.is_revoked())
            .finish()
    }
}

impl Window {
    /// First remote address of the window.
    pub fn addr(&self) -> u64 {
        self.key.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.key.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.key.len == 0
    }

    /// The window's rkey.
    pub fn rkey(&self) -> u32 {
        self.key.rkey
    }

    /// The window's access.
    pub fn access(&self) -> Access {
        self.key.access
    }

    /// When the window stops working by itself, if ever.
    pub fn expires_at(&self) -> Option<Instant> {
        self.key.expires
    }

    /// The region underneath.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// The remote description of the window.
    pub fn remote(&self) -> RemoteBuf {
        RemoteBuf {
            addr: self.addr(),
            len: self.len(),
            rkey: self.rkey(),
        }
    }

    /// Revokes the window. Waits for a placement in progress (at most one
    /// system call's worth of bytes) to finish; afterwards no byte lands in or
    /// leaves the window remotely. Idempotent.
    pub fn revoke(&self) {
        self.region.inner.domain.remove_key(&self.key);
    }

    /// Whether the window was revoked (or its region deregistered).
    pub fn is_revoked(&self) -> bool {
        self.key.is_revoked()
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        self.revoke();
    }
}

/// The local side of an operation: part of a registered region. An in-flight
/// operation owns its `LocalSlice` (and so keeps the memory alive) until it
/// completes, even if its completion future is dropped.
#[derive(Clone)]
pub struct LocalSlice {
    pub(crate) region: Region,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl fmt::Debug for LocalSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalSlice")
            .field("region", &format_args!("{:#x}", self.region.addr()))
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl LocalSlice {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset in the region.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The region.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// A narrower slice `[offset, offset+len)` of this slice.
    pub fn slice(&self, offset: usize, len: usize) -> Result<LocalSlice> {
        check_range("local slice", offset, len, self.len)?;
        Ok(LocalSlice {
            region: self.region.clone(),
            offset: self.offset + offset,
            len,
        })
    }

    /// Copies `src` (exactly `len` bytes) into the slice.
    pub fn copy_from(&self, src: &[u8]) -> Result<()> {
        if src.len() != self.len {
            return Err(FabricError::InvalidArgument(format!(
                "copy_from: {} bytes into a {}-byte slice",
                src.len(),
                self.len
            )));
        }
        self.region.write_at(self.offset, src)
    }

    /// Copies the slice into a new vector.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.len];
        self.region.read_at(self.offset, &mut v)?;
        Ok(v)
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        // SAFETY: offset <= region length was checked when the slice was made.
        unsafe { self.region.inner.mem.as_ptr().add(self.offset) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_check_bounds_access_revocation_and_expiry() {
        let d = Domain::tcp();
        let r = d.alloc(8192, Access::ALL).unwrap();
        let w = r.window(4096, 1024, Access::REMOTE_WRITE, None).unwrap();
        assert_eq!(w.addr(), r.addr() + 4096);
        let e = d.lookup(w.rkey()).unwrap();
        let (_, off) = e
            .authorize(w.addr() + 10, 100, Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(off, 4106);
        assert!(matches!(
            e.authorize(w.addr(), 100, Access::REMOTE_READ),
            Err(Denied::Access { .. })
        ));
        assert_eq!(
            e.authorize(w.addr() + 1000, 25, Access::REMOTE_WRITE).err(),
            Some(Denied::Bounds)
        );
        assert_eq!(
            e.authorize(w.addr() - 1, 1, Access::REMOTE_WRITE).err(),
            Some(Denied::Bounds)
        );
        assert_eq!(
            e.authorize(u64::MAX, 2, Access::REMOTE_WRITE).err(),
            Some(Denied::Bounds)
        );
        assert!(e.enter().is_some());
        w.revoke();
        assert!(e.enter().is_none());
        assert_eq!(
            e.authorize(w.addr(), 1, Access::REMOTE_WRITE).err(),
            Some(Denied::Revoked)
        );
        assert!(d.lookup(w.rkey()).is_none());

        let x = r
            .window(0, 10, Access::REMOTE_READ, Some(Duration::ZERO))
            .unwrap();
        let e = d.lookup(x.rkey()).unwrap();
        assert_eq!(
            e.authorize(x.addr(), 1, Access::REMOTE_READ).err(),
            Some(Denied::Expired)
        );
        assert!(e.enter().is_none());

        // A huge ttl is "no expiry", not an `Instant` overflow panic.
        let forever = r
            .window(0, 10, Access::REMOTE_READ, Some(Duration::MAX))
            .unwrap();
        assert_eq!(forever.expires_at(), None);
        assert!(d.lookup(forever.rkey()).unwrap().enter().is_some());

        assert!(r.window(8000, 500, Access::REMOTE_READ, None).is_err());
        let ro = d.alloc(10, Access::REMOTE_READ).unwrap();
        assert!(ro.window(0, 10, Access::REMOTE_WRITE, None).is_err());
    }

    #[test]
    fn deregistering_a_region_revokes_its_windows_and_drop_removes_keys() {
        let d = Domain::tcp();
        let r = d.alloc(100, Access::ALL).unwrap();
        let w = r.window(0, 100, Access::REMOTE_READ, None).unwrap();
        assert_eq!(d.key_count(), 2);
        r.deregister();
        assert!(w.is_revoked());
        let e = d.lookup(w.rkey()).unwrap();
        assert!(e.enter().is_none());
        // The window's own key is revoked too: on verbs that deregisters the
        // window's MR, without which the NIC would keep serving its rkey.
        assert!(*e.revoked.read().unwrap());
        assert!(e.registration.lock().unwrap().is_none());
        drop(w);
        drop(r);
        assert_eq!(d.key_count(), 0);
    }

    #[test]
    fn copies_and_slices() {
        let d = Domain::tcp();
        let r = d.alloc(100, Access::ALL).unwrap();
        let s = r.slice(10, 20).unwrap();
        s.copy_from(&[7u8; 20]).unwrap();
        assert_eq!(s.to_vec().unwrap(), vec![7u8; 20]);
        assert!(s.slice(10, 11).is_err());
        assert!(r.slice(90, 11).is_err());
        assert!(s.copy_from(&[1u8; 3]).is_err());
        let rb = r.remote().slice(10, 90).unwrap();
        assert_eq!(rb.addr, r.addr() + 10);
        assert!(r.remote().slice(10, 91).is_err());
    }
}
