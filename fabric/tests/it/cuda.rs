//! CUDA device memory (feature `cuda`) against whichever CUDA driver library
//! loads: the real one on a GPU host, or the test-only stand-in
//! (`tests/cuda-standin`; `.ci/cuda-standin.sh` builds it and runs these
//! tests with it on `LD_LIBRARY_PATH`). Without a driver each test prints
//! why it is skipped and passes, unless `S3DMA_REQUIRE_CUDA=1` makes that a
//! failure. On a GPU host: `S3DMA_REQUIRE_CUDA=1 cargo test -p fabric
//! --all-features --test it cuda::` (add `-- --include-ignored` on a host
//! with an RDMA NIC and GPUDirect RDMA for the dma-buf registration test).
#![cfg(feature = "cuda")]

use std::process::Command;

use fabric::cuda::{DeviceMemory, IpcMemHandle};
use fabric::{
    Access, Domain, Endpoint, EndpointConfig, FabricError, FabricKey, Memory, MemoryKind, Session,
    SessionConfig,
};

/// Whether a CUDA driver is loaded; otherwise prints why `test` is skipped
/// (or fails it when `S3DMA_REQUIRE_CUDA=1`).
fn driver(test: &str) -> bool {
    s3dma_testkit::cuda_driver(test, fabric::cuda::init())
}

