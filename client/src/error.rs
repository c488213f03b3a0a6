//! The client's one error type, classified from the shim's gRPC statuses.

use std::fmt;
use std::path::Path;

use s3dma_proto::{AGENT_ERROR_DOMAIN, SHIM_ERROR_DOMAIN};
use s3dma_wire::range::ParseRangeError;
use tonic::Code;
use tonic_types::StatusExt;

/// What kind of failure an [`Error`] is, for callers that branch on it.
///
/// The precise cause is in [`Error::code`] (an S3 error code such as
/// `NoSuchKey`, or a host-shim reason such as `NoSuchBuffer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The object, bucket, buffer or lease does not exist (`NoSuchKey`,
    /// `NoSuchBucket`, `NoSuchBuffer`, `NoSuchLease`, gRPC `NOT_FOUND`).
    NotFound,
    /// The caller may not do this (`AccessDenied`, `UnknownTenant`, gRPC
    /// `PERMISSION_DENIED` / `UNAUTHENTICATED`).
    AccessDenied,
    /// An `If-Match` condition failed: the object changed (`PreconditionFailed`).
    PreconditionFailed,
    /// The byte range cannot be satisfied (`InvalidRange`, gRPC `OUT_OF_RANGE`).
    InvalidRange,
    /// The request itself is wrong: a zero-length buffer, a slice outside its
    /// buffer, a destination too small (`DestinationTooSmall`, `OutOfBounds`,
    /// `BadBuffer`, `Unsupported`, gRPC `INVALID_ARGUMENT`).
    InvalidArgument,
    /// A quota or limit was hit; retry later (`SlowDown`, `BufferLimit`,
    /// gRPC `RESOURCE_EXHAUSTED`).
    SlowDown,
    /// The host-shim (its socket) or the dpu-agent behind it cannot be
    /// reached (`AgentUnavailable`, gRPC `UNAVAILABLE`).
    Unavailable,
    /// The call's deadline passed (see [`crate::Client::with_timeout`]).
    DeadlineExceeded,
    /// The socket is served by a process of a uid that is neither root nor
    /// the expected one (the caller's own, `$S3DMA_SHIM_UID` or
    /// [`crate::ClientOptions::shim_uid`]): not the shim, maybe another
    /// user's fake. Nothing was sent to it (code `UntrustedShim`).
    UntrustedShim,
    /// Anything else (internal errors, protocol violations).
    Other,
}

