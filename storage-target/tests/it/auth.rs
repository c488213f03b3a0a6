//! Authentication and authorisation against the real binary: SigV4 header
//! and presigned, payload modes, wrong/unknown keys, anonymous requests,
//! per-bucket rights, and request ids on errors s3s raises itself.

use crate::common;
use std::time::{Duration, SystemTime};

use crate::common::{
    ADMIN, OWNER_A, OWNER_B, READER, Raw, Server, err as code, md5_hex, raw, sign_v4,
};
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use storage_target::config::default_canonical_id;

/// Checks that an error response carries the same request id in the header and the XML body.
fn assert_ids_match(r: &Raw) {
    let header = r
        .header("x-amz-request-id")
        .expect("x-amz-request-id header");
    assert_eq!(r.xml("RequestId").as_deref(), Some(header), "{}", r.text());
}

async fn setup() -> Server {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("shared").send().await.unwrap();
    c.create_bucket().bucket("private").send().await.unwrap();
    for b in ["shared", "private"] {
        c.put_object()
            .bucket(b)
            .key("obj")
            .body(ByteStream::from_static(b"secret data"))
            .send()
            .await
            .unwrap();
    }
    s
}

#[tokio::test]
async fn wrong_secret_and_unknown_key() {
    let s = setup().await;
    let bad = common::client_for(&s.endpoint, ADMIN.0, "wrong-secret");
    let (c, st) = code(
        bad.get_object()
            .bucket("shared")
            .key("obj")
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!((c.as_str(), st), ("SignatureDoesNotMatch", 403));
    let (c, st) = code(bad.list_buckets().send().await.unwrap_err());
    assert_eq!((c.as_str(), st), ("SignatureDoesNotMatch", 403));
    let unknown = common::client_for(&s.endpoint, "nobody", "x");
    let (c, st) = code(
        unknown
            .get_object()
            .bucket("shared")
            .key("obj")
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!((c.as_str(), st), ("InvalidAccessKeyId", 403));
    // Nothing was written by the rejected PUT.
    let (c, _) = code(
        bad.put_object()
            .bucket("shared")
            .key("new")
            .body(ByteStream::from_static(b"x"))
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(c, "SignatureDoesNotMatch");
    let (c, _) = code(
        s.admin()
            .head_object()
            .bucket("shared")
            .key("new")
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(c, "NotFound");
}

#[tokio::test]
async fn anonymous_is_denied() {
    let s = setup().await;
    for (m, path) in [
        ("GET", "/shared/obj"),
        ("PUT", "/shared/anon"),
        ("GET", "/"),
        ("GET", "/shared"),
    ] {
        let r = raw(m, &s.url(path), &[], Bytes::from_static(b"x")).await;
        assert_eq!(r.status, 403, "{m} {path}");
        assert_eq!(r.xml("Code").as_deref(), Some("AccessDenied"), "{m} {path}");
        assert_ids_match(&r);
    }
}

#[tokio::test]
async fn per_bucket_rights() {
    let s = setup().await;
    let r = s.client(READER);
    let got = r
        .get_object()
        .bucket("shared")
        .key("obj")
        .send()
        .await
        .unwrap();
    assert_eq!(got.body.collect().await.unwrap().to_vec(), b"secret data");
    r.list_objects_v2().bucket("shared").send().await.unwrap();
    r.head_bucket().bucket("shared").send().await.unwrap();
    let names: Vec<_> = r
        .list_buckets()
        .send()
        .await
        .unwrap()
        .buckets()
        .iter()
        .map(|b| b.name().unwrap().to_owned())
        .collect();
    // ListBuckets lists what the caller owns (as AWS): a read grant on
    // "shared" lets the reader use it, not own it.
    assert!(names.is_empty(), "{names:?}");
    for res in [
        code(
            r.put_object()
                .bucket("shared")
                .key("w")
                .body(ByteStream::from_static(b"x"))
                .send()
                .await
                .unwrap_err(),
        ),
        code(
            r.delete_object()
                .bucket("shared")
                .key("obj")
                .send()
                .await
                .unwrap_err(),
        ),
        code(
            r.get_object()
                .bucket("private")
                .key("obj")
                .send()
                .await
                .unwrap_err(),
        ),
        code(
            r.list_objects_v2()
                .bucket("private")
                .send()
                .await
                .unwrap_err(),
        ),
        code(r.create_bucket().bucket("mine").send().await.unwrap_err()),
        code(r.delete_bucket().bucket("shared").send().await.unwrap_err()),
        code(
            r.create_multipart_upload()
                .bucket("shared")
                .key("m")
                .send()
                .await
                .unwrap_err(),
        ),
    ] {
        assert_eq!(res, ("AccessDenied".to_owned(), 403));
    }
    // Copy needs read on the source: admin may, reader may not copy into shared.
    let (c, _) = code(
        r.copy_object()
            .bucket("shared")
            .key("c")
            .copy_source("private/obj")
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(c, "AccessDenied");
    assert_eq!(
        code(
            s.admin()
                .get_object()
                .bucket("shared")
                .key("w")
                .send()
                .await
                .unwrap_err()
        )
        .0,
        "NoSuchKey"
    );
}

#[tokio::test]
async fn presigned_get_put_expired_and_tampered() {
    let s = setup().await;
    let c = s.admin();
    let cfg = || PresigningConfig::expires_in(Duration::from_secs(300)).unwrap();

    let p = c
        .get_object()
        .bucket("shared")
        .key("obj")
        .presigned(cfg())
        .await
        .unwrap();
    let r = raw("GET", p.uri(), &[], Bytes::new()).await;
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..], b"secret data");

    // Presigned PUT without Content-Type: stored as binary/octet-stream.
    let p = c
        .put_object()
        .bucket("shared")
        .key("via-presign")
        .presigned(cfg())
        .await
        .unwrap();
    let r = raw("PUT", p.uri(), &[], Bytes::from_static(b"presigned body")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let h = c
        .head_object()
        .bucket("shared")
        .key("via-presign")
        .send()
        .await
        .unwrap();
    assert_eq!(
        h.e_tag(),
        Some(format!("\"{}\"", md5_hex(b"presigned body")).as_str())
    );
    assert_eq!(h.content_type(), Some("binary/octet-stream"));

    // Expired.
    let old = PresigningConfig::builder()
        .start_time(SystemTime::now() - Duration::from_secs(3600))
        .expires_in(Duration::from_secs(60))
        .build()
        .unwrap();
    let p = c
        .get_object()
        .bucket("shared")
        .key("obj")
        .presigned(old)
        .await
        .unwrap();
    let r = raw("GET", p.uri(), &[], Bytes::new()).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.xml("Code").as_deref(), Some("AccessDenied"));
    assert_ids_match(&r);

    // Signed too far in the future.
    let future = PresigningConfig::builder()
        .start_time(SystemTime::now() + Duration::from_secs(7200))
        .expires_in(Duration::from_secs(60))
        .build()
        .unwrap();
    let p = c
        .get_object()
        .bucket("shared")
        .key("obj")
        .presigned(future)
        .await
        .unwrap();
    let r = raw("GET", p.uri(), &[], Bytes::new()).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.xml("Code").as_deref(), Some("RequestTimeTooSkewed"));
    assert_ids_match(&r);

    // Tampered: a different key with the same signature.
    let p = c
        .get_object()
        .bucket("shared")
        .key("obj")
        .presigned(cfg())
        .await
        .unwrap();
    let r = raw(
        "GET",
        &p.uri().replace("/shared/obj", "/private/obj"),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(r.xml("Code").as_deref(), Some("SignatureDoesNotMatch"));
    assert_ids_match(&r);
}

async fn signed(s: &Server, method: &str, path: &str, body: &'static [u8], mode: &str) -> Raw {
    use aws_sigv4::http_request::SignableBody;
    let url = s.url(path);
    let sb = match mode {
        "signed" => SignableBody::Bytes(body),
        "unsigned" => SignableBody::UnsignedPayload,
        "wrong-hash" => SignableBody::Precomputed(md5_hex(b"x").repeat(2)),
        _ => unreachable!(),
    };
    let time = SystemTime::now();
    let headers = sign_v4(method, &url, &[], sb, time);
    let hs: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(k, _)| k != "host")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    raw(method, &url, &hs, Bytes::from_static(body)).await
}

#[tokio::test]
async fn payload_modes() {
    let s = setup().await;
    let r = signed(&s, "PUT", "/shared/signed", b"signed payload", "signed").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = signed(
        &s,
        "PUT",
        "/shared/unsigned",
        b"unsigned payload",
        "unsigned",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = signed(&s, "PUT", "/shared/bad", b"some payload", "wrong-hash").await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.xml("Code").as_deref(), Some("XAmzContentSHA256Mismatch"));
    assert_ids_match(&r);
    let c = s.admin();
    let get = |k: &'static str| c.get_object().bucket("shared").key(k).send();
    assert_eq!(
        get("signed")
            .await
            .unwrap()
            .body
            .collect()
            .await
            .unwrap()
            .to_vec(),
        b"signed payload"
    );
    assert_eq!(
        get("unsigned")
            .await
            .unwrap()
            .body
            .collect()
            .await
            .unwrap()
            .to_vec(),
        b"unsigned payload"
    );
    assert!(get("bad").await.is_err());
    // aws-chunked with an unsigned trailer (STREAMING-UNSIGNED-PAYLOAD-TRAILER),
    // as the newest SDKs send it, with a good and a bad CRC32 trailer.
    let payload = vec![7u8; 200_000];
    let mut h = s3s::checksum::ChecksumHasher {
        crc32: Some(Default::default()),
        ..Default::default()
    };
    h.update(&payload);
    let crc = h.finalize().checksum_crc32.unwrap();
    let r = chunked(&s, "/shared/chunked", &payload, &crc).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        get("chunked")
            .await
            .unwrap()
            .body
            .collect()
            .await
            .unwrap()
            .to_vec(),
        payload
    );
    let h = c
        .head_object()
        .bucket("shared")
        .key("chunked")
        .send()
        .await
        .unwrap();
    assert_eq!(h.content_encoding(), None, "aws-chunked must not be stored");
    let r = chunked(&s, "/shared/chunked-bad", &payload, "AAAAAA==").await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.xml("Code").as_deref(), Some("BadDigest"));
    assert!(get("chunked-bad").await.is_err());
    assert!(
        s.log()
            .contains("payload=STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    );
}

/// PUT with an aws-chunked body (two chunks) and an `x-amz-checksum-crc32` trailer.
async fn chunked(s: &Server, path: &str, payload: &[u8], crc: &str) -> Raw {
    let url = s.url(path);
    let (a, b) = payload.split_at(payload.len() / 2);
    let mut body = Vec::new();
    for part in [a, b] {
        body.extend(format!("{:x}\r\n", part.len()).as_bytes());
        body.extend(part);
        body.extend(b"\r\n");
    }
    body.extend(format!("0\r\nx-amz-checksum-crc32:{crc}\r\n\r\n").as_bytes());
    let decoded = payload.len().to_string();
    let extra = [
        ("content-encoding", "aws-chunked"),
        ("x-amz-decoded-content-length", decoded.as_str()),
        ("x-amz-trailer", "x-amz-checksum-crc32"),
    ];
    let headers = sign_v4(
        "PUT",
        &url,
        &extra,
        aws_sigv4::http_request::SignableBody::StreamingUnsignedPayloadTrailer,
        SystemTime::now(),
    );
    let hs: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(k, _)| k != "host")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    raw("PUT", &url, &hs, Bytes::from(body)).await
}

#[tokio::test]
async fn header_auth_clock_skew() {
    let s = setup().await;
    let url = s.url("/shared/obj");
    let headers = sign_v4(
        "GET",
        &url,
        &[],
        aws_sigv4::http_request::SignableBody::UnsignedPayload,
        SystemTime::now() - Duration::from_secs(3600),
    );
    let hs: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(k, _)| k != "host")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let r = raw("GET", &url, &hs, Bytes::new()).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.xml("Code").as_deref(), Some("RequestTimeTooSkewed"));
    assert_ids_match(&r);
}

