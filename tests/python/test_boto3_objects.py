"""Object operations through boto3: Put/Get/Head/Delete/DeleteObjects/Copy,
ranges, conditional requests, metadata and system headers, Content-MD5,
checksums, and key edge cases (unicode, '/', '..', 1024-byte keys)."""

from __future__ import annotations

import datetime as dt
import os

import pytest
from botocore.exceptions import ClientError

from s3util import (
    MiB,
    assert_client_error,
    assert_s3_error,
    crc32_b64,
    key_path,
    md5_b64,
    md5_hex,
    rand,
    raw_request,
    sha256,
    unique_bucket,
)


def etag_of(data: bytes) -> str:
    return f'"{md5_hex(data)}"'


# --------------------------------------------------------------------------
# put / get / head / delete
# --------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 1000, MiB + 17])
def test_put_get_roundtrip(s3, bucket, size):
    data = rand(size)
    r = s3.put_object(Bucket=bucket, Key=f"obj-{size}", Body=data)
    assert r["ETag"] == etag_of(data)
    g = s3.get_object(Bucket=bucket, Key=f"obj-{size}")
    body = g["Body"].read()
    assert len(body) == size
    assert sha256(body) == sha256(data)
    assert g["ETag"] == etag_of(data)
    assert g["ContentLength"] == size


def test_head_object(s3, bucket):
    data = rand(4096)
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(seconds=2)
    s3.put_object(Bucket=bucket, Key="h", Body=data, ContentType="application/x-test")
    h = s3.head_object(Bucket=bucket, Key="h")
    assert h["ContentLength"] == 4096
    assert h["ETag"] == etag_of(data)
    assert h["ContentType"] == "application/x-test"
    lm = h["LastModified"]
    assert before <= lm <= dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=2)
    assert h["ResponseMetadata"]["HTTPHeaders"].get("accept-ranges") == "bytes"
    g = s3.get_object(Bucket=bucket, Key="h")
    assert g["LastModified"] == lm
    g["Body"].read()


def test_default_content_type(s3, bucket):
    s3.put_object(Bucket=bucket, Key="noct", Body=b"abc")
    ct = s3.head_object(Bucket=bucket, Key="noct")["ContentType"]
    # AWS: binary/octet-stream, MinIO: application/octet-stream
    assert ct in ("binary/octet-stream", "application/octet-stream")


def test_overwrite(s3, bucket):
    s3.put_object(Bucket=bucket, Key="o", Body=b"first version", Metadata={"v": "1"})
    r = s3.put_object(Bucket=bucket, Key="o", Body=b"second")
    assert r["ETag"] == etag_of(b"second")
    g = s3.get_object(Bucket=bucket, Key="o")
    assert g["Body"].read() == b"second"
    assert g["Metadata"] == {}, "overwrite replaces metadata too"


def test_get_missing(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="nope")
    assert_client_error(e, "NoSuchKey", 404)
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="nope")
    assert_client_error(e, ("404", "NoSuchKey", "NotFound"), 404)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=unique_bucket("missing"), Key="nope")
    assert_client_error(e, "NoSuchBucket", 404)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=unique_bucket("missing"), Key="k", Body=b"x")
    assert_client_error(e, "NoSuchBucket", 404)


def test_get_missing_raw_has_key_and_request_id(target, users, bucket):
    r = raw_request(target.endpoint, "GET", key_path(bucket, "no/such key"), user=users["alice"])
    err = assert_s3_error(r, 404, "NoSuchKey")
    assert err.get("Key") in (None, "no/such key")


def test_delete_object(s3, bucket):
    s3.put_object(Bucket=bucket, Key="d", Body=b"x")
    r = s3.delete_object(Bucket=bucket, Key="d")
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 204
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="d")
    assert_client_error(e, "NoSuchKey", 404)
    # deleting a missing key is not an error in S3
    r = s3.delete_object(Bucket=bucket, Key="d")
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 204


