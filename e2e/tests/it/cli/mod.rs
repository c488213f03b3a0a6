//! The `s3dma` CLI against `s3dma local`: real storage-target, dpu-agent and
//! host-shim processes.
//!
//! The three service binaries must sit next to `s3dma` in the target
//! directory: `cargo test --workspace` (or `cargo build --bins` first)
//! builds them.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sha2::{Digest as _, Sha256};

mod common;
mod recursive;
mod remote;
use common::{S3DMA, check_binaries};

/// A running `s3dma local`; stopped (and its children killed) on drop.
struct Local {
    child: Option<Child>,
    socket: PathBuf,
    /// name → pid of the three services.
    pids: Vec<(String, i32)>,
    /// Everything local mode printed on stdout up to the end of its help.
    stdout: String,
    /// Holds the state directory, the socket and local mode's stderr.
    root: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl Local {
    fn start() -> Local {
        let dir = tempfile::tempdir().unwrap();
        let mut local = Local::start_in(dir.path());
        local._dir = Some(dir);
        local
    }

    /// Local mode with its state in `root/state` and its socket `root/s.sock`.
    fn start_in(root: &Path) -> Local {
        Local::start_with(root, false)
    }

    /// Local mode with its state in `root/state`; with `default_socket`, no
    /// `--socket` and `$XDG_RUNTIME_DIR` = `root/run` (so its socket is the
    /// default one, `root/run/s3dma/shim.sock`), else `root/s.sock`.
    fn start_with(root: &Path, default_socket: bool) -> Local {
        Local::start_cmd(root, default_socket, |_| {})
    }

    /// [`Local::start_with`], with `more` adding arguments and environment.
    fn start_cmd(root: &Path, default_socket: bool, more: impl FnOnce(&mut Command)) -> Local {
        check_binaries();
        let stderr = std::fs::File::create(root.join("local.stderr")).unwrap();
        let mut cmd = Command::new(&*S3DMA);
        cmd.arg("local").arg("--dir").arg(root.join("state"));
        more(&mut cmd);
        let socket = if default_socket {
            let run = root.join("run");
            cmd.env("XDG_RUNTIME_DIR", &run);
            run.join("s3dma").join("shim.sock")
        } else {
            let socket = root.join("s.sock");
            cmd.arg("--socket").arg(&socket);
            socket
        };
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut local = Local {
            child: Some(child),
            socket,
            pids: Vec::new(),
            stdout: String::new(),
            root: root.to_path_buf(),
            _dir: None,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut ready = false;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    local.stdout.push_str(&line);
                    local.stdout.push('\n');
                    if let Some(s) = line.strip_prefix("s3dma local ready: socket=") {
                        assert_eq!(Path::new(s), local.socket);
                        ready = true;
                    }
                    let words: Vec<&str> = line.split_whitespace().collect();
                    if ready && words.len() > 2 && words[1] == "pid" {
                        local
                            .pids
                            .push((words[0].to_owned(), words[2].parse().unwrap()));
                    }
                    if ready && line.starts_with("Ctrl-C stops") {
                        break;
                    }
                }
                Err(_) => {
                    let err = std::fs::read_to_string(local.root.join("local.stderr"))
                        .unwrap_or_default();
                    panic!(
                        "s3dma local did not get ready; stdout:\n{}\nstderr:\n{err}",
                        local.stdout
                    );
                }
            }
        }
        // Keep draining stdout so local mode never blocks on it.
        std::thread::spawn(move || for _ in rx {});
        // Pointed at a remote target (`--target`): no storage-target.
        let services = if local.stdout.contains("running: dpu-agent and host-shim") {
            2
        } else {
            3
        };
        assert_eq!(local.pids.len(), services, "{}", local.stdout);
        local
    }

    fn s3dma(&self, args: &[&str]) -> Output {
        run(
            Command::new(&*S3DMA)
                .env("S3DMA_SOCKET", &self.socket)
                .args(args),
            None,
        )
    }

    fn s3dma_stdin(&self, args: &[&str], stdin: &[u8]) -> Output {
        run(
            Command::new(&*S3DMA)
                .env("S3DMA_SOCKET", &self.socket)
                .args(args),
            Some(stdin),
        )
    }

    fn pid(&self, name: &str) -> i32 {
        self.pids.iter().find(|p| p.0 == name).unwrap().1
    }

    /// Waits up to `secs` for local mode to exit.
    fn wait_exit(&mut self, secs: u64) -> std::process::ExitStatus {
        let child = self.child.as_mut().unwrap();
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                self.child = None;
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "s3dma local did not exit within {secs} s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.root.join("local.stderr")).unwrap_or_default()
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        // Whatever happened to local mode, no service outlives the test.
        for (_, pid) in &self.pids {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
    }
}

