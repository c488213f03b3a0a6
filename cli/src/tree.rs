//! What the recursive commands (`get --recursive`, `put --recursive`,
//! `sync`) decide, with no I/O: how keys map to local paths and back, which
//! keys are unsafe to write, the `--include`/`--exclude` filters, which
//! files a sync copies, and how downloads are cut into transfers.
//!
//! The Python twins (`s3dma.download_prefix`, `s3dma.upload_dir`) follow
//! the same rules.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use globset::{Glob, GlobMatcher};

/// A listing prefix as the recursive commands use it: a non-empty prefix
/// not ending in `/` gets one (`s3://b/models` means everything under
/// `models/`, as `aws s3 cp --recursive` reads it).
#[must_use]
pub(crate) fn directory_prefix(key: &str) -> String {
    if key.is_empty() || key.ends_with('/') {
        key.to_owned()
    } else {
        format!("{key}/")
    }
}

/// Where a listed key goes under the destination directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyPlace {
    /// The relative path (one component per `/`-separated part).
    File(PathBuf),
    /// Nothing to write: the prefix itself, or a directory marker (a key
    /// ending in `/`).
    Skip,
    /// A key that would escape the directory or cannot be a file name.
    Unsafe(&'static str),
}

/// The longest file name component most filesystems take.
const NAME_MAX: usize = 255;

/// Maps `relative` (a key with the prefix removed) to a relative local
/// path, refusing anything that could land outside the directory or is no
/// sane file name: empty, `.` or `..` components, a leading `/`, NUL bytes,
/// control characters (U+0000..U+001F, U+007F..U+009F), over-long names.
#[must_use]
pub(crate) fn key_place(relative: &str) -> KeyPlace {
    if relative.is_empty() || relative.ends_with('/') {
        return KeyPlace::Skip;
    }
    if relative.starts_with('/') {
        return KeyPlace::Unsafe("it starts with /");
    }
    if relative.contains('\0') {
        return KeyPlace::Unsafe("it contains a NUL byte");
    }
    // C0, DEL and C1 controls: a file name holding them turns into terminal
    // escapes, line breaks and such in every later `ls` or script.
    if relative.chars().any(char::is_control) {
        return KeyPlace::Unsafe("it contains a control character");
    }
    let mut path = PathBuf::new();
    for part in relative.split('/') {
        match part {
            "" => return KeyPlace::Unsafe("it has an empty path component (//)"),
            "." | ".." => return KeyPlace::Unsafe("it has a . or .. path component"),
            p if p.len() > NAME_MAX => {
                return KeyPlace::Unsafe("a path component is longer than 255 bytes");
            }
            p => path.push(p),
        }
    }
    // Belt and braces: only plain components may remain.
    if path.components().all(|c| matches!(c, Component::Normal(_))) {
        KeyPlace::File(path)
    } else {
        KeyPlace::Unsafe("it is not a plain relative path")
    }
}

/// The key for a file at `relative` (a path under the source directory):
/// `prefix` + its components joined by `/`; `None` when a component is not
/// UTF-8.
#[must_use]
pub(crate) fn key_for(prefix: &str, relative: &Path) -> Option<String> {
    let mut key = prefix.to_owned();
    for (i, c) in relative.components().enumerate() {
        let Component::Normal(name) = c else {
            return None;
        };
        if i > 0 {
            key.push('/');
        }
        key.push_str(name.to_str()?);
    }
    Some(key)
}

/// `/`-separated form of a relative path, for filters and messages
/// (`None` when not UTF-8).
#[must_use]
pub(crate) fn slash_name(relative: &Path) -> Option<String> {
    key_for("", relative)
}

