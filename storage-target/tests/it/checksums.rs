//! S3 flexible checksums against the real binary with aws-sdk-s3: PUT with
//! each algorithm (the SDK computes them; values checked against crc-fast,
//! sha1 and sha2 here), GET/HEAD with checksum mode (the SDK validates the
//! body against a full-object value), wrong and malformed values, multipart
//! COMPOSITE and FULL_OBJECT uploads, ListParts, GetObjectAttributes,
//! CopyObject, and values that survive a restart.

use std::time::SystemTime;

use crate::common::{ADMIN, Server, data, err, raw, sign_v4};
use aws_sdk_s3::Client;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region, RequestChecksumCalculation};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    ChecksumAlgorithm, ChecksumMode, ChecksumType, CompletedMultipartUpload, CompletedPart,
    ObjectAttributes,
};
use base64::Engine as _;
use bytes::Bytes;
use sha2::Digest as _;

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// The checksum of `d`, computed here with the crates directly.
fn sum(a: &ChecksumAlgorithm, d: &[u8]) -> Vec<u8> {
    use crc_fast::CrcAlgorithm as C;
    match a {
        ChecksumAlgorithm::Crc32 => (crc_fast::checksum(C::Crc32IsoHdlc, d) as u32)
            .to_be_bytes()
            .to_vec(),
        ChecksumAlgorithm::Crc32C => (crc_fast::checksum(C::Crc32Iscsi, d) as u32)
            .to_be_bytes()
            .to_vec(),
        ChecksumAlgorithm::Crc64Nvme => crc_fast::checksum(C::Crc64Nvme, d).to_be_bytes().to_vec(),
        ChecksumAlgorithm::Sha1 => sha1::Sha1::digest(d).to_vec(),
        ChecksumAlgorithm::Sha256 => sha2::Sha256::digest(d).to_vec(),
        other => panic!("{other:?}"),
    }
}

const ALL: [ChecksumAlgorithm; 5] = [
    ChecksumAlgorithm::Crc32,
    ChecksumAlgorithm::Crc32C,
    ChecksumAlgorithm::Crc64Nvme,
    ChecksumAlgorithm::Sha1,
    ChecksumAlgorithm::Sha256,
];

/// The value of `a` among an output's five checksum fields.
macro_rules! value_of {
    ($o:expr, $a:expr) => {
        match $a {
            ChecksumAlgorithm::Crc32 => $o.checksum_crc32(),
            ChecksumAlgorithm::Crc32C => $o.checksum_crc32_c(),
            ChecksumAlgorithm::Crc64Nvme => $o.checksum_crc64_nvme(),
            ChecksumAlgorithm::Sha1 => $o.checksum_sha1(),
            ChecksumAlgorithm::Sha256 => $o.checksum_sha256(),
            _ => None,
        }
        .map(str::to_owned)
    };
}

/// How many of the five checksum fields are set.
macro_rules! count_of {
    ($o:expr) => {
        [
            $o.checksum_crc32().is_some(),
            $o.checksum_crc32_c().is_some(),
            $o.checksum_crc64_nvme().is_some(),
            $o.checksum_sha1().is_some(),
            $o.checksum_sha256().is_some(),
        ]
        .iter()
        .filter(|x| **x)
        .count()
    };
}

/// A client that sends checksums only when told to (so a request can go
/// without one).
fn bare_client(s: &Server) -> Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(storage_target::gateway::https_client())
        .region(Region::new("us-east-1"))
        .endpoint_url(&s.endpoint)
        .credentials_provider(Credentials::new(ADMIN.0, ADMIN.1, None, None, "test"))
        .force_path_style(true)
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .build();
    Client::from_conf(conf)
}

async fn exists(c: &Client, b: &str, k: &str) -> bool {
    c.head_object().bucket(b).key(k).send().await.is_ok()
}

