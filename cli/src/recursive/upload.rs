//! `put --recursive` and `sync DIR URL`: each file read into a buffer
//! through a checked open and put whole (files up to 1 MiB several to a
//! pool buffer and one PutObjects call); `--delete` removes the keys no
//! file made in DeleteObjects batches.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use s3dma_client::{Buffer, ErrorKind, ObjectKey, PutItem, PutOptions};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::local::{FileId, LocalTree, local_tree, open_seen};
use super::{
    Pool, Run, Tally, TreeOptions, client_failure, finish, interruptible, lock, pool_shape,
};
use crate::commands::{Failure, Global};
use crate::tree::{self, KeyPlace, Stamp};
use crate::url::S3Url;

/// Keys of one DeleteObjects call of `sync --delete`.
const DELETE_BATCH: usize = 256;

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
    let run = Run::start(g, &client, &url.bucket, total, verb, tally);
    let pool = Pool::new(slots, chunk, "s3dma put -r");
    let inflight = Arc::new(Semaphore::new(opts.concurrency.max(1)));
    let mut tasks = JoinSet::new();
    // Small files go several to a pool buffer, one PutObjects each.
    let (small, uploads): (Vec<Upload>, Vec<Upload>) = uploads
        .into_iter()
        .partition(|u| u.size <= SMALL_FILE.min(chunk));
    for batch in pack(small, chunk) {
        let (run, pool, inflight) = (Arc::clone(&run), Arc::clone(&pool), Arc::clone(&inflight));
        tasks.spawn(async move {
            let Ok(_turn) = inflight.acquire_owned().await else {
                return;
            };
            match pool.take(&run.client).await {
                Ok((permit, buf)) => {
                    let buf = put_batch(&run, batch, buf).await;
                    pool.give_back(buf);
                    drop(permit);
                }
                Err(error) => {
                    for u in batch {
                        run.fail(Failure::Client {
                            what: format!("put s3://{}/{}", run.bucket, u.key),
                            error: error.clone(),
                        });
                    }
                }
            }
        });
    }
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
    run.pb.finish_and_clear();

    if opts.delete {
        if run.copies_clean() {
            let mut doomed: Vec<ObjectKey> = Vec::new();
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
                doomed.push(ObjectKey {
                    bucket: url.bucket.clone(),
                    key: key.clone(),
                });
            }
            // DeleteObjects batches; each key's own result.
            for keys in doomed.chunks(DELETE_BATCH) {
                let shown =
                    |k: &ObjectKey| format!("s3://{}/{}", k.bucket, s3dma_config::Escaped(&k.key));
                match client.delete_objects(keys).await {
                    Ok(results) => {
                        for (k, r) in keys.iter().zip(results) {
                            match r {
                                Ok(()) => {
                                    lock(&run.tally).deleted += 1;
                                    g.say(&format!("delete: {}", shown(k)));
                                }
                                Err(error) => run.fail(Failure::Client {
                                    what: format!("delete {}", shown(k)),
                                    error,
                                }),
                            }
                        }
                    }
                    Err(error) => run.fail(Failure::Client {
                        what: format!(
                            "delete {} keys from {}",
                            keys.len(),
                            keys.first().map(shown).unwrap_or_default()
                        ),
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
    let read = tokio::task::block_in_place(|| read_into(u, &mut buf.as_mut_slice()[..n]));
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

/// Files up to this size are uploaded several to a PutObjects call.
const SMALL_FILE: u64 = 1 << 20;

/// Files of one PutObjects call at most.
const BATCH_FILES: usize = 64;

/// Small files packed into batches of at most [`BATCH_FILES`] whose sizes
/// add up to at most `room` bytes (one pool buffer).
fn pack(small: Vec<Upload>, room: u64) -> Vec<Vec<Upload>> {
    let mut out: Vec<Vec<Upload>> = Vec::new();
    let mut used = 0u64;
    for u in small {
        match out.last_mut() {
            Some(b) if b.len() < BATCH_FILES && used + u.size <= room => {
                used += u.size;
                b.push(u);
            }
            _ => {
                used = u.size;
                out.push(vec![u]);
            }
        }
    }
    out
}

/// Reads a file into `slice` through the checked open.
fn read_into(u: &Upload, slice: &mut [u8]) -> io::Result<()> {
    let mut f = open_seen(&u.path, u.id)?;
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
}

/// Reads a batch of small files into `buf` one after another and writes
/// them with one PutObjects call; each file's failure is its own. A shim
/// that refuses the call as a whole (too many items or bytes for the
/// tenant) gets the files as single PUTs from the same buffer.
/// Gives the buffer back.
async fn put_batch(run: &Run, batch: Vec<Upload>, mut buf: Buffer) -> Buffer {
    let mut items = Vec::with_capacity(batch.len());
    let mut read = Vec::with_capacity(batch.len());
    let mut offset = 0usize;
    for u in batch {
        let n = usize::try_from(u.size).unwrap_or(usize::MAX);
        let r = tokio::task::block_in_place(|| {
            read_into(&u, &mut buf.as_mut_slice()[offset..offset + n])
        });
        match r {
            Ok(()) => {
                items.push(PutItem {
                    bucket: run.bucket.clone(),
                    key: u.key.clone(),
                    offset,
                    length: n,
                    opts: PutOptions::default(),
                });
                read.push(u);
                offset += n;
            }
            Err(e) => run.fail(Failure::Other(format!(
                "put s3://{}/{}: reading {}: {e}",
                run.bucket,
                u.key,
                u.path.display()
            ))),
        }
    }
    if items.is_empty() {
        return buf;
    }
    let results = match run.client.put_objects(&buf, &items, 0).await {
        Ok(r) => r,
        Err(e) if e.kind() == ErrorKind::InvalidArgument => {
            let mut each = Vec::with_capacity(items.len());
            for it in &items {
                each.push(
                    run.client
                        .put_object_from(
                            &run.bucket,
                            &it.key,
                            &buf,
                            it.offset..it.offset + it.length,
                            PutOptions::default(),
                        )
                        .await,
                );
            }
            each
        }
        Err(e) => items.iter().map(|_| Err(e.clone())).collect(),
    };
    for (u, r) in read.iter().zip(results) {
        match r {
            Ok(_) => {
                run.pb.inc(u.size);
                run.done(u.size);
            }
            Err(error) => run.fail(Failure::Client {
                what: format!("put s3://{}/{}", run.bucket, u.key),
                error,
            }),
        }
    }
    buf
}
