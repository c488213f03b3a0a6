//! Forwarding to the upstream: operations passed on as they are (with
//! `s3s-aws`, as the caller, to the first endpoint that answers), and the
//! errors the gateway answers when the upstream does not.

use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use tracing::warn;

use super::Gateway;

impl Gateway {
    /// Forwards an operation as it is, as the caller, to the first endpoint
    /// that answers.
    pub(super) async fn forward<T, O, F, Fut>(
        &self,
        req: S3Request<T>,
        op: F,
    ) -> S3Result<S3Response<O>>
    where
        T: Clone,
        F: Fn(s3s_aws::Proxy, S3Request<T>) -> Fut,
        Fut: std::future::Future<Output = S3Result<S3Response<O>>>,
    {
        let proxies = self.upstream.proxies(&access_key(&req))?;
        let n = proxies.len();
        let mut last = None;
        for (i, p) in proxies.into_iter().enumerate() {
            match op(p, req.clone()).await {
                Ok(r) => return Ok(r),
                // s3s-aws leaves the status unset when no answer came back.
                Err(e) if e.status_code().is_none() && i + 1 < n => last = Some(e),
                Err(e) => return Err(unreachable_if_unanswered(e)),
            }
        }
        Err(unreachable_if_unanswered(last.unwrap_or_else(|| {
            S3Error::new(S3ErrorCode::InternalError)
        })))
    }

    /// Forwards an operation whose body can be sent only once: one endpoint.
    pub(super) async fn forward_once<T, O, F, Fut>(
        &self,
        req: S3Request<T>,
        op: F,
    ) -> S3Result<S3Response<O>>
    where
        F: FnOnce(s3s_aws::Proxy, S3Request<T>) -> Fut,
        Fut: std::future::Future<Output = S3Result<S3Response<O>>>,
    {
        let p = self
            .upstream
            .proxies(&access_key(&req))?
            .into_iter()
            .next()
            .ok_or_else(|| S3Error::new(S3ErrorCode::InternalError))?;
        op(p, req).await.map_err(unreachable_if_unanswered)
    }
}

pub(super) fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

pub(super) fn internal(msg: &str) -> S3Error {
    warn!(error = msg, "gateway internal error");
    S3Error::with_message(S3ErrorCode::InternalError, msg.to_owned())
}

pub(super) fn unreachable(msg: &str) -> S3Error {
    let mut e = S3Error::with_message(S3ErrorCode::ServiceUnavailable, msg.to_owned());
    e.set_status_code(http::StatusCode::SERVICE_UNAVAILABLE);
    e
}

/// s3s-aws answers `InternalError` without a status when the upstream
/// never answered: say so.
pub(super) fn unreachable_if_unanswered(e: S3Error) -> S3Error {
    if e.status_code().is_none() && *e.code() == S3ErrorCode::InternalError {
        unreachable("the upstream S3 endpoint could not be reached; retry later")
    } else {
        e
    }
}

pub(super) fn access_key<T>(req: &S3Request<T>) -> String {
    req.credentials
        .as_ref()
        .map(|c| c.access_key.clone())
        .unwrap_or_default()
}
