//! The config plane: one company, agreed by pointer.
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
//! - Postures ([`decide`]): after every poll the reconciler picks one from
//!   what it sees of the pointer and of its peers' statuses, shows it on
//!   `/health`, carries it on the presence lease and writes it with its
//!   status. `serve`: applied the pointer's epoch (or nothing is activated).
//!   `isolated`: the pointer (or the revision it names) cannot be read —
//!   keep serving the last applied epoch. Behind the pointer: `shed` when a
//!   peer has applied the epoch and this node has been behind for
//!   [`SHED_GRACE`]; else `stuck` when this node has failed to apply the
//!   revision (missing, malformed or refused document) for [`STUCK_AFTER`];
//!   else `wait`. Lag alone never sheds (a peer must have the epoch *and*
//!   the grace must pass: every rollout has lag, and shedding on it would
//!   make the first node to apply the cause of an outage), and a node with
//!   no peer ahead of it waits rather than sheds (stepping out when nobody
//!   has the epoch is stopping, not shedding). An unreadable peer listing
//!   is unknown, never "no peer", and so never sheds either. `/ready` fails
//!   on shed and stuck only; a shedding node stops consuming
//!   `notify-inbound`.
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
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use crewlet_company::{Active, Company};
use crewlet_coord::{Answer, Bucket, Coord, CoordError, Pointer};
use serde_json::json;
use tokio::sync::watch;
use tracing::{Instrument, error, info, info_span, warn};

use crate::engine::{EngineContext, Late, Started};
use crate::state::{Posture, PostureReport};

/// How often every node reads the pointer.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);
/// How often a node re-writes its status while nothing changes (the status
/// bucket forgets a node that said nothing for about a minute).
pub const STATUS_REFRESH: Duration = Duration::from_secs(15);
/// How long a node behind the pointer, while a peer has applied its epoch,
/// waits before it sheds: five polls — a healthy node applies within one,
/// so only a node that cannot apply gets here.
pub const SHED_GRACE: Duration = Duration::from_secs(10);
/// How long a node may fail to apply the pointer's revision (its document
/// missing, malformed or refused by this build) before it is stuck: five
/// polls, enough for a document written just after its pointer to land.
pub const STUCK_AFTER: Duration = Duration::from_secs(10);
/// Largest company document `PUT /config` accepts.
pub const MAX_DOCUMENT_BYTES: usize = 512 * 1024;
/// Seconds a refused caller is told to wait.
const RETRY_AFTER_SECONDS: u64 = 2;
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
        "stored_ms": crewlet_os::now_ms(),
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
    crewlet_api::retry_later(RETRY_AFTER_SECONDS, error, detail)
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
    let company = match crate::company::accept(document, &crate::company::policy(&ctx.config)) {
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

// ---- postures ---------------------------------------------------------------------

/// What the reconciler could see of the pointer on one poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PointerSeen {
    /// Neither the pointer nor the revision it names could be read.
    Unreadable(String),
    Unset,
    Set(u64),
}

/// What the reconciler could see of its peers' statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeersSeen {
    /// Not read (this node is not behind) or unreadable: unknown.
    Unknown,
    /// How many peers report having applied the pointer's epoch.
    Known { with_epoch: usize, others: usize },
}

/// Everything a posture is picked from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub pointer: PointerSeen,
    pub applied: Option<u64>,
    /// How long this node has been behind the pointer's epoch.
    pub behind_for: Duration,
    /// How long this node has failed to apply it, and why (if it has).
    pub failing: Option<(Duration, String)>,
    pub peers: PeersSeen,
}

