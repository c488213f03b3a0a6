//! The tenant socket: accepting, telling leases from gRPC, serving leases.
//!
//! Every connection's peer credentials come from the kernel (`SO_PEERCRED`
//! through nix) at accept time. A connection that starts with the lease
//! magic is served here (fds arrive as `SCM_RIGHTS`, received with rustix so
//! they are owned from the first instant); anything else goes to tonic as an
//! HTTP/2 connection that carries its [`Peer`] as connect info.

use std::io;
use std::os::fd::{AsFd as _, OwnedFd};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use s3dma_proto::lease::{self, FdRequest, Reply};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, Interest, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

use crate::metrics::Metrics;
use crate::registry::{Peer, Registry};

/// Time a new connection has to send its first bytes.
const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds the socket: replaces a stale socket file, refuses to steal a live
/// one, sets mode and group.
///
/// # Errors
/// Another shim answers on the path, or binding / chmod / chown fails.
pub fn bind(path: &Path, mode: u32, gid: Option<u32>) -> Result<UnixListener, String> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt as _;
        if !meta.file_type().is_socket() {
            return Err(format!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            ));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(format!(
                "{} is in use (another host-shim answers there)",
                path.display()
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| format!("cannot remove the stale socket {}: {e}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot chmod {}: {e}", path.display()))?;
    if let Some(gid) = gid {
        std::os::unix::fs::chown(path, None, Some(gid))
            .map_err(|e| format!("cannot give {} to gid {gid}: {e}", path.display()))?;
    }
    Ok(listener)
}

/// A gRPC connection with the kernel's word on who is at the other end.
#[derive(Debug)]
pub struct ShimConn {
    stream: UnixStream,
    peer: Peer,
}

impl tonic::transport::server::Connected for ShimConn {
    type ConnectInfo = Peer;
    fn connect_info(&self) -> Peer {
        self.peer
    }
}

impl AsyncRead for ShimConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
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
        tokio::spawn(async move {
            let peer = match peer_of(&stream) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "no peer credentials; connection dropped");
                    metrics.refused.with_label_values(&["no_credentials"]).inc();
                    return;
                }
            };
            match tokio::time::timeout(FIRST_BYTES_TIMEOUT, is_lease(&stream)).await {
                Ok(Ok(true)) => serve_lease(stream, peer, &registry, &metrics).await,
                Ok(Ok(false)) => {
                    let _ = grpc.send(ShimConn { stream, peer }).await;
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
async fn serve_lease(mut stream: UnixStream, peer: Peer, registry: &Registry, metrics: &Metrics) {
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
            let (frame, fds) = match recv_request(&stream).await {
                Ok(Some(x)) => x,
                Ok(None) => break, // the client closed its lease
                Err(e) => {
                    tracing::debug!(tenant = %tenant.name, error = %e, "lease connection failed");
                    break;
                }
            };
            let (seq, result) = match FdRequest::decode(&frame) {
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
                Ok(req) => (req.seq, accept_fds(registry, &tenant, &lease, fds)),
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
    registry.close_lease(&tenant, &lease);
    tracing::debug!(tenant = %tenant.name, pid = peer.pid, "lease closed");
}

fn accept_fds(
    registry: &Registry,
    tenant: &crate::registry::Tenant,
    lease: &crate::registry::Lease,
    mut fds: Vec<OwnedFd>,
) -> Result<lease::Id, String> {
    if fds.len() != 1 {
        // Extra fds are closed when `fds` drops.
        return Err(format!(
            "an FD frame must carry exactly one file descriptor (SCM_RIGHTS), not {}",
            fds.len()
        ));
    }
    let fd = fds.pop().ok_or("no fd")?;
    registry
        .add_fd(tenant, lease, fd)
        .map_err(|e| e.to_string())
}

/// Reads one 8-byte request frame and the fds that came with it. `None` at
/// a clean end of stream.
async fn recv_request(
    stream: &UnixStream,
) -> io::Result<Option<([u8; lease::REQUEST_LEN], Vec<OwnedFd>)>> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut frame = [0u8; lease::REQUEST_LEN];
    let mut got = 0;
    let mut fds = Vec::new();
    while got < frame.len() {
        stream.readable().await?;
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
                fds.extend(received);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Some((frame, fds)))
}
