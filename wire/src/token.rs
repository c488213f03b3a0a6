//! The `x-amz-rdma-token` codec (pure, no I/O).
//!
//! A token is seven colon-separated lowercase hexadecimal fields of fixed
//! widths, 81 characters in all:
//!
//! ```text
//! addr(16):maxsize(8):rkey(8):lid(4):dctn(6):gidflag(1):gid(32)
//! ```
//!
//! (the cuObject `"%016lx:%08x:%08x:%04x:%06x:%01x:%016lx%016lx"` format).
//! Parsing is strict: exactly those widths, lowercase hex digits only, a
//! gid flag of `0` or `1`; anything else is a [`TokenError`] naming the field.
//!
//! On the `tcp` fabric the same fields name the endpoint: `gid` is its IP
//! address (IPv4-mapped IPv6 for IPv4), `lid` its TCP port, `dctn` the
//! responder number. The `verbs` backend's out-of-band exchange listens on the
//! same kind of address (RoCE v2 GIDs are IP addresses), so the mapping is the
//! same for both backends.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// Length of a token in characters.
pub const TOKEN_LEN: usize = 81;

const FIELDS: [(&str, usize); 7] = [
    ("addr", 16),
    ("maxsize", 8),
    ("rkey", 8),
    ("lid", 4),
    ("dctn", 6),
    ("gidflag", 1),
    ("gid", 32),
];

/// Largest responder number (`dctn` is 24 bits).
pub const MAX_DCTN: u32 = 0x00ff_ffff;

/// A parsed `x-amz-rdma-token`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RdmaToken {
    /// Remote address of the first byte.
    pub addr: u64,
    /// Number of bytes the token grants.
    pub size: u32,
    /// Remote key.
    pub rkey: u32,
    /// Local identifier (tcp: the endpoint's TCP port).
    pub lid: u16,
    /// DC target number (tcp: the responder number); 24 bits.
    pub dctn: u32,
    /// Whether `gid` is meaningful.
    pub gid_valid: bool,
    /// Global identifier (tcp: the endpoint's IPv6 / IPv4-mapped address).
    pub gid: [u8; 16],
}

impl fmt::Debug for RdmaToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RdmaToken({self})")
    }
}

/// Why a token could not be parsed or built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The token is not 81 characters long.
    #[error(
        "x-amz-rdma-token must be {TOKEN_LEN} characters (addr(16):maxsize(8):rkey(8):lid(4):dctn(6):gidflag(1):gid(32)), got {0}"
    )]
    Length(usize),
    /// Wrong number of colon-separated fields.
    #[error("x-amz-rdma-token must have 7 colon-separated fields, got {0}")]
    FieldCount(usize),
    /// A field has the wrong width.
    #[error("x-amz-rdma-token field `{field}` must be {expected} hex digits, got {got}")]
    FieldWidth {
        /// Field name.
        field: &'static str,
        /// Expected width.
        expected: usize,
        /// Actual width.
        got: usize,
    },
    /// A field has a character that is not a lowercase hex digit.
    #[error("x-amz-rdma-token field `{field}` must be lowercase hexadecimal, found {found:?}")]
    NotHex {
        /// Field name.
        field: &'static str,
        /// The offending character.
        found: char,
    },
    /// The gid flag is neither 0 nor 1.
    #[error("x-amz-rdma-token field `gidflag` must be 0 or 1, got {0}")]
    GidFlag(u8),
    /// The token has no gid, so it does not name a tcp endpoint.
    #[error("x-amz-rdma-token has no gid (gidflag 0), so it names no endpoint address")]
    NoGid,
    /// The endpoint or window cannot be expressed as a token.
    #[error("cannot express as an x-amz-rdma-token: {0}")]
    Unrepresentable(String),
    /// The token's memory range runs past the end of the address space.
    #[error("x-amz-rdma-token memory {addr:#x}+{size} wraps past the end of the address space")]
    AddressWraps {
        /// The token's address.
        addr: u64,
        /// The token's size.
        size: u32,
    },
    /// A slice of the token is outside it.
    #[error("slice {offset}+{len} is outside the token's {size} bytes")]
    Slice {
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
        /// The token's size.
        size: u32,
    },
}

