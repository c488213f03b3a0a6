#![warn(missing_docs)]
//! s3dma's wire formats and plans, with no I/O (in the manner of
//! quinn-proto): every decoder that reads bytes from a peer lives here, is a
//! pure function of its input, and is what the fuzz targets in
//! `wire/fuzz` drive.
//!
//! * [`token`]: the `x-amz-rdma-token` codec and the remote buffer it grants;
//! * [`frame`]: the fabric's versioned frames (handshake, request and
//!   response headers) and the responder's per-request decision
//!   ([`frame::Incoming`]);
//! * [`handshake`]: the pre-shared [`FabricKey`] and its HMAC proofs;
//! * [`qp`]: the verbs backend's queue-pair exchange message;
//! * [`status`]: the verbs-like completion status both backends report;
//! * [`headers`]: the `x-amz-rdma-*` HTTP header names and how a reply's
//!   values are read;
//! * [`hipobj`]: AMD's `hipobj-rc-v2` control plane (the RC token,
//!   PREPARE / READY / CANCEL and their replies);
//! * [`dc`]: the cuObject dialect's DC rules that need no device (retry
//!   budget, the fence of an abandoned window, tokens minted for exactly a
//!   window, the address-handle cache);
//! * [`rails`]: which fabric rail a chunk or part goes over (the
//!   dpu-agent's selector: up/down, failback trials, load and rate);
//! * [`range`]: byte ranges of objects (`Range`, `Content-Range`);
//! * [`lease`]: the lease frames that pass tenant memory (file
//!   descriptors) to the host-shim on its Unix socket;
//! * [`plan`]: the dpu-agent's transfer planner (which S3 requests a GET or
//!   PUT becomes) and the storage-target's RDMA chunk plan;
//! * [`rendezvous`]: which target of a group serves a chunk (rendezvous
//!   hashing), so gateways cache distinct shares of an object;
//! * [`batch`]: the s3dma batch request (many HEADs, GETs and PUTs, each
//!   with its own window, as one signed request) and its reply.

pub mod batch;
pub mod dc;
pub mod frame;
pub mod handshake;
pub mod headers;
pub mod hipobj;
pub mod lease;
pub mod plan;
pub mod qp;
pub mod rails;
pub mod range;
pub mod rendezvous;
pub mod status;
pub mod token;

pub use handshake::FabricKey;
pub use status::OpStatus;
pub use token::{EndpointAddr, RdmaToken, RemoteBuf, TokenError};
