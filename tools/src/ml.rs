//! `s3dma-tools bench --ml`: where ML users already are, against the S3
//! connectors they use today, in one run against one storage-target.
//!
//! It starts a stack (as the bench does), measures raw loopback TCP, then
//! runs the embedded `ml_bench.py` with the Python named by `$S3DMA_PYTHON`
//! (default: the repository's `.venv/bin/python` next to this binary's
//! target directory, else `python3`), which needs s3dma, torch, safetensors,
//! boto3 and s3torchconnector; run from a checkout, the checkout's
//! `python` comes first on `PYTHONPATH`. That script loads a safetensors file and a
//! DCP checkpoint of the same size (2 GiB; 64 MiB with `--quick`) through
//! s3dma and through s3torchconnector (its S3 reader and its DCP
//! reader/writer) and boto3, all pointed at the same storage-target, and
//! measures memcpy bandwidth beside them. Every load is checked bit-exact
//! once, untimed.
//!
//! JSON keys: `ml_safetensors_gbps`, `ml_safetensors_http_gbps`,
//! `ml_dcp_load_gbps`, `ml_dcp_load_registered_gbps` (the same load into
//! tensors from `s3dma.torch.empty_like`, placed without a copy),
//! `ml_dcp_load_http_gbps`, `ml_dcp_save_gbps`,
//! `ml_dcp_save_http_gbps` (http = the fastest peer measured), each peer's
//! own figure (`ml_safetensors_boto3_gbps`,
//! `ml_safetensors_s3torchconnector_gbps`,
//! `ml_dcp_load_s3torchconnector_gbps`,
//! `ml_dcp_save_s3torchconnector_gbps`), the ratios `ml_*_vs_http` and
//! `ml_*_vs_memcpy`, and the limits `ml_memcpy_gbps` and `raw_tcp_gbps`;
//! the data path's own figures for the same bytes, a plain s3dma GET and PUT
//! through one registered buffer (`ml_get_gbps`, `ml_put_gbps`), and the
//! loaders against them (`ml_safetensors_vs_get`, `ml_dcp_load_vs_get`,
//! `ml_dcp_load_registered_vs_get`, `ml_dcp_save_vs_put`).

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::bail;
use serde_json::{Map, Value};

use crate::options::{Options, progress, table_title, write_json};
use crate::own_stack::OwnStack;
use crate::primitives::raw_tcp;
use crate::python_half::{Half, Target, python};
use crate::stats::{fmt, num, ratio};

/// The Python half, run with `python -c`.
const SCRIPT: &str = include_str!("ml_bench.py");

/// The headline loads and the save: (name, s3dma key, http key).
const HEADLINE: [(&str, &str, &str); 4] = [
    (
        "safetensors load",
        "ml_safetensors_gbps",
        "ml_safetensors_http_gbps",
    ),
    ("DCP load", "ml_dcp_load_gbps", "ml_dcp_load_http_gbps"),
    (
        "DCP load, registered",
        "ml_dcp_load_registered_gbps",
        "ml_dcp_load_http_gbps",
    ),
    ("DCP save", "ml_dcp_save_gbps", "ml_dcp_save_http_gbps"),
];

/// Each peer's own figure: (label, key).
const PEERS: [(&str, &str); 4] = [
    (
        "safetensors: boto3 + safetensors.torch.load",
        "ml_safetensors_boto3_gbps",
    ),
    (
        "safetensors: s3torchconnector S3Checkpoint + load",
        "ml_safetensors_s3torchconnector_gbps",
    ),
    (
        "DCP load: s3torchconnector S3StorageReader",
        "ml_dcp_load_s3torchconnector_gbps",
    ),
    (
        "DCP save: s3torchconnector S3StorageWriter",
        "ml_dcp_save_s3torchconnector_gbps",
    ),
];

/// Runs the ML phase, prints its table and writes `--json`.
///
/// # Errors
/// The stack does not start or dies, Python or one of its packages is
/// missing, a load returns other bytes, the JSON file cannot be written.
pub(crate) async fn run(opts: &Options, raw_tcp_for: Duration) -> anyhow::Result<()> {
    if opts.endpoint.is_some() {
        bail!("--ml starts its own stack; it cannot be used with --endpoint");
    }
    let bytes: u64 = if opts.quick { 64 << 20 } else { 2 << 30 };
    let rounds = opts.rounds.unwrap_or(if opts.quick { 1 } else { 3 });
    if !(1..=100).contains(&rounds) {
        bail!("--rounds must be 1 to 100 with --ml");
    }
    let python = python();
    // The safetensors file and two checkpoints.
    let mut started = OwnStack::start(opts, 3 * bytes + (512 << 20)).await?;
    let target = Target::of(&started);
    let result = tokio::select! {
        r = measure(&target, &python, bytes, rounds, raw_tcp_for) => r,
        e = started.stack.any_exit() => Err(e.into()),
    };
    let data_dir = started.data_dir.display().to_string();
    started.stop().await;
    let mut m = result?;
    print!("{}", table(&m, opts, &data_dir, rounds));
    // The JSON stays flat (numbers only): why a peer was not measured is in
    // the table.
    m.remove("ml_peers_missing");
    m.insert("quick".into(), Value::from(u8::from(opts.quick)));
    write_json(opts, m)?;
    Ok(())
}

