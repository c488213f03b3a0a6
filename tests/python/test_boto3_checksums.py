"""S3 flexible checksums with boto3 and the aws CLI against storage-target:
PutObject with each algorithm (header and trailer), GetObject/HeadObject
with ChecksumMode=ENABLED, wrong values (BadDigest, nothing stored),
multipart COMPOSITE and FULL_OBJECT uploads, ListParts,
GetObjectAttributes, CopyObject, `aws s3api put-object --checksum-algorithm`.

botocore computes CRC32C and CRC64NVME only with awscrt, which the venv
does not carry: for those the test computes the values itself (pure-Python
table CRCs below, checked against the standard check values) and passes
them as ChecksumCRC32C / ChecksumCRC64NVME, which botocore sends as is.
"""

from __future__ import annotations

import base64
import hashlib
import zlib

import pytest
from botocore.exceptions import ClientError

from s3util import MiB, SentHeaders, assert_client_error, force_unsigned_trailer, rand


def _table(poly: int) -> list[int]:
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        out.append(c)
    return out


_CRC32C = _table(0x82F63B78)
_CRC64NVME = _table(0x9A6C9329AC4BC9B5)


def _crc(table: list[int], mask: int, data: bytes) -> int:
    c = mask
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ mask


def raw_sum(alg: str, data: bytes) -> bytes:
    """The raw checksum S3 encodes (big-endian for the CRCs)."""
    if alg == "CRC32":
        return zlib.crc32(data).to_bytes(4, "big")
    if alg == "CRC32C":
        return _crc(_CRC32C, 0xFFFFFFFF, data).to_bytes(4, "big")
    if alg == "CRC64NVME":
        return _crc(_CRC64NVME, 0xFFFFFFFFFFFFFFFF, data).to_bytes(8, "big")
    if alg == "SHA1":
        return hashlib.sha1(data).digest()
    if alg == "SHA256":
        return hashlib.sha256(data).digest()
    raise AssertionError(alg)


def b64sum(alg: str, data: bytes) -> str:
    return base64.b64encode(raw_sum(alg, data)).decode()


def field(alg: str) -> str:
    """The boto3 parameter / response member: ChecksumCRC64NVME, ..."""
    return "Checksum" + alg


ALL = ["CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"]
BOTOCORE_COMPUTES = {"CRC32", "SHA1", "SHA256"}  # the others need awscrt


def test_own_crcs_match_check_values():
    assert raw_sum("CRC32C", b"123456789") == (0xE3069283).to_bytes(4, "big")
    assert raw_sum("CRC64NVME", b"123456789") == (0xAE8B14860A799888).to_bytes(8, "big")


def put_kwargs(alg: str, data: bytes) -> dict:
    if alg in BOTOCORE_COMPUTES:
        return {"ChecksumAlgorithm": alg}
    return {field(alg): b64sum(alg, data)}


@pytest.mark.parametrize("alg", ALL)
def test_put_get_head_each_algorithm(s3, bucket, alg):
    data = rand(100_003)
    want = b64sum(alg, data)
    r = s3.put_object(Bucket=bucket, Key="k", Body=data, **put_kwargs(alg, data))
    assert r[field(alg)] == want
    assert r["ChecksumType"] == "FULL_OBJECT"
    g = s3.get_object(Bucket=bucket, Key="k", ChecksumMode="ENABLED")
    assert g[field(alg)] == want
    assert g["ChecksumType"] == "FULL_OBJECT"
    assert g["Body"].read() == data  # botocore validates CRC32/SHA* here
    h = s3.head_object(Bucket=bucket, Key="k", ChecksumMode="ENABLED")
    assert h[field(alg)] == want and h["ChecksumType"] == "FULL_OBJECT"
    # Only with checksum mode, and never for a range.
    h = s3.head_object(Bucket=bucket, Key="k")
    assert not [k for k in h if k.startswith("Checksum")]
    g = s3.get_object(Bucket=bucket, Key="k", Range="bytes=0-99", ChecksumMode="ENABLED")
    assert not [k for k in g if k.startswith("Checksum")]
    assert len(g["Body"].read()) == 100


