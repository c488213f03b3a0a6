//! The end-to-end test harness (feature `harness`): real processes for the
//! agent's and the shim's integration tests and the agent's bench:
//! storage-targets and dpu-agents (the workspace's binaries, found in the
//! target directory above the test binary), a moto S3 server (third-party
//! S3, from the test virtualenv), a one-node Ceph cluster (an existing S3
//! cluster: radosgw from Debian's packages), and a test "shim" that holds tcp-fabric
//! memory and calls the agent's gRPC API.
//!
//! The end-to-end tests (`e2e/`: the agent's, the whole stack's, which adds
//! the host-shim process, the CLI's) and the agent's bench use it.
//! Everything here panics on failure: it is for tests.
//!
//! By part: `target` the storage-target, `agent` the dpu-agent, `tenant`
//! the test shim and tenant memory, `third_party` moto and Ceph; the
//! processes, files, ports and SDK helpers are `s3dma-testkit`'s (which
//! depends on no service), re-exported here with everything else.

mod agent;
mod target;
mod tenant;
mod third_party;

use std::path::{Path, PathBuf};

use aws_sdk_s3::Client as S3Client;
use fabric::FabricKey;

pub use agent::{Agent, AgentSpec, TargetSpec};
pub use s3dma_testkit::{
    Process, Service, ServiceSpec, bin_dir, create_bucket, data, fd_count, free_port, get_as,
    large_object_len, metric_value, overlay, put_as, read_log, rss_anon_kib, s3_client, scrape,
    sdk_error, sha256, sign_v4_as, wrapped, write_private,
};
pub use target::{Target, TargetOpts};
pub use tenant::{Memory, Shim};
pub use third_party::{Ceph, Moto};

/// The gateway's cache section, for [`TargetOpts::gateway`].
pub use storage_target::gateway::CacheConfig;

/// Fabric key shared by tenant memory, agent and targets.
pub const FABRIC_KEY_HEX: &str = "8899aabbccddeeff00112233445566778899aabbccddeeff0011223344556677";
/// Tenant credentials (S3 users on the target).
pub const ALICE: (&str, &str) = ("AKIAALICE", "alice-secret-Zq8v1X");
/// Another tenant.
pub const BOB: (&str, &str) = ("AKIABOB", "bob-secret-Hh3k9P");
/// Target admin (creates buckets).
pub const ADMIN: (&str, &str) = ("admin", "admin-secret-Lm2");
/// The shim's bearer token.
pub const SHIM_TOKEN: &str = "shim-token-0123456789abcdef";

/// [`FABRIC_KEY_HEX`] as a key.
pub fn fabric_key() -> FabricKey {
    fabric::config::parse_fabric_key(FABRIC_KEY_HEX).unwrap()
}

/// The fabric every service and test tenant of the harness uses:
/// `$S3DMA_TEST_FABRIC` (`tcp` when unset). `.ci/rdma-vm.sh` runs the
/// end-to-end suites again with `verbs` on Soft-RoCE.
///
/// # Panics
/// On a value other than `tcp` or `verbs`.
#[must_use]
pub fn backend() -> fabric::Backend {
    match std::env::var("S3DMA_TEST_FABRIC") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("S3DMA_TEST_FABRIC: {e}")),
        Err(_) => fabric::Backend::Tcp,
    }
}

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The S3 error code in an agent status.
pub fn s3_code(st: &tonic::Status) -> String {
    use tonic_types::StatusExt as _;
    st.get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

/// Reads an object straight from the target with aws-sdk-s3.
///
/// # Panics
/// When there is no such object (or the call fails).
pub async fn sdk_get(c: &S3Client, bucket: &str, key: &str) -> Vec<u8> {
    s3dma_testkit::get_as(c, bucket, key)
        .await
        .unwrap_or_else(|| panic!("GetObject {bucket}/{key} failed"))
}
