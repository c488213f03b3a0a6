//! Parsers for the `/proc/PID/*` files that `s3dma-tools bench` and `s3dma-tools soak`
//! sample (pure: the caller reads the files).

/// CPU time a process has used, user + system, in clock ticks
/// (`utime` + `stime`, fields 14 and 15 of `/proc/PID/stat`).
///
/// The command name (field 2) is in parentheses and may itself hold spaces
/// and parentheses, so fields are counted after the *last* `)`.
#[must_use]
pub(crate) fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3 (state): utime is field 14, stime 15.
    let mut fields = rest.split_ascii_whitespace().skip(14 - 3);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    utime.checked_add(stime)
}

/// A `Name:  N kB` line of `/proc/PID/status` (e.g. `VmRSS`, `RssShmem`),
/// in KiB.
#[must_use]
pub(crate) fn status_kib(status: &str, name: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(':')?;
        let mut words = value.split_ascii_whitespace();
        let n: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") | None => Some(n),
            Some(_) => None,
        }
    })
}

/// The pid of each of `names` among `(pid, comm)` pairs, when each name
/// belongs to exactly one process.
#[must_use]
pub(crate) fn unique_pids<const N: usize>(
    procs: &[(u32, String)],
    names: [&str; N],
) -> Option<[u32; N]> {
    let mut out = [0u32; N];
    for (slot, name) in out.iter_mut().zip(names) {
        let mut it = procs.iter().filter(|(_, c)| c == name);
        *slot = it.next()?.0;
        if it.next().is_some() {
            return None;
        }
    }
    Some(out)
}

/// What the soak samples of one process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Memory {
    /// `VmRSS`, KiB.
    pub rss_kib: u64,
    /// `RssShmem`, KiB: shared memory the process has touched. For the
    /// host-shim that is mostly tenant buffers (memfds the tenants own and
    /// passed to it), which grow in RSS as bytes first land in them.
    pub shmem_kib: u64,
}

impl Memory {
    /// From the text of `/proc/PID/status` (`RssShmem` is absent on old
    /// kernels: 0).
    #[must_use]
    pub(crate) fn parse(status: &str) -> Option<Memory> {
        Some(Memory {
            rss_kib: status_kib(status, "VmRSS")?,
            shmem_kib: status_kib(status, "RssShmem").unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (dpu-agent) S 1 4242 4242 0 -1 4194560 2130 0 0 0 \
                        731 96 0 0 20 0 9 0 123456 1099511627776 3000 18446744073709551615 \
                        1 1 0 0 0 0 0 4096 17663 0 0 0 17 1 0 0 0 0 0";

    #[test]
    fn cpu_ticks_are_utime_plus_stime() {
        assert_eq!(cpu_ticks(STAT), Some(731 + 96));
    }

    #[test]
    fn command_names_with_spaces_and_parentheses() {
        let s = STAT.replace("(dpu-agent)", "(a) b (c))");
        assert_eq!(cpu_ticks(&s), Some(827));
    }

    #[test]
    fn bad_stat_is_none() {
        assert_eq!(cpu_ticks(""), None);
        assert_eq!(cpu_ticks("1 (x) S 1 2"), None);
        assert_eq!(cpu_ticks(&STAT.replace(" 731 ", " -7 ")), None);
        assert_eq!(cpu_ticks("no parenthesis at all"), None);
        let max = STAT.replace(" 731 96 ", &format!(" {} 1 ", u64::MAX));
        assert_eq!(cpu_ticks(&max), None);
    }

    #[test]
    fn unique_pids_by_name() {
        let procs: Vec<(u32, String)> = [(1, "init"), (7, "dpu-agent"), (9, "host-shim")]
            .iter()
            .map(|(p, c)| (*p, (*c).to_owned()))
            .collect();
        assert_eq!(
            unique_pids(&procs, ["host-shim", "dpu-agent"]),
            Some([9, 7])
        );
        assert_eq!(unique_pids(&procs, ["storage-target"]), None);
        let mut twice = procs.clone();
        twice.push((10, "host-shim".into()));
        assert_eq!(unique_pids(&twice, ["host-shim"]), None);
    }

    #[test]
    fn status_fields() {
        let status = "Name:\thost-shim\nVmPeak:\t  900 kB\nVmRSS:\t   51234 kB\n\
                      RssAnon:\t   40000 kB\nRssShmem:\t    1000 kB\nThreads:\t3\n";
        assert_eq!(status_kib(status, "VmRSS"), Some(51234));
        assert_eq!(status_kib(status, "Threads"), Some(3));
        assert_eq!(status_kib(status, "VmSwap"), None);
        assert_eq!(status_kib(status, "Vm"), None);
        let m = Memory::parse(status).unwrap();
        assert_eq!(m.rss_kib, 51234);
        assert_eq!(m.shmem_kib, 1000);
        assert_eq!(Memory::parse("Name:\tx\n"), None);
        assert_eq!(
            Memory::parse("VmRSS:\t5 kB\n"),
            Some(Memory {
                rss_kib: 5,
                shmem_kib: 0
            })
        );
        assert_eq!(status_kib("VmRSS:\t5 MB\n", "VmRSS"), None);
        assert_eq!(status_kib("VmRSS:\tlots kB\n", "VmRSS"), None);
    }
}
