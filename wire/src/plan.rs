//! Transfer planning: which S3 requests one tenant request becomes.
//!
//! This module is pure protocol logic in the style of quinn-proto: it does no
//! I/O, holds no state and never panics, whatever the inputs (every `u64` may
//! be anything up to `u64::MAX`). The executor (`crate::transfer`) asks it
//! what to send, sends it, and feeds the answers back in.
//!
//! # GET
//!
//! A GET moves object bytes into the tenant's *window*, a remote memory range
//! of `window_len` bytes, always starting at window offset 0.
//!
//! 1. [`probe`] says what the first request is. Usually it is a ranged GET of
//!    the first chunk of what the tenant asked for, carrying a token for the
//!    first `max_len` bytes of the window; its reply tells the object's size
//!    (`Content-Range`) and `ETag`. When the first chunk cannot be named
//!    without knowing the size (a suffix longer than a chunk, or an empty
//!    window) it is a HEAD.
//! 2. If the probe GET is answered 416 (range not satisfiable),
//!    [`retry_unsatisfiable_with_head`] says whether the request may still
//!    succeed, after a HEAD probe, or is the tenant's error.
//! 3. [`plan_get`] takes what the probe learned ([`ProbeOutcome`]) and returns
//!    the remaining ranged GETs ([`Chunk`]s), each with its slice of the
//!    window. The executor sends them in parallel, each with
//!    `If-Match: <etag>` so that they cannot mix two versions of the object.
//!
//! Ranges follow S3 (and RFC 9110) semantics: a bounded range whose end lies
//! past the object is clamped, a suffix longer than the object means the whole
//! object, and a range starting at or past the end is not satisfiable.
//!
//! # PUT
//!
//! A PUT sends a whole window as one object. [`plan_put`] chooses a single
//! `PutObject` or a multipart upload within S3's limits ([`MIN_PART_SIZE`],
//! [`MAX_PART_SIZE`], [`MAX_PARTS`], [`MAX_SINGLE_PUT`],
//! [`MAX_OBJECT_SIZE`]).

use crate::range::ByteRange;

/// The smallest part S3 accepts in a multipart upload, except for the last
/// part (5 MiB).
pub const MIN_PART_SIZE: u64 = 5 << 20;
/// The largest part S3 accepts in a multipart upload (5 GiB).
pub const MAX_PART_SIZE: u64 = 5 << 30;
/// The most parts one multipart upload may have.
pub const MAX_PARTS: u64 = 10_000;
/// The largest object a single `PutObject` may upload (5 GiB).
pub const MAX_SINGLE_PUT: u64 = 5 << 30;
/// The largest object S3 stores (5 TiB).
pub const MAX_OBJECT_SIZE: u64 = 5 << 40;
/// The most ranged GETs [`plan_get`] splits one request into after the probe.
///
/// It bounds the plan's memory whatever the inputs: a 4 GiB window in 4 KiB
/// chunks is exactly this many. A policy that would need more is refused as
/// [`PlanError::InvalidPolicy`].
pub const MAX_GET_CHUNKS: u64 = 1 << 20;

/// One MiB: multipart part sizes raised to fit [`MAX_PARTS`] are rounded up to
/// a multiple of it.
const MIB: u64 = 1 << 20;

/// Why a transfer cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The requested byte range is malformed or not satisfiable for this
    /// object.
    #[error("invalid byte range: {0}")]
    InvalidRange(String),
    /// The requested bytes do not fit in the destination window.
    #[error(
        "the destination window holds {window} bytes but the requested range is \
         {needed} bytes; register a larger buffer or ask for a range"
    )]
    DestinationTooSmall {
        /// Bytes the request resolves to.
        needed: u64,
        /// Bytes the destination window holds.
        window: u64,
    },
    /// The target answered the probe with other bytes than were asked for.
    #[error(
        "the target answered the first ranged GET with {got_len} bytes from object \
         offset {got_first}, but the range asked for starts at {expected_first} and \
         is one chunk or the whole rest long; the target does not honour HTTP Range \
         requests correctly"
    )]
    ProbeMismatch {
        /// Object offset the probe asked for.
        expected_first: u64,
        /// Object offset of the first byte the target placed.
        got_first: u64,
        /// Bytes the target placed.
        got_len: u64,
    },
    /// The object is larger than S3 allows.
    #[error(
        "the object is {size} bytes but S3 objects are at most 5 TiB \
         ({MAX_OBJECT_SIZE} bytes); split the data into several objects"
    )]
    ObjectTooLarge {
        /// Size of the object to upload.
        size: u64,
    },
    /// The transfer policy (chunk or part size) cannot be used.
    #[error("invalid transfer policy: {0}")]
    InvalidPolicy(String),
}

/// The first request of a GET: it discovers the object's size and `ETag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// A HEAD request; it places no bytes.
    Head,
    /// A ranged GET that places what it returns at window offset 0.
    Get {
        /// The range to ask for.
        range: ByteRange,
        /// Bytes the probe may place at window offset 0: the size of the
        /// window slice whose token it carries.
        max_len: u64,
    },
}

/// What the probe learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeOutcome {
    /// Size of the whole object, from `Content-Range` (GET) or
    /// `Content-Length` (HEAD).
    pub total_size: u64,
    /// Bytes the probe placed at window offset 0: (object offset of the first
    /// byte, length); `None` for a HEAD probe.
    pub placed: Option<(u64, u64)>,
}

/// A planned GET: the bytes it places and the ranged GETs left to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetPlan {
    /// Object offset of the first byte placed (at window offset 0).
    pub start: u64,
    /// Total bytes placed at window offsets `0..len`, the probe's included.
    pub len: u64,
    /// The ranged GETs that remain after the probe, in object order; they
    /// cover exactly what the probe did not place. Empty when the probe
    /// placed everything or the result is empty.
    pub chunks: Vec<Chunk>,
}

