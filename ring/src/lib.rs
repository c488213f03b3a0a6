#![warn(missing_docs)]
//! The shared-memory ring between a tenant and its host-shim: a
//! submission queue (tenant → shim) and a completion queue (shim → tenant)
//! of fixed-size entries in one sealed memfd, passed to the shim on the
//! tenant's lease (an `RG` lease frame).
//!
//! Layout: a 4 KiB header, then `entries` submission entries of
//! [`SQE_LEN`] bytes, then `entries` completion entries of [`CQE_LEN`]
//! bytes; `entries` is a power of two up to [`MAX_ENTRIES`]. The header
//! holds the magic, the entry count, and one 32-bit word per cache line:
//! the queues' heads and tails (free-running counters, the slot is the
//! counter modulo `entries`), each queue's "consumer sleeps" flag and wake
//! word (a shared futex), and the shim's "broken" flag.
//!
//! Each end trusts nothing the other writes: a consumer keeps its own head
//! and only reads the producer's tail, a producer keeps its own tail and
//! only reads the consumer's head, and a difference above `entries` marks
//! the ring [`RingError::Corrupt`]. Entries are copied out word by word
//! (atomic loads) and only then decoded, so a peer rewriting an entry while
//! it is read changes at most which request arrives, never what was checked.
//! The shim also takes the entry count and the size from the memfd's size
//! (sealed against shrinking), never from the header it maps.
//!
//! Wake-ups are batched: a producer publishes a whole batch with one tail
//! store and wakes the consumer (one `FUTEX_WAKE`) only when the consumer
//! said it sleeps; a consumer drains until empty, sets its flag, checks
//! once more and only then sleeps.

mod entry;
mod shm;

use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering, fence};
use std::time::Duration;

pub use entry::{
    CQE_LEN, Completion, MAX_BUCKET_LEN, MAX_ETAG_LEN, MAX_KEY_LEN, MAX_MESSAGE_LEN,
    MAX_REASON_LEN, MAX_REQUEST_ID_LEN, Op, Range, SQE_LEN, Submission,
};

/// The first 8 bytes of a ring.
pub const MAGIC: [u8; 8] = *b"S3DMARG1";
/// Bytes of the header.
pub const HEADER_LEN: usize = 4096;
/// The most entries a ring may have (per queue).
pub const MAX_ENTRIES: u32 = 4096;

/// Offsets of the header's words (each on its own cache line).
pub mod offsets {
    /// The magic (8 bytes).
    pub const MAGIC: usize = 0;
    /// Entries per queue (u32).
    pub const ENTRIES: usize = 8;
    /// Submission head (the shim's).
    pub const SQ_HEAD: usize = 64;
    /// Submission tail (the tenant's).
    pub const SQ_TAIL: usize = 128;
    /// Completion head (the tenant's).
    pub const CQ_HEAD: usize = 192;
    /// Completion tail (the shim's).
    pub const CQ_TAIL: usize = 256;
    /// Non-zero while the shim sleeps on [`SQ_WAKE`].
    pub const SQ_SLEEPING: usize = 320;
    /// Non-zero while the tenant sleeps on [`CQ_WAKE`].
    pub const CQ_SLEEPING: usize = 384;
    /// The submission queue's futex word.
    pub const SQ_WAKE: usize = 448;
    /// The completion queue's futex word.
    pub const CQ_WAKE: usize = 512;
    /// Non-zero once the shim stopped serving the ring.
    pub const BROKEN: usize = 576;
}

/// What is wrong with a ring as a whole.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// An entry count that is not a power of two in `1..=MAX_ENTRIES`.
    #[error("a ring has a power-of-two number of entries from 1 to {MAX_ENTRIES}, not {0}")]
    Entries(u64),
    /// The passed fd is no sealed memfd of a ring's size.
    #[error("not a ring: {0}")]
    NotARing(String),
    /// The peer's index is out of range: the ring cannot be trusted any more.
    #[error("the ring is corrupt: {0}; open a new one")]
    Corrupt(String),
    /// The shim stopped serving the ring (its lease closed, or its
    /// indexes were corrupt).
    #[error(
        "the shim stopped serving the ring (its lease closed, or its indexes were corrupt); open a new one"
    )]
    Broken,
    /// No free slot.
    #[error("the ring is full")]
    Full,
    /// The system refused (memfd, mmap).
    #[error("ring memory: {0}")]
    Io(#[from] std::io::Error),
}

