//! AMD's `hipobj-rc-v2` S3-over-RDMA control plane (pure, no I/O): the RC
//! token, the PREPARE / READY / CANCEL requests a server parses and the
//! replies it writes, and what a client reads back.
//!
//! Written from the protocol's open implementations (ROCm/hipObject
//! `src/rdma/v2-wire.*`, `v2-client.cpp`, `token.cpp`; versitygw
//! `cuwrapper/rc/*`, `rdma/rcroutes/*`; elbencho `HipObjV2Server.*`):
//!
//! * Three body-less, SigV4-signed `POST`s on a fixed control path:
//!   `/.hipobj-rc/prepare`, `/.hipobj-rc/ready`, `/.hipobj-rc/cancel`
//!   ([`Control`]). The object is named by `x-amz-rdma-target`, never by the
//!   URL; every `x-amz-rdma-*` header must be signed.
//! * PREPARE carries the client's [`RcToken`] (its QP number and GID), its
//!   PSN, a cookie, the operation, the target, the size and an optional
//!   offset ([`PrepareRequest`]). The server creates a QP and answers with
//!   its own token as `x-amz-rdma-reply: 200:<token>`, a session id, its
//!   PSN and, for a PUT, the staging region the client writes into
//!   ([`PrepareReply`]).
//! * READY names the session and the client's buffer ([`ReadyRequest`]);
//!   the server runs the data phase while answering it: a GET by RDMA
//!   WRITE_WITH_IMM into the client's buffer, a PUT by waiting for the
//!   client's WRITE_WITH_IMM into the staging region, the immediate being
//!   the cookie in network order. The READY reply is the final outcome
//!   ([`FinalReply`]): the cookie echoed, the bytes moved, the ETag.
//! * CANCEL ends a session; servers answer `204` whatever the session's
//!   state, so it tells nothing to a prober.
//! * A server that does not speak the dialect answers `501` with
//!   `x-amz-rdma-protocol-status: unsupported`: the one fallback signal.
//!
//! One transfer moves at most [`MAX_TRANSFER`] bytes (2^31 - 1): larger
//! objects go as several transfers (offsets on GET, multipart parts on PUT).

use std::fmt;

/// The value of `x-amz-rdma-protocol` for this dialect.
pub const PROTOCOL: &str = "hipobj-rc-v2";
/// The control path's first segment (a name no S3 bucket can have).
pub const CONTROL_BUCKET: &str = ".hipobj-rc";
/// The largest transfer one session moves.
pub const MAX_TRANSFER: u64 = 0x7fff_ffff;
/// Characters of an RC token.
pub const TOKEN_HEX_LEN: usize = 88;
/// Bytes of an RC token.
pub const TOKEN_BYTES: usize = 44;

/// The `x-amz-rdma-*` headers of the dialect (lowercase, as HTTP/2 and
/// SigV4 canonical headers spell them).
pub mod header {
    /// The dialect (`hipobj-rc-v2`), on every request and success reply.
    pub const PROTOCOL: &str = "x-amz-rdma-protocol";
    /// `unsupported` on a `501`: the client may fall back to HTTP.
    pub const PROTOCOL_STATUS: &str = "x-amz-rdma-protocol-status";
    /// PREPARE: the client's RC token.
    pub const TOKEN: &str = "x-amz-rdma-token";
    /// PREPARE: the client's PSN; PREPARE reply: the server's.
    pub const PSN: &str = "x-amz-rdma-psn";
    /// PREPARE, READY and the final reply: the transfer's cookie.
    pub const COOKIE: &str = "x-amz-rdma-cookie";
    /// PREPARE: `GET` or `PUT`.
    pub const OP: &str = "x-amz-rdma-op";
    /// PREPARE: `/<bucket>/<key>[?query]`, percent-encoded.
    pub const TARGET: &str = "x-amz-rdma-target";
    /// PREPARE: bytes to move (1 ..= [`super::MAX_TRANSFER`]).
    pub const SIZE: &str = "x-amz-rdma-size";
    /// PREPARE (GET): first byte of the object to move (absent: 0).
    pub const OFFSET: &str = "x-amz-rdma-offset";
    /// PREPARE reply, READY, CANCEL: the session id (32 hex digits).
    pub const SESSION: &str = "x-amz-rdma-session";
    /// READY: the client's QP number; PREPARE reply: the server's.
    pub const QPN: &str = "x-amz-rdma-qpn";
    /// READY: the client's buffer; PREPARE reply (PUT): the staging region.
    pub const MR_ADDR: &str = "x-amz-rdma-mr-addr";
    /// The remote key of [`MR_ADDR`]'s region.
    pub const MR_RKEY: &str = "x-amz-rdma-mr-rkey";
    /// PREPARE reply: `200:<server token>`.
    pub const REPLY: &str = "x-amz-rdma-reply";
    /// Final reply: bytes moved, decimal.
    pub const BYTES_TRANSFERRED: &str = "x-amz-rdma-bytes-transferred";
    /// Final reply: the object's ETag (PUT: the new object's).
    pub const ETAG: &str = "x-amz-rdma-etag";
    /// Final reply: `CRC64NVME <base64 of the 8 big-endian bytes>` of the
    /// bytes moved.
    pub const CHECKSUM: &str = "x-amz-rdma-checksum";
}

/// The three control requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// `POST /.hipobj-rc/prepare`.
    Prepare,
    /// `POST /.hipobj-rc/ready`.
    Ready,
    /// `POST /.hipobj-rc/cancel`.
    Cancel,
}

