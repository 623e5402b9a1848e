//! Snapshots over the broker: a data node behind the trim asks the peer
//! furthest along for its estate whole and installs it.
//!
//! Rule: an adopted file is installed only after its SHA-256 matches the
//! donor's and `PRAGMA integrity_check` answers `ok`; a refused one leaves
//! this node's estate as it was (behind, saying so). Why: the snapshot
//! replaces every row, so a torn or tampered copy would be a silent fork.
//! The donor writes a consistent copy (`Estate::snapshot_to`) into the
//! object store bucket [`crewlet_bus::SNAPSHOT_BUCKET`] and answers its
//! name; the asker deletes the object once it has it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::jetstream::object_store;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

use crate::{Estate, EstateError, Local, PositionBook, Positions};

/// How long an asker waits for a donor's answer.
const ASK_WITHIN: Duration = Duration::from_secs(60);

/// A donor's answer: where the snapshot is and what it holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Offer {
    pub donor: String,
    pub object: String,
    pub sha256: String,
    pub bytes: u64,
    pub positions: Positions,
}

/// Why a snapshot was not adopted.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(
        "no peer publishes a position on `{domain}` at or past the trim's floor {floor}: nobody can give this node a snapshot yet"
    )]
    NoDonor { domain: String, floor: u64 },
    #[error("the positions bucket did not answer: {0} (asked again)")]
    Positions(#[from] crewlet_coord::CoordError),
    #[error("the broker: {0} (asked again)")]
    Broker(String),
    #[error("peer {donor} could not make a snapshot: {reason}")]
    Donor { donor: String, reason: String },
    #[error(
        "refused the snapshot from {donor}: its SHA-256 is {got}, the donor said {want} (a torn or tampered copy; this node stays behind)"
    )]
    Checksum {
        donor: String,
        want: String,
        got: String,
    },
    #[error(
        "refused the snapshot from {donor}: integrity_check answered `{answer}` (this node stays behind)"
    )]
    Integrity { donor: String, answer: String },
    #[error(transparent)]
    Estate(#[from] EstateError),
    #[error("cannot stage the snapshot at {path}: {source}")]
    Stage {
        path: String,
        source: std::io::Error,
    },
}

