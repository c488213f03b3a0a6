#![warn(missing_docs)]
//! What the three s3dma services (storage-target, dpu-agent, host-shim)
//! share beyond the fabric and `s3dma-config`:
//!
//! - [`escape`]: names that reach a log (keys, buckets, metadata names,
//!   request ids) are written with control characters escaped, so a key
//!   with a newline cannot forge a log line and ANSI escapes never reach a
//!   terminal.
//! - [`metrics`]: the one `/metrics` server, on loopback TCP (the default),
//!   a Unix socket only its owner can open, and/or behind a bearer token.
//! - [`grpc`]: the request and response bodies both gRPC services wrap
//!   calls in ahead of tonic's codec (a per-method size limit,
//!   [`grpc::MethodLimits`], a held mark).
//! - [`request`]: the envelope every request runs in (the service's own
//!   id, the caller's id escaped, a span, latency and outcome metrics, the
//!   failure line, the id on every error).
//! - [`skeleton`]: the one `main` (`--config`/`--check`, tracing, start,
//!   the "listening on" lines, signals, graceful shutdown).
//! - [`fds`]: the file-descriptor budget every service checks against
//!   `RLIMIT_NOFILE` at start.
//! - [`child`]: child service processes (spawn, ready lines, stop, log
//!   tail), for `s3dma local` and the test kit.
//! - [`private`]: state and socket directories that belong to the user who
//!   runs the service, and files created only its owner can read.

pub use s3dma_config::escape;
pub mod child;
pub mod fds;
pub mod grpc;
pub mod metrics;
pub mod private;
pub mod request;
pub mod skeleton;

pub use escape::Escaped;
