//! The fabric's authenticated handshake (pure, no I/O): both backends
//! open a connection with it (tcp for every operation, verbs for the
//! queue-pair exchange).
//!
//! Mutual HMAC-SHA256 challenge–response over a pre-shared fabric key `K`,
//! bound to the endpoint the requester means to reach:
//!
//! 1. requester → responder: [`Hello`] (versions, the target endpoint `T`
//!    it dialled, as its token names it: address and responder number,
//!    nonce `Nr`);
//! 2. responder → requester: [`Challenge`] with nonce `Ns` and
//!    `HMAC(K, "s3dma-fabric v2 responder" ‖ id(E) ‖ hello ‖ version ‖ Ns)`
//!    where `E` is the responder's OWN advertised endpoint; the requester
//!    checks it with `id(T)`, so an impostor without `K`, and any endpoint
//!    other than the one it dialled, is refused;
//! 3. requester → responder: [`Auth`](crate::frame::Auth) with
//!    `HMAC(K, "s3dma-fabric v2 requester" ‖ id(T) ‖ hello ‖ challenge)`;
//!    the responder checks it with `id(E)` in constant time, so a peer
//!    without `K` is refused, and so is a proof made for another endpoint;
//! 4. responder → requester: [`Verdict`]
//!    ([`FabricKey::verdict`]).
//!
//! Both nonces are fresh per connection, so a recorded exchange cannot be
//! replayed; the direction labels keep a proof from being reflected; and
//! because each proof covers the endpoint identity, a peer without the key
//! that gets a requester to dial it cannot relay the exchange to another
//! endpoint (both ends refuse it). The key never crosses the wire.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::frame::{Challenge, Hello, NONCE_LEN, Verdict, ip_bytes};
use crate::token::EndpointAddr;

const RESPONDER_LABEL: &[u8] = b"s3dma-fabric v2 responder";
const REQUESTER_LABEL: &[u8] = b"s3dma-fabric v2 requester";

