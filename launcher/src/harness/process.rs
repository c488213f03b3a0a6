//! Service processes: started with stdout piped and read until they
//! announce themselves (`<service> listening on ADDR`, then `metrics on
//! URL`), stderr appended to a log, and killed (and reaped) on demand.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Starts `cmd` with stderr appended to `log` and stdout piped, and reads
/// stdout until the process printed a line starting with each of `ready`,
/// in that order; returns the child and the rest of each of those lines,
/// trimmed. What it prints after them is copied to `stdout_log` (created
/// anew) when given, else discarded, by a thread, so the pipe never fills.
///
/// # Panics
/// When the process does not start, or exits before printing them (the
/// message has its log); `what` names it.
pub fn spawn_service(
    cmd: &mut Command,
    what: &str,
    log: &Path,
    ready: &[&str],
    stdout_log: Option<PathBuf>,
) -> (Child, Vec<String>) {
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("{what} did not start ({:?}): {e}", cmd.get_program()));
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let found = ready
        .iter()
        .map(|prefix| wait_line(&mut out, prefix, what, log))
        .collect();
    std::thread::spawn(move || match stdout_log {
        Some(path) => {
            use std::io::Write as _;
            let mut f = std::fs::File::create(path).unwrap();
            for l in out.lines().map_while(Result::ok) {
                let _ = writeln!(f, "{l}");
            }
        }
        None => for _ in out.lines() {},
    });
    (child, found)
}

/// Sends `sig` to the process (when there is one), reaps it, and forgets
/// it.
pub fn stop_service(child: &mut Option<Child>, sig: nix::sys::signal::Signal) {
    if let Some(c) = child.as_mut() {
        let pid = nix::unistd::Pid::from_raw(c.id() as i32);
        let _ = nix::sys::signal::kill(pid, sig);
        let _ = c.wait();
    }
    *child = None;
}

/// A log file's text so far (empty when it does not exist yet).
pub fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Reads lines from a child's stdout until `prefix` is found; returns the rest.
fn wait_line(out: &mut impl BufRead, prefix: &str, what: &str, log: &Path) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).unwrap();
        if n == 0 {
            panic!(
                "{what} exited before printing {prefix:?}; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if let Some(rest) = line.trim().strip_prefix(prefix) {
            return rest.to_owned();
        }
    }
}
