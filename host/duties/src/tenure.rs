//! Holding one `worker:DUTY` lease, and what its work loop may do with it.
//!
//! Rule: every node with the `workers` role competes for each duty's lease;
//! the winner holds it by a [`Tenancy`] on the duty terms (renewed every
//! sixth of the TTL, admitting while its last good renew is younger than a
//! third of it: stop early, hand over late). The work loop asks the
//! tenure's [`Fence`] before every write and carries the epoch it answered
//! on what it writes, so a holder that was frozen past its TTL wakes fenced
//! — its monotonic clock has run on — and a peer's newer epoch is on every
//! record written since. A drain releases the lease so a peer takes the
//! duty on its next poll rather than after the TTL, and so does a node
//! that stops admitting triggers (it sheds: its company is behind the
//! fleet's, so what it would fire or sweep is stale).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use crewlet_coord::{Admits, Answer, DutyRow, Fence, Leases, Owner, Released, ResourceName};
use crewlet_coord::{Tenancy, Terms};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, info, warn};

/// The duties this node holds, each with its tenure's fence, for its
/// status and `/health`.
#[derive(Debug, Clone, Default)]
pub struct HeldDuties(Arc<Mutex<BTreeMap<&'static str, Fence>>>);

impl HeldDuties {
    fn set(&self, duty: &'static str, fence: Option<Fence>) {
        let mut held = self.0.lock().expect("held duties");
        match fence {
            Some(f) => held.insert(duty, f),
            None => held.remove(duty),
        };
    }

    /// What this node holds now.
    pub fn rows(&self) -> Vec<DutyRow> {
        self.0
            .lock()
            .expect("held duties")
            .iter()
            .map(|(duty, f)| DutyRow {
                duty: (*duty).to_owned(),
                epoch: f.epoch(),
                since_ms: f
                    .since()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64),
            })
            .collect()
    }
}

/// A duty's lease loop: follow its tenure's fence with
/// [`DutyLease::fence`], stop it with [`DutyLease::stop`] (which releases
/// the lease).
pub struct DutyLease {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    fence: watch::Receiver<Option<Fence>>,
}

impl DutyLease {
    /// Starts competing for `worker:{duty}` with lease `ttl`.
    pub fn start(spec: Spec, held: HeldDuties, eligible: watch::Receiver<bool>) -> DutyLease {
        let (stop, stop_rx) = watch::channel(false);
        let (tx, fence) = watch::channel(None);
        let task = tokio::spawn(hold(spec, tx, held, eligible, stop_rx).in_current_span());
        DutyLease { stop, task, fence }
    }

    /// The fence of the tenure this node holds now (`None`: none).
    pub fn fence(&self) -> watch::Receiver<Option<Fence>> {
        self.fence.clone()
    }

    /// Stops competing and releases the lease if held.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// How often a node that does not hold the duty tries again: often enough
/// that a lapsed lease is taken within about a second of the TTL for the
/// scheduler, never more than every 30 s.
pub fn poll_every(ttl: Duration) -> Duration {
    (ttl / 30).clamp(Duration::from_secs(1), Duration::from_secs(30))
}

/// Which duty, held by whom, for how long.
pub struct Spec {
    /// The `worker` leases.
    pub leases: Leases,
    pub owner: Owner,
    pub duty: &'static str,
    pub ttl: Duration,
}

async fn hold(
    spec: Spec,
    tx: watch::Sender<Option<Fence>>,
    held_duties: HeldDuties,
    mut eligible: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let Spec {
        leases,
        owner,
        duty,
        ttl,
    } = spec;
    let name = ResourceName::worker(duty).expect("duty names are valid resource names");
    let publish = |f: Option<Fence>| {
        held_duties.set(duty, f.clone());
        tx.send_replace(f);
    };
    let mut held: Option<Tenancy> = None;
    loop {
        if !*eligible.borrow_and_update() {
            publish(None);
            if let Some(tenancy) = held.take() {
                info!(
                    subsystem = "duties",
                    duty, "this node sheds: giving the duty up"
                );
                release(duty, tenancy).await;
            }
            tokio::select! {
                _ = eligible.changed() => continue,
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        let wait = match &held {
            None => {
                match leases
                    .acquire(&name, &owner, Some(ttl), Terms::duty(ttl))
                    .await
                {
                    Ok(Answer::Yes(tenancy)) => {
                        info!(subsystem = "duties", duty, epoch = %tenancy.epoch(), ?ttl, "duty acquired");
                        publish(Some(tenancy.fence().clone()));
                        held = Some(tenancy);
                        continue;
                    }
                    Ok(Answer::No(_)) => poll_every(ttl),
                    Err(e) => {
                        warn!(subsystem = "duties", duty, error = %e, "duty lease unknown; trying again");
                        poll_every(ttl)
                    }
                }
            }
            Some(tenancy) => {
                if tenancy.fence().admits() == Admits::No {
                    warn!(subsystem = "duties", duty, epoch = %tenancy.epoch(), "duty given up");
                    publish(None);
                    held = None;
                    continue;
                }
                let stopping = tokio::select! {
                    _ = tenancy.ended() => false,
                    Ok(()) = eligible.changed() => false,
                    _ = stop.wait_for(|s| *s) => true,
                };
                if stopping {
                    break;
                }
                continue;
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait.max(Duration::from_millis(50))) => {}
            _ = eligible.changed() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    publish(None);
    if let Some(tenancy) = held {
        release(duty, tenancy).await;
    }
}

async fn release(duty: &'static str, tenancy: Tenancy) {
    match tenancy.release(Some(Duration::from_secs(2))).await {
        Released::Yes => info!(subsystem = "duties", duty, "duty released"),
        _ => warn!(
            subsystem = "duties",
            duty, "duty release not confirmed; it lapses at its TTL"
        ),
    }
}
