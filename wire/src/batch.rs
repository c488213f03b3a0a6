//! The s3dma batch request: many small HEADs, GETs and PUTs as ONE signed
//! S3 request to a target that speaks s3dma's dialect (a storage-target),
//! each GET or PUT item with its own `x-amz-rdma-token` window.
//!
//! # Request
//!
//! `POST /?s3dma-batch` ([`PATH_AND_QUERY`]), SigV4-signed, with
//! * `x-amz-rdma-protocol: s3dma-v1` (signed, as on every s3dma request);
//! * `x-amz-content-sha256: <hex SHA-256 of the body>`: the body (and so
//!   every item's key and token) is covered by the signature; a target
//!   refuses `UNSIGNED-PAYLOAD`, streaming payloads and presigned URLs;
//! * `Content-Type: application/json` ([`CONTENT_TYPE`]) and a
//!   `Content-Length` of at most the target's cap (hard cap [`MAX_BODY`]).
//!
//! The body is a JSON object ([`BatchRequest`]):
//!
//! ```json
//! {"version": 1, "items": [
//!   {"op": "HEAD", "bucket": "b", "key": "k1"},
//!   {"op": "GET",  "bucket": "b", "key": "k2", "range": "0-4095", "token": "<81 hex>"},
//!   {"op": "PUT",  "bucket": "b", "key": "k3", "token": "<81 hex>",
//!    "content_type": "text/plain", "metadata": {"a": "1"}}
//! ]}
//! ```
//!
//! `range` (GET only) is [`ByteRange`] syntax without `bytes=`; `if_match`
//! (GET, HEAD) is an ETag. A GET places the object (or range) at the start
//! of its window; a PUT stores exactly its window's bytes (its size is the
//! object's), and only whole. Unknown fields are refused.
//!
//! # Reply
//!
//! A target that serves batches answers every batch it parsed `200` with
//! `x-amz-rdma-batch: s3dma-v1` ([`REPLY_HEADER`]) and a JSON body
//! ([`BatchReply`]): one [`ItemReply`] per item, in request order, each
//! with the status the single request would have had (`200`, `206`, `404`,
//! `403`, ...), and, on success, the object's size, ETag, last-modified
//! time, content type and metadata (HEAD, GET) or the bytes placed (GET) or
//! stored (PUT); on failure the S3 error code and message. A failed item
//! fails alone.
//!
//! A refusal of the whole batch (not signed as required, too many items,
//! too large a body, bad JSON) is an S3 error reply carrying the reply
//! header. A target that does not serve batches (the gateway, a plain S3
//! server) answers `501` (or any error without the reply header): the
//! client sends the items as single requests.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::range::ByteRange;
use crate::token::RdmaToken;

/// The query marker of a batch request (`POST /?s3dma-batch`).
pub const QUERY: &str = "s3dma-batch";
/// The path and query of a batch request.
pub const PATH_AND_QUERY: &str = "/?s3dma-batch";
/// The reply header a target that served (or refused) a batch sets.
pub const REPLY_HEADER: &str = "x-amz-rdma-batch";
/// [`REPLY_HEADER`]'s value.
pub const REPLY_VALUE: &str = "s3dma-v1";
/// The body's content type (request and reply).
pub const CONTENT_TYPE: &str = "application/json";
/// The format's version.
pub const VERSION: u32 = 1;
/// The most items any batch may carry (a target's cap is at most this).
pub const MAX_ITEMS: usize = 10_000;
/// The largest request body any batch may have (a target's cap is at most
/// this).
pub const MAX_BODY: usize = 8 << 20;
/// The largest reply body a client reads.
pub const MAX_REPLY_BODY: usize = 32 << 20;
/// The longest key (S3's limit, bytes).
pub const MAX_KEY: usize = 1024;
/// The longest bucket name.
pub const MAX_BUCKET: usize = 63;
/// The longest token, range, ETag or content type text an item may carry.
pub const MAX_FIELD: usize = 256;
/// The most user-metadata bytes (names and values) a PUT item may carry
/// (S3's 2 KiB).
pub const MAX_METADATA: usize = 2048;

