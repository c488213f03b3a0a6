//! The one `main` of the three services (storage-target, dpu-agent,
//! host-shim): the `--config FILE [--check]` command line, tracing on
//! stderr, the runtime, SIGTERM/SIGINT and graceful shutdown, and the
//! machine-read first lines on stdout.
//!
//! A service implements [`Program`] (how to load its configuration and
//! start it) and [`Running`] (its first lines, and how it fails and stops);
//! its `main` is then
//!
//! ```ignore
//! #[derive(Debug, clap::Parser)]
//! #[command(version, about)]
//! struct Cli {
//!     #[command(flatten)]
//!     args: s3dma_service::skeleton::ServiceArgs,
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     s3dma_service::skeleton::main::<my_service::app::MyService>(&Cli::parse().args)
//! }
//! ```
//!
//! What it does, in order: tracing (`RUST_LOG`, else the service's default
//! filter; stderr; ANSI colours only when stderr is a terminal, so log files
//! stay plain text); the configuration is loaded and validated (an error is
//! printed as `Error: <file>: <field.path>: <problem>` and the exit status is
//! 1); with `--check`, `<file>: configuration is valid` and exit 0;
//! otherwise the runtime the configuration asks for (`runtime.worker_threads`:
//! one thread per CPU when absent; `1` is tokio's single-threaded scheduler
//! on the main thread) runs `serve` with a token that SIGTERM or SIGINT
//! cancels. [`main`] starts the service ([`Program::start`]; an error is
//! printed as [`Program::start_error`] says, exit status 1), prints its
//! first lines ([`Running::ready_lines`], with [`announce`]: `<service>
//! listening on ADDR`, then `metrics on ...`: tests and the launcher read
//! them, so their text is fixed), waits for the token or for the service
//! to fail ([`Running::wait`]), and shuts it down ([`Running::shutdown`]).

use std::fmt::Display;
use std::future::Future;
use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// A service, as [`main`] runs it.
pub trait Program {
    /// The program's name, in log lines.
    const NAME: &'static str;
    /// The tracing filter when `RUST_LOG` is not set.
    const LOG_FILTER: &'static str = "info";
    /// The loaded, validated configuration.
    type Config;
    /// Why the configuration cannot be loaded (printed as is: it names the
    /// file).
    type LoadError: Display;
    /// Why the service cannot start.
    type StartError: std::error::Error + 'static;
    /// The started service.
    type Running: Running;

    /// Reads and validates the configuration file (and what it names, such
    /// as secret files), binding nothing: all `--check` runs.
    ///
    /// # Errors
    /// The file's problem, naming the file and the field.
    fn load(path: &Path) -> Result<Self::Config, Self::LoadError>;

    /// The configuration's `runtime.worker_threads`.
    fn worker_threads(cfg: &Self::Config) -> Option<usize>;

    /// Starts the service: it listens, and serves, once this returns.
    fn start(cfg: Self::Config) -> impl Future<Output = Result<Self::Running, Self::StartError>>;

    /// How a start error reads after `Error: `: by default the file, then
    /// the error and its sources ([`report`]).
    fn start_error(config: &Path, e: &Self::StartError) -> String {
        format!("{}: {}", config.display(), report(e))
    }
}

/// A started service.
pub trait Running {
    /// Its first lines on stdout: `<service> listening on ADDR`, then
    /// where metrics are served.
    fn ready_lines(&self) -> Vec<String>;

    /// Resolves only when the service stops on its own (it fails).
    ///
    /// # Errors
    /// Why it stopped.
    fn wait(&mut self) -> impl Future<Output = Result<(), ServerStopped>>;

    /// Stops serving, lets running requests finish (within the service's
    /// grace) and releases what the service holds.
    fn shutdown(self) -> impl Future<Output = ()>;
}

/// The `main` of a service: see the [module documentation](self).
pub fn main<P: Program>(args: &ServiceArgs) -> ExitCode {
    let service = Service {
        name: P::NAME,
        default_log_filter: P::LOG_FILTER,
    };
    let config = args.config.clone();
    service.run(
        args,
        P::load,
        P::worker_threads,
        |cfg, shutdown| async move {
            let mut running = P::start(cfg)
                .await
                .map_err(|e| ServeError::Start(P::start_error(&config, &e)))?;
            announce(running.ready_lines());
            tokio::select! {
                r = running.wait() => r.map_err(ServeError::Stopped)?,
                () = shutdown.cancelled() => {}
            }
            running.shutdown().await;
            Ok::<(), ServeError>(())
        },
    )
}

/// The configuration file at `path`: its name as errors show it, and its
/// text (what every service's `load` starts with).
///
/// # Errors
/// [`s3dma_config::ConfigError::Read`].
pub fn read_config(path: &Path) -> Result<(String, String), s3dma_config::ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| s3dma_config::ConfigError::Read {
        file: file.clone(),
        source,
    })?;
    Ok((file, text))
}

/// Why [`main`] ends with an error once the configuration is loaded.
#[derive(Debug, thiserror::Error)]
enum ServeError {
    /// The service did not start (as [`Program::start_error`] reads it).
    #[error("{0}")]
    Start(String),
    /// The service stopped on its own (the error and its sources).
    #[error("{}", report(.0))]
    Stopped(ServerStopped),
}

