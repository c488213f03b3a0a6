//! Issue 42 finding 6d: a signed user naming another host's fabric
//! endpoint with made-up keys in many parallel GETs made the target dial
//! (and that host run a handshake) once per request. Now a refused
//! connect puts the (user, endpoint) pair in backoff: that user's next
//! requests naming that endpoint fail at once, with the same reply,
//! without dialing. Counted at a listener in front of the endpoint, not
//! timed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::{self, Raw, Server, create_bucket, data};
use aws_sdk_s3::primitives::ByteStream;
use fabric::{Access, Backend, Domain, Endpoint, FabricKey, Region, Window};

use crate::support::{FABRIC_KEY_HEX as KEY_HEX, fabric_server, served_memory};

fn server() -> Server {
    fabric_server(|key_file| {
        format!(
            "rdma:\n  mode: enabled\n  backend: tcp\n  fabric_key_file: {}\n  connect_timeout_ms: 5000\n",
            key_file
        )
    })
}

/// Registered memory behind a tcp-fabric endpoint with fabric key `key`.
struct Host {
    endpoint: Endpoint,
    mem: Region,
}

impl Host {
    async fn new(key: FabricKey) -> Host {
        let domain = Domain::open(Backend::Tcp).unwrap();
        let (endpoint, mem) = served_memory(&domain, 1 << 20, key).await;
        Host { endpoint, mem }
    }

    fn window(&self) -> Window {
        self.mem
            .window(0, 1 << 20, Access::REMOTE_WRITE, None)
            .unwrap()
    }

    fn token(&self, w: &Window) -> fabric::RdmaToken {
        self.endpoint.token(w).unwrap()
    }
}

/// A TCP listener that counts the connections it accepts and forwards
/// each to `to` (the endpoint behind it, which runs the handshake).
struct Counter {
    port: u16,
    accepted: Arc<AtomicUsize>,
}

impl Counter {
    async fn start(to: std::net::SocketAddr) -> Counter {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut c, &mut up).await;
                    }
                });
            }
        });
        Counter { port, accepted }
    }

    fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

async fn get_as(s: &Server, user: (&str, &str), path: &str, token: &str) -> Raw {
    common::send_signed(
        user,
        "GET",
        &s.url(path),
        &[
            ("x-amz-rdma-token", token),
            ("x-amz-rdma-protocol", "s3dma-v1"),
        ],
        &[],
    )
    .await
}

fn assert_connect_failed(r: &Raw) {
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(
        r.xml("Code").as_deref(),
        Some("RDMATransferFailed"),
        "{}",
        r.text()
    );
    assert!(r.text().contains("could not connect"), "{}", r.text());
}

#[tokio::test]
async fn issue42_a_refused_user_and_endpoint_back_off() {
    const N: usize = 24;
    let s = server();
    create_bucket(&s, "backoff").await;
    s.admin()
        .put_object()
        .bucket("backoff")
        .key("big")
        .body(ByteStream::from(data(1 << 20, 42)))
        .send()
        .await
        .unwrap();

    // A host's endpoint with a key the target does not have (the made-up
    // key is the attacker's: the handshake is refused), behind a counter.
    let stranger = Host::new(FabricKey::random()).await;
    let sw = stranger.window();
    let mut tok = stranger.token(&sw);
    let counter = Counter::start(format!("127.0.0.1:{}", tok.lid).parse().unwrap()).await;
    tok.lid = counter.port;
    let tok = tok.to_string();

    // N parallel GETs from one signed user naming it.
    let mut tasks = Vec::new();
    for _ in 0..N {
        let url = s.url("/backoff/big");
        let tok = tok.clone();
        tasks.push(tokio::spawn(async move {
            common::send_signed(
                common::OTHER,
                "GET",
                &url,
                &[
                    ("x-amz-rdma-token", &tok),
                    ("x-amz-rdma-protocol", "s3dma-v1"),
                ],
                &[],
            )
            .await
        }));
    }
    for t in tasks {
        assert_connect_failed(&t.await.unwrap());
    }
    // Without the backoff every request dialed (N connections or more).
    let dialed = counter.connections();
    assert!(dialed >= 1, "the target never dialed");
    assert!(
        dialed <= 4,
        "{dialed} connections for {N} requests of a refused user"
    );
    // Further requests of that user fail alike, without dialing.
    for _ in 0..4 {
        assert_connect_failed(&get_as(&s, common::OTHER, "/backoff/big", &tok).await);
    }
    assert_eq!(counter.connections(), dialed);

    // Another user naming that endpoint is not held back by the first
    // user's refusals: the target dials for it.
    assert_connect_failed(&get_as(&s, common::ADMIN, "/backoff/big", &tok).await);
    assert!(
        counter.connections() > dialed,
        "the other user was not dialed"
    );

    // And the refused user's requests to a good endpoint are served.
    let good = Host::new(fabric::config::parse_fabric_key(KEY_HEX).unwrap()).await;
    let gw = good.window();
    let r = get_as(
        &s,
        common::OTHER,
        "/backoff/big",
        &good.token(&gw).to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-amz-rdma-reply"), Some("200"));
    let mut got = vec![0; 1 << 20];
    good.mem.read_at(0, &mut got).unwrap();
    assert_eq!(got, data(1 << 20, 42));
}
