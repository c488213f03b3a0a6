"""The fsspec filesystem ``s3dma://`` (python/s3dma/fs.py) against a
real `s3dma local` stack (see tenant_stack.py): fsspec's own abstract test
suites (copy, get, put, open, pipe), then reads, writes, listings, errors,
the registry and fork.

One stack per module; every test works under its own prefix of the
bucket "data".
"""

from __future__ import annotations

import gc
import hashlib
import os
import pickle
import random
import uuid
import warnings
from datetime import datetime

import pytest

from tenant_stack import BUCKET  # noqa: E402  (sets sys.path)

if os.environ.get("CI"):
    import fsspec  # CI installs the [fsspec] extra: missing is a failure there, not a skip
else:
    fsspec = pytest.importorskip("fsspec")
import fsspec.tests.abstract as abstract  # noqa: E402

import s3dma  # noqa: E402
from s3dma import errors  # noqa: E402
from s3dma.fs import ObjectChangedError, S3dmaFile, S3dmaFileSystem  # noqa: E402

KIB = 1024
MIB = 1024 * KIB


# ---------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------


@pytest.fixture
def fs(stack):
    return S3dmaFileSystem(socket=stack.socket)


@pytest.fixture
def base():
    """A fresh prefix of the bucket (no leading protocol)."""
    return f"{BUCKET}/fsspec-{uuid.uuid4().hex[:12]}"


