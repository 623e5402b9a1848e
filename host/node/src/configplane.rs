//! The config plane (issue 5, first cut): one company, agreed by pointer.
//!
//! Rule: a company document becomes active only by a compare-and-set on the
//! fleet's config pointer, whose own revision is the epoch; every node polls
//! the pointer and applies what it names. Why: two operators activating at
//! once get two revisions in order rather than one overwriting the other,
//! and every node can tell from one number whether it serves what the fleet
//! agreed on.
//!
//! - A revision's document is stored in the config bucket before the pointer
//!   names it (record `company_revision:{digest}`), so any node can read it.
//! - `PUT /config` validates first (400 with every error and its path),
//!   stores, then activates. `GET /config` answers the active revision.
//! - The reconciler polls every [`POLL_INTERVAL`]; applying an epoch sets the
//!   node's [`crewlet_company::ActiveCompany`], records it in the node store
//!   and writes this node's status in the status bucket.
//! - Unknown is never no: an unreadable pointer keeps the company the node
//!   serves, and the HTTP routes answer 503 with Retry-After.
//! - At start, a node holding an offline import (`crewlet config import`
//!   with the node stopped) publishes it through the pointer from wherever
//!   the pointer is (it is the operator's latest word). A node started with
//!   `--company` activates that document only if the pointer is unset, so
//!   the first node of a fleet seeds it and a restarted or joining node
//!   follows the fleet instead of overwriting it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use crewlet_company::{Active, Company};
use crewlet_coord::{Answer, Bucket, Coord, CoordError, Pointer};
use serde_json::json;
use tokio::sync::watch;
use tracing::{Instrument, error, info, info_span, warn};

use crate::engine::{EngineContext, Late, Started};

/// How often every node reads the pointer.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);
/// How often a node re-writes its status while nothing changes (the status
/// bucket forgets a node that said nothing for about a minute).
pub const STATUS_REFRESH: Duration = Duration::from_secs(15);
/// Largest company document `PUT /config` accepts.
pub const MAX_DOCUMENT_BYTES: usize = 512 * 1024;
/// Seconds a refused caller is told to wait.
const RETRY_AFTER_SECONDS: u32 = 2;
/// Record class of a stored revision in the config bucket.
const REVISION_CLASS: &str = "company_revision";
/// Compare-and-set rounds before an activation gives up as contended.
const ACTIVATE_ATTEMPTS: u32 = 8;

/// Why the config plane could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "the config pointer cannot be read or moved right now ({0}); nothing changed — retry in a few seconds"
    )]
    Unavailable(CoordError),
    #[error("coordination refused the request: {0}")]
    Coord(CoordError),
    #[error(
        "the pointer names revision {digest} (epoch {epoch}) but the config bucket holds no document for it; PUT /config the document again to activate it"
    )]
    Missing { digest: String, epoch: u64 },
    #[error(
        "the stored revision {digest} has no readable document ({why}); PUT /config the document again"
    )]
    Malformed { digest: String, why: &'static str },
    #[error(
        "revision {digest} (epoch {epoch}) is refused by this build: {source}; upgrade this node or activate a document it accepts"
    )]
    Invalid {
        digest: String,
        epoch: u64,
        #[source]
        source: crewlet_company::Invalid,
    },
    #[error(
        "the pointer moved on every one of {0} attempts to activate; another operator is activating at the same time — retry"
    )]
    Contended(u32),
}

impl From<CoordError> for ConfigError {
    fn from(e: CoordError) -> ConfigError {
        if e.is_unavailable() {
            ConfigError::Unavailable(e)
        } else {
            ConfigError::Coord(e)
        }
    }
}

/// A revision activated through the pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activation {
    pub epoch: u64,
    pub digest: String,
    /// False when the pointer already named this document.
    pub moved: bool,
}

/// Stores `document` in the config bucket and activates it by
/// compare-and-set on the pointer. A pointer that moves under us is re-read
/// and tried again: the caller asked for this document to be active, and a
/// concurrent activation is ordered before it, never overwritten.
pub async fn activate(
    coord: &Coord,
    company: &Company,
    document: &str,
    source: &str,
) -> Result<Activation, ConfigError> {
    let digest = company.digest.clone();
    let record = json!({
        "digest": digest,
        "document": document,
        "source": source,
        "stored_ms": now_ms(),
    });
    coord
        .put_record(Bucket::Config, REVISION_CLASS, &digest, &record)
        .await?;
    for _ in 0..ACTIVATE_ATTEMPTS {
        let expected = match coord.active_config().await? {
            Pointer::Set { revision, epoch } if revision == digest => {
                return Ok(Activation {
                    epoch,
                    digest,
                    moved: false,
                });
            }
            Pointer::Set { epoch, .. } => Some(epoch),
            Pointer::Unset => None,
        };
        match coord.activate(&digest, expected).await? {
            Answer::Yes(epoch) => {
                return Ok(Activation {
                    epoch,
                    digest,
                    moved: true,
                });
            }
            Answer::No(_moved) => continue,
        }
    }
    Err(ConfigError::Contended(ACTIVATE_ATTEMPTS))
}

