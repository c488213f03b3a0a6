//! A fabric peer, by hand: the tcp fabric's handshake with or without the
//! key, and pipelined one-sided operations with any rkey, address and
//! length (the compromised storage-side peer of [`super::storage_peer`]
//! uses them too); and phase 2: peers without the right key, responder or
//! version are refused at the handshake.

use super::*;

pub(super) use s3dma_testkit::fabric_peer::{Op, Outcome, run_ops};

/// Connects and runs the handshake: `key` proves the requester (`None`:
/// random bytes instead of a proof). Returns the stream and the verdict.
pub(super) async fn fabric_connect(
    addr: SocketAddr,
    responder: u32,
    key: Option<&FabricKey>,
    versions: (u16, u16),
) -> (TcpStream, Verdict) {
    use s3dma_testkit::fabric_peer::{Proof, handshake};
    let proof = key.map_or(Proof::Random, Proof::Key);
    let (s, _, _, v) = handshake(fabric::EndpointAddr { addr, responder }, proof, versions).await;
    (s, v)
}

pub(super) async fn fabric_session(addr: SocketAddr, responder: u32) -> TcpStream {
    let (s, v) = fabric_connect(
        addr,
        responder,
        Some(&agent::fabric_key()),
        (VERSION, VERSION),
    )
    .await;
    assert_eq!(v, Verdict::Accepted);
    s
}

/// Asserts that every op was refused (or never ran: the connection was
/// dropped) and no byte was read.
#[track_caller]
pub(super) fn assert_all_refused(what: &str, ops: &[Op], outcomes: &[Outcome]) {
    let mut dropped = 0;
    for (op, o) in ops.iter().zip(outcomes) {
        match o {
            Outcome::Done(Some(OpStatus::RemoteAccess | OpStatus::RemoteInvalidRequest), d)
                if d.is_empty() => {}
            Outcome::Dropped => dropped += 1,
            other => panic!("{what}: {op:?} was not refused: {other:?}"),
        }
    }
    println!(
        "hostile: {what}: {} refused, {dropped} not run (connection dropped)",
        ops.len() - dropped
    );
}

/// Phase 2: peers without the key, with another key, another responder or
/// no common version are refused, and the connection closed; a hundred at
/// once too, and the endpoint at `fabric_addr` still serves.
pub(super) async fn peers_without_the_key(fabric_addr: SocketAddr) {
    let other_key = FabricKey::random();
    for (what, key, responder, versions, want) in [
        ("no key", None, 1, (VERSION, VERSION), Verdict::BadKey),
        (
            "another key",
            Some(&other_key),
            1,
            (VERSION, VERSION),
            Verdict::BadKey,
        ),
        (
            "the right key, another responder",
            Some(&agent::fabric_key()),
            2,
            (VERSION, VERSION),
            Verdict::WrongResponder,
        ),
        (
            "the right key, no common version",
            Some(&agent::fabric_key()),
            1,
            (VERSION + 1, u16::MAX),
            Verdict::Version,
        ),
    ] {
        let (mut s, v) = fabric_connect(fabric_addr, responder, key, versions).await;
        assert_eq!(v, want, "{what}");
        // Operations after a refusal go nowhere: the connection is closed.
        let _ = s
            .write_all(&RequestHeader::whole(OpKind::Read, 1, 1, 0, 8).encode())
            .await;
        let mut b = [0u8; 64];
        let n = guard(what, s.read(&mut b)).await;
        assert!(
            matches!(n, Ok(0) | Err(_)),
            "{what}: got {n:?} after a refusal"
        );
    }
    // Many at once, and the endpoint still serves.
    let mut refusals = tokio::task::JoinSet::new();
    for i in 0..100u32 {
        let k = FabricKey::random();
        refusals.spawn(async move {
            let key = (i % 2 == 0).then_some(&k);
            fabric_connect(fabric_addr, 1, key, (VERSION, VERSION))
                .await
                .1
        });
    }
    while let Some(v) = refusals.join_next().await {
        assert_eq!(v.unwrap(), Verdict::BadKey);
    }
    drop(fabric_session(fabric_addr, 1).await);
}