/// A service binary's `main.rs` below its `//!` line: mimalloc as the
/// global allocator (chosen by measurement, `s3dma-tools bench`, A/B on the
/// same build: glibc's malloc/free were about a tenth of the agent's and
/// the shim's CPU per small request, and mimalloc cut that CPU by
/// 10-15 %), the `Cli` (`--version`, `--help` from the doc lines given,
/// [`ServiceArgs`] documented by `config:`) and `main`, which runs
/// [`main`] for `program`. The binary's crate depends on `mimalloc` and
/// `clap`.
///
/// ```ignore
/// s3dma_service::service_main! {
///     /// What the service is (its `--help`).
///     program: my_service::app::MyService,
///     config: "See my-service.example.yaml for the configuration file.",
/// }
/// ```
#[macro_export]
macro_rules! service_main {
    ($(#[doc = $about:literal])* program: $program:ty, config: $config:literal $(,)?) => {
        /// mimalloc, chosen by measurement (`s3dma-tools bench`, A/B on the
        /// same build): see [`s3dma_service::service_main`].
        #[global_allocator]
        static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

        $(#[doc = $about])*
        #[derive(Debug, clap::Parser)]
        #[command(version, about)]
        struct Cli {
            #[doc = $config]
            #[command(flatten)]
            args: $crate::skeleton::ServiceArgs,
        }

        fn main() -> std::process::ExitCode {
            $crate::skeleton::main::<$program>(&<Cli as clap::Parser>::parse().args)
        }
    };
}

/// The command line every service takes: `--config FILE [--check]`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServiceArgs {
    /// Configuration file (YAML).
    #[arg(long, short)]
    pub config: PathBuf,
    /// Validate the configuration (and read its secret files), then exit.
    #[arg(long)]
    pub check: bool,
}

/// What differs between the services' `main`s, for [`Service::run`]
/// (which [`main`] calls).
#[derive(Debug, Clone, Copy)]
pub struct Service {
    /// The program's name, in log lines.
    pub name: &'static str,
    /// The tracing filter when `RUST_LOG` is not set, e.g. `info` or
    /// `info,s3s=off`.
    pub default_log_filter: &'static str,
}

impl Service {
    /// Runs the service: see the [module documentation](self).
    /// `load` reads and validates the configuration file (its error is
    /// printed as is: it names the file); `worker_threads` picks the
    /// configuration's `runtime.worker_threads` (validated by `load`);
    /// `serve` serves until the token is cancelled, then shuts down and
    /// returns.
    pub fn run<C, LE, SE, Fut>(
        self,
        args: &ServiceArgs,
        load: impl FnOnce(&Path) -> Result<C, LE>,
        worker_threads: impl FnOnce(&C) -> Option<usize>,
        serve: impl FnOnce(C, CancellationToken) -> Fut,
    ) -> ExitCode
    where
        LE: Display,
        SE: Display,
        Fut: Future<Output = Result<(), SE>>,
    {
        init_tracing(self.default_log_filter);
        let cfg = match load(&args.config) {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        if args.check {
            println!("{}: configuration is valid", args.config.display());
            return ExitCode::SUCCESS;
        }
        let rt = match runtime(worker_threads(&cfg)) {
            Ok(rt) => rt,
            Err(e) => return fail(format_args!("starting the runtime: {e}")),
        };
        let name = self.name;
        rt.block_on(async move {
            let shutdown = CancellationToken::new();
            if let Err(e) = cancel_on_signals(name, shutdown.clone()) {
                return fail(format_args!("installing the signal handlers: {e}"));
            }
            match serve(cfg, shutdown).await {
                Ok(()) => {
                    tracing::info!("{name} stopped");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        })
    }
}

fn fail(e: impl Display) -> ExitCode {
    eprintln!("Error: {e}");
    ExitCode::FAILURE
}

/// Installs the tracing subscriber: `RUST_LOG` when set (and valid), else
/// `default_filter`; written to stderr, with ANSI colours only when stderr
/// is a terminal.
pub fn init_tracing(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    // A second call (a test that runs two services in one process) keeps
    // the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// The runtime for `worker_threads` (absent: one per CPU). One thread is
/// tokio's current-thread scheduler, not a multi-thread one with a single
/// worker: that would still hand I/O and timer events between threads.
fn runtime(worker_threads: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let threads = worker_threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, std::num::NonZero::get));
    if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
}

/// Cancels `token` on the first SIGTERM or SIGINT (logged).
///
/// # Errors
/// A handler could not be installed.
pub fn cancel_on_signals(name: &'static str, token: CancellationToken) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: {name} shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: {name} shutting down"),
            () = token.cancelled() => return,
        }
        token.cancel();
    });
    Ok(())
}

/// Prints a service's first lines on stdout and flushes them: `<service>
/// listening on ADDR`, then where metrics are served. Tests and the
/// launcher read these lines; keep their text.
pub fn announce(lines: impl IntoIterator<Item = String>) {
    let mut out = std::io::stdout().lock();
    for l in lines {
        let _ = writeln!(out, "{l}");
    }
    let _ = out.flush();
}

/// An error and every source below it, `: `-separated (what a person
/// reads when a service cannot start).
#[must_use]
pub fn report(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

/// Why a service's server task stopped before it was asked to.
#[derive(Debug, thiserror::Error)]
pub enum ServerStopped {
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Transport(#[source] tonic::transport::Error),
    /// Its task panicked or was aborted.
    #[error("gRPC server task ended: {0}")]
    Task(#[source] tokio::task::JoinError),
    /// The HTTP server's task panicked or was aborted.
    #[error("HTTP server task ended: {0}")]
    HttpTask(#[source] tokio::task::JoinError),
}

/// Waits for a gRPC server task (it does not end on its own unless it
/// fails).
///
/// # Errors
/// [`ServerStopped`].
pub async fn join_server(
    server: &mut JoinHandle<Result<(), tonic::transport::Error>>,
) -> Result<(), ServerStopped> {
    match server.await {
        Ok(r) => r.map_err(ServerStopped::Transport),
        Err(e) => Err(ServerStopped::Task(e)),
    }
}
