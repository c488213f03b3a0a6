//! Service processes for tests, on [`s3dma_service::child`] (the one
//! implementation, which `s3dma local` uses too), with panicking helpers
//! that work from synchronous code and from inside any test's runtime: the
//! children are driven on the kit's own tokio runtime.

use std::ffi::OsString;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::Signal;
use s3dma_service::child::{ChildProcess, Stopped};

/// How long a service may take to print each of its ready lines (a
/// storage-target rebuilds its listing index first; the Soft-RoCE VM's CPUs
/// are slow).
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("s3dma-testkit")
            .enable_all()
            .build()
            .expect("the test kit's runtime")
    })
}

/// Runs `f` to completion on the kit's runtime and returns its output;
/// callable from any thread, also from a task of another runtime (that
/// thread blocks until `f` is done). A panic in `f` is resumed here.
///
/// # Panics
/// When `f` panics.
pub fn block_on<F>(f: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let task = runtime().spawn(f);
    runtime().spawn(async move {
        let _ = tx.send(task.await);
    });
    match rx.recv().expect("the test kit's runtime stopped") {
        Ok(v) => v,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("test kit task: {e}"),
    }
}

/// `bin` as a command, run through `wrap` (e.g. `ip netns exec NS`, or
/// `sh -c 'umask 077; exec "$0" "$@"'`) when it is not empty.
#[must_use]
pub fn wrapped(wrap: &[String], bin: &Path) -> Command {
    match wrap.split_first() {
        None => Command::new(bin),
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin);
            c
        }
    }
}

/// A child process started by [`Process::start`]; SIGKILLed (and reaped)
/// when dropped.
#[derive(Debug)]
pub struct Process {
    inner: Option<ChildProcess>,
}

impl Process {
    /// Starts `cmd` with stderr appended to `log` and stdout piped, and
    /// reads stdout until the process printed a line starting with each of
    /// `ready`, in that order (each within [`READY_TIMEOUT`]); returns it
    /// and the rest of each of those lines, trimmed. Its stdout lines go to
    /// `stdout_log` (appended) when given, else nowhere.
    ///
    /// # Panics
    /// When the process does not start, or exits (or stays silent) before
    /// printing them; the message has its log's tail. `what` names it.
    pub fn start(
        cmd: Command,
        what: &str,
        log: &Path,
        ready: &[&str],
        stdout_log: Option<PathBuf>,
    ) -> (Process, Vec<String>) {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        let (what, log) = (what.to_owned(), log.to_path_buf());
        let ready: Vec<String> = ready.iter().map(|r| (*r).to_owned()).collect();
        let (child, lines) = block_on(async move {
            let mut c = ChildProcess::spawn(cmd, what, log, stderr, stdout_log)
                .unwrap_or_else(|e| panic!("{e}"));
            let mut found = Vec::new();
            for prefix in &ready {
                let v = c
                    .wait_for_prefix(prefix, READY_TIMEOUT)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                found.push(v);
            }
            c.drain();
            (c, found)
        });
        (Process { inner: Some(child) }, lines)
    }

