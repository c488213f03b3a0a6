"""The Python tenant client (python/s3dma).

Unit tests (no server): lease frames, the lease handshake and fd passing
against a fake shim on a socketpair, ranges, error decoding.

End-to-end tests: a real `s3dma local` (storage-target, dpu-agent and
host-shim over the tcp fabric; see tenant_stack.py). Object bytes are
checked by SHA-256 over memoryviews of the buffers, never copied.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import grpc
import numpy as np
import pytest

from tenant_stack import BUCKET, PY_CLIENT  # noqa: E402  (sets sys.path)

import s3dma  # noqa: E402
from s3dma import errors, lease  # noqa: E402
from s3dma.dataset import ObjectDataset  # noqa: E402
from s3dma.ranges import ByteRange, parse_range  # noqa: E402

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
SENTINEL = 0xA5


# ---------------------------------------------------------------------------
# unit: lease frames
# ---------------------------------------------------------------------------


def test_fd_request_frames_match_the_rust_codec():
    assert lease.encode_fd_request(0) == b"FD\x00\x00\x00\x00\x00\x00"
    assert lease.encode_fd_request(0xDEADBEEF) == b"FD\x00\x00\xef\xbe\xad\xde"
    for seq in (0, 1, 0xDEADBEEF, 0xFFFFFFFF):
        assert lease.decode_fd_request(lease.encode_fd_request(seq)) == seq
    with pytest.raises(lease.FrameError, match="unknown lease request"):
        lease.decode_fd_request(b"PRI * HT")
    with pytest.raises(lease.FrameError, match="reserved"):
        lease.decode_fd_request(b"FD\x00\x01\x00\x00\x00\x00")
    with pytest.raises(ValueError):
        lease.encode_fd_request(1 << 32)


def test_reply_frames_round_trip_and_bad_headers_are_refused():
    ok = lease.Reply(ok=True, seq=7, id=bytes([9]) * 16, message="")
    b = lease.encode_reply(ok)
    assert len(b) == 24 and b[:8] == b"\x00\x00\x00\x00\x07\x00\x00\x00" and b[8:] == bytes([9]) * 16
    h = lease.decode_reply_header(b)
    assert (h.ok, h.seq, h.id, h.message_len) == (True, 7, bytes([9]) * 16, 0)
    assert lease.finish_reply(h, b"") == ok

    err = lease.Reply(ok=False, seq=8, id=bytes(16), message="uid 1234 is not a tenant of this host-shim")
    b = lease.encode_reply(err)
    h = lease.decode_reply_header(b[:24])
    assert not h.ok and h.seq == 8 and h.message_len == len(b) - 24
    assert lease.finish_reply(h, b[24:]) == err

    # Long messages are cut to 1024 bytes on a character boundary.
    b = lease.encode_reply(lease.Reply(ok=False, seq=1, id=bytes(16), message="é" * 1024))
    h = lease.decode_reply_header(b[:24])
    assert h.message_len <= lease.MAX_MESSAGE_LEN
    assert set(lease.finish_reply(h, b[24:]).message) == {"é"}

    hdr = bytearray(24)
    hdr[0] = 2
    with pytest.raises(lease.FrameError, match="status 2"):
        lease.decode_reply_header(bytes(hdr))
    hdr[0] = 1
    hdr[2:4] = (2000).to_bytes(2, "little")
    with pytest.raises(lease.FrameError, match="2000 bytes"):
        lease.decode_reply_header(bytes(hdr))
    hdr[0] = 0
    hdr[2:4] = (3).to_bytes(2, "little")
    with pytest.raises(lease.FrameError, match="carries a message"):
        lease.decode_reply_header(bytes(hdr))
    hdr[2:4] = b"\x00\x00"
    hdr[1] = 1
    with pytest.raises(lease.FrameError, match="reserved"):
        lease.decode_reply_header(bytes(hdr))
    with pytest.raises(lease.FrameError):
        lease.decode_reply_header(b"\x00" * 23)


def _fake_shim(sock: socket.socket, seen: list, refuse_fd_with: str | None = None):
    """Answers the magic and fd requests like the shim's lease handler."""
    magic = sock.recv(8)
    assert magic == lease.MAGIC
    sock.sendall(lease.encode_reply(lease.Reply(True, 0, b"L" * 16, "")))
    while True:
        msg, fds, _flags, _addr = socket.recv_fds(sock, 8, 4)
        if not msg:
            return
        seq = lease.decode_fd_request(msg)
        seen.append((seq, fds))
        if refuse_fd_with is not None or len(fds) != 1:
            reply = lease.Reply(False, seq, bytes(16), refuse_fd_with or f"expected 1 fd, got {len(fds)}")
        else:
            seals = fcntl.fcntl(fds[0], fcntl.F_GET_SEALS)
            if not seals & fcntl.F_SEAL_SHRINK:
                reply = lease.Reply(False, seq, bytes(16), "the memfd is not sealed against shrinking")
            else:
                reply = lease.Reply(True, seq, seq.to_bytes(16, "little"), "")
        sock.sendall(lease.encode_reply(reply))


def test_lease_handshake_and_fd_passing_against_a_fake_shim():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    seen: list = []
    t = threading.Thread(target=_fake_shim, args=(b, seen), daemon=True)
    t.start()
    le = lease.Lease.from_socket(a)
    assert le.id == b"L" * 16
    fd = os.memfd_create("t", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 4096)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    handles = [le.pass_fd(fd) for _ in range(3)]
    assert handles == [i.to_bytes(16, "little") for i in (1, 2, 3)]
    assert [s for s, _ in seen] == [1, 2, 3]
    # The fake shim got real fds of the same memfd.
    for _, fds in seen:
        assert len(fds) == 1 and os.fstat(fds[0]).st_ino == os.fstat(fd).st_ino
        os.close(fds[0])
    # An unsealed memfd is refused with the shim's message.
    bad = os.memfd_create("t", os.MFD_CLOEXEC)
    with pytest.raises(lease.LeaseError, match="not sealed against shrinking") as ei:
        le.pass_fd(bad)
    assert "not sealed" in ei.value.shim_message
    for _, fds in seen[3:]:
        for f in fds:
            os.close(f)
    os.close(bad)
    os.close(fd)
    le.close()
    t.join(5)
    b.close()