@pytest.mark.parametrize("alg", ["CRC32", "SHA1", "SHA256"])
def test_trailer_checksums_are_stored(target, bucket, alg):
    """boto3's default over HTTPS (when_supported): aws-chunked with a
    trailing x-amz-checksum-*, forced here over plain HTTP."""
    c = target.client("alice", request_checksum_calculation="when_supported")
    force_unsigned_trailer(c)
    sent = SentHeaders(c)
    data = rand(3 * MiB + 7)
    c.put_object(Bucket=bucket, Key="trl", Body=data, ChecksumAlgorithm=alg)
    h = sent.requests[-1][2]
    assert h.get("X-Amz-Trailer") == f"x-amz-checksum-{alg.lower()}"
    g = c.get_object(Bucket=bucket, Key="trl", ChecksumMode="ENABLED")
    assert g[field(alg)] == b64sum(alg, data)
    assert g["Body"].read() == data


def _put_with_sdk_default(target, bucket, calculation: str, key: str, size: int):
    """PutObject with the SDK's checksum default for calculation; the data
    sent and HeadObject's reply (ChecksumMode enabled)."""
    c = target.client("alice", request_checksum_calculation=calculation)
    data = rand(size)
    c.put_object(Bucket=bucket, Key=key, Body=data)
    return data, c.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")


def test_default_when_supported_sends_and_stores_crc32(target, bucket):
    data, h = _put_with_sdk_default(target, bucket, "when_supported", "dflt", 5000)
    assert h["ChecksumCRC32"] == b64sum("CRC32", data)


def test_no_checksum_gets_crc64nvme(target, bucket):
    data, h = _put_with_sdk_default(target, bucket, "when_required", "none", 4321)
    assert h["ChecksumCRC64NVME"] == b64sum("CRC64NVME", data)
    assert h["ChecksumType"] == "FULL_OBJECT"


@pytest.mark.parametrize("alg", ALL)
def test_wrong_checksum_is_bad_digest_and_stores_nothing(s3, bucket, alg):
    s3.put_object(Bucket=bucket, Key="kept", Body=b"old")
    wrong = b64sum(alg, b"something else")
    for key in ("kept", "new"):
        with pytest.raises(ClientError) as e:
            s3.put_object(Bucket=bucket, Key=key, Body=b"the body", **{field(alg): wrong})
        assert_client_error(e, "BadDigest", 400)
    assert s3.get_object(Bucket=bucket, Key="kept")["Body"].read() == b"old"
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="new")
    assert_client_error(e, ("404", "NoSuchKey"), 404)


@pytest.mark.parametrize("value", ["not-base64!", "AAAA", "AAAAAAAAAAA="])
def test_malformed_checksum_is_invalid_request(s3, bucket, value):
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="bad", Body=b"x", ChecksumCRC32=value)
    assert_client_error(e, "InvalidRequest", 400)


def _upload(s3, bucket, key, alg, parts, **create):
    up = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm=alg, **create)
    uid = up["UploadId"]
    done = []
    for n, p in enumerate(parts, 1):
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=n, Body=p, **put_kwargs(alg, p))
        assert r[field(alg)] == b64sum(alg, p)
        done.append({"PartNumber": n, "ETag": r["ETag"], field(alg): r[field(alg)]})
    return up, uid, done


