//! S3 flexible checksums against the real binary with aws-sdk-s3: PUT with
//! each algorithm (the SDK computes them; values checked against crc-fast,
//! sha1 and sha2 here), GET/HEAD with checksum mode (the SDK validates the
//! body against a full-object value), wrong and malformed values, multipart
//! COMPOSITE and FULL_OBJECT uploads, ListParts, GetObjectAttributes,
//! CopyObject, and values that survive a restart.

use crate::common::{ADMIN, Server, data};
use crate::support::{
    SignedReq, assert_s3_error, assert_status, complete, exists, fails, list_parts, mkbucket, put,
    read, s3err, server_with_bucket,
};
use aws_sdk_s3::Client;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region, RequestChecksumCalculation};
use aws_sdk_s3::operation::create_multipart_upload::builders::CreateMultipartUploadFluentBuilder;
use aws_sdk_s3::operation::get_object::GetObjectOutput;
use aws_sdk_s3::operation::get_object_attributes::builders::GetObjectAttributesFluentBuilder;
use aws_sdk_s3::operation::head_object::HeadObjectOutput;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    ChecksumAlgorithm, ChecksumMode, ChecksumType, CompletedMultipartUpload, CompletedPart,
    ObjectAttributes,
};
use base64::Engine as _;
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

/// GetObject of `b/k` with checksum mode on.
async fn get_checked(c: &Client, b: &str, k: &str) -> GetObjectOutput {
    let req = c.get_object().bucket(b).key(k);
    req.checksum_mode(ChecksumMode::Enabled)
        .send()
        .await
        .unwrap()
}

/// HeadObject of `b/k` with checksum mode on.
async fn head_checked(c: &Client, b: &str, k: &str) -> HeadObjectOutput {
    let req = c.head_object().bucket(b).key(k);
    req.checksum_mode(ChecksumMode::Enabled)
        .send()
        .await
        .unwrap()
}

/// The body of a GetObject.
async fn body(o: GetObjectOutput) -> Vec<u8> {
    o.body.collect().await.unwrap().to_vec()
}

/// CreateMultipartUpload of `b/k` with algorithm `a`.
fn create_with(
    c: &Client,
    b: &str,
    k: &str,
    a: &ChecksumAlgorithm,
) -> CreateMultipartUploadFluentBuilder {
    c.create_multipart_upload()
        .bucket(b)
        .key(k)
        .checksum_algorithm(a.clone())
}

/// GetObjectAttributes of `b/k`, asking for `attributes`.
fn attributes(
    c: &Client,
    b: &str,
    k: &str,
    attributes: &[ObjectAttributes],
) -> GetObjectAttributesFluentBuilder {
    let req = c.get_object_attributes().bucket(b).key(k);
    req.set_object_attributes(Some(attributes.to_vec()))
}

#[tokio::test]
async fn put_get_head_with_each_algorithm() {
    let (s, c) = server_with_bucket("cks").await;
    let d = data(300_001, 1);
    for a in ALL {
        let key = format!("obj-{}", a.as_str());
        let want = b64(&sum(&a, &d));
        let put = c
            .put_object()
            .bucket("cks")
            .key(&key)
            .checksum_algorithm(a.clone());
        let put = put.body(ByteStream::from(d.clone())).send().await.unwrap();
        assert_eq!(value_of!(put, &a).as_deref(), Some(want.as_str()), "{a:?}");
        assert_eq!(put.checksum_type(), Some(&ChecksumType::FullObject));
        // GET with checksum mode: the value and type come back, and the SDK
        // validates the body against the value.
        let got = get_checked(&c, "cks", &key).await;
        assert_eq!(value_of!(got, &a).as_deref(), Some(want.as_str()), "{a:?}");
        assert_eq!(count_of!(got), 1);
        assert_eq!(got.checksum_type(), Some(&ChecksumType::FullObject));
        assert!(body(got).await == d);
        let head = head_checked(&c, "cks", &key).await;
        assert_eq!(value_of!(head, &a).as_deref(), Some(want.as_str()));
        assert_eq!(head.checksum_type(), Some(&ChecksumType::FullObject));
        // Without checksum mode, and for a range: no checksum.
        let head = crate::support::head(&c, "cks", &key).await.unwrap();
        assert_eq!(count_of!(head), 0);
        assert!(head.checksum_type().is_none());
        let ranged = c.get_object().bucket("cks").key(&key).range("bytes=0-9");
        let ranged = ranged.checksum_mode(ChecksumMode::Enabled).send().await;
        let ranged = ranged.unwrap();
        assert_eq!(count_of!(ranged), 0);
        assert_eq!(body(ranged).await.len(), 10);
    }
    // A value given as a header (not a trailer) is stored too.
    let v = b64(&sum(&ChecksumAlgorithm::Sha256, b"hello"));
    let put = c.put_object().bucket("cks").key("hdr").checksum_sha256(&v);
    put.body(ByteStream::from_static(b"hello"))
        .send()
        .await
        .unwrap();
    let head = head_checked(&c, "cks", "hdr").await;
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
    let head = head_checked(&s.admin(), "cks", "obj-CRC32C").await;
    let want = b64(&sum(&ChecksumAlgorithm::Crc32C, &d));
    assert_eq!(head.checksum_crc32_c(), Some(want.as_str()));
}