impl Control {
    /// The control request a path names (`None`: not a control path).
    #[must_use]
    pub fn from_path(path: &str) -> Option<Control> {
        match path.strip_prefix("/.hipobj-rc/")? {
            "prepare" => Some(Control::Prepare),
            "ready" => Some(Control::Ready),
            "cancel" => Some(Control::Cancel),
            _ => None,
        }
    }

    /// Whether `path` is under the control path at all (a request there
    /// that is not one of the three is answered as unsupported).
    #[must_use]
    pub fn is_control_path(path: &str) -> bool {
        path == "/.hipobj-rc" || path.starts_with("/.hipobj-rc/")
    }

    /// The request's path.
    #[must_use]
    pub fn path(self) -> &'static str {
        match self {
            Control::Prepare => "/.hipobj-rc/prepare",
            Control::Ready => "/.hipobj-rc/ready",
            Control::Cancel => "/.hipobj-rc/cancel",
        }
    }
}

/// The transport byte of a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// `0x00`: a DC target (the cuObject dialect).
    Dc,
    /// `0x01`: an RC queue pair (this dialect).
    Rc,
}

/// A 44-byte token (88 hex characters): the QP, GID and port of one side
/// of a transfer. Integers are little-endian (the peers `memcpy` host-order
/// integers on little-endian machines); the GID is raw, as in `ibv_gid`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RcToken {
    /// Byte 0.
    pub transport: Transport,
    /// Bytes 1..5: the QP number.
    pub qpn: u32,
    /// Bytes 5..21: the port's GID.
    pub gid: [u8; 16],
    /// Bytes 21..25 (0 in this dialect: regions travel in headers).
    pub rkey: u32,
    /// Bytes 25..33 (0 in this dialect).
    pub addr: u64,
    /// Bytes 33..41 (0 in this dialect).
    pub length: u64,
    /// Byte 41: the port number.
    pub port: u8,
    /// Bytes 42..44: the LID (0 on RoCE).
    pub lid: u16,
}

impl fmt::Debug for RcToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RcToken({})", self.encode())
    }
}

/// Why a control request or reply is not one this dialect defines.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// `x-amz-rdma-protocol` missing or another dialect's: answer `501`
    /// with `x-amz-rdma-protocol-status: unsupported`.
    #[error("x-amz-rdma-protocol must be {PROTOCOL}, got {0:?}")]
    Unsupported(Option<String>),
    /// A required header is missing.
    #[error("{0} is required")]
    Missing(&'static str),
    /// A header appears more than once.
    #[error("{0} must appear once")]
    Duplicate(&'static str),
    /// A header's value is malformed.
    #[error("{header} is malformed: {reason}")]
    Malformed {
        /// The header.
        header: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// The size is over [`MAX_TRANSFER`]: answer `413`.
    #[error("x-amz-rdma-size {0} is over the {MAX_TRANSFER}-byte limit of one transfer")]
    TooLarge(u64),
}

impl ControlError {
    /// The HTTP status that answers it.
    #[must_use]
    pub fn status(&self) -> u16 {
        match self {
            ControlError::Unsupported(_) => 501,
            ControlError::TooLarge(_) => 413,
            ControlError::Missing(_)
            | ControlError::Duplicate(_)
            | ControlError::Malformed { .. } => 400,
        }
    }
}

fn malformed(header: &'static str, reason: &'static str) -> ControlError {
    ControlError::Malformed { header, reason }
}

fn hex_nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// A hex number of 1..=`max_digits` digits (either case, no `0x`).
fn parse_hex(s: &str, max_digits: usize) -> Option<u64> {
    if s.is_empty() || s.len() > max_digits {
        return None;
    }
    s.bytes()
        .try_fold(0u64, |acc, c| Some(acc << 4 | u64::from(hex_nibble(c)?)))
}

impl RcToken {
    /// A token for one side of a transfer (rkey, addr and length 0, as the
    /// dialect's peers send them).
    #[must_use]
    pub fn rc(qpn: u32, gid: [u8; 16], port: u8) -> RcToken {
        RcToken {
            transport: Transport::Rc,
            qpn,
            gid,
            rkey: 0,
            addr: 0,
            length: 0,
            port,
            lid: 0,
        }
    }

    /// The 44 bytes.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; TOKEN_BYTES] {
        let mut b = [0u8; TOKEN_BYTES];
        b[0] = match self.transport {
            Transport::Dc => 0,
            Transport::Rc => 1,
        };
        b[1..5].copy_from_slice(&self.qpn.to_le_bytes());
        b[5..21].copy_from_slice(&self.gid);
        b[21..25].copy_from_slice(&self.rkey.to_le_bytes());
        b[25..33].copy_from_slice(&self.addr.to_le_bytes());
        b[33..41].copy_from_slice(&self.length.to_le_bytes());
        b[41] = self.port;
        b[42..44].copy_from_slice(&self.lid.to_le_bytes());
        b
    }

    /// The 88 lowercase hex characters.
    #[must_use]
    pub fn encode(&self) -> String {
        use std::fmt::Write as _;
        self.to_bytes()
            .iter()
            .fold(String::with_capacity(TOKEN_HEX_LEN), |mut s, b| {
                let _ = write!(s, "{b:02x}");
                s
            })
    }

    /// Parses a token: 88 hex characters (either case), optionally followed
    /// by `:<addr>:<size>` (1..=16 hex digits each, checked and ignored, as
    /// the peers do).
    ///
    /// # Errors
    /// [`ControlError::Malformed`] naming what is wrong.
    pub fn parse(value: &str) -> Result<RcToken, ControlError> {
        const H: &str = header::TOKEN;
        let (hex, suffix) = value.split_at_checked(TOKEN_HEX_LEN).ok_or(malformed(
            H,
            "must be 88 hex characters (44 bytes: transport, qpn, gid, rkey, addr, length, port, lid)",
        ))?;
        if !suffix.is_empty() {
            let mut parts = suffix.split(':');
            let ok = parts.next() == Some("")
                && parts.next().and_then(|a| parse_hex(a, 16)).is_some()
                && parts.next().and_then(|s| parse_hex(s, 16)).is_some()
                && parts.next().is_none();
            if !ok {
                return Err(malformed(
                    H,
                    "after the 88 hex characters only `:<addr hex>:<size hex>` may follow",
                ));
            }
        }
        let mut b = [0u8; TOKEN_BYTES];
        for (i, pair) in hex.as_bytes().chunks_exact(2).enumerate() {
            let (Some(hi), Some(lo)) = (hex_nibble(pair[0]), hex_nibble(pair[1])) else {
                return Err(malformed(H, "must be hex digits"));
            };
            b[i] = hi << 4 | lo;
        }
        Self::from_bytes(&b)
    }

    /// Reads the 44 bytes.
    ///
    /// # Errors
    /// An unknown transport byte.
    pub fn from_bytes(b: &[u8; TOKEN_BYTES]) -> Result<RcToken, ControlError> {
        let transport = match b[0] {
            0 => Transport::Dc,
            1 => Transport::Rc,
            _ => {
                return Err(malformed(
                    header::TOKEN,
                    "transport must be 0x00 (DC) or 0x01 (RC)",
                ));
            }
        };
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[5..21]);
        Ok(RcToken {
            transport,
            qpn: u32_at(1),
            gid,
            rkey: u32_at(21),
            addr: u64_at(25),
            length: u64_at(33),
            port: b[41],
            lid: u16::from_le_bytes([b[42], b[43]]),
        })
    }

    /// The all-zero token: the peers' marker for "same device" loopback.
    #[must_use]
    pub fn is_loopback_marker(&self) -> bool {
        self.to_bytes() == [0u8; TOKEN_BYTES]
    }
}

