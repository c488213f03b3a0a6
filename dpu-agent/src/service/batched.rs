//! The batched calls' own work: running a HeadObjects, PutObjects or
//! DeleteObjects batch item by item under its caps, and GetObjects, whose
//! items stream back as they finish.

use super::*;

impl AgentService {
    /// Runs a HeadObjects, PutObjects or DeleteObjects batch in one
    /// envelope (one span, one request metric, one failure line for the
    /// batch): the caps (`transfer.max_batch_items`, and `bytes` against
    /// `transfer.max_batch_bytes`) refuse the whole batch; then every item
    /// runs through [`batch`] under the request deadline, and its result
    /// (or error) comes back in request order. The batch takes none of the
    /// tenant's concurrency slots itself (its items do, one each), so a
    /// batch never waits on itself. Failed items are counted per outcome.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_batch<I>(
        &self,
        env: &Envelope,
        tenant: &Arc<Tenant>,
        op: Op,
        concurrency: u32,
        qp_link: Option<Arc<QpLink>>,
        items: I,
        bytes: u64,
    ) -> Result<Vec<Result<Outcome, pb::ItemError>>, Status>
    where
        I: ExactSizeIterator<Item = (String, String, Option<Result<batch::PutSource, AgentError>>)>,
    {
        let name = op.name();
        env.record_client_id()
            .record("tenant", &tenant.name)
            .record("op", name);
        let total = items.len();
        let core = &self.core;
        let settings = &core.settings;
        let concurrency = match concurrency {
            0 => settings.batch_concurrency,
            n => (n as usize).min(settings.batch_concurrency.max(1) * 4),
        }
        .clamp(1, total.max(1));
        let res = env
            .run(async {
                if total == 0 {
                    return Err(AgentError::InvalidArgument(BadRequest::EmptyBatch));
                }
                if total > settings.max_batch_items {
                    return Err(AgentError::InvalidArgument(BadRequest::BatchTooLarge {
                        max: settings.max_batch_items,
                        items: total,
                    }));
                }
                if bytes > settings.max_batch_bytes {
                    return Err(AgentError::InvalidArgument(BadRequest::BatchTooManyBytes {
                        max: settings.max_batch_bytes,
                        bytes,
                    }));
                }
                core.metrics.in_flight(&tenant.name, 1);
                let _guard = InFlight {
                    core: Arc::clone(core),
                    tenant: tenant.name.clone(),
                };
                let b = Batch {
                    core,
                    tenant,
                    request_id: env.id(),
                    qp_link,
                    concurrency,
                    limit: tokio::sync::Semaphore::new(concurrency),
                };
                let (groups, refused) = batch::group(&b, op, items);
                let deadline = settings.request_timeout;
                let done =
                    tokio::time::timeout(deadline, batch::run(&b, op, groups, refused, total))
                        .await
                        .map_err(|_| AgentError::DeadlineExceeded { deadline })?;
                // Per-item failures, counted by outcome (one counter
                // update per distinct outcome, not per item).
                let mut failed: Vec<(&'static str, u64)> = Vec::new();
                let out = done
                    .into_iter()
                    .map(|r| match r {
                        Some(Ok(o)) => Ok(o),
                        Some(Err(e)) => {
                            let label = e.metric_label();
                            match failed.iter_mut().find(|(l, _)| *l == label) {
                                Some((_, n)) => *n += 1,
                                None => failed.push((label, 1)),
                            }
                            Err(batch::item_error(&e, env.id()))
                        }
                        None => Err(batch::item_error(
                            &AgentError::internal("the item did not run"),
                            env.id(),
                        )),
                    })
                    .collect::<Vec<_>>();
                for (label, n) in failed {
                    core.metrics.batch_item(&tenant.name, name, label, n);
                }
                Ok(out)
            })
            .await;
        let about = About {
            tenant: &tenant.name,
            op: name,
            object: "",
            pid: None,
        };
        env.finish(&*core.metrics, about, res)
    }

    /// GetObjects: the batch checked whole, then its items streamed back
    /// as they finish (each through [`get_one`]).
    pub(super) async fn get_objects_streamed(
        &self,
        request: Request<pb::GetObjectsRequest>,
    ) -> Result<Response<GetObjectsStream>, Status> {
        let env = envelope(&request);
        let rid = env.id().to_owned();
        let tenant = self.tenant(&request, &request.get_ref().tenant, &rid)?;
        let qp_link = self.qp_link(&request);
        let r = request.into_inner();
        if r.items.is_empty() {
            return Err(AgentError::InvalidArgument(BadRequest::EmptyBatch).to_status(&rid));
        }
        let max = self.core.settings.max_batch_items;
        if r.items.len() > max {
            return Err(AgentError::InvalidArgument(BadRequest::BatchTooLarge {
                max,
                items: r.items.len(),
            })
            .to_status(&rid));
        }
        let bytes: u64 = r
            .items
            .iter()
            .filter_map(|it| it.destination.parse::<RdmaToken>().ok())
            .map(|t| u64::from(t.size))
            .sum();
        let max_bytes = self.core.settings.max_batch_bytes;
        if bytes > max_bytes {
            return Err(AgentError::InvalidArgument(BadRequest::BatchTooManyBytes {
                max: max_bytes,
                bytes,
            })
            .to_status(&rid));
        }
        let concurrency = match r.concurrency {
            0 => self.core.settings.batch_concurrency,
            n => (n as usize).min(self.core.settings.batch_concurrency.max(1) * 4),
        }
        .max(1);
        // Every item is one request of the tenant's: it takes a concurrency
        // slot (or waits in the tenant's queue, or is refused with SlowDown)
        // when it starts and gives it back when it ends, runs under the
        // request deadline, and its chunks count against the tenant's bytes
        // in flight. At most `concurrency` items of a batch run or wait at
        // once. Small items (a window of at most one chunk) to a target that
        // speaks s3dma's dialect go first as batched requests, one per
        // (target, bucket) and up to the target's caps, each taking one
        // slot, its windows' bytes and one of the `concurrency` places
        // ([`crate::transfer::target_batch`]); what the target declines or
        // does not answer for an item goes as that item's single request.
        let svc = self.clone();
        let (tx, rx) =
            tokio::sync::mpsc::channel::<Result<pb::GetObjectsReply, Status>>(concurrency.max(16));
        let handle = tokio::spawn(async move {
            let rid = env.id().to_owned();
            let chunk = svc.core.settings.chunk_size;
            let (more, singles) =
                futures::channel::mpsc::unbounded::<(usize, pb::GetObjectsItem)>();
            let mut small = Vec::new();
            for (i, it) in r.items.into_iter().enumerate() {
                match batch::get_source(&tenant, &it, chunk) {
                    Some(get) => small.push((
                        it.bucket,
                        batch::Item {
                            index: i,
                            key: it.key,
                            put: None,
                            get: Some(get),
                        },
                    )),
                    None => {
                        let _ = more.unbounded_send((i, it));
                    }
                }
            }
            let b = Batch {
                core: &svc.core,
                tenant: &tenant,
                request_id: &rid,
                qp_link: qp_link.clone(),
                concurrency,
                limit: tokio::sync::Semaphore::new(concurrency),
            };
            let (groups, unrouted) = batch::group_gets(&b, small);
            for (bucket, item) in unrouted {
                if let Some(single) = batch::get_item(bucket, item) {
                    let _ = more.unbounded_send(single);
                }
            }
            let (b, rid) = (&b, rid.as_str());
            let batched: futures::stream::FuturesUnordered<_> = groups
                .into_iter()
                .map(|g| {
                    let more = more.clone();
                    let indexes: Vec<usize> = g.items.iter().map(|i| i.index).collect();
                    async move {
                        let deadline = b.core.settings.request_timeout;
                        let ran = tokio::time::timeout(
                            deadline,
                            crate::transfer::target_batch::batched(b, Op::Get, g),
                        )
                        .await;
                        let Ok((done, rest)) = ran else {
                            let e = AgentError::DeadlineExceeded { deadline };
                            return indexes.into_iter().map(|i| (i, Err(e.clone()))).collect();
                        };
                        for item in rest.items {
                            if let Some(single) = batch::get_item(rest.bucket.clone(), item) {
                                let _ = more.unbounded_send(single);
                            }
                        }
                        done
                    }
                })
                .collect();
            // The last sender goes with the last group: the single
            // requests end after every group has handed its rest over.
            drop(more);
            let (svc, tenant, env) = (&svc, &tenant, &env);
            let batched = batched
                .map(|done| {
                    futures::stream::iter(done.into_iter().map(|(i, r)| {
                        let index = u32::try_from(i).unwrap_or(u32::MAX);
                        let result = match r {
                            Ok(batch::Outcome::Got(g)) => {
                                svc.core.metrics.bytes(
                                    &tenant.name,
                                    "GetObject",
                                    path_label(g.path),
                                    g.placed,
                                );
                                svc.core
                                    .metrics
                                    .batch_item(&tenant.name, "GetObjects", "ok", 1);
                                pb::get_objects_reply::Result::Ok(pb::GetObjectResponse {
                                    object: Some(g.info),
                                    bytes_placed: g.placed,
                                    range_start: g.start,
                                    path: g.path as i32,
                                    request_id: rid.to_owned(),
                                })
                            }
                            Ok(_) => pb::get_objects_reply::Result::Error(batch::item_error(
                                &AgentError::internal("a GET item came back without its bytes"),
                                rid,
                            )),
                            Err(e) => {
                                svc.core.metrics.batch_item(
                                    &tenant.name,
                                    "GetObjects",
                                    e.metric_label(),
                                    1,
                                );
                                pb::get_objects_reply::Result::Error(batch::item_error(&e, rid))
                            }
                        };
                        pb::GetObjectsReply {
                            index,
                            result: Some(result),
                        }
                    }))
                })
                .flatten();
            let singles = singles
                .map(|(i, it)| {
                    let qp_link = qp_link.clone();
                    async move {
                        let item = Envelope::new(
                            STYLE,
                            format!("{}-{i}", env.id()),
                            env.client_id().to_owned(),
                        );
                        let bucket = it.bucket.clone();
                        let if_match = it.if_match.clone();
                        let res = svc
                            .run(&item, tenant, "GetObjects", &bucket, async {
                                get_one(svc, tenant, item.id(), it, &if_match, qp_link).await
                            })
                            .await;
                        match res {
                            Ok(ok) => pb::GetObjectsReply {
                                index: u32::try_from(i).unwrap_or(u32::MAX),
                                result: Some(pb::get_objects_reply::Result::Ok(ok)),
                            },
                            Err(status) => item_error(i, &status, item.id().to_owned()),
                        }
                    }
                })
                .buffer_unordered(concurrency);
            let mut items = futures::stream::select(batched, singles);
            while let Some(reply) = items.next().await {
                if tx.send(Ok(reply)).await.is_err() {
                    // The shim went away: stop fetching.
                    break;
                }
            }
        });
        let guard = AbortOnDrop(handle);
        let stream = futures::stream::unfold((rx, guard), |(mut rx, guard)| async move {
            rx.recv().await.map(|item| (item, (rx, guard)))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
