//! `s3dma-tools bench` results: the data model, the table and the flat JSON
//! object (pure: the runner in `bench.rs` fills a [`Report`]).
//!
//! JSON keys (every value a number, `null` where a measurement is missing):
//!
//! - `{op}_{size}_gbps` and `http_{op}_{size}_gbps` for op `get`/`put` and
//!   size `64m`/`1g` (the medium and large objects: 64 MiB and 1 GiB, or
//!   8 MiB and 64 MiB with `--quick`; `medium_object_bytes` and
//!   `large_object_bytes` say which), median over the rounds;
//! - `{op}_{size}_vs_http` and `{op}_{size}_vs_raw_tcp`: s3dma ÷ HTTP and
//!   s3dma ÷ raw TCP; `raw_tcp_gbps`;
//! - small objects, size `4k`/`64k`, `n` requests in flight (1, 16, 64):
//!   `{op}_{size}_ops_{n}`, `{op}_{size}_p50_us_{n}`, `{op}_{size}_p99_us_{n}`,
//!   the same with `http_` in front, `{op}_{size}_ops_{n}_vs_http`; and
//!   `{op}_{size}_p50_us` / `_p99_us` (at 1 in flight); the mean,
//!   `{op}_{size}_mean_us_{n}` (and `http_…`), and the mean time the s3dma
//!   requests spent in each service, from its own latency histogram:
//!   `{op}_{size}_{shim,agent,target}_mean_us_{n}` (each includes the
//!   services below it; `null` when the services' metrics were not read);
//! - the machine's limits, measured in the same run: `memcpy_gbps`,
//!   `md5_gbps` (the store's MD5), `data_dir_write_fsync_gbps` (8 MiB writes
//!   then fsync, in the store's data directory), `store_limit_gbps` (the
//!   lower of MD5 and write+fsync: what a durable PUT can reach),
//!   `put_{size}_vs_store_limit` and `get_{size}_vs_memcpy`;
//! - a store on disk (a second stack, data under `$TMPDIR`): `put_1g_disk_gbps`,
//!   `http_put_1g_disk_gbps`, `put_1g_disk_vs_http`, `disk_write_fsync_gbps`,
//!   `disk_store_limit_gbps` (the lower of it and MD5) and
//!   `put_1g_disk_vs_store_limit`;
//! - tenant processes: `procs_{n}_get_gbps` / `procs_{n}_put_gbps` for n =
//!   1, 2, 4, 8 processes on this host, each with its own lease, buffer and
//!   object (`procs_object_bytes` each), aggregate over the wall time, and
//!   `procs_{n}_get_vs_1` / `procs_{n}_put_vs_1`;
//! - CPU (user + system) per GB moved by the large transfers and per request
//!   of the small ones: `{proc}_cpu_s_per_gb`, `{proc}_cpu_us_per_req` for
//!   `agent`, `shim`, `target` and `client` (this process) on the s3dma
//!   path; `http_target_…` and `http_client_…` on the HTTP path; per small
//!   cell `{op}_{size}_{proc}_cpu_us_per_req_{n}` (`proc` also `host` =
//!   client + shim), `http_{op}_{size}_{client,target}_cpu_us_per_req_{n}`,
//!   `{op}_{size}_host_cpu_vs_http_{n}`;
//! - batched calls (`op` `get`/`put`/`head`, `b` objects per call: 1, 16,
//!   64): `batch_{op}_{size}_ops_{b}` (objects/s), `http_batch_…_ops_{b}`
//!   (HTTP with `b` in flight), `…_ops_{b}_vs_http`, `…_call_p50_us_{b}`,
//!   `http_batch_…_p50_us_{b}`, `batch_{op}_{size}_{proc}_cpu_us_per_obj_{b}`,
//!   `http_batch_…_{client,target}_cpu_us_per_obj_{b}`,
//!   `…_host_cpu_vs_http_{b}`; `batch_get_4k_ops_64`, `batch_put_4k_ops_64`,
//!   `batch_head_1000_ms` (one HeadObjects of 1,000 keys),
//!   `batch_host_cpu_us_per_obj` and `batch_agent_cpu_us_per_obj` (4 KiB
//!   GETs in batches of 64).

use std::fmt::Write as _;

use serde_json::{Map, Value};

use crate::stats::num;
use crate::stats::ratio;

mod table;

/// GET or PUT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Download.
    Get,
    /// Upload.
    Put,
}

impl Op {
    /// `get` / `put` (JSON keys).
    #[must_use]
    pub(crate) fn key(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Put => "put",
        }
    }

    /// `GET` / `PUT` (the table).
    #[must_use]
    pub(crate) fn label(self) -> &'static str {
        match self {
            Op::Get => "GET",
            Op::Put => "PUT",
        }
    }
}