/// The temporary name a download is written under, in the destination's
/// directory, before it is renamed into place. A long name is shortened so
/// that the temporary one stays within [`NAME_MAX`] bytes.
#[must_use]
pub(crate) fn temp_name(file_name: &std::ffi::OsStr, nonce: u64) -> OsString {
    use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
    let suffix = format!(".s3dma-{nonce:016x}.tmp");
    let room = NAME_MAX - 1 - suffix.len();
    let name = file_name.as_bytes();
    let mut tmp = Vec::with_capacity(NAME_MAX);
    tmp.push(b'.');
    tmp.extend_from_slice(&name[..name.len().min(room)]);
    tmp.extend_from_slice(suffix.as_bytes());
    OsString::from_vec(tmp)
}

/// Whether a file name is one of [`temp_name`]'s (never uploaded, never
/// deleted by `--delete`).
#[must_use]
pub(crate) fn is_temp_name(file_name: &str) -> bool {
    let Some(rest) = file_name.strip_prefix('.') else {
        return false;
    };
    let Some(rest) = rest.strip_suffix(".tmp") else {
        return false;
    };
    let Some((name, nonce)) = rest.rsplit_once(".s3dma-") else {
        return false;
    };
    !name.is_empty() && nonce.len() == 16 && nonce.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `--include` / `--exclude` in the order given: everything is included at
/// first and the last rule that matches a name decides (the aws CLI's
/// rule). `*` matches across `/`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filters {
    rules: Vec<(bool, GlobMatcher)>,
}

/// One `--include` or `--exclude` as given on the command line, with its
/// position (clap keeps each flag's values apart; the positions restore
/// their order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FilterArg {
    /// Where on the command line it was.
    pub position: usize,
    /// `true` for `--include`.
    pub include: bool,
    /// The glob.
    pub glob: String,
}

/// An `--include`/`--exclude` glob that does not parse: `--exclude "[": why`.
#[derive(Debug)]
pub(crate) struct BadGlob {
    include: bool,
    glob: String,
    source: globset::Error,
}

impl std::fmt::Display for BadGlob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let flag = if self.include { "include" } else { "exclude" };
        write!(f, "--{flag} {:?}: {}", self.glob, self.source)
    }
}

impl std::error::Error for BadGlob {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl Filters {
    /// Builds the filters from the arguments, ordered by position.
    ///
    /// # Errors
    /// A glob that does not parse ([`BadGlob`]: its text and why).
    pub(crate) fn new(mut args: Vec<FilterArg>) -> Result<Filters, BadGlob> {
        args.sort_by_key(|a| a.position);
        let mut rules = Vec::with_capacity(args.len());
        for a in args {
            let glob = Glob::new(&a.glob).map_err(|source| BadGlob {
                include: a.include,
                glob: a.glob.clone(),
                source,
            })?;
            rules.push((a.include, glob.compile_matcher()));
        }
        Ok(Filters { rules })
    }

    /// Whether `name` (a `/`-separated relative name) takes part.
    #[must_use]
    pub(crate) fn includes(&self, name: &str) -> bool {
        self.rules
            .iter()
            .rev()
            .find(|(_, m)| m.is_match(name))
            .is_none_or(|(include, _)| *include)
    }
}

/// Size and modification time (whole seconds since the epoch) of one side
/// of a sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// Bytes.
    pub size: u64,
    /// Seconds since the epoch (an object's LastModified, a file's mtime).
    pub secs: i64,
}

/// Whether a sync copies a source entry over what the destination has:
/// nothing there, a different size, or a newer source (whole seconds: a
/// downloaded file's mtime is set to its object's LastModified, and an
/// upload's LastModified is never older than the file, so a second sync
/// copies nothing).
#[must_use]
pub(crate) fn sync_copies(source: Stamp, destination: Option<Stamp>) -> bool {
    match destination {
        None => true,
        Some(d) => source.size != d.size || source.secs > d.secs,
    }
}

/// One object of a recursive download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wanted {
    /// The key.
    pub key: String,
    /// Its size (from the listing).
    pub size: u64,
    /// Its ETag (from the listing): every GET of it carries `If-Match`.
    pub etag: String,
    /// LastModified, milliseconds since the epoch.
    pub modified_ms: i64,
    /// Where it goes (relative to the destination directory).
    pub path: PathBuf,
}

