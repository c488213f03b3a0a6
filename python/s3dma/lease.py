"""The lease protocol: passing memfds (and CUDA fds) to the host-shim (not gRPC).

A connection to the shim's socket that starts with :data:`MAGIC` is a
*lease*. The shim answers the magic with the lease id; then every
:func:`encode_fd_request` frame (host memory: a sealed memfd) or
:func:`encode_cuda_fd_request` frame (device memory: the POSIX fd of
``cuMemExportToShareableHandle``), sent with exactly one fd attached
(``SCM_RIGHTS``), is answered with the same ``seq`` and an *fd handle* that
RegisterBuffer accepts. Buffers registered under a lease are released when
the lease connection closes (the process exits or dies; after a fork, when
the last process holding it closes it).

Frames (mirrors ``proto/src/lease.rs``)::

    request  8 bytes:  b"FD" 0 0  seq u32 LE            (+ 1 memfd)
                       b"CU" 0 0  seq u32 LE            (+ 1 CUDA fd)
    reply   24 bytes:  status u8 (0 ok, 1 error)  reserved u8 (0)
                       message_len u16 LE  seq u32 LE  id [16]u8
                       then message_len bytes of UTF-8 (errors only)
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from dataclasses import dataclass

MAGIC = b"S3DMALS1"
REQUEST_LEN = 8
REPLY_HEADER_LEN = 24
MAX_MESSAGE_LEN = 1024
ID_LEN = 16

_REQ = struct.Struct("<2sHI")  # b"FD", reserved, seq
_HDR = struct.Struct("<BBHI16s")  # status, reserved, message_len, seq, id


class FrameError(ValueError):
    """A malformed lease frame."""


@dataclass(frozen=True)
class ReplyHeader:
    ok: bool
    seq: int
    id: bytes
    message_len: int


@dataclass(frozen=True)
class Reply:
    ok: bool
    seq: int
    id: bytes  # lease id or fd handle (zeros on errors)
    message: str  # empty on success


def encode_fd_request(seq: int) -> bytes:
    """The 8-byte frame that carries one fd: ``F`` ``D`` 0 0 seq (u32 LE)."""
    if not 0 <= seq <= 0xFFFFFFFF:
        raise ValueError(f"seq {seq} is not a u32")
    return _REQ.pack(b"FD", 0, seq)


def encode_cuda_fd_request(seq: int) -> bytes:
    """The 8-byte frame that carries one CUDA shareable handle (a POSIX fd
    from ``cuMemExportToShareableHandle``): ``C`` ``U`` 0 0 seq (u32 LE)."""
    if not 0 <= seq <= 0xFFFFFFFF:
        raise ValueError(f"seq {seq} is not a u32")
    return _REQ.pack(b"CU", 0, seq)


def decode_fd_request(b: bytes) -> int:
    """Parses an fd request frame; returns its seq (for fake shims in tests)."""
    if len(b) != REQUEST_LEN:
        raise FrameError(f"a lease request is {REQUEST_LEN} bytes, not {len(b)}")
    tag, reserved, seq = _REQ.unpack(b)
    if tag != b"FD":
        raise FrameError(f"unknown lease request {tag!r} (expected b'FD')")
    if reserved != 0:
        raise FrameError("reserved bytes of a lease frame are not zero")
    return seq


def encode_reply(reply: Reply) -> bytes:
    """Header and message as the shim writes them (for fake shims in tests)."""
    if reply.ok:
        msg = b""
        rid = reply.id
        if len(rid) != ID_LEN:
            raise ValueError(f"ids are {ID_LEN} bytes, not {len(rid)}")
    else:
        msg = reply.message.encode()[:MAX_MESSAGE_LEN]
        while msg:  # cut on a character boundary, like the shim
            try:
                msg.decode()
                break
            except UnicodeDecodeError:
                msg = msg[:-1]
        rid = bytes(ID_LEN)
    return _HDR.pack(0 if reply.ok else 1, 0, len(msg), reply.seq, rid) + msg


def decode_reply_header(h: bytes) -> ReplyHeader:
    """Parses a 24-byte reply header (read ``message_len`` more bytes after it)."""
    if len(h) != REPLY_HEADER_LEN:
        raise FrameError(f"a lease reply header is {REPLY_HEADER_LEN} bytes, not {len(h)}")
    status, reserved, message_len, seq, rid = _HDR.unpack(h)
    if status > 1:
        raise FrameError(f"unknown lease reply status {status}")
    if reserved != 0:
        raise FrameError("reserved bytes of a lease frame are not zero")
    if message_len > MAX_MESSAGE_LEN:
        raise FrameError(f"lease reply message of {message_len} bytes is longer than {MAX_MESSAGE_LEN}")
    if status == 0 and message_len != 0:
        raise FrameError("a successful lease reply carries a message")
    return ReplyHeader(ok=status == 0, seq=seq, id=rid, message_len=message_len)


def finish_reply(h: ReplyHeader, message: bytes) -> Reply:
    return Reply(ok=h.ok, seq=h.seq, id=h.id, message="" if h.ok else message.decode("utf-8", "replace"))


class LeaseError(OSError):
    """The lease connection failed or the shim refused a frame.

    ``shim_message`` is the shim's text when it answered with an error."""

    def __init__(self, message: str, shim_message: str = ""):
        super().__init__(message)
        self.shim_message = shim_message


