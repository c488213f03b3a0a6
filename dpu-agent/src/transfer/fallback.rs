//! The fallback path: moving bytes between an HTTP body and the tenant's
//! window through the agent's registered staging memory.
//!
//! GET: the body is copied into staging buffers and each full buffer is
//! RDMA WRITTEN to its place in the window while the next one fills. PUT:
//! the window is RDMA READ into staging buffers and sent as the HTTP body.
//! Nothing is ever written outside the token slice the planner gave: the
//! agent counts bytes itself and refuses a body longer than the slice.
//!
//! Every staging buffer a tenant's transfer holds first takes a place in
//! the tenant's share of the pool ([`crate::quota::staging_share`]), so no
//! tenant can hold the whole pool.

use std::sync::Arc;

use bytes::Bytes;
use fabric::RdmaToken;
use fabric::pool::{SessionEntry, StagingBuf};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use http_body::Frame;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::Incoming;

use super::exchange::Attempt;
use super::{Core, Tenant};
use crate::error::{AgentError, BadReply, BadRequest};
use crate::quota::StagingPermit;
use crate::s3::client::{BodyError, RequestBody};

/// Staging buffers one transfer may have in flight at once.
const PIPELINE: usize = 3;

async fn session_for(core: &Core, token: &RdmaToken) -> Result<Arc<SessionEntry>, AgentError> {
    let peer = token.endpoint().map_err(|e| {
        AgentError::InvalidArgument(BadRequest::TokenWithoutEndpoint {
            reason: e.to_string(),
        })
    })?;
    core.sessions
        .get(peer)
        .await
        .map_err(|e| AgentError::fabric("cannot reach the tenant's memory", e))
}

/// A staging buffer held for a tenant: its place in the tenant's share,
/// then the buffer (the buffer goes back to the pool first).
struct Staged {
    buf: StagingBuf,
    _share: StagingPermit,
}

/// Waits for a place in the tenant's share, then for a buffer of the pool.
async fn acquire(core: &Core, tenant: &Tenant) -> Staged {
    let share = tenant.quota.reserve_staging().await;
    Staged {
        buf: core.staging.acquire().await,
        _share: share,
    }
}

/// Which way an operation moves bytes between a staging buffer and the window.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// Staging buffer → window (GET fallback).
    Write,
    /// Window → staging buffer (PUT fallback).
    Read,
}

/// One RDMA operation between the first `n` bytes of `buf` and
/// `remote_addr`, within the session's in-flight bound.
async fn rdma_op(
    entry: &SessionEntry,
    buf: &StagingBuf,
    n: usize,
    op: Op,
    remote_addr: u64,
    rkey: u32,
) -> Result<(), AgentError> {
    let slice = buf
        .slice(n)
        .map_err(|e| AgentError::internal_from("a staging buffer", e))?;
    let _permit = Arc::clone(&entry.ops)
        .acquire_owned()
        .await
        .map_err(|_| AgentError::internal("fabric session closed"))?;
    let res = match op {
        Op::Write => entry.session.write(slice, remote_addr, rkey).await,
        Op::Read => entry.session.read(slice, remote_addr, rkey).await,
    };
    res.map_err(|e| {
        AgentError::fabric(
            match op {
                Op::Write => "writing into the tenant's window failed",
                Op::Read => "reading the tenant's window failed",
            },
            e,
        )
    })
}

