//! The client commands: get, put, ls, stat, rm, info (through
//! `s3dma-client`).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, IsTerminal as _, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use indicatif::{BinaryBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};
use s3dma_client::{
    Buffer, ByteRange, Client, ClientOptions, ErrorKind, GetOptions, GetOutput, ListOptions,
    ObjectKey, PutOptions,
};
use tokio::task::JoinHandle;

use crate::url::{S3Url, chunks, resolve_range};

/// Bytes fetched per GetObject; two buffers of this size alternate.
pub(crate) const CHUNK: u64 = 64 << 20;
/// Transfers at least this large show a progress bar (when stderr is a TTY).
const PROGRESS_MIN: u64 = 4 << 20;
/// Bytes read from a file per `read` call while filling a buffer.
const READ_STEP: usize = 8 << 20;

/// Exit status: success.
pub(crate) const EXIT_OK: u8 = 0;
/// Exit status: any other error (I/O, internal, quota, timeout).
pub(crate) const EXIT_OTHER: u8 = 1;
/// Exit status: the command line is wrong (also clap's own usage errors).
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit status: no such object or bucket.
pub(crate) const EXIT_NOT_FOUND: u8 = 3;
/// Exit status: access denied (or a uid the shim does not know).
pub(crate) const EXIT_ACCESS_DENIED: u8 = 4;
/// Exit status: the host-shim or the dpu-agent behind it is unreachable.
pub(crate) const EXIT_UNAVAILABLE: u8 = 5;
/// Exit status: precondition failed (the object changed during the transfer).
pub(crate) const EXIT_PRECONDITION: u8 = 6;
/// Exit status: the byte range cannot be satisfied.
pub(crate) const EXIT_INVALID_RANGE: u8 = 7;
/// Exit status: the socket is served by a uid that is neither root nor the
/// expected one (not the shim; nothing was sent to it).
pub(crate) const EXIT_UNTRUSTED_SHIM: u8 = 8;
/// Exit status: stopped by Ctrl-C or SIGTERM (128 + SIGINT, as shells
/// report it).
pub(crate) const EXIT_INTERRUPTED: u8 = 130;

/// Why a command failed; [`Failure::exit_code`] picks its exit status.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The command line is wrong (exit 2).
    Usage(String),
    /// The shim, the agent or S3 refused (exit by [`ErrorKind`]).
    Client {
        /// What was being done, e.g. `get s3://b/k`.
        what: String,
        /// The client's error.
        error: s3dma_client::Error,
    },
    /// A local I/O or other failure (exit 1).
    Other(String),
    /// Some files of a recursive command failed (each was reported as it
    /// happened); exit by the first.
    Partial {
        /// How many failed.
        failed: usize,
        /// The first failure.
        first: Box<Failure>,
    },
    /// Stopped by Ctrl-C or SIGTERM (exit 130).
    Interrupted,
}

impl Failure {
    /// The process exit status for this failure.
    #[must_use]
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Failure::Usage(_) => EXIT_USAGE,
            Failure::Other(_) => EXIT_OTHER,
            Failure::Partial { first, .. } => first.exit_code(),
            Failure::Interrupted => EXIT_INTERRUPTED,
            Failure::Client { error, .. } => match error.kind {
                ErrorKind::NotFound => EXIT_NOT_FOUND,
                ErrorKind::AccessDenied => EXIT_ACCESS_DENIED,
                ErrorKind::Unavailable => EXIT_UNAVAILABLE,
                ErrorKind::PreconditionFailed => EXIT_PRECONDITION,
                ErrorKind::InvalidRange => EXIT_INVALID_RANGE,
                ErrorKind::UntrustedShim => EXIT_UNTRUSTED_SHIM,
                ErrorKind::InvalidArgument
                | ErrorKind::SlowDown
                | ErrorKind::DeadlineExceeded
                | ErrorKind::Other => EXIT_OTHER,
            },
        }
    }

    /// Prints the one-line message and returns the exit code.
    pub(crate) fn report(&self) -> ExitCode {
        eprintln!("s3dma: {self}");
        ExitCode::from(self.exit_code())
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Usage(m) | Failure::Other(m) => f.write_str(m),
            Failure::Partial { failed: 1, first } => write!(f, "1 file failed: {first}"),
            Failure::Partial { failed, first } => {
                write!(f, "{failed} files failed, the first: {first}")
            }
            Failure::Interrupted => {
                f.write_str("interrupted; finished files are in place, no partial file is left")
            }
            Failure::Client { what, error } => {
                let code = if error.code.is_empty() {
                    format!("{:?}", error.kind)
                } else {
                    error.code.clone()
                };
                write!(f, "{what}: {code}: {}", error.message)?;
                if let Some(id) = &error.request_id {
                    write!(f, " (request id {id})")?;
                }
                Ok(())
            }
        }
    }
}

