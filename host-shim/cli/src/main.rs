//! `s3dma`: the s3dma command line.
//!
//! Client commands talk to the host-shim on its Unix socket (`--socket`,
//! else `$S3DMA_SOCKET`, else `/run/s3dma/shim.sock`) through
//! `s3dma-client`: `get`, `put`, `ls`, `stat`, `rm`, `info`. Object bytes
//! move between shared-memory buffers and storage by RDMA; the CLI only
//! copies them between those buffers and files.
//!
//! `s3dma local` starts storage-target, dpu-agent and host-shim on this
//! machine (see `local.rs`). `s3dma bench` starts such a stack in a
//! temporary directory and measures it against plain S3 over HTTP
//! (`bench.rs`); `s3dma soak` runs mixed, verified load against one and
//! watches the services' memory and file descriptors (`soak.rs`).
//!
//! Exit status:
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | success |
//! | 1 | any other error (I/O, internal, quota, timeout; `s3dma local` failures) |
//! | 2 | usage: a bad command line or URL |
//! | 3 | not found (`NoSuchKey`, `NoSuchBucket`) |
//! | 4 | access denied (or a uid the shim does not know) |
//! | 5 | unavailable: the host-shim (its socket) or the dpu-agent is down |
//! | 6 | precondition failed: the object changed during the transfer |
//! | 7 | invalid range |
//! | 8 | untrusted shim: the socket is served by a uid that is neither root nor the expected one |
//!
//! Every connection to the socket is checked (`SO_PEERCRED`) before a byte
//! is sent: the shim must run as root or as the caller's own uid, or as the
//! uid named by `--shim-uid` / `$S3DMA_SHIM_UID` (a number or a user name).
//!
//! Errors are one line on stderr: `s3dma: <what>: <code>: <message> (request id ...)`.

mod bench;
mod commands;
mod local;
mod procfs;
mod report;
mod soak;
mod soak_check;
mod stats;
mod url;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use commands::{Failure, Global};

