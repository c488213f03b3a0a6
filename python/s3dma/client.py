"""The tenant client: buffers (memfds shared with the shim) and S3 calls
that place object bytes straight into them.

    import s3dma
    with s3dma.Client() as c, c.alloc(64 << 20, label="batch") as buf:
        r = c.get_object_into("data", "shard-0001", buf)
        arr = buf.numpy()[: r.bytes_placed]      # no copy: a view of the memfd

One Client per process: gRPC channels do not survive ``fork``, and the lease
(the connection that keeps your buffers alive) is shared with children
until the last of them closes it. Worker processes (e.g. a torch
DataLoader's) must create their own Client; see :mod:`s3dma.dataset`.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap as _mmap
import os
import socket as _socket
import stat
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc

from . import errors
from ._pb import agent_pb2, tenant_pb2, tenant_pb2_grpc
from .errors import S3dmaError
from .lease import Lease, LeaseDropped, LeaseError
from .peer import SHIM_UID_ENV, ShimPolicy
from .ranges import RangeLike, parse_range

DEFAULT_SOCKET = "/run/s3dma/shim.sock"
SOCKET_ENV = "S3DMA_SOCKET"

_PATHS = {
    agent_pb2.TRANSFER_PATH_UNSPECIFIED: "",
    agent_pb2.TRANSFER_PATH_RDMA: "rdma",
    agent_pb2.TRANSFER_PATH_FALLBACK: "fallback",
    agent_pb2.TRANSFER_PATH_MIXED: "mixed",
}


def local_socket() -> str:
    """The socket ``s3dma local`` makes when given no ``--socket``:
    ``$XDG_RUNTIME_DIR/s3dma/shim.sock`` when ``$XDG_RUNTIME_DIR`` is an
    absolute path, else ``/tmp/s3dma-<uid>/shim.sock`` (the effective uid).
    Whether it exists is not checked."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "s3dma", "shim.sock")
    return f"/tmp/s3dma-{os.geteuid()}/shim.sock"


def _exists(path: str) -> bool:
    # lstat, as the CLI: a dangling symlink still counts (and fails later,
    # naming the path) rather than being passed over silently.
    try:
        os.lstat(path)
    except (OSError, ValueError):
        return False
    return True


#: ``Client(keep_bytes=...)`` from the environment.
KEEP_BYTES_ENV = "S3DMA_KEEP_BYTES"
#: Registered bytes a client keeps for its loaders' reuse by default.
DEFAULT_KEEP_BYTES = 4 << 30


def _release_quietly(buf: "Buffer") -> None:
    """Releases a buffer, ignoring a closed client or lease (the shim has
    released it then)."""
    try:
        c = buf._client
        if not buf.released and not c.closed and c._same_process():
            buf.release()
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass


def default_socket() -> str:
    """The socket a client connects to when given none, chosen as the
    ``s3dma`` CLI chooses it: ``$S3DMA_SOCKET`` when set and not empty;
    else ``/run/s3dma/shim.sock`` (an installed shim) when it exists; else
    local mode's socket (:func:`local_socket`) when that exists; else
    ``/run/s3dma/shim.sock``, so that the error names it. Read at each
    call: a second shell finds ``s3dma local``'s socket with no setting."""
    env = os.environ.get(SOCKET_ENV)
    if env:
        return env
    local = local_socket()
    if not _exists(DEFAULT_SOCKET) and _exists(local):
        return local
    return DEFAULT_SOCKET


# -- results ----------------------------------------------------------------


