//! Drives the real storage-target binary with aws-sdk-s3: every supported
//! operation, metadata, ranges, conditionals, listings and multipart.

use crate::common;
use crate::common::{ADMIN, OTHER, Server, data, get_as, md5_hex, raw};
use crate::support::{
    completed, delete, fails, get, head, list_keys, mkbucket, object_keys, presign_for,
    presigned_get, put, raw_get, rmbucket, s3err, server_with_bucket, start_upload, try_put,
};
use aws_sdk_s3::operation::RequestId as _;
use aws_sdk_s3::primitives::{ByteStream, DateTime};
use aws_sdk_s3::types::{
    CompletedMultipartUpload, Delete, EncodingType, MetadataDirective, ObjectIdentifier,
};
use bytes::Bytes;

#[tokio::test]
async fn bucket_lifecycle() {
    let (s, c) = server_with_bucket("bkt-one").await;
    // One's own bucket again: 200 in us-east-1 (AWS's legacy behaviour).
    mkbucket(&c, "bkt-one").await.unwrap();
    let (code, _) = mkbucket(&s.client(OTHER), "bkt-one").await.unwrap_err();
    assert_eq!(code, "BucketAlreadyExists");
    let (code, _) = mkbucket(&c, "Bad_Name").await.unwrap_err();
    assert_eq!(code, "InvalidBucketName");

    let h = c.head_bucket().bucket("bkt-one").send().await.unwrap();
    assert_eq!(h.bucket_region(), Some("us-east-1"));
    let (_, status) = fails(c.head_bucket().bucket("no-such-bkt").send().await);
    assert_eq!(status, 404);

    let loc = c.get_bucket_location().bucket("bkt-one").send().await;
    let loc = loc.unwrap();
    assert!(
        loc.location_constraint()
            .is_none_or(|l| l.as_str().is_empty())
    );
    assert_eq!(crate::support::bucket_names(&c).await, ["bkt-one"]);

    put(&c, "bkt-one", "k", b"x").await;
    let refused = rmbucket(&c, "bkt-one").await.unwrap_err();
    assert_eq!(refused, s3err("BucketNotEmpty", 409));
    delete(&c, "bkt-one", "k").await.unwrap();
    rmbucket(&c, "bkt-one").await.unwrap();
    let (code, _) = rmbucket(&c, "bkt-one").await.unwrap_err();
    assert_eq!(code, "NoSuchBucket");
    let (code, _) = get(&c, "bkt-one", "k").await.unwrap_err();
    assert_eq!(code, "NoSuchBucket");
    // The name is free again.
    mkbucket(&c, "bkt-one").await.unwrap();
}

#[tokio::test]
async fn object_round_trip_and_metadata() {
    let (_s, c) = server_with_bucket("objs").await;
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

    let g = get(&c, "objs", "dir/file.bin").await.unwrap();
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

    let h = head(&c, "objs", "dir/file.bin").await.unwrap();
    assert_eq!(h.e_tag(), p.e_tag());
    assert_eq!(h.content_length(), Some(300_000));
    let color = h.metadata().unwrap().get("color");
    assert_eq!(color.map(String::as_str), Some("blue"));

    // Empty object.
    put(&c, "objs", "empty", b"").await;
    let h = head(&c, "objs", "empty").await.unwrap();
    assert_eq!(h.content_length(), Some(0));
    assert_eq!(h.e_tag(), Some("\"d41d8cd98f00b204e9800998ecf8427e\""));

    // Overwrite, delete, missing.
    let e2 = put(&c, "objs", "dir/file.bin", b"new").await;
    assert_eq!(get_as(&c, "objs", "dir/file.bin").await.unwrap(), b"new");
    assert_ne!(Some(e2.as_str()), p.e_tag());
    delete(&c, "objs", "dir/file.bin").await.unwrap();
    let missing = get(&c, "objs", "dir/file.bin").await.unwrap_err();
    assert_eq!(missing, s3err("NoSuchKey", 404));
    let (_, status) = head(&c, "objs", "dir/file.bin").await.unwrap_err();
    assert_eq!(status, 404);
    // Deleting a missing key succeeds.
    delete(&c, "objs", "never").await.unwrap();
}

