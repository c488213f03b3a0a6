"""Protocol edges: retried and racing multipart completions, an empty
delimiter, url-encoded listings of control characters, presigned-URL
expiry limits, requests to a missing bucket, HTTP-chunked PUTs without a
Content-Length, and Content-Encoding with aws-chunked removed."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import threading
import time
from urllib.parse import unquote_plus, urlsplit

import pytest
from botocore.exceptions import ClientError

from s3util import (
    REGION,
    S3_NS,
    STREAMING_UNSIGNED_TRAILER,
    UNSIGNED_PAYLOAD,
    MiB,
    amz_date,
    assert_all_refused,
    assert_client_error,
    assert_s3_error,
    canonical_query,
    crc32_b64,
    key_path,
    multipart_etag,
    rand,
    raw_request,
    send,
    sha256,
    signing_key,
    unique_bucket,
)

# --------------------------------------------------------------------------
# multipart completion
# --------------------------------------------------------------------------


def test_complete_retried_returns_the_same_result(s3, bucket):
    parts = [rand(5 * MiB), rand(10)]
    uid = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    spec = {
        "Parts": [
            {"PartNumber": i, "ETag": s3.upload_part(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=i, Body=p)["ETag"]}
            for i, p in enumerate(parts, 1)
        ]
    }
    first = s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=uid, MultipartUpload=spec)
    assert first["ETag"] == multipart_etag(parts)
    before = s3.head_object(Bucket=bucket, Key="mp")
    time.sleep(1.1)  # a rewrite would show in Last-Modified
    again = s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=uid, MultipartUpload=spec)
    assert again["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert (again["ETag"], again["Bucket"], again["Key"]) == (first["ETag"], bucket, "mp")
    after = s3.head_object(Bucket=bucket, Key="mp")
    assert (after["ETag"], after["LastModified"], after["ContentLength"]) == (
        before["ETag"], before["LastModified"], before["ContentLength"]
    )
    assert s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == b"".join(parts)
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_racing_upload_part_keeps_the_last_completed(target, users, s3, bucket):
    """Part 1 is sent twice at once: the upload that started first finishes
    last, and its bytes are the part."""
    uid = s3.create_multipart_upload(Bucket=bucket, Key="race")["UploadId"]
    slow, fast = rand(MiB), rand(MiB)
    started, release, out = threading.Event(), threading.Event(), {}

    def slow_body():
        yield slow[:4096]
        started.set()
        release.wait(30)
        yield slow[4096:]

    def slow_upload():
        out["r"] = raw_request(
            target.endpoint, "PUT", key_path(bucket, "race"),
            query=[("partNumber", "1"), ("uploadId", uid)],
            headers={"Content-Length": str(len(slow))},
            body=slow_body(), user=users["alice"], payload_hash=UNSIGNED_PAYLOAD,
        )

    t = threading.Thread(target=slow_upload)
    t.start()
    try:
        assert started.wait(10)
        time.sleep(0.2)  # the server is inside the slow part's body
        fast_etag = s3.upload_part(Bucket=bucket, Key="race", UploadId=uid, PartNumber=1, Body=fast)["ETag"]
    finally:
        release.set()
        t.join(60)
    r = out["r"]
    assert r.status == 200, r
    slow_etag = r.header("etag")
    assert slow_etag == f'"{hashlib.md5(slow).hexdigest()}"' and slow_etag != fast_etag
    assert [(p["PartNumber"], p["ETag"]) for p in s3.list_parts(Bucket=bucket, Key="race", UploadId=uid)["Parts"]] == [
        (1, slow_etag)
    ]
    with pytest.raises(ClientError) as e:  # the part that was replaced
        s3.complete_multipart_upload(
            Bucket=bucket, Key="race", UploadId=uid, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": fast_etag}]}
        )
    assert_client_error(e, "InvalidPart", 400)
    s3.complete_multipart_upload(
        Bucket=bucket, Key="race", UploadId=uid, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": slow_etag}]}
    )
    assert s3.get_object(Bucket=bucket, Key="race")["Body"].read() == slow


# --------------------------------------------------------------------------
# listings
# --------------------------------------------------------------------------


def test_empty_delimiter_means_none(target, users, s3, bucket):
    keys = ["a/b", "a/c/d", "e"]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=b"x")
    for r in (s3.list_objects_v2(Bucket=bucket, Delimiter=""), s3.list_objects(Bucket=bucket, Delimiter="")):
        assert [o["Key"] for o in r["Contents"]] == keys
        assert not r.get("CommonPrefixes"), r
    r = raw_request(target.endpoint, "GET", key_path(bucket), query=[("list-type", "2"), ("delimiter", "")], user=users["alice"])
    assert r.status == 200, r
    assert [e.findtext(f"{S3_NS}Key") for e in r.xml().findall(f"{S3_NS}Contents")] == keys
    assert not r.xml().findall(f"{S3_NS}CommonPrefixes"), r


def _encoded(root, path: str) -> list[str]:
    vals = [e.text or "" for e in root.findall(path)]
    for v in vals:
        assert all(32 < ord(c) < 127 for c in v), f"{path}: {v!r} is not url-encoded"
    return [unquote_plus(v) for v in vals]


def test_encoding_type_url_encodes_control_characters(target, users, s3, bucket):
    keys = ["k\x01a/one", "k\x01a/two\n", "k\x01b\tthree", "k\x01c\x01d", "other"]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=b"x")
    alice = users["alice"]
    r = raw_request(
        target.endpoint, "GET", key_path(bucket), user=alice,
        query=[("list-type", "2"), ("encoding-type", "url"), ("prefix", "k\x01"), ("delimiter", "/"), ("start-after", "k\x01\t")],
    )
    assert r.status == 200, r
    assert b"\x01" not in r.body and b"&#" not in r.body, r.body
    root = r.xml()
    assert root.findtext(f"{S3_NS}EncodingType") == "url"
    assert _encoded(root, f"{S3_NS}Prefix") == ["k\x01"]
    assert _encoded(root, f"{S3_NS}StartAfter") == ["k\x01\t"]
    assert _encoded(root, f"{S3_NS}Delimiter") == ["/"]
    assert _encoded(root, f"{S3_NS}CommonPrefixes/{S3_NS}Prefix") == ["k\x01a/"]
    assert _encoded(root, f"{S3_NS}Contents/{S3_NS}Key") == ["k\x01b\tthree", "k\x01c\x01d"]
    # a control character as the delimiter, in ListObjects (v1)
    r = raw_request(
        target.endpoint, "GET", key_path(bucket), user=alice,
        query=[("encoding-type", "url"), ("prefix", "k"), ("delimiter", "\x01")],
    )
    assert r.status == 200, r
    assert b"\x01" not in r.body and b"&#" not in r.body, r.body
    root = r.xml()
    assert _encoded(root, f"{S3_NS}Delimiter") == ["\x01"]
    assert _encoded(root, f"{S3_NS}CommonPrefixes/{S3_NS}Prefix") == ["k\x01"]
    assert not root.findall(f"{S3_NS}Contents")
    r = raw_request(
        target.endpoint, "GET", key_path(bucket), user=alice,
        query=[("encoding-type", "url"), ("prefix", "k\x01a/"), ("delimiter", "\n")],
    )
    assert r.status == 200, r
    root = r.xml()
    assert _encoded(root, f"{S3_NS}Contents/{S3_NS}Key") == ["k\x01a/one"]
    assert _encoded(root, f"{S3_NS}CommonPrefixes/{S3_NS}Prefix") == ["k\x01a/two\n"]
    assert _encoded(root, f"{S3_NS}Delimiter") == ["\n"]


# --------------------------------------------------------------------------
# presigned URLs: expiry
# --------------------------------------------------------------------------


def presign(endpoint: str, user, method: str, path: str, expires, timestamp: str | None = None) -> str:
    """A SigV4 query-signed path?query for ``path``; ``expires`` is sent as is."""
    ts = timestamp or amz_date()
    host = urlsplit(endpoint).netloc
    scope = f"{ts[:8]}/{REGION}/s3/aws4_request"
    query = [
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
        ("X-Amz-Credential", f"{user.access_key}/{scope}"),
        ("X-Amz-Date", ts),
        ("X-Amz-Expires", str(expires)),
        ("X-Amz-SignedHeaders", "host"),
    ]
    creq = "\n".join([method, path, canonical_query(query), f"host:{host}\n", "host", UNSIGNED_PAYLOAD])
    sts = "\n".join(["AWS4-HMAC-SHA256", ts, scope, sha256(creq.encode())])
    sig = hmac.new(signing_key(user.secret, ts[:8]), sts.encode(), hashlib.sha256).hexdigest()
    return path + "?" + canonical_query(query + [("X-Amz-Signature", sig)])


def _get(target, path_qs: str):
    return send(target.endpoint, "GET", path_qs, {"Host": urlsplit(target.endpoint).netloc})


def test_presigned_expiry_limits(target, users, s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"presigned")
    alice, path = users["alice"], key_path(bucket, "k")
    r = _get(target, presign(target.endpoint, alice, "GET", path, 60))
    assert r.status == 200 and r.body == b"presigned", r  # the signer is right
    assert _get(target, presign(target.endpoint, alice, "GET", path, 604800)).status == 200
    ten_minutes_ago = amz_date(dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=10))
    cases = [
        (presign(target.endpoint, alice, "GET", path, 60, ten_minutes_ago), "Request has expired"),
        (presign(target.endpoint, alice, "GET", path, 604801), "X-Amz-Expires must be less than a week (in seconds); that is, the given X-Amz-Expires must be less than 604800 seconds"),
        (presign(target.endpoint, alice, "GET", path, 0), "X-Amz-Expires must be non-negative"),
        (presign(target.endpoint, alice, "GET", path, -1), "X-Amz-Expires must be non-negative"),
    ]
    wrong = []
    for url, message in cases:
        r = _get(target, url)
        try:
            err = assert_s3_error(r, 403, "AccessDenied")
            assert err.get("Message") == message, f"Message {err.get('Message')!r}, want {message!r}"
        except AssertionError as e:
            wrong.append(f"{url.split('X-Amz-Date=')[1][:40]}...: {e}")
        assert b"presigned" not in r.body
    assert not wrong, "\n".join(wrong)


# --------------------------------------------------------------------------
# a bucket that does not exist
# --------------------------------------------------------------------------


@pytest.mark.parametrize("user", ["alice", "bob", "carol", "erin"])
def test_missing_bucket_is_404_for_everyone(target, user):
    """Whoever asks, and whatever their grants: NoSuchBucket."""
    c, b = target.client(user), unique_bucket("nosuch")
    calls = {
        "ListObjectsV2": lambda: c.list_objects_v2(Bucket=b),
        "ListObjects": lambda: c.list_objects(Bucket=b),
        "ListObjectVersions": lambda: c.list_object_versions(Bucket=b),
        "ListMultipartUploads": lambda: c.list_multipart_uploads(Bucket=b),
        "GetBucketLocation": lambda: c.get_bucket_location(Bucket=b),
        "GetBucketAcl": lambda: c.get_bucket_acl(Bucket=b),
        "PutBucketAcl": lambda: c.put_bucket_acl(Bucket=b, ACL="private"),
        "DeleteBucket": lambda: c.delete_bucket(Bucket=b),
        "GetObject": lambda: c.get_object(Bucket=b, Key="k"),
        "PutObject": lambda: c.put_object(Bucket=b, Key="k", Body=b"x"),
        "DeleteObject": lambda: c.delete_object(Bucket=b, Key="k"),
        "GetObjectAcl": lambda: c.get_object_acl(Bucket=b, Key="k"),
        "CreateMultipartUpload": lambda: c.create_multipart_upload(Bucket=b, Key="k"),
        "HeadBucket": lambda: c.head_bucket(Bucket=b),
        "HeadObject": lambda: c.head_object(Bucket=b, Key="k"),
    }
    assert_all_refused(calls, 404, ("NoSuchBucket", "404"))


def test_missing_bucket_is_404_raw_and_anonymous(target, users):
    b = unique_bucket("nosuch")
    for user in (users["alice"], users["frank"], None):
        for method, path in (("GET", key_path(b)), ("GET", key_path(b, "k")), ("PUT", key_path(b, "k")), ("DELETE", key_path(b, "k"))):
            r = raw_request(target.endpoint, method, path, user=user, body=b"x" if method == "PUT" else b"")
            err = assert_s3_error(r, 404, "NoSuchBucket")
            assert err.get("BucketName") in (None, b), err


# --------------------------------------------------------------------------
# bodies: HTTP chunked, aws-chunked Content-Encoding
# --------------------------------------------------------------------------


def _http_chunks(data: bytes, size: int = 7000):
    for i in range(0, len(data), size):
        piece = data[i : i + size]
        yield f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    yield b"0\r\n\r\n"


@pytest.mark.xfail(
    strict=True,
    reason="known gap: s3s refuses a body of unknown length (411 MissingContentLength); accepting it needs "
    "the signature verified before the body is spooled, which s3s does only after",
)
@pytest.mark.parametrize("size", [0, 100_000])
@pytest.mark.parametrize("signed", [False, True], ids=["unsigned-payload", "payload-hash"])
def test_transfer_encoding_chunked_put(target, users, s3, bucket, size, signed):
    data = rand(size)
    try:
        r = raw_request(
            target.endpoint, "PUT", key_path(bucket, "chunked"),
            body=list(_http_chunks(data)), user=users["alice"],
            payload_hash=sha256(data) if signed else UNSIGNED_PAYLOAD,
            after_sign=lambda h: h.update({"Transfer-Encoding": "chunked"}),
        )
    except (BrokenPipeError, ConnectionResetError) as e:
        pytest.fail(f"the server closed the connection before taking the chunked body: {e!r}")
    assert r.status == 200, r
    assert r.header("etag") == f'"{hashlib.md5(data).hexdigest()}"'
    assert s3.get_object(Bucket=bucket, Key="chunked")["Body"].read() == data


@pytest.mark.parametrize(
    "sent, stored",
    [("gzip, aws-chunked", "gzip"), ("aws-chunked,br", "br"), ("aws-chunked", None), ("gzip,aws-chunked", "gzip")],
)
def test_aws_chunked_is_removed_from_content_encoding(target, users, s3, bucket, sent, stored):
    data = rand(3000)
    encoded = (
        f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n" + f"x-amz-checksum-crc32:{crc32_b64(data)}\r\n\r\n".encode()
    )
    r = raw_request(
        target.endpoint, "PUT", key_path(bucket, "ce"), body=encoded, user=users["alice"],
        payload_hash=STREAMING_UNSIGNED_TRAILER,
        headers={
            "Content-Encoding": sent,
            "Content-Length": str(len(encoded)),
            "x-amz-decoded-content-length": str(len(data)),
            "x-amz-trailer": "x-amz-checksum-crc32",
        },
    )
    assert r.status == 200, r
    h = s3.head_object(Bucket=bucket, Key="ce")
    assert h.get("ContentEncoding") == stored and h["ContentLength"] == len(data)
    g = s3.get_object(Bucket=bucket, Key="ce")
    assert g.get("ContentEncoding") == stored and g["Body"].read() == data
