#![warn(missing_docs)]
//! `s3dma-tools`: the operator's tools for s3dma, apart from the tenant's
//! `s3dma` command.
//!
//! * `s3dma-tools bench` starts a stack (storage-target, dpu-agent and
//!   host-shim, with `s3dma-launcher`) in a temporary directory and measures
//!   it against plain S3 over HTTP and raw loopback TCP (`bench.rs`; the
//!   table and the JSON keys in `report.rs`), or measures an existing stack
//!   (`--endpoint`).
//! * `s3dma-tools bench --fanout` puts gateways in front of an S3 cluster
//!   and times N tenant processes loading one object through them against
//!   the same N straight from the cluster (`fanout.rs`).
//! * `s3dma-tools bench --dirs` times a model-like directory downloaded
//!   and uploaded with `s3dma get/put --recursive` against the aws CLI and
//!   rclone on the same storage-target (`dirs.rs`).
//! * `s3dma-tools bench --kv` stores and retrieves LMCache KV-cache chunks
//!   through the s3dma plug-in and through LMCache's own `s3://` connector
//!   on the same storage-target (`kv.rs`).
//! * `s3dma-tools soak` runs mixed, verified load against such a stack and
//!   watches the services' memory and file descriptors (`soak.rs`; the
//!   verdict in `soak_check.rs`).
//!
//! The service binaries are found next to `s3dma-tools` (cargo puts every
//! workspace binary in one target directory), then on `PATH`.
//!
//! Exit status: 0 success (`soak: PASS`), 1 failure (`soak: FAIL ...`, or
//! any error, printed as one line `s3dma-tools: bench: <what>`), 2 usage.

