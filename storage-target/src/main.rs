//! `storage-target --config <file.yaml> [--check]`: the s3dma S3 object server.

use std::io::IsTerminal as _;
use std::path::PathBuf;

use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::info;
use tracing_subscriber::EnvFilter;

/// S3-compatible object server of s3dma.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Path of the YAML configuration file.
    #[arg(long)]
    config: PathBuf,
    /// Validate the configuration (and read its secret files), then exit.
    #[arg(long)]
    check: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.check {
        storage_target::check(&args.config).map_err(|e| anyhow::anyhow!("{e}"))?;
        println!("{}: configuration is valid", args.config.display());
        return Ok(());
    }
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,s3s=off"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let shutdown = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let s = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: shutting down"),
            _ = int.recv() => info!("SIGINT: shutting down"),
        }
        s.cancel();
    });
    storage_target::run(&args.config, shutdown)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
}
