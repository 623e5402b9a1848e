//! The `bus` import: a module publishes an event on one of its own topics.
//!
//! Rules, and why: the topic must be one the manifest `publishes` (a module
//! reaches no subject it was not given), the payload at most
//! [`MAX_PUBLISH_BYTES`] (an event row is stored on every node), and the
//! kind is built here as `module.<name>.<topic>`, never by the guest. Each
//! refusal is logged with its reason and returned as a value the guest can
//! handle, never a trap; a bus that does not take the event answers
//! `unavailable` with why.

use crate::bindings::module::crewlet::plugin::bus::{self, PublishError};
use crate::sandbox::Sandbox;

use super::NotTaken;
use super::ctx::ModuleCtx;

/// The largest payload a module may publish, in bytes.
pub const MAX_PUBLISH_BYTES: usize = 256 * 1024;

impl bus::Host for Sandbox<ModuleCtx> {
    async fn publish(&mut self, topic: String, payload: Vec<u8>) -> Result<(), PublishError> {
        let waits = self.host_waits();
        let ctx = &self.world;
        if !ctx.publishes.contains(&topic) {
            tracing::warn!(plugin = %ctx.plugin, topic, "publish refused: the topic is not declared (add it to `publishes` in [module])");
            return Err(PublishError::Undeclared(topic));
        }
        if payload.len() > MAX_PUBLISH_BYTES {
            tracing::warn!(plugin = %ctx.plugin, topic, bytes = payload.len(), "publish refused: the payload is larger than {MAX_PUBLISH_BYTES} bytes");
            return Err(PublishError::TooLarge(payload.len() as u64));
        }
        let kind = crewlet_bus::module_topic_kind(&ctx.plugin, &topic);
        let published = waits
            .wait_for(ctx.bus.publish(&kind, payload))
            .await
            .unwrap_or_else(|why| {
                Err(NotTaken {
                    why: format!("the bus gave {why}"),
                })
            });
        published.map_err(|NotTaken { why }| {
            tracing::warn!(plugin = %ctx.plugin, kind, "publish failed: the bus did not take the event: {why}");
            PublishError::Unavailable(why)
        })
    }
}
