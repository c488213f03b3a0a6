//! Memory sources that can be registered as regions.
//!
//! A [`Memory`] owns (or keeps mapped) a contiguous range of bytes that stays
//! at a fixed address until it is dropped:
//!
//! * [`Memory::anonymous`]: private, page-aligned anonymous memory;
//! * [`Memory::memfd`], [`Memory::from_fd`], [`Memory::open_shm`]: shared
//!   memory that another process maps too (a memfd passed over a Unix socket,
//!   or a file under `/dev/shm`);
//! * `Memory::cuda` (feature `cuda`): CUDA device memory.
//!
//! Region memory is *shared with agents outside the Rust abstract machine*
//! (the kernel's `recv`/`send` on the tcp backend, the NIC on verbs, other
//! processes for shared memory), exactly like DMA memory. The crate therefore
//! never hands out long-lived Rust references to it: all access goes through
//! raw pointers, either in system calls or in bounded `copy_nonoverlapping`
//! calls. Concurrent remote writes into the same bytes are the application's
//! business, as with real RDMA.

use std::ffi::CString;
use std::fmt;
use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::ptr::NonNull;

use crate::error::{FabricError, Result};

/// Where a memory range lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Host memory the CPU can address.
    Host,
    /// CUDA device memory (feature `cuda`): not addressable by the CPU.
    Cuda,
}

enum Owner {
    /// Nothing to release (zero-length memory).
    Empty,
    /// An `mmap` mapping of `len` bytes, with the shared-memory fd if any.
    Mapping { map_len: usize, fd: Option<OwnedFd> },
    #[cfg(feature = "cuda")]
    /// A CUDA allocation or import.
    Cuda(crate::cuda::DeviceMemory),
}

/// A contiguous, address-stable range of memory that can become a region.
pub struct Memory {
    ptr: NonNull<u8>,
    len: usize,
    kind: MemoryKind,
    owner: Owner,
}

// SAFETY: `Memory` owns its mapping (or allocation); the raw pointer is only a
// handle to it and no thread-affine state is involved. Access to the bytes is
// through raw pointers with the sharing rules documented on the module.
unsafe impl Send for Memory {}
// SAFETY: see `Send`; `&Memory` only exposes the pointer, length and kind.
unsafe impl Sync for Memory {}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Memory")
            .field("addr", &format_args!("{:#x}", self.ptr.as_ptr() as usize))
            .field("len", &self.len)
            .field("kind", &self.kind)
            .finish()
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let ps = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if ps <= 0 { 4096 } else { ps as usize }
}

fn mmap(len: usize, prot: i32, flags: i32, fd: i32, what: &str) -> Result<NonNull<u8>> {
    // SAFETY: a fresh mapping at a kernel-chosen address; no existing memory is
    // affected. The result is checked against MAP_FAILED below.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(FabricError::Memory {
            what: format!("{what}: mmap of {len} bytes"),
            source: std::io::Error::last_os_error(),
        });
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| FabricError::Memory {
        what: format!("{what}: mmap returned null"),
        source: std::io::Error::other("null mapping"),
    })
}

impl Memory {
    fn empty(kind: MemoryKind) -> Memory {
        Memory {
            ptr: NonNull::dangling(),
            len: 0,
            kind,
            owner: Owner::Empty,
        }
    }

    /// Private, zero-filled, page-aligned anonymous memory of `len` bytes.
    pub fn anonymous(len: usize) -> Result<Memory> {
        if len == 0 {
            return Ok(Memory::empty(MemoryKind::Host));
        }
        let ptr = mmap(
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            "anonymous memory",
        )?;
        Ok(Memory {
            ptr,
            len,
            kind: MemoryKind::Host,
            owner: Owner::Mapping {
                map_len: len,
                fd: None,
            },
        })
    }

