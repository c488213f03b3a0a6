//! The `tcp` backend: software RDMA over authenticated TCP connections.
//!
//! * [`frame`]: the versioned wire format (pure);
//! * [`handshake`]: the pre-shared-key HMAC challenge–response (pure);
//! * `endpoint`: the responder, which checks every request against the key
//!   table and places WRITE payloads with `recv(2)` straight into region
//!   memory and serves READs with `send(2)` straight from it;
//! * `listener`: the accept loop both backends' endpoints use;
//! * `session`: the requester, with many operations outstanding, optionally
//!   striped over several TCP streams by remote address so that operations
//!   touching the same bytes stay ordered (RC queue-pair semantics).

pub mod frame;
pub mod handshake;

pub(crate) mod endpoint;
pub(crate) mod io;
pub(crate) mod listener;
pub(crate) mod session;

pub(crate) fn io_tuning(
    socket_buffer: Option<usize>,
    user_timeout: Option<std::time::Duration>,
) -> io::Tuning {
    io::Tuning {
        socket_buffer,
        user_timeout,
    }
}
