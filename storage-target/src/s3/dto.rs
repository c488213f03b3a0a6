//! s3s DTOs to and from the store's types: timestamps, ETags, object
//! attributes and metadata, Content-MD5, ranges, part numbers, request
//! bodies, version ids.

use std::collections::BTreeMap;
use std::pin::Pin;

use bytes::Bytes;
use futures::Stream;
use s3dma_wire::range::ByteRange;
use s3s::dto::*;
use s3s::{S3Request, S3Result, StdError, s3_error};

use super::error::store_error;
use crate::checksum;
use crate::store::conditions::EtagCondition;
use crate::store::{ObjectAttrs, ObjectMeta, StoreError, etag};

pub(super) fn ts(ms: i64) -> Timestamp {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    Timestamp::from(t)
}

pub(super) fn ts_secs(t: Timestamp) -> i64 {
    time::OffsetDateTime::from(t).unix_timestamp()
}

pub(super) fn strong(e: &str) -> ETag {
    ETag::Strong(e.to_owned())
}

pub(super) fn etag_cond(c: ETagCondition) -> EtagCondition {
    match c {
        ETagCondition::Any => EtagCondition::Any,
        ETagCondition::ETag(e) => EtagCondition::Etag(e.into_value()),
    }
}

/// Removes the `aws-chunked` transfer coding from a stored Content-Encoding.
pub(super) fn clean_content_encoding(v: Option<String>) -> Option<String> {
    let v = v?;
    // The remaining codings exactly as sent (spacing included).
    let rest: Vec<&str> = v
        .split(',')
        .filter(|s| {
            let s = s.trim();
            !s.is_empty() && !s.eq_ignore_ascii_case("aws-chunked")
        })
        .collect();
    let rest = rest.join(",");
    let rest = rest.trim();
    (!rest.is_empty()).then(|| rest.to_owned())
}

#[allow(clippy::too_many_arguments)]
pub(super) fn make_attrs(
    content_type: Option<String>,
    content_encoding: Option<String>,
    content_disposition: Option<String>,
    content_language: Option<String>,
    cache_control: Option<String>,
    expires: Option<Timestamp>,
    metadata: Option<Metadata>,
) -> ObjectAttrs {
    ObjectAttrs {
        owner: None,
        acl: None,
        instance: None,
        completed_upload: None,
        content_type,
        content_encoding: clean_content_encoding(content_encoding),
        content_disposition,
        content_language,
        cache_control,
        expires: expires.map(ts_secs),
        user_metadata: metadata
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect::<BTreeMap<_, _>>(),
    }
}

pub(super) fn user_metadata(m: &ObjectMeta) -> Option<Metadata> {
    (!m.attrs.user_metadata.is_empty()).then(|| {
        m.attrs
            .user_metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    })
}

pub(super) fn content_md5(v: Option<&String>) -> S3Result<Option<String>> {
    match v {
        None => Ok(None),
        Some(v) => etag::content_md5_to_hex(v)
            .map(Some)
            .ok_or_else(|| store_error(StoreError::InvalidDigest)),
    }
}

pub(crate) fn byte_range(r: Range) -> ByteRange {
    match r {
        Range::Int {
            first,
            last: Some(last),
        } => ByteRange::Bounded { first, last },
        Range::Int { first, last: None } => ByteRange::From(first),
        Range::Suffix { length } => ByteRange::Suffix(length),
    }
}

/// `x-amz-checksum-algorithm` of a CopyObject: the checksum to compute for
/// the copy (empty means none).
pub(super) fn checksum_algorithm(
    a: Option<&ChecksumAlgorithm>,
) -> S3Result<Option<checksum::Algorithm>> {
    match a.map(ChecksumAlgorithm::as_str) {
        None | Some("") => Ok(None),
        Some(s) => checksum::Algorithm::from_name(s).map(Some).ok_or_else(|| {
            s3_error!(
                InvalidRequest,
                "Value for x-amz-checksum-algorithm header is invalid."
            )
        }),
    }
}

pub(super) fn part_number(n: i32) -> S3Result<u32> {
    u32::try_from(n).map_err(|_| {
        s3_error!(
            InvalidArgument,
            "Part number must be an integer between 1 and 10000, inclusive"
        )
    })
}

pub(super) fn body_stream(
    body: Option<StreamingBlob>,
) -> Pin<Box<dyn Stream<Item = Result<Bytes, StdError>> + Send + Sync>> {
    match body {
        Some(b) => Box::pin(b),
        None => Box::pin(futures::stream::empty()),
    }
}

/// Unversioned buckets have one version of each key, named `null`; any
/// other version id is an error (as AWS answers on an unversioned bucket).
pub(super) fn check_version_id(v: Option<&str>) -> S3Result<()> {
    match v {
        None | Some("null") => Ok(()),
        Some(_) => Err(s3_error!(InvalidArgument, "Invalid version id specified")),
    }
}

pub(super) fn access_key<T>(req: &S3Request<T>) -> String {
    req.credentials
        .as_ref()
        .map(|c| c.access_key.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aws_chunked_is_not_stored() {
        assert_eq!(clean_content_encoding(Some("aws-chunked".into())), None);
        assert_eq!(
            clean_content_encoding(Some("aws-chunked,gzip".into())).as_deref(),
            Some("gzip")
        );
        assert_eq!(
            clean_content_encoding(Some("gzip".into())).as_deref(),
            Some("gzip")
        );
        assert_eq!(
            clean_content_encoding(Some("gzip, aws-chunked".into())).as_deref(),
            Some("gzip")
        );
        assert_eq!(
            clean_content_encoding(Some("aws-chunked, gzip, br".into())).as_deref(),
            Some("gzip, br")
        );
    }
}
