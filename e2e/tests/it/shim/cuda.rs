//! CUDA buffers through the shim (feature `cuda`): this test process is the
//! tenant; it allocates device memory with `cuMemCreate`, exports it as a
//! POSIX fd (`cuMemExportToShareableHandle`), passes the fd over its lease
//! (a `CU` frame, `SCM_RIGHTS`), registers it over the tenant API
//! (`RegisterBuffer` with `CudaMemory.fd_handle`), and GETs into it and PUTs
//! from it through the whole stack (host-shim, dpu-agent and storage-target
//! processes), checking the bytes with `cuMemcpyDtoH`. Legacy IPC handles
//! (`cuIpcGetMemHandle`) are refused by default; the tests of that path
//! start shims with `cuda.allow_legacy_ipc_handles: true`.
//!
//! The tests run against whichever CUDA driver library loads: the real one
//! on a GPU host, or the test-only stand-in (`tests/cuda-standin`;
//! `.ci/cuda-standin.sh` builds it and runs this suite with it on
//! `LD_LIBRARY_PATH`). Without a driver each test prints why it is skipped
//! and passes, unless `S3DMA_REQUIRE_CUDA=1` makes that a failure. The shim
//! under test is `target/<profile>/host-shim`, which must be built with the
//! feature: `cargo test -p s3dma-e2e --features cuda --test it -- shim::cuda::`
//! builds it so (on a GPU host: `S3DMA_REQUIRE_CUDA=1 cargo test -p
//! host-shim --features cuda --test it -- cuda::`, after `cargo build
//! --bins` for the other two binaries).
//!
//! Lifetime rules these tests pin down: a CUDA buffer lives until
//! ReleaseBuffer or until its lease ends, and then the shim unmaps it
//! (`cuMemUnmap`, or `cuIpcCloseMemHandle` for a legacy handle). An
//! imported fd holds the allocation: the tenant freeing its own handle
//! leaves the shim's mapping valid. A legacy handle's memory must not be
//! freed before that (CUDA leaves it undefined; the shim cannot notice), and
//! a legacy handle whose memory was freed no longer registers.
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd};
use std::time::Instant;

use crate::shim::common::*;
use fabric::cuda::DeviceMemory;
use s3dma_client::PutOptions;
use s3dma_proto::tenant::v1 as api;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;
use tonic::Code;

type Raw = api::tenant_client::TenantClient<tonic::transport::Channel>;

/// Whether a CUDA driver is loaded that the shims' fabric can use;
/// otherwise prints why `test` is skipped (or fails it when no driver
/// loads and `S3DMA_REQUIRE_CUDA=1`).
fn driver(test: &str) -> bool {
    let init = fabric::cuda::init();
    if init.is_ok() && matches!(agent::backend(), fabric::Backend::Verbs) && uses_standin() {
        eprintln!(
            "{test}: SKIPPED, S3DMA_TEST_FABRIC=verbs registers CUDA memory by dma-buf \
             (GPUDirect RDMA), which the test-only stand-in cannot give; run with the tcp \
             fabric, or on a GPU host with an RDMA NIC"
        );
        return false;
    }
    s3dma_testkit::cuda_driver(test, init)
}

/// Mappings of this process's stand-in allocations in the shim's address
/// space (`/memfd:s3dma-cuda-standin:OURPID:GEN` lines of its maps, and
/// `…:OURPID:vmm-GEN:DEV` for `cuMemCreate` allocations). Always 0 with a
/// real driver, which keeps device memory elsewhere.
fn standin_mappings_in(shim: &Shim) -> usize {
    let pid = shim.pid().expect("the shim runs");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let ours = format!("/memfd:s3dma-cuda-standin:{}:", std::process::id());
    maps.lines().filter(|l| l.contains(&ours)).count()
}

/// Whether this process's driver is the test-only stand-in (its device
/// bytes live in memfds named `s3dma-cuda-standin:…`, seen in our maps
/// while an allocation exists).
fn uses_standin() -> bool {
    let probe = DeviceMemory::alloc(0, 1).unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    drop(probe);
    maps.contains("/memfd:s3dma-cuda-standin:")
}

