//! `GET /usage?period=day|week|month&by=seat|role|model|node|provider&from=DAY&to=DAY`
//! (read scope) over the node's [`UsageSource`]: the fleet's usage history
//! from this node's replicated estate — one local read, no scatter. A
//! query the asker got wrong is 400 naming the word; a node that holds no
//! estate (no `data` role) is 409 saying to ask a data node; an estate
//! that cannot be read now is 503 with Retry-After.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

/// The query's words, as sent.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageAsk {
    pub period: Option<String>,
    pub by: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
}

/// Why usage was not answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageRefusal {
    /// The asker's query is wrong (what and how to fix).
    BadQuery(String),
    /// This node keeps no estate: ask a node with the `data` role.
    NotHeld(String),
    /// Not now (the engine is starting, the estate cannot be read).
    Unavailable(String),
    /// No such node in the state log's positions.
    UnknownNode(String),
}

/// The eviction's body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvictAsk {
    pub node: String,
    #[serde(default)]
    pub reason: String,
}

pub type UsageFuture<'a> = Pin<Box<dyn Future<Output = Result<Value, UsageRefusal>> + Send + 'a>>;

/// Usage history as the HTTP surface reaches it. Implemented by the node.
pub trait UsageSource: Send + Sync + 'static {
    fn usage(&self, ask: UsageAsk) -> UsageFuture<'_>;
    /// Records an operator's eviction of a node gone for good.
    fn evict(&self, ask: EvictAsk) -> UsageFuture<'_>;
    /// Ends an eviction (same body: the node and why it may come back).
    fn readmit(&self, ask: EvictAsk) -> UsageFuture<'_>;
}

/// `GET /usage`.
pub fn routes(source: Arc<dyn UsageSource>) -> Router {
    Router::new()
        .route("/usage", get(usage))
        .route("/estate/evict", post(evict))
        .route("/estate/readmit", post(readmit))
        .with_state(source)
}

async fn usage(
    State(source): State<Arc<dyn UsageSource>>,
    ask: Result<Query<UsageAsk>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let ask = match ask {
        Ok(Query(ask)) => ask,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"error": "bad_query", "detail": e.body_text()})),
            )
                .into_response();
        }
    };
    answer(source.usage(ask).await)
}

fn answer(r: Result<Value, UsageRefusal>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(UsageRefusal::BadQuery(detail)) => (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "bad_query", "detail": detail})),
        )
            .into_response(),
        Err(UsageRefusal::NotHeld(detail)) => (
            StatusCode::CONFLICT,
            Json(json!({"error": "no_estate", "detail": detail})),
        )
            .into_response(),
        Err(UsageRefusal::UnknownNode(detail)) => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "unknown_node", "detail": detail})),
        )
            .into_response(),
        Err(UsageRefusal::Unavailable(detail)) => {
            crate::retry_later(crate::OPERATOR_RETRY_SECONDS, "usage", detail)
        }
    }
}

/// The body of an eviction or a readmission, with its reason (audited).
fn audited_ask(body: &[u8], what: &str) -> Result<EvictAsk, UsageRefusal> {
    let ask: EvictAsk = serde_json::from_slice(body).map_err(|e| {
        UsageRefusal::BadQuery(format!(
            "the body must be {{\"node\": \"ID\", \"reason\": \"why\"}}: {e}"
        ))
    })?;
    if ask.reason.trim().is_empty() {
        return Err(UsageRefusal::BadQuery(format!(
            "say why the node is {what} (`reason`): it is audited"
        )));
    }
    Ok(ask)
}

async fn evict(State(source): State<Arc<dyn UsageSource>>, body: axum::body::Bytes) -> Response {
    match audited_ask(&body, "evicted") {
        Ok(ask) => answer(source.evict(ask).await),
        Err(e) => answer(Err(e)),
    }
}

async fn readmit(State(source): State<Arc<dyn UsageSource>>, body: axum::body::Bytes) -> Response {
    match audited_ask(&body, "readmitted") {
        Ok(ask) => answer(source.readmit(ask).await),
        Err(e) => answer(Err(e)),
    }
}
