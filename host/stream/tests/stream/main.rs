//! The integration tests of `crewlet-stream` on a real nats-server: one
//! module per area, all in one test binary (one build and link instead of
//! one per file).

mod backup;
mod locked;
mod mailboxes;