#[tokio::test]
async fn put_get_head_with_each_algorithm() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("cks").send().await.unwrap();
    let d = data(300_001, 1);
    for a in ALL {
        let key = format!("obj-{}", a.as_str());
        let want = b64(&sum(&a, &d));
        let put = c
            .put_object()
            .bucket("cks")
            .key(&key)
            .checksum_algorithm(a.clone())
            .body(ByteStream::from(d.clone()))
            .send()
            .await
            .unwrap();
        assert_eq!(value_of!(put, &a).as_deref(), Some(want.as_str()), "{a:?}");
        assert_eq!(put.checksum_type(), Some(&ChecksumType::FullObject));
        // GET with checksum mode: the value and type come back, and the SDK
        // validates the body against the value.
        let got = c
            .get_object()
            .bucket("cks")
            .key(&key)
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await
            .unwrap();
        assert_eq!(value_of!(got, &a).as_deref(), Some(want.as_str()), "{a:?}");
        assert_eq!(count_of!(got), 1);
        assert_eq!(got.checksum_type(), Some(&ChecksumType::FullObject));
        assert!(got.body.collect().await.unwrap().into_bytes() == d);
        let head = c
            .head_object()
            .bucket("cks")
            .key(&key)
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await
            .unwrap();
        assert_eq!(value_of!(head, &a).as_deref(), Some(want.as_str()));
        assert_eq!(head.checksum_type(), Some(&ChecksumType::FullObject));
        // Without checksum mode, and for a range: no checksum.
        let head = c
            .head_object()
            .bucket("cks")
            .key(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(count_of!(head), 0);
        assert!(head.checksum_type().is_none());
        let ranged = c
            .get_object()
            .bucket("cks")
            .key(&key)
            .range("bytes=0-9")
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await
            .unwrap();
        assert_eq!(count_of!(ranged), 0);
        assert_eq!(ranged.body.collect().await.unwrap().into_bytes().len(), 10);
    }
    // A value given as a header (not a trailer) is stored too.
    let v = b64(&sum(&ChecksumAlgorithm::Sha256, b"hello"));
    c.put_object()
        .bucket("cks")
        .key("hdr")
        .checksum_sha256(&v)
        .body(ByteStream::from_static(b"hello"))
        .send()
        .await
        .unwrap();
    let head = c
        .head_object()
        .bucket("cks")
        .key("hdr")
        .checksum_mode(ChecksumMode::Enabled)
        .send()
        .await
        .unwrap();
    assert_eq!(head.checksum_sha256(), Some(v.as_str()));
    // Listings name each object's algorithm and type.
    let list = c.list_objects_v2().bucket("cks").send().await.unwrap();
    for o in list.contents() {
        let key = o.key().unwrap();
        let want = match key.strip_prefix("obj-") {
            Some(name) => ChecksumAlgorithm::from(name),
            None => ChecksumAlgorithm::Sha256,
        };
        assert_eq!(o.checksum_algorithm(), [want], "{key}");
        assert_eq!(o.checksum_type(), Some(&ChecksumType::FullObject));
    }
    // Stored on disk: the values survive a restart.
    let mut s = s;
    s.restart();
    let c = s.admin();
    let head = c
        .head_object()
        .bucket("cks")
        .key("obj-CRC32C")
        .checksum_mode(ChecksumMode::Enabled)
        .send()
        .await
        .unwrap();
    assert_eq!(
        head.checksum_crc32_c(),
        Some(b64(&sum(&ChecksumAlgorithm::Crc32C, &d)).as_str())
    );
}

