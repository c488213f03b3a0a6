"""Recursive transfers between a key prefix and a local directory, through
registered buffers: the Python twins of ``s3dma get/put --recursive`` and
``s3dma sync``.

    import s3dma
    s = s3dma.download_prefix("s3://data/train/", "/scratch/train", sync=True)
    print(s)              # 12 files, 2.1 GiB in 3.4 s (0.62 GB/s); 0 failed, ...
    s3dma.upload_dir("/scratch/out", "s3://data/run-7/", sync=True, delete=True,
                     exclude=["*.tmp"])

Both follow the contract the CLI implements (``recursive-spec.md``):

* Names: a key's *relative name* is the key without the prefix (a prefix
  not ending in ``/`` gets one); the local path is the directory joined
  with it. Directory markers (a relative name empty or ending in ``/``) are
  skipped. Keys with an empty, ``.`` or ``..`` component, a leading ``/``,
  a NUL or a component over 255 bytes are refused per file ("unsafe key"):
  nothing is ever written outside the directory, and nothing is written
  through a symlink inside it ("refusing to write through a symlink").
  Uploads walk the directory (sorted), regular files only; symlinks are not
  followed (they count as skipped).
* Filters: ``exclude=[...]`` then ``include=[...]`` (or an ordered
  ``filters=[("exclude", "*"), ("include", "*.txt")]``), matched against the
  relative name with :func:`fnmatch.fnmatchcase` (``*`` crosses ``/``);
  every file is selected at first and the last matching filter decides.
  Excluded files are neither copied nor deleted.
* Downloads go to ``.<name>.s3dma-<16 hex>.tmp`` next to the destination,
  renamed over it when complete (removed on failure or Ctrl-C), with the
  object's LastModified as mtime; every GET of an object carries
  ``If-Match`` with the listed ETag. Objects larger than ``chunk_size`` are
  fetched as concurrent chunk-sized ranged GETs.
* Uploads are one PutObject per file from a registered buffer (the agent
  turns large ones into a multipart upload); a file that changes size while
  being read fails.
* ``sync=True`` copies a file when the destination is missing, the sizes
  differ or the source is newer (whole seconds); ``delete=True`` then
  removes destination files under the prefix that have no source
  counterpart (not when any copy failed).

One :class:`s3dma.Client` (yours, or one opened on ``socket``) serves the
whole run; ``concurrency`` requests are in flight on as many threads; the
buffers (a pool of at most ``concurrency`` slots of up to ``chunk_size``
bytes, plus one buffer per file larger than ``chunk_size`` on upload, since
PutObject takes the whole file from one buffer) stay within
``max_memory``, except that a file larger than ``max_memory`` is uploaded
alone with a buffer of its size. They are registered once per run and
released at its end.

The result is a :class:`TransferSummary`; when any file failed (the others
are still copied), :class:`s3dma.TransferError` is raised with the summary
as ``.summary``. ``KeyboardInterrupt`` stops the run: requests in flight
finish, files completed so far stay, partial ones are removed, and the
exception propagates.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import queue
import re
import secrets
import stat
import threading
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

from . import errors
from .client import Buffer, Client, ListedObject
from .errors import S3dmaError, TransferError

MIB = 1 << 20
GIB = 1 << 30
DEFAULT_CONCURRENCY = 8
DEFAULT_CHUNK_SIZE = 64 * MIB
DEFAULT_MAX_MEMORY = 1 * GIB

ProgressCallback = Callable[[int, int], None]
"""``progress(bytes_done, bytes_total)``, called from the calling thread."""

PathLike = Union[str, "os.PathLike[str]"]

# Our temporary files: never uploaded, never deleted by delete=True, never counted.
TEMP_RE = re.compile(r"^\..+\.s3dma-[0-9a-f]{16}\.tmp$", re.DOTALL)
_TEMP_SUFFIX_LEN = len(".s3dma-") + 16 + len(".tmp")
_NAME_MAX = 255
_READ_STEP = 8 * MIB
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# -- results ----------------------------------------------------------------


@dataclass
class TransferSummary:
    """What a :func:`download_prefix` or :func:`upload_dir` did.

    ``failures``: ``(name, exception)`` in the order they happened; the name
    is the relative name (``/``-separated), or the URL for a failure of the
    whole run (e.g. listing the prefix). Exceptions are
    :class:`s3dma.S3dmaError` (the shim's, or codes ``UnsafeKey``,
    ``SymlinkInPath``, ``InvalidFileName``, ``FileChanged``) or
    :class:`OSError` (local I/O)."""

    files: int = 0  # files copied
    bytes: int = 0  # their bytes
    seconds: float = 0.0
    skipped: int = 0  # directory markers; symlinks and special files on upload
    up_to_date: int = 0  # sync: not copied, the destination is current
    deleted: int = 0  # sync with delete=True
    failures: List[Tuple[str, BaseException]] = field(default_factory=list)

    def __str__(self) -> str:
        rate = self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0
        s = (
            f"{self.files} files, {_human_bytes(self.bytes)} in {self.seconds:.1f} s ({rate:.2f} GB/s); "
            f"{len(self.failures)} failed, {self.skipped} skipped"
        )
        if self.up_to_date or self.deleted:
            s += f", {self.up_to_date} up to date, {self.deleted} deleted"
        return s


def _human_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    v = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        v /= 1024
        if v < 1024:
            break
    return f"{v:.1f} {unit}"


# -- names ------------------------------------------------------------------


def parse_url(url: str) -> Tuple[str, str]:
    """``s3://bucket[/prefix]`` as (bucket, prefix); a non-empty prefix ends
    in ``/`` (one is appended, as ``aws s3 cp --recursive`` does).
    Raises ValueError for anything else."""
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise ValueError(f"invalid URL {url!r}: must start with s3:// (s3://bucket/prefix)")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"invalid URL {url!r}: the bucket is empty (s3://bucket/prefix)")
    if not all(c.isascii() and (c.isalnum() or c in ".-_") for c in bucket):
        raise ValueError(f"invalid URL {url!r}: a bucket name has only letters, digits, '.', '-' and '_'")
    if any(unicodedata.category(c) == "Cc" for c in prefix):
        raise ValueError(f"invalid URL {url!r}: the key contains control characters")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return bucket, prefix


_BIDI = {"\u200e", "\u200f"} | {chr(c) for c in range(0x202A, 0x202F)} | {chr(c) for c in range(0x2066, 0x206A)}


def _escape_char(c: str) -> str:
    if c == "\\" or unicodedata.category(c) == "Cc" or c in _BIDI:
        return {"\t": "\\t", "\r": "\\r", "\n": "\\n", "\\": "\\\\"}.get(c, f"\\u{{{ord(c):x}}}")
    return c


def escape(s: str) -> str:
    """``s`` for a message, as the services' ``Escaped`` shows names:
    backslashes, control characters and bidi controls escaped like Rust's
    ``char::escape_default`` (``\\n``, ``\\u{1b}``), the rest as is."""
    return "".join(_escape_char(c) for c in s)


def _escape_path(path: str) -> str:
    """A local path for a message (``EscapedBytes``: bytes that are not
    UTF-8 as ``\\xNN``)."""
    raw = os.fsencode(path)
    try:
        return escape(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in raw)


def unsafe_name(rel: str) -> bool:
    """Whether a relative name may not become a local path: a leading
    ``/``, a NUL or another control character (U+0000..U+001F,
    U+007F..U+009F: terminal escapes, line breaks), an empty, ``.`` or
    ``..`` component, or a component longer than 255 bytes."""
    if rel.startswith("/") or any(c < " " or "\x7f" <= c <= "\x9f" for c in rel):
        return True
    for part in rel.split("/"):
        if part in ("", ".", "..") or len(part.encode("utf-8", "surrogateescape")) > _NAME_MAX:
            return True
    return False


def _is_marker(rel: str) -> bool:
    return not rel or rel.endswith("/")


def temp_name(name: str) -> str:
    """``.<name>.s3dma-<16 hex>.tmp``, the name shortened (by whole UTF-8
    characters) so that the result fits in 255 bytes."""
    raw = name.encode("utf-8", "surrogateescape")
    room = _NAME_MAX - 1 - _TEMP_SUFFIX_LEN
    if len(raw) > room:
        name = raw[:room].decode("utf-8", "ignore")
    return f".{name}.s3dma-{secrets.token_hex(8)}.tmp"


Rules = List[Tuple[bool, str]]


def _rules(
    include: Union[str, Sequence[str]],
    exclude: Union[str, Sequence[str]],
    filters: Sequence[Tuple[str, str]],
) -> Rules:
    inc = [include] if isinstance(include, str) else list(include)
    exc = [exclude] if isinstance(exclude, str) else list(exclude)
    if filters and (inc or exc):
        raise ValueError("give either filters=[...] or include=/exclude=, not both")
    rules: Rules = [(False, p) for p in exc] + [(True, p) for p in inc]
    for item in filters:
        try:
            kind, pattern = item
        except (TypeError, ValueError):
            raise ValueError(f"filters: expected (\"include\"|\"exclude\", pattern), not {item!r}") from None
        if kind not in ("include", "exclude") or not isinstance(pattern, str):
            raise ValueError(f"filters: expected (\"include\"|\"exclude\", pattern), not {item!r}")
        rules.append((kind == "include", pattern))
    for _, p in rules:
        if not isinstance(p, str):
            raise ValueError(f"filter patterns are strings, not {p!r}")
    return rules


def selected(rules: Rules, rel: str) -> bool:
    """Whether the filters select a relative name: every name is selected
    at first; the last matching filter decides."""
    ok = True
    for include, pattern in rules:
        if fnmatch.fnmatchcase(rel, pattern):
            ok = include
    return ok


def _refusal(msg: str, code: str) -> S3dmaError:
    return S3dmaError(msg, code=code, domain=errors.CLIENT_DOMAIN)


# -- the local tree ---------------------------------------------------------


@dataclass
class _LocalFile:
    size: int
    mtime_ns: int
    dev: int = -1  # which file the walk saw (-1: not recorded)
    ino: int = -1


@dataclass
class _Tree:
    files: Dict[str, _LocalFile] = field(default_factory=dict)  # regular files, in walk order
    others: List[str] = field(default_factory=list)  # symlinks, sockets, fifos, devices
    errors: List[Tuple[str, BaseException]] = field(default_factory=list)


def _walk(root: str) -> _Tree:
    """Every entry under ``root``, depth first, each directory sorted by the
    bytes of its names; symlinks are not followed; our temp files are left
    out. Names are relative and ``/``-separated (undecodable bytes as
    surrogate escapes, like :func:`os.fsdecode`)."""
    tree = _Tree()

    def visit(path: str, rel_dir: str) -> None:
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: os.fsencode(e.name))
        except OSError as e:
            tree.errors.append((rel_dir.rstrip("/") or ".", e))
            return
        for e in entries:
            rel = rel_dir + e.name
            try:
                if e.is_dir(follow_symlinks=False):
                    visit(e.path, rel + "/")
                elif TEMP_RE.match(e.name):
                    continue
                elif e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    tree.files[rel] = _LocalFile(st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino)
                else:
                    tree.others.append(rel)
            except FileNotFoundError:
                continue  # gone meanwhile
            except OSError as err:
                tree.errors.append((rel, err))

    visit(root, "")
    return tree


def _is_symlink(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _open_parent(root: str, root_fd: int, parts: List[str], create: bool) -> int:
    """An fd of the directory ``root/parts[:-1]``, reached component by
    component without following symlinks (created 0777 & ~umask when
    ``create``). A symlink on the way is refused."""
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                try:
                    nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, 0o777, dir_fd=fd)
                    except FileExistsError:
                        pass  # another thread made it
                    nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR) and _is_symlink(fd, part):
                    raise _refusal(
                        f"refusing to write through a symlink: {os.path.join(root, *parts[: i + 1])}",
                        "SymlinkInPath",
                    ) from None
                if e.filename is None or e.filename == part:
                    e.filename = os.path.join(root, *parts[: i + 1])
                raise
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


# -- buffers ----------------------------------------------------------------


class _Slots:
    """Up to ``count`` registered buffers of ``size`` bytes, allocated on
    first need and reused for the whole run."""

    def __init__(self, client: Client, size: int, count: int, label: str):
        self.client = client
        self.size = size
        self.count = count
        self.label = label
        self._free: "queue.SimpleQueue[Buffer]" = queue.SimpleQueue()
        self._all: List[Buffer] = []
        self._lock = threading.Lock()

    def acquire(self) -> Buffer:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            grow = len(self._all) < self.count
            if grow:
                buf = self.client.alloc(self.size, label=self.label)
                self._all.append(buf)
                return buf
        return self._free.get()

    def release(self, buf: Buffer) -> None:
        self._free.put(buf)

    def close(self) -> None:
        for buf in self._all:
            with contextlib.suppress(S3dmaError):
                if not self.client.closed:
                    buf.release()
        self._all.clear()


class _Budget:
    """Bytes of registered memory for one-off buffers: ``acquire(n)`` waits
    until ``n`` fit, or until nothing else is held (a request larger than
    the whole budget then goes alone)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.used = 0
        self._cond = threading.Condition()

    def acquire(self, n: int) -> None:
        with self._cond:
            while self.used and self.used + n > self.capacity:
                self._cond.wait()
            self.used += n

    def release(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()


# -- one run ----------------------------------------------------------------


@contextlib.contextmanager
def _session(client: Optional[Client], socket: Optional[str]) -> Iterator[Client]:
    if client is not None:
        yield client
        return
    with Client(socket) as c:
        yield c


class _Run:
    """Counters, failures, progress, temp files and the thread pool of one
    transfer."""

    def __init__(self, op: str, url: str, progress: Optional[ProgressCallback], concurrency: int):
        self.op = op
        self.url = url
        self.progress = progress
        self.concurrency = concurrency
        self.summary = TransferSummary()
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.total = 0
        self.done = 0
        # Temp files being written: id -> (dir fd, temp name, file fd).
        self._temps: Dict[int, Tuple[int, str, int]] = {}
        self._workers_idle = True

    def fail(self, name: str, exc: BaseException) -> None:
        with self.lock:
            self.summary.failures.append((name, exc))

    def copied(self, nbytes: int) -> None:
        with self.lock:
            self.summary.files += 1
            self.summary.bytes += nbytes

    def add_temp(self, key: int, entry: Tuple[int, str, int]) -> None:
        with self.lock:
            self._temps[key] = entry

    def drop_temp(self, key: int) -> None:
        with self.lock:
            self._temps.pop(key, None)

    def remove_temps(self) -> None:
        """Removes temp files left by an interrupted run (their fds are
        closed too once no worker can be using them)."""
        with self.lock:
            left = list(self._temps.values())
            self._temps.clear()
        for dir_fd, name, fd in left:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
            if self._workers_idle:
                for f in (fd, dir_fd):
                    with contextlib.suppress(OSError):
                        os.close(f)

    def execute(self, tasks: Sequence[Tuple[str, Callable[[], int]]], report: bool = True) -> None:
        """Runs ``(name, task)`` pairs on the pool; a task returns the bytes
        it moved, and an exception it raises is that name's failure.
        Progress is reported from this thread. On KeyboardInterrupt (or any
        BaseException here) the tasks not started are dropped, those
        running finish, and the exception propagates."""
        if not tasks:
            return
        if report and self.progress is not None:
            self.progress(self.done, self.total)
        ex = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="s3dma-transfer")
        self._workers_idle = False
        try:
            futures = [ex.submit(self._guard, name, task) for name, task in tasks]
            for f in as_completed(futures):
                n = f.result()
                if report:
                    self.done += n
                    if self.progress is not None:
                        self.progress(self.done, self.total)
        except BaseException:
            self.stop.set()
            ex.shutdown(wait=True, cancel_futures=True)
            self._workers_idle = True
            raise
        ex.shutdown(wait=True)
        self._workers_idle = True

    def _guard(self, name: str, task: Callable[[], int]) -> int:
        if self.stop.is_set():
            return 0
        try:
            return task()
        except Exception as e:
            self.fail(name, e)
            return 0

    def finish(self) -> TransferSummary:
        s = self.summary
        s.seconds = time.monotonic() - self.t0
        if s.failures:
            first = s.failures[0][1]
            shown = "; ".join(f"{name}: {e}" for name, e in s.failures[:10])
            if len(s.failures) > 10:
                shown += f"; ... and {len(s.failures) - 10} more"
            msg = f"{self.op} {self.url}: {len(s.failures)} failed ({s.files} copied): {shown}"
            if isinstance(first, S3dmaError):
                raise TransferError(
                    msg,
                    summary=s,
                    code=first.code or "TransferFailed",
                    grpc_code=first.grpc_code,
                    request_id=first.request_id,
                    domain=errors.CLIENT_DOMAIN,
                )
            raise TransferError(msg, summary=s, code="TransferFailed", domain=errors.CLIENT_DOMAIN)
        return s


