//! Assembling and running the agent from a loaded configuration: metrics,
//! fabric domain and pools, target clients, tenants, and the gRPC server
//! (plain TCP or mTLS) behind its gate ([`crate::gate`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fabric::Domain;
use fabric::pool::{SessionPool, StagingPool};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::auth::ShimAuth;
use crate::config::LoadedConfig;
use crate::gate::{ConnTimeouts, Gate, GatedStream, method_limits};
use crate::metrics::Metrics;
use crate::plan::PutPolicy;
use crate::policy::TenantPolicy;
use crate::quota::{TenantQuota, staging_share};
use crate::retry::RetryPolicy;
use crate::s3::{Signer, TargetClient};
use crate::service::AgentService;
use crate::transfer::{Core, Settings, Tenant};

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The fabric could not be opened (e.g. `verbs` without an RDMA device)
    /// or its staging buffers allocated.
    #[error("fabric: {what}")]
    Fabric {
        /// What failed.
        what: &'static str,
        /// The fabric's error.
        #[source]
        source: fabric::FabricError,
    },
    /// `fabric.staging_buffer_size` does not fit this machine's address space.
    #[error("fabric.staging_buffer_size: too large for this machine")]
    StagingTooLarge,
    /// A target client could not be built.
    #[error("targets")]
    Target(#[from] crate::s3::client::TargetClientError),
    /// A TLS file could not be read.
    #[error("listen.tls: cannot read {}", path.display())]
    TlsFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TLS material was refused.
    #[error("listen.tls")]
    Tls(#[source] tonic::transport::Error),
    /// The metrics endpoint could not be started.
    #[error("{0}")]
    Metrics(#[from] s3dma_service::metrics::MetricsError),
    /// The caps need more file descriptors than `RLIMIT_NOFILE` allows.
    #[error(transparent)]
    FdLimit(#[from] s3dma_service::fds::FdLimitError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A running agent.
#[derive(Debug)]
pub struct Running {
    /// Where shims connect.
    pub grpc_addr: SocketAddr,
    /// Where `/metrics` is served over TCP, if it is.
    pub metrics_addr: Option<SocketAddr>,
    /// The metrics server (stops when dropped); `describe()` says where it
    /// serves.
    pub metrics_server: s3dma_service::metrics::MetricsServer,
    /// The shared state (tests and the bench read metrics from it).
    pub core: Arc<Core>,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Running {
    /// Stops accepting calls, lets running ones finish (bounded by
    /// [`crate::service::SHUTDOWN_GRACE`]) and returns.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(crate::service::SHUTDOWN_GRACE, self.server).await;
    }

    /// Waits until the server stops on its own (it does not, unless it fails).
    ///
    /// # Errors
    /// The server's transport error.
    pub async fn wait(&mut self) -> Result<(), s3dma_service::skeleton::ServerStopped> {
        s3dma_service::skeleton::join_server(&mut self.server).await
    }
}

/// Builds the shared state (no listeners).
///
/// # Errors
/// [`StartError`].
pub fn build_core(cfg: &LoadedConfig, metrics: Arc<Metrics>) -> Result<Arc<Core>, StartError> {
    let c = &cfg.config;
    let domain = Domain::open(c.fabric.backend).map_err(|source| StartError::Fabric {
        what: "opening the fabric",
        source,
    })?;
    let key = cfg.fabric_key.clone();
    let observer: Arc<dyn fabric::pool::PoolObserver> = metrics.clone();
    let staging = StagingPool::new(
        &domain,
        c.fabric.staging_buffers,
        usize::try_from(c.fabric.staging_buffer_size.0).map_err(|_| StartError::StagingTooLarge)?,
        Arc::clone(&observer),
    )
    .map_err(|source| StartError::Fabric {
        what: "allocating staging buffers",
        source,
    })?;
    let sessions = SessionPool::new(
        domain.clone(),
        key,
        Duration::from_millis(c.fabric.connect_timeout_ms),
        c.fabric.max_ops_per_session,
        // The agent's own sessions carry the fallback path's staged bytes;
        // one stream each (the targets' sessions carry the RDMA bulk).
        1,
        observer,
    );
    sessions.spawn_reaper(Duration::from_secs(c.fabric.idle_session_secs));
    let connect_timeout = Duration::from_millis(c.transfer.connect_timeout_ms);
    let mut targets = Vec::new();
    let mut routes = HashMap::new();
    for (i, t) in c.targets.iter().enumerate() {
        targets.push(TargetClient::new(t, connect_timeout)?);
        if t.rdma {
            metrics.parts_over_http(
                &t.name,
                t.multipart_parts == crate::config::MultipartParts::Http,
            );
        }
        for b in &t.buckets {
            routes.entry(b.clone()).or_insert_with(Vec::new).push(i);
        }
    }
    let tenants = cfg
        .tenants
        .iter()
        .map(|t| {
            // A byte quota larger than the tenant's share of the pool is
            // clamped to it on the fallback path (documented at
            // `fabric.tenant_staging_share_percent`).
            let share = staging_share(
                c.fabric.staging_buffers,
                c.fabric.staging_buffer_size.0,
                c.fabric.tenant_staging_share_percent,
                t.quotas.max_bytes_in_flight.0,
            );
            info!(
                tenant = %t.name,
                staging_buffers = share,
                of = c.fabric.staging_buffers,
                "tenant's share of the staging pool (fallback path)"
            );
            (
                t.name.clone(),
                Arc::new(Tenant {
                    name: t.name.clone(),
                    signer: Signer::new(&t.access_key_id, t.secret_access_key.expose()),
                    policy: TenantPolicy::new(&t.allow),
                    quota: TenantQuota::new(&t.quotas, share),
                }),
            )
        })
        .collect();
    let tr = &c.transfer;
    let settings = Settings {
        chunk_size: tr.chunk_size.0,
        max_chunks_in_flight: tr.max_chunks_in_flight,
        put: PutPolicy {
            multipart_threshold: tr.multipart_threshold.0,
            part_size: tr.part_size.0,
        },
        retry: RetryPolicy {
            retries: tr.retries,
            initial: Duration::from_millis(tr.backoff_initial_ms),
            max: Duration::from_millis(tr.backoff_max_ms),
        },
        request_timeout: Duration::from_secs(tr.request_timeout_secs),
        attempt_timeout: Duration::from_secs(tr.attempt_timeout_secs),
        batch_concurrency: tr.batch_concurrency,
        max_batch_items: tr.max_batch_items,
        max_batch_bytes: tr.max_batch_bytes.0,
    };
    Ok(Arc::new(Core {
        targets,
        routes,
        tenants,
        settings,
        staging,
        sessions,
        metrics,
        qp_links: Arc::default(),
        rails: Arc::default(),
    }))
}

/// Starts the agent: binds the gRPC and metrics listeners, then serves.
///
/// # Errors
/// [`StartError`].
pub async fn start(cfg: LoadedConfig) -> Result<Running, StartError> {
    // tonic's TLS server takes rustls's process-wide provider; name it, so
    // the choice never depends on which rustls features the build unified
    // (an error only means one is installed already).
    let _ = rustls::crypto::ring::default_provider().install_default();
    check_fd_limit(&cfg.config)?;
    let metrics = Arc::new(Metrics::new());
    let core = build_core(&cfg, Arc::clone(&metrics))?;
    let c = &cfg.config;
    let render = {
        let m = Arc::clone(&metrics);
        Arc::new(move || m.render()) as s3dma_service::metrics::Render
    };
    let metrics_server = s3dma_service::metrics::MetricsServer::start(
        s3dma_service::metrics::MetricsOptions {
            address: c.metrics.address,
            unix_socket: c.metrics.unix_socket.clone(),
            bearer_token: cfg.metrics_token.clone(),
        },
        render,
    )
    .await?;
    let metrics_addr = metrics_server.address;
    let addr = c.listen.address;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })?;
    let grpc_addr = listener
        .local_addr()
        .map_err(|source| StartError::Bind { addr, source })?;
    let l = &c.listen;
    let mut builder = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .max_concurrent_streams(l.max_concurrent_streams)
        .http2_max_header_list_size(u32::try_from(l.max_header_list_size.0).unwrap_or(u32::MAX))
        // What a connection may send before the agent reads it: request
        // bodies of refused calls are never read, so this bounds what an
        // unauthenticated connection holds.
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW);
    if let Some(tls) = &c.listen.tls {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|source| StartError::TlsFile {
                path: p.to_owned(),
                source,
            })
        };
        let identity =
            tonic::transport::Identity::from_pem(read(&tls.cert_file)?, read(&tls.key_file)?);
        let ca = tonic::transport::Certificate::from_pem(read(&tls.client_ca_file)?);
        let tls_cfg = tonic::transport::ServerTlsConfig::new()
            .identity(identity)
            .client_ca_root(ca)
            // Shims without a certificate may still use bearer tokens.
            .client_auth_optional(true)
            .timeout(OPENING_TIMEOUT);
        builder = builder.tls_config(tls_cfg).map_err(StartError::Tls)?;
    }
    let service = AgentService::new(Arc::clone(&core));
    let limits = method_limits(c.transfer.max_batch_items);
    let gate = Gate::new(
        s3dma_proto::agent::v1::agent_server::AgentServer::new(service)
            .max_decoding_message_size(limits.largest()),
        Arc::new(ShimAuth::new(&cfg.shims)),
        Arc::clone(&metrics),
        limits,
    );
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let incoming = tokio_stream_from(
        listener,
        c.listen.tls.is_some(),
        Accept {
            max_connections: l.max_connections,
            timeouts: ConnTimeouts {
                unauthenticated: Duration::from_secs(l.unauthenticated_timeout_secs),
                idle: Duration::from_secs(l.idle_timeout_secs),
            },
            metrics: Arc::clone(&metrics),
        },
    );
    let router = builder.add_service(gate);
    let server = tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
            .await
    });
    info!(%grpc_addr, tls = c.listen.tls.is_some(), "dpu-agent serving");
    Ok(Running {
        grpc_addr,
        metrics_addr,
        metrics_server,
        core,
        shutdown,
        server,
    })
}

