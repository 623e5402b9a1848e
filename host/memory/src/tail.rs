//! The live tail: rows written elsewhere reach the node holding the seat
//! while it holds it, not only at its next hydration.
//!
//! Rule: one ordered push consumer per node over every memory subject,
//! from the moment the node starts; a row of a seat the node does not hold
//! is dropped here. Why one per node and not one per held seat: at 10,000
//! seats a consumer per seat is 10,000 consumers on the server, each with
//! its own heartbeat, flow control and state to recover after a restart,
//! while memory rows are few (a handful per turn), so carrying the fleet's
//! whole write rate to each node costs less than the server holding a
//! consumer for every seat; and a seat joins or leaves the tail with a map
//! entry, not a consumer request.
//!
//! Exactly once across hydration: a seat is watched *before* its
//! hydration starts, and rows the tail sees for it meanwhile are held;
//! when the hydration ends at stream sequence `R`, the held rows past `R`
//! are applied and the rest dropped (the pass already applied them); from
//! then on every row past `R` is applied as it comes, by the tables' own
//! newer-wins rule (the same as hydration's). A row the tail sees was
//! published after the watch began, so every row past `R` passes it. A row
//! this node published itself (its origin header) is in its store already
//! and is skipped.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::consumer::{self, push};
use bytes::Bytes;
use crewlet_bus::{MEMORY_STREAM, MEMORY_SUBJECTS};
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::{Memory, MemoryError};

/// The wait before a tail whose consumer went away is made again.
const REOPEN: Duration = Duration::from_secs(1);

enum Watch {
    /// Hydrating: rows seen, with their stream sequence, held.
    Held(Vec<(u64, String, Bytes)>),
    /// Hydrated up to this sequence: later rows applied as they come.
    Live(u64),
}

enum Command {
    Watch(String, oneshot::Sender<()>),
    Live(String, u64, oneshot::Sender<u64>),
    Forget(String),
}

/// The node's live tail of the memory stream: cheap to clone.
#[derive(Clone)]
pub struct Tail {
    tx: mpsc::UnboundedSender<Command>,
}

impl Tail {
    /// Starts tailing every memory row published from now on.
    pub async fn start(memory: Memory) -> Result<(Tail, JoinHandle<()>), MemoryError> {
        let messages = open(&memory, consumer::DeliverPolicy::New).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(memory, messages, rx));
        Ok((Tail { tx }, task))
    }

    /// Holds `seat`'s rows from now on, until [`Tail::live`]; call it
    /// before the seat's hydration starts.
    pub async fn watch(&self, seat: &str) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Command::Watch(seat.into(), done)).is_ok() {
            let _ = wait.await;
        }
    }

    /// `seat` is hydrated up to stream sequence `reached`: applies the
    /// held rows past it and every later row; answers how many held rows
    /// it applied.
    pub async fn live(&self, seat: &str, reached: u64) -> u64 {
        let (done, wait) = oneshot::channel();
        if self
            .tx
            .send(Command::Live(seat.into(), reached, done))
            .is_err()
        {
            return 0;
        }
        wait.await.unwrap_or(0)
    }

    /// Stops applying `seat`'s rows (the node let the seat go).
    pub fn forget(&self, seat: &str) {
        let _ = self.tx.send(Command::Forget(seat.into()));
    }
}

type Messages = push::Ordered;

async fn open(memory: &Memory, deliver: consumer::DeliverPolicy) -> Result<Messages, MemoryError> {
    let unopened = |e: String| MemoryError::Unopened { detail: e };
    let stream = memory
        .js
        .get_stream(MEMORY_STREAM)
        .await
        .map_err(|e| unopened(e.to_string()))?;
    let consumer = stream
        .create_consumer(push::OrderedConfig {
            deliver_subject: memory.js.client().new_inbox(),
            filter_subject: MEMORY_SUBJECTS.into(),
            deliver_policy: deliver,
            replay_policy: consumer::ReplayPolicy::Instant,
            ..Default::default()
        })
        .await
        .map_err(|e| unopened(e.to_string()))?;
    consumer
        .messages()
        .await
        .map_err(|e| unopened(e.to_string()))
}

