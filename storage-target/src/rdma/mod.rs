//! GetObject, PutObject and UploadPart over RDMA (`x-amz-rdma-token`).
//!
//! The request stays an ordinary SigV4-signed S3 request; the object bytes
//! move by one-sided RDMA between registered staging buffers of this server
//! and the requester's memory named by the token (see the `fabric` crate).
//!
//! # Wire protocol (as matched)
//!
//! This follows the public S3-over-RDMA draft used by NVIDIA cuObject and its
//! aws-c-s3 fork (`RDMA_PROTOCOL_SPEC.md`, v1.0, October 2025), MinIO AIStor
//! and NooBaa (`docs/design/S3-over-RDMA.md`):
//!
//! * Request: `x-amz-rdma-token: <token>` (the cuObject 81-character format,
//!   [`fabric::token`]), which MUST be among the SigV4 signed headers
//!   (`SignedHeaders=` of `Authorization`, or `X-Amz-SignedHeaders` of a
//!   presigned URL); otherwise `403 AccessDenied` and nothing is
//!   transferred. PUT/UploadPart: `Content-Length: 0`, empty body,
//!   `x-amz-content-sha256: UNSIGNED-PAYLOAD` (or the empty-body hash); the
//!   object length is the token's size. `x-amz-checksum-*` (and Content-MD5)
//!   are checked over the bytes read by RDMA, as over HTTP.
//! * GET success: HTTP `200` or `206` (ranged), `x-amz-rdma-reply: 200|206`,
//!   `x-amz-rdma-bytes-transferred: N`, `Content-Length: 0`, empty body, all
//!   usual object headers (ETag, Last-Modified, Content-Range, metadata).
//!   The HTTP status equals the reply code (spec §8.2).
//! * PUT/UploadPart success: HTTP `200`, `x-amz-rdma-reply: 200`, ETag, empty body.
//! * Dialect: s3dma's own exchange (the token's fields name an s3dma fabric
//!   endpoint) only with the signed marker `x-amz-rdma-protocol: s3dma-v1`.
//!   A standard token (no marker: the cuObject dialect, a DC target in the
//!   client's memory, which this server cannot reach), a raw hipobj-rc-v2
//!   token, or a marker naming another dialect is declined as below.
//! * PUT/UploadPart success also carries `x-amz-rdma-bytes-transferred`
//!   (the token's size).
//! * Declined (a token as above, `rdma: disabled`, or the fabric is
//!   unavailable): `x-amz-rdma-reply: 501` and
//!   `x-amz-rdma-protocol-status: unsupported`. A GET then carries the object in the HTTP body
//!   (HTTP 200/206). A PUT/UploadPart stores nothing and answers HTTP `200`
//!   with `x-amz-rdma-reply: 501` and an XML error body with code
//!   `RDMANotSupported` (spec §3.3: "HTTP status code MUST be 200 (operation
//!   did not succeed)"; the client retries over HTTP). No ETag is returned.
//! * Invalid token: HTTP `400 InvalidRDMAToken`, no `x-amz-rdma-reply`
//!   (spec §7.1). Transfer failure: `RDMATransferFailed` (spec §7.2), HTTP
//!   `500` for transport failures (unreachable endpoint, connection lost) and
//!   HTTP `400` when the client's memory refused the operation (wrong rkey,
//!   revoked or too small window); no `x-amz-rdma-reply`. We do not fall back
//!   to the HTTP body after a failed GET: the requester's memory may hold
//!   partial data, so the failure must be visible.
//! * A GET whose object (or range) exceeds the token's size fails with
//!   `400 InvalidRequest` before anything is written; a smaller object is
//!   written at the start of the token's memory and reported by
//!   `x-amz-rdma-bytes-transferred`.
//!
//! Which dialect serves a tokened request, and whether the endpoint its token
//! names may be reached, is decided once in [`crate::dialect`]; this module
//! is the data path that moves the bytes as that [`Decision`] says.
//!
//! # Modules
//! * [`headers`]: pure helpers (signed-header check, request shape, sizes,
//!   chunking, reply headers).
//! * [`transfer`]: pipelined disk→WRITE and READ→disk.
//! * [`backoff`]: an (S3 user, endpoint) whose connect was refused backs
//!   off: its next requests fail at once, without dialing.
//! * [`path`]: one request's data path ([`DataPath`]), shared by the
//!   filesystem store's S3 front end and the gateway.
//!
//! The staging buffers (one registered region) and the sessions pooled per
//! endpoint (connect timeout, idle reaper) are [`fabric::pool`]'s, reporting
//! to [`Metrics`] through [`fabric::pool::PoolObserver`]; sizes are read
//! with [`s3dma_config`] and the fabric key file with [`fabric::config`].

