//! The contract suite against a single real nats-server.
mod contract;

contract_suite!(contract::fixtures::Real::single());