/// File descriptors the agent needs besides those its caps count (the
/// listeners, fabric sessions and endpoint, logs).
const FD_RESERVE: u64 = 512;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and checks that the
/// caps fit: `listen.max_connections` gRPC connections, a target
/// connection per concurrent request of each tenant plus the idle ones
/// kept per target, and each metrics listener's connection cap.
fn check_fd_limit(c: &crate::config::Config) -> Result<(), StartError> {
    let metrics_listeners =
        u64::from(c.metrics.address.is_some()) + u64::from(c.metrics.unix_socket.is_some());
    let need = c.listen.max_connections as u64
        + c.tenants
            .iter()
            .map(|t| t.quotas.max_concurrent_requests as u64)
            .sum::<u64>()
        + c.targets
            .iter()
            .map(|t| t.max_idle_connections as u64)
            .sum::<u64>()
        + metrics_listeners * s3dma_service::metrics::MAX_CONNECTIONS as u64
        + FD_RESERVE;
    s3dma_service::fds::check(
        need,
        &format!(
            "the caps (listen.max_connections, the tenants' quotas.max_concurrent_requests, the targets' max_idle_connections, {} per metrics listener, plus {FD_RESERVE})",
            s3dma_service::metrics::MAX_CONNECTIONS
        ),
        "listen.max_connections or the tenants' quotas.max_concurrent_requests",
    )?;
    Ok(())
}

