//! Shim authentication: bearer tokens, and mTLS client certificates (a test
//! CA and leaves made with rcgen).

use super::*;

/// A CA (certificate PEM and issuer).
fn new_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A leaf certificate signed by `ca` for `sans` with common name `cn`:
/// (certificate PEM, key PEM).
fn new_leaf(
    ca: &CertifiedIssuer<'static, KeyPair>,
    sans: &[&str],
    cn: &str,
    eku: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let mut params =
        CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![eku];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A shim over TLS to `addr`, trusting `ca_pem`, with an optional client
/// identity and bearer token.
async fn tls_shim(
    addr: &str,
    ca_pem: &str,
    identity: Option<&(String, String)>,
    token: &str,
) -> Result<Shim, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(Certificate::from_pem(ca_pem));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let ch = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await?;
    Ok(Shim {
        inner: AgentClient::new(ch),
        token: token.to_owned(),
    })
}

/// Connects and calls HeadObject, folding connection errors into a string:
/// a TLS handshake the server refuses may fail at connect or at the first
/// call, depending on timing.
async fn tls_head(
    addr: &str,
    ca_pem: &str,
    identity: Option<&(String, String)>,
    token: &str,
    tenant: &str,
    key: &str,
) -> Result<Result<pb::HeadObjectResponse, Status>, String> {
    let fut = async {
        match tls_shim(addr, ca_pem, identity, token).await {
            Ok(shim) => Ok(head(&shim, tenant, "alice-data", key).await),
            Err(e) => Err(format!("connect: {e:?}")),
        }
    };
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .expect("TLS call hung")
}

// ---------------------------------------------------------------------------
// 2. Shim authentication (bearer tokens)
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shims_authenticate_with_bearer_tokens_and_act_only_for_their_tenants() {
    let target = Target::start(true);
    for b in ["alice-data", "bob-data"] {
        target.create_bucket(b).await;
    }
    let agent = Agent::start(AgentSpec::one(&target));
    let mem = Memory::new(2 << 20).await;
    let body = data(4096, 5);
    mem.fill(0, &body);
    let (_src_w, src) = mem.window(0, body.len(), Access::REMOTE_READ);
    let (_dst_w, dst) = mem.window(1 << 20, 1 << 20, Access::REMOTE_WRITE);

    // No credentials at all: every RPC is refused.
    let anon = agent.client_with("").await;
    assert_unauthenticated(head(&anon, "alice", "alice-data", "k").await, "anon HEAD");
    assert_unauthenticated(
        anon.get("alice", "alice-data", "k", None, &dst).await,
        "anon GET",
    );
    assert_unauthenticated(
        anon.put("alice", "alice-data", "anon-put", &src).await,
        "anon PUT",
    );
    assert_unauthenticated(list(&anon, "alice", "alice-data", "").await, "anon LIST");
    assert_unauthenticated(
        delete(&anon, "alice", "alice-data", "k").await,
        "anon DELETE",
    );
    let batch = pb::GetObjectsRequest {
        tenant: "alice".into(),
        items: vec![pb::GetObjectsItem {
            destination_rails: Vec::new(),
            bucket: "alice-data".into(),
            key: "k".into(),
            range: None,
            destination: dst.clone(),
            if_match: String::new(),
        }],
        concurrency: 0,
    };
    let r = anon
        .inner
        .clone()
        .get_objects(anon.req(batch.clone()))
        .await
        .map(|_| ());
    assert_unauthenticated(r, "anon GetObjects");
    // A non-bearer scheme carrying the real token is not a credential.
    let mut req = tonic::Request::new(pb::HeadObjectRequest {
        tenant: "alice".into(),
        bucket: "alice-data".into(),
        key: "k".into(),
    });
    req.metadata_mut().insert(
        "authorization",
        format!("Basic {SHIM_TOKEN}").parse().unwrap(),
    );
    assert_unauthenticated(anon.inner.clone().head_object(req).await, "Basic <token>");
    let missing = 7.0;

    // Wrong bearer tokens, including near misses of the real one.
    let wrong_tokens = [
        "wrong-token-0123456789abcdef".to_owned(),
        format!("{SHIM_TOKEN}x"),
        SHIM_TOKEN[..SHIM_TOKEN.len() - 1].to_owned(),
        SHIM_TOKEN.to_uppercase(),
    ];
    for t in &wrong_tokens {
        let c = agent.client_with(t).await;
        let e = assert_unauthenticated(head(&c, "alice", "alice-data", "k").await, t);
        assert!(!status_dump(&e).contains(t.as_str()), "{e:?}");
        assert_unauthenticated(c.put("bob", "bob-data", "wrong-token-put", &src).await, t);
    }
    let invalid = 2.0 * wrong_tokens.len() as f64;
    // Refused PUTs never reached the target.
    let sdk = target.s3(ALICE);
    assert!(sdk_keys(&sdk, "alice-data").await.is_empty());
    assert!(sdk_keys(&sdk, "bob-data").await.is_empty());

    // host2 (valid token) is assigned bob only.
    let host2 = agent.client_with(OTHER_SHIM_TOKEN).await;
    let e = assert_denied(
        head(&host2, "alice", "alice-data", "k").await,
        "host2 HEAD for alice",
    );
    assert!(e.message().contains("alice"), "{e:?}");
    assert_denied(
        host2.put("alice", "alice-data", "host2-put", &src).await,
        "host2 PUT for alice",
    );
    assert_denied(
        host2.get("alice", "alice-data", "k", None, &dst).await,
        "host2 GET for alice",
    );
    assert_denied(
        list(&host2, "alice", "alice-data", "").await,
        "host2 LIST for alice",
    );
    // ... and works for bob.
    let put = host2
        .put("bob", "bob-data", "from-host2", &src)
        .await
        .unwrap();
    assert_eq!(put.size, body.len() as u64);
    let got = host2
        .get("bob", "bob-data", "from-host2", None, &dst)
        .await
        .unwrap();
    assert_eq!(got.bytes_placed, body.len() as u64);
    assert_eq!(mem.sha256(1 << 20, body.len()), sha256(&body));
    assert_no_such_key(
        head(&host2, "bob", "bob-data", "nope").await,
        "host2 HEAD bob-data/nope",
    );

    // Tenants nobody assigned, or that do not exist: denied, not unknown.
    let host1 = agent.client().await;
    for t in ["carol", "", "Alice", "alice ", "*"] {
        assert_denied(
            head(&host1, t, "alice-data", "k").await,
            &format!("host1 for tenant {t:?}"),
        );
    }
    let not_assigned = 4.0 + 5.0;
    // host1 works for both of its tenants.
    assert_no_such_key(
        head(&host1, "alice", "alice-data", "k").await,
        "host1 alice",
    );
    assert_no_such_key(head(&host1, "bob", "bob-data", "k").await, "host1 bob");
    // Only the one object host2 wrote for bob exists.
    assert!(sdk_keys(&sdk, "alice-data").await.is_empty());
    assert_eq!(sdk_keys(&sdk, "bob-data").await, vec!["from-host2"]);

    let m = agent.metrics_text().await;
    assert!(m.contains("s3dma_agent_auth_failures_total"), "{m}");
    let v = |reason: &str| {
        metric_value(
            &m,
            "s3dma_agent_auth_failures_total",
            &format!("reason=\"{reason}\""),
        )
    };
    assert_eq!(v("missing"), Some(missing), "{m}");
    assert_eq!(v("invalid"), Some(invalid), "{m}");
    assert_eq!(v("tenant_not_assigned"), Some(not_assigned), "{m}");
    for t in [SHIM_TOKEN, OTHER_SHIM_TOKEN] {
        assert!(!m.contains(t));
        assert!(!agent.output().contains(t));
    }
}

