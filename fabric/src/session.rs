//! [`Session`]: a connection to a remote endpoint that posts one-sided
//! operations, on the domain's backend.

use s3dma_wire::EndpointAddr;
use s3dma_wire::frame::OpKind;

use crate::backend::Backend;
use crate::completion::Completion;
#[cfg(feature = "verbs")]
use crate::error::FabricError;
use crate::error::{OpError, OpStatus, Result};
use crate::file::FileRange;
use crate::memory::MemoryKind;
use crate::options::SessionConfig;
use crate::region::{Domain, LocalSlice};
use crate::tcp;
#[cfg(feature = "verbs")]
use crate::verbs;

#[derive(Debug)]
enum SessionImpl {
    Tcp(tcp::session::TcpSession),
    #[cfg(feature = "verbs")]
    Verbs(verbs::conn::VerbsSession),
    #[cfg(feature = "dc")]
    Dc(verbs::dc_session::DcSession),
}

/// A connection to a remote endpoint, posting one-sided operations.
#[derive(Debug)]
pub struct Session {
    inner: SessionImpl,
    domain: Domain,
}

impl Session {
    /// Connects (and authenticates) to `target` on `domain`'s backend. On
    /// verbs, one RC queue pair is brought to RTS through an out-of-band
    /// exchange with the endpoint (`streams`/`stripe` apply to tcp only).
    pub async fn connect(
        domain: &Domain,
        target: EndpointAddr,
        config: SessionConfig,
    ) -> Result<Session> {
        match domain.backend() {
            Backend::Tcp => Ok(Session {
                inner: SessionImpl::Tcp(tcp::session::TcpSession::connect(target, &config).await?),
                domain: domain.clone(),
            }),
            #[cfg(not(feature = "verbs"))]
            Backend::Verbs => Err(crate::backend::verbs_not_built()),
            #[cfg(feature = "verbs")]
            Backend::Verbs => {
                let connect = verbs::conn::VerbsSession::connect(
                    domain,
                    target,
                    &config.fabric_key,
                    config.dead_peer_timeout,
                );
                let s = tokio::time::timeout(config.connect_timeout, connect)
                    .await
                    .map_err(|_| FabricError::Handshake {
                        peer: target.to_string(),
                        reason: format!(
                            "connect and queue-pair exchange timed out after {:?}",
                            config.connect_timeout
                        ),
                    })??;
                Ok(Session {
                    inner: SessionImpl::Verbs(s),
                    domain: domain.clone(),
                })
            }
        }
    }

    /// A session to the DC target a standard (cuObject) token's endpoint
    /// names (`dc` feature): no handshake, the target's address handle and
    /// DCT number; operations go over `initiator`'s DCIs. A DC operation
    /// cannot be cancelled: [`Session::fail`] only stops new ones.
    ///
    /// # Errors
    /// The device refused an address handle for the target's GID.
    #[cfg(feature = "dc")]
    pub fn connect_dc(
        initiator: &std::sync::Arc<verbs::dc_session::DcInitiator>,
        target: EndpointAddr,
    ) -> Result<Session> {
        Ok(Session {
            inner: SessionImpl::Dc(verbs::dc_session::DcSession::connect(initiator, target)?),
            domain: initiator.domain().clone(),
        })
    }

    fn check_local(&self, local: &LocalSlice) -> Option<OpStatus> {
        if !std::sync::Arc::ptr_eq(&local.region().domain().inner, &self.domain.inner) {
            return Some(OpStatus::LocalError);
        }
        // The tcp requester moves local bytes with send/recv, which cannot
        // address device memory; CUDA memory is served on the responder side.
        if matches!(self.inner, SessionImpl::Tcp(_)) && local.region().kind() == MemoryKind::Cuda {
            return Some(OpStatus::LocalError);
        }
        None
    }

    fn post(&self, kind: OpKind, local: LocalSlice, remote_addr: u64, rkey: u32) -> Completion {
        if let Some(st) = self.check_local(&local) {
            return Completion::failed(OpError {
                status: st,
                op: kind.name(),
                remote_addr,
                rkey,
                len: local.len() as u64,
            });
        }
        match &self.inner {
            SessionImpl::Tcp(s) => {
                s.post(kind, tcp::session::Source::Memory(local), remote_addr, rkey)
            }
            #[cfg(feature = "verbs")]
            SessionImpl::Verbs(s) => s.post(kind, local, remote_addr, rkey),
            #[cfg(feature = "dc")]
            SessionImpl::Dc(s) => s.post(kind, local, remote_addr, rkey),
        }
    }

