//! Multipart uploads: CreateMultipartUpload, UploadPart, UploadPartCopy,
//! CompleteMultipartUpload, AbortMultipartUpload, ListParts,
//! ListMultipartUploads; and who may act on an upload.

use s3s::dto::*;
use s3s::{S3ErrorCode, S3Request, S3Response, S3Result, StdError, s3_error};

use super::S3Api;
use super::conditions::copy_source_range;
use super::dto::{access_key, content_md5, part_number, strong, ts};
use super::error::{access_denied, store_error};
use super::list::{enc, is_url, to_prefixes};
use crate::acl::Permission;
use crate::checksum::{self, RequestChecksum, UploadChecksum, set_checksum};
use crate::config::User;
use crate::store::{BucketInfo, MAX_PUT_SIZE, UploadInfo};

/// Who may act on an in-progress upload.
impl S3Api {
    /// An in-progress upload the caller may act on (UploadPart,
    /// UploadPartCopy, CompleteMultipartUpload, AbortMultipartUpload,
    /// ListParts): as in AWS, only its initiator and the bucket's owner (or
    /// an operator read-write grant on the bucket) may; another writer of
    /// the bucket gets AccessDenied and the upload is untouched.
    pub(super) fn upload_for(
        &self,
        checked: &http::Extensions,
        caller: Option<&User>,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> S3Result<UploadInfo> {
        let upload = self
            .store
            .upload_info(bucket, key, upload_id)
            .map_err(store_error)?;
        let info = self.bucket_info(checked, bucket)?;
        let initiator_id = upload.initiator_id.clone().unwrap_or_else(|| {
            self.users.get(&upload.initiator).map_or_else(
                || crate::config::default_canonical_id(&upload.initiator),
                |i| i.canonical_id.clone(),
            )
        });
        let anonymous = upload.initiator.is_empty();
        if self.may_use_upload(caller, &info, (!anonymous).then_some(&*initiator_id)) {
            Ok(upload)
        } else {
            Err(access_denied())
        }
    }

    /// UploadPart's rule (that of `S3Api::upload_for`) for the user with
    /// access key `access_key`, without the request: the hipobj-rc-v2
    /// server checks it at PREPARE, before anything is held.
    ///
    /// # Errors
    /// `NoSuchUpload`, `NoSuchBucket`, `AccessDenied`.
    pub fn may_upload_part(
        &self,
        checked: &http::Extensions,
        access_key: &str,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> S3Result<()> {
        let caller = self.users.get(access_key);
        self.upload_for(checked, caller, bucket, key, upload_id)
            .map(|_| ())
    }

    /// Whether `caller` is the initiator (canonical id `initiator`; `None`:
    /// an anonymous caller started it, and anonymous callers are one
    /// principal) or owns the bucket (see [`S3Api::upload_for`]).
    pub(super) fn may_use_upload(
        &self,
        caller: Option<&User>,
        info: &BucketInfo,
        initiator: Option<&str>,
    ) -> bool {
        let Some(u) = caller else {
            return initiator.is_none();
        };
        initiator == Some(u.canonical_id.as_str())
            || u.canonical_id == self.users.bucket_owner(info)
            || crate::auth::grants_give(&u.buckets, &info.name, Permission::FullControl)
    }
}

pub(super) async fn create_multipart_upload(
    s3: &S3Api,
    req: S3Request<CreateMultipartUploadInput>,
) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
    let who = access_key(&req);
    let caller = s3.caller(&req);
    let input = req.input;
    let sum = UploadChecksum::from_create(
        input.checksum_algorithm.as_ref(),
        input.checksum_type.as_ref(),
    )?;
    let attrs = stamped_attrs!(s3, &req.extensions, caller, input);
    let info = s3
        .store
        .create_upload(
            &input.bucket,
            &input.key,
            attrs,
            (&who, caller.map(|c| c.canonical_id.as_str())),
            sum,
        )
        .await
        .map_err(store_error)?;
    Ok(S3Response::new(CreateMultipartUploadOutput {
        bucket: Some(info.bucket),
        key: Some(info.key),
        upload_id: Some(info.upload_id),
        checksum_algorithm: sum.map(|c| c.algorithm.to_dto()),
        checksum_type: sum.map(|c| c.checksum_type.to_dto()),
        ..Default::default()
    }))
}

pub(super) async fn upload_part(
    s3: &S3Api,
    req: S3Request<UploadPartInput>,
) -> S3Result<S3Response<UploadPartOutput>> {
    let path = s3.rdma.data_path(&req)?;
    // Only the initiator or the bucket owner; the upload's checksum
    // algorithm, which its parts must carry.
    let upload_sum = s3
        .upload_for(
            &req.extensions,
            s3.caller(&req),
            &req.input.bucket,
            &req.input.key,
            &req.input.upload_id,
        )?
        .checksum;
    // The size the request declares, held against the initiator's byte
    // cap before the body is read.
    let declared = match path.token() {
        Some(token) => Some(u64::from(token.size)),
        None => req
            .headers
            .get("x-amz-decoded-content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .or_else(|| req.input.content_length.and_then(|n| u64::try_from(n).ok())),
    };
    let mut check =
        RequestChecksum::for_part(&req.headers, req.trailing_headers.clone(), upload_sum)?;
    let headers = req.headers;
    let input = req.input;
    let md5 = content_md5(input.content_md5.as_ref())?;
    let n = part_number(input.part_number)?;
    let body = s3.put_body(&path, &headers, input.body, &mut check).await?;
    let part = s3
        .store
        .upload_part(
            &input.bucket,
            &input.key,
            &input.upload_id,
            n,
            declared,
            body,
            md5.as_deref(),
            &mut check,
        )
        .await
        .map_err(store_error)?;
    let reply = s3.finish_put("UploadPart", &path, part.size);
    let mut out = UploadPartOutput {
        e_tag: Some(strong(&part.etag)),
        ..Default::default()
    };
    if let Some(c) = &part.checksum {
        set_checksum!(out, c.to_dto());
    }
    Ok(S3Response::with_headers(out, reply))
}

pub(super) async fn upload_part_copy(
    s3: &S3Api,
    req: S3Request<UploadPartCopyInput>,
) -> S3Result<S3Response<UploadPartCopyOutput>> {
    let caller = s3.caller(&req);
    let who = access_key(&req);
    // Only the initiator or the bucket owner, before the source is
    // read; the upload's checksum algorithm.
    let upload_sum = s3
        .upload_for(
            &req.extensions,
            caller,
            &req.input.bucket,
            &req.input.key,
            &req.input.upload_id,
        )?
        .checksum;
    let input = req.input;
    let n = part_number(input.part_number)?;
    let (_, reader) = s3
        .open_copy_source(
            caller,
            &input.copy_source,
            input.expected_source_bucket_owner.as_deref(),
            copy_source_conditions!(input),
        )
        .await?;
    let range = copy_source_range(input.copy_source_range.as_deref(), reader.meta.size)?;
    // A copied part is a part: at most 5 GiB, and its bytes count
    // against the initiator's caps before any is copied.
    let len = range.end - range.start;
    if len > MAX_PUT_SIZE {
        return Err(s3_error!(
            InvalidRequest,
            "The specified copy source is larger than the maximum allowable size for a copy source: 5368709120"
        ));
    }
    // A copy writes a whole part for a small request: it counts against
    // the caller's copy budget per minute (all anonymous callers are one
    // class with a small one) before any byte is copied.
    if let Err(per_minute) = s3.store.take_copy_budget(&who, len) {
        let class = if who.is_empty() {
            "all anonymous callers together (multipart.anonymous_copy_bytes_per_minute)"
        } else {
            "this user (multipart.copy_bytes_per_minute_per_user)"
        };
        let mut e = s3s::S3Error::with_message(
            S3ErrorCode::SlowDown,
            format!(
                "UploadPartCopy budget exhausted: {class} may copy {per_minute} bytes a minute; this copy of {len} bytes does not fit what is left, retry later"
            ),
        );
        e.set_status_code(http::StatusCode::SERVICE_UNAVAILABLE);
        return Err(e);
    }
    let body = futures::StreamExt::map(reader.stream(range), |r| {
        r.map_err(|e| Box::new(e) as StdError)
    });
    // A part of an upload with a checksum algorithm gets its checksum
    // computed over the copied bytes.
    let mut check = RequestChecksum::computing(upload_sum.map(|u| u.algorithm));
    let part = s3
        .store
        .upload_part(
            &input.bucket,
            &input.key,
            &input.upload_id,
            n,
            Some(len),
            Box::pin(body),
            None,
            &mut check,
        )
        .await
        .map_err(store_error)?;
    let m = s3.rdma.metrics();
    m.path_request("UploadPartCopy", "http");
    let mut result = CopyPartResult {
        e_tag: Some(strong(&part.etag)),
        last_modified: Some(ts(part.last_modified_ms)),
        ..Default::default()
    };
    if let Some(c) = &part.checksum {
        set_checksum!(result, c.to_dto());
    }
    Ok(S3Response::new(UploadPartCopyOutput {
        copy_part_result: Some(result),
        ..Default::default()
    }))
}

pub(super) async fn complete_multipart_upload(
    s3: &S3Api,
    req: S3Request<CompleteMultipartUploadInput>,
) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
    let caller = s3.caller(&req);
    // Only the initiator or the bucket owner. A retry of a completion
    // whose upload is gone is checked against the object it made.
    let retry = match s3.upload_for(
        &req.extensions,
        caller,
        &req.input.bucket,
        &req.input.key,
        &req.input.upload_id,
    ) {
        Ok(_) => false,
        Err(e) if e.code() == &S3ErrorCode::NoSuchUpload => true,
        Err(e) => return Err(e),
    };
    let checked = req.extensions;
    let mut input = req.input;
    let listed = input
        .multipart_upload
        .take()
        .and_then(|m| m.parts)
        .unwrap_or_default();
    let sums = checksum::CompleteRequest::parse(&input, &listed)?;
    let mut parts = Vec::new();
    for p in listed {
        let (Some(n), Some(e)) = (p.part_number, p.e_tag) else {
            return Err(s3_error!(
                InvalidPart,
                "Each part must have a PartNumber and an ETag"
            ));
        };
        parts.push((part_number(n)?, e.into_value()));
    }
    if parts.is_empty() {
        return Err(s3_error!(
            MalformedXML,
            "The XML you provided was not well-formed or did not validate against our published schema"
        ));
    }
    let meta = s3
        .store
        .complete_upload(&input.bucket, &input.key, &input.upload_id, &parts, &sums)
        .await
        .map_err(store_error)?;
    if retry {
        // The object records its initiator as its owner.
        let info = s3.bucket_info(&checked, &input.bucket)?;
        if caller.is_none() || !s3.may_use_upload(caller, &info, meta.attrs.owner.as_deref()) {
            return Err(access_denied());
        }
    }
    let mut out = CompleteMultipartUploadOutput {
        bucket: Some(input.bucket.clone()),
        key: Some(input.key.clone()),
        e_tag: Some(strong(&meta.etag)),
        location: Some(format!("/{}/{}", input.bucket, input.key)),
        ..Default::default()
    };
    if let Some(c) = &meta.checksum {
        set_checksum!(out, c.to_dto(), with_type);
    }
    Ok(S3Response::new(out))
}

/// The in-progress upload a request on it names, if its caller may act on
/// it ([`S3Api::upload_for`]).
fn upload_of<T: UploadRequest>(s3: &S3Api, req: &S3Request<T>) -> S3Result<UploadInfo> {
    let (bucket, key, upload_id) = req.input.upload();
    s3.upload_for(&req.extensions, s3.caller(req), bucket, key, upload_id)
}

/// The input of a request on an in-progress upload.
trait UploadRequest {
    /// Its bucket, key and upload id.
    fn upload(&self) -> (&str, &str, &str);
}

impl UploadRequest for AbortMultipartUploadInput {
    fn upload(&self) -> (&str, &str, &str) {
        (&self.bucket, &self.key, &self.upload_id)
    }
}

impl UploadRequest for ListPartsInput {
    fn upload(&self) -> (&str, &str, &str) {
        (&self.bucket, &self.key, &self.upload_id)
    }
}

pub(super) async fn abort_multipart_upload(
    s3: &S3Api,
    req: S3Request<AbortMultipartUploadInput>,
) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
    upload_of(s3, &req)?;
    let input = req.input;
    s3.store
        .abort_upload(&input.bucket, &input.key, &input.upload_id)
        .await
        .map_err(store_error)?;
    Ok(S3Response::new(AbortMultipartUploadOutput::default()))
}

