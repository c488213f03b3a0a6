//! Files: private secrets, config overlays, logs.

use std::path::{Path, PathBuf};

/// Writes a secret file (token, key) as the services require: mode 0600
/// (also when it existed with another mode).
///
/// # Panics
/// When it cannot be written.
pub fn write_private(path: &Path, content: impl AsRef<[u8]>) {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .unwrap();
    f.write_all(content.as_ref()).unwrap();
}

/// `base` with the keys of the YAML mapping `yaml` (a test's snippet, e.g.
/// `chunk_size: 1MiB`) set over it; the result is read back into `T`, so an
/// unknown key fails here.
///
/// # Panics
/// `yaml` is not a mapping, or the result is not a valid `T`.
pub fn overlay<T: serde::Serialize + serde::de::DeserializeOwned>(base: &T, yaml: &str) -> T {
    let mut v = serde_yaml::to_value(base).unwrap();
    if !yaml.trim().is_empty() {
        let extra: serde_yaml::Mapping = serde_yaml::from_str(yaml)
            .unwrap_or_else(|e| panic!("{yaml:?} is not a YAML mapping: {e}"));
        let map = v.as_mapping_mut().unwrap();
        for (k, x) in extra {
            map.insert(k, x);
        }
    }
    serde_yaml::from_value(v).unwrap_or_else(|e| panic!("{yaml:?}: {e}"))
}

/// A log file's text so far (empty when it does not exist yet).
#[must_use]
pub fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Every regular file under `dir`, recursively.
#[must_use]
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Writes `config` to `path` as YAML, mode 0600 ([`write_private`]).
///
/// # Panics
/// When it cannot be serialized or written.
pub fn write_yaml<T: serde::Serialize>(path: &Path, config: &T) {
    let body = serde_yaml::to_string(config).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    write_private(path, body);
}
