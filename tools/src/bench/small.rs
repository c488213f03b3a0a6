//! The small-object phase: GET and PUT at 1, 16 and 64 requests in flight,
//! through s3dma and over HTTP, with latencies and the CPU per request.

use std::sync::Arc;

use anyhow::{Context as _, anyhow, bail};
use bytes::Bytes;
use s3dma_client::{Buffer, GetOptions, PutOptions};
use tokio::time::Instant;

use super::large::{http_get_exactly, http_put};
use super::{BUCKET, Ctx, IN_FLIGHT, Plan, SMALL, layer_totals, layers_between};
use crate::options::progress;
use crate::report::{Cell, CellCpu, CellStats, CpuSecs, Layers, Op, Report, Size, human_size};
use crate::stats::{Latencies, per_second};

/// What one worker of a cell did.
struct WorkerResult<B> {
    state: B,
    lat: Latencies,
    error: Option<anyhow::Error>,
}

/// Runs `n` workers for warm-up + cell time; `work(i, state)` does one
/// request. Returns the states (in order), the merged latencies of requests
/// started after the warm-up, ops/s over the measured window, and the CPU
/// used during it.
pub(super) async fn cell<B, W, F>(
    ctx: &Ctx,
    plan: &Plan,
    states: Vec<B>,
    work: W,
) -> anyhow::Result<(Vec<B>, CellStats, CpuSecs)>
where
    B: Send + 'static,
    W: Fn(usize, B) -> F + Send + Sync + 'static,
    F: Future<Output = (B, anyhow::Result<()>)> + Send + 'static,
{
    let start = Instant::now();
    let measure_from = start + plan.warmup;
    let end = measure_from + plan.cell;
    let work = Arc::new(work);
    let mut handles = Vec::with_capacity(states.len());
    for (i, state) in states.into_iter().enumerate() {
        let work = Arc::clone(&work);
        handles.push(tokio::spawn(async move {
            let mut lat = Latencies::new();
            let mut state = Some(state);
            let mut error = None;
            while Instant::now() < end {
                let Some(s) = state.take() else { break };
                let t = Instant::now();
                let (s, r) = work(i, s).await;
                state = Some(s);
                match r {
                    Ok(()) if t >= measure_from => lat.record(t.elapsed()),
                    Ok(()) => {}
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            state.map(|state| WorkerResult { state, lat, error })
        }));
    }
    tokio::time::sleep_until(measure_from).await;
    let before = ctx.cpu.now()?;
    let mut lat = Latencies::new();
    let mut states = Vec::with_capacity(handles.len());
    let mut first_error = None;
    for h in handles {
        let r = h
            .await
            .context("a worker task failed")?
            .ok_or_else(|| anyhow!("a worker lost its state"))?;
        lat.merge(&r.lat);
        if first_error.is_none() {
            first_error = r.error;
        }
        states.push(r.state);
    }
    let elapsed = measure_from.elapsed();
    let cpu = ctx.cpu.since(before)?;
    if let Some(e) = first_error {
        bail!("{e}");
    }
    let stats = CellStats {
        ops_per_s: per_second(lat.count(), elapsed),
        p50_us: lat.quantile_us(0.5),
        p99_us: lat.quantile_us(0.99),
        requests: lat.count(),
        mean_us: lat.mean_us(),
    };
    Ok((states, stats, cpu))
}

pub(super) async fn small(
    ctx: &Ctx,
    plan: &Plan,
    src: &Buffer,
    report: &mut Report,
) -> anyhow::Result<()> {
    let workers = IN_FLIGHT.iter().copied().max().unwrap_or(1);
    let biggest = SMALL.iter().map(|s| s.bytes).max().unwrap_or(4096);
    let biggest = usize::try_from(biggest)?;
    progress(&format!(
        "small objects: {} buffers, {} objects per size",
        workers, workers
    ));
    let mut bufs = Vec::with_capacity(workers);
    for i in 0..workers {
        let mut b = ctx
            .client
            .alloc_labeled(biggest, "bench-small")
            .await
            .context("allocating small buffers")?;
        let from = i * 4096 % (src.len().saturating_sub(biggest).max(1));
        b.as_mut_slice()
            .copy_from_slice(&src.as_slice()[from..from + biggest]);
        bufs.push(b);
    }
    let http_body = Bytes::copy_from_slice(&src.as_slice()[..biggest]);
    let mut http_dsts: Vec<Vec<u8>> = (0..workers).map(|_| vec![0u8; biggest]).collect();

    for size in SMALL {
        let n = usize::try_from(size.bytes)?;
        for (i, b) in bufs.iter().enumerate() {
            ctx.client
                .put_object_from(BUCKET, &small_key(size, i), b, 0..n, PutOptions::default())
                .await
                .context("writing the small objects")?;
        }
        for op in [Op::Get, Op::Put] {
            for in_flight in IN_FLIGHT {
                let label = format!("{} {} x{in_flight}", op.label(), human_size(size.bytes));
                // Through s3dma.
                let mine: Vec<Buffer> = bufs.drain(..in_flight).collect();
                let client = ctx.client.clone();
                let totals_before = match &ctx.metrics {
                    Some(m) => Some(layer_totals(m, op).await?),
                    None => None,
                };
                let (back, s3dma, cpu) = cell(ctx, plan, mine, move |i, mut buf: Buffer| {
                    let client = client.clone();
                    async move {
                        let key = small_key(size, i);
                        let r = match op {
                            Op::Get => client
                                .get_object_into(
                                    BUCKET,
                                    &key,
                                    &mut buf,
                                    0,
                                    GetOptions {
                                        length: Some(size.bytes),
                                        ..GetOptions::default()
                                    },
                                )
                                .await
                                .map_err(|e| anyhow!("s3dma GET {key}: {e}"))
                                .and_then(|o| {
                                    (o.bytes_placed == size.bytes).then_some(()).ok_or_else(|| {
                                        anyhow!("s3dma GET {key}: {} bytes", o.bytes_placed)
                                    })
                                }),
                            Op::Put => client
                                .put_object_from(BUCKET, &key, &buf, 0..n, PutOptions::default())
                                .await
                                .map(|_| ())
                                .map_err(|e| anyhow!("s3dma PUT {key}: {e}")),
                        };
                        (buf, r)
                    }
                })
                .await?;
                bufs.splice(0..0, back);
                let layers = match (&ctx.metrics, totals_before) {
                    (Some(m), Some(before)) => layers_between(before, layer_totals(m, op).await?),
                    _ => Layers::default(),
                };
                let s3dma_cpu = cpu;
                report.cpu_s3dma.small = report.cpu_s3dma.small.plus(cpu);
                report.cpu_s3dma.small_requests += s3dma.requests;

                // Over HTTP.
                let mine: Vec<Vec<u8>> = http_dsts.drain(..in_flight).collect();
                let s3 = ctx.s3.clone();
                let body = http_body.slice(..n);
                let (back, http, cpu) = cell(ctx, plan, mine, move |i, mut dst: Vec<u8>| {
                    let s3 = s3.clone();
                    let body = body.clone();
                    async move {
                        let key = small_key(size, i);
                        let r = match op {
                            Op::Get => http_get_exactly(&s3, &key, &mut dst, n).await,
                            Op::Put => http_put(&s3, &key, body).await,
                        };
                        (dst, r)
                    }
                })
                .await?;
                http_dsts.splice(0..0, back);
                report.cpu_http.small = report.cpu_http.small.plus(cpu);
                report.cpu_http.small_requests += http.requests;

                progress(&format!(
                    "{label}: s3dma {} ops/s p50 {} µs p99 {} µs | HTTP {} ops/s p50 {} µs p99 {} µs",
                    crate::report::fmt_num(s3dma.ops_per_s),
                    crate::report::fmt_num(s3dma.p50_us),
                    crate::report::fmt_num(s3dma.p99_us),
                    crate::report::fmt_num(http.ops_per_s),
                    crate::report::fmt_num(http.p50_us),
                    crate::report::fmt_num(http.p99_us),
                ));
                report.cells.push(Cell {
                    op,
                    size,
                    in_flight,
                    s3dma,
                    http,
                    layers,
                    cpu: CellCpu {
                        s3dma: s3dma_cpu,
                        http: cpu,
                    },
                });
            }
        }
    }
    for b in bufs {
        b.release().await.context("releasing a buffer")?;
    }
    Ok(())
}

pub(super) fn small_key(size: Size, i: usize) -> String {
    format!("small/{}/{i:03}", size.key)
}
