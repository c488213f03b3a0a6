//! The seam between the generic GET/PUT loops and a target's dialect:
//! [`ChunkMover`], what the loops hand it ([`Transfer`]) and the token it
//! puts on a request ([`SentToken`]).

use std::sync::Arc;

use fabric::RdmaToken;
use futures::future::BoxFuture;

use crate::error::AgentError;
use crate::s3::client::S3Call;
use crate::transfer::exchange::{Attempt, Exchange};

/// How bytes move between one target and the tenant's window, in the
/// target's dialect. Chosen once per target of a request when it starts
/// ([`super::dialect_for`]); the GET and PUT loops ask it, never which
/// dialect it is.
///
/// A chunk of a GET first goes to [`ChunkMover::get_chunk`]; when that
/// moved nothing, it is a ranged GET carrying [`ChunkMover::token`] (none:
/// the body comes through the agent). A PUT (or part) first goes to
/// [`ChunkMover::put`]; when that moved nothing, it is a PUT carrying the
/// token, and when the target declines that, an HTTP body read from the
/// window.
pub trait ChunkMover: Send + Sync + std::fmt::Debug {
    /// Whether a GET learns the object's size (a HEAD) before it moves any
    /// chunk, instead of probing with its first chunk.
    fn size_first(&self) -> bool {
        false
    }

    /// Whether a chunk or part may go over any of the request's fabric
    /// rails ([`crate::transfer::rails`]): the loops then hand this
    /// dialect the slice of the rail they picked, and redo on another
    /// rail what failed on its rail. `true` (the default) where the slot's
    /// token is all a transfer needs (s3dma's tokens, the agent's own
    /// fallback sessions); `false` keeps every transfer on rail 0.
    fn rails(&self) -> bool {
        true
    }

    /// How long after a GET chunk failed on its rail the rail's window
    /// slice may still be written by that transfer: the chunk is redone on
    /// another rail only once this has passed, so no late write lands over
    /// the redo or in memory the tenant has back. `None` (the default):
    /// nothing can land late (a tcp or RC session fails with its
    /// connection and is reset; a failed hipobj-rc-v2 queue pair is closed
    /// before the redo opens another).
    fn late_writes(&self) -> Option<std::time::Duration> {
        None
    }

    /// The token a ranged GET or a PUT carries for `slot` (`None`, the
    /// default: plain HTTP, the bytes go through the agent).
    ///
    /// # Errors
    /// A header the target's configuration made unsendable.
    fn token<'a>(
        &'a self,
        ex: &'a Exchange,
        slot: &'a RdmaToken,
    ) -> BoxFuture<'a, Result<Option<SentToken>, AgentError>> {
        let _ = (ex, slot);
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Moves one chunk of a GET (`t.offset`: the object's first byte of
    /// it, `t.slot`: its place in the window) outside a ranged GET, the
    /// object's ETag being `etag`. `false`: nothing moved (the dialect
    /// moves chunks by ranged GETs, or the target declined before any byte
    /// moved).
    ///
    /// # Errors
    /// [`Attempt`]: the GET loop retries a retryable one.
    fn get_chunk<'a>(
        &'a self,
        ex: &'a Arc<Exchange>,
        t: &'a Transfer<'a>,
        etag: &'a str,
    ) -> BoxFuture<'a, Result<bool, Attempt>> {
        let _ = (ex, t, etag);
        Box::pin(std::future::ready(Ok(false)))
    }

    /// Moves a PUT's bytes (or an UploadPart's, `t.part`) outside a PUT
    /// request, with its own retries: the stored ETag, or `None` when
    /// nothing moved (the PUT then carries [`ChunkMover::token`]).
    ///
    /// # Errors
    /// Any [`AgentError`].
    fn put<'a>(
        &'a self,
        ex: &'a Arc<Exchange>,
        t: &'a Transfer<'a>,
    ) -> BoxFuture<'a, Result<Option<String>, AgentError>> {
        let _ = (ex, t);
        Box::pin(std::future::ready(Ok(None)))
    }
}

/// What one chunk or part moves.
#[derive(Debug, Clone)]
pub struct Transfer<'a> {
    /// Bucket.
    pub bucket: &'a str,
    /// Key.
    pub key: &'a str,
    /// PUT: `(part number, upload id)` of an UploadPart.
    pub part: Option<(u32, &'a str)>,
    /// GET: the object's first byte.
    pub offset: u64,
    /// The window slice (its size is the transfer's), on the rail the
    /// loops picked.
    pub slot: RdmaToken,
    /// Other rails remain for this chunk or part: a failure naming the
    /// rail ends a dialect's own retries at once, to be redone on another
    /// rail ([`Exchange::retrying_on_rail`]).
    pub fast: bool,
}

/// The token an object request carries to its target, in the target's
/// dialect: s3dma's (the window slice's own token, with the signed
/// `x-amz-rdma-protocol: s3dma-v1`), or a standard (cuObject) token the
/// calling shim minted for exactly the slice, naming its DC target (no
/// marker, under the target's `token_header`).
#[derive(Debug, Clone)]
pub struct SentToken {
    header: http::HeaderName,
    value: http::HeaderValue,
    marker: bool,
}

impl SentToken {
    /// `text` under `ex`'s target's token header (`marker`: with the
    /// signed `x-amz-rdma-protocol: s3dma-v1`).
    ///
    /// # Errors
    /// A header name or value the target's configuration made unsendable.
    pub fn new(ex: &Exchange, text: &str, marker: bool) -> Result<SentToken, AgentError> {
        let header = http::HeaderName::from_bytes(ex.target.token_header.as_bytes())
            .map_err(|e| AgentError::internal_from("the token header name", e))?;
        let value = http::HeaderValue::from_str(text)
            .map_err(|e| AgentError::internal_from("the RDMA token", e))?;
        Ok(SentToken {
            header,
            value,
            marker,
        })
    }

    /// Adds the token (and the marker, for s3dma's dialect) to `call`.
    pub fn apply(&self, call: &mut S3Call) {
        call.headers.insert(self.header.clone(), self.value.clone());
        if self.marker {
            call.headers.insert(
                http::HeaderName::from_static(s3dma_wire::headers::RDMA_PROTOCOL),
                http::HeaderValue::from_static(s3dma_wire::headers::S3DMA_PROTOCOL),
            );
        }
    }
}
