//! `PUT /config` and `GET /config` over the node's [`ConfigPlane`]: bound
//! with the HTTP surface before the engine is up, answering 503 with
//! Retry-After until it is. A document is validated first (400 with every
//! error and its path), stored, then activated (201; 200 when it already
//! was); an unreadable pointer is unknown, answered 503, never "unset".

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde_json::json;

/// Largest company document `PUT /config` accepts.
pub const MAX_DOCUMENT_BYTES: usize = 512 * 1024;

pub type ConfigFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A revision activated through the pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activated {
    pub epoch: u64,
    pub digest: String,
    /// False when the pointer already named this document.
    pub moved: bool,
}

/// Why a config request was not done.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigRefusal {
    /// The node's engine is not up yet.
    Starting,
    /// The document is refused: every error with its path (`[{path, message}]`).
    Invalid(serde_json::Value),
    /// No revision was ever activated.
    NoActiveRevision,
    /// The pointer cannot be read or moved right now (what happened).
    PointerUnavailable(String),
    /// Another operator activated on every attempt (what happened).
    PointerContended(String),
    /// Coordination refused otherwise, or the stored revision is unusable.
    Failed(String),
}

/// The config plane as the HTTP surface reaches it. Implemented by the node.
pub trait ConfigPlane: Send + Sync + 'static {
    /// Validates `document` for this node, stores it, activates it.
    fn put(&self, document: String) -> ConfigFuture<'_, Result<Activated, ConfigRefusal>>;
    /// The active revision and the fleet's word on it (`GET /config`'s body).
    fn active(&self) -> ConfigFuture<'_, Result<serde_json::Value, ConfigRefusal>>;
}

/// `PUT /config` and `GET /config`.
pub fn routes(plane: Arc<dyn ConfigPlane>) -> Router {
    Router::new()
        .route("/config", get(get_config).put(put_config))
        .layer(DefaultBodyLimit::max(MAX_DOCUMENT_BYTES))
        .with_state(plane)
}

fn refused(r: ConfigRefusal) -> Response {
    let later = |error: &str, detail: String| {
        crate::retry_later(crate::OPERATOR_RETRY_SECONDS, error, detail)
    };
    match r {
        ConfigRefusal::Starting => later(
            "starting",
            "the node's engine is not up yet; retry in a few seconds".into(),
        ),
        ConfigRefusal::PointerUnavailable(detail) => later("pointer_unavailable", detail),
        ConfigRefusal::PointerContended(detail) => later("pointer_contended", detail),
        ConfigRefusal::Invalid(errors) => {
            (StatusCode::BAD_REQUEST, Json(json!({ "errors": errors }))).into_response()
        }
        ConfigRefusal::NoActiveRevision => (
            StatusCode::NOT_FOUND,
            Json(json!({
                "error": "no_active_revision",
                "detail": "no company revision has been activated; PUT /config with a company document",
            })),
        )
            .into_response(),
        ConfigRefusal::Failed(detail) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({ "error": "config_plane", "detail": detail })),
        )
            .into_response(),
    }
}

async fn put_config(State(plane): State<Arc<dyn ConfigPlane>>, body: Bytes) -> Response {
    let Ok(document) = String::from_utf8(body.to_vec()) else {
        return refused(ConfigRefusal::Invalid(json!([{
            "path": "",
            "message": "the body is not UTF-8 text; send the company document as TOML",
        }])));
    };
    match plane.put(document).await {
        Ok(a) => {
            let status = if a.moved {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            let body = json!({ "epoch": a.epoch, "digest": a.digest, "activated": a.moved });
            (status, Json(body)).into_response()
        }
        Err(r) => refused(r),
    }
}

async fn get_config(State(plane): State<Arc<dyn ConfigPlane>>) -> Response {
    match plane.active().await {
        Ok(body) => Json(body).into_response(),
        Err(r) => refused(r),
    }
}