/// What is wrong with one entry (the rest of the ring is fine).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// An opcode other than GET (1), PUT (2), HEAD (3).
    #[error("unknown ring opcode {0} (1 GET, 2 PUT, 3 HEAD)")]
    UnknownOp(u8),
    /// Reserved bits or bytes were not zero.
    #[error("reserved bytes of a ring entry are not zero")]
    Reserved,
    /// A bucket name over [`MAX_BUCKET_LEN`] bytes.
    #[error("a bucket name of {0} bytes is longer than {MAX_BUCKET_LEN}")]
    BucketTooLong(usize),
    /// A key over [`MAX_KEY_LEN`] bytes.
    #[error("a key of {0} bytes is longer than {MAX_KEY_LEN}")]
    KeyTooLong(usize),
    /// Bucket, key or text that is not UTF-8.
    #[error("the entry's {0} is not UTF-8")]
    NotUtf8(&'static str),
    /// More than one range kind, a bounded range ending before it starts,
    /// or a range on a PUT or HEAD.
    #[error("bad range: one kind, first <= last, and on GET only")]
    BadRange,
    /// A HEAD naming a buffer.
    #[error("a HEAD names no buffer (buffer id, offset and length must be 0 and unset)")]
    HeadWithBuffer,
    /// A completion whose lengths exceed their fields.
    #[error("a completion's ETag or message length exceeds its field")]
    CompletionLengths,
}

/// Bytes of a ring of `entries` per queue.
pub fn ring_len(entries: u32) -> usize {
    HEADER_LEN + entries as usize * (SQE_LEN + CQE_LEN)
}

/// The entry count of a ring of `len` bytes, if `len` is one.
fn entries_for_len(len: u64) -> Option<u32> {
    let body = len.checked_sub(HEADER_LEN as u64)?;
    let per = (SQE_LEN + CQE_LEN) as u64;
    if body % per != 0 {
        return None;
    }
    let n = u32::try_from(body / per).ok()?;
    (n.is_power_of_two() && n <= MAX_ENTRIES).then_some(n)
}

/// One mapped ring (either end's view).
#[derive(Debug)]
pub struct Ring {
    map: shm::Mapping,
    entries: u32,
}

impl Ring {
    /// A new ring of `entries` per queue in a fresh memfd sealed against
    /// shrinking and growing (the tenant's end); the fd is what the lease's
    /// `RG` frame passes.
    ///
    /// # Errors
    /// [`RingError::Entries`] for a bad count, [`RingError::Io`] when the
    /// memfd cannot be made.
    pub fn create(entries: u32) -> Result<(Ring, OwnedFd), RingError> {
        if !entries.is_power_of_two() || entries > MAX_ENTRIES {
            return Err(RingError::Entries(entries.into()));
        }
        let len = ring_len(entries);
        let fd = shm::sealed_memfd(len)?;
        let map = shm::Mapping::map(fd.as_fd(), len)?;
        let ring = Ring { map, entries };
        ring.store64(offsets::MAGIC, u64::from_le_bytes(MAGIC));
        ring.word(offsets::ENTRIES)
            .store(entries, Ordering::Release);
        Ok((ring, fd))
    }

