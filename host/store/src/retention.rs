//! Retention: old rows deleted in bounded batches.
//!
//! Rule: a trim never holds the store for longer than one batch. Each batch
//! is its own short transaction, and between batches the trim lets go of
//! the connection for [`TRIM_PAUSE`], so the event log's writer (on the
//! webhook's path) waits at most one batch, however much there is to trim.
//!
//! The event log is trimmed from its oldest end: rows go in `seq` order
//! while their `at_ms` is before the cutoff, so a batch reads only the rows
//! it deletes. The log has no index on `at_ms` (migration 0005 dropped it to
//! keep appends cheap), and scanning the whole log for stragglers would
//! hold the lock for as long as the log is big. A row stamped out of order
//! (a clock step back) waits behind its newer predecessor until that one
//! ages out too.
//!
//! The newest event always stays: `seq` is the rowid (no AUTOINCREMENT),
//! so an emptied table would hand out `seq` 1 again, and a reader paging
//! with an old `before_seq` would read a different log under the same
//! numbers.
//!
//! `event_parties` has no index on `seq` either, so SQLite's own cascade
//! (and even its foreign-key check on a delete) scans the whole table once
//! per deleted event: about 17 s for 500 events over 400,000 party rows. A
//! batch therefore deletes each event's parties by primary key, from the
//! `parties` column the row carries, with foreign keys off for that batch
//! only (the connection is held throughout, so no other statement runs
//! without them).

use std::time::Duration;

use rusqlite::{Connection, params};

use crate::events::Party;
use crate::{Store, StoreError};

/// How long a trim leaves the connection to others between two batches.
pub const TRIM_PAUSE: Duration = Duration::from_millis(1);

impl Store {
    /// Deletes the events stamped before `cutoff_ms` (from the oldest end of
    /// the log, see the module doc), with their parties, `batch` rows per
    /// transaction (`0` counts as 1). Answers how many events went.
    pub fn trim_events_before(&self, cutoff_ms: i64, batch: usize) -> Result<usize, StoreError> {
        self.in_batches(batch, |conn, limit| {
            conn.pragma_update(None, "foreign_keys", "OFF")?;
            let trimmed = trim_events_batch(conn, cutoff_ms, limit);
            let restored = conn.pragma_update(None, "foreign_keys", "ON");
            let trimmed = trimmed?;
            restored?;
            Ok(trimmed)
        })
    }

    /// Runs `one` (deleting at most `batch` rows, answering how many it
    /// deleted and whether there may be more) until there is nothing left,
    /// letting go of the connection between batches.
    pub(crate) fn in_batches(
        &self,
        batch: usize,
        mut one: impl FnMut(&mut Connection, i64) -> Result<(usize, bool), StoreError>,
    ) -> Result<usize, StoreError> {
        let limit = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        let mut total = 0;
        loop {
            let (deleted, more) = one(&mut self.conn(), limit)?;
            total += deleted;
            if !more {
                return Ok(total);
            }
            std::thread::sleep(TRIM_PAUSE);
        }
    }
}

