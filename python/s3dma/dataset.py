"""Datasets of S3 objects for data loaders (torch's or your own).

    ds = S3dmaIterableDataset("s3://data/train/", batch_size=64)
    ds = ObjectDataset("s3://data/train/", ["a.bin", "b.bin"], max_size=8 << 20,
                       slots=batch_size)
    sample = ds[i]          # numpy uint8 view of the object's bytes, no copy

Where the objects are: an ``s3://bucket/prefix`` URL (parsed as
:func:`s3dma.download_prefix` parses it: ``s3://data/train`` is the prefix
``train/``; ``keys=`` are then names under that prefix), or, as before, a
bucket and a ``prefix=`` (any string, not only a "directory") or full keys.
The URL comes first (the client made by ``s3dma.Client(socket)``, the
socket defaulting to :func:`s3dma.default_socket`), or second, after a
client factory: ``S3dmaMapDataset(factory, "s3://data/val/")``.

Fork safety: a gRPC channel does not survive ``fork``, and a lease shared
with forked workers mixes their fd requests. So the dataset never pickles
or inherits a client: it holds a *factory* (any picklable callable that
returns a :class:`s3dma.Client`, e.g. ``functools.partial(s3dma.Client,
path)``) and creates the client and its buffers lazily, once per process,
on the first ``__getitem__`` in that process. A dataset that was used in the
parent before a loader forked its workers simply starts over in each worker
(the parent's client is left alone: closing it from a child would close the
parent's connections).

Each process owns a ring of ``slots`` buffers of ``max_size`` bytes. The
array ``ds[i]`` returns is a view of one of them, valid until ``slots``
further items are read in the same process: with a loader that batches
items (torch's ``default_collate`` stacks them), use ``slots >= batch_size``,
or ``copy=True`` to get private arrays.

:class:`S3dmaMapDataset` (keys or a prefix, map-style) and
:class:`S3dmaIterableDataset` (a prefix, streamed) add sharding by rank
(``torch.distributed`` or ``rank=``/``world_size=``) and, for the iterable
one, by DataLoader worker; batched GETs (many small objects per
``get_objects`` call, into slots of one registered buffer); torch tensors
or numpy arrays; and ``device=`` (copied there after landing). They are
torch ``Dataset``/``IterableDataset`` subclasses when torch is importable,
plain classes otherwise.

    ds = S3dmaIterableDataset(functools.partial(s3dma.Client, sock),
                              "s3://data/train/", batch_size=64)
    for x in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=4):
        ...                               # x: uint8 tensor of one object
"""

from __future__ import annotations

import functools
import os
import random
import threading
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union

from . import errors
from .client import Buffer, Client, GetItem, GetResult
from .transfer import parse_url

try:  # torch is optional: subclass its dataset types only when it is there
    from torch.utils.data import Dataset as _MapBase
    from torch.utils.data import IterableDataset as _IterBase
except ImportError:  # pragma: no cover - depends on the environment
    _MapBase = object  # type: ignore[assignment,misc]
    _IterBase = object  # type: ignore[assignment,misc]


ClientFactory = Callable[[], Client]


def _is_url(s: Any) -> bool:
    return isinstance(s, str) and "://" in s


