//! `s3dma.tenant.v1.Tenant`: who is calling (from the connection's
//! [`Peer`]), which buffer bytes a request names, the per-request windows,
//! and the forwarding to the agent.
//!
//! A window covers exactly the bytes the request names (remote-write for
//! GET, remote-read for PUT), lives no longer than the request's deadline,
//! and is revoked when the request ends: it is dropped before the reply is
//! sent, and when the tenant cancels (tonic drops the handler) it drops
//! with it. A tenant has at most `max_windows` live windows.
//!
//! Each call arrives admitted by [`crate::admission`] (it holds one of the
//! tenant's request permits). A GetObjects batch runs its items as single
//! agent GetObject calls, each holding a request permit and minting its
//! window only when it starts: the batch's own permit runs items one at a
//! time, and as many more as the tenant has free permits (up to the
//! requested concurrency) run beside it. HeadObjects and DeleteObjects
//! name no buffer: the shim checks their item count and forwards them as
//! one agent call. PutObjects checks every item's slice against the
//! caller's buffers and mints a window per item (an item that fails either
//! is refused alone, with its own error), sends the good items to the agent
//! as one call and revokes every window when that call ends. Every batch
//! has at most the tenant's `max_batch_items` items, and a GetObjects or
//! PutObjects batch names at most its `max_batch_bytes` bytes.
//!
//! Request ids: the shim always makes its own (`shim-<hex>`), sends it to
//! the agent and returns it in errors; a tenant's `x-request-id` is only
//! logged, escaped, as `client_request_id`. Each call runs in an envelope
//! ([`s3dma_service::request`]): the ids, a `debug` span, the requests
//! counter and latency histogram, and the failure line (`info`, `warn`
//! when the shim or the agent is at fault).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use fabric::{Access, Endpoint, RdmaToken, Window};
use futures::Stream;
use s3dma_proto::agent::v1 as agent;
use s3dma_proto::agent::v1::agent_client::AgentClient;
use s3dma_proto::tenant::v1 as api;
use s3dma_service::request::{About, Envelope, RequestMetrics, Style};
use tokio::sync::OwnedSemaphorePermit;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::admission::Admitted;
use crate::agent_link::AgentLink;
use crate::error::ShimError;
use crate::metrics::Metrics;
use crate::registry::{Buffer, CudaHandle, InUse, Peer, Registry, Tenant, WindowSlot};
use crate::socket::ConnInfo;

mod batch;

/// Extra life of a window past the request's deadline (a guard only: the
/// window is revoked when the request ends).
const WINDOW_GRACE: Duration = Duration::from_secs(5);

/// Items of one batch running at once when the tenant asks for no
/// concurrency.
const DEFAULT_BATCH_CONCURRENCY: u32 = 8;

/// The tenant service.
#[derive(Debug, Clone)]
pub struct TenantService {
    registry: Arc<Registry>,
    agent: AgentLink,
    /// One fabric endpoint per rail (rail 0 first), all serving the same
    /// tenant memory.
    endpoints: Arc<[Arc<Endpoint>]>,
    metrics: Arc<Metrics>,
    max_timeout: Duration,
    /// The agent's queue pairs on this host's verbs device (hipobj-rc-v2).
    #[cfg(feature = "verbs")]
    qp_host: Option<Arc<crate::qp_link::QpHost>>,
}

/// The shim's envelopes: a `debug` span; a failed call logged at `info`.
const STYLE: Style = Style {
    span: tracing::Level::DEBUG,
    client_failure: tracing::Level::INFO,
    ok: "OK",
};

impl RequestMetrics for Metrics {
    fn request(&self, tenant: &str, op: &str, status: &str, elapsed: Duration) {
        self.requests.with_label_values(&[tenant, op, status]).inc();
        self.latency
            .with_label_values(&[op])
            .observe(elapsed.as_secs_f64());
    }
}

/// One call in progress.
struct Call {
    /// The shim's own id, the tenant's (escaped, logged only), span, start.
    env: Envelope,
    tenant: Arc<Tenant>,
    peer: Peer,
    timeout: Duration,
    op: &'static str,
    /// `bucket/key` the call names (logged only, escaped).
    object: String,
    _permit: OwnedSemaphorePermit,
}

