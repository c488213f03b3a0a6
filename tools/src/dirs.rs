//! `s3dma-tools bench --dirs`: a model-like directory (8 shards and 20
//! small JSON files) downloaded and uploaded whole with `s3dma get/put
//! --recursive`, side by side with `aws s3 cp --recursive` and `rclone
//! copy` against the same storage-target, in one run, beside the machine's
//! limits (raw loopback TCP, memcpy) measured in the same run.
//!
//! Source, destinations and the store are on /dev/shm, so the figures are
//! the tools', not a disk's. Each tool runs as its own process with its
//! defaults, as a user would run it; the host CPU is the tool process's
//! (user + system, from this process's waited-for children) plus, for
//! s3dma, the host-shim's. Rounds alternate the tools; the median is kept.
//! The first download of each tool is compared byte for byte with the
//! source (untimed).
//!
//! JSON keys: `dirs_bytes`, `dirs_files`, for each direction `get`/`put`:
//! `dirs_{dir}_gbps` (s3dma), `dirs_{dir}_aws_gbps`, `dirs_{dir}_rclone_gbps`,
//! `dirs_{dir}_vs_aws`, `dirs_{dir}_vs_rclone`, and the host CPU seconds
//! per GB `dirs_{dir}_cpu_s_per_gb`, `dirs_{dir}_aws_cpu_s_per_gb`,
//! `dirs_{dir}_rclone_cpu_s_per_gb`; the limits `raw_tcp_gbps` and
//! `memcpy_gbps`. A tool that is not installed is left out (its keys are
//! absent, the table says why).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Map, Value};

use crate::options::{Options, progress, table_title, write_json};
use crate::own_stack::OwnStack;
use crate::primitives::{fill_random, raw_tcp};
use crate::stats::{fmt, num};

/// The tools compared, in the order they run in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tool {
    S3dma,
    Aws,
    Rclone,
}

impl Tool {
    const ALL: [Tool; 3] = [Tool::S3dma, Tool::Aws, Tool::Rclone];

    /// The JSON key part (`""` for s3dma's own keys).
    fn key(self) -> &'static str {
        match self {
            Tool::S3dma => "",
            Tool::Aws => "_aws",
            Tool::Rclone => "_rclone",
        }
    }

    fn label(self, dir: Dir) -> &'static str {
        match (self, dir) {
            (Tool::S3dma, Dir::Get) => "s3dma get --recursive",
            (Tool::S3dma, Dir::Put) => "s3dma put --recursive",
            (Tool::Aws, _) => "aws s3 cp --recursive",
            (Tool::Rclone, _) => "rclone copy",
        }
    }
}

/// A direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Dir {
    Get,
    Put,
}

impl Dir {
    fn key(self) -> &'static str {
        match self {
            Dir::Get => "get",
            Dir::Put => "put",
        }
    }
}

/// How to run the three tools against the stack.
struct Tools {
    s3dma: PathBuf,
    aws: Option<PathBuf>,
    rclone: Option<PathBuf>,
    missing: Vec<String>,
    socket: PathBuf,
    url: String,
    bucket: String,
    key_id: String,
    secret: String,
    /// An empty HOME for the aws CLI and rclone (no user configuration).
    home: PathBuf,
}

impl Tools {
    fn available(&self, t: Tool) -> bool {
        match t {
            Tool::S3dma => true,
            Tool::Aws => self.aws.is_some(),
            Tool::Rclone => self.rclone.is_some(),
        }
    }

