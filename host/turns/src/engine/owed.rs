//! The replies a turn's triggers are owed: one ledger record per trigger.
//!
//! Rules, and why:
//! - A reply is owed once per trigger, whatever batch or turn it later runs
//!   in: the record's key is the trigger's, never the turn's. A crash that
//!   re-batches w1 with a later w2 runs a new turn id, and w1's reply must
//!   not be posted again.
//! - Intent, then completion: the record is created (`intent`, holding the
//!   whole call) before the tool runs, and replaced with `posted` once the
//!   tool answered. A node that finds an intent without a completion cannot
//!   tell from the ledger whether the post landed, so it asks the surface:
//!   - a reply tool whose schema takes an `idempotency_key` was called with
//!     one (derived from the triggers and the target); the recorded call is
//!     made again, the surface answers the first post if there was one, and
//!     the record is completed — the reply is posted exactly once;
//!   - any other tool cannot be asked: the record becomes `uncertain`, a
//!     `reply_uncertain` event says so, nothing is posted again, and the
//!     turn's outcome is `reply_uncertain`, never `delivered`.
//! - Unknown (the ledger cannot answer) posts nothing: an outage, run again.

use crewlet_bus::Wake;
use crewlet_coord::{Answer, CoordError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Brain, Run, Stop};
use crate::ports::Toolbox;
use crate::trigger::{self, Target};

/// The ledger record class of reply keys (this and the per-turn ones).
pub(super) const CLASS: &str = "reply";

/// The argument a reply tool declares when its surface dedupes posts.
pub(super) const IDEMPOTENCY_ARG: &str = "idempotency_key";

/// Where a recorded reply stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum State {
    Intent,
    Posted,
    Uncertain,
}

/// One trigger's reply as the ledger holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    state: State,
    trigger: String,
    turn_id: String,
    seat: String,
    target: String,
    server: String,
    tool: String,
    /// The call as made, its idempotency key included.
    arguments: Value,
    idempotent: bool,
    at_ms: i64,
}

/// What this turn knows of one trigger's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Standing {
    Unanswered,
    Answered,
    /// An intent without a completion, on a surface that cannot be asked.
    Uncertain,
}

/// A reply one of the turn's triggers is owed.
#[derive(Debug, Clone)]
pub(super) struct Owed {
    /// The trigger's completion-ledger key.
    pub(super) trigger: String,
    pub(super) target: Target,
    pub(super) standing: Standing,
    /// The revision of this turn's own intent, while a call to the tool
    /// could not be reached (an idempotent tool is called again with it).
    intent: Option<u64>,
}

impl Owed {
    /// The replies `wakes` are owed.
    pub(super) fn of(wakes: &[Wake]) -> Vec<Owed> {
        wakes
            .iter()
            .filter_map(|w| {
                Some(Owed {
                    trigger: trigger::trigger_key(w),
                    target: trigger::owed(w)?,
                    standing: Standing::Unanswered,
                    intent: None,
                })
            })
            .collect()
    }

    fn id(&self) -> String {
        hex16(&format!("trigger\n{}", self.trigger))
    }
}

