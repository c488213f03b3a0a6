//! `s3dma-tools soak`'s rules (pure): the operation mix, object sizes, ranges,
//! the interval between samples, Prometheus text, and the verdict.
//!
//! The verdict fails on
//!
//! - any data mismatch or unexpected error the workers report;
//! - a service that died;
//! - memory growth: for each service, the median over the samples of the
//!   last quarter of the run of its private RSS (`VmRSS - RssShmem`: the
//!   host-shim maps tenant buffers, shared memory the tenants own, and
//!   `VmRSS` counts their pages as bytes first land in them) above
//!   [`RSS_GROWTH_FACTOR`] × the largest value of the first quarter +
//!   [`rss_slack_kib`] (64 MiB + one largest object per client: a service
//!   may legitimately buffer that much more at a busier moment, and a short
//!   run's first quarter is partly warm-up);
//! - file-descriptor growth: the last quarter's median above the first
//!   quarter's largest value + [`fd_slack`] (connections and open files
//!   come and go with the load, a leak only grows);
//! - gauges that must be back to 0 once the load has stopped and the
//!   clients are gone ([`END_GAUGES`]): windows open in the shim, requests
//!   in flight or queued and staging buffers in use in the agent and the
//!   target, and buffers and leases in the shim.

use std::fmt::Write as _;
use std::time::Duration;

/// What a worker does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum SoakOp {
    /// GetObject of the whole object.
    Get,
    /// GetObject of a random range.
    GetRange,
    /// PutObject of new random bytes.
    Put,
    /// HeadObject.
    Head,
    /// ListObjectsV2 of the worker's prefix.
    List,
    /// DeleteObject.
    Delete,
}

impl SoakOp {
    /// Every operation, in report order.
    pub(crate) const ALL: [SoakOp; 6] = [
        SoakOp::Get,
        SoakOp::GetRange,
        SoakOp::Put,
        SoakOp::Head,
        SoakOp::List,
        SoakOp::Delete,
    ];

    /// Short name for reports.
    #[must_use]
    pub(crate) fn name(self) -> &'static str {
        match self {
            SoakOp::Get => "get",
            SoakOp::GetRange => "range",
            SoakOp::Put => "put",
            SoakOp::Head => "head",
            SoakOp::List => "list",
            SoakOp::Delete => "delete",
        }
    }

    /// Position in [`SoakOp::ALL`].
    #[must_use]
    pub(crate) fn index(self) -> usize {
        match self {
            SoakOp::Get => 0,
            SoakOp::GetRange => 1,
            SoakOp::Put => 2,
            SoakOp::Head => 3,
            SoakOp::List => 4,
            SoakOp::Delete => 5,
        }
    }
}

/// The mix, from a roll in `0..100`: 30 % GET, 10 % ranged GET, 30 % PUT,
/// 15 % HEAD, 5 % LIST, 10 % DELETE.
#[must_use]
pub(crate) fn pick_op(roll: u32) -> SoakOp {
    match roll % 100 {
        0..30 => SoakOp::Get,
        30..40 => SoakOp::GetRange,
        40..70 => SoakOp::Put,
        70..85 => SoakOp::Head,
        85..90 => SoakOp::List,
        _ => SoakOp::Delete,
    }
}

/// Object sizes and their weights: empty and tiny objects, small ones,
/// one chunk, several chunks of the agent's 8 MiB (with an odd tail).
pub(crate) const SIZES: [(usize, u32); 8] = [
    (0, 2),
    (1, 2),
    (1000, 3),
    (4 << 10, 6),
    (64 << 10, 6),
    ((1 << 20) + 7, 4),
    ((8 << 20) + 1, 2),
    (16 << 20, 1),
];

/// Largest size in [`SIZES`].
pub(crate) const MAX_SIZE: usize = 16 << 20;

/// Size worker 0 writes now and then: above the agent's 64 MiB multipart
/// threshold, so multipart uploads are part of the mix.
pub(crate) const MULTIPART_SIZE: usize = (72 << 20) + 3;

/// The size for a roll (any `u32`; taken modulo the weights' sum).
#[must_use]
pub(crate) fn pick_size(roll: u32) -> usize {
    let total: u32 = SIZES.iter().map(|s| s.1).sum();
    let mut r = roll % total.max(1);
    for (size, w) in SIZES {
        if r < w {
            return size;
        }
        r -= w;
    }
    0
}

