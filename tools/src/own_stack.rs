//! [`OwnStack`]: a stack (storage-target, dpu-agent, host-shim) a bench
//! starts in a temporary directory, with its store on /dev/shm when it has
//! room.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use s3dma_launcher::{Stack, StackOptions};

use crate::options::{BUCKET, Options};

/// A stack the bench started, with the temporary directories it lives in.
pub(crate) struct OwnStack {
    pub stack: Stack,
    /// Where the storage-target keeps its data.
    pub data_dir: PathBuf,
    _tmp: tempfile::TempDir,
    shm_dir: Option<tempfile::TempDir>,
}

impl OwnStack {
    /// Starts storage-target, dpu-agent and host-shim in a temporary
    /// directory; the store goes on /dev/shm when it has `store_bytes` free
    /// (fsyncs would make PUTs on both paths measure the disk), unless
    /// `--data-dir` names a place.
    pub(crate) async fn start(opts: &Options, store_bytes: u64) -> anyhow::Result<OwnStack> {
        let tmp = temp_dir("s3dma-bench-")?;
        let mut shm_dir = None;
        let data_dir = match &opts.data_dir {
            Some(d) => s3dma_launcher::absolute(d.clone())?,
            None if free_bytes(Path::new("/dev/shm")).is_some_and(|f| f >= store_bytes) => {
                let d = tempfile::Builder::new()
                    .prefix("s3dma-bench-")
                    .tempdir_in("/dev/shm")
                    .context("creating a directory in /dev/shm")?;
                let p = d.path().to_path_buf();
                shm_dir = Some(d);
                p
            }
            None => tmp.path().join("data"),
        };
        let stack = start_stack(tmp.path(), "s3dma-tools bench", |o| {
            o.data_dir = Some(data_dir.clone());
            o.bucket = BUCKET.into();
            o.fabric = opts.fabric;
            o.protocol = opts.protocol;
        })
        .await?;
        Ok(OwnStack {
            stack,
            data_dir,
            _tmp: tmp,
            shm_dir,
        })
    }

    /// Stops the services, then removes the store.
    pub(crate) async fn stop(mut self) {
        self.stack.stop().await;
        drop(self.shm_dir.take());
    }
}

/// A temporary directory whose name starts with `prefix`.
pub(crate) fn temp_dir(prefix: &str) -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .context("creating a temporary directory")
}

/// Prepares and starts a stack under `dir` (state in `dir/state`, the
/// shim's socket `dir/shim.sock`), with metrics on (read around each
/// measurement: where a request's time goes, from each service's own
/// latency histogram) and `tune`'s changes to the options; a stack that
/// fails to start is stopped.
pub(crate) async fn start_stack(
    dir: &Path,
    who: &'static str,
    tune: impl FnOnce(&mut StackOptions),
) -> anyhow::Result<Stack> {
    let mut options = StackOptions::new(dir.join("state"), dir.join("shim.sock"), who);
    options.metrics = true;
    tune(&mut options);
    let mut stack = Stack::prepare(options)?;
    if let Err(e) = stack.start().await {
        stack.stop().await;
        return Err(e.into());
    }
    Ok(stack)
}

/// Free bytes of the file system holding `p`.
fn free_bytes(p: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(p).ok()?;
    s.blocks_available().checked_mul(s.fragment_size())
}
