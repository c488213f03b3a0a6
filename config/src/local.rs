//! Where `s3dma local` keeps its state and its socket by default: shared by
//! the launcher (which creates them) and the tenant CLI (which finds the
//! socket without being told), so the CLI needs no launcher.

use std::ffi::OsString;
use std::path::PathBuf;

/// `$XDG_DATA_HOME/s3dma/local`, else `$HOME/.local/share/s3dma/local`
/// (relative or empty values are ignored, as the XDG spec says): the state
/// directory of `s3dma local`.
#[must_use]
pub fn default_dir(xdg_data_home: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    let abs = |v: Option<OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(d) = abs(xdg_data_home) {
        return Some(d.join("s3dma").join("local"));
    }
    abs(home).map(|h| h.join(".local/share/s3dma/local"))
}

/// `$XDG_RUNTIME_DIR/s3dma/shim.sock`, else `/tmp/s3dma-<uid>/shim.sock`:
/// the socket of `s3dma local`, and the tenant CLI's last resort when no
/// socket is named and `/run/s3dma/shim.sock` does not exist.
#[must_use]
pub fn default_socket(xdg_runtime_dir: Option<OsString>, uid: u32) -> PathBuf {
    match xdg_runtime_dir
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
    {
        Some(d) => d.join("s3dma").join("shim.sock"),
        None => PathBuf::from(format!("/tmp/s3dma-{uid}/shim.sock")),
    }
}
