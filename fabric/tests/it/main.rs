//! fabric's integration tests, one binary (`cargo test -p fabric --test it`):
//! the conformance suite both backends pass, the tcp backend's wire protocol
//! against hostile peers, and (feature `cuda`) device memory.

mod conformance;
mod cuda;
mod tcp_protocol;