def rand(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def sha(b) -> str:
    return hashlib.sha256(b).hexdigest()


# ---------------------------------------------------------------------------
# fsspec's abstract suites
# ---------------------------------------------------------------------------


class S3dmaFixtures(abstract.AbstractFixtures):
    @pytest.fixture
    def fs(self, stack):
        return S3dmaFileSystem(socket=stack.socket)

    @pytest.fixture
    def fs_path(self):
        return f"{BUCKET}/abstract-{uuid.uuid4().hex[:12]}"

    @pytest.fixture
    def fs_join(self):
        return lambda *parts: "/".join(parts)

    @pytest.fixture
    def supports_empty_directories(self):
        return False  # S3 prefixes exist only through their objects


class TestS3dmaCopy(abstract.AbstractCopyTests, S3dmaFixtures):
    pass


class TestS3dmaGet(abstract.AbstractGetTests, S3dmaFixtures):
    pass


class TestS3dmaPut(abstract.AbstractPutTests, S3dmaFixtures):
    pass


class TestS3dmaOpen(abstract.AbstractOpenTests, S3dmaFixtures):
    pass


class TestS3dmaPipe(abstract.AbstractPipeTests, S3dmaFixtures):
    pass


# ---------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------


def test_random_chunk_reads_equal_the_object(fs, base):
    data = rand(6 * MIB + 12345, 1)
    path = f"{base}/big.bin"
    fs.pipe_file(path, data)
    rng = random.Random(2)
    with fs.open(path, "rb", block_size=512 * KIB) as f:
        assert f.size == len(data) and f.info()["ETag"] == fs.info(path)["ETag"]
        # Sequential, in random chunk sizes: the SHA-256 of the whole.
        h = hashlib.sha256()
        while True:
            chunk = f.read(rng.randint(1, 900 * KIB))
            if not chunk:
                break
            h.update(chunk)
        assert h.hexdigest() == sha(data) and f.tell() == len(data)
        # Random seeks.
        for _ in range(60):
            at = rng.randrange(0, len(data))
            n = rng.randint(0, 2 * MIB)
            f.seek(at)
            assert f.read(n) == data[at : at + n]
            assert f.tell() == min(at + n, len(data))
    # Reads straight into a caller's buffer.
    with fs.open(path, "rb") as f:
        b = bytearray(100_000)
        f.seek(3 * MIB)
        assert f.readinto(b) == len(b) and bytes(b) == data[3 * MIB : 3 * MIB + len(b)]


def test_seek_and_tell(fs, base):
    data = rand(100_000, 3)
    path = f"{base}/s.bin"
    fs.pipe_file(path, data)
    with fs.open(path, "rb", block_size=8 * KIB) as f:
        assert f.tell() == 0 and f.seekable() and f.readable() and not f.writable()
        assert f.seek(10) == 10 and f.read(5) == data[10:15] and f.tell() == 15
        assert f.seek(100, 1) == 115 and f.read(3) == data[115:118]
        assert f.seek(-7, 2) == len(data) - 7 and f.read() == data[-7:]
        assert f.read(10) == b"" and f.tell() == len(data)
        f.seek(len(data) + 50)
        assert f.read(10) == b""
        with pytest.raises(ValueError):
            f.seek(-1)
        with pytest.raises(ValueError):
            f.seek(0, 3)
    with pytest.raises(ValueError):
        f.read(1)  # closed


def test_cat_file_with_start_and_end(fs, base):
    data = rand(200_000, 4)
    path = f"{base}/c.bin"
    fs.pipe_file(path, data)
    for start, end in [
        (None, None), (0, 10), (5, None), (-10, None), (None, -10), (-100, -50),
        (150_000, 300_000), (199_999, None), (200_000, None), (300_000, 400_000),
        (10, 10), (20, 10), (0, 200_000),
    ]:
        assert fs.cat_file(path, start, end) == data[start:end], (start, end)
    assert fs.cat(path) == data
    fs.pipe_file(f"{base}/empty", b"")
    assert fs.cat_file(f"{base}/empty") == b"" and fs.cat_file(f"{base}/empty", 0, 10) == b""
    assert fs.info(f"{base}/empty")["size"] == 0


def test_cat_ranges_reads_many_ranges_in_one_batch(fs, base, monkeypatch):
    objs = {f"{base}/r{i}": rand(300_000 + i * 1000, 10 + i) for i in range(3)}
    for p, d in objs.items():
        fs.pipe_file(p, d)
    rng = random.Random(5)
    paths, starts, ends = [], [], []
    for _ in range(150):
        p = rng.choice(list(objs))
        s = rng.randrange(0, 310_000)
        paths.append(p)
        starts.append(s)
        ends.append(s + rng.randint(0, 20_000))
    # Open and negative bounds (one HEAD per such object), and a start past the end.
    paths += [f"{base}/r0", f"{base}/r1", f"{base}/r2", f"{base}/r0"]
    starts += [-1000, None, 299_000, 400_000]
    ends += [None, -5, -1, 500_000]
    calls = []
    client = fs.client
    real = client.get_objects
    monkeypatch.setattr(client, "get_objects", lambda items, *a, **k: calls.append(len(items)) or real(items, *a, **k))
    got = fs.cat_ranges(paths, starts, ends)
    assert len(calls) == 1, f"expected one batched get_objects call, got {calls}"
    for p, s, e, g in zip(paths, starts, ends, got):
        assert g == objs[p][s:e], (p, s, e)
    # Per-range errors come back in place (on_error="return"), or raise.
    got = fs.cat_ranges([f"{base}/r0", f"{base}/missing", f"{base}/r1"], 0, 10)
    assert got[0] == objs[f"{base}/r0"][:10] and got[2] == objs[f"{base}/r1"][:10]
    assert isinstance(got[1], FileNotFoundError) and isinstance(got[1].__cause__, errors.NotFound)
    with pytest.raises(FileNotFoundError):
        fs.cat_ranges([f"{base}/missing"], 0, 10, on_error="raise")
    # cat of many paths is batched too.
    assert fs.cat([f"{base}/r0", f"{base}/r2"]) == {f"{base}/r0": objs[f"{base}/r0"], f"{base}/r2": objs[f"{base}/r2"]}
    assert fs.cat(base, recursive=True) == objs


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------


def test_a_write_of_several_mib_in_small_writes(fs, base):
    path = f"{base}/w.bin"
    data = rand(5 * MIB + 777, 6)
    rng = random.Random(7)
    with fs.open(path, "wb") as f:
        assert f.writable() and not f.readable()
        pos = 0
        while pos < len(data):
            n = rng.randint(1, 64 * KIB)
            assert f.write(memoryview(data)[pos : pos + n]) == len(data[pos : pos + n])
            pos += n
            if pos > 3 * MIB:
                assert not fs.exists(path), "nothing is visible before close"
        assert f.tell() == len(data)
        f.flush()  # a plain flush sends nothing
        assert not fs.exists(path)
    info = fs.info(path)
    assert info["size"] == len(data) and info["type"] == "file"
    assert sha(fs.cat_file(path)) == sha(data)
    # numpy arrays (any contiguous buffer) are written as their bytes.
    np = pytest.importorskip("numpy")
    arr = np.arange(1000, dtype=np.float32)
    with fs.open(f"{base}/np.bin", "wb", size=arr.nbytes) as f:
        f.write(arr)
    assert fs.cat_file(f"{base}/np.bin") == arr.tobytes()


def test_content_type_and_metadata(fs, base):
    with fs.open(f"{base}/m.json", "wb", metadata={"k": "v"}) as f:
        f.write(b"{}")
    info = fs.info(f"{base}/m.json")
    assert info["ContentType"] == "application/json" and info["Metadata"] == {"k": "v"}
    fs.pipe_file(f"{base}/t.bin", b"x", content_type="text/x-test")
    assert fs.info(f"{base}/t.bin")["ContentType"] == "text/x-test"
    # cp_file (GET + PUT through one buffer) keeps both.
    fs.cp_file(f"{base}/m.json", f"{base}/copy/m2")
    info2 = fs.info(f"{base}/copy/m2")
    assert info2["ContentType"] == "application/json" and info2["Metadata"] == {"k": "v"}
    assert fs.cat_file(f"{base}/copy/m2") == b"{}"


def test_a_failed_or_aborted_write_leaves_no_object(fs, base):
    path = f"{base}/aborted"
    with pytest.raises(RuntimeError):
        with fs.open(path, "wb") as f:
            f.write(rand(300 * KIB, 8))
            raise RuntimeError("boom")
    assert not fs.exists(path)
    # An aborted overwrite keeps the old object.
    fs.pipe_file(path, b"old")
    with pytest.raises(RuntimeError):
        with fs.open(path, "wb") as f:
            f.write(b"new")
            raise RuntimeError("boom")
    assert fs.cat_file(path) == b"old"
    # Explicit abort, and a file garbage-collected without close.
    f = fs.open(f"{base}/a2", "wb")
    f.write(b"x")
    f.abort()
    assert f.closed and not fs.exists(f"{base}/a2")
    f = fs.open(f"{base}/a3", "wb")
    f.write(b"x")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del f
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) for w in caught)
    assert not fs.exists(f"{base}/a3")
    # A PUT the store refuses raises, and nothing is left.
    with pytest.raises(FileNotFoundError, match="bucket 'no-such-bucket' does not exist"):
        with fs.open("no-such-bucket/x", "wb") as f:
            f.write(b"x")


