//! Authentication and authorisation against the real binary: SigV4 header
//! and presigned, payload modes, wrong/unknown keys, anonymous requests,
//! per-bucket rights, and request ids on errors s3s raises itself.

mod common;

use std::time::{Duration, SystemTime};

use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use common::{ADMIN, READER, Raw, Server, md5_hex, raw, sign_v4};

fn code<E: ProvideErrorMetadata + std::fmt::Debug>(
    e: SdkError<E, aws_smithy_runtime_api::http::Response>,
) -> (String, u16) {
    let status = e.raw_response().map_or(0, |r| r.status().as_u16());
    match &e {
        SdkError::ServiceError(s) => (s.err().code().unwrap_or("<none>").to_owned(), status),
        other => (format!("<{other:?}>"), status),
    }
}

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
