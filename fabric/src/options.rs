//! How endpoints listen and sessions connect (both backends).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use s3dma_wire::FabricKey;

/// How an endpoint listens.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// Address to bind (port 0 picks one).
    pub bind: SocketAddr,
    /// The pre-shared fabric key peers must prove.
    pub fabric_key: FabricKey,
    /// Responder number (token `dctn`, 24 bits); peers must name it.
    pub responder: u32,
    /// Address to put in tokens when `bind` is unspecified (0.0.0.0 / ::).
    pub advertise: Option<IpAddr>,
    /// `SO_SNDBUF`/`SO_RCVBUF`; `None` keeps the kernel's autotuning.
    pub socket_buffer: Option<usize>,
}

impl EndpointConfig {
    /// Listen on `bind` with `fabric_key`, responder number 1.
    pub fn new(bind: SocketAddr, fabric_key: FabricKey) -> EndpointConfig {
        EndpointConfig {
            bind,
            fabric_key,
            responder: 1,
            advertise: None,
            socket_buffer: None,
        }
    }
}

/// Session tuning.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// The pre-shared fabric key.
    pub fabric_key: FabricKey,
    /// TCP streams per session (1 or more).
    pub streams: usize,
    /// Stripe unit in bytes when `streams > 1` (operations are split at
    /// multiples of it in remote-address space).
    pub stripe: u64,
    /// Connect-and-handshake timeout per stream.
    pub connect_timeout: Duration,
    /// `TCP_USER_TIMEOUT`: how long sent data may stay unacknowledged before
    /// the connection is declared dead (the analogue of the RC retry budget).
    pub user_timeout: Option<Duration>,
    /// `SO_SNDBUF`/`SO_RCVBUF`; `None` keeps the kernel's autotuning.
    pub socket_buffer: Option<usize>,
}

impl SessionConfig {
    /// Defaults: one stream, 4 MiB stripes, 10 s connect timeout, 30 s user timeout.
    pub fn new(fabric_key: FabricKey) -> SessionConfig {
        SessionConfig {
            fabric_key,
            streams: 1,
            stripe: 4 << 20,
            connect_timeout: Duration::from_secs(10),
            user_timeout: Some(Duration::from_secs(30)),
            socket_buffer: None,
        }
    }
}
