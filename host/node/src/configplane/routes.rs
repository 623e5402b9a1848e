//! `PUT /config` and `GET /config`: bound with the HTTP surface before the
//! engine is up, answering 503 with Retry-After until it is. A document is
//! validated first (400 with every error and its path), stored, then
//! activated; an unreadable pointer is unknown, answered 503, never "unset".

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use crewlet_coord::Pointer;
use serde_json::json;
use tracing::{info, warn};

use super::activation::{ConfigError, activate, announce, fetch};
use crate::engine::Late;

/// Largest company document `PUT /config` accepts.
pub const MAX_DOCUMENT_BYTES: usize = 512 * 1024;

/// `PUT /config` and `GET /config`, bound with the HTTP surface before the
/// engine is up (they answer 503 with Retry-After until it is).
pub fn routes(late: Late) -> Router {
    Router::new()
        .route("/config", get(get_config).put(put_config))
        .layer(DefaultBodyLimit::max(MAX_DOCUMENT_BYTES))
        .with_state(late)
}

fn retry_later(error: &str, detail: String) -> Response {
    crewlet_api::retry_later(crewlet_api::OPERATOR_RETRY_SECONDS, error, detail)
}

fn not_up() -> Response {
    retry_later(
        "starting",
        "the node's engine is not up yet; retry in a few seconds".into(),
    )
}

fn failure(e: ConfigError) -> Response {
    match e {
        ConfigError::Unavailable(_) => retry_later("pointer_unavailable", e.to_string()),
        ConfigError::Contended(_) => retry_later("pointer_contended", e.to_string()),
        other => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({ "error": "config_plane", "detail": other.to_string() })),
        )
            .into_response(),
    }
}

async fn put_config(State(late): State<Late>, body: Bytes) -> Response {
    let Some(ctx) = late.get() else {
        return not_up();
    };
    let Ok(document) = std::str::from_utf8(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({ "errors": [{
                "path": "",
                "message": "the body is not UTF-8 text; send the company document as TOML",
            }]})),
        )
            .into_response();
    };
    let accepted = crate::company::accept(document, &crate::company::policy(&ctx.config)).and_then(
        |company| {
            crate::company::runnable(
                company,
                ctx.plugins.as_ref().map(|l| l.catalogue()).as_ref(),
            )
        },
    );
    let company = match accepted {
        Ok(c) => c,
        Err(invalid) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({ "errors": invalid.errors })),
            )
                .into_response();
        }
    };
    let source = format!("PUT /config on node {}", ctx.node_id);
    match activate(&ctx.coord, &company, document, &source).await {
        Ok(a) => {
            if a.moved {
                info!(subsystem = "configplane", epoch = a.epoch, digest = %a.digest,
                    org = %company.org, "company revision activated");
                announce(ctx, "config_activated", a.epoch, &a.digest, &company).await;
                // Every node's reconciler polls at once; a hint lost costs
                // one poll.
                let hint = ctx.client.publish(
                    crewlet_bus::CONFIG_ACTIVATED_SUBJECT,
                    a.epoch.to_string().into(),
                );
                if let Err(e) = hint.await {
                    warn!(subsystem = "configplane", error = %e, epoch = a.epoch,
                        "could not tell the fleet the pointer moved; nodes apply it on their next poll");
                }
            }
            let status = if a.moved {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            (
                status,
                Json(json!({
                    "epoch": a.epoch,
                    "digest": a.digest,
                    "activated": a.moved,
                })),
            )
                .into_response()
        }
        Err(e) => {
            warn!(subsystem = "configplane", error = %e, "PUT /config not done");
            failure(e)
        }
    }
}

async fn get_config(State(late): State<Late>) -> Response {
    let Some(ctx) = late.get() else {
        return not_up();
    };
    let (digest, epoch) = match ctx.coord.active_config().await {
        Ok(Pointer::Set { revision, epoch }) => (revision, epoch),
        Ok(Pointer::Unset) => {
            return (
                StatusCode::NOT_FOUND,
                Json(json!({
                    "error": "no_active_revision",
                    "detail": "no company revision has been activated; PUT /config with a company document",
                })),
            )
                .into_response();
        }
        Err(e) => return failure(e.into()),
    };
    match fetch(&ctx.coord, &digest, epoch).await {
        Ok(f) => {
            let applied_epoch = ctx.active.applied_epoch();
            // Every node's own word on what it applied (the status bucket
            // ages a departed node out); unreadable is unknown, not none.
            let (fleet, fleet_error) = match ctx.coord.statuses().await {
                Ok(all) => (
                    Some(
                        all.iter()
                            .map(|(node, s)| {
                                json!({
                                    "node": node,
                                    "applied_epoch": s["applied_epoch"],
                                    "posture": s["posture"],
                                    "error": s["error"],
                                })
                            })
                            .collect::<Vec<_>>(),
                    ),
                    None,
                ),
                Err(e) => (None, Some(e.to_string())),
            };
            Json(json!({
                "fleet": fleet,
                "fleet_error": fleet_error,
                "epoch": epoch,
                "digest": digest,
                "org": f.company.org,
                "source": f.source,
                "document": f.document,
                "applied": applied_epoch == Some(epoch),
                "applied_epoch": applied_epoch,
            }))
            .into_response()
        }
        Err(e) => failure(e),
    }
}