/// An object size and its name in JSON keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Size {
    /// Bytes.
    pub bytes: u64,
    /// `4k`, `64k`, `64m`, `1g`.
    pub key: &'static str,
}

/// `4 KiB`, `64 MiB`, `1 GiB`, `1000 B`.
#[must_use]
pub(crate) fn human_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, n) in UNITS {
        if bytes >= n && bytes.is_multiple_of(n) {
            return format!("{} {unit}", bytes / n);
        }
    }
    format!("{bytes} B")
}

/// One large-object measurement: s3dma and HTTP side by side.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Throughput {
    /// GET or PUT.
    pub op: Op,
    /// The object.
    pub size: Size,
    /// Median GB/s through shim → agent → target → fabric.
    pub s3dma_gbps: Option<f64>,
    /// Median GB/s of aws-sdk-s3 straight to the storage-target.
    pub http_gbps: Option<f64>,
}

/// One side of a small-object cell.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct CellStats {
    /// Completed requests per second.
    pub ops_per_s: Option<f64>,
    /// Median latency, µs.
    pub p50_us: Option<f64>,
    /// 99th percentile latency, µs.
    pub p99_us: Option<f64>,
    /// Requests completed.
    pub requests: u64,
    /// Mean latency, µs.
    pub mean_us: Option<f64>,
}

impl CellStats {
    /// µs of CPU per request of `pick` out of `cpu`.
    #[must_use]
    pub(crate) fn us_per_req(&self, cpu: &CpuSecs, pick: Pick) -> Option<f64> {
        ratio(Some(pick(cpu) * 1e6), Some(self.requests as f64))
    }
}

/// Where a small request's time went: the mean time each service took per
/// request of the same op during a cell, from its own latency histogram
/// (`_sum` / `_count` before and after the cell, warm-up included), µs.
/// Each layer's time includes the layers below it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Layers {
    /// host-shim (`s3dma_shim_request_seconds`).
    pub shim_us: Option<f64>,
    /// dpu-agent (`s3dma_agent_request_seconds`).
    pub agent_us: Option<f64>,
    /// storage-target (`s3dma_storage_target_request_duration_seconds`).
    pub target_us: Option<f64>,
}

/// One small-object cell: an op, a size, a number of requests in flight.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cell {
    /// GET or PUT.
    pub op: Op,
    /// The objects.
    pub size: Size,
    /// Requests in flight.
    pub in_flight: usize,
    /// Through s3dma.
    pub s3dma: CellStats,
    /// aws-sdk-s3 over HTTP.
    pub http: CellStats,
    /// The s3dma requests' time in each service (when its metrics were read).
    pub layers: Layers,
    /// CPU each process used during the cell's measured window.
    pub cpu: CellCpu,
}

/// CPU used during one cell's measured window, each path (utime+stime per
/// process, polling included).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct CellCpu {
    /// During the s3dma side.
    pub s3dma: CpuSecs,
    /// During the HTTP side.
    pub http: CpuSecs,
}

/// A batched operation of the tenant API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchOp {
    /// `GetObjects`.
    Get,
    /// `PutObjects`.
    Put,
    /// `HeadObjects`.
    Head,
}

impl BatchOp {
    /// `get` / `put` / `head` (JSON keys).
    #[must_use]
    pub(crate) fn key(self) -> &'static str {
        match self {
            BatchOp::Get => "get",
            BatchOp::Put => "put",
            BatchOp::Head => "head",
        }
    }

    /// `GET` / `PUT` / `HEAD` (the table).
    #[must_use]
    pub(crate) fn label(self) -> &'static str {
        match self {
            BatchOp::Get => "GET",
            BatchOp::Put => "PUT",
            BatchOp::Head => "HEAD",
        }
    }
}

/// One batched cell: batches of `batch` objects through s3dma (one batched
/// call at a time), beside HTTP with `batch` single requests in flight.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BatchCell {
    /// GET, PUT or HEAD.
    pub op: BatchOp,
    /// The objects.
    pub size: Size,
    /// Objects per batched call (= HTTP requests in flight).
    pub batch: usize,
    /// Objects per second through s3dma.
    pub s3dma_objects_per_s: Option<f64>,
    /// Latency of one batched call, µs (p50).
    pub s3dma_call_p50_us: Option<f64>,
    /// Objects the s3dma side completed in the measured window.
    pub s3dma_objects: u64,
    /// The HTTP side (one object per request).
    pub http: CellStats,
    /// CPU during each side's measured window.
    pub cpu: CellCpu,
}

impl BatchCell {
    /// µs of CPU per object of `pick` on the s3dma side.
    #[must_use]
    pub(crate) fn s3dma_us_per_obj(&self, pick: Pick) -> Option<f64> {
        ratio(
            Some(pick(&self.cpu.s3dma) * 1e6),
            Some(self.s3dma_objects as f64),
        )
    }

