//! The gateway's upstream: the existing S3 endpoint(s) behind it, called
//! with aws-sdk-s3 as the same user who called the gateway (that user's
//! access key and secret re-sign every request), so the cluster's own
//! policies stay the authority.
//!
//! Endpoints are tried in order from a rotating start: a request that
//! cannot reach one (connect error, timeout, no response) moves on to the
//! next; an answer from the upstream, error or not, is final.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use s3s::{S3Error, S3ErrorCode};

use crate::config::User;
use crate::config::gateway::UpstreamConfig;
use crate::metrics::Metrics;

/// Why the upstream clients could not be built.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The CA file could not be read.
    #[error("upstream.ca_file {path}: {source}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The CA file holds no usable certificate.
    #[error("upstream.ca_file {path}: not a PEM certificate bundle: {message}")]
    CaInvalid {
        /// The file.
        path: PathBuf,
        /// What the TLS library said.
        message: String,
    },
}

/// The clients of every configured user, one per endpoint.
#[derive(Debug)]
pub struct Upstream {
    endpoints: Vec<String>,
    clients: HashMap<String, Vec<aws_sdk_s3::Client>>,
    next: AtomicUsize,
    metrics: Arc<Metrics>,
}

impl Upstream {
    /// Builds the clients (no request is made).
    ///
    /// # Errors
    /// [`UpstreamError`] for an unreadable or invalid CA file.
    pub fn new(
        cfg: &UpstreamConfig,
        region: &str,
        users: &[User],
        metrics: Arc<Metrics>,
    ) -> Result<Self, UpstreamError> {
        let http = match &cfg.ca_file {
            None => https_client(),
            Some(path) => https_client_with_ca(path)?,
        };
        let region = Region::new(cfg.region.clone().unwrap_or_else(|| region.to_owned()));
        let timeouts = aws_sdk_s3::config::timeout::TimeoutConfig::builder()
            .connect_timeout(Duration::from_millis(cfg.connect_timeout_ms))
            .read_timeout(Duration::from_millis(cfg.read_timeout_ms))
            .build();
        let retry =
            aws_sdk_s3::config::retry::RetryConfig::standard().with_max_attempts(cfg.max_attempts);
        let mut clients = HashMap::new();
        for u in users {
            let per_endpoint = cfg
                .endpoints
                .iter()
                .map(|e| {
                    let conf = aws_sdk_s3::Config::builder()
                        .behavior_version(BehaviorVersion::latest())
                        .http_client(http.clone())
                        .endpoint_url(e)
                        .region(region.clone())
                        .credentials_provider(Credentials::new(
                            &u.access_key_id,
                            &u.secret,
                            None,
                            None,
                            "s3dma-gateway",
                        ))
                        .force_path_style(true)
                        .timeout_config(timeouts.clone())
                        .retry_config(retry.clone())
                        // The gateway forwards the caller's checksums; it
                        // adds none of its own.
                        .request_checksum_calculation(
                            aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired,
                        )
                        .response_checksum_validation(
                            aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired,
                        )
                        .build();
                    aws_sdk_s3::Client::from_conf(conf)
                })
                .collect();
            clients.insert(u.access_key_id.clone(), per_endpoint);
        }
        Ok(Upstream {
            endpoints: cfg.endpoints.clone(),
            clients,
            next: AtomicUsize::new(0),
            metrics,
        })
    }

    /// The endpoints.
    #[must_use]
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// `user`'s clients in the order this request tries them.
    fn order(&self, user: &str) -> Result<Vec<&aws_sdk_s3::Client>, S3Error> {
        let all = self.clients.get(user).ok_or_else(|| {
            S3Error::with_message(
                S3ErrorCode::AccessDenied,
                "Access Denied (the request was not signed by a configured user)",
            )
        })?;
        let start = self.next.fetch_add(1, Ordering::Relaxed) % all.len().max(1);
        Ok(all[start..].iter().chain(&all[..start]).collect())
    }

    /// Runs `call` with `user`'s clients, moving to the next endpoint while
    /// it cannot reach one; records the latency and errors as `op`.
    ///
    /// # Errors
    /// The upstream's answer as an S3 error ([`to_s3_error`]); access denied
    /// for an unknown user.
    pub async fn call<T, E, F, Fut>(
        &self,
        user: &str,
        op: &'static str,
        call: F,
    ) -> Result<T, S3Error>
    where
        F: Fn(aws_sdk_s3::Client) -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let clients = self.order(user)?;
        let mut last = None;
        for c in clients {
            let started = Instant::now();
            match call(c.clone()).await {
                Ok(v) => {
                    self.metrics.upstream(op, started.elapsed(), None);
                    return Ok(v);
                }
                Err(e) => {
                    let kind = error_kind(&e);
                    self.metrics.upstream(op, started.elapsed(), Some(&kind));
                    let unreachable = is_unreachable(&e);
                    last = Some(to_s3_error(e, op));
                    if !unreachable {
                        break;
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| S3Error::new(S3ErrorCode::InternalError)))
    }

    /// Runs `call` once, on the first endpoint of the rotation: for
    /// requests whose body can be sent only once (an RDMA PUT's stream).
    ///
    /// # Errors
    /// As [`Upstream::call`].
    pub async fn call_once<T, E, F, Fut>(
        &self,
        user: &str,
        op: &'static str,
        call: F,
    ) -> Result<T, S3Error>
    where
        F: FnOnce(aws_sdk_s3::Client) -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let client = self
            .order(user)?
            .into_iter()
            .next()
            .cloned()
            .ok_or_else(|| S3Error::new(S3ErrorCode::InternalError))?;
        let started = Instant::now();
        match call(client).await {
            Ok(v) => {
                self.metrics.upstream(op, started.elapsed(), None);
                Ok(v)
            }
            Err(e) => {
                self.metrics
                    .upstream(op, started.elapsed(), Some(&error_kind(&e)));
                Err(to_s3_error(e, op))
            }
        }
    }

