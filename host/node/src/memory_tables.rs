//! The tables a seat's memory has, registered on the memory stream once
//! for every reader: the seat's hydration before attach, the learning
//! duty's replay, the memory route.

use std::sync::Arc;

/// `memory` with every table a seat's memory is replayed into.
pub(crate) fn memory_tables(
    memory: crewlet_memory::Memory,
    store: &Arc<crewlet_store::Store>,
) -> crewlet_memory::Memory {
    memory
        .with(crewlet_memory::Sessions(store.clone()))
        .with(crewlet_memory::Diary(store.clone()))
        .with(crewlet_memory::Episodes(store.clone()))
        .with(crewlet_memory::Profiles(store.clone()))
        .with(crewlet_memory::Onboarding(store.clone()))
        .with(crewlet_memory::Skills(store.clone()))
        .with(crewlet_memory::SkillVersions(store.clone()))
        .with(crewlet_memory::ReflectionMarks(store.clone()))
}
