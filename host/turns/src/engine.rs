//! One turn: executor → reviewer, re-entered on `iterate` up to the role's
//! `max_iterations`; inside each phase the model ↔ tool loop, bounded by
//! `max_tool_rounds` for the executor and a constant for the reviewer.
//!
//! Rules, and why (each in the module that keeps it):
//! - The company is taken by value at the top of the turn ([`Turn::active`])
//!   and held until it ends: an apply landing mid-turn cannot change a cap
//!   between the executor and the reviewer.
//! - [`admission`]: the completion ledger and the budget windows are read
//!   side by side before the turn. A trigger the ledger does not know about
//!   is done (the reply key keeps it from being said twice); a window known
//!   full parks the work before the first call, recorded without a charge;
//!   an unreadable counter is an outage.
//! - [`rounds`]: delivery is the engine's judgement, checked three times in
//!   increasing cost: a `submit_work` claiming delivery that the tool record
//!   refutes is bounced at decode time ([`dispatch`]); a round that ends
//!   without a submission loops back without a review call; a reviewer's
//!   `done` on a turn that owed a reply and posted none is overturned.
//! - [`budget`]: every round is charged, company then seat, in the windows
//!   current when it is charged (a turn crossing midnight or a Monday pays
//!   the new window), and each call's `max_tokens` is clamped to the room
//!   left. A refusal stops the next call (the paid answer's tool calls
//!   still run); an unreachable counter is an outage, never "out of budget".
//! - [`park`]: a turn a budget stopped ends parked ([`TurnEnd::Parked`]):
//!   its triggers are not completed and its wakes wait in the mailbox until
//!   the full window turns over or a cap is raised.
//! - [`owed`]: a reply a trigger is owed is posted once per trigger, across
//!   crashes and re-batching: its intent is recorded before the tool runs
//!   and its completion after; an intent found without a completion is
//!   finished through a surface that dedupes, or reported `reply_uncertain`.
//! - [`reply`]: any other post is at most once per turn and target: its key
//!   is created in the ledger bucket before the tool runs. Unknown refuses
//!   to post (never twice) and fails the turn as an outage, to be run again.
//! - [`notice`]: a parked seat's out-of-budget notice (opt-in) is its own
//!   post, once per trigger and window, never the owed reply.
//! - [`events`]: every step is emitted in order but published off the
//!   turn's critical path (one writer task): a row or a broadcast never
//!   delays a model call.
//! - [`surface`]: the thread is read back before the first model call and
//!   the working indicator raised while the seat thinks, through the
//!   seat's own chat server; neither is ever fatal, and the indicator is
//!   cleared whatever the outcome (a guard).
//! - [`prefetch`]: before the first call the seat's memory, the asker's
//!   profile, its skills, onboarding and the roster are fetched
//!   concurrently under one bound; a block that fails is skipped, named.
//! - [`memory`]: `remember` / `recall`, and every ended turn kept as an
//!   episode of the seat's memory.
//! - [`prompts`]: everything a model reads is written there.

mod admission;
mod budget;
mod dispatch;
mod events;
mod follow;
mod memory;
mod notice;
mod owed;
mod park;
mod prefetch;
mod prompts;
mod reply;
mod rounds;
mod surface;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use crewlet_bus::Wake;
use crewlet_company::{Active, Company, Role, Seat};
use crewlet_coord::{Budgets, Caps, Follows, Ledger};
use serde_json::json;
use tracing::{info, warn};

pub use budget::estimate;
pub use memory::{MAX_NOTE_BYTES, MAX_SUMMARY_BYTES};
pub use park::{
    BudgetRoom, Park, budget_parked, budget_room, company_time, park_for, parked_on, turns_over_at,
};
pub use park::{windows_at, windows_now};
pub use prefetch::{MAX_BLOCK_BYTES, Prefetched, QUOTED, prefetch_recalled};
pub use surface::{MAX_THREAD_BYTES, MAX_THREAD_MESSAGES};