#[tokio::test]
async fn content_md5() {
    let (_s, c) = server_with_bucket("md5s").await;
    use base64::Engine as _;
    let b64 = |d: &[u8]| {
        use s3s::crypto::Checksum as _;
        base64::engine::general_purpose::STANDARD.encode(s3s::crypto::Md5::checksum(d))
    };
    let put_hello = |k: &str, md5: String| {
        let req = c.put_object().bucket("md5s").key(k).content_md5(md5);
        req.body(ByteStream::from_static(b"hello")).send()
    };
    put_hello("ok", b64(b"hello")).await.unwrap();
    let (code, status) = fails(put_hello("bad", b64(b"other")).await);
    assert_eq!((code.as_str(), status), ("BadDigest", 400));
    let (code, _) = head(&c, "md5s", "bad").await.unwrap_err();
    assert_eq!(code, "NotFound");
}

#[tokio::test]
async fn awkward_keys() {
    let (s, c) = server_with_bucket("keys").await;
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
    let all_read_back = async |c: &aws_sdk_s3::Client| {
        for (i, k) in keys.iter().enumerate() {
            let got = get_as(c, "keys", k).await;
            assert_eq!(got.unwrap(), format!("v{i}").as_bytes(), "{k}");
        }
    };
    all_read_back(&c).await;
    let mut want: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    want.sort();
    assert_eq!(list_keys(&c, "keys").await, want);
    // Too long.
    let (code, _) = try_put(&c, "keys", &"k".repeat(1025), b"x")
        .await
        .unwrap_err();
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
    all_read_back(&s.admin()).await;
}

#[tokio::test]
async fn ranged_reads() {
    let (_s, c) = server_with_bucket("ranges").await;
    let body = data(5000, 7);
    put(&c, "ranges", "obj", &body).await;
    let ranged = |range: &str| c.get_object().bucket("ranges").key("obj").range(range);
    for (range, from, to) in [
        ("bytes=0-9", 0usize, 10usize),
        ("bytes=10-", 10, 5000),
        ("bytes=-5", 4995, 5000),
        ("bytes=4990-9999", 4990, 5000),
        ("bytes=-99999", 0, 5000),
        ("bytes=4999-4999", 4999, 5000),
    ] {
        let g = ranged(range).send().await.unwrap();
        let want = format!("bytes {from}-{}/5000", to - 1);
        assert_eq!(g.content_range(), Some(want.as_str()), "{range}");
        assert_eq!(g.content_length(), Some((to - from) as i64));
        let got = g.body.collect().await.unwrap().to_vec();
        assert_eq!(got, &body[from..to], "{range}");
    }
    // The raw 206 of a presigned ranged GET.
    let url = presigned_get(&c, "ranges", "obj", presign_for(60)).await;
    let r = raw("GET", &url, &[("range", "bytes=5-9")], Bytes::new()).await;
    assert_eq!(r.status, 206);
    let (code, status) = fails(ranged("bytes=5000-").send().await);
    assert_eq!((code.as_str(), status), ("InvalidRange", 416));
}

#[tokio::test]
async fn conditional_requests() {
    let (_s, c) = server_with_bucket("conds").await;
    let etag = put(&c, "conds", "o", b"data").await;
    let past = DateTime::from_secs(1_000_000_000);
    let future = DateTime::from_secs(4_000_000_000);
    let g = || c.get_object().bucket("conds").key("o");
    g().if_match(&etag).send().await.unwrap();
    g().if_match("*").send().await.unwrap();
    g().if_none_match("\"other\"").send().await.unwrap();
    g().if_modified_since(past).send().await.unwrap();
    g().if_unmodified_since(future).send().await.unwrap();
    let (code, status) = fails(g().if_match("\"nope\"").send().await);
    assert_eq!((code.as_str(), status), ("PreconditionFailed", 412));
    let (_, status) = fails(g().if_unmodified_since(past).send().await);
    assert_eq!(status, 412);
    let (_, status) = fails(g().if_none_match(&etag).send().await);
    assert_eq!(status, 304);
    let (_, status) = fails(g().if_modified_since(future).send().await);
    assert_eq!(status, 304);
    // HEAD too.
    let h = || c.head_object().bucket("conds").key("o");
    let (_, status) = fails(h().if_none_match(&etag).send().await);
    assert_eq!(status, 304);
    let (_, status) = fails(h().if_match("\"x\"").send().await);
    assert_eq!(status, 412);
}

