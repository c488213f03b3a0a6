//! SigV4 signing with aws-sigv4, one [`Signer`] per tenant.
//!
//! Every header the agent puts on a request is signed, so an
//! `x-amz-rdma-token` is always among the SignedHeaders (the target refuses
//! RDMA requests whose token is not). Payloads are `UNSIGNED-PAYLOAD`: RDMA
//! requests have none, and fallback bodies come from the tenant's window,
//! which the agent would otherwise have to hash on its slow cores.

use std::fmt;
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode, sign,
};
use aws_smithy_runtime_api::client::identity::Identity;
use http::{HeaderMap, HeaderName, HeaderValue};

/// Signs requests with one tenant's credentials.
pub struct Signer {
    identity: Identity,
    access_key_id: String,
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret.
        f.debug_struct("Signer")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// Why a request could not be signed.
#[derive(Debug, thiserror::Error)]
#[error("cannot sign the request: {0}")]
pub struct SignError(String);

impl Signer {
    /// A signer for `access_key_id` / `secret`.
    #[must_use]
    pub fn new(access_key_id: &str, secret: &str) -> Signer {
        let creds = Credentials::new(access_key_id, secret, None, None, "dpu-agent-config");
        Signer {
            identity: creds.into(),
            access_key_id: access_key_id.to_owned(),
        }
    }

    /// The access key id (not secret).
    #[must_use]
    pub fn access_key_id(&self) -> &str {
        &self.access_key_id
    }

    /// Adds `x-amz-date`, `x-amz-content-sha256: UNSIGNED-PAYLOAD` and
    /// `authorization` to `headers` (which must already hold `host` and
    /// everything else to sign) for `method` on `url` in `region`.
    ///
    /// # Errors
    /// A header value that is not valid for signing.
    pub fn sign(
        &self,
        method: &str,
        url: &str,
        region: &str,
        headers: &mut HeaderMap,
        now: SystemTime,
    ) -> Result<(), SignError> {
        let mut settings = SigningSettings::default();
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        // S3 signs the path as sent: encoded once, not normalised.
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&self.identity)
            .region(region)
            .name("s3")
            .time(now)
            .settings(settings)
            .build()
            .map_err(|e| SignError(e.to_string()))?
            .into();
        let pairs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| {
                v.to_str()
                    .map(|v| (k.as_str(), v))
                    .map_err(|_| SignError(format!("header {k} is not visible ASCII")))
            })
            .collect::<Result<_, _>>()?;
        let signable = SignableRequest::new(
            method,
            url,
            pairs.into_iter(),
            SignableBody::UnsignedPayload,
        )
        .map_err(|e| SignError(e.to_string()))?;
        let (instructions, _signature) = sign(signable, &params)
            .map_err(|e| SignError(e.to_string()))?
            .into_parts();
        let (new_headers, _params) = instructions.into_parts();
        for h in new_headers {
            let name = HeaderName::from_bytes(h.name().as_bytes())
                .map_err(|e| SignError(e.to_string()))?;
            let value = HeaderValue::from_str(h.value()).map_err(|e| SignError(e.to_string()))?;
            headers.insert(name, value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_every_header_and_hides_the_secret() {
        let s = Signer::new("AKIDEXAMPLE", "very-secret-value");
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("127.0.0.1:9000"));
        h.insert("x-amz-rdma-token", HeaderValue::from_static("00ff"));
        h.insert("range", HeaderValue::from_static("bytes=0-9"));
        s.sign(
            "GET",
            "http://127.0.0.1:9000/b/a%20key",
            "us-east-1",
            &mut h,
            SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000),
        )
        .unwrap();
        let auth = h["authorization"].to_str().unwrap();
        assert!(auth.starts_with(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20231114/us-east-1/s3/aws4_request"
        ));
        assert!(
            auth.contains(
                "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date;x-amz-rdma-token"
            ),
            "{auth}"
        );
        assert_eq!(h["x-amz-content-sha256"], "UNSIGNED-PAYLOAD");
        assert!(!format!("{s:?}").contains("very-secret"));
        assert!(!auth.contains("very-secret"));
    }
}
