//! The networks a storage-target may reach over the fabric
//! (`rdma.allowed_client_networks`): an RDMA token names an IP address and
//! port, chosen by whoever signs the request, and the target connects to
//! it. Only addresses inside one of these networks are ever connected to;
//! a token naming another one is refused before any connection is tried.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// One network in CIDR notation: `10.0.0.0/8`, `fd00::/8`, or a single
/// address (`192.0.2.7`, meaning `/32` or `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// Why a network does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a network in CIDR notation (an IP address, optionally followed by /prefix-length, e.g. 10.0.0.0/8 or fd00::/8)"
)]
pub struct CidrError(String);

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || CidrError(s.to_owned());
        let (ip, prefix) = match s.trim().split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = ip.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.len() <= 3 => {
                p.parse::<u8>().map_err(|_| bad())?
            }
            Some(_) => return Err(bad()),
        };
        if prefix > max {
            return Err(bad());
        }
        Ok(Cidr { addr, prefix })
    }
}

impl TryFrom<String> for Cidr {
    type Error = CidrError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Cidr> for String {
    fn from(c: Cidr) -> String {
        c.to_string()
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Cidr {
    /// Whether `ip` is inside this network (an IPv4-mapped IPv6 address
    /// counts as its IPv4 address).
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(a)) => prefix_eq(&net.octets(), &a.octets(), self.prefix),
            (IpAddr::V6(net), IpAddr::V6(a)) => prefix_eq(&net.octets(), &a.octets(), self.prefix),
            _ => false,
        }
    }
}

/// Whether the first `bits` bits of `a` and `b` are equal.
fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let bits = usize::from(bits);
    let full = bits / 8;
    if a[..full] != b[..full] {
        return false;
    }
    let rest = bits % 8;
    if rest == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rest);
    (a[full] & mask) == (b[full] & mask)
}

/// The default of `rdma.allowed_client_networks`: loopback only
/// (`127.0.0.0/8`, `::1/128`), where the local stack (launcher, tests)
/// runs its fabric endpoints. A deployment lists its fabric networks.
#[must_use]
pub fn default_allowed() -> Vec<Cidr> {
    ["127.0.0.0/8", "::1/128"]
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// Whether `ip` is inside one of `networks`. The unspecified address
/// (which a connect reaches as this host) and multicast addresses are
/// never allowed, whatever the list says.
#[must_use]
pub fn allowed(networks: &[Cidr], ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    !ip.is_unspecified() && !ip.is_multicast() && networks.iter().any(|n| n.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parse_and_contain() {
        let n: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(n.contains(ip("10.1.200.3")));
        assert!(!n.contains(ip("10.2.0.1")));
        assert!(n.contains(ip("::ffff:10.1.0.9")));
        assert!(!n.contains(ip("fd00::1")));
        let one: Cidr = "192.0.2.7".parse().unwrap();
        assert_eq!(one.to_string(), "192.0.2.7/32");
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
        let odd: Cidr = "10.0.0.0/13".parse().unwrap();
        assert!(odd.contains(ip("10.7.255.255")) && !odd.contains(ip("10.8.0.0")));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("203.0.113.1")) && !all.contains(ip("::2")));
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0/8",
            "x",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        let e = "nope".parse::<Cidr>().unwrap_err().to_string();
        assert!(e.contains("CIDR"), "{e}");
    }

    #[test]
    fn defaults_are_loopback() {
        let d = default_allowed();
        assert!(allowed(&d, ip("127.0.0.1")));
        assert!(allowed(&d, ip("127.8.0.1")));
        assert!(allowed(&d, ip("::1")));
        assert!(!allowed(&d, ip("10.0.0.1")));
        assert!(!allowed(&d, ip("169.254.169.254")));
        assert!(!allowed(&d, ip("0.0.0.0")));
        let all: Vec<Cidr> = vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()];
        assert!(allowed(&all, ip("10.0.0.1")));
        for never in ["0.0.0.0", "::", "::ffff:0.0.0.0", "224.0.0.1", "ff02::1"] {
            assert!(!allowed(&all, ip(never)), "{never}");
        }
    }

    #[test]
    fn serde_round_trip() {
        let v: Vec<Cidr> = serde_yaml::from_str("[10.0.0.0/8, 'fd00::/8']").unwrap();
        assert_eq!(
            serde_yaml::to_string(&v).unwrap().trim(),
            "- 10.0.0.0/8\n- fd00::/8"
        );
        let e = serde_yaml::from_str::<Vec<Cidr>>("[10.0.0.0/99]").unwrap_err();
        assert!(e.to_string().contains("CIDR"), "{e}");
    }
}