impl Call {
    /// Notes the object a call names, for its log line.
    fn on(&mut self, bucket: &str, key: &str) {
        self.object = format!("{bucket}/{key}");
    }

    /// The shim's own id of the call.
    fn request_id(&self) -> &str {
        self.env.id()
    }
}

/// A minted window, counted in the open-windows gauge.
struct MintedWindow {
    window: Window,
    token: String,
    /// The same slice's windows on the other rails (1, 2, ...), each with
    /// its own key, and their tokens: revoked with `window`.
    rails: Vec<Window>,
    rail_tokens: Vec<String>,
    metrics: Arc<Metrics>,
    _in_use: Option<InUse>,
    _slot: WindowSlot,
    /// The agent's queue pairs may name the window while this lives.
    #[cfg(feature = "verbs")]
    _tracked: Option<crate::qp_link::Tracked>,
    /// The other rails' windows, nameable the same way (a hipobj-rc-v2
    /// transfer on rail i opens its queue pair on rail i's device).
    #[cfg(feature = "verbs")]
    _rails_tracked: Vec<crate::qp_link::Tracked>,
}

impl Drop for MintedWindow {
    fn drop(&mut self) {
        self.window.revoke();
        for w in &self.rails {
            w.revoke();
        }
        self.metrics.windows_open.dec();
        // A call dropped while a standard token named its window (the
        // tenant went away, or the call failed): the buffer stays in use
        // until a DC write still in flight can no longer land.
        #[cfg(feature = "verbs")]
        if let Some(rest) = self.fence(s3dma_wire::dc::Ending::Abandoned)
            && let Some(in_use) = self._in_use.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move {
                tokio::time::sleep(rest).await;
                drop(in_use);
            });
        }
    }
}

impl MintedWindow {
    /// The window's fence ([`s3dma_wire::dc::Fence`]) once its call ended
    /// `how` and its key was revoked: how long its memory must stay away
    /// from the tenant, `None` when no standard token named it or nothing
    /// can be in flight.
    #[cfg(feature = "verbs")]
    fn fence(&self, how: s3dma_wire::dc::Ending) -> Option<Duration> {
        // Any rail's window a standard token named.
        let budget = self
            ._tracked
            .iter()
            .chain(&self._rails_tracked)
            .find_map(crate::qp_link::Tracked::dc_fence)?;
        let mut fence = s3dma_wire::dc::Fence::live(budget);
        let now = std::time::Instant::now();
        fence.end(how, now);
        if fence.needs_invalidation() {
            // Revoked by the caller before asking (registration dropped).
            debug_assert!(self.window.is_revoked());
            fence.key_invalidated();
        }
        fence.remaining(now).filter(|rest| !rest.is_zero())
    }

    /// Ends the window after its call: revoked at once; when the call
    /// failed and a standard token named the window, the answer to the
    /// tenant waits out the DC retry budget, so no late DC write lands in
    /// memory the tenant has back.
    // `mut` serves only the verbs build's fence.
    #[cfg_attr(not(feature = "verbs"), allow(unused_mut))]
    async fn close(mut self, ok: bool) {
        self.window.revoke();
        for w in &self.rails {
            w.revoke();
        }
        #[cfg(feature = "verbs")]
        if let Some(rest) = self.fence(if ok {
            s3dma_wire::dc::Ending::Completed
        } else {
            s3dma_wire::dc::Ending::Abandoned
        }) {
            tokio::time::sleep(rest).await;
        }
        // Completed, or fenced: nothing of its DC operations can land any
        // more, so dropping releases the buffer at once.
        #[cfg(feature = "verbs")]
        {
            self._tracked = None;
            self._rails_tracked.clear();
        }
        let _ = ok;
        drop(self);
    }
}

