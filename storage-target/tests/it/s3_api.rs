//! Drives the real storage-target binary with aws-sdk-s3: every supported
//! operation, metadata, ranges, conditionals, listings and multipart.

use crate::common;
use crate::common::{ADMIN, OTHER, Server, data, err, md5_hex, raw};
use aws_sdk_s3::operation::RequestId as _;
use aws_sdk_s3::primitives::{ByteStream, DateTime};
use aws_sdk_s3::types::{
    CompletedMultipartUpload, CompletedPart, Delete, EncodingType, MetadataDirective,
    ObjectIdentifier,
};
use bytes::Bytes;

async fn put(c: &aws_sdk_s3::Client, b: &str, k: &str, body: &[u8]) -> String {
    c.put_object()
        .bucket(b)
        .key(k)
        .body(ByteStream::from(body.to_vec()))
        .send()
        .await
        .unwrap()
        .e_tag
        .unwrap()
}

async fn get(c: &aws_sdk_s3::Client, b: &str, k: &str) -> Vec<u8> {
    c.get_object()
        .bucket(b)
        .key(k)
        .send()
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .to_vec()
}

#[tokio::test]
async fn bucket_lifecycle() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("bkt-one").send().await.unwrap();
    // One's own bucket again: 200 in us-east-1 (AWS's legacy behaviour).
    c.create_bucket().bucket("bkt-one").send().await.unwrap();
    let (code, _) = err(s
        .client(OTHER)
        .create_bucket()
        .bucket("bkt-one")
        .send()
        .await
        .unwrap_err());
    assert_eq!(code, "BucketAlreadyExists");
    let (code, _) = err(c
        .create_bucket()
        .bucket("Bad_Name")
        .send()
        .await
        .unwrap_err());
    assert_eq!(code, "InvalidBucketName");

    let h = c.head_bucket().bucket("bkt-one").send().await.unwrap();
    assert_eq!(h.bucket_region(), Some("us-east-1"));
    let (_, status) = err(c
        .head_bucket()
        .bucket("no-such-bkt")
        .send()
        .await
        .unwrap_err());
    assert_eq!(status, 404);

    let loc = c
        .get_bucket_location()
        .bucket("bkt-one")
        .send()
        .await
        .unwrap();
    assert!(
        loc.location_constraint()
            .is_none_or(|l| l.as_str().is_empty())
    );

    let names: Vec<_> = c
        .list_buckets()
        .send()
        .await
        .unwrap()
        .buckets()
        .iter()
        .filter_map(|b| b.name().map(str::to_owned))
        .collect();
    assert_eq!(names, ["bkt-one"]);

    put(&c, "bkt-one", "k", b"x").await;
    let (code, status) = err(c
        .delete_bucket()
        .bucket("bkt-one")
        .send()
        .await
        .unwrap_err());
    assert_eq!((code.as_str(), status), ("BucketNotEmpty", 409));
    c.delete_object()
        .bucket("bkt-one")
        .key("k")
        .send()
        .await
        .unwrap();
    c.delete_bucket().bucket("bkt-one").send().await.unwrap();
    let (code, _) = err(c
        .delete_bucket()
        .bucket("bkt-one")
        .send()
        .await
        .unwrap_err());
    assert_eq!(code, "NoSuchBucket");
    let (code, _) = err(c
        .get_object()
        .bucket("bkt-one")
        .key("k")
        .send()
        .await
        .unwrap_err());
    assert_eq!(code, "NoSuchBucket");
    // The name is free again.
    c.create_bucket().bucket("bkt-one").send().await.unwrap();
}

