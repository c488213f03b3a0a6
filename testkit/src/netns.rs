//! Network namespaces for the rails tests and `s3dma-tools bench --rails`
//! (root only): a host namespace `s3dma-h<id>` (the host-shim) and a
//! storage namespace `s3dma-s<id>` (storage-target, dpu-agent), joined by
//!
//! - one unlimited control veth `ctl`, `10.<n>.0.0/24` (host `.1`, storage
//!   `.2`): the shim's gRPC link to the agent, the agent's S3 to the target;
//! - `rails` rail veths `rail<i>`, `10.<n>.<i+1>.0/24` (host `.1`, storage
//!   `.2`): fabric traffic only, each rate-limited with a `tc` token bucket
//!   (tbf) on both ends when asked, and cut and restored with
//!   `ip link set … down/up` on both ends.
//!
//! Every interface lives inside one of the two namespaces, so names and
//! subnets never meet the root namespace's. `<id>` is `<pid>-<k>`: a run
//! never collides with another, and [`RailNet::create`] first deletes the
//! namespaces of runs whose process is gone (SIGKILLing what still runs in
//! them: services a killed run left behind). Both namespaces, and whatever
//! still runs in them, go when the [`RailNet`] is dropped.
//!
//! Services run inside a namespace through the kit's process primitive
//! ([`Process`], [`crate::ServiceSpec::wrap`]) under `ip netns exec NAME`
//! ([`RailNet::wrap`]); the test itself stays in the root namespace and
//! reaches a service there over a Unix socket (path sockets are not
//! namespaced) or through [`connect_in`] / [`run_in`] / [`scrape_in`],
//! which open their sockets from a thread that entered the namespace.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsFd as _;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::process::{Process, wrapped};

/// The prefix of the host namespaces' names.
const HOST_PREFIX: &str = "s3dma-h";
/// The prefix of the storage namespaces' names.
const STORAGE_PREFIX: &str = "s3dma-s";
/// The control veth's name (both ends, each in its namespace).
const CONTROL_IF: &str = "ctl";
/// The most rails [`RailNet::create`] makes (the rail config's limit).
pub const MAX_RAILS: usize = 8;

/// Which side of a [`RailNet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The GPU host's namespace (host-shim).
    Host,
    /// The storage namespace (storage-target, dpu-agent).
    Storage,
}

/// Bytes an interface end counted (`/sys/class/net/IF/statistics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bytes {
    /// Received.
    pub rx: u64,
    /// Sent.
    pub tx: u64,
}

/// The two namespaces and their veths; deleted on drop.
#[derive(Debug)]
pub struct RailNet {
    /// The host namespace's name.
    pub host: String,
    /// The storage namespace's name.
    pub storage: String,
    /// The second octet of every address (`10.<n>.…`).
    net: u8,
    rails: usize,
}