    /// µs of CPU per object of `pick` on the HTTP side.
    #[must_use]
    pub(crate) fn http_us_per_obj(&self, pick: Pick) -> Option<f64> {
        ratio(
            Some(pick(&self.cpu.http) * 1e6),
            Some(self.http.requests as f64),
        )
    }
}

/// CPU seconds (user + system) each process used during some phases.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct CpuSecs {
    /// dpu-agent.
    pub agent: f64,
    /// host-shim.
    pub shim: f64,
    /// storage-target.
    pub target: f64,
    /// This process (the client side: s3dma-client or aws-sdk-s3).
    pub client: f64,
}

impl CpuSecs {
    /// Element-wise sum.
    #[must_use]
    pub(crate) fn plus(self, o: CpuSecs) -> CpuSecs {
        CpuSecs {
            agent: self.agent + o.agent,
            shim: self.shim + o.shim,
            target: self.target + o.target,
            client: self.client + o.client,
        }
    }
}

/// CPU used by one path (s3dma or HTTP) over the large and the small
/// phases, with what those phases moved.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct PathCpu {
    /// During the large transfers.
    pub large: CpuSecs,
    /// Bytes the large transfers moved.
    pub large_bytes: u64,
    /// During the small-object cells.
    pub small: CpuSecs,
    /// Requests the small-object cells completed.
    pub small_requests: u64,
}

impl PathCpu {
    /// Seconds per GB (10^9 bytes) for `pick` of the large phases.
    #[must_use]
    pub(crate) fn s_per_gb(&self, pick: Pick) -> Option<f64> {
        ratio(Some(pick(&self.large)), Some(self.large_bytes as f64 / 1e9))
    }

    /// Microseconds per request (= ms per 1000 requests) for `pick` of the
    /// small phases.
    #[must_use]
    pub(crate) fn us_per_req(&self, pick: Pick) -> Option<f64> {
        ratio(
            Some(pick(&self.small) * 1e6),
            Some(self.small_requests as f64),
        )
    }
}

/// Everything one `s3dma-tools bench` run measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Report {
    /// `--quick` sizes and durations.
    pub quick: bool,
    /// Rounds per large measurement.
    pub rounds: usize,
    /// Seconds per small-object cell.
    pub cell_secs: f64,
    /// CPUs of this machine.
    pub cpus: usize,
    /// Where the storage-target kept its data.
    pub data_dir: String,
    /// The fabric of the stack the bench started (empty: an existing stack).
    pub fabric: String,
    /// Whether the services' CPU was measured (not for an attached stack
    /// whose processes could not be told apart).
    pub services_cpu: bool,
    /// The medium and large objects (`64m`, `1g`).
    pub sizes: Vec<Size>,
    /// Raw loopback TCP, GB/s.
    pub raw_tcp_gbps: Option<f64>,
    /// Large objects.
    pub throughput: Vec<Throughput>,
    /// Small objects.
    pub cells: Vec<Cell>,
    /// CPU on the s3dma path.
    pub cpu_s3dma: PathCpu,
    /// CPU on the HTTP path (agent and shim are idle there).
    pub cpu_http: PathCpu,
    /// The machine's limits.
    pub limits: Limits,
    /// Tenant processes on one host.
    pub procs: Vec<ProcsRow>,
    /// Each process's object in the `procs` rows.
    pub procs_object_bytes: u64,
    /// The large PUT to a store on disk (a second stack).
    pub disk: DiskPut,
    /// Batched cells (the batch phase).
    pub batches: Vec<BatchCell>,
    /// One HEAD of 1,000 keys in one batched call, ms (the batch phase).
    pub batch_head_1000_ms: Option<f64>,
}

/// The large PUT to a data directory on disk, GB/s.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct DiskPut {
    /// The object (0: not measured).
    pub object_bytes: u64,
    /// Through s3dma, median of the rounds.
    pub put_gbps: Option<f64>,
    /// aws-sdk-s3 to the same storage-target.
    pub http_put_gbps: Option<f64>,
    /// 8 MiB writes then fsync in that directory.
    pub write_fsync_gbps: Option<f64>,
}

/// The machine's limits, measured in the same run (GB/s).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Limits {
    /// memcpy between two buffers.
    pub memcpy_gbps: Option<f64>,
    /// The store's MD5.
    pub md5_gbps: Option<f64>,
    /// Writes then fsync in the data directory (none for an attached stack).
    pub write_fsync_gbps: Option<f64>,
}

