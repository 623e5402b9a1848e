//! The integration tests of `crewlet-coord` on real nats-servers and its
//! in-process twin: one module per area (the contract suite once per backend),
//! all in one test binary (one build and link instead of one per file).

#[macro_use]
mod contract;

mod clock_skew;
mod cluster_faults;
mod contract_cluster;
mod contract_memory;
mod contract_nats;
mod nats_backend;
