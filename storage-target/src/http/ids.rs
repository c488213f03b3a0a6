//! Request ids and the response fix-ups that name them: the target's own
//! id (`x-amz-request-id`, `x-amz-id-2`, the `<RequestId>` of XML error
//! bodies, with a message for errors s3s raises without one), the
//! client's id, the operation slot the access check fills, and the status
//! a handler may set where s3s would drop it.

use std::sync::{Arc, Mutex};

use http::StatusCode;
use tracing::Level;

use s3dma_service::request::Style;

/// The request id of the current request, in the request extensions.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// Slot in the request extensions where the access check records the S3
/// operation name (s3s resolves it; the wrapper labels metrics with it).
#[derive(Debug, Clone, Default)]
pub struct OpSlot(Arc<Mutex<Option<String>>>);

impl OpSlot {
    /// Records the operation name.
    pub fn set(&self, op: &str) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(op.to_owned());
    }

    /// The recorded operation name, or `"unknown"` (e.g. failed authentication).
    #[must_use]
    pub fn get(&self) -> String {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "unknown".to_owned())
    }
}

/// Headers whose value a client may send as its own request id, logged as
/// `client_request_id` (first one present wins).
pub(super) const CLIENT_REQUEST_ID_HEADERS: [&str; 2] = ["x-s3dma-request-id", "x-request-id"];

/// The target's envelopes: an `info` span per request (its line is the
/// access log).
pub(super) const STYLE: Style = Style {
    span: Level::INFO,
    client_failure: Level::INFO,
    ok: "200",
};

/// A status a handler sets on its response where s3s would drop it
/// (s3s ignores `S3Response::status` for some operations, e.g. HeadObject).
#[derive(Debug, Clone, Copy)]
pub struct StatusOverride(pub StatusCode);

/// Generates an AWS-style request id: 16 upper-case hex digits.
#[must_use]
pub fn new_request_id() -> String {
    format!("{:016X}", rand::random::<u64>())
}

/// Inserts or replaces `<RequestId>` in an S3 XML error body. Returns `None`
/// if the body is not an `<Error>` document.
#[must_use]
pub fn set_error_request_id(body: &[u8], request_id: &str) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(body).ok()?;
    if !text.contains("<Error>") || !text.contains("</Error>") {
        return None;
    }
    let owned;
    let text = if text.contains("<Message>") {
        text
    } else {
        let code_end = text.find("</Code>")?;
        let code_start = text.find("<Code>")? + "<Code>".len();
        let code = text.get(code_start..code_end)?;
        owned = format!(
            "{}</Code><Message>{}</Message>{}",
            &text[..code_end],
            default_message(code),
            &text[code_end + "</Code>".len()..]
        );
        owned.as_str()
    };
    let end = text.rfind("</Error>")?;
    let mut out = String::with_capacity(text.len() + 48);
    if let (Some(a), Some(b)) = (text.find("<RequestId>"), text.find("</RequestId>"))
        && a < b
    {
        out.push_str(&text[..a + "<RequestId>".len()]);
        out.push_str(request_id);
        out.push_str(&text[b..]);
        return Some(out.into_bytes());
    }
    out.push_str(&text[..end]);
    out.push_str("<RequestId>");
    out.push_str(request_id);
    out.push_str("</RequestId>");
    out.push_str(&text[end..]);
    Some(out.into_bytes())
}

/// The payload mode of a request for logs: the `x-amz-content-sha256` value,
/// or `signed` for a literal hash, or `-` when absent.
pub(super) fn payload_mode(h: &http::HeaderMap) -> String {
    match h.get("x-amz-content-sha256").and_then(|v| v.to_str().ok()) {
        None => "-".to_owned(),
        Some(v) if v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()) => "signed".to_owned(),
        Some(v) => v
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(64)
            .collect(),
    }
}

/// A message for errors s3s raises without one.
fn default_message(code: &str) -> &'static str {
    match code {
        "AccessDenied" => "Access Denied",
        "InvalidBucketName" => "The specified bucket is not valid.",
        "SignatureDoesNotMatch" => {
            "The request signature we calculated does not match the signature you provided. Check your key and signing method."
        }
        "InvalidAccessKeyId" => "The AWS Access Key Id you provided does not exist in our records.",
        "RequestTimeTooSkewed" => {
            "The difference between the request time and the current time is too large."
        }
        "KeyTooLongError" => "Your key is too long",
        "MissingContentLength" => "You must provide the Content-Length HTTP header.",
        "MalformedXML" => {
            "The XML you provided was not well-formed or did not validate against our published schema."
        }
        "InvalidURI" => "Couldn't parse the specified URI.",
        "MethodNotAllowed" => "The specified method is not allowed against this resource.",
        "NotImplemented" => {
            "A header or operation you provided implies functionality that is not implemented."
        }
        _ => "The request failed.",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_id_shape() {
        let id = new_request_id();
        assert_eq!(id.len(), 16);
        assert!(
            id.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_lowercase())
        );
    }

    #[test]
    fn inserts_request_id() {
        let body =
            b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code></Error>";
        let out = set_error_request_id(body, "ABC").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message><RequestId>ABC</RequestId></Error>"
        );
    }

    #[test]
    fn replaces_request_id() {
        let body = b"<Error><Code>X</Code><Message>m</Message><RequestId>old</RequestId></Error>";
        let out = set_error_request_id(body, "NEW").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "<Error><Code>X</Code><Message>m</Message><RequestId>NEW</RequestId></Error>"
        );
        assert!(set_error_request_id(b"<ListBucketResult/>", "x").is_none());
    }
}
