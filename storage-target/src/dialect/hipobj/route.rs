//! The control requests as an s3s custom route: [`super::ControlAuth`]
//! verifies the SigV4 signature first, ahead of s3s (the pre-check has
//! already refused unsigned `x-amz-*` headers), then [`HipobjRoute`]
//! answers PREPARE, READY and CANCEL as the verified user.

use std::sync::{Arc, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt as _;
use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use s3s::dto::{GetObjectInput, PutObjectInput, Range, StreamingBlob, UploadPartInput};
use s3s::route::S3Route;
use s3s::{Body, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use tracing::{info, warn};

use fabric::Access;
use fabric::verbs::policy::GidKind;
use fabric::verbs::rc::{RcQp, RcRemote, check_recv};
use s3dma_service::escape::Escaped;
use s3dma_wire::hipobj::{
    self, Control, ControlError, FinalReply, Op, PrepareReply, PrepareRequest, RcToken,
    ReadyRequest, SessionId,
};

use super::control::{control_caller, error, is_control_request};
use super::service::{HipobjService, Refusal};
use super::session::{Session, op_name};

/// The s3s route of the control path.
#[derive(Debug, Clone)]
pub struct HipobjRoute(pub Arc<HipobjService>);

/// The request's headers as the wire parsers read them.
struct View<'a>(&'a HeaderMap);

impl hipobj::Headers for View<'_> {
    fn values(&self, name: &str) -> Vec<&str> {
        self.0
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap_or("\u{fffd}"))
            .collect()
    }
}

fn control_error(e: &ControlError) -> S3Error {
    let code = match e.status() {
        501 => S3ErrorCode::NotImplemented,
        413 => S3ErrorCode::EntityTooLarge,
        _ => S3ErrorCode::Custom("InvalidRdmaRequest".into()),
    };
    error(e.status(), code, e.to_string())
}

fn custom(status: u16, code: &'static str, message: impl Into<String>) -> S3Error {
    error(status, S3ErrorCode::Custom(code.into()), message)
}

