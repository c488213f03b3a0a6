//! The batched calls' own work: item counts, the slices and windows of a
//! GetObjects or PutObjects batch, running a GetObjects batch item by item
//! and a PutObjects batch as one agent call (what the parent module's
//! documentation describes).

use super::*;

/// A batch's item count against the tenant's `max_batch_items` (an empty
/// batch is refused too): the whole batch is refused, nothing runs.
impl Call {
    pub(super) fn check_batch_len(&self, items: usize) -> Result<(), ShimError> {
        let max = self.tenant.max_batch_items as usize;
        if items == 0 {
            return Err(ShimError::InvalidArgument(
                "a batch needs at least one item".into(),
            ));
        }
        if items > max {
            return Err(ShimError::InvalidArgument(format!(
                "a batch has at most {max} items (this tenant's max_batch_items), not {items}; split it"
            )));
        }
        Ok(())
    }
}

/// A shim-side refusal of one batch item, as the agent's items carry errors.
fn shim_item_error(e: &ShimError, request_id: &str) -> agent::ItemError {
    agent::ItemError {
        grpc_code: e.code() as i32,
        s3_code: e.reason().to_owned(),
        message: e.to_string(),
        request_id: request_id.to_owned(),
    }
}

/// A GetObjects batch ready to run: the refusals already made and the
/// items going to the agent with their windows.
pub(super) struct GetBatch {
    /// Items refused by the shim (slice or window), answered first.
    refused: Vec<agent::GetObjectsReply>,
    /// The tenant's index of each item sent to the agent, in the agent's order.
    sent: Vec<usize>,
    /// The window of each item sent, taken when its reply arrives.
    windows: Vec<Option<MintedWindow>>,
    /// The agent's request.
    request: agent::GetObjectsRequest,
}

fn get_reply(index: usize, result: agent::get_objects_reply::Result) -> agent::GetObjectsReply {
    agent::GetObjectsReply {
        index: u32::try_from(index).unwrap_or(u32::MAX),
        result: Some(result),
    }
}

fn status_item_error(status: &Status, request_id: &str) -> agent::ItemError {
    use tonic_types::StatusExt as _;
    let info = status.get_details_error_info();
    agent::ItemError {
        grpc_code: status.code() as i32,
        s3_code: info.map(|i| i.reason).unwrap_or_default(),
        message: status.message().to_owned(),
        request_id: request_id.to_owned(),
    }
}

impl TenantService {
    /// A batch's slices, checked and windowed: every item's slice is
    /// resolved against the caller's buffers (a bad one is that item's
    /// error), the batch's bytes against the tenant's `max_batch_bytes`
    /// (the whole batch refused), then a window with `access` is minted per
    /// good item (one `max_windows` refuses is that item's error). `field`
    /// names the slice in errors; `slice` reads an item's slice and range.
    #[allow(clippy::type_complexity)]
    fn window_items<T>(
        &self,
        call: &Call,
        items: Vec<T>,
        field: &str,
        slice: impl Fn(&T) -> (Option<&api::BufferSlice>, Option<&agent::ByteRange>),
        length_required: bool,
        access: Access,
    ) -> Result<(Vec<(usize, T, MintedWindow)>, Vec<(usize, ShimError)>), Status> {
        let mut refused = Vec::new();
        let mut slices = Vec::with_capacity(items.len());
        let mut bytes = 0u64;
        for (i, item) in items.into_iter().enumerate() {
            let (s, range) = slice(&item);
            match self.resolve(
                call,
                s,
                &format!("items[{i}].{field}"),
                range,
                length_required,
            ) {
                Ok(resolved) => {
                    bytes = bytes.saturating_add(resolved.2);
                    slices.push((i, item, resolved));
                }
                Err(e) => refused.push((i, e)),
            }
        }
        let max_bytes = call.tenant.max_batch_bytes;
        if bytes > max_bytes {
            return Err(self.err(
                call,
                ShimError::InvalidArgument(format!(
                    "a batch moves at most {max_bytes} bytes (this tenant's max_batch_bytes), not {bytes}; split it"
                )),
            ));
        }
        let mut windowed = Vec::with_capacity(slices.len());
        for (i, item, (buffer, offset, len)) in slices {
            match self.mint(&call.tenant, call.timeout, buffer, offset, len, access) {
                Ok(w) => windowed.push((i, item, w)),
                Err(e) => refused.push((i, e)),
            }
        }
        Ok((windowed, refused))
    }

