#![warn(missing_docs)]
//! Rust client for the s3dma host-shim.
//!
//! The shim serves tenant applications on a Unix socket
//! (`/run/s3dma/shim.sock` by default, or `$S3DMA_SOCKET`). A [`Client`]
//! holds two connections to it: a gRPC channel
//! (`s3dma.tenant.v1.Tenant`) and a *lease* that passes shared memory to the
//! shim and keeps it registered. Object bytes never travel over the socket:
//! [`Client::alloc`] creates a sealed memfd, shares it with the shim and
//! registers it as a [`Buffer`]; [`Client::get_object_into`] has the
//! dpu-agent place an object's bytes straight into the buffer, and
//! [`Client::put_object_from`] has it take them from there.
//!
//! The shim knows the caller by its uid/gid (`SO_PEERCRED`); nothing in the
//! API names the tenant. Buffers live as long as the [`Buffer`] value (it
//! releases itself when dropped) and at most as long as the lease, which
//! closes when the last clone of the [`Client`] (and every buffer) is gone
//! or the process exits.
//!
//! ```no_run
//! use s3dma_client::{ByteRange, Client, GetOptions, PutOptions};
//!
//! # async fn example() -> Result<(), s3dma_client::Error> {
//! let client = Client::connect_default().await?;
//! let mut buf = client.alloc(64 << 20).await?;
//!
//! // The first MiB of an object, placed at the start of the buffer.
//! let opts = GetOptions { range: Some("0-1048575".parse()?), ..Default::default() };
//! let got = client.get_object_into("datasets", "shard-0001.bin", &mut buf, 0, opts).await?;
//! println!("{} bytes via {}", got.bytes_placed, got.path);
//! let first_byte = buf.as_slice()[0];
//!
//! // Write them back under another key.
//! buf.as_mut_slice()[0] = first_byte ^ 1;
//! let n = got.bytes_placed as usize;
//! client.put_object_from("datasets", "copy.bin", &buf, 0..n, PutOptions::default()).await?;
//!
//! for o in client.list_all("datasets", "shard-").await? {
//!     println!("{} {}", o.key, o.size);
//! }
//! buf.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! GPU memory is registered the same way: the tenant allocates it with
//! `cuMemCreate` (requesting `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`),
//! exports it with `cuMemExportToShareableHandle` and hands the fd to
//! [`Client::register_cuda_fd`], which passes it over the lease; GETs and
//! PUTs then name the [`CudaBuffer`] ([`Client::get_object_into_cuda`],
//! [`Client::put_object_from_cuda`]).
//!
//! Errors are one type, [`Error`], with an [`ErrorKind`] to branch on, the
//! S3 error code or shim reason, and the agent's request id.
//!
//! # Who serves the socket
//!
//! The memfds a client passes hold its data, and a GET writes into them: a
//! process that serves the socket in the shim's place (another local user
//! who created `/tmp/s3dma-<uid>/` first, or bound a stale path) would read
//! every `put` and forge every `get`. So the client checks the server's uid
//! (`SO_PEERCRED`) on every connection it opens to the socket, the lease
//! and each gRPC connection (reconnections too), before it sends a byte:
//!
//! - the shim must run as **root** or as the **expected uid**: by default
//!   the caller's own effective uid (local mode, `s3dma local`);
//! - a shim running as another user (say a dedicated `s3dma` account) is
//!   named with [`ClientOptions::shim_uid`] or the environment variable
//!   `S3DMA_SHIM_UID` ([`SHIM_UID_ENV`]: a uid number or a user name);
//! - anything else fails with [`ErrorKind::UntrustedShim`], whose message
//!   names the socket, the server's uid and the expected ones, e.g. `the
//!   socket /tmp/s3dma-1000/shim.sock is served by uid 1001 (pid 4242),
//!   expected uid 0 or 1000 (set S3DMA_SHIM_UID if the shim runs as another
//!   user)`.
//!
//! The shim, for its part, hangs up on uids that are not its tenants before
//! reading a byte; the lease reports that as [`ErrorKind::AccessDenied`]
//! (code `ConnectionDropped`): `the shim closed the connection before
//! answering: uid N is probably not one of its tenants`.

