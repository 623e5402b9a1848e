//! What a seat learned (`synthesized_skills`, `synthesized_skill_versions`).
//!
//! Rules, and why:
//! - A skill is a seat's: one row per seat and skill, its procedure in
//!   numbered versions (a reflection that learns the same skill again adds
//!   a version; none is ever rewritten), so what a seat was told to do at
//!   any point stays readable. A role-wide skill is a row on every seat of
//!   the role (`origin = promoted`), because a seat's memory is replayed
//!   per seat: a role key would not follow a seat to another node.
//! - Every write is stamped from `memory_change_sequence` and the row goes
//!   to the memory changelog, so a skill follows its seat; a row replayed
//!   from the stream is stamped here afresh (the sequence is this node's).
//!   A skill row has two writers (the duty defines it, turns use it), whose
//!   messages may reach the stream in either order: a replayed row is
//!   applied per field group, each newer-wins in its own order
//!   ([`DEFINED_NEWER`], [`USED_NEWER`]); a version row newest-`updated_ms`.
//! - A skill's id is its name, lower-cased to letters, digits and `-`:
//!   two seats that learned "Deploy check" independently learned one skill,
//!   which is what promotion counts.

use rusqlite::{OptionalExtension, Transaction, params};
use serde::{Deserialize, Serialize};

use crate::memory::next_change;
use crate::{Applied, Store, StoreError};

/// The longest skill name kept, in characters.
pub const SKILL_NAME_MAX: usize = 80;
/// The longest procedure kept, in bytes.
pub const SKILL_PROCEDURE_MAX: usize = 4096;

/// How a seat came by a skill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Its own reflection learned it.
    Induced,
    /// Several seats of its role learned it; it was offered to the role.
    Promoted,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Induced => "induced",
            Origin::Promoted => "promoted",
        }
    }

    fn parse(s: &str) -> Origin {
        if s == "promoted" {
            Origin::Promoted
        } else {
            Origin::Induced
        }
    }
}

/// One `synthesized_skills` row, as the memory changelog carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillRow {
    pub seat: String,
    pub skill_id: String,
    pub name: String,
    pub origin: Origin,
    pub promoted_from: Vec<String>,
    /// `active` or `retired`.
    pub state: String,
    /// The current version.
    pub version: i64,
    pub uses: i64,
    pub last_used_ms: Option<i64>,
    pub created_ms: i64,
    pub retired_ms: Option<i64>,
    pub updated_ms: i64,
}

impl SkillRow {
    pub fn active(&self) -> bool {
        self.state == "active"
    }
}

/// One `synthesized_skill_versions` row, as the memory changelog carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillVersionRow {
    pub seat: String,
    pub skill_id: String,
    pub version: i64,
    pub procedure: String,
    /// The episodes (turn ids) it was learned from.
    pub episodes: Vec<String>,
    /// `provider/model` of the reflection that wrote it.
    pub model: String,
    pub created_ms: i64,
    pub updated_ms: i64,
}

/// A skill to write: a new one, or a new version of one the seat has.
#[derive(Debug, Clone)]
pub struct Learned<'a> {
    pub seat: &'a str,
    pub name: &'a str,
    pub origin: Origin,
    pub promoted_from: &'a [String],
    pub procedure: &'a str,
    pub episodes: &'a [String],
    pub model: &'a str,
}

/// A skill with every version, newest last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillHistory {
    pub skill: SkillRow,
    pub versions: Vec<SkillVersionRow>,
}

/// A skill's id from its name: lower-case letters and digits, words joined
/// by `-`; `None` when nothing is left.
pub fn skill_id(name: &str) -> Option<String> {
    let words: Vec<String> = name
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    (!words.is_empty()).then(|| words.join("-"))
}

const SKILL_COLUMNS: &str = "seat, skill_id, name, origin, promoted_from, state, version, uses,
     last_used_ms, created_ms, retired_ms, updated_ms";

