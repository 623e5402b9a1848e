//! A held seat's budget park gate.
//!
//! Rules, and why:
//! - A turn that ends [`TurnVerdict::Park`] shuts the gate: its wakes are
//!   handed back (they stay in the mailbox, not acknowledged), the wakes
//!   queued behind it are handed back too, and the mailbox fetches and
//!   launches nothing while the gate is shut — every turn of the seat would
//!   need the same full window, and finding that out again costs a refusal,
//!   never a model call. Turns already running finish (their own meter stops
//!   them); nothing is killed mid-call.
//! - The gate asks the host ([`SeatHost::room`], counter reads) when the
//!   full window turns over and whenever the company changes (a cap raised
//!   by a config apply): room opens it and the mailbox fetches at once;
//!   still full shuts it until the next turn-over; unknown keeps it shut and
//!   asks again after [`UNKNOWN_RETRY`]. Nobody has to send a message for
//!   parked work to run.
//!
//! [`TurnVerdict::Park`]: crate::TurnVerdict::Park

use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info};

use crate::host::{Room, SeatHost, SeatSpec};
use crewlet_company::ActiveCompany;

/// How soon an unanswered room question is asked again.
pub(crate) const UNKNOWN_RETRY: Duration = Duration::from_secs(2);
/// The shortest wait between two questions: a window's turn-over on this
/// clock may come a little before the counters' labels move.
const MIN_ASK: Duration = Duration::from_millis(200);
/// How long one room question may take before it counts as unknown.
const ASK_BOUND: Duration = Duration::from_secs(5);

/// Why the gate is shut, and when to ask again.
#[derive(Debug, Clone)]
struct Shut {
    need: u64,
    ask_at: Instant,
}

/// Open, or shut until the budget has room (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct ParkGate {
    shut: Option<Shut>,
}

impl ParkGate {
    pub(crate) fn is_shut(&self) -> bool {
        self.shut.is_some()
    }

    /// When the gate asks the host next, while it is shut.
    pub(crate) fn ask_at(&self) -> Option<Instant> {
        self.shut.as_ref().map(|s| s.ask_at)
    }

    /// Shuts the gate until `after` has passed (then asks), needing room for
    /// `need` tokens; a gate already shut keeps the larger need.
    pub(crate) fn shut(&mut self, after: Duration, need: u64) {
        let need = self.shut.as_ref().map_or(need, |s| s.need.max(need));
        self.shut = Some(Shut {
            need,
            ask_at: Instant::now() + after.max(MIN_ASK),
        });
    }

    /// The company changed: a shut gate asks at once.
    pub(crate) fn company_changed(&mut self) {
        if let Some(s) = &mut self.shut {
            s.ask_at = Instant::now();
        }
    }

    /// Asks the host whether there is room; answers whether the gate opened.
    pub(crate) async fn ask<H: SeatHost>(
        &mut self,
        host: &H,
        spec: &SeatSpec,
        active: &ActiveCompany,
    ) -> bool {
        let Some(shut) = self.shut.clone() else {
            return false;
        };
        let handle = spec.handle.as_str();
        let answer = match active.current() {
            None => Room::Unknown("no company is active on this node".into()),
            Some(active) => {
                let ask = host.room(spec, &active, shut.need);
                tokio::time::timeout(ASK_BOUND, ask)
                    .await
                    .unwrap_or_else(|_| {
                        Room::Unknown(format!(
                            "the budget counters did not answer within {ASK_BOUND:?}"
                        ))
                    })
            }
        };
        match answer {
            Room::Free => {
                info!(subsystem = "seats", seat = %handle, need = shut.need,
                    "the seat's budget has room again; its parked work is taken");
                self.shut = None;
                true
            }
            Room::Full { after, reason } => {
                info!(subsystem = "seats", seat = %handle, %reason, ?after,
                    "the seat's budget is still full; its work stays parked");
                self.shut(after, shut.need);
                false
            }
            Room::Unknown(why) => {
                debug!(subsystem = "seats", seat = %handle, %why,
                    "cannot tell whether the seat's budget has room; its work stays parked and the question is asked again");
                self.shut(UNKNOWN_RETRY, shut.need);
                false
            }
        }
    }
}