def test_transactions_commit_at_the_end_or_not_at_all(fs, base):
    with fs.transaction:
        with fs.open(f"{base}/t1", "wb") as f:
            f.write(b"one")
        assert not fs.exists(f"{base}/t1")
    assert fs.cat_file(f"{base}/t1") == b"one"
    with pytest.raises(RuntimeError):
        with fs.transaction:
            with fs.open(f"{base}/t2", "wb") as f:
                f.write(b"two")
            raise RuntimeError("boom")
    assert not fs.exists(f"{base}/t2")


def test_exclusive_modes(fs, base):
    path = f"{base}/x"
    with fs.open(path, "xb") as f:
        f.write(b"1")
    with pytest.raises(FileExistsError):
        fs.open(path, "xb")
    with pytest.raises(FileExistsError):
        fs.pipe_file(path, b"2", mode="create")
    with pytest.raises(NotImplementedError, match="appended"):
        fs.open(path, "ab")
    assert fs.cat_file(path) == b"1"


def test_text_mode(fs, base):
    with fs.open(f"{base}/t.txt", "w", encoding="utf-8") as f:
        f.write("héllo\nwörld\n")
    with fs.open(f"{base}/t.txt", "r", encoding="utf-8") as f:
        assert f.readlines() == ["héllo\n", "wörld\n"]
    assert fs.read_text(f"{base}/t.txt", encoding="utf-8") == "héllo\nwörld\n"
    with fs.open(f"{base}/t.txt", "rb", block_size=4) as f:
        assert f.readline() == "héllo\n".encode() and f.tell() == 7 and list(f) == ["wörld\n".encode()]
    # An exception inside a text write's with-block discards it too.
    with pytest.raises(RuntimeError):
        with fs.open(f"{base}/t.txt", "w") as f:
            f.write("replaced?")
            raise RuntimeError("boom")
    assert fs.read_text(f"{base}/t.txt", encoding="utf-8") == "héllo\nwörld\n"


