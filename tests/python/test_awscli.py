"""The aws CLI (v1, from the venv) against storage-target: `aws s3api ...`
for every operation and the high-level `aws s3 cp/ls/rm/mb/rb/presign`.

Each call runs the real `aws` executable with a private AWS_CONFIG_FILE /
AWS_SHARED_CREDENTIALS_FILE (path-style addressing, us-east-1) and
--endpoint-url; tests assert exit codes and the parsed JSON output."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ALL_USERS, canonical_id, owner
from s3util import MiB, md5_b64, md5_hex, multipart_etag, rand, sha256, unique_bucket

S3API_ERROR_RC = 255  # aws CLI v1: service errors exit 255
S3_TRANSFER_ERROR_RC = 1  # `aws s3 cp/rm` failures


def aws_executable() -> str:
    venv_aws = Path(sys.executable).parent / "aws"
    if venv_aws.exists():
        return str(venv_aws)
    found = shutil.which("aws")
    if not found:
        pytest.fail("the aws CLI is not installed (bash .ci/setup.sh installs it into .venv)")
    return found


@dataclass
class CliResult:
    rc: int
    stdout: str
    stderr: str

    @property
    def json(self):
        return json.loads(self.stdout) if self.stdout.strip() else {}


class AwsCli:
    def __init__(self, target, workdir: Path, part_size: str = "8MB"):
        self.target = target
        self.exe = aws_executable()
        workdir.mkdir(parents=True, exist_ok=True)
        s3_section = (
            "s3 =\n"
            "    addressing_style = path\n"
            f"    multipart_threshold = {part_size}\n"
            f"    multipart_chunksize = {part_size}\n"
            "    max_concurrent_requests = 4\n"
            "    signature_version = s3v4\n"
        )
        profiles = {
            "default": target.users["alice"],
            "bob": target.users["bob"],
            "carol": target.users["carol"],
            "erin": target.users["erin"],
            "frank": target.users["frank"],
            "unsigned": target.users["alice"],
            "wrongsecret": type(target.users["alice"])("alice", "alice", "wrong-secret"),
            "ghost": type(target.users["alice"])("ghost", "AKIDGHOSTGHOST", "x"),
        }
        cfg, creds = [], []
        for name, user in profiles.items():
            cfg.append("[default]" if name == "default" else f"[profile {name}]")
            cfg.append("region = us-east-1\noutput = json")
            section = s3_section
            if name == "unsigned":
                section += "    payload_signing_enabled = false\n"
            cfg.append(section)
            creds.append(f"[{name}]\naws_access_key_id = {user.access_key}\naws_secret_access_key = {user.secret}\n")
        self.config_file = workdir / "config"
        self.credentials_file = workdir / "credentials"
        self.config_file.write_text("\n".join(cfg))
        self.credentials_file.write_text("\n".join(creds))
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(
            {
                "AWS_CONFIG_FILE": str(self.config_file),
                "AWS_SHARED_CREDENTIALS_FILE": str(self.credentials_file),
                "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_PAGER": "",
                "AWS_MAX_ATTEMPTS": "1",
                "AWS_RETRY_MODE": "standard",
            }
        )
        self.env = env

    def __call__(self, *args, profile: str | None = None, rc: int | None = 0, timeout: float = 120) -> CliResult:
        cmd = [self.exe, "--endpoint-url", self.target.endpoint]
        if profile:
            cmd += ["--profile", profile]
        cmd += [str(a) for a in args]
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        res = CliResult(p.returncode, p.stdout, p.stderr)
        if rc is not None:
            assert p.returncode == rc, (
                f"`aws {' '.join(map(str, args))}` exited {p.returncode}, want {rc}\n"
                f"stdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-3000:]}"
            )
        return res

    def error(self, *args, code: str, profile: str | None = None, rc: int = S3API_ERROR_RC) -> CliResult:
        """Run a command that must fail with S3 error ``code``."""
        res = self(*args, profile=profile, rc=None)
        assert res.rc == rc, f"`aws {' '.join(map(str, args))}` exited {res.rc}, want {rc}: {res.stderr[-2000:]}"
        assert f"({code})" in res.stderr, f"expected ({code}) in stderr: {res.stderr[-2000:]}"
        return res


@pytest.fixture(scope="module")
def aws(target, tmp_path_factory):
    return AwsCli(target, tmp_path_factory.mktemp("awscli"))


@pytest.fixture(scope="module")
def aws_5mb(target, tmp_path_factory):
    """The CLI with multipart_threshold = multipart_chunksize = 5MB."""
    return AwsCli(target, tmp_path_factory.mktemp("awscli5mb"), part_size="5MB")


@pytest.fixture
def files(tmp_path):
    def make(name: str, data: bytes) -> Path:
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        return p

    return make


def test_cli_version(aws):
    res = aws("--version")
    print(res.stdout or res.stderr)
    assert "aws-cli/1." in (res.stdout + res.stderr)


# --------------------------------------------------------------------------
# s3api: buckets
# --------------------------------------------------------------------------


def test_s3api_bucket_lifecycle(aws, files):
    b = unique_bucket("cli")
    r = aws("s3api", "create-bucket", "--bucket", b)
    assert r.json.get("Location") in (None, "/" + b, f"{aws.target.endpoint}/{b}")
    try:
        aws("s3api", "head-bucket", "--bucket", b)
        assert b in [x["Name"] for x in aws("s3api", "list-buckets").json["Buckets"]]
        assert aws("s3api", "get-bucket-location", "--bucket", b).json.get("LocationConstraint") is None
        aws("s3api", "create-bucket", "--bucket", b)  # one's own bucket again: 200 in us-east-1
        f = files("x.txt", b"x")
        aws("s3api", "put-object", "--bucket", b, "--key", "x", "--body", f)
        aws.error("s3api", "delete-bucket", "--bucket", b, code="BucketNotEmpty")
        aws("s3api", "delete-object", "--bucket", b, "--key", "x")
    finally:
        aws("s3api", "delete-bucket", "--bucket", b, rc=None)
    aws.error("s3api", "head-bucket", "--bucket", b, code="404")
    aws.error("s3api", "delete-bucket", "--bucket", b, code="NoSuchBucket")
    aws.error("s3api", "create-bucket", "--bucket", "Invalid_Bucket_Name", code="InvalidBucketName")


def test_s3api_bucket_owned_by_other(aws, target):
    b = unique_bucket("bob")
    aws("s3api", "create-bucket", "--bucket", b, profile="bob")
    try:
        aws.error("s3api", "create-bucket", "--bucket", b, code="BucketAlreadyExists")
        aws.error("s3api", "create-bucket", "--bucket", unique_bucket("nob"), profile="bob", code="AccessDenied")
    finally:
        aws("s3api", "delete-bucket", "--bucket", b, profile="bob")


# --------------------------------------------------------------------------
# s3api: objects
# --------------------------------------------------------------------------


def test_s3api_put_get_head_with_headers(aws, bucket, files, tmp_path):
    data = rand(100_000)
    src = files("in.bin", data)
    r = aws(
        "s3api", "put-object", "--bucket", bucket, "--key", "dir/obj ü.bin", "--body", src,
        "--content-type", "application/x-cli",
        "--metadata", "color=green,Owner=cli",
        "--cache-control", "max-age=60",
        "--content-disposition", "inline",
        "--content-encoding", "identity",
        "--expires", "2032-03-04T05:06:07Z",
        "--content-md5", md5_b64(data),
    )
    assert r.json["ETag"] == f'"{md5_hex(data)}"'
    h = aws("s3api", "head-object", "--bucket", bucket, "--key", "dir/obj ü.bin").json
    assert h["ContentLength"] == len(data)
    assert h["ETag"] == f'"{md5_hex(data)}"'
    assert h["ContentType"] == "application/x-cli"
    assert h["Metadata"] == {"color": "green", "owner": "cli"}
    assert h["CacheControl"] == "max-age=60"
    assert h["ContentDisposition"] == "inline"
    assert h["ContentEncoding"] == "identity"
    assert "2032" in str(h.get("ExpiresString") or h.get("Expires"))
    assert h["LastModified"]
    out = tmp_path / "out.bin"
    g = aws("s3api", "get-object", "--bucket", bucket, "--key", "dir/obj ü.bin", out).json
    assert g["ContentLength"] == len(data)
    assert sha256(out.read_bytes()) == sha256(data)
    part = tmp_path / "part.bin"
    g = aws("s3api", "get-object", "--bucket", bucket, "--key", "dir/obj ü.bin", "--range", "bytes=-100", part).json
    assert g["ContentRange"] == f"bytes {len(data) - 100}-{len(data) - 1}/{len(data)}"
    assert part.read_bytes() == data[-100:]
    aws.error("s3api", "get-object", "--bucket", bucket, "--key", "dir/obj ü.bin", "--range", "bytes=200000-", part, code="InvalidRange")
    aws.error("s3api", "get-object", "--bucket", bucket, "--key", "missing", part, code="NoSuchKey")
    # Content-MD5 that does not match
    aws.error("s3api", "put-object", "--bucket", bucket, "--key", "bad", "--body", src, "--content-md5", md5_b64(b"x"), code="BadDigest")


def test_s3api_conditionals(aws, s3, bucket, tmp_path):
    s3.put_object(Bucket=bucket, Key="c", Body=b"conditional")
    h = s3.head_object(Bucket=bucket, Key="c")
    etag, lm = h["ETag"], h["LastModified"]
    out = tmp_path / "o"
    past = (lm - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    future = (lm + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    aws("s3api", "get-object", "--bucket", bucket, "--key", "c", "--if-match", etag, out)
    assert out.read_bytes() == b"conditional"
    aws.error("s3api", "get-object", "--bucket", bucket, "--key", "c", "--if-match", '"0000"', out, code="PreconditionFailed")
    aws.error("s3api", "get-object", "--bucket", bucket, "--key", "c", "--if-none-match", etag, out, code="304")
    aws.error("s3api", "head-object", "--bucket", bucket, "--key", "c", "--if-modified-since", future, code="304")
    aws.error("s3api", "get-object", "--bucket", bucket, "--key", "c", "--if-unmodified-since", past, out, code="PreconditionFailed")


def test_s3api_copy_object(aws, s3, bucket):
    s3.put_object(Bucket=bucket, Key="src", Body=b"copy me", ContentType="text/plain", Metadata={"a": "1"})
    r = aws("s3api", "copy-object", "--bucket", bucket, "--key", "dst1", "--copy-source", f"{bucket}/src").json
    assert r["CopyObjectResult"]["ETag"] == f'"{md5_hex(b"copy me")}"'
    r = aws(
        "s3api", "copy-object", "--bucket", bucket, "--key", "dst2", "--copy-source", f"{bucket}/src",
        "--metadata-directive", "REPLACE", "--metadata", "b=2", "--content-type", "text/csv",
    ).json
    h1 = aws("s3api", "head-object", "--bucket", bucket, "--key", "dst1").json
    h2 = aws("s3api", "head-object", "--bucket", bucket, "--key", "dst2").json
    assert (h1["Metadata"], h1["ContentType"]) == ({"a": "1"}, "text/plain")
    assert (h2["Metadata"], h2["ContentType"]) == ({"b": "2"}, "text/csv")
    assert s3.get_object(Bucket=bucket, Key="dst2")["Body"].read() == b"copy me"
    aws.error("s3api", "copy-object", "--bucket", bucket, "--key", "x", "--copy-source", f"{bucket}/missing", code="NoSuchKey")


def test_s3api_delete_objects(aws, s3, bucket):
    for k in ("a", "b", "c/d"):
        s3.put_object(Bucket=bucket, Key=k, Body=b"x")
    spec = json.dumps({"Objects": [{"Key": "a"}, {"Key": "c/d"}, {"Key": "nope"}]})
    r = aws("s3api", "delete-objects", "--bucket", bucket, "--delete", spec).json
    assert sorted(d["Key"] for d in r["Deleted"]) == ["a", "c/d", "nope"]
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["b"]
    aws("s3api", "delete-object", "--bucket", bucket, "--key", "b")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


# --------------------------------------------------------------------------
# s3api: listing
# --------------------------------------------------------------------------


def test_s3api_listing(aws, s3, bucket):
    keys = ["a", "b/1", "b/2", "b/c/3", "c d", "e+f", "ü"]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    want = sorted(keys, key=str.encode)
    r = aws("s3api", "list-objects-v2", "--bucket", bucket).json
    assert [o["Key"] for o in r["Contents"]] == want
    assert all(o["Size"] == len(o["Key"].encode()) for o in r["Contents"])
    r = aws("s3api", "list-objects-v2", "--bucket", bucket, "--delimiter", "/", "--prefix", "b/").json
    assert [o["Key"] for o in r["Contents"]] == ["b/1", "b/2"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["b/c/"]
    # one raw page: max-keys and the continuation token
    r = aws("s3api", "list-objects-v2", "--bucket", bucket, "--max-keys", "3", "--no-paginate").json
    assert [o["Key"] for o in r["Contents"]] == want[:3]
    assert r["IsTruncated"] is True and r["NextContinuationToken"]
    r2 = aws(
        "s3api", "list-objects-v2", "--bucket", bucket, "--max-keys", "3", "--no-paginate",
        "--continuation-token", r["NextContinuationToken"],
    ).json
    assert [o["Key"] for o in r2["Contents"]] == want[3:6]
    # the CLI paginator walks all pages with --page-size
    r = aws("s3api", "list-objects-v2", "--bucket", bucket, "--page-size", "2").json
    assert [o["Key"] for o in r["Contents"]] == want
    r = aws("s3api", "list-objects-v2", "--bucket", bucket, "--start-after", "b/2", "--fetch-owner").json
    assert [o["Key"] for o in r["Contents"]] == [k for k in want if k.encode() > b"b/2"]
    assert all(o.get("Owner", {}).get("ID") for o in r["Contents"])
    r = aws("s3api", "list-objects-v2", "--bucket", bucket, "--encoding-type", "url", "--prefix", "c").json
    assert [o["Key"] for o in r["Contents"]] in (["c+d"], ["c%20d"])
    # v1 with a marker
    r = aws("s3api", "list-objects", "--bucket", bucket, "--marker", "b/c/3", "--no-paginate").json
    assert [o["Key"] for o in r["Contents"]] == [k for k in want if k.encode() > b"b/c/3"]
    r = aws("s3api", "list-objects", "--bucket", bucket, "--page-size", "2").json
    assert [o["Key"] for o in r["Contents"]] == want


# --------------------------------------------------------------------------
# s3api: multipart
# --------------------------------------------------------------------------


def test_s3api_multipart(aws, bucket, files, tmp_path):
    key = "mp/cli.bin"
    p1, p2, p3 = rand(5 * MiB), rand(5 * MiB), rand(300_000)
    f1, f2, f3 = files("p1", p1), files("p2", p2), files("p3", p3)
    uid = aws("s3api", "create-multipart-upload", "--bucket", bucket, "--key", key, "--content-type", "application/x-mp").json["UploadId"]
    etags = []
    for n, f in ((1, f1), (2, f2), (3, f3)):
        etags.append(aws("s3api", "upload-part", "--bucket", bucket, "--key", key, "--upload-id", uid, "--part-number", n, "--body", f).json["ETag"])
    e1, e2, e3 = etags
    assert etags == [f'"{md5_hex(p)}"' for p in (p1, p2, p3)]
    lp = aws("s3api", "list-parts", "--bucket", bucket, "--key", key, "--upload-id", uid).json
    assert [(p["PartNumber"], p["Size"]) for p in lp["Parts"]] == [(1, len(p1)), (2, len(p2)), (3, len(p3))]
    ups = aws("s3api", "list-multipart-uploads", "--bucket", bucket).json
    assert [(u["Key"], u["UploadId"]) for u in ups["Uploads"]] == [(key, uid)]

    def spec(*pairs):
        return json.dumps({"Parts": [{"PartNumber": n, "ETag": e} for n, e in pairs]})

    aws.error("s3api", "complete-multipart-upload", "--bucket", bucket, "--key", key, "--upload-id", uid,
              "--multipart-upload", spec((2, e2), (1, e1), (3, e3)), code="InvalidPartOrder")
    aws.error("s3api", "complete-multipart-upload", "--bucket", bucket, "--key", key, "--upload-id", uid,
              "--multipart-upload", spec((1, e1), (2, e1), (3, e3)), code="InvalidPart")
    r = aws("s3api", "complete-multipart-upload", "--bucket", bucket, "--key", key, "--upload-id", uid,
            "--multipart-upload", spec((1, e1), (2, e2), (3, e3))).json
    assert r["ETag"] == multipart_etag([p1, p2, p3])
    out = tmp_path / "mp.out"
    g = aws("s3api", "get-object", "--bucket", bucket, "--key", key, out).json
    assert g["ContentType"] == "application/x-mp"
    assert sha256(out.read_bytes()) == sha256(p1 + p2 + p3)
    assert not aws("s3api", "list-multipart-uploads", "--bucket", bucket).json.get("Uploads")


def test_s3api_multipart_abort_and_too_small(aws, bucket, files):
    key = "mp/abort"
    small = files("small", rand(MiB))
    uid = aws("s3api", "create-multipart-upload", "--bucket", bucket, "--key", key).json["UploadId"]
    e1 = aws("s3api", "upload-part", "--bucket", bucket, "--key", key, "--upload-id", uid, "--part-number", "1", "--body", small).json["ETag"]
    e2 = aws("s3api", "upload-part", "--bucket", bucket, "--key", key, "--upload-id", uid, "--part-number", "2", "--body", small).json["ETag"]
    parts = json.dumps({"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    aws.error("s3api", "complete-multipart-upload", "--bucket", bucket, "--key", key, "--upload-id", uid, "--multipart-upload", parts, code="EntityTooSmall")
    aws("s3api", "abort-multipart-upload", "--bucket", bucket, "--key", key, "--upload-id", uid)
    assert not aws("s3api", "list-multipart-uploads", "--bucket", bucket).json.get("Uploads")
    aws.error("s3api", "list-parts", "--bucket", bucket, "--key", key, "--upload-id", uid, code="NoSuchUpload")


# --------------------------------------------------------------------------
# high-level aws s3
# --------------------------------------------------------------------------


def _ls_keys(stdout: str) -> list[str]:
    out = []
    for line in stdout.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[2].isdigit():
            out.append(parts[3])
    return out


def test_s3_high_level_commands(aws, tmp_path, files):
    b = unique_bucket("hl")
    aws("s3", "mb", f"s3://{b}")
    try:
        assert b in aws("s3", "ls").stdout.split()
        data = rand(200_000)
        f = files("one.bin", data)
        aws("s3", "cp", f, f"s3://{b}/single/one.bin", "--content-type", "application/x-one", "--metadata", "src=cli")
        tree = tmp_path / "tree"
        contents = {"a.txt": b"a", "sub/b.txt": b"bb", "sub/deeper/c.txt": b"ccc", "spaced name.txt": b"dddd"}
        for rel, body in contents.items():
            files(f"tree/{rel}", body)
        aws("s3", "cp", "--recursive", tree, f"s3://{b}/tree/")
        ls = aws("s3", "ls", f"s3://{b}/").stdout
        assert "PRE single/" in ls and "PRE tree/" in ls
        ls = aws("s3", "ls", "--recursive", f"s3://{b}/").stdout
        assert sorted(_ls_keys(ls)) == sorted(["single/one.bin"] + [f"tree/{k}" for k in contents])
        ls = aws("s3", "ls", f"s3://{b}/tree/sub/").stdout
        assert "PRE deeper/" in ls and "b.txt" in _ls_keys(ls)
        dl = tmp_path / "dl.bin"
        aws("s3", "cp", f"s3://{b}/single/one.bin", dl)
        assert sha256(dl.read_bytes()) == sha256(data)
        h = aws("s3api", "head-object", "--bucket", b, "--key", "single/one.bin").json
        assert h["ContentType"] == "application/x-one" and h["Metadata"] == {"src": "cli"}
        down = tmp_path / "down"
        aws("s3", "cp", "--recursive", f"s3://{b}/tree/", down)
        for rel, body in contents.items():
            assert (down / rel).read_bytes() == body
        # server-side copy via the high-level command
        aws("s3", "cp", f"s3://{b}/single/one.bin", f"s3://{b}/copied.bin")
        h2 = aws("s3api", "head-object", "--bucket", b, "--key", "copied.bin").json
        assert h2["ETag"] == h["ETag"]
        aws("s3", "rm", f"s3://{b}/single/one.bin")
        aws.error("s3api", "head-object", "--bucket", b, "--key", "single/one.bin", code="404")
        assert aws("s3", "cp", f"s3://{b}/missing", tmp_path / "never", rc=None).rc != 0
        r = aws("s3", "rb", f"s3://{b}", rc=None)
        assert r.rc != 0 and "BucketNotEmpty" in r.stderr
        aws("s3", "rm", "--recursive", f"s3://{b}/")
        assert _ls_keys(aws("s3", "ls", "--recursive", f"s3://{b}/", rc=None).stdout) == []
        aws("s3", "rb", f"s3://{b}")
        assert b not in aws("s3", "ls").stdout.split()
    finally:
        aws("s3", "rb", "--force", f"s3://{b}", rc=None)


def test_s3_cp_64mib_multipart(aws, bucket, tmp_path):
    data = rand(64 * MiB)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    aws("s3", "cp", src, f"s3://{bucket}/big/64mib.bin", timeout=300)
    h = aws("s3api", "head-object", "--bucket", bucket, "--key", "big/64mib.bin").json
    assert h["ContentLength"] == 64 * MiB
    # multipart_chunksize = 8MB in the CLI config -> 8 parts
    assert h["ETag"] == multipart_etag([data[i : i + 8 * MiB] for i in range(0, len(data), 8 * MiB)])
    dst = tmp_path / "big.out"
    aws("s3", "cp", f"s3://{bucket}/big/64mib.bin", dst, timeout=300)
    assert sha256(dst.read_bytes()) == sha256(data)


def test_s3_presign(aws, s3, bucket):
    s3.put_object(Bucket=bucket, Key="p/pre.txt", Body=b"presigned by the CLI")
    url = aws("s3", "presign", f"s3://{bucket}/p/pre.txt", "--expires-in", "120").stdout.strip()
    assert url.startswith(aws.target.endpoint) and "X-Amz-Signature=" in url
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.read() == b"presigned by the CLI"
    sig_at = url.index("X-Amz-Signature=") + len("X-Amz-Signature=")
    bad = url[:sig_at] + ("0" if url[sig_at] != "0" else "1") + url[sig_at + 1 :]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad, timeout=30)
    assert e.value.code == 403 and b"SignatureDoesNotMatch" in e.value.read()


# --------------------------------------------------------------------------
# auth through the CLI
# --------------------------------------------------------------------------


def test_cli_auth_failures(aws, s3, bucket, files):
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    aws.error("s3api", "list-objects-v2", "--bucket", bucket, profile="wrongsecret", code="SignatureDoesNotMatch")
    aws.error("s3api", "list-buckets", profile="ghost", code="InvalidAccessKeyId")
    aws.error("s3api", "list-objects-v2", "--bucket", bucket, "--no-sign-request", code="AccessDenied")
    aws.error("s3api", "get-object", "--bucket", bucket, "--key", "k", "/dev/null", profile="bob", code="AccessDenied")
    f = files("c.txt", b"carol")
    aws.error("s3api", "put-object", "--bucket", "shared", "--key", "carol", "--body", f, profile="carol", code="AccessDenied")
    r = aws("s3", "cp", f, "s3://shared/carol-hl", profile="carol", rc=None)
    assert r.rc == S3_TRANSFER_ERROR_RC and "AccessDenied" in r.stderr
    # carol may read the shared bucket
    aws("s3", "ls", "s3://shared/", profile="carol")
    aws("s3api", "head-bucket", "--bucket", "shared", profile="carol")


def test_cli_payload_modes(aws, bucket, files, s3):
    data = rand(50_000)
    f = files("pm.bin", data)
    r = aws("--debug", "s3api", "put-object", "--bucket", bucket, "--key", "unsigned", "--body", f, profile="unsigned")
    assert "UNSIGNED-PAYLOAD" in r.stderr, "payload_signing_enabled=false must send UNSIGNED-PAYLOAD"
    r = aws("--debug", "s3api", "put-object", "--bucket", bucket, "--key", "signed", "--body", f)
    assert "UNSIGNED-PAYLOAD" not in r.stderr and sha256(data) in r.stderr, "default over http signs the payload hash"
    for k in ("unsigned", "signed"):
        assert sha256(s3.get_object(Bucket=bucket, Key=k)["Body"].read()) == sha256(data)


def test_cli_key_edge_cases(aws, target, bucket, files):
    f = files("k.bin", b"key edge")
    long_key = "L" * 1000 + "/" + "é" * 11 + "x"  # 1024 bytes of UTF-8
    assert len(long_key.encode()) == 1024
    aws("s3api", "put-object", "--bucket", bucket, "--key", long_key, "--body", f)
    assert aws("s3api", "head-object", "--bucket", bucket, "--key", long_key).json["ContentLength"] == 8
    aws.error("s3api", "put-object", "--bucket", bucket, "--key", long_key + "y", "--body", f, code="KeyTooLongError")
    before = {p.relative_to(target.workdir) for p in target.workdir.rglob("*")}
    r = aws("s3api", "put-object", "--bucket", bucket, "--key", "../../cli-escape", "--body", f, rc=None)
    if r.rc == 0:
        keys = [o["Key"] for o in aws("s3api", "list-objects-v2", "--bucket", bucket).json["Contents"]]
        assert "../../cli-escape" in keys
    else:
        assert r.rc == S3API_ERROR_RC and "An error occurred (" in r.stderr, r.stderr
    after = {p.relative_to(target.workdir) for p in target.workdir.rglob("*")}
    escaped = {p for p in after - before if not str(p).startswith("jail/data")}
    assert not escaped, f"files created outside data_dir: {escaped}"


def test_s3_sync_and_mv(aws, bucket, tmp_path, files):
    """`aws s3 sync` compares sizes and LastModified from the listing: an
    unchanged tree must not be re-uploaded (catches LastModified/timezone
    bugs), a changed file is."""
    src = tmp_path / "src"
    tree = {"a.txt": b"a" * 10, "d/b.txt": b"b" * 20, "d/e/c.txt": b"c" * 30}
    for rel, body in tree.items():
        files(f"src/{rel}", body)
    up = aws("s3", "sync", src, f"s3://{bucket}/sync/").stdout
    assert up.count("upload:") == 3, up
    again = aws("s3", "sync", src, f"s3://{bucket}/sync/").stdout
    assert "upload:" not in again, f"unchanged files were uploaded again:\n{again}"
    (src / "d" / "b.txt").write_bytes(b"changed size")
    again = aws("s3", "sync", src, f"s3://{bucket}/sync/").stdout
    assert again.count("upload:") == 1 and "d/b.txt" in again, again
    dst = tmp_path / "dst"
    down = aws("s3", "sync", f"s3://{bucket}/sync/", dst).stdout
    assert down.count("download:") == 3, down
    assert (dst / "d" / "b.txt").read_bytes() == b"changed size"
    assert (dst / "d" / "e" / "c.txt").read_bytes() == b"c" * 30
    again = aws("s3", "sync", f"s3://{bucket}/sync/", dst).stdout
    assert "download:" not in again, f"unchanged objects were downloaded again:\n{again}"
    aws("s3", "mv", f"s3://{bucket}/sync/a.txt", f"s3://{bucket}/moved/a.txt")
    keys = _ls_keys(aws("s3", "ls", "--recursive", f"s3://{bucket}/").stdout)
    assert "moved/a.txt" in keys and "sync/a.txt" not in keys


# --------------------------------------------------------------------------
# issue 18: server-side multipart copy, UploadPartCopy, ACLs, parts, versions
# --------------------------------------------------------------------------


def test_s3_cp_server_side_copy_above_multipart_threshold(aws_5mb, s3, bucket):
    """`aws s3 cp s3://… s3://…` of an object above multipart_threshold is
    CreateMultipartUpload + UploadPartCopy (5 MB parts: 4 of them)."""
    aws = aws_5mb
    data = rand(20 * MiB)
    s3.put_object(Bucket=bucket, Key="big", Body=data)  # one part: a copy's 4 parts show in its ETag
    aws("s3", "cp", f"s3://{bucket}/big", f"s3://{bucket}/copy of big", timeout=300)
    h = aws("s3api", "head-object", "--bucket", bucket, "--key", "copy of big").json
    assert h["ContentLength"] == len(data)
    assert h["ETag"] == multipart_etag([data[i : i + 5 * MiB] for i in range(0, len(data), 5 * MiB)])
    assert sha256(s3.get_object(Bucket=bucket, Key="copy of big")["Body"].read()) == sha256(data)


def test_s3api_upload_part_copy(aws, s3, bucket, files):
    src, tail = rand(5 * MiB + 100), rand(1000)
    s3.put_object(Bucket=bucket, Key="src ü+", Body=src)
    s3.put_object(Bucket=bucket, Key="tail", Body=tail)
    uid = aws("s3api", "create-multipart-upload", "--bucket", bucket, "--key", "dst").json["UploadId"]
    r1 = aws(
        "s3api", "upload-part-copy", "--bucket", bucket, "--key", "dst", "--upload-id", uid, "--part-number", "1",
        "--copy-source", f"{bucket}/src ü+", "--copy-source-range", f"bytes=100-{len(src) - 1}",
    ).json
    r2 = aws(
        "s3api", "upload-part-copy", "--bucket", bucket, "--key", "dst", "--upload-id", uid, "--part-number", "2",
        "--copy-source", f"{bucket}/tail",
    ).json
    etags = [r1["CopyPartResult"]["ETag"], r2["CopyPartResult"]["ETag"]]
    assert etags == [f'"{md5_hex(src[100:])}"', f'"{md5_hex(tail)}"']
    spec = json.dumps({"Parts": [{"PartNumber": i, "ETag": e} for i, e in enumerate(etags, 1)]})
    r = aws("s3api", "complete-multipart-upload", "--bucket", bucket, "--key", "dst", "--upload-id", uid,
            "--multipart-upload", spec).json
    assert r["ETag"] == multipart_etag([src[100:], tail])
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == src[100:] + tail


def _grants(acl: dict) -> set:
    return {(g["Grantee"].get("ID") or g["Grantee"].get("URI"), g["Permission"]) for g in acl["Grants"]}


def test_cli_owners_and_acls(aws, files, tmp_path):
    """erin and frank (no config grants) through the CLI: ownership, canned
    ACLs, an explicit grant and its revocation, anonymous reads."""
    e, f = canonical_id("erin"), canonical_id("frank")
    b = unique_bucket("cliacl")
    aws("s3", "mb", f"s3://{b}", profile="erin")
    try:
        r = aws("s3api", "list-buckets", profile="erin").json
        assert [x["Name"] for x in r["Buckets"]] == [b] and r["Owner"] == owner("erin")
        assert b not in [x["Name"] for x in aws("s3api", "list-buckets", profile="frank").json["Buckets"]]
        aws.error("s3api", "create-bucket", "--bucket", b, profile="frank", code="BucketAlreadyExists")
        pub, priv = files("pub.txt", b"public"), files("priv.txt", b"private")
        aws("s3", "cp", pub, f"s3://{b}/pub.txt", "--acl", "public-read", profile="erin")
        aws("s3api", "put-object", "--bucket", b, "--key", "priv.txt", "--body", priv, profile="erin")
        out = tmp_path / "out"
        aws("s3api", "get-object", "--bucket", b, "--key", "pub.txt", out, "--no-sign-request")
        assert out.read_bytes() == b"public"
        aws.error("s3api", "get-object", "--bucket", b, "--key", "priv.txt", out, "--no-sign-request", code="AccessDenied")
        acl = aws("s3api", "get-object-acl", "--bucket", b, "--key", "pub.txt", profile="erin").json
        assert acl["Owner"] == owner("erin") and _grants(acl) == {(e, "FULL_CONTROL"), (ALL_USERS, "READ")}
        aws.error("s3", "ls", f"s3://{b}/", profile="frank", code="AccessDenied")
        aws("s3api", "put-bucket-acl", "--bucket", b, "--grant-full-control", f"id={e}", "--grant-read", f"id={f}", profile="erin")
        acl = aws("s3api", "get-bucket-acl", "--bucket", b, profile="erin").json
        assert _grants(acl) == {(e, "FULL_CONTROL"), (f, "READ")}
        assert "pub.txt" in aws("s3", "ls", f"s3://{b}/", profile="frank").stdout
        aws.error("s3api", "get-object", "--bucket", b, "--key", "priv.txt", out, profile="frank", code="AccessDenied")
        aws("s3api", "put-bucket-acl", "--bucket", b, "--acl", "private", profile="erin")
        aws.error("s3", "ls", f"s3://{b}/", profile="frank", code="AccessDenied")
    finally:
        aws("s3", "rb", "--force", f"s3://{b}", profile="erin", rc=None)


def test_s3api_part_number_and_versions(aws, s3, bucket, tmp_path):
    parts = [rand(5 * MiB), rand(1000)]
    uid = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    etags = [s3.upload_part(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=i, Body=p)["ETag"] for i, p in enumerate(parts, 1)]
    s3.complete_multipart_upload(
        Bucket=bucket, Key="mp", UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": i, "ETag": e} for i, e in enumerate(etags, 1)]},
    )
    out = tmp_path / "part2"
    r = aws("s3api", "get-object", "--bucket", bucket, "--key", "mp", "--part-number", "2", out).json
    assert out.read_bytes() == parts[1]
    assert (r["ContentLength"], r["PartsCount"], r["ContentRange"]) == (1000, 2, f"bytes {5 * MiB}-{5 * MiB + 999}/{5 * MiB + 1000}")
    h = aws("s3api", "head-object", "--bucket", bucket, "--key", "mp", "--part-number", "1").json
    assert (h["ContentLength"], h["PartsCount"]) == (5 * MiB, 2)
    aws.error("s3api", "head-object", "--bucket", bucket, "--key", "mp", "--part-number", "3", code="416")
    v = aws("s3api", "list-object-versions", "--bucket", bucket).json
    assert [(x["Key"], x["VersionId"], x["IsLatest"]) for x in v["Versions"]] == [("mp", "null", True)]
    aws("s3api", "get-object", "--bucket", bucket, "--key", "mp", "--version-id", "null", out)
    assert out.read_bytes() == b"".join(parts)
    aws("s3api", "delete-object", "--bucket", bucket, "--key", "mp", "--version-id", "null")
    assert not aws("s3api", "list-object-versions", "--bucket", bucket).json.get("Versions")
