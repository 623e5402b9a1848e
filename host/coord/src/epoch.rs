//! The fencing epoch, as a type of its own.
//!
//! Rule: a fencing epoch (minted per lease tenure, in the epochs bucket) and
//! the config epoch (the activation pointer's revision) are both counters
//! that only grow, and a `u64` lets one be handed where the other is meant —
//! a duty's write fenced by a config revision compares without a word. The
//! fencing epoch is its own type, serde-transparent, so nothing on the wire,
//! in a bucket or in SQLite changes.

use serde::{Deserialize, Serialize};

/// A lease tenure's fencing epoch: monotonic per resource, never reused.
/// A write made under a tenure carries it, so a store can refuse one from a
/// tenure that has ended. `0` is "never leased".
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct FenceEpoch(pub u64);

impl FenceEpoch {
    /// The number, for a place that only speaks numbers (a log field, a
    /// metric, an SQL column).
    pub fn get(self) -> u64 {
        self.0
    }

    /// The epoch the next tenure is minted with.
    pub fn next(self) -> FenceEpoch {
        FenceEpoch(self.0 + 1)
    }
}

impl std::fmt::Display for FenceEpoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq<u64> for FenceEpoch {
    fn eq(&self, other: &u64) -> bool {
        self.0 == *other
    }
}

impl PartialOrd<u64> for FenceEpoch {
    fn partial_cmp(&self, other: &u64) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_plain_numbers_on_the_wire() {
        assert_eq!(serde_json::to_string(&FenceEpoch(7)).unwrap(), "7");
        let read: FenceEpoch = serde_json::from_str("12").unwrap();
        assert_eq!(read, FenceEpoch(12));
        assert_eq!(read.next(), 13);
        assert!(serde_json::from_str::<FenceEpoch>("\"12\"").is_err());
    }
}
