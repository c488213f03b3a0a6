"""Bucket operations through boto3: CreateBucket (naming rules, ownership
conflicts), HeadBucket, DeleteBucket, ListBuckets, GetBucketLocation."""

from __future__ import annotations

import datetime as dt

import pytest
from botocore.exceptions import ClientError

from s3util import assert_client_error, assert_s3_error, key_path, raw_request, unique_bucket


def test_create_head_list_delete(target, s3):
    name = unique_bucket("life")
    before = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=5)
    r = s3.create_bucket(Bucket=name)
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    try:
        assert r.get("Location") in ("/" + name, None, f"{target.endpoint}/{name}")
        h = s3.head_bucket(Bucket=name)
        assert h["ResponseMetadata"]["HTTPStatusCode"] == 200
        listed = {b["Name"]: b for b in s3.list_buckets()["Buckets"]}
        assert name in listed
        created = listed[name]["CreationDate"]
        assert before <= created <= dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=5)
    finally:
        s3.delete_bucket(Bucket=name)
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket=name)
    assert_client_error(e, ("404", "NoSuchBucket", "NotFound"), 404)
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_list_buckets_sorted_and_owner(s3, bucket_factory):
    names = [bucket_factory("lb") for _ in range(3)]
    r = s3.list_buckets()
    listed = [b["Name"] for b in r["Buckets"]]
    assert set(names) <= set(listed)
    assert listed == sorted(listed), "ListBuckets must be sorted by name"
    assert r.get("Owner", {}).get("ID"), f"ListBuckets should carry an Owner: {r.get('Owner')}"


@pytest.mark.parametrize(
    "name",
    [
        "abc",
        "a" * 63,
        "with.dots.ok",
        "0-digits-first",
        "a-b-c-1-2-3",
    ],
)
def test_valid_bucket_names(s3, name):
    # make them unique but keep the interesting shape
    if len(name) == 63:
        n = unique_bucket("v") + "x" * 63
        n = n[:63]
    elif name == "abc":
        n = unique_bucket("v")[:3]
    else:
        n = f"{name}-{unique_bucket('v')}"[:63]
    s3.create_bucket(Bucket=n)
    try:
        s3.head_bucket(Bucket=n)
    finally:
        s3.delete_bucket(Bucket=n)


@pytest.mark.parametrize(
    "name",
    [
        "ab",  # too short
        "a" * 64,  # too long
        "UpperCase-bucket",
        "under_score-bucket",
        "-leading-hyphen",
        "trailing-hyphen-",
        "192.168.10.20",  # formatted as an IP address
        "double..dots",
        ".leading-dot",
        "trailing-dot.",
        "dot-.hyphen",
        "xn--reserved-prefix",
        "sthree-reserved",
        "reserved-suffix-s3alias",
        "reserved--ol-s3",
        "bad!char",
        "space name",
    ],
)
def test_invalid_bucket_names(target, users, name):
    # raw request so botocore's own name checks can't intercept
    r = raw_request(target.endpoint, "PUT", key_path(name), user=users["alice"])
    assert_s3_error(r, 400, "InvalidBucketName")


def test_invalid_bucket_name_boto3(s3):
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket="Has_Upper_And_Underscore")
    assert_client_error(e, "InvalidBucketName", 400)


def test_recreate_own_bucket_in_us_east_1_is_ok_and_changes_nothing(s3, bucket):
    """AWS us-east-1 answers 200 to a caller re-creating its own bucket and
    keeps the bucket as it was (objects, ACL, creation date)."""
    s3.put_object(Bucket=bucket, Key="kept", Body=b"kept")
    created = {b["Name"]: b["CreationDate"] for b in s3.list_buckets()["Buckets"]}[bucket]
    acl = s3.get_bucket_acl(Bucket=bucket)["Grants"]
    for kw in ({}, {"ACL": "public-read"}):
        r = s3.create_bucket(Bucket=bucket, **kw)
        assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert s3.get_object(Bucket=bucket, Key="kept")["Body"].read() == b"kept"
    assert s3.get_bucket_acl(Bucket=bucket)["Grants"] == acl
    assert {b["Name"]: b["CreationDate"] for b in s3.list_buckets()["Buckets"]}[bucket] == created


def test_recreate_own_bucket_elsewhere_is_already_owned(make_target):
    """Outside us-east-1, AWS answers 409 BucketAlreadyOwnedByYou."""
    st = make_target(metrics=False, extra={"region": "eu-west-1"})
    st.start()
    c = st.client(region="eu-west-1")
    name = unique_bucket("elsewhere")
    c.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    with pytest.raises(ClientError) as e:
        c.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    assert_client_error(e, "BucketAlreadyOwnedByYou", 409)