/// An item's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Op {
    /// HeadObject.
    #[serde(rename = "HEAD")]
    Head,
    /// GetObject into the item's window.
    #[serde(rename = "GET")]
    Get,
    /// PutObject of the item's window.
    #[serde(rename = "PUT")]
    Put,
}

impl Op {
    /// The S3 operation's name (`HeadObject`, `GetObject`, `PutObject`).
    #[must_use]
    pub fn s3_name(self) -> &'static str {
        match self {
            Op::Head => "HeadObject",
            Op::Get => "GetObject",
            Op::Put => "PutObject",
        }
    }
}

/// One item of a batch request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Item {
    /// The operation.
    pub op: Op,
    /// The bucket.
    pub bucket: String,
    /// The key.
    pub key: String,
    /// GET: the range ([`ByteRange`] syntax, no `bytes=`); absent: whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<String>,
    /// GET, PUT: the window's `x-amz-rdma-token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// GET, HEAD: `If-Match`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_match: Option<String>,
    /// PUT: the Content-Type to store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// PUT: user metadata (names without `x-amz-meta-`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// Why one item cannot be served as written (the batch's other items are).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ItemError {
    /// The bucket name is empty or too long.
    #[error("the bucket name must be 1 to {MAX_BUCKET} bytes")]
    Bucket,
    /// The key is empty or too long.
    #[error("the key must be 1 to {MAX_KEY} bytes")]
    Key,
    /// A GET or PUT item without a token, or a HEAD with one.
    #[error("a GET or PUT item needs its window's token; a HEAD item has none")]
    Token,
    /// The token does not parse.
    #[error("the item's x-amz-rdma-token is invalid: {0}")]
    BadToken(String),
    /// A field the item's operation does not take.
    #[error("`{0}` is not a field of a {1:?} item")]
    Field(&'static str, Op),
    /// The range does not parse.
    #[error("the item's range is invalid: {0}")]
    Range(String),
    /// A field longer than [`MAX_FIELD`].
    #[error("`{0}` is longer than {MAX_FIELD} bytes")]
    TooLong(&'static str),
    /// The metadata is over [`MAX_METADATA`] or has a bad name or value.
    #[error(
        "the metadata must be at most {MAX_METADATA} bytes with names of letters, digits, '-' and '_' and printable values"
    )]
    Metadata,
}

impl ItemError {
    /// The S3 error code the item's reply carries.
    #[must_use]
    pub fn s3_code(&self) -> &'static str {
        match self {
            ItemError::Bucket => "InvalidBucketName",
            ItemError::Key => "KeyTooLongError",
            ItemError::BadToken(_) => "InvalidRDMAToken",
            ItemError::Range(_) => "InvalidRange",
            ItemError::Metadata => "MetadataTooLarge",
            ItemError::Token | ItemError::Field(..) | ItemError::TooLong(_) => "InvalidRequest",
        }
    }
}

/// What a checked item asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The window (GET, PUT).
    pub token: Option<RdmaToken>,
    /// The range (GET).
    pub range: Option<ByteRange>,
}

impl Item {
    /// A HEAD item.
    #[must_use]
    pub fn head(bucket: &str, key: &str) -> Item {
        Item::new(Op::Head, bucket, key, None)
    }

    /// A GET item of the whole object into `token`'s window.
    #[must_use]
    pub fn get(bucket: &str, key: &str, token: &str) -> Item {
        Item::new(Op::Get, bucket, key, Some(token))
    }

    /// A PUT item of `token`'s window.
    #[must_use]
    pub fn put(bucket: &str, key: &str, token: &str) -> Item {
        Item::new(Op::Put, bucket, key, Some(token))
    }

    fn new(op: Op, bucket: &str, key: &str, token: Option<&str>) -> Item {
        Item {
            op,
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            range: None,
            token: token.map(str::to_owned),
            if_match: None,
            content_type: None,
            metadata: BTreeMap::new(),
        }
    }

    /// The bytes the item may move (its window's size; 0 for a HEAD or a
    /// token that does not parse, which moves nothing).
    #[must_use]
    pub fn window_bytes(&self) -> u64 {
        self.token
            .as_deref()
            .and_then(|t| RdmaToken::parse(t).ok())
            .map_or(0, |t| u64::from(t.size))
    }

