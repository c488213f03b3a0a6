//! One data request's path: how a GetObject, PutObject or UploadPart is
//! served (HTTP, RDMA with the request's token, or declined), decided once
//! from the request and shared by both S3 front ends (the filesystem
//! store's [`crate::s3`] and the [`crate::gateway`]): a PUT's RDMA body (or
//! the refusal of a declined one), and the RDMA reply headers and path
//! metrics of a finished request.

use http::HeaderMap;
use s3s::{S3Request, S3Result};

use super::plan::reply_headers;
use super::{Decision, RdmaService, Via, transfer};
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
        match &self.decision {
            Decision::Rdma(t) | Decision::Dc(t) => Some(t),
            Decision::Http | Decision::Decline(_) => None,
        }
    }

    /// How an RDMA request's bytes move (s3dma's fabric, or DC for a
    /// standard token).
    #[must_use]
    pub fn via(&self) -> Via {
        match self.decision {
            Decision::Dc(_) => Via::Dc,
            _ => Via::Fabric,
        }
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
        match &self.decision {
            Decision::Http => Ok(None),
            Decision::Decline(why) => Err(self.rdma.declined_put(why)),
            Decision::Rdma(token) | Decision::Dc(token) => {
                let body = self
                    .rdma
                    .put_body(token, headers, &self.user, self.via())
                    .await
                    .map_err(|e| e.to_s3())?;
                Ok(Some((body, u64::from(token.size))))
            }
        }
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

    /// The reply headers of a GetObject: over RDMA `200`, or `206` for
    /// `partial` content, with the bytes `transferred`; `501` when declined
    /// (the object went in the HTTP body); none over HTTP.
    #[must_use]
    pub fn get_reply(&self, partial: bool, transferred: u64) -> HeaderMap {
        match self.decision {
            Decision::Rdma(_) | Decision::Dc(_) => {
                reply_headers(if partial { 206 } else { 200 }, Some(transferred))
            }
            Decision::Decline(_) => reply_headers(501, None),
            Decision::Http => HeaderMap::new(),
        }
    }
}
