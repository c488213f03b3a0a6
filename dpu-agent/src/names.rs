//! The bucket and key checks every operation runs first (single calls and
//! every item of a batch), in a leaf module so that the service and the
//! batches share them without importing each other.

use crate::error::{AgentError, BadRequest};

/// Checks a bucket name.
///
/// # Errors
/// `InvalidArgument` naming the bucket.
pub fn check_bucket(bucket: &str) -> Result<(), AgentError> {
    let ok = (1..=63).contains(&bucket.len())
        && bucket.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || b == b'.'
                || b == b'-'
                || b == b'_'
                || b.is_ascii_uppercase()
        });
    if ok {
        Ok(())
    } else {
        Err(AgentError::InvalidArgument(BadRequest::BucketName {
            bucket: bucket.to_owned(),
        }))
    }
}

/// Checks a key's length.
///
/// # Errors
/// `InvalidArgument` with the length.
pub fn check_key(key: &str) -> Result<(), AgentError> {
    if key.is_empty() || key.len() > 1024 {
        return Err(AgentError::InvalidArgument(BadRequest::KeyLength {
            len: key.len(),
        }));
    }
    Ok(())
}
