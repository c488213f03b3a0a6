//! The tenant socket: accepting, telling leases from gRPC, serving leases.
//!
//! Every connection's peer credentials come from the kernel (`SO_PEERCRED`
//! through nix) at accept time, and identify it before anything is read:
//! a process that is no tenant, or a tenant already at its
//! `max_connections`, is closed at once, holding nothing. A connection
//! that starts with the lease magic is served here (fds arrive as
//! `SCM_RIGHTS`, in `FD` frames for host memory and `CU` frames for CUDA
//! shareable handles, received with rustix so they are owned from the first
//! instant; a frame must complete within [`LEASE_FRAME_TIMEOUT`] and its fds
//! count against the tenant's fd budget meanwhile); anything else goes to
//! tonic as an HTTP/2 connection that carries its [`ConnInfo`] as connect
//! info and is closed after `socket.idle_timeout_secs` without a call.

use std::io;
use std::os::fd::{AsFd as _, OwnedFd};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use s3dma_proto::lease::{self, Reply, Request};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, Interest, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::time::{Instant, Sleep};

use crate::metrics::Metrics;
use crate::registry::{Peer, Registry, Tenant};

/// Time a new connection has to send its first bytes.
const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);

/// Time the rest of a lease frame (and its fd) may take once its first
/// byte arrived.
pub const LEASE_FRAME_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the tenant socket could not be bound. Messages name the path.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The directory is not safe ([`crate::config`]'s socket-directory rule).
    #[error(transparent)]
    Directory(#[from] s3dma_service::private::PrivateError),
    /// The directory does not exist.
    #[error("the directory {} does not exist", .0.display())]
    NoDirectory(std::path::PathBuf),
    /// Something other than a socket is at the path.
    #[error("{} exists and is not a socket; refusing to replace it", .0.display())]
    NotASocket(std::path::PathBuf),
    /// A live shim answers there.
    #[error("{} is in use (another host-shim answers there)", .0.display())]
    InUse(std::path::PathBuf),
    /// A system call failed.
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        /// What: `remove the stale socket`, `bind`, `chmod`, `chown`.
        what: &'static str,
        /// The path.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Binds the socket: checks its directory (owned by the shim's user or
/// root, writable by nobody else, no symlink), replaces a stale socket file,
/// refuses to steal a live one, sets mode and group.
///
/// # Errors
/// [`BindError`]: another shim answers on the path, or binding / chmod /
/// chown fails.
pub fn bind(path: &Path, mode: u32, gid: Option<u32>) -> Result<UnixListener, BindError> {
    crate::config::check_socket_dir(path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        return Err(BindError::NoDirectory(dir.to_owned()));
    }
    let io = |what: &'static str| {
        move |source| BindError::Io {
            what,
            path: path.to_owned(),
            source,
        }
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt as _;
        if !meta.file_type().is_socket() {
            return Err(BindError::NotASocket(path.to_owned()));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(BindError::InUse(path.to_owned()));
        }
        std::fs::remove_file(path).map_err(io("remove the stale socket"))?;
    }
    let listener = UnixListener::bind(path).map_err(io("bind"))?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io("chmod"))?;
    if let Some(gid) = gid {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(io("chown"))?;
    }
    Ok(listener)
}

/// Who is at the other end of a gRPC connection (the kernel's word), and
/// its calls in progress: what every call on it sees as connect info.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The peer's credentials.
    pub peer: Peer,
    /// Its tenant (connections of non-tenants never get this far).
    pub tenant: Arc<Tenant>,
    /// Calls in progress and the time of the last one's end.
    pub activity: Arc<Activity>,
}

/// Calls in progress on one connection, for its idle timeout.
#[derive(Debug)]
pub struct Activity {
    start: Instant,
    active: AtomicUsize,
    /// Milliseconds from `start` to the last call's start or end.
    last_ms: AtomicU64,
}

impl Activity {
    pub(crate) fn new() -> Activity {
        Activity {
            start: Instant::now(),
            active: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::AcqRel);
    }

    /// Marks a call started; dropping the guard marks it ended.
    pub fn begin(self: &Arc<Self>) -> ActiveCall {
        self.active.fetch_add(1, Ordering::AcqRel);
        self.touch();
        ActiveCall(Arc::clone(self))
    }

    /// When the connection becomes idle-expired, if no call is active.
    fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        (self.active.load(Ordering::Acquire) == 0).then(|| {
            self.start + Duration::from_millis(self.last_ms.load(Ordering::Acquire)) + idle
        })
    }
}

/// A call in progress on a connection.
#[derive(Debug)]
pub struct ActiveCall(Arc<Activity>);

