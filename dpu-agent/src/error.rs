//! The one error type of a tenant request, and its mapping to gRPC.
//!
//! Every failure a shim sees is a gRPC status whose `google.rpc.ErrorInfo`
//! detail carries the S3 error code (`reason`), the message and the agent's
//! request id, so clients can branch on `NoSuchKey` or `SlowDown` without
//! parsing text. Messages never contain secrets: they are built from codes,
//! names and sizes only.

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

use crate::plan::PlanError;

/// The `ErrorInfo.domain` of every agent error.
pub const ERROR_DOMAIN: &str = "s3dma.agent";

/// An S3 error answered by a target: its code, message and request id, and
/// the HTTP status it came with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (storage target, HTTP {http_status})")]
pub struct S3Error {
    /// S3 error code, e.g. `NoSuchKey`.
    pub code: String,
    /// The target's message.
    pub message: String,
    /// The target's request id (`x-amz-request-id`), empty when absent.
    pub request_id: String,
    /// HTTP status of the reply.
    pub http_status: u16,
}

/// The error an [`AgentError`] came from, shared ([`AgentError`] is `Clone`).
pub type Source = Arc<dyn std::error::Error + Send + Sync>;

/// Why a tenant request failed. Failures that come from another error
/// (a transport, the fabric, a staging buffer) keep it as their
/// [`std::error::Error::source`]; the tenant's message
/// ([`AgentError::to_status`]) spells out the whole chain.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentError {
    /// The target answered with an S3 error.
    #[error(transparent)]
    S3(#[from] S3Error),
    /// The shim may not act for this tenant, or the tenant's policy denies
    /// the bucket/key.
    #[error("{0}")]
    AccessDenied(String),
    /// The tenant's quota is exhausted (too many queued requests).
    #[error("{0}")]
    SlowDown(String),
    /// A malformed request (missing field, bad token, bad name).
    #[error("{0}")]
    InvalidArgument(String),
    /// The range cannot be satisfied.
    #[error("{0}")]
    InvalidRange(String),
    /// The destination window is smaller than the bytes to place.
    #[error("{0}")]
    DestinationTooSmall(String),
    /// The object changed during a chunked transfer, or `if_match` failed.
    #[error("{0}")]
    PreconditionFailed(String),
    /// No target serves the bucket.
    #[error("no storage target is configured for bucket {0:?}")]
    NoTarget(String),
    /// The target could not be reached or kept failing (after retries).
    #[error("{message}")]
    Unavailable {
        /// What failed.
        message: String,
        /// The error it failed with, when there is one.
        #[source]
        source: Option<Source>,
    },
    /// The request's deadline passed.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// Moving bytes between the agent and the tenant's window failed.
    #[error("{message}")]
    Fabric {
        /// What failed.
        message: String,
        /// The fabric's error.
        #[source]
        source: Option<Source>,
    },
    /// The target broke the protocol (e.g. placed other bytes than asked).
    #[error("{0}")]
    Protocol(String),
    /// A bug or resource failure inside the agent.
    #[error("{message}")]
    Internal {
        /// What failed.
        message: String,
        /// The error it failed with, when there is one.
        #[source]
        source: Option<Source>,
    },
}

impl From<PlanError> for AgentError {
    fn from(e: PlanError) -> Self {
        match e {
            PlanError::InvalidRange(_) => AgentError::InvalidRange(e.to_string()),
            PlanError::DestinationTooSmall { .. } => AgentError::DestinationTooSmall(e.to_string()),
            PlanError::ProbeMismatch { .. } => AgentError::Protocol(e.to_string()),
            PlanError::ObjectTooLarge { .. } => AgentError::InvalidArgument(e.to_string()),
            PlanError::InvalidPolicy(_) => AgentError::internal_from("the transfer policy", e),
        }
    }
}