def test_lease_refused_at_the_magic_is_a_clear_error():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def refuse():
        b.recv(8)
        b.sendall(lease.encode_reply(lease.Reply(False, 0, bytes(16), "uid 4242 is not a tenant of this host-shim")))
        b.close()

    threading.Thread(target=refuse, daemon=True).start()
    with pytest.raises(lease.LeaseError, match="uid 4242 is not a tenant"):
        lease.Lease.from_socket(a)


# ---------------------------------------------------------------------------
# unit: ranges, errors, connecting
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, want",
    [
        ("0-9", ByteRange(first=0, last=9)),
        ("bytes=100-199", ByteRange(first=100, last=199)),
        ("5-", ByteRange(first=5)),
        ("-7", ByteRange(suffix=7)),
        ((3, 4), ByteRange(first=3, last=4)),
        ((3, None), ByteRange(first=3)),
        ((None, 12), ByteRange(suffix=12)),
        (None, None),
        (ByteRange(first=1, last=1), ByteRange(first=1, last=1)),
    ],
)
def test_ranges_parse(given, want):
    assert parse_range(given) == want


@pytest.mark.parametrize("bad", ["", "-", "abc", "9-3", "1-2-3", "bytes=", (None, None), (5, 2), (-1, 3), 7, (1.5, 2)])
def test_bad_ranges_are_refused(bad):
    with pytest.raises(ValueError):
        parse_range(bad)


def test_ranges_become_protos_and_lengths():
    from s3dma._pb import agent_pb2

    assert parse_range("0-9").to_proto() == agent_pb2.ByteRange(bounded=agent_pb2.ByteRange.Bounded(first=0, last=9))
    assert parse_range("5-").to_proto().WhichOneof("kind") == "from"
    assert getattr(parse_range("5-").to_proto(), "from") == 5
    assert parse_range("-7").to_proto().suffix == 7
    assert parse_range("0-9").length() == 10
    assert parse_range("5-").length(100) == 95
    assert parse_range("90-200").length(100) == 10
    assert parse_range("-7").length(3) == 3
    assert str(parse_range((None, 4))) == "-4"


class _FakeRpcError(grpc.RpcError):
    def __init__(self, code, details, trailing):
        self._c, self._d, self._t = code, details, trailing

    def code(self):
        return self._c

    def details(self):
        return self._d

    def trailing_metadata(self):
        return self._t


def _status_bin(code: int, message: str, reason: str, domain: str, meta: dict) -> bytes:
    from google.rpc import error_details_pb2, status_pb2

    st = status_pb2.Status(code=code, message=message)
    st.details.add().Pack(error_details_pb2.ErrorInfo(reason=reason, domain=domain, metadata=meta))
    return st.SerializeToString()


def test_errors_are_decoded_from_error_info():
    raw = _status_bin(5, "NoSuchKey: gone", "NoSuchKey", "s3dma.agent", {"message": "gone", "request_id": "r-1"})
    e = errors.from_rpc_error(_FakeRpcError(grpc.StatusCode.NOT_FOUND, "NoSuchKey: gone", [("grpc-status-details-bin", raw)]))
    assert isinstance(e, s3dma.NotFound)
    assert (e.code, e.message, e.request_id, e.domain, e.grpc_code) == (
        "NoSuchKey",
        "gone",
        "r-1",
        "s3dma.agent",
        grpc.StatusCode.NOT_FOUND,
    )
    assert "NoSuchKey" in str(e) and "r-1" in str(e)

    cases = [
        ("NoSuchBuffer", grpc.StatusCode.NOT_FOUND, s3dma.NotFound),
        ("OutOfBounds", grpc.StatusCode.INVALID_ARGUMENT, s3dma.OutOfBounds),
        ("DestinationTooSmall", grpc.StatusCode.INVALID_ARGUMENT, s3dma.OutOfBounds),
        ("InvalidRange", grpc.StatusCode.OUT_OF_RANGE, s3dma.InvalidRange),
        ("PreconditionFailed", grpc.StatusCode.FAILED_PRECONDITION, s3dma.PreconditionFailed),
        ("UnknownTenant", grpc.StatusCode.PERMISSION_DENIED, s3dma.AccessDenied),
        ("BufferLimit", grpc.StatusCode.RESOURCE_EXHAUSTED, s3dma.SlowDown),
        ("AgentUnavailable", grpc.StatusCode.UNAVAILABLE, s3dma.Unavailable),
        ("SomethingNew", grpc.StatusCode.PERMISSION_DENIED, s3dma.AccessDenied),
        ("SomethingNew", grpc.StatusCode.INTERNAL, s3dma.InternalError),
    ]
    for reason, code, cls in cases:
        raw = _status_bin(code.value[0], "m", reason, "s3dma.shim", {"message": "m"})
        e = errors.from_rpc_error(_FakeRpcError(code, "m", [("grpc-status-details-bin", raw)]))
        assert type(e) is cls, (reason, code, type(e))
        assert e.code == reason and isinstance(e, s3dma.S3dmaError)

    # No details (e.g. gRPC's own connect failure): the gRPC code decides,
    # the request id may come from x-request-id.
    e = errors.from_rpc_error(
        _FakeRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect", [("x-request-id", "r-9")]), "Info on host-shim /x"
    )
    assert isinstance(e, s3dma.Unavailable) and e.code == "" and e.request_id == "r-9"
    assert "/x" in e.message and "failed to connect" in e.message


def test_missing_or_refusing_socket_is_a_clear_error(tmp_path, monkeypatch):
    path = str(tmp_path / "nope.sock")
    with pytest.raises(s3dma.ShimUnavailable, match="no host-shim socket at .*nope.sock"):
        s3dma.Client(path)
    monkeypatch.setenv("S3DMA_SOCKET", path)
    assert s3dma.default_socket() == path
    with pytest.raises(s3dma.ShimUnavailable, match="nope.sock"):
        s3dma.Client()
    # A socket file nobody listens on: connection refused.
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()
    with pytest.raises(s3dma.ShimUnavailable, match="nope.sock refuses connections"):
        s3dma.Client(path)
    plain = tmp_path / "file"
    plain.write_text("x")
    with pytest.raises(s3dma.ShimUnavailable, match="is not a socket"):
        s3dma.Client(str(plain))


