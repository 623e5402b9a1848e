//! `GET /agents/{handle}/memory` on this node: the seat's memory replayed
//! from `CREWLET_MEMORY` into this node's store first (so any node answers
//! with the seat's whole memory, not only what it wrote), then read back.
//!
//! Rule: a memory that cannot be read is unavailable (503), never empty.

use crewlet_api::memory::MemoryFuture;
use crewlet_api::{MemoryRefusal, SeatMemory};
use crewlet_store::{MemoryView, SkillHistory};
use serde_json::{Value, json};

use crate::engine::Late;

/// Rows of each list the view answers.
const VIEW_ROWS: usize = 50;

/// The route's adapter, once the engine is up.
pub(crate) struct SeatMemoryRoutes(pub(crate) Late);

impl SeatMemory for SeatMemoryRoutes {
    fn memory(&self, handle: String) -> MemoryFuture<'_> {
        Box::pin(async move {
            let ctx = self.0.get().ok_or_else(|| {
                MemoryRefusal::Unavailable(
                    "the node's engine is not up yet; retry in a few seconds".into(),
                )
            })?;
            let known = ctx
                .active
                .current()
                .is_some_and(|a| a.company.seat(&handle).is_some());
            if !known {
                return Err(MemoryRefusal::NoSeat(format!(
                    "the company has no seat {handle:?} (see `crewlet agents`)"
                )));
            }
            let memory =
                crewlet_memory::Memory::open(async_nats::jetstream::new(ctx.client.clone()))
                    .await
                    .map_err(|e| MemoryRefusal::Unavailable(e.to_string()))?;
            crate::memory_tables::memory_tables(memory, &ctx.store)
                .hydrate(&handle)
                .await
                .map_err(|e| MemoryRefusal::Unavailable(e.to_string()))?;
            let store = ctx.store.clone();
            let seat = handle.clone();
            let view = tokio::task::spawn_blocking(move || store.memory_view(&seat, VIEW_ROWS))
                .await
                .map_err(|e| MemoryRefusal::Unavailable(e.to_string()))?
                .map_err(|e| {
                    MemoryRefusal::Unavailable(format!(
                        "this node's store did not answer: {e} (check the data dir's disk)"
                    ))
                })?;
            let half_life = ctx.config.duties.skill_half_life.as_millis() as i64;
            Ok(render(&handle, &view, crewlet_os::now_ms(), half_life))
        })
    }
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
