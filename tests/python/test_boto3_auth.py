"""Authentication and authorization: SigV4 header auth in every payload mode
(signed hash, UNSIGNED-PAYLOAD, STREAMING-AWS4-HMAC-SHA256-PAYLOAD,
STREAMING-UNSIGNED-PAYLOAD-TRAILER), presigned URLs, anonymous requests,
wrong secrets / unknown keys / skewed clocks, per-bucket grants, and the
<RequestId> == x-amz-request-id rule on raw error responses."""

from __future__ import annotations

import contextlib
import datetime as dt
import http.client
import time
import urllib.error
import urllib.request
from unittest import mock
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from s3util import (
    STREAMING_UNSIGNED_TRAILER,
    UNSIGNED_PAYLOAD,
    MiB,
    Resp,
    SentHeaders,
    User,
    amz_date,
    canonical_query,
    assert_all_refused,
    assert_client_error,
    assert_s3_error,
    crc32_b64,
    force_unsigned_trailer,
    key_path,
    md5_hex,
    rand,
    raw_request,
    send,
    sha256,
    sign_headers,
    streaming_signed_put,
    unique_bucket,
    unsigned_trailer_put,
)

# --------------------------------------------------------------------------
# the test signer itself
# --------------------------------------------------------------------------


def test_own_signer_matches_botocore():
    """Our raw-request signer agrees with botocore's S3SigV4Auth, so raw-test
    failures point at the server."""
    user = User("x", "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    ts = "20250102T030405Z"
    path = key_path("bucket", "dir/ünï code+x.txt")
    query = [("partNumber", "3"), ("uploadId", "a/b+c=")]
    body = b"payload"
    headers = {"Host": "127.0.0.1:9000", "x-amz-date": ts, "x-amz-content-sha256": sha256(body), "x-amz-meta-k": "  v  w "}
    auth, _ = sign_headers("PUT", path, query, headers, sha256(body), user, ts)

    url = "http://127.0.0.1:9000" + path + "?" + canonical_query(query)
    req = AWSRequest(method="PUT", url=url, data=body, headers={k: v for k, v in headers.items() if k != "Host"})
    with mock.patch("botocore.auth.get_current_datetime", return_value=dt.datetime(2025, 1, 2, 3, 4, 5)):
        S3SigV4Auth(Credentials(user.access_key, user.secret), "s3", "us-east-1").add_auth(req)
    assert req.headers["Authorization"] == auth


# --------------------------------------------------------------------------
# payload modes through boto3
# --------------------------------------------------------------------------


def _roundtrip(client, bucket, key, data):
    r = client.put_object(Bucket=bucket, Key=key, Body=data)
    assert r["ETag"] == f'"{md5_hex(data)}"'
    assert sha256(client.get_object(Bucket=bucket, Key=key)["Body"].read()) == sha256(data)


def test_payload_signed_sha256(target, bucket):
    c = target.client("alice")
    sent = SentHeaders(c)
    _roundtrip(c, bucket, "signed", rand(300_000))
    mode = sent.content_sha256("PUT")[0]
    assert len(mode) == 64 and int(mode, 16) >= 0, f"expected a hex payload hash, sent {mode}"


def test_payload_unsigned(target, bucket):
    c = target.client("alice", s3={"payload_signing_enabled": False})
    sent = SentHeaders(c)
    _roundtrip(c, bucket, "unsigned", rand(300_000))
    assert sent.content_sha256("PUT") == [UNSIGNED_PAYLOAD]


@pytest.mark.parametrize("size", [0, 10, 3 * MiB + 5])
def test_payload_streaming_unsigned_trailer_boto3(target, bucket, size):
    """What the newest botocore/aws CLI send by default over HTTPS:
    aws-chunked body + x-amz-checksum-crc32 trailer, HTTP chunked framing."""
    c = target.client("alice", request_checksum_calculation="when_supported")
    force_unsigned_trailer(c)
    sent = SentHeaders(c)
    _roundtrip(c, bucket, f"trailer-{size}", rand(size))
    assert sent.content_sha256("PUT") == [STREAMING_UNSIGNED_TRAILER]
    h = sent.requests[0][2]
    assert h.get("Content-Encoding") == "aws-chunked" and h.get("X-Amz-Trailer") == "x-amz-checksum-crc32"


def test_payload_streaming_unsigned_trailer_upload_part(target, bucket):
    c = target.client("alice", request_checksum_calculation="when_supported")
    force_unsigned_trailer(c)
    sent = SentHeaders(c)
    p1, p2 = rand(5 * MiB), rand(1234)
    uid = c.create_multipart_upload(Bucket=bucket, Key="mp-trailer")["UploadId"]
    parts = []
    for n, p in ((1, p1), (2, p2)):
        r = c.upload_part(Bucket=bucket, Key="mp-trailer", UploadId=uid, PartNumber=n, Body=p)
        assert r["ETag"] == f'"{md5_hex(p)}"'
        parts.append({"PartNumber": n, "ETag": r["ETag"]})
    c.complete_multipart_upload(Bucket=bucket, Key="mp-trailer", UploadId=uid, MultipartUpload={"Parts": parts})
    assert sent.content_sha256("PUT") == [STREAMING_UNSIGNED_TRAILER] * 2
    assert sha256(c.get_object(Bucket=bucket, Key="mp-trailer")["Body"].read()) == sha256(p1 + p2)


def test_payload_when_required_no_checksum(target, bucket):
    c = target.client("alice", request_checksum_calculation="when_required")
    sent = SentHeaders(c)
    _roundtrip(c, bucket, "when-required", rand(1000))
    h = sent.requests[0][2]
    assert not any(k.lower().startswith("x-amz-checksum-") for k in h), h


def test_payload_signed_with_sha256_checksum(target, bucket):
    c = target.client("alice", s3={"payload_signing_enabled": True})
    data = rand(70_000)
    r = c.put_object(Bucket=bucket, Key="sha-ck", Body=data, ChecksumAlgorithm="SHA256")
    assert r["ETag"] == f'"{md5_hex(data)}"'
    assert c.get_object(Bucket=bucket, Key="sha-ck")["Body"].read() == data


# --------------------------------------------------------------------------
# payload modes with raw requests
# --------------------------------------------------------------------------


@pytest.mark.parametrize("size,chunk", [(0, 65536), (100, 65536), (200_000, 65536), (MiB + 1, 8192)])
def test_streaming_signed_payload(target, users, s3, bucket, size, chunk):
    data = rand(size)
    r = streaming_signed_put(target.endpoint, users["alice"], key_path(bucket, "chunked"), data, chunk_size=chunk)
    assert r.status == 200, r
    assert r.header("etag") == f'"{md5_hex(data)}"'
    g = s3.get_object(Bucket=bucket, Key="chunked")
    assert g["ContentLength"] == size
    assert sha256(g["Body"].read()) == sha256(data)
    assert "aws-chunked" not in (g.get("ContentEncoding") or ""), "aws-chunked must not be stored"


def test_streaming_signed_keeps_real_content_encoding(target, users, s3, bucket):
    """Content-Encoding: gzip,aws-chunked -> the object keeps only gzip."""
    data = rand(1000)
    r = streaming_signed_put(
        target.endpoint, users["alice"], key_path(bucket, "gz"), data, headers={"Content-Encoding": "gzip"}
    )
    assert r.status == 200, r
    g = s3.get_object(Bucket=bucket, Key="gz")
    assert g["Body"].read() == data
    assert g.get("ContentEncoding") == "gzip"


def test_streaming_signed_upload_part(target, users, s3, bucket):
    p1, p2 = rand(5 * MiB), rand(777)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="mp-chunked")["UploadId"]
    parts = []
    for n, p in ((1, p1), (2, p2)):
        r = streaming_signed_put(
            target.endpoint,
            users["alice"],
            key_path(bucket, "mp-chunked"),
            p,
            query=[("partNumber", str(n)), ("uploadId", uid)],
        )
        assert r.status == 200, r
        assert r.header("etag") == f'"{md5_hex(p)}"'
        parts.append({"PartNumber": n, "ETag": r.header("etag")})
    s3.complete_multipart_upload(Bucket=bucket, Key="mp-chunked", UploadId=uid, MultipartUpload={"Parts": parts})
    assert sha256(s3.get_object(Bucket=bucket, Key="mp-chunked")["Body"].read()) == sha256(p1 + p2)