/// A range `first..=last` within an object of `len > 0` bytes, from two
/// rolls; `None` for an empty object.
#[must_use]
pub(crate) fn pick_range(len: u64, a: u64, b: u64) -> Option<(u64, u64)> {
    if len == 0 {
        return None;
    }
    let first = a % len;
    let last = first + b % (len - first);
    Some((first, last))
}

/// Seconds between samples: about 40 samples per run, 1 s to 60 s.
#[must_use]
pub(crate) fn sample_interval(duration: Duration) -> Duration {
    (duration / 40).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// Factor of allowed private-RSS growth from the first to the last quarter.
pub(crate) const RSS_GROWTH_FACTOR: f64 = 1.5;
/// Absolute allowance on top of the factor, KiB: 64 MiB + [`MAX_SIZE`] per
/// client.
#[must_use]
pub(crate) fn rss_slack_kib(clients: usize) -> u64 {
    (64 << 10) + clients as u64 * (MAX_SIZE as u64 >> 10)
}

/// Allowed growth in open fds: 2 per client (each client's lease and gRPC
/// connections may land on a busier moment) + 32.
#[must_use]
pub(crate) fn fd_slack(clients: usize) -> u64 {
    2 * clients as u64 + 32
}

/// Gauges that must read 0 at the end: `(service, metric)`; each metric's
/// series are summed.
pub(crate) const END_GAUGES: [(&str, &str); 7] = [
    ("host-shim", "s3dma_shim_windows_open"),
    ("host-shim", "s3dma_shim_buffers"),
    ("host-shim", "s3dma_shim_leases"),
    ("dpu-agent", "s3dma_agent_requests_in_flight"),
    ("dpu-agent", "s3dma_agent_requests_queued"),
    ("dpu-agent", "s3dma_agent_staging_buffers_in_use"),
    (
        "storage-target",
        "s3dma_storage_target_rdma_staging_buffers_in_use",
    ),
];

/// The sum of every series of `metric` in Prometheus text; `None` when it
/// has none.
#[must_use]
pub(crate) fn metric_sum(text: &str, metric: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        let value = if let Some(labels) = rest.strip_prefix('{') {
            match labels.rfind('}') {
                Some(end) => &labels[end + 1..],
                None => continue,
            }
        } else if rest.starts_with(' ') {
            rest
        } else {
            continue; // another metric with this one's name as a prefix
        };
        let Some(v) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        *found.get_or_insert(0.0) += v;
    }
    found
}

/// One process at one sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ProcSample {
    /// `VmRSS`, KiB.
    pub rss_kib: u64,
    /// `RssShmem`, KiB.
    pub shmem_kib: u64,
    /// Entries of `/proc/PID/fd`.
    pub fds: u64,
}

impl ProcSample {
    /// `VmRSS - RssShmem`, KiB.
    #[must_use]
    pub(crate) fn private_kib(&self) -> u64 {
        self.rss_kib.saturating_sub(self.shmem_kib)
    }
}

/// All processes at one moment.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    /// Since the load started.
    pub at: Duration,
    /// Requests completed so far.
    pub ops: u64,
    /// One per service, in the order of the names given to [`verdict`].
    pub procs: Vec<ProcSample>,
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// One line for a sample: time, ops, and each service's RSS, shared part
/// and fds.
#[must_use]
pub(crate) fn sample_line(s: &Sample, names: &[&str]) -> String {
    let mut o = format!("soak sample t={}s ops={}", s.at.as_secs(), s.ops);
    for (name, p) in names.iter().zip(&s.procs) {
        let _ = write!(
            o,
            " | {name} rss={} shm={} fds={}",
            mib(p.rss_kib),
            mib(p.shmem_kib),
            p.fds
        );
    }
    o
}

fn median_u64(v: &mut [u64]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(v[v.len() / 2])
}

/// One service's figures compared by the verdict: private RSS (KiB) and
/// fds, the first quarter's largest and the last quarter's median.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Growth {
    /// Private RSS, first quarter, largest.
    pub rss_first_kib: u64,
    /// Private RSS, last quarter, median.
    pub rss_last_kib: u64,
    /// Open fds, first quarter, largest.
    pub fds_first: u64,
    /// Open fds, last quarter, median.
    pub fds_last: u64,
}