# ---------------------------------------------------------------------------
# listing, info, rm
# ---------------------------------------------------------------------------


def _tree(fs, base):
    files = {
        "a.txt": b"a",
        "d1/b.bin": b"bb",
        "d1/c.bin": b"ccc",
        "d1/sub/d.bin": b"dddd",
        "d1/sub/deep/e.bin": b"eeeee",
        "d1x.bin": b"f" * 6,  # same name prefix as d1, not inside it
        "d2/g": b"g" * 7,
    }
    for k, v in files.items():
        fs.pipe_file(f"{base}/{k}", v)
    return files


def test_ls_find_and_info_on_nested_prefixes(fs, base):
    files = _tree(fs, base)
    assert fs.ls(base, detail=False) == [f"{base}/{n}" for n in ("a.txt", "d1", "d1x.bin", "d2")]
    detail = {e["name"]: e for e in fs.ls(f"s3dma://{base}/d1/")}
    assert set(detail) == {f"{base}/d1/b.bin", f"{base}/d1/c.bin", f"{base}/d1/sub"}
    assert detail[f"{base}/d1/sub"]["type"] == "directory"
    f = detail[f"{base}/d1/c.bin"]
    assert f["type"] == "file" and f["size"] == 3 and f["ETag"] and isinstance(f["LastModified"], datetime)
    # ls of a file is the file; of nothing, an error.
    assert fs.ls(f"{base}/a.txt", detail=False) == [f"{base}/a.txt"]
    with pytest.raises(FileNotFoundError):
        fs.ls(f"{base}/nope")

    assert fs.find(base) == sorted(f"{base}/{k}" for k in files)
    assert fs.find(f"{base}/d1", maxdepth=1) == [f"{base}/d1/b.bin", f"{base}/d1/c.bin"]
    assert fs.find(f"{base}/d1", withdirs=True) == sorted(
        [f"{base}/d1", f"{base}/d1/sub", f"{base}/d1/sub/deep"]
        + [f"{base}/{k}" for k in files if k.startswith("d1/")]
    )
    assert fs.find(f"{base}/d1", maxdepth=2, withdirs=True) == sorted(
        [f"{base}/d1", f"{base}/d1/sub", f"{base}/d1/sub/deep"]
        + [f"{base}/d1/b.bin", f"{base}/d1/c.bin", f"{base}/d1/sub/d.bin"]
    )
    found = fs.find(f"{base}/d1", detail=True)
    assert found[f"{base}/d1/sub/deep/e.bin"]["size"] == 5
    assert fs.find(f"{base}/a.txt") == [f"{base}/a.txt"]
    assert fs.find(f"{base}/nope") == []
    assert sorted(fs.glob(f"{base}/d1/*.bin")) == [f"{base}/d1/b.bin", f"{base}/d1/c.bin"]
    assert fs.glob(f"s3dma://{base}/**/e.bin") == [f"{base}/d1/sub/deep/e.bin"]
    assert fs.du(f"{base}/d1") == 2 + 3 + 4 + 5

    assert fs.info(f"{base}/d1") == {"name": f"{base}/d1", "size": 0, "type": "directory"}
    assert fs.info(f"{base}/d1/sub/d.bin")["size"] == 4
    assert fs.info(BUCKET)["type"] == "directory"
    with pytest.raises(FileNotFoundError):
        fs.info(f"{base}/d1/su")
    assert fs.isdir(f"{base}/d1") and not fs.isfile(f"{base}/d1")
    assert fs.isfile(f"{base}/d1x.bin") and not fs.isdir(f"{base}/d1x.bin")
    assert fs.exists(f"{base}/d1/sub") and not fs.exists(f"{base}/d1/zz")
    assert fs.size(f"{base}/d2/g") == 7 and fs.sizes([f"{base}/a.txt", f"{base}/d2/g"]) == [1, 7]

    # ukey/checksum follow the ETag; modified/created are the last write.
    k1, c1, m1 = fs.ukey(f"{base}/a.txt"), fs.checksum(f"{base}/a.txt"), fs.modified(f"{base}/a.txt")
    assert m1.tzinfo is not None and fs.created(f"{base}/a.txt") == m1
    fs.pipe_file(f"{base}/a.txt", b"changed")
    assert fs.ukey(f"{base}/a.txt") != k1 and fs.checksum(f"{base}/a.txt") != c1
    with pytest.raises(IsADirectoryError):
        fs.modified(f"{base}/d1")


