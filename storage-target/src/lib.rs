//! The s3dma storage-target: an S3-compatible object server over HTTP/1.1
//! with a crash-safe filesystem store.
//!
//! Modules, outside in:
//! - [`config`]: the YAML configuration file, with every section (a leaf:
//!   it imports no other module of the crate).
//! - [`server`]: hyper serving, request ids, metrics wrapping, graceful shutdown.
//! - [`auth`]: users (SigV4 secrets), bucket owners, ACLs and operator
//!   grants: who may do what.
//! - [`acl`]: the ACL model, canned ACLs, grant headers (pure).
//! - [`s3`]: the `s3s::S3` implementation of the filesystem store (a thin
//!   `impl S3` delegating to one module per concern), DTOs to store calls,
//!   store errors to S3 errors.
//! - [`attributes`]: GetObjectAttributes from stored metadata.
//! - [`checksum`]: S3 flexible checksums (CRC32, CRC32C, CRC64NVME, SHA1,
//!   SHA256): request checks, stored values, multipart COMPOSITE and
//!   FULL_OBJECT checksums.
//! - [`store`]: the filesystem store and its pure helpers (ranges, conditions,
//!   listing, ETags, bucket names, on-disk format).
//! - [`gateway`]: `store: s3`, the same S3 API in front of an existing S3
//!   endpoint: identity passed through, a read cache in registered memory
//!   (eviction [`gateway::policy`], single flight), RDMA writes streamed
//!   through.
//! - [`rdma`]: GetObject/PutObject/UploadPart over RDMA (`x-amz-rdma-token`):
//!   staging pool, session pool, pipelined transfers.
//! - [`metrics`]: Prometheus metrics (served at `/metrics` by
//!   [`s3dma_service::metrics::MetricsServer`]).
//!
//! s3s does the S3 protocol work: routing, XML, SigV4 (header and presigned)
//! verification, aws-chunked decoding and clock-skew checks.

#![warn(missing_docs)]

pub mod acl;
pub mod attributes;
pub mod auth;
pub mod checksum;
pub mod config;
pub mod dialect;
pub mod gateway;
pub mod http;
pub mod metrics;
pub mod precheck;
pub mod rdma;
pub mod s3;
pub mod server;
pub mod store;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::info;

use dialect::hipobj;

