//! Memory registered with the shim: shared host memory ([`Buffer`]) and
//! CUDA device memory ([`CudaBuffer`]).

use crate::{Client, Error};

/// Shared memory registered with the shim, named by [`Buffer::id`] in
/// requests.
///
/// Dropping a buffer releases it in the background (when a tokio runtime is
/// current); [`Buffer::release`] does it and reports errors. The shim also
/// releases every buffer when the lease closes.
#[derive(Debug)]
pub struct Buffer {
    pub(crate) memory: fabric::Memory,
    pub(crate) id: u64,
    pub(crate) client: Client,
    pub(crate) released: bool,
}

impl Buffer {
    /// The buffer's id at the shim.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.memory.len()
    }

    /// Whether it has no bytes (never: the shim refuses empty buffers).
    pub fn is_empty(&self) -> bool {
        self.memory.is_empty()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.memory.host_bytes().unwrap_or_default()
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.memory.host_bytes_mut().unwrap_or_default()
    }

    /// The client the buffer was allocated with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Releases the buffer at the shim and unmaps it here.
    pub async fn release(mut self) -> Result<(), Error> {
        self.released = true;
        self.client.release_buffer(self.id).await
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if !self.released {
            release_dropped(&self.client, self.id, "buffer");
        }
    }
}

/// CUDA device memory registered with the shim
/// ([`Client::register_cuda_fd`]), named by [`CudaBuffer::id`] in requests.
/// The allocation stays the caller's: free it only after the buffer is
/// released. Dropping the value releases it as [`Buffer`] does.
#[derive(Debug)]
pub struct CudaBuffer {
    pub(crate) id: u64,
    pub(crate) size: u64,
    pub(crate) device: i32,
    pub(crate) client: Client,
    pub(crate) released: bool,
}

impl CudaBuffer {
    /// The buffer's id at the shim.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.size
    }

    /// Whether it has no bytes (never: the shim refuses empty buffers).
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The GPU it is on.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// Releases the buffer at the shim (which unmaps the device memory).
    pub async fn release(mut self) -> Result<(), Error> {
        self.released = true;
        self.client.release_buffer(self.id).await
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if !self.released {
            release_dropped(&self.client, self.id, "CUDA buffer");
        }
    }
}

/// Releases buffer `id` at the shim in the background, for a buffer
/// dropped unreleased (when a tokio runtime is current); `what` names the
/// kind of buffer in the log line of a failure.
fn release_dropped(client: &Client, id: u64, what: &'static str) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let client = client.clone();
        rt.spawn(async move {
            if let Err(e) = client.release_buffer(id).await {
                tracing::debug!(buffer = id, error = %e, "releasing a dropped {what} failed");
            }
        });
    }
}
