//! s3dma batch requests (`POST /?s3dma-batch`) against the real binary:
//! HEADs, GETs and PUTs of one signed request, each GET or PUT with its own
//! window on the tcp fabric; per-item failures; the refusals of a whole
//! batch (signature, caps); a bucket the user may not use; a PUT whose
//! window cannot be read stores nothing.

use std::time::SystemTime;

use aws_sigv4::http_request::SignableBody;
use bytes::Bytes;
use fabric::Access;
use s3dma_wire::batch::{BatchReply, BatchRequest, Item, ItemReply};

use crate::common::{ADMIN, OTHER, READER, Raw, Server, create_bucket, data, raw, sign_v4_as};
use crate::rdma::{Tenant, rdma_server};
use crate::support::{assert_s3_error, metrics_text, stored};

/// The caps of the test server: small enough to be reached by a test.
const CAPS: &str = "  batch:\n    max_items: 8\n    max_body_bytes: 4KiB\n    max_bytes: 1MiB\n";

/// A batch body signed as `user` (its SHA-256 as the payload hash, the
/// marker signed), sent as `sent` (the signed body unless a test swaps it).
async fn send_as(s: &Server, user: (&str, &str), signed: &[u8], sent: &[u8]) -> Raw {
    let url = s.url("/?s3dma-batch");
    let headers = sign_v4_as(
        user,
        "POST",
        &url,
        &[
            ("x-amz-rdma-protocol", "s3dma-v1"),
            ("content-type", "application/json"),
        ],
        SignableBody::Bytes(signed),
        SystemTime::now(),
    );
    let hs: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(k, _)| k != "host")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    raw("POST", &url, &hs, Bytes::copy_from_slice(sent)).await
}

/// `items` as the admin; the reply's items (asserting a served batch).
async fn batch(s: &Server, user: (&str, &str), items: Vec<Item>) -> Vec<ItemReply> {
    let n = items.len();
    let body = BatchRequest::new(items).encode().unwrap();
    let r = send_as(s, user, &body, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-amz-rdma-batch"), Some("s3dma-v1"));
    BatchReply::parse(&r.body, n).unwrap().items
}

#[track_caller]
fn assert_item(r: &ItemReply, status: u16, code: Option<&str>) {
    assert_eq!(r.status, status, "{r:?}");
    assert_eq!(r.code.as_deref(), code, "{r:?}");
}

/// The value of the metric line that starts with `prefix` (0 if none).
fn metric(text: &str, prefix: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0, |v| v.parse().unwrap())
}

#[tokio::test]
async fn heads_gets_and_puts_in_one_request() {
    let s = rdma_server(CAPS);
    create_bucket(&s, "bat").await;
    let one = data(4096, 1);
    let two = data(100, 2);
    crate::common::sdk_put(&s, "bat", "one", one.clone()).await;
    crate::common::sdk_put(&s, "bat", "two", two.clone()).await;
    let t = Tenant::new(1 << 20).await;
    let rw = Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (wa, wb, wc) = (
        t.window(0, 8192, rw),
        t.window(8192, 16, rw),
        t.window(16384, 4096, rw),
    );
    t.fill(65536, 3000, 3);
    let wp = t.window(65536, 3000, Access::REMOTE_READ);
    let put_bytes = t.bytes(65536, 3000);
    let mut ranged = Item::get("bat", "two", &t.token(&wb));
    ranged.range = Some("10-19".into());
    let mut put = Item::put("bat", "new", &t.token(&wp));
    put.content_type = Some("text/plain".into());
    put.metadata.insert("color".into(), "blue".into());
    let replies = batch(
        &s,
        ADMIN,
        vec![
            Item::head("bat", "one"),
            Item::head("bat", "missing"),
            Item::get("bat", "one", &t.token(&wa)),
            ranged,
            Item::get("bat", "missing", &t.token(&wc)),
            put,
            Item::put("bat", "bad-token", "zz"),
            Item::get("bat", "one", "not-a-token"),
        ],
    )
    .await;
    assert_item(&replies[0], 200, None);
    assert_eq!(replies[0].size, Some(4096));
    assert!(
        replies[0]
            .etag
            .as_deref()
            .is_some_and(|e| e.starts_with('"'))
    );
    assert_item(&replies[1], 404, Some("NoSuchKey"));
    assert_item(&replies[2], 200, None);
    assert_eq!(
        (replies[2].size, replies[2].bytes),
        (Some(4096), Some(4096))
    );
    assert_eq!(replies[2].etag, replies[0].etag);
    assert_eq!(t.bytes(0, 4096), one);
    assert_item(&replies[3], 206, None);
    assert_eq!((replies[3].size, replies[3].bytes), (Some(100), Some(10)));
    assert_eq!(t.bytes(8192, 10), two[10..20]);
    assert_item(&replies[4], 404, Some("NoSuchKey"));
    assert_item(&replies[5], 200, None);
    assert_eq!(
        (replies[5].size, replies[5].bytes),
        (Some(3000), Some(3000))
    );
    let got = crate::common::sdk_get(&s, "bat", "new").await.unwrap();
    assert_eq!(got, put_bytes);
    let h = crate::support::head(&s.admin(), "bat", "new")
        .await
        .unwrap();
    assert_eq!(h.content_type(), Some("text/plain"));
    assert_eq!(
        h.metadata()
            .and_then(|m| m.get("color"))
            .map(String::as_str),
        Some("blue")
    );
    assert_eq!(h.e_tag(), replies[5].etag.as_deref());
    assert_item(&replies[6], 400, Some("InvalidRDMAToken"));
    assert!(!stored(&s, "bat", "bad-token").await);
    assert_item(&replies[7], 400, Some("InvalidRDMAToken"));

    // A HEAD of the new object in a second batch, and the counts.
    let r = batch(&s, ADMIN, vec![Item::head("bat", "new")]).await;
    assert_eq!(r[0].size, Some(3000));
    let m = metrics_text(&s).await;
    assert_eq!(
        metric(
            &m,
            "s3dma_storage_target_batch_requests_total{outcome=\"served\"}"
        ),
        2
    );
    assert_eq!(
        metric(
            &m,
            "s3dma_storage_target_batch_items_total{op=\"HeadObject\",outcome=\"ok\"}"
        ),
        2
    );
    assert_eq!(
        metric(
            &m,
            "s3dma_storage_target_batch_items_total{op=\"GetObject\",outcome=\"error\"}"
        ),
        2
    );
}

