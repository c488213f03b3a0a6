"""Helpers shared by the third-party client tests (rclone, s3cmd): finding
the tool, a clean environment for it, a local tree with odd names and a
multipart-sized file, and digests of a tree and of a bucket prefix."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from s3util import MiB, rand

# Names that S3 tools tend to get wrong: spaces, '+', '%', '#', '?', unicode,
# a deep prefix. Each is also a key (relative to the upload prefix).
ODD_FILES = {
    "plain.txt": b"plain\n",
    "with space.txt": b"space",
    "plus+sign.txt": b"plus",
    "percent%41%.txt": b"percent",
    "hash#mark.txt": b"hash",
    "question?mark.txt": b"question",
    "ünïcödé/日本.txt": "ユニコード".encode(),
    "deep/a/b/c/d/e/f/leaf.txt": b"leaf",
    "mixed dir+/x %20#?.bin": bytes(range(256)),
}
BIG_NAME = "big/twenty.bin"
BIG_SIZE = 20 * MiB  # above the 5 MiB part size the tests configure: 4 parts


def require_tool(name: str) -> str:
    """The tool's path. Absent: skipped locally, a failure under CI."""
    path = shutil.which(name)
    if path:
        return path
    msg = f"{name} is not installed (Debian package `{name}`; bash .ci/setup.sh installs it)"
    if os.environ.get("CI"):
        pytest.fail(msg + "; CI must run these tests", pytrace=False)
    pytest.skip(msg)


def tool_env(home: Path) -> dict[str, str]:
    """The environment without AWS_* (CA bundles, profiles) and with a
    private HOME, so no tool reads or writes the user's own files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_"))}
    home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(home)
    return env


def run(cmd: list, env: dict, *, rc: int | None = 0, timeout: float = 120) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout)
    if rc is not None:
        assert p.returncode == rc, (
            f"`{' '.join(map(str, cmd))}` exited {p.returncode}, want {rc}\n"
            f"stdout: {p.stdout[-3000:]}\nstderr: {p.stderr[-3000:]}"
        )
    return p


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def odd_tree(root: Path, big: bool = True) -> dict[str, bytes]:
    """Writes ODD_FILES (and a 20 MiB file) under ``root``; returns them."""
    files = dict(ODD_FILES)
    if big:
        files[BIG_NAME] = rand(BIG_SIZE)
    write_tree(root, files)
    return files


def tree_digests(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under ``root``."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


def bucket_digests(client, bucket: str, prefix: str = "") -> dict[str, str]:
    """key (without ``prefix``) -> sha256 of every object under ``prefix``,
    read back with boto3 (so the tool's own view is not trusted)."""
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            body = client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            assert len(body) == o["Size"], o
            out[o["Key"][len(prefix) :]] = hashlib.sha256(body).hexdigest()
    return out


def digests(files: dict[str, bytes]) -> dict[str, str]:
    return {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}


def anonymous_get(url: str) -> int:
    """An unsigned GET of url: its HTTP status (the body is read and dropped)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