def test_rm_recursive_and_friends(fs, base):
    files = _tree(fs, base)
    fs.rm(f"{base}/d1", recursive=True)
    assert fs.find(base) == sorted(f"{base}/{k}" for k in files if not k.startswith("d1/"))
    assert fs.exists(f"{base}/d1x.bin"), "a sibling with the same name prefix survives"
    fs.rm_file(f"{base}/a.txt")
    assert not fs.exists(f"{base}/a.txt")
    fs.rm([f"{base}/d1x.bin", f"{base}/d2"], recursive=True)
    assert fs.find(base) == []
    fs.rm(f"{base}/gone")  # S3 semantics: deleting a missing key is no error
    with pytest.raises(FileNotFoundError):
        fs.rm(f"{base}/gone*")  # a glob that matches nothing is
    with pytest.raises(PermissionError):
        fs.rm_file(BUCKET)


def test_directories_follow_s3_semantics(fs, base):
    fs.mkdir(f"{base}/new")
    fs.makedirs(f"{base}/new/deeper", exist_ok=False)
    assert not fs.exists(f"{base}/new"), "an empty prefix does not exist"
    fs.touch(f"{base}/new/f")
    assert fs.isdir(f"{base}/new")
    with pytest.raises(OSError):
        fs.rmdir(f"{base}/new")  # not empty
    with pytest.raises(FileNotFoundError, match="does not exist"):
        fs.mkdir("no-such-bucket/dir")
    with pytest.raises(FileNotFoundError):
        fs.makedirs("no-such-bucket/a/b", exist_ok=True)


def test_get_file_and_put_file_through_registered_buffers(fs, base, tmp_path):
    data = rand(3 * MIB + 5, 9)
    local = tmp_path / "up.bin"
    local.write_bytes(data)
    fs.put_file(str(local), f"{base}/up.bin")
    assert sha(fs.cat_file(f"{base}/up.bin")) == sha(data)
    fs.put(str(local), f"{base}/up.txt")  # mimetypes guess
    assert fs.info(f"{base}/up.txt")["ContentType"] == "text/plain"
    down = tmp_path / "sub" / "down.bin"

    class Progress(fsspec.callbacks.Callback):
        pass

    cb = Progress()
    fs.get_file(f"{base}/up.bin", str(down), callback=cb)
    assert sha(down.read_bytes()) == sha(data) and cb.size == len(data) and cb.value == len(data)
    with pytest.raises(FileNotFoundError):
        fs.get_file(f"{base}/missing", str(tmp_path / "missing"))
    assert not (tmp_path / "missing").exists()
    fs.pipe_file(f"{base}/z", b"")
    fs.get_file(f"{base}/z", str(tmp_path / "z"))
    assert (tmp_path / "z").read_bytes() == b""


# ---------------------------------------------------------------------------
# errors and consistency
# ---------------------------------------------------------------------------


def test_errors_are_the_exceptions_fsspec_users_expect(fs, base):
    with pytest.raises(FileNotFoundError) as ei:
        fs.cat_file(f"{base}/missing")
    assert isinstance(ei.value.__cause__, errors.NotFound) and f"s3dma://{base}/missing" in str(ei.value)
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{base}/missing", 0, 10)
    with pytest.raises(FileNotFoundError):
        fs.open(f"{base}/missing", "rb")
    with pytest.raises(FileNotFoundError):
        fs.cp_file(f"{base}/missing", f"{base}/x")
    with pytest.raises(FileNotFoundError, match="bucket 'no-such-bucket' does not exist"):
        fs.ls("no-such-bucket")
    assert not fs.exists("no-such-bucket/x")
    fs.pipe_file(f"{base}/d/f", b"x")
    with pytest.raises(IsADirectoryError):
        fs.open(f"{base}/d", "rb")
    with pytest.raises(ValueError, match="names no bucket"):
        fs.cat_file("/")
    with pytest.raises(OSError, match="listing buckets"):
        fs.ls("")


