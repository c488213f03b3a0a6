//! CUDA buffers through the shim (feature `cuda`): a GPU allocation exported
//! with cuIpcGetMemHandle, registered over the tenant API, filled by a GET
//! and read by a PUT. Needs an NVIDIA GPU and driver, so it is ignored here;
//! run `cargo test -p host-shim --features cuda --test cuda -- --ignored`
//! on a GPU host after `cargo build --features host-shim/cuda --bins`.
#![cfg(feature = "cuda")]

mod common;

use common::*;
use fabric::cuda::DeviceMemory;
use s3dma_client::PutOptions;
use s3dma_proto::tenant::v1 as api;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an NVIDIA GPU and driver (CUDA IPC); run with --ignored on a GPU host"]
async fn gpu_buffer_get_and_put() {
    let stack = Stack::start().await;
    let c = stack.client().await;
    let len = 24 << 20;
    let payload = data(len, 11);
    let mut src = c.alloc(len).await.unwrap();
    src.as_mut_slice().copy_from_slice(&payload);
    c.put_object_from("alice-data", "gpu/in", &src, 0..len, PutOptions::default())
        .await
        .unwrap();

    // A lease of our own: CUDA buffers live under a lease like host ones.
    let mut lease = tokio::net::UnixStream::connect(&stack.shim.socket)
        .await
        .unwrap();
    lease.write_all(&s3dma_proto::lease::MAGIC).await.unwrap();
    let mut h = [0u8; 24];
    lease.read_exact(&mut h).await.unwrap();
    assert_eq!(h[0], 0, "lease refused");

    let gpu = DeviceMemory::alloc(0, len + 4096).unwrap();
    gpu.copy_from_host(0, &vec![0xEE; len + 4096]).unwrap();
    let handle = gpu.ipc_handle().unwrap();
    let mut raw = raw_tenant_client(&stack.shim.socket).await;
    let buffer = raw
        .register_buffer(api::RegisterBufferRequest {
            lease: h[8..24].to_vec(),
            memory: Some(api::register_buffer_request::Memory::Cuda(
                api::CudaMemory {
                    ipc_handle: handle.0.to_vec(),
                    device: 0,
                    size: (len + 4096) as u64,
                },
            )),
            label: "gpu".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .buffer_id;

    // GET into the GPU buffer at an offset; the bytes around stay.
    let got = raw
        .get_object(api::GetObjectRequest {
            bucket: "alice-data".into(),
            key: "gpu/in".into(),
            destination: Some(api::BufferSlice {
                buffer_id: buffer,
                offset: 4096,
                length: Some(len as u64),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.bytes_placed, len as u64);
    let mut back = vec![0u8; len + 4096];
    gpu.copy_to_host(0, &mut back).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 0xEE));
    assert_eq!(sha256(&back[4096..]), sha256(&payload));

    // PUT from the GPU buffer.
    raw.put_object(api::PutObjectRequest {
        bucket: "alice-data".into(),
        key: "gpu/out".into(),
        source: Some(api::BufferSlice {
            buffer_id: buffer,
            offset: 4096,
            length: Some(len as u64),
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let stored = agent::sdk_get(&stack.target.s3(ALICE), "alice-data", "gpu/out").await;
    assert_eq!(sha256(&stored), sha256(&payload));
}
