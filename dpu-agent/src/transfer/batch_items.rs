//! The items of a batch and what they come to: the types
//! [`super::batch`] (grouping, single requests) and
//! [`super::target_batch`] (s3dma batch requests) share, in a leaf module
//! so that neither imports the other's types back.

use std::collections::HashMap;
use std::sync::Arc;

use fabric::RdmaToken;
use s3dma_proto::agent::v1 as pb;
use s3dma_wire::range::ByteRange;
use tokio::sync::Semaphore;

use super::{Core, Tenant, put};
use crate::error::AgentError;
use crate::policy::Access;
use crate::qp_link::QpLink;
use crate::s3::TargetClient;

/// The operation of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// HeadObjects.
    Head,
    /// PutObjects.
    Put,
    /// DeleteObjects.
    Delete,
    /// GetObjects (its small items only: `group_gets` in `batch.rs`).
    Get,
}

impl Op {
    /// The operation's name (metrics, logs).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Op::Head => "HeadObjects",
            Op::Put => "PutObjects",
            Op::Delete => "DeleteObjects",
            Op::Get => "GetObjects",
        }
    }

    pub(super) fn access(self) -> (Access, &'static str) {
        match self {
            Op::Head => (Access::Read, "read"),
            Op::Put => (Access::Write, "write"),
            Op::Delete => (Access::Write, "delete"),
            Op::Get => (Access::Read, "read"),
        }
    }
}

/// What a PUT item writes besides its key.
#[derive(Debug)]
pub struct PutSource {
    /// The source window (the object is exactly its bytes).
    pub src: RdmaToken,
    /// Content-Type to store.
    pub content_type: Option<String>,
    /// User metadata.
    pub metadata: HashMap<String, String>,
    /// The window on the shim's other rails (`src` is rail 0), if any.
    pub rails: Option<Arc<super::rails::RailSet>>,
}

/// What a GET item reads and where it places it.
#[derive(Debug)]
pub struct GetSource {
    /// The destination window (the bytes go to its start).
    pub dest: RdmaToken,
    /// Which bytes (`None`: the whole object).
    pub range: Option<ByteRange>,
    /// Required ETag, if any.
    pub if_match: Option<String>,
    /// The window on the shim's other rails (`dest` is rail 0), if any.
    pub rails: Option<Arc<super::rails::RailSet>>,
    /// The item's range, destination and other rails' destinations as
    /// the tenant sent them (the single request the item falls back to).
    pub sent: (Option<pb::ByteRange>, String, Vec<String>),
}

/// One checked item of a batch.
#[derive(Debug)]
pub struct Item {
    /// The item's place in the request (and so in the results).
    pub index: usize,
    /// Key.
    pub key: String,
    /// PUT only: the bytes and what to store with them.
    pub put: Option<PutSource>,
    /// GET only: which bytes and where they go.
    pub get: Option<GetSource>,
}

/// What an item came to.
#[derive(Debug)]
pub enum Outcome {
    /// HEAD: the object.
    Found(pb::ObjectInfo),
    /// HEAD: no such key (a result, not a failure).
    Missing,
    /// PUT: stored.
    Stored(put::PutResult),
    /// DELETE: deleted (or was already missing, as in S3).
    Deleted,
    /// GET: the bytes placed.
    Got(super::get::GetResult),
}

/// Items of one (target, bucket) group, all of one operation.
#[derive(Debug)]
pub struct Group {
    /// The target every item's first chunk goes to.
    pub target: Arc<TargetClient>,
    /// The bucket.
    pub bucket: String,
    /// The items, in request order.
    pub items: Vec<Item>,
}

/// One batch in progress: what its groups share.
#[derive(Debug)]
pub struct Batch<'a> {
    /// Shared state.
    pub core: &'a Arc<Core>,
    /// The tenant.
    pub tenant: &'a Arc<Tenant>,
    /// The batch's request id (targets see it as `x-s3dma-request-id`;
    /// every item's error carries it).
    pub request_id: &'a str,
    /// The calling shim's `QueuePairs` link (PUT), if it has one open.
    pub qp_link: Option<Arc<QpLink>>,
    /// Items of the batch running at once (at least 1).
    pub concurrency: usize,
    /// Holds `concurrency` permits: one per running item.
    pub limit: Semaphore,
}

/// An item's result: its index and what it came to.
pub type ItemResult = (usize, Result<Outcome, AgentError>);