def test_delete_objects(s3, bucket):
    keys = ["a", "b/c", "b/d", "e f"]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    r = s3.delete_objects(
        Bucket=bucket,
        Delete={"Objects": [{"Key": k} for k in keys[:3] + ["never-existed"]]},
    )
    assert sorted(d["Key"] for d in r.get("Deleted", [])) == sorted(keys[:3] + ["never-existed"])
    assert not r.get("Errors")
    left = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert left == ["e f"]
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "e f"}], "Quiet": True})
    assert not r.get("Deleted"), "Quiet mode reports only errors"
    assert not r.get("Errors")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_delete_objects_malformed(target, users, bucket):
    body = b"<Delete><Object><Key>a</Key></Object>"  # truncated XML
    r = raw_request(
        target.endpoint,
        "POST",
        key_path(bucket),
        query=[("delete", "")],
        body=body,
        headers={"Content-MD5": md5_b64(body), "Content-Type": "application/xml"},
        user=users["alice"],
    )
    assert_s3_error(r, 400, "MalformedXML")


# --------------------------------------------------------------------------
# metadata and system headers
# --------------------------------------------------------------------------


def test_user_metadata_and_system_headers(s3, bucket):
    expires = dt.datetime(2031, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    s3.put_object(
        Bucket=bucket,
        Key="meta",
        Body=b"hello",
        ContentType="text/plain; charset=utf-8",
        Metadata={"Color": "blue", "x-long-name": "some value with spaces", "num": "42"},
        CacheControl="max-age=3600, must-revalidate",
        Expires=expires,
        ContentDisposition='attachment; filename="hello.txt"',
        ContentEncoding="gzip",
    )
    for r in (s3.head_object(Bucket=bucket, Key="meta"), s3.get_object(Bucket=bucket, Key="meta")):
        assert r["Metadata"] == {"color": "blue", "x-long-name": "some value with spaces", "num": "42"}
        assert r["ContentType"] == "text/plain; charset=utf-8"
        assert r["CacheControl"] == "max-age=3600, must-revalidate"
        assert r["ContentDisposition"] == 'attachment; filename="hello.txt"'
        assert r["ContentEncoding"] == "gzip"
        hdrs = r["ResponseMetadata"]["HTTPHeaders"]
        assert hdrs.get("expires") == "Thu, 02 Jan 2031 03:04:05 GMT", hdrs
        if "Body" in r:
            assert r["Body"].read() == b"hello"


def test_content_md5(s3, bucket):
    data = b"checked content"
    r = s3.put_object(Bucket=bucket, Key="md5ok", Body=data, ContentMD5=md5_b64(data))
    assert r["ETag"] == etag_of(data)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="md5bad", Body=data, ContentMD5=md5_b64(b"other"))
    assert_client_error(e, "BadDigest", 400)
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="md5bad")
    assert_client_error(e, ("404", "NoSuchKey", "NotFound"), 404)


def test_content_md5_raw(target, users, bucket):
    data = b"raw checked content"
    r = raw_request(
        target.endpoint,
        "PUT",
        key_path(bucket, "rawmd5"),
        body=data,
        headers={"Content-MD5": md5_b64(b"different")},
        user=users["alice"],
    )
    assert_s3_error(r, 400, "BadDigest")
    r = raw_request(
        target.endpoint,
        "PUT",
        key_path(bucket, "rawmd5"),
        body=data,
        headers={"Content-MD5": "not-base64!!"},
        user=users["alice"],
    )
    assert_s3_error(r, 400, "InvalidDigest")


def test_flexible_checksum_mismatch(s3, bucket):
    data = b"checksummed"
    r = s3.put_object(Bucket=bucket, Key="crc", Body=data, ChecksumCRC32=crc32_b64(data))
    assert r["ETag"] == etag_of(data)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="crcbad", Body=data, ChecksumCRC32=crc32_b64(b"x"))
    assert_client_error(e, ("BadDigest", "XAmzContentChecksumMismatch"), 400)
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="crcbad")
    assert_client_error(e, ("404", "NoSuchKey", "NotFound"), 404)


# --------------------------------------------------------------------------
# ranges
# --------------------------------------------------------------------------

RANGE_DATA_LEN = 1000