async fn bucket_names(c: &aws_sdk_s3::Client) -> Vec<String> {
    c.list_buckets()
        .send()
        .await
        .unwrap()
        .buckets()
        .iter()
        .map(|b| b.name().unwrap().to_owned())
        .collect()
}

async fn read_body(c: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<Vec<u8>, String> {
    match c.get_object().bucket(bucket).key(key).send().await {
        Ok(o) => Ok(o.body.collect().await.unwrap().to_vec()),
        Err(e) => Err(code(e).0),
    }
}

/// Owners and ACLs with aws-sdk-s3: two users without operator grants, an
/// anonymous client (raw unsigned requests).
#[tokio::test]
async fn owners_and_acls() {
    use aws_sdk_s3::types::{BucketCannedAcl, ObjectCannedAcl};
    let s = Server::start();
    let (a, b) = (s.client(OWNER_A), s.client(OWNER_B));
    let (a_id, b_id) = (
        default_canonical_id(OWNER_A.0),
        default_canonical_id(OWNER_B.0),
    );
    a.create_bucket().bucket("a-bucket").send().await.unwrap();
    a.put_object()
        .bucket("a-bucket")
        .key("k")
        .body(ByteStream::from_static(b"a's data"))
        .send()
        .await
        .unwrap();
    // Creating again: 200 for the owner (us-east-1), 409 for anyone else,
    // and nothing is reset.
    a.create_bucket()
        .bucket("a-bucket")
        .acl(BucketCannedAcl::PublicRead)
        .send()
        .await
        .unwrap();
    let theirs = code(
        b.create_bucket()
            .bucket("a-bucket")
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(theirs, ("BucketAlreadyExists".to_owned(), 409));
    assert_eq!(read_body(&a, "a-bucket", "k").await.unwrap(), b"a's data");
    assert_eq!(bucket_names(&a).await, ["a-bucket"]);
    assert!(bucket_names(&b).await.is_empty());
    let listed = a.list_buckets().send().await.unwrap();
    assert_eq!(listed.owner().unwrap().id(), Some(a_id.as_str()));
    assert_eq!(listed.owner().unwrap().display_name(), Some("Owner A"));

    // Private by default: b and anonymous callers get nothing, not even
    // whether a key exists; a missing bucket is 404 for everyone.
    assert_eq!(
        read_body(&b, "a-bucket", "k").await.unwrap_err(),
        "AccessDenied"
    );
    assert_eq!(
        read_body(&b, "a-bucket", "nope").await.unwrap_err(),
        "AccessDenied"
    );
    assert_eq!(
        read_body(&a, "a-bucket", "nope").await.unwrap_err(),
        "NoSuchKey"
    );
    let anon = |path: &str| {
        let url = s.url(path);
        async move { raw("GET", &url, &[], Bytes::new()).await }
    };
    assert_eq!(anon("/a-bucket/k").await.status, 403);
    let missing = anon("/no-such-bucket/k").await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.xml("Code").as_deref(), Some("NoSuchBucket"));

    // A public-read object in a private bucket: anyone reads it, nobody
    // lists the bucket.
    a.put_object_acl()
        .bucket("a-bucket")
        .key("k")
        .acl(ObjectCannedAcl::PublicRead)
        .send()
        .await
        .unwrap();
    let r = anon("/a-bucket/k").await;
    assert_eq!((r.status, r.body.as_ref()), (200, &b"a's data"[..]));
    assert_eq!(anon("/a-bucket").await.status, 403);
    assert_eq!(read_body(&b, "a-bucket", "k").await.unwrap(), b"a's data");
    let acl = b.get_object_acl().bucket("a-bucket").key("k").send().await;
    assert_eq!(
        code(acl.unwrap_err()).0,
        "AccessDenied",
        "READ is not READ_ACP"
    );
    let acl = a
        .get_object_acl()
        .bucket("a-bucket")
        .key("k")
        .send()
        .await
        .unwrap();
    assert_eq!(acl.owner().unwrap().id(), Some(a_id.as_str()));
    assert_eq!(acl.grants().len(), 2, "{acl:?}");
    // A new write of the key does not inherit the ACL.
    a.put_object()
        .bucket("a-bucket")
        .key("k")
        .body(ByteStream::from_static(b"v2"))
        .send()
        .await
        .unwrap();
    assert_eq!(anon("/a-bucket/k").await.status, 403);

    // WRITE for b through the bucket ACL: b's objects are b's.
    a.put_bucket_acl()
        .bucket("a-bucket")
        .grant_write(format!("id=\"{b_id}\""))
        .grant_full_control(format!("id=\"{a_id}\""))
        .send()
        .await
        .unwrap();
    b.put_object()
        .bucket("a-bucket")
        .key("from-b")
        .body(ByteStream::from_static(b"b's"))
        .send()
        .await
        .unwrap();
    assert_eq!(read_body(&b, "a-bucket", "from-b").await.unwrap(), b"b's");
    assert_eq!(
        read_body(&a, "a-bucket", "from-b").await.unwrap_err(),
        "AccessDenied",
        "the bucket owner does not read what others wrote"
    );
    b.put_object()
        .bucket("a-bucket")
        .key("for-a")
        .acl(ObjectCannedAcl::BucketOwnerFullControl)
        .body(ByteStream::from_static(b"for a"))
        .send()
        .await
        .unwrap();
    assert_eq!(read_body(&a, "a-bucket", "for-a").await.unwrap(), b"for a");
    // Copy needs READ on the source: b cannot copy a's private object.
    let copy = b
        .copy_object()
        .bucket("a-bucket")
        .key("stolen")
        .copy_source("a-bucket/k")
        .send()
        .await;
    assert_eq!(code(copy.unwrap_err()).0, "AccessDenied");
    // Unknown canonical ids and canned + grants are refused.
    let bad = a
        .put_bucket_acl()
        .bucket("a-bucket")
        .grant_read(format!("id=\"{}\"", "0".repeat(64)))
        .send()
        .await;
    assert_eq!(code(bad.unwrap_err()), ("InvalidArgument".to_owned(), 400));
    let both = a
        .put_bucket_acl()
        .bucket("a-bucket")
        .acl(BucketCannedAcl::PublicRead)
        .grant_read(format!("id=\"{b_id}\""))
        .send()
        .await;
    assert_eq!(code(both.unwrap_err()).1, 400);
    // Back to private: b's grant is gone.
    a.put_bucket_acl()
        .bucket("a-bucket")
        .acl(BucketCannedAcl::Private)
        .send()
        .await
        .unwrap();
    let denied = b
        .put_object()
        .bucket("a-bucket")
        .key("late")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await;
    assert_eq!(code(denied.unwrap_err()).0, "AccessDenied");
}

/// UploadPartCopy (whole and ranged sources, bad ranges, source
/// conditions) and a retried CompleteMultipartUpload, with aws-sdk-s3.
#[tokio::test]
async fn upload_part_copy_and_retried_complete() {
    use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("mpu").send().await.unwrap();
    let src = common::data(6 << 20, 7);
    c.put_object()
        .bucket("mpu")
        .key("src key+%")
        .body(ByteStream::from(src.clone()))
        .send()
        .await
        .unwrap();
    let up = c
        .create_multipart_upload()
        .bucket("mpu")
        .key("dst")
        .send()
        .await
        .unwrap();
    let id = up.upload_id().unwrap();
    let source = "mpu/src%20key%2B%25";
    let p1 = c
        .upload_part_copy()
        .bucket("mpu")
        .key("dst")
        .upload_id(id)
        .part_number(1)
        .copy_source(source)
        .copy_source_range("bytes=0-5242879")
        .send()
        .await
        .unwrap();
    let p2 = c
        .upload_part_copy()
        .bucket("mpu")
        .key("dst")
        .upload_id(id)
        .part_number(2)
        .copy_source(source)
        .send()
        .await
        .unwrap();
    for (range, what, want) in [
        ("bytes=5-1", "first > last", ("InvalidArgument", 400)),
        ("bytes=0-6291456", "past the end", ("InvalidRange", 416)),
        ("0-10", "no bytes=", ("InvalidArgument", 400)),
    ] {
        let e = c
            .upload_part_copy()
            .bucket("mpu")
            .key("dst")
            .upload_id(id)
            .part_number(3)
            .copy_source(source)
            .copy_source_range(range)
            .send()
            .await
            .unwrap_err();
        assert_eq!(code(e), (want.0.to_owned(), want.1), "{what}");
    }
    let e = c
        .upload_part_copy()
        .bucket("mpu")
        .key("dst")
        .upload_id(id)
        .part_number(3)
        .copy_source(source)
        .copy_source_if_match("\"0123\"")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), ("PreconditionFailed".to_owned(), 412));
    let parts = CompletedMultipartUpload::builder()
        .parts(
            CompletedPart::builder()
                .part_number(1)
                .e_tag(p1.copy_part_result().unwrap().e_tag().unwrap())
                .build(),
        )
        .parts(
            CompletedPart::builder()
                .part_number(2)
                .e_tag(p2.copy_part_result().unwrap().e_tag().unwrap())
                .build(),
        )
        .build();
    let complete = || {
        c.complete_multipart_upload()
            .bucket("mpu")
            .key("dst")
            .upload_id(id)
            .multipart_upload(parts.clone())
            .send()
    };
    let first = complete().await.unwrap();
    let retried = complete().await.unwrap();
    assert_eq!(first.e_tag(), retried.e_tag());
    let got = read_body(&c, "mpu", "dst").await.unwrap();
    assert_eq!(got.len(), (5 << 20) + src.len());
    assert!(got[..5 << 20] == src[..5 << 20] && got[5 << 20..] == src[..]);
    // A different part list is not a retry.
    let other = c
        .complete_multipart_upload()
        .bucket("mpu")
        .key("dst")
        .upload_id(id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .parts(
                    CompletedPart::builder()
                        .part_number(1)
                        .e_tag(p1.copy_part_result().unwrap().e_tag().unwrap())
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(other).0, "NoSuchUpload");
}