/// An error from the host-shim, the dpu-agent or S3 behind them, or from
/// talking to the shim's socket.
///
/// Displayed as `<code>: <message> (request id <id>)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The classification.
    pub kind: ErrorKind,
    /// The S3 error code (`NoSuchKey`), the shim's reason (`NoSuchBuffer`),
    /// a client-side code (`ShimUnavailable`, `InvalidArgument`), or empty.
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
    /// The dpu-agent's request id, when the request reached it.
    pub request_id: Option<String>,
    /// The gRPC status code (`Code::Unavailable` etc. for client-side errors).
    pub grpc_code: Code,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.code.is_empty() {
            f.write_str(&self.message)?;
        } else {
            write!(f, "{}: {}", self.code, self.message)?;
        }
        if let Some(id) = &self.request_id {
            write!(f, " (request id {id})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

impl Error {
    /// An error made on the client side.
    pub fn new(kind: ErrorKind, code: impl Into<String>, message: impl Into<String>) -> Error {
        let grpc_code = match kind {
            ErrorKind::NotFound => Code::NotFound,
            ErrorKind::AccessDenied => Code::PermissionDenied,
            ErrorKind::PreconditionFailed => Code::FailedPrecondition,
            ErrorKind::InvalidRange => Code::OutOfRange,
            ErrorKind::InvalidArgument => Code::InvalidArgument,
            ErrorKind::SlowDown => Code::ResourceExhausted,
            ErrorKind::Unavailable => Code::Unavailable,
            ErrorKind::DeadlineExceeded => Code::DeadlineExceeded,
            ErrorKind::UntrustedShim => Code::PermissionDenied,
            ErrorKind::Other => Code::Internal,
        };
        Error {
            kind,
            code: code.into(),
            message: message.into(),
            request_id: None,
            grpc_code,
        }
    }

    /// The classification.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The S3 error code or shim reason (may be empty).
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The message, without code or request id.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The dpu-agent's request id, if any.
    pub fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }

    /// The gRPC status code.
    pub fn grpc_code(&self) -> Code {
        self.grpc_code
    }

    /// Whether retrying later may help (`SlowDown`, `Unavailable`,
    /// `DeadlineExceeded`).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::SlowDown | ErrorKind::Unavailable | ErrorKind::DeadlineExceeded
        )
    }

    /// An invalid argument detected before anything was sent.
    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, "InvalidArgument", message)
    }

    /// The shim's socket cannot be used.
    pub(crate) fn shim_unavailable(socket: &Path, what: impl fmt::Display) -> Error {
        Error::new(
            ErrorKind::Unavailable,
            "ShimUnavailable",
            format!("host-shim at {}: {what}", socket.display()),
        )
    }

    /// Classifies a status; a transport failure (no `ErrorInfo`, raised on
    /// this side) becomes [`ErrorKind::Unavailable`] naming `socket`.
    pub(crate) fn from_status_at(status: tonic::Status, socket: &Path) -> Error {
        // The connector refused the server (see `peer`): say so, not
        // "transport error".
        if let Some(e) = Error::find_in_chain(&status) {
            return e;
        }
        let transport = status.get_details_error_info().is_none()
            && (status.code() == Code::Unavailable
                // Raised on this side from a hyper/h2 error (a server's
                // status has no source): "transport error", or "operation
                // was canceled" when the shim died with the call in flight
                // (not the call's own deadline, also CANCELLED here).
                || (matches!(status.code(), Code::Unknown | Code::Cancelled)
                    && status.message() != "Timeout expired"
                    && std::error::Error::source(&status).is_some()));
        if transport {
            let mut e = Error::shim_unavailable(socket, status.message());
            e.grpc_code = status.code();
            return e;
        }
        Error::from(status)
    }

    /// A client [`Error`] somewhere in `err`'s source chain (the connector
    /// returns its errors wrapped in an `io::Error`).
    pub(crate) fn find_in_chain(err: &(dyn std::error::Error + 'static)) -> Option<Error> {
        let mut current = Some(err);
        while let Some(e) = current {
            if let Some(ours) = e.downcast_ref::<Error>() {
                return Some(ours.clone());
            }
            if let Some(ours) = e
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .and_then(|inner| inner.downcast_ref::<Error>())
            {
                return Some(ours.clone());
            }
            current = e.source();
        }
        None
    }

    /// A failed batch item as the agent reports it.
    pub(crate) fn from_item(item: s3dma_proto::agent::v1::ItemError) -> Error {
        let grpc_code = Code::from_i32(item.grpc_code);
        Error {
            kind: classify(&item.s3_code, grpc_code),
            code: item.s3_code,
            message: item.message,
            request_id: non_empty(item.request_id),
            grpc_code,
        }
    }
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Error {
        let grpc_code = status.code();
        match status.get_details_error_info() {
            Some(mut info)
                if info.domain == AGENT_ERROR_DOMAIN || info.domain == SHIM_ERROR_DOMAIN =>
            {
                let message = info
                    .metadata
                    .remove("message")
                    .filter(|m| !m.is_empty())
                    .unwrap_or_else(|| status.message().to_owned());
                // The agent's own messages may repeat the code ("NoSuchKey: ...").
                let message = message
                    .strip_prefix(&format!("{}: ", info.reason))
                    .map(str::to_owned)
                    .unwrap_or(message);
                Error {
                    kind: classify(&info.reason, grpc_code),
                    request_id: info.metadata.remove("request_id").and_then(non_empty),
                    code: info.reason,
                    message,
                    grpc_code,
                }
            }
            // A tonic server ends a call whose `grpc-timeout` passed with
            // CANCELLED "Timeout expired".
            _ if grpc_code == Code::Cancelled && status.message() == "Timeout expired" => Error {
                kind: ErrorKind::DeadlineExceeded,
                code: String::new(),
                message: "the call's deadline passed at the host-shim".to_owned(),
                request_id: None,
                grpc_code,
            },
            _ => Error {
                kind: classify("", grpc_code),
                code: String::new(),
                message: status.message().to_owned(),
                request_id: status
                    .metadata()
                    .get("x-request-id")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
                    .and_then(non_empty),
                grpc_code,
            },
        }
    }
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// The kind for an S3 code / shim reason, else for the gRPC code.
pub(crate) fn classify(reason: &str, code: Code) -> ErrorKind {
    match reason {
        "NoSuchKey" | "NoSuchBucket" | "NoSuchUpload" | "NoSuchBuffer" | "NoSuchLease" => {
            return ErrorKind::NotFound;
        }
        "AccessDenied" | "UnknownTenant" | "InvalidAccessKeyId" | "SignatureDoesNotMatch" => {
            return ErrorKind::AccessDenied;
        }
        "PreconditionFailed" => return ErrorKind::PreconditionFailed,
        "InvalidRange" => return ErrorKind::InvalidRange,
        "SlowDown" | "BufferLimit" => return ErrorKind::SlowDown,
        "AgentUnavailable" | "ServiceUnavailable" => return ErrorKind::Unavailable,
        "RequestTimeout" => return ErrorKind::DeadlineExceeded,
        "DestinationTooSmall" | "OutOfBounds" | "BadBuffer" | "Unsupported" | "InvalidArgument" => {
            return ErrorKind::InvalidArgument;
        }
        _ => {}
    }
    match code {
        Code::NotFound => ErrorKind::NotFound,
        Code::PermissionDenied | Code::Unauthenticated => ErrorKind::AccessDenied,
        Code::FailedPrecondition => ErrorKind::PreconditionFailed,
        Code::OutOfRange => ErrorKind::InvalidRange,
        Code::InvalidArgument => ErrorKind::InvalidArgument,
        Code::ResourceExhausted => ErrorKind::SlowDown,
        Code::Unavailable => ErrorKind::Unavailable,
        Code::DeadlineExceeded => ErrorKind::DeadlineExceeded,
        _ => ErrorKind::Other,
    }
}

impl From<ParseRangeError> for Error {
    fn from(e: ParseRangeError) -> Error {
        Error::new(ErrorKind::InvalidArgument, "InvalidRange", e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tonic::Status;
    use tonic_types::ErrorDetails;

    use super::*;

    fn status(code: Code, domain: &str, reason: &str, meta: &[(&str, &str)]) -> Status {
        let meta: HashMap<String, String> = meta
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Status::with_error_details(
            code,
            format!("{reason}: status text"),
            ErrorDetails::with_error_info(reason, domain, meta),
        )
    }

    #[test]
    fn agent_errors_keep_code_message_and_request_id() {
        let e = Error::from(status(
            Code::NotFound,
            AGENT_ERROR_DOMAIN,
            "NoSuchKey",
            &[
                ("message", "The specified key does not exist."),
                ("request_id", "req-42"),
                ("http_status", "404"),
            ],
        ));
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert_eq!(e.code(), "NoSuchKey");
        assert_eq!(e.message(), "The specified key does not exist.");
        assert_eq!(e.request_id(), Some("req-42"));
        assert_eq!(e.grpc_code(), Code::NotFound);
        assert_eq!(
            e.to_string(),
            "NoSuchKey: The specified key does not exist. (request id req-42)"
        );
    }

    #[test]
    fn reasons_classify_before_grpc_codes() {
        let cases = [
            (
                AGENT_ERROR_DOMAIN,
                "AccessDenied",
                Code::PermissionDenied,
                ErrorKind::AccessDenied,
            ),
            (
                AGENT_ERROR_DOMAIN,
                "PreconditionFailed",
                Code::FailedPrecondition,
                ErrorKind::PreconditionFailed,
            ),
            (
                AGENT_ERROR_DOMAIN,
                "InvalidRange",
                Code::OutOfRange,
                ErrorKind::InvalidRange,
            ),
            (
                AGENT_ERROR_DOMAIN,
                "SlowDown",
                Code::ResourceExhausted,
                ErrorKind::SlowDown,
            ),
            (
                AGENT_ERROR_DOMAIN,
                "DestinationTooSmall",
                Code::InvalidArgument,
                ErrorKind::InvalidArgument,
            ),
            (
                AGENT_ERROR_DOMAIN,
                "ServiceUnavailable",
                Code::Unavailable,
                ErrorKind::Unavailable,
            ),
            (
                AGENT_ERROR_DOMAIN,
                "RequestTimeout",
                Code::DeadlineExceeded,
                ErrorKind::DeadlineExceeded,
            ),
            (
                AGENT_ERROR_DOMAIN,
                "InternalError",
                Code::Internal,
                ErrorKind::Other,
            ),
            (
                AGENT_ERROR_DOMAIN,
                "SomethingNew",
                Code::NotFound,
                ErrorKind::NotFound,
            ),
            (
                SHIM_ERROR_DOMAIN,
                "UnknownTenant",
                Code::PermissionDenied,
                ErrorKind::AccessDenied,
            ),
            (
                SHIM_ERROR_DOMAIN,
                "NoSuchBuffer",
                Code::NotFound,
                ErrorKind::NotFound,
            ),
            (
                SHIM_ERROR_DOMAIN,
                "NoSuchLease",
                Code::NotFound,
                ErrorKind::NotFound,
            ),
            (
                SHIM_ERROR_DOMAIN,
                "BufferLimit",
                Code::ResourceExhausted,
                ErrorKind::SlowDown,
            ),
            (
                SHIM_ERROR_DOMAIN,
                "BadBuffer",
                Code::InvalidArgument,
                ErrorKind::InvalidArgument,
            ),
            (
                SHIM_ERROR_DOMAIN,
                "OutOfBounds",
                Code::InvalidArgument,
                ErrorKind::InvalidArgument,
            ),
            (
                SHIM_ERROR_DOMAIN,
                "Unsupported",
                Code::Unimplemented,
                ErrorKind::InvalidArgument,
            ),
            (
                SHIM_ERROR_DOMAIN,
                "AgentUnavailable",
                Code::Unavailable,
                ErrorKind::Unavailable,
            ),
            (
                SHIM_ERROR_DOMAIN,
                "Internal",
                Code::Internal,
                ErrorKind::Other,
            ),
        ];
        for (domain, reason, code, kind) in cases {
            let e = Error::from(status(code, domain, reason, &[]));
            assert_eq!(e.kind(), kind, "{reason}");
            assert_eq!(e.code(), reason);
            // Without a `message` entry, the status text is used, minus the code.
            assert_eq!(e.message(), "status text");
            assert_eq!(e.request_id(), None);
            assert_eq!(e.to_string(), format!("{reason}: status text"));
        }
    }

    #[test]
    fn plain_statuses_classify_by_grpc_code() {
        let cases = [
            (Code::PermissionDenied, ErrorKind::AccessDenied),
            (Code::Unauthenticated, ErrorKind::AccessDenied),
            (Code::ResourceExhausted, ErrorKind::SlowDown),
            (Code::Unavailable, ErrorKind::Unavailable),
            (Code::DeadlineExceeded, ErrorKind::DeadlineExceeded),
            (Code::InvalidArgument, ErrorKind::InvalidArgument),
            (Code::Internal, ErrorKind::Other),
            (Code::Unknown, ErrorKind::Other),
        ];
        for (code, kind) in cases {
            let e = Error::from(Status::new(code, "plain"));
            assert_eq!(e.kind(), kind, "{code:?}");
            assert_eq!(e.code(), "");
            assert_eq!(e.to_string(), "plain");
        }
        let e = Error::from(Status::cancelled("Timeout expired"));
        assert_eq!(e.kind(), ErrorKind::DeadlineExceeded);
        assert_eq!(
            Error::from(Status::cancelled("other")).kind(),
            ErrorKind::Other
        );
        // An ErrorInfo of another domain is not trusted for the reason.
        let e = Error::from(status(Code::Internal, "example.com", "NoSuchKey", &[]));
        assert_eq!(e.kind(), ErrorKind::Other);
        assert_eq!(e.code(), "");
    }

    #[test]
    fn transport_failures_name_the_socket() {
        let socket = Path::new("/run/s3dma/shim.sock");
        let e = Error::from_status_at(Status::unavailable("connection refused"), socket);
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.to_string().contains("/run/s3dma/shim.sock"), "{e}");
        assert!(e.is_retryable());
        // The agent being down is reported by the shim, with its reason.
        let e = Error::from_status_at(
            status(
                Code::Unavailable,
                SHIM_ERROR_DOMAIN,
                "AgentUnavailable",
                &[],
            ),
            socket,
        );
        assert_eq!(e.code(), "AgentUnavailable");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        // The shim died with the call in flight: hyper's "operation was
        // canceled", raised on this side (it has a source).
        let mut died = Status::cancelled("operation was canceled");
        died.set_source(std::sync::Arc::new(std::io::Error::other("canceled")));
        let e = Error::from_status_at(died, socket);
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(e.to_string().contains("/run/s3dma/shim.sock"), "{e}");
        // The call's deadline (the server's CANCELLED, or this side's timer,
        // which has a source) is not a transport failure.
        let e = Error::from_status_at(Status::cancelled("Timeout expired"), socket);
        assert_eq!(e.kind(), ErrorKind::DeadlineExceeded, "{e}");
        let mut timer = Status::cancelled("Timeout expired");
        timer.set_source(std::sync::Arc::new(std::io::Error::other("timeout")));
        let e = Error::from_status_at(timer, socket);
        assert_eq!(e.kind(), ErrorKind::DeadlineExceeded, "{e}");
    }

    #[test]
    fn batch_item_errors_classify_like_statuses() {
        let e = Error::from_item(s3dma_proto::agent::v1::ItemError {
            grpc_code: Code::NotFound as i32,
            s3_code: "NoSuchKey".into(),
            message: "gone".into(),
            request_id: "r1".into(),
        });
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert_eq!(e.to_string(), "NoSuchKey: gone (request id r1)");
    }
}