pub mod backoff;
pub mod error;
pub mod headers;
pub mod path;
mod rails;
pub mod share;
pub mod transfer;

use std::sync::Arc;
use std::time::Duration;

use fabric::pool::{ConnectError, SessionPool, StagingPool};
use fabric::{Domain, FabricKey, RdmaToken};
use http::{HeaderMap, HeaderValue, StatusCode};
use s3s::{S3Error, S3ErrorCode};
use tokio::sync::Semaphore;
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
use crate::store::ObjectReader;

pub use crate::config::networks;
pub use crate::config::rdma::{RdmaConfig, RdmaMode};
pub use error::RdmaError;
pub use path::DataPath;

use crate::dialect::{ClientNetworks, Decision, Declined, Dialect, Serving};

#[derive(Debug)]
struct Fabric {
    /// The local rails (`rdma.rails`; one without it).
    rails: rails::Rails,
    total_ops: Arc<Semaphore>,
    put_budget: Arc<Semaphore>,
    depth: usize,
    shares: share::Shares,
    progress: Duration,
    /// (user, endpoint) pairs whose connect was refused back off.
    gate: backoff::Gate,
}

/// The RDMA side of the target, shared by all requests.
#[derive(Debug)]
pub struct RdmaService {
    fabric: Option<Fabric>,
    declined: &'static str,
    metrics: Arc<Metrics>,
    /// `rdma.allowed_client_networks`.
    networks: ClientNetworks,
}

impl RdmaService {
    /// A service that declines every RDMA request.
    #[must_use]
    pub fn disabled(metrics: Arc<Metrics>) -> Self {
        RdmaService {
            fabric: None,
            declined: "RDMA is disabled on this server",
            metrics,
            networks: ClientNetworks::default(),
        }
    }

