//! Listing logic over an ordered key index: prefix, delimiter roll-up into
//! common prefixes, markers and page size. Pure; the store feeds it its
//! in-memory index.

use std::collections::BTreeMap;
use std::ops::Bound;

use base64::Engine as _;

/// Parameters of one listing page.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListParams<'a> {
    /// Only keys starting with this.
    pub prefix: &'a str,
    /// Roll keys up to the first occurrence of this after the prefix (empty = none).
    pub delimiter: Option<&'a str>,
    /// Start after this key (StartAfter, Marker or a decoded continuation token).
    /// If it is exactly a common prefix, every key under it is skipped too.
    pub marker: Option<&'a str>,
    /// Page size: keys plus common prefixes.
    pub max_keys: usize,
}

/// One page of results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage<E> {
    /// Keys, in byte order, with their entries.
    pub objects: Vec<(String, E)>,
    /// Common prefixes, in byte order.
    pub common_prefixes: Vec<String>,
    /// Whether more results follow.
    pub is_truncated: bool,
    /// The last key or common prefix returned when truncated: the marker for the next page.
    pub next_marker: Option<String>,
    /// Index entries the listing read (at most `max_keys + 1`, however
    /// many keys the bucket or a common prefix holds).
    pub visited: usize,
}

impl<E> Default for ListPage<E> {
    /// An empty page, not truncated.
    fn default() -> Self {
        ListPage {
            objects: Vec::new(),
            common_prefixes: Vec::new(),
            is_truncated: false,
            next_marker: None,
            visited: 0,
        }
    }
}

/// Lists `index` according to `p`.
///
/// The work is proportional to the page, not to the bucket: keys are read
/// in order from the start, and once a key rolls up into a common prefix
/// the walk seeks past every key under that prefix (to its
/// [`prefix_successor`]) instead of stepping through them. At most
/// `max_keys + 1` entries are visited ([`ListPage::visited`]), each found
/// with one ordered-map step or seek.
#[must_use]
pub fn list<E: Clone>(index: &BTreeMap<String, E>, p: &ListParams<'_>) -> ListPage<E> {
    let mut page = ListPage::default();
    if p.max_keys == 0 {
        return page;
    }
    let delimiter = p.delimiter.filter(|d| !d.is_empty());
    let prefix = p.prefix;
    let mut from: Bound<String> = match p.marker {
        Some(m) if m >= prefix => {
            // A marker that is itself a common prefix means "after that
            // whole group".
            match delimiter.and_then(|d| common_prefix_of(m, prefix, d)) {
                Some(cp) if cp == m => match prefix_successor(cp) {
                    Some(next) => Bound::Included(next),
                    None => return page,
                },
                _ => Bound::Excluded(m.to_owned()),
            }
        }
        _ => Bound::Included(prefix.to_owned()),
    };
    let mut count = 0usize;
    'seek: loop {
        let range = index.range::<str, _>((bound_str(&from), Bound::Unbounded));
        for (key, entry) in range {
            page.visited += 1;
            if !key.starts_with(prefix) {
                break 'seek;
            }
            if count == p.max_keys {
                page.is_truncated = true;
                break 'seek;
            }
            count += 1;
            match delimiter.and_then(|d| common_prefix_of(key, prefix, d)) {
                Some(cp) => {
                    page.common_prefixes.push(cp.to_owned());
                    page.next_marker = Some(cp.to_owned());
                    // Every key under `cp` rolls up into it: go past them.
                    match prefix_successor(cp) {
                        Some(next) => {
                            from = Bound::Included(next);
                            continue 'seek;
                        }
                        None => break 'seek,
                    }
                }
                None => {
                    page.objects.push((key.clone(), entry.clone()));
                    page.next_marker = Some(key.clone());
                }
            }
        }
        break;
    }
    if !page.is_truncated {
        page.next_marker = None;
    }
    page
}

