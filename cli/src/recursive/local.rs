//! The local tree the recursive commands read and write: the walk (no
//! links, no temporary files), opens that find only the file the walk saw,
//! and destinations reached through no symlink.

use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use crate::tree::{self, Stamp};

/// Fails when `dest` or a directory between `root` and it is a symlink
/// (or exists as something a file cannot be written through).
pub(super) fn check_no_symlinks(root: &Path, dest: &Path) -> io::Result<()> {
    let rel = dest
        .strip_prefix(root)
        .map_err(|_| io::Error::other("outside the directory"))?;
    let mut at = root.to_path_buf();
    for c in rel.components() {
        at.push(c);
        match fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(io::Error::other(format!(
                    "refusing to write through the symlink {}",
                    at.display()
                )));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What a directory holds, for the recursive commands.
#[derive(Debug, Default)]
pub(super) struct LocalTree {
    /// Every regular file, by relative `/` name, with its stamp and
    /// identity (our temporary files left out).
    pub(super) files: BTreeMap<String, (PathBuf, Stamp, FileId)>,
    /// Files whose names are not UTF-8 (no key can name them).
    pub(super) not_utf8: Vec<PathBuf>,
    /// Entries neither a directory nor a regular file (symlinks are never
    /// followed).
    pub(super) skipped: usize,
    /// The names of every entry that is not a directory, symlinks included
    /// (what `--delete` spares on the other side).
    pub(super) names: HashSet<String>,
}

/// Walks `root` (a missing one is empty).
pub(super) fn local_tree(root: &Path) -> io::Result<LocalTree> {
    let mut t = LocalTree::default();
    if !root.exists() {
        return Ok(t);
    }
    for entry in walkdir::WalkDir::new(root)
        .follow_links(false)
        .sort_by_file_name()
    {
        let entry = entry.map_err(io::Error::other)?;
        let ft = entry.file_type();
        if ft.is_dir() {
            continue;
        }
        let rel = entry
            .path()
            .strip_prefix(root)
            .map_err(io::Error::other)?
            .to_path_buf();
        let name = tree::slash_name(&rel);
        if let Some(n) = &name {
            t.names.insert(n.clone());
        }
        if !ft.is_file() {
            t.skipped += 1;
            continue;
        }
        if entry.file_name().to_str().is_some_and(tree::is_temp_name) {
            continue;
        }
        let Some(name) = name else {
            t.not_utf8.push(rel);
            continue;
        };
        let m = entry.metadata().map_err(io::Error::other)?;
        t.files.insert(
            name,
            (entry.path().to_path_buf(), stamp_of(&m), FileId::of(&m)),
        );
    }
    Ok(t)
}

/// Which file a walk saw: its device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    pub(super) fn of(m: &fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt as _;
        FileId {
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

/// Opens `path` for reading the way an upload must: without following a
/// symlink in its last component (`O_NOFOLLOW`; `O_NONBLOCK` so that a FIFO
/// swapped in cannot block the open), then checks with `fstat` that it is
/// a regular file and the one the walk recorded as `seen` (same device and
/// inode). A file replaced since the walk (by a symlink, a FIFO, another
/// file, or through a directory swapped for a link) is refused.
pub(super) fn open_seen(path: &Path, seen: FileId) -> io::Result<File> {
    use nix::fcntl::OFlag;
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits())
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(nix::errno::Errno::ELOOP as i32) {
                io::Error::other(format!(
                    "refusing to read through the symlink {} (it was a regular file when the directory was read)",
                    path.display()
                ))
            } else {
                e
            }
        })?;
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(io::Error::other(format!(
            "{} is no longer a regular file",
            path.display()
        )));
    }
    if FileId::of(&m) != seen {
        return Err(io::Error::other(format!(
            "{} was replaced by another file since the directory was read",
            path.display()
        )));
    }
    Ok(f)
}

pub(super) fn stamp_of(m: &fs::Metadata) -> Stamp {
    let secs = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    Stamp {
        size: m.len(),
        secs,
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    #[test]
    fn symlinks_under_the_root_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        fs::create_dir(root.join("real")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("link")).unwrap();
        assert!(check_no_symlinks(root, &root.join("real/x")).is_ok());
        assert!(check_no_symlinks(root, &root.join("new/dir/x")).is_ok());
        let e = check_no_symlinks(root, &root.join("link/x")).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
        std::os::unix::fs::symlink("/etc/passwd", root.join("real/f")).unwrap();
        assert!(check_no_symlinks(root, &root.join("real/f")).is_err());
    }

    /// An upload opens the file the walk saw, and nothing else: the same
    /// file read; a file swapped for a symlink after the walk recorded it
    /// (to a file the user may read, as an attacker would plant), for a
    /// FIFO, or for another regular file (rename over it) is refused.
    #[test]
    fn an_upload_opens_only_the_file_the_walk_saw() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        fs::write(r.join("f"), b"mine").unwrap();
        fs::write(r.join("g"), b"mine too").unwrap();
        fs::write(r.join("h"), b"and this").unwrap();
        let secret = tempfile::NamedTempFile::new().unwrap();
        fs::write(secret.path(), b"secret").unwrap();
        let t = local_tree(r).unwrap();
        let (path, _, id) = t.files["f"].clone();
        let mut back = String::new();
        open_seen(&path, id)
            .unwrap()
            .read_to_string(&mut back)
            .unwrap();
        assert_eq!(back, "mine");

        // f becomes a symlink to the secret between the walk and the open.
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(secret.path(), &path).unwrap();
        let e = open_seen(&path, id).unwrap_err();
        assert!(
            e.to_string()
                .contains("refusing to read through the symlink"),
            "{e}"
        );

        // g becomes a FIFO: refused without blocking.
        let (gpath, _, gid) = t.files["g"].clone();
        fs::remove_file(&gpath).unwrap();
        nix::unistd::mkfifo(&gpath, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = open_seen(&gpath, gid).unwrap_err();
        assert!(e.to_string().contains("is no longer a regular file"), "{e}");

        // h is replaced by another regular file (a rename over it).
        let (hpath, _, hid) = t.files["h"].clone();
        let other = r.join("other");
        fs::write(&other, b"other").unwrap();
        fs::rename(&other, &hpath).unwrap();
        let e = open_seen(&hpath, hid).unwrap_err();
        assert!(
            e.to_string().contains("was replaced by another file"),
            "{e}"
        );
    }

    #[test]
    fn local_walk_skips_links_and_temp_files() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        fs::create_dir_all(r.join("a/b")).unwrap();
        fs::write(r.join("a/b/x"), b"1").unwrap();
        fs::write(r.join("top"), b"22").unwrap();
        fs::write(r.join(".top.s3dma-0123456789abcdef.tmp"), b"partial").unwrap();
        std::os::unix::fs::symlink("/etc", r.join("etc-link")).unwrap();
        let t = local_tree(r).unwrap();
        assert_eq!(t.files.keys().collect::<Vec<_>>(), ["a/b/x", "top"]);
        assert_eq!(t.files["top"].1.size, 2);
        assert_eq!(
            t.files["top"].2,
            FileId::of(&fs::symlink_metadata(r.join("top")).unwrap())
        );
        assert!(t.not_utf8.is_empty());
        assert_eq!(t.skipped, 1);
        assert!(t.names.contains("etc-link") && t.names.contains("top"));
    }
}
