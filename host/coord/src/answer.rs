//! The three-valued answer.
//!
//! Rule: every question this layer answers is `Ok(Answer::Yes(..))`,
//! `Ok(Answer::No(..))`, or `Err(CoordError::Unavailable(..))` — never a bare
//! bool. Why: "I do not hold this seat" and "I could not ask whether I hold
//! this seat" are different facts, and collapsing the second into the first
//! tears a healthy company down over a two-second blip in the store. Unknown
//! is an *error value*, so a caller that forgets to handle it cannot mistake
//! it for a refusal; each contract documents which way is safe for it.

use std::time::Duration;

/// What the store said: yes (with what it knows) or no (with why).
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "an answer that is not looked at is a decision nobody took"]
pub enum Answer<Y, N> {
    /// The store said so.
    Yes(Y),
    /// The store said not.
    No(N),
}

impl<Y, N> Answer<Y, N> {
    pub fn is_yes(&self) -> bool {
        matches!(self, Answer::Yes(_))
    }
    pub fn is_no(&self) -> bool {
        matches!(self, Answer::No(_))
    }
    pub fn yes(self) -> Option<Y> {
        match self {
            Answer::Yes(y) => Some(y),
            Answer::No(_) => None,
        }
    }
    pub fn no(self) -> Option<N> {
        match self {
            Answer::Yes(_) => None,
            Answer::No(n) => Some(n),
        }
    }
}

/// The third answer and every other way a call can fail without the store
/// having said yes or no. `Unavailable` is the unknown; the others are
/// caller mistakes or contention, never refusals either.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CoordError {
    /// The store could not be asked (unreachable, no leader, timeout).
    /// Unknown, not "no": act on the contract's documented safe direction.
    #[error(
        "coordination store unavailable ({0}); the answer is unknown, not no — take the contract's safe direction and ask again later"
    )]
    Unavailable(String),
    /// The name cannot address a key.
    #[error("invalid resource name {name:?}: {why}; use `class:id` with non-empty segments")]
    InvalidName { name: String, why: &'static str },
    /// A duty (or any non-seat, non-presence lease) asked for more than the ceiling.
    #[error(
        "lease TTL {asked:?} is above the ceiling {ceiling:?} (MaxDutyTTL); ask for at most the ceiling"
    )]
    TtlAboveCeiling { asked: Duration, ceiling: Duration },
    /// A TTL above the age of the bucket that would hold the record.
    #[error(
        "TTL {asked:?} is above the age {age:?} of bucket {bucket}; ask for at most the bucket's age (it is fixed when the bucket is created)"
    )]
    TtlAboveBucketAge {
        asked: Duration,
        age: Duration,
        bucket: String,
    },
    /// An argument outside what the contract accepts.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A compare-and-swap lost every one of its attempts. Not a refusal:
    /// the store never judged the request.
    #[error(
        "record {key:?} stayed contended for {attempts} attempts; the call was not made — fail closed and retry on the next round"
    )]
    Contended { key: String, attempts: u32 },
    /// A budget charge landed on the company but not on the seat.
    #[error(
        "the round's {tokens} tokens are on the company's counter but not on seat {seat:?}'s (coord_kv_budget_spend_uncounted): the seat's counter is short by that share until its window turns over; stop the round as an outage"
    )]
    SeatShareUncounted { seat: String, tokens: u64 },
    /// A stored record that does not decode.
    #[error(
        "record {key:?} in {bucket} does not decode ({why}); a newer build may have written it — upgrade this node"
    )]
    Corrupt {
        bucket: String,
        key: String,
        why: String,
    },
}

impl CoordError {
    /// True for the unknown answer (store unreachable, no leader, timeout).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, CoordError::Unavailable(_))
    }
}

/// The result of every question: a yes, a no, or an error (of which
/// [`CoordError::Unavailable`] is the unknown).
pub type Reply<Y, N> = Result<Answer<Y, N>, CoordError>;
