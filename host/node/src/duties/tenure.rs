//! Holding one `worker:DUTY` lease, and what its work loop may do with it.
//!
//! Rule: every node with the `workers` role competes for each duty's lease;
//! the winner renews every sixth of the duty's TTL and *admits* work only
//! while its last good renew is younger than a third of it (the
//! [`Holder`](crewlet_coord::Holder): stop early, hand over late). The work
//! loop asks [`Tenure::admits`] before every write and carries the epoch it
//! answered on what it writes, so a holder that was frozen past its TTL
//! wakes fenced — its monotonic clock has run on — and a peer's newer epoch
//! is on every record written since. A drain releases the lease so a peer
//! takes the duty on its next poll rather than after the TTL, and so does a
//! node that stops admitting triggers (it sheds: its company is behind the
//! fleet's, so what it would fire or sweep is stale).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crewlet_coord::{Answer, Coord, DutyRow, Held, HolderState, Lease, Owner, ResourceName};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, info, warn};

/// One duty's tenure on this node, as its work loop sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenure {
    pub epoch: u64,
    /// Unix milliseconds: when this node won this epoch.
    pub since_ms: i64,
    /// Work may be admitted until then (last good renew + a third of the TTL).
    admit_until: Instant,
}

impl Tenure {
    /// The fencing epoch to write with, if work may start now.
    pub fn admits(&self, now: Instant) -> Option<u64> {
        (now < self.admit_until).then_some(self.epoch)
    }
}

/// The duties this node holds, for its status and `/health`.
#[derive(Debug, Clone, Default)]
pub struct Board(Arc<Mutex<std::collections::BTreeMap<&'static str, Tenure>>>);

impl Board {
    fn set(&self, duty: &'static str, tenure: Option<Tenure>) {
        let mut held = self.0.lock().expect("duty board");
        match tenure {
            Some(t) => held.insert(duty, t),
            None => held.remove(duty),
        };
    }

    /// What this node holds now.
    pub fn rows(&self) -> Vec<DutyRow> {
        self.0
            .lock()
            .expect("duty board")
            .iter()
            .map(|(duty, t)| DutyRow {
                duty: (*duty).to_owned(),
                epoch: t.epoch,
                since_ms: t.since_ms,
            })
            .collect()
    }
}

/// A duty's lease loop: follow it with [`DutyLease::tenure`], stop it with
/// [`DutyLease::stop`] (which releases the lease).
pub struct DutyLease {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    tenure: watch::Receiver<Option<Tenure>>,
}

impl DutyLease {
    /// Starts competing for `worker:{duty}` with lease `ttl`.
    pub fn start(spec: Spec, board: Board, eligible: watch::Receiver<bool>) -> DutyLease {
        let (stop, stop_rx) = watch::channel(false);
        let (tx, tenure) = watch::channel(None);
        let task = tokio::spawn(hold(spec, tx, board, eligible, stop_rx).in_current_span());
        DutyLease { stop, task, tenure }
    }

    pub fn tenure(&self) -> watch::Receiver<Option<Tenure>> {
        self.tenure.clone()
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

fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// Which duty, held by whom, for how long.
pub struct Spec {
    pub coord: Coord,
    pub owner: Owner,
    pub duty: &'static str,
    pub ttl: Duration,
}

async fn hold(
    spec: Spec,
    tx: watch::Sender<Option<Tenure>>,
    board: Board,
    mut eligible: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let Spec {
        coord,
        owner,
        duty,
        ttl,
    } = spec;
    let name = ResourceName::worker(duty).expect("duty names are valid resource names");
    let admit_window = ttl / 3;
    let publish = |t: Option<Tenure>| {
        board.set(duty, t);
        tx.send_replace(t);
    };
    let mut held: Option<(Lease, crewlet_coord::Holder, i64)> = None;
    loop {
        if !*eligible.borrow_and_update() {
            publish(None);
            if let Some((lease, _, _)) = held.take() {
                info!(
                    subsystem = "duties",
                    duty, "this node sheds: giving the duty up"
                );
                release(&coord, duty, &lease).await;
            }
            tokio::select! {
                _ = eligible.changed() => continue,
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        let wait = match &mut held {
            None => {
                let sent = Instant::now();
                match coord.acquire(&name, &owner, Some(ttl)).await {
                    Ok(Answer::Yes(lease)) => {
                        let since = now_ms();
                        info!(
                            subsystem = "duties",
                            duty,
                            epoch = lease.epoch,
                            ?ttl,
                            "duty acquired"
                        );
                        let holder = crewlet_coord::Holder::new(sent, admit_window, ttl);
                        publish(Some(Tenure {
                            epoch: lease.epoch,
                            since_ms: since,
                            admit_until: sent + admit_window,
                        }));
                        held = Some((lease, holder, since));
                        ttl / 6
                    }
                    Ok(Answer::No(Held::By { .. })) | Ok(Answer::No(Held::Contended)) => {
                        poll_every(ttl)
                    }
                    Err(e) => {
                        warn!(subsystem = "duties", duty, error = %e, "duty lease unknown; trying again");
                        poll_every(ttl)
                    }
                }
            }
            Some((lease, holder, since)) => {
                let sent = Instant::now();
                let outcome = coord.renew(lease).await;
                holder.on_renew(sent, &outcome);
                match &outcome {
                    Ok(Answer::Yes(renewed)) => *lease = renewed.clone(),
                    Ok(Answer::No(why)) => {
                        warn!(subsystem = "duties", duty, ?why, "duty lease lost")
                    }
                    Err(e) => {
                        warn!(subsystem = "duties", duty, error = %e, "duty renew unknown; holding")
                    }
                }
                match holder.state(Instant::now()) {
                    HolderState::GiveUp => {
                        warn!(
                            subsystem = "duties",
                            duty,
                            epoch = lease.epoch,
                            "duty given up"
                        );
                        publish(None);
                        held = None;
                        Duration::ZERO
                    }
                    state => {
                        if outcome.as_ref().is_ok_and(Answer::is_yes) {
                            publish(Some(Tenure {
                                epoch: lease.epoch,
                                since_ms: *since,
                                admit_until: sent + admit_window,
                            }));
                        }
                        if state == HolderState::Admitting {
                            holder
                                .next_renew()
                                .saturating_duration_since(Instant::now())
                        } else {
                            ttl / 12
                        }
                    }
                }
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait.max(Duration::from_millis(50))) => {}
            _ = eligible.changed() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    publish(None);
    if let Some((lease, _, _)) = held {
        release(&coord, duty, &lease).await;
    }
}

async fn release(coord: &Coord, duty: &'static str, lease: &Lease) {
    match tokio::time::timeout(Duration::from_secs(2), coord.release(lease)).await {
        Ok(Ok(Answer::Yes(()))) => info!(subsystem = "duties", duty, "duty released"),
        _ => warn!(
            subsystem = "duties",
            duty, "duty release not confirmed; it lapses at its TTL"
        ),
    }
}
