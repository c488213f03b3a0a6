//! The tcp requester: a session of one or more authenticated TCP streams to
//! an endpoint, with many operations outstanding.
//!
//! Posting is synchronous and ordered: an operation is split into pieces at
//! fixed remote-address stripe boundaries and each piece goes to stream
//! `(piece_addr / stripe) % streams`, so two operations touching the same
//! remote byte always use the same stream and take effect in posting order,
//! like an RC queue pair. Completions are delivered in posting order.
//!
//! A small piece (a READ, or a WRITE of at most [`INLINE_MAX`] bytes from
//! memory) posted while its stream's writer has nothing queued is sent by
//! the poster itself with one non-blocking `sendmsg(2)`; what the socket
//! does not take at once goes to the writer, which sends the rest. A small
//! operation so costs no hand-off to the writer task (on a multi-threaded
//! runtime, often a wake-up of another thread on another CPU).
//!
//! When a stream fails (peer gone, reset, protocol violation) the whole
//! session fails: the operation the peer was working on completes with
//! [`OpStatus::RetryExceeded`], every other outstanding or later one with
//! [`OpStatus::Flushed`]. Nothing waits forever on a dead connection.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::debug;

use crate::completion::{Completion, OpResult};
use crate::error::{FabricError, OpError, OpStatus, Result};
use crate::file::FileRange;
use crate::handshake::connect_handshake;
use crate::options::SessionConfig;
use crate::region::LocalSlice;
use crate::sock::{self as io, Tuning};
use s3dma_wire::EndpointAddr;
use s3dma_wire::frame::{
    FrameError, MAX_PIECE_LEN, OpKind, RequestHeader, ResponseHeader, ResponseKind,
};

/// In-order completion delivery and the session's failure state.
struct Completer {
    /// [`ALIVE`], [`FAILED_UNCLAIMED`] or [`FAILED`]: one word, so that a
    /// writer and a reader that see the same socket error (a dead peer
    /// fails both) cannot both decide that the other reports it.
    state: AtomicU8,
    cancel: watch::Sender<bool>,
    order: Mutex<Order>,
}

#[derive(Default)]
struct Order {
    next: u64,
    ready: BTreeMap<u64, (OpResult, oneshot::Sender<OpResult>)>,
}

/// The session works.
const ALIVE: u8 = 0;
/// A stream's writer failed (the peer reset, or stopped answering past the
/// dead-peer timeout) and no reader has reported it yet: the first reader
/// to claim it reports its oldest outstanding piece as "retry exceeded", as
/// a failed stream's reader does.
const FAILED_UNCLAIMED: u8 = 1;
/// The session failed and its failure is reported (or was asked for:
/// [`Completer::fail`] flushes everything).
const FAILED: u8 = 2;

impl Completer {
    fn is_dead(&self) -> bool {
        self.state.load(Ordering::SeqCst) != ALIVE
    }

    fn fail(&self) {
        let _ = self
            .state
            .compare_exchange(ALIVE, FAILED, Ordering::SeqCst, Ordering::SeqCst);
        let _ = self.cancel.send(true);
    }