    /// Maps a ring a tenant passed (the shim's end). The entry count comes
    /// from the memfd's size, which must be exactly a ring's and sealed
    /// against shrinking; the header must carry the magic and that count
    /// (read once, at attach).
    ///
    /// # Errors
    /// [`RingError::NotARing`] saying what is wrong, or over `max_entries`.
    pub fn attach(fd: BorrowedFd<'_>, max_entries: u32) -> Result<Ring, RingError> {
        let not = |m: String| RingError::NotARing(m);
        let (size, regular) = shm::file_size(fd).map_err(|e| not(format!("cannot fstat: {e}")))?;
        if !regular {
            return Err(not("the fd is not a memfd".into()));
        }
        let seals = shm::seals(fd).map_err(|_| {
            not("the fd has no seals (pass a memfd made with MFD_ALLOW_SEALING)".into())
        })?;
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err(not("the memfd is not sealed with F_SEAL_SHRINK".into()));
        }
        if seals & (libc::F_SEAL_WRITE | libc::F_SEAL_FUTURE_WRITE) != 0 {
            return Err(not("the memfd is sealed against writes".into()));
        }
        let entries = entries_for_len(size).ok_or_else(|| {
            not(format!(
                "{size} bytes is no ring's size ({HEADER_LEN} + a power of two up to {MAX_ENTRIES} times {})",
                SQE_LEN + CQE_LEN
            ))
        })?;
        if entries > max_entries {
            return Err(not(format!(
                "{entries} entries; this tenant's rings have at most {max_entries}"
            )));
        }
        let map = shm::Mapping::map(fd, ring_len(entries))?;
        let ring = Ring { map, entries };
        let magic = ring.load64(offsets::MAGIC);
        let said = ring.word(offsets::ENTRIES).load(Ordering::Acquire);
        if magic != u64::from_le_bytes(MAGIC) {
            return Err(not("the header does not start with S3DMARG1".into()));
        }
        if said != entries {
            return Err(not(format!(
                "the header says {said} entries, the memfd's size {entries}"
            )));
        }
        Ok(ring)
    }

    /// Entries per queue.
    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// Marks the ring broken (the shim, when its lease closes or its
    /// indexes are corrupt), so the tenant learns its requests stop.
    pub fn mark_broken(&self) {
        self.word(offsets::BROKEN).store(1, Ordering::Release);
        self.kick(offsets::CQ_WAKE);
    }

    /// Whether the shim marked the ring broken.
    pub fn is_broken(&self) -> bool {
        self.word(offsets::BROKEN).load(Ordering::Acquire) != 0
    }

    /// Wakes whoever sleeps on the submission queue (the shim's loop),
    /// e.g. when room opened for more requests in flight.
    pub fn kick_submissions(&self) {
        self.kick(offsets::SQ_WAKE);
    }

    /// Wakes whoever sleeps on the completion queue (the tenant's loop),
    /// e.g. to have it notice it should stop.
    pub fn kick_completions(&self) {
        self.kick(offsets::CQ_WAKE);
    }

    /// Writes any 64-bit word of the ring as the other process could (a
    /// hostile peer, in tests). `false` for an offset outside the ring or
    /// not 8-aligned.
    pub fn poke_u64(&self, offset: usize, value: u64) -> bool {
        self.map
            .word64(offset)
            .map(|w| w.store(value, Ordering::Release))
            .is_some()
    }

    /// Reads any 64-bit word (tests).
    pub fn peek_u64(&self, offset: usize) -> Option<u64> {
        self.map.word64(offset).map(|w| w.load(Ordering::Acquire))
    }

    /// Offset of submission slot `slot` (modulo the entry count).
    pub fn sqe_offset(&self, slot: u32) -> usize {
        HEADER_LEN + (slot & (self.entries - 1)) as usize * SQE_LEN
    }

    /// Offset of completion slot `slot` (modulo the entry count).
    pub fn cqe_offset(&self, slot: u32) -> usize {
        HEADER_LEN
            + self.entries as usize * SQE_LEN
            + (slot & (self.entries - 1)) as usize * CQE_LEN
    }

    /// The submission queue's producer (the tenant). One per ring.
    pub fn submitter(self: &std::sync::Arc<Self>) -> Submitter {
        Submitter {
            ring: std::sync::Arc::clone(self),
            tail: self.word(offsets::SQ_TAIL).load(Ordering::Acquire),
            published: self.word(offsets::SQ_TAIL).load(Ordering::Acquire),
        }
    }

    /// The submission queue's consumer (the shim). One per ring.
    pub fn submissions(self: &std::sync::Arc<Self>) -> Submissions {
        Submissions {
            ring: std::sync::Arc::clone(self),
            head: 0,
        }
    }

    /// The completion queue's producer (the shim). One per ring.
    pub fn completer(self: &std::sync::Arc<Self>) -> Completer {
        Completer {
            ring: std::sync::Arc::clone(self),
            tail: 0,
            published: 0,
        }
    }

    /// The completion queue's consumer (the tenant). One per ring.
    pub fn completions(self: &std::sync::Arc<Self>) -> Completions {
        Completions {
            ring: std::sync::Arc::clone(self),
            head: self.word(offsets::CQ_HEAD).load(Ordering::Acquire),
        }
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        // Header offsets are constants below HEADER_LEN, inside every ring.
        self.map
            .word32(off)
            .unwrap_or_else(|| unreachable!("header word {off} outside the ring"))
    }

    fn load64(&self, off: usize) -> u64 {
        self.map
            .word64(off)
            .map_or(0, |w| w.load(Ordering::Relaxed))
    }

    fn store64(&self, off: usize, v: u64) {
        if let Some(w) = self.map.word64(off) {
            w.store(v, Ordering::Relaxed);
        }
    }

    /// Copies `out.len()` bytes (a multiple of 8) from `off`, word by word.
    fn copy_out(&self, off: usize, out: &mut [u8]) {
        for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
            chunk.copy_from_slice(&self.load64(off + i * 8).to_le_bytes());
        }
    }

    /// Copies `bytes` (a multiple of 8) to `off`, word by word.
    fn copy_in(&self, off: usize, bytes: &[u8]) {
        for (i, chunk) in bytes.chunks_exact(8).enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            self.store64(off + i * 8, u64::from_le_bytes(w));
        }
    }

    fn kick(&self, wake: usize) {
        self.word(wake).fetch_add(1, Ordering::Release);
        shm::futex_wake(self.word(wake));
    }

    /// After publishing: wakes the consumer if it said it sleeps.
    fn wake_if_sleeping(&self, sleeping: usize, wake: usize) -> bool {
        // Pairs with the consumer's fence in `sleep`: either it sees the
        // new tail or this sees its flag.
        fence(Ordering::SeqCst);
        if self.word(sleeping).load(Ordering::Relaxed) != 0 {
            self.kick(wake);
            return true;
        }
        false
    }

    /// The consumer's sleep: flag, re-check `empty`, wait on the futex at
    /// most `timeout`, unflag. Returns at once when `empty` turned false.
    fn sleep(&self, sleeping: usize, wake: usize, timeout: Duration, empty: impl Fn() -> bool) {
        let seen = self.word(wake).load(Ordering::Acquire);
        self.word(sleeping).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if empty() {
            shm::futex_wait(self.word(wake), seen, timeout);
        }
        self.word(sleeping).store(0, Ordering::Relaxed);
    }
}

