//! What a module publishes: an event of the company's log, of kind
//! `module.NAME.TOPIC` (the host built the kind from the module's name and
//! a topic its manifest declares), recorded on this node and broadcast on
//! the events stream like every other event — so `/events` and
//! `/ws/stream` show it, and other modules subscribe to it by kind.
//!
//! A payload that is JSON is the event's payload as it is; anything else
//! is carried as `{"text": …}` (lossy UTF-8), so the log stays JSON.

use crewlet_plugins::module::{ModuleBus, NotTaken};
use crewlet_plugins::state::BoxFuture;
use crewlet_store::Party;

/// The node's bus for modules: the observe publisher.
pub struct NodeBus(pub crewlet_observe::Publisher);

impl ModuleBus for NodeBus {
    fn publish<'a>(
        &'a self,
        kind: &'a str,
        payload: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), NotTaken>> {
        Box::pin(async move {
            let value = serde_json::from_slice(&payload).unwrap_or_else(
                |_| serde_json::json!({ "text": String::from_utf8_lossy(&payload) }),
            );
            let mut ev = self.0.event(kind, value);
            if let Some(module) = kind.split('.').nth(1) {
                ev.parties.push(Party {
                    party: format!("module:{module}"),
                    role: "module".into(),
                });
            }
            self.0
                .publish(ev)
                .await
                .map(drop)
                .map_err(|e| NotTaken { why: e.to_string() })
        })
    }
}