    /// A stream's write failed: the session fails, and if this is its first
    /// failure a reader reports its oldest piece as "retry exceeded" (set
    /// before the cancellation that reader wakes on).
    fn fail_write(&self) {
        let _ = self.state.compare_exchange(
            ALIVE,
            FAILED_UNCLAIMED,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        let _ = self.cancel.send(true);
    }

    /// Whether the reader that calls this reports the session's failure
    /// (its oldest piece "retry exceeded"): its own stream failed first
    /// (`stream_failed` and the session was alive), or a writer's failure
    /// is still unclaimed. At most one caller gets `true`.
    fn claim_failure(&self, stream_failed: bool) -> bool {
        let from = |s| {
            self.state
                .compare_exchange(s, FAILED, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        };
        (stream_failed && from(ALIVE)) || from(FAILED_UNCLAIMED)
    }

    fn deliver(&self, seq: u64, result: OpResult, tx: oneshot::Sender<OpResult>) {
        let mut o = self.order.lock().unwrap_or_else(|e| e.into_inner());
        o.ready.insert(seq, (result, tx));
        loop {
            let next = o.next;
            match o.ready.remove(&next) {
                Some((r, tx)) => {
                    let _ = tx.send(r);
                    o.next += 1;
                }
                None => break,
            }
        }
    }
}

/// Where an operation's local bytes are: registered memory, or (WRITE
/// only) a file range sent with `sendfile(2)`.
pub(crate) enum Source {
    Memory(LocalSlice),
    File(FileRange),
}

impl Source {
    fn len(&self) -> u64 {
        match self {
            Source::Memory(m) => m.len() as u64,
            Source::File(f) => f.len(),
        }
    }
}

struct Op {
    kind: OpKind,
    local: Source,
    remote_addr: u64,
    rkey: u32,
    seq: u64,
    remaining: AtomicUsize,
    status: Mutex<Option<OpStatus>>,
    tx: Mutex<Option<oneshot::Sender<OpResult>>>,
    completer: Arc<Completer>,
}

impl Op {
    fn error(&self, status: OpStatus) -> OpError {
        OpError {
            status,
            op: self.kind.name(),
            remote_addr: self.remote_addr,
            rkey: self.rkey,
            len: self.local.len(),
        }
    }

    /// Records a failure before the responder's completion arrives (the
    /// first recorded status wins).
    fn fail_piece(&self, st: OpStatus) {
        let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
        if s.is_none() {
            *s = Some(st);
        }
    }

    fn piece_done(&self, status: Option<OpStatus>) {
        if let Some(st) = status {
            let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
            if s.is_none() {
                *s = Some(st);
            }
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let st = *self.status.lock().unwrap_or_else(|e| e.into_inner());
            let result = match st {
                None => Ok(()),
                Some(st) => Err(self.error(st)),
            };
            if let Some(tx) = self.tx.lock().unwrap_or_else(|e| e.into_inner()).take() {
                self.completer.deliver(self.seq, result, tx);
            }
        }
    }
}

struct Piece {
    op: Arc<Op>,
    /// Offset of the piece in the op's local slice.
    local_off: usize,
    remote_addr: u64,
    len: u64,
}

impl Piece {
    /// The piece's local memory; `None` for a file source.
    fn local_ptr(&self) -> Option<*mut u8> {
        match &self.op.local {
            // SAFETY: local_off + len <= the slice length by construction.
            Source::Memory(m) => Some(unsafe { m.ptr().add(self.local_off) }),
            Source::File(_) => None,
        }
    }
}

struct Pending {
    wr_id: u64,
    piece: Piece,
    got_data: bool,
}

/// The most bytes of a WRITE that a poster sends inline (see the module
/// doc); larger pieces are the writer's, so a poster never copies more than
/// this into a socket.
pub(crate) const INLINE_MAX: u64 = 64 << 10;

/// What the writer sends: a new piece, or the rest of one whose first
/// `sent` bytes (header first) its poster sent inline.
enum Job {
    New(Piece),
    Rest(Frame),
}

/// A piece's bytes on the wire, numbered and already in the pending queue.
struct Frame {
    head: [u8; RequestHeader::LEN],
    /// The WRITE's memory (`0, 0` for a READ or a file source).
    ptr: usize,
    n: usize,
    /// A WRITE from a file: the file, its offset and length.
    file: Option<(Arc<std::fs::File>, u64, u64)>,
    /// Keeps the op (and so its local memory) alive while we send from it,
    /// even if the reader completes it meanwhile.
    keep: Arc<Op>,
    /// Bytes of `head` then `[ptr, ptr+n)` already sent.
    sent: usize,
}

/// One stream's sending side, held by the session: the writer's queue
/// (dropping the last sender ends the writer, which half-closes the
/// stream) and what the posters share with the writer.
struct StreamTx {
    jobs: mpsc::UnboundedSender<Job>,
    core: Arc<StreamCore>,
}

/// What posters and the stream's writer share.
struct StreamCore {
    stream: Arc<TcpStream>,
    pending: PendingQueue,
    /// Numbering, and the jobs the writer has not finished: a poster sends
    /// inline only when there are none, while holding this lock, so inline
    /// bytes never interleave with the writer's.
    state: Mutex<TxState>,
}

#[derive(Default)]
struct TxState {
    wr_id: u64,
    queued: usize,
}

impl StreamCore {
    fn state(&self) -> std::sync::MutexGuard<'_, TxState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Numbers `piece`, frames it and puts it in the pending queue (under
    /// the caller's state lock); `None` (the piece completed flushed) once
    /// the reader closed the queue.
    fn register(&self, st: &mut TxState, piece: Piece) -> Option<Frame> {
        st.wr_id += 1;
        let wr_id = st.wr_id;
        let head = RequestHeader {
            op: piece.op.kind,
            rkey: piece.op.rkey,
            wr_id,
            addr: piece.remote_addr,
            len: piece.len,
            op_addr: piece.op.remote_addr,
            op_len: piece.op.local.len(),
        }
        .encode();
        let (ptr, n, file) = match (piece.op.kind, &piece.op.local) {
            (OpKind::Write, Source::File(f)) => (
                0,
                0,
                Some((
                    Arc::clone(f.file()),
                    f.offset() + piece.local_off as u64,
                    piece.len,
                )),
            ),
            (OpKind::Write, Source::Memory(_)) => (
                piece.local_ptr().map_or(0, |p| p as usize),
                piece.len as usize,
                None,
            ),
            (OpKind::Read, _) => (0, 0, None),
        };
        let keep = piece.op.clone();
        let mut q = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if q.closed {
            drop(q);
            piece.op.piece_done(Some(OpStatus::Flushed));
            return None;
        }
        q.q.push_back(Pending {
            wr_id,
            piece,
            got_data: false,
        });
        Some(Frame {
            head,
            ptr,
            n,
            file,
            keep,
            sent: 0,
        })
    }
}

impl StreamTx {
    /// Posts `piece`: inline when it is small and the writer idle, else (and
    /// for whatever the socket did not take) through the writer.
    fn post(&self, piece: Piece, completer: &Completer) {
        let core = &*self.core;
        let small = match (&piece.op.kind, &piece.op.local) {
            (OpKind::Read, _) => true,
            (OpKind::Write, Source::Memory(_)) => piece.len <= INLINE_MAX,
            (OpKind::Write, Source::File(_)) => false,
        };
        let mut st = core.state();
        if !small || st.queued > 0 {
            st.queued += 1;
            drop(st);
            self.hand_over(Job::New(piece));
            return;
        }
        let Some(mut frame) = core.register(&mut st, piece) else {
            return;
        };
        // SAFETY: for a WRITE from memory, [ptr, ptr+n) is the piece's part
        // of the op's local slice, kept mapped by `frame.keep` for the call;
        // for a READ only the header is sent (n = 0).
        match unsafe { io::send_once(&core.stream, &frame.head, frame.ptr as *const u8, frame.n) } {
            Ok(k) if k == frame.head.len() + frame.n => {}
            Ok(k) => {
                frame.sent = k;
                st.queued += 1;
                drop(st);
                self.hand_over(Job::Rest(frame));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                st.queued += 1;
                drop(st);
                self.hand_over(Job::Rest(frame));
            }
            Err(e) => {
                drop(st);
                debug!(error = %e, "fabric session stream write failed");
                // The piece is pending: the reader completes it.
                completer.fail_write();
            }
        }
    }

    fn hand_over(&self, job: Job) {
        if let Err(mpsc::error::SendError(job)) = self.jobs.send(job) {
            match job {
                Job::New(p) => p.op.piece_done(Some(OpStatus::Flushed)),
                // Pending already: the reader completes it (the writer only
                // stops once the session failed).
                Job::Rest(_) => {}
            }
        }
    }
}

struct Shared {
    peer: EndpointAddr,
    streams: Vec<StreamTx>,
    stripe: u64,
    post: Mutex<u64>,
    completer: Arc<Completer>,
}

pub(crate) struct TcpSession {
    shared: Shared,
}

impl std::fmt::Debug for TcpSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpSession")
            .field("peer", &self.shared.peer)
            .field("streams", &self.shared.streams.len())
            .field("alive", &self.is_alive())
            .finish()
    }
}

