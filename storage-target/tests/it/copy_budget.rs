//! Finding 5 of the third hardening round, as an attack: UploadPartCopy
//! writes a whole part for a request of a few hundred bytes, so 16
//! anonymous copies into a public-read-write bucket wrote 1 GiB; the
//! per-user byte cap (1 TiB) stopped it only when the disk was full. Now
//! copies count against a budget per minute (`multipart.
//! copy_bytes_per_minute_per_user`, 64 GiB; all anonymous callers together
//! `multipart.anonymous_copy_bytes_per_minute`, 64 MiB), refused with `503
//! SlowDown` before any byte is copied.

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{BucketCannedAcl, ObjectCannedAcl};
use bytes::Bytes;

use crate::common::{OTHER, Server, data, files_under, raw};

const MIB: usize = 1 << 20;

/// Bytes of the files under the in-progress uploads' directory.
fn uploads_on_disk(s: &Server) -> u64 {
    files_under(&s.data_dir.join(".uploads"))
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum()
}

/// An anonymous CreateMultipartUpload of `/pub/<key>`: its upload id.
async fn anonymous_upload(s: &Server, key: &str) -> String {
    let r = raw(
        "POST",
        &s.url(&format!("/pub/{key}?uploads")),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.xml("UploadId").expect("an upload id")
}

/// An anonymous UploadPartCopy of `/pub/src` as part `n`: status, body.
async fn anonymous_copy(s: &Server, key: &str, id: &str, n: u32) -> (u16, String) {
    let url = s.url(&format!("/pub/{key}?partNumber={n}&uploadId={id}"));
    let r = raw(
        "PUT",
        &url,
        &[("x-amz-copy-source", "/pub/src")],
        Bytes::new(),
    )
    .await;
    (r.status, r.text())
}

/// With the defaults: anonymous copies of an 8 MiB public object, 16 tries
/// as in the attack, stop after the anonymous class's 64 MiB (8 copies,
/// at most one more from what refills during the run); the refused copies
/// are `503 SlowDown` naming the budget and store nothing; another
/// anonymous upload is in the same class; a signed user copying more than
/// that is unaffected. (Without the budget all 16 copies were stored: 128
/// MiB on disk.)
#[tokio::test]
async fn anonymous_upload_part_copies_stop_at_the_anonymous_budget() {
    let s = Server::start();
    let admin = s.admin();
    admin
        .create_bucket()
        .bucket("pub")
        .acl(BucketCannedAcl::PublicReadWrite)
        .send()
        .await
        .unwrap();
    admin
        .put_object()
        .bucket("pub")
        .key("src")
        .acl(ObjectCannedAcl::PublicRead)
        .body(ByteStream::from(data(8 * MIB, 5)))
        .send()
        .await
        .unwrap();

    let id = anonymous_upload(&s, "dst").await;
    let (mut ok, mut refused) = (0u64, 0u64);
    for n in 1..=16 {
        let (status, body) = anonymous_copy(&s, "dst", &id, n).await;
        match status {
            200 => ok += 1,
            503 => {
                assert!(body.contains("SlowDown"), "{body}");
                assert!(
                    body.contains("multipart.anonymous_copy_bytes_per_minute"),
                    "{body}"
                );
                refused += 1;
            }
            other => panic!("copy {n}: {other} {body}"),
        }
    }
    assert!((8..=9).contains(&ok), "{ok} anonymous copies stored");
    assert_eq!(ok + refused, 16);
    let stored = uploads_on_disk(&s);
    assert!(
        stored <= ok * 8 * MIB as u64 + 64 * 1024,
        "{stored} bytes on disk for {ok} copies"
    );
    assert!(stored <= 9 * 8 * MIB as u64 + 64 * 1024, "{stored} bytes");
    // Every anonymous caller is one class: another upload is refused too.
    let other = anonymous_upload(&s, "dst2").await;
    let before = uploads_on_disk(&s);
    let (status, body) = anonymous_copy(&s, "dst2", &other, 1).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(uploads_on_disk(&s), before, "a refused copy stores nothing");

    // A signed user has a budget of its own (64 GiB a minute): more copies
    // than the anonymous class got, all stored.
    let c = s.client(OTHER);
    let mine = crate::support::start_upload(&c, "pub", "signed").await;
    for n in 1..=12 {
        c.upload_part_copy()
            .bucket("pub")
            .key("signed")
            .upload_id(&mine)
            .part_number(n)
            .copy_source("pub/src")
            .send()
            .await
            .unwrap_or_else(|e| panic!("signed copy {n}: {e:?}"));
    }
}
