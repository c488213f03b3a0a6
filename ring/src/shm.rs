//! Every unsafe operation of the ring: the memfd, the mapping, word access
//! to shared memory and the futex calls.
//!
//! The other process may write any byte of the mapping at any time, so the
//! memory is only ever touched through atomics (`AtomicU32`/`AtomicU64`
//! views of naturally aligned words): no Rust reference to plain bytes of
//! it exists, and a racing write can change what a load returns but never
//! make the access undefined.

use std::io;
use std::os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

/// A shared, writable mapping of a whole memfd, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory, accessed only through
// atomics (`word32`, `word64`), which are `Sync`; the pointer is owned by
// this value and valid until drop.
unsafe impl Send for Mapping {}
// SAFETY: as above: every access is an atomic operation.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared and read-write.
    pub(crate) fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        // SAFETY: a fresh mapping chosen by the kernel (no fixed address),
        // of an fd we borrow for the call; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        Ok(Mapping { ptr, len })
    }

    /// The 32-bit word at `off`; `None` unless `off` is 4-aligned and the
    /// word lies inside the mapping.
    pub(crate) fn word32(&self, off: usize) -> Option<&AtomicU32> {
        if !off.is_multiple_of(4) || off.checked_add(4)? > self.len {
            return None;
        }
        // SAFETY: in bounds (checked above) of a live page-aligned mapping,
        // so 4-aligned; AtomicU32 has u32's layout and any bit pattern is
        // valid; shared memory written by another process is what atomics
        // are for. The reference lives no longer than `self`.
        Some(unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() })
    }

    /// The 64-bit word at `off`; `None` unless `off` is 8-aligned and the
    /// word lies inside the mapping.
    pub(crate) fn word64(&self, off: usize) -> Option<&AtomicU64> {
        if !off.is_multiple_of(8) || off.checked_add(8)? > self.len {
            return None;
        }
        // SAFETY: as in `word32`, for an 8-aligned in-bounds word.
        Some(unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU64>() })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made, unmapped once; no reference
        // into it outlives `self` (they borrow it).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// A new memfd of `len` bytes sealed against shrinking, growing and
/// further sealing (so its size is fixed for both ends).
pub(crate) fn sealed_memfd(len: usize) -> io::Result<OwnedFd> {
    let name = c"s3dma-ring";
    // SAFETY: a NUL-terminated name and flags; the result is checked.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let size = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "ring too large"))?;
    // SAFETY: ftruncate on a descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl(F_ADD_SEALS) on a descriptor we own.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// The seals of `fd` (`F_GET_SEALS`), or an error for an fd that has none
/// (not a memfd).
pub(crate) fn seals(fd: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: fcntl(F_GET_SEALS) only reads the descriptor's state.
    let s = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(s)
}

/// The size of the file behind `fd`, and whether it is a regular file.
pub(crate) fn file_size(fd: BorrowedFd<'_>) -> io::Result<(u64, bool)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a whole `stat` into the buffer we pass.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so it initialised the struct.
    let st = unsafe { st.assume_init() };
    let regular = st.st_mode & libc::S_IFMT == libc::S_IFREG;
    let size = u64::try_from(st.st_size).map_err(|_| io::Error::other("negative file size"))?;
    Ok((size, regular))
}

/// Sleeps while `word` holds `expected`, at most `timeout`: returns at a
/// wake, a timeout, a signal, or at once when the word differs.
/// The futex is a shared (not process-private) one: the word lives in a
/// `MAP_SHARED` mapping both processes have.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        // Below 10^9: fits every c_long.
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the aligned 32-bit word (a live atomic) and
    // the timespec on our stack; any outcome (woken, EAGAIN, ETIMEDOUT,
    // EINTR) is fine for the callers, who re-check the ring.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &raw const ts,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every waiter on `word`.
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the word's address (a live atomic).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}
