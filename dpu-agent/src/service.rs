//! The `s3dma.agent.v1.Agent` gRPC service host-shims call.
//!
//! Every call has been authenticated by the gate in front of the service
//! ([`crate::gate`]); here: check that the shim may act for the named
//! tenant, validate the request, check the tenant's
//! policy, admit it under the tenant's quota, run it under the request
//! deadline in the request's envelope ([`s3dma_service::request`]: the
//! agent's own id, the shim's id escaped, a `debug` span, metrics, the
//! failure line). Errors become statuses with S3 codes and the agent's id
//! ([`AgentError::to_status`]).

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use fabric::RdmaToken;
use futures::{Stream, StreamExt as _};
use s3dma_proto::agent::v1 as pb;
use tonic::{Request, Response, Status};
use tracing::{Level, debug};

use s3dma_service::Escaped;
use s3dma_service::request::{About, Envelope, Failure, RequestMetrics, Style};

use crate::auth::AuthError;
use crate::error::{AgentError, BadRequest};
use crate::gate::AuthenticatedShim;
use crate::names::{check_bucket, check_key};
use crate::policy::Access;
use crate::qp_link::QpLink;
use crate::transfer::batch::{self, Batch, Op, Outcome};
use crate::transfer::get::{self, GetRequest};
use crate::transfer::meta::{self, ListRequest};
use crate::transfer::put::{self, PutRequest};
use crate::transfer::rails::RailSet;
use crate::transfer::{Core, Ctx, Tenant};
use s3dma_wire::range::ByteRange;

mod batched;

/// The service.
#[derive(Debug, Clone)]
pub struct AgentService {
    core: Arc<Core>,
}

/// Counts a request as in flight for its tenant until dropped.
struct InFlight {
    core: Arc<Core>,
    tenant: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.core.metrics.in_flight(&self.tenant, -1);
    }
}

/// The agent's own id for a new request (what targets see in
/// `x-s3dma-request-id` and what replies and errors carry).
fn new_request_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The agent's envelopes: a `debug` span (at the default `info` level a
/// span per request cost a few per cent of the agent's CPU: its fields are
/// formatted when it opens; the failure line carries the same fields), the
/// failures of the shim's requests at `debug` too.
const STYLE: Style = Style {
    span: Level::DEBUG,
    client_failure: Level::DEBUG,
    ok: "ok",
};

/// A call's envelope: the agent's own id, and the `x-request-id` the shim
/// sent, kept only for the logs (`client_request_id`, escaped): client-
/// supplied, so never the agent's own id.
fn envelope<T>(req: &Request<T>) -> Envelope {
    let shim = req.metadata().get("x-request-id").map(|v| v.as_bytes());
    Envelope::new(
        STYLE,
        new_request_id(),
        s3dma_service::request::client_request_id(shim),
    )
}

impl RequestMetrics for crate::metrics::Metrics {
    fn request(&self, tenant: &str, op: &str, status: &str, elapsed: Duration) {
        crate::metrics::Metrics::request(self, tenant, op, status, elapsed);
    }
}

impl Failure for AgentError {
    type Reply = Status;

    fn status(&self) -> Cow<'static, str> {
        Cow::Borrowed(self.metric_label())
    }

    fn server_fault(&self) -> bool {
        matches!(
            self.grpc_code(),
            tonic::Code::Internal | tonic::Code::Unavailable
        )
    }

    /// Messages may quote keys and prefixes: the envelope escapes them.
    fn message(&self) -> Cow<'_, str> {
        Cow::Owned(self.to_string())
    }

    fn reply(self, request_id: &str) -> Status {
        self.to_status(request_id)
    }
}

/// The tenant's policy decision on one object (`verb` names the operation
/// in the denial message).
fn authorize(
    tenant: &Tenant,
    bucket: &str,
    key: &str,
    access: Access,
    verb: &str,
) -> Result<(), AgentError> {
    if tenant.policy.allows(bucket, key, access) {
        Ok(())
    } else {
        Err(AgentError::AccessDenied {
            tenant: tenant.name.clone(),
            verb: verb.to_owned(),
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        })
    }
}

