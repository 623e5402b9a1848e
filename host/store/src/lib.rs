//! The node store: this node's own SQLite file.
//!
//! One file under the data dir, one process, exclusively owned (the data dir
//! lock guarantees it): nothing in it has to be safe against a peer, and
//! nothing the company must agree on belongs in it — that lives in the
//! coordination store. It holds what one node did: the events it published
//! (and, on a data node, the custody batches of stateless nodes it keeps),
//! what its seats said per conversation and remember (diary, episodes,
//! profiles: `memory`), the company revisions it has seen,
//! the scheduled runs it performed, and secrets set (sealed) while it was
//! stopped.
//!
//! Migrations are the files in `migrations/`, embedded in the binary and
//! applied in order at open, all pending ones inside one transaction: a
//! failure leaves the file exactly as it was and stops the node. A file
//! written by a newer schema than this build knows is refused, never
//! "upgraded" backwards.

mod custody;
mod events;
mod learning;
mod memory;
mod pending_secrets;
mod retention;
mod revisions;
mod scheduled_runs;
mod sessions;
mod skills;
mod usage_reads;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

pub use custody::{CustodyBatch, Settled, Unsettled};
pub use events::{EventQuery, EventRecord, Party};
pub use learning::{EpisodeBrief, MemoryView, Promotion, RETIRE_BELOW, ReflectionMark, strength};
pub use memory::{
    COSINE_DISTANCE, DiaryNote, Episode, MemoryKind, Onboarded, Profile, Recalled, Unmatched,
    Vector,
};
pub use pending_secrets::PendingSecret;
pub use retention::TRIM_PAUSE;
pub use revisions::Revision;
pub use scheduled_runs::{RunStatus, ScheduledRun};
pub use sessions::{Applied, SESSION_KEEP, Said, Session, SessionRow};
pub use skills::{
    Learned, Origin, SKILL_NAME_MAX, SKILL_PROCEDURE_MAX, SkillHistory, SkillRefused, SkillRow,
    SkillVersionRow, cut, skill_id,
};
pub use usage_reads::UsageRead;

/// The file name of the store inside the data dir.
pub const FILE_NAME: &str = "node.sqlite3";

/// One schema step.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: u32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// Every migration of `migrations/`, in order.
pub static MIGRATIONS: &[Migration] = include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the node store {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "the node store {path} was written by a newer crewlet (schema {found}; this build knows up to {supported}); run a build at least that new, or restore a backup taken before the upgrade"
    )]
    NewerSchema {
        path: String,
        found: u32,
        supported: u32,
    },
    #[error(
        "the node store {path} has a different schema history (version {version} is {found:?} there, {expected:?} here); it was not written by this line of crewlet builds"
    )]
    ForeignHistory {
        path: String,
        version: u32,
        found: String,
        expected: String,
    },
    #[error(
        "migration {version:04}_{name} failed on {path}: {source}; the store is unchanged and the node will not start"
    )]
    Migration {
        path: String,
        version: u32,
        name: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("cannot start the checkpoint thread of the node store {path}: {source}")]
    Checkpointer {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("node store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("node store: a stored value is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// This node's store. Cheap to share behind an `Arc`; calls block, so async
/// callers run them on the blocking pool.
pub struct Store {
    conn: Mutex<Connection>,
    path: PathBuf,
    version: u32,
    _checkpointer: Checkpointer,
}

/// How often the checkpointer copies the WAL back into the file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);
/// A WAL this long (4 KiB pages: 64 MiB) is checkpointed by the writing
/// connection itself, should the checkpointer fall that far behind.
const WAL_BACKSTOP_PAGES: i64 = 16_384;

/// Copies the WAL back into the database file from a thread and connection
/// of its own. SQLite's default runs that copy — with its two fsyncs — inside
/// whichever commit crosses 1,000 pages, and every row queued behind that
/// commit waits for the disk; the event log's writer is on the webhook's
/// path, so the copy moves here. A passive checkpoint never blocks a writer.
/// Stops (after a last checkpoint) when the store is dropped.
struct Checkpointer {
    _stop: std::sync::mpsc::Sender<()>,
}

impl Checkpointer {
    fn start(path: &Path) -> Result<Checkpointer, StoreError> {
        let label = path.display().to_string();
        let open_err = |source| StoreError::Open {
            path: label.clone(),
            source,
        };
        let conn = Connection::open(path).map_err(open_err)?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(open_err)?;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread_label = label.clone();
        std::thread::Builder::new()
            .name("crewlet-store-checkpoint".into())
            .spawn(move || {
                let mut failing = false;
                loop {
                    let last = !matches!(
                        stopped.recv_timeout(CHECKPOINT_EVERY),
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout)
                    );
                    match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                        Ok(()) => failing = false,
                        Err(e) if !failing => {
                            failing = true;
                            tracing::warn!(subsystem = "store", store = %thread_label, error = %e,
                                "WAL checkpoint failed; retrying (the writer checkpoints itself past 64 MiB)");
                        }
                        Err(_) => {}
                    }
                    if last {
                        break;
                    }
                }
            })
            .map_err(|source| StoreError::Checkpointer {
                path: label,
                source,
            })?;
        Ok(Checkpointer { _stop: stop })
    }
}

