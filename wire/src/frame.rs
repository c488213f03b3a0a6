//! The tcp fabric's wire format (pure, no I/O).
//!
//! A connection starts with a handshake ([`Hello`], [`Challenge`], [`Auth`],
//! [`Verdict`]), then carries operation frames. All integers are big-endian;
//! every reserved field must be zero.
//!
//! Requester → responder, a 48-byte [`RequestHeader`]:
//!
//! ```text
//! 0  op u8 (1 WRITE, 2 READ) | 1 reserved u8 | 2 reserved u16 | 4 rkey u32
//! 8  wr_id u64 | 16 remote addr u64 | 24 len u64
//! 32 operation addr u64 | 40 operation len u64
//! ```
//!
//! followed, for WRITE, by exactly `len` payload bytes. A session splits a
//! large operation into pieces (striped over its streams); every piece
//! names the whole operation it belongs to, and the responder checks the
//! whole operation's access before placing a byte of any piece, so an
//! operation that reaches outside a region moves nothing at all, like an
//! RDMA WRITE whose RETH length exceeds the memory region.
//!
//! Responder → requester, a 24-byte [`ResponseHeader`]:
//!
//! ```text
//! 0  kind u8 (1 COMPLETION, 2 READ_DATA) | 1 status u8 (0 ok) | 2 reserved u16
//! 4  reserved u32 | 8 wr_id u64 | 16 len u64
//! ```
//!
//! `READ_DATA` is followed by `len` bytes of read payload; a READ is answered
//! by zero or more `READ_DATA` frames whose lengths add up to the READ's length
//! and then one `COMPLETION`. Requests are served strictly in order per
//! connection, like an RC queue pair, so responses come back in request order.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use crate::status::OpStatus;
use crate::token::EndpointAddr;

/// Protocol version spoken by this build. Version 3 names the whole
/// operation in every piece's header ([`RequestHeader::op_addr`]); version 2
/// bound the handshake to the endpoint the requester dialled
/// ([`Hello::target`]). Versions 1 and 2 are no longer spoken.
pub const VERSION: u16 = 3;
/// Magic that opens [`Hello`] and [`Challenge`].
pub const MAGIC: [u8; 8] = *b"S3DMAFAB";
/// Largest single operation piece on the wire; sessions split bigger operations.
pub const MAX_PIECE_LEN: u64 = 1 << 30;
/// Size of a nonce and of an HMAC-SHA256 tag.
pub const NONCE_LEN: usize = 32;

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Fewer bytes than the frame needs.
    #[error("truncated frame: need {need} bytes, got {got}")]
    Truncated {
        /// Bytes the frame needs.
        need: usize,
        /// Bytes available.
        got: usize,
    },
    /// The handshake did not start with the fabric magic.
    #[error("not an s3dma fabric peer (bad magic)")]
    BadMagic,
    /// No protocol version in common.
    #[error("unsupported protocol version range {min}..={max} (this build speaks {VERSION})")]
    UnsupportedVersion {
        /// Lowest version offered.
        min: u16,
        /// Highest version offered.
        max: u16,
    },
    /// Unknown request opcode.
    #[error("unknown operation code {0}")]
    UnknownOp(u8),
    /// Unknown response kind.
    #[error("unknown response kind {0}")]
    UnknownKind(u8),
    /// Unknown completion status.
    #[error("unknown completion status {0}")]
    UnknownStatus(u8),
    /// A reserved field is not zero.
    #[error("reserved field `{0}` is not zero")]
    Reserved(&'static str),
    /// A response that does not fit the request it answers.
    #[error("unexpected response: {0}")]
    Unexpected(String),
    /// A verdict code we do not know.
    #[error("unknown handshake verdict {0}")]
    UnknownVerdict(u8),
    /// A request piece that does not lie within the operation it names.
    #[error("request piece {addr:#x}+{len} lies outside its operation {op_addr:#x}+{op_len}")]
    PieceOutsideOperation {
        /// The piece's remote address.
        addr: u64,
        /// The piece's length.
        len: u64,
        /// The operation's remote address.
        op_addr: u64,
        /// The operation's length.
        op_len: u64,
    },
}

