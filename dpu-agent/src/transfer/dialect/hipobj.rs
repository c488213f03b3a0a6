//! AMD's hipobj-rc-v2 dialect as a client (targets with `protocol:
//! hipobj-rc-v2`): the agent speaks the control plane over HTTP, the queue
//! pair of each transfer lives on the calling shim's RDMA device
//! ([`crate::qp_link`]), where the tenant's memory is registered.
//!
//! One transfer (at most [`hipobj::MAX_TRANSFER`] bytes):
//! 1. the shim creates a QP over the window slice (a GET's receive is
//!    posted now, before READY);
//! 2. `POST /.hipobj-rc/prepare` (SigV4, every `x-amz-rdma-*` header
//!    signed) with our RC token, PSN, cookie, op, target, size, offset; the
//!    reply names the server's QP (`200:<token>` or `200 <token>`), PSN,
//!    session and, for a PUT, its staging region. `501` with
//!    `x-amz-rdma-protocol-status: unsupported` is the one decline: the
//!    bytes then go over HTTP (nothing has moved yet). A 200 without the
//!    reply header is a broken reply, never a success;
//! 3. the shim brings the QP to RTR/RTS against the server's;
//! 4. `POST /.hipobj-rc/ready`: a GET is written by the server
//!    (WRITE_WITH_IMM, immediate = cookie); for a PUT the shim writes the
//!    slice into the staging region at the same time; the reply is the
//!    final outcome (cookie, bytes, ETag, checksum);
//! 5. a GET's receive is checked by the shim (opcode, immediate, length)
//!    before the chunk counts as placed.
//!
//! From READY on a failure fails the transfer: never retried, never
//! redone over HTTP into the same window. Over a request's fabric rails
//! each chunk or part runs on the rail the loops picked: its slot is that
//! rail's window, so the shim opens the QP on that rail's device (in the
//! tenant's protection domain there) and the server answers from its rail
//! facing the QP's GID; a transfer that failed on its rail is redone as a
//! new transfer (a new PREPARE and QP) on another rail, once the failed
//! QP was closed. A transfer abandoned before the
//! data phase is cancelled (`/.hipobj-rc/cancel`, best effort).

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Method, StatusCode};
use s3dma_wire::hipobj::{self, FinalReply, PrepareReply, RcToken, header as h};
use tracing::debug;

use super::mover::{ChunkMover, Transfer};
use crate::error::{AgentError, BadReply};
use crate::qp_link::{QpLink, QpLinkError, ShimQp};
use crate::s3::client::{S3Call, header, read_small};
use crate::transfer::exchange::{Attempt, Exchange};
use fabric::RdmaToken;
use futures::future::BoxFuture;

/// How a transfer ended when it did not fail.
#[derive(Debug)]
enum Outcome<T> {
    /// Moved by RDMA.
    Done(T),
    /// The target declined the dialect (501, unsupported) before anything
    /// moved: the caller sends the bytes over HTTP.
    Declined,
}

/// hipobj-rc-v2 (`protocol: hipobj-rc-v2`; its requests carry no token):
/// transfers over queue pairs on the calling shim's device, when it has a
/// `QueuePairs` link; without one, every byte goes over HTTP (never with
/// an s3dma token).
#[derive(Debug)]
pub struct HipobjRc {
    /// The calling shim's link.
    pub link: Option<Arc<QpLink>>,
}

impl ChunkMover for HipobjRc {
    /// A transfer names its offset and size: the object's size comes
    /// first, from a HEAD (also without a link).
    fn size_first(&self) -> bool {
        true
    }

