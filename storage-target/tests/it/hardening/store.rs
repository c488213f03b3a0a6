//! Issue 30, the filesystem store: listings whose work is bounded by the
//! page, per-user caps on multipart uploads and their sweep, and the AWS
//! rules on who may use an upload, delete a bucket or name a version.

use std::path::Path;
use std::time::Duration;

use aws_sdk_s3::Client;
use aws_sdk_s3::types::{Delete, ObjectIdentifier};
use futures::StreamExt as _;
use storage_target::config::default_canonical_id;

use crate::common::{OWNER_A, OWNER_B, Server, data, get_as};
use crate::support::{
    S3Err, abort, complete, completed, delete, fails, head, list_parts, metrics_text, mkbucket,
    part_numbers, put, rmbucket, s3, s3err, start_upload, upload_ids, upload_part,
    upload_part_copy,
};

const VISITED: &str = "s3dma_storage_target_listing_entries_visited_total";

async fn visited(s: &Server, op: &str) -> i64 {
    let text = metrics_text(s).await;
    super::metric(&text, &format!("{VISITED}{{op=\"{op}\"}}"))
}

/// A bucket of `a` (owner) where `b` may write and read (bucket ACL).
async fn shared_bucket(a: &Client, name: &str) {
    mkbucket(a, name).await.unwrap();
    a.put_bucket_acl()
        .bucket(name)
        .grant_full_control(format!("id=\"{}\"", default_canonical_id(OWNER_A.0)))
        .grant_write(format!("id=\"{}\"", default_canonical_id(OWNER_B.0)))
        .grant_read(format!("id=\"{}\"", default_canonical_id(OWNER_B.0)))
        .send()
        .await
        .unwrap();
}

/// UploadPart `n` of `body` into upload `id` of `b/k`.
async fn part(
    c: &Client,
    b: &str,
    k: &str,
    id: &str,
    n: i32,
    body: Vec<u8>,
) -> Result<String, S3Err> {
    upload_part(c, (b, k, id), n, body).await
}

/// UploadPartCopy of `source` as part `n` of upload `id` of `b/k`.
async fn copy_part(
    c: &Client,
    b: &str,
    k: &str,
    id: &str,
    n: i32,
    source: &str,
) -> Result<String, S3Err> {
    upload_part_copy(c, (b, k, id), n, source).await
}

/// Issue 30 finding 7: a delimiter listing of a bucket whose keys roll up
/// into one common prefix reads a page's worth of index entries, not every
/// key under the prefix (which, read under the bucket's index lock on the
/// async runtime, delayed every other user's writes as the bucket grew).
/// Counted deterministically by the listings' visited-entries metric.
#[tokio::test]
async fn issue30_f7_delimiter_listings_do_not_walk_a_rolled_up_prefix() {
    const KEYS: usize = 3000;
    let s = Server::start();
    let a = s.client(OWNER_A);
    mkbucket(&a, "wide").await.unwrap();
    futures::stream::iter(0..KEYS)
        .map(|i| {
            let a = a.clone();
            async move { put(&a, "wide", &format!("big/{i:05}"), b"").await }
        })
        .buffer_unordered(32)
        .collect::<Vec<String>>()
        .await;
    put(&a, "wide", "after", b"").await;
    put(&a, "wide", "zz/1", b"").await;

    // ListObjectsV2: two common prefixes and a key, 3002 keys in the bucket.
    let before = visited(&s, "ListObjectsV2").await;
    let out = a.list_objects_v2().bucket("wide").delimiter("/").send();
    let out = out.await.unwrap();
    let cps: Vec<_> = out
        .common_prefixes()
        .iter()
        .map(|p| p.prefix().unwrap())
        .collect();
    assert_eq!(cps, ["big/", "zz/"]);
    assert_eq!(out.contents().len(), 1);
    let n = visited(&s, "ListObjectsV2").await - before;
    assert!((3..=4).contains(&n), "ListObjectsV2 read {n} entries");

    // Paging one entry at a time (max-keys 1): each page reads at most 2.
    let before = visited(&s, "ListObjectsV2").await;
    let mut token = None;
    let mut pages = 0;
    loop {
        let page = a
            .list_objects_v2()
            .bucket("wide")
            .delimiter("/")
            .max_keys(1);
        let out = page.set_continuation_token(token).send().await.unwrap();
        pages += 1;
        token = out.next_continuation_token().map(str::to_owned);
        if token.is_none() {
            break;
        }
    }
    assert_eq!(pages, 3);
    let n = visited(&s, "ListObjectsV2").await - before;
    assert!((3..=6).contains(&n), "3 pages read {n} entries");

    // ListObjects (v1) and ListObjectVersions likewise.
    let before = visited(&s, "ListObjects").await;
    let out = a.list_objects().bucket("wide").delimiter("/").send().await;
    let out = out.unwrap();
    assert_eq!(out.common_prefixes().len(), 2);
    let n = visited(&s, "ListObjects").await - before;
    assert!((3..=4).contains(&n), "ListObjects read {n} entries");
    let before = visited(&s, "ListObjectVersions").await;
    let versions = a.list_object_versions().bucket("wide").delimiter("/");
    let out = versions.send().await.unwrap();
    assert_eq!(out.common_prefixes().len(), 2);
    let n = visited(&s, "ListObjectVersions").await - before;
    assert!((3..=4).contains(&n), "ListObjectVersions read {n} entries");

    // ListMultipartUploads: 200 uploads under one prefix.
    futures::stream::iter(0..200)
        .map(|i| {
            let a = a.clone();
            async move { start_upload(&a, "wide", &format!("up/{i:03}")).await }
        })
        .buffer_unordered(16)
        .collect::<Vec<String>>()
        .await;
    start_upload(&a, "wide", "top").await;
    let before = visited(&s, "ListMultipartUploads").await;
    let uploads = a.list_multipart_uploads().bucket("wide").delimiter("/");
    let out = uploads.send().await.unwrap();
    assert_eq!(out.common_prefixes().len(), 1);
    assert_eq!(out.uploads().len(), 1);
    let n = visited(&s, "ListMultipartUploads").await - before;
    assert!(
        (2..=3).contains(&n),
        "ListMultipartUploads read {n} uploads"
    );
}