mod buffer;
mod error;
mod lease;
mod options;
mod peer;
mod ring;

use std::fmt;
use std::future::Future;
use std::io;
use std::ops::Range;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use s3dma_proto::agent::v1 as agent;
use s3dma_proto::tenant::v1 as tenant;
use tenant::tenant_client::TenantClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

pub use buffer::{Buffer, CudaBuffer};
pub use error::{Error, ErrorKind};
pub use options::{
    ClientOptions, GetItem, GetOptions, GetOutput, ListOptions, ListPage, PutItem, PutOptions,
    PutOutput, TransferPath,
};
pub use peer::{SHIM_UID_ENV, resolve_uid};
/// The generated protobuf types and gRPC stubs (`s3dma-proto`).
pub use s3dma_proto as proto;
/// One object of a listing: key, size, ETag, modification time.
pub use s3dma_proto::agent::v1::ListedObject;
/// An object's size, ETag, content type, user metadata and modification time.
pub use s3dma_proto::agent::v1::ObjectInfo;
/// A bucket and key, one item of [`Client::head_objects`] and
/// [`Client::delete_objects`].
pub use s3dma_proto::agent::v1::ObjectKey;
/// A buffer the tenant holds, as [`Client::list_buffers`] reports it.
pub use s3dma_proto::tenant::v1::BufferInfo;
pub use s3dma_wire::range::{ByteRange, ParseRangeError};

/// What the shim says about the caller: tenant, uid/gid, limits, usage,
/// whether the dpu-agent is connected, the shim's version.
pub type Info = tenant::InfoResponse;

/// The socket used when neither an explicit path nor `$S3DMA_SOCKET` is given.
pub const DEFAULT_SOCKET: &str = "/run/s3dma/shim.sock";

/// Environment variable naming the shim's socket.
pub const SOCKET_ENV: &str = "S3DMA_SOCKET";

/// Extra time a client-side deadline waits past the request's own
/// `grpc-timeout`, so that the shim's answer (after revoking the window)
/// normally arrives first.
const DEADLINE_GRACE: Duration = Duration::from_secs(2);

/// How long connecting (both connections) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to the host-shim. Cheap to clone; clones share the
/// connections and the lease.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    timeout: Option<Duration>,
}

struct Inner {
    socket: PathBuf,
    lease: Arc<lease::Lease>,
    grpc: TenantClient<Channel>,
    /// The lease's ring, when [`ClientOptions::ring`] asked for one and
    /// the shim took it.
    ring: Option<ring::ClientRing>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("socket", &self.inner.socket)
            .field("lease", &self.inner.lease.id())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to the shim at `socket`: opens the lease and the gRPC
    /// channel, with [`ClientOptions::default`]. Fails fast, with
    /// [`ErrorKind::Unavailable`] naming the path, when nothing listens
    /// there, and with [`ErrorKind::UntrustedShim`] when the socket is
    /// served by an unexpected uid.
    pub async fn connect(socket: impl AsRef<Path>) -> Result<Client, Error> {
        Client::connect_with(socket, ClientOptions::default()).await
    }

    /// [`Client::connect`] with options.
    ///
    /// Every connection to the socket (the lease, and each one the gRPC
    /// channel opens, reconnections included) is checked with
    /// `SO_PEERCRED` before a byte is sent: the server must run as root or
    /// as the expected uid ([`ClientOptions::shim_uid`]), else
    /// [`ErrorKind::UntrustedShim`]. A shim that hangs up on the lease
    /// without answering (what it does to uids that are not its tenants) is
    /// [`ErrorKind::AccessDenied`] (`ConnectionDropped`).
    pub async fn connect_with(
        socket: impl AsRef<Path>,
        opts: ClientOptions,
    ) -> Result<Client, Error> {
        let socket = socket.as_ref().to_owned();
        let policy = peer::Policy::resolve(opts.shim_uid)?;
        match tokio::time::timeout(
            CONNECT_TIMEOUT,
            Client::connect_inner(socket.clone(), policy, opts.ring),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(Error::shim_unavailable(
                &socket,
                format!("no answer within {CONNECT_TIMEOUT:?}"),
            )),
        }
    }