fn parse_field(field: &'static str, s: &str) -> Result<u128, TokenError> {
    let mut v: u128 = 0;
    for c in s.chars() {
        let d = match c {
            '0'..='9' => c as u8 - b'0',
            'a'..='f' => c as u8 - b'a' + 10,
            _ => return Err(TokenError::NotHex { field, found: c }),
        };
        v = (v << 4) | d as u128;
    }
    Ok(v)
}

impl RdmaToken {
    /// Parses a token strictly.
    pub fn parse(s: &str) -> Result<RdmaToken, TokenError> {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != FIELDS.len() {
            if s.len() != TOKEN_LEN {
                return Err(TokenError::Length(s.len()));
            }
            return Err(TokenError::FieldCount(parts.len()));
        }
        let mut vals = [0u128; 7];
        for (i, (part, (name, width))) in parts.iter().zip(FIELDS).enumerate() {
            // Count characters, not bytes, so the message is right for non-ASCII.
            let got = part.chars().count();
            if got != width {
                return Err(TokenError::FieldWidth {
                    field: name,
                    expected: width,
                    got,
                });
            }
            vals[i] = parse_field(name, part)?;
        }
        let gid_flag = vals[5] as u8;
        if gid_flag > 1 {
            return Err(TokenError::GidFlag(gid_flag));
        }
        let (addr, size) = (vals[0] as u64, vals[1] as u32);
        // Every byte the token grants must have an address: a range that
        // wraps would make `addr + offset` overflow in whoever serves it.
        if addr.checked_add(u64::from(size)).is_none() {
            return Err(TokenError::AddressWraps { addr, size });
        }
        Ok(RdmaToken {
            addr,
            size,
            rkey: vals[2] as u32,
            lid: vals[3] as u16,
            dctn: vals[4] as u32,
            gid_valid: gid_flag == 1,
            gid: vals[6].to_be_bytes(),
        })
    }

    /// Formats the token (same as `to_string()`).
    pub fn format(&self) -> String {
        self.to_string()
    }

    /// The remote buffer the token grants.
    pub fn remote(&self) -> RemoteBuf {
        RemoteBuf {
            addr: self.addr,
            len: self.size as u64,
            rkey: self.rkey,
        }
    }

