//! Secrets never leave the agent (logs, metrics, errors, replies), and
//! configuration errors name the file and the field but never a secret.

use super::*;

// ---------------------------------------------------------------------------
// 4. Secrets never leak
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_appear_in_logs_metrics_errors_or_replies() {
    let mut target = Target::start(true);
    for b in ["alice-data", "bob-data"] {
        target.create_bucket(b).await;
    }
    let mut spec = AgentSpec::one(&target);
    spec.rust_log = "debug,h2=debug,hyper=debug,tonic=debug";
    let agent = Agent::start(spec);
    let shim = agent.client().await;
    let mem = Memory::new(8 << 20).await;
    // Everything a client saw.
    let mut seen: Vec<String> = Vec::new();

    // PUT and GET over RDMA.
    let body = data((2 << 20) + 17, 42);
    mem.fill(0, &body);
    let (w, src) = mem.window(0, body.len(), Access::REMOTE_READ);
    let put = shim
        .put("alice", "alice-data", "leak/obj", &src)
        .await
        .unwrap();
    drop(w);
    assert_eq!(put.path, pb::TransferPath::Rdma as i32);
    seen.push(format!("{put:?}"));
    let (w, dst) = mem.window(4 << 20, 4 << 20, Access::REMOTE_WRITE);
    let got = shim
        .get("alice", "alice-data", "leak/obj", None, &dst)
        .await
        .unwrap();
    assert_eq!(got.path, pb::TransferPath::Rdma as i32);
    assert_eq!(mem.sha256(4 << 20, body.len()), sha256(&body));
    seen.push(format!("{got:?}"));
    let h = head(&shim, "alice", "alice-data", "leak/obj")
        .await
        .unwrap();
    seen.push(format!("{h:?}"));
    let l = list(&shim, "alice", "alice-data", "").await.unwrap();
    seen.push(format!("{l:?}"));

    // A missing key (the target's S3 error text travels back).
    let e = assert_no_such_key(
        shim.get("alice", "alice-data", "leak/missing", None, &dst)
            .await,
        "missing key",
    );
    seen.push(status_dump(&e));
    // A batch with a good, a missing and a denied item.
    let batch = pb::GetObjectsRequest {
        tenant: "alice".into(),
        items: [
            ("alice-data", "leak/obj"),
            ("alice-data", "leak/missing"),
            ("bob-data", "x"),
        ]
        .into_iter()
        .map(|(b, k)| pb::GetObjectsItem {
            destination_rails: Vec::new(),
            bucket: b.into(),
            key: k.into(),
            range: Some(pb::ByteRange {
                kind: Some(pb::byte_range::Kind::Suffix(10)),
            }),
            destination: dst.clone(),
            if_match: String::new(),
        })
        .collect(),
        concurrency: 1,
    };
    let mut stream = shim
        .inner
        .clone()
        .get_objects(shim.req(batch))
        .await
        .unwrap()
        .into_inner();
    let mut codes = Vec::new();
    while let Some(item) = stream.next().await {
        let item = item.unwrap();
        seen.push(format!("{item:?}"));
        codes.push(match item.result.unwrap() {
            pb::get_objects_reply::Result::Ok(_) => "ok".to_owned(),
            pb::get_objects_reply::Result::Error(e) => e.s3_code,
        });
    }
    codes.sort();
    assert_eq!(codes, ["AccessDenied", "NoSuchKey", "ok"]);
    // A denied request and a host that may not act for the tenant.
    let e = assert_denied(
        head(&shim, "bob", "alice-data", "leak/obj").await,
        "bob HEAD alice-data",
    );
    seen.push(status_dump(&e));
    let host2 = agent.client_with(OTHER_SHIM_TOKEN).await;
    let e = assert_denied(
        head(&host2, "alice", "alice-data", "leak/obj").await,
        "host2 for alice",
    );
    seen.push(status_dump(&e));
    // Wrong and missing tokens.
    let near_miss = "shim-token-0123456789abcdeX";
    let bad = agent.client_with(near_miss).await;
    let e = assert_unauthenticated(head(&bad, "alice", "alice-data", "leak/obj").await, "bad");
    seen.push(status_dump(&e));
    let anon = agent.client_with("").await;
    let e = assert_unauthenticated(head(&anon, "alice", "alice-data", "leak/obj").await, "anon");
    seen.push(status_dump(&e));
    // A request the agent rejects as malformed.
    let e = shim
        .get("alice", "alice-data", "leak/obj", None, "not-a-token")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(s3_code(&e), "InvalidArgument");
    seen.push(status_dump(&e));

    // The target dies: connection errors, retries, warnings with target text.
    target.kill9();
    let e = shim
        .get("alice", "alice-data", "leak/obj", None, &dst)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert_eq!(s3_code(&e), "ServiceUnavailable", "{e:?}");
    seen.push(status_dump(&e));
    let e = shim
        .put("alice", "alice-data", "leak/obj2", &src)
        .await
        .unwrap_err();
    seen.push(status_dump(&e));
    drop(w);

    // The log may be coloured: search it without ANSI escapes too, so a
    // secret split by colour codes is still found.
    let raw_output = agent.output();
    let output = strip_ansi(&raw_output);
    let metrics = agent.metrics_text().await;
    // The test can fail: the agent logged at debug level, with request spans.
    assert!(output.contains("DEBUG"), "{output}");
    assert!(output.contains("request{"), "{output}");
    assert!(output.contains(&put.request_id), "{output}");
    assert!(output.contains("WARN"), "{output}");
    assert!(metrics.contains("s3dma_agent_requests_total"), "{metrics}");
    assert!(
        metrics.contains("s3dma_agent_auth_failures_total"),
        "{metrics}"
    );

    let secrets = [
        ("alice's secret access key", ALICE.1.to_owned()),
        ("bob's secret access key", BOB.1.to_owned()),
        ("host1's token", SHIM_TOKEN.to_owned()),
        ("host2's token", OTHER_SHIM_TOKEN.to_owned()),
        ("a presented (wrong) token", near_miss.to_owned()),
        ("the fabric key", FABRIC_KEY_HEX.to_owned()),
        ("the fabric key", FABRIC_KEY_HEX.to_uppercase()),
        (
            "the fabric key's first half",
            FABRIC_KEY_HEX[..32].to_owned(),
        ),
        (
            "the fabric key's second half",
            FABRIC_KEY_HEX[32..].to_owned(),
        ),
    ];
    let places = [
        ("the agent's output", raw_output.as_str()),
        ("the agent's output", output.as_str()),
        ("the agent's metrics", metrics.as_str()),
        ("what clients received", &seen.join("\n")),
    ];
    for (what, secret) in &secrets {
        for (place, text) in &places {
            assert!(
                !text.contains(secret.as_str()),
                "{what} appears in {place}:\n{text}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// 5. Configuration errors
// ---------------------------------------------------------------------------

#[test]
fn configuration_errors_name_file_and_field_never_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_secrets(d);
    let dd = d.display().to_string();
    let shims = format!(
        "  - name: host1\n    token_file: {dd}/shim.token\n    tenants: [alice, bob]\n  \
         - name: host2\n    token_file: {dd}/other-shim.token\n    tenants: [bob]\n"
    );
    let valid = agent_yaml(d, "", &shims, "http://127.0.0.1:9");
    let no_secret = |text: &str| {
        for s in [ALICE.1, BOB.1, SHIM_TOKEN, OTHER_SHIM_TOKEN, FABRIC_KEY_HEX] {
            assert!(!text.contains(s), "a secret appears in:\n{text}");
        }
    };
    let write = |name: &str, text: &str| {
        let p = d.join(name);
        write_private(&p, text);
        p
    };
    let run = |config: &Path, check: bool| {
        let mut args: Vec<&std::ffi::OsStr> = vec!["--config".as_ref(), config.as_os_str()];
        if check {
            args.push("--check".as_ref());
        }
        run_agent_bin(&args)
    };

    // (d) A valid configuration: --check reads everything and exits 0.
    let ok = write("valid.yaml", &valid);
    let (st, out, err) = run(&ok, true);
    assert!(st.success(), "{st:?}\nstdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("configuration is valid"), "{out}");
    assert!(out.contains(&ok.display().to_string()), "{out}");
    no_secret(&out);
    no_secret(&err);

    // Each broken file fails with or without --check, naming the file and
    // the field.
    let cases: Vec<(&str, String, Vec<String>)> = vec![
        (
            "(a) unknown field",
            valid.replace(
                "      max_concurrent_requests: 8",
                "      max_concurent_requests: 8",
            ),
            vec![
                "tenants[0].quotas".into(),
                "unknown field `max_concurent_requests`".into(),
            ],
        ),
        (
            "(a) unknown top-level field",
            valid.clone() + "secrets: {}\n",
            vec!["unknown field `secrets`".into()],
        ),
        (
            "(b) zero concurrency",
            valid.replace(
                "      max_concurrent_requests: 8",
                "      max_concurrent_requests: 0",
            ),
            vec![
                "tenants[0].quotas.max_concurrent_requests".into(),
                "at least 1".into(),
            ],
        ),
        (
            "(c) missing secret file",
            valid.replace(
                &format!("{dd}/bob.secret"),
                &format!("{dd}/missing/bob.secret"),
            ),
            vec![
                "tenants[1].secret_access_key_file".into(),
                format!("{dd}/missing/bob.secret"),
            ],
        ),
        (
            "(c) missing token file",
            valid.replace(
                &format!("{dd}/other-shim.token"),
                &format!("{dd}/nope.token"),
            ),
            vec!["shims[1].token_file".into(), format!("{dd}/nope.token")],
        ),
        (
            "(c) two shims with the same token",
            valid.replace(
                &format!("{dd}/other-shim.token"),
                &format!("{dd}/shim.token"),
            ),
            vec!["shims[1].token_file".into(), "host1".into()],
        ),
        (
            "(c) missing fabric key file",
            valid.replace(&format!("{dd}/fabric.key"), &format!("{dd}/nope.key")),
            vec!["fabric.fabric_key_file".into(), format!("{dd}/nope.key")],
        ),
        (
            "tls_name without listen.tls",
            valid.replace(
                "    tenants: [bob]\n",
                "    tenants: [bob]\n    tls_name: host2.test\n",
            ),
            vec!["shims[1].tls_name".into(), "listen.tls".into()],
        ),
    ];
    for (what, text, wants) in &cases {
        assert_ne!(text, &valid, "{what}: the mutation did not apply");
        let path = write("broken.yaml", text);
        for check in [false, true] {
            let (st, out, err) = run(&path, check);
            assert!(
                !st.success(),
                "{what} (--check {check}): exit {st:?}\nstdout:\n{out}\nstderr:\n{err}"
            );
            assert!(
                err.contains(&path.display().to_string()),
                "{what}: stderr does not name {}:\n{err}",
                path.display()
            );
            for w in wants {
                assert!(
                    err.contains(w.as_str()),
                    "{what}: stderr lacks {w:?}:\n{err}"
                );
            }
            assert!(!out.contains("listening"), "{what}: started:\n{out}");
            no_secret(&out);
            no_secret(&err);
        }
    }

    // Secret files with bad content: the error names the file, never what
    // is in it.
    let bad_tokens = [
        ("short", "short-tok-ABC12"),
        ("with a space", "has a space inside-0123456789"),
    ];
    for (what, content) in bad_tokens {
        let tok = write("bad.token", content);
        let text = valid.replace(
            &format!("{dd}/other-shim.token"),
            &tok.display().to_string(),
        );
        let path = write("badtoken.yaml", &text);
        let (st, out, err) = run(&path, true);
        assert!(!st.success(), "{what}: {out}{err}");
        assert!(err.contains("shims[1].token_file"), "{what}: {err}");
        assert!(err.contains(&tok.display().to_string()), "{what}: {err}");
        assert!(
            !err.contains(content) && !out.contains(content),
            "{what}: {err}"
        );
        no_secret(&err);
    }
    let key = write("bad.key", "zz-not-hex-but-secret-0123456789abcdef0123");
    let text = valid.replace(&format!("{dd}/fabric.key"), &key.display().to_string());
    let path = write("badkey.yaml", &text);
    let (st, out, err) = run(&path, true);
    assert!(!st.success(), "{out}{err}");
    assert!(err.contains("fabric.fabric_key_file"), "{err}");
    assert!(!err.contains("zz-not-hex-but-secret"), "{err}");
    no_secret(&err);
}
