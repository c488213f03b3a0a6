#![warn(missing_docs)]
//! s3dma's one-sided RDMA data plane.
//!
//! * [`Domain`] owns registrations; [`Domain::register`] turns [`Memory`]
//!   into a [`Region`] (address, length, access, rkey); [`Region::window`]
//!   mints a narrower, revocable [`Window`] with an access subset and an
//!   optional expiry.
//! * [`Endpoint::listen`] serves one-sided operations on a domain's regions;
//!   [`Session::connect`] reaches an endpoint and posts [`Session::write`] /
//!   [`Session::read`] with many operations outstanding. Each completes with
//!   success or an [`OpError`] carrying a verbs-like [`OpStatus`]. An
//!   in-flight operation owns its [`LocalSlice`] until it completes, so
//!   dropping its [`Completion`] never frees memory the peer still uses.
//! * [`token`] is the `x-amz-rdma-token` codec and the mapping between a
//!   token and an endpoint address plus remote buffer.
//! * Backends: [`Backend::Tcp`] (software RDMA, [`tcp`]) everywhere, and
//!   [`Backend::Verbs`] (rdma-sys) where an RDMA device exists; opening a
//!   verbs domain without one fails with [`FabricError::Unavailable`], which
//!   callers use to fall back to tcp.
//! * [`pool`] holds what request-serving programs build on a domain: a
//!   bounded staging pool carved from one registered region and sessions
//!   pooled per endpoint; [`config`] holds shared configuration pieces
//!   (sizes such as `4MiB`, the fabric key file, backend names).
//!
//! # Backend differences
//!
//! Both backends complete operations with the same [`OpStatus`] values, but:
//!
//! * after a remote error a verbs RC queue pair is in the error state and
//!   flushes everything after it; a tcp session drains the refused payload
//!   and keeps going. Pools should drop a session once
//!   [`Session::is_alive`] is false either way;
//! * dropping a tcp [`Session`] lets already-posted operations finish;
//!   dropping a verbs session destroys its queue pair and the outstanding
//!   operations complete as [`OpStatus::Flushed`] (their memory is released
//!   only after the queue pair is gone);
//! * window expiry is checked at every placement on tcp; on verbs a timer
//!   deregisters the window's memory registration when it expires;
//! * on tcp, CUDA regions are served through a host bounce buffer and may only
//!   be the remote side; on verbs they are registered with
//!   `ibv_reg_dmabuf_mr` (feature `cuda`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), fabric::FabricError> {
//! use fabric::*;
//! let key = FabricKey::random();
//! let domain = Domain::tcp();
//! let target = domain.alloc(1 << 20, Access::ALL)?;
//! let window = target.window(0, 4096, Access::REMOTE_WRITE, None)?;
//! let endpoint = Endpoint::listen(&domain, EndpointConfig::new("127.0.0.1:0".parse().unwrap(), key.clone())).await?;
//! let token = endpoint.token(&window)?; // what goes into x-amz-rdma-token
//!
//! // The other side: parse the token, connect, write.
//! let token: RdmaToken = token.to_string().parse().unwrap();
//! let staging = Domain::tcp().alloc(4096, Access::LOCAL_WRITE)?;
//! let session = Session::connect(staging.domain(), token.endpoint().unwrap(), SessionConfig::new(key)).await?;
//! session.write(staging.as_slice(), token.addr, token.rkey).await?;
//! # Ok(()) }
//! ```

mod access;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
mod memory;
pub mod pool;
mod region;
pub mod tcp;
pub mod token;
pub mod verbs;

use std::net::{IpAddr, SocketAddr};

pub use access::Access;
pub use error::{FabricError, OpError, OpStatus, Result};
pub use memory::{Memory, MemoryKind};
pub use region::{Domain, LocalSlice, Region, RemoteBuf, Window};
pub use tcp::handshake::FabricKey;
pub use tcp::session::{Completion, SessionConfig};
pub use token::{EndpointAddr, RdmaToken, TokenError};

use tcp::frame::OpKind;

/// Which transport a domain uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Software RDMA over authenticated TCP; works everywhere.
    Tcp,
    /// RDMA verbs (RC queue pairs) through rdma-sys; needs an RDMA device.
    Verbs,
}

impl std::str::FromStr for Backend {
    type Err = FabricError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tcp" => Ok(Backend::Tcp),
            "verbs" => Ok(Backend::Verbs),
            _ => Err(FabricError::InvalidArgument(format!(
                "unknown fabric backend {s:?} (expected `tcp` or `verbs`)"
            ))),
        }
    }
}

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

#[derive(Debug)]
enum EndpointImpl {
    Tcp(tcp::endpoint::TcpEndpoint),
    Verbs(verbs::conn::VerbsEndpoint),
}

/// Serves one-sided operations on a domain's regions.
#[derive(Debug)]
pub struct Endpoint {
    inner: EndpointImpl,
    addr: EndpointAddr,
    _domain: Domain,
}

impl Endpoint {
    /// Starts listening. Must run inside a tokio runtime.
    pub async fn listen(domain: &Domain, config: EndpointConfig) -> Result<Endpoint> {
        if config.responder > token::MAX_DCTN {
            return Err(FabricError::InvalidArgument(format!(
                "responder number {} does not fit the token's 24-bit dctn",
                config.responder
            )));
        }
        let (inner, mut addr) = match domain.backend() {
            Backend::Tcp => {
                let ep = tcp::endpoint::TcpEndpoint::listen(
                    domain.clone(),
                    config.bind,
                    config.fabric_key.clone(),
                    config.responder,
                    tcp::io_tuning(config.socket_buffer, None),
                )
                .await?;
                let addr = ep.local_addr();
                (EndpointImpl::Tcp(ep), addr)
            }
            Backend::Verbs => {
                let ep = verbs::conn::VerbsEndpoint::listen(
                    domain.clone(),
                    config.bind,
                    config.fabric_key.clone(),
                    config.responder,
                )
                .await?;
                let addr = ep.local_addr();
                (EndpointImpl::Verbs(ep), addr)
            }
        };
        if addr.ip().is_unspecified()
            && let Some(ip) = config.advertise
        {
            addr.set_ip(ip);
        }
        Ok(Endpoint {
            inner,
            addr: EndpointAddr {
                addr,
                responder: config.responder,
            },
            _domain: domain.clone(),
        })
    }

