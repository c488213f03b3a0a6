//! The large-object phase: PUT then GET of each size through s3dma and over
//! HTTP, timed over several rounds.

use anyhow::{Context as _, anyhow, bail};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use s3dma_client::{Buffer, GetOptions, PutOptions};
use tokio::time::Instant;

use super::{BUCKET, Ctx, Plan};
use crate::options::progress;
use crate::primitives::http_get_into_from;
use crate::report::{CpuSecs, Op, Report, Size, Throughput, human_size};
use crate::stats::{gbps, median};

/// One path's rounds: the median GB/s and the CPU used.
struct Rounds {
    gbps: Option<f64>,
    all: Vec<f64>,
}

fn describe(what: &str, r: &Rounds) -> String {
    let all: Vec<String> = r.all.iter().map(|v| format!("{v:.2}")).collect();
    format!(
        "{what}: {} GB/s median (rounds: {})",
        r.gbps.map_or("-".into(), |v| format!("{v:.2}")),
        all.join(" ")
    )
}

/// On a stack the bench started, every s3dma transfer must have gone by
/// RDMA (with `--protocol hipobj-rc-v2`: through the shim's queue pairs):
/// a fallback through the agent would measure something else.
fn check_path(
    ctx: &Ctx,
    op: &str,
    label: &str,
    path: s3dma_client::TransferPath,
) -> anyhow::Result<()> {
    if ctx.data_path.is_some() && path != s3dma_client::TransferPath::Rdma {
        bail!("s3dma {op} {label} took the {path:?} path, not RDMA");
    }
    Ok(())
}

/// Runs `round` [`Plan::rounds`] times, each timed as `size` bytes moved,
/// saying on stderr what (`what`) before and the GB/s after: the rounds and
/// the CPU they took.
async fn rounds(
    ctx: &Ctx,
    plan: &Plan,
    size: Size,
    what: &str,
    mut round: impl AsyncFnMut() -> anyhow::Result<()>,
) -> anyhow::Result<(Rounds, CpuSecs)> {
    progress(&format!("{what}, {} rounds", plan.rounds));
    let before = ctx.cpu.now()?;
    let mut all = Vec::new();
    for _ in 0..plan.rounds {
        let t = Instant::now();
        round().await?;
        all.extend(gbps(size.bytes, t.elapsed()));
    }
    let cpu = ctx.cpu.since(before)?;
    let r = Rounds {
        gbps: median(&all),
        all,
    };
    progress(&describe(what, &r));
    Ok((r, cpu))
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn large(
    ctx: &Ctx,
    plan: &Plan,
    size: Size,
    src: &Buffer,
    dst: &mut Buffer,
    src_bytes: &Bytes,
    http_dst: &mut [u8],
    report: &mut Report,
) -> anyhow::Result<()> {
    let n = usize::try_from(size.bytes)?;
    let key = format!("large/{}", size.key);
    let label = human_size(size.bytes);
    let moved = size.bytes * plan.rounds as u64;
    let want_crc = crc32fast::hash(&src.as_slice()[..n]);

    // s3dma PUT.
    let (put, cpu_put) = rounds(
        ctx,
        plan,
        size,
        &format!("PUT {label} via s3dma"),
        async || {
            let out = ctx
                .client
                .put_object_from(BUCKET, &key, src, 0..n, PutOptions::default())
                .await
                .with_context(|| format!("s3dma PUT {label}"))?;
            if out.size != size.bytes {
                bail!("s3dma PUT {label}: stored {} bytes", out.size);
            }
            check_path(ctx, "PUT", &label, out.path)
        },
    )
    .await?;

    // s3dma GET.
    let (get, cpu_get) = rounds(
        ctx,
        plan,
        size,
        &format!("GET {label} via s3dma"),
        async || {
            let out = ctx
                .client
                .get_object_into(
                    BUCKET,
                    &key,
                    dst,
                    0,
                    GetOptions {
                        length: Some(size.bytes),
                        ..GetOptions::default()
                    },
                )
                .await
                .with_context(|| format!("s3dma GET {label}"))?;
            if out.bytes_placed != size.bytes {
                bail!("s3dma GET {label}: {} bytes placed", out.bytes_placed);
            }
            check_path(ctx, "GET", &label, out.path)
        },
    )
    .await?;
    if crc32fast::hash(&dst.as_slice()[..n]) != want_crc {
        bail!("s3dma GET {label}: the bytes differ from those PUT");
    }
    report.cpu_s3dma.large = report.cpu_s3dma.large.plus(cpu_put).plus(cpu_get);
    report.cpu_s3dma.large_bytes += 2 * moved;

    // HTTP PUT (aws-sdk-s3 to the storage-target), same object.
    let put_over_http = format!("PUT {label} over HTTP");
    let (http_put, http_cpu_put) = rounds(ctx, plan, size, &put_over_http, async || {
        http_put(&ctx.s3, &key, src_bytes.slice(..n)).await
    })
    .await?;

    // HTTP GET into memory allocated once.
    let get_over_http = format!("GET {label} over HTTP");
    let (http_get, http_cpu_get) = rounds(ctx, plan, size, &get_over_http, async || {
        let got = http_get_into(&ctx.s3, &key, http_dst)
            .await
            .with_context(|| format!("HTTP GET {label}"))?;
        if got != n {
            bail!("HTTP GET {label}: {got} bytes");
        }
        Ok(())
    })
    .await?;
    if crc32fast::hash(&http_dst[..n]) != want_crc {
        bail!("HTTP GET {label}: the bytes differ from those PUT");
    }
    report.cpu_http.large = report.cpu_http.large.plus(http_cpu_put).plus(http_cpu_get);
    report.cpu_http.large_bytes += 2 * moved;

    report.throughput.push(Throughput {
        op: Op::Get,
        size,
        s3dma_gbps: get.gbps,
        http_gbps: http_get.gbps,
    });
    report.throughput.push(Throughput {
        op: Op::Put,
        size,
        s3dma_gbps: put.gbps,
        http_gbps: http_put.gbps,
    });
    Ok(())
}

/// GETs `key` of the bench's bucket over HTTP, copying the body into
/// `dst`; the byte count.
pub(super) async fn http_get_into(
    s3: &aws_sdk_s3::Client,
    key: &str,
    dst: &mut [u8],
) -> anyhow::Result<usize> {
    http_get_into_from(s3, BUCKET, key, dst).await
}

/// One HTTP GET of `key` into `dst` that must bring exactly `n` bytes.
pub(super) async fn http_get_exactly(
    s3: &aws_sdk_s3::Client,
    key: &str,
    dst: &mut [u8],
    n: usize,
) -> anyhow::Result<()> {
    let got = http_get_into(s3, key, dst)
        .await
        .map_err(|e| anyhow!("HTTP GET {key}: {e:#}"))?;
    (got == n)
        .then_some(())
        .ok_or_else(|| anyhow!("HTTP GET {key}: {got} bytes"))
}

/// One HTTP PUT of `body` to `key` of the bench's bucket.
pub(super) async fn http_put(
    s3: &aws_sdk_s3::Client,
    key: &str,
    body: Bytes,
) -> anyhow::Result<()> {
    s3.put_object()
        .bucket(BUCKET)
        .key(key)
        .content_length(i64::try_from(body.len()).unwrap_or(i64::MAX))
        .body(ByteStream::from(body))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| {
            anyhow!(
                "HTTP PUT {key}: {}",
                aws_sdk_s3::error::DisplayErrorContext(e)
            )
        })
}
