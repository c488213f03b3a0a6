//! CUDA regions on the tcp fabric (feature `cuda`; the GPU tests are ignored
//! where no GPU exists: run with `--features cuda -- --ignored` on a GPU host).
#![cfg(feature = "cuda")]

use fabric::{
    Access, Domain, Endpoint, EndpointConfig, FabricKey, Memory, MemoryKind, Session, SessionConfig,
};

#[test]
fn cuda_memory_without_a_gpu_is_a_clear_error() {
    match Memory::cuda(0, 4096) {
        Ok(m) => assert_eq!(m.kind(), MemoryKind::Cuda),
        Err(e) => assert!(e.to_string().contains("CUDA"), "{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an NVIDIA GPU and driver"]
async fn tcp_fabric_writes_and_reads_gpu_memory_through_a_bounce_buffer() {
    const SZ: usize = 16 << 20;
    let key = FabricKey::random();
    let server = Domain::tcp();
    let gpu = server
        .register(
            Memory::cuda(0, SZ).unwrap(),
            Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
        .unwrap();
    let ep = Endpoint::listen(
        &server,
        EndpointConfig::new("127.0.0.1:0".parse().unwrap(), key.clone()),
    )
    .await
    .unwrap();
    let client = Domain::tcp();
    let src = client.alloc(SZ, Access::LOCAL_WRITE).unwrap();
    let data: Vec<u8> = (0..SZ).map(|i| (i * 7) as u8).collect();
    src.write_at(0, &data).unwrap();
    let s = Session::connect(&client, ep.addr(), SessionConfig::new(key))
        .await
        .unwrap();
    s.write(src.as_slice(), gpu.addr(), gpu.rkey())
        .await
        .unwrap();
    let mut back = vec![0u8; SZ];
    gpu.read_at(0, &mut back).unwrap();
    assert!(back == data);
    let dst = client.alloc(SZ, Access::LOCAL_WRITE).unwrap();
    s.read(dst.as_slice(), gpu.addr(), gpu.rkey())
        .await
        .unwrap();
    assert!(dst.as_slice().to_vec().unwrap() == data);
}

#[test]
#[ignore = "needs an RDMA device and an NVIDIA GPU (GPUDirect RDMA, dma-buf)"]
fn verbs_registers_gpu_memory_with_dmabuf() {
    let d = Domain::open(fabric::Backend::Verbs).unwrap();
    let r = d
        .register(Memory::cuda(0, 1 << 21).unwrap(), Access::REMOTE_WRITE)
        .unwrap();
    assert_ne!(r.rkey(), 0);
}
