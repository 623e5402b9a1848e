//! Before the first call: is anything left to do, and is there room?
//!
//! Rules, and why:
//! - Both are reads, side by side: the completion ledger for every trigger
//!   and the budget windows of the company and the seat.
//! - A trigger the ledger answers unknown for is done anyway: failing open
//!   risks doing the work twice, which the reply keys keep from being said
//!   twice; failing closed would drop it.
//! - An unreadable budget counter is an outage (run it again later), never
//!   "out of budget".
//! - A window the read finds full parks the work before the first call
//!   ([`super::park`]): [`Coord::refuse`] records the refusal without a
//!   charge, once, and the turn ends `parked` — its triggers not completed,
//!   its wakes left in the mailbox. The read may be stale: when the store
//!   finds room after all, the turn runs.
//!
//! [`Coord::refuse`]: crewlet_coord::Coord::refuse

use crewlet_bus::Wake;
use crewlet_company::{Company, Role};
use crewlet_coord::{Answer, CoordError, Scope, Windows};
use tracing::warn;

use super::park::windows_at;
use super::park::{self, Park};
use super::{Brain, Run, Stop, TurnEngine};
use crate::ports::Toolbox;
use crate::trigger;

/// What the budget read said: room in every capped window (`None`), the
/// park a full one calls for, or unknown; with the windows it read.
pub(super) struct Room {
    pub(super) windows: Windows,
    pub(super) answer: Result<Option<Park>, CoordError>,
}

/// The triggers left to do, and the room there is for them.
pub(super) struct Admission {
    /// Ledger keys of the triggers to serve.
    pub(super) keys: Vec<String>,
    pub(super) wakes: Vec<Wake>,
    pub(super) room: Room,
}

/// Reads the ledger and the windows; `None` when every trigger is done.
pub(super) async fn read<B: Brain>(
    engine: &TurnEngine<B>,
    company: &Company,
    role: &Role,
    handle: &str,
    wakes: &[Wake],
) -> Option<Admission> {
    let now = engine.clock.now();
    let windows = windows_at(company, now);
    let ledger = futures::future::join_all(wakes.iter().map(|w| async move {
        let key = trigger::trigger_key(w);
        let done = engine.ledger.completed(&key).await;
        (key, w, done)
    }));
    let seat = Scope::Seat(handle.to_owned());
    let room = async {
        let (c, s) = futures::join!(
            engine.budgets.budget(&Scope::Company, &windows),
            engine.budgets.budget(&seat, &windows)
        );
        let views = [
            (Scope::Company, c?, company.budget),
            (seat.clone(), s?, role.budget),
        ];
        Ok::<_, CoordError>(park::park_for(company, &views, now, 1))
    };
    let (ledger, answer) = futures::join!(ledger, room);
    let mut keys = Vec::new();
    let mut pending = Vec::new();
    for (key, w, done) in ledger {
        match done {
            Ok(Answer::Yes(())) => continue,
            Ok(Answer::No(())) => {}
            Err(e) => {
                warn!(subsystem = "turns", %key, error = %e, "completion ledger unknown; doing the work");
            }
        }
        keys.push(key);
        pending.push(w.clone());
    }
    (!pending.is_empty()).then_some(Admission {
        keys,
        wakes: pending,
        room: Room { windows, answer },
    })
}

impl<B: Brain, T: Toolbox> Run<'_, B, T> {
    /// Parks the work when the read found a window full (only then is the
    /// store written to, to record the refusal).
    pub(super) async fn admit(&mut self, room: Room) -> Result<(), Stop> {
        let park = match room.answer {
            Ok(None) => return Ok(()),
            Ok(Some(park)) => park,
            Err(e) => {
                return Err(Stop::Outage(format!(
                    "the budget counters are unreachable: {e}"
                )));
            }
        };
        let refused = self
            .engine
            .budgets
            .refuse(
                &self.handle,
                &room.windows,
                &self.company_caps,
                &self.seat_caps,
            )
            .await;
        match refused {
            Ok(Answer::No(())) => Ok(()),
            Ok(Answer::Yes(r)) => {
                self.budget_event(&r, true).await;
                Err(Stop::Budget(park))
            }
            Err(e) => Err(Stop::Outage(format!(
                "the budget counters are unreachable: {e}"
            ))),
        }
    }
}
