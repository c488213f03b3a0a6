//! The agent's integration tests use the shared end-to-end harness in
//! `s3dma-launcher` (feature `harness`), which host-shim's tests use too.

pub(crate) use s3dma_launcher::harness::*;

/// A storage-target with alice's bucket (`alice-data`), an agent on it
/// (its spec changed by `tweak`) and a test shim with the right token.
pub(crate) async fn alice_stack(tweak: impl FnOnce(&mut AgentSpec)) -> (Target, Agent, Shim) {
    let target = Target::start(true);
    target.create_bucket("alice-data").await;
    let mut spec = AgentSpec::one(&target);
    tweak(&mut spec);
    let agent = Agent::start(spec);
    let shim = agent.client().await;
    (target, agent, shim)
}
