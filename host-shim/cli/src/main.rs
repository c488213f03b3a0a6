//! `s3dma`: the s3dma command line.
//!
//! `s3dma local` starts storage-target, dpu-agent and host-shim on this
//! machine (see [`local`]).

mod local;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// s3dma command line.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run storage-target, dpu-agent and host-shim on this machine (tcp
    /// fabric, loopback only) until Ctrl-C.
    Local {
        /// State directory: data, generated configs, secrets, logs
        /// [default: $XDG_DATA_HOME/s3dma/local or ~/.local/share/s3dma/local].
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The shim's socket [default: $XDG_RUNTIME_DIR/s3dma/shim.sock or
        /// /tmp/s3dma-<uid>/shim.sock].
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Bucket created at start-up if missing.
        #[arg(long, default_value = "data")]
        bucket: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("s3dma: starting the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match cli.command {
        Cmd::Local {
            dir,
            socket,
            bucket,
        } => {
            match rt.block_on(local::run(local::Options {
                dir,
                socket,
                bucket,
            })) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("s3dma local: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
    }
}
