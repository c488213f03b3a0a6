"""s3dma.safetensors against a real `s3dma local`, checked with the real
safetensors package: files it wrote load through s3dma, files s3dma wrote
load through it (and are byte-identical), chunked loads, zero-copy views
and their lifetime, hostile headers, an overwrite during a load.

torch and safetensors are optional outside CI (the tests skip); under CI
($CI set) they are required and their absence fails.
"""

from __future__ import annotations

import gc
import json
import struct
import sys
import uuid

import pytest

from tenant_stack import BUCKET, require_module  # noqa: E402  (sets sys.path)

torch = require_module("torch", "torch safetensors")
st = require_module("safetensors.torch", "torch safetensors")

import s3dma  # noqa: E402
from s3dma import safetensors as s3st  # noqa: E402

MIB = 1 << 20


@pytest.fixture
def prefix():
    return f"st-{uuid.uuid4().hex[:12]}/"


def put_bytes(client, key: str, data: bytes) -> str:
    """Uploads ``data`` through a registered buffer; returns the ETag."""
    with client.alloc(max(len(data), 1)) as buf:
        buf.mmap[: len(data)] = data
        return client.put_object_from(BUCKET, key, buf, 0, len(data)).etag


def get_bytes(client, key: str) -> bytes:
    size = client.head(BUCKET, key).size
    with client.alloc(max(size, 1)) as buf:
        r = client.get_object_into(BUCKET, key, buf)
        return buf.mmap[: r.bytes_placed]


def all_dtypes() -> dict:
    g = torch.Generator().manual_seed(7)
    f = torch.randn(3, 5, generator=g)
    return {
        "f32": f,
        "f64": torch.randn(4, generator=g, dtype=torch.float64),
        "f16": f.to(torch.float16),
        "bf16": f.to(torch.bfloat16),
        "f8_e4m3": f.to(torch.float8_e4m3fn),
        "f8_e5m2": f.to(torch.float8_e5m2),
        "i64": torch.arange(-5, 6, dtype=torch.int64),
        "i32": torch.arange(7, dtype=torch.int32).reshape(7, 1),
        "i16": torch.arange(-3, 3, dtype=torch.int16),
        "i8": torch.arange(-128, 128, 3, dtype=torch.int8),
        "u8": torch.arange(0, 256, 5, dtype=torch.uint8),
        "u16": torch.arange(9, dtype=torch.int32).to(torch.uint16),
        "u32": torch.arange(9, dtype=torch.int64).to(torch.uint32),
        "u64": torch.arange(9, dtype=torch.int64).to(torch.uint64),
        "c64": torch.randn(3, generator=g, dtype=torch.complex64),
        "bool": torch.tensor([True, False, True]),
        "odd_bool": torch.tensor([[False], [True]]),
        "scalar": torch.tensor(3.5),
        "scalar_i8": torch.tensor(-2, dtype=torch.int8),
        "empty": torch.empty(0, 3),
        "empty_bf16": torch.empty(2, 0, dtype=torch.bfloat16),
    }


def assert_same(got: dict, want: dict):
    assert set(got) == set(want)
    for k, w in want.items():
        g = got[k]
        assert g.dtype == w.dtype and g.shape == w.shape and g.device.type == "cpu", k
        # Compare bytes (NaN-safe, and float8/uint types lack some ops).
        assert _raw(g) == _raw(w), k


def _raw(t) -> bytes:
    t = t.contiguous()
    if t.numel() == 0:
        return b""
    return bytes(t.reshape(-1).view(torch.uint8).numpy())


# ---------------------------------------------------------------------------
# header parsing (no server)
# ---------------------------------------------------------------------------


def _file(header: dict, data: bytes = b"", pad: bool = True) -> bytes:
    js = json.dumps(header).encode()
    if pad:
        js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js + data


def _parse(blob: bytes):
    (n,) = struct.unpack("<Q", blob[:8])
    return s3st.parse_header(blob[8 : 8 + n], len(blob), n)