impl Store {
    /// Opens (creating if absent) `<data_dir>/node.sqlite3` and migrates it.
    pub fn open_in(data_dir: &Path) -> Result<Store, StoreError> {
        Store::open_with(&data_dir.join(FILE_NAME), MIGRATIONS)
    }

    /// Opens `path` and applies `migrations` (tests pass their own).
    pub fn open_with(path: &Path, migrations: &[Migration]) -> Result<Store, StoreError> {
        let label = path.display().to_string();
        let open_err = |source| StoreError::Open {
            path: label.clone(),
            source,
        };
        let mut conn = Connection::open(path).map_err(open_err)?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(open_err)?;
        // WAL: readers never wait for the writer. NORMAL sync is durable
        // across a process crash; the stream, not this file, is what must
        // survive a machine crash.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(open_err)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(open_err)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(open_err)?;
        let version = migrate(&mut conn, &label, migrations)?;
        memory::register(&conn).map_err(open_err)?;
        // Checkpoints run on a thread of their own (see [`Checkpointer`]);
        // the connection's own only past a WAL of `WAL_BACKSTOP_PAGES`.
        conn.pragma_update(None, "wal_autocheckpoint", WAL_BACKSTOP_PAGES)
            .map_err(open_err)?;
        let checkpointer = Checkpointer::start(path)?;
        Ok(Store {
            conn: Mutex::new(conn),
            path: path.to_path_buf(),
            version,
            _checkpointer: checkpointer,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version the file is at.
    pub fn schema_version(&self) -> u32 {
        self.version
    }

    /// The first column of every row `sql` answers (tests read with it).
    #[cfg(test)]
    pub(crate) fn column<T: rusqlite::types::FromSql>(&self, sql: &str) -> Vec<T> {
        let conn = self.conn();
        let mut stmt = conn.prepare(sql).unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite half-written
        // (every write is one statement or one transaction), so go on.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Applies every migration above the file's version in one transaction.
fn migrate(conn: &mut Connection, path: &str, migrations: &[Migration]) -> Result<u32, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (
             version    INTEGER PRIMARY KEY,
             name       TEXT    NOT NULL,
             applied_ms INTEGER NOT NULL
         )",
    )?;
    let found: u32 = tx
        .query_row("SELECT MAX(version) FROM schema_version", [], |r| {
            r.get::<_, Option<u32>>(0)
        })?
        .unwrap_or(0);
    let supported = migrations.last().map_or(0, |m| m.version);
    if found > supported {
        return Err(StoreError::NewerSchema {
            path: path.to_owned(),
            found,
            supported,
        });
    }
    for m in migrations.iter().filter(|m| m.version <= found) {
        let recorded: Option<String> = tx
            .query_row(
                "SELECT name FROM schema_version WHERE version = ?1",
                [m.version],
                |r| r.get(0),
            )
            .optional()?;
        if recorded.as_deref() != Some(m.name) {
            return Err(StoreError::ForeignHistory {
                path: path.to_owned(),
                version: m.version,
                found: recorded.unwrap_or_else(|| "nothing".into()),
                expected: m.name.to_owned(),
            });
        }
    }
    let now = now_ms();
    for m in migrations.iter().filter(|m| m.version > found) {
        let failed = |source| StoreError::Migration {
            path: path.to_owned(),
            version: m.version,
            name: m.name.to_owned(),
            source,
        };
        tx.execute_batch(m.sql).map_err(failed)?;
        tx.execute(
            "INSERT INTO schema_version (version, name, applied_ms) VALUES (?1, ?2, ?3)",
            rusqlite::params![m.version, m.name, now],
        )
        .map_err(failed)?;
    }
    tx.commit()?;
    Ok(supported.max(found))
}

pub(crate) use crewlet_os::now_ms;

#[cfg(test)]
mod tests {
    use super::*;

    fn tables(store: &Store) -> Vec<String> {
        store.column("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
    }

    #[test]
    fn embedded_migrations_are_numbered_and_create_every_table() {
        assert!(!MIGRATIONS.is_empty());
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_in(dir.path()).unwrap();
        assert_eq!(store.schema_version(), MIGRATIONS.len() as u32);
        let t = tables(&store);
        for expected in [
            "agent_diary",
            "agent_onboarding_markers",
            "company_revisions",
            "conversation_sessions",
            "counterparty_profiles",
            "custody_unsettled",
            "episodes",
            "event_parties",
            "events",
            "memory_change_sequence",
            "pending_secrets",
            "scheduled_runs",
            "schema_version",
            "synthesized_skill_versions",
            "synthesized_skills",
        ] {
            assert!(t.contains(&expected.to_owned()), "{expected} in {t:?}");
        }
        let mode: String = store
            .conn()
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        drop(store);
        // Reopening applies nothing and keeps the version.
        let again = Store::open_in(dir.path()).unwrap();
        assert_eq!(again.schema_version(), MIGRATIONS.len() as u32);
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let newer: Vec<Migration> = MIGRATIONS
            .iter()
            .copied()
            .chain([Migration {
                version: MIGRATIONS.len() as u32 + 1,
                name: "from_the_future",
                sql: "CREATE TABLE future (x INTEGER)",
            }])
            .collect();
        drop(Store::open_with(&path, &newer).unwrap());
        let err = Store::open_with(&path, MIGRATIONS).err().unwrap();
        assert!(
            matches!(err, StoreError::NewerSchema { found, supported, .. }
            if found == supported + 1),
            "{err}"
        );
        assert!(err.to_string().contains("newer crewlet"), "{err}");
    }

    #[test]
    fn a_failed_migration_leaves_the_file_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let first = &MIGRATIONS[..1];
        {
            // A row in the first schema's shape (this build's appends
            // write the columns later migrations add).
            let store = Store::open_with(&path, first).unwrap();
            store
                .conn()
                .execute(
                    "INSERT INTO events (event_id, type, at_ms, node_id, payload)
                     VALUES ('e1', 'probe', 0, 'n1', '{}')",
                    [],
                )
                .unwrap();
        }
        let broken: Vec<Migration> = MIGRATIONS
            .iter()
            .copied()
            .chain([Migration {
                version: MIGRATIONS.len() as u32 + 1,
                name: "broken",
                sql: "CREATE TABLE half (x INTEGER); THIS IS NOT SQL;",
            }])
            .collect();
        let err = Store::open_with(&path, &broken).err().unwrap();
        assert!(
            matches!(&err, StoreError::Migration { name, .. } if name == "broken"),
            "{err}"
        );
        // Nothing of migrations 2.. nor of the broken one landed.
        let store = Store::open_with(&path, first).unwrap();
        assert_eq!(store.schema_version(), 1);
        let t = tables(&store);
        assert!(!t.contains(&"half".to_owned()), "{t:?}");
        assert!(!t.contains(&"conversation_sessions".to_owned()), "{t:?}");
        let rows: i64 = store
            .conn()
            .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 1);
    }

    #[test]
    fn the_wal_is_copied_back_by_the_checkpointer_not_by_commits() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_in(dir.path()).unwrap();
        let main_len = || std::fs::metadata(store.path()).unwrap().len();
        let wal = dir.path().join(format!("{FILE_NAME}-wal"));
        // Let the checkpointer copy the migrations back first.
        std::thread::sleep(CHECKPOINT_EVERY * 3);
        let before = main_len();
        let rows: Vec<EventRecord> = (0..2_000)
            .map(|i| {
                EventRecord::new(
                    format!("e{i:05}"),
                    "probe",
                    "n1",
                    serde_json::json!({ "pad": "x".repeat(200) }),
                )
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        for chunk in rows.chunks(50) {
            store.append_events(chunk).unwrap();
        }
        assert!(std::fs::metadata(&wal).unwrap().len() > 400_000);
        while main_len() <= before + 400_000 {
            assert!(
                std::time::Instant::now() < deadline,
                "the database file never grew: nothing checkpointed the WAL"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_foreign_history_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let other = [Migration {
            version: 1,
            name: "someone_else",
            sql: "CREATE TABLE x (y INTEGER)",
        }];
        drop(Store::open_with(&path, &other).unwrap());
        let err = Store::open_with(&path, MIGRATIONS).err().unwrap();
        assert!(matches!(err, StoreError::ForeignHistory { .. }), "{err}");
    }
}