fn hex16(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The idempotency key of one post for `triggers` (sorted) at `target`.
fn idempotency_key(triggers: &[&str], target: &Target) -> String {
    hex16(&format!("{}\n{target}", triggers.join("\n")))
}

/// The most a recorded call may weigh: a reply is a message, not a file.
const MAX_RECORDED: usize = 64 * 1024;

impl<B: Brain, T: Toolbox> Run<'_, B, T> {
    /// Before the first model call: reads each owed reply's record and
    /// finishes what an earlier run left between intent and completion.
    pub(super) async fn settle_replies(&mut self) -> Result<(), Stop> {
        for i in 0..self.replies.len() {
            let id = self.replies[i].id();
            let read = self.engine.ledger.get_record(CLASS, &id).await;
            let (value, revision) = match read {
                Ok(Answer::Yes(found)) => found,
                Ok(Answer::No(())) => continue,
                Err(e) => return Err(unreadable(&self.replies[i].target, e)),
            };
            let Ok(record) = serde_json::from_value::<Record>(value) else {
                // A record this version cannot read: someone answered, in a
                // way this node cannot check. Never post on top of it.
                self.replies[i].standing = Standing::Uncertain;
                continue;
            };
            self.replies[i].standing = match record.state {
                State::Posted => Standing::Answered,
                State::Uncertain => {
                    self.uncertain_event(&record, "recorded as uncertain by an earlier run")
                        .await;
                    Standing::Uncertain
                }
                State::Intent if record.idempotent => {
                    self.finish_intent(i, &id, record, revision).await?
                }
                State::Intent => {
                    self.mark_uncertain(&id, record, revision).await;
                    Standing::Uncertain
                }
            };
        }
        self.owed = self
            .replies
            .iter()
            .find(|o| o.standing == Standing::Unanswered)
            .map(|o| o.target.clone());
        Ok(())
    }

    /// Makes an earlier run's recorded call again on a surface that dedupes.
    async fn finish_intent(
        &mut self,
        i: usize,
        id: &str,
        record: Record,
        revision: u64,
    ) -> Result<Standing, Stop> {
        let call = self
            .tools
            .call(
                &record.server,
                &record.tool,
                record.arguments.clone(),
                &self.turn_id,
            )
            .await;
        match call {
            Ok(out) if !out.is_error => {
                self.complete(id, &record, revision).await;
                // The recorded call's arguments named its target when it
                // was made (a reply tool's call without one is refused).
                let target = Target::of_arguments(&record.arguments).unwrap_or_else(|| Target {
                    channel: record.target.clone(),
                    thread: None,
                });
                self.posted(
                    &record.server,
                    &record.tool,
                    &target,
                    text_of(&record.arguments),
                    Some(&record.turn_id),
                )
                .await;
                Ok(Standing::Answered)
            }
            // A definite "not posted": the reply is owed again.
            Ok(_) => {
                let _ = self.engine.ledger.remove_record(CLASS, id).await;
                Ok(Standing::Unanswered)
            }
            Err(e) => Err(Stop::Outage(format!(
                "the reply owed in {} was begun by an earlier run and its tool cannot be reached to finish it: {e}",
                self.replies[i].target
            ))),
        }
    }

    /// Posts `args` through a reply tool for the owed replies `target`
    /// answers; `None` when `target` answers none of them (the per-turn key
    /// governs that post).
    pub(super) async fn post_owed(
        &mut self,
        server: &str,
        tool: &str,
        mut args: Value,
        target: &Target,
    ) -> Option<Result<Posting, Stop>> {
        let owing: Vec<usize> = (0..self.replies.len())
            .filter(|&i| self.replies[i].target.answered_by(target))
            .collect();
        if owing.is_empty() {
            return None;
        }
        let open: Vec<usize> = owing
            .into_iter()
            .filter(|&i| self.replies[i].standing == Standing::Unanswered)
            .collect();
        if open.is_empty() {
            return Some(Ok(Posting::AlreadyAnswered));
        }
        let idempotent = self.takes_idempotency_key(server, tool);
        if idempotent {
            let mut triggers: Vec<&str> = open
                .iter()
                .map(|&i| self.replies[i].trigger.as_str())
                .collect();
            triggers.sort_unstable();
            args[IDEMPOTENCY_ARG] = Value::String(idempotency_key(&triggers, target));
        }
        let size = args.to_string().len();
        if size > MAX_RECORDED {
            return Some(Ok(Posting::TooLarge(size)));
        }
        let mut intents = Vec::new();
        for &i in &open {
            let record = Record {
                state: State::Intent,
                trigger: self.replies[i].trigger.clone(),
                turn_id: self.turn_id.clone(),
                seat: self.handle.clone(),
                target: target.to_string(),
                server: server.to_owned(),
                tool: tool.to_owned(),
                arguments: args.clone(),
                idempotent,
                at_ms: self.engine.clock.now_ms(),
            };
            if let Some(rev) = self.replies[i].intent.filter(|_| idempotent) {
                intents.push((i, record, rev));
                continue;
            }
            match self.create(&self.replies[i].id(), &record).await {
                Ok(Answer::Yes(rev)) => intents.push((i, record, rev)),
                // Written meanwhile by another run: never post on top of it.
                Ok(Answer::No(posted)) => {
                    self.replies[i].standing = if posted {
                        Standing::Answered
                    } else {
                        Standing::Uncertain
                    }
                }
                Err(e) => return Some(Err(unreadable(target, e))),
            }
        }
        if intents.is_empty() {
            return Some(Ok(Posting::AlreadyAnswered));
        }
        self.engine.crash_point(super::CrashPoint::AfterIntent);
        let call = self.tools.call(server, tool, args, &self.turn_id).await;
        Some(Ok(match call {
            Ok(out) if !out.is_error => {
                self.engine.crash_point(super::CrashPoint::AfterPost);
                for (i, record, rev) in &intents {
                    let id = self.replies[*i].id();
                    self.complete(&id, record, *rev).await;
                    self.replies[*i].standing = Standing::Answered;
                    self.replies[*i].intent = None;
                }
                self.engine.crash_point(super::CrashPoint::AfterReply);
                Posting::Posted(out.text)
            }
            Ok(out) => {
                for (i, _, _) in &intents {
                    let id = self.replies[*i].id();
                    let _ = self.engine.ledger.remove_record(CLASS, &id).await;
                    self.replies[*i].intent = None;
                }
                Posting::Refused(out.text)
            }
            Err(e) if idempotent => {
                for (i, _, rev) in &intents {
                    self.replies[*i].intent = Some(*rev);
                }
                Posting::Unreachable {
                    error: e,
                    retry: true,
                }
            }
            Err(e) => {
                for (i, record, rev) in intents {
                    let id = self.replies[i].id();
                    self.mark_uncertain(&id, record, rev).await;
                    self.replies[i].standing = Standing::Uncertain;
                }
                Posting::Unreachable {
                    error: e,
                    retry: false,
                }
            }
        }))
    }

    /// Creates an intent; No says whether what is there was posted.
    async fn create(&self, id: &str, record: &Record) -> Result<Answer<u64, bool>, CoordError> {
        let value = serde_json::to_value(record).expect("a record serialises");
        Ok(
            match self.engine.ledger.create_record(CLASS, id, &value).await? {
                Answer::Yes(rev) => Answer::Yes(rev),
                Answer::No(there) => Answer::No(
                    serde_json::from_value::<Record>(there).is_ok_and(|r| r.state == State::Posted),
                ),
            },
        )
    }

    /// Records the completion. Best effort: a completion lost leaves the
    /// intent, which a later run finishes (idempotent) or reports uncertain.
    async fn complete(&self, id: &str, record: &Record, revision: u64) {
        let done = Record {
            state: State::Posted,
            ..record.clone()
        };
        let value = serde_json::to_value(&done).expect("a record serialises");
        if let Err(e) = self
            .engine
            .ledger
            .replace_record(CLASS, id, &value, revision)
            .await
        {
            tracing::warn!(subsystem = "turns", target = %record.target, error = %e,
                "the reply was posted but its completion could not be recorded; a later run will ask the surface");
        }
    }

    async fn mark_uncertain(&mut self, id: &str, record: Record, revision: u64) {
        let marked = Record {
            state: State::Uncertain,
            ..record
        };
        let value = serde_json::to_value(&marked).expect("a record serialises");
        let _ = self
            .engine
            .ledger
            .replace_record(CLASS, id, &value, revision)
            .await;
        self.uncertain_event(
            &marked,
            "a post was begun and may have landed; its surface cannot be asked (its reply tool takes no idempotency_key), so it is not posted again",
        )
        .await;
    }

    async fn uncertain_event(&mut self, record: &Record, why: &str) {
        self.emit(
            "reply_uncertain",
            json!({"turn_id": self.turn_id, "trigger": record.trigger, "server": record.server,
                   "tool": record.tool, "target": record.target, "begun_by": record.turn_id,
                   "reason": why}),
        )
        .await;
    }

    /// Whether `server`'s `tool` declares the idempotency argument.
    pub(super) fn takes_idempotency_key(&self, server: &str, tool: &str) -> bool {
        self.tools.tools(server).is_ok_and(|defs| {
            defs.iter().any(|d| {
                d.name == tool && d.parameters["properties"].get(IDEMPOTENCY_ARG).is_some()
            })
        })
    }

    /// The targets whose reply is uncertain, for the turn's outcome.
    pub(super) fn uncertain_targets(&self) -> Vec<String> {
        self.replies
            .iter()
            .filter(|o| o.standing == Standing::Uncertain)
            .map(|o| o.target.to_string())
            .collect()
    }

    /// The targets already answered before this turn's model calls.
    pub(super) fn answered_targets(&self) -> Vec<String> {
        self.replies
            .iter()
            .filter(|o| o.standing == Standing::Answered)
            .map(|o| o.target.to_string())
            .collect()
    }
}

/// How a post for owed replies went.
pub(super) enum Posting {
    Posted(String),
    /// Every reply the target answers was posted (or is uncertain) already.
    AlreadyAnswered,
    Refused(String),
    Unreachable {
        error: String,
        retry: bool,
    },
    TooLarge(usize),
}

fn unreadable(target: &Target, e: CoordError) -> Stop {
    Stop::Outage(format!("cannot record the reply key for {target}: {e}"))
}

/// The `text` argument of a reply tool's call.
pub(super) fn text_of(args: &Value) -> String {
    args.get("text")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}
