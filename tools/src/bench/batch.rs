//! The batch phase: the tenant API's batched calls on small objects (4 KiB,
//! 64 KiB) in batches of 1, 16 and 64, one batched call at a time, beside
//! aws-sdk-s3 over HTTP with as many single requests in flight as a batch
//! has objects; objects/s, the latency of one call and the CPU per object
//! of each process (utime+stime over the cell, polling included). Then one
//! HEAD of 1,000 keys in one batched call (the median of 5, after one
//! untimed). `--quick` measures the 4 KiB objects only.

use std::sync::Arc;

use anyhow::{Context as _, anyhow, bail};
use bytes::Bytes;
use s3dma_client::{Buffer, GetItem, ObjectKey, PutItem, PutOptions};
use tokio::time::Instant;

use super::large::{http_get_exactly, http_put};
use super::small::cell;
use super::{BUCKET, Ctx, Plan, SMALL};
use crate::options::progress;
use crate::report::{BatchCell, BatchOp, CellCpu, CellStats, CpuSecs, Report, Size, human_size};
use crate::stats::median;

/// Objects per batched call (and HTTP requests in flight beside it).
pub(super) const BATCHES: [usize; 3] = [1, 16, 64];

/// Keys of the HEAD of 1,000 keys.
pub(super) const HEAD_KEYS: usize = 1000;

/// Timed calls of the HEAD of 1,000 keys (the median is kept).
const HEAD_ROUNDS: usize = 5;

/// The `i`th object of `size` the batch cells use.
pub(super) fn batch_key(size: Size, i: usize) -> String {
    format!("batch/{}/{i:03}", size.key)
}

/// The `i`th key of the HEAD of 1,000 keys.
pub(super) fn head_key(i: usize) -> String {
    format!("batch/head/{i:04}")
}

/// The s3dma side of one batched cell: `size`'d objects `0..batch` at
/// offsets `i * size` of `buf`.
async fn s3dma_cell(
    ctx: &Ctx,
    plan: &Plan,
    op: BatchOp,
    size: Size,
    batch: usize,
    buf: Buffer,
) -> anyhow::Result<(Buffer, CellStats, CpuSecs)> {
    let n = usize::try_from(size.bytes)?;
    let keys: Arc<Vec<String>> = Arc::new((0..batch).map(|i| batch_key(size, i)).collect());
    let client = ctx.client.clone();
    let concurrency = u32::try_from(batch)?;
    let (mut back, stats, cpu) = cell(ctx, plan, vec![buf], move |_, mut buf: Buffer| {
        let client = client.clone();
        let keys = Arc::clone(&keys);
        async move {
            let r = match op {
                BatchOp::Get => {
                    let items: Vec<GetItem> = keys
                        .iter()
                        .enumerate()
                        .map(|(i, key)| GetItem {
                            bucket: BUCKET.into(),
                            key: key.clone(),
                            range: None,
                            offset: i * n,
                            length: Some(size.bytes),
                            if_match: None,
                        })
                        .collect();
                    match client.get_objects(&mut buf, &items, concurrency).await {
                        Ok(results) => check_items(&keys, results, |o| {
                            (o.bytes_placed == size.bytes)
                                .then_some(())
                                .ok_or_else(|| format!("{} bytes", o.bytes_placed))
                        }),
                        Err(e) => Err(anyhow!("s3dma GetObjects of {}: {e}", keys.len())),
                    }
                }
                BatchOp::Put => {
                    let items = put_items(&keys, n);
                    match client.put_objects(&buf, &items, concurrency).await {
                        Ok(results) => check_items(&keys, results, |_| Ok(())),
                        Err(e) => Err(anyhow!("s3dma PutObjects of {}: {e}", keys.len())),
                    }
                }
                BatchOp::Head => {
                    let items = object_keys(&keys);
                    match client.head_objects(&items, concurrency).await {
                        Ok(results) => check_items(&keys, results, |o| match o {
                            Some(info) if info.size == size.bytes => Ok(()),
                            Some(info) => Err(format!("{} bytes", info.size)),
                            None => Err("missing".into()),
                        }),
                        Err(e) => Err(anyhow!("s3dma HeadObjects of {}: {e}", keys.len())),
                    }
                }
            };
            (buf, r)
        }
    })
    .await?;
    let buf = back
        .pop()
        .ok_or_else(|| anyhow!("the batch worker lost its buffer"))?;
    Ok((buf, stats, cpu))
}

