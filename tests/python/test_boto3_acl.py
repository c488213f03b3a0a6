"""Bucket and object ownership and ACLs through boto3, with two users that
have no configured grants (erin, frank), anonymous requests and the
operators' config grants (alice ``*``, bob ``bob-*``, carol read and dave
write on ``shared``).

AWS semantics: a bucket belongs to its creator and an object to its writer;
owners have FULL_CONTROL; canned ACLs and explicit grants (headers or an
AccessControlPolicy body) give exactly the permission they name; the owner
of a bucket may delete, but not read, objects others wrote into it."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from conftest import ALL_USERS, AUTHENTICATED_USERS, canonical_id, owner
from s3util import assert_client_error, unique_bucket

E, F = canonical_id("erin"), canonical_id("frank")
UNKNOWN_ID = "0123456789abcdef" * 4  # well formed, nobody's
FC, READ, WRITE, READ_ACP, WRITE_ACP = "FULL_CONTROL", "READ", "WRITE", "READ_ACP", "WRITE_ACP"


def gid(cid: str) -> str:
    return f'id="{cid}"'


def guri(uri: str) -> str:
    return f'uri="{uri}"'


def grants(acl: dict) -> set[tuple[str, str]]:
    """{(canonical id or group URI, permission)}; checks each grantee's shape."""
    out = set()
    for g in acl["Grants"]:
        ge = g["Grantee"]
        if ge["Type"] == "CanonicalUser":
            name = next((u for u in ("erin", "frank", "alice") if canonical_id(u) == ge["ID"]), None)
            if name:
                assert ge.get("DisplayName") == owner(name)["DisplayName"], g
            out.add((ge["ID"], g["Permission"]))
        else:
            assert ge["Type"] == "Group", g
            out.add((ge["URI"], g["Permission"]))
    return out


def allowed(call) -> bool:
    """True if ``call`` succeeds, False on 403 AccessDenied; anything else fails."""
    try:
        call()
        return True
    except ClientError as e:
        assert_client_error(e, ("AccessDenied", "403"), 403)
        return False


def check(cases: dict) -> None:
    """``{label: (call, expected allowed)}``: every mismatch in one report."""
    wrong = []
    for label, (call, want) in cases.items():
        try:
            got = allowed(call)
        except AssertionError as e:
            wrong.append(f"{label}: {e}")
            continue
        if got != want:
            wrong.append(f"{label}: {'allowed' if got else 'denied'}, want {'allowed' if want else 'denied'}")
    assert not wrong, "\n".join(wrong)


def body(client, bucket, key) -> bytes:
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


@pytest.fixture
def erin(target):
    return target.client("erin")


@pytest.fixture
def frank(target):
    return target.client("frank")


# --------------------------------------------------------------------------
# owners
# --------------------------------------------------------------------------


def test_buckets_belong_to_their_creator(target, erin, frank, s3, bucket_factory):
    eb, fb = bucket_factory("own", "erin"), bucket_factory("own", "frank")
    for client, name, mine in ((erin, "erin", eb), (frank, "frank", fb)):
        r = client.list_buckets()
        assert [b["Name"] for b in r["Buckets"]] == [mine], f"{name} lists exactly what {name} owns"
        assert r["Owner"] == owner(name)
        acl = client.get_bucket_acl(Bucket=mine)
        assert acl["Owner"] == owner(name)
        assert grants(acl) == {(canonical_id(name), FC)}, "a private bucket: the owner's FULL_CONTROL only"
    # alice's `*` grant lets her in, but she owns neither
    listed = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert eb not in listed and fb not in listed
    assert s3.list_buckets()["Owner"] == owner("alice")


def test_create_own_bucket_again_keeps_it(target, erin, frank, s3, bucket_factory):
    eb = bucket_factory("again", "erin")
    erin.put_object(Bucket=eb, Key="k", Body=b"kept")
    erin.put_bucket_acl(Bucket=eb, ACL="public-read")
    # us-east-1: 200, and nothing changes (the ACL stays public-read)
    for kw in ({}, {"ACL": "private"}):
        erin.create_bucket(Bucket=eb, **kw)
    for other in (frank, s3):
        with pytest.raises(ClientError) as e:
            other.create_bucket(Bucket=eb)
        assert_client_error(e, "BucketAlreadyExists", 409)
    assert body(erin, eb, "k") == b"kept"
    acl = erin.get_bucket_acl(Bucket=eb)
    assert acl["Owner"] == owner("erin")
    assert grants(acl) == {(E, FC), (ALL_USERS, READ)}


