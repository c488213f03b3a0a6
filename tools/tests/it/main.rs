//! The tools' integration tests, one binary (`it`): `bench` (a quick
//! bench and a short soak against the real service binaries) and `probe`
//! (the probe against a storage-target and a plain S3 server).

mod bench;
mod common;
mod probe;