@pytest.mark.parametrize("tamper", ["chunk0", "chunk2", "final", "data"])
def test_streaming_signed_bad_chunk_signature(target, users, s3, bucket, tamper):
    data = rand(200_000)  # 4 chunks of 64 KiB + final
    kw = {"data": {"tamper_data": True}, "chunk0": {"tamper_chunk": 0}, "chunk2": {"tamper_chunk": 2}, "final": {"tamper_chunk": 4}}[tamper]
    r = streaming_signed_put(target.endpoint, users["alice"], key_path(bucket, "tampered"), data, **kw)
    assert_s3_error(r, 403, "SignatureDoesNotMatch")
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="tampered")
    assert_client_error(e, ("404", "NoSuchKey", "NotFound"), 404)


@pytest.mark.parametrize("size", [0, 200_000])
def test_streaming_signed_with_trailer(target, users, s3, bucket, size):
    """STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER: signed chunks plus a signed
    x-amz-checksum-crc32 trailer (what SDKs send for checksummed uploads over
    plain HTTP with payload signing)."""
    data = rand(size)
    r = streaming_signed_put(target.endpoint, users["alice"], key_path(bucket, "strl"), data, trailer=True)
    assert r.status == 200, r
    assert r.header("etag") == f'"{md5_hex(data)}"'
    assert sha256(s3.get_object(Bucket=bucket, Key="strl")["Body"].read()) == sha256(data)


