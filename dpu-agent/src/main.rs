//! `dpu-agent --config <file.yaml> [--check]`: the s3dma offload service.

/// mimalloc, chosen by measurement (`s3dma-tools bench`, A/B on the same
/// build): glibc's malloc/free were about a tenth of the agent's and the
/// shim's CPU per small request, and mimalloc cut that CPU by 10-15 %.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use s3dma_service::skeleton::{Service, ServiceArgs, announce, report};

/// s3dma's DPU offload service: S3 auth, transfer planning and RDMA
/// sessions on behalf of the host-shims of this host.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// See dpu-agent.example.yaml for the configuration file.
    #[command(flatten)]
    args: ServiceArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let service = Service {
        name: "dpu-agent",
        default_log_filter: "info",
    };
    let file = cli.args.config.display().to_string();
    service.run(
        &cli.args,
        dpu_agent::config::load,
        |cfg| cfg.config.runtime.worker_threads,
        |cfg, shutdown| async move {
            let mut running = dpu_agent::app::start(cfg)
                .await
                .map_err(|e| format!("{file}: {}", report(&e)))?;
            // The first lines are machine-read by tests and the launcher.
            let mut lines = vec![format!("dpu-agent listening on {}", running.grpc_addr)];
            lines.extend(
                running
                    .metrics_server
                    .describe()
                    .map(|m| format!("metrics on {m}")),
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
