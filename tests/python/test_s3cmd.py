"""s3cmd (the Debian package) against storage-target: put/get a tree (a
20 MiB file in 5 MiB parts), sync with changed and deleted files,
server-side copy (also multipart, with UploadPartCopy), listings of odd
keys, canned ACLs; every byte is checked with boto3 and the MD5s s3cmd
reports against the local files.

s3cmd gets its own config file (path style: host_bucket without
%(bucket)s; us-east-1, SigV4, http) and HOME in a temp directory. Skipped
when s3cmd is absent, failed under CI."""

from __future__ import annotations

import hashlib

import pytest
from botocore.exceptions import ClientError

from conftest import canonical_id
from s3util import assert_client_error
from toolutil import BIG_NAME, ODD_FILES, anonymous_get, bucket_digests, digests, odd_tree
from toolutil import require_tool, run, tool_env, tree_digests, write_tree

PARTS = ["--multipart-chunk-size-mb=5"]


class S3cmd:
    def __init__(self, target, workdir, user: str = "alice"):
        self.exe = require_tool("s3cmd")
        self.endpoint = target.endpoint
        u = target.users[user]
        host = target.endpoint.split("://", 1)[1]
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "s3cfg"
        self.config.write_text(
            "[default]\n"
            f"access_key = {u.access_key}\n"
            f"secret_key = {u.secret}\n"
            f"host_base = {host}\n"
            f"host_bucket = {host}\n"
            "use_https = False\n"
            "bucket_location = us-east-1\n"
            "signature_v2 = False\n"
            "proxy_host =\n"
            # a copy of more than 5 MiB is a multipart copy (UploadPartCopy)
            "multipart_copy_chunk_size_mb = 5\n"
        )
        self.config.chmod(0o600)
        self.env = tool_env(workdir / "home")

    def __call__(self, *args, rc: int | None = 0, timeout: float = 120):
        return run([self.exe, "-c", self.config, "--no-progress", *args], self.env, rc=rc, timeout=timeout)

    def ls(self, *args) -> list[str]:
        """Keys (full s3:// URIs) of `s3cmd ls` lines; DIR lines as 'DIR uri'."""
        out = []
        for line in self("ls", *args).stdout.splitlines():
            parts = line.split(None, 3)
            if parts and parts[0] == "DIR":
                out.append("DIR " + line.split("DIR", 1)[1].strip())
            elif len(parts) == 4:
                out.append(parts[3])
        return out


@pytest.fixture
def s3cmd(target, tmp_path):
    return S3cmd(target, tmp_path / "s3cmd")


def test_s3cmd_version(s3cmd):
    out = s3cmd("--version").stdout
    print(out.strip())
    assert out.startswith("s3cmd version")


def test_s3cmd_put_get_tree(s3cmd, s3, bucket, tmp_path):
    src, down = tmp_path / "src", tmp_path / "down"
    files = odd_tree(src)
    s3cmd("put", "--recursive", *PARTS, f"{src}/", f"s3://{bucket}/tree/")
    assert bucket_digests(s3, bucket, "tree/") == digests(files)
    big = s3.head_object(Bucket=bucket, Key=f"tree/{BIG_NAME}")
    assert big["ETag"].endswith('-4"'), f"20 MiB in 5 MiB parts must be a 4-part upload: {big['ETag']}"
    assert sorted(s3cmd.ls("--recursive", f"s3://{bucket}")) == sorted(f"s3://{bucket}/tree/{k}" for k in files)
    # s3cmd keeps the whole file's MD5 of a multipart upload in its metadata
    info = s3cmd("info", f"s3://{bucket}/tree/{BIG_NAME}").stdout
    assert f"MD5 sum:   {hashlib.md5(files[BIG_NAME]).hexdigest()}" in info, info
    down.mkdir()
    s3cmd("get", "--recursive", f"s3://{bucket}/tree/", f"{down}/")
    assert tree_digests(down) == digests(files)