type Result<T> = std::result::Result<T, Failure>;

fn client_err(what: impl std::fmt::Display) -> impl FnOnce(s3dma_client::Error) -> Failure {
    move |error| Failure::Client {
        what: what.to_string(),
        error,
    }
}

fn io_err(what: impl std::fmt::Display) -> impl FnOnce(io::Error) -> Failure {
    move |e| Failure::Other(format!("{what}: {e}"))
}

fn usage(e: impl std::fmt::Display) -> Failure {
    Failure::Usage(e.to_string())
}

/// Options shared by every client command.
#[derive(Debug, Clone)]
pub(crate) struct Global {
    /// The shim's socket (`None` = `$S3DMA_SOCKET`, else the default).
    pub socket: Option<PathBuf>,
    /// No progress bars or summaries.
    pub quiet: bool,
    /// The uid the shim runs as besides root (`--shim-uid`; `None` =
    /// `$S3DMA_SHIM_UID`, else ours).
    pub shim_uid: Option<u32>,
}

/// Client options trusting a shim running as `shim_uid` (`None`: the
/// client's default, `$S3DMA_SHIM_UID` or our own uid).
#[must_use]
pub(crate) fn client_options(shim_uid: Option<u32>) -> ClientOptions {
    match shim_uid {
        Some(uid) => ClientOptions::new().with_shim_uid(uid),
        None => ClientOptions::new(),
    }
}

/// The shim's socket when `--socket` is not given: `$S3DMA_SOCKET` if set
/// (and not empty), else `/run/s3dma/shim.sock` (the installed shim's) when
/// it exists, else the socket `s3dma local` uses by default
/// (`$XDG_RUNTIME_DIR/s3dma/shim.sock`, else `/tmp/s3dma-<uid>/shim.sock`)
/// when that exists, else `/run/s3dma/shim.sock` (so that the error names
/// the installed shim's socket).
#[must_use]
pub(crate) fn default_socket() -> PathBuf {
    let env = std::env::var_os(s3dma_client::SOCKET_ENV).filter(|v| !v.is_empty());
    let local = s3dma_config::local::default_socket(
        std::env::var_os("XDG_RUNTIME_DIR"),
        nix::unistd::geteuid().as_raw(),
    );
    pick_socket(env.map(PathBuf::from), &local, |p| {
        fs::symlink_metadata(p).is_ok()
    })
}

/// [`default_socket`]'s choice, with `exists` telling which paths exist.
fn pick_socket(env: Option<PathBuf>, local: &Path, exists: impl Fn(&Path) -> bool) -> PathBuf {
    if let Some(p) = env {
        return p;
    }
    let system = Path::new(s3dma_client::DEFAULT_SOCKET);
    if !exists(system) && exists(local) {
        return local.to_path_buf();
    }
    system.to_path_buf()
}

impl Global {
    pub(crate) async fn connect(&self) -> Result<Client> {
        let socket = self.socket.clone().unwrap_or_else(default_socket);
        Client::connect_with(&socket, client_options(self.shim_uid))
            .await
            .map_err(client_err(format_args!(
                "connecting to {}",
                socket.display()
            )))
    }

    pub(crate) fn progress(&self, len: u64, verb: &str) -> ProgressBar {
        if self.quiet || len < PROGRESS_MIN || !io::stderr().is_terminal() {
            return ProgressBar::hidden();
        }
        let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
        ) {
            pb.set_style(style.progress_chars("=> "));
        }
        pb.set_message(verb.to_owned());
        pb
    }

    pub(crate) fn say(&self, line: &str) {
        if !self.quiet {
            eprintln!("{line}");
        }
    }
}

/// Where a download goes: a temporary file renamed into place on success
/// (removed otherwise), or stdout.
enum Sink {
    File {
        file: File,
        tmp: PathBuf,
        dest: PathBuf,
        done: bool,
    },
    Stdout(io::Stdout),
}