@pytest.mark.parametrize(
    "rng,start,end",
    [
        ("bytes=0-0", 0, 0),
        ("bytes=10-19", 10, 19),
        ("bytes=990-", 990, 999),
        ("bytes=-25", 975, 999),
        ("bytes=500-5000", 500, 999),  # end past EOF is clamped
        ("bytes=-5000", 0, 999),  # suffix longer than object = whole object
        ("bytes=0-999", 0, 999),
    ],
)
def test_range_get(s3, bucket, rng, start, end):
    data = rand(RANGE_DATA_LEN)
    s3.put_object(Bucket=bucket, Key="r", Body=data)
    g = s3.get_object(Bucket=bucket, Key="r", Range=rng)
    assert g["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert g["ContentRange"] == f"bytes {start}-{end}/{RANGE_DATA_LEN}"
    assert g["ContentLength"] == end - start + 1
    assert g["Body"].read() == data[start : end + 1]
    assert g["ETag"] == etag_of(data)


@pytest.mark.parametrize("rng", ["bytes=1000-", "bytes=1000-2000", "bytes=5000-6000"])
def test_range_unsatisfiable(target, users, s3, bucket, rng):
    s3.put_object(Bucket=bucket, Key="r", Body=rand(RANGE_DATA_LEN))
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="r", Range=rng)
    assert_client_error(e, "InvalidRange", 416)
    r = raw_request(
        target.endpoint, "GET", key_path(bucket, "r"), headers={"Range": rng}, user=users["alice"]
    )
    assert_s3_error(r, 416, "InvalidRange")
    assert r.header("content-range") in (None, f"bytes */{RANGE_DATA_LEN}")


# s3s verifies the signature over the headers as sent and parses typed headers
# afterwards, so the server can drop an invalid ignorable header only when it
# is not signed. A signed invalid one answers 400 InvalidArgument: a known,
# documented deviation (docs/ARCHITECTURE.md). strict: a fix makes these pass.
SIGNED_INVALID_HEADER_DEVIATION = pytest.mark.xfail(
    strict=True,
    reason="known deviation: a *signed* invalid Range / If-*-Since header is refused (400) instead of ignored",
)
SIGNED_OR_NOT = ["unsigned", pytest.param("signed", marks=SIGNED_INVALID_HEADER_DEVIATION)]


def _header_request(target, users, path, name, value, signed):
    """GET with one extra header, inside the signature or added after signing."""
    if signed == "signed":
        return raw_request(target.endpoint, "GET", path, headers={name: value}, user=users["alice"])
    return raw_request(
        target.endpoint, "GET", path, user=users["alice"], after_sign=lambda h: h.__setitem__(name, value)
    )


@pytest.mark.parametrize("signed", SIGNED_OR_NOT)
@pytest.mark.parametrize("rng", ["bytes=abc", "items=0-1", "bytes=5-2", "bytes=0-1,4-5"])
def test_malformed_range_is_ignored(target, users, s3, bucket, rng, signed):
    """RFC 7233 / AWS S3 (and MinIO, "like Amazon S3"): a Range header that
    does not parse, or asks for several ranges, is ignored -> 200 + full body."""
    data = rand(100)
    s3.put_object(Bucket=bucket, Key="r", Body=data)
    r = _header_request(target, users, key_path(bucket, "r"), "Range", rng, signed)
    assert r.status == 200, r
    assert r.body == data
    assert r.header("content-range") is None


def test_range_large_object_middle(s3, bucket):
    data = rand(3 * MiB)
    s3.put_object(Bucket=bucket, Key="big", Body=data)
    a, b = MiB - 3, 2 * MiB + 5
    g = s3.get_object(Bucket=bucket, Key="big", Range=f"bytes={a}-{b}")
    assert g["ContentRange"] == f"bytes {a}-{b}/{3 * MiB}"
    assert sha256(g["Body"].read()) == sha256(data[a : b + 1])


# --------------------------------------------------------------------------
# conditional requests
# --------------------------------------------------------------------------


@pytest.fixture
def cond_obj(s3, bucket):
    data = b"conditional body"
    s3.put_object(Bucket=bucket, Key="c", Body=data)
    h = s3.head_object(Bucket=bucket, Key="c")
    return bucket, h["ETag"], h["LastModified"], data


def _status(fn, **kw):
    try:
        r = fn(**kw)
        if "Body" in r:
            r["Body"].read()
        return r["ResponseMetadata"]["HTTPStatusCode"]
    except ClientError as e:
        code = e.response["Error"]["Code"]
        status = e.response["ResponseMetadata"]["HTTPStatusCode"]
        if status == 412:
            assert code in ("PreconditionFailed", "412"), e.response
        return status