@pytest.mark.parametrize("bad", ["checksum", "trailer-signature"])
def test_streaming_signed_with_bad_trailer(target, users, s3, bucket, bad):
    data = rand(100_000)
    kw = {"trailer_checksum": crc32_b64(b"other")} if bad == "checksum" else {"tamper_trailer_signature": True}
    r = streaming_signed_put(target.endpoint, users["alice"], key_path(bucket, "strl-bad"), data, trailer=True, **kw)
    if bad == "checksum":
        assert_s3_error(r, 400, ("BadDigest", "XAmzContentChecksumMismatch", "InvalidRequest"))
    else:
        assert_s3_error(r, 403, "SignatureDoesNotMatch")
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="strl-bad")
    assert_client_error(e, ("404", "NoSuchKey", "NotFound"), 404)


@pytest.mark.parametrize("http_chunked", [False, True])
def test_unsigned_trailer_raw(target, users, s3, bucket, http_chunked):
    data = rand(150_000)
    r = unsigned_trailer_put(target.endpoint, users["alice"], key_path(bucket, "trl"), data, http_chunked=http_chunked)
    assert r.status == 200, r
    assert r.header("etag") == f'"{md5_hex(data)}"'
    assert sha256(s3.get_object(Bucket=bucket, Key="trl")["Body"].read()) == sha256(data)


def test_unsigned_trailer_bad_checksum(target, users, s3, bucket):
    data = rand(150_000)
    r = unsigned_trailer_put(
        target.endpoint, users["alice"], key_path(bucket, "trl-bad"), data, checksum=crc32_b64(b"other")
    )
    assert_s3_error(r, 400, ("BadDigest", "XAmzContentChecksumMismatch", "InvalidRequest"))
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="trl-bad")
    assert_client_error(e, ("404", "NoSuchKey", "NotFound"), 404)


def test_unsigned_trailer_missing_trailer(target, users, s3, bucket):
    """x-amz-trailer announces a checksum; a body without it is incomplete."""
    r = unsigned_trailer_put(target.endpoint, users["alice"], key_path(bucket, "no-trl"), rand(70_000), omit_trailer=True)
    assert r.status == 400, r
    assert_s3_error(r, 400, r.error().get("Code"))
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="no-trl")
    assert_client_error(e, ("404", "NoSuchKey", "NotFound"), 404)


@pytest.mark.parametrize("delta", [10, -10])
def test_streaming_signed_decoded_length_mismatch(target, users, s3, bucket, delta):
    """x-amz-decoded-content-length must equal the sum of the chunk sizes."""
    data = rand(100_000)
    r = streaming_signed_put(
        target.endpoint, users["alice"], key_path(bucket, "lie"), data, decoded_length=len(data) + delta
    )
    assert r.status == 400, r
    assert_s3_error(r, 400, ("IncompleteBody", "InvalidRequest", "InvalidArgument", "BadRequest", "XAmzContentSHA256Mismatch"))
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="lie")
    assert_client_error(e, ("404", "NoSuchKey", "NotFound"), 404)


def test_unsigned_payload_raw(target, users, s3, bucket):
    data = rand(5000)
    r = raw_request(
        target.endpoint, "PUT", key_path(bucket, "raw-unsigned"), body=data, user=users["alice"], payload_hash=UNSIGNED_PAYLOAD
    )
    assert r.status == 200, r
    assert s3.get_object(Bucket=bucket, Key="raw-unsigned")["Body"].read() == data


