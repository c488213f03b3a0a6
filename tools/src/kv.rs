//! `s3dma-tools bench --kv`: LMCache's KV-cache chunks stored and retrieved
//! through the s3dma remote-storage plug-in and through LMCache's own `s3://`
//! connector, in one run against one storage-target.
//!
//! It starts a stack (as the bench does), measures the machine's limits
//! (raw loopback TCP, memcpy), then runs the embedded `kv_bench.py` with the
//! Python the ML phase uses (`$S3DMA_PYTHON`, else the checkout's `.venv`,
//! else `python3`; the checkout's `python` first on `PYTHONPATH`),
//! which needs s3dma, torch, lmcache and awscrt. For an 8B-class shape
//! (Llama-3-8B: 32 layers, 8 KV heads of 128, 32 MiB chunks) and a 70B-class
//! one (80 layers, 80 MiB chunks), bf16, 256-token chunks, about 1 GiB each
//! (`--quick`: 1/16 of the layers, about 16 MiB), both backends store and
//! retrieve every chunk as LMCache's `RemoteBackend` drives them, then one
//! chunk at a time; then a fresh engine looks up 1,000 stored chunks. Every
//! retrieved chunk is compared bit for bit with what was stored.
//!
//! LMCache's S3 connector only speaks virtual-hosted addressing and the
//! storage-target is path-style only: the Python half subclasses it,
//! overriding only `_format_safe_path` (the object's path gets a
//! `/<bucket>` prefix); the rest is LMCache's code.
//!
//! JSON keys, for `<shape>` in `8b`, `70b` and `<backend>` in `s3dma`,
//! `lmcache_s3`: `kv_<shape>_<backend>_{put,get}_gbps`,
//! `..._{put,get}_chunks_per_s`, `..._{put,get}_p50_ms`,
//! `..._{put,get}_p99_ms`, `..._{put,get}_cpu_ms_per_chunk`; the ratios
//! `kv_<shape>_{put,get}_vs_lmcache_s3` (GB/s) and
//! `kv_<shape>_{put,get}_cpu_vs_lmcache_s3` (CPU per chunk);
//! `kv_<shape>_chunk_bytes`, `kv_<shape>_chunks`, `kv_<shape>_layers`;
//! `kv_exists_1000_{s3dma,lmcache_s3}_ms`, `kv_exists_1000_vs_lmcache_s3`
//! (how many times faster s3dma's lookup is); `kv_rounds`,
//! `kv_chunk_tokens`, `raw_tcp_gbps`, `memcpy_gbps`, `quick`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::bail;
use serde_json::{Map, Value};

use crate::options::{Options, progress, table_title, write_json};
use crate::own_stack::OwnStack;
use crate::primitives::raw_tcp;
use crate::python_half::{Half, Target, python};
use crate::stats::{fmt, num, ratio};

/// The Python half, run with `python -c`.
const SCRIPT: &str = include_str!("kv_bench.py");

/// The shapes: (JSON key part, label).
const SHAPES: [(&str, &str); 2] = [
    ("8b", "8B-class (32 layers, 8 KV heads x 128)"),
    ("70b", "70B-class (80 layers, 8 KV heads x 128)"),
];

/// The backends: (JSON key part, label).
const BACKENDS: [(&str, &str); 2] = [
    ("s3dma", "s3dma plug-in"),
    ("lmcache_s3", "LMCache s3:// (HTTP)"),
];