/// One ranged GET of a plan and the window slice it fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Object offset of the first byte.
    pub object_first: u64,
    /// Bytes to fetch; at least 1 in every chunk [`plan_get`] returns.
    pub len: u64,
    /// Window offset where the first byte goes; the slice to send a token for
    /// is `window_offset..window_offset + len`.
    pub window_offset: u64,
}

impl Chunk {
    /// The `Range` this chunk's GET carries: `bytes=object_first-(object_first+len-1)`.
    ///
    /// A hand-made chunk with `len` 0 (never one from [`plan_get`]) yields
    /// the one-byte span at `object_first`; a span past `u64::MAX` is
    /// clamped to it.
    #[must_use]
    pub fn http_range(&self) -> ByteRange {
        ByteRange::Bounded {
            first: self.object_first,
            last: self.object_first.saturating_add(self.len.saturating_sub(1)),
        }
    }
}

/// The first request of a GET of `range` into a window of `window_len` bytes,
/// fetched in chunks of `chunk_size` bytes.
///
/// With `cap = min(chunk_size, window_len)`, the probe is a GET of the first
/// `cap` bytes of the range, with a token for window bytes `0..max_len`;
/// a suffix of at most `cap` bytes is asked for as such. A suffix longer than
/// `cap` cannot be named before the size is known, and an empty window can
/// only receive an empty result: both probe with a HEAD. A `From` range near
/// `u64::MAX` asks for the bytes up to `u64::MAX` only.
///
/// # Errors
///
/// [`PlanError::InvalidPolicy`] if `chunk_size` is 0;
/// [`PlanError::InvalidRange`] for a bounded range with `first > last` or an
/// empty suffix. Neither depends on the object.
pub fn probe(
    range: Option<ByteRange>,
    window_len: u64,
    chunk_size: u64,
) -> Result<Probe, PlanError> {
    check_chunk_size(chunk_size)?;
    check_range(range)?;
    let cap = chunk_size.min(window_len);
    // The largest offset step a probe span may take: a span of `cap` bytes.
    let Some(cap_step) = cap.checked_sub(1) else {
        return Ok(Probe::Head);
    };
    let span = |first: u64, last: u64| Probe::Get {
        range: ByteRange::Bounded { first, last },
        // `last - first <= cap - 1`, so neither step can overflow.
        max_len: last.saturating_sub(first).saturating_add(1),
    };
    Ok(match range {
        None => span(0, cap_step),
        Some(ByteRange::From(first)) => span(first, first.saturating_add(cap_step)),
        Some(ByteRange::Bounded { first, last }) => span(
            first,
            first.saturating_add(last.saturating_sub(first).min(cap_step)),
        ),
        Some(ByteRange::Suffix(n)) if n <= cap => Probe::Get {
            range: ByteRange::Suffix(n),
            max_len: n,
        },
        Some(ByteRange::Suffix(_)) => Probe::Head,
    })
}

/// Whether a GET whose probe was answered 416 (range not satisfiable) may
/// still succeed; the executor then probes again with a HEAD and calls
/// [`plan_get`] with its outcome.
///
/// S3 answers 416 to every ranged GET of a zero-byte object, while the
/// tenant's request may still resolve to an empty result: a whole-object GET
/// does, and so does a suffix (RFC 9110: a suffix longer than the object means
/// the whole object, here 0 bytes; [`plan_get`] resolves it so, whichever
/// probe was used). A 416 to any other range means the range starts at or past
/// the end of the object: the tenant's error.
#[must_use]
pub fn retry_unsatisfiable_with_head(range: Option<ByteRange>) -> bool {
    match range {
        None => true,
        Some(ByteRange::Suffix(n)) => n > 0,
        Some(ByteRange::Bounded { .. }) | Some(ByteRange::From(_)) => false,
    }
}

/// Plans the rest of a GET of `range` into a window of `window_len` bytes, in
/// chunks of `chunk_size` bytes, from what the probe learned.
///
/// The range resolves against `outcome.total_size` to object bytes
/// `start..start + len`, placed at window offsets `0..len`. A GET probe must
/// have placed the first `min(chunk_size, window_len, len)` of them, or all
/// `len` (it may not have placed other bytes); the rest is split into chunks
/// of `chunk_size` bytes, the last one shorter. After a HEAD probe every byte
/// is in the chunks.
///
/// # Errors
///
/// - [`PlanError::InvalidPolicy`] if `chunk_size` is 0, or if the chunks would
///   be more than [`MAX_GET_CHUNKS`];
/// - [`PlanError::InvalidRange`] if the range is malformed or starts at or
///   past the end of the object;
/// - [`PlanError::DestinationTooSmall`] if the result is longer than the
///   window;
/// - [`PlanError::ProbeMismatch`] if the probe placed other bytes than asked.
pub fn plan_get(
    range: Option<ByteRange>,
    window_len: u64,
    chunk_size: u64,
    outcome: &ProbeOutcome,
) -> Result<GetPlan, PlanError> {
    check_chunk_size(chunk_size)?;
    let (start, len) = resolve(range, outcome.total_size)?;
    if len > window_len {
        return Err(PlanError::DestinationTooSmall {
            needed: len,
            window: window_len,
        });
    }
    let probed = match outcome.placed {
        None => 0,
        Some((got_first, got_len)) => {
            let expected_len = chunk_size.min(window_len).min(len);
            if got_first != start || got_len > len || (got_len != len && got_len != expected_len) {
                return Err(PlanError::ProbeMismatch {
                    expected_first: start,
                    got_first,
                    got_len,
                });
            }
            got_len
        }
    };
    // `probed <= len <= total_size - start`, so nothing below overflows.
    let remaining = len.saturating_sub(probed);
    let count = remaining.div_ceil(chunk_size);
    if count > MAX_GET_CHUNKS {
        return Err(PlanError::InvalidPolicy(format!(
            "a chunk size of {chunk_size} bytes splits this {len}-byte GET into {count} \
             requests, more than the {MAX_GET_CHUNKS} allowed; configure a larger chunk size"
        )));
    }
    let mut chunks = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
    let mut window_offset = probed;
    while window_offset < len {
        let chunk_len = chunk_size.min(len.saturating_sub(window_offset));
        chunks.push(Chunk {
            object_first: start.saturating_add(window_offset),
            len: chunk_len,
            window_offset,
        });
        window_offset = window_offset.saturating_add(chunk_len);
    }
    Ok(GetPlan { start, len, chunks })
}

