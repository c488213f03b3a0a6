//! The [`s3s::S3`] implementation: translates S3 operations (s3s DTOs) into
//! [`Store`] calls, and [`StoreError`]s into S3 errors ([`store_error`], the
//! one place where that mapping lives).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use http::HeaderMap;
use s3s::dto::Permission as Permission_;
use s3s::dto::*;
use s3s::stream::{ByteStream, RemainingLength};
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, StdError, s3_error};
use tracing::{debug, error};

use crate::acl::{self, Acl, AclError, GrantHeaders, Permission, PolicyGrant};
use crate::auth::Users;
use crate::checksum::{self, RequestChecksum, UploadChecksum, set_checksum};
use crate::config::User;
use crate::rdma::{Decision, RdmaError, RdmaService, plan::reply_headers};
use crate::store::conditions::{Conditions, EtagCondition, Verdict};
use crate::store::listing::{self, ListParams};
use crate::store::{
    BucketInfo, IndexEntry, MAX_PUT_SIZE, ObjectAttrs, ObjectMeta, ObjectReader, RangeStream,
    Store, StoreError, UploadInfo, etag, format::new_instance,
};
use s3dma_wire::range::{ByteRange, content_range};

/// Content type returned for objects stored without one (as S3 does).
pub const DEFAULT_CONTENT_TYPE: &str = "binary/octet-stream";

/// The S3 front end of a [`Store`].
#[derive(Debug, Clone)]
pub struct S3Store {
    store: Arc<Store>,
    region: String,
    users: Users,
    rdma: Arc<RdmaService>,
}

impl S3Store {
    /// Creates the front end; `rdma` serves (or declines) requests that
    /// carry `x-amz-rdma-token`.
    #[must_use]
    pub fn new(store: Arc<Store>, region: String, users: Users, rdma: Arc<RdmaService>) -> Self {
        S3Store {
            store,
            region,
            users,
            rdma,
        }
    }

    /// How to serve a GetObject/PutObject/UploadPart.
    fn rdma_decision<T>(&self, req: &S3Request<T>) -> S3Result<Decision> {
        self.rdma.decide(req).map_err(|e| e.to_s3())
    }

    /// The body of a PutObject/UploadPart: the HTTP body, or RDMA READs of
    /// the token's memory (declined: nothing is read or stored). An RDMA
    /// body must be exactly the token's size: `check` (which hashes the
    /// bytes as the store writes them) refuses a short read.
    async fn put_body(
        &self,
        decision: &Decision,
        headers: &HeaderMap,
        body: Option<StreamingBlob>,
        user: &str,
        check: &mut RequestChecksum,
    ) -> S3Result<Pin<Box<dyn Stream<Item = Result<Bytes, StdError>> + Send + Sync>>> {
        match decision {
            Decision::Http => Ok(body_stream(body)),
            Decision::Decline => Err(self.rdma.declined_put()),
            Decision::Rdma(token) => Ok(Box::pin({
                check.expect_exact_len(u64::from(token.size));
                self.rdma
                    .put_body(token, headers, user)
                    .await
                    .map_err(|e| e.to_s3())?
            })),
        }
    }

    /// Records a successful data request and returns the RDMA reply headers.
    fn finish_put(&self, op: &str, decision: &Decision, size: u64) -> HeaderMap {
        let m = self.rdma.metrics();
        match decision {
            Decision::Rdma(_) => {
                m.path_request(op, "rdma");
                m.path_bytes("rdma", "in", size);
                reply_headers(200, None)
            }
            _ => {
                m.path_request(op, "http");
                m.path_bytes("http", "in", size);
                HeaderMap::new()
            }
        }
    }
}

/// The `x-amz-grant-*` headers of an s3s input (object writes carry no
/// `x-amz-grant-write`; buckets and the ACL calls do: `grant_write`).
macro_rules! grant_headers {
    ($input:expr) => {
        GrantHeaders {
            read: $input.grant_read.as_deref(),
            write: None,
            read_acp: $input.grant_read_acp.as_deref(),
            write_acp: $input.grant_write_acp.as_deref(),
            full_control: $input.grant_full_control.as_deref(),
        }
    };
    ($input:expr, grant_write) => {
        GrantHeaders {
            write: $input.grant_write.as_deref(),
            ..grant_headers!($input)
        }
    };
}

/// Owners and ACLs in the handlers: object-level checks, the ACL a write
/// asks for, and the ACL documents.
impl S3Store {
    /// The configured user who signed the request (`None`: anonymous).
    fn caller<T>(&self, req: &S3Request<T>) -> Option<&User> {
        req.credentials
            .as_ref()
            .and_then(|c| self.users.get(&c.access_key))
    }

    /// The metadata of `bucket`: the copy the access check read for this
    /// request (request extensions), or the store's.
    fn bucket_info(&self, checked: &http::Extensions, bucket: &str) -> S3Result<Arc<BucketInfo>> {
        match checked.get::<Arc<BucketInfo>>() {
            Some(info) if info.name == bucket => Ok(Arc::clone(info)),
            _ => self
                .store
                .head_bucket(bucket)
                .map(Arc::new)
                .map_err(store_error),
        }
    }

    /// A failed open: a missing key is NoSuchKey only to callers who may
    /// list the bucket, AccessDenied to others (as AWS answers).
    fn open_error(&self, caller: Option<&User>, info: &BucketInfo, e: StoreError) -> S3Error {
        if matches!(e, StoreError::NoSuchKey)
            && !self.users.bucket_allows(caller, info, Permission::Read)
        {
            return access_denied();
        }
        store_error(e)
    }

    /// Opens an object of the bucket `info` the caller needs `need` on.
    async fn open_checked(
        &self,
        caller: Option<&User>,
        info: &BucketInfo,
        key: &str,
        need: Permission,
    ) -> S3Result<ObjectReader> {
        let reader = self
            .store
            .open_object(&info.name, key)
            .await
            .map_err(|e| self.open_error(caller, info, e))?;
        self.check_object(caller, info, &reader.meta, need).await?;
        Ok(reader)
    }

