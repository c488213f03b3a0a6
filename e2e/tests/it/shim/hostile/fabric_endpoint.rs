//! Regressions of issue 30 on the shim's fabric endpoint, against real
//! processes:
//!
//! 3. a peer without the fabric key that a storage target dials (the token
//!    of a signed GET names it) relays the handshake to the shim's fabric
//!    port: both ends refuse it; authenticated connections that stay idle
//!    are closed;
//! 6. connections to the fabric port are capped per peer address and in
//!    all: the ones past a cap are closed at once, and the shim's
//!    descriptors stay bounded while tenants keep working.

use std::time::Duration;

use super::*;

/// The shim's fabric endpoint: its one listening TCP socket that is not
/// its metrics port.
fn shim_fabric_addr(stack: &Stack) -> SocketAddr {
    let shim = Proc {
        name: "host-shim",
        pid: stack.shim.pid().unwrap(),
    };
    let metrics = addr_of(&stack.shim.metrics);
    let socks: Vec<SocketAddr> = shim
        .listening()
        .into_iter()
        .filter(|a| *a != metrics)
        .collect();
    assert_eq!(socks.len(), 1, "the shim's fabric listener: {socks:?}");
    socks[0]
}

/// Issue 30 finding 3: alice (no fabric key) hands the storage target a
/// signed GET whose token names her own relay; the relay forwards the
/// target's handshake to the shim's fabric port, to keep an authenticated
/// connection on which the shim would answer her READs and WRITEs. The
/// target refuses the shim's proof (made by another endpoint than the one
/// dialled), the shim never accepts the relayed connection, and a
/// requester proof made for the relay's address is refused by the shim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_relayed_from_a_target_to_the_shim_is_refused() {
    let stack = Stack::start().await;
    let fabric = shim_fabric_addr(&stack);
    let s3 = stack.target.s3(ALICE);
    put_as(&s3, "alice-data", "relayed", data(4096, 5)).await;
    // A relay without the fabric key: every connection to it is forwarded
    // to the shim's fabric port; what the shim sends back is recorded.
    let relay = s3dma_testkit::fabric_peer::Relay::start(fabric).await;
    let relay_ep = fabric::EndpointAddr {
        addr: relay.addr,
        responder: 1,
    };
    let tok = RdmaToken::new(
        relay_ep,
        fabric::RemoteBuf {
            addr: 0x7f00_0000_0000,
            len: 4096,
            rkey: 0x1234,
        },
    )
    .unwrap();
    let signer = Signer::alice(&stack.target.endpoint);
    let r = http(
        addr_of(&stack.target.endpoint),
        &signer.sign(&Req::new("GET", "/alice-data/relayed").token(tok.to_string())),
    )
    .await;
    assert_ne!(r.status, 200, "{}", r.text());
    let seen = relay.from_upstream.lock().unwrap().clone();
    // The target dialled the relay and the relay reached the shim...
    assert!(
        seen.iter().any(|b| b.len() >= Challenge::LEN),
        "the relay never carried a challenge: {seen:?}"
    );
    // ...which never accepted the relayed handshake.
    for b in &seen {
        let verdict = b
            .get(Challenge::LEN..Challenge::LEN + Verdict::LEN)
            .map(Verdict::decode);
        assert_ne!(
            verdict,
            Some(Ok(Verdict::Accepted)),
            "the shim accepted a relayed handshake"
        );
    }
    // A requester that went ahead with a proof for the relay's address,
    // relayed to the shim: refused as made for another endpoint.
    let key = agent::fabric_key();
    let (_s, hello, c, v) = s3dma_testkit::fabric_peer::handshake(
        relay_ep,
        s3dma_testkit::fabric_peer::Proof::Key(&key),
        (VERSION, VERSION),
    )
    .await;
    assert!(!key.verify_responder(&hello, &c));
    assert_eq!(v, Verdict::WrongResponder);
    // Tenants' transfers still work.
    let c = stack.client().await;
    let mut dst = c.alloc(4096).await.unwrap();
    c.get_object_into("alice-data", "relayed", &mut dst, 0, GetOptions::default())
        .await
        .unwrap();
    assert_eq!(dst.as_slice(), &data(4096, 5)[..]);

    // Issue 30 finding 6: the fabric endpoint's connection cap counts in the
    // shim's descriptor budget: with the default `fabric.max_connections`
    // (1024) the tenants' caps and the reserve no longer fit 2048
    // descriptors, and the shim refuses to start, naming the field.
    let text = std::fs::read_to_string(&stack.shim.config).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = text.replace(
        &format!("path: {}/shim.sock", stack.dir.path().display()),
        &format!("path: {}/shim.sock", dir.path().display()),
    );
    let file = dir.path().join("shim.yaml");
    std::fs::write(&file, cfg).unwrap();
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 2048 && exec \"$0\" --config \"$1\"")
        .arg(agent::bin_dir().join("host-shim"))
        .arg(&file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = guard("the shim to refuse its fd budget", child.wait_with_output())
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("fabric.max_connections") && err.contains("RLIMIT_NOFILE is 2048"),
        "{err}"
    );
}