def _check_args(concurrency: int, chunk_size: int, max_memory: int, sync: bool, delete: bool) -> None:
    for name, v in (("concurrency", concurrency), ("chunk_size", chunk_size), ("max_memory", max_memory)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, not {v!r}")
    if delete and not sync:
        raise ValueError("delete=True needs sync=True")


def _newer(a_seconds: int, b_seconds: int) -> bool:
    return a_seconds > b_seconds


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        n = os.pwrite(fd, data, offset)
        if n <= 0:
            raise OSError(errno.EIO, "pwrite wrote nothing")
        data = data[n:]
        offset += n


# -- downloads --------------------------------------------------------------


class _Download:
    def __init__(self, run: _Run, client: Client, bucket: str, root: str, root_fd: int, slots: _Slots):
        self.run = run
        self.client = client
        self.bucket = bucket
        self.root = root
        self.root_fd = root_fd
        self.slots = slots

    def _dest(self, rel: str) -> Tuple[int, str]:
        """(fd of the destination's directory, its name); the directories
        are created, symlinks refused."""
        parts = rel.split("/")
        dir_fd = _open_parent(self.root, self.root_fd, parts, create=True)
        name = parts[-1]
        try:
            st = os.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return dir_fd, name
        except BaseException:
            os.close(dir_fd)
            raise
        if stat.S_ISLNK(st.st_mode):
            os.close(dir_fd)
            raise _refusal(f"refusing to write through a symlink: {os.path.join(self.root, *parts)}", "SymlinkInPath")
        if stat.S_ISDIR(st.st_mode):
            os.close(dir_fd)
            raise IsADirectoryError(errno.EISDIR, "a directory is in the way", os.path.join(self.root, *parts))
        return dir_fd, name

    def _open_temp(self, dir_fd: int, name: str) -> Tuple[str, int]:
        tmp = temp_name(name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dir_fd)
        return tmp, fd

    @staticmethod
    def _commit(dir_fd: int, name: str, tmp: str, fd: int, obj: ListedObject) -> None:
        """mtime (and atime) = LastModified, then the rename into place.
        Closes ``fd`` whatever happens (the caller must not)."""
        try:
            ns = obj.last_modified_ms * 1_000_000
            os.utime(fd, ns=(ns, ns))
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

    def _get(self, obj: ListedObject, buf: Buffer, first: int, n: int, whole: bool) -> int:
        if whole:
            r = self.client.get_object_into(self.bucket, obj.key, buf, if_match=obj.etag)
        else:
            r = self.client.get_object_into(
                self.bucket, obj.key, buf, 0, n, range=(first, first + n - 1), if_match=obj.etag
            )
        if r.bytes_placed != n:
            raise _refusal(
                f"bytes {first}-{first + n - 1} of s3://{self.bucket}/{obj.key} came back as "
                f"{r.bytes_placed} bytes (the object changed?)",
                "FileChanged",
            )
        return r.bytes_placed

    def small(self, rel: str, obj: ListedObject) -> int:
        """An object of at most one chunk: one GET into a slot."""
        dir_fd, name = self._dest(rel)
        try:
            buf = self.slots.acquire()
            try:
                self._get(obj, buf, 0, obj.size, whole=True)
                tmp, fd = self._open_temp(dir_fd, name)
                key = id(buf)
                self.run.add_temp(key, (dir_fd, tmp, fd))
                try:
                    try:
                        with memoryview(buf.mmap) as m, m[: obj.size] as part:
                            _write_all(fd, part, 0)
                    except BaseException:
                        os.close(fd)
                        raise
                    self._commit(dir_fd, name, tmp, fd, obj)  # closes fd
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=dir_fd)
                    raise
                finally:
                    self.run.drop_temp(key)
            finally:
                self.slots.release(buf)
        finally:
            os.close(dir_fd)
        self.run.copied(obj.size)
        return obj.size

    def big(self, rel: str, obj: ListedObject, chunk: int) -> List[Tuple[str, Callable[[], int]]]:
        """The chunk tasks of a large object: ranged GETs into slots, written
        at their offsets; the last one to finish commits (or cleans up)."""
        job = _BigFile(self, rel, obj, -(-obj.size // chunk))
        return [
            (rel, (lambda first=first: job.chunk(first, min(chunk, obj.size - first))))
            for first in range(0, obj.size, chunk)
        ]


class _BigFile:
    def __init__(self, dl: _Download, rel: str, obj: ListedObject, nchunks: int):
        self.dl = dl
        self.rel = rel
        self.obj = obj
        self.remaining = nchunks
        self.error: Optional[BaseException] = None
        self.lock = threading.Lock()
        self.dir_fd = -1
        self.name = ""
        self.tmp = ""
        self.fd = -1

    def _open(self) -> None:
        self.dir_fd, self.name = self.dl._dest(self.rel)
        try:
            self.tmp, self.fd = self.dl._open_temp(self.dir_fd, self.name)
        except BaseException:
            os.close(self.dir_fd)
            self.dir_fd = -1
            raise
        self.dl.run.add_temp(id(self), (self.dir_fd, self.tmp, self.fd))

    def chunk(self, first: int, n: int) -> int:
        moved = 0
        err: Optional[BaseException] = None
        try:
            with self.lock:
                if self.error is None and self.fd < 0:
                    self._open()
                ok = self.error is None
            if ok and self.dl.run.stop.is_set():
                raise errors.client_error(errors.Cancelled, "the transfer was interrupted")
            if ok:
                buf = self.dl.slots.acquire()
                try:
                    self.dl._get(self.obj, buf, first, n, whole=False)
                    with memoryview(buf.mmap) as m, m[:n] as part:
                        _write_all(self.fd, part, first)
                    moved = n
                finally:
                    self.dl.slots.release(buf)
        except Exception as e:
            err = e
        with self.lock:
            if err is not None and self.error is None:
                self.error = err
            self.remaining -= 1
            last = self.remaining == 0
        if last:
            self._finish()
        return moved

    def _finish(self) -> None:
        run = self.dl.run
        try:
            if self.error is None:
                fd, self.fd = self.fd, -1
                try:
                    self.dl._commit(self.dir_fd, self.name, self.tmp, fd, self.obj)  # closes fd
                except Exception as e:
                    self.error = e
            if self.error is not None:
                if self.fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(self.fd)
                if self.tmp:
                    with contextlib.suppress(OSError):
                        os.unlink(self.tmp, dir_fd=self.dir_fd)
                run.fail(self.rel, self.error)
            else:
                run.copied(self.obj.size)
        finally:
            run.drop_temp(id(self))
            if self.dir_fd >= 0:
                os.close(self.dir_fd)


def download_prefix(
    url: str,
    dir: PathLike,
    *,
    sync: bool = False,
    delete: bool = False,
    include: Union[str, Sequence[str]] = (),
    exclude: Union[str, Sequence[str]] = (),
    filters: Sequence[Tuple[str, str]] = (),
    concurrency: int = DEFAULT_CONCURRENCY,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    max_memory: int = DEFAULT_MAX_MEMORY,
    progress: Optional[ProgressCallback] = None,
    client: Optional[Client] = None,
    socket: Optional[str] = None,
) -> TransferSummary:
    """Copies every object under ``s3://bucket/prefix`` into ``dir``
    (created if missing), keeping the key's ``/`` structure.

    ``sync``: copy only objects that are missing locally, differ in size or
    are newer (LastModified > mtime, whole seconds); ``delete`` (with
    ``sync``): then remove local files under ``dir`` that no listed key
    names (not excluded ones, not symlinks, not when any copy failed).
    ``include``/``exclude``/``filters``: see the module. ``concurrency``
    GETs in flight over one client (``client``, else one opened on
    ``socket``); objects over ``chunk_size`` bytes go as ranged GETs of that
    size; registered memory stays within ``max_memory``. ``progress(done,
    total)``: bytes, called from this thread as requests complete.

    Returns a :class:`TransferSummary`; raises :class:`s3dma.TransferError`
    (with ``.summary``) if any file or the listing failed, after copying
    the others."""
    bucket, prefix = parse_url(url)
    url = f"s3://{bucket}/{prefix}"
    rules = _rules(include, exclude, filters)
    _check_args(concurrency, chunk_size, max_memory, sync, delete)
    root = os.fspath(dir)
    if os.path.exists(root) and not os.path.isdir(root):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", root)
    os.makedirs(root, exist_ok=True)
    run = _Run("download", url, progress, concurrency)
    s = run.summary
    with _session(client, socket) as c:
        try:
            objects = list(c.list_all(bucket, prefix=prefix))
        except S3dmaError as e:
            run.fail(url, e)
            return run.finish()
        tree = _walk(root) if sync else _Tree()
        sources: Set[str] = set()
        todo: List[Tuple[str, ListedObject]] = []
        for o in objects:
            rel = o.key[len(prefix) :]
            if _is_marker(rel):
                s.skipped += 1
                continue
            if not selected(rules, rel):
                continue
            sources.add(rel)
            if unsafe_name(rel):
                run.fail(rel, _refusal(f"unsafe key: {escape(o.key)}", "UnsafeKey"))
                continue
            if sync:
                local = tree.files.get(rel)
                if (
                    local is not None
                    and local.size == o.size
                    and not _newer(o.last_modified_ms // 1000, local.mtime_ns // 1_000_000_000)
                ):
                    s.up_to_date += 1
                    continue
            todo.append((rel, o))
        for rel, e in tree.errors:
            run.fail(rel, e)

        chunk = min(chunk_size, max_memory)
        largest = max((o.size for _, o in todo), default=0)
        slot_size = max(1, min(chunk, largest))
        pieces = sum(max(1, -(-o.size // chunk)) for _, o in todo)
        nslots = max(1, min(concurrency, pieces, max_memory // slot_size))
        run.total = sum(o.size for _, o in todo)
        slots = _Slots(c, slot_size, nslots, "s3dma download")
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            dl = _Download(run, c, bucket, root, root_fd, slots)
            tasks: List[Tuple[str, Callable[[], int]]] = []
            for rel, o in todo:
                if o.size <= chunk:
                    tasks.append((rel, (lambda rel=rel, o=o: dl.small(rel, o))))
                else:
                    tasks.extend(dl.big(rel, o, chunk))
            try:
                run.execute(tasks)
            finally:
                run.remove_temps()
            if delete and not s.failures:
                for rel in tree.files:
                    if rel in sources or not selected(rules, rel):
                        continue
                    try:
                        parts = rel.split("/")
                        dir_fd = _open_parent(root, root_fd, parts, create=False)
                        try:
                            os.unlink(parts[-1], dir_fd=dir_fd)
                        finally:
                            os.close(dir_fd)
                        s.deleted += 1
                    except FileNotFoundError:
                        pass
                    except (OSError, S3dmaError) as e:
                        run.fail(rel, e)
        finally:
            os.close(root_fd)
            slots.close()
    return run.finish()


# -- uploads ----------------------------------------------------------------


def upload_dir(
    dir: PathLike,
    url: str,
    *,
    sync: bool = False,
    delete: bool = False,
    include: Union[str, Sequence[str]] = (),
    exclude: Union[str, Sequence[str]] = (),
    filters: Sequence[Tuple[str, str]] = (),
    concurrency: int = DEFAULT_CONCURRENCY,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    max_memory: int = DEFAULT_MAX_MEMORY,
    progress: Optional[ProgressCallback] = None,
    client: Optional[Client] = None,
    socket: Optional[str] = None,
) -> TransferSummary:
    """Puts every regular file under ``dir`` as ``prefix + relative path``
    (``/``-separated); symlinks are not followed (counted as skipped), and
    each file is opened without following one and must be the very file the
    walk saw (device and inode), else it fails as ``SymlinkInPath`` or
    ``FileChanged``.

    ``sync``: put only files whose key is missing, differs in size or is
    older (mtime > LastModified, whole seconds); ``delete`` (with ``sync``):
    then delete keys under the prefix that no local file (or skipped
    symlink) names (not excluded ones, not directory markers or unsafe
    names, not when any copy failed). Files up to ``chunk_size`` bytes are
    read into pooled buffers, larger ones into a buffer of their own (see
    the module for ``max_memory``). Other arguments as
    :func:`download_prefix`.

    Returns a :class:`TransferSummary`; raises :class:`s3dma.TransferError`
    if any file (or the listing, with ``sync``) failed."""
    bucket, prefix = parse_url(url)
    url = f"s3://{bucket}/{prefix}"
    rules = _rules(include, exclude, filters)
    _check_args(concurrency, chunk_size, max_memory, sync, delete)
    root = os.fspath(dir)
    if not os.path.isdir(root):
        if os.path.exists(root):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", root)
        raise FileNotFoundError(errno.ENOENT, "no such directory", root)
    run = _Run("upload", url, progress, concurrency)
    s = run.summary
    tree = _walk(root)
    s.skipped += len(tree.others)
    with _session(client, socket) as c:
        remote: Dict[str, ListedObject] = {}
        if sync:
            try:
                for o in c.list_all(bucket, prefix=prefix):
                    remote[o.key[len(prefix) :]] = o
            except S3dmaError as e:
                run.fail(url, e)
                return run.finish()
        for rel, e in tree.errors:
            run.fail(rel, e)
        todo: List[Tuple[str, int]] = []
        for rel, local in tree.files.items():
            if not selected(rules, rel):
                continue
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                run.fail(
                    rel,
                    _refusal(
                        f"the name is not UTF-8 (an S3 key must be): {_escape_path(os.path.join(root, rel))}",
                        "InvalidFileName",
                    ),
                )
                continue
            if sync:
                o = remote.get(rel)
                if (
                    o is not None
                    and o.size == local.size
                    and not _newer(local.mtime_ns // 1_000_000_000, o.last_modified_ms // 1000)
                ):
                    s.up_to_date += 1
                    continue
            todo.append((rel, local.size))

        chunk = min(chunk_size, max_memory)
        small = [n for _, n in todo if n <= chunk]
        large = [n for _, n in todo if n > chunk]
        slot_size = max(1, max(small, default=1))
        pool_bytes = max_memory // 2 if large else max_memory
        nslots = max(1, min(concurrency, len(small), pool_bytes // slot_size))
        budget = _Budget(max(0, max_memory - nslots * slot_size))
        run.total = sum(n for _, n in todo)
        slots = _Slots(c, slot_size, nslots, "s3dma upload")
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

        def put(rel: str, planned: int, seen: _LocalFile) -> int:
            parts = rel.split("/")
            if planned <= chunk:
                buf = slots.acquire()
                own = 0
            else:
                budget.acquire(planned)
                own = planned
                try:
                    buf = c.alloc(planned, label="s3dma upload")
                except BaseException:
                    budget.release(own)
                    raise
            try:
                n = _read_file(root, root_fd, parts, buf, seen)
                if run.stop.is_set():
                    raise errors.client_error(errors.Cancelled, "the transfer was interrupted")
                c.put_object_from(bucket, prefix + rel, buf, 0, n)
            finally:
                if own:
                    with contextlib.suppress(S3dmaError):
                        buf.release()
                    budget.release(own)
                else:
                    slots.release(buf)
            run.copied(n)
            return n

        try:
            run.execute([(rel, (lambda rel=rel, n=n: put(rel, n, tree.files[rel]))) for rel, n in todo])
            if delete and not s.failures:
                present = set(tree.files) | set(tree.others)
                doomed = [
                    rel
                    for rel in remote
                    if rel not in present
                    and not _is_marker(rel)
                    and not unsafe_name(rel)
                    and not TEMP_RE.match(rel.rsplit("/", 1)[-1])
                    and selected(rules, rel)
                ]

                def remove(rel: str) -> int:
                    c.delete(bucket, prefix + rel)
                    with run.lock:
                        s.deleted += 1
                    return 0

                run.execute([(rel, (lambda rel=rel: remove(rel))) for rel in doomed], report=False)
        finally:
            os.close(root_fd)
            slots.close()
    return run.finish()


def _read_file(root: str, root_fd: int, parts: List[str], buf: Buffer, seen: Optional[_LocalFile] = None) -> int:
    """The file ``root/parts`` into ``buf`` (no symlink followed: the
    directories by :func:`_open_parent`, the file with ``O_NOFOLLOW``); its
    size. With ``seen`` (what the walk recorded), ``fstat`` must find that
    very file (same device and inode): a file swapped for a symlink or for
    another file after the walk is refused (``SymlinkInPath`` /
    ``FileChanged``), never read. Fails if it does not fit or changes size
    while being read."""
    path = os.path.join(root, *parts)
    dir_fd = _open_parent(root, root_fd, parts, create=False)
    try:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _refusal(f"refusing to read through a symlink: {path}", "SymlinkInPath") from None
            e.filename = path
            raise
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refusal(f"{path} is no longer a regular file", "FileChanged")
        if seen is not None and seen.ino >= 0 and (st.st_dev, st.st_ino) != (seen.dev, seen.ino):
            raise _refusal(f"{path} was replaced by another file since the directory was read", "FileChanged")
        n = st.st_size
        if n > buf.size:
            raise _refusal(f"{path} grew from {buf.size} to {n} bytes since the directory was read", "FileChanged")
        pos = 0
        with memoryview(buf.mmap) as m:
            while pos < n:
                with m[pos : min(n, pos + _READ_STEP)] as part:
                    got = os.readv(fd, [part])
                if got == 0:
                    raise _refusal(f"{path} shrank while it was read ({pos} of {n} bytes)", "FileChanged")
                pos += got
        if os.read(fd, 1) or os.fstat(fd).st_size != n:
            raise _refusal(f"{path} changed size while it was read (was {n} bytes)", "FileChanged")
        return n
    finally:
        os.close(fd)