def test_conditional_get_and_head(s3, cond_obj):
    bucket, etag, lm, _ = cond_obj
    past = lm - dt.timedelta(hours=1)
    future = lm + dt.timedelta(hours=1)
    cases = [
        ({"IfMatch": etag}, 200),
        ({"IfMatch": '"00000000000000000000000000000000"'}, 412),
        ({"IfMatch": "*"}, 200),
        ({"IfNoneMatch": etag}, 304),
        ({"IfNoneMatch": '"00000000000000000000000000000000"'}, 200),
        ({"IfNoneMatch": "*"}, 304),
        ({"IfModifiedSince": past}, 200),
        ({"IfModifiedSince": lm}, 304),
        ({"IfModifiedSince": future}, 304),
        ({"IfUnmodifiedSince": past}, 412),
        ({"IfUnmodifiedSince": lm}, 200),
        ({"IfUnmodifiedSince": future}, 200),
        # RFC 7232 / S3 precedence: If-Match true wins over If-Unmodified-Since false
        ({"IfMatch": etag, "IfUnmodifiedSince": past}, 200),
        # If-None-Match false (i.e. matches) + If-Modified-Since true -> 304
        ({"IfNoneMatch": etag, "IfModifiedSince": past}, 304),
    ]
    failures = []
    for kw, want in cases:
        for op in (s3.get_object, s3.head_object):
            got = _status(op, Bucket=bucket, Key="c", **kw)
            if got != want:
                failures.append(f"{op.__name__}({kw}) -> {got}, want {want}")
    assert not failures, "\n".join(failures)


def test_conditional_get_raw(target, users, cond_obj):
    bucket, etag, _, data = cond_obj
    alice = users["alice"]
    r = raw_request(target.endpoint, "GET", key_path(bucket, "c"), headers={"If-None-Match": etag}, user=alice)
    assert r.status == 304, r
    assert r.body == b""
    assert r.header("etag") == etag
    r = raw_request(target.endpoint, "GET", key_path(bucket, "c"), headers={"If-Match": '"abc"'}, user=alice)
    assert_s3_error(r, 412, "PreconditionFailed")
    r = raw_request(target.endpoint, "GET", key_path(bucket, "c"), headers={"If-Match": etag}, user=alice)
    assert r.status == 200 and r.body == data
    # unquoted ETag values are accepted by S3 too
    r = raw_request(
        target.endpoint, "GET", key_path(bucket, "c"), headers={"If-Match": etag.strip('"')}, user=alice
    )
    assert r.status == 200 and r.body == data


@pytest.mark.parametrize("signed", SIGNED_OR_NOT)
@pytest.mark.parametrize("header", ["If-Modified-Since", "If-Unmodified-Since"])
def test_conditional_invalid_date_is_ignored(target, users, cond_obj, header, signed):
    """RFC 7232 3.3/3.4: a recipient MUST ignore If-(Un)Modified-Since when the
    value is not a valid HTTP-date; AWS S3 and MinIO serve the object."""
    bucket, _, _, data = cond_obj
    r = _header_request(target, users, key_path(bucket, "c"), header, "not a date", signed)
    assert r.status == 200, r
    assert r.body == data


def test_conditional_with_range(s3, cond_obj):
    bucket, etag, _, data = cond_obj
    g = s3.get_object(Bucket=bucket, Key="c", Range="bytes=0-3", IfMatch=etag)
    assert g["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert g["Body"].read() == data[:4]
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="c", Range="bytes=0-3", IfMatch='"ffff"')
    assert_client_error(e, "PreconditionFailed", 412)


# --------------------------------------------------------------------------
# copy
# --------------------------------------------------------------------------


