//! `dpu-agent --config <file.yaml> [--check]`: the s3dma offload service.

s3dma_service::service_main! {
    /// s3dma's DPU offload service: S3 auth, transfer planning and RDMA
    /// sessions on behalf of the host-shims of this host.
    program: dpu_agent::app::Agent,
    config: "See dpu-agent.example.yaml for the configuration file.",
}
