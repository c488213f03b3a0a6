//! The two backends, and the hook through which a backend takes part in
//! registration: the software (`tcp`) backend checks remote keys itself in
//! the domain's key table, while a hardware backend (verbs) also registers
//! the memory with the NIC and hands out the NIC's keys.

use std::any::Any;
use std::fmt;

use crate::access::Access;
use crate::error::{FabricError, Result};
use crate::memory::Memory;

/// Which transport a domain uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Software RDMA over authenticated TCP; works everywhere.
    #[default]
    Tcp,
    /// RDMA verbs (RC queue pairs) through rdma-sys; needs an RDMA device.
    Verbs,
}

impl Backend {
    /// The backend's name in configuration files: `tcp` or `verbs`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Backend::Tcp => "tcp",
            Backend::Verbs => "verbs",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Backend {
    type Err = FabricError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tcp" => Ok(Backend::Tcp),
            "verbs" => Ok(Backend::Verbs),
            _ => Err(FabricError::InvalidArgument(format!(
                "unknown fabric backend {s:?} (expected `tcp` or `verbs`)"
            ))),
        }
    }
}

/// A backend that registers memory with hardware. A domain without one
/// (tcp) mints its own keys.
pub(crate) trait Registrar: Send + Sync + fmt::Debug + 'static {
    /// Registers `[offset, offset+len)` of `mem` for `access`; dropping the
    /// registration deregisters it (and returns once the hardware no longer
    /// uses it).
    fn register(
        &self,
        mem: &Memory,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn Registration>>;

    /// For the backend's own connection code, to reach its device state.
    #[cfg_attr(
        not(feature = "verbs"),
        expect(dead_code, reason = "only verbs has a registrar")
    )]
    fn as_any(&self) -> &dyn Any;
}

/// One registration with hardware: its keys. The hardware enforces bounds
/// and access, but knows nothing of window expiry (the domain deregisters
/// an expired window on a timer).
pub(crate) trait Registration: Send + Sync {
    /// The remote key the hardware honours.
    fn rkey(&self) -> u32;
    /// The local key for posting work requests.
    #[cfg_attr(
        not(feature = "verbs"),
        expect(dead_code, reason = "only verbs has a registrar")
    )]
    fn lkey(&self) -> u32;
}

/// What opening a verbs domain (or using one) says in a build without the
/// `verbs` cargo feature.
#[cfg(not(feature = "verbs"))]
pub(crate) fn verbs_not_built() -> FabricError {
    FabricError::Unavailable {
        reason: "this build has no verbs backend (cargo feature `verbs` of the fabric crate)"
            .into(),
    }
}
