//! Object calls: PutObject, GetObject, HeadObject, GetObjectAttributes,
//! DeleteObject(s), CopyObject; and the data path they share with
//! UploadPart (HTTP or RDMA bodies, the RDMA reply).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use http::HeaderMap;
use s3s::dto::*;
use s3s::stream::{ByteStream, RemainingLength};
use s3s::{S3Request, S3Response, S3Result, StdError, s3_error};

use super::conditions::{check_conditions_of, returned_checksum, select};
use super::dto::{
    body_stream, check_version_id, checksum_algorithm, content_md5, etag_cond, make_attrs, strong,
    ts, ts_secs, user_metadata,
};
use super::error::store_error;
use super::{DEFAULT_CONTENT_TYPE, S3Api};
use crate::acl::Permission;
use crate::checksum::{RequestChecksum, set_checksum};
use crate::config::User;
use crate::rdma::DataPath;
use crate::store::conditions::{Conditions, Verdict};
use crate::store::{ObjectMeta, ObjectReader, RangeStream};

/// The data path of PutObject, GetObject and UploadPart (HTTP or RDMA), and
/// the source of a copy.
impl S3Api {
    /// The body of a PutObject/UploadPart: the HTTP body, or RDMA READs of
    /// the token's memory (declined: nothing is read or stored). An RDMA
    /// body must be exactly the token's size: `check` (which hashes the
    /// bytes as the store writes them) refuses a short read.
    pub(super) async fn put_body(
        &self,
        path: &DataPath<'_>,
        headers: &HeaderMap,
        body: Option<StreamingBlob>,
        check: &mut RequestChecksum,
    ) -> S3Result<Pin<Box<dyn Stream<Item = Result<Bytes, StdError>> + Send + Sync>>> {
        Ok(match path.put_body(headers).await? {
            None => body_stream(body),
            Some((rdma, size)) => {
                check.expect_exact_len(size);
                Box::pin(rdma)
            }
        })
    }

    /// Records a successful data request and returns the RDMA reply headers.
    pub(super) fn finish_put(&self, op: &str, path: &DataPath<'_>, size: u64) -> HeaderMap {
        if let Some(reply) = path.rdma_put_done(op, size) {
            return reply;
        }
        let m = self.rdma.metrics();
        m.path_request(op, "http");
        m.path_bytes("http", "in", size);
        HeaderMap::new()
    }

    /// Opens the source of a CopyObject/UploadPartCopy: a bucket source
    /// (version `null` at most) the caller may read, whose copy-source
    /// conditions hold (every failure is 412 for a copy). Returns the source
    /// bucket's name with the reader.
    pub(super) async fn open_copy_source(
        &self,
        caller: Option<&User>,
        source: &CopySource,
        expected_owner: Option<&str>,
        conds: Conditions,
    ) -> S3Result<(String, ObjectReader)> {
        let CopySource::Bucket {
            bucket,
            key,
            version_id,
        } = source
        else {
            return Err(s3_error!(
                NotImplemented,
                "Only bucket copy sources are supported"
            ));
        };
        check_version_id(version_id.as_deref())?;
        let info = self.store.head_bucket(bucket).map_err(store_error)?;
        crate::auth::check_expected_owner(expected_owner, &self.users.bucket_owner(&info))?;
        let reader = self
            .open_checked(caller, &info, key, Permission::Read)
            .await?;
        if conds.evaluate(&reader.meta.etag, reader.meta.last_modified_secs()) != Verdict::Proceed {
            return Err(s3_error!(
                PreconditionFailed,
                "At least one of the pre-conditions you specified did not hold"
            ));
        }
        Ok((bucket.to_string(), reader))
    }
}

/// The conditional headers (`If-Match`, `If-None-Match`,
/// `If-Modified-Since`, `If-Unmodified-Since`) of a GetObject or
/// HeadObject input, moved out of it.
macro_rules! conditions {
    ($input:expr) => {
        Conditions {
            if_match: $input.if_match.map(etag_cond),
            if_none_match: $input.if_none_match.map(etag_cond),
            if_modified_since: $input.if_modified_since.map(ts_secs),
            if_unmodified_since: $input.if_unmodified_since.map(ts_secs),
        }
    };
}

