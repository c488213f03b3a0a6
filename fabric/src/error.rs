//! Error and completion-status types shared by every backend.

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
    pub(crate) fn wire_code(self) -> u8 {
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
    pub(crate) fn from_wire_code(code: u8) -> Option<OpStatus> {
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

/// A failed one-sided operation: its verbs-like status and what was going on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op} of {len} bytes at remote {remote_addr:#x} (rkey {rkey:#010x}) failed: {status}")]
pub struct OpError {
    /// The verbs-like completion status.
    pub status: OpStatus,
    /// `"write"` or `"read"`.
    pub op: &'static str,
    /// Remote address of the operation.
    pub remote_addr: u64,
    /// Remote key of the operation.
    pub rkey: u32,
    /// Length of the operation in bytes.
    pub len: u64,
}

/// Errors of the fabric API (everything except an operation's completion status).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// The requested backend cannot run on this machine (e.g. no RDMA device,
    /// or a kernel without RDMA support). Callers fall back to [`crate::Backend::Tcp`].
    #[error("RDMA backend unavailable: {reason} (fall back to the tcp backend)")]
    Unavailable {
        /// Why the backend is unavailable.
        reason: String,
    },
    /// A caller passed something that cannot work (bad offset, length, access...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Allocating, mapping or registering memory failed.
    #[error("memory: {what}: {source}")]
    Memory {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A network or system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The peer refused us, or we refused the peer, during the handshake
    /// (wrong fabric key, wrong responder number, unsupported protocol version).
    #[error("handshake with {peer} failed: {reason}")]
    Handshake {
        /// The peer's address.
        peer: String,
        /// What went wrong.
        reason: String,
    },
    /// The peer sent bytes that are not a valid fabric frame.
    #[error("protocol violation by {peer}: {source}")]
    Protocol {
        /// The peer's address.
        peer: String,
        /// The decoding error.
        #[source]
        source: crate::tcp::frame::FrameError,
    },
    /// A CUDA driver call failed or CUDA is not available.
    #[error("CUDA: {0}")]
    Cuda(String),
    /// A verbs call failed.
    #[error("verbs: {what}: {source}")]
    Verbs {
        /// The verbs call and its context.
        what: String,
        /// The OS error (verbs calls report through errno).
        #[source]
        source: std::io::Error,
    },
    /// An `x-amz-rdma-token` could not be parsed or built.
    #[error(transparent)]
    Token(#[from] crate::token::TokenError),
    /// A one-sided operation failed.
    #[error(transparent)]
    Op(#[from] OpError),
    /// The object belongs to another backend or domain than the one it is used with.
    #[error("backend mismatch: {0}")]
    BackendMismatch(String),
}

impl FabricError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        FabricError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Result alias for the fabric API.
pub type Result<T, E = FabricError> = std::result::Result<T, E>;