/// Waits (a hang guard, not a time limit on the behaviour) until `cond`.
async fn eventually(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < HANG_GUARD, "never happened: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Waits until the shim maps none of this process's stand-in memory (a
/// real driver's mappings cannot be seen, so nothing is checked there).
async fn shim_unmaps(standin: bool, shim: &Shim, what: &str) {
    if standin {
        eventually(what, async || standin_mappings_in(shim) == 0).await;
    }
}

/// A lease of our own (CUDA buffers live under a lease like host ones):
/// the connection, which ends the lease when dropped, and its id.
async fn open_lease(shim: &Shim) -> (UnixStream, Vec<u8>) {
    let mut s = UnixStream::connect(&shim.socket).await.unwrap();
    s.write_all(&s3dma_proto::lease::MAGIC).await.unwrap();
    let mut h = [0u8; 24];
    s.read_exact(&mut h).await.unwrap();
    assert_eq!(h[0], 0, "lease refused");
    (s, h[8..24].to_vec())
}

/// Shim options that let legacy IPC handles through (the default refuses
/// them).
fn legacy_allowed() -> ShimOpts {
    ShimOpts {
        cuda_yaml: "allow_legacy_ipc_handles: true".into(),
        ..ShimOpts::default()
    }
}

/// Passes `fd` over the lease `s` in a `CU` frame (a CUDA shareable
/// handle); the fd handle, or the shim's error message.
async fn pass_cuda_fd(s: &mut UnixStream, fd: BorrowedFd<'_>) -> Result<Vec<u8>, String> {
    pass_frame(
        s,
        &s3dma_proto::lease::CudaFdRequest { seq: 9 }.encode(),
        fd,
    )
    .await
}

/// Passes `fd` over the lease `s` in an `FD` frame (host memory).
async fn pass_host_fd(s: &mut UnixStream, fd: BorrowedFd<'_>) -> Result<Vec<u8>, String> {
    pass_frame(s, &s3dma_proto::lease::FdRequest { seq: 9 }.encode(), fd).await
}

async fn pass_frame(
    s: &mut UnixStream,
    frame: &[u8],
    fd: BorrowedFd<'_>,
) -> Result<Vec<u8>, String> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    s.writable().await.unwrap();
    let iov = [std::io::IoSlice::new(frame)];
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let n = sendmsg::<()>(s.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None).unwrap();
    assert_eq!(n, frame.len());
    let mut h = [0u8; 24];
    s.read_exact(&mut h).await.unwrap();
    assert_eq!(h[4..8], 9u32.to_le_bytes(), "the reply to our frame");
    let len = usize::from(u16::from_le_bytes([h[2], h[3]]));
    let mut msg = vec![0u8; len];
    s.read_exact(&mut msg).await.unwrap();
    if h[0] == 0 {
        Ok(h[8..24].to_vec())
    } else {
        Err(String::from_utf8_lossy(&msg).into_owned())
    }
}

/// Device memory shareable as a POSIX fd, and that fd.
fn shareable(len: usize) -> (DeviceMemory, OwnedFd) {
    let m = DeviceMemory::alloc_shareable(0, len).unwrap();
    let fd = m.export_fd().unwrap();
    (m, fd)
}

/// RegisterBuffer of CUDA memory by the fd handle of a `CU` frame; the new
/// buffer's id.
async fn register_fd(
    raw: &mut Raw,
    lease: &[u8],
    fd_handle: Vec<u8>,
    device: i32,
    size: u64,
) -> Result<u64, tonic::Status> {
    let r = raw
        .register_buffer(api::RegisterBufferRequest {
            lease: lease.to_vec(),
            memory: Some(api::register_buffer_request::Memory::Cuda(
                api::CudaMemory {
                    fd_handle,
                    device,
                    size,
                    ..Default::default()
                },
            )),
            label: "gpu-fd".into(),
        })
        .await
        .map(tonic::Response::into_inner);
    if let Err(st) = &r {
        assert_ne!(
            st.code(),
            Code::Unimplemented,
            "the host-shim binary under test was built without the `cuda` feature \
             (cargo test -p s3dma-e2e --features cuda builds it with it), or has no driver: {st:?}"
        );
    }
    let r = r?;
    assert_eq!(r.size, size);
    Ok(r.buffer_id)
}

/// RegisterBuffer of CUDA memory by a legacy IPC handle; the new buffer's id.
async fn register(
    raw: &mut Raw,
    lease: &[u8],
    ipc_handle: Vec<u8>,
    device: i32,
    size: u64,
) -> Result<u64, tonic::Status> {
    let r = register_raw(raw, lease, ipc_handle, device, size).await;
    if let Err(st) = &r {
        assert_ne!(
            st.code(),
            Code::Unimplemented,
            "the host-shim binary under test was built without the `cuda` feature \
             (cargo test -p s3dma-e2e --features cuda builds it with it), or has no driver: {st:?}"
        );
    }
    let r = r?;
    assert_eq!(r.size, size);
    Ok(r.buffer_id)
}

async fn register_raw(
    raw: &mut Raw,
    lease: &[u8],
    ipc_handle: Vec<u8>,
    device: i32,
    size: u64,
) -> Result<api::RegisterBufferResponse, tonic::Status> {
    raw.register_buffer(api::RegisterBufferRequest {
        lease: lease.to_vec(),
        memory: Some(api::register_buffer_request::Memory::Cuda(
            api::CudaMemory {
                ipc_handle,
                device,
                size,
                ..Default::default()
            },
        )),
        label: "gpu".into(),
    })
    .await
    .map(tonic::Response::into_inner)
}

