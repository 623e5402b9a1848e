//! A domain: one JetStream stream of records, one subject per object, and
//! the rows the applier derives from it.

use std::time::Duration;

use rusqlite::Connection;

use crate::record::{Incoming, Undecodable};

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
    /// Reads one record as this domain's change — on the reader's side,
    /// while the batch before commits, so the committer only writes.
    /// `Err` when the body is not one this build knows: the applier keeps
    /// the record and writes nothing of it.
    fn decode(&self, record: &Incoming) -> Result<Box<dyn Change>, Undecodable>;
    /// Removes rows past the domain's horizon (`now_ms` on the wall clock);
    /// run by the applier, inside its transaction.
    fn age_out(&self, tx: &Connection, now_ms: i64) -> rusqlite::Result<()>;
}

/// One record's effect on the estate, decoded and ready to write inside
/// the applier's transaction. A failed write is the estate's (the batch is
/// retried whole); nothing about the record is left to refuse by then.
pub trait Change: Send + Sync {
    fn write(&self, tx: &Connection) -> rusqlite::Result<()>;
}