/// A stored revision, read back from the config bucket and validated.
struct Fetched {
    document: String,
    company: Company,
    source: Option<String>,
}

async fn fetch(coord: &Coord, digest: &str, epoch: u64) -> Result<Fetched, ConfigError> {
    let (value, _) = match coord
        .get_record(Bucket::Config, REVISION_CLASS, digest)
        .await?
    {
        Answer::Yes(found) => found,
        Answer::No(()) => {
            return Err(ConfigError::Missing {
                digest: digest.to_owned(),
                epoch,
            });
        }
    };
    let malformed = |why| ConfigError::Malformed {
        digest: digest.to_owned(),
        why,
    };
    let document = value["document"]
        .as_str()
        .ok_or_else(|| malformed("no `document` string"))?
        .to_owned();
    let company = Company::parse(&document).map_err(|source| ConfigError::Invalid {
        digest: digest.to_owned(),
        epoch,
        source,
    })?;
    if company.digest != digest {
        return Err(malformed("its document does not hash to its digest"));
    }
    Ok(Fetched {
        document,
        company,
        source: value["source"].as_str().map(str::to_owned),
    })
}

// ---- HTTP ---------------------------------------------------------------------

/// `PUT /config` and `GET /config`, bound with the HTTP surface before the
/// engine is up (they answer 503 with Retry-After until it is).
pub fn routes(late: Late) -> Router {
    Router::new()
        .route("/config", get(get_config).put(put_config))
        .layer(DefaultBodyLimit::max(MAX_DOCUMENT_BYTES))
        .with_state(late)
}

