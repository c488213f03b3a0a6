//! A real stack from the workspace's binaries: storage-target, dpu-agent
//! and host-shim started, the bucket created with aws-sdk-s3, a restart in
//! the same directory (secrets and bucket kept), and a clean stop.
//!
//! The three service binaries must be built (`cargo build --bins`;
//! `cargo test --workspace` does it); they are found in the target
//! directory above this test binary.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use s3dma_launcher::{Stack, StackOptions};

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

fn s3(stack: &Stack) -> aws_sdk_s3::Client {
    let (key, secret) = stack.credentials();
    s3dma_testkit::s3_client(&stack.endpoints().target_url, key, secret)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_creates_the_bucket_restarts_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = StackOptions::new(
        dir.path().join("state"),
        dir.path().join("run").join("shim.sock"),
        "launcher test",
    );
    opts.bucket = "launched".into();
    opts.metrics = true;

    let mut stack = Stack::prepare(opts.clone()).unwrap();
    let first_key = stack.credentials().0.to_owned();
    if let Err(e) = stack.start().await {
        stack.stop().await;
        panic!("{e}");
    }
    let ep = stack.endpoints().clone();
    assert!(ep.target_url.starts_with("http://127.0.0.1:"), "{ep:?}");
    assert!(ep.agent_addr.starts_with("127.0.0.1:"), "{ep:?}");
    for m in [&ep.target_metrics, &ep.agent_metrics, &ep.shim_metrics] {
        assert!(
            m.as_deref().is_some_and(|a| a.starts_with("127.0.0.1:")),
            "{ep:?}"
        );
    }
    assert_eq!(stack.services().len(), 3);
    assert!(std::os::unix::net::UnixStream::connect(&ep.socket).is_ok());

    // The bucket exists; an object goes in and out over plain S3.
    let c = s3(&stack);
    c.head_bucket().bucket("launched").send().await.unwrap();
    s3dma_testkit::put_as(&c, "launched", "k", b"kept".to_vec()).await;

    // Everything it wrote is private.
    let l = stack.layout().clone();
    for d in [
        &l.dir,
        &l.secrets_dir,
        &l.logs_dir,
        &l.data_dir,
        &dir.path().join("run"),
    ] {
        assert_eq!(mode(d), 0o700, "{}", d.display());
    }
    for f in [
        &l.target_config,
        &l.agent_config,
        &l.shim_config,
        &l.fabric_key_file,
    ] {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    for s in stack.services() {
        assert_eq!(mode(&s.log), 0o600, "{}", s.log.display());
    }

    // A second launcher on the same directory is refused while it runs.
    let e = Stack::prepare(opts.clone()).unwrap_err().to_string();
    assert!(e.contains("another s3dma local is using"), "{e}");

    stack.stop().await;
    assert!(!ep.socket.exists());
    drop(stack);

    // Restarted in the same directory: same secrets, the bucket (already
    // ours) and its object kept.
    let mut stack = Stack::prepare(opts).unwrap();
    assert_eq!(stack.credentials().0, first_key);
    if let Err(e) = stack.start().await {
        stack.stop().await;
        panic!("{e}");
    }
    let got = s3dma_testkit::get_as(&s3(&stack), "launched", "k")
        .await
        .expect("the object kept across the restart");
    assert_eq!(&got[..], b"kept");
    stack.stop().await;
}
