//! The lease protocol's frames (no I/O here; the shim and the clients do
//! the socket work, including the `SCM_RIGHTS` fd that rides on an
//! [`FdRequest`]).
//!
//! A connection to the host-shim's socket that starts with [`MAGIC`] is a
//! lease rather than HTTP/2 (whose preface starts `PRI * HT`). The shim
//! answers the magic with a [`Reply`] carrying the lease id; then every
//! [`FdRequest`] (8 bytes plus one attached fd: host memory, a memfd) or
//! [`CudaFdRequest`] (the same with a CUDA shareable handle, a POSIX fd from
//! `cuMemExportToShareableHandle`) gets a [`Reply`] with the same `seq`
//! carrying an fd handle, or an error message. A [`RingRequest`] passes a
//! sealed memfd holding a submission and completion ring (the
//! `s3dma-ring` layout); its reply carries the ring's id, and the ring
//! serves requests until the lease closes. Buffers registered under
//! a lease are released when the lease connection closes. The full contract
//! is in `proto/s3dma/tenant/v1/tenant.proto`.

use std::fmt;

/// The first 8 bytes of a lease connection.
pub const MAGIC: [u8; 8] = *b"S3DMALS1";
/// Size of an [`FdRequest`] frame.
pub const REQUEST_LEN: usize = 8;
/// Size of a [`Reply`] header (its message follows).
pub const REPLY_HEADER_LEN: usize = 24;
/// Longest reply message the shim sends (longer text is cut).
pub const MAX_MESSAGE_LEN: usize = 1024;
/// Length of lease ids and fd handles.
pub const ID_LEN: usize = 16;

/// A lease id or fd handle: 16 random bytes, meaningful to one tenant.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Id(pub [u8; ID_LEN]);

impl Id {
    /// The id in a protobuf `bytes` field; `None` unless exactly 16 bytes.
    pub fn from_slice(b: &[u8]) -> Option<Id> {
        <[u8; ID_LEN]>::try_from(b).ok().map(Id)
    }
}

impl fmt::Debug for Id {
    // Ids are capabilities within a tenant; logs show a prefix only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Id({:02x}{:02x}{:02x}{:02x}..)",
            self.0[0], self.0[1], self.0[2], self.0[3]
        )
    }
}

/// Client → shim: "here is one fd" (the fd rides as `SCM_RIGHTS` on the
/// same `sendmsg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdRequest {
    /// Echoed in the reply, so a client can match answers to requests.
    pub seq: u32,
}

impl FdRequest {
    /// The 8 bytes on the wire: `F`, `D`, 0, 0, seq (u32 LE).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0] = b'F';
        b[1] = b'D';
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Parses a frame.
    ///
    /// # Errors
    /// [`FrameError`] for anything but an `FD` frame with zero reserved bytes.
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<FdRequest, FrameError> {
        if b[0..2] != *b"FD" {
            return Err(FrameError::UnknownRequest([b[0], b[1]]));
        }
        if b[2] != 0 || b[3] != 0 {
            return Err(FrameError::Reserved);
        }
        Ok(FdRequest {
            seq: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        })
    }
}

/// Client → shim: "here is one CUDA shareable handle", a POSIX file
/// descriptor from `cuMemExportToShareableHandle`
/// (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`) riding as `SCM_RIGHTS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaFdRequest {
    /// Echoed in the reply.
    pub seq: u32,
}

impl CudaFdRequest {
    /// The 8 bytes on the wire: `C`, `U`, 0, 0, seq (u32 LE).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0] = b'C';
        b[1] = b'U';
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        b
    }
}

/// Client → shim: "serve this ring" (a sealed memfd in the `s3dma-ring`
/// layout, riding as `SCM_RIGHTS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingRequest {
    /// Echoed in the reply.
    pub seq: u32,
}

impl RingRequest {
    /// The 8 bytes on the wire: `R`, `G`, 0, 0, seq (u32 LE).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0] = b'R';
        b[1] = b'G';
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        b
    }
}

/// Any request frame a lease carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// `FD`: host memory (a sealed memfd).
    Fd(FdRequest),
    /// `CU`: CUDA device memory (a POSIX fd shareable handle).
    CudaFd(CudaFdRequest),
    /// `RG`: a submission and completion ring.
    Ring(RingRequest),
}