fn parse_token(field: &str, token: &str) -> Result<RdmaToken, AgentError> {
    token.parse::<RdmaToken>().map_err(|e| {
        AgentError::InvalidArgument(BadRequest::Token {
            field: field.to_owned(),
            reason: e.to_string(),
        })
    })
}

/// The tenant's range (`None`: the whole object; so is a range without a kind).
fn range_spec(r: Option<&pb::ByteRange>) -> Result<Option<ByteRange>, AgentError> {
    Ok(r.and_then(|r| ByteRange::try_from(*r).ok()))
}

fn path_label(p: pb::TransferPath) -> &'static str {
    match p {
        pb::TransferPath::Rdma => "rdma",
        pb::TransferPath::Fallback => "fallback",
        pb::TransferPath::Mixed => "mixed",
        pb::TransferPath::Unspecified => "none",
    }
}

impl AgentService {
    /// The service over `core`. Shims are authenticated in front of it by
    /// [`crate::gate::Gate`], which every call must pass.
    #[must_use]
    pub fn new(core: Arc<Core>) -> AgentService {
        AgentService { core }
    }

    /// The shim the gate authenticated, and the tenant it names.
    fn tenant<T>(&self, req: &Request<T>, tenant: &str, rid: &str) -> Result<Arc<Tenant>, Status> {
        let Some(AuthenticatedShim(shim)) = req.extensions().get::<AuthenticatedShim>() else {
            // Every call passes the gate; a service used without it refuses.
            self.core.metrics.auth_failure("missing");
            return Err(Status::unauthenticated(AuthError::Missing.to_string()));
        };
        let known = self.core.tenants.get(tenant);
        match known {
            Some(t) if shim.may_act_for(tenant) => Ok(Arc::clone(t)),
            _ => {
                self.core.metrics.auth_failure("tenant_not_assigned");
                Err(AgentError::ShimNotAllowed {
                    shim: shim.name.clone(),
                    tenant: tenant.to_owned(),
                }
                .to_status(rid))
            }
        }
    }

    /// Runs `work` for `tenant` as operation `op` in its envelope: quota
    /// admission (one concurrency slot, held until `work` ends), deadline,
    /// span, metrics, failure line.
    async fn run<T, F>(
        &self,
        env: &Envelope,
        tenant: &Arc<Tenant>,
        op: &'static str,
        bucket: &str,
        work: F,
    ) -> Result<T, Status>
    where
        F: Future<Output = Result<T, AgentError>>,
    {
        env.record_client_id()
            .record("tenant", &tenant.name)
            .record("op", op)
            .record("bucket", Escaped(bucket));
        let core = &self.core;
        let res = env
            .run(async {
                core.metrics.queued(&tenant.name, tenant.quota.queued() + 1);
                let admitted = tenant.quota.admit().await;
                core.metrics.queued(&tenant.name, tenant.quota.queued());
                let _permit = admitted.map_err(AgentError::SlowDown)?;
                core.metrics.in_flight(&tenant.name, 1);
                let _guard = InFlight {
                    core: Arc::clone(core),
                    tenant: tenant.name.clone(),
                };
                let deadline = core.settings.request_timeout;
                match tokio::time::timeout(deadline, work).await {
                    Ok(r) => r,
                    Err(_) => Err(AgentError::DeadlineExceeded { deadline }),
                }
            })
            .await;
        let about = About {
            tenant: &tenant.name,
            op,
            object: bucket,
            pid: None,
        };
        env.finish(&*core.metrics, about, res)
    }

    /// A request on `bucket` (and `key`: with a group of targets, the
    /// request starts at the target of the object's first chunk).
    fn ctx(
        &self,
        tenant: &Arc<Tenant>,
        bucket: &str,
        key: &str,
        rid: &str,
        qp_link: Option<Arc<QpLink>>,
    ) -> Result<Arc<Ctx>, AgentError> {
        Ctx::new(&self.core, tenant, bucket, key, rid, qp_link.as_ref()).map(Arc::new)
    }

    /// The calling shim's `QueuePairs` link, if it has one open.
    fn qp_link<T>(&self, req: &Request<T>) -> Option<Arc<QpLink>> {
        let AuthenticatedShim(shim) = req.extensions().get::<AuthenticatedShim>()?;
        self.core.qp_links.get(&shim.name)
    }
}

