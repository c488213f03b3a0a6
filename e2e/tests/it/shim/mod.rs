//! host-shim's integration tests, one binary: the end-to-end suite
//! (`e2e`), the batched calls (`batch`), fault injection (`faults`),
//! hostile input (`hostile`), the submission ring (`ring`) and CUDA
//! buffers (`cuda`, feature `cuda`),
//! all against real storage-target,
//! dpu-agent and host-shim processes (`common`, through
//! `s3dma_launcher::harness`).
//!
//! Run one part with a name filter, e.g. `cargo test -p s3dma-e2e --test it
//! -- shim::e2e::`.

mod batch;
pub(crate) mod common;
#[cfg(feature = "cuda")]
mod cuda;
mod e2e;
mod faults;
mod hostile;
mod rails;
mod ring;
