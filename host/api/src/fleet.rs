//! `GET /fleet`, `GET /agents`, `GET /agents/{handle}/follows`, `GET
//! /turns/{id}` and `GET /budgets` (read scope) over the node's [`FleetView`]: 503 with Retry-After when a view cannot be given
//! now (the engine is starting, presence cannot be listed, no company is
//! active); a turn found nowhere is 404 only when every node answered —
//! not found where some node was silent is not "no such turn".

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;

/// A view the node cannot give now: a short kind a program can match, and
/// what happened and what to do. Answered 503 with the operator's delay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    pub error: &'static str,
    pub detail: String,
}

impl Unavailable {
    /// The engine is not up yet.
    pub fn starting() -> Unavailable {
        Unavailable {
            error: "starting",
            detail: "the node's engine is not up yet; retry in a few seconds".into(),
        }
    }
}

pub type ViewFuture<'a> =
    Pin<Box<dyn Future<Output = Result<serde_json::Value, Unavailable>> + Send + 'a>>;

/// The fleet's views as the HTTP surface reaches them. Implemented by the node.
pub trait FleetView: Send + Sync + 'static {
    /// Every live node (`GET /fleet`).
    fn fleet(&self) -> ViewFuture<'_>;
    /// Every seat of the served company (`GET /agents`).
    fn agents(&self) -> ViewFuture<'_>;
    /// The chat threads a seat follows, newest post first (`GET
    /// /agents/{handle}/follows`: `{"seat", "follows": [{"backend",
    /// "channel", "thread", "last_post_ms"}]}`).
    fn follows(&self, handle: String) -> ViewFuture<'_>;
    /// A turn's detail from every node's log, with `found` and `coverage`.
    fn turn(&self, turn_id: String) -> ViewFuture<'_>;
    /// The company's and every seat's token windows (`GET /budgets`).
    fn budgets(&self) -> ViewFuture<'_>;
}

/// `GET /fleet`, `GET /agents`, `GET /turns/{turn_id}` and `GET /budgets`.
pub fn routes(view: Arc<dyn FleetView>) -> Router {
    Router::new()
        .route("/fleet", get(fleet))
        .route("/agents", get(agents))
        .route("/agents/{handle}/follows", get(follows))
        .route("/turns/{turn_id}", get(turn))
        .route("/budgets", get(budgets))
        .with_state(view)
}

fn answer(read: Result<serde_json::Value, Unavailable>) -> Response {
    match read {
        Ok(v) => Json(v).into_response(),
        Err(u) => crate::retry_later(crate::OPERATOR_RETRY_SECONDS, u.error, u.detail),
    }
}

async fn fleet(State(view): State<Arc<dyn FleetView>>) -> Response {
    answer(view.fleet().await)
}

async fn agents(State(view): State<Arc<dyn FleetView>>) -> Response {
    answer(view.agents().await)
}

async fn follows(State(view): State<Arc<dyn FleetView>>, Path(handle): Path<String>) -> Response {
    answer(view.follows(handle).await)
}

async fn budgets(State(view): State<Arc<dyn FleetView>>) -> Response {
    answer(view.budgets().await)
}

async fn turn(State(view): State<Arc<dyn FleetView>>, Path(turn_id): Path<String>) -> Response {
    match view.turn(turn_id).await {
        Ok(detail) => {
            let status = if detail["found"] == true || detail["coverage"]["complete"] == false {
                StatusCode::OK
            } else {
                StatusCode::NOT_FOUND
            };
            (status, Json(detail)).into_response()
        }
        Err(u) => answer(Err(u)),
    }
}
