//! `GET /agents/{handle}/memory` (read scope): what a seat remembers and
//! learned, over the node's [`SeatMemory`].
//!
//! The answer (200), every list newest first:
//!
//! ```json
//! {
//!   "handle": "ada",
//!   "notes":    [{"id", "text", "turn_id", "created_ms", "embedding_model"}],
//!   "episodes": [{"turn_id", "conversation", "trigger", "outcome", "summary",
//!                 "tools", "reply", "tokens", "ended_ms"}],
//!   "skills":   [{"id", "name", "state" ("active"|"retired"), "origin"
//!                 ("induced"|"promoted"), "promoted_from", "version", "uses",
//!                 "last_used_ms", "created_ms", "retired_ms", "strength",
//!                 "versions": [{"version", "procedure", "episodes", "model",
//!                               "created_ms"}]}],
//!   "profiles": [{"counterparty", "known", "turns", "first_ms", "last_ms"}]
//! }
//! ```
//!
//! A seat the company lacks is 404; a node that cannot read the seat's
//! memory (its engine starting, the memory stream unreadable) answers 503
//! with Retry-After — never an empty memory, which would read as "it
//! remembers nothing".

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde_json::{Value, json};

/// Why a seat's memory was not read (each with what to do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryRefusal {
    /// Not now: the engine is starting, or the memory cannot be read.
    Unavailable(String),
    /// The company has no such seat.
    NoSeat(String),
}

pub type MemoryFuture<'a> = Pin<Box<dyn Future<Output = Result<Value, MemoryRefusal>> + Send + 'a>>;

/// A seat's memory as the HTTP surface reads it. Implemented by the node.
pub trait SeatMemory: Send + Sync + 'static {
    fn memory(&self, handle: String) -> MemoryFuture<'_>;
}

/// `GET /agents/{handle}/memory`.
pub fn routes(memory: Arc<dyn SeatMemory>) -> Router {
    Router::new()
        .route("/agents/{handle}/memory", get(read))
        .with_state(memory)
}

async fn read(State(memory): State<Arc<dyn SeatMemory>>, Path(handle): Path<String>) -> Response {
    match memory.memory(handle).await {
        Ok(v) => Json(v).into_response(),
        Err(MemoryRefusal::Unavailable(detail)) => {
            crate::retry_later(crate::OPERATOR_RETRY_SECONDS, "memory", detail)
        }
        Err(MemoryRefusal::NoSeat(detail)) => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "no_seat", "detail": detail})),
        )
            .into_response(),
    }
}