#[tokio::test]
async fn object_round_trip_and_metadata() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("objs").send().await.unwrap();
    let body = data(300_000, 1);
    let expires = DateTime::from_secs(2_000_000_000);
    let p = c
        .put_object()
        .bucket("objs")
        .key("dir/file.bin")
        .body(ByteStream::from(body.clone()))
        .content_type("application/x-test")
        .cache_control("max-age=60")
        .content_disposition("attachment; filename=\"f.bin\"")
        .content_encoding("identity")
        .content_language("en")
        .expires(expires)
        .metadata("color", "blue")
        .metadata("Mixed-Case", "v a l")
        .send()
        .await
        .unwrap();
    assert_eq!(p.e_tag(), Some(format!("\"{}\"", md5_hex(&body)).as_str()));

    let g = c
        .get_object()
        .bucket("objs")
        .key("dir/file.bin")
        .send()
        .await
        .unwrap();
    assert_eq!(g.e_tag(), p.e_tag());
    assert_eq!(g.content_type(), Some("application/x-test"));
    assert_eq!(g.cache_control(), Some("max-age=60"));
    assert_eq!(
        g.content_disposition(),
        Some("attachment; filename=\"f.bin\"")
    );
    assert_eq!(g.content_encoding(), Some("identity"));
    assert_eq!(g.content_language(), Some("en"));
    assert_eq!(g.content_length(), Some(300_000));
    assert!(g.last_modified().is_some());
    let md = g.metadata().unwrap();
    assert_eq!(md.get("color").map(String::as_str), Some("blue"));
    assert_eq!(md.get("mixed-case").map(String::as_str), Some("v a l"));
    assert!(g.expires_string().unwrap().contains("2033"));
    assert_eq!(g.body.collect().await.unwrap().to_vec(), body);

    let h = c
        .head_object()
        .bucket("objs")
        .key("dir/file.bin")
        .send()
        .await
        .unwrap();
    assert_eq!(h.e_tag(), p.e_tag());
    assert_eq!(h.content_length(), Some(300_000));
    assert_eq!(
        h.metadata().unwrap().get("color").map(String::as_str),
        Some("blue")
    );

    // Empty object.
    put(&c, "objs", "empty", b"").await;
    let h = c
        .head_object()
        .bucket("objs")
        .key("empty")
        .send()
        .await
        .unwrap();
    assert_eq!(h.content_length(), Some(0));
    assert_eq!(h.e_tag(), Some("\"d41d8cd98f00b204e9800998ecf8427e\""));

    // Overwrite, delete, missing.
    let e2 = put(&c, "objs", "dir/file.bin", b"new").await;
    assert_eq!(get(&c, "objs", "dir/file.bin").await, b"new");
    assert_ne!(Some(e2.as_str()), p.e_tag());
    c.delete_object()
        .bucket("objs")
        .key("dir/file.bin")
        .send()
        .await
        .unwrap();
    let (code, status) = err(c
        .get_object()
        .bucket("objs")
        .key("dir/file.bin")
        .send()
        .await
        .unwrap_err());
    assert_eq!((code.as_str(), status), ("NoSuchKey", 404));
    let (_, status) = err(c
        .head_object()
        .bucket("objs")
        .key("dir/file.bin")
        .send()
        .await
        .unwrap_err());
    assert_eq!(status, 404);
    // Deleting a missing key succeeds.
    c.delete_object()
        .bucket("objs")
        .key("never")
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn content_md5() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("md5s").send().await.unwrap();
    use base64::Engine as _;
    let b64 = |d: &[u8]| {
        use s3s::crypto::Checksum as _;
        base64::engine::general_purpose::STANDARD.encode(s3s::crypto::Md5::checksum(d))
    };
    c.put_object()
        .bucket("md5s")
        .key("ok")
        .content_md5(b64(b"hello"))
        .body(ByteStream::from_static(b"hello"))
        .send()
        .await
        .unwrap();
    let (code, status) = err(c
        .put_object()
        .bucket("md5s")
        .key("bad")
        .content_md5(b64(b"other"))
        .body(ByteStream::from_static(b"hello"))
        .send()
        .await
        .unwrap_err());
    assert_eq!((code.as_str(), status), ("BadDigest", 400));
    let (code, _) = err(c
        .head_object()
        .bucket("md5s")
        .key("bad")
        .send()
        .await
        .unwrap_err());
    assert_eq!(code, "NotFound");
}