# ---------------------------------------------------------------------------
# unit: who serves the socket (SO_PEERCRED)
# ---------------------------------------------------------------------------

OTHER_UID = 65534  # nobody: plays another local user


def _root_or_skip():
    if os.geteuid() == 0:
        return
    if os.environ.get("CI"):
        pytest.fail(f"this test needs root (it acts as uid {OTHER_UID}), and CI is set", pytrace=False)
    pytest.skip(f"needs root (it acts as uid {OTHER_UID})")


class _Impostor:
    """A fake shim whose socket reports another uid: bound here, but
    ``listen()`` is called by a child that first drops to ``uid`` (the
    listener's credentials are what SO_PEERCRED reports). Serves leases like
    :func:`_fake_shim`; ``firsts`` holds the bytes each connection sent
    first (b"" for one closed without a byte)."""

    def __init__(self, path: str, uid: int = OTHER_UID):
        self.path = path
        self.firsts: list = []
        self.fds: list = []
        self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._srv.bind(path)
        pid = os.fork()
        if pid == 0:  # child: drop to uid, listen, leave
            code = 1
            try:
                os.setgid(uid)
                os.setuid(uid)
                self._srv.listen(16)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child could not listen as another uid"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            first = conn.recv(8)
            self.firsts.append(first)
            if first == lease.MAGIC:
                conn.sendall(lease.encode_reply(lease.Reply(True, 0, b"L" * 16, "")))
                while True:
                    msg, fds, _flags, _addr = socket.recv_fds(conn, 8, 4)
                    if not msg:
                        break
                    self.fds.extend(fds)
                    seq = lease.decode_fd_request(msg)
                    conn.sendall(lease.encode_reply(lease.Reply(True, seq, seq.to_bytes(16, "little"), "")))
            conn.close()

    def received_anything(self) -> bool:
        return any(self.firsts)

    def close(self):
        self._srv.close()
        for f in self.fds:
            os.close(f)


