//! The diary, episodes, counterparty profiles and onboarding markers as
//! memory tables: each keyed within its seat, carried as the store's whole
//! row in JSON and applied newest-`updated_ms`-wins (a marker: the first
//! one stays), so they follow the seat like sessions do.

use std::sync::Arc;

use crewlet_store::{DiaryNote, Episode, Onboarded, Profile, Store, StoreError};

use crate::{Applied, Table};

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

fn json<R: serde::Serialize>(row: &R) -> Result<Vec<u8>, String> {
    serde_json::to_vec(row).map_err(|e| e.to_string())
}

fn unjson<R: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<R, String> {
    serde_json::from_slice(bytes).map_err(|e| e.to_string())
}

/// The `agent_diary` table: a seat's notes.
pub struct Diary(pub Arc<Store>);

impl Table for Diary {
    type Row = DiaryNote;
    const NAME: &'static str = "diary";

    fn seat(row: &DiaryNote) -> &str {
        &row.seat
    }

    fn key(row: &DiaryNote) -> String {
        row.note_id.clone()
    }

    fn encode(row: &DiaryNote) -> Result<Vec<u8>, String> {
        json(row)
    }

    fn decode(bytes: &[u8]) -> Result<DiaryNote, String> {
        unjson(bytes)
    }

    fn apply(&self, rows: Vec<DiaryNote>) -> Result<Vec<Applied>, String> {
        applied(self.0.apply_notes(&rows))
    }
}

/// The `episodes` table: one row per ended turn.
pub struct Episodes(pub Arc<Store>);

impl Table for Episodes {
    type Row = Episode;
    const NAME: &'static str = "episodes";

    fn seat(row: &Episode) -> &str {
        &row.seat
    }

    fn key(row: &Episode) -> String {
        row.turn_id.clone()
    }

    fn encode(row: &Episode) -> Result<Vec<u8>, String> {
        json(row)
    }

    fn decode(bytes: &[u8]) -> Result<Episode, String> {
        unjson(bytes)
    }

    fn apply(&self, rows: Vec<Episode>) -> Result<Vec<Applied>, String> {
        applied(self.0.apply_episodes(&rows))
    }
}

/// The `counterparty_profiles` table.
pub struct Profiles(pub Arc<Store>);

impl Table for Profiles {
    type Row = Profile;
    const NAME: &'static str = "profiles";

    fn seat(row: &Profile) -> &str {
        &row.seat
    }

    fn key(row: &Profile) -> String {
        row.counterparty.clone()
    }

    fn encode(row: &Profile) -> Result<Vec<u8>, String> {
        json(row)
    }

    fn decode(bytes: &[u8]) -> Result<Profile, String> {
        unjson(bytes)
    }

    fn apply(&self, rows: Vec<Profile>) -> Result<Vec<Applied>, String> {
        applied(self.0.apply_profiles(&rows))
    }
}

/// The `agent_onboarding_markers` table: one row per seat, fleet-wide.
pub struct Onboarding(pub Arc<Store>);

impl Table for Onboarding {
    type Row = Onboarded;
    const NAME: &'static str = "onboarding";

    fn seat(row: &Onboarded) -> &str {
        &row.seat
    }

    fn key(_row: &Onboarded) -> String {
        String::new()
    }

    fn encode(row: &Onboarded) -> Result<Vec<u8>, String> {
        json(row)
    }

    fn decode(bytes: &[u8]) -> Result<Onboarded, String> {
        unjson(bytes)
    }

    fn apply(&self, rows: Vec<Onboarded>) -> Result<Vec<Applied>, String> {
        applied(self.0.apply_markers(&rows))
    }
}
