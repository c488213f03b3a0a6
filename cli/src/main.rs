//! `s3dma`: the s3dma command line.
//!
//! Client commands talk to the host-shim on its Unix socket (`--socket`,
//! else `$S3DMA_SOCKET`, else `/run/s3dma/shim.sock`, else, when that does
//! not exist, the socket `s3dma local` uses by default) through
//! `s3dma-client`: `get`, `put`, `ls`, `stat`, `rm`, `info`. Object bytes
//! move between shared-memory buffers and storage by RDMA; the CLI only
//! copies them between those buffers and files.
//!
//! `s3dma local` starts storage-target, dpu-agent and host-shim on this
//! machine: the CLI runs `s3dma-launcher`'s `s3dma-local` binary (beside
//! `s3dma`, else on `PATH`; see `local.rs`) with the same arguments, so the
//! tenant CLI itself links none of the servers. The bench and the soak
//! are the `s3dma-tools` binary's.
//!
//! Exit status:
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | success |
//! | 1 | any other error (I/O, internal, quota, timeout; `s3dma local` failures) |
//! | 2 | usage: a bad command line or URL |
//! | 3 | not found (`NoSuchKey`, `NoSuchBucket`) |
//! | 4 | access denied (or a uid the shim does not know) |
//! | 5 | unavailable: the host-shim (its socket) or the dpu-agent is down |
//! | 6 | precondition failed: the object changed during the transfer |
//! | 7 | invalid range |
//! | 8 | untrusted shim: the socket is served by a uid that is neither root nor the expected one |
//! | 130 | interrupted (Ctrl-C, SIGTERM): finished files stay, no partial file is left |
//!
//! The recursive commands (`get -r`, `put -r`, `sync`, in `recursive/`;
//! `rm -r`, which deletes in batched DeleteObjects calls) go on past a
//! file that fails, report each one, and exit with the first failure's
//! code.
//!
//! Every connection to the socket is checked (`SO_PEERCRED`) before a byte
//! is sent: the shim must run as root or as the caller's own uid, or as the
//! uid named by `--shim-uid` / `$S3DMA_SHIM_UID` (a number or a user name).
//!
//! Errors are one line on stderr: `s3dma: <what>: <code>: <message> (request id ...)`.

mod commands;
mod local;
mod recursive;
mod tree;
mod url;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgMatches, CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use s3dma_config::ByteSize;

use commands::{Failure, Global};
use tree::{FilterArg, Filters};

