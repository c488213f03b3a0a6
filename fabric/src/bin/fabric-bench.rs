//! `fabric-bench`: tcp-fabric WRITE and READ throughput against a plain
//! loopback TCP copy loop with the same operation sizes.
//!
//! Prints a table and, as its last line, one JSON object with the 8 MiB,
//! one-session figures: `write_gbps`, `read_gbps`, `raw_tcp_gbps`,
//! `write_ratio`, `read_ratio` (GB/s = 10^9 bytes per second).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use fabric::{Access, Domain, Endpoint, EndpointConfig, FabricKey, Session, SessionConfig};

#[derive(Parser, Debug)]
#[command(about = "tcp-fabric WRITE/READ throughput versus raw loopback TCP")]
struct Args {
    /// Operation sizes in MiB.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    sizes_mib: Vec<usize>,
    /// Session counts.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    sessions: Vec<usize>,
    /// Bytes moved per measurement, in MiB (split over the sessions).
    #[arg(long, default_value_t = 4096)]
    total_mib: usize,
    /// Operations outstanding per session.
    #[arg(long, default_value_t = 4)]
    depth: usize,
    /// Distinct buffer slots per session that operations cycle through, on
    /// each side (1 = every operation uses the same local and remote buffer,
    /// like the raw copy loop reusing its one buffer).
    #[arg(long, default_value_t = 1)]
    slots: usize,
    /// TCP streams per fabric session.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// Stripe unit in KiB when streams > 1.
    #[arg(long, default_value_t = 4096)]
    stripe_kib: u64,
    /// SO_SNDBUF/SO_RCVBUF in KiB for fabric and raw sockets (0 = kernel autotuning).
    #[arg(long, default_value_t = 0)]
    socket_buffer_kib: usize,
    /// Repetitions of each measurement; the best is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Tokio worker threads of each runtime, requester and endpoint (0 = one per core).
    #[arg(long, default_value_t = 0)]
    workers: usize,
}

const MIB: usize = 1 << 20;

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Write,
    Read,
}

async fn fabric_run(
    server_rt: &tokio::runtime::Handle,
    args: &Args,
    kind: Kind,
    size: usize,
    sessions: usize,
) -> Result<f64> {
    let key = FabricKey::random();
    let server = Domain::tcp();
    let client = Domain::tcp();
    let mut cfg = EndpointConfig::new("127.0.0.1:0".parse()?, key.clone());
    cfg.socket_buffer = (args.socket_buffer_kib > 0).then_some(args.socket_buffer_kib << 10);
    // The endpoint runs on its own runtime, as it would in its own process.
    let ep = {
        let server = server.clone();
        server_rt
            .spawn(async move { Endpoint::listen(&server, cfg).await })
            .await??
    };
    let depth = args.depth.max(1);
    let slots = args.slots.max(1);
    let total = (args.total_mib * MIB).max(size * depth * sessions);
    let ops_per_session = total.div_ceil(size * sessions).max(depth);
    let mut tasks = Vec::new();
    let mut conns = Vec::new();
    for _ in 0..sessions {
        let remote = server.alloc(size * slots, Access::REMOTE_READ | Access::REMOTE_WRITE)?;
        let local = client.alloc(size * slots, Access::LOCAL_WRITE)?;
        // Touch every page on both sides, so neither page faults nor the
        // shared zero page flatter or hurt a direction.
        local.write_at(0, &vec![0x5a; size * slots])?;
        remote.write_at(0, &vec![0xa5; size * slots])?;
        let mut scfg = SessionConfig::new(key.clone());
        scfg.streams = args.streams;
        scfg.stripe = args.stripe_kib << 10;
        scfg.socket_buffer = (args.socket_buffer_kib > 0).then_some(args.socket_buffer_kib << 10);
        let s = Session::connect(&client, ep.addr(), scfg).await?;
        conns.push((s, remote, local));
    }
    // Run the sessions concurrently, `depth` operations outstanding each.
    let start = Instant::now();
    for (s, remote, local) in conns {
        let s = std::sync::Arc::new(s);
        tasks.push(tokio::spawn(async move {
            let mut inflight = std::collections::VecDeque::new();
            for i in 0..ops_per_session {
                let slot = i % slots;
                let l = local.slice(slot * size, size)?;
                let addr = remote.addr() + (slot * size) as u64;
                let c = match kind {
                    Kind::Write => s.write(l, addr, remote.rkey()),
                    Kind::Read => s.read(l, addr, remote.rkey()),
                };
                inflight.push_back(c);
                if inflight.len() >= depth {
                    inflight.pop_front().expect("non-empty").await?;
                }
            }
            for c in inflight {
                c.await?;
            }
            anyhow::Ok(ops_per_session * size)
        }));
    }
    let mut bytes = 0;
    for t in tasks {
        bytes += t.await??;
    }
    let el = start.elapsed();
    server_rt.spawn(ep.shutdown()).await?;
    Ok(gbps(bytes, el))
}

