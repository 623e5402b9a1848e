//! What a seat already said in one conversation (`conversation_sessions`).
//!
//! Rule: a turn woken in a thread starts from what its seat said there
//! before, so a follow-up question is answered as a follow-up and a reply is
//! not composed again from nothing. The row is this node's copy: every row
//! written is also published to the seat's memory changelog
//! (`crewlet-memory`), and a node that acquires the seat applies the
//! changelog's rows here before the seat takes work ([`Store::apply_sessions`]:
//! the newer `updated_ms` wins, so a row this node wrote after the one the
//! changelog holds is kept).

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::{Store, StoreError};

/// How many of a seat's messages one session keeps (the newest).
pub const SESSION_KEEP: usize = 20;

pub use crewlet_os::Said;

/// A seat's session in one conversation.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Session {
    pub turns: i64,
    pub said: Vec<Said>,
}

/// One whole `conversation_sessions` row, as the memory changelog carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRow {
    pub seat: String,
    pub conversation: String,
    pub created_ms: i64,
    pub updated_ms: i64,
    pub turns: i64,
    pub said: Vec<Said>,
}

/// What applying a row from elsewhere did to this node's copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The row was written (new here, or newer than this node's).
    Written,
    /// This node's row is newer and was kept.
    KeptLocal,
}

impl Store {
    /// The whole row of `seat` in `conversation`, if there is one.
    pub fn session_row(
        &self,
        seat: &str,
        conversation: &str,
    ) -> Result<Option<SessionRow>, StoreError> {
        let row: Option<(i64, i64, i64, String)> = self
            .conn()
            .query_row(
                "SELECT created_ms, updated_ms, turns, said FROM conversation_sessions
                 WHERE seat = ?1 AND conversation = ?2",
                params![seat, conversation],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        row.map(|(created_ms, updated_ms, turns, said)| {
            Ok(SessionRow {
                seat: seat.to_owned(),
                conversation: conversation.to_owned(),
                created_ms,
                updated_ms,
                turns,
                said: serde_json::from_str(&said)?,
            })
        })
        .transpose()
    }

    /// Writes each row unless this node's row of the same seat and
    /// conversation was updated later (a tie is written: same content), all
    /// in one transaction; answers per row, in order.
    pub fn apply_sessions(&self, rows: &[SessionRow]) -> Result<Vec<Applied>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut out = Vec::with_capacity(rows.len());
        {
            let mut put = tx.prepare_cached(
                "INSERT INTO conversation_sessions (seat, conversation, created_ms, updated_ms, turns, said)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (seat, conversation)
                 DO UPDATE SET created_ms = ?3, updated_ms = ?4, turns = ?5, said = ?6
                 WHERE excluded.updated_ms >= conversation_sessions.updated_ms",
            )?;
            for row in rows {
                let changed = put.execute(params![
                    row.seat,
                    row.conversation,
                    row.created_ms,
                    row.updated_ms,
                    row.turns,
                    serde_json::to_string(&row.said)?
                ])?;
                out.push(if changed == 0 {
                    Applied::KeptLocal
                } else {
                    Applied::Written
                });
            }
        }
        tx.commit()?;
        Ok(out)
    }

    /// How many conversations `seat` has a session in on this node.
    pub fn session_count(&self, seat: &str) -> Result<u64, StoreError> {
        Ok(self.conn().query_row(
            "SELECT COUNT(*) FROM conversation_sessions WHERE seat = ?1",
            params![seat],
            |r| r.get::<_, i64>(0),
        )? as u64)
    }