def test_users_without_grants_are_isolated(target, erin, frank, bucket_factory):
    eb, fb = bucket_factory("iso", "erin"), bucket_factory("iso", "frank")
    erin.put_object(Bucket=eb, Key="e", Body=b"erin's")
    frank.put_object(Bucket=fb, Key="f", Body=b"frank's")
    uid = erin.create_multipart_upload(Bucket=eb, Key="mp")["UploadId"]
    for c, b, k, own_b, own_k in ((frank, eb, "e", fb, "f"), (erin, fb, "f", eb, "e")):
        check(
            {
                "HeadBucket": (lambda: c.head_bucket(Bucket=b), False),
                "ListObjects": (lambda: c.list_objects(Bucket=b), False),
                "ListObjectsV2": (lambda: c.list_objects_v2(Bucket=b), False),
                "ListObjectVersions": (lambda: c.list_object_versions(Bucket=b), False),
                "ListMultipartUploads": (lambda: c.list_multipart_uploads(Bucket=b), False),
                "GetBucketLocation": (lambda: c.get_bucket_location(Bucket=b), False),
                "GetBucketAcl": (lambda: c.get_bucket_acl(Bucket=b), False),
                "PutBucketAcl": (lambda: c.put_bucket_acl(Bucket=b, ACL="public-read"), False),
                "DeleteBucket": (lambda: c.delete_bucket(Bucket=b), False),
                "GetObject": (lambda: c.get_object(Bucket=b, Key=k), False),
                "HeadObject": (lambda: c.head_object(Bucket=b, Key=k), False),
                "HeadObject missing": (lambda: c.head_object(Bucket=b, Key="missing"), False),
                "GetObject missing": (lambda: c.get_object(Bucket=b, Key="missing"), False),
                "GetObjectAcl": (lambda: c.get_object_acl(Bucket=b, Key=k), False),
                "PutObjectAcl": (lambda: c.put_object_acl(Bucket=b, Key=k, ACL="public-read"), False),
                "PutObject": (lambda: c.put_object(Bucket=b, Key="new", Body=b"x"), False),
                "PutObject overwrite": (lambda: c.put_object(Bucket=b, Key=k, Body=b"x"), False),
                "DeleteObject": (lambda: c.delete_object(Bucket=b, Key=k), False),
                "CreateMultipartUpload": (lambda: c.create_multipart_upload(Bucket=b, Key="m"), False),
                "CopyObject out": (
                    lambda: c.copy_object(Bucket=own_b, Key="stolen", CopySource={"Bucket": b, "Key": k}),
                    False,
                ),
                "CopyObject in": (
                    lambda: c.copy_object(Bucket=b, Key="planted", CopySource={"Bucket": own_b, "Key": own_k}),
                    False,
                ),
            }
        )
    check(
        {
            "UploadPart": (lambda: frank.upload_part(Bucket=eb, Key="mp", UploadId=uid, PartNumber=1, Body=b"x"), False),
            "ListParts": (lambda: frank.list_parts(Bucket=eb, Key="mp", UploadId=uid), False),
            "AbortMultipartUpload": (lambda: frank.abort_multipart_upload(Bucket=eb, Key="mp", UploadId=uid), False),
        }
    )
    try:
        r = frank.delete_objects(Bucket=eb, Delete={"Objects": [{"Key": "e"}]})
        assert not r.get("Deleted") and [(x["Key"], x["Code"]) for x in r["Errors"]] == [("e", "AccessDenied")], r
    except ClientError as e:
        assert_client_error(e, "AccessDenied", 403)
    # nothing changed, and the owners still see the truth
    assert body(erin, eb, "e") == b"erin's" and body(frank, fb, "f") == b"frank's"
    assert [o["Key"] for o in erin.list_objects_v2(Bucket=eb)["Contents"]] == ["e"]
    assert [o["Key"] for o in frank.list_objects_v2(Bucket=fb)["Contents"]] == ["f"]
    assert grants(erin.get_bucket_acl(Bucket=eb)) == {(E, FC)}
    assert grants(erin.get_object_acl(Bucket=eb, Key="e")) == {(E, FC)}
    assert [u["UploadId"] for u in erin.list_multipart_uploads(Bucket=eb)["Uploads"]] == [uid]
    erin.abort_multipart_upload(Bucket=eb, Key="mp", UploadId=uid)
    # a missing key is 404 only for whoever may list the bucket
    with pytest.raises(ClientError) as e:
        erin.head_object(Bucket=eb, Key="missing")
    assert_client_error(e, ("404", "NoSuchKey"), 404)


def test_object_owner_is_the_writer(target, erin, frank, bucket_factory):
    eb = bucket_factory("writer", "erin")
    erin.put_bucket_acl(Bucket=eb, GrantFullControl=gid(E), GrantWrite=gid(F))
    frank.put_object(Bucket=eb, Key="put", Body=b"p")
    uid = frank.create_multipart_upload(Bucket=eb, Key="mp")["UploadId"]
    e1 = frank.upload_part(Bucket=eb, Key="mp", UploadId=uid, PartNumber=1, Body=b"m")["ETag"]
    frank.complete_multipart_upload(
        Bucket=eb, Key="mp", UploadId=uid, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}]}
    )
    frank.copy_object(Bucket=eb, Key="copy", CopySource={"Bucket": eb, "Key": "put"})
    erin.put_object(Bucket=eb, Key="erins", Body=b"e")
    for key, who in (("put", "frank"), ("mp", "frank"), ("copy", "frank"), ("erins", "erin")):
        client = frank if who == "frank" else erin
        acl = client.get_object_acl(Bucket=eb, Key=key)
        assert acl["Owner"] == owner(who), key
        assert grants(acl) == {(canonical_id(who), FC)}, key
    listed = erin.list_objects_v2(Bucket=eb, FetchOwner=True)["Contents"]
    assert {o["Key"]: o["Owner"]["ID"] for o in listed} == {"put": F, "mp": F, "copy": F, "erins": E}


