//! The options and results of [`Client`](crate::Client)'s calls, and how
//! it connects ([`ClientOptions`]).

use std::collections::HashMap;
use std::fmt;

use s3dma_proto::agent::v1 as agent;

use crate::{ByteRange, ListedObject, ObjectInfo};
#[cfg(doc)]
use crate::{Client, ErrorKind, resolve_uid};

/// Options of [`Client::get_object_into`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GetOptions {
    /// Part of the object to read (`None` = all of it).
    pub range: Option<ByteRange>,
    /// Bytes of the buffer, from the offset, the bytes may fill (`None` = to
    /// the end of the buffer). The object or range must fit.
    pub length: Option<u64>,
    /// Fail with [`ErrorKind::PreconditionFailed`] unless the object's ETag
    /// is this one (with its quotes, as S3 returns it).
    pub if_match: Option<String>,
}

/// What a GET did.
#[derive(Debug, Clone, PartialEq)]
pub struct GetOutput {
    /// The object (its full size, ETag, metadata).
    pub object: ObjectInfo,
    /// Bytes placed at the requested buffer offset.
    pub bytes_placed: u64,
    /// Offset in the object of the first placed byte.
    pub range_start: u64,
    /// How the bytes moved.
    pub path: TransferPath,
    /// The dpu-agent's request id.
    pub request_id: String,
}

/// Options of [`Client::put_object_from`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutOptions {
    /// Content-Type to store (`None` = none).
    pub content_type: Option<String>,
    /// User metadata (names without the `x-amz-meta-` prefix).
    pub metadata: HashMap<String, String>,
}

/// What a PUT did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutOutput {
    /// The new object's ETag, with quotes.
    pub etag: String,
    /// Its size.
    pub size: u64,
    /// How the bytes moved.
    pub path: TransferPath,
    /// Parts, when stored as a multipart upload (0 = a single PUT).
    pub parts: u32,
    /// The dpu-agent's request id.
    pub request_id: String,
}

/// How a transfer's bytes moved between the storage target and the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransferPath {
    /// Not reported.
    Unspecified,
    /// The target moved the bytes with RDMA; nothing crossed the agent.
    Rdma,
    /// The target spoke plain HTTP; the agent moved the bytes with RDMA.
    Fallback,
    /// Some chunks each way.
    Mixed,
}

impl TransferPath {
    /// `"rdma"`, `"fallback"`, `"mixed"` or `"unspecified"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            TransferPath::Unspecified => "unspecified",
            TransferPath::Rdma => "rdma",
            TransferPath::Fallback => "fallback",
            TransferPath::Mixed => "mixed",
        }
    }

    pub(crate) fn from_proto(v: i32) -> TransferPath {
        match agent::TransferPath::try_from(v) {
            Ok(agent::TransferPath::Rdma) => TransferPath::Rdma,
            Ok(agent::TransferPath::Fallback) => TransferPath::Fallback,
            Ok(agent::TransferPath::Mixed) => TransferPath::Mixed,
            _ => TransferPath::Unspecified,
        }
    }
}

impl fmt::Display for TransferPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Options of [`Client::list`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOptions {
    /// Only keys starting with this.
    pub prefix: Option<String>,
    /// Group keys sharing a prefix up to this delimiter into
    /// [`ListPage::common_prefixes`].
    pub delimiter: Option<String>,
    /// A previous page's [`ListPage::next_continuation_token`].
    pub continuation_token: Option<String>,
    /// Page size (`None` = 1000, the most).
    pub max_keys: Option<u32>,
    /// List keys after this one (first page only).
    pub start_after: Option<String>,
}

/// One page of a listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListPage {
    /// The objects, in key order.
    pub objects: Vec<ListedObject>,
    /// Prefixes grouped by the delimiter.
    pub common_prefixes: Vec<String>,
    /// Pass this back (in [`ListOptions::continuation_token`]) for the next
    /// page; `None` on the last page.
    pub next_continuation_token: Option<String>,
    /// Whether more pages follow.
    pub is_truncated: bool,
    /// The dpu-agent's request id.
    pub request_id: String,
}

/// One object of a [`Client::get_objects`] batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GetItem {
    /// Bucket.
    pub bucket: String,
    /// Key.
    pub key: String,
    /// Part of the object (`None` = all of it).
    pub range: Option<ByteRange>,
    /// Where in the buffer its bytes go.
    pub offset: usize,
    /// Bytes of the buffer it may fill (`None` = to the end of the buffer).
    pub length: Option<u64>,
    /// Fail the item with `PreconditionFailed` unless the object's ETag is
    /// this one (`None` = any version).
    pub if_match: Option<String>,
}

/// One object of a [`Client::put_objects`] batch: `buf[offset..offset +
/// length]` written as `bucket/key`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutItem {
    /// Bucket.
    pub bucket: String,
    /// Key.
    pub key: String,
    /// Where in the buffer its bytes start.
    pub offset: usize,
    /// Its size (0 = an empty object).
    pub length: usize,
    /// Content type and user metadata.
    pub opts: PutOptions,
}

/// How [`Client::connect_with`] connects.
///
/// ```
/// let opts = s3dma_client::ClientOptions::new().with_shim_uid(1001);
/// assert_eq!(opts.shim_uid, Some(1001));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientOptions {
    /// The uid the shim must run as, besides root (see the crate docs,
    /// "Who serves the socket"). `None`: `$S3DMA_SHIM_UID` (a uid or a user
    /// name) when set, else the caller's own effective uid. Resolve a user
    /// name with [`resolve_uid`].
    pub shim_uid: Option<u32>,
    /// Whether to open a submission ring on the lease (default false) and
    /// send single GETs, PUTs and HEADs through it rather than as gRPC
    /// calls: no gRPC message and reply per object, the same checks at the
    /// shim. A ring's answers carry an object's size, ETag and
    /// Last-Modified but no content type or user metadata, so with it on
    /// [`crate::Client::head`] and `get_object_into` return those empty;
    /// GETs with `if_match` and PUTs with a content type or metadata still
    /// go over gRPC, and so does every call when the shim refuses a ring
    /// or the ring is full. A ring call dropped before its answer (a
    /// timeout, a cancelled task) is not cancelled at the shim: its entry
    /// runs to its end (at most the shim's request deadline) and may still
    /// place bytes in the buffer it named meanwhile.
    pub ring: bool,
}

impl ClientOptions {
    /// The defaults: see [`ClientOptions::shim_uid`].
    #[must_use]
    pub fn new() -> ClientOptions {
        ClientOptions::default()
    }

    /// Opens a submission ring (see [`ClientOptions::ring`]).
    #[must_use]
    pub fn with_ring(mut self, on: bool) -> ClientOptions {
        self.ring = on;
        self
    }

    /// Trusts a shim running as `uid` (and root).
    #[must_use]
    pub fn with_shim_uid(mut self, uid: u32) -> ClientOptions {
        self.shim_uid = Some(uid);
        self
    }
}
