//! Metrics behind a bearer token and on a Unix socket.

use super::*;

// ---------------------------------------------------------------------------
// 10. Metrics behind a token and on a Unix socket
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_the_token_and_are_served_on_the_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_secrets(d);
    let token = "metrics-token-0123456789abcdef";
    write_private(&d.join("metrics.token"), format!("{token}\n"));
    let dd = d.display().to_string();
    let shims =
        format!("  - name: host1\n    token_file: {dd}/shim.token\n    tenants: [alice, bob]\n");
    let sock = d.join("metrics.sock");
    let yaml = agent_yaml(d, "", &shims, "http://127.0.0.1:9")
        + &format!(
            "  unix_socket: {}\n  bearer_token_file: {dd}/metrics.token\n",
            sock.display()
        );
    let agent = OwnAgent::start_from(d, "agent", &yaml);
    assert!(
        agent.metrics.contains(&format!("unix:{}", sock.display())),
        "{}",
        agent.metrics
    );
    let tcp = agent.metrics.split(' ').next().unwrap().to_owned();
    let unix = format!("unix:{}", sock.display());
    // A failed call, so there is a tenant-free metric to see.
    let anon = Agent::shim_for(&agent.addr, "").await;
    let _ = head(&anon, "alice", "alice-data", "k").await;
    for at in [&tcp, &unix] {
        let (code, body) = scrape(at, None);
        assert_eq!(code, 401, "{at}: {body}");
        assert!(!body.contains("s3dma_agent"), "{body}");
        let (code, _) = scrape(at, Some("wrong-token-0123456789abcdef"));
        assert_eq!(code, 401, "{at}");
        let (code, body) = scrape(at, Some(token));
        assert_eq!(code, 200, "{at}: {body}");
        assert!(
            body.contains("s3dma_agent_auth_failures_total"),
            "{at}: {body}"
        );
    }
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(!agent.log().contains(token));
}
