//! Completed multipart objects as manifests of their part files: no data
//! copied, read through transparently at any range, part files kept while
//! a reader uses them and removed after, unreferenced ones removed at
//! start-up (an interrupted Complete).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::*;
use crate::acl::Acl;
use crate::checksum::CompleteRequest;
use futures::StreamExt as _;

fn body(data: &[u8]) -> futures::stream::Iter<std::vec::IntoIter<Result<Bytes, BodyError>>> {
    // Several chunks, as a network body arrives.
    let chunks: Vec<Result<Bytes, BodyError>> = data
        .chunks(1 << 20)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    futures::stream::iter(chunks)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

/// Uploads `sizes` as parts 1, 3, 5, ... and completes; returns the data.
async fn multipart(store: &Arc<Store>, key: &str, sizes: &[usize]) -> (Vec<u8>, ObjectMeta) {
    let up = store
        .create_upload("bkt", key, ObjectAttrs::default(), ("me", None), None)
        .await
        .unwrap();
    let mut all = Vec::new();
    let mut listed = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let number = 1 + 2 * i as u32;
        let data = pattern(n, i as u8 + 1);
        let p = store
            .upload_part(
                "bkt",
                key,
                &up.upload_id,
                number,
                Some(data.len() as u64),
                body(&data),
                None,
                &mut NoCheck,
            )
            .await
            .unwrap();
        listed.push((number, p.etag));
        all.extend_from_slice(&data);
    }
    let meta = store
        .complete_upload(
            "bkt",
            key,
            &up.upload_id,
            &listed,
            &CompleteRequest::default(),
        )
        .await
        .unwrap();
    (all, meta)
}

async fn open_store(root: &Path) -> Arc<Store> {
    let root = root.to_owned();
    Arc::new(
        tokio::task::spawn_blocking(move || Store::open(&root))
            .await
            .unwrap()
            .unwrap(),
    )
}

/// A fresh store in a temporary directory, with bucket `bkt`.
async fn store_with_bucket() -> (tempfile::TempDir, Arc<Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    store
        .create_bucket("bkt", "me", "me-id", Acl::default())
        .await
        .unwrap();
    (dir, store)
}

fn read_all(r: &ObjectReader, range: std::ops::Range<u64>) -> Vec<u8> {
    let mut out = vec![0u8; (range.end - range.start) as usize];
    let mut filled = 0;
    while filled < out.len() {
        let k = r
            .read_at(range.start + filled as u64, &mut out[filled..])
            .unwrap();
        assert!(k > 0, "short object");
        filled += k;
    }
    out
}