/// Runs a command with a 10-minute limit, optionally feeding stdin.
fn run(cmd: &mut Command, stdin: Option<&[u8]>) -> Output {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    if let Some(data) = stdin {
        let mut w = child.stdin.take().unwrap();
        let data = data.to_vec();
        std::thread::spawn(move || {
            let _ = w.write_all(&data);
        });
    }
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let e = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{cmd:?} did not finish within 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: o.join().unwrap(),
        stderr: e.join().unwrap(),
    }
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn fails(o: &Output, code: i32, message: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert!(err.contains(message), "{err:?} should contain {message:?}");
    assert!(err.starts_with("s3dma: "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    err
}

/// Deterministic bytes: block-numbered copies of a 1 MiB pattern.
fn pattern(len: usize) -> Vec<u8> {
    let block: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut v = Vec::with_capacity(len);
    let mut n = 0u64;
    while v.len() < len {
        let mut b = block.clone();
        b[..8].copy_from_slice(&n.to_le_bytes());
        let take = (len - v.len()).min(b.len());
        v.extend_from_slice(&b[..take]);
        n += 1;
    }
    v
}

fn alive(pid: i32) -> bool {
    // Zombies count as gone: local mode reaps its children.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

#[test]
fn usage_and_unavailable_errors_need_no_services() {
    let o = run(Command::new(&*S3DMA).args(["get", "data/key"]), None);
    fails(&o, 2, "invalid URL \"data/key\": must start with s3://");
    let o = run(Command::new(&*S3DMA).args(["stat", "s3://data"]), None);
    fails(&o, 2, "names a bucket, not an object");
    let o = run(
        Command::new(&*S3DMA).args(["get", "s3://b/k", "--range", "9-1"]),
        None,
    );
    fails(&o, 2, "invalid byte range");
    let o = run(Command::new(&*S3DMA).args(["frobnicate"]), None);
    assert_eq!(o.status.code(), Some(2));

    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nobody.sock");
    for args in [vec!["info"], vec!["stat", "s3://b/k"], vec!["ls", "s3://b"]] {
        let o = run(
            Command::new(&*S3DMA).arg("--socket").arg(&sock).args(&args),
            None,
        );
        fails(&o, 5, &sock.display().to_string());
    }
    // A socket file nobody listens on.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let o = run(
        Command::new(&*S3DMA)
            .env("S3DMA_SOCKET", &sock)
            .args(["get", "s3://b/k", "-"]),
        None,
    );
    fails(&o, 5, &sock.display().to_string());

    let o = run(Command::new(&*S3DMA).arg("--help"), None);
    let help = ok(&o);
    assert!(help.contains("7  invalid range"), "{help}");
    assert!(help.contains("8  untrusted shim"), "{help}");
    assert!(help.contains("--shim-uid <UID|USER>"), "{help}");
    let o = run(
        Command::new(&*S3DMA).args(["--shim-uid", "no-such-user-s3dma", "info"]),
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no user called \"no-such-user-s3dma\""),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn round_trips_errors_and_clean_stop() {
    let local = Local::start();
    assert!(local.stdout.contains(&format!(
        "S3DMA_SOCKET={} {} put",
        local.socket.display(),
        *S3DMA
    )));
    let work = tempfile::tempdir().unwrap();

    let info = ok(&local.s3dma(&["info"]));
    assert!(info.contains("tenant:          local"), "{info}");
    assert!(info.contains("agent connected: yes"), "{info}");

    for (name, len) in [
        ("zero", 0usize),
        ("one", 1),
        ("five-mib-plus-one", (5 << 20) + 1),
    ] {
        let data = pattern(len);
        let src = work.path().join(name);
        std::fs::write(&src, &data).unwrap();
        let url = format!("s3://data/sizes/{name}");
        ok(&local.s3dma(&["put", src.to_str().unwrap(), &url]));

        let stat = ok(&local.s3dma(&["stat", &url]));
        assert!(stat.contains(&format!("size:          {len} ")), "{stat}");

        let dst = work.path().join(format!("{name}.back"));
        ok(&local.s3dma(&["get", &url, dst.to_str().unwrap()]));
        assert!(std::fs::read(&dst).unwrap() == data, "{name} differs");

        let out = local.s3dma(&["get", &url, "-"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout == data, "{name} on stdout differs");
    }

    // Default destination: the key's last part, in the current directory.
    let o = run(
        Command::new(&*S3DMA)
            .env("S3DMA_SOCKET", &local.socket)
            .current_dir(work.path())
            .args(["-q", "get", "s3://data/sizes/one"]),
        None,
    );
    ok(&o);
    assert!(o.stderr.is_empty(), "quiet");
    assert_eq!(std::fs::read(work.path().join("one")).unwrap(), pattern(1));

    // Ranges.
    let whole = pattern((5 << 20) + 1);
    let url = "s3://data/sizes/five-mib-plus-one";
    let o = local.s3dma(&["get", url, "-", "--range", "100-199"]);
    assert!(o.status.success());
    assert!(o.stdout == whole[100..200]);
    let o = local.s3dma(&["get", url, "-", "--range", "-10"]);
    ok(&o);
    assert!(o.stdout == whole[whole.len() - 10..]);
    let o = local.s3dma(&["get", url, "-", "--range", &format!("{}-", 5 << 20)]);
    assert!(o.stdout == whole[5 << 20..]);
    let o = local.s3dma(&["get", url, "-", "--range", "99999999-"]);
    fails(&o, 7, "InvalidRange");

    // stdin, content type and metadata.
    ok(&local.s3dma_stdin(
        &[
            "put",
            "-",
            "s3://data/piped.txt",
            "--content-type",
            "text/plain",
            "--meta",
            "owner=ci",
        ],
        b"hello from stdin\n",
    ));
    let stat = ok(&local.s3dma(&["stat", "s3://data/piped.txt"]));
    assert!(stat.contains("content type:  text/plain"), "{stat}");
    assert!(stat.contains("owner=ci"), "{stat}");
    assert_eq!(
        local.s3dma(&["get", "s3://data/piped.txt", "-"]).stdout,
        b"hello from stdin\n"
    );

    // Listings.
    let ls = ok(&local.s3dma(&["ls", "s3://data"]));
    assert!(ls.contains("PRE sizes/"), "{ls}");
    assert!(ls.contains(" piped.txt"), "{ls}");
    let ls = ok(&local.s3dma(&["ls", "s3://data/sizes/"]));
    assert!(
        ls.contains(&format!("{:>10} five-mib-plus-one", (5 << 20) + 1)),
        "{ls}"
    );
    assert!(!ls.contains("PRE"), "{ls}");
    let ls = ok(&local.s3dma(&["ls", "--recursive", "s3://data"]));
    assert!(ls.contains(" sizes/zero"), "{ls}");
    assert_eq!(ls.lines().count(), 4, "{ls}");

    // Missing objects: exit 3, the S3 code, nothing left behind.
    let dst = work.path().join("missing");
    let o = local.s3dma(&["get", "s3://data/no/such/key", dst.to_str().unwrap()]);
    fails(&o, 3, "NoSuchKey");
    assert!(!dst.exists());
    let leftovers: Vec<_> = std::fs::read_dir(work.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    fails(&local.s3dma(&["stat", "s3://data/nope"]), 3, "NoSuchKey");
    fails(
        &local.s3dma(&["get", "s3://data/nope", "-"]),
        3,
        "get s3://data/nope: NoSuchKey",
    );

    // rm.
    ok(&local.s3dma(&["rm", "s3://data/piped.txt"]));
    fails(
        &local.s3dma(&["stat", "s3://data/piped.txt"]),
        3,
        "NoSuchKey",
    );
    ok(&local.s3dma(&["rm", "s3://data/piped.txt"]));

    // rm -r: every key under the prefix (DeleteObjects), none beside it.
    let rm_r = || {
        let o = local.s3dma(&["rm", "-r", "s3://data/sizes/"]);
        ok(&o);
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let said = rm_r();
    assert!(said.contains("3 objects deleted, 0 failed"), "{said}");
    assert!(said.contains("delete: s3://data/sizes/zero"), "{said}");
    let ls = ok(&local.s3dma(&["ls", "--recursive", "s3://data"]));
    assert_eq!(ls.lines().count(), 0, "{ls}");
    let said = rm_r();
    assert!(said.contains("0 objects deleted"), "{said}");

    // Ctrl-C: everything stops, the socket goes.
    let mut local = local;
    let pid = local.child.as_ref().unwrap().id() as i32;
    kill(Pid::from_raw(pid), Signal::SIGINT).unwrap();
    let status = local.wait_exit(15);
    assert!(status.success(), "{status:?}\n{}", local.stderr());
    for (name, pid) in &local.pids {
        assert!(!alive(*pid), "{name} (pid {pid}) still runs");
    }
    assert!(!local.socket.exists(), "the socket was not removed");
}

#[test]
fn one_gib_round_trip() {
    const LEN: usize = 1 << 30;
    let local = Local::start();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("big");
    let mut want = Sha256::new();
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&src).unwrap());
        let chunk = pattern(64 << 20);
        for i in 0..LEN / chunk.len() {
            let mut c = chunk.clone();
            c[8..16].copy_from_slice(&(i as u64).to_le_bytes());
            want.update(&c);
            f.write_all(&c).unwrap();
        }
        f.flush().unwrap();
    }
    let want = hex::encode(want.finalize());
    ok(&local.s3dma(&["put", src.to_str().unwrap(), "s3://data/big"]));
    std::fs::remove_file(&src).unwrap();
    let stat = ok(&local.s3dma(&["stat", "s3://data/big"]));
    assert!(stat.contains(&format!("size:          {LEN} ")), "{stat}");

    let dst = work.path().join("big.back");
    ok(&local.s3dma(&["get", "s3://data/big", dst.to_str().unwrap()]));
    let mut got = Sha256::new();
    let mut f = std::fs::File::open(&dst).unwrap();
    let mut buf = vec![0u8; 8 << 20];
    let mut total = 0;
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        total += n;
        got.update(&buf[..n]);
    }
    assert_eq!(total, LEN);
    assert_eq!(hex::encode(got.finalize()), want);
    ok(&local.s3dma(&["rm", "s3://data/big"]));
}

#[test]
fn data_survives_a_restart_and_a_dying_service_stops_local_mode() {
    let root = tempfile::tempdir().unwrap();
    // An existing state directory others may read: local mode tightens it.
    let state = root.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut local = Local::start_in(root.path());
    ok(&local.s3dma_stdin(&["put", "-", "s3://data/kept"], b"still here"));
    let pid = local.child.as_ref().unwrap().id() as i32;
    kill(Pid::from_raw(pid), Signal::SIGTERM).unwrap();
    assert!(local.wait_exit(15).success(), "{}", local.stderr());
    drop(local);

    // Everything local mode wrote is private, though the state directory
    // was created 0755 before the first start (see the top of this test).
    let state = root.path().join("state");
    let mode = |p: &Path| {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    };
    for d in ["", "secrets", "logs", "data"] {
        let p = state.join(d);
        assert_eq!(mode(&p), 0o700, "{}", p.display());
    }
    let mut files = vec![state.join("lock")];
    for d in ["", "secrets", "logs"] {
        for e in std::fs::read_dir(state.join(d)).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() {
                files.push(p);
            }
        }
    }
    for want in [
        "secrets/tenant.secret",
        "secrets/fabric.key",
        "secrets/shim.token",
        "host-shim.yaml",
        "logs/host-shim.log",
    ] {
        assert!(files.contains(&state.join(want)), "{want} in {files:?}");
    }
    for p in &files {
        assert_eq!(mode(p), 0o600, "{}", p.display());
    }

    // Same directory: same secrets, same data.
    let mut local = Local::start_in(root.path());
    assert_eq!(
        local.s3dma(&["get", "s3://data/kept", "-"]).stdout,
        b"still here"
    );

    // The agent dies: local mode stops the others and fails, showing its log.
    kill(Pid::from_raw(local.pid("dpu-agent")), Signal::SIGKILL).unwrap();
    let status = local.wait_exit(30);
    assert_eq!(status.code(), Some(1));
    let err = local.stderr();
    assert!(err.contains("dpu-agent exited unexpectedly"), "{err}");
    assert!(err.contains("dpu-agent.log"), "{err}");
    for (name, pid) in &local.pids {
        assert!(!alive(*pid), "{name} (pid {pid}) still runs");
    }
    assert!(!local.socket.exists());
}

// ---------------------------------------------------------------------------
// Another user's socket: refused by the CLI, and by local mode.
// ---------------------------------------------------------------------------

/// The uid that plays the other local user (`nobody`).
const OTHER_UID: u32 = 65534;
const FAKE_SOCKET_ENV: &str = "S3DMA_TEST_FAKE_SOCKET";
const FAKE_EVENTS_ENV: &str = "S3DMA_TEST_FAKE_EVENTS";

/// Whether this process may act as another uid (else the test skips).
fn root_or_skip(test: &str) -> bool {
    s3dma_testkit::root_or_skip(test, &format!("it acts as uid {OTHER_UID}"))
}

fn append(path: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    writeln!(f, "{line}").unwrap();
}

/// A fake shim run as [`OTHER_UID`] (this test binary running
/// [`recording_shim_as_another_user`]): it notes what each connection sends
/// first and hangs up without answering.
struct Impostor(s3dma_testkit::ChildAsUser);

impl std::ops::Deref for Impostor {
    type Target = s3dma_testkit::ChildAsUser;
    fn deref(&self) -> &s3dma_testkit::ChildAsUser {
        &self.0
    }
}

impl Impostor {
    fn start() -> Impostor {
        Impostor(s3dma_testkit::ChildAsUser::start(
            OTHER_UID,
            "cli::recording_shim_as_another_user",
            FAKE_SOCKET_ENV,
            FAKE_EVENTS_ENV,
        ))
    }

    /// Connections that sent the lease magic.
    fn leases(&self) -> usize {
        self.events().lines().filter(|l| *l == "lease").count()
    }

    /// Whether any connection sent it a byte.
    fn received_anything(&self) -> bool {
        self.events()
            .lines()
            .any(|l| l.starts_with("bytes ") && l != "bytes 0")
    }
}

/// Run by [`Impostor::start`] as another uid; does nothing otherwise.
#[test]
#[ignore = "the fake shim the untrusted-shim test runs as uid 65534"]
fn recording_shim_as_another_user() {
    let (Some(socket), Some(events)) = (
        std::env::var_os(FAKE_SOCKET_ENV),
        std::env::var_os(FAKE_EVENTS_ENV),
    ) else {
        return;
    };
    let events = PathBuf::from(events);
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    append(&events, "ready");
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        // The first 8 bytes (the lease magic from a client that trusts us),
        // or none; then hang up without a reply.
        let mut got = Vec::new();
        let _ = (&conn).take(8).read_to_end(&mut got);
        append(&events, &format!("bytes {}", got.len()));
        if got == s3dma_client::proto::lease::MAGIC {
            append(&events, "lease");
        }
    }
}