/// One GET (shared by GetObject and GetObjects items).
async fn get_one(
    svc: &AgentService,
    tenant: &Arc<Tenant>,
    rid: &str,
    item: pb::GetObjectsItem,
    if_match: &str,
    qp_link: Option<Arc<QpLink>>,
) -> Result<pb::GetObjectResponse, AgentError> {
    let pb::GetObjectsItem {
        bucket,
        key,
        range,
        destination,
        destination_rails,
        ..
    } = item;
    let range = range.as_ref();
    let destination = destination.as_str();
    check_bucket(&bucket)?;
    check_key(&key)?;
    let range = range_spec(range)?;
    let dest = parse_token("destination", destination)?;
    let rails = RailSet::parse(
        "destination",
        &dest,
        "destination_rails",
        &destination_rails,
    )?;
    authorize(tenant, &bucket, &key, Access::Read, "read")?;
    debug!(key = %Escaped(&key), "get");
    let ctx = svc.ctx(tenant, &bucket, &key, rid, qp_link)?;
    let req = GetRequest {
        bucket,
        key,
        range,
        dest,
        if_match: (!if_match.is_empty()).then(|| if_match.to_owned()),
        rails,
    };
    let r = get::get_object(&ctx, &req).await?;
    svc.core
        .metrics
        .bytes(&tenant.name, "GetObject", path_label(r.path), r.placed);
    Ok(pb::GetObjectResponse {
        object: Some(r.info),
        bytes_placed: r.placed,
        range_start: r.start,
        path: r.path as i32,
        request_id: rid.to_owned(),
    })
}

type GetObjectsStream = Pin<Box<dyn Stream<Item = Result<pb::GetObjectsReply, Status>> + Send>>;

/// An item's failure as a GetObjects reply (a refusal of the quota, the
/// deadline or the policy is one item's error, not the batch's).
fn item_error(index: usize, status: &Status, rid: String) -> pb::GetObjectsReply {
    use tonic_types::StatusExt as _;
    let info = status.get_details_error_info();
    let (s3_code, message) = match info {
        Some(i) => (
            i.reason.clone(),
            i.metadata
                .get("message")
                .cloned()
                .unwrap_or_else(|| status.message().to_owned()),
        ),
        None => (String::new(), status.message().to_owned()),
    };
    pb::GetObjectsReply {
        index: u32::try_from(index).unwrap_or(u32::MAX),
        result: Some(pb::get_objects_reply::Result::Error(pb::ItemError {
            grpc_code: status.code() as i32,
            s3_code,
            message,
            request_id: rid,
        })),
    }
}

#[tonic::async_trait]
impl pb::agent_server::Agent for AgentService {
    async fn get_object(
        &self,
        request: Request<pb::GetObjectRequest>,
    ) -> Result<Response<pb::GetObjectResponse>, Status> {
        let env = envelope(&request);
        let tenant = self.tenant(&request, &request.get_ref().tenant, env.id())?;
        let qp_link = self.qp_link(&request);
        let r = request.into_inner();
        let bucket = r.bucket.clone();
        self.run(&env, &tenant, "GetObject", &bucket, async {
            get_one(
                self,
                &tenant,
                env.id(),
                pb::GetObjectsItem {
                    bucket: r.bucket,
                    key: r.key,
                    range: r.range,
                    destination: r.destination,
                    if_match: String::new(),
                    destination_rails: r.destination_rails,
                },
                &r.if_match,
                qp_link,
            )
            .await
        })
        .await
        .map(Response::new)
    }

    type GetObjectsStream = GetObjectsStream;

    async fn get_objects(
        &self,
        request: Request<pb::GetObjectsRequest>,
    ) -> Result<Response<Self::GetObjectsStream>, Status> {
        self.get_objects_streamed(request).await
    }

