"""Binary-level behaviour: config validation, readiness line, SIGTERM,
persistence across restarts, secret_file and max_clock_skew_secs. Each test
runs its own storage-target instance."""

from __future__ import annotations

import datetime as dt
import subprocess

import pytest
import yaml
from botocore.exceptions import ClientError

from conftest import USERS, StorageTarget, default_users_config, storage_target_bin
from s3util import User, amz_date, assert_s3_error, key_path, rand, raw_request, sha256


def run_with_config(tmp_path, cfg: dict, timeout=20) -> subprocess.CompletedProcess:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return subprocess.run(
        [str(storage_target_bin()), "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def base_config(tmp_path) -> dict:
    (tmp_path / "data").mkdir(exist_ok=True)
    return {
        "listen": "127.0.0.1:0",
        "region": "us-east-1",
        "data_dir": str(tmp_path / "data"),
        "users": [{"access_key_id": "u", "secret": "s", "buckets": [{"name": "*", "access": "read-write"}]}],
    }


def test_unknown_config_field_rejected(tmp_path):
    if not storage_target_bin().exists():
        pytest.fail(f"storage-target binary missing: {storage_target_bin()}")
    cfg = base_config(tmp_path)
    cfg["listne_typo"] = "127.0.0.1:0"
    p = run_with_config(tmp_path, cfg)
    assert p.returncode != 0
    assert "listne_typo" in p.stderr, p.stderr
    assert "storage-target listening" not in p.stdout


def test_unknown_user_field_and_bad_access_rejected(tmp_path):
    cfg = base_config(tmp_path)
    cfg["users"][0]["buckets"][0]["access"] = "everything"
    p = run_with_config(tmp_path, cfg)
    assert p.returncode != 0 and "everything" in p.stderr, p.stderr
    cfg = base_config(tmp_path)
    cfg["users"][0]["secrte"] = "typo"
    p = run_with_config(tmp_path, cfg)
    assert p.returncode != 0 and "secrte" in p.stderr, p.stderr


def test_missing_config_file(tmp_path):
    p = subprocess.run(
        [str(storage_target_bin()), "--config", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert p.returncode != 0
    assert "nope.yaml" in p.stderr, p.stderr


def test_check_validates_without_serving(tmp_path):
    """--check: exit 0 with "configuration is valid" for a good file, the
    same error as a real start for a bad one; it never binds or opens the store."""
    cfg = base_config(tmp_path)
    cfg["data_dir"] = str(tmp_path / "never-created")
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(cfg))
    p = subprocess.run(
        [str(storage_target_bin()), "--config", str(path), "--check"], capture_output=True, text=True, timeout=20
    )
    assert p.returncode == 0, p.stderr
    assert "configuration is valid" in p.stdout
    assert not (tmp_path / "never-created").exists()
    cfg["rdma"] = {"mode": "enabled", "backend": "tcp", "fabric_key_file": str(tmp_path / "missing.key")}
    path.write_text(yaml.safe_dump(cfg))
    p = subprocess.run(
        [str(storage_target_bin()), "--config", str(path), "--check"], capture_output=True, text=True, timeout=20
    )
    assert p.returncode != 0
    assert "rdma.fabric_key_file" in p.stderr and "missing.key" in p.stderr, p.stderr


def test_ready_line_sigterm_and_persistence(make_target):
    st: StorageTarget = make_target(metrics=False)
    st.start()
    assert st.stdout_lines[0].startswith("storage-target listening on http://127.0.0.1:")
    assert not any(line.startswith("metrics on") for line in st.stdout_lines)
    c = st.client("alice")
    c.create_bucket(Bucket="persist")
    data = rand(300_000)
    c.put_object(Bucket="persist", Key="dir/obj", Body=data, Metadata={"k": "v"}, ContentType="text/x-p")
    before = c.head_object(Bucket="persist", Key="dir/obj")
    created = {b["Name"]: b["CreationDate"] for b in c.list_buckets()["Buckets"]}["persist"]
    uid = c.create_multipart_upload(Bucket="persist", Key="mp")["UploadId"]
    c.upload_part(Bucket="persist", Key="mp", UploadId=uid, PartNumber=1, Body=b"part one")
    first_endpoint = st.endpoint
    rc = st.stop()
    assert rc == 0, f"SIGTERM should stop storage-target cleanly, rc={rc}\n{st.stderr_tail()}"
    st.start()
    c = st.client("alice")
    assert st.endpoint.startswith("http://127.0.0.1:")
    del first_endpoint
    g = c.get_object(Bucket="persist", Key="dir/obj")
    assert sha256(g["Body"].read()) == sha256(data)
    assert g["Metadata"] == {"k": "v"} and g["ContentType"] == "text/x-p"
    assert (g["ETag"], g["LastModified"]) == (before["ETag"], before["LastModified"])
    assert {b["Name"]: b["CreationDate"] for b in c.list_buckets()["Buckets"]}["persist"] == created
    # in-progress multipart uploads survive a restart too
    ups = c.list_multipart_uploads(Bucket="persist").get("Uploads", [])
    assert [u["UploadId"] for u in ups] == [uid]
    parts = [{"PartNumber": 1, "ETag": c.list_parts(Bucket="persist", Key="mp", UploadId=uid)["Parts"][0]["ETag"]}]
    c.complete_multipart_upload(Bucket="persist", Key="mp", UploadId=uid, MultipartUpload={"Parts": parts})
    assert c.get_object(Bucket="persist", Key="mp")["Body"].read() == b"part one"
    # bucket ownership persists: bob still cannot take alice's bob-* bucket
    c.create_bucket(Bucket="bob-owned-by-alice")
    st.restart()
    with pytest.raises(ClientError) as e:
        st.client("bob").create_bucket(Bucket="bob-owned-by-alice")
    assert e.value.response["Error"]["Code"] == "BucketAlreadyExists"
    # ...while alice, its owner, may re-create it (200 in us-east-1)
    st.client("alice").create_bucket(Bucket="bob-owned-by-alice")


def test_max_clock_skew_setting(make_target, tmp_path):
    st = make_target(metrics=False, extra={"max_clock_skew_secs": 60})
    st.start()
    alice = USERS["alice"]
    c = st.client("alice")
    c.create_bucket(Bucket="skew")
    now = dt.datetime.now(dt.timezone.utc)
    r = raw_request(st.endpoint, "GET", key_path("skew"), user=alice, timestamp=amz_date(now - dt.timedelta(seconds=20)))
    assert r.status == 200, r
    r = raw_request(st.endpoint, "GET", key_path("skew"), user=alice, timestamp=amz_date(now - dt.timedelta(minutes=5)))
    assert_s3_error(r, 403, "RequestTimeTooSkewed")


def test_secret_file_trailing_newline_trimmed(make_target, tmp_path):
    secret = tmp_path / "s.secret"
    secret.write_text("file-secret-123\n")
    secret.chmod(0o600)  # the target refuses secret files others can read
    users = [
        {"access_key_id": "filer", "secret_file": str(secret), "buckets": [{"name": "*", "access": "read-write"}]},
    ]
    st = make_target(users=users, metrics=False)
    st.start()
    ok = st.client(User("filer", "filer", "file-secret-123"))
    ok.create_bucket(Bucket="filer")
    ok.put_object(Bucket="filer", Key="k", Body=b"v")
    bad = st.client(User("filer", "filer", "file-secret-123\n"))
    with pytest.raises(ClientError) as e:
        bad.list_objects_v2(Bucket="filer")
    assert e.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    # the secret is never logged
    assert "file-secret-123" not in st.log_path.read_text(errors="replace")


def test_default_users_config_is_valid_yaml(tmp_path):
    users = default_users_config(tmp_path)
    assert yaml.safe_load(yaml.safe_dump(users)) == users


def test_inflight_upload_invisible_and_kill9_safe(make_target):
    """While a PUT body is still arriving the key is not visible; SIGKILL in
    the middle leaves the old version intact and no partial object after a
    restart."""
    import http.client
    import time
    from urllib.parse import urlsplit

    from s3util import UNSIGNED_PAYLOAD, amz_date, md5_hex, sign_headers

    st = make_target(metrics=False)
    st.start()
    c = st.client("alice")
    c.create_bucket(Bucket="crash")
    old = rand(100_000)
    c.put_object(Bucket="crash", Key="obj", Body=old)
    c.put_object(Bucket="crash", Key="other", Body=b"untouched")

    total = 8 * 1024 * 1024
    u = urlsplit(st.endpoint)
    ts = amz_date()
    hdrs = {"Host": u.netloc, "x-amz-date": ts, "x-amz-content-sha256": UNSIGNED_PAYLOAD, "Content-Length": str(total)}
    conns = []
    for key in ("obj", "new"):
        auth, _ = sign_headers("PUT", key_path("crash", key), [], hdrs, UNSIGNED_PAYLOAD, USERS["alice"], ts)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.putrequest("PUT", key_path("crash", key), skip_host=True, skip_accept_encoding=True)
        for k, v in {**hdrs, "Authorization": auth}.items():
            conn.putheader(k, v)
        conn.endheaders()
        conn.send(b"x" * (total // 2))  # half the body, then stall
        conns.append(conn)
    time.sleep(0.5)
    listed = [o["Key"] for o in c.list_objects_v2(Bucket="crash")["Contents"]]
    assert listed == ["obj", "other"], listed
    assert c.get_object(Bucket="crash", Key="obj")["Body"].read() == old
    with pytest.raises(ClientError) as e:
        c.head_object(Bucket="crash", Key="new")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404

    st.proc.kill()  # SIGKILL mid-upload
    st.proc.wait()
    st.proc = None
    for conn in conns:
        conn.close()
    st.start()
    c = st.client("alice")
    listed = {o["Key"]: o for o in c.list_objects_v2(Bucket="crash")["Contents"]}
    assert sorted(listed) == ["obj", "other"]
    g = c.get_object(Bucket="crash", Key="obj")
    assert g["Body"].read() == old and g["ETag"] == f'"{md5_hex(old)}"'
    assert listed["obj"]["Size"] == len(old)
    with pytest.raises(ClientError):
        c.head_object(Bucket="crash", Key="new")