fn raw_tcp_run(args: &Args, size: usize, conns: usize) -> Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let total = (args.total_mib * MIB).max(size * conns);
    let per_conn = total.div_ceil(size * conns).max(1);
    let sockbuf = args.socket_buffer_kib << 10;
    let tune = move |s: &TcpStream| -> Result<()> {
        s.set_nodelay(true)?;
        if sockbuf > 0 {
            let r = socket2::SockRef::from(s);
            r.set_send_buffer_size(sockbuf)?;
            r.set_recv_buffer_size(sockbuf)?;
        }
        Ok(())
    };
    let server = std::thread::spawn(
        move || -> Result<Vec<std::thread::JoinHandle<Result<()>>>> {
            let mut hs = Vec::new();
            for _ in 0..conns {
                let (mut s, _) = listener.accept()?;
                tune(&s)?;
                hs.push(std::thread::spawn(move || -> Result<()> {
                    let mut buf = vec![0u8; size];
                    for _ in 0..per_conn {
                        s.read_exact(&mut buf)?;
                    }
                    s.write_all(&[1])?;
                    Ok(())
                }));
            }
            Ok(hs)
        },
    );
    let mut clients = Vec::new();
    for _ in 0..conns {
        let s = TcpStream::connect(addr)?;
        tune(&s)?;
        clients.push(s);
    }
    let readers = server.join().expect("accept thread")?;
    let start = Instant::now();
    let writers: Vec<_> = clients
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || -> Result<()> {
                let buf = vec![0x5au8; size];
                for _ in 0..per_conn {
                    s.write_all(&buf)?;
                }
                let mut ack = [0u8; 1];
                s.read_exact(&mut ack)?;
                Ok(())
            })
        })
        .collect();
    for w in writers {
        w.join().expect("writer thread")?;
    }
    let el = start.elapsed();
    for r in readers {
        r.join().expect("reader thread")?;
    }
    Ok(gbps(per_conn * conns * size, el))
}

/// Best of `args.repeat` rounds; each round runs WRITE, READ and raw TCP
/// back to back so that background load affects all three alike.
fn measure(rts: &Runtimes, args: &Args, size: usize, sessions: usize) -> Result<(f64, f64, f64)> {
    let (rt, srv) = (&rts.client, rts.server.handle());
    let (mut w, mut r, mut raw) = (0f64, 0f64, 0f64);
    for _ in 0..args.repeat.max(1) {
        w = w.max(rt.block_on(fabric_run(srv, args, Kind::Write, size, sessions))?);
        r = r.max(rt.block_on(fabric_run(srv, args, Kind::Read, size, sessions))?);
        raw = raw.max(raw_tcp_run(args, size, sessions)?);
    }
    Ok((w, r, raw))
}

/// The requester side and the endpoint run on separate runtimes, as they
/// would in separate processes.
struct Runtimes {
    client: tokio::runtime::Runtime,
    server: tokio::runtime::Runtime,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = |name: &str| {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if args.workers > 0 {
            b.worker_threads(args.workers);
        }
        b.thread_name(name)
            .enable_all()
            .build()
            .context("tokio runtime")
    };
    let rt = Runtimes {
        client: runtime("bench-client")?,
        server: runtime("bench-endpoint")?,
    };
    println!(
        "fabric-bench: tcp fabric vs raw loopback TCP; depth {}, slots {}, streams {}, {} MiB per measurement, best of {}",
        args.depth, args.slots, args.streams, args.total_mib, args.repeat
    );
    println!(
        "{:>8} {:>8} {:>12} {:>12} {:>12} {:>8} {:>8}",
        "op MiB", "sessions", "write GB/s", "read GB/s", "raw GB/s", "w/raw", "r/raw"
    );
    let mut headline = None;
    for &mib in &args.sizes_mib {
        for &sessions in &args.sessions {
            let size = mib * MIB;
            let (w, r, raw) = measure(&rt, &args, size, sessions)?;
            println!(
                "{:>8} {:>8} {:>12.2} {:>12.2} {:>12.2} {:>8.2} {:>8.2}",
                mib,
                sessions,
                w,
                r,
                raw,
                w / raw,
                r / raw
            );
            if mib == 8 && sessions == 1 {
                headline = Some((w, r, raw));
            }
        }
    }
    let (w, r, raw) = match headline {
        Some(h) => h,
        None => measure(&rt, &args, 8 * MIB, 1)?,
    };
    println!(
        "{{\"op_mib\":8,\"sessions\":1,\"write_gbps\":{w:.3},\"read_gbps\":{r:.3},\"raw_tcp_gbps\":{raw:.3},\"write_ratio\":{:.3},\"read_ratio\":{:.3}}}",
        w / raw,
        r / raw
    );
    Ok(())
}