    /// The command moving `local` to or from `s3://bucket/prefix/`.
    fn command(&self, t: Tool, dir: Dir, local: &Path, prefix: &str) -> tokio::process::Command {
        let remote_s3 = format!("s3://{}/{prefix}/", self.bucket);
        let local = local.as_os_str();
        let mut c;
        match t {
            Tool::S3dma => {
                c = tokio::process::Command::new(&self.s3dma);
                c.env("S3DMA_SOCKET", &self.socket).arg("-q");
                match dir {
                    Dir::Get => c.args(["get", "-r", &remote_s3]).arg(local),
                    Dir::Put => c.args(["put", "-r"]).arg(local).arg(&remote_s3),
                };
            }
            Tool::Aws => {
                c = tokio::process::Command::new(self.aws.as_deref().unwrap_or(Path::new("aws")));
                c.args([
                    "--endpoint-url",
                    &self.url,
                    "s3",
                    "cp",
                    "--recursive",
                    "--only-show-errors",
                ]);
                match dir {
                    Dir::Get => c.arg(&remote_s3).arg(local),
                    Dir::Put => c.arg(local).arg(&remote_s3),
                };
            }
            Tool::Rclone => {
                c = tokio::process::Command::new(
                    self.rclone.as_deref().unwrap_or(Path::new("rclone")),
                );
                let remote = format!("st:{}/{prefix}/", self.bucket);
                c.args(["copy", "--retries", "1"])
                    .env("RCLONE_CONFIG_ST_TYPE", "s3")
                    .env("RCLONE_CONFIG_ST_PROVIDER", "Other")
                    .env("RCLONE_CONFIG_ST_ENDPOINT", &self.url)
                    .env("RCLONE_CONFIG_ST_REGION", s3dma_launcher::REGION)
                    .env("RCLONE_CONFIG_ST_FORCE_PATH_STYLE", "true")
                    .env("RCLONE_CONFIG_ST_ACCESS_KEY_ID", &self.key_id)
                    .env("RCLONE_CONFIG_ST_SECRET_ACCESS_KEY", &self.secret)
                    .env("RCLONE_CONFIG", self.home.join("rclone.conf"));
                match dir {
                    Dir::Get => c.arg(&remote).arg(local),
                    Dir::Put => c.arg(local).arg(&remote),
                };
            }
        }
        // No AWS_* or RCLONE_* of ours (CA bundles, profiles) reaches the
        // tools: they see only the stack's key.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if (k.starts_with("AWS_") || k.starts_with("RCLONE_"))
                && !k.starts_with("RCLONE_CONFIG_ST_")
            {
                c.env_remove(&*k);
            }
        }
        c.env("HOME", &self.home)
            .env("AWS_ACCESS_KEY_ID", &self.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &self.secret)
            .env("AWS_DEFAULT_REGION", s3dma_launcher::REGION)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        c
    }
}

/// `aws` next to the Python this repository's bench uses, else on PATH.
fn find_aws() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let venv = exe
        .ancestors()
        .skip(1)
        .map(|d| d.join(".venv/bin/aws"))
        .find(|p| p.is_file());
    venv.or_else(|| find_on_path("aws"))
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// CPU ticks (user + system) of this process's waited-for children
/// (`cutime` + `cstime`, fields 16 and 17 of `/proc/self/stat`).
fn children_ticks() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return 0;
    };
    let mut f = rest.split_ascii_whitespace().skip(16 - 3);
    let a: u64 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let b: u64 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    a + b
}

fn process_ticks(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| crate::procfs::cpu_ticks(&s))
        .unwrap_or(0)
}

/// One timed run: seconds and host CPU seconds.
struct Sample {
    secs: f64,
    cpu_secs: f64,
}

/// Writes the model-like directory: `shards` files of `shard` bytes and 20
/// JSON files of 200 B to 48 KiB. Returns the total bytes.
fn write_model(dir: &Path, shards: usize, shard: usize) -> anyhow::Result<u64> {
    std::fs::create_dir_all(dir.join("shards"))?;
    let mut total = 0u64;
    let mut buf = vec![0u8; shard];
    for i in 0..shards {
        fill_random(&mut buf, i as u64 + 1);
        let name = format!("shards/model-{:05}-of-{shards:05}.safetensors", i + 1);
        std::fs::write(dir.join(name), &buf)?;
        total += shard as u64;
    }
    for i in 0..20usize {
        let len = 200 + i * i * 120;
        let mut text = format!("{{\"file\": {i}, \"pad\": \"");
        while text.len() + 2 < len {
            text.push((b'a' + (text.len() % 26) as u8) as char);
        }
        text.push_str("\"}");
        let name = if i < 4 {
            format!("config-{i}.json")
        } else {
            format!("tokenizer/part-{i}.json")
        };
        std::fs::create_dir_all(dir.join(&name).parent().unwrap_or(dir))?;
        std::fs::write(dir.join(name), text.as_bytes())?;
        total += text.len() as u64;
    }
    Ok(total)
}

