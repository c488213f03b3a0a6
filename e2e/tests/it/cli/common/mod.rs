//! Shared by the CLI's integration tests.

use std::path::Path;
use std::sync::LazyLock;

/// The `s3dma` binary under test, in the target directory above this test
/// binary (`cargo build --bins` builds it).
pub(crate) static S3DMA: LazyLock<String> = LazyLock::new(|| {
    s3dma_launcher::harness::bin_dir()
        .join("s3dma")
        .to_string_lossy()
        .into_owned()
});

/// Fails with a clear message unless the three service binaries that
/// `s3dma local` starts sit next to `s3dma`.
pub(crate) fn check_binaries() {
    let dir = Path::new(&*S3DMA).parent().unwrap();
    for b in ["storage-target", "dpu-agent", "host-shim"] {
        assert!(
            dir.join(b).is_file(),
            "{b} is not in {}: build the workspace binaries first \
             (`cargo build --bins`; `cargo test --workspace` does it)",
            dir.display()
        );
    }
}
