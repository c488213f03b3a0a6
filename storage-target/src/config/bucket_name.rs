//! S3 bucket naming rules (general purpose buckets).

/// Whether `name` is a valid S3 bucket name: 3–63 characters of lowercase
/// letters, digits, `.` and `-`; starting and ending with a letter or digit;
/// no `..`, `.-` or `-.`; not shaped like an IPv4 address; none of the
/// reserved prefixes (`xn--`, `sthree-`, `amzn-s3-demo-`) or suffixes
/// (`-s3alias`, `--ol-s3`, `.mrap`, `--x-s3`, `--table-s3`).
#[must_use]
pub fn is_valid_bucket_name(name: &str) -> bool {
    let b = name.as_bytes();
    if !(3..=63).contains(&b.len()) {
        return false;
    }
    if !b
        .iter()
        .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
    {
        return false;
    }
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    if name.contains("..") || name.contains(".-") || name.contains("-.") {
        return false;
    }
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        return false;
    }
    const PREFIXES: [&str; 3] = ["xn--", "sthree-", "amzn-s3-demo-"];
    const SUFFIXES: [&str; 5] = ["-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"];
    !PREFIXES.iter().any(|p| name.starts_with(p)) && !SUFFIXES.iter().any(|s| name.ends_with(s))
}

#[cfg(test)]
mod tests {
    use super::is_valid_bucket_name as ok;

    #[test]
    fn valid_names() {
        for n in [
            "abc",
            "my-bucket",
            "my.bucket.1",
            "a1b",
            &"a".repeat(63),
            "0ab",
        ] {
            assert!(ok(n), "{n}");
        }
    }

    #[test]
    fn invalid_names() {
        for n in [
            "ab",
            &"a".repeat(64),
            "Abc",
            "a_b",
            "-ab",
            "ab-",
            ".ab",
            "ab.",
            "a..b",
            "a.-b",
            "a-.b",
            "192.168.1.1",
            "xn--abc",
            "sthree-abc",
            "abc-s3alias",
            "abc--ol-s3",
            "a b",
            "ab/c",
            "",
        ] {
            assert!(!ok(n), "{n}");
        }
    }
}
