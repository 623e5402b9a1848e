//! One turn: executor → reviewer, re-entered on `iterate` up to the role's
//! `max_iterations`; inside each phase the model ↔ tool loop, bounded by
//! `max_tool_rounds` for the executor and a constant for the reviewer.
//!
//! Rules, and why:
//! - The company is taken by value at the top of the turn ([`Turn::active`])
//!   and held until it ends: an apply landing mid-turn cannot change a cap
//!   between the executor and the reviewer.
//! - The completion ledger is read before the turn and written after it, so
//!   a redelivered wake does not run a finished turn again. Unknown fails
//!   open (the work is done; the reply key below keeps it from being said
//!   twice).
//! - Delivery is the engine's judgement, checked three times in increasing
//!   cost: a `submit_work` claiming delivery that the tool record refutes is
//!   bounced at decode time (one tool call fixes it); a round that ends
//!   without a submission loops back without a review call; a reviewer's
//!   `done` on a turn that owed a reply and posted none is overturned.
//! - A reply is posted at most once per turn and target: its key is created
//!   in the ledger bucket before the tool runs. Unknown refuses to post
//!   (never twice) and fails the turn as an outage, to be run again.
//! - Every round is charged, company then seat, in all windows. A refusal
//!   stops the next call; a window known full turns the work away before
//!   the first call, recorded without a charge; an unreachable counter is
//!   an outage, never "out of budget".
//! - Events for every step are emitted in order but published off the
//!   turn's critical path (one writer task): a row or a broadcast never
//!   delays a model call.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use crewlet_company::{Active, Ceilings, Company, Role, Seat};
use crewlet_coord::{Answer, Bucket, BudgetView, Caps, Coord, Period, Refusal, Scope, Windows};
use crewlet_ingress::Wake;
use crewlet_observe::Publisher;
use crewlet_store::{EventRecord, Party, Said, Store};
use serde_json::{Value, json};
use tracing::warn;

use crate::builtins::{self, Claimed, SubmitReview, SubmitWork, Verdict};
use crate::ports::{Brain, Call, CallSite, Msg, Phase, Prompt, Speaker, Thought, ToolDef, Toolbox};
use crate::trigger::{self, Target};

/// Bounds that are the engine's, not the company's.
#[derive(Debug, Clone)]
pub struct Limits {
    /// `max_tokens` of every model request.
    pub max_tokens: u32,
    /// Model calls the reviewer gets to reach its one verdict.
    pub review_rounds: u32,
    /// How much of a tool's answer the reviewer's record shows.
    pub record_clip: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_tokens: 4096,
            review_rounds: 2,
            record_clip: 600,
        }
    }
}

/// Runs turns. Cheap to share.
pub struct TurnEngine<B> {
    brain: Arc<B>,
    coord: Coord,
    events: Events,
    store: Arc<Store>,
    limits: Limits,
}

/// Events leave the turn's critical path: one writer task publishes them in
/// the order they were emitted (the row inline, then the broadcast), so a
/// model call never waits for a row or a broadcast.
struct Events {
    publisher: Publisher,
    tx: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedSender<EventRecord>>>,
    writer: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Events {
    fn start(publisher: Publisher) -> Events {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<EventRecord>();
        let p = publisher.clone();
        let writer = tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                let kind = ev.kind.clone();
                if let Err(e) = p.publish(ev).await {
                    warn!(subsystem = "turns", %kind, error = %e, "event not published");
                }
            }
        });
        Events {
            publisher,
            tx: std::sync::Mutex::new(Some(tx)),
            writer: std::sync::Mutex::new(Some(writer)),
        }
    }

    async fn emit(&self, ev: EventRecord) {
        let queued = match &*self.tx.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(tx) => tx.send(ev).map_err(|e| e.0),
            None => Err(ev),
        };
        // Closed: published inline, still in order after what was queued.
        if let Err(ev) = queued {
            let kind = ev.kind.clone();
            if let Err(e) = self.publisher.publish(ev).await {
                warn!(subsystem = "turns", %kind, error = %e, "event not published");
            }
        }
    }

    async fn close(&self) {
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = writer {
            let _ = w.await;
        }
    }
}

