//! The company's own duties: fleet-wide singletons, each on its own
//! `worker:DUTY` lease in the duties bucket.
//!
//! | duty | lease TTL | work |
//! |---|---|---|
//! | `scheduler` | `duties.scheduler_lease_seconds` (30 s) | [`scheduler`]: the company's schedules |
//! | `maintenance` | three ticks (45 min) | [`maintenance`]: the state log's trim, markers, mailboxes |
//! | `learning` | three ticks (3 h) | [`learning`]: skills induced, aged, promoted |
//!
//! Rules:
//! - Only a node with the `workers` role competes for a duty; every node,
//!   whatever its roles, reads who holds which (every few seconds) and shows
//!   it in `/health` — and says so when no live node has `workers`, so an
//!   unheld duty is never silent.
//! - A duty's TTL comes from its own cadence (never the seat lease TTL) and
//!   is at most the store's ceiling for any duty, `MAX_DUTY_TTL`: the
//!   longest maintenance tick allowed makes the ceiling exactly.
//! - Every node trims its own event log and dispatch history on the
//!   maintenance tick (they are node-local), holder or not.
//! - The duties take only the coordination handles they use ([`Parts`]),
//!   and the model layer through the turn engine's `Brain` port: this
//!   crate reaches neither the plugin runtime nor the node
//!   (`scripts/check-deps.sh`).

pub mod learning;
pub mod maintenance;
pub mod reflection;
pub mod scheduler;
pub mod tenure;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crewlet_config::DutiesConfig;
use crewlet_coord::{Fires, Leases, Owner, Records, Roster, Upkeep};
use crewlet_statelog::PositionBook;
use crewlet_turns::{Brain, Embedder};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{Instrument, info, info_span, warn};

pub use tenure::HeldDuties;
use tenure::{DutyLease, Spec};

/// Every duty this build runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duty {
    Scheduler,
    Maintenance,
    Learning,
}

impl Duty {
    pub const ALL: [Duty; 3] = [Duty::Scheduler, Duty::Maintenance, Duty::Learning];

    pub fn name(self) -> &'static str {
        match self {
            Duty::Scheduler => "scheduler",
            Duty::Maintenance => "maintenance",
            Duty::Learning => "learning",
        }
    }

    /// The lease TTL, from the duty's own cadence.
    pub fn ttl(self, config: &DutiesConfig) -> Duration {
        match self {
            Duty::Scheduler => config.scheduler_lease,
            Duty::Maintenance => config.maintenance_tick * 3,
            Duty::Learning => config.learning_tick * 3,
        }
    }
}

/// How often every node reads who holds the duties.
const VIEW_EVERY: Duration = Duration::from_secs(5);

/// What `/health` shows of the duties.
#[derive(Clone, Default)]
pub struct DutiesView {
    pub held: HeldDuties,
    /// The fleet's duty holders as last read (`None`: not yet read).
    pub fleet: Arc<Mutex<Option<Value>>>,
    pub maintenance: Arc<Mutex<Option<maintenance::LastTick>>>,
    pub workers: bool,
}

impl DutiesView {
    pub fn health(&self) -> Value {
        json!({
            "workers_role": self.workers,
            "held_here": self.held.rows(),
            "fleet": self.fleet.lock().expect("duties view").clone(),
            "maintenance_last_tick": self.maintenance.lock().expect("duties view").clone(),
        })
    }
}

/// What the duties are started with: the coordination handles each duty
/// uses, and nothing else of coordination.
pub struct Parts<B, E> {
    pub node_id: String,
    /// This node's incarnation: the duties' leases are held in its name.
    pub owner: Owner,
    /// The `worker` leases: one per duty, competed for and listed.
    pub leases: Leases,
    /// The `node` leases, read only: which live nodes have `workers`.
    pub nodes: Roster,
    /// The scheduler's fire claims and cursors.
    pub fires: Fires,
    /// The maintenance sweep and the config pointer, read only.
    pub upkeep: Upkeep,
    /// The mailboxes bucket, for the retirement of removed seats'.
    pub mailboxes: Records,
    /// The state log's positions, for its trim.
    pub positions: PositionBook,
    pub js: async_nats::jetstream::Context,
    pub store: std::sync::Arc<crewlet_store::Store>,
    pub publisher: crewlet_observe::Publisher,
    pub active: crewlet_company::ActiveCompany,
    pub config: DutiesConfig,
    /// Whether this node has the `workers` role.
    pub workers: bool,
    /// Whether the node admits triggers now (it does not while it sheds).
    pub eligible: watch::Receiver<bool>,
    /// What the learning duty runs with (`None` without `workers`).
    pub learning: Option<learning::Inputs<B, E>>,
}