    /// A GetObjects batch: every item's destination is checked against the
    /// caller's buffers (a bad one is that item's error), the batch's bytes
    /// against the tenant's `max_batch_bytes` (the whole batch refused),
    /// then a remote-write window is minted per item (one `max_windows`
    /// refuses is that item's error); the good items go to the agent in
    /// one GetObjects call, which batches them further towards its targets.
    pub(super) fn get_batch(
        &self,
        call: &Call,
        r: api::GetObjectsRequest,
    ) -> Result<GetBatch, Status> {
        let rid = call.request_id();
        let (windowed, refused) = self.window_items(
            call,
            r.items,
            "destination",
            |item| (item.destination.as_ref(), item.range.as_ref()),
            false,
            Access::REMOTE_WRITE,
        )?;
        let refused = refused
            .iter()
            .map(|(i, e)| {
                get_reply(
                    *i,
                    agent::get_objects_reply::Result::Error(shim_item_error(e, rid)),
                )
            })
            .collect();
        let mut sent = Vec::with_capacity(windowed.len());
        let mut windows = Vec::with_capacity(windowed.len());
        let mut items = Vec::with_capacity(windowed.len());
        for (i, item, w) in windowed {
            items.push(agent::GetObjectsItem {
                bucket: item.bucket,
                key: item.key,
                range: item.range,
                destination: w.token.clone(),
                destination_rails: w.rail_tokens.clone(),
                if_match: item.if_match,
            });
            windows.push(Some(w));
            sent.push(i);
        }
        Ok(GetBatch {
            refused,
            sent,
            windows,
            request: agent::GetObjectsRequest {
                tenant: call.tenant.name.clone(),
                items,
                concurrency: match r.concurrency {
                    0 => DEFAULT_BATCH_CONCURRENCY,
                    n => n,
                },
            },
        })
    }

    /// Runs a GetObjects batch: the refusals first, then the agent's
    /// replies as they come, each item's window revoked before its reply
    /// goes out (nothing lands once the tenant has it). An item the agent
    /// gave no reply (its stream failed or ended early) gets that error.
    pub(super) async fn run_get_batch(
        &self,
        tenant: &Arc<Tenant>,
        request_id: &str,
        timeout: Duration,
        batch: GetBatch,
        tx: &tokio::sync::mpsc::Sender<Result<agent::GetObjectsReply, Status>>,
    ) {
        let GetBatch {
            refused,
            sent,
            mut windows,
            request,
        } = batch;
        for reply in refused {
            if tx.send(Ok(reply)).await.is_err() {
                return;
            }
        }
        if sent.is_empty() {
            return;
        }
        let mut failure = None;
        match self
            .agent
            .call(request, request_id, timeout, |mut c, m| async move {
                c.get_objects(m).await
            })
            .await
        {
            Ok(mut stream) => loop {
                match stream.message().await {
                    Ok(Some(mut reply)) => {
                        let j = reply.index as usize;
                        let Some(window) = windows.get_mut(j).and_then(Option::take) else {
                            failure = Some(Status::internal(format!(
                                "the agent answered item {j} of {} twice or out of range",
                                sent.len()
                            )));
                            break;
                        };
                        let ok =
                            matches!(reply.result, Some(agent::get_objects_reply::Result::Ok(_)));
                        window.close(ok).await;
                        if let Some(agent::get_objects_reply::Result::Ok(r)) = &reply.result {
                            self.metrics
                                .bytes
                                .with_label_values(&[&tenant.name, "GetObjects"])
                                .inc_by(r.bytes_placed);
                        }
                        reply.index = u32::try_from(sent[j]).unwrap_or(u32::MAX);
                        if tx.send(Ok(reply)).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        failure = Some(status);
                        break;
                    }
                }
            },
            Err(status) => failure = Some(status),
        }
        let failure = failure.unwrap_or_else(|| {
            Status::internal("the dpu-agent ended the batch without answering this item")
        });
        for (j, window) in windows.iter_mut().enumerate() {
            if let Some(w) = window.take() {
                w.close(false).await;
                let e = status_item_error(&failure, request_id);
                let reply = get_reply(sent[j], agent::get_objects_reply::Result::Error(e));
                if tx.send(Ok(reply)).await.is_err() {
                    return;
                }
            }
        }
    }
}