#[tokio::test]
async fn wrong_and_malformed_values_store_nothing() {
    let (s, c) = server_with_bucket("bad").await;
    put(&c, "bad", "kept", b"old").await;
    for (a, key) in [
        (ChecksumAlgorithm::Crc32, "new"),
        (ChecksumAlgorithm::Crc64Nvme, "kept"),
        (ChecksumAlgorithm::Sha1, "new"),
    ] {
        let wrong = b64(&sum(&a, b"not the body"));
        let req = c.put_object().bucket("bad").key(key);
        let req = req.body(ByteStream::from_static(b"the body"));
        let req = match a {
            ChecksumAlgorithm::Crc32 => req.checksum_crc32(&wrong),
            ChecksumAlgorithm::Crc64Nvme => req.checksum_crc64_nvme(&wrong),
            _ => req.checksum_sha1(&wrong),
        };
        let (code, status) = fails(req.send().await);
        assert_eq!((code.as_str(), status), ("BadDigest", 400), "{a:?}");
    }
    assert!(!exists(&c, "bad", "new").await);
    assert_eq!(read(&c, "bad", "kept").await.unwrap(), b"old");
    // Not base64, or the wrong length for the algorithm: InvalidRequest.
    for v in ["not base64!", "AAAA", "AAAAAAAAAAA="] {
        let req = c.put_object().bucket("bad").key("new").checksum_crc32(v);
        let (code, status) = fails(req.body(ByteStream::from_static(b"x")).send().await);
        assert_eq!((code.as_str(), status), ("InvalidRequest", 400), "{v}");
    }
    assert!(!exists(&c, "bad", "new").await);
    // The trailer path (aws-chunked, STREAMING-UNSIGNED-PAYLOAD-TRAILER)
    // with a wrong value, then the right one.
    let url = s.url("/bad/trailer");
    let trailed = |crc: String| format!("5\r\nhello\r\n0\r\nx-amz-checksum-crc32:{crc}\r\n\r\n");
    let req = SignedReq {
        signed: vec![
            ("content-encoding", "aws-chunked"),
            ("x-amz-decoded-content-length", "5"),
            ("x-amz-trailer", "x-amz-checksum-crc32"),
            ("x-amz-sdk-checksum-algorithm", "CRC32"),
        ],
        payload: aws_sigv4::http_request::SignableBody::StreamingUnsignedPayloadTrailer,
        ..SignedReq::default()
    };
    let wrong = trailed(b64(&sum(&ChecksumAlgorithm::Crc32, b"HELLO")));
    let r = req.send("PUT", &url, wrong).await;
    assert_s3_error(&r, 400, "BadDigest");
    assert!(!exists(&c, "bad", "trailer").await);
    // The same with the right trailer: stored with its CRC32.
    let right = b64(&sum(&ChecksumAlgorithm::Crc32, b"hello"));
    let r = req.send("PUT", &url, trailed(right.clone())).await;
    assert_status(&r, 200);
    assert_eq!(r.header("x-amz-checksum-crc32"), Some(right.as_str()));
    let head = head_checked(&c, "bad", "trailer").await;
    assert_eq!(head.checksum_crc32(), Some(right.as_str()));
}

