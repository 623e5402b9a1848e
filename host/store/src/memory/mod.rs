//! A seat's long memory in this node's store: its diary (`agent_diary`),
//! one episode per ended turn (`episodes`), the people and seats it dealt
//! with (`counterparty_profiles`) and whether it was onboarded
//! (`agent_onboarding_markers`).
//!
//! Rules, and why:
//! - Every row written — here or replayed from the memory stream — is
//!   stamped from `memory_change_sequence` in the same transaction: one
//!   counter that only ever increases and never hands a number out twice,
//!   so "what changed since N" is exact (a rowid is reused once the newest
//!   row is deleted).
//! - A vector is stored with the model it came from and its dimension;
//!   recall never compares vectors of another model or dimension
//!   ([`recall`]).
//! - A row replayed from the stream is written unless this node's copy was
//!   updated later (a tie is written: the same content), as sessions are.

mod recall;
mod reembed;

pub(crate) use recall::register;

use rusqlite::{OptionalExtension, Row, Transaction, params};
use serde::{Deserialize, Serialize};

use crate::{Applied, Store, StoreError};

pub use recall::{COSINE_DISTANCE, Recalled};
pub use reembed::{MemoryKind, Unmatched};

pub use crewlet_os::{Episode, Vector};

/// An optional vector from its `embedding` and `embedding_model` columns.
fn vector_of(blob: Option<Vec<u8>>, model: Option<String>) -> Option<Vector> {
    match (blob, model) {
        (Some(blob), Some(model)) => Some(Vector::from_blob(model, &blob)),
        _ => None,
    }
}

/// The columns of an optional vector.
fn vector_columns(v: &Option<Vector>) -> (Option<Vec<u8>>, Option<&str>, Option<i64>) {
    match v {
        Some(v) => (
            Some(v.to_blob()),
            Some(v.model.as_str()),
            Some(v.values.len() as i64),
        ),
        None => (None, None, None),
    }
}

/// One note of a seat's diary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiaryNote {
    pub seat: String,
    pub note_id: String,
    pub text: String,
    pub turn_id: Option<String>,
    pub created_ms: i64,
    pub updated_ms: i64,
    pub vector: Option<Vector>,
    /// This node's stamp (not carried on the stream).
    #[serde(skip)]
    pub change_seq: i64,
}

/// What a seat knows of someone it dealt with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    pub seat: String,
    /// The counterparty's identity (a delivery's sender id).
    pub counterparty: String,
    /// What the seat knows of them (bounded).
    pub known: String,
    pub turns: i64,
    pub first_ms: i64,
    pub last_ms: i64,
    pub updated_ms: i64,
    #[serde(skip)]
    pub change_seq: i64,
}

/// A seat has had its first turn in the company.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Onboarded {
    pub seat: String,
    pub turn_id: String,
    pub onboarded_ms: i64,
    pub updated_ms: i64,
    #[serde(skip)]
    pub change_seq: i64,
}

/// The next number of `memory_change_sequence`, inside `tx`.
pub(crate) fn next_change(tx: &Transaction<'_>) -> Result<i64, rusqlite::Error> {
    tx.query_row(
        "UPDATE memory_change_sequence SET last = last + 1 WHERE id = 1 RETURNING last",
        [],
        |r| r.get(0),
    )
}

const NOTE_COLUMNS: &str =
    "seat, note_id, text, turn_id, created_ms, updated_ms, embedding, embedding_model, change_seq";
const EPISODE_COLUMNS: &str = "seat, turn_id, conversation, trigger, asked_by, tools, reply, outcome, input_tokens, output_tokens, summary, ended_ms, updated_ms, embedding, embedding_model, change_seq";
const PROFILE_COLUMNS: &str =
    "seat, counterparty, known, turns, first_ms, last_ms, updated_ms, change_seq";

fn note_of(r: &Row<'_>) -> Result<DiaryNote, rusqlite::Error> {
    Ok(DiaryNote {
        seat: r.get(0)?,
        note_id: r.get(1)?,
        text: r.get(2)?,
        turn_id: r.get(3)?,
        created_ms: r.get(4)?,
        updated_ms: r.get(5)?,
        vector: vector_of(r.get(6)?, r.get(7)?),
        change_seq: r.get(8)?,
    })
}

fn json_list(r: &Row<'_>, i: usize) -> Result<Vec<String>, rusqlite::Error> {
    let text: String = r.get(i)?;
    serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, e.into())
    })
}

fn episode_of(r: &Row<'_>) -> Result<Episode, rusqlite::Error> {
    Ok(Episode {
        seat: r.get(0)?,
        turn_id: r.get(1)?,
        conversation: r.get(2)?,
        trigger: r.get(3)?,
        asked_by: json_list(r, 4)?,
        tools: json_list(r, 5)?,
        reply: r.get(6)?,
        outcome: r.get(7)?,
        input_tokens: r.get::<_, i64>(8)? as u64,
        output_tokens: r.get::<_, i64>(9)? as u64,
        summary: r.get(10)?,
        ended_ms: r.get(11)?,
        updated_ms: r.get(12)?,
        vector: vector_of(r.get(13)?, r.get(14)?),
        change_seq: r.get(15)?,
    })
}