    /// One transfer per [`hipobj::MAX_TRANSFER`] bytes. `false`: no link,
    /// or the target declined the dialect before anything moved.
    fn get_chunk<'a>(
        &'a self,
        ex: &'a Arc<Exchange>,
        t: &'a Transfer<'a>,
        etag: &'a str,
    ) -> BoxFuture<'a, Result<bool, Attempt>> {
        Box::pin(async move {
            let Some(link) = &self.link else {
                return Ok(false);
            };
            let len = u64::from(t.slot.size);
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(hipobj::MAX_TRANSFER);
                let piece = t
                    .slot
                    .slice(done, n)
                    .map_err(|e| AgentError::internal_from("a slice of the tenant's window", e))?;
                let one = Transfer {
                    offset: t.offset + done,
                    slot: piece,
                    ..t.clone()
                };
                match transfer(ex, link, &one, true, Some(etag)).await? {
                    Outcome::Done(_) => done += n,
                    // Only the first transfer can be declined: the target
                    // answered the others.
                    Outcome::Declined if done == 0 => return Ok(false),
                    Outcome::Declined => {
                        return Err(Attempt::Fatal(AgentError::Protocol(BadReply::Hipobj {
                            step: "PREPARE",
                            reason: "declined in the middle of a chunk".into(),
                        })));
                    }
                }
            }
            Ok(true)
        })
    }

    /// One transfer (retried before READY); `None`: no link, nothing to
    /// move, or the target declined.
    fn put<'a>(
        &'a self,
        ex: &'a Arc<Exchange>,
        t: &'a Transfer<'a>,
    ) -> BoxFuture<'a, Result<Option<String>, AgentError>> {
        Box::pin(async move {
            let Some(link) = &self.link else {
                return Ok(None);
            };
            if t.slot.size == 0 {
                return Ok(None);
            }
            match ex
                .retrying_on_rail("PUT (hipobj-rc-v2)", t.fast, || {
                    transfer(ex, link, t, false, None)
                })
                .await?
            {
                Outcome::Done(etag) => Ok(Some(etag.unwrap_or_default())),
                Outcome::Declined => {
                    debug!(target = %ex.target.name, "target declined hipobj-rc-v2 for PUT; sending over HTTP");
                    Ok(None)
                }
            }
        })
    }
}

/// `HeaderMap` as the dialect's parsers read headers.
struct Replied<'a>(&'a HeaderMap);

impl hipobj::Headers for Replied<'_> {
    fn values(&self, name: &str) -> Vec<&str> {
        self.0
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect()
    }
}

fn broken(step: &'static str, reason: impl std::fmt::Display) -> AgentError {
    AgentError::Protocol(BadReply::Hipobj {
        step,
        reason: reason.to_string(),
    })
}

fn shim_failed(what: &str, e: QpLinkError) -> AgentError {
    AgentError::Fabric {
        message: format!("hipobj-rc-v2 transfer: {what} on the shim's RDMA device failed: {e}"),
        source: Some(std::sync::Arc::new(e)),
    }
}

fn set(call: &mut S3Call, name: &'static str, value: &str) -> Result<(), AgentError> {
    call.header(name, value)
        .map_err(|e| AgentError::internal_from("a hipobj-rc-v2 header", e))
}

/// The token under the target's configured header name (validated at
/// load: a lowercase `x-` name).
fn set_token(call: &mut S3Call, name: &str, token: &str) -> Result<(), AgentError> {
    let name = http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|e| AgentError::internal_from("the token header name", e))?;
    let value = http::HeaderValue::from_str(token)
        .map_err(|e| AgentError::internal_from("the RC token", e))?;
    call.headers.insert(name, value);
    Ok(())
}

/// Ends a session not carried to its end (best effort: servers answer 204
/// whatever its state, and reap it anyway).
struct CancelOnDrop {
    ctx: Option<Arc<Exchange>>,
    session: hipobj::SessionId,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(ctx) = self.ctx.take() else {
            return;
        };
        let session = self.session;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let mut call = S3Call::new(Method::POST, hipobj::CONTROL_BUCKET, Some("cancel"));
                let built = set(&mut call, h::PROTOCOL, hipobj::PROTOCOL)
                    .and_then(|()| set(&mut call, h::SESSION, &session.to_string()));
                if built.is_ok() {
                    let sent =
                        tokio::time::timeout(ctx.core.settings.attempt_timeout, ctx.send(call))
                            .await;
                    if let Ok(Ok(r)) = sent {
                        let _ = read_small(r, 4 << 10).await;
                    }
                }
                debug!(id = %ctx.request_id, "cancelled a hipobj-rc-v2 session");
            });
        }
    }
}

