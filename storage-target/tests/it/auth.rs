//! Authentication and authorisation against the real binary: SigV4 header
//! and presigned, payload modes, wrong/unknown keys, anonymous requests,
//! per-bucket rights, and request ids on errors s3s raises itself.

use crate::common;
use std::time::{Duration, SystemTime};

use crate::common::{ADMIN, OWNER_A, OWNER_B, READER, Raw, Server, md5_hex, raw};
use crate::support::{
    SignedReq, assert_s3_error, assert_status, bucket_names, completed, delete, exists, fails, get,
    head, mkbucket, presign_at, presign_for, presigned_get, presigned_put, put, raw_get, read,
    rmbucket, s3, s3err, server_with_bucket, signed_raw, start_upload, try_put,
};
use aws_sdk_s3::primitives::ByteStream;
use aws_sigv4::http_request::SignableBody;
use bytes::Bytes;
use storage_target::config::default_canonical_id;

/// Checks that an error response carries the same request id in the header and the XML body.
fn assert_ids_match(r: &Raw) {
    let header = r
        .header("x-amz-request-id")
        .expect("x-amz-request-id header");
    assert_eq!(r.xml("RequestId").as_deref(), Some(header), "{}", r.text());
}

/// [`assert_s3_error`] and [`assert_ids_match`].
#[track_caller]
fn assert_refused(r: &Raw, status: u16, code: &str) {
    assert_s3_error(r, status, code);
    assert_ids_match(r);
}

/// Buckets `shared` and `private` on `s`, each with `obj` ("secret data").
async fn setup_on(s: Server, buckets: &[&str]) -> Server {
    let c = s.admin();
    for b in buckets {
        mkbucket(&c, b).await.unwrap();
        put(&c, b, "obj", b"secret data").await;
    }
    s
}

async fn setup() -> Server {
    setup_on(Server::start(), &["shared", "private"]).await
}

#[tokio::test]
async fn wrong_secret_and_unknown_key() {
    let s = setup().await;
    let bad = common::client_for(&s.endpoint, ADMIN.0, "wrong-secret");
    let mismatch = s3err("SignatureDoesNotMatch", 403);
    assert_eq!(get(&bad, "shared", "obj").await.unwrap_err(), mismatch);
    assert_eq!(fails(bad.list_buckets().send().await), mismatch);
    let unknown = common::client_for(&s.endpoint, "nobody", "x");
    let refused = get(&unknown, "shared", "obj").await.unwrap_err();
    assert_eq!(refused, s3err("InvalidAccessKeyId", 403));
    // Nothing was written by the rejected PUT.
    let (c, _) = try_put(&bad, "shared", "new", b"x").await.unwrap_err();
    assert_eq!(c, "SignatureDoesNotMatch");
    let (c, _) = head(&s.admin(), "shared", "new").await.unwrap_err();
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
    assert_eq!(read(&r, "shared", "obj").await.unwrap(), b"secret data");
    r.list_objects_v2().bucket("shared").send().await.unwrap();
    r.head_bucket().bucket("shared").send().await.unwrap();
    // ListBuckets lists what the caller owns (as AWS): a read grant on
    // "shared" lets the reader use it, not own it.
    let names = bucket_names(&r).await;
    assert!(names.is_empty(), "{names:?}");
    let list_private = r.list_objects_v2().bucket("private").send().await;
    let upload = r.create_multipart_upload().bucket("shared").key("m").send();
    for res in [
        try_put(&r, "shared", "w", b"x").await.map(drop),
        delete(&r, "shared", "obj").await,
        get(&r, "private", "obj").await.map(drop),
        s3(list_private).map(drop),
        mkbucket(&r, "mine").await,
        rmbucket(&r, "shared").await,
        s3(upload.await).map(drop),
    ] {
        assert_eq!(res, Err(s3err("AccessDenied", 403)));
    }
    // Copy needs read on the source: admin may, reader may not copy into shared.
    let copy = r.copy_object().bucket("shared").key("c");
    let (c, _) = fails(copy.copy_source("private/obj").send().await);
    assert_eq!(c, "AccessDenied");
    let (c, _) = get(&s.admin(), "shared", "w").await.unwrap_err();
    assert_eq!(c, "NoSuchKey");
}