    async fn connect_inner(
        socket: PathBuf,
        policy: peer::Policy,
        want_ring: bool,
    ) -> Result<Client, Error> {
        let stream = UnixStream::connect(&socket).await.map_err(|e| {
            let hint = match e.kind() {
                io::ErrorKind::NotFound => {
                    " (is the host-shim running? set $S3DMA_SOCKET to use another socket)"
                }
                io::ErrorKind::ConnectionRefused => " (the host-shim is not running)",
                _ => "",
            };
            Error::shim_unavailable(&socket, format!("cannot connect: {e}{hint}"))
        })?;
        policy.check(&stream, &socket)?;
        let lease = Arc::new(lease::Lease::open(stream, &socket).await?);
        let path = socket.clone();
        let policy = Arc::new(policy);
        let channel = Endpoint::from_static("http://[::]:50051")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                let policy = Arc::clone(&policy);
                async move {
                    let stream = UnixStream::connect(&path).await?;
                    // The socket may have been replaced since the lease
                    // connected: check every connection.
                    policy
                        .check(&stream, &path)
                        .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?;
                    Ok::<_, io::Error>(TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|e| {
                Error::find_in_chain(&e).unwrap_or_else(|| {
                    Error::shim_unavailable(&socket, format!("cannot open gRPC: {e}"))
                })
            })?;
        let ring = match want_ring {
            true => Client::open_ring(&lease).await,
            false => None,
        };
        Ok(Client {
            inner: Arc::new(Inner {
                socket,
                lease,
                grpc: TenantClient::new(channel),
                ring,
            }),
            timeout: None,
        })
    }

    /// Connects to [`Client::default_socket`].
    pub async fn connect_default() -> Result<Client, Error> {
        Client::connect(Client::default_socket()).await
    }

    /// `$S3DMA_SOCKET` if set (and not empty), else `/run/s3dma/shim.sock`.
    pub fn default_socket() -> PathBuf {
        match std::env::var_os(SOCKET_ENV) {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => PathBuf::from(DEFAULT_SOCKET),
        }
    }

    /// The shim's socket this client is connected to.
    pub fn socket(&self) -> &Path {
        &self.inner.socket
    }

    /// A clone whose calls have this deadline (sent to the shim as the
    /// gRPC timeout; the call fails with [`ErrorKind::DeadlineExceeded`]).
    /// By default calls have none.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = Some(timeout);
        self
    }