/// The canonical bytes of an endpoint's identity: its IP (IPv4 as
/// IPv4-mapped IPv6, as in a token's gid), port and responder number.
fn identity(ep: &EndpointAddr) -> [u8; 22] {
    let mut b = [0u8; 22];
    b[0..16].copy_from_slice(&ip_bytes(ep.addr.ip()));
    b[16..18].copy_from_slice(&ep.addr.port().to_be_bytes());
    b[18..22].copy_from_slice(&ep.responder.to_be_bytes());
    b
}

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

    /// The responder's proof, made by the endpoint `me` (its own advertised
    /// identity, whatever `hello` names), for `hello` and its chosen
    /// version and nonce.
    pub fn responder_proof(
        &self,
        hello: &Hello,
        me: &EndpointAddr,
        version: u16,
        nonce: &[u8; NONCE_LEN],
    ) -> [u8; NONCE_LEN] {
        let mut m = self.mac();
        m.update(RESPONDER_LABEL);
        m.update(&identity(me));
        m.update(&hello.encode());
        m.update(&version.to_be_bytes());
        m.update(nonce);
        to_array(m)
    }

    /// The requester's proof for `hello` (made for the endpoint it names,
    /// `hello.target`) and the responder's `challenge`.
    pub fn requester_proof(&self, hello: &Hello, challenge: &Challenge) -> [u8; NONCE_LEN] {
        let mut m = self.mac();
        m.update(REQUESTER_LABEL);
        m.update(&identity(&hello.target));
        m.update(&hello.encode());
        m.update(&challenge.encode());
        to_array(m)
    }

    /// The requester's check, in constant time, that `challenge` was made
    /// by a holder of the key that is the endpoint it dialled
    /// (`hello.target`).
    pub fn verify_responder(&self, hello: &Hello, challenge: &Challenge) -> bool {
        let mut m = self.mac();
        m.update(RESPONDER_LABEL);
        m.update(&identity(&hello.target));
        m.update(&hello.encode());
        m.update(&challenge.version.to_be_bytes());
        m.update(&challenge.nonce);
        m.verify_slice(&challenge.mac).is_ok()
    }

    /// The responder `me`'s check, in constant time, that `mac` was made by
    /// a holder of the key for this exchange with `me`.
    pub fn verify_requester(
        &self,
        hello: &Hello,
        challenge: &Challenge,
        me: &EndpointAddr,
        mac: &[u8; NONCE_LEN],
    ) -> bool {
        let mut m = self.mac();
        m.update(REQUESTER_LABEL);
        m.update(&identity(me));
        m.update(&hello.encode());
        m.update(&challenge.encode());
        m.verify_slice(mac).is_ok()
    }

    /// The responder `me`'s verdict on the requester's proof `mac`:
    /// [`Verdict::Version`] when no version was agreed (`challenge.version`
    /// is 0); [`Verdict::Accepted`] only for a valid proof made for `me`;
    /// otherwise [`Verdict::WrongResponder`] when the hello names another
    /// endpoint than `me` (a stale token, or a handshake relayed from the
    /// endpoint the requester dialled), else [`Verdict::BadKey`].
    pub fn verdict(
        &self,
        hello: &Hello,
        challenge: &Challenge,
        me: &EndpointAddr,
        mac: &[u8; NONCE_LEN],
    ) -> Verdict {
        if challenge.version == 0 {
            Verdict::Version
        } else if self.verify_requester(hello, challenge, me, mac) {
            Verdict::Accepted
        } else if hello.target != *me {
            Verdict::WrongResponder
        } else {
            Verdict::BadKey
        }
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

    fn ep(s: &str, responder: u32) -> EndpointAddr {
        EndpointAddr {
            addr: s.parse().unwrap(),
            responder,
        }
    }

    fn hello(target: EndpointAddr) -> Hello {
        Hello {
            version_min: VERSION,
            version_max: VERSION,
            target,
            session: 2,
            stream: 0,
            streams: 1,
            nonce: nonce(),
        }
    }

    /// The responder `me`'s challenge for `h`.
    fn challenge(k: &FabricKey, h: &Hello, me: &EndpointAddr) -> Challenge {
        let ns = nonce();
        Challenge {
            version: VERSION,
            nonce: ns,
            mac: k.responder_proof(h, me, VERSION, &ns),
        }
    }

    #[test]
    fn both_sides_verify_with_the_same_key() {
        let k = FabricKey::random();
        let me = ep("10.0.0.1:7000", 1);
        let h = hello(me);
        let c = challenge(&k, &h, &me);
        assert!(k.verify_responder(&h, &c));
        let a = k.requester_proof(&h, &c);
        assert!(k.verify_requester(&h, &c, &me, &a));
        assert_eq!(k.verdict(&h, &c, &me, &a), Verdict::Accepted);
    }

    #[test]
    fn a_peer_without_the_key_is_refused() {
        let k = FabricKey::random();
        let other = FabricKey::random();
        let me = ep("10.0.0.1:7000", 1);
        let h = hello(me);
        let c = challenge(&other, &h, &me);
        assert!(!k.verify_responder(&h, &c));
        let a = other.requester_proof(&h, &c);
        assert!(!k.verify_requester(&h, &c, &me, &a));
        assert_eq!(k.verdict(&h, &c, &me, &a), Verdict::BadKey);
        // A proof for another hello (replay) does not verify either.
        let a = k.requester_proof(&h, &c);
        assert!(!k.verify_requester(&hello(me), &c, &me, &a));
        // Nor does a version-0 (no common version) exchange get accepted.
        let c0 = Challenge { version: 0, ..c };
        let a = k.requester_proof(&h, &c0);
        assert_eq!(k.verdict(&h, &c0, &me, &a), Verdict::Version);
    }

    /// Issue 30 finding 3: a peer without the key (A) that a requester (T)
    /// dials cannot relay the handshake to another endpoint (S) and keep
    /// the authenticated connection: S refuses T's proof, and T refuses
    /// S's, whether A forwards T's hello unchanged or rewrites its target.
    #[test]
    fn a_relayed_handshake_fails_on_both_ends() {
        let k = FabricKey::random();
        let a_addr = ep("10.0.0.66:7000", 1); // the relay, as T's token names it
        let s_addr = ep("10.0.0.1:7000", 1); // the endpoint A relays to
        // A forwards T's hello as is.
        let h = hello(a_addr);
        let c = challenge(&k, &h, &s_addr);
        assert!(!k.verify_responder(&h, &c), "T accepted S's proof via A");
        let t_proof = k.requester_proof(&h, &c);
        assert!(!k.verify_requester(&h, &c, &s_addr, &t_proof));
        assert_eq!(
            k.verdict(&h, &c, &s_addr, &t_proof),
            Verdict::WrongResponder
        );
        // A rewrites the target to S's: S signs another hello than T's.
        let rewritten = Hello {
            target: s_addr,
            ..h
        };
        let c = challenge(&k, &rewritten, &s_addr);
        assert!(
            !k.verify_responder(&h, &c),
            "T accepted a proof for A's hello"
        );
        let t_proof = k.requester_proof(&h, &c);
        assert!(!k.verify_requester(&rewritten, &c, &s_addr, &t_proof));
        assert_eq!(
            k.verdict(&rewritten, &c, &s_addr, &t_proof),
            Verdict::BadKey
        );
        // Another port or another responder number is another endpoint too.
        for other in [ep("10.0.0.1:7001", 1), ep("10.0.0.1:7000", 2)] {
            let h = hello(other);
            let c = challenge(&k, &h, &s_addr);
            assert!(!k.verify_responder(&h, &c));
            let p = k.requester_proof(&h, &c);
            assert_eq!(k.verdict(&h, &c, &s_addr, &p), Verdict::WrongResponder);
        }
    }

    #[test]
    fn a_proof_is_not_reflected_across_directions() {
        let k = FabricKey::random();
        let me = ep("10.0.0.1:7000", 1);
        let h = hello(me);
        let c = challenge(&k, &h, &me);
        // The responder's own MAC handed back as the requester's proof.
        assert!(!k.verify_requester(&h, &c, &me, &c.mac));
        // IPv4 and its IPv4-mapped IPv6 form are one identity (as in tokens).
        let mapped = ep("[::ffff:10.0.0.1]:7000", 1);
        let c2 = challenge(&k, &h, &mapped);
        assert!(k.verify_responder(&h, &c2));
    }

    #[test]
    fn short_keys_are_rejected_and_debug_hides_bytes() {
        assert!(FabricKey::new(vec![1u8; 15]).is_err());
        let k = FabricKey::new(b"0123456789abcdef".to_vec()).unwrap();
        assert!(!format!("{k:?}").contains("0123"));
    }
}