def test_signed_payload_hash_mismatch(target, users, s3, bucket):
    r = raw_request(
        target.endpoint,
        "PUT",
        key_path(bucket, "hash-mismatch"),
        body=b"actual body",
        user=users["alice"],
        payload_hash=sha256(b"a different body"),
    )
    assert_s3_error(r, 400, "XAmzContentSHA256Mismatch")
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="hash-mismatch")
    assert_client_error(e, ("404", "NoSuchKey", "NotFound"), 404)


# --------------------------------------------------------------------------
# header auth failures
# --------------------------------------------------------------------------


def test_anonymous_denied(target, bucket, s3):
    s3.put_object(Bucket=bucket, Key="k", Body=b"secret")
    for method, path in [
        ("GET", "/"),
        ("GET", key_path(bucket)),
        ("GET", key_path(bucket, "k")),
        ("HEAD", key_path(bucket, "k")),
        ("PUT", key_path(bucket, "anon")),
        ("DELETE", key_path(bucket, "k")),
        ("PUT", key_path(unique_bucket("anon"))),
    ]:
        r = raw_request(target.endpoint, method, path, body=b"x" if method == "PUT" else b"")
        assert_s3_error(r, 403, "AccessDenied", head=method == "HEAD")
        assert b"secret" not in r.body
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"secret"


def test_wrong_secret(target, users, bucket):
    bad = User("alice", "alice", "not-the-secret")
    with pytest.raises(ClientError) as e:
        target.client(bad).list_objects_v2(Bucket=bucket)
    assert_client_error(e, "SignatureDoesNotMatch", 403)
    r = raw_request(target.endpoint, "GET", key_path(bucket), user=users["alice"], sign_secret="wrong")
    err = assert_s3_error(r, 403, "SignatureDoesNotMatch")
    assert "not-the-secret" not in r.body.decode(errors="replace")
    assert users["alice"].secret not in r.body.decode(errors="replace"), "secrets never appear in replies"
    del err


def test_unknown_access_key(target, bucket):
    ghost = User("ghost", "AKIDNOSUCHKEY", "whatever")
    with pytest.raises(ClientError) as e:
        target.client(ghost).list_buckets()
    assert_client_error(e, "InvalidAccessKeyId", 403)
    r = raw_request(target.endpoint, "GET", key_path(bucket), user=ghost)
    assert_s3_error(r, 403, "InvalidAccessKeyId")


def test_tampered_signed_header(target, users, bucket):
    def tamper(h):
        h["x-amz-meta-who"] = "mallory"

    r = raw_request(
        target.endpoint,
        "PUT",
        key_path(bucket, "tamper"),
        body=b"x",
        headers={"x-amz-meta-who": "alice"},
        user=users["alice"],
        after_sign=tamper,
    )
    assert_s3_error(r, 403, "SignatureDoesNotMatch")

    # a signature for one key replayed on another: the path is signed
    ts = amz_date()
    hdrs = {"Host": urlsplit(target.endpoint).netloc, "x-amz-date": ts, "x-amz-content-sha256": sha256(b"")}
    auth, _ = sign_headers("GET", key_path(bucket, "a"), [], hdrs, sha256(b""), users["alice"], ts)
    r = send(target.endpoint, "GET", key_path(bucket, "b"), {**hdrs, "Authorization": auth})
    assert_s3_error(r, 403, "SignatureDoesNotMatch")


def test_credential_scope_wrong_region(target, users, bucket):
    """A signature scoped to another region is refused even though it is
    cryptographically valid for that scope (AWS: 400
    AuthorizationHeaderMalformed "the region 'us-west-2' is wrong; expecting
    'us-east-1'")."""
    r = raw_request(target.endpoint, "GET", key_path(bucket), user=users["alice"], region="us-west-2")
    assert r.status in (400, 403), r
    assert_s3_error(r, r.status, ("AuthorizationHeaderMalformed", "SignatureDoesNotMatch", "InvalidRequest"))


def test_header_and_query_auth_together(target, users, s3, bucket):
    """AWS: 400 InvalidArgument "Only one auth mechanism allowed"."""
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"})
    u = urlsplit(url)
    ts = amz_date()
    hdrs = {"Host": u.netloc, "x-amz-date": ts, "x-amz-content-sha256": sha256(b"")}
    query = [tuple(p.split("=", 1)) for p in u.query.split("&")]
    auth, _ = sign_headers("GET", u.path, query, hdrs, sha256(b""), users["alice"], ts)
    r = send(target.endpoint, "GET", u.path + "?" + u.query, {**hdrs, "Authorization": auth})
    assert_s3_error(r, 400, ("InvalidArgument", "InvalidRequest"))


