"""Multipart uploads through boto3: Create/UploadPart/Complete/Abort,
ListParts, ListMultipartUploads, part validation errors and a 64 MiB upload
through boto3's transfer manager."""

from __future__ import annotations

import io

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from s3util import MiB, assert_client_error, md5_hex, multipart_etag, rand, sha256


def upload_parts(s3, bucket, key, upload_id, parts):
    out = []
    for n, data in parts:
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=n, Body=data)
        assert r["ETag"] == f'"{md5_hex(data)}"', f"part {n} ETag must be the part's MD5"
        out.append({"PartNumber": n, "ETag": r["ETag"]})
    return out


def test_multipart_full_flow(s3, bucket):
    key = "mp/full.bin"
    p1, p2, p3 = rand(5 * MiB), rand(5 * MiB + 3), rand(MiB // 2)
    up = s3.create_multipart_upload(
        Bucket=bucket,
        Key=key,
        ContentType="application/x-parts",
        Metadata={"stage": "multi"},
        CacheControl="private",
    )
    assert up["Bucket"] == bucket and up["Key"] == key
    uid = up["UploadId"]
    assert uid

    listed = s3.list_multipart_uploads(Bucket=bucket)
    assert [(u["Key"], u["UploadId"]) for u in listed.get("Uploads", [])] == [(key, uid)]
    assert listed["Uploads"][0]["Initiated"]

    parts = upload_parts(s3, bucket, key, uid, [(1, p1), (2, p2), (3, p3)])

    lp = s3.list_parts(Bucket=bucket, Key=key, UploadId=uid)
    assert lp["UploadId"] == uid
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in lp["Parts"]] == [
        (1, len(p1), f'"{md5_hex(p1)}"'),
        (2, len(p2), f'"{md5_hex(p2)}"'),
        (3, len(p3), f'"{md5_hex(p3)}"'),
    ]
    assert all(p["LastModified"] for p in lp["Parts"])
    assert lp["IsTruncated"] is False

    # not visible as an object before completion
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key=key)
    assert_client_error(e, ("404", "NoSuchKey", "NotFound"), 404)

    done = s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": parts}
    )
    want_etag = multipart_etag([p1, p2, p3])
    assert done["ETag"] == want_etag
    assert done["Key"] == key and done["Bucket"] == bucket

    g = s3.get_object(Bucket=bucket, Key=key)
    body = g["Body"].read()
    assert sha256(body) == sha256(p1 + p2 + p3)
    assert g["ETag"] == want_etag
    assert g["ContentLength"] == len(p1) + len(p2) + len(p3)
    assert g["ContentType"] == "application/x-parts"
    assert g["Metadata"] == {"stage": "multi"}
    assert g["CacheControl"] == "private"

    # range across the part boundary
    a, b = 5 * MiB - 10, 5 * MiB + 10
    r = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={a}-{b}")
    assert r["Body"].read() == (p1 + p2)[a : b + 1]

    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    with pytest.raises(ClientError) as e:
        s3.list_parts(Bucket=bucket, Key=key, UploadId=uid)
    assert_client_error(e, "NoSuchUpload", 404)
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == [key]


def test_single_small_part(s3, bucket):
    uid = s3.create_multipart_upload(Bucket=bucket, Key="one")["UploadId"]
    parts = upload_parts(s3, bucket, "one", uid, [(1, b"tiny")])
    r = s3.complete_multipart_upload(Bucket=bucket, Key="one", UploadId=uid, MultipartUpload={"Parts": parts})
    assert r["ETag"] == multipart_etag([b"tiny"])
    assert s3.get_object(Bucket=bucket, Key="one")["Body"].read() == b"tiny"


def test_part_reupload_and_sparse_part_numbers(s3, bucket):
    key = "sparse"
    a, a2, c = rand(5 * MiB), rand(5 * MiB), rand(100)
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    upload_parts(s3, bucket, key, uid, [(2, a), (7, rand(5 * MiB)), (10000, c)])
    # re-uploading a part number replaces it
    parts = upload_parts(s3, bucket, key, uid, [(2, a2)])
    lp = s3.list_parts(Bucket=bucket, Key=key, UploadId=uid)
    assert [p["PartNumber"] for p in lp["Parts"]] == [2, 7, 10000]
    assert lp["Parts"][0]["ETag"] == f'"{md5_hex(a2)}"'
    # complete with a subset (2 and 10000, skipping 7): allowed, ascending order only
    parts.append({"PartNumber": 10000, "ETag": f'"{md5_hex(c)}"'})
    r = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": parts})
    assert r["ETag"] == multipart_etag([a2, c])
    assert sha256(s3.get_object(Bucket=bucket, Key=key)["Body"].read()) == sha256(a2 + c)


