//! The file-descriptor budget: every service raises its soft
//! `RLIMIT_NOFILE` to the hard limit at start, then refuses to start when
//! the descriptors its caps allow (connections per listener, tenants'
//! buffers, ...) exceed it, so that no client can make it run out of
//! descriptors (and fail other clients' requests) while staying within its
//! caps.

/// Why the descriptor budget does not fit.
#[derive(Debug, thiserror::Error)]
pub enum FdLimitError {
    /// `getrlimit` failed.
    #[error("cannot read RLIMIT_NOFILE: {0}")]
    Read(nix::Error),
    /// The caps need more descriptors than the limit allows.
    #[error(
        "{what} need up to {need} file descriptors but RLIMIT_NOFILE is {limit}; raise it (LimitNOFILE= in the systemd unit, ulimit -n) or lower {lower}"
    )]
    TooLow {
        /// What needs them, and how they are counted.
        what: String,
        /// Descriptors needed.
        need: u64,
        /// The limit (after raising the soft limit to the hard one).
        limit: u64,
        /// Which settings to lower.
        lower: String,
    },
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (when it may) and
/// returns the limit now in force.
///
/// # Errors
/// [`FdLimitError::Read`].
pub fn raise_limit() -> Result<u64, FdLimitError> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(FdLimitError::Read)?;
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return Ok(hard);
    }
    Ok(soft)
}

/// Raises the limit ([`raise_limit`]) and checks that `need` descriptors
/// fit; returns the limit.
///
/// # Errors
/// [`FdLimitError::TooLow`] naming `what` needs them and which settings to
/// `lower`.
pub fn check(need: u64, what: &str, lower: &str) -> Result<u64, FdLimitError> {
    let limit = raise_limit()?;
    if need > limit {
        return Err(FdLimitError::TooLow {
            what: what.to_owned(),
            need,
            limit,
            lower: lower.to_owned(),
        });
    }
    Ok(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_over_the_limit_is_refused_with_what_to_change() {
        let limit = raise_limit().unwrap();
        assert_eq!(check(limit, "x", "y").unwrap(), limit);
        let e = check(
            limit + 1,
            "the caps (2 × max_connections)",
            "max_connections",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(&format!(
                "the caps (2 × max_connections) need up to {} file descriptors but RLIMIT_NOFILE is {limit}",
                limit + 1
            )) && e.ends_with("or lower max_connections"),
            "{e}"
        );
    }
}