use crate::ports::{Brain, Clock, EventSink, Said, Sessions, Toolbox};
use crate::trigger::{self, Target};
use events::Events;

/// Bounds that are the engine's, not the company's.
#[derive(Debug, Clone)]
pub struct Limits {
    /// `max_tokens` of every model request.
    pub max_tokens: u32,
    /// Model calls the reviewer gets to reach its one verdict.
    pub review_rounds: u32,
    /// How much of a tool's answer the reviewer's record shows.
    pub record_clip: usize,
    /// Tests only: the process dies (as if killed) at this point of a
    /// reply, so a test can crash a node exactly there.
    pub crash_at: Option<CrashPoint>,
    /// How long the turn's own calls on its chat server (the thread read
    /// back, the working indicator) may take each ([`surface`]).
    pub surface_timeout: std::time::Duration,
    /// How long the turn-start prefetch may take, all blocks together
    /// ([`prefetch`]).
    pub prefetch_timeout: std::time::Duration,
}

/// Where in a reply a test may have the node die.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// The intent is recorded; the tool was not called.
    AfterIntent,
    /// The tool posted; the completion is not recorded.
    AfterPost,
    /// The completion is recorded; the turn has not ended.
    AfterReply,
}

impl CrashPoint {
    /// Parses `reply.after_intent`, `reply.after_post`, `reply.after_reply`.
    pub fn parse(s: &str) -> Option<CrashPoint> {
        match s {
            "reply.after_intent" => Some(CrashPoint::AfterIntent),
            "reply.after_post" => Some(CrashPoint::AfterPost),
            "reply.after_reply" => Some(CrashPoint::AfterReply),
            _ => None,
        }
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_tokens: 4096,
            review_rounds: 2,
            record_clip: 600,
            crash_at: None,
            surface_timeout: std::time::Duration::from_secs(5),
            prefetch_timeout: std::time::Duration::from_secs(3),
        }
    }
}

/// The engine's ports that are not per seat.
#[derive(Clone)]
pub struct Ports {
    pub events: Arc<dyn EventSink>,
    pub sessions: Arc<dyn Sessions>,
    pub clock: Arc<dyn Clock>,
}

/// Runs turns. Cheap to share.
pub struct TurnEngine<B> {
    brain: Arc<B>,
    budgets: Budgets,
    ledger: Ledger,
    /// The threads each seat follows (see `engine::follow`).
    follows: Follows,
    events: Events,
    sessions: Arc<dyn Sessions>,
    clock: Arc<dyn Clock>,
    limits: Limits,
    /// The seat's long memory; without it no `remember` / `recall` is
    /// offered and the prefetch renders the roster only.
    recall: Option<crate::memory::Recall>,
}

/// One turn to run: a batch of wakes of one conversation for one seat.
pub struct Turn<'a, T> {
    pub seat: &'a Seat,
    /// The company the turn runs under, taken at its start.
    pub active: &'a Active,
    pub wakes: &'a [Wake],
    /// The seat's own tools.
    pub tools: &'a T,
    /// Whether this node may still act for the seat: asked before every
    /// model call.
    pub may_act: &'a (dyn Fn() -> Act + Send + Sync),
}

/// Whether a turn may go on, asked before each of its model calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    Go,
    /// This node no longer holds the seat's lease: a peer runs the turn.
    FenceLost,
    /// An operator paused the seat: the turn stops, not done, and runs
    /// again once the seat is resumed.
    Paused,
}

