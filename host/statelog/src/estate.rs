//! The replicated estate: `replicated.sqlite3` beside the node's own file.
//!
//! Rule: nothing but the applier writes it. The write half (`write`,
//! `install`) is crate-private and reached only from the applier and the
//! adoption it runs; every other reader gets a read-only connection SQLite
//! itself enforces. Why: every data node must reach the same rows by the
//! same route, so a row written any other way is a fork nobody can see.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior};
use serde::{Deserialize, Serialize};

use crate::EstateError;
use crate::checkpoint::Checkpointer;
use crate::db;

/// The estate's file name, in the node's data dir.
pub const ESTATE_FILE: &str = "replicated.sqlite3";
/// The estate's scripts, in order (`db` runs those a file has not run).
const SCHEMA: [&str; 4] = [
    include_str!("../migrations/estate.sql"),
    include_str!("../migrations/usage2_slot.sql"),
    include_str!("../migrations/v3_day_first.sql"),
    include_str!("../migrations/v4_op_bytes.sql"),
];

/// The writer's page cache, KiB.
const WRITER_CACHE_KIB: i64 = 64 * 1024;

/// Where the estate stands on each domain's log: domain → position.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Positions(pub BTreeMap<String, u64>);

impl Positions {
    /// The position on `domain` (0: nothing applied).
    pub fn of(&self, domain: &str) -> u64 {
        self.0.get(domain).copied().unwrap_or(0)
    }
}

/// A domain's cursor: the position and the broker instant of the record
/// there (0 when nothing was applied).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    pub position: u64,
    pub record_ns: i64,
}

/// The replicated estate of one node.
pub struct Estate {
    path: PathBuf,
    writer: Mutex<Connection>,
    /// Held for writing while the file is replaced ([`Estate::install`]).
    file: Arc<RwLock<()>>,
    checkpoints: Checkpointer,
}

/// The writer's connection: the schema run, its checkpoints left to the
/// estate's own thread ([`crate::checkpoint`]), and a page cache a batch
/// fits in — the applier's batches touch rows all over the usage tables
/// (one object per seat and day), and with SQLite's 2 MiB default each
/// page evicted was read back from the WAL.
fn open_writer(path: &Path) -> Result<Connection, EstateError> {
    let conn = db::open_rw(path, &SCHEMA)?;
    let err = |source| EstateError::Open {
        path: path.display().to_string(),
        source,
    };
    conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)
        .map_err(err)?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .map_err(err)?;
    Ok(conn)
}

impl Estate {
    /// Opens (creating and migrating) `<data_dir>/replicated.sqlite3`.
    pub fn open_in(data_dir: &Path) -> Result<Estate, EstateError> {
        Estate::open(&data_dir.join(ESTATE_FILE))
    }

