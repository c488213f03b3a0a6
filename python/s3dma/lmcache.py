"""An LMCache remote-storage backend over s3dma: KV-cache chunks as S3
objects, moved by the host-shim into registered memory.

Configure it as an LMCache *remote storage plug-in* (no fork of LMCache; the
extra ``s3dma[lmcache]`` brings lmcache, see docs/ML.md for installing both
in one environment)::

    remote_storage_plugins: ["s3dma"]
    extra_config:
      remote_storage_plugin.s3dma.module_path: s3dma.lmcache
      remote_storage_plugin.s3dma.class_name: S3dmaConnectorAdapter
      remote_storage_plugin.s3dma.url: "s3dma://kv/llama-8b?socket=/run/s3dma/shim.sock"

The plug-in name is ``s3dma`` or ``s3dma.<instance>`` (several instances,
each with its own ``remote_storage_plugin.<name>.*`` keys). The adapter also
takes a plain ``s3dma://bucket/prefix`` URL (LMCache's ``CreateConnector``).

Options, in the URL's query or as ``remote_storage_plugin.<name>.<option>``
keys of ``extra_config`` (a key wins over the query):

``url``           ``s3dma://bucket[/prefix]``; chunk ``K`` is the object
                  ``prefix/K`` (``K`` = LMCache's key string,
                  ``model@world_size@worker@hash@dtype[@tags]``)
``bucket``, ``prefix``  instead of (or over) the URL's
``socket``        the shim's socket (default :func:`s3dma.default_socket`)
``timeout``       seconds per shim call (default 60)
``slab_mib``      staging memory registered per process, on first GET or
                  PUT (default: 256 MiB or 8 full chunks, whichever is
                  larger; always at least one chunk; bounded by what is
                  left of the tenant's ``max_buffer_bytes``)
``concurrency``   items of one batched call the agent works on at once
                  (HEADs, PUTs; default 16), and shim calls in flight per
                  process
``batch_items``   most keys in one batched call (default 1024, the shim's
                  default ``max_batch_items``; keep it at most the
                  tenant's)
``exists_via``    ``head`` (default; ``auto`` is the same) or ``list``: see
                  below
``retry_interval`` seconds between reconnection attempts after the shim was
                  unreachable (default 1); calls in between fail at once

What each LMCache call costs
----------------------------

* ``batched_get`` (and ``get``, ``batched_get_non_blocking``): **one**
  ``GetObjects`` call to the shim for up to as many chunks as the staging
  slab holds (more chunks: more calls, one after the other); the agent
  fetches the items concurrently and places each chunk by RDMA.
* ``batched_put`` (LMCache's store of an engine batch): **one**
  ``PutObjects`` call for the batch's chunks, the agent writing
  ``concurrency`` of them at once; chunks staged through the slab go in
  slab-fulls (more chunks than the slab holds: more calls, one after the
  other), and a call has at most ``batch_items`` chunks. A chunk that
  fails fails alone (the others are stored); the call then raises naming
  how many failed. ``put``: one ``PutObject``.
* Existence (``exists``/``exists_sync``: one ``HeadObject``;
  ``batched_contains``/``batched_async_contains``, which count the leading
  chunks that exist): **one** ``HeadObjects`` call for up to
  ``batch_items`` keys (the agent looking up ``concurrency`` at once); a
  missing key ends the count, and keys after it are not asked about in
  another call. ``list`` instead pages through a listing of the keys'
  common prefix (from just before the smallest key) until every key is
  answered (for prefixes known to be small). A GET is never used to ask
  whether a chunk exists.

Where the bytes land
--------------------

When the memory LMCache allocates chunks from is registered with this
backend's shim client (the pool of the ``LocalCPUBackend``'s allocator lies
in a :class:`s3dma.Buffer` of :attr:`S3dmaConnector.client`), GETs place
each chunk straight into its ``MemoryObj`` and PUTs send from it: no copy.
Otherwise each chunk goes through a registered staging slab and one
``memmove`` (GIL released) into or out of the ``MemoryObj``.

**LMCache's default CPU allocator takes the staged path**: it allocates its
pool itself, as ``cudaHostAlloc`` pinned memory on a CUDA machine, a
page-aligned tensor on CPU, or a POSIX shared-memory segment (``shm_name``),
and the shim maps only memory passed as a sealed memfd (``memfd_create``
with ``F_SEAL_SHRINK``, so that it cannot shrink under a transfer). None of
those pools is one, and memory cannot be registered after the fact.
:attr:`S3dmaConnector.placement` says which path a process uses. A staged
GET takes LMCache's memory for a chunk while it holds a slot of the slab,
so it lets LMCache evict but not wait for other requests to free memory
(PUTs waiting for a slot hold memory too): with LMCache's CPU tier full of
chunks that cannot be evicted yet, the chunk reads as missing.

Chunk metadata
--------------

An object's body is exactly the chunk's bytes (what LMCache's own ``s3://``
connector stores). Every PUT also stores LMCache's ``RemoteMetadata``
(length, memory format, and each group's dtype and shape), base64, as the
user metadata ``x-amz-meta-lmcache-meta``; it comes back with the GET at no
extra cost. With ``save_chunk_meta`` on (LMCache's default for remote
connectors, forced by ``use_layerwise``), a GET allocates the stored shapes,
dtypes and format, as LMCache's file-system connector does with its
in-file header. With ``save_chunk_meta: false``, the engine's full-chunk
layout is allocated and a shorter object is a partial last chunk
(``reshape_partial_chunk``), as LMCache's ``s3://`` connector expects.
Partial chunks (``save_unfull_chunk``) are stored and read in both modes. A
chunk whose size fits neither (stored with another model or chunk size) is
logged and read as missing.

Errors
------

A missing chunk is ``None`` (``get``), ``False`` (``exists``) or the end of
the counted prefix, never an error. When the shim or the agent behind it
cannot be reached, calls raise :class:`s3dma.Unavailable` (the shim's socket:
:class:`s3dma.ShimUnavailable`) naming what failed; LMCache's
``RemoteBackend`` logs it, answers "not found" and keeps serving from its
local tiers. ``ping`` (LMCache's health monitor) answers 0 when the shim is
reachable and connected to its agent, 1 when the shim is not reachable and
2 when its agent is not connected. The health monitor's default
``fallback_policy`` (``recompute``) stops *all* caching while a backend is
unhealthy; set ``extra_config.fallback_policy: local_cpu`` to keep LMCache's
CPU tier in use during an outage. After an outage the backend reconnects on
its own (a new lease and slab), at most every ``retry_interval`` seconds.

Processes
---------

Each process has its own :class:`s3dma.Client`, slab and threads, made on
first use in that process: a connector inherited through ``fork`` (a
DataLoader-style worker, a forked engine process) reconnects in the child
instead of using the parent's gRPC channel or writing into the parent's
slab, and leaves the parent's client alone (it is kept, never closed, in the
child; the parent's lease stays open until the child exits, as with any
inherited :class:`s3dma.Client`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import ctypes
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import parse_qs, unquote

from . import errors
from .client import Buffer, Client, GetItem, GetResult, PutItem, default_socket
from .errors import S3dmaError
from .transfer import parse_url as _parse_s3_url

try:
    import torch
    from lmcache.logging import init_logger
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.memory_management import MemoryObj
    from lmcache.v1.protocol import RemoteMetadata
    from lmcache.v1.storage_backend.connector import (
        ConnectorAdapter,
        ConnectorContext,
        extract_plugin_type,
    )
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"s3dma.lmcache needs the lmcache package ({_e}); install it with pip install 's3dma[lmcache]'"
    ) from _e

__all__ = [
    "PLUGIN_TYPE",
    "SCHEME",
    "META_KEY",
    "S3dmaOptions",
    "S3dmaConnector",
    "S3dmaConnectorAdapter",
    "parse_options",
]

logger = init_logger(__name__)

PLUGIN_TYPE = "s3dma"
SCHEME = "s3dma://"
# The user metadata (x-amz-meta-...) holding LMCache's RemoteMetadata.
META_KEY = "lmcache-meta"

# ping() answers (0 = healthy; LMCache's own codes are negative).
PING_SHIM_UNREACHABLE = 1
PING_AGENT_DISCONNECTED = 2

MIB = 1 << 20
_SLOT_ALIGN = 4096
_DEFAULT_SLAB_BYTES = 256 * MIB
_DEFAULT_SLAB_CHUNKS = 8
_LIST_PAGE = 1000

_OPTION_KEYS = (
    "url",
    "bucket",
    "prefix",
    "socket",
    "timeout",
    "slab_mib",
    "concurrency",
    "batch_items",
    "exists_via",
    "retry_interval",
)


# -- options ------------------------------------------------------------------


@dataclass(frozen=True)
class S3dmaOptions:
    """Where the chunks go and how the backend talks to the shim."""

    bucket: str
    prefix: str = ""  # "" or ending in "/"
    socket: Optional[str] = None  # None: s3dma.default_socket() when connecting
    timeout: float = 60.0
    slab_bytes: Optional[int] = None  # None: max(256 MiB, 8 chunks)
    concurrency: int = 16
    batch_items: int = 1024
    exists_via: str = "head"
    retry_interval: float = 1.0

    def object_key(self, key: "CacheEngineKey") -> str:
        return self.prefix + key.to_string()

    def url(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}"


def _split_url(url: str) -> Tuple[str, str, Dict[str, str]]:
    """``s3dma://bucket[/prefix][?query]`` as (bucket, prefix, query)."""
    if not isinstance(url, str) or not url.startswith(SCHEME):
        raise ValueError(f"invalid URL {url!r}: an s3dma LMCache backend URL is s3dma://bucket[/prefix][?option=value]")
    rest = url[len(SCHEME) :]
    rest, _, query = rest.partition("?")
    bucket, prefix = _parse_s3_url("s3://" + unquote(rest))
    params: Dict[str, str] = {}
    for k, v in parse_qs(query, keep_blank_values=True).items():
        if k not in _OPTION_KEYS or k == "url":
            raise ValueError(f"invalid URL {url!r}: unknown option {k!r} (known: {', '.join(_OPTION_KEYS[1:])})")
        params[k] = v[-1]
    return bucket, prefix, params


