//! Store errors ([`StoreError`]), mapped to S3 errors in one place
//! (`s3::store_error`).

use std::io::{self};
use std::path::PathBuf;

use super::FormatError;

/// A boxed error from a body stream.
pub type BodyError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Store errors; mapped to S3 error codes in one place (`s3::store_error`).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The bucket does not exist.
    #[error("The specified bucket does not exist")]
    NoSuchBucket,
    /// The key does not exist.
    #[error("The specified key does not exist.")]
    NoSuchKey,
    /// CreateBucket of a bucket the caller already owns.
    #[error("Your previous request to create the named bucket succeeded and you already own it.")]
    BucketAlreadyOwnedByYou,
    /// CreateBucket of a bucket someone else owns.
    #[error("The requested bucket name is not available.")]
    BucketAlreadyExists,
    /// DeleteBucket of a bucket that still holds objects.
    #[error("The bucket you tried to delete is not empty")]
    BucketNotEmpty,
    /// The bucket name breaks the naming rules.
    #[error("The specified bucket is not valid.")]
    InvalidBucketName,
    /// The multipart upload does not exist (or was completed or aborted).
    #[error(
        "The specified upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed."
    )]
    NoSuchUpload,
    /// The body's MD5 differs from Content-MD5.
    #[error("The Content-MD5 you specified did not match what we received.")]
    BadDigest,
    /// Content-MD5 is not base64 of 16 bytes.
    #[error("The Content-MD5 you specified is not valid.")]
    InvalidDigest,
    /// An `x-amz-checksum-*` value differs from the body's.
    #[error("{0}")]
    ChecksumMismatch(String),
    /// CompleteMultipartUpload names a missing part or a wrong ETag.
    #[error("{0}")]
    InvalidPart(String),
    /// CompleteMultipartUpload lists parts out of order.
    #[error("The list of parts was not in ascending order. Parts must be ordered by part number.")]
    InvalidPartOrder,
    /// A part other than the last is smaller than 5 MiB.
    #[error(
        "Your proposed upload is smaller than the minimum allowed object size (part {part} has {size} bytes)."
    )]
    EntityTooSmall {
        /// The part number.
        part: u32,
        /// Its size.
        size: u64,
    },
    /// The body exceeds [`MAX_PUT_SIZE`](super::MAX_PUT_SIZE).
    #[error("Your proposed upload exceeds the maximum allowed object size.")]
    EntityTooLarge,
    /// Another invalid argument.
    #[error("{0}")]
    InvalidArgument(String),
    /// A per-user cap on multipart uploads is reached (403 `QuotaExceeded`).
    #[error("{0}")]
    QuotaExceeded(String),
    /// A request S3 refuses as `InvalidRequest` (checksum rules).
    #[error("{0}")]
    InvalidRequest(String),
    /// The body ended short of (or ran past) what the request declared, or
    /// lacked a trailer it announced.
    #[error("{0}")]
    IncompleteBody(String),
    /// Reading the request body failed (client error, signature or hash mismatch).
    #[error("reading the request body failed: {0}")]
    Body(BodyError),
    /// A filesystem error.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// The data directory is not ours alone (another user's, a symlink, or
    /// it cannot be made private).
    #[error(transparent)]
    NotPrivate(#[from] s3dma_service::private::PrivateError),
    /// An object file is damaged.
    #[error("corrupt object file {path}: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: FormatError,
    },
}

impl From<crate::checksum::ChecksumError> for StoreError {
    fn from(e: crate::checksum::ChecksumError) -> Self {
        use crate::checksum::ChecksumError as E;
        match e {
            E::InvalidPart(m) => StoreError::InvalidPart(m),
            E::InvalidRequest(m) => StoreError::InvalidRequest(m),
            E::Mismatch(m) => StoreError::ChecksumMismatch(m),
        }
    }
}

/// Result alias for store operations.
pub type StoreResult<T> = Result<T, StoreError>;