/// Streams `body` (exactly `expected` bytes) into the window slice `dest`.
///
/// # Errors
/// A body cut short or a transport error is retryable; a body longer than
/// the slice is a protocol error; fabric failures are final.
pub async fn body_into_window(
    core: &Core,
    tenant: &Tenant,
    mut body: Incoming,
    dest: RdmaToken,
    expected: u64,
) -> Result<(), Attempt> {
    if expected > u64::from(dest.size) {
        return Err(Attempt::Fatal(AgentError::internal(format!(
            "fallback of {expected} bytes into a {}-byte slice",
            dest.size
        ))));
    }
    let entry = if expected > 0 {
        Some(session_for(core, &dest).await?)
    } else {
        None
    };
    let buf_size = core.staging.buf_size();
    let mut placed = 0u64; // bytes posted to the window
    let mut cur: Option<(Staged, usize)> = None;
    let mut inflight = FuturesUnordered::new();

    let post = |staged: Staged, n: usize, at: u64| {
        let entry = entry.clone();
        async move {
            let Some(entry) = entry else {
                return Ok(());
            };
            // `staged` returns to the pool only after the write completed.
            rdma_op(&entry, &staged.buf, n, Op::Write, dest.addr + at, dest.rkey).await
        }
    };

    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            Attempt::Retry(
                AgentError::unavailable(format!("reading the object body failed: {e}")),
                "body",
            )
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let mut data: &[u8] = &data;
        while !data.is_empty() {
            let filled = cur.as_ref().map_or(0, |(_, f)| *f) as u64;
            if placed + filled + data.len() as u64 > expected {
                return Err(Attempt::Fatal(AgentError::Protocol(
                    BadReply::TooManyBytes { expected },
                )));
            }
            if cur.is_none() {
                // Writes already posted complete (and give their buffers
                // back) while this waits: a transfer never waits on
                // buffers that only it could free.
                let next = acquire(core, tenant);
                tokio::pin!(next);
                let staged = loop {
                    tokio::select! {
                        s = &mut next => break s,
                        Some(r) = inflight.next(), if !inflight.is_empty() => r?,
                    }
                };
                cur = Some((staged, 0));
            }
            let Some((staged, filled)) = cur.as_mut() else {
                continue;
            };
            let buf = &staged.buf;
            let n = (buf_size - *filled).min(data.len());
            buf.copy_in(*filled, &data[..n])
                .map_err(|e| AgentError::internal_from("a staging buffer", e))?;
            *filled += n;
            data = &data[n..];
            if *filled == buf_size
                && let Some((buf, n)) = cur.take()
            {
                inflight.push(post(buf, n, placed));
                placed += n as u64;
                while inflight.len() >= PIPELINE {
                    if let Some(r) = inflight.next().await {
                        r?;
                    }
                }
            }
        }
    }
    if let Some((buf, n)) = cur.take()
        && n > 0
    {
        inflight.push(post(buf, n, placed));
        placed += n as u64;
    }
    while let Some(r) = inflight.next().await {
        r?;
    }
    if placed != expected {
        return Err(Attempt::Retry(
            AgentError::unavailable(format!(
                "the object body ended after {placed} of {expected} bytes"
            )),
            "body",
        ));
    }
    Ok(())
}

/// Where [`window_body`] reports why it stopped early (a fabric failure is
/// final; the HTTP error the aborted body causes is not the real cause).
pub type BodyFailure = Arc<std::sync::Mutex<Option<AgentError>>>;

/// An HTTP body of the `len` bytes of the window slice `src`, read through
/// staging buffers (one read ahead of the sender).
pub fn window_body(
    core: &Arc<Core>,
    tenant: &Arc<Tenant>,
    src: RdmaToken,
    len: u64,
) -> ((RequestBody, u64), BodyFailure) {
    let failure: BodyFailure = Arc::default();
    let report = Arc::clone(&failure);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BodyError>>(2);
    let core = Arc::clone(core);
    let tenant = Arc::clone(tenant);
    tokio::spawn(async move {
        let res = async {
            if len == 0 {
                return Ok(());
            }
            let entry = session_for(&core, &src).await?;
            let buf_size = core.staging.buf_size() as u64;
            let mut off = 0u64;
            while off < len {
                let n = buf_size.min(len - off) as usize;
                let staged = acquire(&core, &tenant).await;
                rdma_op(&entry, &staged.buf, n, Op::Read, src.addr + off, src.rkey).await?;
                let bytes = staged
                    .buf
                    .to_vec(n)
                    .map_err(|e| AgentError::internal_from("a staging buffer", e))?;
                drop(staged);
                if tx.send(Ok(Frame::data(Bytes::from(bytes)))).await.is_err() {
                    return Ok(()); // the request was dropped
                }
                off += n as u64;
            }
            Ok::<(), AgentError>(())
        }
        .await;
        if let Err(e) = res {
            *report
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e.clone());
            let _ = tx.send(Err(Box::new(e) as BodyError)).await;
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    ((StreamBody::new(stream).boxed_unsync(), len), failure)
}
