//! Child service processes, the one implementation every launcher of the
//! services uses (`s3dma local`'s stack and the test kit): a binary
//! started with stdout piped and stderr going to a log file, read until it
//! announces itself (`storage-target listening on ADDR`, `metrics on URL`,
//! …), the rest of its stdout copied on (or dropped) so the pipe never
//! fills, stopped with SIGTERM and then SIGKILL, and the tail of its log
//! for error messages.
//!
//! Async, on tokio: a [`ChildProcess`] must be polled (waited for, read)
//! on a runtime with its I/O and signal drivers (`tokio::main` and the
//! test kit's runtime have them).

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::{Instant, sleep, timeout};

/// How many lines of its log a [`ChildError::Failed`] quotes.
pub const TAIL_LINES: usize = 20;

/// Why a child could not be started, or did not become ready.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChildError {
    /// Starting or waiting for it failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// It exited, closed its stdout or did not answer in time.
    #[error("{message}; {tail}")]
    Failed {
        /// The child's name.
        name: String,
        /// What happened.
        message: String,
        /// The tail of its log (or a note that the log is empty).
        tail: String,
    },
}

/// How [`ChildProcess::stop`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// It had already exited, or exited after SIGTERM, with this status.
    Exited(ExitStatus),
    /// It did not exit within the grace period and was sent SIGKILL.
    Killed,
}

/// A started child process.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Child,
    pid: u32,
    log: PathBuf,
    stdout: Option<Lines<BufReader<ChildStdout>>>,
    stdout_log: Option<PathBuf>,
}

