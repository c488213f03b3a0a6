#![warn(missing_docs)]
//! s3dma's gRPC contracts, generated from the `.proto` files next to this
//! crate by tonic/prost, and the one non-gRPC wire format they rely on.
//!
//! * [`agent::v1`]: the dpu-agent's API (`s3dma.agent.v1.Agent`), called by
//!   host-shims.
//! * [`tenant::v1`]: the host-shim's API (`s3dma.tenant.v1.Tenant`), called
//!   by tenant applications over the shim's Unix socket.
//! * [`lease`]: the codec of the lease protocol that passes tenant memory
//!   (file descriptors) to the shim over the same socket (it lives in
//!   `s3dma-wire` with the other wire formats).
//!
//! The tenant's byte range converts to and from
//! [`s3dma_wire::range::ByteRange`], the one range type of the project.

pub use s3dma_wire::lease;

use s3dma_wire::range::{ByteRange, ParseRangeError};

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

impl From<ByteRange> for agent::v1::ByteRange {
    fn from(r: ByteRange) -> agent::v1::ByteRange {
        use agent::v1::byte_range::{Bounded, Kind};
        agent::v1::ByteRange {
            kind: Some(match r {
                ByteRange::Bounded { first, last } => Kind::Bounded(Bounded { first, last }),
                ByteRange::From(first) => Kind::From(first),
                ByteRange::Suffix(n) => Kind::Suffix(n),
            }),
        }
    }
}

impl TryFrom<agent::v1::ByteRange> for ByteRange {
    type Error = ParseRangeError;

    fn try_from(r: agent::v1::ByteRange) -> Result<ByteRange, ParseRangeError> {
        use agent::v1::byte_range::Kind;
        match r.kind {
            Some(Kind::Bounded(b)) => Ok(ByteRange::Bounded {
                first: b.first,
                last: b.last,
            }),
            Some(Kind::From(first)) => Ok(ByteRange::From(first)),
            Some(Kind::Suffix(n)) => Ok(ByteRange::Suffix(n)),
            None => Err(ParseRangeError::new("", "the range has no kind")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_ranges_map_to_the_proto_oneof_and_back() {
        for r in [
            ByteRange::Bounded { first: 3, last: 9 },
            ByteRange::From(4),
            ByteRange::Suffix(5),
        ] {
            let p = agent::v1::ByteRange::from(r);
            assert!(p.kind.is_some());
            assert_eq!(ByteRange::try_from(p), Ok(r));
        }
        assert!(ByteRange::try_from(agent::v1::ByteRange { kind: None }).is_err());
    }
}