fn skill_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<(SkillRow, String)> {
    let origin: String = r.get(3)?;
    Ok((
        SkillRow {
            seat: r.get(0)?,
            skill_id: r.get(1)?,
            name: r.get(2)?,
            origin: Origin::parse(&origin),
            promoted_from: Vec::new(),
            state: r.get(5)?,
            version: r.get(6)?,
            uses: r.get(7)?,
            last_used_ms: r.get(8)?,
            created_ms: r.get(9)?,
            retired_ms: r.get(10)?,
            updated_ms: r.get(11)?,
        },
        r.get(4)?,
    ))
}

fn finish(raw: (SkillRow, String)) -> Result<SkillRow, StoreError> {
    let (mut row, from) = raw;
    row.promoted_from = serde_json::from_str(&from)?;
    Ok(row)
}

fn version_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<(SkillVersionRow, String)> {
    Ok((
        SkillVersionRow {
            seat: r.get(0)?,
            skill_id: r.get(1)?,
            version: r.get(2)?,
            procedure: r.get(3)?,
            episodes: Vec::new(),
            model: r.get(5)?,
            created_ms: r.get(6)?,
            updated_ms: r.get(7)?,
        },
        r.get(4)?,
    ))
}

const VERSION_COLUMNS: &str =
    "seat, skill_id, version, procedure, episodes, model, created_ms, updated_ms";

/// A replayed skill row's standing against this node's, per field group:
/// what the duty defines (name, origin, state, version; ordered by version,
/// then retired after active) and what turns use (uses; ordered by the
/// last use). Each group is taken from the row newer in it, ties by
/// `updated_ms`, so the result does not depend on which writer's message
/// reached the stream first.
const DEFINED_NEWER: &str = "(excluded.version, excluded.state = 'retired', excluded.updated_ms)
     >= (s.version, s.state = 'retired', s.updated_ms)";
const USED_NEWER: &str = "(COALESCE(excluded.last_used_ms, -1), excluded.updated_ms)
     >= (COALESCE(s.last_used_ms, -1), s.updated_ms)";

fn upsert_skill(
    tx: &Transaction<'_>,
    row: &SkillRow,
    only_newer: bool,
) -> Result<bool, StoreError> {
    let seq = next_change(tx)?;
    let (defined, used, guard) = if only_newer {
        (
            DEFINED_NEWER,
            USED_NEWER,
            format!("WHERE {DEFINED_NEWER} OR {USED_NEWER}"),
        )
    } else {
        ("1", "1", String::new())
    };
    let pick = |col: &str, group: &str| {
        format!("{col} = CASE WHEN {group} THEN excluded.{col} ELSE s.{col} END")
    };
    let sets: Vec<String> = [
        "name",
        "origin",
        "promoted_from",
        "state",
        "version",
        "created_ms",
        "retired_ms",
    ]
    .iter()
    .map(|c| pick(c, defined))
    .chain(["uses", "last_used_ms"].iter().map(|c| pick(c, used)))
    .collect();
    let changed = tx.execute(
        &format!(
            "INSERT INTO synthesized_skills AS s ({SKILL_COLUMNS}, change_seq)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
             ON CONFLICT (seat, skill_id) DO UPDATE SET {},
               updated_ms = MAX(excluded.updated_ms, s.updated_ms),
               change_seq = excluded.change_seq
             {guard}",
            sets.join(", ")
        ),
        params![
            row.seat,
            row.skill_id,
            row.name,
            row.origin.as_str(),
            serde_json::to_string(&row.promoted_from)?,
            row.state,
            row.version,
            row.uses,
            row.last_used_ms,
            row.created_ms,
            row.retired_ms,
            row.updated_ms,
            seq
        ],
    )?;
    Ok(changed > 0)
}

