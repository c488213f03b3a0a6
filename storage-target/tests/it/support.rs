//! Helpers the suites share beside `common`: one-line SDK calls that give
//! back the S3 error code and status, raw SigV4-signed requests, and
//! assertions on S3 error responses, so that a test body says what it
//! tests. Those marked *generic* know nothing of storage-target and may
//! move to the test kit.

#![allow(dead_code)]

use std::fmt::Debug;
use std::path::Path;
use std::time::{Duration, SystemTime};

use aws_sdk_s3::Client;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::operation::get_object::GetObjectOutput;
use aws_sdk_s3::operation::head_object::HeadObjectOutput;
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use aws_sigv4::http_request::SignableBody;
use bytes::Bytes;

use crate::common::{ADMIN, Raw, Server, err, raw, sign_v4_as, write_private};

/// An S3 error as code and HTTP status (what [`crate::common::err`] gives).
pub(crate) type S3Err = (String, u16);

/// *Generic.* An SDK call's result with its error as code and status.
pub(crate) fn s3<T, E>(
    r: Result<T, SdkError<E, aws_smithy_runtime_api::http::Response>>,
) -> Result<T, S3Err>
where
    E: ProvideErrorMetadata + Debug,
{
    r.map_err(err)
}

/// *Generic.* The error of an SDK call that must fail (panics when it did
/// not).
#[track_caller]
pub(crate) fn fails<T: Debug, E>(
    r: Result<T, SdkError<E, aws_smithy_runtime_api::http::Response>>,
) -> S3Err
where
    E: ProvideErrorMetadata + Debug,
{
    err(r.unwrap_err())
}

/// `(code, status)` owned, to compare with an [`S3Err`].
pub(crate) fn s3err(code: &str, status: u16) -> S3Err {
    (code.to_owned(), status)
}

/// A server started as [`Server::start`] and its admin client, with bucket
/// `b` created.
pub(crate) async fn server_with_bucket(b: &str) -> (Server, Client) {
    let s = Server::start();
    let c = s.admin();
    mkbucket(&c, b).await.unwrap();
    (s, c)
}

/// The fabric key of every RDMA test server and its tenants' endpoints.
pub(crate) const FABRIC_KEY_HEX: &str =
    "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// A server whose config adds the YAML `section` returns for the path of
/// a private fabric key file holding [`FABRIC_KEY_HEX`].
pub(crate) fn fabric_server(section: impl FnOnce(&str) -> String) -> Server {
    Server::start_with(move |dir: &Path| {
        let kf = dir.join("fabric.key");
        write_private(&kf, format!("{FABRIC_KEY_HEX}\n"));
        section(&kf.display().to_string())
    })
}

/// A [`fabric_server`] with RDMA on `backend`, sending to `networks` (a
/// YAML list), and `section` lines added to `rdma:` (a dialect's).
pub(crate) fn rdma_dialect_server(
    backend: fabric::Backend,
    networks: &str,
    section: String,
) -> Server {
    let networks = networks.to_owned();
    fabric_server(move |key_file| {
        format!(
            "rdma:\n  mode: enabled\n  backend: {backend}\n  fabric_key_file: {key_file}\n  allowed_client_networks: {networks}\n{section}"
        )
    })
}

/// *Generic.* PutObject of `body` at `b/k` as `c`'s user; the ETag.
pub(crate) async fn put(c: &Client, b: &str, k: &str, body: &[u8]) -> String {
    try_put(c, b, k, body).await.unwrap()
}

/// *Generic.* [`put`] that may fail.
pub(crate) async fn try_put(c: &Client, b: &str, k: &str, body: &[u8]) -> Result<String, S3Err> {
    let r = c.put_object().bucket(b).key(k);
    let out = s3(r.body(ByteStream::from(body.to_vec())).send().await)?;
    Ok(out.e_tag.unwrap_or_default())
}

/// *Generic.* GetObject of `b/k` (the body unread).
pub(crate) async fn get(c: &Client, b: &str, k: &str) -> Result<GetObjectOutput, S3Err> {
    s3(c.get_object().bucket(b).key(k).send().await)
}

/// *Generic.* The bytes at `b/k` as `c`'s user, or the error.
pub(crate) async fn read(c: &Client, b: &str, k: &str) -> Result<Vec<u8>, S3Err> {
    Ok(get(c, b, k).await?.body.collect().await.unwrap().to_vec())
}

/// *Generic.* HeadObject of `b/k`.
pub(crate) async fn head(c: &Client, b: &str, k: &str) -> Result<HeadObjectOutput, S3Err> {
    s3(c.head_object().bucket(b).key(k).send().await)
}

/// *Generic.* Whether `b/k` exists for `c`'s user (HEAD succeeds).
pub(crate) async fn exists(c: &Client, b: &str, k: &str) -> bool {
    head(c, b, k).await.is_ok()
}

/// *Generic.* DeleteObject of `b/k`.
pub(crate) async fn delete(c: &Client, b: &str, k: &str) -> Result<(), S3Err> {
    s3(c.delete_object().bucket(b).key(k).send().await).map(drop)
}

