//! The shims' RDMA devices, driven by the agent: the `QueuePairs` stream a
//! shim with a verbs device opens to the agent.
//!
//! Dialects whose queue pair lives beside the tenant's memory (the
//! hipobj-rc-v2 client: a QP per transfer, connected to the server's QP
//! named in HTTP headers) cannot run on the DPU: the memory is registered
//! on the host's device. So the agent speaks the dialect over HTTP and asks
//! the shim that made the call to create, connect and check the transfer's
//! queue pair. [`QpLinks`] holds one [`QpLink`] per shim (the newest
//! stream wins); a [`ShimQp`] is one queue pair on it, closed when dropped.
//!
//! The shim answers only for windows it minted for a call in progress, so
//! a command can reach no other memory; here every command is bounded in
//! number ([`MAX_PENDING`]) and time (the caller's timeout).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fabric::RdmaToken;
use s3dma_proto::agent::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Commands awaiting an answer on one link, at most.
pub const MAX_PENDING: usize = 4096;

/// Why a command to a shim's device failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QpLinkError {
    /// The shim's stream ended (it restarted or lost the agent).
    #[error("the shim's QueuePairs stream ended")]
    Gone,
    /// Too many commands awaiting an answer on the link.
    #[error("{MAX_PENDING} queue-pair commands are already waiting on the shim")]
    Busy,
    /// No answer in time.
    #[error("the shim did not answer a queue-pair command within {0:?}")]
    Timeout(Duration),
    /// The shim refused or failed the command.
    #[error("the shim's queue pair failed: {0}")]
    Failed(String),
    /// The shim answered something else than the command calls for.
    #[error("the shim answered a queue-pair command with {0}")]
    Unexpected(&'static str),
}

/// The links of the connected shims, by shim name.
#[derive(Debug, Default)]
pub struct QpLinks {
    by_shim: Mutex<HashMap<String, Arc<QpLink>>>,
}

impl QpLinks {
    /// The link of `shim`, if it has one open.
    #[must_use]
    pub fn get(&self, shim: &str) -> Option<Arc<QpLink>> {
        let map = self.by_shim.lock().unwrap_or_else(|e| e.into_inner());
        map.get(shim).filter(|l| !l.closed.is_cancelled()).cloned()
    }

    /// Makes `link` the link of `shim` (an older one is closed).
    pub fn attach(&self, shim: &str, link: Arc<QpLink>) {
        let old = self
            .by_shim
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(shim.to_owned(), link);
        if let Some(old) = old {
            old.close();
        }
    }

    /// Forgets `link` if it is still `shim`'s, and closes it.
    pub fn detach(&self, shim: &str, link: &Arc<QpLink>) {
        let mut map = self.by_shim.lock().unwrap_or_else(|e| e.into_inner());
        if map.get(shim).is_some_and(|l| Arc::ptr_eq(l, link)) {
            map.remove(shim);
        }
        drop(map);
        link.close();
    }
}

/// One shim's `QueuePairs` stream: commands out, answers matched by id.
#[derive(Debug)]
pub struct QpLink {
    tx: mpsc::Sender<pb::QpCommand>,
    pending: Mutex<HashMap<u64, oneshot::Sender<pb::qp_event::Event>>>,
    next_id: AtomicU64,
    closed: CancellationToken,
}

impl QpLink {
    /// A link sending commands on `tx`.
    #[must_use]
    pub fn new(tx: mpsc::Sender<pb::QpCommand>) -> QpLink {
        QpLink {
            tx,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closed: CancellationToken::new(),
        }
    }

    /// Cancelled when the link closes (the response stream ends with it).
    #[must_use]
    pub fn closed(&self) -> CancellationToken {
        self.closed.clone()
    }

    /// Ends the link: every waiting command fails with [`QpLinkError::Gone`].
    pub fn close(&self) {
        self.closed.cancel();
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Hands the shim's answer to the command waiting for it (an answer to
    /// no waiting command, e.g. one that timed out, is dropped).
    pub fn deliver(&self, ev: pb::QpEvent) {
        let waiter = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ev.id);
        if let (Some(w), Some(event)) = (waiter, ev.event) {
            let _ = w.send(event);
        }
    }

    fn send_only(&self, id: u64, command: pb::qp_command::Command) {
        // Best effort (a close): a full or closed link drops it, and the
        // shim destroys the queue pair with its window anyway.
        let _ = self.tx.try_send(pb::QpCommand {
            id,
            command: Some(command),
        });
    }

