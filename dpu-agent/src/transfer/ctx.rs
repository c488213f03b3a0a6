//! [`Ctx`]: one tenant request on one bucket, over the bucket's targets.

use std::sync::Arc;

use super::dialect::{ChunkMover, dialect_for};
use super::exchange::Exchange;
use super::{Core, Tenant};
use crate::error::AgentError;
use crate::qp_link::QpLink;
use crate::s3::TargetClient;

/// One tenant request on one bucket, bound to the bucket's target (for a
/// group: the one of the object's first chunk), with every target of the
/// group ready for its chunks.
///
/// Where its behaviour lives:
/// - talking to its target (an attempt, what a failed reply means, the
///   retry loop under the attempt timeout): [`Exchange`], `ctx.ex`, in
///   [`super::exchange`];
/// - how a chunk or a part moves in the target's dialect (its token, a
///   GET chunk or a PUT outside HTTP, whether a GET needs the size first):
///   [`ChunkMover`], `ctx.dialect`, chosen once per target of the group
///   when the request starts ([`Ctx::new`], [`dialect_for`] in
///   [`super::dialect`]);
/// - which target of the group a chunk goes to: [`Ctx::for_chunk`]
///   (rendezvous ranking and cool-down: [`Core::pick`]);
/// - the operations, free functions over a `Ctx`: GetObject
///   [`super::get::get_object`], PutObject [`super::put::put_object`];
///   HeadObject, ListObjects and DeleteObject need only the exchange
///   ([`super::meta`]);
/// - bytes through the agent's staging memory when a target speaks plain
///   HTTP: [`super::fallback`].
#[derive(Debug, Clone)]
pub struct Ctx {
    /// This request at its target.
    pub ex: Arc<Exchange>,
    /// That target's dialect.
    pub dialect: Arc<dyn ChunkMover>,
    /// The targets serving the bucket (`ex`'s among them).
    group: Arc<[Arc<TargetClient>]>,
    /// This request at each target of `group` (same order) and its dialect.
    legs: Arc<[Leg]>,
}

/// This request at one target, and the target's dialect.
type Leg = (Arc<Exchange>, Arc<dyn ChunkMover>);

impl Ctx {
    /// A request of `tenant` on `bucket` (and `key`: with a group of
    /// targets, the request starts at the target of the object's first
    /// chunk), from a shim with `qp_link` (its `QueuePairs` link, if it
    /// opened one).
    ///
    /// # Errors
    /// [`AgentError::NoTarget`].
    pub fn new(
        core: &Arc<Core>,
        tenant: &Arc<Tenant>,
        bucket: &str,
        key: &str,
        request_id: &str,
        qp_link: Option<&Arc<QpLink>>,
    ) -> Result<Ctx, AgentError> {
        let group = core.group_for(bucket)?;
        let legs: Arc<[Leg]> = group
            .iter()
            .map(|target| {
                let ex = Arc::new(Exchange {
                    core: Arc::clone(core),
                    tenant: Arc::clone(tenant),
                    target: Arc::clone(target),
                    request_id: request_id.to_owned(),
                });
                (ex, dialect_for(target, qp_link))
            })
            .collect();
        let first = core.pick(&group, bucket, key, 0);
        let (ex, dialect) = Self::leg(&group, &legs, &first);
        Ok(Ctx {
            ex,
            dialect,
            group,
            legs,
        })
    }

    /// The leg of `target` (a member of `group`).
    fn leg(group: &[Arc<TargetClient>], legs: &[Leg], target: &Arc<TargetClient>) -> Leg {
        let i = group
            .iter()
            .position(|t| Arc::ptr_eq(t, target))
            .unwrap_or(0);
        let (ex, dialect) = &legs[i];
        (Arc::clone(ex), Arc::clone(dialect))
    }

    /// This request bound to the target of chunk `index` of `bucket`/`key`
    /// in its group (itself when that is its target).
    #[must_use]
    pub fn for_chunk(self: &Arc<Self>, bucket: &str, key: &str, index: u64) -> Arc<Ctx> {
        let t = self.ex.core.pick(&self.group, bucket, key, index);
        if Arc::ptr_eq(&t, &self.ex.target) {
            return Arc::clone(self);
        }
        let (ex, dialect) = Self::leg(&self.group, &self.legs, &t);
        Arc::new(Ctx {
            ex,
            dialect,
            group: Arc::clone(&self.group),
            legs: Arc::clone(&self.legs),
        })
    }
}
