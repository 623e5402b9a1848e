//! Opening one of the crate's two files: WAL, its schema applied once in one
//! transaction, keyed by SQLite's `user_version`: a file's scripts are a
//! list, version N having run the first N; a later change appends one.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use crate::EstateError;

/// Opens `path` for writing, creating it and running the `scripts` it has
/// not run yet, each in a transaction of its own with the version it sets.
pub(crate) fn open_rw(path: &Path, scripts: &[&str]) -> Result<Connection, EstateError> {
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
    if version > scripts.len() as i64 {
        return Err(EstateError::Newer {
            path: path.display().to_string(),
            version,
        });
    }
    for (done, script) in scripts.iter().enumerate().skip(version.max(0) as usize) {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        tx.execute_batch(script).map_err(err)?;
        tx.pragma_update(None, "user_version", done as i64 + 1)
            .map_err(err)?;
        tx.commit().map_err(err)?;
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
