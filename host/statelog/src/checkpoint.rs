//! The estate's checkpoints, off the commit path.
//!
//! Rule: the applier's commit never runs a checkpoint. SQLite's automatic
//! checkpoint runs inside the commit that crosses its threshold, copying
//! the WAL into the file and syncing it — a few commits in every hundred
//! took ten times the others, and the applier waited on each
//! (BENCHMARKS.md, "The replicated estate"). The writer's automatic
//! checkpoint is off; a thread of the estate's own runs a passive one
//! (it never blocks the writer or a reader) after commits, at most every
//! [`EVERY`], on a connection of its own opened for it — so an estate
//! being replaced underneath (an adopted snapshot) is never held open.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rusqlite::Connection;

/// The least time between two checkpoints.
pub(crate) const EVERY: Duration = Duration::from_millis(250);

/// Asks the estate's checkpoint thread for a checkpoint; the thread ends
/// when this is dropped.
pub(crate) struct Checkpointer {
    ask: SyncSender<()>,
}

impl Checkpointer {
    /// Starts the thread for the estate at `path`; `file` is held for
    /// writing while the file is replaced, for reading by a checkpoint.
    pub fn start(path: PathBuf, file: Arc<RwLock<()>>) -> Checkpointer {
        let (ask, asked) = sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("estate-checkpoint".into())
            .spawn(move || serve(&path, &file, &asked));
        if let Err(e) = spawned {
            tracing::warn!(subsystem = "statelog", error = %e,
                "no checkpoint thread; the estate's WAL grows until the node restarts");
        }
        Checkpointer { ask }
    }

    /// After a commit: a checkpoint is due (asks pile into one).
    pub fn ask(&self) {
        match self.ask.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
        }
    }
}

fn serve(path: &std::path::Path, file: &RwLock<()>, asked: &Receiver<()>) {
    while asked.recv().is_ok() {
        let began = Instant::now();
        {
            let _file = file
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Err(e) = checkpoint(path) {
                tracing::warn!(subsystem = "statelog", error = %e,
                    "estate checkpoint failed; tried again after the next commit");
            }
        }
        std::thread::sleep(EVERY.saturating_sub(began.elapsed()));
    }
}

fn checkpoint(path: &std::path::Path) -> rusqlite::Result<()> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}
