//! Logs cannot be forged (keys and request ids escaped); the agent's
//! request ids are its own.

use super::*;

// ---------------------------------------------------------------------------
// 9. Logs cannot be forged; the agent's request ids are its own
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_client_request_ids_are_logged_escaped_and_never_reused() {
    let target = Target::start(true);
    target.create_bucket("alice-data").await;
    let (dir, shims) = secrets_dir();
    let d = dir.path();
    write_private(
        &d.join("agent.yaml"),
        agent_yaml(d, "", &shims, &target.endpoint),
    );
    let agent = OwnAgent::start_with(
        &d.join("agent.yaml"),
        d.join("agent.log"),
        "debug,h2=info,hyper=info,tower=info",
    );
    let shim = Agent::shim_for(&agent.addr, SHIM_TOKEN).await;
    let mem = Memory::new(1 << 20).await;
    mem.fill(0, b"hello");
    let (_w, src) = mem.window(0, 5, Access::ALL);

    let evil =
        "k\n2030-01-01T00:00:00Z  INFO request{id=FORGED tenant=bob}: done\x1b[31mred\u{202e}";
    // A request id with a tab and a byte that is not UTF-8 (C1 CSI): what
    // an HTTP/2 header value can carry.
    let evil_rid: &[u8] = b"rid\tFORGED\x9b31m";
    let with_rid = |msg: pb::PutObjectRequest, rid: &[u8]| {
        let mut r = shim.req(msg);
        let mut h = std::mem::take(r.metadata_mut()).into_headers();
        h.insert("x-request-id", http::HeaderValue::from_bytes(rid).unwrap());
        *r.metadata_mut() = tonic::metadata::MetadataMap::from_headers(h);
        r
    };
    let put = |key: &str| pb::PutObjectRequest {
        source_rails: Vec::new(),
        tenant: "alice".into(),
        bucket: "alice-data".into(),
        key: key.into(),
        source: src.clone(),
        content_type: String::new(),
        metadata: [("origin".to_owned(), "v".to_owned())].into(),
    };
    let ok = shim
        .inner
        .clone()
        .put_object(with_rid(put(evil), evil_rid))
        .await
        .unwrap()
        .into_inner();
    // A sane client id is not reused either.
    let ok2 = shim
        .inner
        .clone()
        .put_object(with_rid(put("plain"), b"shim-chosen-id-42"))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(ok2.request_id, "shim-chosen-id-42");
    assert_eq!(ok2.request_id.len(), 32, "{}", ok2.request_id);
    // A denied request quotes the key in its error (logged at debug).
    let denied = shim
        .inner
        .clone()
        .put_object(with_rid(
            pb::PutObjectRequest {
                bucket: "bob-data".into(),
                ..put(evil)
            },
            evil_rid,
        ))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    // So is a metadata name that is no header name.
    let bad_name = shim
        .inner
        .clone()
        .put_object(with_rid(
            pb::PutObjectRequest {
                metadata: [("n\x1b[2Jame\nX".to_owned(), "v".to_owned())].into(),
                ..put("plain")
            },
            evil_rid,
        ))
        .await
        .unwrap_err();
    assert_eq!(bad_name.code(), Code::InvalidArgument, "{bad_name:?}");
    let info = denied.get_details_error_info().unwrap();
    let denied_rid = info.metadata["request_id"].clone();
    assert_eq!(denied_rid.len(), 32, "{denied_rid}");

    let raw = agent.log();
    let log = strip_ansi(&raw);
    // Logged, escaped: no control character but the line ends.
    assert!(log.contains("k\\n2030-01-01T00:00:00Z"), "{log}");
    assert!(log.contains("\\u{1b}[31mred\\u{202e}"), "{log}");
    for (i, c) in log.chars().enumerate() {
        assert!(
            c == '\n' || !(c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c)),
            "raw {c:?} at {i} in the agent log:\n{log}"
        );
    }
    assert!(
        !log.lines().any(|l| l.starts_with("2030-01-01")),
        "a forged line:\n{log}"
    );
    // The client's id is a separate, escaped field; the agent's own id is
    // the span's id and what the reply carries.
    assert!(
        log.contains("client_request_id=rid\\x09FORGED\\x9b31m"),
        "{log}"
    );
    assert!(log.contains("client_request_id=shim-chosen-id-42"), "{log}");
    for rid in [&ok.request_id, &ok2.request_id, &denied_rid] {
        assert!(
            log.contains(&format!("request{{id={rid} ")),
            "{rid}:\n{log}"
        );
    }
    assert!(!log.contains("request{id=shim-chosen-id-42"), "{log}");
    // The target saw the agent's id, never the client's.
    let tlog = strip_ansi(&target.log());
    assert!(!tlog.contains("shim-chosen-id-42"), "{tlog}");
}