    /// The per-call deadline, if any.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    fn grpc(&self) -> TenantClient<Channel> {
        self.inner.grpc.clone()
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(t) = self.timeout {
            r.set_timeout(t);
        }
        r
    }

    /// Runs a call under the client's deadline and maps its status.
    async fn call<T>(
        &self,
        fut: impl Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, Error> {
        let result = match self.timeout {
            Some(t) => match tokio::time::timeout(t + DEADLINE_GRACE, fut).await {
                Ok(r) => r,
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::DeadlineExceeded,
                        "DeadlineExceeded",
                        format!("no answer from the host-shim within {t:?}"),
                    ));
                }
            },
            None => fut.await,
        };
        result.map_err(|s| Error::from_status_at(s, &self.inner.socket))
    }

    /// Who the shim thinks the caller is, its limits and usage.
    pub async fn info(&self) -> Result<Info, Error> {
        let mut g = self.grpc();
        let r = self
            .call(g.info(self.request(tenant::InfoRequest {})))
            .await?;
        Ok(r.into_inner())
    }

    /// Allocates `len` bytes of shared host memory and registers it as a
    /// buffer.
    pub async fn alloc(&self, len: usize) -> Result<Buffer, Error> {
        self.alloc_labeled(len, "").await
    }

    /// [`Client::alloc`] with a label shown in [`Client::list_buffers`] and
    /// the shim's logs (at most 64 bytes).
    pub async fn alloc_labeled(&self, len: usize, label: &str) -> Result<Buffer, Error> {
        if len == 0 {
            return Err(Error::invalid("a buffer needs at least one byte"));
        }
        let memory = fabric::Memory::memfd("s3dma-buffer", len).map_err(|e| {
            Error::new(
                ErrorKind::Other,
                "Memory",
                format!("allocating a {len}-byte buffer: {e}"),
            )
        })?;
        let fd = memory
            .fd()
            .ok_or_else(|| Error::new(ErrorKind::Other, "Memory", "a memfd buffer has no fd"))?;
        let handle = self.inner.lease.pass_fd(fd).await?;
        let req = tenant::RegisterBufferRequest {
            lease: self.inner.lease.id().0.to_vec(),
            memory: Some(tenant::register_buffer_request::Memory::Host(
                tenant::HostMemory {
                    fd_handle: handle.0.to_vec(),
                    size: len as u64,
                },
            )),
            label: label.to_owned(),
        };
        let mut g = self.grpc();
        let r = self
            .call(g.register_buffer(self.request(req)))
            .await?
            .into_inner();
        Ok(Buffer {
            memory,
            id: r.buffer_id,
            client: self.clone(),
            released: false,
        })
    }

    /// Registers CUDA device memory: `fd` is the POSIX file descriptor
    /// `cuMemExportToShareableHandle` (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`)
    /// returned for an allocation of at least `size` bytes on GPU `device`
    /// (made with `cuMemCreate` requesting that handle type). The fd is
    /// passed over this client's lease and stays the caller's (it may be
    /// closed afterwards); the shim maps the allocation until the buffer is
    /// released or the lease ends, and GETs into the buffer land in device
    /// memory. Legacy IPC handles (`cuIpcGetMemHandle`) are not taken: they
    /// are not bound to the process that presents them.
    pub async fn register_cuda_fd(
        &self,
        fd: BorrowedFd<'_>,
        device: i32,
        size: u64,
        label: &str,
    ) -> Result<CudaBuffer, Error> {
        if size == 0 {
            return Err(Error::invalid("a buffer needs at least one byte"));
        }
        let handle = self.inner.lease.pass_cuda_fd(fd).await?;
        let req = tenant::RegisterBufferRequest {
            lease: self.inner.lease.id().0.to_vec(),
            memory: Some(tenant::register_buffer_request::Memory::Cuda(
                tenant::CudaMemory {
                    fd_handle: handle.0.to_vec(),
                    device,
                    size,
                    ..Default::default()
                },
            )),
            label: label.to_owned(),
        };
        let mut g = self.grpc();
        let r = self
            .call(g.register_buffer(self.request(req)))
            .await?
            .into_inner();
        Ok(CudaBuffer {
            id: r.buffer_id,
            size,
            device,
            client: self.clone(),
            released: false,
        })
    }

    /// Reads an object (or `opts.range` of it) into device memory `buf`,
    /// starting at `offset`.
    pub async fn get_object_into_cuda(
        &self,
        bucket: &str,
        key: &str,
        buf: &CudaBuffer,
        offset: u64,
        opts: GetOptions,
    ) -> Result<GetOutput, Error> {
        let room = buf.size.checked_sub(offset).ok_or_else(|| {
            Error::invalid(format!(
                "offset {offset} is past the end of the {}-byte CUDA buffer {}",
                buf.size, buf.id
            ))
        })?;
        if let Some(l) = opts.length
            && l > room
        {
            return Err(Error::invalid(format!(
                "{l} bytes at offset {offset} do not fit the {}-byte CUDA buffer {}",
                buf.size, buf.id
            )));
        }
        let req = tenant::GetObjectRequest {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            range: opts.range.map(Into::into),
            destination: Some(tenant::BufferSlice {
                buffer_id: buf.id,
                offset,
                length: opts.length,
            }),
            if_match: opts.if_match.unwrap_or_default(),
        };
        let mut g = self.grpc();
        let r = self.call(g.get_object(self.request(req))).await?;
        Ok(get_output(r.into_inner()))
    }

    /// Writes the bytes `range` of device memory `buf` as the object
    /// `bucket/key`.
    pub async fn put_object_from_cuda(
        &self,
        bucket: &str,
        key: &str,
        buf: &CudaBuffer,
        range: Range<u64>,
        opts: PutOptions,
    ) -> Result<PutOutput, Error> {
        if range.start > range.end || range.end > buf.size {
            return Err(Error::invalid(format!(
                "range {range:?} is not within the {}-byte CUDA buffer {}",
                buf.size, buf.id
            )));
        }
        self.put_slice(
            bucket,
            key,
            tenant::BufferSlice {
                buffer_id: buf.id,
                offset: range.start,
                length: Some(range.end - range.start),
            },
            opts,
        )
        .await
    }

    /// Releases a buffer by id (what [`Buffer::release`] and dropping a
    /// [`Buffer`] do).
    async fn release_buffer(&self, buffer_id: u64) -> Result<(), Error> {
        let mut g = self.grpc();
        self.call(g.release_buffer(self.request(tenant::ReleaseBufferRequest { buffer_id })))
            .await?;
        Ok(())
    }

    /// The caller's buffers (also those of its other clients and processes).
    pub async fn list_buffers(&self) -> Result<Vec<BufferInfo>, Error> {
        let mut g = self.grpc();
        let r = self
            .call(g.list_buffers(self.request(tenant::ListBuffersRequest {})))
            .await?;
        Ok(r.into_inner().buffers)
    }

    /// Reads an object (or `opts.range` of it) into `buf`, starting at
    /// `offset`. The buffer is borrowed mutably, so no slice of it exists
    /// while the bytes land.
    pub async fn get_object_into(
        &self,
        bucket: &str,
        key: &str,
        buf: &mut Buffer,
        offset: usize,
        opts: GetOptions,
    ) -> Result<GetOutput, Error> {
        let destination = slice_for(buf, offset, opts.length)?;
        if opts.if_match.is_none()
            && let Some(r) = self.ring_get(bucket, key, &destination, opts.range).await
        {
            return r;
        }
        let req = tenant::GetObjectRequest {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            range: opts.range.map(Into::into),
            destination: Some(destination),
            if_match: opts.if_match.unwrap_or_default(),
        };
        let mut g = self.grpc();
        let r = self.call(g.get_object(self.request(req))).await?;
        Ok(get_output(r.into_inner()))
    }

    /// Reads many objects into one buffer, each at its item's offset, up to
    /// `concurrency` at a time (0 = the agent's default). The outer error is
    /// for the call as a whole; each item has its own result, in the order
    /// of `items`.
    pub async fn get_objects(
        &self,
        buf: &mut Buffer,
        items: &[GetItem],
        concurrency: u32,
    ) -> Result<Vec<Result<GetOutput, Error>>, Error> {
        let mut wire = Vec::with_capacity(items.len());
        for (i, it) in items.iter().enumerate() {
            let destination = slice_for(buf, it.offset, it.length).map_err(|mut e| {
                e.message = format!("item {i} ({}/{}): {}", it.bucket, it.key, e.message);
                e
            })?;
            wire.push(tenant::GetObjectsItem {
                bucket: it.bucket.clone(),
                key: it.key.clone(),
                range: it.range.map(Into::into),
                destination: Some(destination),
                if_match: it.if_match.clone().unwrap_or_default(),
            });
        }
        let req = tenant::GetObjectsRequest {
            items: wire,
            concurrency,
        };
        let mut g = self.grpc();
        let request = self.request(req);
        let collect = async move {
            let mut stream = g.get_objects(request).await?.into_inner();
            let mut replies = Vec::new();
            while let Some(reply) = stream.message().await? {
                replies.push(reply);
            }
            Ok(replies)
        };
        let replies = self.call(collect).await?;
        let mut results: Vec<Option<Result<GetOutput, Error>>> = vec![None; items.len()];
        for reply in replies {
            let Some(slot) = usize::try_from(reply.index)
                .ok()
                .and_then(|i| results.get_mut(i))
            else {
                continue;
            };
            *slot = Some(match reply.result {
                Some(agent::get_objects_reply::Result::Ok(r)) => Ok(get_output(r)),
                Some(agent::get_objects_reply::Result::Error(e)) => Err(Error::from_item(e)),
                None => Err(Error::new(
                    ErrorKind::Other,
                    "Internal",
                    "an empty batch reply",
                )),
            });
        }
        Ok(results
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.unwrap_or_else(|| {
                    Err(Error::new(
                        ErrorKind::Other,
                        "Internal",
                        format!("the host-shim sent no reply for item {i}"),
                    ))
                })
            })
            .collect())
    }

    /// Writes `buf[range]` as the object `bucket/key` (an empty range makes
    /// an empty object).
    pub async fn put_object_from(
        &self,
        bucket: &str,
        key: &str,
        buf: &Buffer,
        range: Range<usize>,
        opts: PutOptions,
    ) -> Result<PutOutput, Error> {
        if range.start > range.end || range.end > buf.len() {
            return Err(Error::invalid(format!(
                "range {range:?} is not within the {}-byte buffer {}",
                buf.len(),
                buf.id()
            )));
        }
        self.put_slice(
            bucket,
            key,
            tenant::BufferSlice {
                buffer_id: buf.id(),
                offset: range.start as u64,
                length: Some((range.end - range.start) as u64),
            },
            opts,
        )
        .await
    }

    async fn put_slice(
        &self,
        bucket: &str,
        key: &str,
        source: tenant::BufferSlice,
        opts: PutOptions,
    ) -> Result<PutOutput, Error> {
        if opts.content_type.is_none()
            && opts.metadata.is_empty()
            && let Some(r) = self.ring_put(bucket, key, &source).await
        {
            return r;
        }
        let req = tenant::PutObjectRequest {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            source: Some(source),
            content_type: opts.content_type.unwrap_or_default(),
            metadata: opts.metadata,
        };
        let mut g = self.grpc();
        let r = self
            .call(g.put_object(self.request(req)))
            .await?
            .into_inner();
        Ok(PutOutput {
            etag: r.etag,
            size: r.size,
            path: TransferPath::from_proto(r.path),
            parts: r.parts,
            request_id: r.request_id,
        })
    }

    /// An object's size, ETag, content type and metadata.
    pub async fn head(&self, bucket: &str, key: &str) -> Result<ObjectInfo, Error> {
        if let Some(r) = self.ring_head(bucket, key).await {
            return r;
        }
        let req = tenant::HeadObjectRequest {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        };
        let mut g = self.grpc();
        let r = self.call(g.head_object(self.request(req))).await?;
        Ok(r.into_inner().object.unwrap_or_default())
    }

    /// One page of a bucket listing.
    pub async fn list(&self, bucket: &str, opts: ListOptions) -> Result<ListPage, Error> {
        let req = tenant::ListObjectsRequest {
            bucket: bucket.to_owned(),
            prefix: opts.prefix.unwrap_or_default(),
            delimiter: opts.delimiter.unwrap_or_default(),
            continuation_token: opts.continuation_token.unwrap_or_default(),
            max_keys: opts.max_keys.unwrap_or(0),
            start_after: opts.start_after.unwrap_or_default(),
        };
        let mut g = self.grpc();
        let r = self
            .call(g.list_objects(self.request(req)))
            .await?
            .into_inner();
        Ok(ListPage {
            objects: r.objects,
            common_prefixes: r.common_prefixes,
            next_continuation_token: (!r.next_continuation_token.is_empty())
                .then_some(r.next_continuation_token),
            is_truncated: r.is_truncated,
            request_id: r.request_id,
        })
    }

    /// Every object under `prefix` (following continuation tokens).
    pub async fn list_all(&self, bucket: &str, prefix: &str) -> Result<Vec<ListedObject>, Error> {
        let mut all = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .list(
                    bucket,
                    ListOptions {
                        prefix: (!prefix.is_empty()).then(|| prefix.to_owned()),
                        continuation_token: token.take(),
                        ..ListOptions::default()
                    },
                )
                .await?;
            all.extend(page.objects);
            match page.next_continuation_token {
                Some(t) if page.is_truncated => token = Some(t),
                _ => return Ok(all),
            }
        }
    }

    /// Deletes an object (deleting a missing key succeeds, as in S3).
    pub async fn delete(&self, bucket: &str, key: &str) -> Result<(), Error> {
        let req = tenant::DeleteObjectRequest {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        };
        let mut g = self.grpc();
        self.call(g.delete_object(self.request(req))).await?;
        Ok(())
    }

    /// Size, ETag and metadata of many keys in one call, up to
    /// `concurrency` looked up at a time (0 = the agent's default). The
    /// outer error is for the call as a whole (too many items, the shim
    /// unreachable); each item has its own result, in the order of
    /// `items`: `Ok(None)` when the key does not exist.
    pub async fn head_objects(
        &self,
        items: &[ObjectKey],
        concurrency: u32,
    ) -> Result<Vec<Result<Option<ObjectInfo>, Error>>, Error> {
        let req = tenant::HeadObjectsRequest {
            items: items.to_vec(),
            concurrency,
        };
        let mut g = self.grpc();
        let r = self
            .call(g.head_objects(self.request(req)))
            .await?
            .into_inner();
        in_order(items.len(), r.results, |r| match r.result {
            Some(agent::head_objects_result::Result::Object(o)) => Ok(Some(o)),
            Some(agent::head_objects_result::Result::Missing(_)) => Ok(None),
            Some(agent::head_objects_result::Result::Error(e)) => Err(Error::from_item(e)),
            None => Err(empty_result()),
        })
    }

    /// Writes many objects from one buffer in one call, each
    /// `buf[item.offset..item.offset + item.length]`, up to `concurrency`
    /// at a time (0 = the agent's default). The outer error is for the
    /// call as a whole (an item outside the buffer, too many items or
    /// bytes); each item has its own result, in the order of `items`.
    pub async fn put_objects(
        &self,
        buf: &Buffer,
        items: &[PutItem],
        concurrency: u32,
    ) -> Result<Vec<Result<PutOutput, Error>>, Error> {
        let mut wire = Vec::with_capacity(items.len());
        for (i, it) in items.iter().enumerate() {
            if it
                .offset
                .checked_add(it.length)
                .is_none_or(|end| end > buf.len())
            {
                return Err(Error::invalid(format!(
                    "item {i} ({}/{}): {} bytes at offset {} are not within the {}-byte buffer {}",
                    it.bucket,
                    it.key,
                    it.length,
                    it.offset,
                    buf.len(),
                    buf.id()
                )));
            }
            wire.push(tenant::PutObjectsItem {
                bucket: it.bucket.clone(),
                key: it.key.clone(),
                source: Some(tenant::BufferSlice {
                    buffer_id: buf.id(),
                    offset: it.offset as u64,
                    length: Some(it.length as u64),
                }),
                content_type: it.opts.content_type.clone().unwrap_or_default(),
                metadata: it.opts.metadata.clone(),
            });
        }
        let req = tenant::PutObjectsRequest {
            items: wire,
            concurrency,
        };
        let mut g = self.grpc();
        let r = self
            .call(g.put_objects(self.request(req)))
            .await?
            .into_inner();
        in_order(items.len(), r.results, |r| match r.result {
            Some(agent::put_objects_result::Result::Ok(r)) => Ok(PutOutput {
                etag: r.etag,
                size: r.size,
                path: TransferPath::from_proto(r.path),
                parts: r.parts,
                request_id: r.request_id,
            }),
            Some(agent::put_objects_result::Result::Error(e)) => Err(Error::from_item(e)),
            None => Err(empty_result()),
        })
    }

    /// Deletes many keys in one call (a missing key succeeds, as in S3).
    /// The outer error is for the call as a whole; each item has its own
    /// result, in the order of `items`.
    pub async fn delete_objects(
        &self,
        items: &[ObjectKey],
    ) -> Result<Vec<Result<(), Error>>, Error> {
        let req = tenant::DeleteObjectsRequest {
            items: items.to_vec(),
        };
        let mut g = self.grpc();
        let r = self
            .call(g.delete_objects(self.request(req)))
            .await?
            .into_inner();
        in_order(items.len(), r.results, |r| match r.error {
            None => Ok(()),
            Some(e) => Err(Error::from_item(e)),
        })
    }
}

