//! One hipobj-rc-v2 transfer between PREPARE and the end of READY.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use fabric::verbs::rc::{RcQp, RecvCompletion};
use fabric::{OpStatus, Region};
use s3dma_wire::hipobj::{Op, Target};

/// The receive a PUT's WRITE_WITH_IMM consumes, posted at PREPARE.
pub(super) type PendingRecv =
    Pin<Box<dyn Future<Output = Result<RecvCompletion, OpStatus>> + Send>>;

/// A prepared (or running) session.
pub(super) struct Session {
    /// The access key id that prepared it: only it may READY or CANCEL.
    pub(super) owner: String,
    /// Its credentials, to act as it on the store (as its HTTP requests do).
    pub(super) credentials: s3s::auth::Credentials,
    pub(super) op: Op,
    pub(super) target: Target,
    pub(super) size: u32,
    pub(super) cookie: u32,
    /// The client's QP number (READY must name it).
    pub(super) client_qpn: u32,
    pub(super) qp: RcQp,
    /// The transfer's registered memory: a GET's object bytes, a PUT's
    /// landing zone.
    pub(super) staging: Region,
    /// GET: the object's ETag and the CRC64NVME of the staged bytes.
    pub(super) etag: Option<String>,
    pub(super) crc64nvme: Option<u64>,
    /// PUT: the posted receive.
    pub(super) recv: Mutex<Option<PendingRecv>>,
    /// Set by the first READY: a session runs once.
    pub(super) running: AtomicBool,
    /// When an unclaimed session is reaped.
    pub(super) deadline: Instant,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("op", &self.op)
            .field("size", &self.size)
            .field("qp", &self.qp)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Whether it is prepared, unclaimed and past its deadline.
    pub(super) fn expired(&self, now: Instant) -> bool {
        !self.running.load(Ordering::Acquire) && now >= self.deadline
    }

    /// Claims it for a READY (`false`: already claimed).
    pub(super) fn claim(&self) -> bool {
        !self.running.swap(true, Ordering::AcqRel)
    }

    /// `GET` or `PUT` (metric label).
    pub(super) fn op_name(&self) -> &'static str {
        op_name(self.op)
    }
}

/// `GET` or `PUT`.
pub(super) fn op_name(op: Op) -> &'static str {
    match op {
        Op::Get => "GET",
        Op::Put => "PUT",
    }
}