/// The tenant's end of the submission queue.
#[derive(Debug)]
pub struct Submitter {
    ring: std::sync::Arc<Ring>,
    tail: u32,
    published: u32,
}

impl Submitter {
    /// Free slots now (by the shim's head; garbage there reads as none).
    pub fn room(&self) -> u32 {
        let head = self.ring.word(offsets::SQ_HEAD).load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(head);
        self.ring.entries.saturating_sub(used)
    }

    /// Writes an entry into the next slot (not yet visible: see
    /// [`Submitter::submit`]).
    ///
    /// # Errors
    /// [`RingError::Full`] without room; [`RingError::Broken`] once the shim
    /// gave up on the ring.
    pub fn push(&mut self, entry: &[u8; SQE_LEN]) -> Result<(), RingError> {
        if self.ring.is_broken() {
            return Err(RingError::Broken);
        }
        if self.room() == 0 {
            return Err(RingError::Full);
        }
        self.ring.copy_in(self.ring.sqe_offset(self.tail), entry);
        self.tail = self.tail.wrapping_add(1);
        Ok(())
    }

    /// Publishes every pushed entry with one tail store and wakes the shim
    /// if it sleeps (one wake for the batch). Returns the entries published.
    pub fn submit(&mut self) -> u32 {
        let n = self.tail.wrapping_sub(self.published);
        if n == 0 {
            return 0;
        }
        self.ring
            .word(offsets::SQ_TAIL)
            .store(self.tail, Ordering::Release);
        self.published = self.tail;
        self.ring
            .wake_if_sleeping(offsets::SQ_SLEEPING, offsets::SQ_WAKE);
        n
    }
}

/// One entry taken from the submission queue: its tag, and the request or
/// why it is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The entry's tag (from the same copy).
    pub user_data: u64,
    /// The parsed request, or what is wrong with it.
    pub request: Result<Submission, EntryError>,
}

/// The shim's end of the submission queue.
#[derive(Debug)]
pub struct Submissions {
    ring: std::sync::Arc<Ring>,
    head: u32,
}

impl Submissions {
    /// Entries waiting.
    ///
    /// # Errors
    /// [`RingError::Corrupt`] when the tenant's tail is more than a ring
    /// ahead of the shim's head (or behind it).
    pub fn pending(&self) -> Result<u32, RingError> {
        let tail = self.ring.word(offsets::SQ_TAIL).load(Ordering::Acquire);
        let n = tail.wrapping_sub(self.head);
        if n > self.ring.entries {
            return Err(RingError::Corrupt(format!(
                "submission tail {tail} is {n} entries past head {} (a ring holds {})",
                self.head, self.ring.entries
            )));
        }
        Ok(n)
    }

    /// Takes the next entry: copied out of shared memory, the slot given
    /// back to the tenant, then parsed from the copy.
    ///
    /// # Errors
    /// [`RingError::Corrupt`] as for [`Submissions::pending`].
    pub fn take(&mut self) -> Result<Option<Taken>, RingError> {
        if self.pending()? == 0 {
            return Ok(None);
        }
        let mut e = [0u8; SQE_LEN];
        self.ring.copy_out(self.ring.sqe_offset(self.head), &mut e);
        self.head = self.head.wrapping_add(1);
        self.ring
            .word(offsets::SQ_HEAD)
            .store(self.head, Ordering::Release);
        Ok(Some(Taken {
            user_data: Submission::user_data_of(&e),
            request: Submission::decode(&e),
        }))
    }