fn upsert_version(
    tx: &Transaction<'_>,
    row: &SkillVersionRow,
    only_newer: bool,
) -> Result<bool, StoreError> {
    let seq = next_change(tx)?;
    let guard = if only_newer {
        "WHERE excluded.updated_ms >= synthesized_skill_versions.updated_ms"
    } else {
        ""
    };
    let changed = tx.execute(
        &format!(
            "INSERT INTO synthesized_skill_versions ({VERSION_COLUMNS}, change_seq)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (seat, skill_id, version) DO UPDATE SET
               procedure = excluded.procedure, episodes = excluded.episodes,
               model = excluded.model, created_ms = excluded.created_ms,
               updated_ms = excluded.updated_ms, change_seq = excluded.change_seq
             {guard}"
        ),
        params![
            row.seat,
            row.skill_id,
            row.version,
            row.procedure,
            serde_json::to_string(&row.episodes)?,
            row.model,
            row.created_ms,
            row.updated_ms,
            seq
        ],
    )?;
    Ok(changed > 0)
}

fn skill_in(tx: &Transaction<'_>, seat: &str, id: &str) -> Result<Option<SkillRow>, StoreError> {
    tx.query_row(
        &format!(
            "SELECT {SKILL_COLUMNS} FROM synthesized_skills WHERE seat = ?1 AND skill_id = ?2"
        ),
        params![seat, id],
        skill_of,
    )
    .optional()?
    .map(finish)
    .transpose()
}

