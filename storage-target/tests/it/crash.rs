//! kill -9 during a large PUT, then restart on the same data directory: the
//! old object is intact with its old ETag, no partial object is visible and
//! no leftover files remain.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use crate::common::{Server, data, files_under, md5_hex};
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use futures::SinkExt as _;
use http_body::Frame;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_large_put_keeps_old_object() {
    let mut s = Server::start();
    let c = s.admin();
    crate::support::mkbucket(&c, "crash").await.unwrap();
    let old = data(1 << 20, 5);
    let old_etag = c
        .put_object()
        .bucket("crash")
        .key("obj")
        .body(ByteStream::from(old.clone()))
        .send()
        .await
        .unwrap()
        .e_tag
        .unwrap();
    assert_eq!(old_etag, format!("\"{}\"", md5_hex(&old)));

    // A 1 GiB presigned PUT whose body we feed by hand and never finish.
    let p = c
        .put_object()
        .bucket("crash")
        .key("obj")
        .presigned(PresigningConfig::expires_in(Duration::from_secs(600)).unwrap())
        .await
        .unwrap();
    let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    let body = http_body_util::StreamBody::new(rx);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::StreamBody<_>>();
    let req = http::Request::builder()
        .method("PUT")
        .uri(p.uri())
        .header("content-length", (1u64 << 30).to_string())
        .body(body)
        .unwrap();
    let inflight = tokio::spawn(client.request(req));
    let chunk = Bytes::from(data(1 << 20, 9));
    for _ in 0..48 {
        tx.send(Ok(Frame::data(chunk.clone()))).await.unwrap();
    }
    // Wait until the server has written a good part of the body to its temp file.
    let tmp = s.data_dir.join(".tmp");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let written: u64 = files_under(&tmp)
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum();
        if written >= 16 << 20 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "server never wrote the body; log:\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.kill9();
    drop(tx);
    let _ = inflight.await;
    assert!(
        !files_under(&tmp).is_empty(),
        "the partial upload should be in .tmp before restart"
    );

    s.restart();
    assert!(files_under(&tmp).is_empty(), ".tmp not cleaned at start-up");
    let c = s.admin();
    let g = crate::support::get(&c, "crash", "obj").await.unwrap();
    assert_eq!(g.e_tag(), Some(old_etag.as_str()));
    assert_eq!(g.content_length(), Some(1 << 20));
    assert!(
        g.body.collect().await.unwrap().to_vec() == old,
        "old object content changed"
    );
    let listed = c.list_objects_v2().bucket("crash").send().await.unwrap();
    assert_eq!(listed.key_count(), Some(1));
    assert_eq!(listed.contents()[0].size(), Some(1 << 20));
    let objects = files_under(&s.data_dir.join("buckets/crash/objects"));
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert!(s.log().contains("removed leftovers of interrupted writes"));
}
