//! Errors as S3 answers them: [`store_error`], the one place where a
//! [`StoreError`] becomes an S3 error, request-body errors, refused ACLs.

use s3s::{S3Error, S3ErrorCode, s3_error};
use tracing::{debug, error};

use crate::acl::AclError;
use crate::rdma::RdmaError;
use crate::store::StoreError;

pub(super) fn access_denied() -> S3Error {
    s3_error!(AccessDenied, "Access Denied")
}

/// Maps a refused ACL to the S3 error AWS answers with.
pub(super) fn acl_error(e: AclError) -> S3Error {
    let (code, status) = e.code();
    let code = S3ErrorCode::from_bytes(code.as_bytes())
        .unwrap_or_else(|| S3ErrorCode::Custom(code.into()));
    S3Error::with_message(code, e.to_string())
        .with_status(http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_REQUEST))
}

/// Maps a [`StoreError`] to the S3 error returned to clients.
#[must_use]
pub fn store_error(e: StoreError) -> S3Error {
    use S3ErrorCode as C;
    let msg = e.to_string();
    let code = match &e {
        StoreError::NoSuchBucket => C::NoSuchBucket,
        StoreError::NoSuchKey => C::NoSuchKey,
        StoreError::BucketAlreadyOwnedByYou => C::BucketAlreadyOwnedByYou,
        StoreError::BucketAlreadyExists => C::BucketAlreadyExists,
        StoreError::BucketNotEmpty => C::BucketNotEmpty,
        StoreError::InvalidBucketName => C::InvalidBucketName,
        StoreError::NoSuchUpload => C::NoSuchUpload,
        StoreError::BadDigest | StoreError::ChecksumMismatch(_) => C::BadDigest,
        StoreError::InvalidDigest => C::InvalidDigest,
        StoreError::InvalidPart(_) => C::InvalidPart,
        StoreError::InvalidPartOrder => C::InvalidPartOrder,
        StoreError::EntityTooSmall { .. } => C::EntityTooSmall,
        StoreError::EntityTooLarge => C::EntityTooLarge,
        StoreError::InvalidArgument(_) => C::InvalidArgument,
        StoreError::InvalidRequest(_) => C::InvalidRequest,
        StoreError::IncompleteBody(_) => C::IncompleteBody,
        StoreError::QuotaExceeded(_) => {
            return S3Error::with_message(C::Custom("QuotaExceeded".into()), msg)
                .with_status(http::StatusCode::FORBIDDEN);
        }
        StoreError::Body(inner) => {
            if let Some(r) = inner.downcast_ref::<RdmaError>() {
                return r.to_s3();
            }
            return body_error(inner.as_ref());
        }
        StoreError::Io(io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            ) =>
        {
            // A condition of the server, not a fault of the request: say
            // so (507 Insufficient Storage, RFC 4918) rather than "internal
            // error, try again", which a client would retry in vain. The
            // write's temporary files are gone by now (their guards).
            error!(error = %e, "store out of space");
            return S3Error::with_message(
                C::Custom("InsufficientStorage".into()),
                "The storage target is out of space: its data directory's filesystem is full (or over quota). Nothing was stored; delete objects or add capacity, then retry.",
            )
            .with_status(http::StatusCode::INSUFFICIENT_STORAGE);
        }
        StoreError::Io(_) | StoreError::Corrupt { .. } | StoreError::NotPrivate(_) => {
            error!(error = %e, "store failure");
            return S3Error::with_message(
                C::InternalError,
                "We encountered an internal error. Please try again.",
            );
        }
    };
    S3Error::with_message(code, msg)
}

/// Maps an error from reading the request body. s3s's stream error types are
/// private, so they are recognised by their (stable) display text.
pub(super) fn body_error(e: &(dyn std::error::Error + 'static)) -> S3Error {
    let text = e.to_string();
    debug!(error = %s3dma_service::Escaped(&text), "request body error");
    if let Some(at) = text.find(crate::http::AWS_CHUNK_REFUSED) {
        S3Error::with_message(S3ErrorCode::InvalidRequest, text[at..].to_owned())
    } else if text.contains(crate::http::BODY_IDLE_MESSAGE) {
        s3_error!(
            RequestTimeout,
            "Your socket connection to the server was not read from or written to within the timeout period."
        )
    } else if text.contains("Sha256Mismatch") {
        S3Error::with_message(
            S3ErrorCode::Custom("XAmzContentSHA256Mismatch".into()),
            "The provided 'x-amz-content-sha256' header does not match what was computed.",
        )
        .with_status(http::StatusCode::BAD_REQUEST)
    } else if text.contains("SignatureMismatch") {
        s3_error!(
            SignatureDoesNotMatch,
            "The request signature we calculated does not match the signature you provided (aws-chunked)."
        )
    } else if text.contains("FormatError") {
        s3_error!(InvalidRequest, "Malformed aws-chunked body")
    } else {
        s3_error!(
            IncompleteBody,
            "You did not provide the number of bytes specified by the Content-Length HTTP header."
        )
    }
}

pub(super) trait WithStatus {
    fn with_status(self, s: http::StatusCode) -> Self;
}

impl WithStatus for S3Error {
    fn with_status(mut self, s: http::StatusCode) -> Self {
        self.set_status_code(s);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_mapping() {
        assert_eq!(
            store_error(StoreError::NoSuchKey).code(),
            &S3ErrorCode::NoSuchKey
        );
        assert_eq!(
            store_error(StoreError::ChecksumMismatch("x".into())).code(),
            &S3ErrorCode::BadDigest
        );
        assert_eq!(
            store_error(StoreError::EntityTooSmall { part: 1, size: 1 }).code(),
            &S3ErrorCode::EntityTooSmall
        );
        let e = store_error(StoreError::Io(std::io::Error::other("secret path")));
        assert_eq!(e.code(), &S3ErrorCode::InternalError);
        assert!(!e.message().unwrap_or_default().contains("secret"));
        // ENOSPC and EDQUOT (Linux).
        for errno in [28, 122] {
            let e = store_error(StoreError::Io(std::io::Error::from_raw_os_error(errno)));
            assert_eq!(
                e.code(),
                &S3ErrorCode::Custom("InsufficientStorage".into()),
                "{errno}"
            );
            assert_eq!(
                e.status_code(),
                Some(http::StatusCode::INSUFFICIENT_STORAGE)
            );
            assert!(e.message().unwrap_or_default().contains("out of space"));
        }
    }
}