/// One transfer of a recursive download: it fills one buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fetch {
    /// Bytes `first..first + len` of a large object (index into the list);
    /// `parts` fetches make up the object.
    Range {
        /// Index of the object.
        object: usize,
        /// First byte.
        first: u64,
        /// Bytes.
        len: u64,
    },
    /// Several small objects whole, one after another in one buffer (one
    /// `GetObjects` call).
    Batch(Vec<usize>),
}

/// Cuts a download into transfers of at most `chunk` bytes: objects larger
/// than `batch_max_object` go as ranges of `chunk`, the others are packed
/// in list order into batches of at most `chunk` bytes and `batch_items`
/// objects. Empty objects go in batches too (they need no bytes).
#[must_use]
pub(crate) fn plan_fetches(
    sizes: &[u64],
    chunk: u64,
    batch_max_object: u64,
    batch_items: usize,
) -> Vec<Fetch> {
    let chunk = chunk.max(1);
    let small = batch_max_object.min(chunk);
    let mut out = Vec::new();
    let mut batch: Vec<usize> = Vec::new();
    let mut batch_bytes = 0u64;
    for (i, &size) in sizes.iter().enumerate() {
        if size > small {
            for (first, len) in crate::url::chunks(0, size, chunk) {
                out.push(Fetch::Range {
                    object: i,
                    first,
                    len,
                });
            }
            continue;
        }
        if !batch.is_empty() && (batch_bytes + size > chunk || batch.len() >= batch_items) {
            out.push(Fetch::Batch(std::mem::take(&mut batch)));
            batch_bytes = 0;
        }
        batch.push(i);
        batch_bytes += size;
    }
    if !batch.is_empty() {
        out.push(Fetch::Batch(batch));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_name_directories() {
        assert_eq!(directory_prefix(""), "");
        assert_eq!(directory_prefix("models"), "models/");
        assert_eq!(directory_prefix("models/"), "models/");
    }

    #[test]
    fn keys_map_to_paths_inside_the_directory() {
        assert_eq!(
            key_place("a/b c/ü.json"),
            KeyPlace::File(PathBuf::from("a").join("b c").join("ü.json"))
        );
        assert_eq!(key_place(""), KeyPlace::Skip);
        assert_eq!(key_place("dir/"), KeyPlace::Skip);
        for bad in [
            "../escape",
            "a/../../b",
            "a//b",
            "./x",
            "a/.",
            "/abs",
            "nul\0byte",
        ] {
            assert!(
                matches!(key_place(bad), KeyPlace::Unsafe(_)),
                "{bad:?} must be refused"
            );
        }
        for ctl in [
            "bell\u{7}",
            "new\nline",
            "cr\rx",
            "tab\tx",
            "esc\u{1b}]0;title\u{7}",
            "del\u{7f}",
            "c1\u{9b}31m",
            "dir\u{1}/x",
        ] {
            assert_eq!(
                key_place(ctl),
                KeyPlace::Unsafe("it contains a control character"),
                "{ctl:?}"
            );
        }
        // Other non-ASCII, even invisible or bidi characters, are names.
        assert!(matches!(key_place("a\u{a0}b/\u{202e}x"), KeyPlace::File(_)));
        assert!(matches!(key_place(&"n".repeat(256)), KeyPlace::Unsafe(_)));
        assert!(matches!(key_place(&"n".repeat(255)), KeyPlace::File(_)));
        // Dots inside names are fine.
        assert!(matches!(key_place("..a/b..c/...d"), KeyPlace::File(_)));
    }

    #[test]
    fn paths_map_back_to_keys() {
        let rel = Path::new("a").join("b c").join("ü.json");
        assert_eq!(key_for("m/", &rel).as_deref(), Some("m/a/b c/ü.json"));
        assert_eq!(key_for("", &rel).as_deref(), Some("a/b c/ü.json"));
        assert_eq!(slash_name(Path::new("x")).as_deref(), Some("x"));
        use std::os::unix::ffi::OsStrExt as _;
        let bad = Path::new(std::ffi::OsStr::from_bytes(b"a/\xff"));
        assert_eq!(key_for("", bad), None);
    }

    #[test]
    fn temp_names_are_recognised() {
        let t = temp_name(std::ffi::OsStr::new("model.safetensors"), 0xabc);
        let t = t.to_str().unwrap();
        assert_eq!(t, ".model.safetensors.s3dma-0000000000000abc.tmp");
        assert!(is_temp_name(t));
        let long = "x".repeat(255);
        let t = temp_name(std::ffi::OsStr::new(&long), 1);
        assert_eq!(t.len(), 255);
        assert!(is_temp_name(t.to_str().unwrap()));
        for not in [
            "model.safetensors",
            ".x.s3dma-12.tmp",
            "x.s3dma-0000000000000abc.tmp",
            "..s3dma-0000000000000abc.tmp",
            ".x.s3dma-000000000000zabc.tmp",
        ] {
            assert!(!is_temp_name(not), "{not}");
        }
    }

    fn filters(args: &[(bool, &str)]) -> Filters {
        Filters::new(
            args.iter()
                .enumerate()
                .map(|(position, (include, glob))| FilterArg {
                    position,
                    include: *include,
                    glob: (*glob).to_owned(),
                })
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn the_last_matching_filter_decides() {
        let none = filters(&[]);
        assert!(none.includes("anything/at/all"));
        let f = filters(&[(false, "*"), (true, "*.json")]);
        assert!(f.includes("config.json"));
        assert!(f.includes("sub/dir/x.json"), "* matches across /");
        assert!(!f.includes("model.safetensors"));
        let f = filters(&[(true, "*.json"), (false, "*")]);
        assert!(!f.includes("config.json"));
        let f = filters(&[(false, "ckpt-?/*"), (true, "ckpt-1/*")]);
        assert!(f.includes("ckpt-1/a"));
        assert!(!f.includes("ckpt-2/a"));
        assert!(f.includes("ckpt-10/a"));
        // Positions, not argument kinds, give the order.
        let f = Filters::new(vec![
            FilterArg {
                position: 3,
                include: true,
                glob: "*.json".into(),
            },
            FilterArg {
                position: 1,
                include: false,
                glob: "*".into(),
            },
        ])
        .unwrap();
        assert!(f.includes("a.json") && !f.includes("a.bin"));
        let e = Filters::new(vec![FilterArg {
            position: 0,
            include: false,
            glob: "[".into(),
        }])
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("--exclude \"[\""), "{e}");
    }

    #[test]
    fn sync_copies_missing_different_or_newer() {
        let s = |size, secs| Stamp { size, secs };
        assert!(sync_copies(s(1, 10), None));
        assert!(sync_copies(s(1, 10), Some(s(2, 10))));
        assert!(sync_copies(s(1, 11), Some(s(1, 10))));
        assert!(!sync_copies(s(1, 10), Some(s(1, 10))));
        assert!(!sync_copies(s(1, 9), Some(s(1, 10))));
    }

    #[test]
    fn downloads_are_cut_into_ranges_and_batches() {
        use Fetch::*;
        // chunk 10, objects over 4 bytes go as ranges, at most 3 per batch
        let plan = plan_fetches(&[3, 0, 25, 4, 4, 4, 4, 1], 10, 4, 3);
        assert_eq!(
            plan,
            vec![
                Range {
                    object: 2,
                    first: 0,
                    len: 10
                },
                Range {
                    object: 2,
                    first: 10,
                    len: 10
                },
                Range {
                    object: 2,
                    first: 20,
                    len: 5
                },
                Batch(vec![0, 1, 3]),
                Batch(vec![4, 5]),
                Batch(vec![6, 7]),
            ]
        );
        assert_eq!(plan_fetches(&[], 10, 4, 3), vec![]);
        // A small-object limit above the chunk is capped by the chunk.
        assert_eq!(plan_fetches(&[10, 10], 10, 100, 8).len(), 2);
    }
}
