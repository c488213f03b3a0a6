//! Ports, `/metrics` and what `/proc` says about a process.

use std::io::{Read as _, Write as _};

/// A free TCP port on loopback (bound, then released).
///
/// # Panics
/// When no port can be bound.
#[must_use]
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET` of a `http://IP:PORT/metrics` URL over `stream`-less plain TCP,
/// the whole response (blocking).
///
/// # Panics
/// When the server does not answer.
#[must_use]
pub fn scrape_blocking(url: &str) -> String {
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/metrics");
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{url}: {e}"));
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// [`scrape_blocking`] from async code (on a blocking thread).
///
/// # Panics
/// As [`scrape_blocking`].
pub async fn scrape(url: &str) -> String {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || scrape_blocking(&url))
        .await
        .unwrap()
}

/// The value of metric `name` (summed over its label sets; `name` may
/// carry labels, e.g. `m{tenant="alice"}`) in Prometheus text.
#[must_use]
pub fn metric_value(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Open file descriptors of process `pid`.
#[must_use]
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(Iterator::count)
        .unwrap_or(0)
}

/// Anonymous resident memory of process `pid` in KiB (`RssAnon`: what the
/// process allocated itself; shared tenant memory it maps is not counted).
#[must_use]
pub fn rss_anon_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
