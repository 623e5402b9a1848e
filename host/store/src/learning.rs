//! What a learning pass reads and changes in a seat's memory: the
//! successful episodes a reflection reads, skill ageing and cross-agent
//! promotion.
//!
//! Rules, and why:
//! - **Ageing**: a skill's strength halves every `half_life` it goes
//!   unused (since its last use, or since it was learned); below
//!   [`RETIRE_BELOW`] it retires — it stays readable with every version,
//!   but no prompt carries it. A skill a prompt keeps carrying never ages
//!   out; one that stopped fitting the work leaves the prompt on its own.
//! - **Promotion**: a skill that `min_seats` seats of one role induced
//!   independently (their own reflection, not a copy) is offered to every
//!   other seat of the role, as a row of that seat (`origin = promoted`,
//!   naming the seats it came from), carrying the newest inducer's
//!   procedure. A seat that already has the skill keeps its own.
//! - **Compaction**: a seat's episodes past its newest `keep` are folded
//!   into one digest episode (`turn_id = digest`, outcome `compacted`,
//!   their summaries newest first within [`DIGEST_MAX`], their tokens
//!   summed), then deleted here, so recall scans a bounded table. The
//!   digest is written before anything is deleted (nothing is lost on a
//!   failure between), and its `ended_ms` is the newest turn it holds: a
//!   folded row that comes back from the stream (deletes do not travel) is
//!   older than that, so it is dropped again, never folded twice.
//! - **The reflection watermark** (`learning_marks`): the newest episode a
//!   seat's reflection read, a memory row that only moves forward, so the
//!   duty's next holder does not reflect again over the same episodes.

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::skills::{Origin, SkillRow};
use crate::{Store, StoreError};

/// A skill weaker than this retires.
pub const RETIRE_BELOW: f64 = 0.1;

/// A seat's reflection watermark, as the memory changelog carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReflectionMark {
    pub seat: String,
    /// The newest episode's `ended_ms` a reflection read.
    pub reflected_ms: i64,
    pub updated_ms: i64,
}

/// An episode as a reflection reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpisodeBrief {
    pub turn_id: String,
    pub summary: String,
    pub ended_ms: i64,
}

/// A skill to offer to the rest of a role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promotion {
    pub skill_id: String,
    pub name: String,
    pub procedure: String,
    /// The seats that induced it, by handle.
    pub from: Vec<String>,
    /// The seats of the role that lack it.
    pub to: Vec<String>,
}

impl Promotion {
    /// The skill as `seat` of the role is given it.
    pub fn for_seat<'a>(&'a self, seat: &'a str) -> crate::Learned<'a> {
        crate::Learned {
            seat,
            name: &self.name,
            origin: Origin::Promoted,
            promoted_from: &self.from,
            procedure: &self.procedure,
            episodes: &[],
            model: "promotion",
        }
    }
}

/// The `turn_id` of a seat's digest of compacted episodes.
pub const DIGEST: &str = "digest";
/// The most bytes a digest's summary holds.
pub const DIGEST_MAX: usize = 4096;

/// A seat's memory as an operator reads it: the newest notes, episodes
/// and profiles (each at most the limit asked), every skill with every
/// version.
#[derive(Debug, Clone)]
pub struct MemoryView {
    pub notes: Vec<crate::DiaryNote>,
    pub episodes: Vec<crate::Episode>,
    pub profiles: Vec<crate::Profile>,
    pub skills: Vec<crate::SkillHistory>,
}

/// A skill's strength at `now_ms`: 1 when just used (or learned), halving
/// every `half_life_ms` unused.
pub fn strength(skill: &SkillRow, now_ms: i64, half_life_ms: i64) -> f64 {
    let since = skill.last_used_ms.unwrap_or(skill.created_ms);
    let idle = (now_ms - since).max(0) as f64;
    0.5f64.powf(idle / half_life_ms.max(1) as f64)
}

impl Store {
    /// `seat`'s memory in this node's store, newest first, `limit` rows of
    /// each list.
    pub fn memory_view(&self, seat: &str, limit: usize) -> Result<MemoryView, StoreError> {
        let notes = self
            .recall_notes(seat, None, 0.0, limit)?
            .into_iter()
            .map(|r| r.row)
            .collect();
        let keys = |sql: &str| -> Result<Vec<String>, StoreError> {
            let conn = self.conn();
            let mut stmt = conn.prepare_cached(sql)?;
            let rows = stmt.query_map(params![seat, limit as i64], |r| r.get(0))?;
            Ok(rows.collect::<Result<_, _>>()?)
        };
        let mut episodes = Vec::new();
        for turn in keys(
            "SELECT turn_id FROM episodes WHERE seat = ?1 ORDER BY ended_ms DESC, turn_id DESC LIMIT ?2",
        )? {
            episodes.extend(self.episode(seat, &turn)?);
        }
        let mut profiles = Vec::new();
        for who in keys(
            "SELECT counterparty FROM counterparty_profiles WHERE seat = ?1 ORDER BY last_ms DESC LIMIT ?2",
        )? {
            profiles.extend(self.profile(seat, &who)?);
        }
        Ok(MemoryView {
            notes,
            episodes,
            profiles,
            skills: self.skills(seat)?,
        })
    }

