//! Backup and restore on the running node (`crewlet_stream::backup` is the
//! artefact): `POST /backup` (admin) writes one artefact directory on the
//! node's machine — the company's buckets and streams, this node's own
//! store (its event log: the history) as a consistent SQLite copy, and on a
//! data node the replicated estate's copy with the state logs pinned while
//! the backup runs (`crewlet_statelog::backup`);
//! `crewlet backup DIR` asks for it. `crewlet restore ARTEFACT --data-dir D`
//! verifies the artefact whole, puts the store into an empty data dir and
//! leaves a marker; the next `crewlet run` on D publishes the streams back
//! once its own streams, buckets and plugins' buckets exist and before the
//! config plane and the seats start, installs the estate's copy with its
//! positions moved onto the restored usage log (from which the applier
//! replays) and forgets the old log's positions and floor, so the company
//! comes up as it was.
//! A marker whose artefact fails then stops the start, with the reason.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crewlet_statelog::usage::Usage;
use crewlet_statelog::{Domain, PositionBook};
use crewlet_stream::backup::{self, BackupError, Writer};
use tracing::info;

use crate::EstateSlot;

/// The marker a restore leaves in the data dir: the artefact's path.
pub const PENDING: &str = "restore-pending";
/// The store's file inside an artefact.
const STORE_FILE: &str = "node.sqlite3";
/// The replicated estate's copy inside an artefact.
const ESTATE_FILE: &str = "replicated.sqlite3";

/// What a backup and an adopted restore are run with (the node's handles).
pub struct Parts<'a> {
    pub node_id: &'a str,
    pub client: &'a async_nats::Client,
    pub coord: &'a crewlet_coord::Coord,
    pub store: &'a Arc<crewlet_store::Store>,
    pub config: &'a crewlet_config::NodeConfig,
    pub estate: &'a EstateSlot,
}

/// Why a restore was refused or failed; nothing is lost either way: a
/// refused `prepare` wrote nothing, a failed adoption keeps its marker.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The artefact is missing, damaged or too new: the operator's to fix.
    #[error("{0}")]
    Artefact(#[source] BackupError),
    /// `crewlet restore` was pointed at a data dir already in use.
    #[error(
        "{} is not empty (it holds a node store, a replicated estate or a restore already); restore into a fresh or emptied data dir",
        .0.display()
    )]
    NotEmpty(PathBuf),
    /// A file could not be read or written on this machine.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// At start: a pending restore did not finish (the broker, the
    /// positions bucket or the artefact); the marker stays, so starting
    /// again retries.
    #[error("restore from {artefact}: {detail}")]
    Adopt { artefact: String, detail: String },
}

/// `POST /backup` (admin): writes the artefact into `dir`, which must be
/// an absolute path on the node's machine.
pub async fn back_up(p: &Parts<'_>, dir: &Path) -> Result<backup::Manifest, BackupError> {
    let mut writer = Writer::create(dir, p.node_id)?;
    let book = PositionBook::new(p.coord.clone());
    let pin = format!("backup-{}-{}", p.node_id, crewlet_os::now_ms());
    let domains = [Usage.name()];
    let positions = match p.estate.get() {
        None => {
            let why = if p.config.roles.contains(&crewlet_config::Role::Data) {
                "this node's replicated estate is not open (see /health `estate`): back up from another data node for the estate"
            } else {
                "this node has no `data` role, so it holds no replicated estate: back up from a data node for the estate"
            };
            writer.no_estate(why);
            None
        }
        Some(held) => {
            let into = writer.dir().join(ESTATE_FILE);
            let copied =
                crewlet_statelog::backup::pin_and_copy(&held.estate, &book, &domains, &pin, &into)
                    .await
                    .map_err(|e| BackupError::Write {
                        dir: dir.to_owned(),
                        detail: format!("{ESTATE_FILE}: {e}"),
                    })?;
            Some(copied)
        }
    };
    let written = write_rest(p, writer, dir, positions.as_ref()).await;
    if positions.is_some() {
        crewlet_statelog::backup::unpin(&book, &domains, &pin).await;
    }
    written
}

