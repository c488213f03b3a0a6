//! `host-shim --config <file.yaml> [--check]`: s3dma's tenant-facing service on a GPU host.

s3dma_service::service_main! {
    /// s3dma's host service: the tenant API on a Unix socket, tenant memory as
    /// per-request fabric windows, calls forwarded to this host's dpu-agent.
    program: host_shim::app::Shim,
    config: "See host-shim.example.yaml for the configuration file.",
}