/// How a turn that ran ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    NoAction,
    Blocked(String),
    Failed(String),
    /// Every model of the chain failed.
    LlmUnavailable(String),
    /// A reply this turn owed was begun by an earlier run and may or may
    /// not have landed (the targets); it was not posted again.
    ReplyUncertain(String),
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::NoAction => "no_action",
            Outcome::Blocked(_) => "blocked",
            Outcome::Failed(_) => "failed",
            Outcome::LlmUnavailable(_) => "llm_unavailable",
            Outcome::ReplyUncertain(_) => "reply_uncertain",
        }
    }

    fn detail(&self) -> Option<&str> {
        match self {
            Outcome::Blocked(s)
            | Outcome::Failed(s)
            | Outcome::LlmUnavailable(s)
            | Outcome::ReplyUncertain(s) => Some(s),
            _ => None,
        }
    }
}

/// What became of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnEnd {
    /// The ledger says every trigger was already served: nothing ran.
    AlreadyDone,
    /// The turn ran and ended; its triggers are recorded as completed.
    Ended { turn_id: String, outcome: Outcome },
    /// Our outage (an unreachable store): not done, not recorded, not lost —
    /// run it again later.
    Outage { turn_id: String, reason: String },
    /// This node may no longer act for the seat; a peer will run it.
    FenceLost { turn_id: String },
    /// The seat was paused before a model call: not done, not recorded —
    /// it runs again when the seat is resumed.
    Paused { turn_id: String },
    /// A budget stopped the turn (before its first call, or mid-turn after
    /// the paid answer's tool calls ran): not done, not recorded — the work
    /// waits for room, as [`Park`] says.
    Parked { turn_id: String, park: Park },
}

/// Why a phase stopped the turn early.
enum Stop {
    Budget(Park),
    Unavailable(String),
    Outage(String),
    Fence,
    Paused,
}

impl From<crate::ports::Unavailable> for Stop {
    fn from(u: crate::ports::Unavailable) -> Stop {
        match u {
            crate::ports::Unavailable::Chain(reason) => Stop::Unavailable(reason),
            crate::ports::Unavailable::KeyUnknown(reason) => {
                Stop::Outage(format!("a model key is not known yet: {reason}"))
            }
        }
    }
}

/// How a turn that started stopped without an outcome: not done.
enum Halt {
    Outage(String),
    Fence,
    Paused,
    Parked(Park),
}

impl<B: Brain> TurnEngine<B> {
    /// A turn engine; starts its event writer, so call it in a runtime.
    pub fn new(
        brain: Arc<B>,
        budgets: Budgets,
        ledger: Ledger,
        follows: Follows,
        ports: Ports,
        limits: Limits,
    ) -> TurnEngine<B> {
        TurnEngine {
            brain,
            budgets,
            ledger,
            follows,
            events: Events::start(ports.events),
            sessions: ports.sessions,
            clock: ports.clock,
            limits,
            recall: None,
        }
    }

    /// The engine, remembering and recalling through `recall`.
    pub fn with_recall(mut self, recall: crate::memory::Recall) -> TurnEngine<B> {
        self.recall = Some(recall);
        self
    }

    /// Dies here if a test asked for it (see [`Limits::crash_at`]).
    fn crash_point(&self, at: CrashPoint) {
        if self.limits.crash_at == Some(at) {
            tracing::error!(subsystem = "turns", point = ?at, "dying at the crash point a test asked for");
            std::process::abort();
        }
    }

    /// Publishes every event still queued; later events are published
    /// inline. Call it when the node stops, after the last turn.
    pub async fn close(&self) {
        self.events.close().await;
    }