fn parts_dirs(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root.join(".parts"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The removal after the last reader runs on a thread of its own.
fn wait_gone(p: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while p.exists() {
        assert!(Instant::now() < deadline, "{} never removed", p.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_links_parts_and_reads_through() {
    let (dir, store) = store_with_bucket().await;
    let sizes = [MIN_PART_SIZE as usize, MIN_PART_SIZE as usize + 3, 12_345];
    let (data, meta) = multipart(&store, "k", &sizes).await;
    let m = meta.manifest.clone().expect("a manifest");
    assert_eq!(m.part_numbers, vec![1, 3, 5]);
    assert_eq!(meta.size, data.len() as u64);
    assert!(meta.etag.ends_with("-3"), "{}", meta.etag);
    assert_eq!(parts_dirs(dir.path()), vec![m.dir.clone()]);
    // No byte copied: the object file is a header, the parts are the data
    // (hard links: the upload's own names are gone, one link each is left).
    let b = store.bucket("bkt").unwrap();
    let object_file = std::fs::metadata(b.object_path("k")).unwrap();
    assert!(object_file.len() < 4096, "{} bytes", object_file.len());
    for n in [1u32, 3, 5] {
        let p = dir
            .path()
            .join(".parts")
            .join(&m.dir)
            .join(multipart::part_file_name(n));
        assert_eq!(
            std::os::unix::fs::MetadataExt::nlink(&std::fs::metadata(&p).unwrap()),
            1
        );
    }
    assert!(
        std::fs::read_dir(dir.path().join(".uploads"))
            .unwrap()
            .next()
            .is_none()
    );

    let r = store.open_object("bkt", "k").await.unwrap();
    assert!(read_all(&r, 0..meta.size) == data);
    let five = MIN_PART_SIZE;
    for range in [
        0..1,
        five - 1..five + 1,
        five - 10..2 * five + 10,
        2 * five..meta.size,
        meta.size - 1..meta.size,
    ] {
        assert!(
            read_all(&r, range.clone()) == data[range.start as usize..range.end as usize],
            "{range:?}"
        );
    }
    // The file ranges behind a range that spans two parts.
    let fr = r.file_ranges(five - 10..five + 20).unwrap();
    assert_eq!(
        fr.iter().map(|(_, o, n)| (*o, *n)).collect::<Vec<_>>(),
        vec![(five - 10, 10), (0, 20)]
    );
    assert!(r.file_ranges(0..0).unwrap().is_empty());
    let streamed: Vec<u8> = r
        .stream(five - 5..meta.size)
        .map(|c| c.unwrap().to_vec())
        .concat()
        .await;
    assert!(streamed == data[five as usize - 5..]);

    // A server-side copy is a plain object with the same bytes and ETag.
    let copy = store
        .copy_object(&r, "bkt", "copy", None, None)
        .await
        .unwrap();
    assert!(copy.manifest.is_none());
    assert_eq!(copy.etag, meta.etag);
    let rc = store.open_object("bkt", "copy").await.unwrap();
    assert!(read_all(&rc, 0..copy.size) == data);

    // A retried Complete of the same request gets the same object.
    drop(r);
    // Reopen: the object and its parts survive a restart.
    drop(store);
    let store = open_store(dir.path()).await;
    assert_eq!(parts_dirs(dir.path()), vec![m.dir.clone()]);
    let r = store.open_object("bkt", "k").await.unwrap();
    assert!(read_all(&r, 0..meta.size) == data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn part_files_outlive_readers_not_their_object() {
    let (dir, store) = store_with_bucket().await;
    let sizes = [MIN_PART_SIZE as usize, 1000];
    let (data, meta) = multipart(&store, "k", &sizes).await;
    let parts = dir.path().join(".parts").join(&meta.manifest.unwrap().dir);

    // Overwritten while a reader that has opened no part file yet holds it:
    // the reader still reads the version it opened, then the parts go.
    let r = store.open_object("bkt", "k").await.unwrap();
    store
        .put_object(
            "bkt",
            "k",
            ObjectAttrs::default(),
            body(b"new"),
            None,
            &mut NoCheck,
        )
        .await
        .unwrap();
    assert!(parts.exists(), "removed under a reader");
    assert!(read_all(&r, 0..data.len() as u64) == data);
    let r2 = r.clone();
    drop(r);
    assert!(parts.exists(), "a clone of the reader still uses them");
    drop(r2);
    wait_gone(&parts);

    // Deleted with no reader: the parts go at once.
    let (_, meta) = multipart(&store, "k2", &sizes).await;
    let parts = dir.path().join(".parts").join(&meta.manifest.unwrap().dir);
    assert!(parts.exists());
    store.delete_object("bkt", "k2").await.unwrap();
    assert!(!parts.exists());

    // Replaced by another multipart object: the old parts go, the new stay.
    let (_, m1) = multipart(&store, "k3", &sizes).await;
    let (d2, m2) = multipart(&store, "k3", &sizes[1..]).await;
    assert!(
        !dir.path()
            .join(".parts")
            .join(m1.manifest.unwrap().dir)
            .exists()
    );
    assert_eq!(parts_dirs(dir.path()), vec![m2.manifest.unwrap().dir]);
    let r = store.open_object("bkt", "k3").await.unwrap();
    assert!(read_all(&r, 0..d2.len() as u64) == d2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_completions_leave_nothing_after_restart() {
    let (dir, store) = store_with_bucket().await;
    let (data, meta) = multipart(&store, "k", &[MIN_PART_SIZE as usize, 7]).await;
    let live = meta.manifest.unwrap().dir;
    // What a crash between linking the parts and publishing leaves: a
    // directory nothing refers to (and the upload, untouched).
    let orphan = dir
        .path()
        .join(".parts")
        .join("0123456789abcdef0123456789abcdef");
    std::fs::create_dir(&orphan).unwrap();
    std::fs::write(orphan.join(multipart::part_file_name(1)), b"partial").unwrap();
    std::fs::write(dir.path().join(".parts").join("stray-file"), b"x").unwrap();
    drop(store);
    let store = open_store(dir.path()).await;
    assert_eq!(parts_dirs(dir.path()), vec![live]);
    let r = store.open_object("bkt", "k").await.unwrap();
    assert!(read_all(&r, 0..data.len() as u64) == data);
}