const EXIT_CODES: &str = "\
Exit status:
  0  success
  1  any other error (I/O, internal, quota, timeout; local mode failures)
  2  usage: a bad command line or URL
  3  not found (NoSuchKey, NoSuchBucket)
  4  access denied
  5  unavailable: the host-shim (its socket) or the dpu-agent is down
  6  precondition failed: the object changed during the transfer
  7  invalid range
  8  untrusted shim: the socket is served by a uid that is neither root nor
     the expected one (another user's process?); nothing was sent to it

Every connection to the socket is checked first: the shim must run as root,
as you, or as the uid given by --shim-uid or $S3DMA_SHIM_UID.

Errors are one line on stderr: s3dma: <what>: <code>: <message> (request id ...)";

/// Move S3 objects through the s3dma host-shim (RDMA into shared memory),
/// or run the whole stack locally.
#[derive(Debug, Parser)]
#[command(version, about, after_help = EXIT_CODES)]
struct Cli {
    /// The host-shim's Unix socket.
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        help = "The host-shim's Unix socket [default: $S3DMA_SOCKET, else /run/s3dma/shim.sock; \
                for `local`: $XDG_RUNTIME_DIR/s3dma/shim.sock, else /tmp/s3dma-<uid>/shim.sock]"
    )]
    socket: Option<PathBuf>,
    /// The user the host-shim runs as, when it is neither root nor you: a
    /// uid or a user name [default: $S3DMA_SHIM_UID, else root or you].
    /// A socket served by anyone else is refused (exit 8) before a byte is
    /// sent.
    #[arg(
        long,
        global = true,
        value_name = "UID|USER",
        value_parser = parse_shim_uid
    )]
    shim_uid: Option<u32>,
    /// No progress bars or summaries (errors are still printed).
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Download an object (or a range of it) to a file or stdout.
    #[command(after_help = EXIT_CODES)]
    Get {
        /// s3://bucket/key
        url: String,
        /// Destination file, a directory, or - for stdout.
        #[arg(help = "Destination file, a directory, or - for stdout \
                    [default: the key's last part, in the current directory]")]
        file: Option<PathBuf>,
        /// Only these bytes: FIRST-LAST, FIRST- or -SUFFIX (e.g. 0-1023).
        #[arg(long, value_name = "RANGE", allow_hyphen_values = true)]
        range: Option<String>,
    },
    /// Upload a file (or stdin, -) as one object.
    #[command(after_help = EXIT_CODES)]
    Put {
        /// Source file, or - for stdin.
        file: PathBuf,
        /// s3://bucket/key (a key ending in / gets the file's name appended).
        url: String,
        /// Content-Type to store.
        #[arg(long, value_name = "TYPE")]
        content_type: Option<String>,
        /// User metadata NAME=VALUE (repeatable).
        #[arg(long = "meta", value_name = "NAME=VALUE")]
        meta: Vec<String>,
    },
    /// List objects: s3://bucket[/prefix]; directories (common prefixes) show
    /// as PRE unless --recursive.
    #[command(after_help = EXIT_CODES)]
    Ls {
        /// s3://bucket or s3://bucket/prefix
        url: String,
        /// Every key under the prefix, without grouping by "/".
        #[arg(short, long)]
        recursive: bool,
    },
    /// Show an object's size, ETag, content type, modification time and metadata.
    #[command(after_help = EXIT_CODES)]
    Stat {
        /// s3://bucket/key
        url: String,
    },
    /// Delete an object (deleting a missing key succeeds, as in S3).
    #[command(after_help = EXIT_CODES)]
    Rm {
        /// s3://bucket/key
        url: String,
    },
    /// Show who the shim thinks you are, your limits and whether the
    /// dpu-agent is connected.
    #[command(after_help = EXIT_CODES)]
    Info,
    /// Run storage-target, dpu-agent and host-shim on this machine (tcp
    /// fabric, loopback only) until Ctrl-C. Prints
    /// `s3dma local ready: socket=PATH` when they are up.
    ///
    /// The socket's default directory (`$XDG_RUNTIME_DIR/s3dma`, else
    /// `/tmp/s3dma-<uid>`) is made 0700 and refused when another user owns it
    /// or it is a symlink; a --socket elsewhere needs a directory of yours
    /// (or root's) that neither group nor others may write to.
    Local {
        /// State directory: data, generated configs, secrets, logs.
        #[arg(
            long,
            value_name = "DIR",
            help = "State directory: data, generated configs, secrets, logs; made 0700 \
                    (an existing one owned by another user, or a symlink, is refused), \
                    files 0600 [default: $XDG_DATA_HOME/s3dma/local, else \
                    ~/.local/share/s3dma/local]"
        )]
        dir: Option<PathBuf>,
        /// Bucket created at start-up if missing.
        #[arg(long, default_value = "data", value_name = "NAME")]
        bucket: String,
    },
    /// Start a local stack in a temporary directory and measure it: GET/PUT
    /// throughput of large objects and ops/s and latency of small ones
    /// through s3dma, side by side with aws-sdk-s3 straight to the
    /// storage-target over HTTP and with raw loopback TCP, plus the CPU time
    /// of each service. Progress on stderr, a table on stdout.
    #[command(after_help = BENCH_HELP)]
    Bench {
        /// Small sizes and short cells, for CI: 8 MiB and 64 MiB objects
        /// (reported under the `64m` and `1g` keys), 3 rounds, 0.6 s per
        /// small-object cell.
        #[arg(long)]
        quick: bool,
        /// Also write the results as one flat JSON object to this file.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Rounds per large-object measurement (median kept) [default: 5, --quick 3].
        #[arg(long, value_name = "N")]
        rounds: Option<usize>,
        /// Seconds per small-object cell [default: 4, --quick 0.6].
        #[arg(long, value_name = "SECS")]
        cell_secs: Option<f64>,
        /// The storage-target's data directory [default: a temporary
        /// directory in /dev/shm when it has room, else in $TMPDIR].
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Measure an existing stack instead of starting one: its
        /// storage-target's S3 endpoint (http://IP:PORT). The shim is found
        /// at --socket (or $S3DMA_SOCKET); the tenant's S3 key is taken from
        /// $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY; CPU is reported when
        /// exactly one dpu-agent, host-shim and storage-target run here.
        #[arg(long, value_name = "URL")]
        endpoint: Option<String>,
    },
    /// Start a local stack in a temporary directory and run mixed, verified
    /// load against it (GET/PUT/HEAD/LIST/DELETE from many clients), sampling
    /// the services' memory and open fds; ends with `soak: PASS` or
    /// `soak: FAIL <reasons>` (exit 1).
    #[command(after_help = SOAK_HELP)]
    Soak {
        /// How long the load runs, e.g. 20s, 30m, 2h.
        #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
        duration: std::time::Duration,
        /// Concurrent clients (each with its own connection and buffer).
        #[arg(long, default_value_t = 32, value_name = "N")]
        clients: usize,
        /// Time between samples, e.g. 10s [default: duration / 40, 1 s to 60 s].
        #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION")]
        sample_every: Option<std::time::Duration>,
        /// Seed of the clients' random choices [default: random, printed].
        #[arg(long, value_name = "N")]
        seed: Option<u64>,
    },
}

