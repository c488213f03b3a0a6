"""Recursive transfers (python/s3dma/transfer.py:
``s3dma.download_prefix`` and ``s3dma.upload_dir``, the contract of the
CLI's ``get/put --recursive`` and ``sync``) against a real `s3dma local`
stack (see tenant_stack.py), with boto3 on the same storage-target as the
independent view of the bucket.

One stack per module; every test works under its own prefix of the bucket
"data" and its own tmp_path. The AccessDenied test adds a second dpu-agent
and host-shim in front of the same storage-target whose tenant may use the
bucket "data" only.
"""

from __future__ import annotations

import hashlib
import os
import queue
import random
import shutil
import socket as _socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Dict

import pytest

import tenant_stack
from tenant_stack import BUCKET  # noqa: E402  (sets sys.path)

import s3dma  # noqa: E402
from s3dma import transfer  # noqa: E402

KIB = 1024
MIB = 1024 * KIB


# ---------------------------------------------------------------------------
# helpers and fixtures
# ---------------------------------------------------------------------------


def rand(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def make_tree(root: Path, files: Dict[str, bytes]) -> None:
    for rel, data in files.items():
        p = root.joinpath(*rel.split("/"))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def local_tree(root: Path) -> Dict[str, str]:
    """rel -> sha256 of every regular file (symlinks and our temp names left out)."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            if p.is_symlink() or transfer.TEMP_RE.match(n):
                continue
            out[p.relative_to(root).as_posix()] = sha(p.read_bytes())
    return out


def temp_files(root: Path) -> list:
    return [p for p in root.rglob("*") if transfer.TEMP_RE.match(p.name)]


def s3_tree(s3, prefix: str) -> Dict[str, str]:
    """rel -> sha256 of every object under the prefix, read with boto3."""
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for o in page.get("Contents", []):
            body = s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
            assert len(body) == o["Size"]
            out[o["Key"][len(prefix) :]] = sha(body)
    return out


def s3_keys(s3, prefix: str) -> Dict[str, dict]:
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix) :]] = o
    return out


@pytest.fixture(scope="module")
def s3(stack):
    """boto3 on the stack's storage-target, with the tenant's key."""
    boto3 = pytest.importorskip("boto3")
    import yaml
    from botocore.config import Config

    agent = yaml.safe_load((stack.dir / "dpu-agent.yaml").read_text())
    return boto3.client(
        "s3",
        endpoint_url=agent["targets"][0]["endpoint"],
        aws_access_key_id=(stack.dir / "secrets" / "tenant.access-key-id").read_text().strip(),
        aws_secret_access_key=(stack.dir / "secrets" / "tenant.secret").read_text().strip(),
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


@pytest.fixture
def prefix():
    return f"tx-{uuid.uuid4().hex[:12]}/"


@pytest.fixture
def url(prefix):
    return f"s3://{BUCKET}/{prefix}"


# ---------------------------------------------------------------------------
# pure helpers
# ---------------------------------------------------------------------------


def test_parse_url_appends_a_slash():
    assert transfer.parse_url("s3://b/p") == ("b", "p/")
    assert transfer.parse_url("s3://b/p/") == ("b", "p/")
    assert transfer.parse_url("s3://b") == ("b", "")
    assert transfer.parse_url("s3://b/") == ("b", "")
    for bad in ("b/p", "s3:///p", "s3://b b/p", "s3://b/p\n", "http://b/p"):
        with pytest.raises(ValueError):
            transfer.parse_url(bad)


def test_unsafe_names_and_filters():
    for rel in ("../escape", "a//b", "./x", "a/./b", "a/..", "/abs", "a\0b", "x" * 256, "a/" + "é" * 128):
        assert transfer.unsafe_name(rel), rel
    # Control characters never become file names (terminal escapes, line breaks).
    for rel in ("bell\a", "new\nline", "tab\tx", "esc\x1b[31m", "del\x7f", "c1\x9b", "d\x01/x"):
        assert transfer.unsafe_name(rel), repr(rel)
    assert not transfer.unsafe_name("nbsp\xa0/\u202ex")
    for rel in ("a", "a/b/c", "sp ace/ü.txt", "..a/b..", ".hidden", "x" * 255, "é" * 127):
        assert not transfer.unsafe_name(rel), rel
    # Every name is selected at first; the last matching filter decides; * crosses /.
    rules = transfer._rules((), (), [("exclude", "*"), ("include", "*.txt"), ("exclude", "logs/*")])
    assert transfer.selected(rules, "a/b.txt") and not transfer.selected(rules, "a/b.bin")
    assert not transfer.selected(rules, "logs/x.txt") and not transfer.selected(rules, "logs/deep/x.txt")
    # include= alone selects nothing more than no filter at all (aws semantics);
    # exclude= applies first, then include=.
    assert transfer.selected(transfer._rules(["*.txt"], (), ()), "a.bin")
    rules = transfer._rules(include=["keep/*"], exclude=["*"], filters=())
    assert transfer.selected(rules, "keep/a") and not transfer.selected(rules, "other/a")
    assert transfer.selected(transfer._rules("?.bin", "*", ()), "a.bin")
    assert not transfer.selected(transfer._rules("?.bin", "*", ()), "ab.bin")
    assert transfer.selected(transfer._rules((), "[!a]*", ()), "a1")
    with pytest.raises(ValueError):
        transfer._rules(["a"], (), [("include", "b")])
    with pytest.raises(ValueError):
        transfer._rules((), (), [("keep", "b")])


def test_temp_names_fit_and_match():
    for name in ("a", "sp ace.txt", "é" * 127, "x" * 255):
        t = transfer.temp_name(name)
        assert len(t.encode()) <= 255 and transfer.TEMP_RE.match(t), t
        t.encode("utf-8")  # never a split character
    assert transfer.temp_name("f").startswith(".f.s3dma-")
    assert not transfer.TEMP_RE.match(".f.s3dma-0123.tmp")
    assert transfer.escape('a\n"b"\0\x7f\\ü\u202e') == 'a\\n"b"\\u{0}\\u{7f}\\\\ü\\u{202e}'


def test_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="needs sync=True"):
        s3dma.upload_dir(tmp_path, "s3://data/x", delete=True, socket="/nonexistent")
    with pytest.raises(ValueError, match="s3://"):
        s3dma.download_prefix("data/x", tmp_path, socket="/nonexistent")
    with pytest.raises(FileNotFoundError):
        s3dma.upload_dir(tmp_path / "missing", "s3://data/x", socket="/nonexistent")
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        s3dma.download_prefix("s3://data/x", tmp_path / "f", socket="/nonexistent")
    with pytest.raises(ValueError, match="concurrency"):
        s3dma.download_prefix("s3://data/x", tmp_path, concurrency=0, socket="/nonexistent")


class _FakeBuffer:
    def __init__(self, size: int):
        self.size = size
        self.mmap = bytearray(size)


def test_a_file_that_changes_size_while_read_fails(tmp_path, monkeypatch):
    f = tmp_path / "f"
    f.write_bytes(b"x" * 1000)
    root_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        buf = _FakeBuffer(4096)
        assert transfer._read_file(str(tmp_path), root_fd, ["f"], buf) == 1000
        assert bytes(buf.mmap[:1000]) == b"x" * 1000
        with pytest.raises(s3dma.S3dmaError, match="grew") as ei:
            transfer._read_file(str(tmp_path), root_fd, ["f"], _FakeBuffer(999))
        assert ei.value.code == "FileChanged"
        # Appended to, then truncated, between two reads.
        monkeypatch.setattr(transfer, "_READ_STEP", 100)
        real_readv = os.readv
        for change in (lambda: f.open("ab").write(b"more"), lambda: os.truncate(f, 500)):
            f.write_bytes(b"x" * 1000)
            calls = []

            def readv(fd, bufs, change=change):
                calls.append(1)
                if len(calls) == 2:
                    change()
                return real_readv(fd, bufs)

            monkeypatch.setattr(os, "readv", readv)
            with pytest.raises(s3dma.S3dmaError) as ei:
                transfer._read_file(str(tmp_path), root_fd, ["f"], _FakeBuffer(4096))
            assert ei.value.code == "FileChanged", ei.value
            monkeypatch.setattr(os, "readv", real_readv)
    finally:
        os.close(root_fd)


def test_an_upload_reads_only_the_file_the_walk_saw(tmp_path):
    """``upload_dir``'s open-and-check: after the walk recorded ``f``, it
    is swapped for a symlink to a file the attacker wants read, or replaced
    by another regular file; both are refused, the bytes never read."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("f", "g"):
        (src / name).write_bytes(b"mine")
    secret = tmp_path / "secret"
    secret.write_bytes(b"secret")
    tree = transfer._walk(str(src))
    root_fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    try:
        buf = _FakeBuffer(64)
        assert transfer._read_file(str(src), root_fd, ["f"], buf, tree.files["f"]) == 4
        assert bytes(buf.mmap[:4]) == b"mine"
        (src / "f").unlink()
        os.symlink(secret, src / "f")
        buf = _FakeBuffer(64)
        with pytest.raises(s3dma.S3dmaError, match="symlink") as ei:
            transfer._read_file(str(src), root_fd, ["f"], buf, tree.files["f"])
        assert ei.value.code == "SymlinkInPath"
        other = src / "other"
        other.write_bytes(b"evil")
        os.rename(other, src / "g")
        with pytest.raises(s3dma.S3dmaError, match="replaced") as ei:
            transfer._read_file(str(src), root_fd, ["g"], buf, tree.files["g"])
        assert ei.value.code == "FileChanged"
        assert b"secret" not in bytes(buf.mmap) and b"evil" not in bytes(buf.mmap)
    finally:
        os.close(root_fd)


# ---------------------------------------------------------------------------
# end to end
# ---------------------------------------------------------------------------

TREE = {
    "top.bin": rand(10 * KIB, 1),
    "a/b/c/deep.bin": rand(3000, 2),
    "a/b/sibling.txt": b"hello\n",
    "a/empty": b"",
    "empty-top": b"",
    "sp ace/ü nicode ✓ 名前.txt": "grüße ✓".encode(),
    "sp ace/with  two spaces": rand(77, 3),
    "big/multi-chunk.bin": rand(3 * MIB + MIB // 2, 4),  # 4 chunks of 1 MiB
}


def test_upload_then_download_round_trip(client, s3, url, prefix, tmp_path):
    src = tmp_path / "src"
    make_tree(src, TREE)
    want = {rel: sha(data) for rel, data in TREE.items()}
    total = sum(len(d) for d in TREE.values())

    calls = []
    up = s3dma.upload_dir(src, url, client=client, chunk_size=MIB, progress=lambda d, t: calls.append((d, t)))
    assert (up.files, up.bytes, up.skipped, up.up_to_date, up.deleted, up.failures) == (len(TREE), total, 0, 0, 0, [])
    assert calls[0] == (0, total) and calls[-1] == (total, total)
    assert all(a[0] <= b[0] for a, b in zip(calls, calls[1:]))
    assert str(up).startswith(f"{len(TREE)} files, ")
    # boto3 sees exactly those keys, byte for byte.
    assert s3_tree(s3, prefix) == want

    dst = tmp_path / "dst"
    calls.clear()
    down = s3dma.download_prefix(url, dst, client=client, chunk_size=MIB, progress=lambda d, t: calls.append((d, t)))
    assert (down.files, down.bytes, down.skipped, down.failures) == (len(TREE), total, 0, [])
    assert calls[-1] == (total, total)
    assert local_tree(dst) == want
    assert (dst / "a" / "empty").stat().st_size == 0
    assert not temp_files(dst)
    # mtime = the object's LastModified.
    listed = s3_keys(s3, prefix)
    for rel, o in listed.items():
        mtime = dst.joinpath(*rel.split("/")).stat().st_mtime
        assert int(mtime) == int(o["LastModified"].timestamp()), rel

    # The bucket root as prefix (s3://data) would list other tests' keys:
    # a URL without the trailing slash is the same prefix.
    again = s3dma.download_prefix(url.rstrip("/"), tmp_path / "dst2", client=client)
    assert again.files == len(TREE) and local_tree(tmp_path / "dst2") == want


def test_directory_markers_are_skipped(stack, s3, url, prefix, tmp_path):
    s3.put_object(Bucket=BUCKET, Key=prefix + "dir/", Body=b"")
    s3.put_object(Bucket=BUCKET, Key=prefix + "dir/f", Body=b"f")
    s3.put_object(Bucket=BUCKET, Key=prefix.rstrip("/"), Body=b"not under the prefix")
    r = s3dma.download_prefix(url, tmp_path, socket=stack.socket)  # its own client
    assert (r.files, r.skipped) == (1, 1)
    assert local_tree(tmp_path) == {"dir/f": sha(b"f")}


def test_filters_in_order(client, s3, url, prefix, tmp_path):
    files = {
        "a.txt": b"a",
        "b.bin": b"b",
        "logs/x.txt": b"x",
        "logs/keep-1.log": b"k",
        "logs/deep/y.log": b"y",
    }
    make_tree(tmp_path / "src", files)
    # Everything is in at first; exclude= first, then include=; * crosses /.
    r = s3dma.upload_dir(tmp_path / "src", url, client=client, exclude=["*"], include=["*.txt", "logs/keep*"])
    assert r.files == 3
    assert set(s3_keys(s3, prefix)) == {"a.txt", "logs/x.txt", "logs/keep-1.log"}
    # An ordered list: the last matching filter decides.
    r = s3dma.download_prefix(
        url,
        tmp_path / "d1",
        client=client,
        filters=[("exclude", "logs/*"), ("include", "logs/keep*"), ("exclude", "*.log")],
    )
    assert set(local_tree(tmp_path / "d1")) == {"a.txt"}
    r = s3dma.download_prefix(
        url, tmp_path / "d2", client=client, filters=[("exclude", "*.log"), ("include", "logs/keep*")]
    )
    assert set(local_tree(tmp_path / "d2")) == {"a.txt", "logs/x.txt", "logs/keep-1.log"}
    # include= alone excludes nothing (every file is included at first).
    r = s3dma.download_prefix(url, tmp_path / "d3", client=client, include=["*.txt"])
    assert r.files == 3


def test_sync_copies_nothing_the_second_time(client, s3, url, prefix, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src, TREE)
    n = len(TREE)
    r = s3dma.upload_dir(src, url, client=client, sync=True, chunk_size=MIB)
    assert (r.files, r.up_to_date) == (n, 0)
    r = s3dma.upload_dir(src, url, client=client, sync=True, chunk_size=MIB)
    assert (r.files, r.bytes, r.up_to_date, r.deleted) == (0, 0, n, 0)
    r = s3dma.download_prefix(url, dst, client=client, sync=True, chunk_size=MIB)
    assert (r.files, r.up_to_date) == (n, 0)
    r = s3dma.download_prefix(url, dst, client=client, sync=True, chunk_size=MIB)
    assert (r.files, r.up_to_date) == (0, n)

    # Upload: a size change is copied; same size and older is not.
    (src / "top.bin").write_bytes(rand(10 * KIB + 1, 9))
    old = time.time() - 3600
    (src / "a" / "b" / "sibling.txt").write_bytes(b"HELLO\n")
    os.utime(src / "a" / "b" / "sibling.txt", (old, old))
    r = s3dma.upload_dir(src, url, client=client, sync=True)
    assert (r.files, r.up_to_date) == (1, n - 1)
    assert s3_tree(s3, prefix)["top.bin"] == sha(rand(10 * KIB + 1, 9))
    # ... but same size and newer is.
    os.utime(src / "a" / "b" / "sibling.txt", (time.time() + 3600,) * 2)
    r = s3dma.upload_dir(src, url, client=client, sync=True)
    assert (r.files, r.up_to_date) == (1, n - 1)

    # Download: the two changed objects (one by size, one newer than the
    # local copy of the same size: made older than any upload here, since
    # both uploads may fall in one second).
    os.utime(dst / "a" / "b" / "sibling.txt", (old, old))
    r = s3dma.download_prefix(url, dst, client=client, sync=True)
    assert (r.files, r.up_to_date) == (2, n - 2)
    assert local_tree(dst) == local_tree(src)
    # A local file older than its object, same size: copied again.
    os.utime(dst / "empty-top", (old, old))
    r = s3dma.download_prefix(url, dst, client=client, sync=True)
    assert (r.files, r.up_to_date) == (1, n - 1)


def test_sync_delete_download(client, s3, url, prefix, tmp_path):
    make_tree(tmp_path / "src", {"keep.txt": b"k", "d/keep2": b"k2"})
    s3dma.upload_dir(tmp_path / "src", url, client=client)
    dst = tmp_path / "dst"
    make_tree(dst, {"extra.txt": b"x", "d/extra": b"x", "d/e/f": b"x", "notes.md": b"mine", "keep.txt": b"old!"})
    own_temp = dst / ".extra.txt.s3dma-0123456789abcdef.tmp"
    own_temp.write_bytes(b"t")
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"o")
    (dst / "link").symlink_to(outside)
    r = s3dma.download_prefix(url, dst, client=client, sync=True, delete=True, exclude=["*.md"])
    assert (r.files, r.deleted, r.failures) == (2, 3, [])
    assert local_tree(dst) == {"keep.txt": sha(b"k"), "d/keep2": sha(b"k2"), "notes.md": sha(b"mine")}
    assert own_temp.exists() and (dst / "link").is_symlink() and outside.read_bytes() == b"o"
    # Nothing left to do.
    r = s3dma.download_prefix(url, dst, client=client, sync=True, delete=True, exclude=["*.md"])
    assert (r.files, r.deleted, r.up_to_date) == (0, 0, 2)


def test_sync_delete_upload(client, s3, url, prefix, tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"keep.txt": b"k", "d/keep2": b"k2"})
    for k in ("extra.txt", "d/extra", "d/e/f", "notes.md", "marker/", "keep.txt"):
        s3.put_object(Bucket=BUCKET, Key=prefix + k, Body=b"remote")
    r = s3dma.upload_dir(src, url, client=client, sync=True, delete=True, exclude=["*.md"])
    assert (r.files, r.deleted, r.failures) == (2, 3, [])
    assert s3_tree(s3, prefix) == {
        "keep.txt": sha(b"k"),
        "d/keep2": sha(b"k2"),
        "notes.md": sha(b"remote"),
        "marker/": sha(b"remote"),
    }
    # Deletion is skipped when a copy failed.
    s3.put_object(Bucket=BUCKET, Key=prefix + "gone", Body=b"g")
    (src / "bad\udcff").write_bytes(b"x")  # not UTF-8: fails per file
    with pytest.raises(s3dma.TransferError) as ei:
        s3dma.upload_dir(src, url, client=client, sync=True, delete=True)
    assert [(n, e.code) for n, e in ei.value.failures] == [("bad\udcff", "InvalidFileName")]
    assert "bad\\xff" in str(ei.value.failures[0][1]) and ei.value.code == "InvalidFileName"
    assert ei.value.summary.deleted == 0 and "gone" in s3_keys(s3, prefix)