#[tokio::test]
async fn refusals_of_a_whole_batch_and_of_items() {
    let s = rdma_server(CAPS);
    create_bucket(&s, "bat").await;
    create_bucket(&s, "shared").await;
    crate::common::sdk_put(&s, "shared", "k", data(10, 1)).await;
    crate::common::sdk_put(&s, "bat", "k", data(10, 1)).await;
    let t = Tenant::new(1 << 20).await;
    t.fill(0, 4096, 7);
    let w = t.window(0, 4096, Access::REMOTE_READ | Access::REMOTE_WRITE);
    let tok = t.token(&w);
    let put = BatchRequest::new(vec![Item::put("bat", "p", &tok)])
        .encode()
        .unwrap();

    // Unsigned: refused, nothing stored.
    let url = s.url("/?s3dma-batch");
    let r = raw("POST", &url, &[], Bytes::from(put.clone())).await;
    assert_eq!(r.status, 403, "{}", r.text());
    // Signed with UNSIGNED-PAYLOAD: the body (its keys and tokens) is not
    // covered by the signature.
    let r = crate::common::send_signed(
        ADMIN,
        "POST",
        &url,
        &[("x-amz-rdma-protocol", "s3dma-v1")],
        &[],
    )
    .await;
    assert_s3_error(&r, 403, "AccessDenied");
    assert!(r.text().contains("x-amz-content-sha256"), "{}", r.text());
    // A wrong secret, and another user's key with one's own secret.
    let r = send_as(&s, (ADMIN.0, "wrong"), &put, &put).await;
    assert_eq!(r.status, 403, "{}", r.text());
    let r = send_as(&s, (OTHER.0, ADMIN.1), &put, &put).await;
    assert_eq!(r.status, 403, "{}", r.text());
    // A body other than the signed one.
    let other_body = BatchRequest::new(vec![Item::put("bat", "q", &tok)])
        .encode()
        .unwrap();
    let r = send_as(&s, ADMIN, &put, &other_body).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(!stored(&s, "bat", "p").await && !stored(&s, "bat", "q").await);

    // Caps: items, body, window bytes; each refused whole with a clear error.
    let nine: Vec<Item> = (0..9)
        .map(|i| Item::head("bat", &format!("k{i}")))
        .collect();
    let body = BatchRequest::new(nine).encode().unwrap();
    let r = send_as(&s, ADMIN, &body, &body).await;
    assert_s3_error(&r, 413, "EntityTooLarge");
    assert!(r.text().contains("at most 8"), "{}", r.text());
    assert_eq!(r.header("x-amz-rdma-batch"), Some("s3dma-v1"));
    let long: Vec<Item> = (0..5)
        .map(|i| Item::head("bat", &format!("{i}{}", "k".repeat(1000))))
        .collect();
    let body = BatchRequest::new(long).encode().unwrap();
    let r = send_as(&s, ADMIN, &body, &body).await;
    assert_s3_error(&r, 413, "EntityTooLarge");
    let mut huge: fabric::RdmaToken = tok.parse().unwrap();
    huge.size = 600 << 10;
    let two = vec![
        Item::put("bat", "h1", &huge.to_string()),
        Item::put("bat", "h2", &huge.to_string()),
    ];
    let body = BatchRequest::new(two).encode().unwrap();
    let r = send_as(&s, ADMIN, &body, &body).await;
    assert_s3_error(&r, 413, "EntityTooLarge");
    assert!(r.text().contains("rdma.batch.max_bytes"), "{}", r.text());
    assert!(!stored(&s, "bat", "h1").await);
    // Garbage.
    let r = send_as(&s, ADMIN, b"{\"version\":1,", b"{\"version\":1,").await;
    assert_s3_error(&r, 400, "MalformedBatch");

    // A user may read `shared` only: the other bucket's items, and its
    // PUT into `shared`, fail alone.
    let replies = batch(
        &s,
        READER,
        vec![
            Item::head("shared", "k"),
            Item::head("bat", "k"),
            Item::put("shared", "x", &tok),
            Item::get("shared", "k", &tok),
        ],
    )
    .await;
    assert_item(&replies[0], 200, None);
    assert_item(&replies[1], 403, Some("AccessDenied"));
    assert_item(&replies[2], 403, Some("AccessDenied"));
    assert_item(&replies[3], 200, None);
    assert!(!stored(&s, "shared", "x").await);

    // PUT items whose bytes cannot be read (a write-only window, a wrong
    // rkey) leave no object; the good one beside them is stored whole.
    let wo = t.window(8192, 1000, Access::REMOTE_WRITE);
    let mut bad: fabric::RdmaToken = tok.parse().unwrap();
    bad.rkey ^= 0x5a5a_5a5a;
    let replies = batch(
        &s,
        ADMIN,
        vec![
            Item::put("bat", "wo", &t.token(&wo)),
            Item::put("bat", "rkey", &bad.to_string()),
            Item::put("bat", "good", &tok),
        ],
    )
    .await;
    assert_item(&replies[0], 400, Some("RDMATransferFailed"));
    assert_item(&replies[1], 400, Some("RDMATransferFailed"));
    assert_item(&replies[2], 200, None);
    assert!(!stored(&s, "bat", "wo").await && !stored(&s, "bat", "rkey").await);
    let got = crate::common::sdk_get(&s, "bat", "good").await.unwrap();
    assert_eq!(got, t.bytes(0, 4096));
    let m = metrics_text(&s).await;
    assert!(
        metric(
            &m,
            "s3dma_storage_target_batch_requests_total{outcome=\"refused\"}"
        ) >= 5,
        "{m}"
    );
}

