//! s3dma's host-shim: the tenant API (`s3dma.tenant.v1`) on a Unix socket.
//!
//! See `docs/ARCHITECTURE.md` ("host-shim") for how the modules fit.
pub mod config;
