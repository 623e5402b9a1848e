//! `worker:maintenance`, and this node's own retention, on one tick.
//!
//! Rules:
//! - **Fleet-wide work runs on the duty's holder only**: the state log's
//!   trim (`crewlet_statelog::trim`), the removal-marker
//!   sweep (`coordination_markers`: markers older than three hours, from
//!   every ageless bucket; a bucket that fails is retried next tick) and the
//!   retirement of removed seats' mailboxes (a seat out of the active
//!   company is stamped absent, and after the grace its durable consumer is
//!   deleted and its record marked retired — each change a compare-and-set;
//!   a seat put back re-registers when the company is applied, and one
//!   stamped while it was away is made active again). Nothing is stamped or
//!   retired while this node serves no company (everything would look
//!   removed) or a revision behind the fleet's pointer (a returning seat
//!   would look removed).
//! - **This node's own retention runs on every node**, holder or not: the
//!   event log and `scheduled_runs` are node-local (a peer's singleton
//!   cannot reach them), so each node trims its own, in bounded batches so
//!   the event writer gets the database between them.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crewlet_config::DutiesConfig;
use crewlet_coord::{Fence, FenceEpoch, MARKER_RETENTION, Owner, Records, Upkeep};
use crewlet_statelog::PositionBook;
use serde::Serialize;
use serde_json::json;
use tokio::sync::watch;
use tracing::{info, warn};

/// Rows deleted per transaction by the retention sweeps.
const TRIM_BATCH: usize = 500;

/// Test knob: sweep markers younger than three hours. Lowering it outside
/// a test breaks the rule it exists for (nothing that read a record before
/// it was removed may still act on that read when its marker goes).
pub const MARKER_RETENTION_ENV: &str = "CREWLET_MARKER_RETENTION_SECONDS";

/// What the last tick did on this node, for `/health`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LastTick {
    pub at: String,
    /// Present when this node held the duty and did the fleet's work.
    pub fleet: Option<serde_json::Value>,
    pub events_deleted: usize,
    pub scheduled_runs_deleted: usize,
    pub error: Option<String>,
}

#[derive(Clone)]
pub struct Maintenance {
    pub upkeep: Upkeep,
    /// The mailboxes bucket's records.
    pub mailboxes: Records,
    /// The state log's positions and pins, for its trim.
    pub positions: PositionBook,
    /// This node's incarnation, named as the trim's author.
    pub owner: Owner,
    pub js: async_nats::jetstream::Context,
    pub store: Arc<crewlet_store::Store>,
    pub publisher: crewlet_observe::Publisher,
    pub active: crewlet_company::ActiveCompany,
    pub config: DutiesConfig,
    pub last: Arc<Mutex<Option<LastTick>>>,
}