/// Picks the posture (the rules are in the module docs).
pub fn decide(seen: &Seen) -> PostureReport {
    let report = |posture, reason: String, epoch| PostureReport {
        posture,
        reason,
        pointer_epoch: epoch,
    };
    let applied = match seen.applied {
        Some(e) => format!("epoch {e}"),
        None => "the company it started with".to_owned(),
    };
    let epoch = match &seen.pointer {
        PointerSeen::Unreadable(why) => {
            return report(
                Posture::Isolated,
                format!("the config pointer cannot be read ({why}); serving {applied}"),
                None,
            );
        }
        PointerSeen::Unset => {
            return report(
                Posture::Serve,
                "no company revision is activated; serving the company this node started with"
                    .into(),
                None,
            );
        }
        PointerSeen::Set(epoch) => *epoch,
    };
    if seen.applied == Some(epoch) {
        return report(
            Posture::Serve,
            format!("applied epoch {epoch}"),
            Some(epoch),
        );
    }
    if let PeersSeen::Known { with_epoch, .. } = seen.peers
        && with_epoch > 0
        && seen.behind_for >= SHED_GRACE
    {
        return report(
            Posture::Shed,
            format!(
                "behind epoch {epoch} for {}s while {with_epoch} peer(s) serve it; serving {applied}, taking no triggers",
                seen.behind_for.as_secs()
            ),
            Some(epoch),
        );
    }
    if let Some((failing_for, why)) = &seen.failing {
        if *failing_for >= STUCK_AFTER {
            return report(
                Posture::Stuck,
                format!(
                    "cannot apply epoch {epoch} for {}s: {why}",
                    failing_for.as_secs()
                ),
                Some(epoch),
            );
        }
        return report(
            Posture::Wait,
            format!("cannot apply epoch {epoch} yet: {why}; serving {applied}"),
            Some(epoch),
        );
    }
    report(
        Posture::Wait,
        format!("applying epoch {epoch}; serving {applied}"),
        Some(epoch),
    )
}

/// A failure to apply one epoch: since when, and why.
struct Failing {
    epoch: u64,
    since: Instant,
    why: String,
}

struct Reconciler {
    ctx: EngineContext,
    pending: Option<Pending>,
    applied: Option<u64>,
    /// The epoch this node could not apply (retried every poll; logged once).
    failed: Option<Failing>,
    /// The pointer epoch this node is behind, and since when.
    behind: Option<(u64, Instant)>,
    status_written: Option<Instant>,
    pointer_down: bool,
}

/// How one attempt to apply an epoch ended.
enum Applied {
    Done,
    /// The store could not answer: unknown, not a failure of the document.
    Unreadable(String),
    Failed,
}

impl Reconciler {
    /// One poll: publish what is pending, apply what the pointer names,
    /// keep this node's status fresh.
    async fn tick(&mut self) {
        let seen = self.poll().await;
        let pointer_down = matches!(seen, PointerSeen::Unreadable(_));
        let peers = match seen {
            PointerSeen::Set(epoch) if self.applied != Some(epoch) => self.peers(epoch).await,
            _ => PeersSeen::Unknown,
        };
        let now = Instant::now();
        let behind_for = match (&seen, self.behind) {
            (PointerSeen::Set(epoch), _) if self.applied == Some(*epoch) => {
                self.behind = None;
                Duration::ZERO
            }
            (PointerSeen::Set(epoch), Some((e, since))) if e == *epoch => now - since,
            (PointerSeen::Set(epoch), _) => {
                self.behind = Some((*epoch, now));
                Duration::ZERO
            }
            // Unset or unreadable: keep what was known about being behind.
            (_, Some((_, since))) => now - since,
            (_, None) => Duration::ZERO,
        };
        let failing = match (&seen, &self.failed) {
            (PointerSeen::Set(epoch), Some(f)) if f.epoch == *epoch => {
                Some((now - f.since, f.why.clone()))
            }
            _ => None,
        };
        let report = decide(&Seen {
            pointer: seen,
            applied: self.applied,
            behind_for,
            failing,
            peers,
        });
        let posture = report.posture;
        let reason = report.reason.clone();
        if self.ctx.state.set_posture(report) {
            if posture == Posture::Serve {
                info!(subsystem = "configplane", posture = posture.as_str(), %reason, "config posture");
            } else {
                warn!(subsystem = "configplane", posture = posture.as_str(), %reason, "config posture");
            }
            if !pointer_down {
                self.write_status().await;
            }
        }
        if !pointer_down
            && self
                .status_written
                .is_none_or(|t| t.elapsed() >= STATUS_REFRESH)
        {
            self.write_status().await;
        }
    }

