//! s3dma's gRPC contracts, generated from the `.proto` files next to this
//! crate by tonic/prost.
//!
//! * [`agent::v1`]: the dpu-agent's API (`s3dma.agent.v1.Agent`), called by
//!   host-shims.

/// `s3dma.agent.*`
pub mod agent {
    /// `s3dma.agent.v1`: the API host-shims call on the dpu-agent.
    #[allow(missing_docs, clippy::all, clippy::pedantic, rust_2018_idioms)]
    pub mod v1 {
        tonic::include_proto!("s3dma.agent.v1");
    }
}