fn need(buf: &[u8], n: usize) -> Result<(), FrameError> {
    if buf.len() < n {
        Err(FrameError::Truncated {
            need: n,
            got: buf.len(),
        })
    } else {
        Ok(())
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// One-sided operation kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// RDMA WRITE: payload from requester into responder memory.
    Write,
    /// RDMA READ: responder memory into requester memory.
    Read,
}

impl OpKind {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Write => "write",
            OpKind::Read => "read",
        }
    }
}

/// Header of an operation request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// WRITE or READ.
    pub op: OpKind,
    /// Remote key.
    pub rkey: u32,
    /// Requester's identifier, echoed in the responses.
    pub wr_id: u64,
    /// Remote address of this piece.
    pub addr: u64,
    /// Length of this piece in bytes.
    pub len: u64,
    /// Remote address of the whole operation the piece belongs to.
    pub op_addr: u64,
    /// Length of the whole operation; the piece lies within
    /// `[op_addr, op_addr + op_len)`.
    pub op_len: u64,
}

impl RequestHeader {
    /// Encoded size.
    pub const LEN: usize = 48;

    /// The header of an operation sent as one piece.
    pub fn whole(op: OpKind, rkey: u32, wr_id: u64, addr: u64, len: u64) -> RequestHeader {
        RequestHeader {
            op,
            rkey,
            wr_id,
            addr,
            len,
            op_addr: addr,
            op_len: len,
        }
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0] = match self.op {
            OpKind::Write => 1,
            OpKind::Read => 2,
        };
        b[4..8].copy_from_slice(&self.rkey.to_be_bytes());
        b[8..16].copy_from_slice(&self.wr_id.to_be_bytes());
        b[16..24].copy_from_slice(&self.addr.to_be_bytes());
        b[24..32].copy_from_slice(&self.len.to_be_bytes());
        b[32..40].copy_from_slice(&self.op_addr.to_be_bytes());
        b[40..48].copy_from_slice(&self.op_len.to_be_bytes());
        b
    }

    /// Whether the piece lies within its operation, in the address space's
    /// modular arithmetic (a session's pieces of an operation whose range
    /// wraps past `u64::MAX` wrap too; the responder's bounds check then
    /// refuses the operation as a whole).
    pub fn piece_within_operation(&self) -> bool {
        let offset = self.addr.wrapping_sub(self.op_addr);
        offset <= self.op_len && self.len <= self.op_len - offset
    }

    /// Decodes a header from the first [`Self::LEN`] bytes of `b`; a piece
    /// outside the operation it names is an error.
    pub fn decode(b: &[u8]) -> Result<RequestHeader, FrameError> {
        need(b, Self::LEN)?;
        let op = match b[0] {
            1 => OpKind::Write,
            2 => OpKind::Read,
            x => return Err(FrameError::UnknownOp(x)),
        };
        if b[1] != 0 || be16(b, 2) != 0 {
            return Err(FrameError::Reserved("request flags"));
        }
        let h = RequestHeader {
            op,
            rkey: be32(b, 4),
            wr_id: be64(b, 8),
            addr: be64(b, 16),
            len: be64(b, 24),
            op_addr: be64(b, 32),
            op_len: be64(b, 40),
        };
        if !h.piece_within_operation() {
            return Err(FrameError::PieceOutsideOperation {
                addr: h.addr,
                len: h.len,
                op_addr: h.op_addr,
                op_len: h.op_len,
            });
        }
        Ok(h)
    }
}

/// Kind of a response frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseKind {
    /// The operation finished with `status`.
    Completion,
    /// `len` bytes of READ payload follow.
    ReadData,
}

/// Header of a response frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHeader {
    /// Completion or read data.
    pub kind: ResponseKind,
    /// `None` for success.
    pub status: Option<OpStatus>,
    /// The request's identifier.
    pub wr_id: u64,
    /// Completion: bytes transferred; read data: payload length.
    pub len: u64,
}

impl ResponseHeader {
    /// Encoded size.
    pub const LEN: usize = 24;