async fn run(memory: Memory, mut messages: Messages, mut rx: mpsc::UnboundedReceiver<Command>) {
    let mut seats: HashMap<String, Watch> = HashMap::new();
    let mut position = 0u64;
    loop {
        tokio::select! {
            biased;
            command = rx.recv() => match command {
                None => return,
                Some(Command::Watch(seat, done)) => {
                    seats.insert(seat, Watch::Held(Vec::new()));
                    let _ = done.send(());
                }
                Some(Command::Live(seat, reached, done)) => {
                    let held = match seats.insert(seat.clone(), Watch::Live(reached)) {
                        Some(Watch::Held(rows)) => rows,
                        _ => Vec::new(),
                    };
                    let mut applied = 0;
                    for (seq, table, bytes) in held {
                        if seq > reached && apply(&memory, &seat, &table, bytes) {
                            applied += 1;
                        }
                    }
                    let _ = done.send(applied);
                }
                Some(Command::Forget(seat)) => {
                    seats.remove(&seat);
                }
            },
            next = messages.next() => match next {
                Some(Ok(msg)) => {
                    let Ok(info) = msg.info() else { continue };
                    position = info.stream_sequence;
                    let Some((seat, table)) = seat_and_table(&msg.subject) else { continue };
                    if published_here(&memory, &msg) {
                        continue;
                    }
                    match seats.get_mut(seat) {
                        Some(Watch::Held(rows)) => rows.push((position, table.into(), msg.payload.clone())),
                        Some(Watch::Live(reached)) if position > *reached => {
                            apply(&memory, seat, table, msg.payload.clone());
                        }
                        _ => {}
                    }
                }
                Some(Err(e)) => {
                    warn!(subsystem = "memory", error = %e, "the memory tail's consumer faltered; it recovers from where it was");
                }
                None => {
                    warn!(subsystem = "memory", position, "the memory tail's consumer ended; making it again from where it was");
                    messages = loop {
                        tokio::time::sleep(REOPEN).await;
                        let from = consumer::DeliverPolicy::ByStartSequence { start_sequence: position + 1 };
                        match open(&memory, from).await {
                            Ok(m) => break m,
                            Err(e) => warn!(subsystem = "memory", error = %e, "the memory tail cannot be made again yet"),
                        }
                    };
                }
            },
        }
    }
}

/// Whether this opening of the stream published `msg`: the row is in this
/// node's store already, and writing it again could put an older row of
/// the same stamp over a newer one.
fn published_here(memory: &Memory, msg: &async_nats::jetstream::Message) -> bool {
    msg.headers
        .as_ref()
        .and_then(|h| h.get(crate::ORIGIN_HEADER))
        .is_some_and(|o| o.as_str() == &*memory.origin)
}

/// `crewlet.memory.SEAT.TABLE.DIGEST` → (seat, table).
fn seat_and_table(subject: &str) -> Option<(&str, &str)> {
    let mut tokens = subject.strip_prefix("crewlet.memory.")?.split('.');
    Some((tokens.next()?, tokens.next()?))
}

/// Applies one row to its table; answers whether it was a row of a table
/// this node knows.
fn apply(memory: &Memory, seat: &str, table: &str, bytes: Bytes) -> bool {
    let Some(replay) = memory.tables.get(table) else {
        return false;
    };
    match replay.replay(&[bytes]) {
        Ok(done) => {
            if !done.undecodable.is_empty() {
                warn!(subsystem = "memory", seat, table, first = ?done.undecodable, "a live memory row that is not a row of its table; skipped");
            }
            debug!(
                subsystem = "memory",
                seat,
                table,
                written = done.written,
                "live memory row applied"
            );
            true
        }
        Err(e) => {
            warn!(subsystem = "memory", seat, table, error = %e,
                "this node's store refused a live memory row; the seat's next hydration brings it");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_names_its_seat_and_table() {
        assert_eq!(
            seat_and_table("crewlet.memory.ada.skills.00ff"),
            Some(("ada", "skills"))
        );
        assert_eq!(seat_and_table("crewlet.other.ada.skills"), None);
        assert_eq!(seat_and_table("crewlet.memory.ada"), None);
    }
}
