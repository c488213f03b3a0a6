//! storage-target's integration tests, one binary (`cargo test -p storage-target --test it`;
//! one suite: `... --test it auth::`). Each module starts the real
//! `storage-target` binary on free loopback ports (`common`) and drives it
//! with real S3 clients.

mod auth;
mod batch;
mod checksums;
mod common;
mod conn_fairness;
mod copy_budget;
mod crash;
mod dc;
mod hardening;
mod hipobj;
mod rdma;
mod rdma_backoff;
mod s3_api;
mod support;