/// Issue 30 finding 12: an in-progress upload is its initiator's and the
/// bucket owner's, as in AWS. Another user who may write (and read) the
/// bucket cannot upload into it, copy into it, list its parts (with their
/// checksums), complete or abort it; the initiator's upload stays intact.
#[tokio::test]
async fn issue30_f12_another_writer_cannot_use_someone_elses_upload() {
    let s = Server::start();
    let (a, b) = (s.client(OWNER_A), s.client(OWNER_B));
    shared_bucket(&a, "mpu-shared").await;
    put(&a, "mpu-shared", "src", &data(1024, 1)).await;
    a.put_object_acl()
        .bucket("mpu-shared")
        .key("src")
        .grant_read(format!("id=\"{}\"", default_canonical_id(OWNER_B.0)))
        .send()
        .await
        .unwrap();

    // The owner's upload: b writes the bucket but did not start it.
    let id = start_upload(&a, "mpu-shared", "a-key").await;
    let e1 = part(&a, "mpu-shared", "a-key", &id, 1, data(1000, 2))
        .await
        .unwrap();
    let denied = |r: Result<String, S3Err>, what: &str| {
        assert_eq!(
            r.unwrap_err(),
            s3err("AccessDenied", 403),
            "b {what} a's upload"
        );
    };
    denied(
        part(&b, "mpu-shared", "a-key", &id, 1, data(10, 3)).await,
        "replaced a part of",
    );
    denied(
        part(&b, "mpu-shared", "a-key", &id, 2, data(10, 3)).await,
        "added a part to",
    );
    denied(
        copy_part(&b, "mpu-shared", "a-key", &id, 2, "mpu-shared/src").await,
        "copied a part into",
    );
    let upload = ("mpu-shared", "a-key", id.as_str());
    let listed = b.list_parts().bucket(upload.0).key(upload.1).upload_id(&id);
    let listed = s3(listed.send().await).map(drop);
    let done = complete(&b, upload.0, upload.1, &id, completed(&[(1, &e1)])).await;
    let aborted = abort(&b, upload.0, upload.1, &id).await;
    for refused in [listed, done.map(drop), aborted] {
        assert_eq!(refused, Err(s3err("AccessDenied", 403)));
    }
    // Intact: a's part, a's to complete.
    let parts = list_parts(&a, upload.0, upload.1, &id).await;
    assert_eq!(parts.parts().len(), 1);
    assert_eq!(parts.parts()[0].e_tag(), Some(e1.as_str()));
    let done = complete(&a, upload.0, upload.1, &id, completed(&[(1, &e1)])).await;
    done.unwrap();
    assert_eq!(
        get_as(&a, "mpu-shared", "a-key").await.unwrap(),
        data(1000, 2)
    );

    // b's own upload: b uses it, and so may the bucket's owner.
    let id = start_upload(&b, "mpu-shared", "b-key").await;
    part(&b, "mpu-shared", "b-key", &id, 1, data(10, 4))
        .await
        .unwrap();
    copy_part(&b, "mpu-shared", "b-key", &id, 2, "mpu-shared/src")
        .await
        .unwrap();
    assert_eq!(part_numbers(&b, "mpu-shared", "b-key", &id).await, [1, 2]);
    part(&a, "mpu-shared", "b-key", &id, 3, data(10, 5))
        .await
        .unwrap();
    assert_eq!(
        part_numbers(&a, "mpu-shared", "b-key", &id).await,
        [1, 2, 3]
    );
    abort(&a, "mpu-shared", "b-key", &id).await.unwrap();
    let gone = b
        .list_parts()
        .bucket("mpu-shared")
        .key("b-key")
        .upload_id(&id);
    assert_eq!(fails(gone.send().await).0, "NoSuchUpload");
}

