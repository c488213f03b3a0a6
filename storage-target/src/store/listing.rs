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
}

/// Lists `index` according to `p`.
#[must_use]
pub fn list<E: Clone>(index: &BTreeMap<String, E>, p: &ListParams<'_>) -> ListPage<E> {
    let mut page = ListPage {
        objects: Vec::new(),
        common_prefixes: Vec::new(),
        is_truncated: false,
        next_marker: None,
    };
    if p.max_keys == 0 {
        return page;
    }
    let delimiter = p.delimiter.filter(|d| !d.is_empty());
    let prefix = p.prefix;
    let start: Bound<&str> = match p.marker {
        Some(m) if m >= prefix => Bound::Excluded(m),
        _ => Bound::Included(prefix),
    };
    // A marker that is itself a common prefix means "after that whole group".
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
}
