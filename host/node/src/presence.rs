//! Node presence: the `node:ID` lease, renewed on the heartbeat, carrying
//! the node's status. Reading `node:*` back is the whole of fleet discovery,
//! so a node that stops renewing simply stops being in the fleet.
//!
//! Ownership answers are three-valued and the holder side follows the
//! coordination rule: an unknown renew holds (bounded by this node's clock),
//! a definite "no" or a renew older than the TTL gives the lease up, and the
//! loop then acquires again. A drain releases the lease first of all.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crewlet_coord::{Answer, Coord, Held, HolderState, Lease, NodeStatus, Owner};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, info, warn};

/// What `/health` shows about presence.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PresenceView {
    /// `acquiring`, `admitting`, `stale`, `released`.
    pub state: &'static str,
    pub epoch: Option<u64>,
    pub owner: String,
    pub last_error: Option<String>,
}

pub struct Presence {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    view: Arc<Mutex<PresenceView>>,
}

impl Presence {
    /// Starts the heartbeat loop; `status` is asked on every beat.
    pub fn start(
        coord: Coord,
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
                coord,
                node_id,
                owner,
                Box::new(status),
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

type StatusFn = Box<dyn Fn() -> NodeStatus + Send + Sync>;

async fn heartbeat(
    coord: Coord,
    node_id: String,
    owner: Owner,
    status: StatusFn,
    view: Arc<Mutex<PresenceView>>,
    mut stop: watch::Receiver<bool>,
) {
    let beat = coord.heartbeat();
    let set = |state: &'static str, epoch: Option<u64>, error: Option<String>| {
        let mut v = view.lock().expect("presence view");
        v.state = state;
        v.epoch = epoch;
        if error.is_some() || state == "admitting" {
            v.last_error = error;
        }
    };
    let mut held: Option<(Lease, crewlet_coord::Holder)> = None;
    loop {
        let wait = match &mut held {
            None => {
                let sent = Instant::now();
                match coord.acquire_presence(&node_id, &owner, status()).await {
                    Ok(Answer::Yes(lease)) => {
                        info!(
                            subsystem = "presence",
                            epoch = lease.epoch,
                            "presence lease acquired"
                        );
                        set("admitting", Some(lease.epoch), None);
                        let holder = coord.holder(sent);
                        held = Some((lease, holder));
                        beat / 2
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
            Some((lease, holder)) => {
                let sent = Instant::now();
                let outcome = coord.renew_presence(lease, status()).await;
                holder.on_renew(sent, &outcome);
                match &outcome {
                    Ok(Answer::Yes(renewed)) => *lease = renewed.clone(),
                    Ok(Answer::No(why)) => {
                        warn!(subsystem = "presence", ?why, "presence lease lost")
                    }
                    Err(e) => {
                        warn!(subsystem = "presence", error = %e, "presence renew unknown; holding")
                    }
                }
                let error = outcome.as_ref().err().map(ToString::to_string);
                match holder.state(Instant::now()) {
                    HolderState::Admitting => {
                        set("admitting", Some(lease.epoch), error);
                        holder
                            .next_renew()
                            .saturating_duration_since(Instant::now())
                    }
                    HolderState::Stale => {
                        set("stale", Some(lease.epoch), error);
                        beat / 4
                    }
                    HolderState::GiveUp => {
                        warn!(
                            subsystem = "presence",
                            "presence lease given up; acquiring again"
                        );
                        set("acquiring", None, error);
                        held = None;
                        Duration::ZERO
                    }
                }
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait.max(Duration::from_millis(50))) => {}
            _ = until_set(&mut stop) => break,
        }
    }
    if let Some((lease, _)) = held {
        match tokio::time::timeout(Duration::from_secs(2), coord.release(&lease)).await {
            Ok(Ok(Answer::Yes(()))) => info!(subsystem = "presence", "presence lease released"),
            Ok(other) => warn!(
                subsystem = "presence",
                ?other,
                "presence release not confirmed; it lapses at its TTL"
            ),
            Err(_) => warn!(
                subsystem = "presence",
                "presence release timed out; it lapses at its TTL"
            ),
        }
    }
    set("released", None, None);
}

async fn until_set(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|v| *v).await;
}
