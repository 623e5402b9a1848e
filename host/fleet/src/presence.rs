//! Node presence: the `node:ID` lease, renewed on the heartbeat, carrying
//! the node's status. Reading `node:*` back is the whole of fleet discovery,
//! so a node that stops renewing simply stops being in the fleet.
//!
//! The lease is held by a [`Tenancy`] on the presence terms (renewed every
//! half heartbeat, carrying the status): an unknown renew holds (bounded by
//! this node's clock), a definite "no" or a renew older than the TTL gives
//! the lease up, and the node then acquires again. A drain releases the
//! lease first of all.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crewlet_coord::tenancy::StatusFn;
use crewlet_coord::{
    Admits, Answer, FenceEpoch, Held, Leases, NodeStatus, Owner, Released, ResourceName, Tenancy,
};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, info, warn};

/// What `/health` shows about presence.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PresenceView {
    /// `acquiring`, `admitting`, `stale`, `released`.
    pub state: &'static str,
    pub epoch: Option<FenceEpoch>,
    pub owner: String,
    pub last_error: Option<String>,
}

pub struct Presence {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    view: Arc<Mutex<PresenceView>>,
}

impl Presence {
    /// Starts the heartbeat loop on the `node` leases; `status` is asked
    /// on every beat.
    pub fn start(
        leases: Leases,
        node_id: String,
        owner: Owner,
        status: impl Fn() -> NodeStatus + Send + Sync + 'static,
    ) -> Presence {
        let view = Arc::new(Mutex::new(PresenceView {
            state: "acquiring",
            owner: owner.as_str().to_owned(),
            ..PresenceView::default()
        }));
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(
            heartbeat(
                leases,
                node_id,
                owner,
                Arc::new(status),
                view.clone(),
                stop_rx,
            )
            .in_current_span(),
        );
        Presence { stop, task, view }
    }

    pub fn view(&self) -> PresenceView {
        self.view.lock().expect("presence view").clone()
    }

    pub fn view_handle(&self) -> Arc<Mutex<PresenceView>> {
        self.view.clone()
    }

    /// Releases the lease and stops the loop.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Holds `node:{node_id}` for as long as it runs: acquire, hold the
/// [`Tenancy`] until its answer is no (then acquire again), release on stop.
async fn heartbeat(
    leases: Leases,
    node_id: String,
    owner: Owner,
    status: StatusFn,
    view: Arc<Mutex<PresenceView>>,
    mut stop: watch::Receiver<bool>,
) {
    let beat = leases.heartbeat();
    let set = |state: &'static str, epoch: Option<FenceEpoch>, error: Option<String>| {
        let mut v = view.lock().expect("presence view");
        v.state = state;
        v.epoch = epoch;
        if error.is_some() || state == "admitting" {
            v.last_error = error;
        }
    };
    let name = match ResourceName::node(&node_id) {
        Ok(n) => n,
        Err(e) => {
            warn!(subsystem = "presence", error = %e, "this node's id names no presence lease");
            set("acquiring", None, Some(e.to_string()));
            let _ = stop.wait_for(|v| *v).await;
            set("released", None, None);
            return;
        }
    };
    let mut held: Option<Tenancy> = None;
    loop {
        let wait = match &held {
            None => {
                let terms = leases.presence_terms(status.clone());
                match leases.acquire(&name, &owner, None, terms).await {
                    Ok(Answer::Yes(tenancy)) => {
                        info!(
                            subsystem = "presence",
                            epoch = %tenancy.epoch(),
                            "presence lease acquired"
                        );
                        set("admitting", Some(tenancy.epoch()), None);
                        held = Some(tenancy);
                        continue;
                    }
                    Ok(Answer::No(Held::By { owner, epoch })) => {
                        // Usually this node's previous incarnation, whose
                        // lease lapses at its TTL.
                        let why = format!(
                            "node:{node_id} is held by {} (epoch {epoch}) until its lease lapses",
                            owner.as_str()
                        );
                        warn!(subsystem = "presence", "{why}");
                        set("acquiring", None, Some(why));
                        beat
                    }
                    Ok(Answer::No(Held::Contended)) => beat / 4,
                    Err(e) => {
                        warn!(subsystem = "presence", error = %e, "presence lease unknown; retrying");
                        set("acquiring", None, Some(e.to_string()));
                        beat / 2
                    }
                }
            }
            Some(tenancy) => {
                let mut standing = tenancy.standing();
                let now = standing.borrow_and_update().clone();
                let epoch = Some(tenancy.epoch());
                match now.admits {
                    Admits::Yes => set("admitting", epoch, now.unknown),
                    Admits::Unknown => set("stale", epoch, now.unknown),
                    Admits::No => {
                        warn!(
                            subsystem = "presence",
                            "presence lease given up; acquiring again"
                        );
                        set("acquiring", None, now.unknown);
                        held = None;
                        continue;
                    }
                }
                let stopping = tokio::select! {
                    r = standing.changed() => {
                        if r.is_err() {
                            // The renewing ended without saying no (it
                            // failed): nothing holds the lease any more.
                            warn!(subsystem = "presence", "presence renewing ended; acquiring again");
                            held = None;
                        }
                        false
                    }
                    _ = until_set(&mut stop) => true,
                };
                if stopping {
                    break;
                }
                continue;
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait.max(Duration::from_millis(50))) => {}
            _ = until_set(&mut stop) => break,
        }
    }
    if let Some(tenancy) = held {
        match tenancy.release(Some(Duration::from_secs(2))).await {
            Released::Yes => info!(subsystem = "presence", "presence lease released"),
            other => warn!(
                subsystem = "presence",
                ?other,
                "presence release not confirmed; it lapses at its TTL"
            ),
        }
    }
    set("released", None, None);
}

async fn until_set(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|v| *v).await;
}
