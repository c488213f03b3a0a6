//! The envelope every request of the three services runs in.
//!
//! One [`Envelope`] per request carries:
//!
//! - the service's **own request id** (what its replies and errors carry and
//!   what it sends on; never chosen by the caller);
//! - the **caller's id** ([`client_request_id`]): the caller's own
//!   `x-request-id` (or the like), cut to [`CLIENT_REQUEST_ID_MAX`] bytes
//!   and escaped ([`crate::escape`]), logged beside the service's id as
//!   `client_request_id` and used for nothing else;
//! - a **`request` span** (`request{id=... }`) at the service's
//!   [`Style::span`] level, whose other fields the service records in the
//!   order it wants them shown ([`Envelope::record`]);
//! - the start time, so that finishing it ([`Envelope::finish`],
//!   [`Envelope::observe`]) counts the request by op and outcome (the
//!   `status` label in all three services) and observes its **latency**
//!   through the service's [`RequestMetrics`];
//! - the **failure line**: `request failed` with `request_id`,
//!   `client_request_id`, `tenant`, `op`, `object`, `pid`, `status` and the
//!   escaped `error`, at `warn` when the server is at fault
//!   ([`Failure::server_fault`]), else at the service's
//!   [`Style::client_failure`] level;
//! - the **id on every error** ([`Failure::reply`]).

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use tracing::{Instrument as _, Level, Span};

use crate::escape::{Escaped, EscapedBytes};

/// Longest caller-supplied request id kept for the logs (bytes; the rest is
/// cut).
pub const CLIENT_REQUEST_ID_MAX: usize = 128;

/// The caller's own request id for the logs: `value` (a header's bytes) cut
/// to [`CLIENT_REQUEST_ID_MAX`] bytes and escaped ([`EscapedBytes`]); empty
/// when absent. Client-supplied, so only ever logged, as
/// `client_request_id`: never the service's own id.
#[must_use]
pub fn client_request_id(value: Option<&[u8]>) -> String {
    value.map_or_else(String::new, |b| {
        EscapedBytes(&b[..b.len().min(CLIENT_REQUEST_ID_MAX)]).to_string()
    })
}

/// How one service's envelopes log.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    /// The level of the `request` span: `DEBUG` where a span per request
    /// costs too much at the default `info` level, else `INFO`.
    pub span: Level,
    /// The level of the failure line of a request the server is not at
    /// fault for (server faults are logged at `warn`).
    pub client_failure: Level,
    /// The outcome label of a successful request.
    pub ok: &'static str,
}

/// Where a service counts its requests.
pub trait RequestMetrics {
    /// One request ended: count it by `tenant` (services without tenants
    /// ignore it), `op` and `status` (its outcome), and observe `elapsed`.
    fn request(&self, tenant: &str, op: &str, status: &str, elapsed: Duration);
}

/// A request's failure, as the envelope counts, logs and returns it.
pub trait Failure {
    /// What the caller gets: the error with the request id in it.
    type Reply;
    /// The outcome label (`status`) of the request in metrics and logs.
    fn status(&self) -> Cow<'static, str>;
    /// Whether the server (or what it depends on), not the caller, is at
    /// fault: such failures are logged at `warn`.
    fn server_fault(&self) -> bool;
    /// The message logged (escaped) as `error`.
    fn message(&self) -> Cow<'_, str>;
    /// The reply to the caller, carrying `request_id`.
    fn reply(self, request_id: &str) -> Self::Reply;
}

/// Statuses carry their request id already (they were made with it).
impl Failure for tonic::Status {
    type Reply = tonic::Status;

    fn status(&self) -> Cow<'static, str> {
        Cow::Borrowed(crate::grpc::code_name(self.code()))
    }

    fn server_fault(&self) -> bool {
        matches!(
            self.code(),
            tonic::Code::Internal | tonic::Code::Unavailable
        )
    }

    fn message(&self) -> Cow<'_, str> {
        Cow::Borrowed(tonic::Status::message(self))
    }

    fn reply(self, _request_id: &str) -> tonic::Status {
        self
    }
}

/// What a request is about, for its failure line.
#[derive(Debug, Clone, Copy, Default)]
pub struct About<'a> {
    /// The tenant it runs for (empty: none).
    pub tenant: &'a str,
    /// The operation.
    pub op: &'a str,
    /// The bucket (or `bucket/key`) it names, escaped by the envelope
    /// (empty: none).
    pub object: &'a str,
    /// The caller's process, when known.
    pub pid: Option<i32>,
}

/// One request: see the [module documentation](self).
#[derive(Debug)]
pub struct Envelope {
    id: String,
    client_id: String,
    started: Instant,
    span: Span,
    style: Style,
}

impl Envelope {
    /// A request the service calls `id`, whose caller calls it `client_id`
    /// (from [`client_request_id`]; empty: none), started now. Its span
    /// shows `id`; the service records the other fields
    /// ([`Envelope::record`]): `method`, `path`, `client_request_id`,
    /// `tenant`, `op`, `bucket`.
    #[must_use]
    pub fn new(style: Style, id: String, client_id: String) -> Envelope {
        use tracing::field::Empty;
        let span = if style.span <= Level::INFO {
            tracing::info_span!(
                "request",
                id = %id,
                method = Empty,
                path = Empty,
                client_request_id = Empty,
                tenant = Empty,
                op = Empty,
                bucket = Empty,
            )
        } else {
            tracing::debug_span!(
                "request",
                id = %id,
                method = Empty,
                path = Empty,
                client_request_id = Empty,
                tenant = Empty,
                op = Empty,
                bucket = Empty,
            )
        };
        Envelope {
            id,
            client_id,
            started: Instant::now(),
            span,
            style,
        }
    }

