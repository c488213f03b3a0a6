//! Tenant policy: what a tenant may read, write and list, and which tenants a
//! shim may act for. Pure functions over the configuration; no I/O.
//!
//! A tenant's grants ([`Grant`]) each name a bucket (or `"*"`) and a key
//! prefix. Access is allowed when any grant allows it; everything else is
//! denied, so a tenant without grants can do nothing.
//!
//! Keys with a `.` or `..` path segment (`a/../b`, `./a`) are always denied:
//! an S3 server or proxy that normalises paths could otherwise resolve them
//! outside the granted prefix (or bucket).

use crate::config::Grant;

/// The kind of object access being checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// GetObject, HeadObject (and the reads of a batch).
    Read,
    /// PutObject, multipart uploads.
    Write,
}

/// One tenant's grants, ready to answer access questions.
#[derive(Debug, Clone)]
pub struct TenantPolicy {
    grants: Vec<Grant>,
}

impl TenantPolicy {
    /// The policy of a tenant with these grants (from
    /// [`crate::config::LoadedTenant::allow`]).
    #[must_use]
    pub fn new(grants: &[Grant]) -> TenantPolicy {
        TenantPolicy {
            grants: grants.to_vec(),
        }
    }

    /// May the tenant read/write `key` in `bucket`? A grant matches when its
    /// bucket is the name or `"*"`, the key starts with its prefix and it
    /// allows `access`. Invalid bucket names and keys with `.`/`..` path
    /// segments are denied.
    #[must_use]
    pub fn allows(&self, bucket: &str, key: &str, access: Access) -> bool {
        if !plausible_bucket(bucket) || has_dot_segment(key) {
            return false;
        }
        self.grants.iter().any(|g| {
            bucket_matches(g, bucket)
                && key.starts_with(g.prefix.as_str())
                && match access {
                    Access::Read => g.read,
                    Access::Write => g.write,
                }
        })
    }

    /// May the tenant list `bucket` under `prefix`? Only when a read grant
    /// covers the whole listing: the requested prefix starts with the grant's
    /// prefix (a grant for `"train/"` does not allow listing `""` or
    /// `"train"`, which would reveal other keys).
    #[must_use]
    pub fn allows_list(&self, bucket: &str, prefix: &str) -> bool {
        if !plausible_bucket(bucket) {
            return false;
        }
        self.grants
            .iter()
            .any(|g| g.read && bucket_matches(g, bucket) && prefix.starts_with(g.prefix.as_str()))
    }
}

fn bucket_matches(g: &Grant, bucket: &str) -> bool {
    g.bucket == "*" || g.bucket == bucket
}

/// A requested bucket name that could name a bucket: non-empty, no `/`, not
/// `*`, `.` or `..`.
fn plausible_bucket(bucket: &str) -> bool {
    !bucket.is_empty() && !bucket.contains('/') && !matches!(bucket, "*" | "." | "..")
}

