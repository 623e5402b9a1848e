//! The changelog: rows a node wrote, carried to the stream off the turn's
//! path.
//!
//! Rule: a row is offered after it is in the node's store; the offer checks
//! the row against the stream's limit at once ([`MemoryError::TooLarge`]
//! comes back to the writer, the local row kept) and queues it; one task
//! publishes queued rows in the order offered, each waiting for the
//! stream's ack, so a later write of a key never lands under an earlier
//! one. A publish that fails is tried again a few times, then given up with
//! a warning: the row stays local and its key's next write carries the
//! whole row again. [`Changelog::close`] publishes what is queued, bounded,
//! before the node lets its connection go.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::warn;

use crate::{Encoded, Memory, MemoryError, Table};

/// Tries of one row before it is given up.
const TRIES: u32 = 4;
/// The wait after the first failed try; doubled after each.
const FIRST_RETRY: Duration = Duration::from_millis(200);

enum Outgoing {
    Row(Encoded),
    Close(oneshot::Sender<()>),
}

/// The node's memory changelog: cheap to clone, shared by every writer.
#[derive(Clone)]
pub struct Changelog {
    memory: Memory,
    tx: mpsc::UnboundedSender<Outgoing>,
}

impl Changelog {
    /// Starts the task that publishes offered rows.
    pub fn start(memory: Memory) -> (Changelog, JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(carry(memory.clone(), rx));
        (Changelog { memory, tx }, task)
    }

    /// The memory stream this changelog writes.
    pub fn memory(&self) -> &Memory {
        &self.memory
    }

    /// Queues `row` (already in the node's store) for the stream.
    pub fn offer<T: Table>(&self, row: &T::Row) -> Result<(), MemoryError> {
        let encoded = self.memory.encode::<T>(row)?;
        self.tx
            .send(Outgoing::Row(encoded))
            .map_err(|_| MemoryError::Closed)
    }

    /// Publishes what is queued (waiting at most `within`) and stops the
    /// task; later offers answer [`MemoryError::Closed`].
    pub async fn close(&self, within: Duration) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Outgoing::Close(done)).is_err() {
            return;
        }
        if tokio::time::timeout(within, wait).await.is_err() {
            warn!(
                subsystem = "memory",
                ?within,
                "the memory changelog did not empty in time; the rows left stay in this node's store only"
            );
        }
    }
}

async fn carry(memory: Memory, mut rx: mpsc::UnboundedReceiver<Outgoing>) {
    while let Some(next) = rx.recv().await {
        match next {
            Outgoing::Row(row) => send(&memory, &row).await,
            Outgoing::Close(done) => {
                rx.close();
                while let Some(Outgoing::Row(row)) = rx.recv().await {
                    send(&memory, &row).await;
                }
                let _ = done.send(());
                return;
            }
        }
    }
}

async fn send(memory: &Memory, row: &Encoded) {
    let mut wait = FIRST_RETRY;
    for tried in 1..=TRIES {
        match memory.send(row).await {
            Ok(()) => return,
            Err(e) if tried == TRIES => {
                warn!(subsystem = "memory", seat = %row.seat, table = row.table, error = %e, tries = TRIES,
                    "memory row given up");
            }
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
        }
    }
}