def test_copy_object_copy_directive(s3, bucket):
    data = rand(70_000)
    s3.put_object(
        Bucket=bucket,
        Key="src",
        Body=data,
        ContentType="image/png",
        Metadata={"origin": "source"},
        CacheControl="no-cache",
    )
    r = s3.copy_object(Bucket=bucket, Key="dst/copy", CopySource={"Bucket": bucket, "Key": "src"})
    assert r["CopyObjectResult"]["ETag"] == etag_of(data)
    assert r["CopyObjectResult"]["LastModified"]
    g = s3.get_object(Bucket=bucket, Key="dst/copy")
    assert sha256(g["Body"].read()) == sha256(data)
    assert g["Metadata"] == {"origin": "source"}
    assert g["ContentType"] == "image/png"
    assert g["CacheControl"] == "no-cache"
    # explicit COPY ignores metadata given on the request
    s3.copy_object(
        Bucket=bucket,
        Key="dst/copy2",
        CopySource={"Bucket": bucket, "Key": "src"},
        MetadataDirective="COPY",
        Metadata={"ignored": "yes"},
    )
    assert s3.head_object(Bucket=bucket, Key="dst/copy2")["Metadata"] == {"origin": "source"}


def test_copy_object_replace_directive(s3, bucket):
    data = b"replace me"
    s3.put_object(Bucket=bucket, Key="src", Body=data, ContentType="text/plain", Metadata={"a": "1"})
    s3.copy_object(
        Bucket=bucket,
        Key="dst",
        CopySource={"Bucket": bucket, "Key": "src"},
        MetadataDirective="REPLACE",
        Metadata={"b": "2"},
        ContentType="application/json",
    )
    h = s3.head_object(Bucket=bucket, Key="dst")
    assert h["Metadata"] == {"b": "2"}
    assert h["ContentType"] == "application/json"
    assert h["ETag"] == etag_of(data)
    # source untouched
    assert s3.head_object(Bucket=bucket, Key="src")["Metadata"] == {"a": "1"}


def test_copy_object_onto_itself(s3, bucket):
    s3.put_object(Bucket=bucket, Key="self", Body=b"s", Metadata={"v": "1"})
    # without changing anything S3 refuses a self-copy
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=bucket, Key="self", CopySource={"Bucket": bucket, "Key": "self"})
    assert_client_error(e, "InvalidRequest", 400)
    # REPLACE is how metadata is updated in place
    s3.copy_object(
        Bucket=bucket,
        Key="self",
        CopySource={"Bucket": bucket, "Key": "self"},
        MetadataDirective="REPLACE",
        Metadata={"v": "2"},
    )
    g = s3.get_object(Bucket=bucket, Key="self")
    assert g["Metadata"] == {"v": "2"}
    assert g["Body"].read() == b"s"


def test_copy_between_buckets_and_unicode_source(s3, bucket, bucket_factory):
    other = bucket_factory("copy")
    key = "ordner/ünïcödé & spaces+plus.bin"
    data = rand(5000)
    s3.put_object(Bucket=bucket, Key=key, Body=data)
    s3.copy_object(Bucket=other, Key=key, CopySource={"Bucket": bucket, "Key": key})
    assert s3.get_object(Bucket=other, Key=key)["Body"].read() == data


def test_copy_invalid_metadata_directive(target, users, s3, bucket):
    s3.put_object(Bucket=bucket, Key="src", Body=b"x")
    r = raw_request(
        target.endpoint,
        "PUT",
        key_path(bucket, "dst"),
        headers={"x-amz-copy-source": f"{bucket}/src", "x-amz-metadata-directive": "MOVE"},
        user=users["alice"],
    )
    assert_s3_error(r, 400, "InvalidArgument")
    # the leading-slash and percent-encoded copy-source forms are both valid
    for i, src in enumerate([f"/{bucket}/src", f"{bucket}/%73rc"]):
        r = raw_request(
            target.endpoint, "PUT", key_path(bucket, f"dst{i}"), headers={"x-amz-copy-source": src}, user=users["alice"]
        )
        assert r.status == 200, r
        assert s3.get_object(Bucket=bucket, Key=f"dst{i}")["Body"].read() == b"x"


def test_copy_missing_source(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=bucket, Key="x", CopySource={"Bucket": bucket, "Key": "missing"})
    assert_client_error(e, "NoSuchKey", 404)
    with pytest.raises(ClientError) as e:
        s3.copy_object(
            Bucket=bucket, Key="x", CopySource={"Bucket": unique_bucket("missing"), "Key": "k"}
        )
    assert_client_error(e, "NoSuchBucket", 404)