/// Builds a GetObject or HeadObject output: the fields both return for an
/// object, from its metadata, plus the call's own fields.
macro_rules! object_output {
    ($output:ident, $meta:expr, $len:expr, $content_range:expr, { $($field:ident: $value:expr),* $(,)? }) => {{
        let meta: &ObjectMeta = $meta;
        $output {
            $($field: $value,)*
            accept_ranges: Some("bytes".into()),
            content_length: Some(i64::try_from($len).unwrap_or(i64::MAX)),
            content_range: $content_range,
            content_type: Some(
                meta.attrs
                    .content_type
                    .clone()
                    .unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_owned()),
            ),
            content_encoding: meta.attrs.content_encoding.clone(),
            content_disposition: meta.attrs.content_disposition.clone(),
            content_language: meta.attrs.content_language.clone(),
            cache_control: meta.attrs.cache_control.clone(),
            expires: meta.attrs.expires.map(|s| ts(s.saturating_mul(1000))),
            e_tag: Some(strong(&meta.etag)),
            last_modified: Some(ts(meta.last_modified_ms)),
            metadata: user_metadata(meta),
            parts_count: meta
                .parts_count
                .map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
            ..Default::default()
        }
    }};
}

/// Object bytes as an s3s body with an exact length.
struct ObjectBody {
    inner: RangeStream,
}

impl Stream for ObjectBody {
    type Item = Result<Bytes, StdError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.inner)
            .poll_next(cx)
            .map(|o| o.map(|r| r.map_err(|e| Box::new(e) as StdError)))
    }
}

impl ByteStream for ObjectBody {
    fn remaining_length(&self) -> RemainingLength {
        RemainingLength::new_exact(usize::try_from(self.inner.remaining()).unwrap_or(usize::MAX))
    }
}

pub(super) async fn put_object(
    s3: &S3Api,
    req: S3Request<PutObjectInput>,
) -> S3Result<S3Response<PutObjectOutput>> {
    let path = s3.rdma.data_path(&req)?;
    let caller = s3.caller(&req);
    let mut check = RequestChecksum::for_put(&req.headers, req.trailing_headers.clone())?;
    let headers = req.headers;
    let mut input = req.input;
    let md5 = content_md5(input.content_md5.as_ref())?;
    let attrs = stamped_attrs!(s3, &req.extensions, caller, input);
    if let Some(ETagCondition::Any) = input.if_none_match
        && s3
            .store
            .open_object(&input.bucket, &input.key)
            .await
            .is_ok()
    {
        return Err(s3_error!(
            PreconditionFailed,
            "At least one of the pre-conditions you specified did not hold"
        ));
    }
    let body = s3
        .put_body(&path, &headers, input.body.take(), &mut check)
        .await?;
    let meta = s3
        .store
        .put_object(
            &input.bucket,
            &input.key,
            attrs,
            body,
            md5.as_deref(),
            &mut check,
        )
        .await
        .map_err(store_error)?;
    let reply = s3.finish_put("PutObject", &path, meta.size);
    let mut out = PutObjectOutput {
        e_tag: Some(strong(&meta.etag)),
        ..Default::default()
    };
    if let Some(c) = &meta.checksum {
        set_checksum!(out, c.to_dto(), with_type);
    }
    Ok(S3Response::with_headers(out, reply))
}

pub(super) async fn get_object(
    s3: &S3Api,
    req: S3Request<GetObjectInput>,
) -> S3Result<S3Response<GetObjectOutput>> {
    let path = s3.rdma.data_path(&req)?;
    open_input!(s3, req, Permission::Read => caller, input, reader);
    let meta = &reader.meta;
    let (range, content_range) = select(meta, &conditions!(input), input.range, input.part_number)?;
    let len = range.end - range.start;
    let partial = content_range.is_some();
    let m = s3.rdma.metrics();
    let (body, body_len, reply) = match path.token() {
        Some(token) => {
            let n = s3
                .rdma
                .get(token, &reader, range, path.user(), path.dialect())
                .await
                .map_err(|e| e.to_s3())?;
            m.path_request("GetObject", "rdma");
            (None, 0, path.get_reply(partial, n))
        }
        None => {
            m.path_request("GetObject", "http");
            m.path_bytes("http", "out", len);
            let body = StreamingBlob::new(ObjectBody {
                inner: reader.stream(range),
            });
            (Some(body), len, path.get_reply(partial, 0))
        }
    };
    let meta = &reader.meta;
    let full = content_range.is_none();
    let mut out = object_output!(GetObjectOutput, meta, body_len, content_range, { body: body });
    if let Some(c) = returned_checksum(meta, input.checksum_mode.as_ref(), full, input.part_number)
    {
        set_checksum!(out, c, with_type);
    }
    Ok(S3Response::with_headers(out, reply))
}

