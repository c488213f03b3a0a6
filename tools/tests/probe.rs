//! `s3dma-tools probe` against real servers: a storage-target (every reply
//! rule kept; hipobj-rc-v2 spoken on verbs, where the probe also moves a
//! test object both ways on a queue pair of its own) and moto, a plain S3
//! server that ignores RDMA tokens (the probe reports what it broke).

use std::process::{Command, Output, Stdio};

use s3dma_launcher::harness::{self, ALICE, Moto, Target};

mod common;
use common::S3DMA_TOOLS;

fn probe(endpoint: &str, (ak, sk): (&str, &str), extra: &[&str]) -> (Output, String) {
    let out = Command::new(S3DMA_TOOLS)
        .args(["probe", "--endpoint", endpoint, "--bucket", "probe"])
        .args(extra)
        .env("AWS_ACCESS_KEY_ID", ak)
        .env("AWS_SECRET_ACCESS_KEY", sk)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out, text)
}

/// The reply rules on a storage-target: HTTP round trip, a HEAD with a
/// token reports the length, a cuObject token declined with 501 (GET
/// served over HTTP, PUT storing nothing), hipobj-rc-v2 not spoken on tcp
/// and, on verbs, a GET and a PUT transfer with bytes compared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_reports_a_storage_targets_dialects() {
    common::check_binaries();
    let target = Target::start(true);
    target.create_bucket("probe").await;
    let verbs = harness::backend() == s3dma_launcher::Backend::Verbs;
    let fabric = if verbs { "verbs" } else { "tcp" };
    let (out, text) = probe(&target.endpoint, ALICE, &["--fabric", fabric]);
    assert!(out.status.success(), "{text}");
    for line in [
        "ok      HTTP: PUT and GET of the test object, bytes compared",
        "ok      HEAD with a token: Content-Length 1048579",
        "ok      cuObject (DC) GET: declined (",
        "x-amz-rdma-reply: 501",
        "ok      cuObject (DC) PUT: declined (",
        "nothing stored",
        "probe   done: no rule broken",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    if verbs {
        for op in ["GET", "PUT"] {
            let want = format!("ok      hipobj-rc-v2: {op} of 1048579 bytes by RDMA");
            assert!(text.contains(&want), "missing {want:?} in:\n{text}");
        }
    } else {
        assert!(
            text.contains(
                "info    hipobj-rc-v2: not spoken (501, x-amz-rdma-protocol-status: unsupported)"
            ),
            "{text}"
        );
    }
    assert!(!text.contains("BROKEN"), "{text}");
    println!("{text}");
}

/// moto ignores `x-amz-rdma-token`: the probe says so, and reports the
/// empty object a tokened PUT left as a broken rule (exit 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_reports_what_a_plain_s3_server_breaks() {
    let moto = Moto::start();
    let (out, text) = probe(&moto.endpoint, ("testing", "testing"), &[]);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("ok      HTTP: PUT and GET"), "{text}");
    assert!(
        text.contains("info    cuObject (DC) GET: the token is ignored (no x-amz-rdma-reply)"),
        "{text}"
    );
    assert!(
        text.contains("BROKEN  cuObject (DC) PUT:") && text.contains("an object was stored"),
        "{text}"
    );
    assert!(
        text.contains("the server broke 1 rule(s): cuObject (DC) PUT"),
        "{text}"
    );
}