def test_bucket_owner_deletes_but_does_not_read_others_objects(target, erin, frank, bucket_factory):
    eb = bucket_factory("foreign", "erin")
    erin.put_bucket_acl(Bucket=eb, GrantFullControl=gid(E), GrantWrite=gid(F))
    frank.put_object(Bucket=eb, Key="plain", Body=b"frank's")
    frank.put_object(Bucket=eb, Key="bor", Body=b"bor", ACL="bucket-owner-read")
    frank.put_object(Bucket=eb, Key="bofc", Body=b"bofc", ACL="bucket-owner-full-control")
    check(
        {
            "GetObject plain": (lambda: erin.get_object(Bucket=eb, Key="plain"), False),
            "HeadObject plain": (lambda: erin.head_object(Bucket=eb, Key="plain"), False),
            "GetObjectAcl plain": (lambda: erin.get_object_acl(Bucket=eb, Key="plain"), False),
            "GetObject bucket-owner-read": (lambda: erin.get_object(Bucket=eb, Key="bor"), True),
            "GetObjectAcl bucket-owner-read": (lambda: erin.get_object_acl(Bucket=eb, Key="bor"), False),
            "GetObject bucket-owner-full-control": (lambda: erin.get_object(Bucket=eb, Key="bofc"), True),
            "GetObjectAcl bucket-owner-full-control": (lambda: erin.get_object_acl(Bucket=eb, Key="bofc"), True),
            "PutObjectAcl bucket-owner-full-control": (
                lambda: erin.put_object_acl(Bucket=eb, Key="bofc", ACL="public-read"),
                True,
            ),
        }
    )
    assert sorted(o["Key"] for o in erin.list_objects_v2(Bucket=eb)["Contents"]) == ["bofc", "bor", "plain"]
    erin.delete_object(Bucket=eb, Key="plain")
    assert sorted(o["Key"] for o in erin.list_objects_v2(Bucket=eb)["Contents"]) == ["bofc", "bor"]


# --------------------------------------------------------------------------
# canned ACLs
# --------------------------------------------------------------------------

BUCKET_CANNED = {
    "private": set(),
    "public-read": {(ALL_USERS, READ)},
    "public-read-write": {(ALL_USERS, READ), (ALL_USERS, WRITE)},
    "authenticated-read": {(AUTHENTICATED_USERS, READ)},
}


@pytest.mark.parametrize("canned", list(BUCKET_CANNED))
def test_canned_bucket_acl(target, erin, frank, anon, bucket_factory, canned):
    eb = bucket_factory("canned", "erin", ACL=canned)
    want = {(E, FC)} | BUCKET_CANNED[canned]
    assert grants(erin.get_bucket_acl(Bucket=eb)) == want
    erin.put_object(Bucket=eb, Key="private-object", Body=b"p")
    anon_read = (ALL_USERS, READ) in want
    auth_read = anon_read or (AUTHENTICATED_USERS, READ) in want
    anon_write = (ALL_USERS, WRITE) in want
    check(
        {
            "anonymous ListObjectsV2": (lambda: anon.list_objects_v2(Bucket=eb), anon_read),
            "anonymous ListObjects": (lambda: anon.list_objects(Bucket=eb), anon_read),
            "anonymous HeadBucket": (lambda: anon.head_bucket(Bucket=eb), anon_read),
            "frank ListObjectsV2": (lambda: frank.list_objects_v2(Bucket=eb), auth_read),
            "frank ListMultipartUploads": (lambda: frank.list_multipart_uploads(Bucket=eb), auth_read),
            "anonymous PutObject": (lambda: anon.put_object(Bucket=eb, Key="anon", Body=b"a"), anon_write),
            "frank PutObject": (lambda: frank.put_object(Bucket=eb, Key="frank", Body=b"f"), anon_write),
            # bucket READ is no object READ
            "anonymous GetObject": (lambda: anon.get_object(Bucket=eb, Key="private-object"), False),
            "frank GetObject": (lambda: frank.get_object(Bucket=eb, Key="private-object"), False),
            "anonymous GetBucketAcl": (lambda: anon.get_bucket_acl(Bucket=eb), False),
            "frank PutBucketAcl": (lambda: frank.put_bucket_acl(Bucket=eb, ACL="private"), False),
            "anonymous DeleteBucket": (lambda: anon.delete_bucket(Bucket=eb), False),
        }
    )
    # a missing key: 404 with bucket READ, else 403
    with pytest.raises(ClientError) as e:
        anon.head_object(Bucket=eb, Key="missing")
    assert_client_error(e, ("404", "NoSuchKey") if anon_read else ("403", "AccessDenied"), 404 if anon_read else 403)
    # PutBucketAcl: revoking takes the access away, the canned ACL gives it back
    erin.put_bucket_acl(Bucket=eb, ACL="private")
    assert grants(erin.get_bucket_acl(Bucket=eb)) == {(E, FC)}
    check(
        {
            "anonymous ListObjectsV2 after private": (lambda: anon.list_objects_v2(Bucket=eb), False),
            "frank ListObjectsV2 after private": (lambda: frank.list_objects_v2(Bucket=eb), False),
            "frank PutObject after private": (lambda: frank.put_object(Bucket=eb, Key="f2", Body=b"f"), False),
        }
    )
    erin.put_bucket_acl(Bucket=eb, ACL=canned)
    assert grants(erin.get_bucket_acl(Bucket=eb)) == want
    assert allowed(lambda: frank.list_objects_v2(Bucket=eb)) == auth_read


