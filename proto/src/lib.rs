//! s3dma's gRPC contracts, generated from the `.proto` files next to this
//! crate by tonic/prost, and the one non-gRPC wire format they rely on.
//!
//! * [`agent::v1`]: the dpu-agent's API (`s3dma.agent.v1.Agent`), called by
//!   host-shims.
//! * [`tenant::v1`]: the host-shim's API (`s3dma.tenant.v1.Tenant`), called
//!   by tenant applications over the shim's Unix socket.
//! * [`lease`]: the codec of the lease protocol that passes tenant memory
//!   (file descriptors) to the shim over the same socket.

pub mod lease;

/// `s3dma.agent.*`
pub mod agent {
    /// `s3dma.agent.v1`: the API host-shims call on the dpu-agent.
    #[allow(missing_docs, clippy::all, clippy::pedantic, rust_2018_idioms)]
    pub mod v1 {
        tonic::include_proto!("s3dma.agent.v1");
    }
}

/// `s3dma.tenant.*`
pub mod tenant {
    /// `s3dma.tenant.v1`: the API tenant applications call on the host-shim.
    #[allow(missing_docs, clippy::all, clippy::pedantic, rust_2018_idioms)]
    pub mod v1 {
        tonic::include_proto!("s3dma.tenant.v1");
    }
}

/// `google.rpc.ErrorInfo` domain of the dpu-agent's S3-level errors.
pub const AGENT_ERROR_DOMAIN: &str = "s3dma.agent";
/// `google.rpc.ErrorInfo` domain of the host-shim's own errors.
pub const SHIM_ERROR_DOMAIN: &str = "s3dma.shim";