@pytest.mark.parametrize(
    "header,data,match",
    [
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "past the end"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12, "overlap"),
        ({"a": {"dtype": "F31", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "unknown dtype"),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "needs 12"),
        ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "shape"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4, "end before"),
        ({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4, "data_offsets"),
        ({"a": [1, 2]}, b"", "must be an object"),
        ({"__metadata__": {"k": 1}}, b"", "strings"),
        ({"a": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}, b"\0", "sub-byte"),
    ],
    ids=["past-end", "overlap", "bad-dtype", "size-mismatch", "negative-shape", "reversed", "no-offsets",
         "not-object", "bad-metadata", "f4"],
)
def test_hostile_headers_are_clear_errors(header, data, match):
    with pytest.raises(s3st.InvalidSafetensors, match=match):
        _parse(_file(header, data))


def test_non_json_duplicates_and_bad_lengths_are_clear_errors():
    with pytest.raises(s3st.InvalidSafetensors, match="not JSON"):
        s3st.parse_header(b"{nope", 100, 5)
    with pytest.raises(s3st.InvalidSafetensors, match="not UTF-8"):
        s3st.parse_header(b"\xff\xfe", 100, 2)
    with pytest.raises(s3st.InvalidSafetensors, match="JSON object"):
        s3st.parse_header(b"[1]", 100, 3)
    with pytest.raises(s3st.InvalidSafetensors, match="twice"):
        s3st.parse_header(b'{"a":{},"a":{}}', 100, 15)
    with pytest.raises(s3st.InvalidSafetensors, match="too short"):
        s3st._header_len(b"\1\0\0", 3, "x")
    with pytest.raises(s3st.InvalidSafetensors, match="past the end"):
        s3st._header_len(struct.pack("<Q", 1000), 100, "x")
    with pytest.raises(s3st.InvalidSafetensors, match="limit"):
        s3st._header_len(struct.pack("<Q", 1 << 62), 1 << 63, "x")
    with pytest.raises(ValueError, match="s3://"):
        s3st.parse_url("data/key")
    with pytest.raises(ValueError, match="bucket and key"):
        s3st.parse_url("s3://data")


def test_serialized_header_matches_safetensors_bytes():
    d = all_dtypes()
    # safetensors writes __metadata__ in Rust HashMap order (random per
    # process); s3dma sorts it. Byte-identical up to one key, equal JSON after.
    for md in (None, {}, {"format": "pt"}, {"zz": "é\n\x01\"", "aa": "2", "format": "pt"}):
        want = st.save(d, metadata=md)
        (n,) = struct.unpack("<Q", want[:8])
        h = _parse(want)
        got = s3st.serialize_header([(t.name, t.dtype, t.shape, t.begin, t.end) for t in h.tensors], md)
        if md is None or len(md) <= 1:
            assert got == want[: 8 + n]
        else:
            assert len(got) == 8 + n and json.loads(got[8:]) == json.loads(want[8 : 8 + n])
            assert list(json.loads(got[8:])["__metadata__"]) == sorted(md)


# ---------------------------------------------------------------------------
# end to end
# ---------------------------------------------------------------------------


def test_load_files_written_by_safetensors(client, prefix, tmp_path):
    d = all_dtypes()
    md = {"format": "pt", "note": "héllo"}
    path = tmp_path / "m.safetensors"
    st.save_file(d, str(path), metadata=md)
    key = f"{prefix}m.safetensors"
    put_bytes(client, key, path.read_bytes())
    want = st.load_file(str(path))
    url = f"s3://{BUCKET}/{key}"
    # Whole file in the first read, then header-only first read (chunked
    # data), then a first read shorter than the header (a second GET).
    for kw in ({}, {"first_read": 64, "chunk_size": 16}, {"first_read": 16, "chunk_size": 7}):
        got = s3st.load_file(url, client=client, **kw)
        assert_same(got, want)
    h = s3st.read_header(url, client=client)
    assert h.metadata == md and {t.name for t in h.tensors} == set(d)
    # No metadata, and a file with no tensors at all.
    for dd in ({"x": torch.ones(2)}, {}):
        k2 = f"{prefix}{len(dd)}.safetensors"
        put_bytes(client, k2, st.save(dd))
        assert_same(s3st.load_file(f"s3://{BUCKET}/{k2}", client=client), dd)
        assert s3st.read_header(f"s3://{BUCKET}/{k2}", client=client).metadata is None


