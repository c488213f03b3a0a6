//! `get --recursive` and `sync URL DIR`: the plan's ranged and batched
//! GETs, each landing in a temporary file renamed whole.

use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

use s3dma_client::{Buffer, ByteRange, ErrorKind, GetItem, GetOptions};
use tokio::task::JoinSet;

use super::local::{check_no_symlinks, local_tree};
use super::{
    BATCH_ITEMS, BATCH_MAX_OBJECT, Pool, Run, Tally, TreeOptions, client_failure, finish,
    interruptible, lock, pool_shape,
};
use crate::commands::{Failure, Global};
use crate::tree::{self, Fetch, KeyPlace, Stamp, Wanted};
use crate::url::S3Url;

/// A download's file while its bytes arrive: a temporary file next to the
/// destination, renamed over it when the last part lands; removed when
/// dropped unfinished.
struct Landing {
    dest: PathBuf,
    key: String,
    size: u64,
    modified_ms: i64,
    parts_left: AtomicUsize,
    failed: AtomicBool,
    file: Mutex<Option<(File, PathBuf)>>,
    done: AtomicBool,
}

impl Landing {
    /// Creates the temporary file (and the directories above it) unless it
    /// exists; refuses to write through a symlink under `root`.
    fn open(&self, root: &Path) -> io::Result<()> {
        let mut slot = lock(&self.file);
        if slot.is_some() {
            return Ok(());
        }
        let parent = self.dest.parent().unwrap_or(root);
        check_no_symlinks(root, &self.dest)?;
        fs::create_dir_all(parent)?;
        let name = self.dest.file_name().unwrap_or_default();
        let tmp = parent.join(tree::temp_name(name, rand::random()));
        let f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        *slot = Some((f, tmp));
        Ok(())
    }

    fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let slot = lock(&self.file);
        let (f, _) = slot
            .as_ref()
            .ok_or_else(|| io::Error::other("the temporary file is gone"))?;
        f.write_all_at(bytes, offset)
    }

    /// Sets the mtime and renames the file into place.
    fn finish(&self) -> io::Result<()> {
        let mut slot = lock(&self.file);
        let (f, tmp) = slot
            .as_ref()
            .ok_or_else(|| io::Error::other("the temporary file is gone"))?;
        let ms = u64::try_from(self.modified_ms).unwrap_or(0);
        if ms > 0 {
            f.set_modified(UNIX_EPOCH + Duration::from_millis(ms))?;
        }
        fs::rename(tmp, &self.dest)?;
        self.done.store(true, Ordering::Release);
        *slot = None;
        Ok(())
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        if !self.done.load(Ordering::Acquire)
            && let Some((_, tmp)) = lock(&self.file).take()
        {
            let _ = fs::remove_file(tmp);
        }
    }
}

pub(crate) async fn download(
    g: &Global,
    url: &str,
    dir: &Path,
    opts: TreeOptions,
) -> Result<(), Failure> {
    interruptible(download_inner(g, url, dir, opts)).await
}

