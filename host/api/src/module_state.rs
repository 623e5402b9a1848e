//! `GET /plugins/{name}/state/{bucket}` (scope `read`, like `/plugins`)
//! over the node's [`ModuleStates`]: a module bucket's current keys and
//! values, read-only; 404 for a module or bucket this node does not run,
//! 503 with Retry-After when the bucket cannot be read now.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde_json::{Value, json};

use crate::Unavailable;

/// Why a bucket was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateRefusal {
    /// No such module or bucket on this node (what was asked, what is not).
    NotFound(String),
    /// Not now (the engine is starting, the bucket cannot be read).
    Unavailable(Unavailable),
}

pub type StateFuture<'a> = Pin<Box<dyn Future<Output = Result<Value, StateRefusal>> + Send + 'a>>;

/// Module buckets as the HTTP surface reaches them. Implemented by the node.
pub trait ModuleStates: Send + Sync + 'static {
    /// Module `name`'s bucket `bucket`: `{module, bucket, keys, entries,
    /// limit, truncated}`.
    fn read(&self, name: String, bucket: String) -> StateFuture<'_>;
}

/// `GET /plugins/{name}/state/{bucket}`.
pub fn routes(states: Arc<dyn ModuleStates>) -> Router {
    Router::new()
        .route("/plugins/{name}/state/{bucket}", get(state))
        .with_state(states)
}

async fn state(
    State(states): State<Arc<dyn ModuleStates>>,
    Path((name, bucket)): Path<(String, String)>,
) -> Response {
    match states.read(name, bucket).await {
        Ok(v) => Json(v).into_response(),
        Err(StateRefusal::NotFound(detail)) => (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": "not_found", "detail": detail })),
        )
            .into_response(),
        Err(StateRefusal::Unavailable(u)) => {
            crate::retry_later(crate::OPERATOR_RETRY_SECONDS, u.error, u.detail)
        }
    }
}