/// The last `n` lines of `text`.
#[must_use]
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl ChildProcess {
    /// Starts `cmd` with stdin from `/dev/null`, stdout piped and stderr
    /// into `stderr`, a file opened by the caller (its path, `log`, is
    /// what error messages quote). The stdout lines it reads go to
    /// `stdout_log` (appended; it may be `log` itself), or nowhere when
    /// `None`. `name` names the child in messages.
    ///
    /// # Errors
    /// The program cannot be started.
    pub fn spawn(
        mut cmd: Command,
        name: impl Into<String>,
        log: PathBuf,
        stderr: File,
        stdout_log: Option<PathBuf>,
    ) -> Result<ChildProcess, ChildError> {
        let name = name.into();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .map_err(|source| ChildError::Io {
                what: format!(
                    "starting {name} ({})",
                    cmd.as_std().get_program().to_string_lossy()
                ),
                source,
            })?;
        let pid = child.id().unwrap_or(0);
        let stdout = child.stdout.take().map(|s| BufReader::new(s).lines());
        Ok(ChildProcess {
            name,
            child,
            pid,
            log,
            stdout,
            stdout_log,
        })
    }

    /// Its name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its log file (stderr).
    #[must_use]
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last [`TAIL_LINES`] lines of its log, introduced, for a message.
    #[must_use]
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let t = tail(&text, TAIL_LINES);
        if t.is_empty() {
            format!("(its log {} is empty)", self.log.display())
        } else {
            format!("last lines of {}:\n{t}", self.log.display())
        }
    }

    /// An error naming it, with `message` and the tail of its log.
    #[must_use]
    pub fn fail(&self, message: String) -> ChildError {
        ChildError::Failed {
            name: self.name.clone(),
            message,
            tail: self.log_tail(),
        }
    }

    /// "NAME WHEN (STATUS)" as an error with its log's tail.
    #[must_use]
    pub fn died(&self, status: ExitStatus, when: &str) -> ChildError {
        self.fail(format!("{} {when} ({status})", self.name))
    }

    fn copy_line(&self, line: &str) {
        if let Some(path) = &self.stdout_log {
            append_line(path, line);
        }
    }

    /// Reads its stdout until `parse` accepts a line (every line read goes
    /// where stdout goes) and returns what `parse` made of it.
    ///
    /// # Errors
    /// It exits or closes its stdout first, or `limit` passes.
    pub async fn wait_for_line<T>(
        &mut self,
        limit: Duration,
        mut parse: impl FnMut(&str) -> Option<T>,
    ) -> Result<T, ChildError> {
        let deadline = Instant::now() + limit;
        let Some(mut lines) = self.stdout.take() else {
            return Err(self.fail(format!("{}: its stdout is not readable", self.name)));
        };
        let result = loop {
            tokio::select! {
                line = lines.next_line() => match line {
                    Ok(Some(line)) => {
                        self.copy_line(&line);
                        if let Some(v) = parse(&line) {
                            break Ok(v);
                        }
                    }
                    Ok(None) | Err(_) => {
                        // Stdout closed: it is exiting.
                        let status = timeout(Duration::from_secs(5), self.child.wait()).await;
                        break Err(match status {
                            Ok(Ok(s)) => self.died(s, "exited during start-up"),
                            _ => self.fail(format!("{} closed its stdout during start-up", self.name)),
                        });
                    }
                },
                status = self.child.wait() => {
                    break Err(match status {
                        Ok(s) => self.died(s, "exited during start-up"),
                        Err(source) => ChildError::Io { what: format!("waiting for {}", self.name), source },
                    });
                }
                () = tokio::time::sleep_until(deadline) => {
                    break Err(self.fail(format!("{} did not start within {} s", self.name, limit.as_secs())));
                }
            }
        };
        self.stdout = Some(lines);
        result
    }

    /// Reads its stdout until a line starting with `prefix`; returns the
    /// rest of that line, trimmed.
    ///
    /// # Errors
    /// As [`ChildProcess::wait_for_line`].
    pub async fn wait_for_prefix(
        &mut self,
        prefix: &str,
        limit: Duration,
    ) -> Result<String, ChildError> {
        self.wait_for_line(limit, |l| l.trim().strip_prefix(prefix).map(str::to_owned))
            .await
    }

    /// From now on a task copies the rest of its stdout where stdout goes
    /// (or drops it), so the pipe never fills. Call it on a tokio runtime.
    pub fn drain(&mut self) {
        let Some(mut lines) = self.stdout.take() else {
            return;
        };
        let to = self.stdout_log.clone();
        tokio::spawn(async move {
            let mut f = to.and_then(|p| {
                std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(p)
                    .ok()
            });
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(f) = f.as_mut() {
                    let _ = writeln!(f, "{line}");
                }
            }
        });
    }

    /// Polls until something accepts connections on the Unix socket
    /// `socket`.
    ///
    /// # Errors
    /// It exits first, or `limit` passes.
    pub async fn wait_for_socket(
        &mut self,
        socket: &Path,
        limit: Duration,
    ) -> Result<(), ChildError> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.exited()? {
                return Err(self.died(status, "exited during start-up"));
            }
            if tokio::net::UnixStream::connect(socket).await.is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.fail(format!(
                    "{} did not open {} within {} s",
                    self.name,
                    socket.display(),
                    limit.as_secs()
                )));
            }
            sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its exit status if it has exited (reaping it), without waiting.
    ///
    /// # Errors
    /// The status cannot be read.
    pub fn exited(&mut self) -> Result<Option<ExitStatus>, ChildError> {
        self.child.try_wait().map_err(|source| ChildError::Io {
            what: format!("waiting for {}", self.name),
            source,
        })
    }

    /// Sends `sig` (while it has not been reaped).
    pub fn signal(&self, sig: Signal) {
        if let Ok(pid) = i32::try_from(self.pid)
            && pid > 0
        {
            let _ = kill(Pid::from_raw(pid), sig);
        }
    }

    /// Waits for it to exit.
    ///
    /// # Errors
    /// The status cannot be read.
    pub async fn wait(&mut self) -> Result<ExitStatus, ChildError> {
        self.child.wait().await.map_err(|source| ChildError::Io {
            what: format!("waiting for {}", self.name),
            source,
        })
    }

    /// SIGTERM, then SIGKILL when it has not exited after `grace`; reaps it.
    pub async fn stop(&mut self, grace: Duration) -> Stopped {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Stopped::Exited(status);
        }
        self.signal(Signal::SIGTERM);
        match timeout(grace, self.child.wait()).await {
            Ok(Ok(status)) => Stopped::Exited(status),
            _ => {
                self.kill().await;
                Stopped::Killed
            }
        }
    }

    /// SIGKILL, and reaps it.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}

fn append_line(path: &Path, line: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
        assert_eq!(tail("", 5), "");
    }

    #[tokio::test]
    async fn ready_line_then_stop() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo noise; echo 'svc listening on 1.2.3.4:5'; echo oops >&2; exec sleep 30",
        ]);
        // Appending, as the callers open it: stderr's writes and the copied
        // stdout lines share the file without overwriting each other.
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let mut c =
            ChildProcess::spawn(cmd, "svc", log.clone(), stderr, Some(log.clone())).unwrap();
        let addr = c
            .wait_for_prefix("svc listening on ", Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(addr, "1.2.3.4:5");
        c.drain();
        assert!(matches!(
            c.stop(Duration::from_secs(5)).await,
            Stopped::Exited(_)
        ));
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("noise"), "{text}");
    }

    #[tokio::test]
    async fn exit_before_ready() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo broken >&2; exit 3"]);
        let stderr = File::create(&log).unwrap();
        let mut c = ChildProcess::spawn(cmd, "svc", log, stderr, None).unwrap();
        let e = c
            .wait_for_prefix("svc listening on ", Duration::from_secs(10))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("svc exited during start-up") && e.contains("broken"),
            "{e}"
        );
    }
}
