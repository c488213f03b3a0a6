//! `rdma.batch:`, the caps of s3dma batch requests (`POST /?s3dma-batch`,
//! [`s3dma_wire::batch`]).

use s3dma_config::{ByteSize, ConfigError};
use serde::Deserialize;

/// `rdma.batch:` — how much one batch request may ask of this server.
#[derive(Debug, Clone, Copy, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Whether batch requests are served (with a filesystem store; the
    /// gateway always declines them with `501`). Default `true`.
    #[serde(default = "default_enabled")]
    pub enabled: bool,
    /// Most items in one batch; more is refused whole (`413
    /// EntityTooLarge`). Default 1000; 1 to 10000.
    #[serde(default = "default_max_items")]
    pub max_items: usize,
    /// Largest request body (the JSON item list); larger is refused whole
    /// before it is read (`413`). Default `2MiB`; `1KiB` to `8MiB`.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: ByteSize,
    /// Most window bytes (the GET and PUT items' token sizes added up) one
    /// batch may move; more is refused whole (`413`). Default `256MiB`;
    /// `4KiB` to `16GiB`.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: ByteSize,
    /// Items of one batch served at once. Default 16; 1 to 256.
    #[serde(default = "default_item_concurrency")]
    pub item_concurrency: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            enabled: default_enabled(),
            max_items: default_max_items(),
            max_body_bytes: default_max_body_bytes(),
            max_bytes: default_max_bytes(),
            item_concurrency: default_item_concurrency(),
        }
    }
}

fn default_enabled() -> bool {
    true
}
fn default_max_items() -> usize {
    1000
}
fn default_max_body_bytes() -> ByteSize {
    ByteSize(2 << 20)
}
fn default_max_bytes() -> ByteSize {
    ByteSize(256 << 20)
}
fn default_item_concurrency() -> usize {
    16
}

impl BatchConfig {
    /// Checks the ranges above.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the field.
    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let bad = |f: &str, m: &str| {
            Err(ConfigError::invalid(
                file,
                format!("rdma.batch.{f}"),
                m.to_owned(),
            ))
        };
        if !(1..=s3dma_wire::batch::MAX_ITEMS).contains(&self.max_items) {
            return bad("max_items", "must be between 1 and 10000");
        }
        if !(1 << 10..=s3dma_wire::batch::MAX_BODY as u64).contains(&self.max_body_bytes.0) {
            return bad("max_body_bytes", "must be between 1KiB and 8MiB");
        }
        if !(4 << 10..=16 << 30).contains(&self.max_bytes.0) {
            return bad("max_bytes", "must be between 4KiB and 16GiB");
        }
        if !(1..=256).contains(&self.item_concurrency) {
            return bad("item_concurrency", "must be between 1 and 256");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_ranges() {
        let d = BatchConfig::default();
        assert!(d.validate("t").is_ok());
        let parsed: BatchConfig = serde_yaml::from_str("{}").unwrap();
        assert_eq!(parsed.max_items, 1000);
        for (bad, field) in [
            (BatchConfig { max_items: 0, ..d }, "max_items"),
            (
                BatchConfig {
                    max_items: 10_001,
                    ..d
                },
                "max_items",
            ),
            (
                BatchConfig {
                    max_body_bytes: ByteSize(9 << 20),
                    ..d
                },
                "max_body_bytes",
            ),
            (
                BatchConfig {
                    max_bytes: ByteSize(1),
                    ..d
                },
                "max_bytes",
            ),
            (
                BatchConfig {
                    item_concurrency: 0,
                    ..d
                },
                "item_concurrency",
            ),
        ] {
            let e = bad.validate("t").unwrap_err().to_string();
            assert!(e.contains(&format!("rdma.batch.{field}")), "{e}");
        }
        assert!(serde_yaml::from_str::<BatchConfig>("nope: 1").is_err());
    }
}