    async fn put_object(
        &self,
        request: Request<pb::PutObjectRequest>,
    ) -> Result<Response<pb::PutObjectResponse>, Status> {
        let env = envelope(&request);
        let rid = env.id().to_owned();
        let tenant = self.tenant(&request, &request.get_ref().tenant, &rid)?;
        let qp_link = self.qp_link(&request);
        let r = request.into_inner();
        let bucket = r.bucket.clone();
        self.run(&env, &tenant, "PutObject", &bucket, async {
            check_bucket(&r.bucket)?;
            check_key(&r.key)?;
            let src = parse_token("source", &r.source)?;
            let rails = RailSet::parse("source", &src, "source_rails", &r.source_rails)?;
            authorize(&tenant, &r.bucket, &r.key, Access::Write, "write")?;
            debug!(
                key = %Escaped(&r.key),
                metadata = %EscapedNames(&r.metadata),
                "put"
            );
            let ctx = self.ctx(&tenant, &r.bucket, &r.key, &rid, qp_link)?;
            let req = PutRequest {
                bucket: r.bucket,
                key: r.key,
                src,
                content_type: (!r.content_type.is_empty()).then_some(r.content_type),
                metadata: r.metadata,
                rails,
            };
            let out = put::put_object(&ctx, &req).await?;
            self.core
                .metrics
                .bytes(&tenant.name, "PutObject", path_label(out.path), out.size);
            Ok(pb::PutObjectResponse {
                etag: out.etag,
                size: out.size,
                path: out.path as i32,
                parts: out.parts,
                request_id: rid.clone(),
            })
        })
        .await
        .map(Response::new)
    }

    async fn head_object(
        &self,
        request: Request<pb::HeadObjectRequest>,
    ) -> Result<Response<pb::HeadObjectResponse>, Status> {
        let env = envelope(&request);
        let rid = env.id().to_owned();
        let tenant = self.tenant(&request, &request.get_ref().tenant, &rid)?;
        let r = request.into_inner();
        self.run(&env, &tenant, "HeadObject", &r.bucket, async {
            check_bucket(&r.bucket)?;
            check_key(&r.key)?;
            authorize(&tenant, &r.bucket, &r.key, Access::Read, "read")?;
            debug!(key = %Escaped(&r.key), "head");
            let ctx = self.ctx(&tenant, &r.bucket, &r.key, &rid, None)?;
            let info = meta::head_object(&ctx.ex, &r.bucket, &r.key, None).await?;
            Ok(pb::HeadObjectResponse {
                object: Some(info),
                request_id: rid.clone(),
            })
        })
        .await
        .map(Response::new)
    }

    async fn list_objects(
        &self,
        request: Request<pb::ListObjectsRequest>,
    ) -> Result<Response<pb::ListObjectsResponse>, Status> {
        let env = envelope(&request);
        let rid = env.id().to_owned();
        let tenant = self.tenant(&request, &request.get_ref().tenant, &rid)?;
        let r = request.into_inner();
        self.run(&env, &tenant, "ListObjects", &r.bucket, async {
            check_bucket(&r.bucket)?;
            if !tenant.policy.allows_list(&r.bucket, &r.prefix) {
                return Err(AgentError::AccessDenied {
                    tenant: tenant.name.clone(),
                    verb: "list".to_owned(),
                    bucket: r.bucket.clone(),
                    key: r.prefix.clone(),
                });
            }
            debug!(prefix = %Escaped(&r.prefix), "list");
            let ctx = self.ctx(&tenant, &r.bucket, &r.prefix, &rid, None)?;
            let req = ListRequest {
                bucket: r.bucket.clone(),
                prefix: r.prefix.clone(),
                delimiter: r.delimiter.clone(),
                continuation_token: r.continuation_token.clone(),
                max_keys: if r.max_keys == 0 {
                    1000
                } else {
                    r.max_keys.min(1000)
                },
                start_after: r.start_after.clone(),
            };
            let mut out = meta::list_objects(&ctx.ex, &req).await?;
            out.request_id = rid.clone();
            Ok(out)
        })
        .await
        .map(Response::new)
    }

    async fn delete_object(
        &self,
        request: Request<pb::DeleteObjectRequest>,
    ) -> Result<Response<pb::DeleteObjectResponse>, Status> {
        let env = envelope(&request);
        let rid = env.id().to_owned();
        let tenant = self.tenant(&request, &request.get_ref().tenant, &rid)?;
        let r = request.into_inner();
        self.run(&env, &tenant, "DeleteObject", &r.bucket, async {
            check_bucket(&r.bucket)?;
            check_key(&r.key)?;
            authorize(&tenant, &r.bucket, &r.key, Access::Write, "delete")?;
            debug!(key = %Escaped(&r.key), "delete");
            let ctx = self.ctx(&tenant, &r.bucket, &r.key, &rid, None)?;
            meta::delete_object(&ctx.ex, &r.bucket, &r.key).await?;
            Ok(pb::DeleteObjectResponse {
                request_id: rid.clone(),
            })
        })
        .await
        .map(Response::new)
    }