/// How a PUT is split into parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutPolicy {
    /// Objects larger than this go as multipart uploads (objects larger than
    /// [`MAX_SINGLE_PUT`] always do).
    pub multipart_threshold: u64,
    /// Preferred part size; raised to [`MIN_PART_SIZE`], and further when the
    /// object would otherwise need more than [`MAX_PARTS`] parts.
    pub part_size: u64,
}

impl PutPolicy {
    /// Checks what can be checked without an object: the preferred part size
    /// may not exceed [`MAX_PART_SIZE`]. [`plan_put`] checks it too.
    ///
    /// # Errors
    ///
    /// [`PlanError::InvalidPolicy`] if `part_size` exceeds [`MAX_PART_SIZE`].
    pub fn validate(&self) -> Result<(), PlanError> {
        if self.part_size > MAX_PART_SIZE {
            return Err(PlanError::InvalidPolicy(format!(
                "a part size of {} bytes exceeds S3's maximum of {MAX_PART_SIZE} bytes (5 GiB)",
                self.part_size
            )));
        }
        Ok(())
    }
}

/// How to upload one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutPlan {
    /// One `PutObject` of the whole window.
    Single,
    /// A multipart upload.
    Multipart {
        /// Size of every part but the last.
        part_size: u64,
        /// The parts in order; they cover `0..size` contiguously.
        parts: Vec<Part>,
    },
}

/// One part of a multipart upload: window bytes `offset..offset + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// The part number, from 1.
    pub number: u32,
    /// Window (and object) offset of the first byte.
    pub offset: u64,
    /// Bytes in the part; at least 1.
    pub len: u64,
}

/// Plans the upload of a `size`-byte window as one object.
///
/// An object of at most `min(multipart_threshold, MAX_SINGLE_PUT)` bytes (an
/// empty one included) is a single `PutObject`. A larger one is a multipart
/// upload whose part size is the largest of the policy's part size,
/// [`MIN_PART_SIZE`] and `size / MAX_PARTS` rounded up to a whole MiB; every
/// part but the last has exactly that size, the last has at least 1 byte.
/// An object just above the threshold but no larger than one part is a
/// multipart upload of a single part: the threshold alone decides between the
/// two forms, so the choice stays predictable (S3 accepts a one-part upload of
/// any size).
///
/// # Errors
///
/// [`PlanError::ObjectTooLarge`] above [`MAX_OBJECT_SIZE`];
/// [`PlanError::InvalidPolicy`] if the policy's part size exceeds
/// [`MAX_PART_SIZE`].
pub fn plan_put(size: u64, policy: PutPolicy) -> Result<PutPlan, PlanError> {
    if size > MAX_OBJECT_SIZE {
        return Err(PlanError::ObjectTooLarge { size });
    }
    policy.validate()?;
    if size <= policy.multipart_threshold.min(MAX_SINGLE_PUT) {
        return Ok(PutPlan::Single);
    }
    let for_max_parts = size.div_ceil(MAX_PARTS).div_ceil(MIB).saturating_mul(MIB);
    let part_size = policy.part_size.max(MIN_PART_SIZE).max(for_max_parts);
    if part_size > MAX_PART_SIZE {
        // Unreachable within MAX_OBJECT_SIZE and a validated policy; kept so the
        // function stays total if the limits ever change.
        return Err(PlanError::InvalidPolicy(format!(
            "a {size}-byte object needs parts of {part_size} bytes, more than S3's \
             maximum of {MAX_PART_SIZE} bytes"
        )));
    }
    let mut parts = Vec::with_capacity(usize::try_from(size.div_ceil(part_size)).unwrap_or(0));
    let mut offset = 0;
    let mut number: u32 = 1;
    while offset < size {
        let len = part_size.min(size.saturating_sub(offset));
        parts.push(Part {
            number,
            offset,
            len,
        });
        offset = offset.saturating_add(len);
        number = number.saturating_add(1);
    }
    Ok(PutPlan::Multipart { part_size, parts })
}

/// Refuses a chunk size of 0, which would never make progress.
fn check_chunk_size(chunk_size: u64) -> Result<(), PlanError> {
    if chunk_size == 0 {
        return Err(PlanError::InvalidPolicy(
            "the GET chunk size is 0 bytes; configure a positive chunk size".to_owned(),
        ));
    }
    Ok(())
}

/// Refuses ranges that are malformed whatever the object.
fn check_range(range: Option<ByteRange>) -> Result<(), PlanError> {
    match range {
        Some(ByteRange::Bounded { first, last }) if first > last => Err(PlanError::InvalidRange(
            format!("the range starts at byte {first} but ends before it, at byte {last}"),
        )),
        Some(ByteRange::Suffix(0)) => Err(PlanError::InvalidRange(
            "a suffix range must ask for at least 1 byte".to_owned(),
        )),
        _ => Ok(()),
    }
}

/// Resolves `range` against an object of `size` bytes to `(start, len)`.
fn resolve(range: Option<ByteRange>, size: u64) -> Result<(u64, u64), PlanError> {
    check_range(range)?;
    let past_end = |first: u64| {
        PlanError::InvalidRange(format!(
            "the range starts at byte {first} but the object is {size} bytes long"
        ))
    };
    Ok(match range {
        None => (0, size),
        Some(ByteRange::Bounded { first, last }) => {
            if first >= size {
                return Err(past_end(first));
            }
            // `first < size` and `last >= first`, so `len` is in `1..=size - first`.
            (
                first,
                last.min(size.saturating_sub(1))
                    .saturating_sub(first)
                    .saturating_add(1),
            )
        }
        Some(ByteRange::From(first)) => {
            if first >= size {
                return Err(past_end(first));
            }
            (first, size.saturating_sub(first))
        }
        Some(ByteRange::Suffix(n)) => {
            let len = n.min(size);
            (size.saturating_sub(len), len)
        }
    })
}