#[tokio::test]
async fn presigned_get_put_expired_and_tampered() {
    let s = setup().await;
    let c = s.admin();

    let r = raw_get(&presigned_get(&c, "shared", "obj", presign_for(300)).await).await;
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..], b"secret data");

    // Presigned PUT without Content-Type: stored as binary/octet-stream.
    let url = presigned_put(&c, "shared", "via-presign", presign_for(300)).await;
    let r = raw("PUT", &url, &[], Bytes::from_static(b"presigned body")).await;
    assert_status(&r, 200);
    let h = head(&c, "shared", "via-presign").await.unwrap();
    let want = format!("\"{}\"", md5_hex(b"presigned body"));
    assert_eq!(h.e_tag(), Some(want.as_str()));
    assert_eq!(h.content_type(), Some("binary/octet-stream"));

    // Expired.
    let old = presign_at(SystemTime::now() - Duration::from_secs(3600));
    let r = raw_get(&presigned_get(&c, "shared", "obj", old).await).await;
    assert_refused(&r, 403, "AccessDenied");

    // Signed too far in the future.
    let future = presign_at(SystemTime::now() + Duration::from_secs(7200));
    let r = raw_get(&presigned_get(&c, "shared", "obj", future).await).await;
    assert_refused(&r, 403, "RequestTimeTooSkewed");

    // Tampered: a different key with the same signature.
    let url = presigned_get(&c, "shared", "obj", presign_for(300)).await;
    let r = raw_get(&url.replace("/shared/obj", "/private/obj")).await;
    assert_refused(&r, 403, "SignatureDoesNotMatch");
}

async fn signed(s: &Server, method: &str, path: &str, body: &'static [u8], mode: &str) -> Raw {
    let payload = match mode {
        "signed" => SignableBody::Bytes(body),
        "unsigned" => SignableBody::UnsignedPayload,
        "wrong-hash" => SignableBody::Precomputed(md5_hex(b"x").repeat(2)),
        _ => unreachable!(),
    };
    let req = SignedReq {
        payload,
        ..SignedReq::default()
    };
    req.send(method, &s.url(path), Bytes::from_static(body))
        .await
}

