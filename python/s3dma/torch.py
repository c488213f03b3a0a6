"""PyTorch Distributed Checkpoint (DCP) storage on S3 through s3dma.

    import torch.distributed.checkpoint as dcp
    import s3dma.torch

    dcp.save(state_dict, storage_writer=s3dma.torch.StorageWriter("s3://data/ckpt/step-100"))
    dcp.load(state_dict, storage_reader=s3dma.torch.StorageReader("s3://data/ckpt/step-100"))

Layout under ``s3://bucket/prefix/``:

* ``__{rank}_{n}.distcp``: a rank's data objects. Each holds items (tensor
  chunks as raw bytes in row-major order, BYTE_IO items as their bytes) one
  after another, every item starting at a multiple of 64 bytes. Nothing is
  pickled or ``torch.save``'d: dtype and shape come from the DCP metadata.
* ``.metadata``: the pickled DCP ``Metadata``, written last by the
  coordinator; its ``storage_data`` maps each item to an
  :class:`ObjectSlice` (object name relative to the prefix, offset, length).
  A checkpoint without it does not exist (a save that failed half way
  leaves none).

Tensor bytes only pass through registered memory: a write copies each tensor
once into a reused registered buffer (one copy, also from GPU) and PUTs it;
a tensor whose storage already lies in a registered buffer of the client is
PUT from there. A read GETs straight into the destination tensor when it is
contiguous CPU memory inside a registered buffer (:func:`empty_like` makes
a state dict whose tensors all are), or into GPU memory registered for the
read, else into a reused registered buffer and makes one copy into the
destination (CPU or GPU).

Each process needs its own :class:`s3dma.Client` (gRPC does not survive
``fork``). A ``client=`` is used only in the process that created it; any
other process that uses (or unpickles) the writer/reader, such as a rank or
async_save's checkpoint process, calls ``client_factory()`` or else
connects to ``socket`` (default: the given client's, else
:func:`s3dma.default_socket`, found as the CLI finds it). Zero-copy reads
and writes need the tensors' buffers to belong to the Client in use: pass
that ``client=``.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader as _DcpStorageReader
from torch.distributed.checkpoint.storage import StorageWriter as _DcpStorageWriter
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from . import errors
from .client import Buffer, Client, GetItem

__all__ = ["StorageWriter", "StorageReader", "ObjectSlice", "empty_like", "parse_url"]

MIB = 1 << 20
METADATA_NAME = ".metadata"
DATA_SUFFIX = ".distcp"
# Items start at this alignment in data objects (and staging buffers), so a
# slice of any dtype can be viewed in place.
ALIGN = 64
DEFAULT_MAX_OBJECT_SIZE = 256 * MIB
DEFAULT_READ_BUFFER_SIZE = 256 * MIB
# Ranges of one object closer than this are read with one GET (the bytes in
# between are read and dropped): many small items cost one request. Merged
# GETs stay below MERGE_LIMIT so a batch still has GETs to run in parallel.
MERGE_GAP = 256 * 1024
MERGE_LIMIT = 32 * MIB
_DATA_OBJECT_RE = re.compile(r"^__\d+_\d+" + re.escape(DATA_SUFFIX) + "$")
_URL_SCHEMES = ("s3://", "s3dma://")


@dataclass
class ObjectSlice:
    """Where one item's bytes are: ``length`` bytes at ``offset`` of the
    object ``relative_path`` (relative to the checkpoint's prefix)."""

    relative_path: str
    offset: int
    length: int


@dataclass
class _RankPrefix:
    """The object-name prefix of one rank (``__{rank}_``), from the global plan."""

    prefix: str


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def empty_like(state_dict: Any, *, client: Client, label: str = "state-dict") -> Tuple[Any, Buffer]:
    """A state dict of the same structure as ``state_dict`` whose tensors
    (same shapes and dtypes, CPU, contiguous, uninitialised) all lie in one
    buffer registered with the shim, each at a multiple of 64 bytes; other
    leaves are kept as they are. Returns it and the buffer.

    A ``dcp.load`` into it with a :class:`StorageReader` of the same
    ``client`` places every tensor's bytes straight into its memory (no
    staging copy); ``model.load_state_dict(sd, assign=True)`` then adopts
    the tensors without copying either. The tensors keep the mapping alive;
    ``buf.release()`` ends the registration (and unmaps once no tensor is
    left), after which a load through the client stages and copies again.
    Nested dicts, lists and tuples are followed."""
    tensors: List[torch.Tensor] = []

    def collect(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            tensors.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                collect(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                collect(v)

    collect(state_dict)
    total = 0
    for t in tensors:
        total = _align(total + t.numel() * t.element_size())
    buf = client.alloc(max(total, 1), label=label)
    at = 0

    def build(x: Any) -> Any:
        nonlocal at
        if isinstance(x, torch.Tensor):
            n = x.numel()
            t = buf.torch(x.dtype, offset=at, count=n).view(x.shape) if n else torch.empty(x.shape, dtype=x.dtype)
            at = _align(at + n * x.element_size())
            return t
        if isinstance(x, dict):
            return type(x)((k, build(v)) for k, v in x.items()) if type(x) is not dict else {k: build(v) for k, v in x.items()}
        if isinstance(x, list):
            return [build(v) for v in x]
        if isinstance(x, tuple):
            return tuple(build(v) for v in x)
        return x

    return build(state_dict), buf


def parse_url(url: Union[str, os.PathLike]) -> Tuple[str, str]:
    """``s3://bucket/prefix`` (or ``s3dma://``) -> ``(bucket, prefix)``, the
    prefix without a trailing ``/``. Raises ValueError naming the url."""
    s = os.fspath(url) if isinstance(url, os.PathLike) else url
    if not isinstance(s, str):
        raise ValueError(f"a DCP checkpoint url must be a string like s3://bucket/prefix, not {url!r}")
    for scheme in _URL_SCHEMES:
        if s.startswith(scheme):
            bucket, _, prefix = s[len(scheme) :].partition("/")
            prefix = prefix.strip("/")
            if bucket and "/" not in bucket and prefix and "//" not in prefix:
                return bucket, prefix
            break
    raise ValueError(
        f"not an s3dma checkpoint url: {s!r} (expected s3://bucket/prefix, with a non-empty bucket and prefix)"
    )


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _numel(sizes: Sequence[int]) -> int:
    n = 1
    for s in sizes:
        n *= int(s)
    return n


def _row_major_strides(sizes: Sequence[int]) -> List[int]:
    strides = [1] * len(sizes)
    for d in range(len(sizes) - 2, -1, -1):
        strides[d] = strides[d + 1] * max(int(sizes[d + 1]), 1)
    return strides


def _raise_first_error(results) -> None:
    for r in results:
        if isinstance(r, Exception):
            raise r


# -- clients and buffers ------------------------------------------------------


_shared_clients: Dict[Tuple[int, str], Client] = {}
_shared_lock = threading.Lock()


def _shared_client(socket: Optional[str]) -> Client:
    """One Client per process and socket, shared by every writer/reader made
    from a socket: async_save's checkpoint process unpickles a new writer for
    each checkpoint, and a Client each would pile up connections."""
    key = (os.getpid(), socket or "")
    with _shared_lock:
        c = _shared_clients.get(key)
        if c is None or c.closed:
            c = _shared_clients[key] = Client(socket)
        return c


class _ClientSource:
    """The Client of the current process: the one given (only in the process
    that created it), else one made by ``client_factory`` (closed by
    :meth:`close`), else the process's shared Client on ``socket``.
    Pickles without the Client."""

    def __init__(self, client: Optional[Client], socket: Optional[str], client_factory: Optional[Callable[[], Client]]):
        if client is not None and not isinstance(client, Client):
            raise TypeError(f"client must be an s3dma.Client, not {type(client).__name__}")
        if client_factory is not None and not callable(client_factory):
            raise TypeError("client_factory must be a callable returning an s3dma.Client")
        self._given = client
        self._given_pid = os.getpid() if client is not None else None
        self.socket = socket if socket is not None else (client.socket if client is not None else None)
        self.factory = client_factory
        self._made: Optional[Client] = None
        self._made_pid: Optional[int] = None
        self._lock = threading.Lock()

    def get(self) -> Client:
        pid = os.getpid()
        if self._given is not None and self._given_pid == pid and not self._given.closed:
            return self._given
        if self.factory is None:
            return _shared_client(self.socket)
        with self._lock:
            if self._made is None or self._made_pid != pid or self._made.closed:
                made = self.factory()
                if not isinstance(made, Client):
                    raise TypeError(f"client_factory returned {type(made).__name__}, not an s3dma.Client")
                self._made, self._made_pid = made, pid
            return self._made

    def close(self) -> None:
        with self._lock:
            if self._made is not None and self._made_pid == os.getpid():
                self._made.close()
            self._made = None

    def __getstate__(self):
        return {"socket": self.socket, "factory": self.factory}

    def __setstate__(self, state):
        self.__init__(None, state["socket"], state["factory"])


class _BufferPool:
    """Registered staging buffers reused across objects and batches: at most
    ``count`` at once, allocated lazily at the size first asked for; a
    request larger than every free buffer replaces one. Buffers come from,
    and go back to, the client's kept buffers (:meth:`s3dma.Client.take_buffer`,
    :meth:`s3dma.Client.give_back`), so the next load or save of the same
    shapes finds them faulted in. :meth:`close` gives them all back."""

    def __init__(self, client: Client, count: int, label: str):
        self._client = client
        self._count = count
        self._label = label
        self._free: List[Buffer] = []
        self._allocated = 0
        self._cond = threading.Condition()
        self._all: List[Buffer] = []

    def acquire(self, nbytes: int) -> Buffer:
        nbytes = max(int(nbytes), ALIGN)
        with self._cond:
            while not self._free and self._allocated >= self._count:
                self._cond.wait()
            fitting = [b for b in self._free if b.size >= nbytes]
            if fitting:
                buf = min(fitting, key=lambda b: b.size)
                self._free.remove(buf)
                return buf
            if self._free:  # too small: give it back to the shim, make a bigger one
                old = self._free.pop()
                self._all.remove(old)
                self._allocated -= 1
                self._client.give_back(old)
            self._allocated += 1
        try:
            buf = self._client.take_buffer(nbytes, label=self._label)
        except BaseException:
            with self._cond:
                self._allocated -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._all.append(buf)
        return buf

    def release(self, buf: Buffer) -> None:
        with self._cond:
            self._free.append(buf)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            bufs, self._all, self._free = self._all, [], []
        for b in bufs:
            try:
                self._client.give_back(b)
            except errors.S3dmaError:
                pass  # the client is closing or gone: the lease frees them


def _put_bytes(client: Client, bucket: str, key: str, data: bytes) -> None:
    """PUTs small non-tensor bytes (the metadata) through a registered buffer."""
    with client.alloc(max(len(data), 1), label="dcp-metadata") as buf:
        buf.memoryview()[: len(data)] = data
        client.put_object_from(bucket, key, buf, 0, len(data))


def _get_bytes(client: Client, bucket: str, key: str) -> bytes:
    size = client.head(bucket, key).size
    with client.alloc(max(size, 1), label="dcp-metadata") as buf:
        r = client.get_object_into(bucket, key, buf, 0, size)
        mv = buf.memoryview()
        try:
            return bytes(mv[: r.bytes_placed])
        finally:
            mv.release()


class _Storage:
    """What the writer and the reader share: the url and the client."""

    def __init__(self, url, client, socket, client_factory):
        self.bucket, self.prefix = parse_url(url)
        self._clients = _ClientSource(client, socket, client_factory)

    @property
    def checkpoint_id(self) -> str:
        """The checkpoint's url."""
        return f"s3://{self.bucket}/{self.prefix}"

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def _set_url(self, checkpoint_id) -> None:
        if checkpoint_id:
            self.bucket, self.prefix = parse_url(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike]) -> bool:
        try:
            parse_url(checkpoint_id)
        except ValueError:
            return False
        return True

    def close(self) -> None:
        """Closes the Client that ``client_factory`` made in this process. A
        ``client=`` stays yours to close; the per-process Client on a socket
        is shared and closes with the process."""
        self._clients.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- writing ----------------------------------------------------------------


class _ObjectBuilder:
    """A data object being filled in a staging buffer."""

    def __init__(self, name: str, buf: Buffer, capacity: int):
        self.name = name
        self.buf = buf
        self.capacity = capacity  # <= buf.size: a reused buffer may be larger
        self.used = 0  # end of the last item
        self.results: List[WriteResult] = []

    def room_for(self, nbytes: int) -> bool:
        return _align(self.used) + nbytes <= self.capacity

    def place(self, item: WriteItem, nbytes: int) -> int:
        offset = _align(self.used)
        self.used = offset + nbytes
        self.results.append(WriteResult(index=item.index, size_in_bytes=nbytes, storage_data=ObjectSlice(self.name, offset, nbytes)))
        return offset


class StorageWriter(_Storage, _DcpStorageWriter):
    """DCP storage writer to ``s3://bucket/prefix`` through the local host-shim.

    ``client``: an :class:`s3dma.Client` to use in this process; ``socket``
    / ``client_factory``: how other processes (ranks, async-save workers)
    make theirs (default: the client's socket, else
    :func:`s3dma.default_socket`).

    ``max_object_size``: items of a rank are packed into data objects of at
    most this many bytes (a single larger item gets an object of its own
    size). Each rank stages at most ``staging_buffers`` objects in
    registered memory at once (one filled while the other is PUT), so
    memory is bounded by ``staging_buffers * max_object_size``.

    ``overwrite``: False refuses a prefix that already holds a checkpoint.
    With True, the old ``.metadata`` is removed before any data object is
    written and data objects the new checkpoint does not use are deleted
    after the new ``.metadata`` is in place.
    """

    def __init__(
        self,
        url: Union[str, os.PathLike],
        *,
        client: Optional[Client] = None,
        socket: Optional[str] = None,
        client_factory: Optional[Callable[[], Client]] = None,
        max_object_size: int = DEFAULT_MAX_OBJECT_SIZE,
        staging_buffers: int = 2,
        overwrite: bool = True,
    ):
        _DcpStorageWriter.__init__(self)
        _Storage.__init__(self, url, client, socket, client_factory)
        if max_object_size < ALIGN:
            raise ValueError(f"max_object_size must be at least {ALIGN} bytes, not {max_object_size}")
        if staging_buffers < 1:
            raise ValueError(f"staging_buffers must be at least 1, not {staging_buffers}")
        self.max_object_size = int(max_object_size)
        self.staging_buffers = int(staging_buffers)
        self.overwrite = overwrite
        self.save_id = _new_id()
        self.is_coordinator = False
        self.rank: Optional[int] = None
        self.use_collectives = True

    def reset(self, checkpoint_id: Union[str, os.PathLike, None] = None) -> None:
        self._set_url(checkpoint_id)
        self.save_id = _new_id()

    # -- dcp.async_save staging (torch's AsyncStager protocol) -------------------
    # async_save stages through the writer when it has these: the copy that
    # makes the state dict training-safe is made straight into registered
    # memory, so the upload PUTs it from there with no second copy.

    _synchronize_after_execute = True

    @property
    def should_synchronize_after_execute(self) -> bool:
        return self._synchronize_after_execute

    def synchronize_staging(self) -> None:
        """Staging is synchronous: nothing to wait for."""

    def stage(self, state_dict):
        """A copy of ``state_dict`` whose tensors (and DTensors' local
        shards) live in one registered buffer of this process's client
        (64-byte aligned, copied once, also from GPU); other leaves are deep
        copies. The buffer is released when the last staged tensor goes.
        Used by ``dcp.async_save``."""
        import copy
        import weakref

        from torch.utils._pytree import tree_flatten, tree_unflatten

        try:
            from torch.distributed.tensor import DTensor
        except ImportError:  # torch without DTensor
            DTensor = ()  # type: ignore[assignment]

        leaves, spec = tree_flatten(state_dict)

        def local(leaf):
            if DTensor and isinstance(leaf, DTensor):
                return leaf.to_local()
            return leaf if isinstance(leaf, torch.Tensor) else None

        places: List[int] = []
        total = 0
        for leaf in leaves:
            t = local(leaf)
            nbytes = t.numel() * t.element_size() if t is not None else 0
            places.append(_align(total) if nbytes else -1)
            if nbytes:
                total = _align(total) + nbytes
        buf = self._clients.get().alloc(total, label="dcp-stage") if total else None
        mv = buf.memoryview() if buf is not None else None
        staged = []
        try:
            for leaf, at in zip(leaves, places):
                t = local(leaf)
                if t is None:
                    staged.append(copy.deepcopy(leaf))
                    continue
                if at < 0:
                    copy_ = torch.empty(t.shape, dtype=t.dtype)
                else:
                    nbytes = t.numel() * t.element_size()
                    copy_ = torch.frombuffer(mv, dtype=torch.uint8, count=nbytes, offset=at).view(t.dtype).view(t.shape)
                    copy_.copy_(t.detach())
                if DTensor and isinstance(leaf, DTensor):
                    copy_ = DTensor.from_local(
                        copy_, leaf.device_mesh, leaf.placements, run_check=False, shape=leaf.shape, stride=leaf.stride()
                    )
                staged.append(copy_)
        except BaseException:
            staged.clear()
            if buf is not None:
                mv.release()
                buf.release()
            raise
        if buf is not None:
            # The staged tensors hold `mv`, `mv` holds the mapping, and this
            # holds the Buffer (so the upload finds it): let go with the last.
            weakref.finalize(mv, _release_quietly, buf).atexit = False
        return tree_unflatten(staged, spec)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    def _metadata_name(self) -> str:
        if not self.use_collectives and self.rank is not None:
            return f"__{self.rank}{METADATA_NAME}"
        return METADATA_NAME

    def _metadata_exists(self, client: Client, name: str) -> bool:
        try:
            client.head(self.bucket, self._key(name))
        except errors.NotFound:
            return False
        return True

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        client = self._clients.get()
        if not self.overwrite and (self.is_coordinator or not self.use_collectives):
            name = METADATA_NAME if self.use_collectives else f"__0{METADATA_NAME}"
            if self._metadata_exists(client, name):
                raise FileExistsError(
                    f"a checkpoint already exists at {self.checkpoint_id} ({name}); "
                    "pass overwrite=True to replace it or save under another prefix"
                )
        if not self.use_collectives and self.rank is not None:
            plan = dataclasses.replace(plan, storage_data=_RankPrefix(f"__{self.rank}_"))
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        # Runs on the coordinator before any rank writes: removing the old
        # .metadata first means no reader ever sees it pointing into data
        # objects this save is overwriting. (Without collectives every rank
        # runs this on its own plan; rank 0 removes a global .metadata,
        # which loads would otherwise prefer to the new per-rank ones.)
        if self.use_collectives or not self.rank:
            self._clients.get().delete(self.bucket, self._key(METADATA_NAME))
        return [
            dataclasses.replace(p, storage_data=_RankPrefix(f"__{i}_")) if p.storage_data is None else p
            for i, p in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        if isinstance(plan.storage_data, _RankPrefix):
            rank_prefix = plan.storage_data.prefix
        else:  # a plan that did not go through prepare_global_plan
            rank_prefix = f"__{self.rank or 0}_"
        results = _RankWrite(self, self._clients.get(), rank_prefix, plan, planner).run()
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        client = self._clients.get()
        storage_data: Dict[MetadataIndex, ObjectSlice] = {}
        for rank_results in results:
            for wr in rank_results:
                storage_data[wr.index] = wr.storage_data
        metadata.storage_data = storage_data
        metadata.storage_meta = self.storage_meta()
        _put_bytes(client, self.bucket, self._key(self._metadata_name()), pickle.dumps(metadata))
        if self.use_collectives:
            self._delete_unused_objects(client, {s.relative_path for s in storage_data.values()})

    def _delete_unused_objects(self, client: Client, used: set) -> None:
        """Data objects left by an earlier checkpoint under the same prefix."""
        base = self.prefix + "/"
        for obj in client.list_all(self.bucket, prefix=base, delimiter="/"):
            name = obj.key[len(base) :]
            if _DATA_OBJECT_RE.match(name) and name not in used:
                client.delete(self.bucket, obj.key)


class _RankWrite:
    """One rank's write_data: items packed into data objects, each filled in
    a staging buffer while the previous one is PUT."""

    def __init__(self, writer: StorageWriter, client: Client, rank_prefix: str, plan: SavePlan, planner: SavePlanner):
        self.writer = writer
        self.client = client
        self.rank_prefix = rank_prefix
        self.items = plan.items
        self.planner = planner
        self.count = 0
        self.results: List[WriteResult] = []
        self.puts: list = []

    def _next_name(self) -> str:
        name = f"{self.rank_prefix}{self.count}{DATA_SUFFIX}"
        self.count += 1
        return name

    def run(self) -> List[WriteResult]:
        w = self.writer
        pool = _BufferPool(self.client, w.staging_buffers, "dcp-write")
        executor = ThreadPoolExecutor(max_workers=w.staging_buffers, thread_name_prefix="s3dma-dcp-put")
        current: Optional[_ObjectBuilder] = None
        try:
            # BYTE_IO items are resolved first (small, and their size is
            # only known once resolved); tensors are resolved one at a time
            # as they are copied (resolving may allocate, e.g. from GPU).
            byte_items = [(it, self.planner.resolve_data(it)) for it in self.items if it.type == WriteItemType.BYTE_IO]
            tensor_items = [it for it in self.items if it.type != WriteItemType.BYTE_IO]
            remaining = sum(_align(len(data.getbuffer())) for _, data in byte_items)
            remaining += sum(_align(_write_item_bytes(it)) for it in tensor_items)

            def room(nbytes: int) -> _ObjectBuilder:
                nonlocal current
                if current is not None and current.room_for(nbytes):
                    return current
                self._flush(current, pool, executor)
                size = max(nbytes, min(w.max_object_size, remaining))
                current = _ObjectBuilder(self._next_name(), pool.acquire(size), size)
                return current

            for item, data in byte_items:
                view = data.getbuffer()
                n = len(view)
                obj = room(n)
                off = obj.place(item, n)
                mv = obj.buf.memoryview()
                mv[off : off + n] = view
                mv.release()
                view.release()
                remaining -= _align(n)

            for item in tensor_items:
                nbytes = _write_item_bytes(item)
                tensor = self.planner.resolve_data(item).detach()
                if tuple(tensor.shape) != tuple(item.tensor_data.chunk.sizes):
                    raise ValueError(
                        f"{item.index.fqn}: the planner resolved a tensor of shape {tuple(tensor.shape)}, "
                        f"the plan's chunk is {tuple(item.tensor_data.chunk.sizes)}"
                    )
                if self._put_in_place(item, tensor, nbytes, executor):
                    remaining -= _align(nbytes)
                    continue
                obj = room(nbytes)
                off = obj.place(item, nbytes)
                remaining -= _align(nbytes)
                if nbytes:
                    dst = obj.buf.torch(torch.uint8, offset=off, count=nbytes)
                    dst.view(item.tensor_data.properties.dtype).view(tensor.shape).copy_(tensor)
                    del dst
                del tensor
            self._flush(current, pool, executor)
            current = None
            for f in self.puts:
                f.result()
        finally:
            executor.shutdown(wait=True)
            pool.close()
        return self.results

    def _put_in_place(self, item: WriteItem, tensor, nbytes: int, executor) -> bool:
        """PUTs a tensor that already lies in a registered buffer of the
        client, from there, as an object of its own (no copy)."""
        if nbytes == 0 or tensor.device.type != "cpu" or not tensor.is_contiguous():
            return False
        if tensor.dtype != item.tensor_data.properties.dtype:
            return False
        found = self.client.find_buffer(tensor.data_ptr(), nbytes)
        if found is None:
            return False
        buf, offset = found
        name = self._next_name()
        self.results.append(WriteResult(index=item.index, size_in_bytes=nbytes, storage_data=ObjectSlice(name, 0, nbytes)))
        self.puts.append(
            executor.submit(self.client.put_object_from, self.writer.bucket, self.writer._key(name), buf, offset, nbytes)
        )
        return True

    def _flush(self, obj: Optional[_ObjectBuilder], pool: _BufferPool, executor) -> None:
        # A failed PUT stops the save now rather than after every other object.
        for f in self.puts:
            if f.done() and f.exception() is not None:
                raise f.exception()
        if obj is None:
            return
        if obj.used == 0:
            # Only empty items: no object (readers never fetch 0 bytes).
            self.results.extend(obj.results)
            pool.release(obj.buf)
            return

        def put():
            try:
                self.client.put_object_from(self.writer.bucket, self.writer._key(obj.name), obj.buf, 0, obj.used)
            finally:
                pool.release(obj.buf)

        self.results.extend(obj.results)
        self.puts.append(executor.submit(put))


def _write_item_bytes(item: WriteItem) -> int:
    # The chunk this rank writes (tensor_data.size is the whole tensor's).
    td = item.tensor_data
    return _numel(td.chunk.sizes) * _element_size(td.properties.dtype)


def _release_quietly(buf: Buffer) -> None:
    try:
        buf.release()
    except (errors.S3dmaError, ValueError):
        pass  # the client is closed or gone: the lease freed it


def _new_id() -> str:
    import uuid

    return str(uuid.uuid4())


# -- reading ----------------------------------------------------------------


@dataclass
class _Request:
    """One read item's bytes: ``length`` bytes at ``first`` of ``name``."""

    item: ReadItem
    name: str
    first: int
    length: int
    target: Any = None  # the destination tensor (TENSOR items)
    dtype: Any = None
    shape: Tuple[int, ...] = ()  # the region's shape
    strides: Tuple[int, ...] = ()  # the stored chunk's row-major strides


@dataclass
class _Fetch:
    """One ranged GET into a staging buffer, serving several requests."""

    name: str
    first: int
    length: int
    requests: List[_Request]
    buf_offset: int = 0


class StorageReader(_Storage, _DcpStorageReader):
    """DCP storage reader from ``s3://bucket/prefix`` through the local host-shim.

    ``client`` / ``socket`` / ``client_factory``: as for :class:`StorageWriter`.
    ``read_buffer_size``: the staging memory per batch of GETs (two batches
    are in flight: one being fetched, one being copied out); a single item
    larger than it gets a buffer of its own size.
    """

    def __init__(
        self,
        url: Union[str, os.PathLike],
        *,
        client: Optional[Client] = None,
        socket: Optional[str] = None,
        client_factory: Optional[Callable[[], Client]] = None,
        read_buffer_size: int = DEFAULT_READ_BUFFER_SIZE,
    ):
        _DcpStorageReader.__init__(self)
        _Storage.__init__(self, url, client, socket, client_factory)
        if read_buffer_size < ALIGN:
            raise ValueError(f"read_buffer_size must be at least {ALIGN} bytes, not {read_buffer_size}")
        self.read_buffer_size = int(read_buffer_size)
        self.load_id = _new_id()
        self.metadata: Optional[Metadata] = None
        self.storage_data: Dict[MetadataIndex, ObjectSlice] = {}

    def reset(self, checkpoint_id: Union[str, os.PathLike, None] = None) -> None:
        self._set_url(checkpoint_id)
        self.storage_data = {}
        self.metadata = None
        self.load_id = _new_id()

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = METADATA_NAME if rank is None else f"__{rank}{METADATA_NAME}"
        try:
            data = _get_bytes(self._clients.get(), self.bucket, self._key(name))
        except errors.NotFound as e:
            raise FileNotFoundError(
                f"no DCP checkpoint at {self.checkpoint_id}: {self.checkpoint_id}/{name} does not exist "
                f"({e.code or 'NotFound'})"
            ) from e
        metadata = pickle.loads(data)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if metadata.storage_data is None:
            raise ValueError(f"the checkpoint at {self.checkpoint_id} has no storage data in its metadata")
        self.metadata = metadata
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        _RankRead(self, self._clients.get(), plan, planner).run()
        fut: Future = Future()
        fut.set_result(None)
        return fut


class _RankRead:
    """One rank's read_data."""

    def __init__(self, reader: StorageReader, client: Client, plan: LoadPlan, planner: LoadPlanner):
        self.reader = reader
        self.client = client
        self.plan = plan
        self.planner = planner

    def _slice(self, item: ReadItem) -> ObjectSlice:
        try:
            s = self.reader.storage_data[item.storage_index]
        except KeyError:
            raise KeyError(f"{item.storage_index} is not in the checkpoint at {self.reader.checkpoint_id}") from None
        if not isinstance(s, ObjectSlice):
            raise ValueError(
                f"the checkpoint at {self.reader.checkpoint_id} was not written by s3dma.torch.StorageWriter "
                f"(storage data {type(s).__name__})"
            )
        return s

    def _chunk_sizes(self, item: ReadItem) -> Tuple[int, ...]:
        md = self.reader.metadata.state_dict_metadata[item.storage_index.fqn]
        idx = item.storage_index
        chunks = md.chunks
        if idx.index is not None and idx.index < len(chunks) and chunks[idx.index].offsets == idx.offset:
            return tuple(chunks[idx.index].sizes)
        for c in chunks:
            if c.offsets == idx.offset:
                return tuple(c.sizes)
        raise KeyError(f"{idx} has no stored chunk in the checkpoint at {self.reader.checkpoint_id}")

    def run(self) -> None:
        direct: List[Tuple[_Request, Any, int]] = []
        staged: List[_Request] = []
        # CUDA destinations registered with the shim for this read (released
        # once their bytes are placed); False once the shim said it cannot.
        cuda_bufs: List[Any] = []
        cuda_ok = True
        for item in self.plan.items:
            s = self._slice(item)
            if item.type == LoadItemType.BYTE_IO:
                if s.length == 0:
                    self.planner.load_bytes(item, io.BytesIO(b""))
                else:
                    staged.append(_Request(item, s.relative_path, s.offset, s.length))
                continue
            dtype = self.reader.metadata.state_dict_metadata[item.storage_index.fqn].properties.dtype
            sizes = self._chunk_sizes(item)
            strides = _row_major_strides(sizes)
            itemsize = _element_size(dtype)
            offsets, lengths = tuple(item.storage_offsets), tuple(item.lengths)
            target = self.planner.resolve_tensor(item).detach()
            if tuple(target.shape) != lengths:
                raise ValueError(
                    f"{item.storage_index.fqn}: destination of shape {tuple(target.shape)} for a stored region of {lengths}"
                )
            count = _numel(lengths)
            if count == 0:
                self.planner.commit_tensor(item, target)
                continue
            # The span of stored bytes that covers the region (row-major).
            start = sum(o * st for o, st in zip(offsets, strides))
            end = sum((o + n - 1) * st for o, n, st in zip(offsets, lengths, strides)) + 1
            req = _Request(item, s.relative_path, s.offset + start * itemsize, (end - start) * itemsize, target, dtype, lengths, tuple(strides))
            if end - start == count and target.dtype == dtype and target.is_contiguous():
                if target.device.type == "cpu":
                    found = self.client.find_buffer(target.data_ptr(), count * itemsize)
                    if found is not None:
                        direct.append((req, found[0], found[1]))
                        continue
                elif target.device.type == "cuda" and cuda_ok:
                    # Straight into GPU memory: the destination's allocation
                    # registered with the shim by its IPC handle.
                    try:
                        cbuf, off = self.client.register_cuda_tensor(target, label="dcp-read-cuda")
                    except errors.Unsupported:
                        cuda_ok = False  # a shim without CUDA: stage through host memory
                    else:
                        cuda_bufs.append(cbuf)
                        direct.append((req, cbuf, off))
                        continue
            staged.append(req)

        batches = self._batches(staged)
        key = self.reader._key
        bucket = self.reader.bucket
        if direct:
            try:
                results = self.client.get_objects(
                    [GetItem(bucket, key(r.name), buf, off, r.length, (r.first, r.first + r.length - 1)) for r, buf, off in direct]
                )
            finally:
                for cbuf in cuda_bufs:
                    cbuf.release()
            _raise_first_error(results)
            for (r, _, _), res in zip(direct, results):
                if res.bytes_placed != r.length:
                    raise errors.S3dmaError(
                        f"{key(r.name)}: read {res.bytes_placed} bytes of {r.length} at {r.first} "
                        f"({self.reader.checkpoint_id} is damaged or being overwritten)",
                        code="ShortRead",
                        domain=errors.CLIENT_DOMAIN,
                    )
                self.planner.commit_tensor(r.item, r.target)
        if not batches:
            return

        pool = _BufferPool(self.client, 2, "dcp-read")

        def fetch(batch: List[_Fetch]) -> Buffer:
            size = max(f.buf_offset + f.length for f in batch)
            buf = pool.acquire(size)
            try:
                results = self.client.get_objects(
                    [GetItem(bucket, key(f.name), buf, f.buf_offset, f.length, (f.first, f.first + f.length - 1)) for f in batch]
                )
                _raise_first_error(results)
                for f, res in zip(batch, results):
                    if res.bytes_placed != f.length:
                        raise errors.S3dmaError(
                            f"{key(f.name)}: read {res.bytes_placed} bytes of {f.length} at {f.first} "
                            f"({self.reader.checkpoint_id} is damaged or being overwritten)",
                            code="ShortRead",
                            domain=errors.CLIENT_DOMAIN,
                        )
            except BaseException:
                pool.release(buf)
                raise
            return buf

        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="s3dma-dcp-get") as ex:
                pending = ex.submit(fetch, batches[0])
                for i, batch in enumerate(batches):
                    buf = pending.result()
                    if i + 1 < len(batches):
                        pending = ex.submit(fetch, batches[i + 1])  # overlaps the copies below
                    try:
                        for f in batch:
                            for r in f.requests:
                                self._deliver(r, buf, f.buf_offset + (r.first - f.first))
                    finally:
                        pool.release(buf)
        finally:
            pool.close()

    def _batches(self, staged: List[_Request]) -> List[List[_Fetch]]:
        """Requests -> ranged GETs (neighbours in one object merged) ->
        batches that fit the read buffer."""
        limit = self.reader.read_buffer_size
        merge_limit = min(limit, MERGE_LIMIT)
        by_object: Dict[str, List[_Request]] = {}
        for r in staged:
            by_object.setdefault(r.name, []).append(r)
        fetches: List[_Fetch] = []
        for name, reqs in by_object.items():
            reqs.sort(key=lambda r: r.first)
            cur: Optional[_Fetch] = None
            for r in reqs:
                if cur is not None:
                    end = cur.first + cur.length
                    new_end = max(end, r.first + r.length)
                    if r.first <= end + MERGE_GAP and new_end - cur.first <= merge_limit:
                        cur.length = new_end - cur.first
                        cur.requests.append(r)
                        continue
                cur = _Fetch(name, r.first, r.length, [r])
                fetches.append(cur)
        batches: List[List[_Fetch]] = []
        used = limit  # forces a first batch
        for f in fetches:
            if used + f.length > limit and (not batches or batches[-1]):
                batches.append([])
                used = 0
            f.buf_offset = used
            batches[-1].append(f)
            used = _align(used + f.length)
        return [b for b in batches if b]

    def _deliver(self, r: _Request, buf: Buffer, at: int) -> None:
        if r.item.type == LoadItemType.BYTE_IO:
            mv = buf.memoryview()
            try:
                data = bytes(mv[at : at + r.length])
            finally:
                mv.release()
            self.planner.load_bytes(r.item, io.BytesIO(data))
            return
        raw = buf.torch(torch.uint8, offset=at, count=r.length)
        itemsize = _element_size(r.dtype)
        if at % itemsize:
            raw = raw.clone()  # not aligned for a view of the dtype (not written by this module)
        src = raw.view(r.dtype).as_strided(r.shape, r.strides)
        r.target.copy_(src)
        del src, raw
        self.planner.commit_tensor(r.item, r.target)
