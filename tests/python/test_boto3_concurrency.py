"""Concurrency and scale through boto3: atomic overwrites seen by readers,
racing PUT/DELETE leave index and data consistent, racing CreateBucket has
one winner, DeleteBucket vs PutObject, and listings past 1000 keys."""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ClientError

from s3util import MiB, assert_client_error, rand, unique_bucket


def test_readers_never_see_torn_objects(target, bucket):
    """Overwrite one key with different 2 MiB versions while readers GET it:
    every read is one complete version and its ETag matches its bytes."""
    versions = [rand(2 * MiB) for _ in range(4)]
    known = {hashlib.md5(v).hexdigest() for v in versions}
    target.client().put_object(Bucket=bucket, Key="hot", Body=versions[0])
    stop = threading.Event()
    problems: list[str] = []

    def writer():
        c = target.client()
        i = 0
        while not stop.is_set():
            c.put_object(Bucket=bucket, Key="hot", Body=versions[i % len(versions)])
            i += 1

    def reader():
        c = target.client()
        reads = 0
        while not stop.is_set() or reads < 3:
            g = c.get_object(Bucket=bucket, Key="hot")
            body = g["Body"].read()
            md5 = hashlib.md5(body).hexdigest()
            if md5 not in known:
                problems.append(f"torn read: {len(body)} bytes, md5 {md5}")
            elif g["ETag"].strip('"') != md5:
                problems.append(f"ETag {g['ETag']} does not match body md5 {md5}")
            reads += 1

    threads = [threading.Thread(target=writer) for _ in range(2)] + [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    stop_timer = threading.Timer(4.0, stop.set)
    stop_timer.start()
    for t in threads:
        t.join(timeout=60)
    stop_timer.cancel()
    assert not problems, problems[:5]


def test_racing_put_delete_stay_consistent(target, bucket):
    keys = [f"race/{i}" for i in range(4)]

    def worker(n):
        c = target.client()
        for j in range(25):
            k = keys[(n + j) % len(keys)]
            if (n + j) % 3 == 0:
                c.delete_object(Bucket=bucket, Key=k)
            else:
                c.put_object(Bucket=bucket, Key=k, Body=f"{n}-{j}".encode() * 100)

    with ThreadPoolExecutor(6) as ex:
        list(ex.map(worker, range(6)))
    c = target.client()
    listed = {o["Key"]: o for o in c.list_objects_v2(Bucket=bucket, Prefix="race/").get("Contents", [])}
    for k in keys:
        if k in listed:
            g = c.get_object(Bucket=bucket, Key=k)
            body = g["Body"].read()
            assert g["ETag"] == listed[k]["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
            assert listed[k]["Size"] == len(body)
        else:
            with pytest.raises(ClientError) as e:
                c.get_object(Bucket=bucket, Key=k)
            assert_client_error(e, "NoSuchKey", 404)


def test_racing_create_bucket_has_one_winner(target):
    name = unique_bucket("bob")  # alice (*) and bob (bob-*) may both create it
    barrier = threading.Barrier(4)
    results = []

    def create(user):
        c = target.client(user)
        barrier.wait()
        try:
            c.create_bucket(Bucket=name)
            results.append((user, "ok"))
        except ClientError as e:
            results.append((user, e.response["Error"]["Code"]))

    threads = [threading.Thread(target=create, args=(u,)) for u in ("alice", "bob", "alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        winners = {u for u, r in results if r == "ok"}
        assert len(winners) == 1, results
        owner = winners.pop()
        for user, r in results:
            # us-east-1: the owner's second create answers 200 (AWS's legacy
            # behaviour); anyone else gets BucketAlreadyExists.
            want = "ok" if user == owner else "BucketAlreadyExists"
            assert r == want, results
    finally:
        for u in ("alice", "bob"):
            try:
                target.client(u).delete_bucket(Bucket=name)
            except ClientError:
                pass


def test_delete_bucket_then_put_fails(target):
    c = target.client()
    name = unique_bucket("gone")
    c.create_bucket(Bucket=name)
    c.delete_bucket(Bucket=name)
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=name, Key="zombie", Body=b"x")
    assert_client_error(e, "NoSuchBucket", 404)
    with pytest.raises(ClientError) as e:
        c.create_multipart_upload(Bucket=name, Key="zombie")
    assert_client_error(e, "NoSuchBucket", 404)
    c.create_bucket(Bucket=name)
    try:
        assert c.list_objects_v2(Bucket=name)["KeyCount"] == 0
    finally:
        c.delete_bucket(Bucket=name)


def test_delete_bucket_drops_its_uploads(target):
    """DeleteBucket on a bucket with only an in-progress upload: either
    refused (BucketNotEmpty) or the upload goes with the bucket -- a
    re-created bucket of the same name must not inherit it."""
    c = target.client()
    name = unique_bucket("mpu")
    c.create_bucket(Bucket=name)
    uid = c.create_multipart_upload(Bucket=name, Key="k")["UploadId"]
    try:
        c.delete_bucket(Bucket=name)
    except ClientError as e:
        assert_client_error(e, "BucketNotEmpty", 409)
        c.abort_multipart_upload(Bucket=name, Key="k", UploadId=uid)
        c.delete_bucket(Bucket=name)
        return
    c.create_bucket(Bucket=name)
    try:
        assert not c.list_multipart_uploads(Bucket=name).get("Uploads")
        with pytest.raises(ClientError) as e:
            c.upload_part(Bucket=name, Key="k", UploadId=uid, PartNumber=1, Body=b"x")
        assert_client_error(e, "NoSuchUpload", 404)
    finally:
        c.delete_bucket(Bucket=name)


@pytest.fixture(scope="module")
def big_bucket(target):
    """A bucket with 1105 keys (shared by the >1000-key listing tests)."""
    c = target.client()
    name = unique_bucket("many")
    c.create_bucket(Bucket=name)
    keys = [f"k/{i:05d}" for i in range(1100)] + [f"p{i}/x" for i in range(5)]

    def put(chunk):
        cl = target.client()
        for k in chunk:
            cl.put_object(Bucket=name, Key=k, Body=b"")

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(put, [keys[i::8] for i in range(8)]))
    yield name, sorted(keys)

    def delete(chunk):
        cl = target.client()
        cl.delete_objects(Bucket=name, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True})

    with ThreadPoolExecutor(4) as ex:
        list(ex.map(delete, [keys[i : i + 1000] for i in range(0, len(keys), 1000)]))
    c.delete_bucket(Bucket=name)


def test_list_more_than_1000(target, big_bucket):
    name, keys = big_bucket
    c = target.client()
    r = c.list_objects_v2(Bucket=name)
    assert r["KeyCount"] == 1000 and r["IsTruncated"] is True and r["MaxKeys"] == 1000
    r = c.list_objects_v2(Bucket=name, MaxKeys=5000)
    assert r["KeyCount"] == 1000, "max-keys is capped at 1000"
    got = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=name):
        got += [o["Key"] for o in page.get("Contents", [])]
    assert got == keys
    got = []
    for page in c.get_paginator("list_objects").paginate(Bucket=name):
        got += [o["Key"] for o in page.get("Contents", [])]
    assert got == keys
    r = c.list_objects_v2(Bucket=name, Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["k/", "p0/", "p1/", "p2/", "p3/", "p4/"]
    assert r["IsTruncated"] is False


def test_delete_objects_limit_1000(target, bucket):
    c = target.client()
    with pytest.raises(ClientError) as e:
        c.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": f"x{i}"} for i in range(1001)]})
    assert_client_error(e, "MalformedXML", 400)


def test_continuation_survives_deleted_key(target, bucket):
    """The token names a position, not an index: deleting keys between pages
    neither repeats nor skips the remaining keys."""
    c = target.client()
    keys = [f"c{i:02d}" for i in range(10)]
    for k in keys:
        c.put_object(Bucket=bucket, Key=k, Body=b"")
    p1 = c.list_objects_v2(Bucket=bucket, MaxKeys=3)
    assert [o["Key"] for o in p1["Contents"]] == keys[:3]
    c.delete_object(Bucket=bucket, Key="c02")  # last key of page 1
    c.delete_object(Bucket=bucket, Key="c00")  # before the position
    c.put_object(Bucket=bucket, Key="c01a", Body=b"")  # new key before the position
    rest = []
    token = p1["NextContinuationToken"]
    while token:
        r = c.list_objects_v2(Bucket=bucket, MaxKeys=3, ContinuationToken=token)
        rest += [o["Key"] for o in r.get("Contents", [])]
        token = r.get("NextContinuationToken")
    assert rest == keys[3:]


def test_empty_prefixes_vanish(target, bucket):
    """After deleting the only object under a/b/, no CommonPrefix 'a/' is left."""
    c = target.client()
    c.put_object(Bucket=bucket, Key="a/b/c", Body=b"x")
    c.put_object(Bucket=bucket, Key="z", Body=b"x")
    c.delete_object(Bucket=bucket, Key="a/b/c")
    r = c.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert not r.get("CommonPrefixes"), r.get("CommonPrefixes")
    assert [o["Key"] for o in r["Contents"]] == ["z"]


def test_signed_query_canonicalization(target, bucket):
    """Query values with reserved characters must be canonicalized exactly as
    SigV4 says (RFC 3986, %20 for space, '~' unescaped)."""
    c = target.client()
    weird = "sp ace+plus&amp=eq/ü~*'()!$,;:@"
    c.put_object(Bucket=bucket, Key=weird + "tail", Body=b"q")
    r = c.list_objects_v2(Bucket=bucket, Prefix=weird, StartAfter=weird + "t")
    assert [o["Key"] for o in r["Contents"]] == [weird + "tail"]
    r = c.list_objects_v2(Bucket=bucket, Prefix="sp ", Delimiter="~")
    assert [p["Prefix"] for p in r.get("CommonPrefixes", [])] == [weird[: weird.index("~") + 1]]


def test_metadata_whitespace(target, bucket):
    c = target.client()
    c.put_object(Bucket=bucket, Key="ws", Body=b"x", Metadata={"spaced": "a  b   c"})
    v = c.head_object(Bucket=bucket, Key="ws")["Metadata"]["spaced"]
    assert v.split() == ["a", "b", "c"]


def test_metadata_too_large(target, bucket):
    """S3: user metadata (sum of UTF-8 key + value bytes) is limited to 2 KB."""
    c = target.client()
    c.put_object(Bucket=bucket, Key="fits", Body=b"x", Metadata={"big": "v" * 1900})
    with pytest.raises(ClientError) as e:
        c.put_object(Bucket=bucket, Key="fat", Body=b"x", Metadata={"big": "v" * 2100})
    assert_client_error(e, "MetadataTooLarge", 400)
