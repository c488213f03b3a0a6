//! `.parts`: the data of completed multipart objects, and the pins open
//! readers hold on its entries (a replaced object's parts go once no
//! reader uses them).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tracing::warn;

use super::{Manifest, lock};

/// The `.parts` directory and the pins open readers hold on its entries.
#[derive(Debug)]
pub(super) struct PartsRegistry {
    pub(super) dir: PathBuf,
    pub(super) pins: Mutex<std::collections::HashMap<String, Weak<PartsPin>>>,
}

impl PartsRegistry {
    /// Pins `.parts/<name>` for a reader (called under the bucket's index
    /// lock, with the object that refers to it just opened).
    pub(super) fn pin(&self, name: &str) -> Arc<PartsPin> {
        let mut pins = lock(&self.pins);
        if let Some(p) = pins.get(name).and_then(Weak::upgrade) {
            return p;
        }
        pins.retain(|_, w| w.strong_count() > 0);
        let p = Arc::new(PartsPin {
            dir: self.dir.join(name),
            orphaned: AtomicBool::new(false),
        });
        pins.insert(name.to_owned(), Arc::downgrade(&p));
        p
    }

    /// The object that referred to `.parts/<name>` is gone (called under the
    /// bucket's index lock): returns the directory to remove now, or `None`
    /// when readers still use it (the last one removes it).
    pub(super) fn release(&self, name: &str) -> Option<PathBuf> {
        if !Manifest::valid_dir(name) {
            return None;
        }
        let pin = lock(&self.pins).get(name).and_then(Weak::upgrade);
        match pin {
            Some(p) => {
                p.orphaned.store(true, Ordering::Release);
                None
            }
            None => Some(self.dir.join(name)),
        }
    }
}

/// Keeps a `.parts` directory on disk while readers use it: releasing the
/// object that owns it then only marks the pin, and the last reader's drop
/// removes the directory.
#[derive(Debug)]
pub(super) struct PartsPin {
    pub(super) dir: PathBuf,
    pub(super) orphaned: AtomicBool,
}

impl Drop for PartsPin {
    fn drop(&mut self) {
        if self.orphaned.load(Ordering::Acquire) {
            let dir = std::mem::take(&mut self.dir);
            // Off the caller's thread: it may be an async worker.
            std::thread::spawn(move || remove_parts_dir(&dir));
        }
    }
}

pub(super) fn remove_parts_dir(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != io::ErrorKind::NotFound
    {
        warn!(dir = %dir.display(), error = %e, "removing the parts of a replaced object failed");
    }
}
