"""safetensors files on S3, read into and written from registered memory.

    from s3dma import safetensors as s3st
    sd = s3st.load_file("s3://models/llama/model-00001.safetensors")  # CPU views, no copy
    s3st.save_file(sd, "s3://models/copy.safetensors", metadata={"format": "pt"})

:func:`load_file` reads the 8-byte length and the JSON header with one ranged
GET (a second one only when the header is larger than ``first_read``),
validates every entry, then places the tensor data in ONE registered buffer
with parallel ranged GETs (:meth:`s3dma.Client.get_objects`). Every chunk
must come from the object version whose header was parsed (same ETag), so
an overwrite during the load raises :class:`s3dma.PreconditionFailed`
instead of returning a mix of two files.

Lifetime: CPU tensors are views of that buffer (``torch.frombuffer`` over a
memoryview of the mapping). The buffer stays mapped and registered while any
of them (or any view of them) is alive; when the last one goes, the buffer
goes back to the client, which keeps it (up to ``Client.keep_bytes``, 4 GiB
by default) for the next load of the same size: a fresh buffer's pages are
faulted in while the bytes land, which costs more than the transfer itself
on small machines (2 GiB: 0.88 GB/s fresh, 2.2 GB/s into faulted-in memory).
``Buffer.release()`` by hand cannot
pull the memory from under them (the memoryview keeps the mapping). The
tensors are writable and share memory with each other's buffer only.

:func:`save_file` serialises exactly what ``safetensors.torch.save`` writes
(same tensor order, header JSON and space padding; bytes-identical for the
same dict) into one registered buffer, copying each tensor once, and PUTs
it (the agent uses multipart for large objects).

torch is imported on first use, so this module imports without it.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from . import errors
from .client import Buffer, Client, GetItem, PutResult, default_socket

__all__ = [
    "InvalidSafetensors",
    "Header",
    "TensorInfo",
    "load_file",
    "save_file",
    "read_header",
    "parse_header",
    "serialize_header",
    "parse_url",
]

DEFAULT_CHUNK_SIZE = 8 << 20
DEFAULT_CONCURRENCY = 8
DEFAULT_FIRST_READ = 1 << 20
# safetensors refuses larger headers too (MAX_HEADER_SIZE).
MAX_HEADER_SIZE = 100_000_000
# Items per GetObjects call: keeps one request small for very large files.
_MAX_ITEMS_PER_CALL = 4096

# Format name -> (torch dtype attribute, itemsize in bytes).
_DTYPES: Dict[str, Tuple[str, int]] = {
    "BOOL": ("bool", 1),
    "U8": ("uint8", 1),
    "I8": ("int8", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 1),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", 1),
    "I16": ("int16", 2),
    "U16": ("uint16", 2),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I32": ("int32", 4),
    "U32": ("uint32", 4),
    "F32": ("float32", 4),
    "C64": ("complex64", 8),
    "F64": ("float64", 8),
    "I64": ("int64", 8),
    "U64": ("uint64", 8),
}
# Sub-byte types of the format that have no byte-addressable torch dtype.
_UNSUPPORTED = {"F4", "F6_E2M3", "F6_E3M2"}
# The order of safetensors' Rust `Dtype` enum: it writes tensors sorted by
# dtype (this order, descending), then by name. Matching it makes save_file
# byte-identical to safetensors.torch.save.
_ENUM_ORDER = [
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
    "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
    "C64", "F64", "I64", "U64",
]  # fmt: skip
_RANK = {name: i for i, name in enumerate(_ENUM_ORDER)}


class InvalidSafetensors(ValueError):
    """The object is not a well-formed safetensors file (bad length, JSON,
    dtype, shape or data offsets). Nothing was returned."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # the format's name: "F32", "BF16", ...
    shape: Tuple[int, ...]
    begin: int  # data_offsets, relative to the start of the data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    metadata: Optional[Dict[str, str]]
    tensors: List[TensorInfo]  # in the order of their data offsets
    header_len: int  # N, the JSON's length (padding included)
    file_size: int

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    @property
    def data_len(self) -> int:
        """Bytes of the data section that tensors use (from its start)."""
        return max((t.end for t in self.tensors), default=0)


# -- urls, clients, devices ---------------------------------------------------


def parse_url(url: str) -> Tuple[str, str]:
    """``s3://bucket/key`` -> ``(bucket, key)``."""
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise ValueError(f"expected an s3://bucket/key URL, not {url!r}")
    bucket, _, key = url[5:].partition("/")
    if not bucket or not key:
        raise ValueError(f"expected an s3://bucket/key URL (bucket and key both set), not {url!r}")
    return bucket, key


