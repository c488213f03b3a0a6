//! The one error type of a tenant request, and its mapping to gRPC.
//!
//! Every failure a shim sees is a gRPC status whose `google.rpc.ErrorInfo`
//! detail carries the S3 error code (`reason`), the message and the agent's
//! request id, so clients can branch on `NoSuchKey` or `SlowDown` without
//! parsing text. Messages never contain secrets: they are built from codes,
//! names and sizes only.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

use crate::plan::PlanError;
use crate::quota::QueueFull;

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

/// Why a tenant request failed. Each variant carries the values its
/// message names; failures that come from another error (a transport, the
/// fabric, a staging buffer) keep it as their
/// [`std::error::Error::source`]; the tenant's message
/// ([`AgentError::to_status`]) spells out the whole chain.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentError {
    /// The target answered with an S3 error.
    #[error(transparent)]
    S3(#[from] S3Error),
    /// The shim may not act for this tenant.
    #[error("shim {shim} may not act for tenant {tenant:?}")]
    ShimNotAllowed {
        /// The shim's name.
        shim: String,
        /// The tenant it asked to act for.
        tenant: String,
    },
    /// The tenant's policy denies the operation on the bucket/key.
    #[error("tenant {tenant} may not {verb} s3://{bucket}/{key}")]
    AccessDenied {
        /// The tenant's name.
        tenant: String,
        /// The operation, e.g. `read`, `write`, `list`.
        verb: String,
        /// The bucket.
        bucket: String,
        /// The key (for a listing, the prefix).
        key: String,
    },
    /// The tenant's quota is exhausted (too many queued requests).
    #[error("{0}")]
    SlowDown(QueueFull),
    /// A malformed request (missing field, bad token, bad name).
    #[error("{0}")]
    InvalidArgument(BadRequest),
    /// The transfer cannot be planned: a malformed or unsatisfiable range,
    /// a destination window too small, a probe the target answered
    /// inconsistently, an object too large (never
    /// [`PlanError::InvalidPolicy`], which is [`AgentError::Internal`]).
    #[error("{0}")]
    Plan(PlanError),
    /// The target refused the range as not satisfiable (HTTP 416).
    #[error("the requested range is not satisfiable: {message}")]
    RangeNotSatisfiable {
        /// The target's message.
        message: String,
    },
    /// The object changed during a chunked transfer (`if_match` failed).
    #[error(
        "the object changed during the transfer (its ETag is no longer {etag}); nothing consistent was placed, retry the GET"
    )]
    ObjectChanged {
        /// The ETag the transfer started with.
        etag: String,
    },
    /// No target serves the bucket.
    #[error("no storage target is configured for bucket {bucket:?}")]
    NoTarget {
        /// The bucket.
        bucket: String,
    },
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
    #[error("the request did not finish within {deadline:?} (transfer.request_timeout_secs)")]
    DeadlineExceeded {
        /// The deadline (`transfer.request_timeout_secs`).
        deadline: Duration,
    },
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
    Protocol(BadReply),
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

/// What is wrong with a tenant's request ([`AgentError::InvalidArgument`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    /// A value that cannot be sent as the header `field` (e.g.
    /// `content_type`, `if_match`).
    #[error("{field}: {reason}")]
    Header {
        /// The request field.
        field: &'static str,
        /// Why it cannot be a header value.
        reason: String,
    },
    /// A request that cannot be formed for the target (a range header, a
    /// URL).
    #[error("{reason}")]
    Unsendable {
        /// Why.
        reason: String,
    },
    /// A metadata name that is not a valid header name.
    #[error("metadata name {name:?} is not a valid header name")]
    MetadataName {
        /// The name as given.
        name: String,
    },
    /// A metadata value that is not valid header text.
    #[error("metadata {name:?} has a value that is not valid header text")]
    MetadataValue {
        /// The metadata's name.
        name: String,
    },
    /// The window's token names no fabric endpoint.
    #[error("the window's token names no endpoint: {reason}")]
    TokenWithoutEndpoint {
        /// Why.
        reason: String,
    },
    /// A bucket name outside the accepted characters or length.
    #[error("bucket name {bucket:?} is not valid (1-63 letters, digits, '.', '-', '_')")]
    BucketName {
        /// The name as given.
        bucket: String,
    },
    /// An empty or too long key.
    #[error("object key must be 1-1024 bytes (got {len})")]
    KeyLength {
        /// The key's length in bytes.
        len: usize,
    },
    /// A field that does not parse as an `x-amz-rdma-token`.
    #[error("{field} is not a valid x-amz-rdma-token: {reason}")]
    Token {
        /// The request field.
        field: String,
        /// Why it does not parse.
        reason: String,
    },
    /// A rail token (`destination_rails`, `source_rails`) that does not
    /// fit the request: a size other than rail 0's, an endpoint another
    /// rail names, none at all, or too many rails.
    #[error("{field}: {reason}")]
    Rail {
        /// The request field (e.g. `destination_rails[1]`).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A batch without items.
    #[error("a batch needs at least one item")]
    EmptyBatch,
    /// A batch beyond `transfer.max_batch_items`.
    #[error(
        "a batch takes at most {max} items (transfer.max_batch_items); this one has {items}: split it into several batches"
    )]
    BatchTooLarge {
        /// `transfer.max_batch_items`.
        max: usize,
        /// Items in the batch.
        items: usize,
    },
    /// A batch moving more than `transfer.max_batch_bytes`.
    #[error(
        "a batch moves at most {max} bytes (transfer.max_batch_bytes); this one names {bytes}: split it into several batches"
    )]
    BatchTooManyBytes {
        /// `transfer.max_batch_bytes`.
        max: u64,
        /// Bytes the batch's windows name.
        bytes: u64,
    },
}

