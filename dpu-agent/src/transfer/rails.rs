//! A request's fabric rails: the same window minted on each of the calling
//! shim's rails (`destination` / `source` is rail 0, `*_rails` the
//! others), checked here ([`RailSet::parse`]), and the agent-wide rail
//! state ([`RailBook`], over the pure selector [`s3dma_wire::rails`]).
//!
//! Every chunk of a GET and part of a PUT of a request with rails runs
//! through [`RailBook::run`]: it picks a rail (least load over measured
//! rate, a down rail as a failback trial once due), slices THAT rail's
//! token and runs the transfer; when the transfer fails in a way that
//! names the fabric ([`names_rail`]: the target's `500
//! RDMATransferFailed`, a fabric connect or operation error of the agent's
//! own fallback, a timeout of the attempt) the rail is marked down and the
//! chunk is redone on another rail, after the failed attempt's reply came
//! back (the target's session over that rail is then dead). Those redos
//! do not count against the request's retry budget: while other rails
//! remain, an attempt failing on its rail ends at once ("fast"); the last
//! run, once every rail was tried, has the normal retries. So no request
//! fails while one of its rails works.
//!
//! A request without rails never comes here: single-rail behaviour is
//! what it was. Rails carry fabric traffic only: the agent's S3 link to a
//! target is its URL's route.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use fabric::RdmaToken;
use s3dma_wire::rails::{Change, MAX_RAILS, Rails, Ticket};

use super::Core;
use crate::error::{AgentError, BadRequest};

/// The rails of one request: rail 0 first, each a token for the same
/// slice (same size) on its own endpoint.
#[derive(Debug, Clone)]
pub struct RailSet {
    tokens: Vec<RdmaToken>,
    keys: Vec<SocketAddr>,
    labels: Vec<String>,
}

fn bad(field: String, reason: String) -> AgentError {
    AgentError::InvalidArgument(BadRequest::Rail { field, reason })
}

impl RailSet {
    /// The rails of a request whose rail-0 token is `first` (field
    /// `first_field`) and whose other rails' tokens are `rails` (field
    /// `field`); `None` without other rails.
    ///
    /// # Errors
    /// [`AgentError::InvalidArgument`] naming the field: more than
    /// [`MAX_RAILS`] rails, a token that does not parse, names no
    /// endpoint, differs in size from `first`, or names an endpoint an
    /// earlier rail names.
    pub fn parse(
        first_field: &str,
        first: &RdmaToken,
        field: &str,
        rails: &[String],
    ) -> Result<Option<Arc<RailSet>>, AgentError> {
        if rails.is_empty() {
            return Ok(None);
        }
        if rails.len() + 1 > MAX_RAILS {
            return Err(bad(
                field.to_owned(),
                format!(
                    "{} rails with {first_field}: at most {MAX_RAILS} in all",
                    rails.len() + 1
                ),
            ));
        }
        let key = |name: &str, t: &RdmaToken| {
            t.endpoint().map(|e| e.addr).map_err(|e| {
                bad(
                    name.to_owned(),
                    format!("the token names no fabric endpoint: {e}"),
                )
            })
        };
        let mut set = RailSet {
            tokens: vec![*first],
            keys: vec![key(first_field, first)?],
            labels: Vec::new(),
        };
        for (i, text) in rails.iter().enumerate() {
            let name = format!("{field}[{i}]");
            let t = text.parse::<RdmaToken>().map_err(|e| {
                AgentError::InvalidArgument(BadRequest::Token {
                    field: name.clone(),
                    reason: e.to_string(),
                })
            })?;
            if t.size != first.size {
                return Err(bad(
                    name,
                    format!(
                        "a window of {} bytes, but {first_field}'s is {} bytes (every rail's token is the same slice)",
                        t.size, first.size
                    ),
                ));
            }
            let k = key(&name, &t)?;
            if set.keys.contains(&k) {
                return Err(bad(
                    name,
                    format!(
                        "names the endpoint {k}, which an earlier rail names (rails are distinct endpoints)"
                    ),
                ));
            }
            set.tokens.push(t);
            set.keys.push(k);
        }
        set.labels = set.keys.iter().map(ToString::to_string).collect();
        Ok(Some(Arc::new(set)))
    }

    /// How many rails (at least 2).
    #[must_use]
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Never: a set has at least two rails.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The token of rail `i`.
    #[must_use]
    pub fn token(&self, i: usize) -> Option<&RdmaToken> {
        self.tokens.get(i)
    }
}

