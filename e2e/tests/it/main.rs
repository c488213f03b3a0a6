//! The end-to-end tests: everything that needs more than one service
//! running, one binary (`cargo test -p s3dma-e2e --test it`; one part:
//! `... -- shim::e2e::`). They start the workspace's binaries
//! (storage-target, dpu-agent, host-shim, `s3dma`, `s3dma-local`) from the
//! target directory above this test binary: build them first (`cargo build
//! --bins`; `cargo test --workspace` does).
//!
//! - [`agent`]: the dpu-agent against storage-targets (and Ceph, moto);
//! - [`shim`]: the whole stack through the Rust client: end to end, faults,
//!   hostile input, CUDA buffers (feature `cuda`);
//! - [`cli`]: the `s3dma` command against `s3dma local`;
//! - [`launcher`]: the launcher's `Stack` from the binaries;
//! - [`rails`]: the whole stack over two rate-limited fabric rails in
//!   network namespaces (root), one cut and restored mid-transfer;
//! - [`verbs_rails`]: the same on two RDMA devices (the Soft-RoCE VM).

mod agent;
mod cli;
mod launcher;
mod rail_metrics;
mod rails;
mod shim;
mod verbs_rails;