    /// Checks the item on its own: names, the fields its operation takes,
    /// the token and the range.
    ///
    /// # Errors
    /// [`ItemError`]: this item is answered with it; the others run.
    pub fn check(&self) -> Result<Checked, ItemError> {
        if self.bucket.is_empty() || self.bucket.len() > MAX_BUCKET {
            return Err(ItemError::Bucket);
        }
        if self.key.is_empty() || self.key.len() > MAX_KEY {
            return Err(ItemError::Key);
        }
        for (name, v) in [
            ("range", &self.range),
            ("token", &self.token),
            ("if_match", &self.if_match),
            ("content_type", &self.content_type),
        ] {
            if v.as_ref().is_some_and(|v| v.len() > MAX_FIELD) {
                return Err(ItemError::TooLong(name));
            }
        }
        let op = self.op;
        if self.range.is_some() && op != Op::Get {
            return Err(ItemError::Field("range", op));
        }
        if self.if_match.is_some() && op == Op::Put {
            return Err(ItemError::Field("if_match", op));
        }
        if op != Op::Put && (self.content_type.is_some() || !self.metadata.is_empty()) {
            let name = if self.content_type.is_some() {
                "content_type"
            } else {
                "metadata"
            };
            return Err(ItemError::Field(name, op));
        }
        if !metadata_ok(&self.metadata) {
            return Err(ItemError::Metadata);
        }
        let token = match (op, self.token.as_deref()) {
            (Op::Head, None) => None,
            (Op::Get | Op::Put, Some(t)) => {
                Some(RdmaToken::parse(t).map_err(|e| ItemError::BadToken(e.to_string()))?)
            }
            _ => return Err(ItemError::Token),
        };
        let range = self
            .range
            .as_deref()
            .map(|r| {
                r.parse::<ByteRange>()
                    .map_err(|e| ItemError::Range(e.to_string()))
            })
            .transpose()?;
        Ok(Checked { token, range })
    }
}

fn metadata_ok(m: &BTreeMap<String, String>) -> bool {
    let mut total = 0usize;
    for (k, v) in m {
        total = total.saturating_add(k.len()).saturating_add(v.len());
        let name_ok = !k.is_empty()
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        let value_ok = v.bytes().all(|b| (0x20..0x7f).contains(&b));
        if !name_ok || !value_ok {
            return false;
        }
    }
    total <= MAX_METADATA
}

/// A batch request's body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// [`VERSION`].
    pub version: u32,
    /// The items, at least one.
    pub items: Vec<Item>,
}

/// What a reader of batches accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most items (at most [`MAX_ITEMS`]).
    pub max_items: usize,
    /// The largest body (at most [`MAX_BODY`] for a request).
    pub max_body: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_items: MAX_ITEMS,
            max_body: MAX_BODY,
        }
    }
}

/// Why a whole batch (request or reply) cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// The body is larger than allowed.
    #[error("the batch body is {len} bytes; at most {max} are accepted")]
    TooLarge {
        /// Its length (or the declared one).
        len: usize,
        /// The cap.
        max: usize,
    },
    /// More items than allowed.
    #[error("the batch has {items} items; at most {max} are accepted")]
    TooManyItems {
        /// How many.
        items: usize,
        /// The cap.
        max: usize,
    },
    /// No items.
    #[error("the batch has no items")]
    Empty,
    /// Not this format's version.
    #[error("batch version {0} is not spoken here (version {VERSION} is)")]
    Version(u32),
    /// Not JSON of this format.
    #[error("the batch body is not a valid s3dma batch: {0}")]
    Malformed(String),
    /// A reply with another number of items than the request had.
    #[error("the batch reply has {got} items for {sent} sent")]
    ItemCount {
        /// Items sent.
        sent: usize,
        /// Items in the reply.
        got: usize,
    },
    /// A reply item whose status is not an HTTP status.
    #[error("a batch reply item has status {0}")]
    Status(u16),
}

