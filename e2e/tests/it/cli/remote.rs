//! `s3dma local --target URL --protocol P`: a local mode of dpu-agent and
//! host-shim only, pointed at another server speaking a dialect as the user
//! the AWS variables name. Here the server is another local mode's
//! storage-target (s3dma's dialect on the tcp fabric); the verbs variant
//! (`--protocol hipobj-rc-v2 --fabric verbs`) runs on rxe0 in the RDMA VM.

use std::process::Command;

use super::{Local, S3DMA, ok, pattern, run};

/// The plain-S3 endpoint, access key id and secret a local mode prints in
/// its help (`export AWS_ACCESS_KEY_ID=K AWS_SECRET_ACCESS_KEY=$(cat F)`,
/// `aws --endpoint-url URL ...`).
fn printed_identity(local: &Local) -> (String, String, String) {
    let export = local
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("export AWS_ACCESS_KEY_ID="))
        .unwrap_or_else(|| panic!("no credentials in the help:\n{}", local.stdout));
    let key = export
        .split_whitespace()
        .find_map(|w| w.strip_prefix("AWS_ACCESS_KEY_ID="))
        .unwrap()
        .to_owned();
    let file = export
        .split("$(cat ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap();
    let secret = std::fs::read_to_string(file).unwrap().trim().to_owned();
    let url = local
        .stdout
        .split_whitespace()
        .skip_while(|w| *w != "--endpoint-url")
        .nth(1)
        .unwrap_or_else(|| panic!("no endpoint in the help:\n{}", local.stdout))
        .to_owned();
    (url, key, secret)
}

/// One local mode pointed with `--target --protocol s3dma` at another's
/// storage-target: it starts no storage-target of its own, what its `put`
/// writes is in the other's store byte-exact (read back through the
/// other), its `get` reads it back byte-exact; a dialect it cannot speak
/// on the fabric, no credentials, or s3dma's dialect without the server's
/// fabric key are refused before anything starts.
#[test]
fn local_mode_pointed_at_another_stacks_target() {
    let server_dir = tempfile::tempdir().unwrap();
    let server = Local::start_in(server_dir.path());
    let (url, key, secret) = printed_identity(&server);
    let fabric_key = server_dir.path().join("state/secrets/fabric.key");
    let fabric_key = fabric_key.to_str().unwrap();

    let dir = tempfile::tempdir().unwrap();
    for (args, env, message) in [
        (
            vec!["--protocol", "hipobj-rc-v2"],
            true,
            "--protocol hipobj-rc-v2 needs --fabric verbs",
        ),
        (
            vec!["--protocol", "s3dma", "--fabric-key", fabric_key],
            false,
            "AWS_ACCESS_KEY_ID",
        ),
        (
            vec!["--protocol", "s3dma"],
            true,
            "needs the server's fabric key",
        ),
        (vec!["--protocol", "rdma-v9"], true, "not a dialect"),
    ] {
        let mut cmd = Command::new(&*S3DMA);
        cmd.args(["local", "--target", &url])
            .args(&args)
            .arg("--dir")
            .arg(dir.path().join("refused"))
            .env_remove("AWS_SESSION_TOKEN");
        if env {
            cmd.env("AWS_ACCESS_KEY_ID", &key)
                .env("AWS_SECRET_ACCESS_KEY", &secret);
        } else {
            cmd.env_remove("AWS_ACCESS_KEY_ID")
                .env_remove("AWS_SECRET_ACCESS_KEY");
        }
        let o = run(&mut cmd, None);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} started");
        assert!(err.contains(message), "{args:?}: {err}");
    }

    let local = Local::start_cmd(dir.path(), false, |c| {
        c.args([
            "--target",
            &url,
            "--protocol",
            "s3dma",
            "--fabric-key",
            fabric_key,
        ])
        .env("AWS_ACCESS_KEY_ID", &key)
        .env("AWS_SECRET_ACCESS_KEY", &secret)
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_REGION")
        .env_remove("AWS_DEFAULT_REGION");
    });
    let names: Vec<&str> = local.pids.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["dpu-agent", "host-shim"], "{}", local.stdout);
    assert!(
        local.stdout.contains(&format!("pointed at {url} (s3dma)")),
        "{}",
        local.stdout
    );
    assert!(!local.stdout.contains(&secret), "the secret was printed");

    // Small (one PUT) and above the 64 MiB multipart threshold (parts,
    // each checked by the agent's HEAD after Complete).
    for (name, len) in [("small", 3 << 20), ("large", (80 << 20) + 3)] {
        let data = pattern(len);
        let src = dir.path().join(name);
        std::fs::write(&src, &data).unwrap();
        let at = format!("s3://data/remote/{name}");
        ok(&local.s3dma(&["put", src.to_str().unwrap(), &at]));
        let theirs = server.s3dma(&["get", &at, "-"]);
        assert!(
            theirs.status.success(),
            "{}",
            String::from_utf8_lossy(&theirs.stderr)
        );
        assert!(theirs.stdout == data, "{name}: the server's object differs");
        let ours = local.s3dma(&["get", &at, "-"]);
        assert!(
            ours.status.success(),
            "{}",
            String::from_utf8_lossy(&ours.stderr)
        );
        assert!(ours.stdout == data, "{name}: the object read back differs");
    }
}

