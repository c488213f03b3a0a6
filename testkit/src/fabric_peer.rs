//! A raw tcp-fabric peer, by hand: the handshake with the right key, a
//! wrong one or none, operation frames with any rkey, address and length,
//! and their completions. On `s3dma-wire` and tokio only (no `fabric`), so
//! fabric's own tests use it as well as the end-to-end suites.

use std::net::SocketAddr;
use std::time::Duration;

use s3dma_wire::frame::{
    Auth, Challenge, Hello, OpKind, RequestHeader, ResponseHeader, ResponseKind, Verdict,
};
use s3dma_wire::handshake::FabricKey;
use s3dma_wire::status::OpStatus;
use s3dma_wire::token::EndpointAddr;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Turns a hang of the peer's reads into a failure.
pub const GUARD: Duration = Duration::from_secs(60);

/// What the requester sends as its proof in [`handshake`].
#[derive(Debug, Clone, Copy)]
pub enum Proof<'a> {
    /// The proof made with this key.
    Key(&'a FabricKey),
    /// Random bytes (a peer without the key).
    Random,
}

/// Connects to `target.addr` and runs the handshake for responder
/// `target.responder`, offering `versions` (min, max) and proving itself
/// with `proof`. Returns the stream, the challenge and the verdict.
///
/// # Panics
/// When the responder closes or sends a malformed frame, or after [`GUARD`].
pub async fn handshake(
    target: EndpointAddr,
    proof: Proof<'_>,
    versions: (u16, u16),
) -> (TcpStream, Hello, Challenge, Verdict) {
    let run = async {
        let mut s = TcpStream::connect(target.addr).await.unwrap();
        let hello = Hello {
            version_min: versions.0,
            version_max: versions.1,
            target,
            session: rand::random(),
            stream: 0,
            streams: 1,
            nonce: rand::random(),
        };
        s.write_all(&hello.encode()).await.unwrap();
        let mut b = [0u8; Challenge::LEN];
        s.read_exact(&mut b).await.unwrap();
        let c = Challenge::decode(&b).unwrap();
        let mac = match proof {
            Proof::Key(k) => k.requester_proof(&hello, &c),
            Proof::Random => rand::random(),
        };
        s.write_all(&Auth { mac }.encode()).await.unwrap();
        let mut v = [0u8; Verdict::LEN];
        s.read_exact(&mut v).await.unwrap();
        let v = Verdict::decode(&v).unwrap();
        (s, hello, c, v)
    };
    tokio::time::timeout(GUARD, run)
        .await
        .expect("the fabric handshake hung")
}

/// An authenticated connection to `target` with `key`, ready for
/// operation frames; the responder's proof is checked too.
///
/// # Panics
/// When the handshake fails or the responder does not prove the key.
pub async fn connect(target: EndpointAddr, key: &FabricKey) -> TcpStream {
    let v = s3dma_wire::frame::VERSION;
    let (s, hello, c, verdict) = handshake(target, Proof::Key(key), (v, v)).await;
    assert!(
        key.verify_responder(&hello, &c),
        "the responder does not have the key"
    );
    assert_eq!(verdict, Verdict::Accepted);
    s
}

/// [`connect`] to responder `responder` at `addr`.
///
/// # Panics
/// As [`connect`].
pub async fn connect_addr(addr: SocketAddr, responder: u32, key: &FabricKey) -> TcpStream {
    connect(EndpointAddr { addr, responder }, key).await
}

/// Reads one response header.
///
/// # Panics
/// When the stream ends or the header is malformed.
pub async fn read_response(s: &mut TcpStream) -> ResponseHeader {
    let mut b = [0u8; ResponseHeader::LEN];
    s.read_exact(&mut b).await.unwrap();
    ResponseHeader::decode(&b).unwrap()
}

/// Asserts that the responder closes the connection (within [`GUARD`]).
///
/// # Panics
/// When it sends something or leaves the connection open.
pub async fn assert_closed(s: &mut TcpStream) {
    let mut b = [0u8; 64];
    let n = tokio::time::timeout(GUARD, s.read(&mut b))
        .await
        .expect("connection left open");
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "expected the responder to close, got {n:?}"
    );
}

/// One operation for [`run_ops`].
#[derive(Debug, Clone)]
pub struct Op {
    /// READ or WRITE.
    pub kind: OpKind,
    /// The rkey it names.
    pub rkey: u32,
    /// The remote address.
    pub addr: u64,
    /// Its length.
    pub len: u64,
}

