//! `POST /agents/{handle}/pause` (body: optional `{"reason": "…"}`) and
//! `POST /agents/{handle}/resume` (write scope) over the node's
//! [`SeatPausing`]: an unknown store is 503 with Retry-After and changes
//! nothing; no company is 409, a seat the company lacks 404.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// Why a pause or resume was not done (each with what to do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PauseRefusal {
    /// Not now: the engine is starting, or the store cannot say.
    Unavailable(String),
    NoCompany(String),
    NoSeat(String),
}

pub type PauseFuture<'a> = Pin<Box<dyn Future<Output = Result<Value, PauseRefusal>> + Send + 'a>>;

/// Seat pauses as the HTTP surface reaches them. Implemented by the node.
pub trait SeatPausing: Send + Sync + 'static {
    fn pause(&self, handle: String, reason: Option<String>) -> PauseFuture<'_>;
    fn resume(&self, handle: String) -> PauseFuture<'_>;
}

/// `POST /agents/{handle}/pause` and `POST /agents/{handle}/resume`.
pub fn routes(pausing: Arc<dyn SeatPausing>) -> Router {
    Router::new()
        .route("/agents/{handle}/pause", post(pause))
        .route("/agents/{handle}/resume", post(resume))
        .with_state(pausing)
}

fn answer(r: Result<Value, PauseRefusal>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(PauseRefusal::Unavailable(detail)) => {
            crate::retry_later(crate::OPERATOR_RETRY_SECONDS, "pauses", detail)
        }
        Err(PauseRefusal::NoCompany(detail)) => (
            StatusCode::CONFLICT,
            Json(json!({"error": "no_company", "detail": detail})),
        )
            .into_response(),
        Err(PauseRefusal::NoSeat(detail)) => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "no_seat", "detail": detail})),
        )
            .into_response(),
    }
}

async fn pause(
    State(pausing): State<Arc<dyn SeatPausing>>,
    Path(handle): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let reason = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["reason"].as_str().map(str::to_owned));
    answer(pausing.pause(handle, reason).await)
}

async fn resume(
    State(pausing): State<Arc<dyn SeatPausing>>,
    Path(handle): Path<String>,
) -> Response {
    answer(pausing.resume(handle).await)
}
