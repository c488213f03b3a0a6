//! This test binary run again as a child, for one of its own `#[ignore]`d
//! tests: as another uid (a tenant, a stranger, an impostor shim), or as a
//! separate process to kill.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A copy of the running test binary in `dir` that any uid can execute
/// (a new file per call, so no other thread is still writing it).
///
/// # Panics
/// When it cannot be copied.
#[must_use]
pub fn executable_copy(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    static N: AtomicU32 = AtomicU32::new(0);
    let exe = std::env::current_exe().unwrap();
    let copy = dir.join(format!(
        "test-bin-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::copy(&exe, &copy).unwrap_or_else(|e| panic!("{}: {e}", copy.display()));
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy
}

/// A command running this test binary's `#[ignore]`d test `name` (the
/// full path, e.g. `shim::e2e::child_as_bob`; exactly that one, output not
/// captured, one thread) from a copy in `dir`, with `dir` as its working
/// directory and `HOME`, as `uid` when given.
#[must_use]
pub fn self_test_command(dir: &Path, uid: Option<u32>, name: &str) -> Command {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = Command::new(executable_copy(dir));
    cmd.args([
        name,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .current_dir(dir)
    .env("HOME", dir);
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    cmd
}

/// Spawns `cmd`, retrying while its freshly copied binary is "busy": a
/// child forked meanwhile by another test thread may still hold the copy's
/// write fd until it execs.
///
/// # Panics
/// When it cannot be started otherwise.
pub fn spawn_retrying(cmd: &mut Command) -> Child {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Ok(c) => return c,
            Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) && tries < 500 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("starting {cmd:?}: {e}"),
        }
    }
}

/// Whether this process may act as another uid (it is root); otherwise
/// the test `test` is skipped with a note saying `why`, unless `CI` is set
/// (CI runs as root and must run it).
///
/// # Panics
/// Not root while `CI` is set.
#[must_use]
pub fn root_or_skip(test: &str, why: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test} needs root ({why}), and CI is set"
    );
    eprintln!("skipping {test}: it needs root ({why})");
    false
}

/// This test binary's ignored test `test` running as another uid in a
/// directory of its own (owned by that uid), told where its socket and its
/// events file are by two environment variables; started once the test
/// wrote `ready` to the events file. Killed when dropped.
#[derive(Debug)]
pub struct ChildAsUser {
    child: Child,
    /// The socket the child serves (`DIR/shim.sock`).
    pub socket: PathBuf,
    /// The file the child notes its events in, one a line.
    pub events: PathBuf,
    _dir: tempfile::TempDir,
}

impl ChildAsUser {
    /// Starts it as `uid`, passing the socket's path in `$socket_env` and
    /// the events file's in `$events_env`, and waits (60 s at most) for
    /// its `ready` line.
    ///
    /// # Panics
    /// When it exits or is not ready in time.
    #[must_use]
    pub fn start(uid: u32, test: &str, socket_env: &str, events_env: &str) -> ChildAsUser {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid)).unwrap();
        let socket = dir.path().join("shim.sock");
        let events = dir.path().join("events");
        let mut cmd = self_test_command(dir.path(), Some(uid), test);
        cmd.env(socket_env, &socket)
            .env(events_env, &events)
            .stdin(std::process::Stdio::null());
        let child = spawn_retrying(&mut cmd);
        let mut me = ChildAsUser {
            child,
            socket,
            events,
            _dir: dir,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !me.events().contains("ready") {
            if let Some(status) = me.child.try_wait().unwrap() {
                panic!("{test} as uid {uid} exited: {status}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{test} as uid {uid} did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        me
    }

    /// Its events so far.
    #[must_use]
    pub fn events(&self) -> String {
        std::fs::read_to_string(&self.events).unwrap_or_default()
    }
}

impl Drop for ChildAsUser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
