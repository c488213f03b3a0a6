//! Retry policy for S3 attempts: which failures are retried, and the
//! jittered exponential backoff between attempts (pure, deterministic given
//! the random draw).

use std::time::Duration;

/// Retry settings (from `transfer:` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub retries: u32,
    /// Backoff cap for the first retry.
    pub initial: Duration,
    /// Backoff cap for any retry.
    pub max: Duration,
}

impl RetryPolicy {
    /// "Full jitter" backoff before retry number `retry` (1-based):
    /// `draw * min(max, initial * 2^(retry-1))` with `draw` in `[0, 1)`.
    /// Jitter spreads retries of many chunks hitting one failing target.
    #[must_use]
    pub fn backoff(&self, retry: u32, draw: f64) -> Duration {
        let exp = retry.saturating_sub(1).min(30);
        let cap = self
            .initial
            .checked_mul(1u32 << exp)
            .unwrap_or(self.max)
            .min(self.max);
        cap.mul_f64(draw.clamp(0.0, 1.0))
    }
}

/// Whether an HTTP status is worth retrying: server errors and throttling,
/// never other 4xx (the same request would fail the same way).
#[must_use]
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 500..=599 | 429 | 408)
        // 501 Not Implemented is a definitive answer, and 507 Insufficient
        // Storage (a full disk) does not clear within a retry's backoff:
        // retrying would only send the bytes again.
        && status != 501
        && status != 507
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        let p = RetryPolicy {
            retries: 5,
            initial: Duration::from_millis(50),
            max: Duration::from_millis(1000),
        };
        let table = [
            (1, 1.0, 50),
            (2, 1.0, 100),
            (3, 1.0, 200),
            (5, 1.0, 800),
            (6, 1.0, 1000),
            (40, 1.0, 1000),
            (u32::MAX, 1.0, 1000),
            (3, 0.5, 100),
            (3, 0.0, 0),
            (3, 7.0, 200),
            (3, -1.0, 0),
        ];
        for (retry, draw, ms) in table {
            assert_eq!(
                p.backoff(retry, draw),
                Duration::from_millis(ms),
                "{retry} {draw}"
            );
        }
    }

    #[test]
    fn retryable_statuses() {
        for s in [500, 502, 503, 504, 429, 408] {
            assert!(retryable_status(s), "{s}");
        }
        for s in [200, 400, 403, 404, 409, 412, 416, 501, 507] {
            assert!(!retryable_status(s), "{s}");
        }
    }
}