/// [`Growth`] of each service (in the order of the samples' processes)
/// between the first and the last quarter of `duration`. With too few
/// samples for quarters, the first and the last sample stand in; `None`
/// without samples.
#[must_use]
pub(crate) fn growth(
    samples: &[Sample],
    services: usize,
    duration: Duration,
) -> Option<Vec<Growth>> {
    let (first_s, last_s) = (samples.first()?, samples.last()?);
    let q1: Vec<&Sample> = samples.iter().filter(|s| s.at <= duration / 4).collect();
    let q4: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at >= duration * 3 / 4)
        .collect();
    let q1 = if q1.is_empty() { vec![first_s] } else { q1 };
    let q4 = if q4.is_empty() { vec![last_s] } else { q4 };
    let out = (0..services)
        .map(|i| {
            let first = |f: fn(&ProcSample) -> u64| {
                q1.iter()
                    .filter_map(|s| s.procs.get(i).map(f))
                    .max()
                    .unwrap_or(0)
            };
            let last = |f: fn(&ProcSample) -> u64| {
                let mut v: Vec<u64> = q4.iter().filter_map(|s| s.procs.get(i).map(f)).collect();
                median_u64(&mut v).unwrap_or(0)
            };
            Growth {
                rss_first_kib: first(ProcSample::private_kib),
                rss_last_kib: last(ProcSample::private_kib),
                fds_first: first(|p| p.fds),
                fds_last: last(|p| p.fds),
            }
        })
        .collect();
    Some(out)
}

