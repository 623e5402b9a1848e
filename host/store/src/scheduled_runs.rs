//! Runs of scheduled work this node performed (`scheduled_runs`).
//!
//! Rule: one row per fire, keyed by the fire's fleet-wide key, so a fire
//! recorded here is never run twice here: [`Store::record_run`] answers
//! whether the fire is new, and only a new one is run. Old rows go with
//! [`Store::trim_scheduled_runs_before`], in batches like the event log.

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use rusqlite::{Row, params};
use serde::{Deserialize, Serialize};

use crate::{Store, StoreError};

/// Where a run is; the table's `CHECK` allows exactly these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Pending,
    Running,
    Done,
    Failed,
    Skipped,
}

impl RunStatus {
    pub const ALL: [RunStatus; 5] = [
        RunStatus::Pending,
        RunStatus::Running,
        RunStatus::Done,
        RunStatus::Failed,
        RunStatus::Skipped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "pending",
            RunStatus::Running => "running",
            RunStatus::Done => "done",
            RunStatus::Failed => "failed",
            RunStatus::Skipped => "skipped",
        }
    }

    /// Done, failed or skipped: the run is over.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunStatus::Done | RunStatus::Failed | RunStatus::Skipped
        )
    }
}

impl ToSql for RunStatus {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for RunStatus {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        let s = value.as_str()?;
        RunStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| FromSqlError::Other(format!("unknown run status {s:?}").into()))
    }
}

/// One run of a scheduled fire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledRun {
    /// The fire's fleet-wide key (unique here).
    pub fire_key: String,
    pub schedule: String,
    pub seat: Option<String>,
    pub due_ms: i64,
    pub started_ms: Option<i64>,
    pub finished_ms: Option<i64>,
    pub status: RunStatus,
    pub error: Option<String>,
}

fn from_row(r: &Row<'_>) -> rusqlite::Result<ScheduledRun> {
    Ok(ScheduledRun {
        fire_key: r.get(0)?,
        schedule: r.get(1)?,
        seat: r.get(2)?,
        due_ms: r.get(3)?,
        started_ms: r.get(4)?,
        finished_ms: r.get(5)?,
        status: r.get(6)?,
        error: r.get(7)?,
    })
}

impl Store {
    /// Records a run unless its fire is already here; answers whether it
    /// was new (a fire already recorded keeps its row as it was).
    pub fn record_run(&self, run: &ScheduledRun) -> Result<bool, StoreError> {
        let inserted = self.conn().execute(
            "INSERT INTO scheduled_runs
                 (fire_key, schedule, seat, due_ms, started_ms, finished_ms, status, error)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             ON CONFLICT (fire_key) DO NOTHING",
            params![
                run.fire_key,
                run.schedule,
                run.seat,
                run.due_ms,
                run.started_ms,
                run.finished_ms,
                run.status,
                run.error,
            ],
        )?;
        Ok(inserted == 1)
    }

    /// Moves the run of `fire_key` to `status` at `at_ms`: running stamps
    /// `started_ms`, a final status stamps `finished_ms`, pending clears
    /// both. `error` replaces the stored one. Answers whether the run was
    /// here.
    pub fn set_run_status(
        &self,
        fire_key: &str,
        status: RunStatus,
        error: Option<&str>,
        at_ms: i64,
    ) -> Result<bool, StoreError> {
        let (started, finished) = match status {
            RunStatus::Pending => (None, None),
            RunStatus::Running => (Some(at_ms), None),
            _ => (None, Some(at_ms)),
        };
        let updated = self.conn().execute(
            "UPDATE scheduled_runs
                SET status = ?2, error = ?3,
                    started_ms = CASE WHEN ?2 = 'pending' THEN NULL ELSE COALESCE(?4, started_ms) END,
                    finished_ms = ?5
              WHERE fire_key = ?1",
            params![fire_key, status, error, started, finished],
        )?;
        Ok(updated == 1)
    }