impl Limits {
    /// What a durable PUT can reach: the lower of MD5 and write+fsync.
    #[must_use]
    pub(crate) fn store_gbps(&self) -> Option<f64> {
        match (self.md5_gbps, self.write_fsync_gbps) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Aggregate throughput of N tenant processes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ProcsRow {
    /// Processes.
    pub processes: usize,
    /// GB/s of all GETs over the wall time.
    pub get_gbps: Option<f64>,
    /// GB/s of all PUTs over the wall time.
    pub put_gbps: Option<f64>,
}

/// Picks one process's seconds out of a [`CpuSecs`].
pub(crate) type Pick = fn(&CpuSecs) -> f64;

/// The processes of a cell's CPU keys, and the host's (client + shim).
const CELL_PROCS: [(&str, Pick); 5] = [
    ("client", |c| c.client),
    ("shim", |c| c.shim),
    ("agent", |c| c.agent),
    ("target", |c| c.target),
    ("host", |c| c.client + c.shim),
];

impl Report {
    /// The flat JSON object (see the module documentation for the keys).
    #[must_use]
    pub(crate) fn json(&self) -> Map<String, Value> {
        let mut m = Map::new();
        let mut put = |k: String, v: Option<f64>| {
            m.insert(k, num(v));
        };
        put("quick".into(), Some(if self.quick { 1.0 } else { 0.0 }));
        put("rounds".into(), Some(self.rounds as f64));
        put("cell_secs".into(), Some(self.cell_secs));
        put("cpus".into(), Some(self.cpus as f64));
        for (i, s) in self.sizes.iter().enumerate() {
            let name = if i + 1 == self.sizes.len() {
                "large_object_bytes"
            } else {
                "medium_object_bytes"
            };
            put(name.into(), Some(s.bytes as f64));
        }
        put("raw_tcp_gbps".into(), self.raw_tcp_gbps);
        put("memcpy_gbps".into(), self.limits.memcpy_gbps);
        put("md5_gbps".into(), self.limits.md5_gbps);
        put(
            "data_dir_write_fsync_gbps".into(),
            self.limits.write_fsync_gbps,
        );
        put("store_limit_gbps".into(), self.limits.store_gbps());
        for t in &self.throughput {
            let k = format!("{}_{}", t.op.key(), t.size.key);
            match t.op {
                Op::Put => put(
                    format!("{k}_vs_store_limit"),
                    ratio(t.s3dma_gbps, self.limits.store_gbps()),
                ),
                Op::Get => put(
                    format!("{k}_vs_memcpy"),
                    ratio(t.s3dma_gbps, self.limits.memcpy_gbps),
                ),
            }
        }
        if self.disk.object_bytes > 0 {
            let disk_limit = match (self.limits.md5_gbps, self.disk.write_fsync_gbps) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            put("disk_write_fsync_gbps".into(), self.disk.write_fsync_gbps);
            put("disk_store_limit_gbps".into(), disk_limit);
            put("put_1g_disk_gbps".into(), self.disk.put_gbps);
            put("http_put_1g_disk_gbps".into(), self.disk.http_put_gbps);
            put(
                "put_1g_disk_vs_http".into(),
                ratio(self.disk.put_gbps, self.disk.http_put_gbps),
            );
            put(
                "put_1g_disk_vs_store_limit".into(),
                ratio(self.disk.put_gbps, disk_limit),
            );
        }
        if !self.procs.is_empty() {
            put(
                "procs_object_bytes".into(),
                Some(self.procs_object_bytes as f64),
            );
        }
        let one = self.procs.iter().find(|r| r.processes == 1).copied();
        for r in &self.procs {
            let n = r.processes;
            put(format!("procs_{n}_get_gbps"), r.get_gbps);
            put(format!("procs_{n}_put_gbps"), r.put_gbps);
            put(
                format!("procs_{n}_get_vs_1"),
                ratio(r.get_gbps, one.and_then(|o| o.get_gbps)),
            );
            put(
                format!("procs_{n}_put_vs_1"),
                ratio(r.put_gbps, one.and_then(|o| o.put_gbps)),
            );
        }
        for t in &self.throughput {
            let k = format!("{}_{}", t.op.key(), t.size.key);
            put(format!("{k}_gbps"), t.s3dma_gbps);
            put(format!("http_{k}_gbps"), t.http_gbps);
            put(format!("{k}_vs_http"), ratio(t.s3dma_gbps, t.http_gbps));
            put(
                format!("{k}_vs_raw_tcp"),
                ratio(t.s3dma_gbps, self.raw_tcp_gbps),
            );
            put(
                format!("http_{k}_vs_raw_tcp"),
                ratio(t.http_gbps, self.raw_tcp_gbps),
            );
        }
        for c in &self.cells {
            let k = format!("{}_{}", c.op.key(), c.size.key);
            let n = c.in_flight;
            for (prefix, s) in [("", &c.s3dma), ("http_", &c.http)] {
                put(format!("{prefix}{k}_ops_{n}"), s.ops_per_s);
                put(format!("{prefix}{k}_p50_us_{n}"), s.p50_us);
                put(format!("{prefix}{k}_p99_us_{n}"), s.p99_us);
                if n == 1 {
                    put(format!("{prefix}{k}_p50_us"), s.p50_us);
                    put(format!("{prefix}{k}_p99_us"), s.p99_us);
                }
            }
            put(
                format!("{k}_ops_{n}_vs_http"),
                ratio(c.s3dma.ops_per_s, c.http.ops_per_s),
            );
            put(format!("{k}_mean_us_{n}"), c.s3dma.mean_us);
            put(format!("http_{k}_mean_us_{n}"), c.http.mean_us);
            put(format!("{k}_shim_mean_us_{n}"), c.layers.shim_us);
            put(format!("{k}_agent_mean_us_{n}"), c.layers.agent_us);
            put(format!("{k}_target_mean_us_{n}"), c.layers.target_us);
            for (name, pick) in CELL_PROCS {
                let known = self.services_cpu || name == "client";
                put(
                    format!("{k}_{name}_cpu_us_per_req_{n}"),
                    c.s3dma.us_per_req(&c.cpu.s3dma, pick).filter(|_| known),
                );
            }
            for (name, pick) in [CELL_PROCS[0], CELL_PROCS[3]] {
                let known = self.services_cpu || name == "client";
                put(
                    format!("http_{k}_{name}_cpu_us_per_req_{n}"),
                    c.http.us_per_req(&c.cpu.http, pick).filter(|_| known),
                );
            }
            put(
                format!("{k}_host_cpu_vs_http_{n}"),
                ratio(
                    c.s3dma
                        .us_per_req(&c.cpu.s3dma, CELL_PROCS[4].1)
                        .filter(|_| self.services_cpu),
                    c.http.us_per_req(&c.cpu.http, CELL_PROCS[0].1),
                ),
            );
        }
        self.batch_json(&mut put);
        let procs: [(&str, Pick); 4] = [
            ("agent", |c| c.agent),
            ("shim", |c| c.shim),
            ("target", |c| c.target),
            ("client", |c| c.client),
        ];
        let known = |name: &str| self.services_cpu || name == "client";
        for (name, pick) in procs {
            let k = known(name);
            put(
                format!("{name}_cpu_s_per_gb"),
                self.cpu_s3dma.s_per_gb(pick).filter(|_| k),
            );
            put(
                format!("{name}_cpu_us_per_req"),
                self.cpu_s3dma.us_per_req(pick).filter(|_| k),
            );
        }
        for (name, pick) in &procs[2..] {
            let k = known(name);
            put(
                format!("http_{name}_cpu_s_per_gb"),
                self.cpu_http.s_per_gb(*pick).filter(|_| k),
            );
            put(
                format!("http_{name}_cpu_us_per_req"),
                self.cpu_http.us_per_req(*pick).filter(|_| k),
            );
        }
        m
    }

    /// The batch phase's keys (see the module documentation).
    fn batch_json(&self, put: &mut impl FnMut(String, Option<f64>)) {
        for c in &self.batches {
            let k = format!("batch_{}_{}", c.op.key(), c.size.key);
            let b = c.batch;
            put(format!("{k}_ops_{b}"), c.s3dma_objects_per_s);
            put(format!("http_{k}_ops_{b}"), c.http.ops_per_s);
            put(
                format!("{k}_ops_{b}_vs_http"),
                ratio(c.s3dma_objects_per_s, c.http.ops_per_s),
            );
            put(format!("{k}_call_p50_us_{b}"), c.s3dma_call_p50_us);
            put(format!("http_{k}_p50_us_{b}"), c.http.p50_us);
            for (name, pick) in CELL_PROCS {
                let known = self.services_cpu || name == "client";
                put(
                    format!("{k}_{name}_cpu_us_per_obj_{b}"),
                    c.s3dma_us_per_obj(pick).filter(|_| known),
                );
            }
            for (name, pick) in [CELL_PROCS[0], CELL_PROCS[3]] {
                let known = self.services_cpu || name == "client";
                put(
                    format!("http_{k}_{name}_cpu_us_per_obj_{b}"),
                    c.http_us_per_obj(pick).filter(|_| known),
                );
            }
            put(
                format!("{k}_host_cpu_vs_http_{b}"),
                ratio(
                    c.s3dma_us_per_obj(CELL_PROCS[4].1)
                        .filter(|_| self.services_cpu),
                    c.http_us_per_obj(CELL_PROCS[0].1),
                ),
            );
        }
        if self.batches.is_empty() && self.batch_head_1000_ms.is_none() {
            return;
        }
        let get64 = self
            .batches
            .iter()
            .find(|c| c.op == BatchOp::Get && c.size.key == "4k" && c.batch == 64);
        let of = |pick: Pick| {
            get64
                .and_then(|c| c.s3dma_us_per_obj(pick))
                .filter(|_| self.services_cpu)
        };
        // The headline keys (null when their cell did not run).
        for (op, name) in [
            (BatchOp::Get, "batch_get_4k_ops_64"),
            (BatchOp::Put, "batch_put_4k_ops_64"),
        ] {
            let v = self
                .batches
                .iter()
                .find(|c| c.op == op && c.size.key == "4k" && c.batch == 64)
                .and_then(|c| c.s3dma_objects_per_s);
            put(name.into(), v);
        }
        put("batch_head_1000_ms".into(), self.batch_head_1000_ms);
        put("batch_host_cpu_us_per_obj".into(), of(CELL_PROCS[4].1));
        put("batch_agent_cpu_us_per_obj".into(), of(CELL_PROCS[2].1));
    }
}

/// A number with about three significant digits; `-` when missing.
#[must_use]
pub(crate) fn fmt_num(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => {
            let a = v.abs();
            if a >= 100.0 || a == 0.0 {
                format!("{v:.0}")
            } else if a >= 10.0 {
                format!("{v:.1}")
            } else if a >= 1.0 {
                format!("{v:.2}")
            } else {
                format!("{v:.3}")
            }
        }
        _ => "-".into(),
    }
}

/// `1.85x`; `-` when missing.
#[must_use]
pub(crate) fn fmt_ratio(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.2}x"),
        _ => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K4: Size = Size {
        bytes: 4096,
        key: "4k",
    };
    const M64: Size = Size {
        bytes: 64 << 20,
        key: "64m",
    };
    const G1: Size = Size {
        bytes: 1 << 30,
        key: "1g",
    };