pub(super) async fn list_parts(
    s3: &S3Api,
    req: S3Request<ListPartsInput>,
) -> S3Result<S3Response<ListPartsOutput>> {
    upload_of(s3, &req)?;
    let input = req.input;
    let (info, parts) = s3
        .store
        .list_parts(&input.bucket, &input.key, &input.upload_id)
        .await
        .map_err(store_error)?;
    let max = match input.max_parts {
        None => 1000,
        Some(n) if n < 0 => {
            return Err(s3_error!(InvalidArgument, "max-parts must be non-negative"));
        }
        Some(n) => usize::try_from(n).unwrap_or(0).min(1000),
    };
    let after: u32 = input
        .part_number_marker
        .map(u32::try_from)
        .transpose()
        .map_err(|_| s3_error!(InvalidArgument, "part-number-marker must be non-negative"))?
        .unwrap_or(0);
    let rest: Vec<_> = parts
        .into_iter()
        .filter(|p| p.part_number > after)
        .collect();
    let truncated = rest.len() > max;
    let page: Vec<_> = rest.into_iter().take(max).collect();
    let next = truncated
        .then(|| {
            page.last()
                .map(|p| i32::try_from(p.part_number).unwrap_or(i32::MAX))
        })
        .flatten();
    Ok(S3Response::new(ListPartsOutput {
        bucket: Some(input.bucket),
        key: Some(input.key),
        upload_id: Some(input.upload_id),
        initiator: Some(Initiator {
            display_name: s3.owner_of_key(&info.initiator).display_name,
            id: s3.owner_of_key(&info.initiator).id,
        }),
        owner: Some(s3.owner_of_key(&info.initiator)),
        storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
        max_parts: Some(i32::try_from(max).unwrap_or(1000)),
        part_number_marker: input.part_number_marker,
        next_part_number_marker: next,
        is_truncated: Some(truncated),
        checksum_algorithm: info.checksum.map(|c| c.algorithm.to_dto()),
        checksum_type: info.checksum.map(|c| c.checksum_type.to_dto()),
        parts: Some(
            page.into_iter()
                .map(|p| {
                    let mut part = Part {
                        part_number: Some(i32::try_from(p.part_number).unwrap_or(i32::MAX)),
                        size: Some(i64::try_from(p.size).unwrap_or(i64::MAX)),
                        e_tag: Some(strong(&p.etag)),
                        last_modified: Some(ts(p.last_modified_ms)),
                        ..Default::default()
                    };
                    if let Some(c) = &p.checksum {
                        set_checksum!(part, c.to_dto());
                    }
                    part
                })
                .collect(),
        ),
        ..Default::default()
    }))
}