#[tokio::test]
async fn a_put_without_checksum_gets_crc64nvme() {
    let s = Server::start();
    let c = bare_client(&s);
    mkbucket(&c, "dflt").await.unwrap();
    let d = data(70_000, 3);
    let put = c.put_object().bucket("dflt").key("k");
    let put = put.body(ByteStream::from(d.clone())).send().await.unwrap();
    let want = b64(&sum(&ChecksumAlgorithm::Crc64Nvme, &d));
    assert_eq!(put.checksum_crc64_nvme(), Some(want.as_str()));
    let got = get_checked(&c, "dflt", "k").await;
    assert_eq!(got.checksum_crc64_nvme(), Some(want.as_str()));
    assert_eq!(count_of!(got), 1);
    assert!(body(got).await == d);
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
        let req = c.upload_part().bucket(b).key(k).upload_id(id);
        let req = req.part_number(n).checksum_algorithm(a.clone());
        let r = req.body(ByteStream::from(p.clone())).send().await.unwrap();
        let v = value_of!(r, a).expect("part checksum returned");
        assert_eq!(v, b64(&sum(a, p)), "part {n}");
        out.push(with_checksum(part(n, r.e_tag().unwrap()), a, v).build());
    }
    out
}

/// A completed part `n` with ETag `etag`.
fn part(n: i32, etag: &str) -> aws_sdk_s3::types::builders::CompletedPartBuilder {
    CompletedPart::builder().part_number(n).e_tag(etag)
}

/// `p` with the checksum `v` of algorithm `a`.
fn with_checksum(
    p: aws_sdk_s3::types::builders::CompletedPartBuilder,
    a: &ChecksumAlgorithm,
    v: String,
) -> aws_sdk_s3::types::builders::CompletedPartBuilder {
    match a {
        ChecksumAlgorithm::Crc32 => p.checksum_crc32(v),
        ChecksumAlgorithm::Crc32C => p.checksum_crc32_c(v),
        ChecksumAlgorithm::Crc64Nvme => p.checksum_crc64_nvme(v),
        ChecksumAlgorithm::Sha1 => p.checksum_sha1(v),
        _ => p.checksum_sha256(v),
    }
}

fn mpu(parts: Vec<CompletedPart>) -> CompletedMultipartUpload {
    CompletedMultipartUpload::builder()
        .set_parts(Some(parts))
        .build()
}

