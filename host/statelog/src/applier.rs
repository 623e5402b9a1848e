//! The applier: one per domain on every data node, applying the log in its
//! one order into the estate.
//!
//! Rule: a batch of records, the operation ledger's new ids and this node's
//! position (the batch's last record's) commit in one transaction, so a
//! node killed at any instant restarts at a position whose rows are all
//! there and none twice. The reader decodes the next batch while one
//! commits on a blocking thread (one commit at a time, in log order), so a
//! slow commit makes the next batch bigger rather than the reader wait
//! (the commit is the largest part of an apply: BENCHMARKS.md). Before
//! a batch is applied the stream's identity and end are read again: a log
//! recreated or restored underneath the node stops the domain for good
//! (recorded in `statelog_diverged`, so a restart stays stopped), because
//! applying another history on top of these rows is a fork nobody sees.
//! The reader also decodes each record into the domain's change, so the
//! committer only writes; a record this build cannot decode is kept in
//! `statelog_ops_lost` and stepped over, nothing of it written.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::OrderedConfig;
use futures::{FutureExt, StreamExt};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::domain::Domain;
use crate::estate::{Cursor, Estate};
use crate::local::{Diverged, Local};
use crate::positions::PositionBook;
use crate::record::{BARRIER_KIND, Record};
use crate::snapshot::Adopter;
use crate::{EstateError, ensure_stream};

mod batch;
mod judge;

use batch::{Arrived, apply, arrive};
use judge::{fix_for, judge, judge_checkpoint, judge_standing};

/// How often a running applier reads the stream's identity and the record
/// at its checkpoint while the log is quiet, and at most how often it
/// publishes its position.
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// The most records one transaction applies.
const BATCH: usize = 8192;

/// What the node needs to run one domain's applier.
pub struct ApplierParts {
    pub js: jetstream::Context,
    pub estate: Arc<Estate>,
    pub local: Arc<Local>,
    pub domain: Arc<dyn Domain>,
    /// Where this node's position is published and the trim's floor read
    /// (`None` in a test of the applier alone).
    pub book: Option<PositionBook>,
    /// Fetches a peer's snapshot when this node is behind the trim.
    pub adopter: Option<Adopter>,
    pub node: String,
    pub replicas: usize,
}

/// Where one domain's applier stands, for `/health`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DomainStatus {
    pub domain: String,
    pub position: u64,
    /// Records this build could not decode, kept in `statelog_ops_lost`.
    pub ops_lost: u64,
    #[serde(flatten)]
    pub state: DomainState,
}

/// The applier's state.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum DomainState {
    Starting,
    Applying,
    /// Below the trim: waiting for (or refused) a peer's snapshot.
    Behind {
        floor: u64,
        detail: String,
    },
    /// An operator evicted this node: it applies nothing and publishes no
    /// position until readmitted (`fix` names the command).
    Evicted {
        eviction: crate::Eviction,
        fix: String,
    },
    /// Stopped for good until an operator acts (`fix` says how).
    Diverged {
        finding: Diverged,
        fix: String,
    },
    /// The broker or the estate did not answer; retried.
    Unavailable {
        reason: String,
    },
}

enum PassEnd {
    Diverged(Diverged),
    Evicted(crate::Eviction),
    Behind { floor: u64 },
    Unavailable(String),
}

impl From<EstateError> for PassEnd {
    fn from(e: EstateError) -> PassEnd {
        PassEnd::Unavailable(e.to_string())
    }
}

/// Why a linearizable read could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum BarrierError {
    #[error(transparent)]
    Publish(#[from] crate::PublishError),
    #[error(
        "the applier did not pass position {wanted} within {within:?} (it is at {at}, {state}); retry, or see /health"
    )]
    Late {
        wanted: u64,
        at: u64,
        within: Duration,
        state: String,
    },
}

/// A running applier.
pub struct Applier {
    status: watch::Receiver<DomainStatus>,
    stop: watch::Sender<bool>,
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
    js: jetstream::Context,
    prefix: &'static str,
}

impl Applier {
    /// Starts applying `parts.domain`'s log.
    pub fn start(parts: ApplierParts) -> Applier {
        let position = parts
            .estate
            .cursor(parts.domain.name())
            .map(|c| c.position)
            .unwrap_or(0);
        let ops_lost = parts.estate.ops_lost(parts.domain.name()).unwrap_or(0);
        let (tx, rx) = watch::channel(DomainStatus {
            domain: parts.domain.name().to_owned(),
            position,
            ops_lost,
            state: DomainState::Starting,
        });
        let (stop, stopped) = watch::channel(false);
        let js = parts.js.clone();
        let prefix = parts.domain.prefix();
        let task = tokio::spawn(run(parts, tx, stopped));
        Applier {
            status: rx,
            stop,
            task: std::sync::Mutex::new(Some(task)),
            js,
            prefix,
        }
    }

    pub fn status(&self) -> DomainStatus {
        self.status.borrow().clone()
    }

