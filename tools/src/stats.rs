//! Numbers for `s3dma-tools bench` (pure): latency histograms (HdrHistogram),
//! medians, throughput, ratios.

use std::time::Duration;

use hdrhistogram::Histogram;

/// Latencies recorded in microseconds, 1 µs to 10 minutes, 3 significant
/// digits (values beyond are clamped to the top).
#[derive(Debug, Clone)]
pub(crate) struct Latencies {
    hist: Histogram<u64>,
}

/// Highest latency recorded exactly, µs.
const MAX_US: u64 = 600_000_000;

impl Default for Latencies {
    fn default() -> Latencies {
        Latencies::new()
    }
}

impl Latencies {
    /// An empty recorder.
    #[must_use]
    pub(crate) fn new() -> Latencies {
        // Constant bounds and precision that HdrHistogram accepts.
        let hist = Histogram::new_with_bounds(1, MAX_US, 3)
            .expect("1 µs..10 min with 3 significant digits is a valid histogram");
        Latencies { hist }
    }

    /// Records one request's latency (below 1 µs counts as 1 µs).
    pub(crate) fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
        self.hist.saturating_record(us.min(MAX_US));
    }

    /// Adds another recorder's values.
    pub(crate) fn merge(&mut self, other: &Latencies) {
        if self.hist.add(&other.hist).is_err() {
            // Same bounds on both sides: cannot fail. Re-record as a fallback.
            for v in other.hist.iter_recorded() {
                self.hist
                    .saturating_record_n(v.value_iterated_to(), v.count_at_value());
            }
        }
    }

    /// Requests recorded.
    #[must_use]
    pub(crate) fn count(&self) -> u64 {
        self.hist.len()
    }

    /// The mean latency, µs; `None` when empty.
    #[must_use]
    pub(crate) fn mean_us(&self) -> Option<f64> {
        (!self.hist.is_empty()).then(|| self.hist.mean())
    }

    /// The latency at quantile `q` (0.5 = median), µs; `None` when empty.
    #[must_use]
    pub(crate) fn quantile_us(&self, q: f64) -> Option<f64> {
        if self.hist.is_empty() {
            return None;
        }
        // Precision-equivalent value: the recorded value, not its bucket's
        // lower edge.
        let q = if q.is_nan() { 0.5 } else { q.clamp(0.0, 1.0) };
        let v = self.hist.value_at_quantile(q);
        Some(self.hist.highest_equivalent(v) as f64)
    }
}

/// The median of `values` (mean of the two middle ones for an even count);
/// `None` when empty or when one is NaN.
#[must_use]
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() || values.iter().any(|v| v.is_nan()) {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        f64::midpoint(v[n / 2 - 1], v[n / 2])
    })
}

/// Throughput in GB/s (10^9 bytes per second); `None` for no time.
#[must_use]
pub(crate) fn gbps(bytes: u64, elapsed: Duration) -> Option<f64> {
    let s = elapsed.as_secs_f64();
    (s > 0.0).then(|| bytes as f64 / s / 1e9)
}

/// Operations per second; `None` for no time.
#[must_use]
pub(crate) fn per_second(count: u64, elapsed: Duration) -> Option<f64> {
    let s = elapsed.as_secs_f64();
    (s > 0.0).then(|| count as f64 / s)
}

/// `a / b` when both are finite and `b > 0`.
#[must_use]
pub(crate) fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if a.is_finite() && b.is_finite() && b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// Clock ticks per second of `/proc/PID/stat` times (`USER_HZ`, 100 on
/// Linux when sysconf cannot say).
pub(crate) fn ticks_per_sec() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
        .filter(|v| *v > 0)
        .unwrap_or(100)
}

/// CPU time in seconds from clock ticks.
#[must_use]
pub(crate) fn ticks_to_secs(ticks: u64, ticks_per_sec: u64) -> f64 {
    if ticks_per_sec == 0 {
        return 0.0;
    }
    ticks as f64 / ticks_per_sec as f64
}

/// A JSON number, or `null` for a missing or non-finite value.
#[must_use]
pub(crate) fn num(v: Option<f64>) -> serde_json::Value {
    v.and_then(serde_json::Number::from_f64)
        .map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// Two decimals, or `-` for a missing value (the benches' tables).
#[must_use]
pub(crate) fn fmt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[1.0, f64::NAN]), None);
        assert_eq!(median(&[f64::INFINITY, 1.0, 2.0]), Some(2.0));
    }

    #[test]
    fn rates_and_ratios() {
        assert_eq!(gbps(2_000_000_000, Duration::from_secs(2)), Some(1.0));
        assert_eq!(gbps(1, Duration::ZERO), None);
        assert_eq!(per_second(500, Duration::from_millis(250)), Some(2000.0));
        assert_eq!(per_second(5, Duration::ZERO), None);
        assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(2.0)), None);
        assert_eq!(ratio(Some(f64::NAN), Some(2.0)), None);
        assert!((ticks_to_secs(250, 100) - 2.5).abs() < 1e-12);
        assert_eq!(ticks_to_secs(250, 0), 0.0);
    }

    #[test]
    fn percentiles() {
        let mut l = Latencies::new();
        assert_eq!(l.quantile_us(0.5), None);
        for us in 1..=1000u64 {
            l.record(Duration::from_micros(us));
        }
        assert_eq!(l.count(), 1000);
        let p50 = l.quantile_us(0.5).unwrap();
        let p99 = l.quantile_us(0.99).unwrap();
        assert!((499.0..=501.0).contains(&p50), "{p50}");
        assert!((989.0..=991.0).contains(&p99), "{p99}");

        let mut other = Latencies::new();
        other.record(Duration::from_secs(2));
        other.record(Duration::ZERO);
        other.record(Duration::from_secs(100_000));
        l.merge(&other);
        assert_eq!(l.count(), 1003);
        let max = l.quantile_us(1.0).unwrap();
        assert!((600_000_000.0..601_000_000.0).contains(&max), "{max}");
        assert!(l.quantile_us(0.0).unwrap() <= 1.0);
        // Out-of-range quantiles are clamped, not a panic.
        assert!(l.quantile_us(7.0).is_some());
        assert!(l.quantile_us(f64::NAN).is_some());
    }
}
