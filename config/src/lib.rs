#![warn(missing_docs)]
//! Configuration pieces every s3dma program shares, so that the three
//! services' YAML files read sizes, secrets and endpoint URLs the same way
//! and report problems the same way. Pure apart from reading files: no
//! async runtime, no fabric.
//!
//! * [`ByteSize`] / [`parse_size`]: a size written as a number of bytes or
//!   as `4MiB`, `512KiB`, `1GiB`, `2TiB` (binary units only, case-sensitive).
//! * [`Secret`], [`read_secret_file`], [`read_private_file`]: secrets read
//!   from files that others cannot read ([`check_private_file`]); a secret
//!   never reaches a log or an error message.
//! * [`check_readable_file`]: a file a configuration names exists and is a
//!   regular file.
//! * [`check_endpoint_url`]: `http://host:port` or `https://host:port`.
//! * [`RuntimeConfig`]: the `runtime:` section (worker threads).
//! * [`MetricsConfig`]: the `metrics:` section (the Prometheus endpoint).
//! * [`Validator`]: the range, path and file checks every service's
//!   validation runs, each error naming the file and the field.
//! * [`Escaped`], [`EscapedBytes`]: client-chosen names as they may reach
//!   a log (control characters escaped).
//! * [`local`]: where `s3dma local` keeps its state and socket by default.
//! * [`ConfigError`]: `<file>: <field.path>: <problem>`, the one shape of a
//!   configuration error in every service.

mod endpoint;
mod error;
pub mod escape;
mod files;
pub mod local;
mod metrics;
mod runtime;
mod size;
mod validate;

pub use endpoint::{EndpointUrl, EndpointUrlError, check_endpoint_url};
pub use error::ConfigError;
pub use escape::{Escaped, EscapedBytes};
pub use files::{
    FileError, Secret, check_private_file, check_readable_file, read_private_file, read_secret_file,
};
pub use metrics::MetricsConfig;
pub use runtime::{MAX_WORKER_THREADS, RuntimeConfig, WorkerThreadsError};
pub use size::{ByteSize, GIB, KIB, MIB, SizeError, TIB, parse_size};
pub use validate::{Check, Validator};