#[tokio::test]
async fn awkward_keys() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("keys").send().await.unwrap();
    let long = "k".repeat(1024);
    let keys = [
        "a",
        "a/b",
        "a/b/",
        "日本語/ключ é ü",
        "../../../../etc/passwd",
        "a/../../b",
        "./.",
        "with space+plus%percent?q=1#frag",
        long.as_str(),
    ];
    for (i, k) in keys.iter().enumerate() {
        put(&c, "keys", k, format!("v{i}").as_bytes()).await;
    }
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(get(&c, "keys", k).await, format!("v{i}").as_bytes(), "{k}");
    }
    let listed: Vec<String> = c
        .list_objects_v2()
        .bucket("keys")
        .send()
        .await
        .unwrap()
        .contents()
        .iter()
        .map(|o| o.key().unwrap().to_owned())
        .collect();
    let mut want: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    want.sort();
    assert_eq!(listed, want);
    // Too long.
    let (code, _) = err(c
        .put_object()
        .bucket("keys")
        .key("k".repeat(1025))
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap_err());
    assert_eq!(code, "KeyTooLongError");
    // Nothing escaped the data directory: everything the server wrote is inside it.
    let parent = s.data_dir.parent().unwrap();
    for e in std::fs::read_dir(parent).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(
            ["data", "storage-target.yaml", "other.key", "stderr.log"].contains(&name.as_str()),
            "unexpected {name}"
        );
    }
    // And it survives a restart (index rebuilt from the files).
    let mut s = s;
    s.restart();
    let c = s.admin();
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(get(&c, "keys", k).await, format!("v{i}").as_bytes(), "{k}");
    }
}

#[tokio::test]
async fn ranged_reads() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("ranges").send().await.unwrap();
    let body = data(5000, 7);
    put(&c, "ranges", "obj", &body).await;
    for (range, from, to) in [
        ("bytes=0-9", 0usize, 10usize),
        ("bytes=10-", 10, 5000),
        ("bytes=-5", 4995, 5000),
        ("bytes=4990-9999", 4990, 5000),
        ("bytes=-99999", 0, 5000),
        ("bytes=4999-4999", 4999, 5000),
    ] {
        let g = c
            .get_object()
            .bucket("ranges")
            .key("obj")
            .range(range)
            .send()
            .await
            .unwrap();
        assert_eq!(
            g.content_range(),
            Some(format!("bytes {from}-{}/5000", to - 1).as_str()),
            "{range}"
        );
        assert_eq!(g.content_length(), Some((to - from) as i64));
        assert_eq!(
            g.body.collect().await.unwrap().to_vec(),
            &body[from..to],
            "{range}"
        );
    }
    let r = raw_get_signed_range(&s, "bytes=5-9").await;
    assert_eq!(r, 206);
    let (code, status) = err(c
        .get_object()
        .bucket("ranges")
        .key("obj")
        .range("bytes=5000-")
        .send()
        .await
        .unwrap_err());
    assert_eq!((code.as_str(), status), ("InvalidRange", 416));
}

/// Status of a presigned ranged GET (checks the raw 206).
async fn raw_get_signed_range(s: &Server, range: &str) -> u16 {
    let p = s
        .admin()
        .get_object()
        .bucket("ranges")
        .key("obj")
        .presigned(
            aws_sdk_s3::presigning::PresigningConfig::expires_in(std::time::Duration::from_secs(
                60,
            ))
            .unwrap(),
        )
        .await
        .unwrap();
    raw("GET", p.uri(), &[("range", range)], Bytes::new())
        .await
        .status
}

