//! The seat's long memory inside a turn: the `remember` and `recall`
//! builtins, and what an ended turn leaves (its episode, the profiles of
//! whom it dealt with, the onboarding marker).
//!
//! Rules, and why:
//! - A note is bounded ([`MAX_NOTE_BYTES`]): a longer one is refused with
//!   the bound, as a tool error the model reads and can act on (say less).
//!   Why: a note rides the memory stream and every later prompt.
//! - A note's id is the turn and its place in the turn, so a turn run again
//!   rewrites its notes rather than adding copies.
//! - Every ended turn becomes one episode, its summary bounded
//!   ([`MAX_SUMMARY_BYTES`]) and its trigger embedded when an embedder is
//!   on (what a later trigger resembles is what was asked, not the
//!   bookkeeping); a store or embedder that fails is logged, never the
//!   turn's outcome.

use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use tracing::warn;

use super::dispatch::Answered;
use super::prefetch::{NOTE_DISTANCE, QUOTED, embed_query};
use super::prompts::clipped;
use super::{Brain, Outcome, Run};
use crate::memory::{Episode, Note, TurnMemory};
use crate::ports::Toolbox;

/// The most one note may hold, in bytes.
pub const MAX_NOTE_BYTES: usize = 8 * 1024;
/// The most an episode's summary holds, in bytes.
pub const MAX_SUMMARY_BYTES: usize = 1024;
/// The most a line learned of a counterparty holds, in bytes.
const MAX_MET_BYTES: usize = 240;
/// How long an ended turn's embedding may take.
const EPISODE_EMBED: Duration = Duration::from_secs(10);
/// Notes `recall` answers at most.
const RECALL_LIMIT: usize = 8;

#[derive(Debug, Deserialize)]
struct RememberArg {
    text: String,
}

#[derive(Debug, Deserialize)]
struct RecallArg {
    query: String,
    #[serde(default)]
    limit: Option<usize>,
}