OBJECT_CANNED = {
    "private": set(),
    "public-read": {(ALL_USERS, READ)},
    "public-read-write": {(ALL_USERS, READ), (ALL_USERS, WRITE)},
    "authenticated-read": {(AUTHENTICATED_USERS, READ)},
    "bucket-owner-read": {(E, READ)},
    "bucket-owner-full-control": {(E, FC)},
}


@pytest.mark.parametrize("canned", list(OBJECT_CANNED))
def test_canned_object_acl(target, erin, frank, anon, s3, bucket_factory, canned):
    """frank writes into erin's bucket (frank has WRITE on it) with a canned ACL."""
    eb = bucket_factory("ocanned", "erin")
    erin.put_bucket_acl(Bucket=eb, GrantFullControl=gid(E), GrantWrite=gid(F))
    frank.put_object(Bucket=eb, Key="k", Body=b"object", ACL=canned)
    want = {(F, FC)} | OBJECT_CANNED[canned]
    acl = frank.get_object_acl(Bucket=eb, Key="k")
    assert acl["Owner"] == owner("frank")
    assert grants(acl) == want
    anon_read = (ALL_USERS, READ) in want
    erin_read = bool({(E, READ), (E, FC), (ALL_USERS, READ), (AUTHENTICATED_USERS, READ)} & want)
    check(
        {
            "anonymous GetObject": (lambda: anon.get_object(Bucket=eb, Key="k"), anon_read),
            "anonymous HeadObject": (lambda: anon.head_object(Bucket=eb, Key="k"), anon_read),
            "erin GetObject": (lambda: erin.get_object(Bucket=eb, Key="k"), erin_read),
            "erin GetObjectAcl": (lambda: erin.get_object_acl(Bucket=eb, Key="k"), (E, FC) in want),
            "anonymous GetObjectAcl": (lambda: anon.get_object_acl(Bucket=eb, Key="k"), False),
            # the operator's `*` read-write grant is FULL_CONTROL on every object
            "alice GetObject": (lambda: s3.get_object(Bucket=eb, Key="k"), True),
            "alice GetObjectAcl": (lambda: s3.get_object_acl(Bucket=eb, Key="k"), True),
        }
    )
    frank.put_object_acl(Bucket=eb, Key="k", ACL="private")
    assert grants(frank.get_object_acl(Bucket=eb, Key="k")) == {(F, FC)}
    assert not allowed(lambda: anon.get_object(Bucket=eb, Key="k"))
    assert not allowed(lambda: erin.get_object(Bucket=eb, Key="k"))
    frank.put_object_acl(Bucket=eb, Key="k", ACL=canned)
    assert grants(frank.get_object_acl(Bucket=eb, Key="k")) == want


def test_canned_acl_on_multipart_and_copy(target, erin, anon, bucket_factory):
    eb = bucket_factory("mpacl", "erin")
    uid = erin.create_multipart_upload(Bucket=eb, Key="mp", ACL="public-read")["UploadId"]
    e1 = erin.upload_part(Bucket=eb, Key="mp", UploadId=uid, PartNumber=1, Body=b"multipart")["ETag"]
    erin.complete_multipart_upload(
        Bucket=eb, Key="mp", UploadId=uid, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}]}
    )
    assert body(anon, eb, "mp") == b"multipart"
    assert grants(erin.get_object_acl(Bucket=eb, Key="mp")) == {(E, FC), (ALL_USERS, READ)}
    erin.copy_object(Bucket=eb, Key="copy-private", CopySource={"Bucket": eb, "Key": "mp"})
    erin.copy_object(Bucket=eb, Key="copy-public", CopySource={"Bucket": eb, "Key": "mp"}, ACL="public-read")
    assert not allowed(lambda: anon.get_object(Bucket=eb, Key="copy-private")), "a copy does not copy the ACL"
    assert body(anon, eb, "copy-public") == b"multipart"


# --------------------------------------------------------------------------
# explicit grants
# --------------------------------------------------------------------------