def _source(
    client_factory: Any,
    bucket: Any,
    keys: Optional[Sequence[str]],
    prefix: Optional[str],
    socket: Optional[str],
    url_first: bool,
    what: str,
) -> Tuple[ClientFactory, str, Optional[List[str]], Optional[str]]:
    """``(factory, bucket, keys, prefix)`` from either form: a URL (first,
    or after a factory) or a bucket with keys/prefix. A URL's prefix is the
    listing prefix, or, with ``keys``, what the keys are relative to."""
    if url_first:
        url = client_factory
        if socket is not None and not isinstance(socket, (str, os.PathLike)):
            raise TypeError(f"{what}: socket must be a path, not {type(socket).__name__}")
        factory: ClientFactory = functools.partial(Client, None if socket is None else os.fspath(socket))
    else:
        if not callable(client_factory):
            raise TypeError(
                f"{what}: the first argument is an s3://bucket/prefix URL or a callable returning an "
                f"s3dma.Client, not {type(client_factory).__name__}"
            )
        if socket is not None:
            raise ValueError(f"{what}: socket= goes with a URL first; a client factory picks its own socket")
        factory = client_factory
        if not _is_url(bucket):
            if not isinstance(bucket, str) or not bucket:
                raise TypeError(f"{what}: bucket must be a bucket name or an s3://bucket/prefix URL, not {bucket!r}")
            return factory, bucket, None if keys is None else list(keys), prefix
        url = bucket
    bucket, url_prefix = parse_url(url)
    if prefix is not None:
        raise ValueError(f"{what}: {url!r} already names the prefix; leave prefix= out (or pass the bucket alone)")
    if keys is not None:
        if isinstance(keys, str):
            raise TypeError(f"{what}: keys must be a sequence of names, not a string")
        return factory, bucket, [url_prefix + k for k in keys], None
    return factory, bucket, None, url_prefix


