//! [`FileRange`]: a byte range of an open file as the local source of an
//! RDMA WRITE, so a server can send file data without first copying it into
//! a registered staging buffer (tcp sends it with `sendfile(2)`).

use std::fs::File;
use std::sync::Arc;

use crate::error::{FabricError, Result};

/// `[offset, offset+len)` of an open file. The operation that sends it owns
/// a reference to the file until it completes. The bytes are read when the
/// operation runs, so the file must not change under it (a store's
/// published object files are immutable).
#[derive(Debug, Clone)]
pub struct FileRange {
    file: Arc<File>,
    offset: u64,
    len: u64,
}

impl FileRange {
    /// The range `[offset, offset+len)` of `file`.
    ///
    /// # Errors
    /// [`FabricError::InvalidArgument`] when `offset + len` overflows the
    /// largest file offset.
    pub fn new(file: Arc<File>, offset: u64, len: u64) -> Result<FileRange> {
        match offset.checked_add(len) {
            Some(end) if i64::try_from(end).is_ok() => Ok(FileRange { file, offset, len }),
            _ => Err(FabricError::InvalidArgument(format!(
                "file range at {offset} of {len} bytes goes past the largest file offset"
            ))),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset of the range in the file.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The file.
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// Brings the range into the page cache, blocking until it is there, so
    /// that sending it later does not stall an async worker on disk reads.
    /// Call it on a blocking thread. Maps the range with `MAP_POPULATE` and
    /// unmaps it again: the kernel reads the pages without copying them into
    /// user memory.
    ///
    /// # Errors
    /// The `mmap(2)` error (e.g. the file is shorter than the range).
    pub fn prefetch(&self) -> std::io::Result<()> {
        use std::os::fd::AsRawFd as _;
        if self.len == 0 {
            return Ok(());
        }
        // mmap offsets must be page aligned.
        // SAFETY: sysconf has no preconditions.
        let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let start = self.offset - self.offset % page;
        let Ok(len) = usize::try_from(self.offset + self.len - start) else {
            return Err(std::io::Error::other("file range too large to map"));
        };
        let Ok(off) = libc::off_t::try_from(start) else {
            return Err(std::io::Error::other("file offset too large to map"));
        };
        // SAFETY: a fresh read-only shared mapping chosen by the kernel; it
        // aliases no Rust memory and is never dereferenced, only unmapped.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                self.file.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `p` and `len` are exactly the mapping made above.
        unsafe { libc::munmap(p, len) };
        Ok(())
    }
}