impl BatchError {
    /// The S3 error code a target answers a refused batch with.
    #[must_use]
    pub fn s3_code(&self) -> &'static str {
        match self {
            BatchError::TooLarge { .. } | BatchError::TooManyItems { .. } => "EntityTooLarge",
            _ => "MalformedBatch",
        }
    }

    /// The HTTP status of that answer.
    #[must_use]
    pub fn http_status(&self) -> u16 {
        match self {
            BatchError::TooLarge { .. } | BatchError::TooManyItems { .. } => 413,
            _ => 400,
        }
    }
}

fn malformed(e: &serde_json::Error) -> BatchError {
    BatchError::Malformed(e.to_string())
}

impl BatchRequest {
    /// A request of `items`.
    #[must_use]
    pub fn new(items: Vec<Item>) -> BatchRequest {
        BatchRequest {
            version: VERSION,
            items,
        }
    }

    /// The body.
    ///
    /// # Errors
    /// [`BatchError::Malformed`] if it cannot be written (it always can).
    pub fn encode(&self) -> Result<Vec<u8>, BatchError> {
        serde_json::to_vec(self).map_err(|e| malformed(&e))
    }

    /// Reads a request body within `limits` (the items are checked one by
    /// one later, [`Item::check`]).
    ///
    /// # Errors
    /// [`BatchError`]: the whole batch is refused.
    pub fn parse(body: &[u8], limits: Limits) -> Result<BatchRequest, BatchError> {
        let max_body = limits.max_body.min(MAX_BODY);
        if body.len() > max_body {
            return Err(BatchError::TooLarge {
                len: body.len(),
                max: max_body,
            });
        }
        let r: BatchRequest = serde_json::from_slice(body).map_err(|e| malformed(&e))?;
        if r.version != VERSION {
            return Err(BatchError::Version(r.version));
        }
        let max = limits.max_items.min(MAX_ITEMS);
        if r.items.len() > max {
            return Err(BatchError::TooManyItems {
                items: r.items.len(),
                max,
            });
        }
        if r.items.is_empty() {
            return Err(BatchError::Empty);
        }
        Ok(r)
    }
}

/// One item's outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemReply {
    /// The status the single request would have had.
    pub status: u16,
    /// HEAD, GET: the object's size; PUT: the stored size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The ETag, with its quotes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// HEAD, GET: Last-Modified, in ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_modified_ms: Option<i64>,
    /// HEAD, GET: the Content-Type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// HEAD, GET: user metadata.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// GET: the bytes placed in the window; PUT: the bytes stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// A failure's S3 error code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// A failure's message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl ItemReply {
    /// A failure with `status`, `code` and `message`.
    #[must_use]
    pub fn error(status: u16, code: &str, message: impl Into<String>) -> ItemReply {
        ItemReply {
            status,
            code: Some(code.to_owned()),
            message: Some(message.into()),
            ..ItemReply::default()
        }
    }

    /// Whether the item succeeded (2xx).
    #[must_use]
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// A batch reply's body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchReply {
    /// [`VERSION`].
    pub version: u32,
    /// One per request item, in its order.
    pub items: Vec<ItemReply>,
}

impl BatchReply {
    /// A reply of `items`.
    #[must_use]
    pub fn new(items: Vec<ItemReply>) -> BatchReply {
        BatchReply {
            version: VERSION,
            items,
        }
    }

    /// The body.
    ///
    /// # Errors
    /// [`BatchError::Malformed`] if it cannot be written (it always can).
    pub fn encode(&self) -> Result<Vec<u8>, BatchError> {
        serde_json::to_vec(self).map_err(|e| malformed(&e))
    }