mod bench;
mod dirs;
mod fanout;
mod kv;
mod limits;
mod ml;
mod options;
mod own_stack;
mod primitives;
mod probe;
mod procfs;
mod python_half;
mod report;
mod soak;
mod soak_check;
mod stats;
mod workers;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Measure and soak-test s3dma on this machine.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// The host-shim's Unix socket, for `bench --endpoint` (an existing
    /// stack) [default: $S3DMA_SOCKET, else /run/s3dma/shim.sock].
    #[arg(long, global = true, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The user the existing stack's host-shim runs as, when it is neither
    /// root nor you: a uid or a user name [default: $S3DMA_SHIM_UID, else
    /// root or you].
    #[arg(
        long,
        global = true,
        value_name = "UID|USER",
        value_parser = parse_shim_uid
    )]
    shim_uid: Option<u32>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
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
        /// The fabric of the stack the bench starts: `tcp`, or `verbs` where
        /// an RDMA device exists (on Soft-RoCE under emulation the figures
        /// only prove the path).
        #[arg(long, default_value = "tcp", value_name = "BACKEND")]
        fabric: s3dma_launcher::Backend,
        /// The dialect the stack's dpu-agent speaks to its storage-target:
        /// `s3dma`, or `hipobj-rc-v2` (AMD's RC dialect: a queue pair per
        /// transfer on the host-shim's device; needs `--fabric verbs`).
        #[arg(long, default_value = "s3dma", value_name = "DIALECT")]
        protocol: s3dma_launcher::RdmaProtocol,
        /// Only the ML phase: a safetensors file and a DCP checkpoint of
        /// 2 GiB (64 MiB with --quick) loaded (and the checkpoint saved)
        /// through s3dma vs s3torchconnector and boto3 against the same
        /// storage-target, beside memcpy and raw TCP. Runs Python
        /// ($S3DMA_PYTHON, else the repository's .venv, else python3).
        #[arg(long, conflicts_with = "endpoint")]
        ml: bool,
        /// Only the directory phase: a model-like directory (8 shards of 256
        /// MiB, 8 MiB with --quick, and 20 JSON files) downloaded and
        /// uploaded with `s3dma get/put --recursive`, `aws s3 cp
        /// --recursive` (the repository's .venv, else PATH) and `rclone
        /// copy`, all against the same storage-target, everything on
        /// /dev/shm: GB/s and host CPU per GB, beside raw loopback TCP and
        /// memcpy.
        #[arg(long, conflicts_with_all = ["endpoint", "ml", "fanout"])]
        dirs: bool,
        /// Only the KV-cache phase: LMCache chunks (256 tokens, bf16) of an
        /// 8B-class and a 70B-class model shape, about 1 GiB each (--quick:
        /// 1/16 of the layers, about 16 MiB), stored and retrieved through
        /// the s3dma LMCache plug-in and through LMCache's own s3://
        /// connector against the same storage-target, plus a lookup of 1,000
        /// stored chunks; GB/s, chunks/s, per-chunk p50/p99, host CPU per
        /// chunk, beside raw TCP and memcpy. Runs Python like --ml (it needs
        /// lmcache and awscrt).
        #[arg(long, conflicts_with_all = ["endpoint", "ml", "fanout", "dirs"])]
        kv: bool,
        /// Only the fan-out: --readers tenant processes load one object
        /// through --gateways s3dma gateways in front of an S3 cluster
        /// (--upstream, else a throw-away Ceph cluster from Debian's
        /// packages), then the same readers with aws-sdk-s3 straight from
        /// the cluster; the upstream bytes read and the gateways' hit ratio
        /// come from their metrics.
        #[arg(long, conflicts_with_all = ["endpoint", "ml", "data_dir"])]
        fanout: bool,
        /// Fan-out: reader processes [default: 8].
        #[arg(long, value_name = "N", requires = "fanout")]
        readers: Option<usize>,
        /// Fan-out: gateways in front of the cluster [default: 2].
        #[arg(long, value_name = "N", requires = "fanout")]
        gateways: Option<usize>,
        /// Fan-out: the object's size in MiB [default: 1024, --quick 64].
        #[arg(long, value_name = "MIB", requires = "fanout")]
        object_mib: Option<u64>,
        /// Fan-out: the S3 endpoint to stand in front of, with your key there
        /// in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (AWS_REGION) [default:
        /// a throw-away Ceph cluster started with tests/ceph/cluster.sh].
        #[arg(long, value_name = "URL", requires = "fanout")]
        upstream: Option<String>,
        /// Only these phases of the whole-stack bench (comma-separated:
        /// large, disk, procs, small, batch) [default: all]; the machine's limits
        /// are always measured.
        #[arg(long, value_delimiter = ',', value_name = "PHASES", conflicts_with_all = ["ml", "fanout", "dirs", "kv"])]
        only: Vec<options::Phase>,
        /// Only the rails phase (root: network namespaces): storage-target
        /// and dpu-agent in one namespace, host-shim in another, joined by
        /// two veth rails limited to --rail-rate each way (tc); GET and PUT
        /// of 4 objects (256 MiB, 64 MiB with --quick) over one rail and
        /// over two, then 16 GETs and 16 PUTs with rail 1 cut halfway and
        /// restored: MB/s and ratios, failed requests, seconds to failback.
        #[arg(long, conflicts_with_all = ["endpoint", "ml", "fanout", "dirs", "kv", "only"])]
        rails: bool,
        /// Rails: each rail's limit in MB/s each way [default: 200].
        #[arg(long, value_name = "MB_PER_SEC", requires = "rails")]
        rail_rate: Option<u64>,
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
    /// Check an S3 server's S3-over-RDMA dialects from this host: a test
    /// object PUT and GET over HTTP (bytes compared), a HEAD carrying a
    /// token (its real length), a cuObject (DC) token on GET and PUT
    /// (declined with 501: the body served, nothing stored), a hipobj-rc-v2
    /// PREPARE and, with `--fabric verbs` on a host with an RDMA device, one
    /// GET and one PUT transfer on a queue pair of this host's, bytes
    /// compared. Each line prints what came back (the x-amz-rdma-* reply
    /// headers) and what it means; exit 1 when the server broke a rule.
    /// The S3 key comes from $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY.
    Probe {
        /// The server's S3 endpoint, http(s)://host:port.
        #[arg(long, value_name = "URL")]
        endpoint: String,
        /// A bucket the key may write (created when missing).
        #[arg(long, default_value = "s3dma-probe")]
        bucket: String,
        /// SigV4 region.
        #[arg(long, default_value = "us-east-1")]
        region: String,
        /// Bytes of the test object.
        #[arg(long, default_value_t = (1 << 20) + 3)]
        size: usize,
        /// `verbs`: run hipobj-rc-v2 transfers on this host's RDMA device.
        #[arg(long, default_value = "tcp", value_name = "BACKEND")]
        fabric: s3dma_launcher::Backend,
        /// The deadline of each request (connect, send and the whole
        /// reply); a server silent for longer ends the probe with an error.
        /// Reply bodies are bounded too: the test object's size plus 64 KiB
        /// for its GETs, 1 MiB for any other reply.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION")]
        timeout: std::time::Duration,
        /// With `--fabric verbs`: the queue pairs' path MTU in bytes (256,
        /// 512, 1024, 2048 or 4096), used when it is lower than the port's
        /// active MTU [default: the active MTU]. For a server on a port of
        /// a lower MTU (emulated NICs often report 1024): the dialect does
        /// not negotiate it, and a multi-packet WRITE between two MTUs
        /// fails.
        #[arg(long, value_name = "BYTES")]
        path_mtu: Option<fabric::config::PathMtu>,
    },
    /// One tenant process of `bench` (started by the bench itself).
    #[command(hide = true)]
    BenchWorker {
        #[arg(long, value_enum)]
        op: workers::WorkerOp,
        #[arg(long)]
        bucket: String,
        #[arg(long)]
        key: String,
        #[arg(long)]
        bytes: u64,
        #[arg(long, default_value_t = 1)]
        rounds: u32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long)]
        socket: Option<PathBuf>,
        #[arg(long)]
        http: Option<String>,
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
flight, both ways; batched GET, PUT and HEAD (batches of 1, 16, 64) beside
HTTP at the same concurrency, and a HEAD of 1,000 keys in one call; CPU (utime+stime) of dpu-agent, host-shim, storage-target
and the bench itself per GB and per request. A full run takes a few minutes
and needs about 6 GiB of memory (1 GiB buffers, the store on /dev/shm).

