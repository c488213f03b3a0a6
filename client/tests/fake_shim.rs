//! The client against an in-process fake shim that speaks the real wire
//! contract: gRPC and leases on one Unix socket, told apart by the first
//! bytes, fds received with `SCM_RIGHTS`, object bytes written into (and read
//! from) the passed memfds. (End-to-end tests against the real host-shim live
//! in `e2e/tests/it/shim`.)

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use s3dma_client::proto::agent::v1 as agent;
use s3dma_client::proto::lease::{FdRequest, Id, MAGIC, Reply};
use s3dma_client::proto::tenant::v1 as tenant;
use s3dma_client::proto::{AGENT_ERROR_DOMAIN, SHIM_ERROR_DOMAIN};
use s3dma_client::{
    ByteRange, Client, ClientOptions, ErrorKind, GetItem, GetOptions, ListOptions, ObjectKey,
    PutItem, PutOptions, TransferPath,
};
use tenant::tenant_server::{Tenant, TenantServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

const LEASE: [u8; 16] = [0x5a; 16];

#[derive(Default)]
struct State {
    handles: HashMap<[u8; 16], File>,
    buffers: BTreeMap<u64, (File, u64, String)>,
    next_id: u64,
    objects: BTreeMap<String, (Vec<u8>, String)>,
    released: Vec<u64>,
    leases_closed: usize,
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<State>>);

fn shim_error(code: Code, reason: &str, message: &str) -> Status {
    let meta = HashMap::from([("message".to_owned(), message.to_owned())]);
    Status::with_error_details(
        code,
        message,
        ErrorDetails::with_error_info(reason, SHIM_ERROR_DOMAIN, meta),
    )
}

fn agent_error(code: Code, reason: &str, message: &str) -> Status {
    let meta = HashMap::from([
        ("message".to_owned(), message.to_owned()),
        ("request_id".to_owned(), "req-err".to_owned()),
    ]);
    Status::with_error_details(
        code,
        format!("{reason}: {message}"),
        ErrorDetails::with_error_info(reason, AGENT_ERROR_DOMAIN, meta),
    )
}

impl Fake {
    fn get_one(
        &self,
        bucket: &str,
        key: &str,
        range: Option<agent::ByteRange>,
        dest: Option<tenant::BufferSlice>,
    ) -> Result<agent::GetObjectResponse, Status> {
        let st = self.0.lock().unwrap();
        let (data, etag) = st.objects.get(&format!("{bucket}/{key}")).ok_or_else(|| {
            agent_error(
                Code::NotFound,
                "NoSuchKey",
                "The specified key does not exist.",
            )
        })?;
        let size = data.len() as u64;
        let (first, last) = match range.map(ByteRange::try_from) {
            None => (0, size.saturating_sub(1)),
            Some(Ok(ByteRange::Bounded { first, last })) => (first, last.min(size - 1)),
            Some(Ok(ByteRange::From(first))) => (first, size - 1),
            Some(Ok(ByteRange::Suffix(n))) => (size.saturating_sub(n), size - 1),
            Some(Err(_)) => return Err(Status::invalid_argument("bad range")),
        };
        if first >= size {
            return Err(agent_error(
                Code::OutOfRange,
                "InvalidRange",
                "range not satisfiable",
            ));
        }
        let bytes = &data[first as usize..=last as usize];
        let dest = dest.ok_or_else(|| Status::invalid_argument("no destination"))?;
        let (file, buf_size, _) = st
            .buffers
            .get(&dest.buffer_id)
            .ok_or_else(|| shim_error(Code::NotFound, "NoSuchBuffer", "no such buffer"))?;
        let room = dest.length.unwrap_or(buf_size - dest.offset);
        if bytes.len() as u64 > room {
            return Err(agent_error(
                Code::InvalidArgument,
                "DestinationTooSmall",
                "does not fit",
            ));
        }
        file.write_at(bytes, dest.offset).unwrap();
        Ok(agent::GetObjectResponse {
            object: Some(agent::ObjectInfo {
                size,
                etag: etag.clone(),
                ..Default::default()
            }),
            bytes_placed: bytes.len() as u64,
            range_start: first,
            path: agent::TransferPath::Rdma as i32,
            request_id: format!("req-{key}"),
        })
    }
}

type ReplyStream = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<agent::GetObjectsReply, Status>> + Send + 'static>,
>;

#[tonic::async_trait]
impl Tenant for Fake {
    async fn info(
        &self,
        _: Request<tenant::InfoRequest>,
    ) -> Result<Response<tenant::InfoResponse>, Status> {
        let st = self.0.lock().unwrap();
        Ok(Response::new(tenant::InfoResponse {
            tenant: "team-a".into(),
            buffers: st.buffers.len() as u32,
            version: "fake".into(),
            ..Default::default()
        }))
    }

    async fn register_buffer(
        &self,
        r: Request<tenant::RegisterBufferRequest>,
    ) -> Result<Response<tenant::RegisterBufferResponse>, Status> {
        let r = r.into_inner();
        if r.lease != LEASE {
            return Err(shim_error(Code::NotFound, "NoSuchLease", "no such lease"));
        }
        let Some(tenant::register_buffer_request::Memory::Host(h)) = r.memory else {
            return Err(shim_error(
                Code::InvalidArgument,
                "Unsupported",
                "host memory only",
            ));
        };
        let mut st = self.0.lock().unwrap();
        let file = st
            .handles
            .remove(&<[u8; 16]>::try_from(&h.fd_handle[..]).unwrap())
            .ok_or_else(|| shim_error(Code::InvalidArgument, "BadBuffer", "unknown fd handle"))?;
        assert!(file.metadata().unwrap().len() >= h.size);
        st.next_id += 1;
        let id = st.next_id;
        st.buffers.insert(id, (file, h.size, r.label));
        Ok(Response::new(tenant::RegisterBufferResponse {
            buffer_id: id,
            size: h.size,
        }))
    }

    async fn release_buffer(
        &self,
        r: Request<tenant::ReleaseBufferRequest>,
    ) -> Result<Response<tenant::ReleaseBufferResponse>, Status> {
        let id = r.into_inner().buffer_id;
        let mut st = self.0.lock().unwrap();
        st.buffers
            .remove(&id)
            .ok_or_else(|| shim_error(Code::NotFound, "NoSuchBuffer", "no such buffer"))?;
        st.released.push(id);
        Ok(Response::new(tenant::ReleaseBufferResponse {}))
    }

    async fn list_buffers(
        &self,
        _: Request<tenant::ListBuffersRequest>,
    ) -> Result<Response<tenant::ListBuffersResponse>, Status> {
        let st = self.0.lock().unwrap();
        let buffers = st
            .buffers
            .iter()
            .map(|(id, (_, size, label))| tenant::BufferInfo {
                buffer_id: *id,
                size: *size,
                label: label.clone(),
                kind: "host".into(),
                in_use: 0,
            })
            .collect();
        Ok(Response::new(tenant::ListBuffersResponse { buffers }))
    }

    async fn get_object(
        &self,
        r: Request<tenant::GetObjectRequest>,
    ) -> Result<Response<agent::GetObjectResponse>, Status> {
        let r = r.into_inner();
        if r.key == "slow" {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        if !r.if_match.is_empty() {
            let st = self.0.lock().unwrap();
            if let Some((_, etag)) = st.objects.get(&format!("{}/{}", r.bucket, r.key))
                && *etag != r.if_match
            {
                return Err(agent_error(
                    Code::FailedPrecondition,
                    "PreconditionFailed",
                    "etag",
                ));
            }
        }
        self.get_one(&r.bucket, &r.key, r.range, r.destination)
            .map(Response::new)
    }

    type GetObjectsStream = ReplyStream;

    async fn get_objects(
        &self,
        r: Request<tenant::GetObjectsRequest>,
    ) -> Result<Response<ReplyStream>, Status> {
        let items = r.into_inner().items;
        // Completion order differs from request order.
        let replies: Vec<_> = items
            .into_iter()
            .enumerate()
            .rev()
            .map(|(i, it)| {
                let result = match self.get_one(&it.bucket, &it.key, it.range, it.destination) {
                    Ok(ok) => agent::get_objects_reply::Result::Ok(ok),
                    Err(s) => {
                        let info = s.get_details_error_info().unwrap();
                        agent::get_objects_reply::Result::Error(agent::ItemError {
                            grpc_code: s.code() as i32,
                            s3_code: info.reason,
                            message: info.metadata["message"].clone(),
                            request_id: "req-item".into(),
                        })
                    }
                };
                Ok(agent::GetObjectsReply {
                    index: i as u32,
                    result: Some(result),
                })
            })
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(replies))))
    }

    async fn put_object(
        &self,
        r: Request<tenant::PutObjectRequest>,
    ) -> Result<Response<agent::PutObjectResponse>, Status> {
        let r = r.into_inner();
        let src = r.source.unwrap();
        let mut st = self.0.lock().unwrap();
        let (file, _, _) = st
            .buffers
            .get(&src.buffer_id)
            .ok_or_else(|| shim_error(Code::NotFound, "NoSuchBuffer", "no such buffer"))?;
        let mut data = vec![0u8; src.length.unwrap() as usize];
        file.read_exact_at(&mut data, src.offset).unwrap();
        let size = data.len() as u64;
        let etag = format!("\"etag-{}-{}\"", r.key, size);
        assert_eq!(r.metadata.get("origin").map(String::as_str), Some("test"));
        st.objects
            .insert(format!("{}/{}", r.bucket, r.key), (data, etag.clone()));
        Ok(Response::new(agent::PutObjectResponse {
            etag,
            size,
            path: agent::TransferPath::Fallback as i32,
            parts: 0,
            request_id: "req-put".into(),
        }))
    }

    async fn head_object(
        &self,
        r: Request<tenant::HeadObjectRequest>,
    ) -> Result<Response<agent::HeadObjectResponse>, Status> {
        let r = r.into_inner();
        let st = self.0.lock().unwrap();
        let (data, etag) = st
            .objects
            .get(&format!("{}/{}", r.bucket, r.key))
            .ok_or_else(|| agent_error(Code::NotFound, "NoSuchKey", "no such key"))?;
        Ok(Response::new(agent::HeadObjectResponse {
            object: Some(agent::ObjectInfo {
                size: data.len() as u64,
                etag: etag.clone(),
                ..Default::default()
            }),
            request_id: "req-head".into(),
        }))
    }

    async fn list_objects(
        &self,
        r: Request<tenant::ListObjectsRequest>,
    ) -> Result<Response<agent::ListObjectsResponse>, Status> {
        let r = r.into_inner();
        let st = self.0.lock().unwrap();
        let max = if r.max_keys == 0 {
            2
        } else {
            r.max_keys as usize
        };
        let after = r.continuation_token.clone();
        let keys: Vec<_> = st
            .objects
            .iter()
            .filter_map(|(k, (d, e))| {
                let key = k.strip_prefix(&format!("{}/", r.bucket))?;
                (key.starts_with(&r.prefix) && key > after.as_str()).then(|| agent::ListedObject {
                    key: key.to_owned(),
                    size: d.len() as u64,
                    etag: e.clone(),
                    last_modified_unix_ms: 0,
                })
            })
            .collect();
        let truncated = keys.len() > max;
        let objects: Vec<_> = keys.into_iter().take(max).collect();
        Ok(Response::new(agent::ListObjectsResponse {
            next_continuation_token: if truncated {
                objects.last().unwrap().key.clone()
            } else {
                String::new()
            },
            objects,
            common_prefixes: vec![],
            is_truncated: truncated,
            request_id: "req-list".into(),
        }))
    }

    async fn delete_object(
        &self,
        r: Request<tenant::DeleteObjectRequest>,
    ) -> Result<Response<agent::DeleteObjectResponse>, Status> {
        let r = r.into_inner();
        self.0
            .lock()
            .unwrap()
            .objects
            .remove(&format!("{}/{}", r.bucket, r.key));
        Ok(Response::new(agent::DeleteObjectResponse {
            request_id: "req-del".into(),
        }))
    }

    async fn head_objects(
        &self,
        r: Request<tenant::HeadObjectsRequest>,
    ) -> Result<Response<agent::HeadObjectsResponse>, Status> {
        let st = self.0.lock().unwrap();
        let results = r
            .into_inner()
            .items
            .into_iter()
            .map(|k| {
                use agent::head_objects_result::Result as R;
                let result = match st.objects.get(&format!("{}/{}", k.bucket, k.key)) {
                    _ if k.bucket != "b" => R::Error(item_error(Code::NotFound, "NoSuchBucket")),
                    Some((data, etag)) => R::Object(agent::ObjectInfo {
                        size: data.len() as u64,
                        etag: etag.clone(),
                        ..Default::default()
                    }),
                    None => R::Missing(agent::MissingObject {}),
                };
                agent::HeadObjectsResult {
                    result: Some(result),
                }
            })
            .collect();
        Ok(Response::new(agent::HeadObjectsResponse {
            results,
            request_id: "req-heads".into(),
        }))
    }

    async fn put_objects(
        &self,
        r: Request<tenant::PutObjectsRequest>,
    ) -> Result<Response<agent::PutObjectsResponse>, Status> {
        let mut st = self.0.lock().unwrap();
        let mut results = Vec::new();
        for it in r.into_inner().items {
            use agent::put_objects_result::Result as R;
            let src = it.source.unwrap();
            let Some((file, _, _)) = st.buffers.get(&src.buffer_id) else {
                results.push(agent::PutObjectsResult {
                    result: Some(R::Error(item_error(Code::NotFound, "NoSuchBuffer"))),
                });
                continue;
            };
            let mut data = vec![0u8; src.length.unwrap() as usize];
            file.read_exact_at(&mut data, src.offset).unwrap();
            let size = data.len() as u64;
            let etag = format!("\"etag-{}-{}\"", it.key, size);
            st.objects
                .insert(format!("{}/{}", it.bucket, it.key), (data, etag.clone()));
            results.push(agent::PutObjectsResult {
                result: Some(R::Ok(agent::PutObjectResponse {
                    etag,
                    size,
                    path: agent::TransferPath::Rdma as i32,
                    parts: 0,
                    request_id: "req-puts".into(),
                })),
            });
        }
        Ok(Response::new(agent::PutObjectsResponse {
            results,
            request_id: "req-puts".into(),
        }))
    }

    async fn delete_objects(
        &self,
        r: Request<tenant::DeleteObjectsRequest>,
    ) -> Result<Response<agent::DeleteObjectsResponse>, Status> {
        let mut st = self.0.lock().unwrap();
        let results = r
            .into_inner()
            .items
            .into_iter()
            .map(|k| agent::DeleteObjectsResult {
                error: if k.bucket == "b" {
                    st.objects.remove(&format!("{}/{}", k.bucket, k.key));
                    None
                } else {
                    Some(item_error(Code::NotFound, "NoSuchBucket"))
                },
            })
            .collect();
        Ok(Response::new(agent::DeleteObjectsResponse {
            results,
            request_id: "req-dels".into(),
        }))
    }
}

