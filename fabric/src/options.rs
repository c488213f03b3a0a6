//! How endpoints listen and sessions connect (both backends).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use s3dma_wire::{EndpointAddr, FabricKey};

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
    /// How long a peer may stop answering before its connection is
    /// declared dead (1 s to 1 h): `TCP_USER_TIMEOUT` and TCP keepalive on
    /// every accepted socket (tcp streams and verbs out-of-band
    /// connections), so a requester behind a cut link is dropped, and its
    /// connection slot freed, within about this long. A connection that
    /// fails is closed with a reset (`SO_LINGER` 0).
    pub dead_peer_timeout: Duration,
    /// Most connections held at once, authenticated or not; one more is
    /// closed as soon as it is accepted. Count it in the process's
    /// descriptor budget.
    pub max_connections: usize,
    /// Most connections held at once from one peer IP address.
    pub max_connections_per_address: usize,
    /// Time a connection has to complete the handshake.
    pub handshake_timeout: Duration,
    /// An authenticated tcp connection whose session (all its streams from
    /// that address) sent no request for this long is closed; `None` never
    /// closes one. (A verbs out-of-band connection does not see the
    /// operations the NIC serves, so it is never idle.)
    pub idle_timeout: Option<Duration>,
    /// Further responders on the same listener, each serving its own
    /// protection domain ([`Domain::isolated`](crate::Domain::isolated)):
    /// a requester names one in the handshake (the token's `dctn`) and its
    /// queue pair is created in that responder's domain, so it reaches
    /// only the memory registered there (verbs only; [`Endpoint::token`](crate::Endpoint::token)
    /// names the responder of the window's domain).
    pub isolated_responders: Vec<(u32, crate::Domain)>,
}

impl EndpointConfig {
    /// Default of [`EndpointConfig::max_connections`].
    pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
    /// Default of [`EndpointConfig::max_connections_per_address`].
    pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;
    /// Default of [`EndpointConfig::handshake_timeout`].
    pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default of [`EndpointConfig::idle_timeout`].
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
    /// Default of [`EndpointConfig::dead_peer_timeout`] (and of
    /// [`SessionConfig::dead_peer_timeout`]).
    pub const DEFAULT_DEAD_PEER_TIMEOUT: Duration = Duration::from_secs(5);

    /// Listen on `bind` with `fabric_key`, responder number 1, the default
    /// caps (1024 connections, 256 per address) and timeouts (handshake
    /// 10 s, idle 300 s, dead peer 5 s).
    pub fn new(bind: SocketAddr, fabric_key: FabricKey) -> EndpointConfig {
        EndpointConfig {
            bind,
            fabric_key,
            responder: 1,
            advertise: None,
            socket_buffer: None,
            dead_peer_timeout: Self::DEFAULT_DEAD_PEER_TIMEOUT,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: Self::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            handshake_timeout: Self::DEFAULT_HANDSHAKE_TIMEOUT,
            idle_timeout: Some(Self::DEFAULT_IDLE_TIMEOUT),
            isolated_responders: Vec::new(),
        }
    }

    /// The endpoint's identity for a bound address `local`: what its
    /// tokens carry and what requesters must name in the handshake
    /// (`advertise` replaces an unspecified bind address).
    pub(crate) fn identity(&self, local: SocketAddr) -> EndpointAddr {
        let mut addr = local;
        if addr.ip().is_unspecified()
            && let Some(ip) = self.advertise
        {
            addr.set_ip(ip);
        }
        EndpointAddr {
            addr,
            responder: self.responder,
        }
    }

    pub(crate) fn caps(&self) -> crate::listener::Caps {
        crate::listener::Caps {
            total: self.max_connections,
            per_ip: self.max_connections_per_address,
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
    /// How long the endpoint may stop answering before the session is
    /// declared dead (1 s to 1 h; the analogue of the RC retry budget):
    /// `TCP_USER_TIMEOUT` (sent data, or a closed receive window, left
    /// unacknowledged) and TCP keepalive (an idle stream, e.g. one waiting
    /// for READ data) on every stream, so a session over a cut link fails
    /// within about this long instead of TCP's ~15 minutes. A session that
    /// fails closes its streams with a reset (`SO_LINGER` 0): nothing still
    /// queued in them reaches the endpoint later. tcp only (a verbs queue
    /// pair has the device's retry budget).
    pub dead_peer_timeout: Duration,
    /// `SO_SNDBUF`/`SO_RCVBUF`; `None` keeps the kernel's autotuning.
    pub socket_buffer: Option<usize>,
}

impl SessionConfig {
    /// Defaults: one stream, 4 MiB stripes, 10 s connect timeout, 5 s dead-peer timeout.
    pub fn new(fabric_key: FabricKey) -> SessionConfig {
        SessionConfig {
            fabric_key,
            streams: 1,
            stripe: 4 << 20,
            connect_timeout: Duration::from_secs(10),
            dead_peer_timeout: EndpointConfig::DEFAULT_DEAD_PEER_TIMEOUT,
            socket_buffer: None,
        }
    }
}