    fn report() -> Report {
        let stats = |ops: f64, p50: f64| CellStats {
            ops_per_s: Some(ops),
            p50_us: Some(p50),
            p99_us: Some(p50 * 3.0),
            requests: 1000,
            mean_us: Some(p50 + 40.0),
        };
        Report {
            quick: false,
            rounds: 5,
            cell_secs: 5.0,
            cpus: 2,
            data_dir: "/dev/shm/x".into(),
            fabric: "tcp".into(),
            services_cpu: true,
            sizes: vec![M64, G1],
            raw_tcp_gbps: Some(4.0),
            throughput: vec![
                Throughput {
                    op: Op::Get,
                    size: M64,
                    s3dma_gbps: Some(2.0),
                    http_gbps: Some(1.0),
                },
                Throughput {
                    op: Op::Get,
                    size: G1,
                    s3dma_gbps: Some(3.0),
                    http_gbps: Some(1.5),
                },
                Throughput {
                    op: Op::Put,
                    size: G1,
                    s3dma_gbps: Some(1.0),
                    http_gbps: None,
                },
            ],
            cells: vec![
                Cell {
                    op: Op::Get,
                    size: K4,
                    in_flight: 1,
                    s3dma: stats(2000.0, 400.0),
                    http: stats(1000.0, 800.0),
                    layers: Layers {
                        shim_us: Some(300.0),
                        agent_us: Some(200.0),
                        target_us: Some(150.0),
                    },
                    cpu: CellCpu::default(),
                },
                Cell {
                    op: Op::Get,
                    size: K4,
                    in_flight: 64,
                    s3dma: stats(9000.0, 6000.0),
                    http: stats(3000.0, 20000.0),
                    layers: Layers::default(),
                    cpu: CellCpu {
                        s3dma: CpuSecs {
                            agent: 0.02,
                            shim: 0.01,
                            target: 0.05,
                            client: 0.005,
                        },
                        http: CpuSecs {
                            agent: 0.0,
                            shim: 0.0,
                            target: 0.05,
                            client: 0.05,
                        },
                    },
                },
            ],
            cpu_s3dma: PathCpu {
                large: CpuSecs {
                    agent: 0.5,
                    shim: 0.1,
                    target: 2.0,
                    client: 0.0,
                },
                large_bytes: 10_000_000_000,
                small: CpuSecs {
                    agent: 1.0,
                    shim: 0.5,
                    target: 1.0,
                    client: 0.25,
                },
                small_requests: 10_000,
            },
            cpu_http: PathCpu::default(),
            limits: Limits {
                memcpy_gbps: Some(12.0),
                md5_gbps: Some(0.8),
                write_fsync_gbps: Some(2.0),
            },
            procs: vec![
                ProcsRow {
                    processes: 1,
                    get_gbps: Some(2.0),
                    put_gbps: Some(0.5),
                },
                ProcsRow {
                    processes: 8,
                    get_gbps: Some(1.8),
                    put_gbps: None,
                },
            ],
            procs_object_bytes: 256 << 20,
            disk: DiskPut::default(),
            batches: Vec::new(),
            batch_head_1000_ms: None,
        }
    }