    /// The newest `limit` episodes of `seat` that ended `delivered` after
    /// `after_ms`, oldest first.
    pub fn successful_episodes(
        &self,
        seat: &str,
        after_ms: i64,
        limit: usize,
    ) -> Result<Vec<EpisodeBrief>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT turn_id, summary, ended_ms FROM episodes
             WHERE seat = ?1 AND outcome = 'delivered' AND ended_ms > ?2
             ORDER BY ended_ms DESC, turn_id DESC LIMIT ?3",
        )?;
        let mut rows = stmt
            .query_map(params![seat, after_ms, limit as i64], |r| {
                Ok(EpisodeBrief {
                    turn_id: r.get(0)?,
                    summary: r.get(1)?,
                    ended_ms: r.get(2)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        rows.reverse();
        Ok(rows)
    }

    /// Folds `seat`'s episodes past its newest `keep` into its digest
    /// (see the module docs); answers the digest when it changed.
    pub fn compact_episodes(
        &self,
        seat: &str,
        keep: usize,
        now_ms: i64,
    ) -> Result<Option<crate::Episode>, StoreError> {
        let old: Vec<(String, String, i64, i64, i64)> = {
            let conn = self.conn();
            let mut stmt = conn.prepare_cached(
                "SELECT turn_id, summary, ended_ms, input_tokens, output_tokens FROM episodes
                 WHERE seat = ?1 AND turn_id != ?2
                 ORDER BY ended_ms DESC, turn_id DESC LIMIT -1 OFFSET ?3",
            )?;
            let rows = stmt.query_map(params![seat, DIGEST, keep as i64], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })?;
            rows.collect::<Result<_, _>>()?
        };
        if old.is_empty() {
            return Ok(None);
        }
        let had = self.episode(seat, DIGEST)?;
        let mark = had.as_ref().map_or(i64::MIN, |d| d.ended_ms);
        let fold: Vec<_> = old.iter().filter(|o| o.2 > mark).collect();
        let mut digest = None;
        if !fold.is_empty() {
            let mut summary = String::from("Earlier turns, folded (newest first):");
            let lines = fold
                .iter()
                .map(|(_, s, ..)| s.lines().next().unwrap_or_default().to_owned())
                .chain(had.iter().flat_map(|d| {
                    d.summary
                        .lines()
                        .skip(1)
                        .map(|l| l.trim_start_matches("- ").to_owned())
                        .collect::<Vec<_>>()
                }));
            for line in lines {
                let line = format!("\n- {}", crate::skills::cut(&line, 200));
                if summary.len() + line.len() > DIGEST_MAX {
                    break;
                }
                summary.push_str(&line);
            }
            let (input, output) = fold.iter().fold((0u64, 0u64), |(i, o), f| {
                (i + f.3.max(0) as u64, o + f.4.max(0) as u64)
            });
            let (base_in, base_out) = had
                .as_ref()
                .map_or((0, 0), |d| (d.input_tokens, d.output_tokens));
            digest = Some(self.put_episode(&crate::Episode {
                seat: seat.to_owned(),
                turn_id: DIGEST.to_owned(),
                conversation: None,
                trigger: "earlier turns, compacted".into(),
                asked_by: Vec::new(),
                tools: Vec::new(),
                reply: None,
                outcome: "compacted".into(),
                input_tokens: base_in + input,
                output_tokens: base_out + output,
                summary,
                ended_ms: mark.max(fold.iter().map(|f| f.2).max().unwrap_or(mark)),
                updated_ms: now_ms.max(had.as_ref().map_or(0, |d| d.updated_ms + 1)),
                vector: None,
                change_seq: 0,
            })?);
        }
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut del =
                tx.prepare_cached("DELETE FROM episodes WHERE seat = ?1 AND turn_id = ?2")?;
            for (turn, ..) in &old {
                del.execute(params![seat, turn])?;
            }
        }
        tx.commit()?;
        Ok(digest)
    }

    /// `seat`'s reflection watermark, if a reflection ever answered.
    pub fn reflection_mark(&self, seat: &str) -> Result<Option<ReflectionMark>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT seat, reflected_ms, updated_ms FROM learning_marks WHERE seat = ?1",
                params![seat],
                |r| {
                    Ok(ReflectionMark {
                        seat: r.get(0)?,
                        reflected_ms: r.get(1)?,
                        updated_ms: r.get(2)?,
                    })
                },
            )
            .optional()?)
    }

    /// Moves watermarks forward (this node's, or replayed from the
    /// stream); a mark not past this node's is kept out. Answers per row.
    pub fn put_reflection_marks(
        &self,
        marks: &[ReflectionMark],
    ) -> Result<Vec<crate::Applied>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let mut out = Vec::with_capacity(marks.len());
        for m in marks {
            let seq = crate::memory::next_change(&tx)?;
            let changed = tx.execute(
                "INSERT INTO learning_marks AS l (seat, reflected_ms, updated_ms, change_seq)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (seat) DO UPDATE SET reflected_ms = excluded.reflected_ms,
                   updated_ms = excluded.updated_ms, change_seq = excluded.change_seq
                 WHERE excluded.reflected_ms > l.reflected_ms",
                params![m.seat, m.reflected_ms, m.updated_ms, seq],
            )?;
            out.push(if changed > 0 {
                crate::Applied::Written
            } else {
                crate::Applied::KeptLocal
            });
        }
        tx.commit()?;
        Ok(out)
    }

    /// When `seat` last learned a version of a skill of its own (its
    /// reflection's watermark after a restart), if ever.
    pub fn last_induced_ms(&self, seat: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.conn().query_row(
            "SELECT MAX(v.created_ms) FROM synthesized_skill_versions v
             JOIN synthesized_skills s ON s.seat = v.seat AND s.skill_id = v.skill_id
             WHERE v.seat = ?1 AND s.origin = 'induced'",
            params![seat],
            |r| r.get(0),
        )?)
    }

    /// Retires every active skill of `seat` whose strength fell below
    /// [`RETIRE_BELOW`]; answers the rows changed, for the changelog.
    pub fn age_skills(
        &self,
        seat: &str,
        now_ms: i64,
        half_life_ms: i64,
    ) -> Result<Vec<SkillRow>, StoreError> {
        let weak: Vec<SkillRow> = self
            .skills(seat)?
            .into_iter()
            .map(|h| h.skill)
            .filter(|s| s.active() && strength(s, now_ms, half_life_ms) < RETIRE_BELOW)
            .collect();
        let mut out = Vec::with_capacity(weak.len());
        for had in weak {
            let row = SkillRow {
                state: "retired".into(),
                retired_ms: Some(now_ms),
                updated_ms: now_ms.max(had.updated_ms + 1),
                ..had
            };
            self.put_skill(&row)?;
            out.push(row);
        }
        Ok(out)
    }

    /// The skills `min_seats` or more of `seats` (one role's) induced
    /// themselves and are active, each with the seats of `seats` that lack
    /// an active row of it; only those some seat lacks.
    pub fn promotions(
        &self,
        seats: &[String],
        min_seats: usize,
    ) -> Result<Vec<Promotion>, StoreError> {
        let mut by_skill: std::collections::BTreeMap<String, Vec<(SkillRow, String)>> =
            Default::default();
        let mut has: std::collections::BTreeSet<(String, String)> = Default::default();
        for seat in seats {
            for (skill, procedure) in self.active_skills(seat, usize::MAX >> 1)? {
                has.insert((seat.clone(), skill.skill_id.clone()));
                if skill.origin == Origin::Induced {
                    by_skill
                        .entry(skill.skill_id.clone())
                        .or_default()
                        .push((skill, procedure));
                }
            }
        }
        let mut out = Vec::new();
        for (skill_id, mut inducers) in by_skill {
            if inducers.len() < min_seats.max(2) {
                continue;
            }
            let to: Vec<String> = seats
                .iter()
                .filter(|s| !has.contains(&((*s).clone(), skill_id.clone())))
                .cloned()
                .collect();
            if to.is_empty() {
                continue;
            }
            inducers.sort_by_key(|(s, _)| s.updated_ms);
            let (newest, procedure) = inducers.last().cloned().expect("at least two");
            out.push(Promotion {
                skill_id,
                name: newest.name,
                procedure,
                from: inducers.iter().map(|(s, _)| s.seat.clone()).collect(),
                to,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
#[path = "learning_tests.rs"]
mod tests;
