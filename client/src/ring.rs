//! The client's submission ring ([`s3dma_ring`]), opened on its lease
//! when [`crate::ClientOptions::ring`] is set: GET, PUT and HEAD without a
//! gRPC message and reply per object.
//!
//! Calls push an entry and publish it (the shim is woken only when it
//! sleeps); one thread per ring drains the completion queue, hands each
//! completion to its caller by tag and sleeps on the ring's futex when
//! the queue is empty. When the ring cannot take an entry (full, or the
//! shim stopped serving it) the call goes over gRPC instead. If the shim
//! closes the lease, or the process serving it goes away, every waiting
//! call fails `Unavailable`.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use s3dma_ring::{Completion, Completions, Ring, Submission, Submitter};
use tokio::sync::oneshot;
use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt as _};

use crate::error::Error;

/// Entries per queue of the client's ring.
pub(crate) const ENTRIES: u32 = 256;
/// Longest sleep of the completion thread between checks of the lease.
const IDLE_WAIT: Duration = Duration::from_millis(250);

/// One open ring.
pub(crate) struct ClientRing {
    ring: Arc<Ring>,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for ClientRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientRing")
            .field("entries", &self.ring.entries())
            .finish_non_exhaustive()
    }
}

struct State {
    sq: Submitter,
    next_tag: u64,
    waiting: HashMap<u64, oneshot::Sender<Completion>>,
    /// Set when the ring cannot serve any more (calls use gRPC).
    dead: bool,
}

