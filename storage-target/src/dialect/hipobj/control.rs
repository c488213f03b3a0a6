//! The control path's parts every build has: which requests are control
//! requests, the dialect's error shape (a `501` carries
//! `x-amz-rdma-protocol-status: unsupported`), the route that answers every
//! control request as unsupported, and the bucket-name rule that lets the
//! control path reach a route.

use http::{Extensions, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use s3dma_wire::hipobj::{self, Control};
use s3s::route::S3Route;
use s3s::{Body, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

/// The verified user of a control request: the one [`super::ControlAuth`]
/// verified ahead of s3s (or, for a request s3s verified, its credentials).
pub(super) fn control_caller(req: &S3Request<Body>) -> Option<s3s::auth::Credentials> {
    req.extensions
        .get::<super::ControlCaller>()
        .map(|c| c.0.clone())
        .or_else(|| req.credentials.clone())
}

/// The control requests' access rule: signed by a user of this server.
pub(super) fn signed_only(req: &S3Request<Body>) -> S3Result<()> {
    match control_caller(req) {
        Some(_) => Ok(()),
        None => Err(S3Error::with_message(
            S3ErrorCode::AccessDenied,
            "the hipobj-rc-v2 control requests must be signed (SigV4) by a user of this server",
        )),
    }
}

/// Whether a request is for the control path (both routes take it).
pub(super) fn is_control_request(method: &Method, uri: &Uri) -> bool {
    *method == Method::POST && Control::is_control_path(uri.path())
}

pub(super) fn error(status: u16, code: S3ErrorCode, message: impl Into<String>) -> S3Error {
    let mut e = S3Error::with_message(code, message.into());
    e.set_status_code(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST));
    if status == 501 {
        let mut h = HeaderMap::new();
        h.insert(
            hipobj::header::PROTOCOL_STATUS,
            HeaderValue::from_static("unsupported"),
        );
        e.set_headers(h);
    }
    e
}

/// The control path where the dialect is not served at all (the gateway):
/// every signed control request is answered `501` with
/// `x-amz-rdma-protocol-status: unsupported`, the dialect's fallback signal,
/// instead of s3s's `InvalidBucketName` for the path.
#[derive(Debug, Clone, Copy)]
pub struct HipobjUnsupported(pub &'static str);

#[async_trait::async_trait]
impl S3Route for HipobjUnsupported {
    fn is_match(
        &self,
        method: &Method,
        uri: &Uri,
        _headers: &HeaderMap,
        _extensions: &mut Extensions,
    ) -> bool {
        is_control_request(method, uri)
    }

    async fn check_access(&self, req: &mut S3Request<Body>) -> S3Result<()> {
        signed_only(req)
    }

    async fn call(&self, _req: S3Request<Body>) -> S3Result<S3Response<Body>> {
        Err(error(
            501,
            S3ErrorCode::NotImplemented,
            format!("hipobj-rc-v2 is not served here: {}", self.0),
        ))
    }
}

/// s3s's bucket-name rules, plus the control path's first segment
/// (`.hipobj-rc`), so that `POST /.hipobj-rc/prepare` reaches the route.
/// No bucket can be named so: CreateBucket checks names itself.
#[derive(Debug, Clone, Copy)]
pub struct ControlPathNames;

impl s3s::validation::NameValidation for ControlPathNames {
    fn validate_bucket_name(&self, name: &str) -> bool {
        name == s3dma_wire::hipobj::CONTROL_BUCKET
            || s3s::validation::AwsNameValidation::new().validate_bucket_name(name)
    }
}