    /// A token for the sub-range `[offset, offset+len)` with the same key and
    /// endpoint (what the dpu-agent hands each chunk's GET).
    pub fn slice(&self, offset: u64, len: u64) -> Result<RdmaToken, TokenError> {
        // The address comes from the wire: a slice whose address would wrap
        // past u64::MAX is refused, never wrapped (or a debug-build panic).
        match (offset.checked_add(len), self.addr.checked_add(offset)) {
            (Some(end), Some(addr)) if end <= self.size as u64 => Ok(RdmaToken {
                addr,
                size: len as u32,
                ..*self
            }),
            _ => Err(TokenError::Slice {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// The endpoint the token names on the tcp fabric (and the verbs
    /// backend's out-of-band address).
    pub fn endpoint(&self) -> Result<EndpointAddr, TokenError> {
        if !self.gid_valid {
            return Err(TokenError::NoGid);
        }
        let v6 = Ipv6Addr::from(self.gid);
        let ip = match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        };
        Ok(EndpointAddr {
            addr: SocketAddr::new(ip, self.lid),
            responder: self.dctn,
        })
    }

    /// Builds the token for `remote` at `endpoint`.
    pub fn new(endpoint: EndpointAddr, remote: RemoteBuf) -> Result<RdmaToken, TokenError> {
        if endpoint.responder > MAX_DCTN {
            return Err(TokenError::Unrepresentable(format!(
                "responder number {} exceeds 24 bits",
                endpoint.responder
            )));
        }
        let size = u32::try_from(remote.len).map_err(|_| {
            TokenError::Unrepresentable(format!(
                "{} bytes exceed the token's 32-bit size; slice the window",
                remote.len
            ))
        })?;
        if remote.addr.checked_add(remote.len).is_none() {
            return Err(TokenError::AddressWraps {
                addr: remote.addr,
                size,
            });
        }
        let gid = match endpoint.addr.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        if endpoint.addr.ip().is_unspecified() {
            return Err(TokenError::Unrepresentable(
                "the endpoint address is unspecified (0.0.0.0 / ::); advertise a reachable address"
                    .into(),
            ));
        }
        Ok(RdmaToken {
            addr: remote.addr,
            size,
            rkey: remote.rkey,
            lid: endpoint.addr.port(),
            dctn: endpoint.responder,
            gid_valid: true,
            gid: gid.octets(),
        })
    }
}

/// Where remote memory is: address, length and rkey (what a token grants,
/// without the endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteBuf {
    /// First remote address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

/// A sub-range that does not lie inside a [`RemoteBuf`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("remote slice {offset}+{len} is outside the {available} bytes available")]
pub struct OutsideRemote {
    /// Offset asked for.
    pub offset: u64,
    /// Length asked for.
    pub len: u64,
    /// Bytes the buffer has.
    pub available: u64,
}

impl RemoteBuf {
    /// The sub-range `[offset, offset+len)`, with the same rkey.
    pub fn slice(&self, offset: u64, len: u64) -> Result<RemoteBuf, OutsideRemote> {
        // `addr` may come from the wire (a token): refuse a wrapping address.
        match (offset.checked_add(len), self.addr.checked_add(offset)) {
            (Some(end), Some(addr)) if end <= self.len => Ok(RemoteBuf {
                addr,
                len,
                rkey: self.rkey,
            }),
            _ => Err(OutsideRemote {
                offset,
                len,
                available: self.len,
            }),
        }
    }
}

impl fmt::Display for RdmaToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:016x}:{:08x}:{:08x}:{:04x}:{:06x}:{:01x}:{:032x}",
            self.addr,
            self.size,
            self.rkey,
            self.lid,
            self.dctn & MAX_DCTN,
            self.gid_valid as u8,
            u128::from_be_bytes(self.gid)
        )
    }
}

impl FromStr for RdmaToken {
    type Err = TokenError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RdmaToken::parse(s)
    }
}

/// Where a fabric endpoint listens: socket address plus responder number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EndpointAddr {
    /// IP address and TCP port.
    pub addr: SocketAddr,
    /// The responder number (token `dctn`), checked in the handshake.
    pub responder: u32,
}

