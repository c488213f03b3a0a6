//! CUDA buffers through the shim (feature `cuda`): this test process is the
//! tenant; it allocates device memory, exports it with `cuIpcGetMemHandle`,
//! registers it over the tenant API (`RegisterBuffer` with `CudaMemory`),
//! and GETs into it and PUTs from it through the whole stack (host-shim,
//! dpu-agent and storage-target processes), checking the bytes with
//! `cuMemcpyDtoH`.
//!
//! The tests run against whichever CUDA driver library loads: the real one
//! on a GPU host, or the test-only stand-in (`tests/cuda-standin`;
//! `.ci/cuda-standin.sh` builds it and runs this suite with it on
//! `LD_LIBRARY_PATH`). Without a driver each test prints why it is skipped
//! and passes, unless `S3DMA_REQUIRE_CUDA=1` makes that a failure. The shim
//! under test is `target/<profile>/host-shim`, which must be built with the
//! feature: `cargo test -p host-shim --features cuda --test cuda` builds it
//! so (on a GPU host: `S3DMA_REQUIRE_CUDA=1 cargo test -p host-shim
//! --features cuda --test cuda`, after `cargo build --bins` for the other
//! two binaries).
//!
//! Lifetime rules these tests pin down: a CUDA buffer lives until
//! ReleaseBuffer or until its lease ends, and then the shim closes its IPC
//! mapping (`cuIpcCloseMemHandle`); the tenant must not free the device
//! memory before that (CUDA leaves it undefined; the shim cannot notice).
//! A handle whose memory was freed no longer registers.
#![cfg(feature = "cuda")]

mod common;

use std::time::Instant;

use common::*;
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
    match fabric::cuda::init() {
        Ok(()) if matches!(agent::backend(), fabric::Backend::Verbs) && uses_standin() => {
            eprintln!(
                "{test}: SKIPPED, S3DMA_TEST_FABRIC=verbs registers CUDA memory by dma-buf \
                 (GPUDirect RDMA), which the test-only stand-in cannot give; run with the tcp \
                 fabric, or on a GPU host with an RDMA NIC"
            );
            false
        }
        Ok(()) => true,
        Err(e) if std::env::var("S3DMA_REQUIRE_CUDA").as_deref() == Ok("1") => {
            panic!("S3DMA_REQUIRE_CUDA=1 but no CUDA driver could be used: {e}")
        }
        Err(e) => {
            eprintln!(
                "{test}: SKIPPED, no CUDA driver ({e}). Run .ci/cuda-standin.sh (the test-only \
                 stand-in), or run on a GPU host; S3DMA_REQUIRE_CUDA=1 turns this skip into a failure."
            );
            false
        }
    }
}

/// Mappings of this process's stand-in allocations in the shim's address
/// space (`/memfd:s3dma-cuda-standin:OURPID:GEN` lines of its maps). Always
/// 0 with a real driver, which keeps device memory elsewhere.
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

/// RegisterBuffer of CUDA memory; the new buffer's id.
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
             (cargo test -p host-shim --features cuda builds it with it), or has no driver: {st:?}"
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

    let (_lease, lease_id) = open_lease(&stack.shim).await;
    let (at, total) = (4097usize, len + 8192 + 1);
    let gpu = DeviceMemory::alloc(0, total).unwrap();
    gpu.copy_from_host(0, &vec![0xEE; total]).unwrap();
    let handle = gpu.ipc_handle().unwrap();
    let mut raw = raw_tenant_client(&stack.shim.socket).await;
    let buffer = register(&mut raw, &lease_id, handle.0.to_vec(), 0, total as u64)
        .await
        .unwrap();
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

    // Released: the id is gone and the shim closed its IPC mapping.
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
    let stack = Stack::start().await;
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
    let stack = Stack::start().await;
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
    let stack = Stack::start().await;
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
    let i = info(&mut raw).await;
    assert_eq!((i.buffers, i.buffer_bytes), (0, 0));
}