    /// Anonymous memory whose address is a multiple of `align` (a power of two).
    /// Page alignment is always given; larger alignments over-map and trim.
    pub fn aligned(len: usize, align: usize) -> Result<Memory> {
        if !align.is_power_of_two() {
            return Err(FabricError::InvalidArgument(format!(
                "alignment {align} is not a power of two"
            )));
        }
        if align <= page_size() || len == 0 {
            return Memory::anonymous(len);
        }
        let map_len = len
            .checked_add(align)
            .ok_or_else(|| FabricError::InvalidArgument(format!("length {len} too large")))?;
        let base = mmap(
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            "aligned memory",
        )?;
        let page = page_size();
        let start = base.as_ptr() as usize;
        let aligned = (start + align - 1) & !(align - 1);
        let head = aligned - start;
        // The kernel mapped whole pages; keep [aligned, keep_end), the pages
        // that `Drop` unmaps, and give the rest back. `aligned + len` need not
        // be page-aligned (munmap would then refuse and leak the tail).
        let mapped_end = start + map_len.next_multiple_of(page);
        let keep_end = (aligned + len).next_multiple_of(page);
        let tail = mapped_end - keep_end;
        // SAFETY: start, aligned and keep_end are page-aligned, so
        // [start, aligned) and [keep_end, mapped_end) are whole-page pieces of
        // the mapping we just made, outside the kept range, used by nobody.
        unsafe {
            if head > 0 {
                libc::munmap(start as *mut libc::c_void, head);
            }
            if tail > 0 {
                libc::munmap(keep_end as *mut libc::c_void, tail);
            }
        }
        Ok(Memory {
            ptr: NonNull::new(aligned as *mut u8)
                .expect("aligned address of a mapping is non-null"),
            len,
            kind: MemoryKind::Host,
            owner: Owner::Mapping {
                map_len: len,
                fd: None,
            },
        })
    }

