//! The integration tests of `crewlet-history`: one module per area, all in
//! one test binary (one build and link instead of one per file).

mod custody;
mod fleet_read;
