//! [`Endpoint`]: serves one-sided operations on a domain's regions, on the
//! domain's backend.

use s3dma_wire::token::MAX_DCTN;
use s3dma_wire::{EndpointAddr, RdmaToken, TokenError};

use crate::backend::Backend;
use crate::error::{FabricError, Result};
use crate::options::EndpointConfig;
use crate::region::{Domain, Window};
use crate::tcp;
#[cfg(feature = "verbs")]
use crate::verbs;

#[derive(Debug)]
enum EndpointImpl {
    Tcp(tcp::endpoint::TcpEndpoint),
    #[cfg(feature = "verbs")]
    Verbs(verbs::conn::VerbsEndpoint),
}

/// Serves one-sided operations on a domain's regions.
#[derive(Debug)]
pub struct Endpoint {
    inner: EndpointImpl,
    addr: EndpointAddr,
    _domain: Domain,
    /// [`EndpointConfig::isolated_responders`].
    isolated: Vec<(u32, Domain)>,
}

impl Endpoint {
    /// Starts listening. Must run inside a tokio runtime.
    pub async fn listen(domain: &Domain, config: EndpointConfig) -> Result<Endpoint> {
        for r in std::iter::once(config.responder)
            .chain(config.isolated_responders.iter().map(|(r, _)| *r))
        {
            if r > MAX_DCTN {
                return Err(FabricError::InvalidArgument(format!(
                    "responder number {r} does not fit the token's 24-bit dctn"
                )));
            }
        }
        crate::sock::check_dead_peer_timeout(config.dead_peer_timeout)?;
        let mut seen = vec![config.responder];
        for (r, d) in &config.isolated_responders {
            if seen.contains(r) {
                return Err(FabricError::InvalidArgument(format!(
                    "responder number {r} is given twice"
                )));
            }
            seen.push(*r);
            if d.backend() != Backend::Verbs || domain.backend() != Backend::Verbs {
                return Err(FabricError::InvalidArgument(
                    "isolated responders are served on verbs only (on tcp every key is checked by the one domain's endpoint)".into(),
                ));
            }
        }
        let (inner, addr) = match domain.backend() {
            Backend::Tcp => {
                let ep = tcp::endpoint::TcpEndpoint::listen(
                    domain.clone(),
                    &config,
                    tcp::io_tuning(config.socket_buffer, config.dead_peer_timeout),
                )
                .await?;
                let addr = ep.identity();
                (EndpointImpl::Tcp(ep), addr)
            }
            #[cfg(feature = "verbs")]
            Backend::Verbs => {
                let ep = verbs::conn::VerbsEndpoint::listen(domain.clone(), &config).await?;
                let addr = ep.identity();
                (EndpointImpl::Verbs(ep), addr)
            }
            #[cfg(not(feature = "verbs"))]
            Backend::Verbs => return Err(crate::backend::verbs_not_built()),
        };
        Ok(Endpoint {
            inner,
            addr,
            _domain: domain.clone(),
            isolated: config.isolated_responders,
        })
    }

    /// Where peers reach this endpoint (what tokens carry, and the identity
    /// requesters must name in the handshake).
    pub fn addr(&self) -> EndpointAddr {
        self.addr
    }

    /// The `x-amz-rdma-token` for a whole window served by this endpoint:
    /// it names the responder whose domain holds the window's region.
    pub fn token(&self, window: &Window) -> std::result::Result<RdmaToken, TokenError> {
        RdmaToken::new(self.addr_for(window.region().domain()), window.remote())
    }

    /// Where a peer reaches memory of `domain`: this endpoint's address
    /// with the responder serving that domain (the base responder unless
    /// `domain` is one of the isolated responders').
    pub fn addr_for(&self, domain: &Domain) -> EndpointAddr {
        let responder = self
            .isolated
            .iter()
            .find(|(_, d)| d.same(domain))
            .map_or(self.addr.responder, |(r, _)| *r);
        EndpointAddr {
            addr: self.addr.addr,
            responder,
        }
    }

    /// Stops the endpoint: no new connections, existing ones are dropped.
    pub async fn shutdown(self) {
        match self.inner {
            EndpointImpl::Tcp(ep) => ep.shutdown().await,
            #[cfg(feature = "verbs")]
            EndpointImpl::Verbs(ep) => ep.shutdown().await,
        }
    }
}
