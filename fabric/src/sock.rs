//! Socket helpers: raw-pointer `send`/`recv` on tokio sockets, so region
//! memory is moved by the kernel without Rust references to it, and socket
//! tuning.

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;

/// Socket tuning shared by endpoints and sessions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tuning {
    pub(crate) socket_buffer: Option<usize>,
    pub(crate) user_timeout: Option<Duration>,
}

pub(crate) fn tune(stream: &TcpStream, t: Tuning) -> io::Result<()> {
    let s = socket2::SockRef::from(stream);
    s.set_tcp_nodelay(true)?;
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(5))
        .with_retries(3);
    s.set_tcp_keepalive(&ka)?;
    if let Some(t) = t.user_timeout {
        s.set_tcp_user_timeout(Some(t))?;
    }
    if let Some(b) = t.socket_buffer {
        s.set_send_buffer_size(b)?;
        s.set_recv_buffer_size(b)?;
    }
    Ok(())
}

fn cvt(n: isize) -> io::Result<usize> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// One non-blocking `recv(2)` into `[ptr, ptr+len)`.
///
/// # Safety
/// `[ptr, ptr+len)` must be valid for writes for the duration of the call.
pub(crate) unsafe fn recv_once(stream: &TcpStream, ptr: *mut u8, len: usize) -> io::Result<usize> {
    let fd = stream.as_raw_fd();
    stream.try_io(Interest::READABLE, || {
        // SAFETY: the caller guarantees the destination range is writable;
        // the kernel writes at most `len` bytes into it.
        cvt(unsafe { libc::recv(fd, ptr.cast(), len, libc::MSG_DONTWAIT) })
    })
}

/// One non-blocking `sendmsg(2)` of `head` followed by `[ptr, ptr+len)`.
///
/// # Safety
/// `[ptr, ptr+len)` must be valid for reads for the duration of the call.
pub(crate) unsafe fn send_once(
    stream: &TcpStream,
    head: &[u8],
    ptr: *const u8,
    len: usize,
) -> io::Result<usize> {
    let fd = stream.as_raw_fd();
    stream.try_io(Interest::WRITABLE, || {
        let mut iov = [
            libc::iovec {
                iov_base: head.as_ptr() as *mut libc::c_void,
                iov_len: head.len(),
            },
            libc::iovec {
                iov_base: ptr as *mut libc::c_void,
                iov_len: len,
            },
        ];
        let (iov_ptr, iovcnt) = if head.is_empty() {
            (iov[1..].as_mut_ptr(), 1)
        } else if len == 0 {
            (iov.as_mut_ptr(), 1)
        } else {
            (iov.as_mut_ptr(), 2)
        };
        // SAFETY: an all-zero msghdr is a valid "no address, no control" header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov_ptr;
        msg.msg_iovlen = iovcnt;
        // SAFETY: the iovecs point at `head` (borrowed for the call) and at
        // the caller-guaranteed readable range; the kernel only reads them.
        cvt(unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) })
    })
}