#[tokio::test]
async fn multipart_composite() {
    let (_s, c) = server_with_bucket("mpu").await;
    let parts = vec![data(5 << 20, 21), data(5 << 20, 22), data(123_457, 23)];
    let whole: Vec<u8> = parts.concat();
    for a in [ChecksumAlgorithm::Crc32, ChecksumAlgorithm::Sha256] {
        let key = format!("comp-{}", a.as_str());
        let up = create_with(&c, "mpu", &key, &a).send().await.unwrap();
        assert_eq!(up.checksum_algorithm(), Some(&a));
        assert_eq!(up.checksum_type(), Some(&ChecksumType::Composite));
        let id = up.upload_id().unwrap().to_owned();
        let done = upload_parts(&c, "mpu", &key, &id, &a, &parts).await;
        // ListParts: the upload's algorithm and type, each part's value.
        let lp = list_parts(&c, "mpu", &key, &id).await;
        assert_eq!(lp.checksum_algorithm(), Some(&a));
        assert_eq!(lp.checksum_type(), Some(&ChecksumType::Composite));
        for (p, d) in lp.parts().iter().zip(&parts) {
            assert_eq!(value_of!(p, &a), Some(b64(&sum(&a, d))));
        }
        let ups = c.list_multipart_uploads().bucket("mpu").send().await;
        let ups = ups.unwrap();
        let u = ups
            .uploads()
            .iter()
            .find(|u| u.upload_id() == Some(id.as_str()))
            .unwrap();
        assert_eq!(u.checksum_algorithm(), Some(&a));
        // A Complete that leaves out a part's checksum, or lists a wrong
        // one, is refused and the upload stays.
        let mut missing = done.clone();
        missing[1] = part(2, done[1].e_tag().unwrap()).build();
        let refused = complete(&c, "mpu", &key, &id, mpu(missing)).await;
        assert_eq!(refused.unwrap_err(), s3err("InvalidRequest", 400));
        let mut wrong = done.clone();
        wrong[0] = with_checksum(
            part(1, done[0].e_tag().unwrap()),
            &a,
            b64(&sum(&a, b"other")),
        )
        .build();
        let refused = complete(&c, "mpu", &key, &id, mpu(wrong)).await;
        assert_eq!(refused.unwrap_err(), s3err("InvalidPart", 400));
        // The right list: checksum of the concatenated part checksums, -3.
        let raws: Vec<u8> = parts.iter().flat_map(|p| sum(&a, p)).collect();
        let want = format!("{}-3", b64(&sum(&a, &raws)));
        let out = complete(&c, "mpu", &key, &id, mpu(done)).await.unwrap();
        assert_eq!(value_of!(out, &a), Some(want.clone()));
        assert_eq!(out.checksum_type(), Some(&ChecksumType::Composite));
        let got = get_checked(&c, "mpu", &key).await;
        assert_eq!(value_of!(got, &a), Some(want.clone()));
        assert_eq!(got.checksum_type(), Some(&ChecksumType::Composite));
        assert!(body(got).await == whole);
        // GetObjectAttributes: ETag, checksum (without "-3"), parts.
        use ObjectAttributes as A;
        let every = [
            A::Etag,
            A::Checksum,
            A::ObjectParts,
            A::ObjectSize,
            A::StorageClass,
        ];
        let at = attributes(&c, "mpu", &key, &every).send().await.unwrap();
        assert!(at.e_tag().unwrap().trim_matches('"').ends_with("-3"));
        assert_eq!(at.object_size(), Some(whole.len() as i64));
        assert_eq!(at.storage_class().map(|s| s.as_str()), Some("STANDARD"));
        assert!(at.last_modified().is_some());
        let ck = at.checksum().unwrap();
        // With its "-3", as Complete and HeadObject give it.
        assert_eq!(
            value_of!(ck, &a),
            Some(format!("{}-3", b64(&sum(&a, &raws))))
        );
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
        let object_parts = || attributes(&c, "mpu", &key, &[A::ObjectParts]);
        let at = object_parts().max_parts(2).send().await.unwrap();
        let op = at.object_parts().unwrap();
        assert_eq!(op.parts().len(), 2);
        assert_eq!(op.is_truncated(), Some(true));
        assert_eq!(op.next_part_number_marker(), Some("2"));
        assert!(at.e_tag().is_none() && at.checksum().is_none());
        let at = object_parts().part_number_marker("2").send().await.unwrap();
        let op = at.object_parts().unwrap();
        assert_eq!(op.parts().len(), 1);
        assert_eq!(op.parts()[0].part_number(), Some(3));
        assert_eq!(op.is_truncated(), Some(false));
    }
}