/// A batch's results, one per item in request order: a reply with another
/// count is the call's error (a shim that broke the API), not a guess.
fn in_order<R, T>(
    items: usize,
    results: Vec<R>,
    each: impl FnMut(R) -> Result<T, Error>,
) -> Result<Vec<Result<T, Error>>, Error> {
    if results.len() != items {
        return Err(Error::new(
            ErrorKind::Other,
            "Internal",
            format!(
                "the host-shim answered {} results for {items} items",
                results.len()
            ),
        ));
    }
    Ok(results.into_iter().map(each).collect())
}

fn empty_result() -> Error {
    Error::new(ErrorKind::Other, "Internal", "an empty batch result")
}

/// The destination slice for a GET into `buf`, checked on this side.
fn slice_for(
    buf: &Buffer,
    offset: usize,
    length: Option<u64>,
) -> Result<tenant::BufferSlice, Error> {
    let room = buf.len().checked_sub(offset).ok_or_else(|| {
        Error::invalid(format!(
            "offset {offset} is past the end of the {}-byte buffer {}",
            buf.len(),
            buf.id()
        ))
    })?;
    if let Some(l) = length
        && l > room as u64
    {
        return Err(Error::invalid(format!(
            "{l} bytes at offset {offset} do not fit the {}-byte buffer {}",
            buf.len(),
            buf.id()
        )));
    }
    Ok(tenant::BufferSlice {
        buffer_id: buf.id(),
        offset: offset as u64,
        length,
    })
}