@contextlib.contextmanager
def skewed_clock(when: dt.datetime):
    """botocore's signing clock set to `when`. With awscrt installed (the
    lmcache extra brings it into the same venv), botocore signs S3 requests
    with its CRT signer, which reads the clock through botocore.crt.auth, so
    both signers' clocks are set."""

    def now(remove_tzinfo=True):
        return when.replace(tzinfo=None) if remove_tzinfo else when

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch("botocore.auth.get_current_datetime", side_effect=now))
        try:
            import botocore.crt.auth  # noqa: F401  (present only with awscrt)
        except ImportError:
            pass
        else:
            stack.enter_context(mock.patch("botocore.crt.auth.get_current_datetime", side_effect=now))
        yield


@pytest.mark.parametrize("offset_min", [-60, 60])
def test_request_time_too_skewed(target, users, bucket, offset_min):
    skewed = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=offset_min)
    r = raw_request(target.endpoint, "GET", key_path(bucket), user=users["alice"], timestamp=amz_date(skewed))
    assert_s3_error(r, 403, "RequestTimeTooSkewed")
    # and through boto3 with a skewed clock (no retries: max_attempts=1)
    with skewed_clock(skewed), pytest.raises(ClientError) as e:
        target.client("alice").list_objects_v2(Bucket=bucket)
    assert_client_error(e, "RequestTimeTooSkewed", 403)


def test_small_skew_accepted(target, users, bucket):
    skewed = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    r = raw_request(target.endpoint, "GET", key_path(bucket), query=[("list-type", "2")], user=users["alice"], timestamp=amz_date(skewed))
    assert r.status == 200, r


def test_missing_auth_parts(target, users, bucket):
    # Authorization without x-amz-date / Date
    ts = amz_date()
    hdrs = {"Host": urlsplit(target.endpoint).netloc, "x-amz-content-sha256": sha256(b"")}
    auth, _ = sign_headers("GET", key_path(bucket), [], hdrs, sha256(b""), users["alice"], ts)
    r = send(target.endpoint, "GET", key_path(bucket), {**hdrs, "Authorization": auth})
    assert r.status in (400, 403), r
    assert_s3_error(r, r.status, ("AccessDenied", "SignatureDoesNotMatch", "AuthorizationHeaderMalformed", "InvalidRequest", "MissingSecurityHeader"))
    # garbage Authorization header
    r = send(target.endpoint, "GET", key_path(bucket), {"Host": hdrs["Host"], "Authorization": "AWS4-HMAC-SHA256 garbage"})
    assert r.status in (400, 403), r
    assert_s3_error(
        r, r.status, ("AuthorizationHeaderMalformed", "InvalidArgument", "InvalidRequest", "AccessDenied", "SignatureDoesNotMatch")
    )


# --------------------------------------------------------------------------
# presigned URLs
# --------------------------------------------------------------------------


def _fetch(url, method="GET", data=None, headers=None) -> Resp:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request(method, u.path + ("?" + u.query if u.query else ""), body=data, headers=headers or {})
        r = conn.getresponse()
        body = r.read()
        return Resp(r.status, r.reason, {k.lower(): v for k, v in r.getheaders()}, body)
    finally:
        conn.close()


def test_presigned_get_urllib(s3, bucket):
    data = rand(100_000)
    s3.put_object(Bucket=bucket, Key="dir/pre signed ü.bin", Body=data)
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "dir/pre signed ü.bin"}, ExpiresIn=300)
    assert "X-Amz-Signature=" in url
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        assert sha256(r.read()) == sha256(data)
        assert r.headers["ETag"] == f'"{md5_hex(data)}"'
    # a presigned HEAD, and presigned GET with a Range header (unsigned header)
    head_url = s3.generate_presigned_url("head_object", Params={"Bucket": bucket, "Key": "dir/pre signed ü.bin"})
    r = _fetch(head_url, "HEAD")
    assert r.status == 200 and int(r.header("content-length")) == len(data)
    r = _fetch(url, headers={"Range": "bytes=10-19"})
    assert r.status == 206 and r.body == data[10:20]


def test_presigned_response_overrides(s3, bucket):
    s3.put_object(Bucket=bucket, Key="o", Body=b"override", ContentType="text/plain")
    url = s3.generate_presigned_url(
        "get_object",
        Params={
            "Bucket": bucket,
            "Key": "o",
            "ResponseContentType": "application/x-override",
            "ResponseContentDisposition": "attachment; filename=o.txt",
        },
    )
    r = _fetch(url)
    assert r.status == 200, r
    assert r.header("content-type") == "application/x-override"
    assert r.header("content-disposition") == "attachment; filename=o.txt"