#[tokio::test]
async fn conditional_requests() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("conds").send().await.unwrap();
    let etag = put(&c, "conds", "o", b"data").await;
    let past = DateTime::from_secs(1_000_000_000);
    let future = DateTime::from_secs(4_000_000_000);
    let g = || c.get_object().bucket("conds").key("o");
    g().if_match(&etag).send().await.unwrap();
    g().if_match("*").send().await.unwrap();
    g().if_none_match("\"other\"").send().await.unwrap();
    g().if_modified_since(past).send().await.unwrap();
    g().if_unmodified_since(future).send().await.unwrap();
    let (code, status) = err(g().if_match("\"nope\"").send().await.unwrap_err());
    assert_eq!((code.as_str(), status), ("PreconditionFailed", 412));
    let (_, status) = err(g().if_unmodified_since(past).send().await.unwrap_err());
    assert_eq!(status, 412);
    let (_, status) = err(g().if_none_match(&etag).send().await.unwrap_err());
    assert_eq!(status, 304);
    let (_, status) = err(g().if_modified_since(future).send().await.unwrap_err());
    assert_eq!(status, 304);
    // HEAD too.
    let (_, status) = err(c
        .head_object()
        .bucket("conds")
        .key("o")
        .if_none_match(&etag)
        .send()
        .await
        .unwrap_err());
    assert_eq!(status, 304);
    let (_, status) = err(c
        .head_object()
        .bucket("conds")
        .key("o")
        .if_match("\"x\"")
        .send()
        .await
        .unwrap_err());
    assert_eq!(status, 412);
}

#[tokio::test]
async fn copy_object() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("src-b").send().await.unwrap();
    c.create_bucket().bucket("dst-b").send().await.unwrap();
    let body = data(100_000, 3);
    let etag = c
        .put_object()
        .bucket("src-b")
        .key("s")
        .body(ByteStream::from(body.clone()))
        .content_type("text/x-src")
        .metadata("m", "src")
        .send()
        .await
        .unwrap()
        .e_tag
        .unwrap();
    let r = c
        .copy_object()
        .bucket("dst-b")
        .key("copy")
        .copy_source("src-b/s")
        .send()
        .await
        .unwrap();
    assert_eq!(r.copy_object_result().unwrap().e_tag(), Some(etag.as_str()));
    let g = c
        .get_object()
        .bucket("dst-b")
        .key("copy")
        .send()
        .await
        .unwrap();
    assert_eq!(g.content_type(), Some("text/x-src"));
    assert_eq!(
        g.metadata().unwrap().get("m").map(String::as_str),
        Some("src")
    );
    assert_eq!(g.body.collect().await.unwrap().to_vec(), body);

    c.copy_object()
        .bucket("dst-b")
        .key("replaced")
        .copy_source("src-b/s")
        .metadata_directive(MetadataDirective::Replace)
        .content_type("text/x-new")
        .metadata("n", "new")
        .send()
        .await
        .unwrap();
    let h = c
        .head_object()
        .bucket("dst-b")
        .key("replaced")
        .send()
        .await
        .unwrap();
    assert_eq!(h.content_type(), Some("text/x-new"));
    let md = h.metadata().unwrap();
    assert_eq!(md.get("n").map(String::as_str), Some("new"));
    assert!(!md.contains_key("m"));

    // Self-copy needs REPLACE.
    let (code, _) = err(c
        .copy_object()
        .bucket("src-b")
        .key("s")
        .copy_source("src-b/s")
        .send()
        .await
        .unwrap_err());
    assert_eq!(code, "InvalidRequest");
    c.copy_object()
        .bucket("src-b")
        .key("s")
        .copy_source("src-b/s")
        .metadata_directive(MetadataDirective::Replace)
        .metadata("m", "again")
        .send()
        .await
        .unwrap();
    // Copy-source conditions and missing sources.
    let (_, status) = err(c
        .copy_object()
        .bucket("dst-b")
        .key("x")
        .copy_source("src-b/s")
        .copy_source_if_match("\"nope\"")
        .send()
        .await
        .unwrap_err());
    assert_eq!(status, 412);
    let (code, _) = err(c
        .copy_object()
        .bucket("dst-b")
        .key("x")
        .copy_source("src-b/missing")
        .send()
        .await
        .unwrap_err());
    assert_eq!(code, "NoSuchKey");
    // Unicode and slashes in the source key (URL-encoded copy source).
    put(&c, "src-b", "dir/é x", b"u").await;
    c.copy_object()
        .bucket("dst-b")
        .key("u")
        .copy_source("src-b/dir/%C3%A9%20x")
        .send()
        .await
        .unwrap();
    assert_eq!(get(&c, "dst-b", "u").await, b"u");
}

