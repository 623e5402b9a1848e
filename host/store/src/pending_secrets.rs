//! Secrets set while the node was stopped (`pending_secrets`).
//!
//! Rule: a row holds a sealed record, never a value (the caller seals it
//! with the node's keyring before it gets here); it waits only until the
//! node's next start moves it onto the fleet's secrets bucket. Deleting a
//! row names the record it moved, so a newer `secrets set` made between the
//! move and the delete is kept for the next start.

use rusqlite::params;

use crate::{Store, StoreError};

/// One secret waiting to be moved onto the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingSecret {
    pub name: String,
    /// The sealed record, as the secrets bucket will hold it.
    pub record: String,
    pub set_ms: i64,
}

impl Store {
    /// Keeps `record` (sealed) for `name` until the next start; a second set
    /// of the same name replaces the first.
    pub fn put_pending_secret(&self, name: &str, record: &str) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT INTO pending_secrets (name, record, set_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT (name) DO UPDATE SET record = excluded.record, set_ms = excluded.set_ms",
            params![name, record, crate::now_ms()],
        )?;
        Ok(())
    }

    /// Every waiting secret, by name.
    pub fn pending_secrets(&self) -> Result<Vec<PendingSecret>, StoreError> {
        let conn = self.conn();
        let mut stmt =
            conn.prepare("SELECT name, record, set_ms FROM pending_secrets ORDER BY name")?;
        let rows = stmt.query_map([], |r| {
            Ok(PendingSecret {
                name: r.get(0)?,
                record: r.get(1)?,
                set_ms: r.get(2)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Deletes the row of `name` if it still holds `record`. Answers whether
    /// it did.
    pub fn delete_pending_secret(&self, name: &str, record: &str) -> Result<bool, StoreError> {
        let n = self.conn().execute(
            "DELETE FROM pending_secrets WHERE name = ?1 AND record = ?2",
            params![name, record],
        )?;
        Ok(n == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_secret_is_kept_replaced_and_deleted_only_as_moved() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_in(dir.path()).unwrap();
        assert!(store.pending_secrets().unwrap().is_empty());
        store.put_pending_secret("A", "{\"sealed\":1}").unwrap();
        store.put_pending_secret("A", "{\"sealed\":2}").unwrap();
        store.put_pending_secret("B", "{\"sealed\":3}").unwrap();
        let rows = store.pending_secrets().unwrap();
        assert_eq!(
            rows.iter()
                .map(|r| (r.name.as_str(), r.record.as_str()))
                .collect::<Vec<_>>(),
            [("A", "{\"sealed\":2}"), ("B", "{\"sealed\":3}")]
        );
        assert!(
            !store.delete_pending_secret("A", "{\"sealed\":1}").unwrap(),
            "replaced since"
        );
        assert!(store.delete_pending_secret("A", "{\"sealed\":2}").unwrap());
        drop(store);
        let again = Store::open_in(dir.path()).unwrap();
        assert_eq!(
            again.pending_secrets().unwrap().len(),
            1,
            "rows survive a restart"
        );
    }
}
