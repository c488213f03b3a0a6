//! The target dialects as the agent speaks them: one [`ChunkMover`] per
//! dialect, chosen once per target of a request ([`dialect_for`], the one
//! place that asks which dialect a target speaks and what the calling shim
//! can do).
//!
//! - [`s3dma`]: s3dma-v1 tokens with the signed marker;
//! - [`cuobject_dc`]: standard tokens the calling shim mints for its DC
//!   target;
//! - [`hipobj`]: AMD's hipobj-rc-v2, a control plane over HTTP and queue
//!   pairs on the calling shim's device;
//! - [`plain`]: no RDMA (the bytes go through the agent).
//!
//! The seam itself (the trait, what a chunk is, the token a request
//! carries) is [`mover`].

pub mod cuobject_dc;
pub mod hipobj;
pub mod mover;
pub mod plain;
pub mod s3dma;

use std::sync::Arc;

pub use mover::{ChunkMover, SentToken, Transfer};

use crate::config::RdmaProtocol;
use crate::qp_link::QpLink;
use crate::s3::TargetClient;

/// How `target`'s chunks and parts move for a request from a shim with
/// `qp_link` (its `QueuePairs` link, when it opened one): `rdma: false` is
/// plain HTTP; a cuObject target needs the link to mint tokens (plain HTTP
/// without it); a hipobj-rc-v2 target without the link sends its bytes
/// over HTTP, never with an s3dma token.
#[must_use]
pub fn dialect_for(target: &TargetClient, qp_link: Option<&Arc<QpLink>>) -> Arc<dyn ChunkMover> {
    if !target.rdma {
        return Arc::new(plain::Plain);
    }
    match (target.protocol, qp_link) {
        (RdmaProtocol::S3dma, _) => Arc::new(s3dma::S3dma),
        (RdmaProtocol::CuobjectDc, Some(link)) => Arc::new(cuobject_dc::CuobjectDc {
            link: Arc::clone(link),
        }),
        (RdmaProtocol::CuobjectDc, None) => Arc::new(plain::Plain),
        (RdmaProtocol::HipobjRcV2, link) => Arc::new(hipobj::HipobjRc {
            link: link.cloned(),
        }),
    }
}