/// The figures per shape, backend and op: (key suffix, column header).
const FIGURES: [(&str, &str); 5] = [
    ("gbps", "GB/s"),
    ("chunks_per_s", "chunks/s"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("cpu_ms_per_chunk", "CPU ms/chunk"),
];

/// Keys of the lookup of 1,000 stored chunks.
const EXISTS: &str = "kv_exists_1000";

/// Runs the KV phase, prints its table and writes `--json`.
///
/// # Errors
/// The stack does not start or dies, Python or one of its packages is
/// missing, a chunk comes back missing or different, the JSON file cannot
/// be written.
pub(crate) async fn run(opts: &Options) -> anyhow::Result<()> {
    if opts.endpoint.is_some() {
        bail!("--kv starts its own stack; it cannot be used with --endpoint");
    }
    let per_shape: u64 = if opts.quick { 16 << 20 } else { 1 << 30 };
    let rounds = opts.rounds.unwrap_or(if opts.quick { 1 } else { 3 });
    if !(1..=100).contains(&rounds) {
        bail!("--rounds must be 1 to 100 with --kv");
    }
    let raw_tcp_for = Duration::from_secs(if opts.quick { 1 } else { 2 });
    let python = python();
    // The store holds one round of one backend's chunks at a time (each
    // round is deleted after it) and the 1,000 small chunks.
    let mut started = OwnStack::start(opts, per_shape + (256 << 20)).await?;
    let target = Target::of(&started);
    let result = tokio::select! {
        r = measure(&target, &python, per_shape, rounds, opts.quick, raw_tcp_for) => r,
        e = started.stack.any_exit() => Err(e.into()),
    };
    let data_dir = started.data_dir.display().to_string();
    started.stop().await;
    let mut m = result?;
    print!("{}", table(&m, opts, &data_dir));
    m.insert("quick".into(), Value::from(u8::from(opts.quick)));
    write_json(opts, m)?;
    Ok(())
}

async fn measure(
    target: &Target,
    python: &Path,
    per_shape: u64,
    rounds: usize,
    quick: bool,
    raw_tcp_for: Duration,
) -> anyhow::Result<Map<String, Value>> {
    progress(&format!("raw loopback TCP for {raw_tcp_for:?}"));
    let raw = raw_tcp(raw_tcp_for).await?;
    let memcpy = crate::limits::memcpy_gbps(64 << 20, Duration::from_millis(500));
    let mut m = Half {
        phase: "KV",
        script: SCRIPT,
        needs: "s3dma, torch, lmcache and awscrt; `bash .ci/setup.sh` and \
                `.ci/setup-lmcache.sh` make .venv",
        env: vec![
            ("S3DMA_BENCH_KV_BYTES", per_shape.to_string()),
            ("S3DMA_BENCH_ROUNDS", rounds.to_string()),
            (
                "S3DMA_BENCH_QUICK",
                if quick { "1" } else { "0" }.to_owned(),
            ),
            ("S3DMA_BENCH_SHIM_PID", target.shim_pid.to_string()),
            // No usage reports from LMCache; only its errors on stderr (a
            // failed store is an error there, and the bench's lookup
            // catches it).
            ("LMCACHE_TRACK_USAGE", "false".to_owned()),
            ("DO_NOT_TRACK", "1".to_owned()),
            ("LMCACHE_LOG_LEVEL", "ERROR".to_owned()),
        ],
    }
    .run(target, python)
    .await?;
    m.insert("raw_tcp_gbps".into(), num(Some(raw)));
    m.insert("memcpy_gbps".into(), num(memcpy));
    add_ratios(&mut m);
    Ok(m)
}

/// s3dma against LMCache's S3 connector: GB/s (higher is better), CPU per
/// chunk and the lookup (lower is better, so LMCache S3's over s3dma's:
/// both ratios read "times better").
fn add_ratios(m: &mut Map<String, Value>) {
    let get = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_f64);
    for (shape, _) in SHAPES {
        for op in ["put", "get"] {
            let k = |b: &str, f: &str| format!("kv_{shape}_{b}_{op}_{f}");
            let gbps = ratio(
                get(m, &k("s3dma", "gbps")),
                get(m, &k("lmcache_s3", "gbps")),
            );
            m.insert(format!("kv_{shape}_{op}_vs_lmcache_s3"), num(gbps));
            let cpu = ratio(
                get(m, &k("lmcache_s3", "cpu_ms_per_chunk")),
                get(m, &k("s3dma", "cpu_ms_per_chunk")),
            );
            m.insert(format!("kv_{shape}_{op}_cpu_vs_lmcache_s3"), num(cpu));
        }
    }
    let exists = ratio(
        get(m, &format!("{EXISTS}_lmcache_s3_ms")),
        get(m, &format!("{EXISTS}_s3dma_ms")),
    );
    m.insert(format!("{EXISTS}_vs_lmcache_s3"), num(exists));
}