    /// Starts the service from validated config (`key` from
    /// [`RdmaConfig::validate`]). Must run in a tokio runtime. A fabric that
    /// cannot be opened is logged and leaves the service declining (501).
    #[must_use]
    pub fn start(cfg: &RdmaConfig, key: Option<FabricKey>, metrics: Arc<Metrics>) -> Self {
        let (RdmaMode::Enabled, Some(key)) = (cfg.mode, key) else {
            return Self::disabled(metrics);
        };
        let backend = cfg.backend;
        let unavailable = |metrics| RdmaService {
            fabric: None,
            declined: "the RDMA fabric is unavailable on this server",
            metrics,
            networks: ClientNetworks::default(),
        };
        // One domain, staging pool and session pool per local rail.
        let devices: Vec<Option<&fabric::rail::DeviceRail>> = if cfg.rails.is_empty() {
            vec![None]
        } else {
            cfg.rails.iter().map(Some).collect()
        };
        let sums = rails::RailSums::new(devices.len());
        let mut local = Vec::with_capacity(devices.len());
        for (i, device) in devices.iter().enumerate() {
            let domain = match Domain::open_on(backend, *device) {
                Ok(d) => d,
                Err(e) => {
                    warn!(error = %e, ?backend, rail = i, "RDMA fabric unavailable: declining RDMA requests (x-amz-rdma-reply: 501)");
                    return unavailable(metrics);
                }
            };
            let observer: Arc<dyn fabric::pool::PoolObserver> = if devices.len() == 1 {
                Arc::clone(&metrics) as _
            } else {
                Arc::new(rails::RailObserver {
                    metrics: Arc::clone(&metrics),
                    rail: i,
                    sums: Arc::clone(&sums),
                })
            };
            let size = usize::try_from(cfg.staging_buffer_size.0).unwrap_or(usize::MAX);
            let pool = match StagingPool::new(
                &domain,
                cfg.staging_buffers,
                size,
                Arc::clone(&observer),
            ) {
                Ok(p) => p,
                Err(e) => {
                    warn!(error = %e, rail = i, "registering the RDMA staging pool failed: declining RDMA requests (x-amz-rdma-reply: 501)");
                    return unavailable(metrics);
                }
            };
            let sessions = SessionPool::new(
                domain.clone(),
                key.clone(),
                Duration::from_millis(cfg.connect_timeout_ms),
                cfg.max_ops_per_session,
                cfg.tcp_streams,
                Arc::clone(&observer),
            );
            sessions.spawn_reaper(Duration::from_secs(cfg.idle_session_secs));
            // Sessions to DC targets (standard tokens) over this rail's
            // device, when it does DC.
            let dc = crate::dialect::cuobject_dc::sessions(cfg, &domain, &key, &observer);
            if let Some(dc) = &dc {
                dc.spawn_reaper(Duration::from_secs(cfg.idle_session_secs));
            }
            if let Some(d) = device {
                info!(rail = i, device = %s3dma_service::escape::Escaped(&d.device), port = d.port, gid = ?domain.gid_address(), "RDMA rail open");
            }
            local.push(rails::Rail {
                domain,
                pool,
                sessions,
                dc,
            });
        }
        let rails = rails::Rails::new(local);
        let size = usize::try_from(cfg.staging_buffer_size.0).unwrap_or(usize::MAX);
        let cap = share::cap(cfg.staging_buffers, cfg.max_staging_share).unwrap_or(1);
        let shared_cap = share::cap(cfg.staging_buffers, cfg.max_shared_staging_share).unwrap_or(1);
        metrics.staging_share_cap(cap);
        metrics.staging_shared_class_cap(shared_cap);
        let depth = cfg
            .max_ops_per_session
            .min(cfg.staging_buffers.div_ceil(2))
            .min(cap)
            .clamp(1, 16);
        info!(
            ?backend,
            rails = devices.len(),
            staging_buffers_per_rail = cfg.staging_buffers,
            staging_buffer_size = size,
            staging_buffers_per_client = cap,
            staging_buffers_shared_class = shared_cap,
            tenant_users = cfg.tenant_users.len(),
            "RDMA serving enabled"
        );
        RdmaService {
            fabric: Some(Fabric {
                rails,
                total_ops: Arc::new(Semaphore::new(cfg.max_ops_total)),
                put_budget: Arc::new(Semaphore::new(cfg.staging_buffers)),
                depth,
                shares: share::Shares::new(cap, shared_cap, cfg.tenant_users.iter().cloned()),
                progress: Duration::from_secs(cfg.progress_timeout_secs),
                gate: backoff::Gate::default(),
            }),
            declined: "",
            metrics,
            networks: ClientNetworks::new(cfg.allowed_client_networks.clone()),
        }
    }

    /// The metrics.
    #[must_use]
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Decides how to serve a request: refuses a token that is not among
    /// the SigV4 signed headers s3s verified (anonymous and SigV2 requests
    /// never sign one), whatever the mode; when RDMA is on, a malformed
    /// token and one naming an endpoint outside
    /// `rdma.allowed_client_networks`.
    ///
    /// # Errors
    /// [`RdmaError::NotSigned`], [`RdmaError::InvalidToken`],
    /// [`RdmaError::EndpointNotAllowed`], duplicate tokens.
    pub fn decide<T>(&self, req: &s3s::S3Request<T>) -> Result<Decision, RdmaError> {
        let signed =
            crate::precheck::verified_signed_headers(req.credentials.as_ref(), &req.extensions);
        self.decide_signed(&req.headers, signed)
    }

