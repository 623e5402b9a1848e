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
    /// Only events this node published (a data node's log also keeps the
    /// events of nodes without `data`).
    pub node_id: Option<String>,
    /// Only events with `seq` below this (paging backwards).
    pub before_seq: Option<i64>,
    /// At most this many; 0 means the default of 100. Capped at 1,000.
    pub limit: usize,
}

/// Appends one row; `batch` names the custody batch it is kept from (none
/// for this node's own events). Answers the row's `seq`, and whether this
/// call wrote it.
pub(crate) fn append_in(
    tx: &rusqlite::Transaction<'_>,
    event: &EventRecord,
    batch: Option<&str>,
) -> Result<(i64, bool), StoreError> {
    // Cached statements: the SQL is parsed once per connection, not per row.
    let inserted = tx
        .prepare_cached(
            "INSERT INTO events (event_id, type, at_ms, node_id, trace_id, seat, conversation, payload, parties, custody_batch)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
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
            serde_json::to_string(&event.parties)?,
            batch,
        ])?;
    if inserted == 0 {
        // Already in the log (a retried append): its row stands as it was.
        let seq = tx
            .prepare_cached("SELECT seq FROM events WHERE event_id = ?1")?
            .query_row([&event.event_id], |r| r.get(0))?;
        return Ok((seq, false));
    }
    let seq = tx.last_insert_rowid();
    let mut stmt = tx.prepare_cached(
        "INSERT OR IGNORE INTO event_parties (party, role, seq) VALUES (?1, ?2, ?3)",
    )?;
    for p in &event.parties {
        stmt.execute(params![p.party, p.role, seq])?;
    }
    Ok((seq, true))
}

/// The `WHERE` clause of a read: only the filters asked for, so the planner
/// can pick the index each one has (a `?1 IS NULL OR …` form defeats it).
fn read_sql(q: &EventQuery) -> String {
    let mut sql = String::from(
        "SELECT seq, event_id, type, at_ms, node_id, trace_id, seat, conversation, payload, parties
           FROM events WHERE 1",
    );
    for (present, clause) in [
        (q.seat.is_some(), " AND seat = :seat"),
        (q.kind.is_some(), " AND type = :kind"),
        (
            q.party.is_some(),
            " AND seq IN (SELECT seq FROM event_parties WHERE party = :party)",
        ),
        (q.trace_id.is_some(), " AND trace_id = :trace"),
        (q.node_id.is_some(), " AND node_id = :node"),
        (q.before_seq.is_some(), " AND seq < :before"),
    ] {
        if present {
            sql.push_str(clause);
        }
    }
    sql.push_str(" ORDER BY seq DESC LIMIT :limit");
    sql
}

impl Store {
    /// Appends `event` with its parties; answers its `seq`. Appending an
    /// event id already in the log changes nothing and answers the existing
    /// row's `seq`, so a publisher may retry.
    pub fn append_event(&self, event: &EventRecord) -> Result<i64, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let (seq, _) = append_in(&tx, event, None)?;
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
            .map(|e| append_in(&tx, e, None).map(|(seq, _)| seq))
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
        let mut stmt = conn.prepare_cached(&read_sql(q))?;
        let mut named: Vec<(&str, &dyn rusqlite::ToSql)> = vec![(":limit", &limit)];
        for (name, value) in [
            (":seat", q.seat.as_ref()),
            (":kind", q.kind.as_ref()),
            (":party", q.party.as_ref()),
            (":trace", q.trace_id.as_ref()),
            (":node", q.node_id.as_ref()),
        ] {
            if let Some(v) = value {
                named.push((name, v));
            }
        }
        if let Some(before) = &q.before_seq {
            named.push((":before", before));
        }
        let rows = stmt.query_map(named.as_slice(), |r| {
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
                r.get::<_, String>(9)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (mut event, payload, parties) = row?;
            event.payload = serde_json::from_str(&payload)?;
            event.parties = serde_json::from_str(&parties)?;
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

    #[test]
    fn each_filter_reads_through_its_index() {
        let (_d, s) = store();
        let plan = |q: &EventQuery| -> String {
            let conn = s.conn();
            let mut stmt = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {}", read_sql(q)))
                .unwrap();
            let mut rows = stmt.raw_query();
            let mut out = Vec::new();
            while let Some(r) = rows.next().unwrap() {
                out.push(r.get::<_, String>(3).unwrap());
            }
            out.join("; ")
        };
        let q = |f: fn(&mut EventQuery)| {
            let mut q = EventQuery::default();
            f(&mut q);
            q
        };
        for (query, index) in [
            (q(|q| q.kind = Some("wake".into())), "events_type"),
            (q(|q| q.seat = Some("ada".into())), "events_seat"),
            (q(|q| q.trace_id = Some("t".into())), "events_trace"),
            (q(|q| q.party = Some("seat:ada".into())), "event_parties"),
        ] {
            let plan = plan(&query);
            assert!(plan.contains(index), "{query:?}: {plan}");
        }
    }

    #[test]
    fn the_parties_column_is_filled_for_rows_written_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(crate::FILE_NAME);
        let before: Vec<crate::Migration> = crate::MIGRATIONS
            .iter()
            .copied()
            .take_while(|m| m.name != "event_log_reads")
            .collect();
        assert_eq!(crate::MIGRATIONS[before.len()].name, "event_log_reads");
        {
            let old = Store::open_with(&path, &before).unwrap();
            old.conn()
                .execute_batch(
                    "INSERT INTO events (seq, event_id, type, at_ms, node_id, payload)
                     VALUES (1, 'e1', 'wake', 0, 'n1', '{}'), (2, 'e2', 'wake', 0, 'n1', '{}');
                     INSERT INTO event_parties (party, role, seq)
                     VALUES ('seat:ada', 'woken', 1), ('person:bo', 'author', 1);",
                )
                .unwrap();
        }
        let s = Store::open_with(&path, crate::MIGRATIONS).unwrap();
        let rows = s.events(&EventQuery::default()).unwrap();
        assert_eq!(rows[1].event_id, "e1");
        assert_eq!(
            rows[1].parties,
            vec![
                Party {
                    party: "person:bo".into(),
                    role: "author".into()
                },
                Party {
                    party: "seat:ada".into(),
                    role: "woken".into()
                },
            ]
        );
        assert!(rows[0].parties.is_empty());
        let by_party = s
            .events(&EventQuery {
                party: Some("seat:ada".into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(by_party.len(), 1);
    }
}