def test_a_read_racing_an_overwrite_raises_instead_of_mixing_versions(fs, base):
    path = f"{base}/race.bin"
    v1, v2 = rand(MIB, 11), rand(MIB, 12)
    fs.pipe_file(path, v1)
    with fs.open(path, "rb", block_size=64 * KIB) as f:
        assert f.read(1000) == v1[:1000]
        fs.pipe_file(path, v2)  # same size, other bytes
        f.seek(512 * KIB)
        with pytest.raises(ObjectChangedError) as ei:
            f.read(1000)
        assert isinstance(ei.value, OSError) and isinstance(ei.value.__cause__, errors.PreconditionFailed)
    with fs.open(path, "rb", block_size=64 * KIB) as f:
        assert f.read(10) == v2[:10]
        fs.rm_file(path)
        f.seek(700 * KIB)
        with pytest.raises(FileNotFoundError):
            f.read(10)


# ---------------------------------------------------------------------------
# registry, pickling, fork
# ---------------------------------------------------------------------------


def test_the_registry_knows_s3dma(stack, base, monkeypatch):
    assert fsspec.get_filesystem_class("s3dma") is S3dmaFileSystem
    monkeypatch.setenv("S3DMA_SOCKET", stack.socket)
    with fsspec.open(f"s3dma://{base}/x", "wb") as f:
        f.write(b"through the registry")
    with fsspec.open(f"s3dma://{base}/x", "rb") as f:
        assert isinstance(f, S3dmaFile) and f.read() == b"through the registry"
    fs2, path = fsspec.url_to_fs(f"s3dma://{base}/x")
    assert isinstance(fs2, S3dmaFileSystem) and path == f"{base}/x"
    with fsspec.open(f"s3dma://{base}/x.gz", "wt", compression="gzip", socket=stack.socket) as f:
        f.write("compressed text")
    with fsspec.open(f"s3dma://{base}/x.gz", "rt", compression="infer", socket=stack.socket) as f:
        assert f.read() == "compressed text"
    m = fsspec.get_mapper(f"s3dma://{base}/map", socket=stack.socket)
    m["k/1"] = b"v1"
    assert m["k/1"] == b"v1" and list(m) == ["k/1"]


def test_a_given_client_and_pickling(stack, base):
    with s3dma.Client(stack.socket) as c:
        fs = S3dmaFileSystem(client=c, skip_instance_cache=True)
        assert fs.client is c
        fs.pipe_file(f"{base}/p", b"given")
        clone = pickle.loads(pickle.dumps(fs))
        assert clone.client is not c and clone.socket == c.socket
        assert clone.cat_file(f"{base}/p") == b"given"
        with fs.open(f"{base}/p", "rb") as f:
            f.read(1)
            g = pickle.loads(pickle.dumps(f))
            assert g.read() == b"iven"
    with pytest.raises(TypeError):
        S3dmaFileSystem(client="not a client")


def test_use_after_fork(fs, base):
    fs.pipe_file(f"{base}/before", b"parent wrote this")
    assert fs.cat_file(f"{base}/before") == b"parent wrote this"  # the parent's client is live
    parent_client = fs.client
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the same fs object, and the instance fsspec hands out
        code = 1
        try:
            os.close(r)
            got = fs.cat_file(f"{base}/before")
            assert fs.client is not parent_client
            fs2 = fsspec.filesystem("s3dma", socket=fs.socket)
            fs2.pipe_file(f"{base}/child", b"child wrote this")
            with fs2.open(f"{base}/before", "rb", block_size=4) as f:
                part = f.read(6)
            os.write(w, got + b"|" + part)
            code = 0
        except BaseException as e:  # report, never return into pytest
            os.write(w, repr(e).encode())
        finally:
            os._exit(code)
    os.close(w)
    out = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        out += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    assert out == b"parent wrote this|parent"
    assert fs.client is parent_client and fs.cat_file(f"{base}/child") == b"child wrote this"