    #[test]
    fn cell_and_batch_cpu_keys() {
        let mut r = report();
        // 1000 requests per side in the x64 cell.
        let j = r.json();
        let f = |j: &Map<String, Value>, k: &str| {
            j.get(k)
                .and_then(Value::as_f64)
                .map(|v| (v * 1e6).round() / 1e6)
        };
        assert_eq!(f(&j, "get_4k_agent_cpu_us_per_req_64"), Some(20.0));
        assert_eq!(f(&j, "get_4k_host_cpu_us_per_req_64"), Some(15.0));
        assert_eq!(f(&j, "http_get_4k_client_cpu_us_per_req_64"), Some(50.0));
        assert_eq!(f(&j, "get_4k_host_cpu_vs_http_64"), Some(0.3));
        // No batch phase: no batch keys.
        assert!(j.get("batch_get_4k_ops_64").is_none());
        r.batches.push(BatchCell {
            op: BatchOp::Get,
            size: K4,
            batch: 64,
            s3dma_objects_per_s: Some(30000.0),
            s3dma_call_p50_us: Some(2000.0),
            s3dma_objects: 64_000,
            http: CellStats {
                ops_per_s: Some(5000.0),
                p50_us: Some(9000.0),
                p99_us: Some(20000.0),
                requests: 10_000,
                mean_us: Some(9500.0),
            },
            cpu: CellCpu {
                s3dma: CpuSecs {
                    agent: 0.64,
                    shim: 0.32,
                    target: 1.28,
                    client: 0.064,
                },
                http: CpuSecs {
                    agent: 0.0,
                    shim: 0.0,
                    target: 1.5,
                    client: 1.2,
                },
            },
        });
        r.batch_head_1000_ms = Some(4.5);
        let j = r.json();
        assert_eq!(f(&j, "batch_get_4k_ops_64"), Some(30000.0));
        assert_eq!(f(&j, "batch_get_4k_ops_64_vs_http"), Some(6.0));
        assert_eq!(f(&j, "batch_agent_cpu_us_per_obj"), Some(10.0));
        assert_eq!(f(&j, "batch_host_cpu_us_per_obj"), Some(6.0));
        assert_eq!(
            f(&j, "http_batch_get_4k_client_cpu_us_per_obj_64"),
            Some(120.0)
        );
        assert_eq!(f(&j, "batch_get_4k_host_cpu_vs_http_64"), Some(0.05));
        assert_eq!(f(&j, "batch_head_1000_ms"), Some(4.5));
        // A cell that did not run is null, not missing.
        assert_eq!(j.get("batch_put_4k_ops_64"), Some(&Value::Null));
        let t = r.table();
        assert!(t.contains("Batched calls"), "{t}");
        assert!(
            t.contains("HEAD of 1,000 keys in one batched call: 4.50 ms"),
            "{t}"
        );
        r.services_cpu = false;
        let j = r.json();
        assert_eq!(j.get("batch_agent_cpu_us_per_obj"), Some(&Value::Null));
        assert_eq!(j.get("get_4k_agent_cpu_us_per_req_64"), Some(&Value::Null));
        assert_eq!(f(&j, "batch_get_4k_client_cpu_us_per_obj_64"), Some(1.0));
    }

