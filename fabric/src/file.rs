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
    /// Call it on a blocking thread. Maps the range without populating it
    /// and asks `mincore(2)` which pages are cached: a range already in the
    /// page cache (the hot case, and always on tmpfs) costs a page-cache
    /// lookup per page and no page-table work. Otherwise the range is read
    /// through a 1 MiB scratch buffer.
    ///
    /// # Errors
    /// The `mmap(2)`, `mincore(2)` or `pread(2)` error.
    pub fn prefetch(&self) -> std::io::Result<()> {
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
        let cached = {
            let map = Mapping::new(&self.file, len, off)?;
            map.all_cached(page)?
        };
        if !cached {
            // Read it (the disk dominates here, not the copy); unlike
            // MAP_POPULATE this also loads it under qemu-user.
            use std::os::unix::fs::FileExt as _;
            let mut scratch = vec![0u8; 1 << 20];
            let mut at = self.offset;
            let end = self.offset + self.len;
            while at < end {
                let n = usize::try_from(end - at)
                    .unwrap_or(usize::MAX)
                    .min(scratch.len());
                match self.file.read_at(&mut scratch[..n], at)? {
                    0 => break, // the file ends first: the send reports it
                    k => at += k as u64,
                }
            }
        }
        Ok(())
    }
}

/// A read-only shared mapping of a file range that is never dereferenced
/// (only inspected with `mincore(2)`), unmapped on drop.
struct Mapping {
    addr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    fn new(file: &File, len: usize, off: libc::off_t) -> std::io::Result<Mapping> {
        use std::os::fd::AsRawFd as _;
        // SAFETY: a fresh read-only shared mapping chosen by the kernel; it
        // aliases no Rust memory and is never dereferenced, only unmapped.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                off,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { addr, len })
    }

    /// Whether every page of the mapping is in the page cache.
    fn all_cached(&self, page: u64) -> std::io::Result<bool> {
        // One status byte per page, a window of pages per call.
        const WINDOW: usize = 4096;
        let page = usize::try_from(page).unwrap_or(4096);
        let mut status = [0u8; WINDOW];
        let mut at = 0usize;
        while at < self.len {
            let n = (self.len - at).min(WINDOW * page);
            let pages = n.div_ceil(page);
            // SAFETY: [addr+at, addr+at+n) lies inside this mapping (`at` is a
            // multiple of the page size, so the start is page aligned), and
            // `status` has room for one byte per page of it.
            let r = unsafe {
                libc::mincore(
                    self.addr.cast::<u8>().add(at).cast(),
                    n,
                    status.as_mut_ptr(),
                )
            };
            if r != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if status[..pages].iter().any(|s| s & 1 == 0) {
                return Ok(false);
            }
            at += n;
        }
        Ok(true)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `addr` and `len` are exactly the mapping made in `new`,
        // unmapped once, here.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::os::fd::AsRawFd as _;

    use super::*;

    fn page() -> u64 {
        // SAFETY: sysconf has no preconditions.
        u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap()
    }

    fn cached(file: &File, len: usize) -> bool {
        Mapping::new(file, len, 0)
            .unwrap()
            .all_cached(page())
            .unwrap()
    }

    /// A file on disk dropped from the page cache is read back in by
    /// `prefetch` (ranges that start and end inside pages); one already
    /// cached stays so.
    #[test]
    fn prefetch_brings_an_evicted_range_into_the_page_cache() {
        // Where the temporary directory is tmpfs nothing is evicted and
        // this checks only the cached case.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("object");
        let mut f = File::create(&path).unwrap();
        let len = 6 << 20;
        f.write_all(&vec![7u8; len]).unwrap();
        f.sync_all().unwrap();
        let f = Arc::new(File::open(&path).unwrap());
        // SAFETY: fadvise on an open descriptor; no memory is involved.
        let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(r, 0);
        let evicted = !cached(&f, len);
        // SAFETY: `statfs` is plain integers, for which all zeros is valid.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: an open descriptor and a valid out pointer.
        assert_eq!(unsafe { libc::fstatfs(f.as_raw_fd(), &raw mut fs) }, 0);
        let tmpfs = fs.f_type == libc::TMPFS_MAGIC;
        assert!(
            evicted || tmpfs,
            "clean pages on a disk file system are evicted"
        );
        FileRange::new(Arc::clone(&f), 100, (len - 200) as u64)
            .unwrap()
            .prefetch()
            .unwrap();
        assert!(cached(&f, len), "evicted first: {evicted}");
        FileRange::new(Arc::clone(&f), 0, len as u64)
            .unwrap()
            .prefetch()
            .unwrap();
        assert!(cached(&f, len));
        // A range past the end of the file is not an error here (the send
        // reports the short file).
        FileRange::new(f, len as u64, 3 * page())
            .unwrap()
            .prefetch()
            .unwrap();
    }
}