#[tokio::test]
async fn wrong_and_malformed_values_store_nothing() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("bad").send().await.unwrap();
    c.put_object()
        .bucket("bad")
        .key("kept")
        .body(ByteStream::from_static(b"old"))
        .send()
        .await
        .unwrap();
    for (a, key) in [
        (ChecksumAlgorithm::Crc32, "new"),
        (ChecksumAlgorithm::Crc64Nvme, "kept"),
        (ChecksumAlgorithm::Sha1, "new"),
    ] {
        let wrong = b64(&sum(&a, b"not the body"));
        let mut req = c
            .put_object()
            .bucket("bad")
            .key(key)
            .body(ByteStream::from_static(b"the body"));
        req = match a {
            ChecksumAlgorithm::Crc32 => req.checksum_crc32(&wrong),
            ChecksumAlgorithm::Crc64Nvme => req.checksum_crc64_nvme(&wrong),
            _ => req.checksum_sha1(&wrong),
        };
        let (code, status) = err(req.send().await.unwrap_err());
        assert_eq!((code.as_str(), status), ("BadDigest", 400), "{a:?}");
    }
    assert!(!exists(&c, "bad", "new").await);
    let old = c
        .get_object()
        .bucket("bad")
        .key("kept")
        .send()
        .await
        .unwrap();
    assert_eq!(&old.body.collect().await.unwrap().into_bytes()[..], b"old");
    // Not base64, or the wrong length for the algorithm: InvalidRequest.
    for v in ["not base64!", "AAAA", "AAAAAAAAAAA="] {
        let (code, status) = err(c
            .put_object()
            .bucket("bad")
            .key("new")
            .checksum_crc32(v)
            .body(ByteStream::from_static(b"x"))
            .send()
            .await
            .unwrap_err());
        assert_eq!((code.as_str(), status), ("InvalidRequest", 400), "{v}");
    }
    assert!(!exists(&c, "bad", "new").await);
    // The trailer path (aws-chunked, STREAMING-UNSIGNED-PAYLOAD-TRAILER)
    // with a wrong value, then the right one.
    let url = s.url("/bad/trailer");
    let body = format!(
        "5\r\nhello\r\n0\r\nx-amz-checksum-crc32:{}\r\n\r\n",
        b64(&sum(&ChecksumAlgorithm::Crc32, b"HELLO"))
    );
    let extra = [
        ("content-encoding", "aws-chunked"),
        ("x-amz-decoded-content-length", "5"),
        ("x-amz-trailer", "x-amz-checksum-crc32"),
        ("x-amz-sdk-checksum-algorithm", "CRC32"),
    ];
    let send = |body: String| {
        let headers = sign_v4(
            "PUT",
            &url,
            &extra,
            aws_sigv4::http_request::SignableBody::StreamingUnsignedPayloadTrailer,
            SystemTime::now(),
        );
        let url = url.clone();
        async move {
            let hs: Vec<(&str, &str)> = headers
                .iter()
                .filter(|(k, _)| k != "host")
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            raw("PUT", &url, &hs, Bytes::from(body)).await
        }
    };
    let r = send(body).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.xml("Code").as_deref(), Some("BadDigest"), "{}", r.text());
    assert!(!exists(&c, "bad", "trailer").await);
    // The same with the right trailer: stored with its CRC32.
    let right = b64(&sum(&ChecksumAlgorithm::Crc32, b"hello"));
    let r = send(format!(
        "5\r\nhello\r\n0\r\nx-amz-checksum-crc32:{right}\r\n\r\n"
    ))
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-amz-checksum-crc32"), Some(right.as_str()));
    let head = c
        .head_object()
        .bucket("bad")
        .key("trailer")
        .checksum_mode(ChecksumMode::Enabled)
        .send()
        .await
        .unwrap();
    assert_eq!(head.checksum_crc32(), Some(right.as_str()));
}

#[tokio::test]
async fn a_put_without_checksum_gets_crc64nvme() {
    let s = Server::start();
    let c = bare_client(&s);
    c.create_bucket().bucket("dflt").send().await.unwrap();
    let d = data(70_000, 3);
    let put = c
        .put_object()
        .bucket("dflt")
        .key("k")
        .body(ByteStream::from(d.clone()))
        .send()
        .await
        .unwrap();
    let want = b64(&sum(&ChecksumAlgorithm::Crc64Nvme, &d));
    assert_eq!(put.checksum_crc64_nvme(), Some(want.as_str()));
    let got = c
        .get_object()
        .bucket("dflt")
        .key("k")
        .checksum_mode(ChecksumMode::Enabled)
        .send()
        .await
        .unwrap();
    assert_eq!(got.checksum_crc64_nvme(), Some(want.as_str()));
    assert_eq!(count_of!(got), 1);
    assert!(got.body.collect().await.unwrap().into_bytes() == d);
}