impl Op {
    /// A WRITE of `len` bytes at `addr`.
    #[must_use]
    pub fn write(rkey: u32, addr: u64, len: u64) -> Op {
        Op {
            kind: OpKind::Write,
            rkey,
            addr,
            len,
        }
    }

    /// A READ of `len` bytes at `addr`.
    #[must_use]
    pub fn read(rkey: u32, addr: u64, len: u64) -> Op {
        Op {
            kind: OpKind::Read,
            rkey,
            addr,
            len,
        }
    }
}

/// What became of one operation of [`run_ops`].
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Completed with this status (`None` = success), with the READ data.
    Done(Option<OpStatus>, Vec<u8>),
    /// The connection ended before its completion.
    Dropped,
}

/// Posts `ops` back to back on an authenticated connection (WRITE payloads
/// are `fill`; none past the largest piece, where the responder closes
/// instead of draining) and collects every completion in order.
///
/// # Panics
/// When completions come out of order, or after [`GUARD`].
pub async fn run_ops(stream: TcpStream, ops: &[Op], fill: u8) -> Vec<Outcome> {
    let (mut rd, mut wr) = stream.into_split();
    let mut wire = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        wire.extend_from_slice(
            &RequestHeader::whole(op.kind, op.rkey, i as u64, op.addr, op.len).encode(),
        );
        if op.kind == OpKind::Write && op.len <= s3dma_wire::frame::MAX_PIECE_LEN {
            wire.resize(wire.len() + usize::try_from(op.len).unwrap(), fill);
        }
    }
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&wire).await;
        wr
    });
    let mut out = Vec::with_capacity(ops.len());
    let mut data = Vec::new();
    let collect = async {
        while out.len() < ops.len() {
            let mut h = [0u8; ResponseHeader::LEN];
            if rd.read_exact(&mut h).await.is_err() {
                break;
            }
            let h = ResponseHeader::decode(&h).unwrap();
            assert_eq!(h.wr_id, out.len() as u64, "completions out of order");
            match h.kind {
                ResponseKind::ReadData => {
                    let mut d = vec![0u8; usize::try_from(h.len).unwrap()];
                    if rd.read_exact(&mut d).await.is_err() {
                        break;
                    }
                    data.extend_from_slice(&d);
                }
                ResponseKind::Completion => {
                    out.push(Outcome::Done(h.status, std::mem::take(&mut data)));
                }
            }
        }
    };
    tokio::time::timeout(GUARD, collect)
        .await
        .expect("fabric completions hung");
    out.resize(ops.len(), Outcome::Dropped);
    drop(writer.await);
    out
}

/// A peer without the key that forwards every connection to `upstream`
/// byte for byte (both ways) and records, per connection, what `upstream`
/// sent back: the relay of a handshake that should fail on both ends.
/// Stops when dropped.
#[derive(Debug)]
pub struct Relay {
    /// Where it listens (loopback).
    pub addr: SocketAddr,
    /// What `upstream` sent, one entry per relayed connection.
    pub from_upstream: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Starts a relay to `upstream` on a free loopback port.
    ///
    /// # Panics
    /// When it cannot listen.
    pub async fn start(upstream: SocketAddr) -> Relay {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let from_upstream: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>> = Default::default();
        let rec = from_upstream.clone();
        let task = tokio::spawn(async move {
            while let Ok((down, _)) = l.accept().await {
                let rec = rec.clone();
                tokio::spawn(async move {
                    let Ok(up) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let slot = {
                        let mut r = rec.lock().unwrap();
                        r.push(Vec::new());
                        r.len() - 1
                    };
                    let (mut dr, mut dw) = down.into_split();
                    let (mut ur, mut uw) = up.into_split();
                    let to_up = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut dr, &mut uw).await;
                    });
                    let mut b = [0u8; 4096];
                    loop {
                        match ur.read(&mut b).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                rec.lock().unwrap()[slot].extend_from_slice(&b[..n]);
                                if dw.write_all(&b[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    to_up.abort();
                });
            }
        });
        Relay {
            addr,
            from_upstream,
            task,
        }
    }

    /// Whether `upstream` accepted any relayed handshake: sent an accepting
    /// verdict after its challenge.
    #[must_use]
    pub fn upstream_accepted(&self) -> bool {
        self.from_upstream.lock().unwrap().iter().any(|b| {
            b.len() >= Challenge::LEN + Verdict::LEN
                && Verdict::decode(&b[Challenge::LEN..Challenge::LEN + Verdict::LEN])
                    == Ok(Verdict::Accepted)
        })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}
