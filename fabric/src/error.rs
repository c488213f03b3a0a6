//! Error and completion-status types shared by every backend.

pub(crate) use s3dma_wire::OpStatus;

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
    /// or a kernel without RDMA support). Callers fall back to the tcp backend.
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
        source: s3dma_wire::frame::FrameError,
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
    Token(#[from] s3dma_wire::TokenError),
    /// A one-sided operation failed.
    #[error(transparent)]
    Op(#[from] OpError),
    /// The object belongs to another backend or domain than the one it is used with.
    #[error("backend mismatch: {0}")]
    BackendMismatch(String),
}

impl From<s3dma_wire::handshake::KeyTooShort> for FabricError {
    fn from(e: s3dma_wire::handshake::KeyTooShort) -> Self {
        FabricError::InvalidArgument(e.to_string())
    }
}

impl From<s3dma_wire::token::OutsideRemote> for FabricError {
    fn from(e: s3dma_wire::token::OutsideRemote) -> Self {
        FabricError::InvalidArgument(e.to_string())
    }
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