/// Issue 30 findings 3 and 6: connections to the shim's fabric port past
/// `fabric.max_connections_per_address` are closed at once (hundreds from
/// two addresses leave the shim's descriptors bounded by the cap, and the
/// tenant and the target keep working); an authenticated connection that
/// stays idle for `fabric.idle_timeout_secs` is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fabric_connections_are_capped_and_idle_ones_closed() {
    const CAP: usize = 8;
    const ATTEMPTS: usize = 100;
    let stack = Stack::start_opts(
        |_| {},
        ShimOpts {
            fabric_yaml: format!(
                "max_connections: 64\nmax_connections_per_address: {CAP}\nidle_timeout_secs: 2\nhandshake_timeout_secs: 600"
            ),
            ..Default::default()
        },
    )
    .await;
    let fabric = shim_fabric_addr(&stack);
    let pid = stack.shim.pid().unwrap();
    let fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let c = stack.client().await;
    let before = fds();
    // Silent connections (the handshake deadline is far) from two
    // addresses other than the target's and the agent's.
    let mut held = Vec::new();
    let mut closed = 0;
    for ip in ["127.0.0.2", "127.0.0.3"] {
        for _ in 0..ATTEMPTS {
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.bind(format!("{ip}:0").parse().unwrap()).unwrap();
            let Ok(s) = sock.connect(fabric).await else {
                closed += 1;
                continue;
            };
            held.push(s);
        }
    }
    // The shim has taken them all from its backlog once a later connection
    // is served; the ones past the cap are closed by then, unasked.
    let (s, v) = fabric_connect(fabric, 1, Some(&agent::fabric_key()), (VERSION, VERSION)).await;
    assert_eq!(v, Verdict::Accepted);
    drop(s);
    let mut open = 0;
    for s in &mut held {
        let mut b = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(200), s.read(&mut b)).await {
            Ok(Ok(0) | Err(_)) => closed += 1,
            Ok(Ok(n)) => panic!("the shim sent {n} bytes before a hello"),
            Err(_) => open += 1,
        }
    }
    println!(
        "hostile: fabric caps: {open} held, {closed} closed, fds {before} -> {}",
        fds()
    );
    assert!(open <= 2 * CAP, "{open} connections held past the caps");
    assert!(closed >= 2 * (ATTEMPTS - CAP), "only {closed} closed");
    assert!(
        fds() <= before + 2 * CAP + 8,
        "the shim's descriptors grew from {before} to {}",
        fds()
    );
    // The tenant registers buffers and the target reaches the shim.
    let len = 64 << 10;
    let payload = data(len, 9);
    let mut src = c.alloc(len).await.unwrap();
    src.as_mut_slice().copy_from_slice(&payload);
    c.put_object_from("alice-data", "capped", &src, 0..len, PutOptions::default())
        .await
        .unwrap();
    let mut dst = c.alloc(len).await.unwrap();
    c.get_object_into("alice-data", "capped", &mut dst, 0, GetOptions::default())
        .await
        .unwrap();
    assert_eq!(dst.as_slice(), &payload[..]);
    drop(held);
    // An authenticated connection that sends nothing is closed.
    let (mut s, v) =
        fabric_connect(fabric, 1, Some(&agent::fabric_key()), (VERSION, VERSION)).await;
    assert_eq!(v, Verdict::Accepted);
    let mut b = [0u8; 16];
    let n = guard("the idle fabric connection to close", s.read(&mut b)).await;
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    assert!(
        stack
            .shim
            .log()
            .contains("closing an idle fabric connection"),
        "{}",
        stack.shim.log()
    );
}