async fn connect_stream(
    target: EndpointAddr,
    cfg: &SessionConfig,
    session: u64,
    index: u16,
) -> Result<TcpStream> {
    let peer = target.addr;
    let stream = TcpStream::connect(peer)
        .await
        .map_err(|e| FabricError::io(format!("connect to fabric endpoint {target}"), e))?;
    io::tune(
        &stream,
        Tuning {
            socket_buffer: cfg.socket_buffer,
            dead_peer_timeout: cfg.dead_peer_timeout,
        },
    )
    .map_err(|e| FabricError::io("tune fabric socket", e))?;
    connect_handshake(
        &stream,
        target,
        &cfg.fabric_key,
        session,
        index,
        cfg.streams as u16,
    )
    .await?;
    Ok(stream)
}

impl TcpSession {
    pub(crate) async fn connect(target: EndpointAddr, cfg: &SessionConfig) -> Result<TcpSession> {
        if cfg.streams == 0 || cfg.streams > u16::MAX as usize {
            return Err(FabricError::InvalidArgument(format!(
                "streams must be between 1 and 65535, got {}",
                cfg.streams
            )));
        }
        if cfg.streams > 1 && cfg.stripe == 0 {
            return Err(FabricError::InvalidArgument(
                "stripe must be positive".into(),
            ));
        }
        io::check_dead_peer_timeout(cfg.dead_peer_timeout)?;
        let session_id: u64 = rand::random();
        let mut sockets = Vec::with_capacity(cfg.streams);
        for i in 0..cfg.streams {
            let s = tokio::time::timeout(
                cfg.connect_timeout,
                connect_stream(target, cfg, session_id, i as u16),
            )
            .await
            .map_err(|_| FabricError::Handshake {
                peer: target.to_string(),
                reason: format!(
                    "connect and handshake timed out after {:?}",
                    cfg.connect_timeout
                ),
            })??;
            sockets.push(s);
        }
        let (cancel, _) = watch::channel(false);
        let completer = Arc::new(Completer {
            state: AtomicU8::new(ALIVE),
            cancel,
            order: Mutex::new(Order::default()),
        });
        let mut senders = Vec::new();
        for s in sockets {
            let (jobs, rx) = mpsc::unbounded_channel();
            let stream = Arc::new(s);
            let pending: PendingQueue = Arc::new(Mutex::new(Queue::default()));
            let core = Arc::new(StreamCore {
                stream: stream.clone(),
                pending: pending.clone(),
                state: Mutex::new(TxState::default()),
            });
            senders.push(StreamTx {
                jobs,
                core: core.clone(),
            });
            tokio::spawn(writer(core, rx, completer.clone()));
            tokio::spawn(reader(stream, pending, completer.clone(), target));
        }
        Ok(TcpSession {
            shared: Shared {
                peer: target,
                streams: senders,
                stripe: if cfg.streams > 1 {
                    cfg.stripe
                } else {
                    MAX_PIECE_LEN
                },
                post: Mutex::new(0),
                completer,
            },
        })
    }