JSON keys include get_1g_gbps, http_get_1g_gbps, get_1g_vs_http,
get_1g_vs_raw_tcp, raw_tcp_gbps, get_4k_p50_us, http_get_4k_p50_us,
get_4k_ops_64, agent_cpu_us_per_req, agent_cpu_s_per_gb, batch_get_4k_ops_64,
batch_head_1000_ms, batch_agent_cpu_us_per_obj (see tools/README.md, JSON keys).";

/// `--shim-uid`: a uid or a user name.
fn parse_shim_uid(s: &str) -> anyhow::Result<u32> {
    s3dma_client::resolve_uid(s).map_err(|e| anyhow::anyhow!("{}", e.message()))
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
            eprintln!("s3dma-tools: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ok = match cli.command {
        Cmd::Soak {
            duration,
            clients,
            sample_every,
            seed,
        } => rt.block_on(soak::main(soak::Options {
            duration,
            clients,
            sample_every,
            seed,
        })),
        Cmd::Bench {
            quick,
            json,
            rounds,
            fabric,
            protocol,
            cell_secs,
            data_dir,
            endpoint,
            ml,
            dirs,
            kv,
            fanout,
            readers,
            gateways,
            object_mib,
            upstream,
            only,
            rails,
            rail_rate,
        } => match rt.block_on(async {
            let opts = options::Options {
                quick,
                json,
                rounds,
                cell_secs,
                data_dir,
                endpoint,
                fabric,
                protocol,
                ml,
                dirs,
                socket: cli.socket,
                shim_uid: cli.shim_uid,
                fanout,
                readers,
                gateways,
                object_mib,
                upstream,
                only,
                rails,
                rail_rate_mb: rail_rate,
            };
            if opts.fabric == s3dma_launcher::Backend::Tcp
                && opts.protocol != s3dma_launcher::RdmaProtocol::S3dma
            {
                anyhow::bail!(
                    "--protocol {} needs --fabric verbs (its queue pairs or DC target live on the shim's RDMA device)",
                    opts.protocol
                );
            }
            if kv {
                kv::run(&opts).await
            } else {
                bench::run(opts).await
            }
        }) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("s3dma-tools: bench: {e:#}");
                false
            }
        },
        Cmd::Probe {
            endpoint,
            bucket,
            region,
            size,
            fabric,
            timeout,
            path_mtu,
        } => {
            let keys = (
                std::env::var("AWS_ACCESS_KEY_ID"),
                std::env::var("AWS_SECRET_ACCESS_KEY"),
            );
            match keys {
                (Ok(access_key_id), Ok(secret_access_key)) => match rt.block_on(probe::run(
                    probe::Options {
                        endpoint,
                        bucket,
                        region,
                        size,
                        fabric,
                        timeout,
                        path_mtu,
                        access_key_id,
                        secret_access_key,
                    },
                )) {
                    Ok(()) => true,
                    Err(e) => {
                        eprintln!("s3dma-tools: probe: {e:#}");
                        false
                    }
                },
                _ => {
                    eprintln!(
                        "s3dma-tools: probe: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY to an S3 key of the server"
                    );
                    false
                }
            }
        }
        Cmd::BenchWorker {
            op,
            bucket,
            key,
            bytes,
            rounds,
            seed,
            socket,
            http,
        } => match rt.block_on(workers::worker(workers::WorkerOptions {
            op,
            bucket,
            key,
            bytes,
            rounds,
            seed,
            socket,
            http,
            shim_uid: cli.shim_uid,
        })) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("s3dma-tools: bench-worker: {e:#}");
                false
            }
        },
    };
    // Background buffer releases must not hold the exit up.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Client options for a stack started here: its shim runs as us.
#[must_use]
fn own_shim() -> s3dma_client::ClientOptions {
    s3dma_client::ClientOptions::new().with_shim_uid(s3dma_service::private::current_uid())
}

/// Client options trusting a shim running as `shim_uid` (`None`: the
/// client's default, `$S3DMA_SHIM_UID` or our own uid).
#[must_use]
fn client_options(shim_uid: Option<u32>) -> s3dma_client::ClientOptions {
    match shim_uid {
        Some(uid) => s3dma_client::ClientOptions::new().with_shim_uid(uid),
        None => s3dma_client::ClientOptions::new(),
    }
}
