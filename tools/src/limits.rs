//! The machine's limits that `s3dma-tools bench` prints its figures against,
//! measured in the same run: memory copy bandwidth, the store's MD5 speed
//! (the implementation the storage-target hashes every PUT with), and the
//! data directory's write+fsync bandwidth (what a durable PUT must pay).

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use s3s::crypto::{Checksum as _, Md5};

use crate::stats::{gbps, median};

/// Runs `once` (which moves `bytes`) until `dur` has passed (at least three
/// times); the median GB/s.
fn repeat(bytes: u64, dur: Duration, mut once: impl FnMut()) -> Option<f64> {
    let start = Instant::now();
    let mut all = Vec::new();
    while all.len() < 3 || start.elapsed() < dur {
        let t = Instant::now();
        once();
        all.extend(gbps(bytes, t.elapsed()));
    }
    median(&all)
}

/// memcpy between two `len`-byte buffers (pages touched first).
pub(crate) fn memcpy_gbps(len: usize, dur: Duration) -> Option<f64> {
    let src = vec![0x5au8; len];
    let mut dst = vec![0u8; len];
    repeat(len as u64, dur, || {
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
    })
}

/// MD5 (s3s's, as the store uses it) over a `len`-byte buffer, fed in 1 MiB
/// updates as the store does while receiving.
pub(crate) fn md5_gbps(len: usize, dur: Duration) -> Option<f64> {
    let mut data = vec![0u8; len];
    crate::primitives::fill_random(&mut data, 7);
    repeat(len as u64, dur, || {
        let mut h = Md5::new();
        for c in data.chunks(1 << 20) {
            h.update(c);
        }
        std::hint::black_box(h.finalize());
    })
}

/// Writes `len` bytes in 8 MiB writes to a new file in `dir`, fsyncs it and
/// removes it, three times; the median GB/s including the fsync.
///
/// # Errors
/// The file cannot be created, written or synced.
pub(crate) fn write_fsync_gbps(dir: &Path, len: usize) -> anyhow::Result<Option<f64>> {
    let block = vec![0xa5u8; 8 << 20];
    let mut all = Vec::new();
    for i in 0..3 {
        let path = dir.join(format!(".bench-fsync-{}-{i}", std::process::id()));
        let t = Instant::now();
        let r = (|| {
            let mut f = std::fs::File::create(&path)?;
            let mut left = len;
            while left > 0 {
                let n = left.min(block.len());
                f.write_all(&block[..n])?;
                left -= n;
            }
            f.sync_all()
        })();
        let elapsed = t.elapsed();
        let _ = std::fs::remove_file(&path);
        r.with_context(|| format!("writing and syncing {}", path.display()))?;
        all.extend(gbps(len as u64, elapsed));
    }
    Ok(median(&all))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_positive() {
        let d = tempfile::tempdir().unwrap();
        for v in [
            memcpy_gbps(1 << 20, Duration::from_millis(10)),
            md5_gbps(1 << 20, Duration::from_millis(10)),
            write_fsync_gbps(d.path(), 1 << 20).unwrap(),
        ] {
            let v = v.unwrap();
            assert!(v.is_finite() && v > 0.0, "{v}");
        }
        assert_eq!(
            std::fs::read_dir(d.path()).unwrap().count(),
            0,
            "files left"
        );
    }
}
