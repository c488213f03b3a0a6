//! [`RdmaError`]: why an RDMA request failed, and the S3 error it becomes.
//! A leaf of its own, so that the dialects (which refuse requests with it)
//! and the data path (which runs them) both name it without importing each
//! other.

use std::time::Duration;

use fabric::pool::ConnectError;
use fabric::{EndpointAddr, OpError, OpStatus, TokenError};
use http::StatusCode;
use s3s::{S3Error, S3ErrorCode};
use tracing::warn;

use super::headers::RequestError;

/// Why an RDMA request failed (mapped to S3 errors by [`RdmaError::to_s3`]).
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    /// The token header is not among the signed headers.
    #[error(
        "x-amz-rdma-token must be one of the SigV4 signed headers (SignedHeaders); nothing was transferred"
    )]
    NotSigned,
    /// The token does not parse.
    #[error("The provided RDMA token is invalid: {0}")]
    InvalidToken(#[from] TokenError),
    /// The token names an endpoint outside `rdma.allowed_client_networks`.
    #[error(
        "the fabric endpoint named by x-amz-rdma-token is not on a network this server may connect to (rdma.allowed_client_networks); nothing was transferred"
    )]
    EndpointNotAllowed,
    /// The request does not fit the protocol or the token.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The client's endpoint could not be reached. The reply says only
    /// that (the same words whether the port was closed, timed out, or
    /// answered as something other than a fabric endpoint with our key),
    /// so that it tells nothing about the port; the cause is logged.
    #[error(
        "RDMA data transfer failed: could not connect to the fabric endpoint named by x-amz-rdma-token; nothing was transferred"
    )]
    Connect(#[source] ConnectError),
    /// This user's last connect to the endpoint was refused and it backs
    /// off ([`super::backoff`]): not dialed. The reply is [`RdmaError::Connect`]'s.
    #[error(
        "RDMA data transfer failed: could not connect to the fabric endpoint named by x-amz-rdma-token; nothing was transferred"
    )]
    BackingOff {
        /// The endpoint.
        peer: EndpointAddr,
        /// The time left.
        left: Duration,
    },
    /// An operation failed.
    #[error("RDMA data transfer with {peer} failed: {source}")]
    Op {
        /// The endpoint.
        peer: EndpointAddr,
        /// The operation's error.
        source: OpError,
    },
    /// An operation did not complete within `rdma.progress_timeout_secs`:
    /// the session was failed.
    #[error(
        "RDMA data transfer with {peer} failed: the endpoint completed no operation within {after:?}; the session was closed"
    )]
    Stalled {
        /// The endpoint.
        peer: EndpointAddr,
        /// The progress timeout.
        after: Duration,
    },
    /// A server-side failure (disk, task).
    #[error("{0}")]
    Internal(String),
}

impl RdmaError {
    /// The S3 error returned to the client.
    #[must_use]
    pub fn to_s3(&self) -> S3Error {
        let msg = self.to_string();
        let (code, status) = match self {
            RdmaError::NotSigned | RdmaError::EndpointNotAllowed => {
                (S3ErrorCode::AccessDenied, StatusCode::FORBIDDEN)
            }
            RdmaError::InvalidToken(_)
            | RdmaError::Request(RequestError::DuplicateToken(_) | RequestError::TokenNotAscii) => {
                (
                    S3ErrorCode::Custom("InvalidRDMAToken".into()),
                    StatusCode::BAD_REQUEST,
                )
            }
            RdmaError::Request(_) => (S3ErrorCode::InvalidRequest, StatusCode::BAD_REQUEST),
            RdmaError::Connect(_) | RdmaError::BackingOff { .. } | RdmaError::Stalled { .. } => (
                S3ErrorCode::Custom("RDMATransferFailed".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
            RdmaError::Op { source, .. } => {
                let status = match source.status {
                    OpStatus::RemoteAccess | OpStatus::RemoteInvalidRequest => {
                        StatusCode::BAD_REQUEST
                    }
                    _ => StatusCode::INTERNAL_SERVER_ERROR,
                };
                (S3ErrorCode::Custom("RDMATransferFailed".into()), status)
            }
            RdmaError::Internal(_) => {
                warn!(error = %msg, "RDMA transfer: internal failure");
                return S3Error::with_message(
                    S3ErrorCode::InternalError,
                    "We encountered an internal error. Please try again.",
                );
            }
        };
        let mut e = S3Error::with_message(code, msg);
        e.set_status_code(status);
        e
    }
}