def test_copy_source_conditions(s3, bucket):
    s3.put_object(Bucket=bucket, Key="src", Body=b"cond")
    etag = s3.head_object(Bucket=bucket, Key="src")["ETag"]
    s3.copy_object(Bucket=bucket, Key="ok", CopySource={"Bucket": bucket, "Key": "src"}, CopySourceIfMatch=etag)
    with pytest.raises(ClientError) as e:
        s3.copy_object(
            Bucket=bucket, Key="no", CopySource={"Bucket": bucket, "Key": "src"}, CopySourceIfMatch='"beef"'
        )
    assert_client_error(e, "PreconditionFailed", 412)


# --------------------------------------------------------------------------
# keys
# --------------------------------------------------------------------------

ODD_KEYS = [
    "plain",
    "a/b/c/d.txt",
    "trailing-slash/",
    "ünïcödé/日本語/файл 🚀.txt",
    "spaces and  double  spaces",
    "special !$&'()*+,;=:@ chars",
    "percent%20encoded%2Fliteral",
    "question?mark#hash",
    "tilde~and^caret`back|pipe{}[]<>\"",
    "dot.",
    "a//double//slash",
    "/leading-slash",
    "x" * 1024,
    "é" * 512,  # 1024 bytes of UTF-8
    "/".join(["seg"] * 200) + "/end",  # deep hierarchy, 1003 bytes
]


@pytest.mark.parametrize("key", ODD_KEYS, ids=lambda k: repr(k[:30]))
def test_odd_keys_roundtrip(s3, bucket, key):
    data = rand(100) + key.encode()
    s3.put_object(Bucket=bucket, Key=key, Body=data)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data
    assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(data)
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert listed == [key]
    s3.delete_object(Bucket=bucket, Key=key)
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_file_and_directory_keys_coexist(s3, bucket):
    """Filesystem stores must allow 'x', 'x/' and 'x/y' (and 'x/y/z') at once."""
    keys = {"x": b"file x", "x/": b"", "x/y": b"file x/y", "x/y/z": b"file x/y/z"}
    # create in an order that trips naive file/dir mapping both ways
    for k in ["x/y/z", "x", "x/y", "x/"]:
        s3.put_object(Bucket=bucket, Key=k, Body=keys[k])
    for k, v in keys.items():
        assert s3.get_object(Bucket=bucket, Key=k)["Body"].read() == v, k
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert listed == sorted(keys)
    s3.delete_object(Bucket=bucket, Key="x/y")
    assert s3.get_object(Bucket=bucket, Key="x/y/z")["Body"].read() == b"file x/y/z"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="x/y")
    assert_client_error(e, "NoSuchKey", 404)


def test_prefix_of_key_is_not_an_object(s3, bucket):
    s3.put_object(Bucket=bucket, Key="dir/sub/file", Body=b"x")
    for k in ["dir", "dir/", "dir/sub", "dir/sub/"]:
        with pytest.raises(ClientError) as e:
            s3.get_object(Bucket=bucket, Key=k)
        assert_client_error(e, "NoSuchKey", 404)


def test_key_too_long(target, users, s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="k" * 1025, Body=b"x")
    assert_client_error(e, "KeyTooLongError", 400)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="é" * 512 + "a", Body=b"x")  # 1025 bytes
    assert_client_error(e, "KeyTooLongError", 400)
    r = raw_request(target.endpoint, "PUT", key_path(bucket, "z" * 1025), body=b"x", user=users["alice"])
    assert_s3_error(r, 400, "KeyTooLongError")
    with pytest.raises(ClientError) as e:
        s3.create_multipart_upload(Bucket=bucket, Key="m" * 1025)
    assert_client_error(e, "KeyTooLongError", 400)
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def _snapshot(root):
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, n), root))
    return out


DOTDOT_KEYS = [
    "../escape-1",
    "../../escape-2",
    "a/../../../escape-3",
    "a/../b",
    "./dot/./seg",
    "..",
    ".",
    "a/..",
    "a/.",
]