impl TenantService {
    /// A PutObjects batch: every item's slice is checked against the
    /// caller's buffers (a bad one is that item's error), the batch's bytes
    /// against the tenant's `max_batch_bytes` (the whole batch refused),
    /// then a remote-read window is minted per item (a window the tenant's
    /// `max_windows` refuses is that item's error) and the good items go to
    /// the agent in one call. Every window is revoked when the call ends,
    /// before the answer; results come back in request order.
    pub(super) async fn put_batch(
        &self,
        call: &Call,
        r: api::PutObjectsRequest,
    ) -> Result<agent::PutObjectsResponse, Status> {
        let rid = call.request_id();
        let n = r.items.len();
        let mut results: Vec<Option<agent::PutObjectsResult>> = Vec::with_capacity(n);
        results.resize_with(n, || None);
        let refuse = |e: &ShimError| agent::PutObjectsResult {
            result: Some(agent::put_objects_result::Result::Error(shim_item_error(
                e, rid,
            ))),
        };
        let (windowed, refused) = self.window_items(
            call,
            r.items,
            "source",
            |item| (item.source.as_ref(), None),
            true,
            Access::REMOTE_READ,
        )?;
        for (i, e) in &refused {
            results[*i] = Some(refuse(e));
        }
        let mut windows = Vec::with_capacity(windowed.len());
        let mut sent = Vec::with_capacity(windowed.len());
        let mut items = Vec::with_capacity(windowed.len());
        for (i, item, w) in windowed {
            items.push(agent::PutObjectsItem {
                bucket: item.bucket,
                key: item.key,
                source: w.token.clone(),
                source_rails: w.rail_tokens.clone(),
                content_type: item.content_type,
                metadata: item.metadata,
            });
            windows.push(w);
            sent.push(i);
        }
        let mut request_id = rid.to_owned();
        if !items.is_empty() {
            let msg = agent::PutObjectsRequest {
                tenant: call.tenant.name.clone(),
                items,
                concurrency: r.concurrency,
            };
            let resp = self
                .agent
                .call(msg, rid, call.timeout, |mut c, m| async move {
                    c.put_objects(m).await
                })
                .await;
            // Revoke before answering: nothing is read once the tenant
            // has its answer.
            let ok = resp.as_ref().is_ok_and(|a| a.results.len() == sent.len());
            for w in windows {
                w.close(ok).await;
            }
            let resp = resp?;
            if resp.results.len() != sent.len() {
                return Err(self.err(
                    call,
                    ShimError::Internal(format!(
                        "the agent answered {} results for {} items",
                        resp.results.len(),
                        sent.len()
                    )),
                ));
            }
            let mut stored = 0u64;
            for (i, res) in sent.into_iter().zip(resp.results) {
                if let Some(agent::put_objects_result::Result::Ok(ok)) = &res.result {
                    stored += ok.size;
                }
                results[i] = Some(res);
            }
            self.metrics
                .bytes
                .with_label_values(&[&call.tenant.name, "PutObjects"])
                .inc_by(stored);
            request_id = resp.request_id;
        }
        let results = results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| refuse(&ShimError::Internal("the item got no result".into())))
            })
            .collect();
        Ok(agent::PutObjectsResponse {
            results,
            request_id,
        })
    }
}