async fn upload_parts(
    c: &Client,
    b: &str,
    k: &str,
    id: &str,
    a: &ChecksumAlgorithm,
    parts: &[Vec<u8>],
) -> Vec<CompletedPart> {
    let mut out = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let n = i32::try_from(i + 1).unwrap();
        let r = c
            .upload_part()
            .bucket(b)
            .key(k)
            .upload_id(id)
            .part_number(n)
            .checksum_algorithm(a.clone())
            .body(ByteStream::from(p.clone()))
            .send()
            .await
            .unwrap();
        let v = value_of!(r, a).expect("part checksum returned");
        assert_eq!(v, b64(&sum(a, p)), "part {n}");
        let mut cp = CompletedPart::builder()
            .part_number(n)
            .e_tag(r.e_tag().unwrap());
        cp = match a {
            ChecksumAlgorithm::Crc32 => cp.checksum_crc32(v),
            ChecksumAlgorithm::Crc32C => cp.checksum_crc32_c(v),
            ChecksumAlgorithm::Crc64Nvme => cp.checksum_crc64_nvme(v),
            ChecksumAlgorithm::Sha1 => cp.checksum_sha1(v),
            _ => cp.checksum_sha256(v),
        };
        out.push(cp.build());
    }
    out
}

fn mpu(parts: Vec<CompletedPart>) -> CompletedMultipartUpload {
    CompletedMultipartUpload::builder()
        .set_parts(Some(parts))
        .build()
}