fn profile_of(r: &Row<'_>) -> Result<Profile, rusqlite::Error> {
    Ok(Profile {
        seat: r.get(0)?,
        counterparty: r.get(1)?,
        known: r.get(2)?,
        turns: r.get(3)?,
        first_ms: r.get(4)?,
        last_ms: r.get(5)?,
        updated_ms: r.get(6)?,
        change_seq: r.get(7)?,
    })
}

/// Writes one row (`newer_only`: unless this node's copy is newer);
/// answers whether it was written.
type Put<R> = fn(&Transaction<'_>, &R, i64, bool) -> Result<bool, StoreError>;

fn put_note(
    tx: &Transaction<'_>,
    n: &DiaryNote,
    seq: i64,
    newer_only: bool,
) -> Result<bool, StoreError> {
    let (blob, model, dim) = vector_columns(&n.vector);
    let changed = tx.prepare_cached(&format!(
        "INSERT INTO agent_diary (seat, note_id, text, turn_id, created_ms, updated_ms, embedding, embedding_model, embedding_dim, change_seq)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT (seat, note_id) DO UPDATE SET text = ?3, turn_id = ?4, created_ms = ?5, updated_ms = ?6,
             embedding = ?7, embedding_model = ?8, embedding_dim = ?9, change_seq = ?10
         WHERE {}",
        if newer_only { "excluded.updated_ms >= agent_diary.updated_ms" } else { "1" }
    ))?
    .execute(params![n.seat, n.note_id, n.text, n.turn_id, n.created_ms, n.updated_ms, blob, model, dim, seq])?;
    Ok(changed > 0)
}

fn put_episode(
    tx: &Transaction<'_>,
    e: &Episode,
    seq: i64,
    newer_only: bool,
) -> Result<bool, StoreError> {
    let (blob, model, dim) = vector_columns(&e.vector);
    let changed = tx.prepare_cached(&format!(
        "INSERT INTO episodes (seat, turn_id, conversation, trigger, asked_by, tools, reply, outcome, input_tokens, output_tokens, summary, ended_ms, updated_ms, embedding, embedding_model, embedding_dim, change_seq)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)
         ON CONFLICT (seat, turn_id) DO UPDATE SET conversation = ?3, trigger = ?4, asked_by = ?5, tools = ?6, reply = ?7,
             outcome = ?8, input_tokens = ?9, output_tokens = ?10, summary = ?11, ended_ms = ?12, updated_ms = ?13,
             embedding = ?14, embedding_model = ?15, embedding_dim = ?16, change_seq = ?17
         WHERE {}",
        if newer_only { "excluded.updated_ms >= episodes.updated_ms" } else { "1" }
    ))?
    .execute(params![
        e.seat, e.turn_id, e.conversation, e.trigger,
        serde_json::to_string(&e.asked_by)?, serde_json::to_string(&e.tools)?,
        e.reply, e.outcome, e.input_tokens as i64, e.output_tokens as i64, e.summary,
        e.ended_ms, e.updated_ms, blob, model, dim, seq
    ])?;
    Ok(changed > 0)
}

fn put_profile(
    tx: &Transaction<'_>,
    p: &Profile,
    seq: i64,
    newer_only: bool,
) -> Result<bool, StoreError> {
    let changed = tx.prepare_cached(&format!(
        "INSERT INTO counterparty_profiles (seat, counterparty, known, turns, first_ms, last_ms, updated_ms, change_seq)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (seat, counterparty) DO UPDATE SET known = ?3, turns = ?4, first_ms = ?5, last_ms = ?6,
             updated_ms = ?7, change_seq = ?8
         WHERE {}",
        if newer_only { "excluded.updated_ms >= counterparty_profiles.updated_ms" } else { "1" }
    ))?
    .execute(params![p.seat, p.counterparty, p.known, p.turns, p.first_ms, p.last_ms, p.updated_ms, seq])?;
    Ok(changed > 0)
}

/// A seat is onboarded once: the first marker stays, wherever it came from.
fn put_marker(
    tx: &Transaction<'_>,
    m: &Onboarded,
    seq: i64,
    _newer_only: bool,
) -> Result<bool, StoreError> {
    let changed = tx
        .prepare_cached(
            "INSERT INTO agent_onboarding_markers (seat, turn_id, onboarded_ms, updated_ms, change_seq)
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (seat) DO NOTHING",
        )?
        .execute(params![m.seat, m.turn_id, m.onboarded_ms, m.updated_ms, seq])?;
    Ok(changed > 0)
}

impl Store {
    /// Writes `rows` in one transaction, each stamped from the change
    /// sequence; a number taken by a row not written is rolled back with
    /// nothing else, so the sequence still never repeats.
    fn put_rows<R>(
        &self,
        rows: &[R],
        newer_only: bool,
        put: Put<R>,
    ) -> Result<Vec<Applied>, StoreError> {
        let mut conn = self.conn();
        // The write lock up front: the sequence is read and bumped inside.
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            tx.execute_batch("SAVEPOINT memory_row")?;
            let seq = next_change(&tx)?;
            if put(&tx, row, seq, newer_only)? {
                tx.execute_batch("RELEASE memory_row")?;
                out.push(Applied::Written);
            } else {
                tx.execute_batch("ROLLBACK TO memory_row; RELEASE memory_row")?;
                out.push(Applied::KeptLocal);
            }
        }
        tx.commit()?;
        Ok(out)
    }

    fn put_one<R: Clone>(
        &self,
        row: &R,
        put: Put<R>,
        read: impl FnOnce(&Store) -> Result<Option<R>, StoreError>,
    ) -> Result<R, StoreError> {
        self.put_rows(std::slice::from_ref(row), false, put)?;
        read(self)?.ok_or(StoreError::Sqlite(rusqlite::Error::QueryReturnedNoRows))
    }

    /// The last number the change sequence handed out.
    pub fn memory_change_sequence(&self) -> Result<i64, StoreError> {
        Ok(self.conn().query_row(
            "SELECT last FROM memory_change_sequence WHERE id = 1",
            [],
            |r| r.get(0),
        )?)
    }

    /// Writes (or rewrites) a note; answers it as stored, stamped.
    pub fn put_note(&self, note: &DiaryNote) -> Result<DiaryNote, StoreError> {
        self.put_one(note, put_note, |s| s.note(&note.seat, &note.note_id))
    }

    /// One note of `seat`.
    pub fn note(&self, seat: &str, note_id: &str) -> Result<Option<DiaryNote>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                &format!("SELECT {NOTE_COLUMNS} FROM agent_diary WHERE seat = ?1 AND note_id = ?2"),
                params![seat, note_id],
                note_of,
            )
            .optional()?)
    }

    /// Notes replayed from the memory stream; answers per row, in order.
    pub fn apply_notes(&self, rows: &[DiaryNote]) -> Result<Vec<Applied>, StoreError> {
        self.put_rows(rows, true, put_note)
    }

    /// Writes (or rewrites) an episode; answers it as stored, stamped.
    pub fn put_episode(&self, episode: &Episode) -> Result<Episode, StoreError> {
        self.put_one(episode, put_episode, |s| {
            s.episode(&episode.seat, &episode.turn_id)
        })
    }

    /// One episode of `seat`.
    pub fn episode(&self, seat: &str, turn_id: &str) -> Result<Option<Episode>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                &format!("SELECT {EPISODE_COLUMNS} FROM episodes WHERE seat = ?1 AND turn_id = ?2"),
                params![seat, turn_id],
                episode_of,
            )
            .optional()?)
    }

    /// Episodes replayed from the memory stream.
    pub fn apply_episodes(&self, rows: &[Episode]) -> Result<Vec<Applied>, StoreError> {
        self.put_rows(rows, true, put_episode)
    }

    /// Writes (or rewrites) a profile; answers it as stored, stamped.
    pub fn put_profile(&self, profile: &Profile) -> Result<Profile, StoreError> {
        self.put_one(profile, put_profile, |s| {
            s.profile(&profile.seat, &profile.counterparty)
        })
    }

    /// What `seat` knows of `counterparty`.
    pub fn profile(&self, seat: &str, counterparty: &str) -> Result<Option<Profile>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                &format!(
                    "SELECT {PROFILE_COLUMNS} FROM counterparty_profiles WHERE seat = ?1 AND counterparty = ?2"
                ),
                params![seat, counterparty],
                profile_of,
            )
            .optional()?)
    }

    /// Profiles replayed from the memory stream.
    pub fn apply_profiles(&self, rows: &[Profile]) -> Result<Vec<Applied>, StoreError> {
        self.put_rows(rows, true, put_profile)
    }

    /// Marks `seat` onboarded unless it already is; answers the marker
    /// that holds (the first one).
    pub fn mark_onboarded(&self, marker: &Onboarded) -> Result<Onboarded, StoreError> {
        self.put_rows(std::slice::from_ref(marker), false, put_marker)?;
        self.onboarded(&marker.seat)?
            .ok_or(StoreError::Sqlite(rusqlite::Error::QueryReturnedNoRows))
    }

    /// Whether `seat` was onboarded, and by which turn.
    pub fn onboarded(&self, seat: &str) -> Result<Option<Onboarded>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT seat, turn_id, onboarded_ms, updated_ms, change_seq FROM agent_onboarding_markers WHERE seat = ?1",
                params![seat],
                |r| {
                    Ok(Onboarded {
                        seat: r.get(0)?,
                        turn_id: r.get(1)?,
                        onboarded_ms: r.get(2)?,
                        updated_ms: r.get(3)?,
                        change_seq: r.get(4)?,
                    })
                },
            )
            .optional()?)
    }

    /// Markers replayed from the memory stream (the first marker stays).
    pub fn apply_markers(&self, rows: &[Onboarded]) -> Result<Vec<Applied>, StoreError> {
        self.put_rows(rows, true, put_marker)
    }
}
