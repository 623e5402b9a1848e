//! The contract suite against the in-process twin.
use crate::contract;

contract_suite!(contract::fixtures::Memory::new());