#[tokio::test]
async fn multipart_composite() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("mpu").send().await.unwrap();
    let parts = vec![data(5 << 20, 21), data(5 << 20, 22), data(123_457, 23)];
    let whole: Vec<u8> = parts.concat();
    for a in [ChecksumAlgorithm::Crc32, ChecksumAlgorithm::Sha256] {
        let key = format!("comp-{}", a.as_str());
        let up = c
            .create_multipart_upload()
            .bucket("mpu")
            .key(&key)
            .checksum_algorithm(a.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(up.checksum_algorithm(), Some(&a));
        assert_eq!(up.checksum_type(), Some(&ChecksumType::Composite));
        let id = up.upload_id().unwrap().to_owned();
        let done = upload_parts(&c, "mpu", &key, &id, &a, &parts).await;
        // ListParts: the upload's algorithm and type, each part's value.
        let lp = c
            .list_parts()
            .bucket("mpu")
            .key(&key)
            .upload_id(&id)
            .send()
            .await
            .unwrap();
        assert_eq!(lp.checksum_algorithm(), Some(&a));
        assert_eq!(lp.checksum_type(), Some(&ChecksumType::Composite));
        for (p, d) in lp.parts().iter().zip(&parts) {
            assert_eq!(value_of!(p, &a), Some(b64(&sum(&a, d))));
        }
        let ups = c
            .list_multipart_uploads()
            .bucket("mpu")
            .send()
            .await
            .unwrap();
        let u = ups
            .uploads()
            .iter()
            .find(|u| u.upload_id() == Some(id.as_str()))
            .unwrap();
        assert_eq!(u.checksum_algorithm(), Some(&a));
        // A Complete that leaves out a part's checksum, or lists a wrong
        // one, is refused and the upload stays.
        let mut missing = done.clone();
        missing[1] = CompletedPart::builder()
            .part_number(2)
            .e_tag(done[1].e_tag().unwrap())
            .build();
        let (code, status) = err(c
            .complete_multipart_upload()
            .bucket("mpu")
            .key(&key)
            .upload_id(&id)
            .multipart_upload(mpu(missing))
            .send()
            .await
            .unwrap_err());
        assert_eq!((code.as_str(), status), ("InvalidRequest", 400));
        let mut wrong = done.clone();
        let mut b = CompletedPart::builder()
            .part_number(1)
            .e_tag(done[0].e_tag().unwrap());
        let other = b64(&sum(&a, b"other"));
        b = if a == ChecksumAlgorithm::Crc32 {
            b.checksum_crc32(other)
        } else {
            b.checksum_sha256(other)
        };
        wrong[0] = b.build();
        let (code, status) = err(c
            .complete_multipart_upload()
            .bucket("mpu")
            .key(&key)
            .upload_id(&id)
            .multipart_upload(mpu(wrong))
            .send()
            .await
            .unwrap_err());
        assert_eq!((code.as_str(), status), ("InvalidPart", 400));
        // The right list: checksum of the concatenated part checksums, -3.
        let raws: Vec<u8> = parts.iter().flat_map(|p| sum(&a, p)).collect();
        let want = format!("{}-3", b64(&sum(&a, &raws)));
        let out = c
            .complete_multipart_upload()
            .bucket("mpu")
            .key(&key)
            .upload_id(&id)
            .multipart_upload(mpu(done))
            .send()
            .await
            .unwrap();
        assert_eq!(value_of!(out, &a), Some(want.clone()));
        assert_eq!(out.checksum_type(), Some(&ChecksumType::Composite));
        let got = c
            .get_object()
            .bucket("mpu")
            .key(&key)
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await
            .unwrap();
        assert_eq!(value_of!(got, &a), Some(want.clone()));
        assert_eq!(got.checksum_type(), Some(&ChecksumType::Composite));
        assert!(got.body.collect().await.unwrap().into_bytes() == whole);
        // GetObjectAttributes: ETag, checksum (without "-3"), parts.
        let at = c
            .get_object_attributes()
            .bucket("mpu")
            .key(&key)
            .object_attributes(ObjectAttributes::Etag)
            .object_attributes(ObjectAttributes::Checksum)
            .object_attributes(ObjectAttributes::ObjectParts)
            .object_attributes(ObjectAttributes::ObjectSize)
            .object_attributes(ObjectAttributes::StorageClass)
            .send()
            .await
            .unwrap();
        assert!(at.e_tag().unwrap().trim_matches('"').ends_with("-3"));
        assert_eq!(at.object_size(), Some(whole.len() as i64));
        assert_eq!(at.storage_class().map(|s| s.as_str()), Some("STANDARD"));
        assert!(at.last_modified().is_some());
        let ck = at.checksum().unwrap();
        assert_eq!(value_of!(ck, &a), Some(b64(&sum(&a, &raws))));
        assert_eq!(ck.checksum_type(), Some(&ChecksumType::Composite));
        let op = at.object_parts().unwrap();
        assert_eq!(op.total_parts_count(), Some(3));
        assert_eq!(op.parts().len(), 3);
        for (i, (p, d)) in op.parts().iter().zip(&parts).enumerate() {
            assert_eq!(p.part_number(), Some(i32::try_from(i + 1).unwrap()));
            assert_eq!(p.size(), Some(d.len() as i64));
            assert_eq!(value_of!(p, &a), Some(b64(&sum(&a, d))));
        }
        // Paging through the parts.
        let at = c
            .get_object_attributes()
            .bucket("mpu")
            .key(&key)
            .object_attributes(ObjectAttributes::ObjectParts)
            .max_parts(2)
            .send()
            .await
            .unwrap();
        let op = at.object_parts().unwrap();
        assert_eq!(op.parts().len(), 2);
        assert_eq!(op.is_truncated(), Some(true));
        assert_eq!(op.next_part_number_marker(), Some("2"));
        assert!(at.e_tag().is_none() && at.checksum().is_none());
        let at = c
            .get_object_attributes()
            .bucket("mpu")
            .key(&key)
            .object_attributes(ObjectAttributes::ObjectParts)
            .part_number_marker("2")
            .send()
            .await
            .unwrap();
        let op = at.object_parts().unwrap();
        assert_eq!(op.parts().len(), 1);
        assert_eq!(op.parts()[0].part_number(), Some(3));
        assert_eq!(op.is_truncated(), Some(false));
    }
}

