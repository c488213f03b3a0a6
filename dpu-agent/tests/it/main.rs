//! dpu-agent's integration tests, one binary (`cargo test -p dpu-agent --test it`;
//! one suite: `... --test it transfers::`). They start storage-target,
//! dpu-agent (and Ceph for `gateway` and `fallback`, one cluster per run)
//! as processes through the launcher's harness (`common`).

mod common;
mod fallback;
mod gateway;
mod qp_link;
mod security;
mod transfers;
