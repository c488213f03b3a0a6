//! Shared by the tools' integration tests.

use std::path::Path;

/// The `s3dma-tools` binary under test.
pub(crate) const S3DMA_TOOLS: &str = env!("CARGO_BIN_EXE_s3dma-tools");

/// Fails with a clear message unless the three service binaries that
/// `bench` / `soak` start sit next to `s3dma-tools`.
pub(crate) fn check_binaries() {
    let dir = Path::new(S3DMA_TOOLS).parent().unwrap();
    for b in ["storage-target", "dpu-agent", "host-shim"] {
        assert!(
            dir.join(b).is_file(),
            "{b} is not in {}: build the workspace binaries first \
             (`cargo build --bins`; `cargo test --workspace` does it)",
            dir.display()
        );
    }
}