/// How a target's reply broke the protocol ([`AgentError::Protocol`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadReply {
    /// A reply body that does not parse (`CreateMultipartUpload`,
    /// `CompleteMultipartUpload`, `ListObjectsV2`).
    #[error("{reply} reply: {reason}")]
    Unparsable {
        /// The operation replied to.
        reply: &'static str,
        /// Why it does not parse.
        reason: String,
    },
    /// `CreateMultipartUpload` without an upload id.
    #[error("CreateMultipartUpload reply has no UploadId")]
    NoUploadId,
    /// `UploadPart` without an ETag.
    #[error("UploadPart {part} reply has no ETag")]
    PartWithoutEtag {
        /// The part number.
        part: u32,
    },
    /// More body bytes than the range holds.
    #[error("the target sent more than the {expected} bytes of the range")]
    TooManyBytes {
        /// The range's length.
        expected: u64,
    },
    /// A `Content-Range` header that does not parse.
    #[error("the target sent a malformed Content-Range {value:?}")]
    BadContentRange {
        /// The header's value.
        value: String,
    },
    /// More bytes than the RDMA slot holds.
    #[error("the target answered {len} bytes for a {slot}-byte slot")]
    SlotOverrun {
        /// Bytes answered.
        len: u64,
        /// The slot's size.
        slot: u32,
    },
    /// A request carrying an RDMA token answered without
    /// `x-amz-rdma-reply`: the server ignored the token, so its reply says
    /// nothing about the tenant's memory (an empty GET body would leave the
    /// window stale). Never taken for a success.
    #[error(
        "the target answered a request carrying x-amz-rdma-token without x-amz-rdma-reply{}: it does not speak s3dma's RDMA exchange (configure it with rdma: false)",
        match .reply { Some(r) => format!(" (x-amz-rdma-reply: {r:?})"), None => String::new() }
    )]
    NoRdmaReply {
        /// The unexpected reply value, if any.
        reply: Option<String>,
    },
    /// An RDMA byte count other than the range's length.
    #[error("the target reported {moved:?} bytes transferred for a {len}-byte range")]
    BytesTransferred {
        /// The reported count (`None`: absent or malformed).
        moved: Option<u64>,
        /// The range's length.
        len: u64,
    },
    /// No ETag, so a chunked GET cannot detect a concurrent overwrite.
    #[error(
        "the target sent no ETag, so a chunked GET cannot guard against a concurrent overwrite"
    )]
    NoEtag,
    /// Other bytes than asked.
    #[error(
        "asked bytes {first}+{len} of {total}, the target answered {got_first}+{got_len} of {got_total}"
    )]
    RangeMismatch {
        /// First byte asked.
        first: u64,
        /// Bytes asked.
        len: u64,
        /// Object size expected.
        total: u64,
        /// First byte answered.
        got_first: u64,
        /// Bytes answered.
        got_len: u64,
        /// Object size answered.
        got_total: u64,
    },
    /// A HEAD reply without `Content-Length`.
    #[error("HEAD reply without Content-Length")]
    NoContentLength,
    /// The object a target holds after it answered a PUT or
    /// CompleteMultipartUpload with success is not the one sent (its size,
    /// or the part count its `-N` ETag names). The call fails: nothing is
    /// reported stored.
    #[error(
        "the target stored {stored} bytes of {sent}{}: {behaviour}; {left}",
        match .etag_parts { Some(n) if *n != u64::from(*.parts) => format!(" (its ETag names {n} parts of the {} sent)", .parts), _ => String::new() }
    )]
    StoredMismatch {
        /// The stored object's size (0 when it is missing).
        stored: u64,
        /// The bytes sent.
        sent: u64,
        /// The part count the stored object's ETag names (`"…-N"`).
        etag_parts: Option<u64>,
        /// The parts sent (0: a single PUT).
        parts: u32,
        /// What the server does, in words.
        behaviour: &'static str,
        /// What became of the wrong object, and what to do.
        left: &'static str,
    },
    /// A hipobj-rc-v2 reply that breaks the dialect (a PREPARE reply
    /// without `x-amz-rdma-reply: 200:<token>`, a final reply with another
    /// cookie or byte count). Never taken for a success.
    #[error("the target's hipobj-rc-v2 {step} reply: {reason}")]
    Hipobj {
        /// PREPARE or READY.
        step: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl From<PlanError> for AgentError {
    fn from(e: PlanError) -> Self {
        match e {
            PlanError::InvalidPolicy(_) => AgentError::internal_from("the transfer policy", e),
            e => AgentError::Plan(e),
        }
    }
}

impl From<QueueFull> for AgentError {
    fn from(e: QueueFull) -> Self {
        AgentError::SlowDown(e)
    }
}

impl From<BadRequest> for AgentError {
    fn from(e: BadRequest) -> Self {
        AgentError::InvalidArgument(e)
    }
}

impl From<BadReply> for AgentError {
    fn from(e: BadReply) -> Self {
        AgentError::Protocol(e)
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
            AgentError::ShimNotAllowed { .. } | AgentError::AccessDenied { .. } => "AccessDenied",
            AgentError::SlowDown(_) => "SlowDown",
            AgentError::InvalidArgument(_) => "InvalidArgument",
            AgentError::Plan(p) => match p {
                PlanError::InvalidRange(_) => "InvalidRange",
                PlanError::DestinationTooSmall { .. } => "DestinationTooSmall",
                PlanError::ProbeMismatch { .. } => "InvalidTargetReply",
                PlanError::ObjectTooLarge { .. } => "InvalidArgument",
                PlanError::InvalidPolicy(_) => "InternalError",
            },
            AgentError::RangeNotSatisfiable { .. } => "InvalidRange",
            AgentError::ObjectChanged { .. } => "PreconditionFailed",
            AgentError::NoTarget { .. } => "NoSuchBucket",
            AgentError::Unavailable { .. } => "ServiceUnavailable",
            AgentError::DeadlineExceeded { .. } => "RequestTimeout",
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
            AgentError::ShimNotAllowed { .. } | AgentError::AccessDenied { .. } => {
                Code::PermissionDenied
            }
            AgentError::SlowDown(_) => Code::ResourceExhausted,
            AgentError::InvalidArgument(_) => Code::InvalidArgument,
            AgentError::Plan(p) => match p {
                PlanError::InvalidRange(_) => Code::OutOfRange,
                PlanError::DestinationTooSmall { .. } | PlanError::ObjectTooLarge { .. } => {
                    Code::InvalidArgument
                }
                PlanError::ProbeMismatch { .. } | PlanError::InvalidPolicy(_) => Code::Internal,
            },
            AgentError::RangeNotSatisfiable { .. } => Code::OutOfRange,
            AgentError::ObjectChanged { .. } => Code::FailedPrecondition,
            AgentError::NoTarget { .. } => Code::NotFound,
            AgentError::Unavailable { .. } => Code::Unavailable,
            AgentError::DeadlineExceeded { .. } => Code::DeadlineExceeded,
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
        let st = AgentError::SlowDown(QueueFull {
            running: 64,
            queued: 256,
        })
        .to_status("RID1");
        assert_eq!(st.code(), Code::ResourceExhausted);
        let info = st.get_details_error_info().expect("error info");
        assert_eq!(info.reason, "SlowDown");
        assert_eq!(info.domain, ERROR_DOMAIN);
        assert_eq!(info.metadata["request_id"], "RID1");
        assert!(info.metadata["message"].contains("queued"));
        assert_eq!(st.metadata().get("x-request-id").unwrap(), "RID1");
    }
}
