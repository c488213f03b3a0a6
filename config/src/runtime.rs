//! `runtime:`, the async runtime section every service reads.

use serde::{Deserialize, Serialize};

/// The most worker threads a service may ask for: far above any machine
/// s3dma runs on, low enough that a typo cannot exhaust the thread limit.
pub const MAX_WORKER_THREADS: usize = 1024;

/// `runtime:` — how many threads run the service's async tasks (optional;
/// blocking work such as file I/O always has its own thread pool).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Worker threads (1 to 1024). Absent: one per CPU the process may use.
    /// `1` runs every task on the service's main thread (a single-threaded
    /// scheduler): no task ever waits for a wake-up from another thread,
    /// which costs the least CPU per request but uses one core at most.
    /// On a host where the service shares a few cores with busy
    /// neighbours, 1 is usually the better choice; a dpu-agent with a DPU's
    /// cores to itself should keep the default.
    #[serde(default)]
    pub worker_threads: Option<usize>,
}

/// A `worker_threads` out of range: the problem, for
/// `ConfigError::invalid(file, "runtime.worker_threads", problem)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} worker threads: must be 1 to {MAX_WORKER_THREADS} (or absent: one per CPU)")]
pub struct WorkerThreadsError(pub usize);

impl RuntimeConfig {
    /// Checks `worker_threads`.
    ///
    /// # Errors
    /// [`WorkerThreadsError`] for 0 or more than [`MAX_WORKER_THREADS`].
    pub fn check(&self) -> Result<(), WorkerThreadsError> {
        match self.worker_threads {
            Some(n) if !(1..=MAX_WORKER_THREADS).contains(&n) => Err(WorkerThreadsError(n)),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_threads_are_bounded() {
        let parse = |y: &str| serde_yaml::from_str::<RuntimeConfig>(y);
        assert_eq!(parse("{}").unwrap().worker_threads, None);
        assert!(parse("worker_threads: 1").unwrap().check().is_ok());
        assert!(parse("worker_threads: 1024").unwrap().check().is_ok());
        let e = parse("worker_threads: 0")
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be 1 to 1024"), "{e}");
        assert!(parse("worker_threads: 1025").unwrap().check().is_err());
        assert!(parse("worker_threads: -1").is_err());
        assert!(parse("threads: 2").is_err(), "unknown fields are refused");
    }
}
