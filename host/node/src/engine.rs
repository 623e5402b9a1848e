//! What the engine's subsystems are started with, and the stack that stops
//! them in reverse order.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tracing::{info, warn};

use crate::state::NodeState;

pub type StopFuture = Pin<Box<dyn Future<Output = ()> + Send>>;
pub type StopFn = Box<dyn FnOnce() -> StopFuture + Send>;

/// Engine subsystems in start order; stopped in reverse.
#[derive(Default)]
pub struct Started {
    stack: Vec<(&'static str, StopFn)>,
}

impl Started {
    pub fn push(&mut self, name: &'static str, stop: impl FnOnce() -> StopFuture + Send + 'static) {
        info!(subsystem = name, "started");
        self.stack.push((name, Box::new(stop)));
    }

    pub async fn stop_all(mut self, within: Duration) {
        while let Some((name, stop)) = self.stack.pop() {
            if tokio::time::timeout(within, stop()).await.is_err() {
                warn!(subsystem = name, ?within, "did not stop in time; moving on");
            } else {
                info!(subsystem = name, "stopped");
            }
        }
    }
}

/// Everything an engine subsystem may use. Cheap to clone.
#[derive(Clone)]
pub struct EngineContext {
    pub node_id: String,
    pub config: Arc<crewlet_config::NodeConfig>,
    /// The node's one NATS connection.
    pub client: async_nats::Client,
    pub coord: crewlet_coord::Coord,
    pub store: Arc<crewlet_store::Store>,
    pub publisher: crewlet_observe::Publisher,
    pub state: Arc<NodeState>,
    /// The company this node serves now.
    pub active: crewlet_company::ActiveCompany,
    /// The company's secrets: the fleet's bucket, then this node's env.
    pub secrets: Arc<crate::secrets::Secrets>,
}

/// The engine, for routes bound before it started: empty until it is up.
#[derive(Clone, Default)]
pub struct Late(Arc<OnceLock<EngineContext>>);

impl Late {
    pub fn get(&self) -> Option<&EngineContext> {
        self.0.get()
    }

    pub(crate) fn set(&self, ctx: EngineContext) {
        let _ = self.0.set(ctx);
    }
}
