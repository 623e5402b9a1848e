//! The event log as the usage publisher reads it: the usage kinds one node
//! published, after a position, oldest first, in pages. A data node's log
//! also keeps the events of nodes without `data` (custody); those are
//! their publishers' usage, not this node's.

use rusqlite::params;

use crate::{Store, StoreError};

/// One event the usage tally counts.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageRead {
    pub seq: i64,
    pub kind: String,
    pub at_ms: i64,
    pub seat: Option<String>,
    pub payload: serde_json::Value,
}

impl Store {
    /// Up to `limit` events of `kinds` that `node` published, after
    /// `after_seq` and at or after `since_ms`, oldest first.
    pub fn usage_events(
        &self,
        node: &str,
        kinds: &[&str],
        after_seq: i64,
        since_ms: i64,
        limit: usize,
    ) -> Result<Vec<UsageRead>, StoreError> {
        let list = serde_json::to_string(kinds)?;
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT seq, type, at_ms, seat, payload FROM events
              WHERE seq > ?1 AND at_ms >= ?2 AND type IN (SELECT value FROM json_each(?3))
                AND node_id = ?5
              ORDER BY seq LIMIT ?4",
        )?;
        let rows = stmt.query_map(
            params![after_seq, since_ms, list, limit as i64, node],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, Option<String>>(3)?,
                    r.get::<_, String>(4)?,
                ))
            },
        )?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, kind, at_ms, seat, payload) = row?;
            out.push(UsageRead {
                seq,
                kind,
                at_ms,
                seat,
                payload: serde_json::from_str(&payload)?,
            });
        }
        Ok(out)
    }
}