    /// [`RdmaService::decide`] for a request whose verified SigV4 signed
    /// headers are `signed` (empty: not signed with SigV4).
    ///
    /// # Errors
    /// As [`RdmaService::decide`].
    pub fn decide_signed(
        &self,
        headers: &HeaderMap,
        signed: &[String],
    ) -> Result<Decision, RdmaError> {
        let serving = Serving {
            fabric: self.fabric.is_some(),
            dc: self.fabric.as_ref().is_some_and(|f| f.rails.any_dc()),
            networks: &self.networks,
        };
        crate::dialect::decide(headers, signed, &serving)
    }

    /// `rdma.allowed_client_networks` (the hipobj-rc-v2 server checks a
    /// client QP's GID against them).
    #[must_use]
    pub fn client_networks(&self) -> &ClientNetworks {
        &self.networks
    }

    fn fabric(&self) -> Result<&Fabric, RdmaError> {
        self.fabric
            .as_ref()
            .ok_or_else(|| RdmaError::Internal("RDMA fabric not available".into()))
    }

    /// Every rail's domain, rail 0 first, when the fabric is `verbs` with
    /// a device (the hipobj-rc-v2 server's queue pairs live there, each on
    /// the rail facing its client); empty otherwise.
    #[must_use]
    pub fn verbs_domains(&self) -> Vec<Domain> {
        self.fabric
            .as_ref()
            .filter(|f| f.rails.first().domain.backend() == fabric::Backend::Verbs)
            .map(|f| f.rails.iter().map(|r| r.domain.clone()).collect())
            .unwrap_or_default()
    }