def _number(name: str, value: Any, kind: type, minimum: float) -> Any:
    try:
        n = kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"s3dma LMCache option {name}={value!r} is not a number") from None
    if n < minimum:
        raise ValueError(f"s3dma LMCache option {name}={value!r} must be at least {minimum}")
    return n


def parse_options(url: Optional[str] = None, overrides: Optional[Mapping[str, Any]] = None) -> S3dmaOptions:
    """Options from an ``s3dma://`` URL (its query included) and
    ``overrides`` (option name -> value; ``url`` among them, when given,
    replaces ``url``). Raises ValueError naming what is wrong."""
    o: Dict[str, Any] = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = sorted(set(o) - set(_OPTION_KEYS))
    if unknown:
        raise ValueError(f"unknown s3dma LMCache option(s) {', '.join(unknown)} (known: {', '.join(_OPTION_KEYS)})")
    url = o.pop("url", None) or url
    merged: Dict[str, Any] = {}
    if url:
        bucket, prefix, query = _split_url(str(url))
        merged.update(query)
        merged["bucket"], merged["prefix"] = bucket, prefix
    merged.update(o)
    bucket = merged.get("bucket")
    if not bucket:
        raise ValueError(
            "the s3dma LMCache backend needs a bucket: remote_storage_plugin.<name>.url "
            "(s3dma://bucket/prefix) or remote_storage_plugin.<name>.bucket"
        )
    bucket, prefix = _parse_s3_url(f"s3://{bucket}/{merged.get('prefix') or ''}")
    exists_via = str(merged.get("exists_via", "head"))
    if exists_via not in ("auto", "head", "list"):
        raise ValueError(f"s3dma LMCache option exists_via={exists_via!r} must be head (or auto) or list")
    if exists_via == "auto":
        exists_via = "head"
    return S3dmaOptions(
        bucket=bucket,
        prefix=prefix,
        socket=str(merged["socket"]) if merged.get("socket") else None,
        timeout=_number("timeout", merged.get("timeout", 60.0), float, 0.001),
        slab_bytes=(
            int(_number("slab_mib", merged["slab_mib"], float, 0.001) * MIB) if merged.get("slab_mib") is not None else None
        ),
        concurrency=_number("concurrency", merged.get("concurrency", 16), int, 1),
        batch_items=_number("batch_items", merged.get("batch_items", 1024), int, 1),
        exists_via=exists_via,
        retry_interval=_number("retry_interval", merged.get("retry_interval", 1.0), float, 0.0),
    )


