//! The integration tests of `crewlet-seats` on a real nats-server: one module
//! per area, all in one test binary (one build and link instead of one per
//! file).

mod common;

mod pauses;
mod seats;