#[tokio::test]
async fn copy_object() {
    let (_s, c) = server_with_bucket("src-b").await;
    mkbucket(&c, "dst-b").await.unwrap();
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
    let copy = |b: &str, k: &str, src: &str| c.copy_object().bucket(b).key(k).copy_source(src);
    let r = copy("dst-b", "copy", "src-b/s").send().await.unwrap();
    assert_eq!(r.copy_object_result().unwrap().e_tag(), Some(etag.as_str()));
    let g = get(&c, "dst-b", "copy").await.unwrap();
    assert_eq!(g.content_type(), Some("text/x-src"));
    let m = g.metadata().unwrap().get("m");
    assert_eq!(m.map(String::as_str), Some("src"));
    assert_eq!(g.body.collect().await.unwrap().to_vec(), body);

    copy("dst-b", "replaced", "src-b/s")
        .metadata_directive(MetadataDirective::Replace)
        .content_type("text/x-new")
        .metadata("n", "new")
        .send()
        .await
        .unwrap();
    let h = head(&c, "dst-b", "replaced").await.unwrap();
    assert_eq!(h.content_type(), Some("text/x-new"));
    let md = h.metadata().unwrap();
    assert_eq!(md.get("n").map(String::as_str), Some("new"));
    assert!(!md.contains_key("m"));

    // Self-copy needs REPLACE.
    let (code, _) = fails(copy("src-b", "s", "src-b/s").send().await);
    assert_eq!(code, "InvalidRequest");
    copy("src-b", "s", "src-b/s")
        .metadata_directive(MetadataDirective::Replace)
        .metadata("m", "again")
        .send()
        .await
        .unwrap();
    // Copy-source conditions and missing sources.
    let guarded = copy("dst-b", "x", "src-b/s").copy_source_if_match("\"nope\"");
    let (_, status) = fails(guarded.send().await);
    assert_eq!(status, 412);
    let (code, _) = fails(copy("dst-b", "x", "src-b/missing").send().await);
    assert_eq!(code, "NoSuchKey");
    // Unicode and slashes in the source key (URL-encoded copy source).
    put(&c, "src-b", "dir/é x", b"u").await;
    let unicode = copy("dst-b", "u", "src-b/dir/%C3%A9%20x");
    unicode.send().await.unwrap();
    assert_eq!(get_as(&c, "dst-b", "u").await.unwrap(), b"u");
}

#[tokio::test]
async fn delete_objects() {
    let (_s, c) = server_with_bucket("dels").await;
    for k in ["a", "b", "c"] {
        put(&c, "dels", k, b"x").await;
    }
    let id = |k: &str| ObjectIdentifier::builder().key(k).build().unwrap();
    let ids = ["a", "b", "missing"].map(id).to_vec();
    let delete = Delete::builder().set_objects(Some(ids)).build().unwrap();
    let r = c
        .delete_objects()
        .bucket("dels")
        .delete(delete)
        .send()
        .await;
    let r = r.unwrap();
    let mut deleted: Vec<_> = r.deleted().iter().map(|d| d.key().unwrap()).collect();
    deleted.sort_unstable();
    assert_eq!(deleted, ["a", "b", "missing"]);
    assert!(r.errors().is_empty());
    assert_eq!(list_keys(&c, "dels").await, ["c"]);
    let quiet = Delete::builder().objects(id("c")).quiet(true).build();
    let r = c
        .delete_objects()
        .bucket("dels")
        .delete(quiet.unwrap())
        .send();
    assert!(r.await.unwrap().deleted().is_empty());
}

