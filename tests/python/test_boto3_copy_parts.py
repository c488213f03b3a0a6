"""UploadPartCopy (ranges, source conditions, encoded source keys, mixed
with uploaded parts), GetObject/HeadObject with PartNumber, and the
unversioned bucket's view of versions: ListObjectVersions and VersionId
'null'."""

from __future__ import annotations

import datetime as dt

import pytest
from botocore.exceptions import ClientError

from s3util import MiB, assert_client_error, md5_hex, multipart_etag, rand, unique_bucket


def complete(s3, bucket, key, uid, etags):
    return s3.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": i, "ETag": e} for i, e in enumerate(etags, 1)]},
    )


def body(s3, bucket, key, **kw) -> bytes:
    return s3.get_object(Bucket=bucket, Key=key, **kw)["Body"].read()


# --------------------------------------------------------------------------
# UploadPartCopy
# --------------------------------------------------------------------------


def test_upload_part_copy_mixed_with_uploaded_parts(s3, bucket, bucket_factory):
    other = bucket_factory("pcsrc")
    src, tail, uploaded = rand(6 * MiB), rand(1000), rand(5 * MiB)
    s3.put_object(Bucket=bucket, Key="src", Body=src)
    s3.put_object(Bucket=other, Key="tail", Body=tail)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="dst", ContentType="application/x-mixed")["UploadId"]
    r1 = s3.upload_part_copy(
        Bucket=bucket, Key="dst", UploadId=uid, PartNumber=1,
        CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange=f"bytes={MiB}-{6 * MiB - 1}",
    )
    r2 = s3.upload_part(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=2, Body=uploaded)
    r3 = s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=3, CopySource={"Bucket": bucket, "Key": "src"})
    r4 = s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=4, CopySource={"Bucket": other, "Key": "tail"})
    parts = [src[MiB:], uploaded, src, tail]
    etags = [r1["CopyPartResult"]["ETag"], r2["ETag"], r3["CopyPartResult"]["ETag"], r4["CopyPartResult"]["ETag"]]
    assert etags == [f'"{md5_hex(p)}"' for p in parts], "a copied part's ETag is its bytes' MD5"
    assert all(r["CopyPartResult"]["LastModified"] for r in (r1, r3, r4))
    lp = s3.list_parts(Bucket=bucket, Key="dst", UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in lp] == [
        (i, len(p), e) for i, (p, e) in enumerate(zip(parts, etags), 1)
    ]
    done = complete(s3, bucket, "dst", uid, etags)
    assert done["ETag"] == multipart_etag(parts)
    g = s3.get_object(Bucket=bucket, Key="dst")
    assert g["Body"].read() == b"".join(parts)
    assert g["ContentType"] == "application/x-mixed"
    assert body(s3, bucket, "src") == src, "the source is untouched"


@pytest.mark.parametrize(
    "rng,code,status",
    [(r, "InvalidArgument", 400) for r in ["0-9", "bytes 0-9", "bits=0-9", "bytes=10-5", "bytes=-10", "bytes=5-", "bytes=a-b"]]
    # Well-formed but past the source's end: InvalidRange, as clients expect.
    + [(r, "InvalidRange", 416) for r in ["bytes=0-1000", "bytes=1000-1001"]],
)
def test_upload_part_copy_invalid_range(s3, bucket, rng, code, status):
    s3.put_object(Bucket=bucket, Key="src", Body=rand(1000))
    uid = s3.create_multipart_upload(Bucket=bucket, Key="dst")["UploadId"]
    with pytest.raises(ClientError) as e:
        s3.upload_part_copy(
            Bucket=bucket, Key="dst", UploadId=uid, PartNumber=1,
            CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange=rng,
        )
    assert_client_error(e, code, status)
    assert not s3.list_parts(Bucket=bucket, Key="dst", UploadId=uid).get("Parts")