    /// Why hipobj-rc-v2 is not served when [`RdmaService::verbs_domains`]
    /// is empty.
    #[must_use]
    pub fn no_verbs_reason(&self) -> &'static str {
        if self.fabric.is_none() {
            "RDMA is disabled or unavailable on this server"
        } else {
            "this server's fabric backend is tcp; hipobj-rc-v2 needs verbs"
        }
    }

    /// Whether requests with a token are served over the fabric.
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.fabric.is_some()
    }

    /// Registers `count` buffers of `size` bytes on the fabric's domain (the
    /// gateway's cache); `None` when the fabric is off.
    ///
    /// # Errors
    /// Allocation or registration failures.
    pub fn register_pool(
        &self,
        count: usize,
        size: usize,
    ) -> Result<Option<Arc<StagingPool>>, fabric::FabricError> {
        let Some(f) = &self.fabric else {
            return Ok(None);
        };
        StagingPool::new(
            &f.rails.first().domain,
            count,
            size,
            fabric::pool::NoopObserver::shared(),
        )
        .map(Some)
    }

    /// What a transfer to or from `token`'s memory needs, for S3 user
    /// `user`: the user's own session to its endpoint (connected now if
    /// need be; two users never share one), the permits and the shares.
    ///
    /// # Errors
    /// The fabric is off; the endpoint cannot be reached.
    pub async fn ctx(
        &self,
        token: &RdmaToken,
        user: &str,
        dialect: Dialect,
    ) -> Result<transfer::Ctx, RdmaError> {
        let f = self.fabric()?;
        let endpoint = token.endpoint()?;
        // The local rail facing the client's endpoint (its own device's
        // queue pairs or DC initiators, and staging buffers).
        let peer = endpoint.addr.ip();
        let rail = if dialect.needs_dc() {
            f.rails
                .dc_serving(peer)
                .ok_or_else(|| RdmaError::Internal("DC is not available".into()))?
        } else {
            f.rails.serving(peer)
        };
        let pool = dialect
            .sessions(&rail.sessions, rail.dc.as_ref())
            .ok_or_else(|| RdmaError::Internal("DC is not available".into()))?;
        // One connect of a (user, endpoint) at a time, and none while the
        // pair backs off after a refusal: the requests queued behind a
        // refused connect fail without dialing.
        let turn = f
            .gate
            .turn(backoff::Key::new(user, dialect, endpoint.addr))
            .await;
        if let Err(left) = f.gate.check(turn.key()) {
            debug!(peer = %endpoint, ?left, "RDMA: this user's connect to the endpoint was refused lately: not dialing");
            return Err(RdmaError::BackingOff {
                peer: endpoint,
                left,
            });
        }
        let session = match pool.get_for(endpoint, user).await {
            Ok(s) => {
                f.gate.connected(turn.key());
                s
            }
            Err(e) => {
                // Only an endpoint that answered and refused this user's
                // proof backs off: one that is down (restarting, say) is
                // dialled again by the next request, so a tenant's host
                // coming back is used at once.
                let period = refused_by_peer(&e).then(|| f.gate.refused(turn.key()));
                let error = e.to_string();
                warn!(
                    peer = %endpoint,
                    error = %s3dma_service::escape::Escaped(&error),
                    backoff = ?period,
                    "RDMA: connecting to the client's fabric endpoint failed"
                );
                return Err(RdmaError::Connect(e));
            }
        };
        drop(turn);
        Ok(transfer::Ctx {
            pool: Arc::clone(&rail.pool),
            session,
            total_ops: Arc::clone(&f.total_ops),
            put_budget: Arc::clone(&f.put_budget),
            depth: f.depth,
            shares: f.shares.for_request(endpoint, user),
            progress: f.progress,
            metrics: Arc::clone(&self.metrics),
        })
    }

    /// Serves a GET for S3 user `user`: checks the size, RDMA WRITEs `range`
    /// of the object into the token's memory (from its start) and returns
    /// the bytes written.
    ///
    /// # Errors
    /// Too small a token, unreachable endpoint, failed operations, disk errors.
    pub async fn get(
        &self,
        token: &RdmaToken,
        reader: &ObjectReader,
        range: std::ops::Range<u64>,
        user: &str,
        dialect: Dialect,
    ) -> Result<u64, RdmaError> {
        let len = range.end - range.start;
        headers::check_fits(len, u64::from(token.size))?;
        if len == 0 {
            return Ok(0);
        }
        let ctx = self.ctx(token, user, dialect).await?;
        let n = transfer::write_range(&ctx, reader, range, token.remote()).await?;
        self.metrics.path_bytes("rdma", "out", n);
        Ok(n)
    }

    /// Prepares a PUT/UploadPart body (for S3 user `user`, whose share of
    /// the staging pool it counts against) read from the token's memory: checks
    /// the request shape and connects; the returned stream RDMA READs
    /// `token.size` bytes as the store consumes it.
    ///
    /// # Errors
    /// A request that is not an empty-body RDMA PUT; unreachable endpoint.
    pub async fn put_body(
        &self,
        token: &RdmaToken,
        headers: &HeaderMap,
        user: &str,
        dialect: Dialect,
    ) -> Result<transfer::RdmaBody, RdmaError> {
        headers::check_put_request(headers)?;
        let size = u64::from(token.size);
        let ctx = self.ctx(token, user, dialect).await?;
        Ok(transfer::read_stream(ctx, token.remote(), size))
    }

    /// The error answering a PUT/UploadPart that RDMA must decline: HTTP 200,
    /// `x-amz-rdma-reply: 501`, an `RDMANotSupported` error body; nothing stored.
    #[must_use]
    pub fn declined_put(&self, why: &Declined) -> S3Error {
        let reason = why.reason(self.declined);
        let mut e = S3Error::with_message(
            S3ErrorCode::Custom("RDMANotSupported".into()),
            format!("{reason}; nothing was stored. Retry with the data in the HTTP body."),
        );
        e.set_status_code(StatusCode::OK);
        let mut h = headers::reply_headers(501, None);
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/xml"),
        );
        e.set_headers(h);
        e
    }
}

