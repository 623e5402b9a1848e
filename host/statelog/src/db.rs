//! Opening one of the crate's two files: WAL, its schema applied once in one
//! transaction, keyed by SQLite's `user_version` (each file has one schema
//! script today; a later change appends a script and bumps the version).

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use crate::EstateError;

/// Opens `path` for writing, creating and migrating it.
pub(crate) fn open_rw(path: &Path, schema: &str) -> Result<Connection, EstateError> {
    let err = |source| EstateError::Open {
        path: path.display().to_string(),
        source,
    };
    let mut conn = Connection::open(path).map_err(err)?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(err)?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(err)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(err)?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(err)?;
    if version == 0 {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        tx.execute_batch(schema).map_err(err)?;
        tx.pragma_update(None, "user_version", 1).map_err(err)?;
        tx.commit().map_err(err)?;
    } else if version > 1 {
        return Err(EstateError::Newer {
            path: path.display().to_string(),
            version,
        });
    }
    Ok(conn)
}

/// Opens `path` read-only: SQLite itself refuses a write through it.
pub(crate) fn open_ro(path: &Path) -> Result<Connection, EstateError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| EstateError::Open {
        path: path.display().to_string(),
        source,
    })?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(|source| EstateError::Open {
            path: path.display().to_string(),
            source,
        })?;
    Ok(conn)
}