/// Runs `cmd ARGS`, returning its stdout; panics with its stderr when it
/// fails.
fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("`{cmd}` (iproute2): {e}"));
    assert!(
        out.status.success(),
        "{cmd} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ip ARGS`.
fn ip(args: &[&str]) -> String {
    run("ip", args)
}

impl RailNet {
    /// Creates the namespaces, the control veth and `rails` rail veths
    /// (1 to [`MAX_RAILS`]), each rail limited to `rate` bytes per second
    /// in each direction when given.
    ///
    /// # Panics
    /// Not root, iproute2 missing, or a command fails (whatever was made
    /// is deleted again).
    #[must_use]
    pub fn create(rails: usize, rate: Option<u64>) -> RailNet {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        assert!(
            (1..=MAX_RAILS).contains(&rails),
            "1 to {MAX_RAILS} rails, not {rails}"
        );
        sweep_stale();
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-{k}", std::process::id());
        let net = RailNet {
            host: format!("{HOST_PREFIX}{id}"),
            storage: format!("{STORAGE_PREFIX}{id}"),
            // Private to the namespaces: only distinct for readable logs.
            net: u8::try_from(200 + k % 50).unwrap_or(200),
            rails,
        };
        // From here on, drop deletes whatever was made.
        ip(&["netns", "add", &net.host]);
        ip(&["netns", "add", &net.storage]);
        for ns in [&net.host, &net.storage] {
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        net.veth(CONTROL_IF, 0);
        for i in 0..rails {
            net.veth(&rail_if(i), i + 1);
            if let Some(r) = rate {
                net.limit(i, r);
            }
        }
        net
    }

    /// Creates veth `name` (that name on both ends) on subnet
    /// `10.<n>.<third>.0/24` and brings it up.
    fn veth(&self, name: &str, third: usize) {
        ip(&[
            "-n",
            &self.host,
            "link",
            "add",
            name,
            "type",
            "veth",
            "peer",
            "name",
            name,
            "netns",
            &self.storage,
        ]);
        for (side, last) in [(Side::Host, 1), (Side::Storage, 2)] {
            let addr = format!("10.{}.{third}.{last}/24", self.net);
            let ns = self.ns(side);
            ip(&["-n", ns, "addr", "add", &addr, "dev", name]);
            ip(&["-n", ns, "link", "set", name, "up"]);
        }
    }

    /// The number of rails.
    #[must_use]
    pub fn rails(&self) -> usize {
        self.rails
    }

    /// The name of `side`'s namespace.
    #[must_use]
    pub fn ns(&self, side: Side) -> &str {
        match side {
            Side::Host => &self.host,
            Side::Storage => &self.storage,
        }
    }

    fn addr(&self, third: usize, side: Side) -> IpAddr {
        let last = if side == Side::Host { 1 } else { 2 };
        IpAddr::V4(Ipv4Addr::new(
            10,
            self.net,
            u8::try_from(third).expect("at most 8 rails"),
            last,
        ))
    }

    /// `side`'s address on the control veth.
    #[must_use]
    pub fn control_ip(&self, side: Side) -> IpAddr {
        self.addr(0, side)
    }

    /// Rail `rail`'s subnet, `10.<n>.<rail+1>.0/24`.
    ///
    /// # Panics
    /// No such rail.
    #[must_use]
    pub fn rail_net(&self, rail: usize) -> String {
        assert!(rail < self.rails, "rail {rail} of {}", self.rails);
        format!("10.{}.{}.0/24", self.net, rail + 1)
    }

    /// `side`'s address on rail `rail` (0-based).
    ///
    /// # Panics
    /// No such rail.
    #[must_use]
    pub fn rail_ip(&self, rail: usize, side: Side) -> IpAddr {
        assert!(rail < self.rails, "rail {rail} of {}", self.rails);
        self.addr(rail + 1, side)
    }

    /// Limits rail `rail` to `rate` bytes per second each way (a tbf qdisc
    /// on both ends' egress; replaces an earlier limit).
    ///
    /// # Panics
    /// No such rail, or `tc` fails.
    pub fn limit(&self, rail: usize, rate: u64) {
        assert!(rail < self.rails, "rail {rail} of {}", self.rails);
        let bits = format!("{}bit", rate.saturating_mul(8));
        // At least a jiffy's worth of bytes at 1000 Hz and a few 64 KiB
        // segments (veth hands tbf GSO packets; bigger ones are split).
        let burst = (rate / 250).max(256 << 10).to_string();
        for side in [Side::Host, Side::Storage] {
            run(
                "tc",
                &[
                    "-n",
                    self.ns(side),
                    "qdisc",
                    "replace",
                    "dev",
                    &rail_if(rail),
                    "root",
                    "tbf",
                    "rate",
                    &bits,
                    "burst",
                    &burst,
                    "latency",
                    "100ms",
                ],
            );
        }
    }

    /// Takes rail `rail` down on both ends (`ip link set … down`):
    /// packets stop; the subnet's routes go with it.
    ///
    /// # Panics
    /// No such rail, or `ip` fails.
    pub fn cut(&self, rail: usize) {
        self.set_link(rail, "down");
    }

    /// Brings rail `rail` back up on both ends (the kernel restores the
    /// subnet's routes; the tbf limit stays).
    ///
    /// # Panics
    /// No such rail, or `ip` fails.
    pub fn restore(&self, rail: usize) {
        self.set_link(rail, "up");
    }

    fn set_link(&self, rail: usize, state: &str) {
        assert!(rail < self.rails, "rail {rail} of {}", self.rails);
        for side in [Side::Host, Side::Storage] {
            ip(&["-n", self.ns(side), "link", "set", &rail_if(rail), state]);
        }
    }

    /// What rail `rail`'s host end has received and sent so far.
    ///
    /// # Panics
    /// No such rail, or the counters cannot be read.
    #[must_use]
    pub fn rail_bytes(&self, rail: usize) -> Bytes {
        assert!(rail < self.rails, "rail {rail} of {}", self.rails);
        // `ip netns exec` mounts the namespace's own /sys.
        let dev = rail_if(rail);
        let out = run(
            "ip",
            &[
                "netns",
                "exec",
                &self.host,
                "cat",
                &format!("/sys/class/net/{dev}/statistics/rx_bytes"),
                &format!("/sys/class/net/{dev}/statistics/tx_bytes"),
            ],
        );
        let mut v = out.lines().map(|l| {
            l.trim()
                .parse::<u64>()
                .unwrap_or_else(|e| panic!("{dev} counter {l:?}: {e}"))
        });
        Bytes {
            rx: v.next().unwrap_or(0),
            tx: v.next().unwrap_or(0),
        }
    }

    /// `ip netns exec NAME` for `side`, as a command prefix
    /// ([`crate::ServiceSpec::wrap`], [`wrapped`]).
    #[must_use]
    pub fn wrap(&self, side: Side) -> Vec<String> {
        ["ip", "netns", "exec", self.ns(side)]
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// Starts `bin ARGS` inside `side`'s namespace through
    /// [`Process::start`] (stderr appended to `log`, ready after the stdout
    /// lines starting with `ready`); returns it and the rest of those lines.
    ///
    /// # Panics
    /// As [`Process::start`].
    pub fn start(
        &self,
        side: Side,
        bin: &Path,
        args: &[&str],
        log: &Path,
        ready: &[&str],
    ) -> (Process, Vec<String>) {
        let mut cmd = wrapped(&self.wrap(side), bin);
        cmd.args(args);
        let what = bin
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        Process::start(cmd, &what, log, ready, None)
    }
}

impl Drop for RailNet {
    fn drop(&mut self) {
        for ns in [&self.host, &self.storage] {
            delete(ns);
        }
    }
}

/// Whether this process can make the namespaces: root, with iproute2's
/// `ip netns` and `tc` working. `Err` says why not.
///
/// # Errors
/// Not root, or `ip netns list` / `tc -V` fails.
pub fn available() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("it needs root (network namespaces, veths, tc)".into());
    }
    for (cmd, args) in [("ip", &["netns", "list"][..]), ("tc", &["-V"][..])] {
        match Command::new(cmd).args(args).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                return Err(format!(
                    "`{cmd} {}` fails: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
            Err(e) => return Err(format!("`{cmd}` (iproute2): {e}")),
        }
    }
    Ok(())
}

/// [`available`], or a skip: prints why `test` skips and returns `false`;
/// under `CI` (which runs as root and must run every test) it panics
/// instead.
///
/// # Panics
/// Unavailable while `CI` is set.
#[must_use]
pub fn available_or_skip(test: &str) -> bool {
    match available() {
        Ok(()) => true,
        Err(why) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "{test}: {why}, and CI is set"
            );
            eprintln!("skipping {test}: {why}");
            false
        }
    }
}

