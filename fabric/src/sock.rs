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
    /// [`crate::SessionConfig::dead_peer_timeout`] /
    /// [`crate::EndpointConfig::dead_peer_timeout`].
    pub(crate) dead_peer_timeout: Duration,
}

/// The shortest and longest dead-peer timeouts: TCP keepalive counts in
/// whole seconds, and `TCP_USER_TIMEOUT` of zero would mean "the kernel's
/// default" (about 15 minutes), the very thing the knob replaces.
pub(crate) const DEAD_PEER_TIMEOUT_RANGE: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(3600));

/// Refuses a dead-peer timeout outside [`DEAD_PEER_TIMEOUT_RANGE`].
pub(crate) fn check_dead_peer_timeout(t: Duration) -> crate::Result<()> {
    let (min, max) = DEAD_PEER_TIMEOUT_RANGE;
    if t < min || t > max {
        return Err(crate::FabricError::InvalidArgument(format!(
            "dead_peer_timeout must be between {min:?} and {max:?}, not {t:?}"
        )));
    }
    Ok(())
}

/// TCP keepalive (idle time, probe interval, probe count) for a dead-peer
/// timeout `t`: the first probe after half of it without traffic, the
/// rest of it split into probes at least a second apart, so that an idle
/// connection whose peer stopped answering is declared dead after about
/// `t` (`TCP_USER_TIMEOUT`, set to `t` too, then ends it at the first
/// unanswered probe past `t`). Pure; whole seconds, at least one each.
pub(crate) fn keepalive_for(t: Duration) -> (Duration, Duration, u32) {
    let secs = t.as_secs().max(1);
    let idle = (secs / 2).max(1);
    let rest = secs.saturating_sub(idle).max(1);
    let interval = (rest / 3).max(1);
    let count = u32::try_from((rest / interval).max(1)).unwrap_or(u32::MAX);
    (
        Duration::from_secs(idle),
        Duration::from_secs(interval),
        count,
    )
}

/// Tunes a fabric socket: no Nagle delay, and dead-peer detection, so
/// that a connection whose peer stopped answering (a cut link, a host
/// gone) fails within `t.dead_peer_timeout` instead of TCP's ~15 minutes:
/// `TCP_USER_TIMEOUT` bounds how long sent data (or a zero window) may stay
/// unacknowledged, and keepalive probes an idle connection (a requester
/// waiting for READ data, a responder waiting for requests).
pub(crate) fn tune(stream: &TcpStream, t: Tuning) -> io::Result<()> {
    let s = socket2::SockRef::from(stream);
    s.set_tcp_nodelay(true)?;
    let (idle, interval, count) = keepalive_for(t.dead_peer_timeout);
    let ka = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(interval)
        .with_retries(count);
    s.set_tcp_keepalive(&ka)?;
    s.set_tcp_user_timeout(Some(t.dead_peer_timeout))?;
    if let Some(b) = t.socket_buffer {
        s.set_send_buffer_size(b)?;
        s.set_recv_buffer_size(b)?;
    }
    Ok(())
}

/// Makes the socket's close a reset (`SO_LINGER` 0): whatever is still
/// queued in it is discarded instead of being delivered after the session
/// failed (a failed operation's bytes must never be placed late), and no
/// orphaned socket keeps retrying them. Best effort: a socket the kernel
/// already ended needs nothing.
pub(crate) fn reset_on_close(stream: &TcpStream) {
    if let Err(e) = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO)) {
        tracing::debug!(error = %e, "setting SO_LINGER 0 on a failed fabric socket");
    }
}

/// Resets the connection now, while the socket stays open (other owners
/// of the stream may still hold it): `SO_LINGER` 0, then `connect(2)` to
/// an `AF_UNSPEC` address, which on Linux disconnects a TCP socket with a
/// reset. A failed session's peer so never sees an orderly end of stream,
/// nor bytes still queued. Best effort.
pub(crate) fn reset_now(stream: &TcpStream) {
    reset_on_close(stream);
    // SAFETY: an all-zero sockaddr is a valid AF_UNSPEC (0) address of the
    // length passed; `fd` is the stream's open socket for the call.
    let rc = unsafe {
        let unspec: libc::sockaddr = std::mem::zeroed();
        libc::connect(
            stream.as_raw_fd(),
            &unspec,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "resetting a failed fabric socket");
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{getsockopt, sockopt};

    #[test]
    fn keepalive_spans_the_dead_peer_timeout() {
        let s = Duration::from_secs;
        assert_eq!(keepalive_for(s(1)), (s(1), s(1), 1));
        assert_eq!(keepalive_for(s(5)), (s(2), s(1), 3));
        assert_eq!(keepalive_for(s(30)), (s(15), s(5), 3));
        assert_eq!(keepalive_for(s(3600)), (s(1800), s(600), 3));
        // Never a zero that the kernel would refuse or read as "default".
        for ms in [0, 1, 999, 1500, 7_000, 59_999] {
            let (idle, interval, count) = keepalive_for(Duration::from_millis(ms));
            assert!(idle >= s(1) && interval >= s(1) && count >= 1, "{ms} ms");
        }
        // About the timeout: idle + interval * count, within a probe.
        for secs in 2..200 {
            let (idle, interval, count) = keepalive_for(s(secs));
            let total = idle + interval * count;
            assert!(total <= s(secs) && total + interval > s(secs), "{secs} s");
        }
    }

    #[test]
    fn dead_peer_timeouts_out_of_range_are_refused() {
        for bad in [
            Duration::ZERO,
            Duration::from_millis(999),
            Duration::from_secs(3601),
        ] {
            let e = check_dead_peer_timeout(bad).unwrap_err().to_string();
            assert!(e.contains("dead_peer_timeout must be between"), "{e}");
        }
        for good in [
            Duration::from_secs(1),
            Duration::from_secs(5),
            Duration::from_secs(3600),
        ] {
            check_dead_peer_timeout(good).unwrap();
        }
    }

    /// The options as the kernel reports them on a real loopback socket.
    #[tokio::test]
    async fn tune_sets_dead_peer_detection_and_reset_sets_linger_zero() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let _peer = l.accept().await.unwrap();
        tune(
            &s,
            Tuning {
                socket_buffer: None,
                dead_peer_timeout: Duration::from_millis(7_500),
            },
        )
        .unwrap();
        assert_eq!(getsockopt(&s, sockopt::TcpUserTimeout).unwrap(), 7_500);
        assert!(getsockopt(&s, sockopt::KeepAlive).unwrap());
        assert_eq!(getsockopt(&s, sockopt::TcpKeepIdle).unwrap(), 3);
        assert_eq!(getsockopt(&s, sockopt::TcpKeepInterval).unwrap(), 1);
        assert_eq!(getsockopt(&s, sockopt::TcpKeepCount).unwrap(), 4);
        assert!(getsockopt(&s, sockopt::TcpNoDelay).unwrap());
        let l0 = getsockopt(&s, sockopt::Linger).unwrap();
        assert_eq!(l0.l_onoff, 0, "a healthy socket closes normally");
        reset_on_close(&s);
        let l1 = getsockopt(&s, sockopt::Linger).unwrap();
        assert_eq!((l1.l_onoff, l1.l_linger), (1, 0));
    }
}