pub(super) async fn head_object(
    s3: &S3Api,
    req: S3Request<HeadObjectInput>,
) -> S3Result<S3Response<HeadObjectOutput>> {
    open_input!(s3, req, Permission::Read => caller, input, reader);
    let meta = &reader.meta;
    let (range, content_range) = select(meta, &conditions!(input), input.range, input.part_number)?;
    let full = content_range.is_none();
    // A part is partial content on HEAD too (s3s implies 206 for GET
    // only, and drops a HEAD response's status; server.rs applies it).
    let part_status =
        (input.part_number.is_some() && !full).then_some(http::StatusCode::PARTIAL_CONTENT);
    let mut out = object_output!(
        HeadObjectOutput,
        meta,
        range.end - range.start,
        content_range,
        {}
    );
    if let Some(c) = returned_checksum(meta, input.checksum_mode.as_ref(), full, input.part_number)
    {
        set_checksum!(out, c, with_type);
    }
    let mut resp = S3Response::new(out);
    if let Some(status) = part_status {
        resp.extensions.insert(crate::http::StatusOverride(status));
    }
    Ok(resp)
}

/// What a HeadObject answers of an object, read from its bucket's index:
/// a batched HEAD's item ([`S3Api::head_from_index`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedHead {
    /// Content-Length.
    pub size: u64,
    /// ETag without quotes.
    pub etag: String,
    /// Last-Modified, Unix milliseconds.
    pub last_modified_ms: i64,
    /// Content-Type (the default when the writer set none).
    pub content_type: String,
    /// `x-amz-meta-*` user metadata.
    pub metadata: std::collections::BTreeMap<String, String>,
}

/// HEADs that open no file.
impl S3Api {
    /// A HeadObject of `key` in `bucket` by the user with `access_key`,
    /// with `if_match`, answered from the bucket's index (no file opened):
    /// what HeadObject would answer, or its error (a missing key is
    /// `NoSuchKey` only to a caller who may list the bucket, a failed
    /// `if_match` 412). `None` when the caller is neither the object's
    /// owner nor granted the bucket by the operator, so the object's ACL
    /// decides: the caller runs the full HeadObject, which reads it.
    /// `checked` is what the bucket's access check left.
    #[must_use]
    pub fn head_from_index(
        &self,
        checked: &http::Extensions,
        access_key: &str,
        (bucket, key): (&str, &str),
        if_match: Option<ETagCondition>,
    ) -> Option<S3Result<IndexedHead>> {
        let caller = self.users.get(access_key);
        let info = match self.bucket_info(checked, bucket) {
            Ok(info) => info,
            Err(e) => return Some(Err(e)),
        };
        let entry = match self.store.index_entry(&info.name, key) {
            Ok(entry) => entry,
            Err(e) => return Some(Err(self.open_error(caller, &info, e))),
        };
        let owner = entry.owner.as_deref();
        let no_acl = crate::acl::Acl::default();
        if !self
            .users
            .object_allows(caller, &info, owner, &no_acl, Permission::Read)
        {
            return None;
        }
        let conds = Conditions {
            if_match: if_match.map(etag_cond),
            ..Conditions::default()
        };
        let secs = entry.last_modified_ms.div_euclid(1000);
        if let Err(e) = check_conditions_of(&conds, &entry.etag, secs) {
            return Some(Err(e));
        }
        let (content_type, metadata) = match entry.head {
            Some(h) => (h.content_type.clone(), h.user_metadata.clone()),
            None => (None, Default::default()),
        };
        Some(Ok(IndexedHead {
            size: entry.size,
            etag: entry.etag,
            last_modified_ms: entry.last_modified_ms,
            content_type: content_type.unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_owned()),
            metadata,
        }))
    }
}

pub(super) async fn get_object_attributes(
    s3: &S3Api,
    req: S3Request<GetObjectAttributesInput>,
) -> S3Result<S3Response<GetObjectAttributesOutput>> {
    // Object READ, as GetObject/HeadObject.
    open_input!(s3, req, Permission::Read => caller, input, reader);
    let meta = &reader.meta;
    let out = crate::attributes::get_object_attributes(meta, &input, ts(meta.last_modified_ms))?;
    Ok(S3Response::new(out))
}

