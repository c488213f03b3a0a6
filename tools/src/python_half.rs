//! What the benches' Python halves (`ml_bench.py`, `kv_bench.py`) run
//! with: which Python, its `PYTHONPATH`, and the stack they are pointed at.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context as _, anyhow, bail};
use serde_json::{Map, Value};
use tokio::io::AsyncReadExt as _;

use crate::options::progress;
use crate::own_stack::OwnStack;

/// What the Python half is pointed at.
pub(crate) struct Target {
    /// The host-shim's socket.
    pub(crate) socket: PathBuf,
    /// The storage-target's S3 URL.
    pub(crate) url: String,
    /// The stack's bucket.
    pub(crate) bucket: String,
    /// The S3 user's access key id.
    pub(crate) key_id: String,
    /// Its secret.
    pub(crate) secret: String,
    /// The host-shim's pid (0 when unknown), for its CPU time.
    pub(crate) shim_pid: u32,
}

impl Target {
    /// The stack `started` runs.
    pub(crate) fn of(started: &OwnStack) -> Target {
        let stack = &started.stack;
        let ep = stack.endpoints();
        let (key_id, secret) = stack.credentials();
        Target {
            socket: ep.socket.clone(),
            url: ep.target_url.clone(),
            bucket: stack.bucket().to_owned(),
            key_id: key_id.to_owned(),
            secret: secret.to_owned(),
            shim_pid: stack
                .services()
                .iter()
                .find(|s| s.name == "host-shim")
                .map_or(0, |s| s.pid),
        }
    }
}

/// The Python the ML and KV phases use: `$S3DMA_PYTHON`, else the checkout's
/// `.venv/bin/python` (this binary lives in `<repo>/target/<profile>/`),
/// else `python3`.
pub(crate) fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("S3DMA_PYTHON").filter(|p| !p.is_empty()) {
        return p.into();
    }
    repo_root()
        .map(|root| root.join(".venv/bin/python"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| "python3".into())
}

/// The checkout this binary was built in, when it runs from there.
fn repo_root() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .find(|dir| dir.join("python/s3dma/__init__.py").is_file())
        .map(Path::to_path_buf)
}

/// `<repo>/python` first (the client and plug-ins measured are
/// the checkout's), then the caller's `$PYTHONPATH`.
pub(crate) fn python_path() -> std::ffi::OsString {
    let mut parts: Vec<PathBuf> = repo_root()
        .map(|root| root.join("python"))
        .into_iter()
        .collect();
    if let Some(old) = std::env::var_os("PYTHONPATH") {
        parts.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(parts).unwrap_or_default()
}

/// One run of a phase's Python half.
pub(crate) struct Half<'a> {
    /// The phase, in messages ("ML", "KV").
    pub(crate) phase: &'a str,
    /// The script, run with `python -c`.
    pub(crate) script: &'a str,
    /// What the Python must have installed, for the error when it cannot
    /// start.
    pub(crate) needs: &'a str,
    /// The phase's own environment, after the stack's.
    pub(crate) env: Vec<(&'a str, String)>,
}

impl Half<'_> {
    /// Runs the script against `target` with `python` (its stderr goes to
    /// ours) and returns the JSON object of its last `{...}` line.
    ///
    /// # Errors
    /// It cannot start, exits unsuccessfully or prints no JSON object.
    pub(crate) async fn run(
        &self,
        target: &Target,
        python: &Path,
    ) -> anyhow::Result<Map<String, Value>> {
        progress(&format!(
            "running the {} phase with {}",
            self.phase,
            python.display()
        ));
        let mut cmd = tokio::process::Command::new(python);
        cmd.arg("-c")
            .arg(self.script)
            .env("S3DMA_SOCKET", &target.socket)
            .env("S3DMA_BENCH_ENDPOINT", &target.url)
            .env("S3DMA_BENCH_BUCKET", &target.bucket)
            // From a checkout, the integrations measured are the
            // checkout's (not an older copy installed in the venv).
            .env("PYTHONPATH", python_path())
            .env("AWS_ACCESS_KEY_ID", &target.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &target.secret)
            .env("AWS_DEFAULT_REGION", s3dma_launcher::REGION)
            .env("AWS_REGION", s3dma_launcher::REGION);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "starting {} (set $S3DMA_PYTHON to a Python with {})",
                    python.display(),
                    self.needs
                )
            })?;
        let mut stdout = String::new();
        child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("no stdout from {}", python.display()))?
            .read_to_string(&mut stdout)
            .await?;
        let status = child.wait().await?;
        if !status.success() {
            bail!(
                "the {} phase ({}) failed ({status}); its errors are above",
                self.phase,
                python.display()
            );
        }
        let line = stdout
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'))
            .ok_or_else(|| anyhow!("the {} phase printed no JSON line: {stdout:?}", self.phase))?;
        serde_json::from_str(line)
            .with_context(|| format!("the {} phase's JSON line {line:?}", self.phase))
    }
}
