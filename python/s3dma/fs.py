"""An fsspec filesystem for ``s3dma://bucket/key``, through the local host-shim.

    import fsspec
    fs = fsspec.filesystem("s3dma")                 # socket: s3dma.default_socket()
    with fs.open("s3dma://data/logs/a.txt", "wb") as f:
        f.write(b"hello")                          # PUT at close
    fs.cat_file("data/logs/a.txt", start=1)        # b"ello"
    with fsspec.open("s3dma://data/big.bin") as f:  # ranged GETs, ETag pinned
        f.seek(1 << 20); chunk = f.read(4096)

Object bytes only pass through registered buffers (memfds shared with the
shim): reads are ranged GETs into a reused buffer; writes accumulate in a
registered buffer and are PUT from it at ``close`` (the agent turns large
objects into a multipart upload). A write that fails, raises inside its
``with`` block, is discarded or is garbage-collected unclosed leaves no
object. A file open for reading pins the object's ETag: if the object is
overwritten meanwhile, the next fetch raises :class:`ObjectChangedError`
instead of mixing two versions.

S3 semantics: directories are key prefixes ("/"-delimited), so ``mkdir``
and ``makedirs`` only check that the bucket exists, and an empty directory
does not exist. Buckets are configured by the host's operator: the tenant
API cannot create, delete or list them.

Fork safety: one :class:`s3dma.Client` per process and socket, created
lazily; a forked child (or a filesystem unpickled elsewhere) makes its own
and never touches the parent's. A ``client=`` given to the constructor is
used only in the process that created it.

Limits: an object being written is held whole in one registered buffer
(it doubles as it fills; ``open(..., "wb", size=n)`` sizes it at once), so
writes and ``cp_file`` need memory for the object and the shim's
``max_buffer_bytes``. ``xb`` and ``mode="create"`` check, then PUT (the
tenant API has no conditional PUT). No append mode. ``fsspec.open(...)``
(an OpenFile) closes, hence commits, even when its with-block raised: use
``fs.open`` or ``fs.transaction`` for all-or-nothing writes. Deleting a
missing key is no error (S3).
"""

from __future__ import annotations

import errno
import hashlib
import io
import mimetypes
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from fsspec.callbacks import DEFAULT_CALLBACK
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem, make_instance
from fsspec.utils import isfilelike, stringify_path

from . import errors
from .client import Buffer, Client, GetItem, default_socket
from .errors import S3dmaError

__all__ = ["S3dmaFileSystem", "S3dmaFile", "ObjectChangedError"]

PROTOCOL = "s3dma"
KIB = 1 << 10
MIB = 1 << 20

_MIN_BUFFER = 64 * KIB  # smallest pooled buffer
_POOL_MAX_BUFFER = 16 * MIB  # larger buffers go back to the shim at once
_POOL_IDLE = 4  # idle buffers kept per client (the shim caps buffers per tenant)
_READ_BUFFER_MAX = 64 * MIB  # one ranged GET at most; longer reads loop
_CHUNK = 16 * MIB  # get_file/put_file step (callback granularity)
_BATCH_BYTES = 256 * MIB  # destination of one get_objects batch
_WRITE_INITIAL = 256 * KIB
_DELETE_THREADS = 8


class ObjectChangedError(OSError):
    """The object was overwritten or deleted while a file read it: its ETag
    no longer matches the one pinned at ``open``. Reopen to read the new
    version."""


# -- errors -------------------------------------------------------------------


def _url(path: str) -> str:
    return f"{PROTOCOL}://{path}"


def _translate(e: S3dmaError, path: str) -> Exception:
    """The Python exception fsspec users expect for ``e`` (caller chains ``e``)."""
    url = _url(path)
    if isinstance(e, errors.NotFound):
        if e.code == "NoSuchBucket":
            bucket = path.split("/", 1)[0]
            return FileNotFoundError(
                errno.ENOENT,
                f"bucket {bucket!r} does not exist (buckets are configured by the host's s3dma operator; "
                f"the tenant API cannot create them): {e}",
                url,
            )
        return FileNotFoundError(errno.ENOENT, f"no such object: {e}", url)
    if isinstance(e, errors.AccessDenied):
        return PermissionError(errno.EACCES, f"access denied by the s3dma policy: {e}", url)
    if isinstance(e, errors.PreconditionFailed):
        return ObjectChangedError(
            errno.ESTALE, f"the object changed while it was open for reading; reopen it: {e}", url
        )
    if isinstance(e, (errors.InvalidArgument, errors.InvalidRange)):
        return ValueError(f"{url}: {e}")
    if isinstance(e, errors.SlowDown):
        return OSError(
            errno.EAGAIN,
            f"the shim's quota is exhausted (too many open files or buffers?); close some and retry: {e}",
            url,
        )
    if isinstance(e, errors.DeadlineExceeded):
        return TimeoutError(errno.ETIMEDOUT, str(e), url)
    if isinstance(e, errors.Unavailable):
        return ConnectionError(errno.ECONNREFUSED, f"the s3dma host-shim or its agent is unavailable: {e}", url)
    if isinstance(e, errors.Unsupported):
        return OSError(errno.EOPNOTSUPP, str(e), url)
    return OSError(errno.EIO, str(e), url)