#[test]
fn a_socket_served_by_another_uid_is_refused() {
    if !root_or_skip("a_socket_served_by_another_uid_is_refused") {
        return;
    }
    let imp = Impostor::start();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("secret.txt");
    std::fs::write(&src, b"the victim's bytes").unwrap();
    let dst = work.path().join("out.bin");
    let served_by = format!(
        "the socket {} is served by uid {OTHER_UID}",
        imp.socket.display()
    );

    // put: refused before the file's memfd (or anything) is sent.
    let o = run(
        Command::new(&*S3DMA)
            .arg("--socket")
            .arg(&imp.socket)
            .arg("put")
            .arg(&src)
            .arg("s3://data/k"),
        None,
    );
    let err = fails(&o, 8, &served_by);
    assert!(err.contains("UntrustedShim"), "{err}");
    assert!(
        err.contains("expected uid 0 (set S3DMA_SHIM_UID if the shim runs as another user)"),
        "{err}"
    );
    // get: refused, and the output file is never created.
    let o = run(
        Command::new(&*S3DMA)
            .env("S3DMA_SOCKET", &imp.socket)
            .arg("get")
            .arg("s3://data/k")
            .arg(&dst),
        None,
    );
    fails(&o, 8, &served_by);
    assert!(!dst.exists());
    let o = run(
        Command::new(&*S3DMA)
            .env("S3DMA_SOCKET", &imp.socket)
            .args(["get", "s3://data/k", "-"]),
        None,
    );
    fails(&o, 8, &served_by);
    assert!(o.stdout.is_empty());
    assert!(!imp.received_anything(), "{}", imp.events());
    assert_eq!(imp.leases(), 0);

    // Named by $S3DMA_SHIM_UID (a uid) or --shim-uid (a user name), it is
    // trusted: the lease magic goes out. This fake then hangs up, as a shim
    // does on a uid that is not its tenant.
    let dropped = "the shim closed the connection before answering: uid 0 is probably not one \
                   of its tenants";
    let o = run(
        Command::new(&*S3DMA)
            .env("S3DMA_SOCKET", &imp.socket)
            .env("S3DMA_SHIM_UID", OTHER_UID.to_string())
            .arg("put")
            .arg(&src)
            .arg("s3://data/k"),
        None,
    );
    fails(&o, 4, dropped);
    assert_eq!(imp.leases(), 1, "{}", imp.events());
    let o = run(
        Command::new(&*S3DMA)
            .arg("--socket")
            .arg(&imp.socket)
            .args(["--shim-uid", "nobody", "get", "s3://data/k"])
            .arg(&dst),
        None,
    );
    fails(&o, 4, dropped);
    assert_eq!(imp.leases(), 2, "{}", imp.events());
    assert!(!dst.exists());
    // A bad $S3DMA_SHIM_UID is an error, not a silent default.
    let o = run(
        Command::new(&*S3DMA)
            .env("S3DMA_SOCKET", &imp.socket)
            .env("S3DMA_SHIM_UID", "no-such-user-s3dma")
            .args(["info"]),
        None,
    );
    fails(&o, 1, "$S3DMA_SHIM_UID: no user called");
    assert_eq!(imp.leases(), 2, "{}", imp.events());
}