    /// Opens the estate at `path`.
    pub fn open(path: &Path) -> Result<Estate, EstateError> {
        let file = Arc::new(RwLock::new(()));
        Ok(Estate {
            path: path.to_path_buf(),
            writer: Mutex::new(open_writer(path)?),
            checkpoints: Checkpointer::start(path.to_path_buf(), file.clone()),
            file,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // Every write is one transaction: a panic mid-way rolls it back.
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A read-only connection to the estate (SQLite refuses writes on it).
    pub fn reader(&self) -> Result<Connection, EstateError> {
        db::open_ro(&self.path)
    }

    /// The cursor on `domain`.
    pub fn cursor(&self, domain: &str) -> Result<Cursor, EstateError> {
        cursor_in(&self.lock(), domain)
    }

    /// Every domain's position.
    pub fn positions(&self) -> Result<Positions, EstateError> {
        positions_in(&self.lock())
    }

    /// How many records of `domain` this build could not decode.
    pub fn ops_lost(&self, domain: &str) -> Result<u64, EstateError> {
        let n: i64 = self.lock().query_row(
            "SELECT COUNT(*) FROM statelog_ops_lost WHERE domain = ?1",
            [domain],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    /// Writes a consistent copy of the whole estate to `path` (which must
    /// not exist) and answers the positions the copy stands at: taken under
    /// the writer's lock, so no apply lands between the copy and its
    /// positions. A backup keeps both together.
    pub fn snapshot_to(&self, path: &Path) -> Result<Positions, EstateError> {
        let conn = self.lock();
        let positions = positions_in(&conn)?;
        conn.execute("VACUUM INTO ?1", [path.display().to_string()])
            .map_err(|source| EstateError::Snapshot {
                path: path.display().to_string(),
                source,
            })?;
        Ok(positions)
    }

    /// Runs `f` in one immediate transaction of the writer (the applier's).
    pub(crate) fn write<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, EstateError>,
    ) -> Result<T, EstateError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()?;
        self.checkpoints.ask();
        Ok(out)
    }

    /// Replaces the whole estate with the file at `from` (an adopted,
    /// integrity-checked snapshot): the writer is closed, the file and its
    /// WAL moved aside, `from` renamed in, the writer opened again.
    pub(crate) fn install(&self, from: &Path) -> Result<Positions, EstateError> {
        let mut conn = self.lock();
        let _file = self.file.write().unwrap_or_else(PoisonError::into_inner);
        let placeholder = Connection::open_in_memory()?;
        let old = std::mem::replace(&mut *conn, placeholder);
        old.close().map_err(|(_, e)| e)?;
        for ext in ["-wal", "-shm"] {
            let side = PathBuf::from(format!("{}{ext}", self.path.display()));
            if side.exists() {
                std::fs::remove_file(&side).map_err(|e| EstateError::Install {
                    path: side.display().to_string(),
                    source: e,
                })?;
            }
        }
        std::fs::rename(from, &self.path).map_err(|e| EstateError::Install {
            path: self.path.display().to_string(),
            source: e,
        })?;
        *conn = open_writer(&self.path)?;
        positions_in(&conn)
    }
}

/// Installs a backup's estate snapshot `from` as the estate at `to`
/// (which must not exist), each domain's cursor moved to where its records
/// stand on the restored log (`rebase(domain, position)`), with no record
/// instant: the restored log's records carry new ones, so the checkpoint
/// is compared again only after the first apply. The copy is integrity
/// checked first; nothing is at `to` unless all of it held. Answers the
/// positions installed. (A restore is the estate's own install, as an
/// adoption is: the applier is not running yet on this data dir.)
pub(crate) fn restore_into(
    from: &Path,
    to: &Path,
    rebase: &dyn Fn(&str, u64) -> u64,
) -> Result<Positions, EstateError> {
    let install = |source: std::io::Error| EstateError::Install {
        path: to.display().to_string(),
        source,
    };
    if to.exists() {
        return Err(install(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "an estate is there already; restore into a fresh or emptied data dir",
        )));
    }
    let staged = PathBuf::from(format!("{}.restoring", to.display()));
    std::fs::copy(from, &staged).map_err(install)?;
    let result = (|| {
        let conn = db::open_rw(&staged, &SCHEMA)?;
        let answer: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
        if answer != "ok" {
            return Err(install(std::io::Error::other(format!(
                "the backup's estate fails integrity_check: {answer}"
            ))));
        }
        let old = positions_in(&conn)?;
        for (domain, position) in &old.0 {
            conn.execute(
                "UPDATE statelog_cursor SET position = ?2, record_ns = 0 WHERE domain = ?1",
                rusqlite::params![domain, rebase(domain, *position) as i64],
            )?;
        }
        let now = positions_in(&conn)?;
        conn.close().map_err(|(_, e)| e)?;
        Ok(now)
    })();
    match result {
        Ok(positions) => {
            std::fs::rename(&staged, to).map_err(install)?;
            Ok(positions)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&staged);
            Err(e)
        }
    }
}

pub(crate) fn cursor_in(conn: &Connection, domain: &str) -> Result<Cursor, EstateError> {
    Ok(conn
        .query_row(
            "SELECT position, record_ns FROM statelog_cursor WHERE domain = ?1",
            [domain],
            |r| {
                Ok(Cursor {
                    position: r.get::<_, i64>(0)? as u64,
                    record_ns: r.get(1)?,
                })
            },
        )
        .optional()?
        .unwrap_or_default())
}

fn positions_in(conn: &Connection) -> Result<Positions, EstateError> {
    let mut stmt = conn.prepare("SELECT domain, position FROM statelog_cursor")?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
    })?;
    let mut out = BTreeMap::new();
    for row in rows {
        let (d, p) = row?;
        out.insert(d, p);
    }
    Ok(Positions(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::UsageQuery;

    const LEDGER_OP: &str = "019af3c2-5e1d-7abc-8def-0123456789ab";

    #[test]
    fn an_estate_of_the_first_version_keeps_its_rows_with_the_slot_unknown_keyed_day_first_and_its_ledger_as_bytes()
     {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(ESTATE_FILE);
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(SCHEMA[0]).unwrap();
            conn.execute(
                "INSERT INTO usage_tokens VALUES ('n1', '2026-12-06', 'ada', 'eng', 'executor', 'm1', 2, 30, 3)",
                [],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO usage_turns VALUES ('n1', '2026-12-06', 'ada', 'eng', 'delivered', 4)",
                [],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO usage_schedule_runs VALUES ('n1', '2026-12-06', 'daily', 'ada', 1)",
                [],
            )
            .unwrap();
            // The ledger as text: a UUID's row is carried over as its
            // bytes; an id that is no UUID cannot recur and goes.
            conn.execute(
                "INSERT INTO statelog_ops VALUES ('usage', ?1, 7, 1), ('usage', 'op-7', 8, 1)",
                [LEDGER_OP],
            )
            .unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
        }
        let estate = Estate::open(&path).unwrap();
        let rows = UsageQuery::parse(None, Some("provider"), None, None)
            .unwrap()
            .run(&estate.reader().unwrap())
            .unwrap();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(
            (rows[0].key.as_deref(), rows[0].calls, rows[0].input_tokens),
            (None, 2, 30)
        );
        let version: i64 = estate
            .reader()
            .unwrap()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA.len() as i64);
        let conn = estate.reader().unwrap();
        let kept: (i64, i64) = conn
            .query_row(
                "SELECT (SELECT turns FROM usage_turns WHERE day = '2026-12-06' AND seat = 'ada'),
                        (SELECT fires FROM usage_schedule_runs WHERE day = '2026-12-06')",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(kept, (4, 1));
        let ledger: Vec<(Vec<u8>, i64)> = conn
            .prepare("SELECT op_id, position FROM statelog_ops")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let op = uuid::Uuid::parse_str(LEDGER_OP).unwrap();
        assert_eq!(ledger, [(op.as_bytes().to_vec(), 7)]);
        let indexes: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND (name LIKE 'usage_%' OR name = 'statelog_ops_applied')")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            indexes,
            Vec::<String>::new(),
            "the day is the key's first column"
        );
        let plan: String = conn
            .query_row(
                "EXPLAIN QUERY PLAN SELECT sum(calls) FROM usage_tokens WHERE day BETWEEN '2026-12-01' AND '2026-12-07'",
                [],
                |r| r.get(3),
            )
            .unwrap();
        assert!(
            plan.contains("SEARCH usage_tokens USING PRIMARY KEY"),
            "{plan}"
        );
    }
}
