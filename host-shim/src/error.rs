//! The shim's own errors, as gRPC statuses with a `google.rpc.ErrorInfo`
//! (domain `s3dma.shim`). The agent's errors pass through untouched.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

/// Why the shim refused or failed a tenant's call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShimError {
    /// The caller's uid/gid is not a tenant here.
    #[error("uid {uid} (gid {gid}) is not a tenant of this host-shim")]
    UnknownTenant {
        /// Peer uid.
        uid: u32,
        /// Peer gid.
        gid: u32,
    },
    /// No such buffer for this tenant.
    #[error("no buffer {0} (it was released, its lease closed, or it belongs to nobody you know)")]
    NoSuchBuffer(u64),
    /// No such lease (or fd handle) for this tenant.
    #[error("{0}")]
    NoSuchLease(String),
    /// The tenant's buffer limits.
    #[error("{0}")]
    BufferLimit(String),
    /// Too many requests in the shim at once.
    #[error("{0}")]
    TooManyRequests(String),
    /// The memory passed cannot be used.
    #[error("{0}")]
    BadBuffer(String),
    /// A slice outside its buffer.
    #[error("{0}")]
    OutOfBounds(String),
    /// A malformed request.
    #[error("{0}")]
    InvalidArgument(String),
    /// A feature this build or backend lacks.
    #[error("{0}")]
    Unsupported(String),
    /// The dpu-agent cannot be reached.
    #[error("{0}")]
    AgentUnavailable(String),
    /// A bug or an unexpected local failure.
    #[error("{0}")]
    Internal(String),
}

impl ShimError {
    /// The `ErrorInfo.reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            ShimError::UnknownTenant { .. } => "UnknownTenant",
            ShimError::NoSuchBuffer(_) => "NoSuchBuffer",
            ShimError::NoSuchLease(_) => "NoSuchLease",
            ShimError::BufferLimit(_) | ShimError::TooManyRequests(_) => "BufferLimit",
            ShimError::BadBuffer(_) => "BadBuffer",
            ShimError::OutOfBounds(_) => "OutOfBounds",
            ShimError::InvalidArgument(_) => "InvalidArgument",
            ShimError::Unsupported(_) => "Unsupported",
            ShimError::AgentUnavailable(_) => "AgentUnavailable",
            ShimError::Internal(_) => "Internal",
        }
    }

    /// The gRPC code.
    pub fn code(&self) -> Code {
        match self {
            ShimError::UnknownTenant { .. } => Code::PermissionDenied,
            ShimError::NoSuchBuffer(_) | ShimError::NoSuchLease(_) => Code::NotFound,
            ShimError::BufferLimit(_) | ShimError::TooManyRequests(_) => Code::ResourceExhausted,
            ShimError::BadBuffer(_) | ShimError::OutOfBounds(_) | ShimError::InvalidArgument(_) => {
                Code::InvalidArgument
            }
            ShimError::Unsupported(_) => Code::Unimplemented,
            ShimError::AgentUnavailable(_) => Code::Unavailable,
            ShimError::Internal(_) => Code::Internal,
        }
    }

    /// The status a tenant sees, with its request id.
    pub fn into_status(self, request_id: &str) -> Status {
        let message = self.to_string();
        let mut meta = std::collections::HashMap::new();
        meta.insert("message".to_string(), message.clone());
        if !request_id.is_empty() {
            meta.insert("request_id".to_string(), request_id.to_string());
        }
        Status::with_error_details(
            self.code(),
            message,
            ErrorDetails::with_error_info(self.reason(), s3dma_proto::SHIM_ERROR_DOMAIN, meta),
        )
    }
}

impl From<ShimError> for Status {
    fn from(e: ShimError) -> Status {
        e.into_status("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_carry_reason_domain_and_request_id() {
        let s = ShimError::NoSuchBuffer(42).into_status("req-1");
        assert_eq!(s.code(), Code::NotFound);
        let info = s.get_details_error_info().unwrap();
        assert_eq!(info.reason, "NoSuchBuffer");
        assert_eq!(info.domain, "s3dma.shim");
        assert_eq!(info.metadata["request_id"], "req-1");
        assert!(s.message().contains("no buffer 42"));
        let s: Status = ShimError::UnknownTenant { uid: 7, gid: 8 }.into();
        assert_eq!(s.code(), Code::PermissionDenied);
        assert!(s.message().contains("uid 7"));
    }
}