def _sealed_memfd(data: bytes) -> int:
    fd = os.memfd_create("t", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    return fd


def test_a_socket_served_by_another_uid_is_refused_unless_named(tmp_path, monkeypatch):
    _root_or_skip()
    monkeypatch.delenv("S3DMA_SHIM_UID", raising=False)
    path = str(tmp_path / "shim.sock")
    imp = _Impostor(path)
    try:
        with pytest.raises(s3dma.UntrustedShim) as ei:
            s3dma.Client(path)
        e = ei.value
        assert e.code == "UntrustedShim"
        assert f"the socket {path} is served by uid {OTHER_UID}" in str(e)
        assert "expected uid 0 (set S3DMA_SHIM_UID if the shim runs as another user)" in str(e)
        # The lease magic (and so any memfd) never went out.
        assert not imp.received_anything(), imp.firsts

        # Named by shim_uid (a uid or a user name) or $S3DMA_SHIM_UID, it is used.
        for named in (OTHER_UID, "nobody"):
            with s3dma.Client(path, shim_uid=named) as c:
                assert c.lease_id == b"L" * 16
        monkeypatch.setenv("S3DMA_SHIM_UID", "nobody")
        with s3dma.Client(path) as c:
            fd = _sealed_memfd(b"secret")
            try:
                assert c._lease.pass_fd(fd) == (1).to_bytes(16, "little")
            finally:
                os.close(fd)
        assert [f for f in imp.firsts if f] == [lease.MAGIC] * 3
        assert os.pread(imp.fds[0], 6, 0) == b"secret"

        # Another uid named: this one is refused again, naming both.
        monkeypatch.setenv("S3DMA_SHIM_UID", "4242")
        with pytest.raises(s3dma.UntrustedShim, match=f"served by uid {OTHER_UID}.*expected uid 0 or 4242"):
            s3dma.Client(path)
        monkeypatch.setenv("S3DMA_SHIM_UID", "no-such-user-s3dma")
        with pytest.raises(s3dma.InvalidArgument, match="S3DMA_SHIM_UID: no user called"):
            s3dma.Client(path)
        with pytest.raises(s3dma.InvalidArgument, match="shim_uid: no user called"):
            s3dma.Client(path, shim_uid="no-such-user-s3dma")
        assert len([f for f in imp.firsts if f]) == 3
    finally:
        imp.close()


def test_a_shim_that_hangs_up_before_answering_is_access_denied(tmp_path):
    path = str(tmp_path / "shim.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)

    def hang_up():  # what the shim does to a uid that is not its tenant
        conn, _ = srv.accept()
        conn.close()

    t = threading.Thread(target=hang_up, daemon=True)
    t.start()
    with pytest.raises(s3dma.AccessDenied) as ei:
        s3dma.Client(path)
    t.join(5)
    srv.close()
    assert ei.value.code == "ConnectionDropped"
    assert (
        f"the shim closed the connection before answering: uid {os.geteuid()} is probably not one of its tenants"
        in str(ei.value)
    )


# ---------------------------------------------------------------------------
# end to end: fixtures
# ---------------------------------------------------------------------------


@pytest.fixture
def prefix():
    return f"py-{uuid.uuid4().hex[:12]}/"


def fill_random(arr: np.ndarray, seed: int) -> None:
    """Random bytes into a uint8 array, 64 MiB at a time (no big temporaries)."""
    rng = np.random.default_rng(seed)
    chunk = 64 * MIB
    for i in range(0, arr.size, chunk):
        n = min(chunk, arr.size - i)
        arr[i : i + n] = rng.integers(0, 256, n, dtype=np.uint8)


def sha(mv) -> str:
    return hashlib.sha256(mv).hexdigest()


# ---------------------------------------------------------------------------
# end to end
# ---------------------------------------------------------------------------


def test_info_names_the_tenant(client):
    info = client.info()
    assert info.uid == os.getuid() and info.gid == os.getgid()
    assert info.tenant
    assert info.agent_connected
    assert info.max_buffers > 0 and info.max_buffer_bytes > 0


def _round_trip(client, key: str, size: int, seed: int):
    with client.alloc(max(size, 1), label=f"rt-{size}") as buf:
        arr = buf.numpy()
        fill_random(arr[:size], seed)
        mv = buf.memoryview()
        want = sha(mv[:size])
        put = client.put_object_from(BUCKET, key, buf, length=size, content_type="application/x-test")
        assert put.size == size and put.etag.startswith('"')
        assert put.path in ("rdma", "fallback", "mixed")

        head = client.head(BUCKET, key)
        assert head.size == size and head.etag == put.etag and head.content_type == "application/x-test"
        listed = {o.key: o for o in client.list_all(BUCKET, prefix=key)}
        assert key in listed and listed[key].size == size and listed[key].etag == put.etag

        arr[:] = SENTINEL  # the GET must put every byte back
        got = client.get_object_into(BUCKET, key, buf)
        assert got.bytes_placed == size and got.size == size and got.etag == put.etag and got.range_start == 0
        assert got.request_id
        assert sha(mv[:size]) == want
        assert sha(got.memoryview()) == want
        if size < buf.size:
            assert not np.any(arr[size:] != SENTINEL)
        del mv, arr

    client.delete(BUCKET, key)
    with pytest.raises(s3dma.NotFound):
        client.head(BUCKET, key)
    assert key not in {o.key for o in client.list_all(BUCKET, prefix=key)}


@pytest.mark.parametrize("size", [0, 1, 4 * KIB, 5 * MIB + 1], ids=["0B", "1B", "4KiB", "5MiB+1"])
def test_put_get_list_delete_by_checksum(client, prefix, size):
    _round_trip(client, f"{prefix}obj-{size}", size, seed=size)


def test_one_gib_round_trip(client, prefix):
    t0 = time.monotonic()
    _round_trip(client, f"{prefix}big", GIB, seed=1)
    print(f"1 GiB put+get+checks: {time.monotonic() - t0:.1f}s")


@pytest.fixture
def ten_k(client, prefix):
    """A 10000-byte object and its bytes."""
    key = f"{prefix}ten-k"
    data = np.random.default_rng(7).integers(0, 256, 10000, dtype=np.uint8)
    with client.alloc(10000) as src:
        src.numpy()[:] = data
        client.put_object_from(BUCKET, key, src)
    yield key, data.tobytes()
    client.delete(BUCKET, key)


def test_range_reads(client, ten_k):
    key, data = ten_k
    with client.alloc(16 * KIB) as buf:
        mv = buf.memoryview()
        for rng, first, n in [
            ("100-199", 100, 100),
            ((0, 0), 0, 1),
            ("9990-", 9990, 10),
            ((9000, None), 9000, 1000),
            ("-7", 9993, 7),
            ((None, 20000), 0, 10000),
            ("9995-20000", 9995, 5),  # `last` past the end is clamped
        ]:
            buf.numpy()[:] = SENTINEL
            r = client.get_object_into(BUCKET, key, buf, range=rng)
            assert (r.bytes_placed, r.range_start, r.size) == (n, first, 10000), rng
            assert sha(mv[:n]) == sha(data[first : first + n]), rng
            assert not np.any(buf.numpy()[n:] != SENTINEL), rng
        del mv
        with pytest.raises(s3dma.InvalidRange) as ei:
            client.get_object_into(BUCKET, key, buf, range="20000-")
        assert ei.value.code == "InvalidRange"


def test_get_into_an_offset_touches_nothing_else(client, ten_k):
    key, data = ten_k
    with client.alloc(64 * KIB) as buf:
        arr = buf.numpy()
        arr[:] = SENTINEL
        off = 12345
        r = client.get_object_into(BUCKET, key, buf, offset=off)
        assert r.bytes_placed == 10000 and r.offset == off
        assert sha(buf.memoryview()[off : off + 10000]) == sha(data)
        assert sha(r.memoryview()) == sha(data)
        assert not np.any(arr[:off] != SENTINEL)
        assert not np.any(arr[off + 10000 :] != SENTINEL)
        # An exact-fit slice in the middle, and a range into it.
        arr[:] = SENTINEL
        r = client.get_object_into(BUCKET, key, buf, offset=40000, length=100, range="500-599")
        assert r.bytes_placed == 100
        assert bytes(arr[40000:40100]) == data[500:600]
        assert not np.any(arr[:40000] != SENTINEL) and not np.any(arr[40100:] != SENTINEL)


def test_no_such_key_is_not_found(client, prefix):
    with client.alloc(4 * KIB) as buf:
        with pytest.raises(s3dma.NotFound) as ei:
            client.get_object_into(BUCKET, f"{prefix}missing", buf)
    e = ei.value
    assert e.code == "NoSuchKey"
    assert e.grpc_code == grpc.StatusCode.NOT_FOUND
    assert e.domain == "s3dma.agent"
    assert e.request_id and e.message
    with pytest.raises(s3dma.NotFound) as ei:
        client.head(BUCKET, f"{prefix}missing")
    with pytest.raises(s3dma.NotFound) as ei:
        client.list(f"no-such-bucket-{uuid.uuid4().hex[:8]}")
    assert ei.value.code == "NoSuchBucket"
    client.delete(BUCKET, f"{prefix}missing")  # deleting a missing key succeeds


def test_destination_too_small_is_a_clear_error(client, ten_k):
    key, _ = ten_k
    with client.alloc(16 * KIB) as buf:
        arr = buf.numpy()
        arr[:] = SENTINEL
        # A slice of 8 KiB in the middle of the buffer, for a 10000-byte object.
        with pytest.raises(s3dma.InvalidArgument) as ei:
            client.get_object_into(BUCKET, key, buf, offset=4 * KIB, length=8 * KIB)
        e = ei.value
        assert e.code in ("DestinationTooSmall", "OutOfBounds"), repr(e)
        assert "10000" in e.message and "8192" in e.message, e.message
        # The window covers the slice only: nothing outside it was written
        # (a failed GET may have placed a first chunk inside it).
        assert not np.any(arr[: 4 * KIB] != SENTINEL)
        assert not np.any(arr[12 * KIB :] != SENTINEL)
        # The whole buffer from an offset is too small too.
        with pytest.raises(s3dma.InvalidArgument) as ei:
            client.get_object_into(BUCKET, key, buf, offset=8 * KIB)
        assert ei.value.code in ("DestinationTooSmall", "OutOfBounds"), repr(ei.value)
        assert not np.any(arr[: 4 * KIB] != SENTINEL)
        # A slice outside the buffer is the shim's OutOfBounds, before any I/O.
        arr[:] = SENTINEL
        with pytest.raises(s3dma.OutOfBounds) as ei:
            client.get_object_into(BUCKET, key, buf, offset=16 * KIB + 1)
        assert ei.value.code == "OutOfBounds" and ei.value.domain == "s3dma.shim"
        with pytest.raises(s3dma.OutOfBounds) as ei:
            client.get_object_into(BUCKET, key, buf, offset=8 * KIB, length=8 * KIB + 1)
        assert ei.value.code == "OutOfBounds" and "16384" in ei.value.message, ei.value.message
        with pytest.raises(s3dma.OutOfBounds):
            client.put_object_from(BUCKET, key + "-x", buf, offset=12 * KIB, length=8 * KIB)
        assert not np.any(arr != SENTINEL), "a GET refused by the shim wrote into the buffer"


def test_unknown_buffer_id_is_not_found(client, ten_k):
    key, _ = ten_k
    bogus = (1 << 62) + 12345
    assert bogus not in {b.id for b in client.list_buffers()}
    with pytest.raises(s3dma.NotFound) as ei:
        client.get_object_into(BUCKET, key, bogus)
    assert ei.value.code == "NoSuchBuffer" and ei.value.domain == "s3dma.shim"
    with pytest.raises(s3dma.NotFound) as ei:
        client.put_object_from(BUCKET, key + "-x", bogus, length=1)
    assert ei.value.code == "NoSuchBuffer"
    with pytest.raises(s3dma.NotFound):
        client.release(bogus)


def _backing(arr):
    """The object at the end of an array's base chain (numpy 2 puts a
    memoryview of the exporter there; numpy 1 the exporter itself)."""
    b = arr
    while isinstance(b, np.ndarray) and b.base is not None:
        b = b.base
    return b.obj if isinstance(b, memoryview) else b


def _address(mm) -> int:
    import ctypes

    c = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(c)
    finally:
        del c


def test_zero_copy_views_share_the_mapping(client, prefix):
    key = f"{prefix}zc"
    with client.alloc(64 * KIB, label="zc") as buf:
        arr = buf.numpy()
        assert _backing(arr) is buf.mmap, "the numpy view is not backed by the buffer's mmap"
        assert arr.ctypes.data == _address(buf.mmap)
        assert buf.numpy(offset=100, count=8).ctypes.data == _address(buf.mmap) + 100
        assert not arr.flags.owndata and arr.flags.writeable
        assert np.shares_memory(arr, buf.numpy(np.uint32))
        words = buf.numpy(np.uint32)
        assert words.size == 16 * KIB
        mv = buf.memoryview()

        arr[:] = 0
        fill_random(arr[:4096], 3)
        client.put_object_from(BUCKET, key, buf, length=4096)
        want = bytes(arr[:4096])
        arr[:] = 0
        before = arr  # the same array object: nothing re-read below
        client.get_object_into(BUCKET, key, buf, offset=8)
        assert before is arr
        assert bytes(arr[8 : 8 + 4096]) == want  # the GET changed the array in place
        assert bytes(mv[8 : 8 + 4096]) == want  # and every other view
        assert words[2] == int.from_bytes(want[:4], "little")
        del mv
    client.delete(BUCKET, key)


def test_released_buffer_is_not_found(client, ten_k):
    key, _ = ten_k
    buf = client.alloc(16 * KIB, label="to-release")
    ids = {b.id: b for b in client.list_buffers()}
    assert buf.id in ids and ids[buf.id].size == 16 * KIB and ids[buf.id].label == "to-release"
    assert ids[buf.id].kind == "host"
    client.get_object_into(BUCKET, key, buf)
    buf.release()
    buf.release()  # idempotent
    assert buf.released
    assert buf.id not in {b.id for b in client.list_buffers()}
    with pytest.raises(s3dma.NotFound) as ei:
        client.get_object_into(BUCKET, key, buf)
    assert ei.value.code == "NoSuchBuffer"
    with pytest.raises(s3dma.NotFound):
        client.put_object_from(BUCKET, key, buf, length=10)


def test_release_with_live_views_keeps_them_readable(client, ten_k):
    key, data = ten_k
    buf = client.alloc(16 * KIB)
    client.get_object_into(BUCKET, key, buf)
    arr = buf.numpy()
    buf.release()  # the mmap has an exported view: it stays mapped
    assert bytes(arr[:10000]) == data


_CHILD = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {path!r})
    import s3dma
    c = s3dma.Client({sock!r})
    bufs = [c.alloc(64 * 1024, label="child-%d" % i) for i in range(3)]
    print(" ".join(str(b.id) for b in bufs), flush=True)
    sys.stdin.readline()          # the parent looks at the shim now
    if {kill}:
        os.kill(os.getpid(), 9)   # dies without closing anything
    os._exit(0)                   # exits without closing anything
    """
)


def _buffer_ids(client) -> set:
    return {b.id for b in client.list_buffers()}


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_shim_releases_buffers_when_the_client_process_goes(client, stack, how):
    # Another client in the same tenant (this one) holds a buffer throughout.
    with client.alloc(4 * KIB, label="parent") as mine:
        before = _buffer_ids(client)
        count_before = client.info().buffers
        assert mine.id in before
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CHILD.format(path=str(PY_CLIENT), sock=stack.socket, kill=how == "sigkill"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            line = child.stdout.readline()
            assert line, "the child printed no buffer ids"
            ids = {int(x) for x in line.split()}
            assert len(ids) == 3
            now = _buffer_ids(client)
            assert ids <= now, "the parent (same tenant) does not see the child's buffers"
            assert client.info().buffers == count_before + 3
            child.stdin.write("go\n")
            child.stdin.flush()
            rc = child.wait(timeout=30)
            assert rc == (-signal.SIGKILL if how == "sigkill" else 0)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if not (_buffer_ids(client) & ids) and client.info().buffers == count_before:
                break
            time.sleep(0.05)
        assert not (_buffer_ids(client) & ids), "the child's buffers outlived its lease"
        assert _buffer_ids(client) == before
        assert client.info().buffers == count_before
        assert mine.id in _buffer_ids(client)


def test_metadata_if_match_and_listing_pages(client, prefix):
    with client.alloc(4 * KIB) as buf:
        buf.numpy()[:] = 1
        keys = [f"{prefix}d/{i:02d}" for i in range(5)] + [f"{prefix}e/x", f"{prefix}top"]
        etags = {}
        for k in keys:
            etags[k] = client.put_object_from(
                BUCKET, k, buf, length=100, metadata={"color": "blue", "n": k[-2:]}
            ).etag
        h = client.head(BUCKET, keys[0])
        assert h.metadata.get("color") == "blue" and h.size == 100 and h.last_modified_ms > 0

        assert [o.key for o in client.list_all(BUCKET, prefix=prefix, page_size=2)] == sorted(keys)
        page = client.list(BUCKET, prefix=prefix, max_keys=2)
        assert page.is_truncated and page.next_continuation_token and len(page.objects) == 2
        page = client.list(BUCKET, prefix=prefix, delimiter="/")
        assert sorted(page.common_prefixes) == [f"{prefix}d/", f"{prefix}e/"]
        assert [o.key for o in page.objects] == [f"{prefix}top"]

        r = client.get_object_into(BUCKET, keys[0], buf, if_match=etags[keys[0]])
        assert r.bytes_placed == 100 and r.metadata.get("color") == "blue"
        with pytest.raises(s3dma.PreconditionFailed) as ei:
            client.get_object_into(BUCKET, keys[0], buf, if_match='"0123456789abcdef0123456789abcdef"')
        assert ei.value.code == "PreconditionFailed"
        for k in keys:
            client.delete(BUCKET, k)


def test_get_objects_batch(client, prefix):
    sizes = [10, 2000, 0, 70000]
    keys = [f"{prefix}b{i}" for i in range(len(sizes))]
    wants = []
    with client.alloc(128 * KIB) as buf:
        arr = buf.numpy()
        for i, (k, n) in enumerate(zip(keys, sizes)):
            fill_random(arr[:n], 100 + i)
            wants.append(sha(buf.memoryview()[:n]))
            client.put_object_from(BUCKET, k, buf, length=n)
        arr[:] = SENTINEL
        offsets = [0, 1000, 4000, 8000]
        items = [(BUCKET, k, buf, off) for k, off in zip(keys, offsets)]
        items.append(s3dma.GetItem(BUCKET, f"{prefix}missing", buf, offset=100000))
        res = client.get_objects(items, concurrency=2)
        assert len(res) == 5
        for r, n, want in zip(res, sizes, wants):
            assert isinstance(r, s3dma.GetResult), r
            assert r.bytes_placed == n and sha(r.memoryview()) == want
        assert isinstance(res[4], s3dma.NotFound) and res[4].code == "NoSuchKey"
        assert not np.any(arr[100000:] != SENTINEL)

        # Items pinned to a version: the right ETag reads; another ETag
        # fails that item alone, and its slice is left as it was.
        arr[:] = SENTINEL
        etag = res[3].etag
        pinned = client.get_objects(
            [
                s3dma.GetItem(BUCKET, keys[3], buf, offset=0, range=(0, 999), if_match=etag),
                (BUCKET, keys[3], buf, 2000, 1000, (0, 999), '"0123456789abcdef0123456789abcdef"'),
            ]
        )
        assert isinstance(pinned[0], s3dma.GetResult) and pinned[0].etag == etag, pinned[0]
        assert isinstance(pinned[1], s3dma.PreconditionFailed), pinned[1]
        assert not np.any(arr[2000:3000] != SENTINEL)
    for k in keys:
        client.delete(BUCKET, k)


def test_put_head_delete_objects_batches(client, prefix):
    sizes = [0, 10, 5000, 70000]
    offsets = [0, 100, 4096, 16384]
    keys = [f"{prefix}pb{i}" for i in range(len(sizes))]
    no_bucket = f"no-such-bucket-{uuid.uuid4().hex[:12]}"
    with client.alloc(128 * KIB) as buf:
        arr = buf.numpy()
        fill_random(arr, 400)
        wants = [sha(buf.memoryview()[o : o + n]) for o, n in zip(offsets, sizes)]
        items = [
            s3dma.PutItem(BUCKET, k, buf, offset=o, length=n, content_type="application/x-batch", metadata={"i": str(i)})
            for i, (k, o, n) in enumerate(zip(keys, offsets, sizes))
        ]
        put = client.put_objects(items, concurrency=2)
        assert len(put) == 4
        for r, n in zip(put, sizes):
            assert isinstance(r, s3dma.PutResult), r
            assert r.size == n and r.etag.startswith('"') and r.path in ("rdma", "fallback", "mixed")
        # Tuples and dicts; a Buffer's length defaults to its end.
        tail = client.put_objects(
            [(BUCKET, f"{prefix}tail", buf, 128 * KIB - 7), {"bucket": BUCKET, "key": f"{prefix}d", "buffer": buf.id, "length": 1}]
        )
        assert [r.size for r in tail] == [7, 1], tail

        # HEAD: one result per item in request order; a missing key is None,
        # a missing bucket that item's own error.
        heads = client.head_objects(
            [(BUCKET, k) for k in keys] + [(BUCKET, f"{prefix}missing"), (no_bucket, "k"), {"bucket": BUCKET, "key": keys[1]}],
            concurrency=3,
        )
        assert len(heads) == 7
        for i, (h, n, r) in enumerate(zip(heads, sizes, put)):
            assert isinstance(h, s3dma.ObjectInfo), h
            assert (h.size, h.etag, h.content_type, h.metadata) == (n, r.etag, "application/x-batch", {"i": str(i)})
            assert h.request_id
        assert heads[4] is None
        assert isinstance(heads[5], s3dma.NotFound) and heads[5].code == "NoSuchBucket", heads[5]
        assert isinstance(heads[6], s3dma.ObjectInfo) and heads[6].etag == put[1].etag

        # The bytes stored are the slices'.
        arr[:] = SENTINEL
        got = client.get_objects([(BUCKET, k, buf, o) for k, o in zip(keys, offsets)])
        for g, want in zip(got, wants):
            assert isinstance(g, s3dma.GetResult) and sha(g.memoryview()) == want

    # DELETE: a missing key succeeds (as in S3), a missing bucket fails alone.
    dels = client.delete_objects(
        [(BUCKET, k) for k in keys + [f"{prefix}tail", f"{prefix}d", f"{prefix}missing"]] + [(no_bucket, "k")]
    )
    assert dels[:7] == [None] * 7, dels
    assert isinstance(dels[7], s3dma.NotFound) and dels[7].code == "NoSuchBucket", dels[7]
    assert client.head_objects([(BUCKET, k) for k in keys]) == [None] * 4
    # No items: no call, no result.
    assert client.head_objects([]) == [] and client.put_objects([]) == [] and client.delete_objects([]) == []
    with pytest.raises(TypeError, match="item 0"):
        client.head_objects(["just-a-key"])
    with pytest.raises(ValueError, match="needs a length"):
        client.put_objects([(BUCKET, "k", 1)])


def test_put_objects_refuses_bad_slices_item_by_item(client, prefix):
    # A hostile tenant's batch: slices past the buffer's end, an offset
    # that overflows, buffers it does not have or released. Each bad item
    # is refused alone with its own error, the shim's reason and domain;
    # nothing of it is stored; the good items beside it are.
    keys = [f"{prefix}hb{i}" for i in range(8)]
    with client.alloc(64 * KIB) as buf, client.alloc(4 * KIB) as gone:
        fill_random(buf.numpy(), 500)
        want = sha(buf.memoryview()[1000:2000])
        gone_id = gone.id
        gone.release()
        res = client.put_objects(
            [
                (BUCKET, keys[0], buf, 1000, 1000),
                (BUCKET, keys[1], buf, 64 * KIB - 10, 11),  # one byte past the end
                (BUCKET, keys[2], buf, 64 * KIB + 1, 0),  # starts past the end
                (BUCKET, keys[3], buf.id, (1 << 64) - 1, 2),  # offset + length overflows
                (BUCKET, keys[4], 1 << 60, 0, 10),  # no such buffer
                (BUCKET, keys[5], gone_id, 0, 10),  # released
                (BUCKET, keys[6], buf, 1000, 1000),
                (f"no-such-bucket-{uuid.uuid4().hex[:12]}", keys[7], buf, 0, 10),
            ]
        )
    assert len(res) == 8
    for i in (0, 6):
        assert isinstance(res[i], s3dma.PutResult) and res[i].size == 1000, res[i]
    for i in (1, 2, 3):
        assert isinstance(res[i], s3dma.OutOfBounds) and res[i].code == "OutOfBounds", res[i]
        assert res[i].domain == errors.SHIM_DOMAIN and f"items[{i}]" in res[i].message, res[i]
    for i in (4, 5):
        assert isinstance(res[i], s3dma.NotFound) and res[i].code == "NoSuchBuffer", res[i]
        assert res[i].domain == errors.SHIM_DOMAIN, res[i]
    assert isinstance(res[7], s3dma.NotFound) and res[7].code == "NoSuchBucket", res[7]
    heads = client.head_objects([(BUCKET, k) for k in keys[:7]])
    assert heads[1:6] == [None] * 5, heads
    assert heads[0].size == heads[6].size == 1000
    with client.alloc(4 * KIB) as back:
        got = client.get_object_into(BUCKET, keys[6], back)
        assert sha(got.memoryview()) == want
    assert client.delete_objects([(BUCKET, k) for k in keys[:7]]) == [None] * 7

    # A batch over the tenant's max_batch_items (1024 by default) is refused
    # as a whole before anything runs.
    with pytest.raises(s3dma.InvalidArgument, match="max_batch_items"):
        client.head_objects([(BUCKET, f"{prefix}x{i}") for i in range(1025)])


def test_object_dataset_with_numpy(stack, client, prefix):
    sizes = [1, 100, 4096, 5000, 65536, 0, 777, 30000]
    keys = [f"{prefix}ds/{i}" for i in range(len(sizes))]
    wants = {}
    with client.alloc(64 * KIB) as buf:
        for i, (k, n) in enumerate(zip(keys, sizes)):
            fill_random(buf.numpy()[:n], 200 + i)
            wants[k] = bytes(buf.numpy()[:n])
            client.put_object_from(BUCKET, k, buf, length=n)

    factory = functools.partial(s3dma.Client, stack.socket)
    batch = 4
    ds = ObjectDataset(factory, BUCKET, keys, max_size=64 * KIB, slots=batch, label="ds-test")
    assert len(ds) == len(keys)
    try:
        seen = []
        for start in range(0, len(ds), batch):
            items = [ds[i] for i in range(start, min(start + batch, len(ds)))]
            # A batch's items are distinct, still-valid views (slots >= batch).
            for j, a in enumerate(items):
                k = keys[start + j]
                assert isinstance(a, np.ndarray) and a.dtype == np.uint8
                assert a.size == len(wants[k]) and sha(memoryview(a)) == sha(wants[k]), k
                assert not a.flags.owndata  # a view of a registered buffer: no copy
                assert any(_backing(a) is b.mmap for b in ds._buffers)
            seen.extend(items)
        # Views are reused after `slots` more items; copies are not.
        assert ds[-1].size == sizes[-1]
        ds2 = ObjectDataset(factory, BUCKET, keys, max_size=64 * KIB, copy=True)
        copies = [ds2[i] for i in range(len(ds2))]
        for k, a in zip(keys, copies):
            assert a.flags.owndata and a.tobytes() == wants[k]
        ds2.close()
        # uint32 views of 4-byte-multiple objects.
        ds3 = ObjectDataset(factory, BUCKET, [keys[2]], max_size=64 * KIB, dtype=np.uint32)
        w = ds3[0]
        assert w.dtype == np.uint32 and w.size == 1024 and w.tobytes() == wants[keys[2]]
        ds3.close()
        # The dataset pickles without its client (what a spawn worker gets).
        import pickle

        clone = pickle.loads(pickle.dumps(ds))
        assert clone._client is None and clone[1].tobytes() == wants[keys[1]]
        clone.close()
    finally:
        ds.close()
    for k in keys:
        client.delete(BUCKET, k)


def test_object_dataset_batches_small_samples(stack, client, prefix):
    sizes = [1, 100, 4096, 0, 777, 3000]
    keys = [f"{prefix}dsb/{i}" for i in range(len(sizes))]
    wants = []
    with client.alloc(4 * KIB) as buf:
        for i, (k, n) in enumerate(zip(keys, sizes)):
            fill_random(buf.numpy()[:n], 600 + i)
            wants.append(bytes(buf.numpy()[:n]))
            client.put_object_from(BUCKET, k, buf, length=n)
    factory = functools.partial(s3dma.Client, stack.socket)
    ds = ObjectDataset(factory, BUCKET, keys, max_size=4 * KIB, slots=4)
    try:
        c = ds._ensure()
        calls = {"get_objects": [], "get_object_into": []}
        for name in calls:
            real = getattr(c, name)
            setattr(c, name, lambda *a, _real=real, _name=name, **kw: calls[_name].append(a) or _real(*a, **kw))
        # A DataLoader's batch (__getitems__) of 4 small samples is one
        # GetObjects call; 6 are one call per `slots` (4, then 2).
        batch = ds.__getitems__([0, 1, 2, 3])
        assert [len(a[0]) for a in calls["get_objects"]] == [4] and not calls["get_object_into"]
        assert [a.tobytes() for a in batch] == wants[:4]
        assert len({id(_backing(a)) for a in batch[:3]}) == 3  # distinct views: one buffer each
        calls["get_objects"].clear()
        got = ds.get_batch(range(6))
        assert [len(a[0]) for a in calls["get_objects"]] == [4, 2]
        assert [a.tobytes() for a in got[4:]] == wants[4:]
        # Samples are what ds[i] gives, one call each.
        assert [ds[i].tobytes() for i in range(6)] == wants and len(calls["get_object_into"]) == 6
        # A missing object in a batch raises, naming it, as ds[i] does.
        bad = ObjectDataset(factory, BUCKET, [keys[0], f"{prefix}dsb/missing"], max_size=4 * KIB, slots=2)
        with pytest.raises(s3dma.NotFound, match=f"s3://{BUCKET}/{prefix}dsb/missing"):
            bad.get_batch([0, 1])
        bad.close()
    finally:
        ds.close()
    client.delete_objects([(BUCKET, k) for k in keys])


_FORK_WORKER = textwrap.dedent(
    """
    import hashlib, os, sys, functools
    sys.path.insert(0, {path!r})
    import s3dma
    from s3dma.dataset import ObjectDataset
    keys = {keys!r}
    ds = ObjectDataset(functools.partial(s3dma.Client, {sock!r}), "data", keys, max_size=65536, slots=2)
    parent = hashlib.sha256(ds[0]).hexdigest()     # the parent uses it first
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # a loader worker
        os.close(r)
        out = [hashlib.sha256(ds[i]).hexdigest() for i in range(len(keys))]
        os.write(w, (" ".join(out) + "\\n").encode())
        os._exit(0)
    os.close(w)
    child = os.read(r, 1 << 16).decode().split()
    _, status = os.waitpid(pid, 0)
    print(parent, " ".join(child), status)
    print("again", hashlib.sha256(ds[1]).hexdigest())  # the parent's client still works
    """
)


def test_object_dataset_after_fork(stack, client, prefix):
    keys = [f"{prefix}fk/{i}" for i in range(3)]
    wants = []
    with client.alloc(64 * KIB) as buf:
        for i, k in enumerate(keys):
            fill_random(buf.numpy()[: 1000 * (i + 1)], 300 + i)
            wants.append(sha(buf.memoryview()[: 1000 * (i + 1)]))
            client.put_object_from(BUCKET, k, buf, length=1000 * (i + 1))
    out = subprocess.run(
        [sys.executable, "-c", _FORK_WORKER.format(path=str(PY_CLIENT), sock=stack.socket, keys=keys)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()[:2]
    parts = first.split()
    assert parts[0] == wants[0]
    assert parts[1:4] == wants, "the forked worker read other bytes"
    assert parts[4] == "0", f"the forked worker failed (wait status {parts[4]}): {out.stderr}"
    assert second == f"again {wants[1]}"
    for k in keys:
        client.delete(BUCKET, k)


def test_a_client_refuses_use_after_fork(stack):
    c = s3dma.Client(stack.socket)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            c.info()
            msg = b"no error"
        except s3dma.S3dmaError as e:
            msg = e.code.encode()
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    got = os.read(r, 100)
    os.waitpid(pid, 0)
    os.close(r)
    assert got == b"ForkedClient"
    assert c.info().uid == os.getuid()
    c.close()
    with pytest.raises(s3dma.S3dmaError, match="closed"):
        c.info()


def test_torch_views_when_torch_is_installed(client, ten_k):
    torch = pytest.importorskip("torch", reason="torch is not installed (optional; CI has none)")
    key, data = ten_k
    with client.alloc(16 * KIB) as buf:
        t = buf.torch()
        assert t.dtype == torch.uint8 and t.numel() == 16 * KIB
        t.zero_()
        client.get_object_into(BUCKET, key, buf)
        assert bytes(t[:10000].numpy()) == data  # the GET changed the tensor in place
        f = buf.torch(torch.float32, count=4)
        assert f.data_ptr() == t.data_ptr()


def test_a_torch_view_keeps_the_mapping_after_release(client, ten_k):
    # torch.frombuffer alone keeps only a reference to the mmap object, and
    # release() would unmap the memory under the tensor (a segfault on the
    # next read); the tensor holds a buffer export instead.
    torch = pytest.importorskip("torch", reason="torch is not installed (optional; CI has none)")
    key, data = ten_k
    buf = client.alloc(16 * KIB)
    client.get_object_into(BUCKET, key, buf)
    t = buf.torch()
    h = buf.torch(torch.bfloat16, offset=64, count=8)
    buf.release()
    assert buf.released
    assert bytes(t[:10000].numpy()) == data
    assert bytes(h.view(torch.uint8).numpy()) == data[64:80]
    t[0] = 7  # still mapped and writable
    assert int(t[0]) == 7