/// Whether `bucket/key` exists (HEAD as the admin).
async fn exists(s: &Server, bucket: &str, key: &str) -> bool {
    s.admin()
        .head_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .is_ok()
}

/// Issue 30 finding 1: a presigned PUT or UploadPart URL signs `host` only;
/// its holder adds `x-amz-copy-source` (to copy any object the signer may
/// read) or `x-amz-acl` / `x-amz-grant-*` (to publish what it uploads).
/// Every `x-amz-*` header must be signed: 403 and nothing stored or copied,
/// for presigned and header-signed requests alike.
#[tokio::test]
async fn issue30_unsigned_amz_headers_cannot_widen_a_signed_request() {
    let s = setup().await;
    let c = s.admin();
    let cfg = || PresigningConfig::expires_in(Duration::from_secs(300)).unwrap();
    let put_url = c
        .put_object()
        .bucket("shared")
        .key("upload")
        .presigned(cfg())
        .await
        .unwrap();
    for (h, v) in [
        ("x-amz-copy-source", "/private/obj"),
        ("x-amz-acl", "public-read"),
        (
            "x-amz-grant-read",
            "uri=\"http://acs.amazonaws.com/groups/global/AllUsers\"",
        ),
    ] {
        let r = raw("PUT", put_url.uri(), &[(h, v)], Bytes::from_static(b"x")).await;
        assert_eq!(r.status, 403, "{h}: {}", r.text());
        assert_eq!(r.xml("Code").as_deref(), Some("AccessDenied"), "{h}");
        assert!(r.text().contains("not signed"), "{}", r.text());
        assert_ids_match(&r);
        assert!(!exists(&s, "shared", "upload").await, "{h}");
    }
    // The same URL as signed still works, and stays private.
    let r = raw("PUT", put_url.uri(), &[], Bytes::from_static(b"mine")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let anon = raw("GET", &s.url("/shared/upload"), &[], Bytes::new()).await;
    assert_eq!(anon.status, 403);

    // UploadPart turned into UploadPartCopy of another bucket's object.
    let up = c
        .create_multipart_upload()
        .bucket("shared")
        .key("mp")
        .send()
        .await
        .unwrap();
    let part_url = c
        .upload_part()
        .bucket("shared")
        .key("mp")
        .upload_id(up.upload_id().unwrap())
        .part_number(1)
        .presigned(cfg())
        .await
        .unwrap();
    let r = raw(
        "PUT",
        part_url.uri(),
        &[("x-amz-copy-source", "/private/obj")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    let parts = c
        .list_parts()
        .bucket("shared")
        .key("mp")
        .upload_id(up.upload_id().unwrap())
        .send()
        .await
        .unwrap();
    assert!(parts.parts().is_empty(), "{parts:?}");

    // Header auth: an x-amz-* header added after signing is refused too.
    let url = s.url("/shared/hdr");
    let headers = sign_v4(
        "PUT",
        &url,
        &[],
        aws_sigv4::http_request::SignableBody::UnsignedPayload,
        SystemTime::now(),
    );
    let mut hs: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(k, _)| k != "host")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    hs.push(("x-amz-acl", "public-read"));
    let r = raw("PUT", &url, &hs, Bytes::from_static(b"x")).await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.xml("Code").as_deref(), Some("AccessDenied"));
    assert!(!exists(&s, "shared", "hdr").await);
    hs.pop();
    hs.push(("x-amz-copy-source", "/private/obj"));
    let r = raw("PUT", &url, &hs, Bytes::new()).await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(!exists(&s, "shared", "hdr").await);
    // Signed, the same headers work (the admin may copy and publish).
    let headers = sign_v4(
        "PUT",
        &url,
        &[("x-amz-acl", "public-read")],
        aws_sigv4::http_request::SignableBody::UnsignedPayload,
        SystemTime::now(),
    );
    let hs: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(k, _)| k != "host")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let r = raw("PUT", &url, &hs, Bytes::from_static(b"x")).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// HMAC-SHA1, base64: a SigV2 signature.
fn hmac_sha1_b64(key: &[u8], msg: &str) -> String {
    use base64::Engine as _;
    use sha1::Digest as _;
    let mut k = [0u8; 64];
    k[..key.len()].copy_from_slice(key);
    let pad = |b: u8| k.iter().map(|x| x ^ b).collect::<Vec<u8>>();
    let mut inner = sha1::Sha1::new();
    inner.update(pad(0x36));
    inner.update(msg.as_bytes());
    let mut outer = sha1::Sha1::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize());
    base64::engine::general_purpose::STANDARD.encode(outer.finalize())
}

