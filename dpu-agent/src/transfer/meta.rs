//! HeadObject, ListObjects (V2) and DeleteObject.

use http::{Method, StatusCode};
use percent_encoding::percent_decode_str;
use s3dma_proto::agent::v1::{ListObjectsResponse, ListedObject, ObjectInfo};

use super::exchange::{Attempt, Exchange, parse_xml, read_body, set_if_match};
use super::object_info;
use crate::error::{AgentError, BadReply};
use crate::s3::client::{Reply, S3Call, error_of, header, read_small};
use crate::s3::xml;

/// A ListObjects request after validation.
#[derive(Debug, Clone, Default)]
pub struct ListRequest {
    /// Bucket.
    pub bucket: String,
    /// Key prefix.
    pub prefix: String,
    /// Delimiter (empty = none).
    pub delimiter: String,
    /// Continuation token (empty = first page).
    pub continuation_token: String,
    /// Page size (1..=1000).
    pub max_keys: u32,
    /// Start after this key (empty = none).
    pub start_after: String,
}

fn decode(s: &str, url_encoded: bool) -> String {
    if url_encoded {
        percent_decode_str(s).decode_utf8_lossy().into_owned()
    } else {
        s.to_owned()
    }
}

fn unix_ms(iso: &str) -> i64 {
    time::OffsetDateTime::parse(iso, &time::format_description::well_known::Rfc3339)
        .map(|t| i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(0))
        .unwrap_or(0)
}

/// HeadObject (`if_match`: fail with PreconditionFailed unless the
/// ETag is this one).
///
/// # Errors
/// Any [`AgentError`] (404 → `NoSuchKey`, or `NoSuchBucket` when the
/// bucket is missing).
pub async fn head_object(
    ex: &Exchange,
    bucket: &str,
    key: &str,
    if_match: Option<&str>,
) -> Result<ObjectInfo, AgentError> {
    ex.retrying("HEAD", || async {
        let mut call = S3Call::new(Method::HEAD, bucket, Some(key));
        if let Some(m) = if_match {
            set_if_match(&mut call, m)?;
        }
        let reply = ex.send(call).await?;
        if reply.status() == StatusCode::NOT_FOUND {
            return Err(head_not_found(ex, reply, bucket).await);
        }
        if reply.status() != StatusCode::OK {
            return Err(ex.failure(reply).await);
        }
        let size = header(reply.headers(), "content-length")
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| AgentError::Protocol(BadReply::NoContentLength))?;
        Ok(object_info(reply.headers(), size))
    })
    .await
}

/// A HeadObject's 404. A HEAD reply has no body, so it cannot say
/// whether the key or the bucket is missing; a HeadBucket (no body
/// either way, one round trip, only on this path) tells: a missing
/// bucket is `NoSuchBucket`, anything else stays `NoSuchKey`.
async fn head_not_found(ex: &Exchange, reply: Reply, bucket: &str) -> Attempt {
    let mut err = error_of(reply).await;
    if err.code == "NoSuchKey"
        && let Ok(r) = ex.send(S3Call::new(Method::HEAD, bucket, None)).await
        && r.status() == StatusCode::NOT_FOUND
    {
        err.code = "NoSuchBucket".to_owned();
        err.message = "The specified bucket does not exist".to_owned();
    }
    Attempt::Fatal(AgentError::S3(err))
}

/// HeadObject for a batch item: a missing key is `Ok(None)`. A 404 is
/// taken as a missing key without the HeadBucket [`head_object`] sends to
/// tell a missing bucket: a batch asks that once per bucket
/// ([`bucket_exists`]).
///
/// # Errors
/// Any [`AgentError`] but a 404.
pub async fn head_object_or_missing(
    ex: &Exchange,
    bucket: &str,
    key: &str,
) -> Result<Option<ObjectInfo>, AgentError> {
    ex.retrying("HEAD", || async {
        let reply = ex
            .send(S3Call::new(Method::HEAD, bucket, Some(key)))
            .await?;
        if reply.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if reply.status() != StatusCode::OK {
            return Err(ex.failure(reply).await);
        }
        let size = header(reply.headers(), "content-length")
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| AgentError::Protocol(BadReply::NoContentLength))?;
        Ok(Some(object_info(reply.headers(), size)))
    })
    .await
}

/// Whether `bucket` exists at the exchange's target (HeadBucket; anything
/// but a 404, a failure included, counts as existing).
pub async fn bucket_exists(ex: &Exchange, bucket: &str) -> bool {
    !matches!(
        ex.send(S3Call::new(Method::HEAD, bucket, None)).await,
        Ok(r) if r.status() == StatusCode::NOT_FOUND
    )
}

/// DeleteObject.
///
/// # Errors
/// Any [`AgentError`].
pub async fn delete_object(ex: &Exchange, bucket: &str, key: &str) -> Result<(), AgentError> {
    ex.retrying("DELETE", || async {
        let reply = ex
            .send(S3Call::new(Method::DELETE, bucket, Some(key)))
            .await?;
        match reply.status() {
            StatusCode::NO_CONTENT | StatusCode::OK => {
                let _ = read_small(reply, 64 << 10).await;
                Ok(())
            }
            _ => Err(ex.failure(reply).await),
        }
    })
    .await
}

/// One page of ListObjectsV2.
///
/// # Errors
/// Any [`AgentError`].
pub async fn list_objects(
    ex: &Exchange,
    req: &ListRequest,
) -> Result<ListObjectsResponse, AgentError> {
    ex.retrying("LIST", || async {
        let mut call = S3Call::new(Method::GET, &req.bucket, None);
        call.query.push(("list-type", Some("2".into())));
        call.query.push(("encoding-type", Some("url".into())));
        call.query
            .push(("max-keys", Some(req.max_keys.to_string())));
        if !req.prefix.is_empty() {
            call.query.push(("prefix", Some(req.prefix.clone())));
        }
        if !req.delimiter.is_empty() {
            call.query.push(("delimiter", Some(req.delimiter.clone())));
        }
        if !req.continuation_token.is_empty() {
            call.query
                .push(("continuation-token", Some(req.continuation_token.clone())));
        }
        if !req.start_after.is_empty() {
            call.query
                .push(("start-after", Some(req.start_after.clone())));
        }
        // aws-sigv4 wants the query sorted; S3 does not care about order.
        call.query.sort_by(|a, b| a.0.cmp(b.0));
        let reply = ex.send(call).await?;
        if reply.status() != StatusCode::OK {
            return Err(ex.failure(reply).await);
        }
        let (_, body) = read_body(reply, 16 << 20).await?;
        let r: xml::ListBucketResult = parse_xml(&body, "ListObjectsV2")?;
        let enc = r.encoding_type.as_deref() == Some("url");
        Ok(ListObjectsResponse {
            objects: r
                .contents
                .iter()
                .map(|c| ListedObject {
                    key: decode(&c.key, enc),
                    size: c.size,
                    etag: c.etag.clone(),
                    last_modified_unix_ms: unix_ms(&c.last_modified),
                })
                .collect(),
            common_prefixes: r
                .common_prefixes
                .iter()
                .map(|p| decode(&p.prefix, enc))
                .collect(),
            next_continuation_token: r.next_continuation_token.unwrap_or_default(),
            is_truncated: r.is_truncated,
            request_id: String::new(),
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_and_parses_times() {
        assert_eq!(decode("a%2Fb%20c", true), "a/b c");
        assert_eq!(decode("a%2F", false), "a%2F");
        assert_eq!(unix_ms("1970-01-01T00:00:01.500Z"), 1500);
        assert_eq!(unix_ms("garbage"), 0);
    }
}