    /// Encodes the header.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0] = match self.kind {
            ResponseKind::Completion => 1,
            ResponseKind::ReadData => 2,
        };
        b[1] = self.status.map_or(0, OpStatus::wire_code);
        b[8..16].copy_from_slice(&self.wr_id.to_be_bytes());
        b[16..24].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Decodes a header from the first [`Self::LEN`] bytes of `b`.
    pub fn decode(b: &[u8]) -> Result<ResponseHeader, FrameError> {
        need(b, Self::LEN)?;
        let kind = match b[0] {
            1 => ResponseKind::Completion,
            2 => ResponseKind::ReadData,
            x => return Err(FrameError::UnknownKind(x)),
        };
        let status = match b[1] {
            0 => None,
            c => Some(OpStatus::from_wire_code(c).ok_or(FrameError::UnknownStatus(c))?),
        };
        if be16(b, 2) != 0 || be32(b, 4) != 0 {
            return Err(FrameError::Reserved("response flags"));
        }
        if kind == ResponseKind::ReadData && status.is_some() {
            return Err(FrameError::Reserved("read-data status"));
        }
        Ok(ResponseHeader {
            kind,
            status,
            wr_id: be64(b, 8),
            len: be64(b, 16),
        })
    }
}

/// First handshake message, requester → responder.
///
/// Version 2 (this build) is 88 bytes: the 64 bytes every version starts
/// with, then the address the requester dialled (the endpoint it means to
/// reach, as a token names it), which both proofs cover, so a handshake
/// relayed to another endpoint fails:
///
/// ```text
/// 0  magic "S3DMAFAB" | 8 version_min u16 | 10 version_max u16 | 12 responder u32
/// 16 session u64 | 24 stream u16 | 26 streams u16 | 28 reserved u32 | 32 nonce [32]
/// 64 target IP [16] (IPv4 as IPv4-mapped IPv6, like the token's gid)
/// 80 target port u16 | 82 reserved [6]
/// ```
///
/// A hello whose `version_max` is below 2 (a version-1 peer) ends after 64
/// bytes ([`Hello::extension_len`]); there is then no version in common.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Lowest protocol version the requester speaks.
    pub version_min: u16,
    /// Highest protocol version the requester speaks.
    pub version_max: u16,
    /// The endpoint the requester means to reach (address and responder
    /// number, as its token names it).
    pub target: EndpointAddr,
    /// Requester-chosen session identifier (for logs).
    pub session: u64,
    /// Index of this stream in the session.
    pub stream: u16,
    /// Number of streams in the session.
    pub streams: u16,
    /// Requester's random nonce.
    pub nonce: [u8; NONCE_LEN],
}

/// The first handshake version whose [`Hello`] carries the target address.
const TARGET_SINCE: u16 = 2;

impl Hello {
    /// Bytes every version's hello starts with (all of a version-1 hello).
    pub const PREFIX_LEN: usize = 64;
    /// Encoded size.
    pub const LEN: usize = 88;