fn retry_later(error: &str, detail: String) -> Response {
    let mut resp = (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "error": error, "detail": detail })),
    )
        .into_response();
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
    resp
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
    let company = match Company::parse(document) {
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
            let applied_epoch = ctx.state.applied_epoch();
            Json(json!({
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

async fn announce(ctx: &EngineContext, kind: &str, epoch: u64, digest: &str, company: &Company) {
    let event = ctx.publisher.event(
        kind,
        json!({
            "epoch": epoch,
            "digest": digest,
            "org": company.org,
            "seats": company.seats.len(),
        }),
    );
    if let Err(e) = ctx.publisher.publish(event).await {
        warn!(subsystem = "configplane", error = %e, event = kind, "could not publish a config event");
    }
}

// ---- the reconciler --------------------------------------------------------------

/// A document this node publishes through the pointer once it can.
struct Pending {
    company: Company,
    document: String,
    source: String,
    /// `--company`: only seeds an unset pointer. An offline import: always.
    only_if_unset: bool,
}

struct Reconciler {
    ctx: EngineContext,
    pending: Option<Pending>,
    applied: Option<u64>,
    /// An epoch that failed to apply, so it is reported once, not every poll.
    failed: Option<(u64, String)>,
    status_written: Option<Instant>,
    pointer_down: bool,
}

impl Reconciler {
    /// One poll: publish what is pending, apply what the pointer names,
    /// keep this node's status fresh.
    async fn tick(&mut self) {
        let pointer = match self.ctx.coord.active_config().await {
            Ok(p) => p,
            Err(e) => {
                if !self.pointer_down {
                    warn!(subsystem = "configplane", error = %e,
                        "config pointer unreadable; keeping the company this node serves");
                }
                self.pointer_down = true;
                return;
            }
        };
        if std::mem::take(&mut self.pointer_down) {
            info!(subsystem = "configplane", "config pointer readable again");
        }
        let pointer = match self.publish_pending(pointer).await {
            Some(p) => p,
            None => return,
        };
        if let Pointer::Set { revision, epoch } = pointer
            && self.applied != Some(epoch)
            && self.failed.as_ref().map(|(e, _)| *e) != Some(epoch)
        {
            self.apply(&revision, epoch).await;
        }
        if self
            .status_written
            .is_none_or(|t| t.elapsed() >= STATUS_REFRESH)
        {
            self.write_status().await;
        }
    }

    /// Publishes the pending document if it should be; answers the pointer
    /// to act on, or None when the store stopped answering.
    async fn publish_pending(&mut self, pointer: Pointer) -> Option<Pointer> {
        let Some(p) = &self.pending else {
            return Some(pointer);
        };
        if p.only_if_unset && pointer != Pointer::Unset {
            if let Pointer::Set { revision, epoch } = &pointer
                && *revision != p.company.digest
            {
                info!(subsystem = "configplane", epoch, digest = %revision,
                    "the fleet already has an active revision; following it instead of the --company document");
            }
            self.pending = None;
            return Some(pointer);
        }
        match activate(&self.ctx.coord, &p.company, &p.document, &p.source).await {
            Ok(a) => {
                info!(subsystem = "configplane", epoch = a.epoch, digest = %a.digest,
                    source = %p.source, "company revision activated at start");
                if a.moved {
                    announce(
                        &self.ctx,
                        "config_activated",
                        a.epoch,
                        &a.digest,
                        &p.company,
                    )
                    .await;
                }
                self.pending = None;
                Some(Pointer::Set {
                    revision: a.digest,
                    epoch: a.epoch,
                })
            }
            Err(ConfigError::Unavailable(e)) => {
                warn!(subsystem = "configplane", error = %e, "cannot activate yet; will retry");
                None
            }
            Err(e) => {
                error!(subsystem = "configplane", error = %e, source = %p.source,
                    "could not activate the document; following the pointer");
                if !matches!(e, ConfigError::Contended(_)) {
                    self.pending = None;
                }
                Some(pointer)
            }
        }
    }

    async fn apply(&mut self, digest: &str, epoch: u64) {
        let fetched = match fetch(&self.ctx.coord, digest, epoch).await {
            Ok(f) => f,
            Err(ConfigError::Unavailable(e)) => {
                warn!(subsystem = "configplane", error = %e, epoch,
                    "cannot read the revision yet; keeping the company this node serves");
                return;
            }
            Err(e) => {
                error!(subsystem = "configplane", error = %e, epoch,
                    "cannot apply the active revision; keeping the company this node serves");
                self.failed = Some((epoch, e.to_string()));
                self.write_status().await;
                return;
            }
        };
        let company = Arc::new(fetched.company);
        self.ctx.active.set(Some(Active {
            epoch,
            company: company.clone(),
        }));
        self.ctx.state.set_applied(epoch, company.clone());
        self.applied = Some(epoch);
        self.failed = None;
        info!(subsystem = "configplane", epoch, digest, org = %company.org,
            seats = company.seats.len(), "company revision applied");

        let store = self.ctx.store.clone();
        let (digest_owned, source) = (digest.to_owned(), fetched.source);
        let document = fetched.document;
        let recorded = tokio::task::spawn_blocking(move || {
            store.record_applied(epoch, &digest_owned, &document, source.as_deref())
        })
        .await;
        match recorded {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(subsystem = "configplane", error = %e, epoch,
                "applied, but the node store did not record it"),
            Err(e) => warn!(subsystem = "configplane", error = %e, epoch,
                "applied, but the node store writer failed"),
        }
        self.write_status().await;
        announce(&self.ctx, "config_applied", epoch, digest, &company).await;
    }

    async fn write_status(&mut self) {
        let status = json!({
            "applied_epoch": self.applied,
            "digest": self.ctx.active.current().filter(|a| a.epoch > 0).map(|a| a.company.digest.clone()),
            "failed_epoch": self.failed.as_ref().map(|(e, _)| *e),
            "error": self.failed.as_ref().map(|(_, why)| why.clone()),
            "at_ms": now_ms(),
        });
        match self
            .ctx
            .coord
            .publish_status(&self.ctx.node_id, &status)
            .await
        {
            Ok(()) => self.status_written = Some(Instant::now()),
            Err(e) => {
                warn!(subsystem = "configplane", error = %e, "could not write this node's status")
            }
        }
    }
}

/// What to publish at start: an offline import held in the node store, else
/// the `--company` document (only onto an unset pointer).
async fn pending_at_start(ctx: &EngineContext) -> Option<Pending> {
    let store = ctx.store.clone();
    match tokio::task::spawn_blocking(move || store.active_revision()).await {
        Ok(Ok(Some(rev))) if rev.is_pending() => match Company::parse(&rev.document) {
            Ok(company) => {
                return Some(Pending {
                    company,
                    document: rev.document,
                    source: rev
                        .source
                        .unwrap_or_else(|| "crewlet config import (offline)".into()),
                    only_if_unset: false,
                });
            }
            Err(e) => error!(subsystem = "configplane", error = %e,
                "the offline import in the node store does not validate; not publishing it"),
        },
        Ok(Ok(_)) => {}
        Ok(Err(e)) => warn!(subsystem = "configplane", error = %e,
            "cannot read the node store's active revision"),
        Err(e) => warn!(subsystem = "configplane", error = %e, "node store reader failed"),
    }
    let file = ctx.state.company.as_ref()?;
    let document = match std::fs::read_to_string(&file.path) {
        Ok(d) => d,
        Err(e) => {
            warn!(subsystem = "configplane", error = %e, file = %file.path.display(),
                "cannot re-read the --company document; not seeding the pointer with it");
            return None;
        }
    };
    if Company::parse(&document).map(|c| c.digest).ok() != Some(file.company.digest.clone()) {
        warn!(subsystem = "configplane", file = %file.path.display(),
            "the --company document changed since start; not seeding the pointer with it");
        return None;
    }
    Some(Pending {
        company: file.company.clone(),
        document,
        source: format!("--company {} on node {}", file.path.display(), ctx.node_id),
        only_if_unset: true,
    })
}

/// Starts the config reconciler: one poll now (so a node that comes up
/// ready already serves the fleet's revision when the pointer answers),
/// then one every [`POLL_INTERVAL`].
pub async fn start(ctx: &EngineContext, started: &mut Started) -> Result<(), String> {
    let mut rec = Reconciler {
        ctx: ctx.clone(),
        pending: pending_at_start(ctx).await,
        applied: None,
        failed: None,
        status_written: None,
        pointer_down: false,
    };
    rec.tick().await;
    let (stop_tx, mut stop_rx) = watch::channel(());
    let task = tokio::spawn(
        async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(POLL_INTERVAL) => {}
                    // A send or a dropped sender: either way, stop.
                    _ = stop_rx.changed() => break,
                }
                rec.tick().await;
            }
        }
        .instrument(info_span!("configplane", subsystem = "configplane")),
    );
    started.push("configplane", move || {
        Box::pin(async move {
            let _ = stop_tx.send(());
            let _ = task.await;
        })
    });
    Ok(())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

// ---- `crewlet config import` ------------------------------------------------------

/// The API a running node listens on by default.
pub const DEFAULT_API: &str = "http://127.0.0.1:7420";

/// Why `crewlet config import` did not import.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{file}: cannot read the company document: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {source}")]
    Invalid {
        file: String,
        #[source]
        source: crewlet_company::Invalid,
    },
    #[error(
        "--api {0}: not a plain http://HOST:PORT address; pass the node's HTTP listener, e.g. {DEFAULT_API}"
    )]
    BadApi(String),
    #[error(
        "cannot reach the node at {api}: {source}; start the node, or pass --data-dir to import into a stopped node's store"
    )]
    Unreachable {
        api: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the node at {api} answered {status}: {body}")]
    Refused {
        api: String,
        status: u16,
        body: String,
    },
    #[error("--data-dir {0}: no such directory; pass the data dir the node runs with")]
    NoDataDir(String),
    #[error(transparent)]
    Lock(crewlet_stream::LockError),
    #[error(transparent)]
    Store(#[from] crewlet_store::StoreError),
}

impl ImportError {
    /// The process exit status: 2 for a document refused, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            ImportError::Invalid { .. } => 2,
            ImportError::Refused { status: 400, .. } => 2,
            _ => 1,
        }
    }
}