impl Maintenance {
    /// Ticks until `stop`. `tenure` is `None` on a node without `workers`
    /// (it trims its own tables and never does the fleet's work).
    pub async fn run(
        self,
        tenure: Option<watch::Receiver<Option<Fence>>>,
        mut stop: watch::Receiver<bool>,
    ) {
        let marker_age = marker_retention();
        let mut next = Instant::now() + Duration::from_secs(1);
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next.into()) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            next = Instant::now() + self.config.maintenance_tick;
            let epoch = tenure
                .as_ref()
                .and_then(|rx| rx.borrow().as_ref().and_then(Fence::admitted));
            let fleet = match epoch {
                Some(epoch) => Some(self.fleet_pass(epoch, marker_age).await),
                None => None,
            };
            let (events_deleted, scheduled_runs_deleted, error) = self.trim().await;
            *self.last.lock().expect("maintenance view") = Some(LastTick {
                at: jiff::Timestamp::now().to_string(),
                fleet,
                events_deleted,
                scheduled_runs_deleted,
                error,
            });
        }
    }

    /// The holder's share: markers, then mailboxes.
    async fn fleet_pass(&self, epoch: FenceEpoch, marker_age: Duration) -> serde_json::Value {
        let began = Instant::now();
        let sweep = self.upkeep.sweep_markers_older_than(marker_age).await;
        let swept: usize = sweep.swept.values().sum();
        // A holder a revision behind the fleet would stamp a seat the new
        // revision brought back: mailboxes wait until it serves the
        // pointer's revision (a record moved meanwhile loses its
        // compare-and-set, and a stamp that slipped through is undone by
        // the next pass).
        let active = self.active.current();
        let serves_pointer = match (&active, self.upkeep.active_config().await) {
            (Some(a), Ok(crewlet_coord::Pointer::Set { epoch, .. })) => {
                a.applied_epoch() == Some(epoch)
            }
            _ => false,
        };
        let retire = match active {
            None => json!({ "skipped": "this node serves no company yet" }),
            Some(_) if !serves_pointer => {
                json!({ "skipped": "this node does not serve the fleet's active revision yet" })
            }
            Some(active) => {
                let names: BTreeSet<String> = active
                    .company
                    .handles()
                    .map(|h| h.as_str().to_owned())
                    .collect();
                let now_ms = jiff::Timestamp::now().as_millisecond();
                let r = crewlet_stream::retire_mailboxes(
                    &self.js,
                    &self.mailboxes,
                    &names,
                    now_ms,
                    self.config.mailbox_grace,
                )
                .await;
                match r {
                    Ok(r) => {
                        json!({ "stamped": r.stamped, "retired": r.retired, "restored": r.restored, "failed": r.failed })
                    }
                    Err(e) => {
                        warn!(subsystem = "maintenance", error = %e, "mailboxes not listed; retiring none this tick");
                        json!({ "error": e.to_string() })
                    }
                }
            }
        };
        // The state log's trim: the usage log down to the lowest position
        // every counted data node and pin holds (never by a clock).
        let by = self.owner.as_str().to_owned();
        let statelog_trim = match crewlet_statelog::trim::trim(
            &self.js,
            &self.positions,
            &crewlet_statelog::usage::Usage,
            &by,
        )
        .await
        {
            Ok(t) => json!(t),
            Err(e) => {
                warn!(subsystem = "maintenance", error = %e, "state log not trimmed this tick");
                json!({ "error": e.to_string() })
            }
        };
        let report = json!({
            "epoch": epoch,
            "statelog_trim": statelog_trim,
            "markers_swept": sweep.swept.iter().map(|(b, n)| (b.short(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
            "markers_failed": sweep.failed.iter().map(|(b, e)| (b.short(), e.clone())).collect::<std::collections::BTreeMap<_, _>>(),
            "mailboxes": retire,
            "took_ms": began.elapsed().as_millis() as u64,
        });
        info!(
            subsystem = "maintenance",
            epoch = %epoch,
            markers = swept,
            "coordination_markers swept"
        );
        let ev = self.publisher.event("maintenance_pass", report.clone());
        let _ = self.publisher.record(ev).await;
        report
    }

    /// This node's own tables.
    async fn trim(&self) -> (usize, usize, Option<String>) {
        let now = jiff::Timestamp::now().as_millisecond();
        let cut = |d: Duration| now - d.as_millis() as i64;
        let (events_cut, runs_cut) = (
            cut(self.config.event_retention),
            cut(self.config.scheduled_runs_retention),
        );
        let store = self.store.clone();
        let done = tokio::task::spawn_blocking(move || {
            let events = store.trim_events_before(events_cut, TRIM_BATCH)?;
            let runs = store.trim_scheduled_runs_before(runs_cut, TRIM_BATCH)?;
            Ok::<_, crewlet_store::StoreError>((events, runs))
        })
        .await;
        match done {
            Ok(Ok((events, runs))) => {
                if events + runs > 0 {
                    info!(
                        subsystem = "maintenance",
                        events,
                        scheduled_runs = runs,
                        "retention trimmed this node's tables"
                    );
                }
                (events, runs, None)
            }
            Ok(Err(e)) => {
                warn!(subsystem = "maintenance", error = %e, "retention failed; retrying next tick");
                (0, 0, Some(e.to_string()))
            }
            Err(e) => (0, 0, Some(e.to_string())),
        }
    }
}

fn marker_retention() -> Duration {
    match std::env::var(MARKER_RETENTION_ENV)
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    {
        Some(s) if s >= 0.0 && s.is_finite() => {
            let d = Duration::from_secs_f64(s);
            warn!(subsystem = "maintenance", retention = ?d, "{MARKER_RETENTION_ENV} is set: removal markers are swept younger than the three-hour rule (a test setting)");
            d
        }
        _ => MARKER_RETENTION,
    }
}
