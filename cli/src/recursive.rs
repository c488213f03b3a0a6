//! The recursive commands: `get --recursive`, `put --recursive` and `sync`
//! (either direction), over one client connection (one lease) with a pool
//! of registered buffers.
//!
//! Downloads are cut by [`tree::plan_fetches`]: large objects as ranged
//! GETs (each with `If-Match` on the listed ETag, so a file is never two
//! versions) landing at their offsets in a temporary file, small ones
//! batched into one buffer per `GetObjects` call. A file appears under its
//! name only whole (written as `.NAME.s3dma-<nonce>.tmp`, renamed on
//! success, its mtime set to the object's LastModified); a failed or
//! interrupted transfer leaves no partial file. Uploads read each file into
//! a buffer (a pool slot, or a buffer of its own when larger than a chunk)
//! and PutObject it: the agent switches to multipart by itself. Each file
//! is opened without following a symlink (`O_NOFOLLOW`) and checked by
//! `fstat` to be the regular file the walk saw (same device and inode), so
//! a file swapped for a link (or another file) after the walk is refused,
//! never read.
//!
//! `--delete` runs only when every copy succeeded, and then deletes what is
//! safe even when some names could not cross: a key that cannot be a local
//! name (see `tree::key_place`: `..`, `//`, control characters, ...) is
//! never written and never deleted, a local name that is not UTF-8 never
//! uploaded; each such name is printed on stderr, listed again after the
//! deletions, and makes the run exit 1 (a partial failure) once every safe
//! deletion is done.
//!
//! What is decided without I/O (paths, filters, sync rules, the plan) is in
//! `tree.rs`.

use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

use indicatif::{BinaryBytes, ProgressBar};
use s3dma_client::{Buffer, ByteRange, Client, ErrorKind, GetItem, GetOptions, PutOptions};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::commands::{Failure, Global};
use crate::tree::{self, Fetch, Filters, KeyPlace, Stamp, Wanted};
use crate::url::S3Url;

/// Objects at most this large are batched (several per `GetObjects`).
const BATCH_MAX_OBJECT: u64 = 4 << 20;
/// Objects per `GetObjects` batch at most.
const BATCH_ITEMS: usize = 64;

/// How a recursive command runs (the shared flags).
#[derive(Debug, Clone)]
pub(crate) struct TreeOptions {
    /// `--include` / `--exclude`.
    pub filters: Filters,
    /// Transfers in flight.
    pub concurrency: usize,
    /// Registered memory the transfers may use, at most.
    pub memory: u64,
    /// Bytes per ranged GET (and the size of a pool buffer).
    pub chunk: u64,
    /// `sync`: copy only what is missing, of another size or older.
    pub sync: bool,
    /// `sync --delete`: remove what the source does not have.
    pub delete: bool,
}

/// What a recursive command did.
#[derive(Debug, Default)]
struct Tally {
    files: usize,
    bytes: u64,
    skipped: usize,
    up_to_date: usize,
    deleted: usize,
    failures: Vec<Failure>,
    /// Names that cannot cross (unsafe keys, local names that are not
    /// UTF-8): failures that do not hold up `--delete`. The name (escaped,
    /// for the summary) and the failure.
    refused: Vec<(String, Failure)>,
}

/// State shared by a run's tasks.
struct Run {
    client: Client,
    bucket: String,
    pb: ProgressBar,
    tally: Mutex<Tally>,
}

impl Run {
    /// Records a file's failure and prints it (even with --quiet).
    fn fail(&self, f: Failure) {
        self.pb.suspend(|| eprintln!("s3dma: {f}"));
        lock(&self.tally).failures.push(f);
    }

    /// Whether `--delete` may run: every copy succeeded (names refused
    /// before the copies do not count).
    fn copies_clean(&self) -> bool {
        lock(&self.tally).failures.is_empty()
    }

    /// After `--delete`: names again what it left because it could not
    /// cross.
    fn say_refused(&self, verb: &str) {
        let t = lock(&self.tally);
        if !t.refused.is_empty() {
            let names: Vec<&str> = t.refused.iter().map(|(n, _)| n.as_str()).collect();
            self.pb.suspend(|| {
                eprintln!(
                    "s3dma: {verb} --delete: deleted what is safe; {} name(s) could not cross and were skipped: {}",
                    names.len(),
                    names.join(", ")
                );
            });
        }
    }

