//! Listings: ListObjectsV2, ListObjects, ListObjectVersions, and the
//! helpers the multipart listings share (max-keys, URL encoding, common
//! prefixes).

use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, s3_error};

use super::S3Api;
use super::dto::{strong, ts};
use super::error::store_error;
use crate::store::IndexEntry;
use crate::store::listing::{self, ListParams};

pub(super) fn max_keys(v: Option<i32>) -> S3Result<usize> {
    match v {
        None => Ok(1000),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must be non-negative")),
        Some(n) => Ok(usize::try_from(n).unwrap_or(0).min(1000)),
    }
}

pub(super) fn is_url(e: Option<&EncodingType>) -> bool {
    e.is_some_and(|e| e.as_str() == EncodingType::URL)
}

pub(super) fn enc(url: bool, s: String) -> String {
    if url { listing::url_encode(&s) } else { s }
}

pub(super) fn to_objects(
    objs: Vec<(String, IndexEntry)>,
    url: bool,
    owner: Option<&dyn Fn(&IndexEntry) -> Owner>,
) -> Option<ObjectList> {
    (!objs.is_empty()).then(|| {
        objs.into_iter()
            .map(|(k, e)| Object {
                owner: owner.map(|f| f(&e)),
                key: Some(enc(url, k)),
                size: Some(i64::try_from(e.size).unwrap_or(i64::MAX)),
                e_tag: Some(strong(&e.etag)),
                last_modified: Some(ts(e.last_modified_ms)),
                storage_class: Some(ObjectStorageClass::from_static(
                    ObjectStorageClass::STANDARD,
                )),
                checksum_algorithm: e.checksum.map(|(a, _)| vec![a.to_dto()]),
                checksum_type: e.checksum.map(|(_, t)| t.to_dto()),
                ..Default::default()
            })
            .collect()
    })
}

pub(super) fn to_prefixes(cps: Vec<String>, url: bool) -> Option<CommonPrefixList> {
    (!cps.is_empty()).then(|| {
        cps.into_iter()
            .map(|p| CommonPrefix {
                prefix: Some(enc(url, p)),
            })
            .collect()
    })
}

impl S3Api {
    /// One page of `bucket`'s listing for `op` (its visited entries
    /// counted), and the bucket's owner (the bucket's metadata as the access
    /// check read it, in `checked`).
    fn list_page(
        &self,
        checked: &http::Extensions,
        op: &str,
        bucket: &str,
        params: &ListParams<'_>,
    ) -> S3Result<(listing::ListPage<IndexEntry>, String)> {
        let page = self
            .store
            .list_objects(bucket, params)
            .map_err(store_error)?;
        self.rdma.metrics().listing_visited(op, page.visited);
        let owner = self
            .users
            .bucket_owner(&*self.bucket_info(checked, bucket)?);
        Ok((page, owner))
    }
}

pub(super) async fn list_objects_v2(
    s3: &S3Api,
    req: S3Request<ListObjectsV2Input>,
) -> S3Result<S3Response<ListObjectsV2Output>> {
    let input = req.input;
    let max = max_keys(input.max_keys)?;
    let marker = match &input.continuation_token {
        Some(t) => Some(listing::decode_token(t).ok_or_else(|| {
            s3_error!(
                InvalidArgument,
                "The continuation token provided is incorrect"
            )
        })?),
        None => input.start_after.clone(),
    };
    let prefix = input.prefix.clone().unwrap_or_default();
    let (page, bucket_owner) = s3.list_page(
        &req.extensions,
        "ListObjectsV2",
        &input.bucket,
        &ListParams {
            prefix: &prefix,
            delimiter: input.delimiter.as_deref().filter(|d| !d.is_empty()),
            marker: marker.as_deref(),
            max_keys: max,
        },
    )?;
    let url = is_url(input.encoding_type.as_ref());
    let show_owner = |e: &IndexEntry| s3.owner_of(e.owner.as_deref().unwrap_or(&bucket_owner));
    let owner_id = if input.fetch_owner.unwrap_or(false) {
        Some(&show_owner as &dyn Fn(&IndexEntry) -> Owner)
    } else {
        None
    };
    let key_count = page.objects.len() + page.common_prefixes.len();
    Ok(S3Response::new(ListObjectsV2Output {
        name: Some(input.bucket),
        prefix: Some(enc(url, prefix)),
        max_keys: Some(i32::try_from(max).unwrap_or(1000)),
        key_count: Some(i32::try_from(key_count).unwrap_or(i32::MAX)),
        continuation_token: input.continuation_token,
        is_truncated: Some(page.is_truncated),
        next_continuation_token: page.next_marker.as_deref().map(listing::encode_token),
        contents: to_objects(page.objects, url, owner_id),
        common_prefixes: to_prefixes(page.common_prefixes, url),
        delimiter: input
            .delimiter
            .filter(|d| !d.is_empty())
            .map(|d| enc(url, d)),
        encoding_type: input.encoding_type,
        start_after: input.start_after.map(|s| enc(url, s)),
        ..Default::default()
    }))
}

