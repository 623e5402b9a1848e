//! `GET /agents/{handle}/memory`'s answer: the seat's memory replayed
//! from `CREWLET_MEMORY` into this node's store first (so any node answers
//! with the seat's whole memory, not only what it wrote), then read back.
//!
//! Rule: a memory that cannot be read is unavailable (503), never empty.

use std::sync::Arc;

use crewlet_store::{MemoryView, SkillHistory, Store};
use serde_json::{Value, json};

use crate::{Memory, MemoryError};

/// Rows of each list the view answers.
const VIEW_ROWS: usize = 50;

/// Why a seat's memory could not be shown: never "empty".
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// The seat's rows could not be replayed from the stream.
    #[error(transparent)]
    Unhydrated(#[from] MemoryError),
    /// This node's store did not answer.
    #[error("this node's store did not answer: {0} (check the data dir's disk)")]
    Store(String),
}

/// Seat `handle`'s memory as `GET /agents/{handle}/memory` answers it:
/// replayed from the stream into `store` first through `memory` (with
/// every table, [`crate::memory_tables`]), then read back; skill strength
/// decays with `half_life_ms`.
pub async fn view(
    memory: &Memory,
    store: &Arc<Store>,
    handle: &str,
    half_life_ms: i64,
) -> Result<Value, ViewError> {
    memory.hydrate(handle).await?;
    let store = store.clone();
    let seat = handle.to_owned();
    let view = tokio::task::spawn_blocking(move || store.memory_view(&seat, VIEW_ROWS))
        .await
        .map_err(|e| ViewError::Store(e.to_string()))?
        .map_err(|e| ViewError::Store(e.to_string()))?;
    Ok(render(handle, &view, crewlet_os::now_ms(), half_life_ms))
}

/// The route's JSON (its shape is documented in `crewlet_api::memory`).
fn render(handle: &str, v: &MemoryView, now_ms: i64, half_life_ms: i64) -> Value {
    let skill = |h: &SkillHistory| {
        let s = &h.skill;
        json!({
            "id": s.skill_id, "name": s.name, "state": s.state, "origin": s.origin,
            "promoted_from": s.promoted_from, "version": s.version, "uses": s.uses,
            "last_used_ms": s.last_used_ms, "created_ms": s.created_ms, "retired_ms": s.retired_ms,
            "strength": (crewlet_store::strength(s, now_ms, half_life_ms) * 100.0).round() / 100.0,
            "versions": h.versions.iter().map(|v| json!({
                "version": v.version, "procedure": v.procedure, "episodes": v.episodes,
                "model": v.model, "created_ms": v.created_ms,
            })).collect::<Vec<_>>(),
        })
    };
    json!({
        "handle": handle,
        "notes": v.notes.iter().map(|n| json!({
            "id": n.note_id, "text": n.text, "turn_id": n.turn_id, "created_ms": n.created_ms,
            "embedding_model": n.vector.as_ref().map(|x| x.model.clone()),
            "embedding_dim": n.vector.as_ref().map(|x| x.values.len()),
        })).collect::<Vec<_>>(),
        "episodes": v.episodes.iter().map(|e| json!({
            "turn_id": e.turn_id, "conversation": e.conversation, "trigger": e.trigger,
            "outcome": e.outcome, "summary": e.summary, "tools": e.tools, "reply": e.reply,
            "tokens": e.input_tokens + e.output_tokens, "ended_ms": e.ended_ms,
        })).collect::<Vec<_>>(),
        "skills": v.skills.iter().map(skill).collect::<Vec<_>>(),
        "profiles": v.profiles.iter().map(|p| json!({
            "counterparty": p.counterparty, "known": p.known, "turns": p.turns,
            "first_ms": p.first_ms, "last_ms": p.last_ms,
        })).collect::<Vec<_>>(),
    })
}
