//! The config epoch, as a type of its own.
//!
//! Rule: the config pointer's revision — which company revision the fleet
//! runs — travels as a [`ConfigEpoch`], never a bare `u64`, so it cannot be
//! handed where a fencing epoch (`crewlet_coord::FenceEpoch`) or a count is
//! meant. It lives here, not beside the fencing epoch in coordination,
//! because the company, the node store and the MCP children carry it too
//! and must not depend on coordination; this crate is the one all of them
//! already see. Serde-transparent: nothing on the wire, in a bucket or in
//! SQLite changes.

use serde::{Deserialize, Serialize};

/// The config pointer's epoch: its own revision in the config bucket,
/// higher at every activation. `0` is "not activated through the pointer"
/// (a document given on the command line).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct ConfigEpoch(pub u64);

impl ConfigEpoch {
    /// The number, for a place that only speaks numbers (a log field, an
    /// SQL column, a JSON answer built by hand).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for ConfigEpoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq<u64> for ConfigEpoch {
    fn eq(&self, other: &u64) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_epoch_is_a_plain_number_on_the_wire() {
        assert_eq!(serde_json::to_string(&ConfigEpoch(7)).unwrap(), "7");
        let read: ConfigEpoch = serde_json::from_str("12").unwrap();
        assert_eq!(read, 12);
        assert!(serde_json::from_str::<ConfigEpoch>("\"12\"").is_err());
    }
}
