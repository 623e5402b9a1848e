//! The reconciler: every node polls the pointer every [`POLL_INTERVAL`],
//! and at once when a node says it moved it
//! ([`crewlet_bus::CONFIG_ACTIVATED_SUBJECT`], so a raised budget cap
//! reaches parked work in milliseconds, not a poll later),
//! publishes what it holds pending (an offline import, else the
//! `--company` document onto an unset pointer), applies the epoch the
//! pointer names into the node's [`crewlet_company::ActiveCompany`] — the one
//! owner of the applied epoch — records it in the node store, picks its
//! posture and keeps its status fresh in the status bucket.
//!
//! Started with [`start`], stopped with [`Running::stop`]: the loop ends
//! between polls, never inside one.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crewlet_company::{Active, ActiveCompany, Company, Invalid};
use crewlet_coord::{ConfigPointer, Pointer};
use crewlet_observe::Publisher;
use crewlet_os::ConfigEpoch;
use crewlet_store::Store;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, error, info, info_span, warn};

use crate::activation::{ConfigError, activate, announce, fetch};
use crate::posture::{PeersSeen, PointerSeen, Posture, PostureReport, Seen, decide};

/// How often every node reads the pointer.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);
/// How often a node re-writes its status while nothing changes (the status
/// bucket forgets a node that said nothing for about a minute).
pub const STATUS_REFRESH: Duration = Duration::from_secs(15);

/// Where the node shows its posture (`/health`, `/ready`, presence).
pub trait Postures: Send + Sync + 'static {
    /// Sets the posture; answers whether it changed.
    fn set_posture(&self, report: PostureReport) -> bool;
    /// The posture now.
    fn posture(&self) -> Posture;
}

/// How this node accepts a document: parsed, and checked against its own
/// allow-list (the same rule as `--company` and `PUT /config`).
pub trait Accept: Send + Sync + 'static {
    fn accept(&self, document: &str) -> Result<Company, Invalid>;
}

impl<F> Accept for F
where
    F: Fn(&str) -> Result<Company, Invalid> + Send + Sync + 'static,
{
    fn accept(&self, document: &str) -> Result<Company, Invalid> {
        self(document)
    }
}

/// The `--company` document the node was started with.
#[derive(Debug, Clone)]
pub struct Seed {
    pub path: PathBuf,
    pub company: Company,
    /// `--activate-company`: published whatever the pointer names, not
    /// only onto an unset pointer.
    pub activate: bool,
}

/// What the reconciler runs with.
pub struct Parts {
    pub node_id: String,
    pub pointer: ConfigPointer,
    /// The node store: the applied revision is recorded there, and an
    /// offline import waits there.
    pub store: Arc<Store>,
    pub publisher: Publisher,
    /// The one owner of the applied epoch.
    pub active: ActiveCompany,
    pub postures: Arc<dyn Postures>,
    pub accept: Arc<dyn Accept>,
    pub seed: Option<Seed>,
    /// The node's NATS client, to hear a peer's "pointer moved" hint
    /// ([`crewlet_bus::CONFIG_ACTIVATED_SUBJECT`]); `None`: the poll only.
    pub client: Option<async_nats::Client>,
}

/// A document this node publishes through the pointer once it can.
struct Pending {
    company: Company,
    document: String,
    source: String,
    /// `--company`: only seeds an unset pointer. An offline import: always.
    only_if_unset: bool,
}

/// A failure to apply one epoch: since when, and why.
struct Failing {
    epoch: ConfigEpoch,
    since: Instant,
    why: String,
}

struct Reconciler {
    ctx: Parts,
    pending: Option<Pending>,
    /// The epoch this node could not apply (retried every poll; logged once).
    failed: Option<Failing>,
    /// The pointer epoch this node is behind, and since when.
    behind: Option<(ConfigEpoch, Instant)>,
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
    /// The epoch this node serves, as its [`crewlet_company::ActiveCompany`] says.
    fn applied(&self) -> Option<ConfigEpoch> {
        self.ctx.active.applied_epoch()
    }

    /// One poll: publish what is pending, apply what the pointer names,
    /// keep this node's status fresh.
    async fn tick(&mut self) {
        let seen = self.poll().await;
        let pointer_down = matches!(seen, PointerSeen::Unreadable(_));
        let peers = match seen {
            PointerSeen::Set(epoch) if self.applied() != Some(epoch) => self.peers(epoch).await,
            _ => PeersSeen::Unknown,
        };
        let now = Instant::now();
        let behind_for = match (&seen, self.behind) {
            (PointerSeen::Set(epoch), _) if self.applied() == Some(*epoch) => {
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
            applied: self.applied(),
            behind_for,
            failing,
            peers,
        });
        let posture = report.posture;
        let reason = report.reason.clone();
        if self.ctx.postures.set_posture(report) {
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
        let pointer = match self.ctx.pointer.active_config().await {
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
                if self.applied() != Some(epoch)
                    && let Applied::Unreadable(why) = self.apply(&revision, epoch).await
                {
                    return PointerSeen::Unreadable(why);
                }
                PointerSeen::Set(epoch)
            }
        }
    }