/// PutObjects items: the `i`th of `keys` from `n` bytes at `i * n`.
fn put_items(keys: &[String], n: usize) -> Vec<PutItem> {
    keys.iter()
        .enumerate()
        .map(|(i, key)| PutItem {
            bucket: BUCKET.into(),
            key: key.clone(),
            offset: i * n,
            length: n,
            opts: PutOptions::default(),
        })
        .collect()
}

/// `keys` in the bench's bucket.
fn object_keys(keys: &[String]) -> Vec<ObjectKey> {
    keys.iter()
        .map(|key| ObjectKey {
            bucket: BUCKET.into(),
            key: key.clone(),
        })
        .collect()
}

/// Every item of a batch succeeded and passes `check`.
fn check_items<T, E: std::fmt::Display>(
    keys: &[String],
    results: Vec<Result<T, E>>,
    check: impl Fn(&T) -> Result<(), String>,
) -> anyhow::Result<()> {
    if results.len() != keys.len() {
        bail!("{} results for {} items", results.len(), keys.len());
    }
    for (key, r) in keys.iter().zip(results) {
        match r {
            Ok(v) => check(&v).map_err(|m| anyhow!("s3dma batch item {key}: {m}"))?,
            Err(e) => bail!("s3dma batch item {key}: {e}"),
        }
    }
    Ok(())
}

/// The HTTP side: `batch` single requests in flight on the same objects.
async fn http_cell(
    ctx: &Ctx,
    plan: &Plan,
    op: BatchOp,
    size: Size,
    batch: usize,
    body: Bytes,
) -> anyhow::Result<(CellStats, CpuSecs)> {
    let n = usize::try_from(size.bytes)?;
    let dsts: Vec<Vec<u8>> = (0..batch).map(|_| vec![0u8; n]).collect();
    let s3 = ctx.s3.clone();
    let (_, stats, cpu) = cell(ctx, plan, dsts, move |i, mut dst: Vec<u8>| {
        let s3 = s3.clone();
        let body = body.clone();
        async move {
            let key = batch_key(size, i);
            let r = match op {
                BatchOp::Get => http_get_exactly(&s3, &key, &mut dst, n).await,
                BatchOp::Put => http_put(&s3, &key, body).await,
                BatchOp::Head => match s3.head_object().bucket(BUCKET).key(&key).send().await {
                    Ok(o) if o.content_length() == i64::try_from(n).ok() => Ok(()),
                    Ok(o) => Err(anyhow!("HTTP HEAD {key}: {:?} bytes", o.content_length())),
                    Err(e) => Err(anyhow!(
                        "HTTP HEAD {key}: {}",
                        aws_sdk_s3::error::DisplayErrorContext(e)
                    )),
                },
            };
            (dst, r)
        }
    })
    .await?;
    Ok((stats, cpu))
}

/// Writes the [`HEAD_KEYS`] objects of `n` bytes each from `buf` (which
/// holds at least `most * n`), `most` in each PutObjects call.
async fn write_head_keys(ctx: &Ctx, buf: &Buffer, n: usize, most: usize) -> anyhow::Result<()> {
    let keys: Vec<String> = (0..HEAD_KEYS).map(head_key).collect();
    for chunk in keys.chunks(most) {
        let items = put_items(chunk, n);
        let results = ctx
            .client
            .put_objects(buf, &items, 0)
            .await
            .map_err(|e| anyhow!("s3dma PutObjects of {} keys: {e}", items.len()))?;
        check_items(chunk, results, |_| Ok(()))?;
    }
    Ok(())
}