#[tokio::test]
async fn delete_objects() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("dels").send().await.unwrap();
    for k in ["a", "b", "c"] {
        put(&c, "dels", k, b"x").await;
    }
    let ids = ["a", "b", "missing"]
        .iter()
        .map(|k| ObjectIdentifier::builder().key(*k).build().unwrap())
        .collect();
    let r = c
        .delete_objects()
        .bucket("dels")
        .delete(Delete::builder().set_objects(Some(ids)).build().unwrap())
        .send()
        .await
        .unwrap();
    let mut deleted: Vec<_> = r
        .deleted()
        .iter()
        .map(|d| d.key().unwrap().to_owned())
        .collect();
    deleted.sort();
    assert_eq!(deleted, ["a", "b", "missing"]);
    assert!(r.errors().is_empty());
    let left: Vec<_> = c
        .list_objects_v2()
        .bucket("dels")
        .send()
        .await
        .unwrap()
        .contents()
        .iter()
        .map(|o| o.key().unwrap().to_owned())
        .collect();
    assert_eq!(left, ["c"]);
    let r = c
        .delete_objects()
        .bucket("dels")
        .delete(
            Delete::builder()
                .objects(ObjectIdentifier::builder().key("c").build().unwrap())
                .quiet(true)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert!(r.deleted().is_empty());
}