def test_bucket_grants_give_exactly_the_permission(target, erin, frank, bucket_factory):
    eb = bucket_factory("grant", "erin")
    erin.put_object(Bucket=eb, Key="k", Body=b"erin's")
    erin.put_bucket_acl(Bucket=eb, GrantFullControl=gid(E), GrantRead=gid(F))
    acl = erin.get_bucket_acl(Bucket=eb)
    assert grants(acl) == {(E, FC), (F, READ)}
    assert {g["Grantee"]["ID"]: g["Grantee"]["DisplayName"] for g in acl["Grants"]} == {E: "Erin", F: F}
    check(
        {
            "READ: ListObjectsV2": (lambda: frank.list_objects_v2(Bucket=eb), True),
            "READ: ListObjects": (lambda: frank.list_objects(Bucket=eb), True),
            "READ: HeadBucket": (lambda: frank.head_bucket(Bucket=eb), True),
            "READ: GetBucketLocation": (lambda: frank.get_bucket_location(Bucket=eb), True),
            "READ: ListMultipartUploads": (lambda: frank.list_multipart_uploads(Bucket=eb), True),
            "READ: ListObjectVersions": (lambda: frank.list_object_versions(Bucket=eb), True),
            "READ: GetObject (object is private)": (lambda: frank.get_object(Bucket=eb, Key="k"), False),
            "READ: PutObject": (lambda: frank.put_object(Bucket=eb, Key="f", Body=b"f"), False),
            "READ: GetBucketAcl": (lambda: frank.get_bucket_acl(Bucket=eb), False),
        }
    )
    with pytest.raises(ClientError) as e:  # bucket READ: a missing key is 404
        frank.head_object(Bucket=eb, Key="missing")
    assert_client_error(e, ("404", "NoSuchKey"), 404)

    erin.put_bucket_acl(Bucket=eb, GrantFullControl=gid(E), GrantWrite=gid(F))
    assert grants(erin.get_bucket_acl(Bucket=eb)) == {(E, FC), (F, WRITE)}
    frank.put_object(Bucket=eb, Key="f", Body=b"frank's")
    uid = frank.create_multipart_upload(Bucket=eb, Key="fmp")["UploadId"]
    e1 = frank.upload_part(Bucket=eb, Key="fmp", UploadId=uid, PartNumber=1, Body=b"part")["ETag"]
    frank.complete_multipart_upload(
        Bucket=eb, Key="fmp", UploadId=uid, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}]}
    )
    uid = frank.create_multipart_upload(Bucket=eb, Key="gone")["UploadId"]
    frank.abort_multipart_upload(Bucket=eb, Key="gone", UploadId=uid)
    frank.delete_object(Bucket=eb, Key="fmp")
    check(
        {
            "WRITE: ListObjectsV2": (lambda: frank.list_objects_v2(Bucket=eb), False),
            "WRITE: GetObject of erin's": (lambda: frank.get_object(Bucket=eb, Key="k"), False),
            "WRITE: DeleteBucket": (lambda: frank.delete_bucket(Bucket=eb), False),
            "WRITE: PutBucketAcl": (lambda: frank.put_bucket_acl(Bucket=eb, ACL="public-read"), False),
        }
    )
    assert sorted(o["Key"] for o in erin.list_objects_v2(Bucket=eb)["Contents"]) == ["f", "k"]

    erin.put_bucket_acl(Bucket=eb, ACL="private")  # revoke
    check(
        {
            "revoked: PutObject": (lambda: frank.put_object(Bucket=eb, Key="f2", Body=b"f"), False),
            "revoked: DeleteObject": (lambda: frank.delete_object(Bucket=eb, Key="f"), False),
            "revoked: ListObjectsV2": (lambda: frank.list_objects_v2(Bucket=eb), False),
            "revoked: his own object is still his": (lambda: frank.get_object(Bucket=eb, Key="f"), True),
        }
    )


def test_acp_grants(target, erin, frank, anon, bucket_factory):
    eb = bucket_factory("acp", "erin")
    erin.put_object(Bucket=eb, Key="k", Body=b"erin's")
    erin.put_object_acl(Bucket=eb, Key="k", GrantFullControl=gid(E), GrantReadACP=gid(F))
    assert grants(frank.get_object_acl(Bucket=eb, Key="k")) == {(E, FC), (F, READ_ACP)}
    check(
        {
            "READ_ACP: GetObject": (lambda: frank.get_object(Bucket=eb, Key="k"), False),
            "READ_ACP: PutObjectAcl": (lambda: frank.put_object_acl(Bucket=eb, Key="k", ACL="public-read"), False),
        }
    )
    erin.put_object_acl(Bucket=eb, Key="k", GrantFullControl=gid(E), GrantWriteACP=gid(F))
    assert not allowed(lambda: frank.get_object_acl(Bucket=eb, Key="k"))
    frank.put_object_acl(Bucket=eb, Key="k", ACL="public-read")  # WRITE_ACP
    assert grants(erin.get_object_acl(Bucket=eb, Key="k")) == {(E, FC), (ALL_USERS, READ)}
    assert erin.get_object_acl(Bucket=eb, Key="k")["Owner"] == owner("erin"), "WRITE_ACP does not change the owner"
    assert body(anon, eb, "k") == b"erin's"
    assert not allowed(lambda: frank.put_object_acl(Bucket=eb, Key="k", ACL="private")), "his grant went with the old ACL"

    erin.put_bucket_acl(Bucket=eb, GrantFullControl=gid(E), GrantReadACP=gid(F))
    assert grants(frank.get_bucket_acl(Bucket=eb)) == {(E, FC), (F, READ_ACP)}
    check(
        {
            "bucket READ_ACP: ListObjectsV2": (lambda: frank.list_objects_v2(Bucket=eb), False),
            "bucket READ_ACP: PutBucketAcl": (lambda: frank.put_bucket_acl(Bucket=eb, ACL="public-read"), False),
        }
    )
    erin.put_bucket_acl(Bucket=eb, GrantFullControl=gid(E), GrantWriteACP=gid(F))
    frank.put_bucket_acl(Bucket=eb, ACL="public-read")
    acl = erin.get_bucket_acl(Bucket=eb)
    assert acl["Owner"] == owner("erin") and grants(acl) == {(E, FC), (ALL_USERS, READ)}
    assert allowed(lambda: anon.list_objects_v2(Bucket=eb))