/// `GET` or `PUT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The server writes the object's bytes into the client's buffer.
    Get,
    /// The client writes the bytes into the server's staging region.
    Put,
}

/// The object a PREPARE names (`x-amz-rdma-target`), decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The bucket.
    pub bucket: String,
    /// The key (percent-decoded).
    pub key: String,
    /// PUT: `?uploadId=…&partNumber=…` (an UploadPart); GET: `?partNumber=…`
    /// is refused (ranges go by offset).
    pub upload: Option<(String, u32)>,
}

fn percent_decode(s: &str, header: &'static str) -> Result<String, ControlError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let (Some(hi), Some(lo)) = (
                b.get(i + 1).copied().and_then(hex_nibble),
                b.get(i + 2).copied().and_then(hex_nibble),
            ) else {
                return Err(malformed(header, "bad percent-encoding"));
            };
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| malformed(header, "not UTF-8 once decoded"))
}

/// Percent-encodes a key for `x-amz-rdma-target` (RFC 3986 unreserved
/// characters and `/` kept, upper-case `%XX`, as hipObject's `buildTarget`).
#[must_use]
pub fn encode_target(bucket: &str, key: &str) -> String {
    let mut s = String::with_capacity(bucket.len() + key.len() + 2);
    s.push('/');
    s.push_str(bucket);
    s.push('/');
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            s.push(char::from(b));
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

impl Target {
    /// Parses `/<bucket>/<key>[?uploadId=<id>&partNumber=<n>]`.
    ///
    /// # Errors
    /// [`ControlError::Malformed`].
    pub fn parse(value: &str, op: Op) -> Result<Target, ControlError> {
        const H: &str = header::TARGET;
        let (path, query) = match value.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (value, None),
        };
        let rest = path
            .strip_prefix('/')
            .ok_or(malformed(H, "must start with /<bucket>/"))?;
        let (bucket, key) = rest
            .split_once('/')
            .ok_or(malformed(H, "must be /<bucket>/<key>"))?;
        let bucket = percent_decode(bucket, H)?;
        let key = percent_decode(key, H)?;
        if bucket.is_empty() || key.is_empty() {
            return Err(malformed(H, "bucket and key must not be empty"));
        }
        let upload = match query {
            None | Some("") => None,
            Some(q) => {
                if op == Op::Get {
                    return Err(malformed(
                        H,
                        "a GET target takes no query (ranges go by x-amz-rdma-offset)",
                    ));
                }
                let mut upload_id = None;
                let mut part = None;
                for pair in q.split('&') {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    match k {
                        "uploadId" if upload_id.is_none() => {
                            upload_id = Some(percent_decode(v, H)?);
                        }
                        "partNumber" if part.is_none() => {
                            part = Some(
                                v.parse::<u32>()
                                    .ok()
                                    .filter(|n| (1..=10_000).contains(n))
                                    .ok_or(malformed(H, "partNumber must be 1..=10000"))?,
                            );
                        }
                        _ => {
                            return Err(malformed(
                                H,
                                "a PUT target's query may hold only uploadId and partNumber, once each",
                            ));
                        }
                    }
                }
                match (upload_id, part) {
                    (Some(id), Some(n)) if !id.is_empty() => Some((id, n)),
                    _ => {
                        return Err(malformed(
                            H,
                            "an UploadPart target needs both uploadId and partNumber",
                        ));
                    }
                }
            }
        };
        Ok(Target {
            bucket,
            key,
            upload,
        })
    }
}

