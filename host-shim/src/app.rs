//! Assembling and running the shim from a loaded configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fabric::{Domain, Endpoint, EndpointConfig};
use s3dma_service::metrics::{MetricsOptions, MetricsServer};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admission::{AdmissionLayer, method_limits};
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
    Socket(#[from] crate::socket::BindError),
    /// The fabric domain or endpoint.
    #[error("fabric: {0}")]
    Fabric(#[from] fabric::FabricError),
    /// A rail's endpoint could not listen (its address is not on this
    /// host, or taken).
    #[error("fabric.rails[{index}].listen: {source}")]
    Rail {
        /// The rail.
        index: usize,
        /// Why.
        source: fabric::FabricError,
    },
    /// A rail's RDMA device could not be opened (verbs).
    #[error("fabric.rails[{index}].device: {source}")]
    RailDevice {
        /// The rail.
        index: usize,
        /// Why.
        source: fabric::FabricError,
    },
    /// The agent link settings.
    #[error(transparent)]
    Agent(#[from] crate::agent_link::LinkError),
    /// The metrics listener.
    #[error(transparent)]
    Metrics(#[from] s3dma_service::metrics::MetricsError),
    /// The tenants' limits do not fit the shim's file-descriptor limit.
    #[error("{0}")]
    FdLimit(String),
}

/// A running shim.
#[derive(Debug)]
pub struct Running {
    /// The tenant socket.
    pub socket: PathBuf,
    /// Where the fabric endpoint serving tenant memory listens.
    pub fabric_addr: String,
    /// Where `/metrics` is served over TCP.
    pub metrics_addr: Option<SocketAddr>,
    /// The metrics server (TCP and/or Unix socket).
    pub metrics_server: MetricsServer,
    /// Shared metrics.
    pub metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    accept: JoinHandle<()>,
    /// The queue-pair link to the agent (verbs only).
    background: Vec<JoinHandle<()>>,
    endpoints: Arc<[Arc<Endpoint>]>,
}

impl Running {
    /// Waits for the gRPC server to end (it ends only on error or shutdown).
    ///
    /// # Errors
    /// The server's error.
    pub async fn wait(&mut self) -> Result<(), s3dma_service::skeleton::ServerStopped> {
        s3dma_service::skeleton::join_server(&mut self.server).await
    }

    /// Stops accepting, ends the gRPC server, closes the fabric endpoint and
    /// removes the socket file.
    pub async fn shutdown(self) {
        self.accept.abort();
        for t in &self.background {
            t.abort();
        }
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.server).await;
        let endpoints: Vec<Arc<Endpoint>> = self.endpoints.iter().cloned().collect();
        drop(self.endpoints);
        for ep in endpoints {
            if let Ok(ep) = Arc::try_unwrap(ep) {
                ep.shutdown().await;
            }
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Bytes of request headers one call may send (gRPC needs a few hundred).
const MAX_HEADER_LIST: u32 = 16 << 10;

/// File descriptors the shim needs besides the tenants' and the fabric
/// endpoint's connections (the agent link, listeners, metrics, logs).
const FD_RESERVE: u64 = 512;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit
/// ([`s3dma_service::fds`]), then checks that every tenant at its caps
/// fits: a tenant holds at most `max_connections` connections (each may
/// carry one fd in an unfinished lease frame) and `2 × max_buffers` fds
/// (registered buffers and passed fds waiting for RegisterBuffer), so no
/// tenant can starve another of descriptors; each rail's fabric endpoint
/// holds at most `fabric.max_connections`, so peers on the network cannot starve the
/// tenants either; each metrics listener adds its connection cap.
fn check_fd_limit(c: &crate::config::Config) -> Result<(), StartError> {
    let limit =
        s3dma_service::fds::raise_limit().map_err(|e| StartError::FdLimit(e.to_string()))?;
    let metrics_listeners =
        u64::from(c.metrics.address.is_some()) + u64::from(c.metrics.unix_socket.is_some());
    let need: u64 = FD_RESERVE
        + metrics_listeners * s3dma_service::metrics::MAX_CONNECTIONS as u64
        + c.fabric.rail_list().len() as u64 * u64::from(c.fabric.max_connections)
        + c.tenants
            .iter()
            .map(|t| 2 * u64::from(t.max_connections) + 2 * u64::from(t.max_buffers))
            .sum::<u64>();
    if need > limit {
        return Err(StartError::FdLimit(format!(
            "the tenants' and the fabric endpoint's limits need up to {need} file descriptors (2 × max_connections + 2 × max_buffers per tenant, plus fabric.max_connections per rail, {} per metrics listener, plus {FD_RESERVE}) but RLIMIT_NOFILE is {limit}; raise it (LimitNOFILE= in the systemd unit, ulimit -n) or lower the tenants' max_connections / max_buffers or fabric.max_connections",
            s3dma_service::metrics::MAX_CONNECTIONS
        )));
    }
    Ok(())
}

/// The responder number of each tenant's protection domain on rail
/// `rail`: the base responder's successors, in configuration order.
fn tenant_responders(
    base: u32,
    tenants: &[Arc<crate::registry::Tenant>],
    rail: usize,
) -> Vec<(u32, Domain)> {
    tenants
        .iter()
        .zip(1u32..)
        .map(|(t, i)| {
            let domain = rail
                .checked_sub(1)
                .and_then(|r| t.rail_domains.get(r))
                .unwrap_or(&t.domain);
            (base + i, domain.clone())
        })
        .collect()
}

/// Starts the shim.
///
/// # Errors
/// [`StartError`].
pub async fn start(cfg: LoadedConfig) -> Result<Running, StartError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let c = &cfg.config;
    let metrics = Arc::new(Metrics::new());

    let rails = c.fabric.rail_list();
    // On tcp every rail's endpoint serves the one domain (a rail is an
    // address). On verbs each rail is a device port with a domain of its
    // own, and each tenant has a protection domain on every rail's device.
    let rail_domains = match c.fabric.backend {
        fabric::Backend::Tcp => vec![Domain::open(fabric::Backend::Tcp)?],
        fabric::Backend::Verbs => rails
            .iter()
            .enumerate()
            .map(|(i, rail)| {
                Domain::open_on(fabric::Backend::Verbs, rail.device_rail().as_ref()).map_err(
                    |source| {
                        if c.fabric.rails.is_empty() {
                            StartError::Fabric(source)
                        } else {
                            StartError::RailDevice { index: i, source }
                        }
                    },
                )
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    let domain = rail_domains[0].clone();
    // Each tenant's buffers live in a protection domain of their own.
    let registry = Arc::new(Registry::new(
        c,
        domain.clone(),
        &rail_domains[1..],
        Arc::clone(&metrics),
    )?);
    let mut endpoints = Vec::with_capacity(rails.len());
    for (i, rail) in rails.iter().enumerate() {
        let mut ep_cfg = EndpointConfig::new(rail.listen, cfg.fabric_key.clone());
        let rail_domain = rail_domains.get(i).unwrap_or(&domain);
        if domain.backend() == fabric::Backend::Verbs {
            // A target session names the tenant's responder (the token's
            // `dctn`) and gets a queue pair in that tenant's domain on
            // this rail's device: it can reach that tenant's live windows
            // and nobody else's.
            ep_cfg.isolated_responders = tenant_responders(ep_cfg.responder, registry.tenants(), i);
        }
        ep_cfg.advertise = rail.advertise;
        ep_cfg.max_connections = c.fabric.max_connections as usize;
        ep_cfg.max_connections_per_address = c.fabric.max_connections_per_address as usize;
        ep_cfg.handshake_timeout = Duration::from_secs(c.fabric.handshake_timeout_secs);
        ep_cfg.idle_timeout = Some(Duration::from_secs(c.fabric.idle_timeout_secs));
        let endpoint = Endpoint::listen(rail_domain, ep_cfg)
            .await
            .map_err(|source| {
                if c.fabric.rails.is_empty() {
                    StartError::Fabric(source)
                } else {
                    StartError::Rail { index: i, source }
                }
            })?;
        if i > 0 {
            tracing::info!(rail = i, fabric = ?endpoint.addr(), "fabric rail serving");
        }
        endpoints.push(Arc::new(endpoint));
    }
    let endpoints: Arc<[Arc<Endpoint>]> = endpoints.into();
    let fabric_addr = format!("{:?}", endpoints[0].addr());

    let settings = LinkSettings::from_config(
        &c.agent,
        cfg.agent_token.as_ref().map(s3dma_config::Secret::expose),
    )?;
    let agent = AgentLink::connect(settings, Arc::clone(&metrics)).await;

    check_fd_limit(c)?;
    let render_from = Arc::clone(&metrics);
    let metrics_server = MetricsServer::start(
        MetricsOptions {
            address: c.metrics.address,
            unix_socket: c.metrics.unix_socket.clone(),
            bearer_token: cfg.metrics_token.clone(),
        },
        Arc::new(move || render_from.render()),
    )
    .await?;
    let metrics_addr = metrics_server.address;

    // On a verbs device the agent may run hipobj-rc-v2 transfers here: a
    // queue pair per transfer over the tenant's window.
    #[cfg(feature = "verbs")]
    let qp_host = {
        let dc = if !c.fabric.dc.enabled {
            Err(crate::qp_link::NoDcTarget::Disabled)
        } else if domain.backend() != fabric::Backend::Verbs {
            Err(crate::qp_link::NoDcTarget::Tcp)
        } else {
            // One DC target per tenant and rail, in the tenant's domain
            // on that rail's device: a DC peer reaches one tenant's
            // windows at most (the well-known DC key keeps no one out).
            // Rail 0's device must do DC; another rail's without DC gets
            // none (standard tokens for its windows are refused, and the
            // agent sends those chunks over HTTP).
            let mut targets = Vec::new();
            let mut made = Ok(());
            for t in registry.tenants().iter() {
                match crate::qp_link::DcHost::create(&t.domain, &c.fabric.dc) {
                    Ok(d) => targets.push((t.domain.clone(), d)),
                    Err(why) => {
                        made = Err(why);
                        break;
                    }
                }
                for (i, domain) in t.rail_domains.iter().enumerate() {
                    match crate::qp_link::DcHost::create(domain, &c.fabric.dc) {
                        Ok(d) => targets.push((domain.clone(), d)),
                        Err(why) => {
                            tracing::info!(rail = i + 1, reason = %why, "no DC target on this rail's device: its standard tokens are refused");
                        }
                    }
                }
            }
            made.map(|()| targets)
        };
        match &dc {
            Ok(d) => tracing::info!(
                targets = d.len(),
                "DC targets (one per tenant and rail) for the cuObject dialect"
            ),
            Err(why) => {
                tracing::info!(reason = %why, "no DC target: cuObject-dialect targets are reached over HTTP through the agent");
            }
        }
        crate::qp_link::QpHost::new(
            &domain,
            c.fabric.max_queue_pairs as usize,
            c.fabric.path_mtu,
            dc,
        )
    };
    #[allow(unused_mut)]
    let mut background = Vec::new();
    #[cfg(feature = "verbs")]
    background.extend(
        qp_host
            .clone()
            .map(|host| tokio::spawn(crate::qp_link::run(agent.clone(), host))),
    );
    let service = TenantService::new(
        Arc::clone(&registry),
        agent,
        Arc::clone(&endpoints),
        Arc::clone(&metrics),
        Duration::from_secs(c.agent.request_timeout_secs),
    );
    #[cfg(feature = "verbs")]
    let service = service.with_qp_host(qp_host);

    let rings: Arc<dyn socket::Rings> =
        Arc::new(crate::ring::RingHost::new(service.clone(), &c.leases));
    let listener = socket::bind(&c.socket.path, cfg.socket_mode, cfg.socket_gid)?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<ShimConn>(64);
    let accept = tokio::spawn(socket::accept_loop(
        listener,
        registry,
        Arc::clone(&metrics),
        tx,
        Duration::from_secs(c.socket.idle_timeout_secs),
        rings,
    ));
    let incoming = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|c| c.map(Ok::<_, std::io::Error>))
    });
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let limits = method_limits(
        c.tenants
            .iter()
            .map(|t| t.max_batch_items)
            .max()
            .unwrap_or(1),
    );
    let max_message = limits.largest();
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .max_concurrent_streams(c.socket.max_streams_per_connection)
        .http2_max_header_list_size(MAX_HEADER_LIST)
        .layer(AdmissionLayer::new(Arc::clone(&metrics), limits))
        .add_service(
            s3dma_proto::tenant::v1::tenant_server::TenantServer::new(service)
                .max_decoding_message_size(max_message),
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
        metrics_server,
        metrics,
        shutdown,
        server,
        accept,
        background,
        endpoints,
    })
}

/// The shim, as [`s3dma_service::skeleton::main`] runs it.
#[derive(Debug)]
pub struct Shim;

impl s3dma_service::skeleton::Program for Shim {
    const NAME: &'static str = "host-shim";
    type Config = LoadedConfig;
    type LoadError = s3dma_config::ConfigError;
    type StartError = StartError;
    type Running = Running;

    fn load(path: &std::path::Path) -> Result<LoadedConfig, s3dma_config::ConfigError> {
        crate::config::load(path)
    }

    fn worker_threads(cfg: &LoadedConfig) -> Option<usize> {
        cfg.config.runtime.worker_threads
    }

    async fn start(cfg: LoadedConfig) -> Result<Running, StartError> {
        start(cfg).await
    }
}

impl s3dma_service::skeleton::Running for Running {
    fn ready_lines(&self) -> Vec<String> {
        let mut lines = vec![format!("host-shim listening on {}", self.socket.display())];
        lines.extend(
            self.metrics_addr
                .map(|m| format!("metrics on http://{m}/metrics")),
        );
        lines.extend(
            self.metrics_server
                .unix_socket
                .as_ref()
                .map(|p| format!("metrics socket {}", p.display())),
        );
        lines
    }

    async fn wait(&mut self) -> Result<(), s3dma_service::skeleton::ServerStopped> {
        Running::wait(self).await
    }

    async fn shutdown(self) {
        Running::shutdown(self).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tenant_gets_its_own_responder_after_the_base() {
        let text = r#"
socket: { path: /tmp/x.sock }
agent: { endpoint: "http://127.0.0.1:1", token_file: /x }
fabric: { listen: "127.0.0.1:0", fabric_key_file: /x }
tenants:
  - { name: a, uids: [1] }
  - { name: b, uids: [2] }
"#;
        let config = crate::config::parse(std::path::Path::new("t.yaml"), text).unwrap();
        let registry =
            Registry::new(&config, Domain::tcp(), &[], Arc::new(Metrics::new())).unwrap();
        let r = tenant_responders(1, registry.tenants(), 0);
        assert_eq!(r.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![2, 3]);
        assert!(r[0].1.same(&registry.tenants()[0].domain));
        assert!(r[1].1.same(&registry.tenants()[1].domain));
    }
}