def test_full_control_grant_on_object(target, erin, frank, bucket_factory):
    eb = bucket_factory("fc", "erin")
    erin.put_object(Bucket=eb, Key="k", Body=b"shared with frank", GrantFullControl=gid(F))
    acl = frank.get_object_acl(Bucket=eb, Key="k")
    assert acl["Owner"] == owner("erin") and grants(acl) == {(F, FC)}
    assert body(frank, eb, "k") == b"shared with frank"
    assert body(erin, eb, "k") == b"shared with frank", "the owner keeps FULL_CONTROL implicitly"
    check(
        {
            # deleting is a bucket permission
            "DeleteObject": (lambda: frank.delete_object(Bucket=eb, Key="k"), False),
            "PutObject over it": (lambda: frank.put_object(Bucket=eb, Key="k", Body=b"x"), False),
            "PutObjectAcl": (lambda: frank.put_object_acl(Bucket=eb, Key="k", GrantRead=gid(E) + ", " + gid(F)), True),
        }
    )
    assert grants(erin.get_object_acl(Bucket=eb, Key="k")) == {(E, READ), (F, READ)}


def test_grant_headers_with_groups_and_lists(target, erin, frank, anon, bucket_factory):
    eb = bucket_factory("groups", "erin", GrantRead=guri(AUTHENTICATED_USERS), GrantFullControl=gid(E))
    assert grants(erin.get_bucket_acl(Bucket=eb)) == {(E, FC), (AUTHENTICATED_USERS, READ)}
    assert allowed(lambda: frank.list_objects_v2(Bucket=eb))
    assert not allowed(lambda: anon.list_objects_v2(Bucket=eb))
    erin.put_object(
        Bucket=eb, Key="k", Body=b"listed", GrantRead=f"{guri(ALL_USERS)}, {gid(F)}", GrantFullControl=gid(E)
    )
    acl = erin.get_object_acl(Bucket=eb, Key="k")
    assert grants(acl) == {(E, FC), (ALL_USERS, READ), (F, READ)}
    assert any(g["Grantee"] == {"Type": "Group", "URI": ALL_USERS} for g in acl["Grants"]), acl["Grants"]
    assert body(anon, eb, "k") == b"listed"
    anon.head_object(Bucket=eb, Key="k")


def test_access_control_policy_body(target, erin, frank, anon, bucket_factory):
    eb = bucket_factory("acp-body", "erin")
    erin.put_object(Bucket=eb, Key="k", Body=b"policy")
    policy = {
        "Owner": {"ID": E},
        "Grants": [
            {"Grantee": {"Type": "CanonicalUser", "ID": E}, "Permission": FC},
            {"Grantee": {"Type": "CanonicalUser", "ID": F}, "Permission": READ},
            {"Grantee": {"Type": "Group", "URI": ALL_USERS}, "Permission": READ_ACP},
        ],
    }
    erin.put_bucket_acl(Bucket=eb, AccessControlPolicy=policy)
    acl = anon.get_bucket_acl(Bucket=eb)  # AllUsers READ_ACP
    assert acl["Owner"] == owner("erin")
    assert grants(acl) == {(E, FC), (F, READ), (ALL_USERS, READ_ACP)}
    assert allowed(lambda: frank.list_objects_v2(Bucket=eb))
    assert not allowed(lambda: anon.list_objects_v2(Bucket=eb))
    erin.put_object_acl(
        Bucket=eb,
        Key="k",
        AccessControlPolicy={
            "Owner": {"ID": E},
            "Grants": [{"Grantee": {"Type": "Group", "URI": AUTHENTICATED_USERS}, "Permission": READ}],
        },
    )
    assert grants(erin.get_object_acl(Bucket=eb, Key="k")) == {(AUTHENTICATED_USERS, READ)}
    assert body(frank, eb, "k") == b"policy"
    assert not allowed(lambda: anon.get_object(Bucket=eb, Key="k"))