impl Request {
    /// Parses a frame of any kind.
    ///
    /// # Errors
    /// [`FrameError`] for an unknown kind or non-zero reserved bytes.
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Request, FrameError> {
        if b[0..2] != *b"FD" && b[0..2] != *b"CU" && b[0..2] != *b"RG" {
            return Err(FrameError::UnknownRequest([b[0], b[1]]));
        }
        if b[2] != 0 || b[3] != 0 {
            return Err(FrameError::Reserved);
        }
        let seq = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        Ok(match b[0] {
            b'F' => Request::Fd(FdRequest { seq }),
            b'C' => Request::CudaFd(CudaFdRequest { seq }),
            _ => Request::Ring(RingRequest { seq }),
        })
    }

    /// The request's seq.
    pub fn seq(&self) -> u32 {
        match self {
            Request::Fd(r) => r.seq,
            Request::CudaFd(r) => r.seq,
            Request::Ring(r) => r.seq,
        }
    }
}

/// Shim → client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Success: the lease id (seq 0) or an fd handle.
    Ok {
        /// The request's seq (0 for the answer to the magic).
        seq: u32,
        /// Lease id or fd handle.
        id: Id,
    },
    /// Failure, with a message for the user.
    Err {
        /// The request's seq.
        seq: u32,
        /// What went wrong (at most [`MAX_MESSAGE_LEN`] bytes on the wire).
        message: String,
    },
}

impl Reply {
    /// Header and message, ready to write.
    pub fn encode(&self) -> Vec<u8> {
        let (status, seq, id, msg) = match self {
            Reply::Ok { seq, id } => (0u8, *seq, id.0, &[][..]),
            Reply::Err { seq, message } => (1u8, *seq, [0u8; ID_LEN], truncate(message).as_bytes()),
        };
        let mut b = Vec::with_capacity(REPLY_HEADER_LEN + msg.len());
        b.push(status);
        b.push(0);
        // `truncate` keeps messages within MAX_MESSAGE_LEN, far below u16::MAX.
        b.extend_from_slice(&u16::try_from(msg.len()).unwrap_or(0).to_le_bytes());
        b.extend_from_slice(&seq.to_le_bytes());
        b.extend_from_slice(&id);
        b.extend_from_slice(msg);
        b
    }

    /// Parses a header; returns the reply's status, seq, id and the length of
    /// the message that follows (read it, then call [`Reply::finish`]).
    ///
    /// # Errors
    /// [`FrameError`] for an unknown status, reserved bits or an overlong message.
    pub fn decode_header(h: &[u8; REPLY_HEADER_LEN]) -> Result<ReplyHeader, FrameError> {
        let status = h[0];
        if status > 1 {
            return Err(FrameError::UnknownStatus(status));
        }
        if h[1] != 0 {
            return Err(FrameError::Reserved);
        }
        let message_len = usize::from(u16::from_le_bytes([h[2], h[3]]));
        if message_len > MAX_MESSAGE_LEN {
            return Err(FrameError::MessageTooLong(message_len));
        }
        if status == 0 && message_len != 0 {
            return Err(FrameError::MessageOnSuccess);
        }
        let mut id = [0u8; ID_LEN];
        id.copy_from_slice(&h[8..24]);
        Ok(ReplyHeader {
            ok: status == 0,
            seq: u32::from_le_bytes([h[4], h[5], h[6], h[7]]),
            id: Id(id),
            message_len,
        })
    }

    /// Builds the reply from a header and its message bytes.
    pub fn finish(h: ReplyHeader, message: &[u8]) -> Reply {
        if h.ok {
            Reply::Ok {
                seq: h.seq,
                id: h.id,
            }
        } else {
            Reply::Err {
                seq: h.seq,
                message: String::from_utf8_lossy(message).into_owned(),
            }
        }
    }
}

/// A decoded reply header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyHeader {
    /// Status 0.
    pub ok: bool,
    /// The request's seq.
    pub seq: u32,
    /// Lease id or fd handle (zero on errors).
    pub id: Id,
    /// Bytes of message after the header.
    pub message_len: usize,
}

/// A malformed frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not an `FD` (or, for [`Request::decode`], `CU` or `RG`) request.
    #[error("unknown lease request {0:02x?} (expected \"FD\", \"CU\" or \"RG\")")]
    UnknownRequest([u8; 2]),
    /// Reserved bytes were not zero.
    #[error("reserved bytes of a lease frame are not zero")]
    Reserved,
    /// A reply status other than 0 or 1.
    #[error("unknown lease reply status {0}")]
    UnknownStatus(u8),
    /// A message longer than [`MAX_MESSAGE_LEN`].
    #[error("lease reply message of {0} bytes is longer than {MAX_MESSAGE_LEN}")]
    MessageTooLong(usize),
    /// A success reply with a message.
    #[error("a successful lease reply carries a message")]
    MessageOnSuccess,
}