#[tokio::test]
async fn multipart_full_object() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("fob").send().await.unwrap();
    let parts = vec![data(5 << 20, 31), data((5 << 20) + 17, 32), data(9, 33)];
    let whole: Vec<u8> = parts.concat();
    for (a, explicit) in [
        (ChecksumAlgorithm::Crc64Nvme, false),
        (ChecksumAlgorithm::Crc32, true),
        (ChecksumAlgorithm::Crc32C, true),
    ] {
        let key = format!("full-{}", a.as_str());
        let mut create = c
            .create_multipart_upload()
            .bucket("fob")
            .key(&key)
            .checksum_algorithm(a.clone());
        if explicit {
            create = create.checksum_type(ChecksumType::FullObject);
        }
        let up = create.send().await.unwrap();
        assert_eq!(up.checksum_type(), Some(&ChecksumType::FullObject));
        let id = up.upload_id().unwrap().to_owned();
        let done = upload_parts(&c, "fob", &key, &id, &a, &parts).await;
        let lp = c
            .list_parts()
            .bucket("fob")
            .key(&key)
            .upload_id(&id)
            .send()
            .await
            .unwrap();
        assert_eq!(lp.checksum_type(), Some(&ChecksumType::FullObject));
        let want = b64(&sum(&a, &whole));
        let complete = |v: &str| {
            let mut r = c
                .complete_multipart_upload()
                .bucket("fob")
                .key(&key)
                .upload_id(&id)
                .checksum_type(ChecksumType::FullObject)
                .multipart_upload(mpu(done.clone()));
            r = match a {
                ChecksumAlgorithm::Crc64Nvme => r.checksum_crc64_nvme(v),
                ChecksumAlgorithm::Crc32 => r.checksum_crc32(v),
                _ => r.checksum_crc32_c(v),
            };
            r.send()
        };
        // A wrong whole-object value is BadDigest, the upload stays.
        let (code, status) = err(complete(&b64(&sum(&a, b"x"))).await.unwrap_err());
        assert_eq!((code.as_str(), status), ("BadDigest", 400));
        assert!(!exists(&c, "fob", &key).await);
        let out = complete(&want).await.unwrap();
        assert_eq!(value_of!(out, &a), Some(want.clone()));
        assert_eq!(out.checksum_type(), Some(&ChecksumType::FullObject));
        // GET validates the whole body against the combined CRC.
        let got = c
            .get_object()
            .bucket("fob")
            .key(&key)
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await
            .unwrap();
        assert_eq!(value_of!(got, &a), Some(want.clone()));
        assert_eq!(got.checksum_type(), Some(&ChecksumType::FullObject));
        assert!(got.body.collect().await.unwrap().into_bytes() == whole);
    }
    // An upload created without a checksum: parts may carry one (checked),
    // the object has none.
    let up = c
        .create_multipart_upload()
        .bucket("fob")
        .key("plain")
        .send()
        .await
        .unwrap();
    assert!(up.checksum_algorithm().is_none());
    let id = up.upload_id().unwrap().to_owned();
    let done = upload_parts(
        &c,
        "fob",
        "plain",
        &id,
        &ChecksumAlgorithm::Crc32,
        &parts[2..],
    )
    .await;
    let out = c
        .complete_multipart_upload()
        .bucket("fob")
        .key("plain")
        .upload_id(&id)
        .multipart_upload(mpu(done))
        .send()
        .await
        .unwrap();
    assert_eq!(count_of!(out), 0);
}

