#![warn(missing_docs)]
//! s3dma's host-shim: the tenant API (`s3dma.tenant.v1`) on a Unix socket.
//!
//! * [`socket`]: binds the socket, takes each connection's peer credentials
//!   (`SO_PEERCRED`), serves leases (memfds passed with `SCM_RIGHTS`) and
//!   hands HTTP/2 connections to tonic.
//! * [`registry`]: tenants (from uid/gid), their leases and buffers, limits.
//! * [`service`]: the gRPC service: per-request windows, forwarding to the agent.
//! * [`ring`]: submission rings passed on leases (GET, PUT, HEAD without a
//!   gRPC message per object), each entry run through [`service`].
//! * [`agent_link`]: the channel to the dpu-agent, reconnected with backoff.
//! * `qp_link` (feature `verbs`): the queue pairs the agent drives on this
//!   host's RDMA device for hipobj-rc-v2 transfers.
//! * [`config`], [`metrics`], [`error`], [`app`] (wiring).
//!
//! See `docs/ARCHITECTURE.md` ("host-shim").
pub mod admission;
pub mod agent_link;
pub mod app;
pub mod config;
pub mod error;
pub mod metrics;
#[cfg(feature = "verbs")]
pub mod qp_link;
pub mod registry;
pub mod ring;
pub mod service;
pub mod socket;
