//! The event log: what this node published, and who each event concerns.

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::{Store, StoreError};

/// Someone an event concerns, and how (`seat`, `mentioned`, `author`, …).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Party {
    pub party: String,
    pub role: String,
}

/// One row of the event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// Position in this node's log; assigned on append.
    #[serde(default)]
    pub seq: i64,
    pub event_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub at_ms: i64,
    pub node_id: String,
    pub trace_id: Option<String>,
    pub seat: Option<String>,
    pub conversation: Option<String>,
    pub payload: serde_json::Value,
    #[serde(default)]
    pub parties: Vec<Party>,
}

impl EventRecord {
    pub fn new(
        event_id: impl Into<String>,
        kind: impl Into<String>,
        node_id: impl Into<String>,
        payload: serde_json::Value,
    ) -> EventRecord {
        EventRecord {
            seq: 0,
            event_id: event_id.into(),
            kind: kind.into(),
            at_ms: crate::now_ms(),
            node_id: node_id.into(),
            trace_id: None,
            seat: None,
            conversation: None,
            payload,
            parties: Vec::new(),
        }
    }
}

/// A read of the log, newest first.
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    pub seat: Option<String>,
    pub kind: Option<String>,
    pub party: Option<String>,
    pub trace_id: Option<String>,
    /// Only events with `seq` below this (paging backwards).
    pub before_seq: Option<i64>,
    /// At most this many; 0 means the default of 100. Capped at 1,000.
    pub limit: usize,
}

fn append_in(tx: &rusqlite::Transaction<'_>, event: &EventRecord) -> Result<i64, StoreError> {
    // Cached statements: the SQL is parsed once per connection, not per row.
    let inserted = tx
        .prepare_cached(
            "INSERT INTO events (event_id, type, at_ms, node_id, trace_id, seat, conversation, payload)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             ON CONFLICT (event_id) DO NOTHING",
        )?
        .execute(params![
            event.event_id,
            event.kind,
            event.at_ms,
            event.node_id,
            event.trace_id,
            event.seat,
            event.conversation,
            event.payload.to_string(),
        ])?;
    let seq: i64 = tx
        .prepare_cached("SELECT seq FROM events WHERE event_id = ?1")?
        .query_row([&event.event_id], |r| r.get(0))?;
    if inserted == 1 {
        let mut stmt = tx.prepare_cached(
            "INSERT OR IGNORE INTO event_parties (party, role, seq) VALUES (?1, ?2, ?3)",
        )?;
        for p in &event.parties {
            stmt.execute(params![p.party, p.role, seq])?;
        }
    }
    Ok(seq)
}

