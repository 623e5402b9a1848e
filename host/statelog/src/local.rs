//! This node's own observations of the logs, in `statelog-local.sqlite3`
//! beside the estate: the stream identities it saw, the divergences it
//! found, the snapshots it adopted. A file of their own because none of it
//! may travel inside a snapshot (a donor's observations are not this
//! node's) and an adoption replaces the estate whole.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use crate::{EstateError, db};

/// The file's name, in the node's data dir.
pub const LOCAL_FILE: &str = "statelog-local.sqlite3";
const SCHEMA: &str = include_str!("../migrations/local.sql");

/// A finding that a domain's log diverged from this node's rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diverged {
    pub domain: String,
    pub stream: String,
    pub position: u64,
    /// What was found, in words.
    pub found: String,
    pub found_ms: i64,
}

/// The node's observations file.
pub struct Local {
    conn: Mutex<Connection>,
}

impl Local {
    pub fn open_in(data_dir: &Path) -> Result<Local, EstateError> {
        Ok(Local {
            conn: Mutex::new(db::open_rw(&data_dir.join(LOCAL_FILE), &[SCHEMA])?),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The identity this node last saw of `stream`.
    pub fn identity(&self, stream: &str) -> Result<Option<String>, EstateError> {
        Ok(self
            .lock()
            .query_row(
                "SELECT identity FROM stream_identity WHERE stream = ?1",
                [stream],
                |r| r.get(0),
            )
            .optional()?)
    }

    pub fn see_identity(&self, stream: &str, identity: &str) -> Result<(), EstateError> {
        self.lock().execute(
            "INSERT OR REPLACE INTO stream_identity (stream, identity, seen_ms) VALUES (?1, ?2, ?3)",
            params![stream, identity, crewlet_os::now_ms()],
        )?;
        Ok(())
    }

    /// The standing divergence of `domain`, if any.
    pub fn diverged(&self, domain: &str) -> Result<Option<Diverged>, EstateError> {
        Ok(self
            .lock()
            .query_row(
                "SELECT domain, stream, position, found, found_ms FROM statelog_diverged WHERE domain = ?1",
                [domain],
                |r| {
                    Ok(Diverged {
                        domain: r.get(0)?,
                        stream: r.get(1)?,
                        position: r.get::<_, i64>(2)? as u64,
                        found: r.get(3)?,
                        found_ms: r.get(4)?,
                    })
                },
            )
            .optional()?)
    }

    pub fn record_diverged(&self, d: &Diverged) -> Result<(), EstateError> {
        self.lock().execute(
            "INSERT OR REPLACE INTO statelog_diverged (domain, stream, position, found, found_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![d.domain, d.stream, d.position as i64, d.found, d.found_ms],
        )?;
        Ok(())
    }

    /// Ends every standing divergence (an adopted snapshot replaced the
    /// rows it was about) and forgets the identities seen, so the next pass
    /// records the log the new rows came from.
    pub fn clear_after_adoption(&self) -> Result<(), EstateError> {
        self.lock()
            .execute_batch("DELETE FROM statelog_diverged; DELETE FROM stream_identity;")?;
        Ok(())
    }

    /// Records an adoption that began; answers its id.
    pub fn adoption_began(
        &self,
        donor: &str,
        sha256: &str,
        bytes: u64,
    ) -> Result<i64, EstateError> {
        let conn = self.lock();
        conn.execute(
            "INSERT INTO statelog_adoption (donor, sha256, bytes, positions, began_ms, outcome)
             VALUES (?1, ?2, ?3, '{}', ?4, 'began')",
            params![donor, sha256, bytes as i64, crewlet_os::now_ms()],
        )?;
        Ok(conn.last_insert_rowid())
    }

    /// Records how adoption `id` ended (`installed`, or why not).
    pub fn adoption_ended(
        &self,
        id: i64,
        outcome: &str,
        positions: &str,
    ) -> Result<(), EstateError> {
        self.lock().execute(
            "UPDATE statelog_adoption SET ended_ms = ?2, outcome = ?3, positions = ?4 WHERE id = ?1",
            params![id, crewlet_os::now_ms(), outcome, positions],
        )?;
        Ok(())
    }

    /// Every adoption's outcome, oldest first.
    pub fn adoptions(&self) -> Result<Vec<(String, String)>, EstateError> {
        let conn = self.lock();
        let mut stmt = conn.prepare("SELECT donor, outcome FROM statelog_adoption ORDER BY id")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