impl ClientRing {
    /// Serves `ring` (already accepted by the shim on the lease whose
    /// connection `lease` is a duplicate of, watched for its end).
    pub(crate) fn start(ring: Ring, lease: UnixStream) -> std::io::Result<ClientRing> {
        let ring = Arc::new(ring);
        let state = Arc::new(Mutex::new(State {
            sq: ring.submitter(),
            next_tag: 1,
            waiting: HashMap::new(),
            dead: false,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (cq, st, stopped) = (ring.completions(), Arc::clone(&state), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("s3dma-ring".into())
            .spawn(move || reap(cq, &st, &stopped, &lease))?;
        Ok(ClientRing { ring, state, stop })
    }

    /// Submits `s` (its tag is set here) and waits for its completion.
    /// `None` when the ring cannot take it now (the caller uses gRPC).
    pub(crate) async fn call(&self, mut s: Submission) -> Option<Result<Completion, Error>> {
        let rx = {
            let mut st = lock(&self.state);
            if st.dead {
                return None;
            }
            s.user_data = st.next_tag;
            let entry = s.encode().ok()?;
            if st.sq.push(&entry).is_err() {
                return None;
            }
            st.next_tag = st.next_tag.wrapping_add(1).max(1);
            let (tx, rx) = oneshot::channel();
            st.waiting.insert(s.user_data, tx);
            st.sq.submit();
            rx
        };
        Some(match rx.await {
            Ok(c) => Ok(c),
            Err(_) => Err(Error::new(
                crate::ErrorKind::Unavailable,
                "RingClosed",
                "the host-shim stopped serving this client's ring (the lease closed); connect again",
            )),
        })
    }
}

impl Drop for ClientRing {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.ring.kick_completions();
    }
}

/// The completion thread: hand out completions by tag; on a broken ring
/// or a closed lease, fail every waiting call (dropping its sender).
fn reap(mut cq: Completions, state: &Mutex<State>, stop: &AtomicBool, lease: &UnixStream) {
    loop {
        loop {
            match cq.take() {
                Ok(Some(c)) => {
                    if let Some(tx) = lock(state).waiting.remove(&c.user_data) {
                        let _ = tx.send(c);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "the ring's completions are corrupt; using gRPC");
                    return fail_all(state);
                }
            }
        }
        if stop.load(Ordering::Acquire) || cq.ring().is_broken() || lease_closed(lease) {
            return fail_all(state);
        }
        cq.wait(IDLE_WAIT);
    }
}

fn fail_all(state: &Mutex<State>) {
    let mut st = lock(state);
    st.dead = true;
    st.waiting.clear();
}

/// Whether the shim's end of the lease is gone (a peek that does not wait
/// sees end of stream).
fn lease_closed(lease: &UnixStream) -> bool {
    use nix::sys::socket::{MsgFlags, recv};
    use std::os::fd::AsRawFd as _;
    let mut b = [0u8; 1];
    match recv(
        lease.as_raw_fd(),
        &mut b,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    ) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e != nix::errno::Errno::EAGAIN && e != nix::errno::Errno::EINTR,
    }
}

/// A failed completion as the error the same gRPC call would have given.
pub(crate) fn error_of(c: &Completion) -> Error {
    let code = Code::from(i32::try_from(c.status).unwrap_or(2));
    let mut meta = HashMap::new();
    meta.insert("message".to_owned(), c.message.clone());
    meta.insert("request_id".to_owned(), c.request_id.clone());
    let status = tonic::Status::with_error_details(
        code,
        c.message.clone(),
        ErrorDetails::with_error_info(c.reason.clone(), s3dma_proto::SHIM_ERROR_DOMAIN, meta),
    );
    Error::from(status)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl crate::Client {
    /// Whether this client's GETs, PUTs and HEADs go through a submission
    /// ring ([`crate::ClientOptions::ring`] asked for one and the shim
    /// took it).
    pub fn has_ring(&self) -> bool {
        self.inner.ring.is_some()
    }

    /// Opens a ring on the lease; `None` (gRPC only) when the shim refuses
    /// one (rings off, its limits, an older shim).
    pub(crate) async fn open_ring(lease: &Arc<crate::lease::Lease>) -> Option<ClientRing> {
        let opened = async {
            let (ring, fd) = Ring::create(ENTRIES).map_err(|e| e.to_string())?;
            lease
                .pass_ring(std::os::fd::AsFd::as_fd(&fd))
                .await
                .map_err(|e| e.to_string())?;
            let watch = lease.dup_stream().await.map_err(|e| e.to_string())?;
            ClientRing::start(ring, watch).map_err(|e| e.to_string())
        };
        match opened.await {
            Ok(r) => Some(r),
            Err(why) => {
                tracing::debug!(reason = %why, "no ring: GET, PUT and HEAD go over gRPC");
                None
            }
        }
    }

    /// Runs `s` on the ring with the client's timeout; `None` when there is
    /// no ring or it cannot take the entry now.
    async fn on_ring(&self, s: Submission) -> Option<Result<Completion, Error>> {
        let ring = self.inner.ring.as_ref()?;
        let done = match self.timeout {
            Some(t) => match tokio::time::timeout(t + crate::DEADLINE_GRACE, ring.call(s)).await {
                Ok(r) => r?,
                Err(_) => {
                    return Some(Err(Error::new(
                        crate::ErrorKind::DeadlineExceeded,
                        "DeadlineExceeded",
                        format!("no answer from the host-shim's ring within {t:?}"),
                    )));
                }
            },
            None => ring.call(s).await?,
        };
        Some(done.and_then(|c| {
            if c.status == 0 {
                Ok(c)
            } else {
                Err(error_of(&c))
            }
        }))
    }

    /// GET through the ring (see [`crate::ClientOptions::ring`]).
    pub(crate) async fn ring_get(
        &self,
        bucket: &str,
        key: &str,
        slice: &s3dma_proto::tenant::v1::BufferSlice,
        range: Option<crate::ByteRange>,
    ) -> Option<Result<crate::GetOutput, Error>> {
        let s = Submission {
            user_data: 0,
            op: s3dma_ring::Op::Get,
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            buffer_id: slice.buffer_id,
            offset: slice.offset,
            length: slice.length,
            range: range.map(|r| match r {
                crate::ByteRange::Bounded { first, last } => {
                    s3dma_ring::Range::Bounded { first, last }
                }
                crate::ByteRange::From(first) => s3dma_ring::Range::From(first),
                crate::ByteRange::Suffix(n) => s3dma_ring::Range::Suffix(n),
            }),
        };
        let done = self.on_ring(s).await?;
        Some(done.map(|c| crate::GetOutput {
            object: object_info(&c),
            bytes_placed: c.bytes_placed,
            range_start: c.range_start,
            path: crate::TransferPath::from_proto(i32::from(c.path)),
            request_id: c.request_id,
        }))
    }

    /// PUT through the ring (no content type, no user metadata).
    pub(crate) async fn ring_put(
        &self,
        bucket: &str,
        key: &str,
        slice: &s3dma_proto::tenant::v1::BufferSlice,
    ) -> Option<Result<crate::PutOutput, Error>> {
        let s = Submission {
            user_data: 0,
            op: s3dma_ring::Op::Put,
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            buffer_id: slice.buffer_id,
            offset: slice.offset,
            length: slice.length,
            range: None,
        };
        let done = self.on_ring(s).await?;
        Some(done.map(|c| crate::PutOutput {
            etag: c.etag,
            size: c.size,
            path: crate::TransferPath::from_proto(i32::from(c.path)),
            parts: c.parts,
            request_id: c.request_id,
        }))
    }

    /// HEAD through the ring.
    pub(crate) async fn ring_head(
        &self,
        bucket: &str,
        key: &str,
    ) -> Option<Result<crate::ObjectInfo, Error>> {
        let s = Submission {
            user_data: 0,
            op: s3dma_ring::Op::Head,
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            buffer_id: 0,
            offset: 0,
            length: None,
            range: None,
        };
        let done = self.on_ring(s).await?;
        Some(done.map(|c| object_info(&c)))
    }
}

/// What a completion says of the object: size, ETag and Last-Modified
/// (a ring carries no content type or user metadata).
fn object_info(c: &Completion) -> crate::ObjectInfo {
    crate::ObjectInfo {
        size: c.size,
        etag: c.etag.clone(),
        last_modified_unix_ms: c.last_modified_ms,
        ..crate::ObjectInfo::default()
    }
}
