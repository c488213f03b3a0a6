//! The fixed-size entries, encoded and decoded as plain bytes: a
//! submission is copied out of shared memory whole, then parsed from the
//! copy, so nothing the tenant writes afterwards changes what was checked.

use crate::EntryError;

/// Bytes of one submission entry.
pub const SQE_LEN: usize = 1152;
/// Bytes of one completion entry.
pub const CQE_LEN: usize = 512;
/// The longest bucket name an entry carries (S3's limit is 63).
pub const MAX_BUCKET_LEN: usize = 63;
/// The longest key an entry carries (S3's limit).
pub const MAX_KEY_LEN: usize = 1024;
/// The longest ETag a completion carries (longer ones are refused by the
/// shim with a message, never cut).
pub const MAX_ETAG_LEN: usize = 64;
/// The longest message a completion carries (longer text is cut on a
/// character boundary).
pub const MAX_MESSAGE_LEN: usize = 288;
/// The longest error reason (the S3 code or shim reason, `NoSuchKey`) a
/// completion carries (longer ones are cut).
pub const MAX_REASON_LEN: usize = 32;
/// The longest request id a completion carries (longer ones are cut).
pub const MAX_REQUEST_ID_LEN: usize = 64;

// Submission layout (little-endian):
//   0 op u8 | 1 flags u8 | 2 bucket_len u8 | 3 reserved | 4 key_len u16 |
//   6 reserved u16 | 8 user_data u64 | 16 buffer_id u64 | 24 offset u64 |
//   32 length u64 | 40 range a u64 | 48 range b u64 | 56 reserved u64 |
//   64..128 bucket | 128..1152 key
const F_LENGTH: u8 = 1;
const F_RANGE_BOUNDED: u8 = 2;
const F_RANGE_FROM: u8 = 4;
const F_RANGE_SUFFIX: u8 = 8;
const F_KNOWN: u8 = F_LENGTH | F_RANGE_BOUNDED | F_RANGE_FROM | F_RANGE_SUFFIX;
const BUCKET_AT: usize = 64;
const KEY_AT: usize = 128;

/// What a submission asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// GetObject into a registered buffer.
    Get,
    /// PutObject from a registered buffer.
    Put,
    /// HeadObject (no buffer).
    Head,
}

impl Op {
    fn code(self) -> u8 {
        match self {
            Op::Get => 1,
            Op::Put => 2,
            Op::Head => 3,
        }
    }
}

/// A byte range of the object (GET).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// `first..=last`.
    Bounded {
        /// First byte.
        first: u64,
        /// Last byte, inclusive.
        last: u64,
    },
    /// From `first` to the end.
    From(u64),
    /// The last `n` bytes.
    Suffix(u64),
}

/// One request in the submission queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// The tenant's tag, echoed in the completion.
    pub user_data: u64,
    /// The operation.
    pub op: Op,
    /// Bucket name (at most [`MAX_BUCKET_LEN`] bytes).
    pub bucket: String,
    /// Key (at most [`MAX_KEY_LEN`] bytes).
    pub key: String,
    /// The registered buffer (GET, PUT; 0 for HEAD).
    pub buffer_id: u64,
    /// Offset in the buffer.
    pub offset: u64,
    /// Bytes of the buffer (PUT: the object's size; GET: `None` = to the end
    /// of the buffer or of the range).
    pub length: Option<u64>,
    /// GET only: the part of the object.
    pub range: Option<Range>,
}

impl Submission {
    /// The entry's bytes.
    ///
    /// # Errors
    /// [`EntryError`] for a bucket or key too long to fit.
    pub fn encode(&self) -> Result<[u8; SQE_LEN], EntryError> {
        let (b, k) = (self.bucket.as_bytes(), self.key.as_bytes());
        if b.len() > MAX_BUCKET_LEN {
            return Err(EntryError::BucketTooLong(b.len()));
        }
        if k.len() > MAX_KEY_LEN {
            return Err(EntryError::KeyTooLong(k.len()));
        }
        let mut e = [0u8; SQE_LEN];
        e[0] = self.op.code();
        let (mut flags, mut ra, mut rb) = (0u8, 0u64, 0u64);
        if self.length.is_some() {
            flags |= F_LENGTH;
        }
        match self.range {
            None => {}
            Some(Range::Bounded { first, last }) => {
                flags |= F_RANGE_BOUNDED;
                (ra, rb) = (first, last);
            }
            Some(Range::From(first)) => {
                flags |= F_RANGE_FROM;
                ra = first;
            }
            Some(Range::Suffix(n)) => {
                flags |= F_RANGE_SUFFIX;
                ra = n;
            }
        }
        e[1] = flags;
        e[2] = b.len() as u8; // <= 63, checked above
        e[4..6].copy_from_slice(&(k.len() as u16).to_le_bytes()); // <= 1024
        put64(&mut e, 8, self.user_data);
        put64(&mut e, 16, self.buffer_id);
        put64(&mut e, 24, self.offset);
        put64(&mut e, 32, self.length.unwrap_or(0));
        put64(&mut e, 40, ra);
        put64(&mut e, 48, rb);
        e[BUCKET_AT..BUCKET_AT + b.len()].copy_from_slice(b);
        e[KEY_AT..KEY_AT + k.len()].copy_from_slice(k);
        Ok(e)
    }

