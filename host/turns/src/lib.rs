//! The turn: what a wake becomes once its seat is served.
//!
//! A batch of wakes for one conversation is one turn. The executor thinks
//! with its role's model chain and acts through the seat's own tools; a
//! cheaper reviewer judges the round against the record; the engine — not a
//! model — decides whether anything was delivered, charges every round to
//! the budgets, and publishes an event for every step. The model and the
//! tools are ports ([`Brain`], [`Toolbox`]), and so are where events go,
//! the conversation sessions and the clock ([`Ports`]): this crate knows
//! nothing of WASM, MCP children, vendors, NATS or SQLite.

mod builtins;
mod engine;
mod memory;
mod ports;
pub mod trigger;

pub use engine::{
    Act, BudgetRoom, CrashPoint, Limits, MAX_BLOCK_BYTES, MAX_NOTE_BYTES, MAX_SUMMARY_BYTES,
    MAX_THREAD_BYTES, MAX_THREAD_MESSAGES, Outcome, Park, Ports, Prefetched, QUOTED, Turn, TurnEnd,
    TurnEngine, budget_parked, budget_room, company_time, estimate, park_for, parked_on,
    prefetch_recalled, turns_over_at, windows_at, windows_now,
};
pub use memory::{
    Embeds, Episode, MemoryFault, NoSkills, Note, Recall, Recalled, SeatMemory, SkillSource,
    TurnMemory, Vector,
};
pub use ports::{
    Brain, Call, CallSite, Clock, EmbedError, EmbedSite, Embedded, Embedder, EventSink, Msg,
    NoEmbedder, Phase, Prompt, Said, ServerInfo, SessionError, Sessions, Speaker, SystemClock,
    Thought, ToolDef, ToolOutput, Toolbox, TurnEvent, Unavailable, Unpublished,
};