def _options_from_config(config: Any, plugin_name: Optional[str], url: Optional[str]) -> S3dmaOptions:
    extra = getattr(config, "extra_config", None) or {}
    base = f"remote_storage_plugin.{plugin_name or PLUGIN_TYPE}."
    overrides = {k: extra.get(base + k) for k in _OPTION_KEYS if extra.get(base + k) is not None}
    if url is not None and not url.startswith(SCHEME):
        url = None  # plugin://name: the URL is in extra_config
    if url is None and "url" not in overrides and "bucket" not in overrides:
        raise ValueError(
            f"the s3dma LMCache plug-in {plugin_name or PLUGIN_TYPE!r} has no location: set "
            f"extra_config {base}url (s3dma://bucket/prefix)"
        )
    return parse_options(url, overrides)


# -- per-process state ----------------------------------------------------------


class _Slots:
    """Fixed-size slots of one registered buffer, taken all at once (never
    hold-and-wait, so concurrent users cannot deadlock)."""

    def __init__(self, buf: Buffer, slot_size: int, count: int):
        self.buf = buf
        self.slot_size = slot_size
        self.count = count
        self._free = list(range(count))
        self._cond = threading.Condition()

    def take(self, n: int) -> List[int]:
        n = min(n, self.count)
        with self._cond:
            while len(self._free) < n:
                self._cond.wait()
            got, self._free = self._free[:n], self._free[n:]
            return got

    def give(self, slots: Iterable[int]) -> None:
        with self._cond:
            self._free.extend(slots)
            self._cond.notify_all()

    def address(self, slot: int) -> int:
        return self.buf.address + slot * self.slot_size