impl TenantService {
    /// Builds the service over the fabric `endpoints`, one per rail (rail
    /// 0 first; at least one).
    pub fn new(
        registry: Arc<Registry>,
        agent: AgentLink,
        endpoints: Arc<[Arc<Endpoint>]>,
        metrics: Arc<Metrics>,
        max_timeout: Duration,
    ) -> TenantService {
        assert!(!endpoints.is_empty(), "the shim serves at least one rail");
        TenantService {
            registry,
            agent,
            endpoints,
            metrics,
            max_timeout,
            #[cfg(feature = "verbs")]
            qp_host: None,
        }
    }

    /// The service with the agent's queue pairs on `host` (a verbs device).
    #[cfg(feature = "verbs")]
    #[must_use]
    pub fn with_qp_host(mut self, host: Option<Arc<crate::qp_link::QpHost>>) -> TenantService {
        self.qp_host = host;
        self
    }

    /// Identifies the caller, takes the permit admission gave the call and
    /// fixes its deadline.
    fn begin<T>(&self, req: &Request<T>, op: &'static str) -> Result<Call, Status> {
        let client = req.metadata().get("x-request-id").map(|v| v.as_bytes());
        let env = Envelope::new(
            STYLE,
            format!("shim-{:016x}", rand::random::<u64>()),
            s3dma_service::request::client_request_id(client),
        );
        let conn = req.extensions().get::<ConnInfo>();
        let permit = req.extensions().get::<Admitted>().and_then(Admitted::take);
        let (Some(conn), Some(permit)) = (conn, permit) else {
            return Err(ShimError::Internal(
                "the call was not admitted on a tenant connection".into(),
            )
            .into_status(env.id()));
        };
        let (peer, tenant) = (conn.peer, Arc::clone(&conn.tenant));
        env.record_client_id()
            .record("tenant", &tenant.name)
            .record("op", op);
        let timeout =
            grpc_timeout(req.metadata()).map_or(self.max_timeout, |t| t.min(self.max_timeout));
        Ok(Call {
            env,
            tenant,
            peer,
            timeout,
            op,
            object: String::new(),
            _permit: permit,
        })
    }

    /// Records the outcome of a call (its errors carry the shim's id or,
    /// from the agent, the agent's).
    fn finish<R>(&self, call: &Call, result: Result<R, Status>) -> Result<Response<R>, Status> {
        let about = About {
            tenant: &call.tenant.name,
            op: call.op,
            object: &call.object,
            pid: Some(call.peer.pid),
        };
        call.env
            .finish(&*self.metrics, about, result)
            .map(Response::new)
    }