/// A cookie: random, never 0 (some peers take 0 for "none").
fn new_cookie() -> u32 {
    loop {
        let c = rand::random::<u32>();
        if c != 0 {
            return c;
        }
    }
}

/// One transfer (GET when `get`, else PUT); a PUT returns the ETag.
/// Before READY a transport failure or 5xx is retryable (a fresh queue
/// pair each attempt); from READY on every failure is final.
async fn transfer(
    ex: &Arc<Exchange>,
    link: &Arc<QpLink>,
    t: &Transfer<'_>,
    get: bool,
    expected_etag: Option<&str>,
) -> Result<Outcome<Option<String>>, Attempt> {
    let timeout = ex.core.settings.attempt_timeout;
    let len = t.slot.size;
    if u64::from(len) > hipobj::MAX_TRANSFER || len == 0 {
        return Err(Attempt::Fatal(AgentError::internal(format!(
            "a hipobj-rc-v2 transfer moves 1 to {} bytes, not {len}",
            hipobj::MAX_TRANSFER
        ))));
    }
    let psn = hipobj::random_psn();
    let cookie = new_cookie();
    let qp = link
        .open(&t.slot, get, psn, timeout)
        .await
        .map_err(|e| Attempt::Fatal(shim_failed("creating the queue pair", e)))?;
    let Some(gid) = qp.gid() else {
        return Err(Attempt::Fatal(shim_failed(
            "creating the queue pair",
            QpLinkError::Unexpected("no GID"),
        )));
    };
    let mut token = RcToken::rc(
        qp.opened.qpn,
        gid,
        u8::try_from(qp.opened.port).unwrap_or(1),
    );
    token.lid = u16::try_from(qp.opened.lid).unwrap_or(0);
    let target = match t.part {
        Some((n, upload_id)) => format!(
            "{}?uploadId={}&partNumber={n}",
            hipobj::encode_target(t.bucket, t.key),
            percent_encoding::utf8_percent_encode(upload_id, percent_encoding::NON_ALPHANUMERIC)
        ),
        None => hipobj::encode_target(t.bucket, t.key),
    };
    let mut call = S3Call::new(Method::POST, hipobj::CONTROL_BUCKET, Some("prepare"));
    set(&mut call, h::PROTOCOL, hipobj::PROTOCOL)?;
    set_token(&mut call, &ex.target.token_header, &token.encode())?;
    set(&mut call, h::PSN, &hipobj::format_psn(psn))?;
    set(&mut call, h::COOKIE, &hipobj::format_cookie(cookie))?;
    set(&mut call, h::OP, if get { "GET" } else { "PUT" })?;
    set(&mut call, h::TARGET, &target)?;
    set(&mut call, h::SIZE, &len.to_string())?;
    if get {
        set(&mut call, h::OFFSET, &t.offset.to_string())?;
    }
    let reply = ex.send(call).await?;
    let status = reply.status();
    if status == StatusCode::NOT_IMPLEMENTED {
        let unsupported = header(reply.headers(), h::PROTOCOL_STATUS)
            .is_some_and(|v| v.eq_ignore_ascii_case("unsupported"));
        if unsupported {
            let _ = read_small(reply, 64 << 10).await;
            return Ok(Outcome::Declined);
        }
    }
    if status != StatusCode::OK {
        return Err(ex.failure(reply).await);
    }
    let prepared = PrepareReply::parse(&Replied(reply.headers()))
        .map_err(|e| Attempt::Fatal(broken("PREPARE", e)))?;
    let _ = read_small(reply, 4 << 10).await;
    let mut cancel = CancelOnDrop {
        ctx: Some(Arc::clone(ex)),
        session: prepared.session,
    };
    if !get && prepared.staging.is_none() {
        return Err(Attempt::Fatal(broken(
            "PREPARE",
            "a PUT's reply names no staging region (x-amz-rdma-mr-addr, x-amz-rdma-mr-rkey)",
        )));
    }
    qp.connect(
        prepared.token.qpn,
        prepared.token.gid,
        prepared.token.lid,
        prepared.server_psn,
        timeout,
    )
    .await
    .map_err(|e| Attempt::Fatal(shim_failed("connecting the queue pair", e)))?;
    // The data phase: from here on nothing is retried.
    let done = ready(ex, &qp, &prepared, &t.slot, cookie, get, timeout)
        .await
        .map_err(|e| match e {
            Attempt::Retry(e, _) | Attempt::Fatal(e) => Attempt::Fatal(e),
        })?;
    cancel.ctx = None;
    if done.bytes != u64::from(len) {
        return Err(Attempt::Fatal(AgentError::Protocol(
            BadReply::BytesTransferred {
                moved: Some(done.bytes),
                len: u64::from(len),
            },
        )));
    }
    if let (Some(want), Some(got)) = (expected_etag, done.etag.as_deref())
        && !want.is_empty()
        && want != got
    {
        return Err(Attempt::Fatal(AgentError::ObjectChanged {
            etag: want.to_owned(),
        }));
    }
    Ok(Outcome::Done(done.etag))
}