fn trim_events_batch(
    conn: &mut Connection,
    cutoff_ms: i64,
    limit: i64,
) -> Result<(usize, bool), StoreError> {
    let tx = conn.transaction()?;
    let oldest: Vec<(i64, i64, String)> = tx
        .prepare_cached(
            "SELECT seq, at_ms, parties FROM events
              WHERE seq < (SELECT MAX(seq) FROM events) ORDER BY seq LIMIT ?1",
        )?
        .query_map([limit], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    let old: Vec<_> = oldest
        .into_iter()
        .take_while(|(_, at_ms, _)| *at_ms < cutoff_ms)
        .collect();
    let Some(&(last, _, _)) = old.last() else {
        return Ok((0, false));
    };
    let more = old.len() as i64 == limit;
    {
        let mut party = tx.prepare_cached(
            "DELETE FROM event_parties WHERE party = ?1 AND seq = ?2 AND role = ?3",
        )?;
        for (seq, _, parties) in &old {
            for p in serde_json::from_str::<Vec<Party>>(parties)? {
                party.execute(params![p.party, seq, p.role])?;
            }
        }
    }
    let deleted = tx.execute("DELETE FROM events WHERE seq <= ?1", [last])?;
    tx.commit()?;
    Ok((deleted, more))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventRecord;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open_in(dir.path()).unwrap();
        (dir, s)
    }

    fn event(id: &str, at_ms: i64) -> EventRecord {
        let mut e = EventRecord::new(id, "wake", "n1", serde_json::json!({"id": id}));
        e.at_ms = at_ms;
        e.parties = vec![
            Party {
                party: format!("seat-{id}"),
                role: "seat".into(),
            },
            Party {
                party: "ops".into(),
                role: "mentioned".into(),
            },
        ];
        e
    }

    fn count(s: &Store, sql: &str) -> i64 {
        s.conn().query_row(sql, [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn old_events_go_with_their_parties_and_recent_ones_stay() {
        let (_d, s) = store();
        let old: Vec<_> = (0..25)
            .map(|i| event(&format!("old{i}"), 1_000 + i))
            .collect();
        let recent: Vec<_> = (0..5)
            .map(|i| event(&format!("new{i}"), 5_000 + i))
            .collect();
        s.append_events(&old).unwrap();
        s.append_events(&recent).unwrap();
        assert_eq!(count(&s, "SELECT COUNT(*) FROM event_parties"), 60);

        assert_eq!(s.trim_events_before(5_000, 4).unwrap(), 25);
        let left: Vec<String> = s
            .events(&crate::EventQuery::default())
            .unwrap()
            .into_iter()
            .map(|e| e.event_id)
            .collect();
        assert_eq!(left, ["new4", "new3", "new2", "new1", "new0"]);
        assert_eq!(count(&s, "SELECT COUNT(*) FROM event_parties"), 10);
        assert_eq!(
            count(
                &s,
                "SELECT COUNT(*) FROM event_parties WHERE seq NOT IN (SELECT seq FROM events)"
            ),
            0
        );
        let ops = s
            .events(&crate::EventQuery {
                party: Some("ops".into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(ops.len(), 5);
        // Foreign keys are on again for everyone else.
        assert_eq!(count(&s, "PRAGMA foreign_keys"), 1);
        assert_eq!(s.trim_events_before(5_000, 4).unwrap(), 0);
    }

    #[test]
    fn a_row_stamped_out_of_order_waits_for_its_predecessor() {
        let (_d, s) = store();
        s.append_events(&[event("a", 100), event("b", 900), event("c", 200)])
            .unwrap();
        assert_eq!(s.trim_events_before(500, 10).unwrap(), 1);
        assert!(s.event("c").unwrap().is_some());
        assert_eq!(s.trim_events_before(1_000, 10).unwrap(), 1);
        assert!(s.event("c").unwrap().is_some(), "the newest event went");
    }

    #[test]
    fn the_newest_event_stays_so_seq_never_restarts() {
        let (_d, s) = store();
        let seqs = s
            .append_events(&[event("a", 1), event("b", 2), event("c", 3)])
            .unwrap();
        assert_eq!(s.trim_events_before(i64::MAX, 1).unwrap(), 2);
        assert_eq!(count(&s, "SELECT COUNT(*) FROM event_parties"), 2);
        let next = s.append_event(&event("d", 4)).unwrap();
        assert!(next > seqs[2], "seq {next} handed out again");
    }

    #[test]
    fn the_writer_appends_while_a_long_trim_runs() {
        let (_d, s) = store();
        let total = 20_000;
        let rows: Vec<_> = (0..total).map(|i| event(&format!("o{i}"), i)).collect();
        for chunk in rows.chunks(1_000) {
            s.append_events(chunk).unwrap();
        }
        let s = std::sync::Arc::new(s);
        let trim = {
            let s = s.clone();
            std::thread::spawn(move || s.trim_events_before(total, 50))
        };
        // Once the trim is under way, append: each append must get in
        // between two batches, long before the trim is done.
        while count(&s, "SELECT COUNT(*) FROM events") == total {
            assert!(!trim.is_finished(), "the trim ended before it was seen");
        }
        for i in 0..20 {
            s.append_event(&event(&format!("live{i}"), total + i))
                .unwrap();
        }
        let old_left = count(
            &s,
            &format!("SELECT COUNT(*) FROM events WHERE at_ms < {total}"),
        );
        assert!(
            old_left > 0,
            "the appends waited for the whole trim instead of a batch"
        );
        assert_eq!(trim.join().unwrap().unwrap(), total as usize);
        assert_eq!(count(&s, "SELECT COUNT(*) FROM events"), 20);
        assert_eq!(count(&s, "SELECT COUNT(*) FROM event_parties"), 40);
    }
}