    #[test]
    fn limits_and_processes_in_json() {
        let j = report().json();
        let f = |k: &str| j.get(k).and_then(Value::as_f64);
        assert_eq!(
            f("store_limit_gbps"),
            Some(0.8),
            "the lower of MD5 and fsync"
        );
        assert_eq!(f("put_1g_vs_store_limit"), Some(1.25));
        assert_eq!(f("get_1g_vs_memcpy"), Some(0.25));
        assert_eq!(f("procs_8_get_vs_1"), Some(0.9));
        assert_eq!(f("procs_1_put_vs_1"), Some(1.0));
        assert_eq!(j.get("procs_8_put_vs_1"), Some(&Value::Null));
        assert_eq!(f("procs_object_bytes"), Some(f64::from(256u32 << 20)));
        let t = report().table();
        assert!(t.contains("Tenant processes on this host"), "{t}");
        // The layers: client 440, shim 300, agent 200, target 150 µs, so
        // the hops add 140, 100 and 50.
        let row = t
            .lines()
            .find(|l| l.contains("Where an s3dma request's time goes"))
            .and_then(|_| t.lines().find(|l| l.contains("|") && l.contains(" 440 ")))
            .unwrap_or_else(|| panic!("no layers row:\n{t}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        for want in ["300", "200", "150", "140", "100", "50.0"] {
            assert!(cols.contains(&want), "{want} in {row}");
        }
        assert!(t.contains("of the store limit"), "{t}");
    }

    #[test]
    fn json_keys_and_values() {
        let j = report().json();
        let f = |k: &str| j.get(k).and_then(Value::as_f64);
        assert_eq!(f("get_1g_gbps"), Some(3.0));
        assert_eq!(f("http_get_1g_gbps"), Some(1.5));
        assert_eq!(f("get_1g_vs_http"), Some(2.0));
        assert_eq!(f("get_1g_vs_raw_tcp"), Some(0.75));
        assert_eq!(f("get_64m_gbps"), Some(2.0));
        assert_eq!(f("raw_tcp_gbps"), Some(4.0));
        assert_eq!(f("large_object_bytes"), Some(1073741824.0));
        assert_eq!(f("medium_object_bytes"), Some(67108864.0));
        assert_eq!(f("get_4k_p50_us"), Some(400.0));
        assert_eq!(f("get_4k_p99_us"), Some(1200.0));
        assert_eq!(f("http_get_4k_p50_us"), Some(800.0));
        assert_eq!(f("get_4k_ops_64"), Some(9000.0));
        assert_eq!(f("http_get_4k_ops_64"), Some(3000.0));
        assert_eq!(f("get_4k_ops_64_vs_http"), Some(3.0));
        assert_eq!(f("get_4k_p50_us_64"), Some(6000.0));
        assert_eq!(f("get_4k_mean_us_1"), Some(440.0));
        assert_eq!(f("get_4k_shim_mean_us_1"), Some(300.0));
        assert_eq!(f("get_4k_agent_mean_us_1"), Some(200.0));
        assert_eq!(f("get_4k_target_mean_us_1"), Some(150.0));
        assert_eq!(j.get("get_4k_shim_mean_us_64"), Some(&Value::Null));
        assert_eq!(f("agent_cpu_us_per_req"), Some(100.0));
        assert_eq!(f("shim_cpu_us_per_req"), Some(50.0));
        assert_eq!(f("client_cpu_us_per_req"), Some(25.0));
        assert_eq!(f("agent_cpu_s_per_gb"), Some(0.05));
        assert_eq!(f("target_cpu_s_per_gb"), Some(0.2));
        // Missing measurements are null, never NaN or a made-up number.
        assert_eq!(j.get("http_put_1g_gbps"), Some(&Value::Null));
        assert_eq!(j.get("put_1g_vs_http"), Some(&Value::Null));
        assert_eq!(j.get("http_target_cpu_s_per_gb"), Some(&Value::Null));
        // Flat: every value a number or null.
        assert!(j.values().all(|v| v.is_number() || v.is_null()));
        // And it serialises.
        let text = serde_json::to_string(&j).unwrap();
        assert!(text.starts_with('{'));
    }

    #[test]
    fn unknown_service_cpu_is_null() {
        let mut r = report();
        r.services_cpu = false;
        let j = r.json();
        assert_eq!(j.get("agent_cpu_us_per_req"), Some(&Value::Null));
        assert_eq!(j.get("http_target_cpu_us_per_req"), Some(&Value::Null));
        assert_eq!(
            j.get("client_cpu_us_per_req").and_then(Value::as_f64),
            Some(25.0)
        );
        assert!(r.table().contains("dpu-agent            (not measured"));
    }

    #[test]
    fn table_has_the_headline_first() {
        let t = report().table();
        let headline = t.find("Headline").unwrap();
        assert!(headline < t.find("Large objects").unwrap());
        assert!(t.contains("GET 1 GiB"), "{t}");
        assert!(t.contains("2.00x"), "{t}");
        assert!(t.contains("0.75x"), "{t}");
        assert!(t.contains("GET 4 KiB ops/s @64"), "{t}");
        assert!(t.contains("3.00x"), "{t}");
        assert!(
            t.contains("raw loopback TCP (one stream, tokio): 4.00 GB/s"),
            "{t}"
        );
        assert!(t.contains("dpu-agent"), "{t}");
        // No NaN or inf anywhere.
        assert!(!t.contains("NaN") && !t.contains("inf"), "{t}");
    }

    #[test]
    fn formatting() {
        assert_eq!(human_size(4096), "4 KiB");
        assert_eq!(human_size(64 << 20), "64 MiB");
        assert_eq!(human_size(1 << 30), "1 GiB");
        assert_eq!(human_size(1000), "1000 B");
        assert_eq!(human_size(0), "0 B");
        assert_eq!(fmt_num(Some(1234.5)), "1234");
        assert_eq!(fmt_num(Some(12.345)), "12.3");
        assert_eq!(fmt_num(Some(1.2345)), "1.23");
        assert_eq!(fmt_num(Some(0.12345)), "0.123");
        assert_eq!(fmt_num(Some(f64::NAN)), "-");
        assert_eq!(fmt_num(None), "-");
        assert_eq!(fmt_ratio(Some(1.5)), "1.50x");
        assert_eq!(fmt_ratio(Some(f64::INFINITY)), "-");
    }
}
