//! Custody, the data node's side: the keeper takes the event batches of
//! nodes without `data` off `CREWLET_CUSTODY`, writes each into this node's
//! event log, then claims it in the `custody` bucket; the winner keeps it,
//! any other writer deletes its copy.
//!
//! Rules, and why:
//! - **Write, then claim, then settle.** The rows and the batch's
//!   `custody_unsettled` row are one transaction; the claim comes after
//!   (a claimant that died before writing would hold a batch nobody has);
//!   the unsettled row goes once the bucket answered. The message is acked
//!   once the rows are written, so the stream forgets a batch only when a
//!   log holds it.
//! - **A crash between write and claim settles at the next pass**
//!   ([`Keeper::settle_pass`], at start and every [`SETTLE_EVERY`] while
//!   anything is unsettled): claimed now if nobody did, dropped if another
//!   node keeps it.
//! - **Unknown is not "lost".** A claim the store did not answer leaves the
//!   rows unsettled (kept, asked again), never deleted: deleting could leave
//!   a batch nobody keeps, and a copy too many is deduplicated by event id
//!   in every fleet read.
//! - **One fleet-wide durable** ([`CUSTODY_DURABLE`]), made by every node at
//!   start ([`ensure_durable`]): the stream keeps a batch only while a
//!   durable covers it (interest retention), so a stateless node must not
//!   publish before one exists, even with no data node up yet.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer};
use crewlet_bus::{CUSTODY_BATCHES, CUSTODY_DURABLE, CUSTODY_STREAM};
use crewlet_coord::{Answer, CoordError, Custody};
use crewlet_os::Stoppable;
use crewlet_store::{CustodyBatch, Settled, Store, StoreError};
use futures::StreamExt;
use serde::Serialize;
use tokio::sync::watch;
use tracing::{Instrument, debug, info, warn};

/// How often a keeper with unsettled batches asks the bucket again.
pub const SETTLE_EVERY: Duration = Duration::from_secs(5);
/// How long a taken batch may stay unacknowledged before the stream hands
/// it to another data node.
pub const ACK_WAIT: Duration = Duration::from_secs(30);
/// Batches one fetch takes at most.
const FETCH: usize = 16;
/// How long one fetch stands when the stream is empty.
const FETCH_EXPIRES: Duration = Duration::from_secs(2);
/// The wait before a failed fetch or a batch this node could not write is
/// tried again.
const RETRY_AFTER: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum CustodyError {
    #[error(
        "cannot open the custody durable {CUSTODY_DURABLE} on {CUSTODY_STREAM} ({0}); stateless nodes' events wait on the stream until it opens"
    )]
    Durable(String),
    #[error(
        "this node's event log refused custody batch {batch} ({source}); the batch stays on the stream for another try"
    )]
    Write {
        batch: String,
        #[source]
        source: StoreError,
    },
    #[error(
        "custody batch {batch} is written here but its keeper is unknown ({source}); its rows stay until the next settle pass"
    )]
    Unknown {
        batch: String,
        #[source]
        source: CoordError,
    },
    #[error("this node's event log could not settle custody batch {batch}: {source}")]
    Settle {
        batch: String,
        #[source]
        source: StoreError,
    },
}

/// What became of a batch this node wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// This node keeps it.
    Kept,
    /// `keeper` keeps it; this node deleted its `rows`.
    Dropped { keeper: String, rows: usize },
}

/// A settle pass's count.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SettleReport {
    pub kept: usize,
    pub dropped: usize,
    /// Still unsettled: the bucket did not answer, or the log failed.
    pub unknown: usize,
}

/// What the keeper did since it started, for `/health`.
#[derive(Debug, Default)]
pub struct KeeperStats {
    kept: AtomicU64,
    dropped: AtomicU64,
    unsettled: AtomicU64,
    failures: AtomicU64,
}