/// Whether the driver is the test-only stand-in, judged while `live` (an
/// allocation or IPC mapping) exists: the stand-in keeps device bytes in
/// memfds named `s3dma-cuda-standin:PID:GEN`, which show in this process's
/// maps.
fn is_standin(live: &DeviceMemory) -> bool {
    assert!(!live.is_empty());
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .contains("/memfd:s3dma-cuda-standin:")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn device_bytes(m: &DeviceMemory) -> Vec<u8> {
    let mut back = vec![0u8; m.len()];
    m.copy_to_host(0, &mut back).unwrap();
    back
}

#[test]
fn device_memory_copies_and_is_classified() {
    if !driver("device_memory_copies_and_is_classified") {
        return;
    }
    let len = (1 << 20) + 123;
    let m = DeviceMemory::alloc(0, len).unwrap();
    assert_eq!(m.len(), len);
    assert!(m.is_device_memory().unwrap());
    let (base, size) = m.address_range().unwrap();
    assert_eq!(base, m.dptr(), "cuMemAlloc returns the allocation's base");
    assert!(size >= len as u64, "{size} < {len}");

    let data = pattern(len, 1);
    m.copy_from_host(0, &data).unwrap();
    assert!(device_bytes(&m) == data);
    // A copy at an offset changes exactly those bytes.
    let patch = pattern(5000, 99);
    m.copy_from_host(1000, &patch).unwrap();
    let mut want = data.clone();
    want[1000..6000].copy_from_slice(&patch);
    assert!(device_bytes(&m) == want);
    let mut part = vec![0u8; 5000];
    m.copy_to_host(1000, &mut part).unwrap();
    assert_eq!(part, patch);

    // Copies outside the allocation never reach the driver.
    for (off, n) in [(len, 1), (len - 10, 11), (usize::MAX, 2)] {
        match m.copy_from_host(off, &vec![0; n]) {
            Err(FabricError::InvalidArgument(msg)) => assert!(msg.contains("outside"), "{msg}"),
            other => panic!("copy {off}+{n}: expected InvalidArgument, got {other:?}"),
        }
    }
    let mut big = vec![0u8; len + 1];
    assert!(matches!(
        m.copy_to_host(0, &mut big),
        Err(FabricError::InvalidArgument(_))
    ));

    // As a fabric memory source: device memory, no host bytes.
    let mem = Memory::from_cuda(m);
    assert_eq!(mem.kind(), MemoryKind::Cuda);
    assert_eq!(mem.len(), len);
    assert!(mem.host_bytes().is_none());
}

#[test]
fn dmabuf_export_is_an_fd_or_a_clear_error() {
    if !driver("dmabuf_export_is_an_fd_or_a_clear_error") {
        return;
    }
    let m = DeviceMemory::alloc(0, 1 << 21).unwrap();
    let standin = is_standin(&m);
    match m.dmabuf() {
        Ok((_fd, off)) => {
            assert!(!standin, "the stand-in has no dma-buf export");
            assert_eq!(off, 0, "the fd covers the allocation from its base");
        }
        Err(FabricError::Cuda(msg)) => {
            assert!(
                msg.contains("cuMemGetHandleForAddressRange"),
                "the error names the call: {msg}"
            );
            if standin {
                assert!(msg.contains("CUDA error 801"), "NOT_SUPPORTED: {msg}");
            }
        }
        Err(e) => panic!("expected a CUDA error, got {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_fabric_writes_and_reads_gpu_memory_through_a_bounce_buffer() {
    if !driver("tcp_fabric_writes_and_reads_gpu_memory_through_a_bounce_buffer") {
        return;
    }
    // Larger than the tcp backend's 256 KiB bounce buffer and its 4 MiB
    // guarded chunk, and not a multiple of either.
    const SZ: usize = (9 << 20) + 4321;
    let key = FabricKey::random();
    let server = Domain::tcp();
    let gpu = server
        .register(
            Memory::cuda(0, SZ).unwrap(),
            Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
        .unwrap();
    assert_eq!(gpu.kind(), MemoryKind::Cuda);
    let ep = Endpoint::listen(
        &server,
        EndpointConfig::new("127.0.0.1:0".parse().unwrap(), key.clone()),
    )
    .await
    .unwrap();
    let client = Domain::tcp();
    let src = client.alloc(SZ, Access::LOCAL_WRITE).unwrap();
    let data = pattern(SZ, 7);
    src.write_at(0, &data).unwrap();
    let s = Session::connect(&client, ep.addr(), SessionConfig::new(key))
        .await
        .unwrap();
    s.write(src.as_slice(), gpu.addr(), gpu.rkey())
        .await
        .unwrap();
    let mut back = vec![0u8; SZ];
    gpu.read_at(0, &mut back).unwrap();
    assert!(back == data, "a remote WRITE lands in device memory");
    let dst = client.alloc(SZ, Access::LOCAL_WRITE).unwrap();
    s.read(dst.as_slice(), gpu.addr(), gpu.rkey())
        .await
        .unwrap();
    assert!(
        dst.as_slice().to_vec().unwrap() == data,
        "a remote READ returns device memory"
    );

    // Through a window at an odd offset: exactly its bytes change.
    let (off, len) = (12_345usize, (5 << 20) + 17);
    let w = gpu
        .window(off, len, Access::REMOTE_WRITE | Access::REMOTE_READ, None)
        .unwrap();
    let fresh = pattern(len, 200);
    src.write_at(0, &fresh).unwrap();
    s.write(src.slice(0, len).unwrap(), w.addr(), w.rkey())
        .await
        .unwrap();
    let mut want = data.clone();
    want[off..off + len].copy_from_slice(&fresh);
    gpu.read_at(0, &mut back).unwrap();
    assert!(
        back == want,
        "a WRITE through a window changes its bytes only"
    );
    let out = client.alloc(len, Access::LOCAL_WRITE).unwrap();
    s.read(out.as_slice(), w.addr(), w.rkey()).await.unwrap();
    assert!(out.as_slice().to_vec().unwrap() == fresh);
    // Past the window's end is refused, and a revoked window is dead.
    assert!(
        s.write(src.slice(0, len + 1).unwrap(), w.addr(), w.rkey())
            .await
            .is_err()
    );
    w.revoke();
    assert!(s.read(out.as_slice(), w.addr(), w.rkey()).await.is_err());
    gpu.read_at(0, &mut back).unwrap();
    assert!(back == want, "refused operations changed nothing");
}

/// Env var naming the role of a re-executed test process.
const CHILD: &str = "S3DMA_CUDA_TEST_CHILD";
/// Env var carrying the IPC handle (hex) to a child.
const HANDLE: &str = "S3DMA_CUDA_TEST_HANDLE";
const IPC_LEN: usize = (3 << 20) + 77;

/// Runs this test binary's test `name` in a new process with `env`; returns
/// its output, panicking (with it) unless the child test passed.
fn run_child(name: &str, env: &[(&str, String)]) -> String {
    // Test names in the one test binary carry this module's path.
    let name = format!("cuda::{name}");
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child {name} failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "child {name} did not run:\n{text}"
    );
    text
}

/// The handle the parent passed to this child.
fn child_handle() -> IpcMemHandle {
    let bytes = unhex(&std::env::var(HANDLE).unwrap());
    IpcMemHandle(bytes.try_into().unwrap())
}

#[test]
fn ipc_handles_open_in_another_process_and_go_stale_when_freed() {
    const NAME: &str = "ipc_handles_open_in_another_process_and_go_stale_when_freed";
    match std::env::var(CHILD).as_deref() {
        Ok("open") => return ipc_child_open(),
        Ok("stale") => return ipc_child_stale(),
        _ => {}
    }
    if !driver(NAME) {
        return;
    }
    let m = DeviceMemory::alloc(0, IPC_LEN).unwrap();
    m.copy_from_host(0, &pattern(IPC_LEN, 3)).unwrap();
    let handle = m.ipc_handle().unwrap();
    assert_eq!(
        handle,
        m.ipc_handle().unwrap(),
        "one allocation, one handle"
    );
    let env = |role: &str| {
        vec![
            (CHILD, role.to_owned()),
            (HANDLE, hex(&handle.0)),
            ("S3DMA_REQUIRE_CUDA", "1".to_owned()),
        ]
    };
    run_child(NAME, &env("open"));
    // The child's write through its mapping is in our allocation.
    let mut want = pattern(IPC_LEN, 3);
    want[4096..4096 + 1000].copy_from_slice(&pattern(1000, 77));
    assert!(
        device_bytes(&m) == want,
        "the child's write is visible here"
    );
    drop(m);
    run_child(NAME, &env("stale"));
}

/// Child: opens the parent's allocation, checks its bytes, writes some.
fn ipc_child_open() {
    let handle = child_handle();
    let m = DeviceMemory::open_ipc(0, handle, IPC_LEN).unwrap();
    let standin = is_standin(&m);
    assert_eq!(m.len(), IPC_LEN);
    assert!(m.is_device_memory().unwrap());
    let (base, size) = m.address_range().unwrap();
    assert_eq!(base, m.dptr());
    assert!(size >= IPC_LEN as u64, "{size} < {IPC_LEN}");
    assert!(
        device_bytes(&m) == pattern(IPC_LEN, 3),
        "the parent's bytes"
    );
    m.copy_from_host(4096, &pattern(1000, 77)).unwrap();
    drop(m);
    // Opened again after closing: a shorter view of the same allocation is
    // fine, a longer one than the allocation is not.
    let small = DeviceMemory::open_ipc(0, handle, 10).unwrap();
    let mut ten = [0u8; 10];
    small.copy_to_host(0, &mut ten).unwrap();
    assert_eq!(ten[..], pattern(IPC_LEN, 3)[..10]);
    drop(small);
    match DeviceMemory::open_ipc(0, handle, IPC_LEN + (1 << 30)) {
        Err(FabricError::Cuda(msg)) => assert!(msg.contains("fewer than"), "{msg}"),
        other => panic!("a length past the allocation: expected an error, got {other:?}"),
    }
    // Garbage is a clear error naming the call.
    let mut bad = vec![IpcMemHandle([0; 64]), IpcMemHandle([0xAB; 64])];
    if standin {
        // A real handle with bytes changed (the stand-in checksums its handles).
        let mut junk = handle;
        junk.0[40] ^= 0x01;
        bad.push(junk);
    }
    for h in bad {
        match DeviceMemory::open_ipc(0, h, 4096) {
            Err(FabricError::Cuda(msg)) => {
                assert!(msg.contains("cuIpcOpenMemHandle"), "{msg}");
                if standin {
                    assert!(msg.contains("CUDA error 1)"), "INVALID_VALUE: {msg}");
                }
            }
            other => panic!("a garbage handle: expected a CUDA error, got {other:?}"),
        }
    }
}

/// Child: the parent freed the allocation; its handle no longer opens.
fn ipc_child_stale() {
    let standin = is_standin(&DeviceMemory::alloc(0, 1).unwrap());
    match DeviceMemory::open_ipc(0, child_handle(), IPC_LEN) {
        Err(FabricError::Cuda(msg)) => {
            assert!(msg.contains("cuIpcOpenMemHandle"), "{msg}");
            if standin {
                assert!(msg.contains("CUDA error 400"), "INVALID_HANDLE: {msg}");
            }
        }
        other => panic!("a freed allocation's handle: expected a CUDA error, got {other:?}"),
    }
}

#[test]
fn a_driver_that_finds_no_device_is_a_clear_error() {
    const NAME: &str = "a_driver_that_finds_no_device_is_a_clear_error";
    if std::env::var(CHILD).as_deref() == Ok("no-device") {
        match fabric::cuda::init() {
            Err(FabricError::Cuda(msg)) => {
                // The driver's words, not just the number.
                assert!(
                    msg.contains("cuInit: no CUDA-capable device is detected (CUDA error 100)"),
                    "{msg}"
                );
                assert!(!fabric::cuda::available());
                assert!(Memory::cuda(0, 4096).is_err());
            }
            other => panic!("expected cuInit to fail, got {other:?}"),
        }
        return;
    }
    if !driver(NAME) {
        return;
    }
    let m = DeviceMemory::alloc(0, 4096).unwrap();
    if !is_standin(&m) {
        eprintln!(
            "{NAME}: nothing to check on a real driver (S3DMA_CUDA_STANDIN_NO_DEVICE is the stand-in's)"
        );
        return;
    }
    run_child(
        NAME,
        &[
            (CHILD, "no-device".into()),
            ("S3DMA_CUDA_STANDIN_NO_DEVICE", "1".into()),
        ],
    );
}

#[test]
fn a_libcuda_that_does_not_load_is_named_in_the_error() {
    const NAME: &str = "a_libcuda_that_does_not_load_is_named_in_the_error";
    if std::env::var(CHILD).as_deref() == Ok("broken-lib") {
        match fabric::cuda::init() {
            // libcuda.so (tried second) may be a real driver on a GPU host.
            Ok(()) => eprintln!("{NAME}: libcuda.so loaded instead"),
            Err(FabricError::Cuda(msg)) => {
                // Why libcuda.so.1 did not load, not only why the fallback
                // libcuda.so did not.
                let dir = std::env::var("LD_LIBRARY_PATH").unwrap();
                assert!(msg.contains(&format!("{dir}/libcuda.so.1")), "{msg}");
                assert!(msg.contains("libcuda.so ("), "{msg}");
            }
            Err(e) => panic!("expected a CUDA error, got {e}"),
        }
        return;
    }
    // Needs no driver: a file named libcuda.so.1 that is no library, found
    // first through LD_LIBRARY_PATH.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("libcuda.so.1"), b"not an ELF file").unwrap();
    run_child(
        NAME,
        &[
            (CHILD, "broken-lib".into()),
            ("LD_LIBRARY_PATH", dir.path().display().to_string()),
        ],
    );
}

#[test]
fn bad_device_ordinals_are_clear_errors() {
    if !driver("bad_device_ordinals_are_clear_errors") {
        return;
    }
    for ordinal in [-1, 4096] {
        match DeviceMemory::alloc(ordinal, 4096) {
            Err(FabricError::Cuda(msg)) => assert!(msg.contains("cuDeviceGet"), "{msg}"),
            other => panic!("device {ordinal}: expected a CUDA error, got {other:?}"),
        }
    }
}

#[test]
#[ignore = "needs an RDMA NIC and an NVIDIA GPU with GPUDirect RDMA (dma-buf), which the \
            stand-in cannot give; on such a host: S3DMA_REQUIRE_CUDA=1 cargo test -p fabric \
            --all-features --test it cuda:: -- --include-ignored"]
fn verbs_registers_gpu_memory_with_dmabuf() {
    let d = Domain::open(fabric::Backend::Verbs).unwrap();
    let r = d
        .register(Memory::cuda(0, 1 << 21).unwrap(), Access::REMOTE_WRITE)
        .unwrap();
    assert_ne!(r.rkey(), 0);
}

/// Memory from `cuMemCreate` exported as a POSIX fd maps the same bytes
/// where the fd is imported (here the same process, as the fd would arrive
/// in another one; the host-shim's `cuda::` tests pass it between processes
/// over the lease). The import keeps the allocation: the exporter may free
/// its handle and close the fd.
#[test]
fn shareable_memory_exported_as_an_fd_imports_the_same_bytes() {
    if !driver("shareable_memory_exported_as_an_fd_imports_the_same_bytes") {
        return;
    }
    let len = (3 << 20) + 5;
    let m = DeviceMemory::alloc_shareable(0, len).unwrap();
    assert_eq!(m.len(), len);
    assert!(m.is_device_memory().unwrap());
    let data = pattern(len, 3);
    m.copy_from_host(0, &data).unwrap();
    let fd = m.export_fd().unwrap();
    let imported = DeviceMemory::import_fd(0, std::os::fd::AsFd::as_fd(&fd), len).unwrap();
    drop(fd);
    assert!(imported.is_device_memory().unwrap());
    assert_ne!(imported.dptr(), m.dptr(), "a mapping of its own");
    assert!(device_bytes(&imported) == data);
    // Writes through either side are seen on the other.
    let patch = pattern(7000, 77);
    imported.copy_from_host(100, &patch).unwrap();
    let mut back = vec![0u8; 7000];
    m.copy_to_host(100, &mut back).unwrap();
    assert_eq!(back, patch);
    drop(m);
    let mut want = data;
    want[100..7100].copy_from_slice(&patch);
    assert!(
        device_bytes(&imported) == want,
        "the import holds the memory"
    );
    // A fabric memory source like any other device memory.
    let mem = Memory::from_cuda(imported);
    assert_eq!((mem.kind(), mem.len()), (MemoryKind::Cuda, len));
}

/// Only CUDA shareable handles import: a pipe, /dev/null and a plain memfd
/// are the driver's errors, as are a size past the allocation and memory
/// exported any other way.
#[test]
fn fds_that_are_not_cuda_allocations_do_not_import() {
    if !driver("fds_that_are_not_cuda_allocations_do_not_import") {
        return;
    }
    let (pipe, _w) = std::io::pipe().unwrap();
    let null = std::fs::File::open("/dev/null").unwrap();
    let memfd = Memory::memfd("plain", 2 << 20).unwrap();
    use std::os::fd::AsFd as _;
    for fd in [pipe.as_fd(), null.as_fd(), memfd.fd().unwrap()] {
        match DeviceMemory::import_fd(0, fd, 4096) {
            Err(FabricError::Cuda(msg)) => {
                assert!(msg.contains("cuMemImportFromShareableHandle"), "{msg}")
            }
            other => panic!("expected a CUDA error, got {other:?}"),
        }
    }
    let m = DeviceMemory::alloc_shareable(0, 1 << 20).unwrap();
    let fd = m.export_fd().unwrap();
    match DeviceMemory::import_fd(0, fd.as_fd(), 1 << 30) {
        Err(FabricError::Cuda(msg)) => assert!(msg.contains("fewer than"), "{msg}"),
        other => panic!("expected a CUDA error, got {other:?}"),
    }
    match DeviceMemory::import_fd(7, fd.as_fd(), 4096) {
        Err(FabricError::Cuda(msg)) => assert!(msg.contains("cuDeviceGet"), "{msg}"),
        other => panic!("expected a CUDA error, got {other:?}"),
    }
    // cuMemAlloc memory has no fd to export; VMM memory no legacy handle.
    let legacy = DeviceMemory::alloc(0, 4096).unwrap();
    assert!(matches!(
        legacy.export_fd(),
        Err(FabricError::InvalidArgument(_))
    ));
    assert!(matches!(
        m.ipc_handle(),
        Err(FabricError::InvalidArgument(_))
    ));
}