/// Errors that stop the server from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The store could not be opened.
    #[error("opening the data directory failed: {0}")]
    Store(#[from] store::StoreError),
    /// The gateway (`store: s3`) could not start.
    #[error(transparent)]
    Gateway(#[from] gateway::GatewayError),
    /// The metrics server could not start.
    #[error(transparent)]
    Metrics(#[from] s3dma_service::metrics::MetricsError),
    /// The metrics socket's directory is not safe (others could replace it).
    #[error("metrics.unix_socket: {0}")]
    MetricsDir(s3dma_service::private::PrivateError),
    /// The caps need more file descriptors than `RLIMIT_NOFILE` allows.
    #[error(transparent)]
    FdLimit(#[from] s3dma_service::fds::FdLimitError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The error.
        source: std::io::Error,
    },
}

/// Builds the s3s service for a store, users and the RDMA service.
#[must_use]
pub fn build_service(
    store: Arc<store::Store>,
    cfg: &config::Config,
    users: Vec<config::User>,
    rdma: Arc<rdma::RdmaService>,
) -> s3s::service::S3Service {
    let users = auth::Users::new(users);
    let front = s3::S3Api::new(
        Arc::clone(&store),
        cfg.region.clone(),
        users.clone(),
        Arc::clone(&rdma),
    );
    let access = auth::AccessCheck::new(users.clone(), store);
    let mut b = s3s::service::S3ServiceBuilder::new(front.clone());
    let batch = dialect::s3dma_batch::BatchRoute::store(
        front.clone(),
        access.clone(),
        cfg.rdma.batch,
        rdma.enabled(),
        Arc::clone(rdma.metrics()),
    );
    #[cfg(feature = "verbs")]
    let control = hipobj::route(
        cfg,
        &rdma,
        hipobj::StoreFront::shared(front, access.clone()),
    );
    #[cfg(not(feature = "verbs"))]
    let control = hipobj::HipobjUnsupported(hipobj::NO_VERBS_FEATURE);
    b.set_route(dialect::s3dma_batch::Routes::new(batch, control));
    finish(b, cfg, users, access)
}

/// What both services end with: the control path's bucket-name rule, the
/// users' SigV4 secrets, the access check, and the presigned URLs' clock
/// skew.
fn finish(
    mut b: s3s::service::S3ServiceBuilder,
    cfg: &config::Config,
    users: auth::Users,
    access: impl s3s::access::S3Access,
) -> s3s::service::S3Service {
    b.set_validation(hipobj::ControlPathNames);
    b.set_auth(users);
    b.set_access(access);
    let mut s3cfg = s3s::config::S3Config::default();
    s3cfg.presigned_url_max_skew_time_secs = cfg.max_clock_skew_secs;
    b.set_config(Arc::new(s3s::config::StaticConfigProvider::new(Arc::new(
        s3cfg,
    ))));
    b.build()
}

/// Builds the s3s service of the gateway (`store: s3`).
#[must_use]
pub fn build_gateway_service(
    gateway: gateway::Gateway,
    cfg: &config::Config,
    users: Vec<config::User>,
    rdma: &Arc<rdma::RdmaService>,
) -> s3s::service::S3Service {
    let users = auth::Users::new(users);
    let access = gateway::GatewayAccess::new(users.clone());
    #[cfg(feature = "verbs")]
    let route = hipobj::route(
        cfg,
        rdma,
        hipobj::GatewayFront::shared(gateway.clone(), access.clone(), users.clone()),
    );
    #[cfg(not(feature = "verbs"))]
    let route = {
        let _ = rdma;
        hipobj::HipobjUnsupported(hipobj::NO_VERBS_FEATURE)
    };
    let mut b = s3s::service::S3ServiceBuilder::new(gateway);
    let batch = dialect::s3dma_batch::BatchRoute::declined(
        "the gateway (store: s3) serves single requests only",
    );
    b.set_route(dialect::s3dma_batch::Routes::new(batch, route));
    finish(b, cfg, users, access)
}

/// A loaded configuration: the file's path, the file, its users with their
/// secrets, and the fabric key when RDMA is enabled.
#[derive(Debug)]
pub struct Loaded {
    /// The configuration file (in error messages).
    pub path: std::path::PathBuf,
    /// The file, as parsed.
    pub config: config::Config,
    /// The users, with their secrets read.
    pub users: Vec<config::User>,
    /// The fabric key, when `rdma.mode` is enabled.
    pub fabric_key: Option<fabric::FabricKey>,
}

/// Reads and validates everything [`start`] needs from the configuration
/// file (YAML, every field, the users' secrets, the fabric key file),
/// without opening the store or binding any socket: what
/// `storage-target --check` runs.
///
/// # Errors
/// [`StartError::Config`] naming the file and the field.
pub fn load(config_path: &Path) -> Result<Loaded, StartError> {
    let (config, users) = config::Config::load(config_path)?;
    let fabric_key = config.rdma.validate(&config_path.display().to_string())?;
    Ok(Loaded {
        path: config_path.to_owned(),
        config,
        users,
        fabric_key,
    })
}

/// Aborts, periodically, the multipart uploads older than
/// `multipart.abort_incomplete_after` (none when it is 0), until `shutdown`.
fn spawn_upload_sweeper(
    store: &Arc<store::Store>,
    cfg: &store::MultipartConfig,
    shutdown: CancellationToken,
) {
    let (Some(age), Some(every)) = (cfg.abort_after(), cfg.sweep_interval()) else {
        return;
    };
    let store = Arc::clone(store);
    let age_ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            let n = store
                .sweep_uploads(store::now_ms().saturating_sub(age_ms))
                .await;
            if n > 0 {
                info!(aborted = n, "swept incomplete multipart uploads");
            }
        }
    });
}

/// A running storage-target: serving until [`Running::shutdown`].
#[derive(Debug)]
pub struct Running {
    /// Where S3 clients connect.
    pub addr: std::net::SocketAddr,
    /// The metrics server (stops when dropped); `describe()` says where it
    /// serves.
    pub metrics_server: s3dma_service::metrics::MetricsServer,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops accepting connections, lets in-flight requests finish (up to
    /// 30 s), stops the background tasks and the metrics server.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        if !self.server.is_finished() {
            let _ = (&mut self.server).await;
        }
    }
}

impl s3dma_service::skeleton::Running for Running {
    fn ready_lines(&self) -> Vec<String> {
        let mut lines = vec![format!("storage-target listening on http://{}", self.addr)];
        lines.extend(
            self.metrics_server
                .describe()
                .map(|m| format!("metrics on {m}")),
        );
        lines
    }

    async fn wait(&mut self) -> Result<(), s3dma_service::skeleton::ServerStopped> {
        (&mut self.server)
            .await
            .map_err(s3dma_service::skeleton::ServerStopped::HttpTask)
    }

