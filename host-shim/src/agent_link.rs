//! The link to the dpu-agent: one gRPC channel, reconnected with backoff.
//!
//! While the agent is unreachable, calls fail at once with UNAVAILABLE
//! (never queue or hang) and a background task reconnects, waiting
//! `backoff_initial_ms` and doubling up to `backoff_max_ms`. A call that
//! fails because the connection broke (an agent restart while idle, say) is
//! retried once on a fresh connection: every agent call is idempotent (GETs
//! place the same bytes, a PUT writes the same object, a DELETE is a DELETE).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use s3dma_proto::agent::v1::agent_client::AgentClient;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};
use tonic_types::StatusExt as _;

use crate::config::AgentConfig;
use crate::error::ShimError;
use crate::metrics::Metrics;

/// How to reach the agent.
#[derive(Debug, Clone)]
pub struct LinkSettings {
    /// The agent's endpoint, TLS included.
    pub endpoint: Endpoint,
    /// `Bearer <token>`, when the shim has a token.
    pub authorization: Option<AsciiMetadataValue>,
    /// First reconnect delay.
    pub backoff_initial: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
}

/// Why the `agent:` section cannot make a connection's settings (the
/// configuration check catches most of these first).
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// tonic refused the endpoint.
    #[error("agent.endpoint")]
    Endpoint(#[source] tonic::transport::Error),
    /// A TLS file cannot be read.
    #[error("agent.tls: cannot read {}", path.display())]
    TlsFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// tonic refused the TLS settings.
    #[error("agent.tls")]
    Tls(#[source] tonic::transport::Error),
    /// The token cannot be sent in a header.
    #[error("agent.token_file: the token has characters a header cannot carry")]
    Token,
}

impl LinkSettings {
    /// From the `agent:` section and the token read from its file.
    ///
    /// # Errors
    /// [`LinkError`]: a malformed endpoint, token or TLS file.
    pub fn from_config(cfg: &AgentConfig, token: Option<&str>) -> Result<LinkSettings, LinkError> {
        let mut endpoint = Endpoint::from_shared(cfg.endpoint.clone())
            .map_err(LinkError::Endpoint)?
            .connect_timeout(Duration::from_millis(cfg.connect_timeout_ms))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(20))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        if let Some(tls) = &cfg.tls {
            let read = |p: &std::path::Path| {
                std::fs::read(p).map_err(|source| LinkError::TlsFile {
                    path: p.to_owned(),
                    source,
                })
            };
            let mut t = tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(read(&tls.ca_file)?));
            if let Some(name) = &tls.server_name {
                t = t.domain_name(name.clone());
            }
            if let (Some(c), Some(k)) = (&tls.cert_file, &tls.key_file) {
                t = t.identity(tonic::transport::Identity::from_pem(read(c)?, read(k)?));
            }
            endpoint = endpoint.tls_config(t).map_err(LinkError::Tls)?;
        }
        let authorization = match token {
            None => None,
            Some(t) => {
                let mut v: AsciiMetadataValue =
                    MetadataValue::try_from(format!("Bearer {t}")).map_err(|_| LinkError::Token)?;
                v.set_sensitive(true);
                Some(v)
            }
        };
        Ok(LinkSettings {
            endpoint,
            authorization,
            backoff_initial: Duration::from_millis(cfg.backoff_initial_ms),
            backoff_max: Duration::from_millis(cfg.backoff_max_ms),
        })
    }
}

/// The shared link.
#[derive(Debug, Clone)]
pub struct AgentLink {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    settings: LinkSettings,
    state: Mutex<State>,
    metrics: Arc<Metrics>,
}

#[derive(Debug)]
enum State {
    /// Connected; `generation` tells a stale failure report from a current one.
    Up { channel: Channel, generation: u64 },
    Down {
        since: Instant,
        error: String,
        reconnecting: bool,
        generation: u64,
    },
}

impl State {
    fn generation(&self) -> u64 {
        match self {
            State::Up { generation, .. } | State::Down { generation, .. } => *generation,
        }
    }
}

impl AgentLink {
    /// Connects once (without failing when the agent is not there yet: the
    /// link then starts down and reconnects in the background).
    pub async fn connect(settings: LinkSettings, metrics: Arc<Metrics>) -> AgentLink {
        let first = settings.endpoint.connect().await;
        let up = first.is_ok();
        let state = match first {
            Ok(channel) => {
                metrics.agent_connected.set(1);
                State::Up {
                    channel,
                    generation: 0,
                }
            }
            Err(e) => State::Down {
                since: Instant::now(),
                error: describe(&e),
                reconnecting: false,
                generation: 0,
            },
        };
        let link = AgentLink {
            inner: Arc::new(Inner {
                settings,
                state: Mutex::new(state),
                metrics,
            }),
        };
        if !up {
            tracing::warn!(
                endpoint = %link.inner.settings.endpoint.uri(),
                "dpu-agent not reachable yet; reconnecting in the background"
            );
            link.start_reconnect();
        }
        link
    }

