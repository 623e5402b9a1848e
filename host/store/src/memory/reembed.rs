//! Rows recall cannot compare: a note or episode whose vector is of another
//! model or dimension than the company's embedding model, or that has none
//! (written while embeddings were off or down).
//!
//! Rule: the learning duty re-embeds them a bounded number per pass; "the
//! company's dimension" is the dimension of the seat's newest row (note or
//! episode) of the company's model, so a changed `dimensions` option is
//! caught without a probe call once the seat wrote one row with it (its
//! next turn's episode). A row re-embedded keeps its text and gets a new vector,
//! stamped afresh, newer than before, so it follows the seat.

use rusqlite::params;

use super::{DiaryNote, Episode, Vector};
use crate::{Store, StoreError};

/// Which table an [`Unmatched`] row is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    Note,
    Episode,
}

impl MemoryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryKind::Note => "note",
            MemoryKind::Episode => "episode",
        }
    }
}

/// A row whose vector recall cannot compare with the company's model, and
/// the text its vector is made from (a note's text, an episode's trigger).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmatched {
    pub kind: MemoryKind,
    /// `note_id` or `turn_id`.
    pub key: String,
    pub text: String,
}

/// The rows of `table` of seat `?1` whose vector is not of model `?2` at
/// the dimension of the seat's newest row (note or episode) of that model,
/// newest first, at most `?3`.
fn unmatched_sql(table: &str, key: &str, text: &str) -> String {
    format!(
        "SELECT {key}, {text} FROM {table}
         WHERE seat = ?1 AND {text} <> '' AND (embedding IS NULL OR embedding_model IS NOT ?2
               OR embedding_dim IS NOT (
                   SELECT embedding_dim FROM (
                       SELECT embedding_dim, updated_ms FROM agent_diary
                       WHERE seat = ?1 AND embedding_model = ?2
                       UNION ALL
                       SELECT embedding_dim, updated_ms FROM episodes
                       WHERE seat = ?1 AND embedding_model = ?2)
                   ORDER BY updated_ms DESC LIMIT 1))
         ORDER BY updated_ms DESC LIMIT ?3"
    )
}

impl Store {
    /// Up to `limit` rows of `seat` (notes first, then episodes) recall
    /// cannot compare with `model`'s vectors.
    pub fn unmatched_vectors(
        &self,
        seat: &str,
        model: &str,
        limit: usize,
    ) -> Result<Vec<Unmatched>, StoreError> {
        let conn = self.conn();
        let mut out = Vec::new();
        for (kind, sql) in [
            (
                MemoryKind::Note,
                unmatched_sql("agent_diary", "note_id", "text"),
            ),
            (
                MemoryKind::Episode,
                unmatched_sql("episodes", "turn_id", "trigger"),
            ),
        ] {
            let left = limit.saturating_sub(out.len());
            if left == 0 {
                break;
            }
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(params![seat, model, left as i64], |r| {
                Ok(Unmatched {
                    kind,
                    key: r.get(0)?,
                    text: r.get(1)?,
                })
            })?;
            for row in rows {
                out.push(row?);
            }
        }
        Ok(out)
    }

    /// `seat`'s note `note_id` with `vector` in place of its old one;
    /// answers the row as stored (`None`: the note is gone).
    pub fn reembed_note(
        &self,
        seat: &str,
        note_id: &str,
        vector: Vector,
        now_ms: i64,
    ) -> Result<Option<DiaryNote>, StoreError> {
        let Some(had) = self.note(seat, note_id)? else {
            return Ok(None);
        };
        let row = DiaryNote {
            updated_ms: now_ms.max(had.updated_ms + 1),
            vector: Some(vector),
            ..had
        };
        self.put_note(&row).map(Some)
    }

    /// `seat`'s episode `turn_id` with `vector` in place of its old one;
    /// answers the row as stored (`None`: the episode is gone).
    pub fn reembed_episode(
        &self,
        seat: &str,
        turn_id: &str,
        vector: Vector,
        now_ms: i64,
    ) -> Result<Option<Episode>, StoreError> {
        let Some(had) = self.episode(seat, turn_id)? else {
            return Ok(None);
        };
        let row = Episode {
            updated_ms: now_ms.max(had.updated_ms + 1),
            vector: Some(vector),
            ..had
        };
        self.put_episode(&row).map(Some)
    }
}