    /// Whether [`Session::write_file`] works on this session: on tcp, where
    /// the kernel sends file pages straight to the socket. Verbs needs
    /// registered memory (callers stage the bytes instead).
    pub fn sends_files(&self) -> bool {
        matches!(self.inner, SessionImpl::Tcp(_))
    }

    /// Posts an RDMA WRITE of the file range `src` to `remote_addr` under
    /// `rkey`, with the same ordering, completion and remote checks as
    /// [`Session::write`]; the operation owns `src` until it completes. If
    /// the file turns out shorter than the range, the operation completes
    /// with [`OpStatus::LocalError`] (the remote bytes are then undefined,
    /// as after any failed WRITE). On a session whose
    /// [`sends_files`](Session::sends_files) is false it completes with
    /// [`OpStatus::LocalError`] at once.
    pub fn write_file(&self, src: FileRange, remote_addr: u64, rkey: u32) -> Completion {
        match &self.inner {
            SessionImpl::Tcp(s) => s.post(
                OpKind::Write,
                tcp::session::Source::File(src),
                remote_addr,
                rkey,
            ),
            #[cfg(feature = "verbs")]
            SessionImpl::Verbs(_) => Completion::failed(OpError {
                status: OpStatus::LocalError,
                op: OpKind::Write.name(),
                remote_addr,
                rkey,
                len: src.len(),
            }),
            #[cfg(feature = "dc")]
            SessionImpl::Dc(_) => Completion::failed(OpError {
                status: OpStatus::LocalError,
                op: OpKind::Write.name(),
                remote_addr,
                rkey,
                len: src.len(),
            }),
        }
    }

    /// Posts an RDMA WRITE of `local` to `remote_addr` under `rkey`.
    /// `local` must belong to this session's domain (else the operation
    /// completes with [`OpStatus::LocalError`]); on tcp it must be host memory.
    /// Posting never blocks; operations take effect in posting order.
    pub fn write(&self, local: LocalSlice, remote_addr: u64, rkey: u32) -> Completion {
        self.post(OpKind::Write, local, remote_addr, rkey)
    }

    /// Posts an RDMA READ from `remote_addr` under `rkey` into `local`
    /// (which needs [`Access::LOCAL_WRITE`](crate::Access::LOCAL_WRITE) on verbs).
    pub fn read(&self, local: LocalSlice, remote_addr: u64, rkey: u32) -> Completion {
        self.post(OpKind::Read, local, remote_addr, rkey)
    }

    /// Whether the session can still run operations (a failed session
    /// flushes everything; callers reconnect).
    pub fn is_alive(&self) -> bool {
        match &self.inner {
            SessionImpl::Tcp(s) => s.is_alive(),
            #[cfg(feature = "verbs")]
            SessionImpl::Verbs(s) => s.is_alive(),
            #[cfg(feature = "dc")]
            SessionImpl::Dc(s) => s.is_alive(),
        }
    }

    /// Fails the session, as a lost connection would (e.g. when its peer
    /// stopped completing operations): every outstanding operation
    /// completes with an error once the transport no longer touches its
    /// local memory (tcp: the streams stop and close; verbs: the queue pair
    /// goes to the error state and the device flushes its work requests),
    /// so the owner of that memory may reuse it after the completion, as
    /// always. Later operations fail at once; [`Session::is_alive`] turns
    /// false (pools replace the session).
    pub fn fail(&self) {
        match &self.inner {
            SessionImpl::Tcp(s) => s.fail(),
            #[cfg(feature = "verbs")]
            SessionImpl::Verbs(s) => s.fail(),
            #[cfg(feature = "dc")]
            SessionImpl::Dc(s) => s.fail(),
        }
    }

    /// The endpoint this session talks to.
    pub fn peer(&self) -> EndpointAddr {
        match &self.inner {
            SessionImpl::Tcp(s) => s.peer(),
            #[cfg(feature = "verbs")]
            SessionImpl::Verbs(s) => s.peer(),
            #[cfg(feature = "dc")]
            SessionImpl::Dc(s) => s.peer(),
        }
    }
}
