//! Phase 1, anyone who reaches a socket: every listening socket of the
//! three processes (found in `/proc`) and the shim's Unix socket get many
//! connections of seeded random bytes, truncated and mutated real
//! transcripts ([`super::transcripts`]), stalls, drips, mid-frame closes and
//! resets, and one flood each.

use super::*;

// ---------------------------------------------------------------------------
// The socket fuzzer.

#[derive(Debug, Clone)]
pub(super) enum Dest {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Proto {
    S3,
    Metrics,
    AgentGrpc,
    ShimSocket,
    Fabric,
}

#[derive(Debug, Clone)]
pub(super) struct Listener {
    pub(super) name: String,
    pub(super) dest: Dest,
    pub(super) proto: Proto,
    /// Real client → server byte streams to cut and mutate.
    pub(super) transcripts: Vec<Vec<u8>>,
}

pub(super) enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    pub(super) async fn open(d: &Dest) -> Option<Conn> {
        match d {
            Dest::Tcp(a) => TcpStream::connect(a).await.ok().map(Conn::Tcp),
            Dest::Unix(p) => UnixStream::connect(p).await.ok().map(Conn::Unix),
        }
    }

    /// Writes, ignoring errors (the server may have closed already).
    pub(super) async fn send(&mut self, b: &[u8]) -> bool {
        let r = match self {
            Conn::Tcp(s) => s.write_all(b).await,
            Conn::Unix(s) => s.write_all(b).await,
        };
        r.is_ok()
    }

    /// Reads whatever comes for a moment (until EOF, an error or `wait`).
    pub(super) async fn drain(&mut self, wait: Duration) -> usize {
        let mut total = 0;
        let mut b = [0u8; 16384];
        let _ = tokio::time::timeout(wait, async {
            loop {
                let r = match self {
                    Conn::Tcp(s) => s.read(&mut b).await,
                    Conn::Unix(s) => s.read(&mut b).await,
                };
                match r {
                    Ok(0) | Err(_) => break,
                    Ok(n) => total += n,
                }
            }
        })
        .await;
        total
    }

    /// Whether the server closes the connection (EOF or an error) within
    /// [`HANG_GUARD`], reading and discarding what it sends meanwhile.
    pub(super) async fn closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 4096];
        tokio::time::timeout(HANG_GUARD, async {
            loop {
                let r = match self {
                    Conn::Tcp(s) => s.read(&mut b).await,
                    Conn::Unix(s) => s.read(&mut b).await,
                };
                if matches!(r, Ok(0) | Err(_)) {
                    break;
                }
            }
        })
        .await
        .is_ok()
    }

    /// Closes with a TCP reset where that exists.
    pub(super) fn reset(self) {
        if let Conn::Tcp(s) = &self {
            let _ = s.set_zero_linger();
        }
    }
}

pub(super) fn random_bytes(rng: &mut StdRng, max: usize) -> Vec<u8> {
    let mut b = vec![0u8; rng.random_range(1..=max)];
    rng.fill(&mut b[..]);
    b
}

pub(super) fn mutate(rng: &mut StdRng, t: &[u8]) -> Vec<u8> {
    let mut m = t.to_vec();
    if m.is_empty() {
        return random_bytes(rng, 64);
    }
    for _ in 0..rng.random_range(1..=8) {
        match rng.random_range(0..4) {
            0 | 1 => {
                let i = rng.random_range(0..m.len());
                m[i] = rng.random();
            }
            2 => {
                let i = rng.random_range(0..m.len());
                let n = rng.random_range(1..=16).min(m.len() - i);
                m.drain(i..i + n);
                if m.is_empty() {
                    m.push(rng.random());
                }
            }
            _ => {
                let i = rng.random_range(0..=m.len());
                let junk = random_bytes(rng, 16);
                m.splice(i..i, junk);
            }
        }
    }
    m
}

/// Stalled connections kept open until the end of the fuzz phase, per
/// listener at most this many.
pub(super) const MAX_STALLED: usize = 6;