def test_invalid_part_order(s3, bucket):
    uid = s3.create_multipart_upload(Bucket=bucket, Key="order")["UploadId"]
    parts = upload_parts(s3, bucket, "order", uid, [(1, rand(5 * MiB)), (2, rand(5 * MiB))])
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="order", UploadId=uid, MultipartUpload={"Parts": list(reversed(parts))}
        )
    assert_client_error(e, "InvalidPartOrder", 400)
    # duplicated part numbers are not ascending either
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=bucket, Key="order", UploadId=uid, MultipartUpload={"Parts": [parts[0], parts[0]]}
        )
    assert_client_error(e, "InvalidPartOrder", 400)
    # the upload survives a failed completion
    r = s3.complete_multipart_upload(Bucket=bucket, Key="order", UploadId=uid, MultipartUpload={"Parts": parts})
    assert r["ETag"].endswith('-2"')


def test_invalid_part(s3, bucket):
    key = "badpart"
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    p1 = rand(5 * MiB)
    parts = upload_parts(s3, bucket, key, uid, [(1, p1), (2, b"last")])
    wrong_etag = [parts[0], {"PartNumber": 2, "ETag": f'"{md5_hex(b"other")}"'}]
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": wrong_etag})
    assert_client_error(e, "InvalidPart", 400)
    missing = parts + [{"PartNumber": 3, "ETag": f'"{md5_hex(b"never")}"'}]
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": missing})
    assert_client_error(e, "InvalidPart", 400)
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key=key)
    assert_client_error(e, ("404", "NoSuchKey", "NotFound"), 404)
    # ETags without quotes are accepted (the aws CLI docs show both forms)
    unquoted = [{"PartNumber": p["PartNumber"], "ETag": p["ETag"].strip('"')} for p in parts]
    r = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": unquoted})
    assert r["ETag"] == multipart_etag([p1, b"last"])


def test_entity_too_small(s3, bucket):
    key = "small"
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    parts = upload_parts(s3, bucket, key, uid, [(1, rand(MiB)), (2, rand(MiB)), (3, rand(10))])
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": parts})
    assert_client_error(e, "EntityTooSmall", 400)
    # exactly 5 MiB is big enough for a non-last part
    parts = upload_parts(s3, bucket, key, uid, [(1, rand(5 * MiB))])
    lp = s3.list_parts(Bucket=bucket, Key=key, UploadId=uid)["Parts"]
    parts = [{"PartNumber": p["PartNumber"], "ETag": p["ETag"]} for p in lp if p["PartNumber"] in (1, 3)]
    r = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": parts})
    assert r["ETag"].endswith('-2"')
    assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == 5 * MiB + 10


def test_abort(s3, bucket):
    key = "aborted"
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    upload_parts(s3, bucket, key, uid, [(1, rand(1000))])
    r = s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=uid)
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=2, Body=b"x")
    assert_client_error(e, "NoSuchUpload", 404)
    with pytest.raises(ClientError) as e:
        s3.list_parts(Bucket=bucket, Key=key, UploadId=uid)
    assert_client_error(e, "NoSuchUpload", 404)
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"x"'}]}
        )
    assert_client_error(e, "NoSuchUpload", 404)
    with pytest.raises(ClientError) as e:
        s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=uid)
    assert_client_error(e, "NoSuchUpload", 404)
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key=key)
    assert_client_error(e, ("404", "NoSuchKey", "NotFound"), 404)


def test_unknown_upload_id(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket=bucket, Key="k", UploadId="no-such-upload-id", PartNumber=1, Body=b"x")
    assert_client_error(e, "NoSuchUpload", 404)
    # an upload id belongs to its key
    uid = s3.create_multipart_upload(Bucket=bucket, Key="mine")["UploadId"]
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket=bucket, Key="other", UploadId=uid, PartNumber=1, Body=b"x")
    assert_client_error(e, "NoSuchUpload", 404)
    # a path-like upload id must not be usable for traversal
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket=bucket, Key="mine", UploadId="../../" + uid, PartNumber=1, Body=b"x")
    assert_client_error(e, ("NoSuchUpload", "InvalidArgument"), None)