impl AgentError {
    /// [`AgentError::Unavailable`] without a source.
    #[must_use]
    pub fn unavailable(message: impl Into<String>) -> AgentError {
        AgentError::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// [`AgentError::Unavailable`] caused by `source`.
    #[must_use]
    pub fn unavailable_from(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> AgentError {
        AgentError::Unavailable {
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// [`AgentError::Fabric`] caused by the fabric's `source`.
    #[must_use]
    pub fn fabric(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> AgentError {
        AgentError::Fabric {
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// [`AgentError::Internal`] without a source.
    #[must_use]
    pub fn internal(message: impl Into<String>) -> AgentError {
        AgentError::Internal {
            message: message.into(),
            source: None,
        }
    }

    /// [`AgentError::Internal`] caused by `source`.
    #[must_use]
    pub fn internal_from(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> AgentError {
        AgentError::Internal {
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// The message and every source below it, `: `-separated: what the
    /// tenant reads.
    #[must_use]
    pub fn report(&self) -> String {
        let mut out = self.to_string();
        let mut src = std::error::Error::source(self);
        while let Some(s) = src {
            out.push_str(": ");
            out.push_str(&s.to_string());
            src = s.source();
        }
        out
    }

    /// The S3 error code reported in `ErrorInfo.reason`.
    #[must_use]
    pub fn s3_code(&self) -> &str {
        match self {
            AgentError::S3(e) => &e.code,
            AgentError::AccessDenied(_) => "AccessDenied",
            AgentError::SlowDown(_) => "SlowDown",
            AgentError::InvalidArgument(_) => "InvalidArgument",
            AgentError::InvalidRange(_) => "InvalidRange",
            AgentError::DestinationTooSmall(_) => "DestinationTooSmall",
            AgentError::PreconditionFailed(_) => "PreconditionFailed",
            AgentError::NoTarget(_) => "NoSuchBucket",
            AgentError::Unavailable { .. } => "ServiceUnavailable",
            AgentError::DeadlineExceeded(_) => "RequestTimeout",
            AgentError::Fabric { .. } => "RDMATransferFailed",
            AgentError::Protocol(_) => "InvalidTargetReply",
            AgentError::Internal { .. } => "InternalError",
        }
    }

    /// The gRPC code.
    #[must_use]
    pub fn grpc_code(&self) -> Code {
        match self {
            AgentError::S3(e) => s3_grpc_code(&e.code, e.http_status),
            AgentError::AccessDenied(_) => Code::PermissionDenied,
            AgentError::SlowDown(_) => Code::ResourceExhausted,
            AgentError::InvalidArgument(_) | AgentError::DestinationTooSmall(_) => {
                Code::InvalidArgument
            }
            AgentError::InvalidRange(_) => Code::OutOfRange,
            AgentError::PreconditionFailed(_) => Code::FailedPrecondition,
            AgentError::NoTarget(_) => Code::NotFound,
            AgentError::Unavailable { .. } => Code::Unavailable,
            AgentError::DeadlineExceeded(_) => Code::DeadlineExceeded,
            AgentError::Fabric { .. } | AgentError::Protocol(_) | AgentError::Internal { .. } => {
                Code::Internal
            }
        }
    }

    /// A short label for metrics (`status` label).
    #[must_use]
    pub fn metric_label(&self) -> &'static str {
        match self.grpc_code() {
            Code::NotFound => "not_found",
            Code::PermissionDenied => "denied",
            Code::ResourceExhausted => "slow_down",
            Code::InvalidArgument | Code::OutOfRange => "invalid",
            Code::FailedPrecondition => "precondition",
            Code::Unavailable => "unavailable",
            Code::DeadlineExceeded => "deadline",
            _ => "error",
        }
    }

    /// The gRPC status for this error, with `ErrorInfo` details.
    #[must_use]
    pub fn to_status(&self, request_id: &str) -> Status {
        let mut meta = HashMap::new();
        meta.insert("message".to_owned(), self.report());
        meta.insert("request_id".to_owned(), request_id.to_owned());
        if let AgentError::S3(e) = self {
            meta.insert("http_status".to_owned(), e.http_status.to_string());
            if !e.request_id.is_empty() {
                meta.insert("target_request_id".to_owned(), e.request_id.clone());
            }
        }
        let details = ErrorDetails::with_error_info(self.s3_code(), ERROR_DOMAIN, meta);
        let mut status = Status::with_error_details(
            self.grpc_code(),
            format!("{}: {}", self.s3_code(), self.report()),
            details,
        );
        if let Ok(v) = request_id.parse() {
            status.metadata_mut().insert("x-request-id", v);
        }
        status
    }
}

/// gRPC code for an S3 error code (falling back on the HTTP status).
fn s3_grpc_code(code: &str, http_status: u16) -> Code {
    match code {
        "NoSuchKey" | "NoSuchBucket" | "NoSuchUpload" => Code::NotFound,
        "AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch" => Code::PermissionDenied,
        "PreconditionFailed" => Code::FailedPrecondition,
        "InvalidRange" => Code::OutOfRange,
        // A target out of space: "the entire file system is out of space"
        // is what gRPC's RESOURCE_EXHAUSTED says.
        "SlowDown" | "InsufficientStorage" => Code::ResourceExhausted,
        "NotImplemented" => Code::Unimplemented,
        _ => match http_status {
            400 | 411 | 413 => Code::InvalidArgument,
            401 | 403 => Code::PermissionDenied,
            404 => Code::NotFound,
            409 | 412 => Code::FailedPrecondition,
            416 => Code::OutOfRange,
            429 | 507 => Code::ResourceExhausted,
            501 => Code::Unimplemented,
            500..=599 => Code::Unavailable,
            _ => Code::Internal,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_codes_map_to_grpc() {
        let cases = [
            ("NoSuchKey", 404, Code::NotFound),
            ("AccessDenied", 403, Code::PermissionDenied),
            ("PreconditionFailed", 412, Code::FailedPrecondition),
            ("InvalidRange", 416, Code::OutOfRange),
            ("SlowDown", 503, Code::ResourceExhausted),
            ("InternalError", 500, Code::Unavailable),
            ("InsufficientStorage", 507, Code::ResourceExhausted),
            ("XMinioStorageFull", 507, Code::ResourceExhausted),
            ("Whatever", 400, Code::InvalidArgument),
            ("Whatever", 302, Code::Internal),
        ];
        for (code, http, want) in cases {
            let e = AgentError::S3(S3Error {
                code: code.into(),
                message: "m".into(),
                request_id: String::new(),
                http_status: http,
            });
            assert_eq!(e.grpc_code(), want, "{code} {http}");
            assert_eq!(e.s3_code(), code);
        }
    }

    #[test]
    fn status_carries_error_info() {
        let st = AgentError::SlowDown("tenant alice: 256 requests queued".into()).to_status("RID1");
        assert_eq!(st.code(), Code::ResourceExhausted);
        let info = st.get_details_error_info().expect("error info");
        assert_eq!(info.reason, "SlowDown");
        assert_eq!(info.domain, ERROR_DOMAIN);
        assert_eq!(info.metadata["request_id"], "RID1");
        assert!(info.metadata["message"].contains("queued"));
        assert_eq!(st.metadata().get("x-request-id").unwrap(), "RID1");
    }
}