#[tokio::test]
async fn multipart_rules() {
    let s = Server::start();
    let c = s.admin();
    let bare = bare_client(&s);
    c.create_bucket().bucket("rules").send().await.unwrap();
    for (a, t) in [
        (ChecksumAlgorithm::Crc64Nvme, ChecksumType::Composite),
        (ChecksumAlgorithm::Sha256, ChecksumType::FullObject),
        (ChecksumAlgorithm::Sha1, ChecksumType::FullObject),
    ] {
        let (code, status) = err(c
            .create_multipart_upload()
            .bucket("rules")
            .key("k")
            .checksum_algorithm(a.clone())
            .checksum_type(t.clone())
            .send()
            .await
            .unwrap_err());
        assert_eq!(
            (code.as_str(), status),
            ("InvalidRequest", 400),
            "{a:?} {t:?}"
        );
    }
    // A type without an algorithm.
    let (code, _) = err(c
        .create_multipart_upload()
        .bucket("rules")
        .key("k")
        .checksum_type(ChecksumType::FullObject)
        .send()
        .await
        .unwrap_err());
    assert_eq!(code, "InvalidRequest");
    // An upload created with SHA1 takes only parts that carry a SHA1.
    let id = c
        .create_multipart_upload()
        .bucket("rules")
        .key("k")
        .checksum_algorithm(ChecksumAlgorithm::Sha1)
        .send()
        .await
        .unwrap()
        .upload_id()
        .unwrap()
        .to_owned();
    let (code, status) = err(bare
        .upload_part()
        .bucket("rules")
        .key("k")
        .upload_id(&id)
        .part_number(1)
        .body(ByteStream::from_static(b"part"))
        .send()
        .await
        .unwrap_err());
    assert_eq!((code.as_str(), status), ("InvalidRequest", 400));
    let (code, _) = err(c
        .upload_part()
        .bucket("rules")
        .key("k")
        .upload_id(&id)
        .part_number(1)
        .checksum_algorithm(ChecksumAlgorithm::Crc32)
        .body(ByteStream::from_static(b"part"))
        .send()
        .await
        .unwrap_err());
    assert_eq!(code, "InvalidRequest");
    // A wrong part checksum: BadDigest, no part stored.
    let (code, status) = err(c
        .upload_part()
        .bucket("rules")
        .key("k")
        .upload_id(&id)
        .part_number(1)
        .checksum_sha1(b64(&sum(&ChecksumAlgorithm::Sha1, b"other")))
        .body(ByteStream::from_static(b"part"))
        .send()
        .await
        .unwrap_err());
    assert_eq!((code.as_str(), status), ("BadDigest", 400));
    let lp = c
        .list_parts()
        .bucket("rules")
        .key("k")
        .upload_id(&id)
        .send()
        .await
        .unwrap();
    assert!(lp.parts().is_empty());
    let done = upload_parts(
        &c,
        "rules",
        "k",
        &id,
        &ChecksumAlgorithm::Sha1,
        &[b"part".to_vec()],
    )
    .await;
    // A Complete naming the other type is refused.
    let (code, _) = err(c
        .complete_multipart_upload()
        .bucket("rules")
        .key("k")
        .upload_id(&id)
        .checksum_type(ChecksumType::FullObject)
        .multipart_upload(mpu(done.clone()))
        .send()
        .await
        .unwrap_err());
    assert_eq!(code, "InvalidRequest");
    let out = c
        .complete_multipart_upload()
        .bucket("rules")
        .key("k")
        .upload_id(&id)
        .multipart_upload(mpu(done))
        .send()
        .await
        .unwrap();
    let raw_part = sum(&ChecksumAlgorithm::Sha1, b"part");
    assert_eq!(
        out.checksum_sha1(),
        Some(format!("{}-1", b64(&sum(&ChecksumAlgorithm::Sha1, &raw_part))).as_str())
    );
}