    /// Encodes the message.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&self.version_min.to_be_bytes());
        b[10..12].copy_from_slice(&self.version_max.to_be_bytes());
        b[12..16].copy_from_slice(&self.target.responder.to_be_bytes());
        b[16..24].copy_from_slice(&self.session.to_be_bytes());
        b[24..26].copy_from_slice(&self.stream.to_be_bytes());
        b[26..28].copy_from_slice(&self.streams.to_be_bytes());
        b[32..64].copy_from_slice(&self.nonce);
        b[64..80].copy_from_slice(&ip_bytes(self.target.addr.ip()));
        b[80..82].copy_from_slice(&self.target.addr.port().to_be_bytes());
        b
    }

    /// How many bytes follow the [`Hello::PREFIX_LEN`] bytes in `prefix`:
    /// `LEN - PREFIX_LEN` when the requester offers version 2 or later, 0
    /// for a version-1 requester (whose hello is the prefix alone).
    pub fn extension_len(prefix: &[u8]) -> Result<usize, FrameError> {
        need(prefix, Self::PREFIX_LEN)?;
        if prefix[0..8] != MAGIC {
            return Err(FrameError::BadMagic);
        }
        Ok(if be16(prefix, 10) >= TARGET_SINCE {
            Self::LEN - Self::PREFIX_LEN
        } else {
            0
        })
    }

    /// The versions a hello's first [`Hello::PREFIX_LEN`] bytes offer, as
    /// `(min, max)`.
    pub fn offered(prefix: &[u8]) -> Result<(u16, u16), FrameError> {
        Self::extension_len(prefix)?;
        Ok((be16(prefix, 8), be16(prefix, 10)))
    }

    /// Decodes the message (a hello of version 2 or later).
    pub fn decode(b: &[u8]) -> Result<Hello, FrameError> {
        if Self::extension_len(b)? == 0 {
            return Err(FrameError::UnsupportedVersion {
                min: be16(b, 8),
                max: be16(b, 10),
            });
        }
        need(b, Self::LEN)?;
        if be32(b, 28) != 0 || b[82..88].iter().any(|&x| x != 0) {
            return Err(FrameError::Reserved("hello"));
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[32..64]);
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&b[64..80]);
        Ok(Hello {
            version_min: be16(b, 8),
            version_max: be16(b, 10),
            target: EndpointAddr {
                addr: SocketAddr::new(ip_from_bytes(ip), be16(b, 80)),
                responder: be32(b, 12),
            },
            session: be64(b, 16),
            stream: be16(b, 24),
            streams: be16(b, 26),
            nonce,
        })
    }

    /// The version both sides speak, if any.
    pub fn negotiate(&self) -> Result<u16, FrameError> {
        if self.version_min <= VERSION && VERSION <= self.version_max {
            Ok(VERSION)
        } else {
            Err(FrameError::UnsupportedVersion {
                min: self.version_min,
                max: self.version_max,
            })
        }
    }
}

/// An IP address as 16 bytes, IPv4 as IPv4-mapped IPv6 (the token's gid).
pub(crate) fn ip_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The inverse of [`ip_bytes`]: an IPv4-mapped address is IPv4.
pub(crate) fn ip_from_bytes(b: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(b);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// Second handshake message, responder → requester: the responder's nonce
/// and its proof of the fabric key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    /// Chosen version (0 when none in common; the verdict then refuses).
    pub version: u16,
    /// Responder's random nonce.
    pub nonce: [u8; NONCE_LEN],
    /// HMAC proving the responder holds the fabric key.
    pub mac: [u8; NONCE_LEN],
}

impl Challenge {
    /// Encoded size.
    pub const LEN: usize = 80;

    /// Encodes the message.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&self.version.to_be_bytes());
        b[16..48].copy_from_slice(&self.nonce);
        b[48..80].copy_from_slice(&self.mac);
        b
    }

    /// Decodes the message.
    pub fn decode(b: &[u8]) -> Result<Challenge, FrameError> {
        need(b, Self::LEN)?;
        if b[0..8] != MAGIC {
            return Err(FrameError::BadMagic);
        }
        if be16(b, 10) != 0 || be32(b, 12) != 0 {
            return Err(FrameError::Reserved("challenge"));
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[16..48]);
        let mut mac = [0u8; NONCE_LEN];
        mac.copy_from_slice(&b[48..80]);
        Ok(Challenge {
            version: be16(b, 8),
            nonce,
            mac,
        })
    }
}

/// Third handshake message, requester → responder: the requester's proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Auth {
    /// HMAC proving the requester holds the fabric key.
    pub mac: [u8; NONCE_LEN],
}

impl Auth {
    /// Encoded size.
    pub const LEN: usize = NONCE_LEN;

    /// Encodes the message.
    pub fn encode(&self) -> [u8; Self::LEN] {
        self.mac
    }

    /// Decodes the message.
    pub fn decode(b: &[u8]) -> Result<Auth, FrameError> {
        need(b, Self::LEN)?;
        let mut mac = [0u8; NONCE_LEN];
        mac.copy_from_slice(&b[..NONCE_LEN]);
        Ok(Auth { mac })
    }
}

/// Last handshake message, responder → requester.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Authenticated; operation frames follow.
    Accepted,
    /// The requester's proof did not verify: it lacks the fabric key.
    BadKey,
    /// The requester named another endpoint (another address or responder
    /// number) than this one: a stale token, an endpoint advertised under
    /// another address, or a handshake relayed from another endpoint.
    WrongResponder,
    /// No protocol version in common.
    Version,
}

