//! Where things live under a state directory, and the secrets kept there.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use s3dma_service::private;

use crate::LaunchError;

pub use s3dma_config::local::{default_dir, default_socket};

/// Where things live under the state directory.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The state directory itself.
    pub dir: PathBuf,
    /// The storage-target's data directory.
    pub data_dir: PathBuf,
    /// One log file per child.
    pub logs_dir: PathBuf,
    /// The secret files (0700 directory, 0600 files).
    pub secrets_dir: PathBuf,
    /// The tenant's S3 access key id.
    pub access_key_file: PathBuf,
    /// The tenant's S3 secret access key.
    pub secret_key_file: PathBuf,
    /// The shim's bearer token towards the agent.
    pub shim_token_file: PathBuf,
    /// The pre-shared fabric key (64 hex digits).
    pub fabric_key_file: PathBuf,
    /// Generated storage-target configuration.
    pub target_config: PathBuf,
    /// Generated dpu-agent configuration.
    pub agent_config: PathBuf,
    /// Generated host-shim configuration.
    pub shim_config: PathBuf,
    /// The fabric the generated configurations name (default `tcp`).
    pub fabric: fabric::Backend,
    /// The dialect the agent speaks to the storage-target (default
    /// `s3dma`; `hipobj-rc-v2` runs the bytes through the shim's queue
    /// pairs on a verbs device).
    pub protocol: dpu_agent::config::RdmaProtocol,
}

impl Layout {
    /// The layout under `dir` (which should be absolute).
    #[must_use]
    pub fn new(dir: &Path) -> Layout {
        let secrets = dir.join("secrets");
        Layout {
            dir: dir.to_path_buf(),
            data_dir: dir.join("data"),
            logs_dir: dir.join("logs"),
            access_key_file: secrets.join("tenant.access-key-id"),
            secret_key_file: secrets.join("tenant.secret"),
            shim_token_file: secrets.join("shim.token"),
            fabric_key_file: secrets.join("fabric.key"),
            secrets_dir: secrets,
            target_config: dir.join("storage-target.yaml"),
            agent_config: dir.join("dpu-agent.yaml"),
            shim_config: dir.join("host-shim.yaml"),
            fabric: fabric::Backend::Tcp,
            protocol: dpu_agent::config::RdmaProtocol::S3dma,
        }
    }

    /// The log file of the service called `name`.
    #[must_use]
    pub fn log(&self, name: &str) -> PathBuf {
        self.logs_dir.join(format!("{name}.log"))
    }

    /// Reads the secrets, creating the missing ones (0600 files in a 0700
    /// directory): the tenant's S3 access key id and secret access key, the
    /// shim's bearer token and the fabric key.
    ///
    /// # Errors
    /// An unusable secrets directory, an unreadable or empty secret file.
    pub fn prepare_secrets(&self) -> Result<Secrets, LaunchError> {
        private_dir(&self.secrets_dir)?;
        let access_key_id = ensure_secret(&self.access_key_file, || {
            format!("S3DMALOCAL{}", random_hex(5).to_uppercase())
        })?;
        let secret_access_key = ensure_secret(&self.secret_key_file, || random_hex(20))?;
        ensure_secret(&self.shim_token_file, || random_hex(32))?;
        ensure_secret(&self.fabric_key_file, || random_hex(32))?;
        Ok(Secrets {
            access_key_id,
            secret_access_key,
        })
    }
}

impl Layout {
    /// [`Layout::prepare_secrets`] with the tenant's identity on an
    /// upstream S3 endpoint (`s3dma local --upstream`) instead of a
    /// generated one: written to `upstream.access-key-id` and
    /// `upstream.secret` (0600), which the configurations then name.
    ///
    /// # Errors
    /// The secrets directory or a file cannot be written.
    pub fn prepare_upstream_secrets(
        &mut self,
        access_key_id: &str,
        secret_access_key: &str,
    ) -> Result<Secrets, LaunchError> {
        self.prepare_secrets()?;
        self.access_key_file = self.secrets_dir.join("upstream.access-key-id");
        self.secret_key_file = self.secrets_dir.join("upstream.secret");
        write_private(&self.access_key_file, access_key_id)?;
        write_private(&self.secret_key_file, secret_access_key)?;
        Ok(Secrets {
            access_key_id: access_key_id.to_owned(),
            secret_access_key: secret_access_key.to_owned(),
        })
    }
}