    /// The session of `seat` in `conversation`; empty when there is none.
    pub fn session(&self, seat: &str, conversation: &str) -> Result<Session, StoreError> {
        let row: Option<(i64, String)> = self
            .conn()
            .query_row(
                "SELECT turns, said FROM conversation_sessions WHERE seat = ?1 AND conversation = ?2",
                params![seat, conversation],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        Ok(match row {
            None => Session::default(),
            Some((turns, said)) => Session {
                turns,
                said: serde_json::from_str(&said)?,
            },
        })
    }

    /// Records that a turn of `seat` ran in `conversation` and said `said`
    /// (possibly nothing); keeps the newest [`SESSION_KEEP`] messages.
    pub fn remember(
        &self,
        seat: &str,
        conversation: &str,
        said: &[Said],
        now_ms: i64,
    ) -> Result<Session, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let current: Option<(i64, String)> = tx
            .query_row(
                "SELECT turns, said FROM conversation_sessions WHERE seat = ?1 AND conversation = ?2",
                params![seat, conversation],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let mut session = match current {
            None => Session::default(),
            Some((turns, text)) => Session {
                turns,
                said: serde_json::from_str(&text)?,
            },
        };
        session.turns += 1;
        session.said.extend_from_slice(said);
        let excess = session.said.len().saturating_sub(SESSION_KEEP);
        session.said.drain(..excess);
        tx.execute(
            "INSERT INTO conversation_sessions (seat, conversation, created_ms, updated_ms, turns, said)
             VALUES (?1, ?2, ?3, ?3, ?4, ?5)
             ON CONFLICT (seat, conversation)
             DO UPDATE SET updated_ms = ?3, turns = ?4, said = ?5",
            params![
                seat,
                conversation,
                now_ms,
                session.turns,
                serde_json::to_string(&session.said)?
            ],
        )?;
        tx.commit()?;
        Ok(session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_keeps_what_was_said_newest_last() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_in(dir.path()).unwrap();
        assert_eq!(store.session("ada", "C1#1").unwrap(), Session::default());
        let said = |i: usize| Said {
            turn_id: format!("t{i}"),
            text: format!("reply {i}"),
            at_ms: i as i64,
        };
        store.remember("ada", "C1#1", &[said(0)], 1).unwrap();
        store.remember("ada", "C1#1", &[], 2).unwrap();
        let s = store.session("ada", "C1#1").unwrap();
        assert_eq!((s.turns, s.said.len()), (2, 1));
        assert_eq!(
            store.session("bob", "C1#1").unwrap(),
            Session::default(),
            "sessions are per seat"
        );
        let many: Vec<Said> = (1..=SESSION_KEEP + 5).map(said).collect();
        let s = store.remember("ada", "C1#1", &many, 3).unwrap();
        assert_eq!(s.said.len(), SESSION_KEEP);
        assert_eq!(
            s.said.last().unwrap().text,
            format!("reply {}", SESSION_KEEP + 5)
        );
        assert_eq!(store.session("ada", "C1#1").unwrap(), s);
    }

    #[test]
    fn a_row_from_elsewhere_is_written_unless_this_nodes_is_newer() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_in(dir.path()).unwrap();
        assert_eq!(store.session_row("ada", "C1#1").unwrap(), None);
        let said = |t: &str| Said {
            turn_id: t.into(),
            text: format!("said in {t}"),
            at_ms: 1,
        };
        store.remember("ada", "C1#1", &[said("t1")], 10).unwrap();
        let mine = store.session_row("ada", "C1#1").unwrap().unwrap();
        assert_eq!((mine.created_ms, mine.updated_ms, mine.turns), (10, 10, 1));

        let older = SessionRow {
            updated_ms: 5,
            said: vec![said("old")],
            ..mine.clone()
        };
        assert_eq!(
            store.apply_sessions(&[older]).unwrap(),
            [Applied::KeptLocal]
        );
        assert_eq!(store.session_row("ada", "C1#1").unwrap().unwrap(), mine);

        let newer = SessionRow {
            updated_ms: 20,
            turns: 3,
            said: vec![said("t1"), said("t2")],
            ..mine.clone()
        };
        assert_eq!(
            store.apply_sessions(std::slice::from_ref(&newer)).unwrap(),
            [Applied::Written]
        );
        assert_eq!(store.session_row("ada", "C1#1").unwrap().unwrap(), newer);

        let elsewhere = SessionRow {
            conversation: "C2#9".into(),
            ..newer.clone()
        };
        assert_eq!(
            store.apply_sessions(&[elsewhere]).unwrap(),
            [Applied::Written]
        );
        assert_eq!(store.session_count("ada").unwrap(), 2);
        assert_eq!(store.session_count("bob").unwrap(), 0);
    }
}
