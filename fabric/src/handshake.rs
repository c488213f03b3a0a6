//! The authenticated handshake on a connection, both sides: every tcp
//! fabric stream and every verbs out-of-band connection opens with it. The
//! frames and proofs are [`s3dma_wire::frame`] and [`s3dma_wire::handshake`];
//! the proofs cover the endpoint the requester dialled, so a handshake
//! relayed to another endpoint fails on both ends.

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

/// The responder side of the authenticated handshake, by the endpoint `me`
/// (its advertised address and responder number, what its tokens carry).
/// Returns the requester's hello once it proved the key for `me`.
pub(crate) async fn accept_handshake(
    stream: &TcpStream,
    peer: SocketAddr,
    key: &FabricKey,
    me: &EndpointAddr,
) -> Result<Hello> {
    accept_handshake_as(stream, peer, key, me, &[]).await
}

/// [`accept_handshake`] by an endpoint that also answers as responders
/// `also` (same address): the requester's hello names which one it
/// dialled, and its proof must be for that one. The caller reads the
/// responder it got from the returned hello's `target`.
pub(crate) async fn accept_handshake_as(
    stream: &TcpStream,
    peer: SocketAddr,
    key: &FabricKey,
    me: &EndpointAddr,
    also: &[u32],
) -> Result<Hello> {
    let ioerr = |e| FabricError::io(format!("handshake with {peer}"), e);
    let refused = |reason: String| FabricError::Handshake {
        peer: peer.to_string(),
        reason,
    };
    // Every version's hello starts with the same 64 bytes; version 2 and
    // later carry the target address after them. Nothing is allocated per
    // connection before the proof: these buffers are on the stack.
    let mut b = [0u8; Hello::LEN];
    if !io::recv_exact(stream, &mut b[..Hello::PREFIX_LEN])
        .await
        .map_err(ioerr)?
    {
        return Err(refused("closed before hello".into()));
    }
    let ext = Hello::extension_len(&b[..Hello::PREFIX_LEN]).map_err(|e| protocol(peer, e))?;
    if ext == 0 {
        // A version-1 requester: say so (version 0), refuse, and close.
        let (min, max) = Hello::offered(&b[..Hello::PREFIX_LEN]).map_err(|e| protocol(peer, e))?;
        let challenge = Challenge {
            version: 0,
            nonce: handshake::nonce(),
            mac: [0; 32],
        };
        io::send_buf(stream, &challenge.encode())
            .await
            .map_err(ioerr)?;
        warn!(%peer, min, max, "fabric peer refused: it speaks only protocol versions before {VERSION} (upgrade it)");
        return Err(refused(format!(
            "the peer speaks protocol versions {min}..={max}, this endpoint {VERSION}; upgrade the peer"
        )));
    }
    if !io::recv_exact(stream, &mut b[Hello::PREFIX_LEN..])
        .await
        .map_err(ioerr)?
    {
        return Err(refused("closed during hello".into()));
    }
    let hello = Hello::decode(&b).map_err(|e| protocol(peer, e))?;
    // The responder the requester named, when it is one of ours; any
    // other name is answered as `me`, and its proof then fails.
    let named = EndpointAddr {
        addr: me.addr,
        responder: hello.target.responder,
    };
    let me = if hello.target == named && also.contains(&named.responder) {
        &named
    } else {
        me
    };
    let version = hello.negotiate().unwrap_or(0);
    let nonce = handshake::nonce();
    let challenge = Challenge {
        version,
        nonce,
        mac: key.responder_proof(&hello, me, version, &nonce),
    };
    io::send_buf(stream, &challenge.encode())
        .await
        .map_err(ioerr)?;
    let mut a = [0u8; Auth::LEN];
    if !io::recv_exact(stream, &mut a).await.map_err(ioerr)? {
        return Err(refused(
            "closed before authenticating (wrong fabric key, or it dialled another endpoint?)"
                .into(),
        ));
    }
    let auth = Auth::decode(&a).map_err(|e| protocol(peer, e))?;
    let verdict = key.verdict(&hello, &challenge, me, &auth.mac);
    io::send_buf(stream, &verdict.encode())
        .await
        .map_err(ioerr)?;
    if verdict != Verdict::Accepted {
        warn!(%peer, reason = verdict.describe(), named = %hello.target, this = %me, "fabric peer refused");
        return Err(refused(verdict.describe().into()));
    }
    debug!(%peer, session = hello.session, stream = hello.stream, "fabric peer authenticated");
    Ok(hello)
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
        target,
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
    if challenge.version == 0 {
        return Err(hs_err(format!(
            "the endpoint speaks no protocol version in common with this build ({VERSION}); upgrade the endpoint"
        )));
    }
    if !key.verify_responder(&hello, &challenge) {
        return Err(hs_err(
            "the endpoint could not prove it holds the fabric key and is the endpoint dialled (wrong key on one side, an endpoint advertised under another address, or a relayed connection)".into(),
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
