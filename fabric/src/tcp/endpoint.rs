//! The tcp responder: accepts authenticated connections and serves one-sided
//! operations on the domain's regions.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tracing::{debug, info};

use s3dma_wire::frame::{
    FrameError, Incoming, MAX_PIECE_LEN, OpKind, RequestHeader, ResponseHeader, ResponseKind,
};
use s3dma_wire::{EndpointAddr, FabricKey};

use crate::access::Access;
use crate::error::{FabricError, OpStatus, Result};
use crate::handshake::accept_handshake;
use crate::listener::Listener;
use crate::memory::MemoryKind;
use crate::options::EndpointConfig;
use crate::region::{Domain, KeyEntry, RegionInner};
use crate::sock::{self as io, Tuning};

const SCRATCH: usize = 256 * 1024;
/// Bytes moved per system call while a placement guard is held.
const GUARDED_CHUNK: usize = 4 << 20;
/// Completions of operations up to this size are held back while the next
/// request is already readable, and sent together (one `sendmsg` for many
/// small WRITEs under load); a larger operation's completion, and any
/// before it, go at once, so a requester streaming large pieces with few
/// in flight is never kept waiting for an acknowledgement.
const COALESCE_MAX_OP: u64 = 64 << 10;
/// Most completions held back at once.
const COALESCE_MAX_FRAMES: usize = 32;

pub(crate) struct TcpEndpoint {
    listener: Listener,
    identity: EndpointAddr,
}

impl std::fmt::Debug for TcpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpEndpoint")
            .field("local", &self.listener.local_addr())
            .field("identity", &self.identity)
            .finish()
    }
}

struct Ctx {
    domain: Domain,
    key: FabricKey,
    /// What tokens carry; requesters must name it in the handshake.
    identity: EndpointAddr,
    tuning: Tuning,
    handshake_timeout: Duration,
    idle_timeout: Option<Duration>,
    sessions: Sessions,
}

/// When each session (all authenticated connections with one session id
/// from one address: a session's streams) last sent a request, so that a
/// stream that carries no operations is not idle while its siblings work.
#[derive(Default)]
struct Sessions {
    map: Mutex<HashMap<(IpAddr, u64), Weak<Activity>>>,
}

struct Activity {
    last: Mutex<Instant>,
}

impl Activity {
    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }
}

/// A connection's share of its session's [`Activity`]; forgets the session
/// when its last connection ends.
struct SessionRef<'a> {
    sessions: &'a Sessions,
    key: (IpAddr, u64),
    activity: Option<Arc<Activity>>,
}

impl Sessions {
    fn join(&self, ip: IpAddr, session: u64) -> SessionRef<'_> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let key = (ip, session);
        let activity = match map.get(&key).and_then(Weak::upgrade) {
            Some(a) => a,
            None => {
                let a = Arc::new(Activity {
                    last: Mutex::new(Instant::now()),
                });
                map.insert(key, Arc::downgrade(&a));
                a
            }
        };
        activity.touch();
        SessionRef {
            sessions: self,
            key,
            activity: Some(activity),
        }
    }
}

impl Drop for SessionRef<'_> {
    fn drop(&mut self) {
        drop(self.activity.take());
        let mut map = self.sessions.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
            map.remove(&self.key);
        }
    }
}

impl TcpEndpoint {
    pub(crate) async fn listen(
        domain: Domain,
        config: &EndpointConfig,
        tuning: Tuning,
    ) -> Result<TcpEndpoint> {
        let mut identity = None;
        let listener = Listener::bind(config.bind, "fabric endpoint", config.caps(), |local| {
            let ctx = Arc::new(Ctx {
                domain,
                key: config.fabric_key.clone(),
                identity: config.identity(local),
                tuning,
                handshake_timeout: config.handshake_timeout,
                idle_timeout: config.idle_timeout,
                sessions: Sessions::default(),
            });
            identity = Some(ctx.identity);
            move |stream, peer| serve(stream, peer, Arc::clone(&ctx))
        })
        .await?;
        let identity = identity.expect("the listener made its server");
        Ok(TcpEndpoint { listener, identity })
    }

