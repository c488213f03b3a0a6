//! Plain HTTP (`rdma: false`, and a cuObject target whose calling shim has
//! no `QueuePairs` link): no token; every byte goes through the agent's
//! staging memory ([`crate::transfer::fallback`]).

use fabric::RdmaToken;
use futures::future::BoxFuture;

use super::mover::{ChunkMover, SentToken};
use crate::error::AgentError;
use crate::transfer::exchange::Exchange;

/// No RDMA.
#[derive(Debug)]
pub struct Plain;

impl ChunkMover for Plain {
    fn token<'a>(
        &'a self,
        _ex: &'a Exchange,
        _slot: &'a RdmaToken,
    ) -> BoxFuture<'a, Result<Option<SentToken>, AgentError>> {
        Box::pin(std::future::ready(Ok(None)))
    }
}