fn reply(status: StatusCode, headers: &[(&'static str, String)]) -> S3Response<Body> {
    let mut r = S3Response::with_status(Body::empty(), status);
    for (name, value) in headers {
        if let Ok(v) = HeaderValue::from_str(value) {
            r.headers.insert(HeaderName::from_static(name), v);
        }
    }
    r.headers
        .insert(http::header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    r
}

/// An S3 request acting as `owner` on the store, with no headers of the
/// control request (so no token, no signed-headers record), carrying what
/// the access check ([`HipobjFront::authorize`]) left for the handler.
///
/// [`HipobjFront::authorize`]: super::HipobjFront::authorize
fn as_owner<T>(
    input: T,
    method: Method,
    credentials: &s3s::auth::Credentials,
    extensions: Extensions,
) -> S3Request<T> {
    S3Request {
        input,
        method,
        uri: Uri::from_static("/"),
        headers: HeaderMap::new(),
        extensions,
        credentials: Some(credentials.clone()),
        region: None,
        service: None,
        trailing_headers: None,
    }
}

#[async_trait::async_trait]
impl S3Route for HipobjRoute {
    fn is_match(
        &self,
        method: &Method,
        uri: &Uri,
        _headers: &HeaderMap,
        _extensions: &mut Extensions,
    ) -> bool {
        is_control_request(method, uri)
    }

    async fn check_access(&self, req: &mut S3Request<Body>) -> S3Result<()> {
        // Only SigV4-signed requests of configured users; the data moves
        // as that user.
        match control_caller(req) {
            Some(c) if self.0.s3.knows(&c.access_key) => Ok(()),
            _ => Err(S3Error::with_message(
                S3ErrorCode::AccessDenied,
                "the hipobj-rc-v2 control requests must be signed (SigV4) by a user of this server",
            )),
        }
    }

    async fn call(&self, req: S3Request<Body>) -> S3Result<S3Response<Body>> {
        let svc = &self.0;
        let Some(control) = Control::from_path(req.uri.path()) else {
            return Err(error(
                501,
                S3ErrorCode::NotImplemented,
                "not a hipobj-rc-v2 control request",
            ));
        };
        if svc.rails.is_empty() {
            return Err(error(
                501,
                S3ErrorCode::NotImplemented,
                format!("hipobj-rc-v2 is not served here: {}", svc.unsupported),
            ));
        }
        let Some(owner) = control_caller(&req) else {
            return Err(S3Error::with_message(
                S3ErrorCode::AccessDenied,
                "the hipobj-rc-v2 control requests must be signed (SigV4) by a user of this server",
            ));
        };
        match control {
            Control::Prepare => svc.prepare(&req.headers, owner).await,
            Control::Ready => svc.ready(&req.headers, &owner.access_key).await,
            Control::Cancel => Ok(svc.cancel(&req.headers, &owner.access_key)),
        }
    }
}

impl HipobjService {
    async fn prepare(
        self: &Arc<Self>,
        headers: &HeaderMap,
        owner: s3s::auth::Credentials,
    ) -> S3Result<S3Response<Body>> {
        let p = PrepareRequest::parse(&View(headers)).map_err(|e| control_error(&e))?;
        let op = op_name(p.op);
        if p.token.is_loopback_marker() {
            return Err(custom(
                400,
                "InvalidRdmaRequest",
                "the all-zero loopback token is not served: send the client QP's token",
            ));
        }
        if !self.allowed_gid(p.token.gid) {
            self.metrics.hipobj_session(op, "refused");
            return Err(custom(
                403,
                "AccessDenied",
                "the client QP's GID is not on a network this server may connect to (rdma.allowed_client_networks); nothing was transferred",
            ));
        }
        // The operation's access rule, as s3s's hook runs it over HTTP,
        // before any resource is held: a GET needs the object's READ (the
        // handler checks it while staging), a PUT the bucket's WRITE, and
        // an UploadPart also the upload's initiator rule (its initiator or
        // the bucket's owner), as the UploadPart handler would check it at
        // READY: here, before a queue pair, staging or caps are held and
        // before any byte moves.
        let checked = self
            .s3
            .authorize(
                &owner.access_key,
                access_op(p.op, &p.target),
                &p.target.bucket,
            )
            .await;
        let checked = match (checked, &p.target.upload) {
            (Ok(ext), Some((upload_id, _))) => self
                .s3
                .may_upload_part(
                    &owner.access_key,
                    &p.target.bucket,
                    &p.target.key,
                    upload_id,
                    &ext,
                )
                .await
                .map(|()| ext),
            (r, _) => r,
        };
        if let Err(e) = checked {
            self.metrics.hipobj_session(op, "refused");
            return Err(e);
        }
        if !self.fresh_client(p.token.gid, p.token.qpn, p.client_psn) {
            self.metrics.hipobj_session(op, "refused");
            return Err(custom(
                409,
                "RdmaSessionConflict",
                "this client QP and PSN already prepared a session: use a fresh PSN",
            ));
        }
        let size = u64::from(p.size);
        if let Err(r) = self.admit(&owner.access_key, size) {
            self.metrics.hipobj_session(op, "refused");
            let what = match r {
                Refusal::Sessions => "the server holds rdma.hipobj.max_sessions sessions",
                Refusal::UserSessions => {
                    "this user holds rdma.hipobj.max_sessions_per_user sessions"
                }
                Refusal::SharedSessions => {
                    "the users not in rdma.tenant_users hold rdma.hipobj.max_shared_sessions sessions"
                }
                Refusal::Staging => "the sessions hold rdma.hipobj.max_staging_bytes",
                Refusal::UserStaging => {
                    "this user's sessions hold rdma.hipobj.max_staging_bytes_per_user"
                }
                Refusal::SharedStaging => {
                    "the sessions of users not in rdma.tenant_users hold rdma.hipobj.max_shared_staging_bytes"
                }
            };
            // The user's own cap: retry later. A pool out of slots: the
            // dialect's unsupported answer, so the client moves the bytes
            // over HTTP now instead of failing.
            return Err(if r.own_cap() {
                custom(503, "RdmaResourceLimit", format!("{what}: retry later"))
            } else {
                error(
                    501,
                    S3ErrorCode::NotImplemented,
                    format!("{what}: use HTTP for this transfer"),
                )
            });
        }
        let released = ReleaseOnDrop {
            svc: self,
            user: &owner.access_key,
            bytes: size,
            armed: true,
        };
        let session = self.build(&p, &owner).await.inspect_err(|_| {
            self.metrics.hipobj_session(op, "refused");
        })?;
        let id = SessionId::random();
        let local = session.inner.qp.local();
        let reply_headers = PrepareReply {
            token: RcToken {
                lid: local.lid,
                ..RcToken::rc(local.qpn, local.gid, local.port)
            },
            session: id,
            server_psn: session.server_psn,
            staging: (p.op == Op::Put)
                .then(|| (session.inner.staging.addr(), session.inner.staging.rkey())),
        }
        .headers();
        released.disarm();
        self.insert(id, Arc::new(session.inner));
        info!(
            session = %id,
            op,
            bucket = %Escaped(&p.target.bucket),
            key = %Escaped(&p.target.key),
            size,
            user = %Escaped(&owner.access_key),
            "hipobj-rc-v2 session prepared"
        );
        Ok(reply(StatusCode::OK, &reply_headers))
    }

    /// The session's queue pair, staging memory and (GET) bytes.
    async fn build(&self, p: &PrepareRequest, owner: &s3s::auth::Credentials) -> S3Result<Built> {
        // The session's own protection domain: its QP can reach its own
        // staging memory and nothing of any other session (a key is not a
        // secret on RDMA: rkeys are guessable MR indices).
        // On the rail facing the client's GID: the one its QP reaches.
        let domain = self
            .rail_for(p.token.gid)
            .expect("checked by the route")
            .isolated()
            .map_err(|e| {
                warn!(error = %e, "hipobj-rc-v2: allocating a protection domain failed");
                custom(
                    503,
                    "RdmaResourceLimit",
                    "no protection domain: retry later",
                )
            })?;
        let domain = &domain;
        let len = p.size as usize;
        let (access, qp_access) = match p.op {
            Op::Get => (Access::LOCAL_WRITE, Access::LOCAL_WRITE),
            Op::Put => (Access::REMOTE_WRITE, Access::REMOTE_WRITE),
        };
        let staging = domain.alloc(len, access).map_err(|e| {
            warn!(error = %e, "hipobj-rc-v2: registering staging memory failed");
            custom(503, "RdmaResourceLimit", "no staging memory: retry later")
        })?;
        let (etag, crc64nvme) = match p.op {
            Op::Get => {
                let (etag, crc) = self.stage_object(p, owner, &staging).await?;
                (etag, Some(crc))
            }
            Op::Put => (None, None),
        };
        // Sent from a GID of the client's kind (IPv4-mapped, link-local or
        // other IPv6): the only one its GID can reach.
        let kind = GidKind::of(&p.token.gid);
        let qp = RcQp::create_with_gid(domain, qp_access, Some(kind)).map_err(|e| match e {
            fabric::FabricError::Unavailable { .. } => custom(
                400,
                "InvalidRdmaRequest",
                format!(
                    "the client's GID is {kind:?} and this server's port has no GID of that kind"
                ),
            ),
            e => {
                warn!(error = %e, "hipobj-rc-v2: creating a queue pair failed");
                custom(
                    503,
                    "RdmaResourceLimit",
                    "no queue pair available: retry later",
                )
            }
        })?;
        // The receive a PUT's WRITE_WITH_IMM consumes, before the client
        // can write.
        let recv = match p.op {
            Op::Put => Some(Box::pin(qp.post_recv().map_err(|e| {
                warn!(error = %e, "hipobj-rc-v2: posting the receive failed");
                custom(
                    500,
                    "RDMATransferFailed",
                    "the server could not post its receive",
                )
            })?) as super::session::PendingRecv),
            Op::Get => None,
        };
        let mut server_psn = hipobj::random_psn();
        while !self.fresh_pair(qp.local().qpn, server_psn) {
            server_psn = hipobj::random_psn();
        }
        qp.connect_with_mtu(
            &RcRemote {
                qpn: p.token.qpn,
                gid: p.token.gid,
                lid: p.token.lid,
                psn: p.client_psn,
            },
            server_psn,
            self.cfg.path_mtu,
        )
        .map_err(|e| {
            warn!(error = %e, "hipobj-rc-v2: connecting the queue pair to the client's failed");
            if !domain.port_active() || port_cannot_route(&e) {
                // This server's port (its link down, say): its rail failed,
                // not the client's request; the client may take another.
                custom(
                    500,
                    "RDMATransferFailed",
                    "this server's port facing the client's GID cannot reach it now (its link may be down)",
                )
            } else {
                custom(
                    400,
                    "InvalidRdmaRequest",
                    "the client's QP cannot be reached from this port (GID or QP number)",
                )
            }
        })?;
        Ok(Built {
            server_psn,
            inner: Session {
                owner: owner.access_key.clone(),
                credentials: owner.clone(),
                op: p.op,
                target: p.target.clone(),
                size: p.size,
                cookie: p.cookie,
                client_qpn: p.token.qpn,
                qp,
                staging,
                etag,
                crc64nvme,
                recv: std::sync::Mutex::new(recv),
                running: std::sync::atomic::AtomicBool::new(false),
                deadline: Instant::now() + self.prepared_timeout(),
            },
        })
    }

    /// Reads `[offset, offset + size)` of the object through the S3 GET
    /// handler (the owner's permissions) into `staging`.
    async fn stage_object(
        &self,
        p: &PrepareRequest,
        owner: &s3s::auth::Credentials,
        staging: &fabric::Region,
    ) -> S3Result<(Option<String>, u64)> {
        let size = u64::from(p.size);
        let input = GetObjectInput {
            bucket: p.target.bucket.clone(),
            key: p.target.key.clone(),
            range: Some(Range::Int {
                first: p.offset,
                last: Some(p.offset + size - 1),
            }),
            ..GetObjectInput::default()
        };
        let checked = self
            .s3
            .authorize(&owner.access_key, "GetObject", &p.target.bucket)
            .await?;
        let got = self
            .s3
            .get_object(as_owner(input, Method::GET, owner, checked))
            .await
            .map_err(|e| {
                if e.code() == &S3ErrorCode::InvalidRange {
                    custom(
                        416,
                        "InvalidRange",
                        "x-amz-rdma-offset is past the object's end",
                    )
                } else {
                    e
                }
            })?;
        let out = got.output;
        if out.content_length != Some(i64::from(p.size)) {
            return Err(custom(
                416,
                "InvalidRange",
                "x-amz-rdma-offset + x-amz-rdma-size is past the object's end",
            ));
        }
        let etag = out.e_tag.as_ref().map(|e| format!("\"{}\"", e.value()));
        let mut body = out
            .body
            .ok_or_else(|| custom(500, "InternalError", "the object had no body"))?;
        let mut at = 0usize;
        let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc64Nvme);
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| {
                warn!(error = %e, "hipobj-rc-v2: reading the object failed");
                custom(500, "InternalError", "reading the object failed")
            })?;
            if at + chunk.len() > staging.len() {
                return Err(custom(
                    500,
                    "InternalError",
                    "the object changed while read",
                ));
            }
            staging
                .write_at(at, &chunk)
                .map_err(|_| custom(500, "InternalError", "staging the object failed"))?;
            digest.update(&chunk);
            at += chunk.len();
        }
        if at != staging.len() {
            return Err(custom(
                500,
                "InternalError",
                "the object changed while read",
            ));
        }
        Ok((etag, digest.finalize()))
    }

    async fn ready(
        self: &Arc<Self>,
        headers: &HeaderMap,
        user: &str,
    ) -> S3Result<S3Response<Body>> {
        let r = ReadyRequest::parse(&View(headers)).map_err(|e| control_error(&e))?;
        let Some(s) = self.get(&r.session) else {
            return Err(custom(
                409,
                "RdmaSessionConflict",
                "no prepared session has this id (unknown, expired or done)",
            ));
        };
        if s.owner != user {
            return Err(custom(
                403,
                "AccessDenied",
                "the session belongs to another user",
            ));
        }
        if r.cookie != s.cookie {
            // A wrong cookie ends the session: it cannot be guessed at.
            if let Some(s) = self.remove(&r.session) {
                s.qp.fail();
                self.metrics.hipobj_session(s.op_name(), "refused");
            }
            return Err(custom(
                403,
                "AccessDenied",
                "the cookie is not the session's",
            ));
        }
        if r.qpn != s.client_qpn {
            return Err(custom(
                400,
                "InvalidRdmaRequest",
                "x-amz-rdma-qpn is not the QP the session was prepared with",
            ));
        }
        if !s.claim() {
            return Err(custom(
                409,
                "RdmaSessionConflict",
                "the session is already running",
            ));
        }
        // The data phase runs to its end (or its deadline) in a task of its
        // own: a client that disconnects mid-READY cancels only this
        // handler, never the session's end, so its caps, queue pair and
        // staging memory always come back.
        let this = Arc::clone(self);
        let data_phase = tokio::spawn(async move {
            let outcome = this.run(&s, &r).await;
            this.remove(&r.session);
            match outcome {
                Ok(fin) => {
                    this.metrics.hipobj_session(s.op_name(), "ok");
                    this.metrics.hipobj_bytes(s.op_name(), fin.bytes);
                    Ok(fin)
                }
                Err((label, e)) => {
                    s.qp.fail();
                    this.metrics.hipobj_session(s.op_name(), label);
                    Err(e)
                }
            }
        });
        match data_phase.await {
            Ok(Ok(fin)) => Ok(reply(StatusCode::OK, &fin.headers())),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(custom(
                500,
                "InternalError",
                format!("the data phase ended abnormally: {e}"),
            )),
        }
    }

    /// The data phase; the error's label is the metric's outcome.
    async fn run(
        &self,
        s: &Session,
        r: &ReadyRequest,
    ) -> Result<FinalReply, (&'static str, S3Error)> {
        let deadline = self.transfer_timeout();
        let timeout = || {
            (
                "timeout",
                custom(
                    408,
                    "RequestTimeout",
                    "the data phase did not complete in time",
                ),
            )
        };
        match s.op {
            Op::Get => {
                if r.mr_addr == 0 || r.mr_rkey == 0 {
                    return Err((
                        "refused",
                        custom(
                            400,
                            "InvalidRdmaRequest",
                            "a GET's READY needs x-amz-rdma-mr-addr and x-amz-rdma-mr-rkey",
                        ),
                    ));
                }
                let done =
                    s.qp.write_with_imm(s.staging.as_slice(), r.mr_addr, r.mr_rkey, s.cookie);
                match tokio::time::timeout(deadline, done).await {
                    Err(_) => Err(timeout()),
                    Ok(Err(e)) => Err((
                        "failed",
                        custom(500, "RDMATransferFailed", format!("RDMA WRITE failed: {e}")),
                    )),
                    Ok(Ok(())) => Ok(FinalReply {
                        cookie: s.cookie,
                        bytes: u64::from(s.size),
                        etag: s.etag.clone(),
                        crc64nvme: s.crc64nvme,
                    }),
                }
            }
            Op::Put => {
                let recv = s
                    .recv
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take()
                    .ok_or_else(|| ("failed", custom(500, "InternalError", "no receive")))?;
                let got = match tokio::time::timeout(deadline, recv).await {
                    Err(_) => return Err(timeout()),
                    Ok(Err(status)) => {
                        return Err((
                            "failed",
                            custom(
                                500,
                                "RDMATransferFailed",
                                format!("the client's WRITE did not arrive: {status:?}"),
                            ),
                        ));
                    }
                    Ok(Ok(got)) => got,
                };
                if let Err(why) = check_recv(&got, s.cookie, s.size) {
                    return Err((
                        "refused",
                        custom(
                            400,
                            "InvalidRdmaRequest",
                            format!(
                                "the client's WRITE is not this transfer's ({why}); nothing was stored"
                            ),
                        ),
                    ));
                }
                let bytes =
                    Bytes::from(s.staging.as_slice().to_vec().map_err(|_| {
                        ("failed", custom(500, "InternalError", "reading staging"))
                    })?);
                let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc64Nvme, &bytes);
                let etag = self.store(s, bytes).await.map_err(|e| ("failed", e))?;
                Ok(FinalReply {
                    cookie: s.cookie,
                    bytes: u64::from(s.size),
                    etag,
                    crc64nvme: Some(crc),
                })
            }
        }
    }

    /// Stores a PUT's bytes through the S3 handler as the session's owner.
    async fn store(&self, s: &Session, bytes: Bytes) -> S3Result<Option<String>> {
        let len = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
        let body = Some(StreamingBlob::from(Body::from(bytes)));
        let t = &s.target;
        let etag = match &t.upload {
            None => {
                let input = PutObjectInput {
                    bucket: t.bucket.clone(),
                    key: t.key.clone(),
                    body,
                    content_length: Some(len),
                    ..PutObjectInput::default()
                };
                let checked = self.s3.authorize(&s.owner, "PutObject", &t.bucket).await?;
                self.s3
                    .put_object(as_owner(input, Method::PUT, &s.credentials, checked))
                    .await?
                    .output
                    .e_tag
            }
            Some((upload_id, part)) => {
                let input = UploadPartInput {
                    bucket: t.bucket.clone(),
                    key: t.key.clone(),
                    upload_id: upload_id.clone(),
                    part_number: i32::try_from(*part).unwrap_or(i32::MAX),
                    body,
                    content_length: Some(len),
                    ..UploadPartInput::default()
                };
                let checked = self.s3.authorize(&s.owner, "UploadPart", &t.bucket).await?;
                self.s3
                    .upload_part(as_owner(input, Method::PUT, &s.credentials, checked))
                    .await?
                    .output
                    .e_tag
            }
        };
        Ok(etag.map(|e| format!("\"{}\"", e.value())))
    }

    fn cancel(&self, headers: &HeaderMap, user: &str) -> S3Response<Body> {
        // 204 whatever happens: a cancel tells nothing about sessions.
        if let Ok(id) = hipobj::parse_cancel(&View(headers))
            && self.get(&id).is_some_and(|s| {
                s.owner == user && !s.running.load(std::sync::atomic::Ordering::Acquire)
            })
            && let Some(s) = self.remove(&id)
        {
            s.qp.fail();
            self.metrics.hipobj_session(s.op_name(), "cancelled");
        }
        let mut r = reply(StatusCode::NO_CONTENT, &[]);
        r.headers.remove(http::header::CONTENT_LENGTH);
        r
    }
}

