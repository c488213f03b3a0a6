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
}

impl Endpoint {
    /// Starts listening. Must run inside a tokio runtime.
    pub async fn listen(domain: &Domain, config: EndpointConfig) -> Result<Endpoint> {
        if config.responder > MAX_DCTN {
            return Err(FabricError::InvalidArgument(format!(
                "responder number {} does not fit the token's 24-bit dctn",
                config.responder
            )));
        }
        let (inner, addr) = match domain.backend() {
            Backend::Tcp => {
                let ep = tcp::endpoint::TcpEndpoint::listen(
                    domain.clone(),
                    &config,
                    tcp::io_tuning(config.socket_buffer, None),
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
        })
    }

    /// Where peers reach this endpoint (what tokens carry, and the identity
    /// requesters must name in the handshake).
    pub fn addr(&self) -> EndpointAddr {
        self.addr
    }

    /// The `x-amz-rdma-token` for a whole window served by this endpoint.
    pub fn token(&self, window: &Window) -> std::result::Result<RdmaToken, TokenError> {
        RdmaToken::new(self.addr, window.remote())
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
