//! The fabric's authenticated handshake (pure, no I/O): both backends
//! open a connection with it (tcp for every operation, verbs for the
//! queue-pair exchange).
//!
//! Mutual HMAC-SHA256 challenge–response over a pre-shared fabric key:
//!
//! 1. requester → responder: [`Hello`] (versions, responder number, nonce `Nr`);
//! 2. responder → requester: [`Challenge`] with nonce `Ns` and
//!    `HMAC(K, "s3dma-fabric responder" ‖ hello ‖ version ‖ Ns)`; the
//!    requester checks it, so an impostor endpoint without `K` is refused;
//! 3. requester → responder: [`Auth`](crate::frame::Auth) with
//!    `HMAC(K, "s3dma-fabric requester" ‖ hello ‖ challenge)`; the responder
//!    checks it in constant time, so a peer without `K` is refused;
//! 4. responder → requester: [`Verdict`](crate::frame::Verdict).
//!
//! Both nonces are fresh per connection, so a recorded exchange cannot be
//! replayed. The key never crosses the wire.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::frame::{Challenge, Hello, NONCE_LEN};

const RESPONDER_LABEL: &[u8] = b"s3dma-fabric responder";
const REQUESTER_LABEL: &[u8] = b"s3dma-fabric requester";

/// A fabric key shorter than [`FabricKey::MIN_LEN`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the fabric key must be at least {min} bytes, got {len}", min = FabricKey::MIN_LEN)]
pub struct KeyTooShort {
    /// The length given.
    pub len: usize,
}

/// The pre-shared fabric key (at least 16 bytes). Its `Debug` hides the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct FabricKey(Vec<u8>);

impl fmt::Debug for FabricKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FabricKey(<{} bytes redacted>)", self.0.len())
    }
}

impl FabricKey {
    /// Minimum key length in bytes.
    pub const MIN_LEN: usize = 16;

    /// A key from raw bytes; shorter than [`FabricKey::MIN_LEN`] is an error.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<FabricKey, KeyTooShort> {
        let bytes = bytes.into();
        if bytes.len() < Self::MIN_LEN {
            return Err(KeyTooShort { len: bytes.len() });
        }
        Ok(FabricKey(bytes))
    }

    /// A fresh random 32-byte key.
    pub fn random() -> FabricKey {
        FabricKey(rand::random::<[u8; 32]>().to_vec())
    }

    fn mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC accepts any key length")
    }

    /// The responder's proof for `hello` and its chosen version and nonce.
    pub fn responder_proof(
        &self,
        hello: &Hello,
        version: u16,
        nonce: &[u8; NONCE_LEN],
    ) -> [u8; NONCE_LEN] {
        let mut m = self.mac();
        m.update(RESPONDER_LABEL);
        m.update(&hello.encode());
        m.update(&version.to_be_bytes());
        m.update(nonce);
        to_array(m)
    }

    /// The requester's proof for `hello` and the responder's `challenge`.
    pub fn requester_proof(&self, hello: &Hello, challenge: &Challenge) -> [u8; NONCE_LEN] {
        let mut m = self.mac();
        m.update(REQUESTER_LABEL);
        m.update(&hello.encode());
        m.update(&challenge.encode());
        to_array(m)
    }

    /// Checks the responder's proof in constant time.
    pub fn verify_responder(&self, hello: &Hello, challenge: &Challenge) -> bool {
        let mut m = self.mac();
        m.update(RESPONDER_LABEL);
        m.update(&hello.encode());
        m.update(&challenge.version.to_be_bytes());
        m.update(&challenge.nonce);
        m.verify_slice(&challenge.mac).is_ok()
    }

    /// Checks the requester's proof in constant time.
    pub fn verify_requester(
        &self,
        hello: &Hello,
        challenge: &Challenge,
        mac: &[u8; NONCE_LEN],
    ) -> bool {
        let mut m = self.mac();
        m.update(REQUESTER_LABEL);
        m.update(&hello.encode());
        m.update(&challenge.encode());
        m.verify_slice(mac).is_ok()
    }
}

fn to_array(m: Hmac<Sha256>) -> [u8; NONCE_LEN] {
    let tag = m.finalize().into_bytes();
    let mut out = [0u8; NONCE_LEN];
    out.copy_from_slice(&tag);
    out
}

/// A fresh random nonce.
pub fn nonce() -> [u8; NONCE_LEN] {
    rand::random()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::VERSION;

    fn hello() -> Hello {
        Hello {
            version_min: VERSION,
            version_max: VERSION,
            responder: 1,
            session: 2,
            stream: 0,
            streams: 1,
            nonce: nonce(),
        }
    }

    #[test]
    fn both_sides_verify_with_the_same_key() {
        let k = FabricKey::random();
        let h = hello();
        let ns = nonce();
        let c = Challenge {
            version: VERSION,
            nonce: ns,
            mac: k.responder_proof(&h, VERSION, &ns),
        };
        assert!(k.verify_responder(&h, &c));
        let a = k.requester_proof(&h, &c);
        assert!(k.verify_requester(&h, &c, &a));
    }

    #[test]
    fn a_peer_without_the_key_is_refused() {
        let k = FabricKey::random();
        let other = FabricKey::random();
        let h = hello();
        let ns = nonce();
        let c = Challenge {
            version: VERSION,
            nonce: ns,
            mac: other.responder_proof(&h, VERSION, &ns),
        };
        assert!(!k.verify_responder(&h, &c));
        let a = other.requester_proof(&h, &c);
        assert!(!k.verify_requester(&h, &c, &a));
        // A proof for another hello (replay) does not verify either.
        let a = k.requester_proof(&h, &c);
        assert!(!k.verify_requester(&hello(), &c, &a));
    }

    #[test]
    fn short_keys_are_rejected_and_debug_hides_bytes() {
        assert!(FabricKey::new(vec![1u8; 15]).is_err());
        let k = FabricKey::new(b"0123456789abcdef".to_vec()).unwrap();
        assert!(!format!("{k:?}").contains("0123"));
    }
}