    async fn head_objects(
        &self,
        request: Request<pb::HeadObjectsRequest>,
    ) -> Result<Response<pb::HeadObjectsResponse>, Status> {
        let env = envelope(&request);
        let tenant = self.tenant(&request, &request.get_ref().tenant, env.id())?;
        let r = request.into_inner();
        let items = r.items.into_iter().map(|k| (k.bucket, k.key, None));
        let results = self
            .run_batch(&env, &tenant, Op::Head, r.concurrency, None, items, 0)
            .await?;
        let (mut found, mut missing) = (0u64, 0u64);
        let results = results
            .into_iter()
            .map(|r| pb::HeadObjectsResult {
                result: Some(match r {
                    Ok(Outcome::Found(info)) => {
                        found += 1;
                        pb::head_objects_result::Result::Object(info)
                    }
                    Ok(_) => {
                        missing += 1;
                        pb::head_objects_result::Result::Missing(pb::MissingObject {})
                    }
                    Err(e) => pb::head_objects_result::Result::Error(e),
                }),
            })
            .collect();
        let m = &self.core.metrics;
        m.batch_item(&tenant.name, "HeadObjects", "ok", found);
        m.batch_item(&tenant.name, "HeadObjects", "missing", missing);
        Ok(Response::new(pb::HeadObjectsResponse {
            results,
            request_id: env.id().to_owned(),
        }))
    }

    async fn put_objects(
        &self,
        request: Request<pb::PutObjectsRequest>,
    ) -> Result<Response<pb::PutObjectsResponse>, Status> {
        let env = envelope(&request);
        let tenant = self.tenant(&request, &request.get_ref().tenant, env.id())?;
        let qp_link = self.qp_link(&request);
        let r = request.into_inner();
        // Each token parsed once; the batch's bytes are its parsed sources'
        // sizes (a token that does not parse is that item's error).
        let items: Vec<_> = r
            .items
            .into_iter()
            .enumerate()
            .map(|(i, it)| {
                let src = batch::put_source(
                    i,
                    &it.source,
                    &it.source_rails,
                    it.content_type,
                    it.metadata,
                );
                (it.bucket, it.key, Some(src))
            })
            .collect();
        let bytes: u64 = items
            .iter()
            .filter_map(|(_, _, src)| src.as_ref()?.as_ref().ok())
            .map(|p| u64::from(p.src.size))
            .sum();
        let items = items.into_iter();
        let results = self
            .run_batch(&env, &tenant, Op::Put, r.concurrency, qp_link, items, bytes)
            .await?;
        // Bytes stored, by path (rdma, fallback, mixed, none).
        let mut stored = [0u64; 4];
        let results = results
            .into_iter()
            .map(|r| pb::PutObjectsResult {
                result: Some(match r {
                    Ok(Outcome::Stored(out)) => {
                        stored[(out.path as usize).min(3)] += out.size;
                        pb::put_objects_result::Result::Ok(pb::PutObjectResponse {
                            etag: out.etag,
                            size: out.size,
                            path: out.path as i32,
                            parts: out.parts,
                            request_id: env.id().to_owned(),
                        })
                    }
                    Ok(_) => pb::put_objects_result::Result::Error(batch::item_error(
                        &AgentError::internal("a PUT item came to no object"),
                        env.id(),
                    )),
                    Err(e) => pb::put_objects_result::Result::Error(e),
                }),
            })
            .collect::<Vec<_>>();
        let ok = results
            .iter()
            .filter(|r| matches!(r.result, Some(pb::put_objects_result::Result::Ok(_))))
            .count() as u64;
        let m = &self.core.metrics;
        m.batch_item(&tenant.name, "PutObjects", "ok", ok);
        for p in [
            pb::TransferPath::Unspecified,
            pb::TransferPath::Rdma,
            pb::TransferPath::Fallback,
            pb::TransferPath::Mixed,
        ] {
            m.bytes(
                &tenant.name,
                "PutObjects",
                path_label(p),
                stored[p as usize],
            );
        }
        Ok(Response::new(pb::PutObjectsResponse {
            results,
            request_id: env.id().to_owned(),
        }))
    }