@pytest.mark.parametrize("alg", ["CRC32", "SHA256", "CRC32C"])
def test_multipart_composite(s3, bucket, alg):
    parts = [rand(5 * MiB), rand(1000)]
    up, uid, done = _upload(s3, bucket, "comp", alg, parts)
    assert up["ChecksumAlgorithm"] == alg and up["ChecksumType"] == "COMPOSITE"
    lp = s3.list_parts(Bucket=bucket, Key="comp", UploadId=uid)
    assert lp["ChecksumAlgorithm"] == alg and lp["ChecksumType"] == "COMPOSITE"
    assert [p[field(alg)] for p in lp["Parts"]] == [b64sum(alg, p) for p in parts]
    # Every part's checksum must be listed on Complete.
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="comp",
            UploadId=uid,
            MultipartUpload={"Parts": [{k: v for k, v in d.items() if k != field(alg)} for d in done]},
        )
    assert_client_error(e, "InvalidRequest", 400)
    bad = [dict(done[0], **{field(alg): b64sum(alg, b"x")}), done[1]]
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="comp", UploadId=uid, MultipartUpload={"Parts": bad})
    assert_client_error(e, "InvalidPart", 400)
    r = s3.complete_multipart_upload(Bucket=bucket, Key="comp", UploadId=uid, MultipartUpload={"Parts": done})
    composite = base64.b64encode(raw_sum(alg, b"".join(raw_sum(alg, p) for p in parts))).decode()
    assert r[field(alg)] == f"{composite}-2"
    assert r["ChecksumType"] == "COMPOSITE"
    g = s3.get_object(Bucket=bucket, Key="comp", ChecksumMode="ENABLED")
    assert g[field(alg)] == f"{composite}-2" and g["ChecksumType"] == "COMPOSITE"
    assert g["Body"].read() == b"".join(parts)
    a = s3.get_object_attributes(
        Bucket=bucket, Key="comp", ObjectAttributes=["ETag", "Checksum", "ObjectParts", "ObjectSize", "StorageClass"]
    )
    # With its "-2", as Complete and HeadObject give it.
    assert a["Checksum"][field(alg)] == f"{composite}-2"
    assert a["Checksum"]["ChecksumType"] == "COMPOSITE"
    assert a["ObjectSize"] == 5 * MiB + 1000
    assert a["StorageClass"] == "STANDARD"
    assert a["ETag"].strip('"').endswith("-2")
    op = a["ObjectParts"]
    assert op["TotalPartsCount"] == 2
    assert [(p["PartNumber"], p["Size"], p[field(alg)]) for p in op["Parts"]] == [
        (1, 5 * MiB, b64sum(alg, parts[0])),
        (2, 1000, b64sum(alg, parts[1])),
    ]
    check_part_reads(s3, bucket, "comp", alg, parts, "COMPOSITE")


def check_part_reads(s3, bucket, key, alg, parts, ctype):
    """GetObject and HeadObject with PartNumber: with ChecksumMode=ENABLED,
    the part's checksum and the upload's ChecksumType (as AWS answers part
    requests); without it, neither."""
    for n, p in enumerate(parts, 1):
        h = s3.head_object(Bucket=bucket, Key=key, PartNumber=n, ChecksumMode="ENABLED")
        assert h[field(alg)] == b64sum(alg, p), n
        assert h["ChecksumType"] == ctype
        assert h["ContentLength"] == len(p) and h["PartsCount"] == len(parts)
        g = s3.get_object(Bucket=bucket, Key=key, PartNumber=n, ChecksumMode="ENABLED")
        assert g[field(alg)] == b64sum(alg, p), n
        assert g["ChecksumType"] == ctype
        assert g["Body"].read() == p
        plain = s3.head_object(Bucket=bucket, Key=key, PartNumber=n)
        assert field(alg) not in plain and "ChecksumType" not in plain


@pytest.mark.parametrize("alg", ["CRC64NVME", "CRC32"])
def test_multipart_full_object(s3, bucket, alg):
    parts = [rand(5 * MiB), rand(5 * MiB + 3), rand(10)]
    whole = b"".join(parts)
    up, uid, done = _upload(s3, bucket, "full", alg, parts, ChecksumType="FULL_OBJECT")
    assert up["ChecksumType"] == "FULL_OBJECT"
    want = b64sum(alg, whole)
    # A wrong full-object value on Complete: BadDigest, nothing published.
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="full",
            UploadId=uid,
            ChecksumType="FULL_OBJECT",
            MultipartUpload={"Parts": done},
            **{field(alg): b64sum(alg, b"x")},
        )
    assert_client_error(e, "BadDigest", 400)
    r = s3.complete_multipart_upload(
        Bucket=bucket,
        Key="full",
        UploadId=uid,
        ChecksumType="FULL_OBJECT",
        MultipartUpload={"Parts": done},
        **{field(alg): want},
    )
    assert r[field(alg)] == want and r["ChecksumType"] == "FULL_OBJECT"
    g = s3.get_object(Bucket=bucket, Key="full", ChecksumMode="ENABLED")
    assert g[field(alg)] == want and g["ChecksumType"] == "FULL_OBJECT"
    assert g["Body"].read() == whole
    a = s3.get_object_attributes(Bucket=bucket, Key="full", ObjectAttributes=["Checksum", "ObjectParts"], MaxParts=2)
    assert a["Checksum"][field(alg)] == want
    assert a["ObjectParts"]["TotalPartsCount"] == 3
    assert a["ObjectParts"]["IsTruncated"] is True
    assert len(a["ObjectParts"]["Parts"]) == 2
    check_part_reads(s3, bucket, "full", alg, parts, "FULL_OBJECT")