    /// The entry's tag, readable even when the rest is refused.
    pub fn user_data_of(e: &[u8; SQE_LEN]) -> u64 {
        get64(e, 8)
    }

    /// Parses a copied entry.
    ///
    /// # Errors
    /// [`EntryError`] for anything but a well-formed entry.
    pub fn decode(e: &[u8; SQE_LEN]) -> Result<Submission, EntryError> {
        let op = match e[0] {
            1 => Op::Get,
            2 => Op::Put,
            3 => Op::Head,
            other => return Err(EntryError::UnknownOp(other)),
        };
        let flags = e[1];
        if flags & !F_KNOWN != 0 || e[3] != 0 || e[6] != 0 || e[7] != 0 || get64(e, 56) != 0 {
            return Err(EntryError::Reserved);
        }
        let blen = usize::from(e[2]);
        if blen > MAX_BUCKET_LEN {
            return Err(EntryError::BucketTooLong(blen));
        }
        let klen = usize::from(u16::from_le_bytes([e[4], e[5]]));
        if klen > MAX_KEY_LEN {
            return Err(EntryError::KeyTooLong(klen));
        }
        let bucket = std::str::from_utf8(&e[BUCKET_AT..BUCKET_AT + blen])
            .map_err(|_| EntryError::NotUtf8("bucket"))?
            .to_owned();
        let key = std::str::from_utf8(&e[KEY_AT..KEY_AT + klen])
            .map_err(|_| EntryError::NotUtf8("key"))?
            .to_owned();
        let (ra, rb) = (get64(e, 40), get64(e, 48));
        let range_bits = flags & (F_RANGE_BOUNDED | F_RANGE_FROM | F_RANGE_SUFFIX);
        let range = match range_bits {
            0 => None,
            F_RANGE_BOUNDED if ra <= rb => Some(Range::Bounded {
                first: ra,
                last: rb,
            }),
            F_RANGE_FROM => Some(Range::From(ra)),
            F_RANGE_SUFFIX => Some(Range::Suffix(ra)),
            _ => return Err(EntryError::BadRange),
        };
        if range.is_some() && op != Op::Get {
            return Err(EntryError::BadRange);
        }
        let length = (flags & F_LENGTH != 0).then(|| get64(e, 32));
        let (buffer_id, offset) = (get64(e, 16), get64(e, 24));
        if op == Op::Head && (buffer_id != 0 || offset != 0 || length.is_some()) {
            return Err(EntryError::HeadWithBuffer);
        }
        Ok(Submission {
            user_data: get64(e, 8),
            op,
            bucket,
            key,
            buffer_id,
            offset,
            length,
            range,
        })
    }
}

/// One answer in the completion queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Completion {
    /// The submission's tag.
    pub user_data: u64,
    /// 0 for success, else the gRPC status code the same call would have had.
    pub status: u32,
    /// The object's size (GET, HEAD) or the stored size (PUT).
    pub size: u64,
    /// GET: bytes placed in the buffer.
    pub bytes_placed: u64,
    /// GET: offset in the object of the first placed byte.
    pub range_start: u64,
    /// Last-Modified, milliseconds since the epoch (0 when unknown).
    pub last_modified_ms: i64,
    /// PUT: parts of a multipart upload (0 = a single PUT).
    pub parts: u32,
    /// How the bytes moved (the agent's `TransferPath` number).
    pub path: u8,
    /// The ETag, with its quotes (at most [`MAX_ETAG_LEN`] bytes).
    pub etag: String,
    /// On failure, the S3 error code or shim reason (at most
    /// [`MAX_REASON_LEN`] bytes).
    pub reason: String,
    /// The request id (the agent's, or the shim's on its own refusals; at
    /// most [`MAX_REQUEST_ID_LEN`] bytes).
    pub request_id: String,
    /// On failure, what went wrong (at most [`MAX_MESSAGE_LEN`] bytes).
    pub message: String,
}

