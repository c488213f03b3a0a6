"""ListObjectsV2 and ListObjects (v1) through boto3 and raw requests."""

from __future__ import annotations

from urllib.parse import unquote_plus

import pytest
from botocore.exceptions import ClientError

from s3util import S3_NS, assert_client_error, key_path, md5_hex, raw_request, unique_bucket

KEYS = [
    "a.txt",
    "b/1",
    "b/2",
    "b/c/3",
    "b/cat",
    "b0",
    "c",
    "d/e/f/g",
    "z",
]

# byte order (UTF-8), not locale or case-insensitive order
ORDER_KEYS = ["Zebra", "apple", "Apple", "a-b", "a/b", "a0", "a.b", "a_b", "é", "z", "~tilde", "日本", "\U0001f680", "a"]


@pytest.fixture
def populated(s3, bucket):
    for k in KEYS:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    return bucket


def all_v2(s3, **kw):
    keys, prefixes, pages = [], [], 0
    token = None
    while True:
        args = dict(kw)
        if token:
            args["ContinuationToken"] = token
        r = s3.list_objects_v2(**args)
        pages += 1
        keys += [o["Key"] for o in r.get("Contents", [])]
        prefixes += [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        if not r["IsTruncated"]:
            assert "NextContinuationToken" not in r
            break
        token = r["NextContinuationToken"]
        assert token
        assert pages < 100, "pagination does not terminate"
    return keys, prefixes, pages


def test_list_v2_all(s3, populated):
    r = s3.list_objects_v2(Bucket=populated)
    assert r["Name"] == populated
    assert r["KeyCount"] == len(KEYS)
    assert r["IsTruncated"] is False
    assert r["MaxKeys"] == 1000
    assert [o["Key"] for o in r["Contents"]] == sorted(KEYS)
    for o in r["Contents"]:
        assert o["Size"] == len(o["Key"])
        assert o["ETag"] == f'"{md5_hex(o["Key"].encode())}"'
        assert o["LastModified"]
        assert o.get("StorageClass", "STANDARD") == "STANDARD"
        assert "Owner" not in o, "v2 lists no Owner unless fetch-owner=true"


def test_list_v2_prefix(s3, populated):
    r = s3.list_objects_v2(Bucket=populated, Prefix="b/")
    assert [o["Key"] for o in r["Contents"]] == ["b/1", "b/2", "b/c/3", "b/cat"]
    assert r["Prefix"] == "b/"
    # a prefix that is not a "directory"
    r = s3.list_objects_v2(Bucket=populated, Prefix="b/c")
    assert [o["Key"] for o in r["Contents"]] == ["b/c/3", "b/cat"]
    r = s3.list_objects_v2(Bucket=populated, Prefix="b")
    assert [o["Key"] for o in r["Contents"]] == ["b/1", "b/2", "b/c/3", "b/cat", "b0"]
    r = s3.list_objects_v2(Bucket=populated, Prefix="nothing-here")
    assert r["KeyCount"] == 0 and "Contents" not in r


def test_list_v2_delimiter(s3, populated):
    r = s3.list_objects_v2(Bucket=populated, Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["a.txt", "b0", "c", "z"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["b/", "d/"]
    assert r["KeyCount"] == 6
    assert r["Delimiter"] == "/"
    r = s3.list_objects_v2(Bucket=populated, Delimiter="/", Prefix="b/")
    assert [o["Key"] for o in r["Contents"]] == ["b/1", "b/2", "b/cat"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["b/c/"]
    r = s3.list_objects_v2(Bucket=populated, Delimiter="/", Prefix="d/")
    assert "Contents" not in r
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["d/e/"]
    # a delimiter other than '/'
    r = s3.list_objects_v2(Bucket=populated, Delimiter="c")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["b/c", "c"]
    assert [o["Key"] for o in r["Contents"]] == ["a.txt", "b/1", "b/2", "b0", "d/e/f/g", "z"]


def test_empty_delimiter_is_omitted_from_the_reply(s3, populated):
    # An empty delimiter groups nothing, and AWS leaves the element out of
    # the reply (it used to come back as an empty <Delimiter/>).
    for r in (
        s3.list_objects_v2(Bucket=populated, Delimiter=""),
        s3.list_objects(Bucket=populated, Delimiter=""),
    ):
        assert "Delimiter" not in r, r.get("Delimiter")
        assert "CommonPrefixes" not in r
        assert [o["Key"] for o in r["Contents"]] == sorted(KEYS)


def test_list_v2_pagination(s3, populated):
    keys, prefixes, pages = all_v2(s3, Bucket=populated, MaxKeys=2)
    assert keys == sorted(KEYS)
    assert prefixes == []
    assert pages == 5
    first = s3.list_objects_v2(Bucket=populated, MaxKeys=2)
    assert first["IsTruncated"] is True
    assert first["KeyCount"] == 2
    assert first["MaxKeys"] == 2


def test_list_v2_pagination_with_delimiter(s3, populated):
    # common prefixes count toward max-keys and are never repeated
    keys, prefixes, _ = all_v2(s3, Bucket=populated, MaxKeys=1, Delimiter="/")
    assert keys == ["a.txt", "b0", "c", "z"]
    assert prefixes == ["b/", "d/"]


def test_list_v2_start_after(s3, populated):
    r = s3.list_objects_v2(Bucket=populated, StartAfter="b/2")
    assert [o["Key"] for o in r["Contents"]] == ["b/c/3", "b/cat", "b0", "c", "d/e/f/g", "z"]
    assert r["StartAfter"] == "b/2"
    r = s3.list_objects_v2(Bucket=populated, StartAfter="b/bzz")  # not an existing key
    assert [o["Key"] for o in r["Contents"]][0] == "b/c/3"
    r = s3.list_objects_v2(Bucket=populated, StartAfter="zzz")
    assert r["KeyCount"] == 0
    keys, _, _ = all_v2(s3, Bucket=populated, StartAfter="b", MaxKeys=3)
    assert keys == [k for k in sorted(KEYS) if k > "b"]


def test_list_v2_fetch_owner(s3, populated):
    r = s3.list_objects_v2(Bucket=populated, FetchOwner=True, MaxKeys=2)
    for o in r["Contents"]:
        assert o.get("Owner", {}).get("ID"), o
    r = s3.list_objects_v2(Bucket=populated, FetchOwner=False, MaxKeys=2)
    for o in r["Contents"]:
        assert "Owner" not in o


def test_list_byte_order(s3, bucket):
    for k in ORDER_KEYS:
        s3.put_object(Bucket=bucket, Key=k, Body=b"o")
    want = sorted(ORDER_KEYS, key=lambda k: k.encode("utf-8"))
    got = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert got == want
    keys, _, _ = all_v2(s3, Bucket=bucket, MaxKeys=3)
    assert keys == want
    got_v1 = [o["Key"] for o in s3.list_objects(Bucket=bucket)["Contents"]]
    assert got_v1 == want


ENC_KEYS = ["sp ace", "plus+sign", "ünï/cöde", "amp&lt;<>", "pct%41", "tab\tkey", "ctrl\x01char"]


def test_list_encoding_type_url_boto3(s3, bucket):
    for k in ENC_KEYS:
        s3.put_object(Bucket=bucket, Key=k, Body=b"e")
    want = sorted(ENC_KEYS, key=lambda k: k.encode())
    # botocore always asks for encoding-type=url and decodes transparently
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == want
    # asking explicitly hands us the encoded form
    r = s3.list_objects_v2(Bucket=bucket, EncodingType="url")
    assert r["EncodingType"] == "url"
    raw = [o["Key"] for o in r["Contents"]]
    for enc in raw:
        assert all(ord(ch) < 128 and ch not in " <>&\t\x01" for ch in enc), enc
    assert [unquote_plus(k) for k in raw] == want


def test_list_encoding_type_url_raw(target, users, bucket, s3):
    for k in ENC_KEYS[:4]:
        s3.put_object(Bucket=bucket, Key="p/" + k, Body=b"e")
    r = raw_request(
        target.endpoint,
        "GET",
        key_path(bucket),
        query=[("list-type", "2"), ("encoding-type", "url"), ("delimiter", "/"), ("prefix", "p/")],
        user=users["alice"],
    )
    assert r.status == 200, r
    root = r.xml()
    assert root.findtext(f"{S3_NS}EncodingType") == "url"
    keys = [e.findtext(f"{S3_NS}Key") for e in root.findall(f"{S3_NS}Contents")]
    assert [unquote_plus(k) for k in keys] == ["p/amp&lt;<>", "p/plus+sign", "p/sp ace"]
    assert "p/sp ace" not in keys, "keys must be URL-encoded"
    prefixes = [e.findtext(f"{S3_NS}Prefix") for e in root.findall(f"{S3_NS}CommonPrefixes")]
    assert [unquote_plus(p) for p in prefixes] == ["p/ünï/"]
    assert prefixes != ["p/ünï/"], "CommonPrefixes must be URL-encoded too"
    # Prefix/Delimiter are encoded in the reply too
    assert unquote_plus(root.findtext(f"{S3_NS}Prefix")) == "p/"
    # without encoding-type the XML carries the raw (XML-escaped) keys
    r = raw_request(
        target.endpoint, "GET", key_path(bucket), query=[("list-type", "2"), ("prefix", "p/amp")], user=users["alice"]
    )
    assert r.status == 200, r
    assert [e.findtext(f"{S3_NS}Key") for e in r.xml().findall(f"{S3_NS}Contents")] == ["p/amp&lt;<>"]
    assert b"amp&amp;lt;&lt;" in r.body


def test_list_empty_and_missing_bucket(s3, bucket):
    r = s3.list_objects_v2(Bucket=bucket)
    assert r["KeyCount"] == 0 and "Contents" not in r and r["IsTruncated"] is False
    with pytest.raises(ClientError) as e:
        s3.list_objects_v2(Bucket=unique_bucket("missing"))
    assert_client_error(e, "NoSuchBucket", 404)
    with pytest.raises(ClientError) as e:
        s3.list_objects(Bucket=unique_bucket("missing"))
    assert_client_error(e, "NoSuchBucket", 404)


def test_list_invalid_continuation_token(s3, populated):
    with pytest.raises(ClientError) as e:
        s3.list_objects_v2(Bucket=populated, ContinuationToken="definitely-not-a-token!!")
    assert_client_error(e, "InvalidArgument", 400)


def test_list_v1_marker(s3, populated):
    r = s3.list_objects(Bucket=populated)
    assert [o["Key"] for o in r["Contents"]] == sorted(KEYS)
    assert r["IsTruncated"] is False
    for o in r["Contents"]:
        assert o.get("Owner", {}).get("ID"), "v1 always lists the Owner"
    r = s3.list_objects(Bucket=populated, Marker="b/cat")
    assert [o["Key"] for o in r["Contents"]] == ["b0", "c", "d/e/f/g", "z"]
    assert r.get("Marker") == "b/cat", "v1 echoes the Marker"
    # paging v1: without a delimiter NextMarker is absent; the last key is the marker
    keys, marker = [], None
    for _ in range(20):
        kw = {"Bucket": populated, "MaxKeys": 4}
        if marker:
            kw["Marker"] = marker
        r = s3.list_objects(**kw)
        page = [o["Key"] for o in r.get("Contents", [])]
        keys += page
        if not r["IsTruncated"]:
            break
        marker = r.get("NextMarker") or page[-1]
    assert keys == sorted(KEYS)


def test_list_v1_delimiter_next_marker(s3, populated):
    keys, prefixes, marker = [], [], None
    for _ in range(20):
        kw = {"Bucket": populated, "MaxKeys": 2, "Delimiter": "/"}
        if marker:
            kw["Marker"] = marker
        r = s3.list_objects(**kw)
        keys += [o["Key"] for o in r.get("Contents", [])]
        prefixes += [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        if not r["IsTruncated"]:
            break
        assert r.get("NextMarker"), "truncated v1 listing with a delimiter must carry NextMarker"
        marker = r["NextMarker"]
    assert keys == ["a.txt", "b0", "c", "z"]
    assert prefixes == ["b/", "d/"]


def test_list_v1_prefix_and_delimiter(s3, populated):
    r = s3.list_objects(Bucket=populated, Prefix="b/", Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["b/1", "b/2", "b/cat"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["b/c/"]


def test_list_permissions(target, populated):
    with pytest.raises(ClientError) as e:
        target.client("bob").list_objects_v2(Bucket=populated)
    assert_client_error(e, "AccessDenied", 403)
    with pytest.raises(ClientError) as e:
        target.client("bob").list_objects(Bucket=populated)
    assert_client_error(e, "AccessDenied", 403)
