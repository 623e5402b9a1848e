//! Company revisions this node has seen (`company_revisions`).
//!
//! Rule: the fleet agrees on the active revision through the config pointer
//! in the coordination store; this table is this node's copy of what it
//! applied, and at most one row is marked active. A revision applied through
//! the pointer is stored under its epoch (a positive number). An offline
//! `crewlet config import` has no epoch yet — nothing was running to move the
//! pointer — so it is stored under a negative number and marked active: the
//! node publishes it through the pointer when it next starts. Why: a stopped
//! node cannot move the fleet's pointer, but an operator's import must not be
//! lost, and a negative revision can never collide with an epoch.

use crewlet_os::ConfigEpoch;
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use crate::{Store, StoreError};

/// One row of `company_revisions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Revision {
    /// The epoch it was applied at; negative while it waits to be published.
    pub revision: i64,
    /// SHA-256 of the document, hex.
    pub digest: String,
    pub document: String,
    pub imported_ms: i64,
    pub source: Option<String>,
    pub active: bool,
}

impl Revision {
    /// True for an offline import not yet activated through the pointer.
    pub fn is_pending(&self) -> bool {
        self.revision < 0
    }
}

const COLUMNS: &str = "revision, digest, document, imported_ms, source, active";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Revision> {
    Ok(Revision {
        revision: r.get(0)?,
        digest: r.get(1)?,
        document: r.get(2)?,
        imported_ms: r.get(3)?,
        source: r.get(4)?,
        active: r.get::<_, i64>(5)? == 1,
    })
}

impl Store {
    /// Records that this node applied `document` at `epoch` (from the
    /// pointer) and marks it the one active revision.
    pub fn record_applied(
        &self,
        epoch: ConfigEpoch,
        digest: &str,
        document: &str,
        source: Option<&str>,
    ) -> Result<(), StoreError> {
        let epoch = i64::try_from(epoch.get()).unwrap_or(i64::MAX);
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "UPDATE company_revisions SET active = 0 WHERE active = 1",
            [],
        )?;
        tx.execute(
            "INSERT INTO company_revisions (revision, digest, document, imported_ms, source, active)
             VALUES (?1, ?2, ?3, ?4, ?5, 1)
             ON CONFLICT (revision) DO UPDATE SET
                 digest = excluded.digest, document = excluded.document,
                 imported_ms = excluded.imported_ms, source = excluded.source, active = 1",
            params![epoch, digest, document, crate::now_ms(), source],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// An offline import: stores `document` under the next negative revision
    /// and marks it active, to be published through the pointer at the next
    /// start. Returns the revision it was stored under.
    pub fn import_pending(
        &self,
        digest: &str,
        document: &str,
        source: Option<&str>,
    ) -> Result<i64, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let lowest: i64 = tx.query_row(
            "SELECT COALESCE(MIN(revision), 0) FROM company_revisions",
            [],
            |r| r.get(0),
        )?;
        let revision = lowest.min(0) - 1;
        tx.execute(
            "UPDATE company_revisions SET active = 0 WHERE active = 1",
            [],
        )?;
        tx.execute(
            "INSERT INTO company_revisions (revision, digest, document, imported_ms, source, active)
             VALUES (?1, ?2, ?3, ?4, ?5, 1)",
            params![revision, digest, document, crate::now_ms(), source],
        )?;
        tx.commit()?;
        Ok(revision)
    }

    /// The revision marked active, if any.
    pub fn active_revision(&self) -> Result<Option<Revision>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                &format!("SELECT {COLUMNS} FROM company_revisions WHERE active = 1"),
                [],
                row,
            )
            .optional()?)
    }

    /// Every revision this node holds, highest epoch first (pending imports,
    /// being negative, last).
    pub fn revisions(&self) -> Result<Vec<Revision>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {COLUMNS} FROM company_revisions ORDER BY revision DESC"
        ))?;
        let rows = stmt.query_map([], row)?.collect::<Result<_, _>>()?;
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use crewlet_os::ConfigEpoch;

    use crate::Store;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_in(dir.path()).unwrap();
        (dir, store)
    }

    #[test]
    fn an_empty_store_has_no_active_revision() {
        let (_d, s) = store();
        assert_eq!(s.active_revision().unwrap(), None);
        assert!(s.revisions().unwrap().is_empty());
    }

    #[test]
    fn applying_a_newer_epoch_moves_the_one_active_mark() {
        let (_d, s) = store();
        s.record_applied(ConfigEpoch(3), "d3", "doc three", Some("pointer"))
            .unwrap();
        s.record_applied(ConfigEpoch(7), "d7", "doc seven", None)
            .unwrap();
        let active = s.active_revision().unwrap().unwrap();
        assert_eq!(
            (active.revision, active.digest.as_str()),
            (7, "d7"),
            "{active:?}"
        );
        assert!(!active.is_pending());
        let all = s.revisions().unwrap();
        assert_eq!(
            all.iter()
                .map(|r| (r.revision, r.active))
                .collect::<Vec<_>>(),
            [(7, true), (3, false)]
        );
        assert_eq!(all[1].source.as_deref(), Some("pointer"));
    }

    #[test]
    fn applying_the_same_epoch_again_replaces_it_in_place() {
        let (_d, s) = store();
        s.record_applied(ConfigEpoch(2), "a", "first", None)
            .unwrap();
        s.record_applied(ConfigEpoch(2), "a", "first", Some("again"))
            .unwrap();
        let all = s.revisions().unwrap();
        assert_eq!(all.len(), 1, "{all:?}");
        assert!(all[0].active);
        assert_eq!(all[0].source.as_deref(), Some("again"));
    }

    #[test]
    fn an_offline_import_is_pending_below_every_epoch_and_active() {
        let (_d, s) = store();
        s.record_applied(ConfigEpoch(5), "old", "applied", None)
            .unwrap();
        let first = s.import_pending("i1", "imported one", None).unwrap();
        let second = s.import_pending("i2", "imported two", None).unwrap();
        assert_eq!((first, second), (-1, -2));
        let active = s.active_revision().unwrap().unwrap();
        assert!(active.is_pending(), "{active:?}");
        assert_eq!(active.digest, "i2");
        assert_eq!(active.document, "imported two");
        // Publishing it through the pointer moves the mark to its epoch.
        s.record_applied(ConfigEpoch(6), "i2", "imported two", Some("import"))
            .unwrap();
        let active = s.active_revision().unwrap().unwrap();
        assert_eq!((active.revision, active.is_pending()), (6, false));
        assert_eq!(
            s.revisions().unwrap().iter().filter(|r| r.active).count(),
            1
        );
    }

    #[test]
    fn the_active_mark_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        Store::open_in(dir.path())
            .unwrap()
            .import_pending("d", "doc", Some("offline"))
            .unwrap();
        let again = Store::open_in(dir.path()).unwrap();
        let active = again.active_revision().unwrap().unwrap();
        assert_eq!((active.revision, active.digest.as_str()), (-1, "d"));
    }
}