pub(super) async fn list_multipart_uploads(
    s3: &S3Api,
    req: S3Request<ListMultipartUploadsInput>,
) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
    let input = req.input;
    let max = match input.max_uploads {
        None => 1000,
        Some(n) if n < 0 => {
            return Err(s3_error!(
                InvalidArgument,
                "max-uploads must be non-negative"
            ));
        }
        Some(n) => usize::try_from(n).unwrap_or(0).min(1000),
    };
    let prefix = input.prefix.clone().unwrap_or_default();
    let key_marker = input.key_marker.clone().unwrap_or_default();
    let page = s3
        .store
        .list_uploads(
            &input.bucket,
            &prefix,
            input.delimiter.as_deref(),
            (&key_marker, input.upload_id_marker.as_deref()),
            max,
        )
        .map_err(store_error)?;
    s3.rdma
        .metrics()
        .listing_visited("ListMultipartUploads", page.visited);
    let (uploads, cps, truncated) = (page.uploads, page.common_prefixes, page.is_truncated);
    let next = page.next;
    let url = is_url(input.encoding_type.as_ref());
    let (next_key, next_id) = if truncated {
        next.unwrap_or_default()
    } else {
        Default::default()
    };
    Ok(S3Response::new(ListMultipartUploadsOutput {
        bucket: Some(input.bucket),
        prefix: Some(enc(url, prefix)),
        delimiter: input.delimiter.map(|d| enc(url, d)),
        key_marker: Some(enc(url, key_marker)),
        upload_id_marker: input.upload_id_marker,
        max_uploads: Some(i32::try_from(max).unwrap_or(1000)),
        is_truncated: Some(truncated),
        next_key_marker: truncated.then(|| enc(url, next_key)),
        next_upload_id_marker: next_id,
        encoding_type: input.encoding_type,
        common_prefixes: to_prefixes(cps, url),
        uploads: Some(
            uploads
                .into_iter()
                .map(|u| MultipartUpload {
                    key: Some(enc(url, u.key)),
                    upload_id: Some(u.upload_id),
                    initiated: Some(ts(u.initiated_ms)),
                    initiator: Some(Initiator {
                        display_name: s3.owner_of_key(&u.initiator).display_name,
                        id: s3.owner_of_key(&u.initiator).id,
                    }),
                    owner: Some(s3.owner_of_key(&u.initiator)),
                    storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                    checksum_algorithm: u.checksum.map(|c| c.algorithm.to_dto()),
                    checksum_type: u.checksum.map(|c| c.checksum_type.to_dto()),
                })
                .collect(),
        ),
        ..Default::default()
    }))
}