fn bound_str(b: &Bound<String>) -> Bound<&str> {
    match b {
        Bound::Included(s) => Bound::Included(s.as_str()),
        Bound::Excluded(s) => Bound::Excluded(s.as_str()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// The smallest string greater than every string that starts with `p`
/// (in byte order, which for UTF-8 is code point order): `p` with its last
/// character replaced by the next one, dropping trailing `U+10FFFF`s first.
/// `None` when there is none (`p` empty or all `U+10FFFF`): nothing sorts
/// after the strings starting with `p`.
#[must_use]
pub fn prefix_successor(p: &str) -> Option<String> {
    let mut s = p.to_owned();
    while let Some(c) = s.pop() {
        let next = match u32::from(c) {
            // The surrogates are not characters.
            0xD7FF => Some('\u{E000}'),
            n => char::from_u32(n + 1),
        };
        if let Some(n) = next {
            s.push(n);
            return Some(s);
        }
    }
    None
}

/// The common prefix `key` rolls up into: `prefix` plus the rest of the key up
/// to and including the first `delimiter` after the prefix.
#[must_use]
pub fn common_prefix_of<'k>(key: &'k str, prefix: &str, delimiter: &str) -> Option<&'k str> {
    let rest = key.strip_prefix(prefix)?;
    let i = rest.find(delimiter)?;
    Some(&key[..prefix.len() + i + delimiter.len()])
}

/// Encodes a marker as an opaque ListObjectsV2 continuation token.
#[must_use]
pub fn encode_token(marker: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(marker)
}

/// Decodes a continuation token made by [`encode_token`].
#[must_use]
pub fn decode_token(token: &str) -> Option<String> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    String::from_utf8(raw).ok()
}

