//! `GET /plugins/{name}/state/{bucket}`: a module bucket's current keys
//! and values, read-only, for operators (scope `read`, like `/plugins`).
//! `bucket` is the module's own local name for a bucket it owns. Values
//! are shown as JSON when they are JSON, else as text; no value holds a
//! credential (ADR 202: the host refuses credential-named fields at put).
//! At most [`MAX_KEYS`] keys are answered, and the answer says so when it
//! holds fewer than the bucket.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use crewlet_plugins::manifest::{Permissions, bucket_name};
use serde_json::{Value, json};

use crate::engine::Late;

/// The most keys one answer lists.
pub const MAX_KEYS: usize = 1000;

pub fn routes(late: Late) -> Router {
    Router::new()
        .route("/plugins/{name}/state/{bucket}", get(state))
        .with_state(late)
}

fn not_found(detail: String) -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({ "error": "not_found", "detail": detail })),
    )
        .into_response()
}

async fn state(State(late): State<Late>, Path((name, bucket)): Path<(String, String)>) -> Response {
    let Some(ctx) = late.get() else {
        return crewlet_api::retry_later(
            crewlet_api::OPERATOR_RETRY_SECONDS,
            "starting",
            "the node's engine is not up yet; retry in a few seconds",
        );
    };
    let Some(loaded) = &ctx.plugins else {
        return not_found("no plugins directory on this node".into());
    };
    let Some(module) = loaded.installed.module(&name) else {
        return not_found(format!("no module {name:?} runs on this node"));
    };
    let owns = match &module.manifest().permissions {
        Permissions::Module { state, .. } => state.iter().any(|b| b.local == bucket),
        _ => false,
    };
    if !owns {
        return not_found(format!(
            "module {name:?} owns no bucket {bucket:?} (its manifest's [module.state.*])"
        ));
    }
    let mesh = bucket_name(&name, &bucket);
    let unavailable = |e: String| {
        crewlet_api::retry_later(crewlet_api::OPERATOR_RETRY_SECONDS, "state_unavailable", e)
    };
    let keys = match loaded.state.keys(&mesh).await {
        Ok(k) => k,
        Err(e) => return unavailable(e.to_string()),
    };
    let total = keys.len();
    let mut entries = Vec::new();
    for key in keys.into_iter().take(MAX_KEYS) {
        match loaded.state.get(&mesh, &key).await {
            Ok(Some(e)) => entries.push(json!({
                "key": e.key,
                "revision": e.revision,
                "value": shown(&e.value),
            })),
            Ok(None) => {} // deleted since the listing
            Err(e) => return unavailable(e.to_string()),
        }
    }
    Json(json!({
        "module": name,
        "bucket": bucket,
        "keys": total,
        "entries": entries,
        "limit": MAX_KEYS,
        "truncated": total > MAX_KEYS,
    }))
    .into_response()
}

fn shown(value: &[u8]) -> Value {
    serde_json::from_slice(value)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(value).into_owned()))
}
