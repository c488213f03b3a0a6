"""rclone (the Debian package) against storage-target: copy a tree up and
down (a 20 MiB file in 5 MiB parts), sync with changed and deleted files,
server-side copy, listings of odd keys; every byte is checked with boto3 and
every hash rclone reports against the local files.

rclone gets its own config file (path style, us-east-1, http endpoint) and
HOME in a temp directory. Skipped when rclone is absent, failed under CI."""

from __future__ import annotations

import hashlib
import json

import pytest

from toolutil import BIG_NAME, ODD_FILES, anonymous_get, bucket_digests, digests, odd_tree
from toolutil import require_tool, run, tool_env, tree_digests, write_tree

PARTS = ["--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M"]


class Rclone:
    def __init__(self, target, workdir, user: str = "alice"):
        self.exe = require_tool("rclone")
        u = target.users[user]
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "rclone.conf"
        self.config.write_text(
            "[st]\n"
            "type = s3\n"
            "provider = Other\n"
            f"access_key_id = {u.access_key}\n"
            f"secret_access_key = {u.secret}\n"
            f"endpoint = {target.endpoint}\n"
            "region = us-east-1\n"
            "force_path_style = true\n"
        )
        self.config.chmod(0o600)
        self.env = tool_env(workdir / "home")

    def __call__(self, *args, rc: int | None = 0, timeout: float = 120):
        cmd = [self.exe, "--config", self.config, "--retries", "1", "--low-level-retries", "1", *args]
        return run(cmd, self.env, rc=rc, timeout=timeout)

    def md5sums(self, remote: str) -> dict[str, str]:
        out = {}
        for line in self("md5sum", remote).stdout.splitlines():
            md5, path = line.split("  ", 1)
            out[path] = md5
        return out


@pytest.fixture
def rclone(target, tmp_path):
    return Rclone(target, tmp_path / "rclone")


def md5s(files: dict[str, bytes]) -> dict[str, str]:
    return {k: hashlib.md5(v).hexdigest() for k, v in files.items()}


def test_rclone_version(rclone):
    out = rclone("version").stdout
    print(out.splitlines()[0])
    assert out.startswith("rclone v")


def test_rclone_copy_tree_up_and_down(rclone, s3, bucket, tmp_path):
    src, down = tmp_path / "src", tmp_path / "down"
    files = odd_tree(src)
    rclone("copy", src, f"st:{bucket}/tree", *PARTS)
    assert bucket_digests(s3, bucket, "tree/") == digests(files)
    big = s3.head_object(Bucket=bucket, Key=f"tree/{BIG_NAME}")
    assert big["ETag"].endswith('-4"'), f"20 MiB in 5 MiB parts must be a 4-part upload: {big['ETag']}"
    # rclone's own view: sizes and MD5s (for the multipart file, from its metadata)
    rclone("check", src, f"st:{bucket}/tree")
    assert rclone.md5sums(f"st:{bucket}/tree") == md5s(files)
    rclone("copy", f"st:{bucket}/tree", down, *PARTS)
    assert tree_digests(down) == digests(files)