impl Drop for ActiveCall {
    fn drop(&mut self) {
        self.0.touch();
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A gRPC connection with the kernel's word on who is at the other end,
/// holding one of its tenant's connection slots while open.
#[derive(Debug)]
pub struct ShimConn {
    stream: UnixStream,
    info: ConnInfo,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
    _slot: OwnedSemaphorePermit,
}

impl tonic::transport::server::Connected for ShimConn {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for ShimConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        if let Poll::Ready(r) = Pin::new(&mut me.stream).poll_read(cx, buf) {
            return Poll::Ready(r);
        }
        // Nothing to read: is the connection idle past its timeout? Pings
        // and other frames do not count as use, only calls do.
        loop {
            let deadline = match me.info.activity.idle_deadline(me.idle) {
                Some(d) if d <= Instant::now() => {
                    tracing::debug!(tenant = %me.info.tenant.name, pid = me.info.peer.pid, "idle gRPC connection closed");
                    return Poll::Ready(Ok(())); // end of stream: hyper closes
                }
                Some(d) => d,
                // A call is active: look again later.
                None => Instant::now() + me.idle,
            };
            if me.timer.deadline() != deadline {
                me.timer.as_mut().reset(deadline);
            }
            if me.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl AsyncWrite for ShimConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The kernel's credentials of the process that connected.
///
/// # Errors
/// `getsockopt(SO_PEERCRED)` failed.
pub fn peer_of(stream: &UnixStream) -> io::Result<Peer> {
    let cred =
        nix::sys::socket::getsockopt(&stream.as_fd(), nix::sys::socket::sockopt::PeerCredentials)
            .map_err(io::Error::from)?;
    Ok(Peer {
        uid: cred.uid(),
        gid: cred.gid(),
        pid: cred.pid(),
    })
}

/// Accepts forever: leases are served here, gRPC connections are sent to
/// `grpc` for tonic.
pub async fn accept_loop(
    listener: UnixListener,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    grpc: mpsc::Sender<ShimConn>,
    idle: Duration,
    rings: Arc<dyn Rings>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept on the tenant socket failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let registry = Arc::clone(&registry);
        let metrics = Arc::clone(&metrics);
        let grpc = grpc.clone();
        let rings = Arc::clone(&rings);
        tokio::spawn(async move {
            let peer = match peer_of(&stream) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "no peer credentials; connection dropped");
                    metrics.refused.with_label_values(&["no_credentials"]).inc();
                    return;
                }
            };
            // Identify before reading a byte: a stranger's connection is
            // closed holding nothing, a tenant's counts against its cap.
            let tenant = match registry.tenant_of(peer) {
                Ok(t) => t,
                Err(e) => {
                    metrics.refused.with_label_values(&[e.reason()]).inc();
                    tracing::info!(
                        uid = peer.uid,
                        gid = peer.gid,
                        pid = peer.pid,
                        "connection of a process that is no tenant closed"
                    );
                    return;
                }
            };
            let Ok(slot) = Arc::clone(&tenant.connections).try_acquire_owned() else {
                metrics
                    .refused
                    .with_label_values(&["too_many_connections"])
                    .inc();
                tracing::info!(tenant = %tenant.name, pid = peer.pid, max = tenant.max_connections,
                    "connection closed: the tenant holds max_connections already");
                return;
            };
            match tokio::time::timeout(FIRST_BYTES_TIMEOUT, is_lease(&stream)).await {
                Ok(Ok(true)) => serve_lease(stream, peer, &registry, &metrics, &rings).await,
                Ok(Ok(false)) => {
                    let info = ConnInfo {
                        peer,
                        tenant,
                        activity: Arc::new(Activity::new()),
                    };
                    let conn = ShimConn {
                        stream,
                        info,
                        idle,
                        timer: Box::pin(tokio::time::sleep(idle)),
                        _slot: slot,
                    };
                    let _ = grpc.send(conn).await;
                }
                Ok(Err(_)) => {}
                Err(_) => {
                    metrics.refused.with_label_values(&["silent"]).inc();
                }
            }
        });
    }
}