    /// Forwards a call that names no buffer and records its outcome.
    async fn forward<M, R, F, Fut>(&self, call: &Call, msg: M, f: F) -> Result<Response<R>, Status>
    where
        M: Clone,
        F: Fn(AgentClient<Channel>, Request<M>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<R>, Status>>,
    {
        let result = self
            .agent
            .call(msg, call.request_id(), call.timeout, f)
            .await;
        self.finish(call, result)
    }

    fn err(&self, call: &Call, e: ShimError) -> Status {
        e.into_status(call.request_id())
    }

    /// Mints a window over `[offset, offset+len)` of `buffer`, living at
    /// most `timeout` (plus a grace), counted against the tenant's windows.
    fn mint(
        &self,
        tenant: &Arc<Tenant>,
        timeout: Duration,
        buffer: Arc<Buffer>,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<MintedWindow, ShimError> {
        let (Ok(off), Ok(n)) = (usize::try_from(offset), usize::try_from(len)) else {
            return Err(ShimError::OutOfBounds("offset or length too large".into()));
        };
        // One slot per slice, however many rails: the rails' windows
        // cover the same bytes and end together.
        let slot = tenant.window_slot()?;
        let (first, rest) = self
            .endpoints
            .split_first()
            .expect("the shim serves at least one rail");
        // Each rail's window comes from the buffer's registration on that
        // rail's device (verbs; on tcp all rails share one).
        let mint_on = |rail: usize,
                       endpoint: &Endpoint|
         -> Result<(Window, RdmaToken), ShimError> {
            let window = buffer
                .region_on(rail)
                .window(off, n, access, Some(timeout + WINDOW_GRACE))
                .map_err(|e| ShimError::Internal(format!("cannot mint a window: {e}")))?;
            match endpoint.token(&window) {
                Ok(token) => Ok((window, token)),
                Err(e) => {
                    // Not kept: revoked now, not left to its expiry.
                    window.revoke();
                    Err(ShimError::OutOfBounds(format!(
                        "{len} bytes cannot be named by one x-amz-rdma-token ({e}); split the transfer into parts below 4 GiB"
                    )))
                }
            }
        };
        let (window, token) = mint_on(0, first)?;
        self.metrics.windows_open.inc();
        let mut minted = MintedWindow {
            #[cfg(feature = "verbs")]
            _tracked: self.qp_host.as_ref().map(|h| h.track(&window, &token)),
            #[cfg(feature = "verbs")]
            _rails_tracked: Vec::new(),
            window,
            token: token.to_string(),
            rails: Vec::new(),
            rail_tokens: Vec::new(),
            metrics: Arc::clone(&self.metrics),
            _in_use: Some(InUse::new(Arc::clone(&buffer))),
            _slot: slot,
        };
        // The other rails' windows; a failure drops `minted`, which
        // revokes every window minted so far.
        for (i, endpoint) in rest.iter().enumerate() {
            let (window, token) = mint_on(i + 1, endpoint)?;
            #[cfg(feature = "verbs")]
            if let Some(h) = &self.qp_host {
                minted._rails_tracked.push(h.track(&window, &token));
            }
            minted.rails.push(window);
            minted.rail_tokens.push(token.to_string());
        }
        Ok(minted)
    }

    /// The buffer and byte span a [`api::BufferSlice`] names. `default_len`
    /// applies when the slice has no length (GET: to the end of the buffer,
    /// or the bounded range's length if shorter).
    fn resolve(
        &self,
        call: &Call,
        slice: Option<&api::BufferSlice>,
        what: &str,
        range: Option<&agent::ByteRange>,
        length_required: bool,
    ) -> Result<(Arc<Buffer>, u64, u64), ShimError> {
        let s = slice.ok_or_else(|| ShimError::InvalidArgument(format!("{what} is required")))?;
        let buffer = self.registry.buffer(&call.tenant, s.buffer_id)?;
        let size = buffer.size();
        if s.offset > size {
            return Err(ShimError::OutOfBounds(format!(
                "{what}.offset {} is past the end of buffer {} ({size} bytes)",
                s.offset, s.buffer_id
            )));
        }
        let rest = size - s.offset;
        let len = match s.length {
            Some(l) => l,
            None if length_required => {
                return Err(ShimError::InvalidArgument(format!(
                    "{what}.length is required (the object's exact size; 0 for an empty object)"
                )));
            }
            None => match range.and_then(|r| r.kind.as_ref()) {
                Some(agent::byte_range::Kind::Bounded(b)) if b.last >= b.first => {
                    (b.last - b.first).saturating_add(1).min(rest)
                }
                Some(agent::byte_range::Kind::Suffix(n)) => (*n).min(rest),
                _ => rest,
            },
        };
        if len > rest {
            return Err(ShimError::OutOfBounds(format!(
                "{what}: {len} bytes at offset {} do not fit in buffer {} ({size} bytes)",
                s.offset, s.buffer_id
            )));
        }
        Ok((buffer, s.offset, len))
    }
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<agent::GetObjectsReply, Status>> + Send>>;

#[tonic::async_trait]
impl api::tenant_server::Tenant for TenantService {
    async fn info(
        &self,
        req: Request<api::InfoRequest>,
    ) -> Result<Response<api::InfoResponse>, Status> {
        let call = self.begin(&req, "Info")?;
        let (buffers, bytes) = self.registry.buffers(&call.tenant);
        let r = api::InfoResponse {
            tenant: call.tenant.name.clone(),
            uid: call.peer.uid,
            gid: call.peer.gid,
            max_buffers: call.tenant.max_buffers,
            max_buffer_bytes: call.tenant.max_buffer_bytes,
            buffers: u32::try_from(buffers.len()).unwrap_or(u32::MAX),
            buffer_bytes: bytes,
            agent_connected: self.agent.is_up(),
            version: env!("CARGO_PKG_VERSION").into(),
        };
        self.finish(&call, Ok(r))
    }

    async fn register_buffer(
        &self,
        req: Request<api::RegisterBufferRequest>,
    ) -> Result<Response<api::RegisterBufferResponse>, Status> {
        let call = self.begin(&req, "RegisterBuffer")?;
        let r = req.into_inner();
        let result = match &r.memory {
            Some(api::register_buffer_request::Memory::Host(h)) => {
                self.registry
                    .register_host(&call.tenant, &r.lease, &h.fd_handle, h.size, &r.label)
            }
            Some(api::register_buffer_request::Memory::Cuda(c)) => {
                match (c.fd_handle.is_empty(), c.ipc_handle.is_empty()) {
                    (false, false) | (true, true) => Err(ShimError::InvalidArgument(
                        "cuda memory needs exactly one of fd_handle (a CUDA fd passed on the lease; the supported way) and ipc_handle (legacy)".into(),
                    )),
                    (false, true) => self.registry.register_cuda(
                        &call.tenant,
                        &r.lease,
                        CudaHandle::Fd(&c.fd_handle),
                        c.device,
                        c.size,
                        &r.label,
                    ),
                    (true, false) => self.registry.register_cuda(
                        &call.tenant,
                        &r.lease,
                        CudaHandle::LegacyIpc(&c.ipc_handle),
                        c.device,
                        c.size,
                        &r.label,
                    ),
                }
            }
            None => Err(ShimError::InvalidArgument(
                "memory (host or cuda) is required".into(),
            )),
        };
        let result = result
            .map(|b| {
                tracing::debug!(tenant = %call.tenant.name, buffer = b.id, size = b.size(), kind = b.kind(), "buffer registered");
                api::RegisterBufferResponse {
                    buffer_id: b.id,
                    size: b.size(),
                }
            })
            .map_err(|e| self.err(&call, e));
        self.finish(&call, result)
    }

    async fn release_buffer(
        &self,
        req: Request<api::ReleaseBufferRequest>,
    ) -> Result<Response<api::ReleaseBufferResponse>, Status> {
        let call = self.begin(&req, "ReleaseBuffer")?;
        let id = req.get_ref().buffer_id;
        let result = self
            .registry
            .release(&call.tenant, id)
            .map(|()| api::ReleaseBufferResponse {})
            .map_err(|e| self.err(&call, e));
        self.finish(&call, result)
    }

    async fn list_buffers(
        &self,
        req: Request<api::ListBuffersRequest>,
    ) -> Result<Response<api::ListBuffersResponse>, Status> {
        let call = self.begin(&req, "ListBuffers")?;
        let (buffers, _) = self.registry.buffers(&call.tenant);
        let r = api::ListBuffersResponse {
            buffers: buffers
                .iter()
                .map(|b| api::BufferInfo {
                    buffer_id: b.id,
                    size: b.size(),
                    label: b.label.clone(),
                    kind: b.kind().into(),
                    in_use: b.in_use.load(std::sync::atomic::Ordering::Relaxed),
                })
                .collect(),
        };
        self.finish(&call, Ok(r))
    }

    async fn get_object(
        &self,
        req: Request<api::GetObjectRequest>,
    ) -> Result<Response<agent::GetObjectResponse>, Status> {
        let mut call = self.begin(&req, "GetObject")?;
        let r = req.into_inner();
        call.on(&r.bucket, &r.key);
        let result = async {
            let (buffer, offset, len) = self
                .resolve(
                    &call,
                    r.destination.as_ref(),
                    "destination",
                    r.range.as_ref(),
                    false,
                )
                .map_err(|e| self.err(&call, e))?;
            let window = self
                .mint(
                    &call.tenant,
                    call.timeout,
                    buffer,
                    offset,
                    len,
                    Access::REMOTE_WRITE,
                )
                .map_err(|e| self.err(&call, e))?;
            let msg = agent::GetObjectRequest {
                tenant: call.tenant.name.clone(),
                bucket: r.bucket,
                key: r.key,
                range: r.range,
                destination: window.token.clone(),
                destination_rails: window.rail_tokens.clone(),
                if_match: r.if_match,
            };
            let resp = self
                .agent
                .call(
                    msg,
                    call.request_id(),
                    call.timeout,
                    |mut c, m| async move { c.get_object(m).await },
                )
                .await;
            // Revoke before answering: nothing lands once the tenant reads.
            window.close(resp.is_ok()).await;
            let resp = resp?;
            self.metrics
                .bytes
                .with_label_values(&[&call.tenant.name, "GetObject"])
                .inc_by(resp.bytes_placed);
            Ok(resp)
        }
        .await;
        self.finish(&call, result)
    }

    type GetObjectsStream = ReplyStream;

    async fn get_objects(
        &self,
        req: Request<api::GetObjectsRequest>,
    ) -> Result<Response<Self::GetObjectsStream>, Status> {
        let call = self.begin(&req, "GetObjects")?;
        let r = req.into_inner();
        if let Err(e) = call.check_batch_len(r.items.len()) {
            return self.finish(&call, Err(self.err(&call, e)));
        }
        let batch = match self.get_batch(&call, r) {
            Ok(b) => b,
            Err(status) => return self.finish(&call, Err(status)),
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<agent::GetObjectsReply, Status>>(64);
        let result = self.finish(&call, Ok(()));
        let me = self.clone();
        let deadline = tokio::time::Instant::now() + call.timeout;
        let (tenant, timeout, request_id) = (
            Arc::clone(&call.tenant),
            call.timeout,
            call.request_id().to_owned(),
        );
        // The batch's permit lives as long as its items run.
        let permit = call._permit;
        tokio::spawn(async move {
            let _permit = permit;
            let run = me.run_get_batch(&tenant, &request_id, timeout, batch, &tx);
            tokio::select! {
                () = run => {}
                // The tenant went away: dropping the run revokes the
                // windows and cancels the agent call.
                () = tx.closed() => {}
                () = tokio::time::sleep_until(deadline) => {
                    let _ = tx.send(Err(Status::deadline_exceeded("the batch ran past its deadline"))).await;
                }
            }
        });
        let mut rx = rx;
        let out = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        result.map(|r| r.map(|()| Box::pin(out) as ReplyStream))
    }

    async fn put_object(
        &self,
        req: Request<api::PutObjectRequest>,
    ) -> Result<Response<agent::PutObjectResponse>, Status> {
        let mut call = self.begin(&req, "PutObject")?;
        let r = req.into_inner();
        call.on(&r.bucket, &r.key);
        let result = async {
            let (buffer, offset, len) = self
                .resolve(&call, r.source.as_ref(), "source", None, true)
                .map_err(|e| self.err(&call, e))?;
            let window = self
                .mint(
                    &call.tenant,
                    call.timeout,
                    buffer,
                    offset,
                    len,
                    Access::REMOTE_READ,
                )
                .map_err(|e| self.err(&call, e))?;
            let msg = agent::PutObjectRequest {
                tenant: call.tenant.name.clone(),
                bucket: r.bucket,
                key: r.key,
                source: window.token.clone(),
                source_rails: window.rail_tokens.clone(),
                content_type: r.content_type,
                metadata: r.metadata,
            };
            let resp = self
                .agent
                .call(
                    msg,
                    call.request_id(),
                    call.timeout,
                    |mut c, m| async move { c.put_object(m).await },
                )
                .await;
            window.close(resp.is_ok()).await;
            let resp = resp?;
            self.metrics
                .bytes
                .with_label_values(&[&call.tenant.name, "PutObject"])
                .inc_by(resp.size);
            Ok(resp)
        }
        .await;
        self.finish(&call, result)
    }

    async fn head_object(
        &self,
        req: Request<api::HeadObjectRequest>,
    ) -> Result<Response<agent::HeadObjectResponse>, Status> {
        let mut call = self.begin(&req, "HeadObject")?;
        let r = req.into_inner();
        call.on(&r.bucket, &r.key);
        let msg = agent::HeadObjectRequest {
            tenant: call.tenant.name.clone(),
            bucket: r.bucket,
            key: r.key,
        };
        self.forward(&call, msg, |mut c, m| async move { c.head_object(m).await })
            .await
    }

    async fn list_objects(
        &self,
        req: Request<api::ListObjectsRequest>,
    ) -> Result<Response<agent::ListObjectsResponse>, Status> {
        let mut call = self.begin(&req, "ListObjects")?;
        let r = req.into_inner();
        call.on(&r.bucket, &r.prefix);
        let msg = agent::ListObjectsRequest {
            tenant: call.tenant.name.clone(),
            bucket: r.bucket,
            prefix: r.prefix,
            delimiter: r.delimiter,
            continuation_token: r.continuation_token,
            max_keys: r.max_keys,
            start_after: r.start_after,
        };
        self.forward(
            &call,
            msg,
            |mut c, m| async move { c.list_objects(m).await },
        )
        .await
    }

    async fn delete_object(
        &self,
        req: Request<api::DeleteObjectRequest>,
    ) -> Result<Response<agent::DeleteObjectResponse>, Status> {
        let mut call = self.begin(&req, "DeleteObject")?;
        let r = req.into_inner();
        call.on(&r.bucket, &r.key);
        let msg = agent::DeleteObjectRequest {
            tenant: call.tenant.name.clone(),
            bucket: r.bucket,
            key: r.key,
        };
        self.forward(
            &call,
            msg,
            |mut c, m| async move { c.delete_object(m).await },
        )
        .await
    }

    async fn head_objects(
        &self,
        req: Request<api::HeadObjectsRequest>,
    ) -> Result<Response<agent::HeadObjectsResponse>, Status> {
        let call = self.begin(&req, "HeadObjects")?;
        let r = req.into_inner();
        if let Err(e) = call.check_batch_len(r.items.len()) {
            return self.finish(&call, Err(self.err(&call, e)));
        }
        let msg = agent::HeadObjectsRequest {
            tenant: call.tenant.name.clone(),
            items: r.items,
            concurrency: r.concurrency,
        };
        self.forward(
            &call,
            msg,
            |mut c, m| async move { c.head_objects(m).await },
        )
        .await
    }

    async fn put_objects(
        &self,
        req: Request<api::PutObjectsRequest>,
    ) -> Result<Response<agent::PutObjectsResponse>, Status> {
        let call = self.begin(&req, "PutObjects")?;
        let r = req.into_inner();
        if let Err(e) = call.check_batch_len(r.items.len()) {
            return self.finish(&call, Err(self.err(&call, e)));
        }
        let result = self.put_batch(&call, r).await;
        self.finish(&call, result)
    }

    async fn delete_objects(
        &self,
        req: Request<api::DeleteObjectsRequest>,
    ) -> Result<Response<agent::DeleteObjectsResponse>, Status> {
        let call = self.begin(&req, "DeleteObjects")?;
        let r = req.into_inner();
        if let Err(e) = call.check_batch_len(r.items.len()) {
            return self.finish(&call, Err(self.err(&call, e)));
        }
        let msg = agent::DeleteObjectsRequest {
            tenant: call.tenant.name.clone(),
            items: r.items,
        };
        self.forward(
            &call,
            msg,
            |mut c, m| async move { c.delete_objects(m).await },
        )
        .await
    }
}

/// The tenant's deadline from `grpc-timeout` (e.g. `100m`, `5S`).
fn grpc_timeout(meta: &tonic::metadata::MetadataMap) -> Option<Duration> {
    parse_grpc_timeout(meta.get("grpc-timeout")?.to_str().ok()?)
}

/// Parses the gRPC `TimeoutValue TimeoutUnit` format (at most 8 digits).
fn parse_grpc_timeout(s: &str) -> Option<Duration> {
    if s.len() < 2 || s.len() > 9 {
        return None;
    }
    let (digits, unit) = s.split_at(s.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "m", "5", "5x", "-5S", "123456789S", "1.5S", " 5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