/// Why the duties did not start: a handle of the wrong class was wired
/// in (the caller's mistake; nothing was acquired or written).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "the duties were handed the `{given}` leases as their `{wanted}` leases: wire `Coord::{handle}(\"{wanted}\")`"
    )]
    WrongClass {
        given: &'static str,
        wanted: &'static str,
        handle: &'static str,
    },
}

/// The started duties; [`Running::stop`] ends their work, then releases
/// their leases.
pub struct Running {
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    leases: Vec<DutyLease>,
}

impl Running {
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        for l in self.leases {
            l.stop().await;
        }
    }
}

/// Starts the duties this node competes for (with `workers`), its own
/// retention and the fleet view.
pub fn start<B: Brain, E: Embedder>(
    p: Parts<B, E>,
    view: &DutiesView,
) -> Result<Running, StartError> {
    wired(&p.leases, &p.nodes)?;
    let lease = |duty: Duty| {
        DutyLease::start(
            Spec {
                leases: p.leases.clone(),
                owner: p.owner.clone(),
                duty: duty.name(),
                ttl: duty.ttl(&p.config),
            },
            view.held.clone(),
            p.eligible.clone(),
        )
    };
    let (stop_tx, stop) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut leases = Vec::new();
    let mut maintenance_tenure = None;
    if p.workers {
        let scheduler = lease(Duty::Scheduler);
        let work = scheduler::Scheduler {
            node_id: p.node_id.clone(),
            fires: p.fires.clone(),
            js: p.js.clone(),
            store: p.store.clone(),
            publisher: p.publisher.clone(),
            active: p.active.clone(),
        };
        tasks.push(tokio::spawn(
            work.run(scheduler.fence(), stop.clone())
                .instrument(info_span!("scheduler", subsystem = "scheduler")),
        ));
        let maintenance = lease(Duty::Maintenance);
        maintenance_tenure = Some(maintenance.fence());
        let learning = lease(Duty::Learning);
        let (fence, inputs, stop) = (learning.fence(), p.learning, stop.clone());
        tasks.push(tokio::spawn(
            async move {
                let Some(inputs) = inputs else { return };
                match learning::Learning::equip(inputs).await {
                    Ok(work) => work.run(fence, stop).await,
                    Err(e) => warn!(subsystem = "learning", error = %e,
                        "the learning duty cannot open the memory stream; it runs no pass on this node"),
                }
            }
            .instrument(info_span!("learning", subsystem = "learning")),
        ));
        leases.push(scheduler);
        leases.push(maintenance);
        leases.push(learning);
    } else {
        info!(
            subsystem = "duties",
            "this node has no `workers` role: it takes no duty"
        );
    }
    let upkeep = maintenance::Maintenance {
        upkeep: p.upkeep.clone(),
        mailboxes: p.mailboxes.clone(),
        positions: p.positions.clone(),
        owner: p.owner.clone(),
        js: p.js.clone(),
        store: p.store.clone(),
        publisher: p.publisher.clone(),
        active: p.active.clone(),
        config: p.config.clone(),
        last: view.maintenance.clone(),
    };
    tasks.push(tokio::spawn(
        upkeep
            .run(maintenance_tenure, stop.clone())
            .instrument(info_span!("maintenance", subsystem = "maintenance")),
    ));
    tasks.push(tokio::spawn(
        watch_fleet(p.leases.clone(), p.nodes.clone(), view.fleet.clone(), stop)
            .instrument(info_span!("duties", subsystem = "duties")),
    ));
    Ok(Running {
        stop: stop_tx,
        tasks,
        leases,
    })
}

/// Refuses handles of another class than the duties hold and read.
fn wired(leases: &Leases, nodes: &Roster) -> Result<(), StartError> {
    for (given, wanted, handle) in [
        (leases.class(), "worker", "leases"),
        (nodes.class(), "node", "roster"),
    ] {
        if given != wanted {
            return Err(StartError::WrongClass {
                given,
                wanted,
                handle,
            });
        }
    }
    Ok(())
}