/// `crewlet config import FILE`: through a running node's `PUT /config`;
/// with `data_dir` and no node holding it, marks the revision active in the
/// node store so the next start publishes it. Answers what was done.
pub fn import(file: &Path, api: &str, data_dir: Option<&PathBuf>) -> Result<String, ImportError> {
    let label = file.display().to_string();
    let document = std::fs::read_to_string(file).map_err(|source| ImportError::Read {
        file: label.clone(),
        source,
    })?;
    let company = Company::parse(&document).map_err(|source| ImportError::Invalid {
        file: label.clone(),
        source,
    })?;
    if let Some(dir) = data_dir {
        if !dir.is_dir() {
            return Err(ImportError::NoDataDir(dir.display().to_string()));
        }
        let owner = format!("crewlet config import {label}");
        match crewlet_stream::DirLock::acquire(dir, ".crewlet-node.lock", "data dir", &owner) {
            Ok(_lock) => {
                let store = crewlet_store::Store::open_in(dir)?;
                let revision = store.import_pending(&company.digest, &document, Some(&owner))?;
                return Ok(format!(
                    "no node is running on {}: marked revision {} (digest {}) active in its node store (local revision {revision}); the node activates it through the config pointer when it starts",
                    dir.display(),
                    company.org,
                    company.digest
                ));
            }
            Err(crewlet_stream::LockError::Held { .. }) => {}
            Err(e) => return Err(ImportError::Lock(e)),
        }
    }
    let (status, body) = http_put(api, "/config", document.as_bytes())?;
    if !(200..300).contains(&status) {
        return Err(ImportError::Refused {
            api: api.to_owned(),
            status,
            body,
        });
    }
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    Ok(format!(
        "activated {} through {api}: epoch {}, digest {}",
        company.org, answer["epoch"], company.digest
    ))
}