def test_misaligned_offsets_load(client, prefix):
    # Not what safetensors writes, but valid: an F32 tensor at byte 1.
    f = torch.tensor([1.5, -2.25])
    blob = _file(
        {"b": {"dtype": "BOOL", "shape": [1], "data_offsets": [0, 1]},
         "f": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]}},
        b"\x01" + _raw(f),
    )
    key = f"{prefix}misaligned.safetensors"
    put_bytes(client, key, blob)
    want = st.load(blob)
    assert_same(s3st.load_file(f"s3://{BUCKET}/{key}", client=client), want)
    got = s3st.load_file(f"s3://{BUCKET}/{key}", "meta", client=client)
    assert got["f"].dtype == torch.float32 and got["f"].shape == (2,)


def test_save_file_is_byte_identical_and_loads_in_safetensors(client, prefix):
    d = all_dtypes()
    d["noncontig"] = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # copied in logical order
    key = f"{prefix}saved.safetensors"
    want_d = {k: v.contiguous() for k, v in d.items()}
    for md in (None, {"format": "pt"}):
        r = s3st.save_file(d, f"s3://{BUCKET}/{key}", md, client=client)
        blob = get_bytes(client, key)
        assert r.size == len(blob)
        assert blob == st.save(want_d, metadata=md)
    md = {"format": "pt", "b": "2", "a": "1"}  # several keys: same bytes up to their order
    s3st.save_file(d, f"s3://{BUCKET}/{key}", md, client=client)
    blob = get_bytes(client, key)
    want = st.save(want_d, metadata=md)
    (n,) = struct.unpack("<Q", want[:8])
    assert len(blob) == len(want) and blob[8 + n :] == want[8 + n :]
    assert json.loads(blob[8 : 8 + n]) == json.loads(want[8 : 8 + n])
    assert_same(st.load(blob), want_d)
    # And back through s3dma.
    assert_same(s3st.load_file(f"s3://{BUCKET}/{key}", client=client), {k: v.contiguous() for k, v in d.items()})
    with pytest.raises(ValueError, match="reserved"):
        s3st.save_file({"__metadata__": torch.ones(1)}, f"s3://{BUCKET}/{key}", client=client)
    with pytest.raises(ValueError, match="strings"):
        s3st.save_file({"a": torch.ones(1)}, f"s3://{BUCKET}/{key}", {"n": 1}, client=client)