pub(super) async fn batch(
    ctx: &Ctx,
    plan: &Plan,
    src: &Buffer,
    report: &mut Report,
) -> anyhow::Result<()> {
    let most = BATCHES.iter().copied().max().unwrap_or(1);
    let biggest = usize::try_from(SMALL.iter().map(|s| s.bytes).max().unwrap_or(4096))?;
    progress(&format!(
        "batched calls: {most} objects per size, one {} buffer",
        human_size((most * biggest) as u64)
    ));
    let mut buf = ctx
        .client
        .alloc_labeled(most * biggest, "bench-batch")
        .await
        .context("allocating the batch buffer")?;
    let len = buf.len();
    buf.as_mut_slice()
        .copy_from_slice(&src.as_slice()[..len.min(src.len())]);
    let body = Bytes::copy_from_slice(&src.as_slice()[..biggest]);

    // `--quick` (CI) measures the 4 KiB objects only.
    let sizes = if plan.quick { &SMALL[..1] } else { &SMALL[..] };
    for &size in sizes {
        let n = usize::try_from(size.bytes)?;
        for i in 0..most {
            ctx.client
                .put_object_from(
                    BUCKET,
                    &batch_key(size, i),
                    &buf,
                    i * n..(i + 1) * n,
                    PutOptions::default(),
                )
                .await
                .context("writing the batch objects")?;
        }
        for op in [BatchOp::Get, BatchOp::Put, BatchOp::Head] {
            for b in BATCHES {
                let label = format!("batched {} {} x{b}", op.label(), human_size(size.bytes));
                let (back, s3dma, s3dma_cpu) = s3dma_cell(ctx, plan, op, size, b, buf).await?;
                buf = back;
                let (http, http_cpu) = http_cell(ctx, plan, op, size, b, body.slice(..n)).await?;
                let objects_per_s = s3dma.ops_per_s.map(|o| o * b as f64);
                progress(&format!(
                    "{label}: s3dma {} objects/s, call p50 {} µs | HTTP {} ops/s p50 {} µs",
                    crate::report::fmt_num(objects_per_s),
                    crate::report::fmt_num(s3dma.p50_us),
                    crate::report::fmt_num(http.ops_per_s),
                    crate::report::fmt_num(http.p50_us),
                ));
                report.batches.push(BatchCell {
                    op,
                    size,
                    batch: b,
                    s3dma_objects_per_s: objects_per_s,
                    s3dma_call_p50_us: s3dma.p50_us,
                    s3dma_objects: s3dma.requests * b as u64,
                    http,
                    cpu: CellCpu {
                        s3dma: s3dma_cpu,
                        http: http_cpu,
                    },
                });
            }
        }
    }

    progress(&format!(
        "HEAD of {HEAD_KEYS} keys in one batched call: writing them"
    ));
    write_head_keys(ctx, &buf, usize::try_from(SMALL[0].bytes)?, most).await?;
    let mut ms = Vec::with_capacity(HEAD_ROUNDS);
    // One untimed call first (connections, caches).
    for round in 0..=HEAD_ROUNDS {
        let t = Instant::now();
        head_1000(ctx).await?;
        if round > 0 {
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    report.batch_head_1000_ms = median(&ms);
    progress(&format!(
        "HEAD of {HEAD_KEYS} keys in one batched call: {} ms (median of {HEAD_ROUNDS})",
        crate::report::fmt_num(report.batch_head_1000_ms)
    ));
    buf.release().await.context("releasing a buffer")?;
    Ok(())
}

/// One batched HEAD of the [`HEAD_KEYS`] keys, each found.
async fn head_1000(ctx: &Ctx) -> anyhow::Result<()> {
    let keys: Vec<String> = (0..HEAD_KEYS).map(head_key).collect();
    let items = object_keys(&keys);
    let results = ctx
        .client
        .head_objects(&items, 0)
        .await
        .map_err(|e| anyhow!("s3dma HeadObjects of {HEAD_KEYS}: {e}"))?;
    check_items(&keys, results, |o| {
        o.as_ref().map(|_| ()).ok_or_else(|| "missing".into())
    })
}
