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
    /// Over every rail: the calling shim mints each rail's standard token
    /// naming its DC target on that rail's device (the target serves it
    /// from its rail facing that GID). Only with a bounded DC retry
    /// budget ([`ChunkMover::late_writes`]).
    fn rails(&self) -> bool {
        self.late_writes().is_some()
    }

    /// A DC write the target posted before the chunk failed may keep
    /// retrying for the DC retry budget (the settings the shim's DC
    /// targets and the target's initiators use), so a redo waits it out.
    fn late_writes(&self) -> Option<std::time::Duration> {
        s3dma_wire::dc::RetrySettings::default().budget().ok()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::dialect::hipobj::HipobjRc;

    /// DC chunks go over every rail, and a GET chunk's redo waits out the
    /// DC retry budget the shim's fence uses; the other dialects' failed
    /// transfers cannot write late, so their redos start at once.
    #[test]
    fn dc_stripes_and_its_redo_waits_out_the_dc_retry_budget() {
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        let dc = CuobjectDc {
            link: Arc::new(QpLink::new(tx)),
        };
        let budget = s3dma_wire::dc::RetrySettings::default().budget().unwrap();
        assert!(!budget.is_zero());
        assert!(dc.rails());
        assert_eq!(dc.late_writes(), Some(budget));
        let rc = HipobjRc { link: None };
        assert!(rc.rails());
        assert_eq!(rc.late_writes(), None);
        assert_eq!(crate::transfer::dialect::s3dma::S3dma.late_writes(), None);
    }
}