#[tokio::test]
async fn payload_modes() {
    let s = setup().await;
    for (key, body, mode) in [
        ("signed", &b"signed payload"[..], "signed"),
        ("unsigned", b"unsigned payload", "unsigned"),
    ] {
        let r = signed(&s, "PUT", &format!("/shared/{key}"), body, mode).await;
        assert_status(&r, 200);
    }
    let r = signed(&s, "PUT", "/shared/bad", b"some payload", "wrong-hash").await;
    assert_refused(&r, 400, "XAmzContentSHA256Mismatch");
    let c = s.admin();
    assert_eq!(
        read(&c, "shared", "signed").await.unwrap(),
        b"signed payload"
    );
    let unsigned = read(&c, "shared", "unsigned").await;
    assert_eq!(unsigned.unwrap(), b"unsigned payload");
    assert!(read(&c, "shared", "bad").await.is_err());
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
    assert_status(&r, 200);
    assert_eq!(read(&c, "shared", "chunked").await.unwrap(), payload);
    let h = head(&c, "shared", "chunked").await.unwrap();
    assert_eq!(h.content_encoding(), None, "aws-chunked must not be stored");
    let r = chunked(&s, "/shared/chunked-bad", &payload, "AAAAAA==").await;
    assert_s3_error(&r, 400, "BadDigest");
    assert!(read(&c, "shared", "chunked-bad").await.is_err());
    assert!(
        s.log()
            .contains("payload=STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    );
}

/// PUT with an aws-chunked body (two chunks) and an `x-amz-checksum-crc32` trailer.
async fn chunked(s: &Server, path: &str, payload: &[u8], crc: &str) -> Raw {
    let (a, b) = payload.split_at(payload.len() / 2);
    let mut body = Vec::new();
    for part in [a, b] {
        body.extend(format!("{:x}\r\n", part.len()).as_bytes());
        body.extend(part);
        body.extend(b"\r\n");
    }
    body.extend(format!("0\r\nx-amz-checksum-crc32:{crc}\r\n\r\n").as_bytes());
    let decoded = payload.len().to_string();
    let req = SignedReq {
        signed: vec![
            ("content-encoding", "aws-chunked"),
            ("x-amz-decoded-content-length", decoded.as_str()),
            ("x-amz-trailer", "x-amz-checksum-crc32"),
        ],
        payload: SignableBody::StreamingUnsignedPayloadTrailer,
        ..SignedReq::default()
    };
    req.send("PUT", &s.url(path), body).await
}

#[tokio::test]
async fn header_auth_clock_skew() {
    let s = setup().await;
    let req = SignedReq {
        time: SystemTime::now() - Duration::from_secs(3600),
        ..SignedReq::default()
    };
    let r = req.send("GET", &s.url("/shared/obj"), Bytes::new()).await;
    assert_refused(&r, 403, "RequestTimeTooSkewed");
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
    mkbucket(&a, "a-bucket").await.unwrap();
    put(&a, "a-bucket", "k", b"a's data").await;
    // Creating again: 200 for the owner (us-east-1), 409 for anyone else,
    // and nothing is reset.
    let again = a.create_bucket().bucket("a-bucket");
    again.acl(BucketCannedAcl::PublicRead).send().await.unwrap();
    let theirs = mkbucket(&b, "a-bucket").await.unwrap_err();
    assert_eq!(theirs, s3err("BucketAlreadyExists", 409));
    assert_eq!(read(&a, "a-bucket", "k").await.unwrap(), b"a's data");
    assert_eq!(bucket_names(&a).await, ["a-bucket"]);
    assert!(bucket_names(&b).await.is_empty());
    let listed = a.list_buckets().send().await.unwrap();
    assert_eq!(listed.owner().unwrap().id(), Some(a_id.as_str()));
    assert_eq!(listed.owner().unwrap().display_name(), Some("Owner A"));

    // Private by default: b and anonymous callers get nothing, not even
    // whether a key exists; a missing bucket is 404 for everyone.
    let code_of =
        async |c: &aws_sdk_s3::Client, k: &str| read(c, "a-bucket", k).await.unwrap_err().0;
    assert_eq!(code_of(&b, "k").await, "AccessDenied");
    assert_eq!(code_of(&b, "nope").await, "AccessDenied");
    assert_eq!(code_of(&a, "nope").await, "NoSuchKey");
    let anon = |path: &str| {
        let url = s.url(path);
        async move { raw_get(&url).await }
    };
    assert_eq!(anon("/a-bucket/k").await.status, 403);
    let missing = anon("/no-such-bucket/k").await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.xml("Code").as_deref(), Some("NoSuchBucket"));

    // A public-read object in a private bucket: anyone reads it, nobody
    // lists the bucket.
    let acl = a.put_object_acl().bucket("a-bucket").key("k");
    acl.acl(ObjectCannedAcl::PublicRead).send().await.unwrap();
    let r = anon("/a-bucket/k").await;
    assert_eq!((r.status, r.body.as_ref()), (200, &b"a's data"[..]));
    assert_eq!(anon("/a-bucket").await.status, 403);
    assert_eq!(read(&b, "a-bucket", "k").await.unwrap(), b"a's data");
    let acl = b.get_object_acl().bucket("a-bucket").key("k").send().await;
    assert_eq!(fails(acl).0, "AccessDenied", "READ is not READ_ACP");
    let acl = a.get_object_acl().bucket("a-bucket").key("k").send().await;
    let acl = acl.unwrap();
    assert_eq!(acl.owner().unwrap().id(), Some(a_id.as_str()));
    assert_eq!(acl.grants().len(), 2, "{acl:?}");
    // A new write of the key does not inherit the ACL.
    put(&a, "a-bucket", "k", b"v2").await;
    assert_eq!(anon("/a-bucket/k").await.status, 403);

    // WRITE for b through the bucket ACL: b's objects are b's.
    a.put_bucket_acl()
        .bucket("a-bucket")
        .grant_write(format!("id=\"{b_id}\""))
        .grant_full_control(format!("id=\"{a_id}\""))
        .send()
        .await
        .unwrap();
    put(&b, "a-bucket", "from-b", b"b's").await;
    assert_eq!(read(&b, "a-bucket", "from-b").await.unwrap(), b"b's");
    assert_eq!(
        code_of(&a, "from-b").await,
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
    assert_eq!(read(&a, "a-bucket", "for-a").await.unwrap(), b"for a");
    // Copy needs READ on the source: b cannot copy a's private object.
    let copy = b.copy_object().bucket("a-bucket").key("stolen");
    let copy = copy.copy_source("a-bucket/k").send().await;
    assert_eq!(fails(copy).0, "AccessDenied");
    // Unknown canonical ids and canned + grants are refused.
    let bucket_acl = || a.put_bucket_acl().bucket("a-bucket");
    let unknown = format!("id=\"{}\"", "0".repeat(64));
    let bad = bucket_acl().grant_read(unknown).send().await;
    assert_eq!(fails(bad), s3err("InvalidArgument", 400));
    let both = bucket_acl().acl(BucketCannedAcl::PublicRead);
    let both = both.grant_read(format!("id=\"{b_id}\"")).send().await;
    assert_eq!(fails(both).1, 400);
    // Back to private: b's grant is gone.
    let private = bucket_acl().acl(BucketCannedAcl::Private).send().await;
    private.unwrap();
    let denied = try_put(&b, "a-bucket", "late", b"x").await;
    assert_eq!(denied.unwrap_err().0, "AccessDenied");
}

/// UploadPartCopy (whole and ranged sources, bad ranges, source
/// conditions) and a retried CompleteMultipartUpload, with aws-sdk-s3.
#[tokio::test]
async fn upload_part_copy_and_retried_complete() {
    let (_s, c) = server_with_bucket("mpu").await;
    let src = common::data(6 << 20, 7);
    put(&c, "mpu", "src key+%", &src).await;
    let id = start_upload(&c, "mpu", "dst").await;
    let source = "mpu/src%20key%2B%25";
    let copy_part = |n: i32| {
        let req = c.upload_part_copy().bucket("mpu").key("dst").upload_id(&id);
        req.part_number(n).copy_source(source)
    };
    let p1 = copy_part(1).copy_source_range("bytes=0-5242879").send();
    let p1 = p1.await.unwrap();
    let p2 = copy_part(2).send().await.unwrap();
    for (range, what, want) in [
        ("bytes=5-1", "first > last", ("InvalidArgument", 400)),
        ("bytes=0-6291456", "past the end", ("InvalidRange", 416)),
        ("0-10", "no bytes=", ("InvalidArgument", 400)),
    ] {
        let e = copy_part(3).copy_source_range(range).send().await;
        assert_eq!(fails(e), s3err(want.0, want.1), "{what}");
    }
    let e = copy_part(3).copy_source_if_match("\"0123\"").send().await;
    assert_eq!(fails(e), s3err("PreconditionFailed", 412));
    let etag = |p: &aws_sdk_s3::operation::upload_part_copy::UploadPartCopyOutput| {
        p.copy_part_result().unwrap().e_tag().unwrap().to_owned()
    };
    let parts = [(1, etag(&p1)), (2, etag(&p2))];
    let complete = |parts: &[(i32, String)]| {
        let req = c.complete_multipart_upload().bucket("mpu").key("dst");
        req.upload_id(&id).multipart_upload(completed(parts)).send()
    };
    let first = complete(&parts).await.unwrap();
    let retried = complete(&parts).await.unwrap();
    assert_eq!(first.e_tag(), retried.e_tag());
    let got = read(&c, "mpu", "dst").await.unwrap();
    assert_eq!(got.len(), (5 << 20) + src.len());
    assert!(got[..5 << 20] == src[..5 << 20] && got[5 << 20..] == src[..]);
    // A different part list is not a retry.
    let other = complete(&parts[..1]).await;
    assert_eq!(fails(other).0, "NoSuchUpload");
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
    let put_url = presigned_put(&c, "shared", "upload", presign_for(300)).await;
    for (h, v) in [
        ("x-amz-copy-source", "/private/obj"),
        ("x-amz-acl", "public-read"),
        (
            "x-amz-grant-read",
            "uri=\"http://acs.amazonaws.com/groups/global/AllUsers\"",
        ),
    ] {
        let r = raw("PUT", &put_url, &[(h, v)], Bytes::from_static(b"x")).await;
        assert_eq!(r.status, 403, "{h}: {}", r.text());
        assert_eq!(r.xml("Code").as_deref(), Some("AccessDenied"), "{h}");
        assert!(r.text().contains("not signed"), "{}", r.text());
        assert_ids_match(&r);
        assert!(!exists(&c, "shared", "upload").await, "{h}");
    }
    // The same URL as signed still works, and stays private.
    let r = raw("PUT", &put_url, &[], Bytes::from_static(b"mine")).await;
    assert_status(&r, 200);
    let anon = raw_get(&s.url("/shared/upload")).await;
    assert_eq!(anon.status, 403);

    // UploadPart turned into UploadPartCopy of another bucket's object.
    let id = start_upload(&c, "shared", "mp").await;
    let part_url = c
        .upload_part()
        .bucket("shared")
        .key("mp")
        .upload_id(&id)
        .part_number(1)
        .presigned(presign_for(300))
        .await
        .unwrap();
    let copy = [("x-amz-copy-source", "/private/obj")];
    let r = raw("PUT", part_url.uri(), &copy, Bytes::new()).await;
    assert_status(&r, 403);
    let parts = c.list_parts().bucket("shared").key("mp").upload_id(&id);
    let parts = parts.send().await.unwrap();
    assert!(parts.parts().is_empty(), "{parts:?}");

    // Header auth: an x-amz-* header added after signing is refused too.
    let url = s.url("/shared/hdr");
    let after = |h: (&'static str, &'static str)| SignedReq {
        unsigned: vec![h],
        ..SignedReq::default()
    };
    let r = after(("x-amz-acl", "public-read"))
        .send("PUT", &url, Bytes::from_static(b"x"))
        .await;
    assert_s3_error(&r, 403, "AccessDenied");
    assert!(!exists(&c, "shared", "hdr").await);
    let r = after(copy[0]).send("PUT", &url, Bytes::new()).await;
    assert_status(&r, 403);
    assert!(!exists(&c, "shared", "hdr").await);
    // Signed, the same headers work (the admin may copy and publish).
    let acl = [("x-amz-acl", "public-read")];
    let r = signed_raw("PUT", &url, &acl, Bytes::from_static(b"x")).await;
    assert_status(&r, 200);
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
    let r = raw_get(&v2_presigned(&s, "/shared/obj", century)).await;
    assert_s3_error(&r, 400, "InvalidRequest");
    assert!(r.text().contains("AWS4-HMAC-SHA256"), "{}", r.text());
    let r = raw_get(&v2_presigned(&s, "/shared/obj", unix_now() + 60)).await;
    assert_eq!(r.xml("Code").as_deref(), Some("InvalidRequest"));
    let r = v2_get(&s, "/shared/obj", SystemTime::now()).await;
    assert_s3_error(&r, 400, "InvalidRequest");
    assert_ne!(&r.body[..], b"secret data");

    // Allowed by the operator: the SigV4 limits apply.
    let allowed = Server::start_with(|_| "allow_sigv2: true\n".to_owned());
    let s = setup_on(allowed, &["shared"]).await;
    let r = raw_get(&v2_presigned(&s, "/shared/obj", unix_now() + 60)).await;
    assert_status(&r, 200);
    assert_eq!(&r.body[..], b"secret data");
    let r = raw_get(&v2_presigned(&s, "/shared/obj", century)).await;
    assert_s3_error(&r, 403, "AccessDenied");
    let r = v2_get(&s, "/shared/obj", SystemTime::now()).await;
    assert_status(&r, 200);
    let r = v2_get(
        &s,
        "/shared/obj",
        SystemTime::now() - Duration::from_secs(3600),
    )
    .await;
    assert_s3_error(&r, 403, "RequestTimeTooSkewed");
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
    let get_obj = || c.get_object().bucket("shared").key("obj");
    let got = get_obj().expected_bucket_owner(&other_id).send().await;
    assert_eq!(fails(got), s3err("AccessDenied", 403));
    let got = get_obj().expected_bucket_owner(&admin_id).send().await;
    let body = got.unwrap().body.collect().await.unwrap().into_bytes();
    assert_eq!(body.as_ref(), b"secret data");
    let put = c.put_object().bucket("shared").key("nope");
    let put = put.expected_bucket_owner("123456789012");
    let put = put.body(ByteStream::from_static(b"x")).send().await;
    assert_eq!(fails(put).0, "AccessDenied");
    assert!(!exists(&c, "shared", "nope").await);
    let list = c.list_objects_v2().bucket("shared");
    let list = list.expected_bucket_owner(&other_id).send().await;
    assert_eq!(fails(list).0, "AccessDenied");
    let copy = || c.copy_object().bucket("shared").key("copy");
    let copy_private = || copy().copy_source("private/obj");
    let refused = copy_private().expected_source_bucket_owner(&other_id);
    assert_eq!(fails(refused.send().await).0, "AccessDenied");
    assert!(!exists(&c, "shared", "copy").await);
    copy_private()
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
    let public = b.create_bucket().bucket("pub30");
    public
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
        let r = raw_get(&s.url(path)).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert!(r.text().contains(&b_id), "{path}: {}", r.text());
        assert!(!r.text().contains(OWNER_B.0), "{path}: {}", r.text());
    }
}
