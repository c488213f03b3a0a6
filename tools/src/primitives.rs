//! Measurement primitives the bench phases share: the raw loopback TCP
//! limit, reproducible random bodies, and HTTP GETs into memory allocated
//! once.

use std::time::Duration;

use anyhow::{Context as _, anyhow};
use rand::{RngCore as _, SeedableRng as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

use crate::stats::gbps;

/// Fills `buf` with pseudo-random bytes, the same for the same `seed`.
pub(crate) fn fill_random(buf: &mut [u8], seed: u64) {
    rand::rngs::SmallRng::seed_from_u64(seed).fill_bytes(buf);
}

/// Creates `bucket` over HTTP unless it exists already.
pub(crate) async fn ensure_bucket(s3: &aws_sdk_s3::Client, bucket: &str) -> anyhow::Result<()> {
    match s3.create_bucket().bucket(bucket).send().await {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error().is_some_and(|s| {
                s.is_bucket_already_owned_by_you() || s.is_bucket_already_exists()
            }) =>
        {
            Ok(())
        }
        Err(e) => Err(anyhow!(
            "creating bucket {bucket}: {}",
            aws_sdk_s3::error::DisplayErrorContext(e)
        )),
    }
}

/// GETs `bucket/key` over HTTP, copying the body into `dst`; the byte count.
pub(crate) async fn http_get_into_from(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    dst: &mut [u8],
) -> anyhow::Result<usize> {
    let out = s3
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .map_err(|e| anyhow!("{}", aws_sdk_s3::error::DisplayErrorContext(e)))?;
    let mut body = out.body;
    let mut at = 0usize;
    while let Some(chunk) = body.try_next().await.context("reading the body")? {
        let end = at + chunk.len();
        let room = dst.len();
        let slot = dst
            .get_mut(at..end)
            .ok_or_else(|| anyhow!("the body is longer than {room} bytes"))?;
        slot.copy_from_slice(&chunk);
        at = end;
    }
    Ok(at)
}

/// One stream, large writes, for `dur`: GB/s received.
pub(crate) async fn raw_tcp(dur: Duration) -> anyhow::Result<f64> {
    const CHUNK: usize = 4 << 20;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let reader = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        let mut buf = vec![0u8; CHUNK];
        let mut total = 0u64;
        loop {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        Ok::<u64, std::io::Error>(total)
    });
    let mut w = tokio::net::TcpStream::connect(addr).await?;
    w.set_nodelay(true)?;
    let chunk = vec![0x5au8; CHUNK];
    let start = Instant::now();
    while start.elapsed() < dur {
        w.write_all(&chunk).await?;
    }
    w.shutdown().await?;
    drop(w);
    let received = reader.await.context("the reader task")??;
    gbps(received, start.elapsed()).ok_or_else(|| anyhow!("no time passed"))
}