@contextmanager
def _mapped(path: str) -> Iterator[None]:
    try:
        yield
    except S3dmaError as e:
        raise _translate(e, path) from e


def _split(path: str) -> Tuple[str, str]:
    bucket, _, key = path.partition("/")
    if not bucket:
        raise ValueError(f"{_url(path)!r} names no bucket: s3dma paths are s3dma://BUCKET/KEY")
    return bucket, key


def _mtime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc)


# -- clients and buffers --------------------------------------------------------


class _BufferPool:
    """Registered buffers of one client, reused across calls (registering one
    is a memfd, an fd passed over the lease and an RPC). Sizes are powers of
    two up to ``_POOL_MAX_BUFFER``; larger ones are not kept."""

    def __init__(self, client: Client):
        self.client = client
        self.pid = os.getpid()
        self._free: List[Buffer] = []
        self._lock = threading.Lock()

    def acquire(self, nbytes: int, label: str = "fsspec") -> Buffer:
        nbytes = max(int(nbytes), 1)
        if nbytes <= _POOL_MAX_BUFFER:
            size = max(_MIN_BUFFER, 1 << (nbytes - 1).bit_length())
            with self._lock:
                fitting = [b for b in self._free if b.size >= size]
                if fitting:
                    buf = min(fitting, key=lambda b: b.size)
                    self._free.remove(buf)
                    return buf
        else:
            size = -(-nbytes // MIB) * MIB
        return self.client.alloc(size, label=label)

    def release(self, buf: Optional[Buffer]) -> None:
        if buf is None or buf.released:
            return
        if os.getpid() != self.pid or self.client.closed:
            return  # the parent's (or a closed lease's) memory: nothing to tell the shim
        if buf.size <= _POOL_MAX_BUFFER:
            with self._lock:
                if len(self._free) < _POOL_IDLE:
                    self._free.append(buf)
                    return
        try:
            buf.release()
        except S3dmaError:
            pass  # the lease is gone: the shim released it already


class _ProcessClients:
    """This process's Client (and pool) per socket."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.by_socket: Dict[str, Tuple[Client, _BufferPool]] = {}

    def get(self, socket: str) -> Tuple[Client, _BufferPool]:
        with self.lock:
            if self.pid != os.getpid():  # fork without the at-fork hook
                self._forget()
            entry = self.by_socket.get(socket)
            if entry is None or entry[0].closed:
                client = Client(socket)
                entry = self.by_socket[socket] = (client, _BufferPool(client))
            return entry

    def _forget(self) -> None:
        # Kept referenced, never closed: collecting the parent's Client in
        # the child could close connections the parent still uses.
        _inherited.extend(self.by_socket.values())
        self.by_socket = {}
        self.pid = os.getpid()


_inherited: list = []
_clients = _ProcessClients()


def _after_fork_in_child() -> None:
    _clients.lock = threading.Lock()  # another thread may have held it at fork
    _clients._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# -- the filesystem -------------------------------------------------------------


class S3dmaFileSystem(AbstractFileSystem):
    """``s3dma://bucket/key`` objects through the local host-shim.

    ``socket``: the shim's socket (default :func:`s3dma.default_socket`,
    found as the CLI finds it when the first call needs a client).
    ``client``: an :class:`s3dma.Client` to use in the process that
    created it (other processes connect to its socket).
    ``block_size``: read-ahead of files opened for reading."""

    protocol = PROTOCOL
    root_marker = ""
    blocksize = 8 * MIB

    def __init__(
        self, socket: Optional[str] = None, client: Optional[Client] = None, block_size: Optional[int] = None, **kwargs
    ):
        if client is not None and not isinstance(client, Client):
            raise TypeError(f"client must be an s3dma.Client, not {type(client).__name__}")
        super().__init__(**kwargs)
        self._socket = socket
        self._given = client
        self._given_pid = os.getpid()
        self._given_pool: Optional[_BufferPool] = None
        if block_size:
            self.blocksize = int(block_size)
        self._buckets: set = set()

    # -- plumbing -------------------------------------------------------------

    @property
    def socket(self) -> str:
        if self._socket:
            return os.path.abspath(self._socket)
        if self._given is not None:
            return self._given.socket
        return os.path.abspath(default_socket())

    def _client_and_pool(self) -> Tuple[Client, _BufferPool]:
        given = self._given
        if given is not None and self._given_pid == os.getpid() and not given.closed:
            if self._given_pool is None or self._given_pool.client is not given:
                self._given_pool = _BufferPool(given)
            return given, self._given_pool
        with _mapped(""):
            return _clients.get(self.socket)

    @property
    def client(self) -> Client:
        """This process's :class:`s3dma.Client`."""
        return self._client_and_pool()[0]

    @property
    def fsid(self) -> str:
        return f"{PROTOCOL}:{self.socket}"

    def __reduce__(self):
        # A Client does not pickle (nor survive the trip): send its socket.
        opts = dict(self.storage_options)
        given = opts.pop("client", None)
        if given is not None and not opts.get("socket"):
            opts["socket"] = given.socket
        return make_instance, (type(self), self.storage_args, opts)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        for prefix in (PROTOCOL + "://", PROTOCOL + "::"):
            if path.startswith(prefix):
                path = path[len(prefix) :]
                break
        return path.lstrip("/").rstrip("/")

    def split_path(self, path: str) -> Tuple[str, str]:
        """``(bucket, key)`` of a path or URL."""
        return _split(self._strip_protocol(path))

    # -- metadata -------------------------------------------------------------

    def _file_entry(self, bucket: str, key: str, size: int, etag: str, mtime_ms: int) -> Dict[str, Any]:
        return {
            "name": f"{bucket}/{key}",
            "size": size,
            "type": "file",
            "ETag": etag,
            "LastModified": _mtime(mtime_ms),
        }

    @staticmethod
    def _dir_entry(name: str) -> Dict[str, Any]:
        return {"name": name, "size": 0, "type": "directory"}

    def _head(self, bucket: str, key: str) -> Optional[Dict[str, Any]]:
        """The file entry, or None when there is no such key (a missing
        bucket raises)."""
        client = self.client
        try:
            o = client.head(bucket, key)
        except errors.NotFound as e:
            if e.code == "NoSuchBucket":
                raise _translate(e, f"{bucket}/{key}") from e
            return None
        except S3dmaError as e:
            raise _translate(e, f"{bucket}/{key}") from e
        entry = self._file_entry(bucket, key, o.size, o.etag, o.last_modified_ms)
        entry["ContentType"] = o.content_type
        entry["Metadata"] = o.metadata
        return entry

    def _has_children(self, bucket: str, key: str) -> bool:
        with _mapped(f"{bucket}/{key}"):
            page = self.client.list(bucket, prefix=key + "/" if key else "", max_keys=1)
        return bool(page.objects or page.common_prefixes)

    def _check_bucket(self, bucket: str) -> None:
        if bucket in self._buckets:
            return
        with _mapped(bucket):
            self.client.list(bucket, max_keys=1)
        self._buckets.add(bucket)

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        if not path:
            raise OSError(
                errno.EOPNOTSUPP,
                "listing buckets is not part of the s3dma tenant API; name one: s3dma://BUCKET/",
                _url(path),
            )
        bucket, key = _split(path)
        prefix = key + "/" if key else ""
        out: List[Dict[str, Any]] = []
        marker = False  # a "dir/" placeholder object written by another tool
        client = self.client
        token = ""
        with _mapped(path):
            while True:
                page = client.list(bucket, prefix=prefix, delimiter="/", continuation_token=token)
                for o in page.objects:
                    if o.key == prefix:
                        marker = True
                        continue
                    out.append(self._file_entry(bucket, o.key, o.size, o.etag, o.last_modified_ms))
                for p in page.common_prefixes:
                    out.append(self._dir_entry(f"{bucket}/{p.rstrip('/')}"))
                if not page.is_truncated or not page.next_continuation_token:
                    break
                token = page.next_continuation_token
        if key and not out and not marker:
            f = self._head(bucket, key)  # ls of a file lists the file
            if f is None:
                raise FileNotFoundError(errno.ENOENT, "no such object or prefix", _url(path))
            out = [f]
        if bucket:
            self._buckets.add(bucket)
        out.sort(key=lambda e: e["name"])
        return out if detail else [e["name"] for e in out]

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        if not path:
            return self._dir_entry("")
        bucket, key = _split(path)
        if not key:
            self._check_bucket(bucket)
            return self._dir_entry(bucket)
        f = self._head(bucket, key)
        if f is not None:
            return f
        if self._has_children(bucket, key):
            return self._dir_entry(path)
        raise FileNotFoundError(errno.ENOENT, "no such object or prefix", _url(path))

    def exists(self, path, **kwargs):
        # Only "not found" is False: a denied or unreachable shim raises.
        try:
            self.info(path)
            return True
        except FileNotFoundError:
            return False

    def isdir(self, path):
        path = self._strip_protocol(path)
        if not path:
            return True
        bucket, key = _split(path)
        try:
            if not key:
                self._check_bucket(bucket)
                return True
            return self._has_children(bucket, key)
        except FileNotFoundError:
            return False

    def isfile(self, path):
        path = self._strip_protocol(path)
        bucket, key = _split(path)
        if not key:
            return False
        try:
            return self._head(bucket, key) is not None
        except FileNotFoundError:
            return False

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
        """Every file under ``path`` from one flat listing (no walk)."""
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        path = self._strip_protocol(path)
        bucket, key = _split(path)
        prefix = key + "/" if key else ""
        out: Dict[str, Dict[str, Any]] = {}
        with _mapped(path):
            for o in self.client.list_all(bucket, prefix=prefix):
                rel = o.key[len(prefix) :]
                parts = rel.split("/")
                # Directories between path and the object (a trailing "/" is a placeholder).
                if withdirs:
                    for depth in range(1, len(parts)):
                        if maxdepth is None or depth <= maxdepth:
                            name = f"{bucket}/{prefix}{'/'.join(parts[:depth])}"
                            out.setdefault(name, self._dir_entry(name))
                if not parts[-1] or (maxdepth is not None and len(parts) > maxdepth):
                    continue
                out[f"{bucket}/{o.key}"] = self._file_entry(bucket, o.key, o.size, o.etag, o.last_modified_ms)
        if withdirs and (out or not key):
            out[path] = self._dir_entry(path)  # as fsspec's find: the root, when a directory
        if not out and key:
            f = self._head(bucket, key)
            if f is not None:
                out[path] = f
        names = sorted(out)
        return {n: out[n] for n in names} if detail else names

    def checksum(self, path):
        return int(hashlib.sha256(self.ukey(path).encode()).hexdigest()[:32], 16)

    def ukey(self, path):
        """The object's ETag (changes with every write)."""
        info = self.info(path)
        if info["type"] != "file":
            raise IsADirectoryError(errno.EISDIR, "a prefix has no ETag", _url(self._strip_protocol(path)))
        return info["ETag"]

    def modified(self, path):
        info = self.info(path)
        if info["type"] != "file":
            raise IsADirectoryError(errno.EISDIR, "a prefix has no timestamp", _url(self._strip_protocol(path)))
        return info["LastModified"]

    def created(self, path):
        """S3 keeps no creation time: the last write's (as s3fs)."""
        return self.modified(path)

    # -- directories (S3 semantics) ----------------------------------------------

    def mkdir(self, path, create_parents=True, **kwargs):
        """Nothing to create (prefixes exist through their objects); the
        bucket must exist."""
        path = self._strip_protocol(path)
        self._check_bucket(_split(path)[0])

    def makedirs(self, path, exist_ok=False):
        self.mkdir(path)

    def _object_path(self, path) -> Tuple[str, str, str]:
        """``(path, bucket, key)`` of a path below a bucket (protocol
        stripped); a bare bucket raises :class:`PermissionError` (buckets
        are not made or removed through the file system)."""
        path = self._strip_protocol(path)
        bucket, key = _split(path)
        if not key:
            raise PermissionError(errno.EPERM, "buckets are managed by the host's s3dma operator", _url(path))
        return path, bucket, key

    def rmdir(self, path):
        path, bucket, key = self._object_path(path)
        if self._has_children(bucket, key):
            raise OSError(errno.ENOTEMPTY, "directory not empty", _url(path))

    # -- reading ----------------------------------------------------------------

    def _get_into(self, client: Client, path: str, buf: Buffer, first: int, n: int, etag: str = "") -> int:
        """Bytes ``first..first+n`` of the object into ``buf[0:n]``."""
        bucket, key = _split(path)
        with _mapped(path):
            r = client.get_object_into(bucket, key, buf, 0, n, range=(first, first + n - 1), if_match=etag)
        return r.bytes_placed

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        bucket, key = _split(path)
        client, pool = self._client_and_pool()
        start = 0 if start is None else start
        if start >= 0 and end is not None and end >= 0:
            # A plain range: no HEAD; a start past the end reads nothing, like a slice.
            if end <= start:
                return b""
            return self._read_range(client, pool, path, start, end)
        if start == 0 and end is None:
            data = self._read_small_whole(client, pool, path)
            if data is not None:
                return data
        for _ in range(3):
            f = self._head(bucket, key)
            if f is None:
                raise FileNotFoundError(errno.ENOENT, "no such object", _url(path))
            size = f["size"]
            s = max(0, size + start) if start < 0 else min(start, size)
            e = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
            if e <= s:
                return b""
            try:
                return self._read_range(client, pool, path, s, e, f["ETag"])
            except ObjectChangedError:
                continue  # overwritten between HEAD and GET: sizes again
        raise ObjectChangedError(errno.ESTALE, "the object keeps changing; retry later", _url(path))

    def _read_small_whole(self, client: Client, pool: _BufferPool, path: str) -> Optional[bytes]:
        """The whole object in one GET when it fits a pooled buffer, else None."""
        bucket, key = _split(path)
        buf = pool.acquire(_MIN_BUFFER)
        try:
            try:
                r = client.get_object_into(bucket, key, buf)
            except errors.OutOfBounds:
                return None
            except S3dmaError as e:
                raise _translate(e, path) from e
            return buf.mmap[: r.bytes_placed]
        finally:
            pool.release(buf)

    def _read_range(self, client: Client, pool: _BufferPool, path: str, start: int, end: int, etag: str = "") -> bytes:
        n = end - start
        buf = pool.acquire(min(n, _READ_BUFFER_MAX))
        try:
            if n <= buf.size:
                try:
                    got = self._get_into(client, path, buf, start, n, etag)
                except ValueError as e:
                    if isinstance(e.__cause__, errors.InvalidRange):
                        return b""  # starts past the end
                    raise
                return buf.mmap[:got]

            def fetch(pos: int, step: int) -> int:
                try:
                    return self._get_into(client, path, buf, pos, step, etag)
                except ValueError as e:
                    if isinstance(e.__cause__, errors.InvalidRange):
                        return 0  # past the end: stop there
                    raise

            return _read_span(fetch, buf, start, end)
        finally:
            pool.release(buf)

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kwargs):
        """Many ranges (of one or more objects) in batched ``get_objects``
        calls. ``max_gap`` is accepted and ignored: ranges are read exactly."""
        if not isinstance(paths, list):
            raise TypeError("paths must be a list")
        n = len(paths)
        starts = starts if isinstance(starts, list) else [starts] * n
        ends = ends if isinstance(ends, list) else [ends] * n
        if len(starts) != n or len(ends) != n:
            raise ValueError("paths, starts and ends must have the same length")
        paths = [self._strip_protocol(p) for p in paths]
        client, pool = self._client_and_pool()
        out: List[Any] = [None] * n
        # Objects whose size the bounds need (open or negative), one HEAD each.
        sizes: Dict[str, Any] = {}
        for p, s, e in zip(paths, starts, ends):
            # (a long bounded range too: its destination is sized to the object)
            if (s is not None and s < 0) or e is None or e < 0 or e - (s or 0) > _READ_BUFFER_MAX:
                if p not in sizes:
                    try:
                        f = self._head(*_split(p))
                        sizes[p] = f["size"] if f else FileNotFoundError(errno.ENOENT, "no such object", _url(p))
                    except Exception as exc:  # reported per range below
                        sizes[p] = exc
        todo: List[Tuple[int, str, int, int]] = []
        for i, (p, s, e) in enumerate(zip(paths, starts, ends)):
            s = 0 if s is None else s
            size = sizes.get(p)
            if isinstance(size, Exception):
                out[i] = size
                continue
            if s < 0:
                s = max(0, size + s)
            if e is None:
                e = size
            elif e < 0:
                e = max(0, size + e)
            if size is not None:
                s, e = min(s, size), min(e, size)
            if e <= s:
                out[i] = b""
            else:
                todo.append((i, p, s, e))
        batch: List[Tuple[int, str, int, int]] = []
        total = 0
        for item in todo + [None]:  # type: ignore[list-item]
            if item is not None and (not batch or total + item[3] - item[2] <= _BATCH_BYTES):
                batch.append(item)
                total += item[3] - item[2]
                continue
            if batch:
                self._run_batch(client, pool, batch, total, out)
            if item is not None:
                batch, total = [item], item[3] - item[2]
        if on_error != "return":
            for r in out:
                if isinstance(r, Exception):
                    raise r
        return out

    def _run_batch(self, client, pool, batch, total, out) -> None:
        buf = pool.acquire(total)
        try:
            items, offsets, off = [], [], 0
            for _, p, s, e in batch:
                b, k = _split(p)
                items.append(GetItem(b, k, buf, off, e - s, (s, e - 1)))
                offsets.append(off)
                off += e - s
            with _mapped(batch[0][1]):
                results = client.get_objects(items)
            for (i, p, _, _), o, r in zip(batch, offsets, results):
                if isinstance(r, errors.InvalidRange):
                    out[i] = b""
                elif isinstance(r, S3dmaError):
                    exc = _translate(r, p)
                    exc.__cause__ = r
                    out[i] = exc
                else:
                    out[i] = buf.mmap[o : o + r.bytes_placed]
        finally:
            pool.release(buf)

    def cat(self, path, recursive=False, on_error="raise", **kwargs):
        """Contents of one path, or ``{path: bytes}`` of many in batches."""
        paths = self.expand_path(path, recursive=recursive)
        if len(paths) == 1 and not isinstance(path, list) and paths[0] == self._strip_protocol(path):
            return self.cat_file(paths[0], **kwargs)
        parents = {q.rsplit("/", 1)[0] for q in paths if "/" in q}
        files = [p for p in paths if p not in parents]  # directories of a recursive expansion
        got = self.cat_ranges(files, None, None, on_error="return")
        out = {}
        for p, r in zip(files, got):
            if isinstance(r, Exception):
                if on_error == "raise":
                    raise r
                if on_error == "omit":
                    continue
            out[p] = r
        return out

    # -- writing ----------------------------------------------------------------

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        path = self._strip_protocol(path)
        bucket, key = _split(path)
        if mode == "create" and self.exists(path):
            raise FileExistsError(errno.EEXIST, "the object exists (mode='create')", _url(path))
        data = memoryview(value).cast("B")
        client, pool = self._client_and_pool()
        buf = pool.acquire(max(data.nbytes, 1))
        try:
            buf.mmap[: data.nbytes] = data
            with _mapped(path):
                client.put_object_from(
                    bucket,
                    key,
                    buf,
                    0,
                    data.nbytes,
                    content_type=kwargs.get("content_type") or _guess_type(key),
                    metadata=kwargs.get("metadata"),
                )
        finally:
            data.release()
            pool.release(buf)

    def open(self, path, mode="rb", block_size=None, cache_options=None, compression=None, **kwargs):
        if "b" in mode or "r" in mode or compression is not None:
            return super().open(path, mode, block_size, cache_options, compression, **kwargs)
        # Text writes: a wrapper whose with-block discards on an exception, as
        # the binary file does (io.TextIOWrapper would close, i.e. commit).
        text = {k: kwargs.pop(k) for k in ("encoding", "errors", "newline") if k in kwargs}
        raw = super().open(path, mode.replace("t", "") + "b", block_size, cache_options, **kwargs)
        return _TextWriter(raw, **text)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if mode not in ("rb", "wb", "xb"):
            raise NotImplementedError(
                f"mode {mode!r}: s3dma files are read ('rb') or written whole ('wb', 'xb'); "
                "S3 objects cannot be appended to"
            )
        return S3dmaFile(
            self,
            self._strip_protocol(path),
            mode,
            block_size=block_size or self.blocksize,
            autocommit=autocommit,
            cache_options=cache_options,
            **kwargs,
        )

    def touch(self, path, truncate=True, **kwargs):
        if not truncate and self.exists(path):
            raise NotImplementedError("S3 cannot update an object's timestamp without rewriting it")
        self.pipe_file(path, b"", **kwargs)

    # -- copying and transfers ------------------------------------------------------

    def cp_file(self, path1, path2, **kwargs):
        """GET into a registered buffer, PUT from it (the tenant API has no
        server-side copy). Content type and metadata go along."""
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        b1, k1 = _split(path1)
        b2, k2 = _split(path2)
        client, pool = self._client_and_pool()
        f = self._head(b1, k1)
        if f is None:
            raise FileNotFoundError(errno.ENOENT, "no such object to copy", _url(path1))
        buf = pool.acquire(max(f["size"], 1))
        try:
            with _mapped(path1):
                r = client.get_object_into(b1, k1, buf, 0, f["size"], if_match=f["ETag"])
            with _mapped(path2):
                client.put_object_from(
                    b2, k2, buf, 0, r.bytes_placed, content_type=r.content_type, metadata=r.metadata
                )
        finally:
            pool.release(buf)

    def get_file(self, rpath, lpath, callback=DEFAULT_CALLBACK, outfile=None, **kwargs):
        """Ranged GETs (ETag pinned) into a registered buffer, written to
        ``lpath``; a failed download leaves no local file."""
        rpath = self._strip_protocol(rpath)
        bucket, key = _split(rpath)
        if outfile is None and isfilelike(lpath):
            outfile = lpath
        f = self._head(bucket, key) if key else None
        if f is None:
            if self.isdir(rpath):
                if outfile is None:
                    os.makedirs(lpath, exist_ok=True)
                return None
            raise FileNotFoundError(errno.ENOENT, "no such object", _url(rpath))
        size, etag = f["size"], f["ETag"]
        client, pool = self._client_and_pool()
        created = outfile is None
        if created:
            parent = os.path.dirname(os.fspath(lpath))
            if parent:
                os.makedirs(parent, exist_ok=True)
            outfile = open(lpath, "wb")
        buf = pool.acquire(min(max(size, 1), _CHUNK))
        try:
            callback.set_size(size)
            pos = 0
            while pos < size:
                n = min(buf.size, size - pos)
                got = self._get_into(client, rpath, buf, pos, n, etag)
                with memoryview(buf.mmap) as m, m[:got] as part:
                    outfile.write(part)
                pos += got
                callback.relative_update(got)
                if got < n:
                    raise ObjectChangedError(errno.ESTALE, "the object shrank during the download", _url(rpath))
        except BaseException:
            if created:
                outfile.close()
                try:
                    os.remove(lpath)
                except OSError:
                    pass
            raise
        else:
            if created:
                outfile.close()
        finally:
            pool.release(buf)

    def put_file(self, lpath, rpath, callback=DEFAULT_CALLBACK, mode="overwrite", **kwargs):
        """The local file read straight into a registered buffer, PUT from it."""
        rpath = self._strip_protocol(rpath)
        if mode == "create" and self.exists(rpath):
            raise FileExistsError(errno.EEXIST, "the object exists (mode='create')", _url(rpath))
        if os.path.isdir(lpath):
            self.makedirs(rpath, exist_ok=True)
            return None
        bucket, key = _split(rpath)
        if not key:
            raise IsADirectoryError(errno.EISDIR, "name a key to put a file into", _url(rpath))
        client, pool = self._client_and_pool()
        with open(lpath, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            callback.set_size(size)
            buf = pool.acquire(max(size, 1))
            try:
                pos = 0
                with memoryview(buf.mmap) as m:
                    while pos < size:
                        with m[pos : min(size, pos + _CHUNK)] as part:
                            got = src.readinto(part)
                        if not got:
                            raise OSError(errno.EIO, f"{lpath} shrank while it was read", lpath)
                        pos += got
                        callback.relative_update(got)
                with _mapped(rpath):
                    client.put_object_from(
                        bucket,
                        key,
                        buf,
                        0,
                        size,
                        content_type=kwargs.get("content_type") or _guess_type(key),
                        metadata=kwargs.get("metadata"),
                    )
            finally:
                pool.release(buf)

    # -- deleting ----------------------------------------------------------------

    def rm_file(self, path):
        path, bucket, key = self._object_path(path)
        with _mapped(path):
            self.client.delete(bucket, key)

    def _rm(self, path):
        self.rm_file(path)

    def rm(self, path, recursive=False, maxdepth=None):
        """Deletes objects (with ``recursive``, everything under a prefix;
        buckets stay)."""
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        keys = [p for p in paths if _split(p)[1]]
        if len(keys) <= 2:
            for p in keys:
                self.rm_file(p)
            return
        with ThreadPoolExecutor(min(_DELETE_THREADS, len(keys))) as ex:
            for _ in ex.map(self.rm_file, keys):
                pass


def _read_span(fetch: Callable[[int, int], int], buf: Buffer, start: int, end: int) -> bytes:
    """Bytes ``start..end`` read through ``buf``, ``buf.size`` at a time:
    ``fetch(pos, n)`` GETs ``n`` bytes from ``pos`` into the buffer's start
    and returns how many came; a short read (the object's end) stops."""
    out = bytearray()
    pos = start
    while pos < end:
        step = min(buf.size, end - pos)
        got = fetch(pos, step)
        with memoryview(buf.mmap) as m, m[:got] as part:
            out += part
        pos += got
        if got < step:
            break
    return bytes(out)


def _guess_type(key: str) -> str:
    return mimetypes.guess_type(key)[0] or ""


# -- files --------------------------------------------------------------------


class S3dmaFile(AbstractBufferedFile):
    """A file of :class:`S3dmaFileSystem`.

    Reading: ranged GETs of ``block_size`` (read-ahead) into a registered
    buffer, each with ``if_match`` on the ETag seen at open.

    Writing (``wb``, ``xb``): bytes accumulate in a registered buffer
    (doubling as needed; ``size=`` preallocates) and are PUT at ``close``.
    ``content_type=`` and ``metadata=`` are the object's. ``xb`` refuses an
    existing object at open and again at close (not atomic: the tenant API
    has no conditional PUT)."""

    def __init__(self, fs: S3dmaFileSystem, path: str, mode: str = "rb", block_size=None, autocommit=True,
                 cache_type="readahead", cache_options=None, size=None, content_type=None, metadata=None, **kwargs):
        self._pid = os.getpid()
        self._buf: Optional[Buffer] = None
        self._pool: Optional[_BufferPool] = None
        self._wlen = 0
        self.content_type = content_type
        self.metadata = metadata
        self.bucket, self.key = _split(path)
        if not self.key:
            raise IsADirectoryError(errno.EISDIR, "a bucket is not a file", _url(path))
        if mode == "rb":
            f = fs._head(self.bucket, self.key)
            if f is None:
                if fs._has_children(self.bucket, self.key):
                    raise IsADirectoryError(errno.EISDIR, "a prefix is not a file", _url(path))
                raise FileNotFoundError(errno.ENOENT, "no such object", _url(path))
            self._details = f
            self.etag = f["ETag"]
            size = f["size"]
        elif mode == "xb" and fs.exists(path):
            raise FileExistsError(errno.EEXIST, "the object exists (mode 'xb')", _url(path))
        super().__init__(fs, path, mode, block_size=block_size, autocommit=autocommit, cache_type=cache_type,
                         cache_options=cache_options, size=size if mode == "rb" else None, **kwargs)
        if mode != "rb":
            self.buffer = None  # the registered buffer replaces fsspec's BytesIO
            self.forced = False
            if size:
                self._reserve(int(size))

    # -- buffers --

    def _client_pool(self) -> Tuple[Client, _BufferPool]:
        client, pool = self.fs._client_and_pool()
        if self._pool is not pool:
            if self._pool is not None:
                self._buf = None  # a forked child: that buffer is the parent's
            self._pool = pool
        return client, pool

    def _drop_buffer(self) -> None:
        buf, self._buf = self._buf, None
        if buf is not None and self._pool is not None:
            self._pool.release(buf)

    # -- reading --

    def _fetch_range(self, start, end):
        end = min(end, self.size)
        if start >= end:
            return b""
        client, pool = self._client_pool()
        n = end - start
        want = min(n, _READ_BUFFER_MAX)
        if self._buf is None or self._buf.size < want:
            self._drop_buffer()
            self._buf = pool.acquire(want)
        buf = self._buf
        if n <= buf.size:
            got = self.fs._get_into(client, self.path, buf, start, n, self.etag)
            return buf.mmap[:got]
        return _read_span(
            lambda pos, step: self.fs._get_into(client, self.path, buf, pos, step, self.etag), buf, start, end
        )

    # -- writing --

    def _reserve(self, need: int) -> Buffer:
        if self._pid != os.getpid():
            raise OSError(errno.EBADF, f"opened for writing in process {self._pid}; open it again in this one",
                          _url(self.path))
        client, pool = self._client_pool()
        old = self._buf
        if old is not None and need <= old.size:
            return old
        size = max(need, _WRITE_INITIAL, 2 * old.size if old is not None else 0)
        new = pool.acquire(size)
        if old is not None:
            if self._wlen:
                with memoryview(new.mmap) as dst, memoryview(old.mmap) as src:
                    dst[: self._wlen] = src[: self._wlen]
            pool.release(old)
        self._buf = new
        return new

    def write(self, data):
        if not self.writable():
            raise ValueError("File not in write mode")
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        if self.forced:
            raise ValueError("This file has been committed (flush(force=True)); it can only be closed")
        with memoryview(data) as raw, raw.cast("B") as mv:
            n = mv.nbytes
            if n:
                buf = self._reserve(self._wlen + n)
                buf.mmap[self._wlen : self._wlen + n] = mv
        self._wlen += n
        self.loc += n
        return n

    def flush(self, force=False):
        """Nothing is sent before close (the object appears whole, or not at
        all); ``force=True`` commits now."""
        if self.closed:
            raise ValueError("Flush on closed file")
        if self.readable() or not force:
            return
        if self.forced:
            raise ValueError("Force flush cannot be called more than once")
        self.forced = True
        if self.autocommit:
            self.commit()

    def commit(self):
        """PUTs the bytes written (with ``autocommit=False``, called by the
        transaction)."""
        if self.mode == "rb":
            return
        try:
            if self.mode == "xb" and self.fs.exists(self.path):
                raise FileExistsError(errno.EEXIST, "the object appeared meanwhile (mode 'xb')", _url(self.path))
            buf = self._reserve(max(self._wlen, 1))
            client, _ = self._client_pool()
            with _mapped(self.path):
                client.put_object_from(
                    self.bucket,
                    self.key,
                    buf,
                    0,
                    self._wlen,
                    content_type=self.content_type or _guess_type(self.key),
                    metadata=self.metadata,
                )
        finally:
            self._drop_buffer()

    def discard(self):
        """Drops what was written: no object is created or changed."""
        self._drop_buffer()
        self._wlen = 0

    # -- closing --

    def close(self):
        if getattr(self, "_unclosable", False) or self.closed:
            return
        try:
            if self.mode == "rb":
                self.cache = None
                self._drop_buffer()
            elif not self.forced and self.autocommit:
                self.forced = True
                self.commit()
        finally:
            self.closed = True
            if self.mode != "rb" and self.autocommit:
                self._drop_buffer()

    def abort(self) -> None:
        """Closes a file open for writing without creating the object."""
        if not self.closed and self.mode != "rb":
            self.discard()
            self.closed = True

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self.mode != "rb" and not self.closed:
            self.abort()  # an exception inside the with block: no half-written object
        else:
            self.close()

    def __del__(self):
        if getattr(self, "_closed", True):
            return
        if self.mode != "rb":
            # Never closed: unknown whether it was complete, so it is not written.
            try:
                warnings.warn(f"{self} was never closed; its writes were discarded", ResourceWarning, stacklevel=2)
            except Exception:  # interpreter shutdown
                pass
            self.abort()
        else:
            self.close()


class _TextWriter(io.TextIOWrapper):
    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and isinstance(self.buffer, S3dmaFile):
            self.buffer.abort()  # closed: the wrapper's close neither flushes nor commits
        return super().__exit__(exc_type, exc, tb)


def _register() -> None:
    try:
        import fsspec

        fsspec.register_implementation(PROTOCOL, S3dmaFileSystem, clobber=True)
    except Exception:  # an fsspec without the registry API: the entry point still works
        pass


_register()
