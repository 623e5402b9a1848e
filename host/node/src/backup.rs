//! Backup and restore on the running node (`crewlet_stream::backup` is the
//! artefact): `POST /backup` (admin) writes one artefact directory on the
//! node's machine — the company's buckets and streams, and this node's own
//! store (its event log: the history) as a consistent SQLite copy;
//! `crewlet backup DIR` asks for it. `crewlet restore ARTEFACT --data-dir D`
//! verifies the artefact whole, puts the store into an empty data dir and
//! leaves a marker; the next `crewlet run` on D publishes the streams back
//! once its own streams, buckets and plugins' buckets exist and before the
//! config plane and the seats start, so the company comes up as it was.
//! A marker whose artefact fails then stops the start, with the reason.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use crewlet_stream::backup::{self, BackupError, Writer};
use serde::Deserialize;
use serde_json::json;
use tracing::info;

use crate::engine::{EngineContext, Late};

/// The marker a restore leaves in the data dir: the artefact's path.
pub const PENDING: &str = "restore-pending";
/// The store's file inside an artefact.
const STORE_FILE: &str = "node.sqlite3";

#[derive(Deserialize)]
struct BackupBody {
    dir: PathBuf,
}

pub(crate) fn routes(late: Late) -> Router {
    Router::new()
        .route("/backup", post(back_up_route))
        .with_state(Arc::new(late))
}

async fn back_up_route(State(late): State<Arc<Late>>, Json(body): Json<BackupBody>) -> Response {
    let Some(ctx) = late.get() else {
        return crewlet_api::retry_later(
            crewlet_api::OPERATOR_RETRY_SECONDS,
            "the node is still starting",
            "ask again in a moment",
        );
    };
    if !body.dir.is_absolute() {
        let e = "`dir` must be an absolute path on the node's machine";
        return (StatusCode::BAD_REQUEST, Json(json!({ "error": e }))).into_response();
    }
    match back_up(ctx, &body.dir).await {
        Ok(manifest) => (StatusCode::OK, Json(json!(manifest))).into_response(),
        Err(e) => {
            let status = match e {
                BackupError::Write { .. } => StatusCode::CONFLICT,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            (status, Json(json!({ "error": e.to_string() }))).into_response()
        }
    }
}

/// Writes the artefact into `dir`: the streams first, then the store.
async fn back_up(ctx: &EngineContext, dir: &Path) -> Result<backup::Manifest, BackupError> {
    let js = async_nats::jetstream::new(ctx.client.clone());
    let mut writer = Writer::create(dir, &ctx.node_id)?;
    backup::write_streams(&js, &mut writer, &ctx.coord.options().namespace).await?;
    let (store, into) = (ctx.store.clone(), writer.dir().join(STORE_FILE));
    tokio::task::spawn_blocking(move || store.snapshot_to(&into))
        .await
        .expect("the store snapshot panicked")
        .map_err(|e| BackupError::Write {
            dir: dir.to_owned(),
            detail: format!("{STORE_FILE}: {e}"),
        })?;
    writer.add_written(STORE_FILE)?;
    let manifest = writer.finish()?;
    info!(subsystem = "backup", dir = %dir.display(), files = manifest.files.len(), "backup written");
    Ok(manifest)
}

/// `crewlet restore`: verifies `artefact`, puts its store into the empty
/// `data_dir` and leaves the marker the next start reads. Answers what to
/// print, or the reason it refused (nothing written then).
pub fn prepare(artefact: &Path, data_dir: &Path) -> Result<String, String> {
    let artefact = std::path::absolute(artefact).map_err(|e| e.to_string())?;
    let manifest = backup::verify(&artefact).map_err(|e| e.to_string())?;
    let store = data_dir.join(crewlet_store::FILE_NAME);
    if store.exists() || data_dir.join(PENDING).exists() {
        return Err(format!(
            "{} is not empty (it holds a node store or a restore already); restore into a fresh or emptied data dir",
            data_dir.display()
        ));
    }
    std::fs::create_dir_all(data_dir).map_err(|e| format!("{}: {e}", data_dir.display()))?;
    if manifest.files.iter().any(|f| f.file == STORE_FILE) {
        std::fs::copy(artefact.join(STORE_FILE), &store)
            .map_err(|e| format!("{}: {e}", store.display()))?;
    }
    std::fs::write(data_dir.join(PENDING), artefact.display().to_string())
        .map_err(|e| format!("{}: {e}", data_dir.display()))?;
    Ok(format!(
        "restore prepared in {}: start `crewlet run` on it against a fresh broker; the company's buckets and streams are restored as it starts",
        data_dir.display()
    ))
}

/// At start: publishes a prepared restore's streams back, then removes the
/// marker. Nothing to do without one.
pub async fn adopt_pending(ctx: &EngineContext) -> Result<(), String> {
    let marker = ctx.config.data_dir.join(PENDING);
    let Ok(artefact) = std::fs::read_to_string(&marker) else {
        return Ok(());
    };
    let js = async_nats::jetstream::new(ctx.client.clone());
    let restored = backup::restore_streams(&js, Path::new(artefact.trim()))
        .await
        .map_err(|e| format!("restore from {artefact}: {e}"))?;
    std::fs::remove_file(&marker).map_err(|e| format!("{}: {e}", marker.display()))?;
    info!(subsystem = "backup", %artefact, ?restored, "the company's buckets and streams were restored");
    Ok(())
}