/// URL-encodes a key for `encoding-type=url` responses: everything except
/// unreserved characters and `/`.
#[must_use]
pub fn url_encode(s: &str) -> String {
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
    const SET: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~')
        .remove(b'/');
    utf8_percent_encode(s, SET).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(keys: &[&str]) -> BTreeMap<String, ()> {
        keys.iter().map(|k| ((*k).to_owned(), ())).collect()
    }

    fn keys(p: &ListPage<()>) -> Vec<&str> {
        p.objects.iter().map(|(k, _)| k.as_str()).collect()
    }

    fn params<'a>(
        prefix: &'a str,
        delimiter: Option<&'a str>,
        marker: Option<&'a str>,
        max: usize,
    ) -> ListParams<'a> {
        ListParams {
            prefix,
            delimiter,
            marker,
            max_keys: max,
        }
    }

    const KEYS: &[&str] = &["a", "a/b", "a/c/d", "a/c/e", "b", "b/x", "c"];

    #[test]
    fn plain_and_prefix() {
        let ix = index(KEYS);
        let p = list(&ix, &params("", None, None, 1000));
        assert_eq!(keys(&p), KEYS);
        assert!(!p.is_truncated);
        let p = list(&ix, &params("a/", None, None, 1000));
        assert_eq!(keys(&p), ["a/b", "a/c/d", "a/c/e"]);
        let p = list(&ix, &params("zz", None, None, 1000));
        assert!(p.objects.is_empty() && p.common_prefixes.is_empty());
    }

    #[test]
    fn delimiter() {
        let ix = index(KEYS);
        let p = list(&ix, &params("", Some("/"), None, 1000));
        assert_eq!(keys(&p), ["a", "b", "c"]);
        assert_eq!(p.common_prefixes, ["a/", "b/"]);
        let p = list(&ix, &params("a/", Some("/"), None, 1000));
        assert_eq!(keys(&p), ["a/b"]);
        assert_eq!(p.common_prefixes, ["a/c/"]);
    }

    #[test]
    fn pagination_with_delimiter_visits_everything_once() {
        let ix = index(KEYS);
        let mut marker: Option<String> = None;
        let mut objs = Vec::new();
        let mut cps = Vec::new();
        loop {
            let p = list(&ix, &params("", Some("/"), marker.as_deref(), 1));
            assert!(p.objects.len() + p.common_prefixes.len() <= 1);
            objs.extend(p.objects.iter().map(|(k, _)| k.clone()));
            cps.extend(p.common_prefixes.clone());
            if !p.is_truncated {
                break;
            }
            marker = p.next_marker;
        }
        assert_eq!(objs, ["a", "b", "c"]);
        assert_eq!(cps, ["a/", "b/"]);
    }

    #[test]
    fn pagination_plain() {
        let ix = index(KEYS);
        let p = list(&ix, &params("", None, None, 2));
        assert_eq!(keys(&p), ["a", "a/b"]);
        assert!(p.is_truncated);
        assert_eq!(p.next_marker.as_deref(), Some("a/b"));
        let p = list(&ix, &params("", None, Some("a/b"), 100));
        assert_eq!(keys(&p), ["a/c/d", "a/c/e", "b", "b/x", "c"]);
        assert!(!p.is_truncated);
        assert_eq!(p.next_marker, None);
        // Exactly a full page: not truncated.
        let p = list(&ix, &params("", None, None, KEYS.len()));
        assert!(!p.is_truncated);
    }

    #[test]
    fn start_after_and_max_zero() {
        let ix = index(KEYS);
        let p = list(&ix, &params("", None, Some("b"), 1000));
        assert_eq!(keys(&p), ["b/x", "c"]);
        let p = list(&ix, &params("", None, Some("zzz"), 1000));
        assert!(p.objects.is_empty());
        let p = list(&ix, &params("", None, None, 0));
        assert!(p.objects.is_empty() && !p.is_truncated);
        // A marker before the prefix starts at the prefix.
        let p = list(&ix, &params("b", None, Some("a"), 1000));
        assert_eq!(keys(&p), ["b", "b/x"]);
    }

    #[test]
    fn byte_order() {
        let ix = index(&["Z", "a", "é", "\u{1F600}", "~"]);
        let p = list(&ix, &params("", None, None, 10));
        assert_eq!(keys(&p), ["Z", "a", "~", "é", "\u{1F600}"]);
    }

    #[test]
    fn multi_char_delimiter() {
        let ix = index(&["x--y--z", "x--w", "q"]);
        let p = list(&ix, &params("", Some("--"), None, 10));
        assert_eq!(keys(&p), ["q"]);
        assert_eq!(p.common_prefixes, ["x--"]);
    }

    #[test]
    fn tokens_and_encoding() {
        for m in ["", "a/b", "é/\u{1F600} x"] {
            assert_eq!(decode_token(&encode_token(m)).as_deref(), Some(m));
        }
        assert_eq!(decode_token("!!"), None);
        assert_eq!(url_encode("a b/c+d%é"), "a%20b/c%2Bd%25%C3%A9");
    }

    /// The listing as it was first written: every key from the start is
    /// stepped through, also those under a common prefix already returned.
    /// The reference for [`list`].
    fn naive<E: Clone>(index: &BTreeMap<String, E>, p: &ListParams<'_>) -> ListPage<E> {
        let mut page = ListPage::default();
        if p.max_keys == 0 {
            return page;
        }
        let delimiter = p.delimiter.filter(|d| !d.is_empty());
        let prefix = p.prefix;
        let start: Bound<&str> = match p.marker {
            Some(m) if m >= prefix => Bound::Excluded(m),
            _ => Bound::Included(prefix),
        };
        let skip_group = match (p.marker, delimiter) {
            (Some(m), Some(d)) => common_prefix_of(m, prefix, d).filter(|cp| *cp == m),
            _ => None,
        };
        let mut last_cp: Option<&str> = None;
        let mut count = 0usize;
        for (key, entry) in index.range::<str, _>((start, Bound::Unbounded)) {
            if !key.starts_with(prefix) {
                break;
            }
            if let Some(g) = skip_group
                && key.starts_with(g)
            {
                continue;
            }
            let cp = delimiter.and_then(|d| common_prefix_of(key, prefix, d));
            if let Some(cp) = cp
                && last_cp == Some(cp)
            {
                continue;
            }
            if count == p.max_keys {
                page.is_truncated = true;
                break;
            }
            count += 1;
            match cp {
                Some(cp) => {
                    last_cp = Some(cp);
                    page.common_prefixes.push(cp.to_owned());
                    page.next_marker = Some(cp.to_owned());
                }
                None => {
                    page.objects.push((key.clone(), entry.clone()));
                    page.next_marker = Some(key.clone());
                }
            }
        }
        if !page.is_truncated {
            page.next_marker = None;
        }
        page
    }

    #[test]
    fn prefix_successors() {
        assert_eq!(prefix_successor("a/").as_deref(), Some("a0"));
        assert_eq!(prefix_successor("a"), Some("b".to_owned()));
        assert_eq!(prefix_successor(""), None);
        assert_eq!(prefix_successor("\u{10FFFF}"), None);
        assert_eq!(
            prefix_successor("a\u{10FFFF}\u{10FFFF}").as_deref(),
            Some("b")
        );
        assert_eq!(prefix_successor("x\u{D7FF}").as_deref(), Some("x\u{E000}"));
        assert_eq!(prefix_successor("\u{7F}").as_deref(), Some("\u{80}"));
        // Every string starting with p sorts below the successor, and the
        // successor does not start with p.
        for p in ["a/", "\u{7F}", "é/", "\u{FFFF}", "a\u{10FFFF}", "x\u{D7FF}"] {
            let s = prefix_successor(p).unwrap();
            assert!(!s.starts_with(p));
            for tail in ["", "\u{0}", "zz", "\u{10FFFF}\u{10FFFF}"] {
                assert!(format!("{p}{tail}") < s, "{p:?}{tail:?} vs {s:?}");
            }
        }
    }

    /// Issue 30 finding 7: a delimiter listing of a bucket whose keys all
    /// roll up into a few common prefixes reads a page's worth of entries,
    /// not every key under them.
    #[test]
    fn a_rolled_up_prefix_is_skipped_not_walked() {
        let mut ix = BTreeMap::new();
        for i in 0..20_000 {
            ix.insert(format!("big/{i:06}"), ());
        }
        ix.insert("after".to_owned(), ());
        ix.insert("zz/1".to_owned(), ());
        let p = list(&ix, &params("", Some("/"), None, 1000));
        assert_eq!(p.common_prefixes, ["big/", "zz/"]);
        assert_eq!(keys(&p), ["after"]);
        assert!(p.visited <= 4, "visited {}", p.visited);
        assert!(
            naive(&ix, &params("", Some("/"), None, 1000))
                .common_prefixes
                .len()
                == 2
        );
        // Paging one entry at a time: each page reads at most two entries.
        let mut marker: Option<String> = None;
        loop {
            let p = list(&ix, &params("", Some("/"), marker.as_deref(), 1));
            assert!(p.visited <= 2, "visited {}", p.visited);
            if !p.is_truncated {
                break;
            }
            marker = p.next_marker;
        }
    }

    mod property {
        use super::*;
        use proptest::prelude::*;

        /// Keys over a small alphabet with delimiters and characters on
        /// both sides of the UTF-8 width boundaries, so that prefixes and
        /// common prefixes collide often.
        fn key() -> impl Strategy<Value = String> {
            proptest::collection::vec(
                proptest::sample::select(vec![
                    'a',
                    'b',
                    '/',
                    '-',
                    '0',
                    '\u{7F}',
                    '\u{80}',
                    'é',
                    '\u{D7FF}',
                    '\u{E000}',
                    '\u{FFFF}',
                    '\u{10000}',
                    '\u{10FFFF}',
                ]),
                0..6,
            )
            .prop_map(|v| v.into_iter().collect())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]
            #[test]
            fn list_matches_the_naive_walk(
                keys in proptest::collection::btree_set(key(), 0..40),
                prefix in key().prop_map(|k| k.chars().take(2).collect::<String>()),
                delimiter in proptest::sample::select(vec!["", "/", "-", "a/", "\u{10FFFF}", "é"]),
                marker in proptest::option::of(key()),
                max in 0usize..8,
            ) {
                let ix: BTreeMap<String, ()> = keys.into_iter().map(|k| (k, ())).collect();
                let p = ListParams {
                    prefix: &prefix,
                    delimiter: Some(delimiter),
                    marker: marker.as_deref(),
                    max_keys: max,
                };
                let got = list(&ix, &p);
                let want = naive(&ix, &p);
                prop_assert!(got.visited <= max + 1);
                prop_assert_eq!(got.objects, want.objects);
                prop_assert_eq!(got.common_prefixes, want.common_prefixes);
                prop_assert_eq!(got.is_truncated, want.is_truncated);
                prop_assert_eq!(got.next_marker, want.next_marker);
            }

            /// Paging through with each page's marker returns what one
            /// unbounded page returns, each entry once.
            #[test]
            fn pages_add_up_to_the_whole(
                keys in proptest::collection::btree_set(key(), 0..40),
                delimiter in proptest::sample::select(vec!["", "/", "a/", "\u{10FFFF}"]),
                max in 1usize..5,
            ) {
                let ix: BTreeMap<String, ()> = keys.into_iter().map(|k| (k, ())).collect();
                let whole = list(&ix, &params("", Some(delimiter), None, usize::MAX));
                let mut objs = Vec::new();
                let mut cps = Vec::new();
                let mut marker: Option<String> = None;
                loop {
                    let p = list(&ix, &params("", Some(delimiter), marker.as_deref(), max));
                    objs.extend(p.objects);
                    cps.extend(p.common_prefixes);
                    if !p.is_truncated {
                        break;
                    }
                    marker = p.next_marker;
                }
                prop_assert_eq!(objs, whole.objects);
                prop_assert_eq!(cps, whole.common_prefixes);
            }
        }
    }
}
