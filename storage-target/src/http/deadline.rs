//! The connection's deadlines: the time a request head may take
//! (`HEADER_READ_TIMEOUT`), and the write deadline (`WriteDeadline`):
//! a client that takes no response bytes for `IDLE_TIMEOUT` fails its
//! connection. It also counts the bytes a connection moves, for the
//! transfer rate of the caps.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::body::IDLE_TIMEOUT;
use super::caps::Conn;

/// Time a connection has to send a whole request head, counted from the
/// connection's start or the end of its previous request (so idle
/// keep-alive connections close too). hyper enforces it only with a timer;
/// without one, a peer that sends half a head, or nothing, holds its
/// connection for ever.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection whose writes fail once the client has taken no bytes for
/// [`IDLE_TIMEOUT`] (the time counts only while a write waits on it), and
/// that counts the bytes it moves, both ways, for the transfer rate
/// ([`Conn::moved`]).
pub(crate) struct WriteDeadline {
    io: tokio::net::TcpStream,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
    conn: Arc<Conn>,
}

impl WriteDeadline {
    /// `io`, the connection `conn`.
    pub(crate) fn new(io: tokio::net::TcpStream, conn: Arc<Conn>) -> Self {
        WriteDeadline {
            io,
            stalled: None,
            conn,
        }
    }

    /// Counts `n` bytes moved.
    fn moved(&self, n: usize) {
        self.conn.moved(n);
    }

    /// Passes a ready result through (and stops the clock); on pending,
    /// starts the clock or fails once it has run out.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if r.is_ready() {
            self.stalled = None;
            return r;
        }
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(IDLE_TIMEOUT)));
        if stalled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the client took no response bytes for {} s",
                    IDLE_TIMEOUT.as_secs()
                ),
            )));
        }
        Poll::Pending
    }
}

impl tokio::io::AsyncRead for WriteDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            self.moved(buf.filled().len().saturating_sub(before));
        }
        r
    }
}

impl tokio::io::AsyncWrite for WriteDeadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.moved(n);
        }
        self.check(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.moved(n);
        }
        self.check(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.check(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_shutdown(cx);
        self.check(cx, r)
    }
}
