//! The `x-amz-rdma-*` HTTP headers: their names, and how the two sides read
//! each other's values (the dpu-agent reads a target's reply, the
//! storage-target writes it).
//!
//! * Request: `x-amz-rdma-token: <token>` (see [`crate::token`]), and,
//!   from an s3dma client speaking s3dma's own exchange (a fabric endpoint
//!   in the token's fields, [`crate::frame`]'s handshake), the signed
//!   marker `x-amz-rdma-protocol: s3dma-v1` ([`S3DMA_PROTOCOL`]). A token
//!   without the marker is a standard one (the cuObject dialect: a DC
//!   target in the client's memory), never taken for an s3dma endpoint.
//! * Reply: `x-amz-rdma-reply: 200|204|206` when the bytes moved by RDMA,
//!   `501` when the target declines RDMA for this request (the caller
//!   sends the bytes over HTTP instead), and
//!   `x-amz-rdma-bytes-transferred: N` on GET and PUT (some servers spell
//!   it `x-amz-rdma-bytes`; a client reads both, [`bytes_transferred_of`]).
//!
//! A reply without `x-amz-rdma-reply` comes from a server that ignored the
//! token: on a PUT it may have stored an empty object, on a GET its body
//! may be empty. A client never takes it for a success.

/// The request header carrying the token.
pub const RDMA_TOKEN: &str = "x-amz-rdma-token";
/// The reply header saying what the target did with the token.
pub const RDMA_REPLY: &str = "x-amz-rdma-reply";
/// The reply header with the bytes the target placed.
pub const RDMA_BYTES: &str = "x-amz-rdma-bytes-transferred";
/// The shorter spelling of [`RDMA_BYTES`] some servers use (NooBaa).
pub const RDMA_BYTES_SHORT: &str = "x-amz-rdma-bytes";
/// The request header naming the token's dialect (signed, like every
/// `x-amz-*` header).
pub const RDMA_PROTOCOL: &str = "x-amz-rdma-protocol";
/// [`RDMA_PROTOCOL`]'s value for s3dma's own exchange.
pub const S3DMA_PROTOCOL: &str = "s3dma-v1";
/// The reply header that says a server does not speak a request's dialect
/// (`unsupported`, with a `501`).
pub const RDMA_PROTOCOL_STATUS: &str = "x-amz-rdma-protocol-status";

/// What a target did with a request's token, read from `x-amz-rdma-reply`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RdmaReply {
    /// The bytes moved by RDMA (`200`, `204` or `206`).
    Placed,
    /// The target declined RDMA for this request (`501`): resend over HTTP.
    Declined,
    /// No header, or a value this protocol does not define: the server
    /// ignored the token (the value, if any, for the log).
    Ignored(Option<String>),
}

impl RdmaReply {
    /// Reads the `x-amz-rdma-reply` value of a reply (`None`: no header).
    pub fn parse(value: Option<&str>) -> RdmaReply {
        match value.map(str::trim) {
            Some("200" | "204" | "206") => RdmaReply::Placed,
            Some("501") => RdmaReply::Declined,
            other => RdmaReply::Ignored(other.map(str::to_owned)),
        }
    }
}

/// Reads `x-amz-rdma-bytes-transferred` (`None`: missing or not a number).
pub fn bytes_transferred(value: Option<&str>) -> Option<u64> {
    let v = value?.trim();
    (!v.is_empty() && v.len() <= 20 && v.bytes().all(|c| c.is_ascii_digit()))
        .then(|| v.parse().ok())
        .flatten()
}

/// The bytes a reply says moved: `x-amz-rdma-bytes-transferred`, else
/// `x-amz-rdma-bytes`; `header` reads one header of the reply.
pub fn bytes_transferred_of<'a>(header: impl Fn(&str) -> Option<&'a str>) -> Option<u64> {
    header(RDMA_BYTES)
        .or_else(|| header(RDMA_BYTES_SHORT))
        .and_then(|v| bytes_transferred(Some(v)))
}

/// The dialect a tokened request speaks, from its `x-amz-rdma-protocol`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dialect {
    /// No marker: a standard token (the cuObject dialect, a DC target).
    Standard,
    /// `s3dma-v1`: s3dma's own exchange with the endpoint the token names.
    S3dma,
    /// A marker naming anything else (for the log): declined with `501`.
    Other(String),
}

impl Dialect {
    /// Reads the marker (`None`: absent).
    pub fn of(value: Option<&str>) -> Dialect {
        match value.map(str::trim) {
            None => Dialect::Standard,
            Some(S3DMA_PROTOCOL) => Dialect::S3dma,
            Some(other) => Dialect::Other(other.to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_reply_values() {
        assert_eq!(RdmaReply::parse(Some("200")), RdmaReply::Placed);
        assert_eq!(RdmaReply::parse(Some("206")), RdmaReply::Placed);
        assert_eq!(RdmaReply::parse(Some("204")), RdmaReply::Placed);
        assert_eq!(RdmaReply::parse(Some("501")), RdmaReply::Declined);
        assert_eq!(RdmaReply::parse(None), RdmaReply::Ignored(None));
        assert_eq!(
            RdmaReply::parse(Some("404")),
            RdmaReply::Ignored(Some("404".into()))
        );
        assert_eq!(bytes_transferred(Some("42")), Some(42));
        assert_eq!(bytes_transferred(Some("-1")), None);
        assert_eq!(bytes_transferred(None), None);
        assert_eq!(bytes_transferred(Some("+4")), None);
        let both = |a: Option<&'static str>, b: Option<&'static str>| {
            bytes_transferred_of(|n| match n {
                RDMA_BYTES => a,
                RDMA_BYTES_SHORT => b,
                _ => None,
            })
        };
        assert_eq!(both(Some("7"), Some("9")), Some(7));
        assert_eq!(both(None, Some("9")), Some(9));
        assert_eq!(both(None, None), None);
        assert_eq!(Dialect::of(None), Dialect::Standard);
        assert_eq!(Dialect::of(Some("s3dma-v1")), Dialect::S3dma);
        assert_eq!(
            Dialect::of(Some("hipobj-rc-v2")),
            Dialect::Other("hipobj-rc-v2".into())
        );
    }
}