    /// What tokens carry (the bound address, or the advertised one).
    pub(crate) fn identity(&self) -> EndpointAddr {
        self.identity
    }

    /// Stops accepting and drops every connection at once (outstanding
    /// operations of their sessions fail), then waits for the tasks to end.
    pub(crate) async fn shutdown(self) {
        self.listener.shutdown().await;
    }
}

fn protocol(peer: SocketAddr, source: FrameError) -> FabricError {
    FabricError::Protocol {
        peer: peer.to_string(),
        source,
    }
}

/// The scratch buffer, allocated on first use (after the handshake, and
/// only by an operation that needs it: a refused WRITE's payload, CUDA
/// memory, a READ revoked midway).
fn scratch(buf: &mut Vec<u8>) -> &mut [u8] {
    if buf.is_empty() {
        *buf = vec![0u8; SCRATCH];
    }
    buf
}

async fn serve(stream: TcpStream, peer: SocketAddr, ctx: Arc<Ctx>) -> Result<()> {
    let r = serve_connection(&stream, peer, &ctx).await;
    if let Err(FabricError::Io { .. }) = &r {
        // The connection failed (the peer reset it, stopped answering past
        // the dead-peer timeout, or closed midway): it ends with a reset,
        // so READ data still queued is discarded, not delivered late. A
        // refusal (handshake, protocol) keeps its orderly close: the peer
        // reads the verdict or completion sent before it.
        io::reset_on_close(&stream);
    }
    r
}

