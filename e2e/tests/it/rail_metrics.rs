//! The dpu-agent's rail metrics as the rails suites read them (`agent::rails`,
//! `shim::rails`, `rails`), from one `/metrics` text.

/// `name{…}` summed over every label set whose labels contain each of
/// `labels` (`op="get"`, `rail="127.0.0.2:`: a prefix of a value matches
/// when the quote is left open); 0 when none does.
pub(crate) fn sum(m: &str, name: &str, labels: &[&str]) -> f64 {
    let start = format!("{name}{{");
    m.lines()
        .filter(|l| l.starts_with(&start) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `name{…rail="RAIL"…}` summed over its other labels.
pub(crate) fn rail_sample(m: &str, name: &str, rail: &str) -> f64 {
    sum(m, name, &[&format!("rail=\"{rail}\"")])
}

/// Bytes the agent moved for `op` (`get`/`put`) over the rail `rail`
/// (`ip:port`; or `ip:` for every port of an address).
pub(crate) fn rail_bytes(m: &str, rail: &str, op: &str) -> f64 {
    let rail = if rail.ends_with(':') {
        format!("rail=\"{rail}")
    } else {
        format!("rail=\"{rail}\"")
    };
    sum(
        m,
        "s3dma_agent_rail_bytes_total",
        &[&format!("op=\"{op}\""), &rail],
    )
}

/// `s3dma_agent_rail_up{rail}`, `None` before the rail was ever used.
pub(crate) fn rail_up(m: &str, rail: &str) -> Option<f64> {
    let want = format!("s3dma_agent_rail_up{{rail=\"{rail}\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&want))
        .map(|v| v.trim().parse().unwrap())
}

/// The agent's requests that did not end `ok`.
pub(crate) fn failed_requests(m: &str) -> f64 {
    m.lines()
        .filter(|l| l.starts_with("s3dma_agent_requests_total{") && !l.contains("outcome=\"ok\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