fn truncate(s: &str) -> &str {
    if s.len() <= MAX_MESSAGE_LEN {
        return s;
    }
    let mut end = MAX_MESSAGE_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_request_round_trips_and_rejects_garbage() {
        for seq in [0, 1, 0xdead_beef, u32::MAX] {
            let r = FdRequest { seq };
            assert_eq!(FdRequest::decode(&r.encode()), Ok(r));
        }
        assert_eq!(
            FdRequest::decode(b"PRI * HT"),
            Err(FrameError::UnknownRequest(*b"PR"))
        );
        assert_eq!(
            FdRequest::decode(b"FD\x00\x01\x00\x00\x00\x00"),
            Err(FrameError::Reserved)
        );
    }

    #[test]
    fn requests_of_both_kinds_round_trip() {
        for seq in [0, 7, u32::MAX] {
            let fd = FdRequest { seq };
            let cu = CudaFdRequest { seq };
            assert_eq!(Request::decode(&fd.encode()), Ok(Request::Fd(fd)));
            assert_eq!(Request::decode(&cu.encode()), Ok(Request::CudaFd(cu)));
            assert_eq!(Request::decode(&cu.encode()).unwrap().seq(), seq);
            // The host-memory parser does not take CUDA frames.
            assert_eq!(
                FdRequest::decode(&cu.encode()),
                Err(FrameError::UnknownRequest(*b"CU"))
            );
        }
        let rg = RingRequest { seq: 9 };
        assert_eq!(Request::decode(&rg.encode()), Ok(Request::Ring(rg)));
        assert_eq!(Request::decode(&rg.encode()).unwrap().seq(), 9);
        assert_eq!(
            Request::decode(b"RG\x00\x01\x00\x00\x00\x00"),
            Err(FrameError::Reserved)
        );
        assert_eq!(
            Request::decode(b"CU\x01\x00\x00\x00\x00\x00"),
            Err(FrameError::Reserved)
        );
        assert_eq!(
            Request::decode(b"XY\x00\x00\x00\x00\x00\x00"),
            Err(FrameError::UnknownRequest(*b"XY"))
        );
    }

    #[test]
    fn replies_round_trip() {
        let ok = Reply::Ok {
            seq: 7,
            id: Id([9; 16]),
        };
        let err = Reply::Err {
            seq: 8,
            message: "uid 1234 is not a tenant of this host-shim".into(),
        };
        for r in [ok, err] {
            let b = r.encode();
            let h = Reply::decode_header(b[..REPLY_HEADER_LEN].try_into().unwrap()).unwrap();
            assert_eq!(h.message_len, b.len() - REPLY_HEADER_LEN);
            assert_eq!(Reply::finish(h, &b[REPLY_HEADER_LEN..]), r);
        }
    }

    #[test]
    fn long_messages_are_cut_on_a_char_boundary() {
        let message = "é".repeat(MAX_MESSAGE_LEN); // 2 bytes each
        let b = Reply::Err { seq: 1, message }.encode();
        let h = Reply::decode_header(b[..REPLY_HEADER_LEN].try_into().unwrap()).unwrap();
        assert!(h.message_len <= MAX_MESSAGE_LEN);
        let Reply::Err { message, .. } = Reply::finish(h, &b[REPLY_HEADER_LEN..]) else {
            panic!("not an error");
        };
        assert!(message.chars().all(|c| c == 'é'));
    }

    #[test]
    fn bad_reply_headers_are_refused() {
        let mut h = [0u8; REPLY_HEADER_LEN];
        h[0] = 2;
        assert_eq!(Reply::decode_header(&h), Err(FrameError::UnknownStatus(2)));
        h[0] = 1;
        h[2..4].copy_from_slice(&2000u16.to_le_bytes());
        assert_eq!(
            Reply::decode_header(&h),
            Err(FrameError::MessageTooLong(2000))
        );
        h[0] = 0;
        h[2..4].copy_from_slice(&3u16.to_le_bytes());
        assert_eq!(Reply::decode_header(&h), Err(FrameError::MessageOnSuccess));
        h[2..4].copy_from_slice(&0u16.to_le_bytes());
        h[1] = 1;
        assert_eq!(Reply::decode_header(&h), Err(FrameError::Reserved));
    }

    #[test]
    fn ids_need_exactly_sixteen_bytes_and_debug_shows_a_prefix() {
        assert!(Id::from_slice(&[1; 15]).is_none());
        assert!(Id::from_slice(&[1; 17]).is_none());
        let id = Id::from_slice(&[0xab; 16]).unwrap();
        assert_eq!(format!("{id:?}"), "Id(abababab..)");
    }
}