#[tokio::test]
async fn listings() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("lists").send().await.unwrap();
    let keys = ["a", "a/b", "a/c/d", "a/c/e", "b", "b/x", "c", "Z", "é", "~"];
    for k in keys {
        put(&c, "lists", k, b"1").await;
    }
    let all = c.list_objects_v2().bucket("lists").send().await.unwrap();
    let got: Vec<_> = all.contents().iter().map(|o| o.key().unwrap()).collect();
    // Byte order: 'Z' < 'a' < '~' < 'é'.
    assert_eq!(
        got,
        ["Z", "a", "a/b", "a/c/d", "a/c/e", "b", "b/x", "c", "~", "é"]
    );
    assert_eq!(all.key_count(), Some(10));
    assert_eq!(all.is_truncated(), Some(false));
    let o = &all.contents()[0];
    assert_eq!(o.size(), Some(1));
    assert_eq!(o.e_tag(), Some(format!("\"{}\"", md5_hex(b"1")).as_str()));
    assert!(o.owner().is_none());

    let d = c
        .list_objects_v2()
        .bucket("lists")
        .delimiter("/")
        .send()
        .await
        .unwrap();
    let objs: Vec<_> = d.contents().iter().map(|o| o.key().unwrap()).collect();
    let cps: Vec<_> = d
        .common_prefixes()
        .iter()
        .map(|p| p.prefix().unwrap())
        .collect();
    assert_eq!(objs, ["Z", "a", "b", "c", "~", "é"]);
    assert_eq!(cps, ["a/", "b/"]);

    let d = c
        .list_objects_v2()
        .bucket("lists")
        .prefix("a/")
        .delimiter("/")
        .send()
        .await
        .unwrap();
    assert_eq!(
        d.contents()
            .iter()
            .map(|o| o.key().unwrap())
            .collect::<Vec<_>>(),
        ["a/b"]
    );
    assert_eq!(d.common_prefixes()[0].prefix(), Some("a/c/"));

    // Pagination with continuation tokens and a delimiter: each entry once.
    let mut token: Option<String> = None;
    let mut seen = Vec::new();
    loop {
        let mut req = c
            .list_objects_v2()
            .bucket("lists")
            .delimiter("/")
            .max_keys(2);
        if let Some(t) = &token {
            req = req.continuation_token(t);
        }
        let p = req.send().await.unwrap();
        assert!(p.key_count().unwrap() <= 2);
        seen.extend(p.contents().iter().map(|o| o.key().unwrap().to_owned()));
        seen.extend(
            p.common_prefixes()
                .iter()
                .map(|o| o.prefix().unwrap().to_owned()),
        );
        if p.is_truncated() != Some(true) {
            break;
        }
        token = p.next_continuation_token().map(str::to_owned);
    }
    let n = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(n, seen.len(), "an entry was listed twice");
    assert_eq!(seen, ["Z", "a", "a/", "b", "b/", "c", "~", "é"]);

    let sa = c
        .list_objects_v2()
        .bucket("lists")
        .start_after("b/x")
        .send()
        .await
        .unwrap();
    assert_eq!(
        sa.contents()
            .iter()
            .map(|o| o.key().unwrap())
            .collect::<Vec<_>>(),
        ["c", "~", "é"]
    );

    let fo = c
        .list_objects_v2()
        .bucket("lists")
        .fetch_owner(true)
        .max_keys(1)
        .send()
        .await
        .unwrap();
    // The owner is the writer, by canonical id (derived from the access key
    // when the config sets none) and display name (the canonical id when
    // none is configured: the access key id is never shown).
    let owner = fo.contents()[0].owner().unwrap();
    let admin_id = storage_target::config::default_canonical_id(ADMIN.0);
    assert_eq!(owner.id(), Some(admin_id.as_str()));
    assert_eq!(owner.display_name(), Some(admin_id.as_str()));
    assert_eq!(fo.is_truncated(), Some(true));

    let (code, _) = err(c
        .list_objects_v2()
        .bucket("lists")
        .continuation_token("!!bad!!")
        .send()
        .await
        .unwrap_err());
    assert_eq!(code, "InvalidArgument");

    let z = c
        .list_objects_v2()
        .bucket("lists")
        .max_keys(0)
        .send()
        .await
        .unwrap();
    assert!(z.contents().is_empty());

    // encoding-type=url: keys come back percent-encoded.
    put(&c, "lists", "sp ace/ü", b"1").await;
    let u = c
        .list_objects_v2()
        .bucket("lists")
        .prefix("sp")
        .encoding_type(EncodingType::Url)
        .send()
        .await
        .unwrap();
    assert_eq!(u.contents()[0].key(), Some("sp%20ace/%C3%BC"));

    // ListObjects v1 with markers.
    let mut marker: Option<String> = None;
    let mut v1 = Vec::new();
    loop {
        let mut req = c.list_objects().bucket("lists").max_keys(3);
        if let Some(m) = &marker {
            req = req.marker(m);
        }
        let p = req.send().await.unwrap();
        v1.extend(p.contents().iter().map(|o| o.key().unwrap().to_owned()));
        if p.is_truncated() != Some(true) {
            break;
        }
        marker = Some(
            p.next_marker()
                .map(str::to_owned)
                .unwrap_or_else(|| v1.last().unwrap().clone()),
        );
    }
    assert_eq!(v1.len(), 11);
    let d1 = c
        .list_objects()
        .bucket("lists")
        .delimiter("/")
        .prefix("a")
        .send()
        .await
        .unwrap();
    assert_eq!(
        d1.contents()
            .iter()
            .map(|o| o.key().unwrap())
            .collect::<Vec<_>>(),
        ["a"]
    );
    assert_eq!(d1.common_prefixes()[0].prefix(), Some("a/"));
}