    /// Reads the pointer, publishes what is pending, applies what the
    /// pointer names; answers what it saw.
    async fn poll(&mut self) -> PointerSeen {
        let pointer = match self.ctx.coord.active_config().await {
            Ok(p) => p,
            Err(e) => {
                if !self.pointer_down {
                    warn!(subsystem = "configplane", error = %e,
                        "config pointer unreadable; keeping the company this node serves");
                }
                self.pointer_down = true;
                return PointerSeen::Unreadable(e.to_string());
            }
        };
        if std::mem::take(&mut self.pointer_down) {
            info!(subsystem = "configplane", "config pointer readable again");
        }
        let pointer = match self.publish_pending(pointer).await {
            Some(p) => p,
            None => {
                return PointerSeen::Unreadable(
                    "the pending document could not be activated".into(),
                );
            }
        };
        match pointer {
            Pointer::Unset => PointerSeen::Unset,
            Pointer::Set { revision, epoch } => {
                if self.applied != Some(epoch)
                    && let Applied::Unreadable(why) = self.apply(&revision, epoch).await
                {
                    return PointerSeen::Unreadable(why);
                }
                PointerSeen::Set(epoch)
            }
        }
    }

    /// What the peers' statuses say about `epoch` (unknown if unreadable).
    async fn peers(&self, epoch: u64) -> PeersSeen {
        match self.ctx.coord.statuses().await {
            Ok(all) => {
                let peers: Vec<_> = all
                    .iter()
                    .filter(|(id, _)| **id != self.ctx.node_id)
                    .collect();
                let with_epoch = peers
                    .iter()
                    .filter(|(_, s)| s["applied_epoch"].as_u64() == Some(epoch))
                    .count();
                PeersSeen::Known {
                    with_epoch,
                    others: peers.len() - with_epoch,
                }
            }
            Err(e) => {
                warn!(subsystem = "configplane", error = %e, "peer statuses unreadable; not shedding on them");
                PeersSeen::Unknown
            }
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
                warn!(subsystem = "configplane", epoch, active = %revision, file = %p.company.digest,
                    source = %p.source,
                    "the fleet serves another revision than the --company document, and this node follows the fleet; `crewlet config import` the file to activate it (GET /config shows what is active)");
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

    async fn apply(&mut self, digest: &str, epoch: u64) -> Applied {
        let fetched = match fetch(&self.ctx.coord, digest, epoch).await {
            Ok(f) => f,
            Err(ConfigError::Unavailable(e)) => {
                warn!(subsystem = "configplane", error = %e, epoch,
                    "cannot read the revision yet; keeping the company this node serves");
                return Applied::Unreadable(e.to_string());
            }
            Err(e) => {
                let why = e.to_string();
                let repeat = self
                    .failed
                    .as_ref()
                    .is_some_and(|f| f.epoch == epoch && f.why == why);
                if !repeat {
                    error!(subsystem = "configplane", error = %e, epoch,
                        "cannot apply the active revision; keeping the company this node serves");
                    let since = match &self.failed {
                        Some(f) if f.epoch == epoch => f.since,
                        _ => Instant::now(),
                    };
                    self.failed = Some(Failing { epoch, since, why });
                    self.write_status().await;
                }
                return Applied::Failed;
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
        Applied::Done
    }

    async fn write_status(&mut self) {
        let status = json!({
            "applied_epoch": self.applied,
            "digest": self.ctx.active.current().filter(|a| a.epoch > 0).map(|a| a.company.digest.clone()),
            "failed_epoch": self.failed.as_ref().map(|f| f.epoch),
            "error": self.failed.as_ref().map(|f| f.why.clone()),
            "posture": self.ctx.state.posture().as_str(),
            "at_ms": crewlet_os::now_ms(),
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
        Ok(Ok(Some(rev))) if rev.is_pending() => {
            match crate::company::accept(&rev.document, &crate::company::policy(&ctx.config)) {
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
            }
        }
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
        behind: None,
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

// ---- `crewlet config import` ------------------------------------------------------

/// The API a running node listens on by default.
pub const DEFAULT_API: &str = crate::client::DEFAULT_API;

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
///
/// A document is checked against the allow-list of the node that will run
/// it: the running node's own (its `PUT /config` refuses), or for a stopped
/// node the `[mcp]` of `node_config` (the file that node starts with).
pub fn import(
    file: &Path,
    api: &str,
    data_dir: Option<&PathBuf>,
    node_config: &crewlet_config::NodeConfig,
) -> Result<String, ImportError> {
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
                let policy = crate::company::policy(node_config);
                crate::company::accept(&document, &policy).map_err(|source| {
                    ImportError::Invalid {
                        file: label.clone(),
                        source,
                    }
                })?;
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
    let (status, body) = http_request(api, "PUT", "/config", document.as_bytes())?;
    if status == 400
        && let Some(invalid) = refused_document(&body)
    {
        return Err(ImportError::Invalid {
            file: label,
            source: invalid,
        });
    }
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

/// The errors of a `PUT /config` 400, as the document's own refusal.
fn refused_document(body: &str) -> Option<crewlet_company::Invalid> {
    #[derive(serde::Deserialize)]
    struct Refusal {
        errors: Vec<crewlet_company::DocError>,
    }
    let r: Refusal = serde_json::from_str(body).ok()?;
    (!r.errors.is_empty()).then_some(crewlet_company::Invalid { errors: r.errors })
}

/// A request to a running node's API (see [`crate::client`]), with the
/// import's errors (which name the `--data-dir` way out).
pub(crate) fn http_request(
    api: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(u16, String), ImportError> {
    crate::client::request(api, method, path, &[], body).map_err(|e| match e {
        crate::client::ClientError::BadApi(api) => ImportError::BadApi(api),
        crate::client::ClientError::Unreachable { api, source } => {
            ImportError::Unreachable { api, source }
        }
    })
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

    fn seen(pointer: PointerSeen, applied: Option<u64>) -> Seen {
        Seen {
            pointer,
            applied,
            behind_for: Duration::ZERO,
            failing: None,
            peers: PeersSeen::Unknown,
        }
    }

    #[test]
    fn postures_follow_the_rules() {
        use crate::state::Posture::*;
        let p = |s: &Seen| decide(s).posture;
        assert_eq!(p(&seen(PointerSeen::Set(7), Some(7))), Serve);
        assert_eq!(p(&seen(PointerSeen::Unset, None)), Serve);
        assert_eq!(
            p(&seen(PointerSeen::Unreadable("down".into()), Some(7))),
            Isolated
        );
        // Behind: waits while applying, however long, if no peer is ahead.
        let mut s = seen(PointerSeen::Set(8), Some(7));
        assert_eq!(p(&s), Wait);
        s.behind_for = Duration::from_secs(3600);
        s.peers = PeersSeen::Known {
            with_epoch: 0,
            others: 2,
        };
        assert_eq!(p(&s), Wait, "nobody has the epoch: not shedding");
        s.peers = PeersSeen::Unknown;
        assert_eq!(p(&s), Wait, "unknown peers are not peers ahead");
        // Lag alone never sheds: a peer ahead but within the grace.
        s.peers = PeersSeen::Known {
            with_epoch: 1,
            others: 0,
        };
        s.behind_for = SHED_GRACE - Duration::from_millis(1);
        assert_eq!(p(&s), Wait);
        s.behind_for = SHED_GRACE;
        assert_eq!(p(&s), Shed);
        // Failing to apply: wait, then stuck (unless a peer has it: shed).
        let mut s = seen(PointerSeen::Set(8), Some(7));
        s.failing = Some((Duration::from_secs(1), "refused".into()));
        assert_eq!(p(&s), Wait);
        s.failing = Some((STUCK_AFTER, "refused".into()));
        let r = decide(&s);
        assert_eq!((r.posture, r.pointer_epoch), (Stuck, Some(8)));
        assert!(r.reason.contains("refused"), "{}", r.reason);
        s.behind_for = SHED_GRACE;
        s.peers = PeersSeen::Known {
            with_epoch: 2,
            others: 0,
        };
        assert_eq!(p(&s), Shed);
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
