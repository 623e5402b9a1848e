//! The `data` role on the running node: where this node's events go, and
//! whether the fleet has anywhere to keep them.
//!
//! A node with `data` keeps its own event log and runs the custody keeper
//! ([`crate::custody`]), taking the batches of nodes without it. A
//! node without `data` keeps no log: its publisher batches its events onto
//! `CREWLET_CUSTODY` (`crewlet_observe::Publisher::stateless`). Every node
//! reads presence every [`VIEW_EVERY`] and says on `/health` `custody`
//! how many live data nodes there are; none is a warning on every node,
//! since a stateless node's events then wait on the stream, kept nowhere
//! (and a fleet of such nodes has no history at all). Presence that cannot
//! be read is `unknown`, never "no data node".

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::custody::{Keeper, KeeperStats};
use crewlet_coord::Survey;
use crewlet_os::Stoppable;
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{Instrument, info, warn};

/// How often the count of live data nodes is read.
pub const VIEW_EVERY: Duration = Duration::from_secs(2);

/// The warning every node shows while no live node has `data`.
pub const NO_DATA_NODE: &str = "no live node has the `data` role: the events of nodes without it wait on CREWLET_CUSTODY and no log keeps them, and fleet history reads find nothing of them; give a node `data` in node.roles";

/// What `/health` `custody` shows.
#[derive(Clone)]
pub struct CustodyView {
    data: bool,
    fleet: Arc<Mutex<Value>>,
    keeper: Option<Arc<KeeperStats>>,
}

impl CustodyView {
    pub fn health(&self) -> Value {
        let mut v = self.fleet.lock().expect("custody view").clone();
        v["data"] = json!(self.data);
        v["keeps_own_log"] = json!(self.data);
        if let Some(k) = &self.keeper {
            v["keeper"] = k.view();
        }
        v
    }
}

/// What the custody part is started with (plain parts: this module sits
/// below the engine, which the node state it feeds also sits below).
pub struct Parts {
    pub node_id: String,
    pub data: bool,
    pub store: Arc<crewlet_store::Store>,
    pub coord: crewlet_coord::Coord,
    pub client: async_nats::Client,
}

/// The keeper (on a data node) and the fleet count, running.
pub struct Running {
    keeper: Option<Stoppable>,
    fleet: Stoppable,
}

impl Running {
    pub async fn stop(self) {
        self.fleet.stop().await;
        if let Some(keeper) = self.keeper {
            keeper.stop().await;
        }
    }
}

/// Starts the keeper (on a data node) and the fleet count (on every node).
pub fn start(p: Parts) -> (CustodyView, Running) {
    let (keeper, stats) = if p.data {
        let keeper = Keeper::new(p.node_id.clone(), p.store.clone(), p.coord.custody());
        let stats = keeper.stats();
        let js = async_nats::jetstream::new(p.client.clone());
        (Some(crate::custody::start(keeper, js)), Some(stats))
    } else {
        (None, None)
    };
    let fleet = Arc::new(Mutex::new(
        json!({ "data_nodes": null, "state": "unknown" }),
    ));
    let survey = p.coord.survey();
    let watched = fleet.clone();
    let fleet_task =
        Stoppable::spawn(|stopped| watch_fleet(survey, p.data, watched, stopped).in_current_span());
    let view = CustodyView {
        data: p.data,
        fleet,
        keeper: stats,
    };
    (
        view,
        Running {
            keeper,
            fleet: fleet_task,
        },
    )
}

async fn watch_fleet(
    survey: Survey,
    data: bool,
    out: Arc<Mutex<Value>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut warned = false;
    loop {
        let view = match survey.live("node").await {
            Ok(nodes) => {
                let mut ids: Vec<String> = nodes
                    .iter()
                    .filter(|n| {
                        n.status
                            .as_ref()
                            .is_some_and(|s| s.roles.iter().any(|r| r == "data"))
                    })
                    .map(|n| n.name.id().to_owned())
                    .collect();
                // This node counts before its first presence row lands.
                let none = ids.is_empty() && !data;
                if none && !warned {
                    warn!(subsystem = "custody", "{NO_DATA_NODE}");
                } else if !none && warned {
                    info!(subsystem = "custody", nodes = ?ids, "a live data node keeps the fleet's events again");
                }
                warned = none;
                ids.sort();
                json!({
                    "state": "known",
                    "data_nodes": ids.len().max(usize::from(data)),
                    "data_node_ids": ids,
                    "warning": none.then_some(NO_DATA_NODE),
                })
            }
            Err(e) => json!({ "state": "unknown", "data_nodes": null, "error": e.to_string() }),
        };
        *out.lock().expect("custody view") = view;
        tokio::select! {
            _ = tokio::time::sleep(VIEW_EVERY) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
}
