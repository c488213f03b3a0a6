//! The `multipart:` section (filesystem store): per-user caps on
//! in-progress multipart uploads, and the sweep of those never completed.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::FieldError;

/// Smallest size of every multipart part but the last: 5 MiB.
pub const MIN_PART_SIZE: u64 = 5 << 20;

/// The `multipart:` section (filesystem store): what one user's
/// in-progress multipart uploads may hold, and when an upload nobody
/// completes is aborted. A user's uploads are those they initiated, in any
/// bucket; parts anyone uploads into them (the bucket owner may) count
/// there. Beyond a cap the request is refused with 403 `QuotaExceeded`
/// before its body is stored.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MultipartConfig {
    /// Most uploads one user may have in progress, across all buckets.
    /// Default 1000; at least 1.
    #[serde(default = "default_max_open_uploads_per_user")]
    pub max_open_uploads_per_user: usize,
    /// Most parts stored in one user's in-progress uploads together (a
    /// part uploaded again under the same number counts once). Default
    /// 100000; at least 1.
    #[serde(default = "default_max_parts_per_user")]
    pub max_parts_per_user: usize,
    /// Most bytes stored in one user's in-progress uploads together, parts
    /// written by UploadPart and UploadPartCopy alike (bytes, or e.g.
    /// `500GiB`). A part whose declared size does not fit is refused before
    /// its body is read. Default `1TiB`; at least `5MiB`.
    #[serde(default = "default_max_bytes_per_user")]
    pub max_bytes_per_user: s3dma_config::ByteSize,
    /// Seconds after its initiation when an upload still in progress is
    /// aborted and its parts deleted (as S3's lifecycle rule
    /// AbortIncompleteMultipartUpload), checked periodically (every quarter
    /// of this, at most hourly). 0 turns the sweep off. Default 604800
    /// (7 days).
    #[serde(default = "default_abort_incomplete_after")]
    pub abort_incomplete_after: f64,
    /// The UploadPartCopy budget of one signed user: bytes per minute its
    /// copied parts may write, separate from `max_bytes_per_user` (which
    /// bounds what uploads hold, sized for checkpoints: a copy writes a
    /// whole part for a request of a few hundred bytes). A token bucket:
    /// up to one minute's budget at once, refilled continuously. A copy
    /// whose range does not fit the budget left is refused with `503
    /// SlowDown` before any byte is copied. Default `64GiB`; at least
    /// `5GiB` (one largest part).
    #[serde(default = "default_copy_bytes_per_minute_per_user")]
    pub copy_bytes_per_minute_per_user: s3dma_config::ByteSize,
    /// The UploadPartCopy budget of all anonymous callers together (one
    /// class: anonymous callers cannot be told apart), bytes per minute, as
    /// `copy_bytes_per_minute_per_user`. Default `64MiB`; 0 refuses every
    /// anonymous UploadPartCopy.
    #[serde(default = "default_anonymous_copy_bytes_per_minute")]
    pub anonymous_copy_bytes_per_minute: s3dma_config::ByteSize,
}

fn default_max_open_uploads_per_user() -> usize {
    1000
}

fn default_max_parts_per_user() -> usize {
    100_000
}

fn default_max_bytes_per_user() -> s3dma_config::ByteSize {
    s3dma_config::ByteSize(1 << 40)
}

fn default_copy_bytes_per_minute_per_user() -> s3dma_config::ByteSize {
    s3dma_config::ByteSize(64 << 30)
}

fn default_anonymous_copy_bytes_per_minute() -> s3dma_config::ByteSize {
    s3dma_config::ByteSize(64 << 20)
}

fn default_abort_incomplete_after() -> f64 {
    7.0 * 24.0 * 3600.0
}

impl Default for MultipartConfig {
    fn default() -> Self {
        MultipartConfig {
            max_open_uploads_per_user: default_max_open_uploads_per_user(),
            max_parts_per_user: default_max_parts_per_user(),
            max_bytes_per_user: default_max_bytes_per_user(),
            abort_incomplete_after: default_abort_incomplete_after(),
            copy_bytes_per_minute_per_user: default_copy_bytes_per_minute_per_user(),
            anonymous_copy_bytes_per_minute: default_anonymous_copy_bytes_per_minute(),
        }
    }
}