// ---------------------------------------------------------------------------
// 3. mTLS
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_client_certificates_identify_shims() {
    let target = Target::start(true);
    for b in ["alice-data", "bob-data"] {
        target.create_bucket(b).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_secrets(d);

    let ca = new_ca("s3dma test shim CA");
    let ca_pem = ca.pem();
    let server = new_leaf(
        &ca,
        &["localhost", "127.0.0.1"],
        "dpu-agent",
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let client = |name: &str| new_leaf(&ca, &[name], name, ExtendedKeyUsagePurpose::ClientAuth);
    let host3 = client("host3.test");
    let host5 = client("host5.test");
    let stranger = client("host9.test");
    // The right name, but from a CA the agent does not trust.
    let rogue_ca = new_ca("rogue CA");
    let rogue = new_leaf(
        &rogue_ca,
        &["host3.test"],
        "host3.test",
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    std::fs::write(d.join("server.crt"), &server.0).unwrap();
    std::fs::write(d.join("server.key"), &server.1).unwrap();
    std::fs::write(d.join("ca.pem"), &ca_pem).unwrap();

    let dd = d.display();
    let tls = format!(
        "  tls:\n    cert_file: {dd}/server.crt\n    key_file: {dd}/server.key\n    client_ca_file: {dd}/ca.pem\n"
    );
    // host3: certificate only, for alice. host5: certificate and token, for bob.
    let shims = format!(
        "  - name: host3\n    tls_name: host3.test\n    tenants: [alice]\n  \
         - name: host5\n    tls_name: host5.test\n    token_file: {dd}/other-shim.token\n    tenants: [bob]\n"
    );
    let config = d.join("agent.yaml");
    std::fs::write(&config, agent_yaml(d, &tls, &shims, &target.endpoint)).unwrap();
    let agent = OwnAgent::start(&config, d.join("agent.log"));
    let addr = agent.addr.clone();

    // host3's certificate authenticates it: HEAD of a missing key reaches
    // the target.
    let r = tls_head(&addr, &ca_pem, Some(&host3), "", "alice", "nope")
        .await
        .unwrap();
    assert_no_such_key(r, "host3 HEAD");
    // A whole round trip over RDMA through the TLS API.
    let shim3 = tls_shim(&addr, &ca_pem, Some(&host3), "").await.unwrap();
    let mem = Memory::new(2 << 20).await;
    let body = data(70_000, 3);
    mem.fill(0, &body);
    let (_w, src) = mem.window(0, body.len(), Access::REMOTE_READ);
    shim3
        .put("alice", "alice-data", "tls-obj", &src)
        .await
        .unwrap();
    let (_w2, dst) = mem.window(1 << 20, 1 << 20, Access::REMOTE_WRITE);
    let got = shim3
        .get("alice", "alice-data", "tls-obj", None, &dst)
        .await
        .unwrap();
    assert_eq!(got.bytes_placed, body.len() as u64);
    assert_eq!(mem.sha256(1 << 20, body.len()), sha256(&body));
    // host3 is assigned alice only.
    assert_denied(
        head(&shim3, "bob", "bob-data", "nope").await,
        "host3 for bob",
    );

    // A certificate from the trusted CA with another name.
    let r = tls_head(&addr, &ca_pem, Some(&stranger), "", "alice", "nope")
        .await
        .unwrap();
    assert_unauthenticated(r, "host9.test certificate");
    // ... even with a valid token of a shim that needs a certificate too.
    let r = tls_head(
        &addr,
        &ca_pem,
        Some(&stranger),
        OTHER_SHIM_TOKEN,
        "bob",
        "nope",
    )
    .await
    .unwrap();
    assert_unauthenticated(r, "host9.test certificate + host5 token");

    // No certificate and no token.
    let r = tls_head(&addr, &ca_pem, None, "", "alice", "nope")
        .await
        .unwrap();
    assert_unauthenticated(r, "no certificate, no token");

    // host5 needs both its certificate and its token.
    let r = tls_head(&addr, &ca_pem, None, OTHER_SHIM_TOKEN, "bob", "nope")
        .await
        .unwrap();
    assert_unauthenticated(r, "host5 token without certificate");
    let r = tls_head(&addr, &ca_pem, Some(&host5), "", "bob", "nope")
        .await
        .unwrap();
    assert_unauthenticated(r, "host5 certificate without token");
    let r = tls_head(
        &addr,
        &ca_pem,
        Some(&host5),
        "wrong-token-0123456789",
        "bob",
        "nope",
    )
    .await
    .unwrap();
    assert_unauthenticated(r, "host5 certificate with a wrong token");
    let shim5 = tls_shim(&addr, &ca_pem, Some(&host5), OTHER_SHIM_TOKEN)
        .await
        .unwrap();
    let e = assert_no_such_key(
        head(&shim5, "bob", "bob-data", "nope").await,
        "host5 certificate + token",
    );
    assert!(!status_dump(&e).contains(OTHER_SHIM_TOKEN));
    assert_denied(
        head(&shim5, "alice", "alice-data", "nope").await,
        "host5 for alice",
    );

    // A certificate with host3's name from an untrusted CA fails the TLS
    // handshake (at connect or at the first call).
    match tls_head(&addr, &ca_pem, Some(&rogue), "", "alice", "nope").await {
        Err(_) => {}
        Ok(Err(st)) => assert!(
            matches!(
                st.code(),
                Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled
            ) && st.get_details_error_info().is_none(),
            "rogue certificate: {st:?}"
        ),
        Ok(Ok(v)) => panic!("a certificate from an untrusted CA was accepted: {v:?}"),
    }

    // A plaintext HTTP/2 client cannot talk to the TLS port: an error, not a
    // hang.
    let plain = async {
        let ch = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        let shim = Shim {
            inner: AgentClient::new(ch),
            token: String::new(),
        };
        head(&shim, "alice", "alice-data", "nope")
            .await
            .map_err(|e| format!("call: {e:?}"))
    };
    let r = tokio::time::timeout(Duration::from_secs(20), plain)
        .await
        .expect("a plaintext client hung on the TLS port");
    assert!(r.is_err(), "plaintext call succeeded: {r:?}");

    // The agent is still serving authenticated shims.
    assert_no_such_key(
        head(&shim3, "alice", "alice-data", "nope").await,
        "host3 again",
    );
    let log = agent.log();
    assert!(!log.contains(OTHER_SHIM_TOKEN), "{log}");
    assert!(!log.contains(ALICE.1) && !log.contains(BOB.1), "{log}");
}
