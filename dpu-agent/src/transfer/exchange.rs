//! One tenant request bound to one target: [`Exchange`] sends its attempts
//! (counting them per target and keeping the target's health), says what a
//! failed reply means ([`Attempt`]) and retries retryable failures with
//! jittered backoff under the attempt timeout. Every operation and every
//! dialect talks to a target through it.

use std::future::Future;
use std::sync::Arc;

use tracing::debug;

use super::{COOL_DOWN, Core, Tenant};
use crate::error::{AgentError, BadReply, BadRequest};
use crate::retry::retryable_status;
use crate::s3::client::{S3Call, SendError, error_of, read_small};
use crate::s3::xml;
use crate::s3::{Reply, TargetClient};

/// How one attempt failed.
#[derive(Debug)]
pub enum Attempt {
    /// Worth another attempt (reason is a metric label).
    Retry(AgentError, &'static str),
    /// Final.
    Fatal(AgentError),
}

impl From<AgentError> for Attempt {
    fn from(e: AgentError) -> Self {
        Attempt::Fatal(e)
    }
}

/// One tenant request bound to one target.
#[derive(Debug)]
pub struct Exchange {
    /// Shared state.
    pub core: Arc<Core>,
    /// The tenant.
    pub tenant: Arc<Tenant>,
    /// The target.
    pub target: Arc<TargetClient>,
    /// The agent's request id.
    pub request_id: String,
}

impl Exchange {
    /// Sends one attempt of `call`; a transport failure is retryable.
    pub async fn send(&self, call: S3Call) -> Result<Reply, Attempt> {
        let method = call.method.clone();
        match self
            .target
            .send(&self.tenant.signer, call, &self.request_id)
            .await
        {
            Ok(r) => {
                self.core.metrics.target_request(
                    &self.target.name,
                    method.as_str(),
                    r.status().as_str(),
                );
                if self.target.health.answered() {
                    self.core.metrics.target_up(&self.target.name, true);
                }
                Ok(r)
            }
            Err(SendError::Build(m)) => Err(Attempt::Fatal(AgentError::InvalidArgument(
                BadRequest::Unsendable { reason: m },
            ))),
            Err(SendError::Transport(m)) => {
                self.core
                    .metrics
                    .target_request(&self.target.name, method.as_str(), "error");
                if self.target.health.failed(COOL_DOWN) {
                    self.core.metrics.target_up(&self.target.name, false);
                }
                Err(Attempt::Retry(AgentError::unavailable(m), "connection"))
            }
        }
    }

    /// The failure of a non-success reply: retryable for 5xx/429/408.
    pub async fn failure(&self, reply: Reply) -> Attempt {
        let status = reply.status().as_u16();
        let err = error_of(reply).await;
        if retryable_status(status) {
            Attempt::Retry(AgentError::S3(err), "status")
        } else {
            Attempt::Fatal(AgentError::S3(err))
        }
    }

    /// Runs `attempt` until it succeeds, fails finally, or retries run out.
    /// Each try is bounded by the attempt timeout.
    ///
    /// # Errors
    /// The last failure.
    pub async fn retrying<T, F, Fut>(&self, what: &str, attempt: F) -> Result<T, AgentError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Attempt>>,
    {
        self.retrying_on_rail(what, false, attempt).await
    }

    /// [`Exchange::retrying`] for a chunk or part on one of a request's
    /// rails ([`super::rails`]); `fast`: other rails remain, so a failure
    /// naming the rail ([`super::rails::names_rail`]) and a timed-out
    /// attempt (a fabric error then) end it at once, to be redone on
    /// another rail, instead of being retried here.
    ///
    /// # Errors
    /// The last failure.
    pub async fn retrying_on_rail<T, F, Fut>(
        &self,
        what: &str,
        fast: bool,
        mut attempt: F,
    ) -> Result<T, AgentError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Attempt>>,
    {
        let s = &self.core.settings;
        let mut retry = 0u32;
        loop {
            let res = match tokio::time::timeout(s.attempt_timeout, attempt()).await {
                Ok(r) => r,
                Err(_) if fast => {
                    return Err(AgentError::Fabric {
                        message: format!(
                            "{what}: target {} did not answer within {:?} over this fabric rail",
                            self.target.name, s.attempt_timeout
                        ),
                        source: None,
                    });
                }
                Err(_) => Err(Attempt::Retry(
                    AgentError::unavailable(format!(
                        "{what}: target {} did not answer within {:?}",
                        self.target.name, s.attempt_timeout
                    )),
                    "timeout",
                )),
            };
            match res {
                Ok(v) => return Ok(v),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry(e, _)) if fast && super::rails::names_rail(&e) => {
                    return Err(e);
                }
                Err(Attempt::Retry(e, reason)) => {
                    if retry >= s.retry.retries {
                        return Err(match e {
                            AgentError::Unavailable { message, source } => {
                                AgentError::Unavailable {
                                    message: format!(
                                        "{message} (gave up after {} attempts)",
                                        retry + 1
                                    ),
                                    source,
                                }
                            }
                            other => other,
                        });
                    }
                    retry += 1;
                    self.core.metrics.retry(&self.target.name, reason);
                    let wait = s.retry.backoff(retry, rand::random::<f64>());
                    debug!(%what, retry, ?wait, error = %e, "retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

/// Sets the tenant's `If-Match` on `call`.
///
/// # Errors
/// An ETag that is no header value.
pub fn set_if_match(call: &mut S3Call, etag: &str) -> Result<(), AgentError> {
    call.header("if-match", etag).map_err(|e| {
        AgentError::InvalidArgument(BadRequest::Header {
            field: "if_match",
            reason: e.to_string(),
        })
    })
}

/// Reads a reply's (small) body, at most `limit` bytes; a body cut short
/// is retryable.
///
/// # Errors
/// [`Attempt::Retry`].
pub async fn read_body(
    reply: Reply,
    limit: usize,
) -> Result<(http::response::Parts, bytes::Bytes), Attempt> {
    read_small(reply, limit).await.map_err(|m| {
        Attempt::Retry(
            AgentError::unavailable_from("reading the reply body failed", m),
            "body",
        )
    })
}

/// Parses the XML body of the S3 reply `name` as `T`.
///
/// # Errors
/// [`Attempt::Fatal`] with [`BadReply::Unparsable`].
pub fn parse_xml<T: for<'de> serde::Deserialize<'de>>(
    body: &[u8],
    name: &'static str,
) -> Result<T, Attempt> {
    xml::parse(body).map_err(|e| {
        Attempt::Fatal(AgentError::Protocol(BadReply::Unparsable {
            reply: name,
            reason: e.to_string(),
        }))
    })
}