/// `--target --protocol hipobj-rc-v2 --fabric verbs` reaches another local
/// mode's storage-target with no config written by hand: its PUTs (one
/// transfer, and parts above the multipart threshold) and GETs byte-exact,
/// the queue pairs on this host-shim's device. Verbs only (rxe0 in the
/// Soft-RoCE VM, `S3DMA_TEST_FABRIC=verbs`): the dialect has no tcp form.
#[test]
fn local_mode_pointed_at_a_hipobj_rc_v2_server_on_verbs() {
    if s3dma_launcher::harness::backend() != s3dma_launcher::Backend::Verbs {
        println!("skipped: hipobj-rc-v2 needs an RDMA device (S3DMA_TEST_FABRIC=verbs)");
        return;
    }
    let server_dir = tempfile::tempdir().unwrap();
    let server = Local::start_cmd(server_dir.path(), false, |c| {
        c.args(["--fabric", "verbs"]);
    });
    let (url, key, secret) = printed_identity(&server);
    let dir = tempfile::tempdir().unwrap();
    let local = Local::start_cmd(dir.path(), false, |c| {
        c.args([
            "--target",
            &url,
            "--protocol",
            "hipobj-rc-v2",
            "--fabric",
            "verbs",
        ])
        .env("AWS_ACCESS_KEY_ID", &key)
        .env("AWS_SECRET_ACCESS_KEY", &secret)
        .env_remove("AWS_SESSION_TOKEN");
    });
    assert!(
        local
            .stdout
            .contains(&format!("pointed at {url} (hipobj-rc-v2)")),
        "{}",
        local.stdout
    );
    for (name, len) in [
        ("one", 1),
        ("small", (1 << 20) + 3),
        ("large", (80 << 20) + 3),
    ] {
        let data = pattern(len);
        let src = dir.path().join(name);
        std::fs::write(&src, &data).unwrap();
        let at = format!("s3://data/hipobj/{name}");
        ok(&local.s3dma(&["put", src.to_str().unwrap(), &at]));
        let theirs = server.s3dma(&["get", &at, "-"]);
        assert!(
            theirs.status.success(),
            "{}",
            String::from_utf8_lossy(&theirs.stderr)
        );
        assert!(theirs.stdout == data, "{name}: the server's object differs");
        let ours = local.s3dma(&["get", &at, "-"]);
        assert!(
            ours.status.success(),
            "{}",
            String::from_utf8_lossy(&ours.stderr)
        );
        assert!(ours.stdout == data, "{name}: the object read back differs");
    }
}