/// Every file under `root`, by relative name, with its bytes' SHA-256.
fn digests(root: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    use sha2::Digest as _;
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let e = e?;
            if e.file_type()?.is_dir() {
                stack.push(e.path());
            } else {
                let name = e.path().strip_prefix(root)?.to_string_lossy().into_owned();
                let bytes = std::fs::read(e.path())?;
                out.insert(name, hex::encode(sha2::Sha256::digest(&bytes)));
            }
        }
    }
    Ok(out)
}

/// Runs the dirs phase, prints its table and writes `--json`.
///
/// # Errors
/// The stack does not start or dies, a tool fails or brings back other
/// bytes, /dev/shm has no room, the JSON file cannot be written.
pub(crate) async fn run(opts: &Options, raw_tcp_for: Duration) -> anyhow::Result<()> {
    if opts.endpoint.is_some() {
        bail!("--dirs starts its own stack; it cannot be used with --endpoint");
    }
    let (shards, shard) = if opts.quick {
        (8, 8 << 20)
    } else {
        (8, 256 << 20)
    };
    let rounds = opts.rounds.unwrap_or(if opts.quick { 1 } else { 3 });
    if !(1..=100).contains(&rounds) {
        bail!("--rounds must be 1 to 100 with --dirs");
    }
    let model_bytes = (shards * shard) as u64;
    // The store holds the source prefix and one upload; /dev/shm also holds
    // the source and one download.
    let mut started = OwnStack::start(opts, 2 * model_bytes + (256 << 20)).await?;
    let work = tempfile::Builder::new()
        .prefix("s3dma-bench-dirs-")
        .tempdir_in(if started.data_dir.starts_with("/dev/shm") {
            Path::new("/dev/shm")
        } else {
            started.data_dir.parent().unwrap_or(Path::new("/tmp"))
        })
        .context("creating the bench's directory")?;
    let (tools, shim_pid) = tools_for(&started, work.path())?;
    let result = tokio::select! {
        r = measure(tools, shim_pid, work.path(), shards, shard, rounds, raw_tcp_for) => r,
        e = started.stack.any_exit() => Err(e.into()),
    };
    let data_dir = started.data_dir.display().to_string();
    drop(work);
    started.stop().await;
    let (m, missing) = result?;
    print!(
        "{}",
        table(&m, &missing, opts, &data_dir, rounds, shards, shard)
    );
    let mut m = m;
    m.insert("quick".into(), Value::from(u8::from(opts.quick)));
    write_json(opts, m)?;
    Ok(())
}

/// The tools pointed at the bench's stack, and the host-shim's pid.
fn tools_for(started: &OwnStack, work: &Path) -> anyhow::Result<(Tools, Option<u32>)> {
    let stack = &started.stack;
    let ep = stack.endpoints();
    let (key_id, secret) = stack.credentials();
    let s3dma = std::env::current_exe()?
        .parent()
        .map(|d| d.join("s3dma"))
        .filter(|p| p.is_file())
        .context("no s3dma binary next to s3dma-tools (cargo build --bins)")?;
    let home = work.join("home");
    std::fs::create_dir_all(&home)?;
    let mut tools = Tools {
        s3dma,
        aws: find_aws(),
        rclone: find_on_path("rclone"),
        missing: Vec::new(),
        socket: ep.socket.clone(),
        url: ep.target_url.clone(),
        bucket: stack.bucket().to_owned(),
        key_id: key_id.to_owned(),
        secret: secret.to_owned(),
        home,
    };
    if tools.aws.is_none() {
        tools
            .missing
            .push("aws CLI: not in .venv/bin or on PATH".into());
    }
    if tools.rclone.is_none() {
        tools.missing.push("rclone: not on PATH".into());
    }
    let shim_pid = stack
        .services()
        .iter()
        .find(|s| s.name == "host-shim")
        .map(|s| s.pid);
    Ok((tools, shim_pid))
}