def test_list_parts_pagination(s3, bucket):
    key = "paged"
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    upload_parts(s3, bucket, key, uid, [(n, f"part {n}".encode()) for n in (1, 2, 3, 5, 8)])
    seen, marker = [], 0
    for _ in range(10):
        r = s3.list_parts(Bucket=bucket, Key=key, UploadId=uid, MaxParts=2, PartNumberMarker=marker)
        seen += [p["PartNumber"] for p in r["Parts"]]
        if not r["IsTruncated"]:
            break
        marker = r["NextPartNumberMarker"]
        assert marker == seen[-1]
    assert seen == [1, 2, 3, 5, 8]


def test_list_multipart_uploads(s3, bucket):
    ids = {}
    for key in ["a/1", "a/2", "b/1", "a/2"]:
        ids.setdefault(key, []).append(s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"])
    r = s3.list_multipart_uploads(Bucket=bucket)
    got = [(u["Key"], u["UploadId"]) for u in r["Uploads"]]
    assert [k for k, _ in got] == ["a/1", "a/2", "a/2", "b/1"]
    assert sorted(u for _, u in got) == sorted(u for v in ids.values() for u in v)
    assert len(set(u for _, u in got)) == 4, "every upload gets its own id"
    r = s3.list_multipart_uploads(Bucket=bucket, Prefix="a/")
    assert [u["Key"] for u in r["Uploads"]] == ["a/1", "a/2", "a/2"]
    r = s3.list_multipart_uploads(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in r.get("CommonPrefixes", [])] == ["a/", "b/"]
    assert not r.get("Uploads")
    # two concurrent uploads of one key complete independently
    a2_first, a2_second = ids["a/2"]
    d1, d2 = b"first upload", b"second upload"
    p = upload_parts(s3, bucket, "a/2", a2_first, [(1, d1)])
    q = upload_parts(s3, bucket, "a/2", a2_second, [(1, d2)])
    s3.complete_multipart_upload(Bucket=bucket, Key="a/2", UploadId=a2_second, MultipartUpload={"Parts": q})
    assert s3.get_object(Bucket=bucket, Key="a/2")["Body"].read() == d2
    s3.complete_multipart_upload(Bucket=bucket, Key="a/2", UploadId=a2_first, MultipartUpload={"Parts": p})
    assert s3.get_object(Bucket=bucket, Key="a/2")["Body"].read() == d1


def test_multipart_permissions(target, bucket):
    s3 = target.client("alice")
    uid = s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    bob = target.client("bob")
    for call in (
        lambda: bob.create_multipart_upload(Bucket=bucket, Key="k"),
        lambda: bob.upload_part(Bucket=bucket, Key="k", UploadId=uid, PartNumber=1, Body=b"x"),
        lambda: bob.list_parts(Bucket=bucket, Key="k", UploadId=uid),
        lambda: bob.list_multipart_uploads(Bucket=bucket),
        lambda: bob.abort_multipart_upload(Bucket=bucket, Key="k", UploadId=uid),
    ):
        with pytest.raises(ClientError) as e:
            call()
        assert_client_error(e, "AccessDenied", 403)
    with pytest.raises(ClientError) as e:
        target.client("carol").create_multipart_upload(Bucket="shared", Key="carol-mp")
    assert_client_error(e, "AccessDenied", 403)
    assert [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=bucket)["Uploads"]] == [uid]


def test_64mib_transfer_manager(s3, bucket):
    data = rand(64 * MiB)
    cfg = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB, max_concurrency=4)
    s3.upload_fileobj(io.BytesIO(data), bucket, "big/64mib.bin", Config=cfg)
    h = s3.head_object(Bucket=bucket, Key="big/64mib.bin")
    assert h["ContentLength"] == 64 * MiB
    chunks = [data[i : i + 8 * MiB] for i in range(0, len(data), 8 * MiB)]
    assert h["ETag"] == multipart_etag(chunks)
    out = io.BytesIO()
    s3.download_fileobj(bucket, "big/64mib.bin", out, Config=cfg)  # parallel ranged GETs
    assert sha256(out.getvalue()) == sha256(data)


def test_list_multipart_uploads_pagination(s3, bucket):
    made = []
    for key in ["k1", "k2", "k2", "k3"]:
        made.append((key, s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]))
    seen, kw = [], {}
    for _ in range(10):
        r = s3.list_multipart_uploads(Bucket=bucket, MaxUploads=1, **kw)
        seen += [(u["Key"], u["UploadId"]) for u in r.get("Uploads", [])]
        if not r["IsTruncated"]:
            break
        kw = {"KeyMarker": r["NextKeyMarker"], "UploadIdMarker": r["NextUploadIdMarker"]}
    assert sorted(seen) == sorted(made)
    assert [k for k, _ in seen] == ["k1", "k2", "k2", "k3"]
    assert len(set(seen)) == 4