impl fmt::Display for EndpointAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.addr, self.responder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // The example token of the cuObject format (field values 01 02 03 ...).
    const SPEC_EXAMPLE: &str =
        "0102030405060708:01020304:01020304:0102:010203:1:0102030405060708090a0b0c0d0e0f10";
    // A token naming 192.168.0.1 (IPv4-mapped gid), as used in public test suites.
    const MAPPED_EXAMPLE: &str =
        "0000000000001000:00100000:00000001:0000:000001:1:00000000000000000000ffffc0a80001";

    #[test]
    fn spec_examples() {
        let t = RdmaToken::parse(SPEC_EXAMPLE).unwrap();
        assert_eq!(t.addr, 0x0102030405060708);
        assert_eq!(t.size, 0x01020304);
        assert_eq!(t.rkey, 0x01020304);
        assert_eq!(t.lid, 0x0102);
        assert_eq!(t.dctn, 0x010203);
        assert!(t.gid_valid);
        assert_eq!(
            t.gid,
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
        );
        assert_eq!(t.to_string(), SPEC_EXAMPLE);
        assert_eq!(SPEC_EXAMPLE.len(), TOKEN_LEN);

        let t = RdmaToken::parse(MAPPED_EXAMPLE).unwrap();
        assert_eq!(t.addr, 0x1000);
        assert_eq!(t.size, 1 << 20);
        assert_eq!(t.rkey, 1);
        let ep = t.endpoint().unwrap();
        assert_eq!(ep.addr, "192.168.0.1:0".parse().unwrap());
        assert_eq!(ep.responder, 1);
        assert_eq!(t.format(), MAPPED_EXAMPLE);
    }

    #[test]
    fn strictness() {
        let upper = SPEC_EXAMPLE.replace("0a0b", "0A0B");
        assert!(matches!(
            RdmaToken::parse(&upper),
            Err(TokenError::NotHex {
                field: "gid",
                found: 'A'
            })
        ));
        assert_eq!(RdmaToken::parse(""), Err(TokenError::Length(0)));
        assert_eq!(
            RdmaToken::parse(&SPEC_EXAMPLE[1..]),
            Err(TokenError::FieldWidth {
                field: "addr",
                expected: 16,
                got: 15
            })
        );
        let extra = format!("{SPEC_EXAMPLE}:00");
        assert_eq!(RdmaToken::parse(&extra), Err(TokenError::Length(84)));
        let swapped = SPEC_EXAMPLE.replacen(':', "-", 1);
        assert!(RdmaToken::parse(&swapped).is_err());
        let flag2 = SPEC_EXAMPLE.replace(":1:", ":2:");
        assert_eq!(RdmaToken::parse(&flag2), Err(TokenError::GidFlag(2)));
        let spaced = format!(" {}", &SPEC_EXAMPLE[1..]);
        assert!(matches!(
            RdmaToken::parse(&spaced),
            Err(TokenError::NotHex { field: "addr", .. })
        ));
        let plus = SPEC_EXAMPLE.replacen("0102:", "+102:", 1);
        assert!(matches!(
            RdmaToken::parse(&plus),
            Err(TokenError::NotHex { field: "lid", .. })
        ));
        // Non-ASCII of the same byte length must not panic.
        let weird = SPEC_EXAMPLE.replacen("01", "é", 1);
        assert!(RdmaToken::parse(&weird).is_err());
        let no_gid = SPEC_EXAMPLE.replace(":1:", ":0:");
        assert_eq!(
            RdmaToken::parse(&no_gid).unwrap().endpoint(),
            Err(TokenError::NoGid)
        );
        // The error message names the format.
        assert!(TokenError::Length(3).to_string().contains("addr(16)"));
    }

    #[test]
    fn endpoint_mapping() {
        let ep = EndpointAddr {
            addr: "10.1.2.3:7000".parse().unwrap(),
            responder: 5,
        };
        let rb = RemoteBuf {
            addr: 0x7f00_0000_1000,
            len: 4096,
            rkey: 0xdeadbeef,
        };
        let t = RdmaToken::new(ep, rb).unwrap();
        assert_eq!(
            t.to_string(),
            "00007f0000001000:00001000:deadbeef:1b58:000005:1:00000000000000000000ffff0a010203"
        );
        assert_eq!(t.endpoint().unwrap(), ep);
        assert_eq!(t.remote(), rb);
        let v6 = EndpointAddr {
            addr: "[fd00::1]:9".parse().unwrap(),
            responder: 0,
        };
        assert_eq!(RdmaToken::new(v6, rb).unwrap().endpoint().unwrap(), v6);
        let unspecified = EndpointAddr {
            addr: "0.0.0.0:1".parse().unwrap(),
            responder: 0,
        };
        assert!(RdmaToken::new(unspecified, rb).is_err());
        let big = RemoteBuf { len: 1 << 32, ..rb };
        assert!(RdmaToken::new(ep, big).is_err());
        let wide = EndpointAddr {
            responder: 1 << 24,
            ..ep
        };
        assert!(RdmaToken::new(wide, rb).is_err());
        let s = t.slice(1024, 2048).unwrap();
        assert_eq!((s.addr, s.size, s.rkey), (rb.addr + 1024, 2048, rb.rkey));
        assert!(t.slice(4000, 97).is_err());
        assert!(t.slice(u64::MAX, 2).is_err());
    }

    #[test]
    fn slicing_a_token_whose_address_would_wrap_is_an_error_not_a_panic() {
        // addr and size come from an untrusted header: addr + offset must not
        // overflow (a panic in debug builds, a wrapped address in release).
        let wrapping =
            "ffffffffffffff00:00001000:00000001:0050:000001:1:00000000000000000000ffff7f000001";
        // Such a token is refused as soon as it is parsed...
        assert_eq!(
            RdmaToken::parse(wrapping),
            Err(TokenError::AddressWraps {
                addr: 0xffff_ffff_ffff_ff00,
                size: 0x1000
            })
        );
        // (Its exclusive end must be an address too: 0xff bytes is the most.)
        let top =
            "ffffffffffffff00:000000ff:00000001:0050:000001:1:00000000000000000000ffff7f000001";
        assert_eq!(RdmaToken::parse(top).unwrap().size, 0xff);
        assert!(RdmaToken::parse(&top.replace(":000000ff:", ":00000100:")).is_err());
        // ...and slicing one built in memory is still checked.
        let t = RdmaToken {
            size: 0x1000,
            ..RdmaToken::parse(top).unwrap()
        };
        assert!(matches!(t.slice(0x100, 1), Err(TokenError::Slice { .. })));
        assert!(t.remote().slice(0x100, 1).is_err());
        let s = t.slice(0xff, 1).unwrap();
        assert_eq!((s.addr, s.size), (u64::MAX, 1));
        assert_eq!(t.remote().slice(0xff, 1).unwrap().addr, u64::MAX);
    }

    proptest! {
        #[test]
        fn roundtrip(addr: u64, size: u32, rkey: u32, lid: u16, dctn in 0u32..=MAX_DCTN, gid_valid: bool, gid: [u8; 16]) {
            prop_assume!(addr.checked_add(u64::from(size)).is_some());
            let t = RdmaToken { addr, size, rkey, lid, dctn, gid_valid, gid };
            let s = t.to_string();
            prop_assert_eq!(s.len(), TOKEN_LEN);
            prop_assert_eq!(RdmaToken::parse(&s).unwrap(), t);
        }

        #[test]
        fn endpoint_roundtrip(ip: std::net::Ipv4Addr, port: u16, responder in 0u32..=MAX_DCTN, addr: u64, len: u32, rkey: u32) {
            prop_assume!(!ip.is_unspecified());
            prop_assume!(addr.checked_add(u64::from(len)).is_some());
            let ep = EndpointAddr { addr: SocketAddr::new(IpAddr::V4(ip), port), responder };
            let rb = RemoteBuf { addr, len: len as u64, rkey };
            let t = RdmaToken::parse(&RdmaToken::new(ep, rb).unwrap().to_string()).unwrap();
            prop_assert_eq!(t.endpoint().unwrap(), ep);
            prop_assert_eq!(t.remote(), rb);
        }

        #[test]
        fn parse_never_panics(s in ".{0,100}") {
            let _ = RdmaToken::parse(&s);
        }

        #[test]
        fn one_bad_char_is_rejected(pos in 0usize..TOKEN_LEN, c in "[^0-9a-f:]") {
            let mut chars: Vec<char> = SPEC_EXAMPLE.chars().collect();
            let c = c.chars().next().unwrap();
            chars[pos] = c;
            let s: String = chars.into_iter().collect();
            prop_assert!(RdmaToken::parse(&s).is_err());
        }
    }
}
