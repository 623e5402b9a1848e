//! Charging a round to the budgets.
//!
//! Rules, and why:
//! - Every model call is charged, company then seat, once it answered (the
//!   vendor has billed it), in the windows current **when it is charged**,
//!   cut on the company's clock: a turn that crosses midnight or a Monday
//!   pays its later rounds in the new day's (week's, month's) window, as a
//!   turn started there would.
//! - A refusal is counted and stops the next call ([`Stop::Budget`]).
//! - An unreachable counter is an outage ([`Stop::Outage`]), never "out of
//!   budget": the work is run again, not told it cannot be afforded.

use std::time::SystemTime;

use crewlet_company::{Ceilings, Company};
use crewlet_coord::{Answer, BudgetView, Caps, Period, Refusal, Scope, Windows};
use serde_json::json;

use super::{Brain, Run, Stop};
use crate::ports::Toolbox;

/// The budget windows at `instant`, on the company's clock (its timezone's
/// offset in force then, DST included; UTC when the zone is unknown).
pub fn windows_at(company: &Company, instant: SystemTime) -> Windows {
    let offset = jiff::tz::TimeZone::get(&company.timezone)
        .ok()
        .and_then(|tz| {
            let ts = jiff::Timestamp::try_from(instant).ok()?;
            time::UtcOffset::from_whole_seconds(tz.to_offset(ts).seconds()).ok()
        })
        .unwrap_or(time::UtcOffset::UTC);
    Windows::at(instant, offset)
}

/// The budget windows now, on the company's clock.
pub fn windows_now(company: &Company) -> Windows {
    windows_at(company, SystemTime::now())
}

pub(super) fn caps(c: &Ceilings) -> Caps {
    Caps {
        day: c.day,
        week: c.week,
        month: c.month,
    }
}

/// Whether every capped window of `view` has room for one more token.
pub(super) fn has_room(view: &BudgetView, caps: &Caps) -> bool {
    Period::ALL.into_iter().all(|p| {
        let cap = match p {
            Period::Day => caps.day,
            Period::Week => caps.week,
            Period::Month => caps.month,
        };
        cap.is_none_or(|cap| view.slot(p).spent < cap)
    })
}

impl<B: Brain, T: Toolbox> Run<'_, B, T> {
    /// Charges one round of `tokens` in the windows current now.
    pub(super) async fn charge(&self, tokens: u64) -> Result<(), Stop> {
        let windows = windows_at(&self.company, self.engine.clock.now());
        let charged = self
            .engine
            .coord
            .charge(
                &self.handle,
                &windows,
                &self.company_caps,
                &self.seat_caps,
                tokens,
            )
            .await;
        match charged {
            Ok(Answer::Yes(_)) => Ok(()),
            Ok(Answer::No(refusal)) => Err(Stop::Budget(refusal)),
            Err(e) => Err(Stop::Outage(format!(
                "the budget counters are unreachable: {e}"
            ))),
        }
    }

    pub(super) async fn budget_event(&self, r: &Refusal, before_first_call: bool) {
        let scope = match &r.scope {
            Scope::Company => "company".to_owned(),
            Scope::Seat(h) => format!("seat:{h}"),
        };
        self.emit(
            "budget_exhausted",
            json!({
                "turn_id": self.turn_id, "scope": scope, "period": format!("{:?}", r.period).to_lowercase(),
                "spent": r.spent, "cap": r.cap, "before_first_call": before_first_call,
            }),
        )
        .await;
    }
}
