//! The agent's integration tests use the shared end-to-end harness in
//! `s3dma-launcher` (feature `harness`), which host-shim's tests use too.

pub(crate) use s3dma_launcher::harness::*;