/// A session id: 128 random bits, 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionId(pub [u8; 16]);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({self})")
    }
}

impl SessionId {
    /// A fresh random id.
    #[must_use]
    pub fn random() -> SessionId {
        SessionId(rand::random())
    }

    /// Parses 32 hex digits (either case).
    ///
    /// # Errors
    /// [`ControlError::Malformed`].
    pub fn parse(s: &str) -> Result<SessionId, ControlError> {
        let bad = || malformed(header::SESSION, "must be 32 hex digits");
        if s.len() != 32 {
            return Err(bad());
        }
        let mut id = [0u8; 16];
        for (i, pair) in s.as_bytes().chunks_exact(2).enumerate() {
            let (Some(hi), Some(lo)) = (hex_nibble(pair[0]), hex_nibble(pair[1])) else {
                return Err(bad());
            };
            id[i] = hi << 4 | lo;
        }
        Ok(SessionId(id))
    }
}

/// A random PSN, 1 ..= 0xffffff (peers refuse 0).
#[must_use]
pub fn random_psn() -> u32 {
    rand::random_range(1..=0x00ff_ffff)
}

/// A PSN as it travels: 6 lowercase hex digits.
#[must_use]
pub fn format_psn(psn: u32) -> String {
    format!("{:06x}", psn & 0x00ff_ffff)
}

/// Reads a PSN (1..=6 hex digits, not 0).
///
/// # Errors
/// [`ControlError::Malformed`].
pub fn parse_psn(s: &str) -> Result<u32, ControlError> {
    parse_hex(s.trim(), 6)
        .filter(|&p| p != 0)
        .and_then(|p| u32::try_from(p).ok())
        .ok_or(malformed(header::PSN, "must be 1 to 6 hex digits, not 0"))
}

/// Reads a cookie (exactly 8 hex digits, either case).
///
/// # Errors
/// [`ControlError::Malformed`].
pub fn parse_cookie(s: &str) -> Result<u32, ControlError> {
    let s = s.trim();
    (s.len() == 8)
        .then(|| parse_hex(s, 8))
        .flatten()
        .and_then(|c| u32::try_from(c).ok())
        .ok_or(malformed(header::COOKIE, "must be 8 hex digits"))
}

/// A cookie as it travels: 8 lowercase hex digits.
#[must_use]
pub fn format_cookie(cookie: u32) -> String {
    format!("{cookie:08x}")
}

/// The headers of a request, as the parsers read them: every value of a
/// lowercase name (none: absent).
pub trait Headers {
    /// The values of `name`.
    fn values(&self, name: &str) -> Vec<&str>;
}

impl Headers for [(&str, &str)] {
    fn values(&self, name: &str) -> Vec<&str> {
        self.iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
            .collect()
    }
}

fn one<'a, H: Headers + ?Sized>(
    h: &'a H,
    name: &'static str,
) -> Result<Option<&'a str>, ControlError> {
    let v = h.values(name);
    match v.as_slice() {
        [] => Ok(None),
        [x] => Ok(Some(x.trim())),
        _ => Err(ControlError::Duplicate(name)),
    }
}

fn required<'a, H: Headers + ?Sized>(
    h: &'a H,
    name: &'static str,
) -> Result<&'a str, ControlError> {
    one(h, name)?.ok_or(ControlError::Missing(name))
}

/// Checks `x-amz-rdma-protocol` (every control request carries it).
///
/// # Errors
/// [`ControlError::Unsupported`].
pub fn check_protocol<H: Headers + ?Sized>(h: &H) -> Result<(), ControlError> {
    match one(h, header::PROTOCOL)? {
        Some(PROTOCOL) => Ok(()),
        other => Err(ControlError::Unsupported(other.map(str::to_owned))),
    }
}

/// A parsed PREPARE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareRequest {
    /// The client's token.
    pub token: RcToken,
    /// The client's PSN (the server's receive PSN).
    pub client_psn: u32,
    /// The cookie.
    pub cookie: u32,
    /// GET or PUT.
    pub op: Op,
    /// The object.
    pub target: Target,
    /// Bytes to move, 1 ..= [`MAX_TRANSFER`].
    pub size: u32,
    /// GET: the object's first byte to move.
    pub offset: u64,
}

impl PrepareRequest {
    /// Parses a PREPARE's headers.
    ///
    /// # Errors
    /// [`ControlError`] (its [`ControlError::status`] is the reply's).
    pub fn parse<H: Headers + ?Sized>(h: &H) -> Result<PrepareRequest, ControlError> {
        check_protocol(h)?;
        let token = RcToken::parse(required(h, header::TOKEN)?)?;
        if !token.is_loopback_marker() {
            if token.transport != Transport::Rc {
                return Err(malformed(
                    header::TOKEN,
                    "transport must be 0x01 (RC) in this dialect",
                ));
            }
            if token.gid == [0; 16] {
                return Err(malformed(header::TOKEN, "the GID must not be zero"));
            }
            if token.qpn == 0 || token.qpn > 0x00ff_ffff {
                return Err(malformed(
                    header::TOKEN,
                    "the QP number must be 1..=0xffffff",
                ));
            }
        }
        let client_psn = parse_psn(required(h, header::PSN)?)?;
        let cookie = parse_cookie(required(h, header::COOKIE)?)?;
        let op = match required(h, header::OP)? {
            "GET" => Op::Get,
            "PUT" => Op::Put,
            _ => return Err(malformed(header::OP, "must be GET or PUT")),
        };
        let target = Target::parse(required(h, header::TARGET)?, op)?;
        let size_text = required(h, header::SIZE)?;
        let size: u64 = parse_decimal(size_text)
            .ok_or(malformed(header::SIZE, "must be a decimal byte count"))?;
        if size == 0 {
            return Err(malformed(header::SIZE, "must be at least 1"));
        }
        let size = u32::try_from(size)
            .ok()
            .filter(|&s| u64::from(s) <= MAX_TRANSFER)
            .ok_or(ControlError::TooLarge(size))?;
        let offset = match one(h, header::OFFSET)? {
            None => 0,
            Some(o) => parse_decimal(o)
                .ok_or(malformed(header::OFFSET, "must be a decimal byte offset"))?,
        };
        if op == Op::Put && offset != 0 {
            return Err(malformed(
                header::OFFSET,
                "a PUT writes a whole object or part: no offset",
            ));
        }
        Ok(PrepareRequest {
            token,
            client_psn,
            cookie,
            op,
            target,
            size,
            offset,
        })
    }
}

