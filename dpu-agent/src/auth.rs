//! Who is calling: host-shims authenticate with a bearer token
//! (`authorization: Bearer <token>`) and/or an mTLS client certificate whose
//! DNS SAN (or, for a certificate without DNS SANs, CN) is the shim's
//! `tls_name`. A shim configured with both must
//! present both. The shim then names a tenant, which must be one the
//! operator assigned to it.
//!
//! Tokens are kept as SHA-256 digests and compared in constant time; they
//! never appear in errors or logs.

use std::collections::HashSet;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;
use tonic::transport::CertificateDer;

use crate::config::LoadedShim;

/// One shim as the agent checks it.
#[derive(Debug)]
pub struct Shim {
    /// Configured name (logs, metrics).
    pub name: String,
    token_digest: Option<[u8; 32]>,
    tls_name: Option<String>,
    tenants: HashSet<String>,
}

impl Shim {
    /// Whether this shim may act for `tenant`.
    #[must_use]
    pub fn may_act_for(&self, tenant: &str) -> bool {
        self.tenants.contains(tenant)
    }
}

/// Why a caller was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credentials at all.
    #[error(
        "no shim credentials: send `authorization: Bearer <token>` or connect with a client certificate"
    )]
    Missing,
    /// Credentials that match no shim.
    #[error("the shim credentials are not valid")]
    Invalid,
}

impl AuthError {
    /// Metric label.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing",
            AuthError::Invalid => "invalid",
        }
    }
}

/// The configured shims.
#[derive(Debug)]
pub struct ShimAuth {
    shims: Vec<Arc<Shim>>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl ShimAuth {
    /// From the loaded configuration.
    #[must_use]
    pub fn new(shims: &[LoadedShim]) -> ShimAuth {
        ShimAuth {
            shims: shims
                .iter()
                .map(|s| {
                    Arc::new(Shim {
                        name: s.name.clone(),
                        token_digest: s.token.as_ref().map(|t| digest(t.expose())),
                        tls_name: s.tls_name.clone(),
                        tenants: s.tenants.iter().cloned().collect(),
                    })
                })
                .collect(),
        }
    }

    /// Identifies the caller from its request headers and TLS client
    /// certificate (nothing else: the request body is not needed).
    ///
    /// # Errors
    /// [`AuthError`] when nothing or nothing valid was presented.
    pub fn authenticate(
        &self,
        headers: &http::HeaderMap,
        peer_certs: Option<&[CertificateDer<'static>]>,
    ) -> Result<Arc<Shim>, AuthError> {
        let bearer = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(|t| digest(t.trim()));
        let cert_names = peer_certs
            .and_then(|c| c.first())
            .map(|c| certificate_names(c))
            .unwrap_or_default();
        if bearer.is_none() && cert_names.is_empty() {
            return Err(AuthError::Missing);
        }
        // Check every shim (constant-time per token) so timing does not tell
        // which shim's token was close.
        let mut found = None;
        for s in &self.shims {
            let token_ok = match (&s.token_digest, &bearer) {
                (Some(want), Some(got)) => bool::from(want.ct_eq(got)),
                (Some(_), None) => false,
                (None, _) => true,
            };
            let cert_ok = match &s.tls_name {
                Some(n) => cert_names.iter().any(|c| c == n),
                None => true,
            };
            let has_some = s.token_digest.is_some() || s.tls_name.is_some();
            if token_ok && cert_ok && has_some && found.is_none() {
                found = Some(s);
            }
        }
        found.map(Arc::clone).ok_or(AuthError::Invalid)
    }
}

/// The names a DER certificate is valid for: its DNS subject alternative
/// names, or — only when it has none — its subject common names (the rule
/// of RFC 6125; a CN never adds to SANs). Empty when unparsable.
#[must_use]
pub fn certificate_names(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                names.push((*d).to_owned());
            }
        }
    }
    if !names.is_empty() {
        return names;
    }
    for cn in cert.subject().iter_common_name() {
        if let Ok(s) = cn.as_str() {
            names.push(s.to_owned());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(sans: &[&str], cn: &str) -> Vec<u8> {
        let mut p =
            rcgen::CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, cn.to_owned());
        let key = rcgen::KeyPair::generate().unwrap();
        p.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn a_common_name_never_adds_to_sans() {
        assert_eq!(
            certificate_names(&cert(&["evil.test"], "host3.test")),
            ["evil.test"]
        );
        assert_eq!(
            certificate_names(&cert(&["a.test", "b.test"], "c.test")),
            ["a.test", "b.test"]
        );
        assert_eq!(certificate_names(&cert(&[], "host3.test")), ["host3.test"]);
        assert!(certificate_names(b"not a certificate").is_empty());
    }
}