impl KeeperStats {
    pub fn view(&self) -> serde_json::Value {
        serde_json::json!({
            "batches_kept": self.kept.load(Ordering::Relaxed),
            "batches_dropped": self.dropped.load(Ordering::Relaxed),
            "unsettled": self.unsettled.load(Ordering::Relaxed),
            "failures": self.failures.load(Ordering::Relaxed),
        })
    }
}

/// A data node's custody keeper. Cheap to clone.
#[derive(Clone)]
pub struct Keeper {
    node_id: String,
    store: Arc<Store>,
    custody: Custody,
    stats: Arc<KeeperStats>,
}

impl Keeper {
    pub fn new(node_id: String, store: Arc<Store>, custody: Custody) -> Keeper {
        Keeper {
            node_id,
            store,
            custody,
            stats: Arc::default(),
        }
    }

    pub fn stats(&self) -> Arc<KeeperStats> {
        self.stats.clone()
    }

    /// Takes one batch: writes it into this node's log, then claims and
    /// settles it. `Err(Write)`: nothing is written, take it again later.
    /// `Err(Unknown)`: written, settled by a later pass.
    pub async fn take(&self, batch: &CustodyBatch) -> Result<Outcome, CustodyError> {
        let store = self.store.clone();
        let owned = batch.clone();
        let written = tokio::task::spawn_blocking(move || store.write_custody_batch(&owned))
            .await
            .expect("the custody write panicked");
        if let Err(source) = written {
            self.stats.failures.fetch_add(1, Ordering::Relaxed);
            return Err(CustodyError::Write {
                batch: batch.batch.clone(),
                source,
            });
        }
        self.settle(&batch.batch).await
    }

    /// Claims `batch` (written here) and settles it as the bucket answered.
    async fn settle(&self, batch: &str) -> Result<Outcome, CustodyError> {
        let kept = match self.custody.claim(batch, &self.node_id).await {
            Ok(Answer::Yes(())) => None,
            Ok(Answer::No(keeper)) => Some(keeper),
            Err(source) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                return Err(CustodyError::Unknown {
                    batch: batch.to_owned(),
                    source,
                });
            }
        };
        let store = self.store.clone();
        let id = batch.to_owned();
        let here = kept.is_none();
        let settled = tokio::task::spawn_blocking(move || store.settle_custody(&id, here))
            .await
            .expect("the custody settle panicked")
            .map_err(|source| CustodyError::Settle {
                batch: batch.to_owned(),
                source,
            })?;
        Ok(match (settled, kept) {
            (Settled::Dropped(rows), Some(keeper)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                debug!(subsystem = "custody", batch, %keeper, rows, "another data node keeps the batch; this copy is deleted");
                Outcome::Dropped { keeper, rows }
            }
            _ => {
                self.stats.kept.fetch_add(1, Ordering::Relaxed);
                Outcome::Kept
            }
        })
    }

    /// Settles every batch written here whose keeper is not known yet (a
    /// crash between write and claim, or a claim the store did not answer).
    pub async fn settle_pass(&self) -> SettleReport {
        let store = self.store.clone();
        let unsettled = match tokio::task::spawn_blocking(move || store.unsettled_custody())
            .await
            .expect("the custody read panicked")
        {
            Ok(rows) => rows,
            Err(e) => {
                warn!(subsystem = "custody", error = %e, "cannot read the unsettled custody batches; asked again at the next pass");
                return SettleReport {
                    unknown: 1,
                    ..SettleReport::default()
                };
            }
        };
        let mut report = SettleReport::default();
        for u in &unsettled {
            match self.settle(&u.batch).await {
                Ok(Outcome::Kept) => report.kept += 1,
                Ok(Outcome::Dropped { .. }) => report.dropped += 1,
                Err(e) => {
                    report.unknown += 1;
                    debug!(subsystem = "custody", error = %e, "a custody batch stays unsettled");
                }
            }
        }
        self.stats
            .unsettled
            .store(report.unknown as u64, Ordering::Relaxed);
        if report.kept + report.dropped > 0 {
            info!(
                subsystem = "custody",
                kept = report.kept,
                dropped = report.dropped,
                unknown = report.unknown,
                "settled custody batches written before"
            );
        }
        report
    }
}

