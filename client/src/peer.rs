//! Who serves the shim's socket: the client checks the server's uid
//! (`SO_PEERCRED`) on every connection it makes, before it sends a byte.
//!
//! Anyone who can create the socket's path (a directory in `/tmp` made
//! first by another user, a stale path after the shim stopped) could serve
//! a fake shim there: it would receive the memfds of `put` (the file's
//! bytes) and write what it likes into `get` buffers. A shim runs as root,
//! as the system user [`SYSTEM_SHIM_USER`] (the packaged systemd unit's; only
//! root can create that account) or, in local mode, as the tenant itself;
//! any other uid is refused unless the caller names it
//! ([`crate::ClientOptions::shim_uid`] or `$S3DMA_SHIM_UID`, which then
//! replace the default).

use std::path::Path;

use tokio::net::UnixStream;

use crate::error::{Error, ErrorKind};

/// Environment variable naming the uid (a number or a user name) the shim
/// runs as, when it is neither root nor the connecting user.
pub const SHIM_UID_ENV: &str = "S3DMA_SHIM_UID";

/// The system user the packaged host-shim runs as; trusted by default when
/// it exists.
pub(crate) const SYSTEM_SHIM_USER: &str = "s3dma-shim";

/// Where the accepted uid besides root came from (for error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    /// The connecting user's own effective uid (local mode).
    Caller,
    /// `$S3DMA_SHIM_UID` (its text).
    Env(String),
    /// [`crate::ClientOptions::shim_uid`].
    Option,
}

/// The uids allowed to serve the socket: root and one more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Policy {
    uid: u32,
    source: Source,
    /// The uid of [`SYSTEM_SHIM_USER`], when no uid was named.
    system: Option<u32>,
}

impl Policy {
    /// `option` if given, else `$S3DMA_SHIM_UID` if set (and not empty),
    /// else the caller's effective uid.
    pub(crate) fn resolve(option: Option<u32>) -> Result<Policy, Error> {
        if let Some(uid) = option {
            return Ok(Policy {
                uid,
                source: Source::Option,
                system: None,
            });
        }
        match std::env::var_os(SHIM_UID_ENV) {
            Some(v) if !v.is_empty() => {
                let text = v.to_string_lossy().into_owned();
                let uid = resolve_uid(&text).map_err(|e| {
                    Error::new(
                        ErrorKind::InvalidArgument,
                        "InvalidArgument",
                        format!("${SHIM_UID_ENV}: {}", e.message),
                    )
                })?;
                Ok(Policy {
                    uid,
                    source: Source::Env(text),
                    system: None,
                })
            }
            _ => Ok(Policy {
                uid: caller_uid(),
                source: Source::Caller,
                system: nix::unistd::User::from_name(SYSTEM_SHIM_USER)
                    .ok()
                    .flatten()
                    .map(|u| u.uid.as_raw()),
            }),
        }
    }

    /// Whether a server running as `uid` is trusted.
    pub(crate) fn allows(&self, uid: u32) -> bool {
        uid == 0 || uid == self.uid || self.system == Some(uid)
    }

    fn expected(&self) -> String {
        let mut uids = if self.uid == 0 {
            "uid 0".to_owned()
        } else {
            format!("uid 0 or {}", self.uid)
        };
        if let Some(s) = self.system {
            uids.push_str(&format!(" or {s} ({SYSTEM_SHIM_USER})"));
        }
        match &self.source {
            Source::Caller => {
                format!("{uids} (set {SHIM_UID_ENV} if the shim runs as another user)")
            }
            Source::Env(text) => format!("{uids} (from {SHIM_UID_ENV}={text})"),
            Source::Option => format!("{uids} (the configured shim uid)"),
        }
    }

