//! What the benches' Python halves (`ml_bench.py`, `kv_bench.py`) run
//! with: which Python, its `PYTHONPATH`, and the stack they are pointed at.

use std::path::{Path, PathBuf};

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
        .find(|dir| dir.join("host-shim/python/s3dma/__init__.py").is_file())
        .map(Path::to_path_buf)
}

/// `<repo>/host-shim/python` first (the client and plug-ins measured are
/// the checkout's), then the caller's `$PYTHONPATH`.
pub(crate) fn python_path() -> std::ffi::OsString {
    let mut parts: Vec<PathBuf> = repo_root()
        .map(|root| root.join("host-shim/python"))
        .into_iter()
        .collect();
    if let Some(old) = std::env::var_os("PYTHONPATH") {
        parts.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(parts).unwrap_or_default()
}