    /// Sleeps until the tenant submits (or `timeout`, or a kick); returns
    /// at once when entries are waiting (or the indexes are corrupt).
    pub fn wait(&self, timeout: Duration) {
        self.ring
            .sleep(offsets::SQ_SLEEPING, offsets::SQ_WAKE, timeout, || {
                matches!(self.pending(), Ok(0))
            });
    }

    /// The wake word now, for [`Submissions::wait_kick`].
    pub fn wake_seen(&self) -> u32 {
        self.ring.word(offsets::SQ_WAKE).load(Ordering::Acquire)
    }

    /// Sleeps until the wake word moves from `seen` (a
    /// [`Ring::kick_submissions`]: room for more in flight, or the ring
    /// closing), or `timeout`, whatever the queue holds.
    pub fn wait_kick(&self, seen: u32, timeout: Duration) {
        shm::futex_wait(self.ring.word(offsets::SQ_WAKE), seen, timeout);
    }

    /// The ring.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }
}

/// The shim's end of the completion queue.
#[derive(Debug)]
pub struct Completer {
    ring: std::sync::Arc<Ring>,
    tail: u32,
    published: u32,
}

impl Completer {
    /// Writes a completion into the next slot (visible at
    /// [`Completer::publish`]).
    ///
    /// # Errors
    /// [`RingError::Full`] while the tenant has not consumed enough;
    /// [`RingError::Corrupt`] when its head is ahead of the shim's tail.
    pub fn push(&mut self, c: &Completion) -> Result<(), RingError> {
        let head = self.ring.word(offsets::CQ_HEAD).load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(head);
        if used > self.ring.entries {
            return Err(RingError::Corrupt(format!(
                "completion head {head} is not within a ring of tail {}",
                self.tail
            )));
        }
        if used == self.ring.entries {
            return Err(RingError::Full);
        }
        self.ring
            .copy_in(self.ring.cqe_offset(self.tail), &c.encode());
        self.tail = self.tail.wrapping_add(1);
        Ok(())
    }

    /// Publishes what was pushed and wakes the tenant if it sleeps.
    pub fn publish(&mut self) -> u32 {
        let n = self.tail.wrapping_sub(self.published);
        if n == 0 {
            return 0;
        }
        self.ring
            .word(offsets::CQ_TAIL)
            .store(self.tail, Ordering::Release);
        self.published = self.tail;
        self.ring
            .wake_if_sleeping(offsets::CQ_SLEEPING, offsets::CQ_WAKE);
        n
    }
}

/// The tenant's end of the completion queue.
#[derive(Debug)]
pub struct Completions {
    ring: std::sync::Arc<Ring>,
    head: u32,
}

impl Completions {
    /// Completions waiting.
    ///
    /// # Errors
    /// [`RingError::Corrupt`] for a tail more than a ring ahead.
    pub fn pending(&self) -> Result<u32, RingError> {
        let tail = self.ring.word(offsets::CQ_TAIL).load(Ordering::Acquire);
        let n = tail.wrapping_sub(self.head);
        if n > self.ring.entries {
            return Err(RingError::Corrupt(format!(
                "completion tail {tail} is {n} entries past head {}",
                self.head
            )));
        }
        Ok(n)
    }

    /// Takes the next completion (copied, the slot given back, then parsed).
    ///
    /// # Errors
    /// [`RingError::Corrupt`] as for [`Completions::pending`] or for an
    /// entry that does not parse.
    pub fn take(&mut self) -> Result<Option<Completion>, RingError> {
        if self.pending()? == 0 {
            return Ok(None);
        }
        let mut e = [0u8; CQE_LEN];
        self.ring.copy_out(self.ring.cqe_offset(self.head), &mut e);
        self.head = self.head.wrapping_add(1);
        self.ring
            .word(offsets::CQ_HEAD)
            .store(self.head, Ordering::Release);
        Completion::decode(&e)
            .map(Some)
            .map_err(|e| RingError::Corrupt(e.to_string()))
    }

    /// Sleeps until a completion arrives (or `timeout`, a kick, or the
    /// ring is marked broken).
    pub fn wait(&self, timeout: Duration) {
        self.ring
            .sleep(offsets::CQ_SLEEPING, offsets::CQ_WAKE, timeout, || {
                matches!(self.pending(), Ok(0)) && !self.ring.is_broken()
            });
    }

    /// The ring.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }
}

#[cfg(test)]
mod tests;