/// A count (chunks, layers, rounds).
fn whole(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"))
}

fn table(m: &Map<String, Value>, opts: &Options, data_dir: &str) -> String {
    let get = |k: &str| m.get(k).and_then(Value::as_f64);
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{}",
        table_title("--kv", opts, &format!("store in {data_dir}"))
    );
    let _ = writeln!(
        o,
        "LMCache KV chunks of {} tokens, bf16; GB/s = 10^9 bytes/s, median of {} rounds \
         (after one warm-up); p50/p99 = one chunk at a time; host CPU = the Python process \
         (+ the host-shim for s3dma) per chunk",
        whole(get("kv_chunk_tokens")),
        whole(get("kv_rounds")),
    );
    let _ = writeln!(
        o,
        "limits: raw loopback TCP {} GB/s, memcpy {} GB/s",
        fmt(get("raw_tcp_gbps")),
        fmt(get("memcpy_gbps"))
    );
    for (shape, label) in SHAPES {
        let mib = get(&format!("kv_{shape}_chunk_bytes")).unwrap_or(0.0) / f64::from(1u32 << 20);
        let _ = writeln!(
            o,
            "\n{label}{}: {} chunks of {mib:.0} MiB",
            if opts.quick {
                format!(
                    ", --quick: {} layers",
                    whole(get(&format!("kv_{shape}_layers")))
                )
            } else {
                String::new()
            },
            whole(get(&format!("kv_{shape}_chunks"))),
        );
        let mut head = format!("  {:<26}", "");
        for (_, h) in FIGURES {
            let _ = write!(head, " {h:>12}");
        }
        let _ = writeln!(o, "{head}");
        for op in ["put", "get"] {
            for (b, blabel) in BACKENDS {
                let mut row = format!("  {:<26}", format!("{op} {blabel}"));
                for (f, _) in FIGURES {
                    let _ = write!(
                        row,
                        " {:>12}",
                        fmt(get(&format!("kv_{shape}_{b}_{op}_{f}")))
                    );
                }
                let _ = writeln!(o, "{row}");
            }
            let _ = writeln!(
                o,
                "  {:<26} {:>12} {:>12} {:>12} {:>12} {:>12}",
                format!("{op} s3dma advantage"),
                format!("{}x", fmt(get(&format!("kv_{shape}_{op}_vs_lmcache_s3")))),
                "",
                "",
                "",
                format!(
                    "{}x",
                    fmt(get(&format!("kv_{shape}_{op}_cpu_vs_lmcache_s3")))
                ),
            );
        }
    }
    let _ = writeln!(
        o,
        "\nlookup of 1000 stored chunks by a fresh engine: s3dma {} ms (batched_contains), \
         LMCache S3 {} ms (1000 exists, one HEAD each): {}x",
        fmt(get(&format!("{EXISTS}_s3dma_ms"))),
        fmt(get(&format!("{EXISTS}_lmcache_s3_ms"))),
        fmt(get(&format!("{EXISTS}_vs_lmcache_s3"))),
    );
    let _ = writeln!(
        o,
        "\ns3dma advantage: s3dma's GB/s over LMCache S3's, LMCache S3's CPU per chunk (and \
         lookup time) over s3dma's; above 1 favours s3dma. {} chunks retrieved, every one \
         bit-exact.",
        whole(get("kv_chunks_verified")),
    );
    let _ = writeln!(
        o,
        "Both backends through LMCache's own code against the same storage-target: s3dma's \
         plug-in via CreateConnector; LMCache's S3Connector (awscrt, plain HTTP) with one \
         change, _format_safe_path prefixing /<bucket> (it only speaks virtual-hosted \
         addressing; the storage-target is path-style only). Retrieves run on a fresh \
         engine after its lookup."
    );
    o
}