// Completion layout (little-endian):
//   0 user_data | 8 status u32 | 12 etag_len u8 | 13 reason_len u8 |
//   14 message_len u16 | 16 size | 24 bytes_placed | 32 range_start |
//   40 last_modified i64 | 48 parts u32 | 52 path u8 | 53 request_id_len u8 |
//   54..64 reserved | 64..128 etag | 128..160 reason | 160..224 request id |
//   224..512 message
const ETAG_AT: usize = 64;
const REASON_AT: usize = 128;
const REQUEST_ID_AT: usize = 160;
const MESSAGE_AT: usize = 224;

impl Completion {
    /// The entry's bytes; an over-long ETag is dropped (the caller refuses
    /// such a result before), long text cut on a character boundary.
    pub fn encode(&self) -> [u8; CQE_LEN] {
        let mut e = [0u8; CQE_LEN];
        put64(&mut e, 0, self.user_data);
        e[8..12].copy_from_slice(&self.status.to_le_bytes());
        let etag = if self.etag.len() <= MAX_ETAG_LEN {
            self.etag.as_bytes()
        } else {
            &[]
        };
        let reason = cut(&self.reason, MAX_REASON_LEN).as_bytes();
        let id = cut(&self.request_id, MAX_REQUEST_ID_LEN).as_bytes();
        let msg = cut(&self.message, MAX_MESSAGE_LEN).as_bytes();
        // Each length is within its field's maximum (checked or cut above).
        e[12] = etag.len() as u8;
        e[13] = reason.len() as u8;
        e[14..16].copy_from_slice(&(msg.len() as u16).to_le_bytes());
        put64(&mut e, 16, self.size);
        put64(&mut e, 24, self.bytes_placed);
        put64(&mut e, 32, self.range_start);
        put64(&mut e, 40, self.last_modified_ms as u64);
        e[48..52].copy_from_slice(&self.parts.to_le_bytes());
        e[52] = self.path;
        e[53] = id.len() as u8;
        e[ETAG_AT..ETAG_AT + etag.len()].copy_from_slice(etag);
        e[REASON_AT..REASON_AT + reason.len()].copy_from_slice(reason);
        e[REQUEST_ID_AT..REQUEST_ID_AT + id.len()].copy_from_slice(id);
        e[MESSAGE_AT..MESSAGE_AT + msg.len()].copy_from_slice(msg);
        e
    }

    /// Parses a copied entry.
    ///
    /// # Errors
    /// [`EntryError`] for lengths past their fields or text that is not UTF-8.
    pub fn decode(e: &[u8; CQE_LEN]) -> Result<Completion, EntryError> {
        let elen = usize::from(e[12]);
        let rlen = usize::from(e[13]);
        let mlen = usize::from(u16::from_le_bytes([e[14], e[15]]));
        let ilen = usize::from(e[53]);
        if elen > MAX_ETAG_LEN
            || rlen > MAX_REASON_LEN
            || mlen > MAX_MESSAGE_LEN
            || ilen > MAX_REQUEST_ID_LEN
        {
            return Err(EntryError::CompletionLengths);
        }
        let text = |at: usize, n: usize, what| {
            std::str::from_utf8(&e[at..at + n])
                .map(str::to_owned)
                .map_err(|_| EntryError::NotUtf8(what))
        };
        Ok(Completion {
            user_data: get64(e, 0),
            status: u32::from_le_bytes([e[8], e[9], e[10], e[11]]),
            size: get64(e, 16),
            bytes_placed: get64(e, 24),
            range_start: get64(e, 32),
            last_modified_ms: get64(e, 40) as i64,
            parts: u32::from_le_bytes([e[48], e[49], e[50], e[51]]),
            path: e[52],
            etag: text(ETAG_AT, elen, "etag")?,
            reason: text(REASON_AT, rlen, "reason")?,
            request_id: text(REQUEST_ID_AT, ilen, "request id")?,
            message: text(MESSAGE_AT, mlen, "message")?,
        })
    }
}

fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn put64(e: &mut [u8], at: usize, v: u64) {
    e[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get64(e: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&e[at..at + 8]);
    u64::from_le_bytes(b)
}