async fn serve_connection(stream: &TcpStream, peer: SocketAddr, ctx: &Ctx) -> Result<()> {
    io::tune(stream, ctx.tuning).map_err(|e| FabricError::io("tune fabric socket", e))?;
    let hello = tokio::time::timeout(
        ctx.handshake_timeout,
        accept_handshake(stream, peer, &ctx.key, &ctx.identity),
    )
    .await
    .map_err(|_| FabricError::Handshake {
        peer: peer.to_string(),
        reason: "timed out".into(),
    })??;
    let session = ctx.sessions.join(peer.ip(), hello.session);
    let activity = session.activity.as_deref().expect("joined");
    let ioerr = |e| FabricError::io(format!("serving {peer}"), e);
    let mut scratch_buf = Vec::new();
    let mut hb = [0u8; RequestHeader::LEN];
    // Encoded completions not sent yet (see COALESCE_MAX_OP); always sent in
    // order, before anything else this connection sends.
    let mut pending: Vec<u8> = Vec::new();
    loop {
        // Idle: the whole session sent nothing for idle_timeout (nothing is
        // in flight on this connection while it waits for a request).
        let mut left = || {
            ctx.idle_timeout
                .map(|t| t.saturating_sub(activity.idle_for()))
        };
        match io::recv_exact_flushing(stream, &mut hb, &mut pending, &mut left)
            .await
            .map_err(ioerr)?
        {
            io::Recv::Done => {}
            io::Recv::Eof => {
                // The peer sends no more; it may still read what it was owed.
                if !pending.is_empty() {
                    let _ = io::send_buf(stream, &pending).await;
                }
                return Ok(());
            }
            io::Recv::Idle => {
                info!(%peer, session = hello.session, idle_timeout = ?ctx.idle_timeout, "closing an idle fabric connection");
                return Ok(());
            }
        }
        activity.touch();
        // The decision is the pure decoder's (fuzzed in wire/fuzz).
        let req = match Incoming::decode(&hb).map_err(|e| protocol(peer, e))? {
            Incoming::Serve(req) => req,
            Incoming::TooLong(req) => {
                // Payload of this size cannot be drained safely: answer and close.
                push_completion(
                    &mut pending,
                    req.wr_id,
                    0,
                    Some(OpStatus::RemoteInvalidRequest),
                );
                io::send_buf(stream, &pending).await.map_err(ioerr)?;
                return Err(FabricError::InvalidArgument(format!(
                    "{peer} sent a {} of {} bytes, above the {MAX_PIECE_LEN}-byte maximum",
                    req.op.name(),
                    req.len
                )));
            }
        };
        let need = match req.op {
            OpKind::Write => Access::REMOTE_WRITE,
            OpKind::Read => Access::REMOTE_READ,
        };
        // The whole operation is checked, not just this piece: one that
        // reaches outside the region moves nothing through any of its pieces
        // (the decoder made sure the piece lies within it).
        let auth = match ctx.domain.lookup(req.rkey) {
            Some(entry) => entry
                .authorize(req.op_addr, req.op_len, need)
                .map(|(region, op_off)| {
                    let off = op_off + req.addr.wrapping_sub(req.op_addr) as usize;
                    (entry, region, off)
                })
                .map_err(|d| d.status()),
            None => Err(OpStatus::RemoteAccess),
        };
        let len = req.len as usize;
        let status = match (req.op, auth) {
            (OpKind::Write, Ok((entry, region, off))) => {
                place_write(stream, &entry, &region, off, len, &mut scratch_buf)
                    .await
                    .map_err(ioerr)?
            }
            (OpKind::Write, Err(st)) => {
                drain(stream, len, &mut scratch_buf).await.map_err(ioerr)?;
                Some(st)
            }
            (OpKind::Read, Ok((entry, region, off))) => {
                // The READ's data follows every completion before it.
                if !pending.is_empty() {
                    io::send_buf(stream, &pending).await.map_err(ioerr)?;
                    pending.clear();
                }
                serve_read(
                    stream,
                    req.wr_id,
                    &entry,
                    &region,
                    off,
                    len,
                    &mut scratch_buf,
                )
                .await
                .map_err(ioerr)?
            }
            (OpKind::Read, Err(st)) => Some(st),
        };
        activity.touch();
        if let Some(st) = status {
            debug!(%peer, op = req.op.name(), rkey = req.rkey, addr = req.addr, len = req.len, status = %st, "fabric request refused");
        }
        push_completion(&mut pending, req.wr_id, req.len, status);
        if req.len > COALESCE_MAX_OP || pending.len() >= COALESCE_MAX_FRAMES * ResponseHeader::LEN {
            io::send_buf(stream, &pending).await.map_err(ioerr)?;
            pending.clear();
        }
    }
}

/// Appends an encoded completion to `pending`.
fn push_completion(pending: &mut Vec<u8>, wr_id: u64, len: u64, status: Option<OpStatus>) {
    let h = ResponseHeader {
        kind: ResponseKind::Completion,
        status,
        wr_id,
        len,
    };
    pending.extend_from_slice(&h.encode());
}

async fn drain(stream: &TcpStream, mut len: usize, buf: &mut Vec<u8>) -> std::io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let scratch = scratch(buf);
    while len > 0 {
        let n = len.min(scratch.len());
        // SAFETY: scratch is a live, exclusively borrowed buffer of >= n bytes.
        unsafe { io::recv_exact_raw(stream, scratch.as_mut_ptr() as usize, n).await? };
        len -= n;
    }
    Ok(())
}

