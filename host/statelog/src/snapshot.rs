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
//!
//! A donor checks itself first: it offers only while every domain it holds
//! is applying at or past the trim's floor (not diverged, not behind or
//! adopting, not evicted), and otherwise answers why; the asker then asks
//! the next peer, furthest along first. Why: a copy of rows that diverged
//! or fell behind would spread one node's fault to another.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::jetstream::object_store;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::{DomainState, DomainStatus, Estate, EstateError, Local, PositionBook, Positions};

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
    #[error("this node cannot give a snapshot now: {0}; ask another peer")]
    CannotDonate(String),
    #[error(
        "no peer at or past the trim's floor {floor} on `{domain}` gave a snapshot (asked, furthest along first: {tried}); this node stays behind and asks again"
    )]
    NoneGave {
        domain: String,
        floor: u64,
        tried: String,
    },
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
    /// Asks the peers at or past the trim's floor on `domain`, furthest
    /// along first, for a snapshot until one gives a copy that checks;
    /// installs it and answers the positions it stands at. A peer that
    /// refuses (it cannot donate now), does not answer or gives a bad copy
    /// is passed over for the next.
    pub async fn adopt(
        &self,
        estate: &Estate,
        local: &Local,
        domain: &str,
    ) -> Result<Positions, SnapshotError> {
        let floor = self.book.floor(domain).await?;
        let mut donors: Vec<(String, u64)> = self
            .book
            .positions(domain)
            .await?
            .into_iter()
            .filter(|(n, p)| *n != self.node && *p >= floor)
            .collect();
        if donors.is_empty() {
            return Err(SnapshotError::NoDonor {
                domain: domain.to_owned(),
                floor,
            });
        }
        donors.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut tried = Vec::new();
        for (donor, _) in donors {
            match self.adopt_from(estate, local, &donor).await {
                Ok(positions) => return Ok(positions),
                // This node's own disk: no other peer helps.
                Err(e @ (SnapshotError::Estate(_) | SnapshotError::Stage { .. })) => return Err(e),
                Err(e) => {
                    tracing::info!(subsystem = "statelog", %donor, reason = %e, "peer gave no snapshot; asking the next");
                    tried.push(format!("{donor}: {e}"));
                }
            }
        }
        Err(SnapshotError::NoneGave {
            domain: domain.to_owned(),
            floor,
            tried: tried.join("; "),
        })
    }

    async fn adopt_from(
        &self,
        estate: &Estate,
        local: &Local,
        donor: &str,
    ) -> Result<Positions, SnapshotError> {
        let began = Instant::now();
        let reply = tokio::time::timeout(
            ASK_WITHIN,
            self.client.request(
                crewlet_bus::snapshot_subject(donor),
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
                donor: donor.to_owned(),
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

/// What a node gives snapshots from.
pub struct Donor {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub estate: Arc<Estate>,
    pub node: String,
    /// Where the copy is written before it goes to the object store.
    pub staging: PathBuf,
    /// Where the trim's floor is read (`None`: not checked, a test's).
    pub book: Option<PositionBook>,
    /// Each domain's applier status: a copy is offered only while all of
    /// them apply at or past the floor.
    pub domains: Vec<watch::Receiver<DomainStatus>>,
}

impl Donor {
    /// Why this node cannot give a snapshot now, if it cannot.
    pub async fn cannot_donate(&self) -> Option<String> {
        for status in &self.domains {
            let s = status.borrow().clone();
            let state = match &s.state {
                DomainState::Applying => None,
                DomainState::Starting => Some("its applier is starting".to_owned()),
                DomainState::Behind { floor, .. } => Some(format!(
                    "it is behind the trim's floor {floor} (adopting a snapshot itself)"
                )),
                DomainState::Evicted { .. } => Some("an operator evicted it".to_owned()),
                DomainState::Diverged { finding, .. } => {
                    Some(format!("its log diverged ({})", finding.found))
                }
                DomainState::Unavailable { reason } => {
                    Some(format!("its applier is waiting ({reason})"))
                }
            };
            if let Some(why) = state {
                return Some(format!("domain `{}`: {why}", s.domain));
            }
            let Some(book) = &self.book else { continue };
            match book.floor(&s.domain).await {
                Ok(floor) if s.position < floor => {
                    return Some(format!(
                        "domain `{}`: its position {} is below the trim's floor {floor}",
                        s.domain, s.position
                    ));
                }
                Ok(_) => {}
                Err(e) => {
                    return Some(format!(
                        "domain `{}`: the trim's floor is unknown ({e})",
                        s.domain
                    ));
                }
            }
        }
        None
    }
}

/// Answers snapshot requests addressed to `donor.node` until the returned
/// task is aborted (the node's teardown): a copy when the donor checks
/// out, otherwise why not.
pub async fn serve(donor: Donor) -> Result<JoinHandle<()>, SnapshotError> {
    let mut requests = donor
        .client
        .subscribe(crewlet_bus::snapshot_subject(&donor.node))
        .await
        .map_err(|e| SnapshotError::Broker(e.to_string()))?;
    Ok(tokio::spawn(async move {
        let Donor {
            client,
            js,
            estate,
            node,
            staging,
            ..
        } = &donor;
        while let Some(msg) = requests.next().await {
            let Some(reply) = msg.reply.clone() else {
                continue;
            };
            let asker = String::from_utf8_lossy(&msg.payload).into_owned();
            let checked = match donor.cannot_donate().await {
                Some(why) => Err(SnapshotError::CannotDonate(why)),
                None => offer(js, estate, node, &asker, staging).await,
            };
            let answer = match checked {
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
