//! Seat pauses on this node: the fleet's pause records mirrored by one
//! watch, and `POST /agents/{handle}/pause` / `resume` (write scope).
//!
//! Rules:
//! - Every node follows the pauses watch; its seats read the mirror
//!   ([`crewlet_seats::SeatsConfig::pauses`]): a paused seat takes nothing
//!   off its mailbox, so its wakes wait there, and its running turn stops
//!   before its next model call (not done: it runs again after the resume).
//! - Unknown is never "not paused": until the first listing the mirror is
//!   unknown and no seat admits work. A watch that drops keeps its last
//!   word while it is opened again (with backoff), like the admission gate.
//! - A pause names who, where and why; a resume answers whether the seat
//!   was paused. An unreadable store is 503 with Retry-After and changes
//!   nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::post;
use crewlet_coord::{Answer, Coord, CoordError};
use crewlet_seats::Pauses;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{Instrument, info, info_span, warn};

use crate::engine::{Late, Started};

/// The first and the longest wait before the watch is opened again.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(8));

/// Starts the mirror; answers what the seats read.
pub fn start(coord: Coord, started: &mut Started) -> watch::Receiver<Option<Pauses>> {
    let (tx, rx) = watch::channel(None);
    let (stop_tx, stop) = watch::channel(false);
    let task = tokio::spawn(
        follow(coord, tx, stop).instrument(info_span!("pauses", subsystem = "pauses")),
    );
    started.push("pauses", move || {
        Box::pin(async move {
            let _ = stop_tx.send(true);
            let _ = task.await;
        })
    });
    rx
}

/// Follows the pauses watch until `stop`, opening it again when it drops.
async fn follow(coord: Coord, tx: watch::Sender<Option<Pauses>>, mut stop: watch::Receiver<bool>) {
    let mut wait = BACKOFF.0;
    loop {
        let run = async {
            let mut w = coord.watch_seat_pauses().await?;
            let mut paused: BTreeSet<String> = w.initial.keys().cloned().collect();
            info!(
                subsystem = "pauses",
                paused = paused.len(),
                "seat pauses listed"
            );
            tx.send_replace(Some(Arc::new(paused.clone())));
            while let Some(change) = w.changes.next().await {
                let (handle, record) = change?;
                let changed = match record {
                    Some(_) => paused.insert(handle.clone()),
                    None => paused.remove(&handle),
                };
                if changed {
                    info!(subsystem = "pauses", seat = %handle, paused = paused.contains(&handle), "seat pause changed");
                    tx.send_replace(Some(Arc::new(paused.clone())));
                }
            }
            Ok::<(), CoordError>(())
        };
        let why = tokio::select! {
            r = run => match r {
                Ok(()) => "the watch ended".to_owned(),
                Err(e) => e.to_string(),
            },
            _ = stop.wait_for(|s| *s) => return,
        };
        warn!(subsystem = "pauses", error = %why, retry_in = ?wait, "seat pauses watch lost; keeping the last known pauses");
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        wait = (wait * 2).min(BACKOFF.1);
    }
}

/// Why a pause or resume was not done.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    #[error("the node's engine is not up yet; retry in a few seconds")]
    Starting,
    #[error("no company is active on this node")]
    NoCompany,
    #[error("no seat `{0}` in the company; `GET /org` lists the seats")]
    NoSeat(String),
    #[error("cannot tell {what}: {why}; nothing changed — retry in a few seconds")]
    Unavailable { what: &'static str, why: String },
}

/// Pauses `seat` of the active company, recording who, where and why.
pub async fn pause(
    ctx: &crate::engine::EngineContext,
    seat: &str,
    by: &str,
    reason: Option<String>,
) -> Result<Value, PauseError> {
    let handle = seat_handle(ctx, seat)?;
    let record = json!({
        "by": by,
        "node": ctx.node_id,
        "reason": reason,
        "at_ms": crewlet_os::now_ms(),
    });
    ctx.coord
        .pause_seat(&handle, &record)
        .await
        .map_err(|e| PauseError::Unavailable {
            what: "whether the pause was written",
            why: e.to_string(),
        })?;
    info!(subsystem = "pauses", seat = %handle, by, "seat paused");
    Ok(json!({"seat": handle, "paused": true, "record": record}))
}

/// Resumes `seat`; answers whether it was paused.
pub async fn resume(
    ctx: &crate::engine::EngineContext,
    seat: &str,
    by: &str,
) -> Result<Value, PauseError> {
    let handle = seat_handle(ctx, seat)?;
    let was = match ctx.coord.resume_seat(&handle).await {
        Ok(Answer::Yes(())) => true,
        Ok(Answer::No(())) => false,
        Err(e) => {
            return Err(PauseError::Unavailable {
                what: "whether the seat was resumed",
                why: e.to_string(),
            });
        }
    };
    info!(subsystem = "pauses", seat = %handle, by, was_paused = was, "seat resumed");
    Ok(json!({"seat": handle, "paused": false, "was_paused": was}))
}

fn seat_handle(ctx: &crate::engine::EngineContext, seat: &str) -> Result<String, PauseError> {
    let active = ctx.active.current().ok_or(PauseError::NoCompany)?;
    let handle = seat.trim_start_matches('@');
    active
        .company
        .seat(handle)
        .map(|s| s.handle.to_string())
        .ok_or_else(|| PauseError::NoSeat(handle.to_owned()))
}

/// `POST /agents/{handle}/pause` (body: optional `{"reason": "…"}`) and
/// `POST /agents/{handle}/resume`.
pub fn routes(late: Late) -> Router {
    Router::new()
        .route("/agents/{handle}/pause", post(pause_route))
        .route("/agents/{handle}/resume", post(resume_route))
        .with_state(late)
}

fn answer(r: Result<Value, PauseError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e @ (PauseError::Starting | PauseError::Unavailable { .. })) => {
            crewlet_api::retry_later(crewlet_api::OPERATOR_RETRY_SECONDS, "pauses", e.to_string())
        }
        Err(e @ PauseError::NoCompany) => (
            StatusCode::CONFLICT,
            Json(json!({"error": "no_company", "detail": e.to_string()})),
        )
            .into_response(),
        Err(e @ PauseError::NoSeat(_)) => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "no_seat", "detail": e.to_string()})),
        )
            .into_response(),
    }
}

async fn pause_route(
    State(late): State<Late>,
    Path(handle): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let Some(ctx) = late.get() else {
        return answer(Err(PauseError::Starting));
    };
    let reason = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["reason"].as_str().map(str::to_owned));
    answer(pause(ctx, &handle, "api", reason).await)
}

async fn resume_route(State(late): State<Late>, Path(handle): Path<String>) -> Response {
    let Some(ctx) = late.get() else {
        return answer(Err(PauseError::Starting));
    };
    answer(resume(ctx, &handle, "api").await)
}