async fn download_inner(
    g: &Global,
    url: &str,
    dir: &Path,
    opts: TreeOptions,
) -> Result<(), Failure> {
    let url = S3Url::parse(url).map_err(|e| Failure::Usage(e.to_string()))?;
    let prefix = tree::directory_prefix(&url.key);
    let verb = if opts.sync { "sync" } else { "get" };
    let started = Instant::now();
    let client = g.connect().await?;
    let listed = client
        .list_all(&url.bucket, &prefix)
        .await
        .map_err(client_failure(format!(
            "{verb} s3://{}/{prefix}",
            url.bucket
        )))?;
    let local = if opts.sync || opts.delete {
        local_tree(dir)
            .map_err(|e| Failure::Other(format!("reading {}: {e}", dir.display())))?
            .files
    } else {
        BTreeMap::new()
    };
    let mut tally = Tally::default();
    let mut wanted: Vec<Wanted> = Vec::new();
    let mut in_source: HashSet<String> = HashSet::new();
    for o in listed {
        let Some(relative) = o.key.strip_prefix(&prefix) else {
            continue;
        };
        let place = tree::key_place(relative);
        // Filters first: an unsafe key the filters leave out is no failure.
        if matches!(place, KeyPlace::File(_) | KeyPlace::Unsafe(_))
            && !opts.filters.includes(relative)
        {
            continue;
        }
        match place {
            KeyPlace::Skip => tally.skipped += 1,
            KeyPlace::Unsafe(why) => {
                // A local file of exactly that name (an older client's)
                // is the key's: --delete spares it.
                in_source.insert(relative.to_owned());
                let name = format!("s3://{}/{}", url.bucket, s3dma_config::Escaped(&o.key));
                let f = Failure::Other(format!("{verb} {name}: unsafe key ({why}); not written"));
                eprintln!("s3dma: {f}");
                tally.refused.push((name, f));
            }
            KeyPlace::File(path) => {
                in_source.insert(relative.to_owned());
                let source = Stamp {
                    size: o.size,
                    secs: o.last_modified_unix_ms.div_euclid(1000),
                };
                if opts.sync && !tree::sync_copies(source, local.get(relative).map(|l| l.1)) {
                    tally.up_to_date += 1;
                    continue;
                }
                wanted.push(Wanted {
                    key: o.key.clone(),
                    size: o.size,
                    etag: o.etag.clone(),
                    modified_ms: o.last_modified_unix_ms,
                    path: path.clone(),
                });
            }
        }
    }
    let total: u64 = wanted.iter().map(|w| w.size).sum();
    let largest = wanted.iter().map(|w| w.size).max().unwrap_or(0);
    let (slots, chunk) =
        pool_shape(&client, &opts, largest.max(1))
            .await
            .map_err(client_failure(format!(
                "{verb} s3://{}/{prefix}",
                url.bucket
            )))?;
    let sizes: Vec<u64> = wanted.iter().map(|w| w.size).collect();
    let plan = tree::plan_fetches(&sizes, chunk, BATCH_MAX_OBJECT.min(chunk), BATCH_ITEMS);
    let landings: Vec<Arc<Landing>> = wanted
        .iter()
        .map(|w| {
            Arc::new(Landing {
                dest: dir.join(&w.path),
                key: w.key.clone(),
                size: w.size,
                modified_ms: w.modified_ms,
                parts_left: AtomicUsize::new(0),
                failed: AtomicBool::new(false),
                file: Mutex::new(None),
                done: AtomicBool::new(false),
            })
        })
        .collect();
    for f in &plan {
        if let Fetch::Range { object, .. } = f {
            landings[*object].parts_left.fetch_add(1, Ordering::Relaxed);
        }
    }
    let run = Run::start(g, &client, &url.bucket, total, verb, tally);
    let pool = Pool::new(slots, chunk, "s3dma get -r");
    let root = Arc::new(dir.to_path_buf());
    let wanted = Arc::new(wanted);
    let mut tasks = JoinSet::new();
    for fetch in plan {
        let (run, pool, root, wanted) = (
            Arc::clone(&run),
            Arc::clone(&pool),
            Arc::clone(&root),
            Arc::clone(&wanted),
        );
        let items: Vec<Arc<Landing>> = match &fetch {
            Fetch::Range { object, .. } => vec![Arc::clone(&landings[*object])],
            Fetch::Batch(list) => list.iter().map(|i| Arc::clone(&landings[*i])).collect(),
        };
        tasks.spawn(async move {
            let (permit, mut buf) = match pool.take(&run.client).await {
                Ok(x) => x,
                Err(e) => {
                    for l in &items {
                        if !l.failed.swap(true, Ordering::AcqRel) {
                            run.fail(Failure::Client {
                                what: format!("get s3://{}/{}", run.bucket, l.key),
                                error: e.clone(),
                            });
                        }
                    }
                    return;
                }
            };
            match fetch {
                Fetch::Range { object, first, len } => {
                    fetch_range(
                        &run,
                        &root,
                        &items[0],
                        &wanted[object].etag,
                        &mut buf,
                        first,
                        len,
                    )
                    .await;
                }
                Fetch::Batch(list) => {
                    let etags: Vec<&str> = list.iter().map(|i| wanted[*i].etag.as_str()).collect();
                    fetch_batch(&run, &root, &items, &etags, &mut buf).await;
                }
            }
            pool.give_back(buf);
            drop(permit);
        });
    }
    while let Some(r) = tasks.join_next().await {
        if let Err(e) = r
            && e.is_panic()
        {
            run.fail(Failure::Other(format!("{verb}: internal error: {e}")));
        }
    }
    pool.release_all().await;
    drop(landings);
    run.pb.finish_and_clear();

    // --delete: only when every copy succeeded (unsafe keys, refused by
    // name, hold nothing up).
    if opts.delete {
        if run.copies_clean() {
            for (name, (path, _, _)) in &local {
                if in_source.contains(name) || !opts.filters.includes(name) {
                    continue;
                }
                match fs::remove_file(path) {
                    Ok(()) => {
                        lock(&run.tally).deleted += 1;
                        g.say(&format!("delete: {}", path.display()));
                    }
                    Err(e) => run.fail(Failure::Other(format!("deleting {}: {e}", path.display()))),
                }
            }
            run.say_refused(verb);
        } else {
            g.say("delete: skipped, some files failed");
        }
    }
    let tally = std::mem::take(&mut *lock(&run.tally));
    finish(g, verb, tally, started.elapsed())
}

