//! Submission rings: GET, PUT and HEAD without a gRPC message per object.
//!
//! A lease may pass, in an `RG` frame, a sealed memfd in the
//! [`s3dma_ring`] layout (at most `leases.max_rings_per_lease` per lease,
//! `leases.max_rings_per_tenant` per tenant, `leases.ring_max_entries`
//! entries). The shim maps it and serves it with one thread that drains
//! the submission queue until it is empty, then sleeps on the ring's futex
//! (the tenant wakes it once per batch, only when it sleeps).
//!
//! Every entry is copied out of the shared memory before it is parsed
//! (`s3dma_ring::Submissions::take`), then runs as the same gRPC call
//! would: a [`tonic::Request`] carrying the lease's peer and tenant (its
//! `SO_PEERCRED` identity) and one of the tenant's request permits, handed
//! to the same [`TenantService`] handler (slice checks against the
//! tenant's own buffers, windows, deadlines, metrics, the agent call).
//! At most `leases.ring_max_in_flight` entries of a ring run at once; an
//! entry without a free request permit completes `RESOURCE_EXHAUSTED`.
//! A malformed entry completes `INVALID_ARGUMENT` with its own tag; a
//! ring whose indexes are corrupt is marked broken and served no more
//! (only that tenant's ring). The ring dies with its lease: its thread
//! stops, its running entries are cancelled (their windows revoked, as
//! when a gRPC caller goes away), and the mapping goes with the last of
//! them.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd as _, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use s3dma_proto::agent::v1 as agent;
use s3dma_proto::tenant::v1 as api;
use s3dma_proto::tenant::v1::tenant_server::Tenant as _;
use s3dma_ring::{Completer, Completion, Op, Ring, RingError, Submission, Taken};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::admission::Admitted;
use crate::config::LeaseConfig;
use crate::error::ShimError;
use crate::registry::{Peer, Tenant};
use crate::service::TenantService;
use crate::socket::{Activity, ConnInfo};

/// Longest sleep of a ring's thread between checks that its lease lives.
const IDLE_WAIT: Duration = Duration::from_millis(250);
/// Pause after a wake that found nothing to do (a tenant rewriting the
/// wake word cannot make the thread spin faster than this).
const SPURIOUS_PAUSE: Duration = Duration::from_millis(1);

/// The rings of every lease: the service their entries run through and
/// the limits.
#[derive(Debug)]
pub struct RingHost {
    service: TenantService,
    runtime: tokio::runtime::Handle,
    per_lease: usize,
    per_tenant: usize,
    max_entries: u32,
    max_in_flight: usize,
    /// Rings open, by tenant name.
    open: Mutex<HashMap<String, usize>>,
}

/// Why a ring was not opened (the `RG` frame's error reply).
#[derive(Debug, thiserror::Error)]
pub enum RingRefused {
    /// Rings are off, or the lease has its share.
    #[error("this lease may open {0} ring(s) (leases.max_rings_per_lease) and has them")]
    PerLease(usize),
    /// The tenant has its share.
    #[error(
        "tenant holds {0} rings already (leases.max_rings_per_tenant); close a lease's ring first"
    )]
    PerTenant(usize),
    /// Not a ring.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// The thread could not start.
    #[error("cannot start the ring's thread: {0}")]
    Thread(std::io::Error),
}

impl RingHost {
    /// The host for `service`, with the `leases:` limits, running entries
    /// on the current tokio runtime.
    #[must_use]
    pub fn new(service: TenantService, leases: &LeaseConfig) -> RingHost {
        RingHost {
            service,
            runtime: tokio::runtime::Handle::current(),
            per_lease: leases.max_rings_per_lease,
            per_tenant: leases.max_rings_per_tenant,
            max_entries: leases.ring_max_entries,
            max_in_flight: leases.ring_max_in_flight as usize,
            open: Mutex::default(),
        }
    }

    /// Opens the ring `fd` passed on a lease of `tenant` (`peer`) that
    /// holds `held` rings; the guard closes it when dropped (with the lease).
    ///
    /// # Errors
    /// [`RingRefused`] saying which limit, or what is wrong with the memfd.
    fn open_ring(
        self: &Arc<Self>,
        tenant: &Arc<Tenant>,
        peer: Peer,
        fd: OwnedFd,
        held: usize,
    ) -> Result<RingGuard, RingRefused> {
        if held >= self.per_lease {
            return Err(RingRefused::PerLease(self.per_lease));
        }
        let ring = Arc::new(Ring::attach(fd.as_fd(), self.max_entries)?);
        drop(fd); // the mapping keeps the memory
        {
            let mut open = lock(&self.open);
            let n = open.entry(tenant.name.clone()).or_insert(0);
            if *n >= self.per_tenant {
                return Err(RingRefused::PerTenant(*n));
            }
            *n += 1;
        }
        let shared = Arc::new(Shared {
            completer: Mutex::new(Posting {
                completer: ring.completer(),
                waiting: VecDeque::new(),
            }),
            ring,
            in_flight: AtomicUsize::new(0),
            max_in_flight: self.max_in_flight,
            closed: AtomicBool::new(false),
            cancel: CancellationToken::new(),
        });
        let guard = RingGuard {
            shared: Arc::clone(&shared),
            host: Arc::clone(self),
            tenant: tenant.name.clone(),
        };
        let conn = ConnInfo {
            peer,
            tenant: Arc::clone(tenant),
            activity: Arc::new(Activity::new()),
        };
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("s3dma-ring".into())
            .spawn(move || me.serve(&shared, &conn))
            .map_err(RingRefused::Thread)?;
        tracing::debug!(tenant = %tenant.name, pid = peer.pid, entries = guard.shared.ring.entries(), "ring opened");
        Ok(guard)
    }

