//! The tables a seat's memory has, registered on the memory stream once
//! for every reader: the seat's hydration before attach, the learning
//! duty's replay, the memory route.

use std::sync::Arc;

/// `memory` with every table a seat's memory is replayed into.
pub fn memory_tables(memory: crate::Memory, store: &Arc<crewlet_store::Store>) -> crate::Memory {
    memory
        .with(crate::Sessions(store.clone()))
        .with(crate::Diary(store.clone()))
        .with(crate::Episodes(store.clone()))
        .with(crate::Profiles(store.clone()))
        .with(crate::Onboarding(store.clone()))
        .with(crate::Skills(store.clone()))
        .with(crate::SkillVersions(store.clone()))
        .with(crate::ReflectionMarks(store.clone()))
}
