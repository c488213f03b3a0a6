//! cuObject's standard token (no `x-amz-rdma-protocol` marker): the
//! client's memory behind a DC target, served over this server's DC
//! initiators when its device does DC (`rdma.dc`, mlx5 only, the `dc`
//! feature); declined with `501` otherwise.

use std::sync::Arc;

use fabric::pool::{PoolObserver, SessionPool};
use fabric::{Domain, FabricKey, RdmaToken};
#[cfg(feature = "dc")]
use tracing::{info, warn};

use super::{Declined, Dialect, Offer, Serving};
use crate::config::rdma::RdmaConfig;
use crate::rdma::error::RdmaError;

/// Why a standard token is declined, in the reply's words.
pub(super) const DECLINED: &str = "this server serves RDMA tokens only in s3dma's exchange (x-amz-rdma-protocol: s3dma-v1) and hipobj-rc-v2 (/.hipobj-rc/); it has no DC transport for a standard token";

/// What the standard dialect makes of the token `text`: a well-formed one
/// with a GID is served over DC when this server has DC sessions, and
/// declined otherwise (as is a raw hipobj-rc-v2 token).
///
/// # Errors
/// [`RdmaError::InvalidToken`] for a token that is neither a standard nor a
/// hipobj-rc-v2 one (a malformed token is still the client's error).
pub(crate) fn offer(text: &str, serving: &Serving<'_>) -> Result<Offer, RdmaError> {
    let parsed = RdmaToken::parse(text);
    if let Err(e) = &parsed
        && s3dma_wire::hipobj::RcToken::parse(text).is_err()
    {
        return Err(RdmaError::InvalidToken(e.clone()));
    }
    Ok(match parsed {
        Ok(token) if serving.dc && token.gid_valid => Offer::Serve(Dialect::CuobjectDc, token),
        _ => Offer::Decline(Declined::StandardToken),
    })
}

/// The DC sessions of one rail's verbs domain when its device does DC
/// (`rdma.dc`, `dc` feature), reporting to the rail's pool gauges; `None`
/// (that rail serves no standard token) otherwise, logged with the
/// reason.
#[cfg(feature = "dc")]
pub(crate) fn sessions(
    cfg: &RdmaConfig,
    domain: &Domain,
    key: &FabricKey,
    observer: &Arc<dyn PoolObserver>,
) -> Option<Arc<SessionPool>> {
    use fabric::verbs::dc_session::{DcInitiator, DcInitiatorConfig};
    if !cfg.dc.enabled || domain.backend() != fabric::Backend::Verbs {
        return None;
    }
    let probe = match fabric::verbs::dc::probe(domain) {
        Ok(p) => p,
        Err(e) => {
            info!(reason = %e, "no DC: standard (cuObject) tokens are declined with 501");
            return None;
        }
    };
    let dc = &cfg.dc;
    let init = DcInitiator::new(
        domain,
        DcInitiatorConfig {
            initiators: dc.initiators,
            dci: fabric::verbs::dc::DciConfig {
                depth: dc.depth,
                ..fabric::verbs::dc::DciConfig::default()
            },
            dc_key: dc.dc_key,
            traffic_class: dc.traffic_class,
            hop_limit: dc.hop_limit,
            max_address_handles: dc.max_address_handles,
        },
    );
    match init {
        Ok(init) => {
            info!(device = %probe.device, port = probe.port, initiators = dc.initiators, "serving standard (cuObject) tokens over DC");
            Some(SessionPool::dc(
                init,
                key.clone(),
                cfg.max_ops_per_session,
                Arc::clone(observer),
            ))
        }
        Err(e) => {
            warn!(error = %e, "creating the DC initiators failed: standard tokens are declined with 501");
            None
        }
    }
}

/// Without the `dc` feature standard tokens are always declined.
#[cfg(not(feature = "dc"))]
pub(crate) fn sessions(
    _cfg: &RdmaConfig,
    _domain: &Domain,
    _key: &FabricKey,
    _observer: &Arc<dyn PoolObserver>,
) -> Option<Arc<SessionPool>> {
    None
}