/// The HTTP/2 client preface, the first bytes of every gRPC connection.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Peeks until the first bytes are the lease magic (true), the whole
/// HTTP/2 client preface or anything else (false: tonic serves it, or
/// rejects it at once). A peer that stops inside the magic or the preface
/// is cut off by the caller's [`FIRST_BYTES_TIMEOUT`]: tonic's HTTP/2
/// handshake has no timeout of its own (its keep-alive pings start after
/// it), so a connection that never finishes the preface would be held for
/// ever.
async fn is_lease(stream: &UnixStream) -> io::Result<bool> {
    let mut buf = [0u8; H2_PREFACE.len()];
    loop {
        stream.readable().await?;
        let n = match stream.try_io(Interest::READABLE, || {
            nix::sys::socket::recv(
                std::os::fd::AsRawFd::as_raw_fd(stream),
                &mut buf,
                nix::sys::socket::MsgFlags::MSG_PEEK,
            )
            .map_err(io::Error::from)
        }) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let m = n.min(lease::MAGIC.len());
        if buf[..m] == lease::MAGIC[..m] {
            if m == lease::MAGIC.len() {
                return Ok(true);
            }
        } else if buf[..n] != H2_PREFACE[..n] || n == H2_PREFACE.len() {
            return Ok(false);
        }
        // A prefix of the magic or of the preface so far: wait for more.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn send_reply(stream: &mut UnixStream, reply: &Reply) -> io::Result<()> {
    stream.write_all(&reply.encode()).await
}

/// Serves one lease until the client closes it, then releases its buffers.
async fn serve_lease(
    mut stream: UnixStream,
    peer: Peer,
    registry: &Registry,
    metrics: &Metrics,
    rings: &Arc<dyn Rings>,
) {
    // The lease's rings: closed when it ends, whichever way.
    let mut lease_rings: Vec<RingHeld> = Vec::new();
    let mut magic = [0u8; lease::MAGIC.len()];
    if stream.read_exact(&mut magic).await.is_err() {
        return;
    }
    let (tenant, lease) = match registry.open_lease(peer) {
        Ok(x) => x,
        Err(e) => {
            metrics.refused.with_label_values(&[e.reason()]).inc();
            tracing::info!(uid = peer.uid, gid = peer.gid, pid = peer.pid, error = %e, "lease refused");
            let _ = send_reply(
                &mut stream,
                &Reply::Err {
                    seq: 0,
                    message: e.to_string(),
                },
            )
            .await;
            return;
        }
    };
    tracing::debug!(tenant = %tenant.name, pid = peer.pid, lease = ?lease.id, "lease opened");
    if send_reply(
        &mut stream,
        &Reply::Ok {
            seq: 0,
            id: lease.id,
        },
    )
    .await
    .is_ok()
    {
        loop {
            let Received {
                frame,
                fds,
                refused,
            } = match recv_request(&stream, registry, &tenant).await {
                Ok(Some(x)) => x,
                Ok(None) => break, // the client closed its lease
                Err(e) => {
                    tracing::debug!(tenant = %tenant.name, error = %e, "lease connection failed");
                    break;
                }
            };
            let (seq, result) = match Request::decode(&frame) {
                Err(e) => {
                    // A stream we cannot parse cannot be resynchronised.
                    let _ = send_reply(
                        &mut stream,
                        &Reply::Err {
                            seq: 0,
                            message: format!("{e}; closing the lease"),
                        },
                    )
                    .await;
                    break;
                }
                Ok(req) => match refused {
                    Some(message) => (req.seq(), Err(message)),
                    None if matches!(req, Request::Ring(_)) => (
                        req.seq(),
                        open_ring(rings, &tenant, peer, fds, &mut lease_rings),
                    ),
                    None => (
                        req.seq(),
                        accept_fds(registry, &tenant, &lease, req, fds).map_err(|e| e.to_string()),
                    ),
                },
            };
            let reply = match result {
                Ok(id) => Reply::Ok { seq, id },
                Err(message) => Reply::Err { seq, message },
            };
            if send_reply(&mut stream, &reply).await.is_err() {
                break;
            }
        }
    }
    drop(lease_rings);
    registry.close_lease(&tenant, &lease);
    tracing::debug!(tenant = %tenant.name, pid = peer.pid, "lease closed");
}

/// What serves a lease's `RG` frames (the `ring` module's `RingHost`),
/// behind a trait so this module does not depend on it.
pub trait Rings: Send + Sync + std::fmt::Debug {
    /// Opens the ring in `fd` for a lease of `tenant` (`peer`) that holds
    /// `held` rings already; what it returns lives as long as the lease
    /// (dropping it closes the ring).
    ///
    /// # Errors
    /// What to tell the tenant (a limit, or what is wrong with the fd).
    fn open(
        self: Arc<Self>,
        tenant: &Arc<Tenant>,
        peer: Peer,
        fd: OwnedFd,
        held: usize,
    ) -> Result<RingHeld, String>;
}

/// A ring a lease holds (closed when dropped).
pub type RingHeld = Box<dyn std::any::Any + Send>;

/// An `RG` frame: its one fd becomes a ring of the lease; the reply's id
/// is random (the ring is named by the lease, not by the id).
fn open_ring(
    rings: &Arc<dyn Rings>,
    tenant: &Arc<Tenant>,
    peer: Peer,
    fds: Vec<OwnedFd>,
    lease_rings: &mut Vec<RingHeld>,
) -> Result<lease::Id, String> {
    let [fd] =
        <[OwnedFd; 1]>::try_from(fds).map_err(|fds| FdRefused::NotOne(fds.len()).to_string())?;
    let held = Arc::clone(rings).open(tenant, peer, fd, lease_rings.len())?;
    lease_rings.push(held);
    Ok(lease::Id(rand::random()))
}

/// Why an FD frame's descriptor was not added to the lease.
#[derive(Debug, thiserror::Error)]
enum FdRefused {
    #[error("an FD frame must carry exactly one file descriptor (SCM_RIGHTS), not {0}")]
    NotOne(usize),
    #[error(transparent)]
    Registry(#[from] crate::error::ShimError),
}

fn accept_fds(
    registry: &Registry,
    tenant: &crate::registry::Tenant,
    lease: &crate::registry::Lease,
    req: Request,
    fds: Vec<OwnedFd>,
) -> Result<lease::Id, FdRefused> {
    // Extra fds are closed when the refused `Vec` drops.
    let [fd] = <[OwnedFd; 1]>::try_from(fds).map_err(|fds| FdRefused::NotOne(fds.len()))?;
    Ok(match req {
        Request::Fd(_) => registry.add_fd(tenant, lease, fd),
        Request::CudaFd(_) => registry.add_cuda_fd(tenant, lease, fd),
        // Served by `open_ring` before this is reached.
        Request::Ring(_) => {
            return Err(FdRefused::Registry(crate::error::ShimError::Internal(
                "a ring frame reached the fd registry".into(),
            )));
        }
    }?)
}

/// Reads one 8-byte request frame and the fds that came with it. `None` at
/// a clean end of stream. Once a frame has begun it must complete within
/// [`LEASE_FRAME_TIMEOUT`]; every fd received meanwhile counts against the
/// tenant's fd budget, and a frame may carry one fd (more end the lease).
async fn recv_request(
    stream: &UnixStream,
    registry: &Registry,
    tenant: &Arc<Tenant>,
) -> io::Result<Option<Received>> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut frame = [0u8; lease::REQUEST_LEN];
    let mut got = 0;
    let mut fds = Vec::new();
    let mut counted = Vec::new();
    let mut refused = None;
    let mut frame_deadline = None;
    while got < frame.len() {
        match frame_deadline {
            // Between frames a lease may wait as long as its process lives.
            None => stream.readable().await?,
            Some(d) => tokio::time::timeout_at(d, stream.readable())
                .await
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        "a lease frame did not complete in time",
                    )
                })??,
        }
        let res = stream.try_io(Interest::READABLE, || {
            // Room for a few fds, so a frame with too many is told apart
            // (and its fds closed) rather than truncated silently.
            let mut space =
                [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(8))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [io::IoSliceMut::new(&mut frame[got..])];
            let msg = rustix::net::recvmsg(stream, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)
                .map_err(io::Error::from)?;
            let mut received = Vec::new();
            for m in control.drain() {
                if let RecvAncillaryMessage::ScmRights(rights) = m {
                    received.extend(rights);
                }
            }
            if msg.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "too many file descriptors in one frame",
                ));
            }
            Ok((msg.bytes, received))
        });
        match res {
            Ok((0, _)) if got == 0 => return Ok(None),
            Ok((0, _)) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok((n, received)) => {
                got += n;
                frame_deadline.get_or_insert_with(|| Instant::now() + LEASE_FRAME_TIMEOUT);
                for fd in received {
                    match registry.hold_in_frame_fd(tenant) {
                        Ok(hold) => {
                            counted.push(hold);
                            fds.push(fd);
                        }
                        // Over budget: closed at once (dropped); the frame
                        // is answered with the refusal.
                        Err(e) => refused = Some(e.to_string()),
                    }
                }
                if fds.len() > 1 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a lease frame carries one file descriptor, not more",
                    ));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    // The caller adds the fd to the lease, which counts it from there on.
    drop(counted);
    Ok(Some(Received {
        frame,
        fds,
        refused,
    }))
}

/// One lease frame as received.
struct Received {
    frame: [u8; lease::REQUEST_LEN],
    fds: Vec<OwnedFd>,
    /// Why an fd that came with it was closed unread (the tenant's budget).
    refused: Option<String>,
}