    /// Checks who serves `stream` (connected to `socket`).
    pub(crate) fn check(&self, stream: &UnixStream, socket: &Path) -> Result<(), Error> {
        let cred = stream.peer_cred().map_err(|e| {
            Error::new(
                ErrorKind::UntrustedShim,
                "UntrustedShim",
                format!(
                    "cannot tell who serves the socket {} (SO_PEERCRED: {e}); refusing to use it",
                    socket.display()
                ),
            )
        })?;
        if self.allows(cred.uid()) {
            return Ok(());
        }
        let pid = cred
            .pid()
            .filter(|p| *p > 0)
            .map(|p| format!(" (pid {p})"))
            .unwrap_or_default();
        Err(Error::new(
            ErrorKind::UntrustedShim,
            "UntrustedShim",
            format!(
                "the socket {} is served by uid {}{pid}, expected {}; nothing was sent to it",
                socket.display(),
                cred.uid(),
                self.expected()
            ),
        ))
    }
}

/// The effective uid of this process: what the shim sees of the caller.
pub(crate) fn caller_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// A uid given as a number (`1001`) or a user name (`s3dma`, looked up in
/// the user database).
///
/// # Errors
/// [`ErrorKind::InvalidArgument`] for an empty text, an unknown user or a
/// failed lookup.
pub fn resolve_uid(text: &str) -> Result<u32, Error> {
    let text = text.trim();
    if text.is_empty() {
        return Err(Error::invalid("an empty uid or user name"));
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse()
            .map_err(|_| Error::invalid(format!("uid {text} is out of range")));
    }
    match nix::unistd::User::from_name(text) {
        Ok(Some(u)) => Ok(u.uid.as_raw()),
        Ok(None) => Err(Error::invalid(format!(
            "no user called {text:?} (give a uid number or an existing user name)"
        ))),
        Err(e) => Err(Error::invalid(format!("looking up user {text:?}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_and_names_resolve() {
        assert_eq!(resolve_uid("1001").unwrap(), 1001);
        assert_eq!(resolve_uid(" 0 ").unwrap(), 0);
        assert_eq!(resolve_uid("root").unwrap(), 0);
        let e = resolve_uid("no-such-user-s3dma").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("no-such-user-s3dma"), "{e}");
        assert!(resolve_uid("").is_err());
        assert!(resolve_uid("99999999999").is_err());
    }

    #[test]
    fn root_and_the_expected_uid_are_allowed() {
        let p = Policy::resolve(Some(1001)).unwrap();
        assert!(p.allows(0));
        assert!(p.allows(1001));
        assert!(!p.allows(1002));
        assert!(
            p.expected().starts_with("uid 0 or 1001"),
            "{}",
            p.expected()
        );
        let p = Policy {
            uid: 0,
            source: Source::Caller,
            system: None,
        };
        assert!(p.allows(0));
        assert!(!p.allows(65534));
        assert!(p.expected().starts_with("uid 0 (set S3DMA_SHIM_UID"));
        // The packaged shim's system user, when it exists.
        let p = Policy {
            uid: 1000,
            source: Source::Caller,
            system: Some(998),
        };
        assert!(p.allows(998) && p.allows(1000) && p.allows(0));
        assert!(!p.allows(65534));
        assert!(
            p.expected()
                .starts_with("uid 0 or 1000 or 998 (s3dma-shim)"),
            "{}",
            p.expected()
        );
    }

    #[tokio::test]
    async fn a_socketpair_is_served_by_ourselves() {
        let (a, _b) = UnixStream::pair().unwrap();
        let me = caller_uid();
        Policy::resolve(Some(me))
            .unwrap()
            .check(&a, Path::new("/x.sock"))
            .unwrap();
        let other = me.wrapping_add(1).max(1);
        let r = Policy::resolve(Some(other))
            .unwrap()
            .check(&a, Path::new("/x.sock"));
        if me == 0 {
            // Root is always trusted.
            r.unwrap();
        } else {
            let e = r.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::UntrustedShim);
            let text = e.to_string();
            assert!(text.contains(&format!("served by uid {me}")), "{text}");
            assert!(
                text.contains(&format!("expected uid 0 or {other}")),
                "{text}"
            );
        }
    }
}