impl Verdict {
    /// Encoded size.
    pub const LEN: usize = 8;

    /// Encodes the message.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0] = match self {
            Verdict::Accepted => 0,
            Verdict::BadKey => 1,
            Verdict::WrongResponder => 2,
            Verdict::Version => 3,
        };
        b
    }

    /// Decodes the message.
    pub fn decode(b: &[u8]) -> Result<Verdict, FrameError> {
        need(b, Self::LEN)?;
        if b[1..8].iter().any(|&x| x != 0) {
            return Err(FrameError::Reserved("verdict"));
        }
        Ok(match b[0] {
            0 => Verdict::Accepted,
            1 => Verdict::BadKey,
            2 => Verdict::WrongResponder,
            3 => Verdict::Version,
            x => return Err(FrameError::UnknownVerdict(x)),
        })
    }

    /// Human-readable reason.
    pub fn describe(&self) -> &'static str {
        match self {
            Verdict::Accepted => "accepted",
            Verdict::BadKey => "refused: the fabric key does not match",
            Verdict::WrongResponder => {
                "refused: this endpoint is not the one the requester named (stale token, endpoint restarted or advertised under another address, or a relayed connection)"
            }
            Verdict::Version => "refused: no protocol version in common",
        }
    }
}

/// What the responder does with one request header: the decision the tcp
/// responder runs on every header it reads, and the one [`RequestScanner`]
/// (and the fuzzer through it) exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incoming {
    /// Serve the request; for a WRITE, `len` payload bytes follow it.
    Serve(RequestHeader),
    /// Longer than [`MAX_PIECE_LEN`]: its payload cannot be drained safely,
    /// so the responder answers `RemoteInvalidRequest` and closes.
    TooLong(RequestHeader),
}

impl Incoming {
    /// Decodes a request header and decides what to do with it.
    pub fn decode(b: &[u8]) -> Result<Incoming, FrameError> {
        let h = RequestHeader::decode(b)?;
        Ok(if h.len > MAX_PIECE_LEN {
            Incoming::TooLong(h)
        } else {
            Incoming::Serve(h)
        })
    }

    /// Payload bytes that follow the header on the stream.
    pub fn payload_len(&self) -> u64 {
        match self {
            Incoming::Serve(h) if h.op == OpKind::Write => h.len,
            _ => 0,
        }
    }
}

/// A sans-I/O parser of the requester → responder byte stream, built on
/// [`Incoming::decode`]: splits the stream into requests and WRITE payload
/// runs, and ends it where the responder closes the connection. The
/// responder reads headers and payloads straight from the socket (payload
/// goes to region memory) and calls the same decoder per header.
#[derive(Debug, Default)]
pub struct RequestScanner {
    header: Vec<u8>,
    payload_left: u64,
    closed: bool,
}

/// What [`RequestScanner::push`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanEvent {
    /// A complete request header the responder serves.
    Request(RequestHeader),
    /// A request the responder refuses before closing the connection.
    TooLong(RequestHeader),
    /// `n` bytes of WRITE payload.
    Payload(usize),
}

