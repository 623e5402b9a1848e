//! `GET`/`POST /tokens` and `DELETE /tokens/{id}` (admin scope, checked by
//! the guard) over the node's [`TokenAdmin`]. A request is read here (400
//! naming what is expected); an unreachable tokens bucket is 503 with
//! Retry-After, nothing changed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{delete, get};
use serde::Deserialize;
use serde_json::json;

use crate::Scope;

pub type TokenFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, TokenFailure>> + Send + 'a>>;

/// Why a token request was not done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenFailure {
    /// The tokens bucket cannot be reached (what happened): retry.
    Unavailable(String),
    /// Anything else (the OS random source failed…).
    Failed(String),
}

/// The fleet's operator tokens as the HTTP surface reaches them.
/// Implemented by the node.
pub trait TokenAdmin: Send + Sync + 'static {
    /// Every token, never its value or hash.
    fn list(&self) -> TokenFuture<'_, Vec<serde_json::Value>>;
    /// A new token; the answer holds its value under `token`, once.
    fn issue(
        &self,
        scope: Scope,
        name: String,
        ttl_seconds: Option<u64>,
    ) -> TokenFuture<'_, serde_json::Value>;
    /// Revokes a token; `None` when no token has that id.
    fn revoke(&self, id: String) -> TokenFuture<'_, Option<serde_json::Value>>;
}

/// `/tokens` and `/tokens/{id}`.
pub fn routes(admin: Arc<dyn TokenAdmin>) -> Router {
    Router::new()
        .route("/tokens", get(list).post(create))
        .route("/tokens/{id}", delete(revoke))
        .with_state(admin)
}

fn failure(e: TokenFailure) -> Response {
    match e {
        TokenFailure::Unavailable(detail) => {
            crate::retry_later(crate::OPERATOR_RETRY_SECONDS, "tokens_unavailable", detail)
        }
        TokenFailure::Failed(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({ "status": "error", "error": error })),
        )
            .into_response(),
    }
}

fn bad_request(error: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({ "status": "bad_request", "error": error })),
    )
        .into_response()
}

async fn list(State(admin): State<Arc<dyn TokenAdmin>>) -> Response {
    match admin.list().await {
        Ok(tokens) => Json(json!({ "tokens": tokens })).into_response(),
        Err(e) => failure(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    scope: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    ttl_seconds: Option<u64>,
}

async fn create(State(admin): State<Arc<dyn TokenAdmin>>, body: axum::body::Bytes) -> Response {
    let req: CreateBody = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return bad_request(format!(
                "expected {{\"scope\": \"read|write|admin\", \"name\"?: TEXT, \"ttl_seconds\"?: N}}: {e}"
            ));
        }
    };
    let Some(scope) = Scope::parse(&req.scope) else {
        return bad_request(format!(
            "scope {:?} is not one of read, write, admin",
            req.scope
        ));
    };
    if req.ttl_seconds == Some(0) || req.name.len() > 200 {
        return bad_request("ttl_seconds must be above 0 and name at most 200 bytes".into());
    }
    match admin.issue(scope, req.name, req.ttl_seconds).await {
        Ok(made) => (StatusCode::CREATED, Json(made)).into_response(),
        Err(e) => failure(e),
    }
}

async fn revoke(State(admin): State<Arc<dyn TokenAdmin>>, Path(id): Path<String>) -> Response {
    match admin.revoke(id.clone()).await {
        Ok(Some(revoked)) => Json(revoked).into_response(),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            Json(json!({
                "status": "not_found",
                "error": format!("no token has id {id:?}; `crewlet tokens list` shows the ids"),
            })),
        )
            .into_response(),
        Err(e) => failure(e),
    }
}
