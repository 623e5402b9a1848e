//! A seat's memory at work in its turns: the node store's memory tables as
//! the turn engine's [`crewlet_turns::SeatMemory`] ([`NodeMemory`]), its
//! conversation sessions as [`crewlet_turns::Sessions`] ([`NodeSessions`]) and its
//! learned skills as the prefetch's [`crewlet_turns::SkillSource`]
//! ([`NodeSkills`]).
//!
//! Why a crate of its own: `crewlet-memory` carries rows between nodes and
//! must stay free of the turns it serves; `crewlet-turns` must not reach
//! the store. This crate is the one place both meet, so the node only
//! wires it.

mod seat_memory;
mod sessions;
mod skills;

pub use seat_memory::{MAX_PROFILE_BYTES, NodeMemory};
pub use sessions::NodeSessions;
pub use skills::{NodeSkills, PROCEDURE_CARRIED, SKILLS_CARRIED};