#[tokio::test]
async fn multipart_64mib() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("mpu").send().await.unwrap();
    let part_size = 8 << 20;
    let body = data(64 << 20, 11);
    let up = c
        .create_multipart_upload()
        .bucket("mpu")
        .key("big/object")
        .content_type("application/x-big")
        .metadata("kind", "multipart")
        .send()
        .await
        .unwrap();
    let id = up.upload_id().unwrap().to_owned();

    let listed = c
        .list_multipart_uploads()
        .bucket("mpu")
        .send()
        .await
        .unwrap();
    assert_eq!(listed.uploads().len(), 1);
    assert_eq!(listed.uploads()[0].upload_id(), Some(id.as_str()));
    assert_eq!(listed.uploads()[0].key(), Some("big/object"));

    // Upload parts out of order, concurrently.
    let mut tasks = Vec::new();
    for n in (1..=8).rev() {
        let c = c.clone();
        let id = id.clone();
        let chunk = body[(n - 1) * part_size..n * part_size].to_vec();
        tasks.push(tokio::spawn(async move {
            let r = c
                .upload_part()
                .bucket("mpu")
                .key("big/object")
                .upload_id(&id)
                .part_number(n as i32)
                .body(ByteStream::from(chunk))
                .send()
                .await
                .unwrap();
            (n as i32, r.e_tag().unwrap().to_owned())
        }));
    }
    let mut parts = Vec::new();
    for t in tasks {
        parts.push(t.await.unwrap());
    }
    parts.sort();
    for (n, e) in &parts {
        let want = md5_hex(&body[(*n as usize - 1) * part_size..*n as usize * part_size]);
        assert_eq!(e, &format!("\"{want}\""));
    }
    let lp = c
        .list_parts()
        .bucket("mpu")
        .key("big/object")
        .upload_id(&id)
        .send()
        .await
        .unwrap();
    assert_eq!(lp.parts().len(), 8);
    assert_eq!(lp.parts()[0].part_number(), Some(1));
    assert_eq!(lp.parts()[0].size(), Some(part_size as i64));
    let lp = c
        .list_parts()
        .bucket("mpu")
        .key("big/object")
        .upload_id(&id)
        .max_parts(3)
        .send()
        .await
        .unwrap();
    assert_eq!(lp.parts().len(), 3);
    assert_eq!(lp.is_truncated(), Some(true));

    let completed = |v: &[(i32, String)]| {
        CompletedMultipartUpload::builder()
            .set_parts(Some(
                v.iter()
                    .map(|(n, e)| CompletedPart::builder().part_number(*n).e_tag(e).build())
                    .collect(),
            ))
            .build()
    };
    let complete = |v: &[(i32, String)]| {
        c.complete_multipart_upload()
            .bucket("mpu")
            .key("big/object")
            .upload_id(&id)
            .multipart_upload(completed(v))
    };
    // Wrong order, wrong ETag, missing part.
    let mut swapped = parts.clone();
    swapped.swap(0, 1);
    assert_eq!(
        err(complete(&swapped).send().await.unwrap_err()).0,
        "InvalidPartOrder"
    );
    let mut bad = parts.clone();
    bad[2].1 = "\"00000000000000000000000000000000\"".into();
    assert_eq!(
        err(complete(&bad).send().await.unwrap_err()).0,
        "InvalidPart"
    );
    let mut extra = parts.clone();
    extra.push((9, "\"00000000000000000000000000000000\"".into()));
    assert_eq!(
        err(complete(&extra).send().await.unwrap_err()).0,
        "InvalidPart"
    );

    let done = complete(&parts).send().await.unwrap();
    let mut cat = Vec::new();
    for (_, e) in &parts {
        cat.extend(hex::decode(e.trim_matches('"')).unwrap());
    }
    let want_etag = format!("\"{}-8\"", md5_hex(&cat));
    assert_eq!(done.e_tag(), Some(want_etag.as_str()));

    let g = c
        .get_object()
        .bucket("mpu")
        .key("big/object")
        .send()
        .await
        .unwrap();
    assert_eq!(g.e_tag(), Some(want_etag.as_str()));
    assert_eq!(g.content_type(), Some("application/x-big"));
    assert_eq!(
        g.metadata().unwrap().get("kind").map(String::as_str),
        Some("multipart")
    );
    assert_eq!(g.parts_count(), Some(8));
    let got = g.body.collect().await.unwrap().to_vec();
    assert!(got == body, "multipart content differs");

    // The upload is gone.
    let (code, _) = err(c
        .list_parts()
        .bucket("mpu")
        .key("big/object")
        .upload_id(&id)
        .send()
        .await
        .unwrap_err());
    assert_eq!(code, "NoSuchUpload");
    assert!(
        c.list_multipart_uploads()
            .bucket("mpu")
            .send()
            .await
            .unwrap()
            .uploads()
            .is_empty()
    );
    assert!(common::files_under(&s.data_dir.join(".uploads")).is_empty());
    assert!(common::files_under(&s.data_dir.join(".tmp")).is_empty());
}