    /// Reads the reply to a request of `sent` items.
    ///
    /// # Errors
    /// [`BatchError`]: the reply is not one to that request.
    pub fn parse(body: &[u8], sent: usize) -> Result<BatchReply, BatchError> {
        if body.len() > MAX_REPLY_BODY {
            return Err(BatchError::TooLarge {
                len: body.len(),
                max: MAX_REPLY_BODY,
            });
        }
        let r: BatchReply = serde_json::from_slice(body).map_err(|e| malformed(&e))?;
        if r.version != VERSION {
            return Err(BatchError::Version(r.version));
        }
        if r.items.len() != sent {
            return Err(BatchError::ItemCount {
                sent,
                got: r.items.len(),
            });
        }
        if let Some(bad) = r.items.iter().find(|i| !(100..600).contains(&i.status)) {
            return Err(BatchError::Status(bad.status));
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TOKEN: &str =
        "00007f0000001000:00001000:00000001:0000:000001:1:00000000000000000000ffff7f000001";

    fn sample() -> BatchRequest {
        let mut get = Item::get("b", "k2", TOKEN);
        get.range = Some("0-4095".into());
        let mut put = Item::put("b", "k3", TOKEN);
        put.content_type = Some("text/plain".into());
        put.metadata.insert("a".into(), "1".into());
        BatchRequest::new(vec![Item::head("b", "k1"), get, put])
    }

    #[test]
    fn request_round_trips_and_reads_as_documented() {
        let r = sample();
        let body = r.encode().unwrap();
        assert_eq!(BatchRequest::parse(&body, Limits::default()).unwrap(), r);
        let text = String::from_utf8(body).unwrap();
        assert!(text.starts_with(r#"{"version":1,"items":[{"op":"HEAD","bucket":"b","key":"k1"}"#));
        let doc = br#"{"version": 1, "items": [{"op": "GET", "bucket": "b", "key": "k", "range": "-10", "token": "t"}]}"#;
        let r = BatchRequest::parse(doc, Limits::default()).unwrap();
        assert_eq!(r.items[0].op, Op::Get);
        assert_eq!(r.items[0].range.as_deref(), Some("-10"));
    }

    #[test]
    fn whole_batch_refusals() {
        let body = sample().encode().unwrap();
        let small = Limits {
            max_items: 2,
            max_body: MAX_BODY,
        };
        assert_eq!(
            BatchRequest::parse(&body, small),
            Err(BatchError::TooManyItems { items: 3, max: 2 })
        );
        let tiny = Limits {
            max_items: 10,
            max_body: 10,
        };
        let e = BatchRequest::parse(&body, tiny).unwrap_err();
        assert!(matches!(e, BatchError::TooLarge { max: 10, .. }), "{e}");
        assert_eq!((e.s3_code(), e.http_status()), ("EntityTooLarge", 413));
        // A cap above the format's own is the format's.
        let huge = Limits {
            max_items: usize::MAX,
            max_body: usize::MAX,
        };
        let big = vec![b' '; MAX_BODY + 1];
        assert!(matches!(
            BatchRequest::parse(&big, huge),
            Err(BatchError::TooLarge { max: MAX_BODY, .. })
        ));
        for (bad, what) in [
            (&br#"{"version":1,"items":[]}"#[..], BatchError::Empty),
            (br#"{"version":2,"items":[]}"#, BatchError::Version(2)),
        ] {
            assert_eq!(BatchRequest::parse(bad, Limits::default()), Err(what));
        }
        for bad in [
            &b""[..],
            b"null",
            b"[]",
            b"{}",
            br#"{"version":1}"#,
            br#"{"version":1,"items":[{"op":"DELETE","bucket":"b","key":"k"}]}"#,
            br#"{"version":1,"items":[{"op":"HEAD","bucket":"b","key":"k","extra":1}]}"#,
            br#"{"version":1,"items":[{"op":"HEAD","bucket":"b"}]}"#,
            br#"{"version":1,"items":[{"op":"HEAD","bucket":"b","key":7}]}"#,
            br#"{"version":1,"items":[],"more":true}"#,
            b"\xff\xfe",
        ] {
            let e = BatchRequest::parse(bad, Limits::default()).unwrap_err();
            assert!(matches!(e, BatchError::Malformed(_)), "{e}");
            assert_eq!((e.s3_code(), e.http_status()), ("MalformedBatch", 400));
        }
    }

    #[test]
    fn truncations_are_refused() {
        let body = sample().encode().unwrap();
        for n in 0..body.len() {
            assert!(
                BatchRequest::parse(&body[..n], Limits::default()).is_err(),
                "{n}"
            );
        }
    }

    #[test]
    fn item_checks() {
        let ok = sample();
        let c: Vec<_> = ok.items.iter().map(|i| i.check().unwrap()).collect();
        assert!(c[0].token.is_none());
        assert_eq!(
            c[1].range,
            Some(ByteRange::Bounded {
                first: 0,
                last: 4095
            })
        );
        assert_eq!(ok.items[1].window_bytes(), 0x1000);
        assert_eq!(ok.items[0].window_bytes(), 0);
        let bad = |f: &dyn Fn(&mut Item), base: Item| {
            let mut i = base;
            f(&mut i);
            i.check().unwrap_err()
        };
        let head = || Item::head("b", "k");
        let get = || Item::get("b", "k", TOKEN);
        assert_eq!(bad(&|i| i.bucket.clear(), head()), ItemError::Bucket);
        assert_eq!(bad(&|i| i.key = "k".repeat(1025), head()), ItemError::Key);
        assert_eq!(bad(&|i| i.key.clear(), head()), ItemError::Key);
        assert_eq!(bad(&|i| i.token = None, get()), ItemError::Token);
        assert_eq!(
            bad(&|i| i.token = Some(TOKEN.into()), head()),
            ItemError::Token
        );
        let e = bad(&|i| i.token = Some("zz".into()), get());
        assert!(matches!(e, ItemError::BadToken(_)));
        assert_eq!(e.s3_code(), "InvalidRDMAToken");
        assert_eq!(
            bad(&|i| i.range = Some("0-1".into()), head()),
            ItemError::Field("range", Op::Head)
        );
        assert!(matches!(
            bad(&|i| i.range = Some("9-1".into()), get()),
            ItemError::Range(_)
        ));
        assert_eq!(
            bad(&|i| i.content_type = Some("x".into()), get()),
            ItemError::Field("content_type", Op::Get)
        );
        assert_eq!(
            bad(
                &|i| i.if_match = Some("x".into()),
                Item::put("b", "k", TOKEN)
            ),
            ItemError::Field("if_match", Op::Put)
        );
        assert_eq!(
            bad(&|i| i.token = Some("t".repeat(257)), get()),
            ItemError::TooLong("token")
        );
        let put = || Item::put("b", "k", TOKEN);
        for (k, v) in [
            ("a b", "1"),
            ("", "1"),
            ("a", "\n"),
            ("a", &"v".repeat(2048)),
        ] {
            let e = bad(
                &|i| {
                    i.metadata.insert(k.into(), v.into());
                },
                put(),
            );
            assert_eq!(e, ItemError::Metadata);
        }
    }

    #[test]
    fn replies() {
        let items = vec![
            ItemReply {
                status: 200,
                size: Some(5),
                etag: Some("\"e\"".into()),
                bytes: Some(5),
                ..ItemReply::default()
            },
            ItemReply::error(404, "NoSuchKey", "The specified key does not exist."),
        ];
        let r = BatchReply::new(items);
        let body = r.encode().unwrap();
        assert_eq!(BatchReply::parse(&body, 2).unwrap(), r);
        assert!(r.items[0].ok() && !r.items[1].ok());
        assert_eq!(
            BatchReply::parse(&body, 3),
            Err(BatchError::ItemCount { sent: 3, got: 2 })
        );
        assert_eq!(
            BatchReply::parse(br#"{"version":1,"items":[{"status":7}]}"#, 1),
            Err(BatchError::Status(7))
        );
        for n in 0..body.len() {
            assert!(BatchReply::parse(&body[..n], 2).is_err());
        }
        let big = vec![b' '; MAX_REPLY_BODY + 1];
        assert!(matches!(
            BatchReply::parse(&big, 1),
            Err(BatchError::TooLarge { .. })
        ));
    }

    proptest! {
        #[test]
        fn garbage_never_panics(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = BatchRequest::parse(&body, Limits::default());
            let _ = BatchReply::parse(&body, 1);
        }

        #[test]
        fn mutated_bodies_never_panic(at in 0usize..400, byte in any::<u8>()) {
            let mut body = sample().encode().unwrap();
            let n = body.len();
            body[at % n] = byte;
            if let Ok(r) = BatchRequest::parse(&body, Limits::default()) {
                for i in &r.items {
                    let _ = i.check();
                }
            }
        }
    }
}
