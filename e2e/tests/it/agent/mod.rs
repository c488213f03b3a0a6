//! dpu-agent's end-to-end tests (`cargo test -p s3dma-e2e --test it --
//! agent::`; one suite: `... -- agent::transfers::`). They start storage-target,
//! dpu-agent (and Ceph for `gateway` and `fallback`, one cluster per run)
//! as processes through the launcher's harness (`common`).

mod batch_target;
mod common;
mod fallback;
mod gateway;
mod qp_link;
mod rails;
mod security;
mod short_objects;
mod transfers;
