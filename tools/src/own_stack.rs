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
        let tmp = tempfile::Builder::new()
            .prefix("s3dma-bench-")
            .tempdir()
            .context("creating a temporary directory")?;
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
        let mut stack = Stack::prepare(StackOptions {
            dir: tmp.path().join("state"),
            data_dir: Some(data_dir.clone()),
            socket: tmp.path().join("shim.sock"),
            own_socket_dir: true,
            bucket: BUCKET.into(),
            // Read around each small-object cell: where a request's time
            // goes, from each service's own latency histogram.
            metrics: true,
            who: "s3dma-tools bench",
            bin_dir: None,
            fabric: opts.fabric,
            upstream: None,
            protocol: opts.protocol,
        })?;
        if let Err(e) = stack.start().await {
            stack.stop().await;
            return Err(e.into());
        }
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

/// Free bytes of the file system holding `p`.
fn free_bytes(p: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(p).ok()?;
    s.blocks_available().checked_mul(s.fragment_size())
}
