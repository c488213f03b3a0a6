#![warn(missing_docs)]
//! The dpu-agent: s3dma's offload service on the DPU's Arm cores.
//!
//! Host-shims call its gRPC API ([`service`]) through its gate ([`gate`]:
//! connection limits, and the shim authenticated ([`auth`]) before a
//! request body is read), checks the tenant's policy ([`policy`]) and quotas
//! ([`quota`]), plans the transfer without I/O ([`plan`]), and runs it
//! ([`transfer`]) as SigV4-signed S3 requests ([`s3`]) that carry
//! `x-amz-rdma-token`s for slices of the tenant's window, falling back to
//! plain HTTP through its own registered staging memory when a target
//! declines RDMA. For a dialect whose queue pair lives beside the tenant's
//! memory (hipobj-rc-v2, [`transfer::dialect::hipobj`]) it drives the calling shim's
//! RDMA device over that shim's `QueuePairs` stream ([`qp_link`]).
//! Configuration is one YAML file ([`config`]).

pub mod app;
pub mod auth;
pub mod config;
pub mod error;
pub mod gate;
pub mod metrics;
pub mod names;
pub mod policy;
pub mod qp_link;
pub mod quota;
pub mod retry;
pub mod s3;
pub mod service;
pub mod transfer;

/// Transfer planning (pure; lives in `s3dma-wire`).
pub use s3dma_wire::plan;
