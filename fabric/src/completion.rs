//! The future of one posted operation, shared by both backends.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::error::OpError;

pub(crate) type OpResult = std::result::Result<(), OpError>;

/// The future of one posted operation. Dropping it does not cancel the
/// operation: the operation keeps its local buffer until it completes.
#[derive(Debug)]
pub struct Completion {
    rx: oneshot::Receiver<OpResult>,
    info: OpError,
}

impl Completion {
    /// A completion that has already failed.
    pub(crate) fn failed(err: OpError) -> Completion {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(Err(err.clone()));
        Completion { rx, info: err }
    }

    pub(crate) fn new(rx: oneshot::Receiver<OpResult>, info: OpError) -> Completion {
        Completion { rx, info }
    }
}

impl Future for Completion {
    type Output = OpResult;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<OpResult> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(Ok(r)) => Poll::Ready(r),
            Poll::Ready(Err(_)) => Poll::Ready(Err(self.info.clone())),
            Poll::Pending => Poll::Pending,
        }
    }
}
