//! The contract suite against a 3-node nats-server cluster on loopback,
//! every handle on a different member.
mod contract;

contract_suite!(contract::fixtures::Real::cluster());
