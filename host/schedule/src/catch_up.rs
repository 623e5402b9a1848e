//! Catch-up: what a scheduler does with the fires that passed while no node
//! held its duty (every node down, or the duty between holders).
//!
//! The policy is per schedule. `latest`, the default, runs the most recent
//! missed fire once and skips the rest: a daily report missed for a week is
//! wanted once, now, not seven times. `none` skips them all (the next fire
//! is on time). `all` runs the most recent `limit` of them, oldest first,
//! and skips the older ones, so a long outage cannot flood a seat.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// The `limit` of [`CatchUp::All`] when the document gives none.
pub const DEFAULT_CATCH_UP_LIMIT: u32 = 10;
/// The largest `limit` of [`CatchUp::All`] a document may give.
pub const MAX_CATCH_UP_LIMIT: u32 = 100;

/// A schedule's catch-up policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// The most recent missed fire once; the rest are skipped.
    #[default]
    Latest,
    /// Every missed fire is skipped.
    None,
    /// The most recent `limit` missed fires; older ones are skipped.
    All { limit: u32 },
}

/// What to do with missed fires: run `fire` (increasing), record `skip`
/// (increasing) as skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub fire: Vec<Timestamp>,
    pub skip: Vec<Timestamp>,
}

/// Splits the missed fires (in any order; a duplicate counts once) by the
/// policy.
///
/// ```
/// use crewlet_schedule::{CatchUp, plan};
/// use jiff::Timestamp;
///
/// // A daily report nobody ran for three days.
/// let missed: Vec<Timestamp> = ["2026-01-03T09:00:00Z", "2026-01-01T09:00:00Z", "2026-01-02T09:00:00Z"]
///     .iter()
///     .map(|t| t.parse().unwrap())
///     .collect();
/// let (jan1, jan2, jan3) = (missed[1], missed[2], missed[0]);
/// // `latest`: the most recent once, now; the rest recorded as skipped.
/// let latest = plan(CatchUp::Latest, &missed);
/// assert_eq!((latest.fire, latest.skip), (vec![jan3], vec![jan1, jan2]));
/// // `all` with a limit: the most recent `limit`, oldest first.
/// assert_eq!(plan(CatchUp::All { limit: 2 }, &missed).fire, [jan2, jan3]);
/// // `none`: the next fire is on time, nothing is caught up.
/// assert!(plan(CatchUp::None, &missed).fire.is_empty());
/// ```
pub fn plan(policy: CatchUp, missed: &[Timestamp]) -> Plan {
    let mut missed = missed.to_vec();
    missed.sort_unstable();
    missed.dedup();
    let keep = match policy {
        CatchUp::Latest => 1,
        CatchUp::None => 0,
        CatchUp::All { limit } => usize::try_from(limit).unwrap_or(usize::MAX),
    };
    let fire = missed.split_off(missed.len().saturating_sub(keep));
    Plan { fire, skip: missed }
}