    /// What the peers' statuses say about `epoch` (unknown if unreadable).
    async fn peers(&self, epoch: ConfigEpoch) -> PeersSeen {
        match self.ctx.pointer.statuses().await {
            Ok(all) => {
                let peers: Vec<_> = all
                    .iter()
                    .filter(|(id, _)| **id != self.ctx.node_id)
                    .collect();
                let with_epoch = peers
                    .iter()
                    .filter(|(_, s)| s["applied_epoch"].as_u64() == Some(epoch.get()))
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
                warn!(subsystem = "configplane", epoch = epoch.get(), active = %revision, file = %p.company.digest,
                    source = %p.source,
                    "the fleet serves another revision than the --company document, and this node follows the fleet; `crewlet config import` the file to activate it (GET /config shows what is active)");
            }
            self.pending = None;
            return Some(pointer);
        }
        match activate(&self.ctx.pointer, &p.company, &p.document, &p.source).await {
            Ok(a) => {
                info!(subsystem = "configplane", epoch = a.epoch.get(), digest = %a.digest,
                    source = %p.source, "company revision activated at start");
                if a.moved {
                    announce(
                        &self.ctx.publisher,
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

    async fn apply(&mut self, digest: &str, epoch: ConfigEpoch) -> Applied {
        let fetched = match fetch(&self.ctx.pointer, digest, epoch).await {
            Ok(f) => f,
            Err(ConfigError::Unavailable(e)) => {
                warn!(subsystem = "configplane", error = %e, epoch = epoch.get(),
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
                    error!(subsystem = "configplane", error = %e, epoch = epoch.get(),
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
        self.failed = None;
        info!(subsystem = "configplane", epoch = epoch.get(), digest, org = %company.org,
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
            Ok(Err(e)) => warn!(subsystem = "configplane", error = %e, epoch = epoch.get(),
                "applied, but the node store did not record it"),
            Err(e) => warn!(subsystem = "configplane", error = %e, epoch = epoch.get(),
                "applied, but the node store writer failed"),
        }
        self.write_status().await;
        announce(
            &self.ctx.publisher,
            "config_applied",
            epoch,
            digest,
            &company,
        )
        .await;
        Applied::Done
    }

    async fn write_status(&mut self) {
        let status = json!({
            "applied_epoch": self.applied(),
            "digest": self.ctx.active.current().filter(|a| a.applied_epoch().is_some()).map(|a| a.company.digest.clone()),
            "failed_epoch": self.failed.as_ref().map(|f| f.epoch),
            "error": self.failed.as_ref().map(|f| f.why.clone()),
            "posture": self.ctx.postures.posture().as_str(),
            "at_ms": crewlet_os::now_ms(),
        });
        match self
            .ctx
            .pointer
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
async fn pending_at_start(ctx: &Parts) -> Option<Pending> {
    let store = ctx.store.clone();
    match tokio::task::spawn_blocking(move || store.active_revision()).await {
        Ok(Ok(Some(rev))) if rev.is_pending() => match ctx.accept.accept(&rev.document) {
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
    let file = ctx.seed.as_ref()?;
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
        only_if_unset: !file.activate,
    })
}

/// The reconciler, polling until stopped.
pub struct Running {
    stop: watch::Sender<()>,
    task: JoinHandle<()>,
}

impl Running {
    /// Stops the loop between polls and waits for it.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Starts the config reconciler: one poll now (so a node that comes up
/// ready already serves the fleet's revision when the pointer answers),
/// then one every [`POLL_INTERVAL`].
pub async fn start(parts: Parts) -> Running {
    let pending = pending_at_start(&parts).await;
    let mut rec = Reconciler {
        ctx: parts,
        pending,
        failed: None,
        behind: None,
        status_written: None,
        pointer_down: false,
    };
    rec.tick().await;
    let mut moved = match &rec.ctx.client {
        Some(client) => match client
            .subscribe(crewlet_bus::CONFIG_ACTIVATED_SUBJECT)
            .await
        {
            Ok(s) => Some(s),
            Err(e) => {
                warn!(subsystem = "configplane", error = %e,
                    "cannot hear the fleet's config activations; applying on the poll only");
                None
            }
        },
        None => None,
    };
    let (stop, mut stop_rx) = watch::channel(());
    let task = tokio::spawn(
        async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(POLL_INTERVAL) => {}
                    said = next_hint(&mut moved) => {
                        info!(subsystem = "configplane", epoch = %said, "a node moved the config pointer; polling it now");
                    }
                    // A send or a dropped sender: either way, stop.
                    _ = stop_rx.changed() => break,
                }
                rec.tick().await;
            }
        }
        .instrument(info_span!("configplane", subsystem = "configplane")),
    );
    Running { stop, task }
}

/// The next "pointer moved" hint (its epoch as sent); never without a
/// subscription, or once it ends.
async fn next_hint(moved: &mut Option<async_nats::Subscriber>) -> String {
    use futures::StreamExt;
    if let Some(sub) = moved {
        match sub.next().await {
            Some(m) => return String::from_utf8_lossy(&m.payload).into_owned(),
            None => *moved = None,
        }
    }
    std::future::pending().await
}