    /// The newest runs first (by due time), at most `limit` (`0` means 100;
    /// capped at 1,000).
    pub fn scheduled_runs(&self, limit: usize) -> Result<Vec<ScheduledRun>, StoreError> {
        let limit = match limit {
            0 => 100,
            n => n.min(1_000),
        } as i64;
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT fire_key, schedule, seat, due_ms, started_ms, finished_ms, status, error
               FROM scheduled_runs ORDER BY due_ms DESC, id DESC LIMIT ?1",
        )?;
        let runs = stmt
            .query_map([limit], from_row)?
            .collect::<Result<_, _>>()?;
        Ok(runs)
    }

    /// Deletes the runs due before `cutoff_ms`, `batch` per transaction
    /// (`0` counts as 1); answers how many went.
    pub fn trim_scheduled_runs_before(
        &self,
        cutoff_ms: i64,
        batch: usize,
    ) -> Result<usize, StoreError> {
        self.in_batches(batch, |conn, limit| {
            let deleted = conn.execute(
                "DELETE FROM scheduled_runs WHERE id IN
                     (SELECT id FROM scheduled_runs WHERE due_ms < ?1 ORDER BY due_ms LIMIT ?2)",
                params![cutoff_ms, limit],
            )?;
            Ok((deleted, deleted as i64 == limit))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open_in(dir.path()).unwrap();
        (dir, s)
    }

    fn run(key: &str, due_ms: i64) -> ScheduledRun {
        ScheduledRun {
            fire_key: key.into(),
            schedule: "daily-digest".into(),
            seat: Some("ada".into()),
            due_ms,
            started_ms: None,
            finished_ms: None,
            status: RunStatus::Pending,
            error: None,
        }
    }

    #[test]
    fn a_fire_is_recorded_once() {
        let (_d, s) = store();
        assert!(s.record_run(&run("f1", 10)).unwrap());
        let mut again = run("f1", 99);
        again.schedule = "other".into();
        assert!(!s.record_run(&again).unwrap(), "a fire recorded twice");
        assert_eq!(s.scheduled_runs(0).unwrap(), vec![run("f1", 10)]);
    }

    #[test]
    fn a_run_moves_through_its_statuses() {
        let (_d, s) = store();
        s.record_run(&run("f1", 10)).unwrap();
        assert!(
            s.set_run_status("f1", RunStatus::Running, None, 20)
                .unwrap()
        );
        let r = &s.scheduled_runs(1).unwrap()[0];
        assert_eq!(
            (r.status, r.started_ms, r.finished_ms),
            (RunStatus::Running, Some(20), None)
        );
        assert!(
            s.set_run_status("f1", RunStatus::Failed, Some("model refused"), 30)
                .unwrap()
        );
        let r = &s.scheduled_runs(1).unwrap()[0];
        assert_eq!(
            (r.status, r.started_ms, r.finished_ms, r.error.as_deref()),
            (RunStatus::Failed, Some(20), Some(30), Some("model refused"))
        );
        assert!(
            s.set_run_status("f1", RunStatus::Pending, None, 40)
                .unwrap()
        );
        assert_eq!(s.scheduled_runs(1).unwrap()[0], run("f1", 10));
        assert!(!s.set_run_status("nope", RunStatus::Done, None, 50).unwrap());
        // Every status round-trips through the table's CHECK.
        for (i, status) in RunStatus::ALL.into_iter().enumerate() {
            let key = format!("s{i}");
            s.record_run(&ScheduledRun {
                status,
                ..run(&key, 100 + i as i64)
            })
            .unwrap();
            s.set_run_status(&key, status, None, 1).unwrap();
            assert_eq!(s.scheduled_runs(1).unwrap()[0].status, status);
        }
    }

    #[test]
    fn runs_read_newest_first_and_old_ones_are_trimmed_in_batches() {
        let (_d, s) = store();
        for (key, due) in [("c", 30), ("a", 10), ("e", 50), ("b", 20), ("d", 40)] {
            s.record_run(&run(key, due)).unwrap();
        }
        let keys =
            |runs: Vec<ScheduledRun>| runs.into_iter().map(|r| r.fire_key).collect::<Vec<_>>();
        assert_eq!(keys(s.scheduled_runs(3).unwrap()), ["e", "d", "c"]);
        assert_eq!(s.trim_scheduled_runs_before(40, 2).unwrap(), 3);
        assert_eq!(keys(s.scheduled_runs(0).unwrap()), ["e", "d"]);
        assert_eq!(s.trim_scheduled_runs_before(40, 2).unwrap(), 0);
        // A trimmed fire is new again here.
        assert!(s.record_run(&run("a", 10)).unwrap());
    }
}
