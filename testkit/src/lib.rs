#![warn(missing_docs)]
//! What the workspace's tests share, without any service crate (so a
//! service's tests build without the other services):
//!
//! - [`process`]: service processes for tests, on the one async
//!   implementation in [`s3dma_service::child`]: [`Process`] (start, ready
//!   lines, SIGKILL or SIGTERM, on the kit's own runtime, so also from
//!   synchronous code) and [`Service`] (a binary with its config file that
//!   can be restarted);
//! - [`files`]: private files ([`write_private`]), YAML overlays of config
//!   structs ([`overlay`]), logs, directory walks;
//! - [`net`]: free ports, `/metrics` scrapes and their values, a process's
//!   descriptors and memory;
//! - [`s3`]: aws-sdk-s3 clients for a user and the get/put helpers, the
//!   error code of a failed call, SigV4 signing of raw requests;
//! - [`self_exec`]: this test binary run again for one of its ignored
//!   tests, as another uid;
//! - [`netns`]: network namespaces for the rails tests (root): a host and
//!   a storage namespace joined by a control veth and rate-limited rail
//!   veths that can be cut and restored, services spawned inside them;
//! - [`fabric_peer`]: a raw tcp-fabric peer (handshake with or without the
//!   key, operation frames), on `s3dma-wire` alone, so fabric's own tests
//!   can use it;
//! - deterministic test data ([`data`], [`sha256`], [`large_object_len`]).
//!
//! Everything panics on failure: it is for tests.

pub mod fabric_peer;
pub mod files;
pub mod net;
pub mod netns;
pub mod process;
#[cfg(feature = "s3")]
pub mod s3;
pub mod self_exec;

pub use files::{files_under, overlay, read_log, write_private, write_yaml};
pub use net::{fd_count, free_port, metric_value, rss_anon_kib, scrape, scrape_blocking};
pub use process::{Process, Service, ServiceSpec, block_on, wrapped};
#[cfg(feature = "s3")]
pub use s3::{
    Raw, create_bucket, get_as, https_client, put_as, raw, s3_client, sdk_error, sign_v4_as,
};
pub use self_exec::{
    ChildAsUser, executable_copy, root_or_skip, self_test_command, spawn_retrying,
};

use sha2::Digest as _;

/// Deterministic pseudo-random bytes (xorshift, seeded).
#[must_use]
pub fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// SHA-256 of `b`, lowercase hex.
#[must_use]
pub fn sha256(b: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(b))
}

/// The size of the suites' "large object" cases: 1 GiB, or
/// `$S3DMA_TEST_LARGE_OBJECT` bytes (the Soft-RoCE VM, whose emulated CPUs
/// are slow, uses 128 MiB: still many chunks and a multipart upload).
///
/// # Panics
/// On a value that is not a number of bytes.
#[must_use]
pub fn large_object_len() -> usize {
    std::env::var("S3DMA_TEST_LARGE_OBJECT").map_or(1 << 30, |v| {
        v.parse()
            .unwrap_or_else(|e| panic!("S3DMA_TEST_LARGE_OBJECT={v:?}: {e}"))
    })
}

/// `target/<profile>/` of the running test binary (in
/// `target/<profile>/deps/`): where cargo puts the workspace's binaries.
///
/// # Panics
/// When the test binary's path cannot be read.
#[must_use]
pub fn bin_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// Whether the CUDA suites can run, from the driver's `init` result
/// (`fabric::cuda::init()`): otherwise prints why `test` is skipped, or
/// fails it when `S3DMA_REQUIRE_CUDA=1` (`.ci/cuda-standin.sh` sets it).
///
/// # Panics
/// No driver while `S3DMA_REQUIRE_CUDA=1`.
pub fn cuda_driver<E: std::fmt::Display>(test: &str, init: Result<(), E>) -> bool {
    match init {
        Ok(()) => true,
        Err(e) if std::env::var("S3DMA_REQUIRE_CUDA").as_deref() == Ok("1") => {
            panic!("S3DMA_REQUIRE_CUDA=1 but no CUDA driver could be used: {e}")
        }
        Err(e) => {
            eprintln!(
                "{test}: SKIPPED, no CUDA driver ({e}). Run .ci/cuda-standin.sh (the test-only \
                 stand-in), or run on a GPU host; S3DMA_REQUIRE_CUDA=1 turns this skip into a failure."
            );
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_is_deterministic() {
        assert_eq!(data(100, 7), data(100, 7));
        assert_ne!(data(100, 7), data(100, 8));
        assert_eq!(data(13, 1).len(), 13);
    }

    #[test]
    fn overlays_replace_keys() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct C {
            a: u32,
            b: String,
        }
        let c = overlay(
            &C {
                a: 1,
                b: "x".into(),
            },
            "a: 2",
        );
        assert_eq!(
            c,
            C {
                a: 2,
                b: "x".into()
            }
        );
    }

    #[test]
    fn metric_values_sum_label_sets() {
        let t = "m{a=\"1\"} 2\nm{a=\"2\"} 3\nmx 9\nm 1\n";
        assert_eq!(metric_value(t, "m"), 6.0);
        assert_eq!(metric_value(t, "m{a=\"1\"}"), 2.0);
    }

    #[test]
    fn a_process_starts_and_stops() {
        let dir = tempfile_dir();
        let log = dir.join("log");
        let mut cmd = std::process::Command::new("sh");
        cmd.args([
            "-c",
            "echo 'x listening on 1'; echo 'metrics on 2'; exec sleep 30",
        ]);
        let (mut p, lines) =
            Process::start(cmd, "x", &log, &["x listening on ", "metrics on "], None);
        assert_eq!(lines, ["1", "2"]);
        assert!(p.try_wait().is_none());
        assert!(p.terminate(std::time::Duration::from_secs(5)).is_some());
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "s3dma-testkit-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