    /// Shared memory backed by a new memfd (`memfd_create`) of `len` bytes,
    /// mapped shared and sealed with `F_SEAL_SHRINK | F_SEAL_SEAL` (it can
    /// grow, never shrink). [`Memory::fd`] gives the fd to pass to another
    /// process.
    pub fn memfd(name: &str, len: usize) -> Result<Memory> {
        let cname = CString::new(name).map_err(|_| {
            FabricError::InvalidArgument(format!("memfd name {name:?} contains NUL"))
        })?;
        // SAFETY: `cname` is a valid NUL-terminated string; the result is checked.
        let fd = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if fd < 0 {
            return Err(FabricError::Memory {
                what: format!("memfd_create({name})"),
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: `fd` is a fresh descriptor that we own exclusively.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let file = std::fs::File::from(fd);
        file.set_len(len as u64).map_err(|e| FabricError::Memory {
            what: format!("ftruncate memfd {name} to {len} bytes"),
            source: e,
        })?;
        // A peer mapping this memfd (the host-shim) needs it never to shrink
        // under its mapping; it checks for the seal.
        nix::fcntl::fcntl(
            &file,
            nix::fcntl::FcntlArg::F_ADD_SEALS(
                nix::fcntl::SealFlag::F_SEAL_SHRINK | nix::fcntl::SealFlag::F_SEAL_SEAL,
            ),
        )
        .map_err(|e| FabricError::Memory {
            what: format!("sealing memfd {name} against shrinking"),
            source: e.into(),
        })?;
        Memory::from_fd(OwnedFd::from(file), len)
    }

    /// Maps `len` bytes of shared memory from an fd (a memfd or an open
    /// `/dev/shm` file) shared and read-write. The fd is kept open.
    ///
    /// A regular file (memfd, shm file) shorter than `len` is refused:
    /// mapping past its end would make every access to the tail fault
    /// (`SIGBUS` for CPU copies). The fd usually comes from another process,
    /// so its size is checked rather than trusted. (A peer that can still
    /// shrink the file afterwards should seal it with `F_SEAL_SHRINK`.)
    pub fn from_fd(fd: OwnedFd, len: usize) -> Result<Memory> {
        let file = std::fs::File::from(fd);
        let meta = file.metadata().map_err(|e| FabricError::Memory {
            what: "fstat of the shared-memory fd".into(),
            source: e,
        })?;
        if meta.is_file() && meta.len() < len as u64 {
            return Err(FabricError::InvalidArgument(format!(
                "the shared-memory fd has {} bytes, fewer than the {len} to map",
                meta.len()
            )));
        }
        let fd = OwnedFd::from(file);
        if len == 0 {
            let mut m = Memory::empty(MemoryKind::Host);
            m.owner = Owner::Mapping {
                map_len: 0,
                fd: Some(fd),
            };
            return Ok(m);
        }
        let ptr = mmap(
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            "shared memory",
        )?;
        Ok(Memory {
            ptr,
            len,
            kind: MemoryKind::Host,
            owner: Owner::Mapping {
                map_len: len,
                fd: Some(fd),
            },
        })
    }

    /// Opens (and with `create`, creates and sizes) a shared-memory file such
    /// as `/dev/shm/name` and maps `len` bytes of it.
    pub fn open_shm(path: &Path, len: usize, create: bool) -> Result<Memory> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)
            .map_err(|e| FabricError::Memory {
                what: format!("open shared memory {}", path.display()),
                source: e,
            })?;
        let cur = file.metadata().map(|m| m.len()).unwrap_or(0);
        if cur < len as u64 {
            if create {
                file.set_len(len as u64).map_err(|e| FabricError::Memory {
                    what: format!("size {} to {len} bytes", path.display()),
                    source: e,
                })?;
            } else {
                return Err(FabricError::InvalidArgument(format!(
                    "{} has {cur} bytes, fewer than the {len} requested",
                    path.display()
                )));
            }
        }
        Memory::from_fd(OwnedFd::from(file), len)
    }

    /// CUDA device memory of `len` bytes, allocated with `cuMemAlloc` in the
    /// primary context of `device`.
    #[cfg(feature = "cuda")]
    pub fn cuda(device: i32, len: usize) -> Result<Memory> {
        let dm = crate::cuda::DeviceMemory::alloc(device, len)?;
        Ok(Memory::from_cuda(dm))
    }

    /// Device memory another process exported with `cuIpcGetMemHandle`
    /// (legacy IPC; anyone who learns the handle's bytes can open it).
    #[cfg(feature = "cuda")]
    pub fn cuda_ipc(device: i32, handle: crate::cuda::IpcMemHandle, len: usize) -> Result<Memory> {
        let dm = crate::cuda::DeviceMemory::open_ipc(device, handle, len)?;
        Ok(Memory::from_cuda(dm))
    }

    /// The first `len` bytes of device memory another process exported as a
    /// POSIX file descriptor (`cuMemExportToShareableHandle`), mapped on
    /// `device` ([`crate::cuda::DeviceMemory::import_fd`]).
    #[cfg(feature = "cuda")]
    pub fn cuda_fd(device: i32, fd: std::os::fd::BorrowedFd<'_>, len: usize) -> Result<Memory> {
        let dm = crate::cuda::DeviceMemory::import_fd(device, fd, len)?;
        Ok(Memory::from_cuda(dm))
    }

    /// Wraps CUDA device memory.
    #[cfg(feature = "cuda")]
    pub fn from_cuda(dm: crate::cuda::DeviceMemory) -> Memory {
        let len = dm.len();
        match NonNull::new(dm.dptr() as *mut u8) {
            Some(ptr) if len > 0 => Memory {
                ptr,
                len,
                kind: MemoryKind::Cuda,
                owner: Owner::Cuda(dm),
            },
            _ => Memory::empty(MemoryKind::Cuda),
        }
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn cuda_memory(&self) -> Option<&crate::cuda::DeviceMemory> {
        match &self.owner {
            Owner::Cuda(dm) => Some(dm),
            _ => None,
        }
    }

    /// Start address (a device pointer for CUDA memory).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Raw pointer to the first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the memory is zero bytes long.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Host or CUDA memory.
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }

    /// The bytes of host memory (`None` for CUDA memory).
    ///
    /// Memory you hold is not registered in any domain of this process
    /// ([`crate::Domain::register`] takes it), so the only other writer can
    /// be a process you shared its fd with. s3dma's shim writes into a
    /// tenant's memory only while a request the tenant started is in flight
    /// (the tenant client borrows the memory mutably for it) and revokes the
    /// window before answering; bytes are plain `u8`, so even a misbehaving
    /// peer can change values but never make them invalid.
    pub fn host_bytes(&self) -> Option<&[u8]> {
        if self.kind != MemoryKind::Host {
            return None;
        }
        if self.len == 0 {
            return Some(&[]);
        }
        // SAFETY: `ptr..ptr+len` is a live mapping owned by `self` (it is
        // unmapped only in Drop), readable (every host constructor maps
        // PROT_READ|PROT_WRITE), and the returned borrow is tied to `&self`.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The bytes of host memory, writable (`None` for CUDA memory). See
    /// [`Memory::host_bytes`] for who else may write them.
    pub fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        if self.kind != MemoryKind::Host {
            return None;
        }
        if self.len == 0 {
            return Some(&mut []);
        }
        // SAFETY: as in `host_bytes`, and `&mut self` makes this the only
        // borrow of the bytes within this process.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    /// The shared-memory fd, for memfd / shm memory.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.owner {
            Owner::Mapping { fd: Some(fd), .. } => Some(fd.as_fd()),
            _ => None,
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Owner::Mapping { map_len, .. } = self.owner
            && map_len > 0
        {
            // SAFETY: the mapping was created by us with this address and
            // length and is no longer referenced (regions hold the Memory).
            unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), map_len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_and_aligned() {
        let m = Memory::anonymous(10_000).unwrap();
        assert_eq!(m.len(), 10_000);
        assert_eq!(m.addr() % page_size() as u64, 0);
        let a = Memory::aligned(1 << 16, 1 << 21).unwrap();
        assert_eq!(a.addr() % (1 << 21), 0);
        assert!(Memory::aligned(10, 3).is_err());
        assert!(Memory::anonymous(0).unwrap().is_empty());
    }

    /// The `/proc/self/maps` entry containing `addr`: (start, end).
    fn vma_containing(addr: usize) -> Option<(usize, usize)> {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines().find_map(|l| {
            let range = l.split_whitespace().next()?;
            let (a, b) = range.split_once('-')?;
            let (a, b) = (
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            );
            (a <= addr && addr < b).then_some((a, b))
        })
    }

    #[test]
    fn aligned_memory_of_an_odd_length_gives_back_the_over_mapped_tail() {
        let ps = page_size();
        let align = 1 << 21;
        let len = 3 * ps + 100;
        let m = Memory::aligned(len, align).unwrap();
        assert_eq!(m.addr() % align as u64, 0);
        let keep_end = (m.addr() as usize + len).next_multiple_of(ps);
        // SAFETY: the last byte of the memory, which lives for the test.
        unsafe { *m.as_ptr().add(len - 1) = 1 };
        // The page after the kept range must not still belong to our mapping
        // (a mapping that starts at or before our address); something else
        // may have been mapped there since.
        if let Some((start, _)) = vma_containing(keep_end) {
            assert!(
                start >= keep_end,
                "the over-mapped tail at {keep_end:#x} is still mapped ({start:#x}..)"
            );
        }
    }

    #[test]
    fn memfd_is_shared_between_mappings() {
        let m = Memory::memfd("fabric-test", 4096).unwrap();
        let fd = m.fd().unwrap().try_clone_to_owned().unwrap();
        let other = Memory::from_fd(fd, 4096).unwrap();
        // SAFETY: both mappings are 4096 bytes long and live for the test.
        unsafe {
            *m.as_ptr().add(100) = 42;
            assert_eq!(*other.as_ptr().add(100), 42);
        }
    }

    #[test]
    fn an_fd_shorter_than_the_mapping_is_refused() {
        // Mapping past the end of a file maps pages whose every access faults
        // (SIGBUS on a CPU copy such as `Region::write_at`).
        let m = Memory::memfd("fabric-test-short", 4096).unwrap();
        let fd = m.fd().unwrap().try_clone_to_owned().unwrap();
        match Memory::from_fd(fd, 1 << 20) {
            Err(FabricError::InvalidArgument(msg)) => assert!(msg.contains("4096"), "{msg}"),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        let fd = m.fd().unwrap().try_clone_to_owned().unwrap();
        assert_eq!(Memory::from_fd(fd, 4096).unwrap().len(), 4096);
    }

    #[test]
    fn shm_path() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("shm");
        let m = Memory::open_shm(&p, 8192, true).unwrap();
        assert_eq!(m.len(), 8192);
        assert!(Memory::open_shm(&p, 1 << 20, false).is_err());
        let again = Memory::open_shm(&p, 8192, false).unwrap();
        // SAFETY: both mappings are 8192 bytes long and live for the test.
        unsafe {
            *m.as_ptr().add(8000) = 7;
            assert_eq!(*again.as_ptr().add(8000), 7);
        }
    }
}