/// Time a new connection has to open: send the whole HTTP/2 client preface
/// (plaintext) or finish the TLS handshake. tonic's HTTP/2 handshake has no
/// timeout of its own (its keep-alive pings start after it), so a peer that
/// connects and stalls would otherwise hold its connection for ever.
const OPENING_TIMEOUT: Duration = Duration::from_secs(10);

/// HTTP/2 flow-control window of one stream (bytes a peer may send on it
/// before the agent reads).
const STREAM_WINDOW: u32 = 256 << 10;

/// HTTP/2 flow-control window of one connection (all its streams).
const CONNECTION_WINDOW: u32 = 1 << 20;

/// How accepted connections are admitted.
struct Accept {
    max_connections: usize,
    timeouts: ConnTimeouts,
    metrics: Arc<Metrics>,
}

/// The HTTP/2 client preface, the first bytes of every gRPC connection.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Accepted connections as the stream tonic serves. Beyond
/// `listen.max_connections` open ones, a new connection is closed at once.
/// A plaintext connection is handed over once it has sent the HTTP/2
/// preface (or anything else, which tonic refuses at once) and dropped if
/// it stalls before that for [`OPENING_TIMEOUT`]; with TLS, tonic's
/// handshake timeout does the same. Every connection handed over is a
/// [`GatedStream`] (timeouts of [`crate::gate`]). Accepting stops (the
/// listener closes) when tonic drops the stream.
fn tokio_stream_from(
    listener: TcpListener,
    tls: bool,
    accept: Accept,
) -> impl futures::Stream<Item = std::io::Result<GatedStream>> {
    let slots = Arc::new(tokio::sync::Semaphore::new(accept.max_connections.max(1)));
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                () = tx.closed() => break,
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(e) => {
                        // E.g. EMFILE: back off instead of spinning.
                        warn!(error = %e, "accepting a gRPC connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                accept.metrics.connection_closed("refused");
                debug!(
                    max = accept.max_connections,
                    "refusing a gRPC connection: listen.max_connections are open"
                );
                continue;
            };
            let _ = stream.set_nodelay(true);
            let stream =
                GatedStream::new(stream, slot, accept.timeouts, Arc::clone(&accept.metrics));
            let tx = tx.clone();
            tokio::spawn(async move {
                let opened = tls
                    || matches!(
                        tokio::time::timeout(OPENING_TIMEOUT, h2_opening(stream.tcp())).await,
                        Ok(Ok(()))
                    );
                if opened {
                    let _ = tx.send(Ok(stream)).await;
                }
            });
        }
    });
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Waits until the peer has sent the whole HTTP/2 preface, or bytes that
/// cannot begin one.
async fn h2_opening(stream: &tokio::net::TcpStream) -> std::io::Result<()> {
    let mut buf = [0u8; H2_PREFACE.len()];
    loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if n == buf.len() || buf[..n] != H2_PREFACE[..n] {
            return Ok(());
        }
        // Part of the preface so far (peek returns at once while bytes
        // wait): look again shortly.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The agent, as [`s3dma_service::skeleton::main`] runs it.
#[derive(Debug)]
pub struct Agent;

impl s3dma_service::skeleton::Program for Agent {
    const NAME: &'static str = "dpu-agent";
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
        let mut lines = vec![format!("dpu-agent listening on {}", self.grpc_addr)];
        lines.extend(
            self.metrics_server
                .describe()
                .map(|m| format!("metrics on {m}")),
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
