//! A domain: one JetStream stream of records, one subject per object, and
//! the rows the applier derives from it.

use std::time::Duration;

use rusqlite::{Connection, Statement};

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
    fn write(&self, w: &mut Writes<'_>) -> rusqlite::Result<()>;
}

/// The applier's transaction as a change writes to it: the connection,
/// and statements prepared once per batch.
///
/// Why not the connection's own statement cache: it hashes the SQL text
/// and moves the statement out and back on every use, a cost paid per
/// record that a batch of thousands repeats for a handful of statements.
/// Here a statement is found by the address of its `'static` text (a
/// pointer compare over a few entries); text at another address is only
/// prepared again, never mistaken for another statement.
pub struct Writes<'c> {
    tx: &'c Connection,
    prepared: Vec<(&'static str, Statement<'c>)>,
}

impl<'c> Writes<'c> {
    pub(crate) fn new(tx: &'c Connection) -> Writes<'c> {
        Writes {
            tx,
            prepared: Vec::new(),
        }
    }

    /// The transaction, for what a prepared statement does not cover.
    pub fn tx(&self) -> &'c Connection {
        self.tx
    }

    /// `sql` prepared in this batch, the first use preparing it.
    pub fn statement(&mut self, sql: &'static str) -> rusqlite::Result<&mut Statement<'c>> {
        let at = match self
            .prepared
            .iter()
            .position(|(s, _)| std::ptr::eq(*s, sql))
        {
            Some(at) => at,
            None => {
                self.prepared.push((sql, self.tx.prepare(sql)?));
                self.prepared.len() - 1
            }
        };
        Ok(&mut self.prepared[at].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static COUNT: &str = "SELECT COUNT(*) FROM t";
    static SUM: &str = "SELECT COALESCE(SUM(x), 0) FROM t";

    #[test]
    fn a_statement_is_prepared_once_per_batch_and_never_taken_for_another() {
        let db = Connection::open_in_memory().unwrap();
        db.execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (2), (3);")
            .unwrap();
        let mut w = Writes::new(&db);
        for _ in 0..3 {
            let n: i64 = w
                .statement(COUNT)
                .unwrap()
                .query_row([], |r| r.get(0))
                .unwrap();
            let sum: i64 = w
                .statement(SUM)
                .unwrap()
                .query_row([], |r| r.get(0))
                .unwrap();
            assert_eq!((n, sum), (2, 5));
        }
        assert_eq!(w.prepared.len(), 2);
        // The same text at another address is prepared again, not mixed up.
        let elsewhere: &'static str = String::from(COUNT).leak();
        let n: i64 = w
            .statement(elsewhere)
            .unwrap()
            .query_row([], |r| r.get(0))
            .unwrap();
        assert_eq!((n, w.prepared.len()), (2, 3));
    }
}
