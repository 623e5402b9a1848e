//! Recall: a per-seat scan the database ranks by cosine distance.
//!
//! Rule: no vector index (the design's): a seat's rows are few enough that
//! one scan ranked by [`COSINE_DISTANCE`] — a scalar function registered on
//! the store's connection — answers in milliseconds. Only rows embedded by
//! the query's model at the query's dimension are compared; every other row
//! (another model, another dimension, none) falls back to recency, after
//! the ranked ones. Without a query vector recall is by recency alone.

use rusqlite::functions::{Context, FunctionFlags};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, Row, params};

use super::{DiaryNote, EPISODE_COLUMNS, Episode, NOTE_COLUMNS, Vector, episode_of, note_of};
use crate::{Store, StoreError};

/// The SQL function `cosine_distance(a, b)`: 1 − cosine similarity of two
/// little-endian f32 blobs, 0 (same direction) to 2 (opposite); NULL when
/// either is NULL, their lengths differ or either has no length.
pub const COSINE_DISTANCE: &str = "cosine_distance";

/// A recalled row, and how far it was from the query (`None`: not
/// compared — recalled by recency).
#[derive(Debug, Clone, PartialEq)]
pub struct Recalled<R> {
    pub row: R,
    pub distance: Option<f64>,
}

/// Registers [`COSINE_DISTANCE`] on `conn`.
pub(crate) fn register(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.create_scalar_function(
        COSINE_DISTANCE,
        2,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx: &mut Context<'_>| {
            let (ValueRef::Blob(a), ValueRef::Blob(b)) = (ctx.get_raw(0), ctx.get_raw(1)) else {
                return Ok(None);
            };
            Ok(cosine_distance(a, b))
        },
    )
}

/// 1 − cos(a, b) over little-endian f32 bytes.
fn cosine_distance(a: &[u8], b: &[u8]) -> Option<f64> {
    if a.len() != b.len() || a.is_empty() || !a.len().is_multiple_of(4) {
        return None;
    }
    let f = |c: &[u8]| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    let (mut dot, mut na, mut nb) = (0.0, 0.0, 0.0);
    for (x, y) in a.chunks_exact(4).zip(b.chunks_exact(4)) {
        let (x, y) = (f(x), f(y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return None;
    }
    Some(1.0 - dot / (na.sqrt() * nb.sqrt()))
}

/// The query's model, dimension and blob as SQL parameters (all NULL
/// without a query: nothing is compared).
fn query_columns(query: Option<&Vector>) -> (Option<&str>, Option<i64>, Option<Vec<u8>>) {
    match query {
        Some(q) => (
            Some(q.model.as_str()),
            Some(q.values.len() as i64),
            Some(q.to_blob()),
        ),
        None => (None, None, None),
    }
}

impl Store {
    /// Runs a recall `sql` (parameters: seat, model, dimension, query blob,
    /// max distance, limit; the distance the column after the row's).
    fn recall<R>(
        &self,
        sql: &str,
        (seat, query): (&str, Option<&Vector>),
        max_distance: f64,
        limit: usize,
        (row_of, distance): (fn(&Row<'_>) -> Result<R, rusqlite::Error>, usize),
    ) -> Result<Vec<Recalled<R>>, StoreError> {
        let (model, dim, blob) = query_columns(query);
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(sql)?;
        let rows = stmt.query_map(
            params![seat, model, dim, blob, max_distance, limit as i64],
            |r| {
                Ok(Recalled {
                    row: row_of(r)?,
                    distance: r.get(distance)?,
                })
            },
        )?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Up to `limit` notes of `seat`: those embedded like `query` within
    /// `max_distance`, nearest first, then every other uncompared note,
    /// newest first. Without `query`, the newest notes.
    pub fn recall_notes(
        &self,
        seat: &str,
        query: Option<&Vector>,
        max_distance: f64,
        limit: usize,
    ) -> Result<Vec<Recalled<DiaryNote>>, StoreError> {
        self.recall(
            &format!(
                "SELECT {NOTE_COLUMNS}, d FROM (
                     SELECT *, CASE WHEN embedding_model = ?2 AND embedding_dim = ?3
                                    THEN {COSINE_DISTANCE}(embedding, ?4) END AS d
                     FROM agent_diary WHERE seat = ?1)
                 WHERE d IS NULL OR d <= ?5
                 ORDER BY d IS NULL, d, created_ms DESC
                 LIMIT ?6"
            ),
            (seat, query),
            max_distance,
            limit,
            (note_of, 9),
        )
    }

    /// Up to `limit` episodes of `seat` embedded like `query` within
    /// `max_distance`, nearest first. Episodes not comparable with the
    /// query are not "similar prior work": they are left out.
    pub fn recall_episodes(
        &self,
        seat: &str,
        query: &Vector,
        max_distance: f64,
        limit: usize,
    ) -> Result<Vec<Recalled<Episode>>, StoreError> {
        self.recall(
            &format!(
                "SELECT {EPISODE_COLUMNS}, d FROM (
                     SELECT *, {COSINE_DISTANCE}(embedding, ?4) AS d FROM episodes
                     WHERE seat = ?1 AND embedding_model = ?2 AND embedding_dim = ?3)
                 WHERE d IS NOT NULL AND d <= ?5
                 ORDER BY d, ended_ms DESC
                 LIMIT ?6"
            ),
            (seat, Some(query)),
            max_distance,
            limit,
            (episode_of, 16),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn cosine_distance_is_zero_for_one_direction_two_for_opposite_and_none_for_mismatch() {
        let d = |a: &[f32], b: &[f32]| cosine_distance(&blob(a), &blob(b));
        assert!(d(&[1.0, 2.0], &[2.0, 4.0]).unwrap().abs() < 1e-9);
        assert!((d(&[1.0, 0.0], &[0.0, 3.0]).unwrap() - 1.0).abs() < 1e-9);
        assert!((d(&[1.0, 0.0], &[-1.0, 0.0]).unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(d(&[1.0, 0.0], &[1.0, 0.0, 0.0]), None, "dimensions differ");
        assert_eq!(d(&[0.0, 0.0], &[1.0, 0.0]), None, "no direction");
        assert_eq!(d(&[], &[]), None);
        assert_eq!(cosine_distance(&[1, 2, 3], &[1, 2, 3]), None, "not f32s");
    }
}