const SOAK_HELP: &str = "\
Each client owns 8 keys and checks every reply against what it wrote: PUT
(0 B to 16 MiB; client 0 also 72 MiB multipart uploads), GET (CRC-32), ranged
GET (bytes compared), HEAD (size, ETag, metadata), LIST (keys, sizes, ETags),
DELETE (then NoSuchKey). About 40 `soak sample` lines report VmRSS, RssShmem
and open fds of storage-target, dpu-agent and host-shim.

The last line is `soak: PASS ...` (exit 0) or `soak: FAIL <reasons>` (exit 1):
any mismatch or unexpected error, a service that died, private RSS (VmRSS -
RssShmem) whose last-quarter median exceeds 1.5x the first quarter's largest
value + 64 MiB + 16 MiB per client, open fds beyond the first quarter's
largest + 2 per client + 32, or at the end windows open in the shim, requests
in flight in the agent, staging buffers in use, buffers or leases left in the
shim. Not meant for CI: run it for 30 minutes or more on a release build.";

const BENCH_HELP: &str = "\
Phases: raw loopback TCP (~2 s); large objects (64 MiB, 1 GiB): PUT then GET
through s3dma, then the same with aws-sdk-s3 over HTTP, median of the rounds;
small objects (4 KiB, 64 KiB): GET and PUT with 1, 16 and 64 requests in
flight, both ways; CPU (utime+stime) of dpu-agent, host-shim, storage-target
and the bench itself per GB and per request. A full run takes a few minutes
and needs about 6 GiB of memory (1 GiB buffers, the store on /dev/shm).

JSON keys include get_1g_gbps, http_get_1g_gbps, get_1g_vs_http,
get_1g_vs_raw_tcp, raw_tcp_gbps, get_4k_p50_us, http_get_4k_p50_us,
get_4k_ops_64, agent_cpu_us_per_req, agent_cpu_s_per_gb (see docs/ARCHITECTURE.md).";

/// `--shim-uid`: a uid or a user name.
fn parse_shim_uid(s: &str) -> Result<u32, String> {
    s3dma_client::resolve_uid(s).map_err(|e| e.message().to_owned())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("s3dma: starting the runtime: {e}");
            return ExitCode::from(commands::EXIT_OTHER);
        }
    };
    let g = Global {
        socket: cli.socket.clone(),
        quiet: cli.quiet,
        shim_uid: cli.shim_uid,
    };
    if let Cmd::Soak {
        duration,
        clients,
        sample_every,
        seed,
    } = cli.command
    {
        let passed = rt.block_on(soak::main(soak::Options {
            duration,
            clients,
            sample_every,
            seed,
        }));
        rt.shutdown_timeout(std::time::Duration::from_secs(2));
        return ExitCode::from(if passed {
            commands::EXIT_OK
        } else {
            commands::EXIT_OTHER
        });
    }
    let result: Result<(), Failure> = rt.block_on(async {
        match cli.command {
            Cmd::Get { url, file, range } => {
                commands::get(&g, &url, file.as_deref(), range.as_deref()).await
            }
            Cmd::Put {
                file,
                url,
                content_type,
                meta,
            } => commands::put(&g, &file, &url, content_type, &meta).await,
            Cmd::Ls { url, recursive } => commands::ls(&g, &url, recursive).await,
            Cmd::Stat { url } => commands::stat(&g, &url).await,
            Cmd::Rm { url } => commands::rm(&g, &url).await,
            Cmd::Info => commands::info(&g).await,
            Cmd::Local { dir, bucket } => local::run(local::Options {
                dir,
                socket: cli.socket,
                bucket,
            })
            .await
            .map_err(|e| Failure::Other(format!("local: {e:#}"))),
            Cmd::Bench {
                quick,
                json,
                rounds,
                cell_secs,
                data_dir,
                endpoint,
            } => bench::run(bench::Options {
                quick,
                json,
                rounds,
                cell_secs,
                data_dir,
                endpoint,
                socket: cli.socket,
                shim_uid: cli.shim_uid,
            })
            .await
            .map_err(|e| Failure::Other(format!("bench: {e:#}"))),
            Cmd::Soak { .. } => Ok(()),
        }
    });
    // Background buffer releases must not hold the exit up.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => ExitCode::from(commands::EXIT_OK),
        Err(f) => f.report(),
    }
}