async fn measure(
    tools: Tools,
    shim_pid: Option<u32>,
    work: &Path,
    shards: usize,
    shard: usize,
    rounds: usize,
    raw_tcp_for: Duration,
) -> anyhow::Result<(Map<String, Value>, Vec<String>)> {
    progress(&format!("raw loopback TCP for {raw_tcp_for:?}"));
    let raw = raw_tcp(raw_tcp_for).await?;
    let memcpy = crate::limits::memcpy_gbps(64 << 20, Duration::from_millis(500));

    let src = work.join("src");
    progress(&format!(
        "writing {shards} shards of {} MiB and 20 JSON files",
        shard >> 20
    ));
    let total = tokio::task::spawn_blocking({
        let src = src.clone();
        move || write_model(&src, shards, shard)
    })
    .await??;
    let want = digests(&src)?;
    let files = want.len();
    // The download source, put there once (untimed) by s3dma.
    run_tool(&tools, Tool::S3dma, Dir::Put, &src, "model", shim_pid).await?;

    let client = s3dma_client::Client::connect_with(&tools.socket, crate::own_shim())
        .await
        .context("connecting to the bench's host-shim")?;
    let mut samples: BTreeMap<(Dir, usize), Vec<Sample>> = BTreeMap::new();
    for round in 0..rounds {
        for (ti, t) in Tool::ALL.into_iter().enumerate() {
            if !tools.available(t) {
                continue;
            }
            let dst = work.join(format!("dst-{round}-{ti}"));
            progress(&format!(
                "round {}/{rounds}: {}",
                round + 1,
                t.label(Dir::Get)
            ));
            let s = run_tool(&tools, t, Dir::Get, &dst, "model", shim_pid).await?;
            if round == 0 {
                let got = digests(&dst)?;
                if got != want {
                    bail!(
                        "{} brought back other files or bytes than the source ({} files, {} expected)",
                        t.label(Dir::Get),
                        got.len(),
                        want.len()
                    );
                }
            }
            std::fs::remove_dir_all(&dst)?;
            samples.entry((Dir::Get, ti)).or_default().push(s);

            progress(&format!(
                "round {}/{rounds}: {}",
                round + 1,
                t.label(Dir::Put)
            ));
            let s = run_tool(&tools, t, Dir::Put, &src, "upload", shim_pid).await?;
            let listed = client
                .list_all(&tools.bucket, "upload/")
                .await
                .context("listing the upload")?;
            let up: u64 = listed.iter().map(|o| o.size).sum();
            if listed.len() != files || up != total {
                bail!(
                    "{} stored {} objects of {up} bytes, expected {files} of {total}",
                    t.label(Dir::Put),
                    listed.len()
                );
            }
            for o in listed {
                client
                    .delete(&tools.bucket, &o.key)
                    .await
                    .context("deleting the upload")?;
            }
            samples.entry((Dir::Put, ti)).or_default().push(s);
        }
    }

    let mut m = Map::new();
    m.insert("raw_tcp_gbps".into(), num(Some(raw)));
    m.insert("memcpy_gbps".into(), num(memcpy));
    m.insert("dirs_bytes".into(), Value::from(total));
    m.insert("dirs_files".into(), Value::from(files));
    for dir in [Dir::Get, Dir::Put] {
        for (ti, t) in Tool::ALL.into_iter().enumerate() {
            let Some(v) = samples.get(&(dir, ti)) else {
                continue;
            };
            let secs = median(v.iter().map(|s| s.secs).collect());
            let cpu = median(v.iter().map(|s| s.cpu_secs).collect());
            let gb = total as f64 / 1e9;
            m.insert(
                format!("dirs_{}{}_gbps", dir.key(), t.key()),
                num(Some(gb / secs)),
            );
            m.insert(
                format!("dirs_{}{}_cpu_s_per_gb", dir.key(), t.key()),
                num(Some(cpu / gb)),
            );
        }
        let ours = m
            .get(&format!("dirs_{}_gbps", dir.key()))
            .and_then(Value::as_f64);
        for t in [Tool::Aws, Tool::Rclone] {
            let theirs = m
                .get(&format!("dirs_{}{}_gbps", dir.key(), t.key()))
                .and_then(Value::as_f64);
            if let (Some(o), Some(x)) = (ours, theirs) {
                m.insert(
                    format!("dirs_{}_vs{}", dir.key(), t.key()),
                    num(Some(o / x)),
                );
            }
        }
    }
    Ok((m, tools.missing))
}

