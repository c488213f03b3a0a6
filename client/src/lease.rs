//! The client side of the lease protocol: one Unix stream per [`crate::Client`]
//! that passes memfds to the shim (`SCM_RIGHTS`) and keeps the buffers
//! registered under it alive. Frames come from [`s3dma_proto::lease`].

use std::io::{self, IoSlice};
use std::os::fd::{AsFd as _, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sys::socket::{ControlMessage, MsgFlags};
use s3dma_proto::lease::{
    CudaFdRequest, FdRequest, Id, MAGIC, REPLY_HEADER_LEN, Reply, RingRequest,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::sync::Mutex;

use crate::error::{Error, ErrorKind};

/// An open lease.
#[derive(Debug)]
pub(crate) struct Lease {
    id: Id,
    socket: PathBuf,
    conn: Mutex<Conn>,
}

#[derive(Debug)]
struct Conn {
    stream: UnixStream,
    next_seq: u32,
    /// Set when an exchange failed half-way: the stream's framing is lost.
    broken: bool,
}

impl Lease {
    /// Sends the magic on a fresh connection (whose server the caller has
    /// checked) and reads the lease id. `socket` only names the shim in
    /// errors.
    ///
    /// A shim drops the connections of uids that are not its tenants before
    /// reading a byte: a connection closed before any reply byte is
    /// [`ErrorKind::AccessDenied`] (`ConnectionDropped`).
    pub(crate) async fn open(mut stream: UnixStream, socket: &Path) -> Result<Lease, Error> {
        if let Err(e) = stream.write_all(&MAGIC).await {
            return Err(if is_drop(&e) {
                dropped_before_answer(socket)
            } else {
                lease_io(socket, "opening a lease", &e)
            });
        }
        let mut h = [0u8; REPLY_HEADER_LEN];
        let first = match stream.read(&mut h).await {
            Ok(0) => return Err(dropped_before_answer(socket)),
            Ok(n) => n,
            Err(e) if is_drop(&e) => return Err(dropped_before_answer(socket)),
            Err(e) => return Err(lease_io(socket, "reading the lease id", &e)),
        };
        let reply = finish_reply(&mut stream, socket, h, first).await?;
        match reply {
            Reply::Ok { seq: 0, id } => Ok(Lease {
                id,
                socket: socket.to_owned(),
                conn: Mutex::new(Conn {
                    stream,
                    next_seq: 1,
                    broken: false,
                }),
            }),
            Reply::Ok { seq, .. } => Err(protocol(
                socket,
                format!("answered the lease magic with seq {seq}, not 0"),
            )),
            Reply::Err { message, .. } => Err(Error::new(
                ErrorKind::AccessDenied,
                "LeaseRefused",
                format!(
                    "host-shim at {} refused a lease: {message}",
                    socket.display()
                ),
            )),
        }
    }

    /// The lease id, for `RegisterBuffer`.
    pub(crate) fn id(&self) -> Id {
        self.id
    }

    /// Passes `fd` (host memory, a sealed memfd) to the shim and returns the
    /// fd handle it answered with.
    ///
    /// The exchange runs in its own task, so a caller that gives up half-way
    /// cannot leave a half-read reply on the stream.
    pub(crate) async fn pass_fd(self: &Arc<Self>, fd: BorrowedFd<'_>) -> Result<Id, Error> {
        self.pass(fd, Frame::Host).await
    }

    /// Passes a CUDA shareable handle (the POSIX fd of
    /// `cuMemExportToShareableHandle`) in a `CU` frame; as [`Lease::pass_fd`].
    pub(crate) async fn pass_cuda_fd(self: &Arc<Self>, fd: BorrowedFd<'_>) -> Result<Id, Error> {
        self.pass(fd, Frame::Cuda).await
    }

    /// Passes a ring's memfd in an `RG` frame; as [`Lease::pass_fd`].
    pub(crate) async fn pass_ring(self: &Arc<Self>, fd: BorrowedFd<'_>) -> Result<Id, Error> {
        self.pass(fd, Frame::Ring).await
    }

    /// A duplicate of the lease's connection (to watch for its end).
    pub(crate) async fn dup_stream(&self) -> io::Result<std::os::unix::net::UnixStream> {
        let conn = self.conn.lock().await;
        Ok(conn.stream.as_fd().try_clone_to_owned()?.into())
    }

    async fn pass(self: &Arc<Self>, fd: BorrowedFd<'_>, kind: Frame) -> Result<Id, Error> {
        let fd = fd.try_clone_to_owned().map_err(|e| {
            Error::new(
                ErrorKind::Other,
                "Io",
                format!("duplicating a buffer fd: {e}"),
            )
        })?;
        let lease = Arc::clone(self);
        match tokio::spawn(async move { lease.exchange(fd, kind).await }).await {
            Ok(r) => r,
            Err(e) => Err(Error::new(
                ErrorKind::Other,
                "Internal",
                format!("lease task failed: {e}"),
            )),
        }
    }

    async fn exchange(&self, fd: OwnedFd, kind: Frame) -> Result<Id, Error> {
        let mut conn = self.conn.lock().await;
        if conn.broken {
            return Err(Error::shim_unavailable(
                &self.socket,
                "the lease connection failed earlier; connect again",
            ));
        }
        let seq = conn.next_seq;
        conn.next_seq = conn.next_seq.checked_add(1).unwrap_or(1);
        // Until the reply is read in full, a failure loses the framing.
        conn.broken = true;
        let frame = match kind {
            Frame::Host => FdRequest { seq }.encode(),
            Frame::Cuda => CudaFdRequest { seq }.encode(),
            Frame::Ring => RingRequest { seq }.encode(),
        };
        send_fd(&mut conn.stream, &frame, &fd)
            .await
            .map_err(|e| lease_io(&self.socket, "passing a buffer fd", &e))?;
        drop(fd);
        let reply = read_reply(&mut conn.stream, &self.socket).await?;
        conn.broken = false;
        match reply {
            Reply::Ok { seq: s, id } if s == seq => Ok(id),
            Reply::Err { seq: s, message } if s == seq && kind == Frame::Ring => Err(Error::new(
                ErrorKind::InvalidArgument,
                "RingRefused",
                format!("host-shim refused the ring: {message}"),
            )),
            Reply::Err { seq: s, message } if s == seq => Err(Error::new(
                ErrorKind::InvalidArgument,
                "BadBuffer",
                format!("host-shim refused the buffer's memory: {message}"),
            )),
            Reply::Ok { seq: s, .. } | Reply::Err { seq: s, .. } => {
                conn.broken = true;
                Err(protocol(
                    &self.socket,
                    format!("answered lease request {seq} with seq {s}"),
                ))
            }
        }
    }
}

/// What a passed fd is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    /// `FD`: host memory.
    Host,
    /// `CU`: a CUDA shareable handle.
    Cuda,
    /// `RG`: a ring.
    Ring,
}

/// Writes `frame` with `fd` attached (`SCM_RIGHTS` on the first byte).
async fn send_fd(stream: &mut UnixStream, frame: &[u8], fd: &OwnedFd) -> io::Result<()> {
    let raw = stream.as_raw_fd();
    let fds = [fd.as_raw_fd()];
    let sent = stream
        .async_io(Interest::WRITABLE, || {
            let iov = [IoSlice::new(frame)];
            let cmsgs = [ControlMessage::ScmRights(&fds)];
            nix::sys::socket::sendmsg::<()>(raw, &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)
                .map_err(io::Error::from)
        })
        .await?;
    if sent == 0 {
        return Err(io::ErrorKind::WriteZero.into());
    }
    // The fd went with the first byte; the rest (if any) is plain data.
    stream.write_all(&frame[sent..]).await
}

async fn read_reply(stream: &mut UnixStream, socket: &Path) -> Result<Reply, Error> {
    finish_reply(stream, socket, [0u8; REPLY_HEADER_LEN], 0).await
}

/// Reads the rest of a reply whose first `have` header bytes are in `h`.
async fn finish_reply(
    stream: &mut UnixStream,
    socket: &Path,
    mut h: [u8; REPLY_HEADER_LEN],
    have: usize,
) -> Result<Reply, Error> {
    stream
        .read_exact(&mut h[have..])
        .await
        .map_err(|e| lease_io(socket, "reading a lease reply", &e))?;
    let header = Reply::decode_header(&h).map_err(|e| protocol(socket, e.to_string()))?;
    let mut message = vec![0u8; header.message_len];
    stream
        .read_exact(&mut message)
        .await
        .map_err(|e| lease_io(socket, "reading a lease reply", &e))?;
    Ok(Reply::finish(header, &message))
}

/// The peer closed the connection (or reset it, having unread bytes).
fn is_drop(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    )
}