/// One turn to run: a batch of wakes of one conversation for one seat.
pub struct Turn<'a, T> {
    pub seat: &'a Seat,
    /// The company the turn runs under, taken at its start.
    pub active: &'a Active,
    pub wakes: &'a [Wake],
    /// The seat's own tools.
    pub tools: &'a T,
    /// Whether this node may still act for the seat (its lease fence).
    pub may_act: &'a (dyn Fn() -> bool + Send + Sync),
}

/// How a turn that ran ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    NoAction,
    Blocked(String),
    Failed(String),
    /// A charge was refused mid-turn.
    BudgetExhausted,
    /// A window was already full: refused before the first call.
    TurnedAway,
    /// Every model of the chain failed.
    LlmUnavailable(String),
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::NoAction => "no_action",
            Outcome::Blocked(_) => "blocked",
            Outcome::Failed(_) => "failed",
            Outcome::BudgetExhausted => "budget_exhausted",
            Outcome::TurnedAway => "turned_away",
            Outcome::LlmUnavailable(_) => "llm_unavailable",
        }
    }

    fn detail(&self) -> Option<&str> {
        match self {
            Outcome::Blocked(s) | Outcome::Failed(s) | Outcome::LlmUnavailable(s) => Some(s),
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
}

/// Why a phase stopped the turn early.
enum Stop {
    Budget(Refusal),
    Unavailable(String),
    Outage(String),
    Fence,
}

/// How an executor phase ended.
enum Executed {
    Submitted(SubmitWork),
    /// The round ended without `submit_work`; carries why.
    Unsubmitted(String),
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

impl<B: Brain> TurnEngine<B> {
    /// A turn engine; starts its event writer, so call it in a runtime.
    pub fn new(
        brain: Arc<B>,
        coord: Coord,
        publisher: Publisher,
        store: Arc<Store>,
        limits: Limits,
    ) -> TurnEngine<B> {
        TurnEngine {
            brain,
            coord,
            events: Events::start(publisher),
            store,
            limits,
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
        let windows = windows_now(&company);
        let handle = turn.seat.handle.as_str();
        // Both are reads: the ledger (is anything left to do?) and the
        // budget windows (is there room?), side by side.
        let ledger = futures::future::join_all(turn.wakes.iter().map(|w| async move {
            let key = trigger::trigger_key(w);
            let done = self.coord.completed(&key).await;
            (key, w, done)
        }));
        let seat_scope = Scope::Seat(handle.to_owned());
        let room = async {
            let (c, s) = futures::join!(
                self.coord.budget(&Scope::Company, &windows),
                self.coord.budget(&seat_scope, &windows)
            );
            Ok::<bool, crewlet_coord::CoordError>(
                has_room(&c?, &caps(&company.budget)) && has_room(&s?, &caps(&role.budget)),
            )
        };
        let (ledger, room) = futures::join!(ledger, room);
        let mut pending = Vec::new();
        for (key, w, done) in ledger {
            match done {
                Ok(Answer::Yes(())) => {}
                Ok(Answer::No(())) => pending.push((key, w.clone())),
                Err(e) => {
                    warn!(subsystem = "turns", %key, error = %e, "completion ledger unknown; doing the work");
                    pending.push((key, w.clone()));
                }
            }
        }
        if pending.is_empty() {
            return TurnEnd::AlreadyDone;
        }
        let keys: Vec<String> = pending.iter().map(|(k, _)| k.clone()).collect();
        let wakes: Vec<Wake> = pending.into_iter().map(|(_, w)| w).collect();
        let mut run = Run {
            engine: self,
            turn_id: trigger::turn_id(&keys),
            handle: turn.seat.handle.as_str().to_owned(),
            trace_id: wakes.first().map(|w| w.trace_id.clone()),
            conversation: wakes.iter().find_map(|w| w.conversation.clone()),
            owed: wakes.iter().find_map(trigger::owed),
            windows,
            company_caps: caps(&company.budget),
            seat_caps: caps(&role.budget),
            role,
            company: company.clone(),
            wakes,
            tools: turn.tools,
            may_act: turn.may_act,
            record: Vec::new(),
            activated: BTreeSet::new(),
            said: Vec::new(),
            input_tokens: 0,
            output_tokens: 0,
            model_calls: 0,
            iterations: 0,
        };
        let started = Instant::now();
        run.emit(
            "turn_started",
            json!({
                "turn_id": run.turn_id,
                "role": run.role.name,
                "epoch": turn.active.epoch,
                "triggers": keys,
                "owes_reply": run.owed.as_ref().map(|t| t.to_string()),
            }),
        )
        .await;
        let end = run.run(room).await;
        let (label, detail) = match &end {
            Ok(o) => (o.label(), o.detail().map(str::to_owned)),
            Err(Stop::Outage(r)) => ("outage", Some(r.clone())),
            Err(Stop::Fence) => ("fence_lost", None),
            Err(Stop::Budget(_) | Stop::Unavailable(_)) => unreachable!("mapped by Run::run"),
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
                run.finish(&keys).await;
                TurnEnd::Ended {
                    turn_id: run.turn_id,
                    outcome,
                }
            }
            Err(Stop::Fence) => TurnEnd::FenceLost {
                turn_id: run.turn_id,
            },
            Err(Stop::Outage(reason)) => TurnEnd::Outage {
                turn_id: run.turn_id,
                reason,
            },
            Err(Stop::Budget(_) | Stop::Unavailable(_)) => unreachable!("mapped by Run::run"),
        }
    }
}

/// The state of one running turn.
struct Run<'a, B, T> {
    engine: &'a TurnEngine<B>,
    turn_id: String,
    handle: String,
    trace_id: Option<String>,
    conversation: Option<String>,
    owed: Option<Target>,
    windows: Windows,
    company_caps: Caps,
    seat_caps: Caps,
    role: Role,
    company: Arc<Company>,
    wakes: Vec<Wake>,
    tools: &'a T,
    may_act: &'a (dyn Fn() -> bool + Send + Sync),
    record: Vec<Ran>,
    activated: BTreeSet<(String, String)>,
    said: Vec<Said>,
    input_tokens: u64,
    output_tokens: u64,
    model_calls: u32,
    iterations: u32,
}

impl<B: Brain, T: Toolbox> Run<'_, B, T> {
    async fn run(
        &mut self,
        room: Result<bool, crewlet_coord::CoordError>,
    ) -> Result<Outcome, Stop> {
        match self.admit(room).await {
            Ok(None) => {}
            Ok(Some(outcome)) => return Ok(outcome),
            Err(stop) => return Err(stop),
        }
        match self.iterate().await {
            Ok(o) => Ok(o),
            Err(Stop::Budget(r)) => {
                self.budget_event(&r, false).await;
                Ok(Outcome::BudgetExhausted)
            }
            Err(Stop::Unavailable(reason)) => Ok(Outcome::LlmUnavailable(reason)),
            Err(other) => Err(other),
        }
    }

    /// Turns the work away before the first call when a window is full
    /// (`room` is what a read of the windows said; only a full window is
    /// written to, to record the refusal).
    async fn admit(
        &mut self,
        room: Result<bool, crewlet_coord::CoordError>,
    ) -> Result<Option<Outcome>, Stop> {
        match room {
            Ok(true) => return Ok(None),
            Ok(false) => {}
            Err(e) => {
                return Err(Stop::Outage(format!(
                    "the budget counters are unreachable: {e}"
                )));
            }
        }
        let refused = self
            .engine
            .coord
            .refuse(
                &self.handle,
                &self.windows,
                &self.company_caps,
                &self.seat_caps,
            )
            .await;
        match refused {
            Ok(Answer::No(())) => Ok(None),
            Ok(Answer::Yes(r)) => {
                self.budget_event(&r, true).await;
                Ok(Some(Outcome::TurnedAway))
            }
            Err(e) => Err(Stop::Outage(format!(
                "the budget counters are unreachable: {e}"
            ))),
        }
    }

    async fn iterate(&mut self) -> Result<Outcome, Stop> {
        let mut conversation = vec![
            Msg::system(self.executor_prompt()),
            Msg::user(trigger::render(&self.wakes)),
        ];
        for (server, tool) in self.reply_tools() {
            self.activated.insert((server, tool));
        }
        let max = self.role.max_iterations.max(1);
        for iteration in 1..=max {
            self.iterations = iteration;
            let from = self.record.len();
            let feedback = match self.execute(&mut conversation, iteration).await? {
                Executed::Unsubmitted(why) => why,
                Executed::Submitted(work) => match self.review(&work, from, iteration).await? {
                    (Verdict::Done, _) if self.owed_unanswered() => {
                        self.emit(
                            "review_overturned",
                            json!({"turn_id": self.turn_id, "iteration": iteration,
                                       "reason": "the trigger owed a reply and none was posted"}),
                        )
                        .await;
                        format!(
                            "The review said done, but someone is waiting for your reply in {} and nothing was posted there. Post the reply with your reply tool, then submit.",
                            self.owed
                                .as_ref()
                                .map(|t| t.to_string())
                                .unwrap_or_default()
                        )
                    }
                    (Verdict::Done, _) => {
                        return Ok(match work.outcome {
                            Claimed::Delivered => Outcome::Delivered,
                            Claimed::NoAction => Outcome::NoAction,
                            Claimed::Blocked => Outcome::Blocked(work.summary),
                        });
                    }
                    (Verdict::Failed, feedback) => return Ok(Outcome::Failed(feedback)),
                    (Verdict::Iterate, feedback) => {
                        format!("The review asks for another round: {feedback}")
                    }
                },
            };
            conversation.push(Msg::user(feedback));
        }
        Ok(Outcome::Failed(format!(
            "no accepted result after {max} iteration(s)"
        )))
    }

    fn owed_unanswered(&self) -> bool {
        match &self.owed {
            None => false,
            Some(owed) => !self
                .record
                .iter()
                .any(|r| r.posted_to.as_ref().is_some_and(|t| owed.answered_by(t))),
        }
    }

    /// The executor's model ↔ tool loop for one iteration.
    async fn execute(
        &mut self,
        conversation: &mut Vec<Msg>,
        iteration: u32,
    ) -> Result<Executed, Stop> {
        let chain = self.role.executor.clone();
        for round in 1..=self.role.max_tool_rounds.max(1) {
            let mut tools = builtins::executor_builtins();
            tools.extend(self.activated_defs());
            let thought = self
                .think(
                    &chain,
                    conversation.clone(),
                    tools,
                    false,
                    Phase::Executor,
                    iteration,
                    round,
                )
                .await?;
            conversation.push(Msg {
                speaker: Speaker::Assistant,
                content: thought.text.clone().unwrap_or_default(),
                calls: thought.calls.clone(),
                call_id: None,
            });
            if thought.calls.is_empty() {
                return Ok(Executed::Unsubmitted(
                    "You ended the round with text and no submit_work. Text is not seen by anyone: post what is owed with your tools, then call submit_work.".into(),
                ));
            }
            let mut submitted = None;
            for call in &thought.calls {
                let (answer, work) = self.dispatch(call).await?;
                conversation.push(Msg::tool(&call.id, answer));
                if work.is_some() {
                    submitted = work;
                }
            }
            if let Some(work) = submitted {
                return Ok(Executed::Submitted(work));
            }
        }
        Ok(Executed::Unsubmitted(format!(
            "You used all {} tool rounds of this iteration without submit_work. Finish: post what is owed, then submit.",
            self.role.max_tool_rounds
        )))
    }

    /// The reviewer's judgement of the record since `from`.
    async fn review(
        &mut self,
        work: &SubmitWork,
        from: usize,
        iteration: u32,
    ) -> Result<(Verdict, String), Stop> {
        let chain = vec![self.role.reviewer.clone()];
        let mut conversation = vec![
            Msg::system(format!(
                "You review one round of work by @{} ({} at {}). Judge it against the record of what actually ran, not against what the worker says. Answer with submit_review: done, iterate (say exactly what to fix) or failed.",
                self.handle, self.role.name, self.company.org
            )),
            Msg::user(format!(
                "{}\nRecord of this round:\n{}\nSubmission: {} — {}",
                trigger::render(&self.wakes),
                self.render_record(from),
                serde_json::to_string(&work.outcome).unwrap_or_default(),
                work.summary
            )),
        ];
        for round in 1..=self.engine.limits.review_rounds.max(1) {
            let thought = self
                .think(
                    &chain,
                    conversation.clone(),
                    builtins::reviewer_builtins(),
                    true,
                    Phase::Reviewer,
                    iteration,
                    round,
                )
                .await?;
            let verdict = thought
                .calls
                .iter()
                .find(|c| c.name == builtins::SUBMIT_REVIEW)
                .map(|c| builtins::decode::<SubmitReview>(&c.name, &c.arguments));
            match verdict {
                Some(Ok(r)) => {
                    self.emit(
                        "review",
                        json!({"turn_id": self.turn_id, "iteration": iteration, "verdict": format!("{:?}", r.verdict).to_lowercase(), "feedback": r.feedback}),
                    )
                    .await;
                    return Ok((r.verdict, r.feedback));
                }
                Some(Err(e)) => {
                    conversation.push(assistant(&thought));
                    for c in &thought.calls {
                        conversation.push(Msg::tool(&c.id, e.clone()));
                    }
                }
                None => {
                    conversation.push(assistant(&thought));
                    for c in &thought.calls {
                        conversation
                            .push(Msg::tool(&c.id, "Only submit_review is available to you."));
                    }
                    conversation.push(Msg::user("Answer with submit_review."));
                }
            }
        }
        Ok((Verdict::Failed, "the reviewer gave no verdict".into()))
    }

    /// One model call: fenced, charged, recorded.
    #[allow(clippy::too_many_arguments)]
    async fn think(
        &mut self,
        chain: &[crewlet_company::ModelRef],
        messages: Vec<Msg>,
        tools: Vec<ToolDef>,
        must_call_tool: bool,
        phase: Phase,
        iteration: u32,
        round: u32,
    ) -> Result<Thought, Stop> {
        if !(self.may_act)() {
            return Err(Stop::Fence);
        }
        let site = CallSite {
            turn_id: self.turn_id.clone(),
            seat: self.handle.clone(),
            phase,
            iteration,
            trace_id: self.trace_id.clone(),
        };
        let prompt = Prompt {
            messages,
            tools,
            must_call_tool,
            max_tokens: self.engine.limits.max_tokens,
        };
        let started = Instant::now();
        let thought = self
            .engine
            .brain
            .think(chain, prompt, &site)
            .await
            .map_err(|e| Stop::Unavailable(e.0))?;
        self.model_calls += 1;
        self.input_tokens += thought.input_tokens;
        self.output_tokens += thought.output_tokens;
        self.emit(
            "model_call",
            json!({
                "turn_id": self.turn_id, "phase": phase.as_str(), "iteration": iteration, "round": round,
                "model": thought.model, "input_tokens": thought.input_tokens, "output_tokens": thought.output_tokens,
                "tool_calls": thought.calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
                "ms": started.elapsed().as_millis() as u64,
            }),
        )
        .await;
        let tokens = thought.input_tokens + thought.output_tokens;
        match self
            .engine
            .coord
            .charge(
                &self.handle,
                &self.windows,
                &self.company_caps,
                &self.seat_caps,
                tokens,
            )
            .await
        {
            Ok(Answer::Yes(_)) => Ok(thought),
            Ok(Answer::No(refusal)) => Err(Stop::Budget(refusal)),
            Err(e) => Err(Stop::Outage(format!(
                "the budget counters are unreachable: {e}"
            ))),
        }
    }

    /// Runs one call the executor asked for; answers what the model reads
    /// back, and the submission when the call was an accepted one.
    async fn dispatch(&mut self, call: &Call) -> Result<(String, Option<SubmitWork>), Stop> {
        let started = Instant::now();
        let (answer, ok, posted_to, submitted) = match call.name.as_str() {
            builtins::SUBMIT_WORK => {
                match builtins::decode::<SubmitWork>(&call.name, &call.arguments) {
                    Err(e) => (e, false, None, None),
                    Ok(work) if work.outcome == Claimed::Delivered && self.owed_unanswered() => (
                        format!(
                            "Refused: you claim delivery, but nothing was posted to {} in this turn. Post the reply with your reply tool first, or submit blocked / no_action with the reason.",
                            self.owed
                                .as_ref()
                                .map(|t| t.to_string())
                                .unwrap_or_default()
                        ),
                        false,
                        None,
                        None,
                    ),
                    Ok(work) => ("Submitted for review.".to_owned(), true, None, Some(work)),
                }
            }
            builtins::LIST_TOOLS => {
                match builtins::decode::<builtins::ServerArg>(&call.name, &call.arguments)
                    .and_then(|a| self.tools.tools(&a.server).map(|t| (a.server, t)))
                {
                    Ok((server, tools)) => {
                        let list: Vec<Value> = tools
                        .iter()
                        .map(|t| json!({"name": t.name, "description": t.description, "parameters": t.parameters}))
                        .collect();
                        (
                        json!({"server": server, "tools": list, "hint": "activate_tool makes one callable as SERVER__TOOL"}).to_string(),
                        true,
                        None,
                        None,
                    )
                    }
                    Err(e) => (e, false, None, None),
                }
            }
            builtins::ACTIVATE => {
                match builtins::decode::<builtins::ToolArg>(&call.name, &call.arguments)
                    .and_then(|a| self.activate(&a.server, &a.tool))
                {
                    Ok(name) => (format!("{name} is now callable."), true, None, None),
                    Err(e) => (e, false, None, None),
                }
            }
            name => match builtins::split_offered(name) {
                Some((server, tool)) => {
                    let (server, tool) = (server.to_owned(), tool.to_owned());
                    let (answer, ok, posted) =
                        self.call_mcp(&server, &tool, &call.arguments).await?;
                    (answer, ok, posted, None)
                }
                None => (
                    format!(
                        "There is no tool {name:?}. Your MCP servers' tools are called as SERVER__TOOL after activate_tool."
                    ),
                    false,
                    None,
                    None,
                ),
            },
        };
        self.emit(
            "tool_call",
            json!({"turn_id": self.turn_id, "tool": call.name, "ok": ok, "ms": started.elapsed().as_millis() as u64}),
        )
        .await;
        self.record.push(Ran {
            name: call.name.clone(),
            arguments: call.arguments.clone(),
            ok,
            answer: answer.clone(),
            posted_to,
        });
        Ok((answer, submitted))
    }

    fn activate(&mut self, server: &str, tool: &str) -> Result<String, String> {
        let tools = self.tools.tools(server)?;
        if !tools.iter().any(|t| t.name == tool) {
            return Err(format!(
                "{server} has no tool {tool:?}; list_mcp_server_tools shows what it has"
            ));
        }
        self.activated.insert((server.to_owned(), tool.to_owned()));
        Ok(builtins::offered_name(server, tool))
    }

    /// Calls an MCP tool; a reply tool goes through the reply key first.
    async fn call_mcp(
        &mut self,
        server: &str,
        tool: &str,
        arguments: &str,
    ) -> Result<(String, bool, Option<Target>), Stop> {
        let args: Value = match builtins::decode(tool, arguments) {
            Ok(v) => v,
            Err(e) => return Ok((e, false, None)),
        };
        let is_reply = self
            .role
            .mcp
            .get(server)
            .is_some_and(|s| s.replies.iter().any(|r| r == tool));
        if !is_reply {
            return Ok(match self.tools.call(server, tool, args).await {
                Ok(out) => (out.text, !out.is_error, None),
                Err(e) => (format!("the tool could not be reached: {e}"), false, None),
            });
        }
        let Some(target) = Target::of_arguments(&args) else {
            return Ok((
                format!("{tool} needs a `channel` (and the `thread`) to post to"),
                false,
                None,
            ));
        };
        let key = trigger::reply_key(&self.turn_id, server, tool, &target);
        let text = args
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let claim = self
            .engine
            .coord
            .create_record(
                Bucket::Ledger,
                "reply",
                &key,
                &json!({"turn_id": self.turn_id, "seat": self.handle, "target": target.to_string()}),
            )
            .await;
        match claim {
            Ok(Answer::Yes(_)) => {}
            Ok(Answer::No(_)) => {
                return Ok((
                    format!("Already posted to {target} in this turn; not posted again."),
                    true,
                    Some(target),
                ));
            }
            Err(e) => {
                return Err(Stop::Outage(format!(
                    "cannot record the reply key for {target}: {e}"
                )));
            }
        }
        match self.tools.call(server, tool, args).await {
            Ok(out) if !out.is_error => {
                self.said.push(Said {
                    turn_id: self.turn_id.clone(),
                    text: text.clone(),
                    at_ms: now_ms(),
                });
                self.emit(
                    "reply_posted",
                    json!({"turn_id": self.turn_id, "server": server, "tool": tool, "target": target.to_string(), "text": text}),
                )
                .await;
                Ok((out.text, true, Some(target)))
            }
            Ok(out) => {
                // The tool refused: nothing was posted, so the key is freed
                // for a corrected attempt.
                let _ = self
                    .engine
                    .coord
                    .remove_record(Bucket::Ledger, "reply", &key)
                    .await;
                Ok((out.text, false, None))
            }
            // Unreachable mid-call: it may have posted, so the key stays.
            Err(e) => Ok((
                format!(
                    "the reply tool could not be reached (not retried, it may have posted): {e}"
                ),
                false,
                None,
            )),
        }
    }

    fn reply_tools(&self) -> Vec<(String, String)> {
        self.role
            .mcp
            .iter()
            .flat_map(|(server, s)| s.replies.iter().map(move |t| (server.clone(), t.clone())))
            .collect()
    }

    fn activated_defs(&self) -> Vec<ToolDef> {
        let mut out = Vec::new();
        for (server, tool) in &self.activated {
            if let Ok(tools) = self.tools.tools(server)
                && let Some(t) = tools.into_iter().find(|t| &t.name == tool)
            {
                out.push(ToolDef {
                    name: builtins::offered_name(server, tool),
                    ..t
                });
            }
        }
        out
    }

    fn executor_prompt(&self) -> String {
        let mut p = format!(
            "{}\n\nYou are @{}, {} at {}. Work on the trigger with your tools, then call submit_work exactly once.\n",
            self.role.system_prompt, self.handle, self.role.name, self.company.org
        );
        let servers = self.tools.servers();
        if servers.is_empty() {
            p.push_str("You have no MCP servers.\n");
        } else {
            p.push_str("Your MCP servers (list_mcp_server_tools shows a server's tools; activate_tool makes one callable as SERVER__TOOL):\n");
            for s in servers {
                match (&s.failed, s.tools) {
                    (Some(why), _) => p.push_str(&format!("- {} (unavailable: {why})\n", s.name)),
                    (None, n) => p.push_str(&format!(
                        "- {}{}{}\n",
                        s.name,
                        n.map(|n| format!(" ({n} tools)")).unwrap_or_default(),
                        s.about.map(|a| format!(": {a}")).unwrap_or_default()
                    )),
                }
            }
        }
        if let Some(owed) = &self.owed {
            let tools: Vec<String> = self
                .reply_tools()
                .iter()
                .map(|(s, t)| builtins::offered_name(s, t))
                .collect();
            p.push_str(&format!(
                "Someone is waiting for your reply in {owed}. Post it with {} (channel {:?}{}). A reply you only write as text is never seen.\n",
                if tools.is_empty() { "a reply tool".to_owned() } else { tools.join(" or ") },
                owed.channel,
                owed.thread.as_ref().map(|t| format!(", thread {t:?}")).unwrap_or_default()
            ));
        }
        if let Some(conv) = &self.conversation {
            match self.engine.store.session(&self.handle, conv) {
                Ok(s) if !s.said.is_empty() => {
                    p.push_str("What you already said in this conversation (oldest first):\n");
                    for said in &s.said {
                        p.push_str(&format!("- {}\n", said.text));
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    warn!(subsystem = "turns", error = %e, "cannot read the conversation session")
                }
            }
        }
        p
    }

    fn render_record(&self, from: usize) -> String {
        let clip = self.engine.limits.record_clip;
        let mut s = String::new();
        for r in &self.record[from..] {
            s.push_str(&format!(
                "- {}({}) → {}: {}\n",
                r.name,
                clipped(&r.arguments, clip),
                if r.ok { "ok" } else { "error" },
                clipped(&r.answer, clip)
            ));
        }
        if s.is_empty() {
            s.push_str("(no tool ran)\n");
        }
        s
    }

    /// Writes the ledger and the session after a turn that ended.
    async fn finish(&self, keys: &[String]) {
        for key in keys {
            if let Err(e) = self.engine.coord.complete(key).await {
                warn!(subsystem = "turns", %key, error = %e, "cannot record the trigger as completed; a redelivery may run it again (its reply keys still hold)");
            }
        }
        if let Some(conv) = &self.conversation
            && let Err(e) = self
                .engine
                .store
                .remember(&self.handle, conv, &self.said, now_ms())
        {
            warn!(subsystem = "turns", error = %e, "cannot record the conversation session");
        }
    }

    async fn budget_event(&self, r: &Refusal, before_first_call: bool) {
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

    async fn emit(&self, kind: &str, payload: Value) {
        let mut ev = self.engine.events.publisher.event(kind, payload);
        ev.seat = Some(self.handle.clone());
        ev.trace_id = self.trace_id.clone();
        ev.conversation = self.conversation.clone();
        ev.parties.push(Party {
            party: format!("seat:{}", self.handle),
            role: "seat".into(),
        });
        self.engine.events.emit(ev).await;
    }
}

fn assistant(t: &Thought) -> Msg {
    Msg {
        speaker: Speaker::Assistant,
        content: t.text.clone().unwrap_or_default(),
        calls: t.calls.clone(),
        call_id: None,
    }
}

fn clipped(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Whether every capped window of `view` has room for one more token.
fn has_room(view: &BudgetView, caps: &Caps) -> bool {
    Period::ALL.into_iter().all(|p| {
        let cap = match p {
            Period::Day => caps.day,
            Period::Week => caps.week,
            Period::Month => caps.month,
        };
        cap.is_none_or(|cap| view.slot(p).spent < cap)
    })
}

fn caps(c: &Ceilings) -> Caps {
    Caps {
        day: c.day,
        week: c.week,
        month: c.month,
    }
}

/// The budget windows now, on the company's clock.
pub fn windows_now(company: &Company) -> Windows {
    let now = SystemTime::now();
    let offset = jiff::tz::TimeZone::get(&company.timezone)
        .ok()
        .and_then(|tz| {
            let ts = jiff::Timestamp::try_from(now).ok()?;
            time::UtcOffset::from_whole_seconds(tz.to_offset(ts).seconds()).ok()
        })
        .unwrap_or(time::UtcOffset::UTC);
    Windows::at(now, offset)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
