//! `storage-target --config <file.yaml> [--check]`: the s3dma S3 object server.

/// mimalloc, chosen by measurement (`s3dma-tools bench`, A/B on the same
/// build): glibc's malloc/free were about a tenth of the agent's and the
/// shim's CPU per small request, and mimalloc cut that CPU by 10-15 %.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use s3dma_service::skeleton::{Service, ServiceArgs};

/// S3-compatible object server of s3dma.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    args: ServiceArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let service = Service {
        name: "storage-target",
        default_log_filter: "info,s3s=off",
    };
    service.run(
        &cli.args,
        storage_target::load,
        |loaded| loaded.config.runtime.worker_threads,
        storage_target::serve,
    )
}
