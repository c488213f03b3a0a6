//! [`RemoteTarget`]: an S3-over-RDMA server elsewhere that a local stack's
//! dpu-agent and host-shim talk to directly (`s3dma local --target URL
//! --protocol P`), with no storage-target of the stack's own (a leaf: the
//! stack and `s3dma-local` both use it).

use dpu_agent::config::RdmaProtocol;

/// A server speaking one of the dialects, and who the tenant is there.
/// `Debug` does not show the secret.
#[derive(Clone)]
pub struct RemoteTarget {
    /// Its S3 endpoint, `http(s)://HOST:PORT` (the endpoint-URL rule of
    /// every target: [`s3dma_config::check_endpoint_url`]).
    pub endpoint: String,
    /// The dialect it speaks: `s3dma` (a storage-target or gateway of
    /// another stack), `hipobj-rc-v2` (AMD's RC dialect: needs the verbs
    /// fabric, the shim's device holds the queue pairs) or `cuobject-dc`
    /// (NVIDIA's DC dialect: an mlx5 device with DC).
    pub protocol: RdmaProtocol,
    /// Its SigV4 region (default: `us-east-1`).
    pub region: Option<String>,
    /// The tenant's access key id there.
    pub access_key_id: String,
    /// The tenant's secret access key there.
    pub secret_access_key: String,
    /// The fabric key of the server's endpoint (`protocol: s3dma`: an
    /// s3dma storage-target authenticates the fabric sessions it opens to
    /// the host-shim with it), written to the stack's `fabric.key` in
    /// place of a generated one. `None` for the other dialects.
    pub fabric_key: Option<String>,
}

impl std::fmt::Debug for RemoteTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteTarget")
            .field("endpoint", &self.endpoint)
            .field("protocol", &self.protocol)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_secret() {
        let r = RemoteTarget {
            endpoint: "http://127.0.0.1:9000".into(),
            protocol: RdmaProtocol::HipobjRcV2,
            region: None,
            access_key_id: "AKREMOTE".into(),
            secret_access_key: "very-secret".into(),
            fabric_key: Some("fabric-secret".into()),
        };
        let d = format!("{r:?}");
        assert!(d.contains("AKREMOTE") && d.contains("HipobjRcV2"), "{d}");
        assert!(
            !d.contains("very-secret") && !d.contains("fabric-secret"),
            "{d}"
        );
    }
}
