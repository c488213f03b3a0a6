//! Requests to the storage-target as a tenant would send them, byte for
//! byte: signed (SigV4 in a header, or presigned) by aws-sigv4, written as
//! raw HTTP/1.1 so a test can send exactly what it wants (old dates, odd
//! token bytes, duplicate headers), and the responses read back.

use super::*;

/// Signs as a tenant of the target with aws-sigv4, path style, region
/// us-east-1, and writes the request's bytes.
pub(super) struct Signer {
    host: String,
    identity: aws_smithy_runtime_api::client::identity::Identity,
}

impl Signer {
    pub(super) fn alice(endpoint: &str) -> Signer {
        Signer {
            host: endpoint.trim_start_matches("http://").to_owned(),
            identity: aws_credential_types::Credentials::new(
                ALICE.0, ALICE.1, None, None, "hostile",
            )
            .into(),
        }
    }

    /// The head of `r` (request line and headers, up to the blank line not
    /// included) signed by aws-sigv4: in the `Authorization` header, or
    /// presigned (query-string auth) valid `presigned` from `r.when`.
    fn head(&self, r: &Req<'_>, presigned: Option<Duration>) -> Vec<u8> {
        use aws_sigv4::http_request::{
            PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest,
            SignatureLocation, SigningSettings, UriPathNormalizationMode, sign,
        };
        let mut settings = SigningSettings::default();
        // S3 signs the path as sent: encoded once, not normalised.
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        match presigned {
            None => settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256,
            Some(expires) => {
                settings.signature_location = SignatureLocation::QueryParams;
                settings.expires_in = Some(expires);
            }
        }
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&self.identity)
            .region("us-east-1")
            .name("s3")
            .time(r.when)
            .settings(settings)
            .build()
            .unwrap()
            .into();
        let mut headers = r.headers.clone();
        headers.push(("host", self.host.clone().into_bytes()));
        // What aws-sigv4 signs: visible ASCII only.
        let signable: Vec<(&str, String)> = headers
            .iter()
            .map(|(n, v)| {
                let v: String = v
                    .iter()
                    .map(|&b| {
                        if b == b' ' || b.is_ascii_graphic() {
                            b as char
                        } else {
                            '?'
                        }
                    })
                    .collect();
                (*n, v)
            })
            .collect();
        let uri = format!("http://{}{}", self.host, r.path);
        let body = if r.unsigned_payload || presigned.is_some() {
            SignableBody::UnsignedPayload
        } else {
            SignableBody::Bytes(r.body)
        };
        let request = SignableRequest::new(
            r.method,
            &uri,
            signable.iter().map(|(n, v)| (*n, v.as_str())),
            body,
        )
        .unwrap();
        let (instructions, _) = sign(request, &params).unwrap().into_parts();
        // What signing adds (headers, or query parameters), on an empty
        // request for the same URI.
        let mut added = http::Request::builder().uri(&uri).body(()).unwrap();
        instructions.apply_to_request_http1x(&mut added);
        let target = added.uri().path_and_query().unwrap().as_str().to_owned();
        let mut out = format!("{} {target} HTTP/1.1\r\n", r.method).into_bytes();
        let added = added
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_bytes().to_vec()));
        for (n, v) in headers.iter().map(|(n, v)| (*n, v.clone())).chain(added) {
            out.extend_from_slice(n.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(&v);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    /// The request's bytes, signed in the `Authorization` header.
    pub(super) fn sign(&self, r: &Req<'_>) -> Vec<u8> {
        let mut out = self.head(r, None);
        out.extend_from_slice(
            format!(
                "content-length: {}\r\nconnection: {}\r\n\r\n",
                r.body.len(),
                if r.keep_alive { "keep-alive" } else { "close" }
            )
            .as_bytes(),
        );
        out.extend_from_slice(r.body);
        out
    }

    /// A presigned request (query-string auth) valid `expires` seconds from
    /// `r.when`, with `r.headers` among its signed headers.
    pub(super) fn presign(&self, r: &Req<'_>, expires: u64) -> Vec<u8> {
        let mut out = self.head(r, Some(Duration::from_secs(expires)));
        out.extend_from_slice(b"content-length: 0\r\nconnection: close\r\n\r\n");
        out
    }
}

/// One request to sign.
pub(super) struct Req<'a> {
    pub(super) method: &'a str,
    /// Already encoded.
    pub(super) path: &'a str,
    /// Signed headers besides host, x-amz-date and x-amz-content-sha256; a
    /// name may repeat. A value aws-sigv4 cannot sign (bytes outside
    /// visible ASCII) is signed with `?` in place of each such byte and
    /// sent as given: a header changed after signing.
    pub(super) headers: Vec<(&'a str, Vec<u8>)>,
    pub(super) body: &'a [u8],
    /// `x-amz-content-sha256`: the body's hash when `false`.
    pub(super) unsigned_payload: bool,
    pub(super) when: SystemTime,
    pub(super) keep_alive: bool,
}

impl<'a> Req<'a> {
    pub(super) fn new(method: &'a str, path: &'a str) -> Req<'a> {
        Req {
            method,
            path,
            headers: Vec::new(),
            body: b"",
            unsigned_payload: true,
            when: SystemTime::now(),
            keep_alive: false,
        }
    }

    /// A token of s3dma's exchange: with the dialect marker (both signed).
    pub(super) fn token(mut self, t: impl Into<Vec<u8>>) -> Self {
        self.headers.push(("x-amz-rdma-token", t.into()));
        self.headers
            .push(("x-amz-rdma-protocol", b"s3dma-v1".to_vec()));
        self
    }
}

/// An HTTP response read to the end of the connection.
/// Header `name` of an HTTP message head (the start line, then `Name:
/// value` lines).
pub(super) fn header_of(head: &str, name: &str) -> Option<String> {
    head.lines().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

#[derive(Debug)]
pub(super) struct Resp {
    pub(super) status: u16,
    pub(super) head: String,
    pub(super) body: Vec<u8>,
}

impl Resp {
    pub(super) fn header(&self, name: &str) -> Option<String> {
        header_of(&self.head, name)
    }

    pub(super) fn text(&self) -> String {
        format!("{}\n{}", self.head, String::from_utf8_lossy(&self.body))
    }

    /// The `<Code>` of an S3 error body.
    pub(super) fn code(&self) -> Option<String> {
        let t = String::from_utf8_lossy(&self.body);
        let start = t.find("<Code>")? + 6;
        let end = start + t[start..].find("</Code>")?;
        Some(t[start..end].to_owned())
    }

    #[track_caller]
    pub(super) fn expect(&self, status: u16, code: &str, what: &str) {
        assert_eq!(
            (self.status, self.code().as_deref()),
            (status, Some(code)),
            "{what}: {}",
            self.text()
        );
        assert!(
            self.header("x-amz-rdma-reply").is_none(),
            "{what}: an error must carry no x-amz-rdma-reply: {}",
            self.text()
        );
    }
}

pub(super) async fn http(addr: SocketAddr, req: &[u8]) -> Resp {
    guard("HTTP exchange", async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(req).await.unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(&raw)));
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line in {head:?}"));
        Resp {
            status,
            head,
            body: raw[split + 4..].to_vec(),
        }
    })
    .await
}