/// *Generic.* CreateBucket `b`.
pub(crate) async fn mkbucket(c: &Client, b: &str) -> Result<(), S3Err> {
    s3(c.create_bucket().bucket(b).send().await).map(drop)
}

/// *Generic.* DeleteBucket `b`.
pub(crate) async fn rmbucket(c: &Client, b: &str) -> Result<(), S3Err> {
    s3(c.delete_bucket().bucket(b).send().await).map(drop)
}

/// *Generic.* The keys ListObjectsV2 of `b` returns (one page).
pub(crate) async fn list_keys(c: &Client, b: &str) -> Vec<String> {
    let out = c.list_objects_v2().bucket(b).send().await.unwrap();
    object_keys(out.contents())
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// *Generic.* The keys of listed objects, in order.
pub(crate) fn object_keys(objects: &[aws_sdk_s3::types::Object]) -> Vec<&str> {
    objects.iter().map(|o| o.key().unwrap()).collect()
}

/// *Generic.* The names ListBuckets returns to `c`'s user.
pub(crate) async fn bucket_names(c: &Client) -> Vec<String> {
    let out = c.list_buckets().send().await.unwrap();
    out.buckets()
        .iter()
        .map(|b| b.name().unwrap().to_owned())
        .collect()
}

/// *Generic.* CreateMultipartUpload of `b/k`; the upload id.
pub(crate) async fn start_upload(c: &Client, b: &str, k: &str) -> String {
    let r = c.create_multipart_upload().bucket(b).key(k).send().await;
    r.unwrap().upload_id.unwrap()
}

/// *Generic.* ListParts of upload `id` of `b/k` (one page).
pub(crate) async fn list_parts(
    c: &Client,
    b: &str,
    k: &str,
    id: &str,
) -> aws_sdk_s3::operation::list_parts::ListPartsOutput {
    let r = c.list_parts().bucket(b).key(k).upload_id(id).send().await;
    r.unwrap()
}

/// *Generic.* CompleteMultipartUpload of upload `id` of `b/k` with `parts`.
pub(crate) async fn complete(
    c: &Client,
    b: &str,
    k: &str,
    id: &str,
    parts: CompletedMultipartUpload,
) -> Result<aws_sdk_s3::operation::complete_multipart_upload::CompleteMultipartUploadOutput, S3Err>
{
    let req = c.complete_multipart_upload().bucket(b).key(k).upload_id(id);
    s3(req.multipart_upload(parts).send().await)
}

/// *Generic.* UploadPart `n` of `body` into upload `id` of `b/k`; the ETag.
pub(crate) async fn upload_part(
    c: &Client,
    (b, k, id): (&str, &str, &str),
    n: i32,
    body: Vec<u8>,
) -> Result<String, S3Err> {
    let req = c.upload_part().bucket(b).key(k).upload_id(id);
    let req = req.part_number(n).body(ByteStream::from(body));
    let out = s3(req.send().await)?;
    Ok(out.e_tag.unwrap_or_default())
}

/// *Generic.* UploadPartCopy of `source` as part `n` of upload `id` of
/// `b/k`; the ETag.
pub(crate) async fn upload_part_copy(
    c: &Client,
    (b, k, id): (&str, &str, &str),
    n: i32,
    source: &str,
) -> Result<String, S3Err> {
    let req = c.upload_part_copy().bucket(b).key(k).upload_id(id);
    let out = s3(req.part_number(n).copy_source(source).send().await)?;
    Ok(out.copy_part_result().unwrap().e_tag().unwrap().to_owned())
}

/// *Generic.* The part numbers ListParts of upload `id` of `b/k` gives.
pub(crate) async fn part_numbers(c: &Client, b: &str, k: &str, id: &str) -> Vec<i32> {
    let listed = list_parts(c, b, k, id).await;
    listed
        .parts()
        .iter()
        .map(|p| p.part_number().unwrap())
        .collect()
}

/// *Generic.* AbortMultipartUpload of upload `id` of `b/k`.
pub(crate) async fn abort(c: &Client, b: &str, k: &str, id: &str) -> Result<(), S3Err> {
    let req = c.abort_multipart_upload().bucket(b).key(k).upload_id(id);
    s3(req.send().await).map(drop)
}

/// *Generic.* The upload ids ListMultipartUploads of `b` gives (one page).
pub(crate) async fn upload_ids(c: &Client, b: &str) -> Vec<String> {
    let out = c.list_multipart_uploads().bucket(b).send().await.unwrap();
    out.uploads()
        .iter()
        .map(|u| u.upload_id().unwrap().to_owned())
        .collect()
}

/// *Generic.* A Complete body naming `(part number, ETag)` in this order.
pub(crate) fn completed<S: AsRef<str>>(parts: &[(i32, S)]) -> CompletedMultipartUpload {
    let part = |(n, e): &(i32, S)| CompletedPart::builder().part_number(*n).e_tag(e.as_ref());
    let parts = parts.iter().map(|p| part(p).build()).collect();
    CompletedMultipartUpload::builder()
        .set_parts(Some(parts))
        .build()
}

/// *Generic.* A presigning config valid for `secs` from now.
pub(crate) fn presign_for(secs: u64) -> PresigningConfig {
    PresigningConfig::expires_in(Duration::from_secs(secs)).unwrap()
}

/// *Generic.* A presigning config starting at `start`, valid for a minute.
pub(crate) fn presign_at(start: SystemTime) -> PresigningConfig {
    let b = PresigningConfig::builder().start_time(start);
    b.expires_in(Duration::from_secs(60)).build().unwrap()
}

/// *Generic.* A presigned GetObject URL of `b/k`.
pub(crate) async fn presigned_get(c: &Client, b: &str, k: &str, cfg: PresigningConfig) -> String {
    let p = c.get_object().bucket(b).key(k).presigned(cfg);
    p.await.unwrap().uri().to_owned()
}

/// *Generic.* A presigned PutObject URL of `b/k`.
pub(crate) async fn presigned_put(c: &Client, b: &str, k: &str, cfg: PresigningConfig) -> String {
    let p = c.put_object().bucket(b).key(k).presigned(cfg);
    p.await.unwrap().uri().to_owned()
}

/// *Generic.* Signed headers as `raw` takes them (without `host`, which
/// the HTTP client sets).
pub(crate) fn sendable(headers: &[(String, String)]) -> Vec<(&str, &str)> {
    headers
        .iter()
        .filter(|(k, _)| k != "host")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// A raw request signed with SigV4 in the Authorization header.
#[derive(Debug, Clone)]
pub(crate) struct SignedReq<'a> {
    /// Signing user (default [`ADMIN`]).
    pub user: (&'a str, &'a str),
    /// Headers among the signed ones.
    pub signed: Vec<(&'a str, &'a str)>,
    /// Headers added after signing.
    pub unsigned: Vec<(&'a str, &'a str)>,
    /// How the payload is signed (default UNSIGNED-PAYLOAD).
    pub payload: SignableBody<'a>,
    /// Signing time (default now).
    pub time: SystemTime,
}

impl Default for SignedReq<'_> {
    fn default() -> Self {
        SignedReq {
            user: ADMIN,
            signed: Vec::new(),
            unsigned: Vec::new(),
            payload: SignableBody::UnsignedPayload,
            time: SystemTime::now(),
        }
    }
}