async fn measure(
    target: &Target,
    python: &std::path::Path,
    bytes: u64,
    rounds: usize,
    raw_tcp_for: Duration,
) -> anyhow::Result<Map<String, Value>> {
    progress(&format!("raw loopback TCP for {raw_tcp_for:?}"));
    let raw = raw_tcp(raw_tcp_for).await?;
    let mut m = Half {
        phase: "ML",
        script: SCRIPT,
        needs: "s3dma, torch, safetensors, boto3 and s3torchconnector; `bash .ci/setup.sh` \
                makes .venv",
        env: vec![
            ("S3DMA_BENCH_BYTES", bytes.to_string()),
            ("S3DMA_BENCH_ROUNDS", rounds.to_string()),
        ],
    }
    .run(target, python)
    .await?;
    m.insert("raw_tcp_gbps".into(), num(Some(raw)));
    let get = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_f64);
    for (_, ours, http) in HEADLINE {
        let base = ours.trim_end_matches("_gbps");
        let (o, h, c) = (get(&m, ours), get(&m, http), get(&m, "ml_memcpy_gbps"));
        m.insert(format!("{base}_vs_http"), num(ratio(o, h)));
        m.insert(format!("{base}_vs_memcpy"), num(ratio(o, c)));
        // Loads against a plain GET of the same bytes, the save against a
        // plain PUT.
        let (plain, key) = if base.ends_with("save") {
            (get(&m, "ml_put_gbps"), "put")
        } else {
            (get(&m, "ml_get_gbps"), "get")
        };
        m.insert(format!("{base}_vs_{key}"), num(ratio(o, plain)));
    }
    Ok(m)
}

fn table(m: &Map<String, Value>, opts: &Options, data_dir: &str, rounds: usize) -> String {
    let get = |k: &str| m.get(k).and_then(Value::as_f64);
    let mut o = String::new();
    let mib = get("ml_bytes").unwrap_or(0.0) / f64::from(1u32 << 20);
    let _ = writeln!(
        o,
        "{}",
        table_title("--ml", opts, &format!("data in {data_dir}"))
    );
    let _ = writeln!(
        o,
        "GB/s = 10^9 bytes/s; {mib:.0} MiB of tensors; median of {rounds} rounds; \
         http = the fastest peer (boto3, s3torchconnector) to the same storage-target"
    );
    let _ = writeln!(
        o,
        "limits: memcpy {} GB/s, raw loopback TCP {} GB/s\n",
        fmt(get("ml_memcpy_gbps")),
        fmt(get("raw_tcp_gbps"))
    );
    let _ = writeln!(
        o,
        "plain s3dma GET of the same bytes {} GB/s, PUT {} GB/s (one registered buffer)\n",
        fmt(get("ml_get_gbps")),
        fmt(get("ml_put_gbps"))
    );
    let _ = writeln!(
        o,
        "  {:<20} {:>10} {:>10} {:>11} {:>13} {:>15}",
        "", "s3dma", "http", "s3dma/http", "s3dma/memcpy", "s3dma/plain"
    );
    for (name, ours, http) in HEADLINE {
        let base = ours.trim_end_matches("_gbps");
        let plain = if base.ends_with("save") { "put" } else { "get" };
        let _ = writeln!(
            o,
            "  {:<20} {:>10} {:>10} {:>11} {:>13} {:>15}",
            name,
            fmt(get(ours)),
            fmt(get(http)),
            fmt(get(&format!("{base}_vs_http"))),
            fmt(get(&format!("{base}_vs_memcpy"))),
            format!("{} ({plain})", fmt(get(&format!("{base}_vs_{plain}")))),
        );
    }
    let _ = writeln!(o, "\npeers (GB/s):");
    for (label, key) in PEERS {
        let _ = writeln!(o, "  {label:<52} {:>8}", fmt(get(key)));
    }
    if let Some(missing) = m.get("ml_peers_missing").and_then(Value::as_object)
        && !missing.is_empty()
    {
        for (peer, why) in missing {
            let _ = writeln!(o, "  not measured: {peer}: {}", why.as_str().unwrap_or(""));
        }
    }
    o
}
