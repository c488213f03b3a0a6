//! Shared by the CLI's integration tests.

use std::path::Path;

/// The `s3dma` binary under test.
pub(crate) const S3DMA: &str = env!("CARGO_BIN_EXE_s3dma");

/// Fails with a clear message unless the three service binaries that
/// `s3dma local` starts sit next to `s3dma`.
pub(crate) fn check_binaries() {
    let dir = Path::new(S3DMA).parent().unwrap();
    for b in ["storage-target", "dpu-agent", "host-shim"] {
        assert!(
            dir.join(b).is_file(),
            "{b} is not in {}: build the workspace binaries first \
             (`cargo build --bins`; `cargo test --workspace` does it)",
            dir.display()
        );
    }
}
