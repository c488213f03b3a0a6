//! `s3dma get --recursive`, `put --recursive` and `sync` against `s3dma
//! local` (the whole stack), on real files.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::{Local, S3DMA, fails, ok, pattern};

/// Every regular file under `root` by relative name, with its bytes;
/// symlinks are listed as `-> target`.
fn tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let name = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let ft = e.file_type().unwrap();
            if ft.is_symlink() {
                let t = fs::read_link(&p).unwrap();
                out.insert(name, format!("-> {}", t.display()).into_bytes());
            } else if ft.is_dir() {
                stack.push(p);
            } else {
                out.insert(name, fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The last line of a command's stderr (the summary).
fn summary(o: &std::process::Output) -> String {
    stderr(o).trim_end().lines().last().unwrap_or("").to_owned()
}

/// A model-like directory: nested, an empty file, names with spaces and
/// non-ASCII, a file of several chunks, a symlink (never followed) and a
/// leftover temporary file (never uploaded).
fn make_model(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("config.json", br#"{"layers": 2}"#.to_vec()),
        ("empty", Vec::new()),
        (
            "shards/model-00001.safetensors",
            pattern((3 << 20) + 512 * 1024),
        ),
        ("shards/model-00002.safetensors", pattern(700 * 1024)),
        ("dir with space/ünï 名.txt", "ünicode\n".as_bytes().to_vec()),
        ("deep/a/b/c/d.txt", b"deep".to_vec()),
    ];
    let mut want = BTreeMap::new();
    for (name, data) in files {
        let p = root.join(name);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, &data).unwrap();
        want.insert(name.to_owned(), data);
    }
    std::os::unix::fs::symlink("/etc/hostname", root.join("link-to-etc")).unwrap();
    fs::write(
        root.join(".config.json.s3dma-0123456789abcdef.tmp"),
        b"junk",
    )
    .unwrap();
    want
}

#[test]
fn recursive_put_get_and_sync_both_ways() {
    let local = Local::start();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    let want = make_model(&src);
    let s = |p: &Path| p.to_str().unwrap().to_owned();

    // put -r: the six regular files, the symlink skipped, the temp file unseen.
    let o = local.s3dma(&["put", "-r", &s(&src), "s3://data/models/m1"]);
    ok(&o);
    let line = summary(&o);
    assert!(line.starts_with("put: 6 files, "), "{line}");
    assert!(line.ends_with("; 0 failed, 1 skipped"), "{line}");
    let listed = ok(&local.s3dma(&["ls", "-r", "s3://data/models/m1/"]));
    for name in want.keys() {
        assert!(
            listed.contains(&format!("models/m1/{name}")),
            "{name} not listed:\n{listed}"
        );
    }
    assert!(
        !listed.contains("link-to-etc") && !listed.contains(".tmp"),
        "{listed}"
    );

    // get -r with small chunks: the large shard takes four ranged GETs.
    let dst = work.path().join("dst");
    let o = local.s3dma(&[
        "get",
        "-r",
        "s3://data/models/m1",
        &s(&dst),
        "--chunk-size",
        "1MiB",
        "--concurrency",
        "4",
    ]);
    ok(&o);
    assert!(summary(&o).starts_with("get: 6 files, "), "{}", stderr(&o));
    assert_eq!(tree(&dst), want, "the download differs from the source");
    // mtimes are the objects' LastModified: a sync either way copies nothing.
    let o = local.s3dma(&["sync", "s3://data/models/m1", &s(&dst)]);
    ok(&o);
    assert!(
        summary(&o).starts_with("sync: 0 files, ") && summary(&o).contains("6 up to date"),
        "{}",
        stderr(&o)
    );
    let o = local.s3dma(&["sync", &s(&src), "s3://data/models/m1"]);
    ok(&o);
    assert!(
        summary(&o).starts_with("sync: 0 files, ") && summary(&o).contains("6 up to date"),
        "{}",
        stderr(&o)
    );

    // Change one file's size, add one, remove one; sync up with --delete.
    fs::write(src.join("config.json"), br#"{"layers": 24}"#).unwrap();
    fs::write(src.join("shards/new.bin"), b"new").unwrap();
    fs::remove_file(src.join("deep/a/b/c/d.txt")).unwrap();
    // Keys no local file made: one shadowed by the local symlink, a
    // directory marker. --delete spares both.
    raw_put(&local, &["models/m1/link-to-etc", "models/m1/marker/"]);
    let o = local.s3dma(&["sync", &s(&src), "s3://data/models/m1", "--delete"]);
    ok(&o);
    let line = summary(&o);
    assert!(line.starts_with("sync: 2 files, "), "{line}");
    assert!(line.ends_with("4 up to date, 1 deleted"), "{line}");
    let listed = ok(&local.s3dma(&["ls", "-r", "s3://data/models/m1/"]));
    assert!(
        !listed.contains("d.txt") && listed.contains("shards/new.bin"),
        "{listed}"
    );
    assert!(
        listed.contains("m1/link-to-etc") && listed.contains("m1/marker/"),
        "{listed}"
    );
    for key in ["link-to-etc", "marker/"] {
        ok(&local.s3dma(&["rm", &format!("s3://data/models/m1/{key}")]));
    }

    // Sync down with --delete: local extras go, unless --exclude keeps them.
    fs::write(dst.join("extra.bin"), b"x").unwrap();
    fs::write(dst.join("extra.json"), b"x").unwrap();
    let o = local.s3dma(&[
        "sync",
        "s3://data/models/m1",
        &s(&dst),
        "--delete",
        "--exclude",
        "extra.json",
    ]);
    ok(&o);
    let line = summary(&o);
    assert!(line.starts_with("sync: 2 files, "), "{line}");
    assert!(line.ends_with("4 up to date, 2 deleted"), "{line}");
    let mut now = tree(&src);
    now.remove("link-to-etc");
    now.remove(".config.json.s3dma-0123456789abcdef.tmp");
    now.insert("extra.json".into(), b"x".to_vec());
    assert_eq!(tree(&dst), now);

    // Filters: the last match decides.
    let only = work.path().join("only-json");
    let o = local.s3dma(&[
        "get",
        "-r",
        "s3://data/models/m1/",
        &s(&only),
        "--exclude",
        "*",
        "--include",
        "*.json",
    ]);
    ok(&o);
    assert_eq!(
        tree(&only).keys().collect::<Vec<_>>(),
        ["config.json"],
        "{}",
        stderr(&o)
    );

    // Usage errors.
    let o = local.s3dma(&["sync", &s(&src), &s(&dst)]);
    fails(
        &o,
        2,
        "sync needs one s3://bucket[/prefix] and one directory",
    );
    let o = local.s3dma(&["get", "s3://data/models/m1/config.json", "--include", "*"]);
    fails(&o, 2, "--include/--exclude need --recursive");
    let o = local.s3dma(&["put", "-r", &s(&src.join("config.json")), "s3://data/x/"]);
    fails(&o, 2, "is not a directory");
}

#[test]
fn hostile_keys_stay_inside_and_an_interrupted_sync_resumes() {
    let local = Local::start();
    let work = tempfile::tempdir().unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_owned();

    // Keys that would escape the directory are refused one by one; the
    // rest lands.
    // (The dpu-agent refuses to write such keys; a plain S3 client, as
    // another program of the bucket's owner would, can.)
    // Keys with control characters (an escape sequence, a line break)
    // never become file names.
    raw_put(
        &local,
        &[
            "h/../escape",
            "h/a//b",
            "h/./dot",
            "h/ok/file",
            "h/esc\u{1b}[31mred",
            "h/new\nline",
        ],
    );
    let out = work.path().join("out");
    let o = local.s3dma(&["get", "-r", "s3://data/h", &s(&out)]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("unsafe key").count(), 5 + 1, "{err}");
    assert_eq!(
        err.matches("unsafe key (it contains a control character); not written")
            .count(),
        2,
        "{err}"
    );
    assert!(!err.contains('\u{1b}'), "keys are printed escaped: {err}");
    assert!(err.contains("5 files failed, the first: "), "{err}");
    assert_eq!(tree(&out).keys().collect::<Vec<_>>(), ["ok/file"]);
    assert_eq!(
        fs::read_dir(work.path()).unwrap().count(),
        1,
        "nothing outside the destination"
    );

    // sync --delete past unsafe keys: the safe deletion is made, a local
    // file of an unsafe key's very name (an older client's) is spared,
    // every skipped key is named, and the exit status says not all crossed.
    let mirror = work.path().join("mirror");
    fs::create_dir_all(&mirror).unwrap();
    fs::write(mirror.join("stale"), b"gone").unwrap();
    fs::write(mirror.join("new\nline"), b"an older client's").unwrap();
    let o = local.s3dma(&["sync", "s3://data/h", &s(&mirror), "--delete"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("sync: 1 files, ") && err.contains(", 0 up to date, 1 deleted"),
        "{err}"
    );
    assert!(
        err.contains("sync --delete: deleted what is safe; 5 name(s) could not cross and were skipped: s3://data/h/"),
        "{err}"
    );
    assert_eq!(
        tree(&mirror).keys().collect::<Vec<_>>(),
        ["new\nline", "ok/file"],
        "{err}"
    );
    // The other way: a safe extra key is deleted, the unsafe ones are
    // named and kept.
    raw_put(&local, &["h/extra"]);
    let up = work.path().join("up");
    fs::create_dir_all(up.join("ok")).unwrap();
    fs::write(up.join("ok/file"), b"payload").unwrap();
    let o = local.s3dma(&["sync", &s(&up), "s3://data/h", "--delete"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("; not deleted").count(), 5 + 1, "{err}");
    assert!(err.contains(", 1 deleted"), "{err}");
    assert!(
        err.contains("sync --delete: deleted what is safe; 5 name(s) could not cross"),
        "{err}"
    );
    let listed = ok(&local.s3dma(&["ls", "-r", "s3://data/h/"]));
    assert!(
        !listed.contains("h/extra") && listed.contains("h/a//b"),
        "{listed}"
    );

    // A symlink inside the destination is never written through.
    let linked = work.path().join("linked");
    fs::create_dir_all(&linked).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), linked.join("ok")).unwrap();
    let o = local.s3dma(&[
        "get",
        "-r",
        "s3://data/h/",
        &s(&linked),
        "--exclude",
        "*",
        "--include",
        "ok/*",
    ]);
    fails_with(&o, 1, "refusing to write through the symlink");
    assert_eq!(fs::read_dir(elsewhere.path()).unwrap().count(), 0);

    // An interrupted sync: Ctrl-C leaves finished files and no partial one;
    // the next sync copies only the rest.
    let src = work.path().join("many");
    fs::create_dir_all(&src).unwrap();
    let n = 48;
    for i in 0..n {
        fs::write(src.join(format!("f{i:02}")), pattern((1 << 20) + i)).unwrap();
    }
    ok(&local.s3dma(&["put", "-r", &s(&src), "s3://data/many"]));
    let dst = work.path().join("many-back");
    let mut child = Command::new(&*S3DMA)
        .env("S3DMA_SOCKET", &local.socket)
        .args([
            "sync",
            "s3://data/many",
            &s(&dst),
            "--concurrency",
            "1",
            "--chunk-size",
            "128KiB",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let done = |d: &Path| {
        fs::read_dir(d).map_or(0, |r| {
            r.filter(|e| {
                !e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".tmp")
            })
            .count()
        })
    };
    while done(&dst) < 2 {
        assert!(Instant::now() < deadline, "the sync made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    let kept = tree(&dst);
    assert!(!kept.is_empty() && kept.len() < n, "{} files", kept.len());
    for (name, data) in &kept {
        assert!(!name.ends_with(".tmp"), "a temporary file was left: {name}");
        let i: usize = name[1..].parse().unwrap();
        assert!(*data == pattern((1 << 20) + i), "{name} is not whole");
    }
    let o = local.s3dma(&["sync", "s3://data/many", &s(&dst)]);
    ok(&o);
    let line = summary(&o);
    assert!(
        line.starts_with(&format!("sync: {} files, ", n - kept.len()))
            && line.contains(&format!("{} up to date", kept.len())),
        "{line}"
    );
    assert_eq!(tree(&dst), tree(&src));
}

/// PUTs `keys` (body `payload`) straight to local mode's storage-target
/// with aws-sdk-s3, with the credentials local mode prints.
fn raw_put(local: &Local, keys: &[&str]) {
    let words: Vec<&str> = local.stdout.split_whitespace().collect();
    let after = |word: &str| {
        let i = words
            .iter()
            .position(|w| *w == word)
            .unwrap_or_else(|| panic!("no {word} in:\n{}", local.stdout));
        words[i + 1].trim_end_matches(')').to_owned()
    };
    let key_id = words
        .iter()
        .find_map(|w| w.strip_prefix("AWS_ACCESS_KEY_ID="))
        .unwrap()
        .to_owned();
    let secret = fs::read_to_string(after("AWS_SECRET_ACCESS_KEY=$(cat")).unwrap();
    let endpoint = after("--endpoint-url");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s3 = s3dma_launcher::harness::s3_client(&endpoint, &key_id, secret.trim());
    rt.block_on(async {
        for key in keys {
            s3.put_object()
                .bucket("data")
                .key(*key)
                .body(aws_sdk_s3::primitives::ByteStream::from_static(b"payload"))
                .send()
                .await
                .unwrap_or_else(|e| panic!("{key}: {}", aws_sdk_s3::error::DisplayErrorContext(e)));
        }
    });
}

/// Like `fails`, for a recursive command (its stderr has a line per failed
/// file and a summary).
fn fails_with(o: &std::process::Output, code: i32, message: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert!(err.contains(message), "{err:?} should contain {message:?}");
}
