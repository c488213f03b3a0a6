//! AMD's hipobj-rc-v2 dialect as a server: `POST /.hipobj-rc/prepare`,
//! `/ready` and `/cancel` (the wire format is [`s3dma_wire::hipobj`]'s).
//!
//! Every control request is SigV4-verified ahead of s3s ([`ControlAuth`]:
//! the credential scope's service `s3` or `hipobj`, no payload hash needed
//! for the body-less requests, a `403` for every auth failure).
//!
//! * PREPARE (SigV4-signed, every `x-amz-rdma-*` header among the signed
//!   ones, which the pre-check enforces for every `x-amz-*` header): the
//!   client's GID must be in `rdma.allowed_client_networks`; the caps are
//!   taken (sessions and staging bytes, per user and in all), the
//!   object is read for a GET through the same S3 handler as an HTTP GET
//!   (permissions, conditions, the range), a queue pair is created and
//!   brought to RTR/RTS against the client's, and for a PUT the receive its
//!   WRITE_WITH_IMM will consume is posted. The reply names the server's
//!   QP, a session id, the server's PSN and, for a PUT, the staging region.
//! * READY (same user, same cookie, the client's QP): the data phase. A GET
//!   is one RDMA WRITE_WITH_IMM of the staged bytes into the client's
//!   buffer, the immediate being the cookie; a PUT waits for the client's
//!   WRITE_WITH_IMM, checks opcode, immediate and byte count, and only then
//!   stores the bytes through the S3 handler (checksums, ETag, durability).
//!   The reply is the final outcome: the cookie, the bytes, the ETag, the
//!   CRC64NVME of the bytes.
//! * CANCEL: `204` whatever the session's state or owner; only the owner's
//!   cancel ends a session.
//!
//! Sessions expire `prepared_timeout_secs` after PREPARE (a reaper frees
//! them); a (QP number, PSN) pair of the server is never reused while the
//! recent-pairs ring remembers it, and a client's (GID, QP, PSN) never
//! prepares twice.

mod auth;
mod control;
#[cfg(feature = "verbs")]
mod front;
#[cfg(feature = "verbs")]
mod route;
#[cfg(feature = "verbs")]
mod service;
#[cfg(feature = "verbs")]
mod session;

pub use auth::{CONTROL_SERVICES, ControlAuth, ControlCaller};
pub use control::{ControlPathNames, HipobjUnsupported};
#[cfg(feature = "verbs")]
pub use front::{GatewayFront, HipobjFront, StoreFront};
#[cfg(feature = "verbs")]
pub use route::HipobjRoute;
#[cfg(feature = "verbs")]
pub use service::HipobjService;

#[cfg(feature = "verbs")]
use std::sync::Arc;

/// Why a storage-target built without the `verbs` feature answers every
/// hipobj-rc-v2 control request as unsupported (RC queue pairs need it).
#[cfg(not(feature = "verbs"))]
pub const NO_VERBS_FEATURE: &str = "this storage-target was built without the verbs feature";

/// The hipobj-rc-v2 server over `front` (answering every control request
/// as unsupported without a verbs device or with `rdma.hipobj.enabled:
/// false`).
#[cfg(feature = "verbs")]
pub fn route(
    cfg: &crate::config::Config,
    rdma: &Arc<crate::rdma::RdmaService>,
    front: Arc<dyn HipobjFront>,
) -> impl s3s::route::S3Route {
    let rails = if cfg.rdma.hipobj.enabled {
        rdma.verbs_domains()
    } else {
        Vec::new()
    };
    let why = if cfg.rdma.hipobj.enabled {
        rdma.no_verbs_reason()
    } else {
        "rdma.hipobj.enabled is false"
    };
    let hipobj = HipobjService::new(
        rails,
        why,
        front,
        cfg.rdma.hipobj.with_tenants(&cfg.rdma.tenant_users),
        rdma.client_networks().clone(),
        Arc::clone(rdma.metrics()),
    );
    hipobj.spawn_reaper();
    HipobjRoute(hipobj)
}