/// The shim hung up on a fresh lease without a word: what it does to uids
/// that are not its tenants.
fn dropped_before_answer(socket: &Path) -> Error {
    Error::new(
        ErrorKind::AccessDenied,
        "ConnectionDropped",
        format!(
            "host-shim at {}: the shim closed the connection before answering: uid {} is \
             probably not one of its tenants (or has too many connections open)",
            socket.display(),
            crate::peer::caller_uid()
        ),
    )
}

fn lease_io(socket: &Path, what: &str, e: &io::Error) -> Error {
    if matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    ) {
        Error::shim_unavailable(
            socket,
            format!("{what}: the shim closed the lease connection ({e})"),
        )
    } else {
        Error::shim_unavailable(socket, format!("{what}: {e}"))
    }
}

fn protocol(socket: &Path, what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Other,
        "LeaseProtocol",
        format!(
            "host-shim at {} broke the lease protocol: {what}",
            socket.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::io::{IoSliceMut, Read, Write};
    use std::os::fd::{AsFd, RawFd};
    use std::os::unix::net::UnixStream as StdStream;
    use std::thread;

    use nix::fcntl::{FcntlArg, SealFlag};
    use nix::sys::socket::{ControlMessageOwned, recvmsg};

    use super::*;

    const SOCKET: &str = "/test/shim.sock";

    /// A connected pair: the client's end as a tokio stream, the fake shim's
    /// end as a blocking std stream (driven from a thread).
    fn pair() -> (UnixStream, StdStream) {
        let (a, b) = StdStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        (UnixStream::from_std(a).unwrap(), b)
    }

    fn read_magic(peer: &mut StdStream) {
        let mut m = [0u8; 8];
        peer.read_exact(&mut m).unwrap();
        assert_eq!(m, MAGIC);
    }

    /// The fake shim's side of opening a lease: the magic in, lease id
    /// `[1; 16]` out.
    fn accept_lease(peer: &mut StdStream) {
        read_magic(peer);
        peer.write_all(
            &Reply::Ok {
                seq: 0,
                id: Id([1; 16]),
            }
            .encode(),
        )
        .unwrap();
    }

    /// Receives one `FD` frame and its fd.
    fn recv_fd(peer: &StdStream) -> (FdRequest, RawFd) {
        let (frame, fd) = recv_frame(peer);
        (FdRequest::decode(&frame).unwrap(), fd)
    }

    /// One 8-byte frame and the one fd that came with it.
    fn recv_frame(peer: &StdStream) -> ([u8; 8], RawFd) {
        let mut frame = [0u8; 8];
        let mut cmsg = nix::cmsg_space!([RawFd; 1]);
        let (n, fds) = {
            let mut iov = [IoSliceMut::new(&mut frame)];
            let msg = recvmsg::<()>(
                peer.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::empty(),
            )
            .unwrap();
            let mut fds = Vec::new();
            for c in msg.cmsgs().unwrap() {
                if let ControlMessageOwned::ScmRights(f) = c {
                    fds.extend(f);
                }
            }
            (msg.bytes, fds)
        };
        assert_eq!(n, 8);
        assert_eq!(fds.len(), 1);
        (frame, fds[0])
    }

    #[tokio::test]
    async fn a_ring_goes_in_an_rg_frame_and_a_refusal_names_the_ring() {
        let (client, mut peer) = pair();
        let shim = thread::spawn(move || {
            accept_lease(&mut peer);
            let (frame, fd) = recv_frame(&peer);
            let s3dma_proto::lease::Request::Ring(req) =
                s3dma_proto::lease::Request::decode(&frame).unwrap()
            else {
                panic!("not an RG frame: {frame:?}");
            };
            nix::unistd::close(fd).unwrap();
            let reply = Reply::Err {
                seq: req.seq,
                message: "this lease may open 1 ring(s)".into(),
            };
            peer.write_all(&reply.encode()).unwrap();
        });
        let lease = Arc::new(Lease::open(client, Path::new(SOCKET)).await.unwrap());
        let (_ring, fd) = s3dma_ring::Ring::create(4).unwrap();
        let e = lease.pass_ring(fd.as_fd()).await.unwrap_err();
        assert_eq!(
            (e.kind(), e.code()),
            (ErrorKind::InvalidArgument, "RingRefused")
        );
        assert!(e.to_string().contains("may open 1 ring"), "{e}");
        shim.join().unwrap();
    }

    #[tokio::test]
    async fn passes_a_sealed_memfd_and_gets_its_handle() {
        let (client, mut peer) = pair();
        let shim = thread::spawn(move || {
            read_magic(&mut peer);
            peer.write_all(
                &Reply::Ok {
                    seq: 0,
                    id: Id([7; 16]),
                }
                .encode(),
            )
            .unwrap();
            let mut seen = Vec::new();
            for handle in [1u8, 2] {
                let (req, fd) = recv_fd(&peer);
                // The received fd is the memfd: same size, sealed.
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(format!("/proc/self/fd/{fd}"))
                    .unwrap();
                let size = nix::sys::stat::fstat(&file).unwrap().st_size;
                let seals = SealFlag::from_bits_truncate(
                    nix::fcntl::fcntl(&file, FcntlArg::F_GET_SEALS).unwrap(),
                );
                nix::unistd::close(fd).unwrap();
                seen.push((req.seq, size, seals));
                peer.write_all(
                    &Reply::Ok {
                        seq: req.seq,
                        id: Id([handle; 16]),
                    }
                    .encode(),
                )
                .unwrap();
            }
            seen
        });
        let lease = Arc::new(Lease::open(client, Path::new(SOCKET)).await.unwrap());
        assert_eq!(lease.id(), Id([7; 16]));
        let m1 = fabric::Memory::memfd("s3dma-test", 4096).unwrap();
        let m2 = fabric::Memory::memfd("s3dma-test", 12288).unwrap();
        assert_eq!(lease.pass_fd(m1.fd().unwrap()).await.unwrap(), Id([1; 16]));
        assert_eq!(
            lease.pass_fd(m2.fd().unwrap().as_fd()).await.unwrap(),
            Id([2; 16])
        );
        let seen = shim.join().unwrap();
        assert_eq!(seen[0].0, 1);
        assert_eq!(seen[1].0, 2);
        assert_eq!(seen[0].1, 4096);
        assert_eq!(seen[1].1, 12288);
        for (_, _, seals) in seen {
            assert!(seals.contains(SealFlag::F_SEAL_SHRINK), "{seals:?}");
        }
    }

    #[tokio::test]
    async fn a_refused_lease_is_access_denied_with_the_shims_words() {
        let (client, mut peer) = pair();
        let shim = thread::spawn(move || {
            read_magic(&mut peer);
            let reply = Reply::Err {
                seq: 0,
                message: "uid 1234 is not a tenant of this host-shim".into(),
            };
            peer.write_all(&reply.encode()).unwrap();
        });
        let e = Lease::open(client, Path::new(SOCKET)).await.unwrap_err();
        shim.join().unwrap();
        assert_eq!(e.kind(), ErrorKind::AccessDenied);
        assert!(e.to_string().contains("uid 1234 is not a tenant"), "{e}");
        assert!(e.to_string().contains(SOCKET), "{e}");
    }

    #[tokio::test]
    async fn a_shim_hanging_up_before_any_reply_is_access_denied() {
        // Before reading the magic (how the shim drops non-tenants), and
        // after reading it.
        for read_first in [false, true] {
            let (client, mut peer) = pair();
            let shim = thread::spawn(move || {
                if read_first {
                    read_magic(&mut peer);
                }
                drop(peer);
            });
            let e = Lease::open(client, Path::new(SOCKET)).await.unwrap_err();
            shim.join().unwrap();
            assert_eq!(e.kind(), ErrorKind::AccessDenied, "{e}");
            assert_eq!(e.code(), "ConnectionDropped");
            let uid = nix::unistd::geteuid().as_raw();
            assert!(
                e.to_string().contains(&format!(
                    "the shim closed the connection before answering: uid {uid} is probably \
                     not one of its tenants"
                )),
                "{e}"
            );
            assert!(e.to_string().contains(SOCKET), "{e}");
        }
    }

    #[tokio::test]
    async fn a_refused_fd_is_a_clear_error_and_the_lease_stays_usable() {
        let (client, mut peer) = pair();
        let shim = thread::spawn(move || {
            accept_lease(&mut peer);
            let (req, fd) = recv_fd(&peer);
            nix::unistd::close(fd).unwrap();
            let reply = Reply::Err {
                seq: req.seq,
                message: "fd is not sealed against shrinking".into(),
            };
            peer.write_all(&reply.encode()).unwrap();
            let (req, fd) = recv_fd(&peer);
            nix::unistd::close(fd).unwrap();
            peer.write_all(
                &Reply::Ok {
                    seq: req.seq,
                    id: Id([3; 16]),
                }
                .encode(),
            )
            .unwrap();
        });
        let lease = Arc::new(Lease::open(client, Path::new(SOCKET)).await.unwrap());
        let m = fabric::Memory::memfd("s3dma-test", 4096).unwrap();
        let e = lease.pass_fd(m.fd().unwrap()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(e.code(), "BadBuffer");
        assert!(
            e.to_string().contains("not sealed against shrinking"),
            "{e}"
        );
        assert_eq!(lease.pass_fd(m.fd().unwrap()).await.unwrap(), Id([3; 16]));
        shim.join().unwrap();
    }

    #[tokio::test]
    async fn a_peer_closing_mid_reply_is_unavailable() {
        // During the handshake.
        let (client, mut peer) = pair();
        let shim = thread::spawn(move || {
            read_magic(&mut peer);
            peer.write_all(
                &Reply::Ok {
                    seq: 0,
                    id: Id([1; 16]),
                }
                .encode()[..10],
            )
            .unwrap();
        });
        let e = Lease::open(client, Path::new(SOCKET)).await.unwrap_err();
        shim.join().unwrap();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.to_string().contains(SOCKET), "{e}");

        // During an fd exchange: the error, then the lease is known broken.
        let (client, mut peer) = pair();
        let shim = thread::spawn(move || {
            accept_lease(&mut peer);
            let (req, fd) = recv_fd(&peer);
            nix::unistd::close(fd).unwrap();
            let reply = Reply::Err {
                seq: req.seq,
                message: "x".repeat(100),
            }
            .encode();
            peer.write_all(&reply[..40]).unwrap();
        });
        let lease = Arc::new(Lease::open(client, Path::new(SOCKET)).await.unwrap());
        let m = fabric::Memory::memfd("s3dma-test", 4096).unwrap();
        let e = lease.pass_fd(m.fd().unwrap()).await.unwrap_err();
        shim.join().unwrap();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(e.to_string().contains("closed the lease"), "{e}");
        let e = lease.pass_fd(m.fd().unwrap()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    }

    #[tokio::test]
    async fn a_reply_for_another_seq_is_a_protocol_error() {
        let (client, mut peer) = pair();
        let shim = thread::spawn(move || {
            accept_lease(&mut peer);
            let (req, fd) = recv_fd(&peer);
            nix::unistd::close(fd).unwrap();
            peer.write_all(
                &Reply::Ok {
                    seq: req.seq + 5,
                    id: Id([2; 16]),
                }
                .encode(),
            )
            .unwrap();
        });
        let lease = Arc::new(Lease::open(client, Path::new(SOCKET)).await.unwrap());
        let m = fabric::Memory::memfd("s3dma-test", 4096).unwrap();
        let e = lease.pass_fd(m.fd().unwrap()).await.unwrap_err();
        shim.join().unwrap();
        assert_eq!(e.code(), "LeaseProtocol", "{e}");
    }
}
