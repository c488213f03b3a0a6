//! What can go wrong while preparing, starting or stopping a stack.

use std::path::PathBuf;

/// Why a stack could not be prepared or started, or why it stopped.
///
/// Every message says what to do where there is something to do (another
/// `--dir`, another `--socket`, building the binaries); a service that
/// failed is named with the tail of its log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// A file system or process operation failed.
    #[error("{what}")]
    Io {
        /// What was being done, naming the path.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A directory or file that is not private enough, or that cannot be
    /// made private.
    #[error("{error}{hint}")]
    Private {
        /// What is wrong with it (shown in this error's message).
        error: s3dma_service::private::PrivateError,
        /// What to do about it (may be empty).
        hint: &'static str,
    },
    /// A state directory, socket path or secret that cannot be used; the
    /// message says why and what to pick instead.
    #[error("{0}")]
    Unusable(String),
    /// The service binaries are not where they were looked for.
    #[error(
        "cannot find {} in {where_} or on PATH; build them with `cargo build --release --bins` \
         (then run target/release/s3dma local)",
        missing.join(", ")
    )]
    MissingBinaries {
        /// The binaries not found.
        missing: Vec<&'static str>,
        /// Where they were looked for.
        where_: String,
    },
    /// A service did not start in time, or exited; the message carries the
    /// tail of its log.
    #[error("{message}")]
    Service {
        /// The service (`storage-target`, `dpu-agent`, `host-shim`).
        name: &'static str,
        /// What happened, with the tail of its log.
        message: String,
    },
    /// A configuration could not be written.
    #[error("writing {}", path.display())]
    Config {
        /// The configuration file.
        path: PathBuf,
        /// Why it could not be serialized.
        #[source]
        source: serde_yaml::Error,
    },
    /// The bucket could not be created.
    #[error("creating bucket {bucket:?}: {message}")]
    Bucket {
        /// The bucket.
        bucket: String,
        /// What the storage-target (or the connection to it) said.
        message: String,
    },
}

impl LaunchError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
        let what = what.into();
        move |source| LaunchError::Io { what, source }
    }
}
