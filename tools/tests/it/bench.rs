//! `s3dma-tools bench --quick` and a short `s3dma-tools soak` against the real
//! storage-target, dpu-agent and host-shim binaries (started by the
//! commands themselves). No timing thresholds: the bench's numbers only have
//! to be there, finite and positive; the soak has to pass.
//!
//! The three service binaries must sit next to `s3dma-tools` in the target
//! directory: `cargo test --workspace` (or `cargo build --bins` first)
//! builds them.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::{S3DMA_TOOLS, check_binaries};

/// The keys every bench run must report.
const REQUIRED: [&str; 7] = [
    "get_1g_gbps",
    "http_get_1g_gbps",
    "raw_tcp_gbps",
    "get_4k_p50_us",
    "http_get_4k_p50_us",
    "get_4k_ops_64",
    "agent_cpu_us_per_req",
];

#[test]
fn bench_quick_reports_every_number() {
    check_binaries();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let out = Command::new(S3DMA_TOOLS)
        .args(["bench", "--quick", "--json"])
        .arg(&json)
        .env("TMPDIR", dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );

    let text = std::fs::read_to_string(&json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let obj = v.as_object().expect("a JSON object");
    let num = |k: &str| -> f64 {
        let x = obj.get(k).unwrap_or_else(|| panic!("no key {k} in {text}"));
        x.as_f64()
            .unwrap_or_else(|| panic!("{k} is {x}, not a number, in {text}"))
    };
    let mut keys: Vec<String> = REQUIRED.iter().map(|k| (*k).to_owned()).collect();
    for op in ["get", "put"] {
        for size in ["64m", "1g"] {
            for p in ["", "http_"] {
                keys.push(format!("{p}{op}_{size}_gbps"));
            }
            keys.push(format!("{op}_{size}_vs_http"));
            keys.push(format!("{op}_{size}_vs_raw_tcp"));
        }
        for size in ["4k", "64k"] {
            for n in [1, 16, 64] {
                for p in ["", "http_"] {
                    keys.push(format!("{p}{op}_{size}_ops_{n}"));
                    keys.push(format!("{p}{op}_{size}_p50_us_{n}"));
                    keys.push(format!("{p}{op}_{size}_p99_us_{n}"));
                    keys.push(format!("{p}{op}_{size}_mean_us_{n}"));
                }
                // Where the time went, from the services' own histograms.
                for layer in ["shim", "agent", "target"] {
                    keys.push(format!("{op}_{size}_{layer}_mean_us_{n}"));
                }
            }
        }
    }
    for p in ["agent", "shim", "target"] {
        keys.push(format!("{p}_cpu_us_per_req"));
    }
    // The machine's limits, and 1 to 8 tenant processes.
    for k in [
        "memcpy_gbps",
        "md5_gbps",
        "data_dir_write_fsync_gbps",
        "store_limit_gbps",
        "put_1g_vs_store_limit",
        "get_1g_vs_memcpy",
        "put_1g_disk_gbps",
        "http_put_1g_disk_gbps",
        "put_1g_disk_vs_http",
        "disk_write_fsync_gbps",
        "put_1g_disk_vs_store_limit",
    ] {
        keys.push(k.into());
    }
    for n in [1, 2, 4, 8] {
        for op in ["get", "put"] {
            keys.push(format!("procs_{n}_{op}_gbps"));
            keys.push(format!("procs_{n}_{op}_vs_1"));
        }
    }
    keys.push("http_target_cpu_us_per_req".into());
    // The batch phase (4 KiB only with --quick).
    for k in [
        "batch_get_4k_ops_64",
        "batch_put_4k_ops_64",
        "batch_head_4k_ops_64",
        "http_batch_get_4k_ops_64",
        "batch_head_1000_ms",
    ] {
        keys.push(k.into());
    }
    for k in &keys {
        let x = num(k);
        assert!(x.is_finite() && x > 0.0, "{k} = {x} in {text}");
    }
    // CPU per GB of the quick run's few hundred MB can be under one clock
    // tick (10 ms) for the agent: present and finite, maybe 0.
    for k in [
        "agent_cpu_s_per_gb",
        "shim_cpu_s_per_gb",
        "target_cpu_s_per_gb",
        "client_cpu_s_per_gb",
        "http_target_cpu_s_per_gb",
        "http_client_cpu_s_per_gb",
        "client_cpu_us_per_req",
        "http_client_cpu_us_per_req",
        "batch_host_cpu_us_per_obj",
        "batch_agent_cpu_us_per_obj",
        "get_4k_host_cpu_us_per_req_64",
        "get_4k_agent_cpu_us_per_req_64",
    ] {
        let x = num(k);
        assert!(x.is_finite() && x >= 0.0, "{k} = {x} in {text}");
    }
    // Every value is a number (flat), and p99 is never below p50.
    assert!(obj.values().all(serde_json::Value::is_number), "{text}");
    for op in ["get", "put"] {
        for size in ["4k", "64k"] {
            for n in [1, 16, 64] {
                let (p50, p99) = (
                    num(&format!("{op}_{size}_p50_us_{n}")),
                    num(&format!("{op}_{size}_p99_us_{n}")),
                );
                assert!(p99 >= p50, "{op} {size} x{n}: p99 {p99} < p50 {p50}");
            }
        }
    }
    assert_eq!(num("quick"), 1.0);
    assert_eq!(num("large_object_bytes"), (64u64 << 20) as f64);
    assert_eq!(num("procs_object_bytes"), (8u64 << 20) as f64);
    assert_eq!(num("procs_1_get_vs_1"), 1.0);

    // The table, headline first, and a progress line per phase.
    assert!(stdout.contains("Headline"), "{stdout}");
    assert!(
        stdout.find("Headline") < stdout.find("Large objects"),
        "{stdout}"
    );
    for phase in [
        "raw loopback TCP:",
        "GET 64 MiB via s3dma:",
        "PUT 64 MiB over HTTP:",
        "GET 4 KiB x64:",
        "PUT 64 KiB x16:",
        "limits: memcpy",
        "8 tenant process(es): PUT",
        "to disk: s3dma",
    ] {
        assert!(stderr.contains(phase), "no {phase:?} in:\n{stderr}");
    }
    // It cleaned up after itself.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "bench.json")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The directory phase's keys (`s3dma-tools bench --dirs`), for each tool.
const DIRS_REQUIRED: [&str; 4] = [
    "dirs_get_gbps",
    "dirs_get_cpu_s_per_gb",
    "dirs_put_gbps",
    "dirs_put_cpu_s_per_gb",
];

/// `bench --dirs --quick`: s3dma, the aws CLI (the repository's .venv) and
/// rclone each download and upload the model-like directory (the bench
/// checks every file's bytes and the uploaded sizes, so a wrong transfer
/// fails the run); every figure is there, finite and positive. Without CI,
/// a missing aws CLI or rclone only drops its keys.
#[test]
fn bench_dirs_quick_reports_every_number() {
    check_binaries();
    let r = BenchRun::run(&["--dirs", "--quick"], "dirs.json", None);
    let (obj, text, stdout) = (&r.obj, &r.text, &r.stdout);
    let mut keys: Vec<String> = DIRS_REQUIRED.iter().map(|k| (*k).to_owned()).collect();
    keys.extend(["raw_tcp_gbps", "memcpy_gbps", "dirs_bytes", "dirs_files"].map(String::from));
    let peers: Vec<&str> = if std::env::var_os("CI").is_some() {
        vec!["aws", "rclone"]
    } else {
        ["aws", "rclone"]
            .into_iter()
            .filter(|p| obj.contains_key(&format!("dirs_get_{p}_gbps")))
            .collect()
    };
    for p in peers {
        for k in DIRS_REQUIRED {
            keys.push(k.replacen("_gbps", &format!("_{p}_gbps"), 1).replacen(
                "_cpu_s_per_gb",
                &format!("_{p}_cpu_s_per_gb"),
                1,
            ));
        }
        keys.push(format!("dirs_get_vs_{p}"));
        keys.push(format!("dirs_put_vs_{p}"));
    }
    for k in &keys {
        let x = r.num(k);
        assert!(x.is_finite() && x > 0.0, "{k} = {x} in {text}");
    }
    assert_eq!(r.num("dirs_files"), 28.0, "{text}");
    for row in [
        "s3dma get --recursive",
        "s3dma put --recursive",
        "limits: raw loopback TCP",
    ] {
        assert!(stdout.contains(row), "no {row:?} in:\n{stdout}");
    }
    r.left_nothing();
}

/// The ML phase's keys (`s3dma-tools bench --ml`).
const ML_REQUIRED: [&str; 27] = [
    "raw_tcp_gbps",
    "ml_get_gbps",
    "ml_put_gbps",
    "ml_safetensors_vs_get",
    "ml_dcp_load_vs_get",
    "ml_dcp_load_registered_vs_get",
    "ml_dcp_save_vs_put",
    "ml_memcpy_gbps",
    "ml_bytes",
    "ml_safetensors_gbps",
    "ml_safetensors_http_gbps",
    "ml_safetensors_boto3_gbps",
    "ml_safetensors_s3torchconnector_gbps",
    "ml_dcp_load_gbps",
    "ml_dcp_load_registered_gbps",
    "ml_dcp_load_http_gbps",
    "ml_dcp_load_s3torchconnector_gbps",
    "ml_dcp_save_gbps",
    "ml_dcp_save_http_gbps",
    "ml_dcp_save_s3torchconnector_gbps",
    "ml_safetensors_vs_http",
    "ml_dcp_load_vs_http",
    "ml_dcp_load_registered_vs_http",
    "ml_dcp_save_vs_http",
    "ml_safetensors_vs_memcpy",
    "ml_dcp_load_vs_memcpy",
    "ml_dcp_load_registered_vs_memcpy",
];

/// One `s3dma-tools bench ARGS --json FILE` run in a fresh `TMPDIR` (with
/// `python` as `$S3DMA_PYTHON` when given): it succeeded and wrote a JSON
/// object of numbers.
struct BenchRun {
    stdout: String,
    obj: serde_json::Map<String, serde_json::Value>,
    text: String,
    dir: tempfile::TempDir,
    json_name: &'static str,
}

impl BenchRun {
    fn run(args: &[&str], json_name: &'static str, python: Option<&Path>) -> BenchRun {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join(json_name);
        let mut cmd = Command::new(S3DMA_TOOLS);
        cmd.arg("bench")
            .args(args)
            .arg("--json")
            .arg(&json)
            .env("TMPDIR", dir.path())
            .stdin(Stdio::null());
        if let Some(p) = python {
            cmd.env("S3DMA_PYTHON", p);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "bench {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
            out.status
        );
        let text = std::fs::read_to_string(&json).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let obj = v.as_object().expect("a JSON object").clone();
        BenchRun {
            stdout,
            obj,
            text,
            dir,
            json_name,
        }
    }

    /// Every value is a number.
    fn all_numbers(&self) {
        assert!(
            self.obj.values().all(serde_json::Value::is_number),
            "{}",
            self.text
        );
    }

    /// The number `k`.
    fn num(&self, k: &str) -> f64 {
        self.obj
            .get(k)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or_else(|| panic!("no number {k} in {}", self.text))
    }

    /// The bench left nothing in its `TMPDIR` but the JSON.
    fn left_nothing(&self) {
        let left: Vec<_> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != self.json_name)
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}

/// `bench --ml --quick` with the repository's .venv (which `.ci/setup.sh`
/// makes, with torch, safetensors and s3torchconnector): every figure is
/// there, finite and positive, and every load was bit-exact (the Python
/// half asserts it, so a mismatch fails the run).
#[test]
fn bench_ml_quick_reports_every_number() {
    check_binaries();
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    if !venv.is_file() && std::env::var_os("CI").is_none() {
        eprintln!(
            "bench_ml_quick_reports_every_number: SKIPPED, no {} (run `bash .ci/setup.sh`)",
            venv.display()
        );
        return;
    }
    let r = BenchRun::run(&["--ml", "--quick"], "ml.json", Some(&venv));
    r.all_numbers();
    for k in ML_REQUIRED {
        let x = r.num(k);
        assert!(x.is_finite() && x > 0.0, "{k} = {x} in {}", r.text);
    }
    assert_eq!(r.num("ml_bytes"), (64u64 << 20) as f64, "{}", r.text);
    for row in ["safetensors load", "DCP load", "DCP save", "limits: memcpy"] {
        assert!(r.stdout.contains(row), "no {row:?} in:\n{}", r.stdout);
    }
    r.left_nothing();
}

/// `bench --kv --quick` with the repository's .venv when it has lmcache
/// and awscrt (`.ci/setup-lmcache.sh`): every documented key is there,
/// finite and positive, and every chunk retrieved came back bit-exact (the
/// Python half compares each one with what was stored and fails the run
/// on a mismatch or a missing chunk; the count proves none was skipped).
#[test]
fn bench_kv_quick_reports_every_number() {
    check_binaries();
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let ready = venv.is_file()
        && Command::new(&venv)
            .args(["-c", "import lmcache, awscrt, torch"])
            .env("LMCACHE_TRACK_USAGE", "false")
            .env("DO_NOT_TRACK", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    // CI installs lmcache and awscrt (.ci/setup-lmcache.sh) before the test
    // run: there, a missing one is a failure.
    if !ready && std::env::var_os("CI").is_none() {
        eprintln!(
            "bench_kv_quick_reports_every_number: SKIPPED, {} lacks lmcache or awscrt \
             (run `bash .ci/setup.sh` then `bash .ci/setup-lmcache.sh`)",
            venv.display()
        );
        return;
    }
    let r = BenchRun::run(&["--kv", "--quick"], "kv.json", Some(&venv));
    r.all_numbers();
    let (num, text, stdout) = (|k: &str| r.num(k), &r.text, &r.stdout);
    // Every key tools/README.md documents for --kv.
    let mut keys: Vec<String> = [
        "raw_tcp_gbps",
        "memcpy_gbps",
        "kv_rounds",
        "kv_chunk_tokens",
        "kv_chunks_verified",
        "kv_exists_1000_s3dma_ms",
        "kv_exists_1000_lmcache_s3_ms",
        "kv_exists_1000_vs_lmcache_s3",
    ]
    .map(String::from)
    .to_vec();
    for shape in ["8b", "70b"] {
        for k in ["chunk_bytes", "chunks", "layers"] {
            keys.push(format!("kv_{shape}_{k}"));
        }
        for op in ["put", "get"] {
            for backend in ["s3dma", "lmcache_s3"] {
                for f in [
                    "gbps",
                    "chunks_per_s",
                    "p50_ms",
                    "p99_ms",
                    "cpu_ms_per_chunk",
                ] {
                    keys.push(format!("kv_{shape}_{backend}_{op}_{f}"));
                }
            }
            keys.push(format!("kv_{shape}_{op}_vs_lmcache_s3"));
            keys.push(format!("kv_{shape}_{op}_cpu_vs_lmcache_s3"));
        }
    }
    for k in &keys {
        let x = num(k);
        assert!(x.is_finite() && x > 0.0, "{k} = {x} in {text}");
    }
    assert_eq!(num("quick"), 1.0, "{text}");
    assert_eq!(num("kv_chunk_tokens"), 256.0, "{text}");
    // --quick: 1/16 of the layers (8 KV heads of 128, bf16, 256 tokens).
    for (shape, layers) in [("8b", 2.0), ("70b", 5.0)] {
        assert_eq!(num(&format!("kv_{shape}_layers")), layers, "{text}");
        assert_eq!(
            num(&format!("kv_{shape}_chunk_bytes")),
            layers * 2.0 * 256.0 * 8.0 * 128.0 * 2.0,
            "{text}"
        );
        for backend in ["s3dma", "lmcache_s3"] {
            for op in ["put", "get"] {
                let k = |f: &str| num(&format!("kv_{shape}_{backend}_{op}_{f}"));
                assert!(k("p99_ms") >= k("p50_ms"), "{shape} {backend} {op}: {text}");
            }
        }
    }
    // Per shape and backend: the warm-up and each round retrieve every
    // chunk in one batch, then each round retrieves them one at a time.
    let rounds = num("kv_rounds");
    let expected: f64 = ["8b", "70b"]
        .iter()
        .map(|s| 2.0 * (2.0 * rounds + 1.0) * num(&format!("kv_{s}_chunks")))
        .sum();
    assert_eq!(num("kv_chunks_verified"), expected, "{text}");
    for row in [
        "put s3dma plug-in",
        "get LMCache s3:// (HTTP)",
        "lookup of 1000 stored chunks",
        "limits: raw loopback TCP",
        "_format_safe_path",
    ] {
        assert!(stdout.contains(row), "no {row:?} in:\n{stdout}");
    }
    r.left_nothing();
}

#[test]
fn short_soak_passes() {
    check_binaries();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(S3DMA_TOOLS)
        .args(["soak", "--duration", "20s", "--clients", "4"])
        .env("TMPDIR", dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let verdicts: Vec<&str> = stdout.lines().filter(|l| l.starts_with("soak: ")).collect();
    assert_eq!(
        verdicts.len(),
        1,
        "exactly one verdict line expected:\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_eq!(stdout.lines().last(), Some(verdicts[0]), "{stdout}");
    assert!(
        verdicts[0].starts_with("soak: PASS "),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(out.status.success(), "{}", out.status);
    let samples = stdout
        .lines()
        .filter(|l| l.starts_with("soak sample t="))
        .count();
    assert!(samples >= 10, "{samples} samples:\n{stdout}");
    for name in ["storage-target", "dpu-agent", "host-shim"] {
        assert!(stdout.contains(&format!("| {name} rss=")), "{stdout}");
    }
}

#[test]
fn soak_rejects_bad_arguments_with_one_fail_line() {
    let out = Command::new(S3DMA_TOOLS)
        .args(["soak", "--duration", "5s", "--clients", "0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert_eq!(stdout.trim(), "soak: FAIL --clients must be 1 to 1024");
    let out = Command::new(S3DMA_TOOLS)
        .args(["soak", "--duration", "soon"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// `bench --fanout --quick` against a throw-away Ceph cluster (the
/// repository's `tests/ceph/cluster.sh`, Debian's packages): 8 reader
/// processes through 2 gateways and 8 straight from radosgw. No timing
/// thresholds; the counts are not timings: with cold caches and single
/// flight, the cluster serves each byte once per round, and every reader
/// but the first of each chunk makes no upstream request of its own.
#[test]
fn bench_fanout_quick_against_ceph() {
    check_binaries();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("fanout.json");
    let out = Command::new(S3DMA_TOOLS)
        .args([
            "bench",
            "--fanout",
            "--quick",
            "--object-mib",
            "32",
            "--json",
        ])
        .arg(&json)
        .env("TMPDIR", dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench --fanout failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let text = std::fs::read_to_string(&json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let num = |k: &str| -> f64 {
        v.get(k)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or_else(|| panic!("no number {k} in {text}"))
    };
    for k in [
        "fanout_gbps",
        "fanout_http_gbps",
        "fanout_vs_http",
        "fanout_vs_raw_tcp",
        "raw_tcp_gbps",
    ] {
        let x = num(k);
        assert!(x.is_finite() && x > 0.0, "{k} = {x} in {text}");
    }
    assert_eq!(num("fanout_readers"), 8.0);
    assert_eq!(num("fanout_gateways"), 2.0);
    assert_eq!(num("fanout_object_bytes"), f64::from(32 << 20));
    let ratio = num("fanout_upstream_read_ratio");
    assert!(
        (0.999..=1.001).contains(&ratio),
        "the cluster served {ratio} copies: {text}\n{stderr}"
    );
    // 8 readers, one of which fetches each chunk: 7/8 of the chunk reads
    // found the chunk cached or being fetched.
    let hits = num("gateway_hit_ratio");
    assert!((hits - 0.875).abs() < 1e-9, "hit ratio {hits}: {text}");
    assert!(stdout.contains("s3dma / HTTP:"), "{stdout}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "fanout.json")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
