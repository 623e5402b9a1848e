//! What the engine's subsystems are started with, and the one stack that
//! stops every started part of the node.
//!
//! Rules:
//! - A subsystem gets what it uses from [`EngineContext`] — the company,
//!   the plugins, the secrets, the webhook edge — never from
//!   [`NodeState`], which is the node's view of itself for the probes.
//! - Everything started is pushed on [`Started`], and the node stops by
//!   unwinding it, on a signal and on a failed start alike: the teardown is
//!   written once. The stream is the base everything rides, so it is pushed
//!   with [`Started::push_base`] and stops after everything else, whenever
//!   it started.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crewlet_ingress::Edge;
use tracing::{info, warn};

use crate::state::NodeState;

pub type StopFuture = Pin<Box<dyn Future<Output = ()> + Send>>;
pub type StopFn = Box<dyn FnOnce() -> StopFuture + Send>;

/// Started parts in start order (the base first); stopped in reverse.
#[derive(Default)]
pub struct Started {
    stack: Vec<(&'static str, StopFn)>,
    /// How many parts at the bottom of the stack are the base.
    base: usize,
}

impl Started {
    /// Records a started part; it stops before everything pushed earlier.
    pub fn push(&mut self, name: &'static str, stop: impl FnOnce() -> StopFuture + Send + 'static) {
        info!(subsystem = name, "started");
        self.stack.push((name, Box::new(stop)));
    }

    /// Records a part everything else rides (the stream): it stops after
    /// every part that is not the base, whatever their start order.
    pub fn push_base(
        &mut self,
        name: &'static str,
        stop: impl FnOnce() -> StopFuture + Send + 'static,
    ) {
        info!(subsystem = name, "started");
        self.stack.insert(self.base, (name, Box::new(stop)));
        self.base += 1;
    }

    /// Stops one part now, ahead of the rest (presence leaves the fleet's
    /// membership as the first thing a drain does).
    pub async fn stop_now(&mut self, name: &'static str, within: Duration) {
        if let Some(at) = self.stack.iter().rposition(|(n, _)| *n == name) {
            let (name, stop) = self.stack.remove(at);
            if at < self.base {
                self.base -= 1;
            }
            stop_one(name, stop, within).await;
        }
    }

    /// Stops everything, last started first, the base last. Each part but
    /// the base gets `within`; the base bounds its own stop (the stream
    /// drains for at most a few seconds, then stops its nats-server child),
    /// and cutting it short would leave that child to outlive the node.
    pub async fn stop_all(mut self, within: Duration) {
        while let Some((name, stop)) = self.stack.pop() {
            if self.stack.len() < self.base {
                stop().await;
                info!(subsystem = name, "stopped");
            } else {
                stop_one(name, stop, within).await;
            }
        }
    }
}

async fn stop_one(name: &'static str, stop: StopFn, within: Duration) {
    if tokio::time::timeout(within, stop()).await.is_err() {
        warn!(subsystem = name, ?within, "did not stop in time; moving on");
    } else {
        info!(subsystem = name, "stopped");
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
    /// Posture, phase and the seats' view: what the node shows of itself.
    pub state: Arc<NodeState>,
    /// The company this node serves now, and the epoch it applied.
    pub active: crewlet_company::ActiveCompany,
    /// The `--company` document the node was started with, if any.
    pub company_file: Option<crate::company::CompanyFile>,
    /// The plugins this node loaded (none without `--plugins`).
    pub plugins: Option<Arc<crewlet_catalog::Loaded>>,
    /// The company's secrets: the fleet's bucket, then this node's env.
    pub secrets: Arc<crewlet_secrets::Secrets>,
    /// The fleet's paused seats, mirrored (`None` until first listed).
    pub pauses: tokio::sync::watch::Receiver<Option<crewlet_seats::Pauses>>,
}

impl EngineContext {
    /// A fleet read of the event logs, made from this context.
    pub fn history(&self) -> crewlet_history::Reader {
        crewlet_history::Reader::new(
            self.node_id.clone(),
            self.client.clone(),
            self.coord.roster("node"),
            self.store.clone(),
            self.state.started_at_ms(),
        )
    }

    /// The fleet's views (`/fleet`, `/agents`, a turn's detail).
    pub fn fleet(&self) -> crewlet_fleet::View {
        crewlet_fleet::View::new(
            self.node_id.clone(),
            self.coord.survey(),
            self.client.clone(),
            self.history(),
            self.active.clone(),
            self.pauses.clone(),
        )
    }

    /// Pausing and resuming seats of the company served.
    pub fn seat_pauses(&self) -> crewlet_seats::SeatPauses {
        crewlet_seats::SeatPauses::new(
            self.node_id.clone(),
            self.coord.pauses(),
            self.active.clone(),
        )
    }

    /// The config plane as the operator's requests reach it.
    pub fn config_plane(&self) -> crewlet_configplane::Plane {
        crewlet_configplane::Plane::new(
            self.node_id.clone(),
            self.coord.config_pointer(),
            self.publisher.clone(),
            self.active.clone(),
        )
        .with_hints(self.client.clone())
    }
}

/// The engine for routes bound before it started: empty until it is up.
#[derive(Clone, Default)]
pub struct Late(Arc<OnceLock<Up>>);

struct Up {
    ctx: EngineContext,
    edge: Arc<Edge>,
}

impl Late {
    pub fn get(&self) -> Option<&EngineContext> {
        self.0.get().map(|up| &up.ctx)
    }

    /// The node's webhook edge: one, shared by the webhook routes and the
    /// operator's messages.
    pub fn edge(&self) -> Option<&Arc<Edge>> {
        self.0.get().map(|up| &up.edge)
    }

    pub(crate) fn set(&self, ctx: EngineContext, edge: Arc<Edge>) {
        let _ = self.0.set(Up { ctx, edge });
    }
}