fn sha256_file(path: &Path) -> Result<(String, u64), SnapshotError> {
    let stage = |source| SnapshotError::Stage {
        path: path.display().to_string(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(stage)?;
    let mut hasher = Sha256::new();
    let bytes = std::io::copy(&mut file, &mut hasher).map_err(stage)?;
    let digest = hasher.finalize();
    Ok((digest.iter().map(|b| format!("{b:02x}")).collect(), bytes))
}

async fn bucket(js: &jetstream::Context) -> Result<object_store::ObjectStore, SnapshotError> {
    js.create_object_store(object_store::Config {
        bucket: crewlet_bus::SNAPSHOT_BUCKET.to_owned(),
        max_age: Duration::from_secs(3600),
        ..Default::default()
    })
    .await
    .map_err(|e| {
        SnapshotError::Broker(format!(
            "object store {}: {e}",
            crewlet_bus::SNAPSHOT_BUCKET
        ))
    })
}

/// Checks `file` against `sha256` and SQLite's integrity check, then
/// installs it as the estate; records the adoption in `local`.
pub fn install(
    estate: &Estate,
    local: &Local,
    file: &Path,
    donor: &str,
    sha256: &str,
) -> Result<Positions, SnapshotError> {
    let (got, bytes) = sha256_file(file)?;
    let id = local.adoption_began(donor, sha256, bytes)?;
    let refuse = |e: SnapshotError| {
        let _ = local.adoption_ended(id, &e.to_string(), "{}");
        let _ = std::fs::remove_file(file);
        e
    };
    if got != sha256 {
        return Err(refuse(SnapshotError::Checksum {
            donor: donor.to_owned(),
            want: sha256.to_owned(),
            got,
        }));
    }
    let answer = crate::db::open_ro(file)
        .and_then(|c| {
            c.query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
                .map_err(EstateError::from)
        })
        .unwrap_or_else(|e| e.to_string());
    if answer != "ok" {
        return Err(refuse(SnapshotError::Integrity {
            donor: donor.to_owned(),
            answer,
        }));
    }
    let positions = estate.install(file).map_err(|e| refuse(e.into()))?;
    local.clear_after_adoption()?;
    let text = serde_json::to_string(&positions).unwrap_or_default();
    local.adoption_ended(id, "installed", &text)?;
    Ok(positions)
}

/// What a data node behind the trim adopts with.
#[derive(Clone)]
pub struct Adopter {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub book: PositionBook,
    pub node: String,
    /// Where the fetched file is staged (the node's data dir).
    pub staging: PathBuf,
}

impl Adopter {
    /// Asks the peer furthest along on `domain` for a snapshot, fetches,
    /// checks and installs it; answers the positions it stands at.
    pub async fn adopt(
        &self,
        estate: &Estate,
        local: &Local,
        domain: &str,
    ) -> Result<Positions, SnapshotError> {
        let floor = self.book.floor(domain).await?;
        let positions = self.book.positions(domain).await?;
        let donor = positions
            .iter()
            .filter(|(n, p)| **n != self.node && **p >= floor)
            .max_by_key(|(_, p)| **p)
            .map(|(n, _)| n.clone())
            .ok_or_else(|| SnapshotError::NoDonor {
                domain: domain.to_owned(),
                floor,
            })?;
        let began = Instant::now();
        let reply = tokio::time::timeout(
            ASK_WITHIN,
            self.client.request(
                crewlet_bus::snapshot_subject(&donor),
                self.node.clone().into(),
            ),
        )
        .await
        .map_err(|_| {
            SnapshotError::Broker(format!("peer {donor} did not answer within {ASK_WITHIN:?}"))
        })?
        .map_err(|e| SnapshotError::Broker(format!("asking {donor}: {e}")))?;
        let offer: Offer =
            serde_json::from_slice(&reply.payload).map_err(|_| SnapshotError::Donor {
                donor: donor.clone(),
                reason: String::from_utf8_lossy(&reply.payload).into_owned(),
            })?;
        let store = bucket(&self.js).await?;
        let staged = self.staging.join("replicated.adopting");
        let mut object = store
            .get(&offer.object)
            .await
            .map_err(|e| SnapshotError::Broker(format!("fetching {}: {e}", offer.object)))?;
        let stage = |source| SnapshotError::Stage {
            path: staged.display().to_string(),
            source,
        };
        // Streamed to the file: an estate of gigabytes never sits in memory.
        let mut file = tokio::fs::File::create(&staged).await.map_err(stage)?;
        tokio::io::copy(&mut object, &mut file)
            .await
            .map_err(|e| SnapshotError::Broker(format!("fetching {}: {e}", offer.object)))?;
        file.sync_all().await.map_err(stage)?;
        drop(file);
        let _ = store.delete(&offer.object).await;
        let installed = install(estate, local, &staged, &offer.donor, &offer.sha256)?;
        tracing::info!(subsystem = "statelog", donor = %offer.donor, bytes = offer.bytes,
            ms = began.elapsed().as_millis() as u64, "adopted a peer's snapshot of the estate");
        Ok(installed)
    }
}

/// Answers snapshot requests addressed to `node` until the returned task
/// is aborted (the node's teardown).
pub async fn serve(
    client: async_nats::Client,
    js: jetstream::Context,
    estate: Arc<Estate>,
    node: String,
    staging: PathBuf,
) -> Result<JoinHandle<()>, SnapshotError> {
    let mut requests = client
        .subscribe(crewlet_bus::snapshot_subject(&node))
        .await
        .map_err(|e| SnapshotError::Broker(e.to_string()))?;
    Ok(tokio::spawn(async move {
        while let Some(msg) = requests.next().await {
            let Some(reply) = msg.reply.clone() else {
                continue;
            };
            let asker = String::from_utf8_lossy(&msg.payload).into_owned();
            let answer = match offer(&js, &estate, &node, &asker, &staging).await {
                Ok(o) => serde_json::to_vec(&o).unwrap_or_default(),
                Err(e) => e.to_string().into_bytes(),
            };
            let _ = client.publish(reply, answer.into()).await;
        }
    }))
}

async fn offer(
    js: &jetstream::Context,
    estate: &Arc<Estate>,
    node: &str,
    asker: &str,
    staging: &Path,
) -> Result<Offer, SnapshotError> {
    let object = format!("{asker}-{}", uuid::Uuid::now_v7());
    let file = staging.join(format!("replicated.snapshot-{object}"));
    let e2 = estate.clone();
    let f2 = file.clone();
    let positions = tokio::task::spawn_blocking(move || e2.snapshot_to(&f2))
        .await
        .map_err(|e| SnapshotError::Broker(e.to_string()))??;
    let result = async {
        let (sha256, bytes) = sha256_file(&file)?;
        let store = bucket(js).await?;
        let mut reader =
            tokio::fs::File::open(&file)
                .await
                .map_err(|source| SnapshotError::Stage {
                    path: file.display().to_string(),
                    source,
                })?;
        store
            .put(object.as_str(), &mut reader)
            .await
            .map_err(|e| SnapshotError::Broker(format!("storing the snapshot: {e}")))?;
        Ok(Offer {
            donor: node.to_owned(),
            object,
            sha256,
            bytes,
            positions,
        })
    }
    .await;
    let _ = std::fs::remove_file(&file);
    result
}