_clients: Dict[Tuple[str, int], Client] = {}
_clients_lock = threading.Lock()


def _client(client: Optional[Client], socket: Optional[str]) -> Client:
    """The given client, else one shared Client per (socket, process). Entries
    of other pids stay referenced: collecting a parent's client in a forked
    child must not close the parent's connections."""
    if client is not None:
        return client
    path = os.path.abspath(socket or default_socket())
    k = (path, os.getpid())
    with _clients_lock:
        c = _clients.get(k)
        if c is None or c.closed:
            c = _clients[k] = Client(path)
        return c


def _torch():
    try:
        import torch  # the real package (absolute import)
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("s3dma.safetensors needs torch (pip install torch)") from e
    return torch


def _device(torch, device):
    """Parses ``device``; refuses CUDA without CUDA before any I/O."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device {device!r} is not a torch device: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"device={device!r} but CUDA is not available in this process "
            "(torch.cuda.is_available() is False): load with device='cpu' or run where a GPU is visible"
        )
    return dev


def _torch_dtype(torch, name: str, what: str):
    attr, _ = _DTYPES[name]
    dt = getattr(torch, attr, None)
    if dt is None:
        raise InvalidSafetensors(f"{what}: dtype {name} needs torch.{attr}, which this torch ({torch.__version__}) lacks")
    return dt


# -- the header ---------------------------------------------------------------


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise InvalidSafetensors(f"the header names {k!r} twice")
        d[k] = v
    return d


def parse_header(raw: bytes, file_size: int, header_len: Optional[int] = None, what: str = "safetensors header") -> Header:
    """Parses and validates the JSON header ``raw`` of a file of
    ``file_size`` bytes: known dtypes, shapes of non-negative ints, offsets
    inside the file, sizes equal to numel * itemsize, no two tensors sharing
    bytes. Raises :class:`InvalidSafetensors`."""
    n = len(raw) if header_len is None else header_len
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidSafetensors(f"{what} is not UTF-8 ({e})") from None
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates)
    except InvalidSafetensors as e:
        raise InvalidSafetensors(f"{what}: {e}") from None
    except (ValueError, RecursionError) as e:
        raise InvalidSafetensors(f"{what} is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise InvalidSafetensors(f"{what} must be a JSON object, not {type(doc).__name__}")
    data_size = file_size - 8 - n
    metadata = doc.pop("__metadata__", None)
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise InvalidSafetensors(f"{what}: __metadata__ must map strings to strings")
    tensors = []
    for name, e in doc.items():
        where = f"{what}: tensor {name!r}"
        if not isinstance(e, dict):
            raise InvalidSafetensors(f"{where} must be an object with dtype, shape and data_offsets")
        dtype, shape, offs = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if dtype in _UNSUPPORTED:
            raise InvalidSafetensors(f"{where}: dtype {dtype} (sub-byte) is not supported by s3dma.safetensors")
        if not isinstance(dtype, str) or dtype not in _DTYPES:
            raise InvalidSafetensors(f"{where}: unknown dtype {dtype!r} (known: {', '.join(sorted(_DTYPES))})")
        if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
            raise InvalidSafetensors(f"{where}: shape must be a list of non-negative integers, not {shape!r}")
        if not (isinstance(offs, list) and len(offs) == 2 and all(_is_uint(o) for o in offs)):
            raise InvalidSafetensors(f"{where}: data_offsets must be [begin, end] (non-negative integers), not {offs!r}")
        begin, end = offs
        if begin > end:
            raise InvalidSafetensors(f"{where}: data_offsets {offs} end before they begin")
        if end > data_size:
            raise InvalidSafetensors(
                f"{where}: data_offsets {offs} run past the end of the file "
                f"(the data section has {max(data_size, 0)} bytes)"
            )
        numel = 1
        for d in shape:
            numel *= d
        want = numel * _DTYPES[dtype][1]
        if end - begin != want:
            raise InvalidSafetensors(
                f"{where}: data_offsets {offs} hold {end - begin} bytes, but {dtype}{shape} needs {want}"
            )
        tensors.append(TensorInfo(name, dtype, tuple(shape), begin, end))
    tensors.sort(key=lambda t: (t.begin, t.end))
    prev: Optional[TensorInfo] = None
    for t in tensors:
        if t.begin == t.end:
            continue  # empty tensors own no bytes
        if prev is not None and t.begin < prev.end:
            raise InvalidSafetensors(
                f"{what}: tensors {prev.name!r} [{prev.begin}, {prev.end}) and {t.name!r} "
                f"[{t.begin}, {t.end}) overlap"
            )
        prev = t
    return Header(metadata=metadata, tensors=tensors, header_len=n, file_size=file_size)


def _is_uint(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _header_len(prefix: bytes, file_size: int, what: str) -> int:
    if file_size < 8 or len(prefix) < 8:
        raise InvalidSafetensors(f"{what} is {file_size} bytes: too short for a safetensors file (8-byte length first)")
    (n,) = struct.unpack("<Q", bytes(prefix[:8]))
    if n > MAX_HEADER_SIZE:
        raise InvalidSafetensors(f"{what}: header length {n} is over the {MAX_HEADER_SIZE}-byte limit")
    if 8 + n > file_size:
        raise InvalidSafetensors(f"{what}: header length {n} runs past the end of the {file_size}-byte file")
    return n


def _read_header(c: Client, bucket: str, key: str, first_read: int) -> Tuple[Header, Buffer, int, str]:
    """Reads and parses the header. Returns it, the first-read buffer (the
    caller owns it), the bytes placed in it and the ETag."""
    what = f"s3://{bucket}/{key}"
    if first_read < 8:
        raise ValueError(f"first_read must be at least 8 bytes, not {first_read}")
    buf = c.alloc(first_read, label="safetensors")
    try:
        try:
            r = c.get_object_into(bucket, key, buf, range=(0, first_read - 1))
        except errors.InvalidRange:
            # S3 answers 416 to any range of an empty object.
            raise InvalidSafetensors(f"{what} is empty: not a safetensors file") from None
        placed, size, etag = r.bytes_placed, r.size, r.etag
        mm = buf.mmap
        n = _header_len(mm[:8], size, what)
        if 8 + n <= placed:
            raw = mm[8 : 8 + n]
        else:
            # A header larger than the first read: one more GET of it alone,
            # pinned to the version just read.
            with c.alloc(n, label="safetensors-header") as hb:
                c.get_object_into(bucket, key, hb, range=(8, 8 + n - 1), if_match=etag)
                raw = hb.mmap[:n]
        return parse_header(raw, size, n, what=f"{what}: header"), buf, placed, etag
    except BaseException:
        buf.release()
        raise


def read_header(url: str, *, client: Optional[Client] = None, socket: Optional[str] = None,
                first_read: int = 64 << 10) -> Header:
    """The validated header of a safetensors object (names, dtypes, shapes,
    offsets, ``__metadata__``) without its tensor data."""
    bucket, key = parse_url(url)
    header, buf, _, _ = _read_header(_client(client, socket), bucket, key, first_read)
    buf.release()
    return header


# -- load ---------------------------------------------------------------------


def _fetch(c: Client, bucket: str, key: str, buf: Any, start: int, length: int, etag: str,
           chunk_size: int, concurrency: int, at: int = 0) -> None:
    """Bytes [start, start+length) of the object into buf[at:at+length], in
    ranged chunks fetched in parallel, each pinned to ``etag`` with If-Match
    (a version that changed is refused by the agent, before any byte of the
    chunk is placed); the returned ETags are checked again here."""
    items = [
        GetItem(bucket, key, buf, offset=at + o, length=min(chunk_size, length - o),
                range=(start + o, start + min(o + chunk_size, length) - 1), if_match=etag)
        for o in range(0, length, chunk_size)
    ]
    for i in range(0, len(items), _MAX_ITEMS_PER_CALL):
        group = items[i : i + _MAX_ITEMS_PER_CALL]
        for it, r in zip(group, c.get_objects(group, concurrency=concurrency)):
            first, last = it.range  # type: ignore[misc]
            if isinstance(r, errors.PreconditionFailed):
                raise errors.PreconditionFailed(
                    f"s3://{bucket}/{key} changed while it was loaded (ETag {etag} when the header was read; "
                    f"bytes {first}-{last} are of another version now); load it again",
                    code="PreconditionFailed",
                    request_id=r.request_id,
                    domain=errors.CLIENT_DOMAIN,
                ) from r
            if isinstance(r, Exception):
                r.message = f"s3://{bucket}/{key} bytes {first}-{last}: {r.message} (did the object change during the load?)"
                r.args = (r.message,)
                raise r
            if r.etag != etag:
                raise errors.client_error(
                    errors.PreconditionFailed,
                    f"s3://{bucket}/{key} changed while it was loaded (ETag {etag} when the header was read, "
                    f"{r.etag} at bytes {first}-{last}); load it again",
                )
            if r.bytes_placed != it.length:
                raise errors.InvalidRange(
                    f"s3://{bucket}/{key} bytes {first}-{last}: got {r.bytes_placed} bytes, expected {it.length} "
                    "(the object is shorter than its header says)",
                    code="ShortRead",
                    domain=errors.CLIENT_DOMAIN,
                )


def _give_back_quietly(buf: Buffer) -> None:
    """Finalizer of a load's buffer: runs when its last tensor is gone. The
    client keeps it for the next load of the same size
    (:meth:`s3dma.Client.give_back`), so that load's bytes land in memory
    already faulted in."""
    try:
        c = buf._client
        if not buf.released and not c.closed and c._same_process():
            c.give_back(buf)
        else:
            buf.mmap.close()
    except Exception:
        pass  # a closed lease already released it in the shim


def _load_into_cuda(torch, c: Client, bucket: str, key: str, header, dtypes, dev, etag: str,
                    chunk_size: int, concurrency: int) -> Optional[Dict[str, Any]]:
    """The data section straight into GPU memory registered with the shim;
    None when the shim cannot register CUDA memory (built without the
    ``cuda`` feature, no driver there): the caller lands it in host memory."""
    gpu = torch.empty(header.data_len, dtype=torch.uint8, device=dev)
    try:
        cbuf, at = c.register_cuda_tensor(gpu, label="safetensors-cuda")
    except errors.Unsupported:
        return None
    try:
        _fetch(c, bucket, key, cbuf, header.data_start, header.data_len, etag, chunk_size, concurrency, at=at)
    finally:
        cbuf.release()  # the tensors keep the allocation; the shim lets go of its mapping
    out: Dict[str, Any] = {}
    for t in header.tensors:
        dt, item = dtypes[t.name], _DTYPES[t.dtype][1]
        if t.nbytes == 0:
            out[t.name] = torch.empty(t.shape, dtype=dt, device=dev)
            continue
        piece = gpu[t.begin : t.end]
        if t.begin % item:
            piece = piece.clone()  # view(dtype) needs an aligned offset
        out[t.name] = piece.view(dt).reshape(t.shape)
    return _ordered(out, header)


def load_file(
    url: str,
    device: Any = "cpu",
    *,
    client: Optional[Client] = None,
    socket: Optional[str] = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    concurrency: int = DEFAULT_CONCURRENCY,
    first_read: int = DEFAULT_FIRST_READ,
) -> Dict[str, Any]:
    """Loads ``s3://bucket/key`` like ``safetensors.torch.load_file``.

    ``device="cpu"``: the tensors are zero-copy views of one registered
    buffer (see the module doc for their lifetime). ``device="cuda[:n]"``:
    the data section is allocated on the GPU, registered with the shim
    (``Client.register_cuda_tensor``) and the chunks land there directly;
    a shim that cannot use CUDA memory makes it fall back to the next way.
    Another device: the data lands in host memory, is copied to the device
    in one transfer, and the host buffer is released before returning. ``client`` (default: one
    shared Client per process for ``socket``); ``chunk_size`` bytes per
    ranged GET, ``concurrency`` GETs at once; ``first_read`` bytes read for
    the header (a file that fits is read with that one GET)."""
    torch = _torch()
    dev = _device(torch, device)
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, not {chunk_size}")
    bucket, key = parse_url(url)
    c = _client(client, socket)
    header, first, placed, etag = _read_header(c, bucket, key, first_read)
    data_len = header.data_len
    try:
        dtypes = {t.name: _torch_dtype(torch, t.dtype, f"{url}: tensor {t.name!r}") for t in header.tensors}
        if data_len == 0 or header.data_start + data_len <= placed:
            buf, base = first, header.data_start  # the first read holds it all
        else:
            first.release()
            first = None
            buf, base = c.take_buffer(data_len, label="safetensors"), 0
    except BaseException:
        if first is not None:
            first.release()
        raise
    if dev.type == "cuda" and buf is not first:
        direct = _load_into_cuda(torch, c, bucket, key, header, dtypes, dev, etag, chunk_size, concurrency)
        if direct is not None:
            c.give_back(buf)
            return direct
    try:
        if buf is not first:
            _fetch(c, bucket, key, buf, header.data_start, data_len, etag, chunk_size, concurrency)
        mv = buf.memoryview()
        out: Dict[str, Any] = {}
        if dev.type == "cpu":
            for t in header.tensors:
                numel = t.nbytes // _DTYPES[t.dtype][1]
                if numel == 0:
                    out[t.name] = torch.empty(t.shape, dtype=dtypes[t.name])
                else:
                    out[t.name] = torch.frombuffer(mv, dtype=dtypes[t.name], count=numel, offset=base + t.begin).reshape(t.shape)
            # The tensors' storages hold `mv`, and `mv` holds the mapping:
            # release the buffer only when the last of them is gone.
            fin = weakref.finalize(mv, _give_back_quietly, buf)
            fin.atexit = False  # the lease ends with the process anyway
        else:
            # One host-to-device copy of the whole data section.
            gpu = torch.frombuffer(mv, dtype=torch.uint8, count=data_len, offset=base).to(dev) if data_len else None
            for t in header.tensors:
                dt, item = dtypes[t.name], _DTYPES[t.dtype][1]
                if t.nbytes == 0:
                    out[t.name] = torch.empty(t.shape, dtype=dt, device=dev)
                    continue
                piece = gpu[t.begin : t.end]  # type: ignore[index]
                if t.begin % item:
                    piece = piece.clone()  # view(dtype) needs an aligned offset
                out[t.name] = piece.view(dt).reshape(t.shape)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            del gpu
            mv.release()
            buf.release()
        return _ordered(out, header)
    except BaseException:
        buf.release()  # views made so far keep the mapping; the shim lets go
        raise


def _ordered(out: Dict[str, Any], header: Header) -> Dict[str, Any]:
    # safetensors.torch.load_file returns tensors in header order, which is
    # offset order for files it wrote.
    return {t.name: out[t.name] for t in header.tensors}


# -- save ---------------------------------------------------------------------


def _format_dtype(torch, dt) -> str:
    for name, (attr, _) in _DTYPES.items():
        if getattr(torch, attr, None) == dt:
            return name
    raise ValueError(f"dtype {dt} has no safetensors equivalent")


def serialize_header(entries: List[Tuple[str, str, Tuple[int, ...], int, int]], metadata: Optional[Mapping[str, str]]) -> bytes:
    """The 8-byte length + JSON header (space-padded to a multiple of 8),
    as safetensors writes it. ``entries``: (name, dtype, shape, begin, end)
    in data order."""
    doc: Dict[str, Any] = {}
    if metadata is not None:
        doc["__metadata__"] = dict(sorted(metadata.items()))
    for name, dtype, shape, begin, end in entries:
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]}
    js = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js


def save_file(
    tensors: Mapping[str, Any],
    url: str,
    metadata: Optional[Mapping[str, str]] = None,
    *,
    client: Optional[Client] = None,
    socket: Optional[str] = None,
    content_type: str = "",
) -> PutResult:
    """Writes ``tensors`` (name -> tensor, any device) to ``s3://bucket/key``
    in the safetensors format, as ``safetensors.torch.save_file`` would.
    Each tensor's bytes are copied once, into a registered buffer that is
    PUT and released. Returns the :class:`s3dma.PutResult`."""
    torch = _torch()
    bucket, key = parse_url(url)
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError("metadata must map strings to strings (safetensors' __metadata__)")
    rows = []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise ValueError(f"tensor names must be strings, not {name!r}")
        if name == "__metadata__":
            raise ValueError("'__metadata__' is reserved by the safetensors format; rename that tensor")
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name!r} is a {type(t).__name__}, not a torch.Tensor")
        if t.layout != torch.strided:
            raise ValueError(f"{name!r} is a {t.layout} tensor; safetensors stores dense tensors (use .to_dense())")
        rows.append((name, _format_dtype(torch, t.dtype), t))
    rows.sort(key=lambda r: (-_RANK[r[1]], r[0]))
    entries, off = [], 0
    for name, dtype, t in rows:
        n = t.numel() * t.element_size()
        entries.append((name, dtype, tuple(t.shape), off, off + n))
        off += n
    head = serialize_header(entries, metadata)
    total = len(head) + off
    c = _client(client, socket)
    buf = c.alloc(total, label="safetensors-save")
    try:
        buf.mmap[: len(head)] = head
        mv = buf.memoryview()
        try:
            for (name, dtype, shape, begin, end), (_, _, t) in zip(entries, rows):
                if end > begin:
                    dst = torch.frombuffer(mv, dtype=t.dtype, count=t.numel(), offset=len(head) + begin)
                    dst.view(t.shape).copy_(t.detach())  # the one copy (device to host included)
                    del dst
        finally:
            mv.release()
        return c.put_object_from(bucket, key, buf, 0, total, content_type=content_type)
    finally:
        buf.release()
