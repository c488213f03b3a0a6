//! [`Validator`]: the checks every service's configuration runs, each
//! failing with a [`ConfigError::Invalid`] that names the file and the field.

use std::fmt;
use std::path::Path;

use crate::{ByteSize, ConfigError, Secret};

/// The result of one check: `Ok`, or the error naming the offending field.
pub type Check = Result<(), ConfigError>;

/// Builds `<file>: <field.path>: <problem>` errors for one configuration
/// file and holds the range, path and file checks the services share.
///
/// Validation stops at the first offending field (every check returns a
/// [`Check`] to propagate with `?`), so an operator fixes one thing at a
/// time and the message names exactly one field path, e.g.
/// `tenants[1].quotas.max_concurrent_requests`.
#[derive(Debug, Clone)]
pub struct Validator {
    file: String,
}

impl Validator {
    /// A validator whose errors name `file`.
    #[must_use]
    pub fn new(file: impl Into<String>) -> Validator {
        Validator { file: file.into() }
    }

    /// A validator whose errors name the file at `path`.
    #[must_use]
    pub fn for_path(path: &Path) -> Validator {
        Validator::new(path.display().to_string())
    }

    /// The file the errors name.
    #[must_use]
    pub fn file(&self) -> &str {
        &self.file
    }

    /// `<file>: <field>: <problem>`.
    #[must_use]
    pub fn err(&self, field: impl Into<String>, problem: impl fmt::Display) -> ConfigError {
        ConfigError::invalid(self.file.clone(), field, problem)
    }

    /// `value` is at least `min`: `must be at least {min}, got {value}`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `field`.
    pub fn at_least(&self, field: &str, value: u64, min: u64) -> Check {
        if value < min {
            return Err(self.err(field, format!("must be at least {min}, got {value}")));
        }
        Ok(())
    }

    /// `value` is within `min..=max`: `must be between {min} and {max}, got {value}`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `field`.
    pub fn between(&self, field: &str, value: u64, min: u64, max: u64) -> Check {
        if !(min..=max).contains(&value) {
            return Err(self.err(
                field,
                format!("must be between {min} and {max}, got {value}"),
            ));
        }
        Ok(())
    }

    /// A size within `min..=max` bytes, both written as sizes in the message:
    /// `must be between 64KiB and 1GiB, got 16KiB (16384 bytes)`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `field`.
    pub fn size_between(&self, field: &str, value: ByteSize, min: u64, max: u64) -> Check {
        if !(min..=max).contains(&value.0) {
            return Err(self.err(
                field,
                format!(
                    "must be between {} and {}, got {} ({} bytes)",
                    ByteSize(min),
                    ByteSize(max),
                    value,
                    value.0
                ),
            ));
        }
        Ok(())
    }

    /// A path that is not empty: `must not be empty`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `field`.
    pub fn non_empty_path(&self, field: &str, path: &Path) -> Check {
        if path.as_os_str().is_empty() {
            return Err(self.err(field, "must not be empty"));
        }
        Ok(())
    }

    /// `path` can be opened for reading and is a regular file (its content
    /// is not read): see [`crate::check_readable_file`].
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `field` and the path.
    pub fn readable(&self, field: &str, path: &Path) -> Check {
        crate::check_readable_file(path).map_err(|m| self.err(field, m))
    }

    /// Reads the secret file at `path` (see [`crate::read_secret_file`]):
    /// private, its content trimmed and not empty. Errors name the field and
    /// the path, never the content.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `field` and the path.
    pub fn read_secret(&self, field: &str, path: &Path) -> Result<Secret, ConfigError> {
        crate::read_secret_file(path).map_err(|m| self.err(field, m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v() -> Validator {
        Validator::new("a.yaml")
    }

    fn msg(c: Check) -> String {
        c.unwrap_err().to_string()
    }

    #[test]
    fn errors_name_file_and_field() {
        assert_eq!(v().file(), "a.yaml");
        assert_eq!(Validator::for_path(Path::new("/b.yaml")).file(), "/b.yaml");
        let e = v().err("x.y", "is wrong");
        assert_eq!(e.to_string(), "a.yaml: x.y: is wrong");
        assert_eq!(e.field(), Some("x.y"));
    }

    #[test]
    fn bounds() {
        assert!(v().at_least("n", 1, 1).is_ok());
        assert_eq!(
            msg(v().at_least("n", 0, 1)),
            "a.yaml: n: must be at least 1, got 0"
        );
        assert!(v().between("n", 5, 1, 5).is_ok());
        assert_eq!(
            msg(v().between("n", 6, 1, 5)),
            "a.yaml: n: must be between 1 and 5, got 6"
        );
        assert!(v().size_between("s", ByteSize(2048), 1024, 4096).is_ok());
        assert_eq!(
            msg(v().size_between("s", ByteSize(100), 1024, 1 << 20)),
            "a.yaml: s: must be between 1KiB and 1MiB, got 100B (100 bytes)"
        );
    }

    #[test]
    fn paths_and_files() {
        assert_eq!(
            msg(v().non_empty_path("p", Path::new(""))),
            "a.yaml: p: must not be empty"
        );
        assert!(v().non_empty_path("p", Path::new("/x")).is_ok());
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let e = msg(v().readable("f", &missing));
        assert!(e.starts_with("a.yaml: f: cannot read "), "{e}");
        let e = v().read_secret("s", &missing).unwrap_err().to_string();
        assert!(e.starts_with("a.yaml: s: "), "{e}");
    }
}
