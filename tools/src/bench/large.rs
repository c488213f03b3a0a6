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
use crate::report::{Op, Report, Size, Throughput, human_size};
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
    progress(&format!("PUT {label} via s3dma, {} rounds", plan.rounds));
    let before = ctx.cpu.now()?;
    let mut all = Vec::new();
    for _ in 0..plan.rounds {
        let t = Instant::now();
        let out = ctx
            .client
            .put_object_from(BUCKET, &key, src, 0..n, PutOptions::default())
            .await
            .with_context(|| format!("s3dma PUT {label}"))?;
        all.extend(gbps(size.bytes, t.elapsed()));
        if out.size != size.bytes {
            bail!("s3dma PUT {label}: stored {} bytes", out.size);
        }
        check_path(ctx, "PUT", &label, out.path)?;
    }
    let cpu_put = ctx.cpu.since(before)?;
    let put = Rounds {
        gbps: median(&all),
        all,
    };
    progress(&describe(&format!("PUT {label} via s3dma"), &put));

    // s3dma GET.
    progress(&format!("GET {label} via s3dma, {} rounds", plan.rounds));
    let before = ctx.cpu.now()?;
    let mut all = Vec::new();
    for _ in 0..plan.rounds {
        let t = Instant::now();
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
        all.extend(gbps(size.bytes, t.elapsed()));
        if out.bytes_placed != size.bytes {
            bail!("s3dma GET {label}: {} bytes placed", out.bytes_placed);
        }
        check_path(ctx, "GET", &label, out.path)?;
    }
    let cpu_get = ctx.cpu.since(before)?;
    if crc32fast::hash(&dst.as_slice()[..n]) != want_crc {
        bail!("s3dma GET {label}: the bytes differ from those PUT");
    }
    let get = Rounds {
        gbps: median(&all),
        all,
    };
    progress(&describe(&format!("GET {label} via s3dma"), &get));
    report.cpu_s3dma.large = report.cpu_s3dma.large.plus(cpu_put).plus(cpu_get);
    report.cpu_s3dma.large_bytes += 2 * moved;

    // HTTP PUT (aws-sdk-s3 to the storage-target), same object.
    progress(&format!("PUT {label} over HTTP, {} rounds", plan.rounds));
    let before = ctx.cpu.now()?;
    let mut all = Vec::new();
    for _ in 0..plan.rounds {
        let t = Instant::now();
        ctx.s3
            .put_object()
            .bucket(BUCKET)
            .key(&key)
            .content_length(i64::try_from(n)?)
            .body(ByteStream::from(src_bytes.slice(..n)))
            .send()
            .await
            .map_err(|e| {
                anyhow!(
                    "HTTP PUT {label}: {}",
                    aws_sdk_s3::error::DisplayErrorContext(e)
                )
            })?;
        all.extend(gbps(size.bytes, t.elapsed()));
    }
    let http_cpu_put = ctx.cpu.since(before)?;
    let http_put = Rounds {
        gbps: median(&all),
        all,
    };
    progress(&describe(&format!("PUT {label} over HTTP"), &http_put));

    // HTTP GET into memory allocated once.
    progress(&format!("GET {label} over HTTP, {} rounds", plan.rounds));
    let before = ctx.cpu.now()?;
    let mut all = Vec::new();
    for _ in 0..plan.rounds {
        let t = Instant::now();
        let got = http_get_into(&ctx.s3, &key, http_dst)
            .await
            .with_context(|| format!("HTTP GET {label}"))?;
        all.extend(gbps(size.bytes, t.elapsed()));
        if got != n {
            bail!("HTTP GET {label}: {got} bytes");
        }
    }
    let http_cpu_get = ctx.cpu.since(before)?;
    if crc32fast::hash(&http_dst[..n]) != want_crc {
        bail!("HTTP GET {label}: the bytes differ from those PUT");
    }
    let http_get = Rounds {
        gbps: median(&all),
        all,
    };
    progress(&describe(&format!("GET {label} over HTTP"), &http_get));
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
