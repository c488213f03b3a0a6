//! The staging pool: a bounded set of equally sized buffers carved out of
//! ONE registered fabric region (registered once, at start-up).
//!
//! A [`StagingBuf`] is the only way to use a buffer; it goes back to the pool
//! when dropped. Callers keep it alive until every operation posted on it
//! has completed (the transfer code moves it into the task that awaits the
//! completion), so a buffer is never reused while the NIC (or the tcp
//! requester) may still read or write it.

use std::fmt;
use std::sync::{Arc, Mutex};

use fabric::{Access, Domain, LocalSlice, Region};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Metrics;

/// The pool.
pub struct StagingPool {
    region: Region,
    buf_size: usize,
    count: usize,
    free: Mutex<Vec<usize>>,
    sem: Arc<Semaphore>,
    metrics: Arc<Metrics>,
}

impl fmt::Debug for StagingPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingPool")
            .field("buf_size", &self.buf_size)
            .field("count", &self.count)
            .field("available", &self.sem.available_permits())
            .finish()
    }
}

impl StagingPool {
    /// Allocates and registers `count` buffers of `buf_size` bytes on `domain`.
    ///
    /// # Errors
    /// Allocation or registration failures of the fabric.
    pub fn new(
        domain: &Domain,
        count: usize,
        buf_size: usize,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<StagingPool>, fabric::FabricError> {
        let total = count.checked_mul(buf_size).ok_or_else(|| {
            fabric::FabricError::InvalidArgument("staging pool size overflows".into())
        })?;
        // Local write: RDMA READ lands in it; the tcp backend needs nothing more.
        let region = domain.alloc(total, Access::LOCAL_WRITE)?;
        metrics.rdma_staging_total(count);
        Ok(Arc::new(StagingPool {
            region,
            buf_size,
            count,
            free: Mutex::new((0..count).rev().collect()),
            sem: Arc::new(Semaphore::new(count)),
            metrics,
        }))
    }

    /// Size of each buffer.
    #[must_use]
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// Number of buffers.
    #[must_use]
    pub fn count(&self) -> usize {
        self.count
    }

    /// Buffers not in use.
    #[must_use]
    pub fn available(&self) -> usize {
        self.sem.available_permits()
    }

    /// Waits for a free buffer.
    ///
    /// # Panics
    /// Never: the semaphore is never closed and a permit guarantees a free index.
    #[allow(clippy::expect_used)]
    pub async fn acquire(self: &Arc<Self>) -> StagingBuf {
        let permit = Arc::clone(&self.sem)
            .acquire_owned()
            .await
            .expect("the staging semaphore is never closed");
        let index = self
            .free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop()
            .expect("a permit guarantees a free buffer");
        self.metrics
            .rdma_staging_in_use(self.count - self.sem.available_permits());
        StagingBuf {
            pool: Arc::clone(self),
            index,
            scratch: Vec::new(),
            _permit: Some(permit),
        }
    }
}

/// One staging buffer, back in the pool when dropped.
pub struct StagingBuf {
    pool: Arc<StagingPool>,
    index: usize,
    /// Host bounce buffer for disk reads (the crate has no unsafe access to
    /// region memory, so bytes are copied in with [`LocalSlice::copy_from`]).
    scratch: Vec<u8>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl fmt::Debug for StagingBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingBuf")
            .field("index", &self.index)
            .finish()
    }
}

impl StagingBuf {
    /// The first `len` bytes of the buffer as the local side of an operation.
    ///
    /// # Errors
    /// `len` larger than the buffer.
    pub fn slice(&self, len: usize) -> Result<LocalSlice, fabric::FabricError> {
        self.pool
            .region
            .slice(self.index * self.pool.buf_size, len.min(self.pool.buf_size))
            .and_then(|s| {
                if len > self.pool.buf_size {
                    Err(fabric::FabricError::InvalidArgument(format!(
                        "{len} bytes exceed the {}-byte staging buffer",
                        self.pool.buf_size
                    )))
                } else {
                    Ok(s)
                }
            })
    }

    /// Fills the first `len` bytes from `read` (called with the bounce
    /// buffer; returns an I/O error or the bytes it produced).
    ///
    /// # Errors
    /// The reader's error, or the fabric's copy error as I/O error.
    pub fn fill_with(
        &mut self,
        len: usize,
        read: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if self.scratch.len() < len {
            self.scratch.resize(len, 0);
        }
        read(&mut self.scratch[..len])?;
        let s = self.slice(len).map_err(std::io::Error::other)?;
        s.copy_from(&self.scratch[..len])
            .map_err(std::io::Error::other)
    }
}

impl Drop for StagingBuf {
    fn drop(&mut self) {
        self.pool
            .free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(self.index);
        drop(self._permit.take());
        self.pool
            .metrics
            .rdma_staging_in_use(self.pool.count - self.pool.sem.available_permits());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bounded_and_reused() {
        let d = Domain::tcp();
        let p = StagingPool::new(&d, 2, 4096, Arc::new(Metrics::new())).unwrap();
        let mut a = p.acquire().await;
        let b = p.acquire().await;
        assert_eq!(p.available(), 0);
        assert!(a.slice(4097).is_err());
        a.fill_with(3, |b| {
            b.copy_from_slice(b"xyz");
            Ok(())
        })
        .unwrap();
        assert_eq!(a.slice(3).unwrap().to_vec().unwrap(), b"xyz");
        let ia = a.index;
        let waiter = tokio::spawn({
            let p = Arc::clone(&p);
            async move { p.acquire().await.index }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(a);
        assert_eq!(waiter.await.unwrap(), ia);
        assert_ne!(b.index, ia);
        drop(b);
        assert_eq!(p.available(), 2);
    }
}