/// Why a skill was not written (the caller's input, never the store).
#[derive(Debug, thiserror::Error)]
pub enum SkillRefused {
    #[error("a skill needs a name with a letter or digit in it (found {0:?})")]
    NoName(String),
    #[error("a skill's procedure is empty")]
    NoProcedure,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Store {
    /// Writes `learned`: a new skill at version 1, or the next version of
    /// the seat's skill of that id (made active again if it had retired).
    /// The name and procedure are cut to their bounds.
    pub fn learn_skill(
        &self,
        learned: &Learned<'_>,
        now_ms: i64,
    ) -> Result<(SkillRow, SkillVersionRow), SkillRefused> {
        let id = skill_id(learned.name).ok_or_else(|| SkillRefused::NoName(learned.name.into()))?;
        let procedure = cut(learned.procedure.trim(), SKILL_PROCEDURE_MAX);
        if procedure.is_empty() {
            return Err(SkillRefused::NoProcedure);
        }
        let name: String = learned.name.trim().chars().take(SKILL_NAME_MAX).collect();
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(StoreError::from)?;
        let skill = match skill_in(&tx, learned.seat, &id)? {
            Some(had) => SkillRow {
                name,
                state: "active".into(),
                version: had.version + 1,
                retired_ms: None,
                updated_ms: now_ms.max(had.updated_ms + 1),
                // An induced skill stays induced when a promotion repeats it.
                origin: if had.origin == Origin::Induced {
                    Origin::Induced
                } else {
                    learned.origin
                },
                promoted_from: learned.promoted_from.to_vec(),
                ..had
            },
            None => SkillRow {
                seat: learned.seat.into(),
                skill_id: id.clone(),
                name,
                origin: learned.origin,
                promoted_from: learned.promoted_from.to_vec(),
                state: "active".into(),
                version: 1,
                uses: 0,
                last_used_ms: None,
                created_ms: now_ms,
                retired_ms: None,
                updated_ms: now_ms,
            },
        };
        let version = SkillVersionRow {
            seat: learned.seat.into(),
            skill_id: id,
            version: skill.version,
            procedure: procedure.to_owned(),
            episodes: learned.episodes.to_vec(),
            model: learned.model.into(),
            created_ms: now_ms,
            updated_ms: skill.updated_ms,
        };
        upsert_skill(&tx, &skill, false)?;
        upsert_version(&tx, &version, false)?;
        tx.commit().map_err(StoreError::from)?;
        Ok((skill, version))
    }

    /// Writes skill rows replayed from elsewhere unless this node's row is
    /// newer; answers per row, in order.
    pub fn apply_skills(&self, rows: &[SkillRow]) -> Result<Vec<Applied>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            out.push(applied(upsert_skill(&tx, row, true)?));
        }
        tx.commit()?;
        Ok(out)
    }

    /// Writes skill versions replayed from elsewhere unless this node's
    /// row is newer; answers per row, in order.
    pub fn apply_skill_versions(
        &self,
        rows: &[SkillVersionRow],
    ) -> Result<Vec<Applied>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            out.push(applied(upsert_version(&tx, row, true)?));
        }
        tx.commit()?;
        Ok(out)
    }

    /// Every skill of `seat` (active first, then by name), each with every
    /// version, oldest first.
    pub fn skills(&self, seat: &str) -> Result<Vec<SkillHistory>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {SKILL_COLUMNS} FROM synthesized_skills WHERE seat = ?1
             ORDER BY state = 'retired', name"
        ))?;
        let skills = stmt
            .query_map(params![seat], skill_of)?
            .collect::<Result<Vec<_>, _>>()?;
        let mut versions = conn.prepare_cached(&format!(
            "SELECT {VERSION_COLUMNS} FROM synthesized_skill_versions
             WHERE seat = ?1 AND skill_id = ?2 ORDER BY version"
        ))?;
        let mut out = Vec::with_capacity(skills.len());
        for raw in skills {
            let skill = finish(raw)?;
            let vs = versions
                .query_map(params![seat, skill.skill_id], version_of)?
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .map(|(mut v, eps)| {
                    v.episodes = serde_json::from_str(&eps)?;
                    Ok(v)
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            out.push(SkillHistory {
                skill,
                versions: vs,
            });
        }
        Ok(out)
    }

    /// The active skills of `seat` with their current procedure, most used
    /// (then newest) first, at most `limit`.
    pub fn active_skills(
        &self,
        seat: &str,
        limit: usize,
    ) -> Result<Vec<(SkillRow, String)>, StoreError> {
        let conn = self.conn();
        let cols: String = SKILL_COLUMNS
            .split(',')
            .map(|c| format!("s.{}", c.trim()))
            .collect::<Vec<_>>()
            .join(", ");
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {cols}, v.procedure FROM synthesized_skills s
             JOIN synthesized_skill_versions v
               ON v.seat = s.seat AND v.skill_id = s.skill_id AND v.version = s.version
             WHERE s.seat = ?1 AND s.state = 'active'
             ORDER BY s.uses DESC, s.updated_ms DESC LIMIT ?2"
        ))?;
        let rows = stmt
            .query_map(params![seat, limit as i64], |r| {
                Ok((skill_of(r)?, r.get::<_, String>(12)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        rows.into_iter()
            .map(|(raw, procedure)| Ok((finish(raw)?, procedure)))
            .collect()
    }

    /// Counts one use of each of `ids` of `seat` (a turn's prompt carried
    /// them); answers the rows changed, for the changelog.
    pub fn use_skills(
        &self,
        seat: &str,
        ids: &[String],
        now_ms: i64,
    ) -> Result<Vec<SkillRow>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut out = Vec::new();
        for id in ids {
            let Some(had) = skill_in(&tx, seat, id)? else {
                continue;
            };
            let row = SkillRow {
                uses: had.uses + 1,
                last_used_ms: Some(now_ms),
                updated_ms: now_ms.max(had.updated_ms + 1),
                ..had
            };
            upsert_skill(&tx, &row, false)?;
            out.push(row);
        }
        tx.commit()?;
        Ok(out)
    }

    /// Writes `row` as this node's (a learning pass's change: retired).
    pub(crate) fn put_skill(&self, row: &SkillRow) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        upsert_skill(&tx, row, false)?;
        tx.commit()?;
        Ok(())
    }
}

fn applied(changed: bool) -> Applied {
    if changed {
        Applied::Written
    } else {
        Applied::KeptLocal
    }
}

/// `s` cut to at most `max` bytes, on a character boundary.
pub fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