/// One hostile connection to `l`, chosen by `rng`.
pub(super) async fn hostile_connection(l: &Listener, rng: &mut StdRng, stalled: &Mutex<Vec<Conn>>) {
    let Some(mut c) = Conn::open(&l.dest).await else {
        return;
    };
    let t = &l.transcripts[rng.random_range(0..l.transcripts.len())];
    let cut = rng.random_range(0..=t.len());
    let brief = Duration::from_millis(200);
    let stall = |c: Conn| {
        let mut s = stalled.lock().unwrap();
        if s.len() < MAX_STALLED {
            s.push(c);
        }
    };
    let cases = if matches!(l.proto, Proto::Fabric | Proto::ShimSocket) {
        10
    } else {
        8
    };
    match rng.random_range(0..cases) {
        // Random bytes, then close.
        0 => {
            c.send(&random_bytes(rng, 4096)).await;
            c.drain(brief).await;
        }
        // A truncated real exchange, closed mid-frame.
        1 => {
            c.send(&t[..cut]).await;
        }
        // A truncated real exchange, then silence.
        2 => {
            c.send(&t[..cut]).await;
            stall(c);
        }
        // A mutated real exchange; read what comes back.
        3 => {
            c.send(&mutate(rng, t)).await;
            c.drain(brief).await;
        }
        // Connect and say nothing.
        4 => stall(c),
        // A truncated exchange, then a reset.
        5 => {
            c.send(&t[..cut]).await;
            c.reset();
        }
        // A whole exchange followed by garbage.
        6 => {
            c.send(t).await;
            c.send(&random_bytes(rng, 2048)).await;
            c.drain(brief).await;
        }
        // A drip: the prefix in tiny pieces, then close.
        7 => {
            let mut at = 0;
            while at < cut {
                let n = rng.random_range(1..=7).min(cut - at);
                if !c.send(&t[at..at + n]).await {
                    break;
                }
                at += n;
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..3))).await;
            }
        }
        // Protocol-aware: garbage after a good start.
        _ => match l.proto {
            Proto::Fabric => {
                drop(c);
                let Dest::Tcp(a) = l.dest else { unreachable!() };
                let (mut s, v) =
                    fabric_connect(a, 1, Some(&agent::fabric_key()), (VERSION, VERSION)).await;
                assert_eq!(v, Verdict::Accepted);
                // Operation frames with random fields (random opcodes,
                // rkeys, addresses, lengths), partly with payloads.
                for _ in 0..rng.random_range(1..40) {
                    let mut h = RequestHeader::whole(
                        if rng.random() {
                            OpKind::Write
                        } else {
                            OpKind::Read
                        },
                        rng.random(),
                        rng.random(),
                        rng.random::<u64>() >> 1,
                        rng.random_range(0..4096),
                    )
                    .encode();
                    if rng.random_range(0..10) == 0 {
                        rng.fill(&mut h[..]);
                    }
                    if s.write_all(&h).await.is_err() {
                        break;
                    }
                    if rng.random() {
                        let _ = s.write_all(&random_bytes(rng, 4096)).await;
                    }
                }
                let mut c = Conn::Tcp(s);
                if rng.random() {
                    c.drain(brief).await;
                } else {
                    stall(c);
                }
            }
            Proto::ShimSocket => {
                // A lease whose frames go wrong.
                c.send(&s3dma_proto::lease::MAGIC).await;
                for _ in 0..rng.random_range(0..4) {
                    c.send(&s3dma_proto::lease::FdRequest { seq: rng.random() }.encode())
                        .await;
                }
                c.send(&random_bytes(rng, 64)).await;
                c.drain(brief).await;
            }
            _ => unreachable!(),
        },
    }
}