def test_presigned_put_http_client(s3, bucket):
    data = rand(250_000)
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "uploaded"}, ExpiresIn=300)
    r = _fetch(url, "PUT", data=data)
    assert r.status == 200, r
    assert r.header("etag") == f'"{md5_hex(data)}"'
    assert sha256(s3.get_object(Bucket=bucket, Key="uploaded")["Body"].read()) == sha256(data)


def test_presigned_put_signed_content_type(s3, bucket):
    url = s3.generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": "typed", "ContentType": "text/csv"}, ExpiresIn=300
    )
    r = _fetch(url, "PUT", data=b"a,b\n1,2\n", headers={"Content-Type": "text/csv"})
    assert r.status == 200, r
    assert s3.head_object(Bucket=bucket, Key="typed")["ContentType"] == "text/csv"
    # the content-type is a signed header: changing it breaks the signature
    r = _fetch(url, "PUT", data=b"x", headers={"Content-Type": "text/html"})
    assert_s3_error(r, 403, "SignatureDoesNotMatch")


def test_presigned_expired(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=1)
    time.sleep(2.2)
    r = _fetch(url)
    err = assert_s3_error(r, 403, "AccessDenied")
    assert "expired" in err["Message"].lower(), err
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url, timeout=30)
    assert e.value.code == 403


def test_presigned_expires_over_a_week(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=604801)
    r = _fetch(url)
    # refused like an expired URL (403 AccessDenied), with AWS's text
    assert_s3_error(r, 403, "AccessDenied")
    assert b"must be less than 604800 seconds" in r.body
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=604800)
    assert _fetch(url).status == 200


def _with_query(url, **changes):
    u = urlsplit(url)
    q = dict(parse_qsl(u.query, keep_blank_values=True))
    q.update(changes)
    return urlunsplit(u._replace(query=urlencode(q)))


def test_presigned_tampered(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    s3.put_object(Bucket=bucket, Key="other", Body=b"other secret")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=300)
    sig = dict(parse_qsl(urlsplit(url).query))["X-Amz-Signature"]
    cases = {
        "signature": _with_query(url, **{"X-Amz-Signature": ("0" if sig[0] != "0" else "1") + sig[1:]}),
        "expires": _with_query(url, **{"X-Amz-Expires": "604800"}),
        "path": url.replace(f"/{bucket}/k?", f"/{bucket}/other?"),
        "extra-param": _with_query(url, **{"response-content-type": "text/html"}),
    }
    for name, bad in cases.items():
        r = _fetch(bad)
        assert_s3_error(r, 403, "SignatureDoesNotMatch")
        assert b"other secret" not in r.body, name
    # a presigned GET URL must not allow a PUT
    r = _fetch(url, "PUT", data=b"overwrite")
    assert_s3_error(r, 403, "SignatureDoesNotMatch")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"


def test_presigned_wrong_secret_and_unknown_key(target, bucket, s3):
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    bad = target.client(User("alice", "alice", "bad-secret"))
    r = _fetch(bad.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}))
    assert_s3_error(r, 403, "SignatureDoesNotMatch")
    ghost = target.client(User("ghost", "AKIDGHOST", "x"))
    r = _fetch(ghost.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"}))
    assert_s3_error(r, 403, "InvalidAccessKeyId")


def test_presigned_by_user_without_rights(target, bucket, s3):
    s3.put_object(Bucket=bucket, Key="k", Body=b"alice only")
    url = target.client("bob").generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"})
    r = _fetch(url)
    assert_s3_error(r, 403, "AccessDenied")
    assert b"alice only" not in r.body


# --------------------------------------------------------------------------
# authorization (grants)
# --------------------------------------------------------------------------


def test_bob_has_no_rights_on_alice_bucket(target, bucket, s3):
    s3.put_object(Bucket=bucket, Key="k", Body=b"alice data")
    bob = target.client("bob")
    calls = {
        "GetObject": lambda: bob.get_object(Bucket=bucket, Key="k"),
        "HeadObject": lambda: bob.head_object(Bucket=bucket, Key="k"),
        "PutObject": lambda: bob.put_object(Bucket=bucket, Key="bob", Body=b"x"),
        "DeleteObject": lambda: bob.delete_object(Bucket=bucket, Key="k"),
        "ListObjectsV2": lambda: bob.list_objects_v2(Bucket=bucket),
        "DeleteBucket": lambda: bob.delete_bucket(Bucket=bucket),
        "GetBucketLocation": lambda: bob.get_bucket_location(Bucket=bucket),
    }
    assert_all_refused(calls, 403, ("AccessDenied", "403"))
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"alice data"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["k"]


def test_bob_cannot_copy_out_of_alice_bucket(target, bucket, s3, bucket_factory):
    s3.put_object(Bucket=bucket, Key="k", Body=b"alice data")
    bobs = bucket_factory("bob", user="bob")
    bob = target.client("bob")
    with pytest.raises(ClientError) as e:
        bob.copy_object(Bucket=bobs, Key="stolen", CopySource={"Bucket": bucket, "Key": "k"})
    assert_client_error(e, "AccessDenied", 403)
    with pytest.raises(ClientError) as e:
        bob.copy_object(Bucket=bucket, Key="planted", CopySource={"Bucket": bobs, "Key": "x"})
    assert_client_error(e, ("AccessDenied", "NoSuchKey"), None)
    assert bob.list_objects_v2(Bucket=bobs)["KeyCount"] == 0


def test_bob_delete_objects_on_alice_bucket(target, bucket, s3):
    s3.put_object(Bucket=bucket, Key="k", Body=b"keep")
    bob = target.client("bob")
    try:
        r = bob.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "k"}]})
        # AWS answers 200 with a per-key AccessDenied error
        assert not r.get("Deleted"), r
        assert [(x["Key"], x["Code"]) for x in r["Errors"]] == [("k", "AccessDenied")]
    except ClientError as e:
        assert_client_error(e, "AccessDenied", 403)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"keep"