def test_multi_chunk_load_of_64_mib(client, prefix):
    g = torch.Generator().manual_seed(1)
    d = {
        "big": torch.randint(-(2**31), 2**31 - 1, (16 * MIB // 4 - 3,), dtype=torch.int32, generator=g).view(torch.float32),
        "mid": torch.randint(0, 2**15, (24 * MIB // 2,), dtype=torch.int16, generator=g).view(torch.bfloat16).reshape(-1, 1024),
        "tail": torch.randint(0, 255, (24 * MIB + 5,), dtype=torch.uint8, generator=g),
    }
    key = f"{prefix}big.safetensors"
    s3st.save_file(d, f"s3://{BUCKET}/{key}", client=client)
    got = s3st.load_file(f"s3://{BUCKET}/{key}", client=client, chunk_size=1 * MIB + 3, concurrency=8)
    assert_same(got, d)


def test_cpu_tensors_are_views_of_a_registered_buffer_that_lives_with_them(client, prefix):
    d = {"a": torch.arange(1000, dtype=torch.float32), "b": torch.ones(3, 3, dtype=torch.float16), "e": torch.empty(0)}
    key = f"{prefix}zc.safetensors"
    s3st.save_file(d, f"s3://{BUCKET}/{key}", client=client)
    for kw in ({}, {"first_read": 64}):  # data in the first read's buffer, or in its own
        got = s3st.load_file(f"s3://{BUCKET}/{key}", client=client, **kw)
        found = [client.find_buffer(got[k].data_ptr(), got[k].numel() * got[k].element_size()) for k in ("a", "b")]
        assert all(f is not None for f in found), "the tensors are not views of a registered buffer"
        assert found[0][0] is found[1][0], "the tensors should share one buffer"
        buf_id = found[0][0].id
        assert buf_id in {b.id for b in client.list_buffers()}
        del found
        # The tensors are writable views; a view of a view keeps the buffer too.
        view = got["a"][10:20]
        del got
        gc.collect()
        assert buf_id in {b.id for b in client.list_buffers()}
        assert view.tolist() == list(range(10, 20))
        del view
        gc.collect()
        # With the last tensor gone the buffer goes back to the client,
        # which keeps it for the next load of its size.
        assert buf_id in {b.id for b in client._kept_order}, "the buffer was not given back"
        client.release_kept()
        assert buf_id not in {b.id for b in client.list_buffers()}, "the buffer outlived its tensors"
    # Releasing the buffer by hand does not pull memory from under the tensors.
    got = s3st.load_file(f"s3://{BUCKET}/{key}", client=client)
    buf, _ = client.find_buffer(got["a"].data_ptr(), 4000)
    buf.release()
    assert torch.equal(got["a"], d["a"]) and torch.equal(got["b"], d["b"])


def test_a_second_load_reuses_the_first_loads_buffer(stack, prefix):
    """A load's buffer, given back when its tensors are gone, takes the next
    load of the same size (already faulted in); keep_bytes=0 keeps none."""
    d = {f"t{i}": torch.arange(i * 1000, i * 1000 + 300_000, dtype=torch.float32) for i in range(4)}
    url = f"s3://{BUCKET}/{prefix}reuse.safetensors"
    with s3dma.Client(stack.socket) as c:
        s3st.save_file(d, url, client=c)

        def load_and_id():
            got = s3st.load_file(url, client=c, first_read=4096)
            assert_same(got, d)
            buf, _ = c.find_buffer(got["t0"].data_ptr(), 4)
            return buf.id

        first = load_and_id()
        gc.collect()
        assert c.kept_bytes > 0
        again = load_and_id()
        assert again == first, "the second load did not reuse the kept buffer"
        gc.collect()
        # Kept buffers beyond keep_bytes are released, oldest first.
        c.keep_bytes = 0
        c.give_back(c.take_buffer(c.kept_bytes or 4096))
        assert c.kept_bytes == 0
        assert not [b for b in c.list_buffers() if b.label == "safetensors"]
    with s3dma.Client(stack.socket, keep_bytes=0) as c:
        ids = set()
        for _ in range(2):
            got = s3st.load_file(url, client=c, first_read=4096)
            ids.add(c.find_buffer(got["t0"].data_ptr(), 4)[0].id)
            del got
            gc.collect()
        assert len(ids) == 2 and c.kept_bytes == 0
        assert not [b for b in c.list_buffers() if b.label == "safetensors"]


def test_default_client_from_the_socket(stack, prefix, client):
    key = f"{prefix}sock.safetensors"
    d = {"w": torch.arange(6, dtype=torch.int64).reshape(2, 3)}
    s3st.save_file(d, f"s3://{BUCKET}/{key}", socket=stack.socket)
    assert_same(s3st.load_file(f"s3://{BUCKET}/{key}", socket=stack.socket), d)


def test_hostile_objects_are_clear_errors(client, prefix):
    cases = {
        "empty": (b"", "empty"),
        "short": (b"\1\2\3", "too short"),
        "len-past-end": (struct.pack("<Q", 1 << 20) + b"{}", "past the end"),
        "not-json": (struct.pack("<Q", 8) + b"not json", "not JSON"),
        "bad-dtype": (_file({"a": {"dtype": "Q8", "shape": [1], "data_offsets": [0, 1]}}, b"\0"), "unknown dtype"),
        "overlap": (_file({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                           "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, b"\0" * 6), "overlap"),
        "data-past-end": (_file({"a": {"dtype": "F64", "shape": [4], "data_offsets": [0, 32]}}, b"\0" * 31), "past the end"),
    }
    for name, (blob, match) in cases.items():
        key = f"{prefix}hostile-{name}"
        put_bytes(client, key, blob)
        for kw in ({}, {"first_read": 8}):
            with pytest.raises(s3st.InvalidSafetensors, match=match):
                s3st.load_file(f"s3://{BUCKET}/{key}", client=client, **kw)
    with pytest.raises(s3dma.NotFound):
        s3st.load_file(f"s3://{BUCKET}/{prefix}missing", client=client)
    # Nothing leaked: every buffer of those loads was released or given
    # back to the client (which keeps it for the next load).
    gc.collect()
    # (Loads with socket= went through the module's shared client, which
    # keeps its buffers too.)
    kept = {b.id for c in [client, *s3st._clients.values()] for b in c._kept_order}
    assert not [b for b in client.list_buffers() if b.label.startswith("safetensors") and b.id not in kept]


def test_an_overwrite_during_the_load_is_an_error_not_a_mix(stack, prefix):
    key = f"{prefix}race.safetensors"
    url = f"s3://{BUCKET}/{key}"
    with s3dma.Client(stack.socket) as c:
        s3st.save_file({"x": torch.zeros(1 << 18)}, url, client=c)
        real = c.get_objects

        def overwrite_then_get(items, concurrency=0, timeout=None):
            # Another writer replaces the object between the header read
            # and the data reads (same size, other bytes).
            s3st.save_file({"x": torch.ones(1 << 18)}, url, client=c)
            return real(items, concurrency=concurrency, timeout=timeout)

        c.get_objects = overwrite_then_get
        with pytest.raises(s3dma.PreconditionFailed, match="changed while it was loaded"):
            s3st.load_file(url, client=c, first_read=4096, chunk_size=256 << 10)
        c.get_objects = real
        assert torch.equal(s3st.load_file(url, client=c)["x"], torch.ones(1 << 18))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_cuda_without_cuda_is_a_clear_error(client, prefix):
    key = f"{prefix}cuda.safetensors"
    s3st.save_file({"x": torch.ones(2)}, f"s3://{BUCKET}/{key}", client=client)
    for dev in ("cuda", "cuda:0", torch.device("cuda")):
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            s3st.load_file(f"s3://{BUCKET}/{key}", dev, client=client)
    with pytest.raises(ValueError, match="not a torch device"):
        s3st.load_file(f"s3://{BUCKET}/{key}", "warp-drive", client=client)


def test_other_devices_get_a_copy(client, prefix):
    # "meta" stands in for an accelerator: the path that copies the data
    # section to the device in one transfer and releases the host buffer.
    key = f"{prefix}meta.safetensors"
    d = {"a": torch.arange(5, dtype=torch.float32), "odd": torch.tensor([True]), "h": torch.ones(3, dtype=torch.float16)}
    s3st.save_file(d, f"s3://{BUCKET}/{key}", client=client)
    before = {b.id for b in client.list_buffers()}
    got = s3st.load_file(f"s3://{BUCKET}/{key}", "meta", client=client)
    assert {k: (v.dtype, v.shape, v.device.type) for k, v in got.items()} == {
        k: (v.dtype, v.shape, "meta") for k, v in d.items()
    }
    assert {b.id for b in client.list_buffers()} == before


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a GPU that torch can use (the CUDA stand-in serves only the driver API the shim uses); "
    "runs on a GPU host with a host-shim built with the cuda feature",
)
def test_cuda_loads_land_in_registered_gpu_memory(client, prefix):
    key = f"{prefix}gpu.safetensors"
    url = f"s3://{BUCKET}/{key}"
    sd = {"w": torch.randn(1 << 20), "b": torch.arange(1000, dtype=torch.int64), "h": torch.ones(3, dtype=torch.float16)}
    s3st.save_file(sd, url, client=client)
    got = s3st.load_file(url, device="cuda", client=client, first_read=4096, chunk_size=1 << 20)
    for k, v in sd.items():
        assert got[k].is_cuda and torch.equal(got[k].cpu(), v), k
    # The registration was let go once the bytes were placed.
    assert not [b for b in client.list_buffers() if b.kind == "cuda"]