/// Opens (or creates) the fleet's custody durable. Every node calls it at
/// start, before any event of its own is published (module docs).
pub async fn ensure_durable(
    js: &jetstream::Context,
) -> Result<consumer::PullConsumer, CustodyError> {
    let stream = js
        .get_stream(CUSTODY_STREAM)
        .await
        .map_err(|e| CustodyError::Durable(e.to_string()))?;
    stream
        .get_or_create_consumer(
            CUSTODY_DURABLE,
            consumer::pull::Config {
                durable_name: Some(CUSTODY_DURABLE.into()),
                filter_subject: CUSTODY_BATCHES.into(),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                description: Some(
                    "custody: each stateless node's event batch, kept by one data node".into(),
                ),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| CustodyError::Durable(e.to_string()))
}

/// Starts `keeper` on the fleet's custody durable: a settle pass first,
/// then batches taken as they come, unsettled ones asked again every
/// [`SETTLE_EVERY`].
/// Stop it with [`Stoppable::stop`].
pub fn start(keeper: Keeper, js: jetstream::Context) -> Stoppable {
    Stoppable::spawn(|stopped| run(keeper, js, stopped).in_current_span())
}

async fn run(keeper: Keeper, js: jetstream::Context, mut stop: watch::Receiver<bool>) {
    let mut pending = keeper.settle_pass().await.unknown;
    let mut consumer: Option<consumer::PullConsumer> = None;
    let mut last_settle = tokio::time::Instant::now();
    while !*stop.borrow() {
        if pending > 0 && last_settle.elapsed() >= SETTLE_EVERY {
            pending = keeper.settle_pass().await.unknown;
            last_settle = tokio::time::Instant::now();
        }
        let c = match &consumer {
            Some(c) => c.clone(),
            None => match ensure_durable(&js).await {
                Ok(c) => {
                    consumer = Some(c.clone());
                    c
                }
                Err(e) => {
                    warn!(subsystem = "custody", error = %e, "custody keeper waits");
                    wait(&mut stop, RETRY_AFTER).await;
                    continue;
                }
            },
        };
        let fetched = tokio::select! {
            f = c.fetch().max_messages(FETCH).expires(FETCH_EXPIRES).messages() => f,
            _ = stop.wait_for(|s| *s) => break,
        };
        let mut messages = match fetched {
            Ok(m) => m,
            Err(e) => {
                warn!(subsystem = "custody", error = %e, "custody fetch failed; trying again");
                consumer = None;
                wait(&mut stop, RETRY_AFTER).await;
                continue;
            }
        };
        // A fetch is bounded by FETCH_EXPIRES: the batches it took are
        // worked to the end (each acked or nakked) before stop is read.
        while let Some(next) = messages.next().await {
            let Ok(msg) = next else { break };
            let verdict = match serde_json::from_slice::<CustodyBatch>(&msg.payload) {
                Err(e) => {
                    warn!(subsystem = "custody", subject = %msg.subject, error = %e,
                        "a custody batch does not decode (a newer build's?); left on the stream for a node that can read it");
                    AckKind::Nak(Some(Duration::from_secs(60)))
                }
                Ok(batch) => match keeper.take(&batch).await {
                    Ok(_) => AckKind::Ack,
                    Err(e @ CustodyError::Unknown { .. }) => {
                        debug!(subsystem = "custody", error = %e, "written; settled later");
                        pending += 1;
                        AckKind::Ack
                    }
                    Err(e) => {
                        warn!(subsystem = "custody", error = %e, "custody batch not kept now");
                        AckKind::Nak(Some(RETRY_AFTER))
                    }
                },
            };
            if let Err(e) = msg.ack_with(verdict).await {
                debug!(subsystem = "custody", error = %e, "a custody ack was not sent; the batch comes back and is settled again");
            }
        }
    }
    debug!(subsystem = "custody", "custody keeper stopped");
}

async fn wait(stop: &mut watch::Receiver<bool>, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stop.wait_for(|s| *s) => {}
    }
}