#[tokio::test]
async fn copy_and_attributes() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("cpy").send().await.unwrap();
    let d = data(1_000_000, 41);
    c.put_object()
        .bucket("cpy")
        .key("src")
        .checksum_algorithm(ChecksumAlgorithm::Crc32C)
        .body(ByteStream::from(d.clone()))
        .send()
        .await
        .unwrap();
    let crc32c = b64(&sum(&ChecksumAlgorithm::Crc32C, &d));
    // The copy keeps the source's checksum.
    let out = c
        .copy_object()
        .bucket("cpy")
        .key("same")
        .copy_source("cpy/src")
        .send()
        .await
        .unwrap();
    let r = out.copy_object_result().unwrap();
    assert_eq!(r.checksum_crc32_c(), Some(crc32c.as_str()));
    assert_eq!(r.checksum_type(), Some(&ChecksumType::FullObject));
    let head = c
        .head_object()
        .bucket("cpy")
        .key("same")
        .checksum_mode(ChecksumMode::Enabled)
        .send()
        .await
        .unwrap();
    assert_eq!(head.checksum_crc32_c(), Some(crc32c.as_str()));
    // Asked for another algorithm: computed over the copied bytes.
    let sha = b64(&sum(&ChecksumAlgorithm::Sha256, &d));
    let out = c
        .copy_object()
        .bucket("cpy")
        .key("sha")
        .copy_source("cpy/src")
        .checksum_algorithm(ChecksumAlgorithm::Sha256)
        .send()
        .await
        .unwrap();
    assert_eq!(
        out.copy_object_result().unwrap().checksum_sha256(),
        Some(sha.as_str())
    );
    let got = c
        .get_object()
        .bucket("cpy")
        .key("sha")
        .checksum_mode(ChecksumMode::Enabled)
        .send()
        .await
        .unwrap();
    assert_eq!(got.checksum_sha256(), Some(sha.as_str()));
    assert_eq!(count_of!(got), 1);
    assert!(got.body.collect().await.unwrap().into_bytes() == d);
    // UploadPartCopy into an upload with a checksum algorithm: the part's
    // checksum is computed over the copied bytes.
    let id = c
        .create_multipart_upload()
        .bucket("cpy")
        .key("mpc")
        .checksum_algorithm(ChecksumAlgorithm::Crc64Nvme)
        .send()
        .await
        .unwrap()
        .upload_id()
        .unwrap()
        .to_owned();
    let part = c
        .upload_part_copy()
        .bucket("cpy")
        .key("mpc")
        .upload_id(&id)
        .part_number(1)
        .copy_source("cpy/src")
        .send()
        .await
        .unwrap();
    let crc64 = b64(&sum(&ChecksumAlgorithm::Crc64Nvme, &d));
    let r = part.copy_part_result().unwrap();
    assert_eq!(r.checksum_crc64_nvme(), Some(crc64.as_str()));
    let out = c
        .complete_multipart_upload()
        .bucket("cpy")
        .key("mpc")
        .upload_id(&id)
        .multipart_upload(mpu(vec![
            CompletedPart::builder()
                .part_number(1)
                .e_tag(r.e_tag().unwrap())
                .build(),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(out.checksum_crc64_nvme(), Some(crc64.as_str()));
    // GetObjectAttributes of a single-part object: no ObjectParts.
    let at = c
        .get_object_attributes()
        .bucket("cpy")
        .key("src")
        .object_attributes(ObjectAttributes::Checksum)
        .object_attributes(ObjectAttributes::ObjectParts)
        .object_attributes(ObjectAttributes::ObjectSize)
        .send()
        .await
        .unwrap();
    assert_eq!(
        at.checksum().unwrap().checksum_crc32_c(),
        Some(crc32c.as_str())
    );
    assert_eq!(
        at.checksum().unwrap().checksum_type(),
        Some(&ChecksumType::FullObject)
    );
    assert!(at.object_parts().is_none());
    assert_eq!(at.object_size(), Some(d.len() as i64));
    assert!(at.e_tag().is_none());
    let (code, status) = err(c
        .get_object_attributes()
        .bucket("cpy")
        .key("missing")
        .object_attributes(ObjectAttributes::Etag)
        .send()
        .await
        .unwrap_err());
    assert_eq!((code.as_str(), status), ("NoSuchKey", 404));
    // An unknown attribute name.
    let (code, status) = err(c
        .get_object_attributes()
        .bucket("cpy")
        .key("src")
        .object_attributes(ObjectAttributes::from("Bogus"))
        .send()
        .await
        .unwrap_err());
    assert_eq!((code.as_str(), status), ("InvalidArgument", 400));
}