    /// Opens the source of a CopyObject/UploadPartCopy: a bucket source
    /// (version `null` at most) the caller may read, whose copy-source
    /// conditions hold (every failure is 412 for a copy). Returns the source
    /// bucket's name with the reader.
    async fn open_copy_source(
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

    /// An in-progress upload the caller may act on (UploadPart,
    /// UploadPartCopy, CompleteMultipartUpload, AbortMultipartUpload,
    /// ListParts): as in AWS, only its initiator and the bucket's owner (or
    /// an operator read-write grant on the bucket) may; another writer of
    /// the bucket gets AccessDenied and the upload is untouched.
    fn upload_for(
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

    /// Whether `caller` is the initiator (canonical id `initiator`; `None`:
    /// an anonymous caller started it, and anonymous callers are one
    /// principal) or owns the bucket (see [`S3Store::upload_for`]).
    fn may_use_upload(
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

    /// The ACL in force on an object instance: PutObjectAcl's, else the one
    /// it was written with.
    async fn object_acl(&self, bucket: &str, meta: &ObjectMeta) -> S3Result<Acl> {
        Ok(
            match self
                .store
                .object_acl_override(bucket, meta)
                .await
                .map_err(store_error)?
            {
                Some(acl) => acl,
                None => meta.attrs.acl.clone().unwrap_or_default(),
            },
        )
    }

    async fn check_object(
        &self,
        caller: Option<&User>,
        info: &BucketInfo,
        meta: &ObjectMeta,
        need: Permission,
    ) -> S3Result<()> {
        let owner = meta.attrs.owner.as_deref();
        // Operator grants and ownership need no ACL read.
        if self
            .users
            .object_allows(caller, info, owner, &Acl::default(), need)
        {
            return Ok(());
        }
        let acl = self.object_acl(&info.name, meta).await?;
        if self.users.object_allows(caller, info, owner, &acl, need) {
            Ok(())
        } else {
            Err(access_denied())
        }
    }

    /// The ACL `x-amz-acl` / `x-amz-grant-*` ask for on a new bucket or
    /// object (`None`: private).
    fn requested_acl(
        &self,
        owner: &str,
        bucket_owner: &str,
        canned: Option<&str>,
        grants: &GrantHeaders<'_>,
    ) -> S3Result<Option<Acl>> {
        acl::from_headers(canned, grants, owner, bucket_owner, &|id| {
            self.users.known_id(id)
        })
        .map_err(acl_error)
    }

    /// Owner, ACL and instance of an object `caller` writes into the bucket
    /// `info`.
    fn stamp(
        &self,
        attrs: &mut ObjectAttrs,
        caller: Option<&User>,
        info: &BucketInfo,
        canned: Option<&str>,
        grants: &GrantHeaders<'_>,
    ) -> S3Result<()> {
        let bucket_owner = self.users.bucket_owner(info);
        // Anonymous writes (a public-read-write bucket) belong to the bucket owner.
        let owner = caller.map_or_else(|| bucket_owner.clone(), |u| u.canonical_id.clone());
        attrs.acl = self.requested_acl(&owner, &bucket_owner, canned, grants)?;
        attrs.owner = Some(owner);
        attrs.instance = Some(new_instance());
        Ok(())
    }

    /// The new ACL of a PutBucketAcl/PutObjectAcl: a canned ACL, grant
    /// headers, or an `AccessControlPolicy` body (exactly one).
    fn acl_to_set(
        &self,
        owner: &str,
        bucket_owner: &str,
        canned: Option<&str>,
        grants: &GrantHeaders<'_>,
        policy: Option<&AccessControlPolicy>,
    ) -> S3Result<Acl> {
        let known = |id: &str| self.users.known_id(id);
        match policy {
            Some(p) => {
                if canned.is_some() || grants != &GrantHeaders::default() {
                    return Err(acl_error(AclError::CannedAndGrants));
                }
                let list: Vec<PolicyGrant<'_>> = p
                    .grants
                    .iter()
                    .flatten()
                    .map(|g| PolicyGrant {
                        id: g.grantee.as_ref().and_then(|e| e.id.as_deref()),
                        uri: g.grantee.as_ref().and_then(|e| e.uri.as_deref()),
                        email: g.grantee.as_ref().and_then(|e| e.email_address.as_deref()),
                        permission: g.permission.as_ref().map(Permission_::as_str),
                    })
                    .collect();
                let policy_owner = p.owner.as_ref().and_then(|o| o.id.as_deref());
                acl::from_policy(policy_owner, &list, owner, &known).map_err(acl_error)
            }
            None => {
                match acl::from_headers(canned, grants, owner, bucket_owner, &known)
                    .map_err(acl_error)?
                {
                    Some(acl) => Ok(acl),
                    None => Err(s3_error!(
                        MissingSecurityHeader,
                        "Your request was missing a required header: x-amz-acl, an x-amz-grant-* header or an AccessControlPolicy body"
                    )),
                }
            }
        }
    }

    /// The `Owner` element for a canonical id.
    fn owner_of(&self, id: &str) -> Owner {
        Owner {
            display_name: Some(self.users.display_name(id)),
            id: Some(id.to_owned()),
        }
    }

    /// The `Owner`/`Initiator` element for the user with an access key.
    fn owner_of_key(&self, access_key: &str) -> Owner {
        match self.users.get(access_key) {
            Some(u) => self.owner_of(&u.canonical_id),
            None => self.owner_of(&crate::config::default_canonical_id(access_key)),
        }
    }

    /// The grants of an ACL document, the owner's full control first.
    fn grants_of(&self, owner: &str, acl: &Acl) -> Grants {
        acl.shown(owner)
            .into_iter()
            .map(|g| {
                let grantee = match &g.grantee {
                    acl::Grantee::User(id) => Grantee {
                        display_name: Some(self.users.display_name(id)),
                        email_address: None,
                        id: Some(id.clone()),
                        type_: Type::from_static(Type::CANONICAL_USER),
                        uri: None,
                    },
                    group => Grantee {
                        display_name: None,
                        email_address: None,
                        id: None,
                        type_: Type::from_static(Type::GROUP),
                        uri: group.uri().map(str::to_owned),
                    },
                };
                Grant {
                    grantee: Some(grantee),
                    permission: Some(Permission_::from(g.permission.as_str().to_owned())),
                }
            })
            .collect()
    }
}

/// The bytes `x-amz-copy-source-range: bytes=first-last` names in a source
/// of `size` bytes (the whole source without it), with AWS's refusals.
fn copy_source_range(v: Option<&str>, size: u64) -> S3Result<std::ops::Range<u64>> {
    let Some(v) = v else {
        return Ok(0..size);
    };
    let parsed = v.strip_prefix("bytes=").and_then(|r| {
        let (a, b) = r.split_once('-')?;
        let a: u64 = a.parse().ok()?;
        let b: u64 = b.parse().ok()?;
        (a <= b).then_some((a, b))
    });
    let Some((first, last)) = parsed else {
        return Err(s3_error!(
            InvalidArgument,
            "The x-amz-copy-source-range value must be of the form bytes=first-last where first and last are the zero-based offsets of the first and last bytes to copy"
        ));
    };
    if last >= size {
        return Err(s3_error!(
            InvalidArgument,
            "Range specified is not valid for source object of size: {size}"
        ));
    }
    Ok(first..last + 1)
}

/// Unversioned buckets have one version of each key, named `null`; any
/// other version id is an error (as AWS answers on an unversioned bucket).
fn check_version_id(v: Option<&str>) -> S3Result<()> {
    match v {
        None | Some("null") => Ok(()),
        Some(_) => Err(s3_error!(InvalidArgument, "Invalid version id specified")),
    }
}

fn access_denied() -> S3Error {
    s3_error!(AccessDenied, "Access Denied")
}

/// Maps a refused ACL to the S3 error AWS answers with.
fn acl_error(e: AclError) -> S3Error {
    let (code, status) = e.code();
    let code = S3ErrorCode::from_bytes(code.as_bytes())
        .unwrap_or_else(|| S3ErrorCode::Custom(code.into()));
    S3Error::with_message(code, e.to_string())
        .with_status(http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_REQUEST))
}

/// The access key id that signed a request (its share of the RDMA staging
/// pool is counted by it); empty for an anonymous one, which the access
/// check has refused before any data moves.
fn request_user<T>(req: &S3Request<T>) -> String {
    req.credentials
        .as_ref()
        .map(|c| c.access_key.clone())
        .unwrap_or_default()
}

/// Maps a [`StoreError`] to the S3 error returned to clients.
#[must_use]
pub fn store_error(e: StoreError) -> S3Error {
    use S3ErrorCode as C;
    let msg = e.to_string();
    let code = match &e {
        StoreError::NoSuchBucket => C::NoSuchBucket,
        StoreError::NoSuchKey => C::NoSuchKey,
        StoreError::BucketAlreadyOwnedByYou => C::BucketAlreadyOwnedByYou,
        StoreError::BucketAlreadyExists => C::BucketAlreadyExists,
        StoreError::BucketNotEmpty => C::BucketNotEmpty,
        StoreError::InvalidBucketName => C::InvalidBucketName,
        StoreError::NoSuchUpload => C::NoSuchUpload,
        StoreError::BadDigest | StoreError::ChecksumMismatch(_) => C::BadDigest,
        StoreError::InvalidDigest => C::InvalidDigest,
        StoreError::InvalidPart(_) => C::InvalidPart,
        StoreError::InvalidPartOrder => C::InvalidPartOrder,
        StoreError::EntityTooSmall { .. } => C::EntityTooSmall,
        StoreError::EntityTooLarge => C::EntityTooLarge,
        StoreError::InvalidArgument(_) => C::InvalidArgument,
        StoreError::InvalidRequest(_) => C::InvalidRequest,
        StoreError::IncompleteBody(_) => C::IncompleteBody,
        StoreError::QuotaExceeded(_) => {
            return S3Error::with_message(C::Custom("QuotaExceeded".into()), msg)
                .with_status(http::StatusCode::FORBIDDEN);
        }
        StoreError::Body(inner) => {
            if let Some(r) = inner.downcast_ref::<RdmaError>() {
                return r.to_s3();
            }
            return body_error(inner.as_ref());
        }
        StoreError::Io(io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            ) =>
        {
            // A condition of the server, not a fault of the request: say
            // so (507 Insufficient Storage, RFC 4918) rather than "internal
            // error, try again", which a client would retry in vain. The
            // write's temporary files are gone by now (their guards).
            error!(error = %e, "store out of space");
            return S3Error::with_message(
                C::Custom("InsufficientStorage".into()),
                "The storage target is out of space: its data directory's filesystem is full (or over quota). Nothing was stored; delete objects or add capacity, then retry.",
            )
            .with_status(http::StatusCode::INSUFFICIENT_STORAGE);
        }
        StoreError::Io(_) | StoreError::Corrupt { .. } | StoreError::NotPrivate(_) => {
            error!(error = %e, "store failure");
            return S3Error::with_message(
                C::InternalError,
                "We encountered an internal error. Please try again.",
            );
        }
    };
    S3Error::with_message(code, msg)
}

/// Maps an error from reading the request body. s3s's stream error types are
/// private, so they are recognised by their (stable) display text.
fn body_error(e: &(dyn std::error::Error + 'static)) -> S3Error {
    let text = e.to_string();
    debug!(error = %s3dma_service::Escaped(&text), "request body error");
    if let Some(at) = text.find(crate::server::AWS_CHUNK_REFUSED) {
        S3Error::with_message(S3ErrorCode::InvalidRequest, text[at..].to_owned())
    } else if text.contains(crate::server::BODY_IDLE_MESSAGE) {
        s3_error!(
            RequestTimeout,
            "Your socket connection to the server was not read from or written to within the timeout period."
        )
    } else if text.contains("Sha256Mismatch") {
        S3Error::with_message(
            S3ErrorCode::Custom("XAmzContentSHA256Mismatch".into()),
            "The provided 'x-amz-content-sha256' header does not match what was computed.",
        )
        .with_status(http::StatusCode::BAD_REQUEST)
    } else if text.contains("SignatureMismatch") {
        s3_error!(
            SignatureDoesNotMatch,
            "The request signature we calculated does not match the signature you provided (aws-chunked)."
        )
    } else if text.contains("FormatError") {
        s3_error!(InvalidRequest, "Malformed aws-chunked body")
    } else {
        s3_error!(
            IncompleteBody,
            "You did not provide the number of bytes specified by the Content-Length HTTP header."
        )
    }
}

trait WithStatus {
    fn with_status(self, s: http::StatusCode) -> Self;
}

impl WithStatus for S3Error {
    fn with_status(mut self, s: http::StatusCode) -> Self {
        self.set_status_code(s);
        self
    }
}

fn ts(ms: i64) -> Timestamp {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    Timestamp::from(t)
}

fn ts_secs(t: Timestamp) -> i64 {
    time::OffsetDateTime::from(t).unix_timestamp()
}

fn strong(e: &str) -> ETag {
    ETag::Strong(e.to_owned())
}

fn etag_cond(c: ETagCondition) -> EtagCondition {
    match c {
        ETagCondition::Any => EtagCondition::Any,
        ETagCondition::ETag(e) => EtagCondition::Etag(e.into_value()),
    }
}

/// Removes the `aws-chunked` transfer coding from a stored Content-Encoding.
fn clean_content_encoding(v: Option<String>) -> Option<String> {
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
fn make_attrs(
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

fn user_metadata(m: &ObjectMeta) -> Option<Metadata> {
    (!m.attrs.user_metadata.is_empty()).then(|| {
        m.attrs
            .user_metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    })
}

fn content_md5(v: Option<&String>) -> S3Result<Option<String>> {
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

/// Evaluates read conditions; errors are 304 (with ETag/Last-Modified) or 412.
/// What GET and HEAD select of an object, by one rule: the conditional
/// headers checked against it, then the byte range resolved, with its
/// `Content-Range` when the request named one.
fn select(
    meta: &ObjectMeta,
    conds: &Conditions,
    range: Option<Range>,
    part: Option<i32>,
) -> S3Result<(std::ops::Range<u64>, Option<String>)> {
    check_conditions(conds, meta)?;
    match (range, part) {
        (Some(_), Some(_)) => Err(s3_error!(
            InvalidRequest,
            "Cannot specify both Range header and partNumber query parameter"
        )),
        (None, Some(n)) => {
            let r = part_range(meta, n)?;
            let cr = (!r.is_empty()).then(|| content_range(&r, meta.size));
            Ok((r, cr))
        }
        (None, None) => Ok((0..meta.size, None)),
        (Some(r), None) => {
            let r = byte_range(r)
                .resolve(meta.size)
                .map_err(|_| s3_error!(InvalidRange, "The requested range is not satisfiable"))?;
            let cr = content_range(&r, meta.size);
            Ok((r, Some(cr)))
        }
    }
}

/// The bytes of part `n` (GetObject/HeadObject `partNumber`): a part of a
/// multipart object, or part 1 = the whole of any other object.
fn part_range(meta: &ObjectMeta, n: i32) -> S3Result<std::ops::Range<u64>> {
    let n = usize::try_from(n)
        .ok()
        .filter(|n| (1..=10_000).contains(n))
        .ok_or_else(|| {
            s3_error!(
                InvalidArgument,
                "Part number must be an integer between 1 and 10000, inclusive"
            )
        })?;
    let unsatisfiable = || {
        S3Error::with_message(
            S3ErrorCode::Custom("InvalidPartNumber".into()),
            "The requested partnumber is not satisfiable",
        )
        .with_status(http::StatusCode::RANGE_NOT_SATISFIABLE)
    };
    match (meta.parts.is_empty(), meta.parts_count) {
        (false, _) => {
            let part = meta.parts.get(n - 1).ok_or_else(unsatisfiable)?;
            let start: u64 = meta.parts[..n - 1].iter().map(|p| p.size).sum();
            Ok(start..start + part.size)
        }
        (true, None) if n == 1 => Ok(0..meta.size),
        (true, None) => Err(unsatisfiable()),
        (true, Some(count)) if n > count as usize => Err(unsatisfiable()),
        // Multipart objects written before part sizes were recorded.
        (true, Some(_)) => Err(s3_error!(
            NotImplemented,
            "This object's part sizes were not recorded (it was written by an older storage-target); read it by range"
        )),
    }
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

/// The object checksum a GetObject/HeadObject returns: only with
/// `x-amz-checksum-mode: ENABLED` and for the whole object (a ranged read
/// gets none, as from AWS S3).
fn returned_checksum(
    meta: &ObjectMeta,
    mode: Option<&ChecksumMode>,
    whole_object: bool,
) -> Option<Checksum> {
    if !whole_object || !checksum::mode_enabled(mode) {
        return None;
    }
    meta.checksum.as_ref().map(checksum::StoredChecksum::to_dto)
}

fn check_conditions(c: &Conditions, meta: &ObjectMeta) -> S3Result<()> {
    match c.evaluate(&meta.etag, meta.last_modified_secs()) {
        Verdict::Proceed => Ok(()),
        Verdict::PreconditionFailed => Err(s3_error!(
            PreconditionFailed,
            "At least one of the pre-conditions you specified did not hold"
        )),
        Verdict::NotModified => {
            let mut err = s3_error!(NotModified, "Not Modified");
            let mut h = HeaderMap::new();
            if let Ok(v) = http::HeaderValue::from_str(&format!("\"{}\"", meta.etag)) {
                h.insert(http::header::ETAG, v);
            }
            let lm = httpdate::fmt_http_date(
                std::time::UNIX_EPOCH
                    + std::time::Duration::from_secs(
                        u64::try_from(meta.last_modified_secs()).unwrap_or(0),
                    ),
            );
            if let Ok(v) = http::HeaderValue::from_str(&lm) {
                h.insert(http::header::LAST_MODIFIED, v);
            }
            err.set_headers(h);
            Err(err)
        }
    }
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

fn access_key<T>(req: &S3Request<T>) -> String {
    req.credentials
        .as_ref()
        .map(|c| c.access_key.clone())
        .unwrap_or_default()
}

fn max_keys(v: Option<i32>) -> S3Result<usize> {
    match v {
        None => Ok(1000),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must be non-negative")),
        Some(n) => Ok(usize::try_from(n).unwrap_or(0).min(1000)),
    }
}

fn is_url(e: Option<&EncodingType>) -> bool {
    e.is_some_and(|e| e.as_str() == EncodingType::URL)
}

fn enc(url: bool, s: String) -> String {
    if url { listing::url_encode(&s) } else { s }
}

fn to_objects(
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

fn to_prefixes(cps: Vec<String>, url: bool) -> Option<CommonPrefixList> {
    (!cps.is_empty()).then(|| {
        cps.into_iter()
            .map(|p| CommonPrefix {
                prefix: Some(enc(url, p)),
            })
            .collect()
    })
}

/// `x-amz-checksum-algorithm` of a CopyObject: the checksum to compute for
/// the copy (empty means none).
fn checksum_algorithm(a: Option<&ChecksumAlgorithm>) -> S3Result<Option<checksum::Algorithm>> {
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

fn part_number(n: i32) -> S3Result<u32> {
    u32::try_from(n).map_err(|_| {
        s3_error!(
            InvalidArgument,
            "Part number must be an integer between 1 and 10000, inclusive"
        )
    })
}

fn body_stream(
    body: Option<StreamingBlob>,
) -> Pin<Box<dyn Stream<Item = Result<Bytes, StdError>> + Send + Sync>> {
    match body {
        Some(b) => Box::pin(b),
        None => Box::pin(futures::stream::empty()),
    }
}

#[async_trait::async_trait]
impl S3 for S3Store {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let who = access_key(&req);
        let caller = self.caller(&req).ok_or_else(access_denied)?;
        let input = req.input;
        if let Some(c) = input
            .create_bucket_configuration
            .as_ref()
            .and_then(|c| c.location_constraint.as_ref())
        {
            let c = c.as_str();
            if !c.is_empty() && c != self.region {
                return Err(S3Error::with_message(
                    S3ErrorCode::Custom("InvalidLocationConstraint".into()),
                    format!("The specified location-constraint is not valid: this server's region is {}", self.region),
                )
                .with_status(http::StatusCode::BAD_REQUEST));
            }
        }
        let acl = self
            .requested_acl(
                &caller.canonical_id,
                &caller.canonical_id,
                input.acl.as_ref().map(BucketCannedACL::as_str),
                &grant_headers!(input, grant_write),
            )?
            .unwrap_or_default();
        self.store
            .create_bucket(&input.bucket, &who, &caller.canonical_id, acl)
            .await
            .map_err(store_error)?;
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(format!("/{}", input.bucket)),
        }))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.store
            .head_bucket(&req.input.bucket)
            .map_err(store_error)?;
        Ok(S3Response::new(HeadBucketOutput {
            bucket_region: Some(self.region.clone()),
            ..Default::default()
        }))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        self.store
            .delete_bucket(&req.input.bucket)
            .await
            .map_err(store_error)?;
        Ok(S3Response::new(DeleteBucketOutput {}))
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let caller = self.caller(&req).ok_or_else(access_denied)?;
        let buckets: Vec<Bucket> = self
            .store
            .list_buckets()
            .into_iter()
            .filter(|b| self.users.bucket_owner(b) == caller.canonical_id)
            .filter(|b| {
                req.input
                    .prefix
                    .as_ref()
                    .is_none_or(|p| b.name.starts_with(p.as_str()))
            })
            .map(|b| Bucket {
                name: Some(b.name),
                creation_date: Some(ts(b.created_ms)),
                bucket_region: Some(self.region.clone()),
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(self.owner_of(&caller.canonical_id)),
            prefix: req.input.prefix,
            continuation_token: None,
        }))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.store
            .head_bucket(&req.input.bucket)
            .map_err(store_error)?;
        let location_constraint = (self.region != "us-east-1")
            .then(|| BucketLocationConstraint::from(self.region.clone()));
        Ok(S3Response::new(GetBucketLocationOutput {
            location_constraint,
        }))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let rdma = self.rdma_decision(&req)?;
        let user = request_user(&req);
        let caller = self.caller(&req);
        let mut check = RequestChecksum::for_put(&req.headers, req.trailing_headers.clone())?;
        let headers = req.headers;
        let mut input = req.input;
        let md5 = content_md5(input.content_md5.as_ref())?;
        let mut attrs = make_attrs(
            input.content_type,
            input.content_encoding,
            input.content_disposition,
            input.content_language,
            input.cache_control,
            input.expires,
            input.metadata,
        );
        self.stamp(
            &mut attrs,
            caller,
            &*self.bucket_info(&req.extensions, &input.bucket)?,
            input.acl.as_ref().map(ObjectCannedACL::as_str),
            &grant_headers!(input),
        )?;
        if let Some(ETagCondition::Any) = input.if_none_match
            && self
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
        let body = self
            .put_body(&rdma, &headers, input.body.take(), &user, &mut check)
            .await?;
        let meta = self
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
        let reply = self.finish_put("PutObject", &rdma, meta.size);
        let mut out = PutObjectOutput {
            e_tag: Some(strong(&meta.etag)),
            ..Default::default()
        };
        if let Some(c) = &meta.checksum {
            set_checksum!(out, c.to_dto(), with_type);
        }
        Ok(S3Response::with_headers(out, reply))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let rdma = self.rdma_decision(&req)?;
        let user = request_user(&req);
        let caller = self.caller(&req);
        let input = req.input;
        check_version_id(input.version_id.as_deref())?;
        let reader = self
            .open_checked(
                caller,
                &*self.bucket_info(&req.extensions, &input.bucket)?,
                &input.key,
                Permission::Read,
            )
            .await?;
        let meta = &reader.meta;
        let conds = Conditions {
            if_match: input.if_match.map(etag_cond),
            if_none_match: input.if_none_match.map(etag_cond),
            if_modified_since: input.if_modified_since.map(ts_secs),
            if_unmodified_since: input.if_unmodified_since.map(ts_secs),
        };
        let (range, content_range) = select(meta, &conds, input.range, input.part_number)?;
        let len = range.end - range.start;
        let partial = content_range.is_some();
        let m = self.rdma.metrics();
        let (body, body_len, reply) = match &rdma {
            Decision::Rdma(token) => {
                let n = self
                    .rdma
                    .get(token, &reader, range, &user)
                    .await
                    .map_err(|e| e.to_s3())?;
                m.path_request("GetObject", "rdma");
                (
                    None,
                    0,
                    reply_headers(if partial { 206 } else { 200 }, Some(n)),
                )
            }
            Decision::Http | Decision::Decline => {
                m.path_request("GetObject", "http");
                m.path_bytes("http", "out", len);
                let body = StreamingBlob::new(ObjectBody {
                    inner: reader.stream(range),
                });
                let reply = if matches!(rdma, Decision::Decline) {
                    reply_headers(501, None)
                } else {
                    HeaderMap::new()
                };
                (Some(body), len, reply)
            }
        };
        let meta = &reader.meta;
        let full = content_range.is_none();
        let mut out =
            object_output!(GetObjectOutput, meta, body_len, content_range, { body: body });
        if let Some(c) = returned_checksum(meta, input.checksum_mode.as_ref(), full) {
            set_checksum!(out, c, with_type);
        }
        Ok(S3Response::with_headers(out, reply))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let caller = self.caller(&req);
        let input = req.input;
        check_version_id(input.version_id.as_deref())?;
        let reader = self
            .open_checked(
                caller,
                &*self.bucket_info(&req.extensions, &input.bucket)?,
                &input.key,
                Permission::Read,
            )
            .await?;
        let meta = &reader.meta;
        let conds = Conditions {
            if_match: input.if_match.map(etag_cond),
            if_none_match: input.if_none_match.map(etag_cond),
            if_modified_since: input.if_modified_since.map(ts_secs),
            if_unmodified_since: input.if_unmodified_since.map(ts_secs),
        };
        let (range, content_range) = select(meta, &conds, input.range, input.part_number)?;
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
        if let Some(c) = returned_checksum(meta, input.checksum_mode.as_ref(), full) {
            set_checksum!(out, c, with_type);
        }
        let mut resp = S3Response::new(out);
        if let Some(status) = part_status {
            resp.extensions
                .insert(crate::server::StatusOverride(status));
        }
        Ok(resp)
    }

    async fn get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        let caller = self.caller(&req);
        let input = req.input;
        check_version_id(input.version_id.as_deref())?;
        // Object READ, as GetObject/HeadObject.
        let reader = self
            .open_checked(
                caller,
                &*self.bucket_info(&req.extensions, &input.bucket)?,
                &input.key,
                Permission::Read,
            )
            .await?;
        let meta = &reader.meta;
        let out =
            crate::attributes::get_object_attributes(meta, &input, ts(meta.last_modified_ms))?;
        Ok(S3Response::new(out))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        check_version_id(req.input.version_id.as_deref())?;
        self.store
            .delete_object(&req.input.bucket, &req.input.key)
            .await
            .map_err(store_error)?;
        Ok(S3Response::new(DeleteObjectOutput {
            version_id: req.input.version_id,
            ..Default::default()
        }))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let input = req.input;
        self.store.head_bucket(&input.bucket).map_err(store_error)?;
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
            match self.store.delete_object(&input.bucket, &o.key).await {
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

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let caller = self.caller(&req);
        let input = req.input;
        let (src_bucket, reader) = self
            .open_copy_source(
                caller,
                &input.copy_source,
                input.expected_source_bucket_owner.as_deref(),
                Conditions {
                    if_match: input.copy_source_if_match.map(etag_cond),
                    if_none_match: input.copy_source_if_none_match.map(etag_cond),
                    if_modified_since: input.copy_source_if_modified_since.map(ts_secs),
                    if_unmodified_since: input.copy_source_if_unmodified_since.map(ts_secs),
                },
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
        self.stamp(
            &mut attrs,
            caller,
            &*self.bucket_info(&req.extensions, &input.bucket)?,
            input.acl.as_ref().map(ObjectCannedACL::as_str),
            &grant_headers!(input),
        )?;
        let meta = self
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

    async fn list_objects_v2(
        &self,
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
        let page = self
            .store
            .list_objects(
                &input.bucket,
                &ListParams {
                    prefix: &prefix,
                    delimiter: input.delimiter.as_deref().filter(|d| !d.is_empty()),
                    marker: marker.as_deref(),
                    max_keys: max,
                },
            )
            .map_err(store_error)?;
        self.rdma
            .metrics()
            .listing_visited("ListObjectsV2", page.visited);
        let url = is_url(input.encoding_type.as_ref());
        let bucket_owner = self
            .users
            .bucket_owner(&*self.bucket_info(&req.extensions, &input.bucket)?);
        let show_owner =
            |e: &IndexEntry| self.owner_of(e.owner.as_deref().unwrap_or(&bucket_owner));
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
            delimiter: input.delimiter.map(|d| enc(url, d)),
            encoding_type: input.encoding_type,
            start_after: input.start_after.map(|s| enc(url, s)),
            ..Default::default()
        }))
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let input = req.input;
        let max = max_keys(input.max_keys)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let page = self
            .store
            .list_objects(
                &input.bucket,
                &ListParams {
                    prefix: &prefix,
                    delimiter: input.delimiter.as_deref().filter(|d| !d.is_empty()),
                    marker: input.marker.as_deref(),
                    max_keys: max,
                },
            )
            .map_err(store_error)?;
        self.rdma
            .metrics()
            .listing_visited("ListObjects", page.visited);
        let url = is_url(input.encoding_type.as_ref());
        let bucket_owner = self
            .users
            .bucket_owner(&*self.bucket_info(&req.extensions, &input.bucket)?);
        let show_owner =
            |e: &IndexEntry| self.owner_of(e.owner.as_deref().unwrap_or(&bucket_owner));
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(input.bucket),
            prefix: Some(enc(url, prefix)),
            marker: Some(enc(url, input.marker.unwrap_or_default())),
            max_keys: Some(i32::try_from(max).unwrap_or(1000)),
            is_truncated: Some(page.is_truncated),
            next_marker: page.next_marker.map(|m| enc(url, m)),
            contents: to_objects(page.objects, url, Some(&show_owner)),
            common_prefixes: to_prefixes(page.common_prefixes, url),
            delimiter: input.delimiter.map(|d| enc(url, d)),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let who = access_key(&req);
        let caller = self.caller(&req);
        let input = req.input;
        let sum = UploadChecksum::from_create(
            input.checksum_algorithm.as_ref(),
            input.checksum_type.as_ref(),
        )?;
        let mut attrs = make_attrs(
            input.content_type,
            input.content_encoding,
            input.content_disposition,
            input.content_language,
            input.cache_control,
            input.expires,
            input.metadata,
        );
        self.stamp(
            &mut attrs,
            caller,
            &*self.bucket_info(&req.extensions, &input.bucket)?,
            input.acl.as_ref().map(ObjectCannedACL::as_str),
            &grant_headers!(input),
        )?;
        let info = self
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

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let rdma = self.rdma_decision(&req)?;
        let user = request_user(&req);
        // Only the initiator or the bucket owner; the upload's checksum
        // algorithm, which its parts must carry.
        let upload_sum = self
            .upload_for(
                &req.extensions,
                self.caller(&req),
                &req.input.bucket,
                &req.input.key,
                &req.input.upload_id,
            )?
            .checksum;
        // The size the request declares, held against the initiator's byte
        // cap before the body is read.
        let declared = match &rdma {
            Decision::Rdma(token) => Some(u64::from(token.size)),
            _ => req
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
        let body = self
            .put_body(&rdma, &headers, input.body, &user, &mut check)
            .await?;
        let part = self
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
        let reply = self.finish_put("UploadPart", &rdma, part.size);
        let mut out = UploadPartOutput {
            e_tag: Some(strong(&part.etag)),
            ..Default::default()
        };
        if let Some(c) = &part.checksum {
            set_checksum!(out, c.to_dto());
        }
        Ok(S3Response::with_headers(out, reply))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let caller = self.caller(&req);
        // Only the initiator or the bucket owner. A retry of a completion
        // whose upload is gone is checked against the object it made.
        let retry = match self.upload_for(
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
        let meta = self
            .store
            .complete_upload(&input.bucket, &input.key, &input.upload_id, &parts, &sums)
            .await
            .map_err(store_error)?;
        if retry {
            // The object records its initiator as its owner.
            let info = self.bucket_info(&checked, &input.bucket)?;
            if caller.is_none() || !self.may_use_upload(caller, &info, meta.attrs.owner.as_deref())
            {
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

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.upload_for(
            &req.extensions,
            self.caller(&req),
            &req.input.bucket,
            &req.input.key,
            &req.input.upload_id,
        )?;
        let input = req.input;
        self.store
            .abort_upload(&input.bucket, &input.key, &input.upload_id)
            .await
            .map_err(store_error)?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        self.upload_for(
            &req.extensions,
            self.caller(&req),
            &req.input.bucket,
            &req.input.key,
            &req.input.upload_id,
        )?;
        let input = req.input;
        let (info, parts) = self
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
                display_name: self.owner_of_key(&info.initiator).display_name,
                id: self.owner_of_key(&info.initiator).id,
            }),
            owner: Some(self.owner_of_key(&info.initiator)),
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

    async fn list_multipart_uploads(
        &self,
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
        let page = self
            .store
            .list_uploads(
                &input.bucket,
                &prefix,
                input.delimiter.as_deref(),
                (&key_marker, input.upload_id_marker.as_deref()),
                max,
            )
            .map_err(store_error)?;
        self.rdma
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
                            display_name: self.owner_of_key(&u.initiator).display_name,
                            id: self.owner_of_key(&u.initiator).id,
                        }),
                        owner: Some(self.owner_of_key(&u.initiator)),
                        storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                        checksum_algorithm: u.checksum.map(|c| c.algorithm.to_dto()),
                        checksum_type: u.checksum.map(|c| c.checksum_type.to_dto()),
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }

    /// Versioning is not supported: every object is its one version, `null`.
    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let input = req.input;
        let max = max_keys(input.max_keys)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let delimiter = input.delimiter.as_deref().filter(|d| !d.is_empty());
        let page = self
            .store
            .list_objects(
                &input.bucket,
                &ListParams {
                    prefix: &prefix,
                    delimiter,
                    marker: input.key_marker.as_deref(),
                    max_keys: max,
                },
            )
            .map_err(store_error)?;
        self.rdma
            .metrics()
            .listing_visited("ListObjectVersions", page.visited);
        let url = is_url(input.encoding_type.as_ref());
        let bucket_owner = self
            .users
            .bucket_owner(&*self.bucket_info(&req.extensions, &input.bucket)?);
        let versions: Vec<ObjectVersion> = page
            .objects
            .into_iter()
            .map(|(k, e)| ObjectVersion {
                e_tag: Some(strong(&e.etag)),
                is_latest: Some(true),
                key: Some(enc(url, k)),
                last_modified: Some(ts(e.last_modified_ms)),
                owner: Some(self.owner_of(e.owner.as_deref().unwrap_or(&bucket_owner))),
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

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let caller = self.caller(&req);
        // Only the initiator or the bucket owner, before the source is
        // read; the upload's checksum algorithm.
        let upload_sum = self
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
        let (_, reader) = self
            .open_copy_source(
                caller,
                &input.copy_source,
                input.expected_source_bucket_owner.as_deref(),
                Conditions {
                    if_match: input.copy_source_if_match.map(etag_cond),
                    if_none_match: input.copy_source_if_none_match.map(etag_cond),
                    if_modified_since: input.copy_source_if_modified_since.map(ts_secs),
                    if_unmodified_since: input.copy_source_if_unmodified_since.map(ts_secs),
                },
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
        let body = futures::StreamExt::map(reader.stream(range), |r| {
            r.map_err(|e| Box::new(e) as StdError)
        });
        // A part of an upload with a checksum algorithm gets its checksum
        // computed over the copied bytes.
        let mut check = RequestChecksum::computing(upload_sum.map(|u| u.algorithm));
        let part = self
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
        let m = self.rdma.metrics();
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

    async fn get_bucket_acl(
        &self,
        req: S3Request<GetBucketAclInput>,
    ) -> S3Result<S3Response<GetBucketAclOutput>> {
        let info = self.bucket_info(&req.extensions, &req.input.bucket)?;
        let owner = self.users.bucket_owner(&info);
        Ok(S3Response::new(GetBucketAclOutput {
            grants: Some(self.grants_of(&owner, &info.acl)),
            owner: Some(self.owner_of(&owner)),
        }))
    }

    async fn put_bucket_acl(
        &self,
        req: S3Request<PutBucketAclInput>,
    ) -> S3Result<S3Response<PutBucketAclOutput>> {
        let input = req.input;
        let info = self.bucket_info(&req.extensions, &input.bucket)?;
        let owner = self.users.bucket_owner(&info);
        let acl = self.acl_to_set(
            &owner,
            &owner,
            input.acl.as_ref().map(BucketCannedACL::as_str),
            &grant_headers!(input, grant_write),
            input.access_control_policy.as_ref(),
        )?;
        self.store
            .set_bucket_acl(&input.bucket, acl)
            .await
            .map_err(store_error)?;
        Ok(S3Response::new(PutBucketAclOutput {}))
    }

    async fn get_object_acl(
        &self,
        req: S3Request<GetObjectAclInput>,
    ) -> S3Result<S3Response<GetObjectAclOutput>> {
        let caller = self.caller(&req);
        let input = req.input;
        check_version_id(input.version_id.as_deref())?;
        let reader = self
            .open_checked(
                caller,
                &*self.bucket_info(&req.extensions, &input.bucket)?,
                &input.key,
                Permission::ReadAcp,
            )
            .await?;
        let info = self.bucket_info(&req.extensions, &input.bucket)?;
        let owner = reader
            .meta
            .attrs
            .owner
            .clone()
            .unwrap_or_else(|| self.users.bucket_owner(&info));
        let acl = self.object_acl(&input.bucket, &reader.meta).await?;
        Ok(S3Response::new(GetObjectAclOutput {
            grants: Some(self.grants_of(&owner, &acl)),
            owner: Some(self.owner_of(&owner)),
            request_charged: None,
        }))
    }

    async fn put_object_acl(
        &self,
        req: S3Request<PutObjectAclInput>,
    ) -> S3Result<S3Response<PutObjectAclOutput>> {
        let caller = self.caller(&req);
        let input = req.input;
        check_version_id(input.version_id.as_deref())?;
        let reader = self
            .open_checked(
                caller,
                &*self.bucket_info(&req.extensions, &input.bucket)?,
                &input.key,
                Permission::WriteAcp,
            )
            .await?;
        let info = self.bucket_info(&req.extensions, &input.bucket)?;
        let bucket_owner = self.users.bucket_owner(&info);
        let owner = reader
            .meta
            .attrs
            .owner
            .clone()
            .unwrap_or_else(|| bucket_owner.clone());
        let acl = self.acl_to_set(
            &owner,
            &bucket_owner,
            input.acl.as_ref().map(ObjectCannedACL::as_str),
            &grant_headers!(input, grant_write),
            input.access_control_policy.as_ref(),
        )?;
        self.store
            .set_object_acl(&input.bucket, &reader.meta, acl)
            .await
            .map_err(store_error)?;
        Ok(S3Response::new(PutObjectAclOutput::default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_ranges() {
        use crate::store::format::PartMeta;
        let mut meta = ObjectMeta {
            size: 25,
            parts_count: Some(3),
            parts: [10, 10, 5]
                .into_iter()
                .map(|size| PartMeta {
                    size,
                    checksum: None,
                })
                .collect(),
            ..Default::default()
        };
        assert_eq!(part_range(&meta, 1).unwrap(), 0..10);
        assert_eq!(part_range(&meta, 3).unwrap(), 20..25);
        let code = |r: S3Result<std::ops::Range<u64>>| r.unwrap_err().code().as_str().to_owned();
        assert_eq!(code(part_range(&meta, 4)), "InvalidPartNumber");
        assert_eq!(code(part_range(&meta, 0)), "InvalidArgument");
        meta.parts.clear();
        assert_eq!(code(part_range(&meta, 2)), "NotImplemented");
        meta.parts_count = None;
        assert_eq!(part_range(&meta, 1).unwrap(), 0..25);
        assert_eq!(code(part_range(&meta, 2)), "InvalidPartNumber");
    }

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

    #[test]
    fn error_mapping() {
        assert_eq!(
            store_error(StoreError::NoSuchKey).code(),
            &S3ErrorCode::NoSuchKey
        );
        assert_eq!(
            store_error(StoreError::ChecksumMismatch("x".into())).code(),
            &S3ErrorCode::BadDigest
        );
        assert_eq!(
            store_error(StoreError::EntityTooSmall { part: 1, size: 1 }).code(),
            &S3ErrorCode::EntityTooSmall
        );
        let e = store_error(StoreError::Io(std::io::Error::other("secret path")));
        assert_eq!(e.code(), &S3ErrorCode::InternalError);
        assert!(!e.message().unwrap_or_default().contains("secret"));
        // ENOSPC and EDQUOT (Linux).
        for errno in [28, 122] {
            let e = store_error(StoreError::Io(std::io::Error::from_raw_os_error(errno)));
            assert_eq!(
                e.code(),
                &S3ErrorCode::Custom("InsufficientStorage".into()),
                "{errno}"
            );
            assert_eq!(
                e.status_code(),
                Some(http::StatusCode::INSUFFICIENT_STORAGE)
            );
            assert!(e.message().unwrap_or_default().contains("out of space"));
        }
    }
}