/// A batch item's error as the agent reports it.
fn item_error(code: Code, reason: &str) -> agent::ItemError {
    agent::ItemError {
        grpc_code: code as i32,
        s3_code: reason.to_owned(),
        message: format!("{reason} (fake)"),
        request_id: "req-item".into(),
    }
}

/// Serves one lease connection: the magic, then `FD` frames with one fd each.
async fn serve_lease(mut s: UnixStream, fake: Fake) {
    let mut magic = [0u8; 8];
    s.read_exact(&mut magic).await.unwrap();
    assert_eq!(magic, MAGIC);
    s.write_all(
        &Reply::Ok {
            seq: 0,
            id: Id(LEASE),
        }
        .encode(),
    )
    .await
    .unwrap();
    loop {
        let raw = s.as_raw_fd();
        let got = s
            .async_io(Interest::READABLE, || {
                let mut frame = [0u8; 8];
                let mut cmsg = nix::cmsg_space!([RawFd; 1]);
                let mut iov = [IoSliceMut::new(&mut frame)];
                let msg = recvmsg::<()>(raw, &mut iov, Some(&mut cmsg), MsgFlags::empty())
                    .map_err(io::Error::from)?;
                let mut fds = Vec::new();
                for c in msg.cmsgs().map_err(io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(f) = c {
                        fds.extend(f);
                    }
                }
                let n = msg.bytes;
                Ok((n, frame, fds))
            })
            .await;
        let Ok((8, frame, fds)) = got else {
            fake.0.lock().unwrap().leases_closed += 1;
            return;
        };
        let req = FdRequest::decode(&frame).unwrap();
        assert_eq!(fds.len(), 1);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", fds[0]))
            .unwrap();
        nix::unistd::close(fds[0]).unwrap();
        let handle = [req.seq as u8; 16];
        fake.0.lock().unwrap().handles.insert(handle, file);
        s.write_all(
            &Reply::Ok {
                seq: req.seq,
                id: Id(handle),
            }
            .encode(),
        )
        .await
        .unwrap();
    }
}