/// Receives a WRITE payload of `len` bytes into region memory at `off`.
/// Returns the failure status if the key was revoked or expired midway (the
/// rest of the payload is then drained and discarded).
async fn place_write(
    stream: &TcpStream,
    entry: &KeyEntry,
    region: &Arc<RegionInner>,
    off: usize,
    len: usize,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<OpStatus>> {
    let base = region.mem.as_ptr() as usize + off;
    let host = region.mem.kind() == MemoryKind::Host;
    let mut done = 0usize;
    while done < len {
        stream.readable().await?;
        let want = (len - done).min(GUARDED_CHUNK);
        let r = if host {
            let Some(_guard) = entry.enter() else {
                drain(stream, len - done, buf).await?;
                return Ok(Some(OpStatus::RemoteAccess));
            };
            // SAFETY: `authorize` checked that [off, off+len) lies inside the
            // region, whose memory `region` (an Arc) keeps mapped; the guard
            // keeps the key from being revoked during this single recv(2),
            // which writes at most `want` bytes at base+done. The kernel, not
            // Rust code, writes the bytes; other writers to the same bytes are
            // the application's business, as with RDMA.
            unsafe { io::recv_once(stream, (base + done) as *mut u8, want) }
        } else {
            // CUDA memory: bounce through host scratch, then copy to the device.
            let scratch = scratch(buf);
            // SAFETY: scratch is an exclusively borrowed host buffer.
            let r = unsafe { io::recv_once(stream, scratch.as_mut_ptr(), want.min(scratch.len())) };
            if let Ok(n) = r
                && n > 0
            {
                let failed = match entry.enter() {
                    Some(_g) => crate::region::cuda_copy_in(&region.mem, off + done, &scratch[..n])
                        .err()
                        .map(|_| OpStatus::RemoteOperation),
                    None => Some(OpStatus::RemoteAccess),
                };
                if let Some(st) = failed {
                    drain(stream, len - done - n, buf).await?;
                    return Ok(Some(st));
                }
            }
            r
        };
        match r {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Serves a READ of `len` bytes from region memory at `off`: one READ_DATA
/// frame and the payload. If the key is revoked midway, the rest of the
/// promised bytes are zeros and the status is a remote access error.
async fn serve_read(
    stream: &TcpStream,
    wr_id: u64,
    entry: &KeyEntry,
    region: &Arc<RegionInner>,
    off: usize,
    len: usize,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<OpStatus>> {
    if len == 0 {
        return Ok(None);
    }
    let head = ResponseHeader {
        kind: ResponseKind::ReadData,
        status: None,
        wr_id,
        len: len as u64,
    }
    .encode();
    let base = region.mem.as_ptr() as usize + off;
    let host = region.mem.kind() == MemoryKind::Host;
    let mut sent_head = 0usize;
    let mut done = 0usize;
    let mut status = None;
    while done < len {
        stream.writable().await?;
        let want = (len - done).min(GUARDED_CHUNK);
        let h = &head[sent_head..];
        let r = if status.is_some() {
            let scratch = scratch(buf);
            scratch.fill(0);
            // SAFETY: scratch is a live host buffer of at least the given length.
            unsafe { io::send_once(stream, h, scratch.as_ptr(), want.min(scratch.len())) }
        } else {
            match entry.enter() {
                None => {
                    status = Some(OpStatus::RemoteAccess);
                    continue;
                }
                // SAFETY: bounds were checked by `authorize`; `region` keeps
                // the memory mapped and the guard keeps the key valid during
                // this single sendmsg(2), which reads at most `want` bytes.
                Some(_guard) if host => unsafe {
                    io::send_once(stream, h, (base + done) as *const u8, want)
                },
                Some(_guard) => {
                    let scratch = scratch(buf);
                    let n = want.min(scratch.len());
                    if crate::region::cuda_copy_out(&region.mem, off + done, &mut scratch[..n])
                        .is_err()
                    {
                        status = Some(OpStatus::RemoteOperation);
                        continue;
                    }
                    // SAFETY: scratch is a live host buffer of at least n bytes.
                    unsafe { io::send_once(stream, h, scratch.as_ptr(), n) }
                }
            }
        };
        match r {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                let from_head = n.min(h.len());
                sent_head += from_head;
                done += n - from_head;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    if sent_head < head.len() {
        io::send_buf(stream, &head[sent_head..]).await?;
    }
    Ok(status)
}
