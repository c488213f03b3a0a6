//! The `tcp` backend: software RDMA over authenticated TCP connections.
//!
//! The frames and the handshake proofs are in `s3dma-wire`
//! ([`s3dma_wire::frame`], [`s3dma_wire::handshake`]); the handshake on a
//! connection is `crate::handshake`, shared with verbs.
//!
//! * `endpoint`: the responder, which checks every request against the key
//!   table and places WRITE payloads with `recv(2)` straight into region
//!   memory and serves READs with `send(2)` straight from it;
//! * `session`: the requester, with many operations outstanding, optionally
//!   striped over several TCP streams by remote address so that operations
//!   touching the same bytes stay ordered (RC queue-pair semantics).

pub(crate) mod endpoint;
pub(crate) mod session;

pub(crate) fn io_tuning(
    socket_buffer: Option<usize>,
    dead_peer_timeout: std::time::Duration,
) -> crate::sock::Tuning {
    crate::sock::Tuning {
        socket_buffer,
        dead_peer_timeout,
    }
}
