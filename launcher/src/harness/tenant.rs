//! The test's side of the agent: a stand-in for a host-shim (a gRPC client
//! with a bearer token) and tenant memory on the harness's fabric.

use fabric::{Access, Domain, Endpoint, EndpointConfig, Region, Window};
use s3dma_proto::agent::v1 as pb;
use s3dma_proto::agent::v1::agent_client::AgentClient;
use tonic::transport::Channel;

use sha2::Digest as _;

use super::*;

/// The test's stand-in for a host-shim: a gRPC client with a bearer token.
#[derive(Clone, Debug)]
pub struct Shim {
    /// The gRPC client.
    pub inner: AgentClient<Channel>,
    /// The bearer token sent (none when empty).
    pub token: String,
}

impl Shim {
    /// `msg` as a request carrying the bearer token.
    pub fn req<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if !self.token.is_empty() {
            r.metadata_mut().insert(
                "authorization",
                format!("Bearer {}", self.token).parse().unwrap(),
            );
        }
        r
    }

    /// A GetObject for `tenant` into `token`'s memory.
    pub async fn get(
        &self,
        tenant: &str,
        bucket: &str,
        key: &str,
        range: Option<pb::byte_range::Kind>,
        dest: &str,
    ) -> Result<pb::GetObjectResponse, tonic::Status> {
        let msg = pb::GetObjectRequest {
            destination_rails: Vec::new(),
            tenant: tenant.into(),
            bucket: bucket.into(),
            key: key.into(),
            range: range.map(|k| pb::ByteRange { kind: Some(k) }),
            destination: dest.into(),
            if_match: String::new(),
        };
        self.inner
            .clone()
            .get_object(self.req(msg))
            .await
            .map(tonic::Response::into_inner)
    }

    /// A PutObject for `tenant` from `token`'s memory.
    pub async fn put(
        &self,
        tenant: &str,
        bucket: &str,
        key: &str,
        src: &str,
    ) -> Result<pb::PutObjectResponse, tonic::Status> {
        let msg = pb::PutObjectRequest {
            source_rails: Vec::new(),
            tenant: tenant.into(),
            bucket: bucket.into(),
            key: key.into(),
            source: src.into(),
            content_type: "application/octet-stream".into(),
            metadata: [("origin".to_owned(), "s3dma-test".to_owned())].into(),
        };
        self.inner
            .clone()
            .put_object(self.req(msg))
            .await
            .map(tonic::Response::into_inner)
    }
}

/// Tenant memory on the harness's fabric ([`backend`]), served by its own
/// endpoint.
#[derive(Debug)]
pub struct Memory {
    /// The endpoint serving the region.
    pub endpoint: Endpoint,
    /// The registered memory.
    pub region: Region,
}

impl Memory {
    /// `len` bytes of registered memory on a fresh domain, served on loopback.
    pub async fn new(len: usize) -> Memory {
        let domain = Domain::open(backend()).expect("open the test fabric");
        let region = domain.alloc(len, Access::ALL).unwrap();
        let endpoint = Endpoint::listen(
            &domain,
            EndpointConfig::new("127.0.0.1:0".parse().unwrap(), fabric_key()),
        )
        .await
        .unwrap();
        Memory { endpoint, region }
    }

    /// A window over `[off, off+len)` and its token.
    pub fn window(&self, off: usize, len: usize, access: Access) -> (Window, String) {
        let w = self.region.window(off, len, access, None).unwrap();
        let t = self.endpoint.token(&w).unwrap().to_string();
        (w, t)
    }

    /// Writes `data` at `off`.
    pub fn fill(&self, off: usize, data: &[u8]) {
        for (i, c) in data.chunks(16 << 20).enumerate() {
            self.region.write_at(off + i * (16 << 20), c).unwrap();
        }
    }

    /// Reads `len` bytes at `off`.
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        for (i, c) in v.chunks_mut(16 << 20).enumerate() {
            self.region.read_at(off + i * (16 << 20), c).unwrap();
        }
        v
    }

    /// SHA-256 (hex) of `len` bytes at `off`.
    pub fn sha256(&self, off: usize, len: usize) -> String {
        let mut h = sha2::Sha256::new();
        let mut buf = vec![0; (16 << 20).min(len.max(1))];
        let mut done = 0;
        while done < len {
            let n = buf.len().min(len - done);
            self.region.read_at(off + done, &mut buf[..n]).unwrap();
            h.update(&buf[..n]);
            done += n;
        }
        hex::encode(h.finalize())
    }

    /// Fills the region with `byte`.
    pub fn clear(&self, byte: u8) {
        let chunk = vec![byte; 16 << 20];
        let mut off = 0;
        while off < self.region.len() {
            let n = chunk.len().min(self.region.len() - off);
            self.region.write_at(off, &chunk[..n]).unwrap();
            off += n;
        }
    }
}