    fn done(&self, bytes: u64) {
        let mut t = lock(&self.tally);
        t.files += 1;
        t.bytes += bytes;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A pool of equal registered buffers, at most `slots` of them, allocated
/// on first use.
struct Pool {
    slots: Arc<Semaphore>,
    free: Mutex<Vec<Buffer>>,
    size: usize,
    label: &'static str,
}

impl Pool {
    fn new(slots: usize, size: usize, label: &'static str) -> Pool {
        Pool {
            slots: Arc::new(Semaphore::new(slots.max(1))),
            free: Mutex::new(Vec::new()),
            size: size.max(1),
            label,
        }
    }

    /// A buffer of the pool (waiting for one to come back when all are
    /// out); return it with [`Pool::give_back`].
    async fn take(
        &self,
        client: &Client,
    ) -> Result<(tokio::sync::OwnedSemaphorePermit, Buffer), s3dma_client::Error> {
        let permit = Arc::clone(&self.slots).acquire_owned().await.map_err(|_| {
            s3dma_client::Error::new(ErrorKind::Other, "Internal", "buffer pool closed")
        })?;
        let ready = lock(&self.free).pop();
        let buf = match ready {
            Some(b) => b,
            None => client.alloc_labeled(self.size, self.label).await?,
        };
        Ok((permit, buf))
    }

    fn give_back(&self, buf: Buffer) {
        lock(&self.free).push(buf);
    }

    async fn release_all(&self) {
        let bufs: Vec<Buffer> = std::mem::take(&mut *lock(&self.free));
        for b in bufs {
            let _ = b.release().await;
        }
    }
}

/// How many pool buffers of `chunk` bytes fit: the tenant's room (what
/// the shim still lets it register, count and bytes), `memory`, and no
/// more than transfers in flight. Returns `(slots, buffer size)`; the
/// buffer size shrinks to what the tenant may hold when that is less than
/// a chunk.
async fn pool_shape(
    client: &Client,
    opts: &TreeOptions,
    largest: u64,
) -> Result<(usize, u64), s3dma_client::Error> {
    let info = client.info().await?;
    let mut room_bytes = opts.memory;
    let mut room_count = opts.concurrency.max(1);
    if info.max_buffer_bytes > 0 {
        room_bytes = room_bytes.min(info.max_buffer_bytes.saturating_sub(info.buffer_bytes));
    }
    if info.max_buffers > 0 {
        room_count = room_count.min(info.max_buffers.saturating_sub(info.buffers) as usize);
    }
    let size = opts.chunk.min(largest.max(1)).min(room_bytes.max(1));
    let slots = usize::try_from(room_bytes / size)
        .unwrap_or(usize::MAX)
        .clamp(1, room_count.max(1));
    Ok((slots, size))
}

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

/// Fails when `dest` or a directory between `root` and it is a symlink
/// (or exists as something a file cannot be written through).
fn check_no_symlinks(root: &Path, dest: &Path) -> io::Result<()> {
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
struct LocalTree {
    /// Every regular file, by relative `/` name, with its stamp and
    /// identity (our temporary files left out).
    files: BTreeMap<String, (PathBuf, Stamp, FileId)>,
    /// Files whose names are not UTF-8 (no key can name them).
    not_utf8: Vec<PathBuf>,
    /// Entries neither a directory nor a regular file (symlinks are never
    /// followed).
    skipped: usize,
    /// The names of every entry that is not a directory, symlinks included
    /// (what `--delete` spares on the other side).
    names: HashSet<String>,
}

/// Walks `root` (a missing one is empty).
fn local_tree(root: &Path) -> io::Result<LocalTree> {
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
struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    fn of(m: &fs::Metadata) -> FileId {
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
fn open_seen(path: &Path, seen: FileId) -> io::Result<File> {
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

fn stamp_of(m: &fs::Metadata) -> Stamp {
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

fn client_failure(what: String) -> impl FnOnce(s3dma_client::Error) -> Failure {
    move |error| Failure::Client { what, error }
}

/// Runs `work` until it ends or Ctrl-C / SIGTERM arrives (exit 130; the
/// dropped transfers remove their temporary files).
async fn interruptible<T>(work: impl Future<Output = Result<T, Failure>>) -> Result<T, Failure> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Failure::Other(format!("installing a signal handler: {e}")))?;
    tokio::select! {
        r = work => r,
        _ = tokio::signal::ctrl_c() => Err(Failure::Interrupted),
        _ = term.recv() => Err(Failure::Interrupted),
    }
}

/// `s3dma get --recursive URL DIR` and `s3dma sync URL DIR`.
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
    let pb = g.progress(total, verb);
    let run = Arc::new(Run {
        client: client.clone(),
        bucket: url.bucket.clone(),
        pb: pb.clone(),
        tally: Mutex::new(tally),
    });
    let pool = Arc::new(Pool::new(
        slots,
        usize::try_from(chunk).unwrap_or(usize::MAX),
        "s3dma get -r",
    ));
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
    pb.finish_and_clear();

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

/// One local file to upload.
struct Upload {
    path: PathBuf,
    key: String,
    size: u64,
    /// The file the walk saw (what the open must find).
    id: FileId,
}

/// `s3dma put --recursive DIR URL` and `s3dma sync DIR URL`.
pub(crate) async fn upload(
    g: &Global,
    dir: &Path,
    url: &str,
    opts: TreeOptions,
) -> Result<(), Failure> {
    interruptible(upload_inner(g, dir, url, opts)).await
}

async fn upload_inner(g: &Global, dir: &Path, url: &str, opts: TreeOptions) -> Result<(), Failure> {
    let url = S3Url::parse(url).map_err(|e| Failure::Usage(e.to_string()))?;
    let prefix = tree::directory_prefix(&url.key);
    let verb = if opts.sync { "sync" } else { "put" };
    let started = Instant::now();
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Failure::Usage(format!(
                "{} is not a directory",
                dir.display()
            )));
        }
        Err(e) => return Err(Failure::Other(format!("reading {}: {e}", dir.display()))),
    }
    let LocalTree {
        files: local,
        not_utf8,
        skipped,
        names: local_names,
    } = local_tree(dir).map_err(|e| Failure::Other(format!("reading {}: {e}", dir.display())))?;
    let client = g.connect().await?;
    let remote: BTreeMap<String, Stamp> = if opts.sync || opts.delete {
        client
            .list_all(&url.bucket, &prefix)
            .await
            .map_err(client_failure(format!(
                "{verb} s3://{}/{prefix}",
                url.bucket
            )))?
            .into_iter()
            .map(|o| {
                (
                    o.key,
                    Stamp {
                        size: o.size,
                        secs: o.last_modified_unix_ms.div_euclid(1000),
                    },
                )
            })
            .collect()
    } else {
        BTreeMap::new()
    };
    let mut tally = Tally {
        skipped,
        ..Tally::default()
    };
    for p in not_utf8 {
        let name = s3dma_config::Escaped(&p.to_string_lossy()).to_string();
        let f = Failure::Other(format!(
            "{verb} {name}: the name is not UTF-8 (an S3 key must be)"
        ));
        eprintln!("s3dma: {f}");
        tally.refused.push((name, f));
    }
    let mut uploads = Vec::new();
    let mut in_source: HashSet<String> = HashSet::new();
    for (name, (path, stamp, id)) in &local {
        if !opts.filters.includes(name) {
            continue;
        }
        let key = format!("{prefix}{name}");
        in_source.insert(key.clone());
        if opts.sync && !tree::sync_copies(*stamp, remote.get(&key).copied()) {
            tally.up_to_date += 1;
            continue;
        }
        uploads.push(Upload {
            path: path.clone(),
            key,
            size: stamp.size,
            id: *id,
        });
    }
    let total: u64 = uploads.iter().map(|u| u.size).sum();
    let largest = uploads.iter().map(|u| u.size).max().unwrap_or(0);
    // Half the memory for the pool of small-file buffers, half for the
    // files larger than a buffer (each needs one of its own size).
    let half = TreeOptions {
        memory: (opts.memory / 2).max(1),
        ..opts.clone()
    };
    let (slots, chunk) =
        pool_shape(&client, &half, largest.max(1))
            .await
            .map_err(client_failure(format!(
                "{verb} s3://{}/{prefix}",
                url.bucket
            )))?;
    let large_mib = u32::try_from((half.memory >> 20).max(1)).unwrap_or(u32::MAX);
    let large = Arc::new(Semaphore::new(large_mib as usize));
    let pb = g.progress(total, verb);
    let run = Arc::new(Run {
        client: client.clone(),
        bucket: url.bucket.clone(),
        pb: pb.clone(),
        tally: Mutex::new(tally),
    });
    let pool = Arc::new(Pool::new(
        slots,
        usize::try_from(chunk).unwrap_or(usize::MAX),
        "s3dma put -r",
    ));
    let inflight = Arc::new(Semaphore::new(opts.concurrency.max(1)));
    let mut tasks = JoinSet::new();
    for u in uploads {
        let (run, pool, large, inflight) = (
            Arc::clone(&run),
            Arc::clone(&pool),
            Arc::clone(&large),
            Arc::clone(&inflight),
        );
        tasks.spawn(async move {
            let Ok(_turn) = inflight.acquire_owned().await else {
                return;
            };
            let what = format!("put s3://{}/{}", run.bucket, u.key);
            let r = if u.size <= chunk {
                match pool.take(&run.client).await {
                    Ok((permit, buf)) => {
                        let (buf, r) = put_file(&run, &u, buf).await;
                        pool.give_back(buf);
                        drop(permit);
                        r
                    }
                    Err(error) => Err(Failure::Client {
                        what: what.clone(),
                        error,
                    }),
                }
            } else {
                let mib = u32::try_from((u.size >> 20).max(1))
                    .unwrap_or(u32::MAX)
                    .min(large_mib);
                let Ok(_mem) = large.acquire_many_owned(mib).await else {
                    return;
                };
                match usize::try_from(u.size) {
                    Err(_) => Err(Failure::Other(format!(
                        "{what}: too large for this machine"
                    ))),
                    Ok(n) => match run.client.alloc_labeled(n, "s3dma put -r").await {
                        Ok(buf) => {
                            let (buf, r) = put_file(&run, &u, buf).await;
                            let _ = buf.release().await;
                            r
                        }
                        Err(error) => Err(Failure::Client {
                            what: what.clone(),
                            error,
                        }),
                    },
                }
            };
            match r {
                Ok(()) => run.done(u.size),
                Err(f) => run.fail(f),
            }
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
    pb.finish_and_clear();

    if opts.delete {
        if run.copies_clean() {
            for key in remote.keys() {
                let name = &key[prefix.len().min(key.len())..];
                // Only keys a file could have made: no directory markers,
                // no unsafe names (named, and kept), none a local entry
                // (even a skipped symlink) shadows.
                if in_source.contains(key)
                    || local_names.contains(name)
                    || !opts.filters.includes(name)
                {
                    continue;
                }
                match tree::key_place(name) {
                    KeyPlace::File(_) => {}
                    KeyPlace::Skip => continue,
                    KeyPlace::Unsafe(why) => {
                        let shown = format!("s3://{}/{}", url.bucket, s3dma_config::Escaped(key));
                        let f = Failure::Other(format!(
                            "{verb} --delete {shown}: unsafe key ({why}); not deleted"
                        ));
                        run.pb.suspend(|| eprintln!("s3dma: {f}"));
                        lock(&run.tally).refused.push((shown, f));
                        continue;
                    }
                }
                match client.delete(&url.bucket, key).await {
                    Ok(()) => {
                        lock(&run.tally).deleted += 1;
                        g.say(&format!(
                            "delete: s3://{}/{}",
                            url.bucket,
                            s3dma_config::Escaped(key)
                        ));
                    }
                    Err(error) => run.fail(Failure::Client {
                        what: format!("delete s3://{}/{}", url.bucket, s3dma_config::Escaped(key)),
                        error,
                    }),
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

/// Reads a file into `buf` and PutObjects it; gives the buffer back.
async fn put_file(run: &Run, u: &Upload, mut buf: Buffer) -> (Buffer, Result<(), Failure>) {
    let what = format!("put s3://{}/{}", run.bucket, u.key);
    let n = usize::try_from(u.size).unwrap_or(usize::MAX);
    let read = tokio::task::block_in_place(|| -> io::Result<()> {
        let mut f = open_seen(&u.path, u.id)?;
        let slice = &mut buf.as_mut_slice()[..n];
        f.read_exact(slice).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                io::Error::other("the file shrank while being read")
            } else {
                e
            }
        })?;
        let mut one = [0u8; 1];
        if f.read(&mut one)? != 0 {
            return Err(io::Error::other("the file grew while being read"));
        }
        Ok(())
    });
    if let Err(e) = read {
        return (
            buf,
            Err(Failure::Other(format!(
                "{what}: reading {}: {e}",
                u.path.display()
            ))),
        );
    }
    let r = run
        .client
        .put_object_from(&run.bucket, &u.key, &buf, 0..n, PutOptions::default())
        .await;
    match r {
        Ok(_) => {
            run.pb.inc(u.size);
            (buf, Ok(()))
        }
        Err(error) => (buf, Err(Failure::Client { what, error })),
    }
}

/// Prints the summary and picks the result: the first failure's exit code.
fn finish(g: &Global, verb: &str, mut tally: Tally, took: Duration) -> Result<(), Failure> {
    let later = std::mem::take(&mut tally.failures);
    tally.failures = std::mem::take(&mut tally.refused)
        .into_iter()
        .map(|(_, f)| f)
        .chain(later)
        .collect();
    let secs = took.as_secs_f64().max(1e-9);
    let mut line = format!(
        "{verb}: {} files, {} in {:.1} s ({:.2} GB/s); {} failed, {} skipped",
        tally.files,
        BinaryBytes(tally.bytes),
        secs,
        tally.bytes as f64 / secs / 1e9,
        tally.failures.len(),
        tally.skipped,
    );
    if verb == "sync" {
        line.push_str(&format!(
            ", {} up to date, {} deleted",
            tally.up_to_date, tally.deleted
        ));
    }
    g.say(&line);
    if tally.failures.is_empty() {
        Ok(())
    } else {
        let n = tally.failures.len();
        let first = tally.failures.swap_remove(0);
        Err(Failure::Partial {
            failed: n,
            first: Box::new(first),
        })
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