def test_read_only_user(target):
    alice, carol = target.client("alice"), target.client("carol")
    key = f"ro-{unique_bucket('k')}"
    alice.put_object(Bucket="shared", Key=key, Body=b"shared data")
    try:
        # read works (carol's secret comes from secret_file)
        assert carol.get_object(Bucket="shared", Key=key)["Body"].read() == b"shared data"
        assert carol.head_object(Bucket="shared", Key=key)["ContentLength"] == 11
        assert key in [o["Key"] for o in carol.list_objects_v2(Bucket="shared", Prefix=key)["Contents"]]
        carol.head_bucket(Bucket="shared")
        url = carol.generate_presigned_url("get_object", Params={"Bucket": "shared", "Key": key})
        assert _fetch(url).body == b"shared data"
        # write does not
        for call in (
            lambda: carol.put_object(Bucket="shared", Key="carol-was-here", Body=b"x"),
            lambda: carol.delete_object(Bucket="shared", Key=key),
            lambda: carol.copy_object(Bucket="shared", Key="carol-copy", CopySource={"Bucket": "shared", "Key": key}),
        ):
            with pytest.raises(ClientError) as e:
                call()
            assert_client_error(e, "AccessDenied", 403)
        url = carol.generate_presigned_url("put_object", Params={"Bucket": "shared", "Key": "carol-pre"})
        assert_s3_error(_fetch(url, "PUT", data=b"x"), 403, "AccessDenied")
        names = [o["Key"] for o in alice.list_objects_v2(Bucket="shared").get("Contents", [])]
        assert "carol-was-here" not in names and "carol-copy" not in names and "carol-pre" not in names
        assert alice.get_object(Bucket="shared", Key=key)["Body"].read() == b"shared data"
    finally:
        alice.delete_object(Bucket="shared", Key=key)


