//! `host-shim --config <file.yaml> [--check]`: s3dma's tenant-facing service on a GPU host.

/// mimalloc, chosen by measurement (`s3dma-tools bench`, A/B on the same
/// build): glibc's malloc/free were about a tenth of the agent's and the
/// shim's CPU per small request, and mimalloc cut that CPU by 10-15 %.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;

/// s3dma's host service: the tenant API on a Unix socket, tenant memory as
/// per-request fabric windows, calls forwarded to this host's dpu-agent.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// See host-shim.example.yaml for the configuration file.
    #[command(flatten)]
    args: s3dma_service::skeleton::ServiceArgs,
}

fn main() -> std::process::ExitCode {
    s3dma_service::skeleton::main::<host_shim::app::Shim>(&Cli::parse().args)
}