/// Whether `key` has a `.` or `..` path segment.
fn has_dot_segment(key: &str) -> bool {
    key.split('/').any(|s| s == "." || s == "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(bucket: &str, prefix: &str, read: bool, write: bool) -> Grant {
        Grant {
            bucket: bucket.into(),
            prefix: prefix.into(),
            read,
            write,
        }
    }

    use Access::{Read, Write};

    #[test]
    fn object_access_table() {
        // (grants, bucket, key, access, allowed)
        let alice = [grant("alice-data", "", true, true)];
        let bob = [grant("shared", "datasets/", true, false)];
        let star_ro = [grant("*", "", true, false)];
        let write_only = [grant("drop", "in/", false, true)];
        let mixed = [
            grant("*", "public/", true, false),
            grant("team", "scratch/", true, true),
        ];
        let cases: &[(&[Grant], &str, &str, Access, bool)] = &[
            // Exact bucket, every key.
            (&alice, "alice-data", "a/b/c", Read, true),
            (&alice, "alice-data", "a/b/c", Write, true),
            (&alice, "alice-data", "", Read, true),
            (&alice, "alice-data2", "a", Read, false),
            (&alice, "alice-dat", "a", Read, false),
            (&alice, "other", "a", Write, false),
            // Prefix, read only.
            (&bob, "shared", "datasets/imagenet/0001.jpg", Read, true),
            (&bob, "shared", "datasets/", Read, true),
            (&bob, "shared", "datasets/x", Write, false),
            (&bob, "shared", "datasets", Read, false),
            (&bob, "shared", "datasetsX/y", Read, false),
            (&bob, "shared", "models/x", Read, false),
            (&bob, "shared", "Datasets/x", Read, false),
            (&bob, "other", "datasets/x", Read, false),
            // "*" matches every bucket.
            (&star_ro, "any-bucket", "k", Read, true),
            (&star_ro, "another", "deep/k", Read, true),
            (&star_ro, "any-bucket", "k", Write, false),
            // Write-only grant.
            (&write_only, "drop", "in/file", Write, true),
            (&write_only, "drop", "in/file", Read, false),
            (&write_only, "drop", "out/file", Write, false),
            // Several grants: any one may allow.
            (&mixed, "team", "public/x", Read, true),
            (&mixed, "team", "public/x", Write, false),
            (&mixed, "team", "scratch/x", Write, true),
            (&mixed, "other", "scratch/x", Write, false),
            (&mixed, "other", "public/y", Read, true),
            // Empty grants deny everything.
            (&[], "alice-data", "a", Read, false),
            (&[], "alice-data", "a", Write, false),
            // Dot segments are never allowed, even with a grant on every key.
            (&alice, "alice-data", "a/../b", Read, false),
            (&alice, "alice-data", "../other-bucket/k", Write, false),
            (&alice, "alice-data", "./a", Read, false),
            (&alice, "alice-data", "a/.", Read, false),
            (&bob, "shared", "datasets/../secret", Read, false),
            (&alice, "alice-data", "a/..b/.c", Read, true),
            (&alice, "alice-data", "a..b", Read, true),
            // Implausible bucket names are denied even under "*".
            (&star_ro, "", "k", Read, false),
            (&star_ro, "*", "k", Read, false),
            (&star_ro, "..", "k", Read, false),
            (&star_ro, "a/b", "k", Read, false),
        ];
        for (i, (grants, bucket, key, access, want)) in cases.iter().enumerate() {
            let p = TenantPolicy::new(grants);
            assert_eq!(
                p.allows(bucket, key, *access),
                *want,
                "case #{i}: {grants:?} {bucket}/{key} {access:?}"
            );
        }
    }

    #[test]
    fn list_table() {
        // (grants, bucket, requested prefix, allowed)
        let alice = [grant("alice-data", "", true, true)];
        let bob = [grant("shared", "datasets/", true, false)];
        let write_only = [grant("drop", "", false, true)];
        let star = [grant("*", "pub/", true, false)];
        let cases: &[(&[Grant], &str, &str, bool)] = &[
            (&alice, "alice-data", "", true),
            (&alice, "alice-data", "x/", true),
            (&alice, "other", "", false),
            (&bob, "shared", "datasets/", true),
            (&bob, "shared", "datasets/imagenet/", true),
            (&bob, "shared", "datasets/imagenet/00", true),
            // Listing more than the grant covers would reveal other keys.
            (&bob, "shared", "", false),
            (&bob, "shared", "data", false),
            (&bob, "shared", "datasets", false),
            (&bob, "shared", "models/", false),
            (&bob, "other", "datasets/", false),
            // A write-only grant does not allow listing.
            (&write_only, "drop", "", false),
            (&star, "b1", "pub/", true),
            (&star, "b2", "pub/x", true),
            (&star, "b2", "", false),
            (&star, "", "pub/", false),
            (&[], "alice-data", "", false),
        ];
        for (i, (grants, bucket, prefix, want)) in cases.iter().enumerate() {
            let p = TenantPolicy::new(grants);
            assert_eq!(
                p.allows_list(bucket, prefix),
                *want,
                "case #{i}: {grants:?} list {bucket}/{prefix}"
            );
        }
    }
}