@pytest.mark.parametrize(
    "alg,ctype", [("CRC64NVME", "COMPOSITE"), ("SHA256", "FULL_OBJECT"), ("SHA1", "FULL_OBJECT")]
)
def test_multipart_refused_combinations(s3, bucket, alg, ctype):
    with pytest.raises(ClientError) as e:
        s3.create_multipart_upload(Bucket=bucket, Key="x", ChecksumAlgorithm=alg, ChecksumType=ctype)
    assert_client_error(e, "InvalidRequest", 400)


def test_part_without_the_uploads_checksum_is_refused(target, bucket):
    c = target.client("alice", request_checksum_calculation="when_required")
    uid = c.create_multipart_upload(Bucket=bucket, Key="p", ChecksumAlgorithm="SHA256")["UploadId"]
    with pytest.raises(ClientError) as e:
        c.upload_part(Bucket=bucket, Key="p", UploadId=uid, PartNumber=1, Body=b"part")
    assert_client_error(e, "InvalidRequest", 400)
    with pytest.raises(ClientError) as e:
        c.upload_part(Bucket=bucket, Key="p", UploadId=uid, PartNumber=1, Body=b"part", ChecksumAlgorithm="CRC32")
    assert_client_error(e, "InvalidRequest", 400)
    assert c.list_parts(Bucket=bucket, Key="p", UploadId=uid).get("Parts", []) == []


def test_copy_keeps_or_computes_checksum(s3, bucket):
    data = rand(200_000)
    s3.put_object(Bucket=bucket, Key="src", Body=data, ChecksumAlgorithm="SHA1")
    r = s3.copy_object(Bucket=bucket, Key="same", CopySource={"Bucket": bucket, "Key": "src"})
    assert r["CopyObjectResult"]["ChecksumSHA1"] == b64sum("SHA1", data)
    r = s3.copy_object(
        Bucket=bucket, Key="crc", CopySource={"Bucket": bucket, "Key": "src"}, ChecksumAlgorithm="CRC32"
    )
    assert r["CopyObjectResult"]["ChecksumCRC32"] == b64sum("CRC32", data)
    h = s3.head_object(Bucket=bucket, Key="crc", ChecksumMode="ENABLED")
    assert h["ChecksumCRC32"] == b64sum("CRC32", data)
    assert "ChecksumSHA1" not in h


def test_get_object_attributes_single_part(s3, bucket):
    data = rand(777)
    s3.put_object(Bucket=bucket, Key="one", Body=data, ChecksumAlgorithm="SHA256")
    a = s3.get_object_attributes(Bucket=bucket, Key="one", ObjectAttributes=["ObjectSize", "Checksum", "ObjectParts"])
    assert a["ObjectSize"] == 777
    assert a["Checksum"]["ChecksumSHA256"] == b64sum("SHA256", data)
    assert "ObjectParts" not in a and "ETag" not in a
    with pytest.raises(ClientError) as e:
        s3.get_object_attributes(Bucket=bucket, Key="missing", ObjectAttributes=["ETag"])
    assert_client_error(e, "NoSuchKey", 404)


def test_aws_cli_put_object_checksum_algorithm(target, bucket, tmp_path):
    # The CLI fixture lives in test_awscli.py; this uses its class directly.
    from test_awscli import AwsCli

    aws = AwsCli(target, tmp_path / "cli")
    data = rand(70_000)
    f = tmp_path / "body"
    f.write_bytes(data)
    out = aws("s3api", "put-object", "--bucket", bucket, "--key", "cli", "--body", str(f), "--checksum-algorithm", "SHA256").json
    assert out["ChecksumSHA256"] == b64sum("SHA256", data)
    out = aws("s3api", "head-object", "--bucket", bucket, "--key", "cli", "--checksum-mode", "ENABLED").json
    assert out["ChecksumSHA256"] == b64sum("SHA256", data)
    out = aws(
        "s3api", "get-object-attributes", "--bucket", bucket, "--key", "cli", "--object-attributes", "Checksum", "ObjectSize"
    ).json
    assert out["Checksum"]["ChecksumSHA256"] == b64sum("SHA256", data)
    assert out["ObjectSize"] == len(data)