/// Sends `head` then `[ptr, ptr+len)` completely.
///
/// # Safety
/// `[addr, addr+len)` must stay valid for reads until the future completes or is dropped.
pub(crate) async unsafe fn send_all(
    stream: &TcpStream,
    head: &[u8],
    addr: usize,
    len: usize,
) -> io::Result<()> {
    let total = head.len() + len;
    let mut done = 0usize;
    while done < total {
        stream.writable().await?;
        let r = if done < head.len() {
            // SAFETY: forwarded from the caller.
            unsafe { send_once(stream, &head[done..], addr as *const u8, len) }
        } else {
            let off = done - head.len();
            // SAFETY: forwarded from the caller; off < len.
            unsafe { send_once(stream, &[], (addr + off) as *const u8, len - off) }
        };
        match r {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sends `len` bytes of `file` from `offset` with `sendfile(2)`: the kernel
/// hands page-cache pages to the socket without a copy through user space.
/// Returns the bytes sent, fewer than `len` only when the file ends first.
pub(crate) async fn send_file(
    stream: &TcpStream,
    file: &std::fs::File,
    offset: u64,
    len: u64,
) -> io::Result<u64> {
    let sock = stream.as_raw_fd();
    let src = file.as_raw_fd();
    let mut done = 0u64;
    while done < len {
        stream.writable().await?;
        // Linux moves at most 0x7ffff000 bytes per call.
        let want = usize::try_from(len - done)
            .unwrap_or(usize::MAX)
            .min(1 << 30);
        let mut off = libc::off_t::try_from(offset + done)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file offset too large"))?;
        let r = stream.try_io(Interest::WRITABLE, || {
            // SAFETY: `sock` and `src` are open descriptors borrowed for the
            // call (the stream and the file outlive it); `off` is a valid
            // off_t that the kernel reads and updates.
            cvt(unsafe { libc::sendfile(sock, src, &mut off, want) })
        });
        match r {
            Ok(0) => return Ok(done),
            Ok(n) => done += n as u64,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Sends `len` zero bytes (to keep a stream's framing when a file ended
/// before the length its header announced).
pub(crate) async fn send_zeros(stream: &TcpStream, mut len: u64) -> io::Result<()> {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    while len > 0 {
        let n = usize::try_from(len).unwrap_or(usize::MAX).min(ZEROS.len());
        send_buf(stream, &ZEROS[..n]).await?;
        len -= n as u64;
    }
    Ok(())
}

/// Sends a small buffer completely.
pub(crate) async fn send_buf(stream: &TcpStream, buf: &[u8]) -> io::Result<()> {
    // SAFETY: an empty payload range is trivially valid.
    unsafe { send_all(stream, buf, 0, 0).await }
}

/// Receives exactly `len` bytes into `[ptr, ptr+len)`.
///
/// # Safety
/// `[addr, addr+len)` must stay valid for writes until the future completes or is dropped.
pub(crate) async unsafe fn recv_exact_raw(
    stream: &TcpStream,
    addr: usize,
    len: usize,
) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        stream.readable().await?;
        // SAFETY: forwarded from the caller; done < len.
        match unsafe { recv_once(stream, (addr + done) as *mut u8, len - done) } {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Receives exactly `buf.len()` bytes into `buf`. `Ok(false)` on a clean EOF
/// before the first byte.
pub(crate) async fn recv_exact(stream: &TcpStream, buf: &mut [u8]) -> io::Result<bool> {
    let mut done = 0usize;
    while done < buf.len() {
        stream.readable().await?;
        match stream.try_read(&mut buf[done..]) {
            Ok(0) if done == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// How [`recv_exact_flushing`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recv {
    /// The buffer is full.
    Done,
    /// A clean EOF before the first byte.
    Eof,
    /// The connection was idle past its timeout.
    Idle,
}

/// [`recv_exact`] for a responder that holds back completions: `pending`
/// (encoded frames) is sent, and emptied, before the first wait for the
/// socket to become readable, so completions wait only while the next
/// request is already there to be read. While it waits, `idle_left` says
/// how long the connection may stay idle (`None`: for ever); when that is
/// zero it ends with [`Recv::Idle`].
pub(crate) async fn recv_exact_flushing(
    stream: &TcpStream,
    buf: &mut [u8],
    pending: &mut Vec<u8>,
    idle_left: &mut impl FnMut() -> Option<Duration>,
) -> io::Result<Recv> {
    let mut done = 0usize;
    while done < buf.len() {
        match stream.try_read(&mut buf[done..]) {
            Ok(0) if done == 0 => return Ok(Recv::Eof),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !pending.is_empty() {
                    send_buf(stream, pending).await?;
                    pending.clear();
                }
                loop {
                    match idle_left() {
                        None => {
                            stream.readable().await?;
                            break;
                        }
                        Some(left) if left.is_zero() => return Ok(Recv::Idle),
                        Some(left) => {
                            if let Ok(r) = tokio::time::timeout(left, stream.readable()).await {
                                r?;
                                break;
                            }
                        }
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Recv::Done)
}

/// Resolves once the flag in `rx` is true (or its sender is gone).
pub(crate) async fn cancelled(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|c| *c).await;
}