impl Sink {
    fn open(dest: Option<&Path>) -> Result<Sink> {
        let Some(dest) = dest else {
            return Ok(Sink::Stdout(io::stdout()));
        };
        let name = dest
            .file_name()
            .ok_or_else(|| usage(format!("{} does not name a file", dest.display())))?;
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let tmp = dir.join(crate::tree::temp_name(name, rand::random()));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io_err(format_args!("creating {}", tmp.display())))?;
        Ok(Sink::File {
            file,
            tmp,
            dest: dest.to_path_buf(),
            done: false,
        })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        match self {
            Sink::File { file, tmp, .. } => file
                .write_all(bytes)
                .map_err(io_err(format_args!("writing {}", tmp.display()))),
            Sink::Stdout(out) => out
                .lock()
                .write_all(bytes)
                .map_err(io_err("writing to stdout")),
        }
    }

    fn finish(mut self) -> Result<()> {
        match &mut self {
            Sink::File {
                file,
                tmp,
                dest,
                done,
            } => {
                file.flush()
                    .map_err(io_err(format_args!("writing {}", tmp.display())))?;
                fs::rename(&*tmp, &*dest).map_err(io_err(format_args!(
                    "renaming {} to {}",
                    tmp.display(),
                    dest.display()
                )))?;
                *done = true;
                Ok(())
            }
            Sink::Stdout(out) => out.lock().flush().map_err(io_err("writing to stdout")),
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Sink::File {
            tmp, done: false, ..
        } = self
        {
            let _ = fs::remove_file(tmp);
        }
    }
}

/// Where `s3dma get` writes: `None` = stdout.
fn download_path(url: &S3Url, file: Option<&Path>) -> Result<Option<PathBuf>> {
    let base = || {
        let b = url.basename();
        if b.is_empty() || b == "." || b == ".." {
            Err(usage(format!(
                "cannot name a local file after {url}; give FILE (or - for stdout)"
            )))
        } else {
            Ok(PathBuf::from(b))
        }
    };
    match file {
        Some(p) if p.as_os_str() == "-" => Ok(None),
        Some(p) if p.is_dir() || p.as_os_str().to_string_lossy().ends_with('/') => {
            Ok(Some(p.join(base()?)))
        }
        Some(p) => Ok(Some(p.to_path_buf())),
        None => base().map(Some),
    }
}

/// `s3dma get`.
pub(crate) async fn get(
    g: &Global,
    url: &str,
    file: Option<&Path>,
    range: Option<&str>,
) -> Result<()> {
    let url = S3Url::parse_object(url).map_err(usage)?;
    let range: Option<ByteRange> = range.map(str::parse).transpose().map_err(usage)?;
    let dest = download_path(&url, file)?;
    let what = format!("get {url}");
    let client = g.connect().await?;
    let info = client
        .head(&url.bucket, &url.key)
        .await
        .map_err(client_err(&what))?;
    let Some((start, len)) = resolve_range(range, info.size) else {
        return Err(Failure::Client {
            what,
            error: s3dma_client::Error::new(
                ErrorKind::InvalidRange,
                "InvalidRange",
                format!(
                    "range {} is not satisfiable for a {}-byte object",
                    range.map(|r| r.to_string()).unwrap_or_default(),
                    info.size
                ),
            ),
        });
    };
    let mut sink = Sink::open(dest.as_deref())?;
    let pb = g.progress(len, "get");
    let plan = chunks(start, len, CHUNK);
    let buf_len = usize::try_from(CHUNK.min(len))
        .map_err(|_| Failure::Other("chunk too large for this machine".into()))?;
    let mut free: Vec<Buffer> = Vec::new();
    for _ in 0..plan.len().min(2) {
        free.push(
            client
                .alloc_labeled(buf_len, "s3dma get")
                .await
                .map_err(client_err(&what))?,
        );
    }
    type Fetch = JoinHandle<(Buffer, std::result::Result<GetOutput, s3dma_client::Error>)>;
    let mut inflight: VecDeque<(Fetch, u64, u64)> = VecDeque::new();
    let mut todo = plan.into_iter();
    let result: Result<()> = async {
        loop {
            while !free.is_empty() {
                let Some((first, n)) = todo.next() else { break };
                let Some(mut buf) = free.pop() else { break };
                let c = client.clone();
                let (bucket, key) = (url.bucket.clone(), url.key.clone());
                let opts = GetOptions {
                    range: Some(ByteRange::Bounded {
                        first,
                        last: first + n - 1,
                    }),
                    length: Some(n),
                    if_match: Some(info.etag.clone()),
                };
                let h = tokio::spawn(async move {
                    let r = c.get_object_into(&bucket, &key, &mut buf, 0, opts).await;
                    (buf, r)
                });
                inflight.push_back((h, first, n));
            }
            let Some((h, first, n)) = inflight.pop_front() else {
                return Ok(());
            };
            let (buf, r) = h
                .await
                .map_err(|e| Failure::Other(format!("{what}: internal error: {e}")))?;
            let out = r.map_err(|mut error| {
                if error.kind == ErrorKind::PreconditionFailed {
                    error.message = format!(
                        "the object changed during the download (it was {} at the start): {}",
                        info.etag, error.message
                    );
                }
                Failure::Client {
                    what: what.clone(),
                    error,
                }
            })?;
            if out.bytes_placed != n {
                return Err(Failure::Other(format!(
                    "{what}: bytes {first}-{} came back as {} bytes, expected {n}",
                    first + n - 1,
                    out.bytes_placed
                )));
            }
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            sink.write(&buf.as_slice()[..n])?;
            pb.inc(n as u64);
            free.push(buf);
        }
    }
    .await;
    pb.finish_and_clear();
    for (h, _, _) in inflight {
        h.abort();
    }
    result?;
    for b in free {
        let _ = b.release().await;
    }
    sink.finish()?;
    if let Some(d) = &dest {
        g.say(&format!("download: {url} to {} ({len} bytes)", d.display()));
    }
    Ok(())
}