class _Process:
    """One process's client, staging slab and thread pools."""

    def __init__(self, opts: S3dmaOptions):
        self.pid = os.getpid()
        self.opts = opts
        self.client = Client(opts.socket, timeout=opts.timeout)
        self.broken = False
        self.lock = threading.Lock()
        self._slots: Optional[_Slots] = None
        self.placement: Optional[str] = None
        # Blocking shim calls (HEAD, HeadObjects, PUT, PutObjects,
        # GetObjects, LIST).
        self.io = concurrent.futures.ThreadPoolExecutor(opts.concurrency, thread_name_prefix="s3dma-lmcache-io")

    def slots(self, chunk_bytes: int) -> _Slots:
        with self.lock:
            if self._slots is None:
                slot = -(-max(chunk_bytes, 1) // _SLOT_ALIGN) * _SLOT_ALIGN
                if self.opts.slab_bytes is None:
                    count = max(_DEFAULT_SLAB_CHUNKS, _DEFAULT_SLAB_BYTES // slot)
                else:
                    count = max(1, self.opts.slab_bytes // slot)
                try:
                    info = self.client.info()
                    room = info.max_buffer_bytes - info.buffer_bytes
                    if info.max_buffer_bytes and room < count * slot:
                        count = max(1, room // slot)
                except S3dmaError:
                    pass  # alloc below says what is wrong
                buf = self.client.alloc(count * slot, label="lmcache-staging")
                self._slots = _Slots(buf, slot, count)
            return self._slots

    def close(self) -> None:
        self.io.shutdown(wait=False, cancel_futures=True)
        if os.getpid() == self.pid:
            try:
                self.client.close()  # the shim releases the slab with the lease
            except Exception:  # pragma: no cover - best effort
                pass


# Clients of other processes, inherited through fork: kept, never closed
# (collecting them in a child could close what the parent still uses).
_inherited: List[_Process] = []
_connectors: "weakref.WeakSet[S3dmaConnector]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for c in list(_connectors):
        c._forget_parent()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _shim_lost(e: BaseException) -> bool:
    """Whether ``e`` means this process's connection to the shim (its lease,
    its channel or its buffers) is gone, rather than one request failing."""
    if isinstance(e, errors.ShimUnavailable):
        return True
    code = getattr(e, "code", "")
    if code in ("NoSuchBuffer", "NoSuchLease", "ConnectionDropped", "ClientClosed", "LeaseRefused"):
        return True
    # gRPC's own UNAVAILABLE (no ErrorInfo): the shim's socket is gone.
    return isinstance(e, errors.Unavailable) and not code


# -- the connector ----------------------------------------------------------------


class S3dmaConnector(RemoteConnector):
    """LMCache ``RemoteConnector`` storing each KV chunk as one S3 object
    through the s3dma host-shim (see the module's documentation)."""

    def __init__(
        self,
        options: S3dmaOptions,
        loop: Optional[asyncio.AbstractEventLoop],
        local_cpu_backend: Any,
        config: Any = None,
        metadata: Any = None,
    ):
        config = config if config is not None else local_cpu_backend.config
        metadata = metadata if metadata is not None else local_cpu_backend.metadata
        super().__init__(config, metadata)
        self.options = options
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self._lock = threading.Lock()
        self._proc_state: Optional[_Process] = None
        self._closed = False
        self._last_failure: Optional[Tuple[float, S3dmaError]] = None
        _connectors.add(self)
        logger.info(
            "s3dma LMCache backend: %s (socket %s), chunks of %d bytes, save_chunk_meta=%s",
            options.url(),
            options.socket or default_socket(),
            self.full_chunk_size_bytes,
            self.save_chunk_meta,
        )

    def __repr__(self) -> str:
        return f"<S3dmaConnector {self.options.url()}>"

    # -- process state ----------------------------------------------------------

    def _forget_parent(self) -> None:
        """In a forked child: the parent's client, slab and threads are not
        ours (kept referenced, never used)."""
        self._lock = threading.Lock()
        st = self._proc_state
        if st is not None and st.pid != os.getpid():
            _inherited.append(st)
            self._proc_state = None

    def _proc(self) -> _Process:
        st = self._proc_state
        if st is not None and st.pid == os.getpid() and not st.broken:
            return st
        with self._lock:
            if self._closed:
                raise S3dmaError(
                    f"the s3dma LMCache backend {self.options.url()} is closed",
                    code="ClientClosed",
                    domain=errors.CLIENT_DOMAIN,
                )
            st = self._proc_state
            if st is not None and st.pid != os.getpid():
                self._forget_parent()
                st = None
            if st is not None and not st.broken:
                return st
            if st is not None:  # the shim was lost: start over
                self._proc_state = None
                st.close()
            failed = self._last_failure
            if failed is not None and time.monotonic() - failed[0] < self.options.retry_interval:
                e = failed[1]
                raise type(e)(e.message, code=e.code, grpc_code=e.grpc_code, domain=e.domain)
            try:
                st = _Process(self.options)
            except S3dmaError as e:
                msg = f"s3dma LMCache backend {self.options.url()}: {e.message}"
                err = type(e)(msg, code=e.code, grpc_code=e.grpc_code, domain=e.domain)
                self._last_failure = (time.monotonic(), err)
                raise err from None
            self._last_failure = None
            self._proc_state = st
            return st

    def _failed(self, st: _Process, e: S3dmaError) -> S3dmaError:
        """Notes that the shim is gone when ``e`` says so (the next call
        reconnects); returns the error to raise."""
        if not _shim_lost(e):
            return e
        st.broken = True
        if isinstance(e, errors.ShimUnavailable) or e.code:
            return e
        # gRPC's own "cannot connect": say which shim.
        return errors.ShimUnavailable(
            f"s3dma LMCache backend {self.options.url()}: the host-shim at {st.client.socket} cannot be "
            f"reached ({e.message})",
            code="ShimUnavailable",
            grpc_code=e.grpc_code,
            domain=errors.CLIENT_DOMAIN,
        )

    @property
    def client(self) -> Client:
        """This process's :class:`s3dma.Client` (connected on first use)."""
        return self._proc().client

    @property
    def placement(self) -> str:
        """``"direct"`` (chunks land in LMCache's memory objects) or
        ``"staged"`` (through the slab and one copy) for this process."""
        return self._placement(self._proc())

    def _placement(self, st: _Process) -> str:
        if st.placement is None:
            st.placement = "staged"
            allocator = getattr(self.local_cpu_backend, "memory_allocator", None)
            pool = getattr(allocator, "buffer", None)
            if isinstance(pool, torch.Tensor) and pool.device.type == "cpu" and pool.numel() > 0:
                nbytes = pool.numel() * pool.element_size()
                if st.client.find_buffer(pool.data_ptr(), nbytes) is not None:
                    st.placement = "direct"
            logger.info("s3dma LMCache backend: %s placement in process %d", st.placement, st.pid)
        return st.placement

    def _run(self, fn, *args):
        """Runs a blocking call in this process's io pool."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._proc().io, fn, *args)

    # -- metadata ---------------------------------------------------------------

    def _encode_meta(self, memory_obj: MemoryObj, nbytes: int) -> Dict[str, str]:
        meta = RemoteMetadata(
            nbytes, memory_obj.get_shapes(), memory_obj.get_dtypes(), memory_obj.get_memory_format()
        )
        return {META_KEY: base64.b64encode(meta.serialize()).decode("ascii")}

    def _decode_meta(self, r: GetResult) -> Optional[RemoteMetadata]:
        raw = r.metadata.get(META_KEY)
        if not raw:
            return None
        try:
            b = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            return None
        if len(b) != self.remote_metadata_bytes:
            return None  # written with another number of KV groups
        try:
            return RemoteMetadata.deserialize(b)
        except Exception:
            return None

    # -- existence ----------------------------------------------------------------

    def _head(self, st: _Process, okey: str) -> bool:
        try:
            st.client.head(self.options.bucket, okey)
            return True
        except errors.NotFound:
            return False
        except S3dmaError as e:
            raise self._failed(st, e) from None

    def exists_sync(self, key: CacheEngineKey) -> bool:
        st = self._proc()
        return self._head(st, self.options.object_key(key))

    async def exists(self, key: CacheEngineKey) -> bool:
        return await self._run(self.exists_sync, key)

    def _listed(self, st: _Process, okeys: Sequence[str]) -> set:
        """Lists the keys' common prefix from just before the smallest key
        until every key is answered: the names seen."""
        common = os.path.commonprefix(list(okeys))
        smallest = min(okeys, key=lambda k: k.encode())
        start_after = smallest[:-1] if len(smallest) > len(common) else ""
        largest = max(k.encode() for k in okeys)
        seen: set = set()
        token = ""
        while True:
            try:
                page = st.client.list(
                    self.options.bucket,
                    prefix=common,
                    continuation_token=token,
                    max_keys=_LIST_PAGE,
                    start_after="" if token else start_after,
                )
            except S3dmaError as e:
                raise self._failed(st, e) from None
            seen.update(o.key for o in page.objects)
            if not page.is_truncated or not page.next_continuation_token:
                return seen
            if page.objects and page.objects[-1].key.encode() >= largest:
                return seen
            token = page.next_continuation_token

    def _count_prefix(self, keys: Sequence[CacheEngineKey]) -> int:
        """How many of ``keys``, from the first, exist: one HeadObjects call
        per ``batch_items`` keys, stopping at the first missing one (see the
        module's documentation)."""
        if not keys:
            return 0
        st = self._proc()
        okeys = [self.options.object_key(k) for k in keys]
        if self.options.exists_via == "list":
            seen = self._listed(st, okeys)
            count = 0
            for k in okeys:
                if k not in seen:
                    break
                count += 1
            return count
        count = 0
        step = self.options.batch_items
        for w in range(0, len(okeys), step):
            window = okeys[w : w + step]
            try:
                res = st.client.head_objects(
                    [(self.options.bucket, k) for k in window],
                    concurrency=self.options.concurrency,
                    timeout=self.options.timeout,
                )
            except S3dmaError as e:
                raise self._failed(st, e) from None
            for r in res:
                # A missing key, or a missing bucket: the chunk is not there.
                if r is None or isinstance(r, errors.NotFound):
                    return count
                if isinstance(r, S3dmaError):
                    raise self._failed(st, r)
                count += 1
        return count

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: List[CacheEngineKey]) -> int:
        return self._count_prefix(keys)

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey], pin: bool = False) -> int:
        return await self._run(self._count_prefix, list(keys))

    # -- GET ------------------------------------------------------------------------

    def _allocate(self, shapes, dtypes, fmt, wait: bool = True) -> Optional[MemoryObj]:
        """LMCache's memory for a chunk. ``wait=False`` while staging slots
        are held: LMCache may evict, but does not wait for other requests to
        free memory (memory held by PUTs waiting for a slot would never be
        freed); no memory now reads the chunk as missing."""
        obj = self.local_cpu_backend.allocate(shapes, dtypes, fmt, busy_loop=wait)
        if obj is None:
            logger.warning("s3dma LMCache backend: no local memory for a chunk right now; read as missing")
        return obj

    def _finish(self, okey: str, obj: Optional[MemoryObj], r: GetResult, src: int) -> Optional[MemoryObj]:
        """The memory object of a fetched chunk: ``obj`` (already holding the
        bytes, direct placement) or a new one filled from ``src`` (a staging
        slot, held by the caller)."""
        n = r.bytes_placed
        wait = obj is not None
        meta = self._decode_meta(r) if self.save_chunk_meta else None
        if meta is not None and meta.length != n:
            logger.error(
                "s3dma LMCache backend: %s holds %d bytes, its metadata says %d; read as missing", okey, n, meta.length
            )
            if obj is not None:
                obj.ref_count_down()
            return None
        try:
            if meta is not None:
                same = (
                    obj is not None
                    and meta.fmt == obj.get_memory_format()
                    and list(meta.dtypes) == list(obj.get_dtypes())
                    and list(meta.shapes) == list(obj.get_shapes())
                )
                if same:
                    return obj
                if obj is not None and n < obj.get_size() and meta.fmt == obj.get_memory_format():
                    try:
                        out = self.reshape_partial_chunk(obj, n)
                        if list(out.get_shapes()) == list(meta.shapes):
                            return out
                    except ValueError:
                        pass  # another layout: copied below
                fresh = self._allocate(meta.shapes, meta.dtypes, meta.fmt, wait)
                if fresh is None:
                    if obj is not None:
                        obj.ref_count_down()
                    return None
                if fresh.get_size() != n:
                    fresh.ref_count_down()
                    raise ValueError(f"its metadata describes {fresh.get_size()} bytes, not {n}")
                ctypes.memmove(fresh.data_ptr, obj.data_ptr if obj is not None else src, n)
                if obj is not None:
                    obj.ref_count_down()
                return fresh
            if obj is None:
                obj = self._allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt, wait)
                if obj is None:
                    return None
                if n > obj.get_size():
                    raise ValueError(f"it holds {n} bytes, more than a chunk ({obj.get_size()})")
                ctypes.memmove(obj.data_ptr, src, n)
            return self.reshape_partial_chunk(obj, n)
        except ValueError as e:
            logger.error(
                "s3dma LMCache backend: %s does not fit this engine's chunks (%s); was it stored with "
                "another model or chunk size? Read as missing.",
                okey,
                e,
            )
            if obj is not None:
                obj.ref_count_down()
            return None

    def _item_failed(self, okey: str, e: S3dmaError) -> None:
        if isinstance(e, errors.NotFound):
            return
        if isinstance(e, errors.OutOfBounds):
            logger.error(
                "s3dma LMCache backend: %s is larger than a chunk of this engine (%s); read as missing", okey, e
            )
        else:
            logger.warning("s3dma LMCache backend: GET %s failed: %s", okey, e)

    def _get_many(self, keys: Sequence[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        """One GetObjects call per slab-full of chunks (direct placement:
        one for all)."""
        st = self._proc()
        okeys = [self.options.object_key(k) for k in keys]
        out: List[Optional[MemoryObj]] = [None] * len(keys)
        staged = list(range(len(keys)))
        try:
            if self._placement(st) == "direct":
                staged = self._get_direct(st, okeys, out)
            if staged:
                slots = st.slots(self.full_chunk_size_bytes)
                for w in range(0, len(staged), slots.count):
                    self._get_staged(st, slots, [(i, okeys[i]) for i in staged[w : w + slots.count]], out)
        except BaseException:
            for o in out:
                if o is not None:
                    o.ref_count_down()
            raise
        return out

    def _get_batch(self, st: _Process, items: List[GetItem], okeys: List[str]) -> List[Any]:
        try:
            res = st.client.get_objects(items, timeout=self.options.timeout)
        except S3dmaError as e:
            raise self._failed(st, e) from None
        failures = [r for r in res if isinstance(r, S3dmaError) and not isinstance(r, (errors.NotFound, errors.OutOfBounds))]
        if res and len(failures) == len(res):
            # Every item failed the same way: the agent or the storage is
            # down, not a chunk missing.
            e = failures[0]
            raise errors.with_message(
                e, f"s3dma LMCache backend {self.options.url()}: GET of {len(res)} chunks failed: {e.message}"
            )
        return res

    def _get_staged(self, st: _Process, slots: _Slots, batch: List[Tuple[int, str]], out: list) -> None:
        taken = slots.take(len(batch))
        try:
            items = [
                GetItem(self.options.bucket, okey, slots.buf, offset=s * slots.slot_size, length=slots.slot_size)
                for (_, okey), s in zip(batch, taken)
            ]
            res = self._get_batch(st, items, [k for _, k in batch])
            for (i, okey), s, r in zip(batch, taken, res):
                if isinstance(r, S3dmaError):
                    self._item_failed(okey, r)
                    continue
                out[i] = self._finish(okey, None, r, slots.address(s))
        finally:
            slots.give(taken)

    def _get_direct(self, st: _Process, okeys: List[str], out: list) -> List[int]:
        """GETs into freshly allocated memory objects that lie in a
        registered buffer; returns the indices left for the staged path."""
        objs: Dict[int, MemoryObj] = {}
        rest: List[int] = []
        items: List[GetItem] = []
        order: List[int] = []
        try:
            for i in range(len(okeys)):
                obj = self._allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
                if obj is None:
                    continue  # no local memory: missing, as LMCache's connectors do
                where = st.client.find_buffer(obj.data_ptr, obj.get_size())
                if where is None:
                    obj.ref_count_down()
                    rest.append(i)
                    continue
                objs[i] = obj
                buf, off = where
                items.append(GetItem(self.options.bucket, okeys[i], buf, offset=off, length=obj.get_size()))
                order.append(i)
            if items:
                res = self._get_batch(st, items, [okeys[i] for i in order])
                for i, r in zip(order, res):
                    obj = objs.pop(i)
                    if isinstance(r, S3dmaError):
                        self._item_failed(okeys[i], r)
                        obj.ref_count_down()
                        continue
                    out[i] = self._finish(okeys[i], obj, r, 0)
        finally:
            for obj in objs.values():
                obj.ref_count_down()
        return rest

    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return (await self._run(self._get_many, [key]))[0]

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        return await self._run(self._get_many, list(keys))

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: List[CacheEngineKey]) -> List[MemoryObj]:
        """The leading chunks that could be read (LMCache's contract: the
        ones after the first miss are released)."""
        objs = await self.batched_get(keys)
        prefix: List[MemoryObj] = []
        for o in objs:
            if o is None:
                break
            prefix.append(o)
        for o in objs[len(prefix) :]:
            if o is not None:
                o.ref_count_down()
        return prefix

    # -- PUT ------------------------------------------------------------------------

    def _put_one(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        st = self._proc()
        okey = self.options.object_key(key)
        n = memory_obj.get_size()
        meta = self._encode_meta(memory_obj, n)
        try:
            where = st.client.find_buffer(memory_obj.data_ptr, n)
            if where is not None:
                buf, off = where
                st.client.put_object_from(self.options.bucket, okey, buf, offset=off, length=n, metadata=meta)
                return
            slots = st.slots(self.full_chunk_size_bytes)
            if n > slots.slot_size:
                raise errors.client_error(
                    errors.InvalidArgument,
                    f"s3dma LMCache backend: chunk {okey} has {n} bytes, more than a staging slot "
                    f"({slots.slot_size}, the engine's full chunk)",
                )
            (slot,) = slots.take(1)
            try:
                ctypes.memmove(slots.address(slot), memory_obj.data_ptr, n)
                st.client.put_object_from(
                    self.options.bucket, okey, slots.buf, offset=slot * slots.slot_size, length=n, metadata=meta
                )
            finally:
                slots.give([slot])
        except S3dmaError as e:
            raise self._failed(st, e) from None

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj):
        # LMCache's wrapper (InstrumentedRemoteConnector) drops the
        # reference once this returns.
        await self._run(self._put_one, key, memory_obj)

    def _put_many(self, keys: Sequence[CacheEngineKey], memory_objs: Sequence[MemoryObj]) -> None:
        """One PutObjects call for the chunks (those staged through the slab
        in slab-fulls; at most ``batch_items`` a call); raises after the
        calls when any chunk failed."""
        if not keys:
            return
        st = self._proc()
        bucket = self.options.bucket
        failures: List[S3dmaError] = []
        direct: List[PutItem] = []
        staged: List[Tuple[str, MemoryObj, int, Dict[str, str]]] = []
        slots: Optional[_Slots] = None
        for key, obj in zip(keys, memory_objs):
            okey = self.options.object_key(key)
            n = obj.get_size()
            meta = self._encode_meta(obj, n)
            where = st.client.find_buffer(obj.data_ptr, n)
            if where is not None:
                buf, off = where
                direct.append(PutItem(bucket, okey, buf, offset=off, length=n, metadata=meta))
                continue
            if slots is None:
                try:
                    slots = st.slots(self.full_chunk_size_bytes)
                except S3dmaError as e:
                    raise self._failed(st, e) from None
            if n > slots.slot_size:
                failures.append(
                    errors.client_error(
                        errors.InvalidArgument,
                        f"s3dma LMCache backend: chunk {okey} has {n} bytes, more than a staging slot "
                        f"({slots.slot_size}, the engine's full chunk)",
                    )
                )
                continue
            staged.append((okey, obj, n, meta))
        total = len(keys)
        step = self.options.batch_items
        for w in range(0, len(direct), step):
            self._put_batch(st, direct[w : w + step], failures)
        if staged and slots is not None:
            step = min(step, slots.count)
            for w in range(0, len(staged), step):
                part = staged[w : w + step]
                taken = slots.take(len(part))
                try:
                    items = []
                    for (okey, obj, n, meta), slot in zip(part, taken):
                        ctypes.memmove(slots.address(slot), obj.data_ptr, n)
                        items.append(
                            PutItem(bucket, okey, slots.buf, offset=slot * slots.slot_size, length=n, metadata=meta)
                        )
                    self._put_batch(st, items, failures)
                finally:
                    slots.give(taken)
        if failures:
            first = self._failed(st, failures[0])
            raise errors.with_message(
                first,
                f"s3dma LMCache backend: {len(failures)} of {total} chunk PUTs failed, the first with: {first.message}",
            )

    def _put_batch(self, st: _Process, items: List[PutItem], failures: List[S3dmaError]) -> None:
        try:
            res = st.client.put_objects(items, concurrency=self.options.concurrency, timeout=self.options.timeout)
        except S3dmaError as e:
            raise self._failed(st, e) from None
        for it, r in zip(items, res):
            if isinstance(r, S3dmaError):
                logger.warning("s3dma LMCache backend: PUT %s failed: %s", it.key, r)
                failures.append(r)

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: List[CacheEngineKey], memory_objs: List[MemoryObj]):
        await self._run(self._put_many, list(keys), list(memory_objs))

    # -- the rest -------------------------------------------------------------------

    def _list_keys(self) -> List[str]:
        st = self._proc()
        p = self.options.prefix
        try:
            return [o.key[len(p) :] for o in st.client.list_all(self.options.bucket, prefix=p)]
        except S3dmaError as e:
            raise self._failed(st, e) from None

    async def list(self) -> List[str]:
        return await self._run(self._list_keys)

    def remove_sync(self, key: CacheEngineKey) -> bool:
        st = self._proc()
        try:
            st.client.delete(self.options.bucket, self.options.object_key(key))
            return True
        except S3dmaError as e:
            raise self._failed(st, e) from None

    def support_ping(self) -> bool:
        return True

    def ping_sync(self) -> int:
        try:
            st = self._proc()
        except S3dmaError:
            return PING_SHIM_UNREACHABLE
        try:
            info = st.client.info()
        except S3dmaError as e:
            self._failed(st, e)
            return PING_SHIM_UNREACHABLE
        return 0 if info.agent_connected else PING_AGENT_DISCONNECTED

    async def ping(self) -> int:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.ping_sync)

    def close_sync(self) -> None:
        with self._lock:
            self._closed = True
            st, self._proc_state = self._proc_state, None
        if st is not None and st.pid == os.getpid():
            st.close()

    async def close(self):
        self.close_sync()


class S3dmaConnectorAdapter(ConnectorAdapter):
    """Makes :class:`S3dmaConnector` for ``s3dma://`` URLs and for the
    ``s3dma`` remote-storage plug-in (``plugin://s3dma[.instance]``)."""

    def __init__(self) -> None:
        super().__init__(SCHEME)

    def can_parse(self, url: str) -> bool:
        if url.startswith(SCHEME):
            return True
        if url.startswith("plugin://"):
            return extract_plugin_type(url[len("plugin://") :]) == PLUGIN_TYPE
        return False

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        if context.config is None or context.metadata is None:
            raise ValueError("the s3dma LMCache backend needs the engine's config and metadata")
        plugin_name = context.plugin_name
        if plugin_name is None and context.url.startswith("plugin://"):
            plugin_name = context.url[len("plugin://") :]
        options = _options_from_config(context.config, plugin_name, context.url)
        return S3dmaConnector(
            options,
            context.loop,
            context.local_cpu_backend,
            config=context.config,
            metadata=context.metadata,
        )