/// Starts the fake on `path`.
fn start(path: &Path) -> Fake {
    start_recording(path, None)
}

/// Appends `line` to `events` (how a fake in another process tells what it
/// received).
fn record(events: Option<&Path>, line: &str) {
    use std::io::Write as _;
    if let Some(p) = events {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    }
}

/// [`start`], appending to `events` one line per connection: `lease`,
/// `grpc`, or `empty` (closed before sending a byte).
fn start_recording(path: &Path, events: Option<PathBuf>) -> Fake {
    let fake = Fake::default();
    let listener = UnixListener::bind(path).unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<io::Result<UnixStream>>();
    let f = fake.clone();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let raw = s.as_raw_fd();
            let mut first = [0u8; 1];
            let n = s
                .async_io(Interest::READABLE, || {
                    nix::sys::socket::recv(raw, &mut first, MsgFlags::MSG_PEEK)
                        .map_err(io::Error::from)
                })
                .await
                .unwrap_or(0);
            if n == 0 {
                record(events.as_deref(), "empty");
            } else if first[0] == MAGIC[0] {
                record(events.as_deref(), "lease");
                tokio::spawn(serve_lease(s, f.clone()));
            } else {
                record(events.as_deref(), "grpc");
                tx.send(Ok(s)).unwrap();
            }
        }
    });
    let incoming =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|s| (s, rx)) });
    let svc = TenantServer::new(fake.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    fake
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_api_against_a_fake_shim() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shim.sock");
    let fake = start(&path);
    let client = Client::connect(&path).await.unwrap();
    assert_eq!(client.info().await.unwrap().tenant, "team-a");

    // Zero-length buffers are refused before anything is sent.
    let e = client.alloc(0).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);

    let mut buf = client.alloc_labeled(8192, "main").await.unwrap();
    assert_eq!(buf.len(), 8192);
    assert!(!buf.is_empty());
    let bufs = client.list_buffers().await.unwrap();
    assert_eq!(bufs.len(), 1);
    assert_eq!(bufs[0].buffer_id, buf.id());
    assert_eq!(bufs[0].label, "main");

    // PUT from the buffer, GET back into another place of it.
    buf.as_mut_slice()[..11].copy_from_slice(b"hello world");
    let opts = PutOptions {
        metadata: HashMap::from([("origin".to_owned(), "test".to_owned())]),
        ..Default::default()
    };
    let put = client
        .put_object_from("b", "greeting", &buf, 0..11, opts.clone())
        .await
        .unwrap();
    assert_eq!(put.size, 11);
    assert_eq!(put.path, TransferPath::Fallback);
    assert_eq!(put.request_id, "req-put");

    let got = client
        .get_object_into("b", "greeting", &mut buf, 4096, GetOptions::default())
        .await
        .unwrap();
    assert_eq!(got.bytes_placed, 11);
    assert_eq!(got.path, TransferPath::Rdma);
    assert_eq!(got.object.etag, put.etag);
    assert_eq!(&buf.as_slice()[4096..4107], b"hello world");

    let ranged = GetOptions {
        range: Some("-5".parse().unwrap()),
        if_match: Some(put.etag.clone()),
        ..Default::default()
    };
    let got = client
        .get_object_into("b", "greeting", &mut buf, 100, ranged)
        .await
        .unwrap();
    assert_eq!((got.bytes_placed, got.range_start), (5, 6));
    assert_eq!(&buf.as_slice()[100..105], b"world");

    // Errors keep their codes.
    let stale = GetOptions {
        if_match: Some("\"other\"".into()),
        ..Default::default()
    };
    let e = client
        .get_object_into("b", "greeting", &mut buf, 0, stale)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PreconditionFailed);
    let e = client
        .get_object_into("b", "missing", &mut buf, 0, GetOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert_eq!(e.code(), "NoSuchKey");
    assert_eq!(e.request_id(), Some("req-err"));
    let small = GetOptions {
        length: Some(3),
        ..Default::default()
    };
    let e = client
        .get_object_into("b", "greeting", &mut buf, 0, small)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "DestinationTooSmall");
    // Out-of-bounds slices never leave the client.
    let e = client
        .get_object_into("b", "greeting", &mut buf, 8193, GetOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let e = client
        .put_object_from("b", "x", &buf, 8000..9000, opts.clone())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);

    // Batches: results in request order.
    for k in ["a1", "a2", "a3"] {
        buf.as_mut_slice()[..2].copy_from_slice(k.as_bytes());
        client
            .put_object_from("b", k, &buf, 0..2, opts.clone())
            .await
            .unwrap();
    }
    let items: Vec<GetItem> = ["a1", "nope", "a3"]
        .iter()
        .enumerate()
        .map(|(i, k)| GetItem {
            bucket: "b".into(),
            key: (*k).into(),
            offset: 1000 + 10 * i,
            ..Default::default()
        })
        .collect();
    let results = client.get_objects(&mut buf, &items, 0).await.unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0].as_ref().unwrap().request_id, "req-a1");
    assert_eq!(results[1].as_ref().unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(results[2].as_ref().unwrap().request_id, "req-a3");
    assert_eq!(&buf.as_slice()[1000..1002], b"a1");
    assert_eq!(&buf.as_slice()[1020..1022], b"a3");

    // HeadObjects, PutObjects, DeleteObjects: typed results in request
    // order (a missing key is `Ok(None)`, a missing bucket an error).
    let key = |b: &str, k: &str| ObjectKey {
        bucket: b.into(),
        key: k.into(),
    };
    buf.as_mut_slice()[2000..2006].copy_from_slice(b"p1p2p3");
    let puts: Vec<PutItem> = (0..3)
        .map(|i| PutItem {
            bucket: "b".into(),
            key: format!("p{i}"),
            offset: 2000 + 2 * i,
            length: 2,
            ..Default::default()
        })
        .collect();
    let stored = client.put_objects(&buf, &puts, 0).await.unwrap();
    assert_eq!(stored.len(), 3);
    assert_eq!(stored[2].as_ref().unwrap().size, 2);
    assert_eq!(stored[2].as_ref().unwrap().path, TransferPath::Rdma);
    let bad = PutItem {
        offset: 8190,
        length: 10,
        ..puts[0].clone()
    };
    let e = client.put_objects(&buf, &[bad], 0).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let heads = client
        .head_objects(&[key("b", "p1"), key("b", "nope"), key("other", "p1")], 0)
        .await
        .unwrap();
    assert_eq!(heads[0].as_ref().unwrap().as_ref().unwrap().size, 2);
    assert!(heads[1].as_ref().unwrap().is_none());
    assert_eq!(heads[2].as_ref().unwrap_err().code(), "NoSuchBucket");
    assert_eq!(fake.0.lock().unwrap().objects["b/p1"].0, b"p2");
    let dels = client
        .delete_objects(&[
            key("b", "p0"),
            key("other", "p1"),
            key("b", "p1"),
            key("b", "p2"),
        ])
        .await
        .unwrap();
    assert!(dels[0].is_ok() && dels[2].is_ok() && dels[3].is_ok());
    assert_eq!(dels[1].as_ref().unwrap_err().kind(), ErrorKind::NotFound);
    assert!(!fake.0.lock().unwrap().objects.contains_key("b/p0"));

    // Head, list (paged by the fake at 2 keys), delete.
    assert_eq!(client.head("b", "a2").await.unwrap().size, 2);
    let page = client
        .list(
            "b",
            ListOptions {
                prefix: Some("a".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(page.is_truncated);
    assert_eq!(page.objects.len(), 2);
    assert!(page.next_continuation_token.is_some());
    let all: Vec<_> = client
        .list_all("b", "")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(all, ["a1", "a2", "a3", "greeting"]);
    client.delete("b", "a2").await.unwrap();
    assert_eq!(
        client.head("b", "a2").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );

    // Deadlines.
    let impatient = client.clone().with_timeout(Duration::from_millis(200));
    let e = impatient
        .get_object_into("b", "slow", &mut buf, 0, GetOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DeadlineExceeded, "{e}");

    // Release explicitly, and by dropping.
    let id = buf.id();
    buf.release().await.unwrap();
    let dropped = client.alloc(4096).await.unwrap();
    let dropped_id = dropped.id();
    drop(dropped);
    for _ in 0..100 {
        if fake.0.lock().unwrap().released.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fake.0.lock().unwrap().released, [id, dropped_id]);

    // The lease closes with the last clone.
    drop(impatient);
    drop(client);
    for _ in 0..100 {
        if fake.0.lock().unwrap().leases_closed == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fake.0.lock().unwrap().leases_closed, 1);
}

// ---------------------------------------------------------------------------
// A fake shim served by another uid: refused unless named.
// ---------------------------------------------------------------------------

/// The uid the impostor runs as (`nobody`).
const OTHER_UID: u32 = 65534;
const SOCKET_ENV: &str = "S3DMA_TEST_FAKE_SOCKET";
const EVENTS_ENV: &str = "S3DMA_TEST_FAKE_EVENTS";

/// Whether this process may run a child as another uid (else the test
/// skips).
fn root_or_skip(test: &str) -> bool {
    s3dma_testkit::root_or_skip(test, &format!("it runs a fake shim as uid {OTHER_UID}"))
}

/// The whole fake, as `OTHER_UID`, in a child process: this test binary
/// running [`fake_shim_as_another_user`].
struct Impostor(s3dma_testkit::ChildAsUser);

impl std::ops::Deref for Impostor {
    type Target = s3dma_testkit::ChildAsUser;
    fn deref(&self) -> &s3dma_testkit::ChildAsUser {
        &self.0
    }
}

impl Impostor {
    fn start() -> Impostor {
        Impostor(s3dma_testkit::ChildAsUser::start(
            OTHER_UID,
            "fake_shim_as_another_user",
            SOCKET_ENV,
            EVENTS_ENV,
        ))
    }

    /// Whether any connection sent it a byte.
    fn received_anything(&self) -> bool {
        self.events().lines().any(|l| l == "lease" || l == "grpc")
    }
}

/// Run by [`Impostor::start`] as another uid; does nothing otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the fake shim the other-uid tests run as uid 65534"]
async fn fake_shim_as_another_user() {
    let (Some(socket), Some(events)) = (std::env::var_os(SOCKET_ENV), std::env::var_os(EVENTS_ENV))
    else {
        return;
    };
    let events = PathBuf::from(events);
    let _fake = start_recording(Path::new(&socket), Some(events.clone()));
    record(Some(&events), "ready");
    // Until the parent kills it.
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shim_served_by_another_uid_is_refused_unless_named() {
    if !root_or_skip("a_shim_served_by_another_uid_is_refused_unless_named") {
        return;
    }
    let imp = Impostor::start();
    let e = Client::connect(&imp.socket).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UntrustedShim, "{e}");
    assert_eq!(e.code(), "UntrustedShim");
    let text = e.to_string();
    for want in [
        format!(
            "the socket {} is served by uid {OTHER_UID}",
            imp.socket.display()
        ),
        "expected uid 0 (set S3DMA_SHIM_UID".to_owned(),
    ] {
        assert!(text.contains(&want), "{text:?} should contain {want:?}");
    }
    assert!(!imp.received_anything(), "{}", imp.events());

    // Named, it is used: buffers (memfds) go to it and come back filled.
    let opts = ClientOptions::new().with_shim_uid(OTHER_UID);
    let client = Client::connect_with(&imp.socket, opts).await.unwrap();
    let mut buf = client.alloc(4096).await.unwrap();
    buf.as_mut_slice()[..5].copy_from_slice(b"hello");
    let put = PutOptions {
        metadata: HashMap::from([("origin".to_owned(), "test".to_owned())]),
        ..Default::default()
    };
    client
        .put_object_from("b", "k", &buf, 0..5, put)
        .await
        .unwrap();
    client
        .get_object_into("b", "k", &mut buf, 100, GetOptions::default())
        .await
        .unwrap();
    assert_eq!(&buf.as_slice()[100..105], b"hello");
    let events = imp.events();
    assert!(events.lines().any(|l| l == "lease"), "{events}");
    assert!(events.lines().any(|l| l == "grpc"), "{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_connections_are_checked_too() {
    if !root_or_skip("grpc_connections_are_checked_too") {
        return;
    }
    // A lease server of our own uid that, before it answers, puts the
    // impostor's socket in its place: the gRPC connection that follows
    // reaches the impostor and must be refused.
    let imp = Impostor::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shim.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let (from, to) = (imp.socket.clone(), path.clone());
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut magic = [0u8; 8];
        s.read_exact(&mut magic).await.unwrap();
        std::fs::rename(&from, &to).unwrap();
        s.write_all(
            &Reply::Ok {
                seq: 0,
                id: Id(LEASE),
            }
            .encode(),
        )
        .await
        .unwrap();
        s
    });
    let e = Client::connect(&path).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UntrustedShim, "{e}");
    assert!(
        e.to_string()
            .contains(&format!("is served by uid {OTHER_UID}")),
        "{e}"
    );
    drop(server.await.unwrap());
    assert!(!imp.received_anything(), "{}", imp.events());
}
