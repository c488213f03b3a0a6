#![warn(missing_docs)]
//! Starts storage-target, dpu-agent and host-shim on this machine, from
//! their binaries, wired together over loopback and the `tcp` fabric.
//!
//! One launcher for everything that runs the whole stack: `s3dma local`
//! (the tenant CLI, and through it the CLI and Python end-to-end tests),
//! `s3dma-tools bench` / `soak`, and this crate's own tests.
//!
//! * [`Layout`]: where things live under a state directory `DIR`:
//!   `data/` (the storage-target's store), `secrets/` (the tenant's access
//!   key id and secret, the shim's bearer token and the fabric key; created
//!   on the first run and reused afterwards, so the data stays readable),
//!   the three generated configuration files (rewritten on every start: the
//!   ports change) and `logs/` (each child's stderr and stdout). Everything
//!   is private: `DIR` and its directories are made 0700 (an existing `DIR`
//!   that is more open, say 0755, is tightened; one owned by another user,
//!   or a symlink, is refused) and every file written there is 0600.
//! * [`configs`]: the three configurations, built as the services' own
//!   config structs (`storage_target::config::Config`,
//!   `dpu_agent::config::Config`, `host_shim::config::Config`) and written
//!   with `serde_yaml`, so that what the launcher writes is what the
//!   services' loaders read (the unit tests load it with them).
//! * [`Stack`]: [`Stack::prepare`] finds the binaries, makes the
//!   directories, locks `DIR` and checks the socket path; [`Stack::start`]
//!   starts storage-target on `127.0.0.1:0` (its stdout line
//!   `storage-target listening on http://ADDR` gives the address), creates
//!   the bucket with aws-sdk-s3 (an existing one is kept), starts dpu-agent
//!   (`dpu-agent listening on ADDR`) with that target and one tenant,
//!   [`TENANT`], allowed to read and write every bucket, then host-shim on
//!   the socket (mode 0600), mapping the invoking uid to that tenant; it is
//!   up once the socket accepts connections. [`Stack::stop`] stops them in
//!   reverse order (SIGTERM, then SIGKILL after [`STOP_TIMEOUT`]) and
//!   removes the socket.
//!
//! The children run in their own process group, so a terminal's Ctrl-C
//! reaches only the program that started them, which then stops them in
//! order. Dropping a [`Stack`] kills them.
//!
//! The children are [`s3dma_service::child`] processes (the one spawn,
//! ready-line, stop and log-tail implementation, which `s3dma-testkit`
//! wraps for the tests).
//!
//! With the `harness` feature, `harness` is the end-to-end test harness
//! that the end-to-end tests (`e2e/`), the agent's bench and the tools'
//! tests share as a dev-dependency: storage-targets, dpu-agents and a moto
//! server as processes (through `s3dma-testkit`), configured with the same
//! serialized config structs, and a test "shim" holding tcp-fabric memory.
//!
//! The socket's directory: with [`StackOptions::own_socket_dir`] (the
//! default socket of `s3dma local`, [`default_socket`], or a temporary
//! directory) it is made 0700, and when it already exists it must be ours
//! and not a symlink (another user who created `/tmp/s3dma-<uid>/` first
//! could replace the socket). Otherwise it needs to be ours (or root's)
//! and writable by nobody else (not `/tmp` itself).

pub mod configs;
mod error;
#[cfg(feature = "harness")]
pub mod harness;
mod layout;
mod remote;
mod stack;
mod upstream;

/// The fabric backends a stack can run on ([`StackOptions::fabric`]).
pub use dpu_agent::config::RdmaProtocol;
pub use error::LaunchError;
pub use fabric::Backend;
pub use layout::{Layout, Secrets, default_dir, default_socket};
pub use remote::RemoteTarget;
pub use stack::{Endpoints, Service, Stack, StackOptions, TargetEndpoint, absolute};
pub use storage_target::gateway::https_client;
pub use upstream::Upstream;

use std::time::Duration;

/// How long storage-target may take to print its address (it rebuilds its
/// listing index from the data directory first).
pub const TARGET_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long dpu-agent may take to print its address.
pub const AGENT_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long host-shim may take until its socket accepts connections.
pub const SHIM_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a child may take to exit after SIGTERM before it gets SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the storage-target may take to answer CreateBucket.
pub const BUCKET_TIMEOUT: Duration = Duration::from_secs(30);

/// The SigV4 region the local storage-target uses.
pub const REGION: &str = "us-east-1";
/// The tenant's name in the generated configurations.
pub const TENANT: &str = "local";

/// `storage-target listening on http://127.0.0.1:1234` → the URL.
#[must_use]
pub fn parse_target_line(line: &str) -> Option<&str> {
    let url = line.trim().strip_prefix("storage-target listening on ")?;
    url.starts_with("http://").then_some(url)
}

/// `dpu-agent listening on 127.0.0.1:1234` → `127.0.0.1:1234` (an
/// `http://` prefix is tolerated).
#[must_use]
pub fn parse_agent_line(line: &str) -> Option<&str> {
    let addr = line.trim().strip_prefix("dpu-agent listening on ")?;
    let addr = addr.strip_prefix("http://").unwrap_or(addr);
    (!addr.is_empty()).then_some(addr)
}

/// `metrics on http://127.0.0.1:1234/metrics` (printed by all three
/// services) → `127.0.0.1:1234`.
#[must_use]
pub fn parse_metrics_line(line: &str) -> Option<&str> {
    let addr = line
        .trim()
        .strip_prefix("metrics on http://")?
        .strip_suffix("/metrics")?;
    (!addr.is_empty()).then_some(addr)
}

/// The last `n` lines of `text`.
pub use s3dma_service::child::tail;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_lines() {
        assert_eq!(
            parse_metrics_line("metrics on http://127.0.0.1:9/metrics\n"),
            Some("127.0.0.1:9")
        );
        assert_eq!(parse_metrics_line("metrics on http:///metrics"), None);
        assert_eq!(parse_metrics_line("metrics on 127.0.0.1:9"), None);
        assert_eq!(
            parse_target_line("storage-target listening on http://127.0.0.1:40001\n"),
            Some("http://127.0.0.1:40001")
        );
        assert_eq!(parse_target_line("metrics on http://x/metrics"), None);
        assert_eq!(
            parse_agent_line("dpu-agent listening on 127.0.0.1:5"),
            Some("127.0.0.1:5")
        );
        assert_eq!(
            parse_agent_line("dpu-agent listening on http://127.0.0.1:5"),
            Some("127.0.0.1:5")
        );
        assert_eq!(parse_agent_line("dpu-agent listening on "), None);
    }
}