pub(super) async fn delete_object(
    s3: &S3Api,
    req: S3Request<DeleteObjectInput>,
) -> S3Result<S3Response<DeleteObjectOutput>> {
    check_version_id(req.input.version_id.as_deref())?;
    s3.store
        .delete_object(&req.input.bucket, &req.input.key)
        .await
        .map_err(store_error)?;
    Ok(S3Response::new(DeleteObjectOutput {
        version_id: req.input.version_id,
        ..Default::default()
    }))
}

pub(super) async fn delete_objects(
    s3: &S3Api,
    req: S3Request<DeleteObjectsInput>,
) -> S3Result<S3Response<DeleteObjectsOutput>> {
    let input = req.input;
    s3.store.head_bucket(&input.bucket).map_err(store_error)?;
    if input.delete.objects.len() > 1000 {
        return Err(s3_error!(
            MalformedXML,
            "The request must not contain more than 1000 keys"
        ));
    }
    let quiet = input.delete.quiet.unwrap_or(false);
    let mut deleted = Vec::new();
    let mut errors = Vec::new();
    for o in input.delete.objects {
        // Buckets are unversioned: each key has the one version `null`.
        // Any other version id names nothing, and the current object
        // stays (AWS answers NoSuchVersion for it).
        if let Some(v) = o.version_id.as_deref()
            && v != "null"
        {
            errors.push(Error {
                code: Some("NoSuchVersion".to_owned()),
                key: Some(o.key),
                message: Some("The specified version does not exist.".to_owned()),
                version_id: o.version_id,
            });
            continue;
        }
        match s3.store.delete_object(&input.bucket, &o.key).await {
            Ok(()) => {
                if !quiet {
                    deleted.push(DeletedObject {
                        key: Some(o.key),
                        version_id: o.version_id,
                        ..Default::default()
                    });
                }
            }
            Err(e) => {
                let e = store_error(e);
                errors.push(Error {
                    code: Some(e.code().as_str().to_owned()),
                    key: Some(o.key),
                    message: e.message().map(str::to_owned),
                    version_id: o.version_id,
                });
            }
        }
    }
    Ok(S3Response::new(DeleteObjectsOutput {
        deleted: (!deleted.is_empty()).then_some(deleted),
        errors: (!errors.is_empty()).then_some(errors),
        ..Default::default()
    }))
}

pub(super) async fn copy_object(
    s3: &S3Api,
    req: S3Request<CopyObjectInput>,
) -> S3Result<S3Response<CopyObjectOutput>> {
    let caller = s3.caller(&req);
    let input = req.input;
    let (src_bucket, reader) = s3
        .open_copy_source(
            caller,
            &input.copy_source,
            input.expected_source_bucket_owner.as_deref(),
            copy_source_conditions!(input),
        )
        .await?;
    let replace = input
        .metadata_directive
        .as_ref()
        .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
    if !replace && src_bucket == input.bucket && reader.meta.key == input.key {
        return Err(s3_error!(
            InvalidRequest,
            "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata, storage class, website redirect location or encryption attributes."
        ));
    }
    let compute = checksum_algorithm(input.checksum_algorithm.as_ref())?;
    let mut attrs = if replace {
        make_attrs(
            input.content_type,
            input.content_encoding,
            input.content_disposition,
            input.content_language,
            input.cache_control,
            input.expires,
            input.metadata,
        )
    } else {
        reader.meta.attrs.clone()
    };
    // The copy is the copier's object, with the ACL its request asks for
    // (ACLs are not copied, as in AWS).
    s3.stamp(
        &mut attrs,
        caller,
        &*s3.bucket_info(&req.extensions, &input.bucket)?,
        input.acl.as_ref().map(ObjectCannedACL::as_str),
        &grant_headers!(input),
    )?;
    let meta = s3
        .store
        .copy_object(&reader, &input.bucket, &input.key, Some(attrs), compute)
        .await
        .map_err(store_error)?;
    let mut result = CopyObjectResult {
        e_tag: Some(strong(&meta.etag)),
        last_modified: Some(ts(meta.last_modified_ms)),
        ..Default::default()
    };
    if let Some(c) = &meta.checksum {
        set_checksum!(result, c.to_dto(), with_type);
    }
    Ok(S3Response::new(CopyObjectOutput {
        copy_object_result: Some(result),
        ..Default::default()
    }))
}
