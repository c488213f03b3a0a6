//! `rdma.dc:`, the cuObject dialect's DC transport (standard tokens).

use s3dma_config::ConfigError;
use serde::Deserialize;

/// `rdma.dc:` — serving standard (cuObject) tokens: the client's memory
/// behind its DC target, written (GET) or read (PUT, UploadPart) by this
/// server's DC initiators. Needs a build with the `dc` feature, `rdma:
/// {mode: enabled, backend: verbs}` and an mlx5 device with DC (ConnectX-5
/// or newer, BlueField); otherwise standard tokens are declined with
/// `x-amz-rdma-reply: 501` (a GET served over HTTP, a PUT storing nothing).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct DcConfig {
    /// Whether standard tokens are served over DC when the device can.
    /// Default `true`.
    #[serde(default = "default_enabled")]
    pub enabled: bool,
    /// DC initiators (queue pairs) operations go round robin over. Default
    /// 4; 1 to 64.
    #[serde(default = "default_initiators")]
    pub initiators: usize,
    /// Work requests in flight per initiator (its send and completion
    /// queue depth). Default 256; 1 to 4096.
    #[serde(default = "default_depth")]
    pub depth: u32,
    /// The DC key clients' targets were created with. Default
    /// `0xffeeddcc`, the value of NVIDIA's sample that cuObject, MinIO's
    /// libs3rdma and NIXL all use: it is no secret and keeps no one out
    /// (each token grants only its request's window for its lifetime).
    #[serde(default = "default_dc_key")]
    pub dc_key: u64,
    /// Traffic class of the packets (RoCE DSCP/ECN). Default 96,
    /// cuObject's.
    #[serde(default = "default_traffic_class")]
    pub traffic_class: u8,
    /// Hop limit of the packets. Default 64; 1 to 255.
    #[serde(default = "default_hop_limit")]
    pub hop_limit: u8,
    /// Address handles kept (one per client port; least recently used
    /// evicted). Default 1024; 1 to 65536.
    #[serde(default = "default_max_address_handles")]
    pub max_address_handles: usize,
}

impl Default for DcConfig {
    fn default() -> Self {
        DcConfig {
            enabled: default_enabled(),
            initiators: default_initiators(),
            depth: default_depth(),
            dc_key: default_dc_key(),
            traffic_class: default_traffic_class(),
            hop_limit: default_hop_limit(),
            max_address_handles: default_max_address_handles(),
        }
    }
}

fn default_enabled() -> bool {
    true
}
fn default_initiators() -> usize {
    4
}
fn default_depth() -> u32 {
    256
}
fn default_dc_key() -> u64 {
    s3dma_wire::dc::DEFAULT_DC_KEY
}
fn default_traffic_class() -> u8 {
    s3dma_wire::dc::DEFAULT_TRAFFIC_CLASS
}
fn default_hop_limit() -> u8 {
    64
}
fn default_max_address_handles() -> usize {
    1024
}

impl DcConfig {
    /// Checks the ranges above.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the field.
    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let bad = |f: &str, m: &str| {
            Err(ConfigError::invalid(
                file,
                format!("rdma.dc.{f}"),
                m.to_owned(),
            ))
        };
        if !(1..=64).contains(&self.initiators) {
            return bad("initiators", "must be between 1 and 64");
        }
        if !(1..=4096).contains(&self.depth) {
            return bad("depth", "must be between 1 and 4096");
        }
        if self.hop_limit == 0 {
            return bad("hop_limit", "must be between 1 and 255");
        }
        if !(1..=65_536).contains(&self.max_address_handles) {
            return bad("max_address_handles", "must be between 1 and 65536");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_cuobjects_and_ranges_are_checked() {
        let c = DcConfig::default();
        assert!(c.validate("t").is_ok());
        assert_eq!(c.dc_key, 0xffee_ddcc);
        assert_eq!(c.traffic_class, 96);
        let parsed: DcConfig = serde_yaml::from_str("dc_key: 0x1234\n").unwrap();
        assert_eq!(parsed.dc_key, 0x1234);
        for (yaml, field) in [
            ("initiators: 0", "rdma.dc.initiators"),
            ("depth: 5000", "rdma.dc.depth"),
            ("hop_limit: 0", "rdma.dc.hop_limit"),
            ("max_address_handles: 0", "rdma.dc.max_address_handles"),
        ] {
            let c: DcConfig = serde_yaml::from_str(yaml).unwrap();
            let e = c.validate("t").unwrap_err().to_string();
            assert!(e.contains(field), "{yaml}: {e}");
        }
        assert!(serde_yaml::from_str::<DcConfig>("dc_kee: 1").is_err());
    }
}
