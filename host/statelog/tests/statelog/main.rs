//! The integration tests of `crewlet-statelog` on a real nats-server and real
//! estate files: one module per area, all in one test binary (one build and
//! link instead of one per file).

mod common;

mod applier;
mod backup;
mod batches;
mod only_the_applier_writes;
mod snapshot;
mod standing;
mod usage;