/// Issue 30 finding 12: only the bucket's owner deletes a bucket, as in
/// AWS; a FULL_CONTROL grant in the bucket's ACL does not let another user.
#[tokio::test]
async fn issue30_f12_a_full_control_grantee_cannot_delete_the_bucket() {
    let s = Server::start();
    let (a, b) = (s.client(OWNER_A), s.client(OWNER_B));
    mkbucket(&a, "a-owns").await.unwrap();
    a.put_bucket_acl()
        .bucket("a-owns")
        .grant_full_control(format!("id=\"{}\"", default_canonical_id(OWNER_B.0)))
        .send()
        .await
        .unwrap();
    // The grant is real: b writes and reads the ACL.
    put(&b, "a-owns", "k", b"x").await;
    delete(&b, "a-owns", "k").await.unwrap();
    b.get_bucket_acl().bucket("a-owns").send().await.unwrap();
    let e = rmbucket(&b, "a-owns").await.unwrap_err();
    assert_eq!(e, s3err("AccessDenied", 403));
    a.head_bucket().bucket("a-owns").send().await.unwrap();
    rmbucket(&a, "a-owns").await.unwrap();
}

/// Issue 30 finding 12: DeleteObjects naming a version the store does not
/// have (buckets are unversioned: only `null` exists) answers NoSuchVersion
/// for that entry and leaves the current object alone; `null` deletes it.
#[tokio::test]
async fn issue30_f12_delete_objects_with_a_bogus_version_keeps_the_object() {
    let s = Server::start();
    let a = s.client(OWNER_A);
    mkbucket(&a, "versions").await.unwrap();
    put(&a, "versions", "k", b"keep me").await;
    put(&a, "versions", "n", b"null goes").await;
    let id = |k: &str, v: Option<&str>| {
        ObjectIdentifier::builder()
            .key(k)
            .set_version_id(v.map(str::to_owned))
            .build()
            .unwrap()
    };
    let out = a
        .delete_objects()
        .bucket("versions")
        .delete(
            Delete::builder()
                .objects(id("k", Some("3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY")))
                .objects(id("n", Some("null")))
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(out.errors().len(), 1, "{out:?}");
    let e = &out.errors()[0];
    assert_eq!(
        (e.key(), e.code()),
        (Some("k"), Some("NoSuchVersion")),
        "{e:?}"
    );
    assert_eq!(e.version_id(), Some("3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY"));
    assert_eq!(out.deleted().len(), 1);
    assert_eq!(out.deleted()[0].key(), Some("n"));
    head(&a, "versions", "k").await.unwrap();
    let gone = head(&a, "versions", "n").await;
    assert_eq!(gone.unwrap_err().1, 404);
}

fn caps(max_uploads: usize, max_bytes: &str, abort_after: &str) -> impl FnOnce(&Path) -> String {
    let yaml = format!(
        "multipart:\n  max_open_uploads_per_user: {max_uploads}\n  max_bytes_per_user: {max_bytes}\n  abort_incomplete_after: {abort_after}\n"
    );
    move |_| yaml
}

/// Issue 30 finding 10: one user's in-progress uploads are capped across
/// buckets (`multipart.max_open_uploads_per_user`), also after a restart;
/// other users are not affected, and aborting frees a slot.
#[tokio::test]
async fn issue30_f10_open_uploads_per_user_are_capped() {
    let mut s = Server::start_with(caps(3, "1GiB", "0"));
    let (a, b) = (s.client(OWNER_A), s.client(OWNER_B));
    mkbucket(&a, "caps-1").await.unwrap();
    mkbucket(&a, "caps-2").await.unwrap();
    mkbucket(&b, "caps-b").await.unwrap();
    let first = start_upload(&a, "caps-1", "k").await;
    start_upload(&a, "caps-1", "k").await;
    start_upload(&a, "caps-2", "k").await;
    let over = |c: Client, bucket: &'static str| async move {
        s3(c.create_multipart_upload()
            .bucket(bucket)
            .key("k")
            .send()
            .await)
        .map(drop)
    };
    let quota = s3err("QuotaExceeded", 403);
    assert_eq!(over(a.clone(), "caps-2").await.unwrap_err(), quota);
    start_upload(&b, "caps-b", "k").await;
    s.restart();
    let (a, b) = (s.client(OWNER_A), s.client(OWNER_B));
    let refused = over(a.clone(), "caps-1").await.unwrap_err();
    assert_eq!(refused, quota, "the count survives a restart");
    start_upload(&b, "caps-b", "k2").await;
    abort(&a, "caps-1", "k", &first).await.unwrap();
    over(a.clone(), "caps-1").await.unwrap();
    assert_eq!(upload_ids(&a, "caps-1").await.len(), 2);
}

