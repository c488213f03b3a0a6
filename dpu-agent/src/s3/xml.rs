//! The few S3 XML documents the agent reads and writes, as serde types for
//! quick-xml.

use serde::{Deserialize, Serialize};

/// `<Error>`: the body of every S3 error reply.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ErrorBody {
    /// S3 error code.
    pub code: String,
    /// Human-readable message.
    pub message: String,
    /// The server's request id.
    pub request_id: String,
}

/// `<ListBucketResult>` of ListObjectsV2.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ListBucketResult {
    /// Whether more pages follow.
    pub is_truncated: bool,
    /// Token for the next page.
    pub next_continuation_token: Option<String>,
    /// `url` when keys and prefixes are URL-encoded.
    pub encoding_type: Option<String>,
    /// The objects of this page.
    pub contents: Vec<ListedContent>,
    /// Grouped prefixes (with a delimiter).
    pub common_prefixes: Vec<CommonPrefix>,
}

/// One `<Contents>` entry.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ListedContent {
    /// Object key.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// Entity tag (quoted).
    #[serde(rename = "ETag")]
    pub etag: String,
    /// ISO 8601 timestamp.
    pub last_modified: String,
}

/// One `<CommonPrefixes>` entry.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CommonPrefix {
    /// The prefix.
    pub prefix: String,
}

/// `<InitiateMultipartUploadResult>`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct InitiateMultipartUploadResult {
    /// The upload id.
    pub upload_id: String,
}

/// `<CompleteMultipartUploadResult>` (a 200 reply may carry `<Error>` instead).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CompleteMultipartUploadResult {
    /// The object's ETag.
    #[serde(rename = "ETag")]
    pub etag: String,
}

/// `<CompleteMultipartUpload>` request body.
#[derive(Debug, Serialize)]
#[serde(rename = "CompleteMultipartUpload")]
pub struct CompleteMultipartUpload {
    /// The parts in order.
    #[serde(rename = "Part")]
    pub parts: Vec<CompletedPart>,
}

/// One part of [`CompleteMultipartUpload`].
#[derive(Debug, Serialize)]
pub struct CompletedPart {
    /// 1-based part number.
    #[serde(rename = "PartNumber")]
    pub part_number: u32,
    /// The part's ETag as UploadPart returned it.
    #[serde(rename = "ETag")]
    pub etag: String,
}

/// Why an XML reply could not be read. The message includes the
/// parser's (callers keep only the text, in a protocol error).
#[derive(Debug, thiserror::Error)]
pub enum XmlError {
    /// Not UTF-8 text.
    #[error("the reply is not UTF-8: {0}")]
    Utf8(std::str::Utf8Error),
    /// Not the document expected.
    #[error("the reply is not the XML document expected: {0}")]
    Document(quick_xml::DeError),
}

impl From<std::str::Utf8Error> for XmlError {
    fn from(e: std::str::Utf8Error) -> Self {
        XmlError::Utf8(e)
    }
}

impl From<quick_xml::DeError> for XmlError {
    fn from(e: quick_xml::DeError) -> Self {
        XmlError::Document(e)
    }
}

/// Parses an XML document into `T`.
///
/// # Errors
/// [`XmlError`].
pub fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, XmlError> {
    let text = std::str::from_utf8(body)?;
    Ok(quick_xml::de::from_str(text)?)
}

/// The root element's name of an XML document (to tell `<Error>` from a result).
#[must_use]
pub fn root_name(body: &[u8]) -> Option<String> {
    let mut reader = quick_xml::Reader::from_reader(body);
    let mut buf = Vec::new();
    loop {
        match reader.read_event_into(&mut buf) {
            Ok(quick_xml::events::Event::Start(e) | quick_xml::events::Event::Empty(e)) => {
                return Some(String::from_utf8_lossy(e.local_name().as_ref()).into_owned());
            }
            Ok(quick_xml::events::Event::Eof) | Err(_) => return None,
            Ok(_) => buf.clear(),
        }
    }
}

/// Serialises the CompleteMultipartUpload body.
///
/// # Errors
/// The serialiser's error.
pub fn complete_body(parts: Vec<CompletedPart>) -> Result<String, quick_xml::SeError> {
    let doc = CompleteMultipartUpload { parts };
    quick_xml::se::to_string(&doc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_list_v2() {
        let body = br#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Prefix></Prefix>
<KeyCount>2</KeyCount><MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated>
<Contents><Key>a</Key><LastModified>2024-01-02T03:04:05.000Z</LastModified><ETag>&quot;x&quot;</ETag><Size>3</Size><StorageClass>STANDARD</StorageClass></Contents>
<Contents><Key>b</Key><LastModified>2024-01-02T03:04:05.000Z</LastModified><ETag>"y"</ETag><Size>0</Size></Contents>
<CommonPrefixes><Prefix>d/</Prefix></CommonPrefixes>
<NextContinuationToken>tok</NextContinuationToken></ListBucketResult>"#;
        let r: ListBucketResult = parse(body).unwrap();
        assert!(r.is_truncated);
        assert_eq!(r.contents.len(), 2);
        assert_eq!(r.contents[0].etag, "\"x\"");
        assert_eq!(r.contents[0].size, 3);
        assert_eq!(r.common_prefixes[0].prefix, "d/");
        assert_eq!(r.next_continuation_token.as_deref(), Some("tok"));
    }

    #[test]
    fn parses_error_and_root() {
        let body = b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>gone</Message><RequestId>R</RequestId></Error>";
        assert_eq!(root_name(body).as_deref(), Some("Error"));
        let e: ErrorBody = parse(body).unwrap();
        assert_eq!(e.code, "NoSuchKey");
        assert_eq!(e.request_id, "R");
        assert!(parse::<ErrorBody>(b"<Error><Code>").is_err());
        assert_eq!(root_name(b"garbage"), None);
    }

    #[test]
    fn writes_complete_body() {
        let s = complete_body(vec![
            CompletedPart {
                part_number: 1,
                etag: "\"a\"".into(),
            },
            CompletedPart {
                part_number: 2,
                etag: "\"b\"".into(),
            },
        ])
        .unwrap();
        assert!(s.starts_with("<CompleteMultipartUpload><Part><PartNumber>1</PartNumber>"));
        assert!(s.contains("<ETag>&quot;b&quot;</ETag>") || s.contains("<ETag>\"b\"</ETag>"));
    }
}
