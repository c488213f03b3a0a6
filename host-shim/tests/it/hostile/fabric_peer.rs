//! A fabric peer, by hand: the tcp fabric's handshake with or without the
//! key, and pipelined one-sided operations with any rkey, address and
//! length (the compromised storage-side peer of [`super::storage_peer`]
//! uses them too); and phase 2: peers without the right key, responder or
//! version are refused at the handshake.

use super::*;

/// Connects and runs the handshake: `key` proves the requester (`None`:
/// random bytes instead of a proof). Returns the stream and the verdict.
pub(super) async fn fabric_connect(
    addr: SocketAddr,
    responder: u32,
    key: Option<&FabricKey>,
    versions: (u16, u16),
) -> (TcpStream, Verdict) {
    guard("fabric handshake", async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let hello = Hello {
            version_min: versions.0,
            version_max: versions.1,
            target: fabric::EndpointAddr { addr, responder },
            session: rand::random(),
            stream: 0,
            streams: 1,
            nonce: rand::random(),
        };
        s.write_all(&hello.encode()).await.unwrap();
        let mut b = [0u8; Challenge::LEN];
        s.read_exact(&mut b).await.unwrap();
        let c = Challenge::decode(&b).unwrap();
        let mac = match key {
            Some(k) => k.requester_proof(&hello, &c),
            None => rand::random(),
        };
        s.write_all(&Auth { mac }.encode()).await.unwrap();
        let mut v = [0u8; Verdict::LEN];
        s.read_exact(&mut v).await.unwrap();
        (s, Verdict::decode(&v).unwrap())
    })
    .await
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

#[derive(Debug, Clone)]
pub(super) struct Op {
    pub(super) kind: OpKind,
    pub(super) rkey: u32,
    pub(super) addr: u64,
    pub(super) len: u64,
}

impl Op {
    pub(super) fn write(rkey: u32, addr: u64, len: u64) -> Op {
        Op {
            kind: OpKind::Write,
            rkey,
            addr,
            len,
        }
    }
    pub(super) fn read(rkey: u32, addr: u64, len: u64) -> Op {
        Op {
            kind: OpKind::Read,
            rkey,
            addr,
            len,
        }
    }
}

/// What became of one operation.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Outcome {
    /// Completed with this status (`None` = success), with the READ data.
    Done(Option<OpStatus>, Vec<u8>),
    /// The connection ended before its completion.
    Dropped,
}

/// Posts `ops` back to back on an authenticated connection (WRITE payloads
/// are `fill`) and collects every completion in order.
pub(super) async fn run_ops(stream: TcpStream, ops: &[Op], fill: u8) -> Vec<Outcome> {
    let (mut rd, mut wr) = stream.into_split();
    let mut wire = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        wire.extend_from_slice(
            &RequestHeader::whole(op.kind, op.rkey, i as u64, op.addr, op.len).encode(),
        );
        // (Past the maximum piece the responder closes instead of draining.)
        if op.kind == OpKind::Write && op.len <= s3dma_wire::frame::MAX_PIECE_LEN {
            wire.resize(wire.len() + op.len as usize, fill);
        }
    }
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&wire).await;
        wr
    });
    let mut out = Vec::with_capacity(ops.len());
    let mut data = Vec::new();
    guard("fabric completions", async {
        while out.len() < ops.len() {
            let mut h = [0u8; ResponseHeader::LEN];
            if rd.read_exact(&mut h).await.is_err() {
                break;
            }
            let h = ResponseHeader::decode(&h).unwrap();
            assert_eq!(h.wr_id, out.len() as u64, "completions out of order");
            match h.kind {
                ResponseKind::ReadData => {
                    let mut d = vec![0u8; h.len as usize];
                    if rd.read_exact(&mut d).await.is_err() {
                        break;
                    }
                    data.extend_from_slice(&d);
                }
                ResponseKind::Completion => {
                    out.push(Outcome::Done(h.status, std::mem::take(&mut data)))
                }
            }
        }
    })
    .await;
    out.resize(ops.len(), Outcome::Dropped);
    drop(writer.await);
    out
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