/// A `--meta` item that is not `NAME=VALUE`.
#[derive(Debug)]
pub(crate) enum BadMeta {
    /// No `=`.
    NoEquals(String),
    /// `=VALUE`.
    EmptyName(String),
}

impl fmt::Display for BadMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadMeta::NoEquals(item) => write!(f, "--meta {item:?}: expected NAME=VALUE"),
            BadMeta::EmptyName(item) => write!(f, "--meta {item:?}: the name is empty"),
        }
    }
}

impl std::error::Error for BadMeta {}

/// Parses `--meta k=v`.
///
/// # Errors
/// No `=`, or an empty name ([`BadMeta`]).
pub(crate) fn parse_meta(
    items: &[String],
) -> std::result::Result<HashMap<String, String>, BadMeta> {
    let mut out = HashMap::new();
    for item in items {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| BadMeta::NoEquals(item.clone()))?;
        if k.is_empty() {
            return Err(BadMeta::EmptyName(item.clone()));
        }
        out.insert(k.to_ascii_lowercase(), v.to_owned());
    }
    Ok(out)
}

/// Fills `buf[..len]` from `r`, reporting progress; fails if `r` ends early.
fn fill(r: &mut impl io::Read, buf: &mut [u8], pb: &ProgressBar) -> io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        let end = (off + READ_STEP).min(buf.len());
        match r.read(&mut buf[off..end]) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "the file shrank while being read ({off} of {} bytes)",
                        buf.len()
                    ),
                ));
            }
            Ok(n) => {
                off += n;
                pb.inc(n as u64);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `s3dma put`.
pub(crate) async fn put(
    g: &Global,
    file: &Path,
    url: &str,
    content_type: Option<String>,
    meta: &[String],
) -> Result<()> {
    let mut url = S3Url::parse(url).map_err(usage)?;
    let stdin = file.as_os_str() == "-";
    if url.key.is_empty() || url.key.ends_with('/') {
        let name = file.file_name().filter(|_| !stdin).ok_or_else(|| {
            usage(format!(
                "{url} names no object; give a key (s3://bucket/key)"
            ))
        })?;
        url.key.push_str(&name.to_string_lossy());
    }
    let metadata = parse_meta(meta).map_err(usage)?;
    let what = format!("put {url}");
    let shown = file.display();

    // Read the source before connecting: a missing file is not the shim's problem.
    let mut source: Option<(File, u64)> = None;
    let mut piped: Vec<u8> = Vec::new();
    if stdin {
        io::stdin()
            .lock()
            .read_to_end(&mut piped)
            .map_err(io_err("reading stdin"))?;
    } else {
        let f = File::open(file).map_err(io_err(format_args!("opening {shown}")))?;
        let meta = f
            .metadata()
            .map_err(io_err(format_args!("reading {shown}")))?;
        if meta.is_dir() {
            return Err(usage(format!("{shown} is a directory")));
        }
        if meta.is_file() {
            source = Some((f, meta.len()));
        } else {
            // A pipe or device: read it whole.
            let mut f = f;
            f.read_to_end(&mut piped)
                .map_err(io_err(format_args!("reading {shown}")))?;
        }
    }
    let len = source.as_ref().map_or(piped.len() as u64, |s| s.1);
    let len_usize =
        usize::try_from(len).map_err(|_| Failure::Other(format!("{shown} is too large")))?;

    let client = g.connect().await?;
    let mut buf = client
        .alloc_labeled(len_usize.max(1), "s3dma put")
        .await
        .map_err(client_err(&what))?;
    let pb = g.progress(len, "read");
    match source {
        Some((mut f, _)) => fill(&mut f, &mut buf.as_mut_slice()[..len_usize], &pb)
            .map_err(io_err(format_args!("reading {shown}")))?,
        None => buf.as_mut_slice()[..len_usize].copy_from_slice(&piped),
    }
    pb.finish_and_clear();
    drop(piped);
    let opts = PutOptions {
        content_type: content_type.filter(|c| !c.is_empty()),
        metadata,
    };
    let out = client
        .put_object_from(&url.bucket, &url.key, &buf, 0..len_usize, opts)
        .await
        .map_err(client_err(&what))?;
    let _ = buf.release().await;
    g.say(&format!(
        "upload: {} to {url} ({} bytes, etag {}, {})",
        if stdin {
            "stdin".into()
        } else {
            shown.to_string()
        },
        out.size,
        out.etag,
        out.path.as_str()
    ));
    Ok(())
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a Unix time in milliseconds.
#[must_use]
pub(crate) fn format_time(unix_ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let fmt = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    t.format(&fmt).unwrap_or_default()
}

/// One line of `s3dma ls` for an object, as `aws s3 ls` prints it.
#[must_use]
pub(crate) fn ls_object_line(unix_ms: i64, size: u64, name: &str) -> String {
    format!("{} {size:>10} {name}", format_time(unix_ms))
}

/// One line of `s3dma ls` for a common prefix.
#[must_use]
pub(crate) fn ls_prefix_line(name: &str) -> String {
    format!("{:>30} {name}", "PRE")
}

/// `s3dma ls`.
pub(crate) async fn ls(g: &Global, url: &str, recursive: bool) -> Result<()> {
    let url = S3Url::parse(url).map_err(usage)?;
    let what = format!("ls {url}");
    let client = g.connect().await?;
    // Names are shown relative to the "directory" of the prefix, as aws does.
    let strip = if recursive {
        0
    } else {
        url.key.rfind('/').map_or(0, |i| i + 1)
    };
    let mut token = None;
    let mut out = io::stdout().lock();
    loop {
        let page = client
            .list(
                &url.bucket,
                ListOptions {
                    prefix: (!url.key.is_empty()).then(|| url.key.clone()),
                    delimiter: (!recursive).then(|| "/".to_owned()),
                    continuation_token: token.take(),
                    ..ListOptions::default()
                },
            )
            .await
            .map_err(client_err(&what))?;
        for p in &page.common_prefixes {
            let _ = writeln!(out, "{}", ls_prefix_line(p.get(strip..).unwrap_or(p)));
        }
        for o in &page.objects {
            let name = o.key.get(strip..).unwrap_or(&o.key);
            let _ = writeln!(
                out,
                "{}",
                ls_object_line(o.last_modified_unix_ms, o.size, name)
            );
        }
        match page.next_continuation_token {
            Some(t) if page.is_truncated => token = Some(t),
            _ => break,
        }
    }
    out.flush().map_err(io_err("writing to stdout"))
}

/// `s3dma stat`.
pub(crate) async fn stat(g: &Global, url: &str) -> Result<()> {
    let url = S3Url::parse_object(url).map_err(usage)?;
    let client = g.connect().await?;
    let o = client
        .head(&url.bucket, &url.key)
        .await
        .map_err(client_err(format_args!("stat {url}")))?;
    let mut text = format!(
        "{url}\n  size:          {} ({})\n  etag:          {}\n  content type:  {}\n  last modified: {}\n",
        o.size,
        BinaryBytes(o.size),
        o.etag,
        if o.content_type.is_empty() {
            "-"
        } else {
            &o.content_type
        },
        if o.last_modified_unix_ms == 0 {
            "-".to_owned()
        } else {
            format!("{} UTC", format_time(o.last_modified_unix_ms))
        },
    );
    let mut meta: Vec<_> = o.metadata.iter().collect();
    meta.sort();
    if meta.is_empty() {
        text.push_str("  metadata:      -\n");
    }
    for (i, (k, v)) in meta.into_iter().enumerate() {
        let label = if i == 0 { "metadata:" } else { "" };
        text.push_str(&format!("  {label:<14} {k}={v}\n"));
    }
    print!("{text}");
    Ok(())
}

/// `s3dma rm`.
pub(crate) async fn rm(g: &Global, url: &str) -> Result<()> {
    let url = S3Url::parse_object(url).map_err(usage)?;
    let client = g.connect().await?;
    client
        .delete(&url.bucket, &url.key)
        .await
        .map_err(client_err(format_args!("rm {url}")))?;
    g.say(&format!("delete: {url}"));
    Ok(())
}

/// Keys of one DeleteObjects call of `rm -r` (a tenant whose shim allows
/// fewer gets halving batches).
const RM_BATCH: usize = 256;

/// `s3dma rm -r`: every object under the URL's prefix, listed a page at a
/// time and deleted in DeleteObjects batches of up to [`RM_BATCH`] keys.
/// A key that fails is reported and the others go on; the command exits
/// with the first failure's code.
pub(crate) async fn rm_recursive(g: &Global, url: &str) -> Result<()> {
    let url = S3Url::parse(url).map_err(usage)?;
    let client = g.connect().await?;
    let mut token = None;
    let mut batch = RM_BATCH;
    let (mut deleted, mut failures) = (0usize, Vec::new());
    loop {
        let page = client
            .list(
                &url.bucket,
                ListOptions {
                    prefix: (!url.key.is_empty()).then(|| url.key.clone()),
                    continuation_token: token.take(),
                    ..ListOptions::default()
                },
            )
            .await
            .map_err(client_err(format_args!("rm -r {url}")))?;
        let keys: Vec<ObjectKey> = page
            .objects
            .into_iter()
            .map(|o| ObjectKey {
                bucket: url.bucket.clone(),
                key: o.key,
            })
            .collect();
        let mut rest = &keys[..];
        while !rest.is_empty() {
            let n = batch.min(rest.len());
            let results = match client.delete_objects(&rest[..n]).await {
                Ok(r) => r,
                // A shim allowing fewer items per batch: smaller batches.
                Err(e)
                    if e.kind() == ErrorKind::InvalidArgument
                        && e.message().contains("max_batch_items")
                        && n > 1 =>
                {
                    batch = n / 2;
                    continue;
                }
                Err(e) => return Err(client_err(format_args!("rm -r {url}"))(e)),
            };
            for (k, r) in rest[..n].iter().zip(results) {
                let one = S3Url {
                    bucket: k.bucket.clone(),
                    key: k.key.clone(),
                };
                match r {
                    Ok(()) => {
                        deleted += 1;
                        g.say(&format!("delete: {one}"));
                    }
                    Err(error) => {
                        let f = Failure::Client {
                            what: format!("rm {one}"),
                            error,
                        };
                        eprintln!("s3dma: {f}");
                        failures.push(f);
                    }
                }
            }
            rest = &rest[n..];
        }
        match page.next_continuation_token {
            Some(t) if page.is_truncated => token = Some(t),
            _ => break,
        }
    }
    g.say(&format!(
        "rm -r: {deleted} objects deleted, {} failed",
        failures.len()
    ));
    if failures.is_empty() {
        Ok(())
    } else {
        let n = failures.len();
        Err(Failure::Partial {
            failed: n,
            first: Box::new(failures.swap_remove(0)),
        })
    }
}

/// `s3dma info`.
pub(crate) async fn info(g: &Global) -> Result<()> {
    let client = g.connect().await?;
    let i = client.info().await.map_err(client_err("info"))?;
    println!(
        "socket:          {}\ntenant:          {}\nuid/gid:         {}/{}\nbuffers:         {} of {} ({} of {})\nagent connected: {}\nhost-shim:       {}",
        client.socket().display(),
        i.tenant,
        i.uid,
        i.gid,
        i.buffers,
        i.max_buffers,
        BinaryBytes(i.buffer_bytes),
        BinaryBytes(i.max_buffer_bytes),
        if i.agent_connected { "yes" } else { "no" },
        i.version
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_fallback_order() {
        let local = Path::new("/tmp/s3dma-7/shim.sock");
        let system = Path::new("/run/s3dma/shim.sock");
        let env = || Some(PathBuf::from("/x.sock"));
        // $S3DMA_SOCKET wins whatever exists.
        assert_eq!(pick_socket(env(), local, |_| true), Path::new("/x.sock"));
        // The installed shim's socket when it exists.
        assert_eq!(pick_socket(None, local, |_| true), system);
        // Else local mode's, when it exists.
        assert_eq!(pick_socket(None, local, |p| p == local), local);
        // Neither: the installed shim's (named in the error).
        assert_eq!(pick_socket(None, local, |_| false), system);
    }

    #[test]
    fn exit_codes_by_kind() {
        let f = |kind| Failure::Client {
            what: "x".into(),
            error: s3dma_client::Error::new(kind, "C", "m"),
        };
        assert_eq!(f(ErrorKind::NotFound).exit_code(), 3);
        assert_eq!(f(ErrorKind::AccessDenied).exit_code(), 4);
        assert_eq!(f(ErrorKind::Unavailable).exit_code(), 5);
        assert_eq!(f(ErrorKind::PreconditionFailed).exit_code(), 6);
        assert_eq!(f(ErrorKind::InvalidRange).exit_code(), 7);
        assert_eq!(f(ErrorKind::UntrustedShim).exit_code(), 8);
        assert_eq!(f(ErrorKind::Other).exit_code(), 1);
        assert_eq!(Failure::Usage("u".into()).exit_code(), 2);
        assert_eq!(Failure::Other("o".into()).exit_code(), 1);
    }

    #[test]
    fn failure_lines() {
        let mut e = s3dma_client::Error::new(ErrorKind::NotFound, "NoSuchKey", "no such key");
        e.request_id = Some("r-1".into());
        let f = Failure::Client {
            what: "get s3://b/k".into(),
            error: e,
        };
        assert_eq!(
            f.to_string(),
            "get s3://b/k: NoSuchKey: no such key (request id r-1)"
        );
    }

    #[test]
    fn meta_pairs() {
        let m = parse_meta(&["A=1".into(), "b=x=y".into(), "c=".into()]).unwrap();
        assert_eq!(m["a"], "1");
        assert_eq!(m["b"], "x=y");
        assert_eq!(m["c"], "");
        assert!(parse_meta(&["nope".into()]).is_err());
        assert!(parse_meta(&["=v".into()]).is_err());
    }

    #[test]
    fn download_paths() {
        let u = S3Url::parse_object("s3://b/dir/file.bin").unwrap();
        assert_eq!(
            download_path(&u, None).unwrap(),
            Some(PathBuf::from("file.bin"))
        );
        assert_eq!(download_path(&u, Some(Path::new("-"))).unwrap(), None);
        assert_eq!(
            download_path(&u, Some(Path::new("out.bin"))).unwrap(),
            Some(PathBuf::from("out.bin"))
        );
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            download_path(&u, Some(d.path())).unwrap(),
            Some(d.path().join("file.bin"))
        );
        let dir_key = S3Url::parse_object("s3://b/dir/").unwrap();
        assert!(matches!(
            download_path(&dir_key, None),
            Err(Failure::Usage(_))
        ));
    }

    #[test]
    fn listing_lines() {
        assert_eq!(format_time(0), "1970-01-01 00:00:00");
        assert_eq!(format_time(1_700_000_000_123), "2023-11-14 22:13:20");
        assert_eq!(
            ls_object_line(0, 42, "k"),
            "1970-01-01 00:00:00         42 k"
        );
        assert_eq!(ls_prefix_line("d/"), format!("{}PRE d/", " ".repeat(27)));
    }

    #[test]
    fn sink_leaves_nothing_on_error() {
        let d = tempfile::tempdir().unwrap();
        let dest = d.path().join("out");
        {
            let mut s = Sink::open(Some(&dest)).unwrap();
            s.write(b"partial").unwrap();
            // dropped without finish
        }
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 0);
        let mut s = Sink::open(Some(&dest)).unwrap();
        s.write(b"whole").unwrap();
        s.finish().unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"whole");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
    }
}
