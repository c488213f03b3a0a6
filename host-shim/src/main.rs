//! `host-shim --config <file.yaml> [--check]`: s3dma's tenant-facing service on a GPU host.

/// mimalloc, chosen by measurement (`s3dma-tools bench`, A/B on the same
/// build): glibc's malloc/free were about a tenth of the agent's and the
/// shim's CPU per small request, and mimalloc cut that CPU by 10-15 %.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use s3dma_service::skeleton::{Service, ServiceArgs, announce, report};

/// s3dma's host service: the tenant API on a Unix socket, tenant memory as
/// per-request fabric windows, calls forwarded to this host's dpu-agent.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// See host-shim.example.yaml for the configuration file.
    #[command(flatten)]
    args: ServiceArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let service = Service {
        name: "host-shim",
        default_log_filter: "info",
    };
    let file = cli.args.config.display().to_string();
    service.run(
        &cli.args,
        host_shim::config::load,
        |cfg| cfg.config.runtime.worker_threads,
        |cfg, shutdown| async move {
            let mut running = host_shim::app::start(cfg)
                .await
                .map_err(|e| format!("{file}: {}", report(&e)))?;
            // The first lines are machine-read by tests and the launcher.
            let mut lines = vec![format!(
                "host-shim listening on {}",
                running.socket.display()
            )];
            lines.extend(
                running
                    .metrics_addr
                    .map(|m| format!("metrics on http://{m}/metrics")),
            );
            lines.extend(
                running
                    .metrics_server
                    .unix_socket
                    .as_ref()
                    .map(|p| format!("metrics socket {}", p.display())),
            );
            announce(lines);
            tokio::select! {
                r = running.wait() => r.map_err(|e| report(&e))?,
                () = shutdown.cancelled() => {}
            }
            running.shutdown().await;
            Ok::<(), String>(())
        },
    )
}