def test_create_bucket_owned_by_other_user(target, bucket_factory):
    alice, bob = target.client("alice"), target.client("bob")
    # bob owns bob-*: alice (who may create anything) must get BucketAlreadyExists
    mine = bucket_factory("bob", user="bob")
    with pytest.raises(ClientError) as e:
        alice.create_bucket(Bucket=mine)
    assert_client_error(e, "BucketAlreadyExists", 409)
    # and the other way round: a bob-* bucket alice created
    hers = bucket_factory("bob", user="alice")
    with pytest.raises(ClientError) as e:
        bob.create_bucket(Bucket=hers)
    assert_client_error(e, "BucketAlreadyExists", 409)


def test_user_cannot_create_bucket_outside_grants(target):
    bob, carol = target.client("bob"), target.client("carol")
    name = unique_bucket("notbob")
    with pytest.raises(ClientError) as e:
        bob.create_bucket(Bucket=name)
    assert_client_error(e, "AccessDenied", 403)
    with pytest.raises(ClientError) as e:
        carol.create_bucket(Bucket=unique_bucket("carol"))
    assert_client_error(e, "AccessDenied", 403)
    # 'bob-*' is a prefix grant: 'bobby-...' and 'xbob-...' are not bob's
    for near_miss in (unique_bucket("bobby"), "x" + unique_bucket("bob")):
        with pytest.raises(ClientError) as e:
            bob.create_bucket(Bucket=near_miss)
        assert_client_error(e, "AccessDenied", 403)
    # read-only carol may not create even the bucket she can read
    with pytest.raises(ClientError) as e:
        carol.create_bucket(Bucket="shared")
    assert_client_error(e, ("AccessDenied", "BucketAlreadyExists"), None)
    with pytest.raises(ClientError) as e:
        target.client("alice").head_bucket(Bucket=name)
    assert_client_error(e, ("404", "NoSuchBucket", "NotFound"), 404)


def test_bob_can_create_and_delete_his_buckets(target):
    bob = target.client("bob")
    name = unique_bucket("bob")
    bob.create_bucket(Bucket=name)
    bob.head_bucket(Bucket=name)
    bob.put_object(Bucket=name, Key="k", Body=b"x")
    assert bob.get_object(Bucket=name, Key="k")["Body"].read() == b"x"
    bob.delete_object(Bucket=name, Key="k")
    bob.delete_bucket(Bucket=name)


def test_list_buckets_only_shows_accessible(target, bucket, bucket_factory):
    bob = target.client("bob")
    bobs = bucket_factory("bob", user="bob")
    names = [b["Name"] for b in bob.list_buckets()["Buckets"]]
    assert bobs in names
    assert bucket not in names, "bob must not see alice's bucket he has no grant on"


def test_head_bucket_without_rights(target, bucket):
    with pytest.raises(ClientError) as e:
        target.client("bob").head_bucket(Bucket=bucket)
    assert_client_error(e, ("403", "AccessDenied", "Forbidden"), 403)


def test_delete_bucket_not_empty(s3, bucket):
    s3.put_object(Bucket=bucket, Key="dir/obj", Body=b"data")
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket=bucket)
    assert_client_error(e, "BucketNotEmpty", 409)
    s3.head_bucket(Bucket=bucket)
    assert s3.get_object(Bucket=bucket, Key="dir/obj")["Body"].read() == b"data"
    s3.delete_object(Bucket=bucket, Key="dir/obj")
    s3.delete_bucket(Bucket=bucket)
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket=bucket)
    assert_client_error(e, ("404", "NoSuchBucket", "NotFound"), 404)


def test_delete_missing_bucket(s3):
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket=unique_bucket("missing"))
    assert_client_error(e, "NoSuchBucket", 404)


def test_delete_bucket_needs_write(target):
    with pytest.raises(ClientError) as e:
        target.client("carol").delete_bucket(Bucket="shared")
    assert_client_error(e, "AccessDenied", 403)
    target.client("alice").head_bucket(Bucket="shared")


def test_get_bucket_location(s3, bucket):
    r = s3.get_bucket_location(Bucket=bucket)
    # AWS answers an empty LocationConstraint for us-east-1
    assert r["LocationConstraint"] is None, r


def test_get_bucket_location_missing(s3):
    with pytest.raises(ClientError) as e:
        s3.get_bucket_location(Bucket=unique_bucket("missing"))
    assert_client_error(e, "NoSuchBucket", 404)


def test_recreate_after_delete(s3):
    name = unique_bucket("again")
    s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key="old", Body=b"old")
    s3.delete_object(Bucket=name, Key="old")
    s3.delete_bucket(Bucket=name)
    s3.create_bucket(Bucket=name)
    try:
        assert s3.list_objects_v2(Bucket=name)["KeyCount"] == 0
    finally:
        s3.delete_bucket(Bucket=name)