#[tokio::test]
async fn listings() {
    let (_s, c) = server_with_bucket("lists").await;
    let keys = ["a", "a/b", "a/c/d", "a/c/e", "b", "b/x", "c", "Z", "é", "~"];
    for k in keys {
        put(&c, "lists", k, b"1").await;
    }
    let v2 = || c.list_objects_v2().bucket("lists");
    let all = v2().send().await.unwrap();
    // Byte order: 'Z' < 'a' < '~' < 'é'.
    assert_eq!(
        object_keys(all.contents()),
        ["Z", "a", "a/b", "a/c/d", "a/c/e", "b", "b/x", "c", "~", "é"]
    );
    assert_eq!(all.key_count(), Some(10));
    assert_eq!(all.is_truncated(), Some(false));
    let o = &all.contents()[0];
    assert_eq!(o.size(), Some(1));
    assert_eq!(o.e_tag(), Some(format!("\"{}\"", md5_hex(b"1")).as_str()));
    assert!(o.owner().is_none());

    let d = v2().delimiter("/").send().await.unwrap();
    let cps: Vec<_> = d
        .common_prefixes()
        .iter()
        .map(|p| p.prefix().unwrap())
        .collect();
    assert_eq!(object_keys(d.contents()), ["Z", "a", "b", "c", "~", "é"]);
    assert_eq!(cps, ["a/", "b/"]);

    let d = v2().prefix("a/").delimiter("/").send().await.unwrap();
    assert_eq!(object_keys(d.contents()), ["a/b"]);
    assert_eq!(d.common_prefixes()[0].prefix(), Some("a/c/"));

    // Pagination with continuation tokens and a delimiter: each entry once.
    let mut token: Option<String> = None;
    let mut seen = Vec::new();
    loop {
        let p = v2()
            .delimiter("/")
            .max_keys(2)
            .set_continuation_token(token);
        let p = p.send().await.unwrap();
        assert!(p.key_count().unwrap() <= 2);
        seen.extend(object_keys(p.contents()).into_iter().map(str::to_owned));
        let prefixes = p.common_prefixes().iter();
        seen.extend(prefixes.map(|o| o.prefix().unwrap().to_owned()));
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

    let sa = v2().start_after("b/x").send().await.unwrap();
    assert_eq!(object_keys(sa.contents()), ["c", "~", "é"]);

    let fo = v2().fetch_owner(true).max_keys(1).send().await.unwrap();
    // The owner is the writer, by canonical id (derived from the access key
    // when the config sets none) and display name (the canonical id when
    // none is configured: the access key id is never shown).
    let owner = fo.contents()[0].owner().unwrap();
    let admin_id = storage_target::config::default_canonical_id(ADMIN.0);
    assert_eq!(owner.id(), Some(admin_id.as_str()));
    assert_eq!(owner.display_name(), Some(admin_id.as_str()));
    assert_eq!(fo.is_truncated(), Some(true));

    let (code, _) = fails(v2().continuation_token("!!bad!!").send().await);
    assert_eq!(code, "InvalidArgument");

    let z = v2().max_keys(0).send().await.unwrap();
    assert!(z.contents().is_empty());

    // encoding-type=url: keys come back percent-encoded.
    put(&c, "lists", "sp ace/ü", b"1").await;
    let u = v2().prefix("sp").encoding_type(EncodingType::Url).send();
    assert_eq!(
        u.await.unwrap().contents()[0].key(),
        Some("sp%20ace/%C3%BC")
    );

    // ListObjects v1 with markers.
    let mut marker: Option<String> = None;
    let mut v1 = Vec::new();
    loop {
        let p = c
            .list_objects()
            .bucket("lists")
            .max_keys(3)
            .set_marker(marker);
        let p = p.send().await.unwrap();
        v1.extend(object_keys(p.contents()).into_iter().map(str::to_owned));
        if p.is_truncated() != Some(true) {
            break;
        }
        let next = p.next_marker().map(str::to_owned);
        marker = Some(next.unwrap_or_else(|| v1.last().unwrap().clone()));
    }
    assert_eq!(v1.len(), 11);
    let d1 = c.list_objects().bucket("lists").delimiter("/").prefix("a");
    let d1 = d1.send().await.unwrap();
    assert_eq!(object_keys(d1.contents()), ["a"]);
    assert_eq!(d1.common_prefixes()[0].prefix(), Some("a/"));
}

#[tokio::test]
async fn multipart_64mib() {
    let (s, c) = server_with_bucket("mpu").await;
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

    let uploads = || c.list_multipart_uploads().bucket("mpu").send();
    let listed = uploads().await.unwrap();
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
    let list_parts = || {
        c.list_parts()
            .bucket("mpu")
            .key("big/object")
            .upload_id(&id)
    };
    let lp = list_parts().send().await.unwrap();
    assert_eq!(lp.parts().len(), 8);
    assert_eq!(lp.parts()[0].part_number(), Some(1));
    assert_eq!(lp.parts()[0].size(), Some(part_size as i64));
    let lp = list_parts().max_parts(3).send().await.unwrap();
    assert_eq!(lp.parts().len(), 3);
    assert_eq!(lp.is_truncated(), Some(true));

    let complete = |v: &[(i32, String)]| {
        let req = c
            .complete_multipart_upload()
            .bucket("mpu")
            .key("big/object");
        req.upload_id(&id).multipart_upload(completed(v)).send()
    };
    // Wrong order, wrong ETag, missing part.
    let mut swapped = parts.clone();
    swapped.swap(0, 1);
    assert_eq!(fails(complete(&swapped).await).0, "InvalidPartOrder");
    let mut bad = parts.clone();
    bad[2].1 = "\"00000000000000000000000000000000\"".into();
    assert_eq!(fails(complete(&bad).await).0, "InvalidPart");
    let mut extra = parts.clone();
    extra.push((9, "\"00000000000000000000000000000000\"".into()));
    assert_eq!(fails(complete(&extra).await).0, "InvalidPart");

    let done = complete(&parts).await.unwrap();
    let mut cat = Vec::new();
    for (_, e) in &parts {
        cat.extend(hex::decode(e.trim_matches('"')).unwrap());
    }
    let want_etag = format!("\"{}-8\"", md5_hex(&cat));
    assert_eq!(done.e_tag(), Some(want_etag.as_str()));

    let g = get(&c, "mpu", "big/object").await.unwrap();
    assert_eq!(g.e_tag(), Some(want_etag.as_str()));
    assert_eq!(g.content_type(), Some("application/x-big"));
    let kind = g.metadata().unwrap().get("kind");
    assert_eq!(kind.map(String::as_str), Some("multipart"));
    assert_eq!(g.parts_count(), Some(8));
    let got = g.body.collect().await.unwrap().to_vec();
    assert!(got == body, "multipart content differs");

    // The upload is gone.
    let (code, _) = fails(list_parts().send().await);
    assert_eq!(code, "NoSuchUpload");
    assert!(uploads().await.unwrap().uploads().is_empty());
    assert!(common::files_under(&s.data_dir.join(".uploads")).is_empty());
    assert!(common::files_under(&s.data_dir.join(".tmp")).is_empty());
}

#[tokio::test]
async fn multipart_small_parts_abort_and_restart() {
    let mut s = Server::start();
    let c = s.admin();
    mkbucket(&c, "mpu2").await.unwrap();
    let id = start_upload(&c, "mpu2", "k").await;
    let part = |c: &aws_sdk_s3::Client, k: &str, id: &str, n: i32, body: ByteStream| {
        let req = c.upload_part().bucket("mpu2").key(k).upload_id(id);
        req.part_number(n).body(body).send()
    };
    let mut parts = Vec::new();
    for n in 1..=2 {
        let body = ByteStream::from(vec![n as u8; 1000]);
        let e = part(&c, "k", &id, n, body).await.unwrap().e_tag.unwrap();
        parts.push((n, e));
    }
    // Parts survive a restart.
    s.restart();
    let c = s.admin();
    let lp = c.list_parts().bucket("mpu2").key("k").upload_id(&id).send();
    assert_eq!(lp.await.unwrap().parts().len(), 2);
    let complete = |u: CompletedMultipartUpload| {
        let req = c.complete_multipart_upload().bucket("mpu2").key("k");
        req.upload_id(&id).multipart_upload(u).send()
    };
    let (code, status) = fails(complete(completed(&parts)).await);
    assert_eq!((code.as_str(), status), ("EntityTooSmall", 400));
    // A single small part is fine (the last part may be small).
    let one = complete(completed(&parts[..1])).await.unwrap();
    assert!(one.e_tag().unwrap().ends_with("-1\""));
    assert_eq!(get_as(&c, "mpu2", "k").await.unwrap(), vec![1u8; 1000]);

    let id2 = start_upload(&c, "mpu2", "k2").await;
    let abort = |id: &str| {
        let req = c.abort_multipart_upload().bucket("mpu2").key("k2");
        req.upload_id(id).send()
    };
    abort(&id2).await.unwrap();
    let late = part(&c, "k2", &id2, 1, ByteStream::from_static(b"x")).await;
    assert_eq!(fails(late).0, "NoSuchUpload");
    assert_eq!(fails(abort("../../x").await).0, "NoSuchUpload");
}

#[tokio::test]
async fn request_ids_and_metrics() {
    let (s, c) = server_with_bucket("ids").await;
    let e = c.get_object().bucket("ids").key("missing").send().await;
    let rid = e.unwrap_err().request_id().unwrap().to_owned();
    assert_eq!(rid.len(), 16);
    let r = raw_get(&s.url("/ids/missing")).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.xml("Code").as_deref(), Some("AccessDenied"));
    assert_eq!(r.xml("RequestId").as_deref(), r.header("x-amz-request-id"));
    assert!(r.header("x-amz-id-2").is_some());
    let ok = c.head_bucket().bucket("ids").send().await.unwrap();
    assert!(ok.request_id().is_some());

    let m = raw_get(&s.metrics).await;
    assert_eq!(m.status, 200);
    let text = m.text();
    assert!(
        text.contains("s3dma_storage_target_requests_total{op=\"GetObject\",outcome=\"404\"} 1"),
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
    mkbucket(&s.admin(), "term").await.unwrap();
    assert!(
        s.terminate(),
        "storage-target did not exit cleanly on SIGTERM"
    );
}