def test_upload_part_copy_source_conditions(s3, bucket):
    s3.put_object(Bucket=bucket, Key="src", Body=b"conditional source")
    h = s3.head_object(Bucket=bucket, Key="src")
    etag, lm = h["ETag"], h["LastModified"]
    uid = s3.create_multipart_upload(Bucket=bucket, Key="dst")["UploadId"]
    hour = dt.timedelta(hours=1)

    def copy(**cond):
        return s3.upload_part_copy(
            Bucket=bucket, Key="dst", UploadId=uid, PartNumber=1, CopySource={"Bucket": bucket, "Key": "src"}, **cond
        )

    for cond in (
        {"CopySourceIfMatch": etag},
        {"CopySourceIfNoneMatch": '"0123"'},
        {"CopySourceIfModifiedSince": lm - hour},
        {"CopySourceIfUnmodifiedSince": lm + hour},
        {"CopySourceIfMatch": etag, "CopySourceIfUnmodifiedSince": lm - hour},  # If-Match wins
    ):
        assert copy(**cond)["CopyPartResult"]["ETag"] == etag, cond
    for cond in (
        {"CopySourceIfMatch": '"0123"'},
        {"CopySourceIfNoneMatch": etag},
        {"CopySourceIfModifiedSince": lm},
        {"CopySourceIfUnmodifiedSince": lm - hour},
    ):
        with pytest.raises(ClientError) as e:
            copy(**cond)
        assert_client_error(e, "PreconditionFailed", 412)


@pytest.mark.parametrize(
    "key", ["with space", "plus+sign", "ünïcödé/日本語", "percent%41%", "a/b c/+d%2Fe?x#y&z=1"]
)
def test_upload_part_copy_encoded_source_keys(s3, bucket, key):
    data = rand(2000) + key.encode()
    s3.put_object(Bucket=bucket, Key=key, Body=data)
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key + ".copy")["UploadId"]
    r = s3.upload_part_copy(
        Bucket=bucket, Key=key + ".copy", UploadId=uid, PartNumber=1,
        CopySource={"Bucket": bucket, "Key": key}, CopySourceRange=f"bytes=2000-{len(data) - 1}",
    )
    complete(s3, bucket, key + ".copy", uid, [r["CopyPartResult"]["ETag"]])
    assert body(s3, bucket, key + ".copy") == key.encode()


def test_upload_part_copy_missing_things(s3, bucket):
    s3.put_object(Bucket=bucket, Key="src", Body=b"x")
    uid = s3.create_multipart_upload(Bucket=bucket, Key="dst")["UploadId"]
    for src, code in (
        ({"Bucket": bucket, "Key": "missing"}, "NoSuchKey"),
        ({"Bucket": unique_bucket("missing"), "Key": "src"}, "NoSuchBucket"),
    ):
        with pytest.raises(ClientError) as e:
            s3.upload_part_copy(Bucket=bucket, Key="dst", UploadId=uid, PartNumber=1, CopySource=src)
        assert_client_error(e, code, 404)
    with pytest.raises(ClientError) as e:
        s3.upload_part_copy(
            Bucket=bucket, Key="dst", UploadId="no-such-upload", PartNumber=1, CopySource={"Bucket": bucket, "Key": "src"}
        )
    assert_client_error(e, "NoSuchUpload", 404)


# --------------------------------------------------------------------------
# PartNumber on GetObject / HeadObject
# --------------------------------------------------------------------------


def test_get_and_head_part_number(s3, bucket):
    parts = [rand(5 * MiB), rand(5 * MiB + 7), rand(1000)]
    uid = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    etags = [
        s3.upload_part(Bucket=bucket, Key="mp", UploadId=uid, PartNumber=i, Body=p)["ETag"]
        for i, p in enumerate(parts, 1)
    ]
    etag = complete(s3, bucket, "mp", uid, etags)["ETag"]
    total = sum(map(len, parts))
    start = 0
    for n, p in enumerate(parts, 1):
        rng = f"bytes {start}-{start + len(p) - 1}/{total}"
        for r in (s3.get_object(Bucket=bucket, Key="mp", PartNumber=n), s3.head_object(Bucket=bucket, Key="mp", PartNumber=n)):
            assert r["ResponseMetadata"]["HTTPStatusCode"] == 206, n
            assert (r["ContentLength"], r["ContentRange"], r.get("PartsCount"), r["ETag"]) == (len(p), rng, 3, etag), n
        assert body(s3, bucket, "mp", PartNumber=n) == p
        start += len(p)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="mp", PartNumber=4)
    assert_client_error(e, "InvalidPartNumber", 416)
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="mp", PartNumber=4)
    assert_client_error(e, ("InvalidPartNumber", "416"), 416)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="mp", PartNumber=1, Range="bytes=0-9")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400, e.value.response