    /// Where peers reach this endpoint (what tokens carry).
    pub fn addr(&self) -> EndpointAddr {
        self.addr
    }

    /// The `x-amz-rdma-token` for a whole window served by this endpoint.
    pub fn token(&self, window: &Window) -> std::result::Result<RdmaToken, TokenError> {
        RdmaToken::for_window(self.addr, window)
    }

    /// Stops the endpoint: no new connections, existing ones are dropped.
    pub async fn shutdown(self) {
        match self.inner {
            EndpointImpl::Tcp(ep) => ep.shutdown().await,
            EndpointImpl::Verbs(ep) => ep.shutdown().await,
        }
    }
}

#[derive(Debug)]
enum SessionImpl {
    Tcp(tcp::session::TcpSession),
    Verbs(verbs::conn::VerbsSession),
}

/// A connection to a remote endpoint, posting one-sided operations.
#[derive(Debug)]
pub struct Session {
    inner: SessionImpl,
    domain: Domain,
}

impl Session {
    /// Connects (and authenticates) to `target` on `domain`'s backend. On
    /// verbs, one RC queue pair is brought to RTS through an out-of-band
    /// exchange with the endpoint (`streams`/`stripe` apply to tcp only).
    pub async fn connect(
        domain: &Domain,
        target: EndpointAddr,
        config: SessionConfig,
    ) -> Result<Session> {
        match domain.backend() {
            Backend::Tcp => Ok(Session {
                inner: SessionImpl::Tcp(tcp::session::TcpSession::connect(target, &config).await?),
                domain: domain.clone(),
            }),
            Backend::Verbs => {
                let connect =
                    verbs::conn::VerbsSession::connect(domain, target, &config.fabric_key);
                let s = tokio::time::timeout(config.connect_timeout, connect)
                    .await
                    .map_err(|_| FabricError::Handshake {
                        peer: target.to_string(),
                        reason: format!(
                            "connect and queue-pair exchange timed out after {:?}",
                            config.connect_timeout
                        ),
                    })??;
                Ok(Session {
                    inner: SessionImpl::Verbs(s),
                    domain: domain.clone(),
                })
            }
        }
    }

    fn check_local(&self, local: &LocalSlice) -> Option<OpStatus> {
        if !std::sync::Arc::ptr_eq(&local.region().domain().inner, &self.domain.inner) {
            return Some(OpStatus::LocalError);
        }
        // The tcp requester moves local bytes with send/recv, which cannot
        // address device memory; CUDA memory is served on the responder side.
        if matches!(self.inner, SessionImpl::Tcp(_)) && local.region().kind() == MemoryKind::Cuda {
            return Some(OpStatus::LocalError);
        }
        None
    }

    fn post(&self, kind: OpKind, local: LocalSlice, remote_addr: u64, rkey: u32) -> Completion {
        if let Some(st) = self.check_local(&local) {
            return Completion::failed(OpError {
                status: st,
                op: kind.name(),
                remote_addr,
                rkey,
                len: local.len() as u64,
            });
        }
        match &self.inner {
            SessionImpl::Tcp(s) => s.post(kind, local, remote_addr, rkey),
            SessionImpl::Verbs(s) => s.post(kind, local, remote_addr, rkey),
        }
    }

    /// Posts an RDMA WRITE of `local` to `remote_addr` under `rkey`.
    /// `local` must belong to this session's domain (else the operation
    /// completes with [`OpStatus::LocalError`]); on tcp it must be host memory.
    /// Posting never blocks; operations take effect in posting order.
    pub fn write(&self, local: LocalSlice, remote_addr: u64, rkey: u32) -> Completion {
        self.post(OpKind::Write, local, remote_addr, rkey)
    }

    /// Posts an RDMA READ from `remote_addr` under `rkey` into `local`
    /// (which needs [`Access::LOCAL_WRITE`] on verbs).
    pub fn read(&self, local: LocalSlice, remote_addr: u64, rkey: u32) -> Completion {
        self.post(OpKind::Read, local, remote_addr, rkey)
    }

    /// Whether the session can still run operations (a failed session
    /// flushes everything; callers reconnect).
    pub fn is_alive(&self) -> bool {
        match &self.inner {
            SessionImpl::Tcp(s) => s.is_alive(),
            SessionImpl::Verbs(s) => s.is_alive(),
        }
    }

    /// The endpoint this session talks to.
    pub fn peer(&self) -> EndpointAddr {
        match &self.inner {
            SessionImpl::Tcp(s) => s.peer(),
            SessionImpl::Verbs(s) => s.peer(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Domain>();
        check::<Region>();
        check::<Window>();
        check::<LocalSlice>();
        check::<Endpoint>();
        check::<Session>();
        check::<Completion>();
        check::<Memory>();
    }

    #[test]
    fn backend_names() {
        assert_eq!("tcp".parse::<Backend>().unwrap(), Backend::Tcp);
        assert_eq!("verbs".parse::<Backend>().unwrap(), Backend::Verbs);
        assert!(
            "rdma"
                .parse::<Backend>()
                .unwrap_err()
                .to_string()
                .contains("tcp")
        );
    }
}