    /// The ring's thread: drain, run, sleep; until the lease closes or the
    /// ring is corrupt.
    fn serve(&self, shared: &Arc<Shared>, conn: &ConnInfo) {
        let mut subs = shared.ring.submissions();
        while !shared.closed.load(Ordering::Acquire) {
            shared.post(None);
            let mut took = false;
            while shared.in_flight.load(Ordering::Acquire) < shared.max_in_flight {
                match subs.take() {
                    Ok(Some(t)) => {
                        took = true;
                        shared.in_flight.fetch_add(1, Ordering::AcqRel);
                        self.dispatch(shared, conn, t);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::info!(tenant = %conn.tenant.name, pid = conn.peer.pid, error = %e, "ring marked broken");
                        shared.break_ring();
                        return;
                    }
                }
            }
            if took {
                continue; // drain until empty before sleeping
            }
            let seen = subs.wake_seen();
            let at_cap = shared.in_flight.load(Ordering::Acquire) >= shared.max_in_flight;
            if at_cap {
                subs.wait_kick(seen, IDLE_WAIT);
            } else {
                subs.wait(IDLE_WAIT);
            }
            let still_idle = if at_cap {
                shared.in_flight.load(Ordering::Acquire) >= shared.max_in_flight
            } else {
                matches!(subs.pending(), Ok(0))
            };
            if still_idle {
                std::thread::sleep(SPURIOUS_PAUSE);
            }
        }
    }

    /// Runs one taken entry on the runtime; its completion is posted when
    /// it ends (not at all when the lease closed first).
    fn dispatch(&self, shared: &Arc<Shared>, conn: &ConnInfo, t: Taken) {
        let (service, conn, shared) = (self.service.clone(), conn.clone(), Arc::clone(shared));
        self.runtime.spawn(async move {
            let cancel = shared.cancel.clone();
            let done = tokio::select! {
                c = run(&service, &conn, t) => c,
                // Dropping the call revokes its window, as when a gRPC
                // caller goes away.
                () = cancel.cancelled() => return,
            };
            shared.post(Some(done));
        });
    }
}

/// One entry through the gRPC handler its op has.
async fn run(service: &TenantService, conn: &ConnInfo, t: Taken) -> Completion {
    let user_data = t.user_data;
    let s = match t.request {
        Ok(s) => s,
        Err(e) => {
            let e = ShimError::InvalidArgument(format!("ring entry: {e}"));
            return failed(user_data, &e.into_status(&request_id()));
        }
    };
    let Ok(permit) = Arc::clone(&conn.tenant.requests).try_acquire_owned() else {
        let e = ShimError::TooManyRequests(format!(
            "tenant {} has {} requests in the shim (max_concurrent_requests); retry later",
            conn.tenant.name, conn.tenant.max_concurrent_requests
        ));
        return failed(user_data, &e.into_status(&request_id()));
    };
    let admitted = Admitted::new(permit);
    let slice = |s: &Submission| api::BufferSlice {
        buffer_id: s.buffer_id,
        offset: s.offset,
        length: s.length,
    };
    match s.op {
        Op::Get => {
            let msg = api::GetObjectRequest {
                destination: Some(slice(&s)),
                range: s.range.map(range),
                bucket: s.bucket,
                key: s.key,
                if_match: String::new(),
            };
            match service.get_object(grpc_request(msg, conn, admitted)).await {
                Ok(r) => {
                    let r = r.into_inner();
                    let mut c = info(user_data, r.object.as_ref());
                    c.bytes_placed = r.bytes_placed;
                    c.range_start = r.range_start;
                    c.path = u8::try_from(r.path).unwrap_or(0);
                    c.request_id = r.request_id;
                    c
                }
                Err(e) => failed(user_data, &e),
            }
        }
        Op::Put => {
            let msg = api::PutObjectRequest {
                source: Some(slice(&s)),
                bucket: s.bucket,
                key: s.key,
                content_type: String::new(),
                metadata: HashMap::new(),
            };
            match service.put_object(grpc_request(msg, conn, admitted)).await {
                Ok(r) => {
                    let r = r.into_inner();
                    Completion {
                        user_data,
                        size: r.size,
                        parts: r.parts,
                        path: u8::try_from(r.path).unwrap_or(0),
                        etag: r.etag,
                        request_id: r.request_id,
                        ..Completion::default()
                    }
                }
                Err(e) => failed(user_data, &e),
            }
        }
        Op::Head => {
            let msg = api::HeadObjectRequest {
                bucket: s.bucket,
                key: s.key,
            };
            match service.head_object(grpc_request(msg, conn, admitted)).await {
                Ok(r) => {
                    let r = r.into_inner();
                    let mut c = info(user_data, r.object.as_ref());
                    c.request_id = r.request_id;
                    c
                }
                Err(e) => failed(user_data, &e),
            }
        }
    }
}