    async fn call(
        &self,
        id: u64,
        command: pb::qp_command::Command,
        timeout: Duration,
    ) -> Result<pb::qp_event::Event, QpLinkError> {
        if self.closed.is_cancelled() {
            return Err(QpLinkError::Gone);
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if p.len() >= MAX_PENDING {
                return Err(QpLinkError::Busy);
            }
            p.insert(id, tx);
        }
        let forget = || {
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        };
        let sent = tokio::time::timeout(
            timeout,
            self.tx.send(pb::QpCommand {
                id,
                command: Some(command),
            }),
        )
        .await;
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                forget();
                return Err(QpLinkError::Gone);
            }
            Err(_) => {
                forget();
                return Err(QpLinkError::Timeout(timeout));
            }
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(pb::qp_event::Event::Failed(f))) => Err(QpLinkError::Failed(f.message)),
            Ok(Ok(ev)) => Ok(ev),
            Ok(Err(_)) => Err(QpLinkError::Gone),
            Err(_) => {
                forget();
                Err(QpLinkError::Timeout(timeout))
            }
        }
    }

    /// Asks the shim for a standard (cuObject) token for exactly `window`
    /// (a slice of a window it minted), naming its DC target.
    ///
    /// # Errors
    /// [`QpLinkError`]; [`QpLinkError::Failed`] when the host has no DC.
    pub async fn mint_dc_token(
        &self,
        window: &RdmaToken,
        timeout: Duration,
    ) -> Result<String, QpLinkError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        match self
            .call(
                id,
                pb::qp_command::Command::MintDcToken(pb::QpMintDcToken {
                    window: window.to_string(),
                }),
                timeout,
            )
            .await?
        {
            pb::qp_event::Event::DcToken(t) => Ok(t.token),
            _ => Err(QpLinkError::Unexpected("something other than a DC token")),
        }
    }

    /// Asks the shim for a queue pair over `window` (a slice of a window it
    /// minted): one the peer writes into (`receive`: the receive is posted
    /// now) or one the shim writes from, sending from `psn`.
    ///
    /// # Errors
    /// [`QpLinkError`].
    pub async fn open(
        self: &Arc<Self>,
        window: &RdmaToken,
        receive: bool,
        psn: u32,
        timeout: Duration,
    ) -> Result<ShimQp, QpLinkError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let ev = self
            .call(
                id,
                pb::qp_command::Command::Open(pb::QpOpen {
                    window: window.to_string(),
                    receive,
                    psn,
                }),
                timeout,
            )
            .await;
        match ev {
            Ok(pb::qp_event::Event::Opened(o)) => {
                let qp = ShimQp {
                    link: Arc::clone(self),
                    id,
                    opened: o,
                };
                if qp.gid().is_none() {
                    return Err(QpLinkError::Unexpected("a GID that is not 16 bytes"));
                }
                Ok(qp)
            }
            Ok(_) => {
                self.send_only(id, pb::qp_command::Command::Close(pb::QpClose { qp: id }));
                Err(QpLinkError::Unexpected("no queue pair"))
            }
            Err(e) => {
                // It may exist after all (an answer that came too late).
                self.send_only(id, pb::qp_command::Command::Close(pb::QpClose { qp: id }));
                Err(e)
            }
        }
    }
}

/// One queue pair on a shim's device; closed when dropped.
#[derive(Debug)]
pub struct ShimQp {
    link: Arc<QpLink>,
    id: u64,
    /// What the shim created.
    pub opened: pb::QpOpened,
}

impl ShimQp {
    /// The port's GID.
    #[must_use]
    pub fn gid(&self) -> Option<[u8; 16]> {
        self.opened.gid.as_slice().try_into().ok()
    }

    async fn done(
        &self,
        command: pb::qp_command::Command,
        timeout: Duration,
    ) -> Result<(), QpLinkError> {
        let id = self.link.next_id.fetch_add(1, Ordering::Relaxed);
        match self.link.call(id, command, timeout).await? {
            pb::qp_event::Event::Done(_) => Ok(()),
            _ => Err(QpLinkError::Unexpected("something other than done")),
        }
    }

    /// Brings the queue pair to RTR/RTS against the peer.
    ///
    /// # Errors
    /// [`QpLinkError`].
    pub async fn connect(
        &self,
        remote_qpn: u32,
        remote_gid: [u8; 16],
        remote_lid: u16,
        remote_psn: u32,
        timeout: Duration,
    ) -> Result<(), QpLinkError> {
        self.done(
            pb::qp_command::Command::Connect(pb::QpConnect {
                qp: self.id,
                remote_qpn,
                remote_gid: remote_gid.to_vec(),
                remote_lid: u32::from(remote_lid),
                remote_psn,
            }),
            timeout,
        )
        .await
    }

