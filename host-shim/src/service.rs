//! `s3dma.tenant.v1.Tenant`: who is calling (from the connection's
//! [`Peer`]), which buffer bytes a request names, the per-request windows,
//! and the forwarding to the agent.
//!
//! A window covers exactly the bytes the request names (remote-write for
//! GET, remote-read for PUT), lives no longer than the request's deadline,
//! and is revoked when the request ends: it is dropped before the reply is
//! sent, and when the tenant cancels (tonic drops the handler) it drops
//! with it.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabric::{Access, Endpoint, Window};
use futures::Stream;
use s3dma_proto::agent::v1 as agent;
use s3dma_proto::agent::v1::agent_client::AgentClient;
use s3dma_proto::tenant::v1 as api;
use tokio::sync::OwnedSemaphorePermit;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::agent_link::AgentLink;
use crate::error::ShimError;
use crate::metrics::Metrics;
use crate::registry::{Buffer, InUse, Peer, Registry, Tenant};

/// Extra life of a window past the request's deadline (a guard only: the
/// window is revoked when the request ends).
const WINDOW_GRACE: Duration = Duration::from_secs(5);

/// Items in one GetObjects batch (each holds a window while it runs); the
/// agent's own limit.
const MAX_BATCH_ITEMS: usize = 100_000;

/// The tenant service.
#[derive(Debug, Clone)]
pub struct TenantService {
    registry: Arc<Registry>,
    agent: AgentLink,
    endpoint: Arc<Endpoint>,
    metrics: Arc<Metrics>,
    max_timeout: Duration,
}

/// One call in progress.
struct Call {
    tenant: Arc<Tenant>,
    peer: Peer,
    request_id: String,
    timeout: Duration,
    op: &'static str,
    started: Instant,
    _permit: OwnedSemaphorePermit,
}

/// A minted window, counted in the open-windows gauge.
struct MintedWindow {
    window: Window,
    token: String,
    metrics: Arc<Metrics>,
    _in_use: InUse,
}

impl Drop for MintedWindow {
    fn drop(&mut self) {
        self.window.revoke();
        self.metrics.windows_open.dec();
    }
}

impl TenantService {
    /// Builds the service.
    pub fn new(
        registry: Arc<Registry>,
        agent: AgentLink,
        endpoint: Arc<Endpoint>,
        metrics: Arc<Metrics>,
        max_timeout: Duration,
    ) -> TenantService {
        TenantService {
            registry,
            agent,
            endpoint,
            metrics,
            max_timeout,
        }
    }

    /// Identifies the caller, admits the call and fixes its deadline.
    fn begin<T>(&self, req: &Request<T>, op: &'static str) -> Result<Call, Status> {
        let request_id = request_id(req);
        let Some(peer) = req.extensions().get::<Peer>().copied() else {
            return Err(
                ShimError::Internal("no peer credentials on this connection".into())
                    .into_status(&request_id),
            );
        };
        let tenant = self.registry.tenant_of(peer).map_err(|e| {
            self.metrics
                .requests
                .with_label_values(&["", op, code_name(e.code())])
                .inc();
            e.into_status(&request_id)
        })?;
        let permit = Arc::clone(&tenant.requests)
            .try_acquire_owned()
            .map_err(|_| {
                let e = ShimError::TooManyRequests(format!(
                    "tenant {} has {} requests in the shim already (max_concurrent_requests); retry later",
                    tenant.name, tenant.max_concurrent_requests
                ));
                self.metrics
                    .requests
                    .with_label_values(&[&tenant.name, op, code_name(e.code())])
                    .inc();
                e.into_status(&request_id)
            })?;
        let timeout =
            grpc_timeout(req.metadata()).map_or(self.max_timeout, |t| t.min(self.max_timeout));
        Ok(Call {
            tenant,
            peer,
            request_id,
            timeout,
            op,
            started: Instant::now(),
            _permit: permit,
        })
    }

