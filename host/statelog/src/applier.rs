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
use rusqlite::params;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::domain::{Change, Domain, Writes};
use crate::estate::{Cursor, Estate};
use crate::local::{Diverged, Local};
use crate::positions::PositionBook;
use crate::record::{BARRIER_KIND, Incoming, Record, Undecodable, op_floor};
use crate::snapshot::Adopter;
use crate::{EstateError, ensure_stream};

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

fn fix_for(d: &Diverged) -> String {
    format!(
        "the log {} no longer matches this node's estate, so nothing more is applied to domain `{}`. \
         If the broker was restored by mistake, restore the copy these rows came from and restart this node. \
         To take the log as it now stands instead: stop this node, delete replicated.sqlite3 and \
         statelog-local.sqlite3 from its data dir, and start it — it rebuilds from the log or a peer's snapshot",
        d.stream, d.domain
    )
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

fn identity(info: &jetstream::stream::Info) -> String {
    info.created.unix_timestamp_nanos().to_string()
}

/// Judges the stream against this node's cursor: answers a divergence, if
/// any, and records the identity seen.
fn judge(
    parts: &ApplierParts,
    info: &jetstream::stream::Info,
    cursor: Cursor,
) -> Result<(), PassEnd> {
    let stream = parts.domain.stream();
    let now = identity(info);
    let finding = |found: String| {
        PassEnd::Diverged(Diverged {
            domain: parts.domain.name().to_owned(),
            stream: stream.to_owned(),
            position: cursor.position,
            found,
            found_ms: crewlet_os::now_ms(),
        })
    };
    match parts.local.identity(stream)? {
        Some(seen) if seen != now && cursor.position > 0 => {
            return Err(finding(format!(
                "stream {stream} was recreated underneath this node (created {seen} then, {now} now)"
            )));
        }
        Some(seen) if seen == now => {}
        _ => parts.local.see_identity(stream, &now)?,
    }
    if info.state.last_sequence < cursor.position {
        return Err(finding(format!(
            "stream {stream} ends at {}, below this node's position {} (restored from an older copy?)",
            info.state.last_sequence, cursor.position
        )));
    }
    Ok(())
}

/// An operator's eviction of this node ends the pass: a node evicted must
/// neither apply nor publish a position until it is readmitted.
async fn judge_standing(parts: &ApplierParts) -> Result<(), PassEnd> {
    let Some(book) = &parts.book else {
        return Ok(());
    };
    match book.eviction_of(&parts.node).await {
        Ok(None) => Ok(()),
        Ok(Some(e)) => Err(PassEnd::Evicted(e)),
        Err(e) => Err(PassEnd::Unavailable(format!(
            "whether this node is evicted is unknown: {e}"
        ))),
    }
}

/// Reads the record at the cursor: another record there is a divergence.
async fn judge_checkpoint(
    parts: &ApplierParts,
    stream: &jetstream::stream::Stream,
    cursor: Cursor,
) -> Result<(), PassEnd> {
    if cursor.position == 0 || cursor.record_ns == 0 {
        return Ok(());
    }
    // A record compacted or trimmed away cannot be compared; one there
    // must be the one applied.
    if let Ok(m) = stream.get_raw_message(cursor.position).await {
        let ns = m.time.unix_timestamp_nanos() as i64;
        if ns != cursor.record_ns {
            return Err(PassEnd::Diverged(Diverged {
                domain: parts.domain.name().to_owned(),
                stream: parts.domain.stream().to_owned(),
                position: cursor.position,
                found: format!(
                    "another record sits at position {} (broker instant {ns} ns, this node applied one of {} ns)",
                    cursor.position, cursor.record_ns
                ),
                found_ms: crewlet_os::now_ms(),
            }));
        }
    }
    Ok(())
}

/// A record as it arrived, decoded on the reader's side. Only a record
/// kept undecoded holds on to its message's bytes: the rest are freed on
/// the reader's thread, where they were made.
struct Arrived {
    seq: u64,
    ns: i64,
    read: Read,
}

/// What a record is, as the reader decoded it.
enum Read {
    Barrier,
    Change {
        op: uuid::Uuid,
        change: Box<dyn Change>,
    },
    Undecodable {
        why: Undecodable,
        subject: async_nats::Subject,
        payload: bytes::Bytes,
    },
}

impl Read {
    fn of(domain: &dyn Domain, m: &async_nats::Message) -> Read {
        let undecodable = |why| Read::Undecodable {
            why,
            subject: m.subject.clone(),
            payload: m.payload.clone(),
        };
        let record = match Incoming::decode(m.payload.clone()) {
            Ok(r) => r,
            Err(u) => return undecodable(u),
        };
        if record.kind == BARRIER_KIND {
            return Read::Barrier;
        }
        match domain.decode(&record) {
            Ok(change) => Read::Change {
                op: record.op,
                change,
            },
            Err(u) => undecodable(u),
        }
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

/// Takes one message off the log into `next`; answers whether the reader
/// was made again before it (its delivery count restarted).
fn arrive<E: std::fmt::Display>(
    domain: &dyn Domain,
    m: Option<Result<jetstream::Message, E>>,
    delivered: &mut u64,
    next: &mut Vec<Arrived>,
) -> Result<bool, PassEnd> {
    let Some(m) = m else {
        return Err(PassEnd::Unavailable("the log's reader ended".into()));
    };
    let m = m.map_err(|e| PassEnd::Unavailable(format!("reading the log: {e}")))?;
    let info = m
        .info()
        .map_err(|e| PassEnd::Unavailable(format!("a message without its position: {e}")))?;
    let reset = info.consumer_sequence != *delivered + 1;
    *delivered = info.consumer_sequence;
    next.push(Arrived {
        seq: info.stream_sequence,
        ns: info.published.unix_timestamp_nanos() as i64,
        read: Read::of(domain, &m),
    });
    Ok(reset)
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

static LEDGER: &str = "INSERT OR IGNORE INTO statelog_ops (domain, op_id, position, applied_ms)
 VALUES (?1, ?2, ?3, ?4)";
static KEEP_LOST: &str =
    "INSERT OR IGNORE INTO statelog_ops_lost (domain, position, subject, reason, record)
 VALUES (?1, ?2, ?3, ?4, ?5)";

/// Applies one batch in one transaction; answers the new cursor and how
/// many records were kept undecoded.
fn apply(
    estate: &Estate,
    domain: &dyn Domain,
    cursor: Cursor,
    batch: &[Arrived],
    age_out: bool,
) -> Result<(Cursor, u64), EstateError> {
    let name = domain.name();
    let now = crewlet_os::now_ms();
    estate.write(|tx| {
        let mut at = cursor;
        let mut lost = 0;
        let mut w = Writes::new(tx);
        for a in batch {
            if a.seq <= at.position {
                continue;
            }
            match &a.read {
                Read::Undecodable {
                    why,
                    subject,
                    payload,
                } => {
                    w.statement(KEEP_LOST)?.execute(params![
                        name,
                        a.seq as i64,
                        subject.as_str(),
                        &why.0,
                        &payload[..]
                    ])?;
                    lost += 1;
                }
                Read::Barrier => {}
                Read::Change { op, change } => {
                    // The ledger row first: a retried operation's insert
                    // is ignored, and the record is stepped over.
                    let fresh = w.statement(LEDGER)?.execute(params![
                        name,
                        op.as_bytes().as_slice(),
                        a.seq as i64,
                        now
                    ])? == 1;
                    if fresh {
                        change.write(&mut w)?;
                    }
                }
            }
            at = Cursor {
                position: a.seq,
                record_ns: a.ns,
            };
        }
        drop(w);
        tx.execute(
            "INSERT OR REPLACE INTO statelog_cursor (domain, position, record_ns) VALUES (?1, ?2, ?3)",
            params![name, at.position as i64, at.record_ns],
        )?;
        if age_out {
            domain.age_out(tx, now)?;
            if let Some(age) = domain.max_age() {
                tx.execute(
                    "DELETE FROM statelog_ops WHERE domain = ?1 AND op_id < ?2",
                    params![
                        name,
                        op_floor(now - age.as_millis() as i64).as_bytes().as_slice()
                    ],
                )?;
            }
        }
        Ok((at, lost))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::Usage;

    #[test]
    fn the_ledger_ages_out_operations_made_before_the_horizon_by_their_ids() {
        let dir = tempfile::tempdir().unwrap();
        let estate = Estate::open_in(dir.path()).unwrap();
        let now = crewlet_os::now_ms();
        let day = 24 * 3600 * 1000;
        let horizon = Usage.max_age().unwrap().as_millis() as i64;
        // An id made just after `ms`: its floor with a later random part.
        let made_at = |ms: i64| {
            let mut id = *op_floor(ms).as_bytes();
            id[6..].copy_from_slice(&[0x7a, 0xbc, 0x8d, 0xef, 1, 2, 3, 4, 5, 6]);
            id.to_vec()
        };
        let (old, kept) = (made_at(now - horizon - day), made_at(now - horizon + day));
        estate
            .write(|tx| {
                for (op, position) in [(&old, 1), (&kept, 2)] {
                    tx.execute(
                        "INSERT INTO statelog_ops (domain, op_id, position, applied_ms) VALUES ('usage', ?1, ?2, 0)",
                        params![op, position],
                    )?;
                }
                Ok(())
            })
            .unwrap();
        let barrier = Arrived {
            seq: 3,
            ns: 1,
            read: Read::Barrier,
        };
        let (at, lost) = apply(&estate, &Usage, Cursor::default(), &[barrier], true).unwrap();
        assert_eq!((at.position, lost), (3, 0));
        let ops: Vec<Vec<u8>> = estate
            .reader()
            .unwrap()
            .prepare("SELECT op_id FROM statelog_ops ORDER BY position")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(ops, [kept]);
    }
}