fn get_output(r: agent::GetObjectResponse) -> GetOutput {
    GetOutput {
        object: r.object.unwrap_or_default(),
        bytes_placed: r.bytes_placed,
        range_start: r.range_start,
        path: TransferPath::from_proto(r.path),
        request_id: r.request_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connecting_to_a_missing_socket_is_unavailable_and_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-shim-here.sock");
        let e = Client::connect(&path).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.to_string().contains(&*path.to_string_lossy()), "{e}");
        assert!(e.to_string().contains("is the host-shim running"), "{e}");
    }

    #[tokio::test]
    async fn connecting_to_a_dead_socket_is_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dead.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let e = Client::connect(&path).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(e.to_string().contains(&*path.to_string_lossy()), "{e}");
    }

    #[tokio::test]
    async fn a_listener_that_closes_the_lease_is_a_dropped_connection() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("closer.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            drop(s);
        });
        let e = Client::connect(&path).await.unwrap_err();
        server.await.unwrap();
        assert_eq!(e.kind(), ErrorKind::AccessDenied, "{e}");
        assert!(
            e.to_string()
                .contains("the shim closed the connection before answering"),
            "{e}"
        );
    }

    #[test]
    fn the_default_socket_is_the_documented_one() {
        // The environment is shared with other tests; only check the shape.
        let p = Client::default_socket();
        match std::env::var_os(SOCKET_ENV) {
            Some(v) if !v.is_empty() => assert_eq!(p, PathBuf::from(v)),
            _ => assert_eq!(p, PathBuf::from("/run/s3dma/shim.sock")),
        }
    }

    #[test]
    fn transfer_paths_read_from_the_proto() {
        assert_eq!(
            TransferPath::from_proto(agent::TransferPath::Rdma as i32),
            TransferPath::Rdma
        );
        assert_eq!(TransferPath::from_proto(2).to_string(), "fallback");
        assert_eq!(TransferPath::from_proto(3).as_str(), "mixed");
        assert_eq!(TransferPath::from_proto(99), TransferPath::Unspecified);
    }
}