/// What `build` made: the session and the server's PSN.
struct Built {
    server_psn: u32,
    inner: Session,
}

/// The S3 operation a control request's target stands for, whose access
/// rule it gets.
fn access_op(op: Op, t: &hipobj::Target) -> &'static str {
    match (op, &t.upload) {
        (Op::Get, _) => "GetObject",
        (Op::Put, Some(_)) => "UploadPart",
        (Op::Put, None) => "PutObject",
    }
}

/// Gives a failed PREPARE's caps back.
struct ReleaseOnDrop<'a> {
    svc: &'a HipobjService,
    user: &'a str,
    bytes: u64,
    armed: bool,
}

impl ReleaseOnDrop<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.svc.release(self.user, self.bytes);
        }
    }
}

/// Whether connecting a queue pair failed because this server's port
/// cannot route to the peer's GID now (its link down, no route, no
/// address): the errors the kernel's address resolution gives, as opposed
/// to a queue pair or GID the device refuses. The client's GID is on an
/// allowed network by then, which a working port routes.
fn port_cannot_route(e: &fabric::FabricError) -> bool {
    use nix::errno::Errno;
    let fabric::FabricError::Verbs { source, .. } = e else {
        return false;
    };
    source.raw_os_error().is_some_and(|n| {
        [
            Errno::ENETUNREACH,
            Errno::EHOSTUNREACH,
            Errno::ENETDOWN,
            Errno::ENODEV,
            Errno::EADDRNOTAVAIL,
            Errno::ENXIO,
        ]
        .contains(&Errno::from_raw(n))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::hipobj::HipobjUnsupported;

    /// A port that cannot route to the client (link down) fails this
    /// server's rail (500, the client redoes the transfer on another);
    /// anything else the device refuses stays the client's error.
    #[test]
    fn a_port_without_a_route_is_the_servers_failure() {
        let verbs = |errno: nix::errno::Errno| fabric::FabricError::Verbs {
            what: "ibv_modify_qp(RTR)".into(),
            source: std::io::Error::from_raw_os_error(errno as i32),
        };
        assert!(port_cannot_route(&verbs(nix::errno::Errno::ENETUNREACH)));
        assert!(port_cannot_route(&verbs(nix::errno::Errno::ENETDOWN)));
        assert!(!port_cannot_route(&verbs(nix::errno::Errno::EINVAL)));
        assert!(!port_cannot_route(&fabric::FabricError::InvalidArgument(
            "x".into()
        )));
    }

    #[tokio::test]
    async fn unsupported_answers_501_with_the_marker() {
        let route = HipobjUnsupported("a gateway");
        let mut ext = Extensions::new();
        let uri = Uri::from_static("/.hipobj-rc/prepare");
        assert!(route.is_match(&Method::POST, &uri, &HeaderMap::new(), &mut ext));
        assert!(!route.is_match(&Method::GET, &uri, &HeaderMap::new(), &mut ext));
        let req = as_owner(
            Body::empty(),
            Method::POST,
            &s3s::auth::Credentials {
                access_key: "a".into(),
                secret_key: "s".into(),
            },
            Extensions::new(),
        );
        let e = route.call(req).await.unwrap_err();
        assert_eq!(e.status_code(), Some(StatusCode::NOT_IMPLEMENTED));
        assert_eq!(
            e.headers()
                .and_then(|h| h.get(hipobj::header::PROTOCOL_STATUS))
                .and_then(|v| v.to_str().ok()),
            Some("unsupported")
        );
    }
}