/// The tenant's S3 credentials, read from (or created in) the secrets
/// directory. `Debug` does not show the secret.
#[derive(Clone)]
pub struct Secrets {
    /// The S3 access key id.
    pub access_key_id: String,
    /// The S3 secret access key.
    pub secret_access_key: String,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::fill(&mut buf[..]);
    hex::encode(buf)
}

/// Reads the secret in `path`, or creates it (0600) with `make()`.
fn ensure_secret(path: &Path, make: impl FnOnce() -> String) -> Result<String, LaunchError> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut f) => {
            let value = make();
            f.write_all(value.as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(LaunchError::io(format!("writing {}", path.display())))?;
            Ok(value)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = fs::metadata(path)
                .map_err(LaunchError::io(format!("reading {}", path.display())))?;
            if meta.permissions().mode() & 0o077 != 0 {
                fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(
                    LaunchError::io(format!("making {} private (0600)", path.display())),
                )?;
            }
            let value = fs::read_to_string(path)
                .map_err(LaunchError::io(format!("reading {}", path.display())))?
                .trim()
                .to_owned();
            if value.is_empty() {
                return Err(LaunchError::Unusable(format!(
                    "{} is empty; delete it to have a new one generated",
                    path.display()
                )));
            }
            Ok(value)
        }
        Err(e) => Err(LaunchError::io(format!("creating {}", path.display()))(e)),
    }
}

/// Makes `dir` private: created 0700 (parents as needed) when missing,
/// tightened to 0700 when more open; refused when it is a symlink or belongs
/// to someone else.
pub(crate) fn private_dir(dir: &Path) -> Result<(), LaunchError> {
    private::ensure_private_dir(dir).map_err(|error| LaunchError::Private {
        error,
        hint: "; pick another directory with --dir or --socket",
    })
}

/// Writes a 0600 file (an existing one is tightened; a symlink is not
/// followed).
pub(crate) fn write_private(path: &Path, text: &str) -> Result<(), LaunchError> {
    private::write_private_file(path, text.as_bytes())
        .map_err(|error| LaunchError::Private { error, hint: "" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_xdg() {
        assert_eq!(
            default_dir(Some("/x/data".into()), Some("/home/u".into())).unwrap(),
            Path::new("/x/data/s3dma/local")
        );
        assert_eq!(
            default_dir(Some("relative".into()), Some("/home/u".into())).unwrap(),
            Path::new("/home/u/.local/share/s3dma/local")
        );
        assert_eq!(
            default_dir(None, Some("/home/u".into())).unwrap(),
            Path::new("/home/u/.local/share/s3dma/local")
        );
        assert!(default_dir(None, None).is_none());
        assert_eq!(
            default_socket(Some("/run/user/1000".into()), 1000),
            Path::new("/run/user/1000/s3dma/shim.sock")
        );
        assert_eq!(
            default_socket(None, 1000),
            Path::new("/tmp/s3dma-1000/shim.sock")
        );
        assert_eq!(
            default_socket(Some("".into()), 7),
            Path::new("/tmp/s3dma-7/shim.sock")
        );
    }

    #[test]
    fn secrets_are_private_and_reused() {
        let d = tempfile::tempdir().unwrap();
        let l = Layout::new(d.path());
        let a = l.prepare_secrets().unwrap();
        let b = l.prepare_secrets().unwrap();
        assert_eq!(a.access_key_id, b.access_key_id);
        assert_eq!(a.secret_access_key, b.secret_access_key);
        let key = fs::read_to_string(&l.fabric_key_file).unwrap();
        assert_eq!(key.len(), 64);
        assert!(key.bytes().all(|c| c.is_ascii_hexdigit()));
        for f in [
            &l.access_key_file,
            &l.secret_key_file,
            &l.shim_token_file,
            &l.fabric_key_file,
        ] {
            let mode = fs::metadata(f).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", f.display());
        }
        let mode = fs::metadata(&l.secrets_dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert!(!format!("{a:?}").contains(&a.secret_access_key));
    }
}