/// The storage-target's RDMA chunk plan: `[0, total)` split into
/// consecutive `(offset, len)` chunks of at most `chunk` bytes (one staging
/// buffer each; `chunk` 0 is treated as 1).
pub fn rdma_chunks(total: u64, chunk: u64) -> impl Iterator<Item = (u64, u64)> {
    let chunk = chunk.max(1);
    (0..total.div_ceil(chunk)).map(move |i| {
        let off = i * chunk;
        (off, chunk.min(total - off))
    })
}

#[cfg(test)]
mod tests {
    /// The tenant's range as the tests write it (`Whole` = no range).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Spec {
        Whole,
        Bounded { first: u64, last: u64 },
        From(u64),
        Suffix(u64),
    }

    impl std::convert::From<Spec> for Option<ByteRange> {
        fn from(s: Spec) -> Option<ByteRange> {
            match s {
                Spec::Whole => None,
                Spec::Bounded { first, last } => Some(ByteRange::Bounded { first, last }),
                Spec::From(n) => Some(ByteRange::From(n)),
                Spec::Suffix(n) => Some(ByteRange::Suffix(n)),
            }
        }
    }

    use super::*;
    use proptest::prelude::*;

    const MAX: u64 = u64::MAX;

    /// `(range, window_len, chunk_size, outcome, plan or error kind)`.
    type GetRow = (Spec, u64, u64, ProbeOutcome, Result<GetPlan, &'static str>);
    /// `(range, window_len, chunk_size, object size, (start, len, chunk count))`.
    type EndToEndRow = (Spec, u64, u64, u64, Result<(u64, u64, usize), &'static str>);

    fn span(first: u64, last: u64, max_len: u64) -> Result<Probe, PlanError> {
        Ok(Probe::Get {
            range: ByteRange::Bounded { first, last },
            max_len,
        })
    }

    fn invalid_range<T>() -> Result<T, &'static str> {
        Err("InvalidRange")
    }

    /// Reduces an error to its variant, so tables need not spell messages.
    fn kind<T>(r: Result<T, PlanError>) -> Result<T, &'static str> {
        r.map_err(|e| match e {
            PlanError::InvalidRange(_) => "InvalidRange",
            PlanError::InvalidPolicy(_) => "InvalidPolicy",
            PlanError::DestinationTooSmall { .. } => "DestinationTooSmall",
            PlanError::ProbeMismatch { .. } => "ProbeMismatch",
            PlanError::ObjectTooLarge { .. } => "ObjectTooLarge",
        })
    }

    #[test]
    fn header_values() {
        let cases = [
            (ByteRange::Bounded { first: 0, last: 99 }, "bytes=0-99"),
            (ByteRange::Bounded { first: 7, last: 7 }, "bytes=7-7"),
            (ByteRange::Suffix(5), "bytes=-5"),
            (
                ByteRange::Bounded {
                    first: MAX,
                    last: MAX,
                },
                "bytes=18446744073709551615-18446744073709551615",
            ),
        ];
        for (range, want) in cases {
            assert_eq!(range.header_value(), want);
        }
    }

    #[test]
    fn chunk_http_range() {
        let cases = [
            ((0, 1), (0, 0)),
            ((10, 10), (10, 19)),
            ((5, 0), (5, 5)),
            ((MAX, 1), (MAX, MAX)),
            ((MAX - 1, 5), (MAX - 1, MAX)),
            ((0, MAX), (0, MAX - 1)),
        ];
        for ((object_first, len), (first, last)) in cases {
            let chunk = Chunk {
                object_first,
                len,
                window_offset: 0,
            };
            assert_eq!(chunk.http_range(), ByteRange::Bounded { first, last });
        }
    }

    #[test]
    fn probe_rules() {
        use Spec::{Bounded, From, Suffix, Whole};
        #[rustfmt::skip]
        let cases: &[(Spec, u64, u64, Result<Probe, PlanError>)] = &[
            // (range, window_len, chunk_size, probe)
            (Whole, 100, 10, span(0, 9, 10)),
            (Whole, 5, 10, span(0, 4, 5)),
            (Whole, 10, 10, span(0, 9, 10)),
            (Whole, 1, 10, span(0, 0, 1)),
            (Whole, 0, 10, Ok(Probe::Head)),
            (Whole, MAX, MAX, span(0, MAX - 1, MAX)),
            (From(7), 100, 10, span(7, 16, 10)),
            (From(0), 3, 10, span(0, 2, 3)),
            (From(MAX), 100, 10, span(MAX, MAX, 1)),
            (From(MAX - 3), 100, 10, span(MAX - 3, MAX, 4)),
            (From(MAX), MAX, MAX, span(MAX, MAX, 1)),
            (From(5), 0, 10, Ok(Probe::Head)),
            (Bounded { first: 5, last: 5 }, 100, 10, span(5, 5, 1)),
            (Bounded { first: 0, last: 4 }, 100, 10, span(0, 4, 5)),
            (Bounded { first: 0, last: 9 }, 100, 10, span(0, 9, 10)),
            (Bounded { first: 0, last: 10 }, 100, 10, span(0, 9, 10)),
            (Bounded { first: 20, last: 1000 }, 4, 10, span(20, 23, 4)),
            (Bounded { first: 0, last: MAX }, 100, 10, span(0, 9, 10)),
            (Bounded { first: 0, last: MAX }, MAX, MAX, span(0, MAX - 1, MAX)),
            (Bounded { first: MAX, last: MAX }, MAX, MAX, span(MAX, MAX, 1)),
            (Bounded { first: 3, last: 9 }, 0, 10, Ok(Probe::Head)),
            (Suffix(1), 100, 10, Ok(Probe::Get { range: ByteRange::Suffix(1), max_len: 1 })),
            (Suffix(10), 100, 10, Ok(Probe::Get { range: ByteRange::Suffix(10), max_len: 10 })),
            (Suffix(5), 5, 10, Ok(Probe::Get { range: ByteRange::Suffix(5), max_len: 5 })),
            (Suffix(11), 100, 10, Ok(Probe::Head)),
            (Suffix(6), 5, 10, Ok(Probe::Head)),
            (Suffix(MAX), 100, 10, Ok(Probe::Head)),
            (Suffix(MAX), MAX, MAX, Ok(Probe::Get { range: ByteRange::Suffix(MAX), max_len: MAX })),
            (Suffix(1), 0, 10, Ok(Probe::Head)),
        ];
        for (i, (range, window, chunk, want)) in cases.iter().enumerate() {
            assert_eq!(
                &probe((*range).into(), *window, *chunk),
                want,
                "case {i}: {range:?}"
            );
        }
    }

    #[test]
    fn probe_errors() {
        use Spec::{Bounded, From, Suffix, Whole};
        let cases: &[(Spec, u64, u64, &str)] = &[
            (Whole, 100, 0, "InvalidPolicy"),
            (From(3), 0, 0, "InvalidPolicy"),
            (Suffix(0), 100, 0, "InvalidPolicy"),
            (Bounded { first: 5, last: 3 }, 100, 10, "InvalidRange"),
            (Bounded { first: 5, last: 3 }, 0, 10, "InvalidRange"),
            (
                Bounded {
                    first: MAX,
                    last: 0,
                },
                MAX,
                MAX,
                "InvalidRange",
            ),
            (Suffix(0), 100, 10, "InvalidRange"),
            (Suffix(0), 0, 10, "InvalidRange"),
        ];
        for (range, window, chunk, want) in cases {
            assert_eq!(
                kind(probe((*range).into(), *window, *chunk)),
                Err(*want),
                "{range:?}"
            );
        }
    }

    #[test]
    fn retry_only_when_an_empty_object_may_satisfy() {
        use Spec::{Bounded, From, Suffix, Whole};
        let cases = [
            (Whole, true),
            (Suffix(1), true),
            (Suffix(MAX), true),
            (Suffix(0), false),
            (From(0), false),
            (From(5), false),
            (Bounded { first: 0, last: 0 }, false),
            (
                Bounded {
                    first: 0,
                    last: MAX,
                },
                false,
            ),
        ];
        for (range, want) in cases {
            assert_eq!(
                retry_unsatisfiable_with_head(range.into()),
                want,
                "{range:?}"
            );
        }
    }

    fn get_ok(start: u64, len: u64, chunks: &[(u64, u64, u64)]) -> Result<GetPlan, &'static str> {
        Ok(GetPlan {
            start,
            len,
            chunks: chunks
                .iter()
                .map(|&(object_first, len, window_offset)| Chunk {
                    object_first,
                    len,
                    window_offset,
                })
                .collect(),
        })
    }

    fn head(total_size: u64) -> ProbeOutcome {
        ProbeOutcome {
            total_size,
            placed: None,
        }
    }

    fn got(total_size: u64, first: u64, len: u64) -> ProbeOutcome {
        ProbeOutcome {
            total_size,
            placed: Some((first, len)),
        }
    }

    #[test]
    fn plan_get_rules() {
        use Spec::{Bounded, From, Suffix, Whole};
        #[rustfmt::skip]
        let cases: Vec<GetRow> = vec![
            // (range, window_len, chunk_size, outcome, plan)
            // Zero-byte object: the Whole probe got 416, the HEAD says 0 bytes.
            (Whole, 100, 10, head(0), get_ok(0, 0, &[])),
            (Whole, 0, 10, head(0), get_ok(0, 0, &[])),
            (Suffix(5), 100, 10, head(0), get_ok(0, 0, &[])),
            // A target that answers a suffix of an empty object with 0 bytes.
            (Suffix(5), 100, 10, got(0, 0, 0), get_ok(0, 0, &[])),
            (From(0), 100, 10, head(0), invalid_range()),
            (Bounded { first: 0, last: 0 }, 100, 10, head(0), invalid_range()),
            // One-byte object.
            (Whole, 100, 10, got(1, 0, 1), get_ok(0, 1, &[])),
            (Whole, 100, 10, head(1), get_ok(0, 1, &[(0, 1, 0)])),
            (Whole, 1, 10, got(1, 0, 1), get_ok(0, 1, &[])),
            (Whole, 0, 10, head(1), Err("DestinationTooSmall")),
            (Suffix(1), 100, 10, got(1, 0, 1), get_ok(0, 1, &[])),
            (Suffix(100), 100, 10, head(1), get_ok(0, 1, &[(0, 1, 0)])),
            (From(0), 100, 10, got(1, 0, 1), get_ok(0, 1, &[])),
            (From(1), 100, 10, head(1), invalid_range()),
            // Around chunk boundaries.
            (Whole, 100, 10, got(9, 0, 9), get_ok(0, 9, &[])),
            (Whole, 100, 10, got(10, 0, 10), get_ok(0, 10, &[])),
            (Whole, 100, 10, got(11, 0, 10), get_ok(0, 11, &[(10, 1, 10)])),
            (Whole, 100, 10, got(29, 0, 10), get_ok(0, 29, &[(10, 10, 10), (20, 9, 20)])),
            (Whole, 100, 10, got(30, 0, 10), get_ok(0, 30, &[(10, 10, 10), (20, 10, 20)])),
            (Whole, 100, 10, got(31, 0, 10),
                get_ok(0, 31, &[(10, 10, 10), (20, 10, 20), (30, 1, 30)])),
            (Whole, 100, 10, head(30), get_ok(0, 30, &[(0, 10, 0), (10, 10, 10), (20, 10, 20)])),
            (Whole, 100, 10, head(21),
                get_ok(0, 21, &[(0, 10, 0), (10, 10, 10), (20, 1, 20)])),
            // The window is smaller than a chunk: the probe placed `window` bytes.
            (Whole, 5, 10, got(5, 0, 5), get_ok(0, 5, &[])),
            (Whole, 5, 10, got(6, 0, 5), Err("DestinationTooSmall")),
            // Window exactly the object, and one byte short.
            (Whole, 100, 10, got(100, 0, 10), get_ok(0, 100, &[
                (10, 10, 10), (20, 10, 20), (30, 10, 30), (40, 10, 40), (50, 10, 50),
                (60, 10, 60), (70, 10, 70), (80, 10, 80), (90, 10, 90)])),
            (Whole, 99, 10, got(100, 0, 10), Err("DestinationTooSmall")),
            (Whole, 10, MAX, head(MAX), Err("DestinationTooSmall")),
            // Open ranges.
            (From(90), 100, 10, got(100, 90, 10), get_ok(90, 10, &[])),
            (From(85), 100, 10, got(100, 85, 10), get_ok(85, 15, &[(95, 5, 10)])),
            (From(99), 100, 10, got(100, 99, 1), get_ok(99, 1, &[])),
            (From(100), 100, 10, head(100), invalid_range()),
            (From(101), 100, 10, head(100), invalid_range()),
            (From(MAX), 100, 10, head(100), invalid_range()),
            (From(0), 50, 10, head(100), Err("DestinationTooSmall")),
            // Bounded ranges, clamped at the end.
            (Bounded { first: 10, last: 19 }, 100, 4, got(100, 10, 4),
                get_ok(10, 10, &[(14, 4, 4), (18, 2, 8)])),
            (Bounded { first: 95, last: 200 }, 100, 10, got(100, 95, 5), get_ok(95, 5, &[])),
            (Bounded { first: 95, last: MAX }, 3, 10, head(100), Err("DestinationTooSmall")),
            (Bounded { first: 99, last: MAX }, 1, 10, got(100, 99, 1), get_ok(99, 1, &[])),
            (Bounded { first: 0, last: 0 }, 1, 10, got(100, 0, 1), get_ok(0, 1, &[])),
            (Bounded { first: 100, last: 200 }, 100, 10, head(100), invalid_range()),
            (Bounded { first: 5, last: 3 }, 100, 10, head(100), invalid_range()),
            // Suffixes: longer than the object, than a chunk, than the window.
            (Suffix(100), 100, 10, got(10, 0, 10), get_ok(0, 10, &[])),
            (Suffix(5), 100, 10, got(10, 5, 5), get_ok(5, 5, &[])),
            (Suffix(10), 100, 10, got(10, 0, 10), get_ok(0, 10, &[])),
            (Suffix(25), 30, 10, head(100),
                get_ok(75, 25, &[(75, 10, 0), (85, 10, 10), (95, 5, 20)])),
            (Suffix(50), 30, 10, head(100), Err("DestinationTooSmall")),
            (Suffix(50), 30, 10, head(20), get_ok(0, 20, &[(0, 10, 0), (10, 10, 10)])),
            (Suffix(0), 30, 10, head(20), invalid_range()),
            // Extreme values.
            (From(MAX - 1), 10, 10, got(MAX, MAX - 1, 1), get_ok(MAX - 1, 1, &[])),
            (Suffix(MAX), MAX, MAX, head(MAX), get_ok(0, MAX, &[(0, MAX, 0)])),
            (Whole, MAX, MAX, got(MAX, 0, MAX), get_ok(0, MAX, &[])),
            (Bounded { first: 0, last: MAX }, MAX, MAX, got(MAX, 0, MAX), get_ok(0, MAX, &[])),
            (Bounded { first: MAX - 1, last: MAX }, MAX, 1, head(MAX), get_ok(MAX - 1, 1, &[(MAX - 1, 1, 0)])),
            (Whole, MAX, 1, head(MAX), Err("InvalidPolicy")),
            (Whole, 1 << 40, 1, head(1 << 40), Err("InvalidPolicy")),
            (Whole, 100, 0, head(10), Err("InvalidPolicy")),
            // The probe placed other bytes than asked.
            (Whole, 100, 10, got(30, 1, 10), Err("ProbeMismatch")),
            (Whole, 100, 10, got(30, 0, 5), Err("ProbeMismatch")),
            (Whole, 100, 10, got(30, 0, 0), Err("ProbeMismatch")),
            (Whole, 100, 10, got(30, 0, 11), Err("ProbeMismatch")),
            (Whole, 100, 10, got(30, 0, 31), Err("ProbeMismatch")),
            (Whole, 100, 10, got(5, 0, 6), Err("ProbeMismatch")),
            (Suffix(5), 100, 10, got(10, 0, 5), Err("ProbeMismatch")),
            (From(MAX - 1), 10, 10, got(MAX, MAX - 1, MAX), Err("ProbeMismatch")),
        ];
        for (i, (range, window, chunk, outcome, want)) in cases.into_iter().enumerate() {
            let plan = plan_get(range.into(), window, chunk, &outcome);
            assert_eq!(
                kind(plan),
                want,
                "case {i}: {range:?} {window} {chunk} {outcome:?}"
            );
        }
    }

    #[test]
    fn error_details() {
        assert_eq!(
            plan_get(None, 99, 10, &head(100)),
            Err(PlanError::DestinationTooSmall {
                needed: 100,
                window: 99
            })
        );
        assert_eq!(
            plan_get(Some(ByteRange::From(20)), 99, 10, &got(100, 21, 10)),
            Err(PlanError::ProbeMismatch {
                expected_first: 20,
                got_first: 21,
                got_len: 10
            })
        );
        assert_eq!(
            plan_put(
                MAX,
                PutPolicy {
                    multipart_threshold: 0,
                    part_size: 0
                }
            ),
            Err(PlanError::ObjectTooLarge { size: MAX })
        );
        let message = PlanError::DestinationTooSmall {
            needed: 100,
            window: 99,
        }
        .to_string();
        assert_eq!(
            message,
            "the destination window holds 99 bytes but the requested range is 100 bytes; \
             register a larger buffer or ask for a range"
        );
    }

    /// Every part but the last is `part_size`, parts are numbered from 1 and
    /// cover `0..size` contiguously; returns `(part_size, count, last len)`.
    fn check_parts(size: u64, plan: &PutPlan) -> (u64, u64, u64) {
        let PutPlan::Multipart { part_size, parts } = plan else {
            panic!("expected multipart for {size}, got {plan:?}");
        };
        let mut offset = 0;
        for (i, part) in parts.iter().enumerate() {
            assert_eq!(u64::from(part.number), i as u64 + 1);
            assert_eq!(part.offset, offset);
            assert!(part.len >= 1);
            if i + 1 < parts.len() {
                assert_eq!(part.len, *part_size);
            } else {
                assert!(part.len <= *part_size);
            }
            offset += part.len;
        }
        assert_eq!(offset, size, "parts cover the object");
        assert!(parts.len() as u64 <= MAX_PARTS);
        assert!(*part_size >= MIN_PART_SIZE && *part_size <= MAX_PART_SIZE);
        (
            *part_size,
            parts.len() as u64,
            parts.last().map_or(0, |p| p.len),
        )
    }

    #[test]
    fn plan_put_rules() {
        const MIB: u64 = 1 << 20;
        let policy = |multipart_threshold, part_size| PutPolicy {
            multipart_threshold,
            part_size,
        };
        let default = policy(16 * MIB, 8 * MIB);
        // (size, policy, Ok((part_size, parts, last len)) for multipart or Single).
        #[rustfmt::skip]
        let multipart: &[(u64, PutPolicy, (u64, u64, u64))] = &[
            (16 * MIB + 1, default, (8 * MIB, 3, 1)),
            (20 * MIB, default, (8 * MIB, 3, 4 * MIB)),
            (24 * MIB, default, (8 * MIB, 3, 8 * MIB)),
            // Just above the threshold but within one part: one-part upload.
            (101, policy(100, 8 * MIB), (8 * MIB, 1, 101)),
            (8 * MIB, policy(100, 8 * MIB), (8 * MIB, 1, 8 * MIB)),
            (1, policy(0, 0), (MIN_PART_SIZE, 1, 1)),
            // Tiny policy part sizes are raised to 5 MiB.
            (15 * MIB, policy(0, 1), (5 * MIB, 3, 5 * MIB)),
            (15 * MIB + 1, policy(0, 1), (5 * MIB, 4, 1)),
            // Exactly 10 000 parts of 5 MiB; one more byte raises the part size
            // to the next whole MiB.
            (MAX_PARTS * 5 * MIB, policy(0, 1), (5 * MIB, 10_000, 5 * MIB)),
            (MAX_PARTS * 5 * MIB + 1, policy(0, 1), (6 * MIB, 8_334, 2 * MIB + 1)),
            // Above MAX_SINGLE_PUT multipart is forced, whatever the threshold.
            (MAX_SINGLE_PUT + 1, policy(MAX, 64 * MIB), (64 * MIB, 81, 1)),
            // 5 TiB: ceil(5 TiB / 10 000) rounds up to 525 MiB.
            (MAX_OBJECT_SIZE, policy(MAX, 64 * MIB), (525 * MIB, 9_987, MAX_OBJECT_SIZE - 9_986 * 525 * MIB)),
            (MAX_OBJECT_SIZE, policy(0, MAX_PART_SIZE), (MAX_PART_SIZE, 1_024, MAX_PART_SIZE)),
        ];
        for (size, policy, want) in multipart {
            let plan = plan_put(*size, *policy).expect("plannable");
            assert_eq!(check_parts(*size, &plan), *want, "size {size}, {policy:?}");
        }
        let single: &[(u64, PutPolicy)] = &[
            (0, default),
            (0, policy(0, 0)),
            (1, default),
            (16 * MIB, default),
            (MAX_SINGLE_PUT, policy(MAX, 64 * MIB)),
            (MAX_SINGLE_PUT, policy(MAX_SINGLE_PUT, 64 * MIB)),
        ];
        for (size, policy) in single {
            assert_eq!(plan_put(*size, *policy), Ok(PutPlan::Single), "size {size}");
        }
        let errors: &[(u64, PutPolicy, &str)] = &[
            (MAX_OBJECT_SIZE + 1, default, "ObjectTooLarge"),
            (MAX, default, "ObjectTooLarge"),
            (MAX, policy(MAX, MAX), "ObjectTooLarge"),
            (1, policy(MAX, MAX_PART_SIZE + 1), "InvalidPolicy"),
            (0, policy(0, MAX), "InvalidPolicy"),
            (MAX_OBJECT_SIZE, policy(0, MAX), "InvalidPolicy"),
        ];
        for (size, policy, want) in errors {
            assert_eq!(kind(plan_put(*size, *policy)), Err(*want), "size {size}");
        }
        assert_eq!(policy(0, MAX_PART_SIZE).validate(), Ok(()));
        assert_eq!(
            kind(policy(0, MAX_PART_SIZE + 1).validate()),
            Err("InvalidPolicy")
        );
    }

    /// What a target answers to a probe of an object of `size` bytes: `None`
    /// for 416, else the outcome (like S3: any range of an empty object is
    /// unsatisfiable).
    fn answer(probe: Probe, size: u64) -> Option<ProbeOutcome> {
        match probe {
            Probe::Head => Some(head(size)),
            Probe::Get {
                range: ByteRange::Bounded { first, last },
                max_len,
            } => {
                if first >= size {
                    return None;
                }
                let len = last.min(size - 1) - first + 1;
                assert!(len <= max_len);
                Some(got(size, first, len))
            }
            Probe::Get {
                range: ByteRange::Suffix(n),
                max_len,
            } => {
                if size == 0 {
                    return None;
                }
                let len = n.min(size);
                assert!(len <= max_len);
                Some(got(size, size - len, len))
            }
            Probe::Get {
                range: ByteRange::From(_),
                ..
            } => panic!("a probe asks for a span or a suffix, never an open range"),
        }
    }

    /// Runs a whole GET against a simulated target, as the executor would.
    fn simulate(
        range: Spec,
        window: u64,
        chunk: u64,
        size: u64,
    ) -> Result<(GetPlan, u64), PlanError> {
        let first = probe(range.into(), window, chunk)?;
        let outcome = match answer(first, size) {
            Some(outcome) => outcome,
            None if retry_unsatisfiable_with_head(range.into()) => head(size),
            None => return Err(PlanError::InvalidRange("416".to_owned())),
        };
        let probed = outcome.placed.map_or(0, |(_, len)| len);
        plan_get(range.into(), window, chunk, &outcome).map(|plan| (plan, probed))
    }

    #[test]
    fn end_to_end() {
        use Spec::{Bounded, From, Suffix, Whole};
        #[rustfmt::skip]
        let cases: &[EndToEndRow] = &[
            // (range, window, chunk, size, (start, len, chunks))
            (Whole, 100, 10, 0, Ok((0, 0, 0))),
            (Whole, 0, 10, 0, Ok((0, 0, 0))),
            (Suffix(5), 100, 10, 0, Ok((0, 0, 0))),
            (Suffix(50), 100, 10, 0, Ok((0, 0, 0))),
            (From(0), 100, 10, 0, Err("InvalidRange")),
            (Bounded { first: 0, last: 9 }, 100, 10, 0, Err("InvalidRange")),
            (Whole, 100, 10, 1, Ok((0, 1, 0))),
            (Whole, 100, 10, 95, Ok((0, 95, 9))),
            (Whole, 0, 10, 1, Err("DestinationTooSmall")),
            (Suffix(50), 100, 10, 20, Ok((0, 20, 2))),
            (From(10), 100, 10, 10, Err("InvalidRange")),
        ];
        for (range, window, chunk, size, want) in cases {
            let got = kind(simulate(*range, *window, *chunk, *size))
                .map(|(plan, _)| (plan.start, plan.len, plan.chunks.len()));
            assert_eq!(
                got, *want,
                "{range:?} window {window} chunk {chunk} size {size}"
            );
        }
    }

    fn edgy_u64() -> impl Strategy<Value = u64> {
        prop_oneof![
            4 => 0..64u64,
            2 => 0..4096u64,
            1 => (MAX - 64)..=MAX,
            1 => any::<u64>(),
        ]
    }

    fn range_spec() -> impl Strategy<Value = Spec> {
        prop_oneof![
            Just(Spec::Whole),
            (edgy_u64(), edgy_u64()).prop_map(|(first, last)| Spec::Bounded { first, last }),
            (edgy_u64(), edgy_u64()).prop_map(|(first, n)| Spec::Bounded {
                first,
                last: first.saturating_add(n),
            }),
            edgy_u64().prop_map(Spec::From),
            edgy_u64().prop_map(Spec::Suffix),
        ]
    }

    #[test]
    fn rdma_chunks_cover_exactly() {
        assert_eq!(rdma_chunks(0, 4).count(), 0);
        assert_eq!(
            rdma_chunks(10, 4).collect::<Vec<_>>(),
            vec![(0, 4), (4, 4), (8, 2)]
        );
        assert_eq!(rdma_chunks(3, 0).count(), 3);
        let total: u64 = rdma_chunks(u64::MAX, 1 << 40).map(|c| c.1).sum();
        assert_eq!(total, u64::MAX);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn get_plans_cover_exactly_the_rest(
            range in range_spec(),
            window in edgy_u64(),
            chunk in edgy_u64(),
            size in edgy_u64(),
        ) {
            let Ok((plan, probed)) = simulate(range, window, chunk, size) else {
                return Ok(());
            };
            prop_assert!(plan.len <= window);
            prop_assert!(probed <= plan.len);
            prop_assert!(plan.start.checked_add(plan.len).is_some_and(|end| end <= size));
            let mut next = probed;
            for c in &plan.chunks {
                prop_assert!(c.len >= 1 && c.len <= chunk);
                prop_assert_eq!(c.window_offset, next);
                prop_assert_eq!(Some(c.object_first), plan.start.checked_add(c.window_offset));
                prop_assert!(c.window_offset.checked_add(c.len).is_some_and(|end| end <= window));
                next += c.len;
            }
            prop_assert_eq!(next, plan.len);
            // The result does not depend on the probe or the window.
            prop_assert_eq!(resolve(range.into(), size), Ok((plan.start, plan.len)));
        }

        #[test]
        fn planning_never_panics(
            range in range_spec(),
            window in edgy_u64(),
            chunk in edgy_u64(),
            size in edgy_u64(),
            first in edgy_u64(),
            len in edgy_u64(),
        ) {
            let _ = probe(range.into(), window, chunk);
            let _ = plan_get(range.into(), window, chunk, &got(size, first, len));
            let _ = plan_get(range.into(), window, chunk, &head(size));
        }

        #[test]
        fn put_parts_cover_the_object(
            size in prop_oneof![
                0..(64u64 << 20),
                0..=MAX_OBJECT_SIZE,
                (MAX_OBJECT_SIZE - (64 << 20))..=MAX_OBJECT_SIZE,
            ],
            multipart_threshold in edgy_u64(),
            part_size in prop_oneof![0..(64u64 << 20), 0..=MAX_PART_SIZE],
        ) {
            let policy = PutPolicy { multipart_threshold, part_size };
            match plan_put(size, policy).expect("within limits") {
                PutPlan::Single => {
                    prop_assert!(size <= multipart_threshold && size <= MAX_SINGLE_PUT);
                }
                plan @ PutPlan::Multipart { .. } => {
                    prop_assert!(size > multipart_threshold || size > MAX_SINGLE_PUT);
                    let (got_part_size, _, _) = check_parts(size, &plan);
                    prop_assert!(got_part_size >= part_size);
                }
            }
        }
    }
}