#[tokio::test]
async fn multipart_full_object() {
    let (_s, c) = server_with_bucket("fob").await;
    let parts = vec![data(5 << 20, 31), data((5 << 20) + 17, 32), data(9, 33)];
    let whole: Vec<u8> = parts.concat();
    for (a, explicit) in [
        (ChecksumAlgorithm::Crc64Nvme, false),
        (ChecksumAlgorithm::Crc32, true),
        (ChecksumAlgorithm::Crc32C, true),
    ] {
        let key = format!("full-{}", a.as_str());
        let mut create = create_with(&c, "fob", &key, &a);
        if explicit {
            create = create.checksum_type(ChecksumType::FullObject);
        }
        let up = create.send().await.unwrap();
        assert_eq!(up.checksum_type(), Some(&ChecksumType::FullObject));
        let id = up.upload_id().unwrap().to_owned();
        let done = upload_parts(&c, "fob", &key, &id, &a, &parts).await;
        let lp = list_parts(&c, "fob", &key, &id).await;
        assert_eq!(lp.checksum_type(), Some(&ChecksumType::FullObject));
        let want = b64(&sum(&a, &whole));
        let complete = |v: &str| {
            let r = c
                .complete_multipart_upload()
                .bucket("fob")
                .key(&key)
                .upload_id(&id);
            let r = r.checksum_type(ChecksumType::FullObject);
            let r = r.multipart_upload(mpu(done.clone()));
            let r = match a {
                ChecksumAlgorithm::Crc64Nvme => r.checksum_crc64_nvme(v),
                ChecksumAlgorithm::Crc32 => r.checksum_crc32(v),
                _ => r.checksum_crc32_c(v),
            };
            r.send()
        };
        // A wrong whole-object value is BadDigest, the upload stays.
        let (code, status) = fails(complete(&b64(&sum(&a, b"x"))).await);
        assert_eq!((code.as_str(), status), ("BadDigest", 400));
        assert!(!exists(&c, "fob", &key).await);
        let out = complete(&want).await.unwrap();
        assert_eq!(value_of!(out, &a), Some(want.clone()));
        assert_eq!(out.checksum_type(), Some(&ChecksumType::FullObject));
        // GET validates the whole body against the combined CRC.
        let got = get_checked(&c, "fob", &key).await;
        assert_eq!(value_of!(got, &a), Some(want.clone()));
        assert_eq!(got.checksum_type(), Some(&ChecksumType::FullObject));
        assert!(body(got).await == whole);
    }
    // An upload created without a checksum: parts may carry one (checked),
    // the object has none.
    let up = c
        .create_multipart_upload()
        .bucket("fob")
        .key("plain")
        .send();
    let up = up.await.unwrap();
    assert!(up.checksum_algorithm().is_none());
    let id = up.upload_id().unwrap().to_owned();
    let crc32 = ChecksumAlgorithm::Crc32;
    let done = upload_parts(&c, "fob", "plain", &id, &crc32, &parts[2..]).await;
    let out = complete(&c, "fob", "plain", &id, mpu(done)).await.unwrap();
    assert_eq!(count_of!(out), 0);
}

#[tokio::test]
async fn multipart_rules() {
    let (s, c) = server_with_bucket("rules").await;
    let bare = bare_client(&s);
    for (a, t) in [
        (ChecksumAlgorithm::Crc64Nvme, ChecksumType::Composite),
        (ChecksumAlgorithm::Sha256, ChecksumType::FullObject),
        (ChecksumAlgorithm::Sha1, ChecksumType::FullObject),
    ] {
        let create = create_with(&c, "rules", "k", &a).checksum_type(t.clone());
        let (code, status) = fails(create.send().await);
        let got = (code.as_str(), status);
        assert_eq!(got, ("InvalidRequest", 400), "{a:?} {t:?}");
    }
    // A type without an algorithm.
    let create = c.create_multipart_upload().bucket("rules").key("k");
    let create = create.checksum_type(ChecksumType::FullObject).send().await;
    assert_eq!(fails(create).0, "InvalidRequest");
    // An upload created with SHA1 takes only parts that carry a SHA1.
    let sha1 = ChecksumAlgorithm::Sha1;
    let up = create_with(&c, "rules", "k", &sha1).send().await.unwrap();
    let id = up.upload_id().unwrap().to_owned();
    let part_one = |c: &Client| {
        let req = c.upload_part().bucket("rules").key("k").upload_id(&id);
        req.part_number(1).body(ByteStream::from_static(b"part"))
    };
    let (code, status) = fails(part_one(&bare).send().await);
    assert_eq!((code.as_str(), status), ("InvalidRequest", 400));
    let crc32 = part_one(&c).checksum_algorithm(ChecksumAlgorithm::Crc32);
    assert_eq!(fails(crc32.send().await).0, "InvalidRequest");
    // A wrong part checksum: BadDigest, no part stored.
    let wrong = part_one(&c).checksum_sha1(b64(&sum(&sha1, b"other")));
    let (code, status) = fails(wrong.send().await);
    assert_eq!((code.as_str(), status), ("BadDigest", 400));
    assert!(list_parts(&c, "rules", "k", &id).await.parts().is_empty());
    let part = [b"part".to_vec()];
    let done = upload_parts(&c, "rules", "k", &id, &sha1, &part).await;
    // A Complete naming the other type is refused.
    let other = c.complete_multipart_upload().bucket("rules").key("k");
    let other = other.upload_id(&id).checksum_type(ChecksumType::FullObject);
    let other = other.multipart_upload(mpu(done.clone())).send().await;
    assert_eq!(fails(other).0, "InvalidRequest");
    let out = complete(&c, "rules", "k", &id, mpu(done)).await.unwrap();
    let raw_part = sum(&sha1, b"part");
    let want = format!("{}-1", b64(&sum(&sha1, &raw_part)));
    assert_eq!(out.checksum_sha1(), Some(want.as_str()));
}

