//! The processes under attack, seen through `/proc`: their descriptors,
//! memory, listening sockets and connections.

use super::*;

/// The pid of the one process whose command line contains `needle`.
pub(super) fn pid_by_cmdline(needle: &str) -> u32 {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) {
            found.push(pid);
        }
    }
    assert_eq!(found.len(), 1, "processes running {needle}: {found:?}");
    found[0]
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Proc {
    pub(super) name: &'static str,
    pub(super) pid: u32,
}

impl Proc {
    pub(super) fn fds(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", self.pid))
            .map(|d| {
                d.flatten()
                    .map(|e| {
                        std::fs::read_link(e.path())
                            .map(|l| l.display().to_string())
                            .unwrap_or_else(|_| "?".into())
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    pub(super) fn rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// Running (not gone, not a zombie).
    pub(super) fn alive(&self) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return false;
        };
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        !state.starts_with('Z') && !state.starts_with('X')
    }

    /// Whether this process holds a TCP connection to local port `port`.
    pub(super) fn serves_port(&self, port: u16) -> bool {
        let inodes: HashSet<u64> = self
            .fds()
            .iter()
            .filter_map(|l| l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
            .collect();
        ["tcp", "tcp6"].iter().any(|table| {
            std::fs::read_to_string(format!("/proc/{}/net/{table}", self.pid))
                .unwrap_or_default()
                .lines()
                .skip(1)
                .any(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    f.len() >= 10
                        && f[2]
                            .rsplit(':')
                            .next()
                            .and_then(|p| u16::from_str_radix(p, 16).ok())
                            == Some(port)
                        && f[9].parse().is_ok_and(|i: u64| inodes.contains(&i))
                })
        })
    }

    /// The TCP sockets this process listens on.
    pub(super) fn listening(&self) -> Vec<SocketAddr> {
        let inodes: HashSet<u64> = self
            .fds()
            .iter()
            .filter_map(|l| l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
            .collect();
        let mut out = Vec::new();
        for table in ["tcp", "tcp6"] {
            let text = std::fs::read_to_string(format!("/proc/{}/net/{table}", self.pid))
                .unwrap_or_default();
            for line in text.lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() < 10 || f[3] != "0A" {
                    continue;
                }
                if !f[9].parse().is_ok_and(|i: u64| inodes.contains(&i)) {
                    continue;
                }
                let (ip, port) = f[1].split_once(':').unwrap();
                let port = u16::from_str_radix(port, 16).unwrap();
                let word = |s: &str| u32::from_str_radix(s, 16).unwrap().to_ne_bytes();
                let ip: IpAddr = if ip.len() == 8 {
                    Ipv4Addr::from(word(ip)).into()
                } else {
                    let mut b = [0u8; 16];
                    for i in 0..4 {
                        b[i * 4..i * 4 + 4].copy_from_slice(&word(&ip[i * 8..i * 8 + 8]));
                    }
                    Ipv6Addr::from(b).into()
                };
                out.push(SocketAddr::new(ip, port));
            }
        }
        out.sort();
        out
    }
}

pub(super) fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}