/// A SigV2 presigned GET URL of `path` as the admin, valid until `expires`
/// (seconds since the epoch).
fn v2_presigned(s: &Server, path: &str, expires: u64) -> String {
    let sig = hmac_sha1_b64(ADMIN.1.as_bytes(), &format!("GET\n\n\n{expires}\n{path}"));
    let sig: String =
        percent_encoding::utf8_percent_encode(&sig, percent_encoding::NON_ALPHANUMERIC).collect();
    s.url(&format!(
        "{path}?AWSAccessKeyId={}&Expires={expires}&Signature={sig}",
        ADMIN.0
    ))
}

/// A SigV2 header-signed GET of `path` as the admin, dated `date`.
async fn v2_get(s: &Server, path: &str, date: SystemTime) -> Raw {
    let date = httpdate::fmt_http_date(date);
    let sig = hmac_sha1_b64(ADMIN.1.as_bytes(), &format!("GET\n\n\n{date}\n{path}"));
    let auth = format!("AWS {}:{sig}", ADMIN.0);
    raw(
        "GET",
        &s.url(path),
        &[("date", &date), ("authorization", &auth)],
        Bytes::new(),
    )
    .await
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Issue 30 finding 9: SigV2 was accepted, undocumented: a presigned URL
/// valid for 100 years, header-signed requests with no clock-skew check.
/// Now refused unless `allow_sigv2: true`, and then held to SigV4's limits.
#[tokio::test]
async fn issue30_sigv2_is_refused_by_default_and_limited_when_allowed() {
    let s = setup().await;
    let century = unix_now() + 100 * 365 * 86_400;
    let r = raw(
        "GET",
        &v2_presigned(&s, "/shared/obj", century),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.xml("Code").as_deref(), Some("InvalidRequest"));
    assert!(r.text().contains("AWS4-HMAC-SHA256"), "{}", r.text());
    let r = raw(
        "GET",
        &v2_presigned(&s, "/shared/obj", unix_now() + 60),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.xml("Code").as_deref(), Some("InvalidRequest"));
    let r = v2_get(&s, "/shared/obj", SystemTime::now()).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.xml("Code").as_deref(), Some("InvalidRequest"));
    assert_ne!(&r.body[..], b"secret data");

    // Allowed by the operator: the SigV4 limits apply.
    let s = Server::start_with(|_| "allow_sigv2: true\n".to_owned());
    s.admin()
        .create_bucket()
        .bucket("shared")
        .send()
        .await
        .unwrap();
    s.admin()
        .put_object()
        .bucket("shared")
        .key("obj")
        .body(ByteStream::from_static(b"secret data"))
        .send()
        .await
        .unwrap();
    let r = raw(
        "GET",
        &v2_presigned(&s, "/shared/obj", unix_now() + 60),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(&r.body[..], b"secret data");
    let r = raw(
        "GET",
        &v2_presigned(&s, "/shared/obj", century),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.xml("Code").as_deref(), Some("AccessDenied"));
    let r = v2_get(&s, "/shared/obj", SystemTime::now()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = v2_get(
        &s,
        "/shared/obj",
        SystemTime::now() - Duration::from_secs(3600),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.xml("Code").as_deref(), Some("RequestTimeTooSkewed"));
}

/// Issue 30 finding 12: `x-amz-expected-bucket-owner` was ignored. A
/// bucket owned by someone else than the caller expects answers 403
/// (compared with the owner's canonical id), for the bucket of a request
/// and for the source of a copy.
#[tokio::test]
async fn issue30_expected_bucket_owner_mismatch_is_denied() {
    let s = setup().await;
    let c = s.admin();
    let admin_id = default_canonical_id(ADMIN.0);
    let other_id = default_canonical_id(OWNER_B.0);
    let (e, st) = code(
        c.get_object()
            .bucket("shared")
            .key("obj")
            .expected_bucket_owner(&other_id)
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!((e.as_str(), st), ("AccessDenied", 403));
    let got = c
        .get_object()
        .bucket("shared")
        .key("obj")
        .expected_bucket_owner(&admin_id)
        .send()
        .await
        .unwrap();
    assert_eq!(
        got.body.collect().await.unwrap().into_bytes().as_ref(),
        b"secret data"
    );
    let (e, _) = code(
        c.put_object()
            .bucket("shared")
            .key("nope")
            .expected_bucket_owner("123456789012")
            .body(ByteStream::from_static(b"x"))
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(e, "AccessDenied");
    assert!(!exists(&s, "shared", "nope").await);
    let (e, _) = code(
        c.list_objects_v2()
            .bucket("shared")
            .expected_bucket_owner(&other_id)
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(e, "AccessDenied");
    let (e, _) = code(
        c.copy_object()
            .bucket("shared")
            .key("copy")
            .copy_source("private/obj")
            .expected_source_bucket_owner(&other_id)
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(e, "AccessDenied");
    assert!(!exists(&s, "shared", "copy").await);
    c.copy_object()
        .bucket("shared")
        .key("copy")
        .copy_source("private/obj")
        .expected_bucket_owner(&admin_id)
        .expected_source_bucket_owner(&admin_id)
        .send()
        .await
        .unwrap();
}

/// Issue 30 finding 12: anonymous listings and ACL reads showed writers'
/// access key ids as display names. A user without a configured
/// `display_name` is shown by canonical id only.
#[tokio::test]
async fn issue30_public_listings_and_acls_show_no_access_key_id() {
    use aws_sdk_s3::types::BucketCannedAcl;
    let s = Server::start();
    let b = s.client(OWNER_B);
    b.create_bucket()
        .bucket("pub30")
        .acl(BucketCannedAcl::PublicRead)
        .send()
        .await
        .unwrap();
    b.put_object()
        .bucket("pub30")
        .key("k")
        .grant_read("uri=\"http://acs.amazonaws.com/groups/global/AllUsers\"")
        .grant_read_acp("uri=\"http://acs.amazonaws.com/groups/global/AllUsers\"")
        .body(ByteStream::from_static(b"public"))
        .send()
        .await
        .unwrap();
    let b_id = default_canonical_id(OWNER_B.0);
    for path in [
        "/pub30",
        "/pub30?list-type=2&fetch-owner=true",
        "/pub30/k?acl",
    ] {
        let r = raw("GET", &s.url(path), &[], Bytes::new()).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert!(r.text().contains(&b_id), "{path}: {}", r.text());
        assert!(!r.text().contains(OWNER_B.0), "{path}: {}", r.text());
    }
}