/// `name rss A→B MiB fds C→D` for each service, for the closing line.
#[must_use]
pub(crate) fn growth_summary(growth: &[Growth], names: &[&str]) -> String {
    names
        .iter()
        .zip(growth)
        .map(|(name, g)| {
            format!(
                "{name} rss {:.1}->{:.1} MiB fds {}->{}",
                g.rss_first_kib as f64 / 1024.0,
                g.rss_last_kib as f64 / 1024.0,
                g.fds_first,
                g.fds_last
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Growth problems between the first and the last quarter of `duration`
/// (see [`growth`]).
#[must_use]
pub(crate) fn growth_problems(
    samples: &[Sample],
    names: &[&str],
    duration: Duration,
    clients: usize,
) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(growth) = growth(samples, names.len(), duration) else {
        return problems;
    };
    for (name, g) in names.iter().zip(growth) {
        let (r1, r4) = (g.rss_first_kib, g.rss_last_kib);
        let rss_slack = rss_slack_kib(clients);
        let rss_bound = r1 as f64 * RSS_GROWTH_FACTOR + rss_slack as f64;
        if r4 as f64 > rss_bound {
            problems.push(format!(
                "{name} RSS grew from {} (first quarter, largest) to {} (last quarter, median), \
                 more than {RSS_GROWTH_FACTOR}x + {}",
                mib(r1),
                mib(r4),
                mib(rss_slack)
            ));
        }
        let (f1, f4) = (g.fds_first, g.fds_last);
        let slack = fd_slack(clients);
        if f4 > f1 + slack {
            problems.push(format!(
                "{name} open fds grew from {f1} (first quarter, largest) to {f4} \
                 (last quarter, median), more than +{slack}"
            ));
        }
    }
    problems
}

/// Counts of what the workers did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Completed operations by [`SoakOp::index`].
    pub ops: [u64; 6],
    /// Object bytes moved (both directions).
    pub bytes: u64,
    /// Data mismatches and unexpected errors.
    pub failures: u64,
}

/// The one closing line: `soak: PASS ...` or `soak: FAIL <reasons>`, and
/// whether it passed.
#[must_use]
pub(crate) fn verdict(
    totals: &Totals,
    elapsed: Duration,
    problems: &[String],
    summary: &str,
) -> (bool, String) {
    let total: u64 = totals.ops.iter().sum();
    let ops: Vec<String> = SoakOp::ALL
        .iter()
        .map(|op| format!("{}={}", op.name(), totals.ops[op.index()]))
        .collect();
    let mut stats = format!(
        "{total} ops in {}s ({}), {:.1} GiB moved",
        elapsed.as_secs(),
        ops.join(" "),
        totals.bytes as f64 / (1u64 << 30) as f64,
    );
    if !summary.is_empty() {
        let _ = write!(stats, "; {summary}");
    }
    let mut reasons: Vec<String> = Vec::new();
    if totals.failures > 0 {
        reasons.push(format!(
            "{} data mismatches or unexpected errors",
            totals.failures
        ));
    }
    if total == 0 {
        reasons.push("no operation completed".into());
    }
    // One line, whatever the reasons hold (a log's tail has newlines).
    reasons.extend(
        problems
            .iter()
            .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" ")),
    );
    if reasons.is_empty() {
        (true, format!("soak: PASS {stats}"))
    } else {
        (false, format!("soak: FAIL {}; {stats}", reasons.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix() {
        let mut counts = [0u32; 6];
        for roll in 0..100 {
            counts[pick_op(roll).index()] += 1;
        }
        assert_eq!(counts, [30, 10, 30, 15, 5, 10]);
        assert_eq!(pick_op(u32::MAX), pick_op(u32::MAX % 100));
        for (i, op) in SoakOp::ALL.iter().enumerate() {
            assert_eq!(op.index(), i);
        }
    }

    #[test]
    fn sizes_follow_the_weights() {
        let total: u32 = SIZES.iter().map(|s| s.1).sum();
        let mut seen = std::collections::HashMap::new();
        for roll in 0..total {
            *seen.entry(pick_size(roll)).or_insert(0u32) += 1;
        }
        for (size, w) in SIZES {
            assert_eq!(seen[&size], w, "{size}");
            assert!(size <= MAX_SIZE);
        }
        assert_eq!(pick_size(u32::MAX), pick_size(u32::MAX % total));
        const { assert!(MULTIPART_SIZE > 64 << 20) };
    }

    #[test]
    fn ranges_stay_inside() {
        assert_eq!(pick_range(0, 5, 5), None);
        assert_eq!(pick_range(1, 99, 99), Some((0, 0)));
        for (a, b) in [(0, 0), (u64::MAX, u64::MAX), (7, 3), (1000, 1)] {
            let (f, l) = pick_range(10, a, b).unwrap();
            assert!(f <= l && l < 10, "{a} {b}: {f}-{l}");
        }
    }

    #[test]
    fn slack_grows_with_clients() {
        assert_eq!(rss_slack_kib(0), 64 << 10);
        assert_eq!(rss_slack_kib(32), (64 + 32 * 16) << 10);
        assert_eq!(fd_slack(32), 96);
    }

    #[test]
    fn intervals() {
        assert_eq!(
            sample_interval(Duration::from_secs(20)),
            Duration::from_secs(1)
        );
        assert_eq!(
            sample_interval(Duration::from_secs(1800)),
            Duration::from_secs(45)
        );
        assert_eq!(
            sample_interval(Duration::from_secs(86400)),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn prometheus_text() {
        let text = "# HELP s3dma_shim_windows_open Windows\n\
                    # TYPE s3dma_shim_windows_open gauge\n\
                    s3dma_shim_windows_open 3\n\
                    s3dma_shim_windows_open_total 100\n\
                    s3dma_agent_requests_in_flight{tenant=\"a\"} 1\n\
                    s3dma_agent_requests_in_flight{tenant=\"b }\"} 2\n\
                    s3dma_agent_requests_in_flight{broken 7\n\
                    s3dma_shim_buffers{tenant=\"local\"} nonsense\n";
        assert_eq!(metric_sum(text, "s3dma_shim_windows_open"), Some(3.0));
        assert_eq!(
            metric_sum(text, "s3dma_agent_requests_in_flight"),
            Some(3.0)
        );
        assert_eq!(metric_sum(text, "s3dma_shim_buffers"), None);
        assert_eq!(metric_sum(text, "absent"), None);
        assert_eq!(metric_sum("", "x"), None);
    }

    fn sample(at: u64, rss_mib: u64, fds: u64) -> Sample {
        Sample {
            at: Duration::from_secs(at),
            ops: at * 10,
            procs: vec![ProcSample {
                rss_kib: rss_mib << 10,
                shmem_kib: 0,
                fds,
            }],
        }
    }

    #[test]
    fn steady_state_passes() {
        let s: Vec<Sample> = (1..=20)
            .map(|t| sample(t, 100 + t % 3, 40 + t % 5))
            .collect();
        assert!(growth_problems(&s, &["x"], Duration::from_secs(20), 4).is_empty());
    }

    #[test]
    fn leaks_fail() {
        // RSS climbs 20 MiB a second: the last quarter's median (450 MiB)
        // is beyond 1.5 x 190 + 64 + 16 (one client).
        let s: Vec<Sample> = (1..=20).map(|t| sample(t, 90 + 20 * t, 40)).collect();
        let p = growth_problems(&s, &["dpu-agent"], Duration::from_secs(20), 1);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].starts_with("dpu-agent RSS grew"), "{p:?}");
        // fds climb by 5 a second.
        let s: Vec<Sample> = (1..=20).map(|t| sample(t, 100, 40 + 5 * t)).collect();
        let p = growth_problems(&s, &["host-shim"], Duration::from_secs(20), 4);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("open fds grew"), "{p:?}");
    }

    #[test]
    fn shared_memory_is_not_growth() {
        let mut s: Vec<Sample> = (1..=20).map(|t| sample(t, 100, 40)).collect();
        for x in &mut s {
            let grown = (x.at.as_secs() * 100) << 10;
            x.procs[0].rss_kib += grown;
            x.procs[0].shmem_kib += grown;
        }
        assert!(growth_problems(&s, &["host-shim"], Duration::from_secs(20), 4).is_empty());
        assert_eq!(s[0].procs[0].private_kib(), 100 << 10);
    }

    #[test]
    fn few_samples_and_none() {
        assert!(growth_problems(&[], &["x"], Duration::from_secs(20), 4).is_empty());
        let s = vec![sample(19, 100, 40)];
        assert!(growth_problems(&s, &["x"], Duration::from_secs(20), 4).is_empty());
        let s = vec![sample(10, 100, 40), sample(11, 500, 40)];
        assert_eq!(
            growth_problems(&s, &["x"], Duration::from_secs(20), 4).len(),
            1
        );
    }

    #[test]
    fn lines() {
        let s = Sample {
            at: Duration::from_secs(12),
            ops: 345,
            procs: vec![
                ProcSample {
                    rss_kib: 2048,
                    shmem_kib: 1024,
                    fds: 17,
                },
                ProcSample::default(),
            ],
        };
        assert_eq!(
            sample_line(&s, &["a", "b"]),
            "soak sample t=12s ops=345 | a rss=2.0 MiB shm=1.0 MiB fds=17 | b rss=0.0 MiB shm=0.0 MiB fds=0"
        );
        let mut t = Totals {
            ops: [1, 2, 3, 4, 5, 6],
            bytes: 3 << 30,
            failures: 0,
        };
        let (ok, line) = verdict(&t, Duration::from_secs(20), &[], "");
        assert!(ok);
        assert_eq!(
            line,
            "soak: PASS 21 ops in 20s (get=1 range=2 put=3 head=4 list=5 delete=6), 3.0 GiB moved"
        );
        let g = Growth {
            rss_first_kib: 2048,
            rss_last_kib: 3072,
            fds_first: 10,
            fds_last: 12,
        };
        let summary = growth_summary(&[g, g], &["a", "b"]);
        assert_eq!(
            summary,
            "a rss 2.0->3.0 MiB fds 10->12, b rss 2.0->3.0 MiB fds 10->12"
        );
        let (_, line) = verdict(&t, Duration::from_secs(20), &[], &summary);
        assert!(
            line.ends_with(
                "3.0 GiB moved; a rss 2.0->3.0 MiB fds 10->12, b rss 2.0->3.0 MiB fds 10->12"
            ),
            "{line}"
        );
        t.failures = 2;
        let (ok, line) = verdict(
            &t,
            Duration::from_secs(20),
            &["host-shim died;\nlast lines:\n  x".into()],
            "",
        );
        assert!(!ok);
        assert!(
            line.starts_with(
                "soak: FAIL 2 data mismatches or unexpected errors; host-shim died; last lines: x; 21 ops"
            ),
            "{line}"
        );
        assert!(!line.contains('\n'));
        let (ok, line) = verdict(&Totals::default(), Duration::from_secs(1), &[], "");
        assert!(!ok && line.contains("no operation completed"), "{line}");
    }
}
