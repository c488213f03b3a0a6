//! What `s3dma-tools bench` was asked for ([`Options`], [`Phase`]) and how
//! its phases report progress: shared by the whole-stack bench
//! ([`crate::bench`]), the fan-out ([`crate::fanout`]) and the ML phase
//! ([`crate::ml`]).

use std::path::PathBuf;

use anyhow::Context as _;

/// The bucket the bench creates and uses.
pub(crate) const BUCKET: &str = "bench";

/// What `s3dma-tools bench` was asked for.
#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    /// Small sizes and short cells (for CI).
    pub quick: bool,
    /// Write the flat JSON object here.
    pub json: Option<PathBuf>,
    /// Rounds per large measurement (default 5, quick 3).
    pub rounds: Option<usize>,
    /// Seconds per small-object cell (default 4, quick 0.6).
    pub cell_secs: Option<f64>,
    /// The storage-target's data directory (default: a temporary directory
    /// on /dev/shm when it has room, else under the system's temp dir).
    pub data_dir: Option<PathBuf>,
    /// Measure an existing stack instead: its storage-target's S3 endpoint
    /// (with `socket` and the tenant's key in `AWS_ACCESS_KEY_ID` /
    /// `AWS_SECRET_ACCESS_KEY`).
    pub endpoint: Option<String>,
    /// The fabric of the stack the bench starts (`tcp` or `verbs`).
    pub fabric: s3dma_launcher::Backend,
    /// The dialect its agent speaks to its storage-target (`s3dma`, or
    /// `hipobj-rc-v2`: a queue pair per transfer on the shim's device).
    pub protocol: s3dma_launcher::RdmaProtocol,
    /// Only the ML phase ([`crate::ml`]): safetensors and DCP loads through
    /// s3dma against the S3 connectors ML users run today.
    pub ml: bool,
    /// Only the directory phase ([`crate::dirs`]): a model-like directory
    /// through `s3dma get/put --recursive` against the aws CLI and rclone.
    pub dirs: bool,
    /// The existing stack's shim socket (default: [`s3dma_client::Client::default_socket`]).
    pub socket: Option<PathBuf>,
    /// The uid the existing stack's shim runs as besides root (`--shim-uid`;
    /// `None` = `$S3DMA_SHIM_UID`, else ours). A stack started here runs as
    /// us and is always checked against our own uid.
    pub shim_uid: Option<u32>,
    /// Only the fan-out ([`crate::fanout`]): N tenant processes load one
    /// object through gateways in front of an S3 cluster vs straight from it.
    pub fanout: bool,
    /// Fan-out readers (default 8).
    pub readers: Option<usize>,
    /// Fan-out gateways (default 2).
    pub gateways: Option<usize>,
    /// Fan-out object size in MiB (default 1024, quick 64).
    pub object_mib: Option<u64>,
    /// The S3 endpoint the fan-out's gateways stand in front of (default: a
    /// throw-away Ceph cluster).
    pub upstream: Option<String>,
    /// Only these phases (`--only`; empty: all). The limits are always
    /// measured.
    pub only: Vec<Phase>,
    /// Only the rails phase ([`crate::bench`]'s `rails`, root): GET and PUT
    /// over one and two rate-limited veth rails in network namespaces, and
    /// a rail cut and restored during transfers.
    pub rails: bool,
    /// Each rail's limit in MB/s each way (`--rail-rate`; default 200).
    pub rail_rate_mb: Option<u64>,
}

/// A phase of the whole-stack bench, for `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Phase {
    /// Large objects through s3dma and HTTP.
    Large,
    /// The large PUT to a store on disk (a second stack).
    Disk,
    /// 1, 2, 4 and 8 tenant processes.
    Procs,
    /// Small objects at 1, 16 and 64 in flight, with the CPU per request.
    Small,
    /// Batched GET, PUT and HEAD of small objects (batches of 1, 16, 64)
    /// beside HTTP at the same concurrency, and one HEAD of 1,000 keys.
    Batch,
}

/// Writes `value` as pretty JSON to `--json`, when given, and says so.
pub(crate) fn write_json(
    opts: &Options,
    value: impl Into<serde_json::Value>,
) -> anyhow::Result<()> {
    if let Some(path) = &opts.json {
        let text = serde_json::to_string_pretty(&value.into())? + "\n";
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        progress(&format!("wrote {}", path.display()));
    }
    Ok(())
}

/// The first line of a phase's table: the phase's flag (`--kv`), the
/// fabric, the CPUs and `place` (where the data was kept).
pub(crate) fn table_title(flag: &str, opts: &Options, place: &str) -> String {
    format!(
        "s3dma-tools bench {flag}{}: {} fabric on loopback, {} CPUs, {place}",
        if opts.quick { " --quick" } else { "" },
        opts.fabric,
        std::thread::available_parallelism().map_or(0, usize::from),
    )
}

/// Prints one progress line on stderr.
pub(crate) fn progress(msg: &str) {
    eprintln!("s3dma-tools bench: {msg}");
}