impl MultipartConfig {
    /// Checks the values; `Err(FieldError::new(field, message))` names the first bad one
    /// (relative to the section).
    ///
    /// # Errors
    /// A cap of 0 (or bytes below 5 MiB), a negative or non-finite age.
    pub fn check(&self) -> Result<(), FieldError> {
        if self.max_open_uploads_per_user == 0 {
            return Err(FieldError::new(
                "max_open_uploads_per_user",
                "must be at least 1",
            ));
        }
        if self.max_parts_per_user == 0 {
            return Err(FieldError::new("max_parts_per_user", "must be at least 1"));
        }
        if self.max_bytes_per_user.0 < MIN_PART_SIZE {
            return Err(FieldError::new(
                "max_bytes_per_user",
                "must be at least 5MiB (one part)",
            ));
        }
        if self.copy_bytes_per_minute_per_user.0 < 5 << 30 {
            return Err(FieldError::new(
                "copy_bytes_per_minute_per_user",
                "must be at least 5GiB (one largest part)",
            ));
        }
        if !self.abort_incomplete_after.is_finite() || self.abort_incomplete_after < 0.0 {
            return Err(FieldError::new(
                "abort_incomplete_after",
                "must be a number of seconds, 0 (off) or more",
            ));
        }
        Ok(())
    }

    /// The UploadPartCopy budget per minute of `access_key` (empty: the
    /// anonymous class).
    #[must_use]
    pub fn copy_budget(&self, access_key: &str) -> u64 {
        if access_key.is_empty() {
            self.anonymous_copy_bytes_per_minute.0
        } else {
            self.copy_bytes_per_minute_per_user.0
        }
    }

    /// The age after which uploads are swept, `None` when off.
    #[must_use]
    pub fn abort_after(&self) -> Option<Duration> {
        (self.abort_incomplete_after > 0.0)
            .then(|| Duration::try_from_secs_f64(self.abort_incomplete_after).ok())
            .flatten()
    }

    /// How often the sweep runs: a quarter of the age, between 100 ms and
    /// an hour.
    #[must_use]
    pub fn sweep_interval(&self) -> Option<Duration> {
        self.abort_after()
            .map(|a| (a / 4).clamp(Duration::from_millis(100), Duration::from_secs(3600)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_checks() {
        assert!(MultipartConfig::default().check().is_ok());
        let d = MultipartConfig::default();
        assert_eq!(d.copy_budget("alice"), 64 << 30);
        assert_eq!(d.copy_budget(""), 64 << 20);
        assert_eq!(
            MultipartConfig::default().abort_after(),
            Some(Duration::from_secs(7 * 24 * 3600))
        );
        let off = MultipartConfig {
            abort_incomplete_after: 0.0,
            ..MultipartConfig::default()
        };
        assert_eq!(off.abort_after(), None);
        assert_eq!(off.sweep_interval(), None);
        let fast = MultipartConfig {
            abort_incomplete_after: 0.01,
            ..MultipartConfig::default()
        };
        assert_eq!(fast.sweep_interval(), Some(Duration::from_millis(100)));
        for bad in [
            MultipartConfig {
                max_open_uploads_per_user: 0,
                ..MultipartConfig::default()
            },
            MultipartConfig {
                max_parts_per_user: 0,
                ..MultipartConfig::default()
            },
            MultipartConfig {
                max_bytes_per_user: s3dma_config::ByteSize(1),
                ..MultipartConfig::default()
            },
            MultipartConfig {
                abort_incomplete_after: -1.0,
                ..MultipartConfig::default()
            },
            MultipartConfig {
                abort_incomplete_after: f64::NAN,
                ..MultipartConfig::default()
            },
            MultipartConfig {
                copy_bytes_per_minute_per_user: s3dma_config::ByteSize(1 << 30),
                ..MultipartConfig::default()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