class ObjectDataset:
    """Map-style over ``keys``: ``ds[i]`` is object ``i`` in one of a ring of
    ``slots`` buffers of ``max_size`` bytes (numpy, or torch with
    ``as_torch``), valid until ``slots`` further items are read in this
    process.

    ``ObjectDataset(url, keys, max_size, *, socket=None, ...)``: the keys
    are names under the URL's prefix (``s3://data/train/`` and ``a.bin``
    read ``train/a.bin``); ``ObjectDataset(factory, bucket_or_url, keys,
    max_size, ...)`` as before.

    :meth:`get_batch` (also ``__getitems__``, which a torch DataLoader
    uses for a batch) reads many objects with one ``get_objects`` call."""

    def __init__(
        self,
        client_factory: Union[ClientFactory, str],
        bucket: Any = None,
        keys: Any = None,
        max_size: Optional[int] = None,
        *,
        slots: int = 1,
        dtype: Any = None,
        as_torch: bool = False,
        copy: bool = False,
        label: str = "dataset",
        socket: Optional[str] = None,
    ):
        url_first = _is_url(client_factory)
        if url_first:
            # ObjectDataset(url, keys, max_size): the positions after the URL
            # shift by one.
            if bucket is None:
                pass  # keys= and max_size= by name
            elif keys is None:
                keys = bucket
            elif max_size is None:
                keys, max_size = bucket, keys
            else:
                raise TypeError("ObjectDataset(url, keys, max_size): too many positional arguments")
            bucket = None
        if keys is None:
            raise TypeError("ObjectDataset: keys are required")
        client_factory, bucket, keys, _ = _source(
            client_factory, bucket, keys, None, socket, url_first, "ObjectDataset"
        )
        if max_size is None:
            raise TypeError("ObjectDataset: max_size (a positive byte count) is required")
        if not isinstance(max_size, int) or isinstance(max_size, bool):
            raise TypeError(f"ObjectDataset: max_size must be a byte count, not {max_size!r}")
        if max_size <= 0:
            raise ValueError("max_size must be positive")
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.client_factory = client_factory
        self.bucket = bucket
        self.keys = list(keys)
        self.max_size = max_size
        self.slots = slots
        self.dtype = dtype
        self.as_torch = as_torch
        self.copy = copy
        self.label = label
        self._state_pid: Optional[int] = None
        self._client: Optional[Client] = None
        self._buffers: List[Buffer] = []
        self._next = 0
        self._lock = threading.Lock()

    # Pickled into spawn/forkserver workers: only the recipe travels.
    def __getstate__(self):
        d = dict(self.__dict__)
        d.update(_state_pid=None, _client=None, _buffers=[], _next=0, _lock=None)
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.keys)

    def _ensure(self) -> Client:
        pid = os.getpid()
        if self._state_pid != pid:
            # Fresh process (or first use): never touch an inherited client.
            if self._client is not None:
                _inherited.append((self._client, self._buffers))
            self._client = self.client_factory()
            self._buffers = [self._client.alloc(self.max_size, label=f"{self.label}[{i}]") for i in range(self.slots)]
            self._next = 0
            self._state_pid = pid
        return self._client  # type: ignore[return-value]

    def _key(self, index: int) -> str:
        if index < 0:
            index += len(self.keys)
        return self.keys[index]

    def __getitem__(self, index: int):
        key = self._key(index)
        with self._lock:
            client = self._ensure()
            buf = self._buffers[self._next]
            self._next = (self._next + 1) % self.slots
        return self._sample(buf, client.get_object_into(self.bucket, key, buf))

    def get_batch(self, indices: Sequence[int]) -> list:
        """The samples of ``indices``, as ``[ds[i] for i in indices]`` gives
        them, read with one ``get_objects`` call per ``slots`` of them
        (each into the next buffer of the ring) instead of a call each. A
        failed object raises its :class:`s3dma.S3dmaError` (naming it), as
        ``ds[i]`` does. Also ``__getitems__``, which a torch DataLoader
        calls for a batch: with ``slots`` at least the batch size, every
        sample of a batch is a distinct view."""
        keys = [self._key(int(i)) for i in indices]
        out = []
        for w in range(0, len(keys), self.slots):
            part = keys[w : w + self.slots]
            with self._lock:
                client = self._ensure()
                bufs = [self._buffers[(self._next + j) % self.slots] for j in range(len(part))]
                self._next = (self._next + len(part)) % self.slots
            if len(part) == 1:  # no batch overhead for one object
                out.append(self._sample(bufs[0], client.get_object_into(self.bucket, part[0], bufs[0])))
                continue
            res = client.get_objects([GetItem(self.bucket, k, b) for k, b in zip(part, bufs)])
            for k, b, r in zip(part, bufs, res):
                if isinstance(r, errors.S3dmaError):
                    r.message = f"s3://{self.bucket}/{k}: {r.message}"
                    r.args = (r.message,)
                    raise r
                out.append(self._sample(b, r))
        return out

    __getitems__ = get_batch

    def _sample(self, buf: Buffer, r: GetResult):
        if self.as_torch:
            t = buf.torch(self.dtype, count=self._count(r.bytes_placed, torch_dtype=True))
            return t.clone() if self.copy else t
        a = r.numpy(self.dtype)
        return a.copy() if self.copy else a

    def _count(self, nbytes: int, torch_dtype: bool = False) -> int:
        import torch

        dtype = self.dtype if self.dtype is not None else torch.uint8
        return nbytes // torch.empty((), dtype=dtype).element_size()

    def close(self) -> None:
        """Closes this process's client (its buffers go with the lease)."""
        if self._client is not None and self._state_pid == os.getpid():
            self._client.close()
        self._client = None
        self._buffers = []
        self._state_pid = None


# Clients inherited over fork are kept referenced here so that garbage
# collection in the child never closes the parent's gRPC channel.
_inherited: list = []


# -- sharded datasets ----------------------------------------------------------

_SLOT_ALIGN = 64  # slot starts aligned for any dtype view (and a cache line)


def _have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def dist_rank_world(rank: Optional[int] = None, world_size: Optional[int] = None) -> Tuple[int, int]:
    """``(rank, world_size)``: the explicit values, else torch.distributed's
    when it is initialised, else ``(0, 1)``."""
    if rank is None or world_size is None:
        r, w = 0, 1
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                r, w = dist.get_rank(), dist.get_world_size()
        except ImportError:
            pass
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    return rank, world_size


