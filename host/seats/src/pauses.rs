//! Seat pauses: the fleet's pause records mirrored by one watch on every
//! node, and what `POST /agents/{handle}/pause` / `resume` (write scope;
//! the routes are `crewlet-api`'s) and the operator's MCP do.
//!
//! Rules:
//! - Every node follows the pauses watch; its seats read the mirror
//!   ([`crate::SeatsConfig::pauses`]): a paused seat takes nothing
//!   off its mailbox, so its wakes wait there, and its running turn stops
//!   before its next model call (not done: it runs again after the resume).
//! - Unknown is never "not paused": until the first listing the mirror is
//!   unknown and no seat admits work. A watch that drops keeps its last
//!   word while it is opened again (with backoff), like the admission gate.
//! - A pause names who, where and why; a resume answers whether the seat
//!   was paused. An unreadable store is 503 with Retry-After and changes
//!   nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crewlet_company::ActiveCompany;
use crewlet_coord::{Answer, CoordError, PauseRecords};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, info, info_span, warn};

use crate::Pauses;

/// The first and the longest wait before the watch is opened again.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(8));

/// The pauses mirror, following until stopped.
pub struct PauseMirror {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl PauseMirror {
    /// Starts the mirror; answers it and what the seats read (`None` until
    /// the first listing).
    pub fn start(records: PauseRecords) -> (PauseMirror, watch::Receiver<Option<Pauses>>) {
        let (tx, rx) = watch::channel(None);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(
            follow(records, tx, stopped).instrument(info_span!("pauses", subsystem = "pauses")),
        );
        (PauseMirror { stop, task }, rx)
    }

    /// Stops following; the last word stays with the readers.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Follows the pauses watch until `stop`, opening it again when it drops.
async fn follow(
    records: PauseRecords,
    tx: watch::Sender<Option<Pauses>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut wait = BACKOFF.0;
    loop {
        let run = async {
            let mut w = records.watch().await?;
            let mut paused: BTreeSet<String> = w.initial.keys().cloned().collect();
            info!(
                subsystem = "pauses",
                paused = paused.len(),
                "seat pauses listed"
            );
            tx.send_replace(Some(Arc::new(paused.clone())));
            while let Some(change) = w.changes.next().await {
                let (handle, record) = change?;
                let changed = match record {
                    Some(_) => paused.insert(handle.clone()),
                    None => paused.remove(&handle),
                };
                if changed {
                    info!(subsystem = "pauses", seat = %handle, paused = paused.contains(&handle), "seat pause changed");
                    tx.send_replace(Some(Arc::new(paused.clone())));
                }
            }
            Ok::<(), CoordError>(())
        };
        let why = tokio::select! {
            r = run => match r {
                Ok(()) => "the watch ended".to_owned(),
                Err(e) => e.to_string(),
            },
            _ = stop.wait_for(|s| *s) => return,
        };
        warn!(subsystem = "pauses", error = %why, retry_in = ?wait, "seat pauses watch lost; keeping the last known pauses");
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        wait = (wait * 2).min(BACKOFF.1);
    }
}

/// Why a pause or resume was not done.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    #[error("no company is active on this node")]
    NoCompany,
    #[error("no seat `{0}` in the company; `GET /org` lists the seats")]
    NoSeat(String),
    #[error("cannot tell {what}: {why}; nothing changed — retry in a few seconds")]
    Unavailable { what: &'static str, why: String },
}

/// Pausing and resuming seats of the company this node serves.
#[derive(Clone)]
pub struct SeatPauses {
    node_id: String,
    records: PauseRecords,
    active: ActiveCompany,
}

impl SeatPauses {
    pub fn new(node_id: String, records: PauseRecords, active: ActiveCompany) -> SeatPauses {
        SeatPauses {
            node_id,
            records,
            active,
        }
    }

    /// Pauses `seat` of the active company, recording who, where and why.
    pub async fn pause(
        &self,
        seat: &str,
        by: &str,
        reason: Option<String>,
    ) -> Result<Value, PauseError> {
        let handle = self.seat_handle(seat)?;
        let record = json!({
            "by": by,
            "node": self.node_id,
            "reason": reason,
            "at_ms": crewlet_os::now_ms(),
        });
        self.records
            .pause(&handle, &record)
            .await
            .map_err(|e| PauseError::Unavailable {
                what: "whether the pause was written",
                why: e.to_string(),
            })?;
        info!(subsystem = "pauses", seat = %handle, by, "seat paused");
        Ok(json!({"seat": handle, "paused": true, "record": record}))
    }

    /// Resumes `seat`; answers whether it was paused.
    pub async fn resume(&self, seat: &str, by: &str) -> Result<Value, PauseError> {
        let handle = self.seat_handle(seat)?;
        let was = match self.records.resume(&handle).await {
            Ok(Answer::Yes(())) => true,
            Ok(Answer::No(())) => false,
            Err(e) => {
                return Err(PauseError::Unavailable {
                    what: "whether the seat was resumed",
                    why: e.to_string(),
                });
            }
        };
        info!(subsystem = "pauses", seat = %handle, by, was_paused = was, "seat resumed");
        Ok(json!({"seat": handle, "paused": false, "was_paused": was}))
    }

    fn seat_handle(&self, seat: &str) -> Result<String, PauseError> {
        let active = self.active.current().ok_or(PauseError::NoCompany)?;
        let handle = seat.trim_start_matches('@');
        active
            .company
            .seat(handle)
            .map(|s| s.handle.to_string())
            .ok_or_else(|| PauseError::NoSeat(handle.to_owned()))
    }
}