#[tokio::test]
async fn multipart_small_parts_abort_and_restart() {
    let mut s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("mpu2").send().await.unwrap();
    let id = c
        .create_multipart_upload()
        .bucket("mpu2")
        .key("k")
        .send()
        .await
        .unwrap()
        .upload_id
        .unwrap();
    let mut parts = Vec::new();
    for n in 1..=2 {
        let e = c
            .upload_part()
            .bucket("mpu2")
            .key("k")
            .upload_id(&id)
            .part_number(n)
            .body(ByteStream::from(vec![n as u8; 1000]))
            .send()
            .await
            .unwrap()
            .e_tag
            .unwrap();
        parts.push(CompletedPart::builder().part_number(n).e_tag(e).build());
    }
    // Parts survive a restart.
    s.restart();
    let c = s.admin();
    let lp = c
        .list_parts()
        .bucket("mpu2")
        .key("k")
        .upload_id(&id)
        .send()
        .await
        .unwrap();
    assert_eq!(lp.parts().len(), 2);
    let (code, status) = err(c
        .complete_multipart_upload()
        .bucket("mpu2")
        .key("k")
        .upload_id(&id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(parts.clone()))
                .build(),
        )
        .send()
        .await
        .unwrap_err());
    assert_eq!((code.as_str(), status), ("EntityTooSmall", 400));
    // A single small part is fine (the last part may be small).
    let one = c
        .complete_multipart_upload()
        .bucket("mpu2")
        .key("k")
        .upload_id(&id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .parts(parts[0].clone())
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert!(one.e_tag().unwrap().ends_with("-1\""));
    assert_eq!(get(&c, "mpu2", "k").await, vec![1u8; 1000]);

    let id2 = c
        .create_multipart_upload()
        .bucket("mpu2")
        .key("k2")
        .send()
        .await
        .unwrap()
        .upload_id
        .unwrap();
    c.abort_multipart_upload()
        .bucket("mpu2")
        .key("k2")
        .upload_id(&id2)
        .send()
        .await
        .unwrap();
    let (code, _) = err(c
        .upload_part()
        .bucket("mpu2")
        .key("k2")
        .upload_id(&id2)
        .part_number(1)
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap_err());
    assert_eq!(code, "NoSuchUpload");
    let (code, _) = err(c
        .abort_multipart_upload()
        .bucket("mpu2")
        .key("k2")
        .upload_id("../../x")
        .send()
        .await
        .unwrap_err());
    assert_eq!(code, "NoSuchUpload");
}

#[tokio::test]
async fn request_ids_and_metrics() {
    let s = Server::start();
    let c = s.admin();
    c.create_bucket().bucket("ids").send().await.unwrap();
    let e = c
        .get_object()
        .bucket("ids")
        .key("missing")
        .send()
        .await
        .unwrap_err();
    let rid = e.request_id().unwrap().to_owned();
    assert_eq!(rid.len(), 16);
    let r = raw("GET", &s.url("/ids/missing"), &[], Bytes::new()).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.xml("Code").as_deref(), Some("AccessDenied"));
    assert_eq!(r.xml("RequestId").as_deref(), r.header("x-amz-request-id"));
    assert!(r.header("x-amz-id-2").is_some());
    let ok = c.head_bucket().bucket("ids").send().await.unwrap();
    assert!(ok.request_id().is_some());

    let m = raw("GET", &s.metrics, &[], Bytes::new()).await;
    assert_eq!(m.status, 200);
    let text = m.text();
    assert!(
        text.contains("s3dma_storage_target_requests_total{op=\"GetObject\",status=\"404\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("s3dma_storage_target_request_duration_seconds_bucket{op=\"HeadBucket\"")
    );
    assert!(text.contains("s3dma_storage_target_bytes_total{direction=\"out\"}"));
}

#[tokio::test]
async fn graceful_sigterm() {
    let mut s = Server::start();
    s.admin()
        .create_bucket()
        .bucket("term")
        .send()
        .await
        .unwrap();
    assert!(
        s.terminate(),
        "storage-target did not exit cleanly on SIGTERM"
    );
}