/// An id for the shim's own refusals of an entry (as `begin` makes for
/// a call).
fn request_id() -> String {
    format!("shim-{:016x}", rand::random::<u64>())
}

/// The request as tonic hands it to a handler: the connection's peer and
/// tenant, and the admitted permit.
fn grpc_request<M>(msg: M, conn: &ConnInfo, admitted: Admitted) -> tonic::Request<M> {
    let mut r = tonic::Request::new(msg);
    r.extensions_mut().insert(conn.clone());
    r.extensions_mut().insert(admitted);
    r
}

fn range(r: s3dma_ring::Range) -> agent::ByteRange {
    use agent::byte_range::{Bounded, Kind};
    let kind = match r {
        s3dma_ring::Range::Bounded { first, last } => Kind::Bounded(Bounded { first, last }),
        s3dma_ring::Range::From(first) => Kind::From(first),
        s3dma_ring::Range::Suffix(n) => Kind::Suffix(n),
    };
    agent::ByteRange { kind: Some(kind) }
}

fn info(user_data: u64, o: Option<&agent::ObjectInfo>) -> Completion {
    let mut c = Completion {
        user_data,
        ..Completion::default()
    };
    if let Some(o) = o {
        c.size = o.size;
        c.etag.clone_from(&o.etag);
        c.last_modified_ms = o.last_modified_unix_ms;
    }
    c
}

/// A failed call as its completion: the gRPC code, and from the status's
/// `ErrorInfo` (as a gRPC caller would read it) the reason, message and
/// request id.
fn failed(user_data: u64, e: &Status) -> Completion {
    use tonic_types::StatusExt as _;
    let (reason, message, request_id) = match e.get_details_error_info() {
        Some(mut info) => (
            info.reason,
            info.metadata
                .remove("message")
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| e.message().to_owned()),
            info.metadata.remove("request_id").unwrap_or_default(),
        ),
        None => (String::new(), e.message().to_owned(), String::new()),
    };
    Completion {
        user_data,
        // Codes are 1..=16; 0 would read as success.
        status: u32::try_from(i32::from(e.code())).unwrap_or(2).max(1),
        reason,
        request_id,
        message,
        ..Completion::default()
    }
}

/// What a ring's thread and its running entries share.
#[derive(Debug)]
struct Shared {
    ring: Arc<Ring>,
    completer: Mutex<Posting>,
    /// Entries taken and not yet posted (running or waiting for room).
    in_flight: AtomicUsize,
    max_in_flight: usize,
    closed: AtomicBool,
    cancel: CancellationToken,
}

/// The completion queue's producer and what did not fit in it yet (at
/// most `max_in_flight` entries: each is counted in flight until posted).
#[derive(Debug)]
struct Posting {
    completer: Completer,
    waiting: VecDeque<Completion>,
}

impl Shared {
    /// Posts `done` (and whatever waited for room), publishing once.
    fn post(&self, done: Option<Completion>) {
        let mut guard = lock(&self.completer);
        let p = &mut *guard;
        if let Some(c) = done {
            p.waiting.push_back(c);
        }
        let mut posted = 0;
        while let Some(c) = p.waiting.front() {
            match p.completer.push(c) {
                Ok(()) => {
                    p.waiting.pop_front();
                    posted += 1;
                }
                Err(RingError::Full) => break,
                Err(_) => {
                    drop(guard);
                    self.break_ring();
                    return;
                }
            }
        }
        p.completer.publish();
        drop(guard);
        if posted > 0 {
            let before = self.in_flight.fetch_sub(posted, Ordering::AcqRel);
            if before >= self.max_in_flight {
                self.ring.kick_submissions();
            }
        }
    }

    fn break_ring(&self) {
        self.close();
    }

    /// Ends the ring: marked (so the tenant's waiters learn it), its
    /// thread and running entries stopped.
    fn close(&self) {
        self.ring.mark_broken();
        self.closed.store(true, Ordering::Release);
        self.cancel.cancel();
        self.ring.kick_submissions();
    }
}

impl crate::socket::Rings for RingHost {
    fn open(
        self: Arc<Self>,
        tenant: &Arc<Tenant>,
        peer: Peer,
        fd: OwnedFd,
        held: usize,
    ) -> Result<crate::socket::RingHeld, String> {
        self.open_ring(tenant, peer, fd, held)
            .map(|g| Box::new(g) as crate::socket::RingHeld)
            .map_err(|e| e.to_string())
    }
}

/// One open ring of a lease, closed when dropped.
#[derive(Debug)]
struct RingGuard {
    shared: Arc<Shared>,
    host: Arc<RingHost>,
    tenant: String,
}

impl Drop for RingGuard {
    fn drop(&mut self) {
        self.shared.close();
        let mut open = lock(&self.host.open);
        if let Some(n) = open.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.tenant);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