    /// Records the outcome of a call.
    fn finish<R>(&self, call: &Call, result: Result<R, Status>) -> Result<Response<R>, Status> {
        let code = match &result {
            Ok(_) => tonic::Code::Ok,
            Err(s) => s.code(),
        };
        self.metrics
            .requests
            .with_label_values(&[&call.tenant.name, call.op, code_name(code)])
            .inc();
        self.metrics
            .latency
            .with_label_values(&[call.op])
            .observe(call.started.elapsed().as_secs_f64());
        match &result {
            Ok(_) => tracing::debug!(
                request_id = %call.request_id, tenant = %call.tenant.name, op = call.op,
                pid = call.peer.pid, "ok"
            ),
            Err(s) => tracing::info!(
                request_id = %call.request_id, tenant = %call.tenant.name, op = call.op,
                pid = call.peer.pid, code = ?s.code(), message = %s.message(), "failed"
            ),
        }
        result.map(Response::new)
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
            .call(msg, &call.request_id, call.timeout, f)
            .await;
        self.finish(call, result)
    }

    fn err(&self, call: &Call, e: ShimError) -> Status {
        e.into_status(&call.request_id)
    }

    /// Mints a window over `[offset, offset+len)` of `buffer`.
    fn mint(
        &self,
        call: &Call,
        buffer: Arc<Buffer>,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<MintedWindow, ShimError> {
        let (Ok(off), Ok(n)) = (usize::try_from(offset), usize::try_from(len)) else {
            return Err(ShimError::OutOfBounds("offset or length too large".into()));
        };
        let window = buffer
            .region
            .window(off, n, access, Some(call.timeout + WINDOW_GRACE))
            .map_err(|e| ShimError::Internal(format!("cannot mint a window: {e}")))?;
        let token = self.endpoint.token(&window).map_err(|e| {
            ShimError::OutOfBounds(format!(
                "{len} bytes cannot be named by one x-amz-rdma-token ({e}); split the transfer into parts below 4 GiB"
            ))
        })?;
        self.metrics.windows_open.inc();
        Ok(MintedWindow {
            window,
            token: token.to_string(),
            metrics: Arc::clone(&self.metrics),
            _in_use: InUse::new(buffer),
        })
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
            Some(api::register_buffer_request::Memory::Cuda(c)) => self.registry.register_cuda(
                &call.tenant,
                &r.lease,
                &c.ipc_handle,
                c.device,
                c.size,
                &r.label,
            ),
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
        let call = self.begin(&req, "GetObject")?;
        let r = req.into_inner();
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
                .mint(&call, buffer, offset, len, Access::REMOTE_WRITE)
                .map_err(|e| self.err(&call, e))?;
            let msg = agent::GetObjectRequest {
                tenant: call.tenant.name.clone(),
                bucket: r.bucket,
                key: r.key,
                range: r.range,
                destination: window.token.clone(),
                if_match: r.if_match,
            };
            let resp = self
                .agent
                .call(msg, &call.request_id, call.timeout, |mut c, m| async move {
                    c.get_object(m).await
                })
                .await;
            // Revoke before answering: nothing lands once the tenant reads.
            drop(window);
            let resp = resp?;
            self.metrics
                .bytes
                .with_label_values(&[&call.tenant.name, "get"])
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
        if r.items.len() > MAX_BATCH_ITEMS {
            let e = ShimError::InvalidArgument(format!(
                "a batch has at most {MAX_BATCH_ITEMS} items, not {}",
                r.items.len()
            ));
            return self.finish(&call, Err(self.err(&call, e)));
        }
        let mut windows = Vec::with_capacity(r.items.len());
        let mut items = Vec::with_capacity(r.items.len());
        for (i, item) in r.items.into_iter().enumerate() {
            let minted = self
                .resolve(
                    &call,
                    item.destination.as_ref(),
                    &format!("items[{i}].destination"),
                    item.range.as_ref(),
                    false,
                )
                .and_then(|(buffer, offset, len)| {
                    self.mint(&call, buffer, offset, len, Access::REMOTE_WRITE)
                });
            let window = match minted {
                Ok(w) => w,
                Err(e) => {
                    let status = self.err(&call, e);
                    return self.finish(&call, Err(status));
                }
            };
            items.push(agent::GetObjectsItem {
                bucket: item.bucket,
                key: item.key,
                range: item.range,
                destination: window.token.clone(),
            });
            windows.push(Some(window));
        }
        let msg = agent::GetObjectsRequest {
            tenant: call.tenant.name.clone(),
            items,
            concurrency: r.concurrency,
        };
        let stream = match self
            .agent
            .call(msg, &call.request_id, call.timeout, |mut c, m| async move {
                c.get_objects(m).await
            })
            .await
        {
            Ok(s) => s,
            Err(status) => return self.finish(&call, Err(status)),
        };
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<agent::GetObjectsReply, Status>>(16);
        let metrics = Arc::clone(&self.metrics);
        let tenant = call.tenant.name.clone();
        let deadline = tokio::time::Instant::now() + call.timeout;
        tokio::spawn(async move {
            let mut stream = stream;
            loop {
                let next = tokio::select! {
                    // The tenant went away: stop the agent and revoke.
                    () = tx.closed() => break,
                    () = tokio::time::sleep_until(deadline) => {
                        let _ = tx.send(Err(Status::deadline_exceeded("the batch ran past its deadline"))).await;
                        break;
                    }
                    n = stream.message() => n,
                };
                match next {
                    Ok(Some(reply)) => {
                        if let Some(w) = usize::try_from(reply.index)
                            .ok()
                            .and_then(|i| windows.get_mut(i))
                        {
                            w.take();
                        }
                        if let Some(agent::get_objects_reply::Result::Ok(ok)) = &reply.result {
                            metrics
                                .bytes
                                .with_label_values(&[&tenant, "get"])
                                .inc_by(ok.bytes_placed);
                        }
                        if tx.send(Ok(reply)).await.is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                }
            }
            drop(windows);
        });
        let out = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        self.finish(&call, Ok(Box::pin(out) as ReplyStream))
    }

    async fn put_object(
        &self,
        req: Request<api::PutObjectRequest>,
    ) -> Result<Response<agent::PutObjectResponse>, Status> {
        let call = self.begin(&req, "PutObject")?;
        let r = req.into_inner();
        let result = async {
            let (buffer, offset, len) = self
                .resolve(&call, r.source.as_ref(), "source", None, true)
                .map_err(|e| self.err(&call, e))?;
            let window = self
                .mint(&call, buffer, offset, len, Access::REMOTE_READ)
                .map_err(|e| self.err(&call, e))?;
            let msg = agent::PutObjectRequest {
                tenant: call.tenant.name.clone(),
                bucket: r.bucket,
                key: r.key,
                source: window.token.clone(),
                content_type: r.content_type,
                metadata: r.metadata,
            };
            let resp = self
                .agent
                .call(msg, &call.request_id, call.timeout, |mut c, m| async move {
                    c.put_object(m).await
                })
                .await;
            drop(window);
            let resp = resp?;
            self.metrics
                .bytes
                .with_label_values(&[&call.tenant.name, "put"])
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
        let call = self.begin(&req, "HeadObject")?;
        let r = req.into_inner();
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
        let call = self.begin(&req, "ListObjects")?;
        let r = req.into_inner();
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
        let call = self.begin(&req, "DeleteObject")?;
        let r = req.into_inner();
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
}

/// The caller's `x-request-id` when it is sane, else a fresh one.
fn request_id<T>(req: &Request<T>) -> String {
    if let Some(v) = req
        .metadata()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        && (1..=64).contains(&v.len())
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return v.to_owned();
    }
    format!("shim-{:016x}", rand::random::<u64>())
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

fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code as C;
    match code {
        C::Ok => "OK",
        C::Cancelled => "CANCELLED",
        C::Unknown => "UNKNOWN",
        C::InvalidArgument => "INVALID_ARGUMENT",
        C::DeadlineExceeded => "DEADLINE_EXCEEDED",
        C::NotFound => "NOT_FOUND",
        C::AlreadyExists => "ALREADY_EXISTS",
        C::PermissionDenied => "PERMISSION_DENIED",
        C::ResourceExhausted => "RESOURCE_EXHAUSTED",
        C::FailedPrecondition => "FAILED_PRECONDITION",
        C::Aborted => "ABORTED",
        C::OutOfRange => "OUT_OF_RANGE",
        C::Unimplemented => "UNIMPLEMENTED",
        C::Internal => "INTERNAL",
        C::Unavailable => "UNAVAILABLE",
        C::DataLoss => "DATA_LOSS",
        C::Unauthenticated => "UNAUTHENTICATED",
    }
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
