//! The completion status of a one-sided operation, shared by both backends
//! and carried on the tcp fabric's wire.

use std::fmt;

/// The status an operation completes with when it does not succeed.
///
/// These mirror the verbs work-completion statuses (`enum ibv_wc_status`)
/// that matter to a one-sided RDMA user, so that both backends report the
/// same thing for the same failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OpStatus {
    /// The responder refused access: unknown or revoked rkey, expired window,
    /// missing access right, or an address range outside the key's bounds
    /// (`IBV_WC_REM_ACCESS_ERR`).
    RemoteAccess,
    /// The responder could not make sense of the request, e.g. a length
    /// beyond its maximum message size (`IBV_WC_REM_INV_REQ_ERR`).
    RemoteInvalidRequest,
    /// The responder stopped answering: connection lost or transport retries
    /// exhausted (`IBV_WC_RETRY_EXC_ERR`).
    RetryExceeded,
    /// The operation was never executed because the session had already
    /// failed or was closed (`IBV_WC_WR_FLUSH_ERR`).
    Flushed,
    /// A local protection or length problem (`IBV_WC_LOC_PROT_ERR`,
    /// `IBV_WC_LOC_LEN_ERR`, ...).
    LocalError,
    /// The responder hit an internal error (`IBV_WC_REM_OP_ERR`) or the
    /// verbs provider reported another status.
    RemoteOperation,
}

impl OpStatus {
    /// A one-line description of the status.
    pub fn describe(self) -> &'static str {
        match self {
            OpStatus::RemoteAccess => "remote access error",
            OpStatus::RemoteInvalidRequest => "remote invalid request",
            OpStatus::RetryExceeded => "retry exceeded (peer unreachable or connection lost)",
            OpStatus::Flushed => "flushed (session failed or closed before the operation ran)",
            OpStatus::LocalError => "local protection or length error",
            OpStatus::RemoteOperation => "remote operation error",
        }
    }

    /// The status's code on the tcp wire (0 is success).
    pub fn wire_code(self) -> u8 {
        match self {
            OpStatus::RemoteAccess => 1,
            OpStatus::RemoteInvalidRequest => 2,
            OpStatus::RetryExceeded => 3,
            OpStatus::Flushed => 4,
            OpStatus::LocalError => 5,
            OpStatus::RemoteOperation => 6,
        }
    }

    /// Inverse of [`OpStatus::wire_code`]; `None` for success (0) and unknown codes.
    pub fn from_wire_code(code: u8) -> Option<OpStatus> {
        Some(match code {
            1 => OpStatus::RemoteAccess,
            2 => OpStatus::RemoteInvalidRequest,
            3 => OpStatus::RetryExceeded,
            4 => OpStatus::Flushed,
            5 => OpStatus::LocalError,
            6 => OpStatus::RemoteOperation,
            _ => return None,
        })
    }
}

impl fmt::Display for OpStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}
