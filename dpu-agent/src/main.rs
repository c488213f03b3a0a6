//! `dpu-agent --config <file.yaml>`: the s3dma offload service.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use tracing_subscriber::EnvFilter;

/// s3dma's DPU offload service: S3 auth, transfer planning and RDMA
/// sessions on behalf of the host-shims of this host.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Configuration file (YAML); see dpu-agent.example.yaml.
    #[arg(long, short)]
    config: PathBuf,
    /// Validate the configuration (and read its secret files), then exit.
    #[arg(long)]
    check: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: log files stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cfg = dpu_agent::config::load(&args.config).map_err(|e| anyhow::anyhow!("{e}"))?;
    if args.check {
        println!("{}: configuration is valid", args.config.display());
        return Ok(());
    }
    let threads = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let mut running = dpu_agent::app::start(cfg)
            .await
            .map_err(|e| anyhow::anyhow!("{}: {e}", args.config.display()))?;
        // The first lines are machine-read by tests and local mode.
        println!("dpu-agent listening on {}", running.grpc_addr);
        if let Some(m) = running.metrics_server.describe() {
            println!("metrics on {m}");
        }
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        let failed = tokio::select! {
            r = running.wait() => Some(r),
            _ = tokio::signal::ctrl_c() => None,
            _ = term.recv() => None,
        };
        if let Some(r) = failed {
            return r.map_err(|e| anyhow::anyhow!("gRPC server failed: {e}"));
        }
        tracing::info!("shutting down");
        running.shutdown().await;
        Ok(())
    })
}
