//! Charging a round to the budgets.
//!
//! Rules, and why:
//! - Every model call is charged, company then seat, once it answered (the
//!   vendor has billed it), in the windows current **when it is charged**,
//!   cut on the company's clock: a turn that crosses midnight or a Monday
//!   pays its later rounds in the new day's (week's, month's) window, as a
//!   turn started there would.
//! - A refusal is counted and stops the *next* call ([`Stop::Budget`]): the
//!   answer it charged was paid for, so the tool calls it asked for (a reply
//!   it chose to post) still run. The work is then parked ([`super::park`]).
//! - A cap is a cap within one call: before every call of a capped seat the
//!   windows are read and the request's `max_tokens` is clamped to the room
//!   left in the tightest capped window, less the prompt. A call whose prompt
//!   alone would fill that room is not made: a refusal recorded for the
//!   prompt's size ([`Coord::refuse_for`]), and the work parks until that
//!   much room is back. So the spend passes a cap by at most the error of
//!   one prompt's estimate. The prompt is estimated before the call at one
//!   token per four characters (rounded up) of every message, tool call and
//!   tool definition sent — the usual rule of thumb for English text and
//!   JSON, and higher than the vendor's count for most prompts, since tool
//!   schemas are counted whole.
//! - An unreachable counter is an outage ([`Stop::Outage`]), never "out of
//!   budget": the work is run again, not told it cannot be afforded.
//!
//! [`Coord::refuse_for`]: crewlet_coord::Coord::refuse_for

use crewlet_company::Ceilings;
use crewlet_coord::{Answer, Caps, Period, Refusal, Scope, Windows};
use serde_json::json;
use tracing::info;

use super::park::{self, period_name, scope_name, windows_at};
use super::{Brain, Run, Stop};
use crate::ports::{Msg, ToolDef, Toolbox};

pub(super) fn caps(c: &Ceilings) -> Caps {
    Caps {
        day: c.day,
        week: c.week,
        month: c.month,
    }
}

fn cap(caps: &Caps, p: Period) -> Option<u64> {
    match p {
        Period::Day => caps.day,
        Period::Week => caps.week,
        Period::Month => caps.month,
    }
}

/// A prompt's tokens as the budget meter estimates them before the call: a
/// quarter of its characters (messages, tool calls, tool definitions),
/// rounded up.
pub fn estimate(messages: &[Msg], tools: &[ToolDef]) -> u64 {
    let chars: usize = messages
        .iter()
        .map(|m| {
            m.content.chars().count()
                + m.calls
                    .iter()
                    .map(|c| c.name.chars().count() + c.arguments.chars().count())
                    .sum::<usize>()
        })
        .sum::<usize>()
        + tools
            .iter()
            .map(|t| {
                t.name.chars().count()
                    + t.description.chars().count()
                    + t.parameters.to_string().chars().count()
            })
            .sum::<usize>();
    (chars as u64).div_ceil(4)
}

impl<B: Brain, T: Toolbox> Run<'_, B, T> {
    /// Charges one round of `tokens` in the windows current now. A refusal
    /// does not fail this call (its answer is paid for): it is kept, and
    /// stops the next one.
    pub(super) async fn charge(&mut self, tokens: u64) -> Result<(), Stop> {
        let now = self.engine.clock.now();
        let windows = windows_at(&self.company, now);
        let charged = self
            .engine
            .budgets
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
            Ok(Answer::No(refusal)) => {
                self.budget_event(&refusal, false).await;
                let window = label(&windows, refusal.period);
                self.metered = Some(park::of_refusal(&self.company, &refusal, window, now, 1));
                Ok(())
            }
            Err(e) => Err(Stop::Outage(format!(
                "the budget counters are unreachable: {e}"
            ))),
        }
    }

    /// The `max_tokens` of the next call: the engine's limit, clamped to the
    /// room the tightest capped window has left after the prompt. A prompt
    /// that fills the room is refused (recorded) and stops the turn.
    pub(super) async fn clamp(&mut self, messages: &[Msg], tools: &[ToolDef]) -> Result<u32, Stop> {
        let limit = self.engine.limits.max_tokens;
        if self.company_caps == Caps::default() && self.seat_caps == Caps::default() {
            return Ok(limit);
        }
        let now = self.engine.clock.now();
        let windows = windows_at(&self.company, now);
        let seat = Scope::Seat(self.handle.clone());
        let unreachable = |e: crewlet_coord::CoordError| {
            Stop::Outage(format!("the budget counters are unreachable: {e}"))
        };
        let (c, s) = futures::join!(
            self.engine.budgets.budget(&Scope::Company, &windows),
            self.engine.budgets.budget(&seat, &windows)
        );
        let (c, s) = (c.map_err(unreachable)?, s.map_err(unreachable)?);
        let room = Period::ALL
            .into_iter()
            .flat_map(|p| {
                [
                    cap(&self.company_caps, p).map(|k| k.saturating_sub(c.slot(p).spent)),
                    cap(&self.seat_caps, p).map(|k| k.saturating_sub(s.slot(p).spent)),
                ]
            })
            .flatten()
            .min()
            .unwrap_or(u64::MAX);
        let prompt = estimate(messages, tools);
        if prompt < room {
            let left = u32::try_from(room - prompt).unwrap_or(u32::MAX);
            return Ok(limit.min(left));
        }
        let refused = self
            .engine
            .budgets
            .refuse_for(
                &self.handle,
                &windows,
                &self.company_caps,
                &self.seat_caps,
                prompt,
            )
            .await
            .map_err(unreachable)?;
        match refused {
            // The counter moved under the read (a window turned): go on,
            // within what was read.
            Answer::No(()) => Ok(limit.min(u32::try_from(room).unwrap_or(u32::MAX)).max(1)),
            Answer::Yes(r) => {
                self.budget_event(&r, self.model_calls == 0).await;
                let window = label(&windows, r.period);
                Err(Stop::Budget(park::of_refusal(
                    &self.company,
                    &r,
                    window,
                    now,
                    prompt,
                )))
            }
        }
    }

    pub(super) async fn budget_event(&self, r: &Refusal, before_first_call: bool) {
        let scope = scope_name(&r.scope);
        let period = period_name(r.period);
        info!(subsystem = "turns", seat = %self.handle, turn_id = %self.turn_id, %scope, period,
            spent = r.spent, cap = r.cap, before_first_call, "a budget refused the turn's next model call");
        self.emit(
            "budget_exhausted",
            json!({
                "turn_id": self.turn_id, "scope": scope, "period": period,
                "spent": r.spent, "cap": r.cap, "before_first_call": before_first_call,
            }),
        )
        .await;
    }
}

fn label(w: &Windows, p: Period) -> String {
    match p {
        Period::Day => w.day.clone(),
        Period::Week => w.week.clone(),
        Period::Month => w.month.clone(),
    }
}