#[tokio::test]
async fn a_server_that_does_not_serve_batches_declines_with_501() {
    let s = rdma_server("  batch:\n    enabled: false\n");
    create_bucket(&s, "bat").await;
    let body = BatchRequest::new(vec![Item::head("bat", "k")])
        .encode()
        .unwrap();
    let r = send_as(&s, ADMIN, &body, &body).await;
    assert_s3_error(&r, 501, "NotImplemented");
    assert_eq!(r.header("x-amz-rdma-protocol-status"), Some("unsupported"));
    assert!(r.header("x-amz-rdma-batch").is_none());
}

/// A batched HEAD answers what HeadObject answers (it reads the bucket's
/// index, not the object's file): size, ETag, Last-Modified, content type
/// and metadata of a plain object, one with attributes, a multipart one
/// and an overwritten one; a deleted key is 404; `if_match` passes or
/// fails 412 as on the single request. Where the object's ACL decides
/// (another owner's objects), each caller gets what HeadObject gives them.
#[tokio::test]
async fn a_batched_head_answers_what_head_object_answers() {
    use aws_sdk_s3::primitives::ByteStream;
    use aws_sdk_s3::types::ObjectCannedAcl;

    use crate::common::{OWNER_A, OWNER_B};
    use crate::support::{
        complete, completed, delete, head, mkbucket, put, start_upload, upload_part,
    };

    let s = rdma_server(CAPS);
    create_bucket(&s, "heads").await;
    let admin = s.admin();
    put(&admin, "heads", "plain", b"plain bytes").await;
    let attrs = admin.put_object().bucket("heads").key("attrs");
    attrs
        .content_type("text/csv")
        .metadata("color", "blue")
        .metadata("shape", "round")
        .body(ByteStream::from_static(b"a,b\n"))
        .send()
        .await
        .unwrap();
    let id = start_upload(&admin, "heads", "multi").await;
    let e1 = upload_part(&admin, ("heads", "multi", &id), 1, data(5 << 20, 3));
    let e1 = e1.await.unwrap();
    let e2 = upload_part(&admin, ("heads", "multi", &id), 2, data(10, 4));
    let e2 = e2.await.unwrap();
    let parts = completed(&[(1, e1), (2, e2)]);
    complete(&admin, "heads", "multi", &id, parts)
        .await
        .unwrap();
    put(&admin, "heads", "over", b"first").await;
    put(&admin, "heads", "over", b"second, and longer").await;
    put(&admin, "heads", "gone", b"x").await;
    delete(&admin, "heads", "gone").await.unwrap();

    let keys = ["plain", "attrs", "multi", "over"];
    let mut items: Vec<Item> = keys.iter().map(|k| Item::head("heads", k)).collect();
    items.push(Item::head("heads", "gone"));
    let plain = head(&admin, "heads", "plain").await.unwrap();
    let mut matching = Item::head("heads", "plain");
    matching.if_match = plain.e_tag().map(str::to_owned);
    let mut differing = Item::head("heads", "plain");
    differing.if_match = Some("\"0123456789abcdef0123456789abcdef\"".into());
    items.extend([matching, differing]);
    let replies = batch(&s, ADMIN, items).await;
    for (k, r) in keys.iter().zip(&replies) {
        let h = head(&admin, "heads", k).await.unwrap();
        assert_item(r, 200, None);
        assert_eq!(r.size, h.content_length().map(|n| n as u64), "{k}");
        assert_eq!(r.etag.as_deref(), h.e_tag(), "{k}");
        let secs = h.last_modified().map(|t| t.secs());
        assert_eq!(r.last_modified_ms.map(|ms| ms / 1000), secs, "{k}");
        assert_eq!(r.content_type.as_deref(), h.content_type(), "{k}");
        let metadata = h.metadata().cloned().unwrap_or_default();
        assert_eq!(r.metadata, metadata.into_iter().collect(), "{k}");
    }
    assert_eq!(replies[1].content_type.as_deref(), Some("text/csv"));
    assert_eq!(
        replies[1].metadata.get("shape").map(String::as_str),
        Some("round")
    );
    assert_eq!(replies[2].size, Some((5 << 20) + 10));
    assert!(
        replies[2]
            .etag
            .as_deref()
            .is_some_and(|e| e.ends_with("-2\""))
    );
    assert_eq!(replies[3].size, Some(18));
    assert_item(&replies[4], 404, Some("NoSuchKey"));
    assert_item(&replies[5], 200, None);
    assert_item(&replies[6], 412, Some("PreconditionFailed"));

    // Owner A's bucket: a private object and a public-read one. Owner B
    // (no grant from the operator) gets what HeadObject gives B: the
    // public one, AccessDenied for the private one and for a missing key
    // (B may not list the bucket); A gets both, and NoSuchKey.
    let (a, b) = (s.client(OWNER_A), s.client(OWNER_B));
    mkbucket(&a, "a-heads").await.unwrap();
    put(&a, "a-heads", "private", b"a's").await;
    put(&a, "a-heads", "public", b"a's, shown").await;
    let acl = a.put_object_acl().bucket("a-heads").key("public");
    acl.acl(ObjectCannedAcl::PublicRead).send().await.unwrap();
    let items = || {
        ["private", "public", "missing"]
            .iter()
            .map(|k| Item::head("a-heads", k))
            .collect::<Vec<_>>()
    };
    let by_b = batch(&s, OWNER_B, items()).await;
    assert_item(&by_b[0], 403, Some("AccessDenied"));
    assert!(head(&b, "a-heads", "private").await.is_err());
    assert!(head(&b, "a-heads", "public").await.is_ok());
    assert_item(&by_b[1], 200, None);
    assert_eq!(by_b[1].size, Some(10));
    assert_item(&by_b[2], 403, Some("AccessDenied"));
    let by_a = batch(&s, OWNER_A, items()).await;
    assert_item(&by_a[0], 200, None);
    assert_item(&by_a[1], 200, None);
    assert_item(&by_a[2], 404, Some("NoSuchKey"));
}