async fn get_into(
    raw: &mut Raw,
    key: &str,
    buffer_id: u64,
    offset: u64,
    length: Option<u64>,
) -> Result<u64, tonic::Status> {
    raw.get_object(api::GetObjectRequest {
        bucket: "alice-data".into(),
        key: key.into(),
        destination: Some(api::BufferSlice {
            buffer_id,
            offset,
            length,
        }),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner().bytes_placed)
}

async fn info(raw: &mut Raw) -> api::InfoResponse {
    raw.info(api::InfoRequest {}).await.unwrap().into_inner()
}

async fn buffers(raw: &mut Raw) -> Vec<api::BufferInfo> {
    raw.list_buffers(api::ListBuffersRequest {})
        .await
        .unwrap()
        .into_inner()
        .buffers
}

/// Asserts `st` is `code` with ErrorInfo reason `why` and a message
/// containing each of `says`.
fn assert_status(st: &tonic::Status, code: Code, why: &str, says: &[&str]) {
    assert_eq!(reason(st), (code, why.to_owned()), "{st:?}");
    for s in says {
        assert!(st.message().contains(s), "{s:?} not in {:?}", st.message());
    }
}

fn device_bytes(m: &DeviceMemory) -> Vec<u8> {
    let mut back = vec![0u8; m.len()];
    m.copy_to_host(0, &mut back).unwrap();
    back
}

/// Issue 30 finding 13: the supported way in. Device memory exported as a
/// POSIX fd (`cuMemExportToShareableHandle`), passed over the tenant's own
/// lease, registers; GETs land in it and PUTs read from it (bytes checked
/// through the driver), and releasing it unmaps it in the shim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_buffer_get_and_put_through_the_whole_stack() {
    if !driver("gpu_buffer_get_and_put_through_the_whole_stack") {
        return;
    }
    let stack = Stack::start().await;
    let c = stack.client().await;
    // Several of the fabric's bounce buffers and guarded chunks, odd-sized.
    let len = (6 << 20) + 333;
    let payload = data(len, 11);
    let mut src = c.alloc(len).await.unwrap();
    src.as_mut_slice().copy_from_slice(&payload);
    c.put_object_from("alice-data", "gpu/in", &src, 0..len, PutOptions::default())
        .await
        .unwrap();

    let (mut lease, lease_id) = open_lease(&stack.shim).await;
    let (at, total) = (4097usize, len + 8192 + 1);
    let (gpu, fd) = shareable(total);
    gpu.copy_from_host(0, &vec![0xEE; total]).unwrap();
    let fd_handle = pass_cuda_fd(&mut lease, fd.as_fd()).await.unwrap();
    // The shim holds its own reference now: ours may go.
    drop(fd);
    let mut raw = raw_tenant_client(&stack.shim.socket).await;
    let buffer = register_fd(&mut raw, &lease_id, fd_handle.clone(), 0, total as u64)
        .await
        .unwrap();
    // The fd handle was single use.
    let st = register_fd(&mut raw, &lease_id, fd_handle, 0, total as u64)
        .await
        .unwrap_err();
    assert_status(&st, Code::NotFound, "NoSuchLease", &["fd handle"]);
    let listed = buffers(&mut raw).await;
    let ours = listed.iter().find(|b| b.buffer_id == buffer).unwrap();
    assert_eq!((ours.size, ours.kind.as_str()), (total as u64, "cuda"));
    let standin = standin_mappings_in(&stack.shim) > 0;

    // GET into the GPU buffer at an odd offset; the bytes around stay.
    let placed = get_into(&mut raw, "gpu/in", buffer, at as u64, Some(len as u64))
        .await
        .unwrap();
    assert_eq!(placed, len as u64);
    let back = device_bytes(&gpu);
    assert!(
        back[..at].iter().all(|&b| b == 0xEE),
        "bytes before the slice"
    );
    assert!(
        back[at + len..].iter().all(|&b| b == 0xEE),
        "bytes after the slice"
    );
    assert_eq!(sha256(&back[at..at + len]), sha256(&payload));

    // A ranged GET (the last 1000 bytes) at the buffer's start.
    let suffix = raw
        .get_object(api::GetObjectRequest {
            bucket: "alice-data".into(),
            key: "gpu/in".into(),
            range: Some(s3dma_proto::agent::v1::ByteRange {
                kind: Some(s3dma_proto::agent::v1::byte_range::Kind::Suffix(1000)),
            }),
            destination: Some(api::BufferSlice {
                buffer_id: buffer,
                offset: 0,
                length: None,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(suffix.bytes_placed, 1000);
    let mut head = vec![0u8; 1001];
    gpu.copy_to_host(0, &mut head).unwrap();
    assert_eq!(head[..1000], payload[len - 1000..]);
    assert_eq!(head[1000], 0xEE);

    // PUT from the GPU buffer: bytes written on the device (cuMemcpyHtoD) at
    // another odd offset are what the store gets.
    let (from, n) = (8191usize, len - 5);
    let fresh = data(n, 12);
    gpu.copy_from_host(from, &fresh).unwrap();
    raw.put_object(api::PutObjectRequest {
        bucket: "alice-data".into(),
        key: "gpu/out".into(),
        source: Some(api::BufferSlice {
            buffer_id: buffer,
            offset: from as u64,
            length: Some(n as u64),
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let stored = agent::sdk_get(&stack.target.s3(ALICE), "alice-data", "gpu/out").await;
    assert_eq!(stored.len(), n);
    assert_eq!(sha256(&stored), sha256(&fresh));

    // A slice past the buffer's end is refused before anything moves.
    let st = get_into(&mut raw, "gpu/in", buffer, (total - 10) as u64, Some(11))
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument, "{st:?}");

    // Released: the id is gone and the shim unmapped the memory.
    raw.release_buffer(api::ReleaseBufferRequest { buffer_id: buffer })
        .await
        .unwrap();
    let st = get_into(&mut raw, "gpu/in", buffer, 0, None)
        .await
        .unwrap_err();
    assert_status(&st, Code::NotFound, "NoSuchBuffer", &[]);
    shim_unmaps(standin, &stack.shim, "the shim unmaps the released buffer").await;
    assert!(
        device_bytes(&gpu)[from..from + n] == fresh[..],
        "ours still"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ipc_handles_are_clear_errors_and_the_shim_keeps_serving() {
    if !driver("bad_ipc_handles_are_clear_errors_and_the_shim_keeps_serving") {
        return;
    }
    // A shim that takes legacy handles (cuda.allow_legacy_ipc_handles).
    let stack = Stack::start_opts(|_| {}, legacy_allowed()).await;
    let c = stack.client().await;
    let payload = data(100_000, 5);
    let mut src = c.alloc(payload.len()).await.unwrap();
    src.as_mut_slice().copy_from_slice(&payload);
    c.put_object_from(
        "alice-data",
        "small",
        &src,
        0..payload.len(),
        PutOptions::default(),
    )
    .await
    .unwrap();
    let (_lease, lease_id) = open_lease(&stack.shim).await;
    let mut raw = raw_tenant_client(&stack.shim.socket).await;
    let size = 1 << 20;
    let gpu = DeviceMemory::alloc(0, size).unwrap();
    let good = gpu.ipc_handle().unwrap().0.to_vec();
    // The client's own host buffer (`src`) is registered too.
    let before = info(&mut raw).await;

    for garbage in [vec![0u8; 64], vec![0xAB; 64]] {
        let st = register(&mut raw, &lease_id, garbage, 0, 4096)
            .await
            .unwrap_err();
        assert_status(
            &st,
            Code::InvalidArgument,
            "BadBuffer",
            &["cuIpcOpenMemHandle", "CUDA error"],
        );
    }
    let st = register(&mut raw, &lease_id, good[..63].to_vec(), 0, 4096)
        .await
        .unwrap_err();
    assert_status(
        &st,
        Code::InvalidArgument,
        "InvalidArgument",
        &["64-byte", "63"],
    );
    // More bytes than the allocation has (by far more than any driver's
    // rounding of its size).
    let st = register(
        &mut raw,
        &lease_id,
        good.clone(),
        0,
        (size as u64) + (1 << 30),
    )
    .await
    .unwrap_err();
    assert_status(&st, Code::InvalidArgument, "BadBuffer", &["fewer than"]);
    let st = register(&mut raw, &lease_id, good.clone(), 4096, 4096)
        .await
        .unwrap_err();
    assert_status(
        &st,
        Code::InvalidArgument,
        "BadBuffer",
        &["device 4096", "cuDeviceGet"],
    );
    let st = register(&mut raw, &lease_id, good.clone(), 0, 0)
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument, "{st:?}");
    let st = register(&mut raw, &[7; 16], good.clone(), 0, 4096)
        .await
        .unwrap_err();
    assert_status(&st, Code::NotFound, "NoSuchLease", &[]);

    // Nothing of the failed attempts is held, and the shim keeps serving:
    // the good handle registers and a GET lands in it.
    let i = info(&mut raw).await;
    assert_eq!(
        (i.buffers, i.buffer_bytes),
        (before.buffers, before.buffer_bytes)
    );
    assert_eq!(
        standin_mappings_in(&stack.shim),
        0,
        "failed opens left a mapping"
    );
    let buffer = register(&mut raw, &lease_id, good, 0, size as u64)
        .await
        .unwrap();
    let placed = get_into(&mut raw, "small", buffer, 0, None).await.unwrap();
    assert_eq!(placed, payload.len() as u64);
    let mut back = vec![0u8; payload.len()];
    gpu.copy_to_host(0, &mut back).unwrap();
    assert!(back == payload);
    let i = info(&mut raw).await;
    assert_eq!(
        (i.buffers, i.buffer_bytes),
        (before.buffers + 1, before.buffer_bytes + size as u64)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_ends_closes_the_mapping_and_a_freed_handle_goes_stale() {
    if !driver("a_lease_that_ends_closes_the_mapping_and_a_freed_handle_goes_stale") {
        return;
    }
    let stack = Stack::start_opts(|_| {}, legacy_allowed()).await;
    let mut raw = raw_tenant_client(&stack.shim.socket).await;
    let size = (2 << 20) + 1;
    let gpu = DeviceMemory::alloc(0, size).unwrap();
    let handle = gpu.ipc_handle().unwrap().0.to_vec();

    let (lease, lease_id) = open_lease(&stack.shim).await;
    let buffer = register(&mut raw, &lease_id, handle.clone(), 0, size as u64)
        .await
        .unwrap();
    let standin = standin_mappings_in(&stack.shim) > 0;
    // The tenant process's lease ends (as when it exits): its buffers go,
    // and the shim closes their IPC mappings.
    drop(lease);
    eventually("the lease's buffers are released", async || {
        buffers(&mut raw).await.is_empty()
    })
    .await;
    let st = get_into(&mut raw, "any", buffer, 0, None)
        .await
        .unwrap_err();
    assert_status(&st, Code::NotFound, "NoSuchBuffer", &[]);
    let st = register(&mut raw, &lease_id, handle.clone(), 0, size as u64)
        .await
        .unwrap_err();
    assert_status(&st, Code::NotFound, "NoSuchLease", &[]);
    shim_unmaps(standin, &stack.shim, "the shim unmaps the lease's buffer").await;

    // The memory is still ours and live: the handle registers again under
    // a new lease. Released, then freed, the handle is stale.
    let (_lease, lease_id) = open_lease(&stack.shim).await;
    let again = register(&mut raw, &lease_id, handle.clone(), 0, size as u64)
        .await
        .unwrap();
    raw.release_buffer(api::ReleaseBufferRequest { buffer_id: again })
        .await
        .unwrap();
    drop(gpu);
    let st = register(&mut raw, &lease_id, handle, 0, size as u64)
        .await
        .unwrap_err();
    assert_status(
        &st,
        Code::InvalidArgument,
        "BadBuffer",
        &["cuIpcOpenMemHandle"],
    );
    if standin {
        assert!(st.message().contains("CUDA error 400"), "{st:?}");
    }
    assert_eq!(info(&mut raw).await.buffers, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_memory_freed_while_registered_is_released_cleanly() {
    if !driver("device_memory_freed_while_registered_is_released_cleanly") {
        return;
    }
    let stack = Stack::start_opts(|_| {}, legacy_allowed()).await;
    let mut raw = raw_tenant_client(&stack.shim.socket).await;
    let (_lease, lease_id) = open_lease(&stack.shim).await;
    let size = 1 << 20;
    let gpu = DeviceMemory::alloc(0, size).unwrap();
    let handle = gpu.ipc_handle().unwrap().0.to_vec();
    let buffer = register(&mut raw, &lease_id, handle.clone(), 0, size as u64)
        .await
        .unwrap();
    let standin = standin_mappings_in(&stack.shim) > 0;

    // The tenant frees the memory while the shim still maps it: undefined
    // in CUDA (cuIpcOpenMemHandle's documentation), and invisible to the
    // shim, which no driver call tells. The shim keeps running and keeps
    // the buffer until it is released.
    drop(gpu);
    let listed = buffers(&mut raw).await;
    assert_eq!(
        listed.len(),
        1,
        "the registered buffer stays until released"
    );
    assert_eq!(listed[0].buffer_id, buffer);

    // Releasing it closes the shim's mapping; the id is then gone, and the
    // handle of the freed memory no longer registers.
    raw.release_buffer(api::ReleaseBufferRequest { buffer_id: buffer })
        .await
        .unwrap();
    shim_unmaps(standin, &stack.shim, "the shim unmaps the released buffer").await;
    let st = register(&mut raw, &lease_id, handle, 0, size as u64)
        .await
        .unwrap_err();
    assert_status(
        &st,
        Code::InvalidArgument,
        "BadBuffer",
        &["cuIpcOpenMemHandle"],
    );
    let st = get_into(&mut raw, "any", buffer, 0, None)
        .await
        .unwrap_err();
    assert_status(&st, Code::NotFound, "NoSuchBuffer", &[]);
    let st = raw
        .release_buffer(api::ReleaseBufferRequest { buffer_id: buffer })
        .await
        .unwrap_err();
    assert_status(&st, Code::NotFound, "NoSuchBuffer", &[]);
    let i = info(&mut raw).await;
    assert_eq!((i.buffers, i.buffer_bytes), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shim_that_cannot_use_cuda_says_so_and_keeps_serving() {
    const NAME: &str = "a_shim_that_cannot_use_cuda_says_so_and_keeps_serving";
    if !driver(NAME) {
        return;
    }
    if !uses_standin() {
        eprintln!(
            "{NAME}: nothing to check with a real driver (the shim is made to see no device \
             through the stand-in's S3DMA_CUDA_STANDIN_NO_DEVICE)"
        );
        return;
    }
    // The shim's driver loads but finds no GPU (cuInit fails).
    let opts = ShimOpts {
        env: vec![("S3DMA_CUDA_STANDIN_NO_DEVICE".into(), "1".into())],
        ..ShimOpts::default()
    };
    let stack = Stack::start_opts(|_| {}, opts).await;
    let mut raw = raw_tenant_client(&stack.shim.socket).await;
    let (_lease, lease_id) = open_lease(&stack.shim).await;
    let gpu = DeviceMemory::alloc(0, 4096).unwrap();
    let handle = gpu.ipc_handle().unwrap().0.to_vec();
    // Not the tenant's handle's fault: Unimplemented, as for a shim built
    // without the feature, with the driver's reason.
    let st = register_raw(&mut raw, &lease_id, handle, 0, 4096)
        .await
        .unwrap_err();
    assert_status(
        &st,
        Code::Unimplemented,
        "Unsupported",
        &["cannot use CUDA", "no CUDA-capable device is detected"],
    );
    // A CUDA fd is refused on the lease already, for the same reason.
    let (_gpu, fd) = shareable(4096);
    let (mut lease, _) = open_lease(&stack.shim).await;
    let e = pass_cuda_fd(&mut lease, fd.as_fd()).await.unwrap_err();
    assert!(e.contains("cannot use CUDA"), "{e}");
    let i = info(&mut raw).await;
    assert_eq!((i.buffers, i.buffer_bytes), (0, 0));
}

/// Issue 30 finding 13: a legacy CUDA IPC handle is 64 bytes that open the
/// memory for whoever presents them, so a shim with the default
/// configuration refuses every one, the tenant's own included, with an
/// error naming the supported way; nothing is registered or mapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue30_legacy_ipc_handles_are_refused_by_default_naming_the_fd_way() {
    if !driver("issue30_legacy_ipc_handles_are_refused_by_default_naming_the_fd_way") {
        return;
    }
    let stack = Stack::start().await;
    let mut raw = raw_tenant_client(&stack.shim.socket).await;
    let (_lease, lease_id) = open_lease(&stack.shim).await;
    let gpu = DeviceMemory::alloc(0, 1 << 20).unwrap();
    let handle = gpu.ipc_handle().unwrap().0.to_vec();
    let st = register_raw(&mut raw, &lease_id, handle, 0, 1 << 20)
        .await
        .unwrap_err();
    assert_status(
        &st,
        Code::Unimplemented,
        "Unsupported",
        &[
            "legacy CUDA IPC handles",
            "cuda.allow_legacy_ipc_handles",
            "cuMemExportToShareableHandle",
            "CudaMemory.fd_handle",
        ],
    );
    let i = info(&mut raw).await;
    assert_eq!((i.buffers, i.buffer_bytes), (0, 0));
    assert_eq!(standin_mappings_in(&stack.shim), 0, "the shim opened it");
    // Neither or both handles: a plain argument error.
    for (ipc_handle, fd_handle) in [(vec![], vec![]), (vec![1; 64], vec![2; 16])] {
        let st = raw
            .register_buffer(api::RegisterBufferRequest {
                lease: lease_id.clone(),
                memory: Some(api::register_buffer_request::Memory::Cuda(
                    api::CudaMemory {
                        ipc_handle,
                        fd_handle,
                        device: 0,
                        size: 4096,
                    },
                )),
                label: String::new(),
            })
            .await
            .unwrap_err();
        assert_status(
            &st,
            Code::InvalidArgument,
            "InvalidArgument",
            &["exactly one"],
        );
    }
}

/// Issue 30 finding 13: bob presents a legacy IPC handle of alice's device
/// memory (a process of another tenant and uid) on his own lease. The shim
/// runs as root and could open it; it must not, so bob never gets a buffer
/// over alice's GPU memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue30_another_tenants_legacy_ipc_handle_is_refused() {
    if !driver("issue30_another_tenants_legacy_ipc_handle_is_refused") {
        return;
    }
    let stack = Stack::start().await;
    let gpu = DeviceMemory::alloc(0, 1 << 20).unwrap();
    gpu.copy_from_host(0, b"alice's weights").unwrap();
    let handle: String = gpu
        .ipc_handle()
        .unwrap()
        .0
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let env = [
        ("CUDA_SOCKET", stack.shim.socket.display().to_string()),
        ("CUDA_ALICE_HANDLE", handle),
    ];
    let dir = stack.dir.path().to_owned();
    tokio::task::spawn_blocking(move || {
        run_test_as(
            &dir,
            BOB_UID,
            "shim::cuda::child_bob_presents_alices_ipc_handle",
            &env,
        )
    })
    .await
    .unwrap();
    assert_eq!(
        standin_mappings_in(&stack.shim),
        0,
        "the shim opened alice's memory for bob"
    );
    let mut back = [0u8; 15];
    gpu.copy_to_host(0, &mut back).unwrap();
    assert_eq!(&back, b"alice's weights");
}

/// Run as bob's uid by `issue30_another_tenants_legacy_ipc_handle_is_refused`.
#[tokio::test]
#[ignore = "run as another uid by issue30_another_tenants_legacy_ipc_handle_is_refused"]
async fn child_bob_presents_alices_ipc_handle() {
    let socket = std::path::PathBuf::from(std::env::var("CUDA_SOCKET").unwrap());
    let hex = std::env::var("CUDA_ALICE_HANDLE").unwrap();
    let handle: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let mut raw = raw_tenant_client(&socket).await;
    assert_eq!(info(&mut raw).await.tenant, "bob");
    let mut s = UnixStream::connect(&socket).await.unwrap();
    s.write_all(&s3dma_proto::lease::MAGIC).await.unwrap();
    let mut h = [0u8; 24];
    s.read_exact(&mut h).await.unwrap();
    assert_eq!(h[0], 0, "bob's lease refused");
    let st = register_raw(&mut raw, &h[8..24], handle, 0, 1 << 20)
        .await
        .unwrap_err();
    assert_status(
        &st,
        Code::Unimplemented,
        "Unsupported",
        &["legacy CUDA IPC"],
    );
    let i = info(&mut raw).await;
    assert_eq!((i.buffers, i.buffer_bytes), (0, 0));
}

/// Issue 30 finding 13: only a CUDA shareable handle registers as device
/// memory. A pipe, /dev/null, a sealed host memfd and a memfd dressed up
/// with the stand-in's name pass the lease (the driver judges them) but
/// RegisterBuffer refuses each with the driver's word; an fd handle of one
/// kind does not register as the other; a size past the allocation, a
/// wrong device and a garbage handle are refused. Nothing is held after,
/// and a real CUDA fd still registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue30_forged_and_non_cuda_fds_are_refused() {
    if !driver("issue30_forged_and_non_cuda_fds_are_refused") {
        return;
    }
    let stack = Stack::start().await;
    let mut raw = raw_tenant_client(&stack.shim.socket).await;
    let (mut lease, lease_id) = open_lease(&stack.shim).await;
    let pid = stack.shim.pid().unwrap();
    let fds_before = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();

    let (pipe_r, _pipe_w) = std::io::pipe().unwrap();
    let null = std::fs::File::open("/dev/null").unwrap();
    let host = fabric::Memory::memfd("host", 4 << 20).unwrap();
    let forged = rustix::fs::memfd_create(
        "s3dma-cuda-standin:1:vmm-1:0",
        rustix::fs::MemfdFlags::empty(),
    )
    .unwrap();
    rustix::fs::ftruncate(&forged, 2 << 20).unwrap();
    let candidates: [(&str, BorrowedFd<'_>); 4] = [
        ("a pipe", pipe_r.as_fd()),
        ("/dev/null", null.as_fd()),
        ("a host memfd", host.fd().unwrap()),
        ("a forged stand-in memfd", forged.as_fd()),
    ];
    for (what, fd) in candidates {
        let fd_handle = pass_cuda_fd(&mut lease, fd).await.unwrap();
        let st = register_fd(&mut raw, &lease_id, fd_handle, 0, 4096)
            .await
            .unwrap_err();
        assert_status(
            &st,
            Code::InvalidArgument,
            "BadBuffer",
            &["cuMemImportFromShareableHandle", "CUDA error"],
        );
        eprintln!("{what}: {}", st.message());
    }

    // One kind's fd handle is not the other's.
    let host_handle = pass_host_fd(&mut lease, host.fd().unwrap()).await.unwrap();
    let st = register_fd(&mut raw, &lease_id, host_handle, 0, 4096)
        .await
        .unwrap_err();
    assert_status(
        &st,
        Code::InvalidArgument,
        "InvalidArgument",
        &["host memory"],
    );
    let (gpu, fd) = shareable(2 << 20);
    let cuda_handle = pass_cuda_fd(&mut lease, fd.as_fd()).await.unwrap();
    let st = raw
        .register_buffer(api::RegisterBufferRequest {
            lease: lease_id.clone(),
            memory: Some(api::register_buffer_request::Memory::Host(
                api::HostMemory {
                    fd_handle: cuda_handle,
                    size: 4096,
                },
            )),
            label: String::new(),
        })
        .await
        .unwrap_err();
    assert_status(&st, Code::InvalidArgument, "InvalidArgument", &["CUDA"]);

    // Past the allocation (far past any granularity), another device, a
    // handle the lease never gave.
    let h = pass_cuda_fd(&mut lease, fd.as_fd()).await.unwrap();
    let st = register_fd(&mut raw, &lease_id, h, 0, (2 << 20) + (1 << 30))
        .await
        .unwrap_err();
    assert_status(&st, Code::InvalidArgument, "BadBuffer", &["fewer than"]);
    let h = pass_cuda_fd(&mut lease, fd.as_fd()).await.unwrap();
    let st = register_fd(&mut raw, &lease_id, h, 4096, 4096)
        .await
        .unwrap_err();
    assert_status(&st, Code::InvalidArgument, "BadBuffer", &["device 4096"]);
    let st = register_fd(&mut raw, &lease_id, vec![7; 16], 0, 4096)
        .await
        .unwrap_err();
    assert_status(&st, Code::NotFound, "NoSuchLease", &["fd handle"]);

    // Nothing held: no buffer, no mapping, no descriptor of ours.
    let i = info(&mut raw).await;
    assert_eq!((i.buffers, i.buffer_bytes), (0, 0));
    assert_eq!(standin_mappings_in(&stack.shim), 0);
    eventually("the shim closes the refused fds", async || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
            <= fds_before
    })
    .await;

    // The real one registers, and a GET lands in it.
    let c = stack.client().await;
    let mut src = c.alloc(5000).await.unwrap();
    src.as_mut_slice().copy_from_slice(&data(5000, 3));
    c.put_object_from("alice-data", "f", &src, 0..5000, PutOptions::default())
        .await
        .unwrap();
    let h = pass_cuda_fd(&mut lease, fd.as_fd()).await.unwrap();
    let buffer = register_fd(&mut raw, &lease_id, h, 0, 2 << 20)
        .await
        .unwrap();
    assert_eq!(
        get_into(&mut raw, "f", buffer, 7, None).await.unwrap(),
        5000
    );
    let mut back = vec![0u8; 5000];
    gpu.copy_to_host(7, &mut back).unwrap();
    assert!(back == data(5000, 3));
}

/// An fd-registered buffer is unmapped when its lease ends; the tenant
/// releasing its own allocation handle meanwhile does not pull the memory
/// from under the shim (the import holds it), unlike a legacy handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_fd_holds_the_memory_until_the_lease_ends() {
    if !driver("an_imported_fd_holds_the_memory_until_the_lease_ends") {
        return;
    }
    let stack = Stack::start().await;
    let c = stack.client().await;
    let payload = data(100_000, 8);
    let mut src = c.alloc(payload.len()).await.unwrap();
    src.as_mut_slice().copy_from_slice(&payload);
    c.put_object_from(
        "alice-data",
        "p",
        &src,
        0..payload.len(),
        PutOptions::default(),
    )
    .await
    .unwrap();
    let mut raw = raw_tenant_client(&stack.shim.socket).await;
    let (mut lease, lease_id) = open_lease(&stack.shim).await;
    let (gpu, fd) = shareable(1 << 20);
    let h = pass_cuda_fd(&mut lease, fd.as_fd()).await.unwrap();
    let buffer = register_fd(&mut raw, &lease_id, h, 0, 1 << 20)
        .await
        .unwrap();
    let standin = standin_mappings_in(&stack.shim) > 0;
    drop((gpu, fd));
    // The shim's mapping still takes and gives bytes.
    assert_eq!(
        get_into(&mut raw, "p", buffer, 0, None).await.unwrap(),
        payload.len() as u64
    );
    raw.put_object(api::PutObjectRequest {
        bucket: "alice-data".into(),
        key: "p2".into(),
        source: Some(api::BufferSlice {
            buffer_id: buffer,
            offset: 0,
            length: Some(payload.len() as u64),
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let stored = agent::sdk_get(&stack.target.s3(ALICE), "alice-data", "p2").await;
    assert!(stored == payload);
    drop(lease);
    eventually("the lease's buffer is released", async || {
        buffers(&mut raw)
            .await
            .iter()
            .all(|b| b.buffer_id != buffer)
    })
    .await;
    shim_unmaps(standin, &stack.shim, "the shim unmaps the lease's buffer").await;
}

/// The Rust client's way: `Client::register_cuda_fd` passes the fd over the
/// client's lease; GETs and PUTs name the `CudaBuffer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_registers_device_memory_by_fd() {
    if !driver("the_rust_client_registers_device_memory_by_fd") {
        return;
    }
    let stack = Stack::start().await;
    let c = stack.client().await;
    let payload = data(300_000, 21);
    let mut src = c.alloc(payload.len()).await.unwrap();
    src.as_mut_slice().copy_from_slice(&payload);
    c.put_object_from(
        "alice-data",
        "rc",
        &src,
        0..payload.len(),
        PutOptions::default(),
    )
    .await
    .unwrap();
    let size = 3 << 20;
    let (gpu, fd) = shareable(size);
    gpu.copy_from_host(0, &vec![0x11; size]).unwrap();
    let cbuf = c
        .register_cuda_fd(fd.as_fd(), 0, size as u64, "rust-gpu")
        .await
        .unwrap();
    drop(fd);
    assert_eq!((cbuf.len(), cbuf.device()), (size as u64, 0));
    let listed = c.list_buffers().await.unwrap();
    let ours = listed.iter().find(|b| b.buffer_id == cbuf.id()).unwrap();
    assert_eq!(
        (ours.kind.as_str(), ours.label.as_str()),
        ("cuda", "rust-gpu")
    );
    let got = c
        .get_object_into_cuda(
            "alice-data",
            "rc",
            &cbuf,
            99,
            s3dma_client::GetOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(got.bytes_placed, payload.len() as u64);
    let back = device_bytes(&gpu);
    assert!(back[99..99 + payload.len()] == payload[..]);
    assert!(back[..99].iter().all(|&b| b == 0x11));
    let put = c
        .put_object_from_cuda(
            "alice-data",
            "rc-back",
            &cbuf,
            99..99 + payload.len() as u64,
            PutOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(put.size, payload.len() as u64);
    let stored = agent::sdk_get(&stack.target.s3(ALICE), "alice-data", "rc-back").await;
    assert!(stored == payload);
    // Checked on this side before any request.
    let e = c
        .put_object_from_cuda(
            "alice-data",
            "x",
            &cbuf,
            0..size as u64 + 1,
            PutOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not within"), "{e}");
    cbuf.release().await.unwrap();
    assert!(
        c.list_buffers()
            .await
            .unwrap()
            .iter()
            .all(|b| b.kind != "cuda")
    );
}
