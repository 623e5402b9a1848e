//! The replay: one seat's rows, every table, in one pass.
//!
//! Rule: one ordered push consumer over `crewlet.memory.HANDLE.>`
//! (last per subject, instant replay, no acks): one request makes it and
//! the server pushes every row back to back under flow control. Direct gets
//! would cost a round trip per row (async-nats 0.51 has no batched get) and
//! a pull consumer a round trip per batch. Before the pass the stream
//! leader is asked for the seat's newest sequence (a seat with none needs
//! no pass): a consumer placed on a replica that lags the leader can end
//! its pass short of a row the previous holder just wrote, so a pass that
//! did not reach it is run again, and a pass that never does is
//! [`MemoryError::Unreadable`] — unknown, never "nothing to remember".

use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{self, push};
use async_nats::jetstream::stream::{self, LastRawMessageErrorKind};
use crewlet_bus::{MEMORY_STREAM, memory_filter};
use futures::StreamExt;
use tracing::warn;

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::{Memory, MemoryError};

/// How long the pass may go without a row before it counts as stalled.
const QUIET: Duration = Duration::from_secs(5);
/// Passes run before a lagging replica counts as unreadable.
const PASSES: usize = 3;
/// The wait before a pass that ended short is run again.
const CATCH_UP: Duration = Duration::from_millis(100);
/// Rows of one table written to the store in one transaction.
const BATCH: usize = 512;

/// What one hydration did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hydrated {
    /// Rows the pass delivered.
    pub rows: u64,
    /// Rows written to this node's store.
    pub written: u64,
    /// Rows this node already had newer.
    pub kept_local: u64,
    /// Rows skipped for good: a table this build does not know, or bytes
    /// that are not a row of their table.
    pub skipped: u64,
    /// How long the pass and the writes took.
    pub took: Duration,
    /// The stream sequence the pass reached (0: the seat had no rows):
    /// where the live tail takes over ([`crate::Tail::live`]).
    pub reached: u64,
}

impl Memory {
    /// Replays every row of `seat` into this node's store.
    pub async fn hydrate(&self, seat: &str) -> Result<Hydrated, MemoryError> {
        if !crate::is_token(seat) {
            return Err(MemoryError::BadHandle { seat: seat.into() });
        }
        let started = Instant::now();
        let unreadable = |detail: String| MemoryError::Unreadable {
            seat: seat.into(),
            detail,
        };
        let stream = self
            .js
            .get_stream(MEMORY_STREAM)
            .await
            .map_err(|e| unreadable(e.to_string()))?;
        // Asked first: a seat the leader holds no row of (every seat of a
        // new company) is hydrated by that answer alone, with no consumer
        // made and deleted for it. A row written after it reaches the seat
        // through the tail, which watches from before the hydration.
        let mut newest = newest(&stream, seat).await?;
        let mut last = Hydrated {
            took: started.elapsed(),
            ..Hydrated::default()
        };
        if newest == 0 {
            return Ok(last);
        }
        for pass in 1..=PASSES {
            let (hydrated, reached) = self.pass(&stream, seat).await?;
            last = Hydrated {
                took: started.elapsed(),
                reached,
                ..hydrated
            };
            if reached >= newest {
                return Ok(last);
            }
            warn!(
                subsystem = "memory",
                seat,
                reached,
                newest,
                "the memory pass ended short of the stream leader's newest row (a lagging replica); reading again"
            );
            if pass < PASSES {
                tokio::time::sleep(CATCH_UP).await;
                newest = self::newest(&stream, seat).await?;
            }
        }
        Err(unreadable(format!(
            "{PASSES} passes ended short of the stream leader's newest row ({} rows read)",
            last.rows
        )))
    }