@dataclass
class GetResult:
    """What a GET placed, and where."""

    size: int  # the object's size
    etag: str
    bytes_placed: int  # placed at the destination's start
    range_start: int  # offset in the object of the first placed byte
    path: str  # "rdma", "fallback" or "mixed"
    request_id: str
    content_type: str = ""
    metadata: Dict[str, str] = field(default_factory=dict)
    last_modified_ms: int = 0
    buffer: Optional["Buffer"] = field(default=None, repr=False)
    offset: int = 0  # where in the buffer the bytes start

    def memoryview(self) -> memoryview:
        """The placed bytes (a view of the buffer, no copy)."""
        if self.buffer is None:
            raise ValueError("this result has no Buffer (the GET named a buffer id)")
        return self.buffer.memoryview()[self.offset : self.offset + self.bytes_placed]

    def numpy(self, dtype: Any = None):
        """The placed bytes as a numpy array (a view, no copy)."""
        if self.buffer is None:
            raise ValueError("this result has no Buffer (the GET named a buffer id)")
        import numpy as np

        dt = np.dtype(dtype if dtype is not None else np.uint8)
        return self.buffer.numpy(dt, offset=self.offset, count=self.bytes_placed // dt.itemsize)


@dataclass
class PutResult:
    etag: str
    size: int
    path: str
    parts: int  # 0 = a single PUT
    request_id: str


@dataclass
class ObjectInfo:
    size: int
    etag: str
    content_type: str
    metadata: Dict[str, str]
    last_modified_ms: int
    request_id: str = ""


@dataclass
class ListedObject:
    key: str
    size: int
    etag: str
    last_modified_ms: int


@dataclass
class ListPage:
    objects: List[ListedObject]
    common_prefixes: List[str]
    next_continuation_token: str
    is_truncated: bool
    request_id: str


@dataclass
class Info:
    tenant: str
    uid: int
    gid: int
    max_buffers: int
    max_buffer_bytes: int
    buffers: int
    buffer_bytes: int
    agent_connected: bool
    version: str


@dataclass
class BufferInfo:
    id: int
    size: int
    label: str
    kind: str  # "host" or "cuda"
    in_use: int


@dataclass
class GetItem:
    """One item of :meth:`Client.get_objects`."""

    bucket: str
    key: str
    buffer: Union["Buffer", int]
    offset: int = 0
    length: Optional[int] = None
    range: RangeLike = None
    # Fail this item with PreconditionFailed unless the object's ETag is
    # this one ("" = any version).
    if_match: str = ""


@dataclass
class PutItem:
    """One item of :meth:`Client.put_objects`: ``length`` bytes of
    ``buffer`` from ``offset`` become the object (``length`` defaults to
    the end of a :class:`Buffer`; it is required with a buffer id)."""

    bucket: str
    key: str
    buffer: Union["Buffer", "CudaBuffer", int]
    offset: int = 0
    length: Optional[int] = None
    content_type: str = ""
    metadata: Optional[Dict[str, str]] = None


#: The shim's reasons (ErrorInfo domain ``s3dma.shim``) a batch item may
#: carry; any other item error is the agent's.
_SHIM_ITEM_REASONS = frozenset(
    {"UnknownTenant", "NoSuchBuffer", "NoSuchLease", "BufferLimit", "BadBuffer", "OutOfBounds", "AgentUnavailable"}
)


def _item_error(e) -> S3dmaError:
    """The :class:`S3dmaError` of one failed batch item (an ``ItemError``)."""
    return errors.make_error(
        e.message,
        code=e.s3_code,
        grpc_code=errors.grpc_code_from_number(e.grpc_code),
        request_id=e.request_id,
        domain=errors.SHIM_DOMAIN if e.s3_code in _SHIM_ITEM_REASONS else errors.AGENT_DOMAIN,
    )


def _object_info(o, request_id: str) -> "ObjectInfo":
    return ObjectInfo(
        size=o.size,
        etag=o.etag,
        content_type=o.content_type,
        metadata=dict(o.metadata),
        last_modified_ms=o.last_modified_unix_ms,
        request_id=request_id,
    )


def _put_result(r) -> "PutResult":
    return PutResult(
        etag=r.etag, size=r.size, path=_PATHS.get(r.path, str(r.path)), parts=r.parts, request_id=r.request_id
    )


def _object_keys(items: Iterable[Any], what: str) -> List[Tuple[str, str]]:
    """``(bucket, key)`` pairs from pairs or dicts with ``bucket`` and ``key``."""
    out: List[Tuple[str, str]] = []
    for i, it in enumerate(items):
        if isinstance(it, dict):
            pair = (it.get("bucket"), it.get("key"))
        elif isinstance(it, (tuple, list)) and len(it) == 2:
            pair = (it[0], it[1])
        else:
            raise TypeError(f"{what}: item {i} must be a (bucket, key) pair or a dict of them, not {it!r}")
        if not isinstance(pair[0], str) or not isinstance(pair[1], str):
            raise TypeError(f"{what}: item {i} needs a str bucket and key, not {pair!r}")
        out.append(pair)  # type: ignore[arg-type]
    return out


# -- buffers ----------------------------------------------------------------


class _Releasing:
    """What :class:`Buffer` and :class:`CudaBuffer` share as context
    managers: leaving the ``with`` block releases the buffer (unless it is
    already released, the client closed, or this is a forked child)."""

    released: bool
    _client: "Client"

    def _registered(self, client: "Client", buffer_id: int, size: int, label: str) -> None:
        """Sets what every registered buffer has: its client, id, size and label."""
        self._client = client
        self.id = buffer_id
        self.size = size
        self.label = label
        self.released = False

    def __len__(self) -> int:
        return self.size

    def _release_registration(self) -> bool:
        """Releases the registration in the shim (once); False when it
        already was."""
        if self.released:
            return False
        self._client._release(self.id)
        self.released = True
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if not self.released and not self._client.closed and self._client._same_process():
            self.release()


class Buffer(_Releasing):
    """Host memory registered with the shim: a sealed memfd mapped here and
    in the shim. Object bytes land in :attr:`mmap` with no copy.

    Views (:meth:`memoryview`, :meth:`numpy`, :meth:`torch`) share the
    memory: a later GET into the buffer changes them."""

    def __init__(self, client: "Client", buffer_id: int, size: int, label: str, mm: _mmap.mmap):
        self._registered(client, buffer_id, size, label)
        self.mmap = mm
        # The mapping's address, for finding the buffer behind a tensor's
        # storage (Client.find_buffer). The ctypes view is dropped at once:
        # a live export would keep release() from unmapping.
        view = ctypes.c_char.from_buffer(mm)
        self.address = ctypes.addressof(view)
        del view

    def __repr__(self) -> str:
        state = " released" if self.released else ""
        return f"<s3dma.Buffer id={self.id} size={self.size} label={self.label!r}{state}>"

    def memoryview(self) -> memoryview:
        """The whole buffer as a writable memoryview (no copy)."""
        return memoryview(self.mmap)

    def numpy(self, dtype: Any = None, *, offset: int = 0, count: Optional[int] = None):
        """``np.frombuffer`` over the mapping: a writable view, no copy.

        ``count`` items of ``dtype`` from byte ``offset`` (default: as many
        whole items as fit)."""
        import numpy as np

        dt = np.dtype(dtype if dtype is not None else np.uint8)
        if count is None:
            count = (self.size - offset) // dt.itemsize
        return np.frombuffer(self.mmap, dtype=dt, count=count, offset=offset)

    def torch(self, dtype: Any = None, *, offset: int = 0, count: Optional[int] = None):
        """A CPU tensor over ``count`` items of ``dtype`` from byte ``offset``
        of the mapping (shared memory, no copy). torch is imported only here.

        The tensor is made over a memoryview of the mapping, which holds a
        buffer export, so :meth:`release` leaves the memory mapped until the
        last such tensor is gone (``torch.frombuffer`` over the mmap object
        itself keeps no export, and ``close()`` would unmap the memory under
        the tensor)."""
        import torch  # optional dependency

        dtype = dtype if dtype is not None else torch.uint8
        itemsize = torch.empty((), dtype=dtype).element_size()
        if count is None:
            count = (self.size - offset) // itemsize
        if count == 0:
            return torch.empty(0, dtype=dtype)
        return torch.frombuffer(memoryview(self.mmap), dtype=dtype, count=count, offset=offset)

    def release(self) -> None:
        """Releases the buffer in the shim (requests using it finish first)
        and unmaps it here once no view of it is left. Idempotent."""
        if not self._release_registration():
            return
        try:
            self.mmap.close()
        except BufferError:
            pass  # numpy/torch/memoryview views still use it; unmapped when they go



class CudaBuffer(_Releasing):
    """CUDA device memory registered with the shim (:meth:`Client.alloc_cuda`,
    :meth:`Client.register_cuda_fd`, or the legacy :meth:`Client.register_cuda`).
    Use it (or its id) as the buffer of GETs and PUTs; there is no host
    view of it here. One from :meth:`Client.alloc_cuda` owns its allocation:
    :attr:`ptr` is its device pointer in this process, and it has
    ``__cuda_array_interface__`` (``torch.as_tensor(buf, device="cuda")``
    views the same memory, and keeps this object, so the memory, alive).
    The allocation is freed when this object is garbage collected, or by
    :meth:`free`; :meth:`release` ends only the registration."""

    def __init__(self, client: "Client", buffer_id: int, size: int, label: str, device: int, allocation=None):
        self._registered(client, buffer_id, size, label)
        self.device = device
        self._allocation = allocation

    @property
    def ptr(self) -> int:
        """The device pointer of an allocation this buffer owns (0 otherwise)."""
        return self._allocation.ptr if self._allocation is not None else 0

    @property
    def __cuda_array_interface__(self):
        if self._allocation is None or not self._allocation.ptr:
            raise AttributeError("__cuda_array_interface__: this CudaBuffer owns no allocation here")
        return {"shape": (self.size,), "typestr": "|u1", "data": (self._allocation.ptr, False), "version": 3}

    def __repr__(self) -> str:
        state = " released" if self.released else ""
        return f"<s3dma.CudaBuffer id={self.id} size={self.size} device={self.device} label={self.label!r}{state}>"

    def release(self) -> None:
        """Releases the registration (the shim unmaps the memory; the
        allocation stays, yours or this object's). Idempotent."""
        self._release_registration()

    def free(self) -> None:
        """Releases the registration and frees an allocation this buffer
        owns (:meth:`Client.alloc_cuda`) now, rather than when the object is
        collected: no view of it (torch, cupy) may be used afterwards."""
        try:
            if not self._client.closed:
                self.release()
        finally:
            if self._allocation is not None:
                self._allocation.free()



def _items(cls: type, items: Iterable[Any]) -> List[Any]:
    """A batch's items as ``cls`` (:class:`GetItem` or :class:`PutItem`):
    each one is already one, a dict of its fields, or a tuple of them."""
    out = []
    for it in items:
        if isinstance(it, cls):
            out.append(it)
        elif isinstance(it, dict):
            out.append(cls(**it))
        else:
            out.append(cls(*it))
    return out


# -- the client -------------------------------------------------------------


class Client:
    """A connection to the host-shim: a lease (for passing memory) and a gRPC
    channel over the same Unix socket.

    ``socket``: the shim's socket path (default :func:`default_socket`:
    ``$S3DMA_SOCKET``, else ``/run/s3dma/shim.sock`` if it exists, else
    ``s3dma local``'s default socket if that exists). ``timeout``: seconds per call (None = no
    deadline; large GETs take a while).

    ``shim_uid``: the uid (or user name) the shim runs as when it is
    neither root nor you (default ``$S3DMA_SHIM_UID``). The lease
    connection is checked with ``SO_PEERCRED`` before a byte is sent, and
    right before the gRPC channel is created: a socket served by any other
    uid raises :class:`s3dma.UntrustedShim` naming both uids. grpcio opens
    the channel's connections itself, so those are not checked one by one
    (see the README).

    ``keep_bytes``: registered bytes the client keeps for its loaders to
    reuse (:meth:`take_buffer`, :meth:`give_back`; default
    ``$S3DMA_KEEP_BYTES``, else 4 GiB; 0 keeps none). They count against the
    tenant's buffer limits; a new buffer the shim refuses for those limits
    releases them first."""

    def __init__(
        self,
        socket: Optional[str] = None,
        *,
        timeout: Optional[float] = None,
        connect_timeout: float = 30.0,
        shim_uid: Optional[Union[int, str]] = None,
        keep_bytes: Optional[int] = None,
    ):
        defaulted = not socket and not os.environ.get(SOCKET_ENV)
        path = os.path.abspath(socket or default_socket())
        self.socket = path
        self.timeout = timeout
        self._pid = os.getpid()
        self._closed = False
        # Buffers given back by the loaders, by size, oldest first.
        self._kept: Dict[int, List[Buffer]] = {}
        self._kept_order: List[Buffer] = []
        self._kept_bytes = 0
        # Re-entrant: give_back runs from weakref finalizers, which the
        # garbage collector may start inside a critical section below.
        self._kept_lock = threading.RLock()
        if keep_bytes is None:
            env = os.environ.get(KEEP_BYTES_ENV, "")
            keep_bytes = int(env) if env.strip() else DEFAULT_KEEP_BYTES
        if keep_bytes < 0:
            raise ValueError(f"keep_bytes must be >= 0, not {keep_bytes}")
        self.keep_bytes = keep_bytes
        try:
            st = os.stat(path)
        except FileNotFoundError:
            tried = f", nor at {local_socket()} (s3dma local's)" if defaulted else ""
            raise errors.client_error(
                errors.ShimUnavailable,
                f"no host-shim socket at {path}{tried} (is host-shim or `s3dma local` running? "
                f"${SOCKET_ENV} names another socket)",
            ) from None
        except PermissionError as e:
            raise errors.client_error(
                errors.ShimUnavailable,
                f"cannot reach the host-shim socket {path}: {e.strerror}",
            ) from None
        if not stat.S_ISSOCK(st.st_mode):
            raise errors.client_error(
                errors.ShimUnavailable,
                f"{path} is not a socket (expected the host-shim's Unix socket)",
            )
        try:
            policy = ShimPolicy.resolve(shim_uid)
        except ValueError as e:
            raise errors.InvalidArgument(
                f"shim_uid: {e}", code="InvalidArgument", domain=errors.CLIENT_DOMAIN
            ) from None
        # The lease first: its connection checks who serves the socket, and
        # nothing (not even the gRPC channel) is opened before that passed.
        lease_error: Optional[LeaseError] = None
        try:
            self._lease = Lease(path, timeout=connect_timeout, policy=policy)
        except (ConnectionRefusedError, FileNotFoundError) as e:
            raise errors.client_error(
                errors.ShimUnavailable,
                f"the host-shim socket {path} refuses connections ({e.strerror}); is host-shim running?",
            ) from None
        except LeaseDropped as e:
            raise errors.AccessDenied(str(e), code="ConnectionDropped", domain=errors.CLIENT_DOMAIN) from None
        except LeaseError as e:
            lease_error = e
        except OSError as e:
            raise errors.client_error(
                errors.ShimUnavailable,
                f"cannot open a lease on the host-shim socket {path}: {e}",
            ) from None
        # A private subchannel pool: a Client created after fork must not
        # pick up the parent's inherited connection (gRPC shares subchannels
        # between channels to the same target by default; used from a forked
        # child, they fail with "Wrong file descriptor generation").
        # gRPC's default :authority for a unix target is the percent-encoded
        # path ("tmp%2Fs3l%2Fshim.sock"), which the shim's HTTP/2 stack
        # (hyper) refuses with RST_STREAM(PROTOCOL_ERROR): name localhost.
        self._channel = grpc.insecure_channel(
            "unix:" + path,
            options=[("grpc.use_local_subchannel_pool", 1), ("grpc.default_authority", "localhost")],
        )
        self._stub = tenant_pb2_grpc.TenantStub(self._channel)
        if lease_error is not None:
            # The shim said no (e.g. an unknown uid): Info gives the
            # structured reason (UnknownTenant) when the shim has one.
            try:
                self._stub.Info(tenant_pb2.InfoRequest(), timeout=connect_timeout)
            except grpc.RpcError as rpc:
                self._channel.close()
                raise errors.from_rpc_error(rpc, f"host-shim at {path}") from None
            self._channel.close()
            raise errors.LeaseRefused(
                str(lease_error), code="LeaseRefused", domain=errors.CLIENT_DOMAIN
            ) from None
        self._lock = threading.Lock()
        self._buffers: "weakref.WeakValueDictionary[int, Buffer]" = weakref.WeakValueDictionary()

    # -- plumbing -----------------------------------------------------------

    def _same_process(self) -> bool:
        return os.getpid() == self._pid

    def _check(self) -> None:
        if self._closed:
            raise S3dmaError(
                f"this s3dma Client ({self.socket}) is closed", code="ClientClosed", domain=errors.CLIENT_DOMAIN
            )
        if not self._same_process():
            raise S3dmaError(
                f"this s3dma Client was created in process {self._pid}, not in this one ({os.getpid()}): "
                "create a Client in each process (gRPC channels do not survive fork)",
                code="ForkedClient",
                domain=errors.CLIENT_DOMAIN,
            )

    def _call(self, method: str, request, timeout: Optional[float] = None):
        self._check()
        try:
            return getattr(self._stub, method)(request, timeout=timeout if timeout is not None else self.timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, f"{method} on host-shim {self.socket}") from None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def lease_id(self) -> bytes:
        return self._lease.id

    def close(self) -> None:
        """Closes the channel and the lease (the shim releases every buffer
        of this client). Buffers' mappings stay readable here."""
        if self._closed:
            return
        self._closed = True
        if self._same_process():
            self._channel.close()
        with self._kept_lock:
            # The lease's end releases them in the shim.
            self._kept.clear()
            self._kept_order.clear()
            self._kept_bytes = 0
        self._lease.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- tenant and buffers -------------------------------------------------

    def info(self) -> Info:
        r = self._call("Info", tenant_pb2.InfoRequest())
        return Info(
            tenant=r.tenant,
            uid=r.uid,
            gid=r.gid,
            max_buffers=r.max_buffers,
            max_buffer_bytes=r.max_buffer_bytes,
            buffers=r.buffers,
            buffer_bytes=r.buffer_bytes,
            agent_connected=r.agent_connected,
            version=r.version,
        )

    # -- buffers kept for reuse ----------------------------------------------

    def take_buffer(self, size: int, label: str = "") -> Buffer:
        """A registered buffer of exactly ``size`` bytes for a loader: one
        given back earlier with :meth:`give_back` when one of that size is
        kept (its pages are already in memory here and in the shim, so bytes
        land without page faults; it still holds the previous bytes), else a
        new one (:meth:`alloc`). When the shim refuses a new buffer for the
        tenant's buffer limit, the kept ones are released and it is asked
        once more."""
        if self._same_process():
            with self._kept_lock:
                same = self._kept.get(size)
                if same:
                    buf = same.pop()
                    self._kept_order.remove(buf)
                    self._kept_bytes -= buf.size
                    return buf
        try:
            return self.alloc(size, label)
        except errors.SlowDown as e:
            if e.code != "BufferLimit" or not self.release_kept():
                raise
        return self.alloc(size, label)

    def give_back(self, buf: Buffer) -> None:
        """Keeps ``buf`` (whose views are all gone) for a later
        :meth:`take_buffer` of its size, releasing the oldest kept buffers
        beyond ``keep_bytes`` in all; releases it when it alone is larger,
        or after a fork."""
        if buf.released:
            return
        if self._closed or not self._same_process() or buf.size > self.keep_bytes:
            _release_quietly(buf)
            return
        evicted: List[Buffer] = []
        with self._kept_lock:
            self._kept.setdefault(buf.size, []).append(buf)
            self._kept_order.append(buf)
            self._kept_bytes += buf.size
            while self._kept_bytes > self.keep_bytes and self._kept_order:
                old = self._kept_order.pop(0)
                self._kept[old.size].remove(old)
                self._kept_bytes -= old.size
                evicted.append(old)
        for old in evicted:
            _release_quietly(old)

    def release_kept(self) -> int:
        """Releases every kept buffer; returns how many bytes that freed."""
        with self._kept_lock:
            kept = self._kept_order
            freed = self._kept_bytes
            self._kept = {}
            self._kept_order = []
            self._kept_bytes = 0
        for b in kept:
            _release_quietly(b)
        return freed

    @property
    def kept_bytes(self) -> int:
        """Bytes of buffers kept for reuse (registered with the shim)."""
        return self._kept_bytes

    def alloc(self, size: int, label: str = "") -> Buffer:
        """Creates ``size`` bytes of shared memory (a memfd sealed against
        shrinking), maps it, passes it to the shim and registers it."""
        self._check()
        if not isinstance(size, int) or size <= 0:
            raise ValueError(f"buffer size must be a positive integer, not {size!r}")
        fd = os.memfd_create("s3dma", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        mm = None
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
            mm = _mmap.mmap(fd, size)  # MAP_SHARED, read-write
            try:
                handle = self._lease.pass_fd(fd)
            except LeaseError as e:
                raise errors.LeaseRefused(
                    str(e), code="LeaseRefused", domain=errors.CLIENT_DOMAIN
                ) from None
            except OSError as e:
                raise errors.client_error(
                    errors.ShimUnavailable,
                    f"passing a buffer to the host-shim {self.socket} failed: {e}",
                ) from None
        except BaseException:
            if mm is not None:
                mm.close()
            raise
        finally:
            os.close(fd)  # the mapping and the shim keep the memory
        try:
            r = self._call(
                "RegisterBuffer",
                tenant_pb2.RegisterBufferRequest(
                    lease=self._lease.id,
                    host=tenant_pb2.HostMemory(fd_handle=handle, size=size),
                    label=label,
                ),
            )
        except BaseException:
            mm.close()
            raise
        buf = Buffer(self, r.buffer_id, r.size or size, label, mm)
        self._buffers[buf.id] = buf
        return buf

    def alloc_cuda(self, size: int, device: int = 0, label: str = "") -> "CudaBuffer":
        """Allocates ``size`` bytes of device memory on GPU ``device`` that the
        shim can map (``cuMemCreate`` with a POSIX fd shareable handle,
        see :mod:`s3dma.cuda`), registers it with :meth:`register_cuda_fd`
        and returns the buffer, which owns the allocation (:attr:`CudaBuffer.ptr`,
        ``__cuda_array_interface__``). Needs a CUDA driver in this process."""
        from . import cuda

        self._check()
        try:
            alloc = cuda.ShareableAllocation(size, device)
        except cuda.CudaError as e:
            raise errors.Unsupported(str(e), code="CudaUnavailable", domain=errors.CLIENT_DOMAIN) from None
        try:
            fd = alloc.export_fd()
            try:
                buf = self.register_cuda_fd(fd, size, device, label)
            finally:
                cuda.close_fd(fd)  # the shim holds its own reference
        except BaseException:
            alloc.free()
            raise
        buf._allocation = alloc
        return buf

    def register_cuda_fd(self, fd: int, size: int, device: int = 0, label: str = "") -> "CudaBuffer":
        """Registers CUDA device memory by its POSIX file descriptor: ``fd``
        is what ``cuMemExportToShareableHandle`` (handle type
        ``CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR``) returned for an
        allocation of at least ``size`` bytes on ``device`` (made with
        ``cuMemCreate`` requesting that handle type). The fd goes over this
        client's lease and stays yours (close it when you like); the shim
        maps the allocation until :meth:`CudaBuffer.release` or the end of
        the lease, and keeps it alive meanwhile. GETs into the buffer land
        in device memory; PUTs read from it."""
        self._check()
        if not isinstance(fd, int) or fd < 0:
            raise ValueError(f"fd must be an open file descriptor, not {fd!r}")
        if not isinstance(size, int) or size <= 0:
            raise ValueError(f"size must be a positive integer, not {size!r}")
        try:
            handle = self._lease.pass_fd(fd, cuda=True)
        except LeaseError as e:
            msg = e.shim_message or str(e)
            if "cannot use CUDA" in msg or "without the `cuda` feature" in msg:
                raise errors.client_error(errors.Unsupported, str(e)) from None
            raise errors.client_error(errors.LeaseRefused, str(e)) from None
        except OSError as e:
            raise errors.client_error(
                errors.ShimUnavailable,
                f"passing a CUDA fd to the host-shim {self.socket} failed: {e}",
            ) from None
        r = self._call(
            "RegisterBuffer",
            tenant_pb2.RegisterBufferRequest(
                lease=self._lease.id,
                cuda=tenant_pb2.CudaMemory(fd_handle=handle, device=device, size=size),
                label=label,
            ),
        )
        return CudaBuffer(self, r.buffer_id, r.size or size, label, device)

    def register_cuda(self, ipc_handle: bytes, size: int, device: int = 0, label: str = "") -> "CudaBuffer":
        """Registers CUDA device memory by a legacy 64-byte
        ``CUipcMemHandle`` (``cuIpcGetMemHandle`` of an allocation of at
        least ``size`` bytes on ``device``). Such a handle opens the memory
        for whoever presents it, so shims refuse it (:class:`s3dma.Unsupported`)
        unless their ``cuda.allow_legacy_ipc_handles`` is set; use
        :meth:`alloc_cuda` or :meth:`register_cuda_fd`. Where it is taken,
        the shim opens the handle itself, so the allocation must stay alive
        until :meth:`CudaBuffer.release` (or the end of the lease)."""
        self._check()
        if not isinstance(ipc_handle, (bytes, bytearray)) or len(ipc_handle) != 64:
            raise ValueError("ipc_handle must be the 64 bytes of a CUipcMemHandle")
        if not isinstance(size, int) or size <= 0:
            raise ValueError(f"size must be a positive integer, not {size!r}")
        r = self._call(
            "RegisterBuffer",
            tenant_pb2.RegisterBufferRequest(
                lease=self._lease.id,
                cuda=tenant_pb2.CudaMemory(ipc_handle=bytes(ipc_handle), device=device, size=size),
                label=label,
            ),
        )
        return CudaBuffer(self, r.buffer_id, r.size or size, label, device)

    def register_cuda_tensor(self, tensor, label: str = "") -> Tuple["CudaBuffer", int]:
        """Registers the CUDA allocation behind a torch tensor's storage by
        its legacy IPC handle (torch's caching allocator memory has no fd to
        share). Returns the buffer and the byte offset of the tensor's first
        element in it (torch's caching allocator hands out pieces of larger
        blocks, and IPC handles name whole blocks). Shims refuse legacy
        handles by default (:class:`s3dma.Unsupported`, on which s3dma's
        torch helpers stage through host memory); for device memory any
        shim takes, use :meth:`alloc_cuda` and view it with
        ``torch.as_tensor(buf, device="cuda")``."""
        if not getattr(tensor, "is_cuda", False):
            raise ValueError("register_cuda_tensor needs a CUDA tensor (tensor.is_cuda)")
        storage = tensor.untyped_storage()
        # (device, handle, block size, offset of this storage in the block, ...)
        shared = storage._share_cuda_()
        device, handle, block_size, storage_offset = shared[0], shared[1], shared[2], shared[3]
        buf = self.register_cuda(bytes(handle), int(block_size) + int(storage_offset), int(device), label)
        return buf, int(storage_offset) + tensor.storage_offset() * tensor.element_size()

    def find_buffer(self, address: int, nbytes: int) -> Optional[Tuple[Buffer, int]]:
        """The live buffer of this client that holds ``[address, address +
        nbytes)`` and the offset of ``address`` in it, or None. Lets
        integrations place bytes straight into a tensor whose storage is a
        view of a registered buffer (``buf.torch()``, ``buf.numpy()``)."""
        if nbytes < 0:
            return None
        for buf in list(self._buffers.values()):
            if buf.released:
                continue
            off = address - buf.address
            if 0 <= off and off + nbytes <= buf.size:
                return buf, off
        return None

    def _release(self, buffer_id: int) -> None:
        self._call("ReleaseBuffer", tenant_pb2.ReleaseBufferRequest(buffer_id=buffer_id))

    def release(self, buffer: Union[Buffer, "CudaBuffer", int]) -> None:
        """Releases a buffer (a :class:`Buffer`, a :class:`CudaBuffer` or a buffer id)."""
        if isinstance(buffer, (Buffer, CudaBuffer)):
            buffer.release()
        else:
            self._release(int(buffer))

    def list_buffers(self) -> List[BufferInfo]:
        r = self._call("ListBuffers", tenant_pb2.ListBuffersRequest())
        return [BufferInfo(b.buffer_id, b.size, b.label, b.kind, b.in_use) for b in r.buffers]

    # -- objects ------------------------------------------------------------

    @staticmethod
    def _slice(buffer: Union[Buffer, "CudaBuffer", int], offset: int, length: Optional[int]):
        if isinstance(buffer, (Buffer, CudaBuffer)):
            bid = buffer.id
        elif isinstance(buffer, int) and not isinstance(buffer, bool):
            bid = buffer
        else:
            raise TypeError(f"expected an s3dma.Buffer or a buffer id, not {type(buffer).__name__}")
        if offset < 0 or (length is not None and length < 0):
            raise ValueError(f"offset ({offset}) and length ({length}) must not be negative")
        s = tenant_pb2.BufferSlice(buffer_id=bid, offset=offset)
        if length is not None:
            s.length = length
        return s

    @staticmethod
    def _get_result(r, buffer, offset) -> GetResult:
        o = r.object
        return GetResult(
            size=o.size,
            etag=o.etag,
            bytes_placed=r.bytes_placed,
            range_start=r.range_start,
            path=_PATHS.get(r.path, str(r.path)),
            request_id=r.request_id,
            content_type=o.content_type,
            metadata=dict(o.metadata),
            last_modified_ms=o.last_modified_unix_ms,
            buffer=buffer if isinstance(buffer, Buffer) else None,
            offset=offset,
        )

    def get_object_into(
        self,
        bucket: str,
        key: str,
        buffer: Union[Buffer, "CudaBuffer", int],
        offset: int = 0,
        length: Optional[int] = None,
        range: RangeLike = None,
        if_match: str = "",
        timeout: Optional[float] = None,
    ) -> GetResult:
        """Reads the object (or ``range``: ``"a-b"``, ``"a-"``, ``"-n"`` or a
        ``(first, last)`` tuple, inclusive) into ``buffer`` at ``offset``.
        ``length`` bounds the destination (default: to the buffer's end);
        the bytes must fit or nothing is read. Bytes of the buffer outside
        ``[offset, offset + bytes_placed)`` are not touched."""
        req = tenant_pb2.GetObjectRequest(
            bucket=bucket, key=key, destination=self._slice(buffer, offset, length), if_match=if_match
        )
        br = parse_range(range)
        if br is not None:
            req.range.CopyFrom(br.to_proto())
        return self._get_result(self._call("GetObject", req, timeout), buffer, offset)

    def get_objects(
        self, items: Iterable[Union[GetItem, Sequence, Dict[str, Any]]], concurrency: int = 0, timeout: Optional[float] = None
    ) -> List[Union[GetResult, S3dmaError]]:
        """Many GETs in one call. Returns, in the order of ``items``, a
        :class:`GetResult` or the :class:`S3dmaError` of each item. Items are
        :class:`GetItem`, dicts of its fields, or tuples
        ``(bucket, key, buffer[, offset[, length[, range[, if_match]]]])``."""
        norm: List[GetItem] = _items(GetItem, items)
        req = tenant_pb2.GetObjectsRequest(concurrency=concurrency)
        for it in norm:
            pi = req.items.add(bucket=it.bucket, key=it.key, if_match=it.if_match or "")
            pi.destination.CopyFrom(self._slice(it.buffer, it.offset, it.length))
            br = parse_range(it.range)
            if br is not None:
                pi.range.CopyFrom(br.to_proto())
        self._check()
        out: List[Union[GetResult, S3dmaError, None]] = [None] * len(norm)
        try:
            for rep in self._stub.GetObjects(req, timeout=timeout if timeout is not None else self.timeout):
                if rep.index >= len(norm):
                    continue
                it = norm[rep.index]
                if rep.HasField("ok"):
                    out[rep.index] = self._get_result(rep.ok, it.buffer, it.offset)
                else:
                    out[rep.index] = _item_error(rep.error)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, f"GetObjects on host-shim {self.socket}") from None
        for i, r in enumerate(out):
            if r is None:
                out[i] = S3dmaError(
                    f"the shim sent no reply for item {i} ({norm[i].bucket}/{norm[i].key})",
                    code="MissingReply",
                    domain=errors.CLIENT_DOMAIN,
                )
        return out  # type: ignore[return-value]

    def put_object_from(
        self,
        bucket: str,
        key: str,
        buffer: Union[Buffer, "CudaBuffer", int],
        offset: int = 0,
        length: Optional[int] = None,
        content_type: str = "",
        metadata: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> PutResult:
        """Writes ``length`` bytes of ``buffer`` from ``offset`` as the object
        (default: to the buffer's end; required when ``buffer`` is an id)."""
        if length is None:
            if not isinstance(buffer, (Buffer, CudaBuffer)):
                raise ValueError("put_object_from needs a length when the buffer is given by id")
            length = buffer.size - offset
        req = tenant_pb2.PutObjectRequest(
            bucket=bucket,
            key=key,
            source=self._slice(buffer, offset, length),
            content_type=content_type,
            metadata=metadata or {},
        )
        return _put_result(self._call("PutObject", req, timeout))

    def put_objects(
        self,
        items: Iterable[Union[PutItem, Sequence, Dict[str, Any]]],
        concurrency: int = 0,
        timeout: Optional[float] = None,
    ) -> List[Union[PutResult, S3dmaError]]:
        """Many PUTs in one call, each from a slice of a registered buffer.
        Returns, in the order of ``items``, a :class:`PutResult` or the
        :class:`S3dmaError` of each item: an item whose slice is not within
        its buffer (``OutOfBounds``), names an unknown buffer
        (``NoSuchBuffer``) or fails in the agent or the storage fails alone;
        the others are stored. Items are :class:`PutItem`, dicts of its
        fields, or tuples ``(bucket, key, buffer[, offset[, length[,
        content_type[, metadata]]]])``. Up to ``concurrency`` items are
        written at once (0 = the agent's default). The call as a whole
        raises when the shim refuses it: more than the tenant's
        ``max_batch_items`` items (1,024 by default) or ``max_batch_bytes``
        bytes. No items: ``[]``, without a call."""
        norm: List[PutItem] = _items(PutItem, items)
        if not norm:
            return []
        req = tenant_pb2.PutObjectsRequest(concurrency=concurrency)
        for i, it in enumerate(norm):
            length = it.length
            if length is None:
                if not isinstance(it.buffer, (Buffer, CudaBuffer)):
                    raise ValueError(f"put_objects: item {i} ({it.bucket}/{it.key}) needs a length (its buffer is an id)")
                length = it.buffer.size - it.offset
            req.items.add(
                bucket=it.bucket,
                key=it.key,
                source=self._slice(it.buffer, it.offset, length),
                content_type=it.content_type or "",
                metadata=it.metadata or {},
            )
        r = self._call("PutObjects", req, timeout)
        self._check_count("PutObjects", len(r.results), len(norm))
        return [
            _put_result(x.ok) if x.WhichOneof("result") == "ok" else self._result_error(x, i)
            for i, x in enumerate(r.results)
        ]

    def head(self, bucket: str, key: str) -> ObjectInfo:
        r = self._call("HeadObject", tenant_pb2.HeadObjectRequest(bucket=bucket, key=key))
        return _object_info(r.object, r.request_id)

    def head_objects(
        self,
        items: Iterable[Union[Tuple[str, str], Dict[str, str]]],
        concurrency: int = 0,
        timeout: Optional[float] = None,
    ) -> List[Union[ObjectInfo, None, S3dmaError]]:
        """Size, ETag and metadata of many keys in one call. ``items`` are
        ``(bucket, key)`` pairs (or dicts with ``bucket`` and ``key``).
        Returns, in their order, an :class:`ObjectInfo`, ``None`` when the
        key does not exist (a result, not an error), or the
        :class:`S3dmaError` of an item that failed (e.g. ``AccessDenied``
        for a bucket the tenant may not read). Up to ``concurrency`` keys
        are looked up at once (0 = the agent's default). The call raises
        only for the batch as a whole (more than ``max_batch_items`` keys,
        the shim or its agent unreachable). No items: ``[]``, without a
        call."""
        keys = _object_keys(items, "head_objects")
        if not keys:
            return []
        req = tenant_pb2.HeadObjectsRequest(concurrency=concurrency)
        for b, k in keys:
            req.items.add(bucket=b, key=k)
        r = self._call("HeadObjects", req, timeout)
        self._check_count("HeadObjects", len(r.results), len(keys))
        out: List[Union[ObjectInfo, None, S3dmaError]] = []
        for i, x in enumerate(r.results):
            which = x.WhichOneof("result")
            if which == "object":
                out.append(_object_info(x.object, r.request_id))
            elif which == "missing":
                out.append(None)
            else:
                out.append(self._result_error(x, i))
        return out

    def list(
        self,
        bucket: str,
        prefix: str = "",
        delimiter: str = "",
        continuation_token: str = "",
        max_keys: int = 0,
        start_after: str = "",
    ) -> ListPage:
        """One page of a listing (``max_keys`` 0 = 1000)."""
        r = self._call(
            "ListObjects",
            tenant_pb2.ListObjectsRequest(
                bucket=bucket,
                prefix=prefix,
                delimiter=delimiter,
                continuation_token=continuation_token,
                max_keys=max_keys,
                start_after=start_after,
            ),
        )
        return ListPage(
            objects=[ListedObject(o.key, o.size, o.etag, o.last_modified_unix_ms) for o in r.objects],
            common_prefixes=list(r.common_prefixes),
            next_continuation_token=r.next_continuation_token,
            is_truncated=r.is_truncated,
            request_id=r.request_id,
        )

    def list_all(
        self, bucket: str, prefix: str = "", delimiter: str = "", page_size: int = 0, start_after: str = ""
    ) -> Iterator[ListedObject]:
        """Every object under ``prefix``, page after page (common prefixes
        are in :meth:`list`'s pages)."""
        token = ""
        first = True
        while True:
            page = self.list(
                bucket,
                prefix=prefix,
                delimiter=delimiter,
                continuation_token=token,
                max_keys=page_size,
                start_after=start_after if first else "",
            )
            first = False
            yield from page.objects
            if not page.is_truncated or not page.next_continuation_token:
                return
            token = page.next_continuation_token

    def delete(self, bucket: str, key: str) -> str:
        """Deletes an object (a missing key is not an error); returns the request id."""
        return self._call("DeleteObject", tenant_pb2.DeleteObjectRequest(bucket=bucket, key=key)).request_id

    def delete_objects(
        self, items: Iterable[Union[Tuple[str, str], Dict[str, str]]], timeout: Optional[float] = None
    ) -> List[Optional[S3dmaError]]:
        """Deletes many keys in one call (``(bucket, key)`` pairs, or dicts
        with ``bucket`` and ``key``). Returns, in their order, ``None`` for
        each key deleted (or already missing, as in S3) and the
        :class:`S3dmaError` of each that failed. The call raises only for
        the batch as a whole. No items: ``[]``, without a call."""
        keys = _object_keys(items, "delete_objects")
        if not keys:
            return []
        req = tenant_pb2.DeleteObjectsRequest()
        for b, k in keys:
            req.items.add(bucket=b, key=k)
        r = self._call("DeleteObjects", req, timeout)
        self._check_count("DeleteObjects", len(r.results), len(keys))
        return [_item_error(x.error) if x.HasField("error") else None for x in r.results]

    def _check_count(self, method: str, got: int, want: int) -> None:
        """A batch answered with another number of results is the call's
        error (a shim that broke the API), not something to guess around."""
        if got != want:
            raise errors.InternalError(
                f"{method} on host-shim {self.socket}: {got} results for {want} items",
                code="Internal",
                domain=errors.CLIENT_DOMAIN,
            )

    @staticmethod
    def _result_error(x, index: int) -> S3dmaError:
        if x.HasField("error"):
            return _item_error(x.error)
        return S3dmaError(
            f"the shim sent an empty result for item {index}", code="MissingReply", domain=errors.CLIENT_DOMAIN
        )
