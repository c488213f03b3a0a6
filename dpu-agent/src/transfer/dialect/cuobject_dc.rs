//! The cuObject dialect (`protocol: cuobject-dc`, the shims' DC targets):
//! a ranged GET or a PUT carries a standard token the calling shim minted
//! for exactly the slice, naming its DC target, under the target's
//! `token_header` and without s3dma's marker. A shim that cannot mint one
//! (its device has no DC) sends that request over plain HTTP.

use std::sync::Arc;

use fabric::RdmaToken;
use futures::future::BoxFuture;
use tracing::debug;

use super::mover::{ChunkMover, SentToken};
use crate::error::AgentError;
use crate::qp_link::QpLink;
use crate::transfer::exchange::Exchange;

/// Tokens minted by the calling shim over its `QueuePairs` link.
#[derive(Debug)]
pub struct CuobjectDc {
    /// The calling shim's link.
    pub link: Arc<QpLink>,
}

impl ChunkMover for CuobjectDc {
    /// Rail 0 only: the calling shim's `QueuePairs` link resolves the
    /// slot on its device, and choosing the shim's device per rail (a new
    /// transfer on another rail for a redo) is not done yet.
    fn rails(&self) -> bool {
        false
    }

    fn token<'a>(
        &'a self,
        ex: &'a Exchange,
        slot: &'a RdmaToken,
    ) -> BoxFuture<'a, Result<Option<SentToken>, AgentError>> {
        Box::pin(async move {
            match self
                .link
                .mint_dc_token(slot, ex.core.settings.attempt_timeout)
                .await
            {
                Ok(t) => SentToken::new(ex, &t, false).map(Some),
                Err(e) => {
                    debug!(target = %ex.target.name, error = %e, "no DC token from the shim: over HTTP");
                    Ok(None)
                }
            }
        })
    }
}