class LeaseDropped(LeaseError):
    """The shim closed a new lease connection without answering: what it
    does to uids that are not its tenants."""

    def __init__(self, path: str):
        super().__init__(
            f"the host-shim at {path}: the shim closed the connection before answering: "
            f"uid {os.geteuid()} is probably not one of its tenants (or has too many connections open)"
        )


def _recv_exact(sock: socket.socket, n: int, what: str) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise LeaseError(f"the host-shim closed the lease while the client waited for {what}")
        buf += chunk
    return bytes(buf)


class Lease:
    """One lease connection. Thread-safe: fd passes are serialized by a lock.

    ``Lease(path)`` connects, checks who serves the socket (``policy``, a
    :class:`s3dma.peer.ShimPolicy`; ``None`` checks nothing), sends the
    magic and reads the lease id (:attr:`id`); :meth:`pass_fd` hands one fd
    to the shim and returns its fd handle. Closing the lease (or the process
    ending) releases every buffer registered under it. A shim that hangs up
    before answering raises :class:`LeaseDropped`."""

    def __init__(self, path: str, timeout: float | None = 30.0, policy=None):
        self.path = path
        self._lock = threading.Lock()
        self._seq = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.settimeout(timeout)
            self._sock.connect(path)
            if policy is not None:
                policy.check(self._sock, path)  # before a byte is sent
            try:
                self._sock.sendall(MAGIC)
                first = self._sock.recv(REPLY_HEADER_LEN)
            except (BrokenPipeError, ConnectionResetError):
                first = b""
            if not first:
                raise LeaseDropped(path)
            rest = _recv_exact(self._sock, REPLY_HEADER_LEN - len(first), "the lease id")
            h = decode_reply_header(first + rest)
            msg = _recv_exact(self._sock, h.message_len, "the lease id") if h.message_len else b""
            reply = finish_reply(h, msg)
        except BaseException:
            self._sock.close()
            raise
        if not reply.ok:
            self._sock.close()
            raise LeaseError(f"the host-shim at {path} refused the lease: {reply.message}", reply.message)
        if reply.seq != 0:
            self._sock.close()
            raise LeaseError(f"the host-shim at {path} answered the lease magic with seq {reply.seq}, not 0")
        self.id: bytes = reply.id
        self.pid = os.getpid()

    @classmethod
    def from_socket(cls, sock: socket.socket, path: str = "<socket>") -> "Lease":
        """A lease over an already connected socket (tests, socketpairs)."""
        self = cls.__new__(cls)
        self.path = path
        self._lock = threading.Lock()
        self._seq = 0
        self._sock = sock
        sock.sendall(MAGIC)
        reply = self._read_reply("the lease id")
        if not reply.ok:
            raise LeaseError(f"the host-shim refused the lease: {reply.message}", reply.message)
        self.id = reply.id
        self.pid = os.getpid()
        return self

    def _read_reply(self, what: str) -> Reply:
        h = decode_reply_header(_recv_exact(self._sock, REPLY_HEADER_LEN, what))
        msg = _recv_exact(self._sock, h.message_len, what) if h.message_len else b""
        return finish_reply(h, msg)

    def pass_fd(self, fd: int, cuda: bool = False) -> bytes:
        """Sends ``fd`` to the shim (a memfd, or with ``cuda`` a CUDA
        shareable handle); returns the 16-byte fd handle."""
        with self._lock:
            if self._sock.fileno() < 0:
                raise LeaseError("the lease is closed")
            self._seq = (self._seq + 1) & 0xFFFFFFFF or 1
            seq = self._seq
            frame = encode_cuda_fd_request(seq) if cuda else encode_fd_request(seq)
            sent = socket.send_fds(self._sock, [frame], [fd])
            if sent != len(frame):  # a stream socket sends 8 bytes whole in practice
                self._sock.sendall(frame[sent:])
            reply = self._read_reply(f"the fd handle (seq {seq})")
        if reply.seq != seq:
            raise LeaseError(f"the host-shim answered fd request {seq} with seq {reply.seq}")
        if not reply.ok:
            raise LeaseError(f"the host-shim refused the buffer's memory: {reply.message}", reply.message)
        return reply.id

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def closed(self) -> bool:
        return self._sock.fileno() < 0

    def close(self) -> None:
        with self._lock:
            self._sock.close()
