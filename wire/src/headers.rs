//! The `x-amz-rdma-*` HTTP headers: their names, and how the two sides read
//! each other's values (the dpu-agent reads a target's reply, the
//! storage-target writes it).
//!
//! * Request: `x-amz-rdma-token: <token>` (see [`crate::token`]).
//! * Reply: `x-amz-rdma-reply: 200|204|206` when the bytes moved by RDMA,
//!   `501` when the target declines RDMA for this request (the caller
//!   sends the bytes over HTTP instead), and
//!   `x-amz-rdma-bytes-transferred: N` on a GET.
//!
//! A reply without `x-amz-rdma-reply` comes from a server that ignored the
//! token: on a PUT it may have stored an empty object.

/// The request header carrying the token.
pub const RDMA_TOKEN: &str = "x-amz-rdma-token";
/// The reply header saying what the target did with the token.
pub const RDMA_REPLY: &str = "x-amz-rdma-reply";
/// The reply header with the bytes the target placed.
pub const RDMA_BYTES: &str = "x-amz-rdma-bytes-transferred";

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
    value?.trim().parse().ok()
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
    }
}
