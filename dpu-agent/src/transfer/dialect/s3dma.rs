//! s3dma's own dialect (`protocol: s3dma`, storage-target and gateways):
//! a ranged GET or a PUT carries the window slice's own token with the
//! signed marker `x-amz-rdma-protocol: s3dma-v1`; the target moves the
//! bytes and answers `x-amz-rdma-reply`.

use fabric::RdmaToken;
use futures::future::BoxFuture;

use super::mover::{ChunkMover, SentToken};
use crate::error::AgentError;
use crate::transfer::exchange::Exchange;

/// s3dma-v1 tokens.
#[derive(Debug)]
pub struct S3dma;

impl ChunkMover for S3dma {
    fn token<'a>(
        &'a self,
        ex: &'a Exchange,
        slot: &'a RdmaToken,
    ) -> BoxFuture<'a, Result<Option<SentToken>, AgentError>> {
        let token = SentToken::new(ex, &slot.to_string(), true);
        Box::pin(std::future::ready(token.map(Some)))
    }
}