    /// Runs one turn to its end.
    pub async fn run<T: Toolbox>(&self, turn: Turn<'_, T>) -> TurnEnd {
        let company = turn.active.company.clone();
        let role = company.role_of(turn.seat).clone();
        let handle = turn.seat.handle.as_str();
        let Some(admission) = admission::read(self, &company, &role, handle, turn.wakes).await
        else {
            return TurnEnd::AlreadyDone;
        };
        let wakes = admission.wakes;
        let mut run = Run {
            engine: self,
            turn_id: trigger::turn_id(&admission.keys),
            handle: handle.to_owned(),
            trace_id: wakes.first().map(|w| w.trace_id.clone()),
            conversation: wakes.iter().find_map(|w| w.conversation.clone()),
            owed: wakes.iter().find_map(trigger::owed),
            replies: owed::Owed::of(&wakes),
            company_caps: budget::caps(&company.budget),
            seat_caps: budget::caps(&role.budget),
            role,
            company,
            wakes,
            tools: turn.tools,
            may_act: turn.may_act,
            record: Vec::new(),
            thread: None,
            activated: BTreeSet::new(),
            said: Vec::new(),
            metered: None,
            input_tokens: 0,
            output_tokens: 0,
            model_calls: 0,
            iterations: 0,
            prefetched: String::new(),
            first_turn: false,
            notes_kept: 0,
        };
        let started = Instant::now();
        run.emit(
            "turn_started",
            json!({
                "turn_id": run.turn_id,
                "role": run.role.name,
                "epoch": turn.active.epoch,
                "triggers": admission.keys,
                "owes_reply": run.owed.as_ref().map(|t| t.to_string()),
            }),
        )
        .await;
        let end = run.run(admission.room).await;
        let (label, detail) = match &end {
            Ok(o) => (o.label(), o.detail().map(str::to_owned)),
            Err(Halt::Outage(r)) => ("outage", Some(r.clone())),
            Err(Halt::Fence) => ("fence_lost", None),
            Err(Halt::Paused) => ("paused", None),
            // Stopped before any call was paid for, or by the meter.
            Err(Halt::Parked(_)) if run.model_calls == 0 => ("parked", None),
            Err(Halt::Parked(_)) => ("budget_exhausted", None),
        };
        run.emit(
            "turn_ended",
            json!({
                "turn_id": run.turn_id,
                "outcome": label,
                "detail": detail,
                "iterations": run.iterations,
                "model_calls": run.model_calls,
                "tool_calls": run.record.len(),
                "replies": run.said.len(),
                "input_tokens": run.input_tokens,
                "output_tokens": run.output_tokens,
                "ms": started.elapsed().as_millis() as u64,
            }),
        )
        .await;
        match end {
            Ok(outcome) => {
                run.finish(&admission.keys).await;
                run.keep_episode(&outcome).await;
                TurnEnd::Ended {
                    turn_id: run.turn_id,
                    outcome,
                }
            }
            Err(Halt::Fence) => TurnEnd::FenceLost {
                turn_id: run.turn_id,
            },
            Err(Halt::Paused) => TurnEnd::Paused {
                turn_id: run.turn_id,
            },
            Err(Halt::Parked(park)) => TurnEnd::Parked {
                turn_id: run.turn_id,
                park,
            },
            Err(Halt::Outage(reason)) => TurnEnd::Outage {
                turn_id: run.turn_id,
                reason,
            },
        }
    }
}

/// One tool call in the turn's record.
#[derive(Debug, Clone)]
struct Ran {
    name: String,
    arguments: String,
    ok: bool,
    answer: String,
    /// A reply tool that posted (or had already posted) to this target.
    posted_to: Option<Target>,
}

/// The state of one running turn.
struct Run<'a, B, T> {
    engine: &'a TurnEngine<B>,
    turn_id: String,
    handle: String,
    trace_id: Option<String>,
    conversation: Option<String>,
    /// The first reply still owed (after [`Run::settle_replies`]).
    owed: Option<Target>,
    /// Every reply the triggers are owed, and where each stands.
    replies: Vec<owed::Owed>,
    company_caps: Caps,
    seat_caps: Caps,
    role: Role,
    company: Arc<Company>,
    wakes: Vec<Wake>,
    tools: &'a T,
    may_act: &'a (dyn Fn() -> Act + Send + Sync),
    record: Vec<Ran>,
    /// The thread read back for the executor ([`surface`]).
    thread: Option<(surface::Mapped, surface::ThreadText)>,
    activated: BTreeSet<(String, String)>,
    said: Vec<Said>,
    /// A refusal the meter answered to a charged call: the next call stops.
    metered: Option<Park>,
    input_tokens: u64,
    output_tokens: u64,
    model_calls: u32,
    iterations: u32,
    /// The prefetch's blocks, for the executor's prompt ([`prefetch`]).
    prefetched: String,
    /// The prefetch found the seat never onboarded: this turn onboards it.
    first_turn: bool,
    /// Notes `remember` kept in this turn.
    notes_kept: u32,
}