/// Rail `i`'s interface name (both ends).
#[must_use]
pub fn rail_if(i: usize) -> String {
    format!("rail{i}")
}

/// SIGKILLs what still runs in namespace `ns`, then deletes it.
fn delete(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let _ = Command::new("ip").args(["netns", "del", ns]).output();
}

/// Deletes the namespaces of this kit whose run (the pid in the name) is
/// gone, with whatever still runs in them.
pub fn sweep_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = [HOST_PREFIX, STORAGE_PREFIX]
            .iter()
            .find_map(|p| name.strip_prefix(p))
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            delete(name);
        }
    }
}

/// Moves the calling thread into network namespace `ns`.
fn enter(ns: &str) {
    let f = std::fs::File::open(format!("/var/run/netns/{ns}"))
        .unwrap_or_else(|e| panic!("namespace {ns}: {e}"));
    nix::sched::setns(f.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
        .unwrap_or_else(|e| panic!("entering namespace {ns}: {e}"));
}

/// A TCP connection to `addr` made from inside namespace `ns` (a socket
/// stays in the namespace it was created in, whichever thread uses it).
///
/// # Panics
/// When it cannot connect.
#[must_use]
pub fn connect_in(ns: &str, addr: &str) -> std::net::TcpStream {
    let (ns, addr) = (ns.to_owned(), addr.to_owned());
    std::thread::spawn(move || {
        enter(&ns);
        std::net::TcpStream::connect(&addr).unwrap_or_else(|e| panic!("{addr} in {ns}: {e}"))
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// `GET` of a `http://IP:PORT/metrics` URL from inside namespace `ns`, the
/// whole response (blocking).
///
/// # Panics
/// When the server does not answer.
#[must_use]
pub fn scrape_in(ns: &str, url: &str) -> String {
    scrape(Some(ns), url)
}

/// `GET` of a `http://IP:PORT/metrics` URL, from inside namespace `ns`
/// when given, else from this one: the whole response (blocking).
///
/// # Panics
/// When the server does not answer.
#[must_use]
pub fn scrape(ns: Option<&str>, url: &str) -> String {
    use std::io::{Read as _, Write as _};
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/metrics");
    let mut s = match ns {
        Some(ns) => connect_in(ns, addr),
        None => std::net::TcpStream::connect(addr).unwrap(),
    };
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

/// Runs `f()`'s future on a thread inside namespace `ns` (its own
/// current-thread runtime, so every socket it opens lives in `ns`).
///
/// # Panics
/// When `f`'s future panics (resumed here).
pub async fn run_in<F, Fut, T>(ns: &str, f: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
    T: Send + 'static,
{
    let ns = ns.to_owned();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let t = std::thread::spawn(move || {
        enter(&ns);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _ = tx.send(rt.block_on(f()));
    });
    match rx.await {
        Ok(v) => v,
        Err(_) => match t.join() {
            Err(e) => std::panic::resume_unwind(e),
            Ok(()) => panic!("the task in the namespace ended without a result"),
        },
    }
}
