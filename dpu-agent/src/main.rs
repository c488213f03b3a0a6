//! `dpu-agent --config <file.yaml> [--check]`: the s3dma offload service.

/// mimalloc, chosen by measurement (`s3dma-tools bench`, A/B on the same
/// build): glibc's malloc/free were about a tenth of the agent's and the
/// shim's CPU per small request, and mimalloc cut that CPU by 10-15 %.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;

/// s3dma's DPU offload service: S3 auth, transfer planning and RDMA
/// sessions on behalf of the host-shims of this host.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// See dpu-agent.example.yaml for the configuration file.
    #[command(flatten)]
    args: s3dma_service::skeleton::ServiceArgs,
}

fn main() -> std::process::ExitCode {
    s3dma_service::skeleton::main::<dpu_agent::app::Agent>(&Cli::parse().args)
}
