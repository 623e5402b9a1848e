//! The node store's memory tables as the turn engine's [`SeatMemory`]:
//! every row written is offered to the memory changelog once it is in the
//! store, so the seat's notes, episodes, profiles and onboarding marker
//! follow it to whichever node holds it next. Store calls block, so each
//! runs on the blocking pool.
//!
//! Rule: what a seat learns of a counterparty is a bounded list of lines,
//! newest kept ([`MAX_PROFILE_BYTES`]): a person talked to fifty times is
//! known by the latest of it, and a profile never outgrows a prompt block.

use std::sync::Arc;

use crewlet_memory::{Changelog, Diary, Episodes, Onboarding, Profiles, Table};
use crewlet_store::{DiaryNote, Onboarded, Profile, Store, StoreError};
use crewlet_turns::{MemoryFault, Note, Recalled, SeatMemory, TurnMemory, Vector};
use futures::future::BoxFuture;
use tracing::warn;

/// The most a profile's `known` holds, in bytes.
pub const MAX_PROFILE_BYTES: usize = 1024;

/// The node's seat memory.
#[derive(Clone)]
pub struct NodeMemory {
    pub store: Arc<Store>,
    pub changelog: Changelog,
}

fn fault(e: impl std::fmt::Display) -> MemoryFault {
    MemoryFault(e.to_string())
}

impl NodeMemory {
    /// Runs `f` on the store, on the blocking pool.
    fn blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> Result<R, StoreError> + Send + 'static,
    ) -> BoxFuture<'static, Result<R, MemoryFault>> {
        let store = self.store.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || f(&store))
                .await
                .map_err(fault)?
                .map_err(fault)
        })
    }

    /// Offers a row already in the store to the stream; a row that cannot
    /// follow the seat is said here, not as a row not kept.
    fn offer<T: Table>(&self, row: &T::Row) {
        if let Err(e) = self.changelog.offer::<T>(row) {
            warn!(subsystem = "memory", table = T::NAME, error = %e, "memory row not published");
        }
    }
}

/// `known` with `line` added, the oldest lines dropped past the bound.
fn learned(known: &str, line: &str) -> String {
    let mut lines: Vec<&str> = known.lines().filter(|l| !l.is_empty()).collect();
    lines.push(line);
    while lines.len() > 1 && lines.iter().map(|l| l.len() + 1).sum::<usize>() > MAX_PROFILE_BYTES {
        lines.remove(0);
    }
    let mut out = lines.join("\n");
    if out.len() > MAX_PROFILE_BYTES {
        let mut end = MAX_PROFILE_BYTES;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

impl SeatMemory for NodeMemory {
    fn remember(&self, seat: &str, note: Note) -> BoxFuture<'_, Result<(), MemoryFault>> {
        let row = DiaryNote {
            seat: seat.to_owned(),
            note_id: note.id,
            text: note.text,
            turn_id: Some(note.turn_id),
            created_ms: note.at_ms,
            updated_ms: note.at_ms,
            vector: note.vector,
            change_seq: 0,
        };
        let put = self.blocking(move |s| s.put_note(&row));
        Box::pin(async move {
            let row = put.await?;
            self.offer::<Diary>(&row);
            Ok(())
        })
    }

    fn notes(
        &self,
        seat: &str,
        query: Option<Vector>,
        max_distance: f64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Recalled>, MemoryFault>> {
        let seat = seat.to_owned();
        let read =
            self.blocking(move |s| s.recall_notes(&seat, query.as_ref(), max_distance, limit));
        Box::pin(async move {
            Ok(read
                .await?
                .into_iter()
                .map(|r| Recalled {
                    text: r.row.text,
                    at_ms: r.row.created_ms,
                    distance: r.distance,
                })
                .collect())
        })
    }

    fn episodes(
        &self,
        seat: &str,
        query: Vector,
        max_distance: f64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Recalled>, MemoryFault>> {
        let seat = seat.to_owned();
        let read = self.blocking(move |s| s.recall_episodes(&seat, &query, max_distance, limit));
        Box::pin(async move {
            Ok(read
                .await?
                .into_iter()
                .map(|r| Recalled {
                    text: r.row.summary,
                    at_ms: r.row.ended_ms,
                    distance: r.distance,
                })
                .collect())
        })
    }

    fn profile(
        &self,
        seat: &str,
        counterparty: &str,
    ) -> BoxFuture<'_, Result<Option<String>, MemoryFault>> {
        let (seat, who) = (seat.to_owned(), counterparty.to_owned());
        let read = self.blocking(move |s| s.profile(&seat, &who));
        Box::pin(async move {
            Ok(read.await?.map(|p| {
                format!(
                    "{} turns with them; what you learned (oldest first): {}",
                    p.turns, p.known
                )
            }))
        })
    }

    fn onboarded(&self, seat: &str) -> BoxFuture<'_, Result<bool, MemoryFault>> {
        let seat = seat.to_owned();
        let read = self.blocking(move |s| s.onboarded(&seat));
        Box::pin(async move { Ok(read.await?.is_some()) })
    }

    fn ended(&self, seat: &str, turn: TurnMemory) -> BoxFuture<'_, Result<(), MemoryFault>> {
        let seat = seat.to_owned();
        let episode = turn.episode;
        let at = episode.ended_ms;
        let met = turn.met;
        let marker = turn.onboarded.then(|| Onboarded {
            seat: seat.clone(),
            turn_id: episode.turn_id.clone(),
            onboarded_ms: at,
            updated_ms: at,
            change_seq: 0,
        });
        let write = self.blocking(move |s| {
            let episode = s.put_episode(&episode)?;
            let mut profiles = Vec::new();
            for (who, line) in met {
                let old = s.profile(&seat, &who)?;
                let profile = Profile {
                    seat: seat.clone(),
                    counterparty: who,
                    known: learned(old.as_ref().map_or("", |p| p.known.as_str()), &line),
                    turns: old.as_ref().map_or(0, |p| p.turns) + 1,
                    first_ms: old.as_ref().map_or(at, |p| p.first_ms),
                    last_ms: at,
                    updated_ms: at,
                    change_seq: 0,
                };
                profiles.push(s.put_profile(&profile)?);
            }
            let marker = marker.map(|m| s.mark_onboarded(&m)).transpose()?;
            Ok((episode, profiles, marker))
        });
        Box::pin(async move {
            let (episode, profiles, marker) = write.await?;
            self.offer::<Episodes>(&episode);
            for p in &profiles {
                self.offer::<Profiles>(p);
            }
            if let Some(m) = &marker {
                self.offer::<Onboarding>(m);
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_keeps_its_newest_lines_within_the_bound() {
        let mut known = String::new();
        for i in 0..100 {
            known = learned(&known, &format!("asked: question {i} {}", "x".repeat(40)));
        }
        assert!(known.len() <= MAX_PROFILE_BYTES, "{}", known.len());
        assert!(known.ends_with(&format!("question 99 {}", "x".repeat(40))));
        assert!(!known.contains("question 0 "));
        assert_eq!(learned("", "one"), "one");
    }
}
