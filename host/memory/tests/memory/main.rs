//! The integration tests of `crewlet-memory`: one module per area, all in
//! one test binary (one build and link instead of one per file).

mod common;
mod memory;
mod skills;
mod view;
