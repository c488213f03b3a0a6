//! `s3dma local`: runs `s3dma-local` (the launcher's binary, which starts
//! storage-target, dpu-agent and host-shim on this machine) in place of this
//! process. It is looked for beside the running `s3dma` first (both come out
//! of one `cargo build --bins` or one install), then on `PATH`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::commands::Failure;

/// The launcher's binary name.
const LOCAL_BIN: &str = "s3dma-local";

/// `s3dma-local` beside the running executable, else the bare name (found
/// on `PATH` by `exec`).
fn local_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(LOCAL_BIN)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(LOCAL_BIN))
}

/// Replaces this process with `s3dma-local [--socket PATH] ARGS...`;
/// returns only when that could not be done.
pub(crate) fn exec(socket: Option<&Path>, args: &[OsString]) -> Failure {
    let bin = local_binary();
    let mut cmd = Command::new(&bin);
    if let Some(s) = socket {
        cmd.arg("--socket").arg(s);
    }
    cmd.args(args);
    let err = cmd.exec();
    Failure::Other(format!(
        "local: cannot run {} ({err}); it is built with the other binaries \
         (`cargo build --release --locked --bins`) and installed beside s3dma",
        bin.display()
    ))
}