/// READY and the data phase: the shim's write (PUT) alongside, the
/// final reply, a GET's receive checked.
async fn ready(
    ex: &Exchange,
    qp: &ShimQp,
    prepared: &PrepareReply,
    slot: &RdmaToken,
    cookie: u32,
    get: bool,
    timeout: Duration,
) -> Result<FinalReply, Attempt> {
    let mut call = S3Call::new(Method::POST, hipobj::CONTROL_BUCKET, Some("ready"));
    set(&mut call, h::PROTOCOL, hipobj::PROTOCOL)?;
    set(&mut call, h::SESSION, &prepared.session.to_string())?;
    set(&mut call, h::COOKIE, &hipobj::format_cookie(cookie))?;
    set(&mut call, h::QPN, &format!("{:x}", qp.opened.qpn))?;
    set(&mut call, h::MR_ADDR, &format!("{:x}", slot.addr))?;
    set(&mut call, h::MR_RKEY, &format!("{:x}", slot.rkey))?;
    let write = async {
        match (get, prepared.staging) {
            (false, Some((addr, rkey))) => qp
                .write(addr, rkey, cookie, timeout)
                .await
                .map_err(|e| shim_failed("writing the bytes to the server", e)),
            _ => Ok(()),
        }
    };
    let (reply, written) = tokio::join!(ex.send(call), write);
    let reply = reply?;
    if reply.status() != StatusCode::OK {
        return Err(ex.failure(reply).await);
    }
    let done = FinalReply::parse(&Replied(reply.headers()), cookie)
        .map_err(|e| Attempt::Fatal(broken("READY", e)))?;
    let _ = read_small(reply, 4 << 10).await;
    written?;
    if get {
        qp.await_receive(cookie, slot.size, timeout)
            .await
            .map_err(|e| shim_failed("checking the server's write", e))?;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_never_zero() {
        for _ in 0..1000 {
            assert_ne!(new_cookie(), 0);
        }
    }

    #[test]
    fn reply_headers_are_read_as_the_dialect_reads_them() {
        let mut m = HeaderMap::new();
        m.append("x-amz-rdma-protocol", "hipobj-rc-v2".parse().unwrap());
        m.append("x-amz-rdma-cookie", "0000002a".parse().unwrap());
        m.append("x-amz-rdma-bytes-transferred", "4096".parse().unwrap());
        let f = FinalReply::parse(&Replied(&m), 42).unwrap();
        assert_eq!(f.bytes, 4096);
        // Another cookie is not ours.
        assert!(FinalReply::parse(&Replied(&m), 43).is_err());
        // A duplicated header is refused, not guessed.
        m.append("x-amz-rdma-bytes-transferred", "1".parse().unwrap());
        assert!(FinalReply::parse(&Replied(&m), 42).is_err());
    }
}
