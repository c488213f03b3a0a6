//! One data request's path: how a GetObject, PutObject or UploadPart is
//! served (HTTP, RDMA with the request's token, or declined), decided once
//! from the request and shared by both S3 front ends (the filesystem
//! store's [`crate::s3`] and the [`crate::gateway`]): a PUT's RDMA body (or
//! the refusal of a declined one), and the RDMA reply headers and path
//! metrics of a finished request.

use http::HeaderMap;
use s3s::{S3Request, S3Result};

use super::headers::reply_headers;
use super::{RdmaService, transfer};
use crate::dialect::{Decision, Dialect};
use fabric::RdmaToken;

/// How one GetObject/PutObject/UploadPart is served ([`RdmaService::data_path`]).
#[derive(Debug)]
pub struct DataPath<'a> {
    rdma: &'a RdmaService,
    decision: Decision,
    /// The access key id that signed the request (its share of the staging
    /// pool is counted by it); empty for an anonymous one, which the access
    /// check has refused before any data moves.
    user: String,
}

impl RdmaService {
    /// Decides how a GetObject/PutObject/UploadPart is served.
    ///
    /// # Errors
    /// An `x-amz-rdma-token` that is invalid or not signed.
    pub fn data_path<T>(&self, req: &S3Request<T>) -> S3Result<DataPath<'_>> {
        let decision = self.decide(req).map_err(|e| e.to_s3())?;
        let user = req
            .credentials
            .as_ref()
            .map(|c| c.access_key.clone())
            .unwrap_or_default();
        Ok(DataPath {
            rdma: self,
            decision,
            user,
        })
    }
}

impl DataPath<'_> {
    /// The decision.
    #[must_use]
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The token, when the request is served over RDMA.
    #[must_use]
    pub fn token(&self) -> Option<&RdmaToken> {
        self.decision.token()
    }

    /// The dialect an RDMA request's bytes move in (s3dma's fabric, or DC
    /// for a standard token).
    #[must_use]
    pub fn dialect(&self) -> Dialect {
        self.decision.dialect()
    }

    /// The access key id that signed the request (empty: anonymous).
    #[must_use]
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The body of a PutObject/UploadPart that comes by RDMA: READs of the
    /// token's memory as it is consumed, exactly the token's size (returned
    /// with it); `None` for an HTTP request, whose body is the HTTP body.
    ///
    /// # Errors
    /// A declined request ([`RdmaService::declined_put`]: nothing is read or
    /// stored), a request that is not an empty-body RDMA PUT, an
    /// unreachable endpoint.
    pub async fn put_body(
        &self,
        headers: &HeaderMap,
    ) -> S3Result<Option<(transfer::RdmaBody, u64)>> {
        let Some((dialect, token)) = self
            .decision
            .served()
            .map_err(|why| self.rdma.declined_put(why))?
        else {
            return Ok(None);
        };
        let body = self
            .rdma
            .put_body(token, headers, &self.user, dialect)
            .await
            .map_err(|e| e.to_s3())?;
        Ok(Some((body, u64::from(token.size))))
    }

    /// Records a PutObject/UploadPart (`op`) of `size` bytes served over
    /// RDMA and returns its reply headers (`x-amz-rdma-reply: 200`); `None`
    /// (and nothing recorded) when the request was not an RDMA one.
    pub fn rdma_put_done(&self, op: &str, size: u64) -> Option<HeaderMap> {
        self.token()?;
        let m = self.rdma.metrics();
        m.path_request(op, "rdma");
        m.path_bytes("rdma", "in", size);
        Some(reply_headers(200, Some(size)))
    }

    /// The reply headers of a GetObject ([`Decision::get_reply`]).
    #[must_use]
    pub fn get_reply(&self, partial: bool, transferred: u64) -> HeaderMap {
        self.decision.get_reply(partial, transferred)
    }
}