    /// Its process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.inner.as_ref().map_or(0, ChildProcess::pid)
    }

    /// Sends `sig`.
    pub fn signal(&self, sig: Signal) {
        if let Some(c) = &self.inner {
            c.signal(sig);
        }
    }

    /// Its exit status if it has exited, without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.inner.as_mut()?.exited().ok().flatten()
    }

    /// SIGKILL, and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.inner.take() {
            block_on(async move { c.kill().await });
        }
    }

    /// SIGTERM, and waits up to `grace` for it to exit (then SIGKILL);
    /// returns its exit status, `None` when it had to be killed.
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        let mut c = self.inner.take()?;
        match block_on(async move { c.stop(grace).await }) {
            Stopped::Exited(s) => Some(s),
            Stopped::Killed => None,
        }
    }

    /// Waits (up to `limit`) for it to exit by itself; `None` when it is
    /// still running then.
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<ExitStatus> {
        let mut c = self.inner.take()?;
        let (c, status) = block_on(async move {
            let s = tokio::time::timeout(limit, c.wait()).await;
            (c, s)
        });
        match status {
            Ok(Ok(s)) => Some(s),
            _ => {
                self.inner = Some(c);
                None
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// How to start a service binary: `BIN --config CONFIG` (through `wrap`),
/// with stderr appended to `log` and its ready lines awaited.
#[derive(Debug, Clone)]
pub struct ServiceSpec {
    /// Its name in messages (`storage-target`, …).
    pub name: String,
    /// The binary.
    pub bin: PathBuf,
    /// Its configuration file (`--config`).
    pub config: PathBuf,
    /// Its stderr log.
    pub log: PathBuf,
    /// Where its stdout goes (none: nowhere).
    pub stdout_log: Option<PathBuf>,
    /// The prefixes of the stdout lines that say it is ready, in order
    /// (e.g. `storage-target listening on `, `metrics on `).
    pub ready: Vec<String>,
    /// A command prefix it runs under ([`wrapped`]).
    pub wrap: Vec<String>,
    /// More arguments after `--config CONFIG`.
    pub args: Vec<OsString>,
    /// Environment variables (e.g. `RUST_LOG`).
    pub env: Vec<(String, String)>,
}

impl ServiceSpec {
    /// `bin --config config`, stderr to `log`, ready after the lines
    /// starting with `ready`.
    #[must_use]
    pub fn new(
        name: &str,
        bin: PathBuf,
        config: PathBuf,
        log: PathBuf,
        ready: &[&str],
    ) -> ServiceSpec {
        ServiceSpec {
            name: name.to_owned(),
            bin,
            config,
            log,
            stdout_log: None,
            ready: ready.iter().map(|r| (*r).to_owned()).collect(),
            wrap: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    /// Adds an environment variable.
    #[must_use]
    pub fn env(mut self, k: &str, v: &str) -> ServiceSpec {
        self.env.push((k.to_owned(), v.to_owned()));
        self
    }
}

/// A service process that can be killed and started again on the same
/// configuration: the one wrapper of a service binary for tests
/// (storage-target's own tests and the end-to-end harness use it).
#[derive(Debug)]
pub struct Service {
    /// How it is started.
    pub spec: ServiceSpec,
    proc: Option<Process>,
    /// The rest of each ready line of the last start (e.g. its address).
    pub lines: Vec<String>,
}

impl Service {
    /// Starts it.
    ///
    /// # Panics
    /// As [`Process::start`]; also when the binary is missing.
    #[must_use]
    pub fn start(spec: ServiceSpec) -> Service {
        let mut s = Service {
            spec,
            proc: None,
            lines: Vec::new(),
        };
        s.spawn();
        s
    }

    /// Starts it again (after [`Service::kill9`] or an exit).
    ///
    /// # Panics
    /// As [`Service::start`].
    pub fn spawn(&mut self) {
        let s = &self.spec;
        assert!(
            s.bin.exists(),
            "{} is missing: build the workspace's binaries first (`cargo build --bins`; `cargo test --workspace` does)",
            s.bin.display()
        );
        let mut cmd = wrapped(&s.wrap, &s.bin);
        cmd.arg("--config")
            .arg(&s.config)
            .args(&s.args)
            .envs(s.env.iter().map(|(k, v)| (k, v)));
        let ready: Vec<&str> = s.ready.iter().map(String::as_str).collect();
        let (p, lines) = Process::start(cmd, &s.name, &s.log, &ready, s.stdout_log.clone());
        self.proc = Some(p);
        self.lines = lines;
    }

    /// The rest of ready line `i` of the last start.
    #[must_use]
    pub fn line(&self, i: usize) -> &str {
        &self.lines[i]
    }

    /// Its process id (`None` while it is not running).
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Process::pid)
    }

    /// The process, while it runs.
    pub fn process(&mut self) -> Option<&mut Process> {
        self.proc.as_mut()
    }

    /// SIGKILL, and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }

    /// SIGTERM and waits up to `grace` for a clean exit; returns whether it
    /// exited with status 0.
    pub fn terminate(&mut self, grace: Duration) -> bool {
        self.proc
            .take()
            .and_then(|mut p| p.terminate(grace))
            .is_some_and(|s| s.success())
    }

    /// SIGKILL, then starts it again on the same configuration.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Its log (stderr) so far.
    #[must_use]
    pub fn log(&self) -> String {
        super::read_log(&self.spec.log)
    }
}