async fn write_rest(
    p: &Parts<'_>,
    mut writer: Writer,
    dir: &Path,
    estate: Option<&crewlet_statelog::Positions>,
) -> Result<backup::Manifest, BackupError> {
    if let Some(positions) = estate {
        writer.add_estate(ESTATE_FILE, positions.0.clone())?;
    }
    let js = async_nats::jetstream::new(p.client.clone());
    backup::write_streams(&js, &mut writer, &p.coord.options().namespace).await?;
    let (store, into) = (p.store.clone(), writer.dir().join(STORE_FILE));
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
pub fn prepare(artefact: &Path, data_dir: &Path) -> Result<String, RestoreError> {
    let artefact = std::path::absolute(artefact).map_err(|source| RestoreError::Io {
        path: artefact.to_owned(),
        source,
    })?;
    let manifest = backup::verify(&artefact).map_err(RestoreError::Artefact)?;
    let store = data_dir.join(crewlet_store::FILE_NAME);
    let taken = [
        store.clone(),
        data_dir.join(PENDING),
        data_dir.join(crewlet_statelog::ESTATE_FILE),
    ];
    if taken.iter().any(|f| f.exists()) {
        return Err(RestoreError::NotEmpty(data_dir.to_owned()));
    }
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| RestoreError::Io { path, source }
    };
    std::fs::create_dir_all(data_dir).map_err(io(data_dir))?;
    if manifest.files.iter().any(|f| f.file == STORE_FILE) {
        std::fs::copy(artefact.join(STORE_FILE), &store).map_err(io(&store))?;
    }
    std::fs::write(data_dir.join(PENDING), artefact.display().to_string()).map_err(io(data_dir))?;
    Ok(format!(
        "restore prepared in {}: start `crewlet run` on it against a fresh broker; the company's buckets and streams are restored as it starts",
        data_dir.display()
    ))
}

/// At start: publishes a prepared restore's streams back, then removes the
/// marker. Nothing to do without one.
pub async fn adopt_pending(p: &Parts<'_>) -> Result<(), RestoreError> {
    let marker = p.config.data_dir.join(PENDING);
    let Ok(artefact) = std::fs::read_to_string(&marker) else {
        return Ok(());
    };
    let js = async_nats::jetstream::new(p.client.clone());
    let dir = Path::new(artefact.trim());
    let fail = |detail: String| RestoreError::Adopt {
        artefact: artefact.clone(),
        detail,
    };
    // The usage log exists before its records go back (the estate makes it
    // later at start), and how many it held says where they land.
    let usage = crewlet_statelog::ensure_stream(&js, &Usage, p.config.stream.replicas)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let base = usage
        .get_info()
        .await
        .map_err(|e| fail(e.to_string()))?
        .state
        .last_sequence;
    let restored = backup::restore_streams(&js, dir)
        .await
        .map_err(|e| fail(e.to_string()))?;
    restore_estate(p, dir, base).await.map_err(fail)?;
    std::fs::remove_file(&marker).map_err(|source| RestoreError::Io {
        path: marker.clone(),
        source,
    })?;
    info!(subsystem = "backup", %artefact, ?restored, "the company's buckets and streams were restored");
    Ok(())
}

/// Installs the artefact's estate copy (on a data node) with its usage
/// position moved onto the restored usage log, whose first restored record
/// landed after `base`; then forgets the old log's positions, pins and
/// floor the restored positions bucket brought back (they number another
/// log's records).
async fn restore_estate(p: &Parts<'_>, dir: &Path, base: u64) -> Result<(), String> {
    let manifest = backup::verify(dir).map_err(|e| e.to_string())?;
    let dump = manifest
        .files
        .iter()
        .find(|f| f.stream.as_deref() == Some(crewlet_bus::USAGE_LOG_STREAM))
        .map(|f| std::fs::read(dir.join(&f.file)))
        .transpose()
        .map_err(|e| e.to_string())?;
    if dump.is_some() {
        PositionBook::new(p.coord.clone())
            .forget_log(Usage.name())
            .await
            .map_err(|e| format!("the positions bucket: {e}; start again to retry"))?;
    }
    let Some(slot) = &manifest.estate else {
        return Ok(());
    };
    if !p.config.roles.contains(&crewlet_config::Role::Data) {
        info!(
            subsystem = "backup",
            "the artefact holds an estate, but this node has no `data` role: not installed"
        );
        return Ok(());
    }
    let rebase = |_domain: &str, old: u64| {
        dump.as_deref()
            .and_then(|d| backup::restored_position(d, base, old))
            .unwrap_or(base)
    };
    let positions =
        crewlet_statelog::backup::restore(&dir.join(&slot.file), &p.config.data_dir, &rebase)
            .map_err(|e| e.to_string())?;
    info!(
        subsystem = "backup",
        ?positions,
        "the replicated estate was restored"
    );
    Ok(())
}
