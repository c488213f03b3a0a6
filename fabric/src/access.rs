//! Access flags of regions and windows.

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

/// Access rights of a region or window, a subset of the verbs access flags.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u8);

impl Access {
    /// No access.
    pub const NONE: Access = Access(0);
    /// The local side may use the memory as the target of a READ (verbs requires
    /// it for REMOTE_WRITE too). Every region is locally readable.
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may RDMA READ from the memory.
    pub const REMOTE_READ: Access = Access(2);
    /// Peers may RDMA WRITE into the memory.
    pub const REMOTE_WRITE: Access = Access(4);
    /// All of the above.
    pub const ALL: Access = Access(7);

    /// The raw bits (1 local-write, 2 remote-read, 4 remote-write).
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Builds flags from raw bits; unknown bits are an error.
    pub fn from_bits(bits: u8) -> Option<Access> {
        (bits & !Self::ALL.0 == 0).then_some(Access(bits))
    }

    /// Whether every flag of `other` is set in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether no flag is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.contains(Access::LOCAL_WRITE) {
            parts.push("local-write");
        }
        if self.contains(Access::REMOTE_READ) {
            parts.push("remote-read");
        }
        if self.contains(Access::REMOTE_WRITE) {
            parts.push("remote-write");
        }
        if parts.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&parts.join("|"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsets() {
        let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
        assert!(rw.contains(Access::REMOTE_READ));
        assert!(!Access::REMOTE_READ.contains(rw));
        assert!(Access::ALL.contains(rw));
        assert_eq!(Access::from_bits(8), None);
        assert_eq!(Access::from_bits(6), Some(rw));
        assert_eq!(rw.to_string(), "remote-read|remote-write");
        assert_eq!(Access::NONE.to_string(), "none");
    }
}