    /// Whether the link is up now.
    pub fn is_up(&self) -> bool {
        matches!(*self.lock(), State::Up { .. })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn channel(&self) -> Result<(Channel, u64), ShimError> {
        match &*self.lock() {
            State::Up {
                channel,
                generation,
            } => Ok((channel.clone(), *generation)),
            State::Down { since, error, .. } => Err(ShimError::AgentUnavailable(format!(
                "the dpu-agent at {} is unreachable (for {:.1} s: {error}); the shim keeps reconnecting",
                self.inner.settings.endpoint.uri(),
                since.elapsed().as_secs_f64()
            ))),
        }
    }

    /// A client on the current channel and `message` as a request carrying
    /// the shim's credentials, for a long-lived stream (no deadline).
    ///
    /// # Errors
    /// [`ShimError::AgentUnavailable`] while the link is down.
    pub fn authorized<M>(
        &self,
        message: M,
    ) -> Result<(AgentClient<Channel>, Request<M>), ShimError> {
        let (channel, _) = self.channel()?;
        let mut req = Request::new(message);
        if let Some(auth) = &self.inner.settings.authorization {
            req.metadata_mut().insert("authorization", auth.clone());
        }
        Ok((AgentClient::new(channel), req))
    }

    /// Calls the agent with `message`, the request id and a deadline. A
    /// broken connection is retried once on a fresh one, within what is left
    /// of the same deadline.
    ///
    /// # Errors
    /// The agent's status, or UNAVAILABLE (with a `s3dma.shim` reason) when
    /// the agent cannot be reached.
    pub async fn call<M, R, F, Fut>(
        &self,
        message: M,
        request_id: &str,
        timeout: Duration,
        f: F,
    ) -> Result<R, Status>
    where
        M: Clone,
        F: Fn(AgentClient<Channel>, Request<M>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        // (None: a timeout too large to add to now, i.e. no deadline.)
        let deadline = Instant::now().checked_add(timeout);
        let mut retried = false;
        loop {
            let (channel, generation) = self.channel().map_err(|e| e.into_status(request_id))?;
            let client = AgentClient::new(channel).max_decoding_message_size(16 << 20);
            let mut req = Request::new(message.clone());
            req.set_timeout(
                deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now())),
            );
            if let Some(auth) = &self.inner.settings.authorization {
                req.metadata_mut().insert("authorization", auth.clone());
            }
            if let Ok(v) = AsciiMetadataValue::try_from(request_id) {
                req.metadata_mut().insert("x-request-id", v);
            }
            match f(client, req).await {
                Ok(resp) => return Ok(resp.into_inner()),
                Err(status) if is_link_failure(&status) => {
                    tracing::warn!(request_id, error = %s3dma_service::Escaped(status.message()), "dpu-agent link failed");
                    if !retried
                        && self.reconnect_now(generation).await
                        && deadline.is_none_or(|d| Instant::now() < d)
                    {
                        retried = true;
                        continue;
                    }
                    self.mark_down(generation, status.message());
                    return Err(ShimError::AgentUnavailable(format!(
                        "the dpu-agent at {} is unreachable: {}",
                        self.inner.settings.endpoint.uri(),
                        status.message()
                    ))
                    .into_status(request_id));
                }
                Err(status) => return Err(status),
            }
        }
    }

    /// After a broken call on channel `generation`: one immediate connect
    /// attempt. Returns whether the link is up on a newer channel.
    async fn reconnect_now(&self, generation: u64) -> bool {
        if self.lock().generation() != generation {
            // Someone else already replaced (or lost) that channel.
            return self.is_up();
        }
        match self.inner.settings.endpoint.connect().await {
            Ok(channel) => {
                let mut st = self.lock();
                if st.generation() == generation {
                    *st = State::Up {
                        channel,
                        generation: generation + 1,
                    };
                    self.inner.metrics.agent_reconnects.inc();
                    self.inner.metrics.agent_connected.set(1);
                    tracing::info!("reconnected to the dpu-agent");
                }
                matches!(*st, State::Up { .. })
            }
            Err(_) => false,
        }
    }

    fn mark_down(&self, generation: u64, error: &str) {
        {
            let mut st = self.lock();
            if st.generation() != generation || !matches!(*st, State::Up { .. }) {
                return;
            }
            *st = State::Down {
                since: Instant::now(),
                error: error.to_owned(),
                reconnecting: false,
                generation: generation + 1,
            };
        }
        self.inner.metrics.agent_connected.set(0);
        self.start_reconnect();
    }

    fn start_reconnect(&self) {
        {
            let mut st = self.lock();
            match &mut *st {
                State::Down { reconnecting, .. } if !*reconnecting => *reconnecting = true,
                _ => return,
            }
        }
        let link = self.clone();
        tokio::spawn(async move {
            let mut delay = link.inner.settings.backoff_initial;
            loop {
                // Jitter keeps many shims from reconnecting in lockstep.
                let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
                let wait = Duration::from_nanos(nanos / 2 + rand::random_range(0..=nanos / 2));
                tokio::time::sleep(wait).await;
                match link.inner.settings.endpoint.connect().await {
                    Ok(channel) => {
                        let mut st = link.lock();
                        let generation = st.generation() + 1;
                        *st = State::Up {
                            channel,
                            generation,
                        };
                        link.inner.metrics.agent_reconnects.inc();
                        link.inner.metrics.agent_connected.set(1);
                        tracing::info!("reconnected to the dpu-agent");
                        return;
                    }
                    Err(e) => {
                        if let State::Down { error, .. } = &mut *link.lock() {
                            *error = describe(&e);
                        }
                        delay = (delay * 2).min(link.inner.settings.backoff_max);
                    }
                }
            }
        });
    }
}

/// Whether a failed call means the connection (not the agent) failed: the
/// agent's own statuses always carry an `s3dma.agent` ErrorInfo.
fn is_link_failure(status: &Status) -> bool {
    if status
        .get_details_error_info()
        .is_some_and(|i| i.domain == s3dma_proto::AGENT_ERROR_DOMAIN)
    {
        return false;
    }
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled
    )
}

fn describe(e: &tonic::transport::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}