impl Store {
    /// Appends `event` with its parties; answers its `seq`. Appending an
    /// event id already in the log changes nothing and answers the existing
    /// row's `seq`, so a publisher may retry.
    pub fn append_event(&self, event: &EventRecord) -> Result<i64, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let seq = append_in(&tx, event)?;
        tx.commit()?;
        Ok(seq)
    }

    /// Appends `events` in one transaction (a group commit: one WAL sync
    /// for the lot); answers their `seq`s in order. All or nothing.
    pub fn append_events(&self, events: &[EventRecord]) -> Result<Vec<i64>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let seqs = events
            .iter()
            .map(|e| append_in(&tx, e))
            .collect::<Result<Vec<_>, _>>()?;
        tx.commit()?;
        Ok(seqs)
    }

    /// Reads the log, newest first.
    pub fn events(&self, q: &EventQuery) -> Result<Vec<EventRecord>, StoreError> {
        let limit = match q.limit {
            0 => 100,
            n => n.min(1_000),
        } as i64;
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT e.seq, e.event_id, e.type, e.at_ms, e.node_id, e.trace_id, e.seat,
                    e.conversation, e.payload
               FROM events e
              WHERE (?1 IS NULL OR e.seat = ?1)
                AND (?2 IS NULL OR e.type = ?2)
                AND (?3 IS NULL OR e.seq IN (SELECT seq FROM event_parties WHERE party = ?3))
                AND (?4 IS NULL OR e.trace_id = ?4)
                AND (?5 IS NULL OR e.seq < ?5)
              ORDER BY e.seq DESC
              LIMIT ?6",
        )?;
        let rows = stmt.query_map(
            params![q.seat, q.kind, q.party, q.trace_id, q.before_seq, limit],
            |r| {
                Ok((
                    EventRecord {
                        seq: r.get(0)?,
                        event_id: r.get(1)?,
                        kind: r.get(2)?,
                        at_ms: r.get(3)?,
                        node_id: r.get(4)?,
                        trace_id: r.get(5)?,
                        seat: r.get(6)?,
                        conversation: r.get(7)?,
                        payload: serde_json::Value::Null,
                        parties: Vec::new(),
                    },
                    r.get::<_, String>(8)?,
                ))
            },
        )?;
        let mut parties = conn.prepare_cached(
            "SELECT party, role FROM event_parties WHERE seq = ?1 ORDER BY party, role",
        )?;
        let mut out = Vec::new();
        for row in rows {
            let (mut event, payload) = row?;
            event.payload = serde_json::from_str(&payload)?;
            event.parties = parties
                .query_map([event.seq], |r| {
                    Ok(Party {
                        party: r.get(0)?,
                        role: r.get(1)?,
                    })
                })?
                .collect::<Result<_, _>>()?;
            out.push(event);
        }
        Ok(out)
    }

    /// One event by id.
    pub fn event(&self, event_id: &str) -> Result<Option<EventRecord>, StoreError> {
        let seq: Option<i64> = self
            .conn()
            .query_row(
                "SELECT seq FROM events WHERE event_id = ?1",
                [event_id],
                |r| r.get(0),
            )
            .optional()?;
        match seq {
            None => Ok(None),
            Some(seq) => Ok(self
                .events(&EventQuery {
                    before_seq: Some(seq + 1),
                    limit: 1,
                    ..EventQuery::default()
                })?
                .pop()),
        }
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

    #[test]
    fn a_group_commit_appends_in_order_and_is_all_or_nothing() {
        let (_d, s) = store();
        let first = s
            .append_event(&EventRecord::new("x", "wake", "n1", serde_json::json!({})))
            .unwrap();
        let batch: Vec<EventRecord> = ["p", "q", "x"]
            .iter()
            .map(|id| EventRecord::new(*id, "wake", "n1", serde_json::json!({})))
            .collect();
        let seqs = s.append_events(&batch).unwrap();
        assert!(seqs[0] > first && seqs[1] > seqs[0], "{seqs:?}");
        assert_eq!(seqs[2], first, "a row already there answers its own seq");
        // A bad row fails the whole batch: nothing of it is written.
        s.conn()
            .execute_batch(
                "CREATE TEMP TRIGGER refuse_r BEFORE INSERT ON events WHEN NEW.event_id = 'r'
                 BEGIN SELECT RAISE(ABORT, 'refused'); END;",
            )
            .unwrap();
        let broken: Vec<EventRecord> = ["s", "r"]
            .iter()
            .map(|id| EventRecord::new(*id, "wake", "n1", serde_json::json!({})))
            .collect();
        assert!(s.append_events(&broken).is_err());
        let ids: Vec<String> = s
            .events(&EventQuery::default())
            .unwrap()
            .into_iter()
            .map(|e| e.event_id)
            .collect();
        assert!(!ids.contains(&"s".to_owned()), "{ids:?}");
    }

    #[test]
    fn append_is_idempotent_per_event_id_and_reads_back_newest_first() {
        let (_d, s) = store();
        let mut a = EventRecord::new("a", "webhook_received", "n1", serde_json::json!({"x": 1}));
        a.trace_id = Some("t1".into());
        a.parties = vec![
            Party {
                party: "ada".into(),
                role: "mentioned".into(),
            },
            Party {
                party: "octocat".into(),
                role: "author".into(),
            },
        ];
        let mut b = EventRecord::new("b", "wake", "n1", serde_json::json!({"y": 2}));
        b.seat = Some("ada".into());
        let sa = s.append_event(&a).unwrap();
        let sb = s.append_event(&b).unwrap();
        assert_eq!(
            s.append_event(&a).unwrap(),
            sa,
            "a retry answers the same row"
        );
        assert!(sb > sa);

        let all = s.events(&EventQuery::default()).unwrap();
        assert_eq!(
            all.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>(),
            ["b", "a"]
        );
        assert_eq!(all[1].parties.len(), 2);
        assert_eq!(all[1].payload["x"], 1);

        let by_party = s
            .events(&EventQuery {
                party: Some("ada".into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(by_party.len(), 1);
        assert_eq!(by_party[0].event_id, "a");
        let by_seat = s
            .events(&EventQuery {
                seat: Some("ada".into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(by_seat[0].event_id, "b");
        let by_type = s
            .events(&EventQuery {
                kind: Some("wake".into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(by_type.len(), 1);
        let by_trace = s
            .events(&EventQuery {
                trace_id: Some("t1".into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(by_trace[0].event_id, "a");
        let page = s
            .events(&EventQuery {
                before_seq: Some(sb),
                limit: 1,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(page[0].event_id, "a");
        assert_eq!(s.event("b").unwrap().unwrap().seat.as_deref(), Some("ada"));
        assert!(s.event("zzz").unwrap().is_none());
    }
}