/// Whether `e` is a failure of the fabric path (the rail) rather than of
/// the request or its target: the target's `RDMATransferFailed` with a
/// 5xx status (it could not reach or lost the tenant's endpoint), or the
/// agent's own fabric error (a fallback's connect, write or read; an
/// attempt that timed out on its rail).
#[must_use]
pub fn names_rail(e: &AgentError) -> bool {
    match e {
        AgentError::S3(s) => s.code == "RDMATransferFailed" && s.http_status >= 500,
        AgentError::Fabric { .. } => true,
        _ => false,
    }
}

/// The state of every rail the agent has used (keyed by the endpoint a
/// token names), shared by all requests.
#[derive(Debug, Default)]
pub struct RailBook {
    rails: Mutex<Rails<SocketAddr>>,
}

/// A ticket given back as released when the transfer's future is dropped
/// (a cancelled request).
struct Held<'a> {
    book: &'a RailBook,
    ticket: Option<Ticket<SocketAddr>>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.book.with(|r| r.released(&t, Instant::now()));
        }
    }
}

impl RailBook {
    fn with<T>(&self, f: impl FnOnce(&mut Rails<SocketAddr>) -> T) -> T {
        f(&mut self.rails.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The token of the first rail of `set` that is up (rail 0 when none
    /// is): for transfers that cannot be redone one by one (a target's
    /// batch request, whose failed items go as single requests).
    #[must_use]
    pub fn first_up(&self, set: &RailSet) -> RdmaToken {
        self.with(|r| {
            set.keys
                .iter()
                .position(|k| r.is_up(k))
                .map_or(set.tokens[0], |i| set.tokens[i])
        })
    }

    /// Runs the transfer of the bytes `span` (offset, length) of the
    /// window over a rail of `set` (`op`: `get` or `put`, a metric label):
    /// `transfer(slot, fast)` moves them through `slot` (that rail's
    /// token, sliced) and says how many bytes it moved; `fast`: other
    /// rails remain, so a failure on this rail should end the attempt at
    /// once instead of being retried. A failure naming the rail
    /// ([`names_rail`]) marks it down and runs the transfer again on
    /// another rail, after `late_writes` when the failed transfer may
    /// still write its slice for that long
    /// ([`super::dialect::ChunkMover::late_writes`]); once every rail was
    /// tried, the last run (not fast) has the normal retries.
    ///
    /// # Errors
    /// The transfer's error.
    pub async fn run<T, F, Fut>(
        &self,
        core: &Core,
        set: &RailSet,
        op: &'static str,
        span: (u64, u64),
        late_writes: Option<Duration>,
        mut transfer: F,
    ) -> Result<(T, u64), AgentError>
    where
        F: FnMut(RdmaToken, bool) -> Fut,
        Fut: Future<Output = Result<(T, u64), AgentError>>,
    {
        let m = &core.metrics;
        let (offset, len) = span;
        let mut tried: Vec<SocketAddr> = Vec::with_capacity(set.len());
        loop {
            let (ticket, fast) = self.with(|r| {
                match r.pick(&set.keys, &tried, len, Instant::now()) {
                    Some(t) => {
                        let fast = tried.len() + 1 < set.len();
                        (Some(t), fast)
                    }
                    // Every rail failed this transfer once: the last run
                    // on whichever rail is picked now, with retries.
                    None => (r.pick(&set.keys, &[], len, Instant::now()), false),
                }
            });
            for k in self.with(|r| r.take_forgotten()) {
                m.forget_rail(&k.to_string());
            }
            let Some(ticket) = ticket else {
                return Err(AgentError::internal("a rail set without rails"));
            };
            let i = ticket.index;
            let label = set.labels[i].as_str();
            let slot = set.tokens[i]
                .slice(offset, len)
                .map_err(|e| AgentError::internal_from("a slice of a rail's window", e))?;
            let mut held = Held {
                book: self,
                ticket: Some(ticket),
            };
            let res = transfer(slot, fast).await;
            let Some(ticket) = held.ticket.take() else {
                return Err(AgentError::internal("a rail ticket went missing"));
            };
            drop(held);
            let now = Instant::now();
            match res {
                Ok((v, moved)) => {
                    let (change, up) = self.with(|r| {
                        let change = r.succeeded(&ticket, now);
                        (change, r.is_up(&ticket.rail))
                    });
                    if change == Change::CameUp {
                        tracing::info!(rail = %label, op, "a fabric rail carried a transfer again: marked up");
                    }
                    m.rail_up(label, up);
                    m.rail_operation(label, op, "ok");
                    m.rail_bytes(label, op, moved);
                    return Ok((v, moved));
                }
                Err(e) if names_rail(&e) => {
                    let change = self.with(|r| r.failed(&ticket, now));
                    if change == Change::WentDown {
                        m.rail_up(label, false);
                        tracing::warn!(rail = %label, op, error = %s3dma_service::Escaped(&e.to_string()), "a fabric rail failed a transfer: marked down, its work goes to the other rails");
                    }
                    m.rail_operation(label, op, "failed");
                    if !fast {
                        return Err(e);
                    }
                    m.rail_redone(label, op);
                    tried.push(ticket.rail);
                    // The failed transfer may still write its slice for a
                    // while (a DC write retrying): the redo waits it out.
                    if let Some(wait) = late_writes {
                        tracing::debug!(rail = %label, op, ?wait, "waiting out the failed transfer's late writes before the redo");
                        tokio::time::sleep(wait).await;
                    }
                }
                Err(e) => {
                    self.with(|r| r.released(&ticket, now));
                    m.rail_operation(label, op, "error");
                    return Err(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(ip: [u8; 4], port: u16, size: u32) -> String {
        let t = RdmaToken::new(
            s3dma_wire::EndpointAddr {
                addr: SocketAddr::from((ip, port)),
                responder: 1,
            },
            s3dma_wire::RemoteBuf {
                addr: 0x1000,
                len: u64::from(size),
                rkey: 7,
            },
        )
        .unwrap();
        t.to_string()
    }

    fn first() -> RdmaToken {
        tok([127, 0, 0, 1], 7000, 4096).parse().unwrap()
    }

    fn refused(rails: &[String]) -> String {
        match RailSet::parse("destination", &first(), "destination_rails", rails) {
            Err(AgentError::InvalidArgument(b)) => b.to_string(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rails_are_checked_naming_the_field() {
        assert!(
            RailSet::parse("destination", &first(), "destination_rails", &[])
                .unwrap()
                .is_none()
        );
        let two = RailSet::parse(
            "destination",
            &first(),
            "destination_rails",
            &[tok([127, 0, 0, 2], 7000, 4096)],
        )
        .unwrap()
        .unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two.labels, ["127.0.0.1:7000", "127.0.0.2:7000"]);

        let e = refused(&["nope".into()]);
        assert!(e.starts_with("destination_rails[0] is not a valid"), "{e}");
        let e = refused(&[
            tok([127, 0, 0, 2], 7000, 4096),
            tok([127, 0, 0, 3], 1, 8192),
        ]);
        assert!(
            e.starts_with("destination_rails[1]: a window of 8192 bytes"),
            "{e}"
        );
        let e = refused(&[tok([127, 0, 0, 1], 7000, 4096)]);
        assert!(
            e.starts_with("destination_rails[0]: names the endpoint"),
            "{e}"
        );
        let nine: Vec<String> = (2..10).map(|i| tok([127, 0, 0, i], 7000, 4096)).collect();
        let e = refused(&nine);
        assert!(e.starts_with("destination_rails: 9 rails"), "{e}");
        // Eight in all is fine.
        assert!(
            RailSet::parse("destination", &first(), "destination_rails", &nine[..7])
                .unwrap()
                .is_some()
        );
        // A token without an endpoint (no gid).
        let mut t = first();
        t.gid_valid = false;
        let e = refused(&[t.to_string()]);
        assert!(e.contains("names no fabric endpoint"), "{e}");
    }

    #[test]
    fn fabric_failures_name_the_rail() {
        let s3 = |code: &str, status: u16| {
            AgentError::S3(crate::error::S3Error {
                code: code.into(),
                message: String::new(),
                request_id: String::new(),
                http_status: status,
            })
        };
        assert!(names_rail(&s3("RDMATransferFailed", 500)));
        assert!(!names_rail(&s3("RDMATransferFailed", 400)));
        assert!(!names_rail(&s3("InternalError", 500)));
        assert!(names_rail(&AgentError::Fabric {
            message: "x".into(),
            source: None,
        }));
        assert!(!names_rail(&AgentError::unavailable("x")));
    }
}
