//! Plain HTTP (`rdma: false`, and a cuObject target whose calling shim has
//! no `QueuePairs` link): no token; every byte goes through the agent's
//! staging memory ([`crate::transfer::fallback`]).

use super::mover::ChunkMover;

/// No RDMA: every default of [`ChunkMover`].
#[derive(Debug)]
pub struct Plain;

impl ChunkMover for Plain {}