pub(super) async fn list_objects(
    s3: &S3Api,
    req: S3Request<ListObjectsInput>,
) -> S3Result<S3Response<ListObjectsOutput>> {
    let input = req.input;
    let max = max_keys(input.max_keys)?;
    let prefix = input.prefix.clone().unwrap_or_default();
    let (page, bucket_owner) = s3.list_page(
        &req.extensions,
        "ListObjects",
        &input.bucket,
        &ListParams {
            prefix: &prefix,
            delimiter: input.delimiter.as_deref().filter(|d| !d.is_empty()),
            marker: input.marker.as_deref(),
            max_keys: max,
        },
    )?;
    let url = is_url(input.encoding_type.as_ref());
    let show_owner = |e: &IndexEntry| s3.owner_of(e.owner.as_deref().unwrap_or(&bucket_owner));
    Ok(S3Response::new(ListObjectsOutput {
        name: Some(input.bucket),
        prefix: Some(enc(url, prefix)),
        marker: Some(enc(url, input.marker.unwrap_or_default())),
        max_keys: Some(i32::try_from(max).unwrap_or(1000)),
        is_truncated: Some(page.is_truncated),
        next_marker: page.next_marker.map(|m| enc(url, m)),
        contents: to_objects(page.objects, url, Some(&show_owner)),
        common_prefixes: to_prefixes(page.common_prefixes, url),
        delimiter: input
            .delimiter
            .filter(|d| !d.is_empty())
            .map(|d| enc(url, d)),
        encoding_type: input.encoding_type,
        ..Default::default()
    }))
}

/// Versioning is not supported: every object is its one version, `null`.
pub(super) async fn list_object_versions(
    s3: &S3Api,
    req: S3Request<ListObjectVersionsInput>,
) -> S3Result<S3Response<ListObjectVersionsOutput>> {
    let input = req.input;
    let max = max_keys(input.max_keys)?;
    let prefix = input.prefix.clone().unwrap_or_default();
    let delimiter = input.delimiter.as_deref().filter(|d| !d.is_empty());
    let (page, bucket_owner) = s3.list_page(
        &req.extensions,
        "ListObjectVersions",
        &input.bucket,
        &ListParams {
            prefix: &prefix,
            delimiter,
            marker: input.key_marker.as_deref(),
            max_keys: max,
        },
    )?;
    let url = is_url(input.encoding_type.as_ref());
    let versions: Vec<ObjectVersion> = page
        .objects
        .into_iter()
        .map(|(k, e)| ObjectVersion {
            e_tag: Some(strong(&e.etag)),
            is_latest: Some(true),
            key: Some(enc(url, k)),
            last_modified: Some(ts(e.last_modified_ms)),
            owner: Some(s3.owner_of(e.owner.as_deref().unwrap_or(&bucket_owner))),
            size: Some(i64::try_from(e.size).unwrap_or(i64::MAX)),
            storage_class: Some(ObjectVersionStorageClass::from_static(
                ObjectVersionStorageClass::STANDARD,
            )),
            version_id: Some("null".to_owned()),
            ..Default::default()
        })
        .collect();
    let next = page.next_marker.map(|m| enc(url, m));
    Ok(S3Response::new(ListObjectVersionsOutput {
        name: Some(input.bucket),
        prefix: Some(enc(url, prefix)),
        key_marker: Some(enc(url, input.key_marker.unwrap_or_default())),
        version_id_marker: Some(input.version_id_marker.unwrap_or_default()),
        next_version_id_marker: next.as_ref().map(|_| "null".to_owned()),
        next_key_marker: next,
        max_keys: Some(i32::try_from(max).unwrap_or(1000)),
        is_truncated: Some(page.is_truncated),
        versions: (!versions.is_empty()).then_some(versions),
        common_prefixes: to_prefixes(page.common_prefixes, url),
        delimiter: delimiter.map(|d| enc(url, d.to_owned())),
        encoding_type: input.encoding_type,
        ..Default::default()
    }))
}