    /// RDMA WRITE_WITH_IMM of the whole slice to the peer's region; returns
    /// when it completed.
    ///
    /// # Errors
    /// [`QpLinkError`].
    pub async fn write(
        &self,
        remote_addr: u64,
        remote_rkey: u32,
        imm: u32,
        timeout: Duration,
    ) -> Result<(), QpLinkError> {
        self.done(
            pb::qp_command::Command::Write(pb::QpWrite {
                qp: self.id,
                remote_addr,
                remote_rkey,
                imm,
            }),
            timeout,
        )
        .await
    }

    /// Waits for the peer's WRITE_WITH_IMM and has the shim check it
    /// (opcode, immediate `imm`, exactly `length` bytes).
    ///
    /// # Errors
    /// [`QpLinkError`].
    pub async fn await_receive(
        &self,
        imm: u32,
        length: u32,
        timeout: Duration,
    ) -> Result<(), QpLinkError> {
        self.done(
            pb::qp_command::Command::AwaitReceive(pb::QpAwaitReceive {
                qp: self.id,
                imm,
                length,
            }),
            timeout,
        )
        .await
    }
}

impl Drop for ShimQp {
    fn drop(&mut self) {
        self.link.send_only(
            self.link.next_id.fetch_add(1, Ordering::Relaxed),
            pb::qp_command::Command::Close(pb::QpClose { qp: self.id }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> RdmaToken {
        "00007f0000001000:00001000:00000101:0050:000001:1:00000000000000000000ffff7f000001"
            .parse()
            .unwrap()
    }

    #[tokio::test]
    async fn answers_are_matched_by_id_and_a_closed_link_fails_waiters() {
        let (tx, mut rx) = mpsc::channel(8);
        let link = Arc::new(QpLink::new(tx));
        let shim = {
            let link = Arc::clone(&link);
            tokio::spawn(async move {
                let cmd = rx.recv().await.unwrap();
                let Some(pb::qp_command::Command::Open(o)) = cmd.command else {
                    panic!("expected an open");
                };
                assert!(o.receive);
                assert_eq!(o.psn, 7);
                // An answer to nobody first: dropped.
                link.deliver(pb::QpEvent {
                    id: 999,
                    event: Some(pb::qp_event::Event::Done(pb::QpDone {})),
                });
                link.deliver(pb::QpEvent {
                    id: cmd.id,
                    event: Some(pb::qp_event::Event::Opened(pb::QpOpened {
                        qpn: 0x11,
                        gid: vec![1; 16],
                        port: 1,
                        ..Default::default()
                    })),
                });
                rx
            })
        };
        let qp = link
            .open(&token(), true, 7, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(qp.opened.qpn, 0x11);
        assert_eq!(qp.gid(), Some([1; 16]));
        let mut rx = shim.await.unwrap();
        // The shim never answers the connect; the link closes under it.
        let waiting = {
            let link = Arc::clone(&link);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                link.close();
            })
        };
        let r = qp.connect(1, [2; 16], 0, 5, Duration::from_secs(5)).await;
        waiting.await.unwrap();
        assert_eq!(r, Err(QpLinkError::Gone));
        assert!(matches!(
            rx.recv().await.unwrap().command,
            Some(pb::qp_command::Command::Connect(_))
        ));
        drop(qp);
        // Dropping the queue pair closes it on the shim.
        assert!(matches!(
            rx.recv().await.unwrap().command,
            Some(pb::qp_command::Command::Close(pb::QpClose { qp: 1 }))
        ));
        // A closed link refuses at once.
        assert_eq!(
            link.open(&token(), false, 1, Duration::from_secs(1))
                .await
                .unwrap_err(),
            QpLinkError::Gone
        );
    }

    #[tokio::test]
    async fn a_silent_shim_times_out_and_a_failure_is_reported() {
        let (tx, mut rx) = mpsc::channel(8);
        let link = Arc::new(QpLink::new(tx));
        let r = link
            .open(&token(), false, 1, Duration::from_millis(50))
            .await;
        assert_eq!(
            r.unwrap_err(),
            QpLinkError::Timeout(Duration::from_millis(50))
        );
        // The open, then the close sent after the timeout.
        assert!(rx.recv().await.unwrap().command.is_some());
        assert!(matches!(
            rx.recv().await.unwrap().command,
            Some(pb::qp_command::Command::Close(_))
        ));
        let answer = {
            let link = Arc::clone(&link);
            tokio::spawn(async move {
                let cmd = rx.recv().await.unwrap();
                link.deliver(pb::QpEvent {
                    id: cmd.id,
                    event: Some(pb::qp_event::Event::Failed(pb::QpFailed {
                        message: "no such window".into(),
                    })),
                });
            })
        };
        let r = link.open(&token(), false, 1, Duration::from_secs(5)).await;
        answer.await.unwrap();
        assert_eq!(r.unwrap_err(), QpLinkError::Failed("no such window".into()));
    }
}
