//! The loop: iterations of executor → reviewer, and inside each phase the
//! model ↔ tool rounds.
//!
//! Rules, and why:
//! - A round that ends without `submit_work` (text only, or the executor's
//!   `max_tool_rounds` used up) loops back to the executor without a review
//!   call: there is nothing to review, and a review costs a call.
//! - A reviewer's `done` on a turn that owed a reply and posted none is
//!   overturned (`review_overturned`): the engine, not a model, decides
//!   whether anything was delivered.
//! - `max_iterations` bounds the reviewed attempts; running out fails the
//!   turn. The reviewer gets [`Limits::review_rounds`] calls to answer.
//! - Before every model call the lease fence is checked: a node that may no
//!   longer act for the seat stops before it spends anything; then the
//!   meter: a refusal the last charge answered stops this call, and the
//!   call's `max_tokens` is clamped to the budget's room ([`super::budget`]).
//!
//! [`Limits::review_rounds`]: super::Limits::review_rounds

use std::time::Instant;

use crewlet_company::ModelRef;
use serde_json::json;

use super::owed::Standing;
use super::prompts::{self, assistant};
use super::{Act, Brain, Outcome, Run, Stop};
use crate::builtins::{self, Claimed, SubmitReview, SubmitWork, Verdict};
use crate::ports::{CallSite, Msg, Phase, Prompt, Thought, ToolDef, Toolbox};
use crate::trigger::{self, Target};

/// How an executor phase ended.
enum Executed {
    Submitted(SubmitWork),
    /// The round ended without `submit_work`; carries what to tell it.
    Unsubmitted(String),
}

impl<B: Brain, T: Toolbox> Run<'_, B, T> {
    pub(super) async fn iterate(&mut self) -> Result<Outcome, Stop> {
        // The thread and the recalled blocks are fetched side by side,
        // each under its own bound.
        let (thread, (prefetched, first_turn)) = futures::join!(self.read_back(), self.prefetch());
        self.thread = thread;
        self.prefetched = prefetched;
        self.first_turn = first_turn;
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
                        self.overturned()
                    }
                    (Verdict::Done, _) => {
                        return Ok(match work.outcome {
                            Claimed::Delivered => Outcome::Delivered,
                            Claimed::NoAction => Outcome::NoAction,
                            Claimed::Blocked => Outcome::Blocked(work.summary),
                        });
                    }
                    (Verdict::Failed, feedback) => return Ok(Outcome::Failed(feedback)),
                    (Verdict::Iterate, feedback) => prompts::another_round(&feedback),
                },
            };
            conversation.push(Msg::user(feedback));
        }
        Ok(Outcome::Failed(format!(
            "no accepted result after {max} iteration(s)"
        )))
    }

    /// Whether a reply is owed and nothing posted answers it yet.
    pub(super) fn owed_unanswered(&self) -> bool {
        self.unanswered().is_some()
    }

    /// The first reply owed that nothing posted answers: every trigger's,
    /// not only the first one's (a batch may owe replies in two threads,
    /// and a failed post to either leaves the turn undelivered).
    pub(super) fn unanswered(&self) -> Option<&Target> {
        self.replies
            .iter()
            .filter(|o| o.standing == Standing::Unanswered)
            .map(|o| &o.target)
            .find(|owed| {
                !self
                    .record
                    .iter()
                    .any(|r| r.posted_to.as_ref().is_some_and(|t| owed.answered_by(t)))
            })
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
            if self.engine.recall.is_some() {
                tools.extend(builtins::memory_builtins());
            }
            tools.extend(self.activated_defs());
            let thought = self
                .think(
                    &chain,
                    conversation.clone(),
                    tools,
                    Phase::Executor,
                    iteration,
                    round,
                )
                .await?;
            conversation.push(assistant(&thought));
            if thought.calls.is_empty() {
                return Ok(Executed::Unsubmitted(prompts::UNSUBMITTED.to_owned()));
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
        Ok(Executed::Unsubmitted(prompts::rounds_used(
            self.role.max_tool_rounds,
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
        let mut conversation = self.review_brief(work, from);
        for round in 1..=self.engine.limits.review_rounds.max(1) {
            let thought = self
                .think(
                    &chain,
                    conversation.clone(),
                    builtins::reviewer_builtins(),
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
                        conversation.push(Msg::tool(&c.id, prompts::ONLY_REVIEW));
                    }
                    conversation.push(Msg::user(prompts::ANSWER_WITH_REVIEW));
                }
            }
        }
        Ok((Verdict::Failed, "the reviewer gave no verdict".into()))
    }

    /// One model call: fenced, metered, recorded, charged. The reviewer's
    /// answer must be a tool call.
    async fn think(
        &mut self,
        chain: &[ModelRef],
        messages: Vec<Msg>,
        tools: Vec<ToolDef>,
        phase: Phase,
        iteration: u32,
        round: u32,
    ) -> Result<Thought, Stop> {
        match (self.may_act)() {
            Act::Go => {}
            Act::FenceLost => return Err(Stop::Fence),
            Act::Paused => return Err(Stop::Paused),
        }
        if let Some(park) = self.metered.take() {
            return Err(Stop::Budget(park));
        }
        let max_tokens = self.clamp(&messages, &tools).await?;
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
            must_call_tool: phase == Phase::Reviewer,
            max_tokens,
        };
        let started = Instant::now();
        let thought = self
            .engine
            .brain
            .think(chain, prompt, &site)
            .await
            .map_err(Stop::from)?;
        self.model_calls += 1;
        self.input_tokens += thought.input_tokens;
        self.output_tokens += thought.output_tokens;
        self.emit(
            "model_call",
            json!({
                "turn_id": self.turn_id, "phase": phase.as_str(), "iteration": iteration, "round": round,
                "model": thought.model, "slot": thought.slot, "input_tokens": thought.input_tokens, "output_tokens": thought.output_tokens,
                "tool_calls": thought.calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
                "ms": started.elapsed().as_millis() as u64,
            }),
        )
        .await;
        self.charge(thought.input_tokens + thought.output_tokens)
            .await?;
        Ok(thought)
    }
}