#[test]
fn local_mode_refuses_a_socket_directory_it_cannot_trust() {
    if !root_or_skip("local_mode_refuses_a_socket_directory_it_cannot_trust") {
        return;
    }
    check_binaries();
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    // The default socket directory, $XDG_RUNTIME_DIR/s3dma (like
    // /tmp/s3dma-<uid>), created first by another user, mode 0777.
    let runtime = root.path().join("run");
    std::fs::create_dir(&runtime).unwrap();
    let sockdir = runtime.join("s3dma");
    std::fs::create_dir(&sockdir).unwrap();
    std::fs::set_permissions(&sockdir, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::os::unix::fs::chown(&sockdir, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    let local = |extra: &[&str]| {
        run(
            Command::new(&*S3DMA)
                .env("XDG_RUNTIME_DIR", &runtime)
                .arg("local")
                .arg("--dir")
                .arg(&state)
                .args(extra),
            None,
        )
    };
    let o = local(&[]);
    let err = fails(
        &o,
        1,
        &format!(
            "{} is owned by uid {OTHER_UID}, not by uid 0",
            sockdir.display()
        ),
    );
    assert!(err.contains("pick another directory"), "{err}");
    assert_eq!(std::fs::read_dir(&sockdir).unwrap().count(), 0);
    // Left as it was: not tightened, not taken over.
    let meta = std::fs::metadata(&sockdir).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o777);

    // A symlink there is refused, not followed.
    std::fs::remove_dir(&sockdir).unwrap();
    let elsewhere = root.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &sockdir).unwrap();
    let o = local(&[]);
    fails(&o, 1, "is a symbolic link; refusing to follow it");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);

    // --socket in a directory others may write to (ours, 0777).
    let open = root.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let sock = open.join("s.sock");
    let o = local(&["--socket", sock.to_str().unwrap()]);
    let err = fails(&o, 1, "has mode 0777: group or others may write there");
    assert!(err.contains("pick another --socket"), "{err}");
    assert!(!sock.exists());
}

