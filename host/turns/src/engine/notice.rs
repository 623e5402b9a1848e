//! `[budgets] announce_park`: the notice a parked seat posts to the people
//! it owes a reply ("out of budget until …").
//!
//! Rules, and why:
//! - The notice is its own post, never the owed reply: the trigger's reply
//!   record ([`super::owed`]) is left untouched, so when the parked work
//!   runs the seat's real answer is still owed, and posted.
//! - Once per park per trigger: each trigger still owed a reply claims a
//!   key named by the trigger and the window it parked on (the claim-once
//!   keys of [`super::reply`]), and a target is told only when one of its
//!   triggers' keys was won. The same wake run again while that window is
//!   still full — on this node or another — finds its key and says nothing.
//! - Unknown (the ledger cannot answer) posts nothing: never twice. The
//!   tool's refusal frees the keys (nothing was posted); an unreachable
//!   tool keeps them (it may have posted).
//! - Off by default: silence. A notice that fails is logged; the work stays
//!   parked either way.

use serde_json::{Value, json};
use tracing::{info, warn};

use super::owed::{IDEMPOTENCY_ARG, Standing};
use super::reply::{Claim, ReplyKey};
use super::{Brain, Park, Run, prompts};
use crate::ports::Toolbox;
use crate::trigger::Target;

impl<B: Brain, T: Toolbox> Run<'_, B, T> {
    /// Tells every target still owed a reply that the seat is out of budget
    /// until `park`'s window turns over, once per trigger and window;
    /// answers the targets told.
    pub(super) async fn announce(&self, park: &Park) -> Vec<String> {
        if !self.company.announce_park {
            return Vec::new();
        }
        // The targets still owed, each with its triggers.
        let mut owed: Vec<(Target, Vec<String>)> = Vec::new();
        for o in self
            .replies
            .iter()
            .filter(|o| o.standing == Standing::Unanswered)
        {
            match owed.iter_mut().find(|(t, _)| *t == o.target) {
                Some((_, triggers)) => triggers.push(o.trigger.clone()),
                None => owed.push((o.target.clone(), vec![o.trigger.clone()])),
            }
        }
        let text = prompts::out_of_budget(&park.reason(&self.company));
        let mut told = Vec::new();
        for (target, triggers) in owed {
            let Some(call) = super::surface::notice_call(self.tools, &self.role, &target, &text)
            else {
                continue;
            };
            if self.notify(park, call, &target, &triggers).await {
                told.push(target.to_string());
            }
        }
        told
    }

    /// Claims `triggers`' notice keys and, when one was won, makes `call`
    /// (the server, tool and arguments posting the notice to `target`);
    /// answers whether it posted.
    async fn notify(
        &self,
        park: &Park,
        (server, tool, mut args): (String, String, Value),
        target: &Target,
        triggers: &[String],
    ) -> bool {
        let (server, tool) = (server.as_str(), tool.as_str());
        let engine = self.engine;
        let ledger = &engine.ledger;
        let mut won = Vec::new();
        for trigger in triggers {
            let key = ReplyKey::park_notice(trigger, park, target.clone());
            match key.claim(ledger, &self.turn_id, &self.handle).await {
                Ok(Claim::Won) => won.push(key),
                Ok(Claim::Posted) => {}
                Err(e) => {
                    warn!(subsystem = "turns", seat = %self.handle, turn_id = %self.turn_id,
                        %target, error = %e,
                        "the budget park's notice is not posted: its key cannot be recorded, so it could be posted twice");
                    for k in &won {
                        k.release(ledger).await;
                    }
                    return false;
                }
            }
        }
        let Some(first) = won.first() else {
            return false;
        };
        if self.takes_idempotency_key(server, tool) {
            args[IDEMPOTENCY_ARG] = Value::String(first.id().to_owned());
        }
        let started = std::time::Instant::now();
        let call = self.tools.call(server, tool, args, &self.turn_id).await;
        let ok = matches!(&call, Ok(out) if !out.is_error);
        self.emit(
            "tool_call",
            json!({"turn_id": self.turn_id, "tool": format!("{server}__{tool}"), "ok": ok,
                   "ms": started.elapsed().as_millis() as u64, "notice": "budget_park"}),
        )
        .await;
        match call {
            Ok(out) if !out.is_error => {
                info!(subsystem = "turns", seat = %self.handle, turn_id = %self.turn_id, %target,
                    "told the person owed a reply that the seat is out of budget; the reply itself is still owed");
                true
            }
            Ok(out) => {
                for k in &won {
                    k.release(ledger).await;
                }
                warn!(subsystem = "turns", seat = %self.handle, turn_id = %self.turn_id, %target,
                    refusal = %out.text, "the reply tool refused the budget park's notice");
                false
            }
            Err(e) => {
                warn!(subsystem = "turns", seat = %self.handle, turn_id = %self.turn_id, %target,
                    error = %e, "the reply tool could not be reached for the budget park's notice (not retried, it may have posted)");
                false
            }
        }
    }
}
