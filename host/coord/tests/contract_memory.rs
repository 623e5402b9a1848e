//! The contract suite against the in-process twin.
mod contract;

contract_suite!(contract::fixtures::Memory::new());