    pub fn watch(&self) -> watch::Receiver<DomainStatus> {
        self.status.clone()
    }

    /// A linearizable read's first half: appends a barrier record to the
    /// domain's barrier subject and waits until this node's applier has
    /// passed it, so a read of the estate after it sees every write the
    /// log acknowledged before it. Answers the barrier's position.
    pub async fn barrier(&self, within: Duration) -> Result<u64, BarrierError> {
        let subject = crewlet_bus::barrier_subject(self.prefix);
        let wanted = crate::append(
            &self.js,
            &subject,
            &Record::new(BARRIER_KIND, serde_json::Value::Null),
        )
        .await?;
        let mut rx = self.status.clone();
        let waited = tokio::time::timeout(within, rx.wait_for(|s| s.position >= wanted)).await;
        match waited {
            Ok(Ok(_)) => Ok(wanted),
            _ => {
                let s = self.status();
                Err(BarrierError::Late {
                    wanted,
                    at: s.position,
                    within,
                    state: serde_json::to_string(&s.state).unwrap_or_default(),
                })
            }
        }
    }

    /// Stops the applier and waits for it (a batch being committed
    /// finishes: it is one transaction either way).
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let task = self
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

async fn run(
    parts: ApplierParts,
    status: watch::Sender<DomainStatus>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(200);
    // The batch committing, owned here so that neither a stop nor the next
    // pass starts before it has landed.
    let mut committing = None;
    loop {
        if *stopped.borrow() {
            return;
        }
        let end = tokio::select! {
            end = pass(&parts, &status, &mut committing) => Some(end),
            _ = stopped.changed() => None,
        };
        if let Some(task) = committing.take() {
            let _ = task.await;
        }
        let Some(end) = end else { return };
        let name = parts.domain.name();
        match end {
            PassEnd::Diverged(finding) => {
                if let Err(e) = parts.local.record_diverged(&finding) {
                    tracing::error!(subsystem = "statelog", domain = name, error = %e, "cannot record the divergence; it is found again at the next start");
                }
                tracing::error!(subsystem = "statelog", domain = name, found = %finding.found, "log diverged from the estate; applier stopped");
                let fix = fix_for(&finding);
                status.send_modify(|s| s.state = DomainState::Diverged { finding, fix });
                let _ = stopped.wait_for(|s| *s).await;
                return;
            }
            PassEnd::Evicted(eviction) => {
                tracing::warn!(subsystem = "statelog", domain = name, by = %eviction.by, reason = %eviction.reason,
                    "this node was evicted from the state log; applying nothing until an operator readmits it");
                let fix = format!(
                    "an operator evicted this node ({}); it applies nothing until readmitted: `crewlet estate readmit {}` (or POST /estate/readmit), after which it adopts a peer's snapshot if the log was trimmed past it",
                    eviction.reason, parts.node
                );
                status.send_modify(|s| s.state = DomainState::Evicted { eviction, fix });
            }
            PassEnd::Behind { floor } => {
                let detail = match &parts.adopter {
                    None => "no snapshot source on this node".to_owned(),
                    Some(adopter) => match adopter.adopt(&parts.estate, &parts.local, name).await {
                        Ok(positions) => {
                            status.send_modify(|s| s.position = positions.of(name));
                            backoff = Duration::from_millis(200);
                            continue;
                        }
                        Err(e) => e.to_string(),
                    },
                };
                tracing::warn!(subsystem = "statelog", domain = name, floor, %detail, "behind the log's trim");
                status.send_modify(|s| s.state = DomainState::Behind { floor, detail });
            }
            PassEnd::Unavailable(reason) => {
                tracing::warn!(subsystem = "statelog", domain = name, %reason, "applier waiting");
                status.send_modify(|s| s.state = DomainState::Unavailable { reason });
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stopped.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// A batch's commit on a blocking thread: the new cursor and how many
/// records were kept undecoded.
type Committing = JoinHandle<Result<(Cursor, u64), EstateError>>;

async fn pass(
    parts: &ApplierParts,
    status: &watch::Sender<DomainStatus>,
    committing: &mut Option<Committing>,
) -> PassEnd {
    match pass_inner(parts, status, committing).await {
        Ok(never) => match never {},
        Err(end) => end,
    }
}

enum Never {}

async fn pass_inner(
    parts: &ApplierParts,
    status: &watch::Sender<DomainStatus>,
    committing: &mut Option<Committing>,
) -> Result<Never, PassEnd> {
    let name = parts.domain.name();
    if let Some(d) = parts.local.diverged(name)? {
        return Err(PassEnd::Diverged(d));
    }
    let mut stream = ensure_stream(&parts.js, parts.domain.as_ref(), parts.replicas)
        .await
        .map_err(|e| PassEnd::Unavailable(e.to_string()))?;
    let info = stream
        .info()
        .await
        .map_err(|e| PassEnd::Unavailable(format!("stream info: {e}")))?
        .clone();
    let mut cursor = parts.estate.cursor(name)?;
    judge(parts, &info, cursor)?;
    judge_checkpoint(parts, &stream, cursor).await?;
    judge_standing(parts).await?;
    if let Some(book) = &parts.book {
        let floor = book
            .floor(name)
            .await
            .map_err(|e| PassEnd::Unavailable(format!("the trim's floor is unknown: {e}")))?;
        if cursor.position < floor {
            return Err(PassEnd::Behind { floor });
        }
    }
    let first = info.state.first_sequence;
    if !parts.domain.compacted() && first > cursor.position + 1 && info.state.last_sequence >= first
    {
        return Err(PassEnd::Behind { floor: first - 1 });
    }
    let consumer = stream
        .create_consumer(OrderedConfig {
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: cursor.position + 1,
            },
            ..Default::default()
        })
        .await
        .map_err(|e| PassEnd::Unavailable(format!("cannot read the log: {e}")))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| PassEnd::Unavailable(format!("cannot read the log: {e}")))?;
    status.send_modify(|s| {
        s.position = cursor.position;
        s.state = DomainState::Applying;
    });
    let mut published: Option<(u64, Instant)> = None;
    let mut tick = tokio::time::interval(CHECK_EVERY);
    let mut last_age_out: Option<Instant> = None;
    // The reader's own delivery count: it restarts at 1 whenever the
    // ordered reader is made again (a gap, a lost heartbeat, a stream
    // deleted underneath).
    let mut delivered = 0u64;
    // The records that arrived (decoded) while a batch commits on a
    // blocking thread are the next batch: reading and decoding overlap the
    // commit, and a slow commit makes the next batch bigger rather than the
    // reader wait.
    let mut next: Vec<Arrived> = Vec::new();
    loop {
        publish_position(parts, cursor.position, &mut published).await;
        if committing.is_none() && !next.is_empty() {
            let age_out = last_age_out.is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
            if age_out {
                last_age_out = Some(Instant::now());
            }
            let (estate, domain, batch) = (
                parts.estate.clone(),
                parts.domain.clone(),
                std::mem::take(&mut next),
            );
            *committing = Some(tokio::task::spawn_blocking(move || {
                apply(&estate, domain.as_ref(), cursor, &batch, age_out)
            }));
        }
        tokio::select! {
            biased;
            done = async { committing.as_mut().expect("guarded").await }, if committing.is_some() => {
                *committing = None;
                cursor = settle(done, status)?;
            }
            m = messages.next(), if next.len() < BATCH => {
                // What else the reader holds already is taken too, without
                // waiting, straight into the next batch (no chunk buffer:
                // `ready_chunks` reserved a whole batch's room per read).
                let domain = parts.domain.as_ref();
                let mut reset = arrive(domain, m, &mut delivered, &mut next)?;
                while next.len() < BATCH {
                    let Some(m) = messages.next().now_or_never() else { break };
                    reset |= arrive(domain, m, &mut delivered, &mut next)?;
                }
                // The reader was made again (its delivery count restarted):
                // the stream may be another one now. Its identity is read
                // after the records arrived, so one of a recreated stream —
                // delivered after that stream was made — shows the new
                // identity here; it is judged once the batch committing
                // has landed, against the position that batch reached.
                if reset {
                    if let Some(task) = committing.take() {
                        cursor = settle(task.await, status)?;
                    }
                    let info = stream
                        .info()
                        .await
                        .map_err(|e| PassEnd::Unavailable(format!("stream info: {e}")))?
                        .clone();
                    judge(parts, &info, cursor)?;
                }
            }
            _ = tick.tick() => {
                let info = stream.info().await
                    .map_err(|e| PassEnd::Unavailable(format!("stream info: {e}")))?.clone();
                judge(parts, &info, cursor)?;
                judge_checkpoint(parts, &stream, cursor).await?;
                judge_standing(parts).await?;
            }
        }
    }
}

/// The end of a batch's commit: its new cursor, told to `/health`.
fn settle(
    done: Result<Result<(Cursor, u64), EstateError>, tokio::task::JoinError>,
    status: &watch::Sender<DomainStatus>,
) -> Result<Cursor, PassEnd> {
    let (cursor, lost) =
        done.map_err(|e| PassEnd::Unavailable(format!("the apply task failed: {e}")))??;
    status.send_modify(|s| {
        s.position = cursor.position;
        s.ops_lost += lost;
    });
    Ok(cursor)
}

async fn publish_position(
    parts: &ApplierParts,
    position: u64,
    published: &mut Option<(u64, Instant)>,
) {
    let Some(book) = &parts.book else { return };
    let due = match published {
        None => true,
        Some((p, at)) => *p != position && at.elapsed() >= CHECK_EVERY / 2,
    };
    if !due {
        return;
    }
    match book
        .publish(parts.domain.name(), &parts.node, position)
        .await
    {
        Ok(()) => *published = Some((position, Instant::now())),
        Err(e) => {
            tracing::warn!(subsystem = "statelog", domain = parts.domain.name(), error = %e, "position not published; retried")
        }
    }
}