    pub(crate) fn is_alive(&self) -> bool {
        !self.shared.completer.is_dead()
    }

    /// Fails the session as a lost connection would: the streams stop (no
    /// byte more is sent from or received into an operation's memory),
    /// every outstanding operation completes flushed, later ones fail at
    /// once, and the connections close.
    pub(crate) fn fail(&self) {
        self.shared.completer.fail();
    }

    pub(crate) fn peer(&self) -> EndpointAddr {
        self.shared.peer
    }

    pub(crate) fn post(
        &self,
        kind: OpKind,
        local: Source,
        remote_addr: u64,
        rkey: u32,
    ) -> Completion {
        let sh = &self.shared;
        let len = local.len();
        let (tx, rx) = oneshot::channel();
        let info = OpError {
            status: OpStatus::Flushed,
            op: kind.name(),
            remote_addr,
            rkey,
            len,
        };
        let mut seq_guard = sh.post.lock().unwrap_or_else(|e| e.into_inner());
        let seq = *seq_guard;
        *seq_guard += 1;
        // Split at stripe boundaries (and at MAX_PIECE_LEN) in remote-address space.
        let stripe = sh.stripe.min(MAX_PIECE_LEN);
        let mut pieces = Vec::new();
        let mut off = 0u64;
        loop {
            let addr = remote_addr.wrapping_add(off);
            let to_boundary = stripe - addr % stripe;
            let n = (len - off).min(to_boundary);
            let stream = ((addr / stripe) % sh.streams.len() as u64) as usize;
            pieces.push((stream, off, addr, n));
            off += n;
            if off >= len {
                break;
            }
        }
        let op = Arc::new(Op {
            kind,
            local,
            remote_addr,
            rkey,
            seq,
            remaining: AtomicUsize::new(pieces.len()),
            status: Mutex::new(None),
            tx: Mutex::new(Some(tx)),
            completer: sh.completer.clone(),
        });
        for (stream, off, addr, n) in pieces {
            let piece = Piece {
                op: op.clone(),
                local_off: off as usize,
                remote_addr: addr,
                len: n,
            };
            if sh.completer.is_dead() {
                piece.op.piece_done(Some(OpStatus::Flushed));
                continue;
            }
            sh.streams[stream].post(piece, &sh.completer);
        }
        drop(seq_guard);
        Completion::new(rx, info)
    }
}

