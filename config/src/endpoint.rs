//! The one endpoint-URL rule: the dpu-agent's S3 targets and the
//! host-shim's agent are both written `http://host:port` or
//! `https://host:port`.

use std::net::Ipv6Addr;

/// What every endpoint message starts with.
const FORM: &str = "must be http(s)://host:port";

/// Why [`check_endpoint_url`] refused a URL. Messages never repeat the URL
/// (it could hold credentials); the configuration error names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointUrlError {
    /// Neither `http://` nor `https://`.
    #[error("must start with http:// or https:// (the scheme), e.g. http://192.168.100.2:7000")]
    Scheme,
    /// A path other than `/`.
    #[error("{FORM}: no path (the path is added per request)")]
    Path,
    /// A `?query`.
    #[error("{FORM}: no query")]
    Query,
    /// A `#fragment`.
    #[error("{FORM}: no fragment")]
    Fragment,
    /// `user:password@`.
    #[error("{FORM}: no user info (credentials belong in secret files)")]
    UserInfo,
    /// Whitespace or a control character.
    #[error("{FORM}: no spaces or control characters")]
    Whitespace,
    /// Nothing between `//` and `:port`.
    #[error("{FORM}: the host is missing")]
    NoHost,
    /// `[::1` without `]`.
    #[error("{FORM}: unterminated [IPv6 address]")]
    UnterminatedIpv6,
    /// Not an IPv6 address between the brackets.
    #[error("{FORM}: invalid IPv6 address in brackets")]
    InvalidIpv6,
    /// Something other than `:port` after `]`.
    #[error("{FORM}: unexpected characters after ']'")]
    AfterIpv6,
    /// An IPv6 address without brackets.
    #[error("{FORM}: write an IPv6 address in brackets, e.g. http://[::1]:9000")]
    Ipv6NeedsBrackets,
    /// A host name with other characters.
    #[error("{FORM}: the host may only contain letters, digits, '-', '.' and '_'")]
    HostCharacters,
    /// No `:port`.
    #[error("needs an explicit port: write http(s)://host:port, e.g. http://192.168.100.2:7000")]
    NoPort,
    /// `:0`, `:65536`, `:+80`, `:`.
    #[error("{FORM}: the port must be a number from 1 to 65535")]
    BadPort,
}

/// A checked endpoint URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointUrl {
    /// `https://`.
    pub https: bool,
    /// The host: a name, an IPv4 address or an IPv6 address (without
    /// brackets).
    pub host: String,
    /// The port (never 0).
    pub port: u16,
}

/// Checks an endpoint URL: `http://` or `https://`, then `host:port` (an
/// IPv6 address in brackets, `[::1]:9000`), optionally followed by a single
/// `/`. The port is required: a default port is a guess about the peer
/// that a configuration should not leave to the reader.
///
/// # Errors
/// An [`EndpointUrlError`] saying what is wrong (never quoting the URL).
pub fn check_endpoint_url(endpoint: &str) -> Result<EndpointUrl, EndpointUrlError> {
    use EndpointUrlError as E;
    let (https, rest) = if let Some(r) = endpoint.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = endpoint.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(E::Scheme);
    };
    let (authority, tail) = rest
        .find(['/', '?', '#'])
        .and_then(|i| rest.split_at_checked(i))
        .unwrap_or((rest, ""));
    let (path, after_path) = tail
        .find(['?', '#'])
        .and_then(|i| tail.split_at_checked(i))
        .unwrap_or((tail, ""));
    if !path.is_empty() && path != "/" {
        return Err(E::Path);
    }
    if after_path.starts_with('?') {
        return Err(E::Query);
    }
    if after_path.starts_with('#') {
        return Err(E::Fragment);
    }
    if authority.contains('@') {
        return Err(E::UserInfo);
    }
    if authority
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(E::Whitespace);
    }
    if authority.is_empty() {
        return Err(E::NoHost);
    }
    let (host, port) = if let Some(r) = authority.strip_prefix('[') {
        let Some((h, after)) = r.split_once(']') else {
            return Err(E::UnterminatedIpv6);
        };
        if h.parse::<Ipv6Addr>().is_err() {
            return Err(E::InvalidIpv6);
        }
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or(E::AfterIpv6)?),
        };
        (h, port)
    } else {
        if authority.matches(':').count() > 1 {
            return Err(E::Ipv6NeedsBrackets);
        }
        let (h, port) = match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        if h.is_empty() {
            return Err(E::NoHost);
        }
        if !h
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        {
            return Err(E::HostCharacters);
        }
        (h, port)
    };
    let port = port.ok_or(E::NoPort)?;
    let port = if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
        port.parse::<u16>().ok().filter(|&n| n != 0)
    } else {
        None
    }
    .ok_or(E::BadPort)?;
    Ok(EndpointUrl {
        https,
        host: host.to_owned(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use EndpointUrlError as E;

    #[test]
    fn accepted() {
        let ok = |u: &str, https, host: &str, port| {
            assert_eq!(
                check_endpoint_url(u),
                Ok(EndpointUrl {
                    https,
                    host: host.into(),
                    port
                }),
                "{u}"
            );
        };
        ok("http://127.0.0.1:9000", false, "127.0.0.1", 9000);
        ok("http://127.0.0.1:9000/", false, "127.0.0.1", 9000);
        ok(
            "https://s3.example_1-a.com:443",
            true,
            "s3.example_1-a.com",
            443,
        );
        ok("http://[::1]:7000", false, "::1", 7000);
    }

    #[test]
    fn refused() {
        let cases = [
            ("http://h", E::NoPort),
            ("https://s3.amazonaws.com", E::NoPort),
            ("https://s3.amazonaws.com/", E::NoPort),
            ("http://[::1]", E::NoPort),
            ("127.0.0.1:9000", E::Scheme),
            ("ftp://h:1", E::Scheme),
            ("http://h:1/s3", E::Path),
            ("http://h:1?x=1", E::Query),
            ("http://h:1/?x=1", E::Query),
            ("http://h#f", E::Fragment),
            ("http://user:pw@h:9000", E::UserInfo),
            ("http://h :9000", E::Whitespace),
            ("http://", E::NoHost),
            ("https://:443", E::NoHost),
            ("http://h:", E::BadPort),
            ("http://h:65536", E::BadPort),
            ("http://h:0", E::BadPort),
            ("http://h:+80", E::BadPort),
            ("http://::1:9000", E::Ipv6NeedsBrackets),
            ("http://[::g]:9000", E::InvalidIpv6),
            ("http://[::1:9000", E::UnterminatedIpv6),
            ("http://[::1]9000", E::AfterIpv6),
            ("http://bad!host:1", E::HostCharacters),
        ];
        for (u, want) in cases {
            assert_eq!(check_endpoint_url(u), Err(want.clone()), "{u}");
            let m = want.to_string();
            assert!(!m.contains(u), "{u}: {m}");
        }
        assert!(E::NoPort.to_string().contains("needs an explicit port"));
        assert!(E::Scheme.to_string().starts_with("must start with http://"));
    }
}
