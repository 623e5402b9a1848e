//! What a seat already said in one conversation (`conversation_sessions`).
//!
//! Rule: a turn woken in a thread starts from what its seat said there
//! before, so a follow-up question is answered as a follow-up and a reply is
//! not composed again from nothing. The session is this node's: a seat that
//! moves to another node starts its sessions afresh there (the thread itself,
//! read through the seat's tools, is the durable record).

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::{Store, StoreError};

/// How many of a seat's messages one session keeps (the newest).
pub const SESSION_KEEP: usize = 20;

/// One thing a seat said in a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Said {
    pub turn_id: String,
    pub text: String,
    pub at_ms: i64,
}

/// A seat's session in one conversation.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Session {
    pub turns: i64,
    pub said: Vec<Said>,
}

impl Store {
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
}