/// A second shell needs no `--socket` and no `$S3DMA_SOCKET`: when
/// `/run/s3dma/shim.sock` does not exist, `s3dma` tries the socket that
/// `s3dma local` uses by default.
#[test]
fn commands_find_local_modes_default_socket() {
    if Path::new("/run/s3dma/shim.sock").exists() {
        eprintln!("skipped: /run/s3dma/shim.sock exists here, and is tried first");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let local = Local::start_with(dir.path(), true);
    assert!(local.socket.exists(), "{}", local.stdout);
    let second_shell = |args: &[&str]| {
        run(
            Command::new(&*S3DMA)
                .env_remove("S3DMA_SOCKET")
                .env("XDG_RUNTIME_DIR", dir.path().join("run"))
                .args(args),
            None,
        )
    };
    let info = ok(&second_shell(&["info"]));
    assert!(
        info.contains(&format!("socket:          {}", local.socket.display())),
        "{info}"
    );
    assert!(info.contains("tenant:          local"), "{info}");
    let f = dir.path().join("hello.txt");
    std::fs::write(&f, b"hello from the second shell").unwrap();
    ok(&second_shell(&[
        "put",
        f.to_str().unwrap(),
        "s3://data/hello.txt",
    ]));
    let got = second_shell(&["get", "s3://data/hello.txt", "-"]);
    ok(&got);
    assert_eq!(got.stdout, b"hello from the second shell");
    // $S3DMA_SOCKET still wins: pointing it elsewhere fails (unavailable).
    let other = run(
        Command::new(&*S3DMA)
            .env("S3DMA_SOCKET", dir.path().join("nothing.sock"))
            .env("XDG_RUNTIME_DIR", dir.path().join("run"))
            .arg("info"),
        None,
    );
    fails(&other, 5, "nothing.sock");
}

/// `s3dma local --upstream`: the stack stands in front of an existing S3
/// cluster (Ceph's radosgw from Debian's packages) as the user the AWS
/// variables name: what `put` writes is in the cluster, `get` reads it back
/// through the gateway; without credentials it says what is missing.
#[test]
fn local_mode_in_front_of_an_existing_cluster() {
    let ceph = s3dma_launcher::harness::Ceph::shared();
    let creds = ("AKIACLIUPSTREAM", "cli-upstream-secret-8x");
    let sdk = ceph.user("cli-upstream", creds);
    let dir = tempfile::tempdir().unwrap();
    let o = run(
        Command::new(&*S3DMA)
            .args(["local", "--upstream", &ceph.endpoint, "--dir"])
            .arg(dir.path().join("nocreds"))
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY"),
        None,
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("AWS_ACCESS_KEY_ID"), "{err}");

    let local = Local::start_cmd(dir.path(), false, |c| {
        c.args(["--upstream", &ceph.endpoint, "--bucket", "cli-upstream"])
            .env("AWS_ACCESS_KEY_ID", creds.0)
            .env("AWS_SECRET_ACCESS_KEY", creds.1)
            .env_remove("AWS_SESSION_TOKEN");
    });
    let data = pattern((5 << 20) + 1);
    let src = dir.path().join("src");
    std::fs::write(&src, &data).unwrap();
    ok(&local.s3dma(&["put", src.to_str().unwrap(), "s3://cli-upstream/k"]));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stored = rt
        .block_on(s3dma_testkit::get_as(&sdk, "cli-upstream", "k"))
        .expect("the object in Ceph");
    assert!(stored[..] == data[..], "the object in Ceph differs");
    for _ in 0..2 {
        let out = local.s3dma(&["get", "s3://cli-upstream/k", "-"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout == data, "the object read back differs");
    }
    // The secret is kept private, and nothing printed it.
    let secret = dir.path().join("state/secrets/upstream.secret");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), creds.1);
    assert!(!local.stdout.contains(creds.1));
}
