//! Test fixtures shared by the configuration's test modules.

use std::path::Path;

use super::{Config, parse};

/// A minimal valid configuration.
pub(super) const BASE: &str = "\
listen:
  address: 127.0.0.1:7000
shims:
  - name: host1
    token_file: /etc/s3dma/host1.token
    tenants: [alice]
tenants:
  - name: alice
    access_key_id: AKALICE
    secret_access_key_file: /etc/s3dma/alice.secret
    allow:
      - bucket: alice-data
        write: true
targets:
  - name: local
    endpoint: http://127.0.0.1:9000
    buckets: [\"*\"]
fabric:
  fabric_key_file: /etc/s3dma/fabric.key
";

pub(super) fn p() -> &'static Path {
    Path::new("/etc/s3dma/agent.yaml")
}

pub(super) fn base() -> Config {
    parse(p(), BASE).unwrap()
}

pub(super) fn parse_err(text: &str) -> String {
    parse(p(), text).unwrap_err().to_string()
}
