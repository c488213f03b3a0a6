//! The authenticated handshake on a connection, both sides: every tcp
//! fabric stream and every verbs out-of-band connection opens with it. The
//! frames and proofs are [`s3dma_wire::frame`] and [`s3dma_wire::handshake`].

use std::net::SocketAddr;

use s3dma_wire::frame::{Auth, Challenge, FrameError, Hello, VERSION, Verdict};
use s3dma_wire::{EndpointAddr, FabricKey, handshake};
use tokio::net::TcpStream;
use tracing::{debug, warn};

use crate::error::{FabricError, Result};
use crate::sock as io;

fn protocol(peer: SocketAddr, source: FrameError) -> FabricError {
    FabricError::Protocol {
        peer: peer.to_string(),
        source,
    }
}

/// The responder side of the authenticated handshake .
pub(crate) async fn accept_handshake(
    stream: &TcpStream,
    peer: SocketAddr,
    key: &FabricKey,
    responder: u32,
) -> Result<()> {
    let ioerr = |e| FabricError::io(format!("handshake with {peer}"), e);
    let mut b = [0u8; Hello::LEN];
    if !io::recv_exact(stream, &mut b).await.map_err(ioerr)? {
        return Err(FabricError::Handshake {
            peer: peer.to_string(),
            reason: "closed before hello".into(),
        });
    }
    let hello = Hello::decode(&b).map_err(|e| protocol(peer, e))?;
    let version = hello.negotiate().unwrap_or(0);
    let nonce = handshake::nonce();
    let challenge = Challenge {
        version,
        nonce,
        mac: key.responder_proof(&hello, version, &nonce),
    };
    io::send_buf(stream, &challenge.encode())
        .await
        .map_err(ioerr)?;
    let mut a = [0u8; Auth::LEN];
    if !io::recv_exact(stream, &mut a).await.map_err(ioerr)? {
        return Err(FabricError::Handshake {
            peer: peer.to_string(),
            reason: "closed before authenticating (wrong fabric key?)".into(),
        });
    }
    let auth = Auth::decode(&a).map_err(|e| protocol(peer, e))?;
    let verdict = if !key.verify_requester(&hello, &challenge, &auth.mac) {
        Verdict::BadKey
    } else if version == 0 {
        Verdict::Version
    } else if hello.responder != responder {
        Verdict::WrongResponder
    } else {
        Verdict::Accepted
    };
    io::send_buf(stream, &verdict.encode())
        .await
        .map_err(ioerr)?;
    if verdict != Verdict::Accepted {
        warn!(%peer, reason = verdict.describe(), "fabric peer refused");
        return Err(FabricError::Handshake {
            peer: peer.to_string(),
            reason: verdict.describe().into(),
        });
    }
    debug!(%peer, session = hello.session, stream = hello.stream, "fabric peer authenticated");
    Ok(())
}

/// The requester side of the authenticated handshake (also used by the
/// verbs backend's out-of-band connection).
pub(crate) async fn connect_handshake(
    stream: &TcpStream,
    target: EndpointAddr,
    key: &FabricKey,
    session: u64,
    index: u16,
    streams: u16,
) -> Result<()> {
    let ioerr = |e| FabricError::io(format!("handshake with {target}"), e);
    let hs_err = |reason: String| FabricError::Handshake {
        peer: target.to_string(),
        reason,
    };
    let hello = Hello {
        version_min: VERSION,
        version_max: VERSION,
        responder: target.responder,
        session,
        stream: index,
        streams,
        nonce: handshake::nonce(),
    };
    io::send_buf(stream, &hello.encode()).await.map_err(ioerr)?;
    let mut b = [0u8; Challenge::LEN];
    if !io::recv_exact(stream, &mut b).await.map_err(ioerr)? {
        return Err(hs_err("the endpoint closed the connection".into()));
    }
    let challenge = Challenge::decode(&b).map_err(|e| FabricError::Protocol {
        peer: target.to_string(),
        source: e,
    })?;
    if !key.verify_responder(&hello, &challenge) {
        return Err(hs_err(
            "the endpoint could not prove it holds the fabric key (wrong key on one side?)".into(),
        ));
    }
    let auth = Auth {
        mac: key.requester_proof(&hello, &challenge),
    };
    io::send_buf(stream, &auth.encode()).await.map_err(ioerr)?;
    let mut v = [0u8; Verdict::LEN];
    if !io::recv_exact(stream, &mut v).await.map_err(ioerr)? {
        return Err(hs_err(
            "the endpoint closed the connection before its verdict".into(),
        ));
    }
    match Verdict::decode(&v) {
        Ok(Verdict::Accepted) => Ok(()),
        Ok(v) => Err(hs_err(v.describe().into())),
        Err(e) => Err(FabricError::Protocol {
            peer: target.to_string(),
            source: e,
        }),
    }
}