#[tokio::test]
async fn copy_and_attributes() {
    let (_s, c) = server_with_bucket("cpy").await;
    let d = data(1_000_000, 41);
    let src = c.put_object().bucket("cpy").key("src");
    let src = src.checksum_algorithm(ChecksumAlgorithm::Crc32C);
    src.body(ByteStream::from(d.clone())).send().await.unwrap();
    let crc32c = b64(&sum(&ChecksumAlgorithm::Crc32C, &d));
    let copy = |k: &str| c.copy_object().bucket("cpy").key(k).copy_source("cpy/src");
    // The copy keeps the source's checksum.
    let out = copy("same").send().await.unwrap();
    let r = out.copy_object_result().unwrap();
    assert_eq!(r.checksum_crc32_c(), Some(crc32c.as_str()));
    assert_eq!(r.checksum_type(), Some(&ChecksumType::FullObject));
    let head = head_checked(&c, "cpy", "same").await;
    assert_eq!(head.checksum_crc32_c(), Some(crc32c.as_str()));
    // Asked for another algorithm: computed over the copied bytes.
    let sha = b64(&sum(&ChecksumAlgorithm::Sha256, &d));
    let out = copy("sha")
        .checksum_algorithm(ChecksumAlgorithm::Sha256)
        .send();
    let out = out.await.unwrap();
    let r = out.copy_object_result().unwrap();
    assert_eq!(r.checksum_sha256(), Some(sha.as_str()));
    let got = get_checked(&c, "cpy", "sha").await;
    assert_eq!(got.checksum_sha256(), Some(sha.as_str()));
    assert_eq!(count_of!(got), 1);
    assert!(body(got).await == d);
    // UploadPartCopy into an upload with a checksum algorithm: the part's
    // checksum is computed over the copied bytes.
    let crc64 = ChecksumAlgorithm::Crc64Nvme;
    let up = create_with(&c, "cpy", "mpc", &crc64).send().await.unwrap();
    let id = up.upload_id().unwrap().to_owned();
    let copied = c.upload_part_copy().bucket("cpy").key("mpc").upload_id(&id);
    let copied = copied.part_number(1).copy_source("cpy/src").send().await;
    let copied = copied.unwrap();
    let want = b64(&sum(&crc64, &d));
    let r = copied.copy_part_result().unwrap();
    assert_eq!(r.checksum_crc64_nvme(), Some(want.as_str()));
    let done = mpu(vec![part(1, r.e_tag().unwrap()).build()]);
    let out = complete(&c, "cpy", "mpc", &id, done).await.unwrap();
    assert_eq!(out.checksum_crc64_nvme(), Some(want.as_str()));
    // GetObjectAttributes of a single-part object: no ObjectParts.
    use ObjectAttributes as A;
    let asked = [A::Checksum, A::ObjectParts, A::ObjectSize];
    let at = attributes(&c, "cpy", "src", &asked).send().await.unwrap();
    let ck = at.checksum().unwrap();
    assert_eq!(ck.checksum_crc32_c(), Some(crc32c.as_str()));
    assert_eq!(ck.checksum_type(), Some(&ChecksumType::FullObject));
    assert!(at.object_parts().is_none());
    assert_eq!(at.object_size(), Some(d.len() as i64));
    assert!(at.e_tag().is_none());
    let missing = attributes(&c, "cpy", "missing", &[A::Etag]).send().await;
    assert_eq!(fails(missing), s3err("NoSuchKey", 404));
    // An unknown attribute name.
    let bogus = attributes(&c, "cpy", "src", &[A::from("Bogus")])
        .send()
        .await;
    assert_eq!(fails(bogus), s3err("InvalidArgument", 400));
}