def test_invalid_grants_are_rejected(target, erin, bucket_factory):
    eb = bucket_factory("badgrant", "erin")
    erin.put_object(Bucket=eb, Key="k", Body=b"x")

    def rejected(call, code):
        with pytest.raises(ClientError) as e:
            call()
        assert_client_error(e, code, 400)

    for grant in (gid(UNKNOWN_ID), 'id="not-a-canonical-id"'):
        rejected(lambda: erin.put_bucket_acl(Bucket=eb, GrantRead=grant), "InvalidArgument")
        rejected(lambda: erin.put_object_acl(Bucket=eb, Key="k", GrantRead=grant), "InvalidArgument")
        rejected(lambda: erin.put_object(Bucket=eb, Key="new", Body=b"x", GrantRead=grant), "InvalidArgument")
    unknown_policy = {
        "Owner": {"ID": E},
        "Grants": [{"Grantee": {"Type": "CanonicalUser", "ID": UNKNOWN_ID}, "Permission": READ}],
    }
    rejected(lambda: erin.put_bucket_acl(Bucket=eb, AccessControlPolicy=unknown_policy), "InvalidArgument")
    email = 'emailAddress="frank@example.com"'
    rejected(lambda: erin.put_bucket_acl(Bucket=eb, GrantRead=email), "UnresolvableGrantByEmailAddress")
    rejected(lambda: erin.put_object_acl(Bucket=eb, Key="k", GrantRead=email), "UnresolvableGrantByEmailAddress")
    both = {"ACL": "public-read", "GrantRead": gid(F)}
    rejected(lambda: erin.put_bucket_acl(Bucket=eb, **both), "InvalidRequest")
    rejected(lambda: erin.put_object_acl(Bucket=eb, Key="k", **both), "InvalidRequest")
    rejected(lambda: erin.put_object(Bucket=eb, Key="new", Body=b"x", **both), "InvalidRequest")
    rejected(lambda: erin.create_multipart_upload(Bucket=eb, Key="new", **both), "InvalidRequest")
    name = unique_bucket("badgrant")
    try:
        rejected(lambda: erin.create_bucket(Bucket=name, **both), "InvalidRequest")
        rejected(lambda: erin.create_bucket(Bucket=name, GrantRead=gid(UNKNOWN_ID)), "InvalidArgument")
    finally:
        try:
            erin.delete_bucket(Bucket=name)
        except ClientError:
            pass
    # nothing was applied
    assert grants(erin.get_bucket_acl(Bucket=eb)) == {(E, FC)}
    assert grants(erin.get_object_acl(Bucket=eb, Key="k")) == {(E, FC)}
    assert [o["Key"] for o in erin.list_objects_v2(Bucket=eb)["Contents"]] == ["k"]
    assert not erin.list_multipart_uploads(Bucket=eb).get("Uploads")


# --------------------------------------------------------------------------
# anonymous requests
# --------------------------------------------------------------------------


def test_anonymous_reads_public_objects_in_private_buckets(target, erin, frank, anon, bucket_factory):
    eb = bucket_factory("anon", "erin")
    erin.put_object(Bucket=eb, Key="pub", Body=b"for everyone", ACL="public-read")
    erin.put_object(Bucket=eb, Key="auth", Body=b"for users", ACL="authenticated-read")
    erin.put_object(Bucket=eb, Key="priv", Body=b"for erin")
    assert body(anon, eb, "pub") == b"for everyone"
    assert anon.head_object(Bucket=eb, Key="pub")["ContentLength"] == 12
    assert anon.get_object(Bucket=eb, Key="pub", Range="bytes=4-6")["Body"].read() == b"eve"
    assert body(frank, eb, "pub") == b"for everyone", "AllUsers includes every signed user"
    assert body(frank, eb, "auth") == b"for users"
    check(
        {
            "GetObject authenticated-read": (lambda: anon.get_object(Bucket=eb, Key="auth"), False),
            "GetObject private": (lambda: anon.get_object(Bucket=eb, Key="priv"), False),
            "HeadObject private": (lambda: anon.head_object(Bucket=eb, Key="priv"), False),
            "HeadObject missing (no bucket READ)": (lambda: anon.head_object(Bucket=eb, Key="missing"), False),
            "GetObjectAcl public-read": (lambda: anon.get_object_acl(Bucket=eb, Key="pub"), False),
            "ListObjectsV2": (lambda: anon.list_objects_v2(Bucket=eb), False),
            "PutObject": (lambda: anon.put_object(Bucket=eb, Key="anon", Body=b"a"), False),
            "PutObject over public": (lambda: anon.put_object(Bucket=eb, Key="pub", Body=b"a"), False),
            "DeleteObject public": (lambda: anon.delete_object(Bucket=eb, Key="pub"), False),
            "ListBuckets": (lambda: anon.list_buckets(), False),
            "CreateBucket": (lambda: anon.create_bucket(Bucket=unique_bucket("anon")), False),
        }
    )
    assert body(erin, eb, "pub") == b"for everyone"


def test_anonymous_request_to_missing_bucket_is_404(target, anon):
    missing = unique_bucket("nobucket")
    for call in (
        lambda: anon.list_objects_v2(Bucket=missing),
        lambda: anon.get_object(Bucket=missing, Key="k"),
        lambda: anon.put_object(Bucket=missing, Key="k", Body=b"x"),
        lambda: anon.get_bucket_acl(Bucket=missing),
    ):
        with pytest.raises(ClientError) as e:
            call()
        assert_client_error(e, "NoSuchBucket", 404)
    with pytest.raises(ClientError) as e:
        anon.head_bucket(Bucket=missing)
    assert_client_error(e, ("404", "NoSuchBucket"), 404)


