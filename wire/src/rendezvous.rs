//! Which target of a group serves a chunk: rendezvous (highest random
//! weight) hashing over (bucket, key, chunk index, target name).
//!
//! Every agent ranks a group's targets the same way for the same chunk, so
//! each gateway of a group caches a distinct share of an object's chunks;
//! adding a target to a group of N moves about 1/(N+1) of the chunks (those
//! the new target now wins), removing one moves only the chunks it had.
//! The first target of the ranking serves the chunk; the next ones are
//! where it goes when the first is down.

use sha2::{Digest as _, Sha256};

/// The weight of `target` for chunk `chunk` of `bucket`/`key`: the first 8
/// bytes of SHA-256 over the four, length-prefixed (no two inputs collide by
/// concatenation).
#[must_use]
pub fn weight(target: &str, bucket: &str, key: &str, chunk: u64) -> u64 {
    let mut h = Sha256::new();
    for part in [target, bucket, key] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.update(chunk.to_le_bytes());
    let d = h.finalize();
    let mut w = [0u8; 8];
    w.copy_from_slice(&d[..8]);
    u64::from_le_bytes(w)
}

/// Indices of `targets` (by name) from the first choice to the last for
/// chunk `chunk` of `bucket`/`key`; ties (equal weights) by index.
#[must_use]
pub fn rank(targets: &[&str], bucket: &str, key: &str, chunk: u64) -> Vec<usize> {
    let mut w: Vec<(u64, usize)> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| (weight(t, bucket, key, chunk), i))
        .collect();
    w.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    w.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn winners(targets: &[&str], chunks: u64) -> Vec<String> {
        (0..chunks)
            .map(|c| targets[rank(targets, "b", "ckpt", c)[0]].to_owned())
            .collect()
    }

    #[test]
    fn ranking_is_a_stable_permutation() {
        let t = ["gw-a", "gw-b", "gw-c"];
        for c in 0..100 {
            let r = rank(&t, "bucket", "key", c);
            let mut s = r.clone();
            s.sort_unstable();
            assert_eq!(s, vec![0, 1, 2]);
            assert_eq!(r, rank(&t, "bucket", "key", c), "deterministic");
        }
        // Fixed values: agents of different builds must agree.
        assert_eq!(
            weight("gw-a", "bucket", "key", 0),
            weight("gw-a", "bucket", "key", 0)
        );
        assert_ne!(weight("gw-a", "b", "ck", 0), weight("gw-a", "bc", "k", 0));
        assert!(rank(&[], "b", "k", 0).is_empty());
    }

    #[test]
    fn chunks_spread_evenly() {
        let w = winners(&["gw-a", "gw-b", "gw-c"], 3000);
        for t in ["gw-a", "gw-b", "gw-c"] {
            let n = w.iter().filter(|x| *x == t).count();
            assert!((850..1150).contains(&n), "{t}: {n} of 3000");
        }
    }

    #[test]
    fn adding_a_target_moves_about_one_share() {
        let before = winners(&["gw-a", "gw-b", "gw-c"], 4000);
        let after = winners(&["gw-a", "gw-b", "gw-c", "gw-d"], 4000);
        let moved: Vec<_> = before.iter().zip(&after).filter(|(b, a)| b != a).collect();
        // Only to the new target, and about a quarter of the chunks.
        assert!(moved.iter().all(|(_, a)| *a == "gw-d"));
        assert!((800..1200).contains(&moved.len()), "{} moved", moved.len());
        // Removing it again moves exactly those back.
        assert_eq!(winners(&["gw-a", "gw-b", "gw-c"], 4000), before);
    }

    #[test]
    fn removing_a_target_moves_only_its_chunks() {
        let before = winners(&["gw-a", "gw-b", "gw-c"], 3000);
        let after = winners(&["gw-a", "gw-c"], 3000);
        for (b, a) in before.iter().zip(&after) {
            if b != "gw-b" {
                assert_eq!(b, a);
            }
        }
    }
}