/// A plain HTTP/1.1 PUT; answers (status, body).
fn http_put(api: &str, path: &str, body: &[u8]) -> Result<(u16, String), ImportError> {
    use std::io::{Read, Write};
    let rest = api
        .strip_prefix("http://")
        .ok_or_else(|| ImportError::BadApi(api.to_owned()))?;
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() {
        return Err(ImportError::BadApi(api.to_owned()));
    }
    let addr = if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let unreachable = |source| ImportError::Unreachable {
        api: api.to_owned(),
        source,
    };
    let mut stream = std::net::TcpStream::connect(&addr).map_err(unreachable)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(unreachable)?;
    let head = format!(
        "PUT {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nContent-Type: application/toml\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).map_err(unreachable)?;
    stream.write_all(body).map_err(unreachable)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(unreachable)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            unreachable(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the answer has no HTTP status line",
            ))
        })?;
    Ok((status, body.to_owned()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crewlet_coord::bucket::Retentions;
    use crewlet_coord::{Coord, CoordOptions, Faulty, Kv, MemoryKv, Owner, Pointer, SystemClock};

    use super::*;

    const EXAMPLE: &str = include_str!("../../../examples/company.toml");

    fn doc(org: &str) -> (String, Company) {
        let text = EXAMPLE.replace("name = \"Acme Robotics\"", &format!("name = \"{org}\""));
        let company = Company::parse(&text).unwrap();
        (text, company)
    }

    fn coord() -> (Arc<Faulty>, Coord) {
        let ret = Retentions {
            lease_ttl: Duration::from_secs(45),
            status: Duration::from_secs(60),
            rate: Duration::from_secs(60),
        };
        let kv: Arc<dyn Kv> = Arc::new(MemoryKv::new(Arc::new(SystemClock), &ret));
        let faulty = Faulty::new(kv);
        let as_kv: Arc<dyn Kv> = faulty.clone();
        let opts = CoordOptions::new(Owner::incarnation("test"));
        (faulty, Coord::with_backends(as_kv.clone(), as_kv, opts))
    }

    #[tokio::test]
    async fn activations_are_ordered_and_a_repeat_moves_nothing() {
        let (_f, c) = coord();
        let (a_text, a) = doc("A");
        let (b_text, b) = doc("B");
        let first = activate(&c, &a, &a_text, "t").await.unwrap();
        assert!(first.moved);
        let second = activate(&c, &b, &b_text, "t").await.unwrap();
        assert!(second.moved && second.epoch > first.epoch, "{second:?}");
        let repeat = activate(&c, &b, &b_text, "t").await.unwrap();
        assert_eq!((repeat.epoch, repeat.moved), (second.epoch, false));
        assert_eq!(
            c.active_config().await.unwrap(),
            Pointer::Set {
                revision: b.digest.clone(),
                epoch: second.epoch
            }
        );
        // What the pointer names is readable back, validated.
        let f = fetch(&c, &b.digest, second.epoch).await.unwrap();
        assert_eq!(f.document, b_text);
        assert_eq!(f.company.org, "B");
    }

    #[tokio::test]
    async fn a_revision_without_its_document_is_missing_not_empty() {
        let (_f, c) = coord();
        let err = fetch(&c, "0".repeat(64).as_str(), 3).await.err().unwrap();
        assert!(
            matches!(err, ConfigError::Missing { epoch: 3, .. }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn an_unreachable_store_is_unavailable_and_moves_nothing() {
        let (f, c) = coord();
        let (a_text, a) = doc("A");
        let first = activate(&c, &a, &a_text, "t").await.unwrap();
        f.break_store();
        let (b_text, b) = doc("B");
        let err = activate(&c, &b, &b_text, "t").await.err().unwrap();
        assert!(matches!(err, ConfigError::Unavailable(_)), "{err}");
        let err = fetch(&c, &a.digest, first.epoch).await.err().unwrap();
        assert!(matches!(err, ConfigError::Unavailable(_)), "{err}");
        f.heal();
        assert_eq!(
            c.active_config().await.unwrap(),
            Pointer::Set {
                revision: a.digest,
                epoch: first.epoch
            }
        );
    }
}