def test_s3cmd_sync_changed_and_deleted(s3cmd, s3, bucket, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = odd_tree(src, big=False)
    remote = f"s3://{bucket}/sync/"
    r = s3cmd("sync", "--delete-removed", f"{src}/", remote)
    assert r.stdout.count("upload:") == len(files), r.stdout
    again = s3cmd("sync", "--delete-removed", f"{src}/", remote).stdout
    assert "upload:" not in again, f"an unchanged tree was uploaded again:\n{again}"
    # same size, new content (s3cmd compares MD5s); one deleted; one added
    (src / "plain.txt").write_bytes(b"PLAIN\n")
    (src / "with space.txt").unlink()
    write_tree(src, {"deep/new one+.txt": b"new"})
    r = s3cmd("sync", "--delete-removed", f"{src}/", remote).stdout
    assert r.count("upload:") == 2 and "plain.txt" in r and "new one+.txt" in r, r
    assert f"delete: '{remote}with space.txt'" in r, r
    assert bucket_digests(s3, bucket, "sync/") == tree_digests(src)
    write_tree(dst, {"stale.txt": b"old", "plain.txt": b"plain\n"})
    s3cmd("sync", "--delete-removed", remote, f"{dst}/")
    assert tree_digests(dst) == tree_digests(src)


def test_s3cmd_server_side_copy(s3cmd, s3, bucket, tmp_path):
    files = odd_tree(tmp_path / "src", big=False)
    s3cmd("put", "--recursive", f"{tmp_path / 'src'}/", f"s3://{bucket}/tree/")
    r = s3cmd("cp", "--recursive", f"s3://{bucket}/tree/", f"s3://{bucket}/copy/").stdout
    assert r.count("remote copy:") == len(files), r
    assert bucket_digests(s3, bucket, "copy/") == digests(files)
    s3cmd("cp", f"s3://{bucket}/tree/hash#mark.txt", f"s3://{bucket}/one/q?#% +ü.txt")
    assert s3.get_object(Bucket=bucket, Key="one/q?#% +ü.txt")["Body"].read() == files["hash#mark.txt"]
    s3cmd("mv", f"s3://{bucket}/one/q?#% +ü.txt", f"s3://{bucket}/moved/%41.txt")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="moved/")["Contents"]]
    assert keys == ["moved/%41.txt"]
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="one/")


def test_s3cmd_server_side_copy_multipart(s3cmd, s3, bucket, tmp_path):
    """Above multipart_copy_chunk_size_mb s3cmd copies with UploadPartCopy."""
    files = odd_tree(tmp_path / "src")
    s3cmd("put", "--disable-multipart", tmp_path / "src" / BIG_NAME, f"s3://{bucket}/{BIG_NAME}")
    assert "-" not in s3.head_object(Bucket=bucket, Key=BIG_NAME)["ETag"]
    s3cmd("cp", f"s3://{bucket}/{BIG_NAME}", f"s3://{bucket}/copy/{BIG_NAME}")
    assert bucket_digests(s3, bucket, "copy/") == digests({BIG_NAME: files[BIG_NAME]})
    h = s3.head_object(Bucket=bucket, Key=f"copy/{BIG_NAME}")
    assert h["ETag"].endswith('-4"'), f"a 4-part copy: {h['ETag']}"


def test_s3cmd_lists_odd_keys(s3cmd, s3, bucket):
    for key, data in ODD_FILES.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    listed = s3cmd.ls("--recursive", f"s3://{bucket}")
    assert sorted(listed) == sorted(f"s3://{bucket}/{k}" for k in ODD_FILES)
    top = s3cmd.ls(f"s3://{bucket}")
    want = {f"DIR s3://{bucket}/{k.split('/')[0]}/" for k in ODD_FILES if "/" in k}
    want |= {f"s3://{bucket}/{k}" for k in ODD_FILES if "/" not in k}
    assert sorted(top) == sorted(want)
    assert s3cmd.ls(f"s3://{bucket}/deep/a/b/c/") == [f"DIR s3://{bucket}/deep/a/b/c/d/"]
    md5 = s3cmd("ls", "--recursive", "--list-md5", f"s3://{bucket}").stdout
    for key, data in ODD_FILES.items():
        assert hashlib.md5(data).hexdigest() in md5, (key, md5)


def test_s3cmd_acls(s3cmd, target, bucket, tmp_path):
    """`put --acl-public` sends x-amz-acl: public-read; `setacl` reads the
    ACL and writes it back as an AccessControlPolicy document (also with a
    grant to frank's canonical id, then revoked)."""
    f = write_tree(tmp_path, {"pub.txt": b"public"}) / "pub.txt"
    s3cmd("put", "--acl-public", f, f"s3://{bucket}/pub.txt")
    url = f"{s3cmd.endpoint}/{bucket}/pub.txt"
    assert anonymous_get(url) == 200
    assert "*anon*: READ" in s3cmd("info", f"s3://{bucket}/pub.txt").stdout
    s3cmd("setacl", "--acl-private", f"s3://{bucket}/pub.txt")
    assert anonymous_get(url) == 403
    assert "*anon*" not in s3cmd("info", f"s3://{bucket}/pub.txt").stdout
    s3cmd("setacl", "--acl-public", f"s3://{bucket}/pub.txt")
    assert anonymous_get(url) == 200
    # a grant to a canonical user, written back in the AccessControlPolicy
    frank = target.client("frank")
    s3cmd("setacl", "--acl-private", f"--acl-grant=read:{canonical_id('frank')}", f"s3://{bucket}/pub.txt")
    assert anonymous_get(url) == 403
    assert frank.get_object(Bucket=bucket, Key="pub.txt")["Body"].read() == b"public"
    s3cmd("setacl", f"--acl-revoke=read:{canonical_id('frank')}", f"s3://{bucket}/pub.txt")
    with pytest.raises(ClientError) as e:
        frank.get_object(Bucket=bucket, Key="pub.txt")
    assert_client_error(e, "AccessDenied", 403)