/// One ranged GET into `buf`, written at its offset; the last part renames.
async fn fetch_range(
    run: &Run,
    root: &Path,
    l: &Arc<Landing>,
    etag: &str,
    buf: &mut Buffer,
    first: u64,
    len: u64,
) {
    if l.failed.load(Ordering::Acquire) {
        return;
    }
    let what = || format!("get s3://{}/{}", run.bucket, l.key);
    let opts = GetOptions {
        range: Some(ByteRange::Bounded {
            first,
            last: first + len - 1,
        }),
        length: Some(len),
        if_match: Some(etag.to_owned()),
    };
    let r = run
        .client
        .get_object_into(&run.bucket, &l.key, buf, 0, opts)
        .await;
    let result = match r {
        Err(mut error) => {
            if error.kind == ErrorKind::PreconditionFailed {
                error.message =
                    format!("the object changed during the download: {}", error.message);
            }
            Err(Failure::Client {
                what: what(),
                error,
            })
        }
        Ok(out) if out.bytes_placed != len => Err(Failure::Other(format!(
            "{}: bytes {first}-{} came back as {} bytes",
            what(),
            first + len - 1,
            out.bytes_placed
        ))),
        Ok(_) => {
            let n = usize::try_from(len).unwrap_or(usize::MAX);
            tokio::task::block_in_place(|| {
                l.open(root)?;
                l.write_at(first, &buf.as_slice()[..n])
            })
            .map_err(|e| Failure::Other(format!("{}: writing {}: {e}", what(), l.dest.display())))
        }
    };
    match result {
        Err(f) => {
            if !l.failed.swap(true, Ordering::AcqRel) {
                run.fail(f);
            }
        }
        Ok(()) => {
            run.pb.inc(len);
            if l.parts_left.fetch_sub(1, Ordering::AcqRel) == 1 && !l.failed.load(Ordering::Acquire)
            {
                match tokio::task::block_in_place(|| l.finish()) {
                    Ok(()) => run.done(l.size),
                    Err(e) => run.fail(Failure::Other(format!(
                        "{}: finishing {}: {e}",
                        what(),
                        l.dest.display()
                    ))),
                }
            }
        }
    }
}

/// Small objects whole into one buffer (one `GetObjects`), each then
/// written to its file.
async fn fetch_batch(
    run: &Run,
    root: &Path,
    items: &[Arc<Landing>],
    etags: &[&str],
    buf: &mut Buffer,
) {
    let mut wire = Vec::with_capacity(items.len());
    let mut offsets = Vec::with_capacity(items.len());
    let mut offset = 0usize;
    for (l, etag) in items.iter().zip(etags) {
        offsets.push(offset);
        wire.push(GetItem {
            bucket: run.bucket.clone(),
            key: l.key.clone(),
            range: None,
            offset,
            length: Some(l.size),
            if_match: Some((*etag).to_owned()),
        });
        offset += usize::try_from(l.size).unwrap_or(usize::MAX);
    }
    let results = match run.client.get_objects(buf, &wire, 0).await {
        Ok(r) => r,
        Err(error) => {
            for l in items {
                run.fail(Failure::Client {
                    what: format!("get s3://{}/{}", run.bucket, l.key),
                    error: error.clone(),
                });
            }
            return;
        }
    };
    for ((l, r), off) in items.iter().zip(results).zip(offsets) {
        let what = format!("get s3://{}/{}", run.bucket, l.key);
        let written = match r {
            Err(error) => Err(Failure::Client { what, error }),
            Ok(out) if out.bytes_placed != l.size => Err(Failure::Other(format!(
                "{what}: {} bytes came back, the listing said {}",
                out.bytes_placed, l.size
            ))),
            Ok(_) => {
                let n = usize::try_from(l.size).unwrap_or(usize::MAX);
                tokio::task::block_in_place(|| {
                    l.open(root)?;
                    l.write_at(0, &buf.as_slice()[off..off + n])?;
                    l.finish()
                })
                .map_err(|e| Failure::Other(format!("{what}: writing {}: {e}", l.dest.display())))
            }
        };
        match written {
            Ok(()) => {
                run.pb.inc(l.size);
                run.done(l.size);
            }
            Err(f) => {
                l.failed.store(true, Ordering::Release);
                run.fail(f);
            }
        }
    }
}

/// `SystemTime` of a file, for tests.
#[cfg(test)]
fn mtime(p: &Path) -> std::time::SystemTime {
    fs::metadata(p).unwrap().modified().unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3-byte download of `p/sub/f` into `root/sub/f`.
    fn landing(root: &Path) -> Landing {
        Landing {
            dest: root.join("sub/f"),
            key: "p/sub/f".into(),
            size: 3,
            modified_ms: 1_600_000_000_000,
            parts_left: AtomicUsize::new(1),
            failed: AtomicBool::new(false),
            file: Mutex::new(None),
            done: AtomicBool::new(false),
        }
    }

    #[test]
    fn a_landing_dropped_unfinished_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let l = landing(d.path());
        l.open(d.path()).unwrap();
        l.write_at(0, b"abc").unwrap();
        drop(l);
        assert_eq!(fs::read_dir(d.path().join("sub")).unwrap().count(), 0);
        let l = landing(d.path());
        l.open(d.path()).unwrap();
        l.write_at(0, b"abc").unwrap();
        l.finish().unwrap();
        drop(l);
        let f = d.path().join("sub/f");
        assert_eq!(fs::read(&f).unwrap(), b"abc");
        assert_eq!(mtime(&f), UNIX_EPOCH + Duration::from_secs(1_600_000_000));
        assert_eq!(fs::read_dir(d.path().join("sub")).unwrap().count(), 1);
    }
}