    async fn delete_objects(
        &self,
        request: Request<pb::DeleteObjectsRequest>,
    ) -> Result<Response<pb::DeleteObjectsResponse>, Status> {
        let env = envelope(&request);
        let tenant = self.tenant(&request, &request.get_ref().tenant, env.id())?;
        let r = request.into_inner();
        let items = r.items.into_iter().map(|k| (k.bucket, k.key, None));
        let results = self
            .run_batch(&env, &tenant, Op::Delete, 0, None, items, 0)
            .await?;
        let mut ok = 0u64;
        let results = results
            .into_iter()
            .map(|r| pb::DeleteObjectsResult {
                error: match r {
                    Ok(_) => {
                        ok += 1;
                        None
                    }
                    Err(e) => Some(e),
                },
            })
            .collect();
        self.core
            .metrics
            .batch_item(&tenant.name, "DeleteObjects", "ok", ok);
        Ok(Response::new(pb::DeleteObjectsResponse {
            results,
            request_id: env.id().to_owned(),
        }))
    }

    type QueuePairsStream = QueuePairsStream;

    async fn queue_pairs(
        &self,
        request: Request<tonic::Streaming<pb::QpEvent>>,
    ) -> Result<Response<Self::QueuePairsStream>, Status> {
        let Some(AuthenticatedShim(shim)) = request.extensions().get::<AuthenticatedShim>() else {
            self.core.metrics.auth_failure("missing");
            return Err(Status::unauthenticated(AuthError::Missing.to_string()));
        };
        let shim = shim.name.clone();
        Ok(Response::new(
            self.queue_pairs_stream(&shim, request.into_inner()),
        ))
    }
}

/// The commands of one `QueuePairs` stream, ending when its link closes.
type QueuePairsStream = Pin<Box<dyn Stream<Item = Result<pb::QpCommand, Status>> + Send>>;

impl AgentService {
    /// Serves a shim's `QueuePairs` stream: the link becomes the shim's
    /// (an older one closes), the shim's answers go to the commands
    /// waiting for them, and the link closes when either side ends.
    fn queue_pairs_stream(
        &self,
        shim: &str,
        mut answers: tonic::Streaming<pb::QpEvent>,
    ) -> QueuePairsStream {
        let (tx, rx) = tokio::sync::mpsc::channel::<pb::QpCommand>(256);
        let link = Arc::new(QpLink::new(tx));
        self.core.qp_links.attach(shim, Arc::clone(&link));
        debug!(shim = %Escaped(shim), "queue-pair link opened");
        let closed = link.closed();
        let links = Arc::clone(&self.core.qp_links);
        let (shim, reader_link) = (shim.to_owned(), Arc::clone(&link));
        let reader = tokio::spawn(async move {
            let stop = reader_link.closed();
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    m = answers.message() => match m {
                        Ok(Some(ev)) => reader_link.deliver(ev),
                        Ok(None) | Err(_) => break,
                    },
                }
            }
            links.detach(&shim, &reader_link);
            debug!(shim = %Escaped(&shim), "queue-pair link closed");
        });
        let guard = AbortOnDrop(reader);
        Box::pin(futures::stream::unfold(
            (rx, closed, guard, link),
            |(mut rx, closed, guard, link)| async move {
                tokio::select! {
                    () = closed.cancelled() => None,
                    c = rx.recv() => c.map(|c| (Ok(c), (rx, closed, guard, link))),
                }
            },
        ))
    }
}

/// Metadata names of a PUT, escaped, for the logs (values are not logged).
struct EscapedNames<'a>(&'a std::collections::HashMap<String, String>);

impl std::fmt::Display for EscapedNames<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.0.keys().collect();
        names.sort();
        f.write_str("[")?;
        for (i, n) in names.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", Escaped(n))?;
        }
        f.write_str("]")
    }
}

/// Aborts the batch task when the response stream is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How long a shim waits before its call is refused when the agent is
/// shutting down (documented for operators).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