def test_part_number_on_a_single_part_object(s3, bucket):
    data = rand(1000)
    s3.put_object(Bucket=bucket, Key="single", Body=data)
    for r in (s3.get_object(Bucket=bucket, Key="single", PartNumber=1), s3.head_object(Bucket=bucket, Key="single", PartNumber=1)):
        assert r["ContentLength"] == 1000
        assert r.get("PartsCount") in (None, 1), r
        if r["ResponseMetadata"]["HTTPStatusCode"] == 206:
            assert r["ContentRange"] == "bytes 0-999/1000"
        else:
            assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert body(s3, bucket, "single", PartNumber=1) == data
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="single", PartNumber=2)
    assert_client_error(e, "InvalidPartNumber", 416)


# --------------------------------------------------------------------------
# versions of an unversioned bucket
# --------------------------------------------------------------------------


def test_list_object_versions_unversioned(s3, bucket):
    objs = {"a": b"1", "b/1": b"22", "b/2": b"333", "c": b"4444"}
    for k, v in objs.items():
        s3.put_object(Bucket=bucket, Key=k, Body=v)
    s3.put_object(Bucket=bucket, Key="a", Body=b"overwritten")  # still one version
    objs["a"] = b"overwritten"
    r = s3.list_object_versions(Bucket=bucket)
    assert r["Name"] == bucket and r["IsTruncated"] is False
    assert not r.get("DeleteMarkers")
    got = [(v["Key"], v["VersionId"], v["IsLatest"], v["Size"], v["ETag"]) for v in r["Versions"]]
    assert got == [(k, "null", True, len(v), f'"{md5_hex(v)}"') for k, v in sorted(objs.items())]
    assert all(v["LastModified"] for v in r["Versions"])
    r = s3.list_object_versions(Bucket=bucket, Prefix="b/")
    assert [v["Key"] for v in r["Versions"]] == ["b/1", "b/2"]
    r = s3.list_object_versions(Bucket=bucket, Delimiter="/")
    assert [v["Key"] for v in r["Versions"]] == ["a", "c"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["b/"]
    r = s3.list_object_versions(Bucket=bucket, MaxKeys=2)
    assert [v["Key"] for v in r["Versions"]] == ["a", "b/1"] and r["IsTruncated"] is True
    assert r["NextKeyMarker"] == "b/1"
    r = s3.list_object_versions(Bucket=bucket, KeyMarker=r["NextKeyMarker"])
    assert [v["Key"] for v in r["Versions"]] == ["b/2", "c"]


def test_version_id_null_names_the_object(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"unversioned")
    assert body(s3, bucket, "k", VersionId="null") == b"unversioned"
    assert s3.head_object(Bucket=bucket, Key="k", VersionId="null")["ContentLength"] == 11
    s3.put_object_acl(Bucket=bucket, Key="k", VersionId="null", ACL="public-read")
    grants = s3.get_object_acl(Bucket=bucket, Key="k", VersionId="null")["Grants"]
    assert {"Type": "Group", "URI": "http://acs.amazonaws.com/groups/global/AllUsers"} in [g["Grantee"] for g in grants]
    s3.delete_object(Bucket=bucket, Key="k", VersionId="null")
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="k")
    assert_client_error(e, ("404", "NoSuchKey"), 404)


def test_other_version_ids_are_invalid(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"kept")
    vid = "3sL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY"
    for call in (
        lambda: s3.get_object(Bucket=bucket, Key="k", VersionId=vid),
        lambda: s3.delete_object(Bucket=bucket, Key="k", VersionId=vid),
        lambda: s3.get_object_acl(Bucket=bucket, Key="k", VersionId=vid),
        lambda: s3.put_object_acl(Bucket=bucket, Key="k", VersionId=vid, ACL="private"),
    ):
        with pytest.raises(ClientError) as e:
            call()
        assert_client_error(e, "InvalidArgument", 400)
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="k", VersionId=vid)
    assert_client_error(e, ("InvalidArgument", "400"), 400)
    assert body(s3, bucket, "k") == b"kept"
