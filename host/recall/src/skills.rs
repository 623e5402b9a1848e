//! The learned-skills block of a turn's prefetch: the node's
//! [`SkillSource`] over this node's store (the skills the learning duty
//! wrote, hydrated with the seat's memory before attach).
//!
//! Rule: a turn carries a seat's active skills, most used first, at most
//! [`SKILLS_CARRIED`] and each procedure cut to [`PROCEDURE_CARRIED`]
//! bytes; carrying a skill is its use — counted on the row (and the row
//! offered to the changelog), which is what keeps it from ageing out.

use std::sync::Arc;

use crewlet_memory::{Changelog, Skills};
use crewlet_store::Store;
use crewlet_turns::{MemoryFault, SkillSource};
use futures::future::BoxFuture;
use tracing::warn;

/// The most skills one turn carries.
pub const SKILLS_CARRIED: usize = 5;
/// The most bytes of one procedure a turn carries.
pub const PROCEDURE_CARRIED: usize = 1024;

/// The node's learned skills.
pub struct NodeSkills {
    pub store: Arc<Store>,
    pub changelog: Changelog,
}

impl SkillSource for NodeSkills {
    fn skills(
        &self,
        seat: &str,
        _trigger: &str,
    ) -> BoxFuture<'_, Result<Vec<String>, MemoryFault>> {
        let (store, seat) = (self.store.clone(), seat.to_owned());
        Box::pin(async move {
            let (carried, used) = tokio::task::spawn_blocking(move || {
                let carried = store.active_skills(&seat, SKILLS_CARRIED)?;
                let ids: Vec<String> = carried.iter().map(|(s, _)| s.skill_id.clone()).collect();
                let used = store.use_skills(&seat, &ids, crewlet_os::now_ms())?;
                Ok::<_, crewlet_store::StoreError>((carried, used))
            })
            .await
            .map_err(|e| MemoryFault(e.to_string()))?
            .map_err(|e| MemoryFault(e.to_string()))?;
            for row in &used {
                if let Err(e) = self.changelog.offer::<Skills>(row) {
                    warn!(subsystem = "memory", seat = %row.seat, error = %e, "skill use not published");
                }
            }
            Ok(carried
                .into_iter()
                .map(|(s, procedure)| {
                    let procedure = crewlet_store::cut(&procedure, PROCEDURE_CARRIED);
                    format!("{} (v{}): {procedure}", s.name, s.version)
                })
                .collect())
        })
    }
}