@pytest.mark.parametrize("key", DOTDOT_KEYS)
def test_dot_segments_are_safe(target, users, bucket, key):
    """Keys with '.'/'..' segments are either refused with a clear S3 error
    or stored under exactly that key; nothing appears outside data_dir."""
    jail_before = _snapshot(target.jail)
    outside_before = _snapshot(target.workdir)
    data = b"dot-dot " + key.encode()
    alice = users["alice"]
    path = key_path(bucket, key)
    r = raw_request(target.endpoint, "PUT", path, body=data, user=alice)
    if r.status == 200:
        g = raw_request(target.endpoint, "GET", path, user=alice)
        assert g.status == 200 and g.body == data, g
        lst = raw_request(target.endpoint, "GET", key_path(bucket), query=[("list-type", "2")], user=alice)
        assert lst.status == 200
        keys = [e.text for e in lst.xml().iter() if e.tag.endswith("Key")]
        assert key in keys, f"stored {key!r} but listing shows {keys}"
        # its neighbour 'b' must not have been created by path normalization
        d = raw_request(target.endpoint, "DELETE", path, user=alice)
        assert d.status == 204, d
    else:
        err = assert_s3_error(r, 400, ("InvalidArgument", "InvalidRequest", "InvalidObjectName", "KeyTooLongError", "InvalidURI"))
        assert err["Message"]
    new_outside = {p for p in _snapshot(target.workdir) - outside_before if not p.startswith("jail")}
    assert not new_outside, f"files created next to the data dir: {new_outside}"
    new_in_jail = {p for p in _snapshot(target.jail) - jail_before if not p.startswith("data")}
    assert not new_in_jail, f"files created outside data_dir: {new_in_jail}"


def test_percent_encoded_dot_segments(target, users, bucket):
    """'%2E%2E' in the wire path must not be decoded into a traversal."""
    alice = users["alice"]
    outside_before = _snapshot(target.workdir)
    path = f"/{bucket}/%2E%2E/%2E%2E/%2E%2E/pct-escape"
    # the canonical URI is the decoded key re-encoded once ('.' stays '.')
    r = raw_request(
        target.endpoint, "PUT", path, body=b"x", user=alice, sign_path=key_path(bucket, "../../../pct-escape")
    )
    if r.status == 200:
        lst = raw_request(target.endpoint, "GET", key_path(bucket), query=[("list-type", "2")], user=alice)
        keys = [e.text for e in lst.xml().iter() if e.tag.endswith("Key")]
        assert "../../../pct-escape" in keys, keys
    else:
        assert_s3_error(r, 400, ("InvalidArgument", "InvalidRequest", "InvalidObjectName", "InvalidURI"))
    new = {p for p in _snapshot(target.workdir) - outside_before if not p.startswith("jail/data")}
    assert not new, f"files created outside data_dir: {new}"


def test_dotdot_key_cannot_read_other_bucket(target, users, s3, bucket, bucket_factory):
    """'../other/secret' inside bucket A must never reach bucket B's object."""
    other = bucket_factory("other")
    s3.put_object(Bucket=other, Key="secret", Body=b"top secret")
    r = raw_request(target.endpoint, "GET", key_path(bucket, f"../{other}/secret"), user=users["alice"])
    assert r.status in (400, 404), r
    assert b"top secret" not in r.body
    # bob has rights on bob-* only; a bob bucket must not open alice's objects
    bobs = bucket_factory("bob", user="bob")
    r = raw_request(target.endpoint, "GET", key_path(bobs, f"../{other}/secret"), user=users["bob"])
    assert r.status in (400, 403, 404), r
    assert b"top secret" not in r.body


@pytest.mark.parametrize("algo", ["CRC32", "SHA256"])
def test_checksum_mode_enabled(s3, bucket, algo):
    """Get/Head with ChecksumMode=ENABLED: botocore validates any
    x-amz-checksum-* the server returns, so a returned checksum must be right
    (and a ranged GET must not carry the whole object's checksum)."""
    data = rand(300_000)
    s3.put_object(Bucket=bucket, Key="ck", Body=data, ChecksumAlgorithm=algo)
    g = s3.get_object(Bucket=bucket, Key="ck", ChecksumMode="ENABLED")
    assert sha256(g["Body"].read()) == sha256(data)
    s3.head_object(Bucket=bucket, Key="ck", ChecksumMode="ENABLED")
    g = s3.get_object(Bucket=bucket, Key="ck", ChecksumMode="ENABLED", Range="bytes=100-199")
    assert g["Body"].read() == data[100:200]