def test_rclone_sync_changed_and_deleted(rclone, s3, bucket, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = odd_tree(src, big=False)
    remote = f"st:{bucket}/sync"
    r = rclone("sync", src, remote, "-v")
    assert r.stderr.count("Copied (new)") == len(files), r.stderr
    assert rclone("sync", src, remote, "-v").stderr.count("Copied") == 0, "an unchanged tree was uploaded again"
    # same size, new content; one deleted; one added
    (src / "plain.txt").write_bytes(b"PLAIN\n")
    (src / "with space.txt").unlink()
    write_tree(src, {"deep/new one+.txt": b"new"})
    r = rclone("sync", src, remote, "-v")
    assert "plain.txt: Copied (replaced existing)" in r.stderr, r.stderr
    assert "with space.txt: Deleted" in r.stderr, r.stderr
    assert bucket_digests(s3, bucket, "sync/") == tree_digests(src)
    # down into a directory holding a stale file and a stale version
    write_tree(dst, {"stale.txt": b"old", "plain.txt": b"plain\n"})
    rclone("sync", remote, dst)
    assert tree_digests(dst) == tree_digests(src)
    rclone("check", src, remote)


def test_rclone_server_side_copy(rclone, s3, bucket, tmp_path):
    files = odd_tree(tmp_path / "src", big=False)
    rclone("copy", tmp_path / "src", f"st:{bucket}/tree")
    r = rclone("copy", f"st:{bucket}/tree", f"st:{bucket}/copy", "-v")
    assert r.stderr.count("Copied (server-side copy)") == len(files), r.stderr
    r = rclone("copyto", f"st:{bucket}/tree/hash#mark.txt", f"st:{bucket}/one/q?#% +ü.txt", "-v")
    assert "server-side copy" in r.stderr, r.stderr
    assert bucket_digests(s3, bucket, "copy/") == digests(files)
    assert s3.get_object(Bucket=bucket, Key="one/q?#% +ü.txt")["Body"].read() == files["hash#mark.txt"]
    assert rclone.md5sums(f"st:{bucket}/copy") == md5s(files)


def test_rclone_server_side_copy_multipart(rclone, s3, bucket, tmp_path):
    """Above --s3-copy-cutoff rclone copies with UploadPartCopy."""
    files = odd_tree(tmp_path / "src")
    big = {BIG_NAME: files[BIG_NAME]}
    rclone("copy", tmp_path / "src" / "big", f"st:{bucket}/big")  # one part (below the default cutoff)
    assert "-" not in s3.head_object(Bucket=bucket, Key=BIG_NAME)["ETag"]
    r = rclone("copyto", f"st:{bucket}/{BIG_NAME}", f"st:{bucket}/copy/{BIG_NAME}", "--s3-copy-cutoff", "5M", "-v")
    assert "server-side copy" in r.stderr, r.stderr
    assert bucket_digests(s3, bucket, "copy/") == digests(big)
    h = s3.head_object(Bucket=bucket, Key=f"copy/{BIG_NAME}")
    assert h["ETag"].endswith('-4"'), f"a 4-part copy: {h['ETag']}"
    rclone("check", tmp_path / "src" / "big", f"st:{bucket}/copy/big")


def test_rclone_lists_odd_keys(rclone, s3, bucket):
    # written with boto3, so the listing does not depend on rclone's uploads
    for key, data in ODD_FILES.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    listed = rclone("lsf", "-R", "--files-only", f"st:{bucket}").stdout.splitlines()
    assert sorted(listed) == sorted(ODD_FILES)
    top = rclone("lsf", f"st:{bucket}").stdout.splitlines()
    assert sorted(top) == sorted({k.split("/")[0] + ("/" if "/" in k else "") for k in ODD_FILES})
    deep = rclone("lsf", f"st:{bucket}/deep/a/b/c/").stdout.splitlines()
    assert deep == ["d/"]
    entries = json.loads(rclone("lsjson", "-R", "--files-only", "--hash", f"st:{bucket}").stdout)
    got = {e["Path"]: (e["Size"], e["Hashes"]["md5"]) for e in entries}
    assert got == {k: (len(v), hashlib.md5(v).hexdigest()) for k, v in ODD_FILES.items()}


def test_rclone_acls_buckets_and_purge(rclone, target, s3, bucket, tmp_path):
    """--s3-acl on PutObject, CreateMultipartUpload and a multipart copy;
    rclone's default ACL is private; lsd lists the caller's buckets."""
    files = odd_tree(tmp_path / "src")
    rclone("copy", tmp_path / "src", f"st:{bucket}/pub", "--s3-acl", "public-read", *PARTS)
    rclone("copy", tmp_path / "src", f"st:{bucket}/priv", *PARTS)
    rclone("copyto", f"st:{bucket}/priv/{BIG_NAME}", f"st:{bucket}/pubcopy.bin", "--s3-acl", "public-read", "--s3-copy-cutoff", "5M")
    url = f"{target.endpoint}/{bucket}"
    assert anonymous_get(f"{url}/pub/{BIG_NAME}") == 200
    assert anonymous_get(f"{url}/pub/plain.txt") == 200
    assert anonymous_get(f"{url}/pubcopy.bin") == 200
    assert anonymous_get(f"{url}/priv/{BIG_NAME}") == 403
    assert anonymous_get(f"{url}/priv/plain.txt") == 403
    assert bucket in rclone("lsd", "st:").stdout.split()
    rclone("purge", f"st:{bucket}/pub")
    assert sorted(bucket_digests(s3, bucket, "priv/")) == sorted(files)
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="pub/")
