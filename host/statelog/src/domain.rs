//! A domain: one JetStream stream of records, one subject per object, and
//! the rows the applier derives from it.

use std::time::Duration;

use rusqlite::Connection;

use crate::record::{Record, Undecodable};

/// What the applier needs to know of a domain.
pub trait Domain: Send + Sync + 'static {
    /// The domain's name in the estate and in `positions` (`usage`).
    fn name(&self) -> &'static str;
    /// The stream holding its log.
    fn stream(&self) -> &'static str;
    /// The prefix of every subject (`crewlet.usage.log`); the stream holds
    /// `prefix.>`, and `prefix.barrier` is the barrier subject.
    fn prefix(&self) -> &'static str;
    /// True when the stream keeps one message per subject (each record the
    /// object's whole value), so a gap left by compaction loses nothing.
    fn compacted(&self) -> bool;
    /// The stream's age, if any (a horizon the applier also ages rows at).
    fn max_age(&self) -> Option<Duration>;
    /// Applies one decoded record inside the applier's transaction. `Err`
    /// with [`Undecodable`] when the body is not one this build knows (the
    /// applier rolls the record back and keeps it); a database error is
    /// the caller's to retry.
    fn apply(&self, tx: &Connection, record: &Record) -> Result<(), ApplyError>;
    /// True when [`Domain::apply`] writes with one statement and refuses
    /// an undecodable body before writing anything, so the applier needs
    /// no savepoint around it to never apply a record half.
    fn apply_is_atomic(&self) -> bool {
        false
    }
    /// Removes rows past the domain's horizon (`now_ms` on the wall clock);
    /// run by the applier, inside its transaction.
    fn age_out(&self, tx: &Connection, now_ms: i64) -> rusqlite::Result<()>;
}

/// Why one record was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Undecodable(#[from] Undecodable),
    #[error("the estate refused the write: {0}")]
    Sqlite(#[from] rusqlite::Error),
}