const EXIT_CODES: &str = "\
Exit status:
  0  success
  1  any other error (I/O, internal, quota, timeout; local mode failures)
  2  usage: a bad command line or URL
  3  not found (NoSuchKey, NoSuchBucket)
  4  access denied
  5  unavailable: the host-shim (its socket) or the dpu-agent is down
  6  precondition failed: the object changed during the transfer
  7  invalid range
  8  untrusted shim: the socket is served by a uid that is neither root nor
     the expected one (another user's process?); nothing was sent to it
130  interrupted (Ctrl-C, SIGTERM): finished files stay, no partial file is left

A recursive command (get -r, put -r, sync) goes on past a file that fails,
reports each one, and exits with the first failure's code.

Every connection to the socket is checked first: the shim must run as root,
as you, or as the uid given by --shim-uid or $S3DMA_SHIM_UID.

Errors are one line on stderr: s3dma: <what>: <code>: <message> (request id ...)";

/// Move S3 objects through the s3dma host-shim (RDMA into shared memory),
/// or run the whole stack locally (`s3dma local`).
#[derive(Debug, Parser)]
#[command(version, about, after_help = EXIT_CODES)]
struct Cli {
    /// The host-shim's Unix socket.
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        help = "The host-shim's Unix socket [default: $S3DMA_SOCKET, else /run/s3dma/shim.sock, \
                else (when that does not exist) the socket of `s3dma local`: \
                $XDG_RUNTIME_DIR/s3dma/shim.sock, else /tmp/s3dma-<uid>/shim.sock; \
                for `local`: that last one]"
    )]
    socket: Option<PathBuf>,
    /// The user the host-shim runs as, when it is neither root nor you: a
    /// uid or a user name [default: $S3DMA_SHIM_UID, else root or you].
    /// A socket served by anyone else is refused (exit 8) before a byte is
    /// sent.
    #[arg(
        long,
        global = true,
        value_name = "UID|USER",
        value_parser = parse_shim_uid
    )]
    shim_uid: Option<u32>,
    /// No progress bars or summaries (errors are still printed).
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Download an object (or a range of it) to a file or stdout; with
    /// --recursive, every object under a prefix into a directory.
    #[command(after_help = EXIT_CODES)]
    Get {
        /// s3://bucket/key (with --recursive: s3://bucket[/prefix])
        url: String,
        /// Destination file, a directory, or - for stdout.
        #[arg(help = "Destination file, a directory, or - for stdout \
                    [default: the key's last part, in the current directory]; \
                    with --recursive: the directory [default: .]")]
        file: Option<PathBuf>,
        /// Only these bytes: FIRST-LAST, FIRST- or -SUFFIX (e.g. 0-1023).
        #[arg(
            long,
            value_name = "RANGE",
            allow_hyphen_values = true,
            conflicts_with = "recursive"
        )]
        range: Option<String>,
        /// Every object under the prefix (s3://b/models means models/),
        /// into the directory FILE, keys' "/" as subdirectories.
        #[arg(short, long)]
        recursive: bool,
        #[command(flatten)]
        tree: TreeArgs,
    },
    /// Upload a file (or stdin, -) as one object; with --recursive, every
    /// file under a directory.
    #[command(after_help = EXIT_CODES)]
    Put {
        /// Source file, or - for stdin (with --recursive: a directory).
        file: PathBuf,
        /// s3://bucket/key (a key ending in / gets the file's name appended;
        /// with --recursive: the prefix the files' relative paths go under).
        url: String,
        /// Every regular file under the directory FILE (symlinks are not
        /// followed).
        #[arg(short, long)]
        recursive: bool,
        #[command(flatten)]
        tree: TreeArgs,
        /// Content-Type to store.
        #[arg(long, value_name = "TYPE")]
        content_type: Option<String>,
        /// User metadata NAME=VALUE (repeatable).
        #[arg(long = "meta", value_name = "NAME=VALUE")]
        meta: Vec<String>,
    },
    /// List objects: s3://bucket[/prefix]; directories (common prefixes) show
    /// as PRE unless --recursive.
    #[command(after_help = EXIT_CODES)]
    Ls {
        /// s3://bucket or s3://bucket/prefix
        url: String,
        /// Every key under the prefix, without grouping by "/".
        #[arg(short, long)]
        recursive: bool,
    },
    /// Show an object's size, ETag, content type, modification time and metadata.
    #[command(after_help = EXIT_CODES)]
    Stat {
        /// s3://bucket/key
        url: String,
    },
    /// Make a directory and a prefix alike, either way (SRC and DST: one
    /// s3:// URL and one directory): copy what the destination lacks, has
    /// at another size, or has older (by modification time).
    #[command(after_help = EXIT_CODES)]
    Sync {
        /// s3://bucket[/prefix] or a directory.
        src: String,
        /// A directory or s3://bucket[/prefix].
        dst: String,
        /// Also remove from the destination what the source does not have
        /// (not what --exclude leaves out); skipped when a copy failed.
        /// A name that cannot cross (a key that cannot be a local name:
        /// `..`, `//`, control characters; a file name not UTF-8) is never
        /// written nor deleted: each is named on stderr, the safe deletions
        /// go ahead, and the exit status is then 1.
        #[arg(long)]
        delete: bool,
        #[command(flatten)]
        tree: TreeArgs,
    },
    /// Delete an object (deleting a missing key succeeds, as in S3); with
    /// --recursive, every object under a prefix, in batched calls.
    #[command(after_help = EXIT_CODES)]
    Rm {
        /// s3://bucket/key (with --recursive: s3://bucket[/prefix])
        url: String,
        /// Delete every object whose key starts with the URL's prefix
        /// (DeleteObjects, up to 256 keys a call); goes on past a key that
        /// fails, reports each, and exits with the first failure's code.
        #[arg(short, long)]
        recursive: bool,
    },
    /// Show who the shim thinks you are, your limits and whether the
    /// dpu-agent is connected.
    #[command(after_help = EXIT_CODES)]
    Info,
    /// Run storage-target, dpu-agent and host-shim on this machine
    /// (loopback only; the tcp fabric unless --fabric verbs) until Ctrl-C. Prints
    /// `s3dma local ready: socket=PATH` when they are up.
    ///
    /// The socket's default directory (`$XDG_RUNTIME_DIR/s3dma`, else
    /// `/tmp/s3dma-<uid>`) is made 0700 and refused when another user owns it
    /// or it is a symlink; a --socket elsewhere needs a directory of yours
    /// (or root's) that neither group nor others may write to. The other
    /// commands find the default socket by themselves (no --socket or
    /// $S3DMA_SOCKET needed) unless /run/s3dma/shim.sock exists.
    #[command(disable_help_flag = true, disable_version_flag = true)]
    Local {
        /// The arguments of `s3dma-local` (`s3dma local --help` lists them).
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "ARGS"
        )]
        args: Vec<std::ffi::OsString>,
    },
}

/// The flags of the recursive commands.
#[derive(Debug, clap::Args)]
struct TreeArgs {
    /// Only names (relative to the prefix or directory, "/"-separated)
    /// matching GLOB; repeatable. With --exclude: everything is in at
    /// first, and the last --include/--exclude that matches decides (as in
    /// the aws CLI). "*" matches across "/".
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,
    /// Leave out names matching GLOB; repeatable (see --include).
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Transfers in flight (ranged GETs, batches of small objects, PUTs).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    concurrency: u16,
    /// Registered memory the buffers may take, at most (also bounded by
    /// the tenant's buffer limits). An upload needs one buffer the size of
    /// each file larger than --chunk-size.
    #[arg(long, value_name = "SIZE", default_value = "1GiB")]
    memory: ByteSize,
    /// Bytes per ranged GET, and per pooled buffer (16 MiB lets writing
    /// one range to its file overlap the next ranges' transfers; 64 MiB
    /// chunks measured 35 % slower on a 2 GiB directory).
    #[arg(long, value_name = "SIZE", default_value = "16MiB")]
    chunk_size: ByteSize,
}