def test_write_only_user(target):
    """dave has a write grant on 'shared': he writes (and, as the writer, owns
    and may read what he wrote, as in AWS), but reads nothing anyone else wrote."""
    alice, dave = target.client("alice"), target.client("dave")
    key = f"wo-{unique_bucket('k')}"
    theirs = key + "-alice"
    try:
        alice.put_object(Bucket="shared", Key=theirs, Body=b"alice data")
        dave.put_object(Bucket="shared", Key=key, Body=b"dropped")
        assert alice.get_object(Bucket="shared", Key=key)["Body"].read() == b"dropped"
        assert dave.get_object(Bucket="shared", Key=key)["Body"].read() == b"dropped"
        # multipart is a write too
        uid = dave.create_multipart_upload(Bucket="shared", Key=key + "-mp")["UploadId"]
        e1 = dave.upload_part(Bucket="shared", Key=key + "-mp", UploadId=uid, PartNumber=1, Body=b"mp")["ETag"]
        dave.complete_multipart_upload(
            Bucket="shared", Key=key + "-mp", UploadId=uid, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}]}
        )
        assert alice.get_object(Bucket="shared", Key=key + "-mp")["Body"].read() == b"mp"
        for name, call in {
            "GetObject": lambda: dave.get_object(Bucket="shared", Key=theirs),
            "HeadObject": lambda: dave.head_object(Bucket="shared", Key=theirs),
            "ListObjectsV2": lambda: dave.list_objects_v2(Bucket="shared"),
            "ListObjects": lambda: dave.list_objects(Bucket="shared"),
            # a copy reads its source: write-only must not exfiltrate through it
            "CopyObject": lambda: dave.copy_object(
                Bucket="shared", Key=key + "-copy", CopySource={"Bucket": "shared", "Key": theirs}
            ),
            "ranged GetObject": lambda: dave.get_object(Bucket="shared", Key=theirs, Range="bytes=0-1"),
        }.items():
            with pytest.raises(ClientError) as e:
                call()
            assert_client_error(e, ("AccessDenied", "403"), 403)
        url = dave.generate_presigned_url("get_object", Params={"Bucket": "shared", "Key": theirs})
        r = _fetch(url)
        assert_s3_error(r, 403, "AccessDenied")
        assert b"alice data" not in r.body
        with pytest.raises(ClientError) as e:
            alice.head_object(Bucket="shared", Key=key + "-copy")
        assert_client_error(e, ("404", "NoSuchKey", "NotFound"), 404)
        dave.delete_object(Bucket="shared", Key=key + "-mp")
    finally:
        for k in (key, theirs, key + "-mp"):
            alice.delete_object(Bucket="shared", Key=k)


# --------------------------------------------------------------------------
# RequestId on raw error responses
# --------------------------------------------------------------------------


def test_error_request_ids_are_unique_and_match(target, users, s3, bucket):
    """Each S3 XML error body has <RequestId> equal to x-amz-request-id, and
    ids differ between requests. Successful replies carry the header too."""
    s3.put_object(Bucket=bucket, Key="obj", Body=b"0123456789")
    alice = users["alice"]
    ep = target.endpoint
    cases = [
        (raw_request(ep, "GET", key_path(unique_bucket("nb"), "k"), user=alice), 404, "NoSuchBucket"),
        (raw_request(ep, "GET", key_path(bucket, "missing"), user=alice), 404, "NoSuchKey"),
        (raw_request(ep, "GET", key_path(bucket, "obj"), headers={"Range": "bytes=100-"}, user=alice), 416, "InvalidRange"),
        (raw_request(ep, "GET", key_path(bucket, "obj"), headers={"If-Match": '"x"'}, user=alice), 412, "PreconditionFailed"),
        (raw_request(ep, "DELETE", key_path(bucket), user=alice), 409, "BucketNotEmpty"),
        (raw_request(ep, "PUT", key_path("Bad_Name"), user=alice), 400, "InvalidBucketName"),
        (raw_request(ep, "GET", key_path(bucket), user=users["bob"]), 403, "AccessDenied"),
        (raw_request(ep, "GET", key_path(bucket)), 403, "AccessDenied"),
        (raw_request(ep, "GET", "/", user=alice, sign_secret="nope"), 403, "SignatureDoesNotMatch"),
        (raw_request(ep, "GET", "/", user=User("g", "AKIDGHOST", "x")), 403, "InvalidAccessKeyId"),
        (
            raw_request(ep, "GET", "/", user=alice, timestamp=amz_date(dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1))),
            403,
            "RequestTimeTooSkewed",
        ),
        (raw_request(ep, "PUT", key_path(bucket, "k" * 1025), body=b"x", user=alice), 400, "KeyTooLongError"),
        (
            raw_request(ep, "GET", key_path(bucket, "k"), query=[("uploadId", "nope")], user=alice),
            404,
            "NoSuchUpload",
        ),
    ]
    ids = []
    failures = []
    for resp, status, code in cases:
        try:
            assert_s3_error(resp, status, code, require_message=True)
            assert (resp.header("content-type") or "").startswith("application/xml"), resp
            ids.append(resp.header("x-amz-request-id"))
        except AssertionError as e:
            failures.append(f"{code}: {e}")
    assert not failures, "\n".join(failures)
    assert len(set(ids)) == len(ids), f"request ids repeat: {ids}"
    ok = raw_request(ep, "GET", key_path(bucket, "obj"), user=alice)
    assert ok.status == 200 and ok.header("x-amz-request-id")
    head = raw_request(ep, "HEAD", key_path(bucket, "missing"), user=alice)
    assert_s3_error(head, 404, "NoSuchKey", head=True)
    assert head.body == b""
