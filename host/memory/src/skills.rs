//! Synthesized skills and their versions as memory tables: a skill keyed by
//! its id within the seat, a version by id and number; each carried as the
//! store's whole row in JSON and applied newest-`updated_ms`-wins
//! (`crewlet_store::Store::{apply_skills, apply_skill_versions}`), so what
//! a seat learned follows it to the next node.

use std::sync::Arc;

use crewlet_store::{SkillRow, SkillVersionRow, Store};

use crate::{Applied, Table};

/// The `synthesized_skills` table of a node's store.
pub struct Skills(pub Arc<Store>);

/// The `synthesized_skill_versions` table of a node's store.
pub struct SkillVersions(pub Arc<Store>);

fn applied(rows: Vec<crewlet_store::Applied>) -> Vec<Applied> {
    rows.into_iter()
        .map(|a| match a {
            crewlet_store::Applied::Written => Applied::Written,
            crewlet_store::Applied::KeptLocal => Applied::KeptLocal,
        })
        .collect()
}

impl Table for Skills {
    type Row = SkillRow;
    const NAME: &'static str = "skills";

    fn seat(row: &SkillRow) -> &str {
        &row.seat
    }

    fn key(row: &SkillRow) -> String {
        row.skill_id.clone()
    }

    fn encode(row: &SkillRow) -> Result<Vec<u8>, String> {
        serde_json::to_vec(row).map_err(|e| e.to_string())
    }

    fn decode(bytes: &[u8]) -> Result<SkillRow, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }

    fn apply(&self, rows: Vec<SkillRow>) -> Result<Vec<Applied>, String> {
        Ok(applied(
            self.0.apply_skills(&rows).map_err(|e| e.to_string())?,
        ))
    }
}

impl Table for SkillVersions {
    type Row = SkillVersionRow;
    const NAME: &'static str = "skill_versions";

    fn seat(row: &SkillVersionRow) -> &str {
        &row.seat
    }

    fn key(row: &SkillVersionRow) -> String {
        format!("{}#{}", row.skill_id, row.version)
    }

    fn encode(row: &SkillVersionRow) -> Result<Vec<u8>, String> {
        serde_json::to_vec(row).map_err(|e| e.to_string())
    }

    fn decode(bytes: &[u8]) -> Result<SkillVersionRow, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }

    fn apply(&self, rows: Vec<SkillVersionRow>) -> Result<Vec<Applied>, String> {
        Ok(applied(
            self.0
                .apply_skill_versions(&rows)
                .map_err(|e| e.to_string())?,
        ))
    }
}