/// Issue 30 finding 10: UploadPartCopy stores a whole part per small
/// request, so its bytes count against the initiator's byte cap
/// (`multipart.max_bytes_per_user`) like UploadPart's, checked before any
/// byte is copied: repeated copies of a large object stop at the cap,
/// nothing of the refused part is kept, and completing the upload frees it.
#[tokio::test]
async fn issue30_f10_upload_part_copy_counts_against_the_byte_cap() {
    const MIB: usize = 1 << 20;
    let s = Server::start_with(caps(10, "12MiB", "0"));
    let a = s.client(OWNER_A);
    mkbucket(&a, "copies").await.unwrap();
    put(&a, "copies", "big", &data(5 * MIB, 9)).await;
    let id = start_upload(&a, "copies", "dst").await;
    let e1 = copy_part(&a, "copies", "dst", &id, 1, "copies/big")
        .await
        .unwrap();
    let e2 = copy_part(&a, "copies", "dst", &id, 2, "copies/big")
        .await
        .unwrap();
    // 10 MiB held: a third 5 MiB copy passes 12 MiB.
    let third = copy_part(&a, "copies", "dst", &id, 3, "copies/big").await;
    assert_eq!(third.unwrap_err(), s3err("QuotaExceeded", 403));
    // So does an UploadPart of 3 MiB, into another upload of the same user.
    let other = start_upload(&a, "copies", "other").await;
    let over = part(&a, "copies", "other", &other, 1, data(3 * MIB, 1)).await;
    assert_eq!(over.unwrap_err(), s3err("QuotaExceeded", 403));
    part(&a, "copies", "other", &other, 1, data(MIB, 1))
        .await
        .unwrap();
    // Replacing a part counts its new size only.
    let e2 = {
        let again = copy_part(&a, "copies", "dst", &id, 2, "copies/big")
            .await
            .unwrap();
        assert_eq!(again, e2);
        again
    };
    assert_eq!(part_numbers(&a, "copies", "dst", &id).await, [1, 2]);
    // Nothing of the refused parts stays on disk (only the source object,
    // the two copied parts and the 1 MiB part).
    let on_disk: u64 = crate::common::files_under(&s.data_dir)
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum();
    assert!(
        on_disk < (16 * MIB + 64 * 1024) as u64,
        "{on_disk} bytes stored"
    );
    // Completing moves the parts into an object: the cap is free again.
    let parts = completed(&[(1, &e1), (2, &e2)]);
    complete(&a, "copies", "dst", &id, parts).await.unwrap();
    let id = start_upload(&a, "copies", "dst2").await;
    copy_part(&a, "copies", "dst2", &id, 1, "copies/big")
        .await
        .unwrap();
    copy_part(&a, "copies", "dst2", &id, 2, "copies/big")
        .await
        .unwrap();
}

/// Issue 30 finding 10: uploads nobody completes are aborted once older
/// than `multipart.abort_incomplete_after`, their parts deleted; an upload
/// of a server without the sweep stays (the default sweep is 7 days).
#[tokio::test]
async fn issue30_f10_incomplete_uploads_are_swept() {
    let s = Server::start_with(caps(10, "1GiB", "1"));
    let a = s.client(OWNER_A);
    mkbucket(&a, "sweep").await.unwrap();
    let id = start_upload(&a, "sweep", "k").await;
    part(&a, "sweep", "k", &id, 1, data(1000, 1)).await.unwrap();
    let uploads = s.data_dir.join(".uploads");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let listed = upload_ids(&a, "sweep").await;
        // The sweep hides the upload, deletes its parts, then logs (the log
        // reaches the test through a pipe, later than the files go): wait
        // for all three.
        if listed.is_empty()
            && std::fs::read_dir(&uploads).unwrap().count() == 0
            && s.log().contains("abort_incomplete_after")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the upload was never swept (or the sweep never logged): {}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let e = part(&a, "sweep", "k", &id, 2, data(10, 1))
        .await
        .unwrap_err();
    assert_eq!(e.0, "NoSuchUpload");
}