impl TreeArgs {
    fn options(
        &self,
        m: Option<&ArgMatches>,
        sync: bool,
        delete: bool,
    ) -> Result<recursive::TreeOptions, Failure> {
        let mut filters = Vec::new();
        if let Some(m) = m {
            for (id, include) in [("include", true), ("exclude", false)] {
                if let (Some(values), Some(positions)) =
                    (m.get_many::<String>(id), m.indices_of(id))
                {
                    for (glob, position) in values.zip(positions) {
                        filters.push(FilterArg {
                            position,
                            include,
                            glob: glob.clone(),
                        });
                    }
                }
            }
        }
        if self.chunk_size.0 == 0 || self.memory.0 == 0 {
            return Err(Failure::Usage(
                "--chunk-size and --memory must be above 0".into(),
            ));
        }
        Ok(recursive::TreeOptions {
            filters: Filters::new(filters).map_err(|e| Failure::Usage(e.to_string()))?,
            concurrency: usize::from(self.concurrency),
            memory: self.memory.0,
            chunk: self.chunk_size.0,
            sync,
            delete,
        })
    }

    fn is_default(&self) -> bool {
        self.include.is_empty() && self.exclude.is_empty()
    }
}

/// `--shim-uid`: a uid or a user name.
fn parse_shim_uid(s: &str) -> Result<u32, BadUid> {
    s3dma_client::resolve_uid(s).map_err(BadUid)
}

/// A `--shim-uid` that names no user: the client's message alone (clap
/// names the option).
#[derive(Debug)]
struct BadUid(s3dma_client::Error);

impl std::fmt::Display for BadUid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.message())
    }
}

impl std::error::Error for BadUid {}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Cmd::Local { args } = &cli.command {
        // Replaces this process, so signals and the exit status are
        // `s3dma-local`'s own.
        return local::exec(cli.socket.as_deref(), args).report();
    }
    let sub = matches.subcommand().map(|(_, m)| m);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("s3dma: starting the runtime: {e}");
            return ExitCode::from(commands::EXIT_OTHER);
        }
    };
    let g = Global {
        socket: cli.socket.clone(),
        quiet: cli.quiet,
        shim_uid: cli.shim_uid,
    };
    let result: Result<(), Failure> = rt.block_on(async {
        match cli.command {
            Cmd::Get {
                url,
                file,
                range,
                recursive: true,
                tree,
            } => {
                let _ = range;
                let dir = file.unwrap_or_else(|| PathBuf::from("."));
                recursive::download(&g, &url, &dir, tree.options(sub, false, false)?).await
            }
            Cmd::Get {
                url,
                file,
                range,
                recursive: false,
                tree,
            } => {
                if !tree.is_default() {
                    return Err(Failure::Usage(
                        "--include/--exclude need --recursive".into(),
                    ));
                }
                commands::get(&g, &url, file.as_deref(), range.as_deref()).await
            }
            Cmd::Put {
                file,
                url,
                recursive: true,
                tree,
                content_type,
                meta,
            } => {
                if content_type.is_some() || !meta.is_empty() {
                    return Err(Failure::Usage(
                        "--content-type and --meta apply to one object, not to --recursive".into(),
                    ));
                }
                recursive::upload(&g, &file, &url, tree.options(sub, false, false)?).await
            }
            Cmd::Put {
                file,
                url,
                recursive: false,
                tree,
                content_type,
                meta,
            } => {
                if !tree.is_default() {
                    return Err(Failure::Usage(
                        "--include/--exclude need --recursive".into(),
                    ));
                }
                commands::put(&g, &file, &url, content_type, &meta).await
            }
            Cmd::Sync {
                src,
                dst,
                delete,
                tree,
            } => {
                let opts = tree.options(sub, true, delete)?;
                match (src.starts_with("s3://"), dst.starts_with("s3://")) {
                    (true, false) => {
                        recursive::download(&g, &src, std::path::Path::new(&dst), opts).await
                    }
                    (false, true) => {
                        recursive::upload(&g, std::path::Path::new(&src), &dst, opts).await
                    }
                    _ => Err(Failure::Usage(
                        "sync needs one s3://bucket[/prefix] and one directory".into(),
                    )),
                }
            }
            Cmd::Ls { url, recursive } => commands::ls(&g, &url, recursive).await,
            Cmd::Stat { url } => commands::stat(&g, &url).await,
            Cmd::Rm {
                url,
                recursive: false,
            } => commands::rm(&g, &url).await,
            Cmd::Rm {
                url,
                recursive: true,
            } => commands::rm_recursive(&g, &url).await,
            Cmd::Info => commands::info(&g).await,
            Cmd::Local { .. } => unreachable!("`s3dma local` replaced this process above"),
        }
    });
    // Background buffer releases must not hold the exit up.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => ExitCode::from(commands::EXIT_OK),
        Err(f) => f.report(),
    }
}
