//! `storage-target --config <file.yaml> [--check]`: the s3dma S3 object server.

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
    service.run(&cli.args, storage_target::load, storage_target::serve)
}