/// Pieces sent (or being sent) on a stream and not yet completed. Only the
/// reader removes entries; once it has `closed` the queue, the writer
/// completes new pieces itself as flushed.
#[derive(Default)]
struct Queue {
    closed: bool,
    q: VecDeque<Pending>,
}

type PendingQueue = Arc<Mutex<Queue>>;

async fn writer(
    tx: Arc<StreamCore>,
    mut rx: mpsc::UnboundedReceiver<Job>,
    completer: Arc<Completer>,
) {
    let stream = &tx.stream;
    let mut cancel = completer.cancel.subscribe();
    loop {
        let job = tokio::select! {
            biased;
            _ = io::cancelled(&mut cancel) => break,
            p = rx.recv() => match p {
                Some(p) => p,
                None => break,
            },
        };
        let frame = match job {
            Job::Rest(f) => Some(f),
            Job::New(piece) => {
                let mut st = tx.state();
                tx.register(&mut st, piece)
            }
        };
        let Some(Frame {
            head,
            ptr,
            n,
            file,
            keep,
            sent,
        }) = frame
        else {
            tx.state().queued -= 1;
            continue;
        };
        let send = async {
            if sent < head.len() {
                // SAFETY: for a WRITE from memory, [ptr, ptr+n) is the piece's
                // part of the op's local slice; `keep` owns the op and so keeps
                // the region mapped until the send returns or is dropped. For a
                // READ, or a WRITE from a file, only the header is sent here.
                unsafe { io::send_all(stream, &head[sent..], ptr, n) }.await?;
            } else if sent < head.len() + n {
                let off = sent - head.len();
                // SAFETY: as above; off < n, so [ptr+off, ptr+n) is within the
                // piece's part of the slice.
                unsafe { io::send_all(stream, &[], ptr + off, n - off) }.await?;
            }
            if let Some((file, off, len)) = &file {
                let sent = io::send_file(stream, file, *off, *len).await?;
                if sent < *len {
                    // The file ended early: keep the stream's framing with
                    // zeros and fail the operation, never report it done.
                    keep.fail_piece(OpStatus::LocalError);
                    io::send_zeros(stream, *len - sent).await?;
                }
            }
            Ok::<(), std::io::Error>(())
        };
        let r = tokio::select! {
            biased;
            _ = io::cancelled(&mut cancel) => break,
            r = send => r,
        };
        drop(keep);
        if let Err(e) = r {
            debug!(error = %e, "fabric session stream write failed");
            completer.fail_write();
            break;
        }
        tx.state().queued -= 1;
    }
    // Orderly close (all senders gone) or failure: flush what was never sent
    // (a piece sent in part is pending already: the reader completes it).
    rx.close();
    while let Ok(job) = rx.try_recv() {
        if let Job::New(p) = job {
            p.op.piece_done(Some(OpStatus::Flushed));
        }
    }
    // Half-close so the responder sees EOF after the last request.
    let _ = socket2::SockRef::from(&**stream).shutdown(std::net::Shutdown::Write);
}

