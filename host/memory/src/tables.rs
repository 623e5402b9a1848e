//! The diary, episodes, counterparty profiles and onboarding markers as
//! memory tables: each keyed within its seat, carried as the store's whole
//! row in JSON and applied newest-`updated_ms`-wins (a marker: the first
//! one stays), so they follow the seat like sessions do.

use crewlet_store::{DiaryNote, Episode, Onboarded, Profile, StoreError};

use crate::Applied;

/// The store's answers per row as the replay's.
pub(crate) fn applied(
    rows: Result<Vec<crewlet_store::Applied>, StoreError>,
) -> Result<Vec<Applied>, String> {
    Ok(rows
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|a| match a {
            crewlet_store::Applied::Written => Applied::Written,
            crewlet_store::Applied::KeptLocal => Applied::KeptLocal,
        })
        .collect())
}

store_table! {
    /// The `agent_diary` table: a seat's notes.
    Diary: DiaryNote, "diary", |row| row.note_id.clone(), apply_notes
}

store_table! {
    /// The `episodes` table: one row per ended turn.
    Episodes: Episode, "episodes", |row| row.turn_id.clone(), apply_episodes
}

store_table! {
    /// The `counterparty_profiles` table.
    Profiles: Profile, "profiles", |row| row.counterparty.clone(), apply_profiles
}

store_table! {
    /// The `agent_onboarding_markers` table: one row per seat, fleet-wide.
    Onboarding: Onboarded, "onboarding", |_row| String::new(), apply_markers
}