impl<B: Brain, T: Toolbox> Run<'_, B, T> {
    async fn run(&mut self, room: admission::Room) -> Result<Outcome, Halt> {
        let stop = match self.begin(room).await {
            Ok(Some(outcome)) => return Ok(self.judged(outcome)),
            Ok(None) => {
                // Raised while the seat thinks; cleared on every way out,
                // and by the guard if this future is dropped.
                let working = self.raise_working().await;
                let iterated = self.iterate().await;
                self.clear_working(working).await;
                match iterated {
                    Ok(outcome) => return Ok(self.judged(outcome)),
                    Err(stop) => stop,
                }
            }
            Err(stop) => stop,
        };
        // An unavailable chain ends the turn; a budget, an outage and a
        // lost fence leave it not done.
        match stop {
            Stop::Budget(park) => {
                let told = self.announce(&park).await;
                self.parked(&park, &told).await;
                Err(Halt::Parked(park))
            }
            Stop::Unavailable(reason) => Ok(Outcome::LlmUnavailable(reason)),
            Stop::Outage(reason) => Err(Halt::Outage(reason)),
            Stop::Fence => Err(Halt::Fence),
            Stop::Paused => Err(Halt::Paused),
        }
    }

    /// Settles what earlier runs left of the owed replies, then admits.
    async fn begin(&mut self, room: admission::Room) -> Result<Option<Outcome>, Stop> {
        self.settle_replies().await?;
        self.admit(room).await.map(|()| None)
    }

    /// A turn whose owed reply is uncertain never ends as delivered.
    fn judged(&self, outcome: Outcome) -> Outcome {
        let uncertain = self.uncertain_targets();
        match outcome {
            Outcome::Delivered | Outcome::NoAction if !uncertain.is_empty() => {
                Outcome::ReplyUncertain(uncertain.join(", "))
            }
            other => other,
        }
    }

    /// Writes the ledger and the session after a turn that ended.
    async fn finish(&self, keys: &[String]) {
        for key in keys {
            if let Err(e) = self.engine.ledger.complete(key).await {
                warn!(subsystem = "turns", %key, error = %e, "cannot record the trigger as completed; a redelivery may run it again (its reply keys still hold)");
            }
        }
        self.remember();
    }

    /// Records the park (event and log line); the triggers stay open, and
    /// the session is written by the run that finishes them.
    /// `told`: the targets the notice reached ([`notice`]).
    async fn parked(&self, park: &Park, told: &[String]) {
        let until = park::company_time(&self.company, park.until);
        info!(subsystem = "turns", seat = %self.handle, turn_id = %self.turn_id,
            scope = %park.scope_name(), period = park.period_name(), window = %park.window,
            %until, need = park.need, "the seat's work is parked until its budget has room");
        self.emit(
            "budget_parked",
            json!({
                "turn_id": self.turn_id,
                "scope": park.scope_name(),
                "period": park.period_name(),
                "window": park.window,
                "spent": park.spent,
                "cap": park.cap,
                "need": park.need,
                "until": until,
                "until_ms": park.until.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
                "announced_to": told,
            }),
        )
        .await;
    }

    /// Records what the turn said in its conversation's session.
    fn remember(&self) {
        if let Some(conv) = &self.conversation
            && let Err(e) = self.engine.sessions.remember(
                &self.handle,
                conv,
                &self.said,
                self.engine.clock.now_ms(),
            )
        {
            warn!(subsystem = "turns", error = %e, "cannot record the conversation session");
        }
    }
}