/// Reads who holds each duty and which live nodes could, every
/// [`VIEW_EVERY`]; an unreadable store leaves `unknown`, never "unheld".
async fn watch_fleet(
    workers: Leases,
    nodes: Roster,
    out: Arc<Mutex<Option<Value>>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut warned = false;
    loop {
        let view = match fleet_view(&workers, &nodes).await {
            Ok((v, workers_nodes)) => {
                if workers_nodes == 0 && !warned {
                    warn!(
                        subsystem = "duties",
                        "no live node has the `workers` role: no duty runs (no schedule fires, nothing is swept)"
                    );
                }
                warned = workers_nodes == 0;
                v
            }
            Err(e) => {
                json!({ "state": "unknown", "error": e.to_string(), "as_of": jiff::Timestamp::now().to_string() })
            }
        };
        *out.lock().expect("duties view") = Some(view);
        tokio::select! {
            _ = tokio::time::sleep(VIEW_EVERY) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
}

async fn fleet_view(
    workers: &Leases,
    nodes: &Roster,
) -> Result<(Value, usize), crewlet_coord::CoordError> {
    let (workers, nodes) = futures::join!(workers.live(), nodes.live());
    let (workers, nodes) = (workers?, nodes?);
    let workers_nodes = nodes
        .iter()
        .filter(|n| {
            n.status
                .as_ref()
                .is_some_and(|s| s.roles.iter().any(|r| r == "workers"))
        })
        .count();
    let mut duties = serde_json::Map::new();
    for duty in Duty::ALL {
        let held = workers.iter().find(|l| l.name.id() == duty.name());
        let row = match held {
            None => json!({ "state": "unheld" }),
            Some(l) => {
                let node = l.owner.as_str().split('/').next().unwrap_or_default();
                let since = nodes
                    .iter()
                    .filter_map(|n| n.status.as_ref().filter(|_| n.owner == l.owner))
                    .flat_map(|s| s.duties.iter().flatten())
                    .find(|r| r.duty == duty.name() && r.epoch == l.epoch)
                    .and_then(|r| jiff::Timestamp::from_millisecond(r.since_ms).ok())
                    .map(|t| t.to_string());
                json!({
                    "state": "held", "node": node, "epoch": l.epoch, "since": since,
                    "ttl_seconds": l.ttl.as_secs_f64(),
                })
            }
        };
        duties.insert(duty.name().to_owned(), row);
    }
    let warning = (workers_nodes == 0).then_some(
        "no live node has the `workers` role: no duty runs; give a node `workers` in node.roles",
    );
    Ok((
        json!({
            "duties": duties,
            "workers_nodes": workers_nodes,
            "warning": warning,
            "as_of": jiff::Timestamp::now().to_string(),
        }),
        workers_nodes,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crewlet_coord::{Coord, CoordOptions, MAX_DUTY_TTL, Owner};

    /// A handle of the wrong class is the wiring's mistake, named before
    /// anything is acquired.
    #[test]
    fn handles_of_another_class_are_refused() {
        let (_, coord) = Coord::breakable_memory(CoordOptions::new(Owner::incarnation("n1")));
        assert!(wired(&coord.leases("worker"), &coord.roster("node")).is_ok());
        let wrong = wired(&coord.leases("seat"), &coord.roster("node")).unwrap_err();
        assert_eq!(
            wrong.to_string(),
            "the duties were handed the `seat` leases as their `worker` leases: wire `Coord::leases(\"worker\")`"
        );
        assert!(matches!(
            wired(&coord.leases("worker"), &coord.roster("worker")),
            Err(StartError::WrongClass {
                given: "worker",
                wanted: "node",
                ..
            })
        ));
    }

    /// The store's ceiling for any duty is the longest TTL a duty can ask
    /// for: neither moves without the other.
    #[test]
    fn the_longest_duty_ttl_is_the_ceiling() {
        let longest = DutiesConfig {
            maintenance_tick: Duration::from_secs(
                crewlet_config::duties::MAX_MAINTENANCE_TICK_SECONDS,
            ),
            scheduler_lease: Duration::from_secs(600),
            learning_tick: Duration::from_secs(
                crewlet_config::duties::MAX_MAINTENANCE_TICK_SECONDS,
            ),
            ..DutiesConfig::default()
        };
        let max = Duty::ALL.iter().map(|d| d.ttl(&longest)).max().unwrap();
        assert_eq!(max, MAX_DUTY_TTL);
        let defaults = DutiesConfig::default();
        assert_eq!(Duty::Scheduler.ttl(&defaults), Duration::from_secs(30));
        assert_eq!(
            Duty::Maintenance.ttl(&defaults),
            Duration::from_secs(45 * 60)
        );
    }
}