impl RequestScanner {
    /// A scanner at the start of the operation stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Consumes `data`, appending events to `out`. After an error, or after
    /// [`ScanEvent::TooLong`], the stream is over (the responder closes the
    /// connection) and further bytes are ignored.
    pub fn push(&mut self, mut data: &[u8], out: &mut Vec<ScanEvent>) -> Result<(), FrameError> {
        while !data.is_empty() && !self.closed {
            if self.payload_left > 0 {
                let n = (self.payload_left.min(data.len() as u64)) as usize;
                self.payload_left -= n as u64;
                data = &data[n..];
                out.push(ScanEvent::Payload(n));
                continue;
            }
            let want = RequestHeader::LEN - self.header.len();
            let n = want.min(data.len());
            self.header.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.header.len() == RequestHeader::LEN {
                let incoming =
                    Incoming::decode(&self.header).inspect_err(|_| self.closed = true)?;
                self.header.clear();
                self.payload_left = incoming.payload_len();
                out.push(match incoming {
                    Incoming::Serve(h) => ScanEvent::Request(h),
                    Incoming::TooLong(h) => {
                        self.closed = true;
                        ScanEvent::TooLong(h)
                    }
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn request_roundtrip_and_errors() {
        let h = RequestHeader {
            op: OpKind::Write,
            rkey: 0xabcd,
            wr_id: 9,
            addr: 0x1000,
            len: 77,
            op_addr: 0xf00,
            op_len: 0x200,
        };
        assert_eq!(RequestHeader::decode(&h.encode()), Ok(h));
        // A piece must lie within the operation it names.
        for (op_addr, op_len) in [(0x1001, 0x200), (0xf00, 0x14c), (u64::MAX, 2), (0x1000, 76)] {
            let bad = RequestHeader {
                op_addr,
                op_len,
                ..h
            };
            assert!(matches!(
                RequestHeader::decode(&bad.encode()),
                Err(FrameError::PieceOutsideOperation { .. })
            ));
        }
        let whole = RequestHeader::whole(OpKind::Read, 1, 2, u64::MAX - 3, 3);
        assert_eq!(RequestHeader::decode(&whole.encode()), Ok(whole));
        // An operation wrapping past u64::MAX: its pieces wrap with it (the
        // responder's bounds check refuses the operation).
        let wrapped = RequestHeader {
            addr: 5,
            len: 100,
            op_addr: u64::MAX - 10,
            op_len: 4096,
            ..whole
        };
        assert_eq!(RequestHeader::decode(&wrapped.encode()), Ok(wrapped));
        let too_long = RequestHeader::whole(OpKind::Write, 1, 2, 0x1000, u64::MAX);
        assert_eq!(RequestHeader::decode(&too_long.encode()), Ok(too_long));
        let mut b = h.encode();
        b[0] = 9;
        assert_eq!(RequestHeader::decode(&b), Err(FrameError::UnknownOp(9)));
        let mut b = h.encode();
        b[2] = 1;
        assert!(matches!(
            RequestHeader::decode(&b),
            Err(FrameError::Reserved(_))
        ));
        assert!(matches!(
            RequestHeader::decode(&b[..5]),
            Err(FrameError::Truncated { need: 48, got: 5 })
        ));
    }

    #[test]
    fn response_roundtrip_and_errors() {
        for status in [
            None,
            Some(OpStatus::RemoteAccess),
            Some(OpStatus::RemoteInvalidRequest),
        ] {
            let h = ResponseHeader {
                kind: ResponseKind::Completion,
                status,
                wr_id: 3,
                len: 10,
            };
            assert_eq!(ResponseHeader::decode(&h.encode()), Ok(h));
        }
        let mut b = ResponseHeader {
            kind: ResponseKind::ReadData,
            status: None,
            wr_id: 1,
            len: 1,
        }
        .encode();
        b[1] = 1;
        assert!(ResponseHeader::decode(&b).is_err());
        b[1] = 200;
        assert_eq!(
            ResponseHeader::decode(&b),
            Err(FrameError::UnknownStatus(200))
        );
        b[0] = 0;
        assert_eq!(ResponseHeader::decode(&b), Err(FrameError::UnknownKind(0)));
    }

    #[test]
    fn handshake_roundtrip() {
        let hello = Hello {
            version_min: 1,
            version_max: 3,
            target: EndpointAddr {
                addr: "10.1.2.3:7000".parse().unwrap(),
                responder: 7,
            },
            session: 99,
            stream: 1,
            streams: 4,
            nonce: [5; 32],
        };
        assert_eq!(Hello::decode(&hello.encode()), Ok(hello));
        assert_eq!(hello.negotiate(), Ok(VERSION));
        let v6 = Hello {
            target: EndpointAddr {
                addr: "[fd00::1]:9".parse().unwrap(),
                responder: 0,
            },
            ..hello
        };
        assert_eq!(Hello::decode(&v6.encode()), Ok(v6));
        let newer = Hello {
            version_min: VERSION + 1,
            ..hello
        };
        assert!(newer.negotiate().is_err());
        let mut b = hello.encode();
        b[0] = b'X';
        assert_eq!(Hello::decode(&b), Err(FrameError::BadMagic));
        let mut b = hello.encode();
        b[85] = 1;
        assert_eq!(Hello::decode(&b), Err(FrameError::Reserved("hello")));
        // The target address follows the 64 bytes every version starts with.
        let b = hello.encode();
        assert_eq!(
            Hello::extension_len(&b[..Hello::PREFIX_LEN]),
            Ok(Hello::LEN - Hello::PREFIX_LEN)
        );
        assert_eq!(Hello::offered(&b[..Hello::PREFIX_LEN]), Ok((1, 3)));
        // A version-1 hello (64 bytes, versions 1..=1) has no extension, and
        // does not decode: no version in common, said as such.
        let mut v1 = [0u8; Hello::PREFIX_LEN];
        v1.copy_from_slice(&b[..Hello::PREFIX_LEN]);
        v1[8..12].copy_from_slice(&[0, 1, 0, 1]);
        assert_eq!(Hello::extension_len(&v1), Ok(0));
        assert_eq!(
            Hello::decode(&v1),
            Err(FrameError::UnsupportedVersion { min: 1, max: 1 })
        );
        assert!(matches!(
            Hello::decode(&b[..70]),
            Err(FrameError::Truncated { .. })
        ));
        let c = Challenge {
            version: 1,
            nonce: [1; 32],
            mac: [2; 32],
        };
        assert_eq!(Challenge::decode(&c.encode()), Ok(c));
        let a = Auth { mac: [3; 32] };
        assert_eq!(Auth::decode(&a.encode()), Ok(a));
        for v in [
            Verdict::Accepted,
            Verdict::BadKey,
            Verdict::WrongResponder,
            Verdict::Version,
        ] {
            assert_eq!(Verdict::decode(&v.encode()), Ok(v));
        }
        assert_eq!(
            Verdict::decode(&[9, 0, 0, 0, 0, 0, 0, 0]),
            Err(FrameError::UnknownVerdict(9))
        );
    }

    #[test]
    fn scanner_splits_headers_and_payloads_across_pushes() {
        let w = RequestHeader::whole(OpKind::Write, 1, 1, 0, 5);
        let r = RequestHeader::whole(OpKind::Read, 1, 2, 0, 100);
        let mut stream = w.encode().to_vec();
        stream.extend_from_slice(b"hello");
        stream.extend_from_slice(&r.encode());
        let mut s = RequestScanner::new();
        let mut ev = Vec::new();
        for chunk in stream.chunks(3) {
            s.push(chunk, &mut ev).unwrap();
        }
        let payload: usize = ev
            .iter()
            .map(|e| if let ScanEvent::Payload(n) = e { *n } else { 0 })
            .sum();
        assert_eq!(payload, 5);
        assert_eq!(ev.first(), Some(&ScanEvent::Request(w)));
        assert_eq!(ev.last(), Some(&ScanEvent::Request(r)));
    }

    proptest! {
        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = RequestHeader::decode(&b);
            let _ = ResponseHeader::decode(&b);
            let _ = Hello::decode(&b);
            let _ = Challenge::decode(&b);
            let _ = Auth::decode(&b);
            let _ = Verdict::decode(&b);
            let mut s = RequestScanner::new();
            let _ = s.push(&b, &mut Vec::new());
        }

        #[test]
        fn request_roundtrip(write: bool, rkey: u32, wr_id: u64, addr: u64, len: u64, op_addr: u64, op_len: u64, before: u64) {
            let op = if write { OpKind::Write } else { OpKind::Read };
            // Arbitrary fields decode exactly when the piece lies within its
            // operation (modular), and re-encode to the same bytes.
            let h = RequestHeader { op, rkey, wr_id, addr, len, op_addr, op_len };
            let offset = addr.wrapping_sub(op_addr);
            let within = u128::from(offset) + u128::from(len) <= u128::from(op_len);
            prop_assert_eq!(RequestHeader::decode(&h.encode()).ok(), within.then_some(h));
            // A piece `before` bytes into an operation that holds it decodes.
            let before = before % (u64::MAX - len).max(1);
            let inner = RequestHeader { op_addr: addr.wrapping_sub(before), op_len: before + len, ..h };
            prop_assert_eq!(RequestHeader::decode(&inner.encode()), Ok(inner));
        }
    }
}