    /// `user`'s s3s proxies (one per endpoint) in the order this request
    /// tries them, for operations forwarded as they are.
    ///
    /// # Errors
    /// Access denied for an unknown user.
    pub fn proxies(&self, user: &str) -> Result<Vec<s3s_aws::Proxy>, S3Error> {
        Ok(self
            .order(user)?
            .into_iter()
            .map(|c| s3s_aws::Proxy::from(c.clone()))
            .collect())
    }

    /// The metrics.
    #[must_use]
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

/// The HTTPS client of every aws-sdk-s3 client in the workspace (the
/// gateway's, the launcher's, the tools' and the tests'): aws-smithy's
/// hyper client with rustls on ring and the webpki roots. aws-sdk-s3 is
/// built without its default client (aws-lc and a second hyper stack).
#[must_use]
pub fn https_client() -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    use aws_smithy_http_client::tls;
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

fn https_client_with_ca(
    path: &std::path::Path,
) -> Result<aws_smithy_runtime_api::client::http::SharedHttpClient, UpstreamError> {
    use aws_smithy_http_client::tls;
    let pem = std::fs::read(path).map_err(|source| UpstreamError::CaFile {
        path: path.to_owned(),
        source,
    })?;
    let ctx = tls::TlsContext::builder()
        .with_trust_store(tls::TrustStore::empty().with_pem_certificate(pem))
        .build()
        .map_err(|e| UpstreamError::CaInvalid {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
    Ok(aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .tls_context(ctx)
        .build_https())
}

/// Whether the request never got an answer from this endpoint (worth
/// trying the next one).
fn is_unreachable<E>(e: &SdkError<E, HttpResponse>) -> bool {
    matches!(
        e,
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_)
    )
}

/// The metric label of an upstream failure.
fn error_kind<E: ProvideErrorMetadata>(e: &SdkError<E, HttpResponse>) -> String {
    match e {
        SdkError::TimeoutError(_) => "timeout".into(),
        SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => "transport".into(),
        SdkError::ServiceError(s) => s.err().code().map_or_else(
            || s.raw().status().as_u16().to_string(),
            |c| {
                // Codes become label values: keep them short and plain.
                c.chars()
                    .filter(char::is_ascii_alphanumeric)
                    .take(64)
                    .collect()
            },
        ),
        _ => "other".into(),
    }
}

/// The S3 error the gateway answers for an upstream failure: the
/// upstream's own code, message and status when it answered (HEAD's bodiless
/// 404 becomes `NoSuchKey`), `503 ServiceUnavailable` when it could not be
/// reached. The source is kept for the logs.
#[must_use]
pub fn to_s3_error<E>(e: SdkError<E, HttpResponse>, op: &str) -> S3Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let mut err = match &e {
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            let code = match (s.err().code(), status) {
                (Some(c), _) if c != "NotFound" => S3ErrorCode::from_bytes(c.as_bytes())
                    .unwrap_or_else(|| S3ErrorCode::Custom(c.to_owned().into())),
                (_, 404) => S3ErrorCode::NoSuchKey,
                (_, 304) => S3ErrorCode::NotModified,
                (_, 412) => S3ErrorCode::PreconditionFailed,
                (_, 403) => S3ErrorCode::AccessDenied,
                (_, 400) => S3ErrorCode::InvalidRequest,
                _ => S3ErrorCode::InternalError,
            };
            let message = s.err().message().map_or_else(
                || format!("the upstream S3 endpoint answered {status} to {op}"),
                str::to_owned,
            );
            let mut err = S3Error::with_message(code, message);
            if let Ok(st) = http::StatusCode::from_u16(status) {
                err.set_status_code(st);
            }
            err
        }
        SdkError::TimeoutError(_) => S3Error::with_message(
            S3ErrorCode::ServiceUnavailable,
            format!("the upstream S3 endpoint did not answer {op} in time; retry later"),
        ),
        _ => S3Error::with_message(
            S3ErrorCode::ServiceUnavailable,
            format!("the upstream S3 endpoint could not be reached for {op}; retry later"),
        ),
    };
    if matches!(err.code(), S3ErrorCode::ServiceUnavailable) {
        err.set_status_code(http::StatusCode::SERVICE_UNAVAILABLE);
    }
    err.set_source(Box::new(e));
    err
}

/// An interceptor that keeps the `Date` of the upstream's answer (whole
/// seconds since the epoch, the upstream's clock): the SDK's outputs do not
/// carry it. Clones share the value; the last answer of a retried request
/// wins.
#[derive(Debug, Clone, Default)]
pub struct DateOfAnswer(Arc<std::sync::Mutex<Option<i64>>>);

impl DateOfAnswer {
    /// The answer's `Date`, if one came with a parseable value.
    #[must_use]
    pub fn get(&self) -> Option<i64> {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl aws_smithy_runtime_api::client::interceptors::Intercept for DateOfAnswer {
    fn name(&self) -> &'static str {
        "DateOfAnswer"
    }

    fn read_before_deserialization(
        &self,
        context: &aws_smithy_runtime_api::client::interceptors::context::BeforeDeserializationInterceptorContextRef<'_>,
        _runtime_components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        _cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let date = context
            .response()
            .headers()
            .get("date")
            .and_then(|d| httpdate::parse_http_date(d).ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_secs()).ok());
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = date;
        Ok(())
    }
}