/// Digits only, at most 20 (no sign, no spaces inside).
fn parse_decimal(s: &str) -> Option<u64> {
    (!s.is_empty() && s.len() <= 20 && s.bytes().all(|c| c.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// A parsed READY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadyRequest {
    /// The session.
    pub session: SessionId,
    /// The cookie (must equal PREPARE's).
    pub cookie: u32,
    /// The client's QP number (must equal its token's).
    pub qpn: u32,
    /// The client's buffer (GET: written by the server).
    pub mr_addr: u64,
    /// Its remote key.
    pub mr_rkey: u32,
}

impl ReadyRequest {
    /// Parses a READY's headers. The QP number and region may be written
    /// with up to 16 hex digits (versitygw's client pads them to 16).
    ///
    /// # Errors
    /// [`ControlError`].
    pub fn parse<H: Headers + ?Sized>(h: &H) -> Result<ReadyRequest, ControlError> {
        check_protocol(h)?;
        let session = SessionId::parse(required(h, header::SESSION)?)?;
        let cookie = parse_cookie(required(h, header::COOKIE)?)?;
        let qpn = parse_hex(required(h, header::QPN)?, 16)
            .and_then(|q| u32::try_from(q).ok())
            .filter(|&q| q != 0 && q <= 0x00ff_ffff)
            .ok_or(malformed(
                header::QPN,
                "must be a hex QP number, 1..=ffffff",
            ))?;
        let mr_addr = match one(h, header::MR_ADDR)? {
            None => 0,
            Some(a) => parse_hex(a, 16).ok_or(malformed(header::MR_ADDR, "must be hex"))?,
        };
        let mr_rkey = match one(h, header::MR_RKEY)? {
            None => 0,
            Some(k) => parse_hex(k, 16)
                .and_then(|k| u32::try_from(k).ok())
                .ok_or(malformed(header::MR_RKEY, "must be a 32-bit hex key"))?,
        };
        Ok(ReadyRequest {
            session,
            cookie,
            qpn,
            mr_addr,
            mr_rkey,
        })
    }
}

/// Parses a CANCEL's headers: the session (the protocol header is checked;
/// a malformed id is still answered `204` by the server).
///
/// # Errors
/// [`ControlError`].
pub fn parse_cancel<H: Headers + ?Sized>(h: &H) -> Result<SessionId, ControlError> {
    check_protocol(h)?;
    SessionId::parse(required(h, header::SESSION)?)
}

/// What a server answers a PREPARE with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareReply {
    /// The server's token (its QP, GID and port).
    pub token: RcToken,
    /// The session.
    pub session: SessionId,
    /// The server's PSN (the client's receive PSN).
    pub server_psn: u32,
    /// PUT: the staging region the client writes into (address, rkey).
    pub staging: Option<(u64, u32)>,
}

impl PrepareReply {
    /// The reply's headers (status 200, empty body).
    #[must_use]
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = vec![
            (header::PROTOCOL, PROTOCOL.to_owned()),
            (header::REPLY, format!("200:{}", self.token.encode())),
            (header::SESSION, self.session.to_string()),
            (header::PSN, format_psn(self.server_psn)),
            (header::QPN, format!("{:x}", self.token.qpn)),
        ];
        if let Some((addr, rkey)) = self.staging {
            h.push((header::MR_ADDR, format!("{addr:x}")));
            h.push((header::MR_RKEY, format!("{rkey:x}")));
        }
        h
    }

    /// Reads a PREPARE reply (a client): the protocol echo, `200:<token>`
    /// (or the older `200 <token>`), the session, the PSN and, when
    /// present, the staging region.
    ///
    /// # Errors
    /// [`ControlError`].
    pub fn parse<H: Headers + ?Sized>(h: &H) -> Result<PrepareReply, ControlError> {
        check_protocol(h)?;
        let token = parse_reply_token(required(h, header::REPLY)?)?;
        if token.transport != Transport::Rc || token.gid == [0; 16] {
            return Err(malformed(
                header::REPLY,
                "the server's token must be an RC token with a GID",
            ));
        }
        let session = SessionId::parse(required(h, header::SESSION)?)?;
        let server_psn = parse_psn(required(h, header::PSN)?)?;
        let staging = match (one(h, header::MR_ADDR)?, one(h, header::MR_RKEY)?) {
            (Some(a), Some(k)) => Some((
                parse_hex(a, 16)
                    .filter(|&a| a != 0)
                    .ok_or(malformed(header::MR_ADDR, "must be non-zero hex"))?,
                parse_hex(k, 8)
                    .and_then(|k| u32::try_from(k).ok())
                    .ok_or(malformed(header::MR_RKEY, "must be a 32-bit hex key"))?,
            )),
            _ => None,
        };
        Ok(PrepareReply {
            token,
            session,
            server_psn,
            staging,
        })
    }
}

