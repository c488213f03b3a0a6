//! `storage-target --config <file.yaml> [--check]`: the s3dma S3 object server.

/// mimalloc, chosen by measurement (`s3dma-tools bench`, A/B on the same
/// build): glibc's malloc/free were about a tenth of the agent's and the
/// shim's CPU per small request, and mimalloc cut that CPU by 10-15 %.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;

/// S3-compatible object server of s3dma.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    args: s3dma_service::skeleton::ServiceArgs,
}

fn main() -> std::process::ExitCode {
    s3dma_service::skeleton::main::<storage_target::Target>(&Cli::parse().args)
}