/// Whether a connect failed because the endpoint answered and refused the
/// handshake (a wrong key or responder, a protocol error), as opposed to
/// nothing answering.
fn refused_by_peer(e: &ConnectError) -> bool {
    matches!(
        e,
        ConnectError::Failed {
            source: fabric::FabricError::Handshake { .. } | fabric::FabricError::Protocol { .. },
            ..
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::headers::RequestError;
    use fabric::{Backend, EndpointAddr, OpError, OpStatus, TokenError};
    use s3dma_config::{ByteSize, ConfigError};

    /// `validate` as `(field, message)`.
    fn v(c: &RdmaConfig) -> Result<Option<FabricKey>, (String, String)> {
        c.validate("t.yaml").map_err(|e| match e {
            ConfigError::Invalid {
                file,
                field,
                message,
            } => {
                assert_eq!(file, "t.yaml");
                (field, message)
            }
            other => panic!("{other}"),
        })
    }

    #[test]
    fn config_defaults_and_validation() {
        let c = RdmaConfig::default();
        assert_eq!(c.mode, RdmaMode::Disabled);
        assert_eq!(v(&c).unwrap().map(|_| ()), None);
        let c: RdmaConfig =
            serde_yaml::from_str("mode: enabled\nstaging_buffer_size: 1MiB\n").unwrap();
        assert_eq!(c.staging_buffer_size, ByteSize(1 << 20));
        let (f, m) = v(&c).unwrap_err();
        assert_eq!(f, "rdma.fabric_key_file");
        assert!(m.contains("required"), "{m}");
        let c: RdmaConfig = serde_yaml::from_str("staging_buffer_size: 100\n").unwrap();
        assert_eq!(v(&c).unwrap_err().0, "rdma.staging_buffer_size");
        let e = serde_yaml::from_str::<RdmaConfig>("staging_buffer_size: 4MB\n").unwrap_err();
        assert!(e.to_string().contains("KiB"), "{e}");
        assert!(serde_yaml::from_str::<RdmaConfig>("mode: on\n").is_err());
        assert_eq!(RdmaConfig::default().backend, Backend::Tcp);
        let c: RdmaConfig = serde_yaml::from_str("backend: verbs\n").unwrap();
        assert_eq!(c.backend, Backend::Verbs);
        let e = serde_yaml::from_str::<RdmaConfig>("backend: rdma\n").unwrap_err();
        assert!(e.to_string().contains("unknown variant `rdma`"), "{e}");
        assert!(serde_yaml::from_str::<RdmaConfig>("bogus: 1\n").is_err());
        assert_eq!(RdmaConfig::default().max_staging_share, 0.5);
        for bad in [
            "max_staging_share: 0",
            "max_staging_share: 1.5",
            "max_staging_share: -1",
        ] {
            let c: RdmaConfig = serde_yaml::from_str(bad).unwrap();
            assert_eq!(v(&c).unwrap_err().0, "rdma.max_staging_share", "{bad}");
        }
        let c: RdmaConfig = serde_yaml::from_str("staging_buffers: 1\n").unwrap();
        let (f, m) = v(&c).unwrap_err();
        assert_eq!(f, "rdma.max_staging_share");
        assert!(m.contains("less than one buffer"), "{m}");
        let c: RdmaConfig =
            serde_yaml::from_str("staging_buffers: 1\nmax_staging_share: 1\n").unwrap();
        assert!(v(&c).is_ok());
        let d = RdmaConfig::default();
        assert_eq!(d.max_shared_staging_share, 0.5);
        assert_eq!(d.progress_timeout_secs, 30);
        assert!(d.tenant_users.is_empty());
        for (bad, field) in [
            (
                "max_shared_staging_share: 0",
                "rdma.max_shared_staging_share",
            ),
            (
                "max_shared_staging_share: 2",
                "rdma.max_shared_staging_share",
            ),
            ("progress_timeout_secs: 0", "rdma.progress_timeout_secs"),
        ] {
            let c: RdmaConfig = serde_yaml::from_str(bad).unwrap();
            assert_eq!(v(&c).unwrap_err().0, field, "{bad}");
        }
        assert_eq!(RdmaConfig::default().tcp_streams, 2);
        for bad in ["tcp_streams: 0", "tcp_streams: 17"] {
            let c: RdmaConfig = serde_yaml::from_str(bad).unwrap();
            let (f, m) = v(&c).unwrap_err();
            assert_eq!(f, "rdma.tcp_streams", "{bad}");
            assert!(m.contains("between 1 and 16"), "{m}");
        }
    }

    #[test]
    fn key_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        std::fs::write(&p, format!("{}\n", "ab".repeat(32))).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let c = RdmaConfig {
            mode: RdmaMode::Enabled,
            fabric_key_file: Some(p.clone()),
            ..RdmaConfig::default()
        };
        assert!(v(&c).unwrap().is_some());
        std::fs::write(&p, "abcd").unwrap();
        let (f, m) = v(&c).unwrap_err();
        assert_eq!(f, "rdma.fabric_key_file");
        assert!(m.contains("at least 16 bytes"), "{m}");
        std::fs::write(&p, "zz".repeat(32)).unwrap();
        assert!(v(&c).unwrap_err().1.contains("hexadecimal"));
    }

    #[test]
    fn error_mapping() {
        assert_eq!(
            RdmaError::NotSigned.to_s3().code(),
            &S3ErrorCode::AccessDenied
        );
        let e = RdmaError::InvalidToken(TokenError::Length(3)).to_s3();
        assert_eq!(e.code().as_str(), "InvalidRDMAToken");
        assert_eq!(e.status_code(), Some(StatusCode::BAD_REQUEST));
        let e = RdmaError::Request(RequestError::TooSmall { need: 2, have: 1 }).to_s3();
        assert_eq!(e.code(), &S3ErrorCode::InvalidRequest);
        let op = OpError {
            status: OpStatus::RemoteAccess,
            op: "write",
            remote_addr: 0,
            rkey: 1,
            len: 1,
        };
        let peer = EndpointAddr {
            addr: "127.0.0.1:1".parse().unwrap(),
            responder: 1,
        };
        let e = RdmaError::Op {
            peer,
            source: op.clone(),
        }
        .to_s3();
        assert_eq!(e.code().as_str(), "RDMATransferFailed");
        assert_eq!(e.status_code(), Some(StatusCode::BAD_REQUEST));
        let e = RdmaError::Op {
            peer,
            source: OpError {
                status: OpStatus::RetryExceeded,
                ..op
            },
        }
        .to_s3();
        assert_eq!(e.status_code(), Some(StatusCode::INTERNAL_SERVER_ERROR));
    }

    #[test]
    fn declined_puts() {
        let svc = RdmaService::disabled(Arc::new(Metrics::new()));
        let e = svc.declined_put(&Declined::StandardToken);
        assert_eq!(e.status_code(), Some(StatusCode::OK));
        assert_eq!(e.code().as_str(), "RDMANotSupported");
    }

    #[test]
    fn connect_errors_say_nothing_about_the_port() {
        let peer = |port| EndpointAddr {
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            responder: 1,
        };
        let timeout = RdmaError::Connect(ConnectError::Timeout {
            peer: peer(1),
            after: Duration::from_secs(2),
        })
        .to_s3();
        let refused = RdmaError::Connect(ConnectError::Failed {
            peer: peer(2),
            source: fabric::FabricError::Io {
                what: "connect".into(),
                source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            },
        })
        .to_s3();
        // A pair backing off after a refusal answers the same.
        let backing_off = RdmaError::BackingOff {
            peer: peer(3),
            left: Duration::from_secs(1),
        }
        .to_s3();
        for other in [&refused, &backing_off] {
            assert_eq!(timeout.message(), other.message());
            assert_eq!(timeout.code(), other.code());
            assert_eq!(timeout.status_code(), other.status_code());
        }
        assert!(!timeout.message().unwrap_or("").contains("127.0.0.1"));
        let e = RdmaError::EndpointNotAllowed.to_s3();
        assert_eq!(e.status_code(), Some(StatusCode::FORBIDDEN));
    }

    #[test]
    fn allowed_networks_config() {
        assert_eq!(
            RdmaConfig::default().allowed_client_networks,
            networks::default_allowed()
        );
        let c: RdmaConfig =
            serde_yaml::from_str("allowed_client_networks: [10.0.0.0/8, 'fd00::/8']\n").unwrap();
        assert_eq!(c.allowed_client_networks.len(), 2);
        let e = serde_yaml::from_str::<RdmaConfig>("allowed_client_networks: [10.0.0.0/40]\n")
            .unwrap_err();
        assert!(e.to_string().contains("CIDR"), "{e}");
    }
}