# --------------------------------------------------------------------------
# copies: read on the source, write on the destination
# --------------------------------------------------------------------------


def test_copy_needs_read_on_source_and_write_on_destination(target, erin, frank, bucket_factory):
    eb, fb = bucket_factory("csrc", "erin"), bucket_factory("cdst", "frank")
    erin.put_object(Bucket=eb, Key="src", Body=b"S" * 1000)
    frank.put_object(Bucket=fb, Key="own", Body=b"F" * 1000)
    uid = frank.create_multipart_upload(Bucket=fb, Key="mp")["UploadId"]
    src = {"Bucket": eb, "Key": "src"}
    check(
        {
            "CopyObject without READ": (lambda: frank.copy_object(Bucket=fb, Key="c", CopySource=src), False),
            "UploadPartCopy without READ": (
                lambda: frank.upload_part_copy(Bucket=fb, Key="mp", UploadId=uid, PartNumber=1, CopySource=src),
                False,
            ),
        }
    )
    erin.put_object_acl(Bucket=eb, Key="src", GrantFullControl=gid(E), GrantRead=gid(F))
    frank.copy_object(Bucket=fb, Key="c", CopySource=src)
    assert body(frank, fb, "c") == b"S" * 1000
    r = frank.upload_part_copy(
        Bucket=fb, Key="mp", UploadId=uid, PartNumber=1, CopySource=src, CopySourceRange="bytes=0-99"
    )
    frank.complete_multipart_upload(
        Bucket=fb,
        Key="mp",
        UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": r["CopyPartResult"]["ETag"]}]},
    )
    assert body(frank, fb, "mp") == b"S" * 100
    # into erin's bucket: frank may read his object but not write there
    own = {"Bucket": fb, "Key": "own"}
    assert not allowed(lambda: frank.copy_object(Bucket=eb, Key="in", CopySource=own))
    assert not allowed(lambda: frank.create_multipart_upload(Bucket=eb, Key="in"))
    # and erin may write her bucket but not read frank's object
    assert not allowed(lambda: erin.copy_object(Bucket=eb, Key="in", CopySource=own))
    euid = erin.create_multipart_upload(Bucket=eb, Key="in")["UploadId"]
    assert not allowed(
        lambda: erin.upload_part_copy(Bucket=eb, Key="in", UploadId=euid, PartNumber=1, CopySource=own)
    )
    erin.abort_multipart_upload(Bucket=eb, Key="in", UploadId=euid)
    erin.put_bucket_acl(Bucket=eb, GrantFullControl=gid(E), GrantWrite=gid(F))
    frank.copy_object(Bucket=eb, Key="in", CopySource=own)
    assert frank.get_object_acl(Bucket=eb, Key="in")["Owner"] == owner("frank")
    assert sorted(o["Key"] for o in erin.list_objects_v2(Bucket=eb)["Contents"]) == ["in", "src"]


# --------------------------------------------------------------------------
# the operators' config grants are extra permissions
# --------------------------------------------------------------------------


def test_config_grants_still_apply(target, s3, erin, bucket_factory):
    carol, dave, bob = target.client("carol"), target.client("dave"), target.client("bob")
    key = f"cfg-{unique_bucket('k')}"
    try:
        dave.put_object(Bucket="shared", Key=key, Body=b"from dave")
        # read grant: READ + READ_ACP on the bucket, READ on every object in it
        assert body(carol, "shared", key) == b"from dave"
        assert grants(carol.get_bucket_acl(Bucket="shared")) == {(canonical_id("alice"), FC)}
        assert dave.get_object_acl(Bucket="shared", Key=key)["Owner"] == owner("dave")
        assert not allowed(lambda: carol.put_bucket_acl(Bucket="shared", ACL="public-read"))
    finally:
        s3.delete_object(Bucket="shared", Key=key)
    # read-write `*`: FULL_CONTROL on erin's bucket and objects, though alice owns neither
    eb = bucket_factory("cfg", "erin")
    erin.put_object(Bucket=eb, Key="k", Body=b"erin's")
    assert body(s3, eb, "k") == b"erin's"
    assert grants(s3.get_object_acl(Bucket=eb, Key="k")) == {(E, FC)}
    s3.put_object(Bucket=eb, Key="alice", Body=b"a")
    s3.put_bucket_acl(Bucket=eb, GrantFullControl=gid(E), GrantRead=guri(AUTHENTICATED_USERS))
    assert erin.get_bucket_acl(Bucket=eb)["Owner"] == owner("erin")
    # read-write `bob-*`: a bob-* bucket erin created is open to bob
    bb = bucket_factory("bob", "erin")
    erin.put_object(Bucket=bb, Key="k", Body=b"in bob's namespace")
    assert body(bob, bb, "k") == b"in bob's namespace"
    bob.put_object(Bucket=bb, Key="bob", Body=b"b")
    assert [b["Name"] for b in bob.list_buckets()["Buckets"]].count(bb) == 0, "bob does not own it"