    async fn shutdown(self) {
        Running::shutdown(self).await;
    }
}

/// The storage-target, as [`s3dma_service::skeleton::main`] runs it.
#[derive(Debug)]
pub struct Target;

impl s3dma_service::skeleton::Program for Target {
    const NAME: &'static str = "storage-target";
    const LOG_FILTER: &'static str = "info,s3s=off";
    type Config = Loaded;
    type LoadError = StartError;
    type StartError = StartError;
    type Running = Running;

    fn load(path: &Path) -> Result<Loaded, StartError> {
        load(path)
    }

    fn worker_threads(loaded: &Loaded) -> Option<usize> {
        loaded.config.runtime.worker_threads
    }

    async fn start(loaded: Loaded) -> Result<Running, StartError> {
        start(loaded).await
    }

    /// The error as it is: those about the configuration name the file.
    fn start_error(_config: &Path, e: &StartError) -> String {
        e.to_string()
    }
}

/// Opens the store, binds the listeners and starts serving, until
/// [`Running::shutdown`].
///
/// # Errors
/// [`StartError`] if anything fails before serving starts.
pub async fn start(loaded: Loaded) -> Result<Running, StartError> {
    let shutdown = CancellationToken::new();
    let Loaded {
        path: config_path,
        config: cfg,
        users,
        fabric_key: key,
    } = loaded;
    s3dma_service::fds::check(
        cfg.fd_budget(),
        &format!(
            "the caps (2 x max_connections, {} per metrics listener, plus {})",
            s3dma_service::metrics::MAX_CONNECTIONS,
            config::FD_RESERVE
        ),
        "max_connections",
    )?;
    let metrics = Arc::new(metrics::Metrics::new());
    let rdma = Arc::new(rdma::RdmaService::start(
        &cfg.rdma,
        key,
        Arc::clone(&metrics),
    ));
    let control = dialect::hipobj::ControlAuth::new(
        auth::Users::new(users.clone()),
        &cfg.region,
        cfg.max_clock_skew_secs,
    );
    let (service, serving) = match cfg.backend(&config_path.display().to_string())? {
        config::StoreBackend::S3 { upstream, cache } => {
            let g = gateway::Gateway::new(upstream, cache, &cfg.region, &users, Arc::clone(&rdma))?;
            let upstream = upstream.endpoints.join(",");
            (
                build_gateway_service(g, &cfg, users, &rdma),
                format!("upstream {upstream}"),
            )
        }
        config::StoreBackend::Filesystem {
            data_dir,
            multipart,
        } => {
            let dir = data_dir.to_owned();
            let limits = *multipart;
            let store = tokio::task::spawn_blocking(move || store::Store::open_with(&dir, limits))
                .await
                .map_err(|e| store::StoreError::Io(std::io::Error::other(e)))??;
            let store = Arc::new(store);
            spawn_upload_sweeper(&store, multipart, shutdown.clone());
            let service = build_service(store, &cfg, users, rdma);
            (service, format!("data_dir {}", data_dir.display()))
        }
    };
    let handler = http::Handler::new(
        service,
        Arc::clone(&metrics),
        &cfg.region,
        precheck::AuthOptions {
            allow_sigv2: cfg.allow_sigv2,
            max_clock_skew_secs: cfg.max_clock_skew_secs,
        },
    )
    .with_max_aws_chunk_size(cfg.max_aws_chunk_size.0)
    .with_control_auth(control);

    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| StartError::Bind {
            addr: cfg.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: cfg.listen,
        source,
    })?;
    let opts = cfg.metrics_options(&config_path.display().to_string())?;
    if let Some(dir) = opts
        .unix_socket
        .as_deref()
        .and_then(Path::parent)
        .filter(|d| !d.as_os_str().is_empty())
    {
        s3dma_service::private::check_socket_dir(dir, &[s3dma_service::private::current_uid(), 0])
            .map_err(StartError::MetricsDir)?;
    }
    let render_from = Arc::clone(&metrics);
    let metrics_server =
        s3dma_service::metrics::MetricsServer::start(opts, Arc::new(move || render_from.render()))
            .await?;
    info!(%addr, region = %cfg.region, store = %serving, "storage-target ready");
    let server = tokio::spawn(server::serve(
        listener,
        handler,
        shutdown.clone(),
        Duration::from_secs(30),
        cfg.max_connections,
        cfg.connections.clone(),
    ));
    Ok(Running {
        addr,
        metrics_server,
        shutdown,
        server,
    })
}