impl<B: Brain, T: Toolbox> Run<'_, B, T> {
    /// `remember`: keeps one bounded note, embedded when an embedder is on.
    pub(super) async fn remember_note(&mut self, arguments: &str) -> Answered {
        let Some(recall) = self.engine.recall.clone() else {
            return Answered::error("remember is not available: this node keeps no seat memory.");
        };
        let arg = match crate::builtins::decode::<RememberArg>(crate::builtins::REMEMBER, arguments)
        {
            Ok(a) => a,
            Err(e) => return Answered::error(e),
        };
        let text = arg.text.trim();
        if text.is_empty() {
            return Answered::error("remember refused: the note is empty; say the fact to keep.");
        }
        if text.len() > MAX_NOTE_BYTES {
            return Answered::error(format!(
                "remember refused: the note is {} bytes, past the bound of {MAX_NOTE_BYTES} bytes for one note. Nothing was kept; keep one short fact per note.",
                text.len()
            ));
        }
        self.notes_kept += 1;
        let query = embed_query(&recall, &self.handle, &self.turn_id, text).await;
        let note = Note {
            id: format!("{}.{}", self.turn_id, self.notes_kept),
            text: text.to_owned(),
            turn_id: self.turn_id.clone(),
            at_ms: self.engine.clock.now_ms(),
            vector: query.vector,
        };
        match recall.memory.remember(&self.handle, note).await {
            Ok(()) => Answered::ok(match query.why_not {
                None => "Kept in your memory.".to_owned(),
                Some(why) => {
                    format!("Kept in your memory (not embedded: {why}; it is recalled by recency).")
                }
            }),
            Err(e) => Answered::error(format!("remember failed, nothing was kept: {e}")),
        }
    }

    /// `recall`: the notes nearest a query (by recency without embeddings).
    pub(super) async fn recall_notes(&mut self, arguments: &str) -> Answered {
        let Some(recall) = self.engine.recall.clone() else {
            return Answered::error("recall is not available: this node keeps no seat memory.");
        };
        let arg = match crate::builtins::decode::<RecallArg>(crate::builtins::RECALL, arguments) {
            Ok(a) => a,
            Err(e) => return Answered::error(e),
        };
        let query = embed_query(&recall, &self.handle, &self.turn_id, &arg.query).await;
        let limit = arg.limit.unwrap_or(RECALL_LIMIT).clamp(1, RECALL_LIMIT);
        match recall
            .memory
            .notes(&self.handle, query.vector, NOTE_DISTANCE, limit)
            .await
        {
            Ok(notes) => Answered::ok(
                json!({
                    "note": QUOTED,
                    "by": if query.why_not.is_some() { "recency" } else { "meaning" },
                    "why": query.why_not,
                    "notes": notes.iter().map(|n| n.text.clone()).collect::<Vec<_>>(),
                })
                .to_string(),
            ),
            Err(e) => Answered::error(format!("recall failed: {e}")),
        }
    }

    /// Records the ended turn in the seat's memory.
    pub(super) async fn keep_episode(&self, outcome: &Outcome) {
        let Some(recall) = self.engine.recall.clone() else {
            return;
        };
        let trigger = clipped(&self.trigger_text(), MAX_SUMMARY_BYTES / 2);
        let asker = self.asker();
        let tools: Vec<String> = self.record.iter().map(|r| r.name.clone()).collect();
        let reply = (!self.said.is_empty()).then(|| {
            clipped(
                &self
                    .said
                    .iter()
                    .map(|s| s.text.as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
                MAX_SUMMARY_BYTES / 2,
            )
        });
        let summary = clipped(
            &format!(
                "Asked{}: {}\nDid: {}\nReplied: {}\nOutcome: {}{}",
                asker
                    .as_ref()
                    .map(|(_, who)| format!(" by {who}"))
                    .unwrap_or_default(),
                clipped(&trigger, 400),
                if tools.is_empty() {
                    "no tool".to_owned()
                } else {
                    tools.join(", ")
                },
                reply
                    .as_deref()
                    .map(|r| clipped(r, 300))
                    .unwrap_or_else(|| "nothing".into()),
                outcome.label(),
                outcome
                    .detail()
                    .map(|d| format!(" ({})", clipped(d, 120)))
                    .unwrap_or_default(),
            ),
            MAX_SUMMARY_BYTES,
        );
        let vector = match tokio::time::timeout(
            EPISODE_EMBED,
            // What the turn was about is what a later trigger resembles.
            embed_query(&recall, &self.handle, &self.turn_id, &trigger),
        )
        .await
        {
            Ok(q) => q.vector,
            Err(_) => None,
        };
        let asked_by: Vec<String> = self
            .wakes
            .iter()
            .filter_map(|w| w.sender.as_ref())
            .flat_map(|s| s.ids.first().cloned())
            .collect();
        let met = asked_by
            .iter()
            .map(|id| {
                (
                    id.clone(),
                    clipped(
                        &format!("asked: {}", trigger.replace('\n', " ")),
                        MAX_MET_BYTES,
                    ),
                )
            })
            .collect();
        let ended_ms = self.engine.clock.now_ms();
        let turn = TurnMemory {
            episode: Episode {
                seat: self.handle.clone(),
                turn_id: self.turn_id.clone(),
                conversation: self.conversation.clone(),
                trigger,
                asked_by,
                tools,
                reply,
                outcome: outcome.label().to_owned(),
                input_tokens: self.input_tokens,
                output_tokens: self.output_tokens,
                summary,
                ended_ms,
                updated_ms: ended_ms,
                vector,
                change_seq: 0,
            },
            met,
            onboarded: self.first_turn,
        };
        if let Err(e) = recall.memory.ended(&self.handle, turn).await {
            warn!(subsystem = "turns", seat = %self.handle, turn_id = %self.turn_id, error = %e, "the turn's episode was not kept");
        }
    }
}