    /// The service's own id of the request.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The caller's id, escaped (empty: none).
    #[must_use]
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// The request's span.
    #[must_use]
    pub fn span(&self) -> &Span {
        &self.span
    }

    /// Time since the request started.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Shows `field` (one of those [`Envelope::new`] names) as `value` in
    /// the span; fields appear in the order they are recorded.
    pub fn record(&self, field: &str, value: impl fmt::Display) -> &Envelope {
        self.span.record(field, tracing::field::display(value));
        self
    }

    /// Shows the caller's id in the span (empty when there is none).
    pub fn record_client_id(&self) -> &Envelope {
        self.record("client_request_id", &self.client_id)
    }

    /// Runs `work` in the request's span.
    pub async fn run<F: Future>(&self, work: F) -> F::Output {
        work.instrument(self.span.clone()).await
    }

    /// Counts the request as `op` with outcome `status` and observes its
    /// latency so far.
    pub fn observe(&self, metrics: &impl RequestMetrics, tenant: &str, op: &str, status: &str) {
        metrics.request(tenant, op, status, self.elapsed());
    }

    /// Ends the request with `result`: counts it and observes its latency
    /// ([`Envelope::observe`]; a success as [`Style::ok`]), logs `done`
    /// (debug, in the span) or the failure line, and returns the result
    /// with the request id on the error.
    ///
    /// # Errors
    /// `result`'s error, as [`Failure::reply`] makes it.
    pub fn finish<T, E: Failure>(
        &self,
        metrics: &impl RequestMetrics,
        about: About<'_>,
        result: Result<T, E>,
    ) -> Result<T, E::Reply> {
        let elapsed = self.elapsed();
        match result {
            Ok(v) => {
                metrics.request(about.tenant, about.op, self.style.ok, elapsed);
                self.span.in_scope(|| tracing::debug!(?elapsed, "done"));
                Ok(v)
            }
            Err(e) => {
                let status = e.status();
                metrics.request(about.tenant, about.op, &status, elapsed);
                let level = if e.server_fault() {
                    Level::WARN
                } else {
                    self.style.client_failure
                };
                self.failure_line(level, about, &status, &e.message());
                Err(e.reply(&self.id))
            }
        }
    }

    /// The failure line, with fields of its own (the span may be off).
    fn failure_line(&self, level: Level, about: About<'_>, status: &str, error: &str) {
        macro_rules! line {
            ($lvl:expr) => {
                tracing::event!(
                    parent: &self.span,
                    $lvl,
                    request_id = %self.id,
                    client_request_id = %self.client_id,
                    tenant = (!about.tenant.is_empty()).then_some(about.tenant),
                    op = about.op,
                    object = (!about.object.is_empty()).then(|| tracing::field::display(Escaped(about.object))),
                    pid = about.pid,
                    status,
                    error = %Escaped(error),
                    "request failed"
                )
            };
        }
        match level {
            Level::ERROR => line!(Level::ERROR),
            Level::WARN => line!(Level::WARN),
            Level::INFO => line!(Level::INFO),
            Level::DEBUG => line!(Level::DEBUG),
            _ => line!(Level::TRACE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Counted(Mutex<Vec<(String, String, String)>>);

    impl RequestMetrics for Counted {
        fn request(&self, tenant: &str, op: &str, status: &str, _elapsed: Duration) {
            self.0
                .lock()
                .unwrap()
                .push((tenant.into(), op.into(), status.into()));
        }
    }

    const STYLE: Style = Style {
        span: Level::DEBUG,
        client_failure: Level::INFO,
        ok: "OK",
    };

    #[test]
    fn client_ids_are_cut_and_escaped() {
        assert_eq!(client_request_id(None), "");
        assert_eq!(client_request_id(Some(b"abc")), "abc");
        assert_eq!(client_request_id(Some(b"a\tb\x9b")), "a\\x09b\\x9b");
        let long = [b'x'; 300];
        assert_eq!(client_request_id(Some(&long)).len(), CLIENT_REQUEST_ID_MAX);
    }

    #[test]
    fn finish_counts_and_returns_the_error() {
        let m = Counted::default();
        let env = Envelope::new(STYLE, "rid-1".into(), String::new());
        assert_eq!(env.id(), "rid-1");
        let about = About {
            tenant: "alice",
            op: "GetObject",
            ..About::default()
        };
        assert_eq!(env.finish(&m, about, Ok::<_, tonic::Status>(7)).unwrap(), 7);
        let e = env
            .finish(
                &m,
                about,
                Err::<(), _>(tonic::Status::not_found("no such key")),
            )
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
        assert_eq!(
            *m.0.lock().unwrap(),
            [
                ("alice".into(), "GetObject".into(), "OK".into()),
                ("alice".into(), "GetObject".into(), "NOT_FOUND".into()),
            ]
        );
    }
}