async fn reader(
    stream: Arc<TcpStream>,
    pending: PendingQueue,
    completer: Arc<Completer>,
    peer: EndpointAddr,
) {
    let mut cancel = completer.cancel.subscribe();
    let (r, cancelled) = tokio::select! {
        biased;
        _ = io::cancelled(&mut cancel) => (Ok(()), true),
        r = read_loop(&stream, &pending) => (r, false),
    };
    if let Err(e) = &r {
        debug!(%peer, error = %e, "fabric session stream failed");
    }
    // Whatever ended the loop, the session can no longer be trusted: the
    // oldest outstanding piece gets "retry exceeded" if this stream failed
    // first (or a writer did), everything else "flushed"; `fail` marks the
    // session dead and stops the other streams.
    let first_failure = completer.claim_failure(!cancelled && r.is_err());
    completer.fail();
    let q = {
        let mut g = pending.lock().unwrap_or_else(|e| e.into_inner());
        g.closed = true;
        std::mem::take(&mut g.q)
    };
    // The session failed (cancelled, a stream error, or the endpoint
    // closing while operations were outstanding): close with a reset so
    // nothing still queued is delivered. The endpoint's orderly close
    // after the last completion reads as an error too; the writer has
    // half-closed by then and nothing is queued, so the reset changes
    // nothing there.
    if cancelled {
        // Failed while the session lives: reset now, not at the close.
        io::reset_now(&stream);
    } else if !q.is_empty() || r.is_err() {
        io::reset_on_close(&stream);
    }
    let mut first = first_failure;
    for p in q {
        let st = if first {
            OpStatus::RetryExceeded
        } else {
            OpStatus::Flushed
        };
        first = false;
        p.piece.op.piece_done(Some(st));
    }
}

#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Frame(#[from] FrameError),
}

async fn read_loop(
    stream: &TcpStream,
    pending: &PendingQueue,
) -> std::result::Result<(), ReadError> {
    let mut hb = [0u8; ResponseHeader::LEN];
    loop {
        if !io::recv_exact(stream, &mut hb).await? {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the endpoint closed the connection",
            )
            .into());
        }
        let h = ResponseHeader::decode(&hb)?;
        match h.kind {
            ResponseKind::ReadData => {
                let (ptr, len, _keep) = {
                    let mut q = pending.lock().unwrap_or_else(|e| e.into_inner());
                    let front = q.q.front_mut().ok_or_else(|| {
                        FrameError::Unexpected("read data with nothing outstanding".into())
                    })?;
                    if front.wr_id != h.wr_id
                        || front.piece.op.kind != OpKind::Read
                        || front.got_data
                        || front.piece.len != h.len
                    {
                        return Err(FrameError::Unexpected(format!(
                            "read data for request {} ({} bytes) does not match the outstanding request {}",
                            h.wr_id, h.len, front.wr_id
                        ))
                        .into());
                    }
                    let ptr = front.piece.local_ptr().ok_or_else(|| {
                        FrameError::Unexpected("read data for a file-sourced operation".into())
                    })?;
                    front.got_data = true;
                    (
                        ptr as usize,
                        front.piece.len as usize,
                        front.piece.op.clone(),
                    )
                };
                // SAFETY: [ptr, ptr+len) is the piece's part of the op's local
                // slice; `_keep` owns the op and so keeps its region mapped
                // until the receive returns or is dropped.
                unsafe { io::recv_exact_raw(stream, ptr, len).await? };
            }
            ResponseKind::Completion => {
                let p = {
                    let mut q = pending.lock().unwrap_or_else(|e| e.into_inner());
                    match q.q.front() {
                        Some(f) if f.wr_id == h.wr_id => {}
                        _ => {
                            return Err(FrameError::Unexpected(format!(
                                "completion for request {} that is not the oldest outstanding",
                                h.wr_id
                            ))
                            .into());
                        }
                    }
                    q.q.pop_front().expect("front exists")
                };
                let ok_read_without_data = p.piece.op.kind == OpKind::Read
                    && h.status.is_none()
                    && !p.got_data
                    && p.piece.len > 0;
                if ok_read_without_data {
                    p.piece.op.piece_done(Some(OpStatus::RemoteOperation));
                    return Err(FrameError::Unexpected(
                        "successful read completion without data".into(),
                    )
                    .into());
                }
                p.piece.op.piece_done(h.status);
            }
        }
    }
}