/// Runs one tool once, timed; fails with its stderr when it fails.
async fn run_tool(
    tools: &Tools,
    t: Tool,
    dir: Dir,
    local: &Path,
    prefix: &str,
    shim: Option<u32>,
) -> anyhow::Result<Sample> {
    let tps = crate::stats::ticks_per_sec();
    let (c0, s0) = (children_ticks(), shim.map_or(0, process_ticks));
    let started = Instant::now();
    let out = tools
        .command(t, dir, local, prefix)
        .output()
        .await
        .with_context(|| format!("starting {}", t.label(dir)))?;
    let secs = started.elapsed().as_secs_f64();
    let (c1, s1) = (children_ticks(), shim.map_or(0, process_ticks));
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            t.label(dir),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let shim_ticks = if t == Tool::S3dma {
        s1.saturating_sub(s0)
    } else {
        0
    };
    Ok(Sample {
        secs,
        cpu_secs: (c1.saturating_sub(c0) + shim_ticks) as f64 / tps as f64,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn table(
    m: &Map<String, Value>,
    missing: &[String],
    opts: &Options,
    data_dir: &str,
    rounds: usize,
    shards: usize,
    shard: usize,
) -> String {
    let get = |k: &str| m.get(k).and_then(Value::as_f64);
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{}",
        table_title("--dirs", opts, &format!("store in {data_dir}"))
    );
    let _ = writeln!(
        o,
        "a model-like directory: {shards} shards of {} MiB + 20 JSON files ({:.0} MiB, {} files); \
         median of {rounds} rounds; source and destinations on /dev/shm; GB/s = 10^9 bytes/s; \
         host CPU = the tool's process (+ the host-shim for s3dma) per GB",
        shard >> 20,
        get("dirs_bytes").unwrap_or(0.0) / f64::from(1u32 << 20),
        get("dirs_files").unwrap_or(0.0),
    );
    let _ = writeln!(
        o,
        "limits: raw loopback TCP {} GB/s, memcpy {} GB/s\n",
        fmt(get("raw_tcp_gbps")),
        fmt(get("memcpy_gbps"))
    );
    let _ = writeln!(
        o,
        "  {:<28} {:>8} {:>14} {:>10}",
        "", "GB/s", "host CPU s/GB", "s3dma/it"
    );
    for dir in [Dir::Get, Dir::Put] {
        let _ = writeln!(
            o,
            "{}",
            if dir == Dir::Get {
                "download"
            } else {
                "upload"
            }
        );
        for t in Tool::ALL {
            let k = |what: &str| format!("dirs_{}{}{what}", dir.key(), t.key());
            let vs = if t == Tool::S3dma {
                String::new()
            } else {
                fmt(get(&format!("dirs_{}_vs{}", dir.key(), t.key())))
            };
            let _ = writeln!(
                o,
                "  {:<28} {:>8} {:>14} {:>10}",
                t.label(dir),
                fmt(get(&k("_gbps"))),
                fmt(get(&k("_cpu_s_per_gb"))),
                vs
            );
        }
    }
    for why in missing {
        let _ = writeln!(o, "  not measured: {why}");
    }
    o
}
