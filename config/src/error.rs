//! The one shape of a configuration error.

/// Why a program's configuration file could not be loaded (every service).
/// The message always starts with the file's path and never contains a
/// secret: `<file>: cannot read: ...`, `<file>: <serde message>` or
/// `<file>: <field.path>: <problem>`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file itself could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The configuration file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Malformed YAML, an unknown field, a missing field or a value of the
    /// wrong type.
    #[error("{file}: {message}")]
    Parse {
        /// The configuration file.
        file: String,
        /// serde_yaml's message, which names the field, the line and the column.
        message: String,
    },
    /// A field has an invalid value, or a file it names cannot be used.
    #[error("{file}: {field}: {message}")]
    Invalid {
        /// The configuration file.
        file: String,
        /// Path of the offending field, e.g. `targets[0].endpoint`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl ConfigError {
    /// A [`ConfigError::Invalid`]: `file: field: problem` (the problem is
    /// any error or message; its `Display` is kept).
    #[must_use]
    pub fn invalid(
        file: impl Into<String>,
        field: impl Into<String>,
        problem: impl std::fmt::Display,
    ) -> ConfigError {
        ConfigError::Invalid {
            file: file.into(),
            field: field.into(),
            message: problem.to_string(),
        }
    }

    /// The offending field's path, for [`ConfigError::Invalid`].
    #[must_use]
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            ConfigError::Read { .. } | ConfigError::Parse { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_field_problem() {
        let e = ConfigError::invalid("a.yaml", "metrics.address", "must differ");
        assert_eq!(e.to_string(), "a.yaml: metrics.address: must differ");
        assert_eq!(e.field(), Some("metrics.address"));
    }
}