/// One connection that sends a valid start and then a flood of junk (a
/// never-ending header, or endless HTTP/2 CONTINUATION frames).
pub(super) async fn flood(l: &Listener, rng: &mut StdRng) {
    const FLOOD: usize = 32 << 20;
    let Some(mut c) = Conn::open(&l.dest).await else {
        return;
    };
    let t = &l.transcripts[0];
    let mut sent = 0;
    match l.proto {
        Proto::S3 | Proto::Metrics => {
            c.send(b"GET /metrics HTTP/1.1\r\nhost: x\r\nx-junk: ")
                .await;
            let junk = vec![b'a'; 64 << 10];
            while sent < FLOOD && c.send(&junk).await {
                sent += junk.len();
            }
        }
        Proto::AgentGrpc | Proto::ShimSocket => {
            // Preface + the client's SETTINGS, then HEADERS without
            // END_HEADERS followed by CONTINUATION frames of small literal
            // header fields.
            let pre = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
            c.send(pre).await;
            c.send(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await;
            let fields: Vec<u8> = std::iter::repeat_n([0u8, 1, b'x', 1, b'y'], 3000)
                .flatten()
                .collect();
            let frame = |ty: u8| {
                let mut f = Vec::with_capacity(9 + fields.len());
                let n = fields.len() as u32;
                f.extend_from_slice(&n.to_be_bytes()[1..]);
                f.extend_from_slice(&[ty, 0, 0, 0, 0, 1]);
                f.extend_from_slice(&fields);
                f
            };
            let first = frame(1);
            let cont = frame(9);
            if c.send(&first).await {
                while sent < FLOOD && c.send(&cont).await {
                    sent += cont.len();
                }
            }
        }
        Proto::Fabric => {
            c.send(&t[..Hello::LEN]).await;
            let junk = random_bytes(rng, 64 << 10);
            while sent < FLOOD && c.send(&junk).await {
                sent += junk.len();
            }
        }
    }
    c.drain(Duration::from_millis(200)).await;
    println!(
        "hostile: flood into {}: {sent} bytes accepted before it stopped",
        l.name
    );
}

/// Phase 1: fuzzes every socket, checks the stack still serves with the
/// stalled connections open, and returns the connections that stalled at
/// the start, for the end to check that the servers closed them.
pub(super) async fn every_listening_socket(w: &World) -> tokio::task::JoinSet<(String, bool)> {
    let seed = w.seed;
    let targets = transcripts::listeners(w).await;
    let stalls = transcripts::open_stalls(&targets, &w.signer, w.procs[0]).await;

    const CONNECTIONS: usize = 40;
    const PARALLEL: usize = 8;
    let stalled: Arc<Vec<Mutex<Vec<Conn>>>> =
        Arc::new(targets.iter().map(|_| Mutex::new(Vec::new())).collect());
    let started = std::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (ti, t) in targets.iter().enumerate() {
        for lane in 0..PARALLEL {
            let t = t.clone();
            let stalled = Arc::clone(&stalled);
            tasks.spawn(async move {
                for i in (lane..CONNECTIONS).step_by(PARALLEL) {
                    // Each connection from its own seed: reproducible
                    // whatever the interleaving.
                    let mut r = StdRng::seed_from_u64(seed ^ ((ti as u64) << 32) ^ i as u64);
                    hostile_connection(&t, &mut r, &stalled[ti]).await;
                }
            });
        }
        let t = t.clone();
        let mut r = StdRng::seed_from_u64(seed ^ 0xF100D ^ ti as u64);
        tasks.spawn(async move { flood(&t, &mut r).await });
    }
    guard("fuzzing the sockets", async {
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
    })
    .await;
    let held: usize = stalled.iter().map(|s| s.lock().unwrap().len()).sum();
    println!(
        "hostile: {} connections into {} sockets in {:?}; {held} stalled ones still open",
        CONNECTIONS * targets.len(),
        targets.len(),
        started.elapsed()
    );
    // Others are served while the stalled connections are open.
    still_serving(&w.stack, &w.c, &w.health, "with stalled connections open").await;
    for s in stalled.iter() {
        s.lock().unwrap().clear();
    }
    w.check("after the socket fuzz");
    stalls
}
