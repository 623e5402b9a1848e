//! Custody: the event batches of nodes without `data` that this data node
//! writes into its log.
//!
//! Rule: a batch's rows and its `custody_unsettled` row are written in one
//! transaction, and the unsettled row goes only once the fleet said which
//! data node keeps the batch ([`Store::settle_custody`]): kept here, the
//! rows stay; kept elsewhere, they are deleted whole. Why: the batch is
//! claimed in coordination *after* it is written (a claimant that died
//! before writing would hold a batch nobody has), so between the two a
//! crash leaves rows whose fate is unknown — the unsettled row is how the
//! next pass finds them.

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::events::{EventRecord, append_in};
use crate::{Store, StoreError};

/// One batch of a stateless node's events, as it travels on
/// `CREWLET_CUSTODY`: its id (minted once by the node that cut it, so a
/// republished batch is the same batch), the node it came from, the rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CustodyBatch {
    pub batch: String,
    pub origin: String,
    pub events: Vec<EventRecord>,
}

/// A batch written here whose keeper is not known yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unsettled {
    pub batch: String,
    pub origin: String,
    pub events: i64,
    pub written_ms: i64,
}

/// What settling a batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// This node keeps the batch: its rows stay.
    Kept,
    /// Another node keeps it: this many of its rows were deleted here.
    Dropped(usize),
}

impl Store {
    /// Writes `batch`'s rows (each tagged with the batch) and marks the batch
    /// unsettled, in one transaction. A row already in the log (the same
    /// batch taken again) stands as it was. Answers the rows written now.
    pub fn write_custody_batch(&self, batch: &CustodyBatch) -> Result<usize, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut written = 0;
        for event in &batch.events {
            if append_in(&tx, event, Some(&batch.batch))?.1 {
                written += 1;
            }
        }
        tx.execute(
            "INSERT INTO custody_unsettled (batch, origin, events, written_ms)
             VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (batch) DO NOTHING",
            params![
                batch.batch,
                batch.origin,
                batch.events.len() as i64,
                crate::now_ms()
            ],
        )?;
        tx.commit()?;
        Ok(written)
    }

    /// The batches written here whose keeper is not known yet, oldest first.
    pub fn unsettled_custody(&self) -> Result<Vec<Unsettled>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT batch, origin, events, written_ms FROM custody_unsettled ORDER BY written_ms, batch",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(Unsettled {
                batch: r.get(0)?,
                origin: r.get(1)?,
                events: r.get(2)?,
                written_ms: r.get(3)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Settles `batch` as the fleet answered: `kept` here leaves its rows,
    /// otherwise they go (parties with them). Either way it is no longer
    /// unsettled. Settling a batch twice changes nothing more.
    pub fn settle_custody(&self, batch: &str, kept: bool) -> Result<Settled, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let settled = if kept {
            Settled::Kept
        } else {
            Settled::Dropped(tx.execute("DELETE FROM events WHERE custody_batch = ?1", [batch])?)
        };
        tx.execute("DELETE FROM custody_unsettled WHERE batch = ?1", [batch])?;
        tx.commit()?;
        Ok(settled)
    }

    /// How many rows of `batch` this log holds.
    pub fn custody_rows(&self, batch: &str) -> Result<usize, StoreError> {
        let n: i64 = self.conn().query_row(
            "SELECT COUNT(*) FROM events WHERE custody_batch = ?1",
            [batch],
            |r| r.get(0),
        )?;
        Ok(n as usize)
    }

    /// Writes a consistent copy of this whole store to `path` (which must not
    /// exist): one read transaction, so a backup sees one instant of it.
    pub fn snapshot_to(&self, path: &std::path::Path) -> Result<(), StoreError> {
        self.conn()
            .execute("VACUUM INTO ?1", [path.display().to_string()])?;
        Ok(())
    }

    /// Whether `batch` is written here and not settled yet.
    pub fn is_unsettled(&self, batch: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT 1 FROM custody_unsettled WHERE batch = ?1",
                [batch],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventQuery;

    fn batch(id: &str, n: usize) -> CustodyBatch {
        CustodyBatch {
            batch: id.into(),
            origin: "edge".into(),
            events: (0..n)
                .map(|i| {
                    let mut e = EventRecord::new(
                        format!("{id}-{i}"),
                        "turn_started",
                        "edge",
                        serde_json::json!({ "i": i }),
                    );
                    e.parties = vec![crate::Party {
                        party: "seat:ada".into(),
                        role: "seat".into(),
                    }];
                    e
                })
                .collect(),
        }
    }

    #[test]
    fn a_batch_is_written_unsettled_and_settles_kept_or_dropped_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_in(dir.path()).unwrap();
        let own = EventRecord::new("own-1", "node_started", "data-a", serde_json::json!({}));
        store.append_event(&own).unwrap();

        assert_eq!(store.write_custody_batch(&batch("b1", 3)).unwrap(), 3);
        assert_eq!(store.write_custody_batch(&batch("b2", 2)).unwrap(), 2);
        // The same batch taken again writes nothing more.
        assert_eq!(store.write_custody_batch(&batch("b1", 3)).unwrap(), 0);
        let unsettled: Vec<String> = store
            .unsettled_custody()
            .unwrap()
            .into_iter()
            .map(|u| u.batch)
            .collect();
        assert_eq!(unsettled.len(), 2);
        assert!(unsettled.contains(&"b1".to_owned()) && unsettled.contains(&"b2".to_owned()));

        assert_eq!(store.settle_custody("b1", true).unwrap(), Settled::Kept);
        assert_eq!(
            store.settle_custody("b2", false).unwrap(),
            Settled::Dropped(2)
        );
        assert_eq!(
            store.settle_custody("b2", false).unwrap(),
            Settled::Dropped(0)
        );
        assert!(store.unsettled_custody().unwrap().is_empty());
        assert_eq!(store.custody_rows("b1").unwrap(), 3);
        assert_eq!(store.custody_rows("b2").unwrap(), 0);
        let ids: Vec<String> = store
            .events(&EventQuery::default())
            .unwrap()
            .into_iter()
            .map(|e| e.event_id)
            .collect();
        assert_eq!(ids, ["b1-2", "b1-1", "b1-0", "own-1"]);
        // The dropped rows' parties went with them.
        let parties: i64 = store
            .conn()
            .query_row("SELECT COUNT(*) FROM event_parties", [], |r| r.get(0))
            .unwrap();
        assert_eq!(parties, 3);
    }
}