    /// One pass: every row delivered, applied in stream order; answers what
    /// it did and the newest stream sequence it delivered.
    async fn pass(
        &self,
        stream: &stream::Stream,
        seat: &str,
    ) -> Result<(Hydrated, u64), MemoryError> {
        let unreadable = |detail: String| MemoryError::Unreadable {
            seat: seat.into(),
            detail,
        };
        let filter = memory_filter(seat);
        let consumer = stream
            .create_consumer(push::OrderedConfig {
                deliver_subject: self.js.client().new_inbox(),
                filter_subject: filter.clone(),
                deliver_policy: consumer::DeliverPolicy::LastPerSubject,
                replay_policy: consumer::ReplayPolicy::Instant,
                ..Default::default()
            })
            .await
            .map_err(|e| unreadable(e.to_string()))?;
        let name = consumer.cached_info().name.clone();
        let mut pending = consumer.cached_info().num_pending;
        let result = async {
            let mut out = Hydrated::default();
            let mut reached = 0;
            let mut batches: BTreeMap<String, Vec<Bytes>> = BTreeMap::new();
            if pending == 0 {
                return Ok((out, reached));
            }
            let mut msgs = consumer
                .messages()
                .await
                .map_err(|e| unreadable(e.to_string()))?;
            let prefix = filter.trim_end_matches('>');
            while pending > 0 {
                let msg = match tokio::time::timeout(QUIET, msgs.next()).await {
                    Err(_) => {
                        return Err(unreadable(format!(
                            "the pass stalled for {QUIET:?} with {pending} rows to go"
                        )));
                    }
                    Ok(None) => return Err(unreadable("the pass ended early".into())),
                    Ok(Some(Err(e))) => return Err(unreadable(e.to_string())),
                    Ok(Some(Ok(m))) => m,
                };
                let info = msg.info().map_err(|e| unreadable(e.to_string()))?;
                (pending, reached) = (info.pending, info.stream_sequence);
                out.rows += 1;
                let table = msg
                    .subject
                    .strip_prefix(prefix)
                    .and_then(|rest| rest.split('.').next())
                    .unwrap_or_default()
                    .to_owned();
                if !self.tables.contains_key(table.as_str()) {
                    out.skipped += 1;
                    continue;
                }
                let batch = batches.entry(table).or_default();
                batch.push(msg.payload.clone());
                if batch.len() >= BATCH {
                    self.apply(seat, &mut batches, &mut out)?;
                }
            }
            self.apply(seat, &mut batches, &mut out)?;
            Ok((out, reached))
        }
        .await;
        // Not waited for: the server reaps it anyway once idle.
        let stream = stream.clone();
        tokio::spawn(async move {
            let _ = stream.delete_consumer(&name).await;
        });
        result
    }
}

impl Memory {
    /// Writes every batch held to its table, emptying them.
    fn apply(
        &self,
        seat: &str,
        batches: &mut BTreeMap<String, Vec<Bytes>>,
        out: &mut Hydrated,
    ) -> Result<(), MemoryError> {
        for (table, batch) in batches.iter_mut() {
            if batch.is_empty() {
                continue;
            }
            let Some(replay) = self.tables.get(table.as_str()) else {
                continue;
            };
            let done = replay
                .replay(batch)
                .map_err(|detail| MemoryError::StoreRefused {
                    seat: seat.into(),
                    table: table.clone(),
                    detail,
                })?;
            if !done.undecodable.is_empty() {
                warn!(subsystem = "memory", seat, table = %table, rows = done.skipped, first = ?done.undecodable,
                    "memory rows that are not rows of their table; skipped");
            }
            out.written += done.written;
            out.kept_local += done.kept_local;
            out.skipped += done.skipped;
            batch.clear();
        }
        Ok(())
    }
}

/// The stream leader's newest sequence among `seat`'s rows (0: none).
async fn newest(stream: &stream::Stream, seat: &str) -> Result<u64, MemoryError> {
    match stream
        .get_last_raw_message_by_subject(&memory_filter(seat))
        .await
    {
        Ok(m) => Ok(m.sequence),
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(0),
        Err(e) => Err(MemoryError::Unreadable {
            seat: seat.into(),
            detail: format!("the stream leader's newest row: {e}"),
        }),
    }
}
