//! The `QueuePairs` link against the real agent, with the test as the shim
//! (the stream spoken from `agent.proto`, not with the host-shim's code):
//! only an authenticated shim opens one; the agent sends a call's commands
//! only to the shim that made the call; a target that declines
//! hipobj-rc-v2 (a storage-target on tcp answers `501` with
//! `x-amz-rdma-protocol-status: unsupported`) gets the bytes over HTTP,
//! after the agent closed the queue pair it had asked for; a shim that
//! cannot make the queue pair fails the call, and nothing is stored.

use std::time::Duration;

use crate::common::*;
use fabric::Access;
use s3dma_proto::agent::v1 as pb;
use tokio::sync::mpsc;
use tonic::Code;

/// A test shim's open `QueuePairs` stream: the commands it got, and a way
/// to answer.
struct Link {
    commands: tonic::Streaming<pb::QpCommand>,
    answers: mpsc::Sender<pb::QpEvent>,
}

async fn open_link(shim: &Shim) -> Result<Link, tonic::Status> {
    let (answers, mut rx) = mpsc::channel::<pb::QpEvent>(16);
    let outbound = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let commands = shim
        .inner
        .clone()
        .queue_pairs(shim.req(outbound))
        .await?
        .into_inner();
    Ok(Link { commands, answers })
}

impl Link {
    /// The next command, if one comes within `wait`.
    async fn next(&mut self, wait: Duration) -> Option<pb::QpCommand> {
        tokio::time::timeout(wait, self.commands.message())
            .await
            .ok()
            .and_then(|m| m.ok().flatten())
    }
}

fn hipobj_agent(target: &Target) -> Agent {
    let mut spec = AgentSpec::one(target);
    spec.target_yaml = "protocol: hipobj-rc-v2\n".into();
    Agent::start(spec)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_pair_commands_reach_only_the_calling_shim_and_a_decline_goes_over_http() {
    let target = Target::start(true);
    target.create_bucket("alice-data").await;
    let agent = hipobj_agent(&target);

    // No credentials: no link.
    let stranger = Agent::shim_for(&agent.addr, "").await;
    let err = open_link(&stranger).await.err().expect("refused");
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let wrong = Agent::shim_for(&agent.addr, "not-a-shim-token").await;
    let err = open_link(&wrong).await.err().expect("refused");
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");

    // host2 (bob's shim) holds a link; alice's calls come from host1.
    let host2 = Agent::shim_for(&agent.addr, "other-shim-token-abcdef0123").await;
    let mut other = open_link(&host2).await.unwrap();
    let host1 = agent.client().await;
    let payload = data(300_000, 3);
    let mem = Memory::new(1 << 20).await;
    mem.fill(0, &payload);
    let (_w, src) = mem.window(0, payload.len(), Access::REMOTE_READ);
    let put = host1.put("alice", "alice-data", "k", &src).await.unwrap();
    // host1 has no link: over HTTP through the agent.
    assert_eq!(put.path, pb::TransferPath::Fallback as i32);
    assert!(
        other.next(Duration::from_millis(300)).await.is_none(),
        "another shim's link got a command"
    );

    // Now host1 opens one: a GET asks it for a queue pair over the
    // window's slice (a receive for the peer's write), then the target
    // declines the dialect and the agent closes the queue pair and reads
    // the bytes over HTTP.
    let mut mine = open_link(&host1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (_w2, dest) = mem.window(512 << 10, 512 << 10, Access::REMOTE_WRITE);
    let get = {
        let host1 = host1.clone();
        let dest = dest.clone();
        tokio::spawn(async move { host1.get("alice", "alice-data", "k", None, &dest).await })
    };
    let open = mine.next(Duration::from_secs(30)).await.expect("an open");
    let Some(pb::qp_command::Command::Open(o)) = open.command else {
        panic!("expected an open, got {open:?}");
    };
    assert!(o.receive, "a GET's queue pair receives the peer's write");
    assert!((1..=0xff_ffff).contains(&o.psn));
    let slot: fabric::RdmaToken = o.window.parse().unwrap();
    let window: fabric::RdmaToken = dest.parse().unwrap();
    assert_eq!(slot.rkey, window.rkey);
    assert_eq!(slot.addr, window.addr);
    assert_eq!(u64::from(slot.size), payload.len() as u64);
    mine.answers
        .send(pb::QpEvent {
            id: open.id,
            event: Some(pb::qp_event::Event::Opened(pb::QpOpened {
                qpn: 0x123,
                gid: std::net::Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0x7f00, 1])
                    .octets()
                    .to_vec(),
                port: 1,
                lid: 0,
                addr: slot.addr,
                rkey: slot.rkey,
                length: slot.size,
            })),
        })
        .await
        .unwrap();
    let close = mine.next(Duration::from_secs(30)).await.expect("a close");
    assert!(
        matches!(close.command, Some(pb::qp_command::Command::Close(pb::QpClose { qp })) if qp == open.id),
        "{close:?}"
    );
    let got = get.await.unwrap().unwrap();
    assert_eq!(got.path, pb::TransferPath::Fallback as i32);
    assert_eq!(got.bytes_placed, payload.len() as u64);
    assert_eq!(
        mem.sha256(512 << 10, payload.len()),
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&payload))
    );
    assert!(
        other.next(Duration::from_millis(200)).await.is_none(),
        "another shim's link got a command"
    );

    // A shim that cannot make the queue pair fails the call: nothing moves
    // and nothing is stored.
    let (_w3, src3) = mem.window(0, 100_000, Access::REMOTE_READ);
    let put = {
        let host1 = host1.clone();
        tokio::spawn(async move { host1.put("alice", "alice-data", "never", &src3).await })
    };
    let open = mine.next(Duration::from_secs(30)).await.expect("an open");
    assert!(matches!(
        open.command,
        Some(pb::qp_command::Command::Open(pb::QpOpen {
            receive: false,
            ..
        }))
    ));
    mine.answers
        .send(pb::QpEvent {
            id: open.id,
            event: Some(pb::qp_event::Event::Failed(pb::QpFailed {
                message: "100 queue pairs are open already".into(),
            })),
        })
        .await
        .unwrap();
    let err = put.await.unwrap().unwrap_err();
    assert!(
        err.message().contains("queue pairs are open already"),
        "{err:?}"
    );
    let s3 = target.s3(ALICE);
    assert!(
        s3.head_object()
            .bucket("alice-data")
            .key("never")
            .send()
            .await
            .is_err(),
        "a failed PUT stored an object"
    );
}