def test_interrupted_sync_resumes(client, s3, url, prefix, tmp_path):
    files = {"a.bin": rand(100 * KIB, 1), "b-big.bin": rand(3 * MIB + MIB // 2, 2)}
    files.update({f"c/{i}.bin": rand(20 * KIB + i, 10 + i) for i in range(4)})
    make_tree(tmp_path / "src", files)
    s3dma.upload_dir(tmp_path / "src", url, client=client)
    dst = tmp_path / "dst"

    def interrupt(done, total):
        if done >= 100 * KIB + MIB:  # a.bin and the big file's first chunk
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        s3dma.download_prefix(url, dst, client=client, sync=True, chunk_size=MIB, concurrency=1, progress=interrupt)
    assert not temp_files(dst)
    got = local_tree(dst)
    # a.bin is complete; the big file normally is not (the worker may have
    # run ahead of this thread on a busy machine: what was renamed is whole).
    assert "a.bin" in got
    for rel, h in got.items():  # only complete files
        assert h == sha(files[rel]), rel
    r = s3dma.download_prefix(url, dst, client=client, sync=True, chunk_size=MIB)
    assert (r.files, r.up_to_date) == (len(files) - len(got), len(got))
    assert local_tree(dst) == {rel: sha(d) for rel, d in files.items()}

    # Interrupted uploads: no partial object, the rest goes up on resume.
    url2 = url + "up/"

    def after_first_file(done, total):
        if done:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        s3dma.upload_dir(tmp_path / "src", url2, client=client, concurrency=1, progress=after_first_file)
    up = s3_tree(s3, prefix + "up/")
    assert len(up) >= 1 and all(v == sha(files[k]) for k, v in up.items())
    r = s3dma.upload_dir(tmp_path / "src", url2, client=client, sync=True)
    assert (r.files, r.up_to_date) == (len(files) - len(up), len(up))


def test_hostile_keys_are_refused(client, s3, url, prefix, tmp_path):
    for k in ("../escape", "a//b", "./x", "../../up/f", "ok", "sub/fine"):
        s3.put_object(Bucket=BUCKET, Key=prefix + k, Body=b"data")
    dst = tmp_path / "inner" / "dl"
    with pytest.raises(s3dma.TransferError) as ei:
        s3dma.download_prefix(url, dst, client=client)
    e = ei.value
    assert isinstance(e, s3dma.S3dmaError) and e.code == "UnsafeKey"
    assert sorted(n for n, _ in e.failures) == sorted(["../escape", "a//b", "./x", "../../up/f"])
    for n, f in e.failures:
        assert f.code == "UnsafeKey" and f"unsafe key: {prefix}{n}" in str(f)
        assert n in str(e)
    assert e.summary.files == 2
    assert local_tree(dst) == {"ok": sha(b"data"), "sub/fine": sha(b"data")}
    # Nothing outside the directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inner"]
    assert [p.name for p in (tmp_path / "inner").iterdir()] == ["dl"]
    # Excluded hostile keys are not failures.
    r = s3dma.download_prefix(url, tmp_path / "inner" / "dl2", client=client, exclude=["*.*", "a//*", "../*"])
    assert r.files == 2 and r.failures == []


def test_symlinks_are_never_followed(client, s3, url, prefix, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    src = tmp_path / "src"
    make_tree(src, {"real": b"r"})
    (src / "file-link").symlink_to(outside / "secret")
    (src / "dir-link").symlink_to(outside)
    r = s3dma.upload_dir(src, url, client=client)
    assert (r.files, r.skipped) == (1, 2)
    assert set(s3_keys(s3, prefix)) == {"real"}

    # Downloads refuse a symlinked directory or file on the way.
    for k in ("dir-link/secret", "file-link", "real"):
        s3.put_object(Bucket=BUCKET, Key=prefix + k, Body=b"overwritten")
    with pytest.raises(s3dma.TransferError) as ei:
        s3dma.download_prefix(url, src, client=client)
    fails = {n: e for n, e in ei.value.failures}
    assert set(fails) == {"dir-link/secret", "file-link"}
    assert all(e.code == "SymlinkInPath" and "refusing to write through a symlink" in str(e) for e in fails.values())
    assert (outside / "secret").read_bytes() == b"secret"
    assert (src / "file-link").is_symlink() and (src / "dir-link").is_symlink()
    assert (src / "real").read_bytes() == b"overwritten"
    assert not temp_files(src) and not temp_files(outside)


def test_registered_memory_stays_bounded(client, url, tmp_path):
    files = {f"f{i}": rand(300 * KIB, i) for i in range(6)}
    files["big"] = rand(3 * MIB + 5, 99)
    make_tree(tmp_path / "src", files)
    seen = []

    def watch(done, total):
        seen.append(sum(b.size for b in client.list_buffers()))

    # Upload: pooled slots for small files, and the big one (larger than
    # max_memory: PutObject takes it from one buffer) alone.
    r = s3dma.upload_dir(tmp_path / "src", url, client=client, chunk_size=MIB, max_memory=2 * MIB, progress=watch)
    assert r.files == len(files) and max(seen) <= 2 * MIB + len(files["big"])
    assert client.list_buffers() == []
    seen.clear()
    r = s3dma.download_prefix(url, tmp_path / "dst", client=client, chunk_size=MIB, max_memory=2 * MIB, progress=watch)
    assert r.files == len(files) and 0 < max(seen) <= 2 * MIB
    assert client.list_buffers() == []
    assert local_tree(tmp_path / "dst") == {rel: sha(d) for rel, d in files.items()}


# ---------------------------------------------------------------------------
# a tenant that may not use a bucket
# ---------------------------------------------------------------------------


def _binary(name: str) -> str:
    p = tenant_stack.s3dma_bin().parent / name
    return str(p) if p.exists() else (shutil.which(name) or str(p))


def _start(cmd, log_path: Path) -> "tuple[subprocess.Popen, queue.Queue]":
    log = open(log_path, "ab")
    proc = subprocess.Popen(
        tenant_stack.with_pdeathsig(cmd),
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    log.close()
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


@pytest.fixture(scope="module")
def restricted_socket(stack, tmp_path_factory):
    """A dpu-agent and host-shim in front of the stack's storage-target whose
    tenant may use the bucket "data" only; yields the shim's socket."""
    import tempfile

    import yaml

    work = tmp_path_factory.mktemp("restricted")
    agent = yaml.safe_load((stack.dir / "dpu-agent.yaml").read_text())
    agent["listen"]["address"] = "127.0.0.1:0"
    agent["tenants"][0]["allow"] = [{"bucket": BUCKET, "prefix": "", "read": True, "write": True}]
    (work / "agent.yaml").write_text(yaml.safe_dump(agent))
    procs = []
    sockdir = Path(tempfile.mkdtemp(prefix="s3dma-py-r-"))
    try:
        proc, lines = _start([_binary("dpu-agent"), "--config", str(work / "agent.yaml")], work / "agent.log")
        procs.append(proc)
        addr = None
        deadline = time.monotonic() + 60
        while addr is None:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, (work / "agent.log").read_text()
            if line.startswith("dpu-agent listening on "):
                addr = line[len("dpu-agent listening on ") :].strip().removeprefix("http://")
        shim = yaml.safe_load((stack.dir / "host-shim.yaml").read_text())
        sock = sockdir / "shim.sock"
        shim["socket"]["path"] = str(sock)
        shim["agent"]["endpoint"] = f"http://{addr}"
        shim["fabric"]["listen"] = "127.0.0.1:0"
        (work / "shim.yaml").write_text(yaml.safe_dump(shim))
        proc, _ = _start([_binary("host-shim"), "--config", str(work / "shim.yaml")], work / "shim.log")
        procs.append(proc)
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (work / "shim.log").read_text()
            try:
                with _socket.socket(_socket.AF_UNIX) as s:
                    s.connect(str(sock))
                break
            except OSError:
                assert time.monotonic() < deadline, "the restricted host-shim did not start"
                time.sleep(0.05)
        yield str(sock)
    finally:
        for p in reversed(procs):
            tenant_stack.interrupt(p, 20)
        shutil.rmtree(sockdir, ignore_errors=True)


def test_a_bucket_the_tenant_may_not_use_is_access_denied(restricted_socket, s3, tmp_path):
    other = f"other-{uuid.uuid4().hex[:8]}"
    try:
        s3.create_bucket(Bucket=other)
        s3.put_object(Bucket=other, Key="p/f", Body=b"f")
        created = True
    except Exception:
        created = False  # the agent's policy answers before the target is asked
    try:
        with s3dma.Client(restricted_socket) as c:
            with pytest.raises(s3dma.TransferError) as ei:
                s3dma.download_prefix(f"s3://{other}/p", tmp_path / "dl", client=c)
            e = ei.value
            assert e.code == "AccessDenied" and e.grpc_code is not None
            assert [(n, type(f)) for n, f in e.failures] == [(f"s3://{other}/p/", s3dma.AccessDenied)]
            assert list((tmp_path / "dl").iterdir()) == []

            make_tree(tmp_path / "src", {"x": b"x", "y/z": b"z"})
            with pytest.raises(s3dma.TransferError) as ei:
                s3dma.upload_dir(tmp_path / "src", f"s3://{other}/p", client=c)
            assert sorted(n for n, _ in ei.value.failures) == ["x", "y/z"]
            assert all(isinstance(f, s3dma.AccessDenied) for _, f in ei.value.failures)
            assert ei.value.summary.files == 0
            # The allowed bucket works through the same shim.
            r = s3dma.upload_dir(tmp_path / "src", f"s3://{BUCKET}/restricted-{uuid.uuid4().hex[:8]}", client=c)
            assert r.files == 2
    finally:
        if created:
            s3.delete_object(Bucket=other, Key="p/f")
            s3.delete_bucket(Bucket=other)
