//! Assembling and running the shim from a loaded configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fabric::{Domain, Endpoint, EndpointConfig};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::agent_link::{AgentLink, LinkSettings};
use crate::config::LoadedConfig;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::service::TenantService;
use crate::socket::{self, ShimConn};

/// Why the shim could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The tenant socket.
    #[error("socket.path: {0}")]
    Socket(String),
    /// The fabric domain or endpoint.
    #[error("fabric: {0}")]
    Fabric(#[from] fabric::FabricError),
    /// The agent link settings.
    #[error("{0}")]
    Agent(String),
    /// The metrics listener.
    #[error("metrics.address {addr}: {source}")]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// A running shim.
#[derive(Debug)]
pub struct Running {
    /// The tenant socket.
    pub socket: PathBuf,
    /// Where the fabric endpoint serving tenant memory listens.
    pub fabric_addr: String,
    /// Where `/metrics` is served.
    pub metrics_addr: Option<SocketAddr>,
    /// Shared metrics.
    pub metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    accept: JoinHandle<()>,
    endpoint: Arc<Endpoint>,
}

impl Running {
    /// Waits for the gRPC server to end (it ends only on error or shutdown).
    ///
    /// # Errors
    /// The server's error.
    pub async fn wait(&mut self) -> Result<(), String> {
        match (&mut self.server).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Stops accepting, ends the gRPC server, closes the fabric endpoint and
    /// removes the socket file.
    pub async fn shutdown(self) {
        self.accept.abort();
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.server).await;
        if let Ok(ep) = Arc::try_unwrap(self.endpoint) {
            ep.shutdown().await;
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Starts the shim.
///
/// # Errors
/// [`StartError`].
pub async fn start(cfg: LoadedConfig) -> Result<Running, StartError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let c = &cfg.config;
    let metrics = Arc::new(Metrics::new());

    let domain = Domain::open(c.fabric.backend)?;
    let mut ep_cfg = EndpointConfig::new(c.fabric.listen, cfg.fabric_key.clone());
    ep_cfg.advertise = c.fabric.advertise;
    let endpoint = Arc::new(Endpoint::listen(&domain, ep_cfg).await?);
    let fabric_addr = format!("{:?}", endpoint.addr());

    let settings = LinkSettings::from_config(
        &c.agent,
        cfg.agent_token.as_ref().map(fabric::config::Secret::expose),
    )
    .map_err(StartError::Agent)?;
    let agent = AgentLink::connect(settings, Arc::clone(&metrics)).await;

    let metrics_addr = match c.metrics.address {
        None => None,
        Some(addr) => {
            let l = TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::Metrics { addr, source })?;
            let bound = l
                .local_addr()
                .map_err(|source| StartError::Metrics { addr, source })?;
            tokio::spawn(Arc::clone(&metrics).serve(l));
            Some(bound)
        }
    };

    let registry = Arc::new(Registry::new(c, domain, Arc::clone(&metrics)));
    let service = TenantService::new(
        Arc::clone(&registry),
        agent,
        Arc::clone(&endpoint),
        Arc::clone(&metrics),
        Duration::from_secs(c.agent.request_timeout_secs),
    );

    let listener = socket::bind(&c.socket.path, cfg.socket_mode, cfg.socket_gid)
        .map_err(StartError::Socket)?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<ShimConn>(64);
    let accept = tokio::spawn(socket::accept_loop(
        listener,
        registry,
        Arc::clone(&metrics),
        tx,
    ));
    let incoming = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|c| c.map(Ok::<_, std::io::Error>))
    });
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(
            s3dma_proto::tenant::v1::tenant_server::TenantServer::new(service)
                .max_decoding_message_size(16 << 20),
        );
    let server = tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
            .await
    });
    tracing::info!(socket = %c.socket.path.display(), fabric = %fabric_addr, "host-shim serving");
    Ok(Running {
        socket: c.socket.path.clone(),
        fabric_addr,
        metrics_addr,
        metrics,
        shutdown,
        server,
        accept,
        endpoint,
    })
}