def worker_id_count() -> Tuple[int, int]:
    """``(id, num_workers)`` of the current torch DataLoader worker, ``(0, 1)``
    outside one."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return 0, 1
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def list_prefix(client: Client, bucket: str, prefix: Optional[str] = None) -> List[Tuple[str, int]]:
    """Every ``(key, size)`` under ``prefix``, sorted by key; ``bucket`` may
    be an ``s3://bucket/prefix`` URL instead (then without ``prefix``)."""
    if _is_url(bucket):
        if prefix is not None:
            raise ValueError(f"{bucket!r} already names the prefix; leave prefix out")
        bucket, prefix = parse_url(bucket)
    return sorted((o.key, o.size) for o in client.list_all(bucket, prefix=prefix or ""))


class _Shard:
    """What the sharded datasets share: the key list, the per-process client
    and slot buffer (created lazily, again after fork), and turning landed
    bytes into the sample."""

    def _setup(
        self,
        client_factory: Callable[[], Client],
        bucket: str,
        keys: Optional[Sequence[str]],
        prefix: Optional[str],
        max_size: Optional[int],
        slots: int,
        dtype: Any,
        as_torch: Optional[bool],
        copy: Optional[bool],
        device: Any,
        return_keys: bool,
        concurrency: int,
        label: str,
    ) -> None:
        if (keys is None) == (prefix is None):
            raise ValueError("give either keys= or prefix= (not both)")
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.client_factory = client_factory
        self.bucket = bucket
        self.prefix = prefix
        self.as_torch = _have_torch() if as_torch is None else bool(as_torch)
        if (self.as_torch or device is not None) and not _have_torch():
            raise ImportError("as_torch/device need torch (pip install torch), or pass as_torch=False for numpy arrays")
        self.device = None
        if device is not None:
            import torch

            dev = torch.device(device)
            if dev.type == "cuda" and not torch.cuda.is_available():
                raise RuntimeError(
                    f"device={device!r} but CUDA is not available (torch.cuda.is_available() is False): "
                    "leave device unset for CPU views of registered memory"
                )
            self.device = None if dev.type == "cpu" else dev
            if self.device is not None and not self.as_torch:
                raise ValueError("device= needs torch tensors (as_torch=True)")
        self.dtype = dtype
        self.copy = copy
        self.return_keys = return_keys
        self.concurrency = concurrency
        self.slots = slots
        self.label = label
        self._state_pid: Optional[int] = None
        self._client: Optional[Client] = None
        self._buffer: Optional[Buffer] = None
        self._mv: Optional[memoryview] = None
        # device="cuda": the slots live in GPU memory registered with the
        # shim (objects land there directly), unless the shim cannot.
        self._gpu_ring = None
        self._gpu_at = 0
        self._gpu_ok = True
        self._next = 0
        self._lock = threading.Lock()
        if prefix is not None:
            # Listed once, here: every rank and worker shards the same list.
            listed = list_prefix(self._ensure(), bucket, prefix)
            self.keys = [k for k, _ in listed]
            biggest = max((n for _, n in listed), default=0)
            self.max_size = max(1, biggest if max_size is None else max_size)
        else:
            if max_size is None or max_size <= 0:
                raise ValueError("max_size (a positive byte count) is required with keys= (a prefix listing gives sizes)")
            self.keys = list(keys)  # type: ignore[arg-type]
            self.max_size = max_size
        self.slot_size = -(-self.max_size // _SLOT_ALIGN) * _SLOT_ALIGN

    # Pickled into spawn/forkserver workers: only the recipe travels.
    def __getstate__(self):
        d = dict(self.__dict__)
        d.update(_state_pid=None, _client=None, _buffer=None, _mv=None, _gpu_ring=None, _gpu_at=0, _next=0, _lock=None)
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._lock = threading.Lock()

    def _ensure(self) -> Client:
        pid = os.getpid()
        if self._state_pid != pid:
            if self._client is not None:
                _inherited.append((self._client, self._buffer, self._mv))  # never closed from here
            self._client = self.client_factory()
            self._buffer = self._mv = self._gpu_ring = None
            self._next = 0
            self._state_pid = pid
        return self._client  # type: ignore[return-value]

    def _slot_buffer(self) -> Any:
        if self._buffer is None and self.device is not None and self.device.type == "cuda" and self._gpu_ok:
            import torch

            ring = torch.empty(self.slots * self.slot_size, dtype=torch.uint8, device=self.device)
            try:
                self._buffer, self._gpu_at = self._ensure().register_cuda_tensor(ring, label=self.label)
                self._gpu_ring = ring
            except errors.Unsupported:
                self._gpu_ok = False  # a shim without CUDA: host slots, then a copy
        if self._buffer is None:
            self._buffer = self._ensure().alloc(self.slots * self.slot_size, label=self.label)
            self._mv = self._buffer.memoryview()
        return self._buffer

    def _take_slots(self, n: int) -> List[int]:
        if n > self.slots:
            raise ValueError(
                f"{n} objects at once need {n} slots, but this dataset has slots={self.slots}: "
                "raise slots (each costs max_size bytes of registered memory) or fetch fewer at once"
            )
        with self._lock:
            self._ensure()
            self._slot_buffer()
            out = [(self._next + i) % self.slots for i in range(n)]
            self._next = (self._next + n) % self.slots
        return [s * self.slot_size for s in out]

    def _fetch(self, keys: Sequence[str]) -> list:
        """GETs ``keys`` (one get_objects call) into free slots; the samples."""
        offsets = self._take_slots(len(keys))
        client, buf = self._client, self._buffer
        if len(keys) == 1:  # no batch overhead for one object
            try:
                at = self._gpu_at if self._gpu_ring is not None else 0
                res = [client.get_object_into(self.bucket, keys[0], buf, at + offsets[0], self.slot_size)]  # type: ignore[union-attr]
            except errors.S3dmaError as e:
                res = [e]
        else:
            at = self._gpu_at if self._gpu_ring is not None else 0
            items = [GetItem(self.bucket, k, buf, offset=at + o, length=self.slot_size) for k, o in zip(keys, offsets)]  # type: ignore[arg-type]
            res = client.get_objects(items, concurrency=self.concurrency)  # type: ignore[union-attr]
        out = []
        for k, o, r in zip(keys, offsets, res):
            if isinstance(r, Exception):
                r.message = f"s3://{self.bucket}/{k}: {r.message}"
                r.args = (r.message,)
                raise r
            sample = self._sample(o, r.bytes_placed)
            out.append((k, sample) if self.return_keys else sample)
        return out

    def _sample(self, offset: int, nbytes: int):
        copy = self.copy
        if copy is None:
            # In a DataLoader worker the sample is pickled later, by the
            # result queue's feeder thread, while this worker already
            # refills the slots: hand it a private copy.
            copy = _in_worker()
        if self.as_torch:
            import torch

            dtype = self.dtype if self.dtype is not None else torch.uint8
            item = torch.empty((), dtype=dtype).element_size()
            count = nbytes // item
            if self._gpu_ring is not None:
                # Landed in the GPU slots: a view of them, cloned unless
                # copy=False (the slot is reused `slots` samples later).
                t = self._gpu_ring[offset : offset + count * item].view(dtype)
                return t if copy is False else t.clone()
            if count == 0:
                t = torch.empty(0, dtype=dtype)
            else:
                # Over the memoryview (not the mmap): the view then keeps the
                # mapping even if the buffer is released under it.
                t = torch.frombuffer(self._mv, dtype=dtype, count=count, offset=offset)  # type: ignore[arg-type]
            if self.device is not None:
                return t.to(self.device)
            return t.clone() if copy else t
        import numpy as np

        dt = np.dtype(self.dtype if self.dtype is not None else np.uint8)
        a = np.frombuffer(self._mv, dtype=dt, count=nbytes // dt.itemsize, offset=offset)  # type: ignore[arg-type]
        return a.copy() if copy else a

    @property
    def client(self) -> Client:
        """This process's client (created on first use)."""
        return self._ensure()

    def close(self) -> None:
        """Closes this process's client (its buffer goes with the lease;
        views stay readable)."""
        if self._client is not None and self._state_pid == os.getpid():
            self._client.close()
        # The GPU slots go only after the lease let go of their registration.
        self._client = self._buffer = self._mv = self._gpu_ring = None
        self._state_pid = None


def _in_worker() -> bool:
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return False
    return get_worker_info() is not None


class S3dmaMapDataset(_Shard, _MapBase):  # type: ignore[misc,valid-type]
    """Map-style: ``ds[i]`` is object ``i`` of this rank's keys (``keys``,
    or every object under ``prefix``, listed once and sorted).

    Where: ``S3dmaMapDataset("s3://bucket/prefix", keys=None, *,
    socket=None, ...)`` (every object under the prefix, or ``keys`` named
    relative to it; the client is ``s3dma.Client(socket)``), or
    ``S3dmaMapDataset(client_factory, bucket_or_url, keys=None, *,
    prefix=None, ...)``.

    Sharding: with ``shard_by_rank`` (default), rank ``r`` of ``w`` sees
    keys ``r, r+w, ...`` (ranks from torch.distributed, or ``rank=`` and
    ``world_size=``); leave it off when a DistributedSampler shards the
    indices. DataLoader workers get distinct indices from the sampler.

    Samples are uint8 (or ``dtype``) torch tensors, numpy arrays with
    ``as_torch=False`` (default: torch when importable), or ``(key,
    sample)`` with ``return_keys``. They view one of ``slots`` slots of one
    registered buffer, valid until ``slots`` further objects are read in
    this process. ``copy`` True: private copies; None (default): copies in
    DataLoader workers only (their results are pickled asynchronously);
    pass False there only if your collate_fn copies (default_collate does).
    ``device``: each sample is copied there (CUDA must be available).

    :meth:`get_batch` (also ``__getitems__``, which DataLoader uses for a
    batch) reads many objects with one ``get_objects`` call."""

    def __init__(
        self,
        client_factory: Union[ClientFactory, str],
        bucket: Any = None,
        keys: Optional[Sequence[str]] = None,
        *,
        prefix: Optional[str] = None,
        socket: Optional[str] = None,
        max_size: Optional[int] = None,
        slots: int = 64,
        dtype: Any = None,
        as_torch: Optional[bool] = None,
        copy: Optional[bool] = None,
        device: Any = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        shard_by_rank: bool = True,
        return_keys: bool = False,
        concurrency: int = 0,
        label: str = "s3dma-map",
    ):
        url_first = _is_url(client_factory)
        if url_first:
            # S3dmaMapDataset(url, keys): the keys come second.
            if bucket is not None and keys is not None:
                raise TypeError("S3dmaMapDataset(url, keys): too many positional arguments")
            keys, bucket = (bucket if bucket is not None else keys), None
        client_factory, bucket, keys, prefix = _source(
            client_factory, bucket, keys, prefix, socket, url_first, "S3dmaMapDataset"
        )
        self._setup(client_factory, bucket, keys, prefix, max_size, slots, dtype, as_torch, copy, device,
                    return_keys, concurrency, label)
        self.all_keys = self.keys
        if shard_by_rank:
            self.rank, self.world_size = dist_rank_world(rank, world_size)
            self.keys = self.all_keys[self.rank :: self.world_size]
        else:
            self.rank, self.world_size = 0, 1

    def __len__(self) -> int:
        return len(self.keys)

    def _key(self, index: int) -> str:
        if index < 0:
            index += len(self.keys)
        if not 0 <= index < len(self.keys):
            raise IndexError(f"index {index} out of range for {len(self.keys)} objects")
        return self.keys[index]

    def __getitem__(self, index: int):
        return self._fetch([self._key(index)])[0]

    def get_batch(self, indices: Sequence[int]) -> list:
        """The samples of ``indices`` (at most ``slots``), fetched with one
        ``get_objects`` call into slots of one buffer."""
        return self._fetch([self._key(int(i)) for i in indices])

    __getitems__ = get_batch


class S3dmaIterableDataset(_Shard, _IterBase):  # type: ignore[misc,valid-type]
    """Streams every object under ``prefix`` (listed once, sorted; or
    ``keys=`` with ``max_size=``), ``batch_size`` objects per ``get_objects``
    call.

    Sharding: rank ``r`` of ``w`` (torch.distributed, or ``rank=`` and
    ``world_size=``, read at each ``iter``) reads keys ``r::w`` of the list
    (as the map dataset), and its DataLoader worker ``i`` of ``n`` every
    ``n``-th of those from the ``i``-th: a disjoint cover.
    ``shuffle`` permutes the list the same way everywhere (``seed`` plus
    the epoch of :meth:`set_epoch`) before sharding.

    Where: ``S3dmaIterableDataset("s3://bucket/prefix", *, socket=None,
    ...)`` (``keys=`` then names objects relative to the prefix), or
    ``S3dmaIterableDataset(client_factory, bucket_or_url, prefix=None,
    ...)``.

    Samples: as :class:`S3dmaMapDataset` (``yield_batches`` yields each
    fetched list instead). A yielded view stays valid while the next
    ``slots - batch_size`` samples are read (``slots`` defaults to twice
    ``batch_size``)."""

    def __init__(
        self,
        client_factory: Union[ClientFactory, str],
        bucket: Any = None,
        prefix: Optional[str] = None,
        *,
        keys: Optional[Sequence[str]] = None,
        socket: Optional[str] = None,
        max_size: Optional[int] = None,
        batch_size: int = 32,
        slots: Optional[int] = None,
        dtype: Any = None,
        as_torch: Optional[bool] = None,
        copy: Optional[bool] = None,
        device: Any = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        shuffle: bool = False,
        seed: int = 0,
        return_keys: bool = False,
        yield_batches: bool = False,
        concurrency: int = 0,
        label: str = "s3dma-iter",
    ):
        url_first = _is_url(client_factory)
        if url_first and (bucket is not None or prefix is not None):
            raise TypeError("S3dmaIterableDataset(url, ...): the URL names bucket and prefix; pass the rest by name")
        client_factory, bucket, keys, prefix = _source(
            client_factory, bucket, keys, prefix, socket, url_first, "S3dmaIterableDataset"
        )
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        slots = 2 * batch_size if slots is None else slots
        if slots < batch_size:
            raise ValueError(f"slots ({slots}) must be at least batch_size ({batch_size})")
        if keys is None and prefix is None:
            prefix = ""
        self._setup(client_factory, bucket, keys, prefix, max_size, slots, dtype, as_torch, copy, device,
                    return_keys, concurrency, label)
        self.batch_size = batch_size
        self.rank_arg, self.world_arg = rank, world_size
        dist_rank_world(rank, world_size)  # refuse a bad rank now, not in a worker
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.yield_batches = yield_batches

    def set_epoch(self, epoch: int) -> None:
        """Reshuffles (with ``shuffle``) for the next iteration."""
        self.epoch = epoch

    def shard_keys(self) -> List[str]:
        """The keys this rank and worker read, in order."""
        keys = list(self.keys)
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(keys)
        rank, world = dist_rank_world(self.rank_arg, self.world_arg)
        wid, nworkers = worker_id_count()
        return keys[rank::world][wid::nworkers]

    def __len__(self) -> int:
        """Objects of this rank (all its workers together)."""
        rank, world = dist_rank_world(self.rank_arg, self.world_arg)
        return len(self.keys[rank::world])

    def __iter__(self) -> Iterator[Any]:
        keys = self.shard_keys()
        for i in range(0, len(keys), self.batch_size):
            batch = self._fetch(keys[i : i + self.batch_size])
            if self.yield_batches:
                yield batch
            else:
                yield from batch