/// Reads `x-amz-rdma-reply: 200:<token>` (or `200 <token>`, an older
/// peer's spelling) of a PREPARE reply.
///
/// # Errors
/// [`ControlError::Malformed`].
pub fn parse_reply_token(value: &str) -> Result<RcToken, ControlError> {
    let v = value.trim();
    let rest = v
        .strip_prefix("200:")
        .or_else(|| v.strip_prefix("200 "))
        .ok_or(malformed(header::REPLY, "must be 200:<88 hex token>"))?;
    RcToken::parse(rest.trim_start())
}

/// The final reply (to READY) of a transfer that succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalReply {
    /// The cookie, echoed.
    pub cookie: u32,
    /// Bytes moved.
    pub bytes: u64,
    /// The object's ETag (quoted as S3 writes it), when known.
    pub etag: Option<String>,
    /// The CRC64NVME of the bytes moved.
    pub crc64nvme: Option<u64>,
}

impl FinalReply {
    /// The reply's headers (status 200, empty body).
    #[must_use]
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = vec![
            (header::PROTOCOL, PROTOCOL.to_owned()),
            (header::COOKIE, format_cookie(self.cookie)),
            (header::BYTES_TRANSFERRED, self.bytes.to_string()),
        ];
        if let Some(e) = &self.etag {
            h.push((header::ETAG, e.clone()));
        }
        if let Some(c) = self.crc64nvme {
            h.push((header::CHECKSUM, format_crc64nvme(c)));
        }
        h
    }

    /// Reads a final reply (a client): the protocol echo, the cookie (which
    /// must be `cookie`), the byte count.
    ///
    /// # Errors
    /// [`ControlError`]; a cookie other than `cookie` is
    /// [`ControlError::Malformed`].
    pub fn parse<H: Headers + ?Sized>(h: &H, cookie: u32) -> Result<FinalReply, ControlError> {
        check_protocol(h)?;
        let echoed = parse_cookie(required(h, header::COOKIE)?)?;
        if echoed != cookie {
            return Err(malformed(header::COOKIE, "the echoed cookie is not ours"));
        }
        let bytes = parse_decimal(required(h, header::BYTES_TRANSFERRED)?).ok_or(malformed(
            header::BYTES_TRANSFERRED,
            "must be a decimal byte count",
        ))?;
        let etag = one(h, header::ETAG)?.map(str::to_owned);
        let crc64nvme = match one(h, header::CHECKSUM)? {
            None => None,
            Some(c) => Some(parse_crc64nvme(c).ok_or(malformed(
                header::CHECKSUM,
                "must be `CRC64NVME <12 base64 characters>`",
            ))?),
        };
        Ok(FinalReply {
            cookie: echoed,
            bytes,
            etag,
            crc64nvme,
        })
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `CRC64NVME <base64 of the 8 big-endian bytes>` (12 characters, one `=`).
#[must_use]
pub fn format_crc64nvme(crc: u64) -> String {
    let b = crc.to_be_bytes();
    let mut s = String::from("CRC64NVME ");
    for chunk in b.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &x)| n | u32::from(x) << (16 - 8 * i));
        let chars = chunk.len() + 1;
        for i in 0..4 {
            if i < chars {
                s.push(char::from(B64[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// Reads [`format_crc64nvme`]'s form (canonical base64 only).
#[must_use]
pub fn parse_crc64nvme(s: &str) -> Option<u64> {
    let b64 = s.strip_prefix("CRC64NVME ")?;
    if b64.len() != 12 || !b64.ends_with('=') || b64[..11].contains('=') {
        return None;
    }
    let mut bits: u128 = 0;
    for c in b64[..11].bytes() {
        let v = B64.iter().position(|&x| x == c)?;
        bits = bits << 6 | v as u128;
    }
    // 11 characters = 66 bits: 64 data bits and 2 pad bits that must be 0.
    if bits & 0b11 != 0 {
        return None;
    }
    u64::try_from(bits >> 2).ok()
}

/// The headers of a `501` that tells a client to fall back to HTTP.
#[must_use]
pub fn unsupported_headers() -> Vec<(&'static str, &'static str)> {
    vec![(header::PROTOCOL_STATUS, "unsupported")]
}

#[cfg(test)]
mod tests {
    use super::*;

    const GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];

    fn prepare_headers(token: &str) -> Vec<(&'static str, String)> {
        vec![
            (header::PROTOCOL, PROTOCOL.into()),
            (header::TOKEN, token.into()),
            (header::PSN, "00abcd".into()),
            (header::COOKIE, "DEADBEEF".into()),
            (header::OP, "GET".into()),
            (header::TARGET, "/b/dir/a%20b%2B.bin".into()),
            (header::SIZE, "4096".into()),
        ]
    }

    fn view<'a>(h: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
        h.iter().map(|(n, v)| (*n, v.as_str())).collect()
    }

    #[test]
    fn token_layout_matches_the_wire_description() {
        let t = RcToken {
            transport: Transport::Rc,
            qpn: 0x0011_2233,
            gid: GID,
            rkey: 0xaabb_ccdd,
            addr: 0x0102_0304_0506_0708,
            length: 42,
            port: 1,
            lid: 0x1234,
        };
        let hex = t.encode();
        assert_eq!(hex.len(), TOKEN_HEX_LEN);
        // transport, qpn LE, gid raw, rkey LE, addr LE, length LE, port, lid LE.
        assert_eq!(
            hex,
            "01\
             33221100\
             00000000000000000000ffff0a000001\
             ddccbbaa\
             0807060504030201\
             2a00000000000000\
             01\
             3412"
        );
        assert_eq!(RcToken::parse(&hex).unwrap(), t);
        assert_eq!(RcToken::parse(&hex.to_uppercase()).unwrap(), t);
        assert_eq!(RcToken::parse(&format!("{hex}:7f00:1000")).unwrap(), t);
        for bad in [
            &hex[..87],
            &format!("{hex}0"),
            &format!("{hex}:7f00"),
            &format!("{hex}:7f00:"),
            &format!("{hex}:x:1"),
            &format!("{hex}:1:2:3"),
            &format!("02{}", &hex[2..]),
            &format!("zz{}", &hex[2..]),
        ] {
            assert!(RcToken::parse(bad).is_err(), "{bad}");
        }
        assert!(
            RcToken::parse(&"0".repeat(88))
                .unwrap()
                .is_loopback_marker()
        );
    }

    #[test]
    fn prepare_parses_and_refuses_with_the_peers_statuses() {
        let tok = RcToken::rc(0x42, GID, 1).encode();
        let h = prepare_headers(&tok);
        let p = PrepareRequest::parse(view(&h).as_slice()).unwrap();
        assert_eq!(p.token.qpn, 0x42);
        assert_eq!(p.client_psn, 0xabcd);
        assert_eq!(p.cookie, 0xdead_beef);
        assert_eq!(p.op, Op::Get);
        assert_eq!(p.target.bucket, "b");
        assert_eq!(p.target.key, "dir/a b+.bin");
        assert_eq!(p.size, 4096);
        assert_eq!(p.offset, 0);

        let with = |name: &'static str, value: Option<&str>| {
            let mut h: Vec<_> = h.iter().filter(|(n, _)| *n != name).cloned().collect();
            if let Some(v) = value {
                h.push((name, v.to_owned()));
            }
            PrepareRequest::parse(view(&h).as_slice()).map_err(|e| e.status())
        };
        assert_eq!(with(header::PROTOCOL, None), Err(501));
        assert_eq!(with(header::PROTOCOL, Some("cuobject")), Err(501));
        assert_eq!(
            with(header::SIZE, Some("2147483647")).map(|p| p.size),
            Ok(0x7fff_ffff)
        );
        assert_eq!(with(header::SIZE, Some("2147483648")), Err(413));
        assert_eq!(with(header::SIZE, Some("18446744073709551615")), Err(413));
        assert_eq!(with(header::SIZE, Some("0")), Err(400));
        assert_eq!(with(header::SIZE, Some("-1")), Err(400));
        assert_eq!(with(header::PSN, Some("000000")), Err(400));
        assert_eq!(with(header::PSN, Some("1000000")), Err(400));
        assert_eq!(with(header::COOKIE, Some("1234")), Err(400));
        assert_eq!(with(header::OP, Some("DELETE")), Err(400));
        assert_eq!(with(header::TARGET, Some("b/k")), Err(400));
        assert_eq!(with(header::TARGET, Some("/b/")), Err(400));
        assert_eq!(with(header::TARGET, Some("/b/k?partNumber=1")), Err(400));
        assert_eq!(with(header::TARGET, Some("/b/%zz")), Err(400));
        assert_eq!(with(header::OFFSET, Some("10")).map(|p| p.offset), Ok(10));
        assert_eq!(with(header::OFFSET, Some("1e3")), Err(400));
        assert_eq!(with(header::TOKEN, None), Err(400));
        let dc = RcToken {
            transport: Transport::Dc,
            ..RcToken::rc(0x42, GID, 1)
        };
        assert_eq!(with(header::TOKEN, Some(&dc.encode())), Err(400));
        assert_eq!(
            with(header::TOKEN, Some(&RcToken::rc(0x42, [0; 16], 1).encode())),
            Err(400)
        );
        let mut twice = h.clone();
        twice.push((header::COOKIE, "00000001".into()));
        assert_eq!(
            PrepareRequest::parse(view(&twice).as_slice()).map_err(|e| e.status()),
            Err(400)
        );
    }

    #[test]
    fn upload_part_targets() {
        let t = Target::parse("/b/k?uploadId=abc%2Fdef&partNumber=3", Op::Put).unwrap();
        assert_eq!(t.upload, Some(("abc/def".into(), 3)));
        let t = Target::parse("/b/k?partNumber=3&uploadId=x", Op::Put).unwrap();
        assert_eq!(t.upload, Some(("x".into(), 3)));
        for bad in [
            "/b/k?uploadId=x",
            "/b/k?partNumber=1",
            "/b/k?uploadId=x&partNumber=0",
            "/b/k?uploadId=x&partNumber=10001",
            "/b/k?uploadId=x&partNumber=1&versionId=2",
            "/b/k?uploadId=x&uploadId=y&partNumber=1",
        ] {
            assert!(Target::parse(bad, Op::Put).is_err(), "{bad}");
        }
        assert_eq!(
            encode_target("b", "dir/a b+ü.bin"),
            "/b/dir/a%20b%2B%C3%BC.bin"
        );
        let round = Target::parse(&encode_target("b", "dir/a b+ü.bin"), Op::Get).unwrap();
        assert_eq!(round.key, "dir/a b+ü.bin");
    }

    #[test]
    fn ready_accepts_padded_and_unpadded_numbers() {
        let s = SessionId([7; 16]);
        let mk = |qpn: &str| {
            vec![
                (header::PROTOCOL, PROTOCOL.to_owned()),
                (header::SESSION, s.to_string()),
                (header::COOKIE, "0000002a".to_owned()),
                (header::QPN, qpn.to_owned()),
                (header::MR_ADDR, "00007f0000001000".to_owned()),
                (header::MR_RKEY, "1234".to_owned()),
            ]
        };
        for qpn in ["11", "00000011", "0000000000000011"] {
            let r = ReadyRequest::parse(view(&mk(qpn)).as_slice()).unwrap();
            assert_eq!((r.session, r.cookie, r.qpn), (s, 42, 0x11));
            assert_eq!((r.mr_addr, r.mr_rkey), (0x7f00_0000_1000, 0x1234));
        }
        for qpn in ["0", "1000000", "00000000000000011", "q"] {
            assert!(
                ReadyRequest::parse(view(&mk(qpn)).as_slice()).is_err(),
                "{qpn}"
            );
        }
        assert!(SessionId::parse(&"a".repeat(31)).is_err());
        assert!(SessionId::parse(&"g".repeat(32)).is_err());
    }

    #[test]
    fn replies_round_trip_and_accept_the_older_spelling() {
        let reply = PrepareReply {
            token: RcToken::rc(0x99, GID, 1),
            session: SessionId::random(),
            server_psn: random_psn(),
            staging: Some((0x7f12_3400_0000, 0xabcd)),
        };
        let h = reply.headers();
        assert_eq!(PrepareReply::parse(view(&h).as_slice()).unwrap(), reply);
        let spaced: Vec<_> = h
            .iter()
            .map(|(n, v)| (*n, v.replacen("200:", "200 ", 1)))
            .collect();
        assert_eq!(
            PrepareReply::parse(view(&spaced).as_slice()).unwrap(),
            reply
        );
        let zero_gid: Vec<_> = h
            .iter()
            .map(|(n, v)| {
                if *n == header::REPLY {
                    (*n, format!("200:{}", "0".repeat(88)))
                } else {
                    (*n, v.clone())
                }
            })
            .collect();
        assert!(PrepareReply::parse(view(&zero_gid).as_slice()).is_err());

        let fin = FinalReply {
            cookie: 0xdead_beef,
            bytes: 4096,
            etag: Some("\"abc\"".into()),
            crc64nvme: Some(0x0123_4567_89ab_cdef),
        };
        let h = fin.headers();
        assert_eq!(
            FinalReply::parse(view(&h).as_slice(), 0xdead_beef).unwrap(),
            fin
        );
        assert!(FinalReply::parse(view(&h).as_slice(), 1).is_err());
        let upper: Vec<_> = h
            .iter()
            .map(|(n, v)| {
                (
                    *n,
                    if *n == header::COOKIE {
                        v.to_uppercase()
                    } else {
                        v.clone()
                    },
                )
            })
            .collect();
        assert!(FinalReply::parse(view(&upper).as_slice(), 0xdead_beef).is_ok());
    }

    #[test]
    fn crc64nvme_text_is_canonical_base64_of_big_endian_bytes() {
        // base64(00 00 00 00 00 00 00 00) = "AAAAAAAAAAA="; of 01..08 = "AQIDBAUGBwg=".
        assert_eq!(format_crc64nvme(0), "CRC64NVME AAAAAAAAAAA=");
        assert_eq!(
            format_crc64nvme(0x0102_0304_0506_0708),
            "CRC64NVME AQIDBAUGBwg="
        );
        for x in [0, 1, u64::MAX, 0x0102_0304_0506_0708, 0xdead_beef_0bad_f00d] {
            assert_eq!(parse_crc64nvme(&format_crc64nvme(x)), Some(x));
        }
        // Non-zero pad bits, wrong length, no prefix.
        assert_eq!(parse_crc64nvme("CRC64NVME AQIDBAUGBwh="), None);
        assert_eq!(parse_crc64nvme("CRC64NVME AQIDBAUGBw=="), None);
        assert_eq!(parse_crc64nvme("AQIDBAUGBwg="), None);
    }

    #[test]
    fn control_paths() {
        assert_eq!(
            Control::from_path("/.hipobj-rc/prepare"),
            Some(Control::Prepare)
        );
        assert_eq!(
            Control::from_path("/.hipobj-rc/ready"),
            Some(Control::Ready)
        );
        assert_eq!(
            Control::from_path("/.hipobj-rc/cancel"),
            Some(Control::Cancel)
        );
        assert_eq!(Control::from_path("/.hipobj-rc/other"), None);
        assert!(Control::is_control_path("/.hipobj-rc/other"));
        assert!(!Control::is_control_path("/.hipobj-rcx/prepare"));
        for c in [Control::Prepare, Control::Ready, Control::Cancel] {
            assert_eq!(Control::from_path(c.path()), Some(c));
        }
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(s in "\\PC{0,120}") {
            let _ = RcToken::parse(&s);
            let _ = Target::parse(&s, Op::Put);
            let _ = parse_reply_token(&s);
            let _ = parse_crc64nvme(&s);
            let _ = SessionId::parse(&s);
            let h = [(header::PROTOCOL, PROTOCOL), (header::TOKEN, s.as_str())];
            let _ = PrepareRequest::parse(h.as_slice());
        }
    }
}