impl SignedReq<'_> {
    /// Signs and sends `method url` with `body`.
    pub(crate) async fn send(&self, method: &str, url: &str, body: impl Into<Bytes>) -> Raw {
        let (user, payload) = (self.user, self.payload.clone());
        let mut headers = sign_v4_as(user, method, url, &self.signed, payload, self.time);
        let after = self
            .unsigned
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()));
        headers.extend(after);
        raw(method, url, &sendable(&headers), body.into()).await
    }
}

/// Sends `method url` signed as the admin (UNSIGNED-PAYLOAD, now), with
/// `signed` among the signed headers.
pub(crate) async fn signed_raw(
    method: &str,
    url: &str,
    signed: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Raw {
    let req = SignedReq {
        signed: signed.to_vec(),
        ..SignedReq::default()
    };
    req.send(method, url, body).await
}

/// *Generic.* An unsigned GET of `url` (no headers, no body).
pub(crate) async fn raw_get(url: &str) -> Raw {
    raw("GET", url, &[], Bytes::new()).await
}

/// Asserts a raw response is the S3 error `code` with `status`.
#[track_caller]
pub(crate) fn assert_s3_error(r: &Raw, status: u16, code: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(r.xml("Code").as_deref(), Some(code), "{}", r.text());
}

/// Asserts a raw response's S3 error code is `code` (whatever its status).
#[track_caller]
pub(crate) fn assert_code(r: &Raw, code: &str) {
    assert_eq!(r.xml("Code").as_deref(), Some(code), "{}", r.text());
}

/// Whether `b/k` exists on `s` (HEAD as the admin).
pub(crate) async fn stored(s: &Server, b: &str, k: &str) -> bool {
    exists(&s.admin(), b, k).await
}

/// The text of `s`'s metrics endpoint.
pub(crate) async fn metrics_text(s: &Server) -> String {
    raw_get(&s.metrics).await.text()
}

/// Asserts a raw response has `status` (the body shown when not).
#[track_caller]
pub(crate) fn assert_status(r: &Raw, status: u16) {
    assert_eq!(r.status, status, "{}", r.text());
}

/// *Generic.* `len` bytes of registered memory on `domain`, served on
/// loopback by an endpoint with fabric key `key`: a tenant's side of a
/// transfer.
pub(crate) async fn served_memory(
    domain: &fabric::Domain,
    len: usize,
    key: fabric::FabricKey,
) -> (fabric::Endpoint, fabric::Region) {
    let mem = domain.alloc(len, fabric::Access::ALL).unwrap();
    let config = fabric::EndpointConfig::new("127.0.0.1:0".parse().unwrap(), key);
    let endpoint = fabric::Endpoint::listen(domain, config).await.unwrap();
    (endpoint, mem)
}
